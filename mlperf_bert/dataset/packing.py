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
"""
import numpy as np

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
