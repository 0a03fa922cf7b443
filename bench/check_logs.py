"""Time check-log on many real MLPerf logs: the ten published logs of tests/data, copied N times.

Usage: .venv/bin/python bench/check_logs.py [--copies=100] [--noofficial]
Prints logs checked, wall seconds, ms per log, and the verdict counts (the same on every copy).
"""
import gzip
import glob
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from mlperf_bert.harness import compliance  # noqa: E402
from _data import OneLineParser, doc  # noqa: E402

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "data", "mlperf_logs")


def main():
    ap = OneLineParser(description=doc(__file__).splitlines()[0])
    ap.add_argument("--copies", type=int, default=100, help="copies of the ten logs checked")
    ap.add_argument("--noofficial", action="store_true", help="BERT rules only")
    args = ap.parse_args()
    if args.copies < 1:
        sys.exit("error: check_logs.py: --copies=%d: give 1 or more" % args.copies)
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for src in sorted(glob.glob(os.path.join(DATA, "*.txt.gz"))):
            with gzip.open(src, "rb") as f:
                body = f.read()
            for i in range(args.copies):
                paths.append(os.path.join(tmp, "%03d_%s" % (i, os.path.basename(src)[:-3])))
                with open(paths[-1], "wb") as out:
                    out.write(body)
        t = time.perf_counter()
        checked = compliance.check_logs(paths, official=not args.noofficial)
        wall = time.perf_counter() - t
    verdicts = {}
    for _, results, error in checked:
        v = compliance.ERROR if error else compliance.worst_level(results)  # check-log's verdict: not checked
        verdicts[v] = verdicts.get(v, 0) + 1
    print("%d logs in %.1f s: %.1f ms per log on %d cores; verdicts %s"
          % (len(paths), wall, 1e3 * wall / len(paths), os.cpu_count(), verdicts))


if __name__ == "__main__":
    main()
