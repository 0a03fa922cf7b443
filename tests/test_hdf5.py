import os
import re

import h5py
import numpy as np
import pytest

from mlperf_bert.dataset import hdf5
from mlperf_bert.errors import UserError
from mlperf_bert.dataset.example import PRETRAINING_FEATURES, decode_pretraining_example, encode_example
from mlperf_bert.dataset.tfrecord import read_records, write_records


@pytest.fixture(scope="module")
def golden_tfrecord(golden_dir):
    return os.path.join(golden_dir, "part-00000.s128.tfrecord")


@pytest.fixture(scope="module")
def converted(golden_tfrecord, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("h5") / "part.hdf5")
    assert hdf5.main(["to-hdf5", "--input=%s" % golden_tfrecord, "--output=%s" % out,
                      "--max_seq_length=128", "--max_predictions_per_seq=20"]) == 0
    return out


def test_every_example_kept_in_order_with_equal_values(golden_tfrecord, converted):
    records = list(read_records(golden_tfrecord))
    got = hdf5.read_examples(converted)
    assert got["input_ids"].shape == (len(records), 128)
    for i, data in enumerate(records):
        want = decode_pretraining_example(data, 128, 20)
        for name, arr in want.items():
            assert got[name][i].dtype == arr.dtype and np.array_equal(got[name][i], arr), (i, name)


def test_one_compact_dataset_per_feature(converted, golden_tfrecord):
    with h5py.File(converted, "r") as h:
        assert sorted(h.keys()) == sorted([name for name, _, _ in PRETRAINING_FEATURES] + ["row_crc32c"])
        assert h["row_crc32c"].dtype == np.uint32 and h["row_crc32c"].shape == (4366,)
        assert h["input_ids"].dtype == np.uint16 and h["input_mask"].dtype == np.uint8
        assert h["segment_ids"].dtype == np.uint8 and h["next_sentence_labels"].shape == (4366,)
        assert h["masked_lm_weights"].dtype == np.float32 and h["masked_lm_positions"].shape == (4366, 20)
    # int64 features take 8 bytes per value in memory; stored, the file is well under half the TFRecord
    assert os.path.getsize(converted) < 0.9 * os.path.getsize(golden_tfrecord)


def test_iter_batches_covers_the_file_in_order(converted):
    full = hdf5.read_examples(converted)
    batches = list(hdf5.iter_batches(converted, 1000))
    assert [len(b["input_ids"]) for b in batches] == [1000, 1000, 1000, 1000, 366]
    for name in full:
        assert np.array_equal(np.concatenate([b[name] for b in batches]), full[name])
    assert len(list(hdf5.iter_batches(converted, 1000, drop_remainder=True))) == 4


def test_several_inputs_concatenate_in_order(golden_tfrecord, tmp_path):
    records = list(read_records(golden_tfrecord))
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    write_records(a, records[:10])
    write_records(b, records[10:25])
    out = str(tmp_path / "ab.hdf5")
    assert hdf5.tfrecords_to_hdf5([b, a], out, 128, 20, block=4, progress=False) == 25
    got = hdf5.read_examples(out)
    order = records[10:25] + records[:10]
    for i, data in enumerate(order):
        assert np.array_equal(got["input_ids"][i], decode_pretraining_example(data, 128, 20)["input_ids"])


def test_the_same_input_gives_the_same_bytes_whatever_path_named_it(golden_tfrecord, tmp_path, monkeypatch):
    """A hostile sweep: the input's path as typed was stored in the file, so a relative and an
    absolute path to one TFRecord gave two md5s (pack stores the name alone)."""
    import hashlib
    src = tmp_path / "in" / "part-00000"
    src.parent.mkdir()
    write_records(str(src), list(read_records(golden_tfrecord))[:20])
    monkeypatch.chdir(tmp_path)
    hdf5.tfrecords_to_hdf5(["in/part-00000"], "rel.hdf5", 128, 20, progress=False)
    hdf5.tfrecords_to_hdf5([str(src)], str(tmp_path / "abs.hdf5"), 128, 20, progress=False)
    md5s = {hashlib.md5((tmp_path / n).read_bytes()).hexdigest() for n in ("rel.hdf5", "abs.hdf5")}
    assert len(md5s) == 1
    with h5py.File(tmp_path / "rel.hdf5", "r") as h:
        assert list(h.attrs["source_files"]) == ["part-00000"]


def test_an_input_given_twice_is_refused_as_pack_refuses_it(golden_tfrecord, tmp_path):
    """A hostile sweep: --input='tf/part-*,tf/part-00000-of-00002' (or a path and a symbolic link to
    it) wrote the file's examples twice, exit 0."""
    tf = tmp_path / "tf"
    tf.mkdir()
    src = tf / "part-00000-of-00002"
    write_records(str(src), list(read_records(golden_tfrecord))[:5])
    os.symlink(str(src), str(tmp_path / "link"))
    out = tmp_path / "out.hdf5"
    for inputs, message in (("%s/part-*,%s" % (tf, src), "--input names %s twice: give each file once" % src),
                            ("%s,%s" % (src, tmp_path / "link"),
                             "--input names one file twice: %s and %s: give each file once" % (src, tmp_path / "link"))):
        with pytest.raises(UserError) as e:
            hdf5.main(["to-hdf5", "--input=" + inputs, "--output=%s" % out, "--max_seq_length=128",
                       "--max_predictions_per_seq=20"])
        assert str(e.value) == message
        assert not out.exists()


def test_a_copy_of_an_input_beside_it_is_refused(golden_tfrecord, tmp_path):
    """A hostile sweep: a shard copied to another folder and given beside its original (the same
    records, another file) was written twice, exit 0, where the same file named twice was refused."""
    src, copy = tmp_path / "part-00000", tmp_path / "copy" / "part-00000"
    copy.parent.mkdir()
    write_records(str(src), list(read_records(golden_tfrecord))[:5])
    copy.write_bytes(src.read_bytes())
    with pytest.raises(UserError) as e:
        hdf5.tfrecords_to_hdf5([str(src), str(copy)], str(tmp_path / "out.hdf5"), 128, 20, progress=False)
    assert str(e.value) == ("--input names two files of the same records: %s and %s (a copy of it?): give each "
                            "file once" % (src, copy))
    assert not (tmp_path / "out.hdf5").exists()


def test_to_hdf5s_copy_tags_are_the_trainer_scans_digests(golden_tfrecord, tmp_path, monkeypatch):
    """A review: to-hdf5 digested its inputs' record CRCs by a loop of its own beside the trainer's
    start scan's (loader.check_records), whose digests checkpoints keep. One implementation now
    (tfrecord.scan_digests): to-hdf5's tags are the trainer's digests, headers-only and full scan
    alike, and their value is the sha256 of the records' stored CRCs in order, cut to 16 hex digits,
    as earlier checkpoints hold it."""
    import hashlib
    from mlperf_bert.trainer import loader
    src = str(tmp_path / "part-00000")
    write_records(src, list(read_records(golden_tfrecord))[:50])
    seen = []

    def scan_digests(files):
        seen.append(real(files))
        return seen[-1]
    real = hdf5.scan_digests
    monkeypatch.setattr(hdf5, "scan_digests", scan_digests)
    assert hdf5.tfrecords_to_hdf5([src], str(tmp_path / "out.hdf5"), 128, 20, progress=False) == 50
    ((total, tags),) = seen
    assert total == 50
    assert tags == loader.check_records([src]) == loader.check_records([src], full=True)
    data, pos, crcs = open(src, "rb").read(), 0, hashlib.sha256()
    while pos < len(data):
        end = pos + 12 + int.from_bytes(data[pos:pos + 8], "little")
        crcs.update(data[end:end + 4])
        pos = end + 4
    assert tags == {src: (len(data), crcs.hexdigest()[:16])}


def test_two_empty_inputs_are_refused_as_empty_not_as_copies(tmp_path):
    """A review: two files of no records (a failed run's outputs) were "two files of the same records
    (a copy of it?)", where one alone is "holds no records"."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"")
    b.write_bytes(b"")
    with pytest.raises(UserError) as e:
        hdf5.tfrecords_to_hdf5([str(a), str(b)], str(tmp_path / "out.hdf5"), 128, 20, progress=False)
    assert str(e.value) == "%s holds no records: check --input" % a


def test_values_that_do_not_fit_are_refused(tmp_path):
    feats = {"input_ids": [70000] + [0] * 7, "input_mask": [1] * 8, "segment_ids": [0] * 8,
             "masked_lm_positions": [0, 0], "masked_lm_ids": [0, 0], "masked_lm_weights": [0.0, 0.0],
             "next_sentence_labels": [0]}
    src = str(tmp_path / "big")
    write_records(src, [encode_example([(n, k, feats[n]) for n, k, _ in PRETRAINING_FEATURES])])
    with pytest.raises(UserError, match="feature input_ids holds 70000, outside uint16"):
        hdf5.tfrecords_to_hdf5([src], str(tmp_path / "big.hdf5"), 8, 2, progress=False)
    assert not os.path.exists(tmp_path / "big.hdf5")
    with pytest.raises(UserError, match=re.escape("%s: record 0: feature input_ids has 8 values, expected 16"
                                                  % src)):
        hdf5.tfrecords_to_hdf5([src], str(tmp_path / "x.hdf5"), 16, 2, progress=False)


def test_a_value_past_the_storage_type_names_its_input_and_record_and_the_fix(tiny_record, tmp_path):
    """A hostile sweep: a token id past uint16 (a vocabulary of over 65,536 tokens) in record 5 of the
    second input was 'OUT.hdf5: records 3..6: input_ids holds 0..70000, outside uint16: this data cannot
    be stored compactly', naming the output (never written) and a block of its rows, and no fix; pack
    named the input but not the record. Both now name the input, the record and what to do."""
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    write_records(a, [tiny_record()] * 3)
    for name in ("input_ids", "masked_lm_ids"):
        bad = tiny_record(input_ids=[2, 70000, 6, 3, 0, 0, 0, 0]) if name == "input_ids" \
            else tiny_record(masked_lm_ids=[7, 70000])
        write_records(b, [tiny_record()] * 5 + [bad, tiny_record()])
        want = ("%s: record 5: feature %s holds 70000, outside uint16, the type to-hdf5 and pack store it as: train "
                "on the TFRecords themselves (the trainer reads them)" % (b, name))
        with pytest.raises(UserError) as e:
            hdf5.tfrecords_to_hdf5([a, b], str(tmp_path / "out.hdf5"), 8, 2, block=4, progress=False)
        assert str(e.value) == want
        from mlperf_bert.dataset import packing
        with pytest.raises(UserError) as e:
            packing.main(["pack", "--max_seq_length=8", "--max_predictions_per_seq=2", "--noprogress",
                          "--num_workers=1", "--input=" + b, "--output_dir=%s" % (tmp_path / "p")])
        assert str(e.value) == want
        assert sorted(os.listdir(tmp_path)) == ["a", "b"]


def test_a_bad_record_is_refused_naming_its_file_and_its_index_there(tiny_record, tmp_path):
    """A hostile review: input_ids 2**32 + 5 was stored as 5 and next_sentence_labels 2**32 as 0 (exit 0),
    and an int64 masked_lm_weights in record 5 of the second input was 'record 1: ...' (its index in
    the block, no file): each is one line naming the input and the record's index in it."""
    a, b, out = str(tmp_path / "a"), str(tmp_path / "b"), str(tmp_path / "out.hdf5")
    write_records(a, [tiny_record()] * 3)
    for bad, why in ((tiny_record(input_ids=[2**32 + 5] + [5] * 7), "input_ids holds 4294967301, outside int32"),
                     (tiny_record(next_sentence_labels=[2**32]),
                      "next_sentence_labels holds 4294967296, outside int32"),
                     (tiny_record(masked_lm_weights=("int64", [1, 1])),
                      "masked_lm_weights holds int64 values, not float")):
        write_records(b, [tiny_record()] * 5 + [bad, tiny_record()])
        with pytest.raises(UserError) as e:
            hdf5.tfrecords_to_hdf5([a, b], out, 8, 2, block=4, progress=False)
        assert str(e.value).startswith("%s: record 5: feature %s: " % (b, why)), str(e.value)
        assert not os.path.exists(out)


def test_names_past_the_kernels_limits_are_one_line_naming_the_file_not_h5pys_traceback(tiny_record, tmp_path):
    """A hostile sweep: to-hdf5 --output of 248 bytes (124 "é": NAME_MAX counts bytes), pack of an input of
    240 (its NAME.packed.hdf5.tmp-PID past 255), and pack into a folder of 4060 bytes (its temporary's path
    past 4095) each ended in h5py's traceback, "OSError: [Errno 36] Unable to synchronously create file
    (... name = '...tmp-1597' ...)", exit 1. One line naming the file and the length that fits; nothing
    is left."""
    from mlperf_bert.dataset import packing
    src = str(tmp_path / ("r" * 240))
    write_records(src, [tiny_record()] * 3)
    out = str(tmp_path / "h" / ("\u00e9" * 124))
    with pytest.raises(UserError) as e:
        hdf5.main(["to-hdf5", "--input=" + src, "--output=" + out, "--max_seq_length=8", "--max_predictions_per_seq=2"])
    assert str(e.value) == ("--output %s: its name is 248 bytes, too long for NAME.tmp-PID, the temporary it is "
                            "written under (a file name may have 255 bytes): give a name of at most 243 bytes" % out)
    pack = ["pack", "--max_seq_length=8", "--max_predictions_per_seq=2", "--noprogress", "--num_workers=1"]
    with pytest.raises(UserError) as e:
        packing.main(pack + ["--input=" + src, "--output_dir=%s" % (tmp_path / "p")])
    assert str(e.value) == ("--input file %s: its name is 240 bytes, too long for NAME.packed.hdf5.tmp-PID, the "
                            "temporary its output is written under (a file name may have 255 bytes): give a name of "
                            "at most 231 bytes" % src)
    short = str(tmp_path / ("r" * 40))
    os.rename(src, short)
    deep = str(tmp_path / "p") + "/" + "/".join(["d" * 200] * ((4060 - len(str(tmp_path / "p"))) // 201))
    deep += "/" + "d" * (4060 - len(deep) - 1)
    with pytest.raises(UserError) as e:
        packing.main(pack + ["--input=" + short, "--output_dir=" + deep])
    assert str(e.value).startswith("--input file %s: its path %s/%s is 4101 bytes, too long for NAME.packed.hdf5"
                                   ".tmp-PID" % (short, deep, "r" * 40)), str(e.value)
    assert os.listdir(tmp_path) == ["r" * 40]


def test_pack_of_an_input_in_a_deep_folder_is_checked_where_its_output_goes(tmp_path):
    """A hostile review: pack's check of an input's NAME.packed.hdf5.tmp-PID took the input's own path and
    folder, not --output_dir's: an input 4081 bytes deep was refused ("its path is 4081 bytes, too long"),
    its output's path short; the input's name, in --output_dir's path, is what is checked."""
    from mlperf_bert.dataset import packing
    deep = str(tmp_path / "in") + "/" + "/".join(["d" * 200] * ((4040 - len(str(tmp_path / "in"))) // 201))
    os.makedirs(deep)
    f = os.path.join(deep, "r" * (4081 - len(deep) - 1))
    out = str(tmp_path / "p")
    assert packing.output_paths([f], out) == [os.path.join(out, os.path.basename(f) + ".packed.hdf5")]
    long_out = out + "/" + "/".join(["d" * 200] * 20)
    with pytest.raises(UserError) as e:
        packing.output_paths([str(tmp_path / "r")], long_out)
    assert str(e.value).startswith("--input file %s: its path %s/r is " % (tmp_path / "r", long_out))


def test_trainer_batches_from_hdf5_equal_those_from_the_tfrecord(golden_tfrecord, converted):
    torch = pytest.importorskip("torch")
    from mlperf_bert.trainer.loader import PretrainingBatches
    for shuffle in (False, True):
        kw = dict(shuffle=shuffle, seed=3, repeat=False, max_batches=4)
        a = list(PretrainingBatches([golden_tfrecord], 128, 20, 64, **kw))
        b = list(PretrainingBatches([converted], 128, 20, 64, **kw))
        assert len(a) == len(b) == 4
        for x, y in zip(a, b):
            for name in x:
                assert x[name].dtype == y[name].dtype and torch.equal(x[name], y[name]), name


# The MLCommons PyTorch BERT reference's HDF5 of the golden s128 records: sha256 of its six datasets
# in this order, each as little-endian int64 (test below)
REFERENCE_HDF5 = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids",
                  "next_sentence_labels")
REFERENCE_HDF5_SHA256 = "6808ed6c0d05973b834be58b4ed1302da1050bdb774f2a60fe5f4156508e58d5"


def test_the_pytorch_references_hdf5_holds_a_to_hdf5_files_values(converted, tmp_path):
    """docs/dataset.md section 5. The digest is of the file made from the golden s128 records' text by
    mlcommons/training v1.0 (commit f294d135) ``language_model/pytorch/create_pretraining_data.py
    --input_file=part-00000-of-00004 (tests/data/golden/input) --vocab_file=tests/data/vocab.txt
    --do_lower_case=True --max_seq_length=128 --max_predictions_per_seq=20 --masked_lm_prob=0.15
    --random_seed=12345 --dupe_factor=2 --output_file=ref`` (NVIDIA's v5.0
    input_preprocessing/create_pretraining_data.py: the same values). It has no masked_lm_weights:
    ours are 1 exactly where the position is not 0, and the trainer refuses its file in one line."""
    import hashlib
    digest = hashlib.sha256()
    with h5py.File(converted, "r") as h:
        ref = {name: h[name][:].astype(np.int32 if "ids" in name or "positions" in name else np.int8)
               for name in REFERENCE_HDF5}
        assert np.array_equal(h["masked_lm_weights"][:] != 0, ref["masked_lm_positions"] != 0)
    for name in REFERENCE_HDF5:
        digest.update(np.ascontiguousarray(ref[name], "<i8").tobytes())
    assert len(ref["input_ids"]) == 4366 and digest.hexdigest() == REFERENCE_HDF5_SHA256
    path = str(tmp_path / "ref.hdf5")  # the reference's layout: int32 and int8, six datasets
    with h5py.File(path, "w") as h:
        for name in REFERENCE_HDF5:
            h[name] = ref[name]
    with pytest.raises(UserError) as e:  # (what the trainer's check_seq_length says too)
        hdf5.read_examples(path, 0, 8)
    assert str(e.value) == ("%s has no dataset masked_lm_weights: it is not a to-hdf5 file; convert the "
                            "TFRecords with to-hdf5" % path)

def test_output_that_is_the_input_is_refused(golden_tfrecord, tmp_path):
    """Issue 16.2: `--output` equal to `--input` (also through a symlink) replaced the TFRecord."""
    src = str(tmp_path / "part.tfrecord")
    with open(golden_tfrecord, "rb") as f:
        data = f.read()
    with open(src, "wb") as f:
        f.write(data)
    os.symlink(src, str(tmp_path / "link"))
    for out in (src, str(tmp_path / "link"), str(tmp_path / "." / "part.tfrecord")):
        with pytest.raises(UserError, match="--output .* is the input .*part.tfrecord: writing it would destroy"):
            hdf5.main(["to-hdf5", "--input=%s" % src, "--output=%s" % out, "--max_seq_length=128",
                       "--max_predictions_per_seq=20"])
    with open(src, "rb") as f:
        assert f.read() == data
    assert sorted(os.listdir(tmp_path)) == ["link", "part.tfrecord"]


def test_an_output_that_is_another_kind_of_file_is_not_replaced(golden_tfrecord, vocab_file, tmp_path):
    """A hostile sweep: `to-hdf5 --output=vocab.txt` (and the generator's --output_file=<a text
    shard>) replaced the file, exit 0. An existing file with bytes that is not what the command
    writes is refused in one line and kept; an HDF5 (or TFRecord) output is remade as before."""
    from mlperf_bert.dataset import pretraining_data
    vocab = tmp_path / "vocab.txt"
    vocab.write_bytes(open(vocab_file, "rb").read())
    shard = tmp_path / "part-00000-of-00001"
    shard.write_text("A sentence.\n\nAnother one.\n", encoding="utf-8")
    with pytest.raises(UserError) as e:
        hdf5.main(["to-hdf5", "--input=%s" % golden_tfrecord, "--output=%s" % vocab, "--max_seq_length=128",
                   "--max_predictions_per_seq=20"])
    assert str(e.value) == ("--output %s exists and is not an HDF5 file: refusing to overwrite it (choose another "
                            "file, or remove it)" % vocab)
    with pytest.raises(UserError) as e:
        pretraining_data.create_pretraining_data([str(shard)], [str(vocab)], vocab_file)
    assert str(e.value) == ("--output_file %s exists and is not a TFRecord file: refusing to overwrite it (choose "
                            "another file, or remove it)" % vocab)
    assert vocab.read_bytes() == open(vocab_file, "rb").read()
    out = tmp_path / "x.hdf5"
    for _ in range(2):  # its own kind is remade
        hdf5.main(["to-hdf5", "--input=%s" % golden_tfrecord, "--output=%s" % out, "--max_seq_length=128",
                   "--max_predictions_per_seq=20"])
        assert hdf5.is_hdf5_file(str(out))


# ---------------------------------------------------------------- checksums and misread files

def flip_byte(path, dataset, index=1000):
    """Flip one byte of ``dataset``'s data in the file (a bit rot HDF5 itself never notices)."""
    with h5py.File(path, "r") as h:
        offset = h[dataset].id.get_offset()
    with open(path, "r+b") as f:
        f.seek(offset + index)
        byte = f.read(1)
        f.seek(offset + index)
        f.write(bytes([byte[0] ^ 0x10]))


@pytest.fixture(scope="module")
def made(golden_tfrecord, tmp_path_factory):
    """A to-hdf5 file and a packed file of the first 500 golden records."""
    from mlperf_bert.dataset import packing
    from mlperf_bert.dataset.tfrecord import write_records
    d = tmp_path_factory.mktemp("made")
    src = str(d / "part-00000")
    write_records(src, list(read_records(golden_tfrecord))[:500])
    plain = str(d / "part.hdf5")
    hdf5.tfrecords_to_hdf5([src], plain, 128, 20, progress=False)
    assert packing.main(["pack", "--input=" + src, "--output_dir=%s" % d, "--max_seq_length=128",
                         "--max_predictions_per_seq=20"]) == 0
    return {"plain": plain, "packed": str(d / "part-00000.packed.hdf5"), "tfrecord": src}


@pytest.mark.parametrize("kind,dataset,fix", [("plain", "input_ids", "convert it again with to-hdf5"),
                                              ("plain", "masked_lm_weights", "convert it again with to-hdf5"),
                                              ("packed", "input_mask", "pack it again"),
                                              ("packed", "masked_lm_ids", "pack it again")])
def test_check_data_full_finds_a_flipped_byte(made, tmp_path, kind, dataset, fix):
    """Issue 23: flipped bytes in an HDF5 or packed file trained silently, even with --check_data=full."""
    from mlperf_bert.trainer import loader
    path = str(tmp_path / os.path.basename(made[kind]))
    with open(made[kind], "rb") as a, open(path, "wb") as b:
        b.write(a.read())
    loader.check_records([path], full=True)  # intact: passes
    flip_byte(path, dataset)
    loader.check_records([path], full=False)  # the shapes are whole: headers do not see it
    with pytest.raises(UserError) as e:
        loader.check_records([path], full=True)
    assert str(e.value) == ("%s: dataset %s does not match the checksum written when the file was made: the file "
                            "is damaged, %s" % (path, dataset, fix) + (" (python -m mlperf_bert pack)"
                                                                       if kind == "packed" else ""))


@pytest.mark.parametrize("kind", ["plain", "packed"])
def test_the_trainer_refuses_a_copy_of_an_hdf5_file_beside_it(made, tmp_path, kind):
    """A review of a sweep: two TFRecord files of the same records are refused by the start scan's
    digests, but an HDF5 or packed file copied to another folder and given beside it trained twice,
    exit 0. Their datasets' CRC-32Cs (to-hdf5's, pack's attributes) tell a copy."""
    from mlperf_bert.trainer import training
    from test_training import TINY, flags_for
    import json
    import shutil
    copy = tmp_path / "copy" / os.path.basename(made[kind])
    copy.parent.mkdir()
    shutil.copy(made[kind], str(copy))
    config = str(tmp_path / "config.json")
    with open(config, "w") as f:
        json.dump(TINY, f)
    out = str(tmp_path / "out")
    with pytest.raises(UserError) as e:
        training.main(flags_for({"config": config, "train": "%s,%s" % (made[kind], copy)}, out, max_seq_length=128,
                                max_predictions_per_seq=20, check_data="none"))
    assert str(e.value) == ("--input_file names two files of the same records: %s and %s (a copy of it?): give each "
                            "file once" % (made[kind], copy))
    assert not os.path.exists(out)


def test_the_trainer_refuses_a_flipped_packed_file_before_training(made, tmp_path):
    from mlperf_bert.trainer import training
    from test_training import TINY, flags_for
    import json
    path = str(tmp_path / "part-00000.packed.hdf5")
    with open(made["packed"], "rb") as a, open(path, "wb") as b:
        b.write(a.read())
    flip_byte(path, "input_ids")
    config = str(tmp_path / "config.json")
    with open(config, "w") as f:
        json.dump(TINY, f)
    files = {"config": config, "train": path}
    out = str(tmp_path / "out")
    with pytest.raises(UserError, match="part-00000.packed.hdf5: dataset input_ids does not match the checksum"):
        training.main(flags_for(files, out, max_seq_length=128, max_predictions_per_seq=20, check_data="full"))
    assert not os.path.exists(os.path.join(out, "mlperf.log"))
    # a hostile sweep: the eval set was not checked (read whole at the start, by its row checksums
    # alone: a file without them, damaged, was evaluated); nor was --do_eval's want of unpacked
    # records, found after the whole run (its end left unwritten)
    files["train"] = made["packed"]
    with pytest.raises(UserError, match="eval.hdf5: dataset input_ids does not match the checksum"):
        training.main(flags_for(files, out, max_seq_length=128, max_predictions_per_seq=20, check_data="full",
                                eval_input_file=_flipped_plain(made, tmp_path)))
    with pytest.raises(UserError) as e:
        training.main(flags_for(files, out, max_seq_length=128, max_predictions_per_seq=20, do_eval=True))
    assert str(e.value) == ("--do_eval without --eval_input_file evaluates the training files, as the reference does, "
                            "but --input_file holds packed rows (pack), which that eval does not read: give "
                            "--eval_input_file (eval_10k), or --nodo_eval")
    with pytest.raises(UserError) as e:  # (a review: alone, --eval_input_file is not what it evaluates: refused)
        training.main(flags_for(files, out, max_seq_length=128, max_predictions_per_seq=20, do_train=False,
                                do_eval=True, init_checkpoint=made["plain"]))
    assert str(e.value) == ("--do_eval alone evaluates --input_file, as the reference does, but it holds packed rows "
                            "(pack), which that eval does not read: give the unpacked TFRecords (or their to-hdf5 "
                            "file) as --input_file")
    assert not os.path.exists(os.path.join(out, "mlperf.log"))


def _flipped_plain(made, tmp_path):
    """An unpacked HDF5 eval set without row checksums (made before they were), one byte flipped."""
    path = str(tmp_path / "eval.hdf5")
    with open(made["plain"], "rb") as a, open(path, "wb") as b:
        b.write(a.read())
    with h5py.File(path, "r+") as h:
        del h[hdf5.ROW_CHECKSUMS]
    flip_byte(path, "input_ids")
    return path


def test_a_file_made_before_checksums_is_named_not_failed(made, tmp_path, capsys):
    from mlperf_bert.trainer import loader
    for kind, fix in (("plain", "convert it again with to-hdf5"), ("packed", "pack it again")):
        path = str(tmp_path / os.path.basename(made[kind]))
        with open(made[kind], "rb") as a, open(path, "wb") as b:
            b.write(a.read())
        with h5py.File(path, "r+") as h:
            for name in h:
                del h[name].attrs[hdf5.CHECKSUM_ATTR]
        loader.check_records([path], full=True)
        err = capsys.readouterr().err
        assert err == ("warning: %s has no checksums (made before they were written): --check_data=full cannot "
                       "check its contents; %s to add them\n" % (path, fix + (" (python -m mlperf_bert pack)"
                                                                               if kind == "packed" else "")))


def test_misread_hdf5_and_packed_files_name_the_right_tool(made, tmp_path):
    """Issue 23: a packed file as the eval set blamed --max_predictions_per_seq; a truncated packed
    file said 'convert it again with to-hdf5' (or, among packed files, that the input mixed kinds)."""
    from mlperf_bert.trainer import training
    from test_training import TINY, flags_for
    import json
    config = str(tmp_path / "config.json")
    with open(config, "w") as f:
        json.dump(TINY, f)
    cut = str(tmp_path / "cut.packed.hdf5")
    with open(made["packed"], "rb") as a, open(cut, "wb") as b:
        b.write(a.read()[:100000])
    cut_plain = str(tmp_path / "cut.hdf5")
    with open(made["plain"], "rb") as a, open(cut_plain, "wb") as b:
        b.write(a.read()[:100000])
    junk = str(tmp_path / "junk.hdf5")
    with open(junk, "w") as f:
        f.write("not HDF5\n")
    cases = [
        (dict(input_file=made["tfrecord"], eval_input_file=made["packed"]),
         re.escape("%s holds packed rows (made by pack), but this input takes unpacked records" % made["packed"])),
        (dict(input_file=cut), r"cannot read HDF5 file %s \(.*\): it is truncated or damaged: pack it again" % cut),
        (dict(input_file=made["packed"] + "," + cut), "cut.packed.hdf5 .*truncated or damaged: pack it again"),
        (dict(input_file=cut_plain), r"cut.hdf5 .*truncated or damaged: make it again with to-hdf5 \(or pack"),
        (dict(input_file=junk), "junk.hdf5 is not an HDF5 file: give a file that to-hdf5 or pack made"),
    ]
    for kw, message in cases:
        kw = dict(dict(max_seq_length=128, max_predictions_per_seq=20, num_train_steps=2, num_workers=0), **kw)
        with pytest.raises(UserError, match=message) as e:
            training.main(flags_for({"config": config, "train": None}, str(tmp_path / "out"), **kw))
        assert "\n" not in str(e.value)


def _copy(src, dst):
    with open(src, "rb") as a, open(dst, "wb") as b:
        b.write(a.read())
    return dst


@pytest.mark.parametrize("kind,dataset,index,what,fix", [
    ("plain", "input_ids", 1000, "record 3", "convert it again with to-hdf5"),  # 256 bytes a row
    ("plain", "masked_lm_weights", 1000, "record 12", "convert it again with to-hdf5"),  # 80 bytes a row
    ("packed", "input_mask", 1000, "row 7", "pack it again (python -m mlperf_bert pack)"),  # 128 bytes a row
    ("packed", "row_crc32c", 8, "row 2", "pack it again (python -m mlperf_bert pack)")])
def test_a_flipped_byte_is_caught_as_it_is_read(made, tmp_path, kind, dataset, index, what, fix):
    """Issue 33: damaged HDF5 and packed files trained under the default --check_data=headers (a
    TFRecord's CRCs are checked as records are read): each row is now checked as it is read."""
    from mlperf_bert.trainer import loader, packed_loader
    path = _copy(made[kind], str(tmp_path / os.path.basename(made[kind])))
    flip_byte(path, dataset, index)
    loader.check_records([path], full=False)  # the headers are whole

    def read_all():
        if kind == "packed":
            ds = packed_loader.PackedBatches([path], 8, repeat=False)
        else:
            ds = loader.PretrainingBatches([path], 128, 20, 8, repeat=False)
        return sum(len(b["input_ids"]) for b in ds)

    with pytest.raises(UserError) as e:
        read_all()
    assert str(e.value) == ("%s: %s does not match the checksum written when the file was made: the file is "
                            "damaged, %s" % (path, what, fix))
    flip_byte(path, dataset, index)  # flipped back: every row reads
    assert read_all() == (500 if kind == "plain" else packed_loader.packing.read_attrs(path)["num_rows"])


@pytest.mark.parametrize("kind,change,message", [
    ("plain", "short", "cannot read HDF5 file {path} (its datasets have 10 and 500 rows): it is truncated or damaged: "
                       "convert it again with to-hdf5"),
    ("packed", "short", "cannot read HDF5 file {path} (its datasets have 5 and {rows} rows): it is truncated or "
                        "damaged: pack it again (python -m mlperf_bert pack)"),
    # a sweep: a dataset another tool added, of other rows, was called a truncated file's
    ("plain", "extra", "{path}: dataset notes has 3 rows, the records' datasets 500: it is no dataset to-hdf5 writes: "
                       "remove it, or convert it again with to-hdf5"),
    ("plain", "position", "{path}: record 0 has a masked_lm_positions outside its 128 tokens: the file is damaged, "
                          "or not BERT pre-training data of this --max_seq_length: make it again"),
    ("packed", "position", "{path}: row 0 has a nsp_positions outside its 128 tokens: the file is damaged, pack it "
                           "again"),
    ("plain", "segment", "{path}: record 0 has segment_ids 5, where BERT pre-training data holds 0 or 1: the file is "
                         "damaged, or not made by create_pretraining_data: make it again"),
    ("packed", "segment", "{path}: row 0 has segment_ids 5, where packed BERT pre-training data holds 0 or 1: the "
                          "file is damaged, pack it again"),
    ("packed", "weight", "{path}: row 0 has masked_lm_weights nan, where packed BERT pre-training data holds 0 or 1: "
                         "the file is damaged, pack it again"),
    # a sweep: a row's input_mask numbering more sequences than its K slots trained silently
    ("packed", "mask", "{path}: row 0 has input_mask 9, where packed BERT pre-training data holds 0 to {k} (the "
                       "row's sequences, numbered): the file is damaged, pack it again"),
    # another: pack put a record's prediction in its padding on the row (or on the next sequence's tokens)
    ("packed", "padding", "{path}: row {row} has a masked position on its padding, where packed BERT pre-training data "
                          "predicts only its sequences' tokens: the file is damaged, or packed from damaged records: "
                          "pack it again")])
def test_rows_that_do_not_fit_are_one_line_not_an_index_error(made, tmp_path, kind, change, message):
    """A hostile sweep: a dataset cut shorter than the others ended the trainer in h5py's IndexError
    ("Fancy indexing out of range"); a position past the row, in a file without row checksums (made
    before they were written), in torch's "index out of range"; a segment id past 1 in an embedding's
    IndexError, a NaN weight trained NaN. Each is one line naming the file."""
    import h5py
    from mlperf_bert.trainer import loader, packed_loader
    path = _copy(made[kind], str(tmp_path / os.path.basename(made[kind])))
    row = 0
    with h5py.File(path, "r+") as h:
        rows, k = len(h["input_ids"]), h["next_sentence_labels"].shape[-1]
        if change == "padding":  # the first row with padding: its first prediction moved onto it
            del h[hdf5.ROW_CHECKSUMS]
            mask, positions = h["input_mask"][...], h["masked_lm_positions"][...]
            row = next(r for r in range(rows) if (mask[r] == 0).any() and h["masked_lm_weights"][r, 0] != 0)
            positions[row, 0] = np.flatnonzero(mask[row] == 0)[0]
            h["masked_lm_positions"][...] = positions
        elif change == "extra":
            h["notes"] = np.zeros(3)
        elif change == "short":
            name = "segment_ids" if kind == "plain" else "position_ids"
            data = h[name][:10 if kind == "plain" else 5]
            del h[name]
            h[name] = data
        else:
            del h[hdf5.ROW_CHECKSUMS]
            name, value = {"position": ("masked_lm_positions" if kind == "plain" else "nsp_positions", 5000),
                           "segment": ("segment_ids", 5), "weight": ("masked_lm_weights", float("nan")),
                           "mask": ("input_mask", 9)}[change]
            values = h[name][...]
            values[0, 0] = value
            h[name][...] = values
    with pytest.raises(UserError) as e:  # (a short dataset: as the file is opened)
        ds = packed_loader.PackedBatches([path], 8, repeat=False) if kind == "packed" else \
            loader.PretrainingBatches([path], 128, 20, 8, repeat=False, shuffle=False)
        sum(len(b["input_ids"]) for b in ds)
    assert str(e.value) == message.format(path=path, rows=rows, k=k, row=row)


def test_the_trainer_stops_on_a_damaged_packed_file_under_default_checks(made, tmp_path):
    """What users get: the default --check_data=headers, a loader worker, one line naming the file."""
    from mlperf_bert.trainer import training
    from test_training import TINY, flags_for
    import json
    path = _copy(made["packed"], str(tmp_path / "part-00000.packed.hdf5"))
    flip_byte(path, "input_ids", 3000)  # row 11
    config = str(tmp_path / "config.json")
    with open(config, "w") as f:
        json.dump(TINY, f)
    argv = flags_for({"config": config, "train": path}, str(tmp_path / "out"), max_seq_length=128,
                     max_predictions_per_seq=20, num_train_steps=4, shuffle=False)
    assert "--check_data" not in " ".join(argv)
    with pytest.raises(UserError) as e:
        training.main(argv)
    assert str(e.value) == ("%s: row 11 does not match the checksum written when the file was made: the file is "
                            "damaged, pack it again (python -m mlperf_bert pack)" % path)


def test_a_file_made_before_row_checksums_is_named(made, tmp_path, capsys):
    from mlperf_bert.trainer import loader
    for kind, fix in (("plain", "convert it again with to-hdf5"), ("packed", "pack it again")):
        path = _copy(made[kind], str(tmp_path / os.path.basename(made[kind])))
        with h5py.File(path, "r+") as h:
            del h[hdf5.ROW_CHECKSUMS]
        loader.check_records([path], full=False)
        assert capsys.readouterr().err == (
            "warning: %s has no row checksums (made before they were written): damage in it is not caught while "
            "training; %s to add them\n" % (path, fix + (" (python -m mlperf_bert pack)" if kind == "packed" else "")))


@pytest.mark.parametrize("lengths", [dict(), dict(max_seq_length=128, max_predictions_per_seq=20)])
def test_a_packed_file_without_its_attributes_is_called_damaged_not_blamed_on_the_flags(made, tmp_path, lengths):
    """Issue 33: a packed file whose attributes were stripped was read as an unpacked file, and the
    length check blamed --max_seq_length (or, with matching flags, said 'convert it again with to-hdf5')."""
    from mlperf_bert.trainer import training
    from test_training import TINY, flags_for
    import json
    path = _copy(made["packed"], str(tmp_path / "part-00000.packed.hdf5"))
    with h5py.File(path, "r+") as h:
        for name in list(h.attrs):
            del h.attrs[name]
    config = str(tmp_path / "config.json")
    with open(config, "w") as f:
        json.dump(TINY, f)
    with pytest.raises(UserError) as e:
        training.main(flags_for({"config": config, "train": path}, str(tmp_path / "out"), num_train_steps=2,
                                **lengths))
    assert str(e.value) == ("%s has packed rows (dataset position_ids, nsp_positions) but not the attributes pack "
                            "writes: it is damaged or not a packed file: pack it again (python -m mlperf_bert pack)"
                            % path)


def test_read_examples_checks_the_rows_it_reads(made, tmp_path):
    path = _copy(made["plain"], str(tmp_path / "part.hdf5"))
    flip_byte(path, "segment_ids", 1000)  # 128 bytes a row: record 7
    assert len(hdf5.read_examples(path, 0, 7)["input_ids"]) == 7  # the rows before it are whole
    with pytest.raises(UserError, match=re.escape("%s: record 7 does not match the checksum" % path)):
        hdf5.read_examples(path, 5, 20)


@pytest.mark.parametrize("how", ["external", "link"])
def test_a_dataset_kept_in_another_file_is_refused(made, tmp_path, how):
    """A hostile sweep: an HDF5 file can keep a dataset's bytes in another file, by a path written in
    it (external storage, a link to another file); h5py follows it out of the folder: verify read
    /elsewhere/outside.txt and said OK (CRC-32C and all), the trainer would train on it. to-hdf5 and
    pack write every dataset into the file: any other is one line naming the file and the dataset."""
    from mlperf_bert.trainer import loader
    path, outside = str(tmp_path / "data" / "part.hdf5"), str(tmp_path / "outside.bin")
    os.mkdir(os.path.dirname(path))
    with h5py.File(made["plain"], "r") as a, h5py.File(path, "w") as b:
        b.attrs.update(a.attrs)
        for name in a:
            data = a[name][:]
            if name != "input_ids":
                b.create_dataset(name, data=data)
            elif how == "external":
                data.tofile(outside)
                b.create_dataset(name, shape=data.shape, dtype=data.dtype, external=[(outside, 0, data.nbytes)])
            else:
                with h5py.File(outside, "w") as o:
                    o.create_dataset(name, data=data)
                b[name] = h5py.ExternalLink(outside, name)
            if name != "input_ids" or how == "external":  # (a link's would go to the other file)
                b[name].attrs.update(a[name].attrs)
    where = ("stored in other files (%s)" % outside if how == "external"
             else "a link to input_ids in %s" % outside)
    message = "%s: dataset input_ids is %s: give a file that to-hdf5 or pack made, which holds its own data" % (
        path, where)
    for read in (lambda: hdf5.verify_checksums(path), lambda: loader.check_records([path], full=True)):
        with pytest.raises(UserError) as e:
            read()
        assert str(e.value) == message


def test_lengths_below_one_and_an_input_of_no_record_are_one_line(golden_tfrecord, tmp_path):
    """A hostile sweep: to-hdf5 --max_seq_length=-1 was a 31-line h5py traceback; an empty TFRecord
    wrote an HDF5 of 0 examples, exit 0 (pack refuses it); make-dataset --dupe_factor=0 wrote outputs
    of no record and then blamed --num_eval_examples."""
    from mlperf_bert.dataset import make_dataset
    out = str(tmp_path / "x.hdf5")
    base = ["to-hdf5", "--input=%s" % golden_tfrecord, "--output=%s" % out]
    for flag in ("max_seq_length", "max_predictions_per_seq"):
        with pytest.raises(UserError) as e:
            hdf5.main(base + ["--%s=-1" % flag])
        assert str(e.value) == ("--%s=-1 must be at least 1: give the records' (make-dataset's default: 512 and 76)"
                                % flag)
    # lengths no record can have: "no space left" for petabytes (a differential sweep)
    with pytest.raises(UserError, match=r"^--max_seq_length=1099511627776 is too large: it must be at most 2147483647"):
        hdf5.main(base + ["--max_seq_length=%d" % 2**40])
    with pytest.raises(UserError, match=r"^--max_predictions_per_seq=1099511627776 is too large for --max_seq_length"):
        hdf5.main(base + ["--max_predictions_per_seq=%d" % 2**40])
    assert not os.path.exists(out)
    empty = tmp_path / "empty.tfrecord"
    empty.write_bytes(b"")
    with pytest.raises(UserError) as e:
        hdf5.main(["to-hdf5", "--input=%s" % empty, "--output=%s" % out])
    assert str(e.value) == "%s holds no records: check --input" % empty
    text = tmp_path / "text"
    text.mkdir()
    (text / "part-00000-of-00001").write_text("A sentence.\n\nAnother one.\n", encoding="utf-8")
    with pytest.raises(UserError) as e:
        make_dataset.main(["make-dataset", "--text_dir=%s" % text, "--output_dir=%s" % (tmp_path / "o"),
                           "--vocab_file=%s" % os.path.join(os.path.dirname(__file__), "data", "vocab.txt"),
                           "--dupe_factor=0"])
    assert str(e.value) == ("--dupe_factor=0 must be at least 1 (each document is read that many times, with other "
                            "masks; MLPerf uses 10)")
    assert not os.path.exists(out) and not (tmp_path / "o").exists()


def test_a_files_content_tag_tells_another_file_of_the_same_size(made, tmp_path):
    """A hostile sweep: a run's identity held its data files by name and size, and to-hdf5's size
    depends on the row count alone: another file of as many rows, swapped in, resumed. The tag
    (checksums.content_tag) is the file's recorded CRC-32Cs, or a sample of its bytes."""
    from mlperf_bert.dataset.checksums import content_tag
    from mlperf_bert.dataset.tfrecord import write_records
    src = str(tmp_path / "other")
    write_records(src, list(read_records(made["tfrecord"]))[::-1])  # the same records, another order
    other = str(tmp_path / "part.hdf5")
    hdf5.tfrecords_to_hdf5([src], other, 128, 20, progress=False)
    assert os.path.getsize(other) == os.path.getsize(made["plain"])
    tags = [content_tag(p) for p in (made["plain"], other, made["packed"], made["tfrecord"], src)]
    assert all(tags) and len(set(tags)) == len(tags), tags
    assert content_tag(made["plain"]) == tags[0]  # the same file, the same tag
    # a review: an HDF5 file that begins with a user block (its signature at byte 512) was read as a
    # TFRecord, and its first bytes taken for a length: the trainer's start ended in OSError
    ub = str(tmp_path / "ub.hdf5")
    with h5py.File(made["plain"], "r") as a, h5py.File(ub, "w", userblock_size=512) as b:
        for name in a:
            a.copy(name, b)
    with open(ub, "r+b") as f:
        f.write(b"Made by some tool\n")
    assert content_tag(ub) == tags[0]
    # a file without them (the reference's or NVIDIA's, or one of an older to-hdf5): it had none, and
    # a regenerated shard of its row count resumed a run (a sweep); its bytes sampled now
    plain = _copy(made["plain"], str(tmp_path / "plain.hdf5"))
    for path in (other, plain):
        with h5py.File(path, "r+") as h:
            for name in h:
                del h[name].attrs[hdf5.CHECKSUM_ATTR]
    assert os.path.getsize(other) == os.path.getsize(plain)
    bare = [content_tag(p) for p in (other, plain)]
    assert all(t.startswith("sampled:") for t in bare) and bare[0] != bare[1] and content_tag(plain) == bare[1], bare


def _rewrite(h, name, data):
    del h[name]
    h[name] = data


@pytest.mark.parametrize("kind,change,message", [
    ("plain", "ids1d", "dataset input_ids has shape (64000,), expected (rows, tokens)"),
    ("plain", "ids3d", "dataset input_ids has shape (500, 128, 1), expected (rows, tokens)"),
    # a vlen input_ids beside fixed-length datasets (NVIDIA's files, all vlen and without input_mask: below)
    ("plain", "vlen", "dataset input_ids has shape ({rows},), expected (rows, tokens)"),
    ("plain", "scalar", "dataset segment_ids is a scalar, expected (rows, tokens)"),
    ("plain", "group", "segment_ids is a group, expected a dataset (rows, tokens)"),
    ("plain", "bytes", "dataset next_sentence_labels holds |S1, expected integers"),
    ("plain", "float", "dataset input_ids holds float32, expected integers"),
    ("plain", "int_weights", "dataset masked_lm_weights holds uint8, expected floats"),
    ("plain", "narrow", "dataset input_mask has 64 tokens a row, input_ids has 128"),
    ("packed", "nsp1d", "dataset next_sentence_labels has shape ({rows},), expected (rows, sequences)"),
    ("packed", "scalar", "dataset nsp_positions is a scalar, expected (rows, sequences)")])
def test_a_dataset_of_another_shape_or_dtype_is_one_line_naming_it(made, tmp_path, kind, change, message):
    """A hostile review: only the datasets' presence and input_ids' width were checked. A 1-D input_ids
    was an IndexError (even under --check_data=none), a scalar dataset a TypeError, a bytes
    next_sentence_labels numpy's _UFuncNoLoopError, a packed 1-D next_sentence_labels an AxisError in
    the loader worker (also under --check_data=full), and float input_ids (id + 0.7) in a file
    without row checksums trained as the ids truncated. Each is one line, as the file is opened, by
    every reader."""
    from mlperf_bert.trainer import loader, packed_loader
    path = _copy(made[kind], str(tmp_path / os.path.basename(made[kind])))
    with h5py.File(path, "r+") as h:
        rows = len(h["input_ids"])
        if change in ("bytes", "float"):  # (no row checksums to catch the values)
            del h[hdf5.ROW_CHECKSUMS]
        if change == "ids1d":
            _rewrite(h, "input_ids", h["input_ids"][:].reshape(-1))
        elif change == "vlen":
            ids, lengths = h["input_ids"][:], h["input_mask"][:].sum(axis=1)
            rows_ids = np.empty(rows, object)
            rows_ids[:] = [ids[i, :lengths[i]].astype(np.int16) for i in range(rows)]
            del h["input_ids"]
            h.create_dataset("input_ids", data=rows_ids, dtype=h5py.vlen_dtype(np.int16))
        elif change == "ids3d":
            _rewrite(h, "input_ids", h["input_ids"][:].reshape(rows, 128, 1))
        elif change == "scalar":
            _rewrite(h, "segment_ids" if kind == "plain" else "nsp_positions", np.uint8(0))
        elif change == "group":
            del h["segment_ids"]
            h.create_group("segment_ids")
        elif change == "bytes":
            _rewrite(h, "next_sentence_labels", h["next_sentence_labels"][:].astype("S1"))
        elif change == "float":
            _rewrite(h, "input_ids", h["input_ids"][:].astype(np.float32) + 0.7)
        elif change == "int_weights":
            _rewrite(h, "masked_lm_weights", h["masked_lm_weights"][:].astype(np.uint8))
        elif change == "narrow":
            _rewrite(h, "input_mask", h["input_mask"][:, :64])
        else:
            _rewrite(h, "next_sentence_labels", h["next_sentence_labels"][:, 0])
    fix = "pack it again (python -m mlperf_bert pack)" if kind == "packed" else "convert it again with to-hdf5"
    want = "%s: %s: it is damaged, or not made by %s: %s" % (
        path, message.format(rows=rows), "pack" if kind == "packed" else "to-hdf5", fix)
    readers = [lambda: loader.check_records([path], full=True), lambda: loader.check_records([path], full=False)]
    if kind == "plain":
        readers += [lambda: loader.check_seq_length([path], 128, 20), lambda: hdf5.read_examples(path, 0, 8),
                    lambda: next(iter(loader.PretrainingBatches([path], 128, 20, 8)))]
    else:
        readers += [lambda: packed_loader.check_files([path], 128, 20),
                    lambda: next(iter(packed_loader.PackedBatches([path], 8)))]
    for read in readers:
        with pytest.raises(UserError) as e:
            read()
        assert str(e.value) == want


@pytest.mark.parametrize("kind", ["plain", "packed"])
def test_a_file_of_no_rows_among_others_is_refused_naming_it(made, tmp_path, kind):
    """A hostile review: an HDF5 file of 0 rows among several inputs was skipped silently (only a
    whole epoch of none was an error); to-hdf5 and pack refuse an input of no record."""
    from mlperf_bert.trainer import loader, packed_loader
    empty = _copy(made[kind], str(tmp_path / ("empty" + os.path.basename(made[kind]))))
    with h5py.File(empty, "r+") as h:
        for name in list(h):
            _rewrite(h, name, h[name][:0])
    files = [made[kind], empty]
    want = "%s holds no %s: check the paths, or make it again" % (empty, "rows" if kind == "packed" else "records")
    readers = [lambda: loader.check_records(files, full=True), lambda: loader.check_records(files)]
    if kind == "plain":
        readers += [lambda: loader.check_seq_length(files, 128, 20), lambda: loader.count_records(files),
                    lambda: list(loader.PretrainingBatches(files, 128, 20, 8, shuffle=False, repeat=False))]
    else:
        readers += [lambda: packed_loader.check_files(files, 128, 20),
                    lambda: list(packed_loader.PackedBatches(files, 8, shuffle=False, repeat=False))]
    for read in readers:
        with pytest.raises(UserError) as e:
            read()
        assert str(e.value) == want


def test_a_packed_file_replaced_while_the_run_reads_it_is_refused_naming_it(made, tmp_path):
    """A hostile sweep (two commands at once): a packed input that a second `pack` renamed over the
    run's --input_file once the run had started was read as it is now: its row counts the old file's,
    "cannot read HDF5 file ...: it is truncated or damaged: pack it again" (it is not), or its new rows
    trained on."""
    from mlperf_bert.trainer import packed_loader
    a, b = (_copy(made["packed"], str(tmp_path / name)) for name in ("a.packed.hdf5", "b.packed.hdf5"))
    it = iter(packed_loader.PackedBatches([a, b], 8, shuffle=False, repeat=False))
    next(it)  # a is being read; b's rows are not
    new = _copy(made["packed"], str(tmp_path / "new.packed.hdf5"))
    with h5py.File(new, "r+") as h:  # another pack's rows: one fewer
        for name in list(h):
            _rewrite(h, name, h[name][1:])
        h.attrs["num_rows"] -= 1
    os.replace(new, b)
    with pytest.raises(UserError) as e:
        list(it)
    assert str(e.value).startswith("%s was replaced or rewritten while this run read it (by another command" % b)


@pytest.mark.parametrize("kind", ["plain", "packed"])
def test_an_hdf5_input_with_only_new_times_is_read_on(made, tmp_path, monkeypatch, kind):
    """A hostile sweep: a to-hdf5 or packed input with the same bytes under a new mtime (rsync without
    -t, which renames a new copy over it; a touch) stopped a good run as "replaced or rewritten": only
    TFRecords' CRCs were compared. The datasets' CRC-32Cs its start's identity read are compared now
    (checksums.content_tag): the same are read on; a file of other rows, the same size, refused."""
    from mlperf_bert.dataset import checksums
    from mlperf_bert.trainer import loader, packed_loader
    a, b = (_copy(made[kind], str(tmp_path / ("%s.%s.hdf5" % (name, kind)))) for name in "ab")
    monkeypatch.setattr(checksums, "_TAGGED", {})
    for path in (a, b):  # what the run's identity reads at its start (RunConfig.identity)
        checksums.remembered_content_tag(path, os.path.getsize(path))
    batches = ((lambda: packed_loader.PackedBatches([a, b], 8, shuffle=False, repeat=False)) if kind == "packed" else
               (lambda: loader.PretrainingBatches([a, b], 128, 20, 8, shuffle=False, repeat=False)))
    want = list(batches())
    it = iter(batches())
    got = [next(it)]
    _copy(b, b + ".new")  # the same bytes, a new mtime, renamed over it
    os.utime(b + ".new", ns=(10 ** 18, 10 ** 18))
    os.replace(b + ".new", b)
    got += list(it)
    assert len(got) == len(want) and all(np.array_equal(x[k], y[k]) for x, y in zip(got, want) for k in x)
    it = iter(batches())  # other rows, the same size (a row's values swapped with the next's): refused
    next(it)
    with h5py.File(b, "r+") as h:
        for name in h:
            h[name][:2] = h[name][:2][::-1]
        sums = hdf5.Checksums()  # (their CRC-32Cs as another to-hdf5 of these rows writes them)
        for name in h:
            sums.update(name, h[name][()])
        sums.write(h)
    assert checksums.content_tag(b) != checksums.content_tag(a)
    os.utime(b, ns=(10 ** 18 + 1, 10 ** 18 + 1))
    with pytest.raises(UserError, match="was replaced or rewritten while this run read it"):
        list(it)


def test_an_input_whose_name_is_not_utf8_is_converted(golden_tfrecord, tmp_path):
    """A TFRecord named in Latin-1 (b'caf\\xe9') was a UnicodeEncodeError traceback: h5py cannot
    store the name as str. Its bytes that are not UTF-8 are written as \\xNN."""
    src = os.path.join(os.fsencode(str(tmp_path)), b"caf\xe9-part")
    write_records(os.fsdecode(src), list(read_records(golden_tfrecord))[:3])
    out = str(tmp_path / "out.hdf5")
    assert hdf5.main(["to-hdf5", "--input=%s" % os.fsdecode(src), "--output=%s" % out, "--max_seq_length=128",
                      "--max_predictions_per_seq=20"]) == 0
    with h5py.File(out, "r") as h:
        assert list(h.attrs["source_files"]) == ["caf\\xe9-part"]
    assert hdf5.num_examples(out) == 3


def test_a_refused_input_leaves_no_folder_this_run_made(golden_tfrecord, corrupt_deep, tmp_path):
    """An empty input, a text file, records of another --max_seq_length, a record cut short and one
    corrupt deep in a file were refused after to-hdf5's lock had made the output's folder (with its
    parents), left empty. What the headers and a file's first record tell is now checked before
    anything is made; a record found corrupt later removes the folders this run made, and only those."""
    empty, text, corrupt = (str(tmp_path / n) for n in ("empty", "notes.txt", "corrupt"))
    open(empty, "wb").close()
    with open(text, "w") as f:
        f.write("not records\n")
    corrupt_deep(corrupt)  # record 4's data, not its header: only the full read finds it
    out = tmp_path / "new" / "h5" / "x.hdf5"
    for inputs, lengths, why in (([golden_tfrecord, empty], (128, 20), "%s holds no records: check --input" % empty),
                                 ([text], (128, 20), "%s is not a TFRecord or HDF5 file" % text),
                                 ([golden_tfrecord], (512, 76), "%s: record 0: feature input_mask has 128 values, "
                                                                "expected 512" % golden_tfrecord),
                                 ([corrupt], (8, 2), "%s: record 4 is corrupt (data CRC mismatch)" % corrupt)):
        with pytest.raises(UserError) as e:
            hdf5.main(["to-hdf5", "--input=" + ",".join(inputs), "--output=%s" % out,
                       "--max_seq_length=%d" % lengths[0], "--max_predictions_per_seq=%d" % lengths[1]])
        assert str(e.value).startswith(why)
        assert not (tmp_path / "new").exists(), why
    out.parent.mkdir(parents=True)  # a folder the user had is kept, as it was
    with pytest.raises(UserError, match="record 4 is corrupt"):
        hdf5.main(["to-hdf5", "--input=" + corrupt, "--output=%s" % out, "--max_seq_length=8",
                   "--max_predictions_per_seq=2"])
    assert os.listdir(out.parent) == []


def test_a_disk_that_fills_as_hdf5_writes_its_metadata_is_one_line_not_a_crash(golden_tfrecord, converted, tmp_path):
    """A hostile sweep: a real tmpfs with room for the records' bytes (the up-front check passes)
    but not for HDF5's metadata, written as the file closes: a 20-line h5py traceback
    (RuntimeError "Can't decrement id ref count ... errno = 28"), then a SIGSEGV as the interpreter
    freed the file (exit -11). Now the atomic writer's one line, exit 2, nothing left."""
    import subprocess
    import sys
    import textwrap
    from test_fileio import _real_tmpfs_available
    if not _real_tmpfs_available():
        pytest.skip("cannot mount a tmpfs in a user namespace here (unshare -rm)")
    n = hdf5.num_examples(converted)
    per_record = sum(np.dtype(hdf5.STORAGE_DTYPES[f]).itemsize * {"next_sentence_labels": 1}.get(f, 128 if f in (
        "input_ids", "input_mask", "segment_ids") else 20) for f in hdf5.FEATURE_NAMES) + 4
    # the file's size to the page below: room for the records (what to-hdf5 checks for) and the
    # metadata written before them, not for the last of it, written at the close
    size = os.path.getsize(converted) // 4096 * 4096
    assert n * per_record < size < os.path.getsize(converted)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = textwrap.dedent("""\
        mount -t tmpfs -o size={size} none {m}
        {py} -m mlperf_bert to-hdf5 --input={g} --output={m}/x.hdf5 --max_seq_length=128 \
            --max_predictions_per_seq=20 2>{t}/err; echo $? >{t}/rc
        ls -A {m} >{t}/left
        """).format(size=size, m=mnt, t=tmp_path, py=sys.executable, g=golden_tfrecord)
    subprocess.run(["unshare", "-rm", "sh", "-c", script], cwd=root, env=dict(os.environ, PYTHONPATH=root),
                   check=True, timeout=120)
    err = (tmp_path / "err").read_text()
    assert "Traceback" not in err, err
    assert err.strip().splitlines()[-1].startswith(
        "error: cannot write %s/x.hdf5: no space left on device (needs " % mnt), err
    assert (tmp_path / "rc").read_text().strip() == "2"
    assert (tmp_path / "left").read_text() == ""


@pytest.mark.parametrize("driver", [None, "stdio"])
def test_a_file_size_limit_reached_as_hdf5_writes_its_metadata_is_one_line_not_a_crash(golden_tfrecord, converted,
                                                                                       tmp_path, driver):
    """The last stop's "left": under ``ulimit -f`` (RLIMIT_FSIZE) just below the file's size, HDF5's
    last writes at the close failed (EFBIG), the error was one line, and then the interpreter crashed
    freeing the file (SIGSEGV, exit -11): emptying the temporary gave room on a full disk, not under
    a per-file limit. Its writes now go to /dev/null once a write failed: exit 2, nothing left. The
    same under HDF5_DRIVER=stdio (whose handle is no descriptor: a review): the writer's driver is
    the default one whatever HDF5_DRIVER says."""
    import resource
    import subprocess
    import sys
    limit = os.path.getsize(converted) - 1
    out = tmp_path / "x.hdf5"
    proc = subprocess.run(
        [sys.executable, "-m", "mlperf_bert", "to-hdf5", "--input=%s" % golden_tfrecord, "--output=%s" % out,
         "--max_seq_length=128", "--max_predictions_per_seq=20"], capture_output=True, text=True, timeout=120,
        env=dict(os.environ, **({"HDF5_DRIVER": driver} if driver else {})),
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)))
    assert "Traceback" not in proc.stderr and "Fatal" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: cannot write %s: file too large; no partial file was left: write to a file system that allows "
        "larger files (or raise ulimit -f), then rerun the same command" % out), proc.stderr
    assert proc.returncode == 2
    assert os.listdir(tmp_path) == []


def test_an_output_ending_in_a_slash_is_one_line_naming_a_file_path(golden_tfrecord, tmp_path):
    """A hostile sweep: --output=DIR/ (a folder meant, or a file's path with a '/' typed after it) was
    h5py's 20-line traceback on the temporary DIR/.tmp-PID (NotADirectoryError, FileNotFoundError)."""
    (tmp_path / "x.hdf5").write_bytes(b"")
    cases = {str(tmp_path / "new") + "/": str(tmp_path / "new" / "train.hdf5"),
             str(tmp_path / "x.hdf5") + "/": str(tmp_path / "x.hdf5")}
    for output, hint in cases.items():
        with pytest.raises(UserError) as e:
            hdf5.main(["to-hdf5", "--input=%s" % golden_tfrecord, "--output=%s" % output,
                       "--max_seq_length=128", "--max_predictions_per_seq=20"])
        assert str(e.value) == "--output=%s ends in '/', a folder's path: give the HDF5 file's path (e.g. %s)" % (
            output, hint)
    assert sorted(os.listdir(tmp_path)) == ["x.hdf5"]


def test_a_killed_writes_temporary_matched_by_the_glob_is_refused(golden_tfrecord, tmp_path):
    """A hostile sweep: make-dataset killed (SIGKILL, the OOM killer) leaves part-N.tmp-PID beside the
    finished shards; `to-hdf5 --input='tfrecords/part-*'` converted it as a shard: exit 0, its records
    cut off where the kill fell (at a record's end they all pass their CRCs)."""
    records = list(read_records(golden_tfrecord))
    (tmp_path / "tfrecords").mkdir()
    write_records(str(tmp_path / "tfrecords" / "part-00000-of-00002"), records[:20])
    write_records(str(tmp_path / "tfrecords" / "part-00001-of-00002.tmp-4242"), records[20:27])
    out = tmp_path / "train.hdf5"
    with pytest.raises(UserError) as e:
        hdf5.main(["to-hdf5", "--input=%s" % (tmp_path / "tfrecords" / "part-*"), "--output=%s" % out,
                   "--max_seq_length=128", "--max_predictions_per_seq=20"])
    assert str(e.value).startswith("--input file %s is the temporary of an unfinished write of part-00001-of-00002 "
                                   "(process 4242: still running, or killed): " % (
                                       tmp_path / "tfrecords" / "part-00001-of-00002.tmp-4242"))
    assert not out.exists()


def test_a_named_pipe_as_input_is_refused_at_once_not_waited_on(tmp_path):
    """A hostile sweep: `to-hdf5 --input=FIFO` (a named pipe no process writes to) waited for ever as
    it opened it. It is one line naming the file, before anything is made."""
    from test_tfrecord import writerless_fifo
    out = tmp_path / "new" / "x.hdf5"
    with writerless_fifo(str(tmp_path / "fifo")) as fifo, pytest.raises(UserError) as e:
        hdf5.main(["to-hdf5", "--input=%s" % fifo, "--output=%s" % out, "--max_seq_length=128",
                   "--max_predictions_per_seq=20"])
    assert str(e.value) == "--input file %s is a named pipe (FIFO), not a regular file: give the path of a regular " \
                           "file" % fifo
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("kind", ["plain", "packed"])
def test_a_flipped_byte_in_the_metadata_is_one_line_not_a_traceback(made, tmp_path, kind):
    """A byte flipped in a file's metadata (an object header, a link table, a datatype, an attribute:
    the bytes before its datasets' data) was h5py's KeyError, RuntimeError, UnicodeDecodeError or
    ValueError out of open_file's own checks (and content_tag's): run_pretraining.py's traceback, exit 1."""
    from mlperf_bert.dataset import checksums
    from mlperf_bert.trainer import loader, preflight
    with open(made[kind], "rb") as f:
        data = f.read()
    with h5py.File(made[kind], "r") as h:
        start = min(h[name].id.get_offset() for name in h)
    path = str(tmp_path / os.path.basename(made[kind]))
    odd = {}
    for off in range(1, start, 53):  # (a sample: every 3rd byte took 25 s; ~1 in 6 was a traceback)
        damaged = bytearray(data)
        damaged[off] ^= 0xFF
        with open(path, "wb") as f:
            f.write(bytes(damaged))
        try:
            checksums.content_tag(path)
            preflight._packed_input([path])
            loader.check_records([path], full=True)
        except UserError as e:
            assert len(str(e).splitlines()) == 1 and path in str(e), str(e)
        except Exception as e:
            odd.setdefault(type(e).__name__, (off, str(e)[:150]))
    assert not odd, odd


def test_a_good_file_opened_past_the_open_file_limit_is_not_called_damaged(tmp_path, few_open_files):
    """A sweep: h5py's open failing for the process's open-file limit (EMFILE) made open_file read the
    signature, which failed alike and was taken for "not an HDF5 file: give a file that to-hdf5 or
    pack made" (a file that is fine)."""
    path = str(tmp_path / "a.hdf5")
    with h5py.File(path, "w") as h:
        h.create_dataset("x", data=np.zeros(2))
    fds = []
    try:
        with few_open_files():
            with pytest.raises(OSError):  # every descriptor the limit leaves taken
                while True:
                    fds.append(os.open(os.devnull, os.O_RDONLY))
            with pytest.raises(UserError) as e:
                hdf5.open_file(path)
    finally:
        for fd in fds:
            os.close(fd)
    assert str(e.value) == ("cannot open %s: Too many open files: raise the open-file limit (ulimit -n), or give "
                            "fewer files" % path)
    hdf5.open_file(path).close()


@pytest.mark.parametrize("attr,value,message", [
    ("max_seq_length", np.array([128, 128]), "attribute max_seq_length is array([128, 128]), not an integer"),
    ("num_sequences", np.array([500]), "attribute num_sequences is array([500]), not an integer"),
    ("max_predictions_per_row", "20", "attribute max_predictions_per_row is '20', not an integer"),
    ("packing_rate", np.array([1.0, 1.0]), "attribute packing_rate is array([1., 1.]), not a number"),
    ("max_predictions_per_row", 20 + (1 << 32), "attribute max_predictions_per_row is 4294967316, but its rows "
                                                "hold 60 prediction slots"),
    ("max_predictions_per_row", 0, "attribute max_predictions_per_row is 0, but its rows hold 60 prediction slots")])
def test_a_packed_attribute_that_is_not_one_fitting_integer_is_one_line(made, tmp_path, attr, value, message):
    """A hostile sweep: a packed file's attribute made an array (its dataspace damaged) was numpy's
    ValueError traceback at the trainer's start, one of text its UFuncNoLoopError, and a
    max_predictions_per_row past the rows' slots (a flipped high byte) trained on, the warm-up
    shaped by it."""
    from mlperf_bert.trainer import packed_loader
    path = _copy(made["packed"], str(tmp_path / os.path.basename(made["packed"])))
    with h5py.File(path, "r+") as h:
        h.attrs[attr] = value
    for read in (lambda: packed_loader.check_files([path], 128, 20), lambda: packed_loader.row_shape([path]),
                 lambda: next(iter(packed_loader.PackedBatches([path], 8)))):
        with pytest.raises(UserError) as e:
            read()
        assert str(e.value).startswith("%s: %s" % (path, message)) and "pack it again" in str(e.value), str(e.value)


def _nvidia_files(made, d):
    """NVIDIA's MLPerf BERT layouts (training_results v2.1-v5.0 input_preprocessing/) of the first 12
    golden records: convert_fixed2variable.py's (one unpadded vlen row a record, int16/int8, no
    input_mask or weights) and packed_data/create_packed_trainset.py's (two records a row, positions
    counted in the row, packed_input_len and packed_masked_lm_len; its shards named part_00000)."""
    ex = hdf5.read_examples(made["plain"], 0, 12)
    lens, preds = ex["input_mask"].sum(1), (ex["masked_lm_positions"] != 0).sum(1)
    row = {"input_ids": [ex["input_ids"][i, :lens[i]] for i in range(12)],
           "segment_ids": [ex["segment_ids"][i, :lens[i]] for i in range(12)],
           "masked_lm_positions": [ex["masked_lm_positions"][i, :preds[i]] for i in range(12)],
           "masked_lm_ids": [ex["masked_lm_ids"][i, :preds[i]] for i in range(12)]}
    kinds = {"input_ids": "int16", "segment_ids": "int8", "masked_lm_positions": "int16", "masked_lm_ids": "int16",
             "packed_input_len": "int16", "packed_masked_lm_len": "int16", "next_sentence_labels": "int8"}

    def write(path, rows):
        with h5py.File(path, "w") as h:
            for name, values in rows.items():
                ds = h.create_dataset(name, (len(values),), dtype=h5py.vlen_dtype(np.dtype(kinds[name])))
                for i, v in enumerate(values):
                    ds[i] = np.asarray(v, kinds[name])
        return path
    varlength = str(d / "part_00000_of_00002.hdf5")
    write(varlength, row)
    with h5py.File(varlength, "a") as h:
        h.create_dataset("next_sentence_labels", data=ex["next_sentence_labels"].reshape(-1).astype("i1"))
    pairs = [(2 * i, 2 * i + 1) for i in range(6)]
    packed = {name: [np.concatenate([row[name][a], row[name][b]]) for a, b in pairs] for name in row}
    packed["masked_lm_positions"] = [np.concatenate([row["masked_lm_positions"][a], row["masked_lm_positions"][b] +
                                                     lens[a]]) for a, b in pairs]
    packed.update(packed_input_len=[lens[[a, b]] for a, b in pairs], packed_masked_lm_len=[preds[[a, b]] for a, b in pairs],
                  next_sentence_labels=[ex["next_sentence_labels"][[a, b], 0] for a, b in pairs])
    return varlength, write(str(d / "part_00000"), packed)


def test_nvidias_varlength_and_packed_files_are_refused_naming_them(made, tmp_path):
    """NVIDIA's shards (hdf5_4320_shards_varlength, eval_varlength, packed_data) were called damaged
    ('dataset input_ids has shape (12,) ... convert it again with to-hdf5', MISMATCH in verify), and a
    packed shard, named part_00000, a TFRecord to rename *.hdf5 (then refused as damaged)."""
    from mlperf_bert.dataset import checksums
    from mlperf_bert.trainer import training
    from test_training import TINY, flags_for
    import json
    config = str(tmp_path / "config.json")
    with open(config, "w") as f:
        json.dump(TINY, f)
    varlength, packed = _nvidia_files(made, tmp_path)
    what = {varlength: "NVIDIA's MLPerf BERT variable-length HDF5 (convert_fixed2variable.py: one unpadded row a "
                       "record, no input_mask), which this project does not read: convert the TFRecords with python "
                       "-m mlperf_bert to-hdf5 (docs/dataset.md section 5)",
            packed: "NVIDIA's MLPerf BERT packed data (create_packed_trainset.py: variable-length rows, sequences "
                    "told apart by packed_input_len), which this project does not read: pack the TFRecords with "
                    "python -m mlperf_bert pack (docs/dataset.md section 6)"}
    for kw, path in [(dict(input_file=varlength), varlength), (dict(input_file=packed), packed),
                     (dict(input_file=made["tfrecord"], eval_input_file=varlength, do_eval=True), varlength)]:
        kw = dict(dict(max_seq_length=128, max_predictions_per_seq=20, num_train_steps=2, num_workers=0), **kw)
        with pytest.raises(UserError) as e:
            training.main(flags_for({"config": config, "train": None}, str(tmp_path / "out"), **kw))
        assert str(e.value) == "%s is %s" % (path, what[path])
    for path in what:  # intact, carrying no checksums: verify's UNKNOWN, as for the reference's HDF5
        assert checksums.own_checksums(path) is None
