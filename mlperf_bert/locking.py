"""One writer per output: an exclusive, non-blocking lock held for the whole run.

A directory output is locked through ``DIR/.mlperf_bert.lock``, a file output through
``.NAME.lock`` beside it. The lock is ``flock(LOCK_EX | LOCK_NB)`` on that file, so the
kernel releases it when the holder dies (SIGKILL, node crash as seen by the NFS server):
a rerun after a crash goes on, while a second run during a live one is refused at once
with the holder's host, pid, start time and command, which the holder writes into the file.
The lock is the holder's alone: children it forks (pool workers, DataLoader workers) close their
copy of the descriptor at once, so a child that outlives a killed holder for a few seconds does
not keep a rerun out, and a refusal names a live process, never the dead one. On Linux NFS clients ``flock`` is carried out as a POSIX lock
on the server (NLM for NFSv3, the protocol's own locks for NFSv4), so runs on different
hosts exclude each other unless the file system is mounted ``nolock`` or
``local_lock=flock|all`` (then only runs on one host do); Lustre needs the ``flock`` mount
option. A file system without locks gets a warning and the run goes on unprotected.
"""
import contextlib
import errno
import json
import os
import socket
import sys
import time

from mlperf_bert.errors import UserError
from mlperf_bert.fileio import (WRITE_ERRNOS, make_output_dir, mount_point, new_dirs_removed_on_error, pid_alive,
                                refuse_long_name)

DIR_LOCK_NAME = ".mlperf_bert.lock"
# How long a refused run waits when the lock file names a holder that is not alive (its file is
# being rewritten by a new holder, or a process it left behind is ending) before it says so.
DEAD_HOLDER_WAIT = 10.0
_held = []  # locks of this process, kept referenced so their descriptors stay open


def _drop_in_child():
    # flock belongs to the open file description, which fork shares: a child keeping the
    # descriptor would keep the lock after the holder died. Close only (LOCK_UN would unlock
    # the parent's lock too); the child never releases, so the parent's file stays.
    for lock in _held:
        with contextlib.suppress(OSError):
            os.close(lock.fd)
        lock.fd = None
    _held.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_drop_in_child)


def lock_path_for(path, is_dir):
    if is_dir:
        return os.path.join(path, DIR_LOCK_NAME)
    d, name = os.path.split(os.path.abspath(path))
    return os.path.join(d, ".%s.lock" % name)


def is_lock_file(name):
    return name == DIR_LOCK_NAME or (name.startswith(".") and name.endswith(".lock"))


def remove_stale_locks(directory, names):
    """Remove the lock files of outputs ``names`` in ``directory`` that no live process holds
    (left by a run killed with SIGKILL): nobody holds a lock we can take at once."""
    import fcntl
    for name in names:
        path = lock_path_for(os.path.join(directory, name), False)
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            with contextlib.suppress(OSError):
                os.remove(path)
        except OSError:
            pass  # held: a live run's
        finally:
            os.close(fd)


def _read_holder(lock_file):
    try:
        with open(lock_file, encoding="utf-8") as f:
            h = json.loads(f.read() or "{}")
    except (OSError, ValueError):
        h = {}
    return h if isinstance(h, dict) else {}


def _alive(h):
    """False only when the holder named is known to be gone: a pid of this host that no process has."""
    if not h or h.get("host") != socket.gethostname():
        return bool(h)
    try:
        return pid_alive(int(h.get("pid")))
    except (TypeError, ValueError):
        return False


def _openers(lock_file):
    """Pids of this host's processes (those /proc lets us see) with ``lock_file`` open."""
    try:
        target = os.stat(lock_file)
    except OSError:
        return []
    pids = []
    for pid in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not (pid.isascii() and pid.isdigit()) or int(pid) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            for fd in os.listdir("/proc/%s/fd" % pid):
                with contextlib.suppress(OSError):
                    st = os.stat("/proc/%s/fd/%s" % (pid, fd))
                    if (st.st_dev, st.st_ino) == (target.st_dev, target.st_ino):
                        pids.append(int(pid))
                        break
    return pids


def _holder_text(lock_file, h):
    if _alive(h):
        return "pid %s on host %s, started %s: %s" % (h.get("pid"), h.get("host"), h.get("started"),
                                                     h.get("command"))
    pids = _openers(lock_file)
    ended = " (pid %s, which wrote the lock, has ended)" % h["pid"] if h.get("pid") else ""
    if pids:
        return "pid %s, which keeps its lock file open%s" % (", ".join(map(str, pids)), ended)
    return "a process this host cannot name%s" % ended


class OutputLock:
    """An exclusive lock on one output (directory or file). Use ``lock_dir``/``lock_file``."""

    def __init__(self, path, is_dir, what):
        self.path, self.what = path, what
        self.lock_file = lock_path_for(path, is_dir)
        self.fd = None

    def acquire(self):
        import fcntl
        deadline = None
        while True:
            try:
                fd = os.open(self.lock_file, os.O_RDWR | os.O_CREAT, 0o644)
            except PermissionError:
                if not os.path.isfile(self.lock_file):
                    raise
                self._refuse_foreign()
                continue  # it was removed meanwhile (its holder released it)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                os.close(fd)
                if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                    h = _read_holder(self.lock_file)
                    if not _alive(h):  # a new holder writing its name, or what a dead one left
                        deadline = deadline or time.monotonic() + DEAD_HOLDER_WAIT
                        if time.monotonic() < deadline:
                            time.sleep(0.1)
                            continue
                    raise self._in_use(h)
                print("warning: cannot lock %s (%s): this file system has no locks, so a second run on "
                      "%s would not be detected" % (self.lock_file, e.strerror, self.path), file=sys.stderr)
                return self
            # The previous holder removes the file when it releases: if the name now points to
            # another file, this lock guards nothing; take the new one.
            try:
                same = os.stat(self.lock_file).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        info = {"host": socket.gethostname(), "pid": os.getpid(),
                "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                "command": " ".join([os.path.basename(sys.argv[0])] + sys.argv[1:])[:300]}
        self.fd = fd
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
        except OSError:  # a full disk: the file is ours (locked), and goes as a release removes it
            self.release()
            raise
        _held.append(self)
        return self

    def _in_use(self, h):
        return UserError("%s %s is in use by another run (%s): wait for it to end or stop it; two runs on one "
                         "output would mix their results" % (self.what, self.path, _holder_text(self.lock_file, h)))

    def _refuse_foreign(self):
        """Refuse, in one line, a lock file this user cannot write: another user's (root's), in use
        by a run of theirs or left by one that was killed. Its folder may well be writable, so
        "choose a writable output path" misled; the way out is removing that one file."""
        held = _is_held(self.lock_file)
        busy, seen = held is True, held is not None
        if busy:
            raise self._in_use(_read_holder(self.lock_file))
        try:
            uid = os.stat(self.lock_file).st_uid
        except FileNotFoundError:
            return
        try:
            import pwd
            owner = pwd.getpwuid(uid).pw_name
        except (ImportError, KeyError):
            owner = "uid %d" % uid
        # (unreadable too, under its owner's umask 077: whether a run of theirs holds it is unknown)
        raise UserError("cannot take the lock %s of %s %s: it is %s's and this user cannot write it (%s): %s, or run "
                        "as %s" % (self.lock_file, self.what, self.path, owner,
                                   "left by a run of theirs that was killed" if seen else
                                   "nor read it: a run of theirs may hold it",
                                   "remove it" if seen else "once no run of theirs is on it, remove it", owner))

    def release(self):
        if self.fd is None:
            return
        import fcntl
        with contextlib.suppress(OSError):
            os.remove(self.lock_file)  # before unlocking: a waiter then re-opens the name
        with contextlib.suppress(OSError):
            fcntl.flock(self.fd, fcntl.LOCK_UN)  # also for forked children sharing the descriptor
        os.close(self.fd)
        self.fd = None
        with contextlib.suppress(ValueError):
            _held.remove(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()
        return False


def _lock(path, is_dir, what):
    target = path if is_dir else os.path.dirname(os.path.abspath(path))
    if not is_dir:  # (a file locked is written under NAME.tmp-PID, longer than .NAME.lock: the MLPerf log too)
        refuse_long_name(path, what)
    # the folders made for the lock go again when it cannot be taken: a folder holding nothing but
    # an empty lock file looked like a started output
    with new_dirs_removed_on_error(target):
        make_output_dir(target)
        lock = OutputLock(path, is_dir, what)
        try:
            return lock.acquire()
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT):  # the path is writable: "choose a writable path" misled
                full = "the file system mounted at %s is full" if e.errno == errno.ENOSPC else \
                    "your disk quota on the file system mounted at %s is used up"
                raise UserError("cannot create the lock file %s: %s: %s" % (
                    lock.lock_file, full % mount_point(target), WRITE_ERRNOS[e.errno]))
            raise UserError("cannot create the lock file in %s: %s; choose a writable output path"
                            % (target, e.strerror))


def _is_held(lock_file):
    """Whether a live process holds ``lock_file`` (a shared lock cannot be taken at once; taken, it
    is let go); None where the file cannot be opened to ask. No locks on its file system: False."""
    import fcntl
    try:
        fd = os.open(lock_file, os.O_RDONLY)  # flock needs no write access
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except OSError as e:
        return e.errno in (errno.EWOULDBLOCK, errno.EAGAIN)
    finally:
        os.close(fd)


def dir_holder(directory):
    """The holder of output directory ``directory``'s lock (as a refusal names it), or None when no
    run holds it. Takes nothing: a tool writing one file there asks before it writes."""
    lock_file = lock_path_for(directory, True)
    return _holder_text(lock_file, _read_holder(lock_file)) if _is_held(lock_file) else None


def lock_dir(directory, what="output directory"):
    """Take the exclusive lock of output directory ``directory`` (made if missing), or refuse with
    one line naming the holder. Held until ``release()``, the end of a ``with`` block, or the
    end of the process."""
    return _lock(directory, True, what)


def lock_file(path, what="output file"):
    """The same for one output file (the lock file is ``.NAME.lock`` beside it)."""
    return _lock(path, False, what)


@contextlib.contextmanager
def lock_files(paths, what="output file"):
    """Lock several output files (in sorted order) for the block; refuse if any is in use."""
    with contextlib.ExitStack() as stack:
        for p in sorted(set(os.path.abspath(p) for p in paths)):
            stack.enter_context(lock_file(p, what))
        yield
