"""The memory plan (trainer/memory_plan.py) against an H100's measured peaks, and what it sets."""
import dataclasses
import os
import re

import pytest

from mlperf_bert.trainer import memory_plan

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GIB = 2 ** 30

# Measured on one H100 80GB HBM3, torch 2.11 + CUDA 13, main at f830396, BERT-Large, seq 512,
# bf16 autocast, LAMB, the trainer's eager step (torch.cuda.max_memory_allocated), on packed
# rows of our s512 records from tests/data's golden input (issue 30, filed 2026-11-26).
H100_PACKED_EAGER = {24: 17.0, 48: 29.7, 64: 38.0, 96: 54.8, 128: 71.6}
H100_PACKED_COMPILED = {96: 53.9}  # the torch.compile'd model
# Unpacked, batch 24: 20.7 GiB, measured by bench/train_throughput.py --compare_packed, which
# builds Hugging Face's BertForPreTraining in the same process before timing (its parameters and,
# after its first round, its AdamW slots: 3 x 4 bytes a parameter, counted by
# max_memory_allocated beside ours). That run's packed peak was the same 20.7 GiB.
H100_UNPACKED_WITH_HF_RESIDENT = {24: 20.7}


@pytest.fixture(scope="module")
def traced():
    """memory_plan.trace, each (config, batch, ...) traced once for this module: the bilinear test's
    plan and ``plans`` trace the same 1- and 2-layer steps."""
    done, trace = {}, memory_plan.trace
    patch = pytest.MonkeyPatch()

    def once(config, *args, **kwargs):
        key = (repr(config), args, tuple(sorted(kwargs.items())))
        if key not in done:
            done[key] = trace(config, *args, **kwargs)
        return dict(done[key])
    patch.setattr(memory_plan, "trace", once)
    yield done
    patch.undo()


@pytest.fixture(scope="module")
def plans(traced):
    return {packed: memory_plan.bert_large_plan(packed) for packed in (True, False)}


def within(planned, measured, tol=0.10):
    return abs(planned - measured) <= tol * measured


def test_the_plan_predicts_the_h100s_measured_peaks_within_10_percent(plans):
    for b, gib in H100_PACKED_EAGER.items():
        assert within(plans[True].peak(b) / GIB, gib), (b, plans[True].peak(b) / GIB, gib)
    for b, gib in H100_PACKED_COMPILED.items():
        assert within(plans[True].peak(b) / GIB, gib)
    hf_resident = 12 * plans[False].n  # HF's model has our parameters (tied embeddings), +0.3%
    for b, gib in H100_UNPACKED_WITH_HF_RESIDENT.items():
        assert within((plans[False].peak(b) + hf_resident) / GIB, gib)
    # GiB a row: the H100's slope over batch 24..128, 0.525
    slope = (H100_PACKED_EAGER[128] - H100_PACKED_EAGER[24]) / (128 - 24)
    assert within(plans[True].per_row / GIB, slope)


def test_the_cpu_policy_and_math_attention_were_the_3_4x(plans):
    """What made the earlier plan 1.76 GiB a row: CPU attention keeps the [heads, t, t] probabilities."""
    from mlperf_bert.trainer.config import BertConfig
    cfg = dataclasses.replace(BertConfig.from_json_file(memory_plan.CONFIG, 512), num_hidden_layers=1)

    def per_row(policy):
        t = {b: memory_plan.trace(cfg, b, 512, 76, "bf16", packed=False, policy=policy)["Total"] for b in (2, 4)}
        return (t[4] - t[2]) / 2
    # one layer and the heads, unpacked: the CPU trace keeps over 2.5 times the GPU's a row
    assert per_row("cpu") > 2.5 * per_row("cuda")


def test_the_bilinear_extrapolation_equals_a_deeper_trace(plans, traced):
    from mlperf_bert.trainer.config import BertConfig
    cfg = dataclasses.replace(BertConfig.from_json_file(memory_plan.CONFIG, 512), num_hidden_layers=5)
    before = len(traced)
    plan = memory_plan.Plan(cfg, 512, 76)
    assert len(traced) == before  # its four traces are the packed plan's
    deeper = memory_plan.trace(cfg, 12, 512, 76)["Total"]
    assert abs(plan.fixed + 12 * plan.per_row - deeper) < 1e-3 * deeper


def test_max_per_gpu_batch_is_the_plans_with_its_margin_and_the_launchers_use_it(plans):
    """MAX_PER_GPU_BATCH, recomputed: the largest batch (packed or not, with accumulation and
    DDP's buckets) whose planned peak, plus fragmentation's share of it and the margin for what
    the plan leaves out, fits the card; one more row does not. (129, the number before the
    margin, planned 77.7 GiB with nothing beside it on a 79.6 GiB card.) train_model.sh reads the
    number from memory_plan.py (its only definition), and rcp.py defaults to it."""
    m = memory_plan
    assert m.MAX_PER_GPU_BATCH == plans[True].largest_batch() == plans[False].largest_batch()
    beside = sum(m.margin().values())

    def needs(b):
        return plans[True].peak(b, accum=2, ddp=True) * (1 + m.FRAGMENTATION) + beside
    assert needs(m.MAX_PER_GPU_BATCH) <= m.CARD < needs(m.MAX_PER_GPU_BATCH + 1)
    assert needs(129) > m.CARD
    assert m.BUDGET == m.budget_for(m.CARD, 512, 76) and plans[True].peak(m.MAX_PER_GPU_BATCH, 2, True) <= m.BUDGET
    # the margin names what the issue lists, each a positive size, the eval set as the loader gives it
    assert set(m.margin()) == {"CUDA context", "cuBLAS workspaces", "NCCL buffers", "CUDA-graph pools",
                               "eval set on the device"} and min(m.margin().values()) > 0
    row = m.fake_batch(1, 512, 76, packed=False)
    assert m.eval_set_bytes() == 10000 * sum(t.numel() * t.element_size() for t in row.values())
    with open(os.path.join(ROOT, "train_model.sh")) as f:
        assert not re.search(r"\b%d\b" % m.MAX_PER_GPU_BATCH, f.read())  # no copy of the number
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != "MAX_PER_GPU_BATCH"}
    proc = subprocess.run([os.path.join(ROOT, "train_model.sh"), "--help"], capture_output=True, text=True,
                          env=dict(env, PYTHON=sys.executable))
    assert proc.returncode == 0 and "by MAX_PER_GPU_BATCH=%d)" % m.MAX_PER_GPU_BATCH in proc.stdout, proc.stderr
    from mlperf_bert.harness import rcp
    import inspect
    assert inspect.signature(rcp.preset_flags).parameters["max_per_gpu"].default == m.MAX_PER_GPU_BATCH
    for doc in ("running.md", "training.md"):
        with open(os.path.join(ROOT, "docs", doc)) as f:
            quoted = set(re.findall(r"`MAX_PER_GPU_BATCH` \((\d+)", f.read()))
        assert quoted == {str(m.MAX_PER_GPU_BATCH)}, doc


def test_the_plan_reads_the_cards_memory_and_counts_the_graph_pools_for_cuda_graphs(plans, monkeypatch, capsys):
    """Issue 46.6: the plan took every card for an 80 GB H100 and counted the CUDA-graph pools in
    every run. Now it reads the card's memory (torch.cuda.get_device_properties, faked here: this
    machine has no GPU), counts the pools only with --cuda_graphs, and MAX_PER_GPU_BATCH stays the
    80 GB H100's with the pools (the presets', on every card)."""
    import types
    import torch
    m, plan = memory_plan, plans[True]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert m.card_bytes() == m.CARD
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    h200 = 143771 * 2 ** 20  # nvidia-smi's MiB of a 141 GB H200
    asked = []
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda d: asked.append(d) or types.SimpleNamespace(total_memory=h200))
    assert m.card_bytes(torch.device("cuda", 3)) == h200 and asked == [torch.device("cuda", 3)]
    pools = m.MARGIN["CUDA-graph pools"]
    assert set(m.margin()) - set(m.margin(cuda_graphs=False)) == {"CUDA-graph pools"}
    assert m.budget_for(h200, cuda_graphs=False) - m.budget_for(h200) == pytest.approx(pools / (1 + m.FRAGMENTATION))
    assert m.MAX_PER_GPU_BATCH == plan.largest_batch() == plan.largest_batch(card=m.CARD, cuda_graphs=True)
    assert plan.largest_batch(card=m.CARD, cuda_graphs=False) > m.MAX_PER_GPU_BATCH
    big = plan.largest_batch(card=h200)
    assert plan.peak(big, 2, True) <= m.budget_for(h200) < plan.peak(big + 1, 2, True) and big > 1.8 * m.MAX_PER_GPU_BATCH
    assert m.main(["memory_plan", "--nocuda_graphs"]) == 0  # this "machine's" card
    out = capsys.readouterr().out
    assert "on a card of 140.4 GiB" in out and "CUDA-graph pools   " not in out  # not a margin line
    assert "| packed | 0.549 | 4.38 | %d / %d |" % (plan.largest_batch(accum=1, ddp=False, card=h200, cuda_graphs=False),
                                                   plan.largest_batch(card=h200, cuda_graphs=False)) in out


@pytest.mark.parametrize("flag,message", [
    ("--max_seq_length=0", r"^--max_seq_length=0 is too small: it must be at least 5"),  # an IndexError
    ("--max_seq_length=-1", r"^--max_seq_length=-1 is too small"),  # "negative dimension"
    ("--max_predictions_per_seq=-1", r"^--max_predictions_per_seq=-1 is below 0 for --max_seq_length=512"),
    ("--max_predictions_per_seq=%d" % 2 ** 63, r"^--max_predictions_per_seq=9223372036854775808 is too large"),
    ("--card_gib=inf", r"^--card_gib must be a number >= 0 \(the card's memory in GiB; 0: this machine's\), got inf$"),
    # read as 0 (this machine's card), unsaid
    ("--card_gib=nan", r"^--card_gib must be a number >= 0 .*got nan$"),
    ("--card_gib=-1", r"^--card_gib must be a number >= 0 .*got -1.0$"),
])
def test_a_hostile_flag_value_is_one_line_before_any_plan(flag, message, capsys):
    """A hostile sweep of the flags' values: each was a traceback from the fake tensors, or a card
    below 0 silently taken for this machine's; now the one line of the data commands' check_shape."""
    from mlperf_bert.errors import UserError
    with pytest.raises(UserError, match=message):
        memory_plan.main(["memory_plan", flag])
    assert capsys.readouterr().out == ""


def test_training_md_states_the_margin_as_the_code_has_it():
    """docs/training.md's margin table: each term with its GiB, fragmentation's share, the card."""
    m = memory_plan
    with open(os.path.join(ROOT, "docs", "training.md"), encoding="utf-8") as f:
        rows = {tuple(c.strip() for c in line.strip("|\n").split("|")) for line in f if line.startswith("| ")}
    for what, size in m.margin().items():
        assert (what, "%.2f" % (size / GIB)) in rows, what
    assert ("allocator fragmentation", "%d %% of the planned peak" % round(100 * m.FRAGMENTATION)) in rows
    assert ("card (80 GB H100)", "%.1f" % (m.CARD / GIB)) in rows


def _launch(tmp_path, script, **env):
    """Run ``script`` with stand-ins that write the allocator setting the trainer gets: PYTHON
    (train_model.sh runs the trainer with it; other calls go to the real interpreter) and
    TRAIN_MODEL (what start_training.sh runs)."""
    import subprocess
    import sys
    seen = tmp_path / "alloc.txt"
    write = 'echo "${PYTORCH_CUDA_ALLOC_CONF-unset}" > %s; exit 0' % seen
    python, trainer = tmp_path / "python", tmp_path / "trainer.sh"
    python.write_text('#!/usr/bin/env bash\n[[ "$1" == */run_pretraining.py ]] && { %s; }\nexec %s "$@"\n'
                      % (write, sys.executable))
    trainer.write_text("#!/usr/bin/env bash\n%s\n" % write)
    for f in (python, trainer):
        f.chmod(0o755)
    if seen.exists():
        seen.unlink()
    for name in ("part-00000", "eval_10k"):  # the files train_model.sh looks for before it runs the trainer
        (tmp_path / name).touch()
    base = {k: v for k, v in os.environ.items() if k not in (
        "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PRESET", "NUM_GPUS", "NUM_RUNS", "INIT_CHECKPOINT",
        "DRY_RUN", "MAX_PER_GPU_BATCH")}
    base.update(DATA_DIR=str(tmp_path), OUTPUT_DIR=str(tmp_path / "out"), PYTHON=str(python), NUM_GPUS="1",
                CHECK_LOG="0", DROP_CACHES="0", TRAIN_MODEL=str(trainer), **env)
    proc = subprocess.run([os.path.join(ROOT, script), "--preset=demo_cpu"], capture_output=True, text=True,
                          env=base, cwd=str(tmp_path), timeout=120)
    return proc, (seen.read_text().strip() if seen.exists() else None)


def test_the_launchers_set_expandable_segments_unless_the_user_did(tmp_path):
    """train_model.sh runs the trainer with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True and its
    dry run says so; a setting of the user's (either name) is left as it is. start_training.sh
    sets it too, for a TRAIN_MODEL of one's own."""
    import subprocess
    import sys
    proc, seen = _launch(tmp_path, "train_model.sh")
    assert proc.returncode == 0 and seen == "expandable_segments:True", proc.stderr
    proc, seen = _launch(tmp_path, "train_model.sh", PYTORCH_CUDA_ALLOC_CONF="max_split_size_mb:512")
    assert seen == "max_split_size_mb:512"
    proc, seen = _launch(tmp_path, "train_model.sh", PYTORCH_ALLOC_CONF="expandable_segments:False")
    assert seen == "unset"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")}
    for extra, shown in (({}, True), ({"PYTORCH_CUDA_ALLOC_CONF": "x"}, False), ({"PYTORCH_ALLOC_CONF": "x"}, False)):
        dry = subprocess.run([os.path.join(ROOT, "train_model.sh"), "--dry_run"], capture_output=True, text=True,
                             env=dict(env, DATA_DIR="/d", PYTHON=sys.executable, **extra))
        assert dry.returncode == 0, dry.stderr
        lines = dry.stdout.splitlines()
        assert (lines[0] == "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True") == shown, lines
        assert "run_pretraining.py" in lines[-1]
    # start_training.sh, with the stand-in as its TRAIN_MODEL
    proc, seen = _launch(tmp_path, "start_training.sh")
    assert seen == "expandable_segments:True", proc.stdout + proc.stderr
    proc, seen = _launch(tmp_path, "start_training.sh", PYTORCH_ALLOC_CONF="x")
    assert seen == "unset", proc.stdout + proc.stderr


# ---------------------------------------------------------------- what a start holds outside the step

SMALL = dict(vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
             max_position_embeddings=64)


class _NewTensors:
    """A TorchDispatchMode counting the bytes of the tensors ops make on a device type (not views or
    in-place results): ``total``, and ``peak`` of those alive at once."""

    def __init__(self, device_type):
        from torch.utils._python_dispatch import TorchDispatchMode

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(mode, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                import torch
                from torch.utils._pytree import tree_leaves
                fresh = [r.alias_info is None for r in func._schema.returns]
                for t, new in zip(tree_leaves(out), fresh + [False] * 99):
                    if isinstance(t, torch.Tensor) and new and t.device.type == device_type:
                        self._made(t)
                return out
        self.mode, self.total, self.peak, self.alive = Mode(), 0, 0, []

    def _made(self, t):
        import weakref
        self.total += t.untyped_storage().nbytes()
        n = t.untyped_storage().nbytes()
        self.alive = [(r, m) for r, m in self.alive if r() is not None] + [(weakref.ref(t), n)]
        self.peak = max(self.peak, sum(n for _, n in self.alive))

    def __enter__(self):
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        return self.mode.__exit__(*exc)


def _small_trainer(device):
    """A model, LAMB with its slots (as the warm-up leaves them) and an accumulator on ``device``."""
    import types
    import torch
    from mlperf_bert.trainer import accumulation, optimizer as optim
    from mlperf_bert.trainer.config import BertConfig
    from mlperf_bert.trainer.model import BertForPreTraining
    with torch.device("cpu" if device == "cpu" else "meta"):
        model = BertForPreTraining(BertConfig(**SMALL))
    if device not in ("cpu", "meta"):  # fake CUDA tensors (in a FakeTensorMode) are made empty
        for mod in model.modules():
            for name, p in list(mod._parameters.items()):
                if p is not None:
                    mod._parameters[name] = torch.nn.Parameter(torch.empty_like(p, device=device))
    opt = optim.create_optimizer(model, "lamb")
    for g in opt.param_groups:
        opt.advance_slots(g["params"])
    acc = accumulation.GradientAccumulator(model, opt, 1, lambda step: 1e-4)
    return types.SimpleNamespace(model=model, optimizer=opt, accumulator=acc, device=torch.device("cpu"),
                                 fv=types.SimpleNamespace(bert_config_file="bert_config.json"))


# a 'meta' model is the point: torch says each copy into it is a no-op
@pytest.mark.filterwarnings("ignore:for .* to a meta parameter:UserWarning")
def test_a_resume_and_the_warm_up_keep_the_checkpoint_and_the_snapshot_off_the_device(monkeypatch):
    """Issue 46.2: a resume held the checkpoint's weights and LAMB slots on the device (3.75 GiB of
    BERT-Large) through the warm-up, and the warm-up cloned every weight there (1.25 GiB) beside its
    steps' peak. The plan lists both as host memory; counted on a 'meta' device (and fake CUDA
    tensors for the snapshot): the resume makes no device tensor (copied in place from the host), a
    rank receiving the checkpoint holds one tensor of it at a time on the device, and the snapshot
    makes none."""
    import torch
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from mlperf_bert.trainer import distributed, training, warmup
    from mlperf_bert.trainer.config import BertConfig
    m = memory_plan
    n, largest = m.n_params(BertConfig.from_json_file(m.CONFIG), largest=True)
    assert largest == 4 * 30522 * 1024  # the word embeddings
    items = m.host_side(n, largest)
    # (and the pinned buffers every checkpoint's copy goes into: rank 0, the whole run; they were not listed)
    assert items == {"warm-up snapshot": (4 * n, 0), "checkpoint of a resume": (12 * n, largest),
                     "checkpoints' copies": (12 * n, 0)}
    from mlperf_bert.trainer import checkpoint
    small = _small_trainer("cpu")  # what the buffers reserve: those bytes, 12 a parameter
    reserved = checkpoint.HostBuffers.for_state.__func__(lambda sizes: sizes, small.model, small.optimizer)
    assert sum(reserved) == m.host_side(sum(p.numel() for p in small.model.parameters()), 0)["checkpoints' copies"][0]

    # the resume: model and slots on the device, the checkpoint on the host
    src = _small_trainer("cpu")
    for st in src.optimizer.state.values():
        st["adam_m"].normal_()
        st["step"] = 7
    ckpt = {"model": src.model.state_dict(), "optimizer": src.optimizer.state_dict(),
            "rank_state": {"accumulator": src.accumulator.state_dict()}}
    dst = _small_trainer("meta")
    slots = [id(st["adam_m"]) for st in dst.optimizer.state.values()]
    with _NewTensors("meta") as made:
        training.Trainer.resume(dst, ckpt, "model.ckpt-7.pt")
    assert made.total == 0
    assert [id(st["adam_m"]) for st in dst.optimizer.state.values()] == slots
    assert {st["step"] for st in dst.optimizer.state.values()} == {7}

    # a rank other than 0 receives it through the device one tensor at a time, into host memory
    # (a fake process group for the rank and world; the collective itself does nothing)
    dist.init_process_group("fake", store=FakeStore(), rank=1, world_size=2)
    try:
        # rank 0's pickled structure (the fake group sends no bytes)
        state = ckpt["model"]
        skeleton = {k: distributed._Slot(tuple(v.shape), v.dtype) for k, v in state.items()}
        monkeypatch.setattr(distributed, "broadcast_object", lambda obj: skeleton)
        monkeypatch.setattr(dist, "broadcast", lambda t, src: None)  # torch asks a CUDA build for a CUDA tensor
        # fake CUDA tensors (no bytes): NCCL's device, as the tensors pass through it
        with FakeTensorMode(allow_non_fake_inputs=True), _NewTensors("cuda") as made:
            got = distributed.broadcast_state(None, torch.device("cuda", 0))
        assert {t.device.type for t in got.values()} == {"cpu"} and got.keys() == state.keys()
        sizes = sorted(v.untyped_storage().nbytes() for v in state.values())
        assert made.total == sum(sizes) and made.peak == sizes[-1]
    finally:
        dist.destroy_process_group()

    # the warm-up's snapshot of a trainer on a (fake) CUDA device: host memory only
    with FakeTensorMode(allow_non_fake_inputs=True):
        cuda = _small_trainer("cuda")
        with _NewTensors("cuda") as made:
            snap = warmup.snapshot(cuda)
    assert made.total == 0
    assert {t.device.type for t in snap["weights"].values()} == {"cpu"}
    assert {t.device.type for st in snap["opt_state"].values() for t in st.values() if torch.is_tensor(t)} == {"cpu"}


def test_below_seq_512_the_plan_fits_its_line_where_the_rows_are_the_peak(traced):
    """A hostile sweep: the plan fitted its line to 8 and 16 rows at any sequence length; at seq 128
    both peaks were the backward's end (weights and gradients, no row's), so it planned 0 GiB a row
    and 246,109,916 rows a GPU (``python -m mlperf_bert.trainer.memory_plan --max_seq_length=128``).
    Now a 1-layer BERT-Large at seq 128 is planned as traced at 64 and 256 rows."""
    from mlperf_bert.trainer.config import BertConfig
    cfg = dataclasses.replace(BertConfig.from_json_file(memory_plan.CONFIG, 128), num_hidden_layers=1)
    plan = memory_plan.Plan(cfg, 128, 20)
    for b in (64, 256):  # (64: the plan's own trace of it, kept by ``traced``)
        traced_peak = memory_plan.trace(cfg, b, 128, 20, "bf16", True)["Total"]
        assert abs(plan.fixed + b * plan.per_row - traced_peak) < 1e-3 * traced_peak, b
