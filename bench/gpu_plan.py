"""Memory and FLOP plan of every GPU preset on an 80 GB H100, from the real model code on fake
tensors (no GPU, no memory used), and a check of the tracing against what this CPU measures.

Usage: flock /tmp/heavy.lock .venv/bin/python bench/gpu_plan.py [--gpus=8] [--nocheck]

Per preset (its flags as train_model.sh gives them for --gpus GPUs), per GPU, the memory plan of
mlperf_bert/trainer/memory_plan.py (the model's forward and backward on fake tensors under CUDA's
autocast policy and attention kernels, checked against an H100's measured peaks in
tests/test_memory_plan.py):
- fixed bytes: parameters (fp32), their bf16 copies, LAMB's two slots, the accumulation buffer
  when the preset accumulates, DDP's gradient buckets (several GPUs, clipping after the reduce);
- the activations of one micro-step at the preset's per-GPU batch (packed rows);
- whether it fits memory_plan.BUDGET (an 80 GB H100 less the margin for what the plan leaves
  out: context, workspaces, NCCL, graph pools, the eval set, fragmentation; allowances, not
  measurements), and the largest per-GPU batch that does;
- model FLOPs of one sequence, forward and backward (torch.utils.flop_counter.FlopCounterMode on
  the same fake step), and the sequences/s per GPU and per 8-GPU node that 30-60 % MFU mean at
  989 TFLOP/s (H100 SXM, dense bf16).

The check (unless --nocheck) runs real forward+backward steps of BERT-base and a tiny BERT on
this CPU, each in a fresh process with glibc returning freed memory at once, and compares the
peak resident-memory growth (VmHWM after - VmRSS before, /proc/self/clear_refs resetting the
peak) with the same fake-tensor trace under this CPU's own policy (``memory_plan.trace(...,
policy="cpu")``): it checks the tracing, as the H100 figures check the CUDA policy. FLOPs counted
on the real kernels are compared with the fake count and the closed-form 6 x parameters x tokens
+ attention estimate.
"""
import json
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import _data  # noqa: E402

ROOT = _data.ROOT
PEAK_TFLOPS = 989.0  # H100 SXM dense bf16
GIB = 2.0 ** 30
MFU = (0.30, 0.40, 0.50, 0.60)
TINY = {"vocab_size": 30522, "hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
        "intermediate_size": 512, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1, "max_position_embeddings": 512, "type_vocab_size": 2,
        "initializer_range": 0.02}


def preset_flags(preset, gpus):
    """The trainer flags train_model.sh runs for ``preset`` on ``gpus`` GPUs."""
    # train_model.sh reads its flags with PYTHON (else a checkout's .venv, else python3): this
    # bench's interpreter, which has the packages (without it, a CalledProcessError traceback)
    env = dict(os.environ, DATA_DIR="/data", NUM_GPUS=str(gpus), PYTHON=sys.executable)
    proc = subprocess.run([os.path.join(ROOT, "train_model.sh"), "--preset=" + preset, "--dry_run"], env=env,
                          capture_output=True, text=True)
    if proc.returncode:
        from mlperf_bert.errors import UserError
        last = (proc.stderr.strip().splitlines() or ["exit status %d" % proc.returncode])[-1]
        raise UserError("train_model.sh --preset=%s --dry_run failed: %s" % (preset, last.replace("error: ", "", 1)))
    return dict(m.groups() for m in re.finditer(r"--(\w+)=(\S+)", proc.stdout))


def gpu_presets():
    from mlperf_bert.harness.rcp import load_rcps
    sizes = sorted(load_rcps())
    return ["reference_gpu", "tpu_8192"] + ["rcp_%d" % b for b in (sizes[0], sizes[-1])]


def _config(path_or_dict, seq):
    from mlperf_bert.trainer.config import BertConfig
    if isinstance(path_or_dict, dict):  # read as a file is: the same checks (one JSON left in $TMPDIR a call)
        import tempfile
        with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
            json.dump(path_or_dict, f)
            f.flush()
            return BertConfig.from_json_file(f.name, seq)
    return BertConfig.from_json_file(path_or_dict, seq)


def batch(b, seq, pred, gen):
    """Real values for a real step (the check): random tokens, masked positions and labels."""
    import torch
    pos = torch.stack([torch.randperm(seq - 1, generator=gen)[:pred] + 1 for _ in range(b)]).sort(1).values
    return {"input_ids": torch.randint(1000, 30000, (b, seq), generator=gen),
            "segment_ids": (torch.arange(seq) >= seq // 2).long().expand(b, seq).clone(),
            "input_mask": torch.ones(b, seq, dtype=torch.long), "masked_lm_positions": pos,
            "masked_lm_ids": torch.randint(1000, 30000, (b, pred), generator=gen),
            "masked_lm_weights": torch.ones(b, pred), "next_sentence_labels": torch.randint(0, 2, (b,), generator=gen)}


def _autocast(dtype):
    import contextlib
    import torch
    return torch.autocast("cpu", dtype=torch.bfloat16) if dtype == "bf16" else contextlib.nullcontext()


def fake_flops(config, b, seq, pred, dtype):
    """FLOPs of the real model's forward and backward on fake tensors."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode
    from mlperf_bert.trainer.memory_plan import fake_batch
    from mlperf_bert.trainer.model import BertForPreTraining
    init = BertForPreTraining.reset_parameters
    BertForPreTraining.reset_parameters = lambda self: None  # values are never read
    try:
        with FakeTensorMode():
            model = BertForPreTraining(config)
            counter = FlopCounterMode(display=False)
            with counter:
                with _autocast(dtype):
                    out = model(**fake_batch(b, seq, pred, packed=False))
                out.loss.backward()
    finally:
        BertForPreTraining.reset_parameters = init
    return counter.get_total_flops()


def n_params(config):
    import torch
    from mlperf_bert.trainer.model import BertForPreTraining
    with torch.device("meta"):
        return sum(p.numel() for p in BertForPreTraining(config).parameters())


def closed_form_flops(config, seq, pred):
    """The trainer's closed form (trainer/throughput.py, the one the log's MFU uses)."""
    from mlperf_bert.trainer.throughput import flops_per_row
    return flops_per_row(config, seq, pred)


def plan(gpus):
    from mlperf_bert.trainer import memory_plan
    cfg = _config(memory_plan.CONFIG, 512)
    n = n_params(cfg)
    rows, plans = [], {}
    for preset in gpu_presets():
        f = preset_flags(preset, gpus)
        seq, pred, dtype = int(f["max_seq_length"]), int(f["max_predictions_per_seq"]), f.get("dtype", "fp32")
        if (seq, pred, dtype) not in plans:
            cfg = _config(memory_plan.CONFIG, seq)
            plans[seq, pred, dtype] = (memory_plan.Plan(cfg, seq, pred, dtype), fake_flops(cfg, 1, seq, pred, dtype))
        mp, flops1 = plans[seq, pred, dtype]
        per_gpu = int(f["train_batch_size"]) // gpus
        accum = int(f.get("steps_per_update", 1))
        ddp = gpus > 1 and "clip_by_global_norm_after_gradient_allreduce" in f
        fixed = mp.fixed + mp.static(accum, ddp)
        total = mp.peak(per_gpu, accum, ddp)
        best = mp.largest_batch(accum=accum, ddp=ddp)
        split = next(k for k in range(1, per_gpu + 1) if per_gpu % k == 0 and per_gpu // k <= max(best, 1))
        rows.append(dict(preset=preset, per_gpu=per_gpu, accum=accum, split=split, seq=seq, dtype=dtype,
                         fixed=fixed, act=total - fixed, total=total, fits=total <= memory_plan.BUDGET, best=best,
                         flops=flops1))
    return n, rows


def print_plan(n, rows, gpus):
    from mlperf_bert.trainer import memory_plan
    print("BERT-Large: %d parameters (%.1f M); %d GPUs; planned peak at most %.1f GiB a GPU (%.1f GiB less the "
          "margin of memory_plan.py)" % (n, n / 1e6, gpus, memory_plan.BUDGET / GIB, memory_plan.CARD / GIB))
    print("\n| preset | per-GPU batch x accumulation | fixed GiB (params, bf16 copies, LAMB, buffers) "
          "| activations GiB | total GiB | fits 80 GB | largest per-GPU batch | to fit |")
    print("|---|---|---:|---:|---:|---|---:|---|")
    for r in rows:
        print("| %s | %d x %d (seq %d, %s) | %.2f | %.1f | %.1f | %s | %d | %s |" % (
            r["preset"], r["per_gpu"], r["accum"], r["seq"], r["dtype"], r["fixed"] / GIB, r["act"] / GIB,
            r["total"] / GIB, "yes" if r["fits"] else "no", r["best"],
            "as is" if r["fits"] else "%d x %d" % (r["per_gpu"] // r["split"], r["accum"] * r["split"])))
    print("\n| preset | model TFLOP / sequence (fwd+bwd) | " + " | ".join(
        "seq/s a GPU at %d%% MFU" % (m * 100) for m in MFU) + " | seq/s 8 GPUs at 50% |")
    print("|---|---:|" + "---:|" * len(MFU) + "---:|")
    for r in rows:
        rate = [m * PEAK_TFLOPS * 1e12 / r["flops"] for m in MFU]
        print("| %s | %.3f | %s | %.0f |" % (r["preset"], r["flops"] / 1e12, " | ".join("%.0f" % x for x in rate),
                                            8 * 0.5 * PEAK_TFLOPS * 1e12 / r["flops"]))


MEASURE = r'''
import json, os, sys, torch
sys.path.insert(0, %(root)r); sys.path.insert(0, %(bench)r)
import gpu_plan
from mlperf_bert.trainer.model import BertForPreTraining
from torch.utils.flop_counter import FlopCounterMode
torch.set_num_threads(1)
cfg = gpu_plan._config(%(config)r, %(seq)d)
torch.manual_seed(0)
model = BertForPreTraining(cfg)
inputs = gpu_plan.batch(%(b)d, %(seq)d, %(pred)d, torch.Generator().manual_seed(0))
def step():
    with gpu_plan._autocast(%(dtype)r):
        out = model(**inputs)
    out.loss.backward()
    for p in model.parameters():
        p.grad = None
step()  # one-time allocations (kernels' caches) out of the way
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # VmHWM := VmRSS
before = status("VmRSS:")
with gpu_plan._autocast(%(dtype)r):
    out = model(**inputs)
out.loss.backward()
peak = status("VmHWM:") - before
for p in model.parameters():
    p.grad = None
counter = FlopCounterMode(display=False)
with counter:
    step()
print(json.dumps({"peak": peak, "flops": counter.get_total_flops()}))
'''


def check():
    """(name, planned bytes, measured bytes, planned FLOPs, measured FLOPs, closed form) per case."""
    out = []
    cases = [("tiny", TINY, 8, 128, 20, "fp32"), ("tiny", TINY, 8, 128, 20, "bf16"),
             ("BERT-base", os.path.join(ROOT, "configs", "bert_config_base.json"), 8, 128, 20, "fp32"),
             ("BERT-base", os.path.join(ROOT, "configs", "bert_config_base.json"), 8, 128, 20, "bf16")]
    for name, config, b, seq, pred, dtype in cases:
        from mlperf_bert.trainer import memory_plan
        cfg = _config(config, seq)
        kinds = memory_plan.trace(cfg, b, seq, pred, dtype, packed=False, policy="cpu")
        flops = fake_flops(cfg, b, seq, pred, dtype)
        planned = kinds["Total"] - kinds["Parameter"]  # the measured growth includes the gradients
        code = MEASURE % dict(root=ROOT, bench=os.path.dirname(os.path.abspath(__file__)), config=config, seq=seq,
                              b=b, pred=pred, dtype=dtype)
        env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="0", OMP_NUM_THREADS="1")
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
        if r.returncode:
            raise SystemExit(r.stderr)
        m = json.loads(r.stdout.strip().splitlines()[-1])
        out.append(("%s b=%d seq=%d %s" % (name, b, seq, dtype), planned, m["peak"], flops, m["flops"],
                    b * closed_form_flops(cfg, seq, pred)))
    return out


def main(argv):
    from mlperf_bert import flags
    fv = flags.FlagValues()
    flags.DEFINE_integer("gpus", 8, "GPUs the presets' flags are made for (train_model.sh's NUM_GPUS).",
                         flag_values=fv)
    flags.DEFINE_bool("check", True, "Also check the tracing against real steps on this CPU (--nocheck: "
                      "the plan alone).", flag_values=fv)
    _data.parse(fv, argv, _data.doc(__file__))
    gpus = fv.gpus
    t = time.time()
    n, rows = plan(gpus)
    print_plan(n, rows, gpus)
    print("\nplan: %.0f s" % (time.time() - t))
    if not fv.check:
        return 0
    t = time.time()
    print("\nCPU check (activation peak + gradients of one forward+backward; FLOPs of the same):")
    print("| case | planned MiB | measured MiB | error | planned GFLOP | counted on real kernels | error "
          "| closed form GFLOP | plan vs closed form |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, pm, mm, pf, mf, cf in check():
        print("| %s | %.0f | %.0f | %+.1f%% | %.2f | %.2f | %+.2f%% | %.2f | %+.1f%% |" % (
            name, pm / 2 ** 20, mm / 2 ** 20, 100 * (pm - mm) / mm, pf / 1e9, mf / 1e9, 100 * (pf - mf) / mf,
            cf / 1e9, 100 * (pf - cf) / cf))
    print("check: %.0f s" % (time.time() - t))
    return 0


if __name__ == "__main__":
    from mlperf_bert.cli import run_main
    run_main(main)
