"""absl-style flags (``--name=value``, ``--noname``) without absl's process-global state.

Each command defines its flags on its own ``FlagValues`` so several commands can run
in one process (tests) and so a bad flag becomes one UserError line.
"""
from absl import flags as _absl

from mlperf_bert.errors import UserError

FlagValues = _absl.FlagValues
DEFINE_string = _absl.DEFINE_string
DEFINE_integer = _absl.DEFINE_integer
DEFINE_float = _absl.DEFINE_float
DEFINE_bool = _absl.DEFINE_bool
DEFINE_enum = _absl.DEFINE_enum
DEFINE_list = _absl.DEFINE_list


def parse(fv, argv, required=(), positional=True):
    """Parse ``argv`` (argv[0] is the program) into ``fv``; return the leftover positionals.

    ``--help`` / ``-h`` print every flag with its help and default, and exit 0.
    ``positional=False``: a leftover argument is an error (e.g. ``--input_file=a, b`` would
    otherwise drop ``b`` silently).
    """
    if any(a in ("--help", "-h", "--helpfull", "--helpshort") for a in list(argv)[1:]):
        print("usage: %s [--flag=value ...]\n" % argv[0])
        print(fv.get_help())
        raise SystemExit(0)
    try:
        rest = fv(list(argv))
    except _absl.Error as e:
        raise UserError("%s (see --help)" % str(e).splitlines()[0])
    for name in required:
        if fv[name].value is None:
            raise UserError("flag --%s is required" % name)
    if not positional and rest[1:]:
        raise UserError("unexpected argument %r: this command takes only --flag=value arguments "
                        "(lists are comma-separated, without spaces)" % rest[1])
    return rest[1:]
