"""bench/suite_time.py's slowed CPUs (docs/test_suite.md's slow-hour times): what it sets up, not a timing."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "bench", "suite_time.py")


@pytest.mark.parametrize("argv,line", [
    (["--slowdown=1"], "error: suite_time.py: --slowdown=1.0: give a factor above 1 and at most 10"),
    (["--rounds=0"], "error: suite_time.py: --rounds=0: give 1 or more"),
    (["--commit=no-such-commit"], "error: suite_time.py: --commit=no-such-commit is not a commit of %s" % ROOT)])
def test_a_bad_flag_is_one_line_and_2(argv, line):
    proc = subprocess.run([sys.executable, BENCH] + argv, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.splitlines() == [line] and not proc.stdout, proc.stderr


def _cgroup_of(pid):
    """The cgroup folder of ``pid`` under the cpu controller (v1) or the unified hierarchy (v2)."""
    for line in open("/proc/%d/cgroup" % pid):
        _, controllers, path = line.rstrip("\n").split(":", 2)
        if "cpu" in controllers.split(","):
            return os.path.join("/sys/fs/cgroup/cpu", path.lstrip("/"))
    return os.path.join("/sys/fs/cgroup", open("/proc/%d/cgroup" % pid).read().split("::", 1)[1].strip().lstrip("/"))


def test_each_cpu_gets_a_pinned_busy_loop_held_to_its_share_and_nothing_is_left(monkeypatch):
    """--slowdown=2: on each CPU this process may use, a busy loop pinned to it alone, in a cgroup of
    its own whose quota is half of one CPU (a 10 ms period); afterwards neither loop nor cgroup is left."""
    if os.geteuid() != 0:
        pytest.skip("the busy loops' cgroups need root")
    monkeypatch.syspath_prepend(os.path.dirname(BENCH))
    import suite_time
    cpus = sorted(os.sched_getaffinity(0))
    with suite_time.slower_cpus(2.0) as busy:
        loops = [int(p) for p in subprocess.run(["pgrep", "-f", "-P", str(os.getpid()), "while True"],
                                               capture_output=True, text=True).stdout.split()]
        assert len(loops) == len(cpus), loops
        assert sorted(next(iter(os.sched_getaffinity(p))) for p in loops) == cpus
        assert all(len(os.sched_getaffinity(p)) == 1 for p in loops)
        groups = [_cgroup_of(p) for p in loops]
        assert len(set(groups)) == len(cpus) and all(os.path.basename(g).startswith("suite_time_") for g in groups)
        for g in groups:
            if os.path.exists(os.path.join(g, "cpu.max")):
                assert open(os.path.join(g, "cpu.max")).read().split() == ["5000", "10000"]
            else:
                assert open(os.path.join(g, "cpu.cfs_quota_us")).read().strip() == "5000"
                assert open(os.path.join(g, "cpu.cfs_period_us")).read().strip() == "10000"
        assert busy() >= 0
    assert not any(os.path.exists("/proc/%d" % p) for p in loops)  # killed and reaped
    assert not any(os.path.exists(g) for g in groups)


def test_a_failed_make_test_is_no_time_of_the_suite(monkeypatch, capsys):
    """A `make test` that failed (a collection error ends it in seconds) was a wall time like any
    other: its seconds went into the medians and their ratio ("0.06x the time"), exit 0."""
    import contextlib
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import suite_time
    monkeypatch.setattr(suite_time.os, "geteuid", lambda: 0)
    monkeypatch.setattr(suite_time, "slower_cpus", lambda factor: contextlib.nullcontext(lambda: 0.0))

    def run(commit, work, name, busy=None):
        if name.startswith("full"):
            return 200.0, 400.0, 0.2, 0.2, "1063 passed in 200.0s", 0
        return 12.0, 20.0, 0.2, 0.2, "FAILED (status 2): ERROR tests/test_x.py; 1 error in 12.0s", 0
    monkeypatch.setattr(suite_time, "run", run)
    monkeypatch.setattr(sys, "argv", ["suite_time.py"])
    with pytest.raises(SystemExit) as e:
        suite_time.main()
    out = capsys.readouterr().out
    assert e.value.code == 1 and "0.06x" not in out and "median: not computed" in out, out
