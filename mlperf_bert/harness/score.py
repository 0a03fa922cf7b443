"""``score DIR [--json]``: the official verdict and score of a submission package.

On a copy of the package (the official tools write into it), runs mlperf_logging's package
checker (compliance of every log, seeds, RCP check with its scaling factor) and result
summarizer (olympic mean of the run times, times the scaling factor), training ruleset 5.0.0,
the last with BERT; then prints per run: seed, samples to converge, minutes, status; and the
submission's RCP verdict, scaling factor and time to train.  Exit 1 when the package fails.
"""
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

from mlperf_bert import flags
from mlperf_bert.errors import UserError
from mlperf_bert.harness.compliance import RULESET, read_log, samples_of
from mlperf_bert.harness.plot import curves

_OK = "PACKAGE CHECKER FOUND NO ERRORS"


def find_org(package):
    """(root, org) of a package given as its root (holding ORG/) or as ORG itself."""
    package = os.path.abspath(package)
    if os.path.isdir(os.path.join(package, "results")) and os.path.isdir(os.path.join(package, "systems")):
        return os.path.dirname(package), os.path.basename(package)
    orgs = [d for d in sorted(os.listdir(package)) if os.path.isdir(os.path.join(package, d, "results"))]
    if len(orgs) != 1:
        raise UserError("%s is not a submission package: give the directory holding ORG/results/<system>/bert/"
                        " and ORG/systems/<system>.json (or ORG itself)" % package)
    return package, orgs[0]


def run_summary(path):
    """(seed, samples to converge, minutes, status) of one result log."""
    records = read_log(path)
    by_key = {}
    for r in records:
        by_key.setdefault(r.key, []).append(r)
    seed = by_key["seed"][0].value if "seed" in by_key else None
    start, stop = by_key.get("run_start", [None])[0], by_key.get("run_stop", [None])[-1]
    minutes = (stop.time_ms - start.time_ms) / 60000.0 if start and stop else None
    evals = by_key.get("eval_accuracy", [])
    samples = by_key["train_samples"][-1].value if "train_samples" in by_key else (
        samples_of(evals[-1]) if evals else None)
    return seed, samples, minutes, stop.metadata.get("status") if stop else None


def _official(cwd, tool, org):
    proc = subprocess.run([sys.executable, "-m", "mlperf_logging." + tool, org, "training", RULESET],
                          cwd=cwd, capture_output=True, text=True)
    return proc.stdout + proc.stderr


def score(package):
    """Check and score a copy of ``package``; return a dict (see main)."""
    root, org = find_org(package)
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copytree(os.path.join(root, org), os.path.join(tmp, org))
        checker = _official(tmp, "package_checker", org)
        ok = _OK in checker
        errors = [l.split(" - ", 1)[-1] for l in checker.splitlines() if l.startswith("ERROR")]
        _official(tmp, "result_summarizer", org)
        summary = {}
        if os.path.exists(os.path.join(tmp, "summary.json")):
            with open(os.path.join(tmp, "summary.json")) as f:
                rows = json.load(f)
            summary = next((r for r in rows if r.get("bert:time_to_train") is not None), rows[0] if rows else {})
        logs = sorted(glob.glob(os.path.join(tmp, org, "results", "*", "bert", "result_*.txt")))
        runs = [(os.path.relpath(p, tmp),) + run_summary(p) for p in logs]
        evals = {os.path.basename(p): curves(read_log(p)).get("eval_accuracy", []) for p in logs}
    return {"package_check": "pass" if ok else "fail", "errors": errors, "runs": runs,
            "time_to_train_min": summary.get("bert:time_to_train"),
            "rcp_scaling_factor": summary.get("bert:rcp_scaling_factor"),
            "samples_to_converge": summary.get("bert:samples_to_converge"),
            "rcp": summary.get("bert:RCP"), "system": summary.get("system"), "evals": evals}


def plot(s, out_dir):
    """A bar chart of the runs' minutes and their eval curves: score_times.png, score_convergence.png."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    paths = []
    names = [os.path.basename(r[0])[:-4] for r in s["runs"]]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    ax.bar(names, [r[3] or 0 for r in s["runs"]],
           color=["tab:blue" if r[4] == "success" else "tab:red" for r in s["runs"]])
    if s["time_to_train_min"] is not None:
        ax.axhline(s["time_to_train_min"], ls="--", color="tab:green",
                   label="time to train %.4g min" % s["time_to_train_min"])
        ax.legend()
    ax.set_ylabel("minutes (run_start to run_stop)")
    ax.tick_params(axis="x", labelrotation=45)
    fig.tight_layout()
    paths.append(os.path.join(out_dir, "score_times.png"))
    fig.savefig(paths[-1])
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    for name, points in s["evals"].items():
        if points:
            ax.plot(*zip(*points), ".-", label=name[:-4])
    ax.set_xlabel("training samples")
    ax.set_ylabel("eval masked-LM accuracy")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    paths.append(os.path.join(out_dir, "score_convergence.png"))
    fig.savefig(paths[-1])
    plt.close(fig)
    return paths


def main(argv):
    fv = flags.FlagValues()
    flags.DEFINE_bool("json", False, "end with one JSON object of the score", flag_values=fv)
    flags.DEFINE_bool("plots", True, "write score_times.png and score_convergence.png into the package dir",
                      flag_values=fv)
    rest = flags.parse(fv, argv)
    if len(rest) != 1 or not os.path.isdir(rest[0]):
        raise UserError("usage: score [--json] PACKAGE_DIR (a directory holding ORG/results and ORG/systems)")
    s = score(rest[0])
    print("%-60s %8s %12s %9s  %s" % ("run", "seed", "samples", "minutes", "status"))
    for path, seed, samples, minutes, status in s["runs"]:
        print("%-60s %8s %12s %9s  %s" % (path, seed, samples, "%.4f" % minutes if minutes is not None else "-", status))
    print("package checker (mlperf_logging, training %s): %s" % (RULESET, s["package_check"].upper()))
    for e in s["errors"]:
        print("  " + e)
    print("RCP: %s, scaling factor %s; samples to converge %s; time to train %s minutes"
          % (s["rcp"], s["rcp_scaling_factor"], s["samples_to_converge"], s["time_to_train_min"]))
    if fv.plots and s["runs"]:
        print("plots: %s" % ", ".join(plot(s, rest[0])))
    if fv.json:
        print(json.dumps({k: s[k] for k in ("time_to_train_min", "rcp_scaling_factor", "samples_to_converge",
                                            "package_check")}))
    return 0 if s["package_check"] == "pass" else 1
