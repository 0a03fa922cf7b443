"""run_pretraining.py: train BERT with online evaluation, MLPerf logging, exact resume and torchrun.

Read top to bottom: flags -> ``run`` (devices, inputs, resume decision, MLPerf init) ->
``Trainer`` (model, optimizer, accumulator; ``step``, ``evaluate``, ``save``, ``resume``) ->
``train`` (the loop: micro-step, maybe update, maybe eval, maybe checkpoint) -> the end.
``global_step`` counts micro-steps, as in the reference; the data position, the learning
rate schedule and checkpoint names all follow it. Checkpoint files are trainer/checkpoint.py,
metrics trainer/evaluation.py.
"""
import contextlib
import functools
import os
import random
import re
import signal
import sys
import time

import numpy as np
import torch

from mlperf_bert import flags, locking
from mlperf_bert.errors import UserError
from mlperf_bert.fileio import check_writable_dir
from mlperf_bert.harness.mlperf_log import MLPerfLog, eval_frequency
from mlperf_bert.trainer import checkpoint, distributed, evaluation, loader
from mlperf_bert.trainer.config import BertConfig
from mlperf_logging.mllog import constants as C

TPU_FLAGS = ("tpu_name", "tpu_zone", "gcp_project", "master")


def define_flags():
    fv = flags.FlagValues()
    S, I, F, B = flags.DEFINE_string, flags.DEFINE_integer, flags.DEFINE_float, flags.DEFINE_bool
    # The reference trainer's flags, same names and defaults.
    S("bert_config_file", None, "bert_config.json of the model.", flag_values=fv)
    S("input_file", None, "Training TFRecord/HDF5 files: glob or comma-separated list.", flag_values=fv)
    S("output_dir", None, "Where checkpoints (model.ckpt-<step>.pt) and eval_results.txt go.", flag_values=fv)
    S("init_checkpoint", None, "Initial weights: TF checkpoint prefix or a .pt of this project.", flag_values=fv)
    I("max_seq_length", 128, "Sequence length of the data.", flag_values=fv)
    I("max_predictions_per_seq", 20, "Masked positions per sequence in the data.", flag_values=fv)
    B("do_train", False, "Train.", flag_values=fv)
    B("do_eval", False, "Evaluate (alone: --init_checkpoint on --input_file).", flag_values=fv)
    I("train_batch_size", 32, "Global batch per micro-step, over all ranks.", flag_values=fv)
    I("eval_batch_size", 8, "Global eval batch, over all ranks.", flag_values=fv)
    flags.DEFINE_enum("optimizer", "adamw", ["adamw", "lamb"], "The optimizer.", flag_values=fv)
    F("learning_rate", 5e-5, "Initial learning rate.", flag_values=fv)
    F("poly_power", 1.0, "Power of the polynomial decay.", flag_values=fv)
    I("num_train_steps", 100000, "Training micro-steps.", flag_values=fv)
    I("num_warmup_steps", 10000, "Warmup steps.", flag_values=fv)
    I("start_warmup_step", 0, "Step at which warmup starts.", flag_values=fv)
    I("save_checkpoints_steps", 1000, "Checkpoint every this many micro-steps; 0: only at the end and on "
      "SIGTERM (a run killed otherwise starts over).", flag_values=fv)
    I("iterations_per_loop", 1000, "Accepted for compatibility (TPU estimator loop); no effect.",
      flag_values=fv)
    I("max_eval_steps", 100, "Batches of --do_eval alone.", flag_values=fv)
    I("steps_per_update", 1, "Micro-steps accumulated per optimizer update.", flag_values=fv)
    I("keep_checkpoint_max", 5, "Newest checkpoints kept.", flag_values=fv)
    F("lamb_weight_decay_rate", 0.01, "Weight decay rate.", flag_values=fv)
    F("lamb_beta_1", 0.9, "Adam/LAMB beta_1.", flag_values=fv)
    F("lamb_beta_2", 0.999, "Adam/LAMB beta_2.", flag_values=fv)
    F("log_epsilon", -6.0, "epsilon = 10 ** log_epsilon.", flag_values=fv)
    I("num_gpus", 0, "Accepted; use python -m mlperf_bert torchrun --nproc_per_node for several GPUs.", flag_values=fv)
    # TPU flags of the reference: accepted, refused if used.
    B("use_tpu", False, "Not supported (TPU).", flag_values=fv)
    for name in TPU_FLAGS:
        S(name, None, "Not supported (TPU).", flag_values=fv)
    I("num_tpu_cores", 8, "Not supported (TPU); ignored.", flag_values=fv)
    # This harness.
    S("eval_input_file", None, "Online eval set (eval_10k): evaluate every eval_frequency samples.",
      flag_values=fv)
    F("target_mlm_accuracy", 0.720, "Stop at the first eval with masked LM accuracy >= this.",
      flag_values=fv)
    I("max_samples_termination", 0, "Stop (aborted) after this many training samples; 0: none.",
      flag_values=fv)
    I("eval_frequency", 0, "Samples between evals; 0: the MLPerf formula of the global batch.",
      flag_values=fv)
    B("eval_at_start", False, "Also evaluate before training (at 0 samples).", flag_values=fv)
    I("seed", None, "Random seed (model init, dropout, data order); default: random, logged.",
      flag_values=fv)
    B("shuffle", True, "Shuffle files and records (seeded); --noshuffle reads them in order.",
      flag_values=fv)
    I("shuffle_buffer", 1000, "Records in the shuffle buffer.", flag_values=fv)
    I("num_workers", 2, "DataLoader worker processes per rank.", flag_values=fv)
    I("log_frequency", 50, "Log train_loss, learning rate and throughput every this many steps.",
      flag_values=fv)
    S("mlperf_log", None, "MLPerf log file; default output_dir/mlperf.log. A resume cuts it back to its "
      "checkpoint's point; an existing file that is not this run's MLPerf log is refused.",
      flag_values=fv)
    flags.DEFINE_enum("submission_division", "open", ["open", "closed"], "MLPerf division.",
                      flag_values=fv)
    S("submission_org", "unknown", "MLPerf submitter.", flag_values=fv)
    S("submission_platform", "unknown", "MLPerf platform.", flag_values=fv)
    flags.DEFINE_enum("dtype", "fp32", ["fp32", "bf16"], "Compute dtype (bf16: autocast).",
                      flag_values=fv)
    flags.DEFINE_enum("device", "auto", ["auto", "cpu", "cuda"], "auto: cuda if available.",
                      flag_values=fv)
    B("clip_by_global_norm_after_gradient_allreduce", False,
      "The reference's LAMB option: clip the accumulated, all-reduced gradient once per update (DDP "
      "overlaps the reduction with backward) instead of each micro-batch gradient of each replica.",
      flag_values=fv)
    B("compile", False, "torch.compile the model, its eval and the clipping/accumulation/optimizer step "
      "(trainer/step.py; the first update and eval are slower while they compile).", flag_values=fv)
    B("progress", True, "Show a progress bar.", flag_values=fv)
    flags.DEFINE_enum("check_data", "headers", ["none", "headers", "full"],
                      "Before training, read every record's header (and with full its CRC-checked "
                      "data) so a damaged file fails at once.", flag_values=fv)
    return fv


def _check_flags(fv):
    if fv.use_tpu or any(fv[n].value for n in TPU_FLAGS):
        raise UserError("TPU flags (--use_tpu, --tpu_name, --tpu_zone, --gcp_project, --master) are "
                        "not supported: this trainer runs on CPUs and GPUs; drop them")
    if not (fv.do_train or fv.do_eval):
        raise UserError("nothing to do: give --do_train and/or --do_eval")
    for name in ("train_batch_size", "eval_batch_size", "steps_per_update", "num_train_steps", "max_eval_steps",
                 "max_seq_length", "max_predictions_per_seq", "log_frequency", "shuffle_buffer"):
        if fv[name].value <= 0:
            raise UserError("--%s must be positive, got %d" % (name, fv[name].value))
    for name in ("keep_checkpoint_max", "num_warmup_steps", "num_workers", "eval_frequency",
                 "max_samples_termination", "save_checkpoints_steps"):
        if fv[name].value < 0:
            raise UserError("--%s must be >= 0, got %d" % (name, fv[name].value))
    if fv.seed is not None and fv.seed < 0:
        raise UserError("--seed must be >= 0, got %d" % fv.seed)
    if fv.submission_division == "closed" and (fv.eval_frequency or fv.target_mlm_accuracy != 0.720):
        raise UserError("--submission_division=closed needs the MLPerf eval frequency and target: "
                        "drop --eval_frequency and --target_mlm_accuracy, or use open")
    if fv.submission_division == "closed" and fv.do_train:
        _check_closed_flags(fv)
    if fv.do_eval and not fv.do_train and not fv.init_checkpoint:
        raise UserError("--do_eval without --do_train needs --init_checkpoint (the weights to evaluate)")
    if fv.clip_by_global_norm_after_gradient_allreduce and fv.optimizer != "lamb":
        raise UserError("--clip_by_global_norm_after_gradient_allreduce is an option of LAMB (with "
                        "--optimizer=adamw the reference clips nothing): use --optimizer=lamb")


_CLOSED_FIX = "use --submission_division=open, or a train_model.sh --preset=rcp_<B>"
_OPEN = "or use --submission_division=open"  # where a preset would not fix it


def _check_closed_flags(fv):
    """What the closed BERT rules fix before training: LAMB, its polynomial decay of power 1.0, and
    the online eval on eval_10k (the eval frequency and target: ``_check_flags``)."""
    if fv.optimizer != "lamb":
        raise UserError("--submission_division=closed trains BERT with LAMB, not --optimizer=%s: use "
                        "--optimizer=lamb, or %s" % (fv.optimizer, _CLOSED_FIX))
    if fv.poly_power != 1.0:
        raise UserError("--submission_division=closed decays the learning rate linearly (poly power 1.0), "
                        "not --poly_power=%s: drop it, or %s" % (fv.poly_power, _CLOSED_FIX))
    if not fv.eval_input_file:
        raise UserError("--submission_division=closed evaluates on the 10,000-sample eval set while training: "
                        "give --eval_input_file (eval_10k), or %s" % _CLOSED_FIX)


def _check_closed_data(fv, eval_files, global_batch, rank):
    """The eval set must be the 10,000 samples; hyperparameters that differ from the RCP of this
    global batch are allowed by the rules (published closed runs did so) and get a warning."""
    from mlperf_bert.harness import compliance, rcp
    n = loader.count_records(eval_files)
    if n != compliance.CLOSED_EVAL_SAMPLES:
        raise UserError("--submission_division=closed evaluates on the {0:,} samples of eval_10k, --eval_input_file "
                        "{1} has {2:,}: make eval_10k from eval_intermediate with pick_eval_samples.py "
                        "--num_examples_to_pick={0} and give it, {3}".format(
                            compliance.CLOSED_EVAL_SAMPLES, fv.eval_input_file, n, _OPEN))
    entry = rcp.rcp_entry(global_batch)
    if entry is None or rank != 0:
        return
    name, hp = entry
    k = fv.steps_per_update
    ours = {"opt_base_learning_rate": fv.learning_rate, "opt_epsilon": 10.0 ** fv.log_epsilon,
            "opt_learning_rate_training_steps": fv.num_train_steps / k, "num_warmup_steps": fv.num_warmup_steps / k,
            "start_warmup_step": fv.start_warmup_step / k, "opt_lamb_beta_1": fv.lamb_beta_1,
            "opt_lamb_beta_2": fv.lamb_beta_2, "opt_lamb_weight_decay_rate": fv.lamb_weight_decay_rate}
    other = ["%s %s (RCP %s)" % (key, "%.10g" % value, hp[key]) for key, value in ours.items()
             if key in hp and abs(value - hp[key]) > 1e-9 * max(abs(hp[key]), 1e-30)]
    if other:
        print("warning: closed division at global batch %d, which has the reference convergence point %s: this "
              "run has %s; the rules allow it (the RCP check compares convergence, not hyperparameters), "
              "train_model.sh --preset=rcp_%d uses the RCP's" % (global_batch, name, ", ".join(other), global_batch),
              file=sys.stderr, flush=True)


class _Stop:
    """SIGTERM sets ``requested``; the loop checkpoints at the next update and exits."""

    def __init__(self):
        self.requested = False
        self._old = None

    def __enter__(self):
        with contextlib.suppress(ValueError):  # not the main thread: no handler
            self._old = signal.signal(signal.SIGTERM, self._handle)
        return self

    def _handle(self, signum, frame):
        self.requested = True

    def __exit__(self, *exc):
        if self._old is not None:
            signal.signal(signal.SIGTERM, self._old)
        return False


def main(argv):
    fv = define_flags()
    flags.parse(fv, argv, required=["bert_config_file", "input_file", "output_dir"])
    _check_flags(fv)
    with _Stop() as stop, contextlib.ExitStack() as locks:
        clean = False
        try:
            with distributed.peer_loss_is_one_line(), loader.worker_death_is_one_line():
                rc = run(fv, stop, locks)
            clean = True
            return rc
        finally:
            distributed.teardown(clean)


# ---------------------------------------------------------------- the trainer

def autocast(device, dtype):
    """The context (a factory) that computes in ``--dtype`` on ``device``: bf16 autocast, or none."""
    if dtype == "fp32":
        return contextlib.nullcontext
    return functools.partial(torch.autocast, device_type=device.type, dtype=torch.bfloat16)


class Trainer:
    """Model, optimizer and accumulator of one rank, and what is done with them."""

    def __init__(self, fv, config, device, rank, world, seed, init_checkpoint=None):
        from mlperf_bert.trainer import accumulation, schedule, tf_checkpoint
        from mlperf_bert.trainer import model as modeling
        from mlperf_bert.trainer import optimizer as optim
        self.fv, self.device, self.rank, self.world = fv, device, rank, world
        self.autocast = autocast(device, fv.dtype)
        torch.manual_seed(seed)  # the same initial weights on every rank
        self.model = modeling.BertForPreTraining(config).to(device)
        if init_checkpoint:
            tf_checkpoint.load_init_checkpoint(self.model, init_checkpoint)
        self.optimizer = optim.create_optimizer(self.model, fv.optimizer, fv.learning_rate, fv.lamb_beta_1,
                                                fv.lamb_beta_2, 10.0 ** fv.log_epsilon, fv.lamb_weight_decay_rate)
        clip_after = fv.clip_by_global_norm_after_gradient_allreduce
        # Clipping after the reduction lets DDP reduce while backward runs (and only on the last
        # micro-step of an update); per-replica clipping needs each replica's own gradient first,
        # so its clipped sums are reduced once per update in large flat buckets instead.
        self.ddp = None
        if clip_after and world > 1:
            self.ddp = torch.nn.parallel.DistributedDataParallel(
                self.model, device_ids=[device.index] if device.type == "cuda" else None,
                broadcast_buffers=False, bucket_cap_mb=64)
        self.accumulator = accumulation.GradientAccumulator(
            self.model, self.optimizer, fv.steps_per_update, self.learning_rate, clip_norm=1.0,
            allreduce=distributed.allreduce_mean if world > 1 and self.ddp is None else None,
            clip_after_reduce=clip_after)
        self.forward = self.ddp or self.model
        self.after_backward = self.accumulator.after_backward
        self.eval_forward = None
        if fv.compile:  # trainer/step.py: no graph breaks, no recompiles after the first update/eval
            from mlperf_bert.trainer import step
            self.forward = torch.compile(self.forward)
            self.eval_forward = torch.compile(self.model)
            self.after_backward = step.CompiledUpdate(self.accumulator).after_backward
        self._schedule = schedule

    def learning_rate(self, step):
        fv = self.fv
        return self._schedule.learning_rate(step, fv.learning_rate, fv.num_train_steps, fv.num_warmup_steps,
                                            fv.start_warmup_step, fv.poly_power)

    def step(self, batch, global_step):
        """One micro-step: forward, backward, accumulate, maybe update. -> (loss, updated)."""
        batch = {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}
        sync = self.ddp is None or self.accumulator.is_update(global_step)
        with contextlib.nullcontext() if sync else self.ddp.no_sync():
            with self.autocast():
                out = self.forward(**batch)
            out.loss.backward()
        return out.loss.detach(), self.after_backward(global_step)

    def evaluate(self, batches):
        return evaluation.evaluate(self.model, batches, self.device, self.autocast, self.eval_forward)

    def save(self, path, extra):
        """Checkpoint at ``path``: every rank's RNG and accumulator go to rank 0 on the host."""
        states = distributed.gather_objects({"rng": checkpoint.rng_state(self.device),
                                             "accumulator": self.accumulator.state_dict()})
        if self.rank == 0:
            checkpoint.save(path, dict(extra, model=self.model.state_dict(), optimizer=self.optimizer.state_dict(),
                                       ranks=states, world_size=self.world), self.fv.keep_checkpoint_max)
        distributed.barrier()

    def resume(self, ckpt, path):
        try:
            self.model.load_state_dict(ckpt["model"])
        except RuntimeError as e:
            raise UserError("checkpoint %s does not fit %s (%s): use the matching config or another "
                            "--output_dir" % (path, self.fv.bert_config_file, str(e).splitlines()[0]))
        self.optimizer.load_state_dict(ckpt["optimizer"])
        try:
            self.accumulator.load_state_dict(ckpt["rank_state"]["accumulator"])
        except ValueError as e:
            raise UserError("checkpoint %s: %s: resume with the same --steps_per_update and "
                            "--clip_by_global_norm_after_gradient_allreduce" % (path, e))

    def seed_ranks(self, seed, ckpt=None):
        """Dropout differs between ranks; a resume restores each rank's RNG exactly."""
        torch.manual_seed(seed + 7919 * self.rank)
        np.random.seed((seed + self.rank) % 2**32)
        random.seed(seed + self.rank)
        if ckpt:
            checkpoint.set_rng_state(ckpt["rank_state"]["rng"], self.device)


# ---------------------------------------------------------------- setup

def run(fv, stop, locks):
    kind = fv.device if fv.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if kind == "cuda" and not torch.cuda.is_available():
        raise UserError("--device=cuda but no CUDA device is available: use --device=cpu")
    rank, world, local_rank = distributed.setup(kind)
    if fv.num_gpus > 1 and world == 1:
        raise UserError("--num_gpus=%d in one process: launch with python -m mlperf_bert torchrun "
                        "--nproc_per_node=%d run_pretraining.py ... (or NUM_GPUS=%d train_model.sh)"
                        % (fv.num_gpus, fv.num_gpus, fv.num_gpus))
    device = torch.device(kind, local_rank) if kind == "cuda" else torch.device("cpu")
    if kind == "cuda":  # TF32 for what stays fp32 (the bf16 presets autocast the rest)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    # ---- inputs, checked before anything is written
    config = BertConfig.from_json_file(fv.bert_config_file, fv.max_seq_length)
    train_files = loader.input_files(fv.input_file, "--input_file")
    packed = _packed_input(train_files)
    if packed:  # rows of up to K sequences (pack): samples are counted in real sequences
        from mlperf_bert.trainer import packed_loader
        packed_loader.check_files(train_files, fv.max_seq_length, fv.max_predictions_per_seq)
        rate = packed_loader.packing_rate(train_files)
    else:
        loader.check_seq_length(train_files, fv.max_seq_length, fv.max_predictions_per_seq)
    eval_files = None
    if fv.eval_input_file:
        eval_files = loader.input_files(fv.eval_input_file, "--eval_input_file")
        loader.check_seq_length(eval_files, fv.max_seq_length, fv.max_predictions_per_seq)
    # The flags count micro-steps (as the reference's); the log counts optimizer updates at the
    # global batch, the unit of the RCPs (docs/training.md)
    global_batch = fv.train_batch_size * fv.steps_per_update
    if packed:  # NVIDIA's convention: rows x average sequences per row
        global_batch = int(round(global_batch * rate))
    if fv.submission_division == "closed" and fv.do_train:
        _check_closed_data(fv, eval_files, global_batch, rank)
    from mlperf_bert.trainer import tf_checkpoint
    init_ckpt = tf_checkpoint.fingerprint(fv.init_checkpoint) if fv.init_checkpoint else None
    check_writable_dir(checkpoint.path_for(fv.output_dir, 0))
    for name in ("train_batch_size", "eval_batch_size"):
        if fv[name].value % world:
            raise UserError("--%s=%d is not a multiple of the %d ranks" % (name, fv[name].value, world))
    log_path = fv.mlperf_log or os.path.join(fv.output_dir, "mlperf.log")
    if fv.do_train and rank == 0:  # rank 0 alone writes the log (on its disk)
        _check_log_path(fv, log_path, train_files, eval_files)
    if rank == 0:  # one run per output: a second one is refused before it writes anything
        locks.enter_context(locking.lock_dir(fv.output_dir, "--output_dir"))
        if os.path.dirname(os.path.abspath(log_path)) != os.path.abspath(fv.output_dir):
            locks.enter_context(locking.lock_file(log_path, "--mlperf_log"))
    if fv.check_data != "none":  # each rank a share of the files, in parallel
        loader.check_records(train_files[rank::world], full=fv.check_data == "full")
    if not fv.do_train:
        return run_eval_only(fv, config, train_files, device, rank, world)

    # ---- resume: rank 0 decides from what is in output_dir (other nodes may see other disks)
    finished, found = distributed.broadcast_object(
        (checkpoint.read_finished(fv.output_dir), checkpoint.list_checkpoints(fv.output_dir))
        if rank == 0 else None)
    if finished:
        return _finished_before(fv, finished, rank, train_files, eval_files, init_ckpt)
    ckpt_path = found[-1][1] if found else None  # on rank 0's disk: only rank 0 reads it
    ckpt = checkpoint.load_on_every_rank(
        ckpt_path, rank, device, functools.partial(_check_resume, fv, config, world, train_files, eval_files,
                                                   init_ckpt, log_path, ckpt_path)) if ckpt_path else None
    if rank == 0 and not ckpt:
        _check_log_owner(fv.output_dir, log_path)
    seed = fv.seed if fv.seed is not None else (ckpt["seed"] if ckpt else None)
    if seed is None:
        seed = distributed.broadcast_object(int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF)
    identity = checkpoint.run_identity(fv, seed, train_files, eval_files, init_ckpt)
    # A checkpoint that recorded the log's length and digest continues the log from there, as
    # if never stopped; without one (a fresh start) the log is written from its first line.
    continues = bool(ckpt and ckpt.get("mlperf_log"))

    # ---- MLPerf init: lines held in memory until every start check has passed
    log = MLPerfLog(log_path, rank, held=True)
    if not continues:
        # start_training.sh drops the page cache when it may and says so; run directly, nothing was.
        log.event(C.CACHE_CLEAR, os.environ.get("MLPERF_CACHE_CLEARED", "False") in ("True", "true", "1"))
        log.start(C.INIT_START)
        log.submission(fv.submission_division, fv.submission_org, fv.submission_platform)
        n = fv.steps_per_update
        updates = lambda steps: steps // n if steps % n == 0 else steps / n  # noqa: E731
        log.hyperparameters(global_batch, fv.learning_rate, 10.0 ** fv.log_epsilon, updates(fv.num_train_steps),
                            updates(fv.num_warmup_steps), updates(fv.start_warmup_step), fv.lamb_beta_1,
                            fv.lamb_beta_2, fv.lamb_weight_decay_rate, fv.steps_per_update, seed,
                            fv.max_seq_length, fv.target_mlm_accuracy)

    trainer = Trainer(fv, config, device, rank, world, seed, None if ckpt else fv.init_checkpoint)
    state = {"step": 0, "next_eval": 0, "evals": [], "samples": 0, "continues": continues}
    if ckpt:
        trainer.resume(ckpt, ckpt_path)
        state.update(step=ckpt["global_step"], next_eval=ckpt["next_eval"], evals=ckpt["evals"],
                     samples=ckpt.get("samples", ckpt["global_step"] * fv.train_batch_size),
                     block=ckpt.get("block"), loss=ckpt.get("loss"))
    trainer.seed_ranks(seed, ckpt)
    resumed, log_record = ckpt is not None, ckpt.get("mlperf_log") if ckpt else None
    # the checkpoint's weights (on the device) are copied into the model: not held for the whole run
    ckpt = None
    eval_set = None
    if eval_files:
        eval_set = evaluation.EvalSet(eval_files, fv.max_seq_length, fv.max_predictions_per_seq, fv.eval_batch_size,
                                      rank, world, device, config.vocab_size)
    freq = fv.eval_frequency or eval_frequency(global_batch)
    if not continues:
        log.event("eval_frequency", freq)
        log.event(C.EVAL_SAMPLES, eval_set.num_records if eval_set else 0)
        log.end(C.INIT_STOP)
    if rank == 0:
        if continues:
            log.open(*log_record, what="checkpoint %s" % os.path.basename(ckpt_path))
        elif resumed:  # a checkpoint of an older version, which appended its resumes to the log
            log.open(append=True)
        else:
            checkpoint.write_log_owner(fv.output_dir, log_path)
            log.open()
    extra = {"seed": seed, "config": config.to_dict(), "run": identity}
    return train(fv, trainer, state, train_files, packed, eval_set, freq, seed, log, stop, extra)


def _check_log_path(fv, log_path, train_files, eval_files):
    """Refuse a log path that is an input or an existing file other than an MLPerf log: nothing
    may be appended to, or cut from, a file that is not this run's log."""
    from mlperf_bert.fileio import same_file
    from mlperf_bert.harness.mlperf_log import is_mlperf_log
    inputs = [("--input_file", f) for f in train_files] + [("--eval_input_file", f) for f in eval_files or []]
    inputs.append(("--bert_config_file", fv.bert_config_file))
    if fv.init_checkpoint:
        import glob
        inputs += [("--init_checkpoint", f) for f in [fv.init_checkpoint] + glob.glob(glob.escape(fv.init_checkpoint)
                                                                                     + ".*")]
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


def _check_log_owner(output_dir, log_path):
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


def _finished_before(fv, finished, rank, train_files, eval_files, init_ckpt):
    """A rerun of a finished run: nothing to do with the same settings, refused with others."""
    problem = None
    if rank == 0:
        saved = finished.get("run") or {}
        seed = fv.seed if fv.seed is not None else saved.get("seed")
        diff = checkpoint.differences(saved, checkpoint.run_identity(fv, seed, train_files, eval_files, init_ckpt))
        what = "%s: this run already finished (status %s after %d samples, %s)" % (
            fv.output_dir, finished.get("status"), finished.get("samples", 0), checkpoint.FINISHED)
        if diff:
            problem = ("%s with other settings than this command's: %s; rerun with its settings, or use another "
                       "--output_dir for a new run" % (what, "; ".join(diff)))
        else:
            print("%s: nothing to do; use another --output_dir for a new run" % what)
    problem = distributed.broadcast_object(problem)
    if problem:
        raise UserError(problem)
    return 0


def _packed_input(files):
    from mlperf_bert.dataset.packing import is_packed
    kinds = {is_packed(f) for f in files}
    if len(kinds) > 1:
        raise UserError("--input_file mixes packed files (pack) with unpacked records: use one kind")
    return kinds.pop()


# ---------------------------------------------------------------- the loop

def train(fv, trainer, state, train_files, packed, eval_set, freq, seed, log, stop, extra):
    """From ``state`` (step, next_eval, evals) to the target, the step budget or a SIGTERM."""
    rank, world, device = trainer.rank, trainer.world, trainer.device
    batch_size = fv.train_batch_size
    step, evals, samples = state["step"], state["evals"], state["samples"]
    if not state["continues"]:
        log.start(C.RUN_START)
    t_run = time.time()

    def save(at):
        # where the log and its open block and loss mean stand: a resume goes on from there
        trainer.save(checkpoint.path_for(fv.output_dir, at),
                     dict(extra, global_step=at, samples=samples, next_eval=state["next_eval"], evals=evals,
                          mlperf_log=list(log.mark()), block=[block_open, block_first],
                          loss=[loss_sum.item(), loss_n]))

    def online_eval(samples):
        log.start(C.EVAL_START, metadata={C.EPOCH_NUM: samples})
        m = trainer.evaluate(eval_set)
        log.end(C.EVAL_STOP, metadata={C.EPOCH_NUM: samples})
        log.event(C.EVAL_ACCURACY, m["masked_lm_accuracy"], metadata={C.EPOCH_NUM: samples})
        log.event("eval_mlm_loss", m["masked_lm_loss"], metadata={C.EPOCH_NUM: samples})
        evals.append((samples, m["masked_lm_accuracy"]))
        return m

    status, metrics, last = C.ABORTED, None, None
    if evals and evals[-1][1] >= fv.target_mlm_accuracy:  # resumed after reaching the target
        status = C.SUCCESS
    max_steps = fv.num_train_steps
    max_samples = fv.max_samples_termination or float("inf")
    if eval_set and fv.eval_at_start and step == 0 and not evals:
        metrics = online_eval(0)
        if metrics["masked_lm_accuracy"] >= fv.target_mlm_accuracy:
            status = C.SUCCESS
    if eval_set and state["next_eval"] == 0:
        state["next_eval"] = freq
    bar = None
    if rank == 0 and fv.progress:
        from tqdm import tqdm
        # in a log file (no terminal) a line every 30 s, not one per step
        bar = tqdm(total=max_steps, initial=step, unit="step", dynamic_ncols=True, leave=False,
                   mininterval=0.1 if sys.stderr.isatty() else 30)
    block_open, block_first = state.get("block") or (False, 0)
    if packed:
        from mlperf_bert.trainer.packed_loader import PackedBatches
        ds = PackedBatches(train_files, batch_size, rank, world, fv.shuffle, seed, start_batch=step,
                           vocab_size=trainer.model.config.vocab_size)
    else:
        ds = loader.PretrainingBatches(train_files, fv.max_seq_length, fv.max_predictions_per_seq, batch_size,
                                       rank, world, fv.shuffle, seed, fv.shuffle_buffer, start_batch=step,
                                       vocab_size=trainer.model.config.vocab_size)
    batches = iter(loader.make_loader(ds, fv.num_workers))
    t0, samples0 = time.time(), samples
    loss_sum, loss_n = torch.zeros((), device=device), 0
    if state.get("loss"):
        loss_sum.fill_(state["loss"][0])
        loss_n = state["loss"][1]
    while status != C.SUCCESS and step < max_steps and samples < max_samples:
        if not block_open:
            # BERT counts "epochs" in samples: a block is the eval interval starting here.
            block_first = samples
            log.start(C.BLOCK_START, metadata={C.FIRST_EPOCH_NUM: block_first, C.EPOCH_COUNT: freq})
            block_open = True
        batch = next(batches)
        # packed rows hold several sequences: the loader counts the real ones of the global batch
        samples += int(batch.pop("global_sequences", batch_size))
        last, updated = trainer.step(batch, step)
        step += 1
        loss_sum += last
        loss_n += 1
        end = step == max_steps or samples >= max_samples
        if step % fv.log_frequency == 0 or end:
            # host syncs (.item(), collectives) only at log, update, eval and checkpoint
            # boundaries, so the CPU can queue micro-steps ahead of the GPU
            rate = (samples - samples0) / max(time.time() - t0, 1e-9)
            lr = trainer.learning_rate(step - 1)
            if bar is not None:
                bar.set_postfix(loss="%.4f" % last.item(), lr="%.3g" % lr, seq_s="%.1f" % rate, refresh=False)
            # mean loss since the last line; samples_count places it on the training axis
            log.event("train_loss", loss_sum.item() / loss_n, metadata={
                C.SAMPLES_COUNT: samples, "step": step, "learning_rate": lr, "seq_per_s": rate})
            loss_sum.zero_()
            loss_n = 0
        if bar is not None:
            bar.update(1)
        if updated and eval_set and samples >= state["next_eval"]:
            log.end(C.BLOCK_STOP, metadata={C.FIRST_EPOCH_NUM: block_first, C.EPOCH_COUNT: freq})
            block_open = False
            metrics = online_eval(samples)
            while state["next_eval"] <= samples:
                state["next_eval"] += freq
            if metrics["masked_lm_accuracy"] >= fv.target_mlm_accuracy:
                status = C.SUCCESS
        # ranks agree on a SIGTERM at update boundaries (one all-reduce per update, not per micro-step)
        halt = stop.requested if world == 1 else (updated and distributed.any_rank(stop.requested, device))
        periodic = fv.save_checkpoints_steps and step % fv.save_checkpoints_steps == 0
        if periodic or halt or end or status == C.SUCCESS:
            save(step)
        if halt:
            if bar is not None:
                bar.close()
            if rank == 0:  # one line for the run, not one per rank
                print("SIGTERM: checkpoint model.ckpt-%d.pt written; rerun the same command to resume" % step,
                      flush=True)
            log.close()
            return 143
    if bar is not None:
        bar.close()
    if block_open:
        log.end(C.BLOCK_STOP, metadata={C.FIRST_EPOCH_NUM: block_first, C.EPOCH_COUNT: freq})
    log.event(C.TRAIN_SAMPLES, samples)
    log.end(C.RUN_STOP, metadata={C.STATUS: status, C.SAMPLES_COUNT: samples})
    log.close()
    if rank == 0:
        print("trained %d steps (%d samples) in %.1f s; final loss %s; status %s"
              % (step, samples, time.time() - t_run,
                 "n/a" if last is None else "%.4f" % last.item(), status), flush=True)
    if fv.do_eval:
        if not eval_set:
            metrics = trainer.evaluate(evaluation.reference_eval_batches(fv, train_files, rank, world))
        elif metrics is None or evals[-1][0] != samples:
            # the last online eval (if any) saw older weights than these final ones
            metrics = trainer.evaluate(eval_set)
        if rank == 0:
            print(evaluation.write_eval_results(fv.output_dir, metrics, step))
    if rank == 0:  # a rerun of this command now says so and changes nothing
        checkpoint.write_finished(fv.output_dir, status, step, samples, extra["run"])
    return 0


def _check_resume(fv, config, world, train_files, eval_files, init_ckpt, log_path, path, ckpt):
    """Refuse, in one line, a resume from a checkpoint of another run, config or rank count, or
    onto a log that no longer begins with what the checkpoint's run had written."""
    from mlperf_bert.harness.mlperf_log import check_prefix
    seed = fv.seed if fv.seed is not None else ckpt["seed"]
    checkpoint.check_same_run(ckpt.get("run", {}),
                              checkpoint.run_identity(fv, seed, train_files, eval_files, init_ckpt), path)
    if ckpt.get("config") not in (None, config.to_dict()):
        raise UserError("checkpoint %s was trained with another model config than %s: use "
                        "that config or another --output_dir" % (path, fv.bert_config_file))
    if len(ckpt["ranks"]) != world:
        raise UserError("checkpoint %s was written by %d ranks, this run has %d: resume with "
                        "the same number" % (path, len(ckpt["ranks"]), world))
    if ckpt.get("mlperf_log"):
        check_prefix(log_path, *ckpt["mlperf_log"], what="checkpoint %s" % os.path.basename(path))


def run_eval_only(fv, config, files, device, rank, world):
    """--do_eval alone: the reference's eval of --init_checkpoint on --input_file."""
    from mlperf_bert.trainer import model as modeling
    from mlperf_bert.trainer import tf_checkpoint
    model = modeling.BertForPreTraining(config).to(device)
    info = tf_checkpoint.load_init_checkpoint(model, fv.init_checkpoint)
    step = info.get("global_step")
    if step is None:
        m = re.search(r"ckpt-(\d+)", os.path.basename(fv.init_checkpoint))
        step = int(m.group(1)) if m else 0
    metrics = evaluation.evaluate(model, evaluation.reference_eval_batches(fv, files, rank, world), device,
                                  autocast(device, fv.dtype))
    if rank == 0:
        path = evaluation.write_eval_results(fv.output_dir, metrics, int(step))
        for key in evaluation.EVAL_KEYS:
            print("%s = %.6f" % (key, metrics[key]))
        print("wrote %s" % path)
    return 0


if __name__ == "__main__":
    from mlperf_bert.errors import run_main
    run_main(main)
