"""absl-style flags (``--name=value``, ``--noname``) without absl's process-global state.

Each command defines its flags on its own ``FlagValues`` so several commands can run
in one process (tests) and so a bad flag becomes one UserError line.
"""
import os
import sys

from absl import flags as _absl

from mlperf_bert.errors import UserError
from mlperf_bert.fileio import special_kind

FlagValues = _absl.FlagValues
DEFINE_string = _absl.DEFINE_string
DEFINE_integer = _absl.DEFINE_integer
DEFINE_float = _absl.DEFINE_float
DEFINE_bool = _absl.DEFINE_bool
DEFINE_enum = _absl.DEFINE_enum
DEFINE_list = _absl.DEFINE_list
DEFINE_multi_string = _absl.DEFINE_multi_string

# Flags that were removed, with why and what to use instead: an old command line that still
# gives one gets this reason, not absl's "Unknown command line flag ... Did you mean" guess.
# To remove a flag, delete its definition and add a line here (checked by every command's parse).
REMOVED_FLAGS = {
    "bf16_weights": "removed (issue 36.3): autocast casts each weight once a forward and the "
                    "copies' refresh cast as many again, so it saved nothing at one micro-step and at "
                    "most 9% of the casts with long accumulation, for 0.7 GB; drop it (the activation "
                    "casts are the cost: --fused_qkv cuts them)",
    "pad_vocab": "removed (issue 46.7): padding the MLM decoder's vocabulary to a multiple of 8 measured "
                 "0.91x eager and 1.01x compiled on an H100 (docs/gpu/2026-11-27-h100-2.md), and inductor "
                 "pads matrix shapes itself; drop it",
}


def usage(prog, positional=True):
    """The usage line: ``usage: PROG [--flag=value ...] POSITIONALS`` (``positional`` names them
    when it is a string)."""
    tail = " " + positional if isinstance(positional, str) and positional else ""
    return "usage: %s [--flag=value ...]%s" % (prog, tail)


def quiet_stdout():
    """After a reader closed our stdout (``--help | head``): send the rest to /dev/null, so that
    neither later prints nor the interpreter's last flush raise BrokenPipeError."""
    from mlperf_bert.start_signals import drop_output
    drop_output(sys.stdout.fileno())


def check_removed(fv, argv, foreign=None):
    """A UserError naming the first flag of ``argv`` that ``REMOVED_FLAGS`` lists, or ``foreign``
    ({name: (whose flag it is, what to use instead)}: another implementation's spelling), and ``fv``
    does not define (``--name``, ``--name=value``, ``--noname``; nothing after ``--``)."""
    foreign = foreign or {}
    for arg in list(argv)[1:]:
        if arg == "--":
            return
        if not arg.startswith("-"):
            continue
        name = arg.lstrip("-").split("=", 1)[0]
        for cand in (name, name[2:] if name.startswith("no") else None):
            if cand in fv:
                continue
            if cand in REMOVED_FLAGS:
                raise UserError("flag --%s was %s" % (cand, REMOVED_FLAGS[cand]))
            if cand in foreign:
                raise UserError("flag --%s is %s, not this command's: %s" % ((cand,) + foreign[cand]))


def DEFINE_workers(help, flag_values):
    """--workers (default None: all cores), checked by ``parse``: 0 or less is refused."""
    DEFINE_integer("workers", None, help, flag_values=flag_values)


def _check_workers(fv):
    if "workers" in fv and fv.workers is not None and fv.workers < 1:
        raise UserError("--workers=%d must be at least 1" % fv.workers)


def asks_help(argv):
    """Whether ``argv`` (argv[0] is the program) asks ``parse`` for the help."""
    return any(a in ("--help", "-h", "--helpfull", "--helpshort") for a in list(argv)[1:])


def check_required(fv, names, hint=""):
    """A one-line error for the first of ``names`` that has no value (``hint`` ends the line)."""
    for name in names:
        missing = missing_value(name, fv[name].value)
        if missing:
            raise UserError(missing + hint)


def missing_value(name, value):
    """The line for a required flag ``name`` without a value: none, or an empty text (``--input=``,
    an unset shell variable: read as a path it was "TF checkpoint  not found"); None when it has one."""
    if value is None:
        return "flag --%s is required" % name
    if isinstance(value, str) and not value.strip():
        return "flag --%s is required, and was given empty (--%s=%s)" % (name, name, value)
    return None


def refuse_given_empty(fv, gives):
    """An optional flag of ``fv`` given an empty text (``--manifest=$UNSET``) is refused, not read as
    left out (a default then took its place unsaid); ``gives``: {flag name: what to give instead}."""
    for name, give in gives.items():
        value = fv[name].value
        if value is not None and not value.strip():
            raise UserError("--%s was given empty (--%s=%s; an unset variable?): give %s, or leave the flag out"
                            % (name, name, value, give))


def _undecodable_flagfile(argv):
    """Which --flagfile of ``argv`` is not UTF-8 (one it names may be: then absl's position)."""
    for arg in argv[1:]:
        path = arg.split("=", 1)[1] if arg.startswith(("--flagfile=", "-flagfile=")) else None
        if path:
            try:
                with open(path, encoding="utf-8") as f:
                    f.read()
            except UnicodeDecodeError:
                return "--flagfile=%s" % path
            except OSError:
                pass
    return "a file named by a --flagfile"


def _refuse_special_flagfiles(argv):
    """absl opens a --flagfile (=PATH or PATH after it, "~" expanded) as it is: a named pipe that no
    process writes to waited for ever. Refused in one line, as a socket or a device; a pipe a process
    holds, as ``--flagfile=<(...)`` or ``/dev/stdin`` give, is read. (A --flagfile inside a flagfile
    is absl's alone.)"""
    for i, arg in enumerate(argv[1:], 1):
        if arg in ("--flagfile", "-flagfile") and i + 1 < len(argv):
            path = argv[i + 1]
        elif arg.startswith(("--flagfile=", "-flagfile=")):
            path = arg.split("=", 1)[1]
        else:
            continue
        path = os.path.expanduser(path)
        kind = special_kind(path)
        if kind and "pipe:[" not in os.path.realpath(path):  # (an inherited pipe: /proc/PID/fd/pipe:[N])
            raise UserError("--flagfile=%s is %s, not a regular file: a --flagfile holds --flag=value lines"
                            % (path, kind))


def parse(fv, argv, required=(), positional=True, foreign=None):
    """Parse ``argv`` (argv[0] is the program) into ``fv``; return the leftover positionals.

    ``--help`` / ``-h`` print the usage line and every flag with its help and default, and exit 0.
    ``positional``: a string names the positional arguments in the usage line (``"LOG ..."``);
    False: a leftover argument is an error (e.g. ``--input_file=a, b`` would otherwise drop ``b``
    silently). ``foreign``: other implementations' flags, refused naming what to use (check_removed).
    """
    if asks_help(argv):
        try:
            print(usage(argv[0], positional) + "\n")
            print(fv.get_help())
            sys.stdout.flush()
        except BrokenPipeError:
            quiet_stdout()
        raise SystemExit(0)
    check_removed(fv, argv, foreign)
    _refuse_special_flagfiles(argv)
    try:
        rest = fv(list(argv))
    except _absl.Error as e:
        raise UserError("%s (see --help)" % e)  # the whole message: a value's newline is escaped, not a cut
    except UnicodeDecodeError as e:  # absl reads a --flagfile as UTF-8 text, and raises this as it is
        raise UserError("%s is not UTF-8 text (%s): a --flagfile holds --flag=value lines" % (
            _undecodable_flagfile(argv), e.reason))
    except ValueError as e:  # absl's own for --noflag=value ("does not take an argument"), not an absl Error
        raise UserError("%s (see --help)" % e)  # the whole message: a value's newline is escaped, not a cut
    check_required(fv, required)
    _check_workers(fv)
    if positional is False and rest[1:]:
        raise UserError("unexpected argument %r: this command takes only --flag=value arguments "
                        "(lists are comma-separated, without spaces)" % rest[1])
    return rest[1:]
