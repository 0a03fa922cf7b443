"""Atomic outputs: write to a temporary name beside the target, rename when complete."""
import contextlib
import os
import re

from mlperf_bert.errors import UserError


def check_writable_dir(path):
    """Raise a UserError unless ``path``'s directory exists (or can be made) and is writable."""
    d = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(d, exist_ok=True)
    except OSError as e:
        raise UserError("cannot create output directory %s: %s" % (d, e.strerror))
    if not os.access(d, os.W_OK):
        raise UserError("output directory %s is not writable: choose another output path" % d)


@contextlib.contextmanager
def atomic_path(path):
    """Yield a temporary path; on success it is renamed to ``path``, on failure removed."""
    if os.path.isdir(path):
        raise UserError("output %s is a directory: give a file path" % path)
    check_writable_dir(path)
    tmp = "%s.tmp-%d" % (path, os.getpid())  # remove_stale_temporaries knows this form
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


@contextlib.contextmanager
def atomic_open(path, mode="wb", **kwargs):
    """Open a temporary file for writing; it becomes ``path`` only when the block completes."""
    with atomic_path(path) as tmp:
        with open(tmp, mode, **kwargs) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())


def remove_stale_temporaries(directory, names):
    """Delete the temporaries (``NAME.tmp-PID``) a killed run left in ``directory`` for ``names``."""
    pattern = re.compile(r"^(%s)\.tmp-\d+$" % "|".join(re.escape(n) for n in names))
    for n in os.listdir(directory):
        if pattern.match(n):
            os.remove(os.path.join(directory, n))
