"""Sequences/s of one loader process at seq 512, each pair side by side (alternated rounds):

- TFRecords: batch decoding (one C call per batch, what the trainer does) vs record-by-record
  pure-Python decoding (the loader before);
- the same records as a to-hdf5 file and as a packed file (``pack``, defaults): each row checked
  against its row checksum as it is read (the loaders now) vs the same file without its
  ``row_crc32c`` dataset (read unchecked, as before the checksums; packed: rows/s).

Usage: .venv/bin/python bench/loader_throughput.py [--input_file=RECORDS] [--batch=32] [--rounds=3]
Without --input_file it makes seq-512 records from tests/data/golden/input/part-00000-of-00004 with our
generator (the MLPerf flags, dupe factor 10: 7,343 records). Shuffled, one process, no workers;
the last line is JSON with the rates and their ratios.
"""
import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench._data import ROOT, VOCAB, doc, parse, unpacked  # noqa: E402
from mlperf_bert import flags  # noqa: E402
from mlperf_bert.dataset.example import decode_example  # noqa: E402
from mlperf_bert.trainer import loader  # noqa: E402


def make_records():
    text = unpacked("golden", "input")[0]
    d = tempfile.mkdtemp(prefix="bench_loader_")
    atexit.register(shutil.rmtree, d, True)  # ~19 MB of records, not left behind
    out = os.path.join(d, "s512.tfrecord")
    subprocess.run([sys.executable, os.path.join(ROOT, "create_pretraining_data.py"), "--input_file=" + text,
                    "--output_file=" + out, "--vocab_file=" + VOCAB, "--do_lower_case=True", "--max_seq_length=512",
                    "--max_predictions_per_seq=76", "--masked_lm_prob=0.15", "--random_seed=12345",
                    "--dupe_factor=10"], check=True, capture_output=True)
    return out


class RecordByRecord(loader._Reader):
    """The loader's reader as it was: each record decoded alone in Python (``decode_example``, the
    decoder it called), then stacked. (Not ``_read_one``: since 2026-12-04 that runs the C batch
    decoder on one record, which timed C against C.)"""

    def read_batch(self, items):
        rows = [decode_example(self._read_data(*item)) for item in items]
        return {name: np.stack([r[name] for r in rows]) for name in rows[0]}


def rate(files, batch, reader_cls):
    orig = loader._Reader
    loader._Reader = reader_cls
    try:
        t = time.perf_counter()
        n = sum(b["input_ids"].shape[0] for b in loader.PretrainingBatches(files, 512, 76, batch, seed=1,
                                                                           repeat=False))
        return n / (time.perf_counter() - t)
    finally:
        loader._Reader = orig


def hdf5_files(files):
    """A to-hdf5 file and a packed file of ``files`` (the first), each with a copy without row checksums."""
    import h5py
    from mlperf_bert.dataset import hdf5, packing
    d = tempfile.mkdtemp(prefix="bench_loader_h5_")
    atexit.register(shutil.rmtree, d, True)  # ~90 MB of HDF5 files, not left behind
    plain = os.path.join(d, "plain.hdf5")
    hdf5.tfrecords_to_hdf5(files, plain, 512, 76, progress=False)
    packing.main(["pack", "--input=" + files[0], "--output_dir=" + d, "--num_workers=1", "--noprogress"])
    packed = os.path.join(d, os.path.basename(files[0]) + ".packed.hdf5")
    out = {}
    for kind, path in (("hdf5", plain), ("packed", packed)):
        bare = path.replace(".hdf5", ".unchecked.hdf5")
        shutil.copy(path, bare)
        with h5py.File(bare, "r+") as h:
            del h[hdf5.ROW_CHECKSUMS]
        out[kind] = (path, bare)
    return out


def hdf5_rate(kind, path, batch):
    from mlperf_bert.trainer import packed_loader
    t = time.perf_counter()
    if kind == "packed":
        ds = packed_loader.PackedBatches([path], batch, seed=1, repeat=False)
    else:
        ds = loader.PretrainingBatches([path], 512, 76, batch, seed=1, repeat=False)
    n = sum(b["input_ids"].shape[0] for b in ds)
    return n / (time.perf_counter() - t)


def main(argv):
    fv = flags.FlagValues()
    flags.DEFINE_string("input_file", None, "Seq-512 TFRecords (default: made from tests/data's golden input).",
                        flag_values=fv)
    flags.DEFINE_integer("batch", 32, "Records (rows) a batch.", lower_bound=1, flag_values=fv)
    flags.DEFINE_integer("rounds", 3, "Alternated rounds of each pair (the best is kept).", lower_bound=1,
                         flag_values=fv)
    parse(fv, argv, doc(__file__))
    files = loader.input_files(fv.input_file) if fv.input_file else [make_records()]
    batch, rounds = fv.batch, fv.rounds
    from mlperf_bert.dataset.example import _fastrng
    print("C batch decoder built: %s" % (_fastrng is not None))
    old, new = [], []
    for r in range(rounds):  # alternate, so load on the machine hits both alike
        old.append(rate(files, batch, RecordByRecord))
        new.append(rate(files, batch, loader._Reader))
        print("round %d: record by record %.0f seq/s, batch decoding %.0f seq/s" % (r, old[-1], new[-1]))
    best_old, best_new = max(old), max(new)
    result = {"seq_len": 512, "batch": batch, "record_by_record_seq_per_s": round(best_old),
              "batch_decoding_seq_per_s": round(best_new), "ratio": round(best_new / best_old, 2)}
    for kind, (checked, bare) in hdf5_files(files).items():
        off, on = [], []
        for r in range(rounds):
            off.append(hdf5_rate(kind, bare, batch))
            on.append(hdf5_rate(kind, checked, batch))
            print("round %d: %s unchecked %.0f, row checksums checked %.0f %s/s"
                  % (r, kind, off[-1], on[-1], "rows" if kind == "packed" else "seq"))
        result.update({kind + "_unchecked_per_s": round(max(off)), kind + "_checked_per_s": round(max(on)),
                       kind + "_checked_ratio": round(max(on) / max(off), 3)})
    print(json.dumps(result))


if __name__ == "__main__":
    from mlperf_bert.cli import run_main
    run_main(main)
