"""Speed levers of the training step, each behind a flag and off by default: none has been
measured on a GPU yet (docs/training.md, "Speed levers"). Each computes what the plain step
computes (tests/test_levers.py):

``--cuda_graphs``   the compiled step (--compile) replayed as CUDA graphs: torch.compile with
                    inductor's CUDA graphs (mode "reduce-overhead") for the forward, the backward
                    and the update; batches of one shape (the loaders' are); on several ranks
                    with per-replica clipping only (the all-reduce runs between the graphs).
``--fused_update``  clipping, accumulation and the LAMB/AdamW update compiled (trainer/step.py),
                    also without --compile, with inductor's combo kernels (the per-parameter
                    kernels of one foreach op fused horizontally).
``--fp8``           the encoder's dense layers multiply in float8 (torch._scaled_mm): e4m3
                    activations and weights, e5m2 gradients, each tensor scaled by its own amax.
                    A closed submission needs a convergence run within the RCPs with it first.
``--fused_qkv``     each layer's query, key and value projections as one GEMM over their weights
                    stacked [3h, h] (the parameters stay three, under the reference's names).
``--pad_vocab``     the MLM decoder multiplies a vocabulary padded with zero rows to a multiple of
                    8 (30522 -> 30528); the extra logits are sliced off, the parameters unpadded.
"""
import torch

from mlperf_bert import flags
from mlperf_bert.errors import UserError

# The lever flags, for tools that try each (bench/): each is a bool flag defined here, off by default.
LEVERS = ("cuda_graphs", "fused_update", "fp8", "fused_qkv", "pad_vocab")
VOCAB_MULTIPLE = 8  # --pad_vocab: 16 bytes of bf16, cuBLAS's alignment for its fast GEMM kernels


def define_flags(fv):
    B = flags.DEFINE_bool
    B("cuda_graphs", False, "With --compile: replay the compiled forward, backward and update as CUDA graphs "
      "(torch.compile mode reduce-overhead); several ranks with per-replica clipping only; not measured on a "
      "GPU (docs/training.md).", flag_values=fv)
    B("fused_update", False, "Compile the clipping, accumulation and LAMB/AdamW update (also without --compile) "
      "with inductor's combo kernels; not measured on a GPU.", flag_values=fv)
    B("fp8", False, "The encoder's dense layers multiply in float8 (torch._scaled_mm, per-tensor scales); "
      "needs a convergence run within the RCPs before a closed submission; not measured on a GPU.",
      flag_values=fv)
    B("fused_qkv", False, "Each layer's query, key and value projections as one GEMM over their stacked weights "
      "(the checkpoints keep the reference's three); not measured on a GPU.", flag_values=fv)
    B("pad_vocab", False, "The MLM decoder's GEMMs over a vocabulary padded to a multiple of %d with zero rows, "
      "the extra logits sliced off (checkpoints unpadded); not measured on a GPU." % VOCAB_MULTIPLE,
      flag_values=fv)


def check_flags(fv):
    """Refusals that need no device: one line each."""
    if fv.cuda_graphs and not fv.compile:
        raise UserError("--cuda_graphs replays the compiled step: add --compile, or drop --cuda_graphs")


def check_device(fv, device, world):
    """Refusals that need the device and rank count."""
    if fv.cuda_graphs and device.type != "cuda":
        raise UserError("--cuda_graphs needs a CUDA device (this run is on %s): drop --cuda_graphs" % device.type)
    if fv.cuda_graphs and world > 1 and fv.clip_by_global_norm_after_gradient_allreduce:
        # Per-replica clipping all-reduces the clipped sums after the backward, between the
        # graphs, into buffers of their own. DDP all-reduces inside the backward, from autograd
        # hooks between the per-bucket graphs torch.compile splits it into (no collective is
        # captured: pytorch/pytorch#108966), with gradients in DDP's buckets: not built here.
        raise UserError("--cuda_graphs on several ranks (this run has %d) needs per-replica clipping: with "
                        "--clip_by_global_norm_after_gradient_allreduce DDP all-reduces from hooks inside the "
                        "backward, which CUDA graphs cannot capture: drop one of the two flags" % world)
    if fv.fp8 and device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9):
        raise UserError("--fp8 needs float8 matmuls (compute capability 8.9+, e.g. H100; this GPU has %d.%d): "
                        "drop --fp8" % torch.cuda.get_device_capability(device))


def compile_options(fv, update=False):
    """torch.compile's keyword arguments for the model (update=False) or the update."""
    options = {}
    if fv.cuda_graphs:
        options["triton.cudagraphs"] = True  # what mode="reduce-overhead" sets
    if update and fv.fused_update:
        options["combo_kernels"] = True
    return {"options": options} if options else {}


# ---------------------------------------------------------------- fused QKV, padded vocabulary

def enable_fused_qkv(model):
    from mlperf_bert.trainer import model as modeling
    layers = [m for m in model.modules() if isinstance(m, modeling.SelfAttention)]
    for m in layers:
        m.fused = True
    return layers


def enable_pad_vocab(model, multiple=VOCAB_MULTIPLE):
    """The rows the decoder's weight gets in the forward (0 where the vocabulary is a multiple)."""
    model.vocab_pad = -model.config.vocab_size % multiple
    return model.vocab_pad


# ---------------------------------------------------------------- float8 matmuls

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def to_float8(x, dtype):
    """(x scaled to ``dtype``'s range by its amax and cast, the inverse scale): per-tensor dynamic
    scaling. An all-zero tensor gets scale 1."""
    amax = x.detach().abs().amax().float()
    top = torch.finfo(dtype).max
    scale = torch.where(amax > 0, top / amax, torch.ones_like(amax))
    x8 = (x.float() * scale).clamp(-top, top).to(dtype)
    return x8, scale.reciprocal()


def scaled_mm(a8, b8, a_inv, b_inv, out_dtype):
    """a8 @ b8 (a8 row-major, b8 column-major, both float8) times the inverse scales, in
    ``out_dtype``: torch._scaled_mm, which accumulates in fp32."""
    return torch._scaled_mm(a8, b8, scale_a=a_inv, scale_b=b_inv, out_dtype=out_dtype)


def reference_scaled_mm(a8, b8, a_inv, b_inv, out_dtype):
    """The same product computed from the float8 values in fp32: for tests."""
    return ((a8.float() @ b8.float()) * (a_inv * b_inv)).to(out_dtype)


def _col_major(x):
    return x.t().contiguous().t()


class _Fp8Linear(torch.autograd.Function):
    """y = x w^T + b with e4m3 x and w; the backward multiplies an e5m2 gradient with them."""

    @staticmethod
    def forward(ctx, x, w, b, out_dtype):
        shape = x.shape
        x8, x_inv = to_float8(x.reshape(-1, shape[-1]), E4M3)
        w8, w_inv = to_float8(w, E4M3)
        y = scaled_mm(x8, w8.t(), x_inv, w_inv, out_dtype)
        if b is not None:
            y = y + b.to(out_dtype)
        ctx.save_for_backward(x8, x_inv, w8, w_inv)
        ctx.dtypes = (x.dtype, w.dtype, None if b is None else b.dtype)
        return y.reshape(*shape[:-1], y.shape[-1])

    @staticmethod
    def backward(ctx, gy):
        x8, x_inv, w8, w_inv = ctx.saved_tensors
        x_dtype, w_dtype, b_dtype = ctx.dtypes
        g = gy.reshape(-1, gy.shape[-1])
        g8, g_inv = to_float8(g, E5M2)
        gx = scaled_mm(g8, _col_major(w8), g_inv, w_inv, gy.dtype).to(x_dtype)
        gw = scaled_mm(g8.t().contiguous(), _col_major(x8), g_inv, x_inv, gy.dtype).to(w_dtype)
        gb = None if b_dtype is None else g.sum(0).to(b_dtype)
        return gx.reshape(*gy.shape[:-1], gx.shape[-1]), gw, gb, None


def fp8_linear(x, weight, bias):
    """F.linear in float8: the output in autocast's dtype where it is on, else in x's."""
    dev = x.device.type
    out_dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype
    with torch.autocast(dev, enabled=False):
        return _Fp8Linear.apply(x, weight, bias, out_dtype)


def fp8_layers(model):
    """The encoder's dense layers (query, key, value, attention output, intermediate, output)."""
    from mlperf_bert.trainer import model as modeling
    return [m for m in model.bert.encoder.modules() if isinstance(m, modeling.Linear)]


def enable_fp8(model):
    layers = fp8_layers(model)
    for m in layers:
        if m.in_features % 16 or m.out_features % 16:
            raise UserError("--fp8 multiplies matrices whose sizes are multiples of 16; this config has a %dx%d "
                            "dense layer: drop --fp8" % (m.out_features, m.in_features))
        m.fp8 = True
    return layers


# ---------------------------------------------------------------- the trainer's side

class Levers:
    """What the flags change in a ``Trainer`` once its model, optimizer and step are built."""

    def __init__(self, trainer):
        fv = trainer.fv
        self.trainer = trainer
        check_device(fv, trainer.device, trainer.world)
        if fv.fp8:
            enable_fp8(trainer.model)
        if fv.fused_qkv:
            enable_fused_qkv(trainer.model)
        if fv.pad_vocab:
            enable_pad_vocab(trainer.model)
        self.shapes = None
        if fv.cuda_graphs:
            trainer.forward = self._graphed(trainer.forward)

    def _graphed(self, forward):
        """The compiled forward as a CUDA-graph replay: one batch shape, a new graph generation per
        micro-step, and the loss copied out of the graph's memory (the next replay reuses it)."""
        def wrapped(**batch):
            shapes = {k: tuple(v.shape) for k, v in batch.items()}
            if self.shapes is None:
                self.shapes = shapes
            elif shapes != self.shapes:
                raise UserError("--cuda_graphs replays batches of one shape: this batch has %s, the first %s; "
                                "drop --cuda_graphs" % (_diff(shapes, self.shapes), _diff(self.shapes, shapes)))
            torch.compiler.cudagraph_mark_step_begin()
            out = forward(**batch)
            return out._replace(loss=out.loss.clone())
        return wrapped


def _diff(a, b):
    return ", ".join("%s %s" % (k, list(v)) for k, v in sorted(a.items()) if b.get(k) != v)


def static_inputs(tensors):
    """Mark tensors that a CUDA-graphed update mutates in place and keeps (slots, buffers, lr) as
    static: inductor then replays the graph on them instead of skipping CUDA graphs for it."""
    for t in tensors:
        torch._dynamo.mark_static_address(t)
