"""LAMB / AdamW, the schedule and gradient accumulation against a plain NumPy transcription of the
reference's optimization.py, lamb_optimizer_v1.py and deferred_grad_optimizer.py (float64), over
several updates with accumulation and warmup."""
import copy

import numpy as np
import pytest
import torch

from mlperf_bert.trainer.accumulation import GradientAccumulator
from mlperf_bert.trainer.config import BertConfig
from mlperf_bert.trainer.model import BertForPreTraining
from mlperf_bert.trainer.optimizer import clip_by_global_norm_, create_optimizer
from mlperf_bert.trainer.schedule import learning_rate
from mlperf_bert.trainer.tf_checkpoint import tf_name

CFG = BertConfig(vocab_size=30, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                 intermediate_size=24, max_position_embeddings=8)


# ---- NumPy transcription of the reference ----------------------------------------------------

def np_lr(s, init_lr, T, W, start=0, power=1.0):
    lr = init_lr * (1 - min(s, T) / T) ** power
    if W and s - start < W:
        lr = init_lr * (s - start) / W
    return lr


def np_train(weights, grad_seq, n, kind, lr_args, b1, b2, eps, wd):
    """weights: {tf name: array}; grad_seq: list of {tf name: grad} per micro-step."""
    w = {k: a.astype(np.float64) for k, a in weights.items()}
    m = {k: np.zeros_like(a) for k, a in w.items()}
    v = {k: np.zeros_like(a) for k, a in w.items()}
    acc = {k: np.zeros_like(a) for k, a in w.items()}
    t = 0
    for k, grads in enumerate(grad_seq):
        gn = np.sqrt(sum((g.astype(np.float64) ** 2).sum() for g in grads.values()))
        for name, g in grads.items():
            acc[name] += g * (1.0 / max(gn, 1.0)) / n
        if k % n != n - 1:
            continue
        t += 1
        lr = np_lr(k, *lr_args)
        for name in w:
            g = acc[name]
            skip = any(s in name for s in ("LayerNorm", "layer_norm", "bias"))
            m[name] = b1 * m[name] + (1 - b1) * g
            v[name] = b2 * v[name] + (1 - b2) * g * g
            if kind == "lamb":
                u = (m[name] / (1 - b1 ** t)) / (np.sqrt(v[name] / (1 - b2 ** t)) + eps)
            else:
                u = m[name] / (np.sqrt(v[name]) + eps)
            if not skip:
                u = u + wd * w[name]
            ratio = 1.0
            if kind == "lamb" and not skip:
                wn, un = np.linalg.norm(w[name]), np.linalg.norm(u)
                ratio = wn / un if wn > 0 and un > 0 else 1.0
            w[name] = w[name] - ratio * lr * u
            acc[name] = np.zeros_like(g)
    return w


# ---- helpers ----------------------------------------------------------------------------------

def grad_sequence(model, steps, seed=0):
    """Per micro-step gradients {torch name: tensor}; some norms above 1 (clipped), some below."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for k in range(steps):
        scale = [0.002, 0.5, 0.01, 3.0][k % 4]
        out.append({n: torch.randn(p.shape, generator=g) * scale for n, p in model.named_parameters()})
    return out


def run_torch(kind, n, steps, foreach, lr_args, hp):
    torch.manual_seed(0)
    model = BertForPreTraining(CFG)
    with torch.no_grad():  # a zero weight matrix exercises the trust ratio's w_norm == 0 branch
        model.bert.encoder.layer[0].intermediate.dense.weight.zero_()
    init = {n_: p.detach().clone() for n_, p in model.named_parameters()}
    grads = grad_sequence(model, steps)
    opt = create_optimizer(model, kind, learning_rate=lr_args[0], foreach=foreach, **hp)
    acc = GradientAccumulator(model, opt, n, lambda s: learning_rate(s, *lr_args))
    applied = []
    for k in range(steps):
        for name, p in model.named_parameters():
            p.grad = grads[k][name].clone()
        applied.append(acc.after_backward(k))
    return model, init, grads, applied


HP = dict(beta_1=0.9, beta_2=0.999, epsilon=1e-6, weight_decay_rate=0.01)


@pytest.mark.parametrize("kind,n,foreach,hp,lr_args", [
    ("lamb", 3, False, HP, (1e-2, 40, 5, 0, 1.0)),
    ("lamb", 3, True, HP, (1e-2, 40, 5, 0, 1.0)),
    # The TPU reference's hyperparameters: negative start_warmup_step, beta_2 0.88.
    ("lamb", 2, True, dict(beta_1=0.88, beta_2=0.88, epsilon=1e-6, weight_decay_rate=0.0166629),
     (2.88293e-3, 30, 6, -2, 1.0)),
    ("lamb", 1, False, HP, (1e-2, 8, 3, 0, 0.5)),
    ("adamw", 2, False, HP, (1e-2, 40, 5, 0, 1.0)),
    ("adamw", 2, True, HP, (1e-2, 40, 5, 0, 1.0)),
])
def test_optimizer_matches_numpy_reference(kind, n, foreach, hp, lr_args):
    steps = 12
    model, init, grads, applied = run_torch(kind, n, steps, foreach, lr_args, hp)
    assert applied == [(k + 1) % n == 0 for k in range(steps)]
    tf_w = {tf_name(k): v.numpy() for k, v in init.items()}
    tf_g = [{tf_name(k): v.numpy() for k, v in g.items()} for g in grads]
    expect = np_train(tf_w, tf_g, n, kind, lr_args, hp["beta_1"], hp["beta_2"], hp["epsilon"],
                      hp["weight_decay_rate"])
    moved = 0
    for name, p in model.named_parameters():
        e = expect[tf_name(name)]
        np.testing.assert_allclose(p.detach().numpy(), e, rtol=2e-5, atol=2e-7, err_msg=name)
        moved += not np.allclose(e, init[name].numpy())
    assert moved == len(expect)


def test_foreach_path_equals_per_tensor_path():
    for kind in ("lamb", "adamw"):
        a = run_torch(kind, 2, 6, False, (1e-2, 40, 5, 0, 1.0), HP)[0]
        b = run_torch(kind, 2, 6, True, (1e-2, 40, 5, 0, 1.0), HP)[0]
        for (name, p), q in zip(a.named_parameters(), b.parameters()):
            torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-9, msg=name)


def test_exclusions_follow_reference_names():
    opt = create_optimizer(BertForPreTraining(CFG))
    excluded = {n for g in opt.param_groups if g["exclude"] for n in g["names"]}
    decayed = {n for g in opt.param_groups if not g["exclude"] for n in g["names"]}
    assert "cls/predictions/output_bias" in excluded
    assert "bert/embeddings/LayerNorm/gamma" in excluded
    assert "bert/encoder/layer_0/attention/self/query/bias" in excluded
    assert decayed == {"bert/embeddings/word_embeddings", "bert/embeddings/token_type_embeddings",
                       "bert/embeddings/position_embeddings", "bert/pooler/dense/kernel",
                       "cls/predictions/transform/dense/kernel", "cls/seq_relationship/output_weights"} | {
        "bert/encoder/layer_0/%s/kernel" % d for d in ("attention/self/query", "attention/self/key",
                                                       "attention/self/value", "attention/output/dense",
                                                       "intermediate/dense", "output/dense")}


def test_schedule_hand_values():
    # Warmup from a negative start: step 0 is already 2 steps into the 10-step warmup.
    assert learning_rate(0, 1e-3, 100, 10, start_warmup_step=-2) == pytest.approx(2e-4)
    assert learning_rate(7, 1e-3, 100, 10, start_warmup_step=-2) == pytest.approx(9e-4)
    assert learning_rate(8, 1e-3, 100, 10, start_warmup_step=-2) == pytest.approx(9.2e-4)  # poly: 1-8/100
    assert learning_rate(0, 1e-3, 100, 10) == 0.0
    assert learning_rate(50, 1e-3, 100, 10, poly_power=2.0) == pytest.approx(2.5e-4)
    assert learning_rate(100, 1e-3, 100, 10) == 0.0
    assert learning_rate(250, 1e-3, 100, 10) == 0.0
    assert learning_rate(30, 1e-3, 100, 0) == pytest.approx(7e-4)


def test_clip_matches_tensorflow():
    tf = pytest.importorskip("tensorflow")
    rng = np.random.RandomState(0)
    for scale in (0.01, 5.0):
        arrays = [rng.normal(0, scale, s).astype(np.float32) for s in [(3, 4), (7,), (2, 2, 2)]]
        ts = [torch.from_numpy(a.copy()) for a in arrays]
        gn = clip_by_global_norm_(ts, 1.0)
        clipped, tgn = tf.clip_by_global_norm([tf.constant(a) for a in arrays], 1.0)
        assert gn.item() == pytest.approx(float(tgn), rel=1e-6)
        for t, c in zip(ts, clipped):
            np.testing.assert_allclose(t.numpy(), c.numpy(), rtol=1e-6)
    arrays[1][2] = np.inf  # a non-finite norm poisons every gradient, in TF and here
    ts = [torch.from_numpy(a.copy()) for a in arrays]
    clip_by_global_norm_(ts, 1.0)
    clipped, _ = tf.clip_by_global_norm([tf.constant(a) for a in arrays], 1.0)
    assert all(np.isnan(c.numpy()).all() for c in clipped)
    assert all(torch.isnan(t).all() for t in ts)


def test_accumulator_resume_is_exact():
    """Checkpoint mid-accumulation (model, optimizer, accumulator) and continue: same weights."""
    lr_args = (1e-2, 40, 5, 0, 1.0)
    torch.manual_seed(0)
    model = BertForPreTraining(CFG)
    grads = grad_sequence(model, 9)

    def make(m):
        opt = create_optimizer(m, "lamb", learning_rate=1e-2)
        return opt, GradientAccumulator(m, opt, 3, lambda s: learning_rate(s, *lr_args))

    def feed(m, acc, ks):
        for k in ks:
            for name, p in m.named_parameters():
                p.grad = grads[k][name].clone()
            acc.after_backward(k)

    opt, acc = make(model)
    feed(model, acc, range(5))
    saved = copy.deepcopy((model.state_dict(), opt.state_dict(), acc.state_dict()))
    feed(model, acc, range(5, 9))

    model2 = BertForPreTraining(CFG)
    opt2, acc2 = make(model2)
    model2.load_state_dict(saved[0])
    opt2.load_state_dict(saved[1])
    acc2.load_state_dict(saved[2])
    feed(model2, acc2, range(5, 9))
    for (name, p), q in zip(model.named_parameters(), model2.parameters()):
        assert torch.equal(p, q), name


def test_slot_arrays_use_reference_names_and_layout():
    model, _, _, _ = run_torch("lamb", 1, 2, False, (1e-2, 40, 5, 0, 1.0), HP)
    opt = create_optimizer(model)
    for name, p in model.named_parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    slots = opt.slot_arrays()
    names = {tf_name(n) for n, _ in model.named_parameters()}
    assert set(slots) == {n + s for n in names for s in ("/adam_m", "/adam_v")}
    w = model.bert.encoder.layer[0].intermediate.dense.weight  # torch [out, in], TF [in, out]
    assert slots["bert/encoder/layer_0/intermediate/dense/kernel/adam_m"].shape == tuple(w.shape[::-1])
    # (1 - b2) g^2 with the reference's float32 1 - b2: 0.00099998713
    np.testing.assert_allclose(slots["cls/predictions/output_bias/adam_v"], np.float32(1) - np.float32(0.999), rtol=1e-7)


def test_lamb_coefficients_are_the_reference_float32_ones():
    """The reference's LAMB takes 1 - beta and its bias corrections in float32 (1 - float32(0.999) is
    0.00099998713, not 0.001; beta^t a running float32 product): excluded weights (no trust ratio)
    moved 6e-6 relative off it with float64 ones. Expected: mlcommons/training
    retired_benchmarks/bert/optimization.py run by TF 2.21 in graph mode (its flags at their
    defaults), ``create_optimizer(tf.reduce_sum(v * g), 0.5, 1000, 0, False, "lamb", 1.0, 0, 1)``
    with v the variable cls/predictions/output_bias and g a placeholder fed one row per run."""
    from mlperf_bert.trainer.optimizer import BertOptimizer
    grads = [[0.1, -0.2, 0.05, 0.3], [-0.05, 0.1, 0.2, -0.1], [0.3, 0.0, -0.1, 0.05]]  # norms < 1: unclipped
    expect = [[-0.39999502897262573, 0.2999975085258484, -0.19999000430107117, -0.4999983012676239],
              [-0.533028244972229, 0.4330315589904785, -0.6417315006256104, -0.6999058723449707],
              [-0.8676038980484009, 0.5357638597488403, -0.8094426989555359, -0.9022106528282166]]
    for foreach in (False, True):
        w = torch.nn.Parameter(torch.tensor([0.1, -0.2, 0.3, 0.0]))
        opt = BertOptimizer([dict(params=[w], names=["cls/predictions/output_bias"], exclude=True)], foreach=foreach)
        for k, g in enumerate(grads):
            opt.param_groups[0]["lr"] = learning_rate(k, 0.5, 1000, 0)
            w.grad = torch.tensor(g)
            opt.step()
            np.testing.assert_allclose(w.detach().numpy(), expect[k], rtol=3e-7, atol=0, err_msg=str(k))


# ---- the reference's update run by TensorFlow itself ------------------------------------------

def tf_train(weights, grad_seq, n, lr_args, b1, b2, eps, wd, clip_after=False):
    """The reference's training step in TensorFlow ops (float32, as the reference runs): per
    micro-step tf.clip_by_global_norm(1.0) and accumulation / n into variables; after micro-steps
    n-1, 2n-1, ... LAMB with the learning rate of tf.compat.v1.train.polynomial_decay and the
    reference's linear warmup from start_warmup_step; bias correction by update count.
    ``clip_after``: --clip_by_global_norm_after_gradient_allreduce, where the micro-step gradients
    are accumulated / n unclipped (GradientAggregationOptimizer) and LAMB's apply_gradients clips
    the accumulated gradients once."""
    tf = pytest.importorskip("tensorflow")
    init_lr, T, W, start, power = lr_args
    names = sorted(weights)
    w = {k: tf.Variable(weights[k], dtype=tf.float32) for k in names}
    m = {k: tf.Variable(tf.zeros_like(w[k])) for k in names}
    v = {k: tf.Variable(tf.zeros_like(w[k])) for k in names}
    acc = {k: tf.Variable(tf.zeros_like(w[k])) for k in names}
    t = 0
    for k, grads in enumerate(grad_seq):
        micro = [tf.constant(grads[x], tf.float32) for x in names]
        if not clip_after:
            micro, _ = tf.clip_by_global_norm(micro, 1.0)
        for x, g in zip(names, micro):
            acc[x].assign_add(g / n)
        if k % n != n - 1:
            continue
        t += 1
        if clip_after:
            clipped, _ = tf.clip_by_global_norm([acc[x].value() for x in names], 1.0)
            for x, g in zip(names, clipped):
                acc[x].assign(g)
        lr = tf.compat.v1.train.polynomial_decay(init_lr, k, T, end_learning_rate=0.0, power=power)
        lr = tf.cast(lr() if callable(lr) else lr, tf.float32)
        if W:
            done = tf.cast(k - start, tf.float32) / float(W)
            is_warmup = tf.cast(k - start < W, tf.float32)
            lr = (1.0 - is_warmup) * lr + is_warmup * (init_lr * done)
        for x in names:
            g = acc[x]
            m[x].assign(b1 * m[x] + (1.0 - b1) * g)
            v[x].assign(b2 * v[x] + (1.0 - b2) * tf.square(g))
            update = (m[x] / (1.0 - b1 ** t)) / (tf.sqrt(v[x] / (1.0 - b2 ** t)) + eps)
            excluded = any(s in x for s in ("LayerNorm", "layer_norm", "bias"))
            ratio = 1.0
            if not excluded:
                update += wd * w[x]
                w_norm, u_norm = tf.norm(w[x]), tf.norm(update)
                ratio = tf.where(w_norm > 0, tf.where(u_norm > 0, w_norm / u_norm, 1.0), 1.0)
            w[x].assign_sub(ratio * lr * update)
            acc[x].assign(tf.zeros_like(g))
    return {x: w[x].numpy() for x in names}


@pytest.mark.parametrize("n,hp,lr_args", [
    (3, HP, (1e-2, 40, 5, 0, 1.0)),
    # the TPU reference's hyperparameters: negative start_warmup_step, beta_2 0.88
    (2, dict(beta_1=0.88, beta_2=0.88, epsilon=1e-6, weight_decay_rate=0.0166629), (2.88293e-3, 30, 6, -2, 1.0)),
    (1, HP, (1e-2, 8, 3, 0, 0.5)),
])
def test_lamb_matches_the_reference_update_run_by_tensorflow(n, hp, lr_args):
    steps = 12
    model, init, grads, _ = run_torch("lamb", n, steps, True, lr_args, hp)
    expect = tf_train({tf_name(k): v.numpy() for k, v in init.items()},
                      [{tf_name(k): v.numpy() for k, v in g.items()} for g in grads], n, lr_args,
                      hp["beta_1"], hp["beta_2"], hp["epsilon"], hp["weight_decay_rate"])
    for name, p in model.named_parameters():
        np.testing.assert_allclose(p.detach().numpy(), expect[tf_name(name)], rtol=1e-4, atol=1e-6,
                                   err_msg=name)
        assert not np.allclose(expect[tf_name(name)], init[name].numpy()), name  # it moved


def test_schedule_matches_tensorflow_polynomial_decay_with_reference_warmup():
    tf = pytest.importorskip("tensorflow")
    for init_lr, T, W, start, power in [(1e-4, 1000, 100, 0, 1.0), (2.88293e-3, 600, 287, -76, 1.0),
                                        (3.5e-4, 137, 0, 0, 1.0), (1e-3, 50, 10, 0, 0.5)]:
        for s in list(range(0, 30)) + [W - 77, W - 76, W - 1, W, W + 1, T - 1, T, T + 5]:
            if s < 0:
                continue
            lr = float(tf.compat.v1.train.polynomial_decay(  # float64: the formula, not float32 rounding
                tf.constant(init_lr, tf.float64), s, T, end_learning_rate=0.0, power=power)())
            if W and s - start < W:
                lr = init_lr * (s - start) / W
            # within float32's rounding of step / T (the float32 number itself: the test below)
            assert learning_rate(s, init_lr, T, W, start, power) == pytest.approx(lr, rel=1e-6, abs=init_lr * 1e-6)


@pytest.mark.parametrize("n", [3, 2])
def test_clip_after_allreduce_from_a_tf_checkpoint_matches_the_reference_run_by_tensorflow(n, tmp_path):
    """--clip_by_global_norm_after_gradient_allreduce: six micro-steps with accumulation from a
    checkpoint written by TensorFlow, real backward passes (gradients summed by autograd in
    p.grad, as in training), against the reference's update in TensorFlow with the same flag."""
    from test_checkpoint import CFG as TF_CFG, make_batch, random_weights, write_tf1
    from mlperf_bert.trainer import tf_checkpoint
    prefix = write_tf1(str(tmp_path / "model.ckpt"), random_weights(TF_CFG, seed=5), step=6)
    model = BertForPreTraining(BertConfig.from_dict(dict(TF_CFG, hidden_dropout_prob=0.0,
                                                         attention_probs_dropout_prob=0.0)))
    tf_checkpoint.load_init_checkpoint(model, prefix)
    init = {k: v.detach().clone() for k, v in model.named_parameters()}
    lr_args = (5e-2, 20, 2, 0, 1.0)
    opt = create_optimizer(model, "lamb", learning_rate=lr_args[0], **HP)
    acc = GradientAccumulator(model, opt, n, lambda s: learning_rate(s, *lr_args), clip_after_reduce=True)
    grads, norms = [], []
    for k in range(6):
        before = {name: (p.grad.clone() if p.grad is not None else torch.zeros_like(p))
                  for name, p in model.named_parameters()}
        batch = [torch.from_numpy(np.asarray(a)) for a in make_batch(TF_CFG, seed=10 + k)]
        (model(*batch).loss * (1.0 if k % 2 else 40.0)).backward()  # some updates clipped, some not
        grads.append({name: p.grad - before[name] for name, p in model.named_parameters()})
        if acc.after_backward(k):
            norms.append(acc.last_grad_norm.item())
    assert any(g > 1.0 for g in norms), norms  # clipping was exercised
    expect = tf_train({tf_name(k): v.numpy() for k, v in init.items()},
                      [{tf_name(k): v.numpy() for k, v in g.items()} for g in grads], n, lr_args,
                      HP["beta_1"], HP["beta_2"], HP["epsilon"], HP["weight_decay_rate"], clip_after=True)
    default = tf_train({tf_name(k): v.numpy() for k, v in init.items()},
                       [{tf_name(k): v.numpy() for k, v in g.items()} for g in grads], n, lr_args,
                       HP["beta_1"], HP["beta_2"], HP["epsilon"], HP["weight_decay_rate"])
    differs = 0
    for name, p in model.named_parameters():
        np.testing.assert_allclose(p.detach().numpy(), expect[tf_name(name)], rtol=1e-4, atol=1e-6, err_msg=name)
        assert not np.allclose(expect[tf_name(name)], init[name].numpy()), name  # it moved
        differs += not np.allclose(expect[tf_name(name)], default[tf_name(name)], rtol=1e-4, atol=1e-6)
    assert differs  # the flag changes the result: the test tells the two modes apart


def test_clip_after_reduce_resume_is_exact():
    """Mid-accumulation state of the clip-after mode (the unclipped sum in p.grad) survives a
    checkpoint: continuing from it gives the same weights bit for bit."""
    lr_args = (1e-2, 40, 5, 0, 1.0)
    torch.manual_seed(0)
    model = BertForPreTraining(CFG)
    grads = grad_sequence(model, 9)

    def make(m):
        opt = create_optimizer(m, "lamb", learning_rate=1e-2)
        return opt, GradientAccumulator(m, opt, 3, lambda s: learning_rate(s, *lr_args), clip_after_reduce=True)

    def feed(m, acc, ks):
        for k in ks:
            for name, p in m.named_parameters():  # backward adds to p.grad
                p.grad = grads[k][name].clone() if p.grad is None else p.grad + grads[k][name]
            acc.after_backward(k)

    opt, acc = make(model)
    feed(model, acc, range(5))
    saved = copy.deepcopy((model.state_dict(), opt.state_dict(), acc.state_dict()))
    assert saved[2]["pending"] == 2 and saved[2]["buffers"] is not None
    feed(model, acc, range(5, 9))

    model2 = BertForPreTraining(CFG)
    opt2, acc2 = make(model2)
    model2.load_state_dict(saved[0])
    opt2.load_state_dict(saved[1])
    acc2.load_state_dict(saved[2])
    feed(model2, acc2, range(5, 9))
    for (name, p), q in zip(model.named_parameters(), model2.parameters()):
        assert torch.equal(p, q), name
    with pytest.raises(ValueError, match="clipping mode"):
        GradientAccumulator(model2, opt2, 3, lambda s: 0.0).load_state_dict(saved[2])


def test_learning_rate_is_the_float32_number_the_reference_graph_computes():
    """The reference's learning rate is a float32 tensor of its graph, in which TF's optimizer
    turns the divisions by the step counts into products with float32 reciprocals: our float64
    schedule, rounded to float32 as the update reads it, differed by 1 ulp at 3,367 of these 6,689
    steps. Expected: tests/data/golden/lr_schedule.json.gz, the learning rate the reference's own
    create_optimizer hands its optimizer (TF 2.21, graph mode), for the 13 RCPs of training 5.0.0,
    the reference GPU run's schedule and poly powers 0.5 and 2 (its make_lr_schedule.py)."""
    import gzip
    import json
    import os
    with gzip.open(os.path.join(os.path.dirname(__file__), "data", "golden", "lr_schedule.json.gz"), "rt") as f:
        cases = json.load(f)["cases"]
    assert len(cases) == 16
    for c in cases:
        expect = np.frombuffer(bytes.fromhex(c["lr_f32"]), ">u4")
        ours = np.array([learning_rate(s, c["lr"], c["T"], c["W"], c["start"], c["power"]) for s in c["steps"]],
                        np.float32).view(np.uint32)
        bad = np.flatnonzero(ours != expect)
        assert not len(bad), "%s: step %d: %r, the reference's %r" % (
            c["name"], c["steps"][bad[0]], ours[bad[0]:bad[0] + 1].view(np.float32)[0],
            expect[bad[0]:bad[0] + 1].astype(np.uint32).view(np.float32)[0])
