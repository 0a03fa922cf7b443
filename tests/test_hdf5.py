import os

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
        assert sorted(h.keys()) == sorted(name for name, _, _ in PRETRAINING_FEATURES)
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


def test_values_that_do_not_fit_are_refused(tmp_path):
    feats = {"input_ids": [70000] + [0] * 7, "input_mask": [1] * 8, "segment_ids": [0] * 8,
             "masked_lm_positions": [0, 0], "masked_lm_ids": [0, 0], "masked_lm_weights": [0.0, 0.0],
             "next_sentence_labels": [0]}
    src = str(tmp_path / "big")
    write_records(src, [encode_example([(n, k, feats[n]) for n, k, _ in PRETRAINING_FEATURES])])
    with pytest.raises(UserError, match="input_ids holds 0..70000"):
        hdf5.tfrecords_to_hdf5([src], str(tmp_path / "big.hdf5"), 8, 2, progress=False)
    assert not os.path.exists(tmp_path / "big.hdf5")
    with pytest.raises(UserError, match="length 8, expected 16"):
        hdf5.tfrecords_to_hdf5([src], str(tmp_path / "x.hdf5"), 16, 2, progress=False)


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
