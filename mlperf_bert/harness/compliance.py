"""``check-log LOG|DIR ...``: the official MLPerf compliance checker plus the BERT rules it lacks.

The official checker (training ruleset 5.0.0, the last one with BERT) checks key presence and
structure; it does not know the BERT eval grid or the stopping rule.  Each rule gives PASS,
WARN (legal, worth a look) or FAIL with the log line it is about; the exit status is 0 when
nothing fails.  docs/compliance.md quotes the rule text behind each check.
"""
import collections
import copy
import datetime
import fnmatch
import json
import logging
import os
import sys

from mlperf_bert import flags
from mlperf_bert.errors import UserError, error_line, escaped, stops_held, worker_pool
# eval_frequency: the formula of the reference README's "Stopping criteria"
from mlperf_bert.harness.mlperf_log import OPTIMIZER_KEYS, eval_frequency, reaches_target
from mlperf_bert.harness.records import (Record, finite, number as _number, read_log,  # noqa: F401 (Record, read_log: this module's API)
                                         run_seconds, run_start_stop)

RULESET = "5.0.0"
CLOSED_TARGET = 0.720
CLOSED_EVAL_SAMPLES = 10000
# Keys a BERT run logs exactly once (the closed ruleset's hyperparameters); the seed, eval_samples
# and train_samples have rules of their own.
HYPERPARAMETERS = (
    "global_batch_size", "opt_base_learning_rate", "opt_lamb_epsilon",
    "opt_learning_rate_training_steps", "opt_learning_rate_warmup_steps",
    "num_warmup_steps", "start_warmup_step", "opt_lamb_beta_1", "opt_lamb_beta_2",
    "opt_lamb_weight_decay_rate", "gradient_accumulation_steps",
)
# Seeds must be logged from Training v4.1 on; the runs of v4.0 and earlier were made before this.
SEED_REQUIRED_FROM = datetime.datetime(2024, 7, 1, tzinfo=datetime.timezone.utc)
# A packed run's updates hold a varying number of real sequences, and its eval step is chosen
# before it knows them: NVIDIA's packed code (and its reuses) logs global_batch_size as rows x GPUs
# x the nominal packing rate G and evaluates at update ceil(k x F / G), where epoch_num counts the
# real sequences trained so far; ours evaluates at the first update whose real count reaches k x F.
# Either lands within this band of k x F (docs/compliance.md, "The eval grid"):
#   - rounding to one update: up to one G above k x F;
#   - the packing phase: the real count after n updates wanders around n x G by up to
#     PACKED_PHASE_UPDATES updates either way (2.75 in the 30 published eos_n434 runs: rows hold 1 to
#     3 sequences, and how full the rows of the next updates are is not known when the step is chosen);
#   - the drift: the average packing rate differs from the nominal one, a fraction of k x F that grows
#     with k: PACKED_DRIFT, about twice what the accepted packed logs of v1.0-v5.0 that the official
#     5.0.0 checker passes need (0.107%: GIGABYTE's v3.0 G593-SD0; bench/published_logs.py; Google's
#     v1.0 tpu-v4-128 runs need up to 0.74%, but lack opt_lamb_epsilon and fail that checker). 1%
#     passed every eval of a run moved 0.9% early, 8 updates at 3,000,000 samples: no packing.
# A wrong frequency (e.g. 200,000 for 225,000 at G = 6,912) or a skipped eval sits outside it:
# F is more than 11 x G for every G, the band at most 7 x G + 0.4% of k x F wide.
PACKED_PHASE_UPDATES = 3
PACKED_DRIFT = 0.002
# Custom key (not in mllog.constants) with which our trainer states an open-division target.
TARGET_KEY = "target_accuracy"
PASS, WARN, FAIL = "PASS", "WARN", "FAIL"
ERROR = "ERROR"  # a log that could not be checked (unreadable, malformed, not BERT)

Result = collections.namedtuple("Result", "rule level detail lineno line")


def samples_of(rec):
    """The training position of a line, in samples.  BERT's epoch is the training sample
    (``epoch_num``); ``samples_count`` counts only outside evals (some logs put the eval-set
    size there)."""
    md = rec.metadata
    if _position(md.get("epoch_num")):
        return md["epoch_num"]
    if _position(md.get("samples_count")) and not rec.key.startswith("eval_"):
        return md["samples_count"]
    return None


def _position(v):
    """A count of samples: a finite number (NaN, which Python's json reads, compares false with
    every bound, so an eval at NaN samples met every grid check)."""
    return finite(v)


def _find(records, key):
    return [r for r in records if r.key == key]


def _values(lines):
    """The distinct values of ``lines`` (the official checker warns of a repeat with one value, fails
    one with several), as JSON text: null is a value too."""
    return {json.dumps(r.value, sort_keys=True) for r in lines}


def _one_value(records, key):
    """The value of ``key``'s lines when there is one, logged once or repeated as it was, else None."""
    values = _values(_find(records, key))
    return json.loads(values.pop()) if len(values) == 1 else None


def _res(rule, level, detail, rec=None):
    return Result(rule, level, detail, rec.lineno if rec else None, rec.line if rec else None)


def worst_level(results):
    """FAIL if any rule fails, else WARN if any warns, else PASS: the verdict of a log."""
    levels = {r.level for r in results}
    return FAIL if FAIL in levels else WARN if WARN in levels else PASS


def _run_time(records):
    stamp = next((r.time_ms for r in records if r.key == "run_start" and finite(r.time_ms)), None)
    try:
        return datetime.datetime.fromtimestamp(stamp / 1000, datetime.timezone.utc) if stamp else None
    except (OverflowError, OSError, ValueError):  # past the calendar's years: no date
        return None


def _hyperparameter_keys(records, division):
    """HYPERPARAMETERS, with AdamW's optimizer keys in place of LAMB's for an open log whose opt_name
    is adamw (this trainer's --optimizer=adamw); a closed log's are LAMB's, its rules'."""
    names = [r.value for r in records if r.key == "opt_name"]
    if division != "closed" and names and str(names[0]).lower() == "adamw":
        lamb = OPTIMIZER_KEYS["lamb"]
        return tuple(OPTIMIZER_KEYS["adamw"][lamb.index(k)] if k in lamb else k for k in HYPERPARAMETERS)
    return HYPERPARAMETERS


def rule_hyperparameters(records, division, raw=None):
    """``raw``: the log's records before ``verbatim_repeats`` (the seed checker reads every line)."""
    counts = collections.Counter(r.key for r in records)
    repeated = None
    keys = _hyperparameter_keys(records, division)
    for key in keys + ("eval_samples",):
        if counts[key] > 1 and _one_value(records, key) is None:
            return _res("hyperparameters_once", FAIL, "%s logged %d times with different values, expected once"
                        % (key, counts[key]), _find(records, key)[1])
        if counts[key] > 1:  # the official checker (EXACTLY_ONE) warns of this and passes it
            repeated = repeated or _res("hyperparameters_once", WARN, "%s logged %d times with one value,"
                                        " expected once (the official checker warns)" % (key, counts[key]),
                                        _find(records, key)[1])
        if counts[key] == 0:
            return _res("hyperparameters_once", FAIL if division == "closed" else WARN,
                        "%s is not logged" % key)
    seeds = _find(records, "seed")
    when = _run_time(records)
    before_v41 = when is not None and when < SEED_REQUIRED_FROM
    if not seeds:
        if before_v41:
            return repeated or _res("hyperparameters_once", WARN, "no seed line: allowed for a run of %s,"
                                    " before Training v4.1 made seeds mandatory" % when.date())
        return _res("hyperparameters_once", FAIL, "no seed line (required from Training v4.1 on)")
    for rec in seeds:
        try:
            int(rec.value)
        except (TypeError, ValueError, OverflowError):
            # the package checker's seed check runs for closed systems alone
            return _res("hyperparameters_once", FAIL if division == "closed" else WARN, "seed %r is not an"
                        " integer (the package checker's seed check, closed division only, reads each seed"
                        " with int() and fails the set)" % (rec.value,), rec)
    # The seed check (seed_checker.py, _assert_unique_seed_per_run) fails the set when one
    # (file, lineno, int(seed)) is logged twice, within one log too: a verbatim repeat (a tee) as
    # much as a seed logged again from its line. None of the 3,190 closed BERT logs of v1.0-v5.0 does.
    seen = {}
    for rec in (r for r in (records if raw is None else raw) if r.key == "seed"):
        where = json.dumps([rec.metadata.get("file"), rec.metadata.get("lineno"), int(rec.value)])
        if where in seen:
            return _res("hyperparameters_once", FAIL if division == "closed" and not before_v41 else WARN,
                        "seed %s logged twice from %s:%s (lines %d and %d): the package checker's seed check,"
                        " closed division only, fails a set that logs one seed from one file and line twice"
                        % (int(rec.value), rec.metadata.get("file"), rec.metadata.get("lineno"),
                           seen[where].lineno, rec.lineno), rec)
        seen[where] = rec
    if repeated:
        return repeated
    if len(seeds) > 1:
        return _res("hyperparameters_once", WARN, "seed logged %d times (the rules warn)" % len(seeds), seeds[1])
    return _res("hyperparameters_once", PASS, "%d hyperparameters and the seed each logged once"
                % len(keys + ("eval_samples",)))


def rule_eval_samples(records, division):
    rec = (_find(records, "eval_samples") or [None])[0]
    value = rec.value if rec else None
    if division != "closed":
        return _res("eval_samples", PASS, "%s division: eval_samples %s not restricted" % (division, value))
    if isinstance(value, str):  # the official checker asks only that it is not ''
        try:
            value = int(value) if value.strip().isdigit() else float(value)
        except ValueError:
            return _res("eval_samples", FAIL, "eval_samples %r is not a number: closed division evaluates at least"
                        " %d samples" % (value, CLOSED_EVAL_SAMPLES), rec)
    if not finite(value) or value < CLOSED_EVAL_SAMPLES:
        return _res("eval_samples", FAIL, "closed division evaluates at least %d samples, log has %s"
                    % (CLOSED_EVAL_SAMPLES, value), rec)
    if value > CLOSED_EVAL_SAMPLES:
        return _res("eval_samples", WARN, "eval_samples %s > %d (rounded up to whole eval batches?)"
                    % (value, CLOSED_EVAL_SAMPLES), rec)
    return _res("eval_samples", PASS, "eval_samples %s" % (value,))


def _positioned(records, key):
    return [(r, samples_of(r)) for r in _find(records, key)]


def packed_band(point, gbs):
    """(lowest, highest) training position a packed run's eval for grid point ``point`` may have."""
    slack = PACKED_PHASE_UPDATES * gbs + PACKED_DRIFT * point
    return int(point - slack), int(point + gbs + slack)


def _binding(division):
    """The level of a finding under a rule the training rules give the closed division alone (the
    evaluation frequency; the epoch reporting and train_samples the RCP checker reads)."""
    return FAIL if division == "closed" else WARN


def rule_eval_grid(records, division):
    """Every eval at or after its grid point k x F (rounded up to the batch), none skipped.
    Packed runs (most positions not whole micro-batches) must stay within packed_band of it.
    The rules fix the frequency for the closed division only: an open log is held to the
    eval_frequency it logs, as a warning, and to nothing when it logs none."""
    def off_grid(detail, rec):
        if division == "open":
            detail += " (open division: the rules fix the evaluation frequency of the closed division only)"
        return _res("eval_grid", _binding(division), detail, rec)

    logged = _find(records, "eval_frequency")  # our trainer's key; open runs may choose their own
    evals = _positioned(records, "eval_accuracy")
    if not evals:
        return _res("eval_grid", FAIL, "no eval_accuracy lines")
    for rec, s in evals:
        if s is None:
            return _res("eval_grid", FAIL, "eval_accuracy without a training position (epoch_num %r)"
                        % (rec.metadata.get("epoch_num"),), rec)
        if not 0 <= rec.value <= 1:  # NaN too: a diverged model's, or a broken logger's
            return _res("eval_grid", FAIL, "eval_accuracy %s at %s samples is not an accuracy (a number in 0..1)"
                        % (rec.value, s), rec)
    for (first, s), (rec, t) in zip(evals, evals[1:]):
        if t == s and s:
            # an epoch count (older logs' epoch_num 1 at every eval), not a count of samples
            return _res("eval_grid", _binding(division), "evals at lines %d and %d both at"
                        " training position %s: BERT's epoch_num is the training sample (training rules,"
                        " \"Epoch reporting\")" % (first.lineno, rec.lineno, s), rec)
    if division == "open" and not logged:
        return _res("eval_grid", PASS, "%d evals; open division without an eval_frequency line: the rules fix"
                    " the evaluation frequency of the closed division only" % len(evals))
    gbs_rec = (_find(records, "global_batch_size") or [None])[0]
    gbs = _one_value(records, "global_batch_size")
    if not finite(gbs) or gbs <= 0 or gbs != int(gbs):
        return _res("eval_grid", FAIL, "no single positive integer global_batch_size line", gbs_rec)
    gbs = int(gbs)
    freq = eval_frequency(gbs)
    note, note_rec = "", None
    if logged and division == "closed" and logged[0].value != freq:
        # not a key of the rules, maybe another harness's own (in steps): the evals say what was done
        note, note_rec = ("; the log's eval_frequency %r is not the formula's %d: the evals were checked"
                          " against the formula" % (logged[0].value, freq)), logged[0]
    elif logged and (not finite(logged[0].value) or logged[0].value <= 0):
        return _res("eval_grid", FAIL, "eval_frequency %r is not a positive number" % (logged[0].value,),
                    logged[0])
    elif logged:
        freq = logged[0].value
    accum = _one_value(records, "gradient_accumulation_steps")
    micro = gbs // accum if isinstance(accum, int) and accum > 0 and gbs % accum == 0 else gbs
    # most evals off the micro-batch grid, not any: one off by a partial batch (a last batch cut
    # short) made an unpacked run with every other eval rounded down "packed", inside its band
    trained_evals = [s for _, s in evals if s]
    packed = 2 * sum(1 for s in trained_evals if s % micro) > len(trained_evals)
    kind = "packed" if packed else "unpacked"
    k, late, late_rec = 1, 0, None
    for rec, s in evals:
        if s == 0:
            continue  # an extra eval before training
        point = k * freq
        boundary = -(-point // gbs) * gbs  # the first update at or after the grid point
        if packed:
            lo, hi = packed_band(point, gbs)
            if s < lo or s > hi:
                return off_grid("packed run: eval at %s samples, outside %d..%d around the"
                                " grid point %d (%d updates + %g%% below, %d + %g%% above; eval_frequency %d for"
                                " global_batch_size %d): wrong frequency or a skipped eval"
                                % (s, lo, hi, point, PACKED_PHASE_UPDATES, 100 * PACKED_DRIFT,
                                   PACKED_PHASE_UPDATES + 1, 100 * PACKED_DRIFT, freq, gbs), rec)
            k += 1
            continue
        if s < point:
            return off_grid("eval at %s samples, before the grid point %d (eval_frequency %d"
                            " for global_batch_size %d): eval points may only be rounded up"
                            % (s, point, freq, gbs), rec)
        if s >= point + freq and boundary < point + freq:
            return off_grid("no eval between %d and %d samples (skipped); next eval at %s"
                            % (point, point + freq, s), rec)
        if s - boundary > late:
            late, late_rec = s - boundary, rec
        k = int(s // freq) + 1
    trained = max(s for s in (samples_of(r) for r in records) if s is not None)
    point = k * freq
    due = packed_band(point, gbs)[1] if packed else -(-point // gbs) * gbs
    if trained >= due and trained > evals[-1][1]:
        last = max((r for r in records if samples_of(r) == trained), key=lambda r: r.lineno)
        return off_grid("trained %s samples but no eval at the grid point %d (skipped)"
                        % (trained, point), last)
    detail = "%d evals every %d samples (global_batch_size %d, %s)" % (len(evals), freq, gbs, kind)
    if late:
        return _res("eval_grid", WARN, detail + "; evals up to %s samples after the first update past their"
                    " grid point, to which the rules round up (accepted logs are that late: a warning)%s"
                    % (late, note), late_rec)
    if note:
        return _res("eval_grid", WARN, detail + note, note_rec)
    return _res("eval_grid", PASS, detail)


def target_of(records, division):
    """The accuracy the run must reach: 0.720 closed; open: the log's ``target_accuracy``."""
    if division == "closed":
        return CLOSED_TARGET
    value = _one_value(records, TARGET_KEY)
    return value if finite(value) else None


def _status_said(stop):
    """What ``stop`` (the run_stop line, or None) says of the run's status, in words: a status other than
    a plain word quoted (an empty one read "run_stop status is ", a missing one "status is None")."""
    if stop is None:
        return "no run_stop line"  # (a log cut off)
    if "status" not in stop.metadata:
        return "run_stop logs no status"
    status = stop.metadata["status"]
    plain = isinstance(status, str) and status.isprintable() and status and status.strip() == status
    return "run_stop status is %s" % (status if plain else repr(status))


def first_at_target(records, target):
    """The first eval_accuracy line at or above ``target`` and below 1.0 (the official checker's
    ATLEAST_ONE_CHECK, closed_bert.yaml: an accuracy of 1 reaches no target), or None."""
    return next((r for r in _find(records, "eval_accuracy") if _number(r.value) and reaches_target(r.value, target)),
                None)


def _stop_of(records):
    """The run_stop line whose status is the run's, or None. Of several (the official checker warns,
    rule_run_stop too; the result summarizer times the run to the first, the RCP checker takes the
    last one's status), one that says success: the official tools pass either order."""
    stops = _find(records, "run_stop")
    return next((r for r in stops if r.metadata.get("status") == "success"), stops[0] if stops else None)


def ended_at_budget(records):
    """The train_samples budget a log with no run_stop trained out, its evals still below the target:
    a train_samples line before its first eval (a count logged at the end is no budget), no eval past
    it, and the next eval would have been (tinycorp's v4.1 result_2.txt, published with its set); or
    None: a log that ends earlier was cut off, and whether it would have converged is unknown."""
    budget = _find(records, "train_samples")
    evals = _find(records, "eval_accuracy")
    at = [s for s in (samples_of(r) for r in evals) if s is not None]
    if len(budget) != 1 or not _number(budget[0].value) or len(at) < 2 or budget[0].lineno > evals[0].lineno:
        return None
    value = budget[0].value
    return value if max(at) <= value < at[-1] + (at[-1] - at[-2]) else None


def not_converged(records, division):
    """Why the run of a log whose evals never reached its target did not converge, in words (its
    run_stop status aborted, or no run_stop after its budget), or None: it reached the target, its
    log does not say it ended so (a log cut off, a run_stop of another status), or has no target."""
    target = target_of(records, division)
    if target is None or first_at_target(records, target) is not None:
        return None
    stop = _stop_of(records)
    if stop is not None:
        return "run_stop status aborted" if stop.metadata.get("status") == "aborted" else None
    budget = ended_at_budget(records)
    return None if budget is None else "no run_stop line after its train_samples budget of %s" % budget


def rule_stop_at_target(records, division):
    target = target_of(records, division)
    if target is None:  # another harness's open run: the official checker asks no target of it
        return _res("stop_at_target", WARN, "open-division log states no single %s line (this project's"
                    " trainer logs it): the stop at a target is not checked" % TARGET_KEY,
                    (_find(records, TARGET_KEY) or [None])[0])
    stop = _stop_of(records)
    status = stop.metadata.get("status") if stop else None
    said = _status_said(stop)
    hit = first_at_target(records, target)
    if hit is None:
        if status == "success":
            return _res("stop_at_target", FAIL, "status success but no eval reached %.4g" % target, stop)
        budget = ended_at_budget(records) if stop is None else None
        if budget is not None:
            return _res("stop_at_target", FAIL, "did not converge: no eval reached %.4g within its train_samples"
                        " budget of %s, and no run_stop line (a submission may drop one such run of its set)"
                        % (target, budget))
        if stop is None:  # a run still training (or its log cut off): not one that did not converge
            return _res("stop_at_target", FAIL, "no eval reached %.4g yet and no run_stop line: the run has not"
                        " ended (still training, or its log was cut off)" % target)
        return _res("stop_at_target", FAIL, "did not converge: no eval reached %.4g, %s (a submission"
                    " may drop one such run of its set)" % (target, said), stop)
    # an eval or a block begun after the hit, or any line at a later position (training went on inside
    # the block; no published BERT log of v1.0-v5.0 that this rule judges has one, only Google's open
    # v1.1 runs, which name no target of their own and are not judged: docs/compliance.md)
    reached = samples_of(hit)
    later = [r for r in records if r.lineno > hit.lineno and (
        r.key in ("eval_accuracy", "block_start", "epoch_start")
        or reached is not None and (samples_of(r) or 0) > reached)]
    if later:
        return _res("stop_at_target", FAIL, "run went on after the first eval >= %.4g (line %d)"
                    % (target, hit.lineno), later[0])
    if status != "success":
        return _res("stop_at_target", FAIL, "eval reached %.4g (line %d) but %s"
                    % (target, hit.lineno, said), stop)
    return _res("stop_at_target", PASS, "stopped at the first eval >= %.4g: %.5f at %s samples"
                % (target, hit.value, samples_of(hit)))


def rule_run_stop(records):
    """One run_stop, status success or aborted, nothing trained or evaluated after it. Several with one
    value (null, as every run_stop logs) the official checker (EXACTLY_ONE) warns of and passes; the
    result summarizer times the run to the first: so does this rule."""
    stops = _find(records, "run_stop")
    if not stops:
        return _res("run_stop", FAIL, "0 run_stop lines, expected 1")
    if len(_values(stops)) > 1:
        return _res("run_stop", FAIL, "%d run_stop lines with different values, expected 1" % len(stops), stops[1])
    stop, status = stops[0], stops[0].metadata.get("status")
    if status not in ("success", "aborted"):
        return _res("run_stop", FAIL, "run_stop status is %r, expected success or aborted" % status, stop)
    start, timed = run_start_stop(records)  # the pair the result summarizer times
    seconds = run_seconds(start, timed)
    if start is not None and seconds is None:
        return _res("run_stop", FAIL, "the run's time cannot be taken: run_start time_ms %r, run_stop time_ms %r"
                    " (a finite number of milliseconds each)" % (start.time_ms, timed.time_ms), timed)
    if start is not None and seconds < 0:
        return _res("run_stop", FAIL, "run_stop (time_ms %r) is %.1f s before run_start (line %d, time_ms %r): a"
                    " negative time to train" % (timed.time_ms, -seconds, start.lineno, start.time_ms), timed)
    after = [r for r in records if r.lineno > stop.lineno and r.key != "run_stop" and samples_of(r) is not None]
    if after:
        return _res("run_stop", FAIL, "training or eval logged after run_stop (line %d)" % stop.lineno, after[0])
    if len(stops) > 1:
        later = sorted({str(r.metadata.get("status")) for r in stops[1:]} - {status})
        return _res("run_stop", WARN, "%d run_stop lines, expected 1 (the official checker warns): the first ends"
                    " the run, status %s, as the result summarizer reads it%s" % (
                        len(stops), status, "; a later one says %s" % ", ".join(later) if later else ""), stops[1])
    return _res("run_stop", PASS, "run_stop status %s" % status)


# lines of the timed run: each must be stamped at or after the run_start it is timed from (run_stop's
# own order with it is rule_run_stop's)
_TIMED_KEYS = ("block_start", "block_stop", "epoch_start", "epoch_stop", "eval_start", "eval_stop", "eval_accuracy")


def rule_time_order(records, division):
    """The clock runs one way through what the rules time: the init (limited from the first init_start
    to init_stop, common.yaml), run_start, the training, run_stop (the time to train, as the result
    summarizer takes it). A log stamped otherwise has times that do not measure its run: a run_start
    stamped after training began, or a second one, shortened the score. No accepted BERT log of
    v1.0-v5.0 breaks these (bench/published_logs.py; an eval before run_start in the init, as PCL's
    v1.0 logs, is no part of the timed run). run_stop stamped before the eval that reached the target
    is a warning: four accepted v3.1 xFusion logs have it."""
    def ms(r):
        return r.time_ms if r is not None and finite(r.time_ms) else None
    inits = [r for r in _find(records, "init_start") if ms(r) is not None]
    first_init = min(inits, key=ms) if inits else None
    init_stop = next((r for r in _find(records, "init_stop") if ms(r) is not None), None)
    if first_init and init_stop and ms(init_stop) < ms(first_init):
        return _res("time_order", FAIL, "init_stop is stamped %.3f s before init_start (line %d): the init's time,"
                    " which the rules limit from the first init_start, cannot be taken"
                    % ((ms(first_init) - ms(init_stop)) / 1000, first_init.lineno), init_stop)
    start, stop = run_start_stop(records)  # the pair the result summarizer times
    if ms(start) is None:
        return _res("time_order", PASS, "no run_start time to order by (rule run_stop)")
    if init_stop and ms(init_stop) > ms(start):
        return _res("time_order", FAIL, "run_start (line %d) is stamped %.3f s before init_stop: the init would"
                    " be part of the time to train and escape its own limit"
                    % (start.lineno, (ms(init_stop) - ms(start)) / 1000), init_stop)
    first_start = _find(records, "run_start")[0]
    early = next((r for r in records if r.lineno > first_start.lineno and r.key in _TIMED_KEYS
                  and ms(r) is not None and ms(r) < ms(start)), None)
    if early:
        return _res("time_order", FAIL, "%s is stamped %.3f s before run_start (line %d), from which the result"
                    " summarizer times the run: training outside the time to train"
                    % (early.key, (ms(start) - ms(early)) / 1000, start.lineno), early)
    target = target_of(records, division)
    hit = first_at_target(records, target) if target is not None else None
    if ms(stop) is not None and ms(hit) is not None and ms(stop) < ms(hit):
        return _res("time_order", WARN, "run_stop is stamped %.3f s before the eval that reached %.4g (line %d):"
                    " the time to train (run_stop - run_start) leaves out the end of the run"
                    % ((ms(hit) - ms(stop)) / 1000, target, hit.lineno), stop)
    return _res("time_order", PASS, "init, run_start, training and run_stop stamped in that order")


def rule_samples_monotonic(records, division):
    """BERT's epoch is the training sample, reported so that the RCP checker can read a closed run's
    samples to converge (training rules, "Epoch reporting"): a count that never goes down. The RCP
    checker reads closed logs only: an open log's decrease is a warning."""
    level = _binding(division)
    prev = None
    for rec in records:
        s = samples_of(rec)
        if s is None:
            continue
        if s < 0:  # before any other position too: there is no earlier line to name
            return _res("samples_monotonic", level, "training position %s is negative" % (s,), rec)
        if prev is not None and s < samples_of(prev):
            return _res("samples_monotonic", level, "training position %s after %s (line %d)"
                        % (s, samples_of(prev), prev.lineno), rec)
        prev = rec
    return _res("samples_monotonic", PASS, "training positions (epoch_num) never decrease")


def rule_train_samples(records, division):
    """The samples to converge, logged at the end (read by the RCP checker, of closed runs only: in
    an open log every finding is a warning). Its absence is the official checker's failure
    (training 5.0.0 common.yaml: EXACTLY_ONE); here a warning, as the logs of earlier rounds may
    lack it. A count other than the last position is legal (a packed run may log the grid point as
    its position and its real count here); a count at or below the eval before the last (which
    missed the target), or past where the next eval was due, is not the samples to converge."""
    found = _find(records, "train_samples")
    if not found:
        return _res("train_samples", WARN, "no train_samples line (the official checker of training %s"
                    " requires exactly one; the RCP checker then reads the last eval's epoch_num)" % RULESET)
    if len(_values(found)) > 1:  # the official checker fails these too
        return _res("train_samples", FAIL, "%d train_samples lines with different values, expected at most 1"
                    % len(found), found[1])
    rec, value = found[0], found[0].value
    evals = _find(records, "eval_accuracy")
    if not finite(value) or value < 0:
        return _res("train_samples", _binding(division), "train_samples %r is not a"
                    " non-negative number (the RCP checker reads it, in closed runs)" % (value,), rec)
    start = next((r for r in records if r.key in ("run_start", "block_start")), None)
    if start is not None and rec.lineno < start.lineno:
        return _res("train_samples", WARN, "train_samples %s logged before training: a budget, not the"
                    " samples to converge (the RCP checker's --rcp-bert-train-samples would read it)"
                    % (value,), rec)
    if not evals or rec.lineno < evals[0].lineno:
        return _res("train_samples", WARN, "train_samples %s logged before any eval: not the samples to"
                    " converge of a run that evaluated (the RCP checker's --rcp-bert-train-samples would read it)"
                    % (value,), rec)
    trained = max((s for s in (samples_of(r) for r in records) if s is not None), default=None)
    if trained is None:
        return _res("train_samples", _binding(division), "train_samples %s but no line gives a training position"
                    " (epoch_num or samples_count)" % (value,), rec)
    at = [s for s in (samples_of(r) for r in evals) if s is not None]
    last, before = (at[-1], at[-2] if len(at) > 1 else 0) if at else (trained, 0)
    if value in (trained, last) and len(found) > 1:
        return _res("train_samples", WARN, "train_samples %s logged %d times with one value, expected once (the"
                    " official checker warns)" % (value, len(found)), found[1])
    if value in (trained, last):
        return _res("train_samples", PASS, "train_samples %s" % (value,))
    said = ("train_samples %s, the last eval's epoch_num %s (the RCP checker reads epoch_num, or train_samples"
            " with --rcp-bert-train-samples)" % (value, last))
    if any(b <= a for a, b in zip(at, at[1:])):  # eval_grid or samples_monotonic says why
        return _res("train_samples", WARN, said + ": not compared, the evals' positions do not increase", rec)
    if not before < value < last + (last - before):
        return _res("train_samples", _binding(division), said + ": not the samples to converge, which lie"
                    " after the eval before the last (at %s) and before the next one would have been due"
                    % (before,), rec)
    return _res("train_samples", WARN, said, rec)


def division_of(records):
    value = _one_value(records, "submission_division")
    return value if value in ("closed", "open") else None


# A systems JSON's "status" (the system-description checker's choices) and the submission_status
# values a log may carry for it (mllog's onprem/cloud/research; a Preview system is run on premises
# or in a cloud before it ships).
SYSTEM_STATUSES = {
    "Available on-premise": ("onprem",),
    "Available cloud": ("cloud",),
    "Research, Development, or Internal (RDI)": ("research",),
    "Preview": ("onprem", "cloud"),
}
# What a log says when nobody named the submitter or platform: our trainer's default, and the
# placeholders of NVIDIA's scripts that some published logs still carry.
PLACEHOLDERS = ("", "unknown")


def placeholder(value):
    return not isinstance(value, str) or value.strip().lower() in PLACEHOLDERS or "PLACEHOLDER" in value


def identity_of(records):
    """{org, platform, division, status} a log declares (its submission_* lines; None where the
    line is missing or repeated with another value)."""
    out = {}
    for field in ("org", "platform", "division", "status"):
        values = {json.dumps(r.value) for r in _find(records, "submission_" + field)}
        out[field] = json.loads(values.pop()) if len(values) == 1 else None
    return out


# What ``score`` refuses of a log's declared identity: a submission_division other than the
# systems JSON's. The official checker judges each log by the division the log declares
# (training_5.0.0/common.yaml loads {division}_common.yaml from it) while the package checker runs
# the seed and RCP checks by the systems JSON's, so such a log was never judged as the package
# claims (every published v5.0 BERT log agrees with its systems JSON). The official tools compare
# nothing else of a log with its package, and MLCommons published v5.0 packages whose logs say
# 'SUBMISSION_ORG_PLACEHOLDER', 'KRAI' for 'Krai' or 'onprem' for an 'Available cloud' system:
# ``score`` gives those as warnings; ``package``, which makes a new package, refuses them all.
SCORE_FAILS = ("division",)


def identity_findings(logs, org, division, status, platforms=None):
    """Why the logs' declared identity disagrees with a package's, as [(field, line)]: ``logs`` is
    [(name, records)]; ``org``: the package's submitter; ``division``/``status``: its systems JSON's;
    ``platforms``: the names the logs' submission_platform may take (None: any, but one for all logs
    and not a placeholder). One line per field and value, naming the logs."""
    seen = collections.defaultdict(list)  # (field, value) -> log names
    for name, records in logs:
        ident = identity_of(records)
        for field in ("org", "platform", "division", "status"):
            seen[field, ident[field]].append(name)
    allowed_status = SYSTEM_STATUSES.get(status, ())
    found = []
    platforms_seen = sorted({v for (f, v) in seen if f == "platform"}, key=str)
    for (field, value), names in sorted(seen.items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):
        which = _names(names)
        if value is None:
            found.append((field, "%s: no single submission_%s line" % (which, field)))
        elif field == "org" and value != org:
            found.append((field, "%s: submission_org %r, the package's submitter is %r (a log must name its"
                          " submitter: runs made with SUBMISSION_ORG=%s)" % (which, value, org, org)))
        elif field == "division" and value != division:
            found.append((field, "%s: submission_division %r, the systems JSON says %r" % (which, value, division)))
        elif field == "status" and value not in allowed_status:
            found.append((field, "%s: submission_status %r, the systems JSON's status %r needs %s"
                          % (which, value, status, " or ".join(repr(s) for s in allowed_status) or
                             "one of %s" % ", ".join(repr(s) for s in SYSTEM_STATUSES))))
        elif field == "platform" and placeholder(value):
            found.append((field, "%s: submission_platform %r names no platform (runs made with"
                          " SUBMISSION_PLATFORM=<the system>)" % (which, value)))
        elif field == "platform" and platforms is not None and value not in platforms:
            found.append((field, "%s: submission_platform %r, the package's system is %s (--platform=%r if the"
                          " logs name this system so)" % (which, value, " or ".join(repr(p) for p in platforms),
                                                          value)))
    if len(platforms_seen) > 1 and None not in platforms_seen:
        found.append(("platform", "the logs name %d platforms (%s): a package holds the runs of one system"
                      % (len(platforms_seen), ", ".join(repr(p) for p in platforms_seen))))
    # the runs of a result are one setting (none of the 324 accepted BERT systems of v1.0-v5.0 varies one)
    for key in HYPERPARAMETERS + OPTIMIZER_KEYS["adamw"]:
        by_value = collections.defaultdict(list)
        for name, records in logs:
            first = _find(records, key)
            by_value[json.dumps(first[0].value, sort_keys=True) if first else "(none)"].append(name)
        if len(by_value) > 1:
            found.append(("hyperparameters", "the logs' %s differs: %s; the runs of a result share their "
                          "hyperparameters (package runs of one setting)" % (key, "; ".join(
                              "%s in %s" % (value, _names(names)) for value, names in sorted(
                                  by_value.items(), key=lambda kv: -len(kv[1]))))))
    return found


def identity_problems(logs, org, division, status, platforms=None):
    """The lines of ``identity_findings`` (``package`` refuses every one)."""
    return [line for _, line in identity_findings(logs, org, division, status, platforms)]


def _names(names):
    names = [os.path.basename(n) for n in names]
    return names[0] if len(names) == 1 else "%d logs (%s)" % (
        len(names), ", ".join(names) if len(names) <= 3 else "%s ... %s" % (names[0], names[-1]))


# The keys whose lines these rules count or place (a verbatim repeat of one is worth a warning)
_COUNTED_KEYS = frozenset(HYPERPARAMETERS + OPTIMIZER_KEYS["adamw"] + ("eval_samples", "seed", "eval_accuracy", "eval_frequency", "run_start",
                                             "run_stop", "train_samples", "submission_division", TARGET_KEY))


def verbatim_repeats(records):
    """(records without the lines that repeat an earlier one verbatim, [(repeat, its first)]): a
    logger that wrote a line twice (two handlers, a tee) logged one event, not two. An eval_accuracy
    line repeats one with its value and metadata at any time: one eval logged by two ranks (the
    official checker passes it), not a second eval at that position off the grid."""
    first, kept, repeats = {}, [], []
    for r in records:
        when = None if r.key == "eval_accuracy" else r.time_ms
        key = json.dumps([r.key, r.value, r.metadata, r.event_type, when], sort_keys=True)
        if key in first:
            repeats.append((r, first[key]))
        else:
            first[key] = r
            kept.append(r)
    return kept, repeats


def bert_rules(records):
    """All BERT rules on parsed records, in a fixed order."""
    raw = records
    records, repeats = verbatim_repeats(records)
    division = division_of(records)
    results = []
    # the official checker reads both: of a key it wants once it warns, others it passes. A repeat of
    # a key these rules count is said (accepted logs repeat init_start, each rank's, and cache_clear)
    counted = [(r, o) for r, o in repeats if r.key in _COUNTED_KEYS]
    if counted:
        rec, orig = counted[0]
        results.append(_res("repeated_lines", WARN, "%d line(s) repeat an earlier line (line %d repeats"
                            " line %d), each read once here" % (len(counted), rec.lineno, orig.lineno), rec))
    if division is None:
        results.append(_res("division", FAIL, "no single submission_division line with closed/open",
                            (_find(records, "submission_division") or [None])[0]))
        division = "closed"  # check the strictest rules
    return results + [
        rule_hyperparameters(records, division, raw),
        rule_eval_samples(records, division),
        rule_eval_grid(records, division),
        rule_stop_at_target(records, division),
        rule_run_stop(records),
        rule_time_order(records, division),
        rule_samples_monotonic(records, division),
        rule_train_samples(records, division),
    ]


def official_loglines(path):
    """What mlperf_logging's parser (training 5.0.0) makes of ``path``: (loglines, errors).

    The same steps as ``mlp_parser.ruleset_500.parse_file``, whose ``strip_and_dedup`` cuts each
    line to its last ``:::MLLOG `` with ``re.sub(".*:::MLLOG ", ...)``: that regex, retried at every
    position after the marker, is quadratic in the line's length (118 s for one 400 KB line).
    ``line[line.rfind(TOKEN):]`` is the same cut: file lines hold no newline before their end, the
    one character ``.`` does not match, so the greedy ``.*`` ends at the last marker.
    bench/official_parse.py compares the two on every real log."""
    from mlperf_logging.compliance_checker.mlp_parser import ruleset_500 as parser
    loglines, errors = [], []
    with open(path, encoding="latin-1") as f:
        for lineno, line in enumerate(_strip_and_dedup(f)):
            line = line.strip()
            try:
                loglines.append(parser.string_to_logline(lineno, line))
            except ValueError as e:
                errors.append((line, str(e)))
    return loglines, errors


def _strip_and_dedup(gen):
    """``ruleset_500.strip_and_dedup`` without its quadratic ``re.sub(".*:::MLLOG ", ...)``: each line
    cut at its last marker, the same lines (``official_loglines`` says why), as a generator."""
    from mlperf_logging.compliance_checker.mlp_parser import ruleset_500 as parser
    token = parser.TOKEN
    # lazily: the parser enumerates them once; a list of every line, held beside the LogLines made
    # of them, was the log's size again
    return (line[line.rfind(token):] for line in gen if token in line)


class _MarkerCut:
    """What the RCP checker sees as ``re``: its ``re.sub(".*:::MLLOG ", ":::MLLOG ", line)`` of a
    line with no newline before its last marker is the line from that marker (the greedy ``.*``
    stops at no other place; ``official_loglines`` says why), in linear time; any other call is re's."""

    def __init__(self, re_module, token):
        self._re, self._token, self._pattern = re_module, token, ".*" + token

    def __getattr__(self, name):
        return getattr(self._re, name)

    def sub(self, pattern, repl, string, *args, **kwargs):
        if pattern == self._pattern and repl == self._token and not args and not kwargs and type(string) is str:
            at = string.rfind(self._token)
            if at < 0:
                return string  # no match: re.sub gives the string back
            if "\n" not in string[:at]:
                return string[at:]
        return self._re.sub(pattern, repl, string, *args, **kwargs)


def speed_up_official_parse():
    """In a process that then runs an official tool (score's forked children, never this process):
    its log parser (training 5.0.0) and its RCP checker cut each line at its last marker as
    ``_strip_and_dedup`` and ``_MarkerCut`` do, without their quadratic regex, and its compliance
    checker reads its rule files through ``_Configs``, parsed once. The same lines, rules and
    verdicts; in score's three steps the regex and the rule files' parse were ~3/4 of the tools'
    time (~1 s of CPU per system of ten logs). Only the modules the tool imported (score imports
    it before it forks) are changed: the repo checker imports none of them."""
    import re
    parser = sys.modules.get("mlperf_logging.compliance_checker.mlp_parser.ruleset_500")
    if parser is not None:
        parser.strip_and_dedup = _strip_and_dedup
    rcp = sys.modules.get("mlperf_logging.rcp_checker.rcp_checker")
    if rcp is not None:
        rcp.re = _MarkerCut(re, rcp.TOKEN)
    checker = sys.modules.get("mlperf_logging.compliance_checker.mlp_compliance")
    if checker is not None:
        _read_rules_once(checker)


class _Configs:
    """What mlp_compliance sees as ``yaml`` while ``official_check`` runs: its rule files (the same
    three for every log) parsed once per process, each call given a copy of its own; the pure-Python
    parse of them was half of the check of a log. Anything else is yaml's."""

    def __init__(self, yaml):
        self._yaml, self._parsed = yaml, {}

    def __getattr__(self, name):
        return getattr(self._yaml, name)

    def load(self, stream, Loader):
        st = os.fstat(stream.fileno())
        key = (os.path.realpath(stream.name), st.st_mtime_ns, st.st_size, Loader)
        if key not in self._parsed:
            self._parsed[key] = self._yaml.load(stream, Loader=Loader)
        return copy.deepcopy(self._parsed[key])


_CONFIGS = []


def _read_rules_once(mlp_compliance):
    """Give ``mlp_compliance`` this process's ``_Configs`` as its ``yaml``; -> the configs."""
    if not _CONFIGS:
        _CONFIGS.append(_Configs(mlp_compliance.yaml))
    mlp_compliance.yaml = _CONFIGS[0]
    return _CONFIGS[0]


def official_check(path):
    """mlperf_logging's compliance checker, training 5.0.0 (division from the log), in this process:
    ``ComplianceChecker.check_file`` with the parse of ``official_loglines``."""
    from mlperf_logging.compliance_checker import mlp_compliance
    checker = mlp_compliance.make_checker("training", RULESET, False, False)
    root = logging.getLogger()
    level = root.level
    logging.disable(logging.CRITICAL)  # it reports through the root logger; we keep its messages
    configs = _read_rules_once(mlp_compliance)
    try:
        try:
            loglines, errors = official_loglines(path)
        except OSError as e:
            raise UserError("cannot read log %s: %s" % (path, e.strerror))
        if errors:
            checker.put_message("Log lines had parsing errors.")
        # an OSError from here on is the checker's own: no rule file for the division the log names
        # Its rules run under bare ``except:`` clauses that took a stop's exception (Ctrl-C's
        # KeyboardInterrupt, SIGTERM's Terminated, a pool worker's SystemExit) for a failed rule: the log
        # was given FAIL, a Ctrl-C was lost (exit 1), a pool worker checked on until its SIGKILL. Held,
        # the stop acts once the rules are done (~1 s later for a log of 10^6 lines).
        with stops_held():
            checker.check_loglines(loglines, "training_%s/common.yaml" % RULESET)
        valid = not checker.has_messages()
    except UserError:
        raise
    except Exception as e:  # its rules are code run on the log's values: say where it stopped
        raise UserError("%s: the official compliance checker stopped on this log (%s: %s%s); --noofficial"
                        " checks the BERT rules alone" % (
                            path, type(e).__name__, str(e).splitlines()[0] if str(e) else "",
                            ": it has rules for submission_division closed and open alone"
                            if isinstance(e, OSError) else ""))
    finally:
        del mlp_compliance.enqueued_configs[:]  # a module global: the next log must start clean (after a stop too)
        mlp_compliance.yaml = configs._yaml
        logging.disable(logging.NOTSET)
        root.setLevel(level)
    return checker_result(checker, valid)


def checker_result(checker, valid):
    """The Result of an official ComplianceChecker that has checked a log (``valid``: it passed)."""
    if valid:
        warnings = list(checker.warnings.values())
        if warnings:
            return Result("official_checker", WARN, "mlperf_logging training %s: SUCCESS with warnings" % RULESET,
                          None, "\n      ".join(_brief(w) for w in warnings[:5]))
        return _res("official_checker", PASS, "mlperf_logging training %s: SUCCESS" % RULESET)
    messages = list(checker.overwritable.values()) + list(checker.not_overwritable)
    return Result("official_checker", FAIL, "mlperf_logging training %s failed" % RULESET,
                  None, "\n      ".join(_brief(m) for m in messages[:10]))


def _brief(message):
    """An official checker's message without the state dump after its failed test ("current
    context[s]={...}", "current line[v]={...}": ~20 lines each, the same for every line of a log),
    its lines indented as one result's."""
    lines = message.strip().splitlines()
    cut = next((i for i, line in enumerate(lines) if line.startswith("current context")), len(lines))
    return "\n      ".join(lines[:cut])


def check_log(path, official=True, records=None):
    """Return the list of Results for ``path`` (official checker first when asked); ``records``: its
    ``read_log``, when the caller has it."""
    records = read_log(path) if records is None else records
    results = [official_check(path)] if official else []
    return results + bert_rules(records)


def format_result(r, indent=""):
    text = "%s%s %-20s %s" % (indent, r.level, r.rule, r.detail)
    if r.level != PASS and r.line:
        text += "\n%s      %s%s" % (indent, "line %d: " % r.lineno if r.lineno else "", r.line)
    return text


def run_number(path):
    """The number in a run's name (result_N.txt, run_N/mlperf.log; 0 if none): runs are listed in its
    order, result_2 before result_10."""
    # ASCII digits: str.isdigit also takes "²", which int() refuses (a traceback)
    digits = "".join(c for c in os.path.basename(path.rstrip("/")) if c in "0123456789") or \
        "".join(c for c in os.path.basename(os.path.dirname(path)) if c in "0123456789")
    return int(digits or 0)


def in_run_order(paths):
    """``paths`` folder by folder, each folder's runs in their numbers' order (``run_number``)."""
    return sorted(paths, key=lambda p: (os.path.dirname(p), run_number(p), p))


def _result_logs(top):
    """The ``result_*.txt`` under ``top`` at any depth, as ``glob("**/result_*.txt")`` finds them (no
    hidden names; linked folders followed), in run order (``in_run_order``), each folder read once: a
    link to a folder holding it (``up -> ..``) made glob read the same logs again and again, down to
    the path limit."""
    found, visited = [], set()
    for dirpath, dirnames, filenames in os.walk(top, followlinks=True):
        real = os.path.realpath(dirpath)
        if real in visited:
            dirnames[:] = []
            continue
        visited.add(real)
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        found += [os.path.join(dirpath, n) for n in dirnames + filenames
                  if not n.startswith(".") and fnmatch.fnmatch(n, "result_*.txt")]
    return in_run_order(found)


def expand(paths):
    """Log files from paths: files as given, directories by their ``result_*.txt`` (any depth)."""
    logs = []
    for p in paths:
        if os.path.isdir(p):
            found = _result_logs(p)
            if not found:
                raise UserError("%s holds no result_*.txt logs: pass log files or a results/<system>/bert/"
                                " directory" % p)
            logs += found
        elif os.path.lexists(p):  # a link that leads nowhere (a loop) too: read_log says why it cannot be read
            logs.append(p)
        else:
            raise UserError("cannot read log %s: No such file or directory" % p)
    return logs


def _check_one(args):
    path, official = args
    try:
        return path, check_log(path, official=official), None
    except UserError as e:
        return path, [], str(e)


def check_logs(paths, official=True, workers=None):
    """(path, results, error) for each log, checked in parallel when there are several."""
    jobs = [(p, official) for p in paths]
    if len(jobs) < 4:
        return [_check_one(j) for j in jobs]
    from mlperf_bert.fileio import usable_cores
    with worker_pool(workers or usable_cores(), "fork") as pool:
        return pool.map(_check_one, jobs, chunksize=8)


USAGE_ARGS = "LOG|DIR ..."


def main(argv):
    fv = flags.FlagValues()
    flags.DEFINE_bool("official", True, "also run mlperf_logging's compliance checker", flag_values=fv)
    flags.DEFINE_bool("json", False, "print one JSON object instead of text", flag_values=fv)
    rest = flags.parse(fv, argv, positional=USAGE_ARGS)
    if not rest:
        raise UserError("%s (MLPerf logs, or a results/<system>/bert/ directory)"
                        % flags.usage("check-log", USAGE_ARGS))
    groups = []  # per argument: its logs, or (with --json) why it has none
    seen = {}  # each log's real path: the path it was first given as, and the argument that gave it
    repeats = set()  # the errors that are a log given again (not counted as logs)
    for p in rest:
        try:
            logs = expand([p])
        except UserError as e:
            if not fv.json and len(rest) == 1:
                raise
            groups.append((p, [], str(e)))  # the other logs still get their verdicts
            continue
        fresh, again = [], []
        for f in logs:
            (again if os.path.realpath(f) in seen else fresh).append(f)
            seen.setdefault(os.path.realpath(f), (f, p))
        groups.append((p, fresh, None))
        if again:  # one log counted as two: its verdict said twice, the total wrong
            first, through = seen[os.path.realpath(again[0])]
            where = ["as %s" % first] if first != again[0] else []
            where += ["in %s" % through] if through not in (first, p) else []  # the folder that gave it first
            if again == [p]:
                error = "%s is given twice%s: give each log once" % (p, " (also %s)" % ", ".join(where) if where else "")
            else:
                error = "%s holds %d log%s given already (%s%s): give each log once" % (
                    p, len(again), "" if len(again) == 1 else "s", again[0], "".join(", first " + w for w in where))
            groups.append((p, [], error))
            repeats.add(error)
    done = iter(check_logs([f for _, logs, _ in groups for f in logs], official=fv.official))
    checked = []
    for p, logs, error in groups:
        checked += [next(done) for _ in logs] if error is None else [(p, [], error)]
    if len(checked) == 1 and checked[0][2] and not fv.json:
        raise UserError(checked[0][2])
    verdicts = collections.Counter()
    report = []
    for path, results, error in checked:
        verdict = ERROR if error else worst_level(results)
        verdicts["repeat" if error in repeats else verdict] += 1
        report.append({"log": path, "verdict": verdict, "error": error,
                       "rules": [r._asdict() for r in results]})
        if fv.json:
            continue
        if error:
            print(error_line(error), file=sys.stderr)
            continue
        if len(checked) == 1:
            for r in results:
                print(format_result(r))
        counts = collections.Counter(r.level for r in results)
        print("%s %s (%d pass, %d warn, %d fail)" % (verdict, escaped(path), counts[PASS], counts[WARN],
                                                     counts[FAIL]))
        if len(checked) > 1:
            for r in results:
                if r.level != PASS:
                    print(format_result(r, indent="    "))
    total = "%d logs: %d pass, %d warn, %d fail" % (len(checked) - verdicts["repeat"], verdicts[PASS], verdicts[WARN],
                                                     verdicts[FAIL])
    if verdicts[ERROR]:
        total += ", %d unreadable (see the error lines)" % verdicts[ERROR]
    if verdicts["repeat"]:
        total += "; %d given again, not checked twice (see the error lines)" % verdicts["repeat"]
    if verdicts["repeat"]:  # (--json: an ERROR entry each, as an unreadable one)
        verdicts[ERROR] += verdicts["repeat"]
    del verdicts["repeat"]
    if fv.json:
        json.dump({"logs": report, "total": dict(verdicts), "ok": not (verdicts[FAIL] or verdicts[ERROR])},
                  sys.stdout)
        print()
    elif len(checked) > 1:
        print(total)
    return 2 if verdicts[ERROR] else 1 if verdicts[FAIL] else 0
