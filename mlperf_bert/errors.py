"""The exception types every module raises (UserError, Terminated) and the process-signal helpers of
pool workers and children. Imports nothing of mlperf_bert, so that every module can import it;
``run_main``, the wrapper of the command-line entry points that turns these into one line and an
exit status, is mlperf_bert/cli.py, above fileio and flags."""
import contextlib
import errno
import functools
import os
import re
import signal
import sys
import threading


class UserError(Exception):
    """A problem with the user's input: printed as one line (error_line), exit status 2."""


def error_line(text):
    """``error: TEXT`` as one line: a value's line break (SEED=$'5\\n6', --org=$'a\\nb', a path) written
    ``\\n`` (``\\r``), not a second line of the error."""
    return "error: " + str(text).replace("\r", "\\r").replace("\n", "\\n")


def escaped(line):
    """``line`` with its control and line-separator characters escaped: a file name holding "\\nOK x"
    printed a verdict line of its own (verify's, check-log's: a script counting OK lines counted it)."""
    return re.sub("[\x00-\x1f\x7f-\x9f\u2028\u2029]", lambda m: "\\x%02x" % ord(m.group()) if ord(m.group()) < 256
                  else "\\u%04x" % ord(m.group()), line)


class FixableError(UserError):
    """A UserError in two parts: ``reason``, what is wrong (naming the file), and ``fix``, what to do;
    its line is "REASON: FIX". A caller that words the way on its own (a resume that names the
    checkpoint before; a run's folder) takes ``reason`` alone."""

    def __init__(self, reason, fix):
        super().__init__(reason, fix)  # (the arguments pickled: raised in a pool's worker, it comes back whole)
        self.reason, self.fix = reason, fix

    def __str__(self):
        return "%s: %s" % (self.reason, self.fix)


class Terminated(BaseException):
    """SIGTERM, raised in the main thread so ``finally`` blocks (and the atomic writer's
    removal of its temporary) run before the process exits. Not an Exception: nothing
    that catches errors swallows it. ``line``: what to print instead of the generic line
    ("": nothing); ``status``: the exit status (143; 130 for SIGINT)."""

    def __init__(self, line=None, status=143):
        super().__init__(line)
        self.line, self.status = line, status


_received = []  # the stop signals raised by their handlers, or not raised while a stop was handled (stop_lost)
_held = []  # the stop signals whose raise waits for a fork's end (raise_held)

# ``forking`` is True in the thread that forks, from the first of the fork's hooks to the last
# (os.register_at_fork: ours, registered after the libraries', run first before it and last after it),
# and only there: a thread-local's attribute set by setattr, C code, so no handler runs inside our
# hooks, and another thread's fork (a pool replacing a worker) holds nothing of the main thread's,
# where the handlers run. A handler that raised inside another library's hook (logging's lock release)
# had its raise dropped ("Exception ignored in ...") and left that library's lock held; a stop
# signal's handler runs there when another thread took the signal.
_FORKING = threading.local()
_fork_hooks_registered = []


def hold_raises_while_forking():
    """From now on, ``forking()`` is true while this thread runs this process's fork hooks."""
    if not _fork_hooks_registered and hasattr(os, "register_at_fork"):
        on, off = (functools.partial(setattr, _FORKING, "forking", value) for value in (True, False))
        os.register_at_fork(before=on, after_in_parent=off, after_in_child=off)
        _fork_hooks_registered.append(True)


def forking():
    """Whether this thread is inside its fork's hooks, where a raise would be dropped."""
    return getattr(_FORKING, "forking", False)


def raise_held():
    """Raise the stop a signal asked for inside a fork's hooks (Terminated, or KeyboardInterrupt for
    SIGINT), if any: called where the process has forked (a pool started)."""
    if _held:
        signum = _held[0]
        del _held[:]
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        _received.append(signum)
        raise Terminated()


@contextlib.contextmanager
def stops_held_over_fork(signals):
    """Around a fork from this thread (a pool's start, ``os.fork``): ``signals`` blocked here, and a
    stop that another thread takes while this one runs the fork's hooks held (the block does not
    cover it). On leaving, the mask is restored; then, if the block ended without an error, the
    held stop is raised. Yields the mask a forked child restores once its own handlers are set."""
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    hold_raises_while_forking()
    try:
        yield blocked
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    raise_held()


@contextlib.contextmanager
def stops_held():
    """SIGINT and SIGTERM wait for the end of the block, then act as they would have there: the
    first of them, with the handler of then. Only a signal with a Python handler is held; one
    ignored or left to its default action is left as it is, and outside the main thread (where no
    handler can be set) nothing is held. A handler set inside the block stays."""
    held, saved = [], {}

    def hold(signum, frame):
        held.append(first_signal(signum, frame, hold))
    with contextlib.suppress(ValueError):  # not the main thread
        for sig in (signal.SIGINT, signal.SIGTERM):
            if callable(signal.getsignal(sig)):
                saved[sig] = signal.signal(sig, hold)  # (a stop already pending acts here, unheld)
    try:
        yield
    finally:
        for sig, handler in saved.items():
            if signal.getsignal(sig) is hold:
                signal.signal(sig, handler)
        if held:
            signal.raise_signal(held[0])  # its handler's own act: KeyboardInterrupt, Terminated, ...


def stop_of(exc):
    """The stop (Terminated, a Ctrl-C's KeyboardInterrupt) ``exc`` is, or was raised while handling
    (its ``__context__``s), or None: a progress bar's last redraw under ``... | tee log`` met the pipe
    the same Ctrl-C broke, a BrokenPipeError over the stop."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, (Terminated, KeyboardInterrupt)):
            return exc
        seen.add(id(exc))
        exc = exc.__context__
    return None


def _stopping():
    """Whether a stop is being handled here (``stop_of``): its except and finally blocks, the
    __exit__s it runs through, run_main's one line."""
    return stop_of(sys.exc_info()[1]) is not None


def _raise_terminated(signum, frame):
    # A repeat while a stop is being handled (a scheduler may SIGTERM every process again, a storm; a
    # wrapper passes a SIGTERM on after a terminal's Ctrl-C reached the whole group) must not cut that
    # way out with a second one: a traceback "during handling of the above exception", a clean-up
    # (a pool's end, a lock's release) cut half-way. Recorded still (stop_lost): where the stop
    # being handled is swallowed and the command goes on to its end, that end is this one's, 143.
    if _deferred(signum):
        return
    _received.append(signum)
    raise Terminated()


def _deferred(signum):
    """Whether stop signal ``signum`` waits instead of raising now: recorded while a stop is handled
    (``_record_during_stop``), held while a fork is under way (``forking``)."""
    if _stopping():
        _record_during_stop(signum)
        return True
    if forking():
        _held.append(signum)
        return True
    return False


def _record_during_stop(signum):
    """A stop signal that came while a stop was handled: recorded after that stop (the first decides,
    should the command swallow it and go on to its end: a Ctrl-C, then a wrapper's SIGTERM, is 130)."""
    if not _received:
        stop = stop_of(sys.exc_info()[1])
        first = signal.SIGINT if isinstance(stop, KeyboardInterrupt) or getattr(stop, "status", 143) == 130 \
            else signal.SIGTERM
        _received.append(first)
    _received.append(signum)


def raise_interrupt(signum, frame):
    """SIGINT's handler: KeyboardInterrupt, as Python's own, but not while a stop is being handled
    (recorded then, as _raise_terminated's)."""
    if _deferred(signum):
        return
    raise KeyboardInterrupt


def stop_lost():
    """The first stop signal (its number; None if none) of those recorded: a SIGTERM whose Terminated
    was raised where Python drops exceptions (a finalizer, a generator closed by the garbage collector:
    "Exception ignored in ..."), or a signal that came while a stop was handled (after that stop), so
    that the command may have gone on to its end; ``run_main`` then still ends as that stop (143, 130).
    A Ctrl-C alone that the command caught is its own to handle, as in Python (not recorded). Reset by
    the call."""
    lost = (_received or _held or [None])[0]
    del _received[:], _held[:]
    return lost


def quiet_dropped_stops():
    """From now on a stop (Terminated, KeyboardInterrupt) that its handler raised where Python drops
    exceptions (a finalizer, an import lock's weakref callback: sys.unraisablehook) prints nothing:
    it was "Exception ignored in ..." and a traceback beside the stop's one line. The stop is not
    lost: a SIGTERM's is recorded (stop_lost), a Ctrl-C's is recorded here, and the trainer's raises
    it again at its next point (training._Stop). Anything else goes to the hook there was."""
    hook = sys.unraisablehook
    if getattr(hook, "drops_stops", False):
        return

    def drop_stops(unraisable):
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            _received.append(signal.SIGINT)
        elif not isinstance(unraisable.exc_value, Terminated):
            hook(unraisable)
    drop_stops.drops_stops = True
    sys.unraisablehook = drop_stops


def install_sigterm_handler():
    """Make SIGTERM raise Terminated in this process (and in children it forks, such as pool
    workers: their temporaries are removed too when the pool terminates them)."""
    try:
        signal.signal(signal.SIGTERM, _raise_terminated)
    except ValueError:  # not the main thread
        pass


def first_signal(signum, frame, handler):
    """The stop signal a ``handler(signum, frame)`` acts on: ``signum``, or, when this call runs
    inside a call of the same handler (``frame`` or one it was called from) for another signal, the
    first of them. CPython runs the handler of a signal that arrives just as an earlier signal's
    handler is entered inside that call, before its first line; so without this, under load, the
    later signal decided (start_training.sh sends SIGINT, then SIGTERM, and a Ctrl-C was named SIGTERM).
    The handler's first argument must be called ``signum``."""
    code = getattr(handler, "__func__", handler).__code__
    while frame is not None:
        if frame.f_code is code:
            signum = frame.f_locals.get("signum", signum)
        frame = frame.f_back
    return signum


def _exit_quietly(signum, frame):
    # terminate_pool repeats the SIGTERM: a repeat must not cut the unwinding (the atomic
    # writer's removal of its temporary) this one starts
    signal.signal(signal.SIGTERM, _ignore)
    sys.exit(143)


def _ignore(signum, frame):
    pass


def _exit_now(signum, frame):
    os._exit(143)


def init_worker(parent_pid):
    """Pool initializer: SIGTERM ends the worker quietly after its atomic writer removed its
    temporary, and the death of the parent (even by SIGKILL) sends it SIGTERM (Linux), so no
    worker goes on writing into an output directory after its command ended."""
    from multiprocessing import util
    signal.signal(signal.SIGTERM, _exit_quietly)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the parent, which ends the pool
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})  # blocked by worker_pool until now
    # Once its task loop has ended (the first thing its exit runs), a SIGTERM (pool.terminate()
    # after an error can reach a worker already leaving) ends it at once: raised in an atexit
    # callback of a spawned worker, SystemExit was printed as "Exception ignored in atexit callback".
    util.Finalize(None, signal.signal, (signal.SIGTERM, _exit_now), exitpriority=1000)
    # PR_SET_PDEATHSIG also fires when only the thread that forked the worker ends (prctl(2)): the pool
    # starts a worker in the place of one that died from its worker-handler thread, which ends as the
    # pool closes. As SIGTERM, that worker ended in its wait for a task, holding the task queue's lock,
    # and the pool's finalizer waited on the lock for ever. SIGUSR1 and a look at the parent instead
    # (the kernel sends it again when the parent process itself ends).
    signal.signal(signal.SIGUSR1, functools.partial(_parent_death_signal, parent_pid))
    die_with_parent(parent_pid, signal.SIGUSR1, 143)


def _parent_death_signal(parent_pid, signum, frame):
    if os.getppid() != parent_pid:  # the parent process is gone, not only the thread that forked this one
        _exit_quietly(signum, frame)


def die_with_parent(parent_pid, sig, status):
    """In a child (a pool initializer, a ``preexec_fn``): the death of ``parent_pid``, even by
    SIGKILL, sends this process ``sig`` (Linux; so does the end of the thread that forked it, see
    init_worker); if the parent is already gone, exit ``status``."""
    if sys.platform.startswith("linux"):
        import ctypes
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, sig)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(status)


@contextlib.contextmanager
def worker_pool(workers, start_method=None):
    """A multiprocessing pool of ``init_worker`` workers. On success it is closed and joined:
    ``Pool.__exit__`` terminates instead, and a worker killed while it holds the task queue's
    lock leaves any worker that then waits on that lock (one the pool just started) hanging the
    join for ever. On an error or a signal, in the block or in that join, the workers are
    terminated."""
    import multiprocessing
    # Ctrl-C reaches the whole process group: a worker still starting (spawn: seconds of imports)
    # printed a KeyboardInterrupt traceback. SIGINT stays blocked in the workers until init_worker
    # ignores it (the mask is inherited through fork and exec, and by the pool's threads, which
    # start the workers that replace others); the parent's own comes once they are started. The
    # resource tracker of spawned workers starts first: its start unblocks SIGINT when it is done.
    # A forked worker also has this process's SIGTERM handler until init_worker sets its own: a SIGTERM
    # there raised this process's Terminated in the worker's start ("Exception ignored"). Blocked too,
    # it comes under init_worker's. (A spawned worker's is the default action until then, which
    # call_in_worker relies on: so its SIGTERM is not blocked; this process's own is held instead.
    # A spawned worker is started by a fork and exec, then told what to run through a pipe; a stop
    # between the two cut the pool's constructor: the worker, never the pool's (never terminated),
    # read the pipe's end after the one line, "EOFError: Ran out of input", and the semaphores were
    # left to the resource tracker's warning. Held, the stop ends the whole pool as later stops do.)
    context = multiprocessing.get_context(start_method)
    forked = context.get_start_method() == "fork"
    if not forked:
        from multiprocessing import resource_tracker
        resource_tracker.ensure_running()
    pool, started = None, []
    try:
        with contextlib.nullcontext() if forked else stops_held(), \
                stops_held_over_fork({signal.SIGINT, signal.SIGTERM} if forked else {signal.SIGINT}):
            try:
                pool = _recording_pool(context, started, workers, init_worker, (os.getpid(),))
            except OSError as e:  # its queues' semaphores: "no space left on device", then "free space"
                if e.errno == errno.ENOSPC:
                    raise UserError(shm_full("the worker pool's semaphores live there")) from None
                raise
        yield WatchedPool(pool, started)
        # guarded too: a stop in the join (the jobs done) left the pool's semaphores to the tracker
        pool.close()
        _join_watched(pool, started)
    except BaseException as e:
        if pool is None:
            raise
        terminate_pool(pool)
        if isinstance(e, Terminated) and context.get_start_method() != "fork":
            # the semaphores of its queues, registered with the resource tracker: unlinked now, as
            # the exit would (a SIGTERM's stop ends the process by os._exit, run_main's: the tracker
            # warned of 6 "leaked"); any other error leaves by the exit, which runs them itself
            from multiprocessing import util
            util._run_finalizers(0)
        raise


def shm_full(why, alternative=""):
    """The one line for a full /dev/shm: ``why`` this process needs it, ``alternative``: a fix
    without it (", or ..."). A container's is 64 MB unless given more."""
    try:
        st = os.statvfs("/dev/shm")
        size = " (%d kB)" % (st.f_blocks * st.f_frsize >> 10)
    except OSError:
        size = ""
    return ("/dev/shm%s is full: %s (a container's is 64 MB unless given more): run the container with "
            "--shm-size=1g (or --ipc=host; Kubernetes: an emptyDir of medium Memory at /dev/shm)%s"
            % (size, why, alternative))


def is_process_limit(e):
    """Whether ``e`` is a thread or process start refused by that limit: threading's "can't start
    new thread", or EAGAIN from a fork (multiprocessing's, subprocess's)."""
    if isinstance(e, RuntimeError):
        return str(e) == "can't start new thread"
    if not isinstance(e, OSError) or e.errno != errno.EAGAIN or e.filename:
        return False
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and tb.tb_frame.f_code.co_name in ("_launch", "_execute_child")


def signal_name(sig):
    """SIGTERM for 15; "signal 35" for one the enum does not name (the real-time signals)."""
    try:
        return signal.Signals(sig).name
    except ValueError:
        return "signal %d" % sig


def ended(code):
    """How a child whose exit code (``Popen.returncode``, ``Process.exitcode``) is ``code`` ended, in words."""
    return "was killed by %s" % signal_name(-code) if code < 0 else "exited with status %d" % code


def _recording_pool(context, started, *args):
    """A ``context`` Pool(*args) that appends each worker process it makes to ``started``, the first
    ones and each it starts in the place of one that ended (its handler thread, at any time): a copy
    of ``Pool._pool`` taken after the constructor missed a worker the handler was replacing just
    then, 7 pools in 300 with one worker dying in its start, and a death of its replacement, in a
    map or idle before the close, hung the command (a sweep)."""
    from multiprocessing import pool as mp_pool

    class RecordingPool(mp_pool.Pool):
        @staticmethod
        def Process(ctx, *a, **kw):  # the pool's own hook: every worker is made here
            process = ctx.Process(*a, **kw)
            started.append(process)
            return process
    return RecordingPool(*args, context=context)


class WatchedPool:
    """A pool whose ``imap``, ``imap_unordered`` and ``map`` end in one UserError when one of its
    workers dies (the out-of-memory killer, a SIGKILL or SIGTERM to that process alone): the pool
    starts another, but the task the dead one held is never done, and the results waited for ever
    (make-dataset, text-pipeline and pack hung, their locks held). ``started``: every worker the
    pool made (_recording_pool). Its other ways of giving work are refused (unwatched, a death there
    hangs the close as well); other attributes are the pool's."""

    _UNWATCHED = ("apply", "apply_async", "map_async", "starmap", "starmap_async")

    def __init__(self, pool, started):
        self._real = pool
        self._workers = started

    def __getattr__(self, name):
        if name in self._UNWATCHED:
            raise AttributeError("%s is not watched for a worker's death: use map, imap or imap_unordered" % name)
        return getattr(self._real, name)

    def _watched(self, results):
        import multiprocessing
        while True:
            try:
                yield results.next(timeout=0.25)
            except StopIteration:
                return
            except multiprocessing.TimeoutError:
                # (any death: an idle worker killed may hold the task queue's lock, which hangs the join)
                dead = next((w for w in self._workers if w.exitcode is not None), None)
                if dead is not None:
                    raise UserError("a worker process (pid %s) of this run %s, the out-of-memory killer or a "
                                    "signal to that process alone, and its work is lost: rerun the same command "
                                    "(a dataset command keeps its finished outputs)" % (dead.pid, ended(dead.exitcode)))

    def _chunked(self, method, func, iterable, chunksize):
        # the pool's own chunking yields from a generator, which has no next(timeout): chunks are tasks here
        if chunksize == 1:
            return self._watched(method(func, iterable, 1))
        items = list(iterable)
        chunks = [items[i:i + chunksize] for i in range(0, len(items), chunksize)]
        return (r for done in self._watched(method(functools.partial(_map_chunk, func), chunks, 1)) for r in done)

    def imap(self, func, iterable, chunksize=1):
        return self._chunked(self._real.imap, func, iterable, chunksize)

    def imap_unordered(self, func, iterable, chunksize=1):
        return self._chunked(self._real.imap_unordered, func, iterable, chunksize)

    def map(self, func, iterable, chunksize=1):
        return list(self.imap(func, iterable, chunksize))


def _join_watched(pool, started):
    """``pool.join()`` of a closed pool whose work is done, watched: a worker killed while idle (the
    out-of-memory killer, a signal to it alone) may have held the task queue's lock, on which the
    others wait for their end-of-work message: the join waited for ever, the command's locks held.
    Such a death ends the pool (``terminate_pool``): every result was in. ``started``: every worker
    the pool made (one it replaced is no longer in its ``_pool``)."""
    from multiprocessing import connection
    while True:
        workers = list(started)
        if any(w.exitcode not in (None, 0) for w in workers):
            terminate_pool(pool)
            return
        alive = [w for w in workers if w.exitcode is None]
        if not alive:
            break
        connection.wait([w.sentinel for w in alive], timeout=0.25)
    pool.join()


def _map_chunk(func, chunk):
    return [func(item) for item in chunk]


def terminate_pool(pool, grace=10.0, stuck=1.0, repeat=0.5):
    """``pool.terminate()``, which sends each worker one SIGTERM and then joins it for ever.

    A worker can outlive that SIGTERM: one that gets it just before it blocks on the task queue's
    lock (which the terminating pool holds) runs its Python handler only once that wait returns,
    which is never. So the SIGTERM is repeated every ``repeat`` seconds: a repeat interrupts the
    wait and the pending handler ends the worker. Workers still alive after ``grace`` seconds get
    SIGKILL. A worker can also end holding the result queue's lock (seen: the pool's task handler
    waiting on it with every worker gone), and the pool's own threads then wait for that lock for
    ever: ``stuck`` seconds after every worker is gone, the pool is left to them (daemon threads
    of a pool that is done). Under load each of the two cost make-dataset's error path 10-15 s,
    once in ~50 errors, and hung it before. (``Pool._pool``: the workers; no public attribute
    lists them.)"""
    import threading
    import time
    workers = list(getattr(pool, "_pool", None) or [])

    def unended():  # with any worker the pool started in the place of one that ended
        return [w for w in dict.fromkeys(workers + list(getattr(pool, "_pool", None) or [])) if w.exitcode is None]
    def terminate():
        # A stop while the pool's task handler wrote a task: the pool's own drain of the task queue
        # read the half-written message (EOFError, a traceback of this thread after the stop's line)
        # and ended before it ended the workers; those are killed below.
        with contextlib.suppress(Exception):
            pool.terminate()
    done = threading.Thread(target=terminate, name="pool-terminate", daemon=True)
    done.start()
    deadline = time.monotonic() + grace
    while done.is_alive() and time.monotonic() < deadline:
        done.join(min(repeat, max(0.0, deadline - time.monotonic())))
        alive = unended()
        if not alive:
            break
        for w in alive:
            if done.is_alive():
                w.terminate()
    gone_since = None
    while done.is_alive():
        alive = unended()
        for w in alive:
            w.kill()
        if alive:
            gone_since = None
        elif gone_since is None:
            gone_since = time.monotonic()
        elif time.monotonic() - gone_since > stuck:
            return
        done.join(min(0.25, stuck))
    left = unended()  # (pool.terminate() failed before it ended them)
    for w in left:
        w.kill()
    for w in left:  # gone before this process says it stopped
        w.join(stuck)


def call_in_worker(task):
    """A pool task, ``(module, function name, argument)``: ``module.function(argument)``. The module,
    and the modules its ``WORKER_IMPORTS`` names (what the function would import on its way), are
    imported while a SIGTERM still ends this worker at once, its default action, as before the
    worker's initializer ran; the function runs under the worker's own handler (``init_worker``'s:
    a SystemExit, so the atomic writer removes its temporary). A pool terminated by a stop (Ctrl-C)
    while a spawned worker imported numpy for its first task raised that SystemExit inside numpy's
    import, which made it an ImportError and printed a page of traceback after the command's one
    line. This module (errors) imports nothing but the standard library, so unpickling the task imports
    next to nothing under that handler."""
    import importlib
    module_name, name, argument = task
    handler = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        module = importlib.import_module(module_name)
        for extra in getattr(module, "WORKER_IMPORTS", ()):
            importlib.import_module(extra)
    finally:
        signal.signal(signal.SIGTERM, handler)
    return getattr(module, name)(argument)
