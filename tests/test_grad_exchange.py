"""The gradient exchange on two gloo ranks (trainer/distributed.py, trainer/accumulation.py).

Per-replica clipping: the clipped sums are all-reduced bucket by bucket while the last
micro-batch is absorbed (GradientExchange), with the arithmetic of the synchronous exchange it
replaced (bit for bit in fp32; --grad_exchange_dtype=bf16 within bfloat16's rounding), and each
bucket's all-reduce is started before the next bucket is absorbed (the order of the calls, not
their timing: gloo on a CPU overlaps nothing a GPU would).

Clipping after the reduction under --compile: DDP under real dynamo (aot_eager), whose DDP
optimizer splits the compiled model at DDP's buckets, trains as eager DDP.
"""
import functools

import pytest
import torch
import torch.distributed as dist

from mlperf_bert.trainer import distributed
from mlperf_bert.trainer.accumulation import GradientAccumulator
from mlperf_bert.trainer.optimizer import BertOptimizer

BUCKET = 256  # bytes: the net's buckets are [w0], [b0, w1], [b1, w2], [b2]
UPDATES = 3


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 4))


def _as_before(tensors, world):
    """The exchange this change replaced (distributed.allreduce_mean), as it was: each bucket
    concatenated, all-reduced and divided, one after the other, after the whole absorb."""
    bucket, size = [], 0
    for i, t in enumerate(tensors):
        bucket.append(t)
        size += t.numel() * t.element_size()
        if size >= BUCKET or i == len(tensors) - 1:
            flat = torch.cat([t.reshape(-1) for t in bucket])
            dist.all_reduce(flat)
            flat /= world
            offset = 0
            for b in bucket:
                b.copy_(flat[offset:offset + b.numel()].view_as(b))
                offset += b.numel()
            bucket, size = [], 0


class _Before(GradientAccumulator):
    """The accumulator with the exchange of before: its update's sums, as each rank made them."""

    def _apply(self, global_step, grads):
        self.local.append([g.clone() for g in grads])
        _as_before(grads, dist.get_world_size())
        return super()._apply(global_step, grads)


def _record(events):
    """Log the absorb's first and last operation on a bucket and each all-reduce, in call order."""
    real = {name: getattr(torch, name) for name in ("_foreach_mul_", "_foreach_add_")}

    def op(name, tensors, *a, **k):
        events.append((name, len(tensors)))
        return real[name](tensors, *a, **k)
    for name in real:
        setattr(torch, name, functools.partial(op, name))
    real_all_reduce = dist.all_reduce

    def all_reduce(t, *a, **k):
        events.append(("all_reduce", t.numel()))
        return real_all_reduce(t, *a, **k)
    dist.all_reduce = all_reduce

    def undo():
        for name, fn in real.items():
            setattr(torch, name, fn)
        dist.all_reduce = real_all_reduce
    return undo


def _run(rank, kind, n):
    """3 updates of n micro-steps of this rank's batches -> (the gradients each update applied,
    the sums each rank made (before only), the events of the last micro-step, the weights)."""
    model = _net()
    opt = BertOptimizer([dict(params=list(model.parameters()), names=None)], kind="lamb", lr=1e-2)
    if kind == "before":
        acc = _Before(model, opt, n, lambda step: 1e-2)
        acc.local = []
    else:
        acc = GradientAccumulator(model, opt, n, lambda step: 1e-2, exchange=distributed.GradientExchange(
            list(model.parameters()), kind, bucket_bytes=BUCKET))
    applied, real_step = [], opt.step

    def step(*a, **k):
        applied.append([p.grad.clone() for p in model.parameters()])
        return real_step(*a, **k)
    opt.step = step
    gen = torch.Generator().manual_seed(rank)
    events = []
    for i in range(UPDATES * n):
        x, y = torch.randn(4, 8, generator=gen), torch.randn(4, 4, generator=gen)
        torch.nn.functional.mse_loss(model(x), y).backward()
        undo = _record(events) if i == UPDATES * n - 1 else None
        try:
            assert acc.after_backward(i) == ((i + 1) % n == 0)
        finally:
            if undo:
                undo()
    return applied, getattr(acc, "local", None), events, [p.detach().clone() for p in model.parameters()]


def _exchanges(rank, world):
    distributed.setup("cpu")
    out = {(kind, n): _run(rank, kind, n) for n in (1, 2) for kind in ("before", "fp32", "bf16")}
    distributed.teardown()
    return out


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """One 2-rank launch for the exchange's tests (the DDP test, slow, has its own)."""
    from test_host_syncs import free_ports, run_pieces, run_ranks
    tmp = str(tmp_path_factory.mktemp("two_ranks"))
    return run_ranks(run_pieces, free_ports(1), [("exchanges", _exchanges, ())], tmp=tmp, timeout=240)


def test_fp32_exchange_overlapped_is_the_exchange_of_before_bit_for_bit(two_ranks):
    """2 gloo ranks, each its own batches, 3 updates, 1 and 2 micro-steps an update: the
    gradients each update applies and the weights after equal those of the synchronous exchange
    bit for bit on both ranks, and the ranks agree."""
    from test_host_syncs import piece
    ranks = piece(two_ranks, "exchanges")
    for n in (1, 2):
        for out in ranks:
            before, now = out["before", n], out["fp32", n]
            assert len(now[0]) == UPDATES
            for u in range(UPDATES):
                assert all(torch.equal(a, b) for a, b in zip(now[0][u], before[0][u])), (n, u)
            assert all(torch.equal(a, b) for a, b in zip(now[3], before[3])), n
        assert all(torch.equal(a, b) for a, b in zip(ranks[0]["fp32", n][3], ranks[1]["fp32", n][3]))
        # the ranks' own sums differ: the exchange had something to average
        assert not torch.equal(ranks[0]["before", n][1][0][0], ranks[1]["before", n][1][0][0])


def test_bf16_exchange_is_the_mean_within_bfloat16_rounding(two_ranks):
    """--grad_exchange_dtype=bf16: the first update's gradients are the two ranks' fp32 sums
    (of the synchronous run: the same until then) each rounded to bfloat16, summed in bfloat16,
    divided in float32 (gloo's bfloat16 sum of two ranks: one rounding), exactly; so within two
    roundings at bfloat16's 2 ** -8 of the fp32 mean, relative to the sums' magnitudes, and not
    equal to it. Later updates train on (finite)."""
    from test_host_syncs import piece
    ranks = piece(two_ranks, "exchanges")
    for n in (1, 2):
        mine = [out["before", n][1][0] for out in ranks]  # each rank's sums at the first update
        for out in ranks:
            got, fp32 = out["bf16", n][0][0], out["before", n][0][0]
            for i, (a, b) in enumerate(zip(*mine)):
                want = (a.bfloat16() + b.bfloat16()).float() / 2
                assert torch.equal(got[i], want), (n, i)
                assert torch.all((got[i] - fp32[i]).abs() <= 2 ** -7 * (a.abs() + b.abs()) / 2), (n, i)
            assert any(not torch.equal(g, f) for g, f in zip(got, fp32))
            assert all(torch.isfinite(w).all() for w in out["bf16", n][3])


def test_each_buckets_all_reduce_starts_before_the_next_bucket_is_absorbed(two_ranks):
    """The last micro-step of an update (2 micro-steps an update, 4 buckets): bucket k is
    clipped and added to its buffers, then its all-reduce is started, then bucket k + 1 is
    absorbed; the synchronous exchange of before absorbed all 6 tensors first (the control)."""
    from test_host_syncs import piece
    sizes = [(1, 128), (2, 272), (2, 80), (1, 4)]  # (tensors, elements) of each bucket
    for out in piece(two_ranks, "exchanges"):
        for kind in ("fp32", "bf16"):
            assert out[kind, 2][2] == [e for k, numel in sizes for e in (
                ("_foreach_mul_", k), ("_foreach_add_", k), ("all_reduce", numel))], kind
        assert out["before", 2][2] == [("_foreach_mul_", 6), ("_foreach_add_", 6)] + [
            ("all_reduce", numel) for _, numel in sizes]


# ---------------------------------------------------------------- DDP under dynamo

MID = {"vocab_size": 64, "hidden_size": 384, "num_hidden_layers": 1, "num_attention_heads": 4,
       "intermediate_size": 1536, "hidden_act": "gelu", "hidden_dropout_prob": 0.0,
       "attention_probs_dropout_prob": 0.0, "max_position_embeddings": 32, "type_vocab_size": 2,
       "initializer_range": 0.02}  # 8.4 MB of fp32 parameters: 2 MB buckets split it


def _ddp_compiled(rank, world, tmp):
    """In a spawned rank, clipping after the reduction (DDP), fp32: eager at the trainer's
    bucket cap, then --compile under dynamo, the model with the aot_eager backend, at 2 MB buckets
    (dynamo's DDP optimizer splits the model's graph at each), at 2 micro-steps an update (no_sync) and at
    1 (DDP's static graph) -> {run: (bucket cap, model graphs compiled by the first update,
    after it, the weights)}."""
    import pathlib
    from test_levers import _batch, _train, _trainer
    from mlperf_bert.trainer import levers
    real = torch.compile
    graphs = []

    def model_backend(gm, example_inputs):
        graphs.append(len(gm.graph.nodes))
        return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)

    # the model's graphs counted (aot_eager: AOTAutograd makes their backward); the update's not,
    # traced by dynamo and run by its eager backend: it runs under no_grad, so AOTAutograd has no
    # backward to make of it, and its compile's rounding is test_compiled_step.py's (aot_eager on
    # it too cost each rank 2-3 s of its 2 first updates)
    def compile(fn=None, **kw):
        return real(fn, backend=model_backend if isinstance(fn, torch.nn.Module) else "eager", **kw)
    torch.compile = compile
    distributed.setup("cpu")
    gen = torch.Generator().manual_seed(rank)
    batches = [_batch(gen, False) for _ in range(3)]
    out = {"cap": levers.DDP_BUCKET_MB}
    for name, compiled, cap, n in [("eager", False, None, 2), ("split", True, 2, 2), ("eager1", False, None, 1),
                                   ("split1", True, 2, 1)]:
        levers.DDP_BUCKET_MB = cap or out["cap"]
        torch._dynamo.reset()
        del graphs[:]
        d = pathlib.Path(tmp) / ("r%d-%s" % (rank, name))
        d.mkdir()
        t = _trainer(d, "--clip_by_global_norm_after_gradient_allreduce", *(["--compile"] * compiled),
                     steps_per_update=n, cfg=MID, dtype="fp32", rank=rank, world=world)
        _train(t, batches, n)
        seen = len(graphs)
        _train(t, batches, 3 * n)
        out[name] = (t.ddp.bucket_bytes_cap, seen, len(graphs) - seen,
                     {k: v.clone() for k, v in t.model.state_dict().items()})
    distributed.teardown(clean=False)
    return out


@pytest.fixture(scope="module")
def two_ranks_ddp(tmp_path_factory):
    from test_host_syncs import free_ports, run_pieces, run_ranks
    tmp = str(tmp_path_factory.mktemp("two_ranks_ddp"))
    return run_ranks(run_pieces, free_ports(1), [("ddp", _ddp_compiled, (tmp,))], tmp=tmp, timeout=480)


@pytest.mark.slow
def test_ddp_under_dynamo_splits_at_its_buckets_and_trains_as_eager_ddp(two_ranks_ddp):
    """--compile --clip_by_global_norm_after_gradient_allreduce on 2 gloo ranks, real dynamo
    (the model's graphs under aot_eager: dynamo's graphs and its DDP optimizer, AOTAutograd's
    backward; the update traced by dynamo, run by its eager backend; torch.compile not replaced): the trainer's DDP has levers.DDP_BUCKET_MB's buckets (128 MB); at 2 MB
    buckets dynamo splits this 8.4 MB model into several graphs (its first is DDP's first bucket,
    1 MiB), all compiled in the first update and none after (3 more updates); the weights after
    4 updates equal eager DDP's within 1e-5 (the compiled update rounds otherwise:
    test_compiled_step.py), with accumulation (no_sync) and at one micro-step an update
    (static_graph); the ranks agree bit for bit."""
    from test_host_syncs import piece
    ranks = piece(two_ranks_ddp, "ddp")
    for out in ranks:
        assert out["cap"] == 128
        for name in ("eager", "split", "eager1", "split1"):
            assert out[name][0] == (2 if name.startswith("split") else out["cap"]) << 20, name
        for name, eager in (("split", "eager"), ("split1", "eager1")):
            assert out[name][1] >= 4 and out[name][2] == 0, (name, out[name][1:3])
            w, e = out[name][3], out[eager][3]
            assert max((w[k] - e[k]).abs().max().item() for k in w) < 1e-5, name
    for name in ("eager", "split", "split1"):
        w0, w1 = ranks[0][name][3], ranks[1][name][3]
        assert all(torch.equal(w0[k], w1[k]) for k in w0), name
