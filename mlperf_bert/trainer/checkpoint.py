"""Training checkpoints: model.ckpt-<step>.pt files, RNG state, run identity, the finished marker.

A checkpoint holds the model, the optimizer, every rank's RNG and accumulator state (gathered to
rank 0 on the host), the step, the eval state, the config and the run's identity (its defining
flags, seed and data files), so a resume continues bit for bit or is refused in one line.
Only rank 0 reads and writes these files (other nodes may have other disks).
"""
import contextlib
import os
import random
import shlex
import threading
import time

import numpy as np
import torch

from mlperf_bert.errors import UserError
from mlperf_bert.trainer import distributed, run_config
from mlperf_bert.fileio import OutputDirError, atomic_save, load_json, write_json
from mlperf_bert.start_signals import CKPT_RE

FINISHED = "run_finished.json"
STOPPED = "run_stopped.json"  # written at run_stop; gives way to FINISHED once the run's end is written
LOG_OWNER = "mlperf_log_path.json"


# The trainer's arithmetic: raised by a change to the code that makes a run's sums round otherwise
# (1: LAMB's 1 - beta and bias corrections in float32, 2026-12-04), so that a resume from a checkpoint
# of another says it will end bit-identical to neither version's uninterrupted run, as one under
# another torch does
ARITHMETIC = 1


def arithmetic_of(ckpt):
    """The ARITHMETIC of the code that wrote ``ckpt``; None for a checkpoint that does not say and
    names no torch (written before 2026-12-06; its code may round as this one or as the code before
    revision 1). One that names its torch but no revision was written at revision 1."""
    if "arithmetic" in ckpt:
        return ckpt["arithmetic"]
    return 1 if "torch" in ckpt else None


def torch_version():
    """The torch this process runs, as checkpoints and launch records name it (a plain str:
    torch's ``TorchVersion`` does not pass a weights-only load)."""
    return str(torch.__version__)


def path_for(output_dir, step):
    return os.path.join(output_dir, "model.ckpt-%d.pt" % step)


def run_held_in(output_dir):
    """The file that shows a training run in ``output_dir`` (its end's record, else its newest
    checkpoint), or None."""
    for name in (FINISHED, STOPPED):
        if os.path.exists(os.path.join(output_dir, name)):
            return name
    found = list_checkpoints(output_dir)
    return os.path.basename(found[-1][1]) if found else None


def list_checkpoints(output_dir):
    """[(global step, path)] of complete checkpoints, oldest first (temp files never match)."""
    if not os.path.isdir(output_dir):
        return []
    found = [(int(m.group(1)), os.path.join(output_dir, n))
             for n in os.listdir(output_dir) for m in [CKPT_RE.match(n)] if m]
    return sorted(found)


def rng_state(device):
    # Only tensors and plain values, so checkpoints load with torch.load(weights_only=True).
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {"torch": torch.get_rng_state(), "python": random.getstate(),
             "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss),
                       float(gauss)]}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state, device):
    torch.set_rng_state(state["torch"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    random.setstate(state["python"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


@torch.no_grad()
def load_optimizer(optimizer, state):
    """``optimizer.load_state_dict(state)``, ``state``'s tensors in host memory (a resume receives
    the checkpoint there), copied in place into the slots that exist already (the warm-up's): their
    addresses stay (CUDA graphs replay on them, marked static; new tensors would make inductor
    record the update again or give up its graphs), and no second set of slots is made on the
    device (torch's load_state_dict casts every slot to the parameter's device first: 2.5 GiB of
    BERT-Large's LAMB slots beside the run's own). A slot the checkpoint lacks (saved before the
    first update) stays, zeroed, at step 0: the first update's arithmetic on it is that of a new
    one; a slot that does not exist yet is made on the parameter's device, as an update makes it."""
    old = {p: dict(st) for p, st in optimizer.state.items()}
    # torch's checks and the groups' hyper-parameters; the slots are filled below
    optimizer.load_state_dict({"state": {}, "param_groups": state["param_groups"]})
    saved_ids = [i for g in state["param_groups"] for i in g["params"]]
    param_of = dict(zip(saved_ids, (p for g in optimizer.param_groups for p in g["params"])))
    for i, saved in state["state"].items():
        p, was = param_of[i], old.get(param_of[i], {})
        st = optimizer.state[p]
        for k, v in saved.items():
            w = was.get(k)
            if not torch.is_tensor(v):
                st[k] = v
            elif torch.is_tensor(w) and w.shape == v.shape and w.dtype == v.dtype:
                st[k] = w.copy_(v)
            else:  # as torch's load_state_dict casts it
                dtype = p.dtype if p.is_floating_point() and v.is_floating_point() else v.dtype
                st[k] = v.to(device=p.device, dtype=dtype, copy=True)
    for p, was in old.items():
        if not optimizer.state.get(p):
            optimizer.state[p] = {k: v.zero_() if torch.is_tensor(v) else 0 for k, v in was.items()}


def unwritable(output_dir, reason):
    """The one-line UserError for ``output_dir`` holding a run and not writable (``reason``: why), or None
    where it holds none: another --output_dir would start the run over, so the fix is to make it writable."""
    held = run_held_in(output_dir) if os.path.isdir(output_dir) else None
    if held is None:
        return None
    return UserError("--output_dir %s holds a run (%s) but cannot be written (%s): make it writable (a read-only "
                     "mount remounted read-write, its permissions), then rerun the same command; another "
                     "--output_dir would start a new run" % (output_dir, held, reason))


@contextlib.contextmanager
def _writing_in(output_dir):
    """Around a write into the folder of a run going on: one made unwritable since the start (a read-only
    remount, its permissions) is said as ``unwritable`` says it (check_writable_dir's "choose another
    output path" would start the run over)."""
    try:
        yield
    except OutputDirError as e:
        raise (unwritable(output_dir, e.reason) or e) from None


def save(path, state, keep):
    """Write ``state`` atomically, then drop all but the newest ``keep`` checkpoints."""
    with _writing_in(os.path.dirname(path)):
        atomic_save(path, lambda f: torch.save(state, f))
    if keep > 0:
        for _, old in list_checkpoints(os.path.dirname(path))[:-keep]:
            with contextlib.suppress(OSError):
                os.remove(old)


def _pinned(nbytes):
    """Page-locked host memory (torch's caching host allocator reuses it checkpoint after checkpoint)."""
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)


def _on_device(storage):
    return storage.device.type != "cpu"


def pinned_copies(device):
    """Whether checkpoints are copied from ``device`` into pinned host buffers on a side stream
    (``_Copier``): from a CUDA device."""
    return device is not None and torch.device(device).type == "cuda"


class HostBuffers:
    """Page-locked host buffers for the checkpoints' copies from a CUDA device, one a storage of
    the state, allocated once in the untimed init (``Trainer.reserve_checkpoint_buffers``, before
    run_start): each save's copy takes them by size, so no save allocates pinned memory on the
    training thread (cudaHostAlloc of BERT-Large's 4 GB with its LAMB slots takes about a second
    and synchronises the device; torch's caching host allocator would otherwise do it at the
    first save, on the clock). ``sizes``: the storages' bytes."""

    def __init__(self, sizes):
        self._all = {}
        for n in sizes:
            self._all.setdefault(n, []).append(_pinned(n))
        self.reset()

    @classmethod
    def for_state(cls, model, optimizer):
        """Buffers for ``model``'s and ``optimizer``'s state (a storage once, however many views);
        slots the first update has not made yet counted as it will make them (two a parameter)."""
        tensors, to_come = list(model.state_dict().values()), []
        for group in optimizer.param_groups:
            for p in group["params"]:
                st = optimizer.state.get(p)
                if st:
                    tensors += [v for v in st.values() if torch.is_tensor(v)]
                else:  # its two slots, zeros_like(p) at the first update (BertOptimizer.advance_slots)
                    to_come += [p.numel() * p.element_size()] * 2
        storages = {(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()) for t in tensors}
        return cls([n for _, n in storages] + to_come)

    def reset(self):
        """Every buffer free (the write of the last copy has ended: BackgroundWriter.wait)."""
        self._free = {n: list(bufs) for n, bufs in self._all.items()}

    def take(self, nbytes):
        """A free buffer of ``nbytes``; one more, kept for the next saves, if none is left (a state
        the reservation did not foresee)."""
        free = self._free.get(nbytes)
        if free:
            return free.pop()
        buf = _pinned(nbytes)
        self._all.setdefault(nbytes, []).append(buf)
        return buf


class _Copier:
    """Copies storages to host memory. From a CUDA device: into pinned buffers (``buffers``'s, or
    new ones), ``non_blocking``, on a side stream that first waits for the training stream (so it
    copies the values as they are now), with ``event`` recorded after the last copy; the training
    stream goes on at once. Elsewhere: a plain copy."""

    def __init__(self, device, buffers=None):
        self.cuda = pinned_copies(device)
        self.buffers = buffers
        if buffers is not None:
            buffers.reset()
        self.stream = None
        if self.cuda:
            self.stream = torch.cuda.Stream(device)
            self.stream.wait_stream(torch.cuda.current_stream(device))

    def __call__(self, storage):
        if not (self.cuda and _on_device(storage)):  # a state's host tensors (RNG states): cloned
            return storage.clone() if storage.device.type == "cpu" else storage.cpu()
        src = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
        dst = self.buffers.take(src.numel()) if self.buffers is not None else _pinned(src.numel())
        with torch.cuda.stream(self.stream):
            dst.copy_(src, non_blocking=True)
        src.record_stream(self.stream)  # the allocator keeps its memory until the copy is done
        return dst.untyped_storage()

    def done(self):
        """The event after the last copy (None: nothing is in flight)."""
        if not self.cuda:
            return None
        event = torch.cuda.Event()
        event.record(self.stream)
        return event


def host_copy_async(obj, device=None, buffers=None):
    """-> (``obj`` with every tensor copied to host memory, an event to synchronise on before
    the copy is read, or None). The copies from a CUDA ``device`` are queued (``_Copier``), into
    ``buffers`` (HostBuffers) where given: the device's tensors must not change before the
    training stream has waited on the event (``torch.cuda.current_stream().wait_event``), nor the
    buffers before the copy is written. Views of one storage stay views of one copy, so
    ``torch.save`` writes the same file as it would of the originals."""
    copier = _Copier(device, buffers)
    out = _copied(obj, {}, copier)
    return out, copier.done()


def host_copy(obj):
    """``obj`` with every tensor copied to host memory, complete (``host_copy_async`` waited for),
    so that training may change the originals while a background writer saves the copy."""
    out, done = host_copy_async(obj, _device_of(obj))
    if done is not None:
        done.synchronize()
    return out


def _device_of(obj):
    if torch.is_tensor(obj):
        return obj.device if obj.device.type == "cuda" else None
    for v in (obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else ()):
        d = _device_of(v)
        if d is not None:
            return d
    return None


def _copied(obj, memo, copier):
    if torch.is_tensor(obj):
        storage = obj.untyped_storage()
        key = (storage.device, storage.data_ptr(), storage.nbytes())
        if key not in memo:
            memo[key] = copier(storage)
        return torch.empty(0, dtype=obj.dtype).set_(memo[key], obj.storage_offset(), obj.size(), obj.stride())
    if isinstance(obj, dict):
        out = type(obj)((k, _copied(v, memo, copier)) for k, v in obj.items())
        if hasattr(obj, "_metadata"):  # a module's state_dict: its version numbers
            out._metadata = obj._metadata
        return out
    if isinstance(obj, (list, tuple)) and type(obj) in (list, tuple):
        return type(obj)(_copied(v, memo, copier) for v in obj)
    return obj


class BackgroundWriter:
    """Checkpoints written on a thread while training goes on (a BERT-Large checkpoint with its
    LAMB state is 4 GB): ``submit`` hands over a state that nothing changes any more (a
    ``host_copy``, or a ``host_copy_async`` with its event) and returns; it first waits for the
    write before it, so one state is held at a time. Each write is ``save``'s (a temporary name,
    renamed when complete), so a process killed during a write leaves no file that looks
    finished. ``wait`` returns once nothing is being written and raises the last write's error
    (a full disk: the one-line UserError)."""

    def __init__(self):
        self._thread = None
        self._error = None
        self.path = None  # the checkpoint being written, or None

    def submit(self, path, state, keep, ready=None):
        """``ready``: an event the copy in ``state`` is complete after (``host_copy_async``);
        the thread synchronises on it before writing."""
        self.wait()

        def write():
            try:
                if ready is not None:
                    ready.synchronize()
                save(path, state, keep)
            except BaseException as e:  # raised in the training thread by the next wait()
                self._error = e

        self.path = path
        thread = threading.Thread(target=write, name="checkpoint-writer", daemon=True)
        try:
            thread.start()
        except RuntimeError:  # "can't start new thread" (the process limit): written now instead
            write()
            return
        self._thread = thread

    def wait(self, raise_error=True):
        """Without ``raise_error``: the last write's error, or None (the caller says it)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.path = None
        error, self._error = self._error, None
        if error is not None and raise_error:
            raise error
        return error


TRAINING_STATE = ("optimizer", "ranks", "seed", "global_step")  # what a resume reads beside the weights


def _how_to_go_on(path, ended=False):
    """What to do about checkpoint ``path`` of ``output_dir`` that cannot be resumed from: delete it,
    naming the one before that the resume then takes, or, where it is the only one, restore it.
    ``ended``: the final checkpoint of a run that ended, read for --do_eval's eval: no rerun trains it
    again (its run_stop is logged), so deleted, that eval is lost (it said to delete it "to resume")."""
    if ended:
        return ("it holds the final weights of a run that ended (its run_stop is logged; no rerun trains them again): "
                "restore it from a copy for --do_eval's eval of them (deleted, that eval cannot be made)")
    earlier = [p for _, p in list_checkpoints(os.path.dirname(path)) if os.path.abspath(p) != os.path.abspath(path)]
    return ("delete it to resume from the one before, %s" % os.path.basename(earlier[-1]) if earlier else
            "it is the run's only checkpoint: restore it from a copy (deleted, the run would start over from step 0)")


def load(path, ended=False):
    """A training checkpoint of ``output_dir`` (``model.ckpt-N.pt``), to resume from (``ended``: the
    final one of a run that ended, to evaluate: ``_how_to_go_on``)."""
    from mlperf_bert.trainer.tf_checkpoint import load_pt, step_problem
    try:
        ckpt = load_pt(path)
    except UserError as e:  # a damaged file: name it, and how to go on
        raise UserError("%s; %s" % (getattr(e, "reason", e), _how_to_go_on(path, ended))) from None
    lacks = [k for k in TRAINING_STATE if k not in ckpt]
    if lacks:  # e.g. convert_checkpoint.py's .pt, given a training checkpoint's name (a KeyError traceback)
        raise UserError("checkpoint %s holds weights but no training state (no %s): a run did not write it while "
                        "training (a converted checkpoint?), and --output_dir's checkpoints are what a run resumes from: move it "
                        "out of --output_dir (to start from its weights, give its new path as --init_checkpoint)"
                        % (path, ", ".join(lacks)))
    problem = step_problem(ckpt["global_step"])
    if problem:  # a hand-edited or foreign .pt: a traceback where the loop compared it, a float hung the loader
        raise UserError("checkpoint %s holds %s, not a step count (a whole number >= 0, which the trainer writes): "
                        "it was edited, or written by another program; %s" % (path, problem, _how_to_go_on(path, ended)))
    return ckpt


def check_step_within(ckpt, path, num_train_steps):
    """Refuse checkpoint ``path`` whose step is past the run's last (--num_train_steps, which a resume
    keeps): no run writes one, and its resume went on from it without a word (a log past its budget)."""
    if ckpt["global_step"] > num_train_steps:
        raise UserError("checkpoint %s holds global_step %d, beyond --num_train_steps=%d, the run's last step: it was "
                        "edited, or written by another program; %s"
                        % (path, ckpt["global_step"], num_train_steps, _how_to_go_on(path)))


def load_on_every_rank(path, rank, device, check, ended=False):
    """The checkpoint at ``path`` (on rank 0's disk) on every rank, read by rank 0 alone (``ended``: ``load``'s).

    Rank 0 loads it and calls ``check(ckpt)``; a UserError there is raised on every rank.
    Every rank gets the step and eval state, the model and optimizer state (their tensors
    sent by collectives on ``device``, received in host memory: a resume then copies them in
    place) and, as ``rank_state``, its own entry of ``ranks`` only.
    """
    ckpt, problem = None, None
    if rank == 0:
        try:
            ckpt = load(path, ended)
            check(ckpt)
        except UserError as e:
            problem = str(e)
    distributed.refuse_on_every_rank(problem)
    big = ("model", "optimizer", "ranks")
    out = distributed.broadcast_object({k: v for k, v in ckpt.items() if k not in big} if rank == 0 else None)
    for key in ("model", "optimizer"):
        out[key] = distributed.broadcast_state(ckpt[key] if rank == 0 else None, device)
    out["rank_state"] = distributed.scatter_objects(ckpt["ranks"] if rank == 0 else None)
    return out


_FILES = {"input_file": "the training files", "eval_input_file": "the eval files"}


def _described(name, value, was):
    """How a difference in an identity entry that is not a flag's value is named, or None."""
    if name == "config":
        keys = sorted(k for k in set(value or {}) | set(was or {}) if (value or {}).get(k) != (was or {}).get(k))
        return "the model config of --bert_config_file: %s" % ", ".join(
            "%s=%s (was %s)" % (k, (value or {}).get(k), (was or {}).get(k)) for k in keys)
    if name in _FILES:
        value, was = value or [], was or []
        if len(value) != len(was):
            return "%s (%d, where the run had %d)" % (_FILES[name], len(value), len(was))
        now, then = next((v, w) for v, w in zip(value, was) if not _same_file(v, w))
        if os.path.basename(now[0]) == os.path.basename(then[0]) and now[1] == then[1]:
            return "%s (%s: another content of the same size, where the run had %s)" % (_FILES[name], now[0], then[0])
        return "%s (%s, %d bytes, where the run had %s, %d bytes)" % (_FILES[name], now[0], now[1], then[0], then[1])
    if name == "init_checkpoint":
        return "--init_checkpoint (its name, size or content)"
    return None


def _same_file(entry, was):
    """Whether a data file's [path, bytes, content tag(, record CRCs)] is the one a run recorded: by
    its name, size and tag, not its folder, so that the same files mounted elsewhere (a requeued
    job's, a symbolic link) resume; a run recorded before tags were ([path, bytes]), or a file
    without one: by name and size; a TFRecord's tag of record 0 alone (before the sampled bytes,
    checksums.content_tag): by that part; the digest of every record's CRC (checksums.scanned_crcs)
    where both sides have it (a run started or resumed under --check_data=none, or by a version
    before it, has none; an earlier version, which compares the first three, resumes a checkpoint
    that has it)."""
    tags = entry[2:3] + was[2:3]
    if len(tags) == 2 and None not in tags and (";" in tags[0]) != (";" in tags[1]):
        tags = [t.split(";")[0] for t in tags]
    crcs = entry[3:4] + was[3:4]
    return (os.path.basename(entry[0]) == os.path.basename(was[0]) and entry[1] == was[1]
            and (len(tags) < 2 or None in tags or tags[0] == tags[1])
            and (len(crcs) < 2 or None in crcs or crcs[0] == crcs[1]))


def with_recorded_crcs(ident, saved):
    """``ident`` with the record-CRC digests of the files ``saved`` (the resumed checkpoint's
    identity) has and this start did not scan (--check_data=none): kept for the next resume, which
    one resume without the scan would otherwise drop from every later checkpoint."""
    ident = dict(ident)
    for name in _FILES:
        now, was = ident.get(name), saved.get(name)
        if isinstance(now, list) and isinstance(was, list) and len(now) == len(was):
            ident[name] = [v[:3] + w[3:4] if len(v) == 3 and len(w) > 3 and _same_file(v, w) else v
                           for v, w in zip(now, was)]
    return ident


def _same_init(entry, was):
    """Whether an --init_checkpoint's [path, bytes, digest] is the one a run recorded: by its name,
    size and content, not its folder (a resume does not read it, and a requeued job may see it
    mounted elsewhere); by its name alone once it is gone on either side ([path, None, None]:
    preflight.check_start; the ranks of nodes with disks of their own, preflight.check_same_settings,
    may see it gone on one and not another)."""
    return os.path.basename(entry[0]) == os.path.basename(was[0]) and (
        None in (entry[1], was[1]) or entry[1:] == was[1:])


def _differing(saved, ident):
    """[(name, value, saved value)] of the entries that ``saved`` (an older identity) holds with
    another value (an entry either side lacks is not compared: one an older version did not write,
    or a flag that one of the two runs does not use, RunConfig.identity)."""
    def same(name, value, was):
        if name in _FILES and isinstance(value, list) and isinstance(was, list):
            return len(value) == len(was) and all(_same_file(v, w) for v, w in zip(value, was))
        if name == "init_checkpoint" and isinstance(value, list) and isinstance(was, list):
            return len(value) == len(was) == 3 and _same_init(value, was)
        return value == was
    return [(name, value, saved[name]) for name, value in ident.items() if name in saved
            and not same(name, value, saved[name])]


def not_given(name, was):
    """Where train_model.sh started this run (MLPERF_BERT_PRESET) and --NAME is not among the flags given
    over its preset (MLPERF_BERT_OVERRIDES), the note that its value is the preset's or the trainer's default
    and the flag that keeps the run's ``was``, else "": an update of the code between a run's stop and its
    rerun (a git pull) can change either, and the refusal named a flag the command never gave."""
    preset = os.environ.get("MLPERF_BERT_PRESET")
    try:
        given = shlex.split(os.environ.get("MLPERF_BERT_OVERRIDES") or "")
    except ValueError:
        return ""
    names = {a[2:].split("=", 1)[0] for a in given if a.startswith("--")}
    if not preset or {name, "no" + name, "config"} & names:  # (a --config file's flags are given too)
        return ""
    return ("not given by this command: preset %s's value or the trainer's default, which an update of the "
            "code since the run started can change; add --%s=%s to the command to keep the run's" % (preset, name, was))


def differences(saved, ident, rerun=False):
    """The entries of ``ident`` that ``saved`` (an older identity) has with another value, as
    ``--flag=now (was then)`` or a description of what changed; ``rerun``: ``saved`` is the run's that
    this command reruns, and a flag this command does not give says so (``not_given``)."""
    return [_described(name, value, was) or "--%s=%s (was %s%s)" % (
        name, value, was, rerun and not_given(name, was) and "; " + not_given(name, was) or "")
        for name, value, was in _differing(saved, ident)]


def check_same_run(saved, ident, ckpt_path):
    """Refuse a resume whose defining flags, model config or data differ from the checkpoint's,
    in one line that names the checkpoint (one of another run, put in this folder, is found by it)."""
    for name, value, was in _differing(saved, ident)[:1]:
        what = _described(name, value, was)
        folder, ckpt_name = os.path.dirname(ckpt_path), os.path.basename(ckpt_path)
        where = ("%s (checkpoint %s)" % (folder, ckpt_name) if what else
                 "%s (it has %s), as its checkpoint %s records" % (folder, was, ckpt_name))
        fix = (not what and not_given(name, was)) or "rerun with the same value"
        raise UserError("%s %s from the run being resumed in %s: %s, or use another --output_dir for a new run"
                        % (what or "--%s=%s" % (name, value), "differ" if name in _FILES else "differs", where, fix))


def write_log_owner(output_dir, log_path):
    """Record that this output_dir's run writes ``log_path``: its restart before the first
    checkpoint may empty that log (an MLPerf log outside output_dir is otherwise left alone)."""
    write_json(os.path.join(output_dir, LOG_OWNER), {"mlperf_log": os.path.abspath(log_path)})


def read_log_owner(output_dir):
    """The MLPerf log path this output_dir's run writes, or None."""
    try:
        with open(os.path.join(output_dir, LOG_OWNER), encoding="utf-8") as f:
            owned = load_json(f).get("mlperf_log")
    except (OSError, ValueError, AttributeError):
        return None
    return owned if isinstance(owned, str) and owned else None  # (an int would be taken for a descriptor)


def _read_marker(output_dir, name):
    """The record in ``output_dir/name``, None when there is none; one that cannot be read is one
    line: the run it marks has ended, and deleting the marker would train it again over its log."""
    path = os.path.join(output_dir, name)
    try:
        with open(path, encoding="utf-8") as f:
            record = load_json(f)
        # (an older version's finished marker may lack the run's identity)
        keys = ("status", "global_step", "samples", "run", "mlperf_log") if name == STOPPED else ("status",)
        if not isinstance(record, dict) or any(k not in record for k in keys):
            raise ValueError("not the trainer's record: it lacks %s"
                             % ", ".join(k for k in keys if not isinstance(record, dict) or k not in record))
        if name == STOPPED and not (isinstance(record["global_step"], int) and isinstance(record["run"], dict)
                                    and isinstance(record["mlperf_log"], list) and len(record["mlperf_log"]) == 2):
            raise ValueError("not the trainer's record: a value of the wrong type")
        return record
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise UserError("cannot read %s (%s): the run it marks has ended (its run_stop is logged); keep its log "
                        "and use another --output_dir for a new run (deleting it would train the run again over its "
                        "log)" % (path, getattr(e, "strerror", None) or e))


def read_finished(output_dir):
    """The finished marker of a run that ended (dict), or None."""
    return _read_marker(output_dir, FINISHED)


def read_stopped(output_dir):
    """The record of a run that logged its run_stop and has not written its finished marker (a
    kill while its final checkpoint or --do_eval's eval was written), or None."""
    return _read_marker(output_dir, STOPPED)


def end_record(status, step, samples, run=None, launch=None):
    """What the markers hold: ``run``: the run's identity, so a rerun with other flags is refused;
    ``launch``: how it was started (``launch_record``), which ``package`` puts in launch.json."""
    return {"status": status, "global_step": step, "samples": samples, "run": run, "launch": launch}


def write_stopped(output_dir, record):
    """At run_stop: ``record`` (``end_record``'s, with the log's mark) says the result is the log's
    as it stands, so a rerun after a kill finishes what is left instead of training again."""
    with _writing_in(output_dir):
        write_json(os.path.join(output_dir, STOPPED), record, default=str)


def add_to_finished(output_dir, record, run_entries):
    """Rewrite the finished marker ``record`` (as read) with ``run_entries`` added to its run's
    identity (--do_eval's eval batches, its eval done after the run finished), the rest as it was."""
    if run_entries and isinstance(record.get("run"), dict):
        write_json(os.path.join(output_dir, FINISHED), dict(record, run=dict(record["run"], **run_entries)),
                   default=str)


def write_finished(output_dir, record):
    """The finished marker (``end_record``'s and when), which replaces the run_stop record."""
    record = {k: v for k, v in record.items() if k not in ("mlperf_log", "metrics", "world")}
    record["finished"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    with _writing_in(output_dir):
        write_json(os.path.join(output_dir, FINISHED), record, default=str)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(output_dir, STOPPED))


def launch_record(cfg, world, resumes=()):
    """How this run was started: train_model.sh's preset and the flags given over it
    (MLPERF_BERT_PRESET, MLPERF_BERT_OVERRIDES; None when the trainer was started otherwise), every
    flag the trainer was given, its processes and nodes (torchrun's LOCAL_WORLD_SIZE), its torch, the code
    (``harness.package.source_identity``: git commit, modified, digest of the implementation) and
    ``resumed_at_steps``, the steps a stop's rerun resumed it at (none: one uninterrupted session)."""
    from mlperf_bert.harness.package import source_identity
    local = int(os.environ.get("LOCAL_WORLD_SIZE") or world)
    record = {"preset": os.environ.get("MLPERF_BERT_PRESET"), "overrides": os.environ.get("MLPERF_BERT_OVERRIDES"),
              "flags": cfg.given_flags(),
              "processes": world, "processes_per_node": local, "nodes": max(1, world // max(1, local)),
              "torch": torch_version(),  # (package warns of a submission's runs under several)
              "resumed_at_steps": list(resumes)}
    if cfg.config_file:  # --config: the file given, and the resolved config the run wrote at its start
        given, digest = cfg.config_file
        record["config"] = {"file": os.path.abspath(given), "sha256": digest,
                            "resolved": os.path.abspath(run_config.resolved_path(cfg)),
                            "resolved_sha256": run_config.resolved_digest(cfg)}
    record.update(source_identity())
    return record
