"""``check-log LOG``: the official MLPerf compliance checker plus the BERT rules it lacks.

The official checker (training ruleset 5.0.0, the last one with BERT) checks key presence
and structure; it does not know the BERT eval-frequency grid or the stopping rule.  Each
rule prints PASS/FAIL with the offending log line; the exit status is 0 only if all pass.
"""
import collections
import json
import os
import subprocess
import sys
import tempfile

from mlperf_bert import flags
from mlperf_bert.errors import UserError
from mlperf_bert.harness.mlperf_log import eval_frequency  # the trainer's formula (REFERENCE.md section 3), tested here too

RULESET = "5.0.0"
CLOSED_TARGET = 0.720
CLOSED_EVAL_SAMPLES = 10000
# Logged once per run by the trainer in either division (the closed BERT ruleset's keys
# plus the common ones); the official checker only enforces part of this for open runs.
HYPERPARAMETERS = (
    "global_batch_size", "opt_base_learning_rate", "opt_lamb_epsilon",
    "opt_learning_rate_training_steps", "opt_learning_rate_warmup_steps",
    "num_warmup_steps", "start_warmup_step", "opt_lamb_beta_1", "opt_lamb_beta_2",
    "opt_lamb_weight_decay_rate", "gradient_accumulation_steps", "seed",
    "train_samples", "eval_samples",
)
# Custom key (not in mllog.constants) with which our trainer states an open-division target.
TARGET_KEY = "target_accuracy"
_MARK = ":::MLLOG"

Record = collections.namedtuple("Record", "lineno line key value metadata event_type time_ms")
Result = collections.namedtuple("Result", "rule ok detail lineno line")


def eval_points(global_batch_size, count, at_zero=False, freq=None):
    """Samples counts of the first ``count`` evals: the first update boundary at or past each
    multiple of eval_frequency (a global batch is never split), optionally one at 0 first.
    One eval covers every multiple it passed (an open run's eval_frequency may be < the batch)."""
    freq = freq or eval_frequency(global_batch_size)
    pts = [0] if at_zero else []
    k = 1
    while len(pts) < count:
        pts.append(-(-k * freq // global_batch_size) * global_batch_size)
        k = pts[-1] // freq + 1
    return pts


def read_log(path):
    """Parse the ``:::MLLOG`` lines of ``path`` into Records (other lines are ignored)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise UserError("cannot read log %s: %s" % (path, e.strerror))
    records = []
    for i, line in enumerate(lines, 1):
        at = line.find(_MARK)
        if at < 0:
            continue  # torchrun and progress output may be interleaved with the log
        try:
            d = json.loads(line[at + len(_MARK):])
            rec = Record(i, line.strip(), d["key"], d.get("value"), d.get("metadata") or {},
                         d.get("event_type"), d.get("time_ms"))
        except (ValueError, KeyError, TypeError):
            raise UserError("%s:%d: malformed MLLOG line (truncated log?): %s" % (path, i, line[:200]))
        records.append(rec)
    if not records:
        raise UserError("%s has no :::MLLOG lines: pass the MLPerf log written by --mlperf_log" % path)
    return records


def samples_of(rec):
    """The training-samples position a line is logged at (BERT logs samples as epoch_num)."""
    md = rec.metadata
    for k in ("samples_count", "epoch_num"):
        if isinstance(md.get(k), (int, float)) and not isinstance(md.get(k), bool):
            return md[k]
    return None


def _find(records, key):
    return [r for r in records if r.key == key]


def _one_value(records, key):
    found = _find(records, key)
    return found[0].value if len(found) == 1 else None


def _res(rule, ok, detail, rec=None):
    return Result(rule, ok, detail, rec.lineno if rec else None, rec.line if rec else None)


def rule_hyperparameters(records):
    counts = collections.Counter(r.key for r in records)
    for key in HYPERPARAMETERS:
        if counts[key] != 1:
            extra = _find(records, key)
            return _res("hyperparameters_once", False, "%s logged %d times, expected exactly once"
                        % (key, counts[key]), extra[1] if len(extra) > 1 else None)
    return _res("hyperparameters_once", True, "%d hyperparameters each logged once" % len(HYPERPARAMETERS))


def rule_run_stop(records):
    stops = _find(records, "run_stop")
    if len(stops) != 1:
        return _res("run_stop", False, "%d run_stop lines, expected 1" % len(stops),
                    stops[1] if len(stops) > 1 else None)
    status = stops[0].metadata.get("status")
    if status not in ("success", "aborted"):
        return _res("run_stop", False, "run_stop status is %r, expected success or aborted" % status, stops[0])
    if stops[0] is not records[-1] and any(r.key != "run_stop" and r.lineno > stops[0].lineno
                                           and samples_of(r) is not None for r in records):
        return _res("run_stop", False, "training or eval logged after run_stop", stops[0])
    return _res("run_stop", True, "run_stop status %s" % status)


def rule_eval_samples(records, division):
    value = _one_value(records, "eval_samples")
    if division != "closed":
        return _res("eval_samples", True, "%s division: eval_samples %s not restricted" % (division, value))
    if value != CLOSED_EVAL_SAMPLES:
        rec = (_find(records, "eval_samples") or [None])[0]
        return _res("eval_samples", False, "closed division needs eval_samples %d, log has %s"
                    % (CLOSED_EVAL_SAMPLES, value), rec)
    return _res("eval_samples", True, "eval_samples %d" % CLOSED_EVAL_SAMPLES)


def _evals(records):
    return _find(records, "eval_accuracy")


def rule_eval_grid(records, division):
    gbs = _one_value(records, "global_batch_size")
    if not isinstance(gbs, int) or gbs <= 0:
        return _res("eval_grid", False, "no single positive integer global_batch_size line",
                    (_find(records, "global_batch_size") or [None])[0])
    freq = eval_frequency(gbs)
    logged = _find(records, "eval_frequency")  # our trainer's key; open runs may choose their own
    if logged and logged[0].value != freq:
        if division == "closed":
            return _res("eval_grid", False, "closed division needs eval_frequency %d for global_batch_size"
                        " %d" % (freq, gbs), logged[0])
        freq = logged[0].value
    evals = _evals(records)
    if not evals:
        return _res("eval_grid", False, "no eval_accuracy lines")
    first = samples_of(evals[0])
    grid = eval_points(gbs, len(evals) + 1, at_zero=first == 0, freq=freq)
    for rec, expected in zip(evals, grid):
        s = samples_of(rec)
        if s is None:
            return _res("eval_grid", False, "eval_accuracy without epoch_num/samples_count", rec)
        if s != expected:
            return _res("eval_grid", False, "eval at %s samples, expected %d (eval_frequency %d for "
                        "global_batch_size %d)" % (s, expected, freq, gbs), rec)
    trained = max(samples_of(r) for r in records if samples_of(r) is not None)
    if trained >= grid[-1]:
        last = max((r for r in records if samples_of(r) == trained), key=lambda r: r.lineno)
        return _res("eval_grid", False, "trained %s samples but no eval at %d (skipped)"
                    % (trained, grid[-1]), last)
    return _res("eval_grid", True, "%d evals every %d samples (global_batch_size %d)"
                % (len(evals), freq, gbs))


def target_of(records, division):
    """The accuracy the run must reach: 0.720 closed; open: the log's ``target_accuracy``."""
    if division == "closed":
        return CLOSED_TARGET
    value = _one_value(records, TARGET_KEY)
    return value if isinstance(value, (int, float)) else None


def rule_stop_at_target(records, division):
    target = target_of(records, division)
    if target is None:
        return _res("stop_at_target", False, "open-division log states no single %s line"
                    " (the trainer logs it)" % TARGET_KEY)
    evals = _evals(records)
    stops = _find(records, "run_stop")
    stop = stops[-1] if stops else None
    status = stop.metadata.get("status") if stop else None
    hit = next((r for r in evals if isinstance(r.value, (int, float)) and r.value >= target), None)
    if hit is None:
        if status == "success":
            return _res("stop_at_target", False, "status success but no eval reached %.4g" % target, stop)
        return _res("stop_at_target", True, "target %.4g not reached, status %s" % (target, status))
    later = [r for r in records if r.lineno > hit.lineno and r.key in ("eval_accuracy", "block_start", "epoch_start")]
    if later:
        return _res("stop_at_target", False, "run went on after the first eval >= %.4g (line %d)"
                    % (target, hit.lineno), later[0])
    if status != "success":
        return _res("stop_at_target", False, "eval reached %.4g (line %d) but run_stop status is %s"
                    % (target, hit.lineno, status), stop)
    return _res("stop_at_target", True, "stopped at first eval >= %.4g: %.5f at %s samples"
                % (target, hit.value, samples_of(hit)))


def rule_samples_monotonic(records):
    prev = None
    for rec in records:
        s = samples_of(rec)
        if s is None:
            continue
        if s < 0 or (prev is not None and s < samples_of(prev)):
            return _res("samples_monotonic", False, "samples count %s after %s (line %d)"
                        % (s, samples_of(prev) if prev else None, prev.lineno if prev else 0), rec)
        prev = rec
    return _res("samples_monotonic", True, "samples counts never decrease")


def rule_train_samples(records):
    """train_samples = the samples trained when the run stopped, a whole number of micro-batches."""
    found = _find(records, "train_samples")
    if len(found) != 1:
        return _res("train_samples", False, "%d train_samples lines, expected 1" % len(found))
    rec, value = found[0], found[0].value
    gbs = _one_value(records, "global_batch_size")
    counts = [samples_of(r) for r in records if samples_of(r) is not None]
    trained = max(counts) if counts else None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        return _res("train_samples", False, "train_samples %r is not a non-negative integer" % (value,), rec)
    if value != trained:
        return _res("train_samples", False, "train_samples %s but the log's last samples count is %s"
                    % (value, trained), rec)
    accum = _one_value(records, "gradient_accumulation_steps")
    micro = gbs // accum if isinstance(gbs, int) and isinstance(accum, int) and accum > 0 else None
    if micro and value % micro:
        return _res("train_samples", False, "train_samples %d is not a whole number of micro-batches"
                    " of %d" % (value, micro), rec)
    return _res("train_samples", True, "train_samples %d" % value)


def division_of(records):
    value = _one_value(records, "submission_division")
    return value if value in ("closed", "open") else None


def bert_rules(records):
    """All BERT rules on parsed records, in a fixed order."""
    division = division_of(records)
    results = []
    if division is None:
        results.append(_res("division", False, "no single submission_division line with closed/open",
                            (_find(records, "submission_division") or [None])[0]))
        division = "closed"  # check the strictest rules
    results += [
        rule_hyperparameters(records),
        rule_eval_samples(records, division),
        rule_eval_grid(records, division),
        rule_stop_at_target(records, division),
        rule_run_stop(records),
        rule_samples_monotonic(records),
        rule_train_samples(records),
    ]
    return results


def official_check(path):
    """Run mlperf_logging's compliance checker (division from the log) in a subprocess."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "mlperf_logging.compliance_checker", "--usage", "training",
               "--ruleset", RULESET, "--log_output", os.path.join(tmp, "checker.log"), os.path.abspath(path)]
        proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True)
    out = [l for l in (proc.stdout + proc.stderr).splitlines()
           if l.strip() and "Logging output also at" not in l]
    if proc.returncode == 0:
        return _res("official_checker", True, "mlperf_logging training %s: SUCCESS" % RULESET)
    # keep the verdicts and offending lines, not the checker's JSON dumps of its state
    problems = [l for l in out if l.startswith(("WARNING", "ERROR", ":::MLLOG", "failed test"))] or out
    return Result("official_checker", False, "mlperf_logging training %s failed" % RULESET,
                  None, "\n      ".join(problems[-15:]))


def check_log(path, official=True):
    """Return the list of Results for ``path`` (official checker first when asked)."""
    records = read_log(path)
    results = [official_check(path)] if official else []
    return results + bert_rules(records)


def format_result(r):
    text = "%s %-20s %s" % ("PASS" if r.ok else "FAIL", r.rule, r.detail)
    if not r.ok and r.line:
        text += "\n      %s%s" % ("line %d: " % r.lineno if r.lineno else "", r.line)
    return text


def main(argv):
    fv = flags.FlagValues()
    flags.DEFINE_bool("official", True, "also run mlperf_logging's compliance checker", flag_values=fv)
    rest = flags.parse(fv, argv)
    if len(rest) != 1:
        raise UserError("usage: check-log [--noofficial] LOG (one MLPerf log file)")
    results = check_log(rest[0], official=fv.official)
    for r in results:
        print(format_result(r))
    failed = sum(not r.ok for r in results)
    print("%s: %s (%d/%d rules passed)" % (rest[0], "FAILED" if failed else "PASSED",
                                           len(results) - failed, len(results)))
    return 1 if failed else 0
