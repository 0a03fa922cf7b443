"""Speed levers of the training step, each behind a flag and off by default: none has been
measured on a GPU yet (docs/training.md, "Speed levers"). Each computes what the plain step
computes (tests/test_levers.py):

``--cuda_graphs``   the compiled step (--compile) replayed as CUDA graphs: torch.compile with
                    inductor's CUDA graphs (mode "reduce-overhead") for the forward, the backward
                    and the update; one GPU, batches of one shape (the loaders' are).
``--fused_update``  clipping, accumulation and the LAMB/AdamW update compiled (trainer/step.py),
                    also without --compile, with inductor's combo kernels (the per-parameter
                    kernels of one foreach op fused horizontally).
``--bf16_weights``  (--dtype=bf16) bf16 copies of the weights that autocast would cast, made once
                    per update instead of at every forward; the forward reads the copies, the
                    gradients reach the fp32 weights (the optimizer's and the checkpoint's).
``--fp8``           the encoder's dense layers multiply in float8 (torch._scaled_mm): e4m3
                    activations and weights, e5m2 gradients, each tensor scaled by its own amax.
                    A closed submission needs a convergence run within the RCPs with it first.
"""
import torch
import torch.nn.functional as F

from mlperf_bert import flags
from mlperf_bert.errors import UserError

# The levers' flag names, in one place: the benches (bench/gpu_check.py, bench/train_throughput.py)
# time each of these, so a lever added here is measured without touching them.
LEVERS = ("fused_update", "bf16_weights", "fp8", "cuda_graphs")

COPY = "_bf16"  # suffix of the non-persistent buffer holding a parameter's bf16 copy


def define_flags(fv):
    B = flags.DEFINE_bool
    B("cuda_graphs", False, "With --compile on one GPU: replay the compiled forward, backward and update as "
      "CUDA graphs (torch.compile mode reduce-overhead); not measured on a GPU (docs/training.md).", flag_values=fv)
    B("fused_update", False, "Compile the clipping, accumulation and LAMB/AdamW update (also without --compile) "
      "with inductor's combo kernels; not measured on a GPU.", flag_values=fv)
    B("bf16_weights", False, "With --dtype=bf16: bf16 copies of the weights refreshed once per update instead "
      "of autocast casting them at every forward; not measured on a GPU.", flag_values=fv)
    B("fp8", False, "The encoder's dense layers multiply in float8 (torch._scaled_mm, per-tensor scales); "
      "needs a convergence run within the RCPs before a closed submission; not measured on a GPU.",
      flag_values=fv)


def check_flags(fv):
    """Refusals that need no device: one line each."""
    if fv.cuda_graphs and not fv.compile:
        raise UserError("--cuda_graphs replays the compiled step: add --compile, or drop --cuda_graphs")
    if fv.bf16_weights and fv.dtype != "bf16":
        raise UserError("--bf16_weights keeps bf16 copies for bf16 autocast: add --dtype=bf16, or drop "
                        "--bf16_weights")


def check_device(fv, device, world):
    """Refusals that need the device and rank count."""
    if fv.cuda_graphs and device.type != "cuda":
        raise UserError("--cuda_graphs needs a CUDA device (this run is on %s): drop --cuda_graphs" % device.type)
    if fv.cuda_graphs and world > 1:
        raise UserError("--cuda_graphs runs on one GPU (this run has %d ranks; DDP and the all-reduce are "
                        "not captured): drop --cuda_graphs" % world)
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


# ---------------------------------------------------------------- bf16 copies of the weights

class _Copy(torch.autograd.Function):
    """The bf16 copy of ``master`` in the forward; in the backward the gradient goes to ``master``
    converted to its dtype, as the backward of autocast's cast (``to``) does."""

    @staticmethod
    def forward(ctx, master, copy):
        ctx.dtype = master.dtype
        return copy.view_as(copy)

    @staticmethod
    def backward(ctx, grad):
        return grad.to(ctx.dtype), None


def weight(module, name, dtype=None):
    """``module.<name>`` as the forward uses it: in ``dtype`` (a cast, or its bf16 copy where
    --bf16_weights keeps one); ``dtype`` None: as autocast gives it to a linear layer (its copy
    where one is kept and bf16 autocast is on, else the parameter)."""
    p = getattr(module, name)
    copy = module._buffers.get(name + COPY)
    if dtype is None:
        if copy is None or not (torch.is_autocast_enabled(p.device.type)
                                and torch.get_autocast_dtype(p.device.type) == copy.dtype):
            return p
        dtype = copy.dtype
    if copy is not None and copy.dtype == dtype:
        return _Copy.apply(p, copy)
    return p.to(dtype)


def copied_parameters(model):
    """(module, name) of each parameter autocast or the model casts to bf16 in the forward: the
    linear layers' weights and biases, and the heads' output weights and biases (the MLM head's
    is the word embeddings: they are copied, their lookup in the embeddings stays fp32)."""
    from mlperf_bert.trainer import model as modeling
    out = [(m, n) for m in model.modules() if isinstance(m, modeling.Linear) for n in ("weight", "bias")]
    out += [(model.bert.embeddings, "word_embeddings"), (model.cls.predictions, "output_bias"),
            (model.cls.seq_relationship, "output_weights"), (model.cls.seq_relationship, "output_bias")]
    return out


class Bf16Weights:
    """The bf16 copies of a model's weights, refreshed by ``refresh`` (one multi-tensor copy):
    at the start, after every optimizer update and after a checkpoint is loaded."""

    def __init__(self, model, dtype=torch.bfloat16):
        self.masters, self.copies = [], []
        for module, name in copied_parameters(model):
            p = getattr(module, name)
            copy = torch.empty_like(p, dtype=dtype)
            module.register_buffer(name + COPY, copy, persistent=False)  # not in the checkpoint
            self.masters.append(p)
            self.copies.append(copy)
        self.refresh()

    @torch.no_grad()
    def refresh(self):
        torch._foreach_copy_(self.copies, self.masters)


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
        self.copies = Bf16Weights(trainer.model) if fv.bf16_weights else None
        if fv.fp8:
            enable_fp8(trainer.model)
        self.shapes = None
        if fv.cuda_graphs:
            trainer.forward = self._graphed(trainer.forward)
        if self.copies is not None:
            trainer.after_backward = self._refreshing(trainer.after_backward)

    def _refreshing(self, after_backward):
        def wrapped(global_step):
            updated = after_backward(global_step)
            if updated:
                self.copies.refresh()
            return updated
        return wrapped

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

    def loaded(self):
        """After a checkpoint was loaded into the model."""
        if self.copies is not None:
            self.copies.refresh()


def _diff(a, b):
    return ", ".join("%s %s" % (k, list(v)) for k, v in sorted(a.items()) if b.get(k) != v)


def static_inputs(tensors):
    """Mark tensors that a CUDA-graphed update mutates in place and keeps (slots, buffers, lr) as
    static: inductor then replays the graph on them instead of skipping CUDA graphs for it."""
    for t in tensors:
        torch._dynamo.mark_static_address(t)
