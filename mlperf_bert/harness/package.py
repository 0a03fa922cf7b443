"""``package --org=ORG --system=NAME --runs=DIR,... --output=DIR --system_json=FILE``: an MLPerf
submission package.

Lays out ``ORG/results/NAME/bert/result_N.txt`` (the runs' MLPerf logs, in order),
``ORG/systems/NAME.json`` (the submitter's system description, from ``--system_json`` and
``--system_field``, checked; nothing is read from the machine that runs ``package``) and the
implementation under ``ORG/benchmarks/bert/implementations/NAME/``: every file that MANIFEST.txt
lists (this repository's ``git ls-files``, kept equal to it by a test; git is not needed, so a
copy without ``.git``, such as the container image, packages the same files), tests/data left out.
Every log must name the package's submitter, system, division and status. The package is built
in a hidden temporary folder beside ORG/ and moved into place when complete, so a ``package``
that was killed leaves nothing its rerun trips on. ``score`` then checks it with the official tools.
"""
import glob
import json
import os
import platform
import re
import shutil

from mlperf_bert import flags
from mlperf_bert.errors import UserError
from mlperf_bert.fileio import atomic_open, pid_alive
from mlperf_bert.harness.compliance import SYSTEM_STATUSES, division_of, identity_problems, read_log

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MANIFEST = "MANIFEST.txt"  # `git ls-files` of the implementation (tests/test_score.py keeps it equal)
NOT_PACKAGED = ("tests/data/",)  # third-party artefacts the tests read (NVIDIA's package among them)
# The fields mlperf_logging's system_desc_checker requires (training), in its order.
SYSTEM_FIELDS = (
    "submitter", "division", "status", "system_name", "number_of_nodes", "host_processors_per_node",
    "host_processor_model_name", "host_processor_core_count", "host_processor_vcpu_count",
    "host_processor_frequency", "host_processor_caches", "host_processor_interconnect",
    "host_memory_capacity", "host_storage_type", "host_storage_capacity", "host_networking",
    "host_networking_topology", "host_memory_configuration", "accelerators_per_node",
    "accelerator_model_name", "accelerator_host_interconnect", "accelerator_frequency",
    "accelerator_on-chip_memories", "accelerator_memory_configuration", "accelerator_memory_capacity",
    "accelerator_interconnect", "accelerator_interconnect_topology", "cooling", "hw_notes", "framework",
    "other_software_stack", "operating_system", "sw_notes",
)
# The fields package will not leave empty: the results table's columns (the result summarizer's)
# and the identity the logs are checked against. Published packages leave others empty.
NEEDED_VALUES = ("submitter", "division", "status", "system_name", "number_of_nodes",
                 "host_processors_per_node", "host_processor_model_name", "host_processor_core_count",
                 "accelerators_per_node", "accelerator_model_name", "framework", "operating_system")


def find_logs(specs):
    """The run logs named by ``specs`` (files; directories with result_*.txt, mlperf.log or run_*/)."""
    logs = []
    for spec in specs:
        if os.path.isfile(spec):
            logs.append(spec)
            continue
        if not os.path.isdir(spec):
            raise UserError("--runs: %s does not exist" % spec)
        found = (sorted(glob.glob(os.path.join(spec, "result_*.txt")), key=_run_number)
                 or ([os.path.join(spec, "mlperf.log")] if os.path.isfile(os.path.join(spec, "mlperf.log")) else [])
                 or sorted(glob.glob(os.path.join(spec, "run_*", "mlperf.log")), key=_run_number))
        if not found:
            raise UserError("--runs: %s holds no result_*.txt, mlperf.log or run_*/mlperf.log" % spec)
        logs += found
    return logs


def _run_number(path):
    digits = "".join(c for c in os.path.basename(path.rstrip("/")) if c.isdigit()) or \
        "".join(c for c in os.path.basename(os.path.dirname(path)) if c.isdigit())
    return int(digits or 0)


# ---- the system description: the submitter's, checked

def load_system_json(path):
    """The JSON object in ``path``; a UserError naming the file when it is not one."""
    try:
        with open(path, encoding="utf-8") as f:
            desc = json.load(f)
    except OSError as e:
        raise UserError("cannot read systems JSON %s: %s" % (path, e.strerror))
    except ValueError as e:
        raise UserError("systems JSON %s is not JSON (%s): fix the file" % (path, str(e).splitlines()[0]))
    if not isinstance(desc, dict):
        raise UserError("systems JSON %s holds a %s, not an object of fields" % (path, type(desc).__name__))
    return desc


def system_json_problems(desc, name):
    """What the official system-description checker (training 5.0.0) rejects in ``desc``: missing
    fields, a status it does not know. One line each, naming ``name``."""
    problems = []
    missing = [k for k in SYSTEM_FIELDS if k not in desc]
    if missing:
        problems.append("%s lacks %d field%s the official checker requires: %s" % (
            name, len(missing), "s" if len(missing) > 1 else "", ", ".join(missing)))
    if "status" in desc and desc["status"] not in SYSTEM_STATUSES:
        problems.append("%s: status %r is not one of %s" % (name, desc["status"],
                                                           ", ".join(repr(s) for s in SYSTEM_STATUSES)))
    return problems


def describe_system(org, system, division, system_json=None, fields=(), status=None, nodes=None):
    """The systems JSON: ``system_json``'s fields, then ``fields`` ("KEY=VALUE"), ``--status`` and
    ``--nodes``; submitter and division are the package's. (the dict, [fields left empty])."""
    if not system_json and not fields:
        raise UserError("package needs the system the runs ran on: --system_json=FILE, a JSON object of the"
                        " fields --help lists (or --system_field=KEY=VALUE each); nothing is read from the"
                        " machine that runs package")
    desc = load_system_json(system_json) if system_json else {}
    given = dict(desc)
    for item in fields:
        key, eq, value = item.partition("=")
        if not eq or key not in SYSTEM_FIELDS:
            raise UserError("--system_field=%s: give KEY=VALUE with KEY one of the systems JSON fields (see"
                            " --help)" % item)
        given[key] = value
    for key, value in (("status", status), ("number_of_nodes", None if nodes is None else str(nodes))):
        if value is None:
            continue
        if key in given and str(given[key]) != value and given[key] != "":
            raise UserError("--%s=%s but %s says %s=%r: give it once" % (
                "status" if key == "status" else "nodes", value, system_json or "--system_field", key, given[key]))
        given[key] = value
    for key, value in (("submitter", org), ("division", division)):
        if given.get(key, "") not in ("", value):
            raise UserError("%s says %s=%r, but the package is %s: fix the file (the runs' logs and --org decide)"
                            % (system_json or "--system_field", key, given[key], value))
        given[key] = value
    if given.get("status") not in SYSTEM_STATUSES:
        raise UserError("the system's status is %s: give --status=%r (or status in --system_json), one of %s" % (
            "not given" if given.get("status") in (None, "") else repr(given["status"]),
            "Available on-premise", ", ".join(repr(s) for s in SYSTEM_STATUSES)))
    empty = [k for k in NEEDED_VALUES if str(given.get(k, "")).strip() == ""]
    if empty:
        raise UserError("the systems JSON of %s needs %s: give them in --system_json=FILE (or --system_field="
                        "KEY=VALUE); --help lists every field" % (system, ", ".join(empty)))
    extra = [k for k in given if k not in SYSTEM_FIELDS]
    out = {k: given.get(k, "") for k in SYSTEM_FIELDS}
    out.update((k, given[k]) for k in extra)  # fields of the submitter's own (NVIDIA's framework_name)
    return out, [k for k in SYSTEM_FIELDS if out[k] == "" and k not in ("hw_notes", "sw_notes")]


def this_machine():
    """Fields of the machine this runs on, for a description of *this* machine (the CPU demo,
    whose runs ran here); ``package`` never uses it."""
    import torch
    model, sockets, cores = _cpu()
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    from mlperf_bert import __version__
    return {
        "host_processors_per_node": sockets, "host_processor_model_name": model,
        "host_processor_core_count": cores, "host_processor_vcpu_count": str(os.cpu_count() or ""),
        "host_memory_capacity": _memory(), "accelerators_per_node": str(gpus),
        "accelerator_model_name": torch.cuda.get_device_name(0) if gpus else "none (CPU)",
        "accelerator_memory_capacity": "%d MiB" % (torch.cuda.get_device_properties(0).total_memory >> 20)
        if gpus else "",
        "framework": "PyTorch %s" % torch.__version__,
        "other_software_stack": {"python": platform.python_version(), "torch": torch.__version__,
                                 "cuda": torch.version.cuda or "", "mlperf_bert": __version__},
        "operating_system": _os_name(),
    }


def _cpu():
    model, cores = platform.processor() or "", ""
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read()
        names = [l.split(":", 1)[1].strip() for l in info.splitlines() if l.startswith("model name")]
        model = names[0] if names else model
        sockets = {l.split(":", 1)[1].strip() for l in info.splitlines() if l.startswith("physical id")}
        per = [l.split(":", 1)[1].strip() for l in info.splitlines() if l.startswith("cpu cores")]
        cores = per[0] if per else ""
        return model or "unknown", str(len(sockets) or 1), cores or str(os.cpu_count() or "")
    except OSError:
        return model or "unknown", "1", cores or str(os.cpu_count() or "")


def _memory():
    try:
        with open("/proc/meminfo") as f:
            kib = int(next(l.split()[1] for l in f if l.startswith("MemTotal")))
        return "%.0f GB" % (kib / 1024 ** 2)
    except (OSError, StopIteration, ValueError):
        return ""


def _os_name():
    try:
        with open("/etc/os-release") as f:
            return next(l.split("=", 1)[1].strip().strip('"') for l in f if l.startswith("PRETTY_NAME="))
    except (OSError, StopIteration):
        return platform.platform()


# ---- the implementation: the files MANIFEST.txt lists

def source_files(root=ROOT):
    """The implementation's files (MANIFEST.txt, tests/data left out); a UserError when the list or
    a file on it is missing (a partial copy would be a package whose implementation cannot run)."""
    path = os.path.join(root, MANIFEST)
    try:
        with open(path, encoding="utf-8") as f:
            files = [l for l in f.read().splitlines() if l]
    except OSError:
        raise UserError("%s is missing: package copies the implementation from that list, so run it from a"
                        " clone of this repository or from its image (a pip-installed mlperf_bert has no"
                        " scripts or configs to package)" % path)
    files = [f for f in files if not f.startswith(NOT_PACKAGED)]
    missing = [f for f in files if not os.path.isfile(os.path.join(root, f))]
    if missing:
        raise UserError("%d file%s of %s %s missing from %s (%s%s): the implementation would be incomplete;"
                        " restore them (git checkout), or remake the list with `make manifest` if they were"
                        " removed on purpose" % (len(missing), "s" if len(missing) > 1 else "", MANIFEST,
                                                 "are" if len(missing) > 1 else "is", root,
                                                 ", ".join(missing[:5]), ", ..." if len(missing) > 5 else ""))
    return files


def copy_source(dest, root=ROOT):
    """Copy the implementation's files to ``dest``; return how many."""
    files = source_files(root)
    for f in files:
        os.makedirs(os.path.dirname(os.path.join(dest, f)) or dest, exist_ok=True)
        shutil.copy2(os.path.join(root, f), os.path.join(dest, f))
    return len(files)


# ---- the package

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_TMP = re.compile(r"^\.(?P<org>.+)\.tmp-(?P<pid>\d+)$")


def check_name(flag, value):
    """``--org``/``--system`` name directories and files of the package: one path component."""
    if not value or not _NAME.match(value):
        raise UserError("--%s=%s: give a name of letters, digits, '.', '_' and '-' (it names a directory of"
                        " the package, so no '/' and no leading '.')" % (flag, value))


def read_runs(logs):
    """The records of each run log; a log that did not end (no run_stop: still running, killed or
    cut off) is refused, naming it."""
    runs = []
    for p in logs:
        records = read_log(p)
        if not any(r.key == "run_stop" for r in records):
            raise UserError("%s has no run_stop line: the run is still going, was stopped, or the log was cut"
                            " off; a package holds finished runs only (finish or rerun it, or leave it out of"
                            " --runs)" % p)
        runs.append(records)
    return runs


def _pieces(system):
    """The parts of ORG/ that are one system's, the results last (they make the package whole)."""
    return [os.path.join("benchmarks", "bert", "implementations", system),
            os.path.join("systems", system + ".json"), os.path.join("results", system)]


def remove_stale_builds(output, org):
    """Remove the temporary builds of ``org`` in ``output`` whose ``package`` process is gone."""
    removed = []
    for name in os.listdir(output) if os.path.isdir(output) else ():
        m = _TMP.match(name)
        if m and m.group("org") == org and int(m.group("pid")) != os.getpid() and not pid_alive(int(m.group("pid"))):
            shutil.rmtree(os.path.join(output, name), ignore_errors=True)
            removed.append(name)
    return removed


def _incomplete_marker(top, system):
    return os.path.join(top, ".package-%s.incomplete" % system)


def _check_free(top, system):
    """Refuse when ``top`` (ORG/) already holds this system; finish off a move that was killed."""
    marker = _incomplete_marker(top, system)
    if os.path.exists(marker):  # our own move into an existing ORG/ was killed half-way: undo it
        for piece in _pieces(system):
            path = os.path.join(top, piece)
            if os.path.isdir(path):
                shutil.rmtree(path)
            elif os.path.lexists(path):
                os.remove(path)
        os.remove(marker)
    held = [p for p in _pieces(system) if os.path.lexists(os.path.join(top, p))]
    if held:
        raise UserError("%s already holds a package of %s (%s): remove %s or choose another --output"
                        % (top, system, held[-1], ", ".join(os.path.join(top, p) for p in held)))


def _move_into_place(build, top, system):
    """Move the finished build (a whole ORG/) to ``top``: one rename when ORG/ is new, else its
    pieces one by one under a marker that a rerun reads as "incomplete, ours"."""
    if not os.path.exists(top):
        os.rename(build, top)
        return
    marker = _incomplete_marker(top, system)
    with open(marker, "w"):
        pass
    for piece in _pieces(system):
        os.makedirs(os.path.dirname(os.path.join(top, piece)), exist_ok=True)
        os.rename(os.path.join(build, piece), os.path.join(top, piece))
    os.remove(marker)
    shutil.rmtree(build)


def make_package(org, system, run_specs, output, system_json=None, fields=(), status=None, nodes=None,
                 platform_=None, root=ROOT):
    """Lay the package out; return (logs, fields left empty, source files)."""
    check_name("org", org)
    check_name("system", system)
    logs = find_logs(run_specs)
    runs = read_runs(logs)
    divisions = {division_of(records) for records in runs}
    if len(divisions) != 1 or None in divisions:
        raise UserError("the runs' logs name divisions %s: a package holds runs of one division"
                        % sorted(str(d) for d in divisions))
    division = divisions.pop()
    desc, empty = describe_system(org, system, division, system_json, fields, status, nodes)
    platforms = [platform_] if platform_ else [system] + ([desc["system_name"]] if desc["system_name"] != system else [])
    problems = identity_problems(list(zip(logs, runs)), org, division, desc["status"], platforms)
    if problems:
        raise UserError("the runs do not belong in this package: %s%s" % (
            problems[0], " (and %d more: %s)" % (len(problems) - 1, "; ".join(problems[1:])) if problems[1:] else ""))
    top = os.path.join(output, org)
    os.makedirs(output, exist_ok=True)
    remove_stale_builds(output, org)
    _check_free(top, system)
    build = os.path.join(output, ".%s.tmp-%d" % (org, os.getpid()))
    shutil.rmtree(build, ignore_errors=True)
    try:
        bert = os.path.join(build, "results", system, "bert")
        os.makedirs(bert)
        for i, log in enumerate(logs):
            shutil.copyfile(log, os.path.join(bert, "result_%d.txt" % i))
        os.makedirs(os.path.join(build, "systems"))
        with atomic_open(os.path.join(build, "systems", system + ".json"), "w", encoding="utf-8") as f:
            json.dump(desc, f, indent=4)
            f.write("\n")
        n = copy_source(os.path.join(build, "benchmarks", "bert", "implementations", system), root)
        _move_into_place(build, top, system)
    except BaseException:
        shutil.rmtree(build, ignore_errors=True)
        raise
    return logs, empty, n


def main(argv):
    fv = flags.FlagValues()
    flags.DEFINE_string("org", None, "submitting organization (ORG/ of the package; every log's submission_org)",
                        flag_values=fv)
    flags.DEFINE_string("system", None, "system name (results/<system>, systems/<system>.json); every log's"
                        " submission_platform must be it or the systems JSON's system_name, unless --platform",
                        flag_values=fv)
    flags.DEFINE_string("platform", None, "the submission_platform every log must name, when it is neither"
                        " --system nor the system_name (e.g. NVIDIA's '1xNVIDIA HGX B200' for 'Nyx (1x NVIDIA"
                        " DGX B200)')", flag_values=fv)
    flags.DEFINE_list("runs", None, "run logs or directories (result_*.txt, mlperf.log, run_*/)", flag_values=fv)
    flags.DEFINE_string("output", None, "package directory (ORG/ goes inside; made complete or not at all)",
                        flag_values=fv)
    flags.DEFINE_string(
        "system_json", None, "the system description, a JSON object written by you (nothing is read from the"
        " machine that runs package). The official checker requires every field: %s. Those package will not"
        " leave empty: %s; submitter and division come from --org and the logs." % (
            ", ".join(SYSTEM_FIELDS), ", ".join(NEEDED_VALUES)), flag_values=fv)
    flags.DEFINE_multi_string("system_field", [], "KEY=VALUE: a field of the systems JSON (repeat the flag;"
                              " fills or replaces --system_json's)", flag_values=fv)
    flags.DEFINE_enum("status", None, list(SYSTEM_STATUSES), "the system's availability (the systems JSON's"
                      " status); every log's submission_status must match it: %s" % "; ".join(
                          "%s: %s" % (k, " or ".join(v)) for k, v in SYSTEM_STATUSES.items()), flag_values=fv)
    flags.DEFINE_integer("nodes", None, "number of nodes the runs used (the systems JSON's number_of_nodes)",
                         lower_bound=1, flag_values=fv)
    flags.parse(fv, argv, required=["org", "system", "runs", "output"], positional=False)
    logs, empty, n = make_package(fv.org, fv.system, fv.runs, fv.output, fv.system_json, fv.system_field,
                                  fv.status, fv.nodes, fv.platform)
    print("package %s: %d runs in %s/results/%s/bert, %d source files, systems/%s.json"
          % (fv.output, len(logs), fv.org, fv.system, n, fv.system))
    if empty:
        print("left empty in systems/%s.json (allowed; published packages leave some empty): %s"
              % (fv.system, ", ".join(empty)))
    return 0
