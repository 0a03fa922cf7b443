import hashlib
import os
import re
import shutil
import subprocess
import sys

import pytest

from mlperf_bert.dataset import checksums, eval_articles
from mlperf_bert.errors import UserError
from mlperf_bert.dataset.tfrecord import write_records
from test_hdf5 import golden_tfrecord, made  # noqa: F401 (fixtures)


def run_verify(args, **kw):
    """(ok, the per-file lines); the last line is the summary (issue 47), which counts them."""
    lines = []
    ok = checksums.verify(args, out=lines.append, **kw)
    *lines, summary = lines
    counts = {k: sum(l.startswith(k + " ") for l in lines) for k in ("OK", "MISMATCH", "MISSING", "UNKNOWN")}
    assert summary == "verify: %d OK, %d MISMATCH, %d MISSING, %d UNKNOWN: %s" % (
        tuple(counts.values()) + ("every file checked matches" if ok else "FAILED",)), (summary, lines)
    return ok, lines


def md5_of(path):
    return hashlib.md5(open(path, "rb").read()).hexdigest()


def test_results_tables_parse_and_hold_only_reference_values():
    tables = checksums.known_tables()
    assert tables["text"]["eval.md5"] == (330000, "71a58382a68947e93e88aa0d42431b6c")
    assert tables["checkpoint_tf1"]["vocab.txt"] == (231508, "64800d5d8528ce344256daf115d4965e")
    assert tables["tfrecord"]["eval_10k"] == (25382591, None)
    assert len(tables["text"]) == 8 and len(tables["checkpoint_tf2"]) == 2


def test_real_files_match_their_listed_md5(ref_data):
    data = os.path.join(ref_data, "data")
    ok, lines = run_verify([os.path.join(data, "eval.md5"), os.path.join(data, "vocab.txt")])
    assert ok, lines
    assert [l.split()[0] for l in lines] == ["OK", "OK"]
    # and md5sum itself accepts the results/ files
    if shutil.which("md5sum"):
        for table in ("bert_reference_results_text_md5.txt", "bert_reference_checkpoint_tf1_md5.txt"):
            r = subprocess.run(["md5sum", "--check", "--ignore-missing",
                                os.path.join(checksums.RESULTS_DIR, table)], cwd=data, capture_output=True)
            assert r.returncode == 0, r.stdout + r.stderr


def test_corrupted_copy_is_a_mismatch_and_fails(ref_data, tmp_path):
    src = os.path.join(ref_data, "data", "vocab.txt")
    bad = tmp_path / "vocab.txt"
    data = bytearray(open(src, "rb").read())
    data[1000] ^= 1  # same size, different content: only the md5 can tell
    bad.write_bytes(bytes(data))
    ok, lines = run_verify([str(bad)])
    assert not ok and lines[0].startswith("MISMATCH %s" % bad)
    assert checksums.main(["verify", str(bad)]) != 0
    assert checksums.main(["verify", src]) == 0


def test_directory_set_reports_missing_and_lists_unknown(ref_data, tmp_path):
    shutil.copy(os.path.join(ref_data, "data", "eval.md5"), tmp_path / "eval.md5")
    (tmp_path / "notes.txt").write_text("hello")
    ok, lines = run_verify([str(tmp_path)])
    assert not ok
    missing = [l for l in lines if l.startswith("MISSING")]
    assert len(missing) == 501  # 500 parts + eval.txt
    assert any(l.startswith("UNKNOWN %s" % (tmp_path / "notes.txt")) for l in lines)
    assert any(l.startswith("OK %s" % (tmp_path / "eval.md5")) for l in lines)
    # an unknown file alone does not fail
    ok, lines = run_verify([str(tmp_path / "notes.txt")])
    assert ok and lines[0].startswith("UNKNOWN")


@pytest.mark.parametrize("folder, expected", [("tf1_ckpt", checksums.SETS["checkpoint_tf1"][2]),
                                              ("tf2_ckpt", checksums.SETS["checkpoint_tf2"][2])])
def test_a_checkpoint_folder_whose_checkpoint_is_gone_is_missing_it(ref_data, tmp_path, folder, expected):
    """A sweep: `verify DIR/tf1_ckpt` (the README's check of the phase-1 checkpoint) on a folder whose
    checkpoint download failed, vocab.txt alone left, said "1 OK ... every file checked matches",
    exit 0: the set was recognised only by a checkpoint file present. The reference's folder names
    the set too."""
    d = tmp_path / folder
    d.mkdir()
    shutil.copy(os.path.join(ref_data, "data", "vocab.txt"), d / "vocab.txt")
    ok, lines = run_verify([str(d)])
    assert not ok and lines[0].startswith("OK %s" % (d / "vocab.txt"))
    assert lines[1:] == ["MISSING %s" % (d / name) for name in expected]


def test_tfrecord_size_is_checked(tmp_path):
    path = tmp_path / "eval_10k"
    write_records(str(path), [b"x" * 10])
    assert checksums.is_tfrecord(str(path))
    ok, lines = run_verify([str(path)])
    # issue 45: "(26 bytes md5 not hashed; expected tfrecord: 25382591 bytes md5 ?)"
    assert not ok and lines == ["MISMATCH %s: 26 bytes where results/ (tfrecord) lists 25382591" % path], lines


def test_a_file_of_the_published_size_is_also_checked_against_its_records(tmp_path):
    """A hostile sweep: results/ lists only sizes for the TFRecords (eval_10k, eval_intermediate, two
    shards), and a file of zeros of that size (a preallocated download cut off) was OK. A size-only
    match is checked against the file's own record CRCs too."""
    size = 25382591  # results/'s eval_10k
    path = tmp_path / "eval_10k"
    write_records(str(path), [b"x" * (size - 16)])  # one record: exactly the published size
    ok, lines = run_verify([str(path)])
    assert ok and lines == ["OK %s (results/ (tfrecord), size; its own: the CRCs of its 1 records)" % path], lines
    with open(path, "r+b") as f:  # its header kept, its data zeros
        f.seek(12)
        f.write(bytes(size - 16))
    ok, lines = run_verify([str(path)])
    assert not ok and lines[0].startswith("MISMATCH %s (results/ (tfrecord): the size is the published one, but "
                                          % path) and "record 0" in lines[0], lines
    with open(path, "wb") as f:
        f.truncate(size)  # all zeros
    ok, lines = run_verify([str(path)])
    assert not ok and lines[0].startswith("MISMATCH %s (results/ (tfrecord): the size is the published one, but "
                                          % path), lines


def test_a_file_of_another_kind_in_a_folder_of_tfrecords_is_a_mismatch(tmp_path):
    """A hostile sweep: in a folder of TFRecords an empty shard or an HTML error page was UNKNOWN
    and the folder passed (exit 0); a text shard under a TFRecord's name was OK against the text
    shards' md5. A shard there that is not a TFRecord fails, whatever another table lists."""
    d = tmp_path / "tfrecords"
    d.mkdir()
    write_records(str(d / "part-00000-of-00500"), [b"a record"])
    write_records(str(d / "part-00003-of-00500"), [b"a record", b"another"])
    (d / "part-00004-of-00500").write_bytes(b"<html>403 Forbidden</html>\n")
    (d / "part-00005-of-00500").write_bytes(b"")
    text = b"A text shard's sentence.\n\n"
    (d / "part-00001-of-00500").write_bytes(text)
    (d / "notes.txt").write_text("hello")
    results = tmp_path / "results"  # results/, as if this text were the published text shard part-00001
    shutil.copytree(checksums.RESULTS_DIR, results)
    for name, value in (("md5", hashlib.md5(text).hexdigest()), ("sizes", str(len(text)))):
        table = results / ("bert_reference_results_text_%s.txt" % name)
        table.write_text("".join("%s  part-00001-of-00500\n" % value if line.endswith("part-00001-of-00500") else
                                 line + "\n" for line in table.read_text().splitlines()))
    ok, lines = run_verify([str(d)], results_dir=str(results))
    got = {l.split(" ")[1].rstrip(":"): l for l in lines if l.startswith(("OK", "MISMATCH", "UNKNOWN"))}
    assert not ok
    assert got[str(d / "part-00003-of-00500")].startswith("OK ")  # its own CRCs
    assert got[str(d / "part-00000-of-00500")].startswith("MISMATCH ")  # not the published size
    assert got[str(d / "part-00004-of-00500")] == (
        "MISMATCH %s (in a folder of TFRecords, but not a TFRecord file)" % (d / "part-00004-of-00500"))
    assert got[str(d / "part-00005-of-00500")] == (
        "MISMATCH %s (in a folder of TFRecords, but not a TFRecord file: empty)" % (d / "part-00005-of-00500"))
    assert got[str(d / "part-00001-of-00500")] == (  # not the text shards' md5 it matches
        "MISMATCH %s (in a folder of TFRecords, but not a TFRecord file)" % (d / "part-00001-of-00500"))
    assert got[str(d / "notes.txt")].startswith("UNKNOWN ")
    ok, lines = run_verify([str(d / "part-00004-of-00500")])  # alone, nothing says what it should be
    assert ok and lines[0].startswith("UNKNOWN ")


def test_an_hdf5_file_or_a_sample_folders_shards_of_another_kind_are_a_mismatch(made, tmp_path):
    """A second sweep: a to-hdf5 file named part-00001-of-00500 in a folder of TFRecords was OK by its
    own CRCs; in a sample's folder without a manifest (part-*-of-00004) a text shard and an empty one
    were UNKNOWN and the folder passed. A folder is one of TFRecords when its first shard is one."""
    d = tmp_path / "tfrecords"
    d.mkdir()
    shutil.copy(made["tfrecord"], d / "part-00000-of-00500")
    shutil.copy(made["plain"], d / "part-00001-of-00500")
    ok, lines = run_verify([str(d)])
    assert not ok and "MISMATCH %s (in a folder of TFRecords, but not a TFRecord file: an HDF5 file)" % (
        d / "part-00001-of-00500") in lines, lines
    s = tmp_path / "sample"
    s.mkdir()
    shutil.copy(made["tfrecord"], s / "part-00000-of-00004")
    (s / "part-00001-of-00004").write_bytes(b"A text shard's sentence.\n\n")
    (s / "part-00002-of-00004").write_bytes(b"")
    shutil.copy(made["tfrecord"], s / "part-00003-of-00004")
    ok, lines = run_verify([str(s)])
    assert not ok and lines == [
        "OK %s (no published checksum; its own: the CRCs of its 500 records)" % (s / "part-00000-of-00004"),
        "MISMATCH %s (in a folder of TFRecords, but not a TFRecord file)" % (s / "part-00001-of-00004"),
        "MISMATCH %s (in a folder of TFRecords, but not a TFRecord file: empty)" % (s / "part-00002-of-00004"),
        "OK %s (no published checksum; its own: the CRCs of its 500 records)" % (s / "part-00003-of-00004")], lines
    for name in ("part-00000-of-00004", "part-00003-of-00004"):  # a folder of text shards: as before
        os.remove(s / name)
    ok, lines = run_verify([str(s)])
    assert ok and [l.split(" ")[0] for l in lines] == ["UNKNOWN", "UNKNOWN"], lines


def test_eval_txt_checked_article_by_article(tmp_path):
    articles = ["\nFirst article.\nSecond line.", "", "Third one.  \n"]
    (tmp_path / "eval.txt").write_text("".join(a + "\n\n" for a in articles), encoding="utf-8")
    md5s = [hashlib.md5(a.rstrip().encode("utf-8")).hexdigest() for a in articles]
    (tmp_path / "eval.md5").write_text("".join(m + "\n" for m in md5s))
    good, line = eval_articles.check_eval_articles(str(tmp_path / "eval.txt"), str(tmp_path / "eval.md5"))
    assert good and "(3)" in line
    md5s[2] = "0" * 32
    (tmp_path / "eval.md5").write_text("".join(m + "\n" for m in md5s))
    good, line = eval_articles.check_eval_articles(str(tmp_path / "eval.txt"), str(tmp_path / "eval.md5"))
    assert not good and "article 2" in line


def test_eval_txt_with_a_blank_last_piece_matches_its_eval_md5(tmp_path):
    """The real reference's eval.txt and eval.md5 of three WikiExtractor files (3 eval articles; the
    middle file ends with an empty article, whose blank "\n" piece is drawn): five newlines after
    the first article were cut as X, "", "\nY" and the third md5 did not match. Made with
    process_wiki.sh's steps (NLTK 3.4.5, ``seperate_test_set.py --num_test_articles=3``)."""
    x = "Article 1 is here.\nIt has two sentences."
    (tmp_path / "eval.txt").write_text(x + "\n\n\n\n\n" + x + "\n\n", encoding="utf-8")
    (tmp_path / "eval.md5").write_text("5cf1b85820f04db9b9cc94e919f27f42\nd41d8cd98f00b204e9800998ecf8427e\n"
                                       "5cf1b85820f04db9b9cc94e919f27f42\n")
    good, line = eval_articles.check_eval_articles(str(tmp_path / "eval.txt"), str(tmp_path / "eval.md5"))
    assert good and "(3)" in line, line
    # the other cut, when eval.md5 says so; and no cut fits a wrong md5
    assert eval_articles.article_md5s(x + "\n\n\n\n\nY\n\n", [eval_articles.article_md5(a) for a in (x, "", "\nY")]) == [
        eval_articles.article_md5(a) for a in (x, "", "\nY")]
    assert eval_articles.article_md5s(x + "\n\n\n\n\nY\n\n", ["0" * 32]) == [
        eval_articles.article_md5(a) for a in (x, "", "\nY")]


def test_manifest_round_trip(tmp_path):
    a, b = tmp_path / "part-a", tmp_path / "part-b"
    a.write_bytes(b"alpha")
    b.write_bytes(b"beta!")
    checksums.write_manifest(str(tmp_path / "manifest.tsv"),
                             [("part-a", 5, 1, md5_of(a)), ("part-b", 5, 1, md5_of(b))])
    assert checksums.main(["verify", str(tmp_path / "manifest.tsv")]) == 0
    b.write_bytes(b"BETA!")
    ok, lines = run_verify([str(tmp_path / "manifest.tsv")])
    assert not ok and any(l.startswith("MISMATCH %s" % b) for l in lines)
    os.remove(a)
    ok, lines = run_verify([str(tmp_path / "manifest.tsv")])
    assert "MISSING %s" % a in lines
    # --manifest checks another directory against the same table
    other = tmp_path / "other"
    other.mkdir()
    (other / "part-a").write_bytes(b"alpha")
    ok, lines = run_verify([str(other)], manifest=checksums.read_manifest(str(tmp_path / "manifest.tsv")))
    assert not ok and "MISSING %s" % (other / "part-b") in lines
    assert any(l.startswith("OK %s" % (other / "part-a")) for l in lines)


def test_bad_input_is_a_one_line_user_error(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        checksums.main(["verify", str(tmp_path / "nope")])
    with pytest.raises(UserError, match="at least one"):
        checksums.main(["verify"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="nothing to verify in .*empty"):
        checksums.main(["verify", str(tmp_path / "empty")])
    with pytest.raises(UserError, match="cannot read manifest"):
        checksums.main(["verify", "--manifest=%s" % (tmp_path / "none.tsv"), str(tmp_path)])
    with pytest.raises(UserError, match="cannot read checksum table"):
        checksums.main(["verify", "--results_dir=%s" % (tmp_path / "none"), str(tmp_path)])


@pytest.mark.skipif(not hasattr(__import__("mlperf_bert.flags").flags, "usage"),
                    reason="needs flags.usage (the positional-argument usage lines of issue 27)")
def test_usage_line_names_the_paths(capsys):
    """Issue 27: verify's usage line did not show the paths it takes."""
    with pytest.raises(SystemExit):
        checksums.main(["mlperf_bert verify", "--help"])
    assert capsys.readouterr().out.splitlines()[0] == \
        "usage: mlperf_bert verify [--flag=value ...] FILE|DIR|MANIFEST ..."


def test_a_file_without_a_published_checksum_is_checked_against_its_own(made, tmp_path):
    """Issue 37 (23): an HDF5 or packed file (and a TFRecord) with no published value was
    ``UNKNOWN ... not checked``, exit 0, though its own checksums catch its damage: it is checked
    against them, OK or MISMATCH naming what is damaged; a file that carries none stays UNKNOWN."""
    import h5py
    from mlperf_bert.dataset import hdf5
    from test_hdf5 import flip_byte
    paths = {}
    for kind in ("plain", "packed", "tfrecord"):
        paths[kind] = str(tmp_path / ("own-" + os.path.basename(made[kind])))
        shutil.copy(made[kind], paths[kind])
    ok, lines = run_verify(sorted(paths.values()))
    assert ok and lines == sorted([
        "OK %s (no published checksum; its own: the CRC-32C of each of its datasets)" % paths["plain"],
        "OK %s (no published checksum; its own: the CRC-32C of each of its datasets)" % paths["packed"],
        "OK %s (no published checksum; its own: the CRCs of its 500 records)" % paths["tfrecord"]]), lines
    for kind, dataset, fix in (("plain", "input_ids", "convert it again with to-hdf5"),
                               ("packed", "masked_lm_ids", "pack it again (python -m mlperf_bert pack)")):
        flip_byte(paths[kind], dataset)
        ok, lines = run_verify([paths[kind]])
        assert not ok and lines == ["MISMATCH %s (no published checksum; its own: %s: dataset %s does not match the "
                                    "checksum written when the file was made: the file is damaged, %s)"
                                    % (paths[kind], paths[kind], dataset, fix)], lines
        assert checksums.main(["verify", paths[kind]]) == 1
    data = bytearray(open(paths["tfrecord"], "rb").read())
    data[-10] ^= 1  # the last record's data: its CRC tells
    open(paths["tfrecord"], "wb").write(bytes(data))
    ok, lines = run_verify([paths["tfrecord"]])
    assert not ok and lines[0].startswith("MISMATCH %s (no published checksum; its own: %s: record 499 "
                                          % (paths["tfrecord"], paths["tfrecord"])), lines
    shutil.copy(made["plain"], paths["plain"])
    with h5py.File(paths["plain"], "r+") as h:  # made before checksums were written
        for name in h:
            del h[name].attrs[hdf5.CHECKSUM_ATTR]
    ok, lines = run_verify([paths["plain"]])
    assert ok and lines == ["UNKNOWN %s (no published checksum, and it carries none of its own; not checked)"
                            % paths["plain"]], lines


@pytest.mark.parametrize("text", [b"", b"garbage\n"])
def test_a_damaged_manifest_in_a_folder_is_one_line_not_ignored(tmp_path, text):
    """A hostile sweep: a make-dataset folder whose manifest.tsv was emptied or overwritten was
    checked as a folder without one (the records' own CRCs, the manifest UNKNOWN), "every file
    checked matches", exit 0: what the manifest said went unchecked."""
    write_records(str(tmp_path / "part-00000-of-00500"), [b"record"] * 2)
    (tmp_path / checksums.MANIFEST_NAME).write_bytes(text)
    with pytest.raises(UserError) as e:
        checksums.main(["verify", str(tmp_path)])
    assert str(e.value) == "%s is not a make-dataset manifest (first line must be %r): rerun make-dataset with the " \
                           "same flags to write it again" % (tmp_path / checksums.MANIFEST_NAME, checksums.MANIFEST_HEADER)


def test_a_make_dataset_folder_is_checked_against_its_own_manifest(tmp_path):
    """Issue 45: `verify DIR` on make-dataset's output ignored its manifest.tsv: 498 MISSING parts
    (the reference's 500) and "md5 not hashed ... md5 ?" for a size the reference publishes for the
    full set only. The folder's manifest decides, and a mismatch says what differs, in words. (Names
    the reference publishes no value for: those it does are held to it too, the test after this.)"""
    names = ["part-00001-of-00500", "part-00002-of-00500", "part-00003-of-00500"]
    for i, name in enumerate(names):
        write_records(str(tmp_path / name), [b"record %d" % i] * (i + 2))
    rows = [(n, os.path.getsize(tmp_path / n), i + 2, md5_of(tmp_path / n)) for i, n in enumerate(names)]
    manifest = str(tmp_path / checksums.MANIFEST_NAME)
    checksums.write_manifest(manifest, rows)
    ok, lines = run_verify([str(tmp_path)])
    assert ok and lines == ["OK %s (%s, md5+size)" % (tmp_path / n, manifest) for n in sorted(names)], lines
    data = bytearray((tmp_path / names[0]).read_bytes())
    data[-1] ^= 1  # same size: only the md5 tells
    (tmp_path / names[0]).write_bytes(bytes(data))
    with open(tmp_path / names[1], "ab") as f:
        f.write(b"x")
    os.remove(tmp_path / names[2])
    ok, lines = run_verify([str(tmp_path)])
    assert not ok and lines == [
        "MISMATCH %s: md5 %s where %s lists %s" % (tmp_path / names[0], md5_of(tmp_path / names[0]), manifest,
                                                  rows[0][3]),
        "MISMATCH %s: %d bytes where %s lists %d" % (tmp_path / names[1], rows[1][1] + 1, manifest, rows[1][1]),
        "MISSING %s" % (tmp_path / names[2])], lines


def test_a_make_dataset_output_the_reference_publishes_a_size_for_is_held_to_it_too(tmp_path, capsys):
    """A hostile sweep: in make-dataset's folder only its own manifest was read, which the same run
    wrote: part-00000-of-00500 of 26 bytes was OK there and MISMATCH given alone (results/ lists
    514,241,279 bytes), so a set made from other text or flags verified clean. Both verdicts hold
    now; `--manifest` checks the folder against its manifest alone."""
    names = ["part-00000-of-00500", "part-00001-of-00500", "eval_10k"]
    for i, name in enumerate(names):
        write_records(str(tmp_path / name), [b"record %d" % i] * (i + 2))
    manifest = str(tmp_path / checksums.MANIFEST_NAME)
    checksums.write_manifest(manifest, [(n, os.path.getsize(tmp_path / n), i + 2, md5_of(tmp_path / n))
                                        for i, n in enumerate(names)])
    # make-dataset's record of its settings: not an output (a new user's journey: "UNKNOWN
    # make_dataset_settings.json" beside the OKs of `verify --manifest=...`)
    (tmp_path / checksums.SETTINGS_NAME).write_text("{}\n")
    published = checksums.known_tables()["tfrecord"]
    expected = [
        "MISMATCH %s: intact as manifest.tsv lists it, but %d bytes where results/ (tfrecord) lists %d: not the "
        "reference's file (made from other text, vocab or flags); `verify --manifest=%s %s` checks the folder "
        "against its manifest alone" % (tmp_path / n, os.path.getsize(tmp_path / n), published[n][0], manifest,
                                        tmp_path) for n in ("eval_10k", "part-00000-of-00500")]
    ok, lines = run_verify([str(tmp_path)])
    assert not ok and lines == expected + ["OK %s (%s, md5+size)" % (tmp_path / names[1], manifest)]
    ok, lines = run_verify([manifest])
    assert not ok and lines == expected + ["OK %s (%s, md5+size)" % (tmp_path / names[1], manifest)]
    ok, lines = run_verify([str(tmp_path)], manifest=checksums.read_manifest(manifest))
    assert ok and len(lines) == 3 and all(line.startswith("OK ") for line in lines), lines
    assert checksums.main(["verify", str(tmp_path / names[0])]) == 1  # as given alone
    assert "MISMATCH" in capsys.readouterr().out


def test_the_command_a_mismatch_offers_names_a_folder_with_spaces_and_quotes_whole(tmp_path):
    """A hostile sweep of paths: the `verify --manifest=...` a MISMATCH offers named "/data/My Set/..."
    unquoted, so pasted it verified other paths ("/data/My" and "Set/..."); it is quoted as a shell reads it."""
    import shlex
    folder = tmp_path / "My Set 'q\" $x"
    folder.mkdir()
    write_records(str(folder / "eval_10k"), [b"record"])
    manifest = str(folder / checksums.MANIFEST_NAME)
    checksums.write_manifest(manifest, [("eval_10k", os.path.getsize(folder / "eval_10k"), 1,
                                         md5_of(folder / "eval_10k"))])
    ok, lines = run_verify([str(folder)])
    assert not ok and lines[0].startswith("MISMATCH "), lines
    assert shlex.split(lines[0].split("`")[1]) == ["verify", "--manifest=" + manifest, str(folder)], lines[0]


def test_a_shard_holding_another_published_file_is_a_mismatch_not_ok_by_content(tmp_path, ref_data):
    """A hostile sweep: a file found by its content was OK whatever its name, so a text shard holding
    another published file (a shard copied over a missing one) passed as "OK ... by content". A name
    of a reference set is that file; a name of one's own (a renamed config) is still found by content."""
    src = os.path.join(ref_data, "data", "eval.md5")
    for name in ("part-00003-of-00500", "eval_copy.md5"):
        shutil.copy(src, tmp_path / name)
    ok, lines = run_verify([str(tmp_path / "part-00003-of-00500"), str(tmp_path / "eval_copy.md5")])
    assert not ok and lines == [
        "OK %s (by content: the published eval.md5 of results/ (text), md5+size)" % (tmp_path / "eval_copy.md5"),
        "MISMATCH %s: its content is the published eval.md5 of results/ (text), not part-00003-of-00500: replace it "
        "with the right file" % (tmp_path / "part-00003-of-00500")]


def test_a_file_named_as_make_datasets_output_but_not_in_its_manifest_is_a_mismatch(tmp_path):
    """A hostile sweep: an extra shard copied into make-dataset's folder verified OK by its own CRCs,
    "every file checked matches", though the manifest does not list it and a trainer given part-*
    reads it. Other files (notes, the settings) are checked as before."""
    names = ["part-00000-of-00002", "part-00001-of-00002"]
    for i, name in enumerate(names):
        write_records(str(tmp_path / name), [b"record %d" % i] * (i + 2))
    manifest = str(tmp_path / checksums.MANIFEST_NAME)
    checksums.write_manifest(manifest, [(names[0], os.path.getsize(tmp_path / names[0]), 2,
                                         md5_of(tmp_path / names[0]))])
    (tmp_path / "notes.txt").write_text("mine\n")
    ok, lines = run_verify([str(tmp_path)])
    assert not ok and lines == [
        "UNKNOWN %s (no published checksum; not checked)" % (tmp_path / "notes.txt"),
        "OK %s (%s, md5+size)" % (tmp_path / names[0], manifest),
        "MISMATCH %s (named as a make-dataset output, but manifest.tsv does not list it: the folder holds more than "
        "make-dataset made; remove it, or rerun make-dataset to list it)" % (tmp_path / names[1])], lines
    # a third: `verify DIR/manifest.tsv` (the same as `verify DIR`, docs/dataset.md) checked only the files it lists
    ok, by_path = run_verify([manifest])
    assert not ok and by_path[-1] == lines[-1], by_path
    # a second sweep: given as --manifest (a sample's folder, another site's manifest), the folder
    # passed with the extra shard OK by its own CRCs
    table = checksums.read_manifest(manifest)
    ok, lines = run_verify([str(tmp_path)], manifest=table)
    assert not ok and lines[2] == (
        "MISMATCH %s (named as a make-dataset output, but --manifest does not list it: the folder holds more than "
        "that manifest's set, and a trainer given part-* reads it too; remove it)" % (tmp_path / names[1])), lines
    ok, lines = run_verify([str(tmp_path / names[1])], manifest=table)  # the file alone (it passed by its CRCs)
    assert not ok and lines[0].startswith("MISMATCH %s (named as a make-dataset output, but --manifest does not "
                                          "list it" % (tmp_path / names[1])), lines
    os.remove(tmp_path / names[1])
    ok, lines = run_verify([str(tmp_path)])
    assert ok and len(lines) == 2, lines
    ok, lines = run_verify([str(tmp_path)], manifest=table)
    assert ok and len(lines) == 2, lines
    ok, lines = run_verify([manifest])
    assert ok and lines == ["OK %s (%s, md5+size)" % (tmp_path / names[0], manifest)], lines


def test_a_published_file_is_found_by_its_content_whatever_its_name(tmp_path, capsys):
    """Issue 47 (7): configs/bert_config_large.json, byte for byte the reference's bert_config.json,
    was UNKNOWN; a file is found by its content too. The command ends with a summary line."""
    config = os.path.join(os.path.dirname(checksums.RESULTS_DIR), "configs", "bert_config_large.json")
    ok, lines = run_verify([config])
    assert ok and lines == ["OK %s (by content: the published bert_config.json of results/ (checkpoint_tf1),"
                            " md5+size)" % config], lines
    other = tmp_path / "bert_config_other.json"  # the same size, other bytes: not that file
    other.write_bytes(open(config, "rb").read().replace(b"1024", b"1025"))
    assert os.path.getsize(other) == os.path.getsize(config)
    ok, lines = run_verify([str(other)])
    assert ok and lines == ["UNKNOWN %s (no published checksum; not checked)" % other], lines
    assert checksums.main(["verify", config, str(other)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == \
        "verify: 1 OK, 0 MISMATCH, 0 MISSING, 1 UNKNOWN: every file checked matches"


def test_a_file_damaged_where_its_kind_is_told_is_a_mismatch_not_unknown(made, tmp_path):
    """A hostile sweep: one byte of a TFRecord's first header (its length's CRC), or the first bytes
    of an HDF5 file, and verify said ``UNKNOWN ... not checked`` and "every file checked matches",
    exit 0 (the file no longer looked like either kind); to-hdf5 on the same file said "record 0 has
    a corrupt length". A file still laid out as TFRecords, or named as its kind, is a MISMATCH (an
    empty HDF5 file too: no HDF5 file is empty); a text file and an empty TFRecord file stay UNKNOWN."""
    copies = {name: tmp_path / name for name in ("hdrcorr", "named.tfrecord", "rows.hdf5")}
    for name, src in (("hdrcorr", "tfrecord"), ("named.tfrecord", "tfrecord"), ("rows.hdf5", "plain")):
        data = bytearray(open(made[src], "rb").read())
        if name == "named.tfrecord":
            data[0] ^= 0x40  # its first length: the records no longer chain, its name tells
        else:
            data[9 if name == "hdrcorr" else 0] ^= 0x55
        copies[name].write_bytes(bytes(data))
    (tmp_path / "notes.txt").write_text("a text file of no kind\n")
    (tmp_path / "empty.tfrecord").write_bytes(b"")
    (tmp_path / "empty.hdf5").write_bytes(b"")  # (a later sweep: it was UNKNOWN, exit 0)
    ok, lines = run_verify([str(p) for p in copies.values()] + [str(tmp_path / "notes.txt"),
                                                                 str(tmp_path / "empty.tfrecord"),
                                                                 str(tmp_path / "empty.hdf5")])
    assert not ok
    verdicts = {line.split()[1]: line for line in lines}
    assert verdicts[str(copies["hdrcorr"])] == (
        "MISMATCH %s (no published checksum; its own: laid out as TFRecords, but record 0's header fails its CRC: "
        "damaged, regenerate it)" % copies["hdrcorr"])
    assert verdicts[str(copies["named.tfrecord"])].startswith("MISMATCH %s (no published checksum; its own: named as a "
                                                        "TFRecord file" % copies["named.tfrecord"])
    assert verdicts[str(copies["rows.hdf5"])].startswith("MISMATCH %s (no published checksum; its own: named as an "
                                                         "HDF5 file" % copies["rows.hdf5"])
    assert verdicts[str(tmp_path / "notes.txt")].startswith("UNKNOWN ")
    assert verdicts[str(tmp_path / "empty.tfrecord")].startswith("UNKNOWN ")
    assert verdicts[str(tmp_path / "empty.hdf5")].startswith("MISMATCH %s (no published checksum; its own: named as "
                                                             "an HDF5 file" % (tmp_path / "empty.hdf5"))
    assert checksums.main(["verify", str(copies["hdrcorr"])]) == 1


def test_a_manifest_naming_a_file_twice_is_refused(tmp_path, capsys):
    """A hostile sweep: of two lines naming one file, the last won: a bad md5 on the first passed,
    3 OK and exit 0, whichever way the folder was given."""
    d = tmp_path / "tfm"
    d.mkdir()
    (d / "part-a").write_bytes(b"alpha")
    checksums.write_manifest(str(d / "manifest.tsv"), [("part-a", 5, 1, "0" * 32), ("part-a", 5, 1, md5_of(d / "part-a"))])
    why = "%s line 3 names part-a again: a manifest lists each file once; remove the line or regenerate the " \
          "manifest (make-dataset writes it)" % (d / "manifest.tsv")
    for args in (["verify", str(d / "manifest.tsv")], ["verify", str(d)],
                 ["verify", "--manifest=%s" % (d / "manifest.tsv"), str(d / "part-a")]):
        with pytest.raises(UserError) as e:
            checksums.main(args)
        assert str(e.value) == why and capsys.readouterr().out == "", args


def test_a_manifest_line_never_reaches_outside_its_folder(tmp_path, capsys):
    """A hostile sweep: a manifest.tsv line ``../in/vocab.txt`` was hashed and said OK, one naming
    /etc/hostname opened that file and reported its size. A name with a '/' (or '.', '..') is
    refused, naming the line; nothing outside the folder is read."""
    d = tmp_path / "tfm"
    d.mkdir()
    (d / "part-a").write_bytes(b"alpha")
    outside = tmp_path / "secret"
    outside.write_bytes(b"not the manifest's")
    for name in ("../secret", str(outside), "sub/part-a", ".."):
        checksums.write_manifest(str(d / "manifest.tsv"), [("part-a", 5, 1, md5_of(d / "part-a")),
                                                            (name, 18, 0, md5_of(outside))])
        why = "%s line 3 names %r, not a file of the manifest's folder: fix the line or regenerate the manifest " \
              "(make-dataset writes it)" % (d / "manifest.tsv", name)
        for args in (["verify", str(d / "manifest.tsv")], ["verify", str(d)],
                     ["verify", "--manifest=%s" % (d / "manifest.tsv"), str(tmp_path)]):
            with pytest.raises(UserError) as e:
                checksums.main(args)
            assert str(e.value) == why and capsys.readouterr().out == "", (name, args)  # nothing read, or said
    proc = subprocess.run([sys.executable, "-m", "mlperf_bert", "verify", str(d)], capture_output=True, text=True)
    assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", "error: %s\n" % why)


@pytest.mark.parametrize("size,records", [("5\u00b2", "1"), ("\u0665", "1"), ("5", "x"), ("5", "")])
def test_a_manifest_number_that_is_not_ascii_digits_is_one_line(tmp_path, size, records):
    """A hostile sweep: bytes "5\u00b2" passed str.isdigit() and int() raised a ValueError traceback; an
    Arabic-Indic digit was read as a size; the records column was not checked."""
    (tmp_path / "part-a").write_bytes(b"alpha")
    (tmp_path / "manifest.tsv").write_text("%s\npart-a\t%s\t%s\t%s\n" % (
        checksums.MANIFEST_HEADER, size, records, md5_of(tmp_path / "part-a")), encoding="utf-8")
    with pytest.raises(UserError) as e:
        checksums.main(["verify", str(tmp_path)])
    assert str(e.value) == "%s line 2 is not name<TAB>bytes<TAB>records<TAB>md5" % (tmp_path / "manifest.tsv")


def test_an_eval_pair_that_is_not_utf8_is_a_mismatch(tmp_path):
    """A hostile sweep: two bytes that are not UTF-8 at the end of eval.md5 (or eval.txt) and
    verify ended in a UnicodeDecodeError traceback. It is a MISMATCH naming the file and the byte."""
    articles = ["First article.", "Second one."]
    for damaged in ("eval.txt", "eval.md5"):
        (tmp_path / "eval.txt").write_text("".join(a + "\n\n" for a in articles), encoding="utf-8")
        (tmp_path / "eval.md5").write_text("".join(eval_articles.article_md5(a) + "\n" for a in articles))
        size = (tmp_path / damaged).stat().st_size
        with open(tmp_path / damaged, "ab") as f:
            f.write(b"\xff\xfe")
        proc = subprocess.run([sys.executable, "-m", "mlperf_bert", "verify", str(tmp_path / "eval.txt"),
                               str(tmp_path / "eval.md5")], capture_output=True, text=True)
        assert proc.returncode == 1 and proc.stderr == "", proc.stderr
        assert "MISMATCH %s is not UTF-8 text (byte %d): damaged, regenerate it\n" % (tmp_path / damaged, size) \
            in proc.stdout, proc.stdout


@pytest.mark.parametrize("flag", ["manifest", "results_dir"])
def test_an_empty_manifest_or_results_dir_is_refused_not_taken_as_none(tmp_path, flag):
    """A hostile sweep: `verify --manifest=$OTHER_SITE DIR` with the variable unset ran as plain `verify
    DIR`: a folder that agrees with its own manifest passed (exit 0, "every file checked matches"),
    as if the two sites' datasets were the same. An empty --results_dir read the tables from the
    working directory."""
    mine = tmp_path / "mine"
    mine.mkdir()
    write_records(str(mine / "part-00001-of-00500"), [b"ours"])
    checksums.write_manifest(str(mine / checksums.MANIFEST_NAME), [
        ("part-00001-of-00500", os.path.getsize(mine / "part-00001-of-00500"), 1, md5_of(mine / "part-00001-of-00500"))])
    assert checksums.main(["verify", str(mine)]) == 0  # its own manifest: intact
    for empty in ("", " "):
        with pytest.raises(UserError) as e:
            checksums.main(["verify", "--%s=%s" % (flag, empty), str(mine)])
        assert str(e.value).startswith("--%s was given empty (--%s=%s; an unset variable?): give the " % (
            flag, flag, empty)), str(e.value)


def test_a_killed_writes_temporary_is_a_mismatch_not_ok_by_its_crcs(tmp_path):
    """A hostile sweep: `verify tfrecords/part-*` after make-dataset was killed passed ("every file
    checked matches"): the shell's glob gave the killed writer's part-N.tmp-PID too, whose records,
    cut off at a record's end, all pass their CRCs: "OK ... its own: the CRCs of its 3 records"."""
    done, tmp = tmp_path / "part-00001-of-00500", tmp_path / "part-00002-of-00500.tmp-4242"
    write_records(str(done), [b"one", b"two"])
    write_records(str(tmp), [b"three", b"four", b"five"])
    ok, lines = run_verify([str(done), str(tmp)])
    assert not ok and lines == [
        "OK %s (no published checksum; its own: the CRCs of its 2 records)" % done,
        "MISMATCH %s (the temporary of an unfinished write of part-00002-of-00500, process 4242: still running, or "
        "killed; not a finished file: let it end, or rerun the command that makes part-00002-of-00500)" % tmp], lines


def test_a_killed_downloads_partial_file_is_a_mismatch_not_ok_or_unknown(tmp_path):
    """A hostile sweep: after a killed `download`, `verify tfrecords/part-*` passed (exit 0, "every file
    checked matches"): its part-N.partial, cut at a record's end, was "OK" by its CRCs (a text shard's:
    "UNKNOWN"), its record part-N.partial.source "UNKNOWN"."""
    done, partial = tmp_path / "part-00001-of-00500", tmp_path / "part-00002-of-00500.partial"
    write_records(str(done), [b"one", b"two"])
    write_records(str(partial), [b"three"])
    (tmp_path / "part-00002-of-00500.partial.source").write_text('{"url": "file:///x", "bytes": 9}')
    ok, lines = run_verify([str(done), str(partial), str(partial) + ".source"])
    why = ("(the file of an unfinished download of part-00002-of-00500: cut off, killed or still running; not a "
           "finished file: run the same download again to finish it)")
    assert not ok and lines == ["OK %s (no published checksum; its own: the CRCs of its 2 records)" % done,
                                "MISMATCH %s %s" % (partial, why), "MISMATCH %s.source %s" % (partial, why)], lines


def test_a_named_pipe_to_check_is_refused_at_once_not_waited_on(tmp_path):
    """A hostile sweep: `verify FIFO` (a named pipe no process writes to, given as a path, as
    --manifest, or named by a manifest) waited for ever as it opened it to read. A file to check that
    is no regular file is one line naming it; in a folder only its regular files are checked, as before."""
    from test_tfrecord import writerless_fifo
    folder = tmp_path / "out"
    folder.mkdir()
    write_records(str(folder / "part-00000-of-00002"), [b"one"])
    checksums.write_manifest(str(folder / checksums.MANIFEST_NAME), [
        ("part-00000-of-00002", os.path.getsize(folder / "part-00000-of-00002"), 1,
         md5_of(folder / "part-00000-of-00002")), ("part-00001-of-00002", 16, 1, "0" * 32)])
    fifo = str(folder / "part-00001-of-00002")
    with writerless_fifo(fifo):
        for argv, line in (([fifo], "%s is a named pipe (FIFO), not a regular file: give files or directories to "
                                    "verify" % fifo),
                           ([str(folder / checksums.MANIFEST_NAME)], "%s is a named pipe (FIFO), not a regular file: "
                                                                     "give files or directories to verify" % fifo),
                           (["--manifest=%s" % fifo, str(folder)], "--manifest %s is a named pipe (FIFO), not a "
                                                                   "regular file: give the manifest.tsv that "
                                                                   "make-dataset wrote" % fifo)):
            with pytest.raises(UserError) as e:
                checksums.main(["verify"] + argv)
            assert str(e.value) == line


def _fifo_readers(tmp_path):
    from mlperf_bert import flags
    from mlperf_bert.dataset import download, make_dataset, text_pipeline
    from mlperf_bert.harness import package
    from mlperf_bert.trainer import config, run_config
    return {
        "flagfile": lambda p: flags.parse(flags.FlagValues(), ["verify", "--flagfile=" + p]),
        "flagfile_after": lambda p: flags.parse(flags.FlagValues(), ["verify", "--flagfile", p]),
        "config.toml": run_config.read_config_file,
        "bert_config.json": config.BertConfig.from_json_file,
        "wiki_00": text_pipeline.read_wiki_file,
        "systems.json": package.load_system_json,
        "org/" + package.MADE_BY: lambda p: package.read_made_by(os.path.dirname(p)),
        "root/" + package.MANIFEST: lambda p: package.manifest_lines(os.path.dirname(p)),
        "out/" + make_dataset.SETTINGS_NAME: lambda p: make_dataset.read_settings(os.path.dirname(p)),
        "part-00000-of-00500": make_dataset.output_stats,
        "vocab.txt": lambda p: download.download("file://" + os.path.join(checksums.RESULTS_DIR, "README.md"), p,
                                                 progress=False),
        "source": lambda p: download.download("file://" + p, str(tmp_path / "fetched"), md5="0" * 32, progress=False),
        "results/bert_reference_results_text_sizes.txt": lambda p: checksums.known_tables(os.path.dirname(p)),
    }


@pytest.mark.parametrize("name", sorted(_fifo_readers(None)))
def test_a_named_pipe_wherever_a_command_reads_a_file_is_one_line_not_a_wait(tmp_path, name):
    """A hostile sweep: a FIFO no process writes to, where a command reads a file, waited for ever:
    a --flagfile (absl's own open; =PATH or PATH after it), a systems JSON (package, score), ORG/'s
    package record, MANIFEST.txt, make-dataset's settings and an output it keeps, download's --output
    and a file:// source, a table of --results_dir, and (a review) the trainer's --config and
    --bert_config_file and text-pipeline's WikiExtractor files. Each is now one line naming it
    (fileio.open_input: opened without blocking). (create-pretraining-data reads named pipes, as the
    reference does: tests/test_pretraining_data.py.)"""
    from test_tfrecord import writerless_fifo
    for d in ("org", "root", "out"):
        (tmp_path / d).mkdir()
    shutil.copytree(checksums.RESULTS_DIR, tmp_path / "results")
    os.remove(tmp_path / "results" / "bert_reference_results_text_sizes.txt")
    with writerless_fifo(str(tmp_path / name)) as fifo:
        with pytest.raises(UserError) as e:
            _fifo_readers(tmp_path)[name](fifo)
        assert "%s is a named pipe (FIFO), not a regular file: " % fifo in str(e.value) and "\n" not in str(e.value)
    assert not os.path.exists(tmp_path / "fetched")


def test_a_pipe_a_process_holds_is_a_flagfile_and_an_unreadable_file_is_named_by_its_path(tmp_path):
    """A review: the FIFO check refused --flagfile=<(echo ...) and /dev/stdin, which absl reads whole
    (a pipe with its writer); and open_input's errors named the descriptor ("Is a directory: 3")."""
    from mlperf_bert import flags
    from mlperf_bert.harness import package
    r, w = os.pipe()
    os.write(w, b"--workers=3\n")
    os.close(w)
    try:
        fv = flags.FlagValues()
        flags.DEFINE_integer("workers", 1, "", flag_values=fv)
        flags.parse(fv, ["verify", "--flagfile=/proc/self/fd/%d" % r])
        assert fv.workers == 3
    finally:
        os.close(r)
    (tmp_path / package.MADE_BY).mkdir()
    with pytest.raises(UserError, match=r"Is a directory: '%s'" % re.escape(str(tmp_path / package.MADE_BY))):
        package.read_made_by(str(tmp_path))


def test_a_make_dataset_folder_its_run_did_not_finish_fails(tmp_path):
    """A hostile sweep: a make-dataset killed before its manifest (written last) left a folder of its
    settings and some outputs, each passing its own CRCs: `verify` said "every file checked matches",
    exit 0, also of a folder with no output at all. The folder is a MISMATCH naming the rerun."""
    d = tmp_path / "tf"
    d.mkdir()
    (d / checksums.SETTINGS_NAME).write_text("{}")
    why = "MISMATCH %s (make-dataset's folder, with its %s but no %s, which it writes when it is done: a run that " \
          "did not finish, or is running; rerun the same make-dataset command to finish it)" % (
              d, checksums.SETTINGS_NAME, checksums.MANIFEST_NAME)
    ok, lines = run_verify([str(d)])
    assert not ok and why in lines
    # its settings record is not an output of unknown checksum beside that line (a review)
    assert not any(checksums.SETTINGS_NAME in line for line in lines if line != why), lines
    write_records(str(d / "part-00000-of-00002"), [b"one", b"two"])
    ok, lines = run_verify([str(d)])
    assert not ok and why in lines and "OK %s/part-00000-of-00002 (no published checksum; its own: the CRCs of its 2 " \
        "records)" % d in lines
    checksums.write_manifest(str(d / checksums.MANIFEST_NAME), [
        ("part-00000-of-00002", os.path.getsize(d / "part-00000-of-00002"), 2, md5_of(d / "part-00000-of-00002"))])
    ok, lines = run_verify([str(d)])
    assert ok and why not in lines


def test_a_manifests_file_that_is_a_link_out_of_its_folder_is_not_read(tmp_path):
    """A hostile sweep: a file a manifest names that is a symbolic link out of the manifest's folder
    (to ../outside, to /etc/passwd) was read and said OK or a size mismatch: the folder does not hold
    it. It is a MISMATCH naming where it leads, and is not read. With --manifest=FILE DIR (another
    site's list), DIR's own files are checked, links into a shared store among them (a review)."""
    d, outside = tmp_path / "tf", tmp_path / "outside"
    d.mkdir()
    outside.mkdir()
    for n in ("part-00000-of-00002", "part-00001-of-00002"):
        write_records(str(d / n), [n.encode()])
    checksums.write_manifest(str(d / checksums.MANIFEST_NAME), [
        (n, os.path.getsize(d / n), 1, md5_of(d / n)) for n in ("part-00000-of-00002", "part-00001-of-00002")])
    os.rename(d / "part-00001-of-00002", outside / "real")
    os.symlink("../outside/real", d / "part-00001-of-00002")
    link = d / "part-00001-of-00002"
    for args in ([str(d)], [str(d / checksums.MANIFEST_NAME)]):
        ok, lines = run_verify(args)
        assert not ok and "MISMATCH %s (a symbolic link to %s, outside the folder its manifest lists: the folder does " \
            "not hold that file, and it was not read; put the file itself there, or verify the folder it is in)" % (
                link if args[0] == str(d) else os.path.abspath(link), outside / "real") in lines, lines
        assert sum(l.startswith("OK ") for l in lines) == 1, lines
    ok, lines = run_verify([str(d)], manifest=checksums.read_manifest(str(d / checksums.MANIFEST_NAME)))
    assert ok and "OK %s (--manifest, md5+size)" % link in lines, lines
    # a link within the folder is the folder's own file
    os.rename(outside / "real", d / "real")
    os.remove(link)
    os.symlink("real", link)
    ok, lines = run_verify([str(d)])
    assert ok, lines


def test_a_file_name_with_a_line_break_cannot_print_a_verdict_line_of_its_own(tmp_path):
    """A hostile sweep: a file named "evil\\nOK vocab.txt (...)" printed an OK line that no file earned
    (a script reading the lines counts it). Control characters of a name are printed escaped."""
    d = tmp_path / "n"
    d.mkdir()
    (d / "evil\nOK vocab.txt (md5+size)").write_text("hello")
    ok, lines = run_verify([str(d)])
    assert lines == ["UNKNOWN %s/evil\\x0aOK vocab.txt (md5+size) (no published checksum; not checked)" % d]
    # (a review) and the eval articles' line, of a folder so named; a line separator too
    e = tmp_path / "evdir\nOK fake\u2028x"
    e.mkdir()
    (e / "eval.txt").write_text("abc\n\n")
    (e / "eval.md5").write_text("0" * 32 + "\n")
    ok, lines = run_verify([str(e)])
    assert not ok and all("\n" not in l and "\u2028" not in l for l in lines), lines
    assert any(l.startswith("MISMATCH %s/evdir\\x0aOK fake\\u2028x/eval.txt article 0: md5 " % tmp_path)
               for l in lines), lines


@pytest.mark.parametrize("kind,damage,says", [
    ("plain", "dataset", "{path} has no dataset input_ids: it is not a to-hdf5 file; convert the TFRecords with to-hdf5"),
    ("plain", "checksum", "{path}: dataset input_ids carries no checksum, where its other datasets do: the file is "
                          "damaged, convert it again with to-hdf5"),
    ("packed", "dataset", "{path}: packed file without dataset input_ids: it is damaged, pack it again"),
    ("packed", "attribute", "{path}: packed file without its attributes (\"Unable to synchronously open attribute "
                            "(can't locate attribute: 'num_rows')\"): it is damaged, pack it again")])
def test_a_damaged_name_in_an_hdf5_file_is_a_mismatch_not_ok(made, tmp_path, kind, damage, says):
    """A hostile sweep: a byte flipped in a dataset's or an attribute's name (the file's metadata)
    leaves every dataset's CRC-32C whole: verify said OK (or UNKNOWN, 'carries none of its own', for
    one dataset's checksum attribute), exit 0, for a file the trainer then refused."""
    import h5py
    from mlperf_bert.dataset import hdf5
    path = str(tmp_path / os.path.basename(made[kind]))
    shutil.copy(made[kind], path)
    with h5py.File(path, "r+") as h:
        if damage == "dataset":
            h.move("input_ids", "inpwt_ids")
        elif damage == "checksum":
            del h["input_ids"].attrs[hdf5.CHECKSUM_ATTR]
        else:
            h.attrs["num_rowr"] = h.attrs["num_rows"]
            del h.attrs["num_rows"]
    ok, lines = run_verify([path])
    assert not ok and lines == ["MISMATCH %s (no published checksum; its own: %s)" % (path, says.format(path=path))], \
        lines


def test_a_run_record_nested_past_the_json_parser_is_one_line(tmp_path):
    """A hostile sweep: a ``.pack.json`` (or ``.text_pipeline.json``) of JSON nested past the parser's
    depth was a RecursionError traceback in verify, pack, text-pipeline and the trainer's file check."""
    (tmp_path / ".pack.json").write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(UserError, match=r"^cannot read %s \(JSON nested too deeply" % re.escape(
            str(tmp_path / ".pack.json"))):
        checksums.verify([str(tmp_path)], out=lambda line: None)
