"""Benchmark create_pretraining_data (seq 512, dupe 10, the MLPerf command) on one core.

Every run is a fresh process pinned to one core (wall time includes start-up; CPU time and
peak RSS of that process), measured side by side in this one invocation:

  1. a 27,150,902-byte text shard (the size of a real shard) made of real text: the golden
     inputs tests/data/golden/input/part-0000{0,1}-of-00004 (Wikipedia sentences)
     concatenated and repeated, cut at that size.  Repeated text means fewer first-seen
     words than a real shard: step 3 measures first-seen text on its own;
     - this tree, --runs times, alternating with --against=REV (an earlier revision built
       in a temporary git worktree), with the outputs' md5s compared;
     - where this tree's CPU time goes: tokenizing, making the instances, shuffling +
       encoding + writing (timed inside one process);
     - the floor: writing as many bytes with `dd conv=fdatasync` (what any writer pays),
       plus tokenizing the shard alone (this tree's tokenizer, its own process);
  2. the MLCommons reference create_pretraining_data.py run by TensorFlow (--reference=DIR,
     a directory with its create_pretraining_data.py and tokenization.py, e.g.
     retired_benchmarks/bert/cleanup_scripts of a checkout of the mlcommons/training repository)
     on golden part-00000 (1.03 MB) and, with --reference_27mb, on the 27 MB shard (~2-5 min,
     2.5 GB), side by side with this tree; the contents are compared by digest.  A ratio is
     printed only for a reference run in this invocation (a figure of another day is another
     load: the 27 MB shard took the reference 124 s on one day and 263 s on a busier one);
  3. tokenizing the wiki sample (tests/data/wiki_sample, 4.1 MB of real Wikipedia text,
     every word new to the tokenizer at first sight) alone, and with --python the
     pure-Python path of the generator on the 1.03 MB shard (same bytes, slow).

Usage: .venv/bin/python bench/create_pretraining_data.py [--runs=3] [--against=REV]
       [--reference=DIR [--reference_27mb]] [--python]
Run it under `flock /tmp/heavy.lock` on a shared machine.
"""
import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from _data import OneLineParser, doc  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _data import VOCAB, unpacked  # noqa: E402

SHARD_BYTES = 27150902
MLPERF = ["--max_seq_length=512", "--max_predictions_per_seq=76", "--dupe_factor=10",
          "--do_lower_case=True", "--masked_lm_prob=0.15", "--random_seed=12345"]
CORE = str(min(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else None


def run(argv, cwd=ROOT):
    """Run argv pinned to one core; return {wall, cpu, rss_mb}."""
    cmd = (["taskset", "-c", CORE] if CORE is not None and shutil.which("taskset") else []) + argv
    t = time.perf_counter()
    p = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err = p.stderr.read()
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t
    if status:
        sys.exit("benchmark run failed: %s\n%s" % (" ".join(argv), err.decode(errors="replace")[-2000:]))
    return {"wall": wall, "cpu": usage.ru_utime + usage.ru_stime, "rss_mb": usage.ru_maxrss / 1024.0}


def generate(tree, inp, out):
    """The generator of source tree ``tree`` exactly as users run it."""
    return run([sys.executable, "create_pretraining_data.py", "--input_file=" + inp, "--output_file=" + out,
                "--vocab_file=" + VOCAB] + MLPERF, cwd=tree)


def reference(ref_dir, inp, out):
    """The reference script, unchanged, on TensorFlow 2's v1 API (what it was written for)."""
    code = ("import runpy, sys; import tensorflow.compat.v1 as tf; sys.modules['tensorflow'] = tf; "
            "sys.path.insert(0, %r); sys.argv = %r; runpy.run_path(sys.argv[0], run_name='__main__')"
            % (ref_dir, [os.path.join(ref_dir, "create_pretraining_data.py"), "--input_file=" + inp,
                         "--output_file=" + out, "--vocab_file=" + VOCAB] + MLPERF))
    return run([sys.executable, "-c", code])


def tokenize_only(inp):
    code = ("from mlperf_bert.dataset.pretraining_data import read_documents; "
            "from mlperf_bert.dataset.tokenization import FastTokenizer, load_vocab; "
            "read_documents([%r], FastTokenizer(vocab=load_vocab(%r)))" % (inp, VOCAB))
    return run([sys.executable, "-c", code])


STAGES = """
import array, json, random, sys, time
from mlperf_bert.dataset import pretraining_data as P
from mlperf_bert.dataset.tokenization import FastTokenizer, load_vocab
inp, out, vocab_file = sys.argv[1:4]
t = [time.process_time()]
vocab = load_vocab(vocab_file)
corpus = P.read_documents([inp], FastTokenizer(vocab=vocab))
t.append(time.process_time())
k = P.make_kernel(12345, [vocab[w] for w in vocab], vocab["[CLS]"], vocab["[SEP]"], vocab["[MASK]"], 512, 76)
order = list(range(len(corpus)))
k.shuffle(order)
k.set_corpus(corpus.tokens, corpus.seg_off, array.array("q", [corpus.doc_seg[o] for o in order]),
             array.array("q", [corpus.doc_seg[o + 1] for o in order]))
for _ in range(10):
    k.documents(0, len(corpus), 0.1, 0.15)
t.append(time.process_time())
k.shuffle_instances()
P.write_round_robin(k, [out])
t.append(time.process_time())
print(json.dumps([b - a for a, b in zip(t, t[1:])]))
"""


def stages(inp, out):
    """CPU seconds of tokenizing, making the instances, shuffling + encoding + writing (in one process)."""
    cmd = [sys.executable, "-c", STAGES, inp, out, VOCAB]
    if CORE is not None and shutil.which("taskset"):
        cmd = ["taskset", "-c", CORE] + cmd
    return json.loads(subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True).stdout)


def dd(path, nbytes):
    blocks = -(-nbytes // (4 << 20))
    t = time.perf_counter()
    subprocess.run(["dd", "if=/dev/zero", "of=" + path, "bs=4M", "count=%d" % blocks, "conv=fdatasync"],
                   check=True, capture_output=True)
    wall = time.perf_counter() - t
    os.remove(path)
    return wall * nbytes / (blocks * (4 << 20))  # scaled to the output's exact size


def md5(path):
    h = hashlib.md5()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def digest(path):
    out = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "tfrecord_digest.py"), path],
                         check=True, capture_output=True, text=True).stdout
    row = json.loads(out)
    return row["records"], row["bytes"], row["digest"]


def build_revision(rev, where):
    """A worktree of ``rev`` with its C accelerators built; its commit id."""
    subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", where, rev], check=True, capture_output=True)
    subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=where, check=True,
                   capture_output=True)
    return subprocess.run(["git", "-C", where, "rev-parse", "--short", "HEAD"], check=True, capture_output=True,
                          text=True).stdout.strip()


def median(runs, key):
    return statistics.median(r[key] for r in runs)


def show(label, runs, extra=""):
    print("  %-24s %6.2f s wall  %6.2f s CPU  %5.0f MB peak RSS%s"
          % (label, median(runs, "wall"), median(runs, "cpu"), max(r["rss_mb"] for r in runs), extra))


def load():
    return "load average %.2f %.2f %.2f" % os.getloadavg()


def main():
    ap = OneLineParser(description=doc(__file__), formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3, help="runs of each generator on the 27 MB shard (median)")
    ap.add_argument("--against", metavar="REV", help="an earlier revision to run side by side")
    ap.add_argument("--reference", metavar="DIR", help="directory of the reference create_pretraining_data.py")
    ap.add_argument("--reference_27mb", action="store_true", help="also run the reference on the 27 MB shard")
    ap.add_argument("--python", action="store_true", help="also run the pure-Python path on 1.03 MB")
    args = ap.parse_args()
    if args.reference and not os.path.isfile(os.path.join(args.reference, "create_pretraining_data.py")):
        sys.exit("--reference=%s holds no create_pretraining_data.py" % args.reference)

    golden = os.path.dirname(unpacked("golden", "input")[0])
    small = os.path.join(golden, "part-00000-of-00004")
    tmp = tempfile.mkdtemp(prefix="bench_cpd_", dir=os.environ.get("BENCH_TMP"))
    old_tree = None
    try:
        big = os.path.join(tmp, "part-27mb")
        with open(small, "rb") as a, open(os.path.join(golden, "part-00001-of-00004"), "rb") as b:
            pair = a.read() + b.read()
        with open(big, "wb") as f:
            f.write((pair * (SHARD_BYTES // len(pair) + 1))[:SHARD_BYTES])
        print("one core (cpu %s), %d CPUs, at start: %s" % (CORE, os.cpu_count(), load()))
        if args.against:
            old_tree = os.path.join(tmp, "against")
            rev = build_revision(args.against, old_tree)

        print("\n27,150,902-byte shard, seq 512, dupe 10 (median of %d):" % args.runs)
        ours, theirs = [], []
        for _ in range(args.runs):
            ours.append(generate(ROOT, big, os.path.join(tmp, "big")))
            if old_tree:
                theirs.append(generate(old_tree, big, os.path.join(tmp, "big_old")))
        size = os.path.getsize(os.path.join(tmp, "big"))
        show("this tree", ours, "  (%s bytes)" % format(size, ","))
        if old_tree:
            same = md5(os.path.join(tmp, "big")) == md5(os.path.join(tmp, "big_old"))
            show("%s (%s)" % (args.against, rev), theirs, "  identical bytes: %s" % ("yes" if same else "NO"))
            print("  speed-up vs %s: %.2fx wall, %.2fx CPU; memory %.2fx less"
                  % (args.against, median(theirs, "wall") / median(ours, "wall"),
                     median(theirs, "cpu") / median(ours, "cpu"),
                     max(r["rss_mb"] for r in theirs) / max(r["rss_mb"] for r in ours)))
        write_s = statistics.median(dd(os.path.join(tmp, "dd"), size) for _ in range(args.runs))
        tok = [tokenize_only(big) for _ in range(args.runs)]
        floor = write_s + median(tok, "wall")
        parts = [stages(big, os.path.join(tmp, "stages")) for _ in range(args.runs)]
        print("  where the CPU time goes (in one process, median): tokenizing %.2f s, instances %.2f s, "
              "shuffling + encoding + writing %.2f s" % tuple(statistics.median(p[i] for p in parts) for i in range(3)))
        print("  floor: dd %s bytes + fdatasync %.2f s + tokenizing the shard alone %.2f s wall (%.2f s CPU) "
              "= %.2f s;\n  the shard takes %.2fx the floor (%s)"
              % (format(size, ","), write_s, median(tok, "wall"), median(tok, "cpu"), floor,
                 median(ours, "wall") / floor, load()))

        print("\nthe reference (MLCommons create_pretraining_data.py, TensorFlow), one core:")
        small_ours = [generate(ROOT, small, os.path.join(tmp, "small")) for _ in range(args.runs)]
        if args.reference:
            ref = reference(args.reference, small, os.path.join(tmp, "small_ref"))
            same = digest(os.path.join(tmp, "small_ref")) == digest(os.path.join(tmp, "small"))
            print("  1.03 MB: reference %.2f s wall, %.0f MB; this tree %.2f s, %.0f MB: %.1fx faster "
                  "(same content: %s)" % (ref["wall"], ref["rss_mb"], median(small_ours, "wall"),
                                          max(r["rss_mb"] for r in small_ours),
                                          ref["wall"] / median(small_ours, "wall"), "yes" if same else "NO"))
        else:
            print("  not run (--reference=DIR runs it on 1.03 MB, --reference_27mb on 27 MB): no ratio;"
                  " this tree on 1.03 MB: %.2f s" % median(small_ours, "wall"))
        if args.reference and args.reference_27mb:
            ref = reference(args.reference, big, os.path.join(tmp, "big_ref"))
            same = digest(os.path.join(tmp, "big_ref")) == digest(os.path.join(tmp, "big"))
            print("  27 MB: reference %.0f s, %.0f MB peak RSS (same content: %s); this tree %.2f s, %.0f MB: "
                  "%.0fx faster, %.0fx less memory"
                  % (ref["wall"], ref["rss_mb"], "yes" if same else "NO", median(ours, "wall"),
                     max(r["rss_mb"] for r in ours), ref["wall"] / median(ours, "wall"),
                     ref["rss_mb"] / max(r["rss_mb"] for r in ours)))

        wiki = unpacked("wiki_sample")
        wiki_all = os.path.join(tmp, "wiki_all")
        with open(wiki_all, "wb") as f:
            for p in wiki:
                with open(p, "rb") as g:
                    f.write(g.read())
        fresh = [tokenize_only(wiki_all) for _ in range(args.runs)]
        print("\nfirst-seen text: tokenizing the wiki sample (%s bytes) alone: %.2f s wall, %.2f s CPU"
              % (format(os.path.getsize(wiki_all), ","), median(fresh, "wall"), median(fresh, "cpu")))
        if args.python:
            py = run([sys.executable, "-c",
                      "from mlperf_bert.dataset.pretraining_data import create_pretraining_data as c; "
                      "c(%r, %r, %r, progress=False, fast=False, max_seq_length=512, max_predictions_per_seq=76, "
                      "dupe_factor=10)" % (small, os.path.join(tmp, "small_py"), VOCAB)])
            same = md5(os.path.join(tmp, "small_py")) == md5(os.path.join(tmp, "small"))
            print("pure-Python path, 1.03 MB: %.2f s, %.0f MB (identical bytes: %s): the C path is %.1fx faster"
                  % (py["wall"], py["rss_mb"], "yes" if same else "NO", py["wall"] / median(small_ours, "wall")))
        print("\nat end: %s" % load())
    finally:
        if old_tree and os.path.isdir(old_tree):
            subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", old_tree], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
        subprocess.run(["git", "-C", ROOT, "worktree", "prune"], capture_output=True)


if __name__ == "__main__":
    main()
