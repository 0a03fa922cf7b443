"""Stops and restarts on every launch path (issue 23): SIGKILL and an immediate rerun, SIGTERM
under the torchrun wrapper, a rank or its loader worker killed, a busy MASTER_PORT."""
import contextlib
import gc
import json
import multiprocessing.util
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
import types

import pytest
import torch

from mlperf_bert import locking
from mlperf_bert.errors import UserError
from procs import alive, children, fake_cgroup, start_time, state, stop_as_handlers_are_set, tree
from test_training import files, one_thread, uninterrupted, without_no_eval_warning  # noqa: F401 (fixtures; one thread, as there)

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


# ---------------------------------------------------------------- the background checkpoint writer

BACKGROUND_WRITES = textwrap.dedent("""\
    import sys, torch
    from mlperf_bert.trainer import checkpoint
    out, writer = sys.argv[1], checkpoint.BackgroundWriter()
    weights = torch.zeros(16 * 2**20 // 4)  # 16 MB: each write takes a while
    for step in range(1, 10000):
        weights.fill_(step)  # an update
        writer.submit(checkpoint.path_for(out, step), checkpoint.host_copy({"model": {"w": weights}}), keep=2)
        weights.fill_(-1)  # training goes on while the copy is written
    """)


def test_a_kill_during_a_background_write_leaves_no_file_that_looks_finished(tmp_path):
    """SIGKILL while the writer thread writes: the checkpoints with a finished name are complete and
    hold their step's state (the copy, not the weights training changed since); the one cut off
    has a temporary name, which list_checkpoints never takes and the next run removes."""
    from mlperf_bert.fileio import remove_stale_temporaries
    from mlperf_bert.trainer import checkpoint
    out = tmp_path / "out"
    out.mkdir()
    from test_fileio import signal_while
    proc = subprocess.Popen([PY, "-c", BACKGROUND_WRITES, str(out)], env=ENV, start_new_session=True)

    def writing():  # past the first checkpoint, into a later write
        return any(".pt.tmp-" in n for n in os.listdir(out)) and checkpoint.list_checkpoints(str(out))
    try:  # killed while frozen where the condition holds: the write may end between a look and a kill
        assert signal_while(proc, writing, signal.SIGKILL), "the writer ended before a write in progress was seen"
    finally:
        proc.kill()
        proc.wait()
    cut = [n for n in os.listdir(out) if ".pt.tmp-" in n]
    done = checkpoint.list_checkpoints(str(out))
    (out / "model.ckpt-99.pt\n").write_text("x")  # a name ending in a newline is no checkpoint ("$" took it)
    assert checkpoint.list_checkpoints(str(out)) == done
    os.remove(out / "model.ckpt-99.pt\n")
    assert done and len(done) <= 2 and len(cut) == 1, os.listdir(out)  # killed during a write
    from mlperf_bert.trainer.tf_checkpoint import load_pt  # (a state of weights alone: no resume's checks)
    for step, path in done:
        w = load_pt(path)["model"]["w"]
        assert w.numel() == 4 * 2**20 and bool((w == step).all()), path
    assert sorted(os.listdir(out)) == sorted(cut + [os.path.basename(p) for _, p in done])
    assert remove_stale_temporaries(str(out)) == cut  # the trainer does this when it starts


# ---------------------------------------------------------------- the trainer

# sitecustomize: PyTorch's DataLoader workers look at their parent (its watchdog) every 600 s, not every 5 s
SLOW_WORKER_WATCHDOG = textwrap.dedent("""\
    import importlib.abc, importlib.util, sys

    class Hook(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != "torch.utils.data._utils.worker":
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(name)
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                module.MP_STATUS_CHECK_INTERVAL = 600.0
            spec.loader.exec_module = exec_module
            return spec
    sys.meta_path.insert(0, Hook())
""")


@pytest.mark.slow
def test_sigkilled_trainer_rerun_at_once_resumes_and_ends_bit_identical(files, uninterrupted, tmp_path, short_tmpdir):
    """The same command rerun the moment the killed trainer is gone (its DataLoader worker may still
    run: the old test waited for the worker to close the output pipe) starts, resumes, and ends
    bit-identical to the uninterrupted run. (It is also test_training.py's SIGKILL case of
    test_killed_and_rerun_ends_bit_identical, per-replica clipping, which ran the same command.)"""
    from mlperf_bert.trainer import training
    from test_training import assert_bit_identical, flags_for
    out = str(tmp_path / "run")
    argv = flags_for(files, out)  # one DataLoader worker
    hook = tmp_path / "hook"  # PyTorch's worker looks at its parent every 5 s: here every 600 s, past the wait
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(SLOW_WORKER_WATCHDOG)
    with open(tmp_path / "first.log", "w") as log:
        # its multiprocessing folder, which the kill leaves, in a $TMPDIR of the test's
        proc = subprocess.Popen([PY] + argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                env=dict(ENV, TMPDIR=short_tmpdir, PYTHONPATH="%s:%s" % (ROOT, hook)))
        wait_until(lambda: os.path.exists(os.path.join(out, "model.ckpt-3.pt")), proc, what="model.ckpt-3.pt")
        workers = [(w, start_time(w)) for w in children(proc.pid)]
        assert workers  # its DataLoader worker
        try:
            proc.kill()
            assert proc.wait() == -signal.SIGKILL
            # which dies with it (PR_SET_PDEATHSIG), not at PyTorch's watchdog's next look
            wait_until(lambda: not any(alive(w) and start_time(w) == t for w, t in workers), timeout=60,
                       what="the killed trainer's loader worker's end")
        finally:
            for w, t in workers:
                if start_time(w) == t:
                    os.kill(w, signal.SIGKILL)
    assert training.main(argv) == 0  # at once
    assert_bit_identical(os.path.join(uninterrupted[0], "model.ckpt-30.pt"), os.path.join(out, "model.ckpt-30.pt"))


# ---------------------------------------------------------------- torchrun, through the wrapper

TORCHRUN = os.path.join(ROOT, "tests", "data", "torchrun")


def filtered(name, ooms=None, output_dir=None, node=0):
    """torchrun's real stderr of a case (tests/data/torchrun) through the wrapper's filter (``ooms``: the
    out-of-memory killer's count as torchrun started; ``output_dir``: the ranks', on node ``node``)."""
    import io
    from mlperf_bert.trainer.launch import Filter
    out = io.StringIO()
    f = Filter(out, ooms, output_dir, node)
    with open(os.path.join(TORCHRUN, "torchrun_%s.txt" % name)) as lines:
        for line in lines:
            f.feed(line)
    status = f.status(1)  # torchrun's own exit status in every case
    return out.getvalue().splitlines(), status


def test_torchrun_sigterm_traceback_is_dropped():
    lines, _ = filtered("sigterm")  # the wrapper exits 143 itself after a SIGTERM
    assert lines == []


def test_torchrun_sigterm_traceback_after_a_progress_bars_redraw_is_dropped():
    """Issue 33: a progress bar's last redraw (carriage returns and spaces, no newline) and the
    traceback's first line arrived as one line, so the traceback was shown; the redraw is kept."""
    import io
    from mlperf_bert.trainer.launch import Filter
    out = io.StringIO()
    f = Filter(out)
    redraw = "\r  0%|          | 3/3000 [00:09<2:30:00, 3.0s/step]\r" + " " * 60 + "\r"
    with open(os.path.join(TORCHRUN, "torchrun_sigterm.txt")) as lines:
        for n, line in enumerate(lines):
            f.feed(redraw + line if line.startswith("Traceback") else line)
    f.status(1)
    assert out.getvalue() == redraw


def with_checkpoint(folder):
    """``folder`` (made) holding a training checkpoint: a run a rerun resumes."""
    os.makedirs(folder, exist_ok=True)
    open(os.path.join(folder, "model.ckpt-3.pt"), "wb").close()
    return str(folder)


def test_a_killed_rank_is_one_line_with_its_signals_status(tmp_path):
    """Issue 23 sweep: 98 lines and exit 247 (bash's -9) for a rank SIGKILLed under NUM_GPUS=2."""
    lines, status = filtered("rank_killed", output_dir=with_checkpoint(tmp_path / "out"))
    assert status == 137
    assert len(lines) == 1 and lines[0].startswith("error: rank 1 (local rank 1, pid ") and \
        "was killed by SIGKILL" in lines[0] and "rerun the same command to resume" in lines[0], lines


def test_a_killed_ranks_line_says_what_its_output_dir_holds(tmp_path):
    """A review: a rank (or torchrun, or a rank's DataLoader worker) killed before the first checkpoint
    was said to leave "the checkpoints written so far are kept; rerun ... to resume from the newest":
    nothing was saved, and the rerun starts again. The line now says what --output_dir holds; a node
    other than 0 (rank 0 on node 0 writes the checkpoints: a disk of its own holds none) and an unknown
    folder cannot tell, and say the rerun resumes if node 0's holds one."""
    from mlperf_bert.trainer.launch import killed_line, node_of
    fresh, resumed = str(tmp_path / "fresh"), with_checkpoint(tmp_path / "resumed")
    os.makedirs(fresh)
    head = "error: rank 1 (local rank 1, pid 19477 on host localhost) was killed by SIGKILL: "
    assert filtered("rank_killed", output_dir=resumed) == (
        [head + "the checkpoints written so far are kept; rerun the same command to resume from the newest"], 137)
    assert filtered("rank_killed", output_dir=fresh) == (
        [head + "no checkpoint was written, nothing saved; rerun the same command to start again"], 137)
    assert filtered("rank_killed", output_dir=fresh, node=1) == (
        [head + "this node's --output_dir holds no checkpoint (rank 0 on node 0 writes them): rerun the same command "
         "on every node, which resumes from node 0's newest checkpoint if there is one, else starts again"], 137)
    assert filtered("rank_killed", output_dir=resumed, node=1)[0][0].endswith("to resume from the newest")
    assert filtered("rank_killed")[0] == [head + "rerun the same command: it resumes from the newest checkpoint if "
                                                 "there is one, else starts again"]
    assert killed_line("torchrun (pid 7)", signal.SIGTERM, None, fresh) == (
        "error: torchrun (pid 7) was killed by SIGTERM: no checkpoint was written, nothing saved; rerun the same "
        "command to start again\n")
    # the node: torchrun's --node_rank (train_model.sh passes NODE_RANK so), else its PET_NODE_RANK
    assert node_of(["--nnodes=2", "--node_rank=1", "run_pretraining.py", "--node_rank=0"], {}) == 1
    assert node_of(["--nnodes", "1:4", "--node-rank", "1", "run_pretraining.py"], {}) == 1
    assert node_of(["run_pretraining.py"], {"PET_NNODES": "2", "PET_NODE_RANK": "1"}) == 1
    assert node_of(["--nnodes=2", "run_pretraining.py"], {}) == 0


def test_a_wrapper_or_rank_alone_on_its_node_is_node_0_whatever_node_rank_says(tmp_path):
    """A review: the wrapper took the environment's NODE_RANK (a job's, exported for other commands) as
    its node where torchrun does not read it: `NODE_RANK=1 python -m mlperf_bert torchrun --standalone ...`
    (the one node, rank 0 on it) said of a killed rank "this node's --output_dir holds no checkpoint
    (rank 0 on node 0 writes them)", and its ranks (GROUP_RANK 0) "no checkpoint was written"; a trainer
    run alone (one process, rank 0) with NODE_RANK=1 said the same. Both are node 0 there."""
    from mlperf_bert.start_signals import node_rank
    from mlperf_bert.trainer.launch import killed_line, node_of
    fresh = str(tmp_path / "fresh")
    os.makedirs(fresh)
    job = {"NODE_RANK": "1", "PET_NODE_RANK": "1"}
    for args in (["--standalone", "--nproc_per_node=2", "run_pretraining.py"], ["--nproc_per_node=2", "run_pretraining.py"],
                 ["--nnodes=1", "--node_rank=1", "run_pretraining.py"]):
        node = node_of(args, job)
        assert killed_line("torchrun (pid 7)", signal.SIGKILL, None, fresh, node) == (
            "error: torchrun (pid 7) was killed by SIGKILL: no checkpoint was written, nothing saved; rerun the same "
            "command to start again\n"), args
    assert node_of(["--nnodes=2", "run_pretraining.py"], {"PET_STANDALONE": "1", "PET_NODE_RANK": "1"}) == 0
    # a rank: its GROUP_RANK (torchrun's); run alone, rank 0; under another launcher, its NODE_RANK
    assert node_rank({"GROUP_RANK": "2", "NODE_RANK": "1", "WORLD_SIZE": "8"}) == 2
    assert node_rank({"GROUP_RANK": "0", "NODE_RANK": "1", "WORLD_SIZE": "8"}) == 0
    assert node_rank({"NODE_RANK": "1"}) == node_rank({"NODE_RANK": "1", "WORLD_SIZE": "1"}) == 0
    assert node_rank({"NODE_RANK": "1", "WORLD_SIZE": "8"}) == 1


def test_a_stop_at_start_on_a_node_other_than_0_without_a_checkpoint_does_not_say_nothing_was_saved(tmp_path):
    """A review: a resumed multi-node run with a node-local --output_dir stopped as it started: node 0
    (its folder holds the checkpoint) said 143, "rerun the same command to resume", and node 1, whose
    folder holds none (rank 0 alone writes them), "no checkpoint written" (79): it cannot know. Its
    line now says node 0's status tells; its status stays 79 (the Slurm job takes node 0's 143 over
    it); node 0, and a node whose folder holds one, are as they were."""
    from mlperf_bert.start_signals import not_saved_line, stopped_at_start
    fresh, resumed = str(tmp_path / "fresh"), with_checkpoint(tmp_path / "resumed")
    os.makedirs(fresh)
    when = "before the ranks started"
    assert stopped_at_start("SIGTERM", when, resumed, 0) == (
        "SIGTERM before the ranks started: stopped at once, nothing trained; rerun the same command to resume\n", 143)
    assert stopped_at_start("SIGTERM", when, resumed, 1) == stopped_at_start("SIGTERM", when, resumed, 0)
    assert stopped_at_start("SIGTERM", when, fresh, 0) == (not_saved_line("SIGTERM", when), 79)
    assert stopped_at_start("SIGINT", when, fresh, 1) == (
        "SIGINT before the ranks started: stopped at once, nothing trained; this node's --output_dir holds no "
        "checkpoint (rank 0 on node 0 writes them): node 0's status says whether one holds the run (exit 79 here); "
        "rerun the same command on every node\n", 79)
    assert stopped_at_start("SIGTERM", when, None, 1) == (not_saved_line("SIGTERM", when), 79)


def test_a_rank_the_out_of_memory_killer_ended_names_the_memory_limit(tmp_path, monkeypatch):
    """A sweep: a trainer over its container's memory limit (a control group's memory.max; a tiny trainer
    under 200 MB) ended 137 with "killed by SIGKILL" alone. Where the group's count of out-of-memory kills
    grew since torchrun started, the line says the limit was reached and names it; unchanged (another's
    SIGKILL), the line is as it was."""
    from mlperf_bert import cgroups, fileio
    fake_cgroup(monkeypatch, tmp_path, "0::/\n", {"memory.max": "209715200\n", "memory.events": "oom 0\noom_kill 0\n"})
    monkeypatch.setattr(fileio, "host_memory", lambda: 1 << 40)
    ooms = cgroups.oom_kills()  # as the wrapper starts torchrun
    out = with_checkpoint(tmp_path / "out")
    plain, status = filtered("rank_killed", ooms, out)
    assert status == 137 and len(plain) == 1 and "was killed by SIGKILL: the checkpoints" in plain[0], plain
    (tmp_path / "sys" / "memory.events").write_text("oom 1\noom_kill 1\n")
    assert filtered("rank_killed", ooms, out) == ([plain[0].replace(
        "was killed by SIGKILL: ", "was killed by SIGKILL, sent by the out-of-memory killer: the memory limit was "
        "reached, 200.0 MiB (this process's control group's memory.max): give it more (a container's --memory, "
        "Slurm's --mem) or use less (a smaller --train_batch_size, fewer --num_workers): ")], 137)


def test_a_rank_killed_after_it_hung_is_named_as_stopped(tmp_path):
    """A hang sweep: rank 1 stopped (kill -STOP, a debugger) mid-run or before it joined the process
    group: rank 0 waited 30 min in a collective (torch's timeout), left, and torchrun killed rank 1,
    said to be "killed by SIGKILL" as if someone had, after c10d's C++ warnings of rank 0's wait. The
    agent notes the rank it ends that could not act (STUCK_MARK); the line says so, the warnings go."""
    import io
    from mlperf_bert.trainer.launch import STUCK_MARK, Filter
    out = io.StringIO()
    f = Filter(out, output_dir=with_checkpoint(tmp_path / "out"))
    f.feed("[W1207 14:01:44.352842614 socket.cpp:494] [c10d] waitForInput: socket SocketImpl(fd=3, addr=[::ffff:127."
           "0.0.1]:41664, remote=[::ffff:127.0.0.1]:33113) timed out after 1800000ms\n")
    f.feed(STUCK_MARK + "1 stopped (state T: SIGSTOP or a debugger)\n")
    with open(os.path.join(TORCHRUN, "torchrun_rank_killed.txt")) as lines:
        for line in lines:
            f.feed(line)
    assert f.status(1) == 137
    assert out.getvalue() == ("error: rank 1 (local rank 1, pid 19477 on host localhost), stopped (state T: SIGSTOP "
                              "or a debugger) as another rank ended (its collectives wait for this one up to torch's "
                              "process-group timeout: 30 min, NCCL's 10), was killed by SIGKILL: the checkpoints written so far "
                              "are kept; rerun the same command to resume from the newest\n")


def test_c10d_warnings_backtrace_is_dropped_with_it():
    """A Slurm sweep: a resumed two-node job that finished printed 16 lines of a C++ backtrace (rank 1's
    store wait as rank 0 ended): c10d's warning line went, the backtrace it quotes stayed. Both go; the
    rank's own lines before and after are kept."""
    import io
    from mlperf_bert.trainer.launch import Filter
    out = io.StringIO()
    f = Filter(out)
    for line in ["trained 120 steps\n",
                 "[W1207 14:14:04.353101021 TCPStore.cpp:125] [c10d] recvValue failed on SocketImpl(fd=3, addr=[n2]:4,"
                 " remote=[n1]:20001): Failed to recv, got 0 bytes. Connection was likely closed.\n",
                 "Exception raised from recvBytes at /__w/pytorch/pytorch/torch/csrc/distributed/c10d/Utils.hpp:787 "
                 "(most recent call first):\n",
                 "frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x9d (0x7f88e6379b8d in libc10.so)\n",
                 "frame #9: <unknown function> + 0x3d2825 (0x7f88e4dd2825 in libtorch_python.so)\n",
                 "<omitting python frames>\n",
                 "frame #31: _start + 0x21 (0x5585e5f83081 in /tmp/wtA2/.venv/bin/python)\n",
                 "\n", "\n", "ENDING TIMING RUN AT 2026-12-07 02:14:04 PM\n"]:
        f.feed(line)
    assert f.status(0) == 0
    assert out.getvalue() == "trained 120 steps\n\nENDING TIMING RUN AT 2026-12-07 02:14:04 PM\n"


def test_a_ranks_killed_loader_worker_is_the_ranks_one_line():
    """The rank whose worker died says so (exit 137); rank 0, SIGTERMed by torchrun after it lost
    its peer, is not the news."""
    lines, status = filtered("worker_killed")
    assert status == 137
    assert len(lines) == 1 and lines[0].startswith("error: rank 1: its data loader worker (pid ") and \
        "killed by SIGKILL" in lines[0], lines


def test_master_port_in_use_is_one_line_naming_the_port():
    lines, status = filtered("port_in_use")
    assert status == 2 and lines == [
        "error: --master_port 29511 (MASTER_PORT) is in use on this host: another run or program listens on it; "
        "choose a free port (e.g. MASTER_PORT=29512) or end what holds it"]


def test_a_rank_that_only_lost_its_peer_on_another_node_says_so():
    """On a node whose ranks only saw another node's rank go, their line is the one shown."""
    import io
    from mlperf_bert.trainer.distributed import PEER_LOST, PEER_LOST_STATUS
    from mlperf_bert.trainer.launch import Filter
    out = io.StringIO()
    f = Filter(out)
    report = ["error: rank 2 %s (Connection closed by peer): ...\n" % PEER_LOST,
              "Traceback (most recent call last):\n", "  File x\n",
              "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n",
              "Root Cause (first observed failure):\n", "[0]:\n", "  host      : node1\n",
              "  rank      : 2 (local_rank: 0)\n", "  exitcode  : %d (pid: 7)\n" % PEER_LOST_STATUS]
    for line in report:
        f.feed(line)
    assert f.status(1) == PEER_LOST_STATUS and out.getvalue() == report[0]


def test_a_rank_whose_peer_failed_at_its_start_is_a_follower_as_a_lost_peer_is():
    """Rank 0's line and status 80 (its peer failed at its start) are shown only on a node where no
    rank explains the failure: there, rank 1's refusal (2) is the run's."""
    import io
    from mlperf_bert.trainer.launch import PEER_FAILED_AT_START_STATUS, PEER_LOST, Filter
    lost = "error: rank 0 %s (Connection closed by peer) before the training began: ...\n" % PEER_LOST
    for other, status, shown in ((None, PEER_FAILED_AT_START_STATUS, lost),
                                 ("error: --input_file x does not exist\n", 2, "error: --input_file x does not exist\n")):
        out = io.StringIO()
        f = Filter(out)
        report = [lost] + ([other] if other else []) + [
            "Traceback (most recent call last):\n", "  File x\n",
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n", "Root Cause (first observed failure):\n",
            "[0]:\n", "  rank      : 0 (local_rank: 0)\n", "  exitcode  : %d (pid: 7)\n" % PEER_FAILED_AT_START_STATUS]
        if other:
            report += ["Other Failures:\n", "[1]:\n", "  rank      : 1 (local_rank: 1)\n", "  exitcode  : 2 (pid: 8)\n"]
        for line in report:
            f.feed(line)
        assert f.status(1) == status and out.getvalue() == shown


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_sent_to_one_rank_as_it_starts_is_a_stop_that_saved_nothing(sig):
    """A sweep: SIGTERM to rank 1 alone (a scheduler or an operator signalling one process) while it
    started (its imports; the process group's making), before it had set up its stop: the signal's
    default action ended it, and the wrapper said "rank 1 ... was killed by SIGTERM: the checkpoints
    written so far are kept; rerun the same command to resume" and exited 143, which says a checkpoint
    holds the run, for a fresh run that saved nothing (3 s later, in its untimed init, the same stop
    was 79). Now the stop that saved nothing: its line, 79, as a stop through the wrapper then."""
    import io
    from mlperf_bert.trainer.launch import NOT_SAVED_STATUS, Filter
    out = io.StringIO()
    f = Filter(out)
    report = ["Traceback (most recent call last):\n", "  File x\n",
              "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n", "Failures:\n", "[1]:\n",
              "  host      : localhost\n", "  rank      : 0 (local_rank: 0)\n",
              "  exitcode  : -15 (pid: 8) (SIGTERM)\n", "Root Cause (first observed failure):\n", "[0]:\n",
              "  host      : localhost\n", "  rank      : 1 (local_rank: 1)\n",
              "  exitcode  : %d (pid: 9) (%s)\n" % (-sig, sig.name)]
    for line in report:
        f.feed(line)
    assert f.status(1) == NOT_SAVED_STATUS
    assert out.getvalue() == (
        "%s before rank 1 (local rank 1, pid 9 on host localhost) had set up its stop: no checkpoint written (exit "
        "79, not 143); rerun the same command: it resumes from the newest checkpoint if there is one, else starts "
        "again\n" % sig.name)


def _tiny_args(files, out, progress=False):
    return ["--preset=demo_cpu", "--bert_config_file=%s" % files["config"], "--max_seq_length=128",
            "--max_predictions_per_seq=20", "--train_batch_size=4", "--num_train_steps=3000",
            "--save_checkpoints_steps=3", "--seed=7", "--num_workers=1", "--device=cpu",
            # one eval, at the end (12,000 samples), which the stops come long before: not a run warned
            # at its start that no eval reaches it
            "--nodo_eval", "--eval_frequency=12000"] + ([] if progress else ["--noprogress"])


def _launch(files, tmp_path, tmpdir, progress=False, **env):
    out = tmp_path / "run"
    e = {k: v for k, v in ENV.items() if k not in ("DATA_DIR", "PRESET")}
    # $TMPDIR (a short path, see conftest.short_tmpdir): left empty (issue 33); torch's compile
    # cache, one per user, elsewhere
    e.update(INPUT_FILES=files["train"], EVAL_FILE=files["eval"], NUM_GPUS="2", OUTPUT_DIR=str(out),
             PYTHON=PY, TMPDIR=tmpdir, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"), **env)
    stdout, stderr = open(tmp_path / "stdout", "w+"), open(tmp_path / "stderr", "w+")
    proc = subprocess.Popen([os.path.join(ROOT, "train_model.sh")] + _tiny_args(files, out, progress), env=e,
                            stdout=stdout, stderr=stderr, start_new_session=True)
    return proc, out, stdout, stderr


def _read(f):
    f.seek(0)
    return f.read()


def _ranks(wrapper_pid):
    """{local rank: pid} of the torchrun under the wrapper (its children's children)."""
    found = {}
    for agent in children(wrapper_pid):
        for pid in children(agent):
            with contextlib.suppress(OSError):
                env = open("/proc/%d/environ" % pid, "rb").read().split(b"\0")
                if any(v.startswith(b"TORCHELASTIC_RUN_ID=") for v in env):
                    found[next(int(v.split(b"=")[1]) for v in env if v.startswith(b"LOCAL_RANK="))] = pid
    return found


@pytest.mark.slow
# each signal once and the bar on and off once: the filter drops torchrun's traceback of either
# signal the same way, after a redraw or not (test_torchrun_sigterm_traceback_after_a_progress_
# bars_redraw_is_dropped replays a SIGTERM one through it)
@pytest.mark.parametrize("progress,sig", [(False, signal.SIGTERM), (True, signal.SIGINT)],
                         ids=["SIGTERM", "SIGINT-progress"])
def test_a_signal_under_two_ranks_is_one_line_once_naming_it(files, tmp_path, short_tmpdir, progress, sig):
    """Issue 23 item 2: `NUM_GPUS=2 ./train_model.sh` (the wrapper), SIGTERM to it: every rank
    checkpoints, rank 0 says so once, no torchrun traceback, exit 143; the checkpoint is kept.
    Issue 33: with the progress bar on (the default), its last redraw (carriage returns, no
    newline) and torchrun's traceback arrived as one line, and the traceback was shown. Issue 37
    (13): Ctrl-C (SIGINT) checkpointed and exited 130 but said "SIGTERM: checkpoint ...": the
    wrapper passes it on as itself and the ranks name it."""
    proc, out, stdout, stderr = _launch(files, tmp_path, short_tmpdir, progress)
    wait_until(lambda: os.path.exists(out / "model.ckpt-3.pt"), proc, what="model.ckpt-3.pt")
    proc.send_signal(sig)
    assert proc.wait(timeout=300) == 128 + sig, _read(stdout) + _read(stderr)
    lines = [l for l in _read(stdout).splitlines() if not l.startswith("train_model.sh: preset")]
    assert len(lines) == 1 and lines[0].startswith("%s: checkpoint model.ckpt-" % sig.name), _read(stdout)
    err = _read(stderr)
    if progress:  # the bar, a line per redraw in a file, and nothing else
        import re
        bar = [l for l in err.splitlines() if re.match(r"^train: *\d+%\|.*\| \d+/3000 \[", l)]
        assert bar and err == "".join(l + "\n" for l in bar), err
    else:
        assert err == ""
    assert (out / lines[0].split()[2]).exists()
    assert os.listdir(short_tmpdir) == []


@pytest.mark.slow
def test_a_ranks_loader_worker_killed_under_two_ranks_is_one_line(files, tmp_path, short_tmpdir):
    """Issue 23 sweep: rank 1's DataLoader worker SIGKILLed under NUM_GPUS=2 -> the rank's one line,
    exit 137, the checkpoints kept (a rerun resumes)."""
    proc, out, stdout, stderr = _launch(files, tmp_path, short_tmpdir)
    wait_until(lambda: os.path.exists(out / "model.ckpt-3.pt"), proc, what="model.ckpt-3.pt")
    rank1 = _ranks(proc.pid)[1]  # train_model.sh execs the wrapper: proc.pid is the wrapper
    worker = int(open("/proc/%d/task/%d/children" % (rank1, rank1)).read().split()[0])
    os.kill(worker, signal.SIGKILL)
    assert proc.wait(timeout=300) == 137, _read(stderr)
    lines = _read(stderr).splitlines()
    assert lines == ["error: rank 1: its data loader worker (pid %d) was killed by SIGKILL: the checkpoints "
                     "written so far are kept; rerun the same command to resume from the newest" % worker]
    assert (out / "model.ckpt-3.pt").exists()
    assert os.listdir(short_tmpdir) == []


def test_a_sigcont_while_the_wrapper_stops_the_ranks_leaves_every_process_running(monkeypatch):
    """A review: a SIGCONT (fg right after Ctrl-Z) handled while the wrapper was stopping the ranks
    continued those stopped so far; the rest were stopped after it, and the wrapper stopped itself:
    ranks stood stopped (or trained on) with nothing left to continue them. Now such a suspension
    continues the ranks again and the wrapper goes on."""
    from mlperf_bert.trainer import launch
    monkeypatch.setattr(launch, "_marked", lambda marker: {11: 1, 12: 11, 13: 1})
    sent, fg = [], [True]  # fg: one SIGCONT
    suspension = launch.Suspension(b"X")

    def kill(pid, signum):
        sent.append((pid, signum))
        if (pid, signum) == (12, signal.SIGSTOP) and fg:
            fg.clear()
            suspension.resume()  # the SIGCONT's handler, run between two of the wrapper's kills
    monkeypatch.setattr(os, "kill", kill)
    suspension.suspend()
    last = {}
    for pid, signum in sent:
        last[pid] = signum
    assert last == {11: signal.SIGCONT, 12: signal.SIGCONT, 13: signal.SIGCONT}, sent  # not os.getpid()'s SIGSTOP
    sent.clear()
    suspension.suspend()  # a Ctrl-Z alone: the ranks, then the wrapper
    assert sent == [(11, signal.SIGSTOP), (12, signal.SIGSTOP), (13, signal.SIGSTOP), (os.getpid(), signal.SIGSTOP)]


@pytest.mark.slow
def test_ctrl_z_under_two_ranks_suspends_every_rank_and_fg_resumes_them(files, tmp_path, short_tmpdir):
    """Ctrl-Z (SIGTSTP to the job's process group) of `NUM_GPUS=2 ./train_model.sh`: the wrapper
    stood stopped while torchrun and its ranks, each in a group of its own, trained on (checkpoints
    10 to 160 written while "suspended"). Now every process of the run stops, goes on after SIGCONT
    (`fg`), and a SIGTERM then still checkpoints: 143, its one line."""
    proc, out, stdout, stderr = _launch(files, tmp_path, short_tmpdir)
    wait_until(lambda: os.path.exists(out / "model.ckpt-3.pt"), proc, what="model.ckpt-3.pt")
    run = {pid: start_time(pid) for pid in tree(proc.pid)}  # the wrapper, torchrun's agent, the ranks, their workers

    def states():  # (a pid that ended may be taken by another test's process, maybe a stopped one)
        return {pid: state(pid) for pid, started in run.items() if start_time(pid) == started}
    assert len(run) >= 6, run
    os.killpg(proc.pid, signal.SIGTSTP)
    wait_until(lambda: set(states().values()) <= {"T"}, what="every process of the run stopped")
    os.killpg(proc.pid, signal.SIGCONT)
    try:
        wait_until(lambda: "T" not in states().values(), proc, what="every process of the run resumed")
    except AssertionError as e:  # which stood stopped
        raise AssertionError("%s: %s" % (e, states())) from None
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=300) == 143, _read(stdout) + _read(stderr)
    lines = [l for l in _read(stdout).splitlines() if not l.startswith("train_model.sh: preset")]
    assert len(lines) == 1 and lines[0].startswith("SIGTERM: checkpoint model.ckpt-"), _read(stdout)
    assert _read(stderr) == ""
    assert os.listdir(short_tmpdir) == []



# Each rank waits before its micro-step 4 (0-based) until it has the stop signal itself, saying so in
# MARKS/at4.RANK first: the stop's update is then known (2 micro-steps an update, the ranks' vote
# read an update later: model.ckpt-8.pt).
STOP_AT_STEP_4 = textwrap.dedent("""\
    import os, sys, time
    from mlperf_bert.cli import run_main
    from mlperf_bert.trainer import training
    got, handle, step = [], training._Stop._handle, training.Trainer.step

    def on_signal(self, signum, frame):
        got.append(signum)
        handle(self, signum, frame)

    def waiting_step(self, batch, global_step):
        if global_step == 4:
            open(os.path.join(sys.argv[1], "at4.%s" % os.environ["RANK"]), "w").close()
            while not got:
                time.sleep(0.01)
        return step(self, batch, global_step)
    training._Stop._handle, training.Trainer.step = on_signal, waiting_step
    run_main(training.main, ["run_pretraining.py"] + sys.argv[2:])
""")


@pytest.mark.slow
def test_sigterm_to_every_process_of_two_ranks_with_workers_checkpoints_once_and_resumes_bit_identical(
        files, tmp_path, short_tmpdir):
    """Issue 45: Slurm under proctrack/linuxproc (scancel, its time limit, requeue), systemd's control-group
    kill or `kill -TERM` of every pid signal every process of the job: each rank's DataLoader worker
    died first, the ranks stopped on "its data loader worker was killed by SIGTERM" and nothing was
    saved (the rcp_* presets checkpoint only on a stop). SIGTERM to all six processes at once (the
    wrapper, torchrun, 2 ranks, their workers), before any periodic checkpoint: torchrun and the
    wrapper pass it on once, the ranks checkpoint, one line, exit 143; the same command resumes and
    ends bit-identical to a run never stopped (run in the same launch, RUNS_IN_ONE_LAUNCH). Two
    training files, one a rank's start check: the checkpoint's identity holds the CRCs of every
    record of both (rank 1's gathered), as a scan here reads them."""
    from test_training import RUNS_IN_ONE_LAUNCH, assert_bit_identical, flags_for
    marks, out, full = tmp_path / "marks", str(tmp_path / "run"), str(tmp_path / "full")
    marks.mkdir()
    # one worker a rank; the stop's model.ckpt-8.pt, then one update (2 micro-steps) to the end
    inputs = [files["train"], files["eval"]]
    argv = flags_for(files, out, num_train_steps=10, save_checkpoints_steps=100, input_file=",".join(inputs))[1:]
    wrapper = [PY, "-m", "mlperf_bert", "torchrun", "--standalone", "--nproc_per_node=2"]
    # Not the compile cache this worker's os.environ names (torch's compiler, once imported here by any
    # test, sets TORCHINDUCTOR_CACHE_DIR in it): a rank that imports the compiler (it did at the model's
    # import, ~1 s of CPU; DDP's constructor still does, clipping after the reduction, not run here) makes
    # its default, TMPDIR/torchinductor_USER, which the check below sees
    env = {k: v for k, v in ENV.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    env["TMPDIR"] = short_tmpdir
    script = tmp_path / "stop_at_4.py"
    script.write_text(STOP_AT_STEP_4)
    with open(tmp_path / "stdout", "w+") as stdout, open(tmp_path / "stderr", "w+") as stderr:
        proc = subprocess.Popen(wrapper + [str(script), str(marks)] + argv, cwd=ROOT, env=env, stdout=stdout,
                                stderr=stderr, start_new_session=True)
        wait_until(lambda: len(os.listdir(marks)) == 2, proc, what="both ranks at micro-step 4")
        ranks = _ranks(proc.pid)
        workers = [w for r in ranks.values() for w in children(r)]
        pids = tree(proc.pid)
        assert len(ranks) == 2 and len(workers) == 2 and len(pids) == 6, (ranks, workers, pids)
        for pid in pids:  # at once, as a scheduler does
            os.kill(pid, signal.SIGTERM)
        assert proc.wait(timeout=300) == 143, _read(stdout) + _read(stderr)
        assert _read(stdout) == "SIGTERM: checkpoint model.ckpt-8.pt written; rerun the same command to resume\n"
        assert without_no_eval_warning(_read(stderr)) == ""
    assert os.path.exists(os.path.join(out, "model.ckpt-8.pt"))
    assert os.listdir(short_tmpdir) == []
    from mlperf_bert.trainer import loader
    recorded = torch.load(os.path.join(out, "model.ckpt-8.pt"), weights_only=False)["run"]["input_file"]
    assert [entry[3] for entry in recorded] == [loader.check_records([f])[f][1] for f in inputs]
    runs = tmp_path / "runs.py"
    runs.write_text(RUNS_IN_ONE_LAUNCH)
    full_argv = ["run_pretraining.py"] + [a if not a.startswith("--output_dir=") else "--output_dir=" + full
                                          for a in argv]
    r = subprocess.run(wrapper + [str(runs), json.dumps([["run_pretraining.py"] + argv, full_argv])], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "run 0: status 0" in r.stdout and "run 1: status 0" in r.stdout, r.stdout + r.stderr
    assert_bit_identical(os.path.join(full, "model.ckpt-10.pt"), os.path.join(out, "model.ckpt-10.pt"))


# Three moments at which the two ranks stand on either side of a line when the stop comes (sys.argv[2]):
# "run_start": rank 1 still in its untimed init (a stop there ends it at once), rank 0 just past
# run_start (a stop there is acted on at the next update, with every rank); "end": rank 0 about to
# write the finished marker (a stop there ends it at once, the run's end not written), rank 1 done,
# in its teardown, where the stop reaches it after rank 0 has left (its signals held until then);
# "finishing": rank 1 just in its finishing state (a stop there ends it at once), rank 0 about to
# write run_stopped.json (not yet finishing: it goes on, writes it, then finds rank 1 gone).
# Each rank marks MARKS/WHERE.RANK and waits for its signal.
STRADDLE = textwrap.dedent("""\
    import os, signal, sys, time
    from mlperf_bert.cli import run_main
    from mlperf_bert.trainer import checkpoint, distributed, training
    got, handle, started, finished, teardown = ([], training._Stop._handle, training._Stop.started,
                                                checkpoint.write_finished, distributed.teardown)
    stopped = checkpoint.write_stopped
    rank, where = os.environ["RANK"], sys.argv[2]

    def on_signal(self, signum, frame):
        got.append(signum)
        handle(self, signum, frame)

    def wait(mark):
        with open(os.path.join(sys.argv[1], mark + ".tmp" + rank), "w") as f:
            f.write(str(os.getpid()))
        os.rename(f.name, os.path.join(sys.argv[1], mark + "." + rank))
        while not got:
            time.sleep(0.01)

    def at_start(self):
        if where == "run_start" and rank == "1":
            wait("init")
        started(self)
        if where == "run_start" and rank == "0":
            wait("started")

    def at_finished(out, record):
        if where == "end":
            wait("end")
        finished(out, record)

    def at_stopped(out, record):
        if where == "finishing":
            wait("stopped")
        stopped(out, record)

    def set_in_init(self, value):  # the finishing state is entered by setting in_init after finishing
        self.__dict__["in_init"] = value
        if where == "finishing" and rank == "1" and value and getattr(self, "finishing", False):
            wait("finishing")

    def at_teardown(clean):
        if where == "end" and rank == "1":  # the stop has not reached it (yet): rank 0 leaves first
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, signal.SIG_IGN)
            open(os.path.join(sys.argv[1], "teardown.1"), "w").close()
            pid0 = os.path.join(sys.argv[1], "end.0")
            while not (os.path.exists(pid0) and open(pid0).read()):
                time.sleep(0.01)
            stat = "/proc/%d/stat" % int(open(pid0).read())
            while os.path.exists(stat) and open(stat).read().rsplit(")", 1)[1].split()[0] != "Z":
                time.sleep(0.01)  # rank 0 has left
        teardown(clean)
    training._Stop._handle, training._Stop.started, checkpoint.write_finished = on_signal, at_start, at_finished
    distributed.teardown, checkpoint.write_stopped = at_teardown, at_stopped
    training._Stop.in_init = property(lambda self: self.__dict__["in_init"], set_in_init)
    run_main(training.main, ["run_pretraining.py"] + sys.argv[3:])
""")


@pytest.mark.slow
@pytest.mark.parametrize("where,marks,status,line", [
    ("run_start", ("init.1", "started.0"), 79,
     "SIGTERM as the run started, while another rank was still in its untimed init (it stopped at once): no "
     "checkpoint written (exit 79, not 143: no checkpoint holds the run); rerun the same command to start again\n"),
    ("end", ("teardown.1", "end.0"), 143,
     "SIGTERM while the end of a run that ended earlier was written (its log is complete): stopped at once; rerun "
     "the same command to finish it\n"),
    ("finishing", ("finishing.1", "stopped.0"), 143,
     "SIGTERM while the end of a run that ended earlier was written (its log is complete): stopped at once; rerun "
     "the same command to finish it\n")], ids=["run_start", "end", "finishing"])
def test_a_stop_while_the_ranks_straddle_run_start_or_the_runs_end_is_one_line_and_its_status(
        files, tmp_path, short_tmpdir, where, marks, status, line):
    """2-rank stop stress: SIGTERM to every process as the run started, rank 1 still in its untimed init
    (it stopped at once, nothing saved) and rank 0 just past run_start: rank 0 made the stop vote's
    group (a collective) past run_start and waited there for rank 1, which had left, until torchrun's
    SIGKILL past TORCH_ELASTIC_SHUTDOWN_TIMEOUT (300 s; 30 here): "local rank 0 ... was killed by
    SIGKILL", 137. Now the group is made in the init, and a rank that loses its peer after a stop
    ends as the stop: one line, nothing saved, 79. And a stop of rank 0 while it wrote the run's
    end, rank 1 done and leaving: rank 1's teardown barrier found rank 0 gone, a RuntimeError
    traceback and exit 1. Now the ended rank leaves quietly: 143, the stop's one line. And a stop while
    rank 1 had just entered its finishing state (it stops at once) and rank 0 had not yet written
    run_stopped.json: rank 0 wrote it, then lost rank 1 at its next collective: "lost contact with
    another rank", 75 (the rerun finished the run). Now that loss is the stop's end: 143, its line."""
    from test_training import flags_for
    marks_dir = tmp_path / "marks"
    marks_dir.mkdir()
    script = tmp_path / "straddle.py"
    script.write_text(STRADDLE)
    out = tmp_path / "run"
    argv = flags_for(files, str(out), num_train_steps=4, save_checkpoints_steps=0)[1:]
    proc = subprocess.Popen([PY, "-m", "mlperf_bert", "torchrun", "--standalone", "--nproc_per_node=2", str(script),
                             str(marks_dir), where] + argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True,
                            env=dict(ENV, TMPDIR=short_tmpdir, TORCH_ELASTIC_SHUTDOWN_TIMEOUT="30"))
    wait_until(lambda: all((marks_dir / m).exists() for m in marks), proc, what="the ranks at their marks")
    for pid in reversed(tree(proc.pid)):  # at once, as a scheduler does
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=300)
    lines = [l for l in stdout.splitlines(True) if not l.startswith(("trained ", str(out)))]
    assert (proc.returncode, "".join(lines), without_no_eval_warning(stderr)) == (status, line, ""), (
        proc.returncode, stdout, stderr)
    assert not (out / "run_finished.json").exists()
    assert os.path.exists(out / "run_stopped.json") == (where != "run_start")


# A rank as the trainer answers a stop (FAKE_STATUS: the status it ends with instead of 128 + the signal)
FAKE_RANK = textwrap.dedent("""\
    import os, signal, sys, time
    got = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: got.append(signum))
    open(os.path.join(sys.argv[1], "rank%s" % os.environ["RANK"]), "w").close()
    while not got:
        time.sleep(0.01)
    sys.exit(int(os.environ.get("FAKE_STATUS", 128 + got[0])))
""")


@pytest.mark.parametrize("status", [143, 1])
def test_sigterm_to_torchrun_alone_is_the_ranks_stop(tmp_path, short_tmpdir, status):
    """Issue 45: SIGTERM to torchrun alone (not the wrapper: a scheduler that signals one process, an
    operator's kill) passed it to the ranks, which checkpointed, but torchrun raised its
    SignalException and exited 1, so train_model.sh did too. Now the status is what the ranks made
    of it: 143 when they stopped with their checkpoint, a rank's failure's own status otherwise
    (never 143 for a stop that saved nothing)."""
    marks = tmp_path / "marks"
    marks.mkdir()
    script = tmp_path / "rank.py"
    script.write_text(FAKE_RANK)
    env = dict(ENV, TMPDIR=short_tmpdir, **({} if status == 143 else {"FAKE_STATUS": str(status)}))
    proc = subprocess.Popen([PY, "-m", "mlperf_bert", "torchrun", "--standalone", "--nproc_per_node=2", str(script),
                             str(marks)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_until(lambda: len(os.listdir(marks)) == 2, proc, what="both ranks")
    (torchrun,) = children(proc.pid)
    os.kill(torchrun, signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == status and out == "" and err == "", (proc.returncode, out, err)



def test_torchrun_killed_with_a_rank_ends_the_rank_left_and_says_so(tmp_path, short_tmpdir):
    """Sweep: torchrun's agent and one rank SIGKILLed (the out-of-memory killer took both, NUM_GPUS=2): the
    other rank, hung in a collective in a session of its own, kept the wrapper's pipe open, and the wrapper
    waited for it (10 min and more, deaf to a stop: it went to the dead torchrun), then said "SIGTERM before
    torchrun started the ranks", exit 79. Now it ends the rank left (SIGTERM, then SIGKILL past
    TORCH_ELASTIC_SHUTDOWN_TIMEOUT) and names torchrun's death, 137."""
    from mlperf_bert.trainer.launch import killed_line
    marks = tmp_path / "marks"
    marks.mkdir()
    script = tmp_path / "rank.py"
    script.write_text(FAKE_RANK)
    proc = subprocess.Popen([PY, "-m", "mlperf_bert", "torchrun", "--standalone", "--nproc_per_node=2", str(script),
                             str(marks)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env=dict(ENV, TMPDIR=short_tmpdir))
    wait_until(lambda: len(os.listdir(marks)) == 2, proc, what="both ranks")
    (agent,) = children(proc.pid)
    ranks = {pid: start_time(pid) for pid in children(agent)}  # (a pid alone may be another process's later)
    os.kill(agent, signal.SIGKILL)
    os.kill(list(ranks)[-1], signal.SIGKILL)

    def left():
        return [pid for pid, started in ranks.items() if alive(pid) and start_time(pid) == started]
    try:
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        for pid in left():
            os.kill(pid, signal.SIGKILL)
        proc.kill()  # (a no-op once it has been waited for)
    assert (proc.returncode, stdout, stderr) == (137, "", killed_line("torchrun (pid %d)" % agent, signal.SIGKILL))
    assert not left()

# A rank as the trainer ends a stop: its bar's last state (stderr), then its stop's line (stdout), at once
BAR_THEN_LINE = textwrap.dedent("""\
    import sys
    for i in range(20):
        sys.stderr.write(" 5%%|#  | %d/3000 [00:30<09:30, 5.00step/s]\\n" % i)
        sys.stderr.flush()
        print("SIGTERM: checkpoint model.ckpt-%d.pt written; rerun the same command to resume" % i, flush=True)
""")


def test_a_ranks_lines_reach_one_log_in_the_order_written(tmp_path, short_tmpdir):
    """A sweep of log files: 2 ranks under the wrapper, `> log 2>&1`, SIGTERM: the log's last line was
    the bar's state at the stop, after the stop's line (1 of 4 tries): a rank's stdout went to the log
    at once, its stderr through the wrapper's filter, a process later. Where the wrapper's stdout and
    stderr are one, the ranks' are one pipe."""
    script = tmp_path / "rank.py"
    script.write_text(BAR_THEN_LINE)
    log = tmp_path / "log"
    with open(log, "w") as f:
        proc = subprocess.run([PY, "-m", "mlperf_bert", "torchrun", "--standalone", "--nproc_per_node=1", str(script)],
                              env=dict(ENV, TMPDIR=short_tmpdir), stdout=f, stderr=subprocess.STDOUT, timeout=120)
    lines = log.read_text().splitlines()
    assert proc.returncode == 0 and len(lines) == 40, lines
    assert [l.startswith("SIGTERM") for l in lines] == [False, True] * 20, lines


# A rank as the trainer starts (run_pretraining.py: outlive_readers first), counting the writes that
# reach its stdout and stderr
COUNTED_WRITES = textwrap.dedent("""\
    import sys
    from mlperf_bert import start_signals
    writes = []
    class Counted(start_signals._ReaderlessOutput):
        def write(self, b):
            writes.append(bytes(b))
            return super().write(b)
    start_signals._ReaderlessOutput = Counted
    start_signals.outlive_readers()
    for i in range(3):
        print("error: record %d is corrupt" % i, file=sys.stderr, flush=True)
        print("line %d" % i, flush=True)
    print("writes %d: %r" % (len(writes) + 1, writes), flush=True)
""")


def test_a_ranks_line_reaches_a_terminal_in_one_write(tmp_path, short_tmpdir):
    """A review: under the wrapper on a terminal (NUM_GPUS=4, a flag every rank refused at once),
    the ranks' lines ran together in its one pipe, "error: ...error: ..." and empty lines, 2 of 3 lines
    in a try of 4 ranks: PYTHONUNBUFFERED made each print two writes, its text and its newline. The
    trainer's lines are one write each, as a line-buffered stream writes them."""
    pty = pytest.importorskip("pty")
    script = tmp_path / "rank.py"
    script.write_text(COUNTED_WRITES)
    pid, fd = pty.fork()
    if pid == 0:  # (the child: the wrapper on a terminal, stdout and stderr one)
        os.environ.update(ENV, TMPDIR=short_tmpdir)
        try:
            os.execv(PY, [PY, "-m", "mlperf_bert", "torchrun", "--standalone", "--nproc_per_node=1", str(script)])
        finally:
            os._exit(127)
    out = b""
    with contextlib.suppress(OSError):  # (EIO: the terminal's last process gone)
        while True:
            got = os.read(fd, 65536)
            if not got:
                break
            out += got
    os.close(fd)
    status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    lines = out.decode().replace("\r\n", "\n").splitlines()
    assert status == 0 and lines[:6] == ["error: record 0 is corrupt", "line 0", "error: record 1 is corrupt",
                                         "line 1", "error: record 2 is corrupt", "line 2"], lines
    assert lines[6].startswith("writes 7: "), lines


# Rank 1 refuses its share of the files (a damaged one) in the untimed init, where rank 0 is still busy
# (its locks, its own share's scan: not waiting in a collective) when torchrun SIGTERMs it
RANK_1_FAILS_IN_THE_INIT = textwrap.dedent("""\
    import os, sys, time
    from mlperf_bert.cli import run_main
    from mlperf_bert.errors import UserError
    from mlperf_bert.trainer import training

    def main(argv):
        in_init = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rank0.in_init")
        with training._Stop():
            if os.environ["RANK"] == "1":
                while not os.path.exists(in_init):  # rank 0 in its init, its stop set up
                    time.sleep(0.01)
                raise UserError("part-1.tfrecord: record 35 is truncated: the file is incomplete")
            open(in_init, "w").close()
            time.sleep(120)
    run_main(main, sys.argv)
""")


def test_a_rank_failing_in_its_init_is_the_runs_one_line_not_a_stop_of_the_other(tmp_path, short_tmpdir):
    """A sweep: rank 1's share of --input_file held a truncated file, found by its start's scan while
    rank 0 still scanned its own; torchrun SIGTERMed rank 0, which printed "SIGTERM in the untimed init,
    before run_start: stopped at once, nothing trained and nothing saved (exit 79 ...); rerun the same
    command to start again" after rank 1's line: no one had stopped the run, and a rerun fails again.
    torchrun's agent now marks the failure before it ends the ranks left, and they leave without a line."""
    script = tmp_path / "rank.py"
    script.write_text(RANK_1_FAILS_IN_THE_INIT)
    proc = subprocess.Popen([PY, "-m", "mlperf_bert", "torchrun", "--standalone", "--nproc_per_node=2", str(script)],
                            env=dict(ENV, TMPDIR=short_tmpdir), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    out, err = proc.communicate(timeout=120)
    assert (proc.returncode, out, err) == (
        2, "", "error: part-1.tfrecord: record 35 is truncated: the file is incomplete\n"), (proc.returncode, out, err)
    assert os.listdir(short_tmpdir) == []


# A rank still in its start (its imports), SIGTERM's handler not set up yet
RANK_IN_ITS_START = textwrap.dedent("""\
    import os, sys, time
    open(os.path.join(sys.argv[1], "rank%s" % os.environ["RANK"]), "w").close()
    time.sleep(120)
""")


@pytest.mark.parametrize("resumed", [False, True], ids=["fresh", "resumed"])
def test_sigterm_to_every_process_while_the_ranks_start_is_a_stop_that_saved_nothing(tmp_path, short_tmpdir, resumed):
    """A scheduler's SIGTERM to every process of the job while the ranks still import (their
    handler not set up: the signal ends them): the wrapper said "error: local rank 0 ... was killed
    by SIGTERM: the checkpoints written so far are kept; ... resume from the newest" and exited 143,
    which says a checkpoint holds the run, for a fresh run that saved nothing (train_model.sh's own
    status: start_training.sh corrects it by the checkpoints it finds). Now one line that it saved
    nothing, exit 79, as a stop before the ranks started. A resumed run's (a checkpoint in the ranks'
    --output_dir, read from their command line) is 143, "rerun the same command to resume": it was 79 too
    (a sweep), and a script that resubmits on 143 stopped resubmitting it."""
    marks = tmp_path / "marks"
    marks.mkdir()
    script = tmp_path / "rank.py"
    script.write_text(RANK_IN_ITS_START)
    if resumed:
        (tmp_path / "out").mkdir()
        (tmp_path / "out" / "model.ckpt-6.pt").write_bytes(b"")
    proc = subprocess.Popen([PY, "-m", "mlperf_bert", "torchrun", "--standalone", "--nproc_per_node=2", str(script),
                             str(marks), "--output_dir", str(tmp_path / "out")], env=dict(ENV, TMPDIR=short_tmpdir),
                            stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    wait_until(lambda: len(os.listdir(marks)) == 2, proc, what="both ranks")
    pids = tree(proc.pid)
    assert len(pids) == 4, pids  # the wrapper, torchrun, 2 ranks
    for pid in reversed(pids):  # at once, as a scheduler does (a rank may be gone when its turn comes)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    if resumed:
        assert (proc.returncode, out) == (143, ""), (proc.returncode, out, err)
        assert re.fullmatch(r"SIGTERM before local rank [01] \(pid \d+\) had set up its stop: stopped at once, "
                            r"nothing trained; rerun the same command to resume\n", err), err
        return
    assert (proc.returncode, out) == (79, ""), (proc.returncode, out, err)
    assert re.fullmatch(r"SIGTERM before local rank [01] \(pid \d+\) had set up its stop: no checkpoint written "
                        r"\(exit 79, not 143\); rerun the same command: it resumes from the newest checkpoint if "
                        r"there is one, else starts again\n", err), err


# Rank 1 is the trainer, marking when it is about to make its process group; rank 0 never comes
# (a peer that died in its start, or is slow to start): rank 1 waits for it in C++
RANK_1_WAITS_FOR_RANK_0 = textwrap.dedent("""\
    import os, sys, time
    if os.environ["RANK"] == "0":
        time.sleep(600)
    from mlperf_bert.cli import run_main
    from mlperf_bert.trainer import training
    init = training.distributed.dist.init_process_group

    def marked(*args, **kwargs):
        open(os.path.join(sys.argv[1], "init"), "w").close()
        return init(*args, **kwargs)
    training.distributed.dist.init_process_group = marked
    run_main(training.main, ["run_pretraining.py"] + sys.argv[2:])
""")


@pytest.mark.slow
def test_a_stop_while_a_rank_waits_for_its_peers_to_join_ends_at_once(files, tmp_path, short_tmpdir):
    """A rank making its process group waits in C++ for every peer, where its Python handler cannot
    run: SIGTERM to every process while a peer was still starting (or had died there) waited for
    torchrun's SIGKILL after its shutdown timeout (300 s; 30 s after a peer's failure), then said a
    rank was killed by SIGKILL (137). Now the signal ends such a rank at once: the launch ends in
    seconds, one line, nothing saved (79). (The timeout is cut to 60 s here: its SIGKILL would be 137.)"""
    from test_training import flags_for
    marks = tmp_path / "marks"
    marks.mkdir()
    script = tmp_path / "ranks.py"
    script.write_text(RANK_1_WAITS_FOR_RANK_0)
    argv = flags_for(files, str(tmp_path / "run"), num_train_steps=10)[1:]
    proc = subprocess.Popen([PY, "-m", "mlperf_bert", "torchrun", "--standalone", "--nproc_per_node=2", str(script),
                             str(marks)] + argv, env=dict(ENV, TMPDIR=short_tmpdir, TORCH_ELASTIC_SHUTDOWN_TIMEOUT="60"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    wait_until(lambda: (marks / "init").exists(), proc, what="rank 1 making its process group")
    time.sleep(1)  # in init_process_group's C++ wait for rank 0
    pids = tree(proc.pid)
    assert len(pids) == 4, pids  # the wrapper, torchrun, 2 ranks
    for pid in reversed(pids):  # at once, as a scheduler does
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert (proc.returncode, out) == (79, ""), (proc.returncode, out, err)
    assert re.fullmatch(r"SIGTERM before local rank [01] \(pid \d+\) had set up its stop: no checkpoint written "
                        r"\(exit 79, not 143\); rerun the same command: it resumes from the newest checkpoint if "
                        r"there is one, else starts again\n", err), err


def test_a_stop_that_saved_nothing_is_not_143(tmp_path):
    """torchrun's status after a stop (launch._stop_status): 143 (130) only when every rank stopped
    with its checkpoint; ranks that never started, one killed (torchrun's SIGKILL past the shutdown
    timeout) or one that failed say so, with their status."""
    import io
    from mlperf_bert.trainer import launch
    term = signal.SIGTERM

    def status(ranks):
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            return launch._stop_status(term, ranks, output_dir=output_dir), err.getvalue()
    output_dir = None
    assert status({0: (10, 143), 1: (11, 143)}) == (143, "")
    assert status({0: (10, 130), 1: (11, 130)}) == (130, "")
    assert status({0: (10, 0), 1: (11, 0)}) == (0, "")  # they had finished
    assert status({}) == (launch.NOT_SAVED_STATUS, "SIGTERM before the ranks started: no checkpoint written (exit "
                          "79, not 143); rerun the same command: it resumes from the newest checkpoint if there "
                          "is one, else starts again\n")
    output_dir = with_checkpoint(tmp_path / "out")
    assert status({0: (10, 143), 1: (11, -9)}) == (137, "error: local rank 1 (pid 11), stopping after SIGTERM, was "
                                                   "killed by SIGKILL: the checkpoints written so far are kept; "
                                                   "rerun the same command to resume from the newest\n")
    output_dir = None
    assert status({0: (10, 2), 1: (11, 143)}) == (2, "")  # its own line is out
    # the stop's signal itself ended a rank (it came before the rank's handler): it saved nothing
    assert status({0: (10, -15), 1: (11, -15)}) == (79, "SIGTERM before local rank 0 (pid 10) had set up its stop: "
                                                    "no checkpoint written (exit 79, not 143); rerun the same "
                                                    "command: it resumes from the newest checkpoint if there is one, "
                                                    "else starts again\n")
    assert status({0: (10, launch.NOT_SAVED_STATUS), 1: (11, launch.NOT_SAVED_STATUS)}) == (79, "")


def test_a_resumed_runs_stop_before_its_ranks_had_set_up_theirs_is_143(tmp_path, monkeypatch, capfd):
    """A sweep: with several ranks, a resumed run (its --output_dir holds a checkpoint) stopped before
    torchrun started, before it started the ranks or while they started (before their handlers) said
    79, "nothing saved", beside the checkpoint that holds it, where a second later (their untimed init)
    the same stop is 143: a script that resubmits on 143 stopped resubmitting it. Now 128 + the signal
    and "rerun the same command to resume", for each of the wrapper's and torchrun's verdicts; a fresh
    run's stays 79 (test_a_stop_that_saved_nothing_is_not_143)."""
    import io
    from mlperf_bert.trainer import launch
    out = tmp_path / "out"
    out.mkdir()
    (out / "model.ckpt-6.pt").write_bytes(b"")
    resume = "; rerun the same command to resume\n"

    def status(sig, ranks):
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            return launch._stop_status(sig, ranks, output_dir=str(out)), err.getvalue()
    assert status(signal.SIGTERM, {}) == (143, "SIGTERM before the ranks started: stopped at once, nothing trained" + resume)
    assert status(signal.SIGINT, {0: (10, -2), 1: (11, -2)}) == (
        130, "SIGINT before local rank 0 (pid 10) had set up its stop: stopped at once, nothing trained" + resume)
    # torchrun's report of a rank the signal ended in its start
    shown = io.StringIO()
    f = launch.Filter(shown, output_dir=str(out))
    for line in ["Traceback (most recent call last):\n", "  File x\n",
                 "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n", "Failures:\n", "  <NO_OTHER_FAILURES>\n",
                 "Root Cause (first observed failure):\n", "[0]:\n", "  host      : h\n",
                 "  rank      : 1 (local_rank: 1)\n", "  exitcode  : -15 (pid: 9) (SIGTERM)\n"]:
        f.feed(line)
    assert (f.status(1), shown.getvalue()) == (143, "SIGTERM before rank 1 (local rank 1, pid 9 on host h) had set "
                                               "up its stop: stopped at once, nothing trained" + resume)
    # the wrapper's own, before torchrun started (its --output_dir as train_model.sh gives it)
    monkeypatch.setattr(launch.subprocess, "Popen", lambda *a, **k: pytest.fail("torchrun started"))
    with stop_as_handlers_are_set(monkeypatch, launch):
        got = launch._run(["--standalone", "--nproc_per_node=2", "run_pretraining.py", "--output_dir=%s" % out],
                          dict(os.environ))
    assert (got, capfd.readouterr().err) == (143, "SIGTERM before torchrun started: stopped at once, nothing "
                                             "trained" + resume)


def test_a_stop_killed_past_the_shutdown_timeout_names_the_rank_that_hung(tmp_path):
    """A hang sweep: SIGTERM to the job while rank 1 (or its DataLoader worker) was stopped (kill -STOP,
    a debugger; a stalled NFS mount: state D): rank 0 waited for it in a collective, torchrun killed
    both past TORCH_ELASTIC_SHUTDOWN_TIMEOUT, and the line blamed local rank 0 ("stopping after
    SIGTERM, was killed"). The agent notes, as the stop comes, which rank cannot act on it."""
    import io
    from mlperf_bert.trainer import launch
    sleeper = subprocess.Popen([PY, "-c", "import subprocess, sys; subprocess.Popen(['sleep', '30']); "
                                "sys.stdout.write('x'); sys.stdout.flush(); import time; time.sleep(30)"],
                               stdout=subprocess.PIPE)
    sleeper.stdout.read(1)
    (worker,) = children(sleeper.pid)
    try:
        assert launch._stuck(sleeper.pid) is None
        os.kill(worker, signal.SIGSTOP)
        wait_until(lambda: launch._stuck(sleeper.pid), what="the stopped worker")
        assert launch._stuck(sleeper.pid) == ("whose data loader worker (pid %d) was stopped (state T: SIGSTOP or a "
                                              "debugger)" % worker)
        os.kill(sleeper.pid, signal.SIGSTOP)
        wait_until(lambda: launch._stuck(sleeper.pid).startswith("stopped"), what="the stopped rank")
    finally:
        for pid in (sleeper.pid, worker):
            os.kill(pid, signal.SIGKILL)
        sleeper.wait()
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        status = launch._stop_status(signal.SIGTERM, {0: (10, -9), 1: (11, -9)}, {1: launch._STUCK[b"T"]},
                                     output_dir=with_checkpoint(tmp_path / "out"))
    assert (status, err.getvalue()) == (137, "error: local rank 1 (pid 11), stopped (state T: SIGSTOP or a debugger) "
                                             "when SIGTERM came (the other ranks wait for it in their collectives), "
                                             "was killed by SIGKILL: the checkpoints written so far are kept; rerun "
                                             "the same command to resume from the newest\n")


def test_a_rank_in_state_d_an_instant_as_the_stop_came_is_not_named_as_the_hung_one(monkeypatch, capfd):
    """A review: the agent judged each rank as the stop came: rank 0 in state D for an instant then (an
    fsync: half the samples of a process writing with fsync) was named "in an uninterruptible wait (a
    stalled file system)" instead of rank 1, stopped, for whom it waited until torchrun killed both.
    Judged as torchrun kills a rank (its real close here, a 0.3 s shutdown timeout)."""
    from torch.distributed import run
    from torch.distributed.elastic.agent.server import api as agent_api
    from torch.distributed.elastic.multiprocessing import api
    from mlperf_bert.trainer import launch
    for owner, name in ((api, "_terminate_process_handler"), (api.PContext, "close"),
                        (agent_api.SimpleElasticAgent, "_rendezvous")):
        monkeypatch.setattr(owner, name, getattr(owner, name))  # agent() patches them: put back after
    # rank 0 waits in a collective for rank 1 (a SIGTERM cannot end it), rank 1 is stopped
    ranks = [subprocess.Popen([PY, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                               "print(flush=True); time.sleep(60)"], stdout=subprocess.PIPE) for _ in range(2)]
    for r in ranks:
        r.stdout.readline()
    os.kill(ranks[1].pid, signal.SIGSTOP)
    sent = []

    def state(pid):  # rank 0: in state D (an fsync) until the SIGTERM, then waiting in its collective
        if pid == ranks[1].pid:
            return launch._STUCK[b"T"]
        return None if sent else launch._STUCK[b"D"]
    monkeypatch.setattr(launch, "_stuck", state)

    class Handler:
        def __init__(self, proc):
            self.proc = proc

        def close(self, death_sig=None):
            sent.append(death_sig)
            self.proc.send_signal(death_sig)

    real_handler = api._terminate_process_handler

    def stop(signum, frame):  # torchrun's handler raises; its agent closes the ranks (its real close)
        try:
            real_handler(signum, frame)
        except api.SignalException:
            ctx = object.__new__(api.SubprocessContext)
            ctx.subprocess_handlers = {i: Handler(r) for i, r in enumerate(ranks)}
            ctx._tail_logs, ctx.filtered_stdout, ctx.filtered_stderr = [], None, None
            api.PContext.close(ctx, signal.SIGTERM, timeout=0.3)
            raise
    monkeypatch.setattr(api, "_terminate_process_handler", stop)
    monkeypatch.setattr(run, "main", lambda: api._terminate_process_handler(signal.SIGTERM, None))  # the stop
    try:
        assert launch.agent() == 137
    finally:
        for r in ranks:
            with contextlib.suppress(OSError):
                r.kill()
            r.wait()
    assert capfd.readouterr().err.startswith(
        "error: local rank 1 (pid %d), stopped (state T: SIGSTOP or a debugger) when SIGTERM came" % ranks[1].pid)


def test_a_stop_gives_the_ranks_the_shutdown_timeout_under_a_torchrun_that_does_not_read_it(monkeypatch, capfd):
    """torch 2.11's torchrun (the GPU machines') never reads TORCH_ELASTIC_SHUTDOWN_TIMEOUT: its agent
    answers a stop with ``PContext.close(death_sig)`` (LocalElasticAgent._shutdown), close's own 30 s
    before SIGKILL, so a checkpoint that takes longer was lost where the wrapper promised 300 s. Here
    the stop is closed as 2.11's agent closes it; 2.13's passes the timeout itself and is unchanged."""
    from torch.distributed import run
    from torch.distributed.elastic.agent.server import api as agent_api
    from torch.distributed.elastic.multiprocessing import api
    from mlperf_bert.trainer import launch
    for owner, name in ((api, "_terminate_process_handler"), (agent_api.SimpleElasticAgent, "_rendezvous")):
        monkeypatch.setattr(owner, name, getattr(owner, name))  # agent() patches them: put back after
    timeouts = []
    monkeypatch.setattr(api.PContext, "close", lambda self, death_sig=None, timeout=30: timeouts.append(timeout))
    monkeypatch.setenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "450")
    ctx = object.__new__(api.SubprocessContext)
    ctx.subprocess_handlers = {}

    def stop(signum, frame):  # torchrun's handler raises; 2.11's agent then closes the ranks
        api.PContext.close(ctx, signal.SIGTERM)  # 2.11; 2.13: close(ctx, signal.SIGTERM, 450)
        api.PContext.close(ctx, signal.SIGTERM, 450)
        raise api.SignalException("stop", sigval=signal.SIGTERM)
    monkeypatch.setattr(api, "_terminate_process_handler", stop)
    monkeypatch.setattr(run, "main", lambda: api._terminate_process_handler(signal.SIGTERM, None))
    launch.agent()
    capfd.readouterr()
    assert timeouts == [450, 450]
    assert launch.shutdown_timeout({}) == 300 and launch.shutdown_timeout({"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "x"}) == 300


def test_a_signal_while_torchrun_starts_reaches_it(monkeypatch, capfd):
    """The wrapper set its pass-on after Popen started torchrun (in a group of its own): a SIGTERM in
    between found no handler, ended the wrapper, and torchrun trained on to the end. Here the signal
    comes as Popen returns (a caller's handler stands in for the default, which would end pytest);
    torchrun is a long sleep that it ends at once, before torchrun set a handler: nothing saved, 79."""
    from mlperf_bert.trainer import launch
    real, outer = subprocess.Popen, []

    def popen(cmd, **k):
        proc = real([sys.executable, "-c", "import time; time.sleep(600)"], **k)
        os.kill(os.getpid(), signal.SIGTERM)
        return proc
    monkeypatch.setattr(launch.subprocess, "Popen", popen)
    previous = [signal.signal(s, lambda signum, frame: outer.append(signum)) for s in (signal.SIGTERM, signal.SIGINT)]
    try:
        t = time.time()
        status = launch._run(["--standalone", "run_pretraining.py"], dict(os.environ))
    finally:
        for s, handler in zip((signal.SIGTERM, signal.SIGINT), previous):
            signal.signal(s, handler)
    assert time.time() - t < 120 and not outer  # ended, not waited out (600 s)
    assert status == launch.NOT_SAVED_STATUS
    assert "SIGTERM before torchrun started the ranks" in capfd.readouterr().err


def test_a_sigint_while_torchrun_imports_is_the_stop_before_the_ranks_not_a_traceback(monkeypatch, capfd):
    """stop-stress, trial "SIGINT x1 at 0.31 s": passed on as SIGINT to torchrun while it imported torch
    (Python's SIGINT handler set, torchrun's not yet), it was a KeyboardInterrupt traceback and status 1.
    Until torchrun has started a process (it sets its stop handlers before it starts the ranks) the
    stop goes to it as SIGTERM. Here torchrun is a Python process that sleeps and starts nothing."""
    import threading
    from mlperf_bert.trainer import launch
    real = subprocess.Popen

    def popen(cmd, **k):  # the wrapper's handlers are set by now; the SIGINT comes while torchrun runs
        proc = real([sys.executable, "-c", "import time; time.sleep(600)"], **k)
        timer.start()
        return proc
    monkeypatch.setattr(launch.subprocess, "Popen", popen)
    previous = [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)]
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
    try:
        t = time.time()
        status = launch._run(["--standalone", "run_pretraining.py"], dict(os.environ))
    finally:
        timer.cancel()
        for s, handler in zip((signal.SIGTERM, signal.SIGINT), previous):
            signal.signal(s, handler)
    err = capfd.readouterr().err
    assert time.time() - t < 120 and status == launch.NOT_SAVED_STATUS, err  # ended, not waited out (600 s)
    assert err.startswith("SIGINT before torchrun started the ranks: no checkpoint written") and "Traceback" not in err


def test_a_signal_before_torchrun_starts_starts_no_torchrun(monkeypatch, capfd):
    """A stop that came before the wrapper started torchrun: torchrun is not started (it would only
    be stopped in its import of torch), one line, 79."""
    from mlperf_bert.trainer import launch
    started = []
    monkeypatch.setattr(launch.subprocess, "Popen", lambda *a, **k: started.append(a))
    with stop_as_handlers_are_set(monkeypatch, launch):
        status = launch._run(["--standalone", "run_pretraining.py"], dict(os.environ))
    assert status == launch.NOT_SAVED_STATUS and not started
    assert capfd.readouterr().err == launch.not_saved_line("SIGTERM", "before torchrun started")


INIT_STOP = textwrap.dedent("""\
    import os, signal, sys, time
    from mlperf_bert.cli import run_main
    from mlperf_bert.trainer import training
    real = training.Trainer.__init__

    def init(self, *a, **k):  # the untimed init: a signal in it, and a long compile going on
        real(self, *a, **k)
        os.kill(os.getpid(), getattr(signal, sys.argv[1]))
        time.sleep(600)  # past the test's timeout: a stop acted on after the init fails it
    training.Trainer.__init__ = init
    run_main(training.main, ["run_pretraining.py"] + sys.argv[2:])
""")


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_in_the_untimed_init_stops_at_once_with_nothing_saved(files, tmp_path, sig):
    """Issue 37 (9): a SIGTERM during the init (the --compile warm-up: minutes for BERT-Large) was
    acted on after it: run_start logged, one update trained, a checkpoint, 143, while `docker stop`
    (10 s) or a scheduler's grace period SIGKILLs it first. Now it stops at once: nothing trained,
    nothing saved, one line. Issue 45: not 128 + the signal, which says a checkpoint holds the run
    (a script that resubmits on 143 looped on a run that never got past its init): NOT_SAVED_STATUS."""
    from mlperf_bert.trainer.launch import NOT_SAVED_STATUS
    from test_training import flags_for
    out = tmp_path / "out"
    argv = flags_for(files, str(out), num_train_steps=6)[1:]
    r = subprocess.run([PY, "-c", INIT_STOP, sig.name] + argv, cwd=ROOT, env=ENV, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == NOT_SAVED_STATUS, r.stdout + r.stderr
    assert r.stdout == ("%s in the untimed init, before run_start: stopped at once, nothing trained and nothing "
                        "saved (exit 79, not 143: no checkpoint holds the run); rerun the same command to start "
                        "again\n" % sig.name) and r.stderr == "", r.stdout + r.stderr
    assert not os.path.exists(out), os.listdir(out)  # nor the folder this run made


def test_sigint_checkpoints_and_says_sigint(files, tmp_path, capsys, monkeypatch):
    """Issue 37 (13): Ctrl-C (SIGINT) to a run: a checkpoint, exit 130, and the line says SIGINT
    (it said SIGTERM; run alone, Ctrl-C was a KeyboardInterrupt with no checkpoint). A SIGTERM in
    the rerun's untimed init: 143, the checkpoint holds the run."""
    from test_training import flags_for
    from mlperf_bert.trainer import training
    real_step = training.Trainer.step

    def step(self, batch, global_step):
        if global_step == 4:
            os.kill(os.getpid(), signal.SIGINT)
        return real_step(self, batch, global_step)
    monkeypatch.setattr(training.Trainer, "step", step)
    out = tmp_path / "out"
    before = signal.getsignal(signal.SIGINT)
    try:
        status = training.main(flags_for(files, str(out), save_checkpoints_steps=100))
    except KeyboardInterrupt:
        pytest.fail("SIGINT was a KeyboardInterrupt: nothing checkpointed")
    assert status == 130
    assert "SIGINT: checkpoint model.ckpt-5.pt written; rerun the same command to resume\n" in capsys.readouterr().out
    assert (out / "model.ckpt-5.pt").exists() and signal.getsignal(signal.SIGINT) is before
    # Issue 45: the rerun stopped in its untimed init: nothing trained, and the checkpoint holds the
    # run, so 128 + the signal (a fresh run's init stop is NOT_SAVED_STATUS: the test above)
    from mlperf_bert.errors import Terminated
    real_init = training.Trainer.__init__

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(60)
    monkeypatch.setattr(training.Trainer, "__init__", init)
    before_term = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(Terminated) as stopped:
            training.main(flags_for(files, str(out), save_checkpoints_steps=100))
    finally:  # the trainer leaves a stop ignoring both (its way out must not be cut): not this process
        signal.signal(signal.SIGTERM, before_term)
        signal.signal(signal.SIGINT, before)
    assert stopped.value.status == 143 and stopped.value.line == (
        "SIGTERM in the untimed init, before run_start: stopped at once, nothing trained; rerun the same command "
        "to resume")


def _nested_at_entry(handler, first, second, call, at=None):
    """``call()`` makes ``handler(first, ...)`` run; ``handler(second, ...)`` is then run at that
    call's entry (or at the entry of the function ``at`` it calls with ``first``), before its first
    line, with that frame, as CPython does when ``second`` arrives just then. What the second call
    raised (the init's stop), or None."""
    code = getattr(at or handler, "__func__", at or handler).__code__
    raised = []

    def tracer(frame, event, arg):
        if event == "call" and frame.f_code is code and frame.f_locals["signum"] == first:
            sys.settrace(None)
            try:
                handler(second, frame)
            except BaseException as e:  # noqa: B036 (Terminated is raised on, from the first call's entry)
                raised.append(e)
        return None
    sys.settrace(tracer)
    try:
        call()
    finally:
        sys.settrace(None)
    return raised[0] if raised else None


def test_the_first_of_two_signals_names_the_stop_when_the_second_runs_inside_its_handler():
    """Left by issue 45's sixteenth stop: under load a Ctrl-C through start_training.sh (SIGINT, then
    SIGTERM) was named SIGTERM, exit 143 for 130: CPython ran SIGTERM's handler inside SIGINT's, at
    its entry, so SIGTERM came first to the handler. The first signal names it, in the loop and in
    the untimed init; the torchrun wrapper, the start handler (start_signals.quiet_start) and the demo ask the
    same helper, tested here too."""
    from mlperf_bert.errors import Terminated, first_signal
    from mlperf_bert.trainer import training
    stop = training._Stop()
    stop.started()
    assert _nested_at_entry(stop._handle, signal.SIGINT, signal.SIGTERM,
                            lambda: stop._handle(signal.SIGINT, None)) is None
    assert (stop.requested, stop.name, stop.status, stop.received) == (True, "SIGINT", 130, 2)
    stop = training._Stop()  # in the untimed init: the stop is raised at once, named by the first
    stop.resumable = True
    e = _nested_at_entry(stop._handle, signal.SIGINT, signal.SIGTERM, lambda: stop._handle(signal.SIGINT, None))
    assert isinstance(e, Terminated) and e.status == 130 and e.line.startswith("SIGINT in the untimed init")
    # the helper behind it, also from deeper inside the first call, and for the later signal alone
    got = []

    def handler(signum, frame):
        got.append(first_signal(signum, frame, handler))
    _nested_at_entry(handler, signal.SIGINT, signal.SIGTERM, lambda: handler(signal.SIGINT, None))
    assert got == [signal.SIGINT, signal.SIGINT]
    assert first_signal(signal.SIGTERM, sys._getframe(), handler) == signal.SIGTERM
    got.clear()
    _nested_at_entry(handler, signal.SIGINT, signal.SIGTERM, lambda: handler(signal.SIGINT, None), at=first_signal)
    assert got == [signal.SIGINT, signal.SIGINT]


def test_a_rank_that_only_heard_of_a_stop_names_the_signal_another_rank_got():
    """Left by issue 45's twenty-fifth stop: SIGINT to rank 1 alone of two checkpointed and exited 130,
    but rank 0 (which got none and writes the run's one line) said "SIGTERM: checkpoint ..." and exited
    143. A rank votes its signal's number (test_host_syncs' vote test: the max reaches every rank) and
    one that got none takes the voted one; its own signal wins over the vote's."""
    from mlperf_bert.trainer import training
    stop = training._Stop()
    stop.started()
    assert stop.asked() == 0 and stop.agreed(0) is False and stop.signum is None
    assert stop.agreed(signal.SIGINT) is True
    assert (stop.name, stop.status) == ("SIGINT", 130)
    stop = training._Stop()
    stop.started()
    stop._handle(signal.SIGINT, None)
    assert stop.asked() == signal.SIGINT
    assert stop.agreed(signal.SIGTERM) is True and (stop.name, stop.status) == ("SIGINT", 130)


# A rank that failed with its one line and status (a peer or its loader worker gone), while torchrun
# SIGTERMs the ranks left: the signal lands in its exit (an atexit callback runs then)
EXIT_RACE = textwrap.dedent("""\
    import atexit, os, signal
    from mlperf_bert.cli import run_main
    from mlperf_bert.trainer import training

    def main(argv):
        with training._Stop():
            atexit.register(os.kill, os.getpid(), signal.SIGTERM)
            raise SystemExit(75)
    run_main(main, ["run_pretraining.py"])
""")


def test_a_signal_while_a_failed_rank_exits_changes_neither_line_nor_status(files, tmp_path, monkeypatch):
    """Issue 45 (5): on a busy machine a rank's killed loader worker gave its one line plus a 12-line
    "Exception ignored in atexit callback" traceback: torchrun's SIGTERM to the rank left reached it
    while it was exiting, where the handler before the trainer's (run_main's) raised Terminated; in
    its teardown, in the untimed init, the trainer's own turned the failure into a stop (143). The
    race made deterministic: the signal in an atexit callback, and in the teardown."""
    r = subprocess.run([PY, "-c", EXIT_RACE], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
    assert (r.returncode, r.stdout, r.stderr) == (75, "", "")
    from test_training import flags_for
    from mlperf_bert.trainer import distributed, training

    def run(fv, stop, held):
        raise SystemExit(75)  # e.g. a peer lost in the untimed init, its line out
    monkeypatch.setattr(training, "run", run)
    monkeypatch.setattr(distributed, "teardown", lambda clean: os.kill(os.getpid(), signal.SIGTERM))
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        with pytest.raises(SystemExit) as e:
            training.main(flags_for(files, str(tmp_path / "out")))
        assert e.value.code == 75 and signal.getsignal(signal.SIGTERM) is signal.SIG_IGN  # on its way out
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def test_a_peer_lost_after_a_stop_is_the_stops_end_before_the_ranks_met_in_a_vote_or_as_they_finish():
    """The straddle's end (a rank past run_start whose peer stopped in its init) is for a peer lost
    before the ranks' first vote: one lost later (killed mid-run, after a scheduler's SIGTERM too) is
    distributed.peer_loss_is_one_line's line and status, whose "the checkpoints written so far are
    kept" is true there, not "no checkpoint written". Once the rank is finishing, a peer lost after
    a stop is that stop again (the peer entered the state first and stopped at once), whichever rank
    entered it first (the straddle's "finishing" is rank 1)."""
    from types import SimpleNamespace
    from mlperf_bert.errors import Terminated
    from mlperf_bert.trainer import training
    stop = training._Stop()
    assert stop.peer_lost() is None  # no signal: a failure
    assert stop.starting and not (stop.started() or stop.starting)  # a peer lost from run_start on: 75
    stop.starting = stop.in_init = True
    stop.signum, stop.in_init = signal.SIGTERM, False
    ended = stop.peer_lost()  # no vote made yet
    assert isinstance(ended, Terminated) and ended.status == 79 and "as the run started" in ended.line
    stop.vote = SimpleNamespace(met=False)
    assert isinstance(stop.peer_lost(), Terminated)
    stop.vote.met = True
    assert stop.peer_lost() is None
    stop.finishing = stop.in_init = True
    ended = stop.peer_lost()
    assert isinstance(ended, Terminated) and ended.status == 143 and "a run that ended earlier" in ended.line
    stop.signum = None
    assert stop.peer_lost() is None  # no signal here: the peer's loss is the news


def test_a_signal_in_the_teardown_of_a_finished_run_leaves_it_finished(files, tmp_path, monkeypatch):
    """2-rank stop stress: a stop in a rank's teardown, after its run had ended and its finished
    marker was written, was the finishing state's stop, raised there: 143 for a finished run, or,
    raised in a finalizer (the teardown's collection), "Exception ignored in ..." and its traceback.
    The run has ended: the signal changes nothing."""
    from test_training import flags_for
    from mlperf_bert.trainer import distributed, training
    real = distributed.teardown

    def teardown(clean):
        os.kill(os.getpid(), signal.SIGTERM)
        real(clean)
    monkeypatch.setattr(distributed, "teardown", teardown)
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    out = tmp_path / "out"
    try:
        assert training.main(flags_for(files, str(out), num_train_steps=4)) == 0
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
    assert (out / "run_finished.json").exists()


def test_the_wrapper_is_a_command_with_usage(capsys):
    from mlperf_bert import __main__ as entry
    from mlperf_bert.trainer import launch
    assert launch.main(["mlperf_bert torchrun", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m mlperf_bert torchrun [torchrun options] SCRIPT") and "143" in out
    assert launch.main(["mlperf_bert torchrun"]) == 2
    assert "torchrun" in entry.COMMANDS and "torchrun" in entry.usage()


@pytest.mark.parametrize("value", ["abc", "0"])
def test_a_bad_nproc_per_node_is_one_line_and_2(value):
    """Issue 33: torchrun answered --nproc_per_node=abc with a ValueError traceback, 0 with an
    AssertionError one."""
    r = subprocess.run([PY, "-m", "mlperf_bert", "torchrun", "--standalone", "--nproc_per_node=" + value,
                        os.path.join(ROOT, "run_pretraining.py"), "--help"], env=ENV, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and r.stdout == "" and r.stderr.startswith("error: --nproc_per_node=%s is not a number "
                                                                        "of processes per node" % value), r.stderr
    assert len(r.stderr.splitlines()) == 1, r.stderr


@pytest.mark.parametrize("how", ["--nnodes=0", "--nnodes abc", "--nnodes=3:2", "PET_NNODES=1:x"])
def test_a_bad_nnodes_is_one_line(how):
    """A hostile sweep: torchrun answered --nnodes=0 and 3:2 with an AssertionError traceback, abc with a
    ValueError one (exit 1); N and MIN:MAX pass on."""
    from mlperf_bert.trainer import launch
    env = dict([how.split("=")]) if how.startswith("PET_") else {}
    args = ([] if env else how.split(" ")) + ["--standalone", "run_pretraining.py", "--nnodes=0"]
    value = how.replace(" ", "=").split("=", 1)[1]
    with pytest.raises(UserError, match=r"^--nnodes=%s is not a number of nodes \(a whole number >= 1, or MIN:MAX "
                                        r"with 1 <= MIN <= MAX\): fix it" % value):
        launch.check_nproc(args, env)
    for good in ("2", "1:4", "1"):
        launch.check_nproc(["--nnodes=" + good, "run_pretraining.py"], {})


@pytest.mark.parametrize("how", ["--nproc_per_node=gpu", "--nproc-per-node gpu", "PET_NPROC_PER_NODE=gpu"])
def test_nproc_per_node_gpu_without_a_gpu_is_one_line(how, monkeypatch):
    """Issue 37 (14): `python -m mlperf_bert torchrun --nproc_per_node=gpu` on a host without CUDA
    was torch's traceback ("Cuda is not available")."""
    import torch
    from mlperf_bert.trainer import launch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    env = dict([how.split("=")]) if how.startswith("PET_") else {}
    args = ([] if env else how.split(" ")) + ["--standalone", "run_pretraining.py", "--do_train"]
    with pytest.raises(UserError, match=r"^--nproc_per_node=gpu starts a process per GPU, and this host has none "
                                        r"\(torch.cuda.is_available\(\) is False\): give a number of processes"):
        launch.check_nproc(args, env)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    launch.check_nproc(args, env)  # a host with one: torchrun counts them


def test_a_launch_through_the_wrapper_leaves_nothing_in_tmpdir(tmp_path, short_tmpdir):
    """Issue 33: every launch left a torchelastic_* folder in $TMPDIR (one per job on a cluster)."""
    tmp = short_tmpdir
    script = tmp_path / "hello.py"
    script.write_text("import os\nprint('rank', os.environ['RANK'])\n")
    r = subprocess.run([PY, "-m", "mlperf_bert", "torchrun", "--standalone", "--nproc_per_node=1", str(script)],
                       env=dict(ENV, TMPDIR=str(tmp)), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout == "rank 0\n", r.stderr
    assert os.listdir(tmp) == []


def test_documented_launch_commands_use_the_wrapper():
    """Issue 23 item 2: the README's bare `torchrun ... run_pretraining.py` answered SIGTERM with
    torchrun's traceback and exit 1; every launch command the docs show goes through the wrapper."""
    import glob
    bare = []
    for path in ["README.md"] + glob.glob(os.path.join(ROOT, "docs", "*.md")) + \
            glob.glob(os.path.join(ROOT, "examples", "*")):
        with open(os.path.join(ROOT, path)) as f:
            for n, line in enumerate(f, 1):
                code = line.strip().lstrip("`$ ")
                if code.startswith("torchrun ") or " -m torch.distributed.run " in code:
                    bare.append("%s:%d: %s" % (os.path.relpath(os.path.join(ROOT, path), ROOT), n, code))
    assert not bare, bare


class _Endless(torch.utils.data.IterableDataset):
    def __iter__(self):
        while True:
            yield torch.zeros(4)


class _Stuck(torch.utils.data.IterableDataset):
    """One batch, then the worker hangs: the trainer waits for the next."""
    def __iter__(self):
        yield torch.zeros(4)
        time.sleep(600)


def _no_status_check(monkeypatch):
    """PyTorch's look at its workers (every 5 s) only after 600 s: a death found by it fails the test's bound."""
    from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter as it
    monkeypatch.setattr(it._try_get_data, "__defaults__", (600.0,))


def _worker_of(batches, others):
    from mlperf_bert.trainer import loader
    next(batches)
    (it,) = [i for i in loader._iterators if i not in others]
    return it


def test_a_killed_loader_worker_comes_out_of_the_loader_not_at_any_bytecode(short_tmpdir, monkeypatch):
    """PyTorch's SIGCHLD handler raised a loader worker's death at whatever bytecode ran next; in
    the DataLoader's file-limit probe (tempfile.NamedTemporaryFile) that left a tmp* file in $TMPDIR
    (test_a_ranks_loader_worker_killed_under_two_ranks_is_one_line failed 1 run in 10 so). Now the
    death comes out of the loader, as the one line and 128 + the signal, and $TMPDIR stays empty;
    at the next batch (batches were ready: PyTorch's status check, every 5 s, found it later)."""
    import tempfile
    from mlperf_bert.trainer import loader
    multiprocessing.util.get_temp_dir()  # the loader's own pymp-* folder: elsewhere, removed at exit
    monkeypatch.setattr(tempfile, "tempdir", short_tmpdir)
    _no_status_check(monkeypatch)
    others = set(loader._iterators)  # earlier tests' iterators, not yet collected
    batches = iter(loader.make_loader(_Endless(), 1))
    it = _worker_of(batches, others)
    os.kill(it._workers[0].pid, signal.SIGKILL)
    it._workers[0].join(30)
    t = time.time()
    while time.time() - t < 0.5:  # where torch's handler raised its report
        sum(range(1000))
    t = time.time()
    with pytest.raises(SystemExit) as e, loader.worker_death_is_one_line():
        for _ in batches:
            pass
    assert e.value.code == 128 + signal.SIGKILL and time.time() - t < 120  # not PyTorch's status check (600 s)
    del batches, it
    gc.collect()
    assert os.listdir(short_tmpdir) == []


def test_a_loader_worker_killed_while_the_trainer_waits_for_it_is_found_at_once(short_tmpdir, monkeypatch, capsys,
                                                                                tmp_path):
    """The death of the worker the trainer waits for comes into the wait (its SIGCHLD), not at
    PyTorch's next status check of its workers, up to 5 s later; $TMPDIR stays empty. Before the run's
    first checkpoint its line says nothing was saved (it said the checkpoints were kept)."""
    import tempfile
    import threading
    from mlperf_bert.trainer import loader
    multiprocessing.util.get_temp_dir()
    monkeypatch.setattr(tempfile, "tempdir", short_tmpdir)
    _no_status_check(monkeypatch)
    others = set(loader._iterators)
    batches = iter(loader.make_loader(_Stuck(), 1))
    it = _worker_of(batches, others)
    pid = it._workers[0].pid
    kill = threading.Timer(0.5, os.kill, (pid, signal.SIGKILL))
    for key in ("GROUP_RANK", "PET_NODE_RANK", "NODE_RANK"):  # node 0's
        monkeypatch.delenv(key, raising=False)
    t = time.time()
    kill.start()
    with pytest.raises(SystemExit) as e, loader.worker_death_is_one_line(str(tmp_path)):
        next(batches)
    kill.join()
    assert e.value.code == 128 + signal.SIGKILL and time.time() - t < 120  # the kill at 0.5 s; the status check at 600
    assert capsys.readouterr().err == ("error: the data loader worker (pid %d) was killed by SIGKILL: no checkpoint was "
                                       "written, nothing saved; rerun the same command to start again\n" % pid)
    del batches, it
    gc.collect()
    assert os.listdir(short_tmpdir) == []


class _ThreadsRefused(torch.utils.data.IterableDataset):
    """Endless batches from a worker that may start ``allowed`` more threads, then no more, as under a
    process limit (a container's --pids-limit, a cgroup's pids.max): 0 refuses its queue's feeder
    thread, 1 the fd-passing thread the feeder starts to hand a batch over."""
    def __init__(self, allowed):
        self.allowed = allowed

    def __iter__(self):
        import threading
        start, left = threading._start_new_thread, [self.allowed]

        def refused(*args):
            if not left[0]:
                raise RuntimeError("can't start new thread")
            left[0] -= 1
            return start(*args)
        threading._start_new_thread = refused
        while True:
            yield {"x": torch.zeros(4)}


@pytest.mark.parametrize("allowed", [0, 1], ids=["feeder", "fd-passing"])
def test_a_loader_workers_thread_refused_by_the_process_limit_is_one_line_naming_it(short_tmpdir, monkeypatch, allowed):
    """The trainer waited forever for the batch whose fd-passing thread the limit refused (a traceback
    in the worker's feeder thread, the batch dropped); a refused feeder thread was the worker's traceback
    and its "exited with status 1". Now one UserError naming the limit and --num_workers. A hang is
    ended by killing the worker after 20 s (then the line names the SIGKILL)."""
    import tempfile
    import threading
    from mlperf_bert.trainer import loader
    multiprocessing.util.get_temp_dir()
    monkeypatch.setattr(tempfile, "tempdir", short_tmpdir)
    before = set(multiprocessing.active_children())
    batches = iter(loader.make_loader(_ThreadsRefused(allowed), 1))
    hang = threading.Timer(20, lambda: [p.kill() for p in set(multiprocessing.active_children()) - before])
    hang.start()
    try:
        with pytest.raises(UserError) as e, loader.worker_death_is_one_line():
            next(batches)
    finally:
        hang.cancel()
    assert re.match(r"cannot start a thread in data loader worker \(pid \d+\): the limit on processes and threads is "
                    r"reached.*--pids-limit.*, or give fewer --num_workers", str(e.value)), str(e.value)
    del batches
    gc.collect()
    assert set(multiprocessing.active_children()) - before == set()


def test_a_worker_fork_refused_by_the_process_limit_is_one_line_and_leaves_no_worker(short_tmpdir, monkeypatch):
    """The second worker's fork refused (EAGAIN) in the DataLoader iterator's construction: the first
    worker, which ignores SIGTERM, was left running (the exit's terminate and join of it hung the trainer)
    and the half-made iterator's __del__ printed an AttributeError's traceback. Now one line, no worker left."""
    import errno
    import tempfile
    from multiprocessing import popen_fork
    from mlperf_bert.trainer import loader
    multiprocessing.util.get_temp_dir()
    monkeypatch.setattr(tempfile, "tempdir", short_tmpdir)
    launch, forks = popen_fork.Popen._launch, []

    def _launch(self, process_obj):  # (the name is the fork's own frame, as is_process_limit reads it)
        forks.append(1)
        if len(forks) == 2:
            raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")
        return launch(self, process_obj)
    monkeypatch.setattr(popen_fork.Popen, "_launch", _launch)
    before = set(multiprocessing.active_children())
    try:
        with pytest.raises(UserError) as e, loader.worker_death_is_one_line():
            next(iter(loader.make_loader(_Endless(), 2)))
        assert "cannot start a thread or a process: the limit on processes and threads" in str(e.value)
        assert set(multiprocessing.active_children()) - before == set()
    finally:
        for p in set(multiprocessing.active_children()) - before:
            p.kill()


def test_the_wait_for_a_pinned_batch_is_a_wait_too():
    """On CUDA (pin_memory) the DataLoader waits in a queue.Queue's get, fed by its pin-memory
    thread (torch's source, read here), not a multiprocessing queue's: a signal there is in the
    wait too (PyTorch's _try_get_data as torch has it, on a real queue.Queue); elsewhere not."""
    import inspect
    import queue
    import threading
    from torch.utils.data import dataloader
    from mlperf_bert.trainer import loader
    it = dataloader._MultiProcessingDataLoaderIter
    assert "self._data_queue = queue.Queue()" in inspect.getsource(it.__init__)
    src = textwrap.dedent(inspect.getsource(it._try_get_data))
    assert "data = self._data_queue.get(timeout=timeout)" in src
    code = compile(src, dataloader.__file__, "exec")  # its own file name: the frames of the wait
    ns = dict(vars(dataloader))
    exec(code, ns)
    waiting, fake = [], types.SimpleNamespace(_data_queue=queue.Queue(), _workers=[], _workers_status=[])

    def handler(signum, frame):
        waiting.append(loader._waiting_for_a_batch(frame))
        fake._data_queue.put("batch")  # ends the wait
    old = signal.signal(signal.SIGUSR1, handler)
    try:
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGUSR1)).start()
        assert ns["_try_get_data"](fake, 30.0) == (True, "batch")  # the signal came into the wait
        os.kill(os.getpid(), signal.SIGUSR1)  # here: no wait
    finally:
        signal.signal(signal.SIGUSR1, old)
    assert waiting == [True, False]


# Rank 1 held in its untimed init past the last collective (its page-cache drop), marking its pid
RANK_1_IN_ITS_EVICT = textwrap.dedent("""\
    import os, sys, time
    from mlperf_bert.cli import run_main
    from mlperf_bert.trainer import training
    evict = training.fileio.evict_from_page_cache

    def held(paths):
        if os.environ["RANK"] == "1":
            with open(os.path.join(sys.argv[1], "evict.tmp"), "w") as f:
                f.write(str(os.getpid()))
            os.rename(f.name, os.path.join(sys.argv[1], "evict"))
            time.sleep(120)
        evict(paths)
    training.fileio.evict_from_page_cache = held
    run_main(training.main, ["run_pretraining.py"] + sys.argv[2:])
""")


def test_a_stop_of_rank_1_alone_in_its_untimed_init_is_one_line_and_79(files, tmp_path, short_tmpdir):
    """A sweep: SIGTERM to rank 1 alone in its untimed init past the last collective (its page-cache drop
    under MLPERF_CACHE_CLEARED): rank 1 stopped at once with 79 and no line (only rank 0 speaks), and rank 0,
    waiting for it to make the stop vote's group, was ended by torchrun without one: exit 79, nothing said.
    Now the wrapper says it: one line, 79."""
    from test_training import flags_for
    marks = tmp_path / "marks"
    marks.mkdir()
    script = tmp_path / "rank.py"
    script.write_text(RANK_1_IN_ITS_EVICT)
    argv = flags_for(files, str(tmp_path / "run"), num_train_steps=4, save_checkpoints_steps=0)[1:]
    proc = subprocess.Popen([PY, "-m", "mlperf_bert", "torchrun", "--standalone", "--nproc_per_node=2", str(script),
                             str(marks)] + argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env=dict(ENV, TMPDIR=short_tmpdir, MLPERF_CACHE_CLEARED="true"))
    wait_until(lambda: (marks / "evict").exists(), proc, what="rank 1 in its page-cache drop")
    os.kill(int((marks / "evict").read_text()), signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    assert (proc.returncode, stdout) == (79, ""), (proc.returncode, stdout, stderr)
    assert re.fullmatch(r"a stop signal to rank 1 \(local rank 1, pid %s on host \S+\) alone, in its untimed init: no checkpoint "
                        r"written \(exit 79, not 143\); rerun the same command: it resumes from the newest checkpoint "
                        r"if there is one, else starts again\n" % (marks / "evict").read_text(),
                        without_no_eval_warning(stderr)), stderr
    assert os.listdir(short_tmpdir) == []


@pytest.mark.parametrize("code", [143, 130, 79])
def test_a_stop_of_one_rank_alone_in_its_init_is_said_only_where_this_node_shows_it_alone(code):
    """A sweep: SIGTERM to rank 1 alone in the untimed init of a resumed run (held in Trainer.resume; its
    handler: 143, no line, rank 1's) ended the job 143 with nothing said: torchrun's report was rank 1 143
    (the root cause), rank 0 -15 (ended by torchrun). Now its line. The line of 88d712c for a fresh run (79)
    said "alone" wherever no local rank 0 stopped too: on a second node (one rank a node, or every local
    rank stopped) a whole job's stop, which rank 0's node says, got a second line calling it alone; and a
    stop through this wrapper (the whole tree's) is not one rank's alone either."""
    import io
    from mlperf_bert.trainer.launch import Filter
    report = ["Traceback (most recent call last):\n", "  File x\n",
              "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n", "Failures:\n", "[1]:\n",
              "  host      : localhost\n", "  rank      : 0 (local_rank: 0)\n",
              "  exitcode  : -15 (pid: 8) (SIGTERM)\n", "Root Cause (first observed failure):\n", "[0]:\n",
              "  host      : localhost\n", "  rank      : 1 (local_rank: 1)\n", "  exitcode  : %d (pid: 9)\n" % code]

    def said(lines, signalled=False):
        out = io.StringIO()
        f = Filter(out)
        for line in lines:
            f.feed(line)
        assert f.status(1, signalled) == code
        return out.getvalue()
    where = "to rank 1 (local rank 1, pid 9 on host localhost) alone, in its untimed init"
    assert said(report) == ({79: "a stop signal %s: no checkpoint written (exit 79, not 143); rerun the same command: "
                                 "it resumes from the newest checkpoint if there is one, else starts again\n" % where}
                            .get(code, "%s %s: stopped at once, nothing trained; rerun the same command to resume\n" % (
                                {143: "SIGTERM", 130: "SIGINT"}.get(code), where)))
    assert said(report, signalled=True) == ""  # the whole tree's stop, this wrapper's too: rank 0 says it
    one_a_node = report[:3] + ["Failures:\n", "  <NO_OTHER_FAILURES>\n"] + report[8:]
    assert said(one_a_node) == ""  # a second node's rank 1 alone: a whole job's stop looks the same there
    both = [line.replace(": 0 (local_rank: 0)", ": 2 (local_rank: 0)").replace(": 1 (local_rank: 1)", ": 3 (local_rank: 1)")
            for line in report[:7] + ["  exitcode  : %d (pid: 8)\n" % code] + report[8:]]
    assert said(both) == ""  # a second node's ranks, every one stopped: the job's stop
