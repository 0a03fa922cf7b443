"""``package --org=ORG --system=NAME --runs=DIR,... --output=DIR --system_json=FILE``: an MLPerf
submission package.

Lays out ``ORG/results/NAME/bert/result_N.txt`` (the runs' MLPerf logs, in order),
``ORG/systems/NAME.json`` (the submitter's system description, from ``--system_json`` and
``--system_field``, checked; nothing is read from the machine that runs ``package``;
``--system_template`` writes one to fill in) and the implementation under
``ORG/benchmarks/bert/implementations/IMPL/`` (``--implementation``, the framework's name, shared by
the systems of one organization): the files that MANIFEST.txt lists (this repository's ``git
ls-files``, kept equal to it by a test; git is not needed, so a copy without ``.git``, such as the
container image, packages the same files) but the tests (their data are third-party artefacts) and
the names MLCommons' repo checker refuses (``.ci/``, ``.gitignore``: a leading '.', a space), with a
MANIFEST.txt of what it holds, and ``launch_NAME.json``: how each run was launched (its trainer's
``run_finished.json``, its paths relative to named roots). ``ORG/mlperf_bert_package.json`` says
which implementation each system's runs need (``score`` fails a system whose implementation is
missing). Every log must name the package's submitter, system, division and status. ``--output`` is
locked for the whole build (one ``package`` at a time); the package is built in a hidden temporary
folder beside ORG/ and moved into place when complete, so a ``package`` that was killed leaves
nothing its rerun trips on. ``score`` then checks it with the official tools.
"""
import glob
import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys

from mlperf_bert import flags, locking
from mlperf_bert.errors import UserError
from mlperf_bert.fileio import (DERIVED_NAME_BYTES, atomic_open, comma_in_name, file_md5, host_memory, load_json,
                                mount_point, new_dirs_removed_on_error, open_input, pid_alive, read_lines,
                                refuse_long_name, special_kind, split_lines, write_json)
from mlperf_bert.harness.compliance import (RULESET, SYSTEM_STATUSES, division_of, identity_problems, not_converged,
                                            read_log, run_number)
from mlperf_bert.harness.run_state import logged_cache_clear

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MANIFEST = "MANIFEST.txt"  # `git ls-files` of the implementation (tests/test_score.py keeps it equal)
# The tests stay in the repository: their data (tests/data) are third-party artefacts (NVIDIA's
# package among them), and tests without their data would not run. The launch record names the commit.
NOT_PACKAGED = ("tests/",)
LAUNCH = "launch_%s.json"  # how each system's runs were launched, in the implementation (not in its MANIFEST.txt)
IMPLEMENTATION = "pytorch"  # the implementation folder: the framework's name, shared by an org's systems
MADE_BY = "mlperf_bert_package.json"  # ORG/: written by package; score expects each system's implementation
FINISHED = "run_finished.json"  # the trainer's record of a finished run (trainer/checkpoint.py)
REPO_FILE_LIMIT = 50 * 1024 * 1024  # bytes: the repo checker fails a larger file
STOPPED = "run_stopped.json"  # its record at run_stop, of a run killed before its end was written
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
# What each field means (package --system_template writes them into the file to fill in).
FIELD_MEANINGS = {
    "submitter": "the submitting organization, as the results table names it (package: --org)",
    "division": "closed or open (package: the logs' submission_division)",
    "status": "availability: 'Available on-premise', 'Available cloud', 'Research, Development, or Internal"
              " (RDI)' or 'Preview' (package: --status); the logs' submission_status must match it",
    "system_name": "the system's name in the results table, e.g. 'ACME 8x H100 SXM'",
    "number_of_nodes": "nodes the runs used, a number (package: --nodes)",
    "host_processors_per_node": "CPU sockets per node, a number",
    "host_processor_model_name": "CPU model, e.g. 'Intel(R) Xeon(R) Platinum 8480C'",
    "host_processor_core_count": "cores per CPU socket, a number",
    "host_processor_vcpu_count": "hardware threads per node (may be left empty)",
    "host_processor_frequency": "CPU base (or max) clock, e.g. '2000 MHz' (may be left empty)",
    "host_processor_caches": "CPU caches, e.g. 'L1d 48 KiB, L2 2 MiB, L3 105 MiB' (may be left empty)",
    "host_processor_interconnect": "link between the CPU sockets, e.g. 'UPI' (may be left empty)",
    "host_memory_capacity": "host memory per node, e.g. '2 TB' (may be left empty)",
    "host_storage_type": "storage the data were read from, e.g. 'NVMe SSD' (may be left empty)",
    "host_storage_capacity": "its capacity, e.g. '2x 3.84 TB' (may be left empty)",
    "host_networking": "the nodes' network, e.g. '8x 400 Gb/s InfiniBand' (may be left empty)",
    "host_networking_topology": "how the nodes are connected, e.g. 'fat tree' (may be left empty)",
    "host_memory_configuration": "DIMMs, e.g. '32x 64 GB DDR5-4800' (may be left empty)",
    "accelerators_per_node": "GPUs (or other accelerators) per node, a number; 0 for none",
    "accelerator_model_name": "accelerator model, e.g. 'NVIDIA H100-SXM5-80GB'",
    "accelerator_host_interconnect": "link between host and accelerators, e.g. 'PCIe 5.0 x16' (may be left"
                                     " empty)",
    "accelerator_frequency": "accelerator clock, e.g. '1980 MHz' (may be left empty)",
    "accelerator_on-chip_memories": "on-chip memories, e.g. 'L2 50 MB' (may be left empty)",
    "accelerator_memory_configuration": "accelerator memory kind, e.g. 'HBM3' (may be left empty)",
    "accelerator_memory_capacity": "memory per accelerator, e.g. '80 GB' (may be left empty)",
    "accelerator_interconnect": "link between the accelerators, e.g. '18x NVLink 4.0' (may be left empty)",
    "accelerator_interconnect_topology": "its topology, e.g. 'NVSwitch' (may be left empty)",
    "cooling": "air or liquid (may be left empty)",
    "hw_notes": "anything else about the hardware; the results table's notes column (may be left empty)",
    "framework": "the framework and its version, e.g. 'PyTorch 2.5.1'",
    "other_software_stack": "other software and versions: CUDA, NCCL, driver, Python (text or an object)",
    "operating_system": "the OS and its version, e.g. 'Ubuntu 22.04'",
    "sw_notes": "anything else about the software; the results table's notes column (may be left empty)",
}
TEMPLATE_MARK = "FILL IN: "  # a value --system_template wrote that was not replaced
# The fields read as text: the system-description checker joins these into the results table's row
# (a number ends it in a TypeError), and score compares division and status with the logs'.
TEXT_FIELDS = ("submitter", "system_name", "host_processor_model_name", "host_processor_core_count",
               "accelerator_model_name", "accelerators_per_node", "framework", "division", "status")
NOTES_FIELDS = ("hw_notes", "sw_notes")  # the result summarizer joins them, when not empty, as text
# The fields package will not leave empty: the results table's columns (the result summarizer's)
# and the identity the logs are checked against. Published packages leave others empty.
WHOLE_NUMBERS = ("number_of_nodes", "host_processors_per_node", "accelerators_per_node")
NEEDED_VALUES = ("submitter", "division", "status", "system_name", "number_of_nodes",
                 "host_processors_per_node", "host_processor_model_name", "host_processor_core_count",
                 "accelerators_per_node", "accelerator_model_name", "framework", "operating_system")


def find_logs(specs):
    """The run logs named by ``specs`` (files; directories with result_*.txt, mlperf.log or run_*/)."""
    logs = []
    for k, spec in enumerate(specs):
        if not spec:  # (a "" reads as the current folder to some calls, as nothing to others)
            raise UserError("--runs has an empty item (a ',' doubled, or at an end): give each run's log or folder"
                            " once, separated by ','")
        if os.path.isfile(spec):
            logs.append(spec)
            continue
        if not os.path.isdir(spec):
            kind = special_kind(spec)
            # (absl's list: split at ',' unless quoted. Its place among the pieces: an item before it, quoted, may
            # hold a ',' too; --runs='"x,y"',c said "c does not exist; x,y does ...: quote it")
            piece = len([p for p in ",".join(specs[:k]).split(",") if p.strip()])
            name = None if kind else comma_in_name(",".join(specs), piece)
            raise UserError("--runs: %s %s" % (spec, "is %s, not a run's log or folder" % kind if kind else
                                               "does not exist: give a run's log or folder" if name is None else
                                               "does not exist; %s does, but --runs is split at each ',' outside "
                                               "double quotes: quote it, --runs='\"%s\"'" % (name, name)))
        # (escaped: a folder named with a glob's characters, "runs [0]", is that folder, not a pattern)
        found = (sorted(glob.glob(os.path.join(glob.escape(spec), "result_*.txt")), key=_by_run)
                 or ([os.path.join(spec, "mlperf.log")] if os.path.isfile(os.path.join(spec, "mlperf.log")) else [])
                 or sorted(glob.glob(os.path.join(glob.escape(spec), "run_*", "mlperf.log")), key=_by_run))
        if not found:
            raise UserError("--runs: %s holds no result_*.txt, mlperf.log or run_*/mlperf.log" % spec)
        logs += found
    if not logs:
        raise UserError("--runs names no run: give the runs' logs or folders (result_*.txt, mlperf.log, run_*/),"
                        " separated by ','")
    return logs


def check_inputs(specs, logs, output):
    """Refuse a run log that ``specs`` reach twice (the same file: its run would be packaged twice, and
    the official package checker fails a package whose runs share a seed), and an ``output`` that is
    a folder of the runs (the package would go in among its inputs: check-log of that folder then
    reads every log twice)."""
    seen = {}
    for log in logs:
        key = os.path.realpath(log)
        if key in seen:
            raise UserError("--runs names the run log %s twice%s: give each run once" % (
                seen[key], "" if log == seen[key] else " (also as %s)" % log))
        seen[key] = log
    if output is None:
        return
    folders = {os.path.realpath(p) for p in specs if os.path.isdir(p)} | {os.path.dirname(k) for k in seen}
    if os.path.realpath(output) in folders:
        raise UserError("--output %s is a folder of the run logs (--runs): the package would be written among"
                        " its inputs; give another --output" % output)


def check_series_logs(logs):
    """Refuse a ``result_N.txt`` whose series folder holds ``run_N/mlperf.log`` with other bytes: the
    result is no longer its run's log (one edited or cut since the run finished, or the run's folder
    changed), yet run_N/'s launch record would vouch for it; start_training.sh refuses such a series too."""
    for log in logs:
        m = re.match(r"^result_(\d+)\.txt$", os.path.basename(log))
        own = os.path.join(os.path.dirname(log), "run_%s" % m.group(1), "mlperf.log") if m else None
        if own and os.path.isfile(own) and file_md5(own) != file_md5(log):
            raise UserError("%s is not the log of its run: %s, the log that run wrote, differs from it (one of them"
                            " was edited or cut since the run finished); put back the run's log as it was (or leave"
                            " the run out of --runs)" % (log, own))


def _by_run(path):
    # one folder's runs (result_N.txt, run_N/mlperf.log: compliance.in_run_order keeps folders apart, which
    # run_N/ are): by number, then name (result_01 and result_1 in a fixed order)
    return run_number(path), path


# ---- the system description: the submitter's, checked

def load_system_json(path, score=False):
    """The JSON object in ``path``; a UserError naming the file when it is not one, or when a field
    the official tools read as text (TEXT_FIELDS, NOTES_FIELDS) is not. package (not ``score``) takes
    text (a number too), other_software_stack an object, in every other field, and no null; ``score``
    leaves the fields the official tools do not read as text to them: they pass a null hw_notes and
    a list in a field they do not read, and fail a null node count."""
    def no_constant(name):  # NaN, Infinity: not JSON, and no value of a field
        raise ValueError("%s is not a JSON value" % name)
    try:
        with open_input(path, encoding="utf-8", what="systems JSON", fix="give the JSON file") as f:
            desc = load_json(f, parse_constant=no_constant)
    except OSError as e:
        raise UserError("cannot read systems JSON %s: %s" % (path, e.strerror))
    except ValueError as e:
        why = str(e).splitlines()[0]
        raise UserError("systems JSON %s is not JSON (%s): fix the file" % (path, why))
    if not isinstance(desc, dict):
        raise UserError("systems JSON %s holds a %s, not an object of fields" % (path, type(desc).__name__))
    for key, value in desc.items():
        if value is None and score:
            continue
        if key in TEXT_FIELDS or key in NOTES_FIELDS and value:
            ok = (str,)  # a number here ended the official checker in a TypeError (package passed it)
        elif score:
            continue
        else:  # as the published ones hold them; a list or null broke the official tools at score time
            ok = (str, int, float, dict) if key == "other_software_stack" else (str, int, float)
        if not isinstance(value, ok) or isinstance(value, bool):
            raise UserError("systems JSON %s: %s is a %s: give it as text (\"...\")%s" % (
                path, key, "null" if value is None else "number" if isinstance(value, (int, float))
                and not isinstance(value, bool) else type(value).__name__,
                ", or an object" if key == "other_software_stack" else ""))
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
    for key, value in (("submitter", org), ("division", division), ("status", status), ("number_of_nodes", nodes)):
        if value is not None and str(given.get(key, "")).startswith(TEMPLATE_MARK):
            del given[key]  # the template's text where package has the value
    unfilled = [k for k, v in given.items() if isinstance(v, str) and v.startswith(TEMPLATE_MARK)]
    if unfilled:
        raise UserError("%s still holds the template's text for %s: replace each with the value (\"\" where the"
                        " field may be left empty)" % (system_json or "--system_field", ", ".join(unfilled)))
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
    # the official result summarizer reads these with int(): "abc" packaged, then score failed in it
    for key in WHOLE_NUMBERS:
        value = str(given.get(key, "")).strip()
        if value and not (value.isascii() and value.isdigit()):  # ("²" is a digit to isdigit, not to int())
            said = "--system_field" if any(f.partition("=")[0] == key for f in fields) else system_json
            raise UserError("%s says %s=%r: give a whole number (the official result summarizer counts with it)"
                            % (said, key, given[key]))
    extra = [k for k in given if k not in SYSTEM_FIELDS]
    out = {k: given.get(k, "") for k in SYSTEM_FIELDS}
    out.update((k, given[k]) for k in extra)  # fields of the submitter's own (NVIDIA's framework_name)
    return out, [k for k in SYSTEM_FIELDS if out[k] == ""]


def write_system_template(path, org=None, status=None, nodes=None):
    """Write ``path``: a systems JSON of every field the official checker requires, each value
    the field's meaning after TEMPLATE_MARK (package refuses a value left so), --org, --status and
    --nodes filled in when given. An existing file is refused (it may be filled in already)."""
    if os.path.lexists(path):
        raise UserError("--system_template=%s exists: give a new file name (it may be a filled-in one)" % path)
    given = {"submitter": org, "status": status, "number_of_nodes": None if nodes is None else str(nodes)}
    desc = {k: given[k] if given.get(k) is not None else TEMPLATE_MARK + FIELD_MEANINGS[k] for k in SYSTEM_FIELDS}
    write_json(path, desc, newline=True, indent=4)
    return desc


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
    total = host_memory()
    return "%.0f GB" % (total / 1024 ** 3) if total else ""


def _os_name():
    try:
        with open("/etc/os-release") as f:
            return next(l.split("=", 1)[1].strip().strip('"') for l in f if l.startswith("PRETTY_NAME="))
    except (OSError, StopIteration):
        return platform.platform()


# ---- the implementation: the files MANIFEST.txt lists

def git_unfriendly(path):
    """Whether MLCommons' repo checker refuses ``path`` (a relative path): a part that starts with
    '.' or holds a space (mlperf_logging/repo_checker: "git-unfriendly name")."""
    return any(part.startswith(".") or " " in part for part in path.split("/"))


_GLOB = re.compile(r"[*?\[]")


def manifest_lines(root=ROOT):
    """MANIFEST.txt's paths, each once, in order, ``./`` and doubled '/' normalised away; a
    UserError naming the line (FILE:LINE) that is absolute, has a '..' part or resolves outside
    ``root`` (package would copy any readable file into the package), has white space around it
    (a name with a trailing space is not the file meant), or names a directory or a glob (the list
    names files: `git ls-files`)."""
    path = os.path.join(root, MANIFEST)
    remake = "the list names files of the repository, one a line: remake it with `make manifest` (git ls-files)"
    if os.path.isdir(path):
        raise UserError("%s is a directory: %s" % (path, remake))
    try:
        with open_input(path, encoding="utf-8", fix=remake) as f:
            lines = split_lines(f.read())
    except UnicodeDecodeError as e:
        raise UserError("%s is not UTF-8 text (byte %d): %s" % (path, e.start, remake))
    except OSError:
        raise UserError("%s is missing: package copies the implementation from that list, so run it from a"
                        " clone of this repository or from its image (a pip-installed mlperf_bert has no"
                        " scripts or configs to package)" % path)
    real_root = os.path.realpath(root)
    files, seen = [], set()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = "%s:%d: %r" % (path, n, line)
        if "\0" in line:
            raise UserError("%s holds a NUL byte, which no path has: %s" % (where, remake))
        if line != line.strip():
            raise UserError("%s has white space around the path (a file of that name is not the one meant):"
                            " %s" % (where, remake))
        if os.path.isabs(line):
            raise UserError("%s is an absolute path: %s" % (where, remake))
        if ".." in line.split("/"):
            raise UserError("%s has a '..' part (a path from the list must stay inside the repository): %s"
                            % (where, remake))
        name = os.path.normpath(line)  # ./a//b -> a/b
        full = os.path.join(root, name)
        real = os.path.realpath(full)
        if not real.startswith(real_root + os.sep):
            raise UserError("%s is outside the repository (%s): %s" % (where, real, remake))
        if os.path.isdir(full):
            raise UserError("%s is a directory: %s" % (where, remake))
        if _GLOB.search(name) and not os.path.lexists(full):
            raise UserError("%s is a glob pattern: %s" % (where, remake))
        if name in seen:
            continue
        seen.add(name)
        files.append(name)
    return files


def source_files(root=ROOT):
    """The implementation's files: MANIFEST.txt's, less the tests and the names the repo checker
    refuses; a UserError when the list or a file on it is missing (a partial copy would be a package
    whose implementation cannot run), or when nothing is left to package."""
    files = [f for f in manifest_lines(root) if not f.startswith(NOT_PACKAGED) and not git_unfriendly(f)]
    missing = [f for f in files if not os.path.isfile(os.path.join(root, f))]
    if missing:
        raise UserError("%d file%s of %s %s missing from %s (%s%s): the implementation would be incomplete;"
                        " restore them (git checkout), or remake the list with `make manifest` if they were"
                        " removed on purpose" % (len(missing), "s" if len(missing) > 1 else "", MANIFEST,
                                                 "are" if len(missing) > 1 else "is", root,
                                                 ", ".join(missing[:5]), ", ..." if len(missing) > 5 else ""))
    if not [f for f in files if f != MANIFEST]:
        raise UserError("%s lists no file to package (tests/ and names with a leading '.' or a space are left"
                        " out): a package needs its implementation; remake the list with `make manifest`"
                        % os.path.join(root, MANIFEST))
    return files


def copy_source(dest, root=ROOT):
    """Copy the implementation's files to ``dest``, its MANIFEST.txt the list of them; return how
    many."""
    files = source_files(root)
    for f in files:
        os.makedirs(os.path.dirname(os.path.join(dest, f)) or dest, exist_ok=True)
        if f == MANIFEST:
            with open(os.path.join(dest, f), "w", encoding="utf-8") as out:
                out.write("".join(name + "\n" for name in files))
        else:
            shutil.copy2(os.path.join(root, f), os.path.join(dest, f))
    return len(files)


def source_identity(root=ROOT):
    """What code a run or a package is: {"commit": git's HEAD (None without .git or git),
    "modified": whether tracked files differ from it (None: unknown), "source_sha256": a digest of
    the implementation's files (source_files, MANIFEST.txt left out: the package writes its own),
    None without MANIFEST.txt}."""
    out = {"commit": None, "modified": None, "source_sha256": None}
    if os.path.exists(os.path.join(root, ".git")):
        try:
            git = lambda *a: subprocess.run(("git", "-C", root) + a, capture_output=True, text=True,  # noqa: E731
                                           timeout=20, check=True).stdout.strip()
            out["commit"] = git("rev-parse", "HEAD") or None
            out["modified"] = bool(git("status", "--porcelain", "--untracked-files=no"))
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        files = source_files(root)
    except UserError:
        return out
    digest = hashlib.sha256()
    for f in sorted(files):
        if f == MANIFEST:
            continue
        with open(os.path.join(root, f), "rb") as fh:
            digest.update(f.encode() + b"\0" + hashlib.sha256(fh.read()).digest())
    out["source_sha256"] = digest.hexdigest()
    return out


# ---- the package

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*\Z")  # \Z: "$" also matches before a final newline
_TMP = re.compile(r"^\.(?P<org>.+)\.tmp-(?P<pid>\d+)\Z")


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


def implementation_dir(implementation):
    """ORG/'s folder of the implementation ``implementation`` (the framework's name)."""
    return os.path.join("benchmarks", "bert", "implementations", implementation)


def launch_name(system):
    """The file, in the implementation folder, that says how ``system``'s runs were launched."""
    return LAUNCH % system


def _pieces(system, implementation, new_implementation):
    """The parts of ORG/ that one ``package`` adds, the results last (they make the package whole):
    the implementation folder when ORG/ has none of that name, else the system's launch record."""
    impl = implementation_dir(implementation)
    return [impl if new_implementation else os.path.join(impl, launch_name(system)),
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


_MARKER = re.compile(r"^\.package-(?P<system>.+)\.incomplete\Z")


def unfinished_package(root, org=None):
    """What ``score`` says of a package that ``package`` has not finished (a ``package`` stopped, or
    still running), one line naming the command to rerun, or None: ORG/.package-SYSTEM.incomplete
    (its move of SYSTEM into an existing ORG/ stopped half-way: its pieces, less the results, look
    like a package), or ``root``/.ORG.tmp-PID, its build, holding a system's results that ORG/ lacks
    (stopped before the move). ``org`` None: any ORG's build (``root`` holds no ORG/)."""
    top = os.path.join(root, org) if org else None
    markers = sorted(n for n in os.listdir(top) if _MARKER.match(n)) if top and os.path.isdir(top) else []
    if markers:
        return ("%s holds the unfinished package of %s (%s: a package command was stopped while it moved the"
                " system in, or is still running): rerun that package command, which finishes it, then score" % (
                    top, _MARKER.match(markers[0]).group("system"), os.path.join(top, markers[0])))
    for name in sorted(os.listdir(root)) if os.path.isdir(root) else ():
        m = _TMP.match(name)
        results = os.path.join(root, name, "results")
        if not m or (org and m.group("org") != org) or not os.path.isdir(results):
            continue
        missing = [s for s in sorted(os.listdir(results))
                   if not (top and os.path.lexists(os.path.join(top, "results", s)))]
        if missing:
            return ("%s holds the unfinished build of %s's package of %s (%s: a package command was stopped before"
                    " it moved the package into place, or is still running): rerun that package command, which"
                    " finishes it, then score (or remove %s)" % (
                        root, m.group("org"), missing[0], os.path.join(root, name), os.path.join(root, name)))
    return None


def read_made_by(top):
    """The systems ``package`` put in ORG/ (``top``): {system: implementation} from ORG/MADE_BY;
    {} without it (a package made otherwise: a published one); a UserError naming it when it
    cannot be read."""
    path = os.path.join(top, MADE_BY)
    try:
        with open_input(path, encoding="utf-8", fix="package writes it; remake the package") as f:
            made = load_json(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise UserError("cannot read %s (%s): package writes it; remake the package" % (path, e))
    systems = made.get("systems") if isinstance(made, dict) else None
    if not isinstance(systems, dict) or not all(isinstance(v, str) for v in systems.values()):
        raise UserError("%s holds no {system: implementation} object \"systems\": package writes it; remake the"
                        " package" % path)
    return systems


def _write_made_by(top, systems):
    write_json(os.path.join(top, MADE_BY),
               {"about": "Made by `python -m mlperf_bert package`: the implementation folder under"
                         " benchmarks/bert/implementations/ of each system's runs. score fails a system"
                         " listed here whose implementation is missing (docs/running.md).",
                "systems": dict(sorted(systems.items()))}, newline=True, indent=2)


def _remove(path):
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.remove(path)


def _marked_pieces(top, system, marker):
    """The pieces of ORG/ (``top``) that ``marker`` lists, each checked to be one that a package of
    ``system`` adds (``_pieces``), under no symbolic link: the rerun removes them, so a line of any
    other shape (a blank line would be ORG/ itself, ``..`` outside it) is refused, not followed."""
    lines = read_lines(marker, "package's marker of an unfinished move")
    impl = implementation_dir("")
    allowed = {os.path.join("systems", system + ".json"), os.path.join("results", system)}
    made = read_made_by(top)
    for line in lines:
        name = line[len(impl):].split("/")
        ok = line in allowed or (line.startswith(impl) and _NAME.match(name[0]) is not None
                                 and (len(name) == 1 or name[1:] == [launch_name(system)]))
        parents = [os.path.join(top, *line.split("/")[:k]) for k in range(1, line.count("/") + 1)] if ok else []
        # a whole implementation folder is listed only when this move brought it in, new: one that
        # MADE_BY gives to another system too holds that system's code and launch record
        others = sorted(s for s, i in made.items() if s != system and i == name[0]) \
            if ok and line.startswith(impl) and len(name) == 1 else []
        linked = any(os.path.islink(d) for d in parents)
        if not ok or others or linked:
            why = (" (the implementation of %s too, in %s)" % (", ".join(others), MADE_BY) if others
                   else " (under a symbolic link)" if linked else "")
            raise UserError("%s lists %r, not a part of %s that package adds there%s: package did not write this "
                            "marker; check %s by hand and remove the marker" % (marker, line, top, why, top))
    if not lines:
        raise UserError("%s lists nothing: package did not write this marker; check %s by hand and remove the "
                        "marker" % (marker, top))
    return lines


class _Held(UserError):
    """ORG/ holds the system already (``_check_free``): refused unless it is what this package makes."""


def _files(top):
    """{path relative to ``top``: its bytes' md5} of the files under ``top``; {} when it is none."""
    out = {}
    for d, _, names in os.walk(top):
        for name in names:
            path = os.path.join(d, name)
            out[os.path.relpath(path, top)] = file_md5(path) if not os.path.islink(path) else "link"
    return out


def _same_package(build, top, system, implementation):
    """Whether ORG/ (``top``) holds ``system``'s package as ``build`` makes it, byte for byte: its
    results, systems JSON, launch record and implementation (the other systems' launch records
    aside), and ORG/MADE_BY names it (a package stopped after it finished, rerun)."""
    impl = implementation_dir(implementation)
    theirs = _files(os.path.join(top, impl))
    ours = _files(os.path.join(build, impl))
    extra = [f for f in theirs if f not in ours and not re.match(r"^launch_.+\.json\Z", f)]
    return (not extra and all(theirs.get(f) == h for f, h in ours.items())
            and _files(os.path.join(top, "results", system)) == _files(os.path.join(build, "results", system))
            and _files(os.path.join(top, "systems")).get(system + ".json")
            == _files(os.path.join(build, "systems")).get(system + ".json")
            and read_made_by(top).get(system) == implementation)


def _refuse_another_file_system(top, pieces):
    """Refuse an ORG/ (or a folder in it that the pieces go into) on another file system or mount than
    --output: a symbolic link to another mount, a mount point, a bind mount of the same file system (a
    container's -v of ORG/: the same st_dev). The build in --output is renamed into place, which
    cannot cross mounts (EXDEV: a traceback, a half-made move left in ORG/)."""
    output = os.path.dirname(top)
    dev, mount = os.stat(output).st_dev, mount_point(output)
    folders = [top] + [os.path.join(top, *piece.split(os.sep)[:k]) for piece in pieces
                       for k in range(1, len(piece.split(os.sep)))]
    for folder in folders:
        if not os.path.isdir(folder):
            continue
        other_fs = os.stat(folder).st_dev != dev
        if not other_fs and mount_point(folder) == mount:
            continue
        real = os.path.realpath(folder)
        beside = os.path.dirname(real)
        fix = ("give --output=%s (where %s is)" % (beside, real)
               if folder == top and os.stat(beside).st_dev == os.stat(real).st_dev
               and mount_point(beside) == mount_point(real) else
               "%s is a mount point: mount the folder above it instead (a container's -v of --output, not of ORG/), "
               "or give an --output on one mount with it" % mount_point(real))
        raise UserError("%s is on another %s than --output %s%s: package builds in --output and renames the package "
                        "into ORG/, which cannot cross %ss; %s" % (
                            folder, "file system" if other_fs else "mount", output,
                            " (a symbolic link to %s)" % real if os.path.islink(folder) else "",
                            "file system" if other_fs else "mount", fix))


def _check_free(top, system, implementation, source_sha256):
    """The pieces a package of ``system`` adds to ``top`` (ORG/, existing or not); refuse when ORG/
    already holds this system, or holds an implementation of that name with other code, or another
    system's unfinished move; finish off a move of this system that was killed."""
    marker = _incomplete_marker(top, system)
    if os.path.exists(marker):  # our own move into an existing ORG/ was killed half-way: undo it
        for piece in _marked_pieces(top, system, marker):
            _remove(os.path.join(top, piece))
        made = read_made_by(top)
        if made.pop(system, None) is not None:
            _write_made_by(top, made)
        os.remove(marker)
    # another system's killed move may have brought in a new implementation folder, which its rerun
    # removes whole: this system's launch record would go with it
    others = sorted(n for n in os.listdir(top) if _MARKER.match(n)) if os.path.isdir(top) else []
    if others:
        raise UserError("%s holds the unfinished package of %s (%s, a package command that was stopped): rerun "
                        "that command first, which undoes its half-made move" % (
                            top, _MARKER.match(others[0]).group("system"), os.path.join(top, others[0])))
    impl = os.path.join(top, implementation_dir(implementation))
    pieces = _pieces(system, implementation, not os.path.lexists(impl))
    # a file (or a link) where the move makes a folder stopped it half-way, the pieces before moved in
    for piece in pieces:
        parts = piece.split(os.sep)
        for k in range(1, len(parts)):
            folder = os.path.join(top, *parts[:k])
            if os.path.islink(folder) or os.path.lexists(folder) and not os.path.isdir(folder):
                raise UserError("%s is %s, not a folder: package puts %s in it; move it away or choose another"
                                " --output" % (folder, "a symbolic link" if os.path.islink(folder) else
                                               special_kind(folder) or "a file", os.path.join(top, piece)))
    _refuse_another_file_system(top, pieces)
    held = [p for p in pieces[1:] + [os.path.join(implementation_dir(implementation), launch_name(system))]
            if os.path.lexists(os.path.join(top, p))]
    if held:
        raise _Held("%s already holds a package of %s (%s): remove %s or choose another --output"
                    % (top, system, held[-1], ", ".join(os.path.join(top, p) for p in held)))
    if os.path.lexists(impl):
        theirs = source_identity(impl)["source_sha256"]
        if theirs is None or theirs != source_sha256:
            raise UserError("%s holds other code than this package's (%s): the systems of one organization share"
                            " an implementation folder when they ran the same code; package the commit it holds,"
                            " or give --implementation=ANOTHER_NAME" % (
                                impl, "no MANIFEST.txt of package's" if theirs is None else "source_sha256 differs"))
    return pieces


def _move_into_place(build, top, system, pieces):
    """Move the finished build (a whole ORG/) to ``top``: one rename when ORG/ is new, else its
    ``pieces`` one by one under a marker (the pieces it moves) that a rerun reads as "incomplete,
    ours", and ORG/MADE_BY gets the system."""
    if not os.path.exists(top):
        os.rename(build, top)
        return
    marker = _incomplete_marker(top, system)
    with atomic_open(marker, "w", encoding="utf-8") as f:  # whole or absent: a rerun removes what it lists
        f.write("".join(p + "\n" for p in pieces))
    for piece in pieces:
        os.makedirs(os.path.dirname(os.path.join(top, piece)), exist_ok=True)
        os.rename(os.path.join(build, piece), os.path.join(top, piece))
    made = read_made_by(top)
    made.update(read_made_by(build))
    _write_made_by(top, made)
    os.remove(marker)
    shutil.rmtree(build)


def launch_records(logs, runs):
    """For each run log, what its launch record says of it: the result name, the log it came from, its
    seed and status, and its trainer's run_finished.json (``run_N/`` beside a ``result_N.txt``,
    beside an ``mlperf.log``) when that record is of this run (the same seed): its launch and run
    identity; else null and why. A run killed after its run_stop, before its end was written, has
    its run_stopped.json instead: its log is complete, and so is that record's launch."""
    out = []
    for i, (log, records) in enumerate(zip(logs, runs)):
        seeds = [r.value for r in records if r.key == "seed"]
        stops = [r for r in records if r.key == "run_stop"]
        entry = {"result": "result_%d.txt" % i, "log": os.path.abspath(log), "seed": seeds[-1] if seeds else None,
                 "status": stops[-1].metadata.get("status") if stops else None,
                 "run_finished": None, "launch": None, "run": None}
        folder, name = os.path.split(os.path.abspath(log))
        m = re.match(r"^result_(\d+)\.txt$", name)
        folders = ([os.path.join(folder, "run_%s" % m.group(1))] if m else []) + [folder]
        candidates = [os.path.join(f, name) for f in folders for name in (FINISHED, STOPPED)]
        for path in candidates:
            try:
                with open_input(path, encoding="utf-8") as f:
                    rec = load_json(f)
            except (OSError, ValueError):
                continue
            run = rec.get("run") if isinstance(rec, dict) else None
            if not isinstance(run, dict) or run.get("seed") != entry["seed"]:
                continue  # another run's record (a result_N.txt copied from elsewhere)
            entry.update(run_finished=path, launch=rec.get("launch"), run=run)
            break
        out.append(entry)
    return out


# The roots launch records name instead of the submitter's absolute paths (a package is published):
# each run's own, longest first; a path under none keeps its file name only.
PATH_ROOTS = (("OUTPUT_DIR", "the run's --output_dir"),
              ("DATA_DIR", "the folder of the run's training files (--input_file)"),
              ("RUNS", "the folder package read the run's log from (--runs)"),
              ("SOURCE", "the repository package ran in (the code packaged)"))
ELSEWHERE = "ELSEWHERE"
# An absolute path inside a string: a '/' that starts a value (not one inside a relative path or
# after "scheme:"), up to white space, a list's ',' or a quote.
_ABSOLUTE = re.compile(r"(?<![\w.$~:/-])/[^\s,;'\"=]*")


def path_roots(entry, log, root=ROOT):
    """{root name: absolute folder} for one run's launch record (PATH_ROOTS)."""
    roots = {}
    flags_ = (entry.get("launch") or {}).get("flags") or {}
    out = flags_.get("output_dir")
    if isinstance(out, str) and os.path.isabs(out):
        roots["OUTPUT_DIR"] = os.path.normpath(out)
    inputs = flags_.get("input_file")
    inputs = inputs.split(",") if isinstance(inputs, str) else [
        f[0] for f in (entry.get("run") or {}).get("input_file") or [] if isinstance(f, list) and f]
    dirs = [os.path.dirname(p) for p in inputs if isinstance(p, str) and os.path.isabs(p)]
    if dirs and os.path.commonpath(dirs) != os.sep:
        roots["DATA_DIR"] = os.path.commonpath(dirs)
    folder = os.path.dirname(os.path.abspath(log))
    if re.match(r"^run_\d+$", os.path.basename(folder)):  # run_N/mlperf.log: the series' folder
        folder = os.path.dirname(folder)
    roots["RUNS"] = folder
    roots["SOURCE"] = os.path.abspath(root)
    return roots


def portable(value, roots):
    """``value`` (JSON) with each absolute path written $ROOT/relative (the longest root that holds
    it), or $ELSEWHERE/NAME when no root holds it."""
    if isinstance(value, dict):
        return {k: portable(v, roots) for k, v in value.items()}
    if isinstance(value, list):
        return [portable(v, roots) for v in value]
    if not isinstance(value, str) or "/" not in value:
        return value

    def one(m):
        path = m.group(0)
        held = [(len(r), name) for name, r in roots.items() if path == r or path.startswith(r.rstrip("/") + "/")]
        if held:
            name = max(held)[1]
            return "$" + name + path[len(roots[name].rstrip("/")):]
        return "$%s/%s" % (ELSEWHERE, os.path.basename(path.rstrip("/")))
    return _ABSOLUTE.sub(one, value)


def launch_file(system, entries, source, logs=None, root=ROOT):
    """launch_SYSTEM.json's content: what it is, the roots its paths are relative to, the packaged
    implementation's identity, the runs (each with its paths made relative: ``portable``)."""
    runs = [portable(e, path_roots(e, log, root)) for e, log in zip(entries, logs or [e["log"] for e in entries])]
    return {"about": "How each run of results/%s/bert was launched, from its trainer's run_finished.json:"
                     " launch (the preset, the flags given over it, every trainer flag, processes and nodes,"
                     " the code's commit and digest) and run (the identity a resume must match); null where"
                     " package found no record of the run. implementation: the code packaged here"
                     " (docs/running.md)." % system,
            "paths": "Absolute paths of the machines the runs ran on are written relative to these roots,"
                     " each run's own: %s; a path under none of them keeps its file name only, as $%s/NAME"
                     % ("; ".join("$%s: %s" % r for r in PATH_ROOTS), ELSEWHERE),
            "implementation": source, "runs": runs}


def _unfinished_runs(logs):
    """run_N/mlperf.log of the series whose result_N.txt logs are among ``logs`` that have no
    result_N.txt beside them (start_training.sh copies a run's log there when it finishes)."""
    dirs = {os.path.dirname(os.path.abspath(p)) for p in logs if re.match(r"result_\d+\.txt$", os.path.basename(p))}
    for d in sorted(dirs):
        for log in glob.glob(os.path.join(glob.escape(d), "run_*", "mlperf.log")):
            n = os.path.basename(os.path.dirname(log))[len("run_"):]
            if n.isascii() and n.isdigit() and not os.path.exists(os.path.join(d, "result_%s.txt" % n)):
                yield log


def package_warnings(logs, entries, source, runs=(), division="closed"):
    """What package says but does not refuse: a count of logs other than the ruleset's, more than one
    run that did not converge (``runs``: each log's records), runs that logged no cache flush, runs
    without a launch record, runs stopped and resumed, runs made with other code than the packaged or
    under several torches."""
    from mlperf_logging.benchmark_meta import get_result_file_counts
    need = get_result_file_counts("training")["bert"]
    warnings = []
    if len(logs) != need:
        warnings.append("%d run log%s, the ruleset (training %s) needs exactly %d for BERT: the official package"
                        " checker fails this package (add the missing runs to --runs, or leave the extra out)"
                        % (len(logs), "" if len(logs) == 1 else "s", RULESET, need))
    failed = [os.path.basename(log) for log, records in zip(logs, runs) if not_converged(records, division)]
    if len(failed) > 1:  # (score's reason too; one may be dropped as the slowest)
        warnings.append("%d runs did not converge (%s): the training rules ('Benchmark Results') make a result with"
                        " more than one non-converging run invalid, and score fails this package"
                        % (len(failed), _first_three(failed)))
    kept = [os.path.basename(log) for log, records in zip(logs, runs) if logged_cache_clear(records) is not True]
    if kept:  # (the official tools ask only that the key is there; published logs say true, one null: Habana v3.1)
        warnings.append("%d run%s (%s) logged no cache_clear true: the training rules ('Data State at Start of Run')"
                        " ask for the cache flushed or the system restarted before each run (start_training.sh drops"
                        " it, as root, and logs true)" % (len(kept), "" if len(kept) == 1 else "s", _first_three(kept)))
    for log in sorted(_unfinished_runs(logs), key=_by_run):  # a series still running, or stopped
        d = os.path.dirname(os.path.dirname(log))
        warnings.append("%s: no result_%d.txt in %s: that run of the series did not finish (still running, or"
                        " stopped: rerun the same start_training.sh command to finish it), and is not in this"
                        " package" % (log, run_number(log), d))
    by_seed = {}
    for log, e in zip(logs, entries):  # the same run twice (a copy, a folder given twice), or a seed reused
        by_seed.setdefault(("seed", e["seed"]) if e["seed"] is not None else ("md5", file_md5(log)), []).append(log)
    for (kind, seed), names in ((k, n) for k, n in by_seed.items() if len(n) > 1):
        warnings.append("%s %s: the official package checker fails a package whose runs share a seed (give each "
                        "run once, each with its own seed)" % (" and ".join(names), "share seed %s" % seed
                                                              if kind == "seed" else "are one run's log (the same bytes)"))
    big = [log for log in logs if os.path.getsize(log) > REPO_FILE_LIMIT]
    if big:  # (the repo checker's _check_file_sizes: git's limit)
        warnings.append("%s %s over 50 MiB: the official repo checker fails a package holding a file that large"
                        % (", ".join(big), "is" if len(big) == 1 else "are"))
    missing = [e for e in entries if e["launch"] is None]
    if missing:
        # start_training.sh's series with LOGDIR apart: result_N.txt there, run_N/ in OUTPUT_DIR
        apart = all(re.match(r"^result_\d+\.txt$", os.path.basename(e["log"]))
                    and not glob.glob(os.path.join(glob.escape(os.path.dirname(e["log"])), "run_*", "")) for e in missing)
        warnings.append("%d run%s without a launch record (%s): no %s (or %s) of the same seed in run_N/ beside"
                        " result_N.txt or beside mlperf.log; the launch record says null for %s%s" % (
                            len(missing), "" if len(missing) == 1 else "s", _first_three([e["result"] for e in missing]),
                            FINISHED, STOPPED, "it" if len(missing) == 1 else "them",
                            " (a series' LOGDIR apart from its OUTPUT_DIR holds no run_N/: give --runs=OUTPUT_DIR,"
                            " whose run_N/ hold the logs and their records)" if apart else ""))
    other = [e["result"] for e in entries if e["launch"] and source.get("source_sha256")
             and e["launch"].get("source_sha256") not in (None, source["source_sha256"])]
    if other:
        warnings.append("%d run%s (%s) ran other code than the implementation packaged (source_sha256 differs):"
                        " package the commit the runs ran" % (len(other), "" if len(other) == 1 else "s",
                                                              _first_three(other)))
    resumed = ["%s (seed %s, resumed at step %s)" % (e["result"], e["seed"], ", ".join(map(str, e["launch"]["resumed_at_steps"])))
               for e in entries if isinstance(e["launch"], dict) and e["launch"].get("resumed_at_steps")]
    if resumed:  # (an uninterrupted run's record says []; one of an older version says nothing)
        warnings.append("%d run%s stopped and resumed (%s): %s time from run_start to run_stop holds the pause and the"
                        " rerun's init, so it is not a timed result; rerun %s uninterrupted (with %s seed) for the"
                        " package" % (len(resumed), "" if len(resumed) == 1 else "s", _first_three(resumed, "; "),
                                      "its" if len(resumed) == 1 else "their",
                                      "it" if len(resumed) == 1 else "them", "its" if len(resumed) == 1 else "each one's"))
    by_torch = {}
    for e in entries:
        version = (e["launch"] or {}).get("torch")
        if isinstance(version, str):  # (a record of an older version names none)
            by_torch.setdefault(version, []).append(e["result"])
    if len(by_torch) > 1:
        warnings.append("the runs ran under %d versions of torch (%s): a submission's runs share one software stack,"
                        " the one its system description names; package the runs of one" % (len(by_torch), "; ".join(
                            "torch %s: %s" % (v, _first_three(r))
                            for v, r in sorted(by_torch.items()))))
    return warnings


def _first_three(names, sep=", "):
    """``names`` in a warning: the first three, then "..." where there are more."""
    return sep.join(names[:3]) + (sep + "..." if len(names) > 3 else "")


def make_package(org, system, run_specs, output, system_json=None, fields=(), status=None, nodes=None,
                 platform_=None, root=ROOT, implementation=IMPLEMENTATION, notes=None):
    """Lay the package out; return (logs, fields left empty, source files, warnings). ORG/ holding
    the system's package already is refused, unless it is the one this call makes, byte for byte:
    then nothing is written, and ``notes`` (a list) gets a line saying so."""
    check_name("org", org)
    check_name("system", system)
    check_name("implementation", implementation)
    # the longest names made of them, in the folder the package is built in (past 255 bytes: a line naming that)
    for flag, name, extra, derived in (
            ("org", org, len(".") + DERIVED_NAME_BYTES, ".ORG.tmp-PID, the folder the package is built in"),
            ("system", system, len(LAUNCH % "") + DERIVED_NAME_BYTES,
             "%s.tmp-PID, the temporary of its launch record" % (LAUNCH % "SYSTEM"))):
        refuse_long_name(os.path.join(output, name), "--" + flag, extra, derived, name)
    logs = find_logs(run_specs)
    check_inputs(run_specs, logs, output)
    check_series_logs(logs)
    runs = read_runs(logs)
    by_division = {}
    for log, records in zip(logs, runs):
        by_division.setdefault(division_of(records), []).append(log)
    if len(by_division) != 1 or None in by_division:  # each named, with its logs: which ones to leave out
        raise UserError("the runs' logs name no one division (%s): a package holds runs of one division (leave the"
                        " others out of --runs)" % "; ".join("%s: %s" % (
                            "no single submission_division line of closed or open" if d is None else d,
                            ", ".join(names[:3]) + (", ... (%d logs)" % len(names) if len(names) > 3 else ""))
                            for d, names in sorted(by_division.items(), key=lambda kv: str(kv[0]))))
    division, = by_division
    desc, empty = describe_system(org, system, division, system_json, fields, status, nodes)
    platforms = [platform_] if platform_ else [system] + ([desc["system_name"]] if desc["system_name"] != system else [])
    problems = identity_problems(list(zip(logs, runs)), org, division, desc["status"], platforms)
    if problems:
        raise UserError("the runs do not belong in this package: %s%s" % (
            problems[0], " (and %d more: %s)" % (len(problems) - 1, "; ".join(problems[1:])) if problems[1:] else ""))
    source_files(root)  # a MANIFEST.txt that is wrong is refused before anything is written
    entries = launch_records(logs, runs)
    source = source_identity(root)
    warnings = package_warnings(logs, entries, source, runs, division)
    top = os.path.join(output, org)
    # the loser of two packages on one output writes nothing; a package stopped before its move leaves
    # no new, empty --output that looks like one made
    with new_dirs_removed_on_error(output), locking.lock_dir(output, "--output"):
        remove_stale_builds(output, org)
        try:
            pieces, held = _check_free(top, system, implementation, source["source_sha256"]), None
        except _Held as e:  # this command's own package, finished, when it is the same bytes (below)
            pieces, held = None, e
        build = os.path.join(output, ".%s.tmp-%d" % (org, os.getpid()))
        shutil.rmtree(build, ignore_errors=True)
        try:
            bert = os.path.join(build, "results", system, "bert")
            os.makedirs(bert)
            for i, log in enumerate(logs):
                shutil.copyfile(log, os.path.join(bert, "result_%d.txt" % i))
            os.makedirs(os.path.join(build, "systems"))
            write_json(os.path.join(build, "systems", system + ".json"), desc, newline=True, indent=4)
            impl = os.path.join(build, implementation_dir(implementation))
            n = copy_source(impl, root)
            write_json(os.path.join(impl, launch_name(system)), launch_file(system, entries, source, logs, root),
                       newline=True, indent=2, default=str)
            _write_made_by(build, {system: implementation})
            if held is not None:
                if not _same_package(build, top, system, implementation):
                    raise held
                shutil.rmtree(build)
                if notes is not None:
                    notes.append("%s already holds this package of %s, byte for byte (a package stopped once it"
                                 " had finished, rerun): nothing to do" % (top, system))
            else:
                _move_into_place(build, top, system, pieces)
        except BaseException:
            shutil.rmtree(build, ignore_errors=True)
            raise
    return logs, empty, n, warnings


REQUIRED = ("org", "system", "runs", "output")  # all but with --system_template
_REQUIRED = "(required) "


def main(argv):
    fv = flags.FlagValues()
    flags.DEFINE_string("org", None, _REQUIRED + "submitting organization (ORG/ of the package; every log's"
                        " submission_org)", flag_values=fv)
    flags.DEFINE_string("system", None, _REQUIRED + "system name (results/<system>, systems/<system>.json);"
                        " every log's submission_platform must be it or the systems JSON's system_name, unless"
                        " --platform", flag_values=fv)
    flags.DEFINE_string("platform", None, "the submission_platform every log must name, when it is neither"
                        " --system nor the system_name (e.g. NVIDIA's '1xNVIDIA HGX B200' for 'Nyx (1x NVIDIA"
                        " DGX B200)')", flag_values=fv)
    flags.DEFINE_list("runs", None, _REQUIRED + "run logs or directories (result_*.txt, mlperf.log, run_*/)",
                      flag_values=fv)
    flags.DEFINE_string("output", None, _REQUIRED + "package directory (ORG/ goes inside; made complete or not"
                        " at all)", flag_values=fv)
    flags.DEFINE_string("implementation", IMPLEMENTATION, "the implementation folder,"
                        " ORG/benchmarks/bert/implementations/NAME: the framework's name, as published packages"
                        " name it; the systems of one organization share it (a second system's package reuses"
                        " it when its code is the same, and is refused when not)", flag_values=fv)
    flags.DEFINE_string(
        "system_json", None, "(required, or --system_field) the system description, a JSON object written by"
        " you (nothing is read from the machine that runs package; --system_template writes one to fill in)."
        " The official checker requires every field: %s. Those package will not leave empty: %s; submitter"
        " and division come from --org and the logs." % (", ".join(SYSTEM_FIELDS), ", ".join(NEEDED_VALUES)),
        flag_values=fv)
    flags.DEFINE_multi_string("system_field", [], "KEY=VALUE: a field of the systems JSON (repeat the flag;"
                              " fills or replaces --system_json's)", flag_values=fv)
    flags.DEFINE_string("system_template", None, "write FILE, a systems JSON of every field the official checker"
                        " requires, each value saying what the field means, and exit (no other flag needed;"
                        " --org, --status and --nodes are filled in when given): replace each value, then"
                        " give it as --system_json", flag_values=fv)
    flags.DEFINE_enum("status", None, list(SYSTEM_STATUSES), "the system's availability (the systems JSON's"
                      " status); every log's submission_status must match it: %s" % "; ".join(
                          "%s: %s" % (k, " or ".join(v)) for k, v in SYSTEM_STATUSES.items()), flag_values=fv)
    flags.DEFINE_integer("nodes", None, "number of nodes the runs used (the systems JSON's number_of_nodes)",
                         lower_bound=1, flag_values=fv)
    flags.parse(fv, argv, positional=False)
    if fv.system_template:
        write_system_template(fv.system_template, fv.org, fv.status, fv.nodes)
        print("wrote %s: every field of the systems JSON, each value what it means; replace them (\"\" where"
              " it says the field may be left empty), then package --system_json=%s" % (
                  fv.system_template, fv.system_template))
        return 0
    flags.check_required(fv, REQUIRED, " (package --help marks the required flags)")
    notes = []
    logs, empty, n, warnings = make_package(fv.org, fv.system, fv.runs, fv.output, fv.system_json,
                                            fv.system_field, fv.status, fv.nodes, fv.platform,
                                            implementation=fv.implementation, notes=notes)
    for note in notes:
        print("package %s: %s" % (fv.output, note))
    print("package %s: %d runs in %s/results/%s/bert, %d source files and %s in %s, systems/%s.json"
          % (fv.output, len(logs), fv.org, fv.system, n, launch_name(fv.system),
             implementation_dir(fv.implementation), fv.system))
    if empty:
        print("left empty in systems/%s.json (allowed: the official checker needs the fields, published packages"
              " leave some empty): %s" % (fv.system, ", ".join(empty)))
    for w in warnings:
        print("warning: package: " + w, file=sys.stderr)
    return 0
