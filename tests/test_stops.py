"""Stops and restarts on every launch path (issue 23): SIGKILL and an immediate rerun, SIGTERM
under the torchrun wrapper, a rank or its loader worker killed, a busy MASTER_PORT."""
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from mlperf_bert import locking
from mlperf_bert.errors import UserError
from test_training import files, one_thread, uninterrupted  # noqa: F401 (fixtures; one thread, as there)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = sys.executable
ENV = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")


def wait_until(condition, proc=None, timeout=120, what="the condition"):
    """Poll ``condition`` (a slow, loaded machine: never a fixed sleep)."""
    t = time.time()
    while not condition():
        assert proc is None or proc.poll() is None, "the process ended before %s" % what
        assert time.time() - t < timeout, "no %s after %d s" % (what, timeout)
        time.sleep(0.05)


# ---------------------------------------------------------------- the lock

FORKING_HOLDER = textwrap.dedent("""\
    import os, sys, time
    from mlperf_bert import locking
    locking.lock_dir(sys.argv[1])
    child = os.fork()  # as a DataLoader or pool worker is made
    if child == 0:
        time.sleep(60)
        os._exit(0)
    print(child, flush=True)
    time.sleep(60)
    """)


def test_a_child_of_a_killed_holder_does_not_keep_the_lock(tmp_path):
    """Issue 23: a SIGKILLed trainer's DataLoader worker lived on for seconds holding the flock, so
    the same command rerun at once was refused, naming the dead trainer."""
    d = str(tmp_path / "out")
    proc = subprocess.Popen([PY, "-c", FORKING_HOLDER, d], stdout=subprocess.PIPE, text=True, env=ENV)
    child = int(proc.stdout.readline())
    try:
        proc.kill()
        proc.wait()
        os.kill(child, 0)  # the child still runs, as a worker does for a moment
        with locking.lock_dir(d, "--output_dir") as lock:  # the rerun, at once
            assert lock.fd is not None
    finally:
        os.kill(child, signal.SIGKILL)


def test_the_refusal_never_names_a_dead_holder(tmp_path, monkeypatch):
    """A lock file naming a process that has ended while something else holds the lock: the
    message names the live holder, not the dead pid."""
    d = tmp_path / "out"
    d.mkdir()
    dead = subprocess.Popen(["true"])
    dead.wait()
    info = json.dumps({"host": socket.gethostname(), "pid": dead.pid, "started": "then", "command": "x"})
    hold = textwrap.dedent("""\
        import fcntl, os, sys, time
        fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, sys.argv[2].encode())
        print("held", flush=True)
        time.sleep(60)
        """)
    proc = subprocess.Popen([PY, "-c", hold, str(d / locking.DIR_LOCK_NAME), info], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        monkeypatch.setattr(locking, "DEAD_HOLDER_WAIT", 0.3, raising=False)
        with pytest.raises(UserError) as e:
            locking.lock_dir(str(d), "--output_dir")
        msg = str(e.value)
        assert "pid %d on host" % dead.pid not in msg, msg
        assert "pid %d, which keeps its lock file open (pid %d, which wrote the lock, has ended)" % (
            proc.pid, dead.pid) in msg, msg
    finally:
        proc.kill()
        proc.wait()


# ---------------------------------------------------------------- the trainer

@pytest.mark.slow
def test_sigkilled_trainer_rerun_at_once_resumes_and_ends_bit_identical(files, uninterrupted, tmp_path):
    """The same command rerun the moment the killed trainer is gone (its DataLoader worker may still
    run: the old test waited for the worker to close the output pipe) starts, resumes, and ends
    bit-identical to the uninterrupted run."""
    from mlperf_bert.trainer import training
    from test_training import assert_bit_identical, flags_for
    out = str(tmp_path / "run")
    argv = flags_for(files, out)  # one DataLoader worker
    with open(tmp_path / "first.log", "w") as log:
        proc = subprocess.Popen([PY] + argv, cwd=ROOT, env=ENV, stdout=log, stderr=subprocess.STDOUT)
        wait_until(lambda: os.path.exists(os.path.join(out, "model.ckpt-3.pt")), proc, what="model.ckpt-3.pt")
        proc.kill()
        assert proc.wait() == -signal.SIGKILL
    assert training.main(argv) == 0  # at once: the worker may still be alive
    assert_bit_identical(os.path.join(uninterrupted[0], "model.ckpt-30.pt"), os.path.join(out, "model.ckpt-30.pt"))
