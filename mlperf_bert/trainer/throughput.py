"""Training throughput: model FLOPs of a row, the GPUs' peak, and the rates of a log interval.

``flops_per_row`` is the closed form the benches and the trainer's log share: forward and
backward (x3) of the encoder's matrix products on every token of the row, the attention
scores and context (2 x 2 x t^2 x h a layer), the pooler on one token and the MLM head on
the ``pred`` prediction slots computed; embeddings lookups, LayerNorms, softmax and the
optimizer are not counted (tests/test_throughput.py checks it against torch's FLOP counter).
A packed row costs what an unpacked one of the same length does in this count (the
variable-length attention kernel does less: the count is the model's, not the kernel's).
"""
import time

# The train_loss metadata of ``Meter.interval``: wall-clock rates, different in every run
RATES = ("seq_per_s", "rows_per_s", "tflops_per_gpu", "mfu")

# Dense bf16 tensor-core peak, TFLOP/s, by a name fragment of torch.cuda.get_device_name()
PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "B200": 2250.0, "A100": 312.0}


def flops_per_row(config, seq, pred):
    """Training FLOPs (forward + backward) of one row of ``seq`` tokens with ``pred`` MLM slots."""
    h, layers, vocab = config.hidden_size, config.num_hidden_layers, config.vocab_size
    layer = 4 * h * h + 2 * h * config.intermediate_size  # Q, K, V, output; the two MLP matrices
    return 6 * (layers * layer * seq + h * h) + 12 * layers * seq * seq * h + 6 * pred * (h * h + h * vocab)


def peak_tflops(device_name, dtype):
    """The GPU's dense peak for ``dtype`` ("bf16"), or None where unknown (fp32, an unlisted GPU)."""
    if dtype != "bf16" or not device_name:
        return None
    return next((v for k, v in PEAK_BF16_TFLOPS.items() if k in device_name), None)


class Meter:
    """Rates over each log interval: the wall time since the previous interval ended, less the
    time set apart with ``excluded`` (evals, checkpoints: they have log lines of their own).

    ``interval(rows, sequences)`` -> the train_loss metadata: ``seq_per_s`` (real sequences: a
    packed row counts the sequences it holds), for packed runs ``rows_per_s``, and where
    ``row_flops`` is given (CUDA) ``tflops_per_gpu`` and, with a known ``peak``, ``mfu``.
    Rows and sequences are global (all ranks); TFLOP/s and MFU are per GPU. ``sync`` (CUDA:
    torch.cuda.synchronize) runs before a time apart starts, so the training work still queued
    on the GPU is counted as training; ``interval`` is called after the loss was read back."""

    def __init__(self, packed=False, row_flops=None, world=1, peak=None, sync=None, clock=time.perf_counter):
        self.packed, self.row_flops, self.world, self.peak, self.clock = packed, row_flops, world, peak, clock
        self.sync = sync
        self.start = clock()
        self.apart = 0.0

    def excluded(self):
        """A context whose time is not counted as training (``with meter.excluded(): evaluate()``)."""
        return _Apart(self)

    def interval(self, rows, sequences):
        now = self.clock()
        seconds = max(now - self.start - self.apart, 1e-9)
        self.start, self.apart = now, 0.0
        out = {"seq_per_s": sequences / seconds}
        if self.packed:
            out["rows_per_s"] = rows / seconds
        if self.row_flops:
            tflops = self.row_flops * rows / seconds / self.world / 1e12
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
