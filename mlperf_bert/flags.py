"""absl-style flags (``--name=value``, ``--noname``) without absl's process-global state.

Each command defines its flags on its own ``FlagValues`` so several commands can run
in one process (tests) and so a bad flag becomes one UserError line.
"""
import sys

from absl import flags as _absl

from mlperf_bert.errors import UserError

FlagValues = _absl.FlagValues
DEFINE_string = _absl.DEFINE_string
DEFINE_integer = _absl.DEFINE_integer
DEFINE_float = _absl.DEFINE_float
DEFINE_bool = _absl.DEFINE_bool
DEFINE_enum = _absl.DEFINE_enum
DEFINE_list = _absl.DEFINE_list
DEFINE_multi_string = _absl.DEFINE_multi_string


def usage(prog, positional=True):
    """The usage line: ``usage: PROG [--flag=value ...] POSITIONALS`` (``positional`` names them
    when it is a string)."""
    tail = " " + positional if isinstance(positional, str) and positional else ""
    return "usage: %s [--flag=value ...]%s" % (prog, tail)


def quiet_stdout():
    """After a reader closed our stdout (``--help | head``): send the rest to /dev/null, so that
    neither later prints nor the interpreter's last flush raise BrokenPipeError."""
    import os
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def parse(fv, argv, required=(), positional=True):
    """Parse ``argv`` (argv[0] is the program) into ``fv``; return the leftover positionals.

    ``--help`` / ``-h`` print the usage line and every flag with its help and default, and exit 0.
    ``positional``: a string names the positional arguments in the usage line (``"LOG ..."``);
    False: a leftover argument is an error (e.g. ``--input_file=a, b`` would otherwise drop ``b``
    silently).
    """
    if any(a in ("--help", "-h", "--helpfull", "--helpshort") for a in list(argv)[1:]):
        try:
            print(usage(argv[0], positional) + "\n")
            print(fv.get_help())
            sys.stdout.flush()
        except BrokenPipeError:
            quiet_stdout()
        raise SystemExit(0)
    try:
        rest = fv(list(argv))
    except _absl.Error as e:
        raise UserError("%s (see --help)" % str(e).splitlines()[0])
    for name in required:
        if fv[name].value is None:
            raise UserError("flag --%s is required" % name)
    if positional is False and rest[1:]:
        raise UserError("unexpected argument %r: this command takes only --flag=value arguments "
                        "(lists are comma-separated, without spaces)" % rest[1])
    return rest[1:]
