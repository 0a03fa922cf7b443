"""pick_eval_samples: keep records int(i * (N / num)) of an eval TFRecord (the reference's eval_10k step)."""
import os
import sys

from mlperf_bert import flags
from mlperf_bert.errors import UserError
from mlperf_bert.dataset.example import PRETRAINING_FEATURES, check_shape, decode_pretraining_example, encode_example
from mlperf_bert.fileio import (check_writable_dir, new_dirs_removed_on_error, refuse_overwriting_inputs,
                                refuse_replacing_another_kind)
from mlperf_bert.locking import lock_file
from mlperf_bert.dataset.tfrecord import TFRecordWriter, count_records, read_records


def pick_indexes(total, num_examples_to_pick):
    """The reference's picks: record int(i * ratio), ratio = N / num, for i in 0..num-1.

    The float ratio is multiplied, as the reference does: int(i * (N / num)) is sometimes one
    less than the exact floor(i * N / num) (e.g. N=4366, num=407, i=187 gives 2005, not 2006).
    """
    ratio = total / num_examples_to_pick
    return [int(i * ratio) for i in range(num_examples_to_pick)]


def pick_eval_samples(input_file, output_file, num_examples_to_pick, max_seq_length,
                      max_predictions_per_seq, progress=True):
    """Write the picked records (re-encoded in the fixed feature order) to ``output_file``; return the count."""
    if num_examples_to_pick < 1:
        raise UserError("--num_examples_to_pick=%d must be at least 1" % num_examples_to_pick)
    check_shape(max_seq_length, max_predictions_per_seq)  # a negative one was a SystemError, a huge one MemoryError
    if os.path.isdir(output_file):
        raise UserError("--output_tfrecord %s is a directory: give a file path" % output_file)
    from mlperf_bert.dataset.checksums import is_tfrecord
    from mlperf_bert.dataset.example import check_first_records
    from mlperf_bert.dataset.hdf5 import refuse_hdf5_inputs
    refuse_overwriting_inputs([output_file], [input_file], "--output_tfrecord")
    refuse_replacing_another_kind(output_file, is_tfrecord, "a TFRecord file", "--output_tfrecord")
    refuse_hdf5_inputs([input_file], "pick-eval-samples")
    # The input, as far as it can be checked without reading every record, before the output's
    # folder is made: a refused input leaves nothing behind (a record damaged further in: the
    # folders this run made go again).
    total = count_records(input_file)  # headers only; the read below checks each record's CRC
    if total < num_examples_to_pick:
        raise UserError("%s has %d records, fewer than --num_examples_to_pick=%d: give a larger input "
                        "or pick fewer" % (input_file, total, num_examples_to_pick))
    check_first_records([input_file], max_seq_length, max_predictions_per_seq)
    with new_dirs_removed_on_error(os.path.dirname(os.path.abspath(output_file))):
        check_writable_dir(output_file)
        with lock_file(output_file, "--output_tfrecord"):
            return _pick(input_file, output_file, total, num_examples_to_pick, max_seq_length,
                         max_predictions_per_seq, progress)


def _pick(input_file, output_file, total, num_examples_to_pick, max_seq_length, max_predictions_per_seq, progress):
    wanted = pick_indexes(total, num_examples_to_pick)
    bar = None
    if progress:
        from mlperf_bert.progress import bar as progress_bar
        bar = progress_bar(total=total, unit="rec", desc="picking")
    k = 0
    with TFRecordWriter(output_file) as writer:
        # every record is read, its CRC checked, past the last pick too: the reference reads all N
        for index, data in enumerate(read_records(input_file)):
            if bar is not None and index % 1024 == 1023:
                bar.update(1024)
            if k >= len(wanted) or index != wanted[k]:
                continue
            feats = decode_pretraining_example(data, max_seq_length, max_predictions_per_seq,
                                               where="%s: record %d" % (input_file, index))
            record = encode_example([(name, kind, feats[name]) for name, kind, _ in PRETRAINING_FEATURES])
            while k < len(wanted) and wanted[k] == index:  # written once per pick, as the reference
                writer.write(record)
                k += 1
    if bar is not None:
        bar.update(total - bar.n)
        bar.close()
    return writer.count


def main(argv):
    fv = flags.FlagValues()
    flags.DEFINE_string("input_tfrecord", "", "Input tfrecord path", flag_values=fv)
    flags.DEFINE_string("output_tfrecord", "", "Output tfrecord path", flag_values=fv)
    flags.DEFINE_integer("num_examples_to_pick", 10000, "Number of examples to pick", flag_values=fv)
    flags.DEFINE_integer("max_seq_length", 512, "The maximum number of tokens within a sequence.",
                         flag_values=fv)
    flags.DEFINE_integer("max_predictions_per_seq", 76, "The maximum number of predictions within a sequence.",
                         flag_values=fv)
    flags.parse(fv, argv, positional=False)
    for name in ("input_tfrecord", "output_tfrecord"):
        if not fv[name].value:
            raise UserError("flag --%s is required" % name)
    n = pick_eval_samples(fv.input_tfrecord, fv.output_tfrecord, fv.num_examples_to_pick,
                          fv.max_seq_length, fv.max_predictions_per_seq)
    print("wrote %d records to %s" % (n, fv.output_tfrecord), file=sys.stderr)
    return 0
