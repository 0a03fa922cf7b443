"""The reference's LAMB and AdamW (weight-decay Adam), and global-norm gradient clipping.

Exclusions follow the reference: weight decay (and LAMB's trust ratio) are skipped for
variables whose *TF name* contains "LayerNorm", "layer_norm" or "bias". Each optimizer has
a per-tensor path and a multi-tensor (``torch._foreach_*``) path doing the same operations
in the same order; the multi-tensor path is the default on GPU.
"""
import functools
import sys

import numpy as np
import torch

from mlperf_bert.trainer.tf_checkpoint import tf_name

EXCLUDE_FROM_WEIGHT_DECAY = ("LayerNorm", "layer_norm", "bias")


def is_excluded(name):
    return any(s in name for s in EXCLUDE_FROM_WEIGHT_DECAY)


def _tf_name(param_name):
    # DDP / torch.compile wrappers prefix the names.
    for prefix in ("module.", "_orig_mod."):
        while param_name.startswith(prefix):
            param_name = param_name[len(prefix):]
    return tf_name(param_name)


def _dynamo_only_once_imported(method):
    """torch.optim.Optimizer's ``method``, which torch wraps in torch._disable_dynamo: the wrapper's
    first call imports torch._dynamo, about a second of CPU at the start of every trainer process
    (and of each rank), which without --compile has no other use for it. Dynamo traces nothing in
    a process that has not imported it, so there the wrapped function itself runs, as the wrapper
    would run it; once dynamo is imported, the wrapper does."""
    plain = getattr(method, "__wrapped__", method)

    @functools.wraps(plain)
    def call(*args, **kwargs):
        return (method if "torch._dynamo" in sys.modules else plain)(*args, **kwargs)
    return call


class BertOptimizer(torch.optim.Optimizer):
    """LAMB (``kind="lamb"``) or the reference's AdamWeightDecayOptimizer (``kind="adamw"``).

    Param groups carry ``exclude`` (skip weight decay / trust ratio) and ``names`` (TF names,
    used for optimizer slots ``<name>/adam_m``, ``<name>/adam_v``). LAMB's bias-correction
    power counts calls of ``step()``, i.e. optimizer updates.
    """

    def __init__(self, groups, kind="lamb", lr=1e-4, beta_1=0.9, beta_2=0.999, epsilon=1e-6,
                 weight_decay_rate=0.01, foreach=None):
        if kind not in ("lamb", "adamw"):
            raise ValueError("optimizer must be lamb or adamw, not %r" % kind)
        defaults = dict(lr=lr, beta_1=beta_1, beta_2=beta_2, epsilon=epsilon,
                        weight_decay_rate=weight_decay_rate, exclude=False, names=None)
        super().__init__(groups, defaults)
        self.kind = kind
        self.foreach = foreach

    add_param_group = _dynamo_only_once_imported(torch.optim.Optimizer.add_param_group)
    state_dict = _dynamo_only_once_imported(torch.optim.Optimizer.state_dict)
    load_state_dict = _dynamo_only_once_imported(torch.optim.Optimizer.load_state_dict)
    zero_grad = _dynamo_only_once_imported(torch.optim.Optimizer.zero_grad)

    def _use_foreach(self, params):
        if self.foreach is not None:
            return self.foreach
        return bool(params) and params[0].is_cuda

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            ms, vs, t = self.advance_slots(params)
            grads = [p.grad for p in params]
            coef = update_coefficients(self.kind, group["beta_1"], group["beta_2"], t)
            if self._use_foreach(params):
                self._step_foreach(group, params, grads, ms, vs, coef)
            else:
                for p, g, m, v in zip(params, grads, ms, vs):
                    self._step_one(group, p, g, m, v, coef)
        return loss

    def advance_slots(self, params):
        """-> (adam_m slots, adam_v slots, update count t) of ``params`` after counting one more
        update; the slots are created (zeros) on the first. The count is a Python int, saved so in
        checkpoints."""
        ms, vs = [], []
        for p in params:
            st = self.state[p]
            if not st:
                st["step"] = 0
                st["adam_m"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                st["adam_v"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            st["step"] += 1
            ms.append(st["adam_m"])
            vs.append(st["adam_v"])
        return ms, vs, self.state[params[0]]["step"]

    def _step_one(self, group, p, g, m, v, coef):
        b1, b2, eps, lr = group["beta_1"], group["beta_2"], group["epsilon"], group["lr"]
        wd, exclude = group["weight_decay_rate"], group["exclude"]
        a1, a2, c1, c2 = coef
        m.mul_(b1).add_(g, alpha=a1)
        v.mul_(b2).addcmul_(g, g, value=a2)
        if self.kind == "lamb":
            update = (m / c1) / ((v / c2).sqrt_().add_(eps))
        else:
            update = m / (v.sqrt().add_(eps))
        if not exclude:
            update.add_(p, alpha=wd)
        if self.kind == "lamb" and not exclude:
            scale = _trust_ratio(torch.linalg.vector_norm(p), torch.linalg.vector_norm(update)) * lr
            p.sub_(update.mul_(scale))
        else:
            p.add_(update, alpha=-lr)

    def _step_foreach(self, group, params, grads, ms, vs, coef):
        foreach_update_(self.kind, params, grads, ms, vs, coef, group["lr"], group["beta_1"], group["beta_2"],
                        group["epsilon"], group["weight_decay_rate"], group["exclude"])

    def slot_arrays(self):
        """{"<tf name>/adam_m" | "/adam_v": ndarray}: the optimizer slots in the reference's names."""
        out = {}
        for group in self.param_groups:
            for name, p in zip(group["names"] or [], group["params"]):
                st = self.state.get(p)
                if st:
                    for k in ("adam_m", "adam_v"):
                        a = st[k].detach().cpu().float().numpy()
                        out["%s/%s" % (name, k)] = a.T if name.endswith("/kernel") else a
        return out


def update_coefficients(kind, b1, b2, t):
    """-> (1 - b1, 1 - b2, 1 - b1^t, 1 - b2^t) for update ``t``, as the reference computes them.

    Its LAMB (lamb_optimizer_v1.py) does it in float32: ``1 - beta1_t`` of the float32 beta, and
    the bias corrections from beta1_power / beta2_power, float32 variables that start at beta and
    are multiplied by it after each update. For beta_2 0.999, 1 - float32(0.999) is 0.00099998713:
    1.3e-5 from 0.001, so float64 numbers moved the LayerNorm and bias weights (no trust ratio)
    6e-6 relative off the reference at each update. AdamW (optimization.py) takes 1 - beta in
    Python floats and has no bias correction (None).
    """
    if kind != "lamb":
        return 1.0 - b1, 1.0 - b2, None, None
    one = np.float32(1.0)
    return (float(one - np.float32(b1)), float(one - np.float32(b2)),
            float(one - _beta_power(b1, t)), float(one - _beta_power(b2, t)))


def _beta_power(beta, t):
    """float32 beta^t as the reference's running product, rounded to float32 at each update (t
    float32 products: ~20 us at t = 7,000, so no state is kept between updates)."""
    return np.multiply.accumulate(np.full(t, np.float32(beta), dtype=np.float32))[-1]


def foreach_update_(kind, params, grads, ms, vs, coef, lr, b1, b2, eps, wd, exclude):
    """One LAMB/AdamW update of a group with multi-tensor ops. ``coef``: update_coefficients';
    its bias corrections and ``lr`` are Python numbers (eager) or tensors of one element (the
    compiled step, trainer/step.py: a changing Python number would recompile); with numbers these
    are the exact ops of the eager default."""
    fe = torch
    a1, a2, c1, c2 = coef
    fe._foreach_mul_(ms, b1)
    fe._foreach_add_(ms, grads, alpha=a1)
    fe._foreach_mul_(vs, b2)
    fe._foreach_addcmul_(vs, grads, grads, value=a2)
    if kind == "lamb":
        if torch.is_tensor(c1):  # float64 holding the float32 number, then the tensors' type as eager
            c1, c2 = c1.reshape(()).to(ms[0].dtype), c2.reshape(()).to(vs[0].dtype)
        num = fe._foreach_div(ms, c1)
        den = fe._foreach_div(vs, c2)
        fe._foreach_sqrt_(den)
    else:
        num = ms
        den = fe._foreach_sqrt(vs)
    fe._foreach_add_(den, eps)
    if num is ms:
        update = fe._foreach_div(num, den)
    else:  # num is a temporary: divide in place, one parameter-sized copy fewer
        fe._foreach_div_(num, den)
        update = num
    if not exclude:
        fe._foreach_add_(update, params, alpha=wd)
    if kind == "lamb" and not exclude:
        # One kernel per step for all trust ratios, not one per tensor.
        wn = torch.stack(fe._foreach_norm(params))
        un = torch.stack(fe._foreach_norm(update))
        fe._foreach_mul_(update, (_trust_ratio(wn, un) * lr).unbind())
        fe._foreach_sub_(params, update)
    elif torch.is_tensor(lr):
        fe._foreach_mul_(update, lr)
        fe._foreach_sub_(params, update)
    else:
        fe._foreach_add_(params, update, alpha=-lr)


def _trust_ratio(w_norm, u_norm):
    one = torch.ones_like(w_norm)
    return torch.where(w_norm > 0, torch.where(u_norm > 0, w_norm / u_norm, one), one)


def create_optimizer(model, name="lamb", learning_rate=1e-4, beta_1=0.9, beta_2=0.999, epsilon=1e-6,
                     weight_decay_rate=0.01, foreach=None):
    """LAMB or AdamW over ``model``'s trainable parameters, grouped by the reference exclusions."""
    groups = {False: ([], []), True: ([], [])}
    for pname, p in model.named_parameters():
        if not p.requires_grad:
            continue
        tname = _tf_name(pname)
        params, names = groups[is_excluded(tname)]
        params.append(p)
        names.append(tname)
    param_groups = [dict(params=params, names=names, exclude=ex)
                    for ex, (params, names) in groups.items() if params]
    return BertOptimizer(param_groups, kind=name, lr=learning_rate, beta_1=beta_1, beta_2=beta_2,
                         epsilon=epsilon, weight_decay_rate=weight_decay_rate, foreach=foreach)


def global_norm_scale(tensors, clip_norm=1.0):
    """-> (global norm of ``tensors``, the factor tf.clip_by_global_norm scales them by).

    scale = clip_norm * min(1 / global_norm, 1 / clip_norm): a non-finite norm makes the scale,
    and so every scaled value, non-finite, as in TF.
    """
    norms = torch._foreach_norm(tensors)
    gnorm = torch.linalg.vector_norm(torch.stack([n.float() for n in norms]))
    scale = clip_norm * torch.minimum(1.0 / gnorm, torch.full_like(gnorm, 1.0 / clip_norm))
    scale = scale + (gnorm - gnorm)  # NaN when the norm is inf or NaN, as TF does
    return gnorm, scale


@torch.no_grad()
def clip_by_global_norm_(tensors, clip_norm=1.0):
    """Scale ``tensors`` in place as tf.clip_by_global_norm does; return the global norm."""
    tensors = [t for t in tensors if t is not None]
    if not tensors:
        return torch.tensor(0.0)
    gnorm, scale = global_norm_scale(tensors, clip_norm)
    torch._foreach_mul_(tensors, scale.to(tensors[0].dtype))
    return gnorm
