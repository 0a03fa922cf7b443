"""The tests' view of the process table, read from /proc (Linux): one parser of /proc/PID/stat for
the tests that signal trees, stop tools or wait for a group to be gone; a stop timed to the
moment code under test sets its signal handlers; and a stand-in for this process's control groups."""
import contextlib
import os
import signal


def _stat(pid):
    """/proc/PID/stat's fields after the command name (state, ppid, pgrp, session, ...), or None
    for a pid that is gone. The name may hold spaces and parentheses: split at its last ')'."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields or None


def _pids():
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def state(pid):
    """``pid``'s state letter ('R', 'S', 'T', 'Z', ...), or None when it is gone."""
    fields = _stat(pid)
    return fields[0] if fields else None


def start_time(pid):
    """``pid``'s start time (clock ticks after boot), or None when it is gone: a pid taken again by
    another process (pid_max is 32768 here: a busy suite goes round it in minutes) has another."""
    fields = _stat(pid)
    return int(fields[19]) if fields and len(fields) > 19 else None


def alive(pid, parent=None):
    """Whether ``pid`` runs (not a zombie), and with ``parent``: as its child."""
    fields = _stat(pid)
    return fields is not None and fields[0] not in ("Z", "X") and (parent is None or int(fields[1]) == parent)


def children(pid):
    """The pids of ``pid``'s live children."""
    return [p for p in _pids() if alive(p, parent=pid)]


def tree(root):
    """``root`` and every process under it now, each before its children: what Slurm's
    proctrack/linuxproc or a control-group kill signals."""
    kids = {}
    for pid in _pids():
        fields = _stat(pid)
        if fields:
            kids.setdefault(int(fields[1]), []).append(pid)
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += kids.get(pid, [])
    return found


def group(pgid):
    """The live (not zombie) processes of process group ``pgid``: with states, {pid: state}."""
    found = {}
    for pid in _pids():
        fields = _stat(pid)
        if fields and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            found[pid] = fields[0]
    return found


@contextlib.contextmanager
def stop_as_handlers_are_set(monkeypatch, module):
    """``module``'s code gets a SIGTERM as it sets its SIGINT handler (once: after its handlers, before
    what follows them); this process's SIGTERM and SIGINT handlers are put back at the end."""
    real, sent = signal.signal, []

    def setting(sig, handler):
        old = real(sig, handler)
        if sig == signal.SIGINT and not sent:
            sent.append(os.kill(os.getpid(), signal.SIGTERM))
        return old
    previous = [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)]
    monkeypatch.setattr(module.signal, "signal", setting)
    try:
        yield
    finally:
        for s, handler in zip((signal.SIGTERM, signal.SIGINT), previous):
            real(s, handler)


def fake_cgroup(monkeypatch, root, groups, files):
    """This process's control groups as ``groups`` (/proc/self/cgroup's text), their files ``files``
    ({path below /sys/fs/cgroup: text}), written under ``root`` (a pathlib.Path) and given to
    cgroups.dirs: a container's limits on a test host. Returns (/proc/self/cgroup, /sys/fs/cgroup)."""
    from mlperf_bert import cgroups
    root.mkdir(parents=True, exist_ok=True)
    (root / "cgroup").write_text(groups)
    for path, text in files.items():
        (root / "sys" / path).parent.mkdir(parents=True, exist_ok=True)
        (root / "sys" / path).write_text(text)
    monkeypatch.setattr(cgroups, "PROC_CGROUP", str(root / "cgroup"))
    monkeypatch.setattr(cgroups, "CGROUP_ROOT", str(root / "sys"))
    return str(root / "cgroup"), str(root / "sys")
