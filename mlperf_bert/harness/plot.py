"""``plot-log LOG [--output=PNG]``: masked-LM accuracy (and any logged loss) against training samples.

Reads the MLPerf log through check-log's parser; the target line is the one check-log
applies (0.720 closed; open: the log's ``target_accuracy``).  Loss keys (any key with "loss" in its name logged with a
samples position) are drawn on a second axis when present.
"""
import glob
import json
import os
import sys
import warnings

from mlperf_bert import flags
from mlperf_bert.harness.compliance import CLOSED_TARGET, division_of, read_log, samples_of, target_of
from mlperf_bert.errors import UserError
from mlperf_bert.fileio import atomic_path, refuse_replacing_another_kind, usable_tempdir


def shown(name):
    """``name`` (a file name) as text a figure can draw: bytes that are not UTF-8, which Python keeps
    as surrogates in a file name, become U+FFFD (matplotlib refused them with a traceback)."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _writable_dir(d):
    """Whether folder ``d`` exists or can be made, and can be written (matplotlib's own test)."""
    try:
        os.makedirs(d, exist_ok=True)
    except OSError:
        return False
    return os.path.isdir(d) and os.access(d, os.W_OK)


def pyplot():
    """matplotlib.pyplot on the Agg backend. Where the folders of its font cache cannot be written
    (MPLCONFIGDIR, else ~/.config/matplotlib and ~/.cache/matplotlib: a read-only container, the
    HOME of a container's --user, another user's folder in a /tmp shared by every user of an HPC
    host), they become a private temporary one, removed at exit: matplotlib did the same, with a
    two-line warning on each plot; none writable is one line naming the fix (its OSError traceback)."""
    if "matplotlib" not in sys.modules:
        home = os.path.expanduser("~")
        dirs = [os.environ.get("MPLCONFIGDIR")] if os.environ.get("MPLCONFIGDIR") else [
            os.path.join(os.environ.get(var) or os.path.join(home, sub), "matplotlib")
            for var, sub in (("XDG_CONFIG_HOME", ".config"), ("XDG_CACHE_HOME", ".cache"))]
        # (no HOME: "~" stays relative, which matplotlib does not take; a relative MPLCONFIGDIR it takes)
        if not all((os.path.isabs(d) or os.environ.get("MPLCONFIGDIR")) and _writable_dir(d) for d in dirs):
            import atexit
            import shutil
            import tempfile
            tmp = tempfile.mkdtemp(prefix="matplotlib-", dir=usable_tempdir(
                "matplotlib's font cache, whose own (%s) cannot be written either" % ", ".join(dirs),
                "set MPLCONFIGDIR or TMPDIR to a writable folder"))
            atexit.register(shutil.rmtree, tmp, ignore_errors=True)
            os.environ["MPLCONFIGDIR"] = tmp
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def curves(records):
    """{key: [(samples, value), ...]} for eval_accuracy and every numeric *loss* key."""
    out = {}
    for r in records:
        if (r.key == "eval_accuracy" or "loss" in r.key) and isinstance(r.value, (int, float)) \
                and samples_of(r) is not None:
            out.setdefault(r.key, []).append((samples_of(r), float(r.value)))
    return out


def plot_log(log, output):
    records = read_log(log, in_progress=True)  # a run's log as it trains: its last line may be half written
    data = curves(records)
    if "eval_accuracy" not in data:
        raise UserError("%s has no eval_accuracy lines to plot: no eval reached yet, or no --eval_input_file" % log)
    target = target_of(records, division_of(records)) or CLOSED_TARGET
    plt = pyplot()
    fig, drawn = _figure(plt, log, records, data, target)
    try:
        with warnings.catch_warnings():  # numpy's overflow warnings on the way to the error below
            warnings.simplefilter("ignore", RuntimeWarning)
            fig.tight_layout()
            with atomic_path(output) as tmp:
                fig.savefig(tmp, format="png", metadata={METADATA_KEY: json.dumps(drawn)})
    except (ValueError, OverflowError) as e:
        # the ticks' arithmetic overflows on a position or value near the float limit (a corrupt epoch_num)
        far = max(abs(v) for pts in data.values() for pt in pts for v in pt)
        raise UserError("%s: matplotlib cannot draw its curves (%s: %s): a training position or value in it is"
                        " out of range (up to %g)" % (log, type(e).__name__, e, far))
    finally:
        plt.close(fig)
    return output


def _figure(plt, log, records, data, target):
    """(the figure of ``data``, what it shows: the PNG's text)."""
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    xs, ys = zip(*data["eval_accuracy"])
    ax.plot(xs, ys, "o-", color="tab:blue", label="eval masked-LM accuracy")
    ax.axhline(target, ls="--", color="tab:green", label="target %.3g" % target)
    ax.set_xlabel("training samples")
    ax.set_ylabel("masked-LM accuracy")
    losses = {k: v for k, v in data.items() if k != "eval_accuracy"}
    handles, labels = ax.get_legend_handles_labels()
    if losses:
        ax2 = ax.twinx()
        for (k, pts), color in zip(sorted(losses.items()), ["tab:red", "tab:orange", "tab:purple", "tab:brown"] * 4):
            lx, ly = zip(*pts)
            ax2.plot(lx, ly, ".-", color=color, alpha=0.8, label=k)
        ax2.set_ylabel("loss")
        h2, l2 = ax2.get_legend_handles_labels()
        handles, labels = handles + h2, labels + l2
    ax.legend(handles, labels, loc="center right")
    stop = next((r for r in records if r.key == "run_stop"), None)
    status = stop.metadata.get("status") if stop else "running"
    ax.set_title("%s: %d evals, run %s" % (shown(os.path.basename(log)), len(xs), status))
    ax.grid(alpha=0.3)
    # what the figure shows, in the PNG's text (tests/test_plot.py compares the README's demo figure with its words)
    # a train_samples before the first eval is a budget, not where the run stopped (tinycorp's v5.0
    # log: 3,600,000 after run_start, its last line at 3,148,992): then its last position
    first = next(r.lineno for r in records if r.key == "eval_accuracy")
    trained = next((r.value for r in records if r.key == "train_samples" and r.lineno > first), None)
    last = max((s for s in map(samples_of, records) if s is not None), default=None)
    drawn = {"log": shown(os.path.basename(log)), "evals": data["eval_accuracy"], "status": status,
             "samples": (samples_of(stop) if stop else None) or trained or last}  # where the run stopped
    return fig, drawn


PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# the PNG text chunk of what plot-log drew: {"log", "evals": [[samples, accuracy]], "status", "samples"}
METADATA_KEY = "mlperf_bert plot-log"


def check_output(output, inputs=(), default_of=None):
    """Refuse an ``output`` that would overwrite one of ``inputs`` or any existing file that is not a
    PNG (a log, a config: a typo must not turn it into a picture; an empty file loses nothing).
    ``default_of``: the log whose default PNG ``output`` is (no --output given: the line says so)."""
    if not os.path.lexists(output):
        return
    by_default = "plot-log writes the PNG of %s there when no --output is given; give --output=PNG" % default_of
    if os.path.isdir(output):
        raise UserError("%s is a directory: %s" % (output, by_default) if default_of else
                        "--output %s is a directory: give the PNG file to write" % output)
    for path in inputs:
        if os.path.exists(path) and os.path.samefile(output, path):
            raise UserError("%s is the input log: %s" % (output, by_default) if default_of else
                            "--output %s is the input log: choose another file for the PNG" % output)
    if default_of and os.path.isfile(output) and os.path.getsize(output) and not is_png(output):
        raise UserError("%s exists and is not a PNG: %s (or move it away)" % (output, by_default))
    refuse_replacing_another_kind(output, is_png, "a PNG")


def is_png(path):
    try:
        with open(path, "rb") as f:
            return f.read(len(PNG_MAGIC)) == PNG_MAGIC
    except OSError as e:
        raise UserError("--output %s: %s" % (path, e.strerror))


def default_output(log):
    """The PNG next to ``log``: its path with ``.png`` for its extension (train/mlperf.log ->
    train/mlperf.png)."""
    return os.path.splitext(log)[0] + ".png"


def main(argv):
    fv = flags.FlagValues()
    flags.DEFINE_string("output", None, "PNG to write (a new file, or a PNG to replace); default: next to LOG, "
                        "its path with .png for its extension", flag_values=fv)
    rest = flags.parse(fv, argv, positional="LOG")
    if len(rest) != 1:
        raise UserError("%s [--output=PNG] (one MLPerf log file)" % flags.usage("plot-log", "LOG"))
    if os.path.isdir(rest[0]):  # read_log's message offers directories, which plot-log does not take
        logs = sorted(glob.glob(os.path.join(glob.escape(rest[0]), "result_*.txt")))
        raise UserError("plot-log: %s is a directory: pass one MLPerf log file%s"
                        % (rest[0], " (e.g. %s)" % logs[0] if logs else ", such as a run's result_*.txt or mlperf.log"))
    output = fv.output or default_output(rest[0])
    check_output(output, rest, default_of=None if fv.output else rest[0])
    if fv.output is not None and not fv.output.lower().endswith(".png"):
        # savefig writes PNG bytes whatever the name says
        raise UserError("--output=%s: plot-log writes PNG only: give a file name ending in .png" % fv.output)
    print("wrote %s" % plot_log(rest[0], output))
    return 0
