"""check-log: valid logs written with mlperf_logging.mllog pass both checkers; each broken log fails its rule."""
import io
import itertools
import math
import json
import logging
import subprocess
import sys

import pytest
from mlperf_logging import mllog
from mlperf_logging.mllog.mllog import MLLogger

from mlperf_bert.harness import compliance
from mlperf_bert.errors import UserError

_ids = itertools.count()


def write_log(path, division="closed", gbs=256, accs=(0.5, 0.6, 0.73), status="success",
              eval_samples=10000, target=None, eval_at_zero=False, freq=None, seed=True,
              init_minutes=1, train_samples=None, extra=()):
    """A BERT log as our trainer writes it, through mllog itself (one update = gbs samples)."""
    stream = io.StringIO()
    logger = logging.getLogger("test_compliance_%d" % next(_ids))
    logger.propagate = False
    logger.setLevel(logging.INFO)
    logger.addHandler(logging.StreamHandler(stream))
    ml = MLLogger(logger=logger)
    clock = itertools.count(1_700_000_000_000, 1000)
    t = lambda: next(clock)  # noqa: E731
    c = mllog.constants
    for key, value in [(c.SUBMISSION_BENCHMARK, "bert"), (c.SUBMISSION_ORG, "test"),
                       (c.SUBMISSION_PLATFORM, "cpu"), (c.SUBMISSION_DIVISION, division),
                       (c.SUBMISSION_STATUS, "onprem"), (c.CACHE_CLEAR, True)]:
        ml.event(key, value, time_ms=t())
    t0 = t()
    ml.start(c.INIT_START, time_ms=t0)
    hyper = [(c.GLOBAL_BATCH_SIZE, gbs), (c.OPT_BASE_LR, 0.00035), (c.OPT_LAMB_EPSILON, 1e-6),
             (c.OPT_LR_TRAINING_STEPS, 13700), (c.OPT_LR_WARMUP_STEPS, 0), ("num_warmup_steps", 0),
             ("start_warmup_step", 0), (c.OPT_LAMB_BETA_1, 0.9), (c.OPT_LAMB_BETA_2, 0.999),
             (c.OPT_LAMB_WEIGHT_DECAY, 0.01), (c.GRADIENT_ACCUMULATION_STEPS, 1),
             (c.EVAL_SAMPLES, eval_samples)]
    if seed:
        hyper.append((c.SEED, 12345))
    if target is not None:
        hyper.append((compliance.TARGET_KEY, target))
    for key, value in hyper + list(extra):
        ml.event(key, value, time_ms=t())
    ml.end(c.INIT_STOP, time_ms=t0 + init_minutes * 60_000)
    for _ in range(init_minutes * 60):
        t()
    ml.start(c.RUN_START, time_ms=t())
    if freq:
        samples = [freq * (i + 1) for i in range(len(accs))]
    else:  # independent of compliance.eval_points: first whole batch at or past k * 150000
        samples = [0] if eval_at_zero else []
        samples += [math.ceil(150000 * (i + 1) / gbs) * gbs for i in range(len(accs) - len(samples))]
    prev = 0
    for s, acc in zip(samples, accs):
        if s > prev:
            ml.start(c.BLOCK_START, metadata={"first_epoch_num": prev, "epoch_count": s - prev,
                                              "samples_count": prev}, time_ms=t())
            ml.end(c.BLOCK_STOP, metadata={"first_epoch_num": prev, "samples_count": s}, time_ms=t())
        ml.start(c.EVAL_START, metadata={"epoch_num": s}, time_ms=t())
        ml.event(c.EVAL_ACCURACY, acc, metadata={"epoch_num": s}, time_ms=t())
        ml.end(c.EVAL_STOP, metadata={"epoch_num": s}, time_ms=t())
        prev = s
    ml.event(c.TRAIN_SAMPLES, prev if train_samples is None else train_samples, time_ms=t())
    ml.end(c.RUN_STOP, metadata={"status": status}, time_ms=t())
    path.write_text(stream.getvalue())
    return path


def results(path, official=False):
    return {r.rule: r for r in compliance.check_log(str(path), official=official)}


def only_failure(path):
    failed = [r.rule for r in results(path).values() if not r.ok]
    assert len(failed) == 1, failed
    return failed[0]


def edit(path, fn):
    lines = path.read_text().splitlines()
    path.write_text("\n".join(fn(lines)) + "\n")
    return path


def test_eval_frequency_matches_reference_examples():
    for gbs, freq in [(256, 150000), (1024, 150000), (1536, 150000), (2048, 150000),
                      (3072, 175000), (4096, 175000), (8192, 225000)]:
        assert compliance.eval_frequency(gbs) == freq


@pytest.mark.parametrize("gbs,freq", [(256, 150000), (192, 150000), (32, 1600), (32, 10), (64, 48)])
def test_eval_points_are_where_a_training_loop_evaluates(gbs, freq):
    # a loop over updates that evaluates once the samples reach the next multiple of freq not yet covered
    expected, next_eval, samples = [], freq, 0
    while len(expected) < 6:
        samples += gbs
        if samples >= next_eval:
            expected.append(samples)
            next_eval = (samples // freq + 1) * freq
    assert compliance.eval_points(gbs, 6, freq=freq) == expected
    assert compliance.eval_points(gbs, 7, at_zero=True, freq=freq) == [0] + expected


@pytest.mark.parametrize("division,kwargs", [
    ("closed", {}),
    ("open", {"target": 0.3, "accs": (0.1, 0.2, 0.31), "eval_samples": 500, "eval_at_zero": True}),
])
def test_valid_logs_pass_both_checkers(tmp_path, division, kwargs):
    log = write_log(tmp_path / "log.txt", division=division, **kwargs)
    proc = subprocess.run([sys.executable, "-m", "mlperf_bert", "check-log", str(log)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("PASS ") == 8 and "FAIL" not in proc.stdout
    assert "official_checker" in proc.stdout


def test_official_checker_failure_is_reported(tmp_path):
    # init longer than the 30 minutes the closed rules allow: only the official checker knows.
    log = write_log(tmp_path / "log.txt", init_minutes=31)
    res = results(log, official=True)
    assert not res["official_checker"].ok and "init_stop" in res["official_checker"].line
    assert all(r.ok for name, r in res.items() if name != "official_checker")
    # a log without the seed: the official checker lets it through, ours does not
    res = results(write_log(tmp_path / "noseed.txt", seed=False), official=True)
    assert res["official_checker"].ok and not res["hyperparameters_once"].ok
    assert "seed logged 0 times" in res["hyperparameters_once"].detail


def test_aborted_run_without_target_passes_bert_rules(tmp_path):
    log = write_log(tmp_path / "log.txt", accs=(0.5, 0.6), status="aborted")
    assert all(r.ok for r in results(log).values())


@pytest.mark.parametrize("name,kwargs,rule", [
    ("off_grid", {"gbs": 250, "freq": 125000}, "eval_grid"),
    ("eval_samples_closed", {"eval_samples": 9999}, "eval_samples"),
    ("success_without_target", {"accs": (0.5, 0.6), "status": "success"}, "stop_at_target"),
    ("ran_past_target", {"accs": (0.5, 0.73, 0.74)}, "stop_at_target"),
    ("aborted_at_target", {"status": "aborted"}, "stop_at_target"),
    ("open_without_target", {"division": "open", "eval_samples": 500}, "stop_at_target"),
    ("open_target_not_reached", {"division": "open", "target": 0.8, "eval_samples": 500}, "stop_at_target"),
    ("train_samples_wrong", {"train_samples": 12345}, "train_samples"),
    ("closed_own_frequency", {"extra": [("eval_frequency", 100000)]}, "eval_grid"),
])
def test_each_broken_log_fails_its_rule(tmp_path, name, kwargs, rule):
    assert only_failure(write_log(tmp_path / (name + ".txt"), **kwargs)) == rule


def test_open_division_uses_logged_eval_frequency(tmp_path):
    log = write_log(tmp_path / "log.txt", division="open", target=0.3, accs=(0.1, 0.2, 0.31),
                    eval_samples=500, freq=25600, extra=[("eval_frequency", 25600)])
    assert all(r.ok for r in results(log, official=True).values())
    log = write_log(tmp_path / "log2.txt", division="open", target=0.3, accs=(0.1, 0.2, 0.31),
                    eval_samples=500, freq=25600, extra=[("eval_frequency", 12800)])
    assert only_failure(log) == "eval_grid"


def test_skipped_eval(tmp_path):
    log = edit(write_log(tmp_path / "log.txt"),
               lambda ls: [l for l in ls if not ('"eval_' in l and '"epoch_num": 300032' in l)])
    r = results(log)["eval_grid"]
    assert not r.ok and "expected 300032" in r.detail and '"epoch_num": 450048' in r.line
    # training past the last grid point without an eval there
    log = edit(write_log(tmp_path / "past.txt", accs=(0.5, 0.6), status="aborted", train_samples=450048),
               lambda ls: [l.replace('"samples_count": 300032}', '"samples_count": 450048}') for l in ls])
    r = results(log)["eval_grid"]
    assert not r.ok and "no eval at 450048" in r.detail


def test_missing_run_stop(tmp_path):
    log = edit(write_log(tmp_path / "log.txt", accs=(0.5,), status="aborted"),
               lambda ls: [l for l in ls if '"run_stop"' not in l])
    assert not results(log)["run_stop"].ok


def test_hyperparameter_twice(tmp_path):
    log = write_log(tmp_path / "log.txt", extra=[("opt_lamb_beta_1", 0.8)])
    r = results(log)["hyperparameters_once"]
    assert not r.ok and "opt_lamb_beta_1 logged 2 times" in r.detail and "0.8" in r.line


def test_samples_not_monotonic(tmp_path):
    def swap(ls):
        i = next(k for k, l in enumerate(ls) if '"eval_accuracy"' in l and '"epoch_num": 300032' in l)
        ls[i] = ls[i].replace("300032", "100000")
        return ls
    log = edit(write_log(tmp_path / "log.txt"), swap)
    res = results(log)
    assert not res["samples_monotonic"].ok and '"epoch_num": 100000' in res["samples_monotonic"].line


def test_cli_exit_status_and_offending_line(tmp_path):
    log = write_log(tmp_path / "log.txt", eval_samples=9999)
    proc = subprocess.run([sys.executable, "-m", "mlperf_bert", "check-log", "--noofficial", str(log)],
                          capture_output=True, text=True)
    assert proc.returncode == 1
    assert "FAIL eval_samples" in proc.stdout and '"value": 9999' in proc.stdout


def test_bad_input_is_one_line_user_error(tmp_path):
    with pytest.raises(UserError, match="no :::MLLOG lines"):
        (tmp_path / "x").write_text("hello\n")
        compliance.read_log(str(tmp_path / "x"))
    log = write_log(tmp_path / "log.txt")
    edit(log, lambda ls: ls[:-1] + [ls[-1][:40]])
    with pytest.raises(UserError, match=r"log.txt:\d+: malformed"):
        compliance.read_log(str(log))
    proc = subprocess.run([sys.executable, "-m", "mlperf_bert", "check-log", str(tmp_path / "nope")],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.startswith("error: cannot read log")


def test_records_are_json_lines_written_by_mllog(tmp_path):
    log = write_log(tmp_path / "log.txt")
    recs = compliance.read_log(str(log))
    first = json.loads(log.read_text().splitlines()[0].split(":::MLLOG", 1)[1])
    assert recs[0].key == first["key"] == "submission_benchmark"


def test_plot_log_draws_the_eval_curve(tmp_path):
    from mlperf_bert.harness import plot
    log = write_log(tmp_path / "log.txt", extra=[("eval_loss", 2.5)])
    recs = compliance.read_log(str(log))
    data = plot.curves(recs)
    assert [v for _, v in data["eval_accuracy"]] == [0.5, 0.6, 0.73]
    assert [s for s, _ in data["eval_accuracy"]] == [150016, 300032, 450048]
    assert "eval_loss" not in data  # logged without a samples position: nothing to plot against
    png = tmp_path / "curve.png"
    proc = subprocess.run([sys.executable, "-m", "mlperf_bert", "plot-log", str(log), "--output=%s" % png],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    empty = edit(write_log(tmp_path / "noeval.txt"), lambda ls: [l for l in ls if "eval_accuracy" not in l])
    with pytest.raises(UserError, match="no eval_accuracy lines"):
        plot.plot_log(str(empty), str(tmp_path / "x.png"))
