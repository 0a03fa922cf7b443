"""--tensorboard_dir: TensorBoard scalars of the MLPerf log's values, read back with TensorBoard's
own EventAccumulator."""
import json
import os
import threading

import numpy as np
import pytest

from mlperf_bert.trainer import tensorboard, training
from test_training import files, flags_for, one_thread  # noqa: F401 (module fixtures)


def _scalars(logdir):
    """{tag: [(step, value)]} as TensorBoard shows them (purges applied)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(logdir)
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _log_points(log):
    """{tag: [(samples, float32 value)]} of the log's lines that the scalars copy."""
    out = {}
    for line in open(log):
        r = json.loads(line.split(":::MLLOG ", 1)[1])
        meta = r["metadata"]
        if r["key"] == "train_loss":
            values = {"train/loss": r["value"], "train/learning_rate": meta["learning_rate"],
                      "throughput/seq_per_s": meta["seq_per_s"]}
            at = meta["samples_count"]
        elif r["key"] in ("eval_accuracy", "eval_mlm_loss"):
            values, at = {tensorboard.TAGS[r["key"]]: r["value"]}, meta["epoch_num"]
        else:
            continue
        for tag, v in values.items():
            out.setdefault(tag, []).append((at, float(np.float32(v))))  # a scalar event holds a float32
    return out


def test_a_run_writes_the_logs_values_as_scalars(files, tmp_path, monkeypatch):  # noqa: F811
    """Issue 47 (12): no TensorBoard. With --tensorboard_dir the run writes loss, learning rate,
    throughput and the evals at the log's samples positions, each the log's value (float32, as
    TensorBoard stores a scalar), from host numbers the trainer already had (no tensor reaches the
    writer: nothing more is read back from the device)."""
    SummaryWriter = tensorboard._summary_writer()  # (without TensorFlow, as the trainer imports it)
    seen, real = [], SummaryWriter.add_scalar

    def add_scalar(self, tag, value, step=None, *a, **k):
        seen.append((type(value), type(step)))
        return real(self, tag, value, step, *a, **k)
    monkeypatch.setattr(SummaryWriter, "add_scalar", add_scalar)
    out, tb = str(tmp_path / "out"), str(tmp_path / "tb")
    assert training.main(flags_for(files, out, eval_input_file=files["eval"], eval_frequency=16, eval_at_start=True,
                                   log_frequency=3, steps_per_update=1, num_train_steps=9, target_mlm_accuracy=1.0,
                                   tensorboard_dir=tb)) == 0
    want = _log_points(os.path.join(out, "mlperf.log"))
    assert [s for s, _ in want["eval/accuracy"]] == [0, 16, 32] and len(want["train/loss"]) == 3
    assert _scalars(tb) == want
    assert seen and set(seen) <= {(float, int)}


def test_a_resume_drops_the_points_after_its_checkpoint_and_a_fresh_start_all(tmp_path):
    """As the log is cut back to the checkpoint, the resumed run's events purge the stopped run's
    points after the checkpoint's samples (those at it stay: logged before it was written); a fresh
    start in the same directory purges every earlier point. Rank 1 writes nothing."""
    tb = str(tmp_path / "tb")
    first = tensorboard.Scalars(tb)
    for samples in (8, 16, 24, 32):
        first.train(samples, 1.0 + samples, 0.5, {"seq_per_s": 10.0})
    first.close()
    resumed = tensorboard.Scalars(tb, resumed_at=16)
    resumed.train(24, 100.0, 0.25, {"seq_per_s": 20.0})
    resumed.eval(24, {"masked_lm_accuracy": 0.5, "masked_lm_loss": 3.0})
    resumed.close()
    got = _scalars(tb)
    assert got["train/loss"] == [(8, 9.0), (16, 17.0), (24, 100.0)]
    assert got["eval/accuracy"] == [(24, 0.5)]
    fresh = tensorboard.Scalars(tb)
    fresh.train(4, 7.0, 0.5, {})
    fresh.close()
    assert _scalars(tb)["train/loss"] == [(4, 7.0)]
    other = tensorboard.Scalars(str(tmp_path / "rank1"), rank=1)
    other.train(4, 7.0, 0.5, {})
    other.close()
    assert not os.path.exists(tmp_path / "rank1")


def test_a_directory_it_cannot_write_is_refused_before_the_log_is_opened(files, tmp_path):  # noqa: F811
    (tmp_path / "tb").write_text("a file")
    out = str(tmp_path / "out")
    with pytest.raises(training.UserError, match="cannot write --tensorboard_dir .*tb: File exists"):
        training.main(flags_for(files, out, tensorboard_dir=str(tmp_path / "tb")))
    assert not os.path.exists(os.path.join(out, "mlperf.log"))


def test_a_write_that_fails_is_one_warning_naming_the_directory_and_the_run_goes_on(tmp_path, monkeypatch, capsys):
    """A hostile sweep: a failed write of the events file (a full disk, or the folder removed under
    the running job by a cluster's clean-up) printed TensorBoard's writer thread's traceback
    ("Exception in thread Thread-1", 15 lines) and then an OSError traceback that named no
    --tensorboard_dir, and the run died. Now: one warning naming the directory, the thread's error not
    printed, and the run goes on (the scalars are a view of the MLPerf log). The disk fills at the
    events file (its writes and flushes fail with ENOSPC): removing the folder fails the writes of
    TensorBoard's own file layer, not TensorFlow's, which holds the file open (which one writes
    depends on whether TensorFlow was imported before)."""
    import errno
    printed = []
    monkeypatch.setattr(threading, "excepthook", printed.append)  # what prints a thread's traceback
    tb = tmp_path / "tb"
    scalars = tensorboard.Scalars(str(tb))
    scalars.train(8, 1.0, 0.5, {"seq_per_s": 10.0})
    scalars.writer.flush()
    events = scalars.writer.file_writer.event_writer._general_file_writer

    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(events, "write", full)
    monkeypatch.setattr(events, "flush", full)
    for samples in (16, 24, 32):  # the writer's thread meets the error: a later write (or the close) says it
        scalars.train(samples, 1.0, 0.5, {"seq_per_s": 10.0})
    scalars.eval(40, {"masked_lm_accuracy": 0.5, "masked_lm_loss": 2.0})
    scalars.close()
    assert printed == [] and scalars.writer is None
    assert capsys.readouterr().err == (
        "warning: cannot write --tensorboard_dir %s: no space left on device; the run goes on without TensorBoard "
        "scalars (its MLPerf log has every value: plot-log draws them)\n" % tb)
    scalars.close()  # (closed: nothing more)
