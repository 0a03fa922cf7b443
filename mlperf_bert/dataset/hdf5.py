"""``to-hdf5``: pre-training TFRecords -> one HDF5 file, and the reader for it.

One dataset per feature, named as the feature, shape (N, length) (``next_sentence_labels``
is (N,)), examples in input order, contiguous layout so one example is one small read.
Integer features use the smallest unsigned type their values need (checked, never
truncated); ``masked_lm_weights`` stays float32. Reading back with ``read_examples`` or
``iter_batches`` gives int64/float32 arrays equal to decoding the TFRecords.

Every dataset carries a ``crc32c`` attribute, the CRC-32C of its stored bytes (C order,
little-endian) written as it was made, here and by ``pack``: HDF5 has no checksum of its own
over data, so ``--check_data=full`` verifies it (``verify_checksums``), as TFRecords' CRCs are.
The ``row_crc32c`` dataset holds one CRC-32C per example (row): its stored bytes, feature after
feature in file order. The loaders check every row they read against it (``check_rows``), so
damage is caught mid-run under the default ``--check_data=headers``, as a TFRecord's is.
"""
import contextlib
import errno
import os
import re

import numpy as np

from mlperf_bert import flags
from mlperf_bert.errors import UserError
from mlperf_bert.dataset.example import (PRETRAINING_FEATURES, check_first_records, check_shape, decode_pretraining_batch,
                                         feature_lengths)
from mlperf_bert.fileio import (atomic_path, new_dirs_removed_on_error, refuse_overwriting_inputs,
                                refuse_repeated_files, refuse_replacing_another_kind)
from mlperf_bert.locking import lock_file
from mlperf_bert.dataset.tfrecord import expand_paths, read_records, refuse_copies, scan_digests

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
PACKED_ONLY = ("position_ids", "nsp_positions")  # datasets only packed files have (dataset/packing.py)


CHECKSUM_ATTR = "crc32c"
ROW_CHECKSUMS = "row_crc32c"
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def _le_bytes(values):
    """The stored bytes of an array: C order, little-endian."""
    values = np.ascontiguousarray(values)
    return values.astype(values.dtype.newbyteorder("<"), copy=False).data.cast("B")


def row_checksums(stored, names):
    """CRC-32C of each row of ``stored`` ({name: [n, ...] array as stored}): the row's bytes of
    every feature in ``names``, one after the other."""
    from crc32c import crc32c
    n = len(stored[names[0]])
    rows = np.concatenate([np.asarray(_le_bytes(stored[name])).reshape(n, -1) for name in names], axis=1)
    return np.fromiter((crc32c(row) for row in rows), np.uint32, n)


def check_rows(path, stored, names, crcs, rows, what="record"):
    """Raise one UserError naming ``path`` and the first row whose bytes do not match its stored
    CRC-32C (``crcs``, for row numbers ``rows``)."""
    bad = np.flatnonzero(row_checksums(stored, names) != np.asarray(crcs, np.uint32))
    if bad.size:
        packed = what == "row"
        raise UserError("%s: %s %d does not match the checksum written when the file was made: the file is "
                        "damaged, %s" % (path, what, rows[int(bad[0])], remake_hint(path, packed)))


def read_rows(h, path, names, rows, what="record"):
    """{name: stored array} of ``rows`` (increasing indices) of a file from ``open_file`` (its
    datasets' rows agree), checked against its row checksums when it has them; a read error is one
    UserError naming the file."""
    try:
        stored = {name: h[name][rows] for name in names}
        crcs = h[ROW_CHECKSUMS][rows] if ROW_CHECKSUMS in h else None
    except (OSError, ValueError, IndexError) as e:
        raise UserError("cannot read HDF5 file %s (%s): it is truncated or damaged: %s"
                        % (path, str(e).splitlines()[0], remake_hint(path, what == "row")))
    if crcs is not None:
        check_rows(path, stored, names, crcs, rows, what)
    return stored


class Checksums:
    """CRC-32C of each dataset's bytes, fed block by block in row order as the file is written."""

    def __init__(self):
        self.crcs = {}

    def update(self, name, stored):
        from crc32c import crc32c
        self.crcs[name] = crc32c(_le_bytes(stored), self.crcs.get(name, 0))

    def write(self, h):
        for name in h:
            h[name].attrs[CHECKSUM_ATTR] = np.uint32(self.crcs.get(name, 0))


def remake_hint(path, packed=None):
    """How to make ``path`` again: by what made it when known, else by its name."""
    if packed is None:
        packed = path.endswith((".packed.hdf5", ".packed.h5"))
        if not packed:
            return "make it again with to-hdf5 (or pack, if pack made it)"
    return "pack it again (python -m mlperf_bert pack)" if packed else "convert it again with to-hdf5"


def name_attr(path):
    """``path``'s file name as an attribute can hold it: UTF-8, a byte that is not (a Latin-1 name)
    written as ``\\xNN`` (h5py's encoder raised on it: a traceback)."""
    return os.fsencode(os.path.basename(path)).decode("utf-8", "backslashreplace")


def is_hdf5_file(path):
    """Whether ``path`` starts with the HDF5 signature (whatever its name); a UserError where this
    process may open no more files (that said "not an HDF5 file" of a good one)."""
    try:
        with open(path, "rb") as f:
            return f.read(8) == HDF5_SIGNATURE
    except OSError as e:
        if e.errno in (errno.EMFILE, errno.ENFILE):
            raise UserError("cannot open %s: %s: raise the open-file limit (ulimit -n), or give fewer files"
                            % (path, e.strerror)) from None
        return False


def open_file(path):
    """An open ``h5py.File`` for reading, or one UserError saying what is wrong and which
    command makes the file again."""
    import h5py

    def damaged(e):
        return UserError("cannot read HDF5 file %s (%s): it is truncated or damaged: %s"
                         % (path, (str(e).splitlines() or [type(e).__name__])[0], remake_hint(path)))
    try:
        h = h5py.File(path, "r")
    except OSError as e:
        if not os.path.exists(path):
            raise UserError("cannot read %s: no such file: check the path" % path)
        if os.path.isfile(path) and not is_hdf5_file(path):
            raise UserError("%s is not an HDF5 file: give a file that to-hdf5 or pack made" % path)
        raise damaged(e)
    try:
        _refuse_data_elsewhere(h, path)
        check_layout(h, path)
        _look_up_attributes(h)
    except (OSError, KeyError, RuntimeError, ValueError, TypeError) as e:
        # h5py's error of damaged metadata (an object header, a link table, a datatype, an attribute
        # message: a flipped byte), found as the datasets are listed and opened: was its traceback
        h.close()
        raise damaged(e) from None
    except BaseException:
        h.close()
        raise
    return h


def _look_up_attributes(h):
    """Whether each dataset carries its checksum, and whether the file is packed: what the readers
    ask next, asked here where h5py's error of a damaged attribute message is the file's one line
    (whether they are there only: a value read from a damaged message can crash the HDF5 library)."""
    return [CHECKSUM_ATTR in h[name].attrs for name in h], "max_sequences_per_pack" in h.attrs


def _refuse_data_elsewhere(h, path):
    """to-hdf5 and pack write every dataset into the file: a link, or a dataset stored in other files
    (external or virtual), is a path written in the file that h5py would follow out of its folder."""
    import h5py
    for name in h:
        link = h.get(name, getlink=True)
        where = None
        if isinstance(link, (h5py.SoftLink, h5py.ExternalLink)):
            where = "a link to %s" % ("%s in %s" % (link.path, link.filename) if isinstance(link, h5py.ExternalLink)
                                      else link.path)
        elif isinstance(h[name], h5py.Dataset) and (h[name].external or h[name].is_virtual):
            where = "stored in other files (%s)" % (", ".join(str(e[0]) for e in h[name].external or ())
                                                   or "a virtual dataset")
        if where:
            raise UserError("%s: dataset %s is %s: give a file that to-hdf5 or pack made, which holds its own data"
                            % (path, name, where))


# Each dataset's columns, by what they count (None: one value a row), and whether it holds integers
# (else floats), as to-hdf5 and pack write them. Datasets of one count have one width.
_TOKENS, _PREDICTIONS, _SEQUENCES = "tokens", "prediction slots", "sequences"
UNPACKED_LAYOUT = {"input_ids": (_TOKENS, True), "input_mask": (_TOKENS, True), "segment_ids": (_TOKENS, True),
                   "masked_lm_positions": (_PREDICTIONS, True), "masked_lm_ids": (_PREDICTIONS, True),
                   "masked_lm_weights": (_PREDICTIONS, False), "next_sentence_labels": (None, True),
                   ROW_CHECKSUMS: (None, True)}
PACKED_LAYOUT = dict(UNPACKED_LAYOUT, position_ids=(_TOKENS, True), next_sentence_labels=(_SEQUENCES, True),
                     nsp_positions=(_SEQUENCES, True))
# pack's attributes that are a width of its datasets (what the width counts)
_SHAPE_ATTRS = {"max_seq_length": _TOKENS, "max_sequences_per_pack": _SEQUENCES}


# NVIDIA's MLPerf BERT (training_results v2.1-v5.0, input_preprocessing/) stores a record as one
# variable-length row a dataset (h5py vlen int16/int8: its tokens unpadded, its filled prediction
# slots; no input_mask, no weights): convert_fixed2variable.py and chop_hdf5_files_to_varlength.py
# (hdf5_*_shards_varlength, eval_varlength), and packed_data/create_packed_trainset.py, several
# records a row, told apart by packed_input_len. Its shards exist on users' storage; the checks
# below called them damaged (shape (rows,)) and a packed one, named part_00000, a TFRecord to rename.
class NvidiaLayout(UserError):
    """A file of NVIDIA's variable-length or packed layout: intact, but not one this project reads."""


def refuse_nvidia_layout(h, path):
    """Refuse an open file of NVIDIA's layout in one line naming it and this project's command."""
    import h5py
    ds = h.get("input_ids")
    if "input_mask" in h or not isinstance(ds, h5py.Dataset) or h5py.check_vlen_dtype(ds.dtype) is None:
        return  # (a vlen input_ids beside an input_mask is no layout of theirs: check_layout's damaged file)
    if "packed_input_len" in h:
        raise NvidiaLayout("%s is NVIDIA's MLPerf BERT packed data (create_packed_trainset.py: variable-length "
                           "rows, sequences told apart by packed_input_len), which this project does not read: "
                           "pack the TFRecords with python -m mlperf_bert pack (docs/dataset.md section 6)" % path)
    raise NvidiaLayout("%s is NVIDIA's MLPerf BERT variable-length HDF5 (convert_fixed2variable.py: one unpadded "
                       "row a record, no input_mask), which this project does not read: convert the TFRecords "
                       "with python -m mlperf_bert to-hdf5 (docs/dataset.md section 5)" % path)


def refuse_nvidia_file(path):
    """``refuse_nvidia_layout`` for an HDF5 file not yet opened as one (named as no HDF5 file is)."""
    import h5py
    try:
        h = h5py.File(path, "r")
    except OSError:
        return
    # damaged metadata (open_file's errors of it): the caller's own line
    with h, contextlib.suppress(OSError, KeyError, RuntimeError, ValueError, TypeError):
        refuse_nvidia_layout(h, path)


def check_layout(h, path):
    """Refuse, in one line naming the file and the dataset, an open file whose datasets are not laid
    out as to-hdf5 or pack writes them (``UNPACKED_LAYOUT``, ``PACKED_LAYOUT``: their dimensions,
    integer or float, rows and widths agreeing), whose pack attributes disagree with the shapes, or
    that holds no rows. Only metadata is read. Missing datasets are left to the readers, which name
    the command that makes the file."""
    import h5py
    refuse_nvidia_layout(h, path)
    packed = "max_sequences_per_pack" in h.attrs or any(n in h for n in PACKED_ONLY)
    layout = PACKED_LAYOUT if packed else UNPACKED_LAYOUT
    fix = "it is damaged, or not made by %s: %s" % ("pack" if packed else "to-hdf5", remake_hint(path, packed))
    widths, rows = {}, {}
    for name in h:
        ds = h[name]
        count, integer = layout.get(name, (None, None))
        shape = "(rows,)" if count is None else "(rows, %s)" % count
        if not isinstance(ds, h5py.Dataset):
            raise UserError("%s: %s is a group, expected a dataset %s: %s" % (path, name, shape, fix))
        if ds.ndim == 0:
            raise UserError("%s: dataset %s is a scalar, expected %s: %s" % (path, name, shape, fix))
        rows[name] = ds.shape[0]
        if integer is None:  # not one of ours: only its rows matter (verify_checksums reads them)
            continue
        if ds.ndim != (1 if count is None else 2):
            raise UserError("%s: dataset %s has shape %s, expected %s: %s" % (path, name, ds.shape, shape, fix))
        if ds.dtype.kind not in ("iu" if integer else "f"):
            raise UserError("%s: dataset %s holds %s, expected %s: %s"
                            % (path, name, ds.dtype, "integers" if integer else "floats", fix))
        if count is not None:
            first = widths.setdefault(count, (name, ds.shape[1]))
            if ds.shape[1] != first[1]:
                raise UserError("%s: dataset %s has %d %s a row, %s has %d: %s"
                                % (path, name, ds.shape[1], count, first[0], first[1], fix))
    ours = {rows[name] for name in rows if name in layout}
    if len(ours) == 1 and len(set(rows.values())) > 1:  # a dataset another tool added: not a damaged file
        other = next(name for name in rows if rows[name] not in ours)
        raise UserError("%s: dataset %s has %d rows, the records' datasets %d: it is no dataset %s writes: remove it, "
                        "or %s" % (path, other, rows[other], ours.pop(), "pack" if packed else "to-hdf5",
                                   remake_hint(path, packed)))
    if len(set(rows.values())) > 1:  # (h5py's fancy read of a row past a shorter dataset: an IndexError)
        raise UserError("cannot read HDF5 file %s (its datasets have %s rows): it is truncated or damaged: %s"
                        % (path, " and ".join(map(str, sorted(set(rows.values())))), remake_hint(path, packed)))
    n = next(iter(rows.values()), None)
    if n == 0:  # as to-hdf5 and pack refuse an input of no record: a wrong path or a failed run's output
        raise UserError("%s holds no %s: check the paths, or make it again" % (path, "rows" if packed else "records"))
    if packed:
        most = h.attrs.get("max_predictions_per_row")
        if _PREDICTIONS in widths and np.ndim(most) == 0 and np.asarray(most).dtype.kind in "iu" \
                and not 0 < most <= widths[_PREDICTIONS][1]:
            # the loader keeps that many slots a row, and the warm-up allocates them: a flipped high
            # byte trained on (extra empty slots) or asked the device for terabytes
            raise UserError("%s: attribute max_predictions_per_row is %s, but its rows hold %d prediction slots: the "
                            "file is damaged, %s" % (path, most, widths[_PREDICTIONS][1], remake_hint(path, packed)))
        found = {attr: widths[count][1] for attr, count in _SHAPE_ATTRS.items() if count in widths}
        if found.get("max_sequences_per_pack") and _PREDICTIONS in widths:
            found["max_predictions_per_seq"] = widths[_PREDICTIONS][1] / found["max_sequences_per_pack"]
        if n is not None:
            found["num_rows"] = n
        for attr, value in found.items():
            if attr in h.attrs and np.ndim(h.attrs[attr]) == 0 and h.attrs[attr] != value:
                raise UserError("%s: attribute %s is %s, but its datasets' shapes say %s: the file is damaged, %s"
                                % (path, attr, h.attrs[attr], "%g" % value, remake_hint(path, packed)))


def refuse_hdf5_inputs(files, command):
    """The TFRecord readers would call an HDF5 file's first bytes a corrupt record: say what it is."""
    for f in files:
        if is_hdf5_file(f):
            raise UserError("%s is an HDF5 file, not TFRecords: %s reads the TFRecords that make-dataset or "
                            "create_pretraining_data.py write" % (f, command))


def verify_checksums(path, packed=False, block_bytes=1 << 24):
    """Compare every dataset of ``path`` with the CRC-32C written when it was made: one UserError
    naming the file, the dataset and the fix on a mismatch. False (nothing checked) for a file
    made before checksums were written."""
    from crc32c import crc32c
    with open_file(path) as h:
        names = sorted(h)
        bare = [n for n in names if CHECKSUM_ATTR not in h[n].attrs]
        if not names or bare == names:
            return False
        if bare:  # to-hdf5 and pack give every dataset one: a damaged attribute name (a flipped byte)
            raise UserError("%s: dataset %s carries no checksum, where its other datasets do: the file is damaged, %s"
                            % (path, bare[0], remake_hint(path, packed)))
        for name in names:
            ds = h[name]
            row = max(1, int(np.prod(ds.shape[1:], dtype=np.int64)) * ds.dtype.itemsize)
            step = max(1, block_bytes // row)
            crc = 0
            try:
                for i in range(0, ds.shape[0], step):
                    crc = crc32c(_le_bytes(ds[i:i + step]), crc)
            except OSError as e:
                raise UserError("cannot read %s of HDF5 file %s (%s): it is truncated or damaged: %s"
                                % (name, path, str(e).splitlines()[0], remake_hint(path, packed)))
            if crc != int(ds.attrs[CHECKSUM_ATTR]):
                raise UserError("%s: dataset %s does not match the checksum written when the file was made: "
                                "the file is damaged, %s" % (path, name, remake_hint(path, packed)))
    return True


_H5_ERRNO = re.compile(r"\berrno = (\d+)")


def _as_os_error(e, path):
    """h5py's failed write as the OSError it wraps, naming ``path`` (a flush or a close raises
    RuntimeError, with ``errno = N`` in its message only), so that the atomic writer says it in one
    line (a full disk); ``e`` itself when it holds no errno."""
    if isinstance(e, OSError) and e.errno:
        return e
    m = _H5_ERRNO.search(str(e)) if isinstance(e, RuntimeError) else None
    return OSError(int(m.group(1)), os.strerror(int(m.group(1))), path) if m else e


@contextlib.contextmanager
def new_temporary_file(tmp):
    """``h5py.File(tmp, "w")`` for an atomic writer's temporary ``tmp``: flushed at the end of the
    block, then closed. HDF5 writes its metadata as it flushes or closes: a disk that filled there
    (or a write past ``ulimit -f``) raised a RuntimeError (a traceback), and the close after it left
    the library to crash as the interpreter freed the file (SIGSEGV, exit -11). On any error the
    temporary, about to be removed, gets no more writes: HDF5's file descriptor is pointed at
    /dev/null (no disk, no size limit), so that the close succeeds."""
    import h5py
    h = h5py.File(tmp, "w", driver="sec2")  # (not HDF5_DRIVER's: a descriptor _discard_writes can redirect)
    try:
        yield h
        h.flush()
    except BaseException as e:
        _discard_writes(h, tmp)
        with contextlib.suppress(Exception):  # the first error is the one to tell
            h.close()
        err = _as_os_error(e, tmp)
        if err is not e:
            raise err from e
        raise
    h.close()


def _discard_writes(h, tmp):
    """Send what HDF5 writes to ``h`` from now on to /dev/null (emptying the file frees the disk but
    not room under a per-file size limit: a write's offset counts there). Only the default driver's
    handle is a descriptor (another's, HDF5_DRIVER=core or stdio, is some other number): the file
    is emptied there."""
    try:
        fd = h.id.get_vfd_handle() if h.driver == "sec2" else None
        if fd is not None and os.path.samestat(os.fstat(fd), os.stat(tmp)):
            null = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(null, fd)
            finally:
                os.close(null)
            return
    except Exception:
        pass
    with contextlib.suppress(OSError):
        os.truncate(tmp, 0)


def refuse_unstorable(name, values, dtype, where):
    """One UserError naming ``where(row)``, the record that holds it, for the first value of ``values``
    ([rows, ...], decoded records) that the integer ``dtype`` it is stored as cannot hold (a vocabulary
    of over 65,536 tokens): refused, never truncated. (It named the output and a block of its rows.)"""
    info = np.iinfo(dtype)
    values = np.asarray(values).reshape(len(values), -1)
    bad = (values < info.min) | (values > info.max)
    if bad.any():
        row = int(np.flatnonzero(bad.any(1))[0])
        raise UserError("%s: feature %s holds %d, outside %s, the type to-hdf5 and pack store it as: train on the "
                        "TFRecords themselves (the trainer reads them)"
                        % (where(row), name, values[row][bad[row]][0], np.dtype(dtype).name))


def _store(name, values, where):
    dtype = STORAGE_DTYPES[name]
    if name != "masked_lm_weights":
        refuse_unstorable(name, values, dtype, where)
    return values.astype(dtype)


def tfrecords_to_hdf5(input_files, output_file, max_seq_length, max_predictions_per_seq, block=4096,
                      progress=True):
    """Convert ``input_files`` (in order) into ``output_file``; return the number of examples."""
    if not os.path.basename(output_file):  # "out/": h5py's traceback on the temporary "out/.tmp-PID"
        bare = output_file.rstrip(os.sep) or os.sep
        raise UserError("--output=%s ends in '/', a folder's path: give the HDF5 file's path (e.g. %s)"
                        % (output_file, bare if os.path.isfile(bare) else os.path.join(output_file, "train.hdf5")))
    refuse_repeated_files(input_files, "--input")  # (its examples would be written twice)
    refuse_overwriting_inputs([output_file], input_files, "--output")
    refuse_replacing_another_kind(output_file, is_hdf5_file, "an HDF5 file")
    # Before the lock makes the output's folder, what can be checked without reading every record:
    # a refused input leaves nothing behind (one damaged further in: the folders made go again).
    total, tags = scan_digests(input_files)
    check_first_records(input_files, max_seq_length, max_predictions_per_seq)
    refuse_copies(input_files, tags, "--input")  # (after: two empty files hold no records, not the same ones)
    with new_dirs_removed_on_error(os.path.dirname(os.path.abspath(output_file))), lock_file(output_file, "--output"):
        return _convert(input_files, output_file, max_seq_length, max_predictions_per_seq, block, progress, total)


def _convert(input_files, output_file, max_seq_length, max_predictions_per_seq, block, progress, total):
    from mlperf_bert.progress import bar as progress_bar
    lengths = feature_lengths(max_seq_length, max_predictions_per_seq)
    needed = total * sum(np.dtype(STORAGE_DTYPES[n]).itemsize * (1 if n == "next_sentence_labels" else lengths[n])
                         for n in FEATURE_NAMES) + total * 4  # + row_crc32c
    with atomic_path(output_file, needed) as tmp, new_temporary_file(tmp) as h:
        h.attrs["max_seq_length"] = max_seq_length
        h.attrs["max_predictions_per_seq"] = max_predictions_per_seq
        h.attrs["source_files"] = [name_attr(p) for p in input_files]  # not where they were: same bytes anywhere
        dsets, sums = {}, Checksums()
        for name in FEATURE_NAMES:
            shape = (total,) if name == "next_sentence_labels" else (total, lengths[name])
            dsets[name] = h.create_dataset(name, shape=shape, dtype=STORAGE_DTYPES[name])
        dsets[ROW_CHECKSUMS] = h.create_dataset(ROW_CHECKSUMS, shape=(total,), dtype=np.uint32)
        pos = 0

        def flush(path, first, records):
            nonlocal pos
            if not records:
                return
            n = len(records)
            feats = _decode_block(path, first, records, max_seq_length, max_predictions_per_seq)
            block = {}
            for name in FEATURE_NAMES:
                arr = feats[name].reshape(-1) if name == "next_sentence_labels" else feats[name]
                block[name] = stored = _store(name, arr, lambda row: "%s: record %d" % (path, first + row))
                dsets[name][pos:pos + n] = stored
                sums.update(name, stored)
            dsets[ROW_CHECKSUMS][pos:pos + n] = crcs = row_checksums(block, FEATURE_NAMES)
            sums.update(ROW_CHECKSUMS, crcs)
            pos += n
            records.clear()

        with progress_bar(total=total, unit="rec", desc="to-hdf5", disable=not progress) as bar:
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
        sums.write(h)
    return total


def _decode_block(path, first, records, max_seq_length, max_predictions_per_seq):
    """Decode a block of records at once, the first being record ``first`` of ``path``."""
    return decode_pretraining_batch(records, max_seq_length, max_predictions_per_seq,
                                    where=lambda i: "%s: record %d" % (path, first + i))


def _as_decoded(name, arr):
    return arr.astype(np.float32 if name == "masked_lm_weights" else np.int64)


def read_examples(path, start=0, stop=None):
    """Examples ``[start, stop)`` of an HDF5 file as {feature: array}, int64 (weights float32).

    ``next_sentence_labels`` has shape (n, 1), like the decoded TFRecord feature. Each row is
    checked against its row checksum (when the file has them).
    """
    with open_file(path) as h:
        check_unpacked(h, path)
        try:
            stored = {name: h[name][start:stop] for name in FEATURE_NAMES}
            crcs = h[ROW_CHECKSUMS][start:stop] if ROW_CHECKSUMS in h else None
        except (OSError, KeyError) as e:
            raise UserError("cannot read HDF5 file %s (%s): %s" % (path, str(e).splitlines()[0], remake_hint(path)))
        if crcs is not None:
            check_rows(path, stored, FEATURE_NAMES, crcs, range(start, start + len(crcs)))
        return {name: _as_decoded(name, v).reshape(-1, 1) if name == "next_sentence_labels" else _as_decoded(name, v)
                for name, v in stored.items()}


def check_unpacked(h, path):
    """One line for a packed file (``pack`` output) where records are read, e.g. as the eval set."""
    if "max_sequences_per_pack" in h.attrs:
        raise UserError("%s holds packed rows (made by pack), but this input takes unpacked records (the eval set "
                        "is never packed): give its TFRecords or their to-hdf5 file" % path)
    packed_only = [n for n in PACKED_ONLY if n in h]
    if packed_only:  # pack's datasets without pack's attributes: not something the flags can fix
        raise UserError("%s has packed rows (dataset %s) but not the attributes pack writes: it is damaged or not a "
                        "packed file: pack it again (python -m mlperf_bert pack)" % (path, ", ".join(packed_only)))
    missing = [n for n in FEATURE_NAMES if n not in h]
    if missing:
        raise UserError("%s has no dataset %s: it is not a to-hdf5 file; convert the TFRecords with to-hdf5"
                        % (path, ", ".join(missing)))


def num_examples(path):
    with open_file(path) as h:
        check_unpacked(h, path)
        return int(h["input_ids"].shape[0])


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
    for name in ("max_seq_length", "max_predictions_per_seq"):
        if fv[name].value < 1:  # (h5py's "can't convert negative value to hsize_t" traceback)
            raise UserError("--%s=%d must be at least 1: give the records' (make-dataset's default: 512 and 76)"
                            % (name, fv[name].value))
    check_shape(fv.max_seq_length, fv.max_predictions_per_seq)  # 2**40 was a "no space left" for petabytes
    files = expand_paths(fv.input, "--input file")  # (a killed write's NAME.tmp-PID, a FIFO: refused there)
    refuse_hdf5_inputs(files, "to-hdf5")
    n = tfrecords_to_hdf5(files, fv.output, fv.max_seq_length, fv.max_predictions_per_seq)
    print("wrote %d examples from %d file(s) to %s" % (n, len(files), fv.output))
    return 0
