"""The one writer of outputs: a temporary name beside the target, renamed when complete.

Every output goes through ``atomic_path``/``atomic_open``/``atomic_save``/``write_json``, so
two rules are implemented once:

- a file is never seen half-written: a failure (or SIGTERM, see ``cli.run_main``) removes
  the temporary ``NAME.tmp-PID``, and a rerun removes temporaries whose process is gone; every
  temporary is also registered until it is renamed or removed, so a signal that lands where no
  ``with`` block can clean up (after the temporary was made, before the caller's ``with`` or
  ``ExitStack`` took it over) still removes it (``remove_own_temporaries``, at the exit);
- out of space, quota, I/O error or read-only file system while writing is one UserError
  naming the file, with (for space) what was needed and what is free, and the fix: free
  space and rerun the same command (finished outputs are kept, so the rerun goes on).
"""
import contextlib
import errno
import fnmatch
import glob
import hashlib
import json
import os
import re
import shlex
import stat

from mlperf_bert import cgroups
from mlperf_bert.errors import FixableError, Terminated, UserError

# errno -> what the user should do about it (the error line ends with it)
WRITE_ERRNOS = {
    errno.ENOSPC: "free space, then rerun the same command",
    errno.EDQUOT: "free space within your quota (or raise it), then rerun the same command",
    errno.EFBIG: "write to a file system that allows larger files (or raise ulimit -f), then rerun the "
                 "same command",
    errno.EIO: "check the disk or the network file system (dmesg), then rerun the same command",
    errno.EROFS: "give an output path on a writable file system, then rerun the same command",
}
# errno -> the fix, for an error on a path the user gave (or one read from it): one line naming it
PATH_ERRNOS = {
    errno.EACCES: "check its permissions (and its folders'): the user running this must be able to read it, and "
                  "to write where outputs go",
    errno.EPERM: "check its permissions and attributes: the user running this must be allowed to use it",
    errno.EISDIR: "a file is expected there: give the file, or remove the directory",
    errno.ENOTDIR: "a file stands where a directory is expected: give a directory",
    errno.EEXIST: "a file stands where a directory is expected: give another path, or move the file away",
    errno.ENOENT: "it does not exist (or went away while this ran): check the path",
    errno.ELOOP: "a symbolic link loop: fix the link",
    errno.ENAMETOOLONG: "give a shorter path",
}
_TMP = re.compile(r"^(?P<name>.+)\.tmp-(?P<pid>\d+)\Z")


def unfinished_write(path):
    """``(name, pid)`` when ``path`` is an atomic writer's temporary ``NAME.tmp-PID`` (a write that has
    not finished: running, or killed), else None."""
    m = _TMP.match(os.path.basename(path))
    return (m.group("name"), m.group("pid")) if m else None


PARTIAL_SUFFIX = ".partial"  # download's NAME.partial: the bytes of a transfer not finished yet
SOURCE_SUFFIX = ".source"  # NAME.partial.source: where they come from
_PARTIAL = re.compile(r"^(?P<name>.+)%s(?:%s)?\Z" % (re.escape(PARTIAL_SUFFIX), re.escape(SOURCE_SUFFIX)))


def unfinished_download(path):
    """NAME when ``path`` is ``download``'s ``NAME.partial`` (a transfer cut off, killed or still
    running) or its record ``NAME.partial.source``, else None: a glob such as ``part-*`` matches
    them, and a partial TFRecord cut at a record's end passes its CRCs."""
    m = _PARTIAL.match(os.path.basename(path))
    return m.group("name") if m else None


FIFO = "a named pipe (FIFO)"
_SPECIAL = ((stat.S_ISFIFO, FIFO), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
            (stat.S_ISBLK, "a block device"))


def special_kind(path):
    """What ``path`` is when it is no regular file nor directory ("a named pipe (FIFO)", a socket, a
    device), else None (also when it cannot be stat'ed: its reader says why)."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    return _kind(mode)


def _kind(mode):
    return next((kind for test, kind in _SPECIAL if test(mode)), None)


def special_file_refusal(path, kind, what=None, fix="give the path of a regular file"):
    """The one-line UserError for ``path``, a file of special ``kind`` (``special_kind``'s) where a
    regular file is read; ``what`` (the flag or kind) starts it."""
    return UserError("%s is %s, not a regular file: %s" % ("%s %s" % (what, path) if what else path, kind, fix))


def open_input(path, mode="r", what=None, fix="give the path of a regular file", **kwargs):
    """``open(path, mode, **kwargs)`` for reading, refusing in one line (``what``, the flag or kind,
    starts it) a named pipe, a socket or a device: opening a FIFO that no process writes to waits for
    ever (a command that hung), and the readers take a file's size and read it more than once. Opened
    without blocking, then looked at (no moment between the look and the open); OSError as open's."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        kind = _kind(os.fstat(fd).st_mode)
        if kind:
            raise special_file_refusal(path, kind, what, fix)
        os.set_blocking(fd, True)
        try:
            return open(fd, mode, **kwargs)
        except OSError as e:  # named by the path, as open(path) names it, not by the descriptor
            raise OSError(e.errno, e.strerror, os.fspath(path)) from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(fd)
        raise


_own = {}  # temporary path -> pid of the process that made it (forked children inherit the dict)


def temporary_name(path):
    """The temporary ``path`` is written under by this process (``remove_stale_temporaries`` knows it)."""
    return "%s.tmp-%d" % (path, os.getpid())


# What the longest name derived from an output's adds to it: its temporary's ``.tmp-PID`` with a PID
# of 7 digits (Linux's largest, 4194304), so that a name is taken or refused whatever the PID (a
# 248-byte name was written under PID 1420 and failed under PID 14200)
DERIVED_NAME_BYTES = len(".tmp-4194304")
PATH_MAX = 4095  # bytes a path may have on Linux (4096 with the final NUL)


def name_max(directory):
    """The bytes a file name may have in ``directory`` (or the first folder above it that exists):
    the file system's NAME_MAX, 255 where it does not say (pathconf's -1, no limit known, or a FUSE or
    network file system's 0: every output was refused, "a file name may have 0 bytes")."""
    d = os.path.abspath(directory)
    while not os.path.isdir(d) and os.path.dirname(d) != d:
        d = os.path.dirname(d)
    try:
        limit = os.pathconf(d, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255
    return limit if limit > 0 else 255


def refuse_long_name(path, what="output", extra=DERIVED_NAME_BYTES, derived="NAME.tmp-PID, the temporary it is "
                     "written under", shown=None):
    """UserError naming ``path`` (``what``: the flag or kind; ``shown``: what to name, if not the path) when
    its file name, ``extra`` bytes longer (``derived``: by default its temporary ``NAME.tmp-PID``, longer than
    its lock ``.NAME.lock``), would pass NAME_MAX, which counts bytes (a UTF-8 letter may take 4), or the
    path itself the 4095 bytes of PATH_MAX: the write failed only there, as h5py's traceback (to-hdf5,
    pack), or named the temporary or the lock ("choose a writable output path"), not the output."""
    size = len(os.fsencode(os.path.basename(path)))
    limit = name_max(os.path.dirname(path) or ".")
    if size + extra > limit:
        raise UserError("%s %s: its name is %d bytes, too long for %s (a file name may have %d bytes): give a name "
                        "of at most %d bytes" % (what, shown or path, size, derived, limit, limit - extra))
    size = len(os.fsencode(path))  # (as given: the kernel takes a relative path from the current folder)
    if size + extra > PATH_MAX:
        raise UserError("%s %s: its path%s is %d bytes, too long for %s (a path may have %d bytes): give a path of "
                        "at most %d bytes" % (what, shown or path, " " + path if shown else "", size, derived,
                                              PATH_MAX, PATH_MAX - extra))


def remove_own_temporaries():
    """Remove the temporaries this process made and has not renamed or removed yet: called when
    the process ends on a signal or an error. A temporary is registered before it can exist, so
    none escapes, wherever the signal lands. While a ``Terminated`` is handled (run_main then leaves
    by ``os._exit``, which runs no finalizer) multiprocessing's too (``_remove_multiprocessing_own``);
    any other end is an exit, whose finalizers remove them."""
    import sys
    pid = os.getpid()
    for tmp, owner in list(_own.items()):
        if owner == pid:
            with contextlib.suppress(OSError):
                os.remove(tmp)
            _own.pop(tmp, None)
    if isinstance(sys.exc_info()[1], Terminated):
        _remove_multiprocessing_own()


def _remove_multiprocessing_own(grace=2.0):
    """What multiprocessing's exit removes for this process, removed its way (this process's
    finalizers only: a forked child holds copies of its parent's): the named semaphores of spawn
    pools' queues (a stop once a pool was joined, its object still held, left them to the resource
    tracker's warning of 6 "leaked"); and $TMPDIR/pymp-* (the trainer's, for its DataLoader workers'
    sockets) once the daemonic children (those workers) are terminated and joined: removed under a
    live one, it printed a FileNotFoundError traceback as that one bound a socket there (c288af2).
    The folder stays where a child lives on (not daemonic, or past ``grace`` seconds). These are
    multiprocessing's private names (the same in Python 3.10 to 3.13); where one is missing, what it
    names is left to multiprocessing's own exit, as before this removal existed."""
    import sys
    import time
    util = sys.modules.get("multiprocessing.util")
    registry = getattr(util, "_finalizer_registry", None)
    if registry is None:
        return
    pid = os.getpid()
    cleanup = getattr(getattr(sys.modules.get("multiprocessing.synchronize"), "SemLock", None), "_cleanup", None)
    remove_dir = getattr(util, "_remove_temp_dir", None)
    tempdir = getattr(util.process.current_process(), "_config", {}).get("tempdir")
    semaphores, folder = [], []
    for f in list(registry.values()):  # (Finalize's attributes: no public ones)
        if getattr(f, "_pid", None) != pid:
            continue
        callback = getattr(f, "_callback", None)
        if cleanup is not None and callback is cleanup:
            semaphores.append(f)
        elif remove_dir is not None and callback is remove_dir and tempdir and getattr(f, "_args", ())[1:] == (tempdir,):
            folder.append(f)
    for f in semaphores:
        with contextlib.suppress(OSError):
            f()
    if not folder:
        return
    children = util.process.active_children()
    if any(not p.daemon for p in children):
        return
    for p in children:
        p.terminate()  # (a loader worker's kills it: trainer/loader.py, _kill_not_terminate)
    deadline = time.monotonic() + grace
    for p in children:
        p.join(max(0.0, deadline - time.monotonic()))
    if all(p.exitcode is not None for p in children):
        with contextlib.suppress(OSError):
            folder[0]()


def free_bytes(path):
    """Bytes an unprivileged user may still write on the file system holding ``path``; None where it
    does not say (a size of 0 blocks: a FUSE file system without statfs, libfuse's default answer)."""
    d = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    st = os.statvfs(d)
    return st.f_bavail * st.f_frsize if st.f_blocks else None


def mount_point(path, mountinfo="/proc/self/mountinfo"):
    """The mount point of the mount holding ``path`` (an existing path): the deepest of ``mountinfo``
    at or above it resolved, where that is readable; else the first folder up that ``os.path.ismount``
    calls one, which misses a bind mount of the same file system (the same st_dev)."""
    path = os.path.realpath(path)
    try:
        with open(mountinfo, encoding="utf-8", errors="surrogateescape") as f:
            points = [re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split(" ")[4])
                      for line in f if line.count(" ") >= 4]
    except OSError:
        points = []
    inside = [p for p in points if path == p or path.startswith(p.rstrip("/") + "/")]
    if inside:
        return max(inside, key=len)
    while not os.path.ismount(path):
        path = os.path.dirname(path)
    return path


def usable_cores():
    """The cores this process may run on (its CPU affinity: taskset, a container's --cpuset-cpus, Kubernetes'
    static CPU manager), not the host's os.cpu_count(): the default number of workers. Under taskset -c 0
    on a 2-core host make-dataset and pack started 2 workers competing for the one core."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # (no affinity on this system)
        return os.cpu_count() or 1


def process_limit(what, alternative):
    """The one line for a thread or process that could not be started (``what``; errors.is_process_limit):
    the limit on processes and threads (a container's --pids-limit, a cgroup's pids.max; a user's ulimit -u,
    an HPC node's most often) is reached, and the kernel says only EAGAIN. ``alternative``: the fix needing
    fewer of them (", or ...")."""
    pids = cgroups.pids_limit()
    return ("cannot start %s: the limit on processes and threads is reached%s: raise it (podman/docker "
            "--pids-limit, Kubernetes' pod pids limit, the cgroup's pids.max, the user's ulimit -u)%s"
            % (what, " (pids.max %s, %s in use)" % pids if pids else "", alternative))


# What the trainer and the loader's workers need threads and processes for: the fewer the workers,
# the fewer of them
LOADER_PROCESSES = ", or give fewer --num_workers (0: the data is read in the trainer)"


def host_memory():
    """Bytes of memory this host has, or None where the system does not say (the system description's;
    what this process may use is ``usable_memory``)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return None


def usable_memory():
    """(bytes, None) of the host's memory, or (bytes, its file) of ``cgroups.memory_limit`` where that is smaller:
    what this process may use, as ``usable_cores``. The checks of what fits read the host's: on a 1 TB host
    in a 16 GB container they passed, and the out-of-memory killer ended the run later. None where the
    system says neither."""
    host, limit = host_memory(), cgroups.memory_limit()
    if limit and (host is None or limit[0] < host):
        return limit
    return (host, None) if host else None


def oom_killed(before):
    """Who sent a child's SIGKILL, in words ("sent by the out-of-memory killer: ..."), where ``cgroups.oom_kills`` has
    grown since it was ``before`` (a process of this control group was ended for memory), else ""."""
    after = cgroups.oom_kills()
    if before is None or after is None or after <= before:
        return ""
    memory = usable_memory()
    if memory and memory[1]:
        return ("sent by the out-of-memory killer: the memory limit was reached, %s (this process's control group's "
                "%s): give it more (a container's --memory, Slurm's --mem) or use less (a smaller --train_batch_size, "
                "fewer --num_workers)" % (_size(memory[0]), memory[1]))
    return "sent by the out-of-memory killer: the host's memory%s ran out" % (", %s," % _size(memory[0]) if memory else "")


def _size(n):
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return ("%d %s" % (n, unit)) if unit == "bytes" else ("%.1f %s" % (n, unit))
        n /= 1024.0


def write_error(path, e, needed=None, written=None, left="no partial file was left"):
    """The one-line UserError for OSError ``e`` raised while writing ``path``."""
    what = os.strerror(e.errno).lower()
    detail = []
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        if needed is not None:
            detail.append("needs %s" % _size(needed))
        elif written is not None:
            detail.append("needs more than the %s it wrote before the disk filled" % _size(written))
        with contextlib.suppress(OSError):
            free = free_bytes(path)
            if free is not None:
                detail.append("%s free in %s" % (_size(free), os.path.dirname(os.path.abspath(path))))
    return UserError("cannot write %s: %s%s; %s: %s"
                     % (path, what, " (%s)" % ", ".join(detail) if detail else "", left, WRITE_ERRNOS[e.errno]))


def is_write_error(e):
    return isinstance(e, OSError) and e.errno in WRITE_ERRNOS


def ensure_space(needs):
    """Refuse at once (before hours of work) when ``{path: bytes}`` cannot fit where it goes.

    Sums per file system (the error names the first path of the one that is short).
    """
    per_dev = {}
    for path, n in needs.items():
        d = os.path.dirname(os.path.abspath(path))
        dev = os.stat(d).st_dev
        first, total = per_dev.get(dev, (path, 0))
        per_dev[dev] = (first, total + n)
    for first, total in per_dev.values():
        free = free_bytes(first)
        if free is not None and total > free:
            raise write_error(first, OSError(errno.ENOSPC, "no space"), needed=total)


class OutputDirError(FixableError):
    """An output directory that cannot be made or written (``make_output_dir``, ``check_writable_dir``)."""


def _broken_link(path):
    """``(link, target, errno)`` of the symbolic link on ``path`` (``path`` itself or a folder above
    it) that leads nowhere: to a path that does not exist (ENOENT), or round in a loop (ELOOP); None
    where the first part of ``path`` that does not exist is no link."""
    parts, p = [], os.path.abspath(path)
    while True:
        parts.append(p)
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    for p in reversed(parts):  # from the root down to the first part that is not there
        try:
            os.stat(p)
        except OSError as e:
            broken = os.path.islink(p) and e.errno in (errno.ENOENT, errno.ELOOP)
            return (p, os.path.realpath(p), e.errno) if broken else None
    return None


def make_output_dir(d):
    """``os.makedirs(d, exist_ok=True)``; a failure is an OutputDirError naming ``d`` and the fix (a
    symbolic link to a missing path, ``d`` or a folder above, is said as such: mkdir calls it a file
    that exists, or a path that does not)."""
    try:
        os.makedirs(d, exist_ok=True)
    except OSError as e:
        broken = _broken_link(d)
        if broken is None:
            raise OutputDirError("cannot create output directory %s: %s" % (d, e.strerror),
                                 PATH_ERRNOS.get(e.errno, "give an output path that can be made"))
        link, target, why = broken
        where = "it" if link == os.path.abspath(d) else link
        if why == errno.ELOOP:
            raise OutputDirError("cannot create output directory %s: %s is a symbolic link in a loop" % (d, where),
                                 "fix the link, or give another output path") from None
        # (not made here: a link to a folder of a file system that is not mounted would write the run elsewhere)
        raise OutputDirError("cannot create output directory %s: %s is a symbolic link to %s, which does not exist"
                             % (d, where, target), "make that folder (or mount the file system it is on), or "
                             "give another output path") from None


def check_writable_dir(path):
    """Raise an OutputDirError unless ``path``'s directory exists (or can be made) and is writable."""
    d = os.path.dirname(os.path.abspath(path))
    make_output_dir(d)
    if not os.access(d, os.W_OK):
        raise OutputDirError("output directory %s is not writable" % d, "choose another output path")


def usable_tempdir(needs, tmpdir_fix="set TMPDIR to a writable folder"):
    """``tempfile.gettempdir()``, or a UserError naming the fix where none of the folders it tries
    can be written (``needs``: what needs one): a read-only container without a /tmp of its own
    (docker run --read-only), whose FileNotFoundError was a traceback."""
    import tempfile
    try:
        return tempfile.gettempdir()
    except FileNotFoundError:
        raise UserError("no writable temporary folder for %s ($TMPDIR, /tmp, /var/tmp, /usr/tmp and the current "
                        "folder %s are not writable): %s, or mount one at /tmp (a read-only container: docker run "
                        "--tmpfs /tmp)" % (needs, os.getcwd(), tmpdir_fix)) from None


def check_tmpdir(num_workers):
    """Refuse a $TMPDIR too long for the workers' sockets (preflight checks it before the run writes
    anything), or none writable. They hand batches over through a Unix socket, $TMPDIR/pymp-XXXXXXXX/listener-XXXXXXXX:
    past the 107 bytes a socket path may have, a worker cannot bind it and the loader waits forever.
    Bytes, not characters: a $TMPDIR of 43 characters, 78 bytes in UTF-8, passed and the run hung.
    Torch-free, so that train_model.sh's CHECK_ONLY runs this same check (``python -S``)."""
    if num_workers <= 0:
        return  # (no worker, no socket: a run without a writable temporary folder trains)
    base = usable_tempdir("the data loader workers' sockets", "give --num_workers=0, set TMPDIR to a writable folder")
    size = len(os.fsencode(base))
    if size + len("/pymp-12345678/listener-12345678") > 107:
        raise UserError("$TMPDIR %s is too long (%d bytes) for the data loader workers' sockets, "
                        "whose paths may have 107: set TMPDIR to a shorter folder (e.g. /tmp), or give "
                        "--num_workers=0" % (base, size))


def check_compile_cache(device_type="cpu"):
    """Refuse torch.compile's cache folders on a file system mounted noexec (docker's ``--tmpfs /tmp``,
    a hardened host's /tmp): inductor builds its kernels there as shared objects and loads them, which
    failed after the first compile's minute as torch's traceback (exit 1). On CUDA, Triton builds and
    loads its launchers in its own cache, inductor's ``triton/`` unless TRITON_CACHE_DIR names another."""
    where = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    whose = "TORCHINDUCTOR_CACHE_DIR" if where else "torch's default, in the temporary folder: TMPDIR"
    where = os.path.abspath(where or usable_tempdir("torch.compile's cache (--compile)",
                                                    "set TORCHINDUCTOR_CACHE_DIR (or TMPDIR) to a writable folder"))
    folders = [(where, whose, "set TORCHINDUCTOR_CACHE_DIR to a folder on one that allows running programs "
                               "(start_training.sh's: OUTPUT_DIR/compile_cache)")]
    if device_type == "cuda" and os.environ.get("TRITON_CACHE_DIR"):
        folders.append((os.path.abspath(os.environ["TRITON_CACHE_DIR"]), "TRITON_CACHE_DIR",
                        "set TRITON_CACHE_DIR to a folder on one that allows running programs (or unset it: "
                        "inductor's cache holds Triton's then)"))
    for where, whose, fix in folders:
        mount = where
        while not os.path.exists(mount) and os.path.dirname(mount) != mount:  # (made by the compile)
            mount = os.path.dirname(mount)
        try:
            noexec = os.statvfs(mount).f_flag & os.ST_NOEXEC
        except OSError:
            continue  # (the compile says what is wrong with it)
        if noexec:
            raise UserError("torch.compile's cache (--compile) would be in %s (%s), on a file system mounted noexec, "
                            "where inductor cannot load the kernels it builds: %s, or mount it with exec"
                            % (where, whose, fix))


def same_file(a, b):
    """Whether paths ``a`` and ``b`` name one file (real paths, or the same inode)."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def refuse_repeated_files(files, what):
    """UserError when ``files`` names one file twice (the same path, a symlink or hard link, ``..``):
    it would be read twice (or written over by itself)."""
    seen = {}
    for f in files:
        try:
            st = os.stat(f)
            key = (st.st_dev, st.st_ino)
        except OSError:
            key = os.path.realpath(f)
        if key in seen:
            if seen[key] == f:
                raise UserError("%s names %s twice: give each file once" % (what, f))
            raise UserError("%s names one file twice: %s and %s: give each file once" % (what, seen[key], f))
        seen[key] = f


def refuse_overwriting_inputs(outputs, inputs, what="output"):
    """UserError when an output would replace one of the inputs (compared by real path)."""
    for out in outputs:
        for inp in inputs:
            if same_file(out, inp):
                raise UserError("%s %s is the input %s: writing it would destroy the input; give another "
                                "output path" % (what, out, inp))


_COMPRESSED = ((b"\x1f\x8b", "gzip-compressed", "gunzip"), (b"BZh", "bzip2-compressed", "bunzip2"),
               (b"\xfd7zXZ\x00", "xz-compressed", "unxz"), (b"(\xb5/\xfd", "zstd-compressed", "unzstd"),
               (b"PK\x03\x04", "a zip archive", "unzip"))


def compression(path):
    """``(kind, tool)`` of a compressed ``path`` (``("gzip-compressed", "gunzip")``; bzip2, xz, zstd,
    zip alike) by its first bytes, or None (also when it cannot be read)."""
    try:
        with open(path, "rb") as f:
            head = f.read(6)
    except OSError:
        return None
    for magic, kind, tool in _COMPRESSED:
        if head.startswith(magic):
            return kind, tool
    return None


# the name ending each tool wants (gunzip, unxz, unzstd skip any other name: "unknown suffix -- ignored")
_SUFFIXES = {"gunzip": (".gz", ".tgz"), "unxz": (".xz", ".txz"), "unzstd": (".zst", ".tzst")}


def compressed(path):
    """``"PATH is gzip-compressed: gunzip it first"`` (bzip2, xz, zstd, zip alike), or None: a reader's
    error says so instead of calling a compressed file damaged or not text. A name without the tool's
    ending (a TFRecord that TensorFlow wrote with compression_type GZIP) gets ``gunzip -c PATH > FILE``."""
    found = compression(path)
    if not found:
        return None
    kind, tool = found
    if not path.endswith(_SUFFIXES.get(tool, ("",))):
        return "%s is %s: decompress it first (%s -c %s > FILE)" % (path, kind, tool, shlex.quote(path))
    return "%s is %s: %s it first" % (path, kind, tool)


def refuse_special_output(path, what="output"):
    """UserError when the output ``path`` is a named pipe, a socket or a device: the rename that ends
    every write would replace it by a regular file (``--output_file=/dev/null``, run as root, replaced
    the system's /dev/null with the records)."""
    kind = special_kind(path)
    if kind:
        raise special_file_refusal(path, kind, what, "give the path of a regular file (it would be replaced by one)")


def refuse_replacing_another_kind(path, is_kind, kind, what="--output", fix="choose another file, or remove it"):
    """UserError when ``path`` is a file with bytes that ``is_kind(path)`` says is not ``kind`` (what
    the command writes): a mistyped output (vocab.txt, a text shard) is not replaced. ``what``: the
    flag that named it ("": an output a command names itself)."""
    refuse_special_output(path, what)
    if os.path.isfile(path) and os.path.getsize(path) and not is_kind(path):
        raise UserError("%s exists and is not %s: refusing to overwrite it (%s)"
                        % ("%s %s" % (what, path) if what else path, kind, fix))


def proc_stat(pid):
    """/proc/PID/stat's fields after the command name (state, ppid, ...), as bytes; the name may hold
    spaces and parentheses, so it is split at its last ')'. OSError where there is no such file."""
    with open("/proc/%d/stat" % pid, "rb") as f:
        return f.read().rsplit(b")", 1)[1].split()


def pid_alive(pid):
    """Whether process ``pid`` runs on this host (a zombie, killed and not yet reaped, does not)."""
    try:
        return proc_stat(pid)[0] not in (b"Z", b"X")
    except FileNotFoundError:
        return False
    except (OSError, IndexError):
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_temporaries(directory, names=None):
    """Delete the temporaries (``NAME.tmp-PID``) of ``names`` (default: any) in ``directory``
    whose process is gone; a live process's temporary (another worker, another run) is kept."""
    if not os.path.isdir(directory):
        return []
    names = None if names is None else set(names)
    removed = []
    for n in os.listdir(directory):
        m = _TMP.match(n)
        if not m or (names is not None and m.group("name") not in names):
            continue
        pid = int(m.group("pid"))
        if pid == os.getpid() or pid_alive(pid):
            continue
        with contextlib.suppress(FileNotFoundError, IsADirectoryError):
            os.remove(os.path.join(directory, n))
            removed.append(n)
    return removed


def _mentions(e, tmp):
    """Whether OSError ``e`` is about file ``tmp`` (h5py names it only in the message)."""
    return tmp in (e.filename, getattr(e, "filename2", None)) or tmp in str(e)


def sync_fd(fd):
    """``os.fsync(fd)`` where the file system can sync: one that cannot (EINVAL: CIFS, VirtualBox
    shared folders, some FUSE file systems) has the bytes all the same, only a crash of the machine
    may lose them; refusing it made every output on it, and so every run, fail."""
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno != errno.EINVAL:
            raise


def evict_from_page_cache(paths):
    """Drop what the page cache holds of each file of ``paths`` (clean pages: inputs), where the file
    system allows it (``posix_fadvise`` DONTNEED; nothing where it does not)."""
    for path in paths:
        with contextlib.suppress(OSError, AttributeError):  # (AttributeError: a platform without it)
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _sync(tmp):
    """Its bytes on the disk before the rename names it: what another library wrote into it (h5py,
    torch.save, savefig) as ``atomic_open``'s own; after a crash of the machine the output is whole
    or absent. An error is about ``tmp``."""
    fd = os.open(tmp, os.O_RDONLY)
    try:
        sync_fd(fd)
    except OSError as e:
        raise OSError(e.errno, e.strerror, tmp) from e
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path, needed=None, _owns=None):
    """Yield a temporary path; on success it is renamed to ``path``, on failure removed.

    ``needed``: bytes the output will take, when known: checked against the free space
    before anything is written, and named in the error if the disk fills anyway. A write
    error is reported against ``path`` only when it is about this file (another output
    written in the same block reports its own).
    """
    if os.path.isdir(path):
        raise UserError("output %s is a directory: give a file path" % path)
    refuse_special_output(path, "output")
    refuse_long_name(path)
    check_writable_dir(path)
    remove_stale_temporaries(os.path.dirname(os.path.abspath(path)), [os.path.basename(path)])
    if needed is not None:
        ensure_space({path: needed})
    tmp = temporary_name(path)
    _own[tmp] = os.getpid()
    try:
        yield tmp
        _sync(tmp)
        os.replace(tmp, path)
        _own.pop(tmp, None)
    except BaseException as e:
        written = None
        with contextlib.suppress(OSError):
            written = os.path.getsize(tmp)
        with contextlib.suppress(OSError):
            os.remove(tmp)
        _own.pop(tmp, None)
        if is_write_error(e) and (_mentions(e, tmp) or (_owns is not None and _owns(e))):
            raise write_error(path, e, needed, written) from e
        raise


class _Recorder:
    """The file ``atomic_open`` yields: a real file whose write errors are kept, so that an
    error is told apart from another file's, and found again when a library (torch.save)
    turns it into a RuntimeError without the errno ("unexpected pos ..."); a stop raised as it
    wrote (a signal handler's Terminated, Ctrl-C) is kept too (``stop``), for the same reason."""

    def __init__(self, f):
        self._f = f
        self.error = None
        self.stop = None
        self.closing = False

    def write(self, data):
        try:
            return self._f.write(data)
        except OSError as e:
            self.error = self.error or e
            raise
        except BaseException as e:
            self.stop = self.stop or e
            raise

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __iter__(self):
        return iter(self._f)


@contextlib.contextmanager
def atomic_open(path, mode="wb", needed=None, **kwargs):
    """Open a temporary file for writing; it becomes ``path`` only when the block completes."""
    box = []

    def owns(e):
        return bool(box) and (e is box[0].error or box[0].closing)

    with atomic_path(path, needed, owns) as tmp:
        f = open(tmp, mode, **kwargs)
        rec = _Recorder(f)
        box.append(rec)
        try:
            yield rec
        except BaseException:
            # the block's error is the news: after a write error (this file's or another's) the
            # close's flush of what is buffered fails again, and its error would replace the first
            with contextlib.suppress(OSError):
                f.close()
            raise
        try:
            rec.closing = True  # errors from here on (flush, fsync, close) are this file's
            f.flush()
            sync_fd(f.fileno())
        finally:
            f.close()


def atomic_save(path, save, needed=None):
    """Call ``save(f)`` with a binary file that becomes ``path`` when it returns, e.g.
    ``atomic_save(path, lambda f: torch.save(state, f))``; write errors as in ``atomic_path``."""
    with atomic_open(path, "wb", needed) as f:
        try:
            save(f)
        except Exception as e:
            if f.stop is not None:  # torch.save: "unexpected pos ...", a traceback, where a stop was raised
                raise f.stop from None
            if f.error is not None:  # the real cause, which ``save`` replaced
                raise f.error from e
            raise
        if f.error is not None:  # swallowed by ``save``: the file is incomplete
            raise f.error
    return path


def file_md5(path, progress=None, chunk=1 << 22):
    """The md5 of ``path``'s bytes (hex), read in chunks; ``progress``: a bar updated by bytes read."""
    h = hashlib.md5()
    with open_input(path, "rb") as f:
        while True:
            buf = f.read(chunk)
            if not buf:
                break
            h.update(buf)
            if progress is not None:
                progress.update(len(buf))
    return h.hexdigest()


class _Stopped(Exception):
    """Ends a hash of md5_many's: the command is stopping."""


class _Counted:
    """md5_many's progress for one file: the bar's count, or _Stopped once the command stops."""

    def __init__(self, bar, stop):
        self.bar, self.stop = bar, stop

    def update(self, n):
        if self.stop.is_set():
            raise _Stopped()
        if self.bar is not None:
            self.bar.update(n)


def md5_many(paths, workers=None, desc="md5", progress=True):
    """``{path: md5}`` hashed in parallel threads (hashlib releases the GIL), with a byte progress
    bar when ``progress``. An error or a signal in the caller stops every hash within a chunk:
    the pool's own exit would wait for each file queued (a SIGTERM to a verify of 13 GB ended it
    only after all of it was read)."""
    import concurrent.futures
    import threading
    from mlperf_bert.progress import bar
    workers = workers or min(32, usable_cores())
    stop = threading.Event()
    pool = concurrent.futures.ThreadPoolExecutor(workers)
    with bar(total=sum(os.path.getsize(p) for p in paths), unit="B", unit_scale=True, desc=desc, leave=False,
             disable=not progress) as shown:
        try:
            futures = {p: pool.submit(file_md5, p, _Counted(shown if progress else None, stop)) for p in paths}
            return {p: fut.result() for p, fut in futures.items()}
        finally:
            stop.set()
            pool.shutdown(wait=False, cancel_futures=True)


def read_text(path, what):
    """The text of the UTF-8 file ``path`` as it is (no newline translated; a ``what``, named in the
    error): an unreadable file, or one that is not UTF-8, is a one-line UserError."""
    try:
        with open_input(path, encoding="utf-8", newline="", what=what) as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise UserError("cannot read %s %s: %s" % (what, path, getattr(e, "strerror", None) or e))


def read_lines(path, what):
    """The lines of the UTF-8 text file ``path`` (``read_text``'s), split at "\n", "\r\n" or "\r"
    alone: not at the other characters str.splitlines splits at (U+0085, U+2028, \x1c...), which a
    file name may hold (a list line "a<U+0085>b" was read as two names)."""
    return split_lines(read_text(path, what))


def split_lines(text):
    """``text``'s lines, split at "\n", "\r\n" or "\r" alone (read_lines)."""
    lines = re.split(r"\r\n|\r|\n", text)
    return lines[:-1] if lines and lines[-1] == "" else lines


def load_json(f, **kwargs):
    """``json.load(f, **kwargs)``; JSON nested past the parser's depth (a record of 100,000 ``[``) is a ValueError,
    as any other bad JSON, where json raises RecursionError (a traceback past every reader's ``except``)."""
    try:
        return json.load(f, **kwargs)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def write_json(path, obj, newline=False, **dump_kwargs):
    """``json.dump(obj, f, **dump_kwargs)`` into ``path`` as ``atomic_open`` writes (UTF-8), and a
    final newline when ``newline``."""
    with atomic_open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, **dump_kwargs)
        if newline:
            f.write("\n")


def glob_parts(spec):
    """[(part, its matches, sorted)] of a comma list of paths and globs, as the trainer and the
    dataset tools read them (train_model.sh's file check too: it has no bash glob of its own, whose
    backslash escapes and line splitting differ)."""
    parts = [p.strip() for p in (spec or "").split(",") if p.strip()]
    # a file named with a glob's characters ("part[1].tfrecord") is that file, not a pattern that misses it
    return [(p, [p] if glob.escape(p) != p and os.path.lexists(p) else sorted(glob.glob(p))) for p in parts]


def comma_in_name(spec, k):
    """Where part ``k`` of the comma list ``spec`` (glob_parts') matched nothing: the existing file whose
    name holds a ',' that the list split into that part and its neighbours (a file "a,b" was "a does not
    exist", though it does), else None."""
    pieces = (spec or "").split(",")
    k = [i for i, p in enumerate(pieces) if p.strip()][k]
    for i in range(max(0, k - 8), k + 1):
        for j in range(max(i + 1, k), min(len(pieces), i + 9)):
            name = ",".join(pieces[i:j + 1]).strip()
            if os.path.lexists(name):
                return name
    return None


def comma_hint(spec, k):
    """What a list reader adds where part ``k`` of ``spec`` matched nothing (glob_parts): where a file's
    name holds a ',' (comma_in_name), the glob that gives it; else ''."""
    name = comma_in_name(spec, k)
    return "" if name is None else "; %s exists, but the list is split at each ',': give it by a glob, e.g. %s" % (
        name, glob.escape(name).replace(",", "?"))


def glob_part_takes(part, path):
    """Whether ``part`` of a file list (glob_parts) matches ``path`` once it exists, as glob.glob would:
    part by part (a * never takes a /), a leading . only where the pattern has one; also with symbolic
    links resolved, in ``path`` and in the pattern's folders before its first glob (glob follows them)."""
    pattern = os.path.abspath(part).split(os.sep)
    first = next(i for i, p in enumerate(pattern + ["*"]) if glob.escape(p) != p)
    resolved = os.path.realpath(os.sep.join(pattern[:first]) or os.sep).split(os.sep) + pattern[first:]
    return any(len(names) == len(pat) and all(
        fnmatch.fnmatchcase(n, p) and (n[:1] != "." or p[:1] == ".") for n, p in zip(names, pat))
        for names, pat in ((os.path.abspath(path).split(os.sep), pattern),
                           (os.path.realpath(path).split(os.sep), resolved)))


def missing_dirs(path):
    """``path`` and each of its parents that does not exist (yet), deepest first."""
    out = []
    path = os.path.abspath(path)
    while not os.path.lexists(path):
        out.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return out


@contextlib.contextmanager
def new_dirs_removed_on_error(*paths):
    """Around the part of a command that makes the output folders ``paths`` (with their parents):
    those of them that do not exist when it starts are this run's, and when it ends by an exception
    (an input refused, a signal) each of them that is empty again is removed, deepest first. So a
    refused run leaves no new, empty folder that looks like a started output. A folder that
    existed before, or that holds anything (a finished output, a file someone else put there), is
    never removed."""
    made = sorted({d for p in paths for d in missing_dirs(p)}, key=len, reverse=True)
    try:
        yield
    except BaseException:
        for d in made:  # a child's path is longer than its parent's: children first
            with contextlib.suppress(OSError):  # not empty, or not ours to remove: kept
                os.rmdir(d)
        raise


if __name__ == "__main__":  # start_training.sh's (python -S): `oom_kills` before a run, `oom_killed N` after it
    import sys
    if sys.argv[1:2] == ["oom_kills"]:
        count = cgroups.oom_kills()
        print("" if count is None else count)
    elif sys.argv[1:2] == ["oom_killed"] and sys.argv[2:] and sys.argv[2].isdigit():
        print(oom_killed(int(sys.argv[2])))
