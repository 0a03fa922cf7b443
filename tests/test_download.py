import hashlib
import http.client
import os
import re
import shutil

import pytest

from mlperf_bert.dataset import download
from mlperf_bert.dataset.checksums import RESULTS_DIR
from mlperf_bert.dataset.tfrecord import frame
from mlperf_bert.errors import UserError


class _Dropped:
    """A source stream that breaks after ``left`` bytes, as a dropped connection does."""

    def __init__(self, f, left, error=ConnectionResetError(104, "Connection reset by peer")):
        self.f, self.left, self.error = f, left, error

    def read(self, n):
        if self.left <= 0:
            if isinstance(self.error, http.client.IncompleteRead):  # as http.client's: the bytes the cut read got
                raise http.client.IncompleteRead(self.f.read(len(self.error.partial)))
            raise self.error
        buf = self.f.read(min(n, self.left))
        self.left -= len(buf)
        return buf

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()


def interrupted(monkeypatch, url, out, after, error=ConnectionResetError(104, "Connection reset by peer"), kept=None):
    """Download ``url`` to ``out`` until the connection drops after ``after`` bytes: ``out``.partial
    (``kept`` bytes, ``after`` unless given) and its record are left, as by a killed or cut-off
    download. Returns the error's line."""
    real = download._open_from
    with monkeypatch.context() as m:
        m.setattr(download, "_open_from", lambda u, offset: (lambda s, t, r, v: (_Dropped(s, after, error), t, r, v))(
            *real(u, offset)))
        with pytest.raises(UserError) as e:
            download.download(url, str(out), progress=False)
    assert os.path.getsize(str(out) + ".partial") == (after if kept is None else kept)
    return str(e.value)


@pytest.mark.parametrize("error, why, kept", [
    (ConnectionResetError(104, "Connection reset by peer"), "Connection reset by peer", 30000),
    (TimeoutError("timed out"), "timed out", 30000),
    # a chunked reply cut short: the 100 bytes its read got before the cut are kept too (they were dropped)
    (http.client.IncompleteRead(b"x" * 100), "the server closed the connection early", 30100),
])
def test_a_connection_that_breaks_off_is_one_line_and_the_bytes_fetched_are_kept(ref_data, tmp_path, monkeypatch,
                                                                                 error, why, kept):
    """A reset, a read timeout or a chunked reply cut short mid-transfer was a traceback (only a
    clean close short of Content-Length said to rerun)."""
    src = os.path.join(ref_data, "data", "vocab.txt")
    out = tmp_path / "vocab.txt"
    monkeypatch.setattr(download, "CHUNK", 10000)
    line = interrupted(monkeypatch, "file://" + src, out, 30000, error, kept)
    assert line == "download of file://%s stopped at %d of 231508 bytes (%s): run the same command again to " \
                   "resume" % (src, kept, why)
    assert open(str(out) + ".partial", "rb").read() == open(src, "rb").read(kept)  # the source's first bytes
    assert download.download("file://" + src, str(out), progress=False) == "64800d5d8528ce344256daf115d4965e"


def opened_at(monkeypatch):
    """The offsets ``download`` asks its source for, from now on."""
    offsets, real = [], download._open_from
    monkeypatch.setattr(download, "_open_from", lambda u, offset: offsets.append(offset) or real(u, offset))
    return offsets


def test_resumes_a_partial_file_url_download_and_checks_md5(ref_data, tmp_path, monkeypatch, capsys):
    src = os.path.join(ref_data, "data", "vocab.txt")
    data = open(src, "rb").read()
    out = tmp_path / "vocab.txt"
    monkeypatch.setattr(download, "CHUNK", 10000)
    interrupted(monkeypatch, "file://" + src, out, 100000)
    offsets = opened_at(monkeypatch)
    md5 = download.download("file://" + src, str(out), progress=False)
    assert md5 == "64800d5d8528ce344256daf115d4965e"  # the md5 results/ lists for vocab.txt
    assert offsets == [100000] and capsys.readouterr().err == ""  # resumed, not started over
    assert out.read_bytes() == data and os.listdir(str(tmp_path)) == ["vocab.txt"]  # no .partial, no record


class _Killed(BaseException):
    """A SIGKILL: nothing of the command's own runs after it."""


@pytest.mark.parametrize("renamed", [False, True])
def test_a_download_killed_at_its_rename_leaves_no_record_a_rerun_keeps(ref_data, tmp_path, monkeypatch, renamed):
    """A hostile sweep: killed after its rename, before its record went, a download left
    part-N.partial.source beside the finished part-N for ever (the rerun: "OK", nothing to do), and a
    trainer given part-* refused the folder for it ("not a TFRecord or HDF5 file"). The record goes
    first: killed before the rename, the rerun fetches the file again."""
    src = os.path.join(ref_data, "data", "vocab.txt")
    out = tmp_path / "vocab.txt"
    real = os.replace

    def killed(a, b):
        if str(a).endswith(".partial"):
            if renamed:
                real(a, b)
            raise _Killed()
        real(a, b)
    with monkeypatch.context() as m:
        m.setattr(os, "replace", killed)
        with pytest.raises(_Killed):
            download.download("file://" + src, str(out), progress=False)
    assert download.download("file://" + src, str(out), progress=False) == "64800d5d8528ce344256daf115d4965e"
    assert sorted(n for n in os.listdir(str(tmp_path)) if not n.startswith(".")) == ["vocab.txt"]


def test_a_partial_download_from_another_source_starts_over(ref_data, tmp_path, monkeypatch, capsys):
    """A hostile sweep: a part-00123-of-00500.partial cut off from one server was joined to
    another's remainder, exit 0, a file of the right size starting with the first server's bytes
    (the text shards with no published md5 are not checked). A partial file is resumed only from
    the URL and size it came from; one from another, or with no record (an older version's),
    starts over, saying so."""
    text = open(os.path.join(ref_data, "data", "vocab.txt"), "rb").read()
    srv = {}
    for server, data in (("a", text), ("b", bytes(reversed(text)))):  # one name, one size, other bytes
        srv[server] = tmp_path / server / "part-00123-of-00500"
        srv[server].parent.mkdir()
        srv[server].write_bytes(data)
    url = {k: "file://%s" % v for k, v in srv.items()}
    out = tmp_path / "dl" / "part-00123-of-00500"
    partial = str(out) + ".partial"
    monkeypatch.setattr(download, "CHUNK", 10000)

    def fetched_b(why):
        offsets = opened_at(monkeypatch)
        assert download.main(["download", "--url=" + url["b"], "--output_dir=%s" % out.parent, "--noprogress"]) == 0
        assert out.read_bytes() == srv["b"].read_bytes() and os.listdir(str(out.parent)) == [out.name]
        assert offsets[-1] == 0 and capsys.readouterr().err == "warning: %s %s: starting over\n" % (partial, why)
        out.unlink()
    interrupted(monkeypatch, url["a"], out, 100000)
    fetched_b("came from %s, not %s" % (url["a"], url["b"]))
    with open(partial, "wb") as f:  # left by an older version: no record of its source
        f.write(srv["b"].read_bytes()[:100000])
    fetched_b("has no readable record of the URL it came from (%s.source)" % partial)
    interrupted(monkeypatch, url["b"], out, 100000)
    srv["b"].write_bytes(text[:-10])  # the same URL, another file since
    fetched_b("came from a %d-byte file, but %s is now %d bytes" % (len(text), url["b"], len(text) - 10))


def test_a_partial_download_of_a_file_changed_since_at_the_same_size_starts_over(ref_data, tmp_path, monkeypatch,
                                                                                   capsys):
    """A hostile sweep: a download killed at 301,989,888 of 400,000,000 bytes, its source then
    rewritten at the same size, was resumed: exit 0, `OK`, a file of the old version's bytes and the
    new one's remainder (no md5 is published for 494 of the text shards). The record now holds the
    source's version (a file's inode and mtime, a server's ETag or Last-Modified)."""
    text = open(os.path.join(ref_data, "data", "vocab.txt"), "rb").read()
    src = tmp_path / "mirror" / "part-00123-of-00500"
    src.parent.mkdir()
    src.write_bytes(text)
    out = tmp_path / "dl" / src.name
    monkeypatch.setattr(download, "CHUNK", 10000)
    interrupted(monkeypatch, "file://%s" % src, out, 100000)
    st = os.stat(str(src))
    src.write_bytes(bytes(reversed(text)))  # regenerated: the same size, other bytes
    os.utime(str(src), ns=(st.st_atime_ns, st.st_mtime_ns + 10 ** 9))  # (a coarse clock could give the same mtime)
    offsets = opened_at(monkeypatch)
    assert download.main(["download", "--url=file://%s" % src, "--output_dir=%s" % out.parent, "--noprogress"]) == 0
    assert out.read_bytes() == src.read_bytes() and os.listdir(str(out.parent)) == [out.name]
    assert offsets[-1] == 0
    assert re.fullmatch(r"warning: %s\.partial came from file://%s as it was then \(inode \d+ mtime_ns \d+\), but it "
                        r"has changed since \(inode \d+ mtime_ns \d+\): starting over\n" % (re.escape(str(out)),
                                                                                      re.escape(str(src))),
                        capsys.readouterr().err)


def test_a_servers_validator_names_the_version_a_weak_etag_does_not():
    assert download._version({"ETag": '"abc"', "Last-Modified": "Mon"}) == '"abc"'
    assert download._version({"ETag": 'W/"abc"', "Last-Modified": "Mon"}) == "Mon"
    assert download._version({}) is None


def test_wrong_content_is_rejected_and_not_kept(tmp_path):
    src = tmp_path / "src" / "vocab.txt"
    src.parent.mkdir()
    src.write_bytes(b"not the vocab\n")
    out = tmp_path / "out" / "vocab.txt"
    with pytest.raises(UserError, match="expected 231508 bytes"):
        download.download("file://%s" % src, str(out), progress=False)
    assert not out.exists() and not os.path.exists(str(out) + ".partial")


def test_explicit_md5_for_an_unlisted_file(tmp_path):
    src = tmp_path / "blob.bin"
    src.write_bytes(os.urandom(3 * download.CHUNK + 17))
    want = hashlib.md5(src.read_bytes()).hexdigest()
    out = tmp_path / "dl" / "blob.bin"
    assert download.download("file://%s" % src, str(out), md5=want, progress=False) == want
    assert out.read_bytes() == src.read_bytes()
    with pytest.raises(UserError, match="unsupported URL"):
        download.download("ftp://example/x", str(tmp_path / "x"), md5=want, progress=False)


def test_a_wrong_md5_says_what_was_expected(tmp_path):
    """Issue 33: with --md5 (no size known) the error said 'expected None bytes'."""
    src = tmp_path / "blob.bin"
    src.write_bytes(b"0123456789")
    got = hashlib.md5(b"0123456789").hexdigest()
    out = tmp_path / "dl" / "blob.bin"
    with pytest.raises(UserError) as e:
        download.main(["download", "--url=file://%s" % src, "--output=%s" % out, "--md5=" + "0" * 32, "--noprogress"])
    assert str(e.value) == ("%s: got 10 bytes md5 %s, expected md5 %s; the partial file was removed, check "
                            "the URL and run again" % (out, got, "0" * 32))
    src = tmp_path / "src" / "vocab.txt"  # a listed name: both are known
    src.parent.mkdir()
    src.write_bytes(b"0123456789")
    with pytest.raises(UserError, match="got 10 bytes md5 %s, expected 231508 bytes md5 "
                                        "64800d5d8528ce344256daf115d4965e;" % got):
        download.download("file://%s" % src, str(tmp_path / "out" / "vocab.txt"), progress=False)


def test_an_uppercase_md5_matches(tmp_path, capsys):
    """An uppercase --md5 was compared with the lowercase sum: the download was removed as a mismatch."""
    src = tmp_path / "blob.bin"
    src.write_bytes(b"0123456789")
    want = hashlib.md5(b"0123456789").hexdigest()
    out = tmp_path / "dl" / "blob.bin"
    argv = ["download", "--url=file://%s" % src, "--output=%s" % out, "--md5=" + want.upper(), "--noprogress"]
    assert download.main(argv) == 0
    assert out.read_bytes() == b"0123456789"
    assert capsys.readouterr().out == "OK %s md5 %s\n" % (out, want)
    assert download.main(argv) == 0  # the file now present is checked against the same --md5


def test_an_output_name_too_long_for_the_record_of_a_partial_download_is_one_line_naming_it(tmp_path):
    """A hostile sweep: --output of 232 bytes was "cannot use NAME.partial.source.tmp-3190: file name too
    long" (the record of a download not finished, past NAME_MAX), not the --output and the length that fits."""
    src = tmp_path / "blob.bin"
    src.write_bytes(b"0123456789")
    out = tmp_path / "dl" / ("b" * 229)
    with pytest.raises(UserError) as e:
        download.main(["download", "--url=file://%s" % src, "--output=%s" % out, "--noprogress",
                       "--md5=" + hashlib.md5(b"0123456789").hexdigest()])
    assert str(e.value) == ("--output %s: its name is 229 bytes, too long for NAME.partial.source.tmp-PID, the record "
                            "of a download not finished (a file name may have 255 bytes): give a name of at most 228 "
                            "bytes" % out)
    assert os.listdir(tmp_path) == ["blob.bin"]


@pytest.mark.parametrize("md5, what", [
    (hashlib.sha256(b"0123456789").hexdigest(), "a sha256"),
    ("0" * 31, "not an md5"),
    ("g" * 32, "not an md5"),
    ("", "not an md5"),
])
def test_a_malformed_md5_is_refused_before_downloading(tmp_path, md5, what):
    src = tmp_path / "blob.bin"
    src.write_bytes(b"0123456789")
    out = tmp_path / "dl" / "blob.bin"
    with pytest.raises(UserError) as e:
        download.main(["download", "--url=file://%s" % src, "--output=%s" % out, "--md5=" + md5, "--noprogress"])
    assert str(e.value) == ("--md5=%s is %s: give the file's md5 (32 hex digits), or leave --md5 out to check the md5 "
                            "results/ lists for its name" % (md5, what))
    assert not (tmp_path / "dl").exists()  # nothing was fetched


def test_a_tfrecord_shard_is_held_against_the_tfrecords_published_size_not_the_text_shards(tmp_path, capsys):
    """The 500 TFRecords and the 500 text shards share their names: a fetched TFRecord part-00000 was
    held against the text shard's md5 and size and removed (every TFRecord part results/ lists)."""
    src = tmp_path / "srv" / "part-00000-of-00500"
    src.parent.mkdir()
    src.write_bytes(b"".join(frame(b"record %d" % i) for i in range(3)))
    url, out = "file://%s" % src, tmp_path / "dl" / "part-00000-of-00500"
    with pytest.raises(UserError, match=r"expected 514241279 bytes; the partial"):  # the real TFRecord's size
        download.download(url, str(out), progress=False)
    results = tmp_path / "results"  # results/ as if this file were the published one
    shutil.copytree(RESULTS_DIR, results)
    sizes = results / "bert_reference_tfrecord_sizes.txt"
    sizes.write_text(sizes.read_text().replace("514241279  part-00000", "%d  part-00000" % src.stat().st_size))
    want = hashlib.md5(src.read_bytes()).hexdigest()
    assert download.download(url, str(out), progress=False, results_dir=str(results)) == want
    assert download.download(url, str(out), progress=False, results_dir=str(results)) == want  # present: kept
    text = tmp_path / "srv2" / "part-00000-of-00500"  # a text shard of that name still meets the text md5
    text.parent.mkdir()
    text.write_bytes(b"some text\n")
    with pytest.raises(UserError, match="expected 27150902 bytes md5 a64a7c31eff5cd38ae6d94f7a6229dab;"):
        download.download("file://%s" % text, str(tmp_path / "dl2" / "part-00000-of-00500"), progress=False)


def test_a_tfrecord_of_its_published_size_but_damaged_records_is_not_renamed_into_place(tmp_path):
    """A sweep: results/ publishes only sizes for the TFRecords, and download took a file of that size
    whatever it held (zeros after its first record: a preallocated copy cut off), renamed it into
    place and said OK, where verify calls it a MISMATCH. Its records' CRCs are checked, as verify does."""
    good = b"".join(frame(b"record %d" % i) for i in range(3))
    src = tmp_path / "srv" / "eval_10k"
    src.parent.mkdir()
    src.write_bytes(good[:len(frame(b"record 0"))] + bytes(len(good) - len(frame(b"record 0"))))
    results = tmp_path / "results"  # results/ as if the file were of the published size
    shutil.copytree(RESULTS_DIR, results)
    sizes = results / "bert_reference_tfrecord_sizes.txt"
    sizes.write_text(sizes.read_text().replace("25382591  eval_10k", "%d  eval_10k" % len(good)))
    url, out = "file://%s" % src, tmp_path / "dl" / "eval_10k"
    with pytest.raises(UserError, match=r"got %d bytes, the published size, but not the TFRecord file: .*record 1"
                       % len(good)):
        download.download(url, str(out), progress=False, results_dir=str(results))
    assert not out.exists() and not os.path.exists(str(out) + ".partial")
    out.parent.mkdir()  # (the refused download removed the folder it made)
    out.write_bytes(src.read_bytes())  # one already there is not kept as the file either
    with pytest.raises(UserError, match="exists with .*records pass their CRCs"):
        download.download(url, str(out), progress=False, results_dir=str(results))
    src.write_bytes(good)
    out.unlink()
    assert download.download(url, str(out), progress=False, results_dir=str(results)) == hashlib.md5(good).hexdigest()


def test_the_tf2_checkpoints_files_are_held_against_the_tf2_checkpoints_values(tmp_path):
    """The TF1 and TF2 checkpoints share two file names: a fetched TF2 model.ckpt-28252.index was held
    against the TF1 checkpoint's md5 (the first table that listed the name) and removed."""
    results = tmp_path / "results"  # results/, as if this file were the TF2 checkpoint's index
    shutil.copytree(RESULTS_DIR, results)
    src = tmp_path / "srv" / "model.ckpt-28252.index"
    src.parent.mkdir()
    src.write_bytes(b"a TF2 index")
    want = hashlib.md5(src.read_bytes()).hexdigest()
    for name in ("md5", "sizes"):
        table = results / ("bert_reference_checkpoint_tf2_%s.txt" % name)
        value = want if name == "md5" else str(src.stat().st_size)
        table.write_text("".join("%s  model.ckpt-28252.index\n" % value if line.endswith("model.ckpt-28252.index")
                                 else line + "\n" for line in table.read_text().splitlines()))
    out = tmp_path / "dl" / "model.ckpt-28252.index"
    assert download.download("file://%s" % src, str(out), progress=False, results_dir=str(results)) == want
    assert out.read_bytes() == src.read_bytes()
    other = tmp_path / "srv2" / "model.ckpt-28252.index"
    other.parent.mkdir()
    other.write_bytes(b"neither")
    with pytest.raises(UserError, match=r"expected \d+ bytes md5 f97de3ae180eb8d479555c939d50d048 or \d+ bytes md5 "
                                        r"%s;" % want):
        download.download("file://%s" % other, str(tmp_path / "dl2" / other.name), progress=False,
                          results_dir=str(results))


def test_an_output_ending_in_a_slash_is_named_as_a_directory(tmp_path):
    """--output=dl/ said "cannot tell a file name from --url=...: give --output", blaming the URL
    and asking for the flag that was given."""
    src = tmp_path / "vocab.txt"
    src.write_bytes(b"x")
    out = "%s/dl/" % tmp_path
    with pytest.raises(UserError) as e:
        download.main(["download", "--url=file://%s" % src, "--output=" + out, "--noprogress"])
    assert str(e.value) == ("--output=%s names a directory: give a file path, or --output_dir=%s for the URL's file "
                            "name" % (out, out))
    assert os.listdir(str(tmp_path)) == ["vocab.txt"]


@pytest.mark.parametrize("flag, fix", [("output", "the file's path"),
                                       ("output_dir", "the directory for the URL's file name")])
def test_an_empty_output_or_output_dir_is_refused_not_the_current_directory(tmp_path, monkeypatch, flag, fix):
    """A hostile sweep: `download --output=$DEST` (or --output_dir=) with the variable unset wrote the
    URL's file name into the current directory: exit 0, the file where no one looks for it."""
    src = tmp_path / "src" / "notes.txt"
    src.parent.mkdir()
    src.write_bytes(b"x")
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    for empty in ("", " "):
        with pytest.raises(UserError) as e:
            download.main(["download", "--url=file://%s" % src, "--%s=%s" % (flag, empty), "--noprogress",
                           "--md5=%s" % hashlib.md5(b"x").hexdigest()])
        assert str(e.value) == ("--%s was given empty (--%s=%s; an unset variable?): give %s, or leave the flag out"
                                % (flag, flag, empty, fix))
    assert os.listdir(str(here)) == []


def test_a_source_record_nested_past_the_json_parser_is_no_record(tmp_path):
    """A hostile sweep: a partial download's record of JSON nested past the parser's depth was a
    RecursionError traceback, not "no readable record" (the download starts over)."""
    partial = str(tmp_path / "x.partial")
    with open(partial + download.SOURCE_SUFFIX, "w") as f:
        f.write("[" * 100000 + "]" * 100000)
    assert download._source_change(partial, "http://x/x", 1, None).startswith("has no readable record")
