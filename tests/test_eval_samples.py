"""pick_eval_samples keeps records int(i * (N / num)), re-encoded in the fixed feature order."""
import os
import subprocess
import sys

import numpy as np
import pytest

from mlperf_bert.errors import UserError
from mlperf_bert.dataset.eval_samples import main, pick_eval_samples, pick_indexes
from mlperf_bert.dataset.example import PRETRAINING_FEATURES, decode_example
from mlperf_bert.dataset.tfrecord import read_records, write_records

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def golden_records(golden_dir):
    return list(read_records(os.path.join(golden_dir, "part-00000.s128.tfrecord")))


def test_pick_indexes_use_the_float_ratio_like_the_reference():
    # reference: pick_ratio = N / num; records[int(i * pick_ratio)]; differs from exact floor here
    assert pick_indexes(4366, 407)[187] == 2005 and 187 * 4366 // 407 == 2006
    assert pick_indexes(122, 14) == [int(i * (122 / 14)) for i in range(14)]
    assert pick_indexes(10, 10) == list(range(10))
    assert pick_indexes(20, 3) == [0, 6, 13]


@pytest.mark.parametrize("num", [1, 7, 407, 4366])
def test_picks_reference_indexes_with_same_content(tmp_path, golden_dir, golden_records, num):
    out = str(tmp_path / "eval")
    n = pick_eval_samples(os.path.join(golden_dir, "part-00000.s128.tfrecord"), out, num, 128, 20,
                          progress=False)
    picked = list(read_records(out))
    total = len(golden_records)
    assert n == len(picked) == num
    for i in sorted({0, num // 2, num - 1} | ({187} if num == 407 else set())):
        want = decode_example(golden_records[int(i * (total / num))])
        got = decode_example(picked[i])
        assert list(got) == [name for name, _, _ in PRETRAINING_FEATURES]
        assert sorted(want) == sorted(got)
        for name in got:
            np.testing.assert_array_equal(got[name], want[name])


def test_command_line_and_errors(tmp_path, golden_dir):
    src = os.path.join(golden_dir, "part-00000.s128.tfrecord")
    out = tmp_path / "eval_10"
    r = subprocess.run([sys.executable, os.path.join(ROOT, "pick_eval_samples.py"), "--input_tfrecord=" + src,
                        "--output_tfrecord=" + str(out), "--num_examples_to_pick=10",
                        "--max_seq_length=128", "--max_predictions_per_seq=20"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert len(list(read_records(str(out)))) == 10
    with pytest.raises(UserError, match="fewer than --num_examples_to_pick=5000"):
        main(["p", "--input_tfrecord=" + src, "--output_tfrecord=" + str(tmp_path / "x"),
              "--num_examples_to_pick=5000", "--max_seq_length=128", "--max_predictions_per_seq=20"])
    with pytest.raises(UserError, match="expected 512"):  # default --max_seq_length=512 vs s128 data
        main(["p", "--input_tfrecord=" + src, "--output_tfrecord=" + str(tmp_path / "y"),
              "--num_examples_to_pick=10"])
    with pytest.raises(UserError, match="cannot read"):
        main(["p", "--input_tfrecord=" + str(tmp_path / "none"), "--output_tfrecord=" + str(tmp_path / "z")])
    # a differential sweep: a negative length was a SystemError of the C decoder, 2**40 a MemoryError
    for flags, why in [("--max_seq_length=-5", "too small"), ("--max_seq_length=%d" % 2**40, "at most 2147483647"),
                       ("--max_predictions_per_seq=-1", "below 0"), ("--max_predictions_per_seq=%d" % 2**40, "too large")]:
        with pytest.raises(UserError, match=why):
            main(["p", "--input_tfrecord=" + src, "--output_tfrecord=" + str(tmp_path / "w"), "--num_examples_to_pick=10",
                  "--max_seq_length=128", flags])
    assert sorted(os.listdir(str(tmp_path))) == ["eval_10"]  # failed runs leave nothing behind


def test_output_that_is_the_input_is_refused(golden_dir, tmp_path):
    """Issue 16.2: outputs never overwrite inputs (compared by real path)."""
    src = tmp_path / "eval_intermediate"
    src.write_bytes(open(os.path.join(golden_dir, "part-00000.s128.tfrecord"), "rb").read())
    before = src.read_bytes()
    with pytest.raises(UserError, match="--output_tfrecord .* is the input"):
        main(["x", "--input_tfrecord=%s" % src, "--output_tfrecord=%s/../%s/eval_intermediate"
              % (tmp_path, tmp_path.name), "--num_examples_to_pick=10", "--max_seq_length=128",
              "--max_predictions_per_seq=20"])
    assert src.read_bytes() == before and os.listdir(tmp_path) == ["eval_intermediate"]


def test_another_kind_of_output_is_not_replaced_and_an_hdf5_input_is_named(golden_dir, tmp_path, vocab_file):
    """A hostile sweep: --output_tfrecord=vocab.txt replaced the vocab with 10 records (the generator
    refuses that); an HDF5 --input_tfrecord was called "a corrupt length (CRC mismatch): damaged"."""
    from mlperf_bert.dataset import hdf5
    src = os.path.join(golden_dir, "part-00000.s128.tfrecord")
    vocab = tmp_path / "vocab.txt"
    vocab.write_bytes(open(vocab_file, "rb").read())
    args = ["--num_examples_to_pick=10", "--max_seq_length=128", "--max_predictions_per_seq=20"]
    with pytest.raises(UserError) as e:
        main(["p", "--input_tfrecord=" + src, "--output_tfrecord=%s" % vocab] + args)
    assert str(e.value) == ("--output_tfrecord %s exists and is not a TFRecord file: refusing to overwrite it "
                            "(choose another file, or remove it)" % vocab)
    assert vocab.read_bytes() == open(vocab_file, "rb").read()
    h5 = str(tmp_path / "part.hdf5")
    hdf5.tfrecords_to_hdf5([src], h5, 128, 20, progress=False)
    with pytest.raises(UserError) as e:
        main(["p", "--input_tfrecord=" + h5, "--output_tfrecord=%s" % (tmp_path / "e")] + args)
    assert str(e.value) == ("%s is an HDF5 file, not TFRecords: pick-eval-samples reads the TFRecords that "
                            "make-dataset or create_pretraining_data.py write" % h5)
    assert sorted(os.listdir(tmp_path)) == ["part.hdf5", "vocab.txt"]


def test_a_feature_of_another_kind_or_past_int32_is_refused_not_converted(tiny_record, tmp_path):
    """A hostile review: float input_ids 1.5 were written as int64 1 and int64 masked_lm_weights as
    float (exit 0), where the reference's tf.parse_single_example fails: one line naming the input,
    the record and the feature, and nothing written."""
    src, out = str(tmp_path / "in"), str(tmp_path / "eval")
    for bad, why in ((tiny_record(input_ids=("float", [1.5] * 8)), "input_ids holds float values, not int64"),
                     (tiny_record(masked_lm_weights=("int64", [1, 1])),
                      "masked_lm_weights holds int64 values, not float"),
                     (tiny_record(input_ids=[2**32 + 5] * 8), "input_ids holds 4294967301, outside int32")):
        write_records(src, [tiny_record(), bad, tiny_record()])
        with pytest.raises(UserError) as e:
            pick_eval_samples(src, out, 2, 8, 2, progress=False)
        assert str(e.value).startswith("%s: record 1: feature %s: " % (src, why)), str(e.value)
        assert not os.path.exists(out)


def test_a_value_no_pretraining_record_holds_is_refused_by_every_tool(tiny_record, tmp_path):
    """A hostile sweep: to-hdf5, pack and pick-eval-samples copied on what the trainer refuses when it
    reads it (a masked position past the row, an NSP label 7, a negative id), exit 0: the decoder
    that each of them and the trainer use refuses it (example.values_refusal), naming the record."""
    from mlperf_bert.dataset import hdf5, packing
    src = str(tmp_path / "in")
    for bad, why in ((tiny_record(masked_lm_positions=[1, 9]), "has a masked_lm_positions outside its 8 tokens"),
                     (tiny_record(next_sentence_labels=[7]), "has next_sentence_labels 7, where BERT pre-training "
                                                             "data holds 0 or 1"),
                     (tiny_record(input_ids=[-3] + [5] * 7), "has input_ids -3, where BERT pre-training data holds "
                                                             ">= 0"),
                     # another sweep: pack took the length from the mask's sum and cut a token, exit 0
                     (tiny_record(input_mask=[0, 1, 1, 1, 1, 0, 0, 0]), "has an input_mask with a 0 before a 1, "
                                                                        "where BERT pre-training data holds its "
                                                                        "tokens' 1s first, then 0s"),
                     # another: pack put a prediction in a record's padding on the next sequence's tokens
                     # (its label read where only that sequence attends), exit 0; no token: a traceback
                     (tiny_record(masked_lm_positions=[1, 6]), "has a masked position (6) past its 4 tokens (its "
                                                               "input_mask's 1s)"),
                     (tiny_record(input_mask=[0] * 8), "has no token (an input_mask of 0s)")):
        write_records(src, [tiny_record(), bad, tiny_record()])
        for run in (lambda: pick_eval_samples(src, str(tmp_path / "eval"), 3, 8, 2, progress=False),
                    lambda: hdf5.tfrecords_to_hdf5([src], str(tmp_path / "x.hdf5"), 8, 2, progress=False),
                    lambda: packing.pack_file(src, str(tmp_path / "x.packed.hdf5"), 8, 2, 3, 1)):
            with pytest.raises(UserError) as e:
                run()
            assert str(e.value).startswith("%s: record 1 %s" % (src, why)), str(e.value)
        assert sorted(os.listdir(tmp_path)) == ["in"]


def test_a_refused_input_leaves_no_folder_this_run_made(golden_dir, corrupt_deep, tmp_path):
    """pick_eval_samples.py with a missing input, too few records, records of another
    --max_seq_length or a record corrupt deep in the file made the output's folder (with its
    parents) before it read the input, and left it empty. The count and the first record are now
    checked before anything is made; a record found corrupt later, past the last pick too, removes
    the folders this run made."""
    src = os.path.join(golden_dir, "part-00000.s128.tfrecord")
    corrupt = str(tmp_path / "corrupt")
    corrupt_deep(corrupt)  # record 4's data, not its header: only the full read finds it
    garbage = str(tmp_path / "garbage")
    write_records(garbage, [b"\x0a\x05"])  # a Features field that overruns the message
    out = tmp_path / "new" / "eval" / "eval_10k"
    for flags, why in (([str(tmp_path / "none")], "cannot read TFRecord file %s: No such file or directory: check "
                                                  "the path" % (tmp_path / "none")),
                       # a hostile sweep: a folder, or a record that is no Example, named no fix
                       ([str(tmp_path)], "cannot read TFRecord file %s: Is a directory: give the path of a TFRecord "
                                         "file in it" % tmp_path),
                       ([garbage, "--max_seq_length=8", "--max_predictions_per_seq=2", "--num_examples_to_pick=1"],
                        "%s: record 0: malformed tf.train.Example: the file is damaged, or not BERT pre-training "
                        "TFRecords: make it again" % garbage),
                       ([src, "--num_examples_to_pick=5000"], "%s has 4366 records, fewer than "
                                                              "--num_examples_to_pick=5000" % src),
                       ([src, "--max_seq_length=512", "--max_predictions_per_seq=76"],
                        "%s: record 0: feature input_mask has 128 values, expected 512" % src),
                       ([corrupt, "--max_seq_length=8", "--max_predictions_per_seq=2", "--num_examples_to_pick=6"],
                        "%s: record 4 is corrupt (data CRC mismatch)" % corrupt),
                       # picks record 0: the damaged record 4 is past the last pick, and the reference
                       # reads all N records (REFERENCE.md): it was written, 1 record, status 0
                       ([corrupt, "--max_seq_length=8", "--max_predictions_per_seq=2", "--num_examples_to_pick=1"],
                        "%s: record 4 is corrupt (data CRC mismatch)" % corrupt)):
        with pytest.raises(UserError) as e:
            main(["p", "--input_tfrecord=" + flags[0], "--output_tfrecord=%s" % out, "--num_examples_to_pick=10",
                  "--max_seq_length=128", "--max_predictions_per_seq=20"] + flags[1:])
        assert str(e.value).startswith(why)
        assert not (tmp_path / "new").exists(), why
    # as a user runs it: one line, exit 2, nothing made
    r = subprocess.run([sys.executable, os.path.join(ROOT, "pick_eval_samples.py"), "--input_tfrecord=" + src,
                        "--output_tfrecord=%s" % out, "--num_examples_to_pick=10"], capture_output=True, text=True,
                       timeout=120)
    assert (r.returncode, r.stdout) == (2, "") and r.stderr == ("error: %s: record 0: feature input_mask has 128 "
                                                                 "values, expected 512: check --max_seq_length and "
                                                                 "--max_predictions_per_seq against the data\n" % src)
    assert not (tmp_path / "new").exists()
