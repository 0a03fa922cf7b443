"""``make slurm-test``: examples/slurm_multinode.sbatch under a real Slurm (not part of ``make test``).

A two-node Slurm on this host (tests/slurm/local_slurm.py: slurm-wlm and munge, installed with
apt-get when missing; proctrack/linuxproc, so Slurm signals every process of a task's tree) runs
the sbatch through examples/submit.sh on the demo preset (PRESET=demo_cpu, GPUS_PER_NODE=0, one
rank a node, a tiny BERT on the reference's s128 records of tests/data), and checks:

0. what sbatch's --export gives a job, as examples/submit.sh checks its settings (``--export=NONE``
   or a list, with ALL or without: the user's login environment beneath the job's variables);
1. an unstopped job: both nodes meet at the rendezvous (a world of 2 ranks, one on n1, one on n2)
   and finish; its final checkpoint is the reference;
2. ``scancel --signal=TERM`` mid-run: every node says its run stopped by SIGTERM and which
   checkpoint holds it (one checkpoint with both ranks' state), the job exits 143; ``scontrol
   requeue`` of the stopped job resumes it, and its output file keeps the first attempt's lines
   (--open-mode=append); the final checkpoint is bit-identical to the reference's;
3. a time-limit stop: the job's limit moved near (``scontrol update TimeLimit``), Slurm's own
   warning (the sbatch's --signal=B:USR1@600) stops the runs with a checkpoint, the job requeues
   itself (REQUEUE_AT_TIME_LIMIT=1), the next attempt resumes (its first checkpoint follows the
   stop's) and the output file keeps both attempts (a run that never ends by itself: the warning
   comes during the run whatever the load; check 2 proves a resume bit-identical);
4. one node's rank killed with SIGKILL: the job ends (nothing hangs, nothing of it is left) and its
   status is the killed rank's (137), named in the job's last line;
5. the finished job of check 1 resubmitted (with ``--ntasks-per-node=2``, a habit: still one task a
   node): every node says it finished earlier, nothing to do, exit 0, its files untouched;
   resubmitted with another flag: refused in one line a node naming the flag, exit 2, its files
   untouched (rank 0 compares the settings for every node);
6. a series of 2 runs (NUM_RUNS=2, SEED unset: the trainer draws each run's seed on rank 0)
   stopped with ``scancel --batch --signal=TERM`` (the batch shell alone, which passes it on) in
   run 1, then requeued: run 0 is not run again, run 1 resumes; both nodes name the same two seeds,
   distinct; node 0 keeps result_0.txt and result_1.txt, each its run's log; each run's final
   checkpoint holds both ranks' state;
7. a job array of two one-node tasks (``--array=0-1 --nodes=1``: both at once, one on each node): each
   task's run is its own (OUTPUT_DIR/array_T, seed SEED + T), both finish (before, they shared
   OUTPUT_DIR and SEED: the second was refused, "in use by another run", exit 2).
Every job's output holds no traceback (a stop or a failure is one line a node).

``SLURM_TEST_PYXIS=IMAGE.sqsh``: the same checks with examples/slurm_multinode_pyxis.sbatch in the
project's image under pyxis and enroot, installed on this host (not by this test: Debian packages
neither), the image an enroot squashfs of ``make container-test``'s (``enroot import -o IMAGE.sqsh
podman://mlperf-bert``). pyxis's plugin is looked for in PYXIS_PLUGIN, then the usual folders.
Both nodes are on this host, so enroot must keep each node's containers apart: in enroot.conf,
``ENROOT_DATA_PATH`` and ``ENROOT_RUNTIME_PATH`` with ``$(hostname)`` in them. No GPU: enroot's
NVIDIA hook (98-nvidia.sh) must be disabled. Each job start then takes about a minute.
Each step prints its time; every daemon is stopped by pid at the end, also after a failure. The
scratch folder is removed after a pass (kept after a failure, and with SLURM_TEST_KEEP=1).
"""
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
import local_slurm  # noqa: E402
from stepped import Failed, differing_parts, report, step, tiny_data  # noqa: E402

STEPS = int(os.environ.get("SLURM_TEST_STEPS", "120"))  # micro-steps of a run
FLAGS = ["--max_seq_length=128", "--max_predictions_per_seq=20", "--train_batch_size=4", "--steps_per_update=2",
         "--num_train_steps=%d" % STEPS, "--num_warmup_steps=4", "--save_checkpoints_steps=3",
         "--num_workers=1", "--nodo_eval", "--eval_frequency=1000000", "--noprogress"]
FIRST = "model.ckpt-6.pt"  # a stop is sent once this exists
LAST = "model.ckpt-%d.pt" % STEPS
JOB_TIMEOUT = 240  # s, any one job
PYXIS_IMAGE = os.environ.get("SLURM_TEST_PYXIS")
PYXIS_PLUGINS = ("/usr/local/lib/slurm/spank_pyxis.so", "/usr/lib/x86_64-linux-gnu/slurm-wlm/spank_pyxis.so",
                 "/usr/lib64/slurm/spank_pyxis.so", "/usr/lib/slurm/spank_pyxis.so")


def pyxis_plugin():
    """spank_pyxis.so: PYXIS_PLUGIN, else the first of PYXIS_PLUGINS there; refused if none, or no enroot."""
    candidates = [os.environ["PYXIS_PLUGIN"]] if os.environ.get("PYXIS_PLUGIN") else list(PYXIS_PLUGINS)
    found = [p for p in candidates if os.path.isfile(p)]
    if not found:
        raise Failed("SLURM_TEST_PYXIS: no spank_pyxis.so in %s: install pyxis, or give its path in PYXIS_PLUGIN"
                     % ", ".join(candidates))
    if not shutil.which("enroot"):
        raise Failed("SLURM_TEST_PYXIS: no enroot on PATH: pyxis runs the image with it; install enroot")
    if not os.path.isfile(PYXIS_IMAGE):
        raise Failed("SLURM_TEST_PYXIS=%s is not a file: give the enroot squashfs of the image (enroot import -o "
                     "IMAGE.sqsh podman://mlperf-bert)" % PYXIS_IMAGE)
    return found[0]


def expect(cond, what):
    if not cond:
        raise Failed(what)
    print("  ok: %s" % what, flush=True)


class Test:
    def __init__(self, scratch):
        self.dir = scratch
        self.slurm = local_slurm.LocalSlurm(os.path.join(scratch, "slurm"))
        self.data = os.path.join(scratch, "data")

    # ---- setup

    def make_data(self):
        os.makedirs(self.data)
        self.config = os.path.join(self.dir, "bert_config.json")
        tiny_data(os.path.join(self.data, "part-00000"), os.path.join(self.data, "eval_10k"), self.config)

    # ---- jobs

    def submit(self, name, *sbatch_opts, **env):
        out = os.path.join(self.dir, name)
        env = dict(dict(PRESET="demo_cpu", GPUS_PER_NODE="0", NUM_RUNS="1", SEED="7", EXTRA_FLAGS=" ".join(FLAGS)), **env)
        env = {k: v for k, v in env.items() if v is not None}  # None: unset (SEED=None, the trainer's own seeds)
        if PYXIS_IMAGE:  # the image's scripts; its TMPDIR and compile cache are in this folder too
            env = dict(dict(JOB_SCRIPT=os.path.join(ROOT, "examples", "slurm_multinode_pyxis.sbatch"),
                            CONTAINER_IMAGE=PYXIS_IMAGE, CONTAINER_MOUNTS="%s:%s" % (self.dir, self.dir)), **env)
        e = dict(self.slurm.env, DATA_DIR=self.data, BERT_CONFIG=self.config, OUTPUT_DIR=out, CHECK_LOG="0",
                 DROP_CACHES="0", TMPDIR=self.tmp, OMP_NUM_THREADS="1",
                 TORCHINDUCTOR_CACHE_DIR=os.path.join(self.dir, "inductor"), **env)
        for k in ("SUBMISSION_ORG", "SUBMISSION_PLATFORM", "INIT_CHECKPOINT", "INPUT_FILES", "EVAL_FILE", "SEED",
                  "MASTER_PORT", "NNODES", "NODE_RANK", "MASTER_ADDR", "NUM_GPUS"):
            if k not in env:
                e.pop(k, None)
        cmd = [os.path.join(ROOT, "examples", "submit.sh"), "--cpus-per-task=2", "--job-name=" + name,
               "--output=%s/%s-%%j.out" % (self.dir, name)] + list(sbatch_opts)
        print("$ %s %s" % (" ".join("%s=%s" % (k, shlex.quote(v)) for k, v in env.items()), " ".join(cmd)), flush=True)
        proc = subprocess.run(cmd, env=e, cwd=ROOT, capture_output=True, text=True, timeout=60)
        if proc.returncode:
            raise Failed("submit.sh exited %d: %s" % (proc.returncode, proc.stdout + proc.stderr))
        jobid = proc.stdout.split()[-1]
        print("  job %s" % jobid, flush=True)
        return jobid, out, "%s/%s-%s.out" % (self.dir, name, jobid)

    def wait_for(self, cond, jobid, what, timeout=JOB_TIMEOUT):
        t = time.time()
        while not cond():
            state = self.slurm.job(jobid).get("JobState")
            # SIGNALING: running, while Slurm sends a signal (the time limit's --signal=B:USR1@...)
            if state not in ("PENDING", "RUNNING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "COMPLETING",
                             "SIGNALING"):
                raise Failed("job %s ended (%s) before %s" % (jobid, state, what))
            if time.time() - t > timeout:
                raise Failed("no %s after %d s" % (what, timeout))
            time.sleep(0.2)
        print("  %s after %.0f s" % (what, time.time() - t), flush=True)

    def ended(self, jobid, output, timeout=JOB_TIMEOUT):
        try:
            j = self.slurm.wait_job(jobid, timeout)
        except local_slurm.SlurmError as e:  # hung: what of the job is still there, and where it waits
            print("  the job's processes (pid ppid state wchan command):")
            for pid in self.slurm.marked_pids():
                if environ(pid).get("SLURM_JOB_ID") == jobid:
                    print("    %d %s %s %s %s" % (pid, ppid(pid), proc_state(pid), wchan(pid), cmdline(pid)[:160]))
            print("  its output's last lines:\n    " + "\n    ".join(read(output).rstrip().splitlines()[-8:]))
            raise Failed(str(e))
        text = open(output, errors="replace").read()
        print("  job %s: %s, exit %s; its output:" % (jobid, j["JobState"], j["ExitCode"]))
        print("    " + "\n    ".join(text.rstrip().splitlines()[-12:]), flush=True)
        # a stop or a failure is said in one line a node, not with Python's or torchrun's tracebacks
        leaked = [l for l in text.splitlines() if l.startswith(("Traceback", "--- Logging error ---", "During handling"))]
        expect(not leaked, "no traceback in the job's output (%s)" % (leaked[:2],))
        return j, text

    # ---- the checks

    @step("0. sbatch's --export as examples/submit.sh checks a job's settings")
    def exports(self):
        """submit.sh checks the settings a job gets: with NONE or any list but ALL alone, the user's
        login environment under the job's variables (sbatch sets get_user_env for them); without
        --export, this host's alone. A variable only the submitting shell has (MB_HOST_ONLY) and one
        only a login shell sets (SHELL: su -'s) tell them apart."""
        env = {k: v for k, v in self.slurm.env.items() if k != "SHELL"}
        env["MB_HOST_ONLY"] = "1"
        show = " ".join("%s=${%s-unset}" % (v, v) for v in ("FOO", "MB_HOST_ONLY", "SHELL", "SLURM_GET_USER_ENV"))
        show = "echo " + show  # (--wrap's script is sh's)
        for i, (opts, login, host, foo) in enumerate(((["--export=NONE"], True, False, "unset"), (["--export=FOO=bar"], True, False, "bar"),
                                       (["--export=ALL,FOO=bar"], True, True, "bar"), ([], False, True, "unset"))):
            out = os.path.join(self.dir, "export-%d.out" % i)
            jobid = self.slurm.run(["sbatch", "--parsable", "--output=" + out] + opts + ["--wrap", show],
                                   env=env, cwd=self.dir).stdout.strip().split(";")[0]
            self.slurm.wait_job(jobid, 60)
            got = dict(line.split("=", 1) for line in read(out).split())
            expect((got["SHELL"] != "unset", got["MB_HOST_ONLY"] != "unset", got["FOO"]) == (login, host, foo),
                   "sbatch %s: %s" % (" ".join(opts) or "(no --export)", got))

    @step("1. an unstopped job on two nodes (the reference)")
    def unstopped(self):
        jobid, out, output = self.submit("full")
        j, text = self.ended(jobid, output)
        expect(j["JobState"] == "COMPLETED" and j["ExitCode"] == "0:0", "the job completed, exit 0")
        expect(re.search(r"every node finished \(node 0 \(n1\) 0 node 1 \(n2\) 0\)", text) is not None,
               "both nodes (n1, n2) ran start_training.sh to its end, status 0")
        expect(re.search(r"rendezvous n1:\d+", text) is not None, "the rendezvous was on the first node, n1")
        ranks = load(os.path.join(out, LAST)).get("ranks")
        expect(isinstance(ranks, list) and len(ranks) == 2, "the final checkpoint holds 2 ranks' state: both nodes met")
        return out

    @step("2. scancel --signal=TERM mid-run, then scontrol requeue: resumed, output kept")
    def scancel_and_requeue(self, full):
        jobid, out, output = self.submit("stopped")
        self.wait_for(lambda: os.path.exists(os.path.join(out, FIRST)), jobid, FIRST)
        self.slurm.run(["scancel", "--signal=TERM", jobid])
        j, text = self.ended(jobid, output)
        expect(j["ExitCode"] == "143:0", "the stopped job exits 143")
        stops = re.findall(r"start_training\.sh: the run stopped by SIGTERM after \d+ s: (\S+) holds it", text)
        expect(len(stops) == 2 and stops[0] == stops[1] and os.path.exists(stops[0]),
               "both nodes said their run stopped by SIGTERM and which checkpoint holds it (%s)" % (stops[:1],))
        ranks = load(stops[0]).get("ranks")
        expect(isinstance(ranks, list) and len(ranks) == 2, "that checkpoint holds both ranks' state")
        expect("stopped: status 143" in text, "the job's last line says it stopped, status 143")
        first = text
        self.slurm.run(["scontrol", "requeue", jobid])
        j, text = self.ended(jobid, output)
        expect(j["JobState"] == "COMPLETED" and j["ExitCode"] == "0:0", "the requeued job completed, exit 0")
        expect(text.startswith(first), "the requeue appended to the job's output: the first attempt's lines kept")
        expect("resumed from %s" % os.path.basename(stops[0]) in text, "the run resumed from that checkpoint")
        same(os.path.join(full, LAST), os.path.join(out, LAST))

    @step("3. the time limit: Slurm's warning stops the runs, the job requeues itself and resumes")
    def time_limit(self):
        # a run that never ends by itself: whatever the load, the warning comes during the run
        jobid, out, output = self.submit("timelimit", REQUEUE_AT_TIME_LIMIT="1", EXTRA_FLAGS=" ".join(
            f if not f.startswith("--num_train_steps=") else "--num_train_steps=1000000" for f in FLAGS))
        self.wait_for(lambda: os.path.exists(os.path.join(out, FIRST)), jobid, FIRST)
        # 10 minutes from the job's start: within the sbatch's --signal=B:USR1@600 at once, and
        # Slurm's periodic check (every 30 s) sends the warning
        self.slurm.run(["scontrol", "update", "JobId=%s" % jobid, "TimeLimit=10"])
        warned = "the time limit is near (SIGUSR1)"
        self.wait_for(lambda: warned in read(output), jobid, "Slurm's time-limit warning", timeout=90)
        # the next attempt gets the time to go on (each attempt starts the limit anew)
        self.slurm.run(["scontrol", "update", "JobId=%s" % jobid, "TimeLimit=60"])
        self.wait_for(lambda: "attempt 1:" in read(output), jobid, "the second attempt")
        first = read(output).split("attempt 1:", 1)[0]
        expect("stopped by the time limit: status 143" in first, "the first attempt stopped by the time limit, status 143")
        stops = re.findall(r"start_training\.sh: the run stopped by SIGTERM after \d+ s: \S+/model\.ckpt-(\d+)\.pt holds it",
                           first)
        expect(len(stops) == 2 and stops[0] == stops[1] and "requeueing job %s" % jobid in first,
               "both nodes said which checkpoint holds the run (model.ckpt-%s.pt), and the job requeued itself"
               % (stops[:1] or ["?"])[0])
        # the second attempt's first checkpoint follows the first attempt's last: resumed, not restarted
        before = {n: os.stat(os.path.join(out, n)).st_mtime_ns for n in os.listdir(out) if n.endswith(".pt")}
        new = lambda: sorted(int(re.search(r"(\d+)", n).group(1)) for n in os.listdir(out)  # noqa: E731
                             if re.match(r"model\.ckpt-\d+\.pt$", n) and before.get(n) != mtime(os.path.join(out, n)))
        self.wait_for(lambda: new(), jobid, "the second attempt's first checkpoint")
        k = int(stops[0])
        expect(k < new()[0] <= k + 3, "the second attempt resumed: its first checkpoint is model.ckpt-%d.pt (a run "
               "started over would write model.ckpt-3.pt first)" % new()[0])
        self.slurm.run(["scancel", "--signal=TERM", jobid])
        j, text = self.ended(jobid, output)
        expect(j["ExitCode"] == "143:0" and int(j["Restarts"]) == 1 and text.startswith(first),
               "stopped again (143); the requeue appended to the job's output: the first attempt's lines kept")

    @step("4. one node's rank killed with SIGKILL: the job ends and its status names it")
    def killed_rank(self):
        jobid, out, output = self.submit("killed")
        self.wait_for(lambda: os.path.exists(os.path.join(out, FIRST)), jobid, FIRST)
        rank = self.rank_pid(node=1)
        print("  SIGKILL to node 1's rank, pid %d" % rank, flush=True)
        os.kill(rank, signal.SIGKILL)
        t = time.time()
        j, text = self.ended(jobid, output, timeout=120)
        print("  the job ended %.0f s after the kill" % (time.time() - t))
        expect(j["ExitCode"] == "137:0", "the job's status is the killed rank's, 137 (128 + SIGKILL)")
        expect(re.search(r"node 1 failed first, with status 137", text) is not None,
               "the job's last line names node 1 and the status")
        deadline = time.time() + 60  # slurmstepd's end of the job's other processes: a loaded host is slow

        def job_left():
            return [p for p in self.slurm.marked_pids() if environ(p).get("SLURM_JOB_ID") == jobid]
        while job_left() and time.time() < deadline:
            time.sleep(0.2)
        left = job_left()
        expect(not left, "nothing of the job is left running (%s)" % ", ".join(cmdline(p) for p in left))

    @step("5. the finished job resubmitted (--ntasks-per-node=2): nothing to do on every node; with another flag: refused")
    def finished_resubmitted(self, full):
        # (slurm/: each job's node statuses, the sbatch's NODE_STATUS_DIR)
        files = lambda: {n: (os.stat(os.path.join(full, n)).st_size, mtime(os.path.join(full, n)))  # noqa: E731
                         for n in os.listdir(full) if n != "slurm"}
        before = files()
        # (SLURM_NTASKS=4 in the job: srun took it over its --ntasks-per-node=1, two tasks a node)
        jobid, out, output = self.submit("full", "--ntasks-per-node=2", "--cpus-per-task=1")
        j, text = self.ended(jobid, output)
        expect(j["JobState"] == "COMPLETED" and j["ExitCode"] == "0:0", "the resubmitted job completed, exit 0")
        said = re.findall(r"the run in %s finished earlier \(\w+, seed 7\): nothing to do" % re.escape(out), text)
        expect(len(said) == 2, "both nodes said the run finished earlier, nothing to do (%d lines)" % len(said))
        expect("STARTING TIMING RUN" not in text and "every node finished" in text,
               "no timing run started; the job's last line says every node finished")
        after = files()
        changed = sorted(n for n in set(before) | set(after) if before.get(n) != after.get(n))
        expect(not changed, "the finished run's files are untouched (%d files; changed: %s)" % (len(before), changed))
        jobid, out, output = self.submit("full", EXTRA_FLAGS=" ".join(
            f if not f.startswith("--num_warmup_steps=") else "--num_warmup_steps=5" for f in FLAGS))
        j, text = self.ended(jobid, output)
        refused = [l for l in text.splitlines() if "num_warmup_steps" in l and "finished" in l]
        expect(j["ExitCode"] == "2:0" and len(refused) == 2 and refused[0] == refused[1] and "(was 4)" in refused[0],
               "the job with another --num_warmup_steps exits 2, refused in one line a node naming the flag (%d: %s)"
               % (len(refused), refused[:1]))
        expect(files() == before, "the finished run's files are still untouched")

    @step("6. a series of 2 runs, the trainer's own seeds: stopped in run 1 (scancel --batch), requeued: run 0 kept, run 1 resumed")
    def series(self):
        jobid, out, output = self.submit("series", NUM_RUNS="2", SEED=None)
        self.wait_for(lambda: os.path.exists(os.path.join(out, "run_1", FIRST)), jobid, "run_1/" + FIRST)
        # the batch shell alone (its trap had noted the stop, the runs went on to their end)
        self.slurm.run(["scancel", "--batch", "--signal=TERM", jobid])
        j, first = self.ended(jobid, output)
        expect(j["ExitCode"] == "143:0", "the job stopped in run 1 exits 143")
        expect(re.search(r"run 0 of 2 finished \(\w+\) in \d+ s: %s" % re.escape(os.path.join(out, "result_0.txt")), first)
               and "run 0 of 2 finished on node 1; node 0 keeps its log as result_0.txt" in first,
               "run 0 finished on both nodes, node 0 keeps its log as result_0.txt")
        stops = re.findall(r"run 1 of 2 stopped by SIGTERM after \d+ s: (\S+) holds it", first)
        expect(len(stops) == 2 and stops[0] == stops[1] and stops[0].startswith(os.path.join(out, "run_1", "")),
               "both nodes said run 1 stopped by SIGTERM and which checkpoint holds it (%s)" % (stops[:1],))
        self.slurm.run(["scontrol", "requeue", jobid])
        j, text = self.ended(jobid, output)
        expect(j["JobState"] == "COMPLETED" and j["ExitCode"] == "0:0" and text.startswith(first),
               "the requeued job completed, exit 0, its output appended to the first attempt's")
        again = text[len(first):]
        expect("run 0 of 2 finished earlier" in again and "STARTING TIMING RUN" in again
               and "resumed from %s" % os.path.basename(stops[0]) in again,
               "run 0 was not run again; run 1 resumed from %s" % os.path.basename(stops[0]))
        ends = re.findall(r"the series of 2 runs in %s is finished \(seeds (\d+) (\d+)\)" % re.escape(out), again)
        expect(len(ends) == 2 and ends[0] == ends[1] and ends[0][0] != ends[0][1],
               "both nodes said the series finished, with the same two seeds, distinct (%s)" % (ends[:1],))
        for i in (0, 1):
            result = os.path.join(out, "result_%d.txt" % i)
            expect(os.path.exists(result) and read(result) == read(os.path.join(out, "run_%d" % i, "mlperf.log"))
                   and '"key": "seed", "value": %s,' % ends[0][i] in read(result),
                   "result_%d.txt is run %d's log, its seed %s" % (i, i, ends[0][i]))
            ranks = load(os.path.join(out, "run_%d" % i, LAST)).get("ranks")
            expect(isinstance(ranks, list) and len(ranks) == 2, "run %d's final checkpoint holds 2 ranks' state" % i)

    @step("7. a job array of two one-node tasks at once: each task's run its own, both finish")
    def array(self):
        jobid, out, _ = self.submit("array", "--array=0-1", "--nodes=1")
        for t in (0, 1):
            j = self.slurm.wait_job("%s_%d" % (jobid, t), JOB_TIMEOUT)
            text = read("%s/array-%s.out" % (self.dir, j["JobId"]))
            expect(j["JobState"] == "COMPLETED" and j["ExitCode"] == "0:0" and "every node finished" in text,
                   "array task %d completed, exit 0 (%s %s, %s)" % (t, j["JobState"], j["ExitCode"],
                                                                  text.rstrip().splitlines()[-1:]))
            log = read(os.path.join(out, "array_%d" % t, "mlperf.log"))
            expect('"key": "seed", "value": %d,' % (7 + t) in log,
                   "task %d ran in %s/array_%d with seed %d" % (t, os.path.basename(out), t, 7 + t))

    def rank_pid(self, node):
        """The trainer rank of the node (RANK in its environment; its loader worker is its child)."""
        found = {}
        for pid in self.slurm.marked_pids():
            env = environ(pid)
            if env.get("SLURM_NODEID") == str(node) and "RANK" in env and "TORCHELASTIC_RUN_ID" in env:
                found[pid] = ppid(pid)
        ranks = [p for p, parent in found.items() if parent not in found]
        if len(ranks) != 1:
            raise Failed("node %d: %d trainer ranks found (%s)" % (node, len(ranks), ranks))
        return ranks[0]

    def run(self):
        t0 = time.time()
        self.tmp = os.path.join(self.dir, "tmp")
        os.makedirs(self.tmp)
        step("set up: data, a two-node Slurm (munged, slurmctld, slurmd n1 and n2)")(self.setup)()
        self.exports()
        full = self.unstopped()
        self.scancel_and_requeue(full)
        self.time_limit()
        self.killed_rank()
        self.finished_resubmitted(full)
        self.series()
        self.array()
        return time.time() - t0

    def setup(self):
        if PYXIS_IMAGE:
            self.slurm.spank = [pyxis_plugin()]
            print("pyxis: %s, image %s" % (self.slurm.spank[0], PYXIS_IMAGE), flush=True)
        self.make_data()
        self.slurm.start()
        print(self.slurm.run(["sinfo", "-N"]).stdout, flush=True)


def load(path):
    import torch
    return torch.load(path, map_location="cpu", weights_only=False)


def same(a_path, b_path):
    """The two checkpoints' model and optimizer, bit for bit."""
    for part in differing_parts(a_path, b_path):
        raise Failed("%s: %s differs from the unstopped run's %s" % (b_path, part, a_path))
    expect(True, "%s is bit-identical to the unstopped run's (model and optimizer)" % os.path.basename(b_path))


def read(path):
    with open(path, errors="replace") as f:
        return f.read()


def mtime(path):
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def proc_state(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "?"


def wchan(pid):
    try:
        with open("/proc/%d/wchan" % pid) as f:
            return f.read().strip() or "-"
    except OSError:
        return "?"


def environ(pid):
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            return dict(v.decode(errors="replace").partition("=")[::2] for v in f.read().split(b"\0") if b"=" in v)
    except OSError:
        return {}


def ppid(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return None


def cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def main():
    scratch = tempfile.mkdtemp(prefix="slurm_test.")
    test = Test(scratch)
    ok = False
    t0 = time.time()
    try:
        test.run()
        ok = True
    except (Failed, local_slurm.SlurmError) as e:
        print("\nslurm test FAILED: %s" % e)
    except Exception:  # a bug of the test's own: its traceback, and the daemons stopped all the same
        traceback.print_exc()
    finally:
        if not ok:
            for name in ("slurmctld", "slurmd.n1", "slurmd.n2"):
                print("-- %s (last lines)\n%s" % (name, test.slurm.tail(name, 15)))
        left = test.slurm.stop()
        print("\ndaemons stopped (%s)%s" % (", ".join("%s %d" % kv for kv in test.slurm.pids.items()),
                                            "; killed what was left: %s" % left if left else ""))
        report(t0, 80)
        if ok and os.environ.get("SLURM_TEST_KEEP") != "1":
            shutil.rmtree(scratch, ignore_errors=True)
        else:
            print("scratch folder kept: %s" % scratch)
    print("slurm test%s %s" % (" (pyxis: %s)" % PYXIS_IMAGE if PYXIS_IMAGE else "", "PASSED" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
