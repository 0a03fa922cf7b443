"""``score PACKAGE_DIR [--json] [--plots_dir=DIR]``: the official verdict and score of each system of a
submission package.

On a copy of the package (the official tools write into it), runs the three steps of MLCommons'
``verify_for_v5.0_training.sh``, training ruleset 5.0.0: mlperf_logging's package checker
(compliance of every log, seeds, RCP check with its scaling factor), result summarizer (per
system, the olympic mean of the run times, times the scaling factor) and repo checker (names git
refuses, files over 50 MB, broken links); each step gets its verdict line. Then, as the
summarizer does, one block per system of ORG/results/: each run's log through check-log (the
official checker and the BERT rules), the system's share of the checker's errors, its RCP line,
time to train and verdict. A log that breaks the rules, more than one run that did not converge,
a systems JSON that is not a JSON object with the required fields, logs of another division than
their systems JSON, an error of the official tools (the system's own, or one of the whole package)
leave the system without a score whatever else says it has one; each reason is one line. What the
official tools accept but is stricter here (a log's submission_org, platform or status against the
package: ``identity_findings``; no implementation under ORG/benchmarks/ in a package ``package``
did not make; logs that are byte for byte another system's) is a warning line; a system that
``package`` packaged without its implementation fails. Exit 1 when a system fails. With --json the
JSON object alone goes to stdout, the report to stderr. The package is only read: plots go beside
it or to --plots_dir.
"""
import contextlib
import errno
import glob
import hashlib
import importlib
import json
import locale
import math
import os
import re
import runpy
import shutil
import signal
import sys
import tarfile
import tempfile
import traceback
import warnings

from mlperf_bert import flags
from mlperf_bert.errors import UserError, die_with_parent, stops_held_over_fork
from mlperf_bert.fileio import (OutputDirError, atomic_path, check_writable_dir, compression, pid_alive,
                                read_text, usable_tempdir)
from mlperf_bert.harness.compliance import (FAIL, RULESET, SCORE_FAILS, check_log, division_of, identity_findings,
                                            in_run_order, not_converged, read_log, run_number, samples_of,
                                            speed_up_official_parse, target_of, worst_level)
from mlperf_bert.harness.package import (MADE_BY, implementation_dir, load_system_json, read_made_by,
                                         system_json_problems, unfinished_package)
from mlperf_bert.harness.plot import curves, is_png, pyplot, shown
from mlperf_bert.harness.records import run_seconds, run_start_stop

_OK = "PACKAGE CHECKER FOUND NO ERRORS"
USAGE_ARGS = "PACKAGE_DIR"
# The copy the official tools work on: <tmp>/mlperf_bert_score-<pid>-XXXX, removed by the next
# score when its process is gone (a SIGKILL skips every cleanup).
_COPY_PREFIX = "mlperf_bert_score-"
# Rules a run fails by not converging (run_stop too where the log has none: a run that trained out
# its budget and logged no run_stop, as tinycorp's published v4.1 result_2.txt); any other failure
# (a run_stop line that breaks its rule among them) makes its log invalid.
_NOT_CONVERGED_RULES = {"official_checker", "stop_at_target"}


def find_org(package):
    """(root, org) of a package given as its root (holding ORG/) or as ORG itself; a UserError
    naming the package command to rerun when ``package`` has not finished it (stopped, or running)."""
    package = os.path.abspath(package)
    if os.path.isdir(os.path.join(package, "results")) and os.path.isdir(os.path.join(package, "systems")):
        root, org = os.path.dirname(package), os.path.basename(package)
        problem = unfinished_package(root, org)
        if problem:
            raise UserError(problem)
        return root, org
    try:
        orgs = [d for d in sorted(os.listdir(package)) if os.path.isdir(os.path.join(package, d, "results"))
                and not d.startswith(".")]  # .ORG.tmp-PID: a package being built, or killed while it was
    except OSError as e:
        raise UserError("cannot read package %s: %s" % (package, e.strerror))
    problem = unfinished_package(package, orgs[0] if len(orgs) == 1 else None) if len(orgs) <= 1 else None
    if problem:
        raise UserError(problem)
    if len(orgs) != 1:
        raise UserError("%s is not a submission package: give the directory holding ORG/results/<system>/bert/"
                        " and ORG/systems/<system>.json (or ORG itself)" % package)
    return package, orgs[0]


def check_links(top):
    """UserError for a symlink under ``top`` (ORG/) that loops or points at a directory holding it
    (the copy, and the official tools' walk, would never end), or leaves ``top``: the copy follows
    it, so the tools would check a file the submission does not hold (dangling once uploaded)."""
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
            if os.path.commonpath([real, os.path.realpath(top)]) != os.path.realpath(top):
                raise UserError("package link %s -> %s leaves the package (%s): a submission holds its files, put "
                                "the file itself there" % (path, os.readlink(path), top))


def remove_stale_copies(tmpdir=None):
    """Remove package copies left in the temp folder by a score that was killed; return them."""
    removed = []
    for d in glob.glob(os.path.join(glob.escape(tmpdir or usable_tempdir("score's copy of the package")),
                                   _COPY_PREFIX + "*")):
        pid = os.path.basename(d)[len(_COPY_PREFIX):].split("-", 1)[0]
        try:
            mine = os.lstat(d).st_uid == os.getuid()
        except OSError:
            continue
        if not (pid.isascii() and pid.isdigit()) or not mine or int(pid) == os.getpid() or pid_alive(int(pid)):
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
    start, stop = run_start_stop(records)
    seconds = run_seconds(start, stop)
    minutes = None if seconds is None else seconds / 60.0
    # the samples to converge as the official RCP checker reads them (without --rcp-bert-train-samples):
    # the last eval's epoch_num; train_samples only where no eval gives one (a log may state its
    # budget there, before training: tinycorp's 3,600,000 for 3,148,992 converged)
    evals = [s for s in (samples_of(r) for r in by_key.get("eval_accuracy", [])) if s is not None]
    samples = evals[-1] if evals else by_key["train_samples"][-1].value if "train_samples" in by_key else None
    return seed, samples, minutes, stop.metadata.get("status") if stop else None


def run_verdict(path, records=None):
    """((verdict, kind, reason), counted) of one run's log (``records``: its read_log) under
    check-log: kind is "ok", "not converged" (no eval at the target, its run_stop aborted or none
    after its train_samples budget: the official checker fails it for that alone, and a submission
    may drop one such run) or "invalid" (the log breaks a rule or cannot be read: no score);
    counted: whether the official result summarizer counts its time (it drops a log the official
    checker fails)."""
    try:
        records = read_log(path) if records is None else records
        results = check_log(path, official=True, records=records)
    except UserError as e:
        return (FAIL, "invalid", str(e)), False
    verdict = worst_level(results)
    failed = [r for r in results if r.level == FAIL]
    counted = "official_checker" not in {r.rule for r in failed}
    if not failed:
        return (verdict, "ok", ""), counted
    allowed = _NOT_CONVERGED_RULES | ({"run_stop"} if not any(r.key == "run_stop" for r in records) else set())
    why = None if counted or {r.rule for r in failed} - allowed else \
        not_converged(records, division_of(records) or "closed")
    if why:
        return (verdict, "not converged", why), counted
    # run_stop first: a log without its end (cut off) is what most often fails many rules at once
    first = next((r for r in failed if r.rule == "run_stop"),
                 next((r for r in failed if r.rule != "official_checker"), failed[0]))
    return (verdict, "invalid", "%s: %s" % (first.rule, first.detail)), counted


# The three steps of MLCommons' verify_for_v5.0_training.sh, in its order, and how each is named.
STEPS = (("package_checker", "package checker"), ("result_summarizer", "result summarizer"),
         ("repo_checker", "repo checker"))
_PARAMS = "package_checker_params"  # the verify script passes its lines to package_checker as --LINE
_LEVEL = re.compile(r"^(DEBUG|INFO|WARNING|ERROR|CRITICAL) - ")
# Python's own warning filters (3.11, no -W, no -X dev), in their order: what a fresh ``python -m`` starts with.
_DEFAULT_WARNINGS = (("default", DeprecationWarning, "__main__"), ("ignore", DeprecationWarning, ""),
                     ("ignore", PendingDeprecationWarning, ""), ("ignore", ImportWarning, ""),
                     ("ignore", ResourceWarning, ""))


def _official(cwd, tool, org, extra=()):
    """(exit status, stdout + stderr) of ``python -m mlperf_logging.TOOL ORG training 5.0.0`` in ``cwd``.

    The tool runs in a child forked from this process, as ``python -m`` runs it (its ``__main__``
    with that argv, stdout and stderr of its own, logging, warnings and SIGTERM as a new
    interpreter has them): its imports (scipy, pandas: ~2 s of CPU, more than the work) are
    paid once here instead of in each of the three processes. Its log lines are cut and its rule
    files read without the quadratic regex and the repeated parse (compliance.speed_up_official_parse:
    the same output, in ~1/4 of the time). It gets SIGKILL when score dies, even by SIGKILL (Linux),
    and is named TOOL in ``ps``."""
    importlib.import_module("mlperf_logging.%s.%s" % (tool, tool))  # before the fork: once per process
    sys.stdout.flush()
    sys.stderr.flush()  # nothing buffered here may reach the child's output
    parent = os.getpid()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        pid = None
        try:
            # blocked until the child has the default SIGTERM of a new interpreter: one sent to the child
            # as it starts found this process's handler in its fork's hooks and was held there for ever
            with stops_held_over_fork({signal.SIGINT, signal.SIGTERM}) as blocked:
                pid = os.fork()
                if pid == 0:
                    _tool_child(parent, cwd, tool, [org, "training", RULESET] + list(extra), out.fileno(),
                                err.fileno(), blocked)
            status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        except BaseException:  # SIGTERM, Ctrl-C: the tool does not outlive the call (as subprocess.run)
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            raise
        text = []
        for f in (out, err):
            f.seek(0)
            text.append(f.read().decode("utf-8", "replace"))
    return status, "".join(text)


def _tool_child(parent, cwd, tool, args, out_fd, err_fd, mask):
    """The forked child of ``_official``: runs the tool, never returns. ``mask``: the signal mask to
    restore (the stop signals are blocked until SIGTERM is the default action here)."""
    status = 1
    inherited = (sys.stdout, sys.stderr)  # kept alive: collected, they would flush the parent's buffers here
    try:
        die_with_parent(parent, signal.SIGKILL, 1)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        try:
            import ctypes
            ctypes.CDLL(None).prctl(15, tool[:15].encode(), 0, 0, 0)  # PR_SET_NAME: ps shows the tool
        except (OSError, AttributeError):
            pass
        os.chdir(cwd)
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        # The package's files are UTF-8 (a system_name "Nyx™"): the tools open them in the locale's
        # encoding, which in an ISO-8859-1 locale made "Nyxâ\x84¢" of it and in LC_ALL=C PYTHONUTF8=0 a
        # UnicodeDecodeError (the package failed): they read and write UTF-8 here, as under the usual locale.
        with contextlib.suppress(locale.Error):  # (no C.UTF-8 locale: the user's, as the verify script has it)
            locale.setlocale(locale.LC_CTYPE, "C.UTF-8")
        sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # decoded so by _official
        sys.stderr = open(2, "w", encoding="utf-8", closefd=False, errors="backslashreplace", buffering=1)
        import logging
        logging.disable(logging.NOTSET)
        root = logging.getLogger()
        root.handlers = []  # the parent's (pytest's, in tests): the tool's basicConfig makes its own
        root.setLevel(logging.WARNING)
        importlib.reload(warnings)  # its printing, as a catch_warnings of the parent may have replaced it
        warnings.resetwarnings()
        for action, category, module in _DEFAULT_WARNINGS:
            warnings.filterwarnings(action, category=category, module=module, append=True)
        warnings._processoptions(sys.warnoptions)
        sys.argv = ["mlperf_logging." + tool] + args
        speed_up_official_parse()
        try:
            runpy.run_module("mlperf_logging." + tool, run_name="__main__", alter_sys=True)
            status = 0
        except SystemExit as e:  # as the interpreter reads it
            if e.code is None or isinstance(e.code, int):
                status = e.code or 0
            else:
                print(e.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
        for h in root.handlers:  # the interpreter's exit flushes and closes the tool's log handlers
            h.flush()
            h.close()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            del inherited
            os._exit(status & 0xFF)


def _error_lines(out):
    """The ERROR lines of a tool's logging output, each with the lines that continue it (the repo
    checker puts one name a line)."""
    errors, current = [], None
    for line in out.splitlines():
        level = _LEVEL.match(line)
        if level:
            current = None
            if level.group(1) == "ERROR":
                errors.append(line[level.end():].strip())
                current = len(errors) - 1
        elif current is not None and line.strip():
            errors[current] += "; " + line.strip()
    return errors


def _in_dirs(out):
    """(its (system folder, benchmark) or ("", ""), line) of each line of the package checker's output
    but its "Running compliance checks in dir ORG/results/SYSTEM/BENCHMARK" lines, which set it."""
    current = ("", "")
    for line in out.splitlines():
        m = re.search(r"Running compliance checks in dir (.+)$", line)
        if m:
            parts = m.group(1).strip().rstrip("/").split("/")
            current = (parts[-2], parts[-1]) if len(parts) >= 2 else ("", "")
            continue
        yield current, line


def checker_errors(out, names, bad_json=()):
    """The package checker's ERROR lines by system: ({system folder: [lines]}, [lines of no one
    system: of another benchmark, of a systems JSON no results folder uses, or unnamed]).
    ``names``: {system folder: its systems JSON's system_name} (the checker names a failed
    systems JSON by it); ``bad_json``: the folders whose systems JSON this project finds wrong,
    which a line naming a system_name several folders share goes to (NVIDIA's Tyche 8 and 64
    GPUs share one: a field missing from one JSON failed both)."""
    per, others = {}, []
    desc_named = False
    for current, line in _in_dirs(out):
        if not line.startswith("ERROR - "):
            continue
        msg = line[len("ERROR - "):].strip()
        if current[0]:
            if current[1] == "bert" and current[0] in names:
                per.setdefault(current[0], []).append(msg)
            else:
                others.append(msg)
            continue
        desc = re.match(r"System description checker failed for (.*?) : ", msg)
        owners = [sysf for sysf, name in names.items() if desc and name == desc.group(1)]
        owners = [o for o in owners if o in bad_json] or owners
        if owners:
            desc_named = True
            for o in owners:
                per.setdefault(o, []).append(msg)
        elif msg == "System description file checker failed" and desc_named:
            continue  # the sum of the lines above
        else:
            others.append(msg)
    return per, others


# What the official package checker says of a check it skipped or let pass (a package_checker_params
# line of the system, its bert folder or the org): passed, and worth a word
BYPASSES = (("Bypassing Seed Checker", "the official package checker skipped its seed check (seed-checker-bypass in a "
                                       "package_checker_params): the runs' seeds were not compared"),
            ("allowed to proceed with RCP bypass", "the official package checker let a failed RCP test pass "
                                                   "(rcp-bypass in a package_checker_params)"))


def checker_bypasses(out):
    """{system folder: [warnings]} of the checks the package checker bypassed in its bert folder."""
    per = {}
    for current, line in _in_dirs(out):
        for said, warning in BYPASSES:
            if said in line and current[1] == "bert" and warning not in per.get(current[0], []):
                per.setdefault(current[0], []).append(warning)
    return per


def _summary_rows(tmp):
    """The result summarizer's rows (summary.json: one per system) by system folder (the name its
    details_url ends with: system names repeat, NVIDIA's Tyche 8 and 64 GPUs among them)."""
    path = os.path.join(tmp, "summary.json")
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as f:  # the summarizer's (UTF-8: _tool_child)
        rows = json.load(f)
    out = {}
    for r in rows if isinstance(rows, list) else []:
        url = r.get("details_url") or ""
        if url.endswith(".json"):
            out[os.path.basename(url)[:-len(".json")]] = r
    return out


def _mentions(out, system):
    """The summarizer's lines about ``system``'s BERT results."""
    pat = re.compile(r"(^|[ /])%s/bert\b" % re.escape(system))
    return [l.strip() for l in out.splitlines() if pat.search(l)]


def olympic_dropped(runs, counted):
    """Indexes of the runs the olympic mean drops, as the official result summarizer does: the
    fastest, then the slowest, a run it does not count (``counted[i]`` false: the official checker
    fails its log) being the slowest, whatever its minutes and status."""
    timed = sorted(range(len(runs)), key=lambda i: runs[i][3] if counted[i] and runs[i][3] is not None
                   else math.inf)
    return [timed[0], timed[-1]] if len(timed) > 2 else []


def bert_systems(top):
    """The system folders of ORG/results/ that hold a bert/ folder, sorted."""
    results = os.path.join(top, "results")
    try:
        names = sorted(os.listdir(results))
    except OSError:
        return []
    return [d for d in names if os.path.isdir(os.path.join(results, d, "bert"))]


def checker_params(path, cwd):
    """The package checker's options from ORG/package_checker_params, as MLCommons' verify script
    builds them: ``while IFS= read -r line`` adds `` --LINE`` for each line it reads (a last line
    without its newline is not read), and the unquoted result is split at blanks (a trailing space
    goes, ``a b`` is two words, an empty line a bare ``--``, after which argparse takes no option)
    and its patterns expanded to the names they match in ``cwd``, where the tools run (bash's: sorted,
    hidden names left out, a pattern that matches nothing kept as it is). The option that names a
    file (--log_output, or a prefix argparse takes for it) must stay inside that copy: the package is
    only read."""
    if not os.path.isfile(path):
        return []
    lines = read_text(path, "package checker parameters").split("\n")
    if lines[-1].strip():
        print("warning: score: %s: its last line, %r, has no newline, and the verify script's read leaves it out: so"
              " does this score; end the file with a newline" % (path, lines[-1]), file=sys.stderr)
    params = []
    for n, line in enumerate(lines[:-1], 1):
        words = []
        for word in (w for w in re.split(r"[ \t\n]+", "--" + line) if w):
            matches = sorted(glob.glob(word, root_dir=cwd)) if glob.escape(word) != word else []
            words += matches or [word]
        for i, word in enumerate(words):
            name, eq, value = word[2:].partition("=") if word.startswith("--") else ("", "", "")
            if name and "log_output".startswith(name):
                value = value if eq else (words[i + 1] if i + 1 < len(words) else "")
                if not value:
                    raise UserError("%s line %d: %s names no file for the official checker's log: remove the "
                                    "line, or name a file inside the package" % (path, n, line.strip()))
                target = os.path.normpath(os.path.join(cwd, value))
                if os.path.isabs(value) or os.path.commonpath([target, cwd]) != cwd:
                    raise UserError("%s line %d: %s writes outside the package (the official checker would write "
                                    "there): remove the line, or name a file inside the package"
                                    % (path, n, line.strip()))
        params += words
    return params


def _make_writable(top):
    """Give the user write permission on ``top`` and everything in it (a copy: links are followed)."""
    # copytree keeps the modes, and the package checker writes scaling.json beside each system's
    # results: a read-only package (a shared results folder, files unpacked 444) failed it with
    # PermissionError for every user but root, whom permissions do not bind.
    for dirpath, dirnames, filenames in os.walk(top):
        os.chmod(dirpath, os.stat(dirpath).st_mode | 0o700)
        for name in filenames:
            path = os.path.join(dirpath, name)
            os.chmod(path, os.stat(path).st_mode | 0o600)


def run_official(root, org):
    """Run the three official steps on a copy of ORG; return {tool: (status, output)}, the
    summarizer's rows by system folder."""
    outs = {}
    with tempfile.TemporaryDirectory(prefix="%s%d-" % (_COPY_PREFIX, os.getpid())) as tmp:
        try:
            shutil.copytree(os.path.join(root, org), os.path.join(tmp, org))
        except (OSError, shutil.Error) as e:
            first = e.args[0][0] if isinstance(e, shutil.Error) and e.args and e.args[0] else e
            if isinstance(first, tuple) and len(first) == 3:  # (source, the copy's path, why)
                raise UserError("cannot copy package %s: %s: %s; a package holds plain files and folders:"
                                " put the file itself there, or remove it" % (
                                    os.path.join(root, org), first[0], str(first[2]).replace("`%s` " % first[0],
                                                                                             "")))
            raise UserError("cannot copy package %s: %s" % (os.path.join(root, org), first))
        _make_writable(os.path.join(tmp, org))
        params = checker_params(os.path.join(root, org, _PARAMS), tmp)
        outs["package_checker"] = _official(tmp, "package_checker", org, params)
        outs["result_summarizer"] = _official(tmp, "result_summarizer", org)
        rows = _summary_rows(tmp)
        outs["repo_checker"] = _official(tmp, "repo_checker", org)
    return outs, rows


def step_verdicts(outs, rows, systems):
    """{tool: (verdict, detail, [ERROR lines])} of the three steps, as the verify script's
    output says them."""
    checker = outs["package_checker"][1]
    verdicts = {}
    if _OK in checker:
        verdicts["package_checker"] = ("pass", "", [])
    else:
        errors = _error_lines(checker)
        last = [l for l in checker.splitlines() if l.strip()][-1:] or ["no output"]
        verdicts["package_checker"] = ("fail", "%d ERROR line%s" % (len(errors), "" if len(errors) == 1 else "s")
                                       if "PACKAGE CHECKER FOUND" in checker else
                                       "did not finish; its last line: %s" % last[0].strip(), errors)
    status, out = outs["result_summarizer"]
    scored = sum(1 for s in systems if (rows.get(s) or {}).get("bert:time_to_train") is not None)
    if status == 0:  # what the verify script's `set -e` goes by
        verdicts["result_summarizer"] = ("pass", "%d of %d system%s with a time to train" % (
            scored, len(systems), "" if len(systems) == 1 else "s"), [])
    else:
        last = [l for l in out.splitlines() if l.strip()][-1:] or ["no output"]
        verdicts["result_summarizer"] = ("fail", "exit status %d; its last line: %s"
                                         % (status, last[0].strip()), [])
    out = outs["repo_checker"][1]
    if "ALL CHECKS PASSED" in out:
        verdicts["repo_checker"] = ("pass", "", [])
    else:
        errors = _error_lines(out)
        last = [l for l in out.splitlines() if l.strip()][-1:] or ["no output"]
        verdicts["repo_checker"] = ("fail", "%d ERROR line%s" % (len(errors), "" if len(errors) == 1 else "s")
                                    if "CHECKS FAILED" in out else "its last line: %s" % last[0].strip(), errors)
    return verdicts


def score(package):
    """Check and score every system of ``package`` (a copy of it); return a dict (see main)."""
    root, org = find_org(package)
    top = os.path.join(root, org)
    check_links(top)
    remove_stale_copies()
    systems = bert_systems(top)
    descs, names = {}, {}
    for system in systems:
        try:
            descs[system] = load_system_json(os.path.join(top, "systems", system + ".json"), score=True)
            names[system] = descs[system].get("system_name")
        except UserError as e:
            descs[system] = e
    outs, rows = run_official(root, org)
    steps = step_verdicts(outs, rows, systems)
    bad_json = {s_ for s_, d in descs.items()
                if isinstance(d, UserError) or system_json_problems(d, os.path.join(org, "systems", s_ + ".json"))}
    per_errors, other_errors = checker_errors(outs["package_checker"][1], names, bad_json)
    org_reasons = []  # (reason, the official tool's ERROR lines it stands for)
    unfinished = "PACKAGE CHECKER FOUND" not in outs["package_checker"][1]
    # a failure the checker's lines do not pin on one system counts for every system
    whole = unfinished or bool(other_errors) or steps["package_checker"][0] == "fail" and not per_errors
    if unfinished:
        org_reasons.append(("the official package checker %s" % steps["package_checker"][1],
                            ["package checker: " + e for e in steps["package_checker"][2]]))
    elif whole:
        org_reasons.append(("the official package checker failed on the package as a whole (%d ERROR line%s"
                            " under its verdict)" % (len(other_errors), "" if len(other_errors) == 1 else "s"),
                            ["package checker: " + e for e in other_errors or steps["package_checker"][2]]))
    if steps["result_summarizer"][0] == "fail":
        org_reasons.append(("the official result summarizer failed (%s)" % steps["result_summarizer"][1], []))
    if steps["repo_checker"][0] == "fail":
        org_reasons.append(("the official repo checker failed (%s under its verdict): a package it refuses"
                            " cannot be submitted" % steps["repo_checker"][1],
                            ["repo checker: " + e for e in steps["repo_checker"][2]]))
    code_fails, code_warnings = implementation_findings(top, systems)
    shared = shared_logs(top, systems, names)
    bypassed = checker_bypasses(outs["package_checker"][1])
    results = [score_system(root, org, system, descs[system], per_errors.get(system, []), rows.get(system, {}),
                            _mentions(outs["result_summarizer"][1], system), org_reasons, whole,
                            code_fails.get(system, []),
                            code_warnings.get(system, []) + shared.get(system, []) + bypassed.get(system, []))
               for system in systems]
    if not systems:
        org_reasons.append(("%s holds no <system>/bert/ folder of result_*.txt logs" % os.path.join(top, "results"),
                            []))
    passed = bool(systems) and all(r["verdict"] == "pass" for r in results)
    return {"org": org, "root": root, "steps": steps, "other_errors": other_errors, "org_reasons": org_reasons,
            "systems": results, "verdict": "pass" if passed else "fail"}


def implementation_findings(top, systems):
    """({system: [fail reasons]}, {system: [warnings]}) of the code under ORG/benchmarks/bert/
    (``top``: ORG/). MLCommons' review does not accept results without the code that made them,
    which the official tools do not check: a system that ``package`` put in the package
    (ORG/mlperf_bert_package.json) fails when its implementation folder is missing or empty; a
    package made otherwise (published ones, vendored without their code) gets a warning when
    benchmarks/bert/ holds no file at all."""
    org = os.path.basename(top)
    try:
        made = read_made_by(top)
    except UserError as e:
        return {s: [str(e)] for s in systems}, {}
    present = set()
    impls = os.path.join(top, implementation_dir(""))
    for name in sorted(os.listdir(impls)) if os.path.isdir(impls) else ():
        if any(files for _, _, files in os.walk(os.path.join(impls, name))):
            present.add(name)
    # Lenovo's accepted v5.0 package has its code in benchmarks/bert/ itself, without implementations/IMPL/
    loose = not present and any(files for _, _, files in os.walk(os.path.dirname(impls.rstrip(os.sep))))
    fails, warnings = {}, {}
    for system in systems:
        if system in made:
            if made[system] not in present:
                fails[system] = ["%s, the code of these runs (%s: package made this package), is missing or"
                                 " empty: MLCommons' review does not accept results without their code; make the"
                                 " package again" % (os.path.join(org, implementation_dir(made[system])),
                                                     os.path.join(org, MADE_BY))]
        elif not present and not loose:
            warnings[system] = ["%s holds no implementation: MLCommons' review does not accept results without"
                                " the code that made them (the official tools do not check it); add it before"
                                " submitting" % os.path.join(org, implementation_dir("")).rstrip(os.sep)]
    return fails, warnings


def shared_logs(top, systems, names):
    """{system: [warning]} for systems whose result logs are byte for byte another system's: the
    same runs scored as two systems (the official tools do not compare systems)."""
    digests = {}
    for system in systems:
        bert = glob.escape(os.path.join(top, "results", system, "bert"))
        for p in in_run_order(glob.glob(os.path.join(bert, "result_*.txt"))):
            with open(p, "rb") as f:
                digests.setdefault(system, {}).setdefault(hashlib.sha256(f.read()).hexdigest(), os.path.basename(p))
    out = {}
    for a in systems:
        for b in systems:
            common = sorted(set(digests.get(a, {})) & set(digests.get(b, {})),
                            key=lambda d: (run_number(digests[a][d]), digests[a][d]))
            if a == b or not common:
                continue
            same_name = names.get(a) and names.get(a) == names.get(b)
            out.setdefault(a, []).append(
                "%d result log%s (%s%s) %s byte for byte %s's%s: one series of runs scored as two systems; each"
                " system's results must be runs on that system" % (
                    len(common), "" if len(common) == 1 else "s", ", ".join(digests[a][d] for d in common[:3]),
                    ", ..." if len(common) > 3 else "", "is" if len(common) == 1 else "are",
                    os.path.join("results", b, "bert"),
                    ", and both systems are named %r" % names[a] if same_name else ""))
    return out


def score_system(root, org, system, desc, errors, row, notes, org_reasons, checker_failed=False, code_fails=(),
                 more_warnings=()):
    """One system's block: its runs under check-log, its share of the checker's errors, the
    summarizer's row; a dict (see main). ``org_reasons``: why every system fails (an official
    step that failed on the whole package), each with the tool's ERROR lines it stands for;
    ``checker_failed``: the package checker among them; ``code_fails``, ``more_warnings``: what
    implementation_findings and shared_logs say of the system."""
    # (escaped: a package in a folder named with a glob's characters, "pkg [1]", is that folder)
    bert = glob.escape(os.path.join(root, org, "results", system, "bert"))
    logs = in_run_order(glob.glob(os.path.join(bert, "result_*.txt")))
    runs, verdicts, counted, evals, divisions, targets, parsed = [], [], [], {}, set(), set(), []
    for p in logs:
        rel = os.path.relpath(p, root)
        try:
            records = read_log(p)
        except UserError as e:
            verdicts.append((FAIL, "invalid", str(e)))
            counted.append(False)
            runs.append((rel, None, None, None, None))
            continue
        parsed.append((p, records))
        row_ = (rel,) + run_summary(records)
        verdict, counts = run_verdict(p, records)
        verdicts.append(verdict)
        counted.append(counts)
        runs.append(row_)
        evals[os.path.basename(p)] = curves(records).get("eval_accuracy", [])
        divisions.add(division_of(records))
        targets.add(target_of(records, division_of(records) or "closed"))
    division = divisions.pop() if len(divisions) == 1 else None
    if isinstance(desc, dict) and desc.get("division") in ("closed", "open"):
        division = desc["division"]  # what the official tools go by
    reasons, lines = [], {}  # lines: {reason: the official tool's ERROR lines it stands for}
    if errors:
        reasons.append("the official package checker failed for this system (its %d ERROR line%s above)"
                       % (len(errors), "" if len(errors) == 1 else "s"))
        lines[reasons[-1]] = ["package checker: " + e for e in errors]
    fails, warnings = identity_reasons(root, org, system, desc, parsed)
    reasons += fails + list(code_fails)
    warnings += list(more_warnings)
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
        reasons.append("%s holds no result_*.txt logs" % os.path.join(root, org, "results", system, "bert"))
    for reason, errs in org_reasons:
        reasons.append(reason)
        lines[reason] = errs
    time_to_train = row.get("bert:time_to_train")
    if not reasons and time_to_train is None:
        critical = [n for n in notes if "ERROR" in n]
        reasons.append("the result summarizer gave no time to train%s" % (
            " (%s)" % critical[0] if critical else ""))
    passed = not reasons
    closed = division != "open"
    return {"system": system, "system_name": row.get("system") or (desc.get("system_name") if isinstance(desc, dict)
                                                                   else None),
            "package_check": "fail" if errors or checker_failed else "pass", "errors": errors,
            "verdict": "pass" if passed else "fail", "reasons": reasons,
            "json_reasons": [x for r in reasons for x in [r] + lines.get(r, [])],
            "warnings": warnings, "runs": runs, "run_verdicts": verdicts,
            "time_to_train_min": time_to_train if passed else None,
            # a power submission's score (bert/power/ logs): the summarizer's olympic mean, in joules
            "energy_j": row.get("bert:Energy") if passed else None,
            "rcp_scaling_factor": row.get("bert:rcp_scaling_factor") if closed else None,
            "samples_to_converge": row.get("bert:samples_to_converge") if closed else None,
            "rcp": (row.get("bert:RCP") or None) if closed else None, "evals": evals, "notes": notes,
            "division": division, "target": targets.pop() if len(targets) == 1 else None,
            "dropped": olympic_dropped(runs, counted)}


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
    system = s.get("system_name") or s.get("system") or next(
        (r[0].split(os.sep)[2] for r in s["runs"] if r[0].count(os.sep) >= 3), "?")
    return "%s, %s division: %d runs, submission %s" % (shown(system), s.get("division") or "unknown", len(s["runs"]),
                                                       s["verdict"].upper())


def identity_reasons(root, org, system, desc, parsed):
    """(fails, warnings) of one system's systems JSON and its logs' declared identity. Fails: the
    systems JSON is not a JSON object with every field the official checker requires and a status
    it knows (the checker fails these too), or a log's division is not the JSON's
    (compliance.SCORE_FAILS says why). Warnings, which the official tools do not check and published
    packages break: the JSON's submitter is not the org folder, a log's submission_org, status or
    platform (a placeholder, several) disagree with the package. The platform is not compared with
    the system's name: published packages name it freely (NVIDIA's "1xNVIDIA HGX B200" for "Nyx (1x
    NVIDIA DGX B200)"); ``package`` compares it."""
    rel = os.path.join(org, "systems", system + ".json")
    if isinstance(desc, UserError):
        return [str(desc)], []
    fails = system_json_problems(desc, rel)
    warnings = []
    if desc.get("submitter") != org:
        warnings.append("%s: submitter %r, the package's org folder is %r (the official tools do not compare"
                        " them; the results table shows the submitter)" % (rel, desc.get("submitter"), org))
    for field, line in identity_findings(parsed, org, desc.get("division"), desc.get("status")):
        (fails if field in SCORE_FAILS else warnings).append(line)
    scaling = os.path.join(org, "results", system, "bert", "scaling.json")
    if desc.get("division") == "open" and os.path.isfile(os.path.join(root, scaling)):
        # the checker writes (or removes) it for a closed result's RCP check alone: a shipped one stays
        warnings.append("%s in an open-division result: the result summarizer multiplies its time by the file's"
                        " scaling_factor (the package checker makes one only for a closed result's RCP check;"
                        " otherwise only the review committee adds one): remove it unless the committee did" % scaling)
    return fails, warnings


def rcp_line(s):
    """The RCP part of the report, saying what does not apply and why."""
    if s["division"] == "open":
        return ("RCP check: does not apply (open division: reference convergence points bind closed-division"
                " runs only); no scaling factor, no samples to converge")
    if not s["rcp"]:
        return "RCP check: not run (the result summarizer gave no RCP verdict)"
    return "RCP check: %s, scaling factor %s; samples to converge %s" % (
        s["rcp"], s["rcp_scaling_factor"], s["samples_to_converge"])


def plot_paths(root, plots_dir, system=None):
    """(times PNG, convergence PNG): in ``plots_dir``, else beside the package (never inside it);
    ``system``: a part of the names, for a package of several systems."""
    root = os.path.abspath(root)
    tag = "%s." % system if system else ""
    if plots_dir:
        if os.path.exists(plots_dir) and not os.path.isdir(plots_dir):
            raise UserError("--plots_dir %s is a file: give a directory for the plots (or --noplots)" % plots_dir)
        real = os.path.realpath(plots_dir)
        if (real + os.sep).startswith(os.path.realpath(root) + os.sep):
            raise UserError("--plots_dir %s is inside the package %s: a package stays as submitted; choose"
                            " a directory outside it" % (plots_dir, root))
        return os.path.join(plots_dir, tag + "score_times.png"), os.path.join(plots_dir, tag + "score_convergence.png")
    base = os.path.join(os.path.dirname(root), os.path.basename(root))
    return base + "." + tag + "score_times.png", base + "." + tag + "score_convergence.png"


def check_plot_path(path):
    """Refuse a plot path that holds a directory or a file that is not a PNG (a log, a note: score
    replaces a PNG only), naming the way out; score checks them before its work and again here."""
    if os.path.isdir(path):
        raise UserError("score: %s is a directory, where score writes a plot: move it away, or give"
                        " --plots_dir=DIR (or --noplots)" % path)
    if os.path.isfile(path) and os.path.getsize(path) and not is_png(path):
        raise UserError("score: %s exists and is not a PNG, where score writes a plot: move it away, or give"
                        " --plots_dir=DIR (or --noplots)" % path)
    try:  # a package on a read-only mount: refused after the work, its score lost, naming no flag
        check_writable_dir(path)
    except OutputDirError as e:
        raise UserError("score: %s, where score writes its plots: give --plots_dir=DIR (or --noplots)"
                        % e.reason) from None


def plot(s, paths):
    """A bar chart of the runs' minutes (the runs the olympic mean drops hatched) and their eval
    curves with the target line."""
    plt = pyplot()
    for p in paths:
        check_plot_path(p)
    names = [shown(os.path.basename(r[0])[:-4]) for r in s["runs"]]
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
            ax.plot(*zip(*points), ".-", label=shown(name[:-4]))
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


JSON_KEYS = ("system", "system_name", "division", "time_to_train_min", "energy_j", "rcp_scaling_factor",
             "samples_to_converge", "rcp", "package_check", "verdict", "reasons", "warnings")


def report(s, plots_dir=None, plots=True):
    """The lines ``score`` prints of ``s`` (see score()); writes the plots when ``plots``."""
    lines = []
    for tool, name in STEPS:
        verdict, detail, errors = s["steps"][tool]
        lines.append("%s (mlperf_logging, training %s): %s%s" % (name, RULESET, verdict.upper(),
                                                                 " (%s)" % detail if detail else ""))
        shown = s["other_errors"] if tool == "package_checker" else errors
        lines += ["  " + e for e in shown]
    many = len(s["systems"]) > 1
    for sys_ in s["systems"]:
        lines.append("")
        lines.append("== system %s (%s), %s division ==" % (sys_["system"], sys_["system_name"] or "no system_name",
                                                             sys_["division"] or "unknown"))
        lines += run_table(sys_)
        lines.append("package checker, this system: %s" % sys_["package_check"].upper())
        lines += ["  " + e for e in sys_["errors"]]
        lines.append(rcp_line(sys_))
        if sys_["dropped"]:
            lines.append("olympic mean: drops %s" % " and ".join(
                os.path.basename(sys_["runs"][i][0]) for i in sys_["dropped"]))
        lines += ["warning: " + w for w in sys_["warnings"]]
        if sys_["verdict"] == "pass":
            lines.append("time to train: %s minutes" % sys_["time_to_train_min"])
            if sys_["energy_j"] is not None:
                lines.append("energy to train: %s J (the runs' power logs, bert/power/)" % sys_["energy_j"])
        else:
            lines.append("time to train: none:")
            lines += ["  " + r for r in sys_["reasons"]]
        lines.append("submission: %s" % sys_["verdict"].upper())
        if plots and sys_["runs"]:
            lines.append("plots: %s" % ", ".join(plot(sys_, plot_paths(s["root"], plots_dir,
                                                                       sys_["system"] if many else None))))
    if not s["systems"]:
        lines += ["time to train: none:"] + ["  " + r for r, _ in s["org_reasons"]] + ["submission: FAIL"]
    lines.append("")
    lines.append("%s: %d system%s, %d PASS, %d FAIL" % (
        s["org"], len(s["systems"]), "" if len(s["systems"]) == 1 else "s",
        sum(x["verdict"] == "pass" for x in s["systems"]), sum(x["verdict"] != "pass" for x in s["systems"])))
    return lines


def archive_kind(path):
    """What archive ``path`` is ("a tar archive", "gzip-compressed", ...), or None (also when it cannot be read)."""
    try:
        tar = tarfile.is_tarfile(path)
    except (OSError, tarfile.TarError):
        return None
    kind = (compression(path) or (None,))[0]
    if tar:
        return "a tar archive (%s)" % kind if kind else "a tar archive"
    return kind


def check_package_arg(path):
    """Refuse a PACKAGE_DIR that is not a directory, saying what it is: a package is often handed on as a tarball."""
    if os.path.isdir(path):
        return
    where = "the folder holding ORG/results and ORG/systems"
    if not os.path.exists(path):
        raise UserError("score: %s does not exist: pass the package directory (%s)" % (path, where))
    kind = archive_kind(path)
    if kind:
        raise UserError("score: %s is %s, not a package directory: extract it and pass %s" % (path, kind, where))
    raise UserError("score: %s is a file, not a package directory: pass %s" % (path, where))


def main(argv):
    fv = flags.FlagValues()
    flags.DEFINE_bool("json", False, "print one JSON object alone on stdout (the report goes to stderr): org, the"
                      " three steps' verdicts, verdict, and systems: one object per system (%s; reasons with"
                      " the official tools' ERROR lines they stand for); on an error (exit 2) {verdict: error,"
                      " error: its line}" % ", ".join(JSON_KEYS), flag_values=fv)
    flags.DEFINE_bool("plots", True, "write score_times.png and score_convergence.png (beside the package,"
                      " as PACKAGE.score_*.png, PACKAGE.<system>.score_*.png for several systems, or into"
                      " --plots_dir)", flag_values=fv)
    flags.DEFINE_string("plots_dir", None, "directory for the plots (outside the package)", flag_values=fv)
    rest = flags.parse(fv, argv, positional=USAGE_ARGS)
    try:
        if len(rest) != 1:
            raise UserError("%s (a directory holding ORG/results and ORG/systems)" % flags.usage("score", USAGE_ARGS))
        check_package_arg(rest[0])
        root, org = find_org(rest[0])
        if fv.plots:  # a --plots_dir inside the package, a plot path held by another file: refused before the work
            systems = bert_systems(os.path.join(root, org))
            for system in systems if len(systems) > 1 else [None]:
                for p in plot_paths(root, fv.plots_dir, system):
                    check_plot_path(p)
        s = score(rest[0])
    except UserError as e:
        if fv.json:  # a reader of stdout gets an object here too, beside the error line (exit 2)
            print(json.dumps({"verdict": "error", "error": str(e)}), flush=True)
        raise
    text = sys.stderr if fv.json else sys.stdout  # --json: stdout is the JSON alone
    for line in report(s, fv.plots_dir, fv.plots):
        print(line, file=text)
    if fv.json:
        text.flush()
        print(json.dumps(json_result(s)))
    return 0 if s["verdict"] == "pass" else 1


def json_result(s):
    """What --json prints of ``s``: the report's verdicts and, per system, JSON_KEYS, its reasons
    each followed by the official tools' ERROR lines it stands for."""
    out = {"org": s["org"]}
    out.update((tool, s["steps"][tool][0]) for tool, _ in STEPS)
    out["verdict"] = s["verdict"]
    out["systems"] = [dict({k: x[k] for k in JSON_KEYS}, reasons=x["json_reasons"]) for x in s["systems"]]
    if not s["systems"]:
        out["reasons"] = [x for r, errs in s["org_reasons"] for x in [r] + errs]
    return out
