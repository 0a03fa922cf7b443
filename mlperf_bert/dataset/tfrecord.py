"""TFRecord framing: length, masked CRC-32C of the length, data, masked CRC-32C of the data.

The reader verifies every length and CRC and names the file and record index of a
corrupt or truncated record, so a damaged shard never trains silently.
"""
import concurrent.futures
import errno
import glob
import hashlib
import mmap
import os
import shlex
import struct

from crc32c import crc32c

from mlperf_bert.errors import UserError
from mlperf_bert.dataset.run_record import unfinished_make_dataset
from mlperf_bert.fileio import (FIFO, atomic_open, comma_hint, glob_parts, open_input, special_file_refusal,
                                special_kind, unfinished_download, unfinished_write)

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

    def stream(self, min_space=0):
        """A ``RecordStream`` writing to this file in the background (see there)."""
        return RecordStream(self, min_space)

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


class RecordStream:
    """Framed records written while the next ones are made: encode into ``space()``,
    hand them over with ``commit(nbytes, count)``; ``with`` it, the end writes the rest.

    Two page-aligned buffers take turns: one is written by a worker thread while the
    caller fills the other.  Writes bypass the page cache (O_DIRECT, whole 4 KiB blocks;
    the last partial block is written normally) where the file system allows it, which
    saves the copy into the cache and the wait in the final fsync; elsewhere they are
    ordinary writes.  Errors of a write are raised by the next ``commit`` or the end,
    through the file's own ``write`` (so ``fileio`` reports them as for any output).
    """

    BLOCK = 4096
    SIZE = 4 << 20

    def __init__(self, writer, min_space=0):
        self._w = writer
        size = max(self.SIZE, min_space + 2 * self.BLOCK)
        size = -(-size // self.BLOCK) * self.BLOCK
        self._bufs = [mmap.mmap(-1, size), mmap.mmap(-1, size)]
        self._cur, self._carry, self._pending = 0, 0, None
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tfrecord-write")
        writer._f.flush()  # O_DIRECT takes whole blocks: nothing may stay buffered
        self._pos = writer._f.tell()
        self._direct = self._pos % self.BLOCK == 0 and _set_direct(writer._f, True)

    def space(self):
        """The writable memory to put the next framed records in."""
        return memoryview(self._bufs[self._cur])[self._carry:]

    def commit(self, nbytes, count):
        """The first ``nbytes`` of ``space()`` hold ``count`` new records: write them."""
        buf = self._bufs[self._cur]
        total = self._carry + nbytes
        full = total - total % self.BLOCK if self._direct else total
        self._wait()
        nxt = self._bufs[1 - self._cur]
        nxt[:total - full] = buf[full:total]  # a partial block waits for the next records
        if full:
            self._pending = self._pool.submit(self._write, memoryview(buf)[:full])
        self._cur, self._carry = 1 - self._cur, total - full
        self._w.count += count

    def _write(self, data):
        start = self._pos
        f = self._w._f
        try:
            f.write(data)
        except OSError as e:
            if not (self._direct and e.errno == errno.EINVAL):
                raise
            # O_DIRECT refused at write time (file system or device limits): write normally;
            # the atomic writer's file keeps its first error, and this one was handled
            if getattr(f, "error", None) is e:
                f.error = None
            self._direct = False
            _set_direct(f, False)
            f.seek(start)
            f.write(data)
        self._pos = start + len(data)

    def _wait(self):
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            self._wait()
            if exc is None:
                if self._direct:
                    _set_direct(self._w._f, False)
                self._write(memoryview(self._bufs[self._cur])[:self._carry])
        finally:
            if exc is not None and self._pending is not None:
                concurrent.futures.wait([self._pending])  # never leave a write running
            self._pool.shutdown()
            for b in self._bufs:
                try:
                    b.close()
                except BufferError:  # a view is still held (by a traceback): freed with it
                    pass
        return False


def _set_direct(f, on):
    """Turn O_DIRECT on or off for open file ``f``; whether it could be."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return False
    import fcntl
    try:
        fd = f.fileno()
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, (flags | flag) if on else (flags & ~flag))
    except (OSError, AttributeError, ValueError):
        return False
    return True


def write_records(path, records):
    """Write an iterable of serialized records to ``path`` atomically; return the count."""
    with TFRecordWriter(path) as w:
        for r in records:
            w.write(r)
    return w.count


def _open(path):
    try:
        return open_input(path, "rb", fix="give the path of a TFRecord file")
    except OSError as e:  # (a path given alone, not through expand_paths: pick-eval-samples' input)
        fix = {errno.ENOENT: "check the path", errno.EISDIR: "give the path of a TFRecord file in it"}
        raise UserError("cannot read TFRecord file %s: %s: %s"
                        % (path, e.strerror, fix.get(e.errno, "check the path and its permissions")))


def _truncated(path, index):
    return UserError("%s: record %d is truncated: the file is incomplete, regenerate or re-download it"
                     % (path, index))


def _is_text(head):
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return bool(text) and all(c.isprintable() or c in "\t\r\n" for c in text)


def _not_records(path, head):
    """A file whose first bytes are text is no TFRecord (a JSON file or notes caught by a glob), not a
    damaged one."""
    return UserError("%s is not a TFRecord or HDF5 file (it starts with text: %r): if a glob named it, narrow the "
                     "glob to the data files" % (path, head.decode("utf-8")))


def _zlib_records(path):
    """The line for a TFRecord file TensorFlow wrote with compression_type ZLIB (a zlib stream, which has
    no magic number: it is one when its first bytes inflate to a record header), or None. It was called
    damaged, to be re-downloaded."""
    import zlib
    try:
        with open(path, "rb") as f:
            head = zlib.decompressobj().decompress(f.read(1 << 16), 12)
    except (OSError, zlib.error):
        return None
    if len(head) < 12 or _U32.unpack_from(head, 8)[0] != masked_crc32c(head[:8]):
        return None
    return ("%s is a ZLIB-compressed TFRecord file (TensorFlow's compression_type ZLIB), which this project does "
            "not read: decompress it first (python3 -c 'import sys, zlib; sys.stdout.buffer.write(zlib.decompress("
            "sys.stdin.buffer.read()))' < %s > FILE)" % (path, shlex.quote(path)))


def _check_head(path, index, head, verify):
    """The data length of a record header, after checking the header is whole (and its CRC)."""
    if index == 0 and (len(head) < 12 or _U32.unpack_from(head, 8)[0] != masked_crc32c(head[:8])):
        from mlperf_bert.fileio import compressed
        packed = compressed(path) or _zlib_records(path)
        if packed:  # (a downloaded .gz not unpacked, or TensorFlow's compressed TFRecords: not a damaged file)
            raise UserError(packed)
        if _is_text(head):
            raise _not_records(path, head)
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


def read_records(path, verify=True, crcs=None):
    """Yield the data of every record in ``path``, checking lengths and CRCs. ``crcs``: a hash
    updated with each record's data CRC as stored (``scan_records``)."""
    with _open(path) as f:
        size = os.fstat(f.fileno()).st_size
        pos = index = 0
        while pos < size:
            n = _check_head(path, index, f.read(12), verify)
            if pos + 16 + n > size:  # also keeps a corrupt length from asking for a huge read
                raise _truncated(path, index)
            data = f.read(n)
            if verify or crcs is not None:
                tail = f.read(4)
                if verify:
                    check_data(path, index, data, tail)
                if crcs is not None:
                    crcs.update(tail)
            else:
                f.seek(4, os.SEEK_CUR)
            yield data
            pos += 16 + n
            index += 1


def scan_records(path, crcs=None):
    """Yield (offset of the data, length) of every record of ``path``, reading only the headers.
    ``crcs``: a hash updated with each record's data CRC as stored, not checked against the data
    (the 4 bytes before the next header: no read more), a digest of every record in its order."""
    with _open(path) as f:
        size = os.fstat(f.fileno()).st_size
        pos = index = 0
        head = f.read(12)
        while pos < size:
            n = _check_head(path, index, head, True)
            if pos + 16 + n > size:
                raise _truncated(path, index)
            yield pos + 12, n
            f.seek(pos + 12 + n)
            tail = f.read(16)
            if crcs is not None:
                crcs.update(tail[:4])
            head = tail[4:]
            pos += 16 + n
            index += 1


def record_crcs():
    """The hash a scan of a TFRecord file updates with each record's data CRC, in order (``crcs`` of
    ``scan_records`` and ``read_records``)."""
    return hashlib.sha256()


def crcs_digest(crcs):
    """The digest of ``crcs`` (``record_crcs``, after a scan) that a run's identity keeps: checkpoints
    store it, so its value stays what earlier versions wrote."""
    return crcs.hexdigest()[:16]


def scan_digests(files):
    """(records in all, {path: (bytes, ``crcs_digest``)}) of TFRecord ``files`` by one scan of their
    headers: the tags ``refuse_copies`` compares, as the trainer's start takes them."""
    total, tags = 0, {}
    for path in files:
        crcs = record_crcs()
        total += sum(1 for _ in scan_records(path, crcs))
        tags[path] = (os.path.getsize(path), crcs_digest(crcs))
    return total, tags


def refuse_copies(files, tags, what):
    """UserError when two of ``files`` hold the same records: their ``tags`` ({path: (bytes, digest of
    its records' CRCs)}, ``scan_digests`` or a scan that reads every header anyway; an HDF5 file's: its
    datasets' CRC-32Cs) agree. A shard copied to another
    folder and given beside the original was read twice every epoch (or written twice) without a word;
    ``refuse_repeated_files`` sees one file by two paths only. A file without a tag is not compared."""
    first = {}
    for f in files:
        tag = tags.get(f)
        if tag is None:
            continue
        if tag in first:
            raise UserError("%s names two files of the same records: %s and %s (a copy of it?): give each file "
                            "once" % (what, first[tag], f))
        first[tag] = f


def count_records(path):
    """The number of records of ``path`` (headers only: lengths and their CRCs are checked)."""
    return sum(1 for _ in scan_records(path))


def refuse_special_file(path, what, fix="give the path of a regular file", pipes=False):
    """One line for an input ``path`` that is a named pipe (unless ``pipes``), a socket or a device:
    opening a FIFO no process writes to waits for ever (a command that hung), and the readers take a
    file's size and read it more than once. ``what`` (the flag) starts the line, when given."""
    kind = special_kind(path)
    if kind and not (pipes and kind == FIFO):
        raise special_file_refusal(path, kind, what, fix)


def refuse_temporary(path, what):
    """One line for an input ``path`` a glob matched that is an atomic writer's temporary
    ``NAME.tmp-PID``: a write that did not finish leaves it (a killed make-dataset's
    ``part-00007-of-00500.tmp-4242``), and a glob such as ``part-*`` matches it; its records, cut off
    at a record's end by the kill, all pass their CRCs, so it was read (trained on, packed,
    converted) as a shard of the set. So is ``download``'s ``NAME.partial`` (and its record). A file
    named so and given by its name is the user's own."""
    m = unfinished_write(path)
    if m:
        raise UserError("%s %s is the temporary of an unfinished write of %s (process %s: still running, or "
                        "killed): let it end, or rerun the command that makes %s (make-dataset goes on where it "
                        "stopped); or narrow the glob" % (what, path, m[0], m[1], m[0]))
    name = unfinished_download(path)
    if name:  # (a partial file cut at a record's end passes its CRCs too)
        raise UserError("%s %s is the file of an unfinished download of %s (cut off, killed or still running): run "
                        "the same download again to finish it; or narrow the glob" % (what, path, name))


def expand_paths(spec, what="input file", pipes=False):
    """Expand a comma-separated list of paths and globs, in order; error if any part matches nothing,
    and for a match that is a directory, a killed write's temporary or (unless ``pipes``: text the
    generator reads once) no regular file: every reader of a list of inputs refuses them here."""
    out = []
    for k, (part, matches) in enumerate(glob_parts(spec)):
        if not matches:
            raise UserError("%s %s does not exist (check the path or glob)%s" % (what, part, comma_hint(spec, k)))
        out.extend((p, p != part) for p in matches)
    if not out:
        raise UserError("no %s given" % what)
    for p, globbed in out:
        if os.path.isdir(p):
            raise UserError("%s %s is a directory: give files or a glob such as %s/*" % (what, p, glob.escape(p)))
        if globbed:
            refuse_temporary(p, what)
        refuse_special_file(p, what, pipes=pipes)
    if not pipes:  # records: a make-dataset run still writing (or killed) has not made all of its set
        for folder in sorted({os.path.dirname(p) or "." for p, _ in out}):
            why = unfinished_make_dataset(folder)
            if why:
                raise UserError("%s: folder %s is %s" % (what, folder, why))
    return [p for p, _ in out]
