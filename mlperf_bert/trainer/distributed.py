"""torchrun helpers: process group setup, gradient all-reduce, small collective utilities.

With per-replica clipping (the reference's default) the accumulator all-reduces the
clipped gradients itself, once per update, in flat buckets overlapped with their making
(GradientExchange); with clipping after the reduction the trainer wraps the model in DDP
instead (training.Trainer).
"""
import contextlib
import gc
import os
import signal
import sys
import threading
import time
from datetime import timedelta
from typing import NamedTuple

import torch
import torch.distributed as dist

from mlperf_bert.errors import UserError
from mlperf_bert.start_signals import node_rank, what_is_saved
from mlperf_bert.trainer.launch import PEER_FAILED_AT_START_STATUS, PEER_LOST, PEER_LOST_STATUS, rank_ended_key

PEER_LOST_GRACE_S = 3.0  # a failed rank's interpreter teardown takes about a second (torch's)

_BUCKET_BYTES = 32 << 20
# The gloo group of the host-side collectives of pickled objects (gather_objects), made by setup
# on every rank where the default group is not gloo (NCCL); None: the default group.
_HOST_GROUP = None


def setup(device_kind, output_dir=None):
    """Join the torchrun process group if WORLD_SIZE > 1; return (rank, world_size, local_rank).
    ``output_dir``: the run's, whose checkpoints a join that waited out says (``what_is_saved``)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0, 1, 0
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device_kind == "cuda":
        # more ranks a node than GPUs (torchrun's --nproc_per_node given directly): set_device's
        # "CUDA error: invalid device ordinal" was a traceback on each rank past the last GPU
        gpus = torch.cuda.device_count()
        if local_rank >= gpus:
            raise UserError("local rank %d has no GPU: this node has %d (CUDA_VISIBLE_DEVICES and the container "
                            "decide which); start at most %d ranks a node (python -m mlperf_bert torchrun "
                            "--nproc_per_node=%d, or NUM_GPUS=%d train_model.sh)" % (local_rank, gpus, gpus, gpus, gpus))
        torch.cuda.set_device(local_rank)
    global _HOST_GROUP
    with signals_end_the_process():
        if not dist.is_initialized():
            joined = threading.Event()
            threading.Thread(target=_watch_rank_ended, args=(joined,), name="rank-ended-watch", daemon=True).start()
            try:
                dist.init_process_group(backend="nccl" if device_kind == "cuda" else "gloo")
            except Exception as e:  # no group yet, which peer_loss_is_one_line needs: its traceback came out
                if not _join_waited_out(e):
                    raise
                _never_joined(e, output_dir)
            finally:
                joined.set()
        # NCCL's object collectives pickle into a CUDA tensor and read it back (a device sync, at
        # each checkpoint); a gloo group keeps them in host memory. new_group is a collective: here,
        # where every rank comes, in the same order
        _HOST_GROUP = dist.new_group(backend="gloo") if dist.get_backend() != "gloo" else None
    return dist.get_rank(), dist.get_world_size(), local_rank


def _join_waited_out(e):
    """Whether init_process_group's ``e`` ended a wait for a peer (torch's timeout: a DistStoreError;
    the store's connection gone), not a setting refused at once (a busy MASTER_PORT, a GLOO_SOCKET_IFNAME
    naming no interface: their traceback says what to fix; "a rank did not join", 75, had a job resubmit it)."""
    return isinstance(e, getattr(dist, "DistStoreError", ())) or (_peer_lost(e) and any(
        s in str(e) for s in ("timed out", "Timed out", "timeout", "Connection closed by peer",
                              "Connection reset by peer", "Broken pipe",
                              # the store's node 0 gone as this rank waited in it (its rank ended at its start)
                              "Connection was likely closed")))


def _watch_rank_ended(joined, environ=os.environ, poll_s=0.5, connect_s=10, end=os._exit, delay_s=5.0):
    """Until ``joined`` is set: end this rank at once, in one line, where torchrun's agent of another node says
    (its attempt's RANK_ENDED_KEY in the rendezvous store, torchrun's static one) that one of its ranks ended while this one joins the
    process group, which would wait for it up to torch's timeout (30 min), with the status the agent chose. Only that
    key ends it: a store not reached (node 0's agent gone, or slow with many nodes) is the join's to judge.
    One rank a node watches (local rank 0: torchrun ends the node's others when it ends), and only once the
    join has taken ``delay_s``: node 0's store holds a connection a rank already, and a watcher each
    doubled them (512 ranks: ~1,100 descriptors, past a soft limit of 1,024), where joins take seconds."""
    if environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or not environ.get("MASTER_ADDR") \
            or environ.get("LOCAL_RANK", "0") != "0":
        return  # not under torchrun's agent store, or another rank of this node watches
    if joined.wait(delay_s):
        return
    try:
        store = dist.TCPStore(environ["MASTER_ADDR"], int(environ.get("MASTER_PORT", "0")), is_master=False,
                              timeout=timedelta(seconds=connect_s))
    except Exception:
        return
    status = why = None
    key = rank_ended_key(environ)  # (this attempt's: a restart's ranks are not ended by an earlier attempt's)
    while status is None and not joined.wait(poll_s):
        with contextlib.suppress(Exception):
            if store.check([key]):
                status, _, why = store.get(key).decode("utf-8", "replace").partition(" ")
                status = int(status)
    if status is not None and not joined.is_set():
        then = ("its own line (on its node) says why: fix it, then rerun" if status == PEER_FAILED_AT_START_STATUS
                else "rerun the same command to resume from the newest checkpoint")
        print("error: rank %s %s (%s) as the ranks joined the process group: nothing of this start was trained; %s"
              % (environ.get("RANK", "?"), PEER_LOST, why, then), file=sys.stderr, flush=True)
        end(status)  # os._exit: the main thread waits in torch's C++ join


def _never_joined(e, output_dir=None):
    """A rank's wait for its peers to join the process group ended (torch's process-group timeout: gloo's 30 min, NCCL's 10;
    its store gone): a peer hangs in its start or its node is gone (a peer that failed is ended by
    torchrun, which then ends this rank): one line, PEER_LOST_STATUS, not torch's DistStoreError traceback.
    On one node torchrun's line for the hung rank, killed after this one left, is the run's."""
    print("error: rank %s %s (%s) as the ranks joined the process group: a rank did not join in that time: it "
          "hangs in its start (stopped: kill -STOP, a debugger; its input on a stalled file system) or its node is "
          "gone; nothing of this start was trained: end that rank first; %s" % (
              os.environ.get("RANK", "?"), PEER_LOST, str(e).strip().splitlines()[0][:200],
              what_is_saved(output_dir, node_rank())), file=sys.stderr, flush=True)
    raise SystemExit(PEER_LOST_STATUS) from None


@contextlib.contextmanager
def signals_end_the_process():
    """While a rank makes a process group, it waits in C++ for every peer, where no Python signal
    handler runs until they have come: a peer that died in its start never comes (gloo's 30 min),
    and a stop (SIGTERM, SIGINT) waited for torchrun's SIGKILL after its shutdown timeout, 300 s.
    Here the signals end the process, as their default action does: nothing is done yet that a
    checkpoint would keep (the launcher says nothing was saved; a checkpoint there still holds the run)."""
    old = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(ValueError):  # not the main thread
            if signal.getsignal(sig) is not signal.SIG_IGN:
                old[sig] = signal.signal(sig, signal.SIG_DFL)
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def active():
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def teardown(clean=True):
    """Leave the process group. ``clean``: the run ended normally on every rank.

    DDP's reducer and gloo's threads must go before the group does, and no rank may
    destroy it while another still uses it (else a rank can abort at exit with
    "terminate called without an active exception"): free them, then meet at a barrier.
    After an error the other ranks may never reach the barrier, so it is skipped.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return
    if not clean:  # a peer may be gone: leaving must not add an error of its own
        with contextlib.suppress(Exception):
            gc.collect()
            dist.destroy_process_group()
        return
    gc.collect()
    if dist.get_world_size() > 1:
        try:
            dist.barrier()
        except Exception as e:  # a peer that left after its own end (stopped while it wrote it): this
            if not _peer_lost(e):  # rank's run is done, and it only leaves
                raise
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
            return
    dist.destroy_process_group()


def _peer_lost(e):
    if isinstance(e, getattr(dist, "DistError", ())):
        return True
    text = str(e)
    return isinstance(e, (RuntimeError, ConnectionError)) and any(
        s in text for s in ("gloo", "Gloo", "NCCL", "Connection closed by peer", "Connection reset by peer",
                            "Broken pipe"))


@contextlib.contextmanager
def peer_loss_is_one_line(signals=lambda: 0, stopped=lambda: None, starting=lambda: False, output_dir=None):
    """In a run of several ranks, a collective that fails because another rank died (killed, out of
    memory, its node gone) ends this rank with one line and PEER_LOST_STATUS, not a traceback:
    the dead rank is the news, and the launcher names it. ``signals``: how many stop signals this
    process has had (training._Stop.received); ``stopped()``: after a stop signal, the stop's own
    end (a Terminated, raised instead: the other rank left on the stop), else None; ``starting()``:
    this rank's training has not begun (training._Stop.starting): the other rank ended at its start,
    mostly a refusal that a rerun repeats, so PEER_FAILED_AT_START_STATUS and a line that says so.
    ``output_dir``: the run's, whose checkpoints the line says (``what_is_saved``)."""
    try:
        yield
    except Exception as e:
        if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1 and _peer_lost(e)):
            raise
        end = stopped()
        if end is not None:
            raise end from None
        why = str(e).strip().splitlines()[0][:200]
        if starting():
            status = PEER_FAILED_AT_START_STATUS
            print("error: rank %d %s (%s) before the training began: that rank ended at its start, and its own line "
                  "(on its node) says why (e.g. an input missing on its node, flags other than this rank's); nothing "
                  "of this start was trained: fix what it names, then rerun (exit %d, not %d: a rerun as it is "
                  "ends the same way)" % (dist.get_rank(), PEER_LOST, why, status, PEER_LOST_STATUS),
                  file=sys.stderr, flush=True)
        else:
            status = PEER_LOST_STATUS
            print("error: rank %d %s (%s): %s" % (dist.get_rank(), PEER_LOST, why, what_is_saved(output_dir, node_rank())),
                  file=sys.stderr, flush=True)
        # The rank that failed has printed its line and is leaving (its group torn down first, which
        # is how this rank learnt of it): let it exit with its own status before this one. torchrun
        # SIGTERMs the ranks still alive when one exits, and a failed rank SIGTERMed in its
        # interpreter's teardown would be reported as killed by SIGTERM instead of its own error.
        # That SIGTERM ends the wait: torchrun sends it once it has seen a rank exit (the failed
        # one, on this node), so there is nothing left to wait for (the worker-kill test's 3 s).
        before, deadline = signals(), time.monotonic() + PEER_LOST_GRACE_S
        while signals() == before and time.monotonic() < deadline:
            time.sleep(0.02)
        raise SystemExit(status) from None


class GradientExchange:
    """Per-replica clipping's exchange: the mean over the ranks of each parameter's clipped sum,
    once per update, in flat buckets (few large messages), overlapped with the absorb of the
    last micro-batch: bucket k's all-reduce is started (async) as soon as its sums are made, and
    runs while bucket k + 1's are (on a GPU, NCCL's stream beside the compute stream; its wait
    makes the compute stream wait, not the host). The global norm that clips a micro-batch needs
    its whole gradient, so no bucket can start before the backward ends.

    ``dtype`` (--grad_exchange_dtype): "fp32" sends the sums as they are (the mean is that of one
    flat message a bucket, as before the overlap: bit for bit); "bf16" rounds each bucket to
    bfloat16 on its way into the message (half the bytes), sums it in bfloat16 and divides the sum
    in float32. Without a process group of several ranks the mean is the rank's own."""

    def __init__(self, params, dtype="fp32", bucket_bytes=None):
        bucket_bytes = bucket_bytes or _BUCKET_BYTES
        self.wire = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
        self.world = dist.get_world_size() if active() else 1
        self.buckets, bucket, size = [], [], 0  # indices of ``params``, in their order
        for i, p in enumerate(params):
            bucket.append(i)
            size += p.numel() * p.element_size()
            if size >= bucket_bytes:
                self.buckets.append(bucket)
                bucket, size = [], 0
        if bucket:
            self.buckets.append(bucket)

    def mean(self, absorb):
        """``absorb(indices)`` -> the sums of those parameters (a bucket's), made then; each
        bucket's all-reduce starts as soon as they are. On return every bucket's sums hold their
        mean over the ranks, in place."""
        sent = []
        for bucket in self.buckets:
            tensors = absorb(bucket)
            flat = torch.cat([t.reshape(-1) for t in tensors],
                             out=torch.empty(sum(t.numel() for t in tensors), dtype=self.wire,
                                             device=tensors[0].device))
            sent.append((tensors, flat, dist.all_reduce(flat, async_op=True) if self.world > 1 else None))
        for tensors, flat, work in sent:
            if work is not None:
                work.wait()
            if flat.dtype != tensors[0].dtype:
                flat = flat.to(tensors[0].dtype)
            flat /= self.world
            offset = 0
            for t in tensors:
                n = t.numel()
                t.copy_(flat[offset:offset + n].view_as(t))
                offset += n


def sum_values(values, device):
    """Sum a list of floats over ranks, in float64."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if active():
        dist.all_reduce(t)
    return t.tolist()


class StopVote:
    """Whether any rank wants to stop (SIGTERM, SIGINT), agreed by every rank at the same update,
    without waiting for the device: the signal's number (0: none) is a host byte, voted on by a
    max all-reduce on a gloo group of the host (never NCCL: that would be a device tensor read
    back each update) that is started at one update and read at the next, by when it has long
    finished. A stop asked for before update k is therefore acted on at update k + 1, on every
    rank alike, and every rank names the signal (SIGTERM where ranks got different ones)."""

    def __init__(self):
        with signals_end_the_process():  # a collective: every rank, before the loop's first update
            self.group = dist.new_group(backend="gloo") if active() else None
        self.box = torch.zeros(1, dtype=torch.uint8)  # host memory, reduced in place
        self._read = self.box.numpy()  # its value, read without a tensor op
        self._work = None
        self.met = False  # a vote has completed: every rank was in the loop

    def __call__(self, signum):
        """At an update boundary, every rank: the largest ``signum`` the ranks gave at the previous
        call, the same on every rank; 0 where none gave one (one rank: ``signum`` now)."""
        if self.group is None:
            return int(signum or 0)
        agreed = 0
        if self._work is not None:
            self._work.wait()
            agreed = int(self._read[0])
            self.met = True
        self._read[0] = int(signum or 0)
        self._work = dist.all_reduce(self.box, op=dist.ReduceOp.MAX, group=self.group, async_op=True)
        return agreed

    def close(self):
        """Wait for the vote in flight (before the group goes)."""
        if self._work is not None:
            with contextlib.suppress(Exception):
                self._work.wait()
            self._work = None


def gather_objects(obj):
    """[obj of rank 0, obj of rank 1, ...] on rank 0 (None elsewhere): each rank's state goes to
    the one rank that writes the checkpoint, not to every rank; on the host (gloo) group, never
    through device tensors."""
    if not active():
        return [obj]
    out = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(obj, out, dst=0, group=_HOST_GROUP)
    return out


def broadcast_object(obj):
    """Rank 0's ``obj`` on every rank."""
    if not active():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def refuse_on_every_rank(problem):
    """Rank 0's refusal ``problem`` (its line, or None), raised as one UserError on every rank."""
    problem = broadcast_object(problem)
    if problem:
        raise UserError(problem)


def smallest(value):
    """The smallest of the ranks' ``value``, on every rank."""
    values = gather_objects(value)
    return broadcast_object(min(values) if values else None)


def scatter_objects(objs):
    """``objs[i]`` (given on rank 0) on rank i: each rank receives only its own."""
    if not active():
        return objs[0]
    box = [None]
    dist.scatter_object_list(box, objs if dist.get_rank() == 0 else None, src=0)
    return box[0]


class _Slot(NamedTuple):
    """A tensor's place in a state sent by ``broadcast_state``."""
    shape: tuple
    dtype: torch.dtype


def broadcast_state(obj, device):
    """Rank 0's ``obj`` (dicts, lists and tuples of tensors and plain values, such as a
    state_dict) on every rank: the structure pickled, each tensor sent by a collective on
    ``device`` (the backend's: CUDA for NCCL), so gigabytes of weights are never pickled.
    Every rank gets the tensors in host memory (rank 0 keeps its own): each passes through
    ``device`` one at a time, so the device holds at most one tensor of the state beside the
    run's own (a resume fits where a fresh start fits; tests/test_memory_plan.py)."""
    if not active():
        return obj
    rank0 = dist.get_rank() == 0
    tensors = []

    def strip(x):
        if isinstance(x, torch.Tensor):
            tensors.append(x)
            return _Slot(tuple(x.shape), x.dtype)
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return type(x)(strip(v) for v in x)
        return x

    skeleton = broadcast_object(strip(obj) if rank0 else None)
    sent = iter(tensors)

    def fill(x):
        if isinstance(x, _Slot):
            if rank0:
                t = next(sent)
                dist.broadcast(t.to(device), src=0)
                return t
            t = torch.empty(x.shape, dtype=x.dtype, device=device)
            dist.broadcast(t, src=0)
            return t if t.device.type == "cpu" else t.to("cpu")
        if isinstance(x, dict):
            return {k: fill(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return type(x)(fill(v) for v in x)
        return x

    return fill(skeleton)


def barrier():
    if active():
        dist.barrier()
