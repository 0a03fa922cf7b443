"""What start_training.sh reports about a run: the seed its MLPerf log records, how it finished.

``python -m mlperf_bert.harness.run_state OUTPUT_DIR LOG`` prints one line, ``SEED STATUS``:
the last ``seed`` the log records and the status of ``OUTPUT_DIR/run_finished.json`` (the
trainer writes it when the run ends), ``-`` for what is not there yet.  Always exit 0: a
launcher asks this to word its message, and a missing or partial log is an answer, not an error.
"""
import json
import os
import sys

from mlperf_bert.errors import UserError
from mlperf_bert.harness.compliance import read_log

FINISHED = "run_finished.json"  # trainer/checkpoint.py's marker (not imported: it pulls in torch)


def logged_seed(log):
    """The seed ``log`` records last (a resumed run logs the one it kept), or None."""
    try:
        seeds = [r.value for r in read_log(log) if r.key == "seed"]
    except UserError:  # no log yet, or cut mid-line by a kill
        return None
    return seeds[-1] if seeds else None


def finished_status(output_dir):
    """The status of the finished marker in ``output_dir``, or None while the run has not ended."""
    try:
        with open(os.path.join(output_dir, FINISHED), encoding="utf-8") as f:
            return str(json.load(f).get("status", "unknown"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, AttributeError):
        return "unreadable"


def main(argv):
    if len(argv) != 3:
        print("usage: python -m mlperf_bert.harness.run_state OUTPUT_DIR LOG", file=sys.stderr)
        return 2
    seed, status = logged_seed(argv[2]), finished_status(argv[1])
    print("%s %s" % ("-" if seed is None else seed, status or "-"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
