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
"""
import errno
import os
import sys
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


class Scalars:
    """The run's scalars in ``logdir`` (None, or a rank other than 0: nothing is written).
    ``resumed_at``: the samples of the checkpoint a resume starts from (None: a fresh start,
    which purges every earlier point of ``logdir``)."""

    def __init__(self, logdir, rank=0, resumed_at=None):
        self.writer = None
        if logdir and rank == 0:
            try:  # checked here: TensorFlow's file layer, where it is loaded, raises its own errors
                os.makedirs(logdir, exist_ok=True)
                if not os.access(logdir, os.W_OK):
                    raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
            except OSError as e:
                raise UserError("cannot write --tensorboard_dir %s: %s: give a directory you can write"
                                % (logdir, e.strerror))
            self.writer = _summary_writer()(logdir, purge_step=0 if resumed_at is None else resumed_at + 1)

    def train(self, samples, loss, learning_rate, rates):
        """The values of a ``train_loss`` line."""
        if self.writer is not None:
            self.writer.add_scalar(TAGS["train_loss"], loss, samples)
            self.writer.add_scalar(TAGS["learning_rate"], learning_rate, samples)
            for name, value in rates.items():
                self.writer.add_scalar("throughput/" + name, value, samples)

    def eval(self, samples, metrics):
        """The values of an eval's ``eval_accuracy`` and ``eval_mlm_loss`` lines."""
        if self.writer is not None:
            self.writer.add_scalar(TAGS["eval_accuracy"], metrics["masked_lm_accuracy"], samples)
            self.writer.add_scalar(TAGS["eval_mlm_loss"], metrics["masked_lm_loss"], samples)

    def close(self):
        """Flush the events and end the writer's thread."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None
