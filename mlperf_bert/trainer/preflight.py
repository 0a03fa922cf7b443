"""The start-of-run refusals of run_pretraining.py: each says in one line what is wrong and how
to fix it, before the run writes anything. Flags (``check_flags``, before any device or process
group), then inputs, closed-division data, output directory and log path (``check_start``), then,
when a run goes on, the log's owner and the resume's identity (``check_log_owner``,
``finished_before``, ``check_resume``)."""
import collections
import glob
import os
import stat
import sys

from mlperf_bert import locking
from mlperf_bert.errors import UserError
from mlperf_bert.fileio import (OutputDirError, check_tmpdir, check_writable_dir, remove_stale_temporaries,
                                 same_file)
from mlperf_bert.dataset.tfrecord import refuse_copies
from mlperf_bert.harness.mlperf_log import check_prefix, is_mlperf_log
from mlperf_bert.trainer import checkpoint, distributed, flag_checks, loader
from mlperf_bert.trainer.flag_checks import OPEN as _OPEN


def check_closed_data(cfg, eval_files, global_batch, rank):
    """The eval set must be the 10,000 samples; hyperparameters that differ from the RCP of this
    global batch are allowed by the rules (published closed runs did so) and get a warning."""
    from mlperf_bert.harness import compliance, rcp
    n = loader.count_records(eval_files)
    if n != compliance.CLOSED_EVAL_SAMPLES:
        raise UserError("--submission_division=closed evaluates on the {0:,} samples of eval_10k, --eval_input_file "
                        "{1} has {2:,}: make eval_10k from eval_intermediate with pick_eval_samples.py "
                        "--num_examples_to_pick={0} and give it, {3}".format(
                            compliance.CLOSED_EVAL_SAMPLES, cfg.eval.eval_input_file, n, _OPEN))
    if rank != 0:
        return
    entry = rcp.rcp_entry(global_batch)
    rows = rcp.rcp_entry(cfg.global_batch) if global_batch != cfg.global_batch else None
    if rows is not None and entry is None:
        # (a sweep: --preset=rcp_3072 on rows of 1.0455 sequences logged 3,212 without a word)
        print("warning: packed rows: %d rows an update, %d samples (sequences) in the log's global_batch_size, the"
              " RCP check's unit: it compares this run with RCPs interpolated at %d, not with %s, whose hyperparameters"
              " it has; for that RCP's own batch train on unpacked records" % (
                  cfg.global_batch, global_batch, global_batch, rows[0]), file=sys.stderr, flush=True)
    if entry is None:
        return
    name, hp = entry
    o, sc = cfg.optim, cfg.schedule
    ours = {"opt_base_learning_rate": o.learning_rate, "opt_epsilon": o.epsilon,
            "opt_learning_rate_training_steps": cfg.updates(sc.num_train_steps),
            "num_warmup_steps": cfg.updates(sc.num_warmup_steps),
            "start_warmup_step": cfg.updates(sc.start_warmup_step),
            "opt_lamb_beta_1": o.lamb_beta_1, "opt_lamb_beta_2": o.lamb_beta_2,
            "opt_lamb_weight_decay_rate": o.lamb_weight_decay_rate}
    other = ["%s %s (RCP %s)" % (key, "%.10g" % value, hp[key]) for key, value in ours.items()
             if key in hp and abs(value - hp[key]) > 1e-9 * max(abs(hp[key]), 1e-30)]
    if other:
        print("warning: closed division at global batch %d, which has the reference convergence point %s: this "
              "run has %s; the rules allow it (the RCP check compares convergence, not hyperparameters), "
              "train_model.sh --preset=rcp_%d uses the RCP's" % (global_batch, name, ", ".join(other), global_batch),
              file=sys.stderr, flush=True)


def warn_schedule(cfg, packed, freq, evaluates, samples_per_update):
    """Warnings (rank 0, at the start) for flags the reference takes but that waste the run: micro-steps
    after the last update (trained, never applied), no online eval set, and, unpacked, an online eval
    set that no eval reaches before the run ends (a log without eval_accuracy, which the checkers fail).
    ``samples_per_update``: the log's global batch (packed: in sequences, as --max_samples_termination)."""
    sc, n = cfg.schedule, cfg.optim.steps_per_update
    steps = sc.num_train_steps
    batch, update = cfg.data.train_batch_size, cfg.global_batch
    # (in sequences: an update counted in rows put a packed run's end past --max_samples_termination's
    # update, and the warning named micro-steps that the run never trains)
    last_step = cfg.last_step(samples_per_update)
    end = last_step * batch  # the samples count at the end (unpacked)
    if steps % n and last_step == steps:  # (ended first by the former: no micro-step is left unapplied)
        print("warning: --num_train_steps=%d is not a multiple of --steps_per_update=%d: the last %d micro-step(s) "
              "are trained but never applied (as in the reference), and the log's opt_learning_rate_training_steps "
              "is %s updates; give a multiple (%d)" % (steps, n, steps % n, cfg.updates(steps), steps - steps % n),
              file=sys.stderr, flush=True)
    odd = [(name, getattr(sc, name)) for name in ("num_warmup_steps", "start_warmup_step") if getattr(sc, name) % n]
    if odd:  # (a sweep: the log's 1.3333333333333333 warm-up updates, without a word)
        print("warning: %s not a multiple of --steps_per_update=%d: the log has %s updates, a fraction" % (
            " and ".join("--%s=%d" % kv for kv in odd), n, " and ".join(str(cfg.updates(v)) for _, v in odd)),
            file=sys.stderr, flush=True)
    if not evaluates:  # (a sweep: said nothing, and logged eval_frequency for evals that never came)
        print("warning: no --eval_input_file: no online eval and no stop at the target; the log will have no "
              "eval_accuracy (the checkers fail it): give the eval set (eval_10k) for a log that can be checked",
              file=sys.stderr, flush=True)
        return
    if packed or cfg.eval.eval_at_start:  # packed: a step's samples are known only as it runs
        return
    last = end // update * update  # the last update's (where an eval can come)
    if last < freq:
        print("warning: no online eval before the run ends: the first comes at %s samples (eval_frequency), the "
              "last update at %s; the log will have no eval_accuracy (the checkers fail it): lower "
              "--eval_frequency or train longer" % (format(freq, ","), format(last, ",")),
              file=sys.stderr, flush=True)


def warn_closed_model(cfg, config):
    """Closed division trains the reference's BERT-Large (configs/bert_config_large.json) on sequences
    of 512 with 76 predictions (REFERENCE.md, 3-4): another model or length is said at the start; the
    log records neither, so no checker can tell (a sweep: a 1-layer model's closed run passed every
    structural rule)."""
    if cfg.mlperf.submission_division != "closed":
        return
    from mlperf_bert.trainer.config import BertConfig
    large = BertConfig().to_dict()  # (its defaults: configs/bert_config_large.json's, which a test compares)
    other = ["%s %s (BERT-Large: %s)" % (k, v, large[k]) for k, v in sorted(config.to_dict().items())
             if v != large.get(k)]
    # (packed files too: pack keeps the records' lengths, which the flags must give)
    other += ["--%s=%s (the reference: %d)" % (n, cfg.flag(n), want)
              for n, want in (("max_seq_length", 512), ("max_predictions_per_seq", 76)) if cfg.flag(n) != want]
    if other:
        print("warning: closed division trains the reference's BERT-Large on sequences of 512 with 76 predictions, "
              "and this run's %s%s: its result is no closed result" % (
                  "; ".join(other[:3]), " and %d more" % (len(other) - 3) if len(other) > 3 else ""),
              file=sys.stderr, flush=True)


def _packed_input(files):
    from mlperf_bert.dataset.packing import is_packed
    kinds = [is_packed(f) for f in files]
    if len(set(kinds)) > 1:  # (the two that show it: a glob may match thousands)
        raise UserError("--input_file mixes packed files (pack) with unpacked records: %s is packed, %s is not: use "
                        "one kind" % (files[kinds.index(True)], files[kinds.index(False)]))
    return kinds[0]


def _check_eval_apart(cfg, train_files, eval_files, rank):
    """The eval set is no training file: trained on, its accuracy measures memory, not the model
    (the rules keep the two apart); refused in closed division, warned of in open."""
    both = [e for e in eval_files if any(same_file(e, t) for t in train_files)]
    if not both:
        return
    what = ("--eval_input_file %s is also an --input_file: the run would train on its eval set"
            % (both[0] if len(both) == 1 else "%s (and %d more)" % (both[0], len(both) - 1)))
    if cfg.mlperf.submission_division == "closed":
        raise UserError("%s; give the eval set (eval_10k) apart from the training files" % what)
    if rank == 0:
        print("warning: %s (open division: it goes on)" % what, file=sys.stderr, flush=True)


Start = collections.namedtuple("Start", "train_files eval_files packed global_batch init_ckpt log_path")


def check_start(cfg, rank, world, locks, vocab_size=None):
    """The inputs and outputs of this run, checked before anything is written; rank 0 takes the
    locks of the output directory and the log in ``locks``; ``vocab_size``: the model's, which the
    first record of each file must fit. -> Start."""
    if cfg.runtime.do_train:
        check_tmpdir(cfg.data.num_workers)
    train_files = loader.input_files(cfg.data.input_file, "--input_file")
    packed = _packed_input(train_files)
    if packed:  # rows of up to K sequences (pack): samples are counted in real sequences
        from mlperf_bert.trainer import packed_loader
        packed_loader.check_files(train_files, cfg.data.max_seq_length, cfg.data.max_predictions_per_seq)
    else:
        loader.check_seq_length(train_files, cfg.data.max_seq_length, cfg.data.max_predictions_per_seq, vocab_size)
    eval_files = None
    if packed and cfg.eval.do_eval and not cfg.runtime.do_train:
        raise UserError("--do_eval alone evaluates --input_file, as the reference does, but it holds packed rows "
                        "(pack), which that eval does not read: give the unpacked TFRecords (or their to-hdf5 file) "
                        "as --input_file")
    if cfg.eval.eval_input_file:
        eval_files = loader.input_files(cfg.eval.eval_input_file, "--eval_input_file")
        loader.check_seq_length(eval_files, cfg.data.max_seq_length, cfg.data.max_predictions_per_seq, vocab_size)
        _check_eval_apart(cfg, train_files, eval_files, rank)
    elif packed and cfg.eval.do_eval:  # (found after the whole run: its end left unwritten)
        raise UserError("--do_eval without --eval_input_file evaluates the training files, as the reference does, but "
                        "--input_file holds packed rows (pack), which that eval does not read: give --eval_input_file "
                        "(eval_10k), or --nodo_eval")
    # The flags count micro-steps (as the reference's); the log counts optimizer updates at the
    # global batch, the unit of the RCPs (docs/training.md)
    global_batch = cfg.samples_per_update(train_files)
    if cfg.mlperf.submission_division == "closed" and cfg.runtime.do_train:
        check_closed_data(cfg, eval_files, global_batch, rank)
    from mlperf_bert.trainer import tf_checkpoint
    init = cfg.model.init_checkpoint
    init_ckpt = None
    out = cfg.checkpoint.output_dir
    # a run to resume here, as rank 0 sees it: rank 0 decides the resume from its disk (training.run),
    # and the other ranks of nodes with disks of their own, which lack the run, took it for a start
    resumes = distributed.broadcast_object(bool(
        checkpoint.list_checkpoints(out) or os.path.exists(os.path.join(out, checkpoint.FINISHED))
        or os.path.exists(os.path.join(out, checkpoint.STOPPED))) if rank == 0 else None)
    # (a TF prefix is its .index and data files; a .pt, the file: a .pt.bak beside a removed .pt is no checkpoint)
    if init and resumes and not os.path.exists(init) and not os.path.exists(init + ".index"):
        # gone, and a run to resume here: a resume, which does not read it, holds it by the name it
        # recorded (a start, which reads it, gets fingerprint's "not found" line)
        init_ckpt = [os.path.abspath(init), None, None]
    elif init:
        init_ckpt = tf_checkpoint.fingerprint(init)
    try:
        check_writable_dir(checkpoint.path_for(cfg.checkpoint.output_dir, 0))
    except OutputDirError as e:  # another output path would start the run over: name what holds it
        held = checkpoint.unwritable(out, e.reason)
        if held is None:
            raise
        raise held from None
    flag_checks.check_ranks(cfg, world)
    log_path = cfg.mlperf.mlperf_log or os.path.join(cfg.checkpoint.output_dir, "mlperf.log")
    if cfg.runtime.do_train and rank == 0:  # rank 0 alone writes the log (on its disk)
        _check_log_path(cfg, log_path, train_files, eval_files)
    if rank == 0:  # one run per output: a second one is refused before it writes anything
        locks.enter_context(locking.lock_dir(cfg.checkpoint.output_dir, "--output_dir"))
        # a checkpoint of a killed run's write, cut off (a temporary name: never taken for one)
        remove_stale_temporaries(cfg.checkpoint.output_dir)
        # and its log, wherever it lies (by its real path): another run's --mlperf_log naming it is
        # refused, also while this run's log is not made yet (its lines held until the start checks pass)
        locks.enter_context(locking.lock_file(os.path.realpath(log_path), "--mlperf_log"))
    seen = {}
    if cfg.data.check_data != "none":  # each rank a share of the files, in parallel
        seen = loader.check_records(train_files[rank::world], full=cfg.data.check_data == "full")
        if eval_files:  # read whole at the start anyway: checked as the training files are
            seen.update(loader.check_records(eval_files[rank::world], full=cfg.data.check_data == "full"))
    # the record CRCs each share's scan read: rank 0's identity a checkpoint keeps; and every rank's loader,
    # which reads every file, tells by them a file with only new times (loader.check_unchanged)
    from mlperf_bert.dataset import checksums
    shares = distributed.broadcast_object(distributed.gather_objects(seen)) or []
    checksums.remember_record_crcs(shares)
    scanned = {path: tag for share in shares for path, tag in share.items()}
    for path in set(train_files) | set(eval_files or []):  # HDF5 and packed: their datasets' CRC-32Cs (attributes)
        if loader.is_hdf5(path):
            size = os.path.getsize(path)
            tag = checksums.remembered_content_tag(path, size)
            if tag and tag.startswith("crc32c:"):
                scanned[path] = (size, tag)
    refuse_copies(train_files, scanned, "--input_file")
    refuse_copies(eval_files or [], scanned, "--eval_input_file")
    return Start(train_files, eval_files, packed, global_batch, init_ckpt, log_path)


# Flags of the class "same" (a resume may change them) that every rank acts on with the others at
# the same step: the checkpoint's gather of each rank's state, the eval at 0, the warm-up's updates
# (compared only where it acts, RunConfig.warm_up_acts: on the CPU without a compiled lever it does
# nothing, and a difference there was refused).
COLLECTIVE_FLAGS = ("save_checkpoints_steps", "eval_at_start", "warm_up")


def check_same_settings(cfg, rank, world, config, train_files, eval_files, init_ckpt, device_type):
    """Every rank started with rank 0's settings (its identity, --seed included, and whether it trains
    or evaluates), or every rank refuses in one line naming the first rank that differs: nothing else
    compares them, and a rank with another --learning_rate or --seed (a launcher that gives each node
    its own command or environment) trained weights of its own into the exchange without a word.
    The flags outside the identity that decide when every rank takes part in a collective are compared
    too (``COLLECTIVE_FLAGS``): a rank with another --save_checkpoints_steps waited in its checkpoint's
    gather for good (torch's 30 min), and one with --eval_at_start alone crashed both (SIGABRT, 75)."""
    if world == 1:
        return
    mine = dict(cfg.identity(cfg.runtime.seed, train_files, eval_files, init_ckpt, config.to_dict()),
                do_train=cfg.runtime.do_train, do_eval=cfg.eval.do_eval,
                **{name: cfg.flag(name) for name in COLLECTIVE_FLAGS
                   if name != "warm_up" or cfg.warm_up_acts(device_type)})
    problem = None
    for r, ident in enumerate((distributed.gather_objects(mine) or [])[1:], 1):  # (rank 0 gets them all)
        diff = checkpoint.differences(mine, ident)
        if diff:
            problem = ("rank %d was started with other settings than rank 0 (rank %d's, was rank 0's): %s; start "
                       "every rank with the same flags, and every node with the same files" % (r, r, "; ".join(diff)))
            break
    distributed.refuse_on_every_rank(problem)


def _check_log_path(cfg, log_path, train_files, eval_files):
    """Refuse a log path that is an input or an existing file other than an MLPerf log: nothing
    may be appended to, or cut from, a file that is not this run's log."""
    inputs = [("--input_file", f) for f in train_files] + [("--eval_input_file", f) for f in eval_files or []]
    inputs.append(("--bert_config_file", cfg.model.bert_config_file))
    if cfg.model.init_checkpoint:
        init = cfg.model.init_checkpoint
        inputs += [("--init_checkpoint", f) for f in [init] + glob.glob(glob.escape(init) + ".*")]
    for flag, path in inputs:
        if same_file(log_path, path):
            raise UserError("--mlperf_log %s is the %s file %s: give the MLPerf log a path of its own (default "
                            "OUTPUT_DIR/mlperf.log); the file was left as it is" % (log_path, flag, path))
    if os.path.isdir(log_path):
        raise UserError("--mlperf_log %s is a directory: give a file path (default OUTPUT_DIR/mlperf.log)" % log_path)
    try:
        mode = os.stat(log_path).st_mode
    except OSError:
        mode = None
    if mode is not None and not stat.S_ISREG(mode):  # a FIFO's read waited forever; /dev/null cannot be cut
        raise UserError("--mlperf_log %s is not a regular file (%s): give a file path (default OUTPUT_DIR/mlperf.log); "
                        "it was left as it is" % (log_path, _KINDS.get(stat.S_IFMT(mode), "not a file")))
    try:
        ours = not os.path.exists(log_path) or is_mlperf_log(log_path)
    except OSError as e:
        raise UserError("cannot read --mlperf_log %s: %s; give a readable path" % (log_path, e.strerror))
    if not ours:
        raise UserError("--mlperf_log %s exists and is not an MLPerf log (it does not start with an :::MLLOG "
                        "line): it was left as it is; give a new path (default OUTPUT_DIR/mlperf.log)" % log_path)


_KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
          stat.S_IFSOCK: "a socket"}


def _owns(output_dir, log_path):
    """Whether ``output_dir``'s record names ``log_path``'s file (any spelling of it: a symbolic link,
    another mount of the folder)."""
    owned = checkpoint.read_log_owner(output_dir)
    return owned is not None and same_file(owned, log_path)


def check_log_owner(output_dir, log_path):
    """A fresh start writes its log from the first line: refuse to empty a log of another run."""
    try:
        if os.path.getsize(log_path) == 0:
            return
    except FileNotFoundError:
        return
    if os.path.dirname(os.path.realpath(log_path)) == os.path.realpath(output_dir):
        # in the locked output_dir of this run, which has no checkpoint: restarted from scratch (by its real
        # path: OUTPUT_DIR/mlperf.log as a symbolic link to another run's log is that run's)
        return
    if _owns(output_dir, log_path):
        return  # this run's, written before its first checkpoint
    raise UserError("--mlperf_log %s holds an MLPerf log that no run in --output_dir %s wrote: it was left as it "
                    "is; give a new path, or delete it to start this run's log there" % (log_path, output_dir))


def _other_settings(cfg, record, config, train_files, eval_files, init_ckpt, what):
    """The refusal of a rerun whose settings differ from those ``record`` (a marker) holds, or None."""
    saved = record.get("run") or {}
    seed = cfg.runtime.seed if cfg.runtime.seed is not None else saved.get("seed")
    diff = checkpoint.differences(saved, cfg.identity(seed, train_files, eval_files, init_ckpt, config.to_dict(),
                                                      saved=saved), rerun=True)
    diff += _submitter_changed(cfg, checkpoint.read_log_owner(cfg.checkpoint.output_dir))
    if diff:
        return ("%s with other settings than this command's: %s; rerun with its settings, or use another "
                "--output_dir for a new run" % (what, "; ".join(diff)))
    return None


def finished_before(cfg, finished, rank, config, train_files, eval_files, init_ckpt, left=False, lost=None):
    """A rerun of a finished run: nothing to do with the same settings (model config included),
    unless ``left`` (--do_eval's eval of its final weights, not written: the caller does it; ``lost``:
    why it cannot be, said with "nothing to do"); refused with others."""
    problem = None
    if rank == 0:
        what = "%s: this run already finished (status %s after %d samples, %s)" % (
            cfg.checkpoint.output_dir, finished.get("status"), finished.get("samples", 0), checkpoint.FINISHED)
        problem = _other_settings(cfg, finished, config, train_files, eval_files, init_ckpt, what)
        if not problem and not left:
            print("%s: nothing to do%s; use another --output_dir for a new run" % (what, "; " + lost if lost else ""))
    distributed.refuse_on_every_rank(problem)
    return 0


def check_stopped(cfg, stopped, rank, world, config, train_files, eval_files, init_ckpt, log_path):
    """A rerun of a run stopped after its run_stop (``stopped``: its record) finishes it only with its
    settings, its number of ranks and the log it ended with, unchanged, as a resume does."""
    problem = None
    if rank == 0:
        out = cfg.checkpoint.output_dir
        what = "%s: this run ended earlier (run_stop logged: status %s after %d samples, %s)" % (
            out, stopped.get("status"), stopped.get("samples", 0), checkpoint.STOPPED)
        problem = _other_settings(cfg, stopped, config, train_files, eval_files, init_ckpt, what)
        ranks = stopped.get("world", world)
        if not problem and ranks != world:
            problem = "%s on %d rank%s, this run has %d: %s" % (what, ranks, "" if ranks == 1 else "s", world,
                                                                 same_ranks_fix(ranks))
        if not problem:
            try:
                check_run_log(out, log_path, stopped["mlperf_log"], checkpoint.STOPPED)
                size = os.path.getsize(log_path)
                if size != stopped["mlperf_log"][0]:  # nothing is logged after run_stop
                    problem = ("MLPerf log %s has %d bytes after the %d %s recorded at its run_stop: restore that log, "
                               "or use another --output_dir for a new run"
                               % (log_path, size - stopped["mlperf_log"][0], stopped["mlperf_log"][0],
                                  checkpoint.STOPPED))
            except UserError as e:
                problem = str(e)
        if not problem:  # the record's status edited since (the log is its bytes): the finished marker took it
            from mlperf_bert.harness.run_state import disagreement
            problem = disagreement(out, log_path)
            if problem:
                problem += ": restore it, or use another --output_dir for a new run"
    distributed.refuse_on_every_rank(problem)


SERIES_ENV = "MLPERF_SERIES_RUN0"  # start_training.sh's: run 0's folder, for the later runs of a series


_SUBMITTER = ("submission_org", "submission_platform", "submission_status")


def check_series(cfg, rank, world, config, train_files, eval_files, init_ckpt):
    """A later run of a series (start_training.sh's NUM_RUNS, which names run 0's folder in
    MLPERF_SERIES_RUN0) starts only with the settings run 0 finished with, its seed aside, on as
    many processes, for the same submitter, platform and status: a series continued with other
    flags (a learning rate changed between run 1 and run 2), on other GPUs, or logging another
    submitter would be a submission of mixed runs, each check of its own passing."""
    first, problem = os.environ.get(SERIES_ENV), None
    if rank == 0 and first and os.path.abspath(first) != os.path.abspath(cfg.checkpoint.output_dir):
        finished = checkpoint.read_finished(first) or {}
        saved = dict(finished.get("run") or {})
        if saved:
            ident = cfg.identity(cfg.runtime.seed, train_files, eval_files, init_ckpt, config.to_dict(), saved=saved)
            saved["seed"] = ident["seed"]
            diff = checkpoint.differences(saved, ident, rerun=True)
            diff += _submitter_changed(cfg, checkpoint.read_log_owner(first))
            launch = finished.get("launch") if isinstance(finished.get("launch"), dict) else {}
            if isinstance(launch.get("processes"), int) and launch["processes"] != world:
                diff.append("processes: %d (was %d)" % (world, launch["processes"]))
            if diff:
                problem = ("%s: run 0 of this series (%s) finished with other settings than this command's: %s; "
                           "a series' runs differ in their seed alone: rerun with its settings, or use another "
                           "OUTPUT_DIR for a new series" % (cfg.checkpoint.output_dir, first, "; ".join(diff)))
    distributed.refuse_on_every_rank(problem)


def _submitter_changed(cfg, log_path):
    """["--submission_org=B (was A)", ...]: the submitter, platform and status this command gives
    (by a flag, a --config file or the default) that differ from those the log at ``log_path``
    recorded; [] where it cannot be read (nothing to compare). The log has them once, at its start:
    a resume, a rerun or a later run of a series with others would log nothing of them."""
    from mlperf_bert.harness.records import read_log
    try:  # (in progress: a resume's log may end in a line a full disk cut, which the resume cuts off)
        records = read_log(log_path, in_progress=True) if log_path else []
    except UserError:
        return []
    logged = {}
    for r in records:
        if r.key in _SUBMITTER:
            logged.setdefault(r.key, r.value)
    return ["--%s=%s (was %s)" % (n, cfg.flag(n), logged[n]) for n in _SUBMITTER
            if n in logged and cfg.flag(n) != logged[n]]


def same_ranks_fix(n):
    """The fix of a rerun on another rank count than the run's ``n`` (a job requeued onto fewer or more
    nodes): the settings that make it, named, or a new run (each rank's data share, RNG and accumulated
    gradients are the run's: it cannot go on on another count)."""
    return ("rerun on %d rank%s (torchrun's --nnodes x --nproc_per_node; train_model.sh's NNODES x NUM_GPUS), "
            "or use another --output_dir for a new run" % (n, "" if n == 1 else "s"))


def check_resume(cfg, config, world, train_files, eval_files, init_ckpt, log_path, path, ckpt, device_type="cpu"):
    """Refuse, in one line, a resume from a checkpoint of another run, config or rank count, onto a
    log that no longer begins with what the checkpoint's run had written, or with another submitter,
    platform or status than that log's start holds."""
    seed = cfg.runtime.seed if cfg.runtime.seed is not None else ckpt["seed"]
    saved = dict(ckpt.get("run", {}))
    if ckpt.get("config") is not None:  # a checkpoint of an older version has it beside its identity
        saved.setdefault("config", ckpt["config"])
    checkpoint.check_same_run(saved, cfg.identity(seed, train_files, eval_files, init_ckpt,
                                                             config.to_dict(), saved=saved), path)
    checkpoint.check_step_within(ckpt, path, cfg.schedule.num_train_steps)
    if len(ckpt["ranks"]) != world:
        n = len(ckpt["ranks"])
        raise UserError("checkpoint %s was written by %d rank%s, this run has %d: %s" % (
            path, n, "" if n == 1 else "s", world, same_ranks_fix(n)))
    if ckpt.get("mlperf_log"):
        check_run_log(os.path.dirname(path), log_path, ckpt["mlperf_log"], "checkpoint %s" % os.path.basename(path))
        changed = _submitter_changed(cfg, log_path)  # (a log the resume continues: its start is kept)
        if changed:
            raise UserError("%s: not what the run being resumed in %s logged at its start (checkpoint %s): resume "
                            "with the same, or use another --output_dir for a new run"
                            % ("; ".join(changed), os.path.dirname(path), os.path.basename(path)))
    warn_other_torch(ckpt.get("torch"), path)
    warn_other_arithmetic(checkpoint.arithmetic_of(ckpt), path)
    if device_type == "cpu":
        warn_other_threads(ckpt.get("cpu_threads"), path)


def warn_other_torch(written, path):
    """A resume under another torch than the one that wrote checkpoint ``path`` goes on from the same
    state, as one on another GPU does (neither is refused), but it is not the uninterrupted run's
    arithmetic: its kernels, and so its sums, may round otherwise; it says so, once. (A checkpoint
    of an older version does not name its torch: nothing to say of it; warn_other_arithmetic does.)"""
    running = checkpoint.torch_version()
    if isinstance(written, str) and written != running:
        print("warning: checkpoint %s was written under torch %s, this run has torch %s: the resume goes on from "
              "its state, but its sums may round otherwise than the uninterrupted run's (not bit-identical), and a "
              "submission's runs name one software stack; resume under torch %s for the same arithmetic"
              % (path, written, running, written), file=sys.stderr, flush=True)


def warn_other_threads(written, path):
    """A CPU resume on another thread count than the one that wrote checkpoint ``path`` (``written``;
    None: a GPU run's, or an older version's) goes on from its state, as one under another torch does,
    and says so once: the threads split a CPU's sums (a review: demo_cpu's one thread, given by
    train_model.sh from 2026-12-08, resumed a run started on one a core without a word)."""
    import torch
    running = torch.get_num_threads()
    if isinstance(written, int) and written != running:
        print("warning: checkpoint %s was written on %d CPU thread%s, this run has %d: the resume goes on from its "
              "state, but its sums may round otherwise than the uninterrupted run's (not bit-identical); resume with "
              "OMP_NUM_THREADS=%d for the same arithmetic" % (path, written, "" if written == 1 else "s", running,
                                                              written), file=sys.stderr, flush=True)


def warn_other_arithmetic(written, path):
    """A resume from a checkpoint of code whose arithmetic is not this code's (``written``:
    checkpoint.arithmetic_of) goes on from its state, as one under another torch does, and says once
    that it ends bit-identical to neither version's uninterrupted run (a hostile sweep: a run stopped
    under the code of 2026-12-04 and resumed under today's ended 3e-8 from both, nothing said)."""
    if written == checkpoint.ARITHMETIC:
        return
    which = ("by a version of before 2026-12-06, which does not record its arithmetic (that of before "
             "2026-12-04 rounds LAMB's update otherwise)" if written is None
             else "by code of arithmetic revision %s, this code's is %d" % (written, checkpoint.ARITHMETIC))
    print("warning: checkpoint %s was written %s: the resume goes on from its state, but its sums may round "
          "otherwise than the uninterrupted run's (not bit-identical); resume with the code that wrote it for "
          "the same arithmetic" % (path, which), file=sys.stderr, flush=True)


def check_run_log(output_dir, log_path, mark, what):
    """``log_path`` is the log the run in ``output_dir`` wrote and begins with ``mark`` (bytes, sha256)
    that ``what`` recorded; the log somewhere else (another LOGDIR) is said as such, not as a log
    "that does not begin with" it."""
    owned = checkpoint.read_log_owner(output_dir)
    # the same file by another spelling (--output_dir through a symbolic link) is the same log; so is the
    # log in the run's folder when the folder was copied or moved with it (cp -a, mv: the record names
    # where it was), which check_prefix then holds to the checkpoint's bytes
    copied = (os.path.dirname(os.path.realpath(log_path)) == os.path.realpath(output_dir)
              and os.path.exists(log_path))
    if owned and os.path.exists(owned) and not same_file(owned, log_path) and not copied:
        raise UserError("this run's MLPerf log is %s (%s), not --mlperf_log %s: resume with the same log "
                        "(start_training.sh: the same LOGDIR)" % (owned, os.path.join(output_dir, checkpoint.LOG_OWNER),
                                                                  log_path))
    check_prefix(log_path, *mark, what=what)
