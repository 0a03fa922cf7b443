"""What start_training.sh reports about a run: the seed its MLPerf log records, how it finished,
what its log says of the page cache and of its time.

``python -m mlperf_bert.harness.run_state OUTPUT_DIR LOG`` prints one line,
``SEED STATUS CACHE_CLEAR SECONDS RESUMED``: the last ``seed`` the log records, the status of
``OUTPUT_DIR/run_finished.json`` (the trainer writes it when the run ends), the first
``cache_clear`` the log records (a resumed run keeps its first start's), the seconds from the
log's ``run_start`` to its ``run_stop`` (what MLPerf scores) and the steps the run was resumed at
(its end marker's launch record, comma-separated), ``-`` for what is not there yet (or none);
then, where the run's end marker (run_finished.json, or the run_stopped.json written at its
run_stop) and its log disagree (``disagreement``), a second line ``0 WHAT``. More ``DIR LOG`` pairs
(start_training.sh's other runs of a series, looked at with run 0's, before it trains): the second
line is ``K WHAT`` for the first pair K (from 0) whose marker and log disagree, or K (from 1) whose
run ended or checkpointed and whose log is missing (``missing_log``). Always exit 0: a
launcher asks this to word its message, and a missing or partial log is an answer, not an error.
"""
import os
import sys

from mlperf_bert.errors import UserError
from mlperf_bert.fileio import load_json
from mlperf_bert.harness.records import read_log, run_seconds, run_start_stop
from mlperf_bert.start_signals import CKPT_RE  # (stdlib only: no torch)

# trainer/checkpoint.py's markers (not imported: it pulls in torch)
FINISHED = "run_finished.json"
STOPPED = "run_stopped.json"  # written at run_stop, before the finished marker
LOG_OWNER = "mlperf_log_path.json"


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


def finished_status(output_dir):
    """The status of the finished marker in ``output_dir``, or None while the run has not ended."""
    try:
        with open(os.path.join(output_dir, FINISHED), encoding="utf-8") as f:
            return str(load_json(f).get("status", "unknown"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, AttributeError):
        return "unreadable"


def resumed_steps(output_dir):
    """The steps the launch record of the run's end marker (run_finished.json, else run_stopped.json)
    says it was resumed at ([] when none, or no marker can be read)."""
    for name in (FINISHED, STOPPED):
        try:
            with open(os.path.join(output_dir, name), encoding="utf-8") as f:
                record = load_json(f)
        except (OSError, ValueError):
            continue
        launch = record.get("launch") if isinstance(record, dict) else None
        steps = launch.get("resumed_at_steps") if isinstance(launch, dict) else None
        return [s for s in steps if isinstance(s, int)] if isinstance(steps, list) else []
    return []


def _marker_status(output_dir, name):
    """The status ``output_dir/name`` records: None without the file, "" where it cannot be read (the
    trainer refuses such a marker in its own line)."""
    try:
        with open(os.path.join(output_dir, name), encoding="utf-8") as f:
            record = load_json(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return ""
    status = record.get("status") if isinstance(record, dict) else None
    return status if isinstance(status, str) else ""


def disagreement(output_dir, log, records=None):
    """What is wrong, in words naming both files, when the run in ``output_dir`` has ended (its
    run_finished.json, else the run_stopped.json written at its run_stop) but ``log`` does not end with
    that run_stop (a finished run's log cut since: package refuses it), or its run_stop's status is not
    the marker's (one of them edited: the run would be reported, and its log kept, as what it was not);
    else None. A log that is not there is the launcher's to say (a node other than rank 0's has none)."""
    for name in (FINISHED, STOPPED):
        status = _marker_status(output_dir, name)
        if status is not None:
            break
    else:
        return None
    if not status or not os.path.exists(log):
        return None
    marker = os.path.join(output_dir, name)
    if records is None:
        records = _records(log)
    if not records or records[-1].key != "run_stop":
        if name == STOPPED:  # the trainer's rerun compares the log with the bytes its record holds (preflight's
            return None  # check_stopped) and refuses another in its line: the series' runs before it trained nothing
        return ("%s says the run ended (status %s), but its MLPerf log %s does not end with its run_stop (cut, or "
                "written to, since)" % (marker, status, log))
    logged = records[-1].metadata.get("status")
    if logged is not None and logged != status:  # (a trainer of one's own may log no status: nothing to compare)
        return ("%s says the run ended with status %s, but the run_stop of its MLPerf log %s says %s (one of them "
                "was changed since)" % (marker, status, log, logged))
    return None


def missing_log(output_dir, log):
    """Where a series' later run in ``output_dir`` has ended or checkpointed (its end marker, a
    ``model.ckpt-<step>.pt``) but ``log``, in its own folder, is gone: what is wrong, in words naming
    both; else None. (The series would train its runs before it, then be refused there.)"""
    if os.path.exists(log):
        return None
    for name in (FINISHED, STOPPED):
        if os.path.exists(os.path.join(output_dir, name)):
            return "%s says the run ended, but its MLPerf log %s is missing" % (os.path.join(output_dir, name), log)
    # A checkpoint resumes onto the log it marks: one of a version before the log's record
    # (LOG_OWNER, written with those marks) appended its resume to a new log.
    if not os.path.exists(os.path.join(output_dir, LOG_OWNER)):
        return None
    try:
        steps = [(int(m.group(1)), n) for n in os.listdir(output_dir) for m in [CKPT_RE.match(n)] if m]
    except OSError:
        return None
    if steps:
        return "%s holds the run so far, but its MLPerf log %s is missing" % (os.path.join(output_dir, max(steps)[1]),
                                                                             log)
    return None


def main(argv):
    if len(argv) < 3 or len(argv) % 2 == 0:
        print("usage: python -m mlperf_bert.harness.run_state OUTPUT_DIR LOG [DIR LOG ...]", file=sys.stderr)
        return 2
    records = _records(argv[2])
    seed, status = logged_seed(argv[2], records), finished_status(argv[1])
    # (the run_start and run_stop the official result summarizer times: what MLPerf scores)
    cleared, seconds = logged_cache_clear(records), run_seconds(*run_start_stop(records))
    resumed = ",".join(map(str, resumed_steps(argv[1])))
    print("%s %s %s %s %s" % ("-" if seed is None else seed, status or "-", "-" if cleared is None else cleared,
                              "-" if seconds is None else "%.1f" % seconds, resumed or "-"))
    for k, (output_dir, log) in enumerate(zip(argv[1::2], argv[2::2])):
        problem = disagreement(output_dir, log, records if k == 0 else None)
        if not problem and k:  # (run 0's own missing log: the launcher's words, which know its LOGDIR)
            problem = missing_log(output_dir, log)
        if problem:
            print(k, problem)
            break
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
