"""MLPerf logging through ``mlperf_logging.mllog``: one logger per run, only rank 0 writes.

Each run gets its own ``logging.Logger`` (not the package's global logger), so several runs in
one process (tests) never write into each other's files. Lines are held in memory until
``open`` (the trainer opens the file only once every start check has passed, so a refused start
leaves no log), then each is written with one ``write`` as it comes. The writer keeps the file's
length and sha256: a checkpoint records them (``mark``), and a resume cuts the log back to that
point (``open(position, digest)``), so a resumed log is the one an uninterrupted run writes.
A failed write (disk full) is a UserError naming the file, raised by the call that logged.
"""
import functools
import hashlib
import itertools
import logging
import os
import sys

from mlperf_logging.mllog.mllog import MLLogger
from mlperf_logging.mllog import constants as C

from mlperf_bert.errors import UserError
from mlperf_bert.start_signals import holds_checkpoint

_ids = itertools.count()
MARK = b":::MLLOG "


def reaches_target(accuracy, target):
    """Whether an eval's masked-LM accuracy reaches ``target``: at or above it and below 1.0, as the
    official checker's ATLEAST_ONE_CHECK reads it (closed_bert.yaml: an accuracy of 1 reaches none)."""
    return target <= accuracy < 1.0


def eval_frequency(global_batch_size):
    """Training samples between evaluations (mlcommons/training retired_benchmarks/bert/README.md, "Stopping criteria")."""
    return int(0.05 * (230.23 * global_batch_size + 3000000) / 25000) * 25000


def is_mlperf_log(path):
    """Whether ``path`` is empty or starts with an ``:::MLLOG`` line (what this writer writes)."""
    with open(path, "rb") as f:
        head = f.read(len(MARK))
    return head == b"" or head == MARK


def check_prefix(path, position, digest, what):
    """Refuse (one line) unless ``path``'s first ``position`` bytes have sha256 ``digest``."""
    sha = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            left = position
            while left:
                chunk = f.read(min(left, 1 << 20))
                if not chunk:
                    break
                sha.update(chunk)
                left -= len(chunk)
    except FileNotFoundError:
        left = position
    if left or sha.hexdigest() != digest:
        raise UserError("MLPerf log %s does not begin with the %d bytes %s recorded (%s): restore that "
                        "log, or use another --output_dir for a new run"
                        % (path, position, what, "it is shorter" if left else "its content differs"))
    return sha


class _Handler(logging.Handler):
    def __init__(self, log):
        super().__init__()
        self._log = log

    def emit(self, record):
        self._log._write(self.format(record) + "\n")


# An optimizer's epsilon, beta_1, beta_2 and weight decay keys (mllog's constants): LAMB's are the
# closed rules'; an open run with the reference's AdamW (its AdamWeightDecayOptimizer) logs AdamW's.
OPTIMIZER_KEYS = {
    "lamb": (C.OPT_LAMB_EPSILON, C.OPT_LAMB_BETA_1, C.OPT_LAMB_BETA_2, C.OPT_LAMB_WEIGHT_DECAY),
    "adamw": (C.OPT_ADAMW_EPSILON, C.OPT_ADAMW_BETA_1, C.OPT_ADAMW_BETA_2, C.OPT_ADAMW_WEIGHT_DECAY),
}
# The learning-rate decay's power (--poly_power), which the reference's log and the accepted ones carry
# (mllog's LAMB key); mllog has no AdamW key for it, so an AdamW run's is an extra key without "lamb".
POLY_POWER_KEYS = {"lamb": C.OPT_LAMB_LR_DECAY_POLY_POWER, "adamw": "opt_learning_rate_decay_poly_power"}


class MLPerfLog:
    """``event``/``start``/``end`` log ``:::MLLOG`` lines on rank 0; no-ops elsewhere."""

    def __init__(self, path, rank=0, held=False, output_dir=None):
        """``held``: keep the lines in memory until ``open``; else open ``path`` now (appending).
        ``output_dir``: the run's, whose checkpoints a stop on a replaced log says (rank 0 writes both)."""
        self.path = path
        self.output_dir = output_dir
        # the trainer's: waits for the checkpoint being written (an error mid-run completes it anyway),
        # so that what a stop says is kept is what the folder holds; returns that write's error, or None
        self.writes_done = lambda: None
        self.enabled = rank == 0 and path is not None
        self._fd, self._pending, self._error = None, [], None
        self._size, self._sha = 0, hashlib.sha256()
        self._mllogger = None
        if not self.enabled:
            return
        logger = logging.getLogger("mlperf_bert.mllog.%d" % next(_ids))
        logger.propagate = False
        logger.setLevel(logging.INFO)
        self._handler = _Handler(self)
        logger.addHandler(self._handler)
        self._logger = logger
        self._mllogger = MLLogger(logger=logger, default_stack_offset=2)
        if not held:
            self.open(append=True)

    def open(self, position=0, digest=None, what="the checkpoint", append=False):
        """Open the file, cut to ``position`` bytes whose sha256 must be ``digest`` (0: emptied;
        ``append``: kept whole), and write the lines held so far."""
        if not self.enabled or self._fd is not None:
            return
        try:
            if append:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
                with open(self.path, "rb") as f:
                    for chunk in iter(lambda: f.read(1 << 20), b""):
                        self._sha.update(chunk)
                        position += len(chunk)
            else:
                self._sha = (check_prefix(self.path, position, digest, what) if position
                             else hashlib.sha256())
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
                os.ftruncate(fd, position)
                os.lseek(fd, position, os.SEEK_SET)
        except OSError as e:
            raise UserError("cannot write MLPerf log %s: %s (choose a writable --mlperf_log)"
                            % (self.path, e.strerror))
        self._fd, self._size = fd, position
        pending, self._pending = self._pending, []
        for line in pending:
            self._write(line)
        self._check()

    def mark(self):
        """(bytes written, their sha256): where a resume from this moment cuts the log, on the disk
        before a checkpoint records it (after a machine's crash a checkpoint whose log lost its last
        lines could never be resumed: its log no longer begins with what it records)."""
        self._still_there()
        if self._fd is not None:
            from mlperf_bert.fileio import sync_fd
            try:
                sync_fd(self._fd)
            except OSError as e:
                self._error = e
                self._check()
        return self._size, self._sha.hexdigest()

    def _still_there(self):
        """The file at ``path`` is the one written, as written (at each checkpoint's mark and the close).
        Deleted or moved away while the run went on (its lines went to a file no one saw, and the run
        ended "finished" without a log), its bytes are written back there and the writing goes on;
        replaced, or cut or added to by another process, the run stops in one line (a resume refuses a
        log its checkpoint does not begin)."""
        if self._fd is None:
            return
        ours = os.fstat(self._fd)
        try:
            there = os.stat(self.path)
        except FileNotFoundError:
            there = None
        if there is None and ours.st_size == self._size:
            from mlperf_bert.fileio import atomic_save
            atomic_save(self.path, lambda f: f.write(os.pread(self._fd, self._size, 0)))
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND)
            os.close(self._fd)
            self._fd = fd
            print("warning: MLPerf log %s was deleted or moved away while this run wrote it: its %d bytes were "
                  "written back there, and the run goes on" % (self.path, self._size), file=sys.stderr, flush=True)
            return
        if there is None or (there.st_dev, there.st_ino) != (ours.st_dev, ours.st_ino):
            what = "replaced"
        elif ours.st_size != self._size:
            what = "cut or added to by another process"
        else:
            return
        raise UserError("MLPerf log %s was %s while this run wrote it: the run stopped (%s), or use another "
                        "--output_dir for a new run" % (self.path, what, self._what_is_saved()))

    def _what_is_saved(self):
        """What the run leaves, for a stop on a replaced log: a resume needs the log its checkpoints record."""
        if self.output_dir is None:  # (not told: the folder is unknown)
            return "any checkpoint it wrote is kept; restore the log it wrote and rerun the same command to resume"
        failed = self.writes_done()
        # (said here or never: the write's error is taken, and this line is the run's)
        failed = "the checkpoint being written failed: %s; " % str(failed).strip() \
            if isinstance(failed, BaseException) else ""
        if holds_checkpoint(self.output_dir):
            return failed + "its checkpoints are kept; restore the log it wrote and rerun the same command to resume"
        # (rank 0, on node 0, writes the log): a start refuses a log path that holds another file
        return failed + "no checkpoint was written, nothing saved; move what is now at %s away, then rerun the same " \
            "command to start again" % self.path

    def _write(self, line):
        if self._error is not None:
            return
        if self._fd is None:
            self._pending.append(line)
            return
        data = line.encode("utf-8")
        try:
            while data:
                n = os.write(self._fd, data)
                self._sha.update(data[:n])
                self._size += n
                data = data[n:]
        except OSError as e:
            self._error = e  # mllog catches what a handler raises: raised by _check instead

    def _check(self):
        if self._error is None:
            return
        from mlperf_bert.fileio import WRITE_ERRNOS, write_error
        e = self._error
        left = "the run stopped; any checkpoint it wrote is kept"
        if e.errno in WRITE_ERRNOS:
            raise write_error(self.path, e, left=left)
        raise UserError("cannot write MLPerf log %s: %s; %s: fix that, then rerun the same command"
                        % (self.path, e.strerror, left))

    def event(self, key, value=None, metadata=None, depth=0):
        """``depth``: frames between the caller named in the metadata and this method."""
        if self._mllogger:
            self._mllogger.event(key=key, value=value, metadata=metadata, stack_offset=2 + depth)
            self._check()

    def start(self, key, value=None, metadata=None):
        if self._mllogger:
            self._mllogger.start(key=key, value=value, metadata=metadata)
            self._check()

    def end(self, key, value=None, metadata=None):
        if self._mllogger:
            self._mllogger.end(key=key, value=value, metadata=metadata)
            self._check()

    def close(self):
        try:
            # on the disk too: the run_stop record (checkpoint.write_stopped) records the mark after the close
            self.mark()
        finally:
            if self._mllogger:
                self._logger.removeHandler(self._handler)
            self._mllogger = None
            self._pending = []
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def submission(self, division, org, platform, status="onprem"):
        event = functools.partial(self.event, depth=1)  # file/lineno of our caller, not of this file
        event(C.SUBMISSION_BENCHMARK, C.BERT)
        event(C.SUBMISSION_ORG, org)
        event(C.SUBMISSION_DIVISION, division)
        event(C.SUBMISSION_STATUS, status)
        event(C.SUBMISSION_PLATFORM, platform)

    def hyperparameters(self, global_batch_size, learning_rate, epsilon, train_steps, warmup_steps,
                        start_warmup_step, beta_1, beta_2, weight_decay_rate, accumulation_steps,
                        seed, max_sequence_length, target_accuracy, poly_power, optimizer="lamb"):
        """Every hyperparameter key of the closed BERT rules, each exactly once, and the decay's
        ``poly_power`` (POLY_POWER_KEYS); an (open) AdamW run's optimizer keys are AdamW's, with its
        ``opt_name`` (OPTIMIZER_KEYS), not LAMB's."""
        event = functools.partial(self.event, depth=1)
        epsilon_key, beta_1_key, beta_2_key, decay_key = OPTIMIZER_KEYS[optimizer]
        if optimizer != "lamb":
            event(C.OPT_NAME, optimizer)
        event(C.GLOBAL_BATCH_SIZE, global_batch_size)
        event(C.OPT_BASE_LR, learning_rate)
        event(epsilon_key, epsilon)
        event(C.OPT_LR_TRAINING_STEPS, train_steps)
        event(C.OPT_LR_WARMUP_STEPS, warmup_steps)
        event(C.NUM_WARMUP_STEPS, warmup_steps)
        event(C.START_WARMUP_STEP, start_warmup_step)
        event(beta_1_key, beta_1)
        event(beta_2_key, beta_2)
        event(decay_key, weight_decay_rate)
        event(POLY_POWER_KEYS[optimizer], poly_power)
        event(C.GRADIENT_ACCUMULATION_STEPS, accumulation_steps)
        event(C.SEED, seed)
        event("max_sequence_length", max_sequence_length)
        # Not an official key: tells this project's log checker which target the run used.
        event("target_accuracy", target_accuracy)
