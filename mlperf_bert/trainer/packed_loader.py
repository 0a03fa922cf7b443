"""Input pipeline for packed rows (``pack`` output): deterministic, resumable, sharded over ranks.

The same contract as loader.PretrainingBatches, over rows instead of records: epoch ``e`` visits
the files in an order drawn from ``rng(seed, e)`` and each file's rows in a permutation drawn
from the same generator; global batch ``i`` is stream rows ``[i*B, (i+1)*B)`` and rank ``r`` of
``R`` takes the contiguous slice ``[i*B + r*B/R, i*B + (r+1)*B/R)``. Every batch also carries
``global_sequences``, the real sequences in the whole global batch (every rank knows it from
the files' per-row counts, without communication): the trainer counts samples with it.
"""
import numpy as np
import torch

from mlperf_bert.dataset import hdf5, packing
from mlperf_bert.errors import UserError
from mlperf_bert.trainer import loader


def check_files(files, max_seq_length, max_predictions_per_seq):
    """Attributes of every packed file, checked against the flags, each other and (the sequences'
    count; the shapes: hdf5.check_layout) the file's data; the files of a pack run that did not
    finish are refused."""
    packing.refuse_unfinished(files)
    attrs = [packing.read_attrs(f) for f in files]
    for f, a in zip(files, attrs):
        if (a["max_seq_length"], a["max_predictions_per_seq"]) != (max_seq_length, max_predictions_per_seq):
            raise UserError("%s was packed with --max_seq_length=%d --max_predictions_per_seq=%d, not %d and %d: "
                            "use matching flags or data" % (f, a["max_seq_length"], a["max_predictions_per_seq"],
                                                            max_seq_length, max_predictions_per_seq))
        with hdf5.open_file(f) as h:
            held = int(sequences_per_row(h).sum())
        if held != a["num_sequences"]:  # (the logged global batch size and the eval frequency come from it)
            raise UserError("%s: attribute num_sequences is %s, but its next_sentence_labels hold %d sequences: the "
                            "file is damaged, %s" % (f, a["num_sequences"], held, hdf5.remake_hint(f, True)))
    other = next((i for i, a in enumerate(attrs) if a["max_sequences_per_pack"] != attrs[0]["max_sequences_per_pack"]),
                 None)
    if other is not None:  # (the two that show it: a glob may match thousands)
        raise UserError("packed files %s and %s differ in max_sequences_per_pack (%d and %d): pack them alike"
                        % (files[0], files[other], attrs[0]["max_sequences_per_pack"],
                           attrs[other]["max_sequences_per_pack"]))
    return attrs


def sequences_per_row(h):
    """Real sequences of each row of an open packed file: its labels that are not -1."""
    return (h["next_sentence_labels"][:] >= 0).sum(axis=1)


def row_shape(files):
    """(prediction slots, sequences) of a batch's rows: the real predictions of the fullest row of
    any file (the slots the loader keeps, dataset/packing.py) and the files' K."""
    attrs = [packing.read_attrs(f) for f in files]
    return max(a["max_predictions_per_row"] for a in attrs), max(a["max_sequences_per_pack"] for a in attrs)


class PackedBatches(torch.utils.data.IterableDataset):
    """This rank's batches of packed rows, from global batch ``start_batch`` on."""

    def __init__(self, files, global_batch, rank=0, world_size=1, shuffle=True, seed=0, start_batch=0,
                 repeat=True, vocab_size=None):
        super().__init__()
        if global_batch % world_size:
            raise UserError("batch size %d is not a multiple of the %d ranks: choose a multiple"
                            % (global_batch, world_size))
        self.files = list(files)
        self.global_batch, self.rank, self.world_size = global_batch, rank, world_size
        self.shuffle, self.seed, self.start_batch, self.repeat = shuffle, seed, start_batch, repeat
        self.vocab_size = vocab_size
        self.taken = loader.stamps(self.files)  # the files as the run starts (read as the stream reaches them)
        # real predictions of the fullest row: the slots kept per row (dataset/packing.py)
        self.slots = row_shape(self.files)[0]

    def _stream(self, counts):
        """(file index, row) of the global row stream, epoch after epoch."""
        epoch = 0
        while True:
            rng = np.random.Generator(np.random.PCG64([self.seed, epoch]))
            order = rng.permutation(len(self.files)) if self.shuffle else range(len(self.files))
            for fi in order:
                rows = rng.permutation(len(counts[fi])) if self.shuffle else np.arange(len(counts[fi]))
                for r in rows.tolist():
                    yield fi, r
            if not self.repeat:
                return
            epoch += 1

    def _batches(self, worker, num_workers):
        counts = []
        for f in self.files:
            loader.check_unchanged(f, self.taken)
            with hdf5.open_file(f) as h:
                counts.append(sequences_per_row(h))
        handles = loader.OpenFiles(hdf5.open_file, self.taken)  # (not every file at once: the process's limit)
        try:
            if not sum(len(c) for c in counts):
                raise UserError("packed files %s hold no rows: check the paths" % ",".join(self.files))
            per_rank = self.global_batch // self.world_size
            lo, hi = self.rank * per_rank, (self.rank + 1) * per_rank
            i, pos, mine, total = 0, 0, [], 0
            for fi, r in self._stream(counts):
                wanted = i >= self.start_batch and (i - self.start_batch) % num_workers == worker
                if wanted:
                    total += int(counts[fi][r])
                    if lo <= pos < hi:
                        mine.append((fi, r))
                pos += 1
                if pos == self.global_batch:
                    if wanted:
                        yield self._read(handles, mine, total)
                    i, pos, mine, total = i + 1, 0, [], 0
            if mine:
                yield self._read(handles, mine, total)
        finally:
            handles.close()

    def _read(self, handles, items, total):
        out = {name: [None] * len(items) for name in packing.PACKED_FEATURES}
        by_file = {}
        for j, (fi, r) in enumerate(items):
            by_file.setdefault(fi, []).append((r, j))
        for fi, pairs in by_file.items():
            # h5py reads increasing indices; each row is checked against its checksum as it is read
            uniq, inverse = np.unique([r for r, _ in pairs], return_inverse=True)
            block = hdf5.read_rows(handles.get(self.files[fi]), self.files[fi], packing.PACKED_FEATURES, uniq, "row")
            for name in packing.PACKED_FEATURES:
                for (_, j), i in zip(pairs, inverse.tolist()):
                    out[name][j] = block[name][i]
        out = {name: np.stack(v) for name, v in out.items()}
        real = (out["masked_lm_weights"] != 0).sum(axis=1)
        if real.size and real.max() > self.slots:  # the file and the row, as the checks below name them
            j = int(np.flatnonzero(real > self.slots)[0])
            raise UserError("%s: row %d has %d predictions, more than the %d its packed file(s) allow "
                            "(max_predictions_per_row): the file is damaged, pack it again"
                            % (self.files[items[j][0]], items[j][1], real[j], self.slots))
        out = packing.compact_predictions(out, self.slots)
        batch = {name: torch.from_numpy(v.astype(np.float32 if name == "masked_lm_weights" else np.int64))
                 for name, v in out.items()}
        if self.vocab_size is not None:
            over = loader.past_vocab(batch, self.vocab_size)
            if over.any():
                j = int(torch.nonzero(over)[0])
                top = max(int(batch["input_ids"][j].max()), int(batch["masked_lm_ids"][j].max()))
                raise UserError("%s: row %d has token id %d but the model's vocab_size is %d: use the "
                                "bert_config.json that matches the vocab the data was made with"
                                % (self.files[items[j][0]], items[j][1], top, self.vocab_size))
        problem = loader.value_problem(batch, packed=True)
        if problem:
            name, j, value, allowed = problem
            raise UserError("%s: row %d has %s %s, where packed BERT pre-training data holds %s: the file is damaged, "
                            "pack it again" % (self.files[items[j][0]], items[j][1], name, value, allowed))
        seq = batch["input_ids"].shape[1]
        for name in ("position_ids", "masked_lm_positions", "nsp_positions"):  # indices into a row
            outside = ((batch[name] < 0) | (batch[name] >= seq)).any(1)
            if outside.any():
                j = int(torch.nonzero(outside)[0])
                raise UserError("%s: row %d has a %s outside its %d tokens: the file is damaged, pack it again"
                                % (self.files[items[j][0]], items[j][1], name, seq))
        # a weighted prediction on the row's padding: a file packed from a record whose masked position
        # lay in its padding, before pack refused one (example.values_refusal)
        on = torch.gather(batch["input_mask"], 1, batch["masked_lm_positions"])
        astray = ((batch["masked_lm_weights"] != 0) & (on == 0)).any(1)
        if astray.any():
            j = int(torch.nonzero(astray)[0])
            raise UserError("%s: row %d has a masked position on its padding, where packed BERT pre-training data "
                            "predicts only its sequences' tokens: the file is damaged, or packed from damaged "
                            "records: pack it again" % (self.files[items[j][0]], items[j][1]))
        batch["global_sequences"] = torch.tensor(total)
        return batch

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        if info is None:
            return self._batches(0, 1)
        return self._batches(info.id, info.num_workers)
