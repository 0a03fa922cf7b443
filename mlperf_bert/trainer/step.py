"""The compiled training step (--compile).

The model's forward (and with it, through AOTAutograd, its backward) is one torch.compile'd
graph; gradient clipping, accumulation and the LAMB/AdamW update are others. None has a graph
break, and nothing recompiles after the first update and the first eval: the learning rate and
LAMB's bias corrections enter as one-element device tensors filled in place (``fill_`` with a
Python number: no host-to-device copy, no host sync), not as Python numbers that dynamo would
specialise on. tests/test_compiled_step.py checks both with torch._dynamo's own tools.

Each compiled function has its own code object, so the few that one run uses (absorb a
micro-batch; absorb and update; update after an all-reduce; reduce-clip-update) each compile
once instead of recompiling one another. The state stays GradientAccumulator's and
BertOptimizer's (buffers, pending count, slots, per-parameter step), so checkpoints of compiled
and eager runs are interchangeable. Eager runs never come here: their numbers are the
accumulator's and the optimizer's own code, bit for bit.
"""
import torch

from mlperf_bert.trainer.optimizer import foreach_update_, global_norm_scale, update_coefficients

# None of these functions writes into the gradients it is given: they are the backward's
# outputs, and with --cuda_graphs inductor replays a function as a CUDA graph only if every
# input it mutates is static (parameters, or tensors marked with mark_static_address:
# torch/_inductor/cudagraph_utils.py, check_for_mutation). The gradients are scaled on the way
# into the buffers or the update instead, by the same operations in the same order as the eager
# accumulator's in-place ones (trainer/accumulation.py), so the numbers are the same.
#
# Each enters no_grad in its body, not by the @torch.no_grad() decorator: the decorator wraps
# every function in one code object (torch/utils/_contextlib.py, decorate_context), and dynamo
# keeps its compiled graphs by code object, guarded on the wrapped function, so the second
# function compiled recompiled the first (with --steps_per_update=2: absorb, then
# absorb_and_update; TORCH_LOGS=recompiles showed it, tests/test_compiled_step.py checks it).


def _times(grads, scale):
    """``grads`` times a clipping factor, out of place (clip_by_global_norm_'s multiply)."""
    return torch._foreach_mul(grads, scale.to(grads[0].dtype))


def _update(groups, lr, scale=None, n=1):
    """The optimizer on every group: (kind, params, grads, ms, vs, coef, hyper) with coef
    foreach_update_'s and hyper (b1, b2, eps, wd, exclude). The groups' gradients are divided by
    ``n`` (n > 1), then multiplied by ``scale`` (if given) on the way in."""
    for kind, params, grads, ms, vs, coef, hyper in groups:
        if n > 1:
            grads = torch._foreach_div(grads, float(n))
        if scale is not None:
            grads = _times(grads, scale)
        foreach_update_(kind, params, grads, ms, vs, coef, lr, *hyper)


def absorb(grads, buffers, clip_norm, n):
    """Per-replica clipping of a micro-batch that is not an update's last (so n > 1): its clipped
    gradients / n added to ``buffers`` -> the global norm."""
    with torch.no_grad():  # not @torch.no_grad(): see the note above
        norm, scale = global_norm_scale(grads, clip_norm)
        torch._foreach_add_(buffers, torch._foreach_div(_times(grads, scale), float(n)))
        return norm


def absorb_and_update(grads, buffers, clip_norm, n, groups, lr):
    """``absorb``, then the update of ``groups``: their gradients are the buffers (n > 1), or
    (no buffers) this micro-batch's, clipped on the way in."""
    with torch.no_grad():
        norm, scale = global_norm_scale(grads, clip_norm)
        if buffers is None:
            _update(groups, lr, scale)
            return norm
        torch._foreach_add_(buffers, torch._foreach_div(_times(grads, scale), float(n)))
        _update(groups, lr)
        torch._foreach_zero_(buffers)
        return norm


def update(groups, lr, buffers):
    with torch.no_grad():
        _update(groups, lr)
        if buffers is not None:
            torch._foreach_zero_(buffers)


def reduce_clip_update(grads, clip_norm, n, groups, lr):
    """Clipping after the reduction: the summed (and all-reduced) gradients / n, clipped, applied
    (``groups`` hold the sums: divided and clipped on the way in)."""
    with torch.no_grad():
        norm, scale = global_norm_scale(torch._foreach_div(grads, float(n)) if n > 1 else grads, clip_norm)
        _update(groups, lr, scale, n)
        return norm


class CompiledUpdate:
    """``after_backward`` of a GradientAccumulator, with its arithmetic compiled."""

    def __init__(self, accumulator, compile=None, graphed=False):
        """``graphed`` (--cuda_graphs, trainer/levers.py): the functions replay as CUDA graphs,
        whose outputs the next replay overwrites; the state they mutate (slots, buffers, the
        learning rate and bias corrections; the parameters are static to inductor as such) is marked
        static, and with clipping after the reduction the summed gradients live in buffers of
        their own between micro-steps."""
        acc = self.acc = accumulator
        device = acc.params[0].device
        self.lr = torch.zeros((), device=device)
        # LAMB's bias corrections by betas: (1 - b1^t, 1 - b2^t) as eager's (float64 holds them
        # exactly). One element, not 0-dim: dynamo takes a 0-dim float64 tensor on the CPU for a
        # Python float, then restarts its analysis of each update function
        # (tensorify_python_scalars): a second trace, 1-2 s of a CPU compile
        self.device = device
        self._bias = {}
        self.absorb, self.absorb_and_update, self.update, self.reduce_clip_update = (
            (compile or torch.compile)(f) for f in (absorb, absorb_and_update, update, reduce_clip_update))
        self.graphed = graphed
        self._static = set()  # ids of the tensors marked static
        self._sums = None  # graphed, clipping after the reduction: where p.grad sums up
        if graphed:
            self._mark_static([self.lr])

    def _mark_static(self, tensors):
        """Mark tensors that the CUDA-graphed update mutates in place and keeps (slots, buffers, lr)
        as static: inductor then replays the graph on them instead of skipping CUDA graphs for it."""
        new = [x for x in tensors if id(x) not in self._static]
        if new:
            for t in new:
                torch._dynamo.mark_static_address(t)
            self._static.update(id(x) for x in new)

    def _keep_sums(self):
        """Graphed, clipping after the reduction, between updates: the gradient sum in p.grad is
        moved out of the graph's memory (bit for bit) into buffers the next backward adds to."""
        acc = self.acc
        if self._sums is None:
            self._sums = [torch.empty_like(p) for p in acc.params]
            self._mark_static(self._sums)
        moved = [(p, s) for p, s in zip(acc.params, self._sums) if p.grad is not None and p.grad is not s]
        if moved:
            torch._foreach_copy_([s for _, s in moved], [p.grad for p, _ in moved])
            for p, s in moved:
                p.grad = s

    def _groups(self, grads):
        """The optimizer's groups in its own order, each parameter with its gradient and slots."""
        opt = self.acc.optimizer
        grad_of = {id(p): g for p, g in zip(self.acc.params, grads)}
        out = []
        for group in opt.param_groups:
            params = [p for p in group["params"] if id(p) in grad_of]
            if not params:
                continue
            ms, vs, t = opt.advance_slots(params)
            if self.graphed:
                self._mark_static(ms + vs)
            b1, b2 = group["beta_1"], group["beta_2"]
            a1, a2, c1, c2 = update_coefficients(opt.kind, b1, b2, t)
            if c1 is not None:
                c1, c2 = self._bias_tensors(b1, b2, c1, c2)
            hyper = (b1, b2, group["epsilon"], group["weight_decay_rate"], group["exclude"])
            out.append((opt.kind, params, [grad_of[id(p)] for p in params], ms, vs, (a1, a2, c1, c2), hyper))
        return out

    def _bias_tensors(self, b1, b2, c1, c2):
        """The device tensors of betas (b1, b2), filled with this update's bias corrections."""
        if (b1, b2) not in self._bias:
            self._bias[b1, b2] = [torch.zeros((1,), dtype=torch.float64, device=self.device) for _ in range(2)]
            if self.graphed:
                self._mark_static(self._bias[b1, b2])
        t1, t2 = self._bias[b1, b2]
        t1.fill_(c1)
        t2.fill_(c2)
        return t1, t2

    def _set_scalars(self, global_step):
        acc = self.acc
        acc.last_lr = acc.lr_fn(global_step)
        for group in acc.optimizer.param_groups:
            group["lr"] = acc.last_lr
        self.lr.fill_(acc.last_lr)

    def after_backward(self, global_step):
        """As GradientAccumulator.after_backward: -> whether the optimizer was applied."""
        acc = self.acc
        acc.pending += 1
        upd = acc.is_update(global_step)
        if acc.clip_after_reduce:
            if not upd:
                if self.graphed:
                    self._keep_sums()
                return False
            grads = acc._grads()
            groups = self._groups(grads)
            self._set_scalars(global_step)
            acc.last_grad_norm = self.reduce_clip_update(grads, acc.clip_norm, acc.n, groups, self.lr)
        else:
            grads = acc._grads()
            new = acc.n > 1 and acc.buffers is None
            buffers = acc.sums() if acc.n > 1 else None
            if new and self.graphed:
                self._mark_static(buffers)
            for p in acc.params:
                p.grad = None
            if not upd:
                acc.last_grad_norm = self.absorb(grads, buffers, acc.clip_norm, acc.n)
                return False
            if acc.exchange is None:
                # n == 1: the micro-batch's gradients, clipped on their way into the update
                groups = self._groups(buffers if buffers is not None else grads)
                self._set_scalars(global_step)
                acc.last_grad_norm = self.absorb_and_update(grads, buffers, acc.clip_norm, acc.n, groups,
                                                            self.lr)
            else:
                # the accumulator's own absorb, bucket by bucket, each bucket's all-reduce started
                # as soon as it is made (one compiled absorb would let none start before it ends;
                # eager, it writes into the backward's outputs outside any graph: no compiled
                # function mutates them, the rule of --cuda_graphs above)
                summed = acc.absorb_and_exchange(grads)
                groups = self._groups(summed)
                self._set_scalars(global_step)
                self.update(groups, self.lr, buffers)
        acc.drop_grads()  # keep_grads (DDP's bucket views): zeroed in place
        acc.pending = 0
        return True
