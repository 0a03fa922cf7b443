"""One GPU check, made for a 15-minute window: what a GPU does with this trainer, stage by stage,
within --budget_s (default 420 s), in one summary table, one markdown file and one JSON.

Usage: python bench/gpu_check.py [--budget_s=420] [--json=gpu_check.json] [--markdown=gpu_check.md]
       python bench/gpu_check.py --tiny      (a 2-layer hidden-32 model, 1 layer in the levers and
                                              trainer stages, and the tests' quick settings: the check
                                              on a CPU, 17 s on an idle 2-core machine, 22 CPU seconds)

On a host without CUDA it refuses, unless told to scale down (--tiny, or a --bert_config_file of
your own). The trainer and the TFRecord reader need mlperf-logging and crc32c: the error says
which versions to pip install (requirements.txt's).

The data: seq-512 records (--input_file, or made from tests/data's golden input shard part-00000
by the reference's golden command, dupe factor 10), the first --records of them, packed (up to 3
sequences a row) by the ``pack`` command's code. bf16 autocast, LAMB, one GPU (no DDP).

The stages, in order of value, each in its own process (forked: nothing is imported twice) under
a time cap, its share of what is left of the budget (the caps, printed before the first stage
starts, are each stage's share if every earlier one used all of its own: time a stage leaves goes
to the later ones); a stage that fails or runs out of time is recorded as such and the next one
runs; the JSON and the markdown are rewritten as each stage ends, so a check cut short keeps what
it measured. Each stage compiles into an inductor (and Triton) cache and a TMPDIR of its own: a
stage killed at its cap in the middle of a compile leaves half-written files (a 0-byte main.so,
gcc's temporaries), which are removed with its folder; the next stage starts from a copy of the
cache of the last stage that ended by itself.

- packed: packed rows against the same sequences unpacked (the model in eval mode, 12 sequences):
  loss, MLM logits and gradients, fp32 and bf16 (on a GPU, bf16 packed rows run FlashAttention's
  variable-length kernel);
- full_depth: BERT-Large itself (--bert_config_file, 24 layers) at the planned per-GPU batch
  (--full_batch: the memory plan's MAX_PER_GPU_BATCH), packed: the trainer's step eager and with
  --compile, plain and with --full_levers (those a mode refuses left out), in that order: eager
  plain, compiled plain, compiled with the levers, eager with the levers; each run 2 warm-up
  micro-steps then --full_windows timed windows of --full_steps micro-steps on distinct rows:
  rows/s, real sequences/s and MFU of each window (the median and the spread, (max - min) /
  median), peak memory allocated and reserved in the warm-up beside those of the timed windows,
  and the cold compile seconds (the warm-up's time over two timed micro-steps; the stage's
  compile cache starts empty);
- eager: the trainer's own step (``Trainer.step``), eager, on packed rows (distinct rows for each
  micro-step), for each --batches
  until the GPU runs out of memory or the stage's time: rows/s, real sequences/s, MFU (the
  attention counted as its kernel computes it, the GPU's peak by its exact model:
  mlperf_bert/trainer/throughput.py), peak memory and the memory plan's prediction beside it;
- levers: every speed lever of mlperf_bert/trainer/trainer_flags.py (``LEVERS``, or --levers) alone, and
  all those a mode accepts together (or --lever_all's, less those a mode refuses), eager and with
  --compile, against the plain step of each, at a model of BERT-Large width and --lever_layers
  layers: the plain step and all together first, then each alone; rows/s (the median of 3 timed
  windows, and their spread), peak memory and the loss after --lever_steps steps on the same rows
  against the plain step's; a lever refused is listed with its one-line reason;
- trainer: the trainer end to end (``run_pretraining``'s code) at --trainer_layers layers of
  BERT-Large width and the levers stage's batch, with --compile and the levers this device
  accepts, --trainer_steps micro-steps on the packed rows with two online evals and a checkpoint;
  the rates it logs (train_loss's rows/s, sequences/s and MFU of each log interval);
- eval: seconds per 10,000 eval samples (``evaluation.evaluate``) at each per-GPU --eval_batches;
- syncs: host syncs per micro-step over --steps eager micro-steps: torch.cuda.set_sync_debug_mode
  warnings on CUDA; on a CPU the Tensor read-backs (.item(), .cpu(), ...) are counted instead;
  each with where it happened (this repository's frames of its stack);
- hf: Hugging Face ``BertForPreTraining`` (bench/train_throughput.py's), eager, unpacked, at
  --hf_batch: sequences/s and peak memory (skipped, with a note, without transformers: make hf).

Then, on a GPU, from the eager rates and the eval: the projected time to train on --gpus GPUs
(mlperf_logging's reference convergence points, split by the memory plan's MAX_PER_GPU_BATCH; no
all-reduce cost).

CUDA-graph recordings (inductor's CUDA-graph trees, --cuda_graphs) are counted per stage and phase:
the warm-up, the first steps, the timed steps, the first and the second eval; a recording outside
the warm-up and the first steps is a re-recording on the clock. So are inductor's "skipping
cudagraphs" warnings, each with its reason and this repository's frames of where: a function
skipped runs without CUDA graphs. On a CPU both counts are 0.

A figure the machine cannot give (peak memory, MFU on a CPU) is written "n/a". Beside each figure
that a record in docs/gpu/ (--references) has for the same model, sequence length, batch and
levers, the record's value, labelled with its GPU and date: "319.0 (H100 2026-11-27: 319.0)".
Every stage runs on a CPU in the tests with --tiny (tests/test_gpu_check.py).
"""
import contextlib
import gc
import itertools
import json
import math
import os
import re
import signal
import sys
import tempfile
import time
import traceback
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import _data  # noqa: E402

ROOT = _data.ROOT
GIB = 2.0 ** 30
RATE_KEYS = ("rows_per_s", "seq_per_s", "tflops_per_gpu", "mfu")  # throughput.Meter's, in the trainer's log
READBACKS = ("item", "cpu", "tolist", "numpy", "__bool__", "__int__", "__float__", "nonzero")
# the stages, in order of value, and each one's share of the budget left when it starts
STAGES = ("packed", "full_depth", "eager", "levers", "trainer", "eval", "syncs", "hf")
# full_depth holds two cold compiles of the 24 layers (the 2026-11-26 H100 trainer compiled for
# 146 s at batch 24); whether its four runs fit its share of 420 s: not measured on a GPU
SHARE = {"packed": 2, "full_depth": 10, "eager": 2, "levers": 5, "trainer": 2, "eval": 1, "syncs": 1, "hf": 1}
# the levers of full_depth's runs with levers: those at 1.04x or more of their mode's plain step at
# 2 layers of BERT-Large width on the H100 (docs/training.md, "Speed levers"); each mode drops those
# it refuses (--cuda_graphs without --compile)
FULL_LEVERS = "cuda_graphs,fused_update,fused_qkv"
TIMED_WINDOWS = 3  # the least number of timed windows behind a rate and its spread
TINY = {"vocab_size": 30522, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
        "intermediate_size": 64, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1, "max_position_embeddings": 512, "type_vocab_size": 2,
        "initializer_range": 0.02}
# --tiny: the defaults of a check on a CPU (flags given on the command line win)
# (those of tests/test_gpu_check.py's run: one batch of each sweep, one timed step a window, the
# compiled runs traced by dynamo and run eagerly, not compiled by inductor; the levers and trainer
# stages at one layer of the tiny model, which runs every lever's code as two do: 2.1 of their 10
# CPU seconds were the second layer's tracing and steps)
TINY_FLAGS = {"records": 200, "batches": "2", "eval_batches": "2", "eval_samples": 8, "steps": 1, "hf_batch": 2,
              "lever_batch": 2, "lever_steps": 5, "lever_layers": 1, "trainer_layers": 1, "trainer_steps": 4,
              "full_batch": 2, "full_steps": 1,
              "full_levers": "fused_qkv", "levers": "fused_qkv,cuda_graphs",
              "lever_all": "fused_update,cuda_graphs,fused_qkv", "compile_backend": "eager"}


def define():
    from mlperf_bert import flags
    fv = flags.FlagValues()
    S, B = flags.DEFINE_string, flags.DEFINE_bool

    def I(*a, **k):  # a count: 0 or less looped forever (--batches=0), divided by 0 or measured nothing
        return flags.DEFINE_integer(*a, lower_bound=k.pop("lower_bound", 1), **k)
    I("budget_s", 420, "Seconds the whole check may take; each stage gets its share of what is left.",
      flag_values=fv)
    S("json", "gpu_check.json", "Where the JSON goes (rewritten as each stage ends).", flag_values=fv)
    S("markdown", None, "Where the markdown summary goes (default: --json with .md).", flag_values=fv)
    B("tiny", False, "A 2-layer hidden-32 model (1 layer in the levers and trainer stages) and the tests' quick "
      "settings (one batch a sweep, one timed step a window, --compile_backend=eager): the whole check on a CPU, "
      "17 s on an idle 2-core machine, 22 CPU seconds (docs/training.md).", flag_values=fv)
    S("bert_config_file", os.path.join(ROOT, "configs", "bert_config_large.json"),
      "The model of the packed, eager, trainer, eval and syncs stages (default BERT-Large).", flag_values=fv)
    S("input_file", None, "Seq-512 TFRecords (default: made from tests/data's golden input).", flag_values=fv)
    I("records", 3000, "Records of the input used.", flag_values=fv)
    I("max_seq_length", 512, "Sequence length of the records.", flag_values=fv)
    I("max_predictions_per_seq", 76, "Masked positions of the records.", flag_values=fv)
    I("full_batch", 0, "Per-GPU batch (packed rows) of the full_depth stage (0: the memory plan's "
      "MAX_PER_GPU_BATCH, what the presets put on one GPU).", lower_bound=0, flag_values=fv)
    I("full_windows", TIMED_WINDOWS, "Timed windows of each full_depth run (at least %d)." % TIMED_WINDOWS,
      flag_values=fv)
    I("full_steps", 3, "Micro-steps of each timed window of the full_depth stage.", flag_values=fv)
    S("full_levers", FULL_LEVERS, "The levers of the full_depth stage's runs with levers, less those a mode "
      "refuses (empty: plain runs only).", flag_values=fv)
    S("references", os.path.join(ROOT, "docs", "gpu"), "Folder of recorded gpu_check JSONs whose figures are "
      "printed beside this run's (same model, sequence length, batch and levers); empty: none.", flag_values=fv)
    S("batches", "24,48,64,96,128,160,192", "Per-GPU batches (packed rows) of the eager sweep.", flag_values=fv)
    I("steps", 10, "Timed micro-steps of each eager batch and of the host-sync count (after 2 warm-up steps).",
      flag_values=fv)
    I("lever_layers", 8, "Layers of the levers stage's model (BERT-Large width: hidden 1024, 16 heads).",
      flag_values=fv)
    I("lever_batch", 32, "Per-GPU batch (packed rows) of the levers and trainer stages.", flag_values=fv)
    I("lever_steps", 11, "Micro-steps of each lever run (2 compile or warm up, the rest timed in %d windows); "
      "the loss after them is compared with the plain step's." % TIMED_WINDOWS, flag_values=fv)
    I("trainer_steps", 40, "Micro-steps of the end-to-end trainer stage (two evals, a checkpoint).",
      flag_values=fv)
    I("trainer_layers", 2, "Layers of the trainer stage's model (BERT-Large width); at 2 its warm-up (every graph "
      "compiled, after the levers stage's compiles) took 31 s on the H100 of 2026-11-27.", flag_values=fv)
    S("eval_batches", "", "Per-GPU eval batches (default: 1, the trainer's default on this device, 256).",
      flag_values=fv)
    I("eval_samples", 1000, "Eval samples timed at each eval batch.", flag_values=fv)
    I("hf_batch", 24, "Batch of the Hugging Face stage (unpacked records).", flag_values=fv)
    S("gpus", "8,64", "GPU counts of the projected time to train.", flag_values=fv)
    B("compile", True, "The levers stage's runs with --compile, and the trainer stage's --compile (--nocompile: "
      "eager only, the quick CPU test).", flag_values=fv)
    S("levers", None, "The levers of the levers and trainer stages (default: all of "
      "mlperf_bert/trainer/trainer_flags.py's LEVERS; empty: none alone).", flag_values=fv)
    S("lever_all", None, "The levers of the levers stage's run of all together, in each mode less those the "
      "trainer's flag checks refuse in it (default: --levers').", flag_values=fv)
    S("compile_backend", "inductor", "torch.compile backend (eager or aot_eager: the CPU test).", flag_values=fv)
    S("stages", ",".join(STAGES), "The stages to run, in this order: " + ", ".join(STAGES) + ".", flag_values=fv)
    flags.DEFINE_enum("device", "auto", ["auto", "cpu", "cuda"], "Device (auto: CUDA where there is one).",
                      flag_values=fv)
    return fv


# ---------------------------------------------------------------- set-up (the parent process: no CUDA)

def missing_dependency(name):
    """The one line for a missing module: what to pip install, at requirements.txt's versions."""
    from mlperf_bert.cli import pinned
    return "gpu_check: the trainer needs %s: pip install %s" % (name, " ".join(map(pinned, ["mlperf-logging", "crc32c"])))


def check_dependencies():
    from mlperf_bert.errors import UserError
    for module in ("mlperf_logging", "crc32c"):
        try:
            __import__(module)
        except ImportError as e:
            raise UserError(missing_dependency(e.name or module))


def cuda_available():
    """torch.cuda.is_available(), asked in a forked child: the CUDA runtime that asking may start
    does not survive a fork, and the stages are forked from this process."""
    import torch
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 3
        try:
            code = 0 if torch.cuda.is_available() else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def resolve(fv, work):
    """--tiny's defaults, the refusal on a host without CUDA, the device kind."""
    from mlperf_bert.errors import UserError
    if fv.tiny:
        for name, value in TINY_FLAGS.items():
            if not fv[name].present:
                fv[name].value = value
        if not fv["bert_config_file"].present:
            fv.bert_config_file = os.path.join(work, "tiny.json")
            from mlperf_bert.fileio import write_json
            write_json(fv.bert_config_file, TINY)
    cuda = cuda_available()
    if fv.device == "cuda" and not cuda:
        raise UserError("gpu_check: --device=cuda, but this host has no CUDA GPU: run it on a GPU machine")
    kind = fv.device if fv.device != "auto" else ("cuda" if cuda else "cpu")
    if kind == "cpu" and not (fv.tiny or fv["bert_config_file"].present):
        raise UserError("gpu_check: this host has no CUDA GPU and the check would run BERT-Large at seq %d on "
                        "the CPU: run it on a GPU machine, or add --tiny (or --bert_config_file=SMALL.json) to "
                        "scale it down" % fv.max_seq_length)
    return kind


def make_records(fv, work):
    """The first --records seq-512 records: --input_file, or made from the golden input."""
    from mlperf_bert.dataset import tfrecord
    src = fv.input_file or _data.golden_records(os.path.join(work, "golden.tfrecord"), fv.max_seq_length,
                                                fv.max_predictions_per_seq)
    recs = list(itertools.islice(tfrecord.read_records(src), fv.records))
    path = os.path.join(work, "records.tfrecord")
    tfrecord.write_records(path, recs)
    return path, recs


def pack(fv, records_path, work):
    from mlperf_bert.dataset import packing
    out = os.path.join(work, "packed.hdf5")
    n_seq, n_rows, _ = packing.pack_file(records_path, out, fv.max_seq_length, fv.max_predictions_per_seq, 3, 12345)
    return out, n_seq / n_rows


def packed_rows(path, b, n):
    from mlperf_bert.trainer.packed_loader import PackedBatches
    return list(itertools.islice(PackedBatches([path], b, shuffle=False, repeat=True), n))


# ---------------------------------------------------------------- pieces of the stages

def our_frames(frames):
    """This repository's frames (mlperf_bert/..., bench/...) of a stack, innermost last, as
    "path:line function"; ``frames``: traceback.FrameSummary objects or (path, line, function)."""
    out = []
    for f in frames:
        path, line, name = (f.filename, f.lineno, f.name) if hasattr(f, "filename") else f
        rel = os.path.relpath(os.path.abspath(path), ROOT)
        if rel.split(os.sep)[0] in ("mlperf_bert", "bench"):
            out.append("%s:%s %s" % (rel, line, name))
    return out


def skip_reason(message):
    """-> {"reason", "at"} of an inductor "skipping cudagraphs" warning: its reason (the first
    line, its "Found from" left out) and this repository's frames of the stack it quotes."""
    first = message.strip().splitlines()[0]
    reason = re.sub(r"^skipping cudagraphs due to ", "", first).split(". Found from")[0].strip()
    return {"reason": reason, "at": our_frames(re.findall(r'File "([^"]+)", line (\d+), in (\S+)', message))}


class GraphRecordings:
    """CUDA-graph recordings of inductor's CUDA-graph trees, counted by phase: each call of its
    tree manager's ``record_function`` is one recording (a graph captured). And inductor's
    "skipping cudagraphs" warnings (its cudagraphs log, cudagraph_utils.py), each with its reason
    and where, by phase: a function skipped runs without CUDA graphs."""

    def __init__(self):
        self.by_phase, self.phase, self.skips = {}, None, {}
        self._skip_log()
        try:
            from torch._inductor import cudagraph_trees
            self.manager = cudagraph_trees.CUDAGraphTreeManager
        except (ImportError, AttributeError):  # a torch without the trees: nothing to count
            self.manager = None
            return
        real = self.manager.record_function

        def counted(manager, *a, **k):
            self.by_phase[self.phase] = self.by_phase.get(self.phase, 0) + 1
            return real(manager, *a, **k)
        self.manager.record_function = counted

    def _skip_log(self):
        import logging
        try:
            from torch._inductor import cudagraph_utils
            log = cudagraph_utils.cudagraphs_log
        except (ImportError, AttributeError):
            return
        outer = self

        class Skips(logging.Handler):
            def emit(self, record):
                with contextlib.suppress(Exception):
                    message = record.getMessage()
                    if "skipping cudagraphs" in message:
                        outer.skips.setdefault(outer.phase or "outside a phase", []).append(skip_reason(message))
        log.addHandler(Skips())

    def skipped(self):
        """{phase: [{"reason", "at"}]} of the "skipping cudagraphs" warnings, every phase listed."""
        return {phase: list(self.skips.get(phase, [])) for phase in list(self.by_phase) + [
            p for p in self.skips if p not in self.by_phase]}

    @contextlib.contextmanager
    def counting(self, phase):
        saved, self.phase = self.phase, phase
        self.by_phase.setdefault(phase, 0)
        try:
            yield
        finally:
            self.phase = saved

    def counts(self):
        return dict(self.by_phase) if self.manager is not None else {"note": "not countable on this torch"}


def trainer_flags(fv, b, extra=()):
    from mlperf_bert.trainer.trainer_flags import define_flags
    tf = define_flags()
    tf(["x", "--bert_config_file=" + fv.bert_config_file, "--input_file=unused", "--output_dir=unused",
        "--train_batch_size=%d" % b, "--max_seq_length=%d" % fv.max_seq_length, "--dtype=bf16",
        "--max_predictions_per_seq=%d" % fv.max_predictions_per_seq, "--optimizer=lamb", "--learning_rate=1e-4",
        "--num_train_steps=100000", "--num_warmup_steps=10", "--do_train"] + list(extra))
    return tf


def trainer(fv, config, device, b, extra=()):
    """The trainer's Trainer with ``extra`` flags; UserError where a flag is refused."""
    from mlperf_bert.trainer import flag_checks, training
    from mlperf_bert.trainer.run_config import RunConfig
    tf = RunConfig.from_flags(trainer_flags(fv, b, extra))
    flag_checks.check_flags(tf)
    return training.Trainer(tf, config, device, 0, 1, seed=0)


def sync(device):
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize()


def reset_memory(device):
    import torch
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peaks(device):
    """-> (allocated, reserved) peaks in GiB since the last reset; (None, None) on a CPU."""
    import torch
    if device.type != "cuda":
        return None, None
    return torch.cuda.max_memory_allocated() / GIB, torch.cuda.max_memory_reserved() / GIB


def peak_gib(device):
    """The allocated peak of ``peaks``."""
    return peaks(device)[0]


def spread(values):
    """(max - min) / median of repeated timings."""
    import statistics
    return (max(values) - min(values)) / statistics.median(values)


def timed_windows(tr, batches, b, steps, windows, device, first=2, work=None, peak_tflops=None):
    """``windows`` timed windows of ``steps`` micro-steps each, from micro-step ``first`` on ->
    {"windows": [rows/s of each], "rows_per_s", "real_seq_per_s", "mfu": their medians, "spread":
    (max - min) / median of the rows/s, "loss": the last micro-step's}; ``work``: the FLOPs of
    each batch (``flops``), for the MFU on CUDA."""
    import statistics
    rows, seqs, mfus, loss = [], [], [], None
    for i in range(windows):
        start = first + i * steps
        t, n, loss = run_steps(tr, batches, steps, device, first=start)
        rows.append(b * steps / t)
        seqs.append(n / t)
        if work is not None and peak_tflops and device.type == "cuda":
            mfus.append(sum(work[(start + j) % len(work)] for j in range(steps)) / t / 1e12 / peak_tflops)
    return {"windows": rows, "rows_per_s": statistics.median(rows), "real_seq_per_s": statistics.median(seqs),
            "mfu": statistics.median(mfus) if mfus else None, "spread": spread(rows), "loss": float(loss)}


def run_steps(tr, batches, steps, device, first=0, window=None):
    """-> (seconds, real sequences, last loss) of ``steps`` micro-steps from micro-step ``first``;
    ``window``: a context around the micro-steps alone."""
    picked = [batches[(first + i) % len(batches)] for i in range(steps)]
    seqs = sum(int(b["global_sequences"]) for b in picked)  # host-side counts, read before the clock
    picked = [{k: v for k, v in b.items() if k != "global_sequences"} for b in picked]
    loss = None
    sync(device)
    t = time.perf_counter()
    with window or contextlib.nullcontext():
        for i, batch in enumerate(picked):
            loss, _ = tr.step(batch, first + i)
    sync(device)
    return time.perf_counter() - t, seqs, loss


def on_device(batches, device):
    """The batches as the loader hands them over: pinned host memory on CUDA."""
    return [{k: v.pin_memory() if device.type == "cuda" else v for k, v in b.items()} for b in batches]


def flops(config, batches, device):
    """Training FLOPs of each batch as this device's kernels compute them (trainer/throughput.py)."""
    import torch
    from mlperf_bert.trainer import attention, throughput
    varlen = attention.varlen_kernel(device, torch.bfloat16, config.hidden_size // config.num_attention_heads)
    return [throughput.batch_flops(config, b["input_mask"], b["masked_lm_positions"].shape[1], varlen is not None,
                                   b["nsp_positions"].shape[1]) for b in batches]


def is_oom(e):
    """CUDA's out-of-memory error, or cuBLAS failing to allocate its workspace at the limit."""
    return "out of memory" in str(e).lower() or "ALLOC_FAILED" in str(e)


def device_name(device):
    import torch
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (%d threads)" % torch.get_num_threads()


# ---------------------------------------------------------------- the stages (each in its own process)

def stage_packed(ctx, save):
    """Packed against unpacked on 12 real sequences: {dtype: {loss, logits, grads}} relative errors."""
    import numpy as np
    import torch
    from mlperf_bert.dataset import packing
    from mlperf_bert.dataset.example import decode_pretraining_batch
    from mlperf_bert.trainer import training
    from mlperf_bert.trainer.model import BertForPreTraining
    fv, config, device, recs = ctx["fv"], ctx["config"], ctx["device"], ctx["recs"]
    a = decode_pretraining_batch(recs[:400], fv.max_seq_length, fv.max_predictions_per_seq)
    lengths = packing.sequence_lengths(a["input_mask"])
    short = [i for i in np.argsort(lengths, kind="stable") if lengths[i] >= 20][:9]
    full = [i for i in range(len(lengths)) if lengths[i] == fv.max_seq_length][:3]
    pick = sorted(short + full)
    a = {k: v[pick].astype(np.float32 if k == "masked_lm_weights" else np.int64) for k, v in a.items()}
    groups = packing.pack_groups(packing.sequence_lengths(a["input_mask"]), fv.max_seq_length, 3)
    order = [i for g in groups for i in g]
    unpacked = {k: torch.from_numpy(v).to(device) for k, v in a.items()}
    unpacked["next_sentence_labels"] = unpacked["next_sentence_labels"].reshape(-1)
    packed = {k: torch.from_numpy(np.asarray(v)).to(device) for k, v in packing.pack_arrays(a, groups, 3).items()}
    packed = {k: v.float() if k == "masked_lm_weights" else v.long() for k, v in packed.items()}
    w = a["masked_lm_weights"] != 0
    per_seq = np.split(np.arange(int(w.sum())), np.cumsum(w.sum(1))[:-1])
    out = {}
    for dtype in ("fp32", "bf16"):
        autocast = training.autocast(device, dtype)
        res = []
        for batch in (unpacked, packed):
            torch.manual_seed(0)
            m = BertForPreTraining(config).to(device).eval()
            with autocast():
                o, (mlm, _) = m(**batch, return_logits=True)
            o.loss.backward()
            res.append((o.loss.detach().double(), mlm.detach().double(),
                        torch.cat([p.grad.double().reshape(-1) for p in m.parameters()])))
            del m
        (lu, mu, gu), (lp, mp, gp) = res
        mu = torch.cat([mu[torch.as_tensor(per_seq[i], device=device)] for i in order])
        out[dtype] = {"loss": ((lp - lu).abs() / lu.abs()).item(),
                      "logits": ((mp - mu).abs().max() / mu.abs().max()).item(),
                      "grads": ((gp - gu).norm() / gu.norm()).item()}
        save({"errors": out})
    return {"errors": out}


def full_depth_runs(fv, device, b):
    """The full_depth stage's runs, in order: [(mode, name, levers)]; the levers of a mode less
    those its flag checks refuse (listed in ``refused``), a run with levers left out where none is left."""
    wanted = [x.strip() for x in fv.full_levers.split(",") if x.strip()]
    modes = ("eager", "compiled") if fv.compile else ("eager",)
    runs, refused = [], {}
    for mode, name in (("eager", "plain"), ("compiled", "plain"), ("compiled", "levers"), ("eager", "levers")):
        if mode not in modes:
            continue
        on = []
        if name == "levers":
            for x in wanted:
                why = lever_refusal(fv, device, b, x, mode == "compiled")
                if why:
                    refused["%s %s" % (mode, x)] = why
                else:
                    on.append(x)
            if not on:
                continue
        runs.append((mode, name, on))
    return runs, refused


def stage_full_depth(ctx, save):
    """BERT-Large itself at the planned per-GPU batch: eager and compiled, plain and with levers."""
    import torch
    from mlperf_bert.trainer import memory_plan, throughput
    fv, config, device, graphs = ctx["fv"], ctx["config"], ctx["device"], ctx["graphs"]
    b = fv.full_batch or memory_plan.MAX_PER_GPU_BATCH
    steps, windows = max(fv.full_steps, 1), max(fv.full_windows, TIMED_WINDOWS)
    # distinct rows for every micro-step (cycled where the file has fewer): the real sequences of
    # the timed rows are those of the data, not of a few rows repeated
    batches = on_device(packed_rows(ctx["packed_file"], b, 2 + steps * windows), device)
    work = flops(config, batches, device)
    peak_tflops = throughput.peak_tflops(device_name(device), "bf16")
    plan, refused = full_depth_runs(fv, device, b)
    out = {"model": {"hidden_size": config.hidden_size, "num_hidden_layers": config.num_hidden_layers},
           "batch": b, "steps": steps, "windows": windows, "peak_tflops": peak_tflops, "refused": refused, "runs": []}
    for mode, name, on in plan:
        row = {"mode": mode, "levers": name if not on else ",".join(on)}
        tag = "%s %s" % (mode, row["levers"])
        save(out, running=tag)  # what a stage killed at its cap was doing
        torch.compiler.reset()  # each run compiles from its own start (the on-disk cache: the stage's)
        reset_memory(device)  # then the last run's CUDA-graph pools are freed too
        tr = None
        try:
            tr = trainer(fv, config, device, b, ["--" + x for x in on] + (["--compile"] if mode == "compiled" else []))
            with graphs.counting("full_depth %s: first steps" % tag):
                first_s, _, _ = run_steps(tr, batches, 2, device)
            row["warmup_peak_gib"], row["warmup_reserved_gib"] = peaks(device)
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            with graphs.counting("full_depth %s: timed steps" % tag):
                row.update(timed_windows(tr, batches, b, steps, windows, device, work=work, peak_tflops=peak_tflops))
            row["peak_gib"], row["reserved_gib"] = peaks(device)
            row["first_steps_s"] = first_s
            # the warm-up's time over two timed micro-steps: what compiling took (the update alone
            # with --fused_update; an eager plain run compiles nothing)
            row["compile_s"] = max(first_s - 2 * b / row["rows_per_s"], 0.0) if (
                mode == "compiled" or "fused_update" in on) else None
        except Exception as e:  # out of memory or a lever failing is a finding: recorded, the next run goes on
            row["failed"] = "out of memory" if is_oom(e) else "%s: %s" % (
                type(e).__name__, str(e).splitlines()[0] if str(e) else "")
        finally:
            del tr
        base = next((r for r in out["runs"] if r["mode"] == mode and r["levers"] == "plain" and "loss" in r), None)
        if base is not None and name == "levers" and "loss" in row:
            row["speed_vs_plain"] = row["rows_per_s"] / base["rows_per_s"]
        out["runs"].append(row)
        save(out)
        print("  full_depth %s: %s" % (tag, row), file=sys.stderr, flush=True)
    torch.compiler.reset()
    return out


def stage_eager(ctx, save):
    """The trainer's eager step at each --batches until out of memory or out of time."""
    from mlperf_bert.trainer import memory_plan, throughput
    fv, config, device, deadline = ctx["fv"], ctx["config"], ctx["device"], ctx["deadline"]
    slots = packed_rows(ctx["packed_file"], 1, 1)[0]["masked_lm_positions"].shape[1]
    plan = memory_plan.Plan(config, fv.max_seq_length, slots, "bf16", packed=True)
    peak_tflops = throughput.peak_tflops(device_name(device), "bf16")
    rows = []
    for b in ints(fv.batches):
        if rows and time.time() > deadline - ctx["cap"] / 4:  # the next, larger batch would not end in time
            rows.append({"batch": b, "skipped": "out of the stage's time"})
            break
        # distinct rows for each micro-step: the real sequences counted are the data's (the four
        # batches cycled before 2026-12 held 1.41 sequences a row where the data has 1.29)
        batches = on_device(packed_rows(ctx["packed_file"], b, 2 + fv.steps), device)
        work = flops(config, batches, device)
        reset_memory(device)
        tr = None
        try:
            tr = trainer(fv, config, device, b)
            run_steps(tr, batches, 2, device)
            t, seqs, _ = run_steps(tr, batches, fv.steps, device, first=2)
            tflops = sum(work[(2 + i) % len(work)] for i in range(fv.steps)) / t / 1e12
            rows.append({"batch": b, "rows_per_s": b * fv.steps / t, "real_seq_per_s": seqs / t,
                         "tflops": tflops if device.type == "cuda" else None,
                         "mfu": tflops / peak_tflops if peak_tflops and device.type == "cuda" else None,
                         "peak_gib": peak_gib(device), "plan_gib": plan.peak(b) / GIB})
        except RuntimeError as e:
            if not is_oom(e):
                raise
            rows.append({"batch": b, "oom": True, "plan_gib": plan.peak(b) / GIB})
            break
        finally:
            del tr
        save({"steps": rows, "peak_tflops": peak_tflops})
        print("  eager batch %d: %s" % (b, rows[-1]), file=sys.stderr, flush=True)
    return {"steps": rows, "peak_tflops": peak_tflops}


def chosen_levers(fv, flag="levers"):
    """--levers (or --lever_all), or every lever of mlperf_bert/trainer/levers.py."""
    from mlperf_bert.errors import UserError
    from mlperf_bert.trainer.trainer_flags import LEVERS
    spec = getattr(fv, flag)
    if spec is None:
        return list(LEVERS)
    chosen = [x.strip() for x in spec.split(",") if x.strip()]
    unknown = sorted(set(chosen) - set(LEVERS))
    if unknown:
        raise UserError("--%s: unknown %s; the levers are %s" % (flag, ", ".join(unknown), ", ".join(LEVERS)))
    return chosen


def lever_refusal(fv, device, b, lever, compiled):
    """The trainer's one-line refusal of ``lever`` in a mode by its flag checks, or None."""
    from mlperf_bert.errors import UserError
    from mlperf_bert.trainer import flag_checks, levers
    from mlperf_bert.trainer.run_config import RunConfig
    tf = RunConfig.from_flags(trainer_flags(fv, b, ["--" + lever] + (["--compile"] if compiled else [])))
    try:
        flag_checks.check_flags(tf)
        levers.check_device(tf, device, 1)
    except UserError as e:
        return str(e)
    return None


def lever_config(fv, work, layers, name="lever_config.json"):
    """The levers or trainer stage's model file: BERT-Large width, ``layers`` layers (under --tiny:
    the --tiny model at ``layers`` layers, or --bert_config_file's model as it is)."""
    if fv.tiny and fv["bert_config_file"].present:  # the user's small model: as it is
        return fv.bert_config_file
    with open(fv.bert_config_file) as f:
        d = json.load(f)
    if fv.tiny:
        d.update(num_hidden_layers=layers)
    else:
        d.update(hidden_size=1024, num_attention_heads=16, intermediate_size=4096, num_hidden_layers=layers)
    path = os.path.join(work, name)
    from mlperf_bert.fileio import write_json
    write_json(path, d)
    return path


def stage_levers(ctx, save):
    """Each lever alone and all together, eager and compiled, against the plain step of each."""
    import torch
    from mlperf_bert.errors import UserError
    from mlperf_bert.trainer.config import BertConfig
    fv, device, deadline, graphs = ctx["fv"], ctx["device"], ctx["deadline"], ctx["graphs"]
    config = BertConfig.from_json_file(ctx["lever_config"], fv.max_seq_length)
    lfv = _Overlay(fv, bert_config_file=ctx["lever_config"])
    b, n = fv.lever_batch, max(fv.lever_steps, 2 + TIMED_WINDOWS)
    per_window = (n - 2) // TIMED_WINDOWS
    n = 2 + per_window * TIMED_WINDOWS  # the loss compared is after the same steps in every run
    batches = on_device(packed_rows(ctx["packed_file"], b, n), device)
    out = {"model": {"hidden_size": config.hidden_size, "num_hidden_layers": config.num_hidden_layers,
                     "batch": b, "steps": n}, "runs": []}
    modes = ("eager", "compiled") if fv.compile else ("eager",)
    # the plain step and all together first (what a stage cut short should have measured), then each alone
    plan = [(mode, [], "plain") for mode in modes] + [(mode, None, "all") for mode in modes]
    plan += [(mode, [x], x) for x in chosen_levers(fv) for mode in modes]
    for mode, on, name in plan:
        row = {"mode": mode, "levers": name}
        if on is None:  # all: those of --lever_all (default --levers) this mode's flag checks accept
            on = [x for x in chosen_levers(fv, "lever_all" if fv.lever_all is not None else "levers")
                  if not lever_refusal(lfv, device, b, x, mode == "compiled")]
            if len(on) < 2:
                continue
            row["levers"] = "all: " + ",".join(on)
        if time.time() > deadline - 2:
            row["skipped"] = "out of the stage's time"
            out["runs"].append(row)
            continue
        tag = "%s %s" % (mode, row["levers"])
        save(out, running=tag)  # what a stage killed at its cap was doing
        # each run compiles from its own start (dynamo stops compiling a function it has compiled
        # for 8 models); the on-disk cache is the stage's
        torch.compiler.reset()
        reset_memory(device)
        tr = None
        try:
            extra = ["--" + x for x in on] + (["--compile"] if mode == "compiled" else [])
            tr = trainer(lfv, config, device, b, extra)
            with graphs.counting(tag + ": first steps"):
                t0, _, _ = run_steps(tr, batches, 2, device)
            with graphs.counting(tag + ": timed steps"):
                timed = timed_windows(tr, batches, b, per_window, TIMED_WINDOWS, device)
            row.update(first_steps_s=t0, rows_per_s=timed["rows_per_s"], real_seq_per_s=timed["real_seq_per_s"],
                       windows=timed["windows"], spread=timed["spread"], peak_gib=peak_gib(device),
                       loss=timed["loss"])
        except UserError as e:
            row["refused"] = str(e)
        except Exception as e:  # a lever failing is a finding: record it, go on with the next
            row["failed"] = "out of memory" if is_oom(e) else "%s: %s" % (type(e).__name__, str(e).splitlines()[0]
                                                                          if str(e) else "")
        finally:
            del tr
        base = next((r for r in out["runs"] if r["mode"] == mode and r["levers"] == "plain" and "loss" in r), None)
        if base is not None and "loss" in row:
            row["speed_vs_plain"] = row["rows_per_s"] / base["rows_per_s"]
            row["loss_vs_plain"] = (row["loss"] - base["loss"]) / abs(base["loss"])
        out["runs"].append(row)
        save(out)
        print("  levers %s: %s" % (row["levers"], row), file=sys.stderr, flush=True)
    torch.compiler.reset()
    return out


class _Overlay:
    """A flag set with some values replaced (the levers stage's model file)."""

    def __init__(self, fv, **values):
        self._fv, self._values = fv, values

    def __getattr__(self, name):
        return self._values[name] if name in self._values else getattr(self._fv, name)


def stage_trainer(ctx, save):
    """The trainer end to end at --trainer_layers of BERT-Large width and the levers stage's batch:
    --compile and the levers this device takes, two evals, a checkpoint; the rates it logs."""
    from mlperf_bert.errors import UserError
    from mlperf_bert.trainer import training
    from mlperf_bert.trainer.trainer_flags import define_flags
    from mlperf_bert.trainer.config import BertConfig
    fv, device, graphs, work = ctx["fv"], ctx["device"], ctx["graphs"], ctx["work"]
    b = fv.lever_batch
    n = max(fv.trainer_steps, 4)
    out_dir = os.path.join(work, "trainer")
    eval_file = os.path.join(work, "eval.tfrecord")
    from mlperf_bert.dataset import tfrecord
    tfrecord.write_records(eval_file, ctx["recs"][-max(fv.eval_samples, 8):])
    sequences = b * ctx["packing_rate"]
    base = ["run_pretraining.py", "--bert_config_file=" + ctx["trainer_config"], "--input_file=" + ctx["packed_file"],
            "--eval_input_file=" + eval_file, "--output_dir=" + out_dir, "--do_train", "--dtype=bf16",
            "--train_batch_size=%d" % b, "--max_seq_length=%d" % fv.max_seq_length,
            "--max_predictions_per_seq=%d" % fv.max_predictions_per_seq, "--optimizer=lamb",
            "--learning_rate=1e-4", "--num_warmup_steps=2", "--num_train_steps=%d" % n,
            "--save_checkpoints_steps=%d" % (n // 2), "--log_frequency=%d" % max(n // 4, 1),
            # two evals inside the run: at about a third and two thirds of its samples
            "--eval_frequency=%d" % max(int(sequences * n / 3), 1), "--num_workers=0", "--noprogress",
            "--%scompile" % ("" if fv.compile else "no"), "--seed=0"]
    levers, refused = [], {}
    for x in chosen_levers(fv):  # the levers this device takes, each asked alone
        fvx = define_flags()
        fvx(base + ["--" + x])
        try:
            from mlperf_bert.trainer import flag_checks, levers as levers_mod
            from mlperf_bert.trainer.run_config import RunConfig
            rc = RunConfig.from_flags(fvx)
            flag_checks.check_flags(rc)
            levers_mod.check_device(rc, device, 1)
            levers.append(x)
        except UserError as e:
            refused[x] = str(e)
    config = BertConfig.from_json_file(ctx["trainer_config"], fv.max_seq_length)
    result = {"batch": b, "steps": n, "levers": levers, "refused": refused,
              "model": {"hidden_size": config.hidden_size, "num_hidden_layers": config.num_hidden_layers}}
    evals, steps = [], [0]
    real_warm, real_step, real_eval = training.Trainer.warm_up, training.Trainer.step, training.Trainer.evaluate

    def warm_up(self, *a, **k):
        with graphs.counting("trainer: warm-up"):
            return real_warm(self, *a, **k)

    def step(self, batch, global_step):
        if graphs.phase == "trainer: warm-up":
            return real_step(self, batch, global_step)
        steps[0] += 1
        with graphs.counting("trainer: first steps" if steps[0] <= 2 else "trainer: later steps"):
            return real_step(self, batch, global_step)

    def evaluate(self, batches):
        if graphs.phase == "trainer: warm-up":
            return real_eval(self, batches)
        evals.append(time.perf_counter())
        which = {1: "first eval", 2: "second eval"}.get(len(evals), "later evals")
        with graphs.counting("trainer: " + which):
            m = real_eval(self, batches)
        evals[-1] = time.perf_counter() - evals[-1]
        return m
    training.Trainer.warm_up, training.Trainer.step, training.Trainer.evaluate = warm_up, step, evaluate
    t = time.perf_counter()
    status = training.main(base + ["--" + x for x in levers])
    result.update(status=status, seconds=time.perf_counter() - t, micro_steps=steps[0], evals=len(evals),
                  eval_s=evals, checkpoints=sorted(x for x in os.listdir(out_dir) if x.endswith(".pt")))
    recs = [json.loads(line.split(":::MLLOG ", 1)[1]) for line in open(os.path.join(out_dir, "mlperf.log"))
            if ":::MLLOG " in line]
    acc = [r["value"] for r in recs if r["key"] == "eval_accuracy"]
    losses = [r for r in recs if r["key"] == "train_loss"]
    # the rates the trainer logs with each train_loss (its log intervals, timed from run_start)
    rates = [dict({"step": r["metadata"].get("step")}, **{k: r["metadata"][k] for k in RATE_KEYS
                                                          if k in r["metadata"]}) for r in losses]
    result.update(eval_accuracy=acc, train_loss=losses[-1]["value"] if losses else None, rates=rates)
    return result


def stage_eval(ctx, save):
    """Seconds per 10,000 eval samples at each per-GPU eval batch (eager)."""
    import torch
    from mlperf_bert.dataset import tfrecord
    from mlperf_bert.trainer import evaluation, loader, training
    from mlperf_bert.trainer.model import BertForPreTraining
    from mlperf_bert.trainer.trainer_flags import CPU_MICRO_BATCH, MAX_MICRO_BATCH
    fv, config, device, recs, deadline = ctx["fv"], ctx["config"], ctx["device"], ctx["recs"], ctx["deadline"]
    # the trainer's online eval micro-batch (--eval_micro_batch_size=0): 32 on CPU; on CUDA the largest
    # that fits, at most 256
    default_eval = CPU_MICRO_BATCH if device.type == "cpu" else MAX_MICRO_BATCH
    out = {}
    for b in ints(fv.eval_batches) or sorted({1, default_eval, 256}):
        if out and time.time() > deadline - ctx["cap"] / 4:
            out[str(b)] = "skipped: out of the stage's time"
            continue
        n = max(min(fv.eval_samples, len(recs)) // b * b, b)
        with tempfile.NamedTemporaryFile(suffix=".tfrecord") as f:
            tfrecord.write_records(f.name, (recs * (n // len(recs) + 1))[-n:])
            batches = [{k: v.to(device) for k, v in x.items()} for x in
                       loader.PretrainingBatches([f.name], fv.max_seq_length, fv.max_predictions_per_seq, b,
                                                 shuffle=False, repeat=False)]
        torch.manual_seed(0)
        model = BertForPreTraining(config).to(device)
        autocast = training.autocast(device, "bf16")
        try:
            evaluation.evaluate(model, batches[:2], device, autocast)  # warm-up
            sync(device)
            t = time.perf_counter()
            metrics = evaluation.evaluate(model, batches, device, autocast)
            sync(device)
            out[str(b)] = (time.perf_counter() - t) / metrics["samples"] * 10000
        except RuntimeError as e:
            if not is_oom(e):
                raise
            out[str(b)] = "out of memory"
        del model
        reset_memory(device)
        save({"s_per_10k": out})
    return {"s_per_10k": out}


# The text of the warning torch.cuda.set_sync_debug_mode("warn") gives at each synchronizing
# operation (c10/cuda/CUDAFunctions.cpp, warn_or_error_on_sync). Setting the mode also warns, once a
# process, that the mode "is a prototype feature and does not yet detect all synchronizing
# operations" (torch/csrc/cuda/Module.cpp): that notice is not a sync, and the first two H100 runs
# counted it as one.
SYNC_WARNING = "called a synchronizing cuda operation"


@contextlib.contextmanager
def sync_warnings(found):
    """Within: each warning of a synchronizing operation (SYNC_WARNING, what
    torch.cuda.set_sync_debug_mode("warn") sends) appended to ``found`` as {"what", "at": the
    warning's own place, "stack": this repository's frames of the stack it came from, "innermost":
    its last 3 frames, torch's too}; other warnings, the mode's own notice among them, are not."""
    def seen(message, category, filename, lineno, file=None, line=None):
        if SYNC_WARNING in str(message).lower():
            stack = traceback.extract_stack()[:-1]
            found.append({"what": str(message).strip().splitlines()[0], "at": "%s:%s" % (filename, lineno),
                          "stack": our_frames(stack),
                          "innermost": ["%s:%s %s" % (f.filename.split("site-packages/")[-1], f.lineno, f.name)
                                        for f in stack[-3:]]})
    with warnings.catch_warnings():  # which restores showwarning
        warnings.simplefilter("always")
        warnings.showwarning = seen
        yield found


def stage_syncs(ctx, save):
    """Host syncs over --steps micro-steps: CUDA's sync debug mode, or the CPU's read-backs; each
    with where it happened: this repository's frames of the stack (a sync in the backward shows
    the backward's call: the autograd engine's warnings reach Python as it returns)."""
    import torch
    fv, config, device = ctx["fv"], ctx["config"], ctx["device"]
    b = ints(fv.batches)[0]
    batches = on_device(packed_rows(ctx["packed_file"], b, 4), device)
    tr = trainer(fv, config, device, b)
    run_steps(tr, batches, 2, device)
    found = []
    if device.type == "cuda":
        @contextlib.contextmanager
        def window():
            torch.cuda.set_sync_debug_mode("warn")
            try:
                yield
            finally:
                torch.cuda.set_sync_debug_mode(0)

        with sync_warnings(found):
            run_steps(tr, batches, fv.steps, device, first=1000, window=window())
        how = "torch.cuda.set_sync_debug_mode"
    else:
        @contextlib.contextmanager
        def window():
            saved = {name: getattr(torch.Tensor, name) for name in READBACKS}
            for name, real in saved.items():
                def counted(self, *a, _real=real, _name=name, **k):
                    found.append({"what": "Tensor." + _name, "stack": our_frames(traceback.extract_stack()[:-1])})
                    return _real(self, *a, **k)
                setattr(torch.Tensor, name, counted)
            try:
                yield
            finally:
                for name, real in saved.items():
                    setattr(torch.Tensor, name, real)
        run_steps(tr, batches, fv.steps, device, first=1000, window=window())
        how = "Tensor read-backs (CPU)"
    return {"count": len(found), "steps": fv.steps, "per_step": len(found) / fv.steps, "how": how, "batch": b,
            "syncs": found[:20]}


def stage_hf(ctx, save):
    """Hugging Face ``BertForPreTraining`` (bench/train_throughput.py's), eager, unpacked records at
    --hf_batch: sequences/s and peak memory; skipped, with a note, without transformers."""
    import train_throughput
    from mlperf_bert.dataset import tfrecord
    from mlperf_bert.trainer import loader, training
    from mlperf_bert.trainer.throughput import flops_per_row, peak_tflops
    fv, config, device = ctx["fv"], ctx["config"], ctx["device"]
    try:
        import transformers  # noqa: F401
    except ImportError:
        return {"note": "skipped: transformers is not installed (make hf)"}
    b = fv.hf_batch
    with tempfile.NamedTemporaryFile(suffix=".tfrecord") as f:
        tfrecord.write_records(f.name, ctx["recs"][:4 * b])
        batches = [{k: v.to(device) for k, v in x.items()} for x in
                   loader.PretrainingBatches([f.name], fv.max_seq_length, fv.max_predictions_per_seq, b,
                                             shuffle=False, repeat=False)]
    reset_memory(device)
    _, step = train_throughput.huggingface(config, device, training.autocast(device, "bf16"))
    t = train_throughput.timed(step, batches, device, fv.steps, warmup=2)
    rate = b * fv.steps / t
    peak = peak_tflops(device_name(device), "bf16") if device.type == "cuda" else None
    return {"batch": b, "seq_per_s": rate, "peak_gib": peak_gib(device),
            "mfu": flops_per_row(config, fv.max_seq_length, fv.max_predictions_per_seq) * rate / 1e12 / peak
            if peak else None}


STAGE_FUNCTIONS = {"packed": stage_packed, "full_depth": stage_full_depth, "eager": stage_eager, "levers": stage_levers,
                   "trainer": stage_trainer, "eval": stage_eval, "syncs": stage_syncs, "hf": stage_hf}


# ---------------------------------------------------------------- running the stages

def child(name, ctx, path):
    """The forked stage: its own process group (its compile workers end with it), its own compile
    cache and TMPDIR (``ctx["cache_dir"]``, ``ctx["tmp_dir"]``), its result written to ``path`` as it
    goes and at the end; exit 0, or 1 with the error in the file."""
    # what the parent made (its imports: torch, its compiler, the trainer) is never garbage here:
    # out of this stage's collections, which then walk only what the stage makes (its full
    # collections, reset_memory's between runs among them, took 0.3 s each over the imports alone)
    gc.freeze()
    os.setpgrp()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # inductor's cache (Triton's inside it) and gcc's temporaries: inherited by the compile workers
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = ctx["cache_dir"]
    os.environ.pop("TRITON_CACHE_DIR", None)  # inductor puts it in its own cache then
    os.environ["TMPDIR"] = tempfile.tempdir = ctx["tmp_dir"]
    with contextlib.suppress(ImportError):
        from torch._inductor.utils import clear_caches
        clear_caches()  # no path the parent's imports worked out survives
    os.dup2(2, 1)  # what a stage prints (the trainer's lines) is progress: the summary alone goes to stdout
    sys.stdout = sys.stderr  # also where sys.stdout is not file 1 (main called from another program)
    from mlperf_bert.fileio import write_json

    def save(partial, **more):
        if "graphs" in ctx:  # so far, also in what a stage stopped at its cap leaves
            more = dict(dict(graph_recordings=ctx["graphs"].counts(), cudagraph_skips=ctx["graphs"].skipped()),
                        **more)
        write_json(path, dict(partial, **more))
    status = 0
    try:
        import functools
        import torch
        if ctx["fv"].compile_backend != "inductor":
            real = torch.compile

            def compile_with(fn=None, *a, **k):  # the backend asked for; inductor's options dropped
                k.pop("options", None)
                k.pop("mode", None)
                k["backend"] = ctx["fv"].compile_backend
                return real(fn, *a, **k) if fn is not None else functools.partial(real, **k)
            torch.compile = compile_with
        from mlperf_bert.trainer.config import BertConfig
        ctx["device"] = pick_device(ctx["kind"])
        if ctx["device"].type == "cpu":  # as the trainer's CPU runs: a step's large blocks reused, not
            from mlperf_bert.trainer import cpu_memory  # faulted in again (a fifth of --tiny's CPU time)
            cpu_memory.keep_freed_memory()
        ctx["config"] = BertConfig.from_json_file(ctx["fv"].bert_config_file, ctx["fv"].max_seq_length)
        ctx["graphs"] = GraphRecordings()
        result = STAGE_FUNCTIONS[name](ctx, save)
        save(result, device=device_name(ctx["device"]))
    except BaseException as e:  # recorded for the parent; the next stage runs
        partial = {}
        with contextlib.suppress(Exception):
            partial = json.load(open(path))
        msg = str(e).splitlines()[0] if str(e) else ""
        save(partial, error="%s: %s" % (type(e).__name__, msg), traceback=traceback.format_exc()[-3000:])
        status = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def preload():
    """Import, once in the parent, what every stage imports (torch's compiler, the trainer): the
    forked stages share it instead of each importing it again on its own clock. No CUDA call."""
    import torch._inductor.cudagraph_trees  # noqa: F401
    from mlperf_bert.trainer import evaluation, memory_plan, packed_loader, preflight, training  # noqa: F401
    from mlperf_bert.trainer.model import BertForPreTraining  # noqa: F401


def stage_folders(ctx, name):
    """-> (folder, compile cache, TMPDIR) of a stage, under the check's work folder; its cache starts
    as a copy of the cache of the last stage that ended by itself (``ctx["compile_cache"]["last"]``)."""
    import shutil
    folder = tempfile.mkdtemp(prefix=name + "-", dir=ctx["work"])
    cache, tmp = os.path.join(folder, "inductor"), os.path.join(folder, "tmp")
    last = ctx.setdefault("compile_cache", {}).get("last")
    if last and os.path.isdir(last):
        shutil.copytree(last, cache, symlinks=True)
    else:
        os.makedirs(cache)
    os.makedirs(tmp)
    return folder, cache, tmp


def run_stage(name, ctx, cap):
    """Fork ``name`` under a time cap: -> its result, with "failed" where it failed or ran out of
    time. A stage killed at its cap (maybe in the middle of a compile: a 0-byte main.so, gcc's
    temporaries) has its compile cache and TMPDIR removed; a stage that ended by itself leaves its
    cache to the next."""
    import shutil
    path = os.path.join(ctx["work"], name + ".json")
    folder, cache, tmp = stage_folders(ctx, name)
    ctx = dict(ctx, cap=cap, deadline=time.time() + cap, cache_dir=cache, tmp_dir=tmp)
    sys.stdout.flush()
    sys.stderr.flush()
    t = time.time()
    pid = os.fork()
    if pid == 0:
        child(name, ctx, path)
    status, timed_out, usage = None, False, None
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            break
        if time.time() - t > cap:
            timed_out = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)  # the stage and its compile workers
            _, status, usage = os.wait4(pid, 0)
            break
        time.sleep(0.05)
    res = {}
    with contextlib.suppress(OSError, ValueError):
        res = json.load(open(path))
    res["seconds"] = time.time() - t
    res["cap_s"] = cap
    res["cpu_s"] = usage.ru_utime + usage.ru_stime if usage else None
    shutil.rmtree(tmp, ignore_errors=True)
    known = ctx["compile_cache"]
    if timed_out:  # what it was writing may be half written: nothing of it is kept
        shutil.rmtree(folder, ignore_errors=True)
    else:
        if known.get("last"):
            shutil.rmtree(os.path.dirname(known["last"]), ignore_errors=True)
        known["last"] = cache
    running = res.pop("running", None)
    if timed_out:
        res["failed"] = "out of time: killed at its cap of %.0f s%s; its compile cache and temporary files " \
                        "removed" % (cap, " during %s" % running if running else "")
    elif "error" in res:
        res["failed"] = res.pop("error") + (" (during %s)" % running if running else "")
    elif status is None or not os.WIFEXITED(status) or os.WEXITSTATUS(status):
        res["failed"] = "its process ended with status %s" % status
    return res


# ---------------------------------------------------------------- output

def ints(spec):
    return [int(x) for x in str(spec).split(",") if x.strip()]


def pick_device(kind):
    import torch
    if kind == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        return torch.device("cuda", 0)
    return torch.device(kind)


def fmt(x, spec="%.1f"):
    return "n/a" if x is None else spec % x


def graphs_text(counts):
    """Per-phase counts: the phases with some, then how many had none."""
    if not counts:
        return "-"
    if "note" in counts:
        return counts["note"]
    some = ["%s %d" % (k, v) for k, v in counts.items() if v]
    none = sum(1 for v in counts.values() if not v)
    return ", ".join(some + (["0 in %d %sphases" % (none, "other " if some else "")] if none else []))


def headline(name, r):
    """The summary table's figure of a stage."""
    if "failed" in r and not any(k in r for k in ("errors", "steps", "runs", "s_per_10k", "count", "status",
                                                   "seq_per_s", "note")):
        return "FAILED: " + r["failed"]
    tail = " (then FAILED: %s)" % r["failed"] if "failed" in r else ""
    if name == "packed":
        return "max relative error: " + ", ".join(
            "%s %.1e" % (d, max(e.values())) for d, e in r.get("errors", {}).items()) + tail
    if name == "full_depth":
        ok = [x for x in r.get("runs", []) if "rows_per_s" in x]
        if not ok:
            return "no run ended" + tail
        return "batch %d: %s%s" % (r["batch"], "; ".join(
            "%s %s %.1f rows/s = %.1f real seq/s (MFU %s, spread %.1f%%)" % (
                x["mode"], x["levers"], x["rows_per_s"], x["real_seq_per_s"],
                fmt(x["mfu"] and 100 * x["mfu"], "%.1f%%"), 100 * x["spread"]) for x in ok), tail)
    if name == "eager":
        ok = [x for x in r.get("steps", []) if "rows_per_s" in x]
        if not ok:
            return "no batch ran" + tail
        best = max(ok, key=lambda x: x["real_seq_per_s"])
        return "best %.1f real seq/s at batch %d (MFU %s); largest batch run %d%s" % (
            best["real_seq_per_s"], best["batch"], fmt(best["mfu"] and 100 * best["mfu"], "%.1f%%"),
            max(x["batch"] for x in ok), tail)
    if name == "levers":
        ok = [x for x in r.get("runs", []) if "speed_vs_plain" in x]
        if not ok:
            return "no lever ran" + tail
        best = max(ok, key=lambda x: x["rows_per_s"])
        plain = ", ".join("%s plain step's spread %.1f%%" % (x["mode"], 100 * x["spread"]) for x in r["runs"]
                          if x["levers"] == "plain" and "spread" in x)
        return "best: %s %s, %.2fx its plain step, loss %+.1e relative%s%s" % (
            best["mode"], best["levers"], best["speed_vs_plain"], best["loss_vs_plain"],
            "; " + plain if plain else "", tail)
    if name == "trainer":
        rate = (r.get("rates") or [{}])[-1]
        return "%s micro-steps with %s, %d evals, %d checkpoints, exit %s%s%s" % (
            r.get("micro_steps"), ",".join(r.get("levers", [])) or "no lever", r.get("evals", 0),
            len(r.get("checkpoints", [])), r.get("status"),
            "; logged at the end: %s rows/s, %s seq/s, MFU %s" % (
                fmt(rate.get("rows_per_s")), fmt(rate.get("seq_per_s")), fmt(rate.get("mfu") and 100 * rate["mfu"],
                                                                              "%.1f%%")) if rate else "", tail)
    if name == "eval":
        return ", ".join("batch %s: %s" % (b, fmt(s) if isinstance(s, float) else s)
                         for b, s in r.get("s_per_10k", {}).items()) + " s per 10,000" + tail
    if name == "hf":
        return (r["note"] if "note" in r else "%.1f seq/s at batch %d (MFU %s), peak %s GiB" % (
            r["seq_per_s"], r["batch"], fmt(r["mfu"] and 100 * r["mfu"], "%.1f%%"), fmt(r["peak_gib"]))) + tail
    if name == "syncs":
        return "%.2f per micro-step (%s)%s" % (r["per_step"], r["how"], tail) if "per_step" in r else tail
    return tail


# the model of the records written before a result named its own: they ran the default, BERT-Large
BERT_LARGE = {"hidden_size": 1024, "num_hidden_layers": 24}


def stage_model(res, name):
    """(hidden, layers, seq) of the model a stage of a result (or a record) ran."""
    st = res["stages"]
    d = st.get(name, {}).get("model") or (st.get("levers", {}).get("model") if name == "trainer" else None) or \
        res.get("model") or BERT_LARGE
    return d["hidden_size"], d["num_hidden_layers"], res["seq"]


def figures(res):
    """{key: value} of a result's (or a record's) figures, each key naming the stage, the model, the
    batch and what was measured, so that a record's figure is found by this run's key."""
    st, out = res["stages"], {}

    def put(key, row, names):
        for k in names:
            if isinstance(row.get(k), (int, float)) and not isinstance(row.get(k), bool):
                out[key + (k,)] = row[k]
    for dtype, e in st.get("packed", {}).get("errors", {}).items():
        put(("packed", stage_model(res, "packed"), dtype), e, ("loss", "logits", "grads"))
    fd = st.get("full_depth", {})
    for r in fd.get("runs", []):
        put(("full_depth", stage_model(res, "full_depth"), fd.get("batch"), r["mode"], r["levers"]), r,
            ("rows_per_s", "real_seq_per_s", "mfu", "spread", "warmup_peak_gib", "warmup_reserved_gib", "peak_gib",
             "reserved_gib", "compile_s", "speed_vs_plain"))
    for r in st.get("eager", {}).get("steps", []):
        put(("eager", stage_model(res, "eager"), r["batch"]), r, ("rows_per_s", "real_seq_per_s", "mfu", "peak_gib"))
    lv = st.get("levers", {})
    for r in lv.get("runs", []):
        put(("levers", stage_model(res, "levers"), lv["model"]["batch"], r["mode"], r["levers"]), r,
            ("rows_per_s", "speed_vs_plain", "spread", "peak_gib"))
    tr = st.get("trainer", {})
    if tr.get("rates"):
        put(("trainer", stage_model(res, "trainer"), tr["batch"], ",".join(tr["levers"])), tr["rates"][-1],
            RATE_KEYS)
    for b, v in st.get("eval", {}).get("s_per_10k", {}).items():
        put(("eval", stage_model(res, "eval"), b), {"s_per_10k": v}, ("s_per_10k",))
    sy = st.get("syncs", {})
    if "per_step" in sy:
        put(("syncs", stage_model(res, "syncs"), sy["batch"]), sy, ("per_step",))
    hf = st.get("hf", {})
    if "seq_per_s" in hf:
        put(("hf", stage_model(res, "hf"), hf["batch"]), hf, ("seq_per_s", "mfu", "peak_gib"))
    return out


def references(folder):
    """The records of ``folder`` (docs/gpu/*.json, gpu_check's JSONs): [(label, figures)], in the
    order they ran; label: the GPU's model (H100, H200, ...) and the run's UTC date."""
    import glob
    out = []
    for path in glob.glob(os.path.join(folder, "*.json")) if folder else ():
        try:
            with open(path) as f:
                rec = json.load(f)
            gpu = re.search(r"\b[A-Z]+\d{2,4}[A-Za-z]?\b", rec.get("device") or "")
            label = "%s %s" % (gpu.group(0) if gpu else rec.get("device") or rec["kind"],
                               time.strftime("%Y-%m-%d", time.gmtime(rec["started"])))
            out.append((rec["started"], label, figures(rec)))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue  # not a record of this tool
    return [x[1:] for x in sorted(out)]


def with_reference(refs, key, value, spec="%.1f", unit=""):
    """``value`` as ``spec`` with its ``unit``, and beside it each record's value of the same figure:
    "319.0 real seq/s (H100 2026-11-27: 319.0)"; runs of one day: "(H100 2026-11-27: 2505.6, 1864.7)"."""
    text = fmt(value, spec) + unit
    seen = {}
    for label, figs in refs:
        if key in figs:
            seen.setdefault(label, []).append(spec % figs[key])
    return text + (" (%s)" % "; ".join("%s: %s" % (k, ", ".join(v)) for k, v in seen.items()) if seen else "")


def tables(res, refs=()):
    """The summary table first, then the stages' details, as markdown; beside each figure, the
    records' (``refs``: ``references``)."""
    st = res["stages"]

    def ref(key, value, spec="%.1f", unit=""):
        return with_reference(refs, key, value, spec, unit)
    pct = "%.1f%%"

    def ref_pct(key, value):  # a share, printed in percent
        return with_reference([(label, {k: 100 * v for k, v in figs.items() if k == key}) for label, figs in refs],
                              key, value and 100 * value, pct)

    def ratio(key, value):
        return " (%s)" % ref(key, value, "%.2fx", " plain")
    lines = ["# gpu_check: %s, torch %s" % (res.get("device") or res["kind"], res["torch"]), "",
             "Budget %d s, used %.0f s. Data: %d seq-%d records, %.2f sequences a packed row." % (
                 res["budget_s"], res["seconds"], res["records"], res["seq"], res["packing_rate"]), ""]
    if res.get("planned_caps"):
        lines += ["Stage caps, planned before the first stage: %s s (time a stage leaves goes to the later "
                  "ones)." % ", ".join("%s %.0f" % x for x in res["planned_caps"].items()), ""]
    if refs:
        lines += ["Beside a figure, in parentheses: the same figure in the records of docs/gpu/ (GPU, date).", ""]
    lines += ["| stage | result | s (cap), CPU s | CUDA-graph recordings | CUDA graphs skipped |",
              "|---|---|---|---|---|"]
    for name in res["order"]:
        r = st.get(name)
        if r is None:
            lines.append("| %s | not run: %s | - | - | - |" % (name, res["not_run"].get(name, "not asked")))
            continue
        lines.append("| %s | %s | %.0f (%.0f), %s | %s | %s |" % (
            name, headline(name, r).replace("|", "/"), r["seconds"], r["cap_s"], fmt(r["cpu_s"], "%.0f"),
            graphs_text(r.get("graph_recordings")), graphs_text(
                {k: len(v) for k, v in r.get("cudagraph_skips", {}).items()})))
    lines += ["", "## Details", "", "| what | figure |", "|---|---|"]
    for dtype, e in st.get("packed", {}).get("errors", {}).items():
        k = ("packed", stage_model(res, "packed"), dtype)
        lines.append("| packed vs unpacked, %s (relative) | loss %s, logits %s, gradients (L2) %s |" % (
            dtype, ref(k + ("loss",), e["loss"], "%.1e"), ref(k + ("logits",), e["logits"], "%.1e"),
            ref(k + ("grads",), e["grads"], "%.1e")))
    fd = st.get("full_depth", {})
    for r in fd.get("runs", []):
        h, layers, seq = stage_model(res, "full_depth")
        what = "| full depth (hidden %d, %d layers), %s %s, packed, batch %d, %d x %d timed steps | " % (
            h, layers, r["mode"], r["levers"], fd["batch"], fd["windows"], fd["steps"])
        if "rows_per_s" not in r:
            lines.append(what + "FAILED: %s |" % r["failed"].replace("|", "/"))
            continue
        k = ("full_depth", (h, layers, seq), fd["batch"], r["mode"], r["levers"])
        lines.append(what + (
            "%s%s = %s, MFU %s; windows %s rows/s, spread %s; peak allocated / reserved: warm-up %s / %s, "
            "timed %s / %s; first 2 steps %.1f s, compile %s |") % (
            ref(k + ("rows_per_s",), r["rows_per_s"], unit=" rows/s"),
            ratio(k + ("speed_vs_plain",), r["speed_vs_plain"]) if "speed_vs_plain" in r else "",
            ref(k + ("real_seq_per_s",), r["real_seq_per_s"], unit=" real seq/s"), ref_pct(k + ("mfu",), r["mfu"]),
            " / ".join("%.1f" % x for x in r["windows"]), ref_pct(k + ("spread",), r["spread"]),
            ref(k + ("warmup_peak_gib",), r["warmup_peak_gib"], unit=" GiB"),
            ref(k + ("warmup_reserved_gib",), r["warmup_reserved_gib"], unit=" GiB"),
            ref(k + ("peak_gib",), r["peak_gib"], unit=" GiB"),
            ref(k + ("reserved_gib",), r["reserved_gib"], unit=" GiB"),
            r["first_steps_s"], ref(k + ("compile_s",), r["compile_s"], "%.0f", " s") if r["compile_s"] is not None
            else "-"))
    for x, why in fd.get("refused", {}).items():
        lines.append("| full depth: %s | refused: %s |" % (x, why.replace("|", "/")))
    for r in st.get("eager", {}).get("steps", []):
        if r.get("oom") or r.get("skipped"):
            lines.append("| Trainer.step eager, packed, batch %d | %s |" % (
                r["batch"], "out of memory" if r.get("oom") else r["skipped"]))
            continue
        k = ("eager", stage_model(res, "eager"), r["batch"])
        lines.append("| Trainer.step eager, packed, batch %d | %s = %s, %s TFLOP/s, MFU %s, peak %s "
                     "(plan %.1f GiB) |" % (
            r["batch"], ref(k + ("rows_per_s",), r["rows_per_s"], unit=" rows/s"),
            ref(k + ("real_seq_per_s",), r["real_seq_per_s"], unit=" real seq/s"), fmt(r["tflops"], "%.0f"),
            ref_pct(k + ("mfu",), r["mfu"]), ref(k + ("peak_gib",), r["peak_gib"], unit=" GiB"), r["plan_gib"]))
    lv = st.get("levers", {})
    if "model" in lv:
        m = lv["model"]
        for r in lv.get("runs", []):
            what = "| lever %s, %s (hidden %d, %d layers, batch %d, %d steps) | " % (
                r["levers"], r["mode"], m["hidden_size"], m["num_hidden_layers"], m["batch"], m["steps"])
            k = ("levers", stage_model(res, "levers"), m["batch"], r["mode"], r["levers"])
            if "rows_per_s" in r:
                lines.append(what + "%s%s%s, peak %s, loss %.4f%s; first 2 steps %.1f s |" % (
                    ref(k + ("rows_per_s",), r["rows_per_s"], unit=" rows/s"),
                    ratio(k + ("speed_vs_plain",), r["speed_vs_plain"]) if "speed_vs_plain" in r else "",
                    "; windows %s, spread %s" % (" / ".join("%.1f" % x for x in r["windows"]),
                                                 ref_pct(k + ("spread",), r["spread"])) if "windows" in r else "",
                    ref(k + ("peak_gib",), r["peak_gib"], unit=" GiB"), r["loss"],
                    " (%+.1e relative to plain)" % r["loss_vs_plain"] if "loss_vs_plain" in r else "",
                    r["first_steps_s"]))
            else:
                lines.append(what + "%s |" % ("refused: " + r["refused"] if "refused" in r else
                                               "FAILED: " + r["failed"] if "failed" in r else r.get("skipped", ""))
                             .replace("|", "/"))
    tr = st.get("trainer", {})
    if "status" in tr:
        lines.append("| trainer end to end (--compile %s), batch %d | %d micro-steps in %.1f s, evals %s s, "
                     "eval accuracy %s, checkpoints %s |" % (
                         " ".join("--" + x for x in tr["levers"]), tr["batch"], tr["micro_steps"], tr["seconds"],
                         ", ".join("%.2f" % s for s in tr["eval_s"]), tr["eval_accuracy"],
                         ", ".join(tr["checkpoints"])))
        k = ("trainer", stage_model(res, "trainer"), tr["batch"], ",".join(tr["levers"]))
        for i, r in enumerate(tr.get("rates", [])):
            last = i == len(tr["rates"]) - 1  # the records' figure is their last interval's
            lines.append("| trainer's logged rates, interval to step %s | %s, %s, MFU %s |" % (
                r.get("step"), ref(k + ("rows_per_s",), r.get("rows_per_s"), unit=" rows/s") if last else
                fmt(r.get("rows_per_s")) + " rows/s",
                ref(k + ("seq_per_s",), r.get("seq_per_s"), unit=" seq/s") if last else
                fmt(r.get("seq_per_s")) + " seq/s",
                ref_pct(k + ("mfu",), r.get("mfu")) if last else fmt(r.get("mfu") and 100 * r["mfu"], pct)))
        for x, why in tr.get("refused", {}).items():
            lines.append("| trainer: --%s | refused: %s |" % (x, why.replace("|", "/")))
    if "s_per_10k" in st.get("eval", {}):
        lines.append("| eval, s per 10,000 samples, per-GPU eval batch | %s |" % ", ".join(
            "%s: %s" % (b, ref(("eval", stage_model(res, "eval"), b, "s_per_10k"), s) if isinstance(s, float) else s)
            for b, s in st["eval"]["s_per_10k"].items()))
    sy = st.get("syncs", {})
    if "count" in sy:
        lines.append("| host syncs per micro-step (%s) | %s (%d over %d) |" % (
            sy["how"], ref(("syncs", stage_model(res, "syncs"), sy["batch"], "per_step"), sy["per_step"], "%.2f"),
            sy["count"], sy["steps"]))
        for i, x in enumerate(sy.get("syncs", [])):
            lines.append("| host sync %d: %s | %s |" % (i + 1, x["what"], " < ".join(reversed(x["stack"][-4:]))
                                                        or x.get("at", "-")))
    hf = st.get("hf", {})
    if "seq_per_s" in hf:
        k = ("hf", stage_model(res, "hf"), hf["batch"])
        lines.append("| Hugging Face BertForPreTraining, eager, unpacked, batch %d | %s, MFU %s, peak %s |" % (
            hf["batch"], ref(k + ("seq_per_s",), hf["seq_per_s"], unit=" seq/s"), ref_pct(k + ("mfu",), hf["mfu"]),
            ref(k + ("peak_gib",), hf["peak_gib"], unit=" GiB")))
    proj = res.get("projection", {})
    if "note" in proj:
        lines.append("| projected time to train | %s |" % proj["note"])
    for gpus, p in proj.items() if "note" not in proj else ():
        if "note" in p:
            lines.append("| projected time to train, %s GPUs | %s |" % (gpus, p["note"]))
            continue
        lines.append("| projected time to train, %s GPUs | global batch %d (%d x %d a GPU x %d micro-steps): "
                     "%.0f samples at %.0f real seq/s a GPU: train %.0f s + %d evals %.0f s = %.0f s |" % (
                         gpus, p["global_batch"], int(gpus), p["per_gpu_batch"], p["accumulation"], p["samples"],
                         p["real_seq_per_s_per_gpu"], p["train_s"], p["evals"], p["eval_s"], p["total_s"]))
    for n in res["order"]:
        for phase, skips in st.get(n, {}).get("cudagraph_skips", {}).items():
            for x in skips:
                lines.append("| CUDA graphs skipped (%s, %s) | %s; at %s |" % (
                    n, phase, x["reason"], " < ".join(reversed(x["at"][-3:])) or "-"))
    failed = [(n, st[n]) for n in res["order"] if n in st and "failed" in st[n] and "traceback" in st[n]]
    for n, r in failed:
        lines += ["", "## %s failed" % n, "", "```", r["traceback"].strip(), "```"]
    return "\n".join(lines)


def projection(fv, eager, evals, kind):
    """Per GPU count, the RCP global batch with the shortest projected time, or a note (on a CPU:
    a time to train on GPUs at a CPU's rate would read as a GPU's)."""
    if kind != "cuda":
        return {"note": "not measured on a GPU (this run: %s): none projected" % kind}
    try:
        import mlperf_logging  # noqa: F401
    except ImportError:
        return {"note": "skipped: mlperf_logging is not installed (the RCPs are its rcps_bert.json)"}
    from mlperf_bert.harness import rcp
    from mlperf_bert.harness.mlperf_log import eval_frequency
    from mlperf_bert.trainer.memory_plan import MAX_PER_GPU_BATCH
    rates = sorted((r["batch"], r["real_seq_per_s"]) for r in eager if "real_seq_per_s" in r)
    if not rates:
        return {"note": "no eager rate measured"}
    measured = [s for s in evals.values() if isinstance(s, float)]
    eval_s = min(measured) if measured else 0.0  # a GPU's seconds per 10,000 eval samples
    out = {}
    for gpus in ints(fv.gpus):
        best = None
        for batch, samples in sorted(rcp.samples_to_converge().items()):
            if batch % gpus:
                continue
            n = rcp.accumulation(batch, gpus, MAX_PER_GPU_BATCH)
            micro = batch // (gpus * n)
            rate = ([r for b, r in rates if b <= micro] or [rates[0][1]])[-1]
            train_s = samples / (gpus * rate)
            evals_n = math.ceil(samples / eval_frequency(batch))
            total_eval = evals_n * eval_s / gpus
            row = {"global_batch": batch, "accumulation": n, "per_gpu_batch": micro, "samples": samples,
                   "real_seq_per_s_per_gpu": rate, "train_s": train_s, "evals": evals_n, "eval_s": total_eval,
                   "total_s": train_s + total_eval}
            if best is None or row["total_s"] < best["total_s"]:
                best = row
        out[str(gpus)] = best or {"note": "no RCP global batch divides %d GPUs" % gpus}
    return out


def write(fv, res, refs):
    """gpu_check.json and .md as they stand (after each stage); ``refs``: references(fv.references)."""
    from mlperf_bert.fileio import atomic_open, write_json
    res["seconds"] = time.time() - res["started"]
    text = tables(res, refs)
    write_json(fv.json, dict(res, markdown=text), indent=1)
    with atomic_open(fv.markdown or os.path.splitext(fv.json)[0] + ".md", "w") as f:
        f.write(text + "\n")
    return text


def planned_caps(order, seconds):
    """{stage: cap}: ``seconds`` shared by the stages of ``order`` in proportion to SHARE."""
    return {n: seconds * SHARE[n] / sum(SHARE[m] for m in order) for n in order}


def main(argv):
    from mlperf_bert.errors import UserError
    fv = define()
    _data.parse(fv, argv, _data.doc(__file__))
    order = [s.strip() for s in fv.stages.split(",") if s.strip()]
    if set(order) - set(STAGES):
        raise UserError("--stages: unknown %s; the stages are %s" % (
            ", ".join(sorted(set(order) - set(STAGES))), ", ".join(STAGES)))
    started = time.time()
    # CUDA must not start in this process (its stages are forked from it): where torch asks whether
    # there is a GPU (its compiler's imports do), NVML answers, not the CUDA runtime
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    check_dependencies()
    chosen_levers(fv), chosen_levers(fv, "lever_all")  # an unknown lever is refused before anything runs
    for name in ("batches", "gpus") + (("eval_batches",) if fv.eval_batches.strip() else ()):
        _data.counts(name, fv[name].value)  # so is a batch of 0 (it looped forever) or a GPU count of 0
    from mlperf_bert.fileio import check_writable_dir
    for path in (fv.json, fv.markdown or os.path.splitext(fv.json)[0] + ".md"):
        check_writable_dir(path)  # and an output it cannot write (refused after the first stage's minutes)
    import shutil
    import torch
    work = tempfile.mkdtemp(prefix="gpu_check_")
    try:
        kind = resolve(fv, work)
        records_path, recs = make_records(fv, work)
        packed_file, packing_rate = pack(fv, records_path, work)
        res = {"torch": torch.__version__, "budget_s": fv.budget_s, "records": len(recs), "seq": fv.max_seq_length,
               "packing_rate": packing_rate, "order": order, "kind": kind, "stages": {}, "not_run": {},
               "started": started}
        print("gpu_check: %d records, %.3f sequences a row, data ready in %.0f s; stages %s within %d s" % (
            len(recs), packing_rate, time.time() - started, ", ".join(order), fv.budget_s), file=sys.stderr,
            flush=True)
        preload()
        res["planned_caps"] = planned_caps(order, fv.budget_s - (time.time() - started) - 3)
        print("gpu_check: stage caps (s): %s (each stage's share if every earlier one uses all of its own; "
              "time a stage leaves goes to the later ones)" % ", ".join(
                  "%s %.0f" % (n, c) for n, c in res["planned_caps"].items()), file=sys.stderr, flush=True)
        from mlperf_bert.trainer.config import BertConfig
        config = BertConfig.from_json_file(fv.bert_config_file, fv.max_seq_length)
        res["model"] = {"hidden_size": config.hidden_size, "num_hidden_layers": config.num_hidden_layers}
        ctx = {"fv": fv, "kind": kind, "work": work, "lever_config": lever_config(fv, work, fv.lever_layers),
               "trainer_config": lever_config(fv, work, fv.trainer_layers, "trainer_config.json"), "recs": recs,
               "packed_file": packed_file,
               "packing_rate": packing_rate}
        refs = references(fv.references)  # docs/gpu's records, read once
        for i, name in enumerate(order):
            left = fv.budget_s - (time.time() - started) - 3  # 3 s to write the outputs
            if left < 2:
                res["not_run"][name] = "out of the budget"
                continue
            cap = planned_caps(order[i:], left)[name]
            r = run_stage(name, ctx, cap)
            res["stages"][name] = r
            res["device"] = res.get("device") or r.get("device")
            print("gpu_check: %s: %s (%.0f s of %.0f)" % (name, headline(name, r), r["seconds"], cap),
                  file=sys.stderr, flush=True)
            write(fv, res, refs)
        if not res["stages"]:  # (a record of nothing, exit 0, read as a check that passed)
            raise UserError("--budget_s=%d left no time for any stage (%.0f s went to reading the records and "
                            "packing them): give more seconds (the default: 420)" % (fv.budget_s, time.time() - started))
        res["projection"] = projection(fv, res["stages"].get("eager", {}).get("steps", []),
                                       res["stages"].get("eval", {}).get("s_per_10k", {}), kind)
        text = write(fv, res, refs)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(text)
    print("gpu_check: %.0f s of a %d s budget; %s and %s" % (
        res["seconds"], fv.budget_s, fv.json, fv.markdown or os.path.splitext(fv.json)[0] + ".md"))
    return 0


if __name__ == "__main__":
    from mlperf_bert.cli import run_main
    run_main(main)
