"""A two-node Slurm on this host, for ``make slurm-test`` (tests/slurm/check_slurm.py).

Debian's slurm-wlm and munge (installed with apt-get when missing). Everything lives under one
scratch folder: munged with its own key and socket, slurmctld, and two slurmd (``slurmd -N n1``,
``-N n2``), each under ``unshare --mount --uts`` with its own hostname and a hosts file
bind-mounted over /etc/hosts that gives n1 and n2 their own loopback addresses (127.0.1.1,
127.0.1.2). ``ProctrackType=proctrack/linuxproc`` (no cgroups needed: slurmstepd signals every
process of a task's tree, as on hosts without usable cgroups), ``TaskPlugin=task/none``,
``SelectType=select/cons_tres``. This configuration is the test's, not a recommendation for a
cluster. ``stop()`` ends every daemon and every process of a job by pid (those whose environment
holds this cluster's marker), whatever state the test left them in.
"""
import os
import shutil
import signal
import socket
import subprocess
import time

NODES = {"n1": "127.0.1.1", "n2": "127.0.1.2"}
MARKER = "MLPERF_SLURM_TEST"  # in the environment of the daemons and the jobs: stop() finds them by it


class SlurmError(Exception):
    pass


def ensure_installed():
    """slurm-wlm and munge from apt-get when a daemon is missing (apt-get update first)."""
    need = [p for p, exe in (("slurm-wlm", "slurmctld"), ("slurm-wlm", "slurmd"), ("munge", "munged"),
                             ("util-linux", "unshare")) if not shutil.which(exe)]
    if not need:
        return
    if os.getuid() != 0:
        raise SlurmError("%s missing and not root: install them (apt-get install slurm-wlm munge)" % " ".join(need))
    print("installing %s with apt-get" % " ".join(sorted(set(need))), flush=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "update", "-q"],
                ["apt-get", "install", "-y", "-q", "--no-install-recommends"] + sorted(set(need))):
        proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if proc.returncode:
            raise SlurmError("%s failed (%d):\n%s" % (" ".join(cmd), proc.returncode, proc.stdout[-2000:]))


def free_ports(n):
    """n TCP ports free now on every loopback address the cluster uses."""
    socks, ports = [], []
    while len(ports) < n:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        port = s.getsockname()[1]
        if 10000 < port < 60000:
            ports.append(port)
    for s in socks:
        s.close()
    return ports


class LocalSlurm:
    def __init__(self, scratch, spank=()):
        self.dir = os.path.abspath(scratch)
        self.spank = list(spank)  # SPANK plugins (a pyxis spank_pyxis.so) for plugstack.conf
        self.conf = os.path.join(self.dir, "etc", "slurm.conf")
        self.sock = os.path.join(self.dir, "munge", "munge.socket")
        self.pids = {}  # daemon name -> pid
        # the environment of every client command and job: this cluster's config, the marker
        self.env = dict(os.environ, SLURM_CONF=self.conf, MUNGE_SOCKET=self.sock)
        self.env[MARKER] = self.dir
        for k in [k for k in self.env if k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_")) and k != "SLURM_CONF"]:
            del self.env[k]

    # ---- set up and start

    def start(self, cpus=2):
        ensure_installed()
        for sub in ("etc", "munge", "ctld", "n1", "n2", "log"):
            os.makedirs(os.path.join(self.dir, sub), exist_ok=True)
        os.chmod(self.dir, 0o700)  # munged refuses a socket folder others may write
        os.chmod(os.path.join(self.dir, "munge"), 0o700)
        key = os.path.join(self.dir, "munge", "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o400)
        ctld_port, *node_ports = free_ports(1 + len(NODES))
        hosts = os.path.join(self.dir, "etc", "hosts")
        with open(hosts, "w") as f:
            f.write("127.0.0.1 localhost %s\n" % socket.gethostname())
            f.writelines("%s %s\n" % (addr, name) for name, addr in NODES.items())
        d = self.dir
        lines = [
            "ClusterName=mlperftest",
            "SlurmctldHost=%s(127.0.0.1)" % socket.gethostname(),
            "SlurmctldPort=%d" % ctld_port,
            # cred_expire: also how long a requeued job waits before it may start again [120 s]
            "AuthType=auth/munge", "CredType=cred/munge", "AuthInfo=socket=%s,cred_expire=10" % self.sock,
            "SlurmUser=root", "SlurmdUser=root",
            "StateSaveLocation=%s/ctld" % d,
            "SlurmctldPidFile=%s/ctld/slurmctld.pid" % d, "SlurmctldLogFile=%s/log/slurmctld.log" % d,
            "SlurmdSpoolDir=%s/%%n" % d, "SlurmdPidFile=%s/%%n/slurmd.pid" % d,
            "SlurmdLogFile=%s/log/slurmd.%%n.log" % d,
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
            "SchedulerType=sched/builtin", "ReturnToService=2", "MpiDefault=none",
            "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none", "PlugStackConfig=%s/etc/plugstack.conf" % d,
            # a stopped rank's checkpoint is written within KillWait (s) after the SIGTERM
            "KillWait=60", "InactiveLimit=0", "MinJobAge=600", "MessageTimeout=30",
            "SlurmctldTimeout=60", "SlurmdTimeout=120", "SlurmctldDebug=info", "SlurmdDebug=info",
            # a requeued job waits cred_expire, then the next pass of the main scheduling loop [60 s]
            "JobRequeue=1", "SchedulerParameters=sched_interval=2",
        ]
        lines += ["NodeName=%s NodeAddr=%s Port=%d CPUs=%d State=UNKNOWN" % (name, addr, port, cpus)
                  for (name, addr), port in zip(NODES.items(), node_ports)]
        lines.append("PartitionName=test Nodes=%s Default=YES MaxTime=INFINITE State=UP" % ",".join(NODES))
        with open(self.conf, "w") as f:
            f.write("\n".join(l for l in lines if not l.endswith("=")) + "\n")
        with open(os.path.join(d, "etc", "plugstack.conf"), "w") as f:
            f.writelines("required %s\n" % p for p in self.spank)

        self._daemon("munged", ["munged", "--foreground", "--force", "--socket=" + self.sock, "--key-file=" + key,
                                "--pid-file=%s/munge/munged.pid" % d, "--log-file=%s/log/munged.log" % d,
                                "--seed-file=%s/munge/munged.seed" % d])
        self._wait(lambda: os.path.exists(self.sock), "munged's socket")
        self._daemon("slurmctld", ["slurmctld", "-D", "-i", "-f", self.conf])
        self._wait(lambda: self.run(["scontrol", "ping"], check=False).returncode == 0, "slurmctld (scontrol ping)")
        for name in NODES:
            # its own hostname and hosts file, seen by everything it starts (the jobs' tasks)
            script = ("mount --bind %s /etc/hosts && hostname %s && exec slurmd -D -N %s -f %s"
                      % (hosts, name, name, self.conf))
            self._daemon("slurmd." + name, ["unshare", "--mount", "--uts", "--propagation", "private",
                                            "bash", "-c", script])
        self._wait(self._nodes_idle, "both nodes idle (sinfo)", timeout=60)

    def _daemon(self, name, cmd):
        log = open(os.path.join(self.dir, "log", name + ".out"), "w")
        proc = subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.pids[name] = proc.pid
        self._procs = getattr(self, "_procs", {})
        self._procs[name] = proc

    def _wait(self, cond, what, timeout=120):
        t = time.time()
        while not cond():
            for name, proc in getattr(self, "_procs", {}).items():
                if proc.poll() is not None:
                    raise SlurmError("%s exited %d while waiting for %s: %s" % (name, proc.returncode, what,
                                                                                 self.tail(name)))
            if time.time() - t > timeout:
                raise SlurmError("no %s after %d s" % (what, timeout))
            time.sleep(0.2)

    def _nodes_idle(self):
        out = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False).stdout.split()
        return out and all(s == "idle" for s in out[1::2]) and len(out) == 2 * len(NODES)

    def tail(self, name, n=20):
        paths = [os.path.join(self.dir, "log", name + ".out"), os.path.join(self.dir, "log", name + ".log")]
        text = ""
        for p in paths:
            if os.path.exists(p):
                with open(p, errors="replace") as f:
                    text += "".join(f.readlines()[-n:])
        return text

    # ---- use

    def run(self, cmd, check=True, **kw):
        proc = subprocess.run(cmd, env=kw.pop("env", self.env), capture_output=True, text=True, timeout=60, **kw)
        if check and proc.returncode:
            raise SlurmError("%s exited %d: %s" % (" ".join(cmd), proc.returncode, (proc.stdout + proc.stderr).strip()))
        return proc

    def job(self, jobid):
        """scontrol show job's fields of the job, as a dict."""
        out = self.run(["scontrol", "-o", "show", "job", str(jobid)]).stdout
        fields = {}
        for word in out.split():
            k, _, v = word.partition("=")
            fields.setdefault(k, v)
        return fields

    def wait_job(self, jobid, timeout, states=("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL",
                                               "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL", "DEADLINE")):
        """The job's fields once its state is one of ``states``."""
        t = time.time()
        while True:
            j = self.job(jobid)
            if j.get("JobState") in states:
                return j
            if time.time() - t > timeout:
                raise SlurmError("job %s still %s after %d s" % (jobid, j.get("JobState"), timeout))
            time.sleep(0.5)

    # ---- stop

    def marked_pids(self):
        """Processes whose environment holds this cluster's marker (daemons, jobs' tasks) or its
        SLURM_CONF (slurmstepd: slurmd gives it an environment of its own, without the marker)."""
        tokens = {("%s=%s" % (MARKER, self.dir)).encode(), ("SLURM_CONF=%s" % self.conf).encode()}
        found = []
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or int(pid) == os.getpid():
                continue
            try:
                with open("/proc/%s/environ" % pid, "rb") as f:
                    if tokens & set(f.read().split(b"\0")):
                        found.append(int(pid))
            except OSError:
                pass
        return found

    def stop(self):
        """Every daemon, then anything left of a job, ended by pid; returns what was still alive."""
        for name in ["slurmd.%s" % n for n in NODES] + ["slurmctld", "munged"]:
            proc = getattr(self, "_procs", {}).get(name)
            if proc and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        left = self.marked_pids()
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return left
