"""One GPU check: what a GPU does with this trainer, in one table and one JSON (about 5 minutes on an H100).

Usage: python bench/gpu_check.py [--json=gpu_check.json] [--bert_config_file=configs/bert_config_large.json]
         [--input_file=S512_TFRECORD] [--records=3000] [--batches=24,48,64,96,128,160,192]
         [--compile_batches=96] [--hf_batch=24] [--eval_batches=1,8,256] [--steps=10] [--nocompile]
         [--compile_backend=inductor] [--device=auto]

On a GPU machine without mlperf-logging and crc32c (the trainer and the TFRecord reader import
them), install their wheels first; without transformers the Hugging Face row is skipped.

Without --input_file it makes its own seq-512 records: create_pretraining_data.py on tests/data's
golden input shard part-00000 (the reference's golden s512 command, dupe factor 10), the first
--records of them; they are packed (up to 3 sequences a row) by the ``pack`` command's code.
BERT-Large, seq 512/76, bf16 autocast, LAMB, one GPU (no DDP). Rows, in order:

- packed against unpacked (the model in eval mode, 12 sequences): loss, MLM logits and gradients,
  fp32 and bf16 (on a GPU, bf16 packed rows run FlashAttention's variable-length kernel);
- the trainer's own step (``Trainer.step``: forward, backward, clipping, LAMB), eager, on packed
  rows, for each --batches until the GPU runs out of memory: rows/s, real sequences/s, MFU (CUDA,
  989 TFLOP/s for H100/H200 bf16), peak memory (max_memory_allocated) and the memory plan's
  prediction (mlperf_bert/trainer/memory_plan.py) beside it;
- ``--compile``: the trainer with ``--compile`` at --compile_batches, in a fresh process twice on
  one compile cache (TORCHINDUCTOR_CACHE_DIR): compile seconds cold and warm (its first two
  steps), then its rate and peak;
- Hugging Face ``BertForPreTraining`` (bench/train_throughput.py's), unpacked, at --hf_batch, with
  no other model resident (skipped, with a note, without transformers);
- eval seconds per 10,000 samples (``evaluation.evaluate``) at each per-GPU --eval_batches:
  reference_gpu's (--eval_batch_size=8 over 8 GPUs: 1), the trainer's default on one GPU, 256;
- host syncs per micro-step over --steps eager micro-steps: torch.cuda.set_sync_debug_mode
  warnings on CUDA; on a CPU the Tensor read-backs (.item(), .cpu(), ...) are counted instead;
- projected time to train on 8 and 64 GPUs: for each reference convergence point's global batch
  (mlperf_logging's rcps_bert.json: the mean samples to converge of its runs), split by the memory
  plan's MAX_PER_GPU_BATCH, at the measured eager real sequences/s (this data's packing rate) of
  the nearest swept batch at or below the per-GPU micro-batch, scaled linearly with the GPUs (no
  all-reduce cost: not measured), plus the evals (eval_10k every eval_frequency samples, at the
  fastest measured eval batch) and, apart, the start-up (the warm compile). The global batch with
  the shortest total is shown. Skipped, with a note, without mlperf_logging.

Run in the tests on a CPU with a tiny config (tests/test_gpu_check.py); a figure the machine
cannot give (peak memory, MFU on a CPU) is written "n/a".
"""
import contextlib
import gc
import itertools
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import _data  # noqa: E402

ROOT = _data.ROOT
GIB = 2.0 ** 30
READBACKS = ("item", "cpu", "tolist", "numpy", "__bool__", "__int__", "__float__", "nonzero")


def define():
    from mlperf_bert import flags
    fv = flags.FlagValues()
    S, I, B = flags.DEFINE_string, flags.DEFINE_integer, flags.DEFINE_bool
    S("json", "gpu_check.json", "where the JSON goes", flag_values=fv)
    S("bert_config_file", os.path.join(ROOT, "configs", "bert_config_large.json"), "model config", flag_values=fv)
    S("input_file", None, "seq-512 TFRecord (default: made from tests/data's golden input)", flag_values=fv)
    I("records", 3000, "records of the input used", flag_values=fv)
    I("max_seq_length", 512, "sequence length", flag_values=fv)
    I("max_predictions_per_seq", 76, "masked positions", flag_values=fv)
    S("batches", "24,48,64,96,128,160,192", "per-GPU batches (packed rows) of the eager sweep", flag_values=fv)
    S("compile_batches", "96", "per-GPU batches of the --compile runs", flag_values=fv)
    B("compile", True, "time the trainer with --compile (cold and warm)", flag_values=fv)
    S("compile_backend", "inductor", "torch.compile backend (aot_eager: the CPU test)", flag_values=fv)
    I("hf_batch", 24, "batch of the Hugging Face comparison (0: none)", flag_values=fv)
    S("eval_batches", "", "per-GPU eval batches (default: 1, the trainer's default, 256)", flag_values=fv)
    I("eval_samples", 1000, "eval samples timed at each eval batch", flag_values=fv)
    I("steps", 10, "timed micro-steps (after 2 warm-up steps)", flag_values=fv)
    S("gpus", "8,64", "GPU counts of the projection", flag_values=fv)
    flags.DEFINE_enum("device", "auto", ["auto", "cpu", "cuda"], "device", flag_values=fv)
    S("probe_compile", None, "(internal) one --compile run in this process at these batches", flag_values=fv)
    S("packed_file", None, "(internal) the packed rows", flag_values=fv)
    return fv


# ---------------------------------------------------------------- data

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


# ---------------------------------------------------------------- pieces

def trainer(fv, config, device, b, compile=False):
    from mlperf_bert.trainer import training
    tf = training.define_flags()
    tf(["x", "--bert_config_file=" + fv.bert_config_file, "--input_file=unused", "--output_dir=unused",
        "--train_batch_size=%d" % b, "--max_seq_length=%d" % fv.max_seq_length, "--dtype=bf16",
        "--max_predictions_per_seq=%d" % fv.max_predictions_per_seq, "--optimizer=lamb", "--learning_rate=1e-4",
        "--num_train_steps=100000", "--num_warmup_steps=10"] + (["--compile"] if compile else []))
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


def peak_gib(device):
    import torch
    return torch.cuda.max_memory_allocated() / GIB if device.type == "cuda" else None


def run_steps(tr, batches, steps, device, first=0, window=None):
    """-> (seconds, real sequences) of ``steps`` micro-steps from micro-step ``first``; ``window``:
    a context around the micro-steps alone (the host syncs' count)."""
    picked = [batches[(first + i) % len(batches)] for i in range(steps)]
    seqs = sum(int(b["global_sequences"]) for b in picked)  # host-side counts, read before the clock
    picked = [{k: v for k, v in b.items() if k != "global_sequences"} for b in picked]
    sync(device)
    t = time.perf_counter()
    with window or contextlib.nullcontext():
        for i, batch in enumerate(picked):
            tr.step(batch, first + i)
    sync(device)
    return time.perf_counter() - t, seqs


def on_device(batches, device):
    """The batches as the loader hands them over: pinned host memory on CUDA."""
    return [{k: v.pin_memory() if device.type == "cuda" else v for k, v in b.items()} for b in batches]


def step_row(fv, config, device, b, batches, tr, plan, peak_tflops, flops_per_row, t, seqs):
    rows = b * fv.steps / t
    return {"batch": b, "rows_per_s": rows, "real_seq_per_s": seqs / t,
            "mfu": flops_per_row * rows / 1e12 / peak_tflops if peak_tflops else None,
            "peak_gib": peak_gib(device), "plan_gib": plan.peak(b) / GIB}


def is_oom(e):
    """CUDA's out-of-memory error, or cuBLAS failing to allocate its workspace at the limit."""
    return "out of memory" in str(e).lower() or "ALLOC_FAILED" in str(e)


def equivalence(fv, config, recs, device):
    """Packed against unpacked on 12 real sequences: {dtype: {loss, logits, grads}} relative errors."""
    import numpy as np
    import torch
    from mlperf_bert.dataset import packing
    from mlperf_bert.dataset.example import decode_pretraining_batch
    from mlperf_bert.trainer import training
    from mlperf_bert.trainer.model import BertForPreTraining
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
    return out


def count_syncs(fv, tr, batches, device):
    """Host syncs over --steps micro-steps: CUDA's sync debug mode, or the CPU's read-backs."""
    import torch
    if device.type == "cuda":
        @contextlib.contextmanager
        def window():
            torch.cuda.set_sync_debug_mode("warn")
            try:
                yield
            finally:
                torch.cuda.set_sync_debug_mode(0)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run_steps(tr, batches, fv.steps, device, first=1000, window=window())
        return sum("synchroniz" in str(w.message).lower() for w in caught), "torch.cuda.set_sync_debug_mode"
    calls = []

    @contextlib.contextmanager
    def window():
        saved = {name: getattr(torch.Tensor, name) for name in READBACKS}
        for name, real in saved.items():
            def counted(self, *a, _real=real, **k):
                calls.append(1)
                return _real(self, *a, **k)
            setattr(torch.Tensor, name, counted)
        try:
            yield
        finally:
            for name, real in saved.items():
                setattr(torch.Tensor, name, real)
    run_steps(tr, batches, fv.steps, device, first=1000, window=window())
    return len(calls), "Tensor read-backs (CPU)"


def eval_rate(fv, config, recs, device, b):
    """Seconds per 10,000 eval samples at per-GPU eval batch ``b`` (eager)."""
    import torch
    from mlperf_bert.dataset import tfrecord
    from mlperf_bert.trainer import evaluation, loader, training
    from mlperf_bert.trainer.model import BertForPreTraining
    n = min(fv.eval_samples, len(recs)) // b * b
    with tempfile.NamedTemporaryFile(suffix=".tfrecord") as f:
        tfrecord.write_records(f.name, recs[-n:])
        batches = [{k: v.to(device) for k, v in x.items()} for x in
                   loader.PretrainingBatches([f.name], fv.max_seq_length, fv.max_predictions_per_seq, b,
                                             shuffle=False, repeat=False)]
    torch.manual_seed(0)
    model = BertForPreTraining(config).to(device)
    autocast = training.autocast(device, "bf16")
    evaluation.evaluate(model, batches[:2], device, autocast)  # warm-up
    sync(device)
    t = time.perf_counter()
    metrics = evaluation.evaluate(model, batches, device, autocast)
    sync(device)
    return (time.perf_counter() - t) / metrics["samples"] * 10000


def hugging_face(fv, config, recs, device, flops_per_row, peak_tflops):
    import torch
    from mlperf_bert.trainer import loader, training
    import train_throughput
    try:
        import transformers  # noqa: F401
    except ImportError:
        return {"note": "skipped: transformers is not installed"}
    b = fv.hf_batch
    with tempfile.NamedTemporaryFile(suffix=".tfrecord") as f:
        from mlperf_bert.dataset import tfrecord
        tfrecord.write_records(f.name, recs[:4 * b])
        batches = [{k: v.to(device) for k, v in x.items()} for x in
                   loader.PretrainingBatches([f.name], fv.max_seq_length, fv.max_predictions_per_seq, b,
                                             shuffle=False, repeat=False)]
    reset_memory(device)
    model, step = train_throughput.huggingface(config, device, training.autocast(device, "bf16"))
    t = train_throughput.timed(step, batches, device, fv.steps, warmup=2)
    rate = b * fv.steps / t
    out = {"batch": b, "seq_per_s": rate, "peak_gib": peak_gib(device),
           "mfu": flops_per_row * rate / 1e12 / peak_tflops if peak_tflops else None}
    del model, step
    return out


def probe_compile(fv):
    """(internal, a fresh process) the trainer with --compile at each batch: compile s, rate, peak."""
    import functools
    import torch
    from mlperf_bert.trainer.config import BertConfig
    if fv.compile_backend != "inductor":
        torch.compile = functools.partial(torch.compile, backend=fv.compile_backend)
    device = pick_device(fv)
    config = BertConfig.from_json_file(fv.bert_config_file, fv.max_seq_length)
    out = []
    for b in ints(fv.probe_compile):
        batches = on_device(packed_rows(fv.packed_file, b, 4), device)
        reset_memory(device)
        try:
            tr = trainer(fv, config, device, b, compile=True)
            t0, _ = run_steps(tr, batches, 2, device)  # compiles the step and the update
            t, seqs = run_steps(tr, batches, fv.steps, device, first=2)
            out.append({"batch": b, "compile_s": t0, "rows_per_s": b * fv.steps / t, "real_seq_per_s": seqs / t,
                        "peak_gib": peak_gib(device)})
            del tr
        except RuntimeError as e:
            if not is_oom(e):
                raise
            out.append({"batch": b, "oom": True})
            break
    print(json.dumps(out))
    return 0


def compiled(fv, packed_file, work):
    """Two fresh processes on one compile cache: [(cold runs), (warm runs)]."""
    cache = os.path.join(work, "compile_cache")
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache, TRITON_CACHE_DIR=os.path.join(cache, "triton"))
    args = [sys.executable, os.path.abspath(__file__), "--probe_compile=" + fv.compile_batches,
            "--packed_file=" + packed_file] + [
        "--%s=%s" % (k, fv[k].value) for k in ("bert_config_file", "max_seq_length", "max_predictions_per_seq",
                                                "steps", "device", "compile_backend")]
    runs = []
    for _ in ("cold", "warm"):
        p = subprocess.run(args, env=env, capture_output=True, text=True)
        if p.returncode:
            raise SystemExit("gpu_check: the --compile run failed:\n" + p.stderr[-3000:])
        runs.append(json.loads(p.stdout.strip().splitlines()[-1]))
    return runs


def projection(fv, steps_rows, evals, startup_s):
    """Per GPU count, the RCP global batch with the shortest projected time, or a note."""
    try:
        import mlperf_logging  # noqa: F401
    except ImportError:
        return {"note": "skipped: mlperf_logging is not installed (the RCPs are its rcps_bert.json)"}
    from mlperf_bert.harness import rcp
    from mlperf_bert.harness.mlperf_log import eval_frequency
    from mlperf_bert.trainer.memory_plan import MAX_PER_GPU_BATCH
    rates = sorted((r["batch"], r["real_seq_per_s"]) for r in steps_rows if "real_seq_per_s" in r)
    eval_s = min(evals.values()) if evals else 0.0  # a GPU's seconds per 10,000 eval samples
    out = {}
    for gpus in ints(fv.gpus):
        best = None
        for batch, samples in sorted(rcp.samples_to_converge().items()):
            if batch % gpus or not rates:
                continue
            n = rcp.accumulation(batch, gpus, MAX_PER_GPU_BATCH)
            micro = batch // (gpus * n)
            rate = ([r for b, r in rates if b <= micro] or [rates[0][1]])[-1]
            train_s = samples / (gpus * rate)
            evals_n = math.ceil(samples / eval_frequency(batch))
            total_eval = evals_n * eval_s / gpus
            row = {"global_batch": batch, "accumulation": n, "per_gpu_batch": micro, "samples": samples,
                   "real_seq_per_s_per_gpu": rate, "train_s": train_s, "evals": evals_n, "eval_s": total_eval,
                   "startup_s": startup_s, "total_s": train_s + total_eval}
            if best is None or row["total_s"] < best["total_s"]:
                best = row
        out[str(gpus)] = best or {"note": "no RCP global batch divides %d GPUs" % gpus}
    return out


# ---------------------------------------------------------------- main

def ints(spec):
    return [int(x) for x in str(spec).split(",") if x.strip()]


def pick_device(fv):
    import torch
    kind = fv.device if fv.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if kind == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    return torch.device(kind, 0) if kind == "cuda" else torch.device(kind)


def fmt(x, spec="%.1f"):
    return "n/a" if x is None else spec % x


def table(res):
    lines = ["| what | figure |", "|---|---|", "| device | %s, torch %s |" % (res["device"], res["torch"]),
             "| data | %d seq-%d records, %.2f sequences a packed row |" % (
                 res["records"], res["seq"], res["packing_rate"])]
    for dtype, e in res["packed_vs_unpacked"].items():
        lines.append("| packed vs unpacked, %s (relative) | loss %.1e, logits %.1e, gradients %.1e (L2) |"
                     % (dtype, e["loss"], e["logits"], e["grads"]))
    for r in res["eager_steps"]:
        if r.get("oom"):
            lines.append("| Trainer.step eager, packed, batch %d | out of memory |" % r["batch"])
            continue
        lines.append("| Trainer.step eager, packed, batch %d | %.1f rows/s = %.1f real seq/s, MFU %s, peak %s GiB "
                     "(plan %.1f GiB) |" % (r["batch"], r["rows_per_s"], r["real_seq_per_s"],
                                           fmt(r["mfu"] and 100 * r["mfu"], "%.1f%%"), fmt(r["peak_gib"]),
                                           r["plan_gib"]))
    if "compiled" in res:
        cold, warm = res["compiled"]
        for c, w in zip(cold, warm):
            if c.get("oom") or w.get("oom"):
                lines.append("| Trainer.step --compile, batch %d | out of memory |" % c["batch"])
                continue
            lines.append("| Trainer.step --compile, packed, batch %d | %.1f rows/s = %.1f real seq/s, peak %s GiB "
                         "(plan %.1f GiB); compile %.1f s cold, %.1f s warm |" % (
                             w["batch"], w["rows_per_s"], w["real_seq_per_s"], fmt(w["peak_gib"]), w["plan_gib"],
                             c["compile_s"], w["compile_s"]))
    else:
        lines.append("| Trainer.step --compile | not run (--nocompile) |")
    hf = res["huggingface"]
    lines.append("| Hugging Face BertForPreTraining, eager, unpacked | %s |" % (
        hf["note"] if "note" in hf else "batch %d: %.1f seq/s, MFU %s, peak %s GiB" % (
            hf["batch"], hf["seq_per_s"], fmt(hf["mfu"] and 100 * hf["mfu"], "%.1f%%"), fmt(hf["peak_gib"]))))
    lines.append("| eval, s per 10,000 samples, per-GPU eval batch | %s |" % ", ".join(
        "%s: %.1f" % (b, s) for b, s in res["eval_s_per_10k"].items()))
    lines.append("| host syncs per micro-step (%s) | %.2f (%d over %d) |" % (
        res["host_syncs"]["how"], res["host_syncs"]["per_step"], res["host_syncs"]["count"],
        res["host_syncs"]["steps"]))
    for gpus, p in res["projection"].items() if "note" not in res["projection"] else ():
        if "note" in p:
            lines.append("| projected time to train, %s GPUs | %s |" % (gpus, p["note"]))
            continue
        lines.append("| projected time to train, %s GPUs | global batch %d (%d x %d a GPU x %d micro-steps): "
                     "%.0f samples at %.0f real seq/s a GPU: train %.0f s + %d evals %.0f s = %.0f s; "
                     "start-up (untimed, warm compile) %s s |" % (
                         gpus, p["global_batch"], int(gpus), p["per_gpu_batch"], p["accumulation"], p["samples"],
                         p["real_seq_per_s_per_gpu"], p["train_s"], p["evals"], p["eval_s"], p["total_s"],
                         fmt(p["startup_s"], "%.0f")))
    if "note" in res["projection"]:
        lines.append("| projected time to train | %s |" % res["projection"]["note"])
    return "\n".join(lines)


def main(argv):
    if _data.help_requested(__doc__):
        return 0
    from mlperf_bert import flags
    fv = define()
    flags.parse(fv, argv, positional=False)
    if fv.probe_compile:
        return probe_compile(fv)
    import torch
    from mlperf_bert.errors import UserError
    try:
        from mlperf_bert.trainer import training
    except ImportError as e:  # the trainer's module logs through mlperf_logging
        raise UserError("gpu_check: the trainer needs %s: pip install mlperf-logging (on the GPU machine: carry "
                        "the wheel, shared/tools/device_wheels.sh)" % e.name)
    from mlperf_bert.trainer import memory_plan
    from mlperf_bert.trainer.config import BertConfig
    import train_throughput
    t_all = time.time()
    device = pick_device(fv)
    config = BertConfig.from_json_file(fv.bert_config_file, fv.max_seq_length)
    work = tempfile.mkdtemp(prefix="gpu_check_")
    records_path, recs = make_records(fv, work)
    packed_file, packing_rate = pack(fv, records_path, work)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (%d threads)" % torch.get_num_threads()
    peak_tflops = next((v for k, v in train_throughput.PEAK_BF16_TFLOPS.items() if k in name), None)
    n_params = memory_plan.n_params(config)
    flops_per_row = train_throughput.model_flops_per_seq(config, fv.max_seq_length, fv.max_predictions_per_seq,
                                                         n_params)
    slots = packed_rows(packed_file, 1, 1)[0]["masked_lm_positions"].shape[1]
    plan = memory_plan.Plan(config, fv.max_seq_length, slots, "bf16", packed=True)
    res = {"device": name, "torch": torch.__version__, "records": len(recs), "seq": fv.max_seq_length,
           "packing_rate": packing_rate, "params": n_params}
    print("gpu_check: %s; %d records, %.3f sequences a row" % (name, len(recs), packing_rate), flush=True)
    clock = [t_all]

    def lap(section):  # seconds each part took
        res.setdefault("section_s", {})[section] = time.time() - clock[0]
        clock[0] = time.time()
    lap("data and plan")

    res["packed_vs_unpacked"] = equivalence(fv, config, recs, device)
    lap("packed vs unpacked")

    res["eager_steps"] = []
    for b in ints(fv.batches):
        batches = on_device(packed_rows(packed_file, b, 4), device)
        reset_memory(device)
        tr = None
        try:
            tr = trainer(fv, config, device, b)
            run_steps(tr, batches, 2, device)
            t, seqs = run_steps(tr, batches, fv.steps, device, first=2)
            res["eager_steps"].append(step_row(fv, config, device, b, batches, tr, plan, peak_tflops, flops_per_row,
                                               t, seqs))
            if b == ints(fv.batches)[0]:
                count, how = count_syncs(fv, tr, batches, device)
                res["host_syncs"] = {"count": count, "steps": fv.steps, "per_step": count / fv.steps, "how": how}
        except RuntimeError as e:
            if not is_oom(e):
                raise
            res["eager_steps"].append({"batch": b, "oom": True, "plan_gib": plan.peak(b) / GIB})
            break
        finally:
            del tr
        print("  eager batch %d: %s" % (b, res["eager_steps"][-1]), flush=True)

    lap("eager steps")
    reset_memory(device)  # the --compile processes get the GPU's memory
    if fv.compile:
        runs = compiled(fv, packed_file, work)
        for run in runs:
            for r in run:
                r["plan_gib"] = plan.peak(r["batch"]) / GIB
        res["compiled"] = runs
        print("  compiled: %s" % runs, flush=True)
        lap("compile")

    reset_memory(device)
    res["huggingface"] = hugging_face(fv, config, recs, device, flops_per_row, peak_tflops) if fv.hf_batch else {
        "note": "not run (--hf_batch=0)"}
    reset_memory(device)
    lap("hugging face")

    default_eval = training.define_flags()["eval_batch_size"].default
    eval_batches = ints(fv.eval_batches) or sorted({1, default_eval, 256})
    res["eval_s_per_10k"] = {}
    for b in eval_batches:
        try:
            res["eval_s_per_10k"][str(b)] = eval_rate(fv, config, recs, device, b)
        except RuntimeError as e:
            if not is_oom(e):
                raise
        reset_memory(device)

    lap("eval")
    startup = None
    if "compiled" in res and "compile_s" in res["compiled"][1][0]:
        startup = res["compiled"][1][0]["compile_s"]
    res["projection"] = projection(fv, res["eager_steps"], res["eval_s_per_10k"], startup)
    res["seconds"] = time.time() - t_all
    text = table(res)
    print(text)
    print("gpu_check: %.0f s (%s); JSON: %s" % (res["seconds"], ", ".join(
        "%s %.0f s" % kv for kv in res["section_s"].items()), fv.json))
    from mlperf_bert.fileio import atomic_open
    with atomic_open(fv.json, "w") as f:
        json.dump(dict(res, table=text), f, indent=1)
    import shutil
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    from mlperf_bert.cli import run_main
    run_main(main)
