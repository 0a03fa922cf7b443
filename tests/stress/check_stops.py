"""``make stop-stress``: start_training.sh stopped by signals at random moments, as schedulers stop it
(not part of ``make test``: minutes; the sweep that found issue 45's wrong stop verdicts).

    .venv/bin/python tests/stress/check_stops.py [--trials=20] [--seed=N]

Each trial runs the real trainer through start_training.sh (a tiny BERT on the reference's s128
records of tests/data, 24 micro-steps, a checkpoint every 6, one loader worker a rank), with a
setting drawn at random: 1 rank or 2 (the torchrun wrapper), one run or a series of 2 (NUM_RUNS),
SIGTERM or SIGINT. After a random delay (up to the time the same setting took unstopped, measured
first) it sends the signal 1 to 3 times, at random spacings, to the whole process group (as
`kill -TERM -PGID`, systemd or Slurm's linuxproc do), then reruns the same command. Every trial
must show:

- a status that says what happened: 0 only for a series that finished, and not after a signal sent
  before its run_start (a stop in the untimed init ends the run at once); 143 (130 after SIGINT)
  only where a checkpoint of the stopped run, or a finished earlier run of the series, holds
  what was done; 79 only where the stopped run has no checkpoint;
- no Python traceback, no error of bash's own ("start_training.sh: line N: ..."), and no hang (300 s);
- the rerun exits 0 and every run's final checkpoint is bit-identical to that of the same setting
  never stopped; a series keeps each run's log as result_N.txt, equal to the run's own log.

Prints one line per trial (the setting, the delay and signals, the status and the launcher's
first line), a table of the outcomes, each failure with the output's end; exits 1 after a failure.
The scratch folder is removed after a pass (kept after a failure, and with STOP_STRESS_KEEP=1).
"""
import argparse
import collections
import glob
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(HERE))
from stepped import differing_parts, tiny_data  # noqa: E402

START = os.path.join(ROOT, "start_training.sh")
STEPS = 24


def command(d):
    return [START, "--preset=demo_cpu", "--bert_config_file=%s/config.json" % d, "--max_seq_length=128",
            "--max_predictions_per_seq=20", "--train_batch_size=4", "--num_train_steps=%d" % STEPS,
            "--save_checkpoints_steps=6", "--num_workers=1", "--target_mlm_accuracy=1.0", "--eval_batch_size=8",
            "--eval_frequency=48", "--noprogress"]


def environment(d, gpus, runs, out):
    env = {k: v for k, v in os.environ.items() if k not in ("SEED", "NUM_RUNS", "LOGDIR", "DATA_DIR", "PRESET")}
    env.update(INPUT_FILES=os.path.join(d, "train.tfrecord"), EVAL_FILE=os.path.join(d, "eval.tfrecord"),
               PYTHON=sys.executable, DROP_CACHES="0", CHECK_LOG="0", OMP_NUM_THREADS="1", NUM_GPUS=str(gpus),
               SEED="7", NUM_RUNS=str(runs), OUTPUT_DIR=out, TMPDIR=os.path.join(d, "tmp"))
    return env


def run_dir(out, runs, i):
    return os.path.join(out, "run_%d" % i) if runs > 1 else out


def run_start_time(log):
    """The time (s since the epoch) of the first run_start in MLPerf log ``log``, or None."""
    from mlperf_bert.errors import UserError
    from mlperf_bert.harness.records import read_log
    try:
        return next((r.time_ms / 1000.0 for r in read_log(log) if r.key == "run_start"), None)
    except (OSError, UserError):
        return None


def verdict(status, sig, out, runs, text, signalled=None):
    """What is wrong with how a stopped start_training.sh ended (a list, empty when nothing is);
    ``signalled``: when the first signal was sent (time.time())."""
    stopped = 128 + sig
    started = [i for i in range(runs) if os.path.exists(run_dir(out, runs, i))]
    current = max(started) if started else 0
    checkpoints = glob.glob(os.path.join(run_dir(out, runs, current), "model.ckpt-*.pt"))
    finished = [i for i in range(runs) if os.path.exists(os.path.join(run_dir(out, runs, i), "run_finished.json"))]
    wrong = []
    if status not in (0, stopped, 79):
        wrong.append("status %s (0, %d or 79 expected)" % (status, stopped))
    if status == 0 and len(finished) < runs:
        wrong.append("status 0 but runs %s did not finish" % sorted(set(range(runs)) - set(finished)))
    started_at = run_start_time(os.path.join(run_dir(out, runs, 0), "mlperf.log"))
    if status == 0 and signalled is not None and started_at is not None and signalled < started_at:
        # a stop in the untimed init ends the run at once: a series that then finished lost the signal
        wrong.append("status 0 (finished) though the signal came %.2f s before run 0's run_start" % (
            started_at - signalled))
    if status == stopped and not checkpoints and not (finished and " before run " in text):
        wrong.append("status %d without a checkpoint of run %d or a finished run before it" % (status, current))
    if status == 79 and checkpoints:
        wrong.append("status 79 (nothing saved) beside %s" % os.path.basename(sorted(checkpoints)[-1]))
    if "Traceback" in text:
        wrong.append("a traceback")
    if re.search(r"^\S*(start_training|train_model)\.sh: (\S+: )?line \d+: ", text, re.M):
        wrong.append("an error of bash's own")  # (bash 5.2 misreads a `$(...)` while a trap runs)
    return wrong


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=20, help="stopped runs, each rerun")
    ap.add_argument("--seed", type=int, default=None, help="the draws' seed [random, printed]")
    args = ap.parse_args()
    if args.trials < 1:
        print("error: check_stops.py: --trials=%d: give 1 or more" % args.trials, file=sys.stderr)
        return 2
    # Started as a background job of a shell without job control (`make stop-stress &`, a CI step),
    # this process has SIGINT ignored, and so would each start_training.sh: bash cannot trap a signal
    # ignored at its entry, so a SIGINT before the trainer set its handler was lost (the run finished,
    # status 0). The trials are a terminal's Ctrl-C: a handler of our own is the default in each child.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    work = tempfile.mkdtemp(prefix="stop_stress.")
    os.makedirs(os.path.join(work, "tmp"))
    print("check_stops.py: %d trials, seed %d, in %s" % (args.trials, seed, work), flush=True)
    tiny_data(os.path.join(work, "train.tfrecord"), os.path.join(work, "eval.tfrecord"),
              os.path.join(work, "config.json"), eval_records=16)
    reference, outcomes, failures = {}, collections.Counter(), []
    t0 = time.time()
    for k in range(args.trials):
        gpus, runs, sig = rng.choice((1, 2)), rng.choice((1, 2)), rng.choice((signal.SIGTERM, signal.SIGINT))
        if (gpus, runs) not in reference:  # the same setting never stopped
            out, started = os.path.join(work, "reference_%d_%d" % (gpus, runs)), time.time()
            proc = subprocess.run(command(work), env=environment(work, gpus, runs, out), cwd=ROOT,
                                  capture_output=True, text=True, timeout=600)
            if proc.returncode:
                print("error: check_stops.py: the unstopped run (NUM_GPUS=%d NUM_RUNS=%d) failed with status %d:\n%s"
                      % (gpus, runs, proc.returncode, (proc.stdout + proc.stderr)[-3000:]), file=sys.stderr)
                return 1
            reference[gpus, runs] = out, time.time() - started
        out = os.path.join(work, "trial_%d" % k)
        env = environment(work, gpus, runs, out)
        proc = subprocess.Popen(command(work), env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
        delay, count = rng.uniform(0, reference[gpus, runs][1]), rng.choice((1, 1, 2, 3))
        time.sleep(delay)
        sent, signalled = 0, None
        for _ in range(count):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            signalled = signalled or time.time()  # (just after: the first signal was sent by then)
            sent += 1
            time.sleep(rng.choice((0, 0.001, 0.05, 0.3, 1.0)))
        try:
            stdout, stderr = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
            wrong = ["a hang: no end 300 s after the signals (killed)"]
        else:
            wrong = verdict(proc.returncode, sig, out, runs, stdout + stderr, signalled)
        status = proc.returncode
        again = subprocess.run(command(work), env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
        if again.returncode:
            wrong.append("the rerun ended with status %d: %s"
                         % (again.returncode, (again.stdout + again.stderr)[-500:]))
        else:
            for i in range(runs):
                final = "model.ckpt-%d.pt" % STEPS
                for part in differing_parts(os.path.join(run_dir(reference[gpus, runs][0], runs, i), final),
                                            os.path.join(run_dir(out, runs, i), final)):
                    wrong.append("run %d's final %s differs from the unstopped run's" % (i, part))
                if runs > 1 and open(os.path.join(out, "result_%d.txt" % i)).read() != \
                        open(os.path.join(run_dir(out, runs, i), "mlperf.log")).read():
                    wrong.append("result_%d.txt is not run %d's log" % (i, i))
        first = next((line for line in (stdout + stderr).splitlines()
                      if line.startswith(("start_training.sh", "error", "SIGTERM", "SIGINT"))), "")
        first = first.split(" after ")[0].split(" in ")[0][:90]
        outcomes[(status, first, bool(wrong))] += 1
        print("trial %d: NUM_GPUS=%d NUM_RUNS=%d %s x%d at %.2f s -> %s %s%s"
              % (k, gpus, runs, sig.name, sent, delay, status, first, "  WRONG: " + "; ".join(wrong) if wrong else ""),
              flush=True)
        if wrong:
            failures.append((k, wrong, stdout[-1500:], stderr[-1500:]))
        else:
            shutil.rmtree(out, ignore_errors=True)
    print("\n%d trials in %.0f s (seed %d):" % (args.trials, time.time() - t0, seed))
    for (status, first, bad), n in sorted(outcomes.items(), key=str):
        print("  %3d x status %s%s: %s" % (n, status, " WRONG" if bad else "", first))
    for k, wrong, stdout, stderr in failures:
        print("\ntrial %d: %s\n--- stdout\n%s\n--- stderr\n%s" % (k, "; ".join(wrong), stdout, stderr))
    if failures or os.environ.get("STOP_STRESS_KEEP") == "1":
        print("kept: %s" % work)
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
