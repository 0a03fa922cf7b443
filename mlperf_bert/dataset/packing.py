"""Packed rows: several pre-training sequences in one ``max_seq_length`` row, and back.

The packed-row format (arrays over N rows; S = max_seq_length, K = max sequences per row,
P = max_predictions_per_seq), used by the ``pack`` command, the loader and the model:

- ``input_ids``, ``segment_ids`` [N, S]: the sequences' tokens one after the other, then 0s.
- ``input_mask`` [N, S]: 1..K, the number of the sequence a token belongs to; 0 = padding.
  Attention stays within a sequence (no cross-contamination).
- ``position_ids`` [N, S]: the token's position within its own sequence (0 on padding).
- ``masked_lm_positions``, ``masked_lm_ids``, ``masked_lm_weights`` [N, K*P]: sequence j's
  P predictions in slots j*P .. j*P+P-1, positions counted in the row; empty slots have
  position 0, id 0, weight 0 (exactly as unpacked padding predictions).
- ``next_sentence_labels`` [N, K]: label of sequence j; -1 where there is no sequence j.
- ``nsp_positions`` [N, K]: row position of sequence j's first token ([CLS]); 0 if absent.

A sequence's length is its unpacked ``input_mask`` sum (the generator's mask is a prefix).

A file's ``max_predictions_per_row`` attribute bounds the real predictions of any of its rows
(at most about 0.15 * S + K/2 for the reference's generator, far below K*P): the loader keeps
that many slots per row (``compact_predictions``), so the MLM head does not compute K*P.
"""
import os

import numpy as np

from mlperf_bert.errors import UserError

PACKED_FEATURES = ("input_ids", "segment_ids", "input_mask", "position_ids", "masked_lm_positions",
                   "masked_lm_ids", "masked_lm_weights", "next_sentence_labels", "nsp_positions")


def sequence_lengths(input_mask):
    """Real tokens of each unpacked sequence: [N] int64."""
    return np.asarray(input_mask).astype(bool).sum(axis=1)


def pack_arrays(arrays, groups, max_sequences_per_pack):
    """Unpacked arrays (the seven pre-training features, [M, ...]) + groups (a list of lists of
    sequence indices, each fitting in one row) -> packed arrays (the format above)."""
    ids = np.asarray(arrays["input_ids"])
    m, s = ids.shape
    p = np.asarray(arrays["masked_lm_positions"]).shape[1]
    k = max_sequences_per_pack
    n = len(groups)
    lengths = sequence_lengths(arrays["input_mask"])
    out = {name: np.zeros((n, s), np.int32) for name in ("input_ids", "segment_ids", "input_mask",
                                                          "position_ids")}
    out.update(masked_lm_positions=np.zeros((n, k * p), np.int32), masked_lm_ids=np.zeros((n, k * p), np.int32),
               masked_lm_weights=np.zeros((n, k * p), np.float32),
               next_sentence_labels=np.full((n, k), -1, np.int32), nsp_positions=np.zeros((n, k), np.int32))
    nsp = np.asarray(arrays["next_sentence_labels"]).reshape(m)
    for row, group in enumerate(groups):
        if not 1 <= len(group) <= k:
            raise ValueError("row %d holds %d sequences, allowed 1..%d" % (row, len(group), k))
        start = 0
        for j, i in enumerate(group):
            length = int(lengths[i])
            stop = start + length
            if stop > s:
                raise ValueError("row %d: sequences %s hold more than %d tokens" % (row, list(group), s))
            out["input_ids"][row, start:stop] = ids[i, :length]
            out["segment_ids"][row, start:stop] = arrays["segment_ids"][i][:length]
            out["input_mask"][row, start:stop] = j + 1
            out["position_ids"][row, start:stop] = np.arange(length)
            w = np.asarray(arrays["masked_lm_weights"][i], np.float32)
            slots = slice(j * p, (j + 1) * p)
            # padding predictions (weight 0) stay at position 0, id 0, as in the unpacked record
            out["masked_lm_positions"][row, slots] = np.where(w != 0, arrays["masked_lm_positions"][i] + start, 0)
            out["masked_lm_ids"][row, slots] = np.where(w != 0, arrays["masked_lm_ids"][i], 0)
            out["masked_lm_weights"][row, slots] = w
            out["next_sentence_labels"][row, j] = nsp[i]
            out["nsp_positions"][row, j] = start
            start = stop
    return out


def unpack_arrays(packed, max_seq_length):
    """Packed arrays -> the unpacked sequences they hold, as a dict of [M, ...] arrays in row
    order (padding predictions normalised to position 0, id 0, weight 0)."""
    k = packed["next_sentence_labels"].shape[1]
    p = packed["masked_lm_positions"].shape[1] // k
    rows = []
    for r in range(packed["input_ids"].shape[0]):
        for j in range(k):
            if packed["next_sentence_labels"][r, j] < 0:
                continue
            where = np.flatnonzero(packed["input_mask"][r] == j + 1)
            start, length = int(where[0]), len(where)
            seq = {name: np.zeros(max_seq_length, np.int64) for name in ("input_ids", "segment_ids", "input_mask")}
            seq["input_ids"][:length] = packed["input_ids"][r, start:start + length]
            seq["segment_ids"][:length] = packed["segment_ids"][r, start:start + length]
            seq["input_mask"][:length] = 1
            slots = slice(j * p, (j + 1) * p)
            w = packed["masked_lm_weights"][r, slots].astype(np.float32)
            seq["masked_lm_positions"] = np.where(w != 0, packed["masked_lm_positions"][r, slots] - start, 0)
            seq["masked_lm_ids"] = np.where(w != 0, packed["masked_lm_ids"][r, slots], 0).astype(np.int64)
            seq["masked_lm_weights"] = w
            seq["next_sentence_labels"] = np.array([packed["next_sentence_labels"][r, j]], np.int64)
            rows.append(seq)
    return {name: np.stack([row[name] for row in rows]) for name in rows[0]} if rows else {}


# ---------------------------------------------------------------- packing algorithm

def pack_groups(lengths, max_seq_length, max_sequences_per_pack):
    """Groups of sequence indices, each fitting one row: histogram best-fit, longest first.

    After Krell et al. 2021 (shortest-pack-first histogram packing), on the histogram of lengths:
    lengths are taken from the longest down; each goes into the open pack whose space left fits
    it most tightly (fewest tokens left over) among packs with fewer than K sequences, or opens a
    pack. Whole counts move at once, so the cost grows with the number of distinct lengths, not
    sequences. Sequences of one length are placed in input order: the result is deterministic.
    """
    s, k = int(max_seq_length), int(max_sequences_per_pack)
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.size and (lengths.min() < 1 or lengths.max() > s):
        raise ValueError("sequence lengths must be in 1..%d" % s)
    by_length = {}
    for length in np.unique(lengths)[::-1]:
        by_length[int(length)] = list(np.flatnonzero(lengths == length))
    packs = []  # packs[i]: sequence indices
    # open[(space left, sequences)] -> ids of packs in that state that can take more
    open_ = {}
    for length, idx in by_length.items():
        idx = idx[::-1]  # pop() takes them in input order
        while idx:
            best = None
            for space in range(length, s):
                for n in range(1, k):
                    if open_.get((space, n)):
                        best = (space, n)
                        break
                if best:
                    break
            if best is None:  # new packs, each with as many of this length as fit
                per = min(k, s // length)
                while idx:
                    group = [int(idx.pop()) for _ in range(min(per, len(idx)))]
                    packs.append(group)
                    space_left = s - length * len(group)
                    if len(group) < k and space_left > 0:
                        open_.setdefault((space_left, len(group)), []).append(len(packs) - 1)
                break
            space, n = best
            ids = open_[best]
            take = min(len(ids), len(idx))
            moved, open_[best] = ids[:take], ids[take:]
            for p in moved:
                packs[p].append(int(idx.pop()))
            if n + 1 < k and space - length > 0:
                open_.setdefault((space - length, n + 1), []).extend(moved)
    return packs


# ---------------------------------------------------------------- packed HDF5 files

# Storage types; values are checked before they are stored.
STORAGE = {"input_ids": np.uint16, "segment_ids": np.uint8, "input_mask": np.uint8, "position_ids": np.uint16,
           "masked_lm_positions": np.uint16, "masked_lm_ids": np.uint16, "masked_lm_weights": np.float32,
           "next_sentence_labels": np.int8, "nsp_positions": np.uint16}
ATTRS = ("max_seq_length", "max_predictions_per_seq", "max_sequences_per_pack", "num_sequences", "num_rows",
         "packing_rate", "max_predictions_per_row", "seed")
PREDICTION_FEATURES = ("masked_lm_positions", "masked_lm_ids", "masked_lm_weights")


def compact_predictions(arrays, width):
    """The prediction slots of packed rows ([N, K*P]) cut to ``width``, each row's real ones
    first and in their order: the same predictions, in a narrower array."""
    weights = np.asarray(arrays["masked_lm_weights"])
    real = (weights != 0).sum(axis=1)
    if real.size and real.max() > width:
        raise ValueError("a row has %d predictions, more than %d slots" % (real.max(), width))
    order = np.argsort(weights == 0, axis=1, kind="stable")[:, :width]
    out = dict(arrays)
    for name in PREDICTION_FEATURES:
        out[name] = np.take_along_axis(np.asarray(arrays[name]), order, axis=1)
    return out


MAX_SEQUENCES_PER_PACK = 16  # rows of seq-512 Wikipedia records never hold more than 12 (docs/dataset.md)
ROWS_PER_BLOCK = 4096  # rows packed and written at a time: memory stays bounded whatever the file's size


def row_bytes(max_seq_length, max_predictions_per_seq, max_sequences_per_pack):
    """Bytes one row takes in the file."""
    s, k, p = max_seq_length, max_sequences_per_pack, max_predictions_per_seq
    size = {"input_ids": s, "segment_ids": s, "input_mask": s, "position_ids": s, "masked_lm_positions": k * p,
            "masked_lm_ids": k * p, "masked_lm_weights": k * p, "next_sentence_labels": k, "nsp_positions": k}
    return sum(np.dtype(STORAGE[name]).itemsize * n for name, n in size.items()) + 4  # + its row_crc32c


def pack_file(input_path, output_path, max_seq_length, max_predictions_per_seq, max_sequences_per_pack, seed):
    """Pack one TFRecord file into one packed HDF5 file (rows in a seeded random order); return
    (sequences, rows, real tokens)."""
    from mlperf_bert.dataset.example import decode_pretraining_batch
    from mlperf_bert.dataset.hdf5 import (ROW_CHECKSUMS, Checksums, name_attr, new_temporary_file, refuse_unstorable,
                                          row_checksums)
    from mlperf_bert.dataset.tfrecord import read_records
    from mlperf_bert.fileio import atomic_path
    try:
        records = list(read_records(input_path))
        if not records:
            raise UserError("%s holds no records: check --input" % input_path)
        arrays = decode_pretraining_batch(records, max_seq_length, max_predictions_per_seq,
                                          where=lambda i: "%s: record %d" % (input_path, i))
        for name in ("input_ids", "masked_lm_ids"):  # named by its record here, not by the row it lands in
            refuse_unstorable(name, arrays[name], STORAGE[name], lambda i: "%s: record %d" % (input_path, i))
    except UserError as e:
        raise InputRefused(str(e)) from None
    del records
    lengths = sequence_lengths(arrays["input_mask"])
    groups = pack_groups(lengths, max_seq_length, max_sequences_per_pack)
    order = np.random.Generator(np.random.PCG64([seed, zlib_crc(os.path.basename(input_path))])).permutation(
        len(groups))
    groups = [groups[i] for i in order]
    n, k, p = len(groups), max_sequences_per_pack, max_predictions_per_seq
    shapes = {name: (n, max_seq_length) for name in ("input_ids", "segment_ids", "input_mask", "position_ids")}
    shapes.update({name: (n, k * p) for name in PREDICTION_FEATURES})
    shapes.update(next_sentence_labels=(n, k), nsp_positions=(n, k))
    needed = n * row_bytes(max_seq_length, max_predictions_per_seq, max_sequences_per_pack)
    # (HDF5 writes its metadata as the file closes: a disk full there is new_temporary_file's one line)
    with atomic_path(output_path, needed) as tmp, new_temporary_file(tmp) as h:
        dsets = {name: h.create_dataset(name, shape=shapes[name], dtype=STORAGE[name]) for name in PACKED_FEATURES}
        dsets[ROW_CHECKSUMS] = h.create_dataset(ROW_CHECKSUMS, shape=(n,), dtype=np.uint32)
        sums, most_predictions = Checksums(), 0
        for start in range(0, n, ROWS_PER_BLOCK):
            packed = pack_arrays(arrays, groups[start:start + ROWS_PER_BLOCK], max_sequences_per_pack)
            block = {}
            for name in PACKED_FEATURES:
                values = packed[name]
                if name != "masked_lm_weights":
                    info = np.iinfo(STORAGE[name])
                    if values.min() < info.min or values.max() > info.max:
                        raise InputRefused("%s: %s holds %d..%d, outside %s" % (
                            input_path, name, values.min(), values.max(), np.dtype(STORAGE[name]).name))
                block[name] = stored = values.astype(STORAGE[name])
                dsets[name][start:start + len(stored)] = stored
                sums.update(name, stored)
            crcs = row_checksums(block, PACKED_FEATURES)
            dsets[ROW_CHECKSUMS][start:start + len(crcs)] = crcs
            sums.update(ROW_CHECKSUMS, crcs)
            most_predictions = max(most_predictions, int((packed["masked_lm_weights"] != 0).sum(axis=1).max()))
        sums.write(h)
        h.attrs.update(max_seq_length=max_seq_length, max_predictions_per_seq=max_predictions_per_seq,
                       max_sequences_per_pack=max_sequences_per_pack, num_sequences=len(lengths),
                       num_rows=n, packing_rate=len(lengths) / n, seed=seed,
                       max_predictions_per_row=most_predictions, source_file=name_attr(input_path))
    return len(lengths), n, int(lengths.sum())


def zlib_crc(text):
    import zlib
    return zlib.crc32(text.encode("utf-8", "surrogateescape"))  # a name's own bytes, UTF-8 or not


def is_packed(path):
    """Whether ``path`` is a packed HDF5 file (made by ``pack``); an unreadable ``.hdf5`` file is
    one UserError saying so (not taken for an unpacked file)."""
    if not path.endswith((".hdf5", ".h5")):
        return False
    from mlperf_bert.dataset.hdf5 import open_file
    with open_file(path) as h:
        return "max_sequences_per_pack" in h.attrs


def packing_rate(files):
    """Real sequences per row over all the packed ``files``."""
    attrs = [read_attrs(f) for f in files]
    return sum(a["num_sequences"] for a in attrs) / sum(a["num_rows"] for a in attrs)


def read_attrs(path):
    """The attributes of a packed file (dict), or a one-line UserError."""
    from mlperf_bert.dataset.hdf5 import open_file
    with open_file(path) as h:
        if "max_sequences_per_pack" not in h.attrs:
            raise UserError("%s is not a packed file (no max_sequences_per_pack attribute): make packed rows "
                            "with python -m mlperf_bert pack" % path)
        try:
            attrs = {name: h.attrs[name] for name in ATTRS}
        except (OSError, KeyError) as e:
            raise UserError("%s: packed file without its attributes (%s): it is damaged, pack it again" % (path, e))
        for name, value in attrs.items():
            # pack writes each as one number (packing_rate a float, the others integers): an array, a
            # string (a damaged or hand-made file) was numpy's traceback where the value was used
            kinds = "iuf" if name == "packing_rate" else "iu"
            if np.ndim(value) != 0 or np.asarray(value).dtype.kind not in kinds:
                raise UserError("%s: attribute %s is %r, not %s: the file is damaged, pack it again"
                                % (path, name, value, "a number" if name == "packing_rate" else "an integer"))
            attrs[name] = np.asarray(value).item()
        missing = [n for n in PACKED_FEATURES if n not in h]
    if missing:
        raise UserError("%s: packed file without dataset %s: it is damaged, pack it again"
                        % (path, ", ".join(missing)))
    return attrs


def read_packed(path):
    """All rows of a packed file as arrays of the format (int64, weights float32)."""
    from mlperf_bert.dataset.hdf5 import open_file
    read_attrs(path)
    with open_file(path) as h:
        return {name: h[name][:].astype(np.float32 if name == "masked_lm_weights" else np.int64)
                for name in PACKED_FEATURES}


# ---------------------------------------------------------------- the pack command

class InputRefused(UserError):
    """``pack_file``'s refusal of its input (a record damaged deep in a file, values a packed row
    cannot store): the command then removes the files this run made, as if it had refused the
    input at its start (a rerun packs every input again). Any other error (a full disk, a signal)
    keeps the finished files, as every command does."""


def _pack_job(job):
    return pack_file(*job)


# What pack_file imports on its way (tests/test_packing.py checks that it imports nothing else): a
# spawned worker imports them before its first job, while a SIGTERM still ends it at once
# (``call_in_worker``).
WORKER_IMPORTS = ("h5py", "numpy.random", "numpy.ma", "mlperf_bert.dataset.example", "mlperf_bert.dataset.hdf5",
                  "mlperf_bert.dataset.tfrecord", "mlperf_bert.fileio")


OUTPUT_SUFFIX = ".packed.hdf5"
RECORD_NAME = ".pack.json"  # run_record: what pack runs wrote in --output_dir, and whether the last finished


def _load_record(output_dir):
    from mlperf_bert.dataset import run_record
    return run_record.load(output_dir, RECORD_NAME, "pack", lambda name: name.endswith(OUTPUT_SUFFIX),
                           "remove it and rerun the pack command that wrote %s" % output_dir)


def unfinished_run(folder):
    """Why the packed files of ``folder`` are not those of a finished pack run, with the fix (a
    phrase), or None: the run that wrote them was killed or stopped midway (each of its files is
    complete, but not all of them are there), or a file it wrote is missing. A folder no pack run
    wrote into (packed files of an older version, or copied alone) has no record and passes."""
    from mlperf_bert.dataset import run_record
    names, finished = _load_record(folder)
    # (pack's record always says whether its run finished: one that does not was not written by it)
    why = run_record.unfinished(folder, RECORD_NAME, names, finished is True)
    return "an unfinished pack run: %s: rerun the same pack command to finish it" % why if why else None


def refuse_unfinished(files):
    """UserError when a packed file of ``files`` lies in the folder of a pack run that did not finish:
    the files there would be taken for the whole set (training on a part of the data without a word)."""
    for folder in sorted({os.path.normpath(os.path.dirname(f) or ".") for f in files}):
        why = unfinished_run(folder)
        if why:
            raise UserError("--input_file: folder %s holds %s" % (folder, why))


def output_paths(files, output_dir):
    """One ``<input name>.packed.hdf5`` per input in ``output_dir``; an input given twice, or two
    inputs of one name (whose outputs would overwrite each other), is a UserError."""
    from mlperf_bert.fileio import DERIVED_NAME_BYTES, refuse_long_name, refuse_repeated_files
    refuse_repeated_files(files, "--input")
    seen = {}
    for f in files:
        name = os.path.basename(f)
        # its output's name is its own: refused before anything is packed (a worker's h5py traceback). In
        # output_dir, where it is written (an input's own deep folder was refused, its output's path short)
        refuse_long_name(os.path.join(output_dir, name), "--input file", len(OUTPUT_SUFFIX) + DERIVED_NAME_BYTES,
                         "NAME%s.tmp-PID, the temporary its output is written under" % OUTPUT_SUFFIX, f)
        if name in seen:
            raise UserError("--input files %s and %s have one name, so both would be packed into %s: pack each "
                            "folder into its own --output_dir" % (seen[name], f, name + ".packed.hdf5"))
        seen[name] = f
    return [os.path.join(output_dir, os.path.basename(p) + OUTPUT_SUFFIX) for p in files]


def main(argv):
    from mlperf_bert import flags
    from mlperf_bert.dataset.example import check_first_records
    from mlperf_bert.dataset.hdf5 import is_hdf5_file, refuse_hdf5_inputs
    from mlperf_bert.dataset.tfrecord import expand_paths, refuse_copies, scan_digests
    from mlperf_bert.fileio import new_dirs_removed_on_error, refuse_overwriting_inputs, refuse_replacing_another_kind
    from mlperf_bert.locking import lock_dir
    fv = flags.FlagValues()
    flags.DEFINE_string("input", None, "TFRecord file(s) of unpacked sequences: comma list or glob", flag_values=fv)
    flags.DEFINE_string("output_dir", None, "directory (made if missing) for one <input name>.packed.hdf5 per "
                        "input", flag_values=fv)
    flags.DEFINE_string("output", None, "removed: use --output_dir", flag_values=fv)
    flags.DEFINE_integer("max_seq_length", 512, "row length (the records' sequence length)", flag_values=fv)
    flags.DEFINE_integer("max_predictions_per_seq", 76, "masked positions per record", flag_values=fv)
    flags.DEFINE_integer("max_sequences_per_pack", 3, "at most this many sequences per row (1..%d)"
                         % MAX_SEQUENCES_PER_PACK, flag_values=fv)
    flags.DEFINE_integer("seed", 12345, "seed of the row order (>= 0)", flag_values=fv)
    flags.DEFINE_integer("num_workers", None, "input files packed in parallel (default: all usable cores)",
                         flag_values=fv)
    flags.DEFINE_bool("progress", True, "show a progress bar", flag_values=fv)
    flags.parse(fv, argv, positional=False)
    if fv.output is not None:
        raise UserError("--output is gone: pack writes one <input name>.packed.hdf5 per input into a directory; "
                        "give --output_dir=%s" % (fv.output if not fv.output.endswith((".hdf5", ".h5"))
                                                  else os.path.dirname(fv.output) or "."))
    for name in ("input", "output_dir"):
        if fv[name].value is None:
            raise UserError("flag --%s is required" % name)
    for name, low in (("max_seq_length", 1), ("max_predictions_per_seq", 1), ("seed", 0), ("num_workers", 1)):
        if fv[name].value is not None and fv[name].value < low:
            raise UserError("--%s=%d must be at least %d" % (name, fv[name].value, low))
    from mlperf_bert.dataset.example import check_shape
    check_shape(fv.max_seq_length, fv.max_predictions_per_seq)  # 2**40 was a MemoryError of the decoder
    if fv.seed >= 2 ** 63:  # each output file records it as a 64-bit integer
        raise UserError("--seed=%d must be below 2**63 (%d): give a smaller seed" % (fv.seed, 2 ** 63))
    if not 1 <= fv.max_sequences_per_pack <= MAX_SEQUENCES_PER_PACK:
        raise UserError("--max_sequences_per_pack=%d must be 1..%d (each allowed sequence adds "
                        "--max_predictions_per_seq slots to every row; seq-512 Wikipedia rows never hold more "
                        "than 12, and 3 gives nearly all the gain)" % (fv.max_sequences_per_pack,
                                                                      MAX_SEQUENCES_PER_PACK))
    if os.path.exists(fv.output_dir) and not os.path.isdir(fv.output_dir):
        raise UserError("--output_dir=%s is a file: give a directory (made if missing)" % fv.output_dir)
    files = expand_paths(fv.input, "--input file")
    refuse_hdf5_inputs(files, "pack")
    outputs = output_paths(files, fv.output_dir)
    refuse_overwriting_inputs(outputs, files, "--output_dir")
    for o in outputs:  # a mistyped --output_dir's own files (notes, a TFRecord of that name) are not replaced
        refuse_replacing_another_kind(o, is_hdf5_file, "an HDF5 file", "", "give another --output_dir, or remove it")
    # before anything is made: an empty input, a file of another kind, records of another shape
    check_first_records(files, fv.max_seq_length, fv.max_predictions_per_seq)
    # a shard and its copy under another name: its sequences packed twice, trained on twice an epoch
    refuse_copies(files, scan_digests(files)[1], "--input")
    # one run per output directory (made if missing, and removed again by a refusal if this run made it)
    with new_dirs_removed_on_error(fv.output_dir), lock_dir(fv.output_dir, "--output_dir"):
        new = [o for o in outputs if not os.path.lexists(o)]
        results = _pack_recorded(files, outputs, new, fv)
    seqs, rows, tokens = (sum(r[i] for r in results) for i in range(3))
    slots = fv.max_seq_length
    print("packed %d sequences into %d rows of %d tokens: %.4f sequences per row; padding %.1f%% of token "
          "positions before, %.1f%% after; wrote %d file(s) to %s"
          % (seqs, rows, slots, seqs / rows, 100 * (1 - tokens / (seqs * slots)), 100 * (1 - tokens / (rows * slots)),
             len(outputs), fv.output_dir))
    return 0


def _pack_recorded(files, outputs, new, fv):
    """``_pack_all`` with the run's record (``RECORD_NAME``) saying, from before its first output,
    that it has not finished, and at its end that it has."""
    import contextlib
    from mlperf_bert.dataset import run_record
    record = os.path.join(fv.output_dir, RECORD_NAME)
    had, (wrote, finished) = os.path.exists(record), _load_record(fv.output_dir)
    # an earlier run's files still there are the set's too (one removed since is no longer)
    names = {n for n in wrote if os.path.lexists(os.path.join(fv.output_dir, n))}
    names |= {os.path.basename(o) for o in outputs}
    run_record.write(fv.output_dir, RECORD_NAME, names, finished=False)
    try:
        results = _pack_all(files, outputs, fv)
    except BaseException as e:
        if isinstance(e, InputRefused):
            for o in new:
                if os.path.lexists(o):
                    os.remove(o)
        if len(new) == len(outputs) and not any(os.path.lexists(o) for o in new):
            # stopped before its first output (or its outputs removed again): the folder is as it was,
            # an earlier run's finished set usable, a folder this run made empty (and removed)
            with contextlib.suppress(OSError, UserError):  # (the error that stopped the run is the one to tell)
                if had:
                    run_record.write(fv.output_dir, RECORD_NAME, wrote, finished)
                else:
                    os.remove(record)
        raise
    run_record.write(fv.output_dir, RECORD_NAME, names, finished=True)
    return results


def _pack_all(files, outputs, fv):
    from mlperf_bert.fileio import usable_cores
    from mlperf_bert.progress import bar as progress_bar
    jobs = [(p, o, fv.max_seq_length, fv.max_predictions_per_seq, fv.max_sequences_per_pack, fv.seed)
            for p, o in zip(files, outputs)]
    workers = max(1, min(fv.num_workers or usable_cores(), len(jobs)))
    results = []
    with progress_bar(total=len(jobs), unit="file", desc="pack", disable=not fv.progress) as bar:
        if workers == 1:
            for job in jobs:
                results.append(_pack_job(job))
                bar.update(1)
        else:
            from mlperf_bert.errors import call_in_worker, worker_pool
            with worker_pool(workers, "spawn") as pool:
                for r in pool.imap(call_in_worker, [("mlperf_bert.dataset.packing", "_pack_job", job)
                                                    for job in jobs]):
                    results.append(r)
                    bar.update(1)
    return results

