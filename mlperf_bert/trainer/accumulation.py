"""Gradient accumulation with the reference's semantics.

Every micro-batch gradient is clipped by global norm, divided by n and added to a buffer;
the optimizer is applied after micro-steps n-1, 2n-1, ... (0-based global step counting
micro-steps) at the learning rate of that micro-step, and the buffer is zeroed.
"""
import torch

from mlperf_bert.trainer.optimizer import clip_by_global_norm_


class GradientAccumulator:
    """Drives ``optimizer`` from the gradients ``loss.backward()`` leaves on ``model``.

    ``allreduce(tensors)``, if given, averages a list of gradient tensors across workers in
    place. With ``clip_before_allreduce`` each worker clips its own micro-batch gradients
    and the accumulated buffer is all-reduced once per update; otherwise every micro-batch
    gradient is all-reduced first and then clipped.
    """

    def __init__(self, model, optimizer, steps_per_update, lr_fn, clip_norm=1.0, allreduce=None,
                 clip_before_allreduce=True):
        if steps_per_update < 1:
            raise ValueError("steps_per_update must be >= 1")
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = optimizer
        self.n = int(steps_per_update)
        self.lr_fn = lr_fn
        self.clip_norm = clip_norm
        self.allreduce = allreduce
        self.clip_before_allreduce = clip_before_allreduce
        self.buffers = None
        self.pending = 0  # micro-batches absorbed since the last update
        self.last_grad_norm = None
        self.last_lr = None

    def _grads(self):
        return [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]

    @torch.no_grad()
    def after_backward(self, global_step):
        """Absorb this micro-batch's gradients; apply the optimizer if ``global_step`` ends an update."""
        grads = self._grads()
        if self.allreduce is not None and not self.clip_before_allreduce:
            self.allreduce(grads)
        self.last_grad_norm = clip_by_global_norm_(grads, self.clip_norm)
        if self.n > 1:
            torch._foreach_div_(grads, float(self.n))
            if self.buffers is None:
                self.buffers = [torch.zeros_like(p) for p in self.params]
            torch._foreach_add_(self.buffers, grads)
            grads = self.buffers
        # n == 1: 0 + g is g, so the clipped gradients serve as the buffer (no copy).
        self.pending += 1
        for p in self.params:
            p.grad = None
        if (global_step + 1) % self.n:
            return False
        if self.allreduce is not None and self.clip_before_allreduce:
            self.allreduce(grads)
        self.last_lr = self.lr_fn(global_step)
        for group in self.optimizer.param_groups:
            group["lr"] = self.last_lr
        for p, g in zip(self.params, grads):
            p.grad = g
        self.optimizer.step()
        for p in self.params:
            p.grad = None
        if self.buffers is not None:
            torch._foreach_zero_(self.buffers)
        self.pending = 0
        return True

    def state_dict(self):
        """Accumulated gradients (None at an update boundary, where they are all zero)."""
        bufs = None
        if self.pending and self.buffers is not None:
            bufs = [b.detach().to("cpu", copy=True) for b in self.buffers]  # gathered to rank 0 on the host
        return {"steps_per_update": self.n, "pending": self.pending, "buffers": bufs}

    def load_state_dict(self, state):
        if state["steps_per_update"] != self.n:
            raise ValueError("accumulator state has steps_per_update %d, this run %d"
                             % (state["steps_per_update"], self.n))
        self.pending = state["pending"]
        bufs = state["buffers"]
        self.buffers = None if bufs is None else [
            b.to(device=p.device, dtype=p.dtype).clone() for b, p in zip(bufs, self.params)]
