"""TFRecord framing: length, masked CRC-32C of the length, data, masked CRC-32C of the data.

The reader verifies every length and CRC and names the file and record index of a
corrupt or truncated record, so a damaged shard never trains silently.
"""
import glob
import os
import struct

from crc32c import crc32c

from mlperf_bert.errors import UserError
from mlperf_bert.fileio import atomic_open

_MASK_DELTA = 0xA282EAD8
_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")


def masked_crc32c(data):
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def frame(data):
    """The bytes of one TFRecord holding ``data``."""
    head = _U64.pack(len(data))
    return b"".join((head, _U32.pack(masked_crc32c(head)), data, _U32.pack(masked_crc32c(data))))


class TFRecordWriter:
    """Writes records to a temporary file that becomes ``path`` on ``close()``.

    Use as a context manager: if the block raises, nothing named ``path`` is left.
    ``needed``: the bytes to be written, when known (see ``fileio.atomic_path``).
    """

    def __init__(self, path, needed=None):
        self.path = path
        self._ctx = atomic_open(path, "wb", needed)
        self._f = self._ctx.__enter__()
        self.count = 0

    def write(self, data):
        self._f.write(frame(data))
        self.count += 1

    def write_framed(self, framed_bytes, count):
        """Write already framed bytes holding ``count`` records (fast batch path)."""
        self._f.write(framed_bytes)
        self.count += count

    def close(self):
        if self._ctx is not None:
            ctx, self._ctx = self._ctx, None
            ctx.__exit__(None, None, None)

    def abort(self, exc):
        if self._ctx is not None:
            ctx, self._ctx = self._ctx, None
            ctx.__exit__(type(exc), exc, exc.__traceback__)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc is None:
            self.close()
        else:
            self.abort(exc)
        return False


def write_records(path, records):
    """Write an iterable of serialized records to ``path`` atomically; return the count."""
    with TFRecordWriter(path) as w:
        for r in records:
            w.write(r)
    return w.count


def _open(path):
    try:
        return open(path, "rb")
    except OSError as e:
        raise UserError("cannot read TFRecord file %s: %s" % (path, e.strerror))


def _truncated(path, index):
    return UserError("%s: record %d is truncated: the file is incomplete, regenerate or re-download it"
                     % (path, index))


def _check_head(path, index, head, verify):
    """The data length of a record header, after checking the header is whole (and its CRC)."""
    if len(head) < 12:
        raise _truncated(path, index)
    if verify and _U32.unpack_from(head, 8)[0] != masked_crc32c(head[:8]):
        raise UserError("%s: record %d has a corrupt length (CRC mismatch): the file is "
                        "damaged, regenerate or re-download it" % (path, index))
    return _U64.unpack_from(head)[0]


def check_data(path, index, data, tail):
    """Raise unless ``tail`` (4 bytes) is the masked CRC-32C of record ``index``'s ``data``."""
    if len(tail) < 4 or _U32.unpack_from(tail)[0] != masked_crc32c(data):
        raise UserError("%s: record %d is corrupt (data CRC mismatch): the file is "
                        "damaged, regenerate or re-download it" % (path, index))


def read_records(path, verify=True):
    """Yield the data of every record in ``path``, checking lengths and CRCs."""
    with _open(path) as f:
        size = os.fstat(f.fileno()).st_size
        pos = index = 0
        while pos < size:
            n = _check_head(path, index, f.read(12), verify)
            if pos + 16 + n > size:  # also keeps a corrupt length from asking for a huge read
                raise _truncated(path, index)
            data = f.read(n)
            if verify:
                check_data(path, index, data, f.read(4))
            else:
                f.seek(4, os.SEEK_CUR)
            yield data
            pos += 16 + n
            index += 1


def scan_records(path):
    """Yield (offset of the data, length) of every record of ``path``, reading only the headers."""
    with _open(path) as f:
        size = os.fstat(f.fileno()).st_size
        pos = index = 0
        while pos < size:
            n = _check_head(path, index, f.read(12), True)
            if pos + 16 + n > size:
                raise _truncated(path, index)
            yield pos + 12, n
            pos += 16 + n
            f.seek(pos)
            index += 1


def count_records(path):
    """The number of records of ``path`` (headers only: lengths and their CRCs are checked)."""
    return sum(1 for _ in scan_records(path))


def expand_paths(spec, what="input file"):
    """Expand a comma-separated list of paths and globs, in order; error if any part matches nothing."""
    out = []
    for part in [p.strip() for p in (spec or "").split(",") if p.strip()]:
        matches = sorted(glob.glob(part))
        if not matches:
            raise UserError("%s %s does not exist (check the path or glob)" % (what, part))
        out.extend(matches)
    if not out:
        raise UserError("no %s given" % what)
    for p in out:
        if os.path.isdir(p):
            raise UserError("%s %s is a directory: give files or a glob such as %s/*" % (what, p, p))
    return out
