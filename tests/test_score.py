"""score: the official package checker and result summarizer on a real v5.0 submission package
(NVIDIA nyx, tests/data), and on the same package broken in the ways the rules reject."""
import gzip
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from mlperf_bert import locking
from mlperf_bert.errors import UserError
from mlperf_bert.harness import score
from procs import alive, children, start_time, state

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
BERT = os.path.join("NVIDIA", "results", "nyx_n1_ngc25.04_pytorch", "bert")


@pytest.fixture(scope="module")
def official_tools():
    """What score imports before it forks the official tools (scipy and pandas among them: 2 s of
    CPU). The tests that run the tools take it, so that under `make test` they share one worker
    (conftest.py groups the users of a module fixture) and that worker imports them once."""
    import importlib
    for tool, _ in score.STEPS:
        importlib.import_module("mlperf_logging.%s.%s" % (tool, tool))


@pytest.fixture
def package(tmp_path):
    with tarfile.open(os.path.join(DATA, "submission_v5.0_NVIDIA_nyx_n1.tar.gz")) as t:
        t.extractall(tmp_path, filter="data")
    return tmp_path / "submission_v5.0_NVIDIA_nyx_n1"


@pytest.fixture(scope="module")
def nvidia_scored(official_tools, tmp_path_factory):
    """`score --json --plots_dir=DIR` run once, in this process (`python -m mlperf_bert score`
    itself: test_launchers' packaged runs, the SIGKILL test here), on NVIDIA's nyx and tyche
    packages merged (the official tools take ~1.5 s a system): (status, stdout, stderr, package
    root, its files before, the plots folder). Nyx alone was scored separately before (its block
    is the same); its single-system plot names beside the package are test_launchers'."""
    import contextlib
    import io
    tmp = tmp_path_factory.mktemp("nvidia")
    root = unpack(tmp, "NVIDIA_nyx_n1", "NVIDIA_tyche")
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = score.main(["score", "--json", "--plots_dir=%s" % (tmp / "plots"), str(root)])
    return status, out.getvalue(), err.getvalue(), root, before, tmp / "plots"


def system_block(out, system):
    """The report's block of ``system`` (from its "== system" line to its "submission:" line)."""
    return next(b for b in out.split("\n== system ")[1:] if b.startswith(system + " ")).split("\n\n")[0]


def test_real_package_gets_its_official_score(nvidia_scored):
    status, stdout, out, root, before, plots = nvidia_scored
    # issue 45: with --json the report goes to stderr, stdout is the JSON alone
    assert status == 0, out
    got = json.loads(stdout)
    # what mlperf-logging 4.1.68 says of this package (tests/data/README.md)
    assert {k: v for k, v in got.items() if k != "systems"} == {
        "org": "NVIDIA", "package_checker": "pass", "result_summarizer": "pass", "repo_checker": "pass",
        "verdict": "pass"}
    assert got["systems"][0] == {
        "system": NYX, "system_name": "Nyx (1x NVIDIA DGX B200)", "division": "closed",
        "time_to_train_min": pytest.approx(3.5022071145, abs=1e-9), "energy_j": None,
        "rcp_scaling_factor": pytest.approx(1.0028470154, abs=1e-9),
        "samples_to_converge": 2436995.375, "rcp": "Pass", "package_check": "pass", "verdict": "pass",
        "reasons": [], "warnings": [NO_CODE]}
    nyx = system_block(out, NYX)
    assert "result_0.txt        27912      2550982    3.6711  success  PASS" in nyx
    assert nyx.count("  success  PASS\n") == 10  # each run's check-log verdict
    assert "RCP check: Pass, scaling factor 1.0028470154; samples to converge 2436995.375" in nyx
    # the fastest (2.7828 min) and the slowest (3.8963 min) run
    assert "olympic mean: drops result_6.txt and result_1.txt" in nyx
    for step in ("package checker", "result summarizer", "repo checker"):  # the verify script's three steps
        assert "%s (mlperf_logging, training 5.0.0): PASS" % step in out
    # the package stays as submitted (the official tools ran on a copy, the plots go outside it)
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before
    for name in ("score_times", "score_convergence"):
        assert (plots / ("%s.%s.png" % (NYX, name))).read_bytes()[:4] == b"\x89PNG"


def test_a_missing_log_fails_with_the_checkers_reason(official_tools, package):
    os.remove(package / BERT / "result_3.txt")
    s = score.score(str(package))
    assert s["steps"]["package_checker"][0] == "fail" and s["systems"][0]["package_check"] == "fail"
    assert any("found 9, expected 10" in e for e in s["systems"][0]["errors"]), s["systems"][0]["errors"]


def test_runs_are_listed_in_their_numbers_order(official_tools, package, tmp_path):
    """score's table and its shared-log warning listed result_10 before result_2 (a string sort)."""
    shutil.copy(package / BERT / "result_9.txt", package / BERT / "result_10.txt")
    runs = [os.path.basename(r[0]) for r in score.score(str(package))["systems"][0]["runs"]]
    assert runs == ["result_%d.txt" % n for n in range(11)]
    for system in ("a", "b"):
        bert = tmp_path / "results" / system / "bert"
        bert.mkdir(parents=True)
        for n in (10, 2):
            shutil.copy(package / BERT / ("result_%d.txt" % n), bert / ("result_%d.txt" % n))
    said = score.shared_logs(str(tmp_path), ["a", "b"], {})["a"][0]
    assert "(result_2.txt, result_10.txt)" in said, said


def test_two_aborted_runs_fail(official_tools, package, capsys):
    """In this process: `python -m mlperf_bert` exits with main's status (test_launchers runs score's
    command, test_compliance check-log's with status 1). Issue 45: --json's reasons said "its 1 ERROR
    line above", which JSON has not: the checker's ERROR line follows the reason."""
    for n in (1, 2):
        log = package / BERT / ("result_%d.txt" % n)
        log.write_text(log.read_text().replace('"status": "success"', '"status": "aborted"'))
    status = score.main(["score", "--noplots", "--json", str(package)])
    captured = capsys.readouterr()
    out = captured.err
    assert status == 1, out
    assert "package checker (mlperf_logging, training 5.0.0): FAIL" in out
    assert "RCP Test Failed: Insufficient convergence" in out  # the checker's reason
    reasons = json.loads(captured.out)["systems"][0]["reasons"]
    at = reasons.index("the official package checker failed for this system (its 1 ERROR line above)")
    assert reasons[at + 1].startswith("package checker: RCP Test Failed: Insufficient convergence"), reasons


def test_a_non_ascii_system_name_scores_as_under_a_utf8_locale(official_tools, package, capsys):
    """An environment sweep: the official tools open the package's UTF-8 files in the locale's
    encoding. Under an ASCII one (LC_ALL=C PYTHONUTF8=0) "Nyx™" was a UnicodeDecodeError in both
    (the package failed, exit 1); under ISO-8859-1 the system_name came back "Nyxâ\x84¢"."""
    import locale
    path = package / "NVIDIA" / "systems" / "nyx_n1_ngc25.04_pytorch.json"
    path.write_text(path.read_text(encoding="utf-8").replace('"Nyx (', '"Nyx™ ('), encoding="utf-8")
    before = locale.setlocale(locale.LC_CTYPE)
    locale.setlocale(locale.LC_CTYPE, "C")  # what the forked tools inherit: open()'s encoding, ASCII
    try:
        status = score.main(["score", "--noplots", "--json", str(package)])
    finally:
        locale.setlocale(locale.LC_CTYPE, before)
    report = json.loads(capsys.readouterr().out)
    assert (status, report["verdict"], report["systems"][0]["system_name"]) == (0, "pass", "Nyx™ (1x NVIDIA DGX B200)")


def test_open_division_says_the_rcp_check_does_not_apply(official_tools, package, capsys):
    """Issue 23: an open-division package printed "RCP: , scaling factor 1.0; samples to
    converge None" (what the summarizer gives there); the same package declared open here."""
    for path in list((package / BERT).glob("result_*.txt")) + list(package.glob("NVIDIA/systems/*.json")):
        path.write_text(path.read_text().replace('"closed"', '"open"'))
    score.main(["score", "--noplots", "--json", str(package)])
    captured = capsys.readouterr()
    out = captured.err
    assert "RCP check: does not apply (open division: reference convergence points bind closed-division" \
        " runs only); no scaling factor, no samples to converge" in out
    assert "RCP: ," not in out and "None" not in out.split("package checker")[1]
    # issue 37: --json said rcp_scaling_factor 1.0 (the summarizer's) where the text says there is none
    got = json.loads(captured.out)["systems"][0]
    assert got["division"] == "open" and got["rcp_scaling_factor"] is None and got["samples_to_converge"] is None


def test_truncated_log_among_ten_gets_no_score(official_tools, package):
    """Issue 23: the official tools PASS a package with one log cut off (they drop it as a
    non-converged run); its log breaks the rules, so there is no score."""
    log = package / BERT / "result_5.txt"
    log.write_text("".join(log.read_text().splitlines(keepends=True)[:300]))
    s = score.score(str(package))
    assert s["steps"]["package_checker"][0] == "pass"  # what the official checker says
    s = s["systems"][0]
    assert s["verdict"] == "fail" and s["time_to_train_min"] is None
    assert s["run_verdicts"][5][:2] == ("FAIL", "invalid") and "run_stop" in s["run_verdicts"][5][2]
    assert "result_5.txt: run_stop" in s["reasons"][0]
    assert s["target"] == 0.720 and s["dropped"] == [6, 5]  # the cut-off run counts as the slowest


def test_score_says_why_it_fails_one_line_per_reason(official_tools, package, capsys):
    """Issue 31: score said FAIL with no reason for a broken or incomplete systems JSON or an empty
    results folder. Each reason is its own line under "time to train"; what the official tools do not
    check (logs of another org or status, issue 37) is a warning line."""
    system_json = package / "NVIDIA" / "systems" / (BERT.split(os.sep)[2] + ".json")
    desc = json.loads(system_json.read_text())
    del desc["cooling"]
    desc["status"] = "Research, Development, or Internal (RDI)"
    system_json.write_text(json.dumps(desc))
    for n in (2, 7):
        log = package / BERT / ("result_%d.txt" % n)
        log.write_text(log.read_text().replace('"submission_org", "value": "NVIDIA"', '"submission_org", "value": "ACME"'))
    log = package / BERT / "result_4.txt"
    log.write_text(log.read_text().replace('"submission_division", "value": "closed"',
                                           '"submission_division", "value": "open"'))
    assert score.main(["score", "--noplots", str(package)]) == 1
    out = capsys.readouterr().out
    reasons = out.split("time to train: none:\n", 1)[1].split("submission: FAIL")[0].splitlines()
    assert reasons[:3] == [
        "  the official package checker failed for this system (its 1 ERROR line above)",
        "  NVIDIA/systems/nyx_n1_ngc25.04_pytorch.json lacks 1 field the official checker requires: cooling",
        "  result_4.txt: submission_division 'open', the systems JSON says 'closed'"], out
    # judged as open (what it says): no target of its own logged, its stop is not checked (a warning)
    assert reasons[3:] == [], out
    assert re.search(r"result_4\.txt +20167 .* WARN$", out, re.M), out
    warnings = [l for l in out.splitlines() if l.startswith("warning: ")]
    assert warnings == [
        "warning: 2 logs (result_2.txt, result_7.txt): submission_org 'ACME', the package's submitter is 'NVIDIA'"
        " (a log must name its submitter: runs made with SUBMISSION_ORG=NVIDIA)",
        "warning: 10 logs (result_0.txt ... result_9.txt): submission_status 'onprem', the systems JSON's status"
        " 'Research, Development, or Internal (RDI)' needs 'research'", "warning: " + NO_CODE], out
    # no logs at all, and a systems JSON that is not JSON
    system_json.write_text('{"submitter": "NVIDIA"')
    for log in (package / BERT).iterdir():
        log.unlink()
    assert score.main(["score", "--noplots", str(package)]) == 1
    out = capsys.readouterr().out
    reasons = out.split("time to train: none:\n", 1)[1].split("submission: FAIL")[0].splitlines()
    assert len(reasons) == 4, out
    assert re.match(r"  systems JSON .*nyx_n1_ngc25.04_pytorch.json is not JSON \(.*\): fix the file$", reasons[0])
    assert reasons[1] == "  %s holds no result_*.txt logs" % (package / BERT)
    assert reasons[2].startswith("  the official package checker did not finish; its last line: ")
    assert reasons[3].startswith("  the official result summarizer failed (exit status 1; its last line: ")


def test_power_logs_get_the_official_energy_to_train(official_tools, package, capsys):
    """A power submission's score was lost: Lenovo's published v5.0 SR780aV3 package (bert/power/
    beside the logs) has the official summarizer's bert:Energy, 1949215.9 J, and score printed its
    minutes alone. Here nyx's runs, each with Lenovo's real power log of its run 0 (vendored): the
    summarizer's energy, 1909106.1423672757 J (mlperf-logging 4.1.68 run on this package), in the
    JSON and the report; none where the system fails."""
    bert = package / BERT
    with gzip.open(os.path.join(DATA, "power_v5.0_Lenovo_SR780aV3-8xB200_bert_result_0_node_0.txt.gz"), "rb") as f:
        power = f.read()
    for i in range(10):
        (bert / "power" / ("result_%d" % i)).mkdir(parents=True)
        (bert / "power" / ("result_%d" % i) / "node_0.txt").write_bytes(power)
    assert score.main(["score", "--json", str(package)]) == 0
    out = capsys.readouterr()
    s = json.loads(out.out)["systems"][0]
    assert s["energy_j"] == pytest.approx(1909106.1423672757, rel=1e-12)
    assert s["time_to_train_min"] == pytest.approx(3.5022071145, abs=1e-9)
    assert "energy to train: 1909106.14236" in out.err
    (bert / "result_3.txt").write_text("")  # an empty log: no score, so no energy either
    assert score.main(["score", "--json", str(package)]) == 1
    s = json.loads(capsys.readouterr().out)["systems"][0]
    assert s["verdict"] == "fail" and s["energy_j"] is None


def test_all_runs_aborted_get_no_time_to_train(official_tools, package, capsys):
    """Each run reached the target and says aborted: no run of it counts as not converged (the
    official checker passes each, and the summarizer counts them); each breaks the stopping rule."""
    for log in (package / BERT).glob("result_*.txt"):
        log.write_text(log.read_text().replace('"status": "success"', '"status": "aborted"'))
    assert score.main(["score", "--noplots", str(package)]) == 1
    out = capsys.readouterr().out
    assert "time to train: none:" in out and "10 run logs break the rules (result_0.txt: stop_at_target: eval " \
        "reached 0.72 (line" in out and "but run_stop status is aborted" in out
    assert "submission: FAIL" in out and "not converged" not in out


def test_a_run_the_summarizer_counts_is_not_reported_dropped(official_tools, package):
    """A hostile sweep: one run that reached the target but says aborted was reported "not
    converged", dropped by the olympic mean as the slowest (and the system passed), while the
    official summarizer counted its minutes and dropped the fastest and the slowest of the ten: the
    time printed was not the mean of the runs the report kept. Its log breaks the stopping rule
    (no score); the runs called dropped are the summarizer's."""
    log = package / BERT / "result_3.txt"
    log.write_text(log.read_text().replace('"status": "success"', '"status": "aborted"'))
    s = score.score(str(package))
    assert s["steps"]["package_checker"][0] == "pass"  # what the official checker says
    s = s["systems"][0]
    assert s["run_verdicts"][3][1] == "invalid" and "but run_stop status is aborted" in s["run_verdicts"][3][2]
    assert s["verdict"] == "fail" and s["time_to_train_min"] is None
    minutes = [r[3] for r in s["runs"]]
    order = sorted(range(10), key=minutes.__getitem__)
    assert s["dropped"] == [order[0], order[-1]] and 3 not in s["dropped"], (s["dropped"], minutes)


def test_a_run_that_trained_out_its_budget_without_run_stop_is_the_one_not_converged(official_tools, package):
    """A sweep: a run that did not converge and logged no run_stop after its train_samples budget (as
    tinycorp's v4.1 tinybox_green result_2.txt, published with its set) failed the system ("run_stop:
    0 run_stop lines"); the official package checker accepts one such log (olympic scoring) and the
    summarizer drops it (the set's time, as the official tools gave it to a sweep for this run dropped:
    3.5457708333). It is the
    set's one run that did not converge. (A log cut off before its budget still breaks the rules:
    test_truncated_log_among_ten_gets_no_score.)"""
    log = package / BERT / "result_3.txt"
    text = re.sub(r'("key": "eval_accuracy", "value": )0\.72\d*', r"\g<1>0.7199", log.read_text())
    lines = [l for l in text.splitlines(True) if '"key": "run_stop"' not in l and '"key": "train_samples"' not in l]
    last = max(json.loads(l.split(":::MLLOG ", 1)[1])["metadata"]["epoch_num"] for l in lines
               if '"key": "eval_accuracy"' in l)
    # its budget, logged before training as tinycorp's is: the next eval would have been past it
    at = next(i for i, l in enumerate(lines) if '"key": "run_start"' in l)
    lines.insert(at, lines[at].replace('"key": "run_start", "value": null', '"key": "train_samples", "value": %d'
                                       % (last + 1000)).replace("INTERVAL_START", "POINT_IN_TIME"))
    log.write_text("".join(lines))
    s = score.score(str(package))
    assert s["steps"]["package_checker"][0] == "pass"  # what the official checker says
    s = s["systems"][0]
    verdict, kind, why = s["run_verdicts"][3]
    assert (verdict, kind, why) == ("FAIL", "not converged", "no run_stop line after its train_samples budget of %d"
                                    % (last + 1000)), s["run_verdicts"][3]
    assert s["verdict"] == "pass" and s["reasons"] == [] and 3 in s["dropped"]
    assert s["time_to_train_min"] == pytest.approx(3.5457708333, rel=1e-9)
    # (a review) the count logged at the end, the log cut before its run_stop: no budget, a log cut off; and a
    # run_stop that breaks its rule (before run_start) is no droppable run either
    log.write_text("".join(l for l in text.splitlines(True) if '"key": "run_stop"' not in l))
    assert score.run_verdict(str(log))[0][1] == "invalid"
    start = next(json.loads(l.split(":::MLLOG ", 1)[1])["time_ms"] for l in text.splitlines() if '"run_start"' in l)
    log.write_text(re.sub(r'"time_ms": \d+(, "event_type": "INTERVAL_END", "key": "run_stop")',
                          r'"time_ms": %d\1' % (start - 1000), text.replace('"status": "success"', '"status": "aborted"')))
    kind, why = score.run_verdict(str(log))[0][1:]
    assert kind == "invalid" and why.startswith("run_stop: run_stop (time_ms %d) is 1.0 s before run_start" % (start - 1000))


def test_plots_go_beside_the_package_never_into_it(package, tmp_path):
    """Issue 23/27: score wrote its PNGs into the package it scored."""
    with pytest.raises(UserError, match="inside the package"):
        score.main(["score", "--plots_dir=%s" % (package / "NVIDIA"), str(package / "NVIDIA")])
    assert score.plot_paths(str(package), None) == (str(package) + ".score_times.png",
                                                    str(package) + ".score_convergence.png")


def test_a_plot_path_taken_by_something_else_is_refused_before_the_work(package, tmp_path, capsys, monkeypatch):
    """A hostile sweep: a note at PACKAGE.score_times.png (or a directory at the convergence plot's
    path, or a --plots_dir that is a file) was found only after the official tools had run: the
    report was lost, `score --json` left stdout empty (no {verdict: error} object), and the line
    named --output, a flag score does not have. Now refused before any work, one line, exit 2."""
    monkeypatch.setattr(score, "score", lambda p: pytest.fail("scored before the plot paths were checked"))
    note = tmp_path / (package.name + ".score_times.png")
    note.write_text("my notes\n")
    plots_file = tmp_path / "plots.txt"
    plots_file.write_text("a file\n")
    cases = [([], "score: %s exists and is not a PNG, where score writes a plot: move it away, or give"
              " --plots_dir=DIR (or --noplots)" % note),
             (["--plots_dir=%s" % plots_file], "--plots_dir %s is a file: give a directory for the plots (or"
                                               " --noplots)" % plots_file)]
    for flags_, line in cases:
        with pytest.raises(UserError) as e:
            score.main(["score", "--json"] + flags_ + [str(package)])
        assert str(e.value) == line
        assert json.loads(capsys.readouterr().out) == {"verdict": "error", "error": line}
    note.unlink()
    folder = tmp_path / (package.name + ".score_convergence.png")
    folder.mkdir()
    with pytest.raises(UserError) as e:
        score.main(["score", str(package)])
    assert str(e.value) == ("score: %s is a directory, where score writes a plot: move it away, or give"
                            " --plots_dir=DIR (or --noplots)" % folder)
    assert capsys.readouterr().out == "" and plots_file.read_text() == "a file\n" and not list(folder.iterdir())
    assert not note.exists()


def test_a_package_on_a_read_only_mount_is_refused_before_the_work_naming_plots_dir(package, tmp_path, capsys,
                                                                                     monkeypatch):
    """A hostile sweep: scoring a package whose folder is read-only (a mounted results repository) ran
    the official tools, then lost the report to "output directory ... is not writable: choose another
    output path", a flag score does not have. Now refused before any work, naming --plots_dir. (As
    root no folder is read-only: os.access stands for the mount.)"""
    access = os.access

    def read_only_beside(path, mode):  # the package's folder, where its plots go
        return access(path, mode) and not (mode == os.W_OK and os.path.abspath(path) == str(tmp_path))
    monkeypatch.setattr(os, "access", read_only_beside)
    monkeypatch.setattr(score, "score", lambda p: pytest.fail("scored before the plot paths were checked"))
    line = ("score: output directory %s is not writable, where score writes its plots: give --plots_dir=DIR (or"
            " --noplots)" % tmp_path)
    with pytest.raises(UserError) as e:
        score.main(["score", "--json", str(package)])
    assert str(e.value) == line and json.loads(capsys.readouterr().out) == {"verdict": "error", "error": line}


def test_a_read_only_package_is_checked_in_a_copy_its_user_can_write(package, monkeypatch):
    """A hostile sweep as a non-root user: a package whose files and folders are read-only (a shared
    results folder, an archive's 444 files) failed the package checker ("PermissionError: ...
    scaling.json", which it writes beside each system's results), submission FAIL: the copy kept the
    modes. Root, whom permissions do not bind, scored it. (Checked on the modes, which bind users.)"""
    for p in [package, *package.rglob("*")]:
        p.chmod(0o555 if p.is_dir() else 0o444)
    unwritable = []

    def official(cwd, tool, org, extra=()):
        unwritable.extend(str(p) for p in Path(cwd, org).rglob("*") if not p.stat().st_mode & 0o200)
        return 0, ""
    monkeypatch.setattr(score, "_official", official)
    try:
        score.run_official(str(package), "NVIDIA")
    finally:
        for p in [package, *package.rglob("*")]:
            p.chmod(0o755 if p.is_dir() else 0o644)
    assert unwritable == []


def test_a_named_pipe_in_the_package_is_one_line_with_the_way_out(package):
    """A hostile sweep: a result log that is a named pipe ended score in "cannot copy package ...:
    ('SRC', '/tmp/mlperf_bert_score-PID-XXXX/...', '`SRC` is a named pipe')": a tuple's repr, naming the
    temporary copy, and no fix. Now the file, what it is and what to do; no copy is left."""
    log = package / BERT / "result_4.txt"
    log.unlink()
    os.mkfifo(log)
    with pytest.raises(UserError) as e:
        score.main(["score", "--noplots", str(package)])
    assert str(e.value) == ("cannot copy package %s: %s: is a named pipe; a package holds plain files and folders:"
                            " put the file itself there, or remove it" % (package / "NVIDIA", log))
    assert not [d for d in os.listdir(score.tempfile.gettempdir())
                if d.startswith("%s%d-" % (score._COPY_PREFIX, os.getpid()))]


@pytest.mark.parametrize("target", ["loop", ".."])
def test_symlink_loop_is_one_line(package, target):
    """Issue 23: a symlink loop gave a 51 KB message."""
    os.symlink(target, package / "NVIDIA" / "results" / "loop")
    with pytest.raises(UserError, match=r"package link .*loop -> %s .*(loop)" % re.escape(target)):
        score.score(str(package))


def test_a_link_that_leaves_the_package_is_refused(package, tmp_path):
    """A hostile sweep: a result file and a systems JSON replaced by absolute links to copies
    outside the package scored PASS (the copy the tools check follows links: the submission would
    hold dangling ones). The first link that leaves ORG/ is one line naming it."""
    org = package / "NVIDIA"
    log = next((org / "results").glob("*/bert/result_5.txt"))
    outside = tmp_path / "elsewhere.txt"
    shutil.move(str(log), str(outside))
    os.symlink(str(outside), str(log))
    with pytest.raises(UserError, match=r"^package link %s -> %s leaves the package \(%s\): a submission holds its "
                                        r"files, put the file itself there$" % (re.escape(str(log)),
                                                                               re.escape(str(outside)), re.escape(str(org)))):
        score.score(str(package))
    os.remove(log)
    os.symlink(os.path.relpath(outside, log.parent), str(log))  # relative: the same
    with pytest.raises(UserError, match="leaves the package"):
        score.score(str(package))
    os.remove(log)
    shutil.copy(str(outside), str(log.parent / "copy_of_5.txt"))
    os.symlink("copy_of_5.txt", str(log))  # a link inside the package stays allowed (the copy holds the file)
    score.check_links(str(org))


def test_the_checkers_params_never_write_outside_the_package(package, tmp_path):
    """A hostile sweep: ``log_output=/abs/PWNED.log`` in ORG/package_checker_params, and score (which
    only reads the package) wrote the official checker's log there. An option naming a file outside
    the copy the tools run in is refused (argparse takes a prefix of --log_output too); one inside,
    and the other options, are passed on as the verify script passes them."""
    params = package / "NVIDIA" / score._PARAMS
    pwned = tmp_path / "PWNED.log"
    for line in ("log_output=%s" % pwned, "log_out=../../PWNED.log", "log_output="):
        params.write_text("rcp-bypass\n" + line + "\n")
        why = "names no file for the official checker's log" if line == "log_output=" else "writes outside the package"
        with pytest.raises(UserError, match=r"^%s line 2: %s %s" % (re.escape(str(params)), re.escape(line), why)):
            score.score(str(package))
        assert not pwned.exists()
    params.write_text("rcp-bypass\nlog_output=inside.log\n")
    assert score.checker_params(str(params), str(tmp_path)) == ["--rcp-bypass", "--log_output=inside.log"]
    params.write_text("rcp-bypass\nlog_output ../../PWNED.log\n")  # its value as the next word
    with pytest.raises(UserError, match=r"line 2: log_output \.\./\.\./PWNED\.log writes outside the package"):
        score.checker_params(str(params), str(tmp_path))


def test_a_scaling_file_shipped_in_an_open_result_is_named(tmp_path):
    """A hostile sweep: results/SYS/bert/scaling.json {"scaling_factor": 0.25} in an open-division
    copy of nyx's package: the official summarizer gave 0.8731 minutes for 3.4923 (the checker makes
    or removes the file for a closed result's RCP check only), and score passed it without a word."""
    bert = tmp_path / "ORG" / "results" / "SYS" / "bert"
    bert.mkdir(parents=True)
    desc = {"submitter": "ORG", "division": "open", "status": "Available on-premise"}
    assert not any("scaling.json" in w for w in score.identity_reasons(str(tmp_path), "ORG", "SYS", desc, [])[1])
    (bert / "scaling.json").write_text('{"scaling_factor": 0.25}')
    warned = score.identity_reasons(str(tmp_path), "ORG", "SYS", desc, [])[1]
    assert "ORG/results/SYS/bert/scaling.json in an open-division result: the result summarizer multiplies its " \
           "time by the file's scaling_factor" in " ".join(warned)
    closed = dict(desc, division="closed")  # the checker's own, made or removed by its RCP check
    assert not any("scaling.json" in w for w in score.identity_reasons(str(tmp_path), "ORG", "SYS", closed, [])[1])


# MLCommons' verify_for_v5.0_training.sh builds the checker's options so (its loop as written there),
# then passes them unquoted: bash itself reads the lines and splits the words
VERIFY_LOOP = """P=""
while IFS= read -r line
do
  P="$P --$line"
done < "$1"
printf '%s\\n' $P"""


@pytest.mark.parametrize("text", ["rcp-bypass\n", "rcp-bypass", "rcp-bypass \n", "\nrcp-bypass\n",
                                  "rcp-bypass\r\n", "rcp-bert-train-samples  seed-checker-bypass\n\t\n",
                                  "rcp-bypass\nlog_output=x.log", "log_output *.log\nrcp-by[p]ass\n"], ids=repr)
def test_the_checkers_options_are_the_verify_scripts_words(tmp_path, text, capsys):
    """A hostile sweep: score read every line of package_checker_params, stripped, blank ones
    skipped; the verify script's read drops a last line without its newline, and its unquoted
    expansion splits at blanks and passes an empty line as a bare `--`. On a package whose runs fail
    the RCP check, `rcp-bypass` without a newline scored PASS where the script fails it, a blank first
    line too (the script's checker stops: unrecognized arguments), and `rcp-bypass ` failed where
    the script passes it. The options are now the words bash gives the script's loop."""
    params = tmp_path / "package_checker_params"
    params.write_bytes(text.encode())
    for name in ("b.log", "a.log", ".hidden.log"):  # bash expands an unquoted pattern where the tools run
        (tmp_path / name).write_text("")
    words = subprocess.run(["bash", "-c", VERIFY_LOOP, "loop", str(params)], capture_output=True, cwd=tmp_path,
                           check=True).stdout.decode().split("\n")[:-1]  # (bytes: a word's \r kept)
    assert score.checker_params(str(params), str(tmp_path)) == [w for w in words if w]
    warned = capsys.readouterr().err
    assert ("has no newline, and the verify script's read leaves it out" in warned) == (not text.endswith("\n"))


def test_sigkill_leaves_no_official_tool_running_and_no_copy(package, tmp_path):
    """Issue 23: a SIGKILLed score left result_summarizer running and its copy of the package
    in the temp folder; the tools die with score, the next score removes the copy."""
    env = dict(os.environ, TMPDIR=str(tmp_path))
    tools = [tool[:15] for tool, _ in score.STEPS]
    child = None
    for _attempt in range(3):  # a tool may end between being seen and being stopped: catch the next one
        proc = subprocess.Popen([sys.executable, "-m", "mlperf_bert", "score", "--noplots", str(package)],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        child = _stop_a_child(proc, tools)
        if child is not None:
            break
        proc.wait()
    assert child is not None, "score never started an official tool that could be stopped"
    started = start_time(child)  # (stopped: alive until its parent's death ends it)
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 60

    def still():  # the tool, not a later process given its pid
        return alive(child) and start_time(child) == started
    while still() and time.monotonic() < deadline:
        time.sleep(0.05)
    if still():
        os.kill(child, signal.SIGKILL)
        pytest.fail("the official tool outlived score")
    copies = list(tmp_path.glob("mlperf_bert_score-*"))
    assert copies  # SIGKILL skips every cleanup ...
    assert sorted(score.remove_stale_copies(str(tmp_path))) == sorted(str(c) for c in copies)  # ... the next run's
    assert not list(tmp_path.glob("mlperf_bert_score-*"))


def test_the_forked_tool_says_what_python_m_says(package):
    """score runs each official tool in a child it forks, as `python -m` runs it: the same output and
    exit status as the tool's own process (repo_checker: a pass, a fail, a usage error), though this
    process has pytest's log handlers and its output captured."""
    import logging
    assert logging.getLogger().handlers  # pytest's: the tool's basicConfig must not find them
    said = []
    for extra in ([], [], ["--no_such_flag"]):
        if len(said) == 1:
            (package / "NVIDIA" / "results" / NYX / "bert" / "a name").write_text("")  # git-unfriendly
        forked = score._official(str(package), "repo_checker", "NVIDIA", extra)
        proc = subprocess.run([sys.executable, "-m", "mlperf_logging.repo_checker", "NVIDIA", "training",
                               score.RULESET] + extra, cwd=package, capture_output=True, text=True)
        assert forked == (proc.returncode, proc.stdout + proc.stderr)
        said.append(forked)
    assert "ALL CHECKS PASSED" in said[0][1] and "CHECKS FAILED" in said[1][1] and "a name" in said[1][1]
    assert said[2][0] == 2 and "unrecognized arguments: --no_such_flag" in said[2][1]


A_SIGTERM_TO_THE_TOOL_AS_IT_STARTS = """\
import os, signal, sys, time
from mlperf_bert import errors
from mlperf_bert.harness import score

parent = os.getpid()


def library_hook():  # another library's after-fork hook, in the tool's child
    if os.getpid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)  # to the tool's process alone, as it starts (ps names it)
        start = time.monotonic()
        while time.monotonic() - start < 0.5 and not getattr(errors, "_held", ()):
            pass  # a handler that runs here raises (dropped) or holds it


os.register_at_fork(after_in_child=library_hook)
errors.install_sigterm_handler()
print(score._official(sys.argv[1], "repo_checker", "org")[0])  # (the tool whose import takes no second)
"""


def test_a_sigterm_to_the_official_tool_as_it_starts_ends_it(tmp_path):
    """A review: a SIGTERM to score's forked tool while its child ran its fork hooks found score's own
    handler there, whose raise Python drops (or holds, never to be raised): the tool ignored it and
    ran to its end. The child starts with the stop signals blocked until SIGTERM is its default
    action, as a new interpreter's: it ends by the signal."""
    proc = subprocess.run([sys.executable, "-c", A_SIGTERM_TO_THE_TOOL_AS_IT_STARTS, str(tmp_path)],
                          capture_output=True, text=True, timeout=120, env=dict(os.environ, PYTHONPATH=pkg_mod.ROOT))
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "%d\n" % -signal.SIGTERM, "")


def _stop_a_child(proc, comms):
    """SIGSTOP a child of proc named in comms, seen stopped ('T'): it cannot finish on its own, only
    its parent's death may end it. None when proc ended first."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        for pid in children(proc.pid):
            try:
                with open("/proc/%d/comm" % pid) as f:
                    if f.read().strip() not in comms:
                        continue
                os.kill(pid, signal.SIGSTOP)
            except (FileNotFoundError, ProcessLookupError):
                continue
            for _ in range(100):  # the stop is delivered asynchronously
                now = state(pid)
                if now not in ("R", "S", "D"):
                    break
                time.sleep(0.01)
            if now == "T":  # not ended (gone or a zombie) before the stop
                return pid
        time.sleep(0.05)
    return None


# package: names, unfinished runs (issue 23); the systems JSON and the identity of the runs, MANIFEST.txt, a kill (issue 31, 33)
from mlperf_bert.harness import package as pkg_mod  # noqa: E402


NYX = "nyx_n1_ngc25.04_pytorch"
# the vendored packages hold no code (tests/data/README.md): published, so a warning, not a failure
NO_CODE = ("NVIDIA/benchmarks/bert/implementations holds no implementation: MLCommons' review does not accept"
           " results without the code that made them (the official tools do not check it); add it before submitting")
NYX_PLATFORM = "1xNVIDIA HGX B200"  # what NVIDIA's logs name: neither the folder nor the system_name


@pytest.fixture
def two_runs(package, tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    for i in (0, 1):
        (runs / ("result_%d.txt" % i)).write_bytes((package / BERT / ("result_%d.txt" % i)).read_bytes())
    return runs


# "sys\n": a name ending in a newline ("$" of the name's pattern matched before it; a hostile sweep)
@pytest.mark.parametrize("flag,value", [("system", "../../x"), ("org", ""), ("system", "a/b"), ("org", ".."),
                                        ("system", "sys\n"), ("org", "Org\n")])
def test_package_names_stay_inside_the_output(two_runs, tmp_path, flag, value):
    argv = {"org": "Org", "system": "sys"}
    argv[flag] = value
    with pytest.raises(UserError, match="--%s=" % flag):
        pkg_mod.main(["package", "--org=%s" % argv["org"], "--system=%s" % argv["system"],
                      "--runs=%s" % two_runs, "--output=%s" % (tmp_path / "out" / "pkg")])
    assert not (tmp_path / "out").exists() and not (tmp_path / "x").exists()


@pytest.mark.parametrize("flag,size,fits", [("system", 232, 231), ("org", 243, 242)])
def test_package_names_too_long_for_the_files_made_of_them_are_one_line(two_runs, tmp_path, flag, size, fits):
    """A hostile sweep: --system of 232 bytes was "cannot use OUT/.NVIDIA.tmp-3816/systems/SYS.json.tmp-3816:
    file name too long" (inside the build folder, about a temporary), --org of 243 the same of .ORG.tmp-PID."""
    argv = {"org": "Org", "system": "sys"}
    argv[flag] = "n" * size
    with pytest.raises(UserError) as e:
        pkg_mod.main(["package", "--org=%s" % argv["org"], "--system=%s" % argv["system"],
                      "--runs=%s" % two_runs, "--output=%s" % (tmp_path / "out" / "pkg")])
    assert str(e.value).startswith("--%s %s: its name is %d bytes, too long for " % (flag, "n" * size, size))
    assert str(e.value).endswith("(a file name may have 255 bytes): give a name of at most %d bytes" % fits)
    assert not (tmp_path / "out").exists()


def test_a_runs_folder_named_with_a_comma_is_said_with_the_quotes_that_give_it(two_runs, tmp_path):
    """A hostile sweep: --runs=DIR/runs,1 (a folder of that name) was "--runs: DIR/runs does not exist: give a
    run's log or folder", though the folder given does: absl splits the list at each ',' outside double quotes."""
    runs = str(two_runs.rename(tmp_path / "runs,1"))
    argv = [a for a in nyx_argv(two_runs, tmp_path / "pkg") if not a.startswith("--runs=")]
    with pytest.raises(UserError) as e:
        pkg_mod.main(argv + ["--runs=" + runs])
    assert str(e.value) == ("--runs: %s does not exist; %s does, but --runs is split at each ',' outside double "
                            "quotes: quote it, --runs='\"%s\"'" % (tmp_path / "runs", runs, runs))
    assert not (tmp_path / "pkg").exists()
    assert pkg_mod.main(argv + ['--runs="%s"' % runs]) == 0


def test_a_missing_run_after_a_quoted_one_with_a_comma_is_not_said_to_need_quotes(two_runs, tmp_path):
    """A hostile review: --runs='"DIR/runs,1"',DIR/nope (the first quoted, and found) said "DIR/nope does not
    exist; DIR/runs,1 does, but --runs is split at each ',' ...: quote it": the quoted item's ',' shifted the
    missing one's place among the pieces."""
    runs = str(two_runs.rename(tmp_path / "runs,1"))
    argv = [a for a in nyx_argv(two_runs, tmp_path / "pkg") if not a.startswith("--runs=")]
    with pytest.raises(UserError) as e:
        pkg_mod.main(argv + ['--runs="%s",%s' % (runs, tmp_path / "nope")])
    assert str(e.value) == "--runs: %s does not exist: give a run's log or folder" % (tmp_path / "nope")


def test_one_run_given_twice_or_a_seed_reused_is_warned(two_runs, tmp_path, capsys):
    """A hostile sweep: result_01.txt a copy of result_1.txt packaged with no word (--runs=runs,runs
    is refused: test_package_refuses_a_run_named_twice_and_an_output_among_its_runs); score then failed it ("Seed checker failed"). package warns, naming the copies. Another:
    two runs of one seed (other bytes) were compared by their md5 alone: no word, score failed them.
    A log over the repo checker's 50 MiB is warned of too (it was packaged without a word)."""
    from mlperf_bert.harness.compliance import read_log
    seed = [r.value for r in read_log(str(two_runs / "result_1.txt")) if r.key == "seed"][-1]
    (two_runs / "result_01.txt").write_bytes((two_runs / "result_1.txt").read_bytes())
    assert pkg_mod.main(nyx_argv(two_runs, tmp_path / "pkg")) == 0
    lines = [l for l in capsys.readouterr().err.splitlines() if "share seed" in l]
    assert len(lines) == 1 and lines[0].endswith(" share seed %s: the official package checker fails a package whose "
                                                 "runs share a seed (give each run once, each with its own seed)" % seed)
    assert sorted(lines[0][len("warning: package: "):].split(" share ")[0].split(" and ")) == [
        str(two_runs / "result_01.txt"), str(two_runs / "result_1.txt")]
    # the same seed in another log (its own bytes): its time lines changed, its seed kept
    text = (two_runs / "result_1.txt").read_text()
    (two_runs / "result_01.txt").write_text(text.replace('"time_ms": 1', '"time_ms": 2'))
    assert (two_runs / "result_01.txt").read_bytes() != (two_runs / "result_1.txt").read_bytes()
    with open(two_runs / "result_01.txt", "a") as f:  # and past 50 MiB (lines the checkers skip)
        f.write(("# %s\n" % ("x" * 1000)) * (51 * 1024))
    assert pkg_mod.main(nyx_argv(two_runs, tmp_path / "pkg2")) == 0
    err = capsys.readouterr().err
    assert " share seed %s: the official package checker fails" % seed in err
    assert "warning: package: %s is over 50 MiB: the official repo checker fails a package holding a file that " \
           "large" % (two_runs / "result_01.txt") in err


def test_more_than_one_run_that_did_not_converge_is_warned(two_runs, tmp_path, capsys):
    """A hostile sweep of the training rules ("A benchmark result is invalid if there is more than one
    non-converging run"): package made a package of two such runs without a word, which score fails.
    One such run is allowed (dropped as the slowest): nothing said."""
    for n in (0, 1):
        log = two_runs / ("result_%d.txt" % n)
        text = re.sub(r'("key": "eval_accuracy", "value": )0\.7[2-9]\d*', r"\g<1>0.71", log.read_text())
        log.write_text(text.replace('"status": "success"', '"status": "aborted"'))
        assert pkg_mod.main(nyx_argv(two_runs, tmp_path / ("pkg%d" % n))) == 0
        lines = [l for l in capsys.readouterr().err.splitlines() if "did not converge" in l]
        assert lines == ([] if n == 0 else [
            "warning: package: 2 runs did not converge (result_0.txt, result_1.txt): the training rules ('Benchmark"
            " Results') make a result with more than one non-converging run invalid, and score fails this package"])


def test_a_run_that_logged_no_cache_flush_is_warned(two_runs, tmp_path, capsys):
    """A hostile sweep of the training rules ("You must flush the cache or restart the system prior to
    benchmarking"): a log saying cache_clear false (the trainer run without start_training.sh's drop) was
    packaged without a word; the official tools ask only that the key is there."""
    assert pkg_mod.main(nyx_argv(two_runs, tmp_path / "pkg0")) == 0
    assert "cache_clear" not in capsys.readouterr().err  # NVIDIA's logs say true
    log = two_runs / "result_1.txt"
    log.write_text(log.read_text().replace('"key": "cache_clear", "value": true', '"key": "cache_clear", "value": false'))
    assert pkg_mod.main(nyx_argv(two_runs, tmp_path / "pkg1")) == 0
    assert "warning: package: 1 run (result_1.txt) logged no cache_clear true: the training rules ('Data State at" \
           " Start of Run') ask for the cache flushed or the system restarted before each run" in capsys.readouterr().err


def test_an_org_folder_on_another_file_system_is_refused_before_the_build(two_runs, tmp_path, monkeypatch):
    """A storage sweep: ORG/ a symbolic link to another mount (the organization's submission folder
    kept on shared storage): package built beside it and renamed its pieces in, OSError EXDEV, a
    traceback, a half-made move left in ORG/. It is refused in one line naming the --output to give.
    (The other mount here: st_dev told apart for the paths under it.)"""
    other = tmp_path / "mnt2"
    (other / "NVIDIA").mkdir(parents=True)
    out = tmp_path / "pkg"
    out.mkdir()
    (out / "NVIDIA").symlink_to(other / "NVIDIA")
    real_stat = os.stat

    def stat(path, *a, **kw):
        st = real_stat(path, *a, **kw)
        if isinstance(path, (str, os.PathLike)) and os.path.realpath(path).startswith(str(other)):
            extra = {k: getattr(st, k) for k in ("st_atime", "st_mtime", "st_ctime", "st_atime_ns", "st_mtime_ns",
                                                 "st_ctime_ns", "st_blksize", "st_blocks", "st_rdev")}
            return os.stat_result(tuple(st)[:2] + (st.st_dev + 1,) + tuple(st)[3:], extra)
        return st
    monkeypatch.setattr(os, "stat", stat)
    with pytest.raises(UserError) as e:
        pkg_mod.main(nyx_argv(two_runs, out))
    assert str(e.value) == ("%s is on another file system than --output %s (a symbolic link to %s): package builds in "
                            "--output and renames the package into ORG/, which cannot cross file systems; give "
                            "--output=%s (where %s is)" % (out / "NVIDIA", out, other / "NVIDIA", other,
                                                           other / "NVIDIA"))
    assert os.listdir(other / "NVIDIA") == [] and os.listdir(out) == ["NVIDIA"]


def test_an_org_folder_bind_mounted_from_its_own_file_system_is_refused_before_the_build(two_runs, tmp_path,
                                                                                        monkeypatch):
    """A hostile review: ORG/ a bind mount of the same file system (docker run -v /shared/NVIDIA:/out/NVIDIA:
    the same st_dev) passed the st_dev check; the rename of the first piece into it was OSError EXDEV, a
    traceback, exit 1, ORG/benchmarks and the incomplete marker left (seen with a real mount --bind). (The
    mount here: mount_point, which reads /proc/self/mountinfo, says ORG/ is one.)"""
    out = tmp_path / "pkg"
    (out / "NVIDIA").mkdir(parents=True)
    org = str(out / "NVIDIA")
    monkeypatch.setattr(pkg_mod, "mount_point", lambda p: org if os.path.realpath(p).startswith(org) else "/")
    with pytest.raises(UserError) as e:
        pkg_mod.main(nyx_argv(two_runs, out))
    assert str(e.value) == ("%s is on another mount than --output %s: package builds in --output and renames the "
                            "package into ORG/, which cannot cross mounts; %s is a mount point: mount the folder "
                            "above it instead (a container's -v of --output, not of ORG/), or give an --output on "
                            "one mount with it" % (org, out, org))
    assert os.listdir(org) == [] and os.listdir(out) == ["NVIDIA"]


def test_package_refuses_a_run_named_twice_and_an_output_among_its_runs(two_runs, tmp_path):
    """A hostile sweep: --runs=runs,runs/result_1.txt packaged result_1.txt twice (3 runs, exit 0, a
    seed warning; the official checker then fails the package), and --output=runs wrote ORG/ into the
    folder of the run logs (exit 0; check-log of that folder then read every log twice). Each is one
    line now, nothing written."""
    log = two_runs / "result_1.txt"
    other = "%s/../%s/result_1.txt" % (two_runs, two_runs.name)
    argv = [a for a in nyx_argv(two_runs, tmp_path / "pkg") if not a.startswith("--runs=")]
    for runs, line in (("%s,%s" % (two_runs, log), "--runs names the run log %s twice: give each run once" % log),
                       ("%s,%s" % (log, other), "--runs names the run log %s twice (also as %s): give each run"
                                                " once" % (log, other))):
        with pytest.raises(UserError) as e:
            pkg_mod.main(argv + ["--runs=%s" % runs])
        assert str(e.value) == line
    assert not (tmp_path / "pkg").exists()
    before = sorted(p.name for p in two_runs.iterdir())
    for out in (str(two_runs), str(two_runs) + "/"):
        argv = [a for a in nyx_argv(two_runs, tmp_path / "pkg") if not a.startswith("--output=")]
        with pytest.raises(UserError) as e:
            pkg_mod.main(argv + ["--output=%s" % out])
        assert str(e.value) == ("--output %s is a folder of the run logs (--runs): the package would be written"
                                " among its inputs; give another --output" % out)
    assert sorted(p.name for p in two_runs.iterdir()) == before


def test_package_refuses_an_empty_runs_list_or_item(two_runs, tmp_path):
    """A hostile sweep: --runs= went on to "the runs' logs name divisions []", and a trailing ',' to
    "--runs:  does not exist"; each is one line saying what to give now."""
    argv = [a for a in nyx_argv(two_runs, tmp_path / "pkg") if not a.startswith("--runs=")]
    for runs, why in (("", "--runs names no run: give the runs' logs or folders (result_*.txt, mlperf.log, run_*/),"
                           " separated by ','"),
                      ("%s," % two_runs, "--runs has an empty item (a ',' doubled, or at an end): give each run's log"
                                         " or folder once, separated by ','")):
        with pytest.raises(UserError) as e:
            pkg_mod.main(argv + ["--runs=%s" % runs])
        assert str(e.value) == why
    assert not (tmp_path / "pkg").exists()


def test_package_refuses_a_log_without_run_stop(two_runs, tmp_path):
    log = two_runs / "result_1.txt"
    log.write_text("".join(l for l in log.read_text().splitlines(keepends=True) if '"run_stop"' not in l))
    with pytest.raises(UserError, match=r"result_1.txt has no run_stop line"):
        pkg_mod.main(["package", "--org=NVIDIA", "--system=%s" % NYX, "--runs=%s" % two_runs,
                      "--output=%s" % (tmp_path / "pkg"), "--system_json=%s" % nyx_json(two_runs.parent)])
    assert not (tmp_path / "pkg").exists()


def test_runs_and_a_package_in_folders_named_with_glob_characters_are_found(official_tools, two_runs, tmp_path):
    """A hostile sweep of paths: package --runs of a folder named "runs [0]" was "holds no result_*.txt"
    (its name read as a glob pattern), and score of a package in a folder "pkg [1]*" FAILED it: "... holds
    no result_*.txt logs", the official tools (on a copy) passing it."""
    runs = two_runs.rename(tmp_path / "runs [0]")
    assert pkg_mod.main(nyx_argv(runs, tmp_path / "pkg")) == 0
    assert sorted(p.name for p in (tmp_path / "pkg").glob("NVIDIA/results/*/bert/*")) == ["result_0.txt",
                                                                                         "result_1.txt"]
    root = (tmp_path / "submission_v5.0_NVIDIA_nyx_n1").rename(tmp_path / "pkg [1]*")
    s = score.score(str(root))["systems"][0]
    assert (s["verdict"], s["time_to_train_min"]) == ("pass", 3.5022071145), s["reasons"]


def nyx_json(package_root):
    return package_root / "submission_v5.0_NVIDIA_nyx_n1" / "NVIDIA" / "systems" / (NYX + ".json")


def nyx_argv(runs, out):
    """package's arguments for NVIDIA's runs with NVIDIA's systems JSON (out's folder holds the package)."""
    return ["package", "--org=NVIDIA", "--system=%s" % NYX, "--runs=%s" % runs, "--output=%s" % out,
            "--system_json=%s" % nyx_json(out.parent), "--platform=%s" % NYX_PLATFORM]


@pytest.mark.parametrize("field,value,kind", [
    ("status", ["Available on-premise"], "list"), ("system_name", {"a": 1}, "dict"),
    ("number_of_nodes", [1], "list"), ("accelerators_per_node", None, "null"), ("framework", [], "list")])
def test_a_systems_json_field_of_another_type_is_one_line_in_package_and_score(two_runs, tmp_path, capsys, field,
                                                                               value, kind):
    """A hostile sweep: a status that is a list ended package and score in "unhashable type: 'list'";
    a system_name that is an object, a node count in a list, a null: packaged (exit 0), then the
    official tools broke at score time. The published systems JSONs hold text (other_software_stack
    an object): anything else is one line naming the file and the field."""
    import json
    desc = json.loads(nyx_json(tmp_path).read_text())
    desc[field] = value
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(desc))
    why = "systems JSON %s: %s is a %s: give it as text (\"...\")" % (bad, field, kind)
    argv = [a for a in nyx_argv(two_runs, tmp_path / "pkg") if not a.startswith("--system_json")]
    with pytest.raises(UserError) as e:
        pkg_mod.main(argv + ["--system_json=%s" % bad])
    assert str(e.value) == why and not (tmp_path / "pkg").exists()
    if field == "status":  # a package edited after it was made: score says it, no traceback
        assert pkg_mod.main(argv + ["--system_json=%s" % nyx_json(tmp_path)]) == 0
        made = next((tmp_path / "pkg").glob("*/systems/*.json"))
        made.write_text(json.dumps(dict(json.loads(made.read_text()), status=value)))
        capsys.readouterr()
        assert score.main(["score", "--noplots", str(tmp_path / "pkg")]) == 1
        assert "  systems JSON %s: status is a list: give it as text" % made in capsys.readouterr().out


@pytest.mark.parametrize("field,value", [("number_of_nodes", "abc"), ("host_processors_per_node", "abc"),
                                         ("accelerators_per_node", "abc"), ("accelerators_per_node", "\u00b2")])
def test_a_count_that_is_no_whole_number_is_refused(two_runs, tmp_path, field, value):
    """A hostile sweep: --system_field=number_of_nodes=abc was packaged (exit 0), and score then failed
    in the official result summarizer (ValueError: invalid literal for int()); so was "²", a digit to
    str.isdigit, not to int()."""
    argv = nyx_argv(two_runs, tmp_path / "pkg")
    with pytest.raises(UserError) as e:
        pkg_mod.main(argv + ["--system_field=%s=%s" % (field, value)])
    assert str(e.value) == ("--system_field says %s=%r: give a whole number (the official result summarizer "
                            "counts with it)" % (field, value))
    assert not (tmp_path / "pkg").exists()


def test_a_systems_json_that_is_not_json_says_so(tmp_path):
    """NaN (Python's json reads it) and nesting past the parser's depth (a RecursionError traceback)."""
    for text, why in (('{"system_name": NaN}', "NaN is not a JSON value"), ("[" * 100000 + "]" * 100000,
                                                                           "JSON nested too deeply")):
        (tmp_path / "s.json").write_text(text)
        with pytest.raises(UserError, match=r"^systems JSON %s is not JSON \(%s\): fix the file$"
                                            % (re.escape(str(tmp_path / "s.json")), why)):
            pkg_mod.load_system_json(str(tmp_path / "s.json"))


def test_manifest_is_git_ls_files():
    """package copies the files MANIFEST.txt lists (no git where it runs, e.g. in the image): the
    list must be this repository's `git ls-files`."""
    if shutil.which("git") is None or not os.path.exists(os.path.join(pkg_mod.ROOT, ".git")):
        pytest.skip("not a git checkout (MANIFEST.txt is checked where git is)")
    tracked = subprocess.run(["git", "-C", pkg_mod.ROOT, "ls-files"], capture_output=True, text=True,
                             check=True).stdout.splitlines()
    with open(os.path.join(pkg_mod.ROOT, pkg_mod.MANIFEST)) as f:
        listed = f.read().splitlines()
    assert pkg_mod.MANIFEST in tracked
    assert sorted(listed) == sorted(tracked), "MANIFEST.txt is not `git ls-files`: run `make manifest` and commit it"


def test_a_failed_make_manifest_keeps_the_list(tmp_path):
    """A hostile sweep: `make manifest` where `git ls-files` fails (no .git, as in the image) exited 2
    with MANIFEST.txt emptied: package then had no implementation to copy ("lists no file to package:
    remake the list with `make manifest`", which fails again there)."""
    if shutil.which("make") is None:
        pytest.skip("no make here")
    shutil.copy(os.path.join(pkg_mod.ROOT, "Makefile"), str(tmp_path))
    (tmp_path / pkg_mod.MANIFEST).write_text("Makefile\n")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "git").write_text("#!/bin/sh\necho 'fatal: not a git repository' >&2\nexit 128\n")
    os.chmod(str(tmp_path / "bin" / "git"), 0o755)
    env = dict(os.environ, PATH="%s:%s" % (tmp_path / "bin", os.environ["PATH"]))
    proc = subprocess.run(["make", "-s", "-C", str(tmp_path), "manifest"], env=env, capture_output=True, text=True)
    assert proc.returncode != 0 and "not a git repository" in proc.stderr
    assert sorted(os.listdir(str(tmp_path))) == sorted(["Makefile", pkg_mod.MANIFEST, "bin"])  # no temporary left
    assert (tmp_path / pkg_mod.MANIFEST).read_text() == "Makefile\n"


def test_nvidias_runs_repackaged_with_their_systems_json_are_the_published_package(package, tmp_path, capsys):
    """The real v5.0 package: its ten logs and NVIDIA's own systems JSON through package give the
    published results and description (and the implementation: every file of MANIFEST.txt)."""
    runs = package / BERT
    out = tmp_path / "pkg"
    assert pkg_mod.main(nyx_argv(runs, out)) == 0
    top = out / "NVIDIA"
    for i in range(10):
        name = "result_%d.txt" % i
        assert (top / "results" / NYX / "bert" / name).read_bytes() == (runs / name).read_bytes()
    assert json.loads((top / "systems" / (NYX + ".json")).read_text()) == json.loads(nyx_json(tmp_path).read_text())
    impl = top / "benchmarks" / "bert" / "implementations" / "pytorch"
    copied = sorted(str(p.relative_to(impl)) for p in impl.rglob("*") if p.is_file())
    assert copied == sorted(pkg_mod.source_files() + [pkg_mod.launch_name(NYX)])
    assert {"configs/presets/rcp.sh", "mlperf_bert/dataset/_fasttok.c", "Makefile", "train_model.sh",
            "configs/bert_config_large.json"} <= set(copied)
    assert not [p for p in copied if p.startswith("tests/data/")]
    assert sorted(os.listdir(out)) == ["NVIDIA"]  # the build folder went with the rename
    assert "left empty in systems/%s.json" % NYX in capsys.readouterr().out  # as NVIDIA left them


@pytest.mark.parametrize("change,flags_,match", [
    (('"submission_org", "value": "NVIDIA"', '"submission_org", "value": "ACME"'), [],
     r"result_1.txt: submission_org 'ACME', the package's submitter is 'NVIDIA'"),
    (('"submission_status", "value": "onprem"', '"submission_status", "value": "cloud"'), [],
     r"result_1.txt: submission_status 'cloud', the systems JSON's status 'Available on-premise' needs 'onprem'"),
    (('"submission_platform", "value": "1xNVIDIA HGX B200"', '"submission_platform", "value": "cpu"'), [],
     r"result_1.txt: submission_platform 'cpu', the package's system is '1xNVIDIA HGX B200'"),
    (None, ["--platform="], r"2 logs \(result_0.txt, result_1.txt\): submission_platform '1xNVIDIA HGX B200',"
     r" the package's system is 'nyx_n1_ngc25.04_pytorch' or 'Nyx \(1x NVIDIA DGX B200\)' \(--platform="),
    (None, ["--status=Research, Development, or Internal (RDI)"], r"--status=Research.* but .* says status="),
    (None, ["--system_field=status=Available cloud"], r"2 logs .*submission_status 'onprem', .*'Available cloud'"),
    (None, ["--system_field=division=open"], r"says division='open', but the package is closed"),
    # a hostile sweep: "divisions ['closed', 'open']" named neither log ('None' for one without the line)
    (('"submission_division", "value": "closed"', '"submission_division", "value": "open"'), [],
     r"^the runs' logs name no one division \(closed: \S+/result_0.txt; open: \S+/result_1.txt\): a package holds"
     r" runs of one division \(leave the others out of --runs\)$"),
    (None, ["--system_field=cooling"], r"--system_field=cooling: give KEY=VALUE"),
    (None, ["--system_field=accelerator_model_name="], r"needs accelerator_model_name: give them in --system_json"),
    # a hostile sweep: one run of another learning rate was packaged, and scored, without a word
    (('"opt_base_learning_rate", "value": 0.00096', '"opt_base_learning_rate", "value": 0.5'), [],
     r"the logs' opt_base_learning_rate differs: 0.00096 in result_0.txt; 0.5 in result_1.txt; the runs of a "
     r"result share their hyperparameters \(package runs of one setting\)"),
])
def test_package_refuses_runs_that_are_not_the_packages_system(two_runs, tmp_path, change, flags_, match):
    """Issue 31: package took logs of org mlperf_bert-demo, platform cpu as ACME's h100x8 without a word."""
    if change:
        log = two_runs / "result_1.txt"
        assert change[0] in log.read_text()
        log.write_text(log.read_text().replace(*change))
    argv = nyx_argv(two_runs, tmp_path / "pkg")
    if flags_ == ["--platform="]:
        argv = argv[:-1]
    else:
        argv += flags_
    with pytest.raises(UserError, match=match):
        pkg_mod.main(argv)
    assert not (tmp_path / "pkg" / "NVIDIA").exists()


def test_package_needs_a_system_description_and_says_which_fields(two_runs, tmp_path, capsys):
    argv = nyx_argv(two_runs, tmp_path / "pkg")
    with pytest.raises(UserError, match=r"needs the system the runs ran on: --system_json=FILE.*nothing is read"
                                        r" from the machine"):
        pkg_mod.main([a for a in argv if not a.startswith("--system_json")])
    bad = tmp_path / "bad.json"
    bad.write_text('{"submitter": "NVIDIA",')
    with pytest.raises(UserError, match=r"systems JSON .*bad.json is not JSON"):
        pkg_mod.main(argv + ["--system_json=%s" % bad])
    with pytest.raises(SystemExit):
        pkg_mod.main(["package", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    for field in pkg_mod.SYSTEM_FIELDS:  # every field the official checker requires, and the two flags
        assert field in help_text.replace("on- chip", "on-chip"), field
    assert "--status: <Available on-premise|" in help_text and "--nodes: number of nodes" in help_text


def _killed_at(argv, owner, name, nth):
    """Run package in a forked child that SIGKILLs itself as it calls ``owner.name`` (shutil.copy2: a
    source file copied; os.rename: the build, or its pieces, moved into place) the ``nth`` time."""
    import multiprocessing

    def child():
        real, n = getattr(owner, name), [0]

        def dying(*a, **k):
            n[0] += 1
            if n[0] == nth:
                os.kill(os.getpid(), signal.SIGKILL)
            return real(*a, **k)
        setattr(owner, name, dying)
        pkg_mod.main(argv)
    p = multiprocessing.get_context("fork").Process(target=child)
    p.start()
    p.join(60)
    assert p.exitcode == -signal.SIGKILL


def _killed_at_copy(argv, after):
    _killed_at(argv, shutil, "copy2", after + 1)


def test_package_killed_midway_leaves_nothing_the_rerun_trips_on(package, tmp_path, capsys):
    """Issue 33: a SIGKILLed package left ten result files without systems/ or source, and the same
    command was then refused ("already holds results")."""
    out = tmp_path / "pkg"
    argv = nyx_argv(package / BERT, out)
    _killed_at_copy(argv, 20)
    assert not (out / "NVIDIA").exists()  # nothing half-made where score would look
    # the dead build (and the dead holder's lock of --output, which the rerun takes over)
    left = sorted(p.name for p in out.iterdir() if p.name != locking.DIR_LOCK_NAME)
    assert len(left) == 1 and left[0].startswith(".NVIDIA.tmp-"), left
    assert pkg_mod.main(argv) == 0  # the same command: removes the dead build, makes the package
    assert sorted(os.listdir(out)) == ["NVIDIA"]
    assert len(list((out / "NVIDIA" / "results" / NYX / "bert").iterdir())) == 10
    assert score.find_org(str(out)) == (str(out), "NVIDIA")
    with pytest.raises(UserError, match="already holds a package of %s" % NYX):
        pkg_mod.main(argv + ["--system_field=hw_notes=other"])  # a complete package is not replaced
    # a second system into the same ORG/, killed while its pieces were moved in: the rerun redoes it
    real_rename = os.rename
    calls = []

    def child_rename(a, b):
        calls.append(b)
        if len(calls) == 3:  # the implementation and the systems JSON moved in, not the results
            os.kill(os.getpid(), signal.SIGKILL)
        return real_rename(a, b)
    second = [a.replace("--system=%s" % NYX, "--system=nyx2") for a in argv]
    import multiprocessing
    p = multiprocessing.get_context("fork").Process(target=lambda: (setattr(os, "rename", child_rename),
                                                                    pkg_mod.main(second)))
    p.start()
    p.join(60)
    assert p.exitcode == -signal.SIGKILL
    assert (out / "NVIDIA" / "systems" / "nyx2.json").exists() and not (out / "NVIDIA" / "results" / "nyx2").exists()
    assert pkg_mod.main(second) == 0
    assert len(list((out / "NVIDIA" / "results" / "nyx2" / "bert").iterdir())) == 10
    assert not [p for p in os.listdir(out / "NVIDIA") if p.startswith(".")]
    assert sorted(os.listdir(out)) == ["NVIDIA"]
    # issue 47: one implementation folder for both systems, a launch record each
    impl = out / "NVIDIA" / "benchmarks" / "bert" / "implementations"
    assert os.listdir(impl) == ["pytorch"]
    assert {NYX: "pytorch", "nyx2": "pytorch"} == pkg_mod.read_made_by(str(out / "NVIDIA"))
    assert (impl / "pytorch" / pkg_mod.launch_name(NYX)).exists() and (impl / "pytorch" / "launch_nyx2.json").exists()


def test_a_file_or_link_where_package_makes_a_folder_is_refused_before_anything_moves(two_runs, tmp_path):
    """A hostile sweep: ORG/systems a symbolic link to another folder: package wrote the systems JSON
    there (exit 0; score then refused the link that leaves the package); ORG/results a file: package
    failed half-way through its move, the implementation and systems JSON in, a marker left."""
    top = tmp_path / "pkg" / "NVIDIA"
    top.mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (top / "systems").symlink_to(elsewhere)
    for name, kind in (("systems", "a symbolic link"), ("results", "a file")):
        if name == "results":
            (top / "systems").unlink()
            (top / "results").write_text("x")
        with pytest.raises(UserError) as e:
            pkg_mod.main(nyx_argv(two_runs, tmp_path / "pkg"))
        assert str(e.value) == "%s is %s, not a folder: package puts %s in it; move it away or choose another" \
            " --output" % (top / name, kind, top / name / (NYX + ("" if name == "results" else ".json")))
        assert os.listdir(top) == [name] and not os.listdir(elsewhere)


def test_package_stopped_once_it_had_finished_is_rerun_to_nothing_to_do(package, tmp_path, monkeypatch, capsys):
    """A SIGTERM or Ctrl-C that lands after package moved its package into place (a new ORG/ renamed
    in; a second system moved in and its marker removed) ends it with "terminated ...: rerun the same
    command to go on"; the rerun was refused: "already holds a package of SYSTEM (...): remove ... or
    choose another --output", a complete package to be thrown away. The same command, making the same
    bytes, says that ORG/ holds it and exits 0, writing nothing; another package of the system is still
    refused."""
    out = tmp_path / "pkg"
    argv = nyx_argv(package / BERT, out)
    second = [a.replace("--system=%s" % NYX, "--system=nyx2") for a in argv]
    org = out / "NVIDIA"

    def files():
        return {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    rename, remove = os.rename, os.remove

    def rename_then_stop(a, b):
        rename(a, b)
        if b == str(org):  # the build is ORG/ now: the package is complete
            raise KeyboardInterrupt

    def remove_then_stop(path):
        remove(path)
        if str(path).endswith(".package-nyx2.incomplete"):  # nyx2's move is complete
            raise KeyboardInterrupt
    for args, stop in ((argv, ("rename", rename_then_stop)), (second, ("remove", remove_then_stop))):
        with monkeypatch.context() as m:
            m.setattr(os, *stop)
            with pytest.raises(KeyboardInterrupt):
                pkg_mod.main(args)
        system = args[2][len("--system="):]
        made = files()
        assert (org / "results" / system / "bert" / "result_9.txt").exists() and not [
            n for n in os.listdir(out) if n.startswith(".NVIDIA")]
        capsys.readouterr()
        assert pkg_mod.main(args) == 0
        assert ("package %s: %s already holds this package of %s, byte for byte (a package stopped once it had"
                " finished, rerun): nothing to do" % (out, org, system)) in capsys.readouterr().out.splitlines()
        assert files() == made and not [n for n in os.listdir(out) if n.startswith(".NVIDIA")]
        with pytest.raises(UserError, match=r"^%s already holds a package of %s \(" % (re.escape(str(org)), system)):
            pkg_mod.main(args + ["--system_field=hw_notes=other"])
        assert files() == made
    assert {NYX: "pytorch", "nyx2": "pytorch"} == pkg_mod.read_made_by(str(org))


def _killed_at_rename(argv, nth):
    _killed_at(argv, os, "rename", nth)


def test_score_of_a_package_stopped_midway_names_the_package_command_to_rerun(package, tmp_path):
    """A package SIGKILLed while it moved a second system into ORG/ (its systems JSON and launch record
    there, its results not) was scored: the official repo checker failed on the marker
    ORG/.package-SYSTEM.incomplete, "Files with git-unfriendly name ... make sure they do not start
    with '.'" (removing it leaves half a system). Killed before the move: score said the output "is
    not a submission package", or scored ORG/ without the system being added. Each is one line naming
    the package command to rerun, before any official tool runs."""
    out = tmp_path / "pkg"
    argv = nyx_argv(package / BERT, out)
    _killed_at_copy(argv, 20)  # a new ORG/: its build only
    build = next(p for p in out.iterdir() if p.name.startswith(".NVIDIA.tmp-"))
    with pytest.raises(UserError) as e:
        score.main(["score", "--noplots", str(out)])
    assert str(e.value) == (
        "%s holds the unfinished build of NVIDIA's package of %s (%s: a package command was stopped before it"
        " moved the package into place, or is still running): rerun that package command, which finishes it,"
        " then score (or remove %s)" % (out, NYX, build, build))
    assert pkg_mod.main(argv) == 0 and score.find_org(str(out)) == (str(out), "NVIDIA")
    second = [a.replace("--system=%s" % NYX, "--system=nyx2") for a in argv]
    _killed_at_copy(second, 20)  # into the existing ORG/: nyx2's build beside it
    build = next(p for p in out.iterdir() if p.name.startswith(".NVIDIA.tmp-"))
    for given in (out, out / "NVIDIA"):
        with pytest.raises(UserError, match=r"^%s holds the unfinished build of NVIDIA's package of nyx2 \(%s: "
                           % (re.escape(str(out)), re.escape(str(build)))):
            score.main(["score", "--noplots", str(given)])
    _killed_at_rename(second, 3)  # the launch record and systems JSON moved in, not the results
    org = out / "NVIDIA"
    assert (org / "systems" / "nyx2.json").exists() and not (org / "results" / "nyx2").exists()
    marker = org / ".package-nyx2.incomplete"
    for given in (out, org):
        with pytest.raises(UserError) as e:
            score.main(["score", "--noplots", str(given)])
        assert str(e.value) == (
            "%s holds the unfinished package of nyx2 (%s: a package command was stopped while it moved the system"
            " in, or is still running): rerun that package command, which finishes it, then score" % (org, marker))
    assert pkg_mod.main(second) == 0  # the rerun finishes it: score takes the package again
    assert score.find_org(str(out)) == (str(out), "NVIDIA") and score.find_org(str(org)) == (str(out), "NVIDIA")


def test_a_marker_package_did_not_write_is_refused_not_followed(package, tmp_path):
    """A hostile sweep: a rerun removed every path its marker of an unfinished move
    (ORG/.package-SYSTEM.incomplete) listed, whatever the line: ``../../victim`` deleted a folder
    outside the package (exit 0), a blank line deleted ORG/ itself, with every system in it. Each line
    must be a part that a package of that system adds; and no system is packaged into an ORG/ that
    holds another system's unfinished move (its rerun removes a new implementation folder whole)."""
    out = tmp_path / "pkg"
    argv = nyx_argv(package / BERT, out)
    assert pkg_mod.main(argv) == 0
    org = out / "NVIDIA"
    victim = tmp_path / "victim"
    victim.mkdir()

    def listing():
        return sorted(str(p.relative_to(org)) for p in org.rglob("*") if not p.name.endswith(".incomplete"))
    before = listing()
    second = [a.replace("--system=%s" % NYX, "--system=nyx2") for a in argv]
    marker = org / ".package-nyx2.incomplete"
    for text in ("../../victim\n", "\n", "results/%s\n" % NYX, "systems/nyx2.json\n../../victim\n", "",
                 "benchmarks/bert/implementations/..\n", "benchmarks/bert/implementations/pytorch/x\n",
                 # (another sweep) the implementation folder whole, a part of nyx2's move only were it new: here
                 # it holds NYX's code and launch record, which the rerun deleted (score then said nothing)
                 "benchmarks/bert/implementations/pytorch\nsystems/nyx2.json\nresults/nyx2\n"):
        marker.write_text(text)
        with pytest.raises(UserError, match=r"^%s (lists .*, not a part of %s that package adds there( \(the "
                           r"implementation of %s too, in mlperf_bert_package.json\))?|lists nothing)"
                           r": package did not write this marker; check %s by hand and remove the marker$"
                           % (re.escape(str(marker)), re.escape(str(org)), re.escape(NYX), re.escape(str(org)))):
            pkg_mod.main(second)
        assert victim.is_dir() and listing() == before, text
    # a marker as package writes it, of nyx2's pieces: another system waits for its rerun
    marker.write_text("systems/nyx2.json\nresults/nyx2\n")
    third = [a.replace("--system=%s" % NYX, "--system=nyx3") for a in argv]
    with pytest.raises(UserError, match=r"holds the unfinished package of nyx2 \(%s, .*rerun that command first"
                       % re.escape(str(marker))):
        pkg_mod.main(third)
    assert pkg_mod.main(second) == 0 and not marker.exists()  # its own rerun finishes it
    assert pkg_mod.main(third) == 0
    assert {NYX: "pytorch", "nyx2": "pytorch", "nyx3": "pytorch"} == pkg_mod.read_made_by(str(org))


def test_a_package_stopped_before_its_move_leaves_no_new_output_folder(package, tmp_path, monkeypatch):
    """A hostile sweep: a SIGTERM to package at ~0.2 s left an empty --output folder, which looks like
    a package made (score: "not a submission package"). A new --output is removed again when the
    command stops before its package is in place (here: a stop at the move); one that existed stays."""
    from mlperf_bert.errors import Terminated

    def stopped(*args):
        raise Terminated()
    monkeypatch.setattr(pkg_mod, "_move_into_place", stopped)
    out = tmp_path / "new" / "pkg"
    argv = [a if not a.startswith("--output=") else "--output=%s" % out for a in nyx_argv(package / BERT, package)]
    with pytest.raises(Terminated):
        pkg_mod.main(argv)
    assert not (tmp_path / "new").exists()
    out.mkdir(parents=True)
    with pytest.raises(Terminated):
        pkg_mod.main(argv)
    assert os.listdir(out) == []


def _summary(seeds):
    """A score() result for runs of the real nyx package's shape, with these seeds."""
    runs = [(os.path.join(BERT, "result_%d.txt" % i), seed, 2550982 + i, 3.5 + i / 10, "success")
            for i, seed in enumerate(seeds)]
    return {"runs": runs, "run_verdicts": [("PASS", "", "")] * len(runs), "dropped": [0, 1],
            "time_to_train_min": 3.6, "evals": {"result_%d.txt" % i: [(1000, 0.5), (2000, 0.72)]
                                                 for i in range(len(runs))},
            "target": 0.72, "verdict": "pass", "division": "closed", "system": None}


def test_score_table_columns_stay_in_line_with_a_long_seed():
    """Issue 33: a 9-digit seed shifted the samples, minutes and status columns of its row."""
    lines = score.run_table(_summary([27912, 123456789, 5]))
    assert len({len(line.rstrip()) for line in lines[1:]}) == 1  # the rows end alike: PASS
    for col in ("seed", "samples", "minutes"):  # right-aligned: each ends where its header does
        end = lines[0].index(col) + len(col)
        assert [line[end:end + 1] for line in lines[1:]] == [" "] * 3 and all(line[end - 1] != " " for line in lines)
    assert lines[2].split() == [os.path.join(BERT, "result_1.txt"), "123456789", "2550983", "3.6000", "success",
                                "PASS"]
    # an ordinary seed keeps the table as it was
    assert score.run_table(_summary([27912]))[1] == "%-60s %8s %12s %9s  %-8s %s" % (
        os.path.join(BERT, "result_0.txt"), 27912, 2550982, "3.5000", "success", "PASS")


def test_score_plots_have_titles(tmp_path, monkeypatch):
    """Issue 33: the score plots had no title."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    titles, save = [], Figure.savefig

    def savefig(fig, *args, **kw):
        titles.append([ax.get_title() for ax in fig.axes])
        return save(fig, *args, **kw)
    monkeypatch.setattr(Figure, "savefig", savefig)
    paths = (str(tmp_path / "t.png"), str(tmp_path / "c.png"))
    score.plot(_summary([1, 2, 3]), paths)
    assert titles == [["Time to train per run\nnyx_n1_ngc25.04_pytorch, closed division: 3 runs, submission PASS"],
                      ["Eval accuracy per run\nnyx_n1_ngc25.04_pytorch, closed division: 3 runs, submission PASS"]]
    assert all(open(p, "rb").read(4) == b"\x89PNG" for p in paths)


# ---- issue 37: every system of an organization, published packages the official tools pass

def unpack(tmp_path, *names):
    """The vendored packages tests/data/submission_v5.0_NAME.tar.gz merged into one package root
    (writable: the tests change them)."""
    root, unpacked = tmp_path / "published", tmp_path / "unpacked"
    for name in names:
        with tarfile.open(os.path.join(DATA, "submission_v5.0_%s.tar.gz" % name)) as t:
            t.extractall(unpacked, filter="data")
        src = unpacked / ("submission_v5.0_%s" % name)
        for d, _, files in os.walk(src):
            os.chmod(d, 0o755)
            for f in files:
                os.chmod(os.path.join(d, f), 0o644)
        for org in (p for p in src.iterdir() if p.is_dir()):
            shutil.copytree(org, root / org.name, dirs_exist_ok=True)
    return root


# mlperf-logging 4.1.68's result_summarizer on the vendored packages (tests/data/README.md):
# system folder -> (bert:time_to_train, bert:rcp_scaling_factor, bert:samples_to_converge)
PUBLISHED = {
    "nyx_n1_ngc25.04_pytorch": (3.5022071145250924, 1.0028470154406997, 2436995.375),
    "tyche_ngpu8_ngc25.04_pytorch": (3.424218926461085, 1.002837190745021, 2437019.25),
    "tyche_ngpu64_ngc25.04_pytorch": (0.65625, 1.0, 3300133.25),
    "tyche_ngpu512_ngc25.04_pytorch": (0.3047, 1.0, 3967072.625),
    "7920T_2xA5000_hdd": (366.18525, 1.0, 3643896.0),
    "7920T_2xA5000_ssd": (343.08845625, 1.0, 3417208.0),
    "AS-4126GS-NBR-LCC_N1": (3.576145833333333, 1.0, 2455085.5),
    "8xBM.GPU.H200.8": (0.8818416666666667, 1.0, 2976612.75),
}


def assert_published_scores(got):
    for system in got["systems"]:
        ttt, factor, samples = PUBLISHED[system["system"]]
        assert system["verdict"] == "pass", system
        assert system["time_to_train_min"] == pytest.approx(ttt, abs=1e-9), system["system"]
        assert system["rcp_scaling_factor"] == pytest.approx(factor, abs=1e-9), system["system"]
        assert system["samples_to_converge"] == samples, system["system"]


@pytest.mark.slow
def test_every_system_of_an_organization_gets_the_summarizers_time_to_train(nvidia_scored):
    """Issue 37: score NVIDIA on NVIDIA's four v5.0 systems printed one time to train (Nyx's); the
    official result summarizer gives one per system, and so does score: one block, one verdict and
    one JSON object each (Tyche 8 and 64 GPUs share a system_name: the folder tells them apart)."""
    status, stdout, out, root, before, plots = nvidia_scored
    assert status == 0, out
    got = json.loads(stdout)
    assert [s["system"] for s in got["systems"]] == [  # the four, in folder order
        "nyx_n1_ngc25.04_pytorch", "tyche_ngpu512_ngc25.04_pytorch", "tyche_ngpu64_ngc25.04_pytorch",
        "tyche_ngpu8_ngc25.04_pytorch"]
    assert [s["system_name"] for s in got["systems"]] == [
        "Nyx (1x NVIDIA DGX B200)", "Tyche (8x NVIDIA GB200 NVL72)", "Tyche (1x NVIDIA GB200 NVL72)",
        "Tyche (1x NVIDIA GB200 NVL72)"]
    assert_published_scores(got)
    assert (got["org"], got["verdict"], got["package_checker"], got["result_summarizer"], got["repo_checker"]) == (
        "NVIDIA", "pass", "pass", "pass", "pass")
    assert out.count("\n== system ") == 4 and out.count("\nsubmission: PASS\n") == 4
    for system in PUBLISHED:
        if system.startswith(("nyx", "tyche")):
            ttt = [s["time_to_train_min"] for s in got["systems"] if s["system"] == system][0]
            assert "== system %s (" % system in out and "time to train: %s minutes" % ttt in out
            assert (plots / ("%s.score_times.png" % system)).exists()
    assert "tyche_ngpu64_ngc25.04_pytorch/bert/result_4.txt" in out  # aborted: dropped, as the summarizer does
    assert "\nNVIDIA: 4 systems, 4 PASS, 0 FAIL\n" in out


@pytest.mark.slow
@pytest.mark.parametrize("name,warned", [
    # krai: systems JSON submitter 'Krai', folder 'krai', logs 'KRAI'
    ("krai", ["krai/systems/7920T_2xA5000_hdd.json: submitter 'Krai', the package's org folder is 'krai'",
              "10 logs (result_0.txt ... result_9.txt): submission_org 'KRAI', the package's submitter is 'krai'"]),
    # Supermicro's logs: the placeholders of the scripts they were made with
    ("Supermicro_AS-4126GS-NBR-LCC_N1", [
        "submission_org 'SUBMISSION_ORG_PLACEHOLDER', the package's submitter is 'Supermicro'",
        "submission_platform '1xSUBMISSION_PLATFORM_PLACEHOLDER' names no platform"]),
    # Oracle's: placeholders, and 'onprem' for a system that is 'Available cloud'
    ("Oracle_8xBM.GPU.H200.8", [
        "submission_status 'onprem', the systems JSON's status 'Available cloud' needs 'cloud'",
        "submission_platform '8xSUBMISSION_PLATFORM_PLACEHOLDER' names no platform"]),
])
def test_published_packages_the_official_tools_pass_pass_with_warnings(official_tools, tmp_path, capsys, name,
                                                                       warned):
    """Issue 37: score failed krai, Dell and Supermicro on identity checks the official tools do not
    make, though MLCommons published them. They pass, with the time to train the summarizer gives,
    and each stricter finding is a warning line."""
    root = unpack(tmp_path, name)
    assert score.main(["score", "--json", "--noplots", str(root)]) == 0
    captured = capsys.readouterr()
    out = captured.err
    got = json.loads(captured.out)
    assert got["verdict"] == "pass" and all(s["reasons"] == [] for s in got["systems"])
    assert_published_scores(got)
    warnings = [l for l in out.splitlines() if l.startswith("warning: ")]
    for w in warned:
        assert any(w in line for line in warnings), (w, warnings)


@pytest.mark.parametrize("name", ["krai", "Supermicro_AS-4126GS-NBR-LCC_N1", "Oracle_8xBM.GPU.H200.8"])
def test_identity_of_published_packages_is_warned_never_failed(tmp_path, name):
    """Issue 37 (no official tool run): the identity findings of krai's, Supermicro's and Oracle's
    published logs and systems JSONs are warnings; a log whose division is not its systems JSON's
    fails (the official checker judged it by the log's)."""
    from mlperf_bert.harness.compliance import read_log
    root = unpack(tmp_path, name)
    org = next(p.name for p in root.iterdir())
    for system in score.bert_systems(str(root / org)):
        desc = pkg_mod.load_system_json(str(root / org / "systems" / (system + ".json")))
        logs = sorted((root / org / "results" / system / "bert").glob("result_*.txt"))
        parsed = [(str(p), read_log(str(p))) for p in logs]
        fails, warnings = score.identity_reasons(str(root), org, system, desc, parsed)
        assert fails == [] and warnings, (name, system)
        parsed[0] = (parsed[0][0], [r._replace(value="open") if r.key == "submission_division" else r
                                    for r in parsed[0][1]])
        fails, _ = score.identity_reasons(str(root), org, system, desc, parsed)
        assert fails == ["%s: submission_division 'open', the systems JSON says 'closed'"
                         % os.path.basename(parsed[0][0])]


def test_a_check_the_official_checker_bypassed_is_said(official_tools, package):
    """A hostile sweep: with seed-checker-bypass in the system's package_checker_params, two runs of
    one seed passed (the official tools pass them too) and score said nothing of the skipped check,
    which the package checker logs ("Bypassing Seed Checker"). The official checker takes the line
    only as readlines() gives it: without a newline after it."""
    bert = package / BERT
    seed = re.search(r'"key": "seed", "value": (\d+)', (bert / "result_3.txt").read_text()).group(1)
    text = (bert / "result_4.txt").read_text()
    (bert / "result_4.txt").write_text(re.sub(r'("key": "seed", "value": )\d+', r"\g<1>" + seed, text))
    (bert / "package_checker_params").write_text("seed-checker-bypass")
    s = score.score(str(package))
    assert s["verdict"] == "pass" and s["systems"][0]["warnings"][-1] == (
        "the official package checker skipped its seed check (seed-checker-bypass in a package_checker_params): the "
        "runs' seeds were not compared")


def test_score_json_on_an_error_is_an_object_on_stdout(tmp_path, capsys):
    """A hostile sweep: `score --json` on a missing path (or a file, two orgs) printed the error
    line and nothing on stdout: a reader of the JSON got nothing to parse."""
    for arg in (str(tmp_path / "missing"), None):
        with pytest.raises(UserError) as e:
            score.main(["score", "--json"] + ([arg] if arg else []))
        assert json.loads(capsys.readouterr().out) == {"verdict": "error", "error": str(e.value)}


def test_checker_errors_go_to_the_system_they_concern():
    """The package checker's output of a package of several systems, split as score splits it."""
    out = "\n".join([
        "INFO -  Checking System Description Files",
        "ERROR -   System description checker failed for Sys B : ['Missing field cooling']",
        "ERROR - System description file checker failed",
        "INFO - ------------------------------",
        "INFO -  Running compliance checks in dir ORG/results/a/bert",
        "ERROR - Incorrect number of files in dir, or wrong file names in directory ORG/results/a/bert, found 9, expected 10",
        "INFO -  Running compliance checks in dir ORG/results/b/bert",
        "ERROR - RCP Test Failed: Insufficient convergence",
        "INFO -  Running compliance checks in dir ORG/results/b/dlrm_dcnv2",
        "ERROR - Seed checker failed",
        "INFO - PACKAGE CHECKER FOUND ERRORS, LOOK INTO ERROR LOG LINES AND FIX THEM.",
    ])
    per, others = score.checker_errors(out, {"a": "Sys A", "b": "Sys B", "c": "Sys C"})
    assert per == {"a": ["Incorrect number of files in dir, or wrong file names in directory ORG/results/a/bert,"
                         " found 9, expected 10"],
                   "b": ["System description checker failed for Sys B : ['Missing field cooling']",
                         "RCP Test Failed: Insufficient convergence"]}
    assert others == ["Seed checker failed"]  # another benchmark's: the package as a whole
    # a hostile sweep: two folders of one system_name (NVIDIA's Tyche 8 and 64 GPUs), a field missing
    # from one's JSON: the line failed both; it goes to the one whose JSON lacks it
    per, _ = score.checker_errors(out, {"a": "Sys B", "b": "Sys B"}, bad_json={"b"})
    assert [line.split(" ")[0] for line in per["a"]] == ["Incorrect"]
    assert [line.split(" ")[0] for line in per["b"]] == ["System", "RCP"]
    per, _ = score.checker_errors(out, {"a": "Sys B", "b": "Sys B"})  # neither found wrong here: both
    assert all(per[k][0].startswith("System description checker failed") for k in "ab")


# ---- issue 37: the package passes the verify script, MANIFEST.txt, launch records, counts, a lock

@pytest.mark.slow
def test_a_package_made_by_package_passes_all_three_steps_of_the_verify_script(official_tools, package, tmp_path,
                                                                              capsys):
    """Issue 37: package copied .ci/, .gitignore and .dockerignore, which the third step of
    verify_for_v5.0_training.sh (repo_checker) refuses, and score ran only the first two. The package
    holds no name the repo checker refuses and no tests; its MANIFEST.txt lists what it holds; score
    runs all three steps on it; a dotfile makes the third fail."""
    out = tmp_path / "pkg"
    assert pkg_mod.main(nyx_argv(package / BERT, out)) == 0
    impl = out / "NVIDIA" / "benchmarks" / "bert" / "implementations" / "pytorch"
    held = sorted(str(p.relative_to(impl)) for p in impl.rglob("*") if p.is_file())
    # the repo checker refuses a name that starts with '.' or holds a space
    assert not [p for p in held if any(part.startswith(".") or " " in part for part in p.split("/"))]
    assert not [p for p in held if p.startswith("tests/")]
    assert sorted((impl / "MANIFEST.txt").read_text().splitlines() + [pkg_mod.launch_name(NYX)]) == held
    s = score.score(str(out))
    assert {tool: v[0] for tool, v in s["steps"].items()} == {
        "package_checker": "pass", "result_summarizer": "pass", "repo_checker": "pass"}
    assert s["verdict"] == "pass"
    assert s["systems"][0]["time_to_train_min"] == pytest.approx(PUBLISHED[NYX][0], abs=1e-9)
    # what the repo checker refuses: a name with a leading '.' (the official tool on the package itself)
    (impl / ".gitignore").write_text("*.pyc\n")
    status, text = score._official(str(out), "repo_checker", "NVIDIA")
    verdict = score.step_verdicts({"package_checker": (0, score._OK), "result_summarizer": (0, ""),
                                   "repo_checker": (status, text)}, {}, [NYX])["repo_checker"]
    assert verdict[0] == "fail" and "git-unfriendly name" in verdict[2][0] and ".gitignore" in verdict[2][0]


@pytest.mark.parametrize("line", ["../outside.txt", "/etc/hostname", "mlperf_bert/../../outside.txt"])
def test_manifest_lines_outside_the_repository_are_refused(two_runs, tmp_path, line):
    """Issue 37: a MANIFEST.txt line with ../ or an absolute path made package copy a file from outside
    the repository into the package (or write it outside --output), exit 0."""
    repo = tmp_path / "repo"
    (repo / "mlperf_bert").mkdir(parents=True)
    (repo / "mlperf_bert" / "a.py").write_text("x = 1\n")
    (tmp_path / "outside.txt").write_text("secret\n")
    (repo / "MANIFEST.txt").write_text("MANIFEST.txt\nmlperf_bert/a.py\n%s\n" % line)
    out = tmp_path / "pkg"
    with pytest.raises(UserError, match=r"MANIFEST.txt:3: %s (is an absolute path|has a '..' part).*"
                                        r"`make manifest`" % re.escape(repr(line))):
        pkg_mod.make_package("NVIDIA", NYX, [str(two_runs)], str(out), str(nyx_json(two_runs.parent)),
                             platform_=NYX_PLATFORM, root=str(repo))
    assert not out.exists()


def test_manifest_lines_named_twice_are_copied_and_counted_once(two_runs, tmp_path, capsys):
    repo = tmp_path / "repo"
    (repo / "mlperf_bert").mkdir(parents=True)
    (repo / "mlperf_bert" / "a.py").write_text("x = 1\n")
    (repo / ".gitignore").write_text("*.pyc\n")
    (repo / "tests").mkdir()
    (repo / "tests" / "test_a.py").write_text("")
    (repo / "MANIFEST.txt").write_text("MANIFEST.txt\nmlperf_bert/a.py\nmlperf_bert/a.py\n.gitignore\ntests/test_a.py\n")
    assert pkg_mod.source_files(str(repo)) == ["MANIFEST.txt", "mlperf_bert/a.py"]
    logs, _, n, _ = pkg_mod.make_package("NVIDIA", NYX, [str(two_runs)], str(tmp_path / "pkg"),
                                         str(nyx_json(two_runs.parent)), platform_=NYX_PLATFORM, root=str(repo))
    impl = tmp_path / "pkg" / "NVIDIA" / "benchmarks" / "bert" / "implementations" / "pytorch"
    assert n == 2 and (impl / "MANIFEST.txt").read_text() == "MANIFEST.txt\nmlperf_bert/a.py\n"
    assert sorted(p.name for p in impl.rglob("*") if p.is_file()) == ["MANIFEST.txt", "a.py", pkg_mod.launch_name(NYX)]


def test_package_records_how_each_run_was_launched_and_warns_of_a_short_series(two_runs, tmp_path, capsys):
    """Issue 37: the package did not say how the runs were launched, and took 9 logs (here 2) without
    a word. launch.json holds each run's launch from its run_finished.json (the same seed's), null
    where there is none; package warns of the count the ruleset needs and of runs without a record."""
    from mlperf_bert.harness.compliance import read_log
    seed = [r.value for r in read_log(str(two_runs / "result_0.txt")) if r.key == "seed"][-1]
    launch = {"preset": "rcp_768", "overrides": "--num_train_steps=3000", "flags": {"train_batch_size": 96},
              "processes": 8, "processes_per_node": 8, "nodes": 1, "commit": "abc", "modified": False,
              "source_sha256": pkg_mod.source_identity()["source_sha256"]}
    (two_runs / "run_0").mkdir()
    (two_runs / "run_0" / "run_finished.json").write_text(json.dumps(
        {"status": "success", "run": {"seed": seed, "train_batch_size": 96}, "launch": launch}))
    (two_runs / "run_1").mkdir()  # another run's record: not taken
    (two_runs / "run_1" / "run_finished.json").write_text(json.dumps({"run": {"seed": -1}, "launch": launch}))
    # finished: its result_1.txt is there, a copy of its log
    (two_runs / "run_1" / "mlperf.log").write_bytes((two_runs / "result_1.txt").read_bytes())
    (two_runs / "run_2").mkdir()  # the series' run 2, still running: a log, no result_2.txt yet
    (two_runs / "run_2" / "mlperf.log").write_text(":::MLLOG {}\n")
    out = tmp_path / "pkg"
    assert pkg_mod.main(nyx_argv(two_runs, out)) == 0
    err = capsys.readouterr().err
    # a sweep: the run still going was missing from the package with the count warning alone
    assert "warning: package: %s: no result_2.txt in %s: that run of the series did not finish (still running, or" \
        " stopped: rerun the same start_training.sh command to finish it), and is not in this package" \
        % (two_runs / "run_2" / "mlperf.log", two_runs) in err, err
    assert str(two_runs / "run_1") not in err, err
    assert "warning: package: 2 run logs, the ruleset (training 5.0.0) needs exactly 10 for BERT: the official" \
        " package checker fails this package" in err
    assert "warning: package: 1 run without a launch record (result_1.txt)" in err
    record = json.loads((out / "NVIDIA" / "benchmarks" / "bert" / "implementations" / "pytorch" /
                         pkg_mod.launch_name(NYX)).read_text())
    assert record["implementation"] == pkg_mod.source_identity()
    assert [(r["result"], r["seed"], r["launch"]) for r in record["runs"]] == [
        ("result_0.txt", seed, launch), ("result_1.txt", record["runs"][1]["seed"], None)]
    assert record["runs"][0]["run"] == {"seed": seed, "train_batch_size": 96}


def test_a_result_that_is_not_its_runs_log_is_refused(two_runs, tmp_path):
    """A hostile sweep: result_1.txt edited after its run finished (its run_stop 30 s earlier), beside
    run_1/mlperf.log, the log that run wrote, and its run_finished.json: packaged without a word, the
    launch record vouching for it, and score gave a better time to train. start_training.sh refuses
    such a series; package now does too, naming both files."""
    (two_runs / "run_1").mkdir()
    (two_runs / "run_1" / "mlperf.log").write_bytes((two_runs / "result_1.txt").read_bytes())
    text = (two_runs / "result_1.txt").read_text()
    stop = re.search(r'"time_ms": (\d+), "event_type": "INTERVAL_END", "key": "run_stop"', text)
    (two_runs / "result_1.txt").write_text(text.replace(stop.group(1), str(int(stop.group(1)) - 30000)))
    with pytest.raises(UserError) as e:
        pkg_mod.main(nyx_argv(two_runs, tmp_path / "pkg"))
    assert str(e.value).startswith("%s is not the log of its run: %s, the log that run wrote, differs from it" % (
        two_runs / "result_1.txt", two_runs / "run_1" / "mlperf.log"))
    assert not (tmp_path / "pkg").exists()
    (two_runs / "result_1.txt").write_bytes((two_runs / "run_1" / "mlperf.log").read_bytes())  # put back: packaged
    assert pkg_mod.main(nyx_argv(two_runs, tmp_path / "pkg")) == 0


def test_a_series_logdir_apart_from_its_output_dir_is_pointed_to_the_output_dir(two_runs, tmp_path, capsys):
    """start_training.sh's series with LOGDIR apart from OUTPUT_DIR: `package --runs=$LOGDIR` found
    no launch record (they are in OUTPUT_DIR/run_N/) and said only where it had looked."""
    from mlperf_bert.harness.compliance import read_log
    output = tmp_path / "output"
    launch = {"preset": "rcp_768", "overrides": "", "flags": {}, "processes": 8, "processes_per_node": 8,
              "nodes": 1, "commit": "abc", "modified": False, "source_sha256": pkg_mod.source_identity()["source_sha256"]}
    for i in (0, 1):
        log = two_runs / ("result_%d.txt" % i)
        seed = [r.value for r in read_log(str(log)) if r.key == "seed"][-1]
        (output / ("run_%d" % i)).mkdir(parents=True)
        (output / ("run_%d" % i) / "mlperf.log").write_bytes(log.read_bytes())
        (output / ("run_%d" % i) / "run_finished.json").write_text(json.dumps(
            {"status": "success", "global_step": 30, "samples": 120, "run": {"seed": seed}, "launch": launch}))
    assert pkg_mod.main(nyx_argv(two_runs, tmp_path / "a")) == 0
    assert "the launch record says null for them (a series' LOGDIR apart from its OUTPUT_DIR holds no run_N/: give" \
        " --runs=OUTPUT_DIR, whose run_N/ hold the logs and their records)" in capsys.readouterr().err
    assert pkg_mod.main(nyx_argv(output, tmp_path / "b")) == 0
    assert "launch record" not in capsys.readouterr().err
    (two_runs / "run_0").mkdir()  # a folder of the series itself: its run_1 is missing, not apart
    assert pkg_mod.main(nyx_argv(two_runs, tmp_path / "c")) == 0
    assert "the launch record says null for them\n" in capsys.readouterr().err


def test_a_run_killed_after_its_run_stop_is_packaged_with_the_launch_its_run_stopped_json_holds(two_runs, tmp_path,
                                                                                                 capsys):
    """A run killed after its run_stop (its log complete, its end not written) has run_stopped.json,
    not run_finished.json: package said it had no launch record, though that record holds one."""
    from mlperf_bert.harness.compliance import read_log
    seed = [r.value for r in read_log(str(two_runs / "result_1.txt")) if r.key == "seed"][-1]
    launch = {"preset": "rcp_768", "overrides": "", "flags": {}, "processes": 8, "processes_per_node": 8,
              "nodes": 1, "commit": "abc", "modified": False, "source_sha256": pkg_mod.source_identity()["source_sha256"]}
    (two_runs / "run_1").mkdir()
    (two_runs / "run_1" / "run_stopped.json").write_text(json.dumps(
        {"status": "success", "global_step": 30, "samples": 120, "run": {"seed": seed}, "launch": launch,
         "mlperf_log": [1, "x"]}))
    out = tmp_path / "pkg"
    assert pkg_mod.main(nyx_argv(two_runs, out)) == 0
    err = capsys.readouterr().err
    assert "warning: package: 1 run without a launch record (result_0.txt): no run_finished.json (or" \
        " run_stopped.json) of the same seed" in err
    record = json.loads((out / "NVIDIA" / "benchmarks" / "bert" / "implementations" / "pytorch" /
                         pkg_mod.launch_name(NYX)).read_text())
    assert [(r["result"], r["launch"]) for r in record["runs"]] == [("result_0.txt", None), ("result_1.txt", launch)]
    assert record["runs"][1]["run_finished"].endswith("run_1/run_stopped.json")


def test_the_trainer_records_its_launch(monkeypatch):
    """What run_finished.json keeps for launch.json: train_model.sh's preset and overrides, the flags
    given, processes and nodes (torchrun's), the code."""
    from mlperf_bert.trainer import checkpoint, trainer_flags
    from mlperf_bert.trainer.run_config import RunConfig
    fv = trainer_flags.define_flags()
    fv(["run_pretraining.py", "--train_batch_size=96", "--output_dir=/x", "--noshuffle"])
    monkeypatch.setenv("MLPERF_BERT_PRESET", "rcp_768")
    monkeypatch.setenv("MLPERF_BERT_OVERRIDES", "--train_batch_size=96")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    rec = checkpoint.launch_record(RunConfig.from_flags(fv), 8)
    assert {k: rec[k] for k in ("preset", "overrides", "flags", "processes", "processes_per_node", "nodes")} == {
        "preset": "rcp_768", "overrides": "--train_batch_size=96", "processes": 8, "processes_per_node": 4,
        "nodes": 2, "flags": {"train_batch_size": 96, "output_dir": "/x", "shuffle": False}}
    assert rec["source_sha256"] == pkg_mod.source_identity()["source_sha256"] is not None
    import torch
    assert rec["torch"] == str(torch.__version__) and type(rec["torch"]) is str


def test_package_warns_of_a_run_stopped_and_resumed(two_runs, tmp_path, capsys):
    """A sweep: a run stopped (a time limit, a preemption) and resumed by its rerun was packaged as any,
    its time from run_start to run_stop holding the pause and the rerun's init: no timed result. Its launch
    record names the steps it resumed at (test_training checks the trainer writes them); package says so.
    A record of one session ([]) or of an older version (no key) says nothing."""
    from mlperf_bert.harness.compliance import read_log
    for resumes, warned in (([[21, 27], []], True), ([[], []], False), ([None, []], False)):
        for i, steps in enumerate(resumes):
            seed = [r.value for r in read_log(str(two_runs / ("result_%d.txt" % i))) if r.key == "seed"][-1]
            launch = {"flags": {}, "source_sha256": pkg_mod.source_identity()["source_sha256"]}
            if steps is not None:
                launch["resumed_at_steps"] = steps
            (two_runs / ("run_%d" % i)).mkdir(exist_ok=True)
            (two_runs / ("run_%d" % i) / "run_finished.json").write_text(json.dumps(
                {"status": "success", "run": {"seed": seed}, "launch": launch}))
        out = tmp_path / ("pkg_%s" % len(os.listdir(tmp_path)))
        assert pkg_mod.main(nyx_argv(two_runs, out)) == 0
        said = [line for line in capsys.readouterr().err.splitlines() if "resumed" in line]
        seed = [r.value for r in read_log(str(two_runs / "result_0.txt")) if r.key == "seed"][-1]
        assert said == (["warning: package: 1 run stopped and resumed (result_0.txt (seed %s, resumed at step 21, 27)): "
                         "its time from run_start to run_stop holds the pause and the rerun's init, so it is not a timed "
                         "result; rerun it uninterrupted (with its seed) for the package" % seed] if warned else []), said


def test_package_warns_of_runs_launched_under_several_torches(two_runs, tmp_path, capsys):
    """Each launch record names the torch the run ran under; runs under two versions (a container
    upgraded between runs) are one package's runs of two software stacks: package says so, naming
    each version's runs. Under one version, or where a record names none (an older version's), it
    says nothing of torch."""
    from mlperf_bert.harness.compliance import read_log
    for versions, warned in ((("2.11.0+cu130", "2.13.0+cpu"), True), (("2.13.0+cpu", "2.13.0+cpu"), False),
                             ((None, "2.13.0+cpu"), False)):
        for i, version in enumerate(versions):
            seed = [r.value for r in read_log(str(two_runs / ("result_%d.txt" % i))) if r.key == "seed"][-1]
            launch = {"preset": None, "overrides": None, "flags": {}, "processes": 8, "processes_per_node": 8,
                      "nodes": 1, "source_sha256": pkg_mod.source_identity()["source_sha256"]}
            if version:
                launch["torch"] = version
            (two_runs / ("run_%d" % i)).mkdir(exist_ok=True)
            (two_runs / ("run_%d" % i) / "run_finished.json").write_text(json.dumps(
                {"status": "success", "run": {"seed": seed}, "launch": launch}))
        out = tmp_path / ("pkg_%s" % "_".join(map(str, versions)))
        assert pkg_mod.main(nyx_argv(two_runs, out)) == 0
        err = capsys.readouterr().err
        torches = [line for line in err.splitlines() if "versions of torch" in line]
        if warned:
            assert torches == ["warning: package: the runs ran under 2 versions of torch (torch 2.11.0+cu130: "
                               "result_0.txt; torch 2.13.0+cpu: result_1.txt): a submission's runs share one software"
                               " stack, the one its system description names; package the runs of one"], err
        else:
            assert torches == [], err


def test_two_packages_on_one_output_the_loser_writes_nothing(package, tmp_path):
    """Issue 37: two package runs on one --output: the loser died with an OSError traceback and left
    .package-<system>.incomplete inside the winner's package. --output is locked; the loser gets one
    line and a non-zero exit, and the winner's package is whole."""
    import multiprocessing
    out = tmp_path / "pkg"
    argv = nyx_argv(package / BERT, out)
    ctx = multiprocessing.get_context("fork")
    copying, go = ctx.Event(), ctx.Event()

    def winner():
        copy2 = shutil.copy2

        def held_copy(*a, **k):
            copying.set()
            go.wait(60)
            return copy2(*a, **k)
        shutil.copy2 = held_copy
        os._exit(pkg_mod.main(argv))
    p = ctx.Process(target=winner)
    p.start()
    try:
        assert copying.wait(60)
        loser = subprocess.run([sys.executable, "-m", "mlperf_bert"] + argv, capture_output=True, text=True,
                               timeout=120)
    finally:
        go.set()
        p.join(60)
    assert p.exitcode == 0
    assert loser.returncode != 0 and loser.stdout == ""
    lines = loser.stderr.strip().splitlines()
    assert len(lines) == 1 and "--output %s is in use by another run (pid %d" % (out, p.pid) in lines[0], loser.stderr
    assert sorted(os.listdir(out)) == ["NVIDIA"]
    assert not [n for n in os.listdir(out / "NVIDIA") if n.startswith(".")]
    assert len(list((out / "NVIDIA" / "results" / NYX / "bert").iterdir())) == 10


# ---- issue 45 (6): MANIFEST.txt lines as people write them; score's --json and shared logs

def tiny_repo(tmp_path, manifest):
    """A repository of one source file (mlperf_bert/a.py), a test and a dotfile, with ``manifest``
    as its MANIFEST.txt."""
    repo = tmp_path / "repo"
    (repo / "mlperf_bert").mkdir(parents=True)
    (repo / "mlperf_bert" / "a.py").write_text("x = 1\n")
    (repo / "tests").mkdir()
    (repo / "tests" / "test_a.py").write_text("")
    (repo / ".gitignore").write_text("*.pyc\n")
    (repo / "MANIFEST.txt").write_text(manifest)
    return repo


def test_manifest_lines_written_dot_slash_are_packaged(two_runs, tmp_path):
    """Issue 45: a line written ./PATH was dropped without a word (0 source files, exit 0)."""
    repo = tiny_repo(tmp_path, "./MANIFEST.txt\n.//mlperf_bert//a.py\n./tests/test_a.py\n")
    assert pkg_mod.source_files(str(repo)) == ["MANIFEST.txt", "mlperf_bert/a.py"]
    _, _, n, _ = pkg_mod.make_package("NVIDIA", NYX, [str(two_runs)], str(tmp_path / "pkg"),
                                      str(nyx_json(two_runs.parent)), platform_=NYX_PLATFORM, root=str(repo))
    impl = tmp_path / "pkg" / "NVIDIA" / "benchmarks" / "bert" / "implementations" / "pytorch"
    assert n == 2 and (impl / "mlperf_bert" / "a.py").read_text() == "x = 1\n"
    assert (impl / "MANIFEST.txt").read_text() == "MANIFEST.txt\nmlperf_bert/a.py\n"


@pytest.mark.parametrize("line,why", [
    ("mlperf_bert/a.py ", "has white space around the path"),
    (" mlperf_bert/a.py", "has white space around the path"),
    ("mlperf_bert", "is a directory"),
    ("./mlperf_bert/", "is a directory"),
    ("mlperf_bert/*.py", "is a glob pattern"),
    ("mlperf_bert/../mlperf_bert/a.py", "has a '..' part"),
    ("mlperf_bert/a.py\0/etc/passwd", "holds a NUL byte"),  # a hostile sweep: "embedded null byte" traceback
])
def test_manifest_lines_that_name_no_file_are_refused_naming_the_line(two_runs, tmp_path, line, why):
    """Issue 45: a trailing space dropped the file without a word; a directory or a glob line was
    called "missing ... git checkout"; a '..' part must never be followed, even back inside."""
    repo = tiny_repo(tmp_path, "MANIFEST.txt\n\n%s\n" % line)
    out = tmp_path / "pkg"
    with pytest.raises(UserError, match=r"^%s:3: %s %s.*`make manifest`" % (
            re.escape(str(repo / "MANIFEST.txt")), re.escape(repr(line)), re.escape(why))):
        pkg_mod.make_package("NVIDIA", NYX, [str(two_runs)], str(out), str(nyx_json(two_runs.parent)),
                             platform_=NYX_PLATFORM, root=str(repo))
    assert not out.exists()


def test_a_manifest_line_is_split_at_line_ends_alone(tmp_path):
    """A hostile sweep: MANIFEST.txt was split as str.splitlines splits, at U+0085, U+2028, \\x1c too:
    a line "mlperf_bert/a.py<U+0085>tests/test_a.py" (a name git may list) was read as two files
    and packaged, exit 0. Lines end at "\\n" (or "\\r\\n") alone: that line names one file, missing."""
    repo = tiny_repo(tmp_path, "MANIFEST.txt\r\nmlperf_bert/a.py\u0085tests/test_a.py\n")
    assert (repo / "tests" / "test_a.py").is_file()
    with pytest.raises(UserError, match=r"^1 file of MANIFEST.txt is missing from %s \(%s\)" % (
            re.escape(str(repo)), re.escape("mlperf_bert/a.py\u0085tests/test_a.py"))):
        pkg_mod.source_files(str(repo))


def test_a_manifest_not_text_or_a_directory_is_one_line(two_runs, tmp_path):
    """A hostile sweep: bytes that are not UTF-8 in MANIFEST.txt ended package in a UnicodeDecodeError
    traceback; a MANIFEST.txt that is a directory was called missing."""
    repo = tiny_repo(tmp_path, "MANIFEST.txt\nmlperf_bert/a.py\n")
    (repo / "MANIFEST.txt").write_bytes(b"MANIFEST.txt\nmlperf_bert/\xff\xfe.py\n")
    for why in (r"is not UTF-8 text \(byte 25\)", "is a directory"):
        with pytest.raises(UserError, match=r"^%s %s: the list names files .*`make manifest`" % (
                re.escape(str(repo / "MANIFEST.txt")), why)):
            pkg_mod.make_package("NVIDIA", NYX, [str(two_runs)], str(tmp_path / "pkg"),
                                 str(nyx_json(two_runs.parent)), platform_=NYX_PLATFORM, root=str(repo))
        if (repo / "MANIFEST.txt").is_file():
            (repo / "MANIFEST.txt").unlink()
            (repo / "MANIFEST.txt").mkdir()
    assert not (tmp_path / "pkg").exists()


def test_a_manifest_of_no_source_file_is_refused(two_runs, tmp_path):
    """Issue 45: packaging no source file exited 0."""
    repo = tiny_repo(tmp_path, "MANIFEST.txt\ntests/test_a.py\n.gitignore\n")
    with pytest.raises(UserError, match=r"MANIFEST.txt lists no file to package .*`make manifest`"):
        pkg_mod.make_package("NVIDIA", NYX, [str(two_runs)], str(tmp_path / "pkg"),
                             str(nyx_json(two_runs.parent)), platform_=NYX_PLATFORM, root=str(repo))
    assert not (tmp_path / "pkg").exists()


def test_two_systems_with_the_same_logs_are_warned(tmp_path):
    """Issue 45: two systems with one system_name and the same ten logs passed twice without a word
    (the official tools do not compare systems: a warning). NVIDIA's Tyche 8 and 64 GPUs share a
    system_name with logs of their own: nothing to say."""
    root = unpack(tmp_path, "NVIDIA_nyx_n1", "NVIDIA_tyche")
    top = root / "NVIDIA"
    systems = score.bert_systems(str(top))
    names = {s_: json.loads((top / "systems" / (s_ + ".json")).read_text())["system_name"] for s_ in systems}
    assert score.shared_logs(str(top), systems, names) == {}
    shutil.copytree(top / "results" / NYX, top / "results" / "nyx_copy")
    shutil.copy(top / "systems" / (NYX + ".json"), top / "systems" / "nyx_copy.json")
    systems = score.bert_systems(str(top))
    names["nyx_copy"] = names[NYX]
    got = score.shared_logs(str(top), systems, names)
    assert sorted(got) == sorted([NYX, "nyx_copy"])
    assert got["nyx_copy"] == ["10 result logs (result_0.txt, result_1.txt, result_2.txt, ...) are byte for byte"
                               " results/%s/bert's, and both systems are named 'Nyx (1x NVIDIA DGX B200)': one series"
                               " of runs scored as two systems; each system's results must be runs on that system"
                               % NYX]


# ---- issue 47: the submitter's last mile

def test_a_package_package_made_without_its_code_fails_a_published_one_is_warned(official_tools, package,
                                                                                 tmp_path, capsys):
    """Issue 47 (1): score said `submission: PASS` for results without benchmarks/bert/implementations/*.
    A package that `package` made (ORG/mlperf_bert_package.json) fails without its code; a published
    one (tests/data's carry no code) gets a warning, as the official tools pass it."""
    repo = tiny_repo(tmp_path, "MANIFEST.txt\nmlperf_bert/a.py\n")
    out = tmp_path / "pkg"
    pkg_mod.make_package("NVIDIA", NYX, [str(package / BERT)], str(out), str(nyx_json(tmp_path)),
                         platform_=NYX_PLATFORM, root=str(repo))
    top = out / "NVIDIA"
    assert score.implementation_findings(str(top), [NYX]) == ({}, {})
    shutil.rmtree(top / "benchmarks")
    assert score.main(["score", "--noplots", str(out)]) == 1
    text = capsys.readouterr().out
    assert "time to train: none:\n  NVIDIA/benchmarks/bert/implementations/pytorch, the code of these runs" \
           " (NVIDIA/mlperf_bert_package.json: package made this package), is missing or empty" in text, text
    assert text.endswith("submission: FAIL\n\nNVIDIA: 1 system, 0 PASS, 1 FAIL\n")
    fails, warnings = score.implementation_findings(str(package / "NVIDIA"), [NYX])
    assert fails == {} and warnings == {NYX: [NO_CODE]}


def test_a_published_packages_code_outside_implementations_is_its_code(package):
    """Lenovo's v5.0 BERT package, accepted, holds its code in benchmarks/bert/ itself (Dockerfile,
    run_pretraining.py, ...; no implementations/IMPL/): score warned that it held no implementation.
    Folders without a file are still no code."""
    bert = package / "NVIDIA" / "benchmarks" / "bert"
    (bert / "implementations" / "pytorch").mkdir(parents=True)
    assert score.implementation_findings(str(package / "NVIDIA"), [NYX]) == ({}, {NYX: [NO_CODE]})
    (bert / "run_pretraining.py").write_text("import torch\n")
    assert score.implementation_findings(str(package / "NVIDIA"), [NYX]) == ({}, {})


def test_the_launch_record_holds_no_absolute_path_of_the_submitter(two_runs, tmp_path):
    """Issue 47 (2): launch.json held the submitter's absolute paths (log, run_finished,
    bert_config_file, input_file, output_dir, mlperf_log); a package is published. Each is written
    relative to a named root; a path under none keeps its file name."""
    from mlperf_bert.harness.compliance import read_log
    seed = [r.value for r in read_log(str(two_runs / "result_0.txt")) if r.key == "seed"][-1]
    data, out_dir = "/scratch/alice/bert/hdf5", str(two_runs / "run_0")
    flags_ = {"output_dir": out_dir, "input_file": data + "/part-*,%s/extra-0" % data,
              "eval_input_file": data + "/eval_10k", "mlperf_log": str(two_runs / "mlperf.log"),
              "bert_config_file": os.path.join(pkg_mod.ROOT, "configs", "bert_config_large.json"),
              "init_checkpoint": "/home/alice/ckpt/model.ckpt-28252", "train_batch_size": 96}
    (two_runs / "run_0").mkdir()
    (two_runs / "run_0" / "run_finished.json").write_text(json.dumps({"run": {
        "seed": seed, "input_file": [[data + "/part-00000", 10]],
        "init_checkpoint": ["/home/alice/ckpt/model.ckpt-28252", 5, "abc"]},
        "launch": {"preset": "rcp_768", "overrides": "--init_checkpoint=/home/alice/ckpt/model.ckpt-28252 --seed=1",
                   "flags": flags_}}))
    out = tmp_path / "pkg"
    assert pkg_mod.main(nyx_argv(two_runs, out)) == 0
    impl = out / "NVIDIA" / "benchmarks" / "bert" / "implementations" / "pytorch"
    text = (impl / pkg_mod.launch_name(NYX)).read_text()
    for private in ("/scratch", "/home", str(tmp_path), pkg_mod.ROOT):
        assert private not in text
    record = json.loads(text)
    run = record["runs"][0]
    # the longest root that holds a path: run_0/ is the run's --output_dir here
    assert (run["log"], run["run_finished"]) == ("$RUNS/result_0.txt", "$OUTPUT_DIR/run_finished.json")
    assert run["launch"]["flags"] == {
        "output_dir": "$OUTPUT_DIR", "input_file": "$DATA_DIR/part-*,$DATA_DIR/extra-0",
        "eval_input_file": "$DATA_DIR/eval_10k", "mlperf_log": "$RUNS/mlperf.log",
        "bert_config_file": "$SOURCE/configs/bert_config_large.json",
        "init_checkpoint": "$ELSEWHERE/model.ckpt-28252", "train_batch_size": 96}
    assert run["launch"]["overrides"] == "--init_checkpoint=$ELSEWHERE/model.ckpt-28252 --seed=1"
    assert run["run"]["input_file"] == [["$DATA_DIR/part-00000", 10]]
    assert "$OUTPUT_DIR: the run's --output_dir" in record["paths"]
    assert record["runs"][1]["log"] == "$RUNS/result_1.txt"


def test_the_systems_of_an_organization_share_one_implementation_named_after_the_framework(two_runs, tmp_path):
    """Issue 47 (3): the implementation folder was named after the system (a second system, a second
    copy). --implementation (default pytorch) names it; a second system with the same code reuses it,
    other code under that name is refused."""
    repo = tiny_repo(tmp_path, "MANIFEST.txt\nmlperf_bert/a.py\n")
    out = tmp_path / "pkg"
    kw = dict(platform_=NYX_PLATFORM, root=str(repo))
    pkg_mod.make_package("NVIDIA", NYX, [str(two_runs)], str(out), str(nyx_json(two_runs.parent)), **kw)
    pkg_mod.make_package("NVIDIA", "nyx_b", [str(two_runs)], str(out), str(nyx_json(two_runs.parent)), **kw)
    impls = out / "NVIDIA" / "benchmarks" / "bert" / "implementations"
    assert os.listdir(impls) == ["pytorch"]
    assert sorted(p.name for p in (impls / "pytorch").iterdir()) == sorted([
        "MANIFEST.txt", pkg_mod.launch_name(NYX), "launch_nyx_b.json", "mlperf_bert"])
    assert pkg_mod.read_made_by(str(out / "NVIDIA")) == {NYX: "pytorch", "nyx_b": "pytorch"}
    (repo / "mlperf_bert" / "a.py").write_text("x = 2\n")  # other code
    with pytest.raises(UserError, match=r"implementations/pytorch holds other code than this package's .*"
                                        r"--implementation=ANOTHER_NAME"):
        pkg_mod.make_package("NVIDIA", "nyx_c", [str(two_runs)], str(out), str(nyx_json(two_runs.parent)), **kw)
    assert not (out / "NVIDIA" / "results" / "nyx_c").exists()
    pkg_mod.make_package("NVIDIA", "nyx_c", [str(two_runs)], str(out), str(nyx_json(two_runs.parent)),
                         implementation="pytorch_v2", **kw)
    assert sorted(os.listdir(impls)) == ["pytorch", "pytorch_v2"]
    assert pkg_mod.read_made_by(str(out / "NVIDIA"))["nyx_c"] == "pytorch_v2"


def test_the_system_template_holds_every_field_the_official_checker_reads(two_runs, tmp_path, capsys):
    """Issue 47 (4): package --system_template=FILE writes a systems JSON with every field, each value
    what it means; the official system-description checker accepts its shape; package refuses it
    until each value is replaced."""
    from mlperf_logging.system_desc_checker.system_desc_checker import check_system_desc
    template = tmp_path / "sys.json"
    assert pkg_mod.main(["package", "--system_template=%s" % template, "--org=NVIDIA",
                         "--status=Available on-premise"]) == 0
    assert "wrote %s" % template in capsys.readouterr().out
    desc = json.loads(template.read_text())
    assert list(desc) == list(pkg_mod.SYSTEM_FIELDS)
    assert (desc["submitter"], desc["status"]) == ("NVIDIA", "Available on-premise")
    assert desc["hw_notes"] == pkg_mod.TEMPLATE_MARK + pkg_mod.FIELD_MEANINGS["hw_notes"]
    assert all(v.startswith(pkg_mod.TEMPLATE_MARK) and len(v) > 20 for k, v in desc.items()
               if k not in ("submitter", "status"))
    assert check_system_desc(str(template), "training", "5.0.0")[0]  # every field it requires is there
    with pytest.raises(UserError, match=r"--system_template=.*sys.json exists"):
        pkg_mod.main(["package", "--system_template=%s" % template])
    with pytest.raises(UserError, match=r"sys.json still holds the template's text for system_name,"
                                        r" number_of_nodes, host_processors_per_node"):
        pkg_mod.main(["package", "--org=NVIDIA", "--system=%s" % NYX, "--runs=%s" % two_runs,
                      "--output=%s" % (tmp_path / "pkg"), "--system_json=%s" % template])
    assert not (tmp_path / "pkg").exists()


def test_package_help_marks_the_required_flags_and_every_empty_field_is_listed(two_runs, tmp_path, capsys):
    """Issue 47 (5): --help did not say which flags are required; hw_notes and sw_notes were written
    empty without a word."""
    with pytest.raises(SystemExit):
        pkg_mod.main(["package", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    for name in pkg_mod.REQUIRED:
        assert "--%s: (required) " % name in help_text, name
    assert "--platform: (required)" not in help_text
    with pytest.raises(UserError, match=r"flag --output is required \(package --help marks the required flags\)"):
        pkg_mod.main(["package", "--org=NVIDIA", "--system=x", "--runs=%s" % two_runs])
    desc = json.loads(nyx_json(two_runs.parent).read_text())
    desc.update(hw_notes="", sw_notes="", cooling="")
    given = tmp_path / "sys.json"
    given.write_text(json.dumps(desc))
    argv = [a for a in nyx_argv(two_runs, tmp_path / "pkg") if not a.startswith("--system_json")]
    assert pkg_mod.main(argv + ["--system_json=%s" % given]) == 0
    empty = [l for l in capsys.readouterr().out.splitlines() if l.startswith("left empty in")]
    assert len(empty) == 1 and empty[0].endswith(", cooling, hw_notes, sw_notes"), empty


def test_the_forked_tools_cut_their_log_lines_as_the_official_parser_does():
    """score's forked official tools cut log lines with compliance._strip_and_dedup and _MarkerCut
    (speed_up_official_parse): the lines ruleset_500.strip_and_dedup and the RCP checker's re.sub
    give, on real logs and on lines they cut oddly."""
    from mlperf_logging.compliance_checker.mlp_parser import ruleset_500
    from mlperf_logging.rcp_checker import rcp_checker
    from mlperf_bert.harness import compliance
    # only a forked tool's are replaced
    assert ruleset_500.strip_and_dedup is not compliance._strip_and_dedup and rcp_checker.re is re
    with tarfile.open(os.path.join(DATA, "submission_v5.0_NVIDIA_nyx_n1.tar.gz")) as t:
        lines = [line for m in t.getmembers() if m.name.endswith("result_0.txt")
                 for line in t.extractfile(m).read().decode("latin-1").splitlines(keepends=True)]
    tok = ruleset_500.TOKEN
    lines += ["junk " + tok + lines[5], "x" + tok + tok + "{}\n", "no marker\n", tok, "\xe9" + tok + "{bad\n",
              "a :::MLLOG" + tok + "{}", "  " + tok + "  {} " + tok + "\n"]
    assert len(lines) > 400
    assert list(compliance._strip_and_dedup(iter(lines))) == ruleset_500.strip_and_dedup(iter(lines))
    cut = compliance._MarkerCut(re, rcp_checker.TOKEN)
    for line in lines + ["a\n" + tok + "{}\n", tok + "x\n" + tok + "{}", "", "\n"]:
        assert cut.sub(".*" + tok, tok, line) == re.sub(".*" + tok, tok, line), line
    assert cut.sub("b+", "c", "abba") == "aca" and cut.compile is re.compile


def test_a_package_that_is_a_file_says_what_it_is_and_to_extract_it(tmp_path):
    """``score pkg.tar.gz`` said only the usage line ('... PACKAGE_DIR'), naming neither the file nor the fix."""
    import gzip
    import zipfile
    (tmp_path / "pkg" / "ORG").mkdir(parents=True)
    with tarfile.open(tmp_path / "pkg.tar.gz", "w:gz") as t:
        t.add(tmp_path / "pkg", "pkg")
    with tarfile.open(tmp_path / "pkg.tar", "w") as t:
        t.add(tmp_path / "pkg", "pkg")
    (tmp_path / "notes.gz").write_bytes(gzip.compress(b"notes\n"))
    with zipfile.ZipFile(tmp_path / "pkg.zip", "w") as z:
        z.writestr("pkg/ORG/x", "x")
    (tmp_path / "notes.txt").write_text("notes\n")
    where = "the folder holding ORG/results and ORG/systems"
    for name, kind in [("pkg.tar.gz", "a tar archive (gzip-compressed)"), ("pkg.tar", "a tar archive"),
                       ("notes.gz", "gzip-compressed"), ("pkg.zip", "a zip archive")]:
        with pytest.raises(UserError) as e:
            score.main(["score", "--noplots", str(tmp_path / name)])
        assert str(e.value) == ("score: %s is %s, not a package directory: extract it and pass %s"
                                % (tmp_path / name, kind, where))
    with pytest.raises(UserError) as e:
        score.main(["score", "--noplots", str(tmp_path / "notes.txt")])
    assert str(e.value) == "score: %s is a file, not a package directory: pass %s" % (tmp_path / "notes.txt", where)
    with pytest.raises(UserError) as e:
        score.main(["score", "--noplots", str(tmp_path / "missing")])
    assert str(e.value) == "score: %s does not exist: pass the package directory (%s)" % (tmp_path / "missing", where)


def test_a_null_field_the_official_tools_pass_is_not_failed_here(official_tools, package):
    """A hostile sweep: "hw_notes": null in the systems JSON: the official package checker and result
    summarizer pass the package (3.5022071145 minutes), score failed it ("hw_notes is a null: give it
    as text"). A null the official tools read (a node count) still leaves the system without a score,
    by their failure; package still writes no null."""
    system_json = next(package.glob("NVIDIA/systems/*.json"))
    desc = json.loads(system_json.read_text())
    system_json.write_text(json.dumps(dict(desc, hw_notes=None)))
    s = score.score(str(package))
    assert s["systems"][0]["verdict"] == "pass", s["systems"][0]["reasons"]
    assert s["systems"][0]["time_to_train_min"] == pytest.approx(3.5022071145, abs=1e-9)
    system_json.write_text(json.dumps(dict(desc, accelerators_per_node=None)))
    s = score.score(str(package))["systems"][0]
    assert s["verdict"] == "fail" and s["time_to_train_min"] is None
    assert any("result summarizer" in r for r in s["reasons"]), s["reasons"]
    system_json.write_text(json.dumps(dict(desc, hw_notes=None)))
    with pytest.raises(UserError, match="hw_notes is a null: give it as text"):
        pkg_mod.load_system_json(str(system_json))


def test_a_number_the_official_checker_joins_as_text_is_refused_a_field_it_does_not_read_is_its_own(
        official_tools, package, tmp_path):
    """A hostile sweep: "accelerators_per_node": 8 (a number, not "8") was packaged (exit 0), and the
    official package checker then ended in a TypeError (its system-description checker joins the
    results table's row as text). And score failed a list in a field the official tools do not read
    ("cooling": ["air"], a field of the submitter's own), which they pass."""
    desc = json.loads(nyx_json(tmp_path).read_text())
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(dict(desc, accelerators_per_node=8)))
    argv = [a for a in nyx_argv(package / BERT, tmp_path / "pkg") if not a.startswith("--system_json")]
    with pytest.raises(UserError) as e:
        pkg_mod.main(argv + ["--system_json=%s" % bad])
    assert str(e.value) == "systems JSON %s: accelerators_per_node is a number: give it as text (\"...\")" % bad
    assert not (tmp_path / "pkg").exists()
    nyx_json(tmp_path).write_text(json.dumps(dict(desc, cooling=["air"], rack={"u": [4]}, number_of_nodes=1)))
    s = score.score(str(package))["systems"][0]
    assert s["verdict"] == "pass", s["reasons"]
    assert s["time_to_train_min"] == pytest.approx(3.5022071145, abs=1e-9)


def test_a_runs_minutes_are_those_the_official_summarizer_times(tmp_path):
    """A hostile sweep: with a second run_start in NVIDIA's v5.0 nyx result_0 (the package checker finds
    no error), score's table gave result_0 3.6711 minutes (the first run_start to the last run_stop)
    where the official summarizer times 2.6711 (the last run_start before the first run_stop), and
    "olympic mean: drops" named the wrong runs. Each edit's minutes are the summarizer's own. A second
    sweep: start_training.sh's RESULT line (harness.run_state, "what MLPerf scores") still timed the
    first run_start to the last run_stop: the same pair now."""
    from mlperf_logging.compliance_checker.mlp_parser import parse_file
    from mlperf_logging.result_summarizer import result_summarizer
    from mlperf_bert.harness import run_state
    from mlperf_bert.harness.records import read_log
    with gzip.open(os.path.join(DATA, "mlperf_logs", "v5.0_NVIDIA_nyx_n1_result_0.txt.gz"), "rt") as f:
        lines = f.read().splitlines()
    start = next(i for i, line in enumerate(lines) if '"key": "run_start"' in line)
    stop = next(i for i, line in enumerate(lines) if '"key": "run_stop"' in line)

    def later(line, ms):
        stamp = re.search(r'"time_ms": (\d+)', line).group(1)
        return line.replace(stamp, str(int(stamp) + ms))
    edits = {"as published": lines,
             "a second run_start": lines[:start + 1] + [later(lines[start], 60000)] + lines[start + 1:],
             "a second run_stop": lines + [later(lines[stop], 60000)]}
    seen = set()
    for name, text in edits.items():
        path = tmp_path / (name.replace(" ", "_") + ".txt")
        path.write_text("\n".join(text) + "\n")
        begin, end = result_summarizer._query_run_start_stop(parse_file(str(path), ruleset="5.0.0")[0])
        minutes = score.run_summary(read_log(str(path)))[2]
        assert minutes == pytest.approx((end - begin) / 60000.0, abs=1e-9), name
        assert run_state.run_seconds(*run_state.run_start_stop(read_log(str(path)))) == pytest.approx((end - begin) / 1000.0, abs=1e-9), name
        seen.add(round(minutes, 4))
    assert seen == {2.6711, 3.6711}  # the edits move it, as they move the summarizer's


def test_a_runs_samples_are_those_the_rcp_checker_reads(tmp_path):
    """A sweep: score's run table gave a log's train_samples as its samples to converge, also where
    the log states a budget there before training (tinycorp v5.0: 3,600,000; it converged at
    3,148,992; Habana v3.1: 3,001,600.0 for 2,401,280). The official RCP checker (without
    --rcp-bert-train-samples, as score runs it) reads the last eval's epoch_num: so does the table."""
    from mlperf_logging.rcp_checker.rcp_checker import read_submission_file
    from mlperf_bert.harness.records import read_log
    logs = os.path.join(DATA, "mlperf_logs")
    for name in sorted(os.listdir(logs)):
        if not name.endswith(".txt.gz"):
            continue
        path = tmp_path / name[:-len(".gz")]
        with gzip.open(os.path.join(logs, name), "rb") as f:
            path.write_bytes(f.read())
        _, samples, _, status = score.run_summary(read_log(str(path)))
        not_converged, official, _, _ = read_submission_file(str(path), "5.0.0", False)
        if status == "success":
            assert (not_converged, samples) == (0, official), name


def test_result_and_system_names_that_are_not_utf8_are_drawn(tmp_path):
    """A hostile sweep: a result file (or system folder) named with a byte that is not UTF-8, which
    Python keeps as a surrogate, stopped score's plots with matplotlib's TypeError traceback and exit
    1, score's "a system fails" status (the official tools had passed it); plot-log's title too."""
    s = _summary([1, 2, 3])
    bad = os.fsdecode(b"result_\xff.txt")
    s["runs"][2] = (os.path.join("NVIDIA", "results", os.fsdecode(b"nyx\xfe"), "bert", bad),) + s["runs"][2][1:]
    s["evals"][bad] = s["evals"].pop("result_2.txt")
    paths = (str(tmp_path / "t.png"), str(tmp_path / "c.png"))
    score.plot(s, paths)
    assert all(open(p, "rb").read(4) == b"\x89PNG" for p in paths)
    from mlperf_bert.harness import plot
    assert plot.shown(bad) == "result_\ufffd.txt"
    log = tmp_path / os.fsdecode(b"bad\xffname.txt")
    with gzip.open(os.path.join(DATA, "mlperf_logs", "v5.0_NVIDIA_nyx_n1_result_0.txt.gz"), "rb") as f:
        log.write_bytes(f.read())
    assert plot.main(["plot-log", str(log), "--output=%s" % (tmp_path / "x.png")]) == 0
    assert open(tmp_path / "x.png", "rb").read(4) == b"\x89PNG"


def test_records_nested_past_the_json_parser_are_one_line(tmp_path):
    """A hostile sweep: ORG/mlperf_bert_package.json, a run's run_finished.json or run_stopped.json of JSON
    nested past the parser's depth was a RecursionError traceback in score, package and start_training.sh's
    run_state."""
    from mlperf_bert.harness import run_state
    deep = "[" * 100000 + "]" * 100000
    (tmp_path / pkg_mod.MADE_BY).write_text(deep)
    with pytest.raises(UserError, match=r"^cannot read .*%s \(JSON nested too deeply" % re.escape(pkg_mod.MADE_BY)):
        pkg_mod.read_made_by(str(tmp_path))
    for name in (run_state.FINISHED, run_state.STOPPED):
        (tmp_path / name).write_text(deep)
    assert run_state.finished_status(str(tmp_path)) == "unreadable"
    assert run_state.disagreement(str(tmp_path), str(tmp_path / "mlperf.log")) is None
    log = tmp_path / "mlperf.log"
    log.write_text(':::MLLOG {"key": "seed", "value": 1, "time_ms": 1, "namespace": "", "event_type": "POINT_IN_TIME", '
                   '"metadata": {}}\n')
    assert pkg_mod.launch_records([str(log)], [[]])[0]["run_finished"] is None
