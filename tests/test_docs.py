"""The docs against the code: every command of ours that README.md, docs/*.md and
tests/data/README.md show (code blocks, and inline code that starts with one of our commands),
and every ``--flag`` it uses, exists in that command's own ``--help``; every environment variable
the docs set for the launchers is read by them; every make target named exists; the md5 table of
docs/dataset.md is the one of ``results/``, and the counts and sizes the docs quote from ``results/``
are its files'; each command's one-line help agrees with its --help (flags, defaults, scripts); no
message or doc sends users to bare torchrun; eval_results.txt's keys are the ones written; a
check-log verdict line the docs quote counts the rules check-log gives; every path of the repository
the docs, the examples, the benches' and the launchers' help name exists.

``--help`` runs in-process for Python commands (``main([prog, "--help"])``) and as ``bash SCRIPT
--help`` for the launchers, so the whole file takes a few seconds."""
import contextlib
import functools
import glob
import importlib
import inspect
import io
import json
import os
import re
import runpy
import shlex
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from mlperf_bert.__main__ import COMMANDS  # noqa: E402
from mlperf_bert.trainer.trainer_flags import NVIDIA_FLAGS  # noqa: E402

DOCS = ["README.md"] + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md"))) \
    + ["tests/data/README.md"]
SCRIPTS = sorted(os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "*.py")) if not p.endswith("setup.py"))
LAUNCHERS = ("train_model.sh", "start_training.sh")
# What the launchers run: the environment they read is read in one of these.
# train_model.sh execs the torchrun wrapper (trainer/launch.py) for several ranks: it reads the launch environment too
LAUNCHER_FILES = ("train_model.sh", "start_training.sh", "docker-entrypoint.sh", "mlperf_bert/trainer/launch.py")
IMAGE = "mlperf-bert"
PYTHONS = {"python", "python3", ".venv/bin/python", "$(PY)", "$PYTHON", "/opt/venv/bin/python"}
# Placeholders the docs write in usage lines: --flag=value, --trainer_flag=value, --name=value.
PLACEHOLDER_FLAGS = {"flag", "trainer_flag", "name"}
# Words in backticks that look like variables but are verdicts or placeholders.
NOT_VARIABLES = {"PASS", "WARN", "FAIL", "OK", "UNKNOWN", "MISSING", "MISMATCH", "RESULT", "NAME", "ORG"}
# Variables the docs name that belong to other programs: Docker's predefined build arguments.
OTHERS_VARIABLES = {"HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY", "TORCHINDUCTOR_CACHE_DIR",  # read by pip, torch,
                    "PYTHONDONTWRITEBYTECODE", "TMPDIR",  # Python,
                    "ENROOT_DATA_PATH", "ENROOT_RUNTIME_PATH", "FORCE_GLIBC"}  # and enroot (its config, its build)

# Flags of other programs that the docs show (the union check below knows only ours).
OTHERS_FLAGS = {
    "docker/podman": {"build-arg", "gpus", "ipc", "shm-size", "rm", "ulimit", "user", "privileged", "format", "name",
                      "env", "network", "runtime", "read-only", "tmpfs", "pids-limit", "cpuset-cpus", "memory"},
    "md5sum": {"check", "ignore-missing"},
    "pip": {"no-deps", "dry-run", "report"},
    "hadolint": {"failure-threshold"},
    "mmdebstrap": {"variant", "include"},
    "torchrun": {"nnodes"},
    "pytest": {"assert"},
    "tensorboard": {"logdir"},
    "mlperf_logging": {"usage", "ruleset", "rcp-bert-train-samples"},
    "the reference's do_gather.py": {"block_size"},
    "NVIDIA's run_pretraining.py (refused, naming ours)": set(NVIDIA_FLAGS),
    "sbatch/srun/scancel/scontrol (SLURM), pyxis": {"nodes", "time", "cpus-per-task", "gpus-per-node", "signal",
                                                    "requeue", "open-mode", "exclusive", "mem", "test-only",
                                                    "kill-on-bad-exit", "container-image", "container-mounts",
                                                    "container-env", "export", "get-user-env", "ntasks",
                                                    "ntasks-per-node", "array"},
}

# Flags other helpers are adding on their branches at the same time (issue 27). Each entry is
# (command, flag); remove it once that branch is merged (the test then checks the flag for real).
PENDING_FLAGS = set()


# ---- reading the docs -------------------------------------------------------------------------

def _snippets(path, inline=True, blocks=True):
    """(line number, text) of each shell snippet of a Markdown file: fenced blocks (no language,
    sh, bash, shell, console), indented blocks, and inline code spans."""
    out, fence, block, start, prev_blank = [], None, [], 0, True
    lines = open(os.path.join(ROOT, path), encoding="utf-8").read().splitlines()
    for n, line in enumerate(lines, 1):
        m = re.match(r"^\s*```\s*(\S*)", line)
        if fence is not None:
            if m and not m.group(1):
                if blocks and fence in ("", "sh", "bash", "shell", "console"):
                    out.append((start, "\n".join(block)))
                fence, block = None, []
            else:
                block.append(line)
            continue
        if m:
            fence, block, start = m.group(1), [], n + 1
            continue
        if line.startswith("    ") and (prev_blank or block):
            if not block:
                start = n
            block.append(line[4:])
            continue
        if block and blocks:
            out.append((start, "\n".join(block)))
        block = []
        prev_blank = not line.strip()
        if inline:
            out += [(n, span) for span in re.findall(r"`([^`]+)`", line)]
    if block and blocks:
        out.append((start, "\n".join(block)))
    return out


def _logical_lines(text):
    """Lines with backslash continuations joined."""
    return text.replace("\\\n", " ").splitlines()


def _split_commands(line):
    """Token lists of the simple commands of one shell line (comments dropped)."""
    try:
        tokens = shlex.split(line, comments=True)
    except ValueError:  # unbalanced quotes: prose in an inline span
        return []
    cmds, cur = [], []
    for t in tokens:
        if t in ("&&", "||", ";", "|", "&"):
            cmds.append(cur)
            cur = []
        else:
            cur.append(t.rstrip(";"))
    return cmds + [cur]


def _is_assignment(token):
    return re.match(r"^[A-Z_][A-Z0-9_]*=", token) is not None


def _flags(tokens):
    """The --flag names among ``tokens`` (usage brackets stripped); stops at a shell redirection."""
    names = []
    for t in tokens:
        t = t.strip("[]")
        if t.startswith((">", "<", "2>")):
            break
        m = re.match(r"^--([A-Za-z][\w-]*)", t)
        if m:
            names.append(m.group(1))
    return names


def _recognise(tokens, env=()):
    """Commands of ours in one simple command: a list of (kind, name, flags, env) with kind one of
    module (``python -m mlperf_bert NAME``), script (a top-level script), launcher, bench, make."""
    env = list(env)
    i = 0
    while i < len(tokens) and _is_assignment(tokens[i]):
        env.append(tokens[i].split("=", 1)[0])
        i += 1
    tokens = tokens[i:]
    if not tokens:
        return []
    head = tokens[0]
    if head in ("docker", "podman") and "run" in tokens[1:2]:
        docker_env = [tokens[k + 1].split("=", 1)[0] for k, t in enumerate(tokens[:-1]) if t == "-e"]
        if IMAGE not in tokens:
            return []
        rest = tokens[tokens.index(IMAGE) + 1:]
        if not rest or rest[0].lstrip("[").startswith("--"):
            return [("launcher", "start_training.sh", _flags(rest), env + docker_env)]
        return _recognise(rest, env + docker_env)
    if head == "make":
        return [("make", t, [], env) for t in tokens[1:] if not t.startswith("-") and "=" not in t]
    if head in COMMANDS and head != "torchrun":  # (bare torchrun is torch's) the docs' shorthand `pack --input=...` for python -m mlperf_bert pack
        return [("module", head, _flags(tokens[1:]), env)]
    for k, t in enumerate(tokens):
        if t in PYTHONS and tokens[k + 1:k + 3] and tokens[k + 1] == "-m":
            if tokens[k + 2:k + 3] == ["mlperf_bert"]:
                sub = tokens[k + 3] if len(tokens) > k + 3 else ""
                if sub == "torchrun":  # the wrapper: flags after the script are the script's
                    return _recognise(tokens[k + 4:], env)
                return [("module", sub, _flags(tokens[k + 4:]), env)]
            return []  # another module (pytest, pip, ...)
        base = t[2:] if t.startswith("./") else t
        if base in SCRIPTS:
            return [("script", base, _flags(tokens[k + 1:]), env)]
        if os.path.basename(t) in LAUNCHERS:
            return [("launcher", os.path.basename(t), _flags(tokens[k + 1:]), env)]
        if re.match(r"^(\./)?(bench|tests/container)/\w+\.py$", t):
            return [("bench", t[2:] if t.startswith("./") else t, _flags(tokens[k + 1:]), env)]
        if t in PYTHONS or t in ("flock", "/usr/bin/time", "time", "nice", "sudo", "torchrun", "env", "exec") \
                or t.startswith(("-", "/tmp/")) or _is_assignment(t):
            continue  # wrappers and their arguments: look further
        return []
    return []


def doc_commands(doc_files=DOCS):
    """Every command of ours in the docs: (doc, line, kind, name, flags, env)."""
    found = []
    for doc in doc_files:
        for line_no, text in _snippets(doc):
            for line in _logical_lines(text):
                for tokens in _split_commands(line):
                    for kind, name, flags, env in _recognise(tokens):
                        found.append((doc, line_no, kind, name, flags, env))
    return found


# ---- what the code accepts ---------------------------------------------------------------------

def _capture_help(call):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
        try:
            call()
        except SystemExit as e:
            assert e.code in (0, None), "--help exited %r" % e.code
    return buf.getvalue()


def _help_flags(text):
    """Flag names in a --help text, absl (``--[no]name:``) or argparse style; booleans marked."""
    flags, booleans = set(), set()
    for m in re.finditer(r"--(\[no\])?([A-Za-z][\w-]*)", text):
        flags.add(m.group(2))
        if m.group(1):
            booleans.add(m.group(2))
    return flags, booleans


@functools.lru_cache(maxsize=None)
def module_help(name):
    module = importlib.import_module("mlperf_bert." + COMMANDS[name][0])
    return _capture_help(lambda: module.main(["mlperf_bert " + name, "--help"]))


def _script_module(script):
    src = open(os.path.join(ROOT, script), encoding="utf-8").read()
    m = re.search(r"^main = import_main\(\"mlperf_bert\.([\w.]+)\"\)", src, re.M)
    assert m, "%s: no `main = import_main(\"mlperf_bert.X\")`" % script
    return m.group(1)


@functools.lru_cache(maxsize=None)
def script_help(script):
    module = importlib.import_module("mlperf_bert." + _script_module(script))
    return _capture_help(lambda: module.main([script, "--help"]))


@functools.lru_cache(maxsize=None)
def bench_help(path, optimize=0):
    """A bench script's --help; '' for one that takes no flags (it is then not run at all). ``optimize=2``
    compiles the script as ``python -OO`` does (no docstrings)."""
    src = open(os.path.join(ROOT, path), encoding="utf-8").read()
    if os.path.basename(path).startswith("_") or not re.search(r"argparse|OneLineParser|DEFINE_|help_requested", src):
        return ""
    saved, saved_path, saved_env = list(sys.argv), list(sys.path), dict(os.environ)
    sys.argv = [path, "--help"]
    sys.path.insert(0, os.path.dirname(os.path.join(ROOT, path)))  # as `python bench/x.py` has it
    try:  # a bench script may put its folder on sys.path: the other tests of this process must not see it
        if optimize:
            ns = {"__name__": "docs_help", "__file__": os.path.join(ROOT, path)}
            exec(compile(src, ns["__file__"], "exec", optimize=optimize), ns)
        else:
            ns = runpy.run_path(os.path.join(ROOT, path), run_name="docs_help")
        main = ns["main"]
        takes_argv = bool(inspect.signature(main).parameters)
        return _capture_help(lambda: main([path, "--help"]) if takes_argv else main())
    finally:
        sys.argv, sys.path[:] = saved, saved_path
        os.environ.clear()
        os.environ.update(saved_env)


@functools.lru_cache(maxsize=None)
def launcher_help(script):
    return subprocess.run(["bash", os.path.join(ROOT, script), "--help"], capture_output=True, text=True,
                          check=True, cwd=ROOT, timeout=60).stdout


@functools.lru_cache(maxsize=None)
def accepted(kind, name):
    """(flags, boolean flags) that command ``name`` of ``kind`` accepts."""
    if kind == "module":
        return _help_flags(module_help(name))
    if kind == "script":
        return _help_flags(script_help(name))
    if kind == "bench":
        return _help_flags(bench_help(name))
    if kind == "launcher":
        own, _ = _help_flags(launcher_help("train_model.sh"))
        own = (own - {"trainer_flag"}) | {"help"}
        if name == "start_training.sh":
            # start_training.sh hands every argument to train_model.sh; its --help says so.
            assert "passed to train_model.sh" in launcher_help(name)
        trainer, booleans = accepted("script", "run_pretraining.py")
        return own | trainer, booleans | {"dry_run"}
    raise AssertionError(kind)


def flag_known(kind, name, flag):
    flags, booleans = accepted(kind, name)
    if flag in flags or flag in ("help", "helpfull"):
        return True
    return flag.startswith("no") and flag[2:] in booleans


def _code(path):
    """A script's text without its comment lines (a variable named in a comment is not read)."""
    text = open(os.path.join(ROOT, path), encoding="utf-8").read()
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))


def read_by(paths, var):
    """Whether a file of ``paths`` reads ``var``: ``$VAR``/``${VAR...}`` in shell, Dockerfile and
    Makefile (also ``ARG``/``ENV VAR`` and ``$(VAR)``), the string ``"VAR"`` in Python."""
    v = re.escape(var)
    patterns = {".py": r"[\"']%s[\"']" % v,
                "Dockerfile": r"\$\{?%s\b|^\s*(ARG\s+|ENV\s+)?%s=|^ARG\s+%s$" % (v, v, v),
                "Makefile": r"\$[({]%s[)}]|^%s\s*[:?+]?=" % (v, v)}
    for path in paths:
        kind = ".py" if path.endswith(".py") else os.path.basename(path)
        if re.search(patterns.get(kind, r"\$\{?%s\b" % v), _code(path), re.M):
            return True
    return False


def make_targets():
    text = open(os.path.join(ROOT, "Makefile"), encoding="utf-8").read()
    return set(re.findall(r"^([\w-]+):", text, re.M))


def problems(found):
    """One line per statement of the docs that the code contradicts."""
    out = []
    targets = make_targets()
    for doc, line, kind, name, flags, env in found:
        where = "%s:%d" % (doc, line)
        if kind == "make":
            if name not in targets:
                out.append("%s: make %s: no such target in the Makefile" % (where, name))
            if name == "container-test":
                out += ["%s: %s=...: tests/container/check_image.py does not read it" % (where, v)
                        for v in env if not read_by(["tests/container/check_image.py"], v)]
            continue
        if kind == "module" and name not in COMMANDS:
            if not name.startswith("<"):
                out.append("%s: python -m mlperf_bert %s: no such command" % (where, name))
            continue
        if kind == "bench" and not os.path.exists(os.path.join(ROOT, name)):
            out.append("%s: %s does not exist" % (where, name))
            continue
        for flag in flags:
            if flag in PLACEHOLDER_FLAGS:
                continue
            if (name, flag) in PENDING_FLAGS:
                if flag_known(kind, name, flag):  # merged: the entry would only hide the check
                    out.append("%s: %s --%s is a flag now: remove it from PENDING_FLAGS" % (where, name, flag))
                continue
            if not flag_known(kind, name, flag):
                out.append("%s: %s has no flag --%s (see its --help)" % (where, name, flag))
        if kind == "launcher":
            out += ["%s: %s=...: %s does not read it" % (where, v, "/".join(LAUNCHER_FILES))
                    for v in env if not read_by(LAUNCHER_FILES, v)]
    return out


# ---- the tests ---------------------------------------------------------------------------------

def test_every_documented_command_and_flag_exists():
    found = doc_commands()
    kinds = {k for _, _, k, _, _, _ in found}
    # The docs show all of these; finding fewer means the reader above broke, not the docs.
    assert kinds == {"module", "script", "launcher", "bench", "make"}, kinds
    assert len(found) > 100 and sum(len(f[4]) for f in found) > 120, len(found)
    bad = problems(found)
    assert not bad, "\n".join(bad)


def test_a_wrong_flag_or_command_in_the_docs_is_reported(tmp_path):
    doc = tmp_path / "bad.md"
    doc.write_text("Text `python -m mlperf_bert verify --workers=2 --worker=2 DIR`.\n\n"
                   "```sh\nDATA_DIR=d NO_SUCH_VAR=1 ./start_training.sh --preset=demo_cpu \\\n"
                   "  --train_batch_size=8 --nodo_eval --nolearning_rate=1 --no_such_flag=3\n"
                   "python -m mlperf_bert no-such-command --x=1\nmake demo no-such-target\n```\n\n"
                   "    .venv/bin/python create_pretraining_data.py --input_file=a --block_size=3\n")
    found = doc_commands([str(doc)])
    assert [p.split(": ", 1)[1] for p in problems(found)] == [
        "verify has no flag --worker (see its --help)",
        "start_training.sh has no flag --nolearning_rate (see its --help)",
        "start_training.sh has no flag --no_such_flag (see its --help)",
        "NO_SUCH_VAR=...: train_model.sh/start_training.sh/docker-entrypoint.sh/mlperf_bert/trainer/launch.py does not read it",
        "python -m mlperf_bert no-such-command: no such command",
        "make no-such-target: no such target in the Makefile",
        "create_pretraining_data.py has no flag --block_size (see its --help)",
    ]


def test_every_variable_the_docs_name_is_read_somewhere():
    """A backticked ``NAME`` or ``NAME=value`` (alone, or assignments before a command) in
    README.md or docs/running.md is an environment variable, build argument or image setting that
    some file of ours reads or sets."""
    readers = list(LAUNCHER_FILES) + ["Dockerfile", "Makefile", "tests/container/check_image.py", "tests/conftest.py"] \
        + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "examples", "*"))) \
        + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "mlperf_bert", "**", "*.py"),
                                                             recursive=True))
    missing = []
    for doc in ("README.md", "docs/running.md"):
        for _, span in _snippets(doc, blocks=False):
            words = span.split()
            names = [w.split("=", 1)[0] for w in words if _is_assignment(w)] if len(words) > 1 else words
            for var in names:
                if not re.match(r"^[A-Z][A-Z0-9_]*[A-Z0-9](=.*)?$", var):
                    continue
                var = var.split("=", 1)[0]
                if var in NOT_VARIABLES | OTHERS_VARIABLES or var.startswith("SLURM_"):
                    continue
                if not read_by(readers, var):
                    missing.append("%s: %s" % (doc, var))
    assert not missing, "\n".join(sorted(set(missing)))


def test_the_launchers_environment_list_is_what_they_read():
    """running.md's "Environment (defaults)" list names only variables the launchers read."""
    text = open(os.path.join(ROOT, "docs", "running.md"), encoding="utf-8").read()
    para = text[text.index("Environment (defaults):"):]
    para = para[:para.index("\n\n")]
    names = re.findall(r"`([A-Z][A-Z0-9_]+)`", para)
    assert len(names) > 15
    assert [v for v in names if not read_by(LAUNCHER_FILES, v)] == []
    assert not read_by(LAUNCHER_FILES, "CLEAR_CACHES")  # the name running.md once gave DROP_CACHES


def test_every_flag_the_docs_name_is_a_flag_of_ours_or_of_the_program_named():
    """Flags in prose (`--check_data=full`, `--noshuffle`) are not tied to a command line: each
    must be a flag of some command of ours, or of another program the docs show (OTHERS_FLAGS)."""
    ours = set(PLACEHOLDER_FLAGS) | {"version"}  # python -m mlperf_bert --version
    for name in COMMANDS:
        ours |= accepted("module", name)[0]
    for script in SCRIPTS:
        ours |= accepted("script", script)[0]
    ours |= accepted("launcher", "train_model.sh")[0]
    for path in glob.glob(os.path.join(ROOT, "bench", "*.py")) + [os.path.join(ROOT, "tests", "container",
                                                                                 "check_image.py")]:
        ours |= accepted("bench", os.path.relpath(path, ROOT))[0]
    others = set().union(*OTHERS_FLAGS.values())
    unknown, seen = [], 0
    for doc in DOCS:
        for line, text in _snippets(doc):
            for m in re.finditer(r"(?<![\w-])--(?:\[no\])?([A-Za-z][\w-]*)", text):
                flag, seen = m.group(1), seen + 1
                if not ({flag, flag[2:] if flag.startswith("no") else flag} & (ours | others)) \
                        and not any(flag == f for _, f in PENDING_FLAGS):
                    unknown.append("%s:%d: --%s" % (doc, line, flag))
    assert seen > 300
    assert not unknown, "\n".join(unknown)


def test_every_bench_prints_the_same_help_under_python_OO():
    """A sweep: ``python -OO bench/X.py --help`` (docstrings dropped) was an AttributeError on
    ``__doc__`` in every bench that has flags; they read their docstring from their source."""
    benches = [os.path.relpath(p, ROOT) for p in sorted(glob.glob(os.path.join(ROOT, "bench", "*.py")))]
    helped = [b for b in benches if bench_help(b)]
    assert len(helped) > 10
    for bench in helped:
        assert bench_help(bench, optimize=2) == bench_help(bench), bench


def _results_table():
    """{name: (bytes, md5)} of results/, checkpoint files under tf1_ckpt/ or tf2_ckpt/."""
    table = {}
    for path in glob.glob(os.path.join(ROOT, "results", "*_md5.txt")):
        kind = "tf2" if "tf2" in path else "tf1" if "tf1" in path else ""
        sizes = dict(reversed(line.split()) for line in open(path.replace("_md5.txt", "_sizes.txt")))
        for line in open(path, encoding="utf-8"):
            md5, name = line.split()
            key = "%s_ckpt/%s" % (kind, name) if name.startswith("model.ckpt") else name
            table[key] = (int(sizes[name]), md5)
    return table


def test_dataset_md_lists_the_sizes_and_md5s_of_results():
    text = open(os.path.join(ROOT, "docs", "dataset.md"), encoding="utf-8").read()
    rows = re.findall(r"^\| `([^`]+)`[^|]* \| ([\d,]+) \| ([0-9a-f]{32}) \|$", text, re.M)
    assert {name: (int(size.replace(",", "")), md5) for name, size, md5 in rows} == _results_table()


def test_the_readme_reference_gpu_command_is_the_presets():
    """Issue 33 (1): README's run_pretraining.py closed command said --train_batch_size=192 while the
    reference_gpu preset (the reference's 8-GPU command) says 24: every hyperparameter the preset
    sets is the README command's, and the command starts from the phase-1 checkpoint."""
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    cmds = [line for _, block in _snippets("README.md", inline=False) for line in _logical_lines(block)
            if "run_pretraining.py" in line and "--do_train" in line and "--submission_division=closed" in line]
    assert len(cmds) == 1, cmds
    readme = dict(t[2:].partition("=")[::2] for t in shlex.split(cmds[0]) if t.startswith("--"))
    env = dict(os.environ, DATA_DIR="/d", INIT_CHECKPOINT="/c", PYTHON=sys.executable)
    out = subprocess.run(["bash", os.path.join(ROOT, "train_model.sh"), "--preset=reference_gpu", "--dry_run"],
                         capture_output=True, text=True, env=env, check=True).stdout
    tokens = shlex.split(out)
    preset = dict(t[2:].partition("=")[::2] for t in tokens[tokens.index(next(t for t in tokens
                  if t.endswith("run_pretraining.py"))) + 1:] if t.startswith("--"))
    paths = {"bert_config_file", "input_file", "eval_input_file", "output_dir", "mlperf_log", "init_checkpoint",
             "target_mlm_accuracy"}  # target: the closed default, which the README command leaves as it is
    assert {k: v for k, v in preset.items() if k not in paths} == {k: v for k, v in readme.items() if k in preset
                                                                   and k not in paths}
    assert "reference_gpu` | the reference 8-GPU command: BERT-Large, seq 512/76, batch %s," % preset[
        "train_batch_size"] in text
    assert readme["init_checkpoint"] == "tf1_ckpt/model.ckpt-28252"


def test_the_phase1_checkpoint_has_one_place_in_the_docs():
    """Issue 33 (9): the phase-1 checkpoint was /data/phase1/model.ckpt-28252 in one README section
    and tf1_ckpt/ in the others: every path to it names the folder the MLCommons files give it."""
    found, other = 0, []
    for path in DOCS + ["Dockerfile", "examples/slurm_multinode.sbatch", "train_model.sh", "start_training.sh"]:
        for n, line in enumerate(open(os.path.join(ROOT, path), encoding="utf-8"), 1):
            for folder in re.findall(r"([\w.$-]*)/model\.ckpt-28252", line):
                found += 1
                if folder not in ("tf1_ckpt", "tf2_ckpt", "gradacc"):  # gradacc/: checkpoint_add_gradacc's output
                    other.append("%s:%d: %s/model.ckpt-28252" % (path, n, folder))
    assert found > 10 and not other, other


# ---- help lines against what the commands do -----------------------------------------------------

def _help_defaults(text):
    """{flag: default as printed} of an absl --help text."""
    out, flag = {}, None
    for line in text.splitlines():
        m = re.match(r"^\s*--(?:\[no\])?([\w-]+):", line)
        if m:
            flag = m.group(1)
        m = re.search(r"\(default: '([^']*)'\)", line)
        if m and flag:
            out[flag] = m.group(1)
    return out


def help_line_problems(name, line, help_text):
    """What the one-line help of command ``name`` (``python -m mlperf_bert --help``) says that the
    command's own --help contradicts: a flag it lacks; ``--flag=N`` where N is not the default;
    a bare number that is one of its flags' defaults (a default shown as a fixed limit); a
    script ``(X.py)`` that does not run this command."""
    out = []
    flags, _ = _help_flags(help_text)
    defaults = _help_defaults(help_text)
    for flag, value in re.findall(r"--([A-Za-z][\w]*)(?:=([\w.]+))?", line):
        if flag not in flags:
            out.append("%s: its help line names --%s, which it does not have" % (name, flag))
        elif value and defaults.get(flag) != value:
            out.append("%s: its help line says --%s=%s, the default is %r" % (name, flag, value, defaults.get(flag)))
    bare = re.sub(r"--[A-Za-z][\w]*(=[\w.]+)?", "", line)
    for number in re.findall(r"(?<![\w.-])(\d+(?:\.\d+)?)(?![\w.])", bare):
        named = sorted(f for f, v in defaults.items() if v == number)
        if named:
            out.append("%s: its help line gives %s, the default of --%s, as if fixed: write --%s=%s"
                       % (name, number, named[0], named[0], number))
    for script in re.findall(r"\b(\w+\.py)\b", line):
        if script not in SCRIPTS:
            out.append("%s: its help line names %s, which is no script of ours" % (name, script))
        elif "mlperf_bert." + _script_module(script) != "mlperf_bert." + COMMANDS[name][0]:
            out.append("%s: its help line names %s, which runs another module" % (name, script))
    return out


def test_each_command_help_line_agrees_with_the_command():
    """Issue 33: `pack` said "up to 3 sequences per row" (3 is the default of 1..16); `download`
    said it downloads "the official files" (it fetches the --url given)."""
    bad = []
    for name, (_, line) in COMMANDS.items():
        if name == "torchrun":  # torch's own argparse help
            continue
        bad += help_line_problems(name, line, module_help(name))
    assert not bad, "\n".join(bad)
    assert "--url" in COMMANDS["download"][1] and "official" not in COMMANDS["download"][1]


def test_a_help_line_that_disagrees_is_reported():
    pack = module_help("pack")
    assert help_line_problems("pack", "TFRecords -> packed HDF5 rows (up to 3 sequences per row)", pack) == [
        "pack: its help line gives 3, the default of --max_sequences_per_pack, as if fixed: write "
        "--max_sequences_per_pack=3"]
    assert help_line_problems("pack", "rows (up to --max_sequences_per_pack=4, --max_rows)", pack) == [
        "pack: its help line says --max_sequences_per_pack=4, the default is '3'",
        "pack: its help line names --max_rows, which it does not have"]
    assert help_line_problems("train", "the trainer (pick_eval_samples.py)", module_help("train")) == [
        "train: its help line names pick_eval_samples.py, which runs another module"]


def test_no_message_or_doc_sends_users_to_bare_torchrun():
    """Issue 33: the trainer's --num_gpus error said "launch with torchrun --nproc_per_node", which
    README says not to use (bare torchrun prints tracebacks on SIGTERM): the wrapper is
    `python -m mlperf_bert torchrun`."""
    files = [d for d in DOCS if d != "tests/data/README.md"] + list(LAUNCHERS) + sorted(  # (it records how
        os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "mlperf_bert", "**", "*.py"),  # data was
                                                    recursive=True))  # captured, with bare torchrun)
    bad = []
    for path in files:
        for n, line in enumerate(open(os.path.join(ROOT, path), encoding="utf-8"), 1):
            if re.search(r"(?<!mlperf_bert )(?<![\w/.-])torchrun --", line):
                bad.append("%s:%d: %s" % (path, n, line.strip()))
    assert not bad, "\n".join(bad)


def test_eval_results_keys_in_training_md_are_the_ones_written(tmp_path):
    """Issue 33: docs/training.md's keys of eval_results.txt left out `loss`."""
    from mlperf_bert.trainer import evaluation
    metrics = {k: 0.5 for k in ("loss",) + evaluation.EVAL_KEYS}
    path = evaluation.write_eval_results(str(tmp_path), metrics, 7)
    written = [line.split(" = ")[0] for line in open(path)]
    text = open(os.path.join(ROOT, "docs", "training.md"), encoding="utf-8").read()
    sentence = text[text.index("`eval_results.txt` has "):]
    sentence = sentence[:sentence.index(" as `key = value` lines")]
    assert re.findall(r"`(\w+)`", sentence.split(" has ", 1)[1]) == written


# ---- numbers the docs quote from files of the repository ----------------------------------------------

def results_facts():
    """Counts and totals of results/: the text shards and TFRecord parts with published values, the
    500 parts' total bytes (results/README.md)."""
    def names(f):
        return [line.split()[1] for line in open(os.path.join(ROOT, "results", f)) if line.strip()]
    shards = sorted(int(n[5:10]) for n in names("bert_reference_results_text_md5.txt") if n.startswith("part-"))
    assert shards == sorted(int(n[5:10]) for n in names("bert_reference_results_text_sizes.txt")
                            if n.startswith("part-"))
    parts = [n for n in names("bert_reference_tfrecord_sizes.txt") if n.startswith("part-")]
    readme = open(os.path.join(ROOT, "results", "README.md"), encoding="utf-8").read()
    total = int(re.search(r"the 500 parts total ([\d,]+) bytes", readme).group(1).replace(",", ""))
    return {"shards": shards, "tfrecord_parts": len(parts), "total_bytes": total}


def _ranges(numbers):
    out, start = [], None
    for i, n in enumerate(numbers):
        start = n if start is None else start
        if i + 1 == len(numbers) or numbers[i + 1] != n + 1:
            out.append("%d-%d" % (start, n) if n > start else "%d" % n)
            start = None
    return " and ".join([", ".join(out[:-1]), out[-1]] if len(out) > 1 else out)


def quoted_number_problems(doc, text, facts):
    """Each number ``doc`` quotes from results/ against the files: published shards and TFRecords
    (how many, which), the shards without a value, and any size within 20% of the 500 TFRecords'
    total, which must be that total in GB (or in GiB, written as such)."""
    out, shards = [], facts["shards"]
    checks = [(r"\b(\d+) of the 500 text shards", len(shards)),
              (r"\b(\d+) of the 500 TFRecords", facts["tfrecord_parts"]),
              (r"the other (\d+) text shards", 500 - len(shards))]
    for pattern, want in checks:
        for m in re.finditer(pattern, text):
            if int(m.group(1)) != want:
                out.append("%s: %r: results/ says %d" % (doc, m.group(0), want))
    for m in re.finditer(r"of the 500 text shards, parts ([\d\-, and]+\d)", text):
        if m.group(1) != _ranges(shards):
            out.append("%s: %r: results/ has parts %s" % (doc, m.group(0), _ranges(shards)))
    gb, gib = facts["total_bytes"] / 1e9, facts["total_bytes"] / 2 ** 30
    # a rate (GB/s) is no size
    for m in re.finditer(r"(\d+(?:\.\d+)?) (GB|GiB)\b(?!/)", text):
        value, unit = float(m.group(1)), m.group(2)
        exact = gb if unit == "GB" else gib
        if abs(value - exact) < 0.2 * exact and abs(value - exact) > 0.5:
            out.append("%s: %r: the 500 TFRecords of results/ are %.0f GB (%.1f GiB)" % (doc, m.group(0), gb, gib))
    return out


def test_numbers_the_docs_quote_from_results_are_the_files():
    """Issue 33: README said `verify` checks "every input and output against the published
    checksums" (results/ has 6 of 500 text shards, 2 of 500 TFRecords) and "~365 GB" for 391 GB."""
    facts = results_facts()
    assert facts["total_bytes"] == 391434110129 and len(facts["shards"]) == 6
    seen, bad = over_docs(r"of the 500 (?:text shards|TFRecords)|\d GB \(",
                          lambda doc, text: quoted_number_problems(doc, text, facts))
    assert seen >= 4
    assert not bad, "\n".join(bad)


def over_docs(pattern, problems):
    """(how many quotes ``pattern`` finds in the docs, ``problems(doc, text)`` of every doc)."""
    seen, bad = 0, []
    for doc in DOCS:
        text = open(os.path.join(ROOT, doc), encoding="utf-8").read()
        seen += len(re.findall(pattern, text))
        bad += problems(doc, text)
    return seen, bad


def test_a_number_quoted_wrongly_from_results_is_reported():
    facts = results_facts()
    text = ("verify checks 7 of the 500 text shards and 2 of the 500 TFRecords; the other 493 text shards "
            "... of the 500 text shards, parts 0-2 and 497-498. Writing ~365 GB, i.e. 364.6 GiB or 391 GB.")
    assert quoted_number_problems("x.md", text, facts) == [
        "x.md: '7 of the 500 text shards': results/ says 6",
        "x.md: 'the other 493 text shards': results/ says 494",
        "x.md: 'of the 500 text shards, parts 0-2 and 497-498': results/ has parts 0-2 and 497-499",
        "x.md: '365 GB': the 500 TFRecords of results/ are 391 GB (364.6 GiB)"]


def check_log_rule_count(tmp_path):
    """How many rules check-log's verdict line counts for a published log: the official checker's
    and every BERT rule (a log's repeated lines or a missing division add one each)."""
    import gzip
    from mlperf_bert.harness.compliance import bert_rules
    from mlperf_bert.harness.records import read_log
    log = tmp_path / "result_0.txt"
    with gzip.open(os.path.join(ROOT, "tests", "data", "mlperf_logs", "v5.0_NVIDIA_nyx_n1_result_0.txt.gz")) as f:
        log.write_bytes(f.read())
    return 1 + len(bert_rules(read_log(str(log))))


def verdict_count_problems(doc, text, rules):
    """Each verdict line ``doc`` quotes (``(N pass, N warn, N fail)``) whose counts no log gives:
    ``rules`` of every log, up to two more (repeated lines, no division)."""
    return ["%s: %r counts %d rules: check-log counts %d (up to %d)" % (doc, m.group(0), total, rules, rules + 2)
            for m in re.finditer(r"\((\d+) pass, (\d+) warn, (\d+) fail\)", text)
            for total in [sum(int(n) for n in m.groups())] if not rules <= total <= rules + 2]


def test_the_verdict_lines_the_docs_quote_count_every_rule(tmp_path):
    """A sweep of the docs: running.md's example verdict `WARN out/mlperf.log (5 pass, 3 warn, 0 fail)`
    counted 8 rules; check-log gives every log 9 (the official checker and eight BERT rules)."""
    rules = check_log_rule_count(tmp_path)
    assert rules == 9
    seen, bad = over_docs(r"\d+ pass, \d+ warn, \d+ fail\)", lambda doc, text: verdict_count_problems(doc, text, rules))
    assert seen >= 1
    assert not bad, "\n".join(bad)
    assert verdict_count_problems("x.md", "`WARN out/mlperf.log (5 pass, 3 warn, 0 fail)`", rules) == [
        "x.md: '(5 pass, 3 warn, 0 fail)' counts 8 rules: check-log counts 9 (up to 11)"]


# ---- issue 37: the docs' commands as the launchers and the writers take them ---------------------

def _launcher_env_names():
    """The variables the launchers read, as running.md's "Environment (defaults)" list names them."""
    text = open(os.path.join(ROOT, "docs", "running.md"), encoding="utf-8").read()
    para = text[text.index("Environment (defaults):"):]
    return set(re.findall(r"`([A-Z][A-Z0-9_]+)`", para[:para.index("\n\n")])) | {"DRY_RUN", "CHECK_ONLY"}


def _launcher_invocation(tokens, env=None):
    """(launcher, {NAME: value}, args) of one simple command, or None: a launcher run with its
    settings, or ``docker run ... -e NAME=value ... IMAGE [--flag ...]`` (start_training.sh). A
    docker command with elided options (``...``) or none at all (the demo) is a sketch: None."""
    env = dict(env or {})
    while tokens and (_is_assignment(tokens[0]) or tokens[0] == "env"):
        if tokens[0] != "env":
            env.__setitem__(*tokens[0].split("=", 1))
        tokens = tokens[1:]
    if not tokens:
        return None
    if tokens[0] in ("docker", "podman") and tokens[1:2] == ["run"] and IMAGE in tokens:
        head, rest = tokens[:tokens.index(IMAGE)], tokens[tokens.index(IMAGE) + 1:]
        if "..." in head:
            return None
        env.update(tokens[k + 1].split("=", 1) for k, t in enumerate(head[:-1]) if t == "-e")
        if rest and not rest[0].startswith("--"):
            return _launcher_invocation(rest, env)
        if not rest and "DATA_DIR" not in env and "INPUT_FILES" not in env:
            return None  # the image's demo
        return "start_training.sh", env, rest
    if os.path.basename(tokens[0]) in LAUNCHERS:
        return os.path.basename(tokens[0]), env, tokens[1:]
    return None


def launcher_commands(doc_files=DOCS):
    """Each launcher command of the docs' code blocks: (doc, line, launcher, env, args)."""
    found = []
    for doc in doc_files:
        for line_no, text in _snippets(doc, inline=False):
            for line in _logical_lines(text):
                for tokens in _split_commands(line):
                    got = _launcher_invocation(tokens)
                    if got:
                        found.append((doc, line_no) + got)
    return found


def _launch(env, args, **extra):
    """train_model.sh with ``env`` (nothing else of the launchers' environment) and ``args``.
    NUM_GPUS is 1: this host has no GPU, and how many a command asks for is not what a doc can get
    wrong here (a doc's NUM_GPUS must still be a number, checked first)."""
    shell = dict(RANDOM="4242", PWD=ROOT)  # what the shell would put for $RANDOM and $PWD (SEED=$RANDOM)
    run_env = {k: v for k, v in os.environ.items() if k not in _launcher_env_names()}
    run_env.update({k: re.sub(r"\$\{?(\w+)\}?", lambda m: shell.get(m.group(1), os.environ.get(m.group(1), "")), v)
                    for k, v in env.items()}, PYTHON=sys.executable, NUM_GPUS="1", **extra)
    return subprocess.run(["bash", os.path.join(ROOT, "train_model.sh")] + list(args), capture_output=True,
                          text=True, env=run_env, cwd=ROOT, timeout=120)


def trainer_flags_of(env, args):
    """The run_pretraining.py flags ``train_model.sh args`` (its --dry_run) gives the trainer."""
    tokens = shlex.split(_launch(env, args, DRY_RUN="1").stdout)
    script = next(k for k, t in enumerate(tokens) if t.endswith("run_pretraining.py"))
    return tokens[script + 1:]


def launcher_problems(where, env, args):
    """What refuses a documented launcher command as written: train_model.sh's own checks
    (CHECK_ONLY=1, which start_training.sh runs before its first run), then the trainer's flag
    checks (flag_checks.check_flags) on the command its --dry_run prints."""
    from mlperf_bert import flags
    from mlperf_bert.errors import UserError
    from mlperf_bert.trainer import flag_checks, trainer_flags
    from mlperf_bert.trainer.run_config import RunConfig
    if "NUM_GPUS" in env and not re.match(r"^[1-9][0-9]*$", env["NUM_GPUS"]):
        return ["%s: NUM_GPUS=%s is not a number of processes" % (where, env["NUM_GPUS"])]
    checked = _launch(env, args, CHECK_ONLY="1")
    if checked.returncode != 0:
        return ["%s: refused as written: %s" % (where, checked.stderr.strip().splitlines()[-1])]
    fv = trainer_flags.define_flags()
    try:
        flags.parse(fv, ["run_pretraining.py"] + trainer_flags_of(env, args), positional=False)
        flag_checks.check_flags(RunConfig.from_flags(fv))
    except UserError as e:
        return ["%s: the trainer refuses it: %s" % (where, e)]
    return []


@pytest.mark.slow
def test_the_launcher_commands_of_the_docs_run_as_written():
    """Issue 37 (17): docs/training.md's GPU-owner commands (`PRESET=reference_gpu DATA_DIR=...
    ./train_model.sh --num_train_steps=300 ...`) were refused: a closed preset without
    INIT_CHECKPOINT. Every launcher command the docs show passes the launchers' checks and the
    trainer's flag checks; the old command is reported."""
    found = launcher_commands()
    assert len(found) >= 6 and {f[2] for f in found} == set(LAUNCHERS), found
    assert any(f[0] == "docs/training.md" and "INIT_CHECKPOINT" in f[3] and "--num_train_steps=300" in f[4]
               for f in found)
    seen, bad = set(), []
    for doc, line, _, env, args in found:
        key = (tuple(sorted(env.items())), tuple(args))
        if key not in seen:
            seen.add(key)
            bad += launcher_problems("%s:%d" % (doc, line), env, args)
    assert not bad, "\n".join(bad)
    old = dict(PRESET="reference_gpu", DATA_DIR="...", OUTPUT_DIR="/tmp/ref")
    assert launcher_problems("x", old, ["--num_train_steps=300"]) == [
        "x: refused as written: " + _launch(old, ["--num_train_steps=300"]).stderr.strip()]
    assert "INIT_CHECKPOINT" in launcher_problems("x", old, ["--num_train_steps=300"])[0]
    named = dict(old, INIT_CHECKPOINT="c", SUBMISSION_ORG="ORG", SUBMISSION_PLATFORM="NAME")  # issue 37 (3)
    assert launcher_problems("x", named, ["--eval_frequency=5"]) == [  # (the launcher's check is the trainer's)
        "x: refused as written: error: train_model.sh: --submission_division=closed needs the MLPerf eval frequency "
        "and target: drop --eval_frequency and --target_mlm_accuracy, or use open"]


def make_dataset_names():
    """Every name `make-dataset` writes into its --output_dir from the 500 text shards and eval.txt."""
    from mlperf_bert.dataset import checksums, make_dataset, text_pipeline
    shards = [text_pipeline.part_name(i) for i in range(text_pipeline.NUM_OUTPUTS)] + ["eval.txt"]
    return {n for s in shards for n in make_dataset._outputs_of(s)} | {checksums.MANIFEST_NAME,
                                                                       make_dataset.SETTINGS_NAME}


def tfrecords_name_problems(doc, text, names):
    """Each ``tfrecords/NAME`` (or glob) of ``text`` that names no file make-dataset writes."""
    import fnmatch
    out = []
    for m in re.finditer(r"\btfrecords/([^\s'\"`),;]+)", text):
        if not fnmatch.filter(names, m.group(1)):
            out.append("%s: tfrecords/%s: make-dataset writes no such file" % (doc, m.group(1)))
    return out


def test_the_tfrecords_the_docs_name_are_files_make_dataset_writes():
    """Issue 37 (17): the speed-lever command read `tfrecords/part-00000`, which no command writes
    (make-dataset names each TFRecord after its text shard, `part-00000-of-00500`). The docs' folder
    `tfrecords/` is README's make-dataset --output_dir; every file or glob they name in it is one of
    its outputs."""
    names = make_dataset_names()
    assert {"part-00000-of-00500", "part-00499-of-00500", "eval_10k", "manifest.tsv"} <= names
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    assert re.search(r"python -m mlperf_bert make-dataset .*--output_dir=tfrecords ", readme)
    bad, seen = [], 0
    for doc in DOCS:
        text = open(os.path.join(ROOT, doc), encoding="utf-8").read()
        seen += len(re.findall(r"\btfrecords/[^\s'\"`),;]", text))
        bad += tfrecords_name_problems(doc, text, names)
    assert seen > 10 and not bad, "\n".join(bad)
    assert tfrecords_name_problems("x.md", "--input_file=tfrecords/part-00000 tfrecords/part-0000[0-3]-of-00500",
                                   names) == ["x.md: tfrecords/part-00000: make-dataset writes no such file"]


def _section(text, heading):
    """The text under a Markdown heading, to the next heading of that level or above."""
    level = heading.split(" ")[0]
    start = text.index(heading + "\n")
    ends = [m.start() for m in re.finditer(r"^#{1,%d} " % len(level), text[start + len(heading):], re.M)]
    return text[start:start + len(heading) + (ends[0] if ends else len(text))]


def layout_table():
    """{(subpackage or "", module)} that README's layout table names (a .c file with its suffix)."""
    text = _section(open(os.path.join(ROOT, "README.md"), encoding="utf-8").read(), "## Layout")
    names, group = set(), None
    for row in re.findall(r"^\|(.*)\|$", text, re.M):
        cells = [c.strip() for c in row.split("|")]
        m = re.match(r"^\*\*`(\w+)/`\*\*", cells[0])
        if m:
            group = m.group(1)
        elif cells[0] == "top level":
            names |= {("", n) for n in re.findall(r"`(\w+)`", cells[1])}
        elif group:
            names |= {(group, n) for n in re.findall(r"`([\w.]+)`", cells[0])}
    return names


def package_modules():
    out = set()
    for path in glob.glob(os.path.join(ROOT, "mlperf_bert", "**", "*.[pc]*"), recursive=True):
        rel = os.path.relpath(path, os.path.join(ROOT, "mlperf_bert"))
        group, base = os.path.split(rel)
        if base.endswith(".py") and not base.startswith("__"):
            out.add((group, base[:-3]))
        elif base.endswith(".c"):
            out.add((group, base))
    return out


def test_the_layout_table_names_every_module_of_the_package():
    """Issue 37 (20): README's layout table lacked preflight, step, warmup, levers, memory_plan,
    throughput, run_state and cli; it names every module of mlperf_bert/, each under its
    subpackage, and no module that is not there."""
    modules, table = package_modules(), layout_table()
    assert ("trainer", "training") in modules and ("dataset", "_fasttok.c") in modules and ("", "cli") in modules
    assert sorted(modules - table) == [] and sorted(table - modules) == []


def test_the_trainer_flags_added_to_the_references_are_all_in_the_flag_list():
    """Issue 37 (20): training.md's "Flags added to the reference's" lacked --submission_status (and
    --check_data): every flag of run_pretraining.py that the reference trainer lacks is in it."""
    from test_training import REFERENCE_FLAGS
    from mlperf_bert.trainer import trainer_flags
    ours = [n for n in trainer_flags.define_flags()._flags() if n not in REFERENCE_FLAGS]
    text = _section(open(os.path.join(ROOT, "docs", "training.md"), encoding="utf-8").read(),
                    "## Flags added to the reference's")
    assert len(ours) > 20 and "submission_status" in ours
    missing = [n for n in ours if not re.search(r"--(?:\[no\]|no)?%s(?!\w)" % re.escape(n), text)]
    assert missing == []


def test_the_docs_give_the_train_samples_warnings_check_log_gives(tmp_path):
    """Issue 37 (20): compliance.md and running.md said check-log warns about a train_samples
    "logged before training"; it also warns about one logged before any eval. Each WARN of the rule
    (absent; each "logged before ...") is in both docs' train_samples row."""
    from test_compliance import edit, results, write_log

    def to_start(ls):  # a budget logged with the hyperparameters
        line = ls.pop(next(k for k, l in enumerate(ls) if '"train_samples"' in l))
        j = next(k for k, l in enumerate(ls) if '"init_stop"' in l)
        return ls[:j] + [line] + ls[j:]
    logs = [edit(write_log(tmp_path / "none.txt"), lambda ls: [l for l in ls if '"train_samples"' not in l]),
            edit(write_log(tmp_path / "budget.txt"), to_start),
            write_log(tmp_path / "noeval.txt", accs=(), status="aborted")]
    warnings = [results(p)["train_samples"] for p in logs]
    assert [r.level for r in warnings] == ["WARN"] * 3
    said = ["absent" if r.detail.startswith("no train_samples line") else
            re.search(r" (logged before [\w ]+?):", r.detail).group(1) for r in warnings]
    assert said == ["absent", "logged before training", "logged before any eval"]
    for doc in ("docs/compliance.md", "docs/running.md"):
        row = re.search(r"^\| `train_samples` \|.*$", open(os.path.join(ROOT, doc), encoding="utf-8").read(),
                        re.M).group(0)
        assert [s for s in said if s not in row] == [], doc


def test_the_status_table_puts_each_flag_refusal_where_start_training_says_it(tmp_path):
    """A sweep of the docs: running.md's status table said an unknown flag or a value outside a
    flag's choices was the trainer's to refuse, after STARTING TIMING RUN; start_training.sh refuses
    both before any run, in the trainer's words (train_model.sh reads the flags as the trainer does).
    The clause of the row that places a refusal after the timing line names neither, and each flag
    refusal the row names is start_training.sh's one line, exit 2, no run started."""
    text = open(os.path.join(ROOT, "docs/running.md"), encoding="utf-8").read()
    row = re.search(r"^\| a configuration error .*$", text, re.M).group(0)
    after = [c for c in row.split(";") if "STARTING TIMING RUN" in c]
    assert len(after) == 1 and "unknown flag" not in after[0] and "choices" not in after[0], after
    named = re.findall(r"`(--\w+=\w+)`", row.replace(after[0], ""))
    assert "unknown flag" in row and {"--num_train_steps=abc", "--device=tpu"} <= set(named), row
    for name in ("part-00000-of-00500", "eval_10k"):
        (tmp_path / name).write_bytes(b"")
    env = dict(os.environ, DATA_DIR=str(tmp_path), PYTHON=sys.executable, OUTPUT_DIR=str(tmp_path / "out"),
               DROP_CACHES="0", CHECK_LOG="0", PRESET="demo_cpu")
    for flag in named + ["--bogus_flag=1"]:
        proc = subprocess.run([os.path.join(ROOT, "start_training.sh"), flag], capture_output=True, text=True,
                              env=env, timeout=120)
        assert (proc.returncode, proc.stdout) == (2, ""), (flag, proc.stdout, proc.stderr)
        assert proc.stderr.startswith("error: train_model.sh: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert not (tmp_path / "out").exists()


def _submission_block(doc):
    """The docs' code block with the ten-run submission command (NUM_RUNS=10 ./start_training.sh)."""
    blocks = [b for _, b in _snippets(doc, inline=False) if "NUM_RUNS=10" in b and "start_training.sh" in b]
    assert len(blocks) == 1, (doc, blocks)
    return blocks[0]


def test_the_submission_command_says_it_drops_the_hosts_page_cache():
    """Issue 37 (22): README's submission command drops the whole host's page cache as root
    (start_training.sh's default DROP_CACHES=auto) without a word: said beside it, with
    DROP_CACHES=0 for a shared host, in README and running.md."""
    src = open(os.path.join(ROOT, "start_training.sh"), encoding="utf-8").read()
    assert re.search(r"\$\{DROP_CACHES:=(\w+)\}", src).group(1) == "auto"
    for doc in ("README.md", "docs/running.md"):
        comment = " ".join(line.lstrip("# ") for line in _submission_block(doc).splitlines() if line.startswith("#"))
        assert "whole host's page cache" in comment and "DROP_CACHES=auto" in comment, doc
        assert re.search(r"shared (host|with other jobs).* DROP_CACHES=0", comment), doc


SLURM_STUBS = {
    # srun: the command once per node, as SLURM runs a task on each, with that node's SLURM_NODEID
    "srun": 'while [[ "$1" == -* ]]; do shift; done\n'
            'for (( n = 0; n < SLURM_NNODES; n++ )); do SLURM_NODEID=$n "$@" || exit; done\n',
    "scontrol": '[[ "$*" == "show hostnames $SLURM_JOB_NODELIST" ]] && printf "node-a\\nnode-b\\n"\n',
}


@pytest.mark.slow
def test_the_slurm_example_is_the_readme_submission_command_on_every_node(tmp_path):
    """Issue 37 (21): examples/slurm_multinode.sbatch called the trainer directly, once, with
    checkpoints every 2000 steps and org/platform `unknown`. Run with stand-ins for srun and scontrol
    (and for start_training.sh, which records what it is given), it runs README's submission command
    on each node: the same preset, the same settings (the ones README writes as ... or placeholders
    set by the submitter), NNODES/NODE_RANK/MASTER_ADDR for the node; the launchers accept it and it
    is a timed closed run (no periodic checkpoint); without SUBMISSION_ORG/PLATFORM it stops at once."""
    sbatch = os.path.join(ROOT, "examples", "slurm_multinode.sbatch")
    subprocess.run(["bash", "-n", sbatch], check=True)
    bin_dir, submit, record = tmp_path / "bin", tmp_path / "submit", tmp_path / "record.jsonl"
    bin_dir.mkdir()
    submit.mkdir()
    for name, body in SLURM_STUBS.items():
        (bin_dir / name).write_text("#!/usr/bin/env bash\n" + body)
        (bin_dir / name).chmod(0o755)
    (tmp_path / "record.py").write_text(
        "import json, os, sys\nwith open(%r, 'a') as f:\n"
        "    f.write(json.dumps({'env': dict(os.environ), 'args': sys.argv[1:]}) + '\\n')\n" % str(record))
    (submit / "start_training.sh").write_text('#!/usr/bin/env bash\nexec %s %s "$@"\n' % (
        sys.executable, tmp_path / "record.py"))
    (submit / "start_training.sh").chmod(0o755)
    # (SUBMISSION_STATUS as README sets it: the sbatch passes it only where set, the trainer's default
    # being the same onprem, so that a --config file's submission_status holds)
    given = dict(SUBMISSION_ORG="ORG", SUBMISSION_PLATFORM="NAME", SUBMISSION_STATUS="onprem", DATA_DIR="/d/tfrecords",
                 INIT_CHECKPOINT="/d/tf1_ckpt/model.ckpt-28252")
    env = {k: v for k, v in os.environ.items() if k not in _launcher_env_names() and not k.startswith("SLURM")}
    env.update(PATH="%s:%s" % (bin_dir, os.environ["PATH"]), SLURM_NNODES="2", SLURM_JOB_NODELIST="node-[a-b]",
               SLURM_JOB_ID="7")

    def run(**settings):
        return subprocess.run(["bash", sbatch], capture_output=True, text=True, env=dict(env, **settings),
                              cwd=str(submit), timeout=60)
    refused = run(**{k: v for k, v in given.items() if not k.startswith("SUBMISSION_")})
    assert refused.returncode == 2 and not record.exists(), refused.stdout + refused.stderr
    assert refused.stderr.startswith("error: slurm_multinode.sbatch: set SUBMISSION_ORG SUBMISSION_PLATFORM ")
    assert len(refused.stderr.splitlines()) == 1
    proc = run(**given)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    nodes = [json.loads(line) for line in record.read_text().splitlines()]
    readme = [f for f in launcher_commands(["README.md"]) if "NUM_RUNS" in f[3]]
    assert len(readme) == 1
    _, _, _, readme_env, readme_args = readme[0]
    assert len(nodes) == 2 and set(readme_env) >= set(given)
    for rank, node in enumerate(nodes):
        assert node["args"] == readme_args, node["args"]
        assert {k: node["env"].get(k) for k in readme_env} == dict(readme_env, **given)
        assert {k: node["env"].get(k) for k in ("NNODES", "NODE_RANK", "MASTER_ADDR")} == dict(
            NNODES="2", NODE_RANK=str(rank), MASTER_ADDR="node-a")
        assert re.match(r"^[1-9][0-9]*$", node["env"]["NUM_GPUS"]) and node["env"]["MASTER_PORT"]
        settings = {k: v for k, v in node["env"].items() if k in _launcher_env_names()}
        assert launcher_problems("node %d" % rank, settings, node["args"]) == []
        trainer = trainer_flags_of(settings, node["args"])
        assert "--submission_division=closed" in trainer and "--save_checkpoints_steps=0" in trainer
        assert "--submission_org=ORG" in trainer and "--submission_platform=NAME" in trainer
        assert "--init_checkpoint=/d/tf1_ckpt/model.ckpt-28252" in trainer


def _hf_pins():
    """requirements.txt's lines marked for the Hugging Face comparison (extra == "hf")."""
    return [line for line in open(os.path.join(ROOT, "requirements.txt"), encoding="utf-8").read().splitlines()
            if not line.startswith("#") and re.search(r';\s*extra\s*==\s*"hf"', line)]


def test_transformers_is_pinned_where_the_hugging_face_comparison_finds_it(tmp_path):
    """Issue 37 (19): the benches compare with Hugging Face when `import transformers` works, and
    nothing installed it. requirements.txt, the one place for versions, pins it under the extra
    "hf", which pip skips (`make venv`, .ci/run, the image); `make hf` installs that pin into .venv;
    every transformers version the docs quote is the pin."""
    from packaging.requirements import Requirement
    pins = _hf_pins()
    assert len(pins) == 1
    req = Requirement(pins[0])
    assert req.name == "transformers" and str(req.specifier).startswith("==")
    assert not req.marker.evaluate({"extra": ""}) and req.marker.evaluate({"extra": "hf"})
    for bench in ("bench/train_throughput.py", "bench/gpu_check.py"):
        assert re.search(r"^\s*import transformers\b", open(os.path.join(ROOT, bench)).read(), re.M), bench
    stamp = str(tmp_path / "stamp")  # not there: -o keeps make from building the venv
    out = subprocess.run(["make", "-s", "-o", stamp, "hf", "PY=echo", "STAMP=" + stamp], capture_output=True,
                         text=True, cwd=ROOT, check=True, timeout=60).stdout
    assert out.split() == ["-m", "pip", "install", "-q", "transformers" + str(req.specifier)]
    version = str(req.specifier)[2:]
    quoted = [(doc, v) for doc in DOCS for v in re.findall(r"transformers(?: |==)(\d[\w.]*\d)",
                                                         open(os.path.join(ROOT, doc), encoding="utf-8").read())]
    assert quoted and all(v == version for _, v in quoted), quoted
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    assert "make hf" in _section(readme, "## Have a GPU?")


def test_a_docker_run_as_the_user_mounts_a_folder_made_before():
    """A sweep of the image: the docs' demo as you, `docker run --rm --user "$(id -u):$(id -g)" -v
    "$PWD/out":/output mlperf-bert`, in a folder without out/: docker makes the -v folder as root, and
    the demo, as you, ended "cannot create output directory /output/demo: Permission denied"
    (make container-test makes its folders first). Each such command follows a `mkdir -p` of its
    folder in the same block."""
    bad = []
    for doc in DOCS:
        for start, text in _snippets(doc, inline=False):
            made = set()
            for line in _logical_lines(text):
                for cmd in _split_commands(line):
                    if cmd[:2] == ["mkdir", "-p"]:
                        made.update(p.replace("$PWD/", "").rstrip("/") for p in cmd[2:])
                    if cmd[:2] != ["docker", "run"] or "--user" not in cmd:
                        continue
                    hosts = [v.split(":")[0] for f, v in zip(cmd, cmd[1:]) if f == "-v"]
                    bad += ["%s:%d: %s" % (doc, start, h) for h in hosts
                            if h.replace("$PWD/", "").rstrip("/") not in made]
    assert bad == []


def test_the_oldest_python_pyproject_admits_installs_every_pin():
    """A sweep of the pins: pyproject.toml said requires-python >=3.10 while requirements.txt pins
    numpy and matplotlib versions that need 3.11 (and the code imports tomllib, 3.11's): on 3.10 `make
    venv` ended in pip's "no matching distribution found for numpy==...". The oldest Python it admits
    must be one that every pin (as installed here, its Requires-Python) installs on."""
    import importlib.metadata
    import tomllib
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)
    oldest = re.fullmatch(r">=(3\.\d+)", project["project"]["requires-python"]).group(1)
    assert project["tool"]["ruff"]["target-version"] == "py" + oldest.replace(".", "")
    checked = []
    for line in open(os.path.join(ROOT, "requirements.txt"), encoding="utf-8").read().splitlines():
        if not line.strip() or line.startswith("#") or line in _hf_pins():
            continue
        req = Requirement(line)
        meta = importlib.metadata.metadata(req.name)
        if not req.specifier.contains(meta["Version"].split("+")[0]):
            continue  # another version installed here: its metadata is not the pin's
        if meta["Requires-Python"]:
            checked.append(req.name)
            assert SpecifierSet(meta["Requires-Python"]).contains(oldest + ".0"), (req.name, meta["Requires-Python"])
    assert "numpy" in checked and "matplotlib" in checked, checked


def test_the_readme_tells_a_gpu_owner_what_to_run_and_send_back():
    """Issue 37 (19): README never pointed a GPU owner to bench/gpu_check.py. Its "Have a GPU?"
    section runs it (the command's flags are checked with every documented command), says how long,
    what it prints and writes, what to compare with (sections of docs/training.md that exist) and
    what to send back."""
    def flat(text):  # one space for each run of white space, one kind of quote
        return re.sub(r"\s+", " ", text).replace("'", '"')
    section = flat(_section(open(os.path.join(ROOT, "README.md"), encoding="utf-8").read(), "## Have a GPU?"))
    training = flat(open(os.path.join(ROOT, "docs", "training.md"), encoding="utf-8").read())
    assert "bench/gpu_check.py --budget_s=420" in section and "under 7 minutes" in section
    for label in ("How long", "What it prints", "Compare with", "Send back"):
        assert "**%s:**" % label in section, label
    assert "`gpu_check.md`" in section and "`gpu_check.json`" in section
    for ref in ("GPU figures, measured on one H100", "A memory and FLOP plan", 'Replacing "not measured"'):
        assert '"%s"' % ref in section and "**%s.**" % ref in training, ref
    for figure in re.findall(r"\b(\d+(?:\.\d+)?) (?:sequences/s|real sequences/s|rows/s|GiB a row)", section):
        assert figure in training, figure


def _presets_section():
    """docs/training.md from "Replacing 'not measured'" to the end of its section."""
    text = open(os.path.join(ROOT, "docs", "training.md"), encoding="utf-8").read()
    start = text.index('**Replacing "not measured".**')
    ends = [m.start() for m in re.finditer(r"^#{1,2} ", text[start:], re.M)]
    return start, text[start:start + (ends[0] if ends else len(text))]


def test_each_preset_family_is_measured_for_real_and_without_the_dataset():
    """Issue 47 (10, 11): "each preset for real" gave reference_gpu alone, and a GPU owner had no
    way to measure 8-GPU throughput without the 391 GB dataset. Each family (reference_gpu,
    tpu_8192, rcp_<B>) has a command on the full data from the phase-1 checkpoint and one on the
    minimal data (the recipe's mini/ folder), and a row of what to expect, whose 8-GPU figure says
    "not measured on a GPU" (the launcher test checks that each command runs as written)."""
    start, section = _presets_section()
    first = open(os.path.join(ROOT, "docs", "training.md"), encoding="utf-8").read()[:start].count("\n") + 1
    last = first + section.count("\n")
    cmds = [(env, args) for doc, line, _, env, args in launcher_commands(["docs/training.md"]) if first <= line <= last]
    for family in ("reference_gpu", "tpu_8192", "rcp_"):
        envs = [env for env, _ in cmds if env.get("PRESET", "").startswith(family)]
        assert any("INIT_CHECKPOINT" in e for e in envs), (family, "full data")
        assert any(e.get("DATA_DIR") == "mini" and "INIT_CHECKPOINT" not in e for e in envs), (family, "mini data")
        rows = [r for r in re.findall(r"^\| `%s[^|]*\|.*\|$" % family, section, re.M)]
        assert len(rows) == 1 and rows[0].rstrip("| ").endswith("not measured on a GPU"), (family, rows)


@pytest.mark.slow
def test_the_minimal_data_recipe_makes_what_the_docs_say(tmp_path):
    """The recipe's shell lines, run as written (python: this interpreter) in a folder holding this
    repository's tests/ and scripts: one training shard and a 1,000-record eval set, the counts the
    docs give."""
    from mlperf_bert.dataset import tfrecord
    _, section = _presets_section()
    block = section[section.index("    mkdir -p mini"):]
    block = block[:block.index("    # each preset family")]
    script = "set -e\n" + "\n".join(l[4:] for l in block.splitlines())
    for name in ("tests", "create_pretraining_data.py", "pick_eval_samples.py"):
        os.symlink(os.path.join(ROOT, name), str(tmp_path / name))
    env = dict(os.environ, PYTHONPATH=ROOT, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    proc = subprocess.run(["bash", "-c", script.replace("python ", shlex.quote(sys.executable) + " ")],
                          cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    counts = {name: sum(1 for _ in tfrecord.scan_records(str(tmp_path / "mini" / name)))
              for name in ("part-00000", "eval_intermediate", "eval_1k")}
    flat = re.sub(r"\s+", " ", section)
    assert "%s training records" % format(counts["part-00000"], ",") in flat, counts
    assert "%s eval records (2.7 MB) of %s" % (format(counts["eval_1k"], ","),
                                             format(counts["eval_intermediate"], ",")) in flat, counts
    assert counts["eval_1k"] == 1000 and sorted(os.listdir(str(tmp_path / "mini"))) == [
        "eval_1k", "eval_intermediate", "part-00000", "text0", "text1"]


# what gives a GPU figure in a row of the docs: a GPU, a rate, a ratio to the plain step, a gpu_check run
GPU_FIGURE = re.compile(r"H100|rows/s|seq/s|sequences/s|\b\d+(?:\.\d+)?x\b|\brun \d\b|"
                        r"(?<!not )measured on (?:a|one) GPU")


def flag_doc_problems(fv, docs):
    """Where the trainer's flag help and the docs' flag statements disagree. ``docs``: {name: text}.
    A flag's statements: its bullet or parenthesis in a flag list ("`--name` a|b (default x)",
    "`--name` (50)") and the rows of a table that start with it ("| `--name` ... |").
    - the GPU status: a help that says "not measured on a GPU" where the docs give GPU figures for
      the flag, or a help that says it was measured where its rows say only "not measured";
    - the values: a number right after the flag, "default X" in its parenthesis, or an a|b|c list
      against the flag's default and its enum's values (a default of None: the docs say what it
      stands for)."""
    out = []
    for name in sorted(fv):
        flag, help_ = fv[name], fv[name].help or ""
        rows = [(doc, r) for doc, text in docs.items()
                for r in re.findall(r"^\| `--%s`.*\|$" % re.escape(name), text, re.M)]
        if "not measured on a GPU" in help_:
            out += ["%s: --%s: help says not measured on a GPU, the docs' row gives GPU figures: %s"
                    % (doc, name, r[:120]) for doc, r in rows if GPU_FIGURE.search(r)]
        elif re.search(r"measured on (?:a|one) GPU", help_):
            out += ["%s: --%s: help says measured on a GPU, the docs' row says only not measured: %s"
                    % (doc, name, r[:120]) for doc, r in rows
                    if "not measured on a GPU" in r and not GPU_FIGURE.search(r)]
        for doc, text in docs.items():
            for m in re.finditer(r"`--%s`((?: [\w.-]+(?:\|[\w.-]+)+)?)(?: \(((?:[^()]|\([^()]*\))*)\))?"
                                 % re.escape(name), text):
                listed, paren = m.group(1).strip(), " ".join((m.group(2) or "").split())
                choices = listed or (re.match(r"^([\w.-]+(?:\|[\w.-]+)+)\b", paren) or [None, ""])[1]
                enum = getattr(flag.parser, "enum_values", None)
                if choices and enum is not None and choices.split("|") != list(enum):
                    out.append("%s: --%s: the docs list %s, the flag takes %s" % (doc, name, choices, "|".join(enum)))
                number = re.match(r"^(-?\d[\d,]*(?:\.\d+)?)(?:[);,]|$)", paren)
                if number and flag.default is not None and not isinstance(flag.default, (bool, str)) and \
                        float(number.group(1).replace(",", "")) != float(flag.default):
                    out.append("%s: --%s: the docs say (%s), the default is %s" % (doc, name, number.group(1),
                                                                                    flag.default))
                said = re.search(r"\bdefault:? `?([\w.-]+)`?", paren)
                if said and flag.default is not None and said.group(1) != str(flag.default).lower() and \
                        said.group(1) != str(flag.default):
                    out.append("%s: --%s: the docs say default %s, the default is %s" % (doc, name, said.group(1),
                                                                                        flag.default))
    return out


def test_the_trainers_flag_help_and_the_docs_agree():
    """Issue 47 (11): a lever's help said "not measured on a GPU" while docs/training.md gave its
    GPU figures. Every trainer flag's help against the docs' statements of it (flag_doc_problems):
    the GPU status, the defaults and the choices; a disagreement of each kind is reported."""
    from mlperf_bert.trainer import trainer_flags
    docs = {d: open(os.path.join(ROOT, d), encoding="utf-8").read() for d in ("docs/training.md", "docs/running.md")}
    fv = trainer_flags.define_flags()
    assert not flag_doc_problems(fv, docs), "\n".join(flag_doc_problems(fv, docs))
    checked = [n for n in fv if re.search(r"`--%s`(?: [\w|.-]+)? \(" % n, docs["docs/training.md"])]
    assert len(checked) >= 10, checked
    # --fused_qkv's help says it was measured (at 2 layers): its row with figures agrees
    wrong = {"x.md": "| `--fused_qkv` | one GEMM | 1.12x: 2000 rows/s on the H100 |\n"
                     "- `--log_frequency` (25), `--check_data` (none|headers, default full), "
                     "`--grad_exchange_dtype` fp32|fp16 (default fp32).\n"
                     "| `--grad_exchange_dtype` | bf16 | 1.2x on the H100 |\n"}
    assert flag_doc_problems(fv, wrong) == [
        "x.md: --check_data: the docs list none|headers, the flag takes none|headers|full",
        "x.md: --check_data: the docs say default full, the default is headers",
        "x.md: --grad_exchange_dtype: help says not measured on a GPU, the docs' row gives GPU figures: "
        "| `--grad_exchange_dtype` | bf16 | 1.2x on the H100 |",
        "x.md: --grad_exchange_dtype: the docs list fp32|fp16, the flag takes fp32|bf16",
        "x.md: --log_frequency: the docs say (25), the default is 50"]


def test_the_readme_gives_the_time_of_make_submission_demo():
    """Issue 47 (16): the README named `make submission-demo` without its time (about 10 minutes).
    Its sentence gives the time measured, the load it was measured at, and the runs the Makefile's
    target makes."""
    readme = re.sub(r"\s+", " ", open(os.path.join(ROOT, "README.md"), encoding="utf-8").read())
    said = re.search(r"`make submission-demo` does all of it on the CPU demo: (\d+) runs, package and score in "
                     r"(\d+) min (\d+) s here \([^)]*load average [\d.]+ to [\d.]+[^)]*\)", readme)
    assert said, "README: make submission-demo's time and load"
    make = open(os.path.join(ROOT, "Makefile"), encoding="utf-8").read()
    target = make[make.index("\nsubmission-demo:"):]
    assert "--runs=%s " % said.group(1) in target.split("\n\n")[0], said.group(0)


def _number_word(word):
    """20 for "twenty", 26 for "twenty-six" (the docs' counts of published logs)."""
    units = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen " \
            "fifteen sixteen seventeen eighteen nineteen".split()
    tens, _, unit = word.lower().partition("-")
    if tens in units:
        return units.index(tens)
    return {"twenty": 20, "thirty": 30, "forty": 40}[tens] + (units.index(unit) if unit else 0)


def test_the_counts_of_published_logs_the_docs_give_are_the_tests_logs():
    """The README said "twenty-five published MLPerf logs" and compliance.md "Five logs of earlier
    rounds" once test_compliance judged a sixth older log (tinycorp's v4.1 tinybox_green): each count
    is the logs in tests/data/mlperf_logs/ (the older ones in older/)."""
    logs = glob.glob(os.path.join(ROOT, "tests", "data", "mlperf_logs", "**", "*.gz"), recursive=True)
    older = [p for p in logs if os.sep + "older" + os.sep in p]
    readme = re.sub(r"\s+", " ", open(os.path.join(ROOT, "README.md"), encoding="utf-8").read())
    compliance = re.sub(r"\s+", " ", open(os.path.join(ROOT, "docs", "compliance.md"), encoding="utf-8").read())
    said = [(re.search(r"([a-z-]+) published MLPerf logs get the verdicts", readme), len(logs)),
            (re.search(r"checker on ([a-z-]+) closed-division logs published", compliance), len(logs) - len(older)),
            (re.search(r"([A-Za-z-]+) logs of earlier rounds", compliance), len(older))]
    for m, want in said:
        assert m and _number_word(m.group(1)) == want, (m and m.group(0), want)

if __name__ == "__main__":
    for p in problems(doc_commands()):
        print(p)


def test_the_demo_rows_train_command_evaluates_at_0_as_the_row_says():
    """A new user's run: running.md's demo table gave the training as `train_model.sh
    --preset=demo_cpu` with an "online eval (at 0 and every 1,600 samples)"; that command, run as
    written, logs no eval at 0: the demo adds `--eval_at_start` to the preset. The row's command
    names every flag behind what the row says."""
    text = open(os.path.join(ROOT, "docs", "running.md"), encoding="utf-8").read()
    row = next(l for l in text.splitlines() if l.startswith("| train |"))
    command = re.search(r"`(train_model\.sh [^`]*)`", row).group(1).split()
    preset = open(os.path.join(ROOT, "configs", "presets", "demo_cpu.sh"), encoding="utf-8").read()
    demo = inspect.getsource(importlib.import_module("mlperf_bert.demo"))
    assert "at 0" in row and '"--eval_at_start"' in demo and "--eval_at_start" not in preset
    assert "--eval_at_start" in command, row


# Paths the docs name that are not this repository's: a submission package's layout (the
# mlcommons/training_results_vX.Y repositories, `check-log results/SYSTEM/bert/`), not our results/.
OTHERS_PATHS = {"results/*/bert"}
PATH_PLACEHOLDERS = ("NAME", "SYSTEM", "ORG", "RUN", "DIR")
# What the docs and the help texts a user reads name as files of the repository.
PATH_TEXTS = DOCS + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "examples", "*"))
                           + glob.glob(os.path.join(ROOT, "bench", "*.py"))) + list(LAUNCHERS)
_REPO_PATH = re.compile(r"(?<![\w/.$~-])((?:trainer|dataset|harness)/\w+\.(?:py|c)"
                        r"|(?:bench|configs|mlperf_bert|tests|examples|docs|results|\.ci)/[\w./*?\[\]{},$-]*[\w*}])")


def _path_globs(path):
    """The globs a path as the docs write it stands for: ``{a,b}`` each, a shell variable or a
    placeholder (``NAME``, ``SYSTEM``) any name."""
    m = re.search(r"\{([^{}]*,[^{}]*)\}", path)
    if m:
        return [g for alt in m.group(1).split(",") for g in _path_globs(path[:m.start()] + alt + path[m.end():])]
    path = re.sub(r"\$\{?\w+\}?", "*", path)
    return [re.sub(r"\b(%s)\b" % "|".join(PATH_PLACEHOLDERS), "*", path)]


def path_problems(doc, text):
    """Each repository path ``text`` names (``bench/X.py``, ``configs/...``, ``trainer/X.py``) that
    matches no file: as written, as the stem of files (``docs/gpu/RUN`` for RUN.md and RUN.json) or
    gzipped (tests/data keeps its inputs as ``NAME.gz``)."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        for m in _REPO_PATH.finditer(line):
            path = m.group(1)
            if path.split("/")[0] in ("trainer", "dataset", "harness"):
                path = "mlperf_bert/" + path
            pats = _path_globs(path)
            if set(pats) <= OTHERS_PATHS:
                continue
            if not any(glob.glob(os.path.join(ROOT, p + tail)) for p in pats for tail in ("", ".*")):
                out.append("%s:%d: %s: no such file in the repository" % (doc, n, m.group(1)))
    return out


def test_every_repository_path_the_docs_and_helps_name_exists():
    """A sweep of the docs: bench/loader_throughput.py's --help said its records are made from
    `tests/data/golden/input/part-00000`, a file no checkout has (the input is
    part-00000-of-00004). Every path of the repository that README.md, docs/*.md, the examples,
    the benches (their --help is their docstring) and the launchers name is a file or folder of it."""
    seen, bad = 0, []
    for doc in PATH_TEXTS:
        text = open(os.path.join(ROOT, doc), encoding="utf-8").read()
        seen += len(_REPO_PATH.findall(text))
        bad += path_problems(doc, text)
    assert seen > 200 and not bad, "\n".join(bad)


def test_a_path_that_is_not_in_the_repository_is_reported():
    text = ("`bench/gpu_check.py`, `bench/no_such.py`, trainer/cpu_memory.py, trainer/gone.py,\n"
            "configs/presets/NAME.sh, docs/gpu/2026-11-27-h100, tests/data/golden/input/part-0000{0,1}-of-00004,\n"
            "tests/data/golden/input/part-0000$i-of-00004.gz, tests/data/golden/input/part-00000, "
            "results/SYSTEM/bert, results/*/bert, configs/presets/NAME.py\n")
    assert [p.split(": ", 2)[1] for p in path_problems("x.md", text)] == [
        "bench/no_such.py", "trainer/gone.py", "tests/data/golden/input/part-00000", "configs/presets/NAME.py"]


def test_a_pending_flag_that_is_a_flag_now_is_reported(tmp_path, monkeypatch):
    """PENDING_FLAGS lets the docs name a flag another branch is adding; `bench/gpu_check.py
    --budget_s` stayed there after it was merged, its check skipped: an entry whose flag the
    command accepts is reported, one it does not is still skipped."""
    monkeypatch.setattr(sys.modules[__name__], "PENDING_FLAGS",
                        {("bench/gpu_check.py", "budget_s"), ("bench/gpu_check.py", "not_yet_merged")})
    doc = tmp_path / "pending.md"
    doc.write_text("```sh\n.venv/bin/python bench/gpu_check.py --budget_s=420 --not_yet_merged=1\n```\n")
    assert [p.split(": ", 1)[1] for p in problems(doc_commands([str(doc)]))] == [
        "bench/gpu_check.py --budget_s is a flag now: remove it from PENDING_FLAGS"]


def shutdown_timeout_problems(doc, text, default):
    """Each paragraph of ``text`` that gives a default of TORCH_ELASTIC_SHUTDOWN_TIMEOUT but not
    the torchrun wrapper's, ``default`` seconds (torchrun's own 30 is what bare torchrun gives)."""
    return ["%s: %s..." % (doc, para.strip()[:80]) for para in re.split(r"\n\s*\n", text)
            if "TORCH_ELASTIC_SHUTDOWN_TIMEOUT" in para and "default" in para
            and not re.search(r"(?<![\d.])%s(?![\d.])" % default, para)]


def test_the_docs_give_the_wrappers_shutdown_timeout():
    """A sweep of the docs: training.md and bench/gpu_presets.py's --help said of
    TORCH_ELASTIC_SHUTDOWN_TIMEOUT "its default is 30 s" (bare torchrun's), while every run
    through the torchrun wrapper (train_model.sh, start_training.sh) gets 300 s unless it is set."""
    from mlperf_bert.trainer import launch
    default = launch.SHUTDOWN_TIMEOUT
    assert "[%s]" % default in module_help("torchrun")
    bad, seen = [], 0
    for doc in PATH_TEXTS:
        text = open(os.path.join(ROOT, doc), encoding="utf-8").read()
        seen += text.count("TORCH_ELASTIC_SHUTDOWN_TIMEOUT")
        bad += shutdown_timeout_problems(doc, text, default)
    assert seen > 5 and not bad, "\n".join(bad)
    assert shutdown_timeout_problems("x.md", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT (its default is 30 s)\n\n"
                                     "TORCH_ELASTIC_SHUTDOWN_TIMEOUT seconds (300 unless set; torchrun's own default "
                                     "is 30)\n", default) == ["x.md: TORCH_ELASTIC_SHUTDOWN_TIMEOUT (its default is 30 s)..."]


def test_no_help_gives_a_default_of_this_machine(monkeypatch):
    """A sweep of the docs: `pack --help` printed `--num_workers ... (default: '2')`, this machine's
    core count, where the docs and every other command say "all cores". Each command's help is the
    same on a 1-core and a 64-core machine."""
    def helps(cores):
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
        monkeypatch.setattr(os, "cpu_count", lambda: cores)
        return {name: module_help.__wrapped__(name) for name in COMMANDS if name != "torchrun"}  # (uncached)
    one, many = helps(1), helps(64)
    assert len(one) > 10 and [n for n in one if one[n] != many[n]] == []
