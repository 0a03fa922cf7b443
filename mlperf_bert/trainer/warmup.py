"""The warm-up in MLPerf's untimed model initialisation (before ``run_start``).

Every graph the run uses (the training micro-steps and the update at the run's exact shapes,
packed or not, and the eval forward at the eval micro-batch's) is compiled and run twice on
synthetic batches (with --cuda_graphs the second run records the CUDA graphs: ``ROUNDS``), so
that neither compiling nor recording is on the clock. No dataset is read: the batches are
random ids, masked positions and labels in the loaders' layout. Then the trainer is put back
exactly as it was: weights, optimizer state and learning rates, accumulated gradients, and
the RNG streams (torch, CUDA, NumPy, Python), so a run with the warm-up is bit-identical to
one without (tests/test_warmup.py). Optimizer slots and accumulation buffers that the warm-up
created stay, zeroed (an update on zero slots with step 0 is the first update's arithmetic).
"""
import torch

from mlperf_bert.trainer import accumulation, checkpoint


def synthetic_batch(config, rows, seq, pred, gen, max_sequences=None):
    """A batch of ``rows`` random rows as the loaders give it: unpacked records, or, with
    ``max_sequences`` (K), packed rows of two sequences each (one where K is 1; slots past 2 empty) with
    ``pred`` prediction slots a row. ``gen``: a torch.Generator (the global RNG is not drawn)."""
    ints = lambda hi, *shape: torch.randint(0, hi, shape, generator=gen)  # noqa: E731
    real = seq - seq // 8 if max_sequences else seq  # packed rows end in padding
    pos = torch.stack([torch.randperm(real - 1, generator=gen)[:pred] + 1 for _ in range(rows)]).sort(1).values
    batch = {"input_ids": ints(config.vocab_size, rows, seq), "segment_ids": ints(config.type_vocab_size, rows, seq),
             "masked_lm_positions": pos, "masked_lm_ids": ints(config.vocab_size, rows, pred),
             "masked_lm_weights": torch.ones(rows, pred)}
    if not max_sequences:
        batch.update(input_mask=torch.ones(rows, seq, dtype=torch.long), next_sentence_labels=ints(2, rows))
        return batch
    k = max_sequences
    first, n = (real // 2, 2) if k > 1 else (real, 1)
    token = torch.arange(seq)
    mask = (token < real).long() + (token >= first).long() * (token < real).long()  # 1, then 2, then 0
    position = torch.where(token < first, token, torch.where(token < real, token - first, 0))
    nsp = torch.zeros(rows, k, dtype=torch.long)
    if n > 1:
        nsp[:, 1] = first
    labels = torch.full((rows, k), -1, dtype=torch.long)
    labels[:, :n] = ints(2, rows, n)
    batch.update(input_mask=mask.expand(rows, seq).clone(), position_ids=position.expand(rows, seq).clone(),
                 nsp_positions=nsp, next_sentence_labels=labels)
    return batch


def _clone(x):
    return x.detach().clone() if torch.is_tensor(x) else x


def _host(x):
    """A copy of ``x`` in host memory: page-locked from a CUDA device (the copy is queued on the
    stream, before the warm-up's kernels that change ``x``, and the copy back after them)."""
    if not torch.is_tensor(x) or x.device.type == "cpu":
        return _clone(x)
    return torch.empty_like(x, device="cpu", pin_memory=x.is_cuda).copy_(x.detach(), non_blocking=x.is_cuda)


def snapshot(trainer):
    """Everything of ``trainer`` that a step or an eval changes, in host memory: a copy on the
    device (every weight: 1.25 GiB of BERT-Large) would add to the warm-up's peak, which is the
    training step's (trainer/memory_plan.py, ``host_side``)."""
    acc, opt = trainer.accumulator, trainer.optimizer
    return {"weights": {k: _host(v) for k, v in trainer.model.state_dict().items()},
            "grads": [_host(p.grad) for p in acc.params],
            "opt_state": {p: {k: _host(v) for k, v in st.items()} for p, st in opt.state.items()},
            "lrs": [g["lr"] for g in opt.param_groups],
            "acc": (None if acc.buffers is None else [_host(b) for b in acc.buffers], acc.pending,
                    _clone(acc.last_grad_norm), acc.last_lr),
            "rng": checkpoint.rng_state(trainer.device)}


@torch.no_grad()
def restore(trainer, snap):
    """Put ``trainer`` back as ``snapshot`` found it, into the same tensors (the compiled graphs,
    and CUDA graphs' static addresses, keep theirs): what the warm-up created (optimizer slots,
    accumulation buffers) stays, zeroed, as the first update would have created it."""
    acc, opt = trainer.accumulator, trainer.optimizer
    trainer.model.load_state_dict(snap["weights"])  # copies into the parameters
    for p, g in zip(acc.params, snap["grads"]):  # kept gradients (DDP's bucket views) in place
        p.grad = accumulation._into(p.grad, g, p, keep=acc.keep_grads)
    for p, st in opt.state.items():
        old = snap["opt_state"].get(p)
        for k, v in st.items():
            if torch.is_tensor(v):
                v.copy_(old[k]) if old else v.zero_()
            else:
                st[k] = old[k] if old else 0
    for g, lr in zip(opt.param_groups, snap["lrs"]):
        g["lr"] = lr
    buffers, acc.pending, acc.last_grad_norm, acc.last_lr = snap["acc"]
    if acc.buffers is not None:
        for b, old in zip(acc.buffers, buffers or [None] * len(acc.buffers)):
            b.copy_(old) if old is not None else b.zero_()
    checkpoint.set_rng_state(snap["rng"], trainer.device)


# Calls of each compiled function the warm-up makes. Inductor's CUDA-graph trees (--cuda_graphs;
# torch/_inductor/cudagraph_trees.py, CUDAGraphTreeManager._run) run a function eagerly on its
# first call (run_eager, which adds it to warmed_up_functions), and while the current path is
# warming up every later call runs eagerly too ("any warm up of a node can only be followed by
# warm up runs"); a call of a warmed-up function in a new generation (cudagraph_mark_step_begin,
# or every output of the path dead) records its graph, and the calls after that replay it. So
# the second round of every function records, here, and the first timed step and eval replay.
ROUNDS = 2


def warm_up(trainer, train_shape, eval_shape=None, rounds=ROUNDS):
    """``rounds`` updates (``--steps_per_update`` micro-steps each) on synthetic batches of
    ``train_shape`` (rows per rank, seq, prediction slots, K for packed rows or None), an eval of
    ``rounds`` batches of ``eval_shape`` (rows, seq, pred) if given, then the trainer as before."""
    snap = snapshot(trainer)
    gen = torch.Generator().manual_seed(0)
    config = trainer.model.config
    rows, seq, pred, k = train_shape
    try:
        for i in range(rounds * trainer.accumulator.n):
            loss, _ = trainer.step(synthetic_batch(config, rows, seq, pred, gen, k), i)
        loss.item()  # the work done, not only queued
        if eval_shape is not None:
            trainer.evaluate([synthetic_batch(config, *eval_shape, gen) for _ in range(rounds)])
    finally:
        restore(trainer, snap)
