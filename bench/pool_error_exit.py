"""How long make-dataset takes to end on an error in its pool, with busy processes beside it.

    .venv/bin/python bench/pool_error_exit.py [--errors=100] [--busy=3]

make-dataset's error path terminates its worker pool (mlperf_bert.errors.terminate_pool). Under
load a worker could outlive pool.terminate()'s one SIGTERM (it got it just before it blocked on
the task queue's lock) or end holding the result queue's lock; either cost 10-15 s (the grace
period, then the wait for the pool's threads) once in ~50 errors. This makes a tiny dataset from
the golden input shards, empties one output (the next run's error: "holds 0 records"), starts
--busy busy loops, and times --errors make-dataset runs ending in that error, side by side in
one process: one SIGTERM per worker (terminate_pool's ``repeat`` = its grace, as before) and the
shipped defaults (the SIGTERM repeated). Prints each side's count over 2 s, median and maximum.
"""
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _data import VOCAB, doc, parse, unpacked  # noqa: E402
from mlperf_bert import errors, flags  # noqa: E402
from mlperf_bert.dataset import make_dataset  # noqa: E402
from mlperf_bert.errors import UserError  # noqa: E402

TINY = ["--max_seq_length=128", "--max_predictions_per_seq=20", "--dupe_factor=1", "--noprogress", "--workers=2"]


def main(argv):
    fv = flags.FlagValues()
    flags.DEFINE_integer("errors", 100, "make-dataset runs ending in the error, per side", lower_bound=1,
                         flag_values=fv)
    flags.DEFINE_integer("busy", 3, "busy loops (`while :; do :; done`) beside the runs", lower_bound=0,
                         flag_values=fv)
    parse(fv, argv, doc(__file__))
    work = tempfile.mkdtemp(prefix="bench_pool_error_")
    text = os.path.join(work, "text")
    os.mkdir(text)
    for k, src in enumerate(unpacked("golden", "input")):
        shutil.copy(src, os.path.join(text, "part-0000%d-of-00002" % k))
    out = os.path.join(work, "out")
    cmd = ["make-dataset", "--text_dir=" + text, "--output_dir=" + out, "--vocab_file=" + VOCAB] + TINY
    make_dataset.main(cmd)
    open(os.path.join(out, "part-00001-of-00002"), "wb").close()
    busy = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(fv.busy)]
    grace, stuck, repeat = errors.terminate_pool.__defaults__
    sides = {"one SIGTERM": (grace, stuck, grace), "repeated (shipped)": (grace, stuck, repeat)}
    times = {name: [] for name in sides}
    try:
        for _ in range(fv.errors):
            for name, defaults in sides.items():  # interleaved: both sides see the same load
                errors.terminate_pool.__defaults__ = defaults
                start = time.monotonic()
                try:
                    make_dataset.main(cmd)
                    raise SystemExit("make-dataset did not fail on the emptied output")
                except UserError:
                    pass
                times[name].append(time.monotonic() - start)
    finally:
        errors.terminate_pool.__defaults__ = (grace, stuck, repeat)
        shutil.rmtree(work, ignore_errors=True)
        for p in busy:
            p.kill()
            p.wait()
    print("%d make-dataset errors per side, %d busy loops on %d CPUs" % (fv.errors, fv.busy, os.cpu_count()))
    for name, t in times.items():
        print("%-20s over 2 s: %3d   median %.2f s   max %.2f s" % (name, sum(x > 2 for x in t), statistics.median(t),
                                                                  max(t)))


if __name__ == "__main__":
    from mlperf_bert.cli import run_main
    run_main(main)
