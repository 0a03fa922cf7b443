"""Training throughput: model FLOPs of a row, the GPUs' peak, and the rates of a log interval.

``flops_per_row`` is the closed form the benches and the trainer's log share: forward and
backward (x3) of the encoder's matrix products on every token of the row, the attention
scores and context (2 x 2 x t^2 x h a layer), the pooler on one token and the MLM head on
the ``pred`` prediction slots computed; embeddings lookups, LayerNorms, softmax and the
optimizer are not counted (tests/test_throughput.py checks it against torch's FLOP counter).
The attention is counted as its kernel computes it: a dense row attends t x t query-key pairs;
packed rows on the variable-length kernel (attention.varlen_kernel: CUDA, bf16) attend each
segment to itself, the sum of len^2 over a row's sequences and its padding (``batch_flops``).
"""
import re
import time

import torch

# The train_loss metadata of ``Meter.interval``: wall-clock rates, different in every run
RATES = ("seq_per_s", "rows_per_s", "tflops_per_gpu", "mfu")

# Dense bf16 tensor-core peak, TFLOP/s (NVIDIA's datasheets: half the with-sparsity figure, rounded
# down), by the exact model in torch.cuda.get_device_name(); first match wins. The H100 and H200
# come in SXM, PCIe and NVL forms with different clocks and peaks: a name that says which is not
# listed gets no peak (no MFU) rather than the SXM's.
PEAK_BF16_TFLOPS = (
    (r"\bH100\b.*\bPCIe\b", 756.0),      # "NVIDIA H100 PCIe"
    (r"\bH100\b.*\bNVL\b", 835.0),       # "NVIDIA H100 NVL"
    (r"\bH100\b.*\b(HBM3|SXM)", 989.0),  # "NVIDIA H100 80GB HBM3" (SXM5)
    (r"\bH200\b.*\bNVL\b", 835.0),       # "NVIDIA H200 NVL"
    (r"\bGH200\b", 989.0),                # "NVIDIA GH200 480GB"
    (r"\bH200\b", 989.0),                 # "NVIDIA H200" (SXM)
    (r"\bB200\b", 2250.0),                # "NVIDIA B200"
    (r"\bA100\b", 312.0),                 # "NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe"
)

# FLOPs per query-key pair per hidden unit per layer: scores (q k) and context (p v), 2 FLOPs a
# multiply-add each, times 3 for forward and backward
PAIR_FLOPS = 12


def flops_per_row(config, seq, pred, pairs=None, pooled=1):
    """Training FLOPs (forward + backward) of one row of ``seq`` tokens with ``pred`` MLM slots;
    ``pairs``: the query-key pairs its attention computes (default seq^2, the dense kernel);
    ``pooled``: the tokens the pooler runs on (a packed row's NSP positions)."""
    h, layers, vocab = config.hidden_size, config.num_hidden_layers, config.vocab_size
    layer = 4 * h * h + 2 * h * config.intermediate_size  # Q, K, V, output; the two MLP matrices
    pairs = seq * seq if pairs is None else pairs
    return 6 * (layers * layer * seq + pooled * h * h) + PAIR_FLOPS * layers * pairs * h + 6 * pred * (h * h + h * vocab)


def segment_pairs(input_mask):
    """Packed rows (input_mask: sequence number, 0 on padding) -> [b] float64: the query-key
    pairs the variable-length kernel computes for each row, the sum of each segment's length
    squared (its sequences, and its padding, a segment of its own there)."""
    m = torch.as_tensor(input_mask).long()
    counts = torch.zeros(m.shape[0], int(m.max()) + 1, dtype=torch.float64)
    counts.scatter_add_(1, m, torch.ones_like(m, dtype=torch.float64))
    return (counts ** 2).sum(1)


def batch_flops(config, input_mask, pred, varlen, pooled=1):
    """Training FLOPs of a batch of rows (``input_mask`` [b, t]) with ``pred`` MLM slots and
    ``pooled`` NSP positions a row: dense attention (``varlen`` False: unpacked rows, or packed
    rows on the dense mask), or packed rows on the variable-length kernel."""
    b, seq = input_mask.shape
    if not varlen:
        return b * flops_per_row(config, seq, pred, pooled=pooled)
    pairs = float(segment_pairs(input_mask).sum())
    return b * flops_per_row(config, seq, pred, pairs=0, pooled=pooled) + PAIR_FLOPS * config.num_hidden_layers * pairs * \
        config.hidden_size


def peak_tflops(device_name, dtype):
    """The GPU's dense peak for ``dtype`` ("bf16"), or None where unknown (fp32, an unlisted GPU
    or form of one)."""
    if dtype != "bf16" or not device_name:
        return None
    return next((v for pattern, v in PEAK_BF16_TFLOPS if re.search(pattern, device_name, re.I)), None)


class Meter:
    """Rates over each log interval: the wall time since the previous interval ended, less the
    time set apart with ``excluded`` (evals, checkpoints: they have log lines of their own).

    ``interval(rows, sequences)`` -> the train_loss metadata: ``seq_per_s`` (real sequences: a
    packed row counts the sequences it holds), for packed runs ``rows_per_s``, and where
    ``row_flops`` is given (CUDA) ``tflops_per_gpu`` and, with a known ``peak``, ``mfu``.
    Where ``batch_flops`` (a function of a batch) is set, the FLOPs are those of the batches
    passed to ``add`` (this rank's, as its kernels compute them) instead of ``row_flops`` a row.
    Rows and sequences are global (all ranks); TFLOP/s and MFU are per GPU. ``sync`` (CUDA:
    torch.cuda.synchronize) runs before a time apart starts, so the training work still queued
    on the GPU is counted as training; ``interval`` is called after the loss was read back."""

    def __init__(self, packed=False, row_flops=None, world=1, peak=None, sync=None, clock=time.perf_counter,
                 batch_flops=None):
        self.packed, self.row_flops, self.world, self.peak, self.clock = packed, row_flops, world, peak, clock
        self.sync, self.batch_flops, self.flops = sync, batch_flops, 0.0
        self.start = clock()
        self.apart = 0.0

    def excluded(self):
        """A context whose time is not counted as training (``with meter.excluded(): evaluate()``)."""
        return _Apart(self)

    def add(self, batch):
        """A micro-step's batch (this rank's, on the host): its FLOPs, where ``batch_flops`` counts them."""
        if self.batch_flops is not None:
            self.flops += self.batch_flops(batch)

    def interval(self, rows, sequences):
        now = self.clock()
        seconds = max(now - self.start - self.apart, 1e-9)
        self.start, self.apart = now, 0.0
        out = {"seq_per_s": sequences / seconds}
        if self.packed:
            out["rows_per_s"] = rows / seconds
        if self.batch_flops is not None:
            tflops, self.flops = self.flops / seconds / 1e12, 0.0
        elif self.row_flops:
            tflops = self.row_flops * rows / seconds / self.world / 1e12
        if self.batch_flops is not None or self.row_flops:
            out["tflops_per_gpu"] = tflops
            if self.peak:
                out["mfu"] = tflops / self.peak
        return out


class _Apart:
    def __init__(self, meter):
        self.meter = meter

    def __enter__(self):
        if self.meter.sync is not None:
            self.meter.sync()
        self.t = self.meter.clock()

    def __exit__(self, *exc):
        self.meter.apart += self.meter.clock() - self.t
        return False
