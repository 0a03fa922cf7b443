"""A stop while an entry point starts (``quiet_start``): one line and an exit status, or the
signal's default action, until ``cli.run_main`` sets up its own handling (the trainer's start has it
again inside run_main, ``starting``, while it reads its flags and imports torch). Stdlib only (errors.py
is too), so that the entry points call it before they import absl (~80 ms), torch (seconds) or
the rest of mlperf_bert. Python's own start (site and the .pth files, tens of ms before any of our
code runs) cannot be covered from here: a stop there is still Python's traceback or silent 143."""
import contextlib
import glob
import io
import os
import re
import signal
import sys

from mlperf_bert.errors import first_signal

# Set by the torchrun wrapper where the ranks' stdout and stderr share its one pipe (beside
# PYTHONUNBUFFERED on a terminal, for a script of another's): outlive_readers makes this process's
# stdout and stderr line-buffered, one write a line, in the order written. Unbuffered, a print is two
# writes (its text, then the newline): the same error line of several ranks at once ran together in
# the pipe ("error: ...error: ..."), where the wrapper shows it once.
LINES_ENV = "MLPERF_BERT_LINE_BUFFERED"
_QUIET_START = []  # quiet_start() changed SIGINT's handler: cli.run_main puts a KeyboardInterrupt's back
INTERRUPTED = "error: interrupted"
TERMINATED = "error: terminated (SIGTERM); finished outputs are kept, rerun the same command to go on"
# A stop (SIGTERM, SIGINT) after which no checkpoint holds the run: a fresh run stopped before
# run_start, ranks that never started or failed to checkpoint. 143 (130) says "stopped, a checkpoint
# holds it, resume": a script that resubmits on it must not loop on a run that saves nothing.
NOT_SAVED_STATUS = 79  # unused by sysexits (64-78), bash (126-128+) and Python (1, 2)
CKPT_RE = re.compile(r"^model\.ckpt-(\d+)\.pt\Z")  # a complete training checkpoint's name (temp files never match)


def holds_checkpoint(output_dir):
    """Whether ``output_dir`` holds a training checkpoint (a run a rerun resumes)."""
    try:
        return any(CKPT_RE.match(n) for n in os.listdir(output_dir))
    except OSError:  # none yet, or unreadable: the run's own checks say so
        return False


def node_rank(environ=os.environ):
    """This rank's node in a run of several nodes: its GROUP_RANK (torchrun's); 0 in a run of one process
    (no WORLD_SIZE above 1: rank 0 is this process, whatever NODE_RANK a job's environment holds); else a
    launcher's NODE_RANK; 0 where none is a number."""
    group = environ.get("GROUP_RANK", "").strip()
    if group.isdigit():
        return int(group)
    world = environ.get("WORLD_SIZE", "").strip()
    value = environ.get("NODE_RANK", "").strip()
    return int(value) if world.isdigit() and int(world) > 1 and value.isdigit() else 0


# A node other than 0 whose own --output_dir (a disk of its own) holds no checkpoint cannot tell what node 0's holds
NONE_ON_THIS_NODE = "this node's --output_dir holds no checkpoint (rank 0 on node 0 writes them)"


def what_is_saved(output_dir, node=0):
    """What a run that failed or was killed leaves, for the end of its line: the checkpoints kept where
    ``output_dir`` holds one; nothing where it holds none on node 0 (or one node); a node other than 0
    cannot tell from its own folder (rank 0 alone writes them: a disk of its own holds none), nor can
    anyone where the folder is unknown (None)."""
    if output_dir and holds_checkpoint(output_dir):
        return "the checkpoints written so far are kept; rerun the same command to resume from the newest"
    if output_dir and not node:
        return "no checkpoint was written, nothing saved; rerun the same command to start again"
    if output_dir:
        return ("%s: rerun the same command on every node, which resumes from node 0's newest checkpoint if there is "
                "one, else starts again" % NONE_ON_THIS_NODE)
    return "rerun the same command: it resumes from the newest checkpoint if there is one, else starts again"


def command_start_stop(name):
    """What a stop while a command's modules load does (``quiet_start``'s argument): ``run_main``'s
    line and status, where Ctrl-C was a KeyboardInterrupt traceback out of an import (torch's take
    seconds) and SIGTERM a silent 143. Nothing was written yet."""
    return ("%s\n" % INTERRUPTED, 130) if name == "SIGINT" else ("%s\n" % TERMINATED, 143)


def not_saved_line(name, when):
    return ("%s %s: no checkpoint written (exit %d, not 143); rerun the same command: it resumes from the "
            "newest checkpoint if there is one, else starts again\n" % (name, when, NOT_SAVED_STATUS))


def stopped_at_start(name, when, output_dir, node=0):
    """(line, status) of a stop signal ``name`` that came ``when``, before a start had set up its stop
    (nothing of it trained or saved): NOT_SAVED_STATUS with ``not_saved_line``; where ``output_dir``
    holds a checkpoint (a resumed run), 128 + the signal, as a resumed run's untimed init: 143 says a
    checkpoint holds the run, and a script that resubmits on it stopped resubmitting a resumed run
    stopped there. The trainer run alone and the torchrun wrapper say it. On node ``node`` other than 0
    a folder without one (a disk of its own: rank 0 alone writes them) cannot tell: still
    NOT_SAVED_STATUS, with a line that says node 0's status tells (the Slurm job takes node 0's)."""
    if output_dir and holds_checkpoint(output_dir):
        return ("%s %s: stopped at once, nothing trained; rerun the same command to resume\n" % (name, when),
                128 + signal.Signals[name])
    if output_dir and node:
        return ("%s %s: stopped at once, nothing trained; %s: node 0's status says whether one holds the run (exit %d "
                "here); rerun the same command on every node\n" % (name, when, NONE_ON_THIS_NODE, NOT_SAVED_STATUS),
                NOT_SAVED_STATUS)
    return not_saved_line(name, when), NOT_SAVED_STATUS


DEMO_OUT = "demo_out"  # the demo's --output_dir unless given


def demo_holds_checkpoint(out):
    """Whether a checkpoint of the demo in ``out`` holds its training (train/, a --runs series'
    train/run_N): the rerun remakes its data, so nothing else does."""
    train = os.path.join(out, "train")
    return any(holds_checkpoint(d) for d in [train] + glob.glob(os.path.join(glob.escape(train), "run_*")))


def demo_start_stop(name, argv=None):
    """What a stop as the demo starts, or between its steps, does: ``command_start_stop``'s where a
    checkpoint holds it, else 79 and ``not_saved_line`` (143 says one holds the run: a script
    resubmitting on it)."""
    out = argv_output_dir(sys.argv[2:] if argv is None else argv) or DEMO_OUT
    if demo_holds_checkpoint(out):
        return command_start_stop(name)
    return not_saved_line(name, "while the demo started"), NOT_SAVED_STATUS


_FLAG = re.compile(r"--?(output_dir|config|flagfile)(?:=(.*))?\Z", re.S)


def _given(argv, depth=0):
    """(name, value) of each --output_dir and --config the trainer's arguments ``argv`` give, in order,
    as absl reads them: ``--name=V``, ``--name V``, one dash too, a --flagfile's lines in its place
    (``~`` expanded; a regular file's: a pipe is absl's to read, once), up to ``--``."""
    args = iter(argv)
    for arg in args:
        if arg == "--":
            return
        m = _FLAG.match(arg)
        if not m:
            continue
        value = m.group(2) if m.group(2) is not None else next(args, None)
        if value is None:
            return
        if m.group(1) != "flagfile":
            yield m.group(1), value
        elif depth < 10 and os.path.isfile(os.path.expanduser(value)):
            with open(os.path.expanduser(value), encoding="utf-8") as f:
                lines = [line.strip() for line in f]
            yield from _given([line for line in lines if line and not line.startswith(("#", "//"))], depth + 1)


def argv_output_dir(argv):
    """The --output_dir of the trainer's arguments ``argv`` (a torchrun command line's too: torchrun
    has no option of these names), read without absl, for a stop before the trainer has read its
    flags: the last given (a --flagfile's included), else its --config file's; None where neither
    gives it, one given is empty or no string, or a file cannot be read (the flags' reading says why).
    Relative to the working directory, as the trainer's."""
    try:
        given = dict(_given(argv))
        path = given.get("config")
        value = given.get("output_dir")
        # (given, even empty, it beats the file's: the trainer refuses `--output_dir=`; a pipe is the flags' to read)
        if "output_dir" not in given and path and os.path.isfile(path):
            with open(path, "rb") as f:
                tree = config_tree(f.read(), path)
            for key, item in tree.items():  # flat, or in RunConfig's sections: the last given, as read_config_file
                item = item.get("output_dir") if key == "checkpoint" and isinstance(item, dict) else \
                    item if key == "output_dir" else None
                value = value if item is None else item
        # (a file's number or list is the flags' to refuse: os.listdir took an int as a descriptor, a list raised)
        return value if isinstance(value, str) and value else None
    except Exception:  # in a signal's handler: an unreadable file is an unknown folder (a fresh run's 79)
        return None


def config_tree(data, path):
    """The table a --config file's bytes ``data`` hold: JSON where ``path`` ends in .json, else TOML
    (run_config.read_config_file's reading, which checks it; here, stdlib only, for argv_output_dir).
    ValueError or UnicodeDecodeError where it is neither."""
    if path.endswith(".json"):
        import json  # (here: the entry points' start imports only what its handler needs)
        return json.loads(data.decode("utf-8"))
    import tomllib
    return tomllib.loads(data.decode("utf-8"))


def stopped_while_starting(name, output_dir=None):
    """run_pretraining.py's (line, status) for a stop that came while it started: its modules, its
    flags, torch's import (seconds; ``quiet_start``, then ``starting``): ``stopped_at_start``'s, with
    the line a launcher gives for ranks stopped then, for ``output_dir`` (the flags', once read), else
    the one its command line gives (``argv_output_dir``)."""
    if output_dir is None:
        output_dir = argv_output_dir(sys.argv[1:])
    return stopped_at_start(name, "while the trainer started, before it had set up its stop", output_dir)


def trainer_start_stop(environ=os.environ, where=None):
    """What a stop during the trainer's start does (``quiet_start``'s argument): run alone, the line
    and status of ``stopped_while_starting`` for ``where["output_dir"]`` (set once the flags are read);
    a rank of torchrun (which sets TORCHELASTIC_RUN_ID) ends by the signal (None), and torchrun says it
    once for every rank."""
    if "TORCHELASTIC_RUN_ID" in environ:
        return None
    return lambda name: stopped_while_starting(name, (where or {}).get("output_dir"))


def drop_output(fd):
    """/dev/null on output file descriptor ``fd`` (its reader has gone)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    if devnull == fd:  # ``fd`` was closed: the open took it
        return
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


class _ReaderlessOutput(io.FileIO):
    """An output file descriptor whose writes go on when its reader has gone: the first write that
    meets a broken pipe puts /dev/null on the descriptor (this process's; what it starts from then
    on inherits it) and counts as written."""

    def write(self, b):
        try:
            return super().write(b)
        except BrokenPipeError:
            drop_output(self.fileno())
            return memoryview(b).nbytes


def outlive_readers():
    """stdout and stderr that outlive their reader, for the processes of a run (the trainer, the
    torchrun wrapper, torchrun's agent, the demo). ``start_training.sh ... 2>&1 | tee run.log`` and Ctrl-C: the
    terminal's SIGINT ends tee as it reaches the run, and each write after it meets a broken pipe.
    A BrokenPipeError out of the stop's line ended the trainer 141 after its checkpoint; out of a
    progress bar's redraw before it, with no checkpoint of the stop; out of the wrapper's, at once,
    its torchrun and ranks left running. From here what cannot be written is dropped (/dev/null)
    and the process goes on to its own end and status: the MLPerf log and the checkpoints are
    files. The streams are remade with their settings (``-u``'s unbuffered ones too; line-buffered
    where LINES_ENV is set) over such a descriptor; the entry points call this before their imports,
    so that a logging handler made there holds the new stream."""
    lines = os.environ.get(LINES_ENV) == "1"
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if not isinstance(stream, io.TextIOWrapper) or isinstance(getattr(stream.buffer, "raw", stream.buffer),
                                                                  _ReaderlessOutput):
            continue  # none, a test's capture, or made here already
        try:
            fd = stream.fileno()
        except (ValueError, OSError):  # closed, or not a file
            continue
        try:
            stream.flush()
        except BrokenPipeError:  # gone already: what it holds goes to /dev/null
            drop_output(fd)
            stream.flush()
        raw = _ReaderlessOutput(fd, "w", closefd=False)
        raw.name = "<%s>" % name
        unbuffered = isinstance(stream.buffer, io.RawIOBase) and not lines  # -u
        buffered = raw if unbuffered else io.BufferedWriter(raw)
        setattr(sys, name, io.TextIOWrapper(buffered, encoding=stream.encoding, errors=stream.errors,
                                            line_buffering=stream.line_buffering or lines,
                                            write_through=stream.write_through and not lines))


def _stop_handler(on_stop):
    """A handler that prints ``on_stop``'s line for the signal and exits with its status."""
    def stop(signum, frame):
        line, status = on_stop(signal.Signals(first_signal(signum, frame, stop)).name)
        try:
            sys.stderr.write(line)
            sys.stderr.flush()
        except OSError:  # its reader gone (Ctrl-C on `... | tee log` ends tee too): the status says it
            pass
        os._exit(status)
    return stop


@contextlib.contextmanager
def starting(on_stop):
    """Inside ``run_main``: the start's handling of a stop (``quiet_start``'s: ``on_stop``'s line and
    status, or, given None, the signal's default action) while the block runs (the trainer reading its
    flags, then importing torch: seconds), ``run_main``'s again after it. A signal SIG_IGN'd (a
    background job's SIGINT) stays ignored. One handler serves both signals and the block's end is one
    step: restored one by one, a SIGTERM raised by run_main's handler as the first came back left
    SIGINT on the start's, and the SIGINT after it ended the stop 79, not 143."""
    start = _stop_handler(on_stop) if on_stop is not None else None
    saved, starting_now = {}, [True]

    def on_signal(signum, frame):
        signum = first_signal(signum, frame, on_signal)  # (a SIGTERM run inside a SIGINT's call: the SIGINT)
        handler = start if starting_now else saved[signum]
        if callable(handler):
            handler(signum, frame)
        else:  # the default action (SIG_IGN is not saved: never handled here)
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
    with contextlib.suppress(ValueError):  # not the main thread: nothing to change
        for sig in (signal.SIGTERM, signal.SIGINT):
            if signal.getsignal(sig) is not signal.SIG_IGN:
                saved[sig] = signal.signal(sig, on_signal)
    try:
        yield
    finally:
        del starting_now[:]
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def writable_outputs():
    """/dev/null on stdout or stderr where it is closed or read-only, and a stream over it. Started
    with `2>&-`, the first file opened took descriptor 2 (the trainer's lock file), and whatever wrote
    to stderr wrote into it; a launcher so started gave the trainer its own script there, read-only
    (bash), and the first line a command wrote to it (a progress bar) ended it, exit 1, silently,
    nothing done. A read-only stdout (`1<FILE` for `1>FILE`) is said in one line on a writable stderr;
    a closed one (`>&-`) asked for no output, and a stderr that cannot be written has nowhere to be said."""
    import fcntl
    read_only = None  # stdout's path where it is open read-only
    for fd, name in ((1, "stdout"), (2, "stderr")):
        try:
            writable = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE != os.O_RDONLY
        except OSError:  # closed
            writable = None
        if not writable:
            if writable is False and fd == 1:
                read_only = _fd_path(fd)
            drop_output(fd)
            setattr(sys, name, open(fd, "w", buffering=1, errors="backslashreplace", closefd=False))
    if read_only:  # (on a stderr that cannot be written: into /dev/null, put there above)
        with contextlib.suppress(OSError, ValueError):  # (its reader gone)
            sys.stderr.write("warning: stdout is open read-only (%s): what this command prints goes to /dev/null; "
                             "open it for writing (>FILE) to keep it\n" % read_only)
            sys.stderr.flush()


def _fd_path(fd):
    """What descriptor ``fd`` of this process names (/proc), or its number where that is not known."""
    try:
        return os.readlink("/proc/self/fd/%d" % fd)
    except OSError:
        return "descriptor %d" % fd


def quiet_start(on_stop=None):
    """Until ``run_main``: Ctrl-C ends the process as the signal's default action does, not with a
    KeyboardInterrupt traceback out of whichever import it came in (torch's take seconds, and a
    launcher's SIGINT reaches every rank there). Given ``on_stop`` (the signal's name -> (line, exit
    status)), SIGTERM and SIGINT there print that line and exit with that status instead. Called
    first by the entry points, before they import anything else of ours; first, it makes their
    outputs writable (``writable_outputs``)."""
    writable_outputs()
    if on_stop is not None:
        stop = _stop_handler(on_stop)
        signal.signal(signal.SIGTERM, stop)
        if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:  # (a background job's stays ignored)
            signal.signal(signal.SIGINT, stop)
            _QUIET_START.append(True)
    elif signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        _QUIET_START.append(True)
