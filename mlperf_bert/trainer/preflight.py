"""The start-of-run refusals of run_pretraining.py: each says in one line what is wrong and how
to fix it, before the run writes anything. Flags (``check_flags``, before any device or process
group), then inputs, closed-division data, output directory and log path (``check_start``), then,
when a run goes on, the log's owner and the resume's identity (``check_log_owner``,
``finished_before``, ``check_resume``)."""
import collections
import math
import glob
import os
import sys

from mlperf_bert import locking
from mlperf_bert.errors import UserError
from mlperf_bert.fileio import check_tmpdir, check_writable_dir, host_memory, remove_stale_temporaries, same_file
from mlperf_bert.harness.mlperf_log import check_prefix, is_mlperf_log
from mlperf_bert.trainer import checkpoint, distributed, levers, loader
from mlperf_bert.trainer.trainer_flags import TPU_FLAGS


def check_flags(cfg):
    """The flags alone, before any device, process group or file is touched."""
    if cfg.runtime.use_tpu or any(cfg.flag(n) for n in TPU_FLAGS):
        raise UserError("TPU flags (--use_tpu, --tpu_name, --tpu_zone, --gcp_project, --master) are "
                        "not supported: this trainer runs on CPUs and GPUs; drop them")
    if not (cfg.runtime.do_train or cfg.eval.do_eval):
        raise UserError("nothing to do: give --do_train and/or --do_eval")
    for name in ("train_batch_size", "eval_batch_size", "steps_per_update", "num_train_steps", "max_eval_steps",
                 "max_seq_length", "max_predictions_per_seq", "log_frequency", "shuffle_buffer"):
        if cfg.flag(name) <= 0:
            raise UserError("--%s must be positive, got %d" % (name, cfg.flag(name)))
    for name in ("keep_checkpoint_max", "num_warmup_steps", "num_workers", "eval_frequency",
                 "max_samples_termination", "save_checkpoints_steps", "eval_micro_batch_size"):
        if cfg.flag(name) < 0:
            raise UserError("--%s must be >= 0, got %d" % (name, cfg.flag(name)))
    if cfg.runtime.seed is not None and not 0 <= cfg.runtime.seed < 2 ** 64:  # (torch's manual_seed: a traceback)
        raise UserError("--seed must be >= 0 and below 2**64, got %d" % cfg.runtime.seed)
    _check_numbers(cfg)
    if cfg.mlperf.submission_division == "closed" and (cfg.eval.eval_frequency
                                                       or cfg.eval.target_mlm_accuracy != 0.720):
        raise UserError("--submission_division=closed needs the MLPerf eval frequency and target: "
                        "drop --eval_frequency and --target_mlm_accuracy, or use open")
    if cfg.mlperf.submission_division == "closed" and cfg.runtime.do_train:
        _check_closed_flags(cfg)
    if cfg.eval.do_eval and not cfg.runtime.do_train and not cfg.model.init_checkpoint:
        raise UserError("--do_eval without --do_train needs --init_checkpoint (the weights to evaluate)")
    if cfg.eval.do_eval and not cfg.runtime.do_train and cfg.eval.eval_input_file:
        raise UserError("--do_eval alone evaluates --input_file, as the reference does; --eval_input_file is a training "
                        "run's online eval set and would be ignored: give the eval set (eval_10k) as --input_file and "
                        "drop --eval_input_file")
    if cfg.optim.optimizer == "adamw":
        _check_adamw(cfg.optim)
    if cfg.optim.clip_by_global_norm_after_gradient_allreduce and cfg.optim.optimizer != "lamb":
        raise UserError("--clip_by_global_norm_after_gradient_allreduce is an option of LAMB (with "
                        "--optimizer=adamw the reference clips nothing): use --optimizer=lamb")
    if cfg.optim.grad_exchange_dtype != "fp32" and cfg.optim.clip_by_global_norm_after_gradient_allreduce:
        raise UserError("--grad_exchange_dtype=%s exchanges per-replica clipping's clipped sums; with "
                        "--clip_by_global_norm_after_gradient_allreduce DDP all-reduces fp32 gradients: drop "
                        "one of the two flags" % cfg.optim.grad_exchange_dtype)
    levers.check_flags(cfg)


# The reference's --optimizer=adamw (its optimization.py) is AdamWeightDecayOptimizer with these
# fixed: the four flags are its LAMB's, which it ignores then. Given other values, this trainer
# would train other numbers than the reference from the same command line.
ADAMW_FIXED = (("lamb_beta_1", 0.9), ("lamb_beta_2", 0.999), ("log_epsilon", -6.0), ("lamb_weight_decay_rate", 0.01))


def _check_adamw(o):
    other = ["--%s=%r" % (name, getattr(o, name)) for name, value in ADAMW_FIXED if getattr(o, name) != value]
    if other:
        raise UserError("--optimizer=adamw is the reference's AdamWeightDecayOptimizer, whose beta_1 0.9, beta_2 "
                        "0.999, epsilon 1e-6 and weight decay rate 0.01 are fixed (those flags are LAMB's), but "
                        "this run has %s (given, or by a preset): drop %s, or use --optimizer=lamb"
                        % (", ".join(other), "it" if len(other) == 1 else "them"))
    # Its create_optimizer adds 1 to the global step after AdamW's update, with no ordering against
    # the reads of that step, also when GradientAggregationOptimizer already adds 1 a micro-step:
    # the step counts micro-steps twice, and which micro-steps update, at which learning rate,
    # varies from run to run (the reference run three times by TF 2.21: three different results).
    if o.steps_per_update > 1:
        raise UserError("--optimizer=adamw with --steps_per_update=%d: the reference's AdamW counts each micro-step "
                        "twice in its global step (optimization.py adds 1 besides the accumulation's own), and its "
                        "updates race with that count, so no run can match it; use --optimizer=lamb, or "
                        "--steps_per_update=1" % o.steps_per_update)


FLOAT32_MAX = 3.4028234663852886e38


def _check_numbers(cfg):
    """Values that train on nonsense without an error (a negative or NaN learning rate, a target no
    eval can miss, an update that never comes), or end in a traceback (10 ** --log_epsilon, a fork per
    --num_workers). --start_warmup_step may be below 0 (the reference convergence points start it there)."""
    o, lr = cfg.optim, cfg.optim.learning_rate
    target = cfg.eval.target_mlm_accuracy
    if not math.isfinite(lr) or lr <= 0:
        raise UserError("--learning_rate must be a number > 0, got %s" % lr)
    if lr > FLOAT32_MAX:  # (the update's float32 arithmetic: a traceback, "cannot be converted ... overflow")
        raise UserError("--learning_rate=%s is more than a float32 holds (%.4g): give a learning rate" % (lr, FLOAT32_MAX))
    sched = cfg.schedule
    if sched.num_warmup_steps and sched.start_warmup_step > 0:  # the RCPs' start below 0; above, the
        # warmup's rate (step - start) / warmup is below 0 until the start: a run that descends uphill
        raise UserError("--start_warmup_step=%d starts the warmup after step 0: the learning rate would be below 0 "
                        "until step %d; give 0 (the reference's) or less" % (sched.start_warmup_step,
                                                                              sched.start_warmup_step))
    d = cfg.data
    if d.max_predictions_per_seq > d.max_seq_length:  # (the decoder sizes its arrays by it before the data's
        # own length is compared: a huge value was "out of memory", not the mismatch)
        raise UserError("--max_predictions_per_seq=%d is more than the --max_seq_length=%d tokens a sequence has: "
                        "give the value the data was made with" % (d.max_predictions_per_seq, d.max_seq_length))
    batch_bytes = d.train_batch_size * (8 * (3 * d.max_seq_length + 2 * d.max_predictions_per_seq + 1)
                                        + 4 * d.max_predictions_per_seq)  # its decoded arrays alone
    memory = host_memory()
    if cfg.runtime.do_train and memory and batch_bytes > memory:
        raise UserError("--train_batch_size=%d: one micro-batch's data alone is %.3g GB, more than this host's %.3g "
                        "GB of memory; give a smaller --train_batch_size (with --steps_per_update raised for the "
                        "same global batch)" % (d.train_batch_size, batch_bytes / 1e9, memory / 1e9))
    for name in ("lamb_beta_1", "lamb_beta_2"):
        if not 0 <= cfg.flag(name) < 1:
            raise UserError("--%s must be in [0, 1), got %s" % (name, cfg.flag(name)))
    if not (math.isfinite(o.lamb_weight_decay_rate) and o.lamb_weight_decay_rate >= 0):
        raise UserError("--lamb_weight_decay_rate must be >= 0, got %s" % o.lamb_weight_decay_rate)
    if not (math.isfinite(cfg.schedule.poly_power) and cfg.schedule.poly_power >= 0):  # (0: a constant rate)
        raise UserError("--poly_power must be >= 0 (the decay's exponent), got %s" % cfg.schedule.poly_power)
    if not (math.isfinite(o.log_epsilon) and -300 <= o.log_epsilon <= 0):
        raise UserError("--log_epsilon must be in [-300, 0] (epsilon = 10 ** it; the reference's -6), got %s"
                        % o.log_epsilon)
    if not (math.isfinite(target) and 0 <= target <= 1):  # an accuracy (0: stop at the first eval)
        raise UserError("--target_mlm_accuracy must be in [0, 1], got %s" % target)
    if cfg.runtime.do_train and cfg.schedule.num_train_steps < o.steps_per_update:
        raise UserError("--num_train_steps=%d is fewer micro-steps than one update (--steps_per_update=%d): no "
                        "update would be made; give at least %d" % (cfg.schedule.num_train_steps,
                                                                    o.steps_per_update, o.steps_per_update))
    cores = os.cpu_count() or 1
    if cfg.data.num_workers > max(64, 4 * cores):
        raise UserError("--num_workers=%d loader processes a rank on %d cores: give at most %d"
                        % (cfg.data.num_workers, cores, max(64, 4 * cores)))


_CLOSED_FIX = "use --submission_division=open, or a train_model.sh --preset=rcp_<B>"
_OPEN = "or use --submission_division=open"  # where a preset would not fix it
# The one line a closed run without the phase-1 checkpoint gets (train_model.sh says the same).
CLOSED_NEEDS_INIT = (
    "--submission_division=closed starts from the reference's phase-1 checkpoint: download tf1_ckpt/model.ckpt-28252.* "
    "(the MLCommons BERT files, README 'From text to verified TFRecords'), check it with "
    "`python -m mlperf_bert verify DIR/tf1_ckpt` and give --init_checkpoint=DIR/tf1_ckpt/model.ckpt-28252 "
    "(INIT_CHECKPOINT= for train_model.sh and start_training.sh)")


def _check_closed_flags(cfg):
    """What the closed BERT rules fix before training: LAMB, its polynomial decay of power 1.0, and
    the online eval on eval_10k (the eval frequency and target: ``check_flags``); and what the log
    must say before package takes it: the submitter and the platform."""
    if cfg.optim.optimizer != "lamb":
        raise UserError("--submission_division=closed trains BERT with LAMB, not --optimizer=%s: use "
                        "--optimizer=lamb, or %s" % (cfg.optim.optimizer, _CLOSED_FIX))
    if cfg.schedule.poly_power != 1.0:
        raise UserError("--submission_division=closed decays the learning rate linearly (poly power 1.0), "
                        "not --poly_power=%s: drop it, or %s" % (cfg.schedule.poly_power, _CLOSED_FIX))
    if not cfg.eval.eval_input_file:
        raise UserError("--submission_division=closed evaluates on the 10,000-sample eval set while training: "
                        "give --eval_input_file (eval_10k), or %s" % _CLOSED_FIX)
    if not cfg.model.init_checkpoint:
        raise UserError(CLOSED_NEEDS_INIT + ", or use --submission_division=open")
    unnamed = unnamed_submitter(cfg.mlperf.submission_org, cfg.mlperf.submission_platform)
    if unnamed:
        raise UserError("--submission_division=closed logs who submits the run and on which system, and package "
                        "refuses a log without them (a log cannot be fixed after the run): %s left %s; give %s (the "
                        "package's --org and system name; SUBMISSION_ORG= and SUBMISSION_PLATFORM= for "
                        "train_model.sh and start_training.sh), or use --submission_division=open"
                        % (" and ".join("--" + n for n in unnamed),
                           " and ".join(repr(cfg.flag(n)) for n in unnamed), " and ".join("--" + n for n in unnamed)))


def unnamed_submitter(org, platform):
    """Which of ``submission_org``/``submission_platform`` are left as nobody's (the default
    'unknown', or empty), as package sees them (harness/compliance.py's PLACEHOLDERS)."""
    from mlperf_bert.harness.compliance import PLACEHOLDERS
    return [name for name, value in (("submission_org", org), ("submission_platform", platform))
            if value is None or value.strip().lower() in PLACEHOLDERS]


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
    entry = rcp.rcp_entry(global_batch)
    if entry is None or rank != 0:
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


def warn_schedule(cfg, packed, freq, evaluates):
    """Warnings (rank 0, at the start) for flags the reference takes but that waste the run: micro-steps
    after the last update (trained, never applied) and, unpacked, an online eval set that no eval
    reaches before the run ends (a log without eval_accuracy, which the checkers fail)."""
    sc, n = cfg.schedule, cfg.optim.steps_per_update
    steps = sc.num_train_steps
    if steps % n:
        print("warning: --num_train_steps=%d is not a multiple of --steps_per_update=%d: the last %d micro-step(s) "
              "are trained but never applied (as in the reference), and the log's opt_learning_rate_training_steps "
              "is %s updates; give a multiple (%d)" % (steps, n, steps % n, cfg.updates(steps), steps - steps % n),
              file=sys.stderr, flush=True)
    if not evaluates or packed or cfg.eval.eval_at_start:  # packed: a step's samples are known only as it runs
        return
    batch, update = cfg.data.train_batch_size, cfg.global_batch
    end = steps * batch  # the samples count at the end, then at the last update (where an eval can come)
    if sc.max_samples_termination:  # the loop stops at the micro-step that reaches it
        end = min(end, -(-sc.max_samples_termination // batch) * batch)
    last = end // update * update
    if last < freq:
        print("warning: no online eval before the run ends: the first comes at %s samples (eval_frequency), the "
              "last update at %s; the log will have no eval_accuracy (the checkers fail it): lower "
              "--eval_frequency or train longer" % (format(freq, ","), format(last, ",")),
              file=sys.stderr, flush=True)


def _packed_input(files):
    from mlperf_bert.dataset.packing import is_packed
    kinds = {is_packed(f) for f in files}
    if len(kinds) > 1:
        raise UserError("--input_file mixes packed files (pack) with unpacked records: use one kind")
    return kinds.pop()


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
        rate = packed_loader.packing_rate(train_files)
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
    global_batch = cfg.global_batch
    if packed:  # NVIDIA's convention: rows x average sequences per row
        global_batch = int(round(global_batch * rate))
    if cfg.mlperf.submission_division == "closed" and cfg.runtime.do_train:
        check_closed_data(cfg, eval_files, global_batch, rank)
    from mlperf_bert.trainer import tf_checkpoint
    init = cfg.model.init_checkpoint
    init_ckpt = None
    out = cfg.checkpoint.output_dir
    if init and not os.path.exists(init) and not glob.glob(glob.escape(init) + ".*") and (
            checkpoint.list_checkpoints(out) or os.path.exists(os.path.join(out, checkpoint.FINISHED))
            or os.path.exists(os.path.join(out, checkpoint.STOPPED))):
        # gone, and a run to resume here: a resume, which does not read it, holds it by the name it
        # recorded (a start, which reads it, gets fingerprint's "not found" line)
        init_ckpt = [os.path.abspath(init), None, None]
    elif init:
        init_ckpt = tf_checkpoint.fingerprint(init)
    check_writable_dir(checkpoint.path_for(cfg.checkpoint.output_dir, 0))
    for name in ("train_batch_size", "eval_batch_size"):
        if cfg.flag(name) % world:
            raise UserError("--%s=%d is not a multiple of the %d ranks" % (name, cfg.flag(name), world))
    log_path = cfg.mlperf.mlperf_log or os.path.join(cfg.checkpoint.output_dir, "mlperf.log")
    if cfg.runtime.do_train and rank == 0:  # rank 0 alone writes the log (on its disk)
        _check_log_path(cfg, log_path, train_files, eval_files)
    if rank == 0:  # one run per output: a second one is refused before it writes anything
        locks.enter_context(locking.lock_dir(cfg.checkpoint.output_dir, "--output_dir"))
        # a checkpoint of a killed run's write, cut off (a temporary name: never taken for one)
        remove_stale_temporaries(cfg.checkpoint.output_dir)
        if os.path.dirname(os.path.abspath(log_path)) != os.path.abspath(cfg.checkpoint.output_dir):
            locks.enter_context(locking.lock_file(log_path, "--mlperf_log"))
    if cfg.data.check_data != "none":  # each rank a share of the files, in parallel
        loader.check_records(train_files[rank::world], full=cfg.data.check_data == "full")
        if eval_files:  # read whole at the start anyway: checked as the training files are
            loader.check_records(eval_files[rank::world], full=cfg.data.check_data == "full")
    return Start(train_files, eval_files, packed, global_batch, init_ckpt, log_path)


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
        ours = not os.path.exists(log_path) or is_mlperf_log(log_path)
    except OSError as e:
        raise UserError("cannot read --mlperf_log %s: %s; give a readable path" % (log_path, e.strerror))
    if not ours:
        raise UserError("--mlperf_log %s exists and is not an MLPerf log (it does not start with an :::MLLOG "
                        "line): it was left as it is; give a new path (default OUTPUT_DIR/mlperf.log)" % log_path)


def check_log_owner(output_dir, log_path):
    """A fresh start writes its log from the first line: refuse to empty a log of another run."""
    try:
        if os.path.getsize(log_path) == 0:
            return
    except FileNotFoundError:
        return
    if os.path.dirname(os.path.abspath(log_path)) == os.path.abspath(output_dir):
        return  # in the locked output_dir of this run, which has no checkpoint: restarted from scratch
    if checkpoint.read_log_owner(output_dir) == os.path.abspath(log_path):
        return  # this run's, written before its first checkpoint
    raise UserError("--mlperf_log %s holds an MLPerf log that no run in --output_dir %s wrote: it was left as it "
                    "is; give a new path, or delete it to start this run's log there" % (log_path, output_dir))


def _other_settings(cfg, record, config, train_files, eval_files, init_ckpt, what):
    """The refusal of a rerun whose settings differ from those ``record`` (a marker) holds, or None."""
    saved = record.get("run") or {}
    seed = cfg.runtime.seed if cfg.runtime.seed is not None else saved.get("seed")
    diff = checkpoint.differences(saved, cfg.identity(seed, train_files, eval_files, init_ckpt, config.to_dict()))
    if diff:
        return ("%s with other settings than this command's: %s; rerun with its settings, or use another "
                "--output_dir for a new run" % (what, "; ".join(diff)))
    return None


def finished_before(cfg, finished, rank, config, train_files, eval_files, init_ckpt):
    """A rerun of a finished run: nothing to do with the same settings (model config included),
    refused with others."""
    problem = None
    if rank == 0:
        what = "%s: this run already finished (status %s after %d samples, %s)" % (
            cfg.checkpoint.output_dir, finished.get("status"), finished.get("samples", 0), checkpoint.FINISHED)
        problem = _other_settings(cfg, finished, config, train_files, eval_files, init_ckpt, what)
        if not problem:
            print("%s: nothing to do; use another --output_dir for a new run" % what)
    problem = distributed.broadcast_object(problem)
    if problem:
        raise UserError(problem)
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
            problem = ("%s on %d rank%s, this run has %d: rerun with the same number"
                       % (what, ranks, "" if ranks == 1 else "s", world))
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
    problem = distributed.broadcast_object(problem)
    if problem:
        raise UserError(problem)


SERIES_ENV = "MLPERF_SERIES_RUN0"  # start_training.sh's: run 0's folder, for the later runs of a series


def check_series(cfg, rank, config, train_files, eval_files, init_ckpt):
    """A later run of a series (start_training.sh's NUM_RUNS, which names run 0's folder in
    MLPERF_SERIES_RUN0) starts only with the settings run 0 finished with, its seed aside: a
    series continued with other flags (a learning rate changed between run 1 and run 2) would be a
    submission of mixed runs, each check of its own passing."""
    first, problem = os.environ.get(SERIES_ENV), None
    if rank == 0 and first and os.path.abspath(first) != os.path.abspath(cfg.checkpoint.output_dir):
        saved = dict((checkpoint.read_finished(first) or {}).get("run") or {})
        if saved:
            ident = cfg.identity(cfg.runtime.seed, train_files, eval_files, init_ckpt, config.to_dict())
            saved["seed"] = ident["seed"]
            diff = checkpoint.differences(saved, ident)
            if diff:
                problem = ("%s: run 0 of this series (%s) finished with other settings than this command's: %s; "
                           "a series' runs differ in their seed alone: rerun with its settings, or use another "
                           "OUTPUT_DIR for a new series" % (cfg.checkpoint.output_dir, first, "; ".join(diff)))
    problem = distributed.broadcast_object(problem)
    if problem:
        raise UserError(problem)


def check_resume(cfg, config, world, train_files, eval_files, init_ckpt, log_path, path, ckpt):
    """Refuse, in one line, a resume from a checkpoint of another run, config or rank count, or
    onto a log that no longer begins with what the checkpoint's run had written."""
    seed = cfg.runtime.seed if cfg.runtime.seed is not None else ckpt["seed"]
    saved = dict(ckpt.get("run", {}))
    if ckpt.get("config") is not None:  # a checkpoint of an older version has it beside its identity
        saved.setdefault("config", ckpt["config"])
    checkpoint.check_same_run(saved, cfg.identity(seed, train_files, eval_files, init_ckpt,
                                                             config.to_dict()), path)
    if len(ckpt["ranks"]) != world:
        n = len(ckpt["ranks"])
        raise UserError("checkpoint %s was written by %d rank%s, this run has %d: resume with "
                        "the same number" % (path, n, "" if n == 1 else "s", world))
    if ckpt.get("mlperf_log"):
        check_run_log(os.path.dirname(path), log_path, ckpt["mlperf_log"], "checkpoint %s" % os.path.basename(path))


def check_run_log(output_dir, log_path, mark, what):
    """``log_path`` is the log the run in ``output_dir`` wrote and begins with ``mark`` (bytes, sha256)
    that ``what`` recorded; the log somewhere else (another LOGDIR) is said as such, not as a log
    "that does not begin with" it."""
    owned = checkpoint.read_log_owner(output_dir)
    if owned and owned != os.path.abspath(log_path) and os.path.exists(owned):
        raise UserError("this run's MLPerf log is %s (%s), not --mlperf_log %s: resume with the same log "
                        "(start_training.sh: the same LOGDIR)" % (owned, os.path.join(output_dir, checkpoint.LOG_OWNER),
                                                                  log_path))
    check_prefix(log_path, *mark, what=what)
