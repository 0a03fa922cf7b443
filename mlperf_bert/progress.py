"""Progress bars: tqdm's on a terminal; in a file or a pipe (a scheduler's output file, ``docker
logs``, torchrun's pipe) an ASCII line of its own per redraw, at most every ``FILE_INTERVAL_S``
seconds: a log never holds a bar's carriage-return redraws run together on one endless line, and
what is written after a bar starts a line of its own."""
import sys

FILE_INTERVAL_S = 30


class BarLines:
    """A bar's output to a file or a pipe: each redraw a line of its own, the final erase dropped.
    tqdm begins a redraw with a carriage return and ends none with a newline, so the next line
    written there (an error, another process's in the same pipe) would continue it."""

    def __init__(self, out):
        self.out = out

    def write(self, text):
        text = text.replace("\r", "").rstrip()
        if text:
            self.out.write(text + "\n")

    def flush(self):
        self.out.flush()


def bar(iterable=None, file=None, **kwargs):
    """A tqdm bar on ``file`` (default stderr) as the module says; tqdm's other arguments
    (``total``, ``desc``, ``disable`` ...) pass through."""
    from tqdm import tqdm
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
    # last line again, with its old rate, after maxinterval
    kwargs.update(mininterval=max(kwargs.get("mininterval") or 0, FILE_INTERVAL_S), maxinterval=float("inf"),
                  ascii=True)
    return tqdm(iterable, file=BarLines(out), **kwargs)
