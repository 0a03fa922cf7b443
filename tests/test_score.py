"""score: the official package checker and result summarizer on a real v5.0 submission package
(NVIDIA nyx, tests/data), and on the same package broken in the ways the rules reject."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time

import pytest

from mlperf_bert.errors import UserError
from mlperf_bert.harness import score

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
BERT = os.path.join("NVIDIA", "results", "nyx_n1_ngc25.04_pytorch", "bert")


@pytest.fixture
def package(tmp_path):
    with tarfile.open(os.path.join(DATA, "submission_v5.0_NVIDIA_nyx_n1.tar.gz")) as t:
        t.extractall(tmp_path, filter="data")
    return tmp_path / "submission_v5.0_NVIDIA_nyx_n1"


def test_real_package_gets_its_official_score(package):
    before = sorted(p.relative_to(package) for p in package.rglob("*"))
    proc = subprocess.run([sys.executable, "-m", "mlperf_bert", "score", "--json", str(package)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = json.loads(proc.stdout.splitlines()[-1])
    # what mlperf-logging 4.1.68 says of this package (tests/data/README.md)
    assert got == {"time_to_train_min": pytest.approx(3.5022071145, abs=1e-9),
                   "rcp_scaling_factor": pytest.approx(1.0028470154, abs=1e-9),
                   "samples_to_converge": 2436995.375, "package_check": "pass", "verdict": "pass"}
    assert "result_0.txt        27912      2550982    3.6711  success  PASS" in proc.stdout
    assert proc.stdout.count("  success  PASS\n") == 10  # each run's check-log verdict
    assert "RCP check: Pass, scaling factor 1.0028470154; samples to converge 2436995.375" in proc.stdout
    # the fastest (2.7828 min) and the slowest (3.8963 min) run
    assert "olympic mean: drops result_6.txt and result_1.txt" in proc.stdout
    # the package stays as submitted (the official tools ran on a copy, the plots go beside it)
    assert sorted(p.relative_to(package) for p in package.rglob("*")) == before
    for name in ("score_times", "score_convergence"):
        assert (package.parent / ("%s.%s.png" % (package.name, name))).read_bytes()[:4] == b"\x89PNG"


def test_a_missing_log_fails_with_the_checkers_reason(package):
    os.remove(package / BERT / "result_3.txt")
    s = score.score(str(package))
    assert s["package_check"] == "fail"
    assert any("found 9, expected 10" in e for e in s["errors"]), s["errors"]


def test_two_aborted_runs_fail(package):
    for n in (1, 2):
        log = package / BERT / ("result_%d.txt" % n)
        log.write_text(log.read_text().replace('"status": "success"', '"status": "aborted"'))
    proc = subprocess.run([sys.executable, "-m", "mlperf_bert", "score", str(package)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout
    assert "package checker (mlperf_logging, training 5.0.0): FAIL" in proc.stdout
    assert "RCP Test Failed: Insufficient convergence" in proc.stdout  # the checker's reason


def test_open_division_says_the_rcp_check_does_not_apply(package, capsys):
    """Issue 23: an open-division package printed "RCP: , scaling factor 1.0; samples to
    converge None" (what the summarizer gives there); the same package declared open here."""
    for path in list((package / BERT).glob("result_*.txt")) + list(package.glob("NVIDIA/systems/*.json")):
        path.write_text(path.read_text().replace('"closed"', '"open"'))
    score.main(["score", "--noplots", str(package)])
    out = capsys.readouterr().out
    assert "RCP check: does not apply (open division: reference convergence points bind closed-division" \
        " runs only); no scaling factor, no samples to converge" in out
    assert "RCP: ," not in out and "None" not in out.split("package checker")[1]


def test_truncated_log_among_ten_gets_no_score(package):
    """Issue 23: the official tools PASS a package with one log cut off (they drop it as a
    non-converged run); its log breaks the rules, so there is no score."""
    log = package / BERT / "result_5.txt"
    log.write_text("".join(log.read_text().splitlines(keepends=True)[:300]))
    s = score.score(str(package))
    assert s["package_check"] == "pass"  # what the official checker says
    assert s["verdict"] == "fail" and s["time_to_train_min"] is None
    assert s["run_verdicts"][5][:2] == ("FAIL", "invalid") and "run_stop" in s["run_verdicts"][5][2]
    assert "result_5.txt: run_stop" in s["reasons"][0]
    assert s["target"] == 0.720 and s["dropped"] == [6, 5]  # the cut-off run counts as the slowest


def test_score_says_why_it_fails_one_line_per_reason(package, capsys):
    """Issue 31: score said FAIL with no reason for a broken or incomplete systems JSON or an empty
    results folder, and PASS on logs of another org. Each reason is its own line under "time to train"."""
    system_json = package / "NVIDIA" / "systems" / (BERT.split(os.sep)[2] + ".json")
    desc = json.loads(system_json.read_text())
    del desc["cooling"]
    desc["status"] = "Research, Development, or Internal (RDI)"
    system_json.write_text(json.dumps(desc))
    for n in (2, 7):
        log = package / BERT / ("result_%d.txt" % n)
        log.write_text(log.read_text().replace('"submission_org", "value": "NVIDIA"', '"submission_org", "value": "ACME"'))
    assert score.main(["score", "--noplots", str(package)]) == 1
    out = capsys.readouterr().out
    reasons = out.split("time to train: none:\n", 1)[1].split("submission: FAIL")[0].splitlines()
    assert reasons == [
        "  the official package checker failed (its 2 ERROR lines above)",
        "  NVIDIA/systems/nyx_n1_ngc25.04_pytorch.json lacks 1 field the official checker requires: cooling",
        "  2 logs (result_2.txt, result_7.txt): submission_org 'ACME', the package's submitter is 'NVIDIA' (a log"
        " must name its submitter: runs made with SUBMISSION_ORG=NVIDIA)",
        "  10 logs (result_0.txt ... result_9.txt): submission_status 'onprem', the systems JSON's status"
        " 'Research, Development, or Internal (RDI)' needs 'research'"], out
    # no logs at all, and a systems JSON that is not JSON
    system_json.write_text('{"submitter": "NVIDIA"')
    for log in (package / BERT).iterdir():
        log.unlink()
    assert score.main(["score", "--noplots", str(package)]) == 1
    out = capsys.readouterr().out
    reasons = out.split("time to train: none:\n", 1)[1].split("submission: FAIL")[0].splitlines()
    assert len(reasons) == 3, out
    assert reasons[0].startswith("  the official package checker failed (")
    assert re.match(r"  systems JSON .*nyx_n1_ngc25.04_pytorch.json is not JSON \(.*\): fix the file$", reasons[1])
    assert reasons[2] == "  %s holds no results/<system>/bert/result_*.txt logs" % (package / "NVIDIA")


def test_all_runs_aborted_get_no_time_to_train(package, capsys):
    for log in (package / BERT).glob("result_*.txt"):
        log.write_text(log.read_text().replace('"status": "success"', '"status": "aborted"'))
    assert score.main(["score", "--noplots", str(package)]) == 1
    out = capsys.readouterr().out
    assert "time to train: none:" in out and "10 runs did not converge" in out
    assert "submission: FAIL" in out and "(not converged: run_stop status aborted)" in out


def test_plots_go_beside_the_package_never_into_it(package, tmp_path):
    """Issue 23/27: score wrote its PNGs into the package it scored."""
    with pytest.raises(UserError, match="inside the package"):
        score.main(["score", "--plots_dir=%s" % (package / "NVIDIA"), str(package / "NVIDIA")])
    assert score.plot_paths(str(package), None) == (str(package) + ".score_times.png",
                                                    str(package) + ".score_convergence.png")


@pytest.mark.parametrize("target", ["loop", ".."])
def test_symlink_loop_is_one_line(package, target):
    """Issue 23: a symlink loop gave a 51 KB message."""
    os.symlink(target, package / "NVIDIA" / "results" / "loop")
    with pytest.raises(UserError, match=r"package link .*loop -> %s .*(loop)" % re.escape(target)):
        score.score(str(package))


def test_sigkill_leaves_no_official_tool_running_and_no_copy(package, tmp_path):
    """Issue 23: a SIGKILLed score left result_summarizer running and its copy of the package
    in the temp folder; the tools die with score, the next score removes the copy."""
    env = dict(os.environ, TMPDIR=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-m", "mlperf_bert", "score", "--noplots", str(package)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    child = None
    deadline = time.monotonic() + 120
    while child is None and time.monotonic() < deadline and proc.poll() is None:
        for pid in os.listdir("/proc"):
            try:
                with open("/proc/%s/stat" % pid) as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                with open("/proc/%s/cmdline" % pid, "rb") as f:
                    cmd = f.read()
            except (OSError, ValueError, IndexError):
                continue
            if ppid == proc.pid and b"mlperf_logging." in cmd:
                child = int(pid)
        time.sleep(0.05)
    assert child is not None, "score never started an official tool"
    os.kill(child, signal.SIGSTOP)  # it cannot finish on its own: only score's death may end it
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 60
    while _running(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    if _running(child):
        os.kill(child, signal.SIGKILL)
        pytest.fail("the official tool outlived score")
    copies = list(tmp_path.glob("mlperf_bert_score-*"))
    assert copies  # SIGKILL skips every cleanup ...
    assert sorted(score.remove_stale_copies(str(tmp_path))) == sorted(str(c) for c in copies)  # ... the next run's
    assert not list(tmp_path.glob("mlperf_bert_score-*"))


def _running(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return False


# package: names, unfinished runs (issue 23); the systems JSON and the identity of the runs, MANIFEST.txt, a kill (issue 31, 33)
from mlperf_bert.harness import package as pkg_mod  # noqa: E402


NYX = "nyx_n1_ngc25.04_pytorch"
NYX_PLATFORM = "1xNVIDIA HGX B200"  # what NVIDIA's logs name: neither the folder nor the system_name


@pytest.fixture
def two_runs(package, tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    for i in (0, 1):
        (runs / ("result_%d.txt" % i)).write_bytes((package / BERT / ("result_%d.txt" % i)).read_bytes())
    return runs


@pytest.mark.parametrize("flag,value", [("system", "../../x"), ("org", ""), ("system", "a/b"), ("org", "..")])
def test_package_names_stay_inside_the_output(two_runs, tmp_path, flag, value):
    argv = {"org": "Org", "system": "sys"}
    argv[flag] = value
    with pytest.raises(UserError, match="--%s=" % flag):
        pkg_mod.main(["package", "--org=%s" % argv["org"], "--system=%s" % argv["system"],
                      "--runs=%s" % two_runs, "--output=%s" % (tmp_path / "out" / "pkg")])
    assert not (tmp_path / "out").exists() and not (tmp_path / "x").exists()


def test_package_refuses_a_log_without_run_stop(two_runs, tmp_path):
    log = two_runs / "result_1.txt"
    log.write_text("".join(l for l in log.read_text().splitlines(keepends=True) if '"run_stop"' not in l))
    with pytest.raises(UserError, match=r"result_1.txt has no run_stop line"):
        pkg_mod.main(["package", "--org=NVIDIA", "--system=%s" % NYX, "--runs=%s" % two_runs,
                      "--output=%s" % (tmp_path / "pkg"), "--system_json=%s" % nyx_json(two_runs.parent)])
    assert not (tmp_path / "pkg").exists()


def nyx_json(package_root):
    return package_root / "submission_v5.0_NVIDIA_nyx_n1" / "NVIDIA" / "systems" / (NYX + ".json")


def nyx_argv(runs, out):
    """package's arguments for NVIDIA's runs with NVIDIA's systems JSON (out's folder holds the package)."""
    return ["package", "--org=NVIDIA", "--system=%s" % NYX, "--runs=%s" % runs, "--output=%s" % out,
            "--system_json=%s" % nyx_json(out.parent), "--platform=%s" % NYX_PLATFORM]


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
    impl = top / "benchmarks" / "bert" / "implementations" / NYX
    copied = sorted(str(p.relative_to(impl)) for p in impl.rglob("*") if p.is_file())
    assert copied == sorted(pkg_mod.source_files())
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
    (None, ["--system_field=cooling"], r"--system_field=cooling: give KEY=VALUE"),
    (None, ["--system_field=accelerator_model_name="], r"needs accelerator_model_name: give them in --system_json"),
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


def _killed_at_copy(argv, after):
    """Run package in a forked child that SIGKILLs itself after ``after`` source files were copied."""
    import multiprocessing

    def child():
        copy2, n = shutil.copy2, [0]

        def dying_copy(*a, **k):
            n[0] += 1
            if n[0] > after:
                os.kill(os.getpid(), signal.SIGKILL)
            return copy2(*a, **k)
        shutil.copy2 = dying_copy
        pkg_mod.main(argv)
    p = multiprocessing.get_context("fork").Process(target=child)
    p.start()
    p.join(60)
    assert p.exitcode == -signal.SIGKILL


def test_package_killed_midway_leaves_nothing_the_rerun_trips_on(package, tmp_path, capsys):
    """Issue 33: a SIGKILLed package left ten result files without systems/ or source, and the same
    command was then refused ("already holds results")."""
    out = tmp_path / "pkg"
    argv = nyx_argv(package / BERT, out)
    _killed_at_copy(argv, 20)
    assert not (out / "NVIDIA").exists()  # nothing half-made where score would look
    assert [p.name for p in out.iterdir()][0].startswith(".NVIDIA.tmp-")
    assert pkg_mod.main(argv) == 0  # the same command: removes the dead build, makes the package
    assert sorted(os.listdir(out)) == ["NVIDIA"]
    assert len(list((out / "NVIDIA" / "results" / NYX / "bert").iterdir())) == 10
    assert score.find_org(str(out)) == (str(out), "NVIDIA")
    with pytest.raises(UserError, match="already holds a package of %s" % NYX):
        pkg_mod.main(argv)  # a complete package is not replaced
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
