"""run_pretraining.py: train BERT with online evaluation, MLPerf logging, exact resume and torchrun.

One file, top to bottom: flags -> setup (devices, data, model, optimizer, resume) -> the
loop (micro-step, accumulate, maybe update, maybe eval, maybe checkpoint) -> the end.
``global_step`` counts micro-steps, as in the reference; the data position, the learning
rate schedule and checkpoint names all follow it.
"""
import contextlib
import json
import math
import os
import random
import re
import signal
import sys
import time

import numpy as np
import torch

from mlperf_bert.trainer import loader
from mlperf_bert.trainer import distributed
from mlperf_bert import flags
from mlperf_bert.trainer.config import BertConfig
from mlperf_bert.errors import UserError
from mlperf_bert.fileio import atomic_open, atomic_save, check_writable_dir
from mlperf_bert import locking
from mlperf_bert.harness.mlperf_log import MLPerfLog, eval_frequency
from mlperf_logging.mllog import constants as C

CKPT_RE = re.compile(r"^model\.ckpt-(\d+)\.pt$")
TPU_FLAGS = ("tpu_name", "tpu_zone", "gcp_project", "master")
EVAL_KEYS = ("masked_lm_accuracy", "masked_lm_loss", "next_sentence_accuracy", "next_sentence_loss")


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
    I("save_checkpoints_steps", 1000, "Checkpoint every this many micro-steps.", flag_values=fv)
    I("iterations_per_loop", 1000, "Accepted for compatibility (TPU estimator loop); no effect.",
      flag_values=fv)
    I("max_eval_steps", 100, "Batches of --do_eval alone.", flag_values=fv)
    I("steps_per_update", 1, "Micro-steps accumulated per optimizer update.", flag_values=fv)
    I("keep_checkpoint_max", 5, "Newest checkpoints kept.", flag_values=fv)
    F("lamb_weight_decay_rate", 0.01, "Weight decay rate.", flag_values=fv)
    F("lamb_beta_1", 0.9, "Adam/LAMB beta_1.", flag_values=fv)
    F("lamb_beta_2", 0.999, "Adam/LAMB beta_2.", flag_values=fv)
    F("log_epsilon", -6.0, "epsilon = 10 ** log_epsilon.", flag_values=fv)
    I("num_gpus", 0, "Accepted; use torchrun --nproc_per_node for several GPUs.", flag_values=fv)
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
    S("mlperf_log", None, "MLPerf log file (appended to); default output_dir/mlperf.log.",
      flag_values=fv)
    flags.DEFINE_enum("submission_division", "open", ["open", "closed"], "MLPerf division.",
                      flag_values=fv)
    S("submission_org", "unknown", "MLPerf submitter.", flag_values=fv)
    S("submission_platform", "unknown", "MLPerf platform.", flag_values=fv)
    flags.DEFINE_enum("dtype", "fp32", ["fp32", "bf16"], "Compute dtype (bf16: autocast).",
                      flag_values=fv)
    flags.DEFINE_enum("device", "auto", ["auto", "cpu", "cuda"], "auto: cuda if available.",
                      flag_values=fv)
    B("clip_after_allreduce", False, "Clip the all-reduced gradient instead of each replica's.",
      flag_values=fv)
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
    for name in ("train_batch_size", "eval_batch_size", "steps_per_update", "save_checkpoints_steps",
                 "num_train_steps", "max_eval_steps", "max_seq_length", "max_predictions_per_seq",
                 "log_frequency", "shuffle_buffer"):
        if fv[name].value <= 0:
            raise UserError("--%s must be positive, got %d" % (name, fv[name].value))
    for name in ("keep_checkpoint_max", "num_warmup_steps", "num_workers", "eval_frequency",
                 "max_samples_termination"):
        if fv[name].value < 0:
            raise UserError("--%s must be >= 0, got %d" % (name, fv[name].value))
    if fv.seed is not None and fv.seed < 0:
        raise UserError("--seed must be >= 0, got %d" % fv.seed)
    if fv.submission_division == "closed" and (fv.eval_frequency or fv.target_mlm_accuracy != 0.720):
        raise UserError("--submission_division=closed needs the MLPerf eval frequency and target: "
                        "drop --eval_frequency and --target_mlm_accuracy, or use open")
    if fv.do_eval and not fv.do_train and not fv.init_checkpoint:
        raise UserError("--do_eval without --do_train needs --init_checkpoint (the weights to evaluate)")


# ---------------------------------------------------------------- checkpoints

def list_checkpoints(output_dir):
    """[(global step, path)] of complete checkpoints, oldest first (temp files never match)."""
    if not os.path.isdir(output_dir):
        return []
    found = [(int(m.group(1)), os.path.join(output_dir, n))
             for n in os.listdir(output_dir) for m in [CKPT_RE.match(n)] if m]
    return sorted(found)


def rng_state(device):
    # Only tensors and plain values, so checkpoints load with torch.load(weights_only=True).
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {"torch": torch.get_rng_state(), "python": random.getstate(),
             "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss),
                       float(gauss)]}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state, device):
    torch.set_rng_state(state["torch"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    random.setstate(state["python"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def save_checkpoint(path, state, keep):
    """Write ``state`` atomically, then drop all but the newest ``keep`` checkpoints."""
    atomic_save(path, lambda f: torch.save(state, f))
    if keep > 0:
        for _, old in list_checkpoints(os.path.dirname(path))[:-keep]:
            with contextlib.suppress(OSError):
                os.remove(old)


def load_resume(path):
    from mlperf_bert.trainer.tf_checkpoint import load_pt
    try:
        return load_pt(path)
    except UserError as e:  # a damaged file: name it, and how to go on
        raise UserError("%s; delete it to resume from the one before" % str(e).split(": give ")[0])


# Flags that define a run: a resume with another value would mix two runs in one output_dir.
RUN_FLAGS = ("train_batch_size", "steps_per_update", "optimizer", "learning_rate", "poly_power",
             "num_train_steps", "num_warmup_steps", "start_warmup_step", "lamb_weight_decay_rate",
             "lamb_beta_1", "lamb_beta_2", "log_epsilon", "max_seq_length", "max_predictions_per_seq",
             "eval_frequency", "target_mlm_accuracy", "max_samples_termination", "shuffle",
             "shuffle_buffer", "clip_after_allreduce", "dtype", "submission_division")
FINISHED = "run_finished.json"


def run_identity(fv, seed, train_files, eval_files):
    """What a resumed run must share with the checkpoint: defining flags, seed, data files."""
    files = lambda paths: [[os.path.abspath(p), os.path.getsize(p)] for p in paths or []]  # noqa: E731
    ident = {name: fv[name].value for name in RUN_FLAGS}
    ident.update(seed=seed, input_file=files(train_files), eval_input_file=files(eval_files))
    return ident


def check_same_run(saved, ident, ckpt_path):
    """Refuse a resume whose defining flags or data differ from the checkpoint's, in one line."""
    for name, value in ident.items():
        if name in saved and saved[name] != value:
            what = {"input_file": "the training files (names or sizes)",
                    "eval_input_file": "the eval files (names or sizes)"}.get(name)
            raise UserError("%s differs from the run being resumed in %s (%s): rerun with the same value, "
                            "or use another --output_dir for a new run"
                            % (what or "--%s=%s" % (name, value), os.path.dirname(ckpt_path),
                               "checkpoint %s" % os.path.basename(ckpt_path) if what
                               else "it has %s" % (saved[name],)))


# ---------------------------------------------------------------- evaluation

@torch.no_grad()
def evaluate(model, batches, device, autocast):
    """Exact metrics over every batch: sums in float64, all-reduced over ranks."""
    model.eval()
    keys = ("mlm_correct", "mlm_weight", "mlm_nll_sum", "nsp_correct", "nsp_count", "nsp_nll_sum")
    sums = torch.zeros(len(keys) + 2, dtype=torch.float64, device=device)
    one = torch.ones((), dtype=torch.float64, device=device)
    for batch in batches:
        batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        with autocast():
            out = model(**batch)
        # + the batch's total loss and a batch count: the estimator's `loss` is their mean
        sums += torch.stack([getattr(out, k).double() for k in keys] + [out.loss.double(), one])
    model.train()
    s = dict(zip(keys + ("loss_sum", "batches"), distributed.sum_values(sums.tolist(), device)))
    return {
        "loss": s["loss_sum"] / max(s["batches"], 1),
        "masked_lm_accuracy": s["mlm_correct"] / max(s["mlm_weight"], 1e-30),
        "masked_lm_loss": s["mlm_nll_sum"] / max(s["mlm_weight"], 1e-30),
        "next_sentence_accuracy": s["nsp_correct"] / max(s["nsp_count"], 1),
        "next_sentence_loss": s["nsp_nll_sum"] / max(s["nsp_count"], 1),
        "samples": int(s["nsp_count"]),
    }


def write_eval_results(output_dir, metrics, global_step):
    """output_dir/eval_results.txt: the reference's ``key = value`` lines, keys sorted."""
    path = os.path.join(output_dir, "eval_results.txt")
    values = {k: repr(float(metrics[k])) for k in ("loss",) + EVAL_KEYS}
    values["global_step"] = "%d" % global_step
    with atomic_open(path, "w", encoding="utf-8") as f:
        f.writelines("%s = %s\n" % (k, values[k]) for k in sorted(values))
    return path


# ---------------------------------------------------------------- main

class _Stop:
    """SIGTERM sets ``requested``; the loop checkpoints at the next step and exits."""

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
        try:
            return run(fv, stop, locks)
        finally:
            distributed.teardown()


def run(fv, stop, locks):
    kind = fv.device if fv.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if kind == "cuda" and not torch.cuda.is_available():
        raise UserError("--device=cuda but no CUDA device is available: use --device=cpu")
    rank, world, local_rank = distributed.setup(kind)
    if fv.num_gpus > 1 and world == 1:
        raise UserError("--num_gpus=%d in one process: launch with torchrun --nproc_per_node=%d"
                        % (fv.num_gpus, fv.num_gpus))
    device = torch.device(kind, local_rank) if kind == "cuda" else torch.device("cpu")
    if kind == "cuda":  # TF32 for what stays fp32 (the bf16 presets autocast the rest)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    dtype = torch.bfloat16 if fv.dtype == "bf16" else None

    def autocast():
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device.type, dtype=dtype)

    # ---- inputs, checked before anything is written
    config = BertConfig.from_json_file(fv.bert_config_file)
    if fv.max_seq_length > config.max_position_embeddings:
        raise UserError("--max_seq_length=%d exceeds max_position_embeddings=%d of %s"
                        % (fv.max_seq_length, config.max_position_embeddings, fv.bert_config_file))
    train_files = loader.input_files(fv.input_file, "--input_file")
    loader.check_seq_length(train_files, fv.max_seq_length, fv.max_predictions_per_seq)
    eval_files = None
    if fv.eval_input_file:
        eval_files = loader.input_files(fv.eval_input_file, "--eval_input_file")
        loader.check_seq_length(eval_files, fv.max_seq_length, fv.max_predictions_per_seq)
    check_writable_dir(os.path.join(fv.output_dir, "model.ckpt-0.pt"))
    for name in ("train_batch_size", "eval_batch_size"):
        if fv[name].value % world:
            raise UserError("--%s=%d is not a multiple of the %d ranks" % (name, fv[name].value, world))
    log_path = fv.mlperf_log or os.path.join(fv.output_dir, "mlperf.log")
    if rank == 0:  # one run per output: a second one is refused before it writes anything
        locks.enter_context(locking.lock_dir(fv.output_dir, "--output_dir"))
        if os.path.dirname(os.path.abspath(log_path)) != os.path.abspath(fv.output_dir):
            locks.enter_context(locking.lock_file(log_path, "--mlperf_log"))
    if fv.check_data != "none":  # each rank a share of the files, in parallel
        loader.check_records(train_files[rank::world], full=fv.check_data == "full")

    from mlperf_bert.trainer import model as modeling
    from mlperf_bert.trainer import tf_checkpoint

    if not fv.do_train:
        return run_eval_only(fv, config, train_files, device, autocast, rank, world, modeling,
                             tf_checkpoint)

    # Rank 0 decides what is in output_dir (ranks on other nodes may see other local disks).
    finished, resume = distributed.broadcast_object(
        (_read_finished(fv.output_dir), list_checkpoints(fv.output_dir)) if rank == 0 else None)
    if finished:
        if rank == 0:
            print("%s: this run already finished (status %s after %d samples, %s): nothing to do; "
                  "use another --output_dir for a new run" % (fv.output_dir, finished.get("status"),
                                                              finished.get("samples", 0), FINISHED))
        return 0
    ckpt = load_resume(resume[-1][1]) if resume else None
    seed = fv.seed if fv.seed is not None else (ckpt["seed"] if ckpt else None)
    if seed is None:
        seed = distributed.broadcast_object(int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF)
    identity = run_identity(fv, seed, train_files, eval_files)
    if ckpt:
        check_same_run(ckpt.get("run", {}), identity, resume[-1][1])
        if ckpt.get("config") not in (None, config.to_dict()):
            raise UserError("checkpoint %s was trained with another model config than %s: use "
                            "that config or another --output_dir" % (resume[-1][1], fv.bert_config_file))
        if len(ckpt["ranks"]) != world:
            raise UserError("checkpoint %s was written by %d ranks, this run has %d: resume with "
                            "the same number" % (resume[-1][1], len(ckpt["ranks"]), world))
    global_batch = fv.train_batch_size * fv.steps_per_update
    log = MLPerfLog(log_path, rank)
    # start_training.sh drops the page cache when it may and says so; run directly, nothing was.
    log.event(C.CACHE_CLEAR, os.environ.get("MLPERF_CACHE_CLEARED", "False") in ("True", "true", "1"))
    log.start(C.INIT_START)
    log.submission(fv.submission_division, fv.submission_org, fv.submission_platform)
    # The flags count micro-steps (as the reference's); the log counts optimizer updates at the
    # global batch, the unit of the RCPs (docs/training.md).
    n = fv.steps_per_update
    updates = lambda steps: steps // n if steps % n == 0 else steps / n  # noqa: E731
    log.hyperparameters(global_batch, fv.learning_rate, 10.0 ** fv.log_epsilon, updates(fv.num_train_steps),
                        updates(fv.num_warmup_steps), updates(fv.start_warmup_step), fv.lamb_beta_1, fv.lamb_beta_2,
                        fv.lamb_weight_decay_rate, fv.steps_per_update, seed, fv.max_seq_length,
                        fv.target_mlm_accuracy)

    # ---- model, optimizer, accumulator (same init on every rank: same seed)
    torch.manual_seed(seed)
    model = modeling.BertForPreTraining(config).to(device)
    if fv.init_checkpoint and not ckpt:
        tf_checkpoint.load_init_checkpoint(model, fv.init_checkpoint)
    from mlperf_bert.trainer import accumulation
    from mlperf_bert.trainer import optimizer as optim
    from mlperf_bert.trainer import schedule
    opt = optim.create_optimizer(model, fv.optimizer, fv.learning_rate, fv.lamb_beta_1,
                                 fv.lamb_beta_2, 10.0 ** fv.log_epsilon, fv.lamb_weight_decay_rate)

    def lr_fn(step):
        return schedule.learning_rate(step, fv.learning_rate, fv.num_train_steps,
                                      fv.num_warmup_steps, fv.start_warmup_step, fv.poly_power)

    acc = accumulation.GradientAccumulator(
        model, opt, fv.steps_per_update, lr_fn, clip_norm=1.0,
        allreduce=distributed.allreduce_mean if world > 1 else None,
        clip_before_allreduce=not fv.clip_after_allreduce)

    step, next_eval, evals = 0, 0, []
    freq = fv.eval_frequency or eval_frequency(global_batch)
    if ckpt:
        try:
            model.load_state_dict(ckpt["model"])
        except RuntimeError as e:
            raise UserError("checkpoint %s does not fit %s (%s): use the matching config or another "
                            "--output_dir" % (resume[-1][1], fv.bert_config_file,
                                              str(e).splitlines()[0]))
        opt.load_state_dict(ckpt["optimizer"])
        try:
            acc.load_state_dict(ckpt["ranks"][rank]["accumulator"])
        except ValueError as e:
            raise UserError("checkpoint %s: %s: resume with the same --steps_per_update"
                            % (resume[-1][1], e))
        step, next_eval, evals = ckpt["global_step"], ckpt["next_eval"], ckpt["evals"]
    # Dropout differs between ranks; the RNG is restored after anything that draws from it.
    torch.manual_seed(seed + 7919 * rank)
    np.random.seed((seed + rank) % 2**32)
    random.seed(seed + rank)
    if ckpt:
        set_rng_state(ckpt["ranks"][rank]["rng"], device)

    def batches(start):
        ds = loader.PretrainingBatches(train_files, fv.max_seq_length, fv.max_predictions_per_seq,
                                     fv.train_batch_size, rank, world, fv.shuffle, seed,
                                     fv.shuffle_buffer, start_batch=start, vocab_size=config.vocab_size)
        return iter(loader.make_loader(ds, fv.num_workers))

    def eval_batches():
        ds = loader.PretrainingBatches(eval_files, fv.max_seq_length, fv.max_predictions_per_seq,
                                     fv.eval_batch_size, rank, world, shuffle=False, repeat=False,
                                     vocab_size=config.vocab_size)
        return loader.make_loader(ds, min(fv.num_workers, 1))

    def checkpoint(at):
        # Every rank's accumulator travels to rank 0; at update boundaries it holds no buffers.
        states = distributed.gather_objects({"rng": rng_state(device), "accumulator": acc.state_dict()})
        if rank == 0:
            save_checkpoint(os.path.join(fv.output_dir, "model.ckpt-%d.pt" % at), {
                "model": model.state_dict(), "optimizer": opt.state_dict(),
                "ranks": states, "global_step": at,
                "seed": seed, "next_eval": next_eval, "evals": evals,
                "config": config.to_dict(), "world_size": world, "run": identity,
            }, fv.keep_checkpoint_max)
        distributed.barrier()

    def online_eval(samples):
        log.start(C.EVAL_START, metadata={C.EPOCH_NUM: samples})
        m = evaluate(model, eval_batches(), device, autocast)
        log.end(C.EVAL_STOP, metadata={C.EPOCH_NUM: samples})
        log.event(C.EVAL_ACCURACY, m["masked_lm_accuracy"], metadata={C.EPOCH_NUM: samples})
        log.event("eval_mlm_loss", m["masked_lm_loss"], metadata={C.EPOCH_NUM: samples})
        evals.append((samples, m["masked_lm_accuracy"]))
        return m

    log.event("eval_frequency", freq)
    n_eval = None
    if eval_files:
        n_eval = loader.count_records(eval_files)
    log.event(C.EVAL_SAMPLES, n_eval or 0)
    log.end(C.INIT_STOP)
    log.start(C.RUN_START)
    t_run = time.time()

    status, metrics, last = C.ABORTED, None, None
    if evals and evals[-1][1] >= fv.target_mlm_accuracy:  # resumed after reaching the target
        status = C.SUCCESS
    max_steps = fv.num_train_steps
    if fv.max_samples_termination:
        max_steps = min(max_steps, -(-fv.max_samples_termination // fv.train_batch_size))
    if eval_files and fv.eval_at_start and step == 0 and not evals:
        metrics = online_eval(0)
        if metrics["masked_lm_accuracy"] >= fv.target_mlm_accuracy:
            status = C.SUCCESS
    if eval_files and next_eval == 0:
        next_eval = freq
    bar = None
    if rank == 0 and fv.progress:
        from tqdm import tqdm
        # in a log file (no terminal) a line every 30 s, not one per step
        bar = tqdm(total=max_steps, initial=step, unit="step", dynamic_ncols=True, leave=False,
                   mininterval=0.1 if sys.stderr.isatty() else 30)
    block_open, block_first = False, 0
    it = batches(step)
    t0, s0 = time.time(), step
    loss_sum, loss_n = torch.zeros((), device=device), 0
    while status != C.SUCCESS and step < max_steps:
        if not block_open:
            # BERT counts "epochs" in samples: a block is the eval interval starting here.
            log.start(C.BLOCK_START, metadata={C.FIRST_EPOCH_NUM: step * fv.train_batch_size,
                                               C.EPOCH_COUNT: freq})
            block_first = step * fv.train_batch_size
            block_open = True
        batch = {k: v.to(device, non_blocking=True) for k, v in next(it).items()}
        with autocast():
            out = model(**batch)
        out.loss.backward()
        updated = acc.after_backward(step)
        step += 1
        last = out.loss.detach()
        loss_sum += last
        loss_n += 1
        samples = step * fv.train_batch_size
        rate = (step - s0) * fv.train_batch_size / max(time.time() - t0, 1e-9)
        if step % fv.log_frequency == 0 or step == max_steps:
            # host syncs (.item(), collectives) only at log, update, eval and checkpoint
            # boundaries, so the CPU can queue micro-steps ahead of the GPU
            if bar is not None:
                bar.set_postfix(loss="%.4f" % last.item(), lr="%.3g" % lr_fn(step - 1),
                                seq_s="%.1f" % rate, refresh=False)
            # mean loss since the last line; samples_count places it on the training axis
            log.event("train_loss", loss_sum.item() / loss_n, metadata={
                C.SAMPLES_COUNT: samples, "step": step, "learning_rate": lr_fn(step - 1),
                "seq_per_s": rate})
            loss_sum.zero_()
            loss_n = 0
        if bar is not None:
            bar.update(1)
        if updated and eval_files and samples >= next_eval:
            log.end(C.BLOCK_STOP, metadata={C.FIRST_EPOCH_NUM: block_first, C.EPOCH_COUNT: freq})
            block_open = False
            metrics = online_eval(samples)
            while next_eval <= samples:
                next_eval += freq
            if metrics["masked_lm_accuracy"] >= fv.target_mlm_accuracy:
                status = C.SUCCESS
        # ranks agree on a SIGTERM at update boundaries (one all-reduce per update, not per micro-step)
        halt = stop.requested if world == 1 else (updated and distributed.any_rank(stop.requested, device))
        if step % fv.save_checkpoints_steps == 0 or halt or step == max_steps or status == C.SUCCESS:
            checkpoint(step)
        if halt:
            if bar is not None:
                bar.close()
            print("SIGTERM: checkpoint model.ckpt-%d.pt written; rerun the same command to resume"
                  % step, flush=True)
            log.close()
            return 143
    if bar is not None:
        bar.close()
    if block_open:
        log.end(C.BLOCK_STOP, metadata={C.FIRST_EPOCH_NUM: block_first, C.EPOCH_COUNT: freq})
    log.event(C.TRAIN_SAMPLES, step * fv.train_batch_size)
    log.end(C.RUN_STOP, metadata={C.STATUS: status, C.SAMPLES_COUNT: step * fv.train_batch_size})
    log.close()
    seconds = time.time() - t_run
    if rank == 0:
        print("trained %d steps (%d samples) in %.1f s; final loss %s; status %s"
              % (step, step * fv.train_batch_size, seconds,
                 "n/a" if last is None else "%.4f" % last.item(), status), flush=True)
    if fv.do_eval:
        if not eval_files:
            metrics = evaluate(model, eval_only_batches(fv, train_files, rank, world), device,
                               autocast)
        elif metrics is None or evals[-1][0] != step * fv.train_batch_size:
            # the last online eval (if any) saw older weights than these final ones
            metrics = evaluate(model, eval_batches(), device, autocast)
        if rank == 0:
            print(write_eval_results(fv.output_dir, metrics, step))
    if rank == 0:  # a rerun of this command now says so and changes nothing
        with atomic_open(os.path.join(fv.output_dir, FINISHED), "w", encoding="utf-8") as f:
            json.dump({"status": status, "global_step": step, "samples": step * fv.train_batch_size,
                       "finished": time.strftime("%Y-%m-%d %H:%M:%S %Z")}, f)
    return 0


def _read_finished(output_dir):
    path = os.path.join(output_dir, FINISHED)
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise UserError("cannot read %s (%s): delete it to resume the run" % (path, e))


def eval_only_batches(fv, files, rank, world):
    """The reference's eval input: files in order, repeated, ``max_eval_steps`` full batches."""
    ds = loader.PretrainingBatches(files, fv.max_seq_length, fv.max_predictions_per_seq,
                                 fv.eval_batch_size, rank, world, shuffle=False, repeat=True,
                                 max_batches=fv.max_eval_steps)
    return loader.make_loader(ds, min(fv.num_workers, 1))


def run_eval_only(fv, config, files, device, autocast, rank, world, modeling, tf_checkpoint):
    model = modeling.BertForPreTraining(config).to(device)
    info = tf_checkpoint.load_init_checkpoint(model, fv.init_checkpoint)
    step = info.get("global_step")
    if step is None:
        m = re.search(r"ckpt-(\d+)", os.path.basename(fv.init_checkpoint))
        step = int(m.group(1)) if m else 0
    metrics = evaluate(model, eval_only_batches(fv, files, rank, world), device, autocast)
    if rank == 0:
        path = write_eval_results(fv.output_dir, metrics, int(step))
        for key in EVAL_KEYS:
            print("%s = %.6f" % (key, metrics[key]))
        print("wrote %s" % path)
    return 0


if __name__ == "__main__":
    from mlperf_bert.errors import run_main
    run_main(main)
