"""Attention masks and kernels: the reference's additive mask, and packed rows.

Unpacked rows use the reference's additive mask ((1 - input_mask) * -10000 on the keys).
Packed rows (input_mask = sequence number, 0 on padding) either use a dense block-diagonal
-10000 mask, which costs a full row's attention, or, where FlashAttention runs (CUDA, bf16 or
fp16, compute capability 8.0+), its variable-length kernel: each sequence of each row is a
segment of its own, so no masked-out block is computed. exp(-10000) is 0 in every float
type, so both give each real token exactly the attention it has unpacked.
"""
from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F


class Varlen(NamedTuple):
    """Packed rows as segments: a kernel(q, k, v, cu_seqlens, max_len, dropout_p, scale) over
    tokens [b*t, heads, d], and the segments' cumulative offsets."""
    kernel: Callable
    cu_seqlens: torch.Tensor
    max_len: int


def additive_mask(input_mask):
    """Unpacked rows: [b, 1, 1, t], -10000 on padding keys."""
    return (1.0 - input_mask[:, None, None, :].float()) * -10000.0


def packed_additive_mask(input_mask):
    """Packed rows, dense: [b, 1, t, t], -10000 on every key outside the query's own sequence."""
    same = (input_mask[:, :, None] == input_mask[:, None, :]) & (input_mask[:, None, :] > 0)
    return (~same).float()[:, None] * -10000.0


def packed_segments(input_mask, k):
    """Cumulative offsets [b*(k+1)+1] (int32) of the segments of packed rows, in token order:
    each row's sequences 1..k (empty where absent), then its padding. Static shape and no
    host synchronisation (nothing is read back to size the result)."""
    b = input_mask.shape[0]
    counts = torch.zeros(b, k + 1, dtype=torch.int64, device=input_mask.device)
    counts.scatter_add_(1, input_mask.long(), torch.ones_like(input_mask, dtype=torch.int64))
    lengths = torch.cat([counts[:, 1:], counts[:, :1]], dim=1).reshape(-1)
    return F.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)


def flash_varlen(q, k, v, cu_seqlens, max_len, dropout_p, scale):
    """FlashAttention over segments (torch's own kernel, dropout included; CUDA only)."""
    return torch.ops.aten._flash_attention_forward(q, k, v, cu_seqlens, cu_seqlens, max_len, max_len,
                                                   dropout_p, False, False, scale=scale)[0]


def reference_varlen(q, k, v, cu_seqlens, max_len, dropout_p, scale):
    """The same as ``flash_varlen`` on any device, one segment at a time: for tests (it reads
    the offsets back to the host)."""
    bounds = cu_seqlens.tolist()
    parts = []
    for start, stop in zip(bounds[:-1], bounds[1:]):
        if stop > start:
            seg = [x[start:stop].transpose(0, 1) for x in (q, k, v)]  # [heads, n, d]
            parts.append(F.scaled_dot_product_attention(*seg, dropout_p=dropout_p, scale=scale)
                         .transpose(0, 1))
    return torch.cat(parts)


def _flash_runs(device):
    """Whether FlashAttention runs on the CUDA ``device`` (enabled, compute capability 8.0+).
    torch.compile takes the answer as a constant of the trace (``trace_as_constants``): dynamo
    cannot put the Python bool of ``torch.backends.cuda.flash_sdp_enabled()`` in a graph
    ("Unsupported torch.* op returned non-Tensor"), so calling it in the traced forward broke the
    compiled forward of packed rows on CUDA into several graphs (a CPU returns before it;
    tests/test_packed_model.py)."""
    return torch.backends.cuda.flash_sdp_enabled() and torch.cuda.get_device_capability(device) >= (8, 0)


def trace_as_constants():
    """Mark what torch.compile's traces of the model take as constants (``_flash_runs``): called
    where the model is compiled, not as a decorator at import, since assume_constant_result
    imports torch._dynamo (~1 s of CPU) in every trainer process, compiled or not."""
    torch.compiler.assume_constant_result(_flash_runs)  # marks the function object itself


def varlen_kernel(device, dtype, head_dim):
    """The variable-length kernel for attention computed on ``device`` in ``dtype``, or None
    where FlashAttention does not run (then packed rows use the dense mask)."""
    if device.type != "cuda" or dtype not in (torch.float16, torch.bfloat16):
        return None
    if head_dim % 8 or head_dim > 256 or not _flash_runs(device):
        return None
    return flash_varlen


def compute_dtype(device, param_dtype):
    """The dtype the attention inputs have: autocast's where it is on, else the weights'."""
    if torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return param_dtype


def packed_mask(input_mask, k, dtype, head_dim):
    """Packed rows: ``Varlen`` segments where a variable-length kernel runs, else the dense mask."""
    kernel = varlen_kernel(input_mask.device, dtype, head_dim)
    if kernel is None:
        return packed_additive_mask(input_mask)
    return Varlen(kernel, packed_segments(input_mask, k), input_mask.shape[1])


def attend(q, k, v, mask, dropout_p, scale):
    """q, k, v [b, t, heads, d] -> context [b, t, heads * d] under ``mask`` (additive or Varlen)."""
    b, t, heads, d = q.shape
    if isinstance(mask, Varlen):
        flat = [x.reshape(b * t, heads, d) for x in (q, k, v)]
        return mask.kernel(*flat, mask.cu_seqlens, mask.max_len, dropout_p, scale).reshape(b, t, heads * d)
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.dtype), dropout_p=dropout_p, scale=scale)
    return ctx.transpose(1, 2).reshape(b, t, heads * d)
