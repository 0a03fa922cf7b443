"""``to-hdf5``: pre-training TFRecords -> one HDF5 file, and the reader for it.

One dataset per feature, named as the feature, shape (N, length) (``next_sentence_labels``
is (N,)), examples in input order, contiguous layout so one example is one small read.
Integer features use the smallest unsigned type their values need (checked, never
truncated); ``masked_lm_weights`` stays float32. Reading back with ``read_examples`` or
``iter_batches`` gives int64/float32 arrays equal to decoding the TFRecords.
"""
import numpy as np

from mlperf_bert import flags
from mlperf_bert.errors import UserError
from mlperf_bert.dataset.example import (PRETRAINING_FEATURES, decode_pretraining_batch, decode_pretraining_example,
                      feature_lengths)
from mlperf_bert.fileio import atomic_path, refuse_overwriting_inputs
from mlperf_bert.locking import lock_file
from mlperf_bert.dataset.tfrecord import count_records, expand_paths, read_records

# Storage types: ids fit uint16 for any vocab of up to 65,536 tokens; values are checked.
STORAGE_DTYPES = {
    "input_ids": np.uint16,
    "input_mask": np.uint8,
    "segment_ids": np.uint8,
    "masked_lm_positions": np.uint16,
    "masked_lm_ids": np.uint16,
    "masked_lm_weights": np.float32,
    "next_sentence_labels": np.uint8,
}
FEATURE_NAMES = tuple(name for name, _, _ in PRETRAINING_FEATURES)


def _store(name, values, where):
    dtype = STORAGE_DTYPES[name]
    if name != "masked_lm_weights":
        info = np.iinfo(dtype)
        if values.size and (values.min() < info.min or values.max() > info.max):
            raise UserError("%s: %s holds %d..%d, outside %s: this data cannot be stored compactly"
                            % (where, name, values.min(), values.max(), np.dtype(dtype).name))
    return values.astype(dtype)


def tfrecords_to_hdf5(input_files, output_file, max_seq_length, max_predictions_per_seq, block=4096,
                      progress=True):
    """Convert ``input_files`` (in order) into ``output_file``; return the number of examples."""
    refuse_overwriting_inputs([output_file], input_files, "--output")
    with lock_file(output_file, "--output"):
        return _convert(input_files, output_file, max_seq_length, max_predictions_per_seq, block, progress)


def _convert(input_files, output_file, max_seq_length, max_predictions_per_seq, block, progress):
    import h5py
    from tqdm import tqdm
    counts = [count_records(p) for p in input_files]
    total = sum(counts)
    lengths = feature_lengths(max_seq_length, max_predictions_per_seq)
    needed = total * sum(np.dtype(STORAGE_DTYPES[n]).itemsize * (1 if n == "next_sentence_labels" else lengths[n])
                         for n in FEATURE_NAMES)
    with atomic_path(output_file, needed) as tmp, h5py.File(tmp, "w") as h:
        h.attrs["max_seq_length"] = max_seq_length
        h.attrs["max_predictions_per_seq"] = max_predictions_per_seq
        h.attrs["source_files"] = [str(p) for p in input_files]
        dsets = {}
        for name in FEATURE_NAMES:
            shape = (total,) if name == "next_sentence_labels" else (total, lengths[name])
            dsets[name] = h.create_dataset(name, shape=shape, dtype=STORAGE_DTYPES[name])
        pos = 0

        def flush(path, first, records):
            nonlocal pos
            if not records:
                return
            n = len(records)
            feats = _decode_block(path, first, records, max_seq_length, max_predictions_per_seq)
            where = "%s: records %d..%d" % (output_file, pos, pos + n - 1)
            for name in FEATURE_NAMES:
                arr = feats[name].reshape(-1) if name == "next_sentence_labels" else feats[name]
                dsets[name][pos:pos + n] = _store(name, arr, where)
            pos += n
            records.clear()

        with tqdm(total=total, unit="rec", desc="to-hdf5", disable=not progress) as bar:
            for path in input_files:
                records, first = [], 0
                for i, data in enumerate(read_records(path)):
                    records.append(data)
                    if len(records) >= block:
                        bar.update(len(records))
                        flush(path, first, records)
                        first = i + 1
                bar.update(len(records))
                flush(path, first, records)
    return total


def _decode_block(path, first, records, max_seq_length, max_predictions_per_seq):
    """Decode a block of records at once; on a bad one, name it by its index in ``path``."""
    try:
        return decode_pretraining_batch(records, max_seq_length, max_predictions_per_seq)
    except UserError:
        for i, data in enumerate(records):
            decode_pretraining_example(data, max_seq_length, max_predictions_per_seq,
                                       where="%s: record %d" % (path, first + i))
        raise


def _as_decoded(name, arr):
    return arr.astype(np.float32 if name == "masked_lm_weights" else np.int64)


def read_examples(path, start=0, stop=None):
    """Examples ``[start, stop)`` of an HDF5 file as {feature: array}, int64 (weights float32).

    ``next_sentence_labels`` has shape (n, 1), like the decoded TFRecord feature.
    """
    import h5py
    try:
        with h5py.File(path, "r") as h:
            out = {}
            for name in FEATURE_NAMES:
                arr = _as_decoded(name, h[name][start:stop])
                out[name] = arr.reshape(-1, 1) if name == "next_sentence_labels" else arr
            return out
    except (OSError, KeyError) as e:
        raise UserError("cannot read HDF5 file %s (%s): convert it again with to-hdf5" % (path, e))


def num_examples(path):
    import h5py
    try:
        with h5py.File(path, "r") as h:
            return int(h["input_ids"].shape[0])
    except (OSError, KeyError) as e:
        raise UserError("cannot read HDF5 file %s (%s): convert it again with to-hdf5" % (path, e))


def iter_batches(path, batch_size, start=0, drop_remainder=False):
    """Yield {feature: array} batches of ``batch_size`` examples in file order (last may be short)."""
    n = num_examples(path)
    for b in range(start, n, batch_size):
        if drop_remainder and b + batch_size > n:
            return
        yield read_examples(path, b, min(b + batch_size, n))


def main(argv):
    fv = flags.FlagValues()
    flags.DEFINE_string("input", None, "TFRecord file(s): comma list or glob, converted in this order",
                        flag_values=fv)
    flags.DEFINE_string("output", None, "the HDF5 file to write", flag_values=fv)
    flags.DEFINE_integer("max_seq_length", 512, "sequence length of the records", flag_values=fv)
    flags.DEFINE_integer("max_predictions_per_seq", 76, "masked positions per record", flag_values=fv)
    flags.parse(fv, argv, required=["input", "output"], positional=False)
    files = expand_paths(fv.input, "--input file")
    n = tfrecords_to_hdf5(files, fv.output, fv.max_seq_length, fv.max_predictions_per_seq)
    print("wrote %d examples from %d file(s) to %s" % (n, len(files), fv.output))
    return 0
