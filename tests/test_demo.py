"""The built-in demo: a stop (docker stop, SIGTERM) and the rerun that resumes it; its threads."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from procs import stop_as_handlers_are_set

from mlperf_bert import demo

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def finish(folder):
    """The trainer's marker of a run that ended (trainer/checkpoint.py writes it)."""
    (folder / demo.run_state.FINISHED).write_text(json.dumps({"status": "success", "global_step": 4}))


def test_training_folder_is_kept_only_for_a_stopped_run_of_the_same_settings(tmp_path):
    train = tmp_path / "train"
    settings = {"seed": 1, "max_samples": 3200}
    assert not demo.prepare_training_dir(str(train), settings, 1)  # nothing there: a fresh run
    (train / "model.ckpt-4.pt").write_bytes(b"x")
    assert demo.prepare_training_dir(str(train), settings, 1)  # stopped: resumed
    assert (train / "model.ckpt-4.pt").exists()
    assert not demo.prepare_training_dir(str(train), dict(settings, seed=2), 1)  # other settings: afresh
    assert not (train / "model.ckpt-4.pt").exists()
    assert json.loads((train / demo.SETTINGS).read_text()) == dict(settings, seed=2)
    (train / "model.ckpt-4.pt").write_bytes(b"x")
    finish(train)  # the training finished, the demo did not (a stop in check-log): kept, not trained again
    assert demo.prepare_training_dir(str(train), dict(settings, seed=2), 1)
    assert (train / "model.ckpt-4.pt").exists()
    demo.demo_finished(str(train), dict(settings, seed=2))  # the demo ended: it runs again
    assert not demo.prepare_training_dir(str(train), dict(settings, seed=2), 1)
    assert not (train / "model.ckpt-4.pt").exists()
    # --runs: resumed while one run of the series has not finished
    (train / "run_0").mkdir()
    finish(train / "run_0")
    assert demo.prepare_training_dir(str(train), dict(settings, seed=2), 2)


def test_training_env_drops_a_real_runs_settings(tmp_path, monkeypatch):
    """(its one thread is the demo_cpu preset's: tests/test_launchers.py)"""
    monkeypatch.setenv("SEED", "5")  # a real run's setting must not reach the demo's run
    assert "SEED" not in demo.training_env("/d", "/t")


@pytest.mark.parametrize("name,value", [("CHECK_ONLY", "1"), ("CHECK_ONLY", "files"), ("TRAIN_MODEL", "/bin/true"),
                                        ("NODE_RANK", "1")])
def test_a_launch_setting_of_the_environment_does_not_reach_the_demos_training(name, value, monkeypatch):
    """A hostile sweep: an exported CHECK_ONLY=1 made the demo's train_model.sh a check that ran
    nothing; the demo then printed "demo finished", its log and curve missing, and marked itself
    ended. TRAIN_MODEL replaced --runs' training script; NODE_RANK=1 refused its one node."""
    monkeypatch.setenv(name, value)
    assert name not in demo.training_env("/d", "/t")


@pytest.mark.slow
def test_sigterm_checkpoints_and_the_rerun_resumes(tmp_path):
    """docker stop on the demo (SIGTERM to it alone, process 1 of its container): the training
    checkpoints, the demo says how to go on, and the same command resumes instead of starting over.
    Stopped after the eval at the start (accuracy 0.0; run_start is before it, so the signal
    checkpoints at the next update); the target 0.01 is reached at the next eval, at 256 samples
    (0.016): the rerun trains the rest of the 256, not all of it (the stop has the same 16
    micro-steps to that eval to land in, 0.1 s each, as a stop after the eval at 256 with the target
    at 512 had, for half the training)."""
    out = tmp_path / "demo"
    cmd = [sys.executable, "-m", "mlperf_bert", "demo", "--output_dir=%s" % out, "--dupe_factor=2",
           "--max_samples=4800", "--eval_frequency=256", "--target=0.01"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    log = out / "train" / "mlperf.log"
    deadline = time.time() + 300
    while not (log.exists() and log.read_text().count('"key": "eval_accuracy"') >= 1):
        assert proc.poll() is None and time.time() < deadline, proc.communicate()[0]
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    first = proc.communicate(timeout=300)[0]
    assert proc.returncode == 143, first
    saved = [n for n in os.listdir(out / "train") if n.endswith(".pt")]
    assert len(saved) == 1 and "SIGTERM: checkpoint %s written" % saved[0] in first, first
    assert "demo: stopped by SIGTERM during train_model.sh --preset=demo_cpu; rerun the same command" in first
    step = int(saved[0].split("-")[1].split(".")[0])

    again = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "demo: resuming the stopped run in %s" % (out / "train") in again.stdout
    assert "log checker            PASSED" in again.stdout
    assert (out / "train" / saved[0]).exists()  # kept: the run went on from it
    finished = json.loads((out / "train" / "run_finished.json").read_text())
    assert finished["global_step"] > step
    # one run in the log: its start once, the stop and the resume in between
    assert log.read_text().count('"key": "run_start"') == 1


_STEP_STOPPED_IN_ITS_INIT = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: os._exit(%d))
os.kill(os.getppid(), signal.SIGTERM)  # the demo is signalled while its step runs
time.sleep(60)
"""


@pytest.mark.parametrize("status", [79, 143])
def test_a_step_stopped_with_nothing_saved_is_the_demos_status(status, tmp_path, monkeypatch, capsys):
    """Issue 45.2: 143 means a checkpoint holds the run. The demo said 143 for any stop; a training
    stopped before its first checkpoint (the trainer's 79) is 79 with a line saying nothing was saved.
    The step here is a stand-in that signals the demo and exits with the trainer's status when the
    demo passes the SIGTERM on."""
    def one_step(fv, out):
        demo._run([sys.executable, "-c", _STEP_STOPPED_IN_ITS_INIT % status], "train")
        raise AssertionError("a stopped step must raise Stopped")
    monkeypatch.setattr(demo, "_demo", one_step)
    assert demo.main(["demo", "--output_dir=%s" % tmp_path]) == status
    out = capsys.readouterr().out
    assert ("nothing was saved" in out) == (status == 79), out
    assert "rerun the same command" in out


def test_a_signal_while_a_step_starts_reaches_the_step(monkeypatch):
    """A SIGTERM that came while Popen started a step (its process made, the demo's pass-on not yet
    set) found the caller's handler: the step ran to its end (a whole training) before the demo
    stopped. Here it comes as Popen returns; the step (a 20 s sleep) ends at once by it."""
    real, outer = subprocess.Popen, []

    def popen(*a, **k):
        proc = real(*a, **k)
        os.kill(os.getpid(), signal.SIGTERM)
        return proc
    monkeypatch.setattr(demo.subprocess, "Popen", popen)
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: outer.append(signum))
    try:
        t = time.time()
        with pytest.raises(demo.Stopped) as stopped:
            demo._run([sys.executable, "-c", "import time; time.sleep(600)"], "train")
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert time.time() - t < 120 and not outer  # ended, not waited out (600 s)
    assert stopped.value.signum == signal.SIGTERM and stopped.value.status == -signal.SIGTERM


def test_a_signal_before_a_step_starts_starts_no_step(monkeypatch):
    """A stop that came as the demo set its pass-on, before it started the step: the step is not
    started (a training would only be stopped in its import of torch)."""
    started = []
    monkeypatch.setattr(demo.subprocess, "Popen", lambda *a, **k: started.append(a))
    with stop_as_handlers_are_set(monkeypatch, demo), pytest.raises(demo.Stopped) as stopped:
        demo._run([sys.executable, "-c", "pass"], "train")
    assert not started and stopped.value.signum == signal.SIGTERM and stopped.value.status is None


def _no_data(*a, **k):
    raise AssertionError("the demo went on to make its data")


@pytest.mark.parametrize("flag,message", [("--runs=-1", "--runs=-1 must be at least 1"),
                                          ("--runs=101", "--runs=101 is more than the 100 runs a series takes (a "
                                                         "BERT submission has 10)"),
                                          ("--seed=-1", "--seed=-1 must be at least 0"),
                                          ("--target=2", "--target=2.0 must be a masked-LM accuracy in (0, 1] (leave "
                                                         "it out for the demo_cpu preset's)"),
                                          ("--dupe_factor=0", "--dupe_factor=0 must be at least 2"),
                                          ("--dupe_factor=1", "--dupe_factor=1 must be at least 2"),
                                          ("--seed=%d" % 2 ** 64, "--seed=%d must be below 2**64" % 2 ** 64),
                                          ("extra", "unexpected argument 'extra': this command takes only "
                                                    "--flag=value arguments (lists are comma-separated, without "
                                                    "spaces)")])
def test_a_demo_flag_out_of_range_is_refused_before_anything_is_made(tmp_path, monkeypatch, flag, message):
    """A hostile sweep: --runs=-1 ran once; --target=2 and --seed=-1 failed only in the trainer, after
    the vocab and the dataset were made, in 2 error lines. A second sweep: --dupe_factor=1 failed in
    make-dataset (eval_intermediate has 254 records, fewer than the demo's 500) naming make-dataset's
    --num_eval_examples, which the demo has not; --seed=2**64 failed in the trainer; an argument that is
    no flag (``--packed true``) was dropped."""
    from mlperf_bert.errors import UserError
    monkeypatch.setattr(demo, "make_data", _no_data)
    with pytest.raises(UserError) as e:
        demo.main(["demo", "--output_dir=%s" % (tmp_path / "out"), flag])
    assert str(e.value) == message and not (tmp_path / "out").exists()


def test_an_empty_output_dir_is_refused_not_the_current_folder(tmp_path, monkeypatch):
    """--output_dir= was the current folder: its tfrecords/, packed/ and train/ deleted and the demo's
    files written among the user's."""
    from mlperf_bert.errors import UserError
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(demo, "make_data", _no_data)
    with pytest.raises(UserError) as e:
        demo.main(["demo", "--output_dir="])
    assert str(e.value) == "--output_dir is empty: give the folder the demo writes to (default demo_out)"
    assert os.listdir(tmp_path) == []


def test_a_second_demo_on_the_same_output_is_refused(tmp_path, monkeypatch):
    """Two demos at once on one --output_dir: the second remade the TFRecords under the first's running
    training, said "resuming the stopped run" of it, and failed only in the trainer's lock of train/."""
    from mlperf_bert import locking
    from mlperf_bert.errors import UserError
    monkeypatch.setattr(demo, "make_data", _no_data)
    with locking.lock_dir(str(tmp_path), "--output_dir"):  # the first demo, running
        with pytest.raises(UserError) as e:
            demo.main(["demo", "--output_dir=%s" % tmp_path])
    assert str(e.value).startswith("--output_dir %s is in use by another run (pid %d " % (tmp_path, os.getpid()))


_STEP_GETS_A_TERMINALS_CTRL_C = """
import os, signal, time
signal.signal(signal.SIGTERM, lambda *_: os._exit(143))
os.kill(os.getpid(), signal.SIGINT)  # a terminal's Ctrl-C goes to the whole process group: the step
os.kill(os.getppid(), signal.SIGINT)  # and the demo
time.sleep(60)
"""


def test_a_terminals_ctrl_c_stops_a_step_once(capfd):
    """Ctrl-C at a terminal reaches the demo and its step, and the demo passed it on as SIGTERM: the
    step got SIGINT and SIGTERM, and make-dataset, its pool's wait cut by the second, ended in
    tracebacks ("RuntimeError: release unlocked lock", "Exception ignored in atexit callback"). The
    step ignores SIGINT: the demo's SIGTERM is its one stop. Here the step plays the terminal."""
    with pytest.raises(demo.Stopped) as stopped:
        demo._run([sys.executable, "-c", _STEP_GETS_A_TERMINALS_CTRL_C], "make-dataset")
    assert stopped.value.signum == signal.SIGINT and stopped.value.status == 143
    assert "Traceback" not in capfd.readouterr().err


def test_a_stop_after_the_training_keeps_it_and_the_rerun_goes_on(tmp_path, monkeypatch, capsys):
    """A stop in check-log or plot-log said "rerun the same command to resume (train keeps the
    training's checkpoints)", and the rerun deleted the finished training and ran it again from the
    start. Now the rerun goes on from check-log; once the demo has ended, a rerun trains afresh. The
    steps are stand-ins (the training writes its finished marker)."""
    monkeypatch.setattr(demo, "make_data", lambda out, *a: (None, None, str(tmp_path / "tfrecords"), None))
    ran, stop_in = [], ["check-log"]

    def step(cmd, what, env=None, rerun="go on"):
        name = os.path.basename(cmd[0]) if cmd[0].endswith(".sh") else cmd[3]
        ran.append(name)
        if name == "train_model.sh":
            finish(tmp_path / "train")
        if name in stop_in:
            stopped = demo.Stopped(signal.SIGINT, what, -signal.SIGTERM)
            stopped.rerun = rerun
            raise stopped
        return 0
    monkeypatch.setattr(demo, "_run", step)
    argv = ["demo", "--output_dir=%s" % tmp_path]
    assert demo.main(argv) == 130 and ran == ["train_model.sh", "check-log"]
    assert ("demo: stopped by SIGINT during check-log (official checker + BERT rules); rerun the same command to "
            "go on (%s keeps the finished training: it is not run again)" % (tmp_path / "train")
            ) in capsys.readouterr().out
    ran[:], stop_in[:] = [], []
    assert demo.main(argv) == 0 and ran == ["check-log", "plot-log"]
    assert "demo: the training in %s had finished in a demo that did not end" % (tmp_path / "train") in (
        capsys.readouterr().out)
    ran[:] = []
    assert demo.main(argv) == 0 and ran == ["train_model.sh", "check-log", "plot-log"]


def test_a_training_started_afresh_and_stopped_leaves_nothing_the_last_demo_made_of_its_training(tmp_path,
                                                                                                monkeypatch):
    """A hostile sweep: a demo rerun after one ended (or with other flags), stopped in its training, kept
    the last demo's demo_curve.png (and a --runs demo's package, systems JSON and score plots) beside the
    new run's checkpoint, looking finished. The steps are stand-ins."""
    monkeypatch.setattr(demo, "make_data", lambda out, *a: (None, None, str(tmp_path / "tfrecords"), None))
    stop_in = []

    def step(cmd, what, env=None, rerun="go on"):
        name = os.path.basename(cmd[0]) if cmd[0].endswith(".sh") else cmd[3]
        if name in stop_in:
            (tmp_path / "train" / "model.ckpt-2.pt").write_bytes(b"x")  # the stop's checkpoint
            raise demo.Stopped(signal.SIGTERM, what, 143, rerun)
        if name == "train_model.sh":
            finish(tmp_path / "train")
        if name == "plot-log":
            (tmp_path / "demo_curve.png").write_bytes(b"png")
        return 0
    monkeypatch.setattr(demo, "_run", step)
    argv = ["demo", "--output_dir=%s" % tmp_path]
    assert demo.main(argv) == 0 and (tmp_path / "demo_curve.png").exists()
    (tmp_path / "package").mkdir()
    earlier = [tmp_path / "demo_curve.png", tmp_path / (demo.SYSTEM + ".system.json"), tmp_path / "package.score_times.png",
               tmp_path / ("package.%s.score_convergence.png" % demo.SYSTEM), tmp_path / "package"]
    for path in earlier[1:-1]:
        path.write_bytes(b"x")
    stop_in.append("train_model.sh")
    assert demo.main(argv) == 143
    assert [p.name for p in earlier if p.exists()] == []
    (tmp_path / "demo_curve.png").write_bytes(b"png")  # a stop in the resumed training keeps what the rerun made
    assert demo.main(argv) == 143 and (tmp_path / "demo_curve.png").exists()


@pytest.mark.parametrize("status", [None, -signal.SIGTERM, 143])
def test_a_training_stopped_before_its_first_checkpoint_is_79_whatever_the_step_said(tmp_path, monkeypatch, capsys,
                                                                                    status):
    """A hostile sweep (a demo stopped and rerun 16 times): a training started afresh and stopped before
    train_model.sh had set its trap (killed by the signal: -15), or before it started (None), was 143,
    "train/ keeps the training's checkpoints", with none there. Now 79 and "nothing was saved", as the
    trainer's own 79 is; a stop with a checkpoint stays 143. The steps are stand-ins."""
    monkeypatch.setattr(demo, "make_data", lambda out, *a: (None, None, str(tmp_path / "tfrecords"), None))

    def step(cmd, what, env=None, rerun="go on"):
        if status == 143:
            (tmp_path / "train" / "model.ckpt-2.pt").write_bytes(b"x")
        raise demo.Stopped(signal.SIGTERM, what, status, rerun)
    monkeypatch.setattr(demo, "_run", step)
    assert demo.main(["demo", "--output_dir=%s" % tmp_path]) == (143 if status == 143 else 79)
    assert ("nothing was saved" in capsys.readouterr().out) == (status != 143)


@pytest.mark.parametrize("checkpoint", ["", "train", "train/run_0"])
def test_a_data_step_stopped_is_79_where_no_checkpoint_holds_the_demo(tmp_path, monkeypatch, capsys, checkpoint):
    """A hostile sweep: a fresh demo stopped in make-dataset (`start_training.sh` without DATA_DIR,
    SIGTERM a second in) was 143, the status that says a checkpoint holds the run, with none anywhere
    (the rerun remakes the data). Now 79, as a training stopped before its first checkpoint; a
    checkpoint of the training (a --runs series' in its run's folder) keeps 143."""
    def stopped(out, *a):
        if checkpoint:
            (tmp_path / checkpoint).mkdir(parents=True, exist_ok=True)
            (tmp_path / checkpoint / "model.ckpt-2.pt").write_bytes(b"x")
        raise demo.Stopped(signal.SIGTERM, "make-dataset")
    monkeypatch.setattr(demo, "make_data", stopped)
    assert demo.main(["demo", "--output_dir=%s" % tmp_path]) == (143 if checkpoint else 79)
    assert ("nothing was saved" in capsys.readouterr().out) == (not checkpoint)


@pytest.mark.parametrize("checkpoint", [False, True])
def test_a_stop_as_the_demo_starts_or_between_its_steps_is_79_where_no_checkpoint_holds_it(tmp_path, monkeypatch,
                                                                                            checkpoint):
    """A hostile sweep: a fresh demo stopped as it started (its modules, flags, folder, vocab: no step
    running) said `error: terminated (SIGTERM); finished outputs are kept`, 143, with no checkpoint
    anywhere. Now its start's handler and a stop between its steps say 79; a checkpoint keeps 143."""
    from mlperf_bert.errors import Terminated
    from mlperf_bert.start_signals import demo_start_stop
    def stopped(out, *a):
        if checkpoint:  # (the folder claimed: the demo's own)
            (tmp_path / "train").mkdir()
            (tmp_path / "train" / "model.ckpt-2.pt").write_bytes(b"x")
        raise Terminated()
    monkeypatch.setattr(demo, "make_data", stopped)
    with pytest.raises(Terminated) as e:
        demo.main(["demo", "--output_dir=%s" % tmp_path])
    assert e.value.status == (143 if checkpoint else 79)
    line, status = demo_start_stop("SIGTERM", ["--output_dir", str(tmp_path)])
    assert status == (143 if checkpoint else 79) and ("exit 79" in line) != checkpoint


def test_a_folder_the_demo_did_not_make_is_refused_and_its_folders_are_kept(tmp_path, monkeypatch):
    """The demo deletes and remakes tfrecords/, packed/, train/ and package/ of its --output_dir: given a
    user's folder by mistake (say a project holding its own train/), it deleted them. A folder of other
    files is refused; a new or empty one is marked the demo's, and so is a demo's folder from before
    the marker (its train/ holds the demo's settings)."""
    from mlperf_bert.errors import UserError
    monkeypatch.setattr(demo, "make_data", _no_data)
    users = tmp_path / "project"
    (users / "train").mkdir(parents=True)
    (users / "train" / "notes.txt").write_text("mine")
    (users / "tfrecords").mkdir()
    with pytest.raises(UserError) as e:
        demo.main(["demo", "--output_dir=%s" % users])
    assert str(e.value) == ("--output_dir %s holds files the demo did not make (tfrecords, train): give a new or "
                            "empty folder (the demo deletes and remakes the tfrecords/, packed/, train/ and "
                            "package/ of its folder)" % users)
    assert sorted(os.listdir(users)) == ["tfrecords", "train"] and (users / "train" / "notes.txt").exists()
    for folder in (tmp_path / "new", tmp_path / "empty", tmp_path / "older_demo"):
        if folder.name == "empty":
            folder.mkdir()
        elif folder.name == "older_demo":
            (folder / "train").mkdir(parents=True)
            (folder / "train" / demo.SETTINGS).write_text("{}")
        with pytest.raises(AssertionError, match="the demo went on to make its data"):
            demo.main(["demo", "--output_dir=%s" % folder])
        assert (folder / demo.OWN_MARKER).is_file()
    (users / demo.OWN_MARKER).write_text("{}")  # once the demo's, its rerun goes on
    with pytest.raises(AssertionError, match="the demo went on to make its data"):
        demo.main(["demo", "--output_dir=%s" % users])


def test_the_demos_eval_frequency_and_target_are_its_presets_and_a_rerun_spelling_them_out_resumes():
    """The demo's eval frequency and target were written twice, in demo.py and in the demo_cpu preset;
    they are the preset's alone now, as train_model.sh passes them (its dry run). A review of that
    change: the settings a stopped demo's rerun must match held null where earlier versions (and a
    rerun given them spelt out) held the values, so that demo started over: they hold the values."""
    from mlperf_bert import flags
    from test_launchers import command_flags, dry_run
    _, fl = command_flags(dry_run("--preset=demo_cpu", NUM_GPUS="1"))
    settings = []
    spelt = ["--eval_frequency=" + fl["eval_frequency"], "--target=" + fl["target_mlm_accuracy"]]
    for argv in (["demo"], ["demo"] + spelt):
        fv = demo.define_flags()
        flags.parse(fv, argv, positional=False)
        settings.append(demo.settings_of(fv))
    assert settings[0] == settings[1]
    assert (settings[0]["eval_frequency"], settings[0]["target"]) == (int(fl["eval_frequency"]),
                                                                    float(fl["target_mlm_accuracy"]))
    run = demo.run_flags(settings[0]["eval_frequency"], 100, settings[0]["target"])
    assert {"--eval_frequency=" + fl["eval_frequency"], "--target_mlm_accuracy=" + fl["target_mlm_accuracy"]} <= set(run)
