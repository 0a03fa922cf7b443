"""CUDA's bf16 autocast on a CPU, as far as this model sees a difference, and a count of the casts.

CPU autocast runs LayerNorm in the input's dtype; CUDA's runs it in fp32 (aten/src/ATen/autocast_mode.h,
AT_FORALL_FP32: layer_norm, native_layer_norm; log_softmax, softmax and sum are fp32_set_opt_dtype there,
and this model already gives them fp32). ``cuda_policy`` makes CPU autocast do what CUDA's does for
those: inputs cast to fp32 (a recorded cast, as autocast's), the op run with autocast off. The
lower-precision list (linear, matmul, bmm, addmm, scaled_dot_product_attention) is the same on both;
attention runs as one op whose inner casts (the CPU's math fallback) are not counted.
"""
import collections
import contextlib

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

_FP32 = {F.layer_norm, torch.layer_norm, F.log_softmax, F.softmax, torch.log_softmax, torch.softmax}


def _to_fp32(x):
    return x.float() if torch.is_tensor(x) and x.is_floating_point() and x.dtype != torch.float32 else x


_uncounted = [0]  # > 0 while a kernel that is one fused op on CUDA runs as many ops on the CPU


@contextlib.contextmanager
def _one_kernel():
    _uncounted[0] += 1
    try:
        yield
    finally:
        _uncounted[0] -= 1


class _Attention(torch.autograd.Function):
    """scaled_dot_product_attention as one op, forward and backward: on CUDA it is one kernel
    (flash or memory-efficient) that takes bf16 q, k, v; the CPU's math fallback upcasts them and
    casts the attention matrix, casts that CUDA does not make."""

    @staticmethod
    def forward(ctx, q, k, v, kwargs):
        with torch.enable_grad(), _one_kernel():
            ctx.inputs = [x.detach().requires_grad_(x.requires_grad) for x in (q, k, v)]
            ctx.out = F.scaled_dot_product_attention(*ctx.inputs, **kwargs)
        return ctx.out.detach()

    @staticmethod
    def backward(ctx, g):
        with _one_kernel():
            grads = torch.autograd.grad(ctx.out, ctx.inputs, g, allow_unused=True)
        return (*grads, None)


class _CudaPolicy(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            q, k, v, *rest = args
            names = ("attn_mask", "dropout_p", "is_causal", "scale")
            return _Attention.apply(q, k, v, dict(zip(names, rest), **kwargs))
        if func in _FP32 and torch.is_autocast_enabled("cpu"):
            args = [_to_fp32(a) for a in args]
            kwargs = {k: _to_fp32(v) for k, v in kwargs.items()}
            with torch.autocast("cpu", enabled=False):
                return func(*args, **kwargs)
        return func(*args, **kwargs)


@contextlib.contextmanager
def cuda_policy(dtype=torch.bfloat16):
    """CPU autocast in ``dtype`` with CUDA's fp32 ops (LayerNorm above all) in fp32."""
    with torch.autocast("cpu", dtype=dtype), _CudaPolicy():
        yield


class Casts(TorchDispatchMode):
    """Counts the dtype conversions (aten._to_copy; copy_ and _foreach_copy_ between dtypes) by
    phase (``self.phase``, set by the caller) and kind: "weight" where the source is a parameter
    or a view of one (a forward cast) or has a parameter's shape or its transpose (a weight
    gradient cast back to fp32 in the backward), else "activation". ``elements``: the elements
    converted, per (phase, kind)."""

    def __init__(self, params):
        super().__init__()
        self.ids = {id(p) for p in params}
        self.shapes = {tuple(p.shape) for p in params} | {tuple(p.shape[::-1]) for p in params}
        self.phase = "forward"
        self.count, self.elements = collections.Counter(), collections.Counter()
        self.activation_shapes = set()

    def _kind(self, src):
        base = src if src._base is None else src._base
        if id(base) in self.ids or (self.phase == "backward" and tuple(src.shape) in self.shapes):
            return "weight"
        self.activation_shapes.add(tuple(src.shape))
        return "activation"

    def _add(self, src, dtype):
        if src.is_floating_point() and dtype is not None and dtype != src.dtype:
            key = (self.phase, self._kind(src))
            self.count[key] += 1
            self.elements[key] += src.numel()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _uncounted[0]:
            pass
        elif func is torch.ops.aten._to_copy.default:
            self._add(args[0], kwargs.get("dtype"))
        elif func is torch.ops.aten.copy_.default:
            self._add(args[1], args[0].dtype)
        elif func is torch.ops.aten._foreach_copy_.default:
            for dst, src in zip(args[0], args[1]):
                self._add(src, dst.dtype)
        return func(*args, **kwargs)


def count_casts(model, batch, micro_steps=1, update=None):
    """``Casts`` of ``micro_steps`` forwards and backwards of ``model`` on ``batch`` under
    ``cuda_policy``, then ``update()`` (phase "update"), as one update of the trainer."""
    casts = Casts(list(model.parameters()))
    with casts:
        for _ in range(micro_steps):
            casts.phase = "forward"
            with cuda_policy():
                out = model(**batch)
            casts.phase = "backward"
            out.loss.backward()
        casts.phase = "update"
        if update is not None:
            update()
    return casts


def main(argv=()):
    """The casts of one BERT-Large micro-step (seq 512, 76 slots, unpacked rows; batch argv[0],
    default 24) on fake tensors (no memory, no compute), plain and with --fused_qkv."""
    import json
    from torch._subclasses.fake_tensor import FakeTensorMode
    from mlperf_bert.trainer import levers
    from mlperf_bert.trainer.config import BertConfig
    from mlperf_bert.trainer.memory_plan import CONFIG, fake_batch
    from mlperf_bert.trainer.model import BertForPreTraining
    b = int(argv[0]) if argv else 24
    with open(CONFIG) as f:
        cfg = BertConfig(**json.load(f))
    init, BertForPreTraining.reset_parameters = BertForPreTraining.reset_parameters, lambda self: None
    try:
        for fused in (False, True):
            with FakeTensorMode():
                model = BertForPreTraining(cfg)
                if fused:
                    levers.enable_fused_qkv(model)
                c = count_casts(model, fake_batch(b, 512, 76, packed=False))
            print("%s: %s" % ("--fused_qkv" if fused else "plain", ", ".join(
                "%s %s %d casts %.1fM elements" % (ph, kind, n, c.elements[ph, kind] / 1e6)
                for (ph, kind), n in sorted(c.count.items()))))
    finally:
        BertForPreTraining.reset_parameters = init


if __name__ == "__main__":
    import sys
    main(sys.argv[1:])
