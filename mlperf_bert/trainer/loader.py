"""Input pipeline: pre-training records -> batches of tensors, deterministic and resumable.

The global record stream is a pure function of (files, seed, shuffle): epoch ``e`` visits
the files in an order drawn from ``rng(seed, e)`` and passes record *descriptors*
(file, offset, length) through a seeded shuffle buffer. Global batch ``i`` is stream
records ``[i*B, (i+1)*B)``; rank ``r`` of ``R`` takes the contiguous slice
``[i*B + r*B/R, i*B + (r+1)*B/R)``. With ``shuffle=False`` the stream is the files in the
given order, records in file order, so 2 ranks x batch 8 read exactly what one process
reads as two micro-batches of 4.

Resuming at batch ``k`` replays the stream of descriptors, which only reads the 12-byte
record headers, and decodes nothing before batch ``k``. DataLoader worker ``w`` of ``W``
builds batches ``w, w+W, ...``; PyTorch hands them out round-robin, i.e. in order.
"""
import collections
import contextlib
import errno
import functools
import multiprocessing
import os
import re
import signal
import sys
import time
import weakref

import numpy as np
import torch

from mlperf_bert.errors import UserError, die_with_parent, ended, is_process_limit, shm_full
from mlperf_bert.fileio import LOADER_PROCESSES, check_tmpdir, process_limit
from mlperf_bert.start_signals import node_rank, what_is_saved
from mlperf_bert.dataset.example import (decode_pretraining_batch, decode_pretraining_example, value_problem,  # noqa: F401
                                         values_refusal)  # (value_problem: packed_loader's too)
from mlperf_bert.dataset.tfrecord import (check_data, crcs_digest, expand_paths, read_records, record_crcs,
                                          scan_records)

INT_FEATURES = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids")
HDF5_SUFFIXES = (".hdf5", ".h5")


def is_hdf5(path):
    return path.endswith(HDF5_SUFFIXES)


def past_vocab(batch, vocab_size):
    """[rows] bool: the rows of ``batch`` holding a token id of ``vocab_size`` or more."""
    return (batch["input_ids"] >= vocab_size).any(1) | (batch["masked_lm_ids"] >= vocab_size).any(1)


def _hdf5_count(path):
    from mlperf_bert.dataset import hdf5, packing
    with hdf5.open_file(path) as h:  # packed files are counted in rows
        if "max_sequences_per_pack" not in h.attrs:
            hdf5.check_unpacked(h, path)
        elif "input_ids" not in h:
            packing.read_attrs(path)  # its one-line error
        return int(h["input_ids"].shape[0])


def scan(path, crcs=None):
    """Descriptors of the records of one file: (offset, length) for TFRecords, (index, 0) for HDF5.
    A file of none is refused (hdf5.check_layout for HDF5). ``crcs``: tfrecord.scan_records'."""
    if is_hdf5(path):
        return ((i, 0) for i in range(_hdf5_count(path)))
    return _scan_tfrecords(path, crcs)


def _scan_tfrecords(path, crcs=None):
    from mlperf_bert.dataset import hdf5
    if hdf5.is_hdf5_file(path):  # (its first bytes read as a record: "corrupt length")
        hdf5.refuse_nvidia_file(path)  # NVIDIA's packed shards are named part_00000: a rename would not do
        raise UserError("%s is an HDF5 file (it starts with HDF5's signature), but the trainer reads files not named "
                        "*.hdf5 or *.h5 as TFRecords: rename it *.hdf5" % path)
    records = scan_records(path, crcs)
    first = next(records, None)
    if first is None:  # as to-hdf5 and pack refuse it: a wrong path or a failed run's output, not an epoch's share
        raise UserError("%s holds no records: check the paths, or make it again" % path)
    yield first
    yield from records


def open_file_cap():
    """How many input files a reader keeps open: a quarter of this process's limit (RLIMIT_NOFILE),
    at least 16. Kept open, every file of an input of more files than the limit ended the run mid-way
    ('Too many open files'; an HDF5 file's 'is not an HDF5 file')."""
    import resource
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return 4096 if soft == resource.RLIM_INFINITY else max(16, min(soft // 4, 4096))


def stamps(files):
    """{path: what identifies the file it names now}: a file renamed over it or rewritten differs. Size
    and modification time, not the inode: a FUSE mount (without use_ino) may number one file anew."""
    out = {}
    for path in files:
        st = os.stat(path)
        out[path] = (st.st_size, st.st_mtime_ns)
    return out


def check_unchanged(path, taken):
    """Refuse ``path`` when it is no longer the file of ``taken`` (``stamps``, at the run's start).
    Files are opened as the stream reaches them, hours into a run: one that another command replaced
    meanwhile (make-dataset, to-hdf5 or pack rerun into the input's folder) was read as "corrupt
    (data CRC mismatch)", or worse, its new records silently trained on. A file with new times alone
    (its checksums those the start read: ``_same_records``) is the run's data, read on."""
    if path not in taken:
        return
    try:
        now = stamps([path])[path]
    except FileNotFoundError:
        now = None
    if now != taken[path]:
        if now is not None and now[0] == taken[path][0] and _same_records(path, now[0]):
            taken[path] = now  # new times alone (copied without them: rsync without -t, cp -r; touched)
            return
        raise UserError("%s was %s while this run read it (by another command, since the run started): a run trains "
                        "on the data it started with; put that file back, or write new data elsewhere and start a new "
                        "run in another --output_dir" % (path, "removed" if now is None else "replaced or rewritten"))


def _same_records(path, size):
    """Whether ``path`` (``size`` bytes) holds the records this process's start saw: a TFRecord's
    each record's CRC in order (checksums.scanned_crcs; one scan of its headers, as the start's), an
    HDF5 or packed file's datasets' CRC-32Cs (checksums.tagged: its attributes, as the start read
    them; its rows are checked against their own as they are read). False where the start took none
    (--check_data=none; an HDF5 file made without them)."""
    from mlperf_bert.dataset import checksums
    if is_hdf5(path):
        tag = checksums.tagged(path, size)
        return bool(tag) and tag.startswith("crc32c:") and checksums.content_tag(path) == tag
    digest = checksums.scanned_crcs(path, size)
    if digest is None:
        return False
    crcs = record_crcs()
    try:
        for _ in scan(path, crcs):
            pass
    except (UserError, OSError):
        return False
    return crcs_digest(crcs) == digest


class OpenFiles:
    """Open files by path, made by ``open_one(path)``: at most ``open_file_cap()`` at once, the least
    recently used closed first (reopened when read again); each checked against ``taken`` (``stamps``)
    as it is opened."""

    def __init__(self, open_one, taken=None):
        self.open_one, self.cap, self.taken = open_one, open_file_cap(), taken or {}
        self.files = collections.OrderedDict()

    def get(self, path):
        f = self.files.pop(path, None)
        if f is None:
            while len(self.files) >= self.cap:
                self.files.popitem(last=False)[1].close()
            check_unchanged(path, self.taken)  # (before the open: its checks would call the new file damaged)
            f = self.open_one(path)
            try:
                check_unchanged(path, self.taken)  # (and after: replaced in between, it opened the new one)
            except UserError:
                f.close()
                raise
        self.files[path] = f
        return f

    def close(self):
        while self.files:
            self.files.popitem()[1].close()


class _Reader:
    """Reads and decodes records by descriptor; keeps files open (OpenFiles)."""

    def __init__(self, max_seq_length, max_predictions_per_seq, vocab_size=None, taken=None):
        self.seq, self.pred, self.vocab_size = max_seq_length, max_predictions_per_seq, vocab_size
        self.files = OpenFiles(self._open_new, taken)

    def _open(self, path):
        return self.files.get(path)

    def _open_new(self, path):
        if not is_hdf5(path):
            return open(path, "rb")
        from mlperf_bert.dataset import hdf5
        f = hdf5.open_file(path)
        try:
            hdf5.check_unpacked(f, path)
            if f["input_ids"].shape[1] != self.seq:
                raise UserError("%s holds sequences of length %d, not --max_seq_length=%d: use "
                                "matching data" % (path, f["input_ids"].shape[1], self.seq))
        except UserError:
            f.close()
            raise
        return f

    def read(self, path, offset, length, index):
        """One decoded record (arrays of length [seq] / [pred] / [1])."""
        return {name: a[0] for name, a in self.read_batch([(path, offset, length, index)]).items()}

    def _read_data(self, path, offset, length, index):
        f = self._open(path)
        f.seek(offset)
        buf = f.read(length + 4)
        check_data(path, index, buf[:length], buf[length:])
        return buf[:length]

    def _read_one(self, path, offset, length, index):
        if not is_hdf5(path):
            return decode_pretraining_example(self._read_data(path, offset, length, index), self.seq, self.pred,
                                              where="%s: record %d" % (path, index))
        return self._read_hdf5(path, [offset])[0]

    def _read_hdf5(self, path, rows):
        """Records ``rows`` of an HDF5 file, in that order, each checked against its row checksum
        (hdf5.read_rows) as it is read."""
        from mlperf_bert.dataset import hdf5
        uniq, inverse = np.unique(np.asarray(rows, np.int64), return_inverse=True)
        stored = hdf5.read_rows(self._open(path), path, hdf5.FEATURE_NAMES, uniq)
        out = []
        for i in inverse.tolist():
            row = {name: stored[name][i].reshape(-1) for name in hdf5.FEATURE_NAMES}
            out.append(_check_lengths(row, self.seq, self.pred, "%s: record %d" % (path, uniq[i])))
        return out

    def read_batch(self, items):
        """Decoded records [(path, offset, length, index)] as batch arrays: one C call for
        TFRecords (decode_pretraining_batch), one read per feature and HDF5 file."""
        if any(is_hdf5(item[0]) for item in items):
            rows, by_file = [None] * len(items), {}
            for j, item in enumerate(items):
                if is_hdf5(item[0]):
                    by_file.setdefault(item[0], []).append(j)
                else:
                    rows[j] = self._read_one(*item)
            for path, js in by_file.items():
                for j, row in zip(js, self._read_hdf5(path, [items[j][1] for j in js])):
                    rows[j] = row
            out = {name: np.stack([r[name] for r in rows]) for name in rows[0]}
            # (an HDF5 row written without row checksums: nothing else checks its values; the decoder
            # checked a TFRecord's, as below)
            problem = values_refusal(out, lambda j: "%s: record %d" % (
                items[j][0], items[j][1] if is_hdf5(items[j][0]) else items[j][3]), self.seq)
            if problem:
                raise problem
        else:
            out = decode_pretraining_batch([self._read_data(*item) for item in items], self.seq, self.pred,
                                           where=lambda i: "%s: record %d" % (items[i][0], items[i][3]))
        if self.vocab_size is not None:
            over = past_vocab(out, self.vocab_size)
            if over.any():
                row = int(np.flatnonzero(over)[0])
                top = max(int(out["input_ids"][row].max()), int(out["masked_lm_ids"][row].max()))
                path, offset, _, index = items[row]
                raise UserError("%s: record %d has token id %d but the model's vocab_size is %d: use the "
                                "bert_config.json that matches the vocab the data was made with (and a new "
                                "--output_dir, if this run has written a checkpoint: a resume keeps its config)"
                                % (path, offset if is_hdf5(path) else index, top, self.vocab_size))
        return out

    def close(self):
        self.files.close()


def _check_lengths(feats, seq, pred, where):
    from mlperf_bert.dataset.example import feature_lengths
    for name, length in feature_lengths(seq, pred).items():
        if feats[name].shape[0] != length:
            raise UserError("%s: feature %s has length %d, expected %d: check --max_seq_length and "
                            "--max_predictions_per_seq against the data"
                            % (where, name, feats[name].shape[0], length))
    return feats


def record_stream(files, seed, shuffle, buffer_size, repeat=True, taken=None):
    """Yield (path, offset, length, index in file) of the global record stream, epoch after epoch;
    each file checked against ``taken`` (``stamps``) before it is scanned."""
    epoch = 0
    while True:
        rng = np.random.Generator(np.random.PCG64([seed, epoch]))
        order = rng.permutation(len(files)) if shuffle else range(len(files))
        buf, seen = [], 0
        for fi in order:
            check_unchanged(files[fi], taken or {})
            for index, (off, n) in enumerate(scan(files[fi])):
                seen += 1
                item = (files[fi], off, n, index)
                if not shuffle:
                    yield item
                elif len(buf) < buffer_size:
                    buf.append(item)
                else:
                    j = int(rng.integers(buffer_size))
                    yield buf[j]
                    buf[j] = item
        while buf:
            j = int(rng.integers(len(buf)))
            buf[j], buf[-1] = buf[-1], buf[j]
            yield buf.pop()
        if not seen:
            raise UserError("input files %s hold no records: check the paths" % ",".join(files))
        if not repeat:
            return
        epoch += 1


def to_tensors(arrays):
    """Batch arrays -> dict of tensors (int64 features, float32 weights, labels [b])."""
    out = {name: torch.from_numpy(np.asarray(arrays[name]).astype(np.int64)) for name in INT_FEATURES}
    out["masked_lm_weights"] = torch.from_numpy(np.asarray(arrays["masked_lm_weights"], np.float32))
    out["next_sentence_labels"] = torch.from_numpy(
        np.asarray(arrays["next_sentence_labels"]).reshape(-1).astype(np.int64))
    return out


class PretrainingBatches(torch.utils.data.IterableDataset):
    """This rank's batches of the global stream, from global batch ``start_batch`` on.

    ``global_batch`` records per step, split contiguously over ``world_size`` ranks.
    ``repeat=False`` ends after the last record (the final batch may be short and, across
    ranks, some ranks' slice may be empty: such batches are skipped) or ``max_batches``.
    """

    def __init__(self, files, max_seq_length, max_predictions_per_seq, global_batch, rank=0,
                 world_size=1, shuffle=True, seed=0, buffer_size=1000, start_batch=0,
                 repeat=True, max_batches=None, vocab_size=None):
        super().__init__()
        self.vocab_size = vocab_size
        if global_batch % world_size:
            raise UserError("batch size %d is not a multiple of the %d ranks: choose a multiple"
                            % (global_batch, world_size))
        self.files = list(files)
        self.seq, self.pred = max_seq_length, max_predictions_per_seq
        self.global_batch, self.rank, self.world_size = global_batch, rank, world_size
        self.shuffle, self.seed, self.buffer_size = shuffle, seed, buffer_size
        self.start_batch, self.repeat, self.max_batches = start_batch, repeat, max_batches
        self.taken = stamps(self.files)  # the files as the run starts (read as the stream reaches them)

    def _batches(self, worker, num_workers):
        per_rank = self.global_batch // self.world_size
        lo, hi = self.rank * per_rank, (self.rank + 1) * per_rank
        reader = _Reader(self.seq, self.pred, self.vocab_size, self.taken)
        stream = record_stream(self.files, self.seed, self.shuffle, self.buffer_size, self.repeat, self.taken)
        try:
            i, pos, mine = 0, 0, []
            for item in stream:
                if self.max_batches is not None and i >= self.max_batches:
                    return
                if i >= self.start_batch and (i - self.start_batch) % num_workers == worker \
                        and lo <= pos < hi:
                    mine.append(item)
                pos += 1
                if pos == self.global_batch:
                    if mine:
                        yield to_tensors(reader.read_batch(mine))
                    i, pos, mine = i + 1, 0, []
            if mine and (self.max_batches is None or i < self.max_batches):
                yield to_tensors(reader.read_batch(mine))
        finally:
            reader.close()

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        if info is None:
            return self._batches(0, 1)
        return self._batches(info.id, info.num_workers)


class _Loader:
    """A DataLoader whose workers' UserErrors come out as the original one line."""

    def __init__(self, loader):
        self.loader = loader

    def __iter__(self):
        if self.loader.num_workers > 0:
            # the workers are forked with the stop signals blocked, until they ignore them
            # (_worker_init); this process gets one that came meanwhile when they are unblocked
            old = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
            before = set(multiprocessing.active_children())
            try:
                it = iter(self.loader)
            except BaseException as e:
                _abandon(e, set(multiprocessing.active_children()) - before)
                raise
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, old)
            _kill_not_terminate(it)
        else:
            it = iter(self.loader)
        _iterators.add(it)
        if self.loader.num_workers > 0:
            # PyTorch's SIGCHLD handler (set by the first iterator with workers) raises a worker's
            # death at whatever bytecode runs next: in the DataLoader's own file-limit probe it left
            # a NamedTemporaryFile in $TMPDIR. Ours raises it only into the wait for a batch.
            with contextlib.suppress(ValueError):  # not the main thread: torch set none either
                signal.signal(signal.SIGCHLD, _on_sigchld)
        try:
            while True:
                _raise_if_a_worker_died()  # one that died while the trainer was not waiting
                try:
                    batch = next(it)
                except StopIteration:
                    return
                yield batch
        except UserError as e:
            _end_workers(it)
            lines = str(e).strip().splitlines()
            if len(lines) > 1:  # "Caught UserError in DataLoader worker ... Traceback ...: msg"
                raise UserError(lines[-1].split("UserError: ", 1)[-1]) from None
            raise
        except Exception:
            raise  # maybe a worker's death: worker_death_is_one_line reads its exit code, then ends them
        except BaseException:  # closed by its consumer (GeneratorExit), a stop signal
            _end_workers(it)
            raise


def _abandon(e, workers):
    """An iterator half made when ``e`` came (a worker or a queue's thread the process limit refused):
    its ``workers`` ignore SIGTERM, and the exit's terminate and join of them hung; killed here. Its
    own shutdown, at its __del__, then does nothing: made before its workers' status, it was an
    AttributeError's traceback after the error's line."""
    for worker in workers:
        worker.kill()
        worker.join()
    tb = e.__traceback__
    while tb is not None:
        it = tb.tb_frame.f_locals.get("self")
        if isinstance(it, torch.utils.data.dataloader._MultiProcessingDataLoaderIter):
            it._shutdown = True
        tb = tb.tb_next


def _end_workers(it):
    """End a DataLoader iterator's workers now. Left to its __del__, an iterator kept by an error's
    traceback is freed by the cycle collector, which may close its queues first: then each worker
    waits out PyTorch's 5 s join timeout before it is terminated."""
    shutdown = getattr(it, "_shutdown_workers", None)  # none without workers
    if shutdown is not None:
        shutdown()


def _kill_not_terminate(it):
    """A DataLoader iterator's workers ignore SIGTERM (_worker_init): where PyTorch (a worker that
    does not end when told) and multiprocessing (its daemon children at exit, then a join) would
    terminate one, it is killed instead, not waited for forever. (Both call its Popen's terminate.)"""
    for w in getattr(it, "_workers", ()):
        popen = getattr(w, "_popen", None)
        if popen is not None:
            popen.terminate = popen.kill


_iterators = weakref.WeakSet()  # live DataLoader iterators, whose workers a failure may be about


def _died():
    """(pid, exit code) of a live iterator's worker that died (not ended by its iterator), or None."""
    for it in list(_iterators):
        if getattr(it, "_shutdown", False):  # its workers were ended by the loader itself
            continue
        for w in getattr(it, "_workers", ()):
            code = w.exitcode
            if code:
                return w.pid, code
    return None


def _raise_if_a_worker_died():
    dead = _died()
    if dead:
        raise RuntimeError("DataLoader worker (pid %d) exited unexpectedly" % dead[0])


# Where a DataLoader's wait for a batch blocks: its _try_get_data in the data queue's get (a
# multiprocessing queue; with pinned memory a queue.Queue)
_DATALOADER = os.path.join("torch", "utils", "data", "dataloader.py")
_QUEUE_GET = ("queues.py", "connection.py", "selectors.py", "queue.py", "threading.py")


def _waiting_for_a_batch(frame):
    while frame is not None and os.path.basename(frame.f_code.co_filename) in _QUEUE_GET:
        frame = frame.f_back
    return frame is not None and frame.f_code.co_name == "_try_get_data" and \
        frame.f_code.co_filename.endswith(_DATALOADER)


def _on_sigchld(signum, frame):
    """A worker's death, raised into the DataLoader's wait for a batch (which then names the dead
    worker) at once instead of at its next status check, up to 5 s later; anywhere else nothing
    (the loader looks before its next batch)."""
    if _waiting_for_a_batch(frame):
        _raise_if_a_worker_died()


def _dead_worker(e):
    """(pid, exit code) of a loader worker that has died, if one has; the worker's death can reach
    the trainer first as a broken connection, before the worker is seen gone: then wait a little."""
    likely = isinstance(e, (ConnectionError, EOFError)) or "DataLoader worker" in str(e)
    deadline = time.monotonic() + (5.0 if likely else 0.0)
    while True:
        dead = _died()
        if dead:
            return dead
        if time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    m = re.search(r"DataLoader worker \(pid (\d+)\) is killed by signal: (.+?)\.? *$", str(e))
    if m:  # PyTorch's own report of it (its SIGCHLD handler), the worker already reaped
        names = {signal.strsignal(s): s for s in signal.Signals}
        if m.group(2) in names:
            return int(m.group(1)), -names[m.group(2)]
    return None


@contextlib.contextmanager
def worker_death_is_one_line(output_dir=None):
    """A loader worker killed (the OOM killer, a stray kill) ends the trainer with one line naming it,
    the signal and the rank, and exit status 128 + the signal (the worker's status if it exited),
    instead of PyTorch's traceback; the line says what the run's ``output_dir`` holds (``what_is_saved``)."""
    try:
        yield
    except UserError:
        raise
    except Exception as e:
        if is_process_limit(e):  # the trainer's: a worker's fork, a queue's thread
            raise UserError(process_limit("a thread or a process", LOADER_PROCESSES)) from None
        # no SIGCHLD handler (PyTorch's, if set, raises at any bytecode) raises a death again
        # while we look and leave: the process is ending with an error anyway
        with contextlib.suppress(ValueError):
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        dead = _dead_worker(e)
        if dead is None:
            raise
        pid, code = dead
        for it in list(_iterators):  # no SIGCHLD report of the same death later, while leaving
            with contextlib.suppress(Exception):
                _end_workers(it)
        if code == THREADS_REFUSED:
            raise UserError(process_limit("a thread in data loader worker (pid %d)" % pid, LOADER_PROCESSES)) from None
        how = ended(code)
        dist = torch.distributed
        who = "rank %d: its" % dist.get_rank() if dist.is_available() and dist.is_initialized() else "the"
        print("error: %s data loader worker (pid %d) %s: %s" % (who, pid, how, what_is_saved(output_dir, node_rank())),
              file=sys.stderr, flush=True)
        raise SystemExit(128 - code if code < 0 else code) from None


# What a stop signal does to a worker: nothing (_worker_init)
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _worker_init(trainer_pid, worker_id):
    # The trainer decides what a stop means (checkpoint, then exit 143): a SIGTERM or Ctrl-C sent
    # to its process group (torchrun's shutdown, kill -- -PGID, a terminal) or to every process of
    # the job (Slurm's proctrack/linuxproc, systemd's control-group kill, kill -TERM of each pid)
    # must not kill the workers first. They ignore both (the trainer ends them by pid with SIGKILL:
    # _kill_not_terminate); their own group keeps them out of a terminal's other signals. The stop
    # signals were blocked since the fork (_Loader.__iter__): one that came since is dropped here.
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)
    for sig in _STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
    from multiprocessing import queues, resource_sharer
    # A killed trainer's workers die with it, not when PyTorch's watchdog looks (every 5 s): they
    # held its output pipe open and competed with the rerun. (The signal comes when the thread that
    # started them ends: the trainer's main thread.)
    die_with_parent(trainer_pid, signal.SIGKILL, 1)
    for cls, name in ((queues.Queue, "_start_thread"), (resource_sharer._ResourceSharer, "_start")):
        setattr(cls, name, _exit_if_refused(getattr(cls, name)))


# A worker's exit status where the process limit refused it a thread (sysexits' "can't fork")
THREADS_REFUSED = os.EX_OSERR


def _exit_if_refused(start):
    """``start`` (of a worker's thread) ending the worker with THREADS_REFUSED, which the trainer names
    (worker_death_is_one_line), where the process limit refuses the thread: the fd-passing thread (started
    as a batch is pickled, in the queue's feeder thread) printed a traceback there, the batch was dropped
    and the trainer waited for it forever; the feeder thread (the first put) was the worker's traceback
    and its exit status 1. (Reporting it through the queue needs that thread.)"""
    @functools.wraps(start)
    def started(*args, **kwargs):
        try:
            return start(*args, **kwargs)
        except RuntimeError as e:
            if not is_process_limit(e):
                raise
            os._exit(THREADS_REFUSED)  # from the feeder thread too: the whole worker
    return started


LOADER_SHM = ("the data loader workers hand batches over through its shared memory", ", or give --num_workers=0")


def _in_shared_memory(batch):
    """A worker's batch (``batch_size=None``: one of the dataset's dicts) moved to shared memory in
    the worker itself, where failing is the worker's error: in its queue's feeder thread, where
    PyTorch moves it, a full /dev/shm was a printed traceback, the batch dropped, and the trainer
    waited for it forever, deaf to SIGTERM."""
    for t in (batch.values() if isinstance(batch, dict) else (batch,)):
        if isinstance(t, torch.Tensor):
            try:
                t.share_memory_()
            except RuntimeError as e:  # "unable to allocate shared memory(shm) for file </torch_...>: No space ..."
                if "</torch_" in str(e):
                    raise UserError(shm_full(*LOADER_SHM)) from None
                raise
    return batch


def make_loader(dataset, num_workers, pin=False):
    """DataLoader over ready-made batches; workers prefetch so the accelerator never waits.
    ``pin``: batches in page-locked memory, for a CUDA run's non_blocking copies to its device (a
    run on the CPU of a GPU machine pinned them too: torch's pin thread made a CUDA context on the
    current GPU, GPU 0 for every rank, and copied each batch for nothing)."""
    # Its own generator: creating an iterator must not draw from the global RNG (dropout),
    # or a resumed run would see a different dropout stream.
    kwargs = dict(batch_size=None, num_workers=num_workers, pin_memory=pin,
                  generator=torch.Generator(), worker_init_fn=functools.partial(_worker_init, os.getpid()))
    if num_workers > 0:
        kwargs.update(prefetch_factor=4, persistent_workers=False, collate_fn=_in_shared_memory)
        # multiprocessing's folder (pymp-* in $TMPDIR, where a worker's resource-sharing socket
        # goes) made here, before the workers: theirs would be their own, left behind by a worker
        # that the loader ends on an error; this process removes its own when it exits.
        from multiprocessing import util
        check_tmpdir(num_workers)
        util.get_temp_dir()
        # the iterator's queues' semaphores (4 + 3 per worker) live in /dev/shm too: made here first,
        # since a full one fails the iterator half made (its __del__'s traceback after our line)
        try:
            [multiprocessing.Lock() for _ in range(4 + 3 * num_workers)]
        except OSError as e:
            if e.errno == errno.ENOSPC:
                raise UserError(shm_full(*LOADER_SHM)) from None
            raise
    return _Loader(torch.utils.data.DataLoader(dataset, **kwargs))


def input_files(spec, what="--input_file"):
    """The files of a comma list of paths and globs, each once (a file named twice would be read
    twice every epoch)."""
    from mlperf_bert.fileio import refuse_repeated_files
    files = expand_paths(spec, what)
    refuse_repeated_files(files, what)
    return files


def count_records(files):
    return sum(1 for f in files for _ in scan(f))


def check_records(files, full=False):
    """Read every record's header (TFRecord length and its CRC, truncation; HDF5 shapes), and with
    ``full`` every record's data CRC too (HDF5 and packed files: each dataset's CRC-32C written when
    it was made), so a damaged file fails before training, not hours in. Without ``full``, the data
    is checked as the loaders read it (TFRecord CRCs, HDF5 row checksums). Returns
    ``tfrecord.crcs_digest`` of each TFRecord file, {path as given: (bytes, digest)}: what
    the reads saw of every record, for the run's identity (an HDF5 file's tag is its datasets'
    CRC-32Cs)."""
    import sys
    from mlperf_bert.dataset import hdf5
    seen = {}
    for f in files:
        crcs = None if is_hdf5(f) else record_crcs()
        if full and is_hdf5(f):
            packed = _is_packed_file(f)
            if not hdf5.verify_checksums(f, packed):
                print("warning: %s has no checksums (made before they were written): --check_data=full cannot "
                      "check its contents; %s to add them" % (f, hdf5.remake_hint(f, packed)), file=sys.stderr)
        elif full:
            for _ in read_records(f, verify=True, crcs=crcs):
                pass
        else:
            for _ in scan(f, crcs):
                pass
            if is_hdf5(f):
                packed, rows_checked = _is_packed_file(f, with_row_checksums=True)
                if not rows_checked:
                    print("warning: %s has no row checksums (made before they were written): damage in it is not "
                          "caught while training; %s to add them" % (f, hdf5.remake_hint(f, packed)), file=sys.stderr)
        if crcs is not None:
            seen[f] = (os.path.getsize(f), crcs_digest(crcs))
    return seen


def _is_packed_file(path, with_row_checksums=False):
    from mlperf_bert.dataset import hdf5
    with hdf5.open_file(path) as h:
        packed = "max_sequences_per_pack" in h.attrs
        return (packed, hdf5.ROW_CHECKSUMS in h) if with_row_checksums else packed


def check_seq_length(files, max_seq_length, max_predictions_per_seq, vocab_size=None):
    """Decode the first record of each file so a length mismatch (or a token id past ``vocab_size``)
    is one clear error before training starts."""
    reader = _Reader(max_seq_length, max_predictions_per_seq, vocab_size)
    try:
        for f in files:
            for off, n in scan(f):
                reader.read(f, off, n, 0)
                break
    finally:
        reader.close()
