"""Progress bars: tqdm's on a terminal; in a file or a pipe (a scheduler's output file, ``docker
logs``, torchrun's pipe) an ASCII line of its own per redraw, at most every ``FILE_INTERVAL_S``
seconds: a log never holds a bar's carriage-return redraws run together on one endless line, and
what is written after a bar starts a line of its own."""
import functools
import sys
import time

from mlperf_bert.errors import stop_of

FILE_INTERVAL_S = 30


class BarLines:
    """A bar's output to a file or a pipe: each redraw a line of its own, the final erase dropped.
    tqdm begins a redraw with a carriage return and ends none with a newline, so the next line
    written there (an error, another process's in the same pipe) would continue it."""

    def __init__(self, out):
        self.out, self.last = out, None

    def write(self, text):
        text = text.replace("\r", "").rstrip()
        # a redraw of what the last line says (a bar closed where it began, within its first second: an
        # error's) is no news: a log showed its "0%" line twice before the error
        if text and text != self.last:
            self.out.write(text + "\n")
            self.last = text

    def flush(self):
        self.out.flush()


@functools.cache
def _tqdm():
    from tqdm import tqdm

    class Bar(tqdm):
        def close(self):
            """tqdm's, but its last redraw's error does not replace a stop it was closed in: under
            ``... 2>&1 | tee log`` the same Ctrl-C ended tee, and the BrokenPipeError of that redraw was
            taken for a failure (make-dataset removed its settings file, exit 141, not 130)."""
            try:
                super().close()
            except OSError:
                if stop_of(sys.exc_info()[1]) is None:
                    raise

    class LogBar(Bar):
        # timed on time.monotonic, not tqdm's time.time, which NTP steps: an hour back, a bar in a log
        # wrote no line for that hour and ended "[-43:30<00:00, -0.04it/s]" (tqdm's __init__ sets
        # _time: ignored). Its monitor thread, on time.time, never redraws it (maxinterval inf).
        _time = property(lambda self: time.monotonic, lambda self, value: None)
    return Bar, LogBar


def bar(iterable=None, file=None, **kwargs):
    """A tqdm bar on ``file`` (default stderr) as the module says; tqdm's other arguments
    (``total``, ``desc``, ``disable`` ...) pass through."""
    tqdm, log_tqdm = _tqdm()
    out = file or sys.stderr
    try:
        tty = out.isatty()
    except (AttributeError, ValueError):  # a closed or unusual stream: no terminal
        tty = False
    if tty:
        kwargs.setdefault("dynamic_ncols", True)
        return tqdm(iterable, file=out, **kwargs)
    kwargs.pop("dynamic_ncols", None)
    # a line at most every FILE_INTERVAL_S s, at a real update: tqdm's monitor thread would redraw the
    # last line again, with its old rate, after maxinterval. A bar that a terminal erases at its end
    # (leave=False) keeps its last line here: else a log shows its 0 % line alone, the last it heard of it
    kwargs.update(mininterval=max(kwargs.get("mininterval") or 0, FILE_INTERVAL_S), maxinterval=float("inf"),
                  ascii=True, leave=True)
    shown = log_tqdm(iterable, file=BarLines(out), **kwargs)
    shown.in_log = True  # (cli: a command's error or stop writes its last state, as this keeps it)
    return shown
