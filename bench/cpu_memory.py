"""The demo's CPU training with the trainer's malloc settings (trainer/cpu_memory.py) against
glibc's defaults, side by side.

    .venv/bin/python bench/cpu_memory.py [--steps=100] [--repeats=3]

Makes the demo's data once (mlperf_bert.demo.make_data), then runs ``train_model.sh
--preset=demo_cpu`` for ``--steps`` micro-steps (one online eval included) as the product runs it
and with ``cpu_memory.keep_freed_memory`` replaced by a no-op (glibc's defaults), alternating,
each ``--repeats`` times. Prints the median wall, user and system seconds of each and their ratios.
"""
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _demo  # noqa: E402
from mlperf_bert import demo  # noqa: E402
from _data import OneLineParser, count, doc  # noqa: E402

DEFAULTS = "import mlperf_bert.trainer.cpu_memory as m\nm.keep_freed_memory = lambda: False\n"


def train_once(data_dir, out, steps, glibc_defaults, site):
    def edit(env):
        if glibc_defaults:
            env["PYTHONPATH"] = os.pathsep.join([site, _demo.ROOT] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return _demo.train(data_dir, out, steps, edit)


def main():
    ap = OneLineParser(description=doc(__file__).splitlines()[0])
    ap.add_argument("--steps", type=count, default=100, help="training steps of each demo run")
    ap.add_argument("--repeats", type=count, default=3, help="runs of each setting (the median is shown)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="cpu_memory.") as tmp:
        _, _, data_dir, _ = demo.make_data(os.path.join(tmp, "demo"), 5, False)
        site = os.path.join(tmp, "site")
        os.makedirs(site)
        with open(os.path.join(site, "sitecustomize.py"), "w") as f:
            f.write(DEFAULTS)
        runs = {False: [], True: []}
        for r in range(args.repeats):
            for glibc_defaults in (False, True):
                out = os.path.join(tmp, "run_%d_%s" % (r, glibc_defaults))
                runs[glibc_defaults].append(train_once(data_dir, out, args.steps, glibc_defaults, site))
        med = {k: [statistics.median(x[i] for x in v) for i in range(3)] for k, v in runs.items()}
        for k, name in ((False, "kept (the trainer's)"), (True, "glibc's defaults")):
            print("%-21s %d steps: %.1f s wall, %.1f s user, %.1f s system  [wall: %s]"
                  % (name, args.steps, *med[k], " ".join("%.1f" % x[0] for x in runs[k])))
        print("glibc's defaults / kept: wall %.2fx, user %.2fx, system %.2fx"
              % tuple(med[True][i] / med[False][i] for i in range(3)))


if __name__ == "__main__":
    main()
