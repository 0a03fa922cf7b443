"""No host syncs between logging boundaries: over several updates the micro-step loop (loader,
forward, backward, clipping, accumulation, LAMB) calls nothing that would make the host wait for
the GPU. This machine has no GPU (torch.cuda.set_sync_debug_mode needs one), so every Tensor
method that reads a value back to the host is counted while the loop runs on CPU: .item(),
.cpu(), .tolist(), .numpy(), bool()/int()/float() of a tensor, and nonzero (a data-dependent
shape). The loader's own host-side batches (still in host memory) are not the device's and do
not count."""
import json
import os
import signal
import sys
import traceback

import pytest
import torch

from mlperf_bert.dataset import packing, tfrecord
from mlperf_bert.trainer import loader, training

TINY = {"vocab_size": 30522, "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
        "intermediate_size": 32, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1, "max_position_embeddings": 128, "type_vocab_size": 2,
        "initializer_range": 0.02}
SYNCS = ("item", "cpu", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__", "nonzero")
STEPS = 8  # 4 updates of 2 micro-steps


@pytest.fixture(scope="module")
def files(golden_dir, tmp_path_factory):
    d = tmp_path_factory.mktemp("syncs")
    unpacked = str(d / "train.tfrecord")
    recs = list(tfrecord.read_records(os.path.join(golden_dir, "part-00000.s128.tfrecord")))
    tfrecord.write_records(unpacked, recs[:200])
    packed = str(d / "train.packed.hdf5")
    packing.pack_file(unpacked, packed, 128, 20, 3, 1)
    config = str(d / "config.json")
    with open(config, "w") as f:
        json.dump(TINY, f)
    return {"unpacked": unpacked, "packed": packed, "config": config}


def _argv(files, kind, out, clip_after):
    # logs and checkpoints only at the end: every micro-step before the last is between boundaries
    return ["run_pretraining.py", "--bert_config_file=" + files["config"], "--input_file=" + files[kind],
            "--output_dir=" + out, "--do_train", "--train_batch_size=4", "--steps_per_update=2",
            "--num_train_steps=%d" % STEPS, "--num_warmup_steps=2", "--optimizer=lamb", "--seed=3",
            "--num_workers=0", "--log_frequency=1000", "--save_checkpoints_steps=1000", "--noprogress",
            "--learning_rate=1e-3", "--%sclip_by_global_norm_after_gradient_allreduce" % ("" if clip_after else "no")]


def _count_syncs(monkeypatch):
    """Patch the read-back methods; return (calls, window): calls counted while window[0] is set."""
    calls, window, host, alive = [], [False], set(), []
    for name in SYNCS:
        real = getattr(torch.Tensor, name)

        def counted(self, *a, _real=real, _name=name, **k):
            if window[0] and id(self) not in host:
                calls.append((_name, "".join(traceback.format_stack(limit=6)[:-1])))
            return _real(self, *a, **k)
        monkeypatch.setattr(torch.Tensor, name, counted)
    real_make = loader.make_loader

    def make_loader(ds, n, **kwargs):
        # The loader (worker processes on a GPU machine) reads host memory: it waits for no
        # device, and neither does the loop reading the batch it hands over.
        batches = iter(real_make(ds, n, **kwargs))
        while True:
            was, window[0] = window[0], False
            try:
                batch = next(batches)
            except StopIteration:
                return
            finally:
                window[0] = was
            host.update(id(v) for v in batch.values())
            alive.append(batch)  # so no other tensor takes their ids
            yield batch
    monkeypatch.setattr(loader, "make_loader", make_loader)
    real_step = training.Trainer.step

    def step(self, batch, global_step):
        window[0] = True  # from the first micro-step to the end of the last one
        try:
            return real_step(self, batch, global_step)
        finally:
            if global_step == STEPS - 1:
                window[0] = False
    monkeypatch.setattr(training.Trainer, "step", step)
    return calls


@pytest.mark.parametrize("kind", ["unpacked", "packed"])
@pytest.mark.parametrize("clip_after", [False, True], ids=["clip_each", "clip_after"])
def test_micro_step_loop_never_waits_for_the_device(files, kind, clip_after, tmp_path, monkeypatch):
    torch.set_num_threads(1)
    calls = _count_syncs(monkeypatch)
    assert training.main(_argv(files, kind, str(tmp_path / "out"), clip_after)) == 0
    assert os.path.exists(tmp_path / "out" / ("model.ckpt-%d.pt" % STEPS))
    assert not calls, "%d host syncs, the first:\n%s %s" % (len(calls), calls[0][0], calls[0][1])


def test_the_counter_sees_a_sync(files, tmp_path, monkeypatch):
    """The same counting fails a loop that reads the loss back every micro-step."""
    real = training.Trainer.step

    def step(self, batch, global_step):
        loss, updated = real(self, batch, global_step)
        loss.item()
        return loss, updated
    monkeypatch.setattr(training.Trainer, "step", step)
    calls = _count_syncs(monkeypatch)
    assert training.main(_argv(files, "unpacked", str(tmp_path / "out"), False)) == 0
    assert [name for name, _ in calls] == ["item"] * STEPS


def test_the_levers_add_no_host_sync(files, tmp_path, monkeypatch):
    """--fp8 (per-tensor amax scales, computed and applied on the device) and --fused_qkv wait for
    no device either: packed rows, clipping after the all-reduce."""
    torch.set_num_threads(1)
    calls = _count_syncs(monkeypatch)
    argv = _argv(files, "packed", str(tmp_path / "out"), True) + ["--dtype=bf16", "--fp8", "--fused_qkv"]
    assert training.main(argv) == 0
    assert os.path.exists(tmp_path / "out" / ("model.ckpt-%d.pt" % STEPS))
    assert not calls, "%d host syncs, the first:\n%s %s" % (len(calls), calls[0][0], calls[0][1])


# ---------------------------------------------------------------- two ranks (gloo)

def _rank_main(rank, world, port, out, target, args):
    import pickle
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    try:
        result = (True, target(rank, world, *args))
    except BaseException:  # the parent shows it
        result = (False, traceback.format_exc())
    with open("%s.%d" % (out, rank), "wb") as f:
        pickle.dump(result, f)
    # The result is written: skip the interpreter's teardown of torch's modules (0.4-0.8 s of CPU a
    # rank), which the parent never sees
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# What the ranks' fork server imports once: the ranks are forked from it (a spawned rank paid
# torch's import and these modules', 3-5 s of CPU each)
RANK_MODULES = ["test_host_syncs", "test_levers"]


def _start_fork_server(ctx):
    """multiprocessing's fork server, with RANK_MODULES imported (once per pytest process)."""
    from multiprocessing import forkserver
    ctx.set_forkserver_preload(RANK_MODULES)
    # Python 3.11's server takes no sys.path from this process: tests/ reaches it by PYTHONPATH
    here = os.path.dirname(os.path.abspath(__file__))
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([here, os.path.dirname(here)] + ([old] if old else []))
    try:
        forkserver.ensure_running()
    finally:
        if old is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = old


def run_ranks(target, *args, world=2, timeout=240, tmp=None):
    """``target(rank, world, *args)`` in ``world`` new processes (torchrun's environment, a gloo
    rendezvous on loopback; ``target`` must be a module-level function): its results by rank.
    An exception in a rank fails the caller with its traceback. The ranks are forked from
    multiprocessing's fork server (a fresh interpreter, no threads, RANK_MODULES imported), not
    from this process (pytest's, with its threads and state)."""
    import multiprocessing
    import pickle
    import socket
    import tempfile
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = multiprocessing.get_context("forkserver")
    _start_fork_server(ctx)
    out = os.path.join(tmp or tempfile.mkdtemp(), "rank")
    procs = [ctx.Process(target=_rank_main, args=(r, world, port, out, target, args)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout)
    for p in procs:
        if p.is_alive():
            p.kill()
    results = []
    for r in range(world):
        assert os.path.exists("%s.%d" % (out, r)), "rank %d gave no result (exit %s)" % (r, procs[r].exitcode)
        with open("%s.%d" % (out, r), "rb") as f:
            ok, value = pickle.load(f)
        assert ok, "rank %d:\n%s" % (r, value)
        results.append(value)
    return results


class _Patch:
    """monkeypatch's setattr and undo for a spawned rank."""

    def __init__(self):
        self.saved = []

    def setattr(self, obj, name, value):
        self.saved.append((obj, name, getattr(obj, name)))
        setattr(obj, name, value)

    def undo(self):
        for obj, name, value in reversed(self.saved):
            setattr(obj, name, value)
        self.saved = []


def _syncs_of_two_ranks(rank, world, files, out, clip_after):
    patch = _Patch()
    calls = _count_syncs(patch)
    try:
        assert training.main(_argv(files, "unpacked", out, clip_after)) == 0
    finally:
        patch.undo()  # the next piece of the launch (run_pieces) counts on its own
    return [(name, stack) for name, stack in calls]


def free_ports(n):
    """``n`` different loopback ports, free now."""
    import contextlib
    import socket
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


def run_pieces(rank, world, ports, pieces):
    """In a spawned rank: ``fn(rank, world, *args)`` of each (name, fn, args) in turn, one launch
    for several tests (each spawned rank pays torch's import) -> {name: (ok, result or traceback)}.
    Each piece meets at a port of its own (``ports``): a rank still leaving the previous piece's
    store must not be the one the other rank connects to."""
    out = {}
    for (name, fn, args), port in zip(pieces, ports):
        os.environ["MASTER_PORT"] = str(port)
        try:
            out[name] = (True, fn(rank, world, *args))
        except BaseException:  # the test of this piece shows it
            out[name] = (False, traceback.format_exc())
    return out


def piece(ranks, name):
    """The results by rank of the piece ``name`` of a run_pieces launch; a rank's failure fails it."""
    for rank, out in enumerate(ranks):
        ok, value = out[name]
        assert ok, "rank %d, %s:\n%s" % (rank, name, value)
    return [out[name][1] for out in ranks]


@pytest.fixture(scope="module")
def two_ranks(files, tmp_path_factory):
    """One 2-rank launch for this file's 2-rank tests: the stop vote, then the sync counts of both
    clipping modes -> (its directory, the results by rank)."""
    tmp = str(tmp_path_factory.mktemp("two_ranks"))
    pieces = [("votes", _votes, (3,))] + [
        ("syncs%d" % c, _syncs_of_two_ranks, (files, os.path.join(tmp, "out%d" % c), c)) for c in (0, 1)]
    return tmp, run_ranks(run_pieces, free_ports(len(pieces)), pieces, tmp=tmp, timeout=480)


@pytest.mark.slow
@pytest.mark.parametrize("clip_after", [False, True], ids=["clip_each", "clip_after_ddp"])
def test_two_ranks_wait_for_no_device_between_boundaries(two_ranks, clip_after):
    """2 gloo ranks, 4 updates of 2 micro-steps: no host sync in the loop on either rank, the
    SIGTERM check at each update included (a vote of the host, read one update later; it was an
    all-reduce of a device tensor and .item() every update). Per-replica clipping all-reduces
    the buffers; clipping after the reduction is DDP's. (Both modes run in one launch.)"""
    tmp, ranks = two_ranks
    out = os.path.join(tmp, "out%d" % clip_after)
    for rank, calls in enumerate(piece(ranks, "syncs%d" % clip_after)):
        assert not calls, "rank %d: %d host syncs, the first:\n%s %s" % (rank, len(calls), calls[0][0], calls[0][1])
    assert os.path.exists(os.path.join(out, "model.ckpt-%d.pt" % STEPS))


def _votes(rank, world, raise_at):
    from mlperf_bert.trainer import distributed
    distributed.setup("cpu")
    vote = distributed.StopVote()
    # rank 1 alone gets a SIGINT (2) before update raise_at, rank 0 a SIGTERM (15) one update later
    got = [vote(signal.SIGINT if rank == 1 and i >= raise_at else
                signal.SIGTERM if rank == 0 and i > raise_at else 0) for i in range(raise_at + 3)]
    vote.close()
    distributed.teardown()
    return got


@pytest.mark.slow
def test_the_stop_vote_agrees_on_every_rank_one_update_later(two_ranks):
    """Rank 1 alone asks to stop before update 3: both ranks stop at update 4, none earlier, and
    both name rank 1's signal (SIGINT: rank 0, which got none, said SIGTERM and exited 143); when
    rank 0 gets a SIGTERM too, both name SIGTERM."""
    a, b = piece(two_ranks[1], "votes")
    assert a == b == [0] * 4 + [signal.SIGINT, signal.SIGTERM]
