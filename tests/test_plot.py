"""plot-log: the PNG next to the log by default, what it drew in its text, and the README's demo
figure against the README's words."""
import json
import os
import re
import subprocess
import sys

import pytest
from PIL import Image

from mlperf_bert.errors import UserError
from mlperf_bert.harness import compliance, plot
from test_compliance import write_log

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def drawn(png):
    """What plot-log wrote into the PNG's text: {"log", "evals", "status", "samples"}."""
    with Image.open(png) as im:
        return json.loads(im.text[plot.METADATA_KEY])


def test_without_output_the_png_goes_next_to_the_log(tmp_path):
    """Issue 47 (15): --output was required. Without it the PNG is the log's path with .png for its
    extension; an existing file there that is not a PNG is refused, as with --output."""
    log = write_log(tmp_path / "result_0.txt")
    assert plot.main(["plot-log", str(log)]) == 0
    png = tmp_path / "result_0.png"
    assert png.read_bytes()[:8] == plot.PNG_MAGIC
    evals = plot.curves(compliance.read_log(str(log)))["eval_accuracy"]
    assert drawn(png) == {"log": "result_0.txt", "evals": [list(e) for e in evals], "status": "success",
                          "samples": evals[-1][0]}
    other = write_log(tmp_path / "notes.log")
    (tmp_path / "notes.png").write_text("not a picture")
    with pytest.raises(UserError, match="notes.png exists and is not a PNG"):
        plot.main(["plot-log", str(other)])


def test_without_output_a_refusal_says_it_is_the_default_path_and_how_to_choose_another(tmp_path):
    """A hostile sweep: `plot-log LOG.png` (a log named so) was refused as "--output LOG.png is the input
    log", and a directory or another file where the default PNG goes as "--output ... ", naming a flag
    the user did not give and not the way out (--output=PNG). Nothing is written or replaced."""
    log = write_log(tmp_path / "run.png")
    before = log.read_bytes()
    why = "plot-log writes the PNG of %s there when no --output is given; give --output=PNG"
    with pytest.raises(UserError) as e:
        plot.main(["plot-log", str(log)])
    assert str(e.value) == "%s is the input log: %s" % (log, why % log)
    other = write_log(tmp_path / "run_1.txt")
    (tmp_path / "run_1.png").mkdir()
    with pytest.raises(UserError) as e:
        plot.main(["plot-log", str(other)])
    assert str(e.value) == "%s is a directory: %s" % (tmp_path / "run_1.png", why % other)
    (tmp_path / "run_1.png").rmdir()
    (tmp_path / "run_1.png").write_text("notes")
    with pytest.raises(UserError) as e:
        plot.main(["plot-log", str(other)])
    assert str(e.value) == "%s exists and is not a PNG: %s (or move it away)" % (tmp_path / "run_1.png", why % other)
    assert log.read_bytes() == before and (tmp_path / "run_1.png").read_text() == "notes"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.png", "run_1.png", "run_1.txt"]


def _demo_defaults(capsys):
    """The demo's eval frequency and target: its preset's (the demo gives neither unless told),
    as train_model.sh's dry run of demo_cpu passes them to the trainer."""
    from test_launchers import command_flags, dry_run
    _, fl = command_flags(dry_run("--preset=demo_cpu", NUM_GPUS="1"))
    return {"eval_frequency": fl["eval_frequency"], "target": fl["target_mlm_accuracy"]}


def test_the_readme_demo_figure_is_the_run_its_words_describe(capsys):
    """Issue 47 (15): README's figure showed 9 evals where the words (and a new user's run) had 8.
    The figure holds what it drew (plot-log's PNG text); the README's sentence under it gives the
    same eval count, stop point and last accuracy, and the demo's eval grid and target."""
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    m = re.search(r"!\[demo curve\]\((docs/demo_curve\.png)\)\s*\n\s*\n(.*?)\n\n", readme, re.S)
    assert m, "README: no sentence under the demo figure"
    words = " ".join(m.group(2).split())
    said = re.search(r"(\d+) evals \(at 0 and every ([\d,]+) samples\), the target ([\d.]+) reached at "
                     r"([\d,]+) samples \(accuracy ([\d.]+)\)", words)
    assert said, words
    n, every, target, at, accuracy = said.groups()
    defaults = _demo_defaults(capsys)
    assert (every.replace(",", ""), target) == (defaults["eval_frequency"], defaults["target"])
    got = drawn(os.path.join(ROOT, m.group(1)))
    samples = [s for s, _ in got["evals"]]
    assert (got["log"], got["status"]) == ("mlperf.log", "success")
    assert len(samples) == int(n) and samples == [k * int(every.replace(",", "")) for k in range(int(n))]
    assert got["samples"] == samples[-1] == int(at.replace(",", ""))
    assert "%.5f" % got["evals"][-1][1] == accuracy
    assert got["evals"][-1][1] >= float(target) > got["evals"][-2][1]  # stopped at the first eval past it


@pytest.mark.parametrize("name", ["curve.pdf", "curve.jpg", "curve"])
def test_an_output_not_ending_in_png_is_refused(tmp_path, name):
    """PNG bytes went into curve.pdf (exit 0)."""
    log = write_log(tmp_path / "result_0.txt")
    out = tmp_path / name
    with pytest.raises(UserError) as e:
        plot.main(["plot-log", str(log), "--output=%s" % out])
    assert str(e.value) == "--output=%s: plot-log writes PNG only: give a file name ending in .png" % out
    assert not out.exists()
    assert plot.main(["plot-log", str(log), "--output=%s" % (tmp_path / "curve.PNG")]) == 0


@pytest.mark.parametrize("name", ["runs", "runs [0]"])
def test_a_directory_is_refused_naming_a_log_in_it(tmp_path, name):
    """read_log's message said to pass 'a directory holding result_*.txt' while refusing one (a
    folder named with a glob's characters, "runs [0]", was said to hold none: its name read as a pattern)."""
    runs = tmp_path / name
    runs.mkdir()
    write_log(runs / "result_1.txt")
    write_log(runs / "result_0.txt")
    with pytest.raises(UserError) as e:
        plot.main(["plot-log", str(runs)])
    assert str(e.value) == "plot-log: %s is a directory: pass one MLPerf log file (e.g. %s)" % (
        runs, runs / "result_0.txt")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UserError) as e:
        plot.main(["plot-log", str(empty)])
    assert str(e.value) == ("plot-log: %s is a directory: pass one MLPerf log file, such as a run's result_*.txt "
                            "or mlperf.log" % empty)


def test_a_run_still_writing_its_log_is_plotted_to_its_last_whole_line(tmp_path):
    """A hostile sweep: plot-log of a run in progress, whose logger had written half of a line (a
    stdout written in 4 KiB blocks leaves one there most of the time), was refused as "malformed
    MLLOG line (truncated log?)". The line being written is left out; a half line anywhere else,
    or in check-log (which judges a finished log), is still refused."""
    text = write_log(tmp_path / "full.txt").read_text()
    lines = text.splitlines(keepends=True)
    third = [i for i, line in enumerate(lines) if '"eval_accuracy"' in line][2]
    log = tmp_path / "result_0.txt"
    log.write_text("".join(lines[:third]) + lines[third][:70])  # two evals, the third half written
    assert plot.main(["plot-log", str(log)]) == 0
    got = drawn(tmp_path / "result_0.png")
    assert (len(got["evals"]), got["status"]) == (2, "running")
    with pytest.raises(UserError, match=r"result_0.txt:%d: malformed MLLOG line \(truncated log\?\)" % (third + 1)):
        compliance.main(["check-log", "--noofficial", str(log)])
    log.write_text("".join(lines[:third]) + lines[third][:70] + "\n" + "".join(lines[third + 1:]))
    with pytest.raises(UserError, match=r"result_0.txt:%d: malformed MLLOG line" % (third + 1)):
        plot.main(["plot-log", str(log), "--output=%s" % (tmp_path / "cut.png")])


def test_a_position_matplotlib_cannot_draw_is_one_line_and_no_file(tmp_path):
    """A hostile sweep: a log whose epoch_num reads 1e308 (a corrupt logger) stopped plot-log with
    matplotlib's traceback ("ValueError: arange: cannot compute length", in its ticks). One line
    now, and no PNG nor temporary left."""
    log = write_log(tmp_path / "result_0.txt")
    log.write_text(re.sub(r'"(epoch_num|samples_count)": \d+', r'"\1": 1e308', log.read_text()))
    with pytest.raises(UserError, match=r"result_0.txt: matplotlib cannot draw its curves \(ValueError: .*\): a"
                       r" training position or value in it is out of range \(up to 1e\+308\)"):
        plot.main(["plot-log", str(log)])
    assert sorted(os.listdir(tmp_path)) == ["result_0.txt"]


def test_a_train_samples_budget_logged_before_training_is_not_where_the_run_stopped(tmp_path):
    """A hostile sweep: tinycorp's v5.0 log states train_samples 3,600,000 before run_start (its
    budget) and no position in run_stop; the PNG's text said the run stopped there, 451,008 samples
    past its last eval and line, at 3,148,992."""
    import gzip
    from test_compliance import DATA
    name = "v5.0_tinycorp_tinybox_red_result_0.txt"
    with gzip.open(os.path.join(DATA, "mlperf_logs", name + ".gz"), "rb") as f:
        (tmp_path / name).write_bytes(f.read())
    assert plot.main(["plot-log", str(tmp_path / name), "--output=%s" % (tmp_path / "tiny.png")]) == 0
    got = drawn(tmp_path / "tiny.png")
    assert got["status"] == "success" and got["samples"] == got["evals"][-1][0] == 3148992


def _plot_in_subprocess(tmp_path, prelude="", **env):
    log = write_log(tmp_path / "result_0.txt")
    code = prelude + "import sys; from mlperf_bert.__main__ import main; sys.argv[1:] = %r; main()" % [
        "plot-log", str(log), "--output=" + str(tmp_path / "c.png")]
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env=dict(os.environ, PYTHONPATH=ROOT, **env))


def test_an_unwritable_matplotlib_folder_is_a_private_temporary_one_without_warnings(tmp_path):
    """A hostile sweep (the image run as an HPC site runs it: Apptainer gives the host's /tmp, which
    every user shares): the image's MPLCONFIGDIR=/tmp/matplotlib, made by the first user, is not the
    next one's, and a --user container's HOME (/) cannot be written either: matplotlib wrote two
    lines of warning on every plot ("... is not a writable directory", "Matplotlib created a
    temporary cache directory ..."). Now a private temporary folder, silently, removed at exit; with
    no temporary folder either, one line naming the fixes (matplotlib's OSError traceback)."""
    (tmp_path / "a_file").write_text("")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = _plot_in_subprocess(tmp_path, MPLCONFIGDIR=str(tmp_path / "a_file" / "mpl"), TMPDIR=str(tmp))
    assert (proc.returncode, proc.stderr) == (0, ""), proc.stderr
    assert (tmp_path / "c.png").read_bytes()[:8] == plot.PNG_MAGIC and list(tmp.iterdir()) == []
    no_tmp = "import tempfile; tempfile._candidate_tempdir_list = lambda: [%r]; " % str(tmp_path / "missing")
    proc = _plot_in_subprocess(tmp_path, no_tmp, MPLCONFIGDIR=str(tmp_path / "a_file" / "mpl"))
    assert proc.returncode == 2 and proc.stderr.splitlines() == [
        "error: no writable temporary folder for matplotlib's font cache, whose own (%s) cannot be written either "
        "($TMPDIR, /tmp, /var/tmp, /usr/tmp and the current folder %s are not writable): set MPLCONFIGDIR or TMPDIR "
        "to a writable folder, or mount one at /tmp (a read-only container: docker run --tmpfs /tmp)"
        % (tmp_path / "a_file" / "mpl", ROOT)], proc.stderr


def test_a_relative_mplconfigdir_that_can_be_written_is_kept(tmp_path):
    """A review: a relative MPLCONFIGDIR (matplotlib takes one) was swapped for a temporary folder,
    and a matplotlibrc in it ignored."""
    proc = subprocess.run([sys.executable, "-c", "import os; from mlperf_bert.harness import plot; plot.pyplot(); "
                           "print(os.environ['MPLCONFIGDIR'])"], capture_output=True, text=True, cwd=str(tmp_path),
                          timeout=120, env=dict(os.environ, PYTHONPATH=ROOT, MPLCONFIGDIR="mpl"))
    assert (proc.returncode, proc.stdout) == (0, "mpl\n"), proc.stderr
