"""The ``:::MLLOG`` records of an MLPerf log file, read with the standard library alone: start_training.sh
asks harness/run_state.py about a run's log before and after each run, a process each time, which
paid for the log checker's imports (absl, mllog and numpy: four times Python's own start).
harness/compliance.py checks what these records say."""
import collections
import json
import math
import os
import stat

from mlperf_bert.errors import UserError
from mlperf_bert.fileio import FIFO, special_kind

# mlperf_logging's parser (training 5.0.0) takes a line from its last ":::MLLOG " (a line that two
# processes wrote into each other holds two) and no line without the space after it
_MARK = ":::MLLOG "

Record = collections.namedtuple("Record", "lineno line key value metadata event_type time_ms")


def read_log(path, in_progress=False):
    """Parse the ``:::MLLOG`` lines of ``path`` into Records (other lines are ignored).

    A line this project cannot check (not JSON, metadata that is not an object, a non-numeric
    eval_accuracy or time_ms, another benchmark's log) is a UserError naming the file and line.
    ``in_progress``: the log of a run that may still be writing it (plot-log): a last line without
    its newline that is no JSON is one still being written (a logger that writes stdout in 4 KiB
    blocks leaves one there most of the time), left out."""
    if os.path.isdir(path):
        raise UserError("cannot read log %s: it is a directory (pass a log file, or a directory holding"
                        " result_*.txt)" % path)
    kind = special_kind(path)
    try:
        if kind in (FIFO, "a socket"):  # waited on for a writer; the checkers each read it
            raise UserError("cannot read log %s: it is a pipe: save the log to a file and pass that" % path)
        if kind and not _is_null(path):
            # read whole, /dev/zero and /dev/urandom took all memory (a MemoryError traceback, or the
            # host's OOM killer); a terminal waited for input
            raise UserError("cannot read log %s: it is a device, not a file: save the log to a file and pass that"
                            % path)
        # read as the official parser reads it (latin-1: one character a byte), each line then
        # decoded as the UTF-8 it is (``_utf8``), a line at a time: the whole text and its list of
        # lines, held beside the records, were 2.3 times the log's size (a 1.2 GB log took 8.7 GB)
        records = []
        with open(path, encoding="latin-1") as f:
            # lines as the official parser iterates its file: ends at \n, \r\n and \r alone
            # (str.splitlines also cut at U+2028, U+0085, \f..., which a JSON string may hold raw)
            for i, line in enumerate(f, 1):
                ended = line.endswith("\n")  # only the last line may lack its newline
                rec = _record(path, i, line[:-1] if ended else line, in_progress and not ended)
                if rec:
                    records.append(rec)
                if not ended:
                    break  # the end of the log as read: what a writer adds later is not this line's
    except OSError as e:
        raise UserError("cannot read log %s: %s" % (path, e.strerror))
    if not records:
        from mlperf_bert.fileio import compressed
        with open(path, "rb") as f:
            head = f.read(2)
        if compressed(path):
            raise UserError("%s (the official checker reads plain text too)" % compressed(path))
        if head in (b"\xff\xfe", b"\xfe\xff"):
            raise UserError("%s is UTF-16 text: convert it to UTF-8 first (iconv -f UTF-16 -t UTF-8)" % path)
        raise UserError("%s has no :::MLLOG lines: pass the MLPerf log written by --mlperf_log" % path)
    return records


def _record(path, i, line, partial):
    """The Record of line ``i`` (without its newline) of ``path``, or None for a line without the
    marker. ``partial``: the last line of a log still being written, without its newline, where no
    JSON is a line still being written (None), not a malformed one."""
    at = line.rfind(_MARK)
    if at < 0:
        return None  # launcher and progress output may be interleaved with the log
    # the official parser strips the line from its marker with str.strip() of its latin-1 text: white
    # space after the JSON (\f, \v, \x1c-\x1f, \x85, \xa0 too, which JSON's grammar refuses) is cut
    body = _utf8(line[at:].strip()[len(_MARK):])
    line = _utf8(line)
    try:
        d = json.loads(body)
        rec = Record(i, line.strip(), d["key"], d.get("value"), d.get("metadata") or {},
                     d.get("event_type"), _time(d.get("time_ms")))
    except (ValueError, KeyError, TypeError, RecursionError):  # (JSON nested past the parser's depth)
        if partial:
            return None
        raise UserError("%s:%d: malformed MLLOG line (truncated log?): %s" % (path, i, line[:200]))
    problem = _malformed(rec) or _missing(d)
    if problem:
        raise UserError("%s:%d: %s: %s" % (path, i, problem, line[:200]))
    if rec.key == "submission_benchmark" and rec.value != "bert":
        raise UserError("%s:%d: a log of benchmark %r: check-log, plot-log and score check BERT logs"
                        % (path, i, rec.value))
    return rec


def _utf8(text):
    """``text`` read as latin-1 (its bytes, one a character), decoded as UTF-8 (a byte that is no UTF-8: U+FFFD)."""
    return text.encode("latin-1").decode("utf-8", errors="replace")


def _is_null(path):
    """Whether ``path`` is the null device (its device number: a copy made by mknod too): an empty
    log, as the file it stands for."""
    try:
        st, null = os.stat(path), os.stat(os.devnull)
    except OSError:
        return False
    return stat.S_ISCHR(st.st_mode) and stat.S_ISCHR(null.st_mode) and st.st_rdev == null.st_rdev


def _time(v):
    """time_ms as the official parser reads it, ``float(m['time_ms'])``: a string holding a number
    ("1745139526341") is that number; anything else is left for ``_malformed`` to judge."""
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            pass
    return v


def _malformed(rec):
    """Why ``rec`` is not an MLLOG record as mllog writes it, or None."""
    if not isinstance(rec.key, str):
        return "key %r is not a string" % (rec.key,)
    if not isinstance(rec.metadata, dict):
        return "metadata is a %s, not an object" % type(rec.metadata).__name__
    if rec.time_ms is not None and not number(rec.time_ms):
        return "time_ms %r is not a number" % (rec.time_ms,)
    if rec.key == "eval_accuracy" and not number(rec.value):
        return "eval_accuracy %r is not a number" % (rec.value,)
    return None


def _missing(d):
    """The field mllog writes on every line that ``d`` lacks, said so, or None: the official parser
    reads time_ms, value and metadata of every line and stops (a KeyError, no line named) at one without."""
    gone = [k for k in ("time_ms", "value", "metadata") if k not in d]
    return "no %s field (mllog writes time_ms, key, value and metadata on every line)" % gone[0] if gone else None


def number(v):
    """Whether ``v`` is a JSON number (a bool is not one)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def finite(v):
    """Whether ``v`` is a finite JSON number: Python's json reads NaN, Infinity and 1e400 (inf), which
    compare false with every bound (NaN) or fail int() and the clock's conversions."""
    return number(v) and math.isfinite(v)


def run_start_stop(records):
    """The run_start and run_stop records the official result summarizer times a run by
    (``_query_run_start_stop``): read in order until both were seen, so the last run_start before the
    first run_stop, which a later one does not move. Either is None where the log has none."""
    start = stop = None
    for r in records:
        if r.key == "run_start":
            start = r
        if r.key == "run_stop":
            stop = r
        if start and stop:
            break
    return start, stop


def run_seconds(start, stop):
    """Seconds from ``start`` to ``stop`` (the records ``run_start_stop`` gives), or None where either is
    missing or its time_ms is not a finite number (a logger's null, NaN, 1e400)."""
    if start is None or stop is None or not (finite(start.time_ms) and finite(stop.time_ms)):
        return None
    return (stop.time_ms - start.time_ms) / 1000.0
