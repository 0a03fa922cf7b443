"""`make test` at this machine's speed and with each CPU --slowdown times slower, side by side.

    sudo .venv/bin/python bench/suite_time.py [--slowdown=1.27] [--rounds=1] [--commit=HEAD]

Each run is CI's: a fresh clone of --commit (its own .venv: this checkout's packages and
programs, the clone's own code, its C extensions built in place as `make venv` builds them), a
new empty inductor cache, `make test`. The slowed runs emulate an hour when this shared machine
runs slow (docs/test_suite.md: every test file 1.23-1.58x its CPU at the slowest quiet hour measured, 1.27x
the suite): on each CPU a busy loop pinned to it, held by a cgroup of its own (cgroup v2's
cpu.max, else v1's cpu.cfs_quota_us; a 10 ms period) to 1 - 1/--slowdown of that CPU, so each
of the suite's processes gets at most 1/--slowdown of a CPU whether the others are busy or not.
Needs root (the cgroups). The rounds alternate: full speed, then slowed. Prints each run's wall
and CPU seconds (user + sys of the processes `make` waited for), the busy loops' share, the
last pytest line (and each failed test's) and a calibration loop timed before and after
(``for i in range(3_000_000): s += i``, slowed too in the slowed runs), then the medians and
their ratio.
"""
import contextlib
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from _data import OneLineParser, doc  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOOP = ("import time\nt = time.perf_counter(); s = 0\nfor i in range(3_000_000): s += i\n"
        "print(time.perf_counter() - t)\n")


def loop():
    """The calibration loop's seconds (in a process of its own, as the suite's are)."""
    return float(subprocess.run([sys.executable, "-c", LOOP], capture_output=True, text=True, check=True).stdout)


HOG = "while True:\n    pass\n"


def die(message):
    print("error: suite_time.py: " + message, file=sys.stderr)
    sys.exit(2)


def cgroup(name, share):
    """A cgroup whose processes may use ``share`` of one CPU (a 10 ms period) -> its folder."""
    v2 = "/sys/fs/cgroup"
    quota = max(1000, int(share * 10000))
    if os.path.exists(os.path.join(v2, "cgroup.subtree_control")):
        with open(os.path.join(v2, "cgroup.subtree_control")) as f:
            if "cpu" not in f.read().split():
                die("cgroup v2 without its cpu controller in %s/cgroup.subtree_control: "
                    "enable it (echo +cpu > that file) or run on a host that has it" % v2)
        path = os.path.join(v2, name)
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "cpu.max"), "w") as f:
            f.write("%d 10000" % quota)
        return path
    base = next((p for p in ("/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct")
                 if os.path.exists(os.path.join(p, "cpu.cfs_quota_us"))), None)
    if base is None:
        die("no cgroup cpu controller under /sys/fs/cgroup: --slowdown needs one")
    path = os.path.join(base, name)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "cpu.cfs_period_us"), "w") as f:
        f.write("10000")
    with open(os.path.join(path, "cpu.cfs_quota_us"), "w") as f:
        f.write(str(quota))
    return path


@contextlib.contextmanager
def slower_cpus(factor):
    """Every CPU ``factor`` times slower for what runs meanwhile: on each, a busy loop pinned to
    it and held by a cgroup of its own to 1 - 1/factor of it, so a process there gets at most
    1/factor of the CPU, whether the others are busy or not (a quota on the run's own processes
    would slow it only while they want more CPUs than it leaves). -> a function giving the
    seconds the loops ran."""
    hogs = []
    try:
        for cpu in sorted(os.sched_getaffinity(0)):
            path = cgroup("suite_time_%d_cpu%d" % (os.getpid(), cpu), 1 - 1 / factor)

            def join(path=path, cpu=cpu):
                os.sched_setaffinity(0, {cpu})
                with open(os.path.join(path, "cgroup.procs"), "w") as f:
                    f.write(str(os.getpid()))
            hogs.append((subprocess.Popen([sys.executable, "-c", HOG], preexec_fn=join), path))

        def busy():
            return sum(_cpu_seconds(p.pid) for p, _ in hogs)
        yield busy
    finally:
        for p, path in hogs:
            p.kill()
            p.wait()
            os.rmdir(path)


def _cpu_seconds(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def clone(commit, work):
    """A fresh clone of ``commit`` in ``work``/repo with a .venv of its own: this checkout's
    packages and their programs, the clone's code in place of this checkout's (no editable
    finder), its C extensions built; -> the clone's folder."""
    repo = os.path.join(work, "repo")
    subprocess.run(["git", "clone", "-q", ROOT, repo], check=True)
    subprocess.run(["git", "checkout", "-q", commit], cwd=repo, check=True)
    venv = os.path.join(repo, ".venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    site, ours = (subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                 capture_output=True, text=True, check=True).stdout.strip()
                  for py in (os.path.join(venv, "bin", "python"), sys.executable))
    with open(os.path.join(site, "suite_time.pth"), "w") as f:  # the clone first, then the packages
        f.write("%s\n%s\n" % (repo, ours))
    ours_bin = os.path.dirname(sys.executable)
    for name in os.listdir(ours_bin):  # the packages' programs (hadolint, ...)
        if not os.path.exists(os.path.join(venv, "bin", name)):
            os.symlink(os.path.join(ours_bin, name), os.path.join(venv, "bin", name))
    subprocess.run([os.path.join(venv, "bin", "python"), "setup.py", "-q", "build_ext", "--inplace"], cwd=repo,
                   check=True, capture_output=True)
    open(os.path.join(venv, ".installed"), "w").close()  # `make test` then finds it installed
    return repo


def run(commit, work, name, busy=None):
    """One `make test` in a fresh clone -> (wall s, CPU s, loop before, loop after, last line, CPU
    seconds of the busy loops meanwhile)."""
    repo = clone(commit, os.path.join(work, name))
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=os.path.join(work, name, "inductor"))
    env.pop("PYTHONPATH", None)
    before = loop()
    start, cpu0, took = time.time(), resource.getrusage(resource.RUSAGE_CHILDREN), busy() if busy else 0
    proc = subprocess.run(["make", "test"], cwd=repo, env=env, capture_output=True, text=True)
    wall, cpu1, took = time.time() - start, resource.getrusage(resource.RUSAGE_CHILDREN), busy() - took if busy else 0
    after = loop()
    lines = proc.stdout.strip().splitlines() or ["(no output)"]
    last = lines[-1]
    if proc.returncode:  # with pytest's line for each test that failed
        last = "FAILED (status %d): %s" % (proc.returncode, "; ".join(
            [line for line in lines if line.startswith(("FAILED ", "ERROR "))] + [last]))
    shutil.rmtree(os.path.join(work, name), ignore_errors=True)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    return wall, cpu, before, after, last, took


def main():
    ap = OneLineParser(description=doc(__file__).splitlines()[0])
    ap.add_argument("--slowdown", type=float, default=1.27, help="how many times slower each CPU is in the slowed runs")
    ap.add_argument("--rounds", type=int, default=1, help="pairs of runs (full speed, slowed)")
    ap.add_argument("--commit", default="HEAD", help="the commit whose suite is timed")
    args = ap.parse_args()
    if not 1 < args.slowdown <= 10:
        die("--slowdown=%s: give a factor above 1 and at most 10" % args.slowdown)
    if args.rounds < 1:
        die("--rounds=%d: give 1 or more" % args.rounds)
    commit = subprocess.run(["git", "rev-parse", "--short", args.commit], cwd=ROOT, capture_output=True, text=True)
    if commit.returncode:
        die("--commit=%s is not a commit of %s" % (args.commit, ROOT))
    commit = commit.stdout.strip()
    if os.geteuid() != 0:
        die("the slowed runs need root (a cgroup for each CPU's busy loop): use sudo")
    times = {"full": [], "slowed": []}
    print("commit %s, %d CPUs, each %.2fx slower in the slowed runs; load average %s"
          % (commit, len(os.sched_getaffinity(0)), args.slowdown, " ".join(open("/proc/loadavg").read().split()[:3])),
          flush=True)
    with tempfile.TemporaryDirectory(prefix="suite_time.") as work:
        for r in range(args.rounds):
            for kind in ("full", "slowed"):
                with slower_cpus(args.slowdown) if kind == "slowed" else contextlib.nullcontext() as busy:
                    wall, cpu, before, after, last, took = run(commit, work, "%s%d" % (kind, r), busy)
                if not last.startswith("FAILED"):  # a failed suite's wall is no time of the suite
                    times[kind].append(wall)
                print("%s %s: make test %.1f s, CPU %.1f s%s, loop %.3f / %.3f s: %s"
                      % (time.strftime("%H:%M"), kind, wall, cpu,
                         " (the busy loops took %.1f CPU s: %.0f %% of the CPUs)"
                         % (took, 100 * took / (wall * len(os.sched_getaffinity(0)))) if busy else "",
                         before, after, last), flush=True)
    failed = [kind for kind in ("full", "slowed") if len(times[kind]) < args.rounds]
    if failed:
        print("median: not computed: `make test` failed in %s run(s) (above)" % " and ".join(failed))
        sys.exit(1)
    full, slowed = statistics.median(times["full"]), statistics.median(times["slowed"])
    print("median: full speed %.1f s, each CPU %.2fx slower %.1f s: %.2fx the time"
          % (full, args.slowdown, slowed, slowed / full))


if __name__ == "__main__":
    main()
