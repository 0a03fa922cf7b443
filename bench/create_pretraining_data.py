"""Benchmark create_pretraining_data against the reference's published figures (REFERENCE.md s.2).

Runs, each in a fresh process on one core (wall time includes start-up; peak RSS of that process):
  1. golden part-00000 (1.03 MB), seq 512 dupe 10: the fast path (C kernel) and our own
     pure-Python slow path (reference tokenizer transcription + Python kernel), side by side;
  2. a 27,150,902-byte shard (the golden inputs concatenated) with the fast path.
Prints wall seconds, peak RSS and the ratios.  Usage: .venv/bin/python bench/create_pretraining_data.py [--skip-27mb]
"""
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _data import VOCAB, help_requested, unpacked  # noqa: E402
REF_1MB_S, REF_27MB_S, REF_27MB_MB = 16.9, 263.0, 2551.0
SHARD_BYTES = 27150902
FLAGS = dict(max_seq_length=512, max_predictions_per_seq=76, dupe_factor=10)


def run(code):
    """Run python code pinned to one core; return (wall seconds, peak RSS MB); print its CPU time."""
    cmd = [sys.executable, "-c", code]
    if hasattr(os, "sched_setaffinity"):
        cmd = ["taskset", "-c", str(min(os.sched_getaffinity(0)))] + cmd
    t = time.perf_counter()
    p = subprocess.Popen(cmd, cwd=ROOT, stderr=subprocess.DEVNULL)  # no progress bars
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t
    if status:
        sys.exit("benchmark run failed: %s" % code)
    print("    [process: %.2f s wall, %.2f s CPU (user+sys), load average %.1f]"
          % (wall, usage.ru_utime + usage.ru_stime, os.getloadavg()[0]), file=sys.stderr)
    return wall, usage.ru_maxrss / 1024.0


def generate(inp, out, fast, reference_tokenizer=False):
    if fast:  # exactly the command users run
        return run("import sys; sys.argv=['create_pretraining_data.py', '--input_file=%s', '--output_file=%s', "
                   "'--vocab_file=%s', '--max_seq_length=512', '--max_predictions_per_seq=76', '--dupe_factor=10'];"
                   "import runpy; runpy.run_path('create_pretraining_data.py', run_name='__main__')"
                   % (inp, out, VOCAB))
    return run("from mlperf_bert.dataset.pretraining_data import create_pretraining_data as c; "
               "c(%r, %r, %r, progress=False, fast=False, reference_tokenizer=%r, **%r)"
               % (inp, out, VOCAB, reference_tokenizer, FLAGS))


def main():
    if help_requested(__doc__):
        return
    golden = os.path.dirname(unpacked("golden", "input")[0])
    with tempfile.TemporaryDirectory() as tmp:
        small = os.path.join(golden, "part-00000-of-00004")
        fast_s, fast_mb = generate(small, os.path.join(tmp, "fast"), True)
        slow_s, slow_mb = generate(small, os.path.join(tmp, "slow"), False, reference_tokenizer=True)
        same = open(os.path.join(tmp, "fast"), "rb").read() == open(os.path.join(tmp, "slow"), "rb").read()
        print("1.03 MB shard, seq 512, dupe 10 (one core, wall incl. start-up):")
        print("  fast path        %6.2f s  %6.0f MB peak RSS" % (fast_s, fast_mb))
        print("  pure-Python path %6.2f s  %6.0f MB peak RSS  (identical output: %s)" % (slow_s, slow_mb, same))
        print("  speed-up vs our pure-Python path: %.1fx;  vs reference's 16.9 s: %.1fx (must >= 10, goal 25)"
              % (slow_s / fast_s, REF_1MB_S / fast_s))
        if "--skip-27mb" in sys.argv:
            return
        big = os.path.join(tmp, "part-27mb")
        with open(os.path.join(golden, "part-00000-of-00004"), "rb") as a, \
                open(os.path.join(golden, "part-00001-of-00004"), "rb") as b:
            pair = a.read() + b.read()
        with open(big, "wb") as f:
            f.write((pair * (SHARD_BYTES // len(pair) + 1))[:SHARD_BYTES])
        big_s, big_mb = generate(big, os.path.join(tmp, "big"), True)
        size = os.path.getsize(os.path.join(tmp, "big"))
        print("27,150,902-byte shard, seq 512, dupe 10, fast path: %.1f s, %.0f MB peak RSS, %.0f MB written"
              % (big_s, big_mb, size / 1e6))
        print("  vs reference 263 s / 2,551 MB: %.1fx faster, %.1fx less memory (must: <= 30 s, <= 1,500 MB)"
              % (REF_27MB_S / big_s, REF_27MB_MB / big_mb))


if __name__ == "__main__":
    main()
