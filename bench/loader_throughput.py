"""Sequences/s of one loader process at seq 512: batch decoding (one C call per batch, what the
trainer does) vs record-by-record pure-Python decoding (the loader before), side by side.

Usage: .venv/bin/python bench/loader_throughput.py [--input_file=RECORDS] [--batch=32] [--rounds=3]
Without --input_file it makes seq-512 records from tests/data/golden/input/part-00000 with our
generator (the MLPerf flags, dupe factor 10: 7,343 records). Shuffled, one process, no workers;
the last line is JSON with both rates and their ratio.
"""
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench._data import ROOT, VOCAB, help_requested, unpacked  # noqa: E402
from mlperf_bert.trainer import loader  # noqa: E402


def make_records():
    text = unpacked("golden", "input")[0]
    out = os.path.join(tempfile.mkdtemp(prefix="bench_loader_"), "s512.tfrecord")
    subprocess.run([sys.executable, os.path.join(ROOT, "create_pretraining_data.py"), "--input_file=" + text,
                    "--output_file=" + out, "--vocab_file=" + VOCAB, "--do_lower_case=True", "--max_seq_length=512",
                    "--max_predictions_per_seq=76", "--masked_lm_prob=0.15", "--random_seed=12345",
                    "--dupe_factor=10"], check=True, capture_output=True)
    return out


class RecordByRecord(loader._Reader):
    """The loader's reader as it was: each record decoded alone in Python, then stacked."""

    def read_batch(self, items):
        rows = [self._read_one(*item) for item in items]
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


def main():
    if help_requested(__doc__):
        return
    args = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
    files = loader.input_files(args["input_file"]) if "input_file" in args else [make_records()]
    batch, rounds = int(args.get("batch", 32)), int(args.get("rounds", 3))
    from mlperf_bert.dataset.example import _fastrng
    print("C batch decoder built: %s" % (_fastrng is not None))
    old, new = [], []
    for r in range(rounds):  # alternate, so load on the machine hits both alike
        old.append(rate(files, batch, RecordByRecord))
        new.append(rate(files, batch, loader._Reader))
        print("round %d: record by record %.0f seq/s, batch decoding %.0f seq/s" % (r, old[-1], new[-1]))
    best_old, best_new = max(old), max(new)
    print(json.dumps({"seq_len": 512, "batch": batch, "record_by_record_seq_per_s": round(best_old),
                      "batch_decoding_seq_per_s": round(best_new), "ratio": round(best_new / best_old, 2)}))


if __name__ == "__main__":
    main()
