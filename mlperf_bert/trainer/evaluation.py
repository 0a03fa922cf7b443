"""Evaluation: exact masked-LM / NSP metrics over an eval set, the eval set kept in memory, and
the reference's eval_results.txt."""
import os

import torch

from mlperf_bert.fileio import atomic_open
from mlperf_bert.trainer import distributed, loader
from mlperf_bert.trainer.trainer_flags import MAX_MICRO_BATCH

EVAL_KEYS = ("masked_lm_accuracy", "masked_lm_loss", "next_sentence_accuracy", "next_sentence_loss")
_SUMS = ("mlm_correct", "mlm_weight", "mlm_nll_sum", "nsp_correct", "nsp_count", "nsp_nll_sum")


# The reference's figure to compare an eval-only run with (REFERENCE.md, training rules): its
# phase-1 checkpoint (model.ckpt-28252) on eval_10k (10,000 samples: 1250 batches of 8) gives
# masked-LM accuracy ~0.34085 before any training.
PHASE1_STEP, PHASE1_EVAL_SAMPLES, PHASE1_MLM_ACCURACY = 28252, 10000, "0.34085"


def reference_expectation(step, samples):
    """What the reference says an eval of a checkpoint of this step should give, as a note for the
    masked-LM accuracy line ("" when it says nothing): the phase-1 step's figure, and the count
    of samples when it is not eval_10k's."""
    if step != PHASE1_STEP:
        return ""
    other = "" if samples == PHASE1_EVAL_SAMPLES else "; this eval: %d samples" % samples
    return (" (the reference: ~%s for its phase-1 checkpoint model.ckpt-%d on eval_10k's %d samples, "
            "before any training%s)" % (PHASE1_MLM_ACCURACY, PHASE1_STEP, PHASE1_EVAL_SAMPLES, other))


def samples_line(samples, ev):
    """How many samples --do_eval alone evaluated: its defaults (100 batches of 8, the reference
    trainer's) cover 800, not eval_10k's 10,000; the input is repeated where it holds fewer."""
    line = "samples = %d (%d batches of %d, --input_file read in order and repeated" % (
        samples, ev.max_eval_steps, ev.eval_batch_size)
    if samples != PHASE1_EVAL_SAMPLES:
        line += "; eval_10k's %d are --eval_batch_size=8 --max_eval_steps=1250" % PHASE1_EVAL_SAMPLES
    return line + ")"


ALLOWANCE = 2 * 2 ** 30  # CUDA context, cuBLAS workspaces, the allocator's fragmentation


class EvalSet:
    """This rank's share of the eval files, read and decoded once (the online eval runs every few
    minutes on the same 10,000 records; ``load``, on the clock) and moved to ``device`` once, in batches of ``micro_batch``
    rows (the eval micro-batch, capped at what balances the share: ceil(share / batches)). The
    last batch is padded to that shape with copies of a row whose predictions and NSP label do
    not count (weight 0, label -1), so every batch runs one compiled graph; the metric sums are
    those of the real records whatever the batching. The ranks cut the set at the smallest of their
    micro-batches: a rank that cut it at its own (--eval_micro_batch_size, or the automatic one of a
    GPU with less memory free) read records of another rank's share, the eval's metrics wrong."""

    def __init__(self, files, max_seq_length, max_predictions_per_seq, micro_batch, rank, world, device,
                 vocab_size=None):
        micro_batch = distributed.smallest(micro_batch)
        self.num_records = loader.count_records(files)
        share = -(-self.num_records // world)
        batches = -(-share // micro_batch)
        self.micro_batch = max(1, -(-share // max(batches, 1)))
        self.shape = (self.micro_batch, max_seq_length, max_predictions_per_seq)
        # read by load(), after run_start: the clock starts "before any part of the system touches the
        # dataset" (training_rules.adoc, Run Results); the count and the shape above are its metadata
        self._dataset = loader.PretrainingBatches(files, max_seq_length, max_predictions_per_seq,
                                                  self.micro_batch * world, rank, world, shuffle=False,
                                                  repeat=False, vocab_size=vocab_size)
        self.device, self.batches = device, None

    def load(self):
        """Read and decode the share and move it to the device, once."""
        if self.batches is None:
            self.batches = [{k: v.to(self.device) for k, v in pad(b, self.micro_batch).items()}
                            for b in self._dataset]
        return self

    def __iter__(self):
        return iter(self.load().batches)


def pad(batch, rows):
    """``batch`` with rows appended up to ``rows``: copies of its first, counting for nothing."""
    n = batch["input_ids"].shape[0]
    if n >= rows:
        return batch
    out = {k: torch.cat([v, v[:1].expand(rows - n, *v.shape[1:])]) for k, v in batch.items()}
    out["masked_lm_weights"][n:] = 0
    out["next_sentence_labels"][n:] = -1
    return out


def largest_micro_batch(model, device, autocast, seq, pred, reserve):
    """The largest eval micro-batch (a multiple of 8, at most MAX_MICRO_BATCH) whose forward fits
    the GPU beside what is allocated now and ``reserve`` bytes more (the optimizer state that the
    first update creates): one eager forward of 8 synthetic rows measures the memory of a row
    (the compiled forward needs no more)."""
    from mlperf_bert.trainer.warmup import synthetic_batch
    probe = 8
    batch = {k: v.to(device) for k, v in
             synthetic_batch(model.config, probe, seq, pred, torch.Generator().manual_seed(0)).items()}
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    was_training = model.training
    model.eval()
    with torch.no_grad(), autocast():
        model(**batch)
    model.train(was_training)
    per_row = max(torch.cuda.max_memory_allocated(device) - base, 1) / probe
    free = torch.cuda.get_device_properties(device).total_memory - base - reserve - ALLOWANCE
    return int(max(8, min(MAX_MICRO_BATCH, free // per_row // 8 * 8)))


@torch.no_grad()
def evaluate(model, batches, device, autocast, compiled=None):
    """Exact metrics over every batch: sums in float64, all-reduced over ranks. ``compiled``
    (torch.compile of ``model``) runs the batches of the first batch's shape; a shorter last
    batch runs eagerly rather than compile a second graph."""
    was_training = model.training
    model.eval()
    sums = torch.zeros(len(_SUMS) + 2, dtype=torch.float64, device=device)
    one = torch.ones((), dtype=torch.float64, device=device)
    shape = None
    for batch in batches:
        batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        shape = shape or batch["input_ids"].shape
        forward = compiled if compiled is not None and batch["input_ids"].shape == shape else model
        if forward is compiled:
            # Each batch a new CUDA-graph generation (--cuda_graphs): without it, the batches of
            # one eval are one generation, and each finds the last one's outputs alive
            # (cudagraph_trees.py, try_end_curr_execution), so records a new graph as its child.
            torch.compiler.cudagraph_mark_step_begin()
        sums += _batch_sums(forward, batch, autocast, one)  # no output of the graph outlives its batch
    model.train(was_training)
    s = dict(zip(_SUMS + ("loss_sum", "batches"), distributed.sum_values(sums.tolist(), device)))
    return {
        "loss": s["loss_sum"] / max(s["batches"], 1),
        "masked_lm_accuracy": s["mlm_correct"] / max(s["mlm_weight"], 1e-30),
        "masked_lm_loss": s["mlm_nll_sum"] / max(s["mlm_weight"], 1e-30),
        "next_sentence_accuracy": s["nsp_correct"] / max(s["nsp_count"], 1),
        "next_sentence_loss": s["nsp_nll_sum"] / max(s["nsp_count"], 1),
        "samples": int(s["nsp_count"]),
    }


def _batch_sums(forward, batch, autocast, one):
    """The batch's metric sums, + its total loss and a batch count (the estimator's `loss` is
    their mean)."""
    with autocast():
        out = forward(**batch)
    return torch.stack([getattr(out, k).double() for k in _SUMS] + [out.loss.double(), one])


def reference_eval_batches(data, ev, files, rank, world, vocab_size, device):
    """The reference's --do_eval input: files in order, repeated, ``max_eval_steps`` full batches
    (``data``, ``ev``: the RunConfig's sections) for ``device``; a token id of ``vocab_size`` or more is
    one line naming its record, as in training (the embedding's IndexError, or CUDA's device-side assert)."""
    ds = loader.PretrainingBatches(files, data.max_seq_length, data.max_predictions_per_seq, ev.eval_batch_size,
                                   rank, world, shuffle=False, repeat=True, max_batches=ev.max_eval_steps,
                                   vocab_size=vocab_size)
    return loader.make_loader(ds, min(data.num_workers, 1), pin=device.type == "cuda")


RESULTS = "eval_results.txt"


def results_step(output_dir):
    """The global_step of output_dir's eval_results.txt, or None (none there, or unreadable)."""
    try:
        with open(os.path.join(output_dir, RESULTS), encoding="utf-8") as f:
            lines = dict(line.strip().split(" = ", 1) for line in f if " = " in line)
        return int(lines["global_step"])
    except (OSError, ValueError, KeyError):
        return None


def write_eval_results(output_dir, metrics, global_step):
    """output_dir/eval_results.txt: the reference's ``key = value`` lines, keys sorted."""
    path = os.path.join(output_dir, RESULTS)
    values = {k: repr(float(metrics[k])) for k in ("loss",) + EVAL_KEYS}
    values["global_step"] = "%d" % global_step
    with atomic_open(path, "w", encoding="utf-8") as f:
        f.writelines("%s = %s\n" % (k, values[k]) for k in sorted(values))
    return path
