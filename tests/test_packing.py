"""pack: every sequence kept exactly once, rows within max_seq_length and K, deterministic,
parallel = serial, one-line errors; the packed loader's order, sharding and resume."""
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from mlperf_bert.dataset import hdf5, packing, tfrecord
from mlperf_bert.dataset.example import decode_pretraining_batch
from mlperf_bert.errors import UserError
from mlperf_bert.trainer.packed_loader import PackedBatches

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pack(*args):
    return subprocess.run([sys.executable, "-m", "mlperf_bert", "pack", "--noprogress"] + list(args), cwd=ROOT,
                          capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT))


def sequence_keys(arrays):
    """Each sequence as bytes of its real tokens, segments, predictions and NSP label (a multiset)."""
    n = packing.sequence_lengths(arrays["input_mask"])
    keys = []
    for i, length in enumerate(n):
        w = np.asarray(arrays["masked_lm_weights"][i], np.float32)
        keys.append(b"|".join([
            np.asarray(arrays["input_ids"][i][:length], np.int64).tobytes(),
            np.asarray(arrays["segment_ids"][i][:length], np.int64).tobytes(),
            np.where(w != 0, arrays["masked_lm_positions"][i], 0).astype(np.int64).tobytes(),
            np.where(w != 0, arrays["masked_lm_ids"][i], 0).astype(np.int64).tobytes(), w.tobytes(),
            np.asarray(arrays["next_sentence_labels"][i], np.int64).reshape(-1).tobytes()]))
    return sorted(keys)


@pytest.fixture(scope="module")
def packed_s512(golden_s512, tmp_path_factory):
    d = tmp_path_factory.mktemp("packed")
    r = pack("--input=" + golden_s512, "--output_dir=%s" % d)
    assert r.returncode == 0, r.stderr
    return str(d / (os.path.basename(golden_s512) + ".packed.hdf5")), r.stdout


def test_pack_keeps_every_sequence_once_within_the_row_limits(golden_s512, packed_s512):
    out, stdout = packed_s512
    original = decode_pretraining_batch(list(tfrecord.read_records(golden_s512)), 512, 76)
    rows = packing.read_packed(out)
    back = packing.unpack_arrays(rows, 512)
    assert sequence_keys(back) == sequence_keys(original)  # the same multiset of 7,343 sequences
    assert len(back["input_ids"]) == 7343
    k = rows["next_sentence_labels"].shape[1]
    assert k == 3 and rows["masked_lm_positions"].shape[1] == 3 * 76
    counts = (rows["next_sentence_labels"] >= 0).sum(1)
    assert counts.min() >= 1 and counts.max() <= 3
    assert (rows["input_mask"] > 0).sum(1).max() <= 512
    attrs = packing.read_attrs(out)
    assert attrs["num_sequences"] == 7343 and attrs["num_rows"] == len(counts)
    # at least first-fit decreasing's rate on this data (5,741 rows); the command reports it
    assert attrs["num_rows"] <= 5741 and attrs["packing_rate"] >= 1.279
    assert "%.4f sequences per row" % attrs["packing_rate"] in stdout
    # rows are in a seeded random order, not sorted by how full they are
    fill = (rows["input_mask"] > 0).sum(1)
    assert not (np.all(np.diff(fill) <= 0) or np.all(np.diff(fill) >= 0))


def test_pack_groups_exact_on_a_histogram():
    lengths = [512, 300, 200, 100, 100, 60, 12, 511, 1]
    groups = packing.pack_groups(lengths, 512, 3)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in g) <= 512 and len(g) <= 3 for g in groups)
    assert len(groups) == 4  # 512 | 511+1 | 300+200+12 | 100+100+60
    assert packing.pack_groups(lengths, 512, 1) == [[i] for i in (0, 7, 1, 2, 3, 4, 5, 6, 8)]


def test_pack_is_deterministic_and_parallel_equals_serial(golden_s512, packed_s512, tmp_path):
    recs = list(tfrecord.read_records(golden_s512))
    parts = [str(tmp_path / "a.tfrecord"), str(tmp_path / "b.tfrecord")]
    tfrecord.write_records(parts[0], recs[:3000])
    tfrecord.write_records(parts[1], recs[3000:])
    for name, workers in (("serial", 1), ("parallel", 2)):
        r = pack("--input=" + ",".join(parts), "--output_dir=" + str(tmp_path / name), "--num_workers=%d" % workers)
        assert r.returncode == 0, r.stderr
    for p in parts:
        a, b = (packing.read_packed(str(tmp_path / d / (os.path.basename(p) + ".packed.hdf5")))
                for d in ("serial", "parallel"))
        assert all(np.array_equal(a[k], b[k]) for k in a)
    again = str(tmp_path / "again")
    assert pack("--input=" + golden_s512, "--output_dir=" + again).returncode == 0
    a, b = packing.read_packed(packed_s512[0]), packing.read_packed(os.path.join(again, os.path.basename(
        packed_s512[0])))
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not [n for n in os.listdir(tmp_path / "serial") if ".tmp" in n]


@pytest.mark.parametrize("args,message", [
    (["--input=/nonexistent/x.tfrecord"], "/nonexistent/x.tfrecord"),
    (["--max_seq_length=128"], "record 0"),
    (["--max_sequences_per_pack=0"], "--max_sequences_per_pack=0 must be 1..16"),
])
def test_pack_errors_are_one_line(golden_s512, tmp_path, args, message):
    argv = ["--input=" + golden_s512, "--output_dir=" + str(tmp_path / "o")]
    argv = [a for a in argv if not any(a.split("=")[0] == b.split("=")[0] for b in args)] + args
    r = pack(*argv)
    assert r.returncode == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not os.path.exists(tmp_path / "o") or os.listdir(tmp_path / "o") == []


@pytest.fixture(scope="module")
def small(golden_dir, tmp_path_factory):
    """Two small seq-128 TFRecord files (300 and 200 of the reference's golden records)."""
    d = tmp_path_factory.mktemp("small")
    recs = list(tfrecord.read_records(os.path.join(golden_dir, "part-00000.s128.tfrecord")))
    paths = [str(d / "part-00000"), str(d / "part-00001")]
    tfrecord.write_records(paths[0], recs[:300])
    tfrecord.write_records(paths[1], recs[300:500])
    return paths


S128 = ["--max_seq_length=128", "--max_predictions_per_seq=20", "--noprogress", "--num_workers=1"]


def pack_here(*args):
    """The pack command in this process (its UserErrors are the one-line errors run_main prints)."""
    return packing.main(["pack"] + S128 + list(args))


def test_one_input_into_a_directory_not_yet_made(small, tmp_path, capsys):
    """Issue 27: --input='tfrecords/part-*' --output=packed with one shard and no packed/ wrote a
    FILE named packed, and the README's next step ('packed/*.packed.hdf5') matched nothing; and
    issue 23: packing into a folder not yet made was a traceback."""
    import glob
    out = tmp_path / "new" / "packed"
    assert pack_here("--input=%s" % small[0].replace("part-00000", "part-0000[0]"), "--output_dir=%s" % out) == 0
    assert glob.glob(str(out / "*.packed.hdf5")) == [str(out / "part-00000.packed.hdf5")]
    assert packing.read_attrs(str(out / "part-00000.packed.hdf5"))["num_sequences"] == 300
    assert "packed 300 sequences" in capsys.readouterr().out
    with pytest.raises(UserError, match=r"^--output is gone: .* give --output_dir=packed$"):
        pack_here("--input=" + small[0], "--output=packed")
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="--output_dir=.*file is a file: give a directory"):
        pack_here("--input=" + small[0], "--output_dir=%s" % (tmp_path / "file"))


def test_an_output_name_holding_another_kind_of_file_is_not_replaced(small, tmp_path):
    """A hostile sweep: --output_dir=notes with notes/part-00000.packed.hdf5 a text file (or a link to
    a TFRecord) was replaced by packed rows, exit 0 (to-hdf5 refuses this). An HDF5 file there, a
    former pack's output, is packed again."""
    out = tmp_path / "out"
    out.mkdir()
    target = out / "part-00000.packed.hdf5"
    for make in (lambda: target.write_text("my notes\n"), lambda: os.symlink(small[1], str(target))):
        make()
        before = target.read_bytes()
        with pytest.raises(UserError) as e:
            pack_here("--input=" + small[0], "--output_dir=%s" % out)
        assert str(e.value) == ("%s exists and is not an HDF5 file: refusing to overwrite it (give "
                                "another --output_dir, or remove it)" % target)
        assert target.read_bytes() == before and os.listdir(out) == [target.name]
        target.unlink()
    target.write_bytes(b"")  # empty (a touch): nothing to lose
    assert pack_here("--input=" + small[0], "--output_dir=%s" % out) == 0
    assert pack_here("--input=" + small[0], "--output_dir=%s" % out) == 0  # over its own output: a rerun
    assert packing.read_attrs(str(target))["num_sequences"] == 300


def test_an_input_whose_name_is_not_utf8_is_packed(small, tmp_path):
    """A TFRecord named in Latin-1 (b'caf\\xe9') was a UnicodeEncodeError traceback (its name seeds the
    row order and is stored in the file); a UTF-8 name keeps its row order (the same seed bytes)."""
    src = os.path.join(os.fsencode(str(tmp_path)), b"caf\xe9")
    shutil.copy(small[1], os.fsdecode(src))
    out = tmp_path / "out"
    assert pack_here("--input=%s" % os.fsdecode(src), "--output_dir=%s" % out) == 0
    path = os.fsdecode(os.path.join(os.fsencode(str(out)), b"caf\xe9.packed.hdf5"))
    assert packing.read_attrs(path)["num_sequences"] == 200
    with hdf5.open_file(path) as h:
        assert h.attrs["source_file"] == "caf\\xe9"
    assert packing.zlib_crc("part-00000") == 0x9F45AFDC  # (the seed of every UTF-8 name unchanged)


def test_an_input_given_twice_or_two_inputs_of_one_name_are_refused(small, tmp_path, capsys):
    """Issue 23: a/shard,b/shard wrote one output and lost the other's sequences (exit 0); X,X
    reported twice the sequences it wrote."""
    other = tmp_path / "b"
    other.mkdir()
    shutil.copy(small[1], other / "part-00000")  # the same name as small[0], other records
    os.symlink(small[0], str(tmp_path / "link"))
    out = tmp_path / "out"
    for inputs, message in (([small[0], str(other / "part-00000")], "have one name, so both would be packed into "
                                                                    "part-00000.packed.hdf5"),
                            ([small[0], small[0]], "names .*part-00000 twice"),
                            ([small[0], str(tmp_path / "link")], "names one file twice")):
        with pytest.raises(UserError, match=message):
            pack_here("--input=" + ",".join(inputs), "--output_dir=%s" % out)
        assert not out.exists() or os.listdir(out) == []
    # distinct inputs: the count reported is what the files hold
    assert pack_here("--input=" + ",".join(small), "--output_dir=%s" % out) == 0
    held = sum(packing.read_attrs(str(f))["num_sequences"] for f in out.glob("*.packed.hdf5"))
    assert held == 500 and "packed 500 sequences" in capsys.readouterr().out


def test_a_second_pack_into_one_directory_is_refused(small, tmp_path):
    """Issue 23: two runs into one directory both exited 0 with a mix of K=1 and K=3 files."""
    from mlperf_bert import locking
    out = str(tmp_path / "out")
    with locking.lock_dir(out, "--output_dir"):  # as a pack running there holds it
        with pytest.raises(UserError, match="--output_dir %s is in use by another run \\(pid %d " % (out, os.getpid())):
            pack_here("--input=" + small[0], "--output_dir=" + out)
    assert os.listdir(out) == []
    assert pack_here("--input=" + small[0], "--output_dir=" + out) == 0  # released: the run goes on
    assert sorted(os.listdir(out)) == [packing.RECORD_NAME, "part-00000.packed.hdf5"]


@pytest.mark.parametrize("flag,message", [
    ("--max_seq_length=-5", "--max_seq_length=-5 must be at least 1"),
    ("--max_predictions_per_seq=0", "--max_predictions_per_seq=0 must be at least 1"),
    ("--seed=-1", "--seed=-1 must be at least 0"),
    ("--max_sequences_per_pack=17", "--max_sequences_per_pack=17 must be 1..16"),
    ("--max_sequences_per_pack=100000000", "--max_sequences_per_pack=100000000 must be 1..16"),
    ("--seed=99999999999999999999", r"--seed=99999999999999999999 must be below 2\*\*63"),  # issue 33: h5py's TypeError
    # a differential sweep: a length no record can have was the decoder's MemoryError
    ("--max_seq_length=1099511627776", r"--max_seq_length=1099511627776 is too large: it must be at most 2147483647"),
    ("--max_predictions_per_seq=1099511627776", "--max_predictions_per_seq=1099511627776 is too large for "
                                                "--max_seq_length=128"),
])
def test_bad_numbers_are_one_line_errors(small, tmp_path, flag, message):
    """Issue 23: tracebacks before (a negative size, a negative seed, a 3.6 GiB allocation)."""
    with pytest.raises(UserError, match=message) as e:
        pack_here("--input=" + small[0], "--output_dir=%s" % (tmp_path / "o"), flag)
    assert "\n" not in str(e.value)
    assert not (tmp_path / "o").exists()


def test_a_bad_record_is_refused_naming_its_file_and_its_index_there(tiny_record, tmp_path):
    """A hostile review: input_ids 2**32 + 5 was packed as token 5 (exit 0), and an int64
    masked_lm_weights in record 5 was 'record 5: ...' without the file: one line naming both."""
    src, out = str(tmp_path / "part-00000"), tmp_path / "o"
    for bad, why in ((tiny_record(input_ids=[2**32 + 5] + [5] * 7), "input_ids holds 4294967301, outside int32"),
                     (tiny_record(masked_lm_weights=("int64", [1, 1])),
                      "masked_lm_weights holds int64 values, not float")):
        tfrecord.write_records(src, [tiny_record()] * 5 + [bad, tiny_record()])
        with pytest.raises(UserError) as e:
            packing.main(["pack", "--max_seq_length=8", "--max_predictions_per_seq=2", "--noprogress",
                          "--num_workers=1", "--input=" + src, "--output_dir=%s" % out])
        assert str(e.value).startswith("%s: record 5: feature %s: " % (src, why)), str(e.value)
        assert not out.exists() or os.listdir(out) == []


def test_an_hdf5_input_is_named_as_such(small, tmp_path):
    """Issue 23: an HDF5 file given as --input was 'record 0 has a corrupt length ... regenerate or
    re-download it', a fault of the file it is not."""
    h5 = str(tmp_path / "x.hdf5")
    hdf5.tfrecords_to_hdf5([small[1]], h5, 128, 20, progress=False)
    with pytest.raises(UserError, match=r"x\.hdf5 is an HDF5 file, not TFRecords: pack reads the TFRecords"):
        pack_here("--input=" + h5, "--output_dir=%s" % (tmp_path / "o"))
    with pytest.raises(UserError, match=r"x\.hdf5 is an HDF5 file, not TFRecords: to-hdf5 reads"):
        hdf5.main(["to-hdf5", "--input=" + h5, "--output=%s" % (tmp_path / "y.hdf5"), "--max_seq_length=128",
                   "--max_predictions_per_seq=20"])


def rows_of(batches):
    return [tuple(r) for b in batches for r in b["input_ids"].numpy()]


@pytest.fixture(scope="module")
def packed_small(small, tmp_path_factory):
    """The 300 seq-128 sequences of small[0], packed (a few hundred rows: the loader tests stay cheap)."""
    d = tmp_path_factory.mktemp("packed_small")
    assert pack_here("--input=" + small[0], "--output_dir=%s" % d) == 0
    return str(d / "part-00000.packed.hdf5")


def test_packed_loader_ranks_resume_and_sequence_counts(packed_small):
    f = [packed_small]
    one = list(PackedBatches(f, 8, shuffle=True, seed=4, repeat=False))
    assert sum(int(b["global_sequences"]) for b in one) == 300
    for b in one:
        assert int(b["global_sequences"]) == int((b["next_sentence_labels"] >= 0).sum())
    two = [list(PackedBatches(f, 8, rank=r, world_size=2, shuffle=True, seed=4, repeat=False)) for r in range(2)]
    paired = [row for b0, b1 in zip(*two) for row in rows_of([b0]) + rows_of([b1])]
    assert rows_of(one) == paired + rows_of(two[0][len(two[1]):])  # a short last batch may be rank 0's alone
    assert all(int(b0["global_sequences"]) == int(b1["global_sequences"]) for b0, b1 in zip(*two))
    resumed = list(PackedBatches(f, 8, shuffle=True, seed=4, repeat=False, start_batch=5))
    assert rows_of(resumed) == rows_of(one[5:])
    # epochs repeat in another order; workers hand out batches in order
    it = iter(PackedBatches(f, 8, shuffle=True, seed=4))
    epoch2 = [next(it) for _ in range(len(one) + 3)][len(one):]
    assert rows_of(epoch2) != rows_of(one[:3])
    loader = torch.utils.data.DataLoader(PackedBatches(f, 8, shuffle=True, seed=4, repeat=False), batch_size=None,
                                         num_workers=2)
    assert rows_of(loader) == rows_of(one)
    assert packing.packing_rate(f) == pytest.approx(300 / len(rows_of(one)))


def test_packed_files_more_than_the_process_may_open_are_read(tiny_record, tmp_path, few_open_files):
    """A hostile sweep: the packed loader opened every file at once, so more files than the open-file
    limit (RLIMIT_NOFILE) ended the run: '... is not an HDF5 file: give a file that to-hdf5 or pack
    made'. It keeps loader.OpenFiles' share of the limit open."""
    src = str(tmp_path / "part")
    tfrecord.write_records(src, [tiny_record(input_ids=[2, 5 + i, 6, 3, 0, 0, 0, 0]) for i in range(3)])
    assert packing.main(["pack", "--max_seq_length=8", "--max_predictions_per_seq=2", "--noprogress",
                         "--num_workers=1", "--input=" + src, "--output_dir=%s" % tmp_path]) == 0
    one = rows_of(PackedBatches([src + ".packed.hdf5"], 1, shuffle=False, repeat=False))
    with few_open_files() as room:
        files = [str(tmp_path / ("part-%03d.packed.hdf5" % i)) for i in range(room + 8)]
        for f in files:
            shutil.copy(src + ".packed.hdf5", f)
        rows = rows_of(PackedBatches(files, 4, shuffle=False, repeat=False))
    assert rows == one * len(files)


def test_packed_loader_keeps_every_prediction_in_fewer_slots(packed_s512):
    """The loader cuts the K*P = 228 prediction slots to the file's max_predictions_per_row (78
    here): the MLM head then computes 78 slots a row, and no real prediction is dropped."""
    f = packed_s512[0]
    rows = packing.read_packed(f)
    width = packing.read_attrs(f)["max_predictions_per_row"]
    real = (rows["masked_lm_weights"] != 0).sum(1)
    assert width == real.max() and width < 3 * 76
    by_row = {tuple(r): i for i, r in enumerate(rows["input_ids"])}
    for b in PackedBatches([f], 64, shuffle=True, seed=1, repeat=False):  # 90 batches, the last one short
        assert b["masked_lm_positions"].shape == (64, width) or len(b["input_ids"]) < 64
        for j, ids in enumerate(b["input_ids"].numpy()):
            i = by_row[tuple(ids)]
            keep = rows["masked_lm_weights"][i] != 0
            n = int(keep.sum())
            for name in packing.PREDICTION_FEATURES:
                got = b[name][j].numpy()
                assert (got[:n] == rows[name][i][keep]).all()  # the real ones, in their order
                assert (got[n:] == 0).all()


def _edited_copy(src, dst, edit):
    import h5py
    shutil.copyfile(src, dst)
    with h5py.File(dst, "r+") as h:
        edit(h)
    return dst


@pytest.mark.parametrize("attr,factor,message", [
    ("num_sequences", 3, "attribute num_sequences is 900, but its next_sentence_labels hold 300 sequences"),
    ("max_sequences_per_pack", 2, "attribute max_sequences_per_pack is 6, but its datasets' shapes say 3"),
    ("num_rows", 2, "attribute num_rows is {twice}, but its datasets' shapes say {rows}")])
def test_packed_attributes_that_disagree_with_the_data_are_one_line(packed_small, tmp_path, attr, factor, message):
    """A hostile review: num_sequences x3 changed the logged global_batch_size and the eval frequency
    (the packing rate comes from it) silently, even with --check_data=full; a max_sequences_per_pack
    other than the rows' width was accepted. Checked against the data where the file is checked."""
    from mlperf_bert.trainer import loader, packed_loader

    def edit(h):
        h.attrs[attr] = h.attrs[attr] * factor
    path = _edited_copy(packed_small, str(tmp_path / "part-00000.packed.hdf5"), edit)
    rows = packing.read_attrs(packed_small)["num_rows"]
    want = "%s: %s: the file is damaged, pack it again (python -m mlperf_bert pack)" % (
        path, message.format(twice=2 * rows, rows=rows))
    with pytest.raises(UserError) as e:
        packed_loader.check_files([packed_small, path], 128, 20)
    assert str(e.value) == want
    if attr != "num_sequences":  # the shapes: wherever the file is opened
        with pytest.raises(UserError) as e:
            loader.check_records([path], full=True)
        assert str(e.value) == want


def test_a_token_id_past_the_vocab_names_the_packed_file_and_row_that_hold_it(packed_small, tmp_path):
    """A hostile review: the error named the batch's first file and the batch's largest id, not the
    file and row holding a bad one."""
    def edit(h):
        del h[hdf5.ROW_CHECKSUMS]
        ids = h["input_ids"][:]
        ids[3, 1], ids[4, 1] = 40000, 50000
        h["input_ids"][:] = ids
    first = _edited_copy(packed_small, str(tmp_path / "a.packed.hdf5"), lambda h: None)
    bad = _edited_copy(packed_small, str(tmp_path / "b.packed.hdf5"), edit)
    with pytest.raises(UserError) as e:
        list(PackedBatches([first, bad], 4096, shuffle=False, repeat=False, vocab_size=30522))
    assert str(e.value) == ("%s: row 3 has token id 40000 but the model's vocab_size is 30522: use the "
                            "bert_config.json that matches the vocab the data was made with" % bad)


def test_a_refused_input_leaves_nothing_this_run_made(small, tiny_record, golden_dir, tmp_path):
    """An empty input, a text file, records of another --max_seq_length and a record damaged deep in
    the second input were refused after the lock had made --output_dir with its parents, left empty
    (and, for the damaged record, beside the first input's finished .packed.hdf5): a folder that
    looks like a started output. What one record a file tells is now checked before anything is
    made; a refusal found later removes what this run made, and only that."""
    empty, text, damaged = (str(tmp_path / n) for n in ("empty", "notes.txt", "part-00002"))
    open(empty, "wb").close()
    with open(text, "w") as f:
        f.write("not records\n")
    data = open(small[1], "rb").read()
    with open(damaged, "wb") as f:
        f.write(data[:len(data) // 2])  # record 0 whole, a later one cut short
    out = tmp_path / "new" / "packed"
    for inputs, flags, why in (([small[0], empty], [], "%s holds no records: check --input" % empty),
                               ([text], [], "%s is not a TFRecord or HDF5 file" % text),
                               ([small[0]], ["--max_seq_length=512"], "%s: record 0: feature input_mask has 128 "
                                                                      "values, expected 512" % small[0])):
        with pytest.raises(UserError) as e:
            pack_here("--input=" + ",".join(inputs), "--output_dir=%s" % out, *flags)
        assert str(e.value).startswith(why)
        assert not (tmp_path / "new").exists(), why
    # found by a worker, after the first input was packed: the command as a user runs it
    r = pack("--input=%s,%s" % (small[0], damaged), "--output_dir=%s" % out, "--max_seq_length=128",
             "--max_predictions_per_seq=20", "--num_workers=2")
    assert r.returncode == 2 and r.stderr.startswith("error: %s: record " % damaged) and "truncated" in r.stderr
    assert r.stderr.count("\n") == 1, r.stderr
    assert not (tmp_path / "new").exists()
    # what an earlier run made, and the folder it made, are not this run's: kept
    assert pack_here("--input=" + small[1], "--output_dir=%s" % out) == 0
    with pytest.raises(UserError, match="part-00002: record .* is truncated"):
        pack_here("--input=%s,%s" % (small[0], damaged), "--output_dir=%s" % out)
    assert sorted(os.listdir(out)) == [packing.RECORD_NAME, "part-00001.packed.hdf5"]
    assert packing.unfinished_run(str(out)) is None  # its record as the earlier run left it: finished


# The pack command, killed (SIGKILL: no handler runs) as it starts on its second input, the first packed.
KILLED_AT_THE_SECOND_INPUT = """
import os, signal, sys
from mlperf_bert.dataset import packing
real, done = packing.pack_file, []


def pack_file(*args):
    if done:
        os.kill(os.getpid(), signal.SIGKILL)
    done.append(real(*args))
    return done[-1]


packing.pack_file = pack_file
packing.main(sys.argv)
"""


def test_the_packed_files_of_a_killed_pack_are_refused_until_a_rerun_finishes_it(small, tmp_path):
    """A known gap: pack killed midway left some packed files, each complete: `verify` said every file
    matched, and the trainer given 'packed/*.packed.hdf5' trained on the part without a word. Its
    record (.pack.json, as text-pipeline's) now says the run did not finish: the trainer's start and
    verify refuse the folder in one line, naming it and the fix, until the same command is rerun.
    Packed files without a record (an older version's, or copied alone) still train."""
    from mlperf_bert.dataset import checksums
    from mlperf_bert.trainer import packed_loader
    out = tmp_path / "packed"
    argv = ["--input=" + ",".join(small), "--output_dir=%s" % out] + S128
    proc = subprocess.run([sys.executable, "-c", KILLED_AT_THE_SECOND_INPUT] + argv, cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode == -9, proc.stderr
    files = sorted(str(f) for f in out.glob("*.packed.hdf5"))
    assert files == [str(out / "part-00000.packed.hdf5")]
    why = ("folder %s holds an unfinished pack run: 1 of the 2 files its record .pack.json lists are missing "
           "(part-00001.packed.hdf5): rerun the same pack command to finish it" % out)
    with pytest.raises(UserError) as e:
        packed_loader.check_files(files, 128, 20)
    assert str(e.value) == "--input_file: " + why
    for given in ([str(out)], files):  # the folder, or its files
        lines = []
        assert not checksums.verify(given, out=lines.append)
        assert lines[-2:] == ["MISMATCH %s (%s)" % (out, why.split(" ", 2)[2]),
                              "verify: 1 OK, 1 MISMATCH, 0 MISSING, 0 UNKNOWN: FAILED"]
    assert pack_here(*argv) == 0  # the same command, rerun: finished
    files = sorted(str(f) for f in out.glob("*.packed.hdf5"))
    assert len(files) == 2 and len(packed_loader.check_files(files, 128, 20)) == 2
    assert checksums.verify([str(out)], out=lambda line: None)
    # every file there, but the record of a run that did not finish (killed after its last rename)
    record = out / ".pack.json"
    record.write_text(record.read_text().replace('"finished": true', '"finished": false'))
    with pytest.raises(UserError, match=r"^--input_file: folder .* holds an unfinished pack run: its record "
                                        r"\.pack\.json says its last run did not finish .*: rerun the same pack "
                                        r"command to finish it$"):
        packed_loader.check_files(files, 128, 20)
    os.remove(str(record))  # no record: an older version's packed files
    assert len(packed_loader.check_files(files, 128, 20)) == 2
    assert checksums.verify([str(out)], out=lambda line: None)


# The pack command (its workers spawned) in this process, with the stop a terminal sends (to the
# whole process group) at a chosen point: just after the pool has started its first worker by fork
# and exec, before it has written the worker what to run.
STOP_AS_A_WORKER_STARTS = """
import os, runpy, signal, sys
from multiprocessing import util
stop, sent, spawn = getattr(signal, sys.argv.pop(1)), [], util.spawnv_passfds


def spawn_then_stop(path, args, passfds):
    pid = spawn(path, args, passfds)
    if "--multiprocessing-fork" in args and not sent:  # a pool worker (not the resource tracker)
        sent.append(pid)
        os.killpg(0, stop)
    return pid


util.spawnv_passfds = spawn_then_stop
sys.argv[0] = "mlperf_bert"
runpy.run_module("mlperf_bert", run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize("sig,status,line", [
    ("SIGINT", 130, "error: interrupted\n"),
    ("SIGTERM", 143, "error: terminated (SIGTERM); finished outputs are kept, rerun the same command to go on\n")])
def test_a_stop_while_the_pool_starts_a_worker_is_the_one_line(small, tmp_path, sig, status, line):
    """Ctrl-C while pack's pool started its spawned workers printed, after the one line, the
    traceback of a worker that read the end of its pipe ('EOFError: Ran out of input'): the stop cut
    the pool's constructor between a worker's start and what it is sent. SIGTERM there also left the
    pool's semaphores to the resource tracker ('6 leaked semaphore objects'). The stop now waits
    for the pool to be whole, then ends it as any later stop does."""
    out = tmp_path / "new" / "packed"
    proc = subprocess.run([sys.executable, "-c", STOP_AS_A_WORKER_STARTS, sig, "pack", "--input=" + ",".join(small),
                           "--output_dir=%s" % out, "--noprogress", "--num_workers=2"] + S128[:2], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, start_new_session=True)
    assert (proc.returncode, proc.stderr, proc.stdout) == (status, line, "")
    assert not (tmp_path / "new").exists()  # (made by this run, and empty)


PROBE_WORKER_IMPORTS = """
import os, signal, sys
if "--multiprocessing-fork" in sys.argv:  # a spawned pool worker
    class Probe:
        def find_spec(self, name, path=None, target=None):
            if name == "numpy":  # its first job's imports begin: what would a SIGTERM do now?
                sys.meta_path.remove(self)
                handler = signal.getsignal(signal.SIGTERM)
                # written whole or not at all: the other worker, ended by the pool's SIGTERM while it
                # wrote, left an empty file (a busy machine's run failed on it)
                seen = os.path.join(os.environ["PROBE_DIR"], str(os.getpid()))
                with open(seen + ".tmp", "w") as f:
                    f.write("default" if handler == signal.SIG_DFL else repr(handler))
                os.rename(seen + ".tmp", seen)
                os.killpg(0, signal.SIGINT)  # and Ctrl-C comes
            return None
    sys.meta_path.insert(0, Probe())
"""


def test_a_spawned_worker_imports_its_job_where_a_sigterm_ends_it_at_once(small, tmp_path):
    """Ctrl-C while a spawned worker imported numpy for its first job: the pool's SIGTERM ran the
    worker's handler (a SystemExit, for the atomic writer's sake) inside numpy's import, which made
    it an ImportError and printed a page of traceback after the command's one line. The worker now
    imports what its job needs (WORKER_IMPORTS) while a SIGTERM ends it at once, its default action.
    A probe (sitecustomize.py, in the workers only) records the worker's SIGTERM handler as numpy's
    import begins, then sends Ctrl-C to the process group."""
    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / "sitecustomize.py").write_text(PROBE_WORKER_IMPORTS)
    seen = tmp_path / "seen"
    seen.mkdir()
    out = tmp_path / "packed"
    proc = subprocess.run([sys.executable, "-m", "mlperf_bert", "pack", "--input=" + ",".join(small),
                           "--output_dir=%s" % out, "--noprogress", "--num_workers=2"] + S128[:2], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, start_new_session=True,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(probe), ROOT]), PROBE_DIR=str(seen)))
    handlers = [(seen / n).read_text() for n in os.listdir(seen) if not n.endswith(".tmp")]
    assert handlers and set(handlers) == {"default"}, handlers
    assert (proc.returncode, proc.stderr, proc.stdout) == (130, "error: interrupted\n", "")
    assert not out.exists()


def test_a_pack_job_imports_nothing_its_worker_did_not_import_first(small, tmp_path):
    """WORKER_IMPORTS is all a job imports: a module imported later (numpy.random, first used by the
    row order) comes under the worker's SystemExit handler, where a SIGTERM made numpy's import an
    ImportError traceback."""
    code = ("import importlib, sys\n"
            "from mlperf_bert.dataset import packing\n"
            "for m in packing.WORKER_IMPORTS: importlib.import_module(m)\n"
            "before = set(sys.modules)\n"
            "packing.pack_file(sys.argv[1], sys.argv[2], 128, 20, 3, 12345)\n"
            "print(sorted(set(sys.modules) - before))\n")
    proc = subprocess.run([sys.executable, "-c", code, small[1], str(tmp_path / "x.packed.hdf5")], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout) == (0, "[]\n"), proc.stderr


@pytest.mark.parametrize("change,message", [
    ("masked_lm_positions", "row 5 has a masked_lm_positions outside its 128 tokens"),
    ("nsp_positions", "row 9 has a nsp_positions outside its 128 tokens"),
    ("masked_lm_weights", "row 7 has 60 predictions, more than the {slots} its packed file(s) allow "
                          "(max_predictions_per_row)")])
def test_a_row_that_does_not_fit_is_named_by_its_file_and_row(packed_small, tmp_path, change, message):
    """A hostile sweep: a position past the row or more predictions than the file's
    max_predictions_per_row (in a file without row checksums, or one written so) was 'a row has ...'
    naming every file of the batch ('b.packed.hdf5,a.packed.hdf5: ...'), not the file and row."""
    def edit(h):
        del h[hdf5.ROW_CHECKSUMS]
        values = h[change][:]
        if change == "masked_lm_weights":
            values[7, :] = 1
        elif change == "nsp_positions":
            values[9, 0] = 300
        else:
            values[5, np.flatnonzero(h["masked_lm_weights"][5] != 0)[0]] = 200
        h[change][:] = values
    first = _edited_copy(packed_small, str(tmp_path / "a.packed.hdf5"), lambda h: None)
    bad = _edited_copy(packed_small, str(tmp_path / "b.packed.hdf5"), edit)
    slots = packing.read_attrs(packed_small)["max_predictions_per_row"]
    with pytest.raises(UserError) as e:
        list(PackedBatches([first, bad], 4096, shuffle=False, repeat=False, vocab_size=30522))
    assert str(e.value) == "%s: %s: the file is damaged, pack it again" % (bad, message.format(slots=slots))


def test_packed_files_of_other_pack_sizes_are_named_two_not_all(small, packed_small, tmp_path):
    """A hostile sweep: files of K=3 and K=1 were refused in a line listing every file of
    --input_file (a glob of thousands) without saying which differ or how."""
    from mlperf_bert.trainer import packed_loader
    assert pack_here("--input=" + small[1], "--output_dir=%s" % tmp_path, "--max_sequences_per_pack=1") == 0
    other = str(tmp_path / "part-00001.packed.hdf5")
    same = _edited_copy(packed_small, str(tmp_path / "c.packed.hdf5"), lambda h: None)
    with pytest.raises(UserError) as e:
        packed_loader.check_files([packed_small, same, other], 128, 20)
    assert str(e.value) == ("packed files %s and %s differ in max_sequences_per_pack (3 and 1): pack them alike"
                            % (packed_small, other))


def test_a_disk_that_fills_as_hdf5_closes_the_file_is_one_line_not_a_crash(small, tmp_path):
    """A hostile sweep: a real tmpfs with room for the rows' bytes (pack's up-front check passes) but
    not for the whole file, whose last writes HDF5 makes as it closes it (the data it buffered, its
    metadata): an h5py traceback (RuntimeError "Can't decrement id ref count ... errno = 28"), then
    "Segmentation fault" (exit 139). Now the atomic writer's one line, exit 2, and nothing left (the
    --output_dir it made goes too)."""
    import textwrap
    import h5py
    from test_fileio import _real_tmpfs_available
    if not _real_tmpfs_available():
        pytest.skip("cannot mount a tmpfs in a user namespace here (unshare -rm)")
    assert pack_here("--input=" + small[0], "--output_dir=%s" % (tmp_path / "ref")) == 0
    with h5py.File(tmp_path / "ref" / "part-00000.packed.hdf5", "r") as h:
        data_end = max(h[n].id.get_offset() + h[n].id.get_storage_size() for n in h)
        needed = h.attrs["num_rows"] * packing.row_bytes(128, 20, 3)
    pages = -(-needed // 4096)  # tmpfs counts pages: room for what pack checks for, not for the data's end
    assert pages * 4096 < data_end
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    script = textwrap.dedent("""\
        mount -t tmpfs -o size={size} none {m}
        {py} -m mlperf_bert pack --noprogress --num_workers=1 --input={i} --output_dir={m}/packed \
            --max_seq_length=128 --max_predictions_per_seq=20 2>{t}/err; echo $? >{t}/rc
        ls -A {m} >{t}/left
        """).format(size=(pages + 1) * 4096, m=mnt, t=tmp_path, py=sys.executable, i=small[0])  # + the lock's page
    subprocess.run(["unshare", "-rm", "sh", "-c", script], cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT),
                   check=True, timeout=120)
    err = (tmp_path / "err").read_text()
    assert err.startswith("error: cannot write %s/packed/part-00000.packed.hdf5: no space left on device (needs "
                          % mnt) and err.count("\n") == 1, err
    assert (tmp_path / "rc").read_text().strip() == "2"
    assert (tmp_path / "left").read_text() == ""


def test_a_killed_writes_temporary_or_a_named_pipe_the_glob_matches_is_refused(small, tmp_path):
    """A hostile sweep: pack --input='tfrecords/part-*' packed a killed make-dataset's
    part-00001.tmp-4242 (its records, cut at a record's end, pass their CRCs) into
    part-00001.tmp-4242.packed.hdf5, exit 0; and a named pipe no process writes to made it wait for
    ever. Both are refused before anything is made."""
    from test_tfrecord import writerless_fifo
    d = tmp_path / "tfrecords"
    d.mkdir()
    shutil.copy(small[0], str(d / "part-00000"))
    shutil.copy(small[1], str(d / "part-00001.tmp-4242"))
    out = tmp_path / "packed"
    with pytest.raises(UserError) as e:
        pack_here("--input=%s" % (d / "part-*"), "--output_dir=%s" % out)
    assert str(e.value).startswith("--input file %s is the temporary of an unfinished write of part-00001 (process "
                                   "4242: still running, or killed): " % (d / "part-00001.tmp-4242"))
    os.remove(str(d / "part-00001.tmp-4242"))
    with writerless_fifo(str(d / "part-00001")) as fifo, pytest.raises(UserError) as e:
        pack_here("--input=%s" % (d / "part-*"), "--output_dir=%s" % out)
    assert str(e.value) == "--input file %s is a named pipe (FIFO), not a regular file: give the path of a regular " \
                           "file" % fifo
    assert not out.exists()



def test_a_packed_run_ended_by_max_samples_is_not_warned_of_micro_steps_it_never_trains(tiny_record, tmp_path,
                                                                                       capsys):
    """A hostile sweep: the start's warning took a packed run's --max_samples_termination (sequences)
    in rows: a run of 2 sequences a row, ended by its samples at micro-step 2 of 3 (its first update),
    was told that its last micro-step "is trained but never applied". It now counts the update in
    sequences, as the run and its progress bar do."""
    import json
    from mlperf_bert.trainer import training
    src = str(tmp_path / "part")
    tfrecord.write_records(src, [tiny_record(input_ids=[2, 5 + i, 6, 3, 0, 0, 0, 0]) for i in range(32)])
    assert packing.main(["pack", "--max_seq_length=8", "--max_predictions_per_seq=2", "--noprogress",
                         "--num_workers=1", "--input=" + src, "--output_dir=%s" % tmp_path]) == 0
    assert packing.packing_rate([src + ".packed.hdf5"]) == 2
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"vocab_size": 30522, "hidden_size": 16, "num_hidden_layers": 1,
                                  "num_attention_heads": 2, "intermediate_size": 32, "hidden_act": "gelu",
                                  "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
                                  "max_position_embeddings": 8, "type_vocab_size": 2, "initializer_range": 0.02}))
    # 2 micro-steps of 2 rows an update: 8 sequences, reached at micro-step 2 (4 rows: 2 updates' rows)
    argv = ["run_pretraining.py", "--do_train", "--input_file=%s.packed.hdf5" % src, "--output_dir=%s" % (tmp_path / "o"),
            "--bert_config_file=%s" % config, "--train_batch_size=2", "--steps_per_update=2", "--num_train_steps=3",
            "--num_warmup_steps=0", "--max_samples_termination=5", "--save_checkpoints_steps=0", "--seed=1",
            "--optimizer=lamb",
            "--max_seq_length=8", "--max_predictions_per_seq=2", "--noprogress", "--num_workers=0"]
    assert training.main(argv) == 0
    out, err = capsys.readouterr()
    assert "trained 2 steps" in out and "never applied" not in err, err


def test_a_copy_of_an_input_under_another_name_is_refused(small, tmp_path):
    """A review: to-hdf5 and the trainer refuse a shard given beside a copy of it under another name
    (the same records, another file), but pack packed both, so that the packed set trained on its
    sequences twice an epoch. Refused by the same digests of the records' CRCs, before anything is
    made; a file of other records packs."""
    copy = tmp_path / "copy" / "part-00009"
    copy.parent.mkdir()
    shutil.copy(small[0], str(copy))
    out = tmp_path / "out"
    r = pack(*S128, "--input=%s,%s" % (small[0], copy), "--output_dir=%s" % out)
    assert r.returncode == 2 and r.stderr.strip() == (
        "error: --input names two files of the same records: %s and %s (a copy of it?): give each file once"
        % (small[0], copy)), r.stderr
    assert not out.exists()
    assert pack_here("--input=%s,%s" % (small[1], copy), "--output_dir=%s" % out) == 0
