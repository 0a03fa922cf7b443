"""Nothing but training on the clock: the warm-up before run_start runs (and with --compile
compiles) every graph of the run on synthetic batches and leaves no trace; the online eval's
micro-batch is the trainer's choice and the metrics do not depend on it; the compile cache of
a series of runs is shared, so later runs start faster."""
import functools
import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

from mlperf_bert import flags
from mlperf_bert.harness.mlperf_log import MLPerfLog
from mlperf_bert.trainer import evaluation, loader, trainer_flags, training, warmup
from mlperf_bert.trainer.config import BertConfig
from mlperf_bert.trainer.run_config import RunConfig
from test_training import ROOT, assert_bit_identical, files, flags_for, one_thread, weights  # noqa: F401
from test_training import _same_log

T, P = 128, 20


def _trainer(files, **kw):  # noqa: F811
    fv = trainer_flags.define_flags()
    argv = flags_for(files, "unused", **{"steps_per_update": 2, **kw})
    flags.parse(fv, argv, required=[])
    config = BertConfig.from_json_file(files["config"], T)
    trainer = training.Trainer(RunConfig.from_flags(fv), config, torch.device("cpu"), 0, 1, seed=3)
    trainer.seed_ranks(11)
    return trainer


def _batches(trainer, packed, n):
    gen = torch.Generator().manual_seed(5)
    return [warmup.synthetic_batch(trainer.model.config, 4, T, P, gen, 3 if packed else None) for _ in range(n)]


def _state(trainer):
    """Everything the warm-up must leave as it found it, for comparison."""
    opt = trainer.optimizer
    return ({k: v.clone() for k, v in trainer.model.state_dict().items()},
            [None if p.grad is None else p.grad.clone() for p in trainer.accumulator.params],
            [(st["step"], st["adam_m"].clone(), st["adam_v"].clone()) for st in opt.state.values()],
            [g["lr"] for g in opt.param_groups], trainer.accumulator.pending,
            None if trainer.accumulator.buffers is None else [b.clone() for b in trainer.accumulator.buffers],
            torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate())


def _equal(a, b):
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if torch.is_tensor(a):
        return torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return np.array_equal(a, b)
    return a == b


@pytest.mark.parametrize("packed, clip_after", [(False, False), (True, True)],
                         ids=["unpacked-clip_each", "packed-clip_after"])
def test_warm_up_mid_accumulation_leaves_no_trace(files, packed, clip_after):  # noqa: F811
    """Warmed up between two micro-steps of an update (buffers, pending gradients, optimizer state
    and learning rate all set): every tensor, counter and RNG stream is as before, and training on
    gives the weights of a trainer that never warmed up, bit for bit."""
    kw = dict(clip_by_global_norm_after_gradient_allreduce=clip_after)
    ref = _trainer(files, **kw)
    batches = _batches(ref, packed, 5)
    for i in range(5):
        ref.step(batches[i], i)
    ref_end = _state(ref)
    warm = _trainer(files, **kw)  # the same RNG streams again
    for i in range(3):  # one update, then half of the next
        warm.step(batches[i], i)
    before = _state(warm)
    assert before[4] == 1 and before[2]  # mid-update, optimizer slots exist
    shape = (4, T, P, 3) if packed else (4, T, P, None)
    warmup.warm_up(warm, shape, (7, T, P))
    assert _equal(_state(warm), before)
    for i in range(3, 5):
        warm.step(batches[i], i)
    assert _equal(_state(warm), ref_end)


def test_eval_metrics_are_the_same_at_any_micro_batch(files):  # noqa: F811
    """Batch 1, the default and an uneven 7 (last batch padded) give the same metrics (1e-6);
    two ranks' shares hold every record once."""
    trainer = _trainer(files, steps_per_update=1)  # an update a batch: learns in fewer batches
    for i, batch in enumerate(loader.PretrainingBatches([files["train"]], T, P, 8, seed=1, max_batches=16)):
        trainer.step(batch, i)  # predicting some masked tokens: accuracy 0 would prove nothing
    got = {}
    for micro in (1, 7, trainer_flags.CPU_MICRO_BATCH):
        eval_set = evaluation.EvalSet([files["eval"]], T, P, micro, 0, 1, torch.device("cpu"), 30522)
        assert {b["input_ids"].shape for b in eval_set} == {(eval_set.micro_batch, T)}  # one shape: one graph
        got[micro] = trainer.evaluate(eval_set)
    assert evaluation.EvalSet([files["eval"]], T, P, 32, 0, 1, "cpu").micro_batch == 20  # 40 in 2 even batches
    base = got[trainer_flags.CPU_MICRO_BATCH]
    assert base["samples"] == 40 and 0 < base["masked_lm_accuracy"] < 1
    for micro, m in got.items():
        assert m["samples"] == 40
        for key in evaluation.EVAL_KEYS:
            assert m[key] == pytest.approx(base[key], abs=1e-6), (micro, key)
    shares = [evaluation.EvalSet([files["eval"]], T, P, 8, r, 2, torch.device("cpu")) for r in (0, 1)]
    rows = [tuple(row.tolist()) for s in shares for b in s for row, w in
            zip(b["input_ids"], b["next_sentence_labels"]) if w >= 0]
    assert len(rows) == 40 == len(set(rows))
    assert sum(trainer.evaluate(s)["samples"] for s in shares) == 40


def test_compiled_run_compiles_everything_before_run_start_and_equals_a_run_without_warm_up(
        files, tmp_path, monkeypatch):  # noqa: F811
    """--compile: every graph exists at run_start (no graph is made on the clock, evals included),
    and the run ends bit-identical to the same run without the warm-up (weights, optimizer, log).
    aot_eager: the graphs are dynamo's whatever the backend; inductor runs in the slow test below."""
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="aot_eager"))
    at_start = []
    real_start = MLPerfLog.start

    def start(self, key, *a, **k):
        if key == "run_start":
            at_start.append(counters["stats"]["unique_graphs"])
        return real_start(self, key, *a, **k)
    monkeypatch.setattr(MLPerfLog, "start", start)
    outs = {}
    for warm in (True, False):
        torch._dynamo.reset()
        counters.clear()
        outs[warm] = str(tmp_path / ("warm" if warm else "cold"))
        assert training.main(flags_for(files, outs[warm], compile=True, warm_up=warm, num_train_steps=8,
                                       save_checkpoints_steps=100, eval_input_file=files["eval"], eval_frequency=12,
                                       eval_micro_batch_size=16, target_mlm_accuracy=1.0, num_workers=0,
                                       log_frequency=2)) == 0
        at_start.append(counters["stats"]["unique_graphs"])
    warm_start, warm_end, cold_start, cold_end = at_start
    assert warm_start == warm_end > 0 and cold_start == 0 and cold_end == warm_end
    assert not counters["graph_break"]
    assert_bit_identical(os.path.join(outs[True], "model.ckpt-8.pt"), os.path.join(outs[False], "model.ckpt-8.pt"))
    _same_log(os.path.join(outs[True], "mlperf.log"), os.path.join(outs[False], "mlperf.log"))


def test_fused_update_without_compile_compiles_the_update_before_run_start(files, tmp_path, monkeypatch):  # noqa: F811
    """Issue 37 (12): --fused_update without --compile compiled the update at the first update after
    run_start, on the clock (55 s against 2 s on this CPU): the warm-up runs for it too. torch.compile
    compiles a function at its first call: each function given to it is first called before
    run_start. (Recorded, not compiled: dynamo's graphs and recompiles are the --compile tests'.)"""
    started, first_calls = [], {}

    def compile(fn=None, **kw):
        def compiled(*a, **k):
            first_calls.setdefault(fn.__name__, bool(started))
            return fn(*a, **k)
        return compiled
    monkeypatch.setattr(torch, "compile", compile)
    real_start = MLPerfLog.start

    def start(self, key, *a, **k):
        if key == "run_start":
            started.append(True)
        return real_start(self, key, *a, **k)
    monkeypatch.setattr(MLPerfLog, "start", start)
    out = str(tmp_path / "fused")
    assert training.main(flags_for(files, out, fused_update=True, num_train_steps=6, save_checkpoints_steps=100,
                                   num_workers=0, log_frequency=2)) == 0
    assert started and len(first_calls) >= 2, first_calls  # the update's functions (absorb, update, ...)
    assert not any(first_calls.values()), "compiled on the clock: %s" % sorted(k for k, v in first_calls.items() if v)


def _log(path):
    return [json.loads(line.split(":::MLLOG ", 1)[1]) for line in open(path) if ":::MLLOG " in line]


# Loaded by each trainer process of the series below (a sitecustomize.py on its PYTHONPATH):
# dynamo's and inductor's own counters at run_start and at the process's end, to
# $MB_COMPILE_PROBE/<pid>.json. Equal counters: no graph was made or compiled on the clock.
# Inductor's C++ codegen is off there: aten calls where its kernels would be (35 of this test's
# 42 s of CPU were their lowering and g++); the graphs, the FX graph cache and the counters are
# inductor's all the same. Its kernels' rounding of our update is
# test_compiled_step.py::test_inductors_kernels_update_as_the_eager_lamb's.
PROBE = """
import atexit, json, os, sys
if os.environ.get("MB_COMPILE_PROBE") and os.path.basename(sys.argv[0]) == "run_pretraining.py":
    import torch._inductor.config
    torch._inductor.config.disable_cpp_codegen = True
    from torch._dynamo.utils import counters
    from mlperf_bert.harness.mlperf_log import MLPerfLog
    seen, real_start = {}, MLPerfLog.start

    def snap():
        return {k: dict(counters[k]) for k in ("stats", "inductor", "aot_autograd", "graph_break")}

    def start(self, key, *a, **k):
        if key == "run_start":
            seen["run_start"] = snap()
        return real_start(self, key, *a, **k)
    MLPerfLog.start = start

    @atexit.register
    def dump():
        seen["end"] = snap()
        with open(os.path.join(os.environ["MB_COMPILE_PROBE"], "%d.json" % os.getpid()), "w") as f:
            json.dump(seen, f)
"""
SERIES_STEPS = 8  # 4 updates: the count is not what is checked (2 evals and 2 train_loss lines as at any count)
# Inductor compiles in the trainer's process (no worker pool to start; its C++ codegen is off, see
# PROBE). Both runs of the series use the same settings, so they share one cache key.
CHEAP_CODEGEN = {"TORCHINDUCTOR_COMPILE_THREADS": "1"}


@pytest.mark.slow
def test_series_of_compiled_runs_shares_the_cache_and_trains_at_full_speed_from_run_start(files, tmp_path):  # noqa: F811
    """start_training.sh NUM_RUNS=2 --compile (inductor), each run with an eval after run_start:
    dynamo's and inductor's counters are the same at run_start and at the end (every graph,
    evals included, made and compiled in init, no graph break: nothing compiles on the clock);
    run 0 compiles from an empty cache, run 1 finds every graph in OUTPUT_DIR/compile_cache (only
    cache hits; its init's length is not compared: a clock on this shared CPU). The compiled run's weights equal an eager run's (1e-4),
    its checkpoint holds the plain module's names. (Counters, not a rate on the clock: a rate on
    this shared CPU swings with the load; one small model; inductor's C++ codegen off, see PROBE.)"""
    out = tmp_path / "series"
    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / "sitecustomize.py").write_text(PROBE)
    common = ["--max_seq_length=%d" % T, "--max_predictions_per_seq=%d" % P, "--train_batch_size=4",
              "--num_train_steps=%d" % SERIES_STEPS, "--log_frequency=%d" % (SERIES_STEPS // 2),
              "--save_checkpoints_steps=1000", "--eval_frequency=%d" % (2 * SERIES_STEPS),
              "--target_mlm_accuracy=1.0", "--num_workers=0", "--noprogress", "--shuffle_buffer=16",
              # one update function (reduce_clip_update) to compile instead of two (absorb and
              # absorb_and_update): clipping each micro-batch is the aot_eager test's above
              "--clip_by_global_norm_after_gradient_allreduce"]
    env = {k: v for k, v in os.environ.items() if k not in ("SEED", "LOGDIR", "DATA_DIR", "TORCHINDUCTOR_CACHE_DIR")}
    env.update(INPUT_FILES=files["train"], EVAL_FILE=files["eval"], BERT_CONFIG=files["config_nodrop"],
               OUTPUT_DIR=str(out), NUM_RUNS="2", SEED="7", PRESET="demo_cpu", CHECK_LOG="0", DROP_CACHES="0",
               PYTHON=sys.executable, OMP_NUM_THREADS="1", PYTHONPATH="%s:%s" % (probe, ROOT),
               MB_COMPILE_PROBE=str(probe), **CHEAP_CODEGEN)
    proc = subprocess.run([os.path.join(ROOT, "start_training.sh")] + common + ["--compile"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=2400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert os.listdir(out / "compile_cache")
    runs = sorted((json.load(open(probe / name)) for name in os.listdir(probe) if name.endswith(".json")),
                  key=lambda seen: seen["run_start"]["inductor"].get("fxgraph_cache_hit", 0))
    assert len(runs) == 2, os.listdir(probe)
    for seen in runs:
        assert seen["run_start"] == seen["end"], seen  # nothing traced or compiled after run_start
        assert seen["end"]["stats"]["unique_graphs"] > 0 and not seen["end"]["graph_break"], seen
    cold, warm = runs[0]["end"]["inductor"], runs[1]["end"]["inductor"]
    assert cold.get("fxgraph_cache_miss", 0) > 0 and not cold.get("fxgraph_cache_hit"), cold
    assert warm.get("fxgraph_cache_hit", 0) > 0 and not warm.get("fxgraph_cache_miss"), warm
    assert runs[0]["end"]["stats"]["unique_graphs"] == runs[1]["end"]["stats"]["unique_graphs"]
    for i in (0, 1):
        recs = _log(out / ("run_%d" % i) / "mlperf.log")
        assert len([r for r in recs if r["key"] == "eval_accuracy"]) >= 1  # an eval on the clock
        assert len([r for r in recs if r["key"] == "train_loss"]) == 2
    # the compiled run against the eager one (seed 7, same flags)
    eager = str(tmp_path / "eager")
    argv = ["run_pretraining.py", "--bert_config_file=" + files["config_nodrop"], "--input_file=" + files["train"],
            "--eval_input_file=" + files["eval"], "--output_dir=" + eager, "--do_train", "--seed=7"] + common
    argv += [a for a in _preset_flags("demo_cpu") if a.split("=")[0] not in {c.split("=")[0] for c in common}]
    assert training.main(argv) == 0
    name = "model.ckpt-%d.pt" % SERIES_STEPS
    (a, _), (b, _) = weights(os.path.join(eager, name)), weights(out / "run_0" / name)
    assert a.keys() == b.keys()
    worst = max((a[k] - b[k]).abs().max().item() for k in a)
    assert worst < 1e-4, worst


def _preset_flags(name):
    """The preset's trainer flags (what train_model.sh passes)."""
    out = subprocess.run(["bash", "-c", "source configs/presets/%s.sh; printf '%%s\\n' \"${PRESET_FLAGS[@]}\"" % name],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return out.split()


# ---------------------------------------------------------------- CUDA graphs (--cuda_graphs)

def _counting_compile(monkeypatch):
    """torch.compile -> the function itself, its calls counted by name (the model: "model",
    then "eval" for the second compile of it)."""
    calls = {}

    def compile(fn=None, **kw):
        name = getattr(fn, "__name__", None) or ("eval" if "model" in calls else "model")
        calls[name] = 0

        def counted(*a, **k):
            calls[name] += 1
            return fn(*a, **k)
        return counted
    monkeypatch.setattr(torch, "compile", compile)
    return calls


@pytest.mark.parametrize("clip_after", [False, True], ids=["clip_each", "clip_after"])
def test_warm_up_calls_every_compiled_function_twice(files, monkeypatch, clip_after):  # noqa: F811
    """Inductor's CUDA-graph trees run a function eagerly on its first call and record it on a
    later one (cudagraph_trees.py): the warm-up calls every compiled function the run uses at
    least twice (the training forward at each micro-step of 2 updates, each update function of
    the clipping mode, the eval forward on 2 batches), so no graph is recorded on the clock."""
    calls = _counting_compile(monkeypatch)
    trainer = _trainer(files, compile=True, clip_by_global_norm_after_gradient_allreduce=clip_after)
    assert set(calls) == {"model", "eval", "absorb", "absorb_and_update", "update", "reduce_clip_update"}
    warmup.warm_up(trainer, (4, T, P, None), (7, T, P))
    used = {"model": 4, "eval": 2}
    used.update({"reduce_clip_update": 2} if clip_after else {"absorb": 2, "absorb_and_update": 2})
    assert {k: v for k, v in calls.items() if v} == used
    assert warmup.ROUNDS == 2


def test_eval_starts_a_graph_step_per_batch_and_keeps_no_output_alive(files, monkeypatch):  # noqa: F811
    """evaluate() marks a CUDA-graph step before each compiled batch, and no output of a batch is
    alive when the next batch runs (else cudagraph trees record a new graph per batch); the eager
    forward (no compiled one) marks nothing."""
    import weakref
    trainer = _trainer(files)
    marks, seen = [0], []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.__setitem__(0, marks[0] + 1))
    alive = [None]

    def compiled(**batch):
        seen.append((marks[0], alive[0] is not None and alive[0]() is not None))
        out = trainer.model(**batch)
        alive[0] = weakref.ref(out.loss)
        return out
    batches = _batches(trainer, False, 3)
    want = evaluation.evaluate(trainer.model, batches, torch.device("cpu"), trainer.autocast)
    assert marks == [0]
    got = evaluation.evaluate(trainer.model, batches, torch.device("cpu"), trainer.autocast, compiled)
    assert seen == [(1, False), (2, False), (3, False)]
    assert got == want


def _static_tensors(trainer):
    """(id, address) of the optimizer slots and accumulation buffers."""
    slots = [st[k] for st in trainer.optimizer.state.values() for k in ("adam_m", "adam_v")]
    return [(id(t), t.data_ptr()) for t in slots + list(trainer.accumulator.buffers or [])]


@pytest.mark.parametrize("at", [0, 3, 4], ids=["before_the_first_update", "mid_update", "at_an_update"])
def test_a_resume_loads_into_the_tensors_the_warm_up_made(files, monkeypatch, at):  # noqa: F811
    """--cuda_graphs (its device refusal lifted; torch.compile the function itself): after the
    warm-up, a resume from a checkpoint taken ``at`` micro-steps into a run copies the optimizer
    slots and accumulation buffers into the tensors the warm-up made (marked static, their
    addresses recorded in the graphs), keeping their identity; trained on, the resumed trainer
    equals the uninterrupted one bit for bit."""
    from mlperf_bert.trainer import checkpoint, levers
    monkeypatch.setattr(torch, "compile", lambda fn=None, **kw: fn)
    monkeypatch.setattr(levers, "check_device", lambda *a: None)
    kw = dict(compile=True, cuda_graphs=True)
    src = _trainer(files, **kw)
    batches = _batches(src, False, 6)
    for i in range(at):
        src.step(batches[i], i)
    ckpt = checkpoint.host_copy({"model": src.model.state_dict(), "optimizer": src.optimizer.state_dict(),
                                 "rank_state": {"accumulator": src.accumulator.state_dict()}})
    rng = checkpoint.rng_state(torch.device("cpu"))
    dst = _trainer(files, **kw)
    warmup.warm_up(dst, (4, T, P, None))
    made = _static_tensors(dst)
    assert len(made) == 3 * len(dst.accumulator.params)  # two slots and a buffer a parameter
    dst.resume(ckpt, "model.ckpt-%d.pt" % at)
    assert _static_tensors(dst) == made
    checkpoint.set_rng_state(rng, torch.device("cpu"))
    for i in range(at, 6):
        dst.step(batches[i], i)
    checkpoint.set_rng_state(rng, torch.device("cpu"))
    for i in range(at, 6):
        src.step(batches[i], i)
    assert _static_tensors(dst) == made
    assert _equal(_state(dst), _state(src))
