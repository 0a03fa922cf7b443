"""``python -m mlperf_bert torchrun [torchrun options] SCRIPT [flags]``: torchrun, answering as the
trainer does (one line, the trainer's exit status).

Bare torchrun answers a SIGTERM with its agent's SignalException traceback and exit 1 (raised in
torchrun's own process: no rank can prevent it), a rank killed by a signal with a ChildFailedError
report and exit 1, a busy ``--master_port`` with a DistNetworkError traceback. This runs
torchrun (``agent``: torch.distributed.run's own main) with the same arguments in a process group
of its own and:

- passes SIGTERM or SIGINT (to it alone, to its process group: a terminal, ``kill -- -PGID``, or
  to every process of the job: Slurm's proctrack/linuxproc, a control-group kill) to torchrun once,
  as itself; torchrun acts on the first it gets (from us or directly) and passes it to every rank
  once, and the ranks checkpoint. Exit 143 (130 after SIGINT) when every rank stopped with its
  checkpoint, also after a signal to torchrun alone; the one line is rank 0's ``SIGTERM: checkpoint
  ... written`` (``SIGINT: ...``). A stop that saved nothing (before run_start in a fresh run,
  before the ranks started) exits NOT_SAVED_STATUS with a line saying so (a resumed run's, its
  ``--output_dir`` holding a checkpoint, 143 or 130; on a node other than 0 (``node_of``) a folder
  without one cannot tell, and the line says node 0's status does), a rank that failed or was killed meanwhile with
  its status; never 143 otherwise. The ranks have ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``
  seconds (300 unless set; torchrun's own default is 30) to write it before torchrun kills them;
- drops torchrun's log lines and tracebacks, shows an error line the ranks print once (every rank
  says the same) and exits with the failed rank's status (2 for bad input);
- where its stdout and stderr are one (``> log 2>&1``, ``2>&1 | tee log``), passes the ranks' through
  one pipe: in the order they wrote them;
- a rank killed by a signal: one line naming the rank, its pid and host and the signal (a SIGKILL of
  the out-of-memory killer: that, and the memory limit reached) and what ``--output_dir`` holds
  (``start_signals.what_is_saved``), exit 128 + the signal's number; lines
  of ranks that only lost contact with it are not shown;
- a busy ``--master_port``: one line naming the port and the fix, exit 2;
- a multi-node launch (torchrun's static rendezvous: ``--nnodes`` above 1 with ``--master_addr`` and
  ``--master_port``): a line when the node starts waiting for the others (torchrun says nothing, for
  up to its rendezvous timeout, ``--rdzv_conf=timeout=`` [900 s]); when they do not come in that
  time, one line naming what to check instead of torch's traceback (and, on a node other than 0,
  its connection retries' C++ backtraces), exit RDZV_FAILED_STATUS (the nodes never met: no peer was
  lost; rerun once every node is there);
- a ``--nproc_per_node`` that is not a number of processes, or ``gpu`` on a host without a GPU, or an
  ``--nnodes`` that is not N or MIN:MAX (1 <= MIN <= MAX): one line, exit 2;
- torchrun's log folder (without ``--log_dir``, a ``torchelastic_*`` folder in $TMPDIR that torchrun
  leaves behind) is a temporary folder of this process, removed when torchrun ends.

If this process is killed (SIGKILL), torchrun gets SIGTERM (Linux: the parent-death signal).
If torchrun itself is killed (the out-of-memory killer), the ranks it leaves (each in a session of its own)
get a stop signal this process gets, and SIGTERM, then SIGKILL after ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``
seconds; one line names torchrun's death, exit 128 + its signal.
"""
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from mlperf_bert.errors import UserError, die_with_parent, first_signal, signal_name
from mlperf_bert.cgroups import oom_kills
from mlperf_bert.fileio import oom_killed, proc_stat, usable_tempdir
# NOT_SAVED_STATUS (a stop that saved nothing) and its line are the start handler's too: there, stdlib only
from mlperf_bert.start_signals import (LINES_ENV, NOT_SAVED_STATUS, argv_output_dir, not_saved_line,
                                      outlive_readers, stopped_at_start, what_is_saved)

SHUTDOWN_TIMEOUT = "300"
# A rank whose collective failed because another rank went away says so with this and exits
# PEER_LOST_STATUS (EX_TEMPFAIL: rerunning resumes; trainer/distributed.py); the line is shown
# only when no rank of this node explains the failure. Here, not there: this process needs no torch.
PEER_LOST = "lost contact with another rank"
PEER_LOST_STATUS = 75
# The same loss before this rank's training began (its start: the checks, the untimed init): the other
# rank ended at its start, most often refusing it (an input missing on its node's disk, other flags),
# which a rerun repeats: not "rerunning resumes" (a script that resubmits on 75 looped on it). A
# follower's status, as 75 is: the failed rank's own status and line are the run's.
PEER_FAILED_AT_START_STATUS = 80
# The ranks' environment names a file (in the wrapper's folder) that torchrun's agent makes before it
# SIGTERMs the ranks left after one failed (its own line out; not a stop signal): a rank that gets
# that SIGTERM in its untimed init, where a stop ends it at once, leaves without a stop's line ("SIGTERM
# in the untimed init ... rerun the same command": the failed rank's line is the news) and with
# PEER_LOST_STATUS (training._Stop).
RANK_FAILED_ENV = "MLPERF_BERT_RANK_FAILED"
# A rank that ended before every rank had joined the process group (killed or stopped in its start, a flag
# only its node's command has) left the others waiting for its address in the rendezvous store up to torch's
# process-group timeout (30 min; tested with 3 nodes). Its node's agent sets this key in that
# store (node 0's): "STATUS WHO", STATUS the follower's (PEER_FAILED_AT_START_STATUS after its own error,
# else PEER_LOST_STATUS: a rerun resumes); each rank watches it while it joins (distributed.setup).
RANK_ENDED_KEY = "mlperf_bert/rank_ended"


def rank_ended_key(environ):
    """RANK_ENDED_KEY of the torchrun attempt of the rank whose environment is ``environ``: a restart
    (--max_restarts) reuses the static rendezvous's store, and the key of an earlier attempt's rank ended
    the restarted ranks as they joined (a review: torchrun's own keys are per attempt too)."""
    return "%s/%s" % (RANK_ENDED_KEY, environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


_RDZV = []  # (the static rendezvous's store, this node's rank) once the nodes met (_announced_rendezvous)
# the statuses of a rank that only lost another
FOLLOWERS = (PEER_LOST_STATUS, PEER_FAILED_AT_START_STATUS)
# a rank's status after a stop with its checkpoint (its own handler's exit: 143, 130)
STOPPED = (128 + signal.SIGTERM, 128 + signal.SIGINT)
# The static rendezvous ended without every node: the nodes never met (a setting: MASTER_ADDR,
# MASTER_PORT, NNODES; the network: a firewall; a node that did not start). Not PEER_LOST_STATUS, which
# says a run lost a peer it had: a job's summary (examples/slurm_multinode.sbatch) tells them apart by
# it. EX_CONFIG: fix the setup, then rerun.
RDZV_FAILED_STATUS = 78
USAGE = """usage: python -m mlperf_bert torchrun [torchrun options] SCRIPT [SCRIPT flags]

torchrun (python -m torch.distributed.run, the same options) with one line instead of its
tracebacks and the trainer's exit status: SIGTERM or Ctrl-C -> every rank checkpoints, exit 143
(130), or %d when the stop saved nothing (on a node other than 0: when its --output_dir holds no
checkpoint); a rank killed by signal N -> one line naming it and what --output_dir holds, exit
128+N; a busy --master_port -> one line, exit 2; several nodes (--nnodes=N --node_rank=R
--master_addr=A --master_port=P) -> a line while it waits for the others, and one line and exit %d
(the nodes never met; %d is a rank that lost a peer mid-run, %d one whose peer failed at its start)
when they do not come within --rdzv_conf=timeout=SECONDS [torchrun's: 900]. The ranks get
TORCH_ELASTIC_SHUTDOWN_TIMEOUT seconds to checkpoint [%s].
e.g. python -m mlperf_bert torchrun --standalone --nproc_per_node=8 run_pretraining.py --do_train ...
torchrun's options: python -m torch.distributed.run --help""" % (
    NOT_SAVED_STATUS, RDZV_FAILED_STATUS, PEER_LOST_STATUS, PEER_FAILED_AT_START_STATUS, SHUTDOWN_TIMEOUT)

# torchrun's own logging lines ("W1122 11:57:17.099000 13773 torch/distributed/run.py:874] ...")
_AGENT_LOG = re.compile(r"^[IWEF]\d{4} [\d:.]+ \d+ \S*torch/distributed/\S+\] ")
_TORCHRUN_END = ("torch.distributed.elastic.multiprocessing.errors.ChildFailedError",
                 "torch.distributed.elastic.multiprocessing.api.SignalException")
_PORT_IN_USE = re.compile(r"DistNetworkError: .*port: (\d+).*(EADDRINUSE|address already in use)")
# c10d's C++ warnings of a rank's wait that timed out ("[W1207 14:01:44.352090410 socket.cpp:469] [c10d] ..."):
# the rank's one line says it
_C10D_LOG = re.compile(r"^\[[IWEF]\d{4} [\d:.]+ \S+:\d+\] \[c10d\] ")
# the C++ backtrace such a warning may quote, its lines after it up to a blank one (a rank's store wait as the
# store's rank ended: "recvValue failed on SocketImpl(...)", then "Exception raised from recvBytes at ...",
# "frame #0: ...", ..., "<omitting python frames>": 16 lines in a finished job's output)
_C10D_TRACE = re.compile(r"^(Exception raised from \S+ at .* \(most recent call first\):$|frame #\d+: |<omitting python frames>$)")
# The agent's note, as it ends the ranks left after one failed, of a rank that could not act on it (``_stuck``):
# "STUCK_MARK<local rank> <why>"; the others waited for it in a collective until one gave up (torch's timeout)
STUCK_MARK = "mlperf_bert torchrun: stuck local rank "
_ENTRY = re.compile(r"^\[\d+\]:")
_FIELD = re.compile(r"^\s+(rank|exitcode|host)\s*:\s*(.*?)\s*$")


class Filter:
    """torchrun's stderr in (``feed`` each line), the ranks' own lines out; ``status`` at the end."""

    def __init__(self, out, ooms=None, output_dir=None, node=0):
        self.out = out
        self.ooms = ooms  # the out-of-memory killer's count as torchrun started (oom_kills)
        self.output_dir = output_dir  # the ranks' --output_dir (argv_output_dir): a resumed run's stop at start is 143
        self.node = node  # this node's rank (node_of): only node 0's folder tells whether nothing was saved
        self.seen, self.block, self.report = set(), None, False
        self.failures = []  # torchrun's report: root cause first, then the others
        self.lost = []      # "lost contact" lines: shown only if nothing else explains the failure
        self.port = None
        self.stuck = {}  # {local rank: why}: the agent's STUCK_MARK lines
        self.shown_error = False
        self.c10d = None  # after c10d's warning ("warning") and in its backtrace ("trace"): _C10D_TRACE's lines go
        self._root = False  # in the report's "Root Cause" part

    def feed(self, line):
        if "\r" in line.rstrip("\r\n"):
            # a progress bar's redraw (no newline) and the next line, arriving as one: the redraw
            # is passed on, the line judged on its own
            bar, _, line = line.rpartition("\r")
            if line.strip():
                self._write(bar + "\r")
            else:
                line = bar + "\r" + line
        if self.report:  # torchrun's failure report, its last words
            if line.startswith("Root Cause"):
                self.failures.insert(0, {})
                self._root = True
            elif _ENTRY.match(line) and not self._root:
                self.failures.append({})
            m = _FIELD.match(line)
            if m and self.failures:
                entry = self.failures[0] if self._root else self.failures[-1]
                entry[m.group(1)] = m.group(2)
            return
        if self.c10d and (_C10D_TRACE.match(line) or (self.c10d == "trace" and not line.strip())):
            self.c10d = "trace" if line.strip() else None  # (the blank line ends it)
            return
        self.c10d = None
        if _AGENT_LOG.match(line) or _C10D_LOG.match(line):
            self.c10d = "warning" if _C10D_LOG.match(line) else None
            return
        if line.startswith(STUCK_MARK):
            local, _, why = line[len(STUCK_MARK):].rstrip("\n").partition(" ")
            self.stuck[local] = why
            return
        if line.startswith("Traceback (most recent call last):"):
            self.block = [line]
            return
        if self.block is not None:
            self.block.append(line)
            if line[:1].isspace():
                return
            block, self.block = self.block, None
            m = _PORT_IN_USE.search(line)
            if m:
                self.port = int(m.group(1))
            elif line.startswith(_TORCHRUN_END[0]):
                self.report = True
            elif not line.startswith(_TORCHRUN_END):  # a rank's own traceback: a bug, shown
                self._write("".join(block))
            return
        if line.startswith("error: "):
            if PEER_LOST in line:
                self.lost.append(line)
                return
            if line in self.seen:
                return  # the same one-line error from every rank: say it once
            self.seen.add(line)
            self.shown_error = True
        self._write(line)

    def _write(self, text):
        self.out.write(text)
        self.out.flush()

    def status(self, returncode, signalled=False):
        """Say what the report means, in one line where needed; the exit status. ``signalled``: the
        wrapper itself got a stop signal (and passed it on)."""
        if self.block:
            self._write("".join(self.block))
        if self.port is not None:
            self._write("error: --master_port %d (MASTER_PORT) is in use on this host: another run or program "
                        "listens on it; choose a free port (e.g. MASTER_PORT=%d) or end what holds it\n"
                        % (self.port, self.port + 1))
            return 2
        failures = [f for f in self.failures if "exitcode" in f]
        for f in failures:
            f["code"] = int(re.match(r"-?\d+", f["exitcode"]).group(0))
            m = re.search(r"pid: (\d+)", f["exitcode"])
            f["pid"] = m.group(1) if m else "?"
            m = re.match(r"(\d+) \(local_rank: (\d+)\)", f.get("rank", ""))
            f["who"] = "rank %s (local rank %s" % m.groups() if m else "rank %s (" % f.get("rank", "?")
            f["local"] = m.group(2) if m else None

        def cause(f):  # which failure explains the others (torchrun SIGTERMs the ranks left)
            code = f["code"]
            if code < 0 and code != -signal.SIGTERM:
                return 0  # killed: nobody else will say so
            if code not in FOLLOWERS + (128 + signal.SIGTERM, -signal.SIGTERM):
                return 1  # failed with its own line
            return 2 if code not in FOLLOWERS else 3
        if not failures:
            if self.lost and not self.shown_error:
                self._write(self.lost[0])
            return returncode
        f = sorted(failures, key=cause)[0]  # stable: torchrun's root cause first among equals
        if f["code"] in (-signal.SIGTERM, -signal.SIGINT) and f is failures[0]:
            # the first to end (torchrun's SIGTERM comes after a failure): a stop sent to the rank itself
            # while it started, before it had set up its stop (its imports, the process group's making):
            # the signal's default action ended it, and nothing of this start was saved: not 143, which
            # says a checkpoint holds the run, unless one does (a resumed run)
            line, status = stopped_at_start(signal.Signals(-f["code"]).name, "before %s, pid %s on host %s) had set "
                                            "up its stop" % (f["who"], f["pid"], f.get("host", "?")), self.output_dir,
                                            self.node)
            self._write(line)
            return status
        if f["code"] < 0:
            why = self.stuck.get(f["local"])
            self._write(killed_line("%s, pid %s on host %s)%s" % (
                f["who"], f["pid"], f.get("host", "?"), ", %s as another rank ended (its collectives wait for this one up to "
                "torch's process-group timeout: 30 min, NCCL's 10)," % why if why else ""), -f["code"], self.ooms,
                self.output_dir, self.node))
            return 128 - f["code"]
        if f["code"] in FOLLOWERS and self.lost:
            self._write(self.lost[0])  # another node's rank failed: this node only saw it go
        # a stop sent to one rank alone (not through this wrapper) in its untimed init, which stops at once:
        # only rank 0 says a stop's line, and a rank of this node that torchrun ended as this one left
        # (waiting for it in a collective) said none. Not said where no rank of this node shows it was alone
        # (one rank a node): there a whole job's stop ends the same way, and rank 0's node says it
        alone = not signalled and any(g is not f and (g["code"] == -signal.SIGTERM or g["code"] in FOLLOWERS)
                                      for g in failures)
        where = "to %s, pid %s on host %s) alone, in its untimed init" % (f["who"], f["pid"], f.get("host", "?"))
        if alone and f["code"] == NOT_SAVED_STATUS:
            self._write(not_saved_line("a stop signal", where))
        elif alone and f["code"] in STOPPED:
            self._write("%s %s: stopped at once, nothing trained; rerun the same command to resume\n" % (
                signal.Signals(f["code"] - 128).name, where))
        return f["code"]


def killed_line(who, sig, ooms=None, output_dir=None, node=0):
    """The line for a rank (``who``) killed by signal ``sig``; a SIGKILL says whether the out-of-memory killer
    sent it, where its count (``oom_kills``) was ``ooms`` before (a limit's kill said only "SIGKILL", 137).
    What is saved is ``what_is_saved``'s for the ranks' ``output_dir`` on node ``node``."""
    oom = oom_killed(ooms) if sig == signal.SIGKILL else ""
    return "error: %s was killed by %s%s: %s\n" % (who, signal_name(sig), ", " + oom if oom else "",
                                                   what_is_saved(output_dir, node))


def node_of(args, environ=os.environ):
    """This node's rank as torchrun takes it from its options ``args``: 0 for one node (--standalone, no
    --nnodes above 1: rank 0 runs here, whatever NODE_RANK says, which torchrun does not read), else
    ``--node_rank``, else PET_NODE_RANK (its default), else 0."""
    if _torchrun_option(args, re.compile(r"^(--standalone)$")) is not None or environ.get("PET_STANDALONE", "0") != "0":
        return 0
    nodes = _torchrun_option(args, _NNODES)
    nodes = (environ.get("PET_NNODES", "1") if nodes is None else nodes).strip().split(":")[-1]
    if not nodes.isdigit() or int(nodes) <= 1:
        return 0
    value = _torchrun_option(args, re.compile(r"^--node[-_]rank(=|$)"))
    value = (environ.get("PET_NODE_RANK", "") if value is None else value).strip()
    return int(value) if value.isdigit() else 0


# /proc states of a process that cannot act on a stop signal: stopped (SIGSTOP, SIGTSTP, a debugger),
# or in an uninterruptible wait (a stalled NFS mount)
_STUCK = {b"T": "stopped (state T: SIGSTOP or a debugger)", b"t": "stopped (state t: a debugger)",
          b"D": "in an uninterruptible wait (state D: a stalled file system)"}


def _stuck(pid):
    """Why rank ``pid`` cannot act on a stop now: it, or its DataLoader worker (a child), is stopped or
    in an uninterruptible wait; None where neither is."""
    kids = []
    with contextlib.suppress(OSError):
        for task in os.listdir("/proc/%d/task" % pid):  # each thread's children: a worker's maker is any
            with open("/proc/%d/task/%s/children" % (pid, task)) as f:
                kids += [int(k) for k in f.read().split()]
    for p in [pid] + kids:
        with contextlib.suppress(OSError, IndexError):
            state = _STUCK.get(proc_stat(p)[0])
            if state:
                return state if p == pid else "whose data loader worker (pid %d) was %s" % (p, state)
    return None


def _note_stuck_at_kill(handler, local, got, stuck):
    """Wrap torchrun's ``handler`` of local rank ``local`` so that, as torchrun kills it (SIGKILL, past
    its shutdown timeout), why it could not act on the stop or on the SIGTERM after a failure
    (``_stuck``) is noted: in ``stuck`` after a stop (``got``), else a STUCK_MARK line for the wrapper's
    Filter. Judged then, not as the stop came: a rank in state D for an instant (an fsync, a page
    fault on its data) was named as the hung one instead of the rank that was stopped."""
    close = handler.close
    if getattr(close, "notes_stuck", False):  # (torchrun may close a context twice)
        return

    def closing(death_sig=None):
        why = _stuck(handler.proc.pid) if death_sig == signal.SIGKILL and handler.proc.poll() is None else None
        if why and got:
            stuck[local] = why
        elif why:
            sys.stderr.write("%s%s %s\n" % (STUCK_MARK, local, why))
            sys.stderr.flush()
        return close(death_sig=death_sig)
    closing.notes_stuck = True
    handler.close = closing


def _stop_status(sig, ranks, stuck=None, ooms=None, output_dir=None, node=0):
    """torchrun's status after a stop signal ``sig``, from its ranks' {local rank: (pid, exit code)}
    (none: it stopped before starting them): 128 + the signal (the ranks' own: 130 or 143) when every
    rank stopped with its checkpoint, else why not, with its line where no rank printed one (ranks
    stopped before their handlers: ``stopped_at_start``'s for their ``output_dir``).
    ``stuck``: {local rank: why it could not act on the stop when torchrun killed it (``_stuck``)}: of the ranks
    torchrun killed past its shutdown timeout, such a rank is the cause (the others waited for it in a
    collective), and is named instead of local rank 0. ``ooms``, ``node``: ``killed_line``'s."""
    stuck = stuck or {}
    name = signal.Signals(sig).name
    if not ranks:
        line, status = stopped_at_start(name, "before the ranks started", output_dir, node)
        sys.stderr.write(line)
        return status
    codes = [code for _, code in ranks.values()]
    if all(code == 0 for code in codes):
        return 0  # they had finished
    failed = sorted((code >= 0, local not in stuck, local, pid, code) for local, (pid, code) in ranks.items()
                    if code not in (0,) + STOPPED)
    if not failed:
        return next(code for code in codes if code)
    _, _, local, pid, code = failed[0]  # a killed rank first, a stuck one first among them
    if code == -sig:  # the stop's own signal ended it: it came before the rank had set up its handler
        line, status = stopped_at_start(name, "before local rank %d (pid %d) had set up its stop" % (local, pid),
                                        output_dir, node)
        sys.stderr.write(line)
        return status
    if code < 0:  # killed (torchrun's SIGKILL past the shutdown timeout, the OOM killer): nobody said so
        if local in stuck:
            sys.stderr.write(killed_line("local rank %d (pid %d), %s when %s came (the other ranks wait for it in "
                                         "their collectives)," % (local, pid, stuck[local], name), -code, ooms,
                                         output_dir, node))
            return 128 - code
        sys.stderr.write(killed_line("local rank %d (pid %d), stopping after %s," % (local, pid, name), -code, ooms,
                                     output_dir, node))
        return 128 - code
    return code  # its own line is out


class RendezvousFailed(Exception):
    """The static rendezvous ended without every node: its one line (``rendezvous_failed_line``)."""


def rendezvous_waiting_line(rank, nodes, addr, port, timeout):
    """What node ``rank`` of ``nodes`` says as it starts waiting at the rendezvous ``addr``:``port``
    (node 0 hosts it), which gives up after ``timeout`` seconds."""
    others = "the other node" if nodes == 2 else "the other %d nodes" % (nodes - 1)
    host = "this node hosts" if rank == 0 else "node 0 hosts"
    return ("torchrun: node %d of %d: waiting for %s at the rendezvous %s, %s:%d (MASTER_ADDR:MASTER_PORT); "
            "gives up after about %d s (RDZV_TIMEOUT)\n" % (rank, nodes, others, host, addr, port, timeout))


def rendezvous_failed_line(rank, nodes, addr, port, waited, why):
    """Node ``rank``'s one line when the rendezvous ended after ``waited`` seconds without every node
    (``why``: torch's message): what to check."""
    why = (why.strip().splitlines() or [""])[0][:200]
    joined = re.search(r"(\d+)/(\d+) clients joined", why)
    where = "%s:%d" % (addr, port)
    if rank == 0:
        if nodes == 2:
            what = "the other node did not come to the rendezvous at %s" % where
        elif joined:
            what = "only %s of %d nodes came to the rendezvous at %s" % (joined.group(1), nodes, where)
        else:
            what = "not every node came to the rendezvous at %s" % where
        check = ("every node runs the same command with NNODES=%d and its own NODE_RANK, that MASTER_ADDR=%s is "
                 "this node's address as the others reach it and that they can reach MASTER_PORT=%d (a firewall)"
                 % (nodes, addr, port))
    else:
        what = "the rendezvous at %s (node 0's) did not complete" % where
        check = ("node 0 runs the same command (NODE_RANK=0, NNODES=%d), that MASTER_ADDR=%s is node 0's address "
                 "as this node reaches it and that MASTER_PORT=%d is open between them (a firewall)"
                 % (nodes, addr, port))
    return ("error: node %d of %d: %s in %d s (%s): check that %s, then rerun the same command on every node\n"
            % (rank, nodes, what, waited, why, check))


def _announced_rendezvous(rendezvous):
    """torchrun's ``SimpleElasticAgent._rendezvous``, which waits silently for every node (the
    static rendezvous: node 0's TCPStore waits for a client of every node, the others' connect to it,
    each for the rendezvous timeout), with a line before the wait. A wait that ends without every node
    raises RendezvousFailed with its line, instead of torch's traceback; torch's output meanwhile (a
    node's connection retries: C++ log lines with their backtraces) is shown only when the rendezvous
    completes or fails otherwise (a busy port: the Filter's line)."""
    def announced(self, worker_group):
        handler = worker_group.spec.rdzv_handler
        nodes = getattr(handler, "world_size", 1)
        if handler.get_backend() != "static" or nodes < 2 or getattr(handler, "_store", True) is not None:
            return rendezvous(self, worker_group)  # one node, the c10d backend, or a restart's rendezvous
        import torch.distributed as dist
        rank, addr, port = handler.rank, handler.master_addr, handler.master_port
        sys.stderr.write(rendezvous_waiting_line(rank, nodes, addr, port, round(handler.timeout.total_seconds())))
        sys.stderr.flush()
        start, failed = time.monotonic(), None
        with tempfile.TemporaryFile() as held:
            saved = os.dup(2)
            os.dup2(held.fileno(), 2)
            try:
                met = rendezvous(self, worker_group)
                _RDZV[:] = [(getattr(handler, "_store", None), rank)]
                return met
            except dist.DistError as e:
                if re.search("EADDRINUSE|address already in use", str(e)):
                    raise
                failed = rendezvous_failed_line(rank, nodes, addr, port, round(time.monotonic() - start), str(e))
                raise RendezvousFailed(failed) from None
            finally:
                sys.stderr.flush()
                os.dup2(saved, 2)
                os.close(saved)
                if failed is None:  # what torch said meanwhile, as it said it
                    held.seek(0)
                    shutil.copyfileobj(held, sys.stderr.buffer)
                    sys.stderr.flush()
    return announced


def agent():
    """torchrun itself (torch.distributed.run's main, its arguments in sys.argv), as the wrapper runs
    it: it acts on the first stop signal only (sent to every process of the job, one comes from the
    scheduler and one from the wrapper: torchrun's handler raised again in its wait for the ranks'
    checkpoints and left them) and ends with _stop_status instead of its SignalException traceback
    and exit 1."""
    from torch.distributed import run
    from torch.distributed.elastic.agent.server import api as agent_api
    from torch.distributed.elastic.multiprocessing import api
    handler, got, contexts, stuck = api._terminate_process_handler, [], [], {}
    ooms = oom_kills()  # before the ranks start

    def once(signum, frame):
        if not got:
            got.append(signum)
            handler(signum, frame)
    api._terminate_process_handler = once  # what torchrun installs when it starts the ranks
    close = api.PContext.close

    def closing(self, *args, **kwargs):
        contexts.append(self)  # the ranks it closes: their exit codes after
        if not got:  # not a stop: the ranks left are ended because one failed (or all have ended)
            _mark_rank_failed(self)
            _say_rank_ended(self)
        for local, h in getattr(self, "subprocess_handlers", {}).items():
            _note_stuck_at_kill(h, local, got, stuck)
        if len(args) < 2 and "timeout" not in kwargs:
            # torchrun that does not read TORCH_ELASTIC_SHUTDOWN_TIMEOUT (2.11: its agent closes the
            # ranks with close's own 30 s; 2.13 passes the variable's seconds): the ranks get them too
            kwargs["timeout"] = shutdown_timeout()
        return close(self, *args, **kwargs)
    api.PContext.close = closing
    agent_api.SimpleElasticAgent._rendezvous = _announced_rendezvous(agent_api.SimpleElasticAgent._rendezvous)
    try:
        run.main()
    except RendezvousFailed as e:
        sys.stderr.write(str(e))
        return RDZV_FAILED_STATUS
    except api.SignalException as e:
        ranks = {local: (h.proc.pid, h.proc.returncode) for ctx in contexts
                 for local, h in getattr(ctx, "subprocess_handlers", {}).items() if h.proc.returncode is not None}
        return _stop_status(e.sigval, ranks, stuck, ooms, argv_output_dir(sys.argv[1:]), node_of(sys.argv[1:]))
    return 0


def shutdown_timeout(environ=os.environ):
    """The seconds torchrun gives the ranks between its SIGTERM and its SIGKILL: TORCH_ELASTIC_SHUTDOWN_TIMEOUT
    (``main`` sets SHUTDOWN_TIMEOUT where it is unset; a value that is not a whole number: that)."""
    value = environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "").strip()
    return int(value) if value.isdigit() else int(SHUTDOWN_TIMEOUT)


def _mark_rank_failed(ctx):
    """Before torchrun SIGTERMs the ranks of ``ctx`` still running: where one of them failed (an exit
    status that is not a stop's), the file RANK_FAILED_ENV names, holding the pids of those ranks (not
    those of ranks a restart starts after), so that they do not take that SIGTERM for a stop of the run."""
    path = os.environ.get(RANK_FAILED_ENV)
    stops = (0, NOT_SAVED_STATUS, -signal.SIGTERM, -signal.SIGINT) + STOPPED
    procs = [h.proc for h in getattr(ctx, "subprocess_handlers", {}).values()]
    codes = [p.poll() for p in procs]
    if path and any(code is not None and code not in stops for code in codes):
        with contextlib.suppress(OSError), open(path, "w") as f:
            f.write("".join("%d\n" % p.pid for p, code in zip(procs, codes) if code is None))


def _say_rank_ended(ctx):
    """Where a rank of ``ctx`` ended other than with 0 (not after a stop of the whole launch): its attempt's
    RANK_ENDED_KEY (``rank_ended_key``) in the rendezvous store, so that ranks of other nodes still joining
    the process group do not wait for it."""
    ended = [(local, h.proc.pid, h.proc.poll()) for local, h in getattr(ctx, "subprocess_handlers", {}).items()
             if h.proc.poll() and h.proc.poll() not in FOLLOWERS]  # (a follower's: the first rank's is the news)
    if _RDZV and _RDZV[0][0] is not None and ended:
        store, node = _RDZV[0]
        local, pid, code = ended[0]
        own_error = code > 0 and code not in (NOT_SAVED_STATUS,) + STOPPED
        key = rank_ended_key((getattr(ctx, "envs", None) or {}).get(local) or {})
        with contextlib.suppress(Exception):  # (the store's node gone: nothing waits on it)
            store.compare_set(key, "", "%d local rank %s (pid %d) of node %d ended with exit code %d" % (
                PEER_FAILED_AT_START_STATUS if own_error else PEER_LOST_STATUS, local, pid, node, code))  # the first


def rank_failed(environ=os.environ):
    """Whether torchrun's agent is ending this rank because another failed (``_mark_rank_failed``)."""
    path = environ.get(RANK_FAILED_ENV)
    if not path:
        return False
    try:
        with open(path) as f:
            return str(os.getpid()) in f.read().split()
    except OSError:
        return False


def agent_main():
    """torchrun's process: ``agent()``, and its status. Without the interpreter's teardown of torch's
    modules after it (0.4-0.9 s of each launch's end, after the ranks): the atexit functions run
    as at any exit (logging's flush among them), then the streams are flushed and the process
    ends, from the first one registered, which runs last."""
    import atexit
    outlive_readers()  # its stdout, which the ranks inherit, may lose its reader (`| tee` and Ctrl-C)
    status = [1]  # an exception out of agent(): its traceback, then Python's status for it

    def leave():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status[0])
    atexit.register(leave)  # before torch's: atexit runs them last first
    status[0] = agent()
    sys.exit(status[0])


# torchrun's process: the agent, importable with any working directory
_AGENT = ("import sys; sys.path.insert(0, %r); from mlperf_bert.trainer.launch import agent_main; agent_main()"
          % os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _in_own_group(parent):
    def setup():
        os.setpgid(0, 0)  # a terminal's or a group's signal reaches torchrun only through us
        die_with_parent(parent, signal.SIGTERM, 143)
    return setup


_NPROC = re.compile(r"^--nproc[-_]per[-_]node(=|$)")
_NNODES = re.compile(r"^--nnodes(=|$)")


def _torchrun_option(args, pattern):
    """The value of the torchrun option ``pattern`` matches (``--name=V`` or ``--name V``) among
    the options before the script, or None."""
    value = None
    for i, arg in enumerate(args):
        if arg.endswith(".py") or arg in ("-m", "--module", "--no-python", "--no_python"):
            break  # the script: what follows is its own flags
        m = pattern.match(arg)
        if m:
            value = arg[m.end():] if m.group(1) else (args[i + 1] if i + 1 < len(args) else "")
    return value


def check_nproc(args, environ):
    """Refuse, in one line, a ``--nproc_per_node`` or ``--nnodes`` that torchrun would answer with a traceback."""
    nodes = _torchrun_option(args, _NNODES)
    if nodes is None:
        nodes = environ.get("PET_NNODES")
    if nodes is not None:  # N, or MIN:MAX (elastic): torchrun's int() ValueError, or its assertion of 1 <= MIN <= MAX
        bounds = nodes.strip().split(":")
        if not (len(bounds) <= 2 and all(re.fullmatch(r"\d+", b) for b in bounds)
                and 1 <= int(bounds[0]) <= int(bounds[-1])):
            raise UserError("--nnodes=%s is not a number of nodes (a whole number >= 1, or MIN:MAX with 1 <= MIN <= MAX): "
                            "fix it (train_model.sh: the NNODES setting)" % nodes)
    value = _torchrun_option(args, _NPROC)
    if value is None:
        value = environ.get("PET_NPROC_PER_NODE")  # torchrun reads its options from PET_* too
    if value is None or value in ("auto", "cpu"):
        return
    if value in ("gpu", "xpu"):  # torchrun counts them, and raises where there are none
        import torch  # only here: this process needs torch for nothing else
        backend = torch.cuda if value == "gpu" else getattr(torch, "xpu", None)
        if backend is None or not backend.is_available():
            raise UserError("--nproc_per_node=%s starts a process per %s, and this host has none (torch.%s."
                            "is_available() is False): give a number of processes (with the trainer's --device=cpu "
                            "on a host without a GPU), or run on a host with one" % (
                                value, "GPU" if value == "gpu" else "XPU", "cuda" if value == "gpu" else "xpu"))
        return
    if not re.fullmatch(r"\d+", value.strip()) or int(value) < 1:
        raise UserError("--nproc_per_node=%s is not a number of processes per node (a whole number >= 1, or auto, "
                        "cpu, gpu, xpu): fix it (train_model.sh: the NUM_GPUS setting)" % value)


def _has_children(pid):
    """Whether process ``pid`` has started a process: torchrun sets its stop handlers before it starts
    the ranks. Until then the stop goes to it as SIGTERM, which ends it (as Python's import of torch
    ends on SIGINT with a KeyboardInterrupt traceback and status 1)."""
    try:
        entries = os.listdir("/proc")
    except OSError:  # no /proc: passed on as itself
        return True
    for entry in entries:
        if entry.isdigit():
            try:
                if int(proc_stat(int(entry))[1]) == pid:
                    return True
            except (OSError, ValueError, IndexError):
                pass
    return False


def _one_output():
    """Whether our stdout and stderr are one file, pipe or terminal."""
    try:
        return os.path.sameopenfile(1, 2)
    except OSError:  # one of them closed
        return False


def _send(proc, signum):
    try:
        proc.send_signal(signum)
    except OSError:
        pass


def _marked(marker):
    """{pid: parent pid} of this launch's processes running now (torchrun's agent, its ranks, their data
    loader workers): those whose environment holds ``marker`` (our RANK_FAILED_ENV entry, a folder of
    this launch, which the agent passes on)."""
    marked = {}
    try:
        entries = os.listdir("/proc")
    except OSError:  # no /proc: none found
        return marked
    for entry in entries:
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError), open("/proc/%s/environ" % entry, "rb") as f:
                if marker in f.read().split(b"\0"):  # (a zombie's is empty)
                    marked[int(entry)] = int(proc_stat(int(entry))[1])
    return marked


class Suspension:
    """The wrapper's SIGTSTP and SIGCONT handlers. Ctrl-Z (SIGTSTP to the terminal's foreground group,
    `kill -TSTP -PGID`): torchrun and each rank, in groups of their own, trained on while the launchers
    stood stopped. They stop first, then this process (SIGSTOP: SIGTSTP's default action is discarded
    in an orphaned group); fg, bg or `kill -CONT` continues them with it."""

    def __init__(self, marker):
        self.marker, self.resumed = marker, 0

    def _send(self, signum):
        for pid in _marked(self.marker):
            with contextlib.suppress(OSError):
                os.kill(pid, signum)

    def suspend(self, signum=None, frame=None):
        resumed = self.resumed
        self._send(signal.SIGSTOP)
        if self.resumed != resumed:  # a SIGCONT came while they were being stopped: it continued those
            self._send(signal.SIGCONT)  # stopped before it, not those after; this process stays running
            return
        os.kill(os.getpid(), signal.SIGSTOP)

    def resume(self, signum=None, frame=None):
        self.resumed += 1
        self._send(signal.SIGCONT)


def _ranks_left(marker, among=None):
    """The pids of this launch's ranks running now (torchrun starts each in a session of its own: they
    outlive its agent): the ``_marked`` processes whose parent is not (a rank's own child, a data loader
    worker, ends with it); with ``among``: only those of them."""
    marked = _marked(marker)
    return [pid for pid, parent in marked.items() if parent not in marked and (among is None or pid in among)]


def _signal_ranks(marker, ranks, signum):
    for pid in _ranks_left(marker, ranks):  # still ranks of this launch: a pid may have been reused
        with contextlib.suppress(OSError):
            os.kill(pid, signum)


def _end_ranks(marker, ranks, timeout):
    """End the ranks a killed agent left (nothing else will): SIGTERM, so that one that can checkpoint
    does, and SIGKILL to those left after ``timeout`` seconds (torchrun's own shutdown timeout)."""
    for signum, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10)):
        _signal_ranks(marker, ranks, signum)
        deadline = time.monotonic() + wait
        while _ranks_left(marker, ranks) and time.monotonic() < deadline:
            time.sleep(0.5)


def main(argv):
    args = list(argv[1:])
    if not args or args[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0 if args else 2
    check_nproc(args, os.environ)
    env = dict(os.environ)
    env.setdefault("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", SHUTDOWN_TIMEOUT)
    # the wrapper's folder: the agent's mark of a failed rank, and torchrun's logs
    log_dir = tempfile.mkdtemp(prefix="mlperf_bert_torchrun_", dir=usable_tempdir("the torchrun wrapper's logs"))
    env[RANK_FAILED_ENV] = os.path.join(log_dir, "rank_failed")
    if _torchrun_option(args, re.compile(r"^--log[-_]dir(=|$)")) is None and "PET_LOG_DIR" not in env:
        # torchrun's own would be a torchelastic_* folder in $TMPDIR that nothing removes: one per job
        args = ["--log-dir=" + log_dir] + args
    try:
        return _run(args, env)
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)


def _run(args, env):
    got, proc, ooms = [], None, oom_kills()
    # the ranks torchrun's agent left as it was killed (the OOM killer): they hold our pipe open
    left, marker = [], ("%s=%s" % (RANK_FAILED_ENV, env.get(RANK_FAILED_ENV))).encode()

    def on_signal(signum, frame):
        # once (start_training.sh sends SIGTERM after a SIGINT), as itself: torchrun sends the ranks
        # the signal it got, and the trainer names it. torchrun acts on the first it gets, ours or
        # the scheduler's own (agent)
        if not got:
            got.append(signum)  # first, so a signal whose handler runs inside this call returns above
            got[0] = first_signal(signum, frame, on_signal)
            if left:  # torchrun's agent is gone: to its ranks
                _signal_ranks(marker, left, got[0])
            elif proc is not None:
                _send(proc, got[0] if _has_children(proc.pid) else signal.SIGTERM)

    # set before torchrun starts: in its own group, it would outlive a wrapper that a signal
    # ended while Popen started it, and train to the end
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    suspension = Suspension(marker)
    signal.signal(signal.SIGTSTP, suspension.suspend)
    signal.signal(signal.SIGCONT, suspension.resume)
    # One pipe for the ranks' stdout and stderr where ours go to one place (`> log 2>&1`, `2>&1 | tee log`):
    # rank 0's stop line (stdout) went there at once, its bar's last state (stderr) through the filter
    # after it, and the log ended with the bar
    merged = _one_output()
    if merged:  # the trainer's lines, each in one write (not run together with another rank's), in order
        env[LINES_ENV] = "1"
        if os.isatty(1):  # a terminal's lines as it showed them, not held in a pipe's buffer (another's script)
            env.setdefault("PYTHONUNBUFFERED", "1")
    if not got:  # a stop before it: torchrun is not started
        proc = subprocess.Popen([sys.executable, "-c", _AGENT] + args, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE if merged else None,
                                stderr=subprocess.STDOUT if merged else subprocess.PIPE,
                                preexec_fn=_in_own_group(os.getpid()))
    # the ranks' --output_dir: a stop before they had set up theirs is a resumed run's (143, 130) where it
    # holds a checkpoint, else NOT_SAVED_STATUS
    output_dir, node = argv_output_dir(args), node_of(args)
    if proc is None:
        line, status = stopped_at_start(signal.Signals(got[0]).name, "before torchrun started", output_dir, node)
        sys.stderr.write(line)
        return status
    if got:  # it came while Popen started torchrun
        _send(proc, signal.SIGTERM)

    def reap():  # a normal end of torchrun's comes after its ranks', and the pipe closes with it
        if proc.wait() < 0:
            left.extend(_ranks_left(marker))
            _end_ranks(marker, left, shutdown_timeout(env))
    reaper = threading.Thread(target=reap, name="torchrun-reaper", daemon=True)
    reaper.start()
    filt = Filter(sys.stderr, ooms, output_dir, node)
    for raw in proc.stdout if merged else proc.stderr:
        filt.feed(raw.decode("utf-8", "replace"))
    reaper.join()
    returncode = proc.wait()
    if returncode < 0:  # torchrun killed by a signal (before it set its handlers: no rank started, or the OOM killer)
        if got and not left:
            line, status = stopped_at_start(signal.Signals(got[0]).name, "before torchrun started the ranks", output_dir,
                                            node)
            sys.stderr.write(line)
            return status
        sys.stderr.write(killed_line("torchrun (pid %d)" % proc.pid, -returncode, ooms, output_dir, node))
        return 128 - returncode
    return filt.status(returncode, bool(got))  # the agent's: 143 (130) only when every rank checkpointed
