"""``--tensorboard_dir``: TensorBoard scalars of the values the MLPerf log gets, on rank 0.

Written where the trainer logs them and from what it logs (host floats it already has: nothing
more is read from the device), on the training-samples axis of the log (``samples_count``,
``epoch_num``), through ``torch.utils.tensorboard``, whose writer thread does the file I/O:

| tag | MLPerf log |
|---|---|
| ``train/loss`` | ``train_loss`` (mean since the last line) |
| ``train/learning_rate`` | its ``learning_rate`` |
| ``throughput/<rate>`` | its rates: ``seq_per_s``, and where logged ``rows_per_s``, ``tflops_per_gpu``, ``mfu`` |
| ``eval/accuracy`` | ``eval_accuracy`` |
| ``eval/mlm_loss`` | ``eval_mlm_loss`` |

A resume starts its events file with TensorBoard's purge at the checkpoint's samples + 1, so the
points the stopped run logged after its checkpoint are dropped, as the log is cut back there.
A write that fails later (disk full, the directory removed) is one warning naming the directory;
the run goes on without scalars.
"""
import contextlib
import errno
import os
import sys
import threading
import types

from mlperf_bert.errors import UserError

TAGS = {"train_loss": "train/loss", "learning_rate": "train/learning_rate",
        "eval_accuracy": "eval/accuracy", "eval_mlm_loss": "eval/mlm_loss"}


def _summary_writer():
    """torch's SummaryWriter class. TensorBoard's file I/O goes through ``tensorboard.compat.tf``,
    which imports all of TensorFlow when it is installed (5 s here, and its log lines on stderr)
    unless the module ``tensorboard.compat.notf`` exists: TensorBoard's own switch to its stub,
    which writes the same files. Where TensorFlow is already loaded it is used."""
    if "tensorflow" not in sys.modules and "tensorboard.compat.notf" not in sys.modules:
        sys.modules["tensorboard.compat.notf"] = types.ModuleType("tensorboard.compat.notf")
    from torch.utils.tensorboard import SummaryWriter
    return SummaryWriter


def _quiet_writer_threads():
    """Let TensorBoard's writer thread fail without its traceback: an OSError it meets (disk full)
    ends it and was printed as "Exception in thread Thread-1: Traceback ..." (15 lines) before the
    trainer's own line; the writer raises that error again in the thread that writes next, where
    ``Scalars`` makes it one line. Other threads' exceptions go to the hook that was there."""
    try:
        from tensorboard.summary.writer.event_file_writer import _AsyncWriterThread
    except ImportError:  # another TensorBoard: its threads' errors are printed as they were
        return
    hook = threading.excepthook
    if getattr(hook, "mlperf_bert_tensorboard", False):
        return

    def excepthook(args):
        if not (isinstance(args.thread, _AsyncWriterThread) and isinstance(args.exc_value, OSError)):
            hook(args)
    excepthook.mlperf_bert_tensorboard = True
    threading.excepthook = excepthook


class Scalars:
    """The run's scalars in ``logdir`` (None, or a rank other than 0: nothing is written).
    ``resumed_at``: the samples of the checkpoint a resume starts from (None: a fresh start,
    which purges every earlier point of ``logdir``)."""

    def __init__(self, logdir, rank=0, resumed_at=None):
        self.writer, self.logdir = None, logdir
        if logdir and rank == 0:
            try:  # checked here: TensorFlow's file layer, where it is loaded, raises its own errors
                os.makedirs(logdir, exist_ok=True)
                if not os.access(logdir, os.W_OK):
                    raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
            except OSError as e:
                raise UserError("cannot write --tensorboard_dir %s: %s: give a directory you can write"
                                % (logdir, e.strerror))
            _quiet_writer_threads()
            with self._writing(starting=True):
                self.writer = _summary_writer()(logdir, purge_step=0 if resumed_at is None else resumed_at + 1)

    @contextlib.contextmanager
    def _writing(self, starting=False, quiet=False):
        """An OSError of the events file's writes (the writer's thread's, raised again here): at the
        start, one line naming --tensorboard_dir (the run does not start); later, one warning, and
        the run goes on without scalars (they are a view of the MLPerf log, which has every value: a
        clean-up that removed the folder must not stop a run hours in)."""
        try:
            yield
        except OSError as e:
            writer, self.writer = self.writer, None
            if writer is not None:
                with contextlib.suppress(OSError):
                    writer.close()
            reason = os.strerror(e.errno).lower() if e.errno else str(e)
            if starting:
                from mlperf_bert.fileio import WRITE_ERRNOS
                raise UserError("cannot write --tensorboard_dir %s: %s; the run did not start: %s" % (
                    self.logdir, reason, WRITE_ERRNOS.get(e.errno, "fix that (or leave --tensorboard_dir out), "
                                                                    "then rerun the same command")))
            if quiet:
                return
            print("warning: cannot write --tensorboard_dir %s: %s; the run goes on without TensorBoard scalars (its "
                  "MLPerf log has every value: plot-log draws them)" % (self.logdir, reason), file=sys.stderr,
                  flush=True)

    def train(self, samples, loss, learning_rate, rates):
        """The values of a ``train_loss`` line."""
        if self.writer is not None:
            with self._writing():
                self.writer.add_scalar(TAGS["train_loss"], loss, samples)
                self.writer.add_scalar(TAGS["learning_rate"], learning_rate, samples)
                for name, value in rates.items():
                    self.writer.add_scalar("throughput/" + name, value, samples)

    def eval(self, samples, metrics):
        """The values of an eval's ``eval_accuracy`` and ``eval_mlm_loss`` lines."""
        if self.writer is not None:
            with self._writing():
                self.writer.add_scalar(TAGS["eval_accuracy"], metrics["masked_lm_accuracy"], samples)
                self.writer.add_scalar(TAGS["eval_mlm_loss"], metrics["masked_lm_loss"], samples)

    def close(self):
        """Flush the events and end the writer's thread; a write that fails is the warning, unless the
        run is ending on an error or a stop of its own (that one is its line)."""
        if self.writer is not None:
            with self._writing(quiet=sys.exc_info()[1] is not None):  # (a with block an exception leaves)
                self.writer.flush()  # raises what the thread met (its close does not look)
                self.writer.close()
                self.writer = None
