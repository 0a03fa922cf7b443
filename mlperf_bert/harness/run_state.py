"""What start_training.sh reports about a run: the seed its MLPerf log records, how it finished,
what its log says of the page cache and of its time.

``python -m mlperf_bert.harness.run_state OUTPUT_DIR LOG`` prints one line,
``SEED STATUS CACHE_CLEAR SECONDS``: the last ``seed`` the log records, the status of
``OUTPUT_DIR/run_finished.json`` (the trainer writes it when the run ends), the first
``cache_clear`` the log records (a resumed run keeps its first start's) and the seconds from the
log's ``run_start`` to its ``run_stop`` (what MLPerf scores), ``-`` for what is not there yet.
Always exit 0: a launcher asks this to word its message, and a missing or partial log is an
answer, not an error.
"""
import json
import os
import sys

from mlperf_bert.errors import UserError
from mlperf_bert.harness.records import finite, read_log

FINISHED = "run_finished.json"  # trainer/checkpoint.py's marker (not imported: it pulls in torch)


def _records(log):
    try:
        return read_log(log)
    except UserError:  # no log yet, or cut mid-line by a kill
        return []


def logged_seed(log, records=None):
    """The seed ``log`` records last (a resumed run logs the one it kept), or None."""
    seeds = [r.value for r in (_records(log) if records is None else records) if r.key == "seed"]
    return seeds[-1] if seeds else None


def logged_cache_clear(records):
    """The first ``cache_clear`` of a log's records (True/False), or None."""
    return next((r.value for r in records if r.key == "cache_clear"), None)


def time_to_train(records):
    """Seconds from the first ``run_start`` to the last ``run_stop`` of a log's records, or None (also
    where their time_ms is not a finite number: a logger's null, which read_log lets through)."""
    starts = [r.time_ms for r in records if r.key == "run_start" and finite(r.time_ms)]
    stops = [r.time_ms for r in records if r.key == "run_stop" and finite(r.time_ms)]
    return (stops[-1] - starts[0]) / 1000.0 if starts and stops else None


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
    records = _records(argv[2])
    seed, status = logged_seed(argv[2], records), finished_status(argv[1])
    cleared, seconds = logged_cache_clear(records), time_to_train(records)
    print("%s %s %s %s" % ("-" if seed is None else seed, status or "-", "-" if cleared is None else cleared,
                           "-" if seconds is None else "%.1f" % seconds))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
