"""One-line user errors and the wrapper every command-line entry point uses."""
import sys


class UserError(Exception):
    """A problem with the user's input: printed as one line, exit status 2."""


def run_main(main, argv=None):
    """Run ``main(argv)`` and turn a UserError into one line on stderr and exit 2."""
    argv = sys.argv if argv is None else argv
    try:
        status = main(argv)
    except UserError as e:
        print("error: %s" % e, file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(status or 0)
