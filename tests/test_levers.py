"""The speed levers (trainer/levers.py) compute what the plain step computes. This machine has no
GPU: what each test can and cannot show on a CPU is said in its docstring; none shows a speed.

--fused_update: the update functions it compiles are within rounding of the eager LAMB.
--cuda_graphs: the Trainer's graphed path (inductor skips CUDA graphs on a CPU) trains as the
  compiled step, keeps no gradient of the backward's memory between micro-steps, refuses batches
  of another shape and runs without a GPU only to refuse it.
--fp8: torchao's float8 training on the encoder's dense layers only, checkpoints under the bf16
  model's names; torch._scaled_mm (which runs on this CPU) called with operands CUDA's kernel takes,
  eager and in the compiled graphs (fake tensors); the eval in bf16, equal to the bf16 model's;
  a layer within fp8 tolerance of bf16 and a few updates close to bf16's, for both recipes.
--fused_qkv: the plain model's loss and logits, its gradients within rounding, its training and
  checkpoints, compiled as eager; the casts it saves, counted. --pad_vocab: removed, and says so.
The casts a step makes are counted with CUDA's autocast policy emulated (tests/cuda_autocast.py).
"""
import contextlib
import functools
import json
import os

import pytest
import torch
import torch._dynamo

from mlperf_bert import flags
from mlperf_bert.errors import UserError
from mlperf_bert.trainer import (attention, checkpoint, distributed, flag_checks, levers, run_config, step,
                                 tf_checkpoint, trainer_flags, training)
from mlperf_bert.trainer.config import BertConfig
from mlperf_bert.trainer.run_config import RunConfig
from mlperf_bert.trainer.model import BertForPreTraining

import cuda_autocast
from test_compiled_step import TINY, T, _batch, two_parameter_lamb
from test_training import assert_bit_identical, files, flags_for, one_thread  # noqa: F401 (fixtures)

DROPOUT = dict(TINY, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)


@pytest.fixture(autouse=True)
def compiled(monkeypatch):
    """torch.compile records its options and returns the function as it is: the levers' logic
    runs at eager speed (the compiled step's own equivalence to eager is tests/
    test_compiled_step.py's; dynamo's view of the levers is checked here with explain)."""
    seen = []

    def compile(fn=None, **kw):
        seen.append(kw.get("options"))
        return fn
    monkeypatch.setattr(torch, "compile", compile)
    torch._dynamo.reset()
    yield seen
    torch._dynamo.reset()


def _trainer(tmp_path, *extra, steps_per_update=2, cfg=DROPOUT, dtype="bf16", rank=0, world=1):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(cfg))
    fv = trainer_flags.define_flags()
    flags.parse(fv, ["x", "--bert_config_file=%s" % config, "--input_file=unused", "--output_dir=unused",
                     "--do_train", "--optimizer=lamb", "--learning_rate=1e-2", "--num_train_steps=100",
                     "--num_warmup_steps=10", "--steps_per_update=%d" % steps_per_update, "--dtype=" + dtype]
                + list(extra), required=[])
    cfg = RunConfig.from_flags(fv)
    flag_checks.check_flags(cfg)
    return training.Trainer(cfg, BertConfig.from_json_file(str(config), T), torch.device("cpu"), rank, world, seed=1)


def _train(trainer, batches, steps, after_step=None):
    trainer.seed_ranks(5)
    losses = []
    for i in range(steps):
        loss, _ = trainer.step(batches[i % len(batches)], i)
        losses.append(loss.float().item())
        if after_step:
            after_step(trainer)
    return losses


def _batches(packed=True, n=3):
    gen = torch.Generator().manual_seed(0)
    return [_batch(gen, packed) for _ in range(n)]


def _same_state(a, b):
    sa, sb = a.model.state_dict(), b.model.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k
    oa, ob = a.optimizer.state_dict()["state"], b.optimizer.state_dict()["state"]
    for k in oa:
        for slot in ("adam_m", "adam_v"):
            assert torch.equal(oa[k][slot], ob[k][slot]), (k, slot)


# ---------------------------------------------------------------- compiled

@pytest.mark.slow
def test_fp8_and_fused_qkv_compile_without_graph_breaks(tmp_path):
    """The float8 layers (with --fused_qkv the three q, k, v ones in training) and the stacked weights
    trace into the compiled forward as one graph (dynamo's explain of the training forward)."""
    trainer = _trainer(tmp_path, "--fp8", "--fused_qkv", cfg=dict(TINY, vocab_size=66))
    batch = _batch(torch.Generator().manual_seed(0), True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = torch._dynamo.explain(trainer.model)(**batch)
    assert (out.graph_count, out.graph_break_count) == (1, 0), out.break_reasons


# ---------------------------------------------------------------- --fused_update

@pytest.mark.parametrize("clip_after", [False, True], ids=["clip_each", "clip_after"])
def test_fused_update_equals_the_eager_lamb(tmp_path, compiled, clip_after):
    """--fused_update without --compile: the eager model, the update functions of --compile
    (trainer/step.py) compiled with inductor's combo kernels. Their weights are within two float32
    roundings of the eager optimizer's after 3 updates (at each weight's magnitude, or the
    learning rate's where the weight is smaller; not bit-identical): the
    learning rate is a tensor there (no recompile at each update), so where the eager step adds
    ``-lr * update`` in one rounding (add with alpha) they multiply, then subtract. Inductor's
    own rounding of the compiled update is test_compiled_step.py's (its C++ kernels, 1e-6 against
    eager); combo kernels are a GPU backend's, so a CPU shows no kernel count."""
    batches = _batches(packed=False)
    extra = ["--%sclip_by_global_norm_after_gradient_allreduce" % ("" if clip_after else "no")]
    eager = _trainer(tmp_path, *extra, dtype="fp32")
    assert compiled == []
    fused = _trainer(tmp_path, "--fused_update", *extra, dtype="fp32")
    assert compiled == [{"combo_kernels": True}] * 4  # the four update functions, not the model
    assert isinstance(fused.after_backward.__self__, step.CompiledUpdate)
    le, lf = _train(eager, batches, 6), _train(fused, batches, 6)
    # the first update's micro-steps run on the same weights; after it, the losses are those of
    # weights a rounding apart (an AMD EPYC here gives 4.8509912 against 4.8509908 at step 5)
    assert le[:2] == lf[:2]
    assert lf[2:] == pytest.approx(le[2:], rel=1e-6, abs=0)
    a, b = eager.model.state_dict(), fused.model.state_dict()
    # in float32 spacings (eps) at the weight's magnitude, or the learning rate's for a weight
    # smaller than the step that moved it: an Intel Xeon here differs by one spacing at a
    # LayerNorm gain near 1 (1.2e-7), an AMD EPYC by less than 1e-7 everywhere
    lr = torch.tensor(1e-2)
    spacings = max(((a[k] - b[k]).abs() / torch.maximum(torch.maximum(a[k].abs(), b[k].abs()), lr)).max().item()
                   for k in a) / torch.finfo(torch.float32).eps
    assert 0 < spacings <= 2, spacings  # rounding apart, as said


# ---------------------------------------------------------------- --cuda_graphs

def test_cuda_graphs_needs_compile_and_refuses_a_cpu_or_ranks_in_one_line(files, tmp_path):
    with pytest.raises(UserError, match="--cuda_graphs replays the compiled step: add --compile") as e:
        training.main(flags_for(files, str(tmp_path / "a"), cuda_graphs=True))
    assert "\n" not in str(e.value)
    with pytest.raises(UserError, match=r"--cuda_graphs needs a CUDA device \(this run is on cpu\): drop") as e:
        training.main(flags_for(files, str(tmp_path / "b"), cuda_graphs=True, compile=True, num_workers=0))
    assert "\n" not in str(e.value)
    fv = trainer_flags.define_flags()
    flags.parse(fv, ["x", "--cuda_graphs", "--compile", "--clip_by_global_norm_after_gradient_allreduce"],
                required=[])
    with pytest.raises(UserError, match=r"--cuda_graphs on several ranks \(this run has 2\) needs per-replica "
                                        r"clipping: with --clip_by_global_norm_after_gradient_allreduce DDP "
                                        r"all-reduces from hooks inside the backward, which CUDA graphs cannot "
                                        r"capture: drop one of the two flags") as e:
        levers.check_device(RunConfig.from_flags(fv), torch.device("cuda", 0), 2)
    assert "\n" not in str(e.value)
    levers.check_device(RunConfig.from_flags(fv), torch.device("cuda", 0), 1)  # one GPU: DDP is not used
    fv.clip_by_global_norm_after_gradient_allreduce = False
    levers.check_device(RunConfig.from_flags(fv), torch.device("cuda", 0), 8)  # per-replica clipping: the all-reduce between graphs


def test_a_compile_cache_on_a_noexec_mount_is_one_line_before_the_compile(tmp_path, monkeypatch):
    """A hostile sweep with /tmp mounted noexec (docker's --tmpfs /tmp, a hardened host): --compile
    compiled for a minute, then inductor could not load its kernels: torch's traceback, exit 1. Now
    refused with the levers, naming TORCHINDUCTOR_CACHE_DIR; a run that compiles nothing is not."""
    statvfs = os.statvfs
    monkeypatch.setattr(os, "statvfs", lambda p: os.statvfs_result(
        statvfs(p)[:8] + (statvfs(p).f_flag | os.ST_NOEXEC, statvfs(p).f_namemax)))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "new" / "cache"))  # (made by the compile)
    for lever in ("--compile", "--fused_update"):
        fv = trainer_flags.define_flags()
        flags.parse(fv, ["x", lever], required=[])
        with pytest.raises(UserError) as e:
            levers.refuse(RunConfig.from_flags(fv), torch.device("cpu"), 1)
        assert str(e.value).startswith("torch.compile's cache (--compile) would be in %s (TORCHINDUCTOR_CACHE_DIR), "
                                       "on a file system mounted noexec" % (tmp_path / "new" / "cache"))
        assert "set TORCHINDUCTOR_CACHE_DIR to a folder" in str(e.value) and "\n" not in str(e.value)
    fv = trainer_flags.define_flags()
    flags.parse(fv, ["x"], required=[])
    levers.refuse(RunConfig.from_flags(fv), torch.device("cpu"), 1)


def test_tritons_own_cache_on_a_noexec_mount_is_refused_on_cuda_alone(tmp_path, monkeypatch):
    """On CUDA Triton builds its launchers' shared objects in TRITON_CACHE_DIR and loads them (inductor
    points it at its own cache's triton/ only where it is unset: torch/_inductor/runtime/
    triton_heuristics.py); a TRITON_CACHE_DIR on a noexec mount passed the check. A CPU run does not
    use it."""
    statvfs, noexec = os.statvfs, str(tmp_path / "noexec")
    monkeypatch.setattr(os, "statvfs", lambda p: os.statvfs_result(
        statvfs(p)[:8] + (statvfs(p).f_flag | (os.ST_NOEXEC if str(p).startswith(noexec) else 0),
                          statvfs(p).f_namemax)))
    os.mkdir(noexec)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TRITON_CACHE_DIR", os.path.join(noexec, "triton"))
    fv = trainer_flags.define_flags()
    flags.parse(fv, ["x", "--compile"], required=[])
    levers.refuse(RunConfig.from_flags(fv), torch.device("cpu"), 1)
    with pytest.raises(UserError) as e:
        levers.refuse(RunConfig.from_flags(fv), torch.device("cuda", 0), 1)
    assert str(e.value) == (
        "torch.compile's cache (--compile) would be in %s/triton (TRITON_CACHE_DIR), on a file system mounted noexec,"
        " where inductor cannot load the kernels it builds: set TRITON_CACHE_DIR to a folder on one that allows running"
        " programs (or unset it: inductor's cache holds Triton's then), or mount it with exec" % noexec)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    levers.refuse(RunConfig.from_flags(fv), torch.device("cuda", 0), 1)


def test_lever_refusals_of_the_device_and_ranks_come_before_torch_or_the_inputs(files, tmp_path):
    """A hostile sweep: --device=cpu --cuda_graphs passed the trainer's start (flag_checks.read_flags)
    and the launchers' checks (launch_figures: train_model.sh, a series' check before run 0), and so did
    --cuda_graphs with clipping after the all-reduce on 2 ranks and --device=cuda --fp8 with a rank's
    tokens no multiple of 16: each was refused by every rank's Trainer only, after torch, the ranks'
    meeting and the inputs' checks. Now the flags' refusal before torch, the launchers' with their ranks,
    and the trainer's before it reads any input (--device=auto resolved to this CPU)."""
    base = flags_for(files, str(tmp_path / "a"), compile=True, cuda_graphs=True)
    with pytest.raises(UserError, match=r"^--cuda_graphs needs a CUDA device \(this run is on cpu\): drop"):
        flag_checks.read_flags(base + ["--device=cpu"])
    argv = base[1:] + ["--device=cuda", "--clip_by_global_norm_after_gradient_allreduce"]
    with pytest.raises(UserError, match=r"^--cuda_graphs on several ranks \(this run has 2\) needs per-replica"):
        flag_checks.launch_figures(argv, ranks=2)
    assert flag_checks.launch_figures(argv, ranks=1)[:2] == [4, 2]
    fp8 = base[1:3] + ["--do_train", "--fp8", "--dtype=bf16", "--train_batch_size=6", "--max_seq_length=20"]
    with pytest.raises(UserError, match=r"^--fp8 multiplies each rank's 60 tokens a micro-step"):
        flag_checks.launch_figures(fp8 + ["--device=cuda"], ranks=2)
    flag_checks.launch_figures(fp8, ranks=2)  # auto: maybe this CPU, whose kernel takes any
    with pytest.raises(UserError, match=r"^--cuda_graphs needs a CUDA device \(this run is on cpu\)") as e:
        training.main(base + ["--input_file=%s" % (tmp_path / "absent.tfrecord")])  # not its "not found"
    assert "\n" not in str(e.value)


def test_fp8_widths_of_the_bert_config_are_refused_before_torch_or_the_inputs(tmp_path):
    """A review: --fp8 with a config whose hidden_size or intermediate_size is no multiple of 16 was
    refused by the Trainer's enable_fp8 only, after torch, the ranks' meeting and the inputs' checks.
    Now by the trainer's start (read_flags, with the flags' refusals) and start_training.sh's check
    (launch_figures), naming the config; a config not there is left to the launcher's own line."""
    config = tmp_path / "odd.json"
    config.write_text(json.dumps(dict(TINY, intermediate_size=24)))
    argv = ["--bert_config_file=%s" % config, "--input_file=%s" % (tmp_path / "absent"), "--output_dir=%s" % tmp_path,
            "--do_train", "--fp8", "--dtype=bf16", "--train_batch_size=4"]
    line = ("--fp8 multiplies matrices whose sizes are multiples of 16, and BERT config %s has intermediate_size 24: "
            "give a config whose widths are multiples of 16, or drop --fp8" % config)
    with pytest.raises(UserError) as e:
        flag_checks.read_flags(["run_pretraining.py"] + argv)
    assert str(e.value) == line
    with pytest.raises(UserError) as e:
        flag_checks.launch_figures(argv, check=True)
    assert str(e.value) == line
    flag_checks.launch_figures(argv[:-3] + ["--train_batch_size=4"], check=True)  # no --fp8: any width
    flag_checks.launch_figures(["--bert_config_file=%s" % (tmp_path / "gone.json")] + argv[1:], check=True)


def test_levers_with_do_eval_alone_are_refused_in_one_line(files, tmp_path):
    """A hostile sweep: --do_eval alone (run_eval_only) evaluates the plain model eagerly, and took
    --compile, --fused_qkv, --fp8, even --cuda_graphs --device=cpu, printed its metrics and ended 0
    with none applied. Refused as its ignored --eval_input_file is."""
    argv = flags_for(files, str(tmp_path / "e"), do_train=False, do_eval=True, init_checkpoint="x.pt")
    flag_checks.read_flags(argv + ["--nocompile", "--nofused_qkv"])
    with pytest.raises(UserError) as e:
        flag_checks.read_flags(argv + ["--compile", "--cuda_graphs", "--fused_qkv", "--device=cpu"])
    assert str(e.value) == ("--do_eval alone evaluates the plain model, eagerly; --compile, --cuda_graphs, --fused_qkv "
                            "(the training step's) would be ignored: drop them")
    with pytest.raises(UserError, match=r"; --fp8 \(the training step's\) would be ignored: drop it$"):
        flag_checks.read_flags(argv + ["--fp8", "--dtype=bf16"])


def test_fp8_is_refused_where_a_ranks_tokens_are_no_multiple_of_16(monkeypatch):
    """CUDA's _scaled_mm wants the inner dimension of each float8 GEMM a multiple of 16; the weight
    gradient's (grad_out^T @ input) is a rank's tokens a micro-step, which --fp8 did not check (a
    helper's review: at batch 1, seq 20 the six weight-gradient GEMMs of the tiny model break the rule,
    which the CPU kernel does not check). Refused on CUDA before anything is built; not on the CPU."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    fv = trainer_flags.define_flags()
    flags.parse(fv, ["x", "--fp8", "--dtype=bf16", "--train_batch_size=6", "--max_seq_length=20"], required=[])
    cfg = RunConfig.from_flags(fv)
    with pytest.raises(UserError) as e:
        levers.check_device(cfg, torch.device("cuda", 0), 2)
    assert str(e.value) == ("--fp8 multiplies each rank's 60 tokens a micro-step (--train_batch_size=6 over 2 ranks x "
                            "--max_seq_length=20) in float8 GEMMs that need a multiple of 16: give a batch or sequence "
                            "length that makes one, or drop --fp8")
    levers.check_device(cfg, torch.device("cpu"), 2)  # the CPU kernel takes any
    fv.train_batch_size = 8  # 4 rows x 20 = 80 tokens a rank
    levers.check_device(RunConfig.from_flags(fv), torch.device("cuda", 0), 2)


def test_a_removed_lever_says_it_was_removed_and_why_in_one_line():
    """An old command line with --bf16_weights (removed in issue 36.3) is told so, not absl's
    "Did you mean: lamb_weight_decay_rate?"; every spelling, every command (flags.REMOVED_FLAGS)."""
    for arg in ("--bf16_weights", "--bf16_weights=true", "--nobf16_weights"):
        with pytest.raises(UserError, match=r"^flag --bf16_weights was removed \(issue 36.3\): .*--fused_qkv") as e:
            flags.parse(trainer_flags.define_flags(), ["run_pretraining.py", "--dtype=bf16", arg], required=[])
        assert "\n" not in str(e.value) and "Did you mean" not in str(e.value)
    # after "--" it is a positional, not a flag
    assert flags.parse(trainer_flags.define_flags(), ["x", "--", "--bf16_weights"], required=[]) == ["--bf16_weights"]


def test_pad_vocab_is_removed_and_an_old_command_line_is_told_why():
    """Issue 46.7: --pad_vocab measured 0.91x eager and 1.01x compiled at 2 layers on an H100, and
    inductor pads matrix shapes itself: removed. Every spelling is one line saying so (the
    measurement and what to do), every command; no lever, identity entry or model attribute is left."""
    for arg in ("--pad_vocab", "--pad_vocab=true", "--nopad_vocab"):
        with pytest.raises(UserError, match=r"^flag --pad_vocab was removed \(issue 46.7\): .*0.91x eager and "
                                            r"1.01x compiled.*; drop it$") as e:
            flags.parse(trainer_flags.define_flags(), ["run_pretraining.py", "--compile", arg], required=[])
        assert "\n" not in str(e.value)
    assert "pad_vocab" not in trainer_flags.LEVERS and "pad_vocab" not in run_config.RUN_FLAGS
    assert not hasattr(BertForPreTraining, "vocab_pad") and not hasattr(levers, "enable_pad_vocab")


def _scribble_graph_outputs(trainer):
    """What the next CUDA-graph replay does to the last one's outputs: overwrite them. Any
    gradient still held between micro-steps that is not the update's own buffer is NaN'd."""
    kept = {id(s) for s in getattr(trainer.after_backward.__self__, "_sums", None) or []}
    for p in trainer.model.parameters():
        if p.grad is not None and id(p.grad) not in kept:
            p.grad.fill_(float("nan"))


@pytest.mark.parametrize("packed, clip_after", [(True, True), (False, False)],
                         ids=["packed-clip_after", "unpacked-clip_each"])
def test_cuda_graphs_path_trains_as_the_compiled_step(tmp_path, monkeypatch, compiled, packed, clip_after):
    """The graphed path on this CPU (its device refusal lifted; inductor would skip CUDA graphs
    on a CPU): torch.compile is asked for CUDA graphs for the model and the update, the state the update mutates is marked static, and 3 updates of 2
    micro-steps equal the compiled step's bit for bit even when every backward output still
    held between micro-steps is overwritten, as the next replay would (the accumulated
    gradients live in buffers of the update's own). What a CPU cannot show: the capture, the
    replay, inductor's reasons for skipping a graph, and the speed."""
    monkeypatch.setattr(levers, "check_device", lambda *a: None)
    batches = _batches(packed)
    extra = ["--compile", "--%sclip_by_global_norm_after_gradient_allreduce" % ("" if clip_after else "no")]
    plain = _trainer(tmp_path, *extra)
    del compiled[:]
    graphed = _trainer(tmp_path, "--cuda_graphs", *extra)
    assert compiled == [{"triton.cudagraphs": True}] * 6  # forward, eval, the four update functions
    want = _train(plain, batches, 6)
    assert _train(graphed, batches, 6, after_step=_scribble_graph_outputs) == want
    _same_state(plain, graphed)
    upd = graphed.after_backward.__self__
    slots = [s for st in graphed.optimizer.state.values() for s in (st["adam_m"], st["adam_v"])]
    bias = [c for pair in upd._bias.values() for c in pair]  # LAMB's bias corrections
    assert bias and all(getattr(t, "_dynamo_static_input_type", None) for t in slots + [upd.lr] + bias)
    other = dict(batches[0], input_ids=batches[0]["input_ids"][:, :-1])
    with pytest.raises(UserError, match=r"--cuda_graphs replays batches of one shape: this batch has "
                                        r"input_ids \[4, 31\], the first input_ids \[4, 32\]; drop --cuda_graphs"):
        graphed.step(other, 6)


def _graphed_on_two_ranks(rank, world, tmp):
    """In a spawned rank: the compiled step and its --cuda_graphs path, per-replica clipping, each
    rank its own batches -> [(losses, weights)] of each."""
    import pathlib
    from mlperf_bert.trainer import distributed
    torch.compile = lambda fn=None, **kw: fn  # noqa: E731 (as the fixture; this process ends after)
    levers.check_device = lambda *a: None
    distributed.setup("cpu")
    gen = torch.Generator().manual_seed(rank)
    batches = [_batch(gen, False) for _ in range(3)]
    out = []
    for graphed in (False, True):
        d = pathlib.Path(tmp) / ("r%d%s" % (rank, "g" * graphed))
        d.mkdir()
        t = _trainer(d, "--compile", *(["--cuda_graphs"] if graphed else []), rank=rank, world=world)
        assert isinstance(t.accumulator.exchange, distributed.GradientExchange) and t.ddp is None
        losses = _train(t, batches, 6, after_step=_scribble_graph_outputs if graphed else None)
        out.append((losses, {k: v.clone() for k, v in t.model.state_dict().items()}))
    distributed.teardown()
    return out


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """One 2-rank launch for this file's 2-rank tests (each spawned rank pays torch's import):
    the --cuda_graphs path, then DDP's buckets."""
    from test_host_syncs import free_ports, run_pieces, run_ranks
    tmp = str(tmp_path_factory.mktemp("two_ranks"))
    pieces = [("graphed", _graphed_on_two_ranks, (tmp,)), ("ddp", _ddp_on_two_ranks, (tmp,))]
    return run_ranks(run_pieces, free_ports(len(pieces)), pieces, tmp=tmp, timeout=480)


@pytest.mark.slow
def test_cuda_graphs_on_two_ranks_trains_as_the_compiled_step(two_ranks):
    """2 gloo ranks, per-replica clipping (the all-reduce of the clipped sums runs after the
    backward, between the graphs): the graphed path (device refusal lifted, torch.compile the
    function itself, every gradient still held between micro-steps overwritten as a replay
    would) equals the compiled step bit for bit on each rank over 3 updates of 2 micro-steps;
    the ranks saw other batches and hold the same weights (the all-reduce ran)."""
    from test_host_syncs import piece
    ranks = piece(two_ranks, "graphed")
    for (plain, plain_w), (graphed, graphed_w) in ranks:
        assert graphed == plain
        assert all(torch.equal(plain_w[k], graphed_w[k]) for k in plain_w)
    (loss0, w0), (loss1, w1) = ranks[0][0], ranks[1][0]
    assert loss0 != loss1 and all(torch.equal(w0[k], w1[k]) for k in w0)


def _ddp_on_two_ranks(rank, world, tmp):
    """In a spawned rank, clipping after the reduction (DDP), fp32, eager and compiled update:
    per steps_per_update (1, 2), the Trainer's DDP options and what its gradients are, and the
    weights after 3 updates with them and with DDP's defaults (gradients dropped after each
    update); then DDP's static graph with no_sync, which this torch gets wrong."""
    import pathlib
    from mlperf_bert.trainer import distributed
    torch.compile = lambda fn=None, **kw: fn  # noqa: E731
    distributed.setup("cpu")
    gen = torch.Generator().manual_seed(rank)
    batches = [_batch(gen, False) for _ in range(3)]
    out, mine = {}, levers.ddp_options
    for n in (1, 2):
        for compiled in (False, True):
            runs = {}
            for options in ("trainer", "defaults"):
                levers.ddp_options = mine if options == "trainer" else (lambda n: {})
                d = pathlib.Path(tmp) / ("r%d-%d-%d-%s" % (rank, n, compiled, options))
                d.mkdir()
                t = _trainer(d, "--clip_by_global_norm_after_gradient_allreduce", *(["--compile"] * compiled),
                             steps_per_update=n, dtype="fp32", rank=rank, world=world)
                if options == "defaults":
                    t.accumulator.keep_grads = False
                ptrs = []
                _train(t, batches, 5 * n, after_step=lambda t: ptrs.append([
                    None if p.grad is None else p.grad.data_ptr() for p in t.model.parameters()]))
                views = {None if p.grad is None or p.grad._base is None else p.grad._base.data_ptr()
                         for p in t.model.parameters()}
                runs[options] = (t.ddp.gradient_as_bucket_view, t.ddp.static_graph, ptrs[n - 1::n], views,
                                 {k: v.clone() for k, v in t.model.state_dict().items()})
            out[n, compiled] = runs
    levers.ddp_options = lambda n: {"gradient_as_bucket_view": True, "static_graph": True}
    d = pathlib.Path(tmp) / ("r%d-static" % rank)
    d.mkdir()
    t = _trainer(d, "--clip_by_global_norm_after_gradient_allreduce", dtype="fp32", rank=rank, world=world)
    try:
        _train(t, batches, 10)
        out["static_no_sync"] = {k: v.clone() for k, v in t.model.state_dict().items()}
    except RuntimeError as e:
        out["static_no_sync"] = str(e).splitlines()[0]
    distributed.teardown(clean=False)
    return out


@pytest.mark.slow
def test_ddp_keeps_gradients_in_its_buckets_and_computes_what_it_did(two_ranks):
    """--clip_by_global_norm_after_gradient_allreduce on 2 gloo ranks: DDP runs with
    gradient_as_bucket_view (static_graph only at one micro-step an update); the gradients are
    views of DDP's flat buckets, zeroed in place after each update, not dropped and made again,
    at the same addresses from the third update on (DDP moves them when it rebuilds its
    buckets); the weights after 5 updates equal those of DDP's defaults bit for bit, eager and
    with the compiled update, with and without accumulation (no_sync), on both ranks.
    DDP's static graph with no_sync either fails or stops reducing on this torch
    (pytorch/pytorch#187732): when this assertion fails, torch has fixed it, and static_graph can
    be turned on with accumulation too (levers.ddp_options)."""
    from test_host_syncs import piece
    ranks = piece(two_ranks, "ddp")
    for out in ranks:
        for (n, compiled), runs in ((k, v) for k, v in out.items() if k != "static_no_sync"):
            view, static, ptrs, views, w = runs["trainer"]
            assert (view, static) == (True, n == 1)
            assert runs["defaults"][:2] == (False, False)
            # views of a few flat buckets, at the same addresses once DDP has rebuilt its buckets
            # (in the warm-up's updates in a run)
            assert None not in views and len(views) <= 2, (n, compiled, views)
            assert all(p is not None for p in ptrs[0]) and ptrs[2] == ptrs[3] == ptrs[4], (
                n, compiled, [sum(a != b for a, b in zip(x, ptrs[-1])) for x in ptrs])
            assert all(p is None for x in runs["defaults"][2] for p in x)  # dropped at each update
            dw = runs["defaults"][4]
            assert all(torch.equal(w[k], dw[k]) for k in w), (n, compiled)
    w0, w1 = ranks[0][1, False]["trainer"][4], ranks[1][1, False]["trainer"][4]
    assert all(torch.equal(w0[k], w1[k]) for k in w0)
    reduced = ranks[0][2, False]["trainer"][4]
    static = [out["static_no_sync"] for out in ranks]
    assert any(isinstance(s, str) for s in static) or not all(
        torch.equal(s[k], reduced[k]) for s in static for k in reduced), static


def test_scribbling_catches_a_gradient_held_between_micro_steps(tmp_path):
    """Control: the compiled step without --cuda_graphs keeps its summed gradients in the
    backward's output (p.grad) between micro-steps; overwriting them as a replay would ruins it."""
    batches = _batches()
    extra = ["--compile", "--clip_by_global_norm_after_gradient_allreduce"]
    want = _train(_trainer(tmp_path, *extra), batches, 6)
    got = _train(_trainer(tmp_path, *extra), batches, 6, after_step=_scribble_graph_outputs)
    assert got != want


# ---------------------------------------------------------------- --fp8

REAL_COMPILE = torch.compile  # the autouse fixture replaces torch.compile; the graph tests need it
ENCODER_DENSE = {"bert.encoder.layer.0." + s for s in ("attention.self.query", "attention.self.key",
                                                       "attention.self.value", "attention.output.dense",
                                                       "intermediate.dense", "output.dense")}
FP8_CFG = dict(TINY, intermediate_size=32)


def cuda_scaled_mm_faults(a, b, scale_a, scale_b, bias=None, out_dtype=None, **_):
    """What CUDA's torch._scaled_mm (aten/src/ATen/native/cuda/ScaledBlas.cpp, cuBLASLt) would
    refuse in these operands, which the CPU kernel does not check: float8 matrices, a row-major
    and b column-major, every size a multiple of 16, not both e5m2; tensorwise scales one fp32
    each, rowwise scales fp32 (M, 1) and (1, N) with unit inner stride; a bias only in bf16 and not
    with fp32 output. Works on real and fake tensors (shapes, strides and dtypes only)."""
    faults = []
    f8 = (torch.float8_e4m3fn, torch.float8_e5m2)
    if a.dim() != 2 or b.dim() != 2 or a.dtype not in f8 or b.dtype not in f8:
        faults.append("operands not 2-d float8: %s %s" % (a.dtype, b.dtype))
    if a.dtype == b.dtype == torch.float8_e5m2:
        faults.append("both e5m2")
    if a.stride(1) != 1:
        faults.append("a not row-major: stride %s" % (a.stride(),))
    if b.stride(0) != 1:
        faults.append("b not column-major: stride %s" % (b.stride(),))
    if a.shape[1] % 16 or b.shape[0] % 16 or b.shape[1] % 16:
        faults.append("sizes %s x %s not multiples of 16" % (tuple(a.shape), tuple(b.shape)))
    tensorwise = scale_a.numel() == 1 and scale_b.numel() == 1
    rowwise = (tuple(scale_a.shape) == (a.shape[0], 1) and tuple(scale_b.shape) == (1, b.shape[1])
               and (scale_a.shape[1] == 1 or scale_a.stride(1) == 1) and scale_b.stride(1) == 1)
    if not (tensorwise or rowwise) or scale_a.dtype != torch.float32 or scale_b.dtype != torch.float32:
        faults.append("scales %s %s / %s %s" % (tuple(scale_a.shape), scale_a.dtype,
                                                tuple(scale_b.shape), scale_b.dtype))
    if bias is not None and (out_dtype == torch.float32 or bias.dtype != torch.bfloat16):
        faults.append("bias %s with output %s" % (bias.dtype, out_dtype))
    return faults


@pytest.fixture
def scaled_mm_calls(monkeypatch):
    """The operands of every eager torch._scaled_mm call (torchao calls it by that name)."""
    calls, real = [], torch._scaled_mm

    def recorded(a, b, scale_a, scale_b, **kw):
        calls.append(dict(a=a, b=b, scale_a=scale_a, scale_b=scale_b, **kw))
        return real(a, b, scale_a, scale_b, **kw)
    monkeypatch.setattr(torch, "_scaled_mm", recorded)
    return calls


def _fp8_model(recipe, cfg=FP8_CFG):
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig(**cfg))
    levers.enable_fp8(model, recipe)
    return model


@pytest.mark.parametrize("recipe", trainer_flags.RECIPES)
def test_fp8_is_torchaos_float8_training_on_the_encoders_dense_layers_only(recipe):
    """Each of the encoder's six dense layers, and nothing else (not the embeddings, the pooler,
    the MLM transform or decoder, the NSP head), gets torchao's Float8Linear with the recipe's
    config, on the layer's own Parameters; the model's modules, parameters and state_dict names
    are the bf16 model's, so checkpoints load either way (strict)."""
    from torchao.float8 import Float8LinearConfig
    torch.manual_seed(0)
    plain = BertForPreTraining(BertConfig(**FP8_CFG))
    model = _fp8_model(recipe)
    twins = {n: m.fp8 for n, m in model.named_modules() if getattr(m, "fp8", None) is not None}
    assert twins.keys() == ENCODER_DENSE
    want = Float8LinearConfig.from_recipe_name(recipe)
    for name, twin in twins.items():
        layer = model.get_submodule(name)
        assert type(twin).__name__ == "Float8Linear" and type(twin).__module__.startswith("torchao.float8")
        assert twin.weight is layer.weight and twin.bias is layer.bias and twin.config == want
    assert [n for n, _ in model.named_modules()] == [n for n, _ in plain.named_modules()]
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in plain.named_parameters()]
    state = model.state_dict()
    assert list(state) == list(plain.state_dict())
    plain.load_state_dict(state, strict=True)
    assert all(torch.equal(plain.state_dict()[k], v) for k, v in state.items())
    other = BertForPreTraining(BertConfig(**FP8_CFG)).state_dict()
    model.load_state_dict(other, strict=True)  # in place: the twins read what was loaded
    assert all(torch.equal(twins[n].weight, other[n + ".weight"]) for n in twins)


@pytest.mark.parametrize("recipe", trainer_flags.RECIPES)
def test_fp8_trains_in_float8_within_cudas_rules_and_evaluates_in_bf16(recipe, scaled_mm_calls):
    """A training micro-step multiplies each dense layer in float8 three times (output, input
    gradient, weight gradient: 18 torch._scaled_mm calls, each with operands CUDA's kernel takes,
    fast accumulation on the output); the eval (evaluation.evaluate, bf16 autocast) makes no
    float8 call and its metrics equal the bf16 model's with the same weights, exactly."""
    from mlperf_bert.trainer import evaluation
    autocast = lambda: torch.autocast("cpu", dtype=torch.bfloat16)  # noqa: E731
    model = _fp8_model(recipe)
    batch = _batch(torch.Generator().manual_seed(0), True)
    with autocast():
        loss = model(**batch).loss
    loss.backward()
    assert len(scaled_mm_calls) == 3 * len(ENCODER_DENSE)
    assert [c for c in scaled_mm_calls if cuda_scaled_mm_faults(**c)] == []
    assert sum(c["use_fast_accum"] for c in scaled_mm_calls) == len(ENCODER_DENSE)  # the forward's
    del scaled_mm_calls[:]
    got = evaluation.evaluate(model, [batch], torch.device("cpu"), autocast)
    assert scaled_mm_calls == [] and model.training
    plain = BertForPreTraining(BertConfig(**FP8_CFG))
    plain.load_state_dict(model.state_dict())
    assert got == evaluation.evaluate(plain, [batch], torch.device("cpu"), autocast)


@pytest.mark.parametrize("recipe", trainer_flags.RECIPES)
def test_fp8_with_fused_qkv_is_one_float8_gemm_over_the_stacked_weights(recipe, scaled_mm_calls):
    """Issue 46.3: with --fused_qkv, --fp8 trained the three float8 layers of q, k and v (three
    casts of one input, three GEMMs of N = h). Now a micro-step makes one float8 GEMM of N = 3h in
    the forward and one for each gradient, each with operands CUDA's kernel takes: 3 x 4 calls a
    layer, not 3 x 6. Against the bf16 model's, the loss and the q, k, v weights' gradients are as
    close as the three float8 layers' (row-wise: the same scales, the same numbers; tensor-wise:
    one scale for the stacked weight and its output's gradient, at most 1.25x the distance)."""
    batch = _batch(torch.Generator().manual_seed(0), True)
    runs = {}
    for fp8, fused in ((False, False), (True, False), (True, True)):
        torch.manual_seed(0)
        model = BertForPreTraining(BertConfig(**FP8_CFG))
        if fp8:
            levers.enable_fp8(model, recipe)
        if fused:
            levers.enable_fused_qkv(model)
        del scaled_mm_calls[:]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(**batch).loss
        loss.backward()
        qkv = model.bert.encoder.layer[0].attention.self
        runs[fp8, fused] = (loss.item(), [qkv.get_submodule(n).weight.grad for n in ("query", "key", "value")],
                            list(scaled_mm_calls))
    (lb, gb, _), (l3, g3, calls3), (l1, g1, calls1) = runs[False, False], runs[True, False], runs[True, True]
    layers, h = FP8_CFG["num_hidden_layers"], FP8_CFG["hidden_size"]
    assert len(calls3) == 3 * len(ENCODER_DENSE) and len(calls1) == 3 * (len(ENCODER_DENSE) - 2 * layers)
    assert [c for c in calls1 if cuda_scaled_mm_faults(**c)] == []
    forward_n = [c["b"].shape[1] for c in calls1 if c["use_fast_accum"]]
    assert sorted(forward_n) == sorted([3 * h, h, FP8_CFG["intermediate_size"], h] * layers)  # q, k, v stacked
    assert abs(l1 - lb) <= 1.25 * abs(l3 - lb) + 1e-6 * abs(lb)
    for name, b, three, one in zip(("query", "key", "value"), gb, g3, g1):
        far, near = (one - b).norm().item(), (three - b).norm().item()
        if recipe == "rowwise":
            torch.testing.assert_close(one, three, rtol=1e-5, atol=1e-6 * b.norm().item(), msg=name)
        assert 0 < far <= 1.25 * near, (name, far, near)


def test_fp8_with_fp32_is_refused_in_one_line(tmp_path):
    """Issue 46.3: float8's GEMM outputs the layer's input dtype; with --dtype=fp32 that is fp32,
    which CUDA's row-wise kernel refuses on every GPU but sm90 (a CPU runs it): refused at the
    start, for both recipes."""
    for recipe in trainer_flags.RECIPES:
        with pytest.raises(UserError, match=r"^--fp8 multiplies in float8 under bf16 autocast \(row-wise scaling "
                                            r"needs a bf16 output on every GPU but sm90\): add --dtype=bf16, or "
                                            r"drop --fp8$"):
            _trainer(tmp_path, "--fp8", "--fp8_recipe=" + recipe, cfg=FP8_CFG, dtype="fp32")
    _trainer(tmp_path, "--fp8", cfg=FP8_CFG, dtype="bf16")


def _scaled_mm_graphs(fn, *args, **kwargs):
    """The aten graphs (forward, backward) that torch.compile with aot_autograd makes of ``fn``,
    run eagerly (aot_eager): [[faults of each _scaled_mm, from its fake operands]] a graph."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    graphs = []

    def inspect(gm, _):
        found = []
        for node in gm.graph.find_nodes(op="call_function", target=torch.ops.aten._scaled_mm.default):
            val = lambda x: x.meta["val"] if isinstance(x, torch.fx.Node) else x  # noqa: E731
            a, b, sa, sb = (val(x) for x in node.args[:4])
            rest = dict(zip(("bias", "scale_result", "out_dtype", "use_fast_accum"), node.args[4:]),
                        **node.kwargs)
            found.append(cuda_scaled_mm_faults(a, b, sa, sb, val(rest.get("bias")), rest.get("out_dtype")))
        graphs.append(found)
        return make_boxed_func(gm.forward)
    torch._dynamo.reset()
    out = REAL_COMPILE(fn, backend=aot_autograd(fw_compiler=inspect, bw_compiler=inspect))(*args, **kwargs)
    return out, graphs


@pytest.mark.slow  # dynamo traces torchao's tensor subclass: 30-40 s a recipe on this machine
@pytest.mark.parametrize("recipe", trainer_flags.RECIPES)
def test_fp8_compiles_with_operands_cudas_scaled_mm_takes_and_eval_compiles_without(recipe):
    """torch.compile (dynamo and aot_autograd, as --compile traces before inductor) of the
    training forward and backward: 6 float8 matmuls in the forward graph and 12 in the backward's,
    each with operands CUDA's kernel takes, checked on the graph's fake tensors (the CPU kernel
    does not check the layout). The compiled eval forward has no float8 matmul. Inductor, which
    lays out the operands in the end, is not run here."""
    model = _fp8_model(recipe)
    batch = _batch(torch.Generator().manual_seed(0), True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, graphs = _scaled_mm_graphs(model, **batch)
    out.loss.backward()
    assert [len(g) for g in graphs] == [6, 12] and all(f == [] for g in graphs for f in g), graphs
    model.eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        _, graphs = _scaled_mm_graphs(model, **batch)
    assert graphs == [[]]
    torch._dynamo.reset()


@pytest.mark.parametrize("recipe", trainer_flags.RECIPES)
def test_fp8_layer_is_within_fp8_tolerance_of_bf16(recipe):
    """One dense layer under bf16 autocast, its float8 twin against bf16: output within 6% (norm),
    input and weight gradients within 10%, bias gradient within 1%; the gradients reach the fp32
    parameters in fp32."""
    from mlperf_bert.trainer.model import Linear
    gen = torch.Generator().manual_seed(2)
    x, gy = torch.randn(128, 64, generator=gen), torch.randn(128, 32, generator=gen).to(torch.bfloat16)
    runs = []
    for fp8 in (False, True):
        torch.manual_seed(3)
        layer = Linear(64, 32)
        if fp8:
            float8 = levers._torchao_float8()
            object.__setattr__(layer, "fp8", float8.convert_to_float8_training(
                layer, config=float8.Float8LinearConfig.from_recipe_name(recipe)))
        xs = x.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = layer(xs)
        y.backward(gy)
        runs.append((y, xs.grad, layer.weight.grad, layer.bias.grad))
    rel = lambda a, b: ((a.float() - b.float()).norm() / b.float().norm()).item()  # noqa: E731
    (y, gx, gw, gb), (y8, gx8, gw8, gb8) = runs
    assert gx8.dtype == gw8.dtype == gb8.dtype == torch.float32
    assert 0 < rel(y8, y) < 0.06
    assert 0 < rel(gx8, gx) < 0.1 and 0 < rel(gw8, gw) < 0.1 and rel(gb8, gb) < 0.01


@pytest.mark.parametrize("recipe", trainer_flags.RECIPES)
def test_fp8_trains_close_to_bf16(tmp_path, recipe):
    """--fp8 through the Trainer, 3 updates of 2 micro-steps: the losses within 0.1% of bf16's;
    each weight's change within 15% of bf16's (norm of the difference over the norm of bf16's
    change), all weights' within 5%. The key bias is left out of the first: its gradient is zero
    but for rounding (softmax does not see it), so its LAMB update is rounding noise's direction in
    either run. Convergence to the target is a GPU run's to show (an RCP run before a closed
    submission)."""
    cfg = dict(TINY, hidden_size=32, num_attention_heads=2, intermediate_size=64)
    batches = _batches()
    plain, fp8 = _trainer(tmp_path, cfg=cfg), _trainer(tmp_path, "--fp8", "--fp8_recipe=" + recipe, cfg=cfg)
    assert {n for n, m in fp8.model.named_modules() if getattr(m, "fp8", None) is not None} == ENCODER_DENSE
    w0 = {k: v.clone() for k, v in plain.model.state_dict().items()}
    la, lb = _train(plain, batches, 6), _train(fp8, batches, 6)
    assert la != lb and all(abs(a - b) < 1e-3 * a for a, b in zip(la, lb)), (la, lb)
    a, b = plain.model.state_dict(), fp8.model.state_dict()
    moved = [k for k in a if (a[k] - w0[k]).any()]
    rel = {k: ((b[k] - a[k]).norm() / (a[k] - w0[k]).norm()).item() for k in moved}
    assert max(v for k, v in rel.items() if not k.endswith("key.bias")) < 0.15, rel
    total = sum(((b[k] - a[k]) ** 2).sum() for k in moved) / sum(((a[k] - w0[k]) ** 2).sum() for k in moved)
    assert 0 < total.sqrt().item() < 0.05


def test_fp8_refuses_sizes_its_matmul_cannot_take(tmp_path):
    with pytest.raises(UserError, match=r"--fp8 multiplies matrices whose sizes are multiples of 16; this config "
                                        r"has a 24x16 dense layer: drop --fp8"):
        _trainer(tmp_path, "--fp8", cfg=dict(TINY, intermediate_size=24))


def test_fp8_recipe_without_fp8_and_fp8_without_torchao_are_refused(tmp_path, monkeypatch):
    with pytest.raises(UserError, match=r"^--fp8_recipe=rowwise chooses the recipe of --fp8: add --fp8, or drop "
                                        r"--fp8_recipe$"):
        _trainer(tmp_path, "--fp8_recipe=rowwise")
    monkeypatch.setitem(__import__("sys").modules, "torchao.float8", None)  # as if not installed
    with pytest.raises(UserError, match=r"^--fp8 runs on torchao's float8 training, which does not import here "
                                        r"\(.*\): install requirements.txt \(it pins torchao\), or drop --fp8$"):
        _trainer(tmp_path, "--fp8", cfg=FP8_CFG)


def test_a_run_resumed_with_fp8_or_fused_update_switched_is_refused(tmp_path):
    """--fp8, its --fp8_recipe and --fused_update (issue 37 (8)) change the arithmetic: a
    checkpoint's run and its resume must agree on them (every flag:
    test_training.py::test_every_trainer_flag_...)."""
    def identity(*extra):
        return _trainer(tmp_path, *extra).cfg.identity(1, [], [])
    saved = identity()
    for lever in ("fp8", "fused_update"):
        with pytest.raises(UserError, match=r"--%s=True differs from the run being resumed in out \(it has False\)"
                           % lever):
            checkpoint.check_same_run(saved, identity("--" + lever), "out/model.ckpt-2.pt")
    with pytest.raises(UserError, match=r"--fp8_recipe=rowwise differs from the run being resumed in out "
                                        r"\(it has tensorwise\)"):
        checkpoint.check_same_run(identity("--fp8"), identity("--fp8", "--fp8_recipe=rowwise"),
                                  "out/model.ckpt-2.pt")


# ---------------------------------------------------------------- --fused_qkv

def _grads(cfg, batch, ctx, fused=False):
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig(**cfg))
    if fused:
        assert len(levers.enable_fused_qkv(model)) == cfg["num_hidden_layers"]
    with ctx():
        out, (mlm_logits, nsp_logits) = model(**batch, return_logits=True)
    out.loss.backward()
    return model, out, mlm_logits, {n: p.grad for n, p in model.named_parameters()}


CONTEXTS = {"fp32": contextlib.nullcontext, "bf16_cuda_policy": cuda_autocast.cuda_policy}
VARLEN = dict(TINY, vocab_size=66, num_hidden_layers=2)


@pytest.mark.parametrize("dtype", CONTEXTS)
@pytest.mark.parametrize("rows", ["unpacked", "packed", "packed_varlen"])
def test_fused_qkv_equals_the_three_gemms(monkeypatch, rows, dtype):
    """One GEMM over the stacked weights: the loss and logits equal the three GEMMs' and every
    gradient is within rounding of theirs (the input's gradient is summed in another order: one
    GEMM over 3h where three are added), in fp32 and in bf16 under CUDA's autocast policy,
    unpacked, packed (dense mask) and packed through the variable-length kernel's path (its
    reference, which runs here). The parameters and their names are the plain model's."""
    if rows == "packed_varlen":
        monkeypatch.setattr(attention, "varlen_kernel", lambda device, dt, head_dim: attention.reference_varlen)
    batch = _batch(torch.Generator().manual_seed(0), rows != "unpacked")
    (m0, out0, logits0, g0), (m1, out1, logits1, g1) = (
        _grads(VARLEN, batch, CONTEXTS[dtype], fused=f) for f in (False, True))
    assert m0.state_dict().keys() == m1.state_dict().keys()
    assert torch.equal(out0.loss, out1.loss) and torch.equal(logits0, logits1)
    scale = max(g.abs().max().item() for g in g0.values())
    # fp32: summation order; bf16: the input's gradient rounded to bf16 once, not three times
    rtol, atol = (1e-5, 1e-6) if dtype == "fp32" else (2 ** -7, 1e-5)
    for n in g0:  # atol: the key bias's gradient is rounding noise on zero (softmax does not see it)
        torch.testing.assert_close(g1[n], g0[n], rtol=rtol, atol=atol * scale, msg=n)
    assert any(not torch.equal(g0[n], g1[n]) for n in g0)  # the GEMMs did differ: one ran, not three


def test_fused_qkv_trains_and_checkpoints_as_the_plain_step(tmp_path):
    """3 updates of 2 micro-steps, dropout on, packed rows, bf16, --compile's update functions:
    the losses and the checkpoint's weights and LAMB slots equal the plain step's within fp32
    rounding, under the same names and shapes, so either run's checkpoint (and its TF export) is
    the other's."""
    cfg, lever = dict(DROPOUT, vocab_size=66), "fused_qkv"
    batches = _batches()
    extra = ["--compile", "--clip_by_global_norm_after_gradient_allreduce"]
    plain, other = _trainer(tmp_path, *extra, cfg=cfg), _trainer(tmp_path, "--" + lever, *extra, cfg=cfg)
    la, lb = _train(plain, batches, 6), _train(other, batches, 6)
    paths = []
    for name, trainer in (("plain", plain), (lever, other)):
        paths.append(str(tmp_path / ("%s.pt" % name)))
        trainer.save(paths[-1], {}, final=True)
        trainer.flush()
    a, b = plain.model.state_dict(), other.model.state_dict()
    assert [(k, v.shape) for k, v in a.items()] == [(k, v.shape) for k, v in b.items()]
    assert list(tf_checkpoint.to_tf_arrays(a)) == list(tf_checkpoint.to_tf_arrays(b))
    assert la == pytest.approx(lb, rel=1e-5)
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-4, atol=1e-6, msg=k)


@pytest.mark.slow
def test_fused_qkv_compiles_as_eager(tmp_path, monkeypatch):
    """torch.compile (aot_eager: dynamo's graph and AOTAutograd's backward, no codegen) of the
    model with --fused_qkv gives the loss and gradients of eager's (one graph with no break:
    test_fp8_and_fused_qkv_compile_without_graph_breaks)."""
    monkeypatch.undo()  # the real torch.compile (the fixture's stand-in returns the function)
    cfg = dict(TINY, vocab_size=66)
    batch = _batch(torch.Generator().manual_seed(0), True)
    runs = []
    for compiled in (False, True):
        torch.manual_seed(0)
        model = BertForPreTraining(BertConfig(**cfg))
        levers.enable_fused_qkv(model)
        fn = torch.compile(model, backend="aot_eager", dynamic=False) if compiled else model
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = fn(**batch).loss
        loss.backward()
        runs.append((loss, [p.grad for p in model.parameters()]))
    (l0, g0), (l1, g1) = runs
    assert torch.equal(l0, l1)
    for a, b in zip(g0, g1):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-7)


def test_a_run_resumed_with_fused_qkv_switched_is_refused(tmp_path):
    """A GEMM of another shape may take another GPU kernel, which rounds otherwise: the lever is a
    defining flag of a run."""
    def identity(*extra):
        return _trainer(tmp_path, *extra).cfg.identity(1, [], [])
    saved = identity()
    for lever in ("fused_qkv",):
        with pytest.raises(UserError, match=r"--%s=True differs from the run being resumed in out \(it has "
                                            r"False\)" % lever):
            checkpoint.check_same_run(saved, identity("--" + lever), "out/model.ckpt-2.pt")


def test_levers_lists_every_lever_flag():
    """trainer_flags.LEVERS (what bench/ tries) is every bool flag define_lever_flags defines, each off by default."""
    fv = flags.FlagValues()
    trainer_flags.define_lever_flags(fv)
    names = [n for n in fv if isinstance(fv[n].value, bool)]  # --fp8_recipe: a setting of --fp8
    assert sorted(trainer_flags.LEVERS) == sorted(names)
    assert all(fv[n].value is False for n in trainer_flags.LEVERS)


def test_casts_per_update_with_cudas_autocast_policy():
    """Issue 36.3, counted (tests/cuda_autocast.py: CUDA's fp32 LayerNorm emulated, attention one
    op as on CUDA), at 1 and 4 micro-steps. Autocast casts each weight once a forward (its cache:
    the backward reuses the cast) and each weight's gradient back once a backward: a copy of the
    weights kept in bf16 (the removed --bf16_weights) could only save the forward's, and adds as
    many in its refresh after each update: nothing at one micro-step, 3 of 4 forwards' at four.
    The activation casts are LayerNorm's fp32 output cast again for each GEMM that reads it:
    --fused_qkv casts it once for q, k and v where autocast casts it three times, 2 casts fewer a
    layer in the forward and 2 in the backward (their gradients)."""
    cfg, layers = BertConfig(**VARLEN), VARLEN["num_hidden_layers"]
    batch = _batch(torch.Generator().manual_seed(0), True)

    def count(steps, fused=False):
        torch.manual_seed(0)
        model = BertForPreTraining(cfg)
        if fused:
            levers.enable_fused_qkv(model)
        c = cuda_autocast.count_casts(model, batch, steps)
        assert not c.activation_shapes & c.shapes  # weight and activation casts told apart
        return c.count, model

    for steps in (1, 4):
        (plain, model), (fused, _) = count(steps), count(steps, fused=True)
        # every parameter but the position and token type tables (looked up in fp32) and the MLM
        # bias (added in fp32 under CUDA's policy); the word embeddings once, for the decoder
        cast = [n for n, _ in model.named_parameters() if "LayerNorm" not in n and n.split(".")[-1] not in (
            "position_embeddings", "token_type_embeddings", "output_bias") or n == "cls.seq_relationship.output_bias"]
        assert plain["forward", "weight"] == plain["backward", "weight"] == steps * len(cast)
        for phase in ("forward", "backward"):
            assert plain[phase, "activation"] > 0
            assert fused[phase, "activation"] == plain[phase, "activation"] - 2 * layers * steps
            assert fused[phase, "weight"] == plain[phase, "weight"]


@pytest.mark.slow
def test_fused_qkv_models_save_and_load_reference_tf_checkpoints(tmp_path):
    """A model with --fused_qkv writes a TF checkpoint under the reference's names and shapes
    (query, key and value kernels [h, h] apart), which a plain model loads to the same weights, and
    loads a plain model's TF checkpoint back (tensorflow I/O)."""
    cfg = BertConfig(**dict(TINY, vocab_size=66))
    torch.manual_seed(0)
    lever, plain = BertForPreTraining(cfg), BertForPreTraining(cfg)
    levers.enable_fused_qkv(lever)
    prefix = str(tmp_path / "lever")
    tf_checkpoint.save_tf_checkpoint(lever, prefix)
    saved = tf_checkpoint.LazyCheckpoint(prefix)
    for name in ("query", "key", "value"):
        assert saved.shapes["bert/encoder/layer_0/attention/self/%s/kernel" % name] == [16, 16]
    assert saved.shapes["bert/embeddings/word_embeddings"] == [66, 16]
    tf_checkpoint.load_init_checkpoint(plain, prefix)
    assert all(torch.equal(a, b) for a, b in zip(lever.state_dict().values(), plain.state_dict().values()))
    with torch.no_grad():
        for p in plain.parameters():
            p.add_(1.0)
    tf_checkpoint.save_tf_checkpoint(plain, str(tmp_path / "plain"))
    tf_checkpoint.load_init_checkpoint(lever, str(tmp_path / "plain"))
    assert all(torch.equal(a, b) for a, b in zip(lever.state_dict().values(), plain.state_dict().values()))


# ---------------------------------------------------------------- --cuda_graphs: inductor's mutation rule

def _inductors_mutation_check(name, seen):
    """A torch.compile backend: dynamo and AOTAutograd as inductor runs them (inference graphs keep
    their input mutations, as inductor's do), then inductor's own check of each graph it would
    replay as a CUDA graph: cudagraph_utils.check_for_mutation_ignore_cuda_graph_managed_tensor
    with the static inputs inductor takes (compile_fx.get_static_input_idxs: parameters and
    tensors marked with mark_static_address). The cudagraph trees' check at replay also lets a
    function mutate the live outputs of an earlier graph; this one does not, so it is the
    stricter. Records (name, graph, mutated input indices, skip reason or None) in ``seen``."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func
    from torch._inductor import cudagraph_utils
    from torch._inductor.compile_fx import get_static_input_idxs
    from torch.utils._ordered_set import OrderedSet

    def check(graph):
        def compiler(gm, example_inputs):
            inputs = list(gm.graph.find_nodes(op="placeholder"))
            mutated = OrderedSet(i for i, node in enumerate(inputs) if any(
                isinstance(use.target, torch._ops.OpOverload) and any(
                    a.alias_info is not None and a.alias_info.is_write and use.args[j] is node
                    for j, a in enumerate(use.target._schema.arguments[:len(use.args)]))
                for use in node.users))
            with torch._inductor.config.patch({"triton.cudagraph_trees": True}):
                reason = cudagraph_utils.check_for_mutation_ignore_cuda_graph_managed_tensor(
                    gm, OrderedSet(inputs[i].name for i in mutated), mutated,
                    get_static_input_idxs(len(example_inputs)))
            seen.append((name, graph, list(mutated), reason))
            return make_boxed_func(gm.forward)
        return compiler
    return aot_autograd(fw_compiler=check("forward"), bw_compiler=check("backward"),
                        keep_inference_input_mutations=True)


def _graphed_update(n, clip_after, compile):
    """A --cuda_graphs CompiledUpdate (trainer/step.py) over a two-parameter model, as the trainer
    builds it: LAMB with a weight-decayed and an excluded group, the accumulator, ``compile``."""
    model, acc = two_parameter_lamb(n, clip_after)
    return model, step.CompiledUpdate(acc, compile, graphed=True)


def test_cuda_graphs_functions_mutate_only_static_inputs_by_inductors_rule(tmp_path, monkeypatch):
    """Every function --cuda_graphs compiles mutates no input that inductor does not take as
    static, by inductor's own check on the graphs dynamo and AOTAutograd give it: else inductor
    skips its CUDA graph ("skipping cudagraphs due to mutated inputs", as the first H100 run found
    for the update, which clipped the backward's gradients in place: this test fails on that
    code, on its 30 gradients). The Trainer's graphed path once (the model's forward and backward,
    the update of n = 1); then trainer/step.py's update functions as CompiledUpdate calls them,
    over a two-parameter model (cheap to trace), for per-replica clipping and clipping after the
    reduction, with and without accumulation (n = 1, 2), per-replica also with an all-reduce
    between the graphs (one rank's mean, in place: the compiled ``absorb`` and ``update`` run).
    Each update is also checked to mutate something (the parameters), so a check that sees no
    mutation cannot pass it."""
    monkeypatch.setattr(levers, "check_device", lambda *a: None)
    seen, backends = [], {}

    def compile(fn=None, **kw):
        assert kw.get("options", {}).get("triton.cudagraphs") is True
        name = getattr(fn, "__name__", "model")  # the model: its training forward and its eval's
        backend = backends.setdefault(name, _inductors_mutation_check(name, seen))
        return REAL_COMPILE(fn, backend=backend, dynamic=False)
    monkeypatch.setattr(torch, "compile", compile)
    torch._dynamo.reset()
    try:
        t = _trainer(tmp_path, "--compile", "--cuda_graphs", steps_per_update=1, dtype="fp32")
        _train(t, _batches(packed=False, n=1), 1)
        for clip_after, n, allreduce in [(False, 1, False), (False, 2, False), (False, 1, True), (False, 2, True),
                                         (True, 1, False), (True, 2, False)]:
            model, upd = _graphed_update(n, clip_after, functools.partial(compile, **levers.compile_options(
                t.cfg.levers, update=True)))
            if allreduce:
                upd.acc.exchange = distributed.GradientExchange(upd.acc.params)  # the mean of one rank
            for i in range(2 * n):  # two updates
                for p in model.parameters():
                    g = torch.randn_like(p)
                    p.grad = g if p.grad is None else p.grad.add_(g)  # as autograd accumulates
                assert upd.after_backward(i) == ((i + 1) % n == 0)
    finally:
        torch._dynamo.reset()
    names = sorted({(name, graph) for name, graph, _, _ in seen})
    assert names == [("absorb", "forward"), ("absorb_and_update", "forward"), ("model", "backward"),
                     ("model", "forward"), ("reduce_clip_update", "forward"), ("update", "forward")], names
    assert [s for s in seen if s[3] is not None] == []
    assert all(mutated for name, _, mutated, _ in seen if name not in ("absorb", "model"))
