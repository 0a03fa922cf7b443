"""The demo's training with one thread against torch's default (one per core), side by side.

    .venv/bin/python bench/demo_threads.py [--steps=100] [--repeats=3] [--load=0,2]

Makes the demo's data once (mlperf_bert.demo.make_data), then times ``train_model.sh
--preset=demo_cpu`` for ``--steps`` micro-steps (one online eval included) with OMP_NUM_THREADS=1
and with torch's default (one a core), alternating, each ``--repeats`` times, first on the machine as it is and then
with each extra load of ``--load`` busy processes (a machine others are using). Prints the
median seconds of each and their ratio, with the load average before and after.
"""
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _demo  # noqa: E402
from mlperf_bert import demo  # noqa: E402
from mlperf_bert.errors import UserError  # noqa: E402
from _data import OneLineParser, count, counts, doc  # noqa: E402

BUSY = "import time\nend = time.time() + %d\nwhile time.time() < end: pass\n"


def uptime():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def train_once(data_dir, out, steps, threads):
    def edit(env):
        # (unset, the demo_cpu preset would give 1: torch's default is one a core it may run on)
        env["OMP_NUM_THREADS"] = threads or str(len(os.sched_getaffinity(0)))
    return _demo.train(data_dir, out, steps, edit)[0]


def main():
    ap = OneLineParser(description=doc(__file__).splitlines()[0])
    ap.add_argument("--steps", type=count, default=100, help="training steps of each demo run")
    ap.add_argument("--repeats", type=count, default=3, help="runs of each thread setting (the median is shown)")
    ap.add_argument("--load", default="0,2", help="busy processes added, comma list")
    args = ap.parse_args()
    try:
        loads = counts("load", args.load, least=0)  # --load=x was a ValueError traceback, -1 ran as 0
    except UserError as e:
        ap.error(str(e))
    with tempfile.TemporaryDirectory(prefix="demo_threads.") as tmp:
        _, _, data_dir, _ = demo.make_data(os.path.join(tmp, "demo"), 5, False)
        print("cores %d, load average before: %s" % (os.cpu_count(), uptime()))
        for load in loads:
            busy = [subprocess.Popen([sys.executable, "-c", BUSY % 3600]) for _ in range(load)]
            try:
                times = {"1": [], None: []}
                for r in range(args.repeats):
                    for threads in ("1", None):
                        out = os.path.join(tmp, "run_%d_%s_%s" % (load, r, threads))
                        times[threads].append(train_once(data_dir, out, args.steps, threads))
            finally:
                for p in busy:
                    p.kill()
                    p.wait()
            one, default = statistics.median(times["1"]), statistics.median(times[None])
            print("%d busy processes added: %d steps in %.1f s with OMP_NUM_THREADS=1, %.1f s with "
                  "torch's default (%d threads): default / one = %.2fx  [runs: %s | %s]"
                  % (load, args.steps, one, default, os.cpu_count(), default / one,
                     " ".join("%.1f" % t for t in times["1"]), " ".join("%.1f" % t for t in times[None])))
        print("load average after: %s" % uptime())


if __name__ == "__main__":
    main()
