"""Peak GPU memory of one training micro-step, planned without a GPU, and the per-GPU batch it allows.

The plan runs the real model's forward and backward on fake tensors (no memory, no device) and
measures every live tensor at the peak (torch's MemTracker), as a CUDA GPU would run it:

- bf16 autocast with CUDA's policy: matmuls in bf16 from cached bf16 copies of the weights, and
  LayerNorm in fp32 (CUDA's autocast lists it among the fp32 ops; the CPU's keeps it in bf16,
  which changes nothing kept here: LayerNorm saves its fp32 input either way);
- attention by the kernel CUDA runs: packed rows through FlashAttention's variable-length kernel,
  unpacked rows (an additive mask) through the memory-efficient kernel. Both keep q, k, v, the
  output and the log-sum-exp; neither keeps the [heads, t, t] probabilities. Traced on the CPU,
  ``scaled_dot_product_attention`` with a mask and dropout falls back to the math kernel, which
  keeps the probabilities, their dropout mask and the dropped-out copy: 73 MiB a layer and row
  at seq 512 where the GPU keeps 22. That is what made the earlier plan 3.4 times the H100's
  measured memory a row (1.76 GiB against 0.525);
- then the optimizer state (LAMB/Adam: two fp32 slots a parameter) and, when the per-replica
  clipping accumulates (steps_per_update > 1), the fp32 accumulation buffer.

Checked against an H100's measured peaks in tests/test_memory_plan.py. ``MAX_PER_GPU_BATCH`` is
the largest per-GPU batch of BERT-Large at seq 512 the plan fits on an 80 GB GPU (what
train_model.sh and the ``rcp_<B>`` presets take one GPU to hold): ``python -m
mlperf_bert.trainer.memory_plan`` prints the plan behind it.
"""
import contextlib
import os

GIB = 2.0 ** 30
# An 80 GB H100 has 79.6 GiB; 2 GiB of it are left to the CUDA context, cuBLAS workspaces and
# the caching allocator's fragmentation (an allowance, not a measurement).
BUDGET = 78 * GIB
# The largest per-GPU batch (rows) of BERT-Large, seq 512, bf16, LAMB, with accumulation and DDP's
# buckets, within BUDGET: ``Plan.largest_batch`` (tests/test_memory_plan.py keeps the two equal).
# Kept as a number so that launchers need not import torch; train_model.sh's default is this.
MAX_PER_GPU_BATCH = 129
CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                      "configs", "bert_config_large.json")


def fake_batch(b, seq, pred, packed, k=3):
    """A batch of ``b`` rows as the loader gives it (values never read): unpacked records, or
    packed rows of up to ``k`` sequences with ``pred`` prediction slots."""
    import torch
    z = lambda *s: torch.zeros(*s, dtype=torch.long)  # noqa: E731
    out = {"input_ids": z(b, seq), "segment_ids": z(b, seq), "input_mask": torch.ones(b, seq, dtype=torch.long),
           "masked_lm_positions": z(b, pred), "masked_lm_ids": z(b, pred), "masked_lm_weights": torch.ones(b, pred)}
    if packed:
        out.update(position_ids=z(b, seq), next_sentence_labels=z(b, k), nsp_positions=z(b, k))
    else:
        out["next_sentence_labels"] = z(b)
    return out


def _cuda_policy():
    """A TorchFunctionMode that, on top of CPU autocast, does what CUDA does differently for this
    model: LayerNorm in fp32, and ``scaled_dot_product_attention`` with a mask by the
    memory-efficient kernel."""
    import torch

    class CudaPolicy(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is torch.nn.functional.layer_norm and args[0].dtype != torch.float32:
                with torch.autocast("cpu", enabled=False):
                    return func(args[0].float(), *args[1:], **kwargs)
            if func is torch.nn.functional.scaled_dot_product_attention:
                q, k, v = args[:3]
                mask = kwargs.get("attn_mask")
                if mask is not None:
                    mask = mask.to(q.dtype).expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
                return torch.ops.aten._scaled_dot_product_efficient_attention(
                    q, k, v, mask, True, kwargs.get("dropout_p", 0.0), False, scale=kwargs.get("scale"))[0]
            return func(*args, **kwargs)
    return CudaPolicy()


def trace(config, b, seq, pred, dtype="bf16", packed=True, policy="cuda"):
    """Bytes by kind (Parameter, Gradient, Activation, ..., Total) live at the peak of one
    forward and backward of ``b`` rows, as a CUDA GPU runs them, on fake tensors (``policy="cpu"``:
    as this CPU runs them, its autocast and its attention kernels)."""
    cuda = policy == "cuda"
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker
    from mlperf_bert.trainer import attention
    from mlperf_bert.trainer.model import BertForPreTraining
    init, kernel = BertForPreTraining.reset_parameters, attention.varlen_kernel
    BertForPreTraining.reset_parameters = lambda self: None  # values are never read
    if cuda and dtype == "bf16":  # FlashAttention runs the packed rows on the GPU
        attention.varlen_kernel = lambda device, dt, head_dim: attention.flash_varlen
    try:
        with FakeTensorMode():
            model = BertForPreTraining(config)
            inputs = fake_batch(b, seq, pred, packed)
            mt = MemTracker()
            mt.track_external(model)
            with mt:
                with (torch.autocast("cpu", dtype=torch.bfloat16) if dtype == "bf16"
                      else contextlib.nullcontext()), (_cuda_policy() if cuda else contextlib.nullcontext()):
                    out = model(**inputs)
                out.loss.backward()
            peak = mt.get_tracker_snapshot("peak")[torch.device("cpu")]
    finally:
        BertForPreTraining.reset_parameters, attention.varlen_kernel = init, kernel
    return {str(k.value if hasattr(k, "value") else k): v for k, v in peak.items()}


def n_params(config):
    import torch
    from mlperf_bert.trainer.model import BertForPreTraining
    with torch.device("meta"):
        return sum(p.numel() for p in BertForPreTraining(config).parameters())


class Plan:
    """Peak bytes of a micro-step against the per-GPU batch. What the step keeps is linear in the
    batch and in the number of layers (the layers are alike), so four fast traces of 1 and 2
    layers at two batches give it for any depth and batch (tested against a deeper trace); then
    the optimizer state and the accumulation buffers."""

    def __init__(self, config, seq, pred, dtype="bf16", packed=True, batches=(8, 16)):
        import dataclasses
        self.n = n_params(config)
        t = {(depth, b): trace(dataclasses.replace(config, num_hidden_layers=depth), b, seq, pred, dtype,
                               packed)["Total"] for depth in (1, 2) for b in batches}
        b0, b1 = batches
        per_row = {depth: (t[depth, b1] - t[depth, b0]) / (b1 - b0) for depth in (1, 2)}
        fixed = {depth: t[depth, b0] - per_row[depth] * b0 for depth in (1, 2)}
        layers = config.num_hidden_layers - 1
        # parameters, their bf16 copies and the gradients live at the peak; activations a row
        self.fixed = fixed[1] + layers * (fixed[2] - fixed[1])
        self.per_row = per_row[1] + layers * (per_row[2] - per_row[1])

    def static(self, accum=1, ddp=False, optimizer="lamb"):
        """Bytes outside the traced step: the optimizer's two fp32 slots a parameter; with
        accumulation the fp32 buffer (per-replica clipping) or the gradients kept between
        micro-steps (clipping after the all-reduce); DDP's fp32 gradient buckets."""
        slots = 8 * self.n if optimizer in ("lamb", "adam", "adamw") else 0
        return slots + (4 * self.n if accum > 1 else 0) + (4 * self.n if ddp else 0)

    def peak(self, b, accum=1, ddp=False, optimizer="lamb"):
        return self.fixed + self.per_row * b + self.static(accum, ddp, optimizer)

    def largest_batch(self, budget=BUDGET, accum=2, ddp=True, optimizer="lamb"):
        return int((budget - self.fixed - self.static(accum, ddp, optimizer)) // self.per_row)


def bert_large_plan(packed=True, seq=512, pred=76):
    from mlperf_bert.trainer.config import BertConfig
    return Plan(BertConfig.from_json_file(CONFIG, seq), seq, pred, "bf16", packed)


def main(argv):
    from mlperf_bert import flags
    fv = flags.FlagValues()
    flags.DEFINE_integer("max_seq_length", 512, "sequence length", flag_values=fv)
    flags.DEFINE_integer("max_predictions_per_seq", 76, "masked positions (slots of a packed row)", flag_values=fv)
    flags.parse(fv, argv, positional=False)
    print("BERT-Large, seq %d, bf16, LAMB; budget %.0f GiB a GPU" % (fv.max_seq_length, BUDGET / GIB))
    print("| input | GiB a row | GiB fixed (params, bf16 weights, LAMB) | largest per-GPU batch: one GPU / "
          "several, accumulating (DDP buckets, accumulation buffer) |")
    print("|---|---:|---:|---|")
    for packed in (True, False):
        p = bert_large_plan(packed, fv.max_seq_length, fv.max_predictions_per_seq)
        print("| %s | %.3f | %.2f | %d / %d |" % ("packed" if packed else "unpacked", p.per_row / GIB,
                                                 (p.fixed + p.static()) / GIB,
                                                 p.largest_batch(accum=1, ddp=False), p.largest_batch()))
    print("MAX_PER_GPU_BATCH (seq 512, several GPUs, accumulating) = %d" % MAX_PER_GPU_BATCH)
    return 0


if __name__ == "__main__":
    from mlperf_bert.cli import run_main
    run_main(main)
