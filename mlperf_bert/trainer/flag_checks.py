"""The trainer's refusals of its flags alone (``check_flags``: before any device, process group
or file; run_pretraining.py's first check), and train_model.sh's reading of them before a run
starts (``launch_figures``, ``python -m mlperf_bert.trainer.flag_checks --figures|--check|--check_off_host
RANKS FLAG...``: the batch figures of its line and per-GPU check; ~0.1 s of CPU, no torch)."""
import math
import os
import struct
import sys

from mlperf_bert import flags
from mlperf_bert.errors import UserError, error_line
from mlperf_bert.fileio import usable_cores, usable_memory
from mlperf_bert.trainer import run_config, trainer_flags
from mlperf_bert.trainer.config import BertConfig
from mlperf_bert.trainer.trainer_flags import TPU_FLAGS


def _run_config(argv, required=()):
    """The RunConfig of run_pretraining.py's command line ``argv`` (the program, then its flags), as
    the trainer reads it: absl's parse, then the ``--config`` file. ``required``: the flags that flags
    and file together must give (not parse's to ask: the file may give them)."""
    fv = trainer_flags.define_flags()
    # no positional arguments: one would be dropped unread (``--input_file=a, b``: b not trained on)
    flags.parse(fv, argv, positional=False, foreign=trainer_flags.NVIDIA_FLAGS)
    flags.refuse_given_empty(fv, trainer_flags.GIVEN_EMPTY)
    return run_config.RunConfig.from_flags(fv, required=required)


def read_flags(argv):
    """The trainer's RunConfig of ``argv``, refused as the trainer refuses its flags alone
    (``check_flags``): no torch, so the trainer's start says these at once."""
    cfg = _run_config(argv, required=["bert_config_file", "input_file", "output_dir"])
    check_flags(cfg)
    check_fp8_widths(cfg)
    return cfg


def check_flags(cfg, host=True):
    """The flags alone, before any device, process group or file is touched. ``host``: also those that
    depend on the host (the micro-batch against its memory, --num_workers against its cores); without,
    train_model.sh's CHECK_ONLY=1, run where the job is submitted, not where it trains."""
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
    _check_numbers(cfg, host)
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
    levers = ["--" + name for name in ("compile",) + trainer_flags.LEVERS if getattr(cfg.levers, name)]
    if levers and not cfg.runtime.do_train:  # (run_eval_only builds no Trainer: no lever reaches its eval)
        raise UserError("--do_eval alone evaluates the plain model, eagerly; %s (the training step's) would be "
                        "ignored: drop %s" % (", ".join(levers), "it" if len(levers) == 1 else "them"))
    if cfg.optim.optimizer == "adamw":
        _check_adamw(cfg.optim)
    if cfg.optim.clip_by_global_norm_after_gradient_allreduce and cfg.optim.optimizer != "lamb":
        raise UserError("--clip_by_global_norm_after_gradient_allreduce is an option of LAMB (with "
                        "--optimizer=adamw the reference clips nothing): use --optimizer=lamb")
    if cfg.optim.grad_exchange_dtype != "fp32" and cfg.optim.clip_by_global_norm_after_gradient_allreduce:
        raise UserError("--grad_exchange_dtype=%s exchanges per-replica clipping's clipped sums; with "
                        "--clip_by_global_norm_after_gradient_allreduce DDP all-reduces fp32 gradients: drop "
                        "one of the two flags" % cfg.optim.grad_exchange_dtype)
    check_lever_flags(cfg)


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


def _check_numbers(cfg, host=True):
    """Values that train on nonsense without an error (a negative or NaN learning rate, a target no
    eval can miss, an update that never comes), or end in a traceback (10 ** --log_epsilon, a fork per
    --num_workers: ``host``, as the memory a micro-batch needs). --start_warmup_step may be below 0 (the
    reference convergence points start it there)."""
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
    memory = usable_memory() if host else None  # (a container's limit, where smaller than the host's)
    if cfg.runtime.do_train and memory and batch_bytes > memory[0]:
        raise UserError("--train_batch_size=%d: one micro-batch's data alone is %.3g GB, more than %s; give a smaller "
                        "--train_batch_size (with --steps_per_update raised for the same global batch)"
                        % (d.train_batch_size, batch_bytes / 1e9, "this host's %.3g GB of memory" % (memory[0] / 1e9)
                           if memory[1] is None else "this process's memory limit, %.3g GB (its control group's %s: "
                           "a container's --memory, Slurm's --mem)" % (memory[0] / 1e9, memory[1])))
    for name in ("lamb_beta_1", "lamb_beta_2"):
        if not 0 <= cfg.flag(name) < 1:
            raise UserError("--%s must be in [0, 1), got %s" % (name, cfg.flag(name)))
        if struct.unpack("f", struct.pack("f", cfg.flag(name)))[0] == 1.0:  # the optimizer's float32: 1 - beta**t
            # is 0 there, and every update NaN
            raise UserError("--%s=%r is 1.0 in float32, in which the optimizer computes it (its bias correction "
                            "would divide by 0 and train on NaN): give at most %r (the largest float32 below 1)"
                            % (name, cfg.flag(name), 1 - 2.0 ** -24))
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
    cores = usable_cores()
    if host and cfg.data.num_workers > max(64, 4 * cores):
        raise UserError("--num_workers=%d loader processes a rank on %d cores: give at most %d"
                        % (cfg.data.num_workers, cores, max(64, 4 * cores)))


_CLOSED_FIX = "use --submission_division=open, or a train_model.sh --preset=rcp_<B>"
OPEN = "or use --submission_division=open"  # where a preset would not fix it
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


def check_lever_flags(cfg):
    """The speed levers' refusals that need no device (trainer/levers.py has the others)."""
    lv = cfg.levers
    if lv.cuda_graphs and cfg.runtime.device == "cpu":
        raise UserError(cuda_graphs_needs_cuda("cpu"))
    if lv.cuda_graphs and not lv.compile:
        raise UserError("--cuda_graphs replays the compiled step: add --compile, or drop --cuda_graphs")
    if lv.fp8_recipe != "tensorwise" and not lv.fp8:
        raise UserError("--fp8_recipe=%s chooses the recipe of --fp8: add --fp8, or drop --fp8_recipe" % lv.fp8_recipe)
    if lv.fp8 and cfg.model.dtype == "fp32":
        # torch._scaled_mm's output is the layer's input dtype: fp32 here, which the CUDA kernel
        # refuses for row-wise scales unless cuBLAS runs them, on sm90 only ("Only bf16 high precision
        # output types are supported for row-wise scaling", aten/src/ATen/native/cuda): float8 is a bf16 lever
        raise UserError("--fp8 multiplies in float8 under bf16 autocast (row-wise scaling needs a bf16 output on "
                        "every GPU but sm90): add --dtype=bf16, or drop --fp8")


def check_fp8_widths(cfg, absent_ok=False):
    """--fp8's widths, from --bert_config_file: the encoder's dense layers are hidden_size and
    intermediate_size wide, and torch._scaled_mm takes sizes that are multiples of 16 only (else
    levers.enable_fp8 refused them once the model was built: after torch, the ranks' meeting and the
    inputs' checks). ``absent_ok``: a config not there is left unread (a launcher's check, which says
    so with the setting that named it)."""
    path = cfg.model.bert_config_file
    if not (cfg.levers.fp8 and cfg.runtime.do_train and path) or (absent_ok and not os.path.isfile(path)):
        return
    config = BertConfig.from_json_file(path)
    odd = ["%s %d" % (k, getattr(config, k)) for k in ("hidden_size", "intermediate_size") if getattr(config, k) % 16]
    if odd:
        raise UserError("--fp8 multiplies matrices whose sizes are multiples of 16, and BERT config %s has %s: give "
                        "a config whose widths are multiples of 16, or drop --fp8" % (path, " and ".join(odd)))


def cuda_graphs_needs_cuda(device_type):
    """The line of --cuda_graphs on a device of ``device_type`` other than CUDA (the flags' --device=cpu,
    or --device=auto resolved)."""
    return "--cuda_graphs needs a CUDA device (this run is on %s): drop --cuda_graphs" % device_type


def check_lever_ranks(cfg, world, device_type=None):
    """The speed levers' refusals that need the rank count ``world`` and where known the device type
    (``device_type``: "cuda", "cpu", or None where --device=auto has not resolved it): the trainer's
    (levers.check_device) and the launchers' before a run starts (``launch_figures``), no torch."""
    lv = cfg.levers
    if lv.cuda_graphs and world > 1 and cfg.optim.clip_by_global_norm_after_gradient_allreduce:
        # Per-replica clipping all-reduces the clipped sums after the backward, between the
        # graphs, into buffers of their own. DDP all-reduces inside the backward, from autograd
        # hooks between the per-bucket graphs torch.compile splits it into (no collective is
        # captured: pytorch/pytorch#108966), with gradients in DDP's buckets: not built here.
        raise UserError("--cuda_graphs on several ranks (this run has %d) needs per-replica clipping: with "
                        "--clip_by_global_norm_after_gradient_allreduce DDP all-reduces from hooks inside the "
                        "backward, which CUDA graphs cannot capture: drop one of the two flags" % world)
    tokens = cfg.data.train_batch_size // world * cfg.data.max_seq_length  # a rank's micro-batch, rows x sequence
    if lv.fp8 and device_type == "cuda" and tokens % 16:
        # the weight gradient's float8 GEMM (grad_out^T @ input) has the tokens as its inner dimension, and
        # CUDA's _scaled_mm wants it a multiple of 16 ("Expected trailing dimension of mat1 to be divisible
        # by 16", aten/src/ATen/native/cuda/ScaledBlas.cpp); the CPU kernel takes any (not measured on a GPU)
        raise UserError("--fp8 multiplies each rank's %d tokens a micro-step (--train_batch_size=%d over %d rank%s x "
                        "--max_seq_length=%d) in float8 GEMMs that need a multiple of 16: give a batch or sequence "
                        "length that makes one, or drop --fp8" % (tokens, cfg.data.train_batch_size, world,
                                                                 "" if world == 1 else "s", cfg.data.max_seq_length))


def check_ranks(cfg, world):
    """The global batches split evenly over the ``world`` ranks (each reads its share); each only where
    the run reads it: the training batch where it trains (--do_eval alone reads none: its default, 32,
    refused a run of --eval_batch_size=9 on 3 ranks), the eval batch where --do_eval evaluates
    --input_file (an online eval set is cut by --eval_micro_batch_size: the default 8 refused a
    training run on 3 ranks)."""
    used = (("train_batch_size",) if cfg.runtime.do_train else ()) + (
        ("eval_batch_size",) if cfg.reads_eval_batches else ())
    for name in used:
        if cfg.flag(name) % world:
            raise UserError("--%s=%d is not a multiple of the %d ranks: give a multiple of %d"
                            % (name, cfg.flag(name), world, world))


def launch_figures(argv, check=False, ranks=1, host=True):
    """[train_batch_size, steps_per_update, global batch, max_seq_length, device, optimizer] of the trainer's flags ``argv`` (its command after the program) as the trainer resolves
    them (``define_flags``, ``flags.parse``, ``RunConfig.from_flags`` with the ``--config`` file),
    refusing what it refuses with its line: train_model.sh's batch line and per-GPU check. ``check``:
    also the trainer's refusals of the flags alone (``check_flags``, this host's memory and cores
    included unless not ``host``: start_training.sh's check before a series, on the host that trains;
    train_model.sh's CHECK_ONLY=1 leaves those to it), and --fp8's widths where the config is here. The batches are checked against the
    ``ranks`` the launch starts (``check_ranks``: the trainer's refusal once its ranks have met, after
    a series' STARTING TIMING RUN). A help flag is left to the trainer."""
    cfg = _run_config(["run_pretraining.py"] + [a for a in argv if not flags.asks_help(["", a])])
    if check:
        check_flags(cfg, host)
        check_fp8_widths(cfg, absent_ok=True)
    check_ranks(cfg, ranks)
    if cfg.runtime.do_train:  # (--do_eval alone: its levers are refused by check_flags)
        check_lever_ranks(cfg, ranks, None if cfg.runtime.device == "auto" else cfg.runtime.device)
    return [cfg.data.train_batch_size, cfg.optim.steps_per_update, cfg.global_batch, cfg.data.max_seq_length,
            cfg.runtime.device, cfg.optim.optimizer]


MODES = ("--figures", "--check", "--check_off_host")


def main(argv):
    """``--figures RANKS FLAG...``: ``launch_figures`` on one line (``--check RANKS FLAG...``: with the
    trainer's ``check_flags``; ``--check_off_host``: without its checks of this host's memory and
    cores, for a check run off the host that trains); the trainer's refusal: its one line, status 2."""
    if argv[1:2] not in [[m] for m in MODES] or not argv[2:3] or not argv[2].isdigit() or argv[2] == "0":
        print("usage: python -m mlperf_bert.trainer.flag_checks %s RANKS FLAG..." % "|".join(MODES), file=sys.stderr)
        return 2
    try:
        print(*launch_figures(argv[3:], check=argv[1] != "--figures", ranks=int(argv[2]),
                              host=argv[1] != "--check_off_host"))
    except UserError as e:
        print(error_line(e), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
