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
the largest per-GPU batch of BERT-Large at seq 512 whose planned peak, plus the margin for what
the plan leaves out (``MARGIN``, ``FRAGMENTATION``), fits an 80 GB GPU (what train_model.sh and
the ``rcp_<B>`` presets take one GPU to hold, whatever the card: the presets are the same on every
GPU). For one card, ``card_bytes`` reads its memory (80 GB H100, 141 GB H200, 180 GB B200) and
``budget_for``/``Plan.largest_batch`` take it, with the CUDA-graph pools counted only for
``--cuda_graphs``: ``python -m mlperf_bert.trainer.memory_plan`` prints the plan and the margin
behind it, for this machine's GPU or ``--card_gib``.
"""
import contextlib
import os

GIB = 2.0 ** 30
# An 80 GB H100: 81,559 MiB as nvidia-smi gives it (79.6 GiB): MAX_PER_GPU_BATCH's card, the
# presets'. Another card's is card_bytes(device).
CARD = 79.6 * GIB
# What the plan leaves out, beside the planned peak on the card. Each is an allowance, not a
# measurement: no GPU has measured them for this trainer (not measured on a GPU).
EVAL_RECORDS = 10000  # eval_10k, all of it on one GPU in the worst case (evaluation.EvalSet)
MARGIN = {
    # outside the caching allocator: the context, its loaded kernels, the cuBLAS/cuBLASLt handles
    "CUDA context": 1.0 * GIB,
    # cuBLAS/cuBLASLt workspaces, one per handle and stream, from the caching allocator
    "cuBLAS workspaces": 0.25 * GIB,
    # NCCL's own buffers (outside the allocator): channels x peers, more with NVLink SHARP (NVLS)
    "NCCL buffers": 1.5 * GIB,
    # --cuda_graphs only: the graphs' private pool holds its blocks for the replays, where the
    # eager allocator would reuse them for the eval and the update; a private pool does not use
    # expandable segments, so what it holds is not returned between phases
    "CUDA-graph pools": 2.0 * GIB,
    # the eval set, decoded once and kept on the device (int64 features, fp32 weights)
    "eval set on the device": None,  # eval_set_bytes(), by the plan's own sequence length
}
# The caching allocator's reserved-but-unused blocks, a share of the planned peak (smaller with
# expandable_segments, which the launchers set).
FRAGMENTATION = 0.05
# The largest per-GPU batch (rows) of BERT-Large, seq 512, bf16, LAMB, with accumulation and DDP's
# buckets, whose planned peak and margin fit CARD: ``Plan.largest_batch`` (tests/test_memory_plan.py
# recomputes it). Kept as a number so that launchers need not import torch; train_model.sh reads it.
MAX_PER_GPU_BATCH = 117
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


def eval_set_bytes(seq=512, pred=76, records=EVAL_RECORDS):
    """Bytes of the eval set on one device: ``records`` unpacked rows as the loader gives them
    (ids, segments, mask: int64 [seq]; positions, ids: int64 [pred]; weights: fp32 [pred]; the
    NSP label: int64). Arithmetic, so that importing this module needs no torch."""
    return records * (8 * (3 * seq + 2 * pred + 1) + 4 * pred)


def margin(seq=512, pred=76, cuda_graphs=True):
    """{what: bytes} the plan leaves out at a fixed size (FRAGMENTATION scales with the peak);
    ``cuda_graphs`` False: without the CUDA-graph pools (a run without --cuda_graphs)."""
    return {k: eval_set_bytes(seq, pred) if v is None else v for k, v in MARGIN.items()
            if cuda_graphs or k != "CUDA-graph pools"}


def card_bytes(device=None):
    """The memory of the CUDA card ``device`` (default: the first) as the driver gives it
    (``total_memory``; an 80 GB H100's is 79.6 GiB, a 141 GB H200's and a 180 GB B200's more);
    CARD, the 80 GB H100's, where there is no CUDA device."""
    import torch
    if not torch.cuda.is_available():
        return CARD
    return float(torch.cuda.get_device_properties(device if device is not None else 0).total_memory)


def host_side(n, largest, optimizer="lamb"):
    """{what: (host bytes, device bytes beside the step's)} of what a start holds outside the
    planned step, for a model of ``n`` fp32 parameters whose largest tensor has ``largest`` bytes:
    kept in host memory, so that a resume and the warm-up fit where a fresh start's step fits.

    - the warm-up's snapshot (trainer/warmup.py): every weight, in pinned host memory while the
      warm-up's steps run at the run's batch (the slots and buffers do not exist yet);
    - a resume's checkpoint: weights and the optimizer's two slots a parameter, received in host
      memory (rank 0 reads it with map_location cpu; the others receive it through the device one
      tensor at a time: distributed.broadcast_state) and copied in place into the model and the
      slots the warm-up made (checkpoint.load_optimizer), after the warm-up;
    - the checkpoints' copies (rank 0 on CUDA: checkpoint.HostBuffers): weights and slots in pinned
      host memory, reserved before run_start and held for the whole run."""
    slots = 8 * n if optimizer in ("lamb", "adam", "adamw") else 0
    return {"warm-up snapshot": (4 * n, 0), "checkpoint of a resume": (4 * n + slots, largest),
            "checkpoints' copies": (4 * n + slots, 0)}


def budget_for(card=CARD, seq=512, pred=76, cuda_graphs=True):
    """The planned peak a GPU of ``card`` bytes can take: what is left of it after the margin
    (the CUDA-graph pools with ``cuda_graphs``), less the share fragmentation would take of that peak."""
    return (card - sum(margin(seq, pred, cuda_graphs).values())) / (1 + FRAGMENTATION)


BUDGET = budget_for()  # for BERT-Large at seq 512 on CARD


def n_params(config, largest=False):
    """The model's parameter count (``largest``: and the bytes of its largest fp32 tensor)."""
    import torch
    from mlperf_bert.trainer.model import BertForPreTraining
    with torch.device("meta"):
        params = list(BertForPreTraining(config).parameters())
    n = sum(p.numel() for p in params)
    return (n, 4 * max(p.numel() for p in params)) if largest else n


class Plan:
    """Peak bytes of a micro-step against the per-GPU batch. What the step keeps is linear in the
    batch and in the number of layers (the layers are alike), so fast traces of 1 and 2 layers at
    two batches give it for any depth and batch (tested against a deeper trace); then the
    optimizer state and the accumulation buffers. The two batches start at ``batches`` and double
    until a third, twice the larger, lies on their line: below a crossing the peak is the
    backward's end (weights and gradients, no row's), where seq 128 at 8 and 16 rows planned 0 GiB
    a row and 246 million rows a GPU."""

    def __init__(self, config, seq, pred, dtype="bf16", packed=True, batches=(8, 16)):
        import dataclasses
        (self.n, self.largest), self.seq, self.pred = n_params(config, largest=True), seq, pred
        t = {}

        def total(depth, b):
            if (depth, b) not in t:
                t[depth, b] = trace(dataclasses.replace(config, num_hidden_layers=depth), b, seq, pred, dtype,
                                    packed)["Total"]
            return t[depth, b]

        def on_line(depth, b0, b1):
            slope = (total(depth, b1) - total(depth, b0)) / (b1 - b0)
            return abs(total(depth, 2 * b1) - total(depth, b1) - slope * b1) <= 1e-3 * total(depth, 2 * b1)
        b0, b1 = batches
        while b1 < 2 ** 16 and not (on_line(1, b0, b1) and on_line(2, b0, b1)):
            b0, b1 = b1, 2 * b1
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

    def largest_batch(self, budget=None, accum=2, ddp=True, optimizer="lamb", card=CARD, cuda_graphs=True):
        """The largest batch whose peak is within ``budget`` (default: ``budget_for`` ``card`` at
        this plan's sequence length, the CUDA-graph pools counted with ``cuda_graphs``; the
        defaults are MAX_PER_GPU_BATCH's: the 80 GB H100, every lever)."""
        budget = budget_for(card, self.seq, self.pred, cuda_graphs) if budget is None else budget
        return int((budget - self.fixed - self.static(accum, ddp, optimizer)) // self.per_row)


def bert_large_plan(packed=True, seq=512, pred=76):
    from mlperf_bert.trainer.config import BertConfig
    return Plan(BertConfig.from_json_file(CONFIG, seq), seq, pred, "bf16", packed)


def main(argv):
    from mlperf_bert import flags
    fv = flags.FlagValues()
    flags.DEFINE_integer("max_seq_length", 512, "sequence length", flag_values=fv)
    flags.DEFINE_integer("max_predictions_per_seq", 76, "masked positions (slots of a packed row)", flag_values=fv)
    flags.DEFINE_float("card_gib", 0, "the card's memory in GiB; 0: this machine's CUDA device's, or an 80 GB "
                       "H100's (%.1f) without one" % (CARD / GIB), flag_values=fv)
    flags.DEFINE_bool("cuda_graphs", True, "count the CUDA-graph pools (--cuda_graphs); --nocuda_graphs: a run "
                      "without", flag_values=fv)
    flags.parse(fv, argv, positional=False)
    seq, pred, graphs = fv.max_seq_length, fv.max_predictions_per_seq, fv.cuda_graphs
    import math
    from mlperf_bert.dataset.example import check_shape
    from mlperf_bert.errors import UserError
    check_shape(seq, pred)  # (0 or below: a traceback from the fake tensors)
    if not (math.isfinite(fv.card_gib) and fv.card_gib >= 0):  # (below 0 or NaN: this machine's card, unsaid;
        # inf: a traceback)
        raise UserError("--card_gib must be a number >= 0 (the card's memory in GiB; 0: this machine's), got %s"
                        % fv.card_gib)
    card = fv.card_gib * GIB if fv.card_gib > 0 else card_bytes()
    print("BERT-Large, seq %d, bf16, LAMB, on a card of %.1f GiB; the margin for what the plan leaves out "
          "(allowances, not measured on a GPU):" % (seq, card / GIB))
    for what, size in margin(seq, pred, graphs).items():
        print("  %-24s %5.2f GiB" % (what, size / GIB))
    print("  %-24s %5.0f %% of the planned peak" % ("allocator fragmentation", 100 * FRAGMENTATION))
    print("planned peak at most %.1f GiB a GPU" % (budget_for(card, seq, pred, graphs) / GIB))
    print("| input | GiB a row | GiB fixed (params, bf16 weights, LAMB) | largest per-GPU batch: one GPU / "
          "several, accumulating (DDP buckets, accumulation buffer) |")
    print("|---|---:|---:|---|")
    for packed in (True, False):
        p = bert_large_plan(packed, seq, pred)
        print("| %s | %.3f | %.2f | %d / %d |" % ("packed" if packed else "unpacked", p.per_row / GIB,
                                                 (p.fixed + p.static()) / GIB,
                                                 p.largest_batch(accum=1, ddp=False, card=card, cuda_graphs=graphs),
                                                 p.largest_batch(card=card, cuda_graphs=graphs)))
    print("MAX_PER_GPU_BATCH (seq 512, several GPUs, accumulating, an 80 GB H100 with the CUDA-graph pools: "
          "the presets', on every card) = %d" % MAX_PER_GPU_BATCH)
    print("kept in host memory at the start (not on the device beside the step):")
    for what, (host, device) in host_side(p.n, p.largest).items():
        print("  %-24s %5.2f GiB on the host, %.2f GiB at a time on the device" % (what, host / GIB, device / GIB))
    return 0


if __name__ == "__main__":
    from mlperf_bert.cli import run_main
    run_main(main)
