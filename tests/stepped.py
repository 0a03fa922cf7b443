"""The opt-in checks' steps (`make container-test`, `make slurm-test`): each named, timed and
printed as it starts and ends, and a table of them at the end."""
import os
import time

times = []  # (step, seconds), in the order they ran


class Failed(Exception):
    pass


def step(name):
    def wrap(fn):
        def run(*args):
            print("\n== %s" % name, flush=True)
            t = time.time()
            try:
                return fn(*args)
            finally:
                times.append((name, time.time() - t))
                print("== %s: %.0f s" % (name, time.time() - t), flush=True)
        return run
    return wrap


def report(t0, width):
    """Each step's seconds, the total since ``t0`` and the load average."""
    print("\n%-*s %8s" % (width, "step", "seconds"))
    for name, seconds in times:
        print("%-*s %8.0f" % (width, name, seconds))
    print("%-*s %8.0f" % (width, "total", time.time() - t0))
    with open("/proc/loadavg") as f:
        print("load average at the end: %s (%d cores)" % (" ".join(f.read().split()[:3]), os.cpu_count()))
