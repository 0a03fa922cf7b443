"""``score PACKAGE_DIR [--json] [--plots_dir=DIR]``: the official verdict and score of a submission package.

On a copy of the package (the official tools write into it), runs mlperf_logging's package
checker (compliance of every log, seeds, RCP check with its scaling factor) and result
summarizer (olympic mean of the run times, times the scaling factor), training ruleset 5.0.0,
the last with BERT. Each run's log also goes through check-log (the official checker and the
BERT rules): a log that breaks the rules, or more than one run that did not converge, leaves the
submission without a score whatever the official tools say; so does a systems JSON that is not a
JSON object with the required fields and ORG as submitter, or a log whose submission_org, division
or status disagrees with the package and its systems JSON (``identity_reasons``). Prints per run:
seed, samples to converge, minutes, status, check-log verdict; then the submission's verdict, RCP
check, scaling factor and time to train (or each reason there is none, one a line). Exit 1 when
the package fails.
The package is only read: plots go beside it or to --plots_dir.
"""
import errno
import glob
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile

from mlperf_bert import flags
from mlperf_bert.errors import UserError, die_with_parent
from mlperf_bert.fileio import pid_alive, atomic_path
from mlperf_bert.harness.compliance import (FAIL, RULESET, check_log, division_of, identity_problems, read_log,
                                            samples_of, target_of, worst_level)
from mlperf_bert.harness.package import load_system_json, system_json_problems
from mlperf_bert.harness.plot import check_output, curves

_OK = "PACKAGE CHECKER FOUND NO ERRORS"
USAGE_ARGS = "PACKAGE_DIR"
# The copy the official tools work on: <tmp>/mlperf_bert_score-<pid>-XXXX, removed by the next
# score when its process is gone (a SIGKILL skips every cleanup).
_COPY_PREFIX = "mlperf_bert_score-"
# Rules an aborted run fails by not converging; any other failure makes its log invalid.
_NOT_CONVERGED_RULES = {"official_checker", "stop_at_target"}


def find_org(package):
    """(root, org) of a package given as its root (holding ORG/) or as ORG itself."""
    package = os.path.abspath(package)
    if os.path.isdir(os.path.join(package, "results")) and os.path.isdir(os.path.join(package, "systems")):
        return os.path.dirname(package), os.path.basename(package)
    try:
        orgs = [d for d in sorted(os.listdir(package)) if os.path.isdir(os.path.join(package, d, "results"))
                and not d.startswith(".")]  # .ORG.tmp-PID: a package being built, or killed while it was
    except OSError as e:
        raise UserError("cannot read package %s: %s" % (package, e.strerror))
    if len(orgs) != 1:
        raise UserError("%s is not a submission package: give the directory holding ORG/results/<system>/bert/"
                        " and ORG/systems/<system>.json (or ORG itself)" % package)
    return package, orgs[0]


def check_links(top):
    """UserError for a symlink under ``top`` that loops or points at a directory holding it: the
    copy (and the official tools' walk) would never end."""
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            if not os.path.islink(path):
                continue
            try:
                os.stat(path)
            except OSError as e:
                if e.errno == errno.ELOOP:
                    raise UserError("package link %s -> %s is a symlink loop: remove it"
                                    % (path, os.readlink(path)))
                continue  # a dangling link: the checker names what is missing
            real = os.path.realpath(path)
            if os.path.isdir(real) and (os.path.realpath(dirpath) + os.sep).startswith(real.rstrip(os.sep) + os.sep):
                raise UserError("package link %s -> %s points at a directory holding it (a loop): remove it"
                                % (path, os.readlink(path)))


def remove_stale_copies(tmpdir=None):
    """Remove package copies left in the temp folder by a score that was killed; return them."""
    removed = []
    for d in glob.glob(os.path.join(tmpdir or tempfile.gettempdir(), _COPY_PREFIX + "*")):
        pid = os.path.basename(d)[len(_COPY_PREFIX):].split("-", 1)[0]
        try:
            mine = os.lstat(d).st_uid == os.getuid()
        except OSError:
            continue
        if not pid.isdigit() or not mine or int(pid) == os.getpid() or pid_alive(int(pid)):
            continue
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d)
    return removed


def run_summary(records):
    """(seed, samples to converge, minutes, status) of one result log's records."""
    by_key = {}
    for r in records:
        by_key.setdefault(r.key, []).append(r)
    seed = by_key["seed"][0].value if "seed" in by_key else None
    start, stop = by_key.get("run_start", [None])[0], by_key.get("run_stop", [None])[-1]
    minutes = (stop.time_ms - start.time_ms) / 60000.0 if start and stop and None not in (
        start.time_ms, stop.time_ms) else None
    evals = by_key.get("eval_accuracy", [])
    samples = by_key["train_samples"][-1].value if "train_samples" in by_key else (
        samples_of(evals[-1]) if evals else None)
    return seed, samples, minutes, stop.metadata.get("status") if stop else None


def run_verdict(path, status):
    """(verdict, kind, reason) of one run's log (its run_stop ``status``) under check-log: kind is
    "ok", "not converged" (aborted, and only the rules about reaching the target fail: a submission
    may drop one such run) or "invalid" (the log breaks a rule or cannot be read: no score)."""
    try:
        results = check_log(path, official=True)
    except UserError as e:
        return FAIL, "invalid", str(e)
    verdict = worst_level(results)
    failed = [r for r in results if r.level == FAIL]
    if not failed:
        return verdict, "ok", ""
    if status == "aborted" and {r.rule for r in failed} <= _NOT_CONVERGED_RULES:
        return verdict, "not converged", "run_stop status aborted"
    # run_stop first: a log without its end (cut off) is what most often fails many rules at once
    first = next((r for r in failed if r.rule == "run_stop"),
                 next((r for r in failed if r.rule != "official_checker"), failed[0]))
    return verdict, "invalid", "%s: %s" % (first.rule, first.detail)


def _die_with_parent(parent):
    """preexec_fn: the official tool gets SIGKILL when score dies, even by SIGKILL (Linux)."""
    return lambda: die_with_parent(parent, signal.SIGKILL, 1)


def _official(cwd, tool, org):
    proc = subprocess.run([sys.executable, "-m", "mlperf_logging." + tool, org, "training", RULESET],
                          cwd=cwd, capture_output=True, text=True, preexec_fn=_die_with_parent(os.getpid()))
    return proc.stdout + proc.stderr


def olympic_dropped(runs):
    """Indexes of the runs the olympic mean drops: the fastest, then the slowest (a run that did
    not succeed counts as the slowest)."""
    timed = sorted(range(len(runs)), key=lambda i: runs[i][3] if runs[i][4] == "success"
                   and runs[i][3] is not None else math.inf)
    return [timed[0], timed[-1]] if len(timed) > 2 else []


def score(package):
    """Check and score a copy of ``package``; return a dict (see main)."""
    root, org = find_org(package)
    check_links(os.path.join(root, org))
    remove_stale_copies()
    logs = sorted(glob.glob(os.path.join(root, org, "results", "*", "bert", "result_*.txt")))
    with tempfile.TemporaryDirectory(prefix="%s%d-" % (_COPY_PREFIX, os.getpid())) as tmp:
        try:
            shutil.copytree(os.path.join(root, org), os.path.join(tmp, org))
        except (OSError, shutil.Error) as e:
            first = e.args[0][0] if isinstance(e, shutil.Error) and e.args and e.args[0] else e
            raise UserError("cannot copy package %s: %s" % (os.path.join(root, org), first))
        checker = _official(tmp, "package_checker", org)
        ok = _OK in checker
        errors = [l.split(" - ", 1)[-1] for l in checker.splitlines() if l.startswith("ERROR")]
        _official(tmp, "result_summarizer", org)
        summary = {}
        if os.path.exists(os.path.join(tmp, "summary.json")):
            with open(os.path.join(tmp, "summary.json")) as f:
                rows = json.load(f)
            summary = next((r for r in rows if r.get("bert:time_to_train") is not None), rows[0] if rows else {})
    runs, verdicts, evals, divisions, targets = [], [], {}, set(), set()
    parsed = {}  # system -> [(log, records)]
    for p in logs:
        rel = os.path.relpath(p, root)
        try:
            records = read_log(p)
        except UserError as e:
            verdicts.append((FAIL, "invalid", str(e)))
            runs.append((rel, None, None, None, None))
            continue
        parsed.setdefault(rel.split(os.sep)[2], []).append((p, records))
        row = (rel,) + run_summary(records)
        verdicts.append(run_verdict(p, row[4]))
        runs.append(row)
        evals[os.path.basename(p)] = curves(records).get("eval_accuracy", [])
        divisions.add(division_of(records))
        targets.add(target_of(records, division_of(records) or "closed"))
    division = divisions.pop() if len(divisions) == 1 else None
    reasons = []
    if not ok:
        last = [l for l in checker.splitlines() if l.strip()][-1:] or ["no output"]
        reasons.append("the official package checker failed (%s)" % (
            "its %d ERROR line%s above" % (len(errors), "s" if len(errors) > 1 else "") if errors
            else "no ERROR line; its last line: %s" % last[0].strip()))
    reasons += identity_reasons(root, org, parsed)
    invalid = [(r[0], v[2]) for r, v in zip(runs, verdicts) if v[1] == "invalid"]
    if invalid:
        name, why = invalid[0]
        reasons.append("%d run log%s break%s the rules (%s: %s%s)" % (
            len(invalid), "s" if len(invalid) > 1 else "", "" if len(invalid) > 1 else "s",
            os.path.basename(name), why, "; the others: see the check-log column" if len(invalid) > 1 else ""))
    not_converged = sum(v[1] == "not converged" for v in verdicts)
    if not_converged > 1:
        reasons.append("%d runs did not converge (a submission may drop one)" % not_converged)
    if not runs:
        reasons.append("%s holds no results/<system>/bert/result_*.txt logs" % os.path.join(root, org))
    time_to_train = summary.get("bert:time_to_train")
    if not reasons and time_to_train is None:
        reasons.append("the result summarizer gave no time to train")
    passed = not reasons
    return {"package_check": "pass" if ok else "fail", "verdict": "pass" if passed else "fail",
            "reasons": reasons, "errors": errors, "runs": runs, "run_verdicts": verdicts,
            "time_to_train_min": time_to_train if passed else None,
            "rcp_scaling_factor": summary.get("bert:rcp_scaling_factor"),
            "samples_to_converge": summary.get("bert:samples_to_converge"),
            "rcp": summary.get("bert:RCP"), "system": summary.get("system"), "evals": evals,
            "division": division, "target": targets.pop() if len(targets) == 1 else None,
            "dropped": olympic_dropped(runs)}


def run_table(s):
    """The per-run lines: run, seed, samples, minutes, status, check-log verdict; each column as wide as
    its widest value (a 9-digit seed or a long path keeps the columns in line)."""
    rows = [("run", "seed", "samples", "minutes", "status", "check-log")]
    for (path, seed, samples, minutes, status), (verdict, kind, why) in zip(s["runs"], s["run_verdicts"]):
        rows.append((path, str(seed), str(samples), "%.4f" % minutes if minutes is not None else "-", str(status),
                     verdict + (" (%s: %s)" % (kind, why) if why else "")))
    widths = [max([least] + [len(r[i]) for r in rows]) for i, least in enumerate((60, 8, 12, 9, 8))]
    return ["%-*s %*s %*s %*s  %-*s %s" % (widths[0], r[0], widths[1], r[1], widths[2], r[2], widths[3], r[3],
                                           widths[4], r[4], r[5]) for r in rows]


def plot_title(s):
    """What the plots are of: the system (the result summarizer's name, else the results/ folder),
    the division and the verdict."""
    system = s.get("system") or next((r[0].split(os.sep)[2] for r in s["runs"] if r[0].count(os.sep) >= 3), "?")
    return "%s, %s division: %d runs, submission %s" % (system, s.get("division") or "unknown", len(s["runs"]),
                                                       s["verdict"].upper())


def identity_reasons(root, org, parsed):
    """Why a package's systems JSONs or its logs' declared identity fail: for each system under
    results/, its systems/<system>.json must be a JSON object with every field the official checker
    requires, name ORG as submitter, and agree with every log's submission_org, division and status;
    the logs must name one platform, not a placeholder. (Published packages name the platform freely,
    e.g. NVIDIA's "1xNVIDIA HGX B200" for system "Nyx (1x NVIDIA DGX B200)": it is not compared with
    the system's name here; ``package`` does compare it.)"""
    reasons = []
    systems = sorted(set(parsed) | {d for d in os.listdir(os.path.join(root, org, "results"))
                                    if os.path.isdir(os.path.join(root, org, "results", d))})
    for system in systems:
        rel = os.path.join(org, "systems", system + ".json")
        try:
            desc = load_system_json(os.path.join(root, rel))
        except UserError as e:
            reasons.append(str(e))
            continue
        reasons += system_json_problems(desc, rel)
        if desc.get("submitter") != org:
            reasons.append("%s: submitter %r, the package's org folder is %r" % (rel, desc.get("submitter"), org))
        reasons += [("%s: %s" % (system, p) if len(systems) > 1 else p)
                    for p in identity_problems(parsed.get(system, []), org, desc.get("division"), desc.get("status"))]
    return reasons


def rcp_line(s):
    """The RCP part of the report, saying what does not apply and why."""
    if s["division"] == "open":
        return ("RCP check: does not apply (open division: reference convergence points bind closed-division"
                " runs only); no scaling factor, no samples to converge")
    if not s["rcp"]:
        return "RCP check: not run (the result summarizer gave no RCP verdict)"
    return "RCP check: %s, scaling factor %s; samples to converge %s" % (
        s["rcp"], s["rcp_scaling_factor"], s["samples_to_converge"])


def plot_paths(root, plots_dir):
    """(times PNG, convergence PNG): in ``plots_dir``, else beside the package (never inside it)."""
    root = os.path.abspath(root)
    if plots_dir:
        real = os.path.realpath(plots_dir)
        if (real + os.sep).startswith(os.path.realpath(root) + os.sep):
            raise UserError("--plots_dir %s is inside the package %s: a package stays as submitted; choose"
                            " a directory outside it" % (plots_dir, root))
        return os.path.join(plots_dir, "score_times.png"), os.path.join(plots_dir, "score_convergence.png")
    base = os.path.join(os.path.dirname(root), os.path.basename(root))
    return base + ".score_times.png", base + ".score_convergence.png"


def plot(s, paths):
    """A bar chart of the runs' minutes (the runs the olympic mean drops hatched) and their eval
    curves with the target line."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    for p in paths:
        check_output(p)
    names = [os.path.basename(r[0])[:-4] for r in s["runs"]]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    bars = ax.bar(names, [r[3] or 0 for r in s["runs"]],
                  color=["tab:blue" if r[4] == "success" else "tab:red" for r in s["runs"]])
    for i in s["dropped"]:
        bars[i].set_hatch("//")
        bars[i].set_alpha(0.45)
    if s["dropped"]:
        bars[s["dropped"][0]].set_label("dropped by the olympic mean")
    if s["time_to_train_min"] is not None:
        ax.axhline(s["time_to_train_min"], ls="--", color="tab:green",
                   label="time to train %.4g min" % s["time_to_train_min"])
    if s["dropped"] or s["time_to_train_min"] is not None:
        ax.legend(fontsize=8)
    ax.set_ylabel("minutes (run_start to run_stop)")
    ax.set_title("Time to train per run\n" + plot_title(s), fontsize=9)
    ax.tick_params(axis="x", labelrotation=45)
    fig.tight_layout()
    with atomic_path(paths[0]) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    for name, points in s["evals"].items():
        if points:
            ax.plot(*zip(*points), ".-", label=name[:-4])
    if s["target"] is not None:
        ax.axhline(s["target"], ls="--", color="black", label="target %.3f" % s["target"])
    ax.set_xlabel("training samples")
    ax.set_ylabel("eval masked-LM accuracy")
    ax.set_title("Eval accuracy per run\n" + plot_title(s), fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    with atomic_path(paths[1]) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
    return list(paths)


def main(argv):
    fv = flags.FlagValues()
    flags.DEFINE_bool("json", False, "end with one JSON object of the score", flag_values=fv)
    flags.DEFINE_bool("plots", True, "write score_times.png and score_convergence.png (beside the package,"
                      " as PACKAGE.score_*.png, or into --plots_dir)", flag_values=fv)
    flags.DEFINE_string("plots_dir", None, "directory for the plots (outside the package)", flag_values=fv)
    rest = flags.parse(fv, argv, positional=USAGE_ARGS)
    if len(rest) != 1 or not os.path.isdir(rest[0]):
        raise UserError("%s (a directory holding ORG/results and ORG/systems)" % flags.usage("score", USAGE_ARGS))
    root = find_org(rest[0])[0]
    paths = plot_paths(root, fv.plots_dir) if fv.plots else None
    s = score(rest[0])
    for line in run_table(s):
        print(line)
    print("package checker (mlperf_logging, training %s): %s" % (RULESET, s["package_check"].upper()))
    for e in s["errors"]:
        print("  " + e)
    print(rcp_line(s))
    if s["dropped"]:
        print("olympic mean: drops %s" % " and ".join(
            os.path.basename(s["runs"][i][0]) for i in s["dropped"]))
    if s["verdict"] == "pass":
        print("time to train: %s minutes" % s["time_to_train_min"])
    else:
        print("time to train: none:")
        for reason in s["reasons"]:
            print("  " + reason)
    print("submission: %s" % s["verdict"].upper())
    if paths and s["runs"]:
        print("plots: %s" % ", ".join(plot(s, paths)))
    if fv.json:
        print(json.dumps({k: s[k] for k in ("time_to_train_min", "rcp_scaling_factor", "samples_to_converge",
                                            "package_check", "verdict")}))
    return 0 if s["verdict"] == "pass" else 1
