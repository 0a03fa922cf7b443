"""This process's control groups (cgroup v1 and v2): the folders of its groups and what their files
say of the limits a container or a scheduler set (processes and threads, memory) and of the
out-of-memory killer's kills. Standard library only: the launchers call it with ``python -S``."""
import contextlib
import os
import re

# This process's control groups and where their hierarchies are mounted (tests give fake ones)
PROC_CGROUP = "/proc/self/cgroup"
CGROUP_ROOT = "/sys/fs/cgroup"


def dirs(controller):
    """The folders of this process's control group for ``controller`` ("pids", "memory"), then of each
    ancestor's, nearest first (a group's limits hold for the groups below it): cgroup v1's hierarchy of
    that controller, v2's unified one. A folder that is not there is passed over: in a container the
    mount's root is often the container's own group (docker's v1: /proc/self/cgroup names /docker/ID,
    which is not below it). Nothing where /proc/self/cgroup is unreadable."""
    try:
        with open(PROC_CGROUP) as f:
            lines = [line.rstrip("\n").split(":", 2) for line in f]
    except OSError:
        return
    for line in lines:
        if len(line) != 3 or (line[1] and controller not in line[1].split(",")):
            continue
        root, group = os.path.join(CGROUP_ROOT, controller) if line[1] else CGROUP_ROOT, line[2]
        while True:
            if os.path.isdir(root + group.rstrip("/")):
                yield root + group.rstrip("/")
            if group in ("/", ""):
                break
            group = os.path.dirname(group.rstrip("/")) or "/"


def pids_limit():
    """This process's limit on processes and threads and how many are in use, ("16", "16"): its group's
    own pids.max, else its nearest ancestor's; None where none is set or readable."""
    for group in dirs("pids"):
        try:
            with open(group + "/pids.max") as f:
                limit = f.read().strip()
            with open(group + "/pids.current") as f:
                current = f.read().strip()
        except OSError:
            continue
        if limit != "max":
            return limit, current
    return None


def memory_limit():
    """This process's limit on memory (a container's --memory, Slurm's --mem under task/cgroup,
    Kubernetes' limit): (bytes, the file that sets it), the smallest of its group's and its ancestors'
    (each holds for the groups below it), or None where none is readable. v2's "max" is none; v1's none
    is a huge number, which the callers' min with the host's memory drops."""
    found = []
    for group in dirs("memory"):
        for name in ("memory.max", "memory.limit_in_bytes"):  # v2's, v1's
            with contextlib.suppress(OSError, ValueError):
                with open(os.path.join(group, name)) as f:
                    found.append((int(f.read()), name))
    return min(found) if found else None


def oom_kills():
    """How many processes the out-of-memory killer ended in this process's memory control group (v2's
    memory.events, which counts the groups below it too; v1's memory.oom_control, kernel 4.13 on), or
    None where no count is readable: compared before and after a child's SIGKILL (fileio.oom_killed)."""
    for group in dirs("memory"):  # the nearest: the one its children are in
        for name in ("memory.events", "memory.oom_control"):
            with contextlib.suppress(OSError):
                with open(os.path.join(group, name)) as f:
                    m = re.search(r"^oom_kill (\d+)$", f.read(), re.M)
                if m:
                    return int(m.group(1))
    return None
