"""check-log on every published BERT log of MLCommons' training results, by round.

Usage: .venv/bin/python bench/published_logs.py [--noofficial] ROUND_DIR [ROUND_DIR ...]

Each ROUND_DIR holds a round's results as ``mlcommons/training_results_vX.Y`` lays them out
(``ORG/results/SYSTEM/bert/result_N.txt``; a checkout, or those files copied out of one) and is
named for its round. Prints, per round, the logs, their verdicts, the official checker's verdicts,
and every system where a BERT rule fails a log the official checker (training 5.0.0) passes, with
the rule and its first detail: the cases where this project is stricter than MLCommons' tool,
each to be justified by a rule text (docs/compliance.md, "Checked against published logs").
Nothing is downloaded; the logs are read where they are.
"""
import collections
import glob
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from mlperf_bert.harness import compliance  # noqa: E402
from _data import OneLineParser, doc  # noqa: E402


def round_logs(root):
    return sorted(glob.glob(os.path.join(root, "*", "results", "*", "bert", "result_*.txt")))


def main(argv):
    ap = OneLineParser(description=doc(__file__).splitlines()[0])
    ap.add_argument("rounds", nargs="*", metavar="ROUND_DIR", help="a round's results folder, named for the round")
    ap.add_argument("--noofficial", action="store_true", help="BERT rules only (no official verdicts)")
    args = ap.parse_args(argv)
    if not args.rounds:
        ap.error("give at least one ROUND_DIR (a training_results_vX.Y checkout, or its results copied out)")
    for root in args.rounds:
        paths = round_logs(root)
        if not paths:
            sys.exit("error: %s holds no ORG/results/SYSTEM/bert/result_N.txt: give a round's results folder" % root)
        verdicts, official, stricter, unread = collections.Counter(), collections.Counter(), {}, []
        for path, results, error in compliance.check_logs(paths, official=not args.noofficial):
            if error:  # said below, each with its reason (counted alone, it named no log)
                verdicts[compliance.ERROR] += 1
                unread.append((path, error))
                continue
            verdicts[compliance.worst_level(results)] += 1
            off = next((r.level for r in results if r.rule == "official_checker"), None)
            if off is not None:  # (--noofficial: not run, not counted as "None")
                official[off] += 1
            if off != compliance.FAIL:  # (None: --noofficial, not run)
                system = os.path.relpath(path, root).split(os.sep)
                for r in results:
                    if r.level == compliance.FAIL:
                        key = ("%s/%s" % (system[0], system[2]), r.rule)
                        n, detail = stricter.get(key, (0, r.detail))
                        stricter[key] = (n + 1, detail)
        print("%s: %d logs; check-log %s; official checker %s" % (
            os.path.basename(os.path.normpath(root)), len(paths),
            ", ".join("%s %d" % kv for kv in sorted(verdicts.items())),
            ", ".join("%s %d" % kv for kv in sorted(official.items())) or "not run"))
        for path, error in unread:
            print("    %s: not read: %s" % (os.path.relpath(path, root), error[:200]))
        for (system, rule), (n, detail) in sorted(stricter.items()):
            print("    %s: %s FAIL in %d log(s) %s: %s" % (
                system, rule, n, "(the official checker not run)" if args.noofficial else
                "the official checker passes", detail[:160]))


if __name__ == "__main__":
    main(sys.argv[1:])
