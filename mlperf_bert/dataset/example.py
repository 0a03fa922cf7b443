"""tf.train.Example encoding and decoding without TensorFlow.

Features are written in a fixed order (``PRETRAINING_FEATURES``), so the same
example always gives the same bytes; the reference's order varies per process.
"""
import importlib
import struct

from mlperf_bert.errors import UserError
from mlperf_bert.dataset.native import fastrng
from mlperf_bert.dataset.tfrecord import read_records

_fastrng = fastrng()  # the optional C accelerator (None: not built)


class _LazyModule:
    """A module imported on first attribute use (then bound in its place)."""

    def __init__(self, name):
        self._name = name

    def __getattr__(self, attr):
        module = importlib.import_module(self._name)
        globals()["np"] = module
        return getattr(module, attr)


# The data generator's C path never touches NumPy; importing it lazily saves ~0.15 s of start-up.
np = _LazyModule("numpy")

# (name, kind, length key) in the order the reference's create_pretraining_data.py builds them.
PRETRAINING_FEATURES = (
    ("input_ids", "int64", "seq"),
    ("input_mask", "int64", "seq"),
    ("segment_ids", "int64", "seq"),
    ("masked_lm_positions", "int64", "pred"),
    ("masked_lm_ids", "int64", "pred"),
    ("masked_lm_weights", "float", "pred"),
    ("next_sentence_labels", "int64", 1),
)


MAX_SEQ_LENGTH = 2**31 - 1


def check_shape(max_seq_length, max_predictions_per_seq):
    """A one-line UserError unless a pre-training record of these lengths can exist."""
    if max_seq_length < 5:
        raise UserError("--max_seq_length=%d is too small: it must be at least 5 ([CLS] a [SEP] b [SEP])"
                        % max_seq_length)
    if max_seq_length > MAX_SEQ_LENGTH:  # the C kernel's positions are int32 (a traceback there)
        raise UserError("--max_seq_length=%d is too large: it must be at most %d (MLPerf uses 512)"
                        % (max_seq_length, MAX_SEQ_LENGTH))
    if max_predictions_per_seq < 0 or max_predictions_per_seq > max_seq_length:
        raise UserError("--max_predictions_per_seq=%d is %s for --max_seq_length=%d: it must be "
                        "between 0 and max_seq_length (MLPerf uses 76 with 512)"
                        % (max_predictions_per_seq, "below 0" if max_predictions_per_seq < 0 else "too large",
                           max_seq_length))


def feature_lengths(max_seq_length, max_predictions_per_seq):
    """{name: expected length} of a pre-training example."""
    size = {"seq": max_seq_length, "pred": max_predictions_per_seq}
    return {name: size.get(n, n) for name, _, n in PRETRAINING_FEATURES}


_VARINTS = []  # bytes of small varints, filled on first use


def _small_varints():
    if not _VARINTS:
        _VARINTS.extend(_varint_slow(v) for v in range(1 << 16))
    return _VARINTS


def _varint(v):
    if 0 <= v < 65536:
        return _small_varints()[v]
    return _varint_slow(v)


def _varint_slow(v):
    if v < 0:
        v += 1 << 64
    out = bytearray()
    while v > 0x7F:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def _field(num, payload):
    return _varint((num << 3) | 2) + _varint(len(payload)) + payload


def encode_example(features):
    """Serialize ``[(name, kind, values), ...]`` (kind 'int64' or 'float') in the given order."""
    entries = []
    for name, kind, values in features:
        if kind == "int64":
            packed = b"".join(_varint(int(v)) for v in values)
            feature = _field(3, _field(1, packed) if len(values) else b"")
        elif kind == "float":
            packed = np.asarray(values, dtype="<f4").tobytes()
            feature = _field(2, _field(1, packed) if len(values) else b"")
        else:
            raise ValueError("unknown feature kind %r" % kind)
        entries.append(_field(1, _field(1, name.encode()) + _field(2, feature)))
    return _field(1, b"".join(entries))


_ONE_F32 = struct.pack("<f", 1.0)
_ZERO_F32 = bytes(4)


def encode_pretraining_instance(input_ids, num_segment_a, positions, label_ids, is_random_next,
                                max_seq_length, max_predictions_per_seq):
    """The Example of one instance in the fixed feature order (pure-Python path of the generator).

    ``input_ids`` are the real tokens (padded here with zeros); the first ``num_segment_a``
    have segment id 0 ([CLS] a [SEP]), the rest 1.
    """
    v = _small_varints()
    try:
        return _encode_fast(input_ids, len(input_ids), num_segment_a, positions, label_ids,
                            len(positions), is_random_next, max_seq_length, max_predictions_per_seq,
                            v.__getitem__)
    except IndexError:  # an id beyond the small-varint table
        return _encode_fast(input_ids, len(input_ids), num_segment_a, positions, label_ids,
                            len(positions), is_random_next, max_seq_length, max_predictions_per_seq,
                            _varint)


def _encode_fast(input_ids, n, num_a, positions, label_ids, k, is_random_next, L, P, vb):
    zero, one = vb(0), vb(1)
    ints = (
        b"".join(map(vb, input_ids)) + zero * (L - n),
        one * n + zero * (L - n),
        zero * num_a + one * (n - num_a) + zero * (L - n),
        b"".join(map(vb, positions)) + zero * (P - k),
        b"".join(map(vb, label_ids)) + zero * (P - k),
    )
    entries = []
    for (name, kind, _), packed in zip(PRETRAINING_FEATURES, ints + (
            _ONE_F32 * k + _ZERO_F32 * (P - k), one if is_random_next else zero)):
        inner = _field(1, packed) if packed else b""
        feature = _field(3 if kind == "int64" else 2, inner)
        entries.append(_field(1, _field(1, name.encode()) + _field(2, feature)))
    return _field(1, b"".join(entries))


def _read_varint(buf, pos):
    result = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _messages(buf):
    """Yield (field number, value) of a protobuf message; length-delimited values as memoryview."""
    pos, end = 0, len(buf)
    while pos < end:
        key, pos = _read_varint(buf, pos)
        num, wire = key >> 3, key & 7
        if wire == 2:
            n, pos = _read_varint(buf, pos)
            if pos + n > end:
                raise ValueError("field overruns the message")
            yield num, buf[pos:pos + n]
            pos += n
        elif wire == 0:
            v, pos = _read_varint(buf, pos)
            yield num, v
        elif wire == 5:
            yield num, buf[pos:pos + 4]
            pos += 4
        elif wire == 1:
            yield num, buf[pos:pos + 8]
            pos += 8
        else:
            raise ValueError("unsupported wire type %d" % wire)


def decode_packed_varints(buf):
    """Decode a packed run of varints (non-negative, < 2**63) with NumPy."""
    a = np.frombuffer(buf, dtype=np.uint8)
    if a.size == 0:
        return np.zeros(0, dtype=np.int64)
    ends = np.flatnonzero(a < 0x80)
    if ends.size == 0 or ends[-1] != a.size - 1:
        raise ValueError("truncated varint")
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    if (ends - starts).max() == 0:
        return a.astype(np.int64)
    vals = (a & 0x7F).astype(np.int64)
    pos_in = np.arange(a.size) - np.repeat(starts, ends - starts + 1)
    vals <<= 7 * pos_in
    return np.add.reduceat(vals, starts)


def decode_example(data):
    """Parse a serialized tf.train.Example into {name: numpy array} (int64 or float32)."""
    out = {}
    buf = memoryview(data)
    try:
        for num, features in _messages(buf):
            if num != 1:
                continue
            for num2, entry in _messages(features):
                if num2 != 1:
                    continue
                name, value = None, np.zeros(0, dtype=np.int64)
                for num3, v in _messages(entry):
                    if num3 == 1:
                        name = bytes(v).decode()
                    elif num3 == 2:
                        value = _decode_feature(v)
                out[name] = value
    except (ValueError, IndexError) as e:
        raise ValueError("malformed tf.train.Example: %s" % e)
    return out


def _decode_feature(buf):
    for kind, lst in _messages(buf):
        parts = []
        for num, v in _messages(lst):
            if num != 1:
                continue
            if kind == 3:
                parts.append(np.array([v], dtype=np.int64) if isinstance(v, int)
                             else decode_packed_varints(v))
            elif kind == 2:
                parts.append(np.frombuffer(bytes(v), dtype="<f4"))
            elif kind == 1:
                parts.append(np.array([bytes(v)], dtype=object))
        if kind == 3:
            arr = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
            # int64 values are two's complement in 64 bits
            return arr.astype(np.uint64).view(np.int64) if arr.dtype != np.int64 else arr
        if kind == 2:
            return np.concatenate(parts).astype(np.float32) if parts else np.zeros(0, np.float32)
        return np.concatenate(parts) if parts else np.zeros(0, dtype=object)
    return np.zeros(0, dtype=np.int64)


def decode_pretraining_example(data, max_seq_length, max_predictions_per_seq, where="record"):
    """Decode one pre-training example, checked as ``decode_pretraining_batch`` checks it, into
    {name: array} (int64, masked_lm_weights float32) of the expected lengths; a refusal is one
    UserError naming ``where``."""
    batch = decode_pretraining_batch([data], max_seq_length, max_predictions_per_seq, where=lambda i: where)
    return {name: batch[name][0].astype(np.float32 if kind == "float" else np.int64)
            for name, kind, _ in PRETRAINING_FEATURES}


def _feature_payloads(data):
    """{name: (kind field, packed payload bytes)} of a serialized Example, in any feature order.

    Unpacked repeated values (valid protobuf, never written by TF) are re-packed.
    """
    found = {}
    for num, features in _messages(memoryview(data)):
        if num != 1:
            continue
        for num2, entry in _messages(features):
            if num2 != 1:
                continue
            name, kind, chunks = None, None, []
            for num3, v in _messages(entry):
                if num3 == 1:
                    name = bytes(v).decode()
                elif num3 == 2:
                    for kind, lst in _messages(v):
                        for num5, x in _messages(lst):
                            if num5 == 1:
                                chunks.append(_varint(x) if isinstance(x, int) else bytes(x))
            found[name] = (kind, b"".join(chunks))
    return found


_KINDS = {0: None, 1: "bytes", 2: "float", 3: "int64"}  # a Feature's kind field -> its list
# Why _fastrng.decode_batch refuses a record (its E_* codes) and _decode_batch_py the same.
MALFORMED, KIND, LENGTH, RANGE = range(4)


def _refusal(where, index, why, name=None, found=None, expected=None):
    """The one-line UserError of a record the batch decoder refuses, C or Python path alike.
    ``found``: for KIND the kind field, LENGTH the count, RANGE the value, MALFORMED a detail."""
    place = where(index)
    if why == MALFORMED:
        return UserError("%s: malformed tf.train.Example%s: the file is damaged, or not BERT pre-training "
                         "TFRecords: make it again" % (place, " (%s)" % found if found else ""))
    if why == KIND:
        kind = _KINDS.get(found, "unknown")
        what = "holds %s values, not %s" % (kind, expected) if kind else "is missing"
        return UserError("%s: feature %s %s: not a BERT pre-training record: give the TFRecords "
                         "create_pretraining_data makes" % (place, name, what))
    if why == LENGTH:
        return UserError("%s: feature %s has %d values, expected %d: check --max_seq_length and "
                         "--max_predictions_per_seq against the data" % (place, name, found, expected))
    return UserError("%s: feature %s holds %d, outside int32: the file is damaged, or not made by "
                     "create_pretraining_data: make it again" % (place, name, found))


def value_problem(batch, packed=False):
    """(feature, row, value, what it may hold) of the first value in ``batch`` (name -> [rows, ...]
    arrays) that no BERT pre-training record holds, or None. Records with good checksums but such a
    value (a negative id, a segment id or NSP label past 1, a masked_lm_weights of NaN) ended the
    step in an embedding's or a loss's index error (a traceback; for the eval set, at the first
    eval, hours in), or trained NaN to the end; a weight of 2 or -1 trained skewed and counted in the
    eval accuracy. Token ids past the model's vocab_size: read_batch."""
    rules = [("input_ids", 0, None, ">= 0"), ("masked_lm_ids", 0, None, ">= 0"), ("segment_ids", 0, 1, "0 or 1"),
             ("next_sentence_labels", -1 if packed else 0, 1, "-1 (no sequence), 0 or 1" if packed else "0 or 1")]
    if not packed:
        rules.append(("input_mask", 0, 1, "0 or 1"))
    else:  # a packed row's input_mask numbers its sequences, of which it holds K at most (its NSP slots)
        k = np.asarray(batch["next_sentence_labels"]).shape[1]
        rules.append(("input_mask", 0, k, "0 to %d (the row's sequences, numbered)" % k))
    checks = [(name, lambda a, lo=lo, hi=hi: (a < lo) | (a > hi) if hi is not None else a < lo, allowed)
              for name, lo, hi, allowed in rules]
    checks.append(("masked_lm_weights", lambda a: (a != 0) & (a != 1), "0 or 1"))
    for name, is_bad, allowed in checks:
        a = np.asarray(batch[name])
        bad = is_bad(a)
        if bad.any():
            row = int(np.flatnonzero(bad.reshape(len(a), -1).any(1))[0])
            return name, row, a[row][bad[row]].flat[0].item(), allowed
    return None


def values_refusal(batch, where, max_seq_length):
    """The one-line UserError of the first record of ``batch`` (unpacked arrays) holding a value no
    BERT pre-training record holds (a masked position past ``max_seq_length``, ``value_problem``'s,
    an input_mask with a hole or no token, a weighted masked position past its tokens), named by
    ``where(row)``; or None. The decoder's, the loader's of HDF5
    rows and the tools' (to-hdf5, pack, pick-eval-samples), which copied such values on."""
    bad = ((batch["masked_lm_positions"] < 0) | (batch["masked_lm_positions"] >= max_seq_length)).any(1)
    if bad.any():
        return UserError("%s has a masked_lm_positions outside its %d tokens: the file is damaged, or not BERT "
                         "pre-training data of this --max_seq_length: make it again"
                         % (where(int(np.flatnonzero(bad)[0])), max_seq_length))
    problem = value_problem(batch)
    if problem:
        name, row, value, allowed = problem
        return UserError("%s has %s %s, where BERT pre-training data holds %s: the file is damaged, or not made by "
                         "create_pretraining_data: make it again" % (where(row), name, value, allowed))
    # a sequence's tokens are its mask's leading 1s: pack took the length from the mask's sum, and cut
    # the last token of a record whose mask had a 0 before a 1 (exit 0)
    mask = np.asarray(batch["input_mask"])  # (uint8 in an HDF5 file: compared, not subtracted)
    gap = (mask[:, 1:] > mask[:, :-1]).any(1)
    if gap.any():
        return UserError("%s has an input_mask with a 0 before a 1, where BERT pre-training data holds its tokens' "
                         "1s first, then 0s: the file is damaged, or not made by create_pretraining_data: make it "
                         "again" % where(int(np.flatnonzero(gap)[0])))
    # pack places a sequence's predictions by its length: one in its padding landed on the next
    # sequence's tokens (its label read where only that sequence attends); no tokens: a traceback
    length = mask.sum(1, dtype=np.int64)
    empty = length == 0
    if empty.any():
        return UserError("%s has no token (an input_mask of 0s), where BERT pre-training data holds [CLS] and [SEP] "
                         "at least: the file is damaged, or not made by create_pretraining_data: make it again"
                         % where(int(np.flatnonzero(empty)[0])))
    positions = np.asarray(batch["masked_lm_positions"])
    past = (np.asarray(batch["masked_lm_weights"]) != 0) & (positions >= length[:, None])
    if past.any():
        row = int(np.flatnonzero(past.any(1))[0])
        return UserError("%s has a masked position (%d) past its %d tokens (its input_mask's 1s), where BERT "
                         "pre-training data predicts only its own tokens: the file is damaged, or not made by "
                         "create_pretraining_data: make it again"
                         % (where(row), int(positions[row][past[row]][0]), int(length[row])))
    return None


def decode_pretraining_batch(records, max_seq_length, max_predictions_per_seq, where=None, fast=None,
                             check_values=True):
    """Decode serialized pre-training Examples (any feature order) into batch arrays.

    Returns {name: array}: int32 arrays (N, max_seq_length) for input_ids, input_mask,
    segment_ids; (N, max_predictions_per_seq) int32 masked_lm_positions/ids and float32
    masked_lm_weights; (N, 1) int32 next_sentence_labels.  A record that is malformed, lacks a
    feature, holds one of another kind or length, or an int64 value outside int32 (refused, never
    wrapped) raises one UserError naming it by ``where(index in records)`` (default "record i"); so
    does one holding a value no pre-training record holds (``values_refusal``; ``check_values``).
    ``fast``: None = the C decoder when built, False = the pure-Python one.
    """
    where = where or "record {}".format
    if fast is None:
        fast = _fastrng is not None
    out = (_decode_batch_py if not fast else _decode_batch_c)(records, max_seq_length, max_predictions_per_seq, where)
    problem = values_refusal(out, where, max_seq_length) if check_values else None
    if problem:
        raise problem
    return out


def _decode_batch_c(records, max_seq_length, max_predictions_per_seq, where):
    records = records if isinstance(records, (list, tuple)) else list(records)
    lengths = feature_lengths(max_seq_length, max_predictions_per_seq)
    try:
        parts = _fastrng.decode_batch(records, max_seq_length, max_predictions_per_seq)
    except ValueError as e:
        index, why, f, found = e.args
        name, kind, _ = PRETRAINING_FEATURES[f] if f >= 0 else (None, None, None)
        raise _refusal(where, index, why, name, found, lengths[name] if why == LENGTH else kind)
    return {name: np.frombuffer(part, dtype=np.float32 if kind == "float" else np.int32)
            .reshape(len(records), lengths[name])
            for (name, kind, _), part in zip(PRETRAINING_FEATURES, parts)}


def _decode_batch_py(records, max_seq_length, max_predictions_per_seq, where):
    lengths = feature_lengths(max_seq_length, max_predictions_per_seq)
    payloads = {name: [] for name in lengths}
    n_records = 0
    for index, data in enumerate(records):
        try:
            found = _feature_payloads(data)
        except (ValueError, IndexError, UnicodeDecodeError) as e:
            raise _refusal(where, index, MALFORMED, found=e)
        for name, kind, _ in PRETRAINING_FEATURES:
            if name not in found or found[name][0] != (2 if kind == "float" else 3):
                raise _refusal(where, index, KIND, name, found.get(name, (0,))[0] or 0, kind)
            payloads[name].append(found[name][1])
        n_records += 1
    out = {}
    for name, kind, _ in PRETRAINING_FEATURES:
        n = lengths[name]
        parts = payloads[name]
        sizes = np.fromiter((len(p) for p in parts), dtype=np.int64, count=n_records)
        buf = np.frombuffer(b"".join(parts), dtype=np.uint8)
        if kind == "float":
            counts = sizes // 4
            bad = np.flatnonzero((sizes % 4 != 0) | (counts != n))
        else:
            ends = np.concatenate(([0], np.cumsum(sizes)))
            last_ok = (sizes == 0) | (buf[np.maximum(ends[1:] - 1, 0)] < 0x80) if buf.size else sizes == 0
            term = np.concatenate(([0], np.cumsum(buf < 0x80)))
            counts = term[ends[1:]] - term[ends[:-1]]
            bad = np.flatnonzero((counts != n) | ~last_ok)
        if bad.size:
            i = int(bad[0])
            raise _refusal(where, i, LENGTH, name, counts[i], n)
        if kind == "float":
            arr = buf.view("<f4").astype(np.float32)
        else:
            arr = decode_packed_varints(buf.tobytes()) if buf.size else np.zeros(0, np.int64)
            wide = np.flatnonzero((arr < -2**31) | (arr >= 2**31))
            if wide.size:
                raise _refusal(where, int(wide[0]) // n, RANGE, name, int(arr[wide[0]]))
            arr = arr.astype(np.int32)
        out[name] = arr.reshape(n_records, n)
    return out


def check_first_records(files, max_seq_length, max_predictions_per_seq):
    """Before a command makes its output: each of ``files`` holds a first record, whole, and it
    decodes at this shape. A wrong path, a file of another kind or a --max_seq_length the records
    do not have is then refused, with the line the full read would give, before anything is
    created; one record a file is read, whatever the files' size."""
    for path in files:
        records = read_records(path)
        try:
            first = next(records, None)
        finally:
            records.close()
        if first is None:  # an input of no record is a wrong path or a failed run's
            raise UserError("%s holds no records: check --input" % path)
        decode_pretraining_batch([first], max_seq_length, max_predictions_per_seq,
                                 where=lambda i: "%s: record 0" % path)
