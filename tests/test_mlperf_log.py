"""MLPerf logger: the eval-frequency formula, one writer (rank 0), lines the official parser reads."""
import errno
import json
import os

import pytest

from mlperf_bert.harness.mlperf_log import MLPerfLog, eval_frequency


@pytest.mark.parametrize("batch,expected", [
    (256, 150000), (1024, 150000), (1536, 150000), (2048, 150000),
    (3072, 175000), (4096, 175000), (8192, 225000)])
def test_eval_frequency_matches_the_rules_examples(batch, expected):
    assert eval_frequency(batch) == expected


def _lines(path):
    return [json.loads(l[len(":::MLLOG "):]) for l in open(path, encoding="utf-8")
            if l.startswith(":::MLLOG ")]


def test_only_rank_zero_writes_and_runs_do_not_mix(tmp_path):
    a, b, other = tmp_path / "a.log", tmp_path / "b.log", tmp_path / "rank1.log"
    la, lb, l1 = MLPerfLog(str(a)), MLPerfLog(str(b)), MLPerfLog(str(other), rank=1)
    la.event("seed", 1)
    lb.event("seed", 2)
    l1.event("seed", 3)
    la.start("eval_start", metadata={"epoch_num": 150000})
    for log in (la, lb, l1):
        log.close()
    la.event("seed", 4)  # after close: dropped, not an error
    assert [(r["key"], r["value"]) for r in _lines(a)] == [("seed", 1), ("eval_start", None)]
    assert [(r["key"], r["value"]) for r in _lines(b)] == [("seed", 2)]
    assert not other.exists()
    rec = _lines(a)[1]
    assert rec["event_type"] == "INTERVAL_START" and rec["metadata"]["epoch_num"] == 150000


def test_hyperparameters_each_key_once(tmp_path):
    p = tmp_path / "h.log"
    log = MLPerfLog(str(p))
    log.hyperparameters(256, 0.00035, 1e-6, 13700, 0, 0, 0.9, 0.999, 0.01, 1, 42, 512, 0.72, 1.0)
    log.close()
    keys = [r["key"] for r in _lines(p)]
    required = ["global_batch_size", "opt_base_learning_rate", "opt_lamb_epsilon",
                "opt_learning_rate_training_steps", "opt_learning_rate_warmup_steps",
                "num_warmup_steps", "start_warmup_step", "opt_lamb_beta_1", "opt_lamb_beta_2",
                "opt_lamb_weight_decay_rate", "gradient_accumulation_steps", "seed", "target_accuracy"]
    assert sorted(k for k in keys if k in required) == sorted(required)
    values = {r["key"]: r["value"] for r in _lines(p)}
    assert values["global_batch_size"] == 256 and values["opt_lamb_epsilon"] == 1e-6


@pytest.mark.parametrize("optimizer,key", [("lamb", "opt_lamb_learning_rate_decay_poly_power"),
                                           ("adamw", "opt_learning_rate_decay_poly_power")])
def test_hyperparameters_log_the_decays_power(tmp_path, optimizer, key):
    """A hostile sweep: --poly_power=0.5 trained on a square-root decay, but the log said nothing of
    it (the reference's log and the accepted ones carry opt_lamb_learning_rate_decay_poly_power): a
    reader took the run for the linear decay. An AdamW run's key has no "lamb" (mllog has none of its own)."""
    p = tmp_path / "h.log"
    log = MLPerfLog(str(p))
    log.hyperparameters(256, 0.00035, 1e-6, 13700, 0, 0, 0.9, 0.999, 0.01, 1, 42, 512, 0.72, 0.5, optimizer)
    log.close()
    keys = [r["key"] for r in _lines(p)]
    assert keys.count(key) == 1 and {r["key"]: r["value"] for r in _lines(p)}[key] == 0.5
    assert (optimizer == "lamb") == any(k.startswith("opt_lamb") for k in keys)


def test_a_log_deleted_while_written_is_written_back_and_one_replaced_stops_the_run(tmp_path, capsys):
    """The output-folder sweep: mlperf.log deleted while a run went on took every later line into the
    deleted file, and the run ended "finished" (exit 0, run_finished.json) with no log at all; one
    replaced (mv over it) went unnoticed alike. Checked at each checkpoint's mark and at the close."""
    from mlperf_bert.errors import UserError
    p = tmp_path / "mlperf.log"
    log = MLPerfLog(str(p), held=True)
    log.open()
    log.event("seed", 1)
    p.unlink()
    size, digest = log.mark()
    assert p.stat().st_size == size and "was deleted or moved away while this run wrote it" in capsys.readouterr().err
    log.event("seed", 2)
    log.close()
    assert [r["value"] for r in _lines(p)] == [1, 2]
    q = tmp_path / "q.log"
    log = MLPerfLog(str(q), held=True)
    log.open()
    log.event("seed", 1)
    other = tmp_path / "other.log"
    other.write_text(":::MLLOG {}\n")
    other.replace(q)
    with pytest.raises(UserError, match="^MLPerf log %s was replaced while this run wrote it: .*rerun" % q):
        log.mark()
    with pytest.raises(UserError, match="was replaced"):
        log.close()
    assert q.read_text() == ":::MLLOG {}\n"


def test_a_replaced_log_says_whether_a_checkpoint_holds_the_run(tmp_path):
    """A log replaced before the run's first checkpoint said "(its checkpoints are kept); restore the log
    it wrote and rerun the same command to resume", with none to resume from. The line says what
    --output_dir holds, once the checkpoint being written is complete (the error's way out completes it)."""
    from mlperf_bert.errors import UserError
    out = tmp_path / "out"
    out.mkdir()

    def replaced(writes_done=None):
        p = tmp_path / "mlperf.log"
        log = MLPerfLog(str(p), held=True, output_dir=str(out))
        if writes_done:
            log.writes_done = writes_done
        log.open()
        log.event("seed", 1)
        (tmp_path / "other.log").write_text(":::MLLOG {}\n")
        (tmp_path / "other.log").replace(p)
        with pytest.raises(UserError) as e:
            log.mark()
        return str(e.value)

    said = replaced()
    # (what replaced it stays: a start refuses a log path holding a file that is not an MLPerf log)
    assert said == ("MLPerf log %s was replaced while this run wrote it: the run stopped (no checkpoint was written, "
                    "nothing saved; move what is now at %s away, then rerun the same command to start again), or use "
                    "another --output_dir for a new run" % (tmp_path / "mlperf.log", tmp_path / "mlperf.log")), said
    from mlperf_bert.fileio import temporary_name
    open(temporary_name(str(out / "model.ckpt-4.pt")), "w").close()  # one being written: not a checkpoint
    assert "nothing saved" in replaced()
    # the first checkpoint, in flight at the mark, completed before the line is said
    said = replaced(lambda: (out / "model.ckpt-4.pt").write_text(""))
    assert "(its checkpoints are kept; restore the log it wrote and rerun the same command to resume)" in said, said
    assert "(its checkpoints are kept;" in replaced()


def test_a_replaced_log_says_the_checkpoint_write_that_failed(tmp_path, monkeypatch):
    """A review: the wait for the checkpoint being written took its error (a full disk) and nothing said
    it: the line said "restore the log ... rerun", and the rerun's checkpoint failed the same way."""
    import functools
    from mlperf_bert.errors import UserError
    from mlperf_bert.trainer import checkpoint
    out = tmp_path / "out"
    out.mkdir()
    (out / "model.ckpt-2.pt").write_text("")

    def full(path, state, keep):
        raise UserError("cannot write %s: no space left on device; no partial file was left: free space" % path)

    monkeypatch.setattr(checkpoint, "save", full)
    writer = checkpoint.BackgroundWriter()
    p = tmp_path / "mlperf.log"
    log = MLPerfLog(str(p), held=True, output_dir=str(out))
    log.writes_done = functools.partial(writer.wait, raise_error=False)
    log.open()
    writer.submit(str(out / "model.ckpt-4.pt"), {}, 0)
    (tmp_path / "other.log").write_text(":::MLLOG {}\n")
    (tmp_path / "other.log").replace(p)
    with pytest.raises(UserError) as e:
        log.mark()
    assert ("the run stopped (the checkpoint being written failed: cannot write %s: no space left on device; no "
            "partial file was left: free space; its checkpoints are kept; restore the log it wrote and rerun the same "
            "command to resume)" % (out / "model.ckpt-4.pt")) in str(e.value), str(e.value)
    assert writer.wait() is None  # said once


def test_a_mark_is_on_the_disk_before_a_checkpoint_records_it(tmp_path, monkeypatch):
    """A checkpoint (fsynced) records the log's length and sha256; the log's lines were left in the page
    cache, so after a machine's crash the checkpoint could outlive the log's last lines and every
    resume be refused (its log no longer begins with what it records)."""
    p = tmp_path / "mlperf.log"
    log = MLPerfLog(str(p), held=True)
    log.open()
    log.event("seed", 1)
    synced = []
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(os.fstat(fd).st_size))
    size, _ = log.mark()
    assert synced == [size] == [p.stat().st_size]
    # a review: the run_stop record takes its mark after the close, which left run_stop's lines unsynced
    log.event("run_stop")
    log.close()
    assert synced == [size, log.mark()[0]] == [size, p.stat().st_size]


def test_a_log_on_a_file_system_that_cannot_sync_goes_on(tmp_path, monkeypatch):
    """A storage sweep: on CIFS, VirtualBox shared folders and some FUSE file systems fsync fails
    with EINVAL; the first checkpoint's mark stopped every run there ("cannot write MLPerf log:
    Invalid argument"). The bytes are there all the same: the run goes on."""
    def cannot_sync(fd):
        raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
    monkeypatch.setattr(os, "fsync", cannot_sync)
    p = tmp_path / "mlperf.log"
    log = MLPerfLog(str(p), held=True)
    log.open()
    log.event("seed", 1)
    assert log.mark()[0] == p.stat().st_size > 0
    log.close()
