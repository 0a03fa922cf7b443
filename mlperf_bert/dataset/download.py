"""``download``: fetch reference files, resuming interrupted transfers, and check their md5.

Bytes go to ``NAME.partial`` beside the target, and ``NAME.partial.source`` records the URL, size
and version (a file's inode and mtime, a server's ETag or Last-Modified) they come from; a rerun from
that URL, size and version continues from the partial file's size (HTTP
``Range`` request, or a seek for ``file://`` URLs), any other (or a partial file with no record)
starts over: joined to another source's remainder, its bytes would make a file of the right size
that no md5 check catches where none is published. When the transfer is complete the file
is checked against the md5 and size that results/ lists for its name (a ``part-`` shard: of its
kind, TFRecord or text, the two sets sharing names) or ``--md5``, and only then renamed to
``NAME``. A file already present that matches is kept.
"""
import contextlib
import http.client
import os
import re
import sys
import urllib.error
import urllib.parse
import urllib.request

from mlperf_bert import flags
from mlperf_bert.dataset.checksums import RESULTS_DIR, expectations, known_tables, own_checksums
from mlperf_bert.errors import UserError
from mlperf_bert.fileio import (DERIVED_NAME_BYTES, PARTIAL_SUFFIX, SOURCE_SUFFIX, file_md5, is_write_error, load_json,
                                new_dirs_removed_on_error, open_input, refuse_long_name, sync_fd, write_error,
                                write_json)
from mlperf_bert.locking import lock_file

CHUNK = 1 << 20


def expected_for(name, path, results_dir=RESULTS_DIR):
    """[(bytes, md5)] that results/ lists for the file at ``path`` named ``name``, one a set (the
    TF1 and TF2 checkpoints share file names; a part- shard is held against the set of its kind:
    the TFRecords have published sizes, the text shards md5s, under the same names)."""
    return [e[1:] for e in expectations(path, known_tables(results_dir), name)]


def _version(headers):
    """A server's validator of the file's bytes: a strong ETag, else Last-Modified (None: neither)."""
    etag = headers.get("ETag") if headers is not None else None
    if etag and not etag.startswith("W/"):  # a weak ETag promises equivalent content, not the same bytes
        return etag
    return headers.get("Last-Modified") if headers is not None else None


def _open_from(url, offset):
    """(stream, total size or None, whether the stream starts at ``offset``, the file's version or None)."""
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme == "file":
        path = urllib.request.url2pathname(parsed.path)
        try:
            f = open_input(path, "rb", fix="give the URL of a regular file")
        except OSError as e:
            raise UserError("cannot read %s: %s" % (url, e.strerror))
        st = os.fstat(f.fileno())
        f.seek(min(offset, st.st_size))
        return f, st.st_size, True, "inode %d mtime_ns %d" % (st.st_ino, st.st_mtime_ns)
    if parsed.scheme not in ("http", "https"):
        raise UserError("unsupported URL %s: use http://, https:// or file://" % url)
    req = urllib.request.Request(url, headers={"Range": "bytes=%d-" % offset} if offset else {})
    try:
        resp = urllib.request.urlopen(req, timeout=60)
    except urllib.error.HTTPError as e:
        if e.code == 416:  # nothing left to fetch
            return None, offset, True, _version(e.headers)
        raise UserError("download of %s failed: HTTP %d %s" % (url, e.code, e.reason))
    except urllib.error.URLError as e:
        raise UserError("cannot reach %s: %s (check the URL and the network)" % (url, e.reason))
    resumed = resp.status == 206
    length = resp.headers.get("Content-Length")
    total = (int(length) + (offset if resumed else 0)) if length else None
    return resp, total, resumed, _version(resp.headers)


def download(url, output, md5=None, size=None, progress=True, results_dir=RESULTS_DIR):
    """Fetch ``url`` to ``output`` (resuming), check md5/size, return the md5."""
    name = os.path.basename(output)
    given = md5 is not None or size is not None
    md5 = md5 and md5.lower()  # file_md5 gives lowercase hex; an uppercase --md5 is the same sum

    def expected(path):  # results/'s values are told by the bytes fetched (a shard's kind)
        return [(size, md5)] if given else expected_for(name, path, results_dir)

    def damaged(path):  # a TFRecord held to its published size alone: its records too, as verify does
        exps = [] if given else expectations(path, known_tables(results_dir), name)
        if not exps or any(e[2] for e in exps) or all(e[0] != "tfrecord" for e in exps):
            return None
        own = own_checksums(path) or (False, "not a TFRecord file")
        return None if own[0] else own[1]
    if os.path.isdir(output):
        raise UserError("--output=%s is a directory: give a file path, or use --output_dir" % output)
    if os.path.exists(output):
        have, size_now = file_md5(output), os.path.getsize(output)
        mismatch = _mismatch(size_now, have, expected(output))
        bad = None if mismatch else damaged(output)
        if not mismatch and not bad:
            return have
        mismatch = mismatch or "a TFRecord file whose records pass their CRCs (%s)" % bad
        raise UserError("%s exists with %d bytes md5 %s, expected %s: delete it and run again"
                        % (output, size_now, have, mismatch))
    # its longest derived name, the record of a transfer not finished (a name past it named that record)
    refuse_long_name(output, "--output", len(PARTIAL_SUFFIX + SOURCE_SUFFIX) + DERIVED_NAME_BYTES,
                     "NAME%s%s.tmp-PID, the record of a download not finished" % (PARTIAL_SUFFIX, SOURCE_SUFFIX))
    # A URL refused, a source that cannot be read, or bytes that are not the file: the folders made
    # go again (a transfer cut short keeps its bytes there, for the rerun to resume from).
    with new_dirs_removed_on_error(os.path.dirname(os.path.abspath(output))):
        os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
        with lock_file(output, "--output"):
            return _fetch(url, output, name, expected, progress, damaged)


def _mismatch(got_size, got_md5, wanted):
    """What was expected ("514241279 bytes", "md5 ...", "... or ..."), when the file is none of
    ``wanted`` [(bytes, md5)], else None (also when nothing is expected)."""
    if not wanted or any((size is None or got_size == size) and (md5 is None or got_md5 == md5)
                         for size, md5 in wanted):
        return None
    return " or ".join(" ".join(w for w in ("" if size is None else "%d bytes" % size,
                                            "" if md5 is None else "md5 %s" % md5) if w) for size, md5 in wanted)


def _source_change(partial, url, total, version):
    """Why ``partial`` cannot be resumed from ``url`` (of ``total`` bytes and ``version``, None if
    unknown), or None."""
    try:
        with open(partial + SOURCE_SUFFIX, encoding="utf-8") as f:
            source = load_json(f)
        was_url, was_size, was_version = source["url"], source["bytes"], source.get("version")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return "has no readable record of the URL it came from (%s)" % (partial + SOURCE_SUFFIX)
    if was_url != url:
        return "came from %s, not %s" % (was_url, url)
    if None not in (total, was_size) and total != was_size:
        return "came from a %d-byte file, but %s is now %d bytes" % (was_size, url, total)
    # the same size is no proof of the same bytes: a file rewritten since (a mirror regenerating
    # its shards) was joined to the partial file's bytes, a file no check caught where no md5 is published
    if None not in (version, was_version) and version != was_version:
        return "came from %s as it was then (%s), but it has changed since (%s)" % (url, was_version, version)
    return None


def _fetch(url, output, name, expected, progress, damaged):
    from mlperf_bert.progress import bar as progress_bar
    partial = output + PARTIAL_SUFFIX
    offset = os.path.getsize(partial) if os.path.exists(partial) else 0
    stream, total, resumed, version = _open_from(url, offset)
    why = _source_change(partial, url, total, version) if offset and resumed else None
    if why:
        print("warning: %s %s: starting over" % (partial, why), file=sys.stderr)
        if stream is not None:
            stream.close()
        stream, total, resumed, version = _open_from(url, 0)
    if why or not resumed:  # (or the server ignored the Range request)
        offset = 0
    if not offset:  # the record names the bytes to come: no other source's are left under it
        _remove_partial(partial)
        write_json(partial + SOURCE_SUFFIX, {"url": url, "bytes": total, "version": version})
    cut = None  # why the source broke off mid-transfer
    if stream is not None:
        try:
            with stream, open(partial, "ab" if offset else "wb") as out, \
                    progress_bar(total=total, initial=offset, unit="B", unit_scale=True, desc=name,
                         disable=not progress) as bar:
                while True:
                    try:
                        buf = stream.read(CHUNK)
                    except (OSError, http.client.HTTPException) as e:
                        # a reset, a timeout, a chunked reply cut short: the bytes written so far
                        # are the source's first bytes, kept for the rerun to resume from; a reply
                        # cut short names those its read got before the cut (up to a CHUNK)
                        cut = e
                        buf = e.partial if isinstance(e, http.client.IncompleteRead) else b""
                        out.write(buf)
                        bar.update(len(buf))
                        break
                    if not buf:
                        break
                    out.write(buf)
                    bar.update(len(buf))
                out.flush()
                sync_fd(out.fileno())
        except OSError as e:
            if not is_write_error(e):
                raise
            raise write_error(output, e, needed=None if total is None else total - offset,
                              left="the bytes fetched so far are kept in %s" % partial) from e
    got_size = os.path.getsize(partial)
    if cut is not None or (total is not None and got_size < total):
        raise UserError("download of %s stopped at %d of %s bytes%s: run the same command again to resume"
                        % (url, got_size, "?" if total is None else total, _why_cut(cut)))
    got = file_md5(partial)
    wanted = _mismatch(got_size, got, expected(partial))
    bad = None if wanted else damaged(partial)
    if bad:  # the published size alone passed a file of zeros (a preallocated copy cut off)
        _remove_partial(partial)
        raise UserError("%s: got %d bytes, the published size, but not the TFRecord file: %s; the partial file was "
                        "removed, check the URL and run again" % (output, got_size, bad))
    if wanted:
        _remove_partial(partial)
        raise UserError("%s: got %d bytes md5 %s, expected %s; the partial file was removed, "
                        "check the URL and run again" % (output, got_size, got, wanted))
    # the record first: a kill between leaves the partial file without one, which a rerun fetches
    # again; a record left beside the finished file stayed for ever (the rerun found nothing to do),
    # and a trainer given part-* refused the folder for it
    with contextlib.suppress(FileNotFoundError):
        os.remove(partial + SOURCE_SUFFIX)
    os.replace(partial, output)
    return got


def _why_cut(e):
    if e is None:
        return ""
    if isinstance(e, http.client.IncompleteRead):
        return " (the server closed the connection early)"
    return " (%s)" % (getattr(e, "strerror", None) or str(e) or type(e).__name__)


def _remove_partial(partial):
    for path in (partial, partial + SOURCE_SUFFIX):
        if os.path.exists(path):
            os.remove(path)


def main(argv):
    fv = flags.FlagValues()
    flags.DEFINE_string("url", None, "URL of the file (http, https or file)", flag_values=fv)
    flags.DEFINE_string("output", None, "where to store it (default: the URL's file name in --output_dir)",
                        flag_values=fv)
    flags.DEFINE_string("output_dir", ".", "directory for --output's default", flag_values=fv)
    flags.DEFINE_string("md5", None, "expected md5 (default: the one results/ lists for the name)",
                        flag_values=fv)
    flags.DEFINE_bool("progress", True, "show a progress bar", flag_values=fv)
    flags.parse(fv, argv, required=["url"], positional=False)
    if fv.md5 is not None and not re.fullmatch(r"[0-9a-fA-F]{32}", fv.md5):
        # Checked before fetching: a sha256 or a typo could only fail after the whole download.
        raise UserError("--md5=%s is %s: give the file's md5 (32 hex digits), or leave --md5 out to check the md5 "
                        "results/ lists for its name"
                        % (fv.md5, "a sha256" if re.fullmatch(r"[0-9a-fA-F]{64}", fv.md5) else "not an md5"))
    # "--output=$DEST" with the variable unset fell back to the current directory, silently
    flags.refuse_given_empty(fv, {"output": "the file's path", "output_dir": "the directory for the URL's file name"})
    output = fv.output or os.path.join(fv.output_dir, os.path.basename(urllib.parse.urlparse(fv.url).path))
    if fv.output and not os.path.basename(output):  # (the error below blamed the URL)
        raise UserError("--output=%s names a directory: give a file path, or --output_dir=%s for the URL's file name"
                        % (fv.output, fv.output))
    if not os.path.basename(output):
        raise UserError("cannot tell a file name from --url=%s: give --output" % fv.url)
    md5 = download(fv.url, output, md5=fv.md5, progress=fv.progress)
    wanted = [(None, fv.md5)] if fv.md5 else expected_for(os.path.basename(output), output)
    print("OK %s md5 %s%s" % (output, md5, "" if any(m for _, m in wanted) else
                              " (its published size; no published md5 to compare)" if wanted else
                              " (no published md5 to compare)"))
    return 0
