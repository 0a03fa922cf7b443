"""``package --org=ORG --system=NAME --runs=DIR,... --output=DIR``: an MLPerf submission package.

Lays out ``ORG/results/NAME/bert/result_N.txt`` (the runs' MLPerf logs, in order),
``ORG/systems/NAME.json`` (every field the system-description checker requires, read from this
machine where it can be; the rest left empty and listed for the submitter to fill) and this
project's source under ``ORG/benchmarks/bert/implementations/NAME/``. ``score`` then checks it
with the official tools.
"""
import glob
import json
import os
import platform
import re
import shutil
import subprocess

from mlperf_bert import flags
from mlperf_bert.errors import UserError
from mlperf_bert.fileio import atomic_open
from mlperf_bert.harness.compliance import division_of, read_log

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
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
        return model, str(len(sockets) or 1), cores
    except OSError:
        return model, "", cores


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


def system_description(org, system, division, status, nodes):
    """(the system JSON as a dict, [fields left for the submitter to fill])."""
    import torch
    model, sockets, cores = _cpu()
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    desc = dict.fromkeys(SYSTEM_FIELDS, "")
    desc.update({
        "submitter": org, "division": division, "status": status, "system_name": system,
        "number_of_nodes": str(nodes), "host_processors_per_node": sockets,
        "host_processor_model_name": model, "host_processor_core_count": cores,
        "host_processor_vcpu_count": str(os.cpu_count() or ""), "host_memory_capacity": _memory(),
        "accelerators_per_node": str(gpus),
        "accelerator_model_name": torch.cuda.get_device_name(0) if gpus else "none (CPU)",
        "accelerator_memory_capacity": "%d MiB" % (torch.cuda.get_device_properties(0).total_memory >> 20)
        if gpus else "",
        "framework": "PyTorch %s" % torch.__version__,
        "other_software_stack": {"python": platform.python_version(), "torch": torch.__version__,
                                 "cuda": torch.version.cuda or "", "mlperf_bert": _version()},
        "operating_system": _os_name(),
    })
    todo = [k for k, v in desc.items() if v == "" and k not in ("hw_notes", "sw_notes")]
    return desc, todo


def _version():
    from mlperf_bert import __version__
    try:
        rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        rev = ""
    return __version__ + ("+" + rev if rev else "")


def copy_source(dest):
    """This project's tracked files (git), else its package, scripts and configs."""
    try:
        files = subprocess.run(["git", "-C", ROOT, "ls-files"], capture_output=True, text=True,
                               timeout=30, check=True).stdout.split("\n")
    except (OSError, subprocess.SubprocessError):
        files = []
    files = [f for f in files if f and not f.startswith("tests/data/") and os.path.isfile(os.path.join(ROOT, f))]
    if not files:
        files = [os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "mlperf_bert", "**", "*.py"),
                                                               recursive=True)]
        files += [f for f in os.listdir(ROOT) if f.endswith((".py", ".sh", ".txt", ".md", ".toml")) or f == "Dockerfile"]
    for f in files:
        os.makedirs(os.path.dirname(os.path.join(dest, f)) or dest, exist_ok=True)
        shutil.copy2(os.path.join(ROOT, f), os.path.join(dest, f))
    return len(files)


_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


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


def make_package(org, system, run_specs, output, status="Research, Development, or Internal (RDI)", nodes=1):
    """Lay the package out; return (logs, fields to fill by hand, source files, whether an existing
    systems/<system>.json was kept)."""
    check_name("org", org)
    check_name("system", system)
    logs = find_logs(run_specs)
    divisions = {division_of(records) for records in read_runs(logs)}
    if len(divisions) != 1 or None in divisions:
        raise UserError("the runs' logs name divisions %s: a package holds runs of one division"
                        % sorted(str(d) for d in divisions))
    division = divisions.pop()
    top = os.path.join(output, org)
    bert = os.path.join(top, "results", system, "bert")
    if os.path.exists(bert) and os.listdir(bert):
        raise UserError("%s already holds results: choose another --output" % bert)
    os.makedirs(bert, exist_ok=True)
    for i, log in enumerate(logs):
        with open(log, "rb") as f, atomic_open(os.path.join(bert, "result_%d.txt" % i), "wb") as out:
            shutil.copyfileobj(f, out)
    desc, todo = system_description(org, system, division, status, nodes)
    os.makedirs(os.path.join(top, "systems"), exist_ok=True)
    system_json = os.path.join(top, "systems", system + ".json")
    kept = os.path.exists(system_json)  # filled in by hand after an earlier run: never replaced
    if not kept:
        with atomic_open(system_json, "w", encoding="utf-8") as f:
            json.dump(desc, f, indent=4)
            f.write("\n")
    n = copy_source(os.path.join(top, "benchmarks", "bert", "implementations", system))
    return logs, todo, n, kept


def main(argv):
    fv = flags.FlagValues()
    flags.DEFINE_string("org", None, "submitting organization", flag_values=fv)
    flags.DEFINE_string("system", None, "system name (results/<system>, systems/<system>.json)", flag_values=fv)
    flags.DEFINE_list("runs", None, "run logs or directories (result_*.txt, mlperf.log, run_*/)", flag_values=fv)
    flags.DEFINE_string("output", None, "package directory to create (ORG/ goes inside)", flag_values=fv)
    flags.DEFINE_string("status", "Research, Development, or Internal (RDI)", "system availability", flag_values=fv)
    flags.DEFINE_integer("nodes", 1, "number of nodes", flag_values=fv)
    flags.parse(fv, argv, required=["org", "system", "runs", "output"], positional=False)
    logs, todo, n, kept = make_package(fv.org, fv.system, fv.runs, fv.output, fv.status, fv.nodes)
    print("package %s: %d runs in %s/results/%s/bert, %d source files, systems/%s.json"
          % (fv.output, len(logs), fv.org, fv.system, n, fv.system))
    if kept:
        print("kept the existing %s/systems/%s.json as it is (delete it to have it written from this machine)"
              % (fv.org, fv.system))
    elif todo:
        print("fill in by hand in systems/%s.json (not known on this machine): %s" % (fv.system, ", ".join(todo)))
    return 0
