"""Gradient accumulation with the reference's two clipping modes.

Default (the reference's pre-training): every micro-batch gradient is clipped by global norm,
divided by n and added to a buffer; the optimizer is applied after micro-steps n-1, 2n-1, ...
(0-based global step counting micro-steps) at the learning rate of that micro-step.

``clip_after_reduce`` (the reference's --clip_by_global_norm_after_gradient_allreduce): the
micro-batch gradients are summed unclipped (left in ``p.grad``, where autograd and DDP's
``no_sync`` accumulate them), reduced over ranks, divided by n and clipped once per update.

Every tensor this state lives in (buffers, and with ``keep_grads`` the gradients) is created once
and afterwards only written in place, a resume included: CUDA graphs (--cuda_graphs) replay on
fixed addresses, and DDP's ``gradient_as_bucket_view`` gradients are views of its buckets.
"""
import torch

from mlperf_bert.trainer.optimizer import clip_by_global_norm_, global_norm_scale


class GradientAccumulator:
    """Drives ``optimizer`` from the gradients ``loss.backward()`` leaves on ``model``.

    ``exchange`` (per-replica clipping on several ranks: distributed.GradientExchange), if given,
    averages the clipped sums over the ranks once per update, bucket by bucket while the last
    micro-batch is absorbed (``absorb_and_exchange``). With ``clip_after_reduce`` DDP averages
    the gradients in the backward.

    ``keep_grads`` (clipping after the reduction only): after an update the gradients are zeroed
    in place instead of dropped, so the next backward adds into the same tensors (with DDP's
    ``gradient_as_bucket_view``: its buckets, no copy in or out); 0 + g is g.
    """

    def __init__(self, model, optimizer, steps_per_update, lr_fn, clip_norm=1.0, exchange=None,
                 clip_after_reduce=False, keep_grads=False):
        if steps_per_update < 1:
            raise ValueError("steps_per_update must be >= 1")
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = optimizer
        self.n = int(steps_per_update)
        self.lr_fn = lr_fn
        self.clip_norm = clip_norm
        if exchange is not None and clip_after_reduce:
            raise ValueError("the exchange averages per-replica clipped sums: DDP's, with clip_after_reduce")
        self.exchange = exchange
        self.clip_after_reduce = clip_after_reduce
        self.keep_grads = bool(keep_grads and clip_after_reduce)
        self.buffers = None
        self.pending = 0  # micro-batches absorbed since the last update
        self.last_grad_norm = None
        self.last_lr = None

    def _grads(self):
        return [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]

    def sums(self):
        """The accumulation buffers, made (zeros) by the first micro-batch that adds to them."""
        if self.buffers is None:
            self.buffers = [torch.zeros_like(p) for p in self.params]
        return self.buffers

    def is_update(self, global_step):
        """Whether micro-step ``global_step`` ends an update (DDP must reduce on it)."""
        return (global_step + 1) % self.n == 0

    @torch.no_grad()
    def after_backward(self, global_step):
        """Absorb this micro-batch's gradients; apply the optimizer if ``global_step`` ends an update."""
        self.pending += 1
        if self.clip_after_reduce:
            if not self.is_update(global_step):
                return False  # the sum builds up in p.grad
            grads = self._grads()
            if self.n > 1:
                torch._foreach_div_(grads, float(self.n))
            self.last_grad_norm = clip_by_global_norm_(grads, self.clip_norm)
            return self._apply(global_step, grads)
        grads = self._grads()
        if self.exchange is not None and self.is_update(global_step):
            for p in self.params:
                p.grad = None
            return self._apply(global_step, self.absorb_and_exchange(grads))
        self.last_grad_norm = clip_by_global_norm_(grads, self.clip_norm)
        if self.n > 1:
            torch._foreach_div_(grads, float(self.n))
            torch._foreach_add_(self.sums(), grads)
            grads = self.buffers
        # n == 1: 0 + g is g, so the clipped gradients serve as the buffer (no copy).
        for p in self.params:
            p.grad = None
        if not self.is_update(global_step):
            return False
        return self._apply(global_step, grads)

    @torch.no_grad()
    def absorb_and_exchange(self, grads):
        """The last micro-batch of an update (per-replica clipping, an ``exchange``): its
        gradients clipped, divided by n and added to the buffers (n == 1: the clipped gradients
        are the sums), bucket by bucket, each bucket's all-reduce started as soon as its sums are
        made -> the sums, averaged over the ranks. The operations of ``after_backward``, in its
        order, on each tensor: the same numbers. ``grads`` are written in place."""
        self.last_grad_norm, scale = global_norm_scale(grads, self.clip_norm)
        scale = scale.to(grads[0].dtype)
        sums = self.sums() if self.n > 1 else None

        def absorb(bucket):
            g = [grads[i] for i in bucket]
            torch._foreach_mul_(g, scale)
            if self.n == 1:
                return g
            torch._foreach_div_(g, float(self.n))
            s = [sums[i] for i in bucket]
            torch._foreach_add_(s, g)
            return s
        self.exchange.mean(absorb)
        return sums if self.n > 1 else grads

    def _apply(self, global_step, grads):
        self.last_lr = self.lr_fn(global_step)
        for group in self.optimizer.param_groups:
            group["lr"] = self.last_lr
        for p, g in zip(self.params, grads):
            p.grad = g
        self.optimizer.step()
        self.drop_grads()
        if self.buffers is not None:
            torch._foreach_zero_(self.buffers)
        self.pending = 0
        return True

    @torch.no_grad()
    def drop_grads(self):
        """After an update: the gradients dropped, or with ``keep_grads`` zeroed in place."""
        if self.keep_grads:
            kept = [p.grad for p in self.params if p.grad is not None]
            if kept:
                torch._foreach_zero_(kept)
        else:
            for p in self.params:
                p.grad = None

    def state_dict(self):
        """This rank's accumulated gradients on the host (None at an update boundary)."""
        bufs = None
        if self.pending:
            source = self._grads() if self.clip_after_reduce else self.buffers
            if source is not None:
                bufs = [b.detach().to("cpu", copy=True) for b in source]
        return {"steps_per_update": self.n, "pending": self.pending, "buffers": bufs,
                "clip_after_reduce": self.clip_after_reduce}

    def load_state_dict(self, state):
        if state["steps_per_update"] != self.n:
            raise ValueError("accumulator state has steps_per_update %d, this run %d"
                             % (state["steps_per_update"], self.n))
        # (no micro-batch pending: no sums of either mode to load, RunConfig.identity decides)
        if state["pending"] and state.get("clip_after_reduce", False) != self.clip_after_reduce:
            raise ValueError("accumulator state was saved with another clipping mode")
        self.pending = state["pending"]
        bufs = state["buffers"]
        if self.clip_after_reduce:  # the sum lives in p.grad
            for i, p in enumerate(self.params):
                p.grad = _into(p.grad, None if bufs is None else bufs[i], p, keep=self.keep_grads)
        elif self.buffers is not None or bufs is not None:
            self.buffers = [_into(b, None if bufs is None else bufs[i], p, keep=True)
                            for i, (b, p) in enumerate(zip(self.buffers or [None] * len(self.params), self.params))]


@torch.no_grad()
def _into(old, saved, like, keep):
    """A loaded tensor (``saved``, or zeros when None) in ``old``'s memory where ``old`` exists
    (copied in place: its address stays, see the module's docstring), else a new tensor like
    ``like``; ``saved`` None and nothing to keep: None."""
    if old is not None and (keep or saved is not None):
        return old.copy_(saved) if saved is not None else old.zero_()
    if saved is None:
        return None
    return saved.to(device=like.device, dtype=like.dtype).clone()
