"""start_training.sh and the image's entrypoint: seeds, stops, failures, finished runs and series.

A stand-in trainer (bash) records what it was given and exits as told, so these run in seconds;
tests/test_launchers.py runs the real trainer through start_training.sh.
"""
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
START = os.path.join(ROOT, "start_training.sh")
TRAIN = os.path.join(ROOT, "train_model.sh")
ENTRY = os.path.join(ROOT, "docker-entrypoint.sh")

# Stands in for train_model.sh: records SEED and its arguments, logs the seed it runs with as
# the trainer does (a random one when SEED is unset), at its first start cache_clear (as
# MLPERF_CACHE_CLEARED says) and run_start at 1 s, writes a checkpoint, and then either waits
# for SIGTERM (FAKE_WAIT names the run folder that waits), fails with FAKE_STATUS, or finishes
# (run_stop at 80.3 s).
FAKE = r"""#!/usr/bin/env bash
logline() {  # TIME_MS KEY VALUE
  echo ':::MLLOG {"namespace": "", "time_ms": '"$1"', "event_type": "POINT_IN_TIME", "key": "'"$2"'", "value": '"$3"', "metadata": {"file": "t.py", "lineno": 1}}' >> "$LOGDIR/mlperf.log"
}
echo "${SEED:-unset} $*" >> "$FAKE_RECORD"
mkdir -p "$OUTPUT_DIR"
seed="${SEED:-$((4000 + RANDOM % 1000))}"
first=1; grep -qs '"key": "run_start"' "$LOGDIR/mlperf.log" && first=
# FAKE_NO_LOG: a node other than rank 0's, whose local disk gets no log
if [[ -z "${FAKE_NO_LOG:-}" ]]; then
  logline 1 seed "$seed"
  if [[ -n "$first" ]]; then
    cleared=false; [[ "${MLPERF_CACHE_CLEARED:-}" == True ]] && cleared=true
    logline 1 cache_clear "$cleared"
    logline 1000 run_start null
  fi
fi
touch "$OUTPUT_DIR/model.ckpt-3.pt" "$OUTPUT_DIR/model.ckpt-12.pt"
if [[ "$(basename "$OUTPUT_DIR")" == "${FAKE_WAIT:-none}" ]]; then
  sleep 60 &
  trap 'kill $!; touch "$OUTPUT_DIR/model.ckpt-15.pt"; echo "SIGTERM: checkpoint model.ckpt-15.pt written"; exit 143' TERM
  touch "$OUTPUT_DIR/ready"
  wait
  exit 0
fi
if [[ -n "${FAKE_LOCKED:-}" ]]; then  # another start's trainer takes the folder's lock meanwhile
  ( exec 9>>"$OUTPUT_DIR/.mlperf_bert.lock"; flock -n 9; echo $BASHPID > "$FAKE_LOCKED.tmp"
    mv "$FAKE_LOCKED.tmp" "$FAKE_LOCKED"; exec sleep 60 ) </dev/null >/dev/null 2>&1 &  # (not the test's pipes)
  until [[ -e "$FAKE_LOCKED" ]]; do sleep 0.05; done
fi
(( ${FAKE_STATUS:-0} )) && exit "$FAKE_STATUS"
logline 80300 run_stop null
# FAKE_FINISHED: the end marker the trainer writes (a launch record's)
finished='{"status": "success", "global_step": 30, "samples": 120}'
echo "${FAKE_FINISHED:-$finished}" > "$OUTPUT_DIR/run_finished.json"
"""


@pytest.fixture
def fake(tmp_path):
    script = tmp_path / "fake_train.sh"
    script.write_text(FAKE)
    script.chmod(0o755)
    record = tmp_path / "record.txt"
    env = {k: v for k, v in os.environ.items() if k not in ("SEED", "NUM_RUNS", "LOGDIR", "INPUT_FILES")}
    env.update(DATA_DIR=str(tmp_path), OUTPUT_DIR=str(tmp_path / "out"), TRAIN_MODEL=str(script),
               PYTHON=sys.executable, DROP_CACHES="0", CHECK_LOG="0", FAKE_RECORD=str(record))

    def run(*args, **extra):
        return subprocess.run([START, *args], capture_output=True, text=True, env=dict(env, **extra), cwd=ROOT,
                              timeout=120)
    run.env, run.out, run.record = env, tmp_path / "out", record
    return run


def calls(fake):
    return fake.record.read_text().splitlines() if fake.record.exists() else []


def result_lines(proc):
    return [line for line in proc.stdout.splitlines() if line.startswith("RESULT,")]


@pytest.mark.parametrize("seed,expected", [("010", ["10", "11"]), ("08", ["8", "9"]), ("7", ["7", "8"])])
def test_seed_is_decimal(fake, seed, expected):
    proc = fake("--preset=demo_cpu", SEED=seed, NUM_RUNS="2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [c.split()[0] for c in calls(fake)] == expected
    assert [r.split(",")[2] for r in result_lines(proc)] == expected


@pytest.mark.parametrize("name,value", [("SEED", "abc"), ("SEED", "-1"), ("SEED", "1e3"), ("NUM_RUNS", "0"),
                                        ("NUM_RUNS", "two"), ("NUM_RUNS", "101"), ("NUM_RUNS", "100000"),
                                        ("NUM_RUNS", ""), ("DROP_CACHES", "yes"), ("CHECK_ONLY", "yes"),
                                        ("CHECK_LOG", "yes")])
def test_bad_settings_are_one_line(fake, name, value):
    proc = fake("--preset=demo_cpu", **{name: value})
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: start_training.sh: %s=%s" % (name, value)), proc.stderr
    assert not calls(fake)


@pytest.mark.parametrize("flag,variable", [("--seed=3", "SEED"), ("--output_dir=/tmp/x", "OUTPUT_DIR"),
                                           ("--mlperf_log=/tmp/x.log", "LOGDIR"), ("--seed", "SEED")])
def test_flags_it_sets_for_each_run_are_refused_with_their_variable(fake, flag, variable):
    """A trainer flag start_training.sh sets for each run, given on its command line, won over its own
    (the user's flags do): --seed=3 gave every run of a series seed 3 ("seeds 3 3"; the package
    checker fails a set whose runs log one seed, and the rerun refused run 1: "finished earlier with
    seed 3, not SEED=4"); --output_dir put the runs where it did not look for their checkpoints and
    state. One line naming the variable that sets it, before any run."""
    proc = fake("--preset=demo_cpu", flag, NUM_RUNS="2")
    assert proc.returncode == 2 and proc.stdout == "" and not calls(fake), proc.stdout + proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: start_training.sh: %s: set %s instead (" % (flag, variable))


def test_a_flag_file_is_refused_by_both_launchers(fake):
    """absl reads --flagfile where it stands, after the --seed=SEED the launchers give: a file's
    --seed=3 gave every run of a series seed 3, unseen by the checks of --seed above (and its
    --output_dir, and train_model.sh's closed-division checks). One line each, before any run."""
    flagfile = fake.out.parent / "flags.txt"
    flagfile.write_text("--seed=3\n")
    from mlperf_bert import flags
    fv = flags.FlagValues()
    flags.DEFINE_integer("seed", None, "", flag_values=fv)
    flags.parse(fv, ["run_pretraining.py", "--seed=4", "--flagfile=%s" % flagfile])
    assert fv.seed == 3  # the trainer's parsing: the file's seed beats the launcher's
    proc = fake("--preset=demo_cpu", "--flagfile=%s" % flagfile, NUM_RUNS="2", SEED="4")
    assert proc.returncode == 2 and proc.stdout == "" and not calls(fake), proc.stdout + proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: start_training.sh: --flagfile=%s: give the file's flags "
                                                   "as arguments instead" % flagfile), proc.stderr
    proc = subprocess.run([os.path.join(ROOT, "train_model.sh"), "--dry_run", "--preset=demo_cpu",
                           "--flagfile=%s" % flagfile], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout + proc.stderr
    assert proc.stderr.startswith("error: train_model.sh: --flagfile=%s: give the file's flags as arguments" % flagfile)
    assert len(proc.stderr.splitlines()) == 1, proc.stderr


@pytest.mark.parametrize("name,text", [("c.toml", "seed = 7\n"), ("c.toml", "[runtime]\nseed = 7\n"),
                                       ("c.json", '{"runtime": {"seed": 7}}')])
def test_a_config_files_seed_is_refused_as_the_flag_is(fake, name, text):
    """A --config file's seed won where no --seed came (SEED unset): every run of a series had it
    ("seeds 7 7"). One line naming the file and SEED, before any run, in a table or not."""
    conf = fake.out.parent / name
    conf.write_text(text)
    proc = fake("--preset=demo_cpu", "--config=%s" % conf, NUM_RUNS="2")
    assert proc.returncode == 2 and proc.stdout == "" and not calls(fake), proc.stdout + proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: start_training.sh: --config=%s sets seed: " % conf)
    assert "set SEED instead" in lines[0]


@pytest.mark.parametrize("text,error", [('{"seed": null, "learning_rate": 0.01}', None),
                                        ('{"sed": 7}', "unknown key sed (did you mean seed?)")])
def test_a_config_file_without_a_seed_runs_and_a_bad_one_is_one_line(fake, text, error):
    conf = fake.out.parent / "c.json"
    conf.write_text(text)
    proc = fake("--preset=demo_cpu", "--config=%s" % conf, NUM_RUNS="2")
    if error is None:
        assert proc.returncode == 0 and len(calls(fake)) == 2, proc.stdout + proc.stderr
    else:
        assert proc.returncode == 2 and not calls(fake), proc.stdout + proc.stderr
        assert proc.stderr == "error: start_training.sh: --config %s: %s\n" % (conf, error)


def test_a_positional_argument_is_refused_before_the_run(fake):
    proc = fake("--preset=demo_cpu", "bash")
    assert proc.returncode == 2 and "unexpected argument 'bash'" in proc.stderr and not calls(fake)
    assert "STARTING" not in proc.stdout


def test_result_line_has_the_seed_the_run_used(fake):
    proc = fake("--preset=demo_cpu")  # SEED unset: the trainer draws one and logs it
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (result,) = result_lines(proc)
    logged = (fake.out / "mlperf.log").read_text().split('"value": ')[1].split(",")[0]
    assert result.split(",")[2] == logged and 4000 <= int(logged) < 5000, result


def _start_and_wait(fake, ready, **extra):
    proc = subprocess.Popen([START, "--preset=demo_cpu"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(fake.env, **extra), cwd=ROOT)
    deadline = time.time() + 60
    while not ready.exists():
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.05)
    return proc


def test_a_stopped_run_says_where_it_is_and_is_not_checked(fake):
    proc = _start_and_wait(fake, fake.out / "ready", FAKE_WAIT="out", CHECK_LOG="1")
    proc.send_signal(signal.SIGTERM)  # docker stop: SIGTERM to the container's process 1
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, out + err
    lines = out.splitlines()
    assert lines[0].startswith("STARTING TIMING RUN AT") and lines[1] == "SIGTERM: checkpoint model.ckpt-15.pt written"
    # one line of its own: stopped, the newest checkpoint (by step, not by name), the same command
    assert lines[2:] == ["start_training.sh: the run stopped by SIGTERM after %s s: %s holds it; rerun the same "
                         "command to resume" % (lines[2].split("after ")[1].split(" s")[0],
                                                fake.out / "model.ckpt-15.pt")], out
    assert err == ""


def test_sigint_reaches_a_child_that_ignores_it_as_sigterm_and_exits_130(fake):
    """A child that has not installed its handlers (bash, the trainer's imports) ignores SIGINT,
    as a background job does: the SIGTERM after it stops it."""
    proc = _start_and_wait(fake, fake.out / "ready", FAKE_WAIT="out")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "SIGTERM: checkpoint model.ckpt-15.pt written" in out, out + err
    assert "stopped by SIGINT" in out and "RESULT" not in out


# A trainer's stand-in that handles SIGINT and SIGTERM: a SIGINT among them names the stop. (Which came
# first is not seen: both pending, Linux runs the later-numbered C handler first, and CPython runs a
# Python handler for a signal that comes while the first's is about to run inside it, first.)
FAKE_PY = """#!%s
import os, signal, sys, time
got = []
for s in (signal.SIGINT, signal.SIGTERM):
    signal.signal(s, lambda signum, frame: got.append(signal.Signals(signum)))
out = os.environ["OUTPUT_DIR"]
os.makedirs(out, exist_ok=True)
open(os.path.join(out, "ready"), "w").close()
deadline = time.time() + 30
while len(set(got)) < 2 and time.time() < deadline:  # the second signal (or, missing, a line without it)
    time.sleep(0.05)
got.sort()  # SIGINT (2) first
open(os.path.join(out, "signals.txt"), "w").write(" ".join(s.name for s in got))
open(os.path.join(out, "model.ckpt-15.pt"), "w").close()
print("%%s: checkpoint model.ckpt-15.pt written" %% got[0].name, flush=True)
sys.exit(128 + got[0])
""" % sys.executable


def test_sigint_is_passed_on_as_sigint_and_named(fake, tmp_path):
    """Issue 37 (13): SIGINT went on to the trainer as SIGTERM, so the run said "SIGTERM: checkpoint
    ..." after a Ctrl-C. It goes on as SIGINT, then SIGTERM: the trainer gets both and names the SIGINT."""
    script = tmp_path / "fake_train.py"
    script.write_text(FAKE_PY)
    script.chmod(0o755)
    proc = subprocess.Popen([START, "--preset=demo_cpu"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(fake.env, TRAIN_MODEL=str(script)), cwd=ROOT)
    deadline = time.time() + 60
    while not (fake.out / "ready").exists():
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, out + err
    assert (fake.out / "signals.txt").read_text() == "SIGINT SIGTERM"
    assert out.splitlines()[1:] == [
        "SIGINT: checkpoint model.ckpt-15.pt written",
        "start_training.sh: the run stopped by SIGINT after %s s: %s holds it; rerun the same command to resume"
        % (out.split("after ")[1].split(" s")[0], fake.out / "model.ckpt-15.pt")], out


# Trainers that a SIGTERM stops: without a checkpoint, one the signal kills (before its handlers: bash
# says 143) and one that fails on it (a rank killed past torchrun's shutdown timeout: 137)
NOT_SAVED_TRAINERS = {
    "killed": 'mkdir -p "$OUTPUT_DIR"; touch "$OUTPUT_DIR/ready"; exec sleep 60',
    "failed": "mkdir -p \"$OUTPUT_DIR\"; trap 'kill $!; exit 137' TERM; sleep 60 & touch \"$OUTPUT_DIR/ready\"; wait",
    # torchrun stopped before it started the ranks (79), in a run a checkpoint holds: that is a stop
    "resumable": "mkdir -p \"$OUTPUT_DIR\"; touch \"$OUTPUT_DIR/model.ckpt-6.pt\"; trap 'kill $!; exit 79' TERM; "
                 "sleep 60 & touch \"$OUTPUT_DIR/ready\"; wait",
}


@pytest.mark.parametrize("trainer", sorted(NOT_SAVED_TRAINERS))
def test_a_stops_status_is_143_only_when_a_checkpoint_holds_the_run(fake, tmp_path, trainer):
    """Issue 45: a stop after which no checkpoint holds the run said "stopped by SIGTERM ... before its
    first checkpoint" and exited 143, which says "a checkpoint holds it, resume" (a script that
    resubmits on 143 looped); a trainer that failed while stopping exited 143 too. Now: the
    NOT_SAVED_STATUS and a line saying nothing was saved, or the failure's own status and line; a
    NOT_SAVED_STATUS stop of a run a checkpoint holds is 143."""
    from mlperf_bert.trainer.launch import NOT_SAVED_STATUS
    script = tmp_path / "trainer.sh"
    script.write_text("#!/usr/bin/env bash\n" + NOT_SAVED_TRAINERS[trainer] + "\n")
    script.chmod(0o755)
    proc = _start_and_wait(fake, fake.out / "ready", TRAIN_MODEL=str(script))
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    lines = out.splitlines()[1:]
    elapsed = out.split("after ")[1].split(" s")[0]
    if trainer == "killed":
        assert proc.returncode == NOT_SAVED_STATUS == 79, out + err
        assert lines == ["start_training.sh: the run stopped by SIGTERM after %s s, before its first checkpoint: "
                         "nothing saved (exit 79, not 143); rerun the same command to start it again" % elapsed], out
    elif trainer == "failed":
        assert proc.returncode == 137, out + err
        assert lines == ["start_training.sh: the run failed with status 137 after %s s (see above; 137 = 128 + "
                         "SIGKILL)" % elapsed], out
    else:
        assert proc.returncode == 143, out + err
        assert lines == ["start_training.sh: the run stopped by SIGTERM after %s s: %s holds it; rerun the same "
                         "command to resume" % (elapsed, fake.out / "model.ckpt-6.pt")], out
    # the shell's NOT_SAVED is the launcher's
    assert "\nNOT_SAVED=%d\n" % NOT_SAVED_STATUS in open(START).read()


NODE0_TELLS = ("this node's OUTPUT_DIR holds no checkpoint (rank 0 on node 0 writes them): node 0's status says "
               "whether one holds the run (exit 79 here); rerun the same command on every node")


def test_a_stop_without_a_checkpoint_on_a_node_other_than_0_says_node_0_tells(fake, tmp_path):
    """A stop of a run of two nodes, whose node 1 has an OUTPUT_DIR of its own (a local disk: rank 0
    on node 0 writes the checkpoints, node 0's may hold the run): node 1 said "before its first
    checkpoint: nothing saved". Its status is still 79 (the Slurm job takes node 0's 143 over it); its
    line says its folder cannot tell and node 0's status does. Node 0 says nothing saved, as before."""
    script = tmp_path / "trainer.sh"
    script.write_text("#!/usr/bin/env bash\n" + NOT_SAVED_TRAINERS["killed"] + "\n")
    script.chmod(0o755)
    for node in ("1", "0"):
        (fake.out / "ready").unlink(missing_ok=True)
        proc = _start_and_wait(fake, fake.out / "ready", TRAIN_MODEL=str(script), NODE_RANK=node, NNODES="2")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        elapsed = out.split("after ")[1].split(" s")[0]
        said = ("nothing saved (exit 79, not 143); rerun the same command to start it again" if node == "0"
                else NODE0_TELLS)
        assert proc.returncode == 79, out + err
        assert out.splitlines()[1:] == ["start_training.sh: the run stopped by SIGTERM after %s s%s: %s" % (
            elapsed, ", before its first checkpoint" if node == "0" else "", said)], out


# Stand-ins for a trainer that a scheduler's SIGTERM has reached: they ignore the signals that
# follow (as the trainer, checkpointing, acts on the first only) and end on their own once the storm
# below has begun. "stopped": checkpointed, 143; "finished": a run that ended at the same moment.
STORM_TRAINERS = {
    "stopped": "touch \"$OUTPUT_DIR/model.ckpt-16.pt\"; touch \"$OUTPUT_DIR/ready\"; sleep 0.3; "
               "echo 'SIGTERM: checkpoint model.ckpt-16.pt written'; exit 143",
    "finished": "logline 1 seed 5; logline 1000 run_start null; touch \"$OUTPUT_DIR/ready\"; sleep 0.3; "
                "logline 80300 run_stop null; "
                "echo '{\"status\": \"success\", \"global_step\": 30, \"samples\": 120}' "
                "> \"$OUTPUT_DIR/run_finished.json\"",
}
# The log checker's stand-in (PYTHON for `-m mlperf_bert check-log`): a check that would pass, long
# enough for the storm to reach it, under cli.run_main as every command of ours (which catches SIGTERM)
CHECK_STOPPED = "error: terminated (SIGTERM); finished outputs are kept, rerun the same command to go on"
STORM_PYTHON = """#!/usr/bin/env bash
if [[ "$*" == *" check-log "* ]]; then
  exec %s -c 'import time; from mlperf_bert.cli import run_main
run_main(lambda argv: time.sleep(0.5) or print("check-log: PASSED") or 0)'
fi
exec %s "$@"
""" % (sys.executable, sys.executable)


def _storm(proc, ready, period=0.0005):
    """SIGTERM to ``proc``'s process group (a session of its own) once ``ready`` exists, then every
    ``period`` s until the group's leader has ended: a signal at every moment of its end, as a
    scheduler's second SIGTERM may come at any one (srun's --kill-on-bad-exit after another node's
    task ended 143; a second scancel). The number sent."""
    deadline = time.time() + 60
    while not ready.exists():
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.01)
    sent = 0
    while proc.poll() is None and time.time() < deadline:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            break
        sent += 1
        time.sleep(period)
    return sent


def test_a_signal_as_the_script_starts_ignoring_signals_leaves_no_bash_warning(tmp_path):
    """`make test` failed once: the storm of the test below reached start_training.sh as it set `trap ''`
    after a trainer's end, and bash wrote "line 187: warning: run_pending_traps: bad value in
    trap_list[15]: 0x1" beside the run's one line (a SIGTERM caught just before the ignore, left pending).
    The script's own on_signal and ignore_signals (read from it), switched back and forth under SIGTERM
    every 0.1 ms for 0.3 s: nothing on stderr (before the fix: thousands of warnings in a second)."""
    with open(START) as f:
        script = f.read()
    ignore = script[script.index("\nignore_signals() {"):].split("\n")[1]
    on_signal = script[script.index("\non_signal() {"):].split("\n}\n")[0]
    functions = ignore + on_signal + "\n}"
    driver = tmp_path / "driver.sh"
    driver.write_text("#!/usr/bin/env bash\nchild= launching= got_signal=\n" + functions + "\n"
                      "trap 'on_signal TERM' TERM\ntouch \"$1\"\n"
                      "while :; do trap 'on_signal TERM' TERM; got_signal=; ignore_signals; done\n")
    ready = tmp_path / "ready"
    proc = subprocess.Popen(["bash", str(driver), str(ready)], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 30
        while not ready.exists():
            assert proc.poll() is None and time.time() < deadline, proc.communicate()
            time.sleep(0.01)
        end, sent = time.time() + 0.3, 0  # (before the fix: a warning for about one signal in three)
        while time.time() < end:
            proc.send_signal(signal.SIGTERM)
            sent += 1
            time.sleep(0.0001)
    finally:
        proc.kill()
    err = proc.communicate(timeout=30)[1]
    assert proc.returncode == -signal.SIGKILL, err  # the storm did not end it: each signal was caught or ignored
    assert sent > 100 and err == "", (sent, err[:500])


@pytest.mark.parametrize("trainer", sorted(STORM_TRAINERS))
def test_signals_after_the_trainer_ended_change_neither_verdict_nor_status(fake, tmp_path, trainer):
    """`make slurm-test` (a real Slurm, proctrack/linuxproc) failed once: scancel --signal=TERM, node 1's
    task ended 143, and srun's --kill-on-bad-exit sent every process of node 0's task a second SIGTERM
    while its start_training.sh was finding the newest checkpoint in a `$(...)` subshell: the subshell
    died, and node 0 said "before its first checkpoint: nothing saved (exit 79)" beside model.ckpt-16.pt,
    the job exiting 79. SIGTERM to the whole process group every 0.5 ms from the trainer's stop (or
    end) until start_training.sh ends (before the fix: "nothing saved", exit 79, a negative time, a
    status of -1, in every try): a stopped run is 143 with the checkpoint that holds it; a finished
    run of a series is finished, its log kept (a log check the signal ended says so, not that the log
    fails), and the series stops with 143 before the next run, which the same command then runs."""
    script = tmp_path / "trainer.sh"
    script.write_text("#!/usr/bin/env bash\ntrap '' TERM INT\n" + FAKE.split("echo \"${SEED")[0].split("\n", 1)[1]
                      + 'mkdir -p "$OUTPUT_DIR"\n' + STORM_TRAINERS[trainer] + "\n")
    script.chmod(0o755)
    python = tmp_path / "python"
    python.write_text(STORM_PYTHON)
    python.chmod(0o755)
    env = dict(fake.env, TRAIN_MODEL=str(script), PYTHON=str(python), SEED="5", CHECK_LOG="1")
    if trainer == "finished":
        env["NUM_RUNS"] = "2"
    run_dir = fake.out / "run_0" if trainer == "finished" else fake.out
    proc = subprocess.Popen([START, "--preset=demo_cpu"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=ROOT, start_new_session=True)
    sent = _storm(proc, run_dir / "ready")
    out, err = proc.communicate(timeout=60)
    assert sent > 0, sent  # from the trainer's last 0.3 s to start_training.sh's end (how many: the load's)
    assert err == ("" if trainer == "stopped" else CHECK_STOPPED + "\n"), out + err
    mine = [line for line in out.splitlines() if line.startswith("start_training.sh:")]
    elapsed = (mine[0].split("after ") if "after " in mine[0] else mine[0].split(" in "))[1].split(" s")[0]
    assert 0 <= int(elapsed) < 60, out
    assert proc.returncode == 143, out + err
    if trainer == "stopped":
        assert mine == ["start_training.sh: the run stopped by SIGTERM after %s s: %s holds it; rerun the same "
                        "command to resume" % (elapsed, fake.out / "model.ckpt-16.pt")], out
        return
    log = run_dir / "mlperf.log"
    assert mine == ["start_training.sh: run 0 of 2 finished (success) in %s s: %s"
                    % (elapsed, fake.out / "result_0.txt"),
                    "start_training.sh: the log check of %s was stopped by a signal (exit 143); check it with: "
                    "python -m mlperf_bert check-log %s" % (log, log),
                    "start_training.sh: stopped by SIGTERM before run 1 of 2; rerun the same command to go on"], out
    user = subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
    assert "RESULT,bert,5,%s,%s," % (elapsed, user) in out
    assert (fake.out / "result_0.txt").read_text() == (run_dir / "mlperf.log").read_text()
    assert not (fake.out / "run_1").exists()
    # the same command, without signals: run 0 is not run again, run 1 runs
    again = subprocess.run([START, "--preset=demo_cpu"], capture_output=True, text=True, env=env, cwd=ROOT,
                           timeout=120)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "run 0 of 2 finished earlier (success, seed 5)" in again.stdout, again.stdout
    assert (fake.out / "result_1.txt").exists()


# A command start_training.sh runs before a run's trainer (PYTHON's harness.run_state, which reads
# a run's state; mkdir; sync, of DROP_CACHES), in a stand-in that starts the storm and takes 0.5 s
# (unless a signal ends it) before it does its work
STORM_AT = """#!/usr/bin/env bash
[[ "$*" == *%s* ]] && : > "$STORM_READY" && sleep 0.5
exec %s "$@"
"""


@pytest.mark.parametrize("at,runs,finished", [("harness.run_state", "1", True), ("harness.run_state", "2", True),
                                              ("mkdir", "1", False), ("mkdir", "2", False), ("sync", "1", False)])
def test_signals_before_a_runs_trainer_starts_start_no_trainer(fake, tmp_path, at, runs, finished):
    """SIGTERM to start_training.sh's process group every 0.5 ms from the start of a command it runs
    before a run's trainer, which each signal can end (a scheduler signals every process of a job).
    Reading a finished run's state (tried 3 times): the state unread, the run looked unfinished, its
    trainer started again and its old finished marker was taken for this start's end ("run 0 of 2
    finished (success)", a RESULT line of 0 s, exit 0), or the run was said to be stopped with a
    checkpoint. A series' mkdir of LOGDIR: exit 2, silently. A run's mkdir or sync: the trainer
    started, to be stopped at once, or "cannot drop the page cache". Now each is a stop before the run:
    no trainer starts, nothing is written, and the same command goes on; 143 where the run's
    checkpoints hold it, else 79 (nothing saved), as a trainer's stop says. Before a trainer the first
    signal is the stop and the next are ignored, so a state the first signal's storm kept from being
    read is read again (the stand-in, started after it, ignores them): a finished run is said to be
    finished (0), a series goes on to its stop before run 1. (Caught throughout, bash 5.2.15 misread a
    `$(...)` a trap ran in, "trap: line 2: unexpected EOF while looking for matching `)'", in CI.)"""
    env = dict(fake.env, SEED="5", NUM_RUNS=runs, MLPERF_DROP_CACHES_FILE=str(tmp_path / "drop_caches"))
    if at == "sync":
        env["DROP_CACHES"] = "1"
    if finished:
        first = subprocess.run([START, "--preset=demo_cpu"], capture_output=True, text=True, env=env, cwd=ROOT,
                               timeout=120)
        assert first.returncode == 0, first.stdout + first.stderr
    trained, files = calls(fake), {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    shims, ready = tmp_path / "shims", tmp_path / "storm"
    shims.mkdir()
    name = "python" if at.startswith("harness") else at
    real = sys.executable if name == "python" else shutil.which(name)
    (shims / name).write_text(STORM_AT % (at if name == "python" else "", real))
    (shims / name).chmod(0o755)
    storm_env = dict(env, STORM_READY=str(ready), PATH="%s:%s" % (shims, env["PATH"]))
    if name == "python":
        storm_env["PYTHON"] = str(shims / name)
    proc = subprocess.Popen([START, "--preset=demo_cpu"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=storm_env, cwd=ROOT, start_new_session=True)
    sent = _storm(proc, ready)
    out, err = proc.communicate(timeout=60)
    assert sent > 0 and err == "", out + err
    assert calls(fake) == trained and "RESULT," not in out, out  # no trainer started, no time claimed
    ready.unlink()
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and shims not in p.parents} == files
    mine = [line for line in out.splitlines() if line.startswith("start_training.sh:")]
    name = "the run" if runs == "1" else "run 0 of 2"
    if finished and runs == "1":  # its state read again: a run that has finished, nothing to stop
        assert mine == ["start_training.sh: the run in %s finished earlier (success, seed 5): nothing to do; its log "
                        "is %s/mlperf.log; use another OUTPUT_DIR for a new run" % (fake.out, fake.out)], out
        assert proc.returncode == 0, out
    elif finished:  # run 0 read as finished, then the stop before run 1, which a finished run holds
        assert mine == ["start_training.sh: run 0 of 2 finished earlier (success, seed 5): %s/result_0.txt" % fake.out,
                        "start_training.sh: stopped by SIGTERM before run 1 of 2; rerun the same command to go on"], out
        assert proc.returncode == 143, out
    else:  # nothing holds it: not 143, as a trainer stopped before its first checkpoint says
        assert mine == ["start_training.sh: stopped by SIGTERM before %s started: nothing saved (exit 79, not 143); "
                        "rerun the same command to start it" % name], out
        assert proc.returncode == 79, out
    again = subprocess.run([START, "--preset=demo_cpu"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert again.returncode == 0, again.stdout + again.stderr
    assert ("finished earlier" in again.stdout) == finished and len(calls(fake)) == len(trained) + (not finished) * int(runs)


@pytest.mark.parametrize("node", ["0", "1"])
def test_a_stop_during_the_settings_check_is_one_line_not_bashs_terminated(fake, tmp_path, node):
    """A launcher sweep: SIGTERM in the first 0.2 s (6 of 6), while train_model.sh checked the
    settings (CHECK_ONLY=files), printed bash's "Terminated" for that check beside the stop's line.
    Its own stderr still comes through (test_settings_a_launcher_sweep_found_taken_or_dropped_are_one_line)."""
    shim, ready = tmp_path / "python", tmp_path / "checking"
    shim.write_text('#!/bin/sh\n: > "%s"\nexec sleep 3\n' % ready)  # the check's first Python, held (its signals ignored)
    shim.chmod(0o755)
    env = {k: v for k, v in fake.env.items() if k != "TRAIN_MODEL"}
    proc = subprocess.Popen([START, "--preset=demo_cpu"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(env, PYTHON=str(shim), NODE_RANK=node, NNODES="2"), cwd=ROOT,
                            start_new_session=True)
    deadline = time.time() + 60
    while not ready.exists():
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    # node 1 (an OUTPUT_DIR of its own holds no checkpoint, node 0's may): node 0's status tells
    said = "nothing saved (exit 79, not 143); rerun the same command to start it" if node == "0" else NODE0_TELLS
    assert (proc.returncode, out, err) == (79, "start_training.sh: stopped by SIGTERM before the run started: %s\n"
                                           % said, "")


def test_the_settings_are_read_by_bash_alone_before_the_demo(tmp_path):
    """From its first line to the demo's start, start_training.sh starts no process (PATH holds no
    command: any would be "command not found"): a scheduler's signals in quick succession cannot end one
    before bash has set its dispositions and leave a setting empty (its realpath and id did)."""
    bash = shutil.which("bash")
    empty, record = tmp_path / "empty", tmp_path / "python_calls"
    empty.mkdir()
    python = tmp_path / "python"
    python.write_text("#!%s\necho \"$*\" >> %s\n" % (bash, record))  # the demo, as started
    python.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("DATA_DIR", "INPUT_FILES", "NUM_RUNS", "SEED", "LOGDIR")}
    env.update(OUTPUT_DIR="out/./x", PYTHON=str(python), PATH=str(empty))
    proc = subprocess.run([bash, START], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert proc.returncode == 0 and proc.stderr == "", proc.stdout + proc.stderr
    assert record.read_text() == "-m mlperf_bert demo --output_dir=%s\n" % (tmp_path / "out" / "x" / "demo")


def test_a_resumed_run_says_what_its_log_holds_and_which_time_counts(fake, tmp_path):
    """Issue 37 (6): a stopped and resumed run's RESULT counted the second invocation only while the
    log's run_start..run_stop (what MLPerf scores) spans both and the pause; the RESULT line says so.
    (23): its page-cache line said "logging cache_clear=False" while the log keeps its first
    start's true: it says what the log holds."""
    dropper = tmp_path / "drop_caches"
    dropper.write_text("")
    proc = _start_and_wait(fake, fake.out / "ready", FAKE_WAIT="out", SEED="5", DROP_CACHES="1",
                           MLPERF_DROP_CACHES_FILE=str(dropper))
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143 and "logging cache_clear=True" in out, out + err
    again = fake("--preset=demo_cpu", SEED="5", DROP_CACHES="1",
                 MLPERF_DROP_CACHES_FILE=str(tmp_path / "no" / "drop_caches"))
    assert again.returncode == 0, again.stdout + again.stderr
    assert ("start_training.sh: cannot drop the page cache (%s is not writable: run the container with --privileged); "
            "the run resumes from model.ckpt-15.pt, whose log keeps cache_clear=True from its first start"
            % (tmp_path / "no" / "drop_caches")) in again.stdout.splitlines(), again.stdout
    (result,) = result_lines(again)
    fields = result.split(",")
    assert fields[:3] == ["RESULT", "bert", "5"] and len(fields) == 7, result
    assert fields[6] == ("resumed from model.ckpt-15.pt: %s s counts this invocation only; MLPerf scores the log's "
                         "run_start to run_stop: 79.3 s over every invocation of the run and the pauses between "
                         "them" % fields[3]), result
    first = fake("--preset=demo_cpu", SEED="5", OUTPUT_DIR=str(tmp_path / "fresh"))  # not resumed: as the reference's
    assert [len(r.split(",")) for r in result_lines(first)] == [6], first.stdout


def test_a_rerun_of_a_run_killed_after_its_run_stop_says_this_invocation_trained_nothing(fake):
    """A run killed after its run_stop (its run_stopped.json there, and a checkpoint) is finished by
    its rerun, which trains nothing (test_training's
    test_a_run_killed_after_its_run_stop_keeps_its_result_and_its_rerun_trains_nothing): the RESULT
    line says so, not "resumed from" a checkpoint over "every invocation and the pauses"."""
    fake.out.mkdir()
    (fake.out / "run_stopped.json").write_text('{"status": "success", "global_step": 30, "samples": 120}')
    (fake.out / "model.ckpt-12.pt").write_text("")
    failed = fake("--preset=demo_cpu", SEED="5", FAKE_STATUS="137")  # killed again before its end
    assert failed.returncode == 137 and failed.stdout.splitlines()[-1] == (
        "start_training.sh: the run ended at its run_stop (its log %s is complete) but ended with status 137 after %s s, "
        "before its end was written (see above): rerun the same command to finish it; nothing is trained again"
        % (fake.out / "mlperf.log", failed.stdout.split(" after ")[-1].split(" s,")[0])), failed.stdout
    proc = fake("--preset=demo_cpu", SEED="5")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (result,) = result_lines(proc)
    fields = result.split(",")
    assert len(fields) == 7 and fields[6] == (
        "ended earlier at its run_stop: %s s counts this invocation only (it wrote what was left and trained "
        "nothing); MLPerf scores the log's run_start to run_stop: 79.3 s" % fields[3]), result


def test_a_rerun_of_a_resumed_run_killed_after_its_run_stop_says_its_time_holds_the_pause(fake):
    """A sweep: a run stopped, resumed, then killed after its run_stop: its rerun's RESULT line said
    only "MLPerf scores the log's run_start to run_stop: 79.3 s", a span that holds the pause, which no
    RESULT line of the run had said (the resuming invocation was killed before its own). It says so
    from the launch record's resumed_at_steps."""
    fake.out.mkdir()
    record = ('{"status": "success", "global_step": 30, "samples": 120, "launch": {"resumed_at_steps": [17, 24]}}')
    (fake.out / "run_stopped.json").write_text(record)
    (fake.out / "model.ckpt-12.pt").write_text("")
    proc = fake("--preset=demo_cpu", SEED="5", FAKE_FINISHED=record)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (result,) = result_lines(proc)
    fields = result.split(",")
    assert len(fields) == 7 and fields[6].endswith(
        "MLPerf scores the log's run_start to run_stop: 79.3 s over every invocation of the run and the pauses "
        "between them (resumed at step 17 and step 24)"), result
    from mlperf_bert.harness import run_state
    assert run_state.resumed_steps(str(fake.out)) == [17, 24]
    (fake.out / "run_finished.json").write_text('{"status": "success", "launch": {"resumed_at_steps": []}}')
    assert run_state.resumed_steps(str(fake.out)) == []


def test_a_failed_run_is_one_line_and_not_checked(fake):
    proc = fake("--preset=demo_cpu", FAKE_STATUS="3", CHECK_LOG="1")
    assert proc.returncode == 3
    lines = proc.stdout.splitlines()
    assert len(lines) == 2 and lines[0].startswith("STARTING TIMING RUN AT"), proc.stdout
    assert lines[1].startswith("start_training.sh: the run failed with status 3 after ")
    assert "model.ckpt-12.pt holds it" in lines[1] and "FAIL" not in proc.stdout and "RESULT" not in proc.stdout


def test_a_run_the_out_of_memory_killer_ended_names_the_memory_limit(fake, tmp_path, monkeypatch):
    """A sweep: a trainer run alone (one process) over its container's memory limit (here 200 MB, a tiny
    run) ended 137 and the line said only "137 = 128 + SIGKILL". Where the memory control group's count
    of out-of-memory kills grew during the run (cgroup v1's memory.oom_control here; PYTHON's stand-in
    reads a fake group), it says the limit was reached and names it; a SIGKILL from another, as before."""
    from procs import fake_cgroup
    groups, root = fake_cgroup(monkeypatch, tmp_path / "cg", "4:memory:/job\n", {
        "memory/job/memory.limit_in_bytes": "314572800\n", "memory/job/memory.oom_control": "oom_kill 3\n"})
    python = tmp_path / "python"
    python.write_text('#!/usr/bin/env bash\n[[ "$*" == "-S -m mlperf_bert.fileio "* ]] && exec %s -S -c "import runpy; '
                      'from mlperf_bert import cgroups; cgroups.PROC_CGROUP, cgroups.CGROUP_ROOT = %r, %r; '
                      'runpy.run_module(\'mlperf_bert.fileio\', run_name=\'__main__\')" "${@:4}"\nexec %s "$@"\n'
                      % (sys.executable, groups, root, sys.executable))
    python.chmod(0o755)
    killed = tmp_path / "killed.sh"  # the trainer: killed, by the out-of-memory killer where FAKE_OOM is set
    killed.write_text('#!/usr/bin/env bash\n[[ -n "${FAKE_OOM:-}" ]] && echo "oom_kill 4" > %s\nexec %s "$@"\n'
                      % (os.path.join(root, "memory/job/memory.oom_control"), fake.env["TRAIN_MODEL"]))
    killed.chmod(0o755)
    plain = fake("--preset=demo_cpu", FAKE_STATUS="137", PYTHON=str(python), TRAIN_MODEL=str(killed))
    assert plain.returncode == 137 and plain.stdout.splitlines()[-1].endswith(
        "(see above; 137 = 128 + SIGKILL): %s holds it; fix the cause and rerun the same command to resume"
        % (fake.out / "model.ckpt-12.pt")), plain.stdout
    proc = fake("--preset=demo_cpu", FAKE_STATUS="137", PYTHON=str(python), TRAIN_MODEL=str(killed), FAKE_OOM="1")
    assert proc.returncode == 137 and proc.stdout.splitlines()[-1].endswith(
        "(see above; 137 = 128 + SIGKILL, sent by the out-of-memory killer: the memory limit was reached, 300.0 MiB "
        "(this process's control group's memory.limit_in_bytes): give it more (a container's --memory, Slurm's "
        "--mem) or use less (a smaller --train_batch_size, fewer --num_workers)): %s holds it; fix the cause and "
        "rerun the same command to resume" % (fake.out / "model.ckpt-12.pt")), proc.stdout


def test_a_run_refused_by_another_starts_lock_names_that_run_not_its_checkpoint(fake, tmp_path):
    """A sweep: two series started at once into one OUTPUT_DIR both passed the lock check before the
    cache drop; the one whose trainer the lock refused said "run 0 failed ... model.ckpt-12.pt holds
    it; ... rerun the same command to resume": a checkpoint of the other run's."""
    held = tmp_path / "held"
    proc = fake("--preset=demo_cpu", FAKE_STATUS="2", FAKE_LOCKED=str(held))
    try:
        assert proc.returncode == 2
        line = proc.stdout.splitlines()[-1]
        assert line.startswith("start_training.sh: the run failed with status 2 after ") and line.endswith(
            "(see above): %s is in use by another run (its trainer holds %s): wait for it to end, or use another "
            "OUTPUT_DIR" % (fake.out, fake.out / ".mlperf_bert.lock")), proc.stdout
    finally:
        os.kill(int(held.read_text()), signal.SIGKILL)


def test_a_lock_file_this_user_cannot_open_is_not_called_in_use(fake):
    """A sweep as a non-root user: a root run killed in a shared output folder under umask 077 left
    its lock file (root's, 600); flock(1) cannot open it, and the start said "in use by another run:
    wait for it to end" of a run that does not exist. Not in use: the start goes on (its trainer
    refuses such a file in one line naming its owner, test_fileio's
    test_another_users_lock_file_is_named_with_the_way_out)."""
    from test_cli import _as_a_user
    if os.geteuid() == 0 and subprocess.run(_as_a_user(["true"])).returncode != 0:
        pytest.skip("running as root and setpriv cannot drop the permission override here")
    fake.out.mkdir()
    lock = fake.out / ".mlperf_bert.lock"
    lock.write_text("{}\n")
    lock.chmod(0)  # what another user's 600 file is to this one
    proc = subprocess.run(_as_a_user([START, "--preset=demo_cpu"]), capture_output=True, text=True,
                          env=dict(fake.env, SEED="5"), cwd=ROOT, timeout=120)
    assert proc.returncode == 0 and "in use" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert len(calls(fake)) == 1 and len(result_lines(proc)) == 1, proc.stdout


def test_a_finished_run_is_not_run_again(fake):
    first = fake("--preset=demo_cpu", SEED="5")
    assert first.returncode == 0 and len(result_lines(first)) == 1
    # a TRAIN_MODEL of one's own is not asked to compare the settings (train_model.sh's trainer is:
    # test_launchers.py's test_a_finished_run_rerun_with_another_setting_is_refused...)
    again = fake("--preset=demo_cpu", "--learning_rate=1")
    assert again.returncode == 0 and len(calls(fake)) == 1, again.stdout + again.stderr
    assert not result_lines(again) and "STARTING" not in again.stdout
    assert "finished earlier (success, seed 5): nothing to do" in again.stdout
    other = fake("--preset=demo_cpu", SEED="6")  # a run with another seed is a new run: not here
    assert other.returncode == 2 and "finished earlier with seed 5, not SEED=6" in other.stderr
    assert len(calls(fake)) == 1


def test_check_only_refuses_another_seed_as_the_run_does(fake, tmp_path):
    """CHECK_ONLY=1 said "the settings pass" for a SEED other than the one a run in OUTPUT_DIR finished
    with (a single run, a series' run 0 or later run), which the run then refused; and a run stopped
    with a checkpoint, resumed with another SEED, printed STARTING TIMING RUN and dropped the page
    cache before its trainer refused it (preflight.check_resume), after which "rerun the same command
    to resume". Both now give the run's one line, exit 2, before any trainer starts."""
    def refused(line, said="", **env):  # said: what the run says (on stdout) before it refuses
        for check, out in (("1", ""), ("0", said)):
            proc = fake(CHECK_ONLY=check, **env)
            assert (_one_error(proc, "error: "), proc.stdout) == ("error: start_training.sh: " + line, out), check
        assert calls(fake) == made
    assert fake(SEED="5").returncode == 0
    made = calls(fake)
    refused("the run in %s finished earlier with seed 5, not SEED=6: use another OUTPUT_DIR for a new run" % fake.out,
            SEED="6")
    series = tmp_path / "series"
    assert fake(NUM_RUNS="2", SEED="5", OUTPUT_DIR=str(series)).returncode == 0
    made = calls(fake)
    refused("run 0 of 2 in %s finished earlier with seed 5, not SEED=6: use another OUTPUT_DIR for a new run"
            % (series / "run_0"), NUM_RUNS="2", SEED="6", OUTPUT_DIR=str(series))
    # a series whose seeds the trainer drew (SEED unset): run 1's is not run 0's plus 1
    for log in (series / "run_1" / "mlperf.log", series / "result_1.txt"):
        log.write_text(log.read_text().replace('"key": "seed", "value": 6', '"key": "seed", "value": 9'))
    refused("run 1 of 2 in %s finished earlier with seed 9, not 6 (SEED+1): use another OUTPUT_DIR for a new run"
            % (series / "run_1"), "start_training.sh: run 0 of 2 finished earlier (success, seed 5): %s\n"
            % (series / "result_0.txt"), NUM_RUNS="2", SEED="5", OUTPUT_DIR=str(series))
    stopped = tmp_path / "stopped"  # a checkpoint there, and the seed its log records
    assert fake(SEED="5", FAKE_STATUS="3", OUTPUT_DIR=str(stopped)).returncode == 3
    made = calls(fake)
    refused("the run in %s was started with seed 5 (model.ckpt-12.pt holds it), not SEED=6: rerun with SEED=5 to go "
            "on with it, or use another OUTPUT_DIR for a new run" % stopped, SEED="6", OUTPUT_DIR=str(stopped))
    for name in ("model.ckpt-3.pt", "model.ckpt-12.pt"):  # killed after its run_stop: its record holds it
        (stopped / name).unlink()
    (stopped / "run_stopped.json").write_text('{"status": "success", "global_step": 30, "samples": 120}')
    refused("the run in %s was started with seed 5 (run_stopped.json holds it), not SEED=6: rerun with SEED=5 to go "
            "on with it, or use another OUTPUT_DIR for a new run" % stopped, SEED="6", OUTPUT_DIR=str(stopped))
    for env in ({"SEED": "5"}, {}):  # its own seed, or the one it keeps
        assert fake(CHECK_ONLY="1", OUTPUT_DIR=str(stopped), **env).returncode == 0
    (stopped / "run_stopped.json").unlink()  # nothing holds it: a new start, with any seed
    assert fake(CHECK_ONLY="1", SEED="6", OUTPUT_DIR=str(stopped)).returncode == 0
    # where PYTHON cannot read the runs' state (a login node's python3), CHECK_ONLY says it left them
    proc = fake(CHECK_ONLY="1", SEED="6", OUTPUT_DIR=str(fake.out), PYTHON="/bin/false")
    assert proc.returncode == 0 and proc.stdout.startswith(
        "start_training.sh: note: CHECK_ONLY=1: PYTHON=/bin/false cannot read the state of the runs in %s: their "
        "seeds, logs and end markers are left to the run's own check\n" % fake.out), proc.stdout + proc.stderr


def test_a_later_run_of_a_series_with_drawn_seeds_is_told_to_leave_seed_unset(fake):
    """A series started without SEED (each run draws its seed), stopped in run 1 and rerun with SEED set to
    run 0's seed: run 1 was told "rerun with SEED=<its seed - 1>", which run 0 then refused. It is told to
    leave SEED unset, which resumes it."""
    proc = _start_and_wait(fake, fake.out / "run_1" / "ready", FAKE_WAIT="run_1", NUM_RUNS="2")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 143, proc.communicate()
    proc.communicate()
    seeds = [c.split()[0] for c in calls(fake)]
    assert seeds == ["unset", "unset"]
    run0 = (fake.out / "result_0.txt").read_text().split('"key": "seed", "value": ')[1].split(",")[0]
    run1 = (fake.out / "run_1" / "mlperf.log").read_text().split('"key": "seed", "value": ')[1].split(",")[0]
    if int(run1) == int(run0) + 1:
        pytest.skip("run 1 drew run 0's seed + 1 (1 in 1,000)")
    for check in ("1", "0"):
        proc = fake("--preset=demo_cpu", CHECK_ONLY=check, NUM_RUNS="2", SEED=run0)
        assert _one_error(proc, "error: ") == (
            "error: start_training.sh: run 1 of 2 in %s was started with seed %s (model.ckpt-15.pt holds it), not %d "
            "(SEED+1): rerun with SEED unset, as the series was started (each run keeps its own seed), to go on with "
            "it, or use another OUTPUT_DIR for a new run" % (fake.out / "run_1", run1, int(run0) + 1)), check
    proc = fake("--preset=demo_cpu", NUM_RUNS="2")
    assert proc.returncode == 0 and len(result_lines(proc)) == 1, proc.stdout + proc.stderr
    assert calls(fake)[2:] == ["unset --preset=demo_cpu"]


def test_a_path_too_long_for_the_runs_files_is_refused_before_the_run(fake, tmp_path):
    """An OUTPUT_DIR of 4,075 bytes (PATH_MAX is 4,096 with its NUL) passed CHECK_ONLY=1, and the run
    printed STARTING TIMING RUN before the trainer's first write in it was refused ("cannot use
    .../mlperf_log_path.json.tmp-PID: file name too long", status 2); a longer one, or one with a
    name past 255 bytes, was said to hold a run that "finished earlier" (its state unread). One
    line, exit 2, from CHECK_ONLY=1 too, nothing written; 4,031 bytes (64 left for the runs' files)
    pass."""
    def deep(n):
        path = str(tmp_path / "o")
        while len(path) + 201 < n:
            path += "/" + "d" * 200
        return path + "/" + "e" * (n - len(path) - 1)
    for var, path, line in (
            ("OUTPUT_DIR", deep(4075), "is 4075 bytes long: the files the run writes in it would pass the 4095 bytes "
                                       "a path may have: give a path of at most 4031 bytes (a symbolic link to the "
                                       "folder from a shorter path will do)"),
            ("LOGDIR", deep(4032), "is 4032 bytes long: the files the run writes in it would pass the 4095 bytes a "
                                   "path may have: give a path of at most 4031 bytes (a symbolic link to the folder "
                                   "from a shorter path will do)"),
            # 86 characters, 258 bytes (the path in full: a cut of its bytes would split one)
            ("OUTPUT_DIR", str(tmp_path / "o" / ("\u20ac" * 86) / "x"), "has a name of 258 bytes, more than "
             "the 255 a file system takes: give a path with shorter names")):
        for check in ("1", "0"):
            proc = fake(CHECK_ONLY=check, **{var: path})
            assert (_one_error(proc, "error: "), proc.stdout) == (
                "error: start_training.sh: %s=%s %s" % (var, path, line), ""), (var, check)
        assert calls(fake) == [] and not (tmp_path / "o").exists()
    proc = fake(CHECK_ONLY="1", OUTPUT_DIR=deep(4031))
    assert proc.returncode == 0 and "no run started" in proc.stdout, proc.stderr


def test_series_stopped_in_run_1_resumes_there_and_keeps_its_seeds(fake):
    proc = _start_and_wait(fake, fake.out / "run_1" / "ready", FAKE_WAIT="run_1", NUM_RUNS="3", SEED="20")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, out + err
    mine = [line for line in out.splitlines() if line.startswith("start_training.sh:")]
    assert mine[-1] == ("start_training.sh: run 1 of 3 stopped by SIGTERM after %s s: %s holds it; rerun the same "
                        "command to resume" % (mine[-1].split("after ")[1].split(" s")[0],
                                               fake.out / "run_1" / "model.ckpt-15.pt")), out
    assert len(mine) == 2 and (fake.out / "result_0.txt").exists() and not (fake.out / "result_1.txt").exists()
    again = fake("--preset=demo_cpu", NUM_RUNS="3", SEED="20")
    assert again.returncode == 0, again.stdout + again.stderr
    assert [c.split()[0] for c in calls(fake)] == ["20", "21", "21", "22"]  # run 0 not run again
    assert "run 0 of 3 finished earlier (success, seed 20)" in again.stdout
    assert [r.split(",")[2] for r in result_lines(again)] == ["21", "22"]
    # the finished series, rerun without SEED: nothing runs, it says so with its own seeds
    done = fake("--preset=demo_cpu", "--learning_rate=1", NUM_RUNS="3")
    assert done.returncode == 0 and len(calls(fake)) == 4 and not result_lines(done), done.stdout + done.stderr
    assert "the series of 3 runs in %s is finished (seeds 20 21 22)" % fake.out in done.stdout
    refused = fake("--preset=demo_cpu", NUM_RUNS="3", SEED="99")
    assert refused.returncode == 2 and "run 0 of 3" in refused.stderr and "not SEED=99" in refused.stderr


def test_series_without_seed_reports_each_runs_own(fake):
    proc = fake("--preset=demo_cpu", NUM_RUNS="2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    seeds = [r.split(",")[2] for r in result_lines(proc)]
    assert len(seeds) == 2 and all(4000 <= int(s) < 5000 for s in seeds)
    done = fake("--preset=demo_cpu", NUM_RUNS="2")
    assert "(seeds %s)" % " ".join(seeds) in done.stdout


@pytest.mark.parametrize("local_disk", [True, False])
def test_series_on_a_node_other_than_0_leaves_the_logs_to_node_0(fake, local_disk):
    """Issue 37 (21): examples/slurm_multinode.sbatch runs README's ten-run series on every node;
    on node 1 the series copied run 0's log (which only node 0's rank 0 writes) and, with none on
    its local disk, ended with `cp` failing (exit 2) before run 1; on shared storage it would copy a
    log rank 0 may still be writing. Node 0 alone keeps result_N.txt and checks the logs."""
    extra = dict(FAKE_NO_LOG="1") if local_disk else {}
    proc = fake("--preset=rcp_3072", NUM_RUNS="2", SEED="5", NODE_RANK="1", NNODES="2", CHECK_LOG="1", **extra)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [c.split()[0] for c in calls(fake)] == ["5", "6"]
    assert not list(fake.out.glob("result_*.txt")) and "does not pass" not in proc.stdout
    assert "start_training.sh: run 1 of 2 finished on node 1; node 0 keeps its log as result_1.txt" in proc.stdout
    node0 = fake("--preset=rcp_3072", NUM_RUNS="2", SEED="5", NODE_RANK="0", NNODES="2", OUTPUT_DIR=str(fake.out / "n0"))
    assert node0.returncode == 0 and sorted(p.name for p in (fake.out / "n0").glob("result_*.txt")) == [
        "result_0.txt", "result_1.txt"], node0.stdout + node0.stderr


def test_run_state_reads_the_trainers_marker_and_log(tmp_path):
    from mlperf_bert.harness import run_state
    from mlperf_bert.trainer import checkpoint
    assert (run_state.FINISHED, run_state.STOPPED, run_state.LOG_OWNER, run_state.CKPT_RE.pattern) == (
        checkpoint.FINISHED, checkpoint.STOPPED, checkpoint.LOG_OWNER, checkpoint.CKPT_RE.pattern)
    assert run_state.finished_status(str(tmp_path)) is None
    (tmp_path / checkpoint.FINISHED).write_text('{"status": "aborted", "global_step": 3}')
    assert run_state.finished_status(str(tmp_path)) == "aborted"
    assert run_state.logged_seed(str(tmp_path / "missing.log")) is None
    log = tmp_path / "mlperf.log"
    log.write_text("".join(':::MLLOG {"namespace": "", "time_ms": %d, "event_type": "POINT_IN_TIME", "key": "%s", '
                           '"value": %s, "metadata": {}}\n' % line for line in (
                               (5, "cache_clear", "true"), (10, "seed", "3"), (1000, "run_start", "null"),
                               (2000, "seed", "4"), (3000, "cache_clear", "false"), (80300, "run_stop", "null"))))
    assert subprocess.run([sys.executable, "-m", "mlperf_bert.harness.run_state", str(tmp_path), str(log)], cwd=ROOT,
                          capture_output=True, text=True).stdout == "4 aborted True 79.3 -\n"
    assert subprocess.run([sys.executable, "-m", "mlperf_bert.harness.run_state", str(tmp_path / "none"),
                           str(tmp_path / "none.log")], cwd=ROOT, capture_output=True, text=True).stdout == "- - - - -\n"
    # start_training.sh asks it twice a run, a process each time: it imported the log checker's
    # absl, mllog and numpy, four times Python's own start (0.12 s of CPU a call, 70% of this file's)
    heavy = subprocess.run([sys.executable, "-c", "import sys, mlperf_bert.harness.run_state; print(sorted(m for m in "
                            "('absl', 'mlperf_logging', 'numpy', 'torch', 'multiprocessing') if m in sys.modules))"],
                           cwd=ROOT, capture_output=True, text=True)
    assert heavy.stdout == "[]\n", heavy.stdout + heavy.stderr



def test_run_state_answers_for_a_log_whose_times_are_not_numbers(tmp_path, capsys):
    """A sweep: a log whose run_start has "time_ms": null (a TRAIN_MODEL of one's own; read_log lets it
    through) ended run_state with a TypeError traceback (status 1): start_training.sh's RESULT line lost
    the run's seed, and a rerun was refused with "cannot read the state of the run ... check PYTHON".
    The state is still read; the time it cannot compute is '-'."""
    from mlperf_bert.harness import run_state
    log = tmp_path / "mlperf.log"
    log.write_text("".join(':::MLLOG {"namespace": "", "time_ms": %s, "event_type": "POINT_IN_TIME", "key": "%s", '
                           '"value": %s, "metadata": {}}\n' % line for line in (
                               (10, "seed", "77"), ("null", "run_start", "null"), (80300, "run_stop", "null"))))
    (tmp_path / run_state.FINISHED).write_text('{"status": "success"}')
    assert run_state.main(["run_state", str(tmp_path), str(log)]) == 0
    assert capsys.readouterr().out == "77 success - - -\n"


# ---- the image's entrypoint, run outside the image

def _entry(tmp_path, *args, **env):
    e = {k: v for k, v in os.environ.items() if k not in ("DATA_DIR", "INPUT_FILES")}
    fake_python = tmp_path / "python"
    fake_python.write_text('#!/bin/sh\necho "python $*"\n')
    fake_python.chmod(0o755)
    e.update(PYTHON=str(fake_python), OUTPUT_DIR=str(tmp_path / "o"), **env)
    return subprocess.run([ENTRY, *args], capture_output=True, text=True, env=e, timeout=60)


def test_entrypoint_flags_go_to_start_training(tmp_path):
    proc = _entry(tmp_path)
    assert proc.returncode == 0 and "running the built-in demo" in proc.stdout
    proc = _entry(tmp_path, "--help")
    assert proc.returncode == 0 and "The container's root process" in proc.stdout
    proc = _entry(tmp_path, "--preset=demo_cpu")  # flags without DATA_DIR: start_training.sh's own error
    assert proc.returncode == 2 and "no DATA_DIR" in proc.stderr


def test_entrypoint_runs_commands_and_explains_a_wrong_word(tmp_path):
    proc = _entry(tmp_path, "echo", "hello")
    assert proc.returncode == 0 and proc.stdout == "hello\n"
    proc = _entry(tmp_path, "preset=demo_cpu")
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1
    assert "'preset=demo_cpu' is neither a flag nor a command" in proc.stderr and "--name=value" in proc.stderr


def test_docs_show_the_commands_the_container_test_runs():
    """README and docs/running.md give the image's commands as tests/container/check_image.py runs them."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "container"))
    import check_image
    assert check_image.IMAGE == "mlperf-bert"
    for doc in ("README.md", os.path.join("docs", "running.md")):
        with open(os.path.join(ROOT, doc)) as f:
            text = f.read()
        for command in ("docker build -t mlperf-bert .",
                        'docker run --rm --user "$(id -u):$(id -g)" -v "$PWD/out":/output mlperf-bert',
                        "mlperf-bert python -m mlperf_bert score /output/",
                        "docker stop -t %s" % check_image.STOP_TIMEOUT):
            assert command in text, (doc, command)


def test_the_launchers_not_saved_status_is_the_trainers():
    """start_training.sh keeps its own copy of launch.NOT_SAVED_STATUS (it runs without Python's
    package on its path until the trainer starts): the two must not drift apart."""
    import re
    from mlperf_bert.trainer.launch import NOT_SAVED_STATUS
    text = open(os.path.join(ROOT, "start_training.sh")).read()
    assert re.findall(r"^NOT_SAVED=(\d+)$", text, re.M) == [str(NOT_SAVED_STATUS)]


def test_an_output_dir_that_is_a_file_is_refused_not_a_finished_run(fake, tmp_path):
    """A hostile sweep: OUTPUT_DIR naming a file (or a folder under one) said "the run in ... finished
    earlier (unreadable): nothing to do", exit 0; with NUM_RUNS=2 bash's "cp: cannot stat". It is one
    error naming the variable, exit 2, before any run."""
    afile = tmp_path / "afile"
    afile.write_text("x\n")
    for var, value in (("OUTPUT_DIR", afile), ("OUTPUT_DIR", afile / "sub"), ("LOGDIR", afile / "logs")):
        for runs in ("1", "2"):
            proc = fake(**{var: str(value), "NUM_RUNS": runs})
            assert (proc.returncode, proc.stdout) == (2, ""), (var, value, proc.stdout)
            assert proc.stderr == "error: start_training.sh: %s=%s: %s is not a directory: give a directory (made " \
                                  "if missing)\n" % (var, value, afile), proc.stderr
            assert calls(fake) == []


def test_check_only_checks_and_dry_run_is_refused_never_a_result(fake):
    """A hostile sweep: CHECK_ONLY=1 (or DRY_RUN=1, --dry_run) given to start_training.sh reached each
    run's train_model.sh, which checked (or printed) and exited 0: a RESULT line of an empty seed and
    0 s, "the run finished" beside a log that does not exist, exit 0. CHECK_ONLY=1 is the settings
    check alone (one line, no run); DRY_RUN is train_model.sh's, refused in one line."""
    proc = fake(CHECK_ONLY="1", NUM_RUNS="2")
    assert (proc.returncode, proc.stderr) == (0, ""), proc.stderr
    assert proc.stdout == "start_training.sh: CHECK_ONLY=1: TRAIN_MODEL=%s runs instead of train_model.sh: its " \
                          "settings are not checked (only that it is there); no run started\n" % fake.env["TRAIN_MODEL"]
    assert calls(fake) == [] and not fake.out.exists()
    for proc, what in ((fake(DRY_RUN="1"), "DRY_RUN=1 is train_model.sh's (it prints the trainer's command): run "
                                           "train_model.sh with it; CHECK_ONLY=1 start_training.sh checks the settings"),
                       (fake("--dry_run"), "--dry_run is train_model.sh's: run train_model.sh --dry_run (or "
                                           "DRY_RUN=1 train_model.sh) to print the trainer's command")):
        assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", "error: start_training.sh: %s\n" % what)
        assert not result_lines(proc) and calls(fake) == []


def test_a_folder_another_runs_trainer_holds_is_refused_before_the_cache_is_dropped(fake, tmp_path):
    """A hostile sweep: a second start_training.sh on the OUTPUT_DIR of a running one said STARTING
    TIMING RUN, dropped the page cache under that timed run, and when its trainer was refused (the
    lock) advised to "rerun the same command to resume" a run another process trains. The lock the
    trainer holds is looked at first: one error line, status 2, nothing dropped, no trainer started;
    a lock file left by a run that died does not stop it."""
    from mlperf_bert import locking
    dropfile = tmp_path / "drop_caches"
    dropfile.write_text("")
    fake.out.mkdir()
    with locking.lock_dir(str(fake.out)):
        proc = fake(DROP_CACHES="1", MLPERF_DROP_CACHES_FILE=str(dropfile))
    assert (proc.returncode, proc.stdout) == (2, ""), proc.stdout
    assert proc.stderr == "error: start_training.sh: %s is in use by another run (its trainer holds %s): wait for it " \
                          "to end, or use another OUTPUT_DIR\n" % (fake.out, fake.out / locking.DIR_LOCK_NAME)
    assert dropfile.read_text() == "" and calls(fake) == []
    (fake.out / locking.DIR_LOCK_NAME).write_text('{"pid": 1}')  # left behind, held by no one
    proc = fake(DROP_CACHES="1", MLPERF_DROP_CACHES_FILE=str(dropfile))
    assert proc.returncode == 0 and dropfile.read_text().strip() == "3" and len(calls(fake)) == 1, proc.stderr


def test_a_series_folder_rerun_without_num_runs_is_refused(fake):
    """A hostile sweep: a finished NUM_RUNS=2 series rerun without NUM_RUNS started a fresh run in the
    series' folder, beside run_0 and run_1, with the seed of run 0. One line says to set NUM_RUNS."""
    assert fake(NUM_RUNS="2", SEED="5").returncode == 0
    before = calls(fake)
    proc = fake(SEED="5")
    assert (proc.returncode, proc.stdout) == (2, "") and calls(fake) == before, proc.stdout
    assert proc.stderr == "error: start_training.sh: OUTPUT_DIR=%s holds a series of runs (run_0, ...): set NUM_RUNS " \
                          "as when it was started to go on with it, or use another OUTPUT_DIR for one run\n" % fake.out
    # (a sweep) CHECK_ONLY=1 said "the settings pass" for what the run then refuses
    assert fake(SEED="5", CHECK_ONLY="1").stderr == proc.stderr
    assert fake(NUM_RUNS="2", SEED="5").returncode == 0  # the series' own command: nothing to do


def _one_error(proc, prefix):
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith(prefix), (proc.stdout, proc.stderr)
    return lines[0]


def test_settings_a_launcher_sweep_found_taken_or_dropped_are_one_line(fake, tmp_path):
    """A hostile sweep of the launchers (issue 45's seventeenth stop), each before this fix a run or a
    silent choice: a bare '--' dropped the preset's flag and the user's (absl reads what follows as
    arguments: the trainer's default 100,000 steps ran); DRY_RUN=true or CHECK_ONLY=yes ran a real
    training; SEED+NUM_RUNS-1 past 18 digits failed run 1 after run 0 had trained; CHECK_ONLY=1 or SEED
    without DATA_DIR ran the demo (its check failing, its seed its own); a missing TRAIN_MODEL said
    STARTING TIMING RUN and failed 127. Each is one line, exit 2, no run."""
    _one_error(fake("--preset=demo_cpu", "--", "--num_train_steps=4"),
               "error: start_training.sh: '--': give the trainer's flags without it")
    _one_error(fake(SEED="999999999999999999", NUM_RUNS="2"), "error: start_training.sh: SEED=999999999999999999 with "
               "NUM_RUNS=2: the last run's seed SEED+1 has more than 18 digits")
    _one_error(fake(DATA_DIR="", CHECK_ONLY="1"), "error: start_training.sh: CHECK_ONLY=1 but no DATA_DIR: the built-in "
               "demo has no settings to check")
    _one_error(fake(DATA_DIR="", SEED="5"), "error: start_training.sh: SEED or NUM_RUNS set but no DATA_DIR")
    # (a sweep) without its train_model.sh (or one not executable): bash's "line 294: ... Permission denied"
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy2(START, alone / "start_training.sh")
    (alone / "train_model.sh").write_text("#!/bin/sh\n")
    for args in ([], ["--help"]):
        _one_error(subprocess.run([str(alone / "start_training.sh")] + args, capture_output=True, text=True,
                                  env={k: v for k, v in fake.env.items() if k != "TRAIN_MODEL"}, cwd=ROOT, timeout=120),
                   "error: start_training.sh: %s is missing or not executable: restore it" % (alone / "train_model.sh"))
    # (a sweep) a job's DATA_DIR=$TYPO, empty, with a run's settings: the demo ran, exit 0
    _one_error(fake(DATA_DIR=""), "error: start_training.sh: DATA_DIR set but empty: set DATA_DIR to the folder")
    unset = {k: v for k, v in fake.env.items() if k != "DATA_DIR"}
    _one_error(subprocess.run([START], capture_output=True, text=True, env=dict(unset, INPUT_FILES=""), cwd=ROOT,
                              timeout=120), "error: start_training.sh: INPUT_FILES set but empty: set DATA_DIR")
    for name, value in (("PRESET", "rcp_3072"), ("INIT_CHECKPOINT", "/data/tf1_ckpt/model.ckpt-28252")):
        _one_error(subprocess.run([START], capture_output=True, text=True, env=dict(unset, **{name: value}), cwd=ROOT,
                                  timeout=120),
                   "error: start_training.sh: %s set but no DATA_DIR: the built-in demo takes none of a run's" % name)
    _one_error(fake(TRAIN_MODEL=str(tmp_path / "nowhere.sh")), "error: start_training.sh: TRAIN_MODEL=%s is not a "
               "command or executable file" % (tmp_path / "nowhere.sh"))
    assert calls(fake) == [] and not (fake.out / "demo").exists()
    env = dict(fake.env, DRY_RUN="0", OUTPUT_DIR=str(tmp_path / "tm"))
    del env["TRAIN_MODEL"]
    for extra, args, prefix in (({}, ["--", "--num_train_steps=4"], "error: train_model.sh: '--': give"),
                                ({"DRY_RUN": "true"}, [], "error: train_model.sh: DRY_RUN=true must be 0 or 1"),
                                ({"CHECK_ONLY": "yes"}, [], "error: train_model.sh: CHECK_ONLY=yes must be 0, 1 or files"),
                                ({}, ["--dry_run=1"], "error: train_model.sh: --dry_run=1: give --dry_run alone")):
        proc = subprocess.run([os.path.join(ROOT, "train_model.sh"), "--preset=demo_cpu"] + args, capture_output=True,
                              text=True, env=dict(env, **extra), cwd=ROOT, timeout=120)
        _one_error(proc, prefix)
    # a batch with no reference convergence point: harness/rcp.py's line, without the script's name
    proc = subprocess.run([os.path.join(ROOT, "train_model.sh"), "--preset=rcp_0"], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=120)
    _one_error(proc, "error: train_model.sh: no reference convergence point for global batch 0: choose one of rcp_256")
    assert not (tmp_path / "tm").exists()
    # a PYTHON without the trainer's packages (here: without site-packages) passed the check; the run
    # then said STARTING TIMING RUN and ended in a ModuleNotFoundError traceback
    nosite = tmp_path / "nosite_python"
    nosite.write_text('#!/bin/sh\nexec %s -S "$@"\n' % sys.executable)
    nosite.chmod(0o755)
    env = {k: v for k, v in fake.env.items() if k != "TRAIN_MODEL"}
    proc = subprocess.run([START, "--preset=demo_cpu"], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env=dict(env, PYTHON=str(nosite), OUTPUT_DIR=str(tmp_path / "np")))
    _one_error(proc, "error: train_model.sh: PYTHON=%s lacks the trainer's packages (absl numpy torch "
               "mlperf_logging tqdm crc32c): set PYTHON" % nosite)
    assert "STARTING" not in proc.stdout and not (tmp_path / "np").exists()
    # an OUTPUT_DIR that is a dangling link: mkdir's two raw lines (CHECK_ONLY passed it)
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere" / "x")
    for check in ("0", "1"):
        _one_error(fake(OUTPUT_DIR=str(tmp_path / "dangling"), CHECK_ONLY=check), "error: start_training.sh: "
                   "OUTPUT_DIR=%s is a symbolic link to a path that does not exist" % (tmp_path / "dangling"))
    # started through a link (one in PATH): bash's "No such file" for the train_model.sh beside the link
    link = tmp_path / "bin" / "start"
    link.parent.mkdir()
    link.symlink_to(START)
    proc = subprocess.run([str(link), "--help"], capture_output=True, text=True, cwd=ROOT, timeout=120, env=env)
    assert proc.returncode == 0 and proc.stderr == "" and "presets: " in proc.stdout, proc.stderr


def test_a_finished_runs_results_are_never_mixed_with_another_runs(fake, tmp_path):
    """The sweep: two series with one LOGDIR copied each other's result_N.txt over (series B's logs
    then stood for series A's runs, unseen); a finished run rerun with another LOGDIR said "nothing to
    do; its log is NEW/mlperf.log", a log that does not exist, its seed unchecked; NUM_RUNS=2 on a
    single run's folder started a series beside it. Each is one line, exit 2, nothing run or copied."""
    logs = tmp_path / "logs"
    a = fake(NUM_RUNS="2", SEED="5", LOGDIR=str(logs), OUTPUT_DIR=str(tmp_path / "A"))
    assert a.returncode == 0, a.stderr
    kept = {n: (logs / n).read_bytes() for n in ("result_0.txt", "result_1.txt")}
    n = len(calls(fake))
    _one_error(fake(NUM_RUNS="2", SEED="7", LOGDIR=str(logs), OUTPUT_DIR=str(tmp_path / "B")),
               "error: start_training.sh: %s is not the log of run 0 of the series in %s" % (logs / "result_0.txt",
                                                                                            tmp_path / "B"))
    assert {n: (logs / n).read_bytes() for n in kept} == kept and len(calls(fake)) == n
    assert fake(NUM_RUNS="2", SEED="5", LOGDIR=str(logs), OUTPUT_DIR=str(tmp_path / "A")).returncode == 0
    one = fake(SEED="5")
    assert one.returncode == 0 and len(calls(fake)) == n + 1
    _one_error(fake(SEED="6", LOGDIR=str(tmp_path / "elsewhere")), "error: start_training.sh: the run in %s finished "
               "earlier, but its MLPerf log is not %s: rerun with the LOGDIR it had" % (fake.out,
                                                                                        tmp_path / "elsewhere" / "mlperf.log"))
    _one_error(fake(NUM_RUNS="2", SEED="5"), "error: start_training.sh: OUTPUT_DIR=%s holds a single run (NUM_RUNS=1)"
               % fake.out)
    assert len(calls(fake)) == n + 1 and not (fake.out / "run_0").exists()


def test_a_series_folder_changed_between_reruns_is_refused_before_any_run(fake, tmp_path):
    """A hostile sweep of series reruns. Before: a series of 3 rerun with NUM_RUNS=2 said "the series
    of 2 runs ... is finished", its run_2 left aside; a stray file run_1 let run 0 train, then was
    taken for a run that had "finished earlier"; a run folder deleted (or its log cut) was refused as
    "another series' results; give each series its own LOGDIR" (LOGDIR was the series' own); a
    series run's log removed said "rerun with the LOGDIR it had" (a series' runs log in their own
    folders). Each is one line naming the file and the fix, exit 2, nothing of the series lost."""
    assert fake(NUM_RUNS="3", SEED="5").returncode == 0
    n = len(calls(fake))
    for check in ("0", "1"):  # (a sweep: CHECK_ONLY=1 passed it)
        assert _one_error(fake(NUM_RUNS="2", SEED="5", CHECK_ONLY=check), "error: start_training.sh: ") == (
            "error: start_training.sh: OUTPUT_DIR=%s holds %s, past NUM_RUNS=2: set NUM_RUNS as when the series was "
            "started (more than 2) to go on with it, or use another OUTPUT_DIR" % (fake.out, fake.out / "run_2"))
    shutil.rmtree(fake.out / "run_1")
    for check in ("0", "1"):  # (CHECK_ONLY=1 passed these two)
        assert _one_error(fake(NUM_RUNS="3", SEED="5", CHECK_ONLY=check), "error: start_training.sh: ") == (
            "error: start_training.sh: %s is the log of run 1 of the series in %s, but %s is missing (the run's "
            "folder changed since it finished): put %s back as it was, or move both away to run run 1 again"
            % (fake.out / "result_1.txt", fake.out, fake.out / "run_1" / "mlperf.log", fake.out / "run_1"))
    (fake.out / "result_1.txt").unlink()
    (fake.out / "run_2" / "mlperf.log").unlink()
    (fake.out / "result_2.txt").unlink()
    for check in ("0", "1"):
        assert _one_error(fake(NUM_RUNS="3", SEED="5", CHECK_ONLY=check), "error: start_training.sh: ") == (
            "error: start_training.sh: run 2 of 3 in %s: %s says the run ended, but its MLPerf log %s is missing: "
            "put them back as the run left them, or move %s and %s (where there) away to run run 2 again"
            % (fake.out / "run_2", fake.out / "run_2" / "run_finished.json", fake.out / "run_2" / "mlperf.log",
               fake.out / "run_2", fake.out / "result_2.txt"))
    assert len(calls(fake)) == n  # before run 1, moved away, trained again (test_a_later_runs_missing_log_...)
    other = tmp_path / "other"
    other.mkdir()
    (other / "run_1").write_text("")
    assert _one_error(fake(NUM_RUNS="2", SEED="5", OUTPUT_DIR=str(other)), "error: start_training.sh: ") == (
        "error: start_training.sh: %s is not a directory: the series keeps run 1 there; move it away, or use another "
        "OUTPUT_DIR" % (other / "run_1"))
    assert len(calls(fake)) == n and sorted(p.name for p in other.iterdir()) == ["run_1"]


def test_a_result_that_cannot_be_written_is_one_line_and_the_rerun_keeps_the_run(fake, tmp_path):
    """A full LOGDIR (a 2 MB tmpfs in the sweep): cp's own two lines and exit 2, its partial
    .result_0.txt.tmp left. Now one line naming the file and the fix; the rerun copies it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "cp").write_text('#!/bin/sh\nfor a; do last=$a; done\n: > "$last"\n'
                                'echo "cp: error writing \'$last\': No space left on device" >&2\nexit 1\n')
    (bin_dir / "cp").chmod(0o755)
    path = "%s:%s" % (bin_dir, fake.env["PATH"])
    line = _one_error(fake(NUM_RUNS="2", SEED="5", PATH=path), "error: start_training.sh: ")
    assert line == ("error: start_training.sh: cannot write %s: No space left on device; run 0 is finished and kept "
                    "in %s: free space (or fix the disk), then rerun the same command"
                    % (fake.out / "result_0.txt", fake.out / "run_0")), line
    assert sorted(p.name for p in fake.out.iterdir()) == ["run_0"]
    again = fake(NUM_RUNS="2", SEED="5")
    assert again.returncode == 0 and [c.split()[0] for c in calls(fake)] == ["5", "6"], again.stdout + again.stderr
    assert "run 0 of 2 finished earlier (success, seed 5)" in again.stdout
    assert (fake.out / "result_0.txt").read_bytes() == (fake.out / "run_0" / "mlperf.log").read_bytes()


def test_a_trainer_killed_by_a_signal_is_named_without_bashs_job_report(fake, tmp_path):
    """The sweep: a trainer run alone (one process) killed with SIGKILL left bash's own report on
    stderr, "start_training.sh: line 438: PID Killed  OUTPUT_DIR=... train_model.sh ...", as the line
    that "see above" pointed to. Now the run's one line names the signal its status stands for."""
    killed = tmp_path / "killed.sh"
    killed.write_text('#!/usr/bin/env bash\nmkdir -p "$OUTPUT_DIR"\nkill -KILL $$\n')
    killed.chmod(0o755)
    proc = fake(NUM_RUNS="2", TRAIN_MODEL=str(killed))
    assert proc.returncode == 137 and proc.stderr == "", proc.stderr
    assert proc.stdout.splitlines()[1:] == ["start_training.sh: run 0 of 2 failed with status 137 after %s s (see "
                                            "above; 137 = 128 + SIGKILL)" % proc.stdout.split("after ")[1].split(" s")[0]]


def test_an_output_dir_outside_every_mount_is_refused_in_the_image(fake, tmp_path):
    """A sweep of the image: `docker run` without `-v ...:/output` (or with the folder mounted at another
    path) trained, said the run finished, exit 0, and everything went with the container. With
    REQUIRE_MOUNT=1 (the image's) an OUTPUT_DIR or LOGDIR under no mount point but / is one line, exit 2,
    before the run or the demo; under one (the host folder mounted there) the run goes on."""
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text("1 0 0:50 / / rw - overlay overlay rw\n2 1 0:51 / /proc rw - proc proc rw\n")
    proc = fake(REQUIRE_MOUNT="1", MLPERF_MOUNTINFO_FILE=str(mountinfo))
    assert (proc.returncode, proc.stdout) == (2, ""), proc.stdout + proc.stderr
    assert proc.stderr == ("error: start_training.sh: OUTPUT_DIR=%s is not in a mounted folder: what the run writes "
                           "there would be lost with the container; mount a host folder there (docker run -v "
                           "\"$PWD/out\":%s ...), or set REQUIRE_MOUNT=0\n" % (fake.out, fake.out)), proc.stderr
    assert calls(fake) == []
    env = {k: v for k, v in fake.env.items() if k != "DATA_DIR"}  # the demo: refused the same way
    proc = subprocess.run([START], capture_output=True, text=True, cwd=ROOT, timeout=60,
                          env=dict(env, PYTHON="/nonexistent", REQUIRE_MOUNT="1", MLPERF_MOUNTINFO_FILE=str(mountinfo)))
    assert proc.returncode == 2 and "is not in a mounted folder" in proc.stderr, proc.stdout + proc.stderr
    assert "demo" not in proc.stdout
    with open(mountinfo, "a") as f:
        f.write("3 1 8:1 /srv/out %s rw - ext4 /dev/sda1 rw\n" % tmp_path)
    proc = fake(REQUIRE_MOUNT="1", MLPERF_MOUNTINFO_FILE=str(mountinfo))
    assert proc.returncode == 0 and len(result_lines(proc)) == 1, proc.stdout + proc.stderr
    proc = fake(REQUIRE_MOUNT="1", MLPERF_MOUNTINFO_FILE=str(mountinfo), LOGDIR="/elsewhere/logs")
    assert proc.returncode == 2 and "LOGDIR=/elsewhere/logs is not in a mounted folder" in proc.stderr, proc.stderr


def test_a_data_dir_not_mounted_in_the_image_names_the_mount(fake, tmp_path):
    """A sweep of the image: `docker run -e DATA_DIR=/data/tfrecords ...` without the data's `-v` was
    train_model.sh's "no training file matches /data/tfrecords/part-*: set DATA_DIR to the folder of the
    TFRecords", the wrong fix (DATA_DIR was right). With REQUIRE_MOUNT=1 a missing DATA_DIR under no mount
    is one line naming the mount; one missing inside a mount (a wrong path) is left to train_model.sh."""
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text("1 0 0:50 / / rw - overlay overlay rw\n3 1 8:1 /srv/out %s rw - ext4 /dev/sda1 rw\n"
                         % fake.out)
    fake.out.mkdir()
    env = dict(REQUIRE_MOUNT="1", MLPERF_MOUNTINFO_FILE=str(mountinfo))
    proc = fake(DATA_DIR="/nonexistent_bert_data/tfrecords", **env)
    assert (proc.returncode, proc.stdout) == (2, ""), proc.stdout + proc.stderr
    assert proc.stderr == ("error: start_training.sh: DATA_DIR=/nonexistent_bert_data/tfrecords does not exist, and no "
                           "folder is mounted at or above it: mount the host folder that holds the data (docker run -v "
                           "/path/to/bert_data:/nonexistent_bert_data:ro ...), or set DATA_DIR to where it is mounted\n")
    assert calls(fake) == []
    proc = fake(DATA_DIR=str(fake.out / "missing"), **env)  # in the mount: not the mount's fault
    assert "not exist, and no folder is mounted" not in proc.stderr, proc.stderr
    assert fake(DATA_DIR="/nonexistent_bert_data/tfrecords").stderr.count("no folder is mounted") == 0  # REQUIRE_MOUNT=0


def test_a_data_dir_the_run_does_not_read_is_not_refused_for_its_mount(fake, tmp_path):
    """A hostile review: with INPUT_FILES and EVAL_FILE both given (train_model.sh reads no DATA_DIR), a
    missing DATA_DIR left in the environment was refused under REQUIRE_MOUNT=1 ("mount the host folder that
    holds the data"), the data mounted and given elsewhere."""
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text("1 0 0:50 / / rw - overlay overlay rw\n3 1 8:1 /srv %s rw - ext4 /dev/sda1 rw\n" % tmp_path)
    proc = fake(DATA_DIR="/nonexistent_bert_data/tfrecords", INPUT_FILES=str(tmp_path / "part-*"),
                EVAL_FILE=str(tmp_path / "eval_10k"), REQUIRE_MOUNT="1", MLPERF_MOUNTINFO_FILE=str(mountinfo))
    assert proc.returncode == 0 and len(result_lines(proc)) == 1, proc.stdout + proc.stderr


def test_the_mount_check_looks_at_the_paths_the_run_reads(fake, tmp_path):
    """A review: REQUIRE_MOUNT's data check looked at DATA_DIR alone, as the environment left it read: a
    missing DATA_DIR was refused ("mount the host folder that holds the data") when --input_file and
    --eval_input_file, given as arguments, read the mounted data instead, and an --input_file (or
    INPUT_FILES) under no mount got train_model.sh's "no training file matches ...: give it the
    TFRecords", the wrong fix. It now looks at what train_model.sh gives the trainer, naming its source."""
    mnt = tmp_path / "mnt"
    (mnt / "data").mkdir(parents=True)
    for name in ("part-0", "eval_10k"):
        (mnt / "data" / name).write_text("")
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text("1 0 0:50 / / rw - overlay overlay rw\n3 1 8:1 /srv %s rw - ext4 /dev/sda1 rw\n" % mnt)
    env = {k: v for k, v in fake.env.items() if k != "TRAIN_MODEL"}
    env.update(CHECK_ONLY="1", REQUIRE_MOUNT="1", MLPERF_MOUNTINFO_FILE=str(mountinfo), PRESET="demo_cpu",
               OUTPUT_DIR=str(mnt / "out"), DATA_DIR=str(mnt / "data"))

    def start(*args, **extra):
        return subprocess.run([START, *args], capture_output=True, text=True, cwd=ROOT, env=dict(env, **extra),
                              timeout=60)
    proc = start("--input_file=%s/data/part-0" % mnt, "--eval_input_file=%s/data/eval_10k" % mnt,
                 DATA_DIR="/nonexistent_bert_data/tfrecords")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for args, extra, what in ((["--input_file=/nonexistent_bert_data/x/part-*"], {},
                               "--input_file=/nonexistent_bert_data/x/part-*"),
                              ([], dict(INPUT_FILES="%s/data/part-0,/nonexistent_bert_data/x/part-0" % mnt),
                               "INPUT_FILES=%s/data/part-0,/nonexistent_bert_data/x/part-0" % mnt)):
        proc = start(*args, **extra)
        assert (proc.returncode, proc.stdout) == (2, ""), proc.stdout + proc.stderr
        assert proc.stderr == ("error: start_training.sh: %s: /nonexistent_bert_data/x does not exist, and no folder is "
                               "mounted at or above it: mount the host folder that holds it (docker run -v "
                               "/path/to/it:/nonexistent_bert_data:ro ...), or give its path where it is mounted\n"
                               % what), proc.stderr


def test_the_mount_check_reads_a_file_list_as_the_trainer_and_a_checkpoint_whole(fake, tmp_path):
    """A hostile review: the mount check split every path it read at commas, and kept a list's white
    space: INPUT_FILES="A, B" (the trainer strips " B") and an INIT_CHECKPOINT in a folder named with a
    comma (one path to the trainer) were refused under REQUIRE_MOUNT=1, the image's default, as a
    relative path under the working folder ("/workspace/bert/ /data does not exist")."""
    mnt = tmp_path / "mnt"
    for folder in ("data", "ck,pt"):
        (mnt / folder).mkdir(parents=True)
    for name in ("data/part-0", "data/eval_10k", "ck,pt/model.ckpt-28252.index"):
        (mnt / name).write_text("")
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text("1 0 0:50 / / rw - overlay overlay rw\n3 1 8:1 /srv %s rw - ext4 /dev/sda1 rw\n" % mnt)
    env = {k: v for k, v in fake.env.items() if k != "TRAIN_MODEL"}
    env.update(CHECK_ONLY="1", REQUIRE_MOUNT="1", MLPERF_MOUNTINFO_FILE=str(mountinfo), PRESET="demo_cpu",
               OUTPUT_DIR=str(mnt / "out"), DATA_DIR=str(mnt / "data"))
    for extra in (dict(INPUT_FILES="%s/data/part-0, %s/data/part-0" % (mnt, mnt)),
                  dict(INIT_CHECKPOINT="%s/ck,pt/model.ckpt-28252" % mnt)):
        proc = subprocess.run([START], capture_output=True, text=True, cwd=ROOT, env=dict(env, **extra), timeout=60)
        assert proc.returncode == 0, (extra, proc.stdout + proc.stderr)


def test_the_mount_check_reads_mountinfos_escapes(fake, tmp_path):
    """A hostile review: of mountinfo's escapes only \\040 (a space) was read, so an OUTPUT_DIR under a mount
    point with a tab, newline or backslash in its name (\\011, \\012, \\134) was refused as in no mount."""
    for name, escaped in (("a\\b", "a\\134b"), ("a\tb", "a\\011b"), ("a\nb", "a\\012b")):
        mountinfo = tmp_path / "mountinfo"
        mountinfo.write_text("1 0 0:50 / / rw - overlay overlay rw\n3 1 8:1 /srv %s/%s rw - ext4 /dev/sda1 rw\n"
                             % (tmp_path, escaped))
        proc = fake(OUTPUT_DIR=str(tmp_path / name / "out"), REQUIRE_MOUNT="1", MLPERF_MOUNTINFO_FILE=str(mountinfo))
        assert proc.returncode == 0 and len(result_lines(proc)) == 1, (name, proc.stdout + proc.stderr)


def test_the_mount_check_resolves_dot_dot_and_symbolic_links(fake, tmp_path):
    """The mount check compared the paths as text: OUTPUT_DIR=/output/../tmp passed as inside /output,
    as did a symbolic link out of the mount, and a link into it was refused. It compares the resolved
    path (as realpath -m gives it), names it in its one line, and leaves the working folder as it was
    (a relative TRAIN_MODEL still found)."""
    base = tmp_path.resolve()
    mnt, out = base / "mnt", base / "elsewhere"
    mnt.mkdir()
    out.mkdir()
    (mnt / "link").symlink_to(out)
    (base / "inlink").symlink_to(mnt)
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text("1 0 0:50 / / rw - overlay overlay rw\n3 1 8:1 /srv/out %s rw - ext4 /dev/sda1 rw\n" % mnt)
    env = dict(fake.env, REQUIRE_MOUNT="1", MLPERF_MOUNTINFO_FILE=str(mountinfo), TRAIN_MODEL="./fake_train.sh")

    def start(**extra):
        return subprocess.run([START], capture_output=True, text=True, cwd=tmp_path, env=dict(env, **extra), timeout=60)
    for var, path, resolved in (("OUTPUT_DIR", "%s/../elsewhere/run" % mnt, out / "run"),
                                ("OUTPUT_DIR", "%s/link/run" % mnt, out / "run"),
                                ("LOGDIR", "%s/link/new/../logs" % mnt, out / "logs")):
        proc = start(**dict({"OUTPUT_DIR": str(mnt / "run")}, **{var: path}))
        assert (proc.returncode, proc.stdout) == (2, ""), proc.stdout + proc.stderr
        assert proc.stderr == ("error: start_training.sh: %s=%s (resolved: %s) is not in a mounted folder: what the run "
                               "writes there would be lost with the container; mount a host folder there (docker run "
                               "-v \"$PWD/out\":%s ...), or set REQUIRE_MOUNT=0\n" % (var, path, resolved, resolved))
    assert calls(fake) == [] and os.listdir(out) == []
    proc = start(OUTPUT_DIR=str(base / "inlink" / "run"))
    assert proc.returncode == 0 and len(result_lines(proc)) == 1, proc.stdout + proc.stderr
    assert (mnt / "run" / "run_finished.json").exists()


def test_the_image_asks_for_a_mount_and_runs_its_scripts_by_name():
    """The Dockerfile sets REQUIRE_MOUNT=1, and puts its code folder on PATH: `docker run IMAGE
    start_training.sh --help` (or train_model.sh) was "'start_training.sh' is neither a flag nor a command"."""
    import re
    text = open(os.path.join(ROOT, "Dockerfile")).read().replace("\\\n", " ")  # continuation lines joined
    workdir = re.findall(r"^WORKDIR (\S+)$", text, re.M)
    assert workdir == ["/workspace/bert"]
    env = {"PATH": "/usr/bin:/bin"}
    for line in re.findall(r"^ENV (.*)$", text, re.M):  # each ENV's NAME=VALUE in order, $NAME as it was
        for name, value in re.findall(r"(\w+)=(\S+)", line):
            env[name] = re.sub(r"\$(\w+)", lambda m: env.get(m.group(1), ""), value)
    assert env["REQUIRE_MOUNT"] == "1" and workdir[0] in env["PATH"].split(":"), env
    assert env["PATH"].split(":")[:3] == ["/opt/venv/bin", "/usr/bin", "/bin"]  # nothing of it before them


def _docker_ignored(patterns, path):
    """Whether .dockerignore's PATTERNS keep PATH (relative, /-separated) out of the build context: a
    pattern matches the path or a folder above it, `**/` any depth (those .dockerignore uses)."""
    import fnmatch
    parts = path.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    ignored = False
    for p in patterns:
        keep, p = p.startswith("!"), p.lstrip("!")
        hit = any(fnmatch.fnmatchcase(x, p) or (p.startswith("**/") and fnmatch.fnmatchcase(x.rsplit("/", 1)[-1], p[3:]))
                  for x in prefixes)
        if hit:
            ignored = not keep
    return ignored


def test_the_data_the_readme_makes_stays_out_of_the_image():
    """A sweep of the image: the README's commands make the data where they run (tfrecords/ 391 GB,
    results4/, tf1_ckpt/ 4 GB, a package in submission/); run in the checkout, `docker build .` copied
    them all into the image. They stay out; every file of MANIFEST.txt goes in."""
    with open(os.path.join(ROOT, ".dockerignore")) as f:
        patterns = [line.strip() for line in f if line.strip() and not line.startswith("#")]
    for path in ("tfrecords/part-00000-of-00500", "tfrecords/eval_10k", "results4/part-00000-of-00500",
                 "tf1_ckpt/model.ckpt-28252.data-00000-of-00001", "tf2_ckpt/model.ckpt-28252.index",
                 "packed/part-00000-of-00500", "text/AA/wiki_00", "out_eval/eval_results.txt",
                 "hf_bert/model.safetensors", "gradacc/model.ckpt-28252.index", "submission/ORG/results/x.txt",
                 "enwiki-20200101-pages-articles-multistream.xml.bz2", "out/model.ckpt-8.pt", "init.pt",
                 ".pytest_cache/v/cache/nodeids"):
        assert _docker_ignored(patterns, path), path
    from mlperf_bert.harness.package import source_files
    assert [p for p in source_files() if _docker_ignored(patterns, p)] == []


def _mllog(*records):
    """Lines of an MLPerf log: (time_ms, key, value, metadata)."""
    return "".join(':::MLLOG {"namespace": "", "time_ms": %d, "event_type": "POINT_IN_TIME", "key": "%s", "value": %s, '
                   '"metadata": %s}\n' % r for r in records)


def test_a_finished_run_whose_log_was_cut_is_refused_before_any_run(fake):
    """A review: a series' run_1 whose mlperf.log was cut (its run_stop gone) and whose result_1.txt was
    deleted was taken as "finished earlier" on a rerun, its cut log copied as result_1.txt (which
    package then refused); a single run's the same. A finished run is one whose log ends with its
    run_stop: each is one line naming the run's folder and the fix, before any run, nothing copied.
    And a single run's command (NUM_RUNS=1) on a series' folder holding run_1 alone (run_0 moved away)
    started a run beside it: refused as a series' folder is."""
    assert fake(NUM_RUNS="3", SEED="5").returncode == 0
    n, run_1 = len(calls(fake)), fake.out / "run_1"
    log = run_1 / "mlperf.log"
    log.write_text("".join(line for line in log.read_text().splitlines(True) if '"run_stop"' not in line))
    (fake.out / "result_1.txt").unlink()
    assert _one_error(fake(NUM_RUNS="3", SEED="5"), "error: start_training.sh: ") == (
        "error: start_training.sh: run 1 of 3 in %s: %s says the run ended (status success), but its MLPerf log %s "
        "does not end with its run_stop (cut, or written to, since): put them back as the run left them, or move %s "
        "and %s (where there) away to run run 1 again" % (run_1, run_1 / "run_finished.json", log, run_1,
                                                            fake.out / "result_1.txt"))
    assert len(calls(fake)) == n and not (fake.out / "result_1.txt").exists()
    shutil.move(str(fake.out / "run_0"), str(fake.out.parent / "run_0_moved"))
    assert _one_error(fake(SEED="5"), "error: start_training.sh: ") == (
        "error: start_training.sh: OUTPUT_DIR=%s holds a series of runs (run_1, ...): set NUM_RUNS as when it was "
        "started to go on with it, or use another OUTPUT_DIR for one run" % fake.out)
    assert len(calls(fake)) == n and not (fake.out / "mlperf.log").exists()
    one = fake.out.parent / "one"
    assert fake(SEED="5", OUTPUT_DIR=str(one)).returncode == 0
    (one / "mlperf.log").write_text((one / "mlperf.log").read_text()[:-30])  # cut mid-line
    assert _one_error(fake(SEED="5", OUTPUT_DIR=str(one)), "error: start_training.sh: ") == (
        "error: start_training.sh: the run in %s: %s says the run ended (status success), but its MLPerf log %s does "
        "not end with its run_stop (cut, or written to, since): put them back as the run left them, or use another "
        "OUTPUT_DIR to run it again" % (one, one / "run_finished.json", one / "mlperf.log"))
    assert len(calls(fake)) == n + 1


def test_a_later_runs_missing_log_is_refused_before_run_0_trains(fake):
    """The last stop's "left": a series' run_2 that finished (or checkpointed) and whose mlperf.log and
    result_2.txt were removed was refused only when the series reached it, after run 0 (rerun, its folder moved away)
    had trained again. Now one line naming run_2's marker or checkpoint and the log, before any run."""
    assert fake(NUM_RUNS="3", SEED="5").returncode == 0
    n, run_2 = len(calls(fake)), fake.out / "run_2"
    (run_2 / "mlperf.log").unlink()
    (fake.out / "result_2.txt").unlink()  # (with it, the comparison of the two refuses it before run 0)
    shutil.rmtree(fake.out / "run_0")
    (fake.out / "result_0.txt").unlink()
    fix = ": put them back as the run left them, or move %s and %s (where there) away to run run 2 again" % (
        run_2, fake.out / "result_2.txt")
    assert _one_error(fake(NUM_RUNS="3", SEED="5"), "error: start_training.sh: ") == (
        "error: start_training.sh: run 2 of 3 in %s: %s says the run ended, but its MLPerf log %s is missing%s"
        % (run_2, run_2 / "run_finished.json", run_2 / "mlperf.log", fix))
    (run_2 / "run_finished.json").unlink()  # a run stopped at its checkpoint (the newest named)
    for name in ("model.ckpt-3.pt", "model.ckpt-12.pt", "model.ckpt-best.pt"):
        (run_2 / name).write_bytes(b"")
    (run_2 / "mlperf_log_path.json").write_text('{"mlperf_log": "%s"}' % (run_2 / "mlperf.log"))
    assert _one_error(fake(NUM_RUNS="3", SEED="5"), "error: start_training.sh: ") == (
        "error: start_training.sh: run 2 of 3 in %s: %s holds the run so far, but its MLPerf log %s is missing%s"
        % (run_2, run_2 / "model.ckpt-12.pt", run_2 / "mlperf.log", fix))
    assert len(calls(fake)) == n and not (fake.out / "run_0").exists()
    # a checkpoint of a version before the log's record resumes onto a new log; a name the trainer
    # does not write is no checkpoint: the series goes on
    (run_2 / "mlperf_log_path.json").unlink()
    assert fake(NUM_RUNS="3", SEED="5").returncode == 0 and len(calls(fake)) == n + 2  # runs 0 and 2
    (run_2 / "mlperf_log_path.json").write_text("{}")
    for name in ("model.ckpt-3.pt", "model.ckpt-12.pt", "run_finished.json", "mlperf.log", "../result_2.txt"):
        (run_2 / name).unlink()
    assert fake(NUM_RUNS="3", SEED="5").returncode == 0 and len(calls(fake)) == n + 3  # run 2


def test_an_end_marker_whose_status_is_not_its_logs_is_refused_naming_both(fake, tmp_path, capsys):
    """A review: a run_stopped.json whose status was edited ("success"; the log's run_stop says "aborted")
    was not compared with the log: the rerun finished the run as a success (the trainer copies that
    record into run_finished.json), and a run_finished.json edited so was reported "finished earlier
    (success)". The status is the two files' agreement; a disagreement is one line naming both, before
    any run (a series' later run too)."""
    from mlperf_bert.harness import run_state
    log = _mllog((1, "seed", 5, "{}"), (1000, "run_start", "null", "{}"),
                 (80300, "run_stop", "null", '{"status": "aborted", "samples_count": 120}'))
    for marker in ("run_stopped.json", "run_finished.json"):
        out = tmp_path / marker.split(".")[0]
        out.mkdir()
        (out / "mlperf.log").write_text(log)
        (out / marker).write_text('{"status": "success", "global_step": 30, "samples": 120}')
        assert run_state.main(["run_state", str(out), str(out / "mlperf.log")]) == 0
        assert capsys.readouterr().out == "5 %s - 79.3 -\n0 %s says the run ended with status success, but the " \
            "run_stop of its MLPerf log %s says aborted (one of them was changed since)\n" % (
                "success" if marker == "run_finished.json" else "-", out / marker, out / "mlperf.log")
        (out / marker).write_text('{"status": "aborted", "global_step": 30, "samples": 120}')
        assert run_state.disagreement(str(out), str(out / "mlperf.log")) is None
    stopped = tmp_path / "run_stopped"
    (stopped / "run_stopped.json").write_text('{"status": "success", "global_step": 30, "samples": 120}')
    assert _one_error(fake(SEED="5", OUTPUT_DIR=str(stopped)), "error: start_training.sh: ") == (
        "error: start_training.sh: the run in %s: %s says the run ended with status success, but the run_stop of its "
        "MLPerf log %s says aborted (one of them was changed since): put them back as the run left them, or use "
        "another OUTPUT_DIR to run it again" % (stopped, stopped / "run_stopped.json", stopped / "mlperf.log"))
    assert not calls(fake)
    assert fake(NUM_RUNS="2", SEED="5").returncode == 0
    run_1 = fake.out / "run_1"
    for path in (run_1 / "mlperf.log", fake.out / "result_1.txt"):  # (the stand-in's run_stop logs no status)
        path.write_text(log)
    assert _one_error(fake(NUM_RUNS="2", SEED="5"), "error: start_training.sh: ") == (
        "error: start_training.sh: run 1 of 2 in %s: %s says the run ended with status success, but the run_stop of "
        "its MLPerf log %s says aborted (one of them was changed since): put them back as the run left them, or move "
        "%s and %s (where there) away to run run 1 again" % (run_1, run_1 / "run_finished.json", run_1 / "mlperf.log",
                                                            run_1, fake.out / "result_1.txt"))
    assert len(calls(fake)) == 2


def test_relative_paths_in_python_output_dir_and_logdir_are_the_callers(fake, tmp_path):
    """A hostile sweep: OUTPUT_DIR=newout (or LOGDIR=logs, the default's form ./output) whose first
    folder did not exist looped for ever in train_model.sh's check of the folders above it (bash at
    100% CPU, no line; examples/submit.sh hung with it); a relative PYTHON passed the checks, then
    each step run from the checkout ended "No such file or directory": start_training.sh "cannot read
    the state of the run ... check PYTHON", an rcp preset bash's own error line. Each is relative to
    the caller's folder, as a user reads it."""
    (tmp_path / "venv").symlink_to(os.path.dirname(os.path.dirname(sys.executable)))
    python = os.path.join("venv", "bin", os.path.basename(sys.executable))
    env = dict(fake.env, SEED="5")
    proc = subprocess.run([START, "--preset=demo_cpu"], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                          env=dict(env, PYTHON=python))
    assert proc.returncode == 0 and len(result_lines(proc)) == 1, proc.stdout + proc.stderr
    proc = subprocess.run([TRAIN, "--preset=rcp_256", "--dry_run"], capture_output=True, text=True, cwd=tmp_path,
                          timeout=60, env=dict(env, PYTHON=python, NUM_GPUS="8"))
    assert proc.returncode == 0 and "--train_batch_size=256" in proc.stdout, proc.stderr
    for var, value in (("OUTPUT_DIR", "newout"), ("OUTPUT_DIR", "new/out"), ("LOGDIR", "logs/a")):
        proc = subprocess.run([TRAIN, "--preset=demo_cpu"], capture_output=True, text=True, cwd=tmp_path, timeout=60,
                              env=dict(env, CHECK_ONLY="1", **{var: value}))
        assert proc.returncode == 0 and "the settings pass" in proc.stdout + proc.stderr, (var, proc.stderr)
        assert not (tmp_path / value.split("/")[0]).exists()  # a check makes nothing
    (tmp_path / "afile").write_text("")
    proc = subprocess.run([TRAIN, "--preset=demo_cpu"], capture_output=True, text=True, cwd=tmp_path, timeout=60,
                          env=dict(env, CHECK_ONLY="1", OUTPUT_DIR="afile/out"))
    assert (proc.returncode, proc.stderr) == (2, "error: train_model.sh: OUTPUT_DIR=afile/out: afile is not a directory: "
                                                 "give a directory (made if missing)\n")


def test_the_demos_run_limit_is_the_launchers():
    """demo --runs refuses, before it makes its data, what start_training.sh's NUM_RUNS refuses."""
    import re
    from mlperf_bert.demo import MAX_RUNS
    text = open(os.path.join(ROOT, "start_training.sh")).read()
    assert re.findall(r"^MAX_RUNS=(\d+)$", text, re.M) == [str(MAX_RUNS)]


@pytest.mark.parametrize("name,script", [("SEED", START), ("NUM_RUNS", START), ("NUM_GPUS", TRAIN), ("DATA_DIR", START)])
def test_a_value_with_a_newline_is_a_one_line_error(fake, tmp_path, name, script):
    """A sweep of the series path: SEED=$'5\\n6' (NUM_RUNS, NUM_GPUS, DATA_DIR) was refused in an error
    of two lines, the value's newline splitting it. The value's newline is written \\n."""
    env = dict(fake.env, **{name: "5\n6"})
    env.pop("TRAIN_MODEL")
    env.update(OUTPUT_DIR=str(tmp_path / "o"), CHECK_ONLY="1")
    if name == "DATA_DIR":
        env["DATA_DIR"] = str(tmp_path / "no\nsuch")
    proc = subprocess.run([script, "--preset=demo_cpu"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("error: ") and "\\n" in proc.stderr, proc.stderr
