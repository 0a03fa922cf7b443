"""Time make-dataset on one ~27 MB text shard (standard command) and project the full set.

Builds the shard by repeating text made from the real Wikipedia sample in tests/data (article
statistics like the real shards), runs make-dataset with one worker, and prints the time
per shard and projected wall times for 500 shards + eval on N cores (work divides by
shard; I/O is not modelled). Usage: .venv/bin/python bench/bench_make_dataset.py [--cores=2,64]
"""
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from mlperf_bert.dataset import make_dataset  # noqa: E402
from mlperf_bert.dataset import text_pipeline

from _data import VOCAB, counts, doc, parse, unpacked  # noqa: E402
from mlperf_bert import flags  # noqa: E402
SHARD_BYTES = 27150902  # part-00000-of-00500
EVAL_BYTES = 32851144   # eval.txt


def main(argv):
    fv = flags.FlagValues()
    flags.DEFINE_list("cores", ["2", "64"], "Core counts of the projected wall time of 500 shards + eval.",
                      flag_values=fv)
    parse(fv, argv, doc(__file__))
    cores = counts("cores", fv.cores)
    wiki = unpacked("wiki_sample")
    text = "".join(text_pipeline.segment_file(p) for p in wiki)
    with tempfile.TemporaryDirectory() as tmp:
        tdir, odir = os.path.join(tmp, "text"), os.path.join(tmp, "out")
        os.makedirs(tdir)
        body = (text * (SHARD_BYTES // len(text.encode()) + 1)).encode()[:SHARD_BYTES].decode("utf-8", "ignore")
        body = body[:body.rindex("\n\n") + 2]
        with open(os.path.join(tdir, "part-00000-of-00001"), "w", encoding="utf-8") as f:
            f.write(body)
        t0 = time.time()
        rows = make_dataset.make_dataset(tdir, odir, VOCAB, workers=1,
                                    progress=False)
        dt = time.time() - t0
    mb = len(body.encode()) / 1e6
    print("one %.1f MB shard, standard command, 1 worker: %.1f s, %d records, %d bytes" % (mb, dt, rows[0][2], rows[0][1]))
    eval_s = dt * EVAL_BYTES / len(body.encode())
    for n in cores:
        rounds = -(-500 // n)
        print("projected 500 shards + eval on %d cores: %.0f s (%.1f h) = %d rounds of %.0f s + eval %.0f s"
              % (n, rounds * dt + eval_s, (rounds * dt + eval_s) / 3600, rounds, dt, eval_s))


if __name__ == "__main__":
    from mlperf_bert.cli import run_main
    run_main(main)
