"""The official checker's parse, before (mlp_parser.parse_file) and after (compliance.official_loglines).

Usage: .venv/bin/python bench/official_parse.py [--size=400000] [--logs=DIR,...]

1. On every real log (tests/data/mlperf_logs, any depth, .txt or .txt.gz, and the --logs
   directories): both parses give the same records and errors, and the official checker gives the
   same verdict and messages on either (ComplianceChecker.check_file, as check-log ran it before,
   against compliance.official_check).
2. On the v5.0 NVIDIA nyx log with one extra MLLOG line of --size bytes: wall seconds of each parse
   and of check-log's official check, side by side, with the ratio.
"""
import glob
import gzip
import logging
import os
import sys
import tempfile
import time
from _data import OneLineParser, count, doc  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from mlperf_logging.compliance_checker import mlp_compliance, mlp_parser  # noqa: E402

from mlperf_bert.harness import compliance  # noqa: E402

DATA = os.path.join(ROOT, "tests", "data", "mlperf_logs")


def before_check(path):
    """The official check as check-log ran it before: check_file, its own (quadratic) parse."""
    checker = mlp_compliance.make_checker("training", compliance.RULESET, False, False)
    logging.disable(logging.CRITICAL)
    try:
        valid = checker.check_file(os.path.abspath(path), "training_%s/common.yaml" % compliance.RULESET)
    finally:
        logging.disable(logging.NOTSET)
    r = compliance.checker_result(checker, valid)  # the Result check-log makes of it
    return r.level, r.line


def after_check(path):
    r = compliance.official_check(path)
    return r.level, r.line


def extra_folders(logs):
    """The folders of --logs (comma-separated); one that holds no log is said, not passed over."""
    extra = [d for d in logs.split(",") if d]
    for d in extra:
        if not glob.glob(os.path.join(d, "**", "*.txt*"), recursive=True):
            sys.exit("error: official_parse.py: --logs: %s holds no .txt or .txt.gz log" % d)
    return extra


def real_logs(tmp, extra):
    paths = []
    for src in sorted(glob.glob(os.path.join(DATA, "**", "*.txt*"), recursive=True)) + \
            [p for d in extra for p in sorted(glob.glob(os.path.join(d, "**", "*.txt*"), recursive=True))]:
        if src.endswith(".gz"):
            dest = os.path.join(tmp, os.path.basename(src)[:-3])
            with gzip.open(src, "rb") as f, open(dest, "wb") as out:
                out.write(f.read())
            paths.append((src, dest))
        else:
            paths.append((src, src))
    return paths


def timed(fn, *args):
    t = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - t, out


def main():
    ap = OneLineParser(description=doc(__file__).splitlines()[0])
    ap.add_argument("--size", type=count, default=400_000, help="bytes of the long MLLOG line")
    ap.add_argument("--logs", default="", help="more directories of real logs, comma-separated")
    args = ap.parse_args()
    extra = extra_folders(args.logs)
    with tempfile.TemporaryDirectory() as tmp:
        same = 0
        logs = real_logs(tmp, extra)
        for src, path in logs:
            parsed = mlp_parser.parse_file(path, ruleset=compliance.RULESET) == compliance.official_loglines(path)
            before, after = before_check(path), after_check(path)
            agree = parsed and before == after
            same += agree
            print("%-4s %-4s %-5s %s" % (before[0], after[0], "same" if agree else "DIFF", os.path.relpath(src, ROOT)
                                         if src.startswith(ROOT) else src))
        print("%d of %d real logs: the same records, verdict and messages before and after" % (same, len(logs)))

        nyx = os.path.join(tmp, "v5.0_NVIDIA_nyx_n1_result_0.txt")
        with open(nyx) as f:
            lines = f.readlines()
        long_line = (':::MLLOG {"namespace": "", "time_ms": 1745139493514, "event_type": "POINT_IN_TIME", '
                     '"key": "data_file", "value": "%s", "metadata": {"file": "x.py", "lineno": 1}}\n'
                     % ("x" * args.size))
        path = os.path.join(tmp, "long.txt")
        with open(path, "w") as f:
            f.writelines(lines[:5] + [long_line] + lines[5:])
        t_after, parsed_after = timed(compliance.official_loglines, path)
        t_check_after, r = timed(after_check, path)
        t_before, parsed_before = timed(mlp_parser.parse_file, path, compliance.RULESET)
        t_check_before, b = timed(before_check, path)
        assert parsed_before == parsed_after and b[0] == r[0], "the parses differ"
        print("log with one %d-byte MLLOG line (%d lines): verdict %s before and after" % (
            len(long_line), len(lines) + 1, r[0]))
        print("%-28s %10s %10s %8s" % ("", "before s", "after s", "ratio"))
        print("%-28s %10.3f %10.3f %8.0fx" % ("parse", t_before, t_after, t_before / t_after))
        print("%-28s %10.3f %10.3f %8.0fx" % ("official check (parse + rules)", t_check_before, t_check_after,
                                               t_check_before / t_check_after))


if __name__ == "__main__":
    main()
