"""The run of run_pretraining.py (its entry, which reads and refuses the flags before torch loads:
trainer/entry.py): train BERT with online evaluation, MLPerf logging, exact resume and torchrun.

Read top to bottom: ``train(cfg)`` (the flags read once: trainer/run_config.py's RunConfig; ``main``,
flags to the end, for tests) -> ``Trainer`` (model, optimizer, accumulator, the levers in trainer/levers.py's order; ``step``,
``evaluate``, ``save``, ``resume``) -> ``run`` (the start: devices, inputs, resume decision,
MLPerf init) -> ``Loop.train`` (the loop: micro-step, maybe update, maybe eval, maybe checkpoint,
each a hook of ``Loop``; where it stands: ``TrainState``).
``global_step`` counts micro-steps, as in the reference; the data position, the learning
rate schedule and checkpoint names all follow it. The start-of-run refusals (flags, closed
division, data, log path and owner, resume identity) are trainer/preflight.py, checkpoint
files trainer/checkpoint.py, metrics trainer/evaluation.py.
"""
import contextlib
import dataclasses
import functools
import math
import os
import random
import re
import signal
import sys
import time
import typing

import numpy as np
import torch

from mlperf_bert import fileio
from mlperf_bert.errors import Terminated, UserError, first_signal, forking, hold_raises_while_forking
from mlperf_bert.harness.mlperf_log import MLPerfLog, eval_frequency, reaches_target
from mlperf_bert.trainer import (checkpoint, cpu_memory, distributed, evaluation, flag_checks, levers, loader, preflight,
                                 run_config, tensorboard, throughput, trainer_flags)
from mlperf_bert.trainer.config import BertConfig
from mlperf_bert.trainer.launch import NOT_SAVED_STATUS, PEER_LOST_STATUS, rank_failed
from mlperf_logging.mllog import constants as C


class _Stop:
    """SIGTERM or SIGINT (Ctrl-C; the launchers pass it on as itself). In the untimed init, before
    run_start, nothing has been trained: the signal stops the run at once (``Terminated``, raised
    where the main thread is: a compile, the warm-up, a data check), with nothing saved: exit 128 +
    the signal when a checkpoint holds the run (``resumable``), else launch.NOT_SAVED_STATUS (143
    says a checkpoint holds it). From run_start on (``started``) it sets ``requested``: the loop
    checkpoints at the next update and exits 128 + the signal. The first signal decides
    (start_training.sh sends SIGTERM after a SIGINT, in case the trainer had not started yet). A
    signal whose handler runs inside a fork's hooks (another thread took it, which the loader's
    block does not cover) is not raised there: Python drops an exception of a fork hook ("Exception
    ignored in: <function _releaseLock>", logging's, whose lock then stayed held); it is raised at
    the next eval batch (``checked``) or at run_start (``started``)."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.requested = False
        self.signum = None
        self.received = 0  # every signal, the first and any after it
        self.in_init = True
        # before this start's work began (run_start; --do_eval alone's eval; ``finishing``, a run that
        # ended earlier): a peer lost here ended at its start (distributed.peer_loss_is_one_line)
        self.starting = True
        self.finishing = False  # finish_stopped: a run that ended earlier, its end being written
        self.finished = None  # finished_rerun: "eval" (--do_eval given), else "rerun"
        self.eval_only = False  # --do_eval alone: nothing is trained, nothing saved but its results
        self.resumable = False  # a checkpoint of the run is there (set once rank 0 has looked)
        self.vote = None  # the loop's StopVote, once made
        self._old = {}

    def __enter__(self):
        hold_raises_while_forking()
        for sig in self.SIGNALS:
            with contextlib.suppress(ValueError):  # not the main thread: no handler
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        self.received += 1
        if self.requested:
            return
        self.requested = True  # first: a signal that comes while first_signal runs returns above
        self.signum = first_signal(signum, frame, self._handle)
        if self.in_init and not forking():
            raise self._terminated()

    def _terminated(self, peer_lost=False):
        """The stop of a signal in the init or after the run's end: its line and status.
        ``peer_lost``: another rank left before the ranks met in a vote (``peer_lost()``'s case)."""
        if rank_failed():  # torchrun's SIGTERM after another rank failed: not a stop
            return Terminated("", PEER_LOST_STATUS)  # that rank's line and status are the run's
        name = signal.Signals(self.signum).name
        # one line for the run (rank 0's; torchrun sets RANK), as the checkpoint's line is
        if self.finished:
            line, status = ("%s in the rerun of a run that finished earlier: stopped at once, nothing changed (its "
                            "log, checkpoints and results are as they were)%s" % (
                                name, "; rerun the same command for --do_eval's eval of its final weights"
                                if self.finished == "eval" else "")), 128 + self.signum
        elif self.finishing:
            line, status = ("%s while the end of a run that ended earlier was written (its log is complete): "
                            "stopped at once; rerun the same command to finish it" % name), 128 + self.signum
        elif self.eval_only:
            line, status = ("%s: --do_eval alone stopped at once, no eval_results.txt written (exit %d, not 143: "
                            "nothing to resume); rerun the same command to evaluate" % (name, NOT_SAVED_STATUS)
                            ), NOT_SAVED_STATUS
        elif peer_lost and not self.in_init:
            # past run_start here, while another rank got the stop in its untimed init and left at once
            line, status = ("%s as the run started, while another rank was still in its untimed init (it stopped at "
                            "once): no checkpoint written" % name), NOT_SAVED_STATUS
            if self.resumable:
                line, status = line + "; rerun the same command to resume", 128 + self.signum
            else:
                line += " (exit %d, not 143: no checkpoint holds the run); rerun the same command to start again" % (
                    NOT_SAVED_STATUS)
        elif self.resumable:
            line, status = ("%s in the untimed init, before run_start: stopped at once, nothing trained; "
                            "rerun the same command to resume" % name), 128 + self.signum
        else:
            line, status = ("%s in the untimed init, before run_start: stopped at once, nothing trained and "
                            "nothing saved (exit %d, not 143: no checkpoint holds the run); rerun the same "
                            "command to start again" % (name, NOT_SAVED_STATUS)), NOT_SAVED_STATUS
        return Terminated(line if os.environ.get("RANK", "0") == "0" else "", status)

    def peer_lost(self):
        """A collective failed because another rank left: after a stop signal, before the ranks have
        met in a vote (the other rank had it in its untimed init, where it stops at once, while this
        one was past run_start) or once this rank is finishing (the other entered that state first
        and stopped at once: rank 0 writes run_stopped.json before it does, rank 1 does not wait for
        it) the stop's end (``Terminated``), not a failure; else None (a rank lost in the training
        is the news, whatever the signals: distributed.peer_loss_is_one_line's line)."""
        if self.signum is None or (self.vote is not None and self.vote.met and not self.finishing):
            return None
        return self._terminated(peer_lost=True)

    def checked(self, batches):
        """``batches`` (an eval's, run where a signal stops at once), ended at the next batch after a
        stop: the handler's own raise is lost where it lands in a finalizer, which swallows it."""
        for batch in batches:
            if self.requested and self.in_init:
                raise self._terminated()
            yield batch

    def started(self):
        """run_start: from here a signal checkpoints at the next update (one that came in the init,
        its raise held by a fork or lost in a finalizer, stops the run here, before run_start)."""
        if self.requested and self.in_init:
            raise self._terminated()
        self.in_init = self.starting = False

    def asked(self):
        """This rank's vote: its signal's number, 0 if none came (SIGTERM for one still in its handler)."""
        return (self.signum or signal.SIGTERM) if self.requested else 0

    def agreed(self, signum):
        """The vote's outcome: whether the ranks stop; a rank that got no signal takes the voted one,
        so that rank 0's line and every rank's status name the signal another rank got."""
        if signum and self.signum is None:
            self.signum = signum
        return bool(signum)

    @property
    def name(self):
        """The signal that stopped the run (this rank's, or the one the ranks voted on)."""
        return signal.Signals(self.signum or signal.SIGTERM).name

    @property
    def status(self):
        return 128 + (self.signum or signal.SIGTERM)

    def __exit__(self, exc_type, *exc):
        leaving = exc_type is not None and issubclass(exc_type, (Terminated, SystemExit))
        for sig, old in self._old.items():
            # leaving the process, on a stop or with a failure's one line and status (a rank whose
            # peer or loader worker died): a signal now must not interrupt the way out. torchrun
            # SIGTERMs the ranks left once one has failed: it came during this rank's exit, and
            # the handler before ours raised Terminated in an atexit callback, a traceback after the
            # one line (busy machines), or replaced the status with 143 before it.
            signal.signal(sig, signal.SIG_IGN if leaving else old)
        return False


def main(argv):
    return train(flag_checks.read_flags(argv))


def train(cfg):
    """The run of ``cfg`` (flag_checks.read_flags'): its exit status."""
    made = [cfg.checkpoint.output_dir] + [os.path.dirname(os.path.abspath(p)) for p in [cfg.mlperf.mlperf_log] if p]
    # outermost: the locks (in ``held``) are released and their files gone before the folders they
    # made are looked at; a refusal after the lock (an --init_checkpoint of another model) left them
    with fileio.new_dirs_removed_on_error(*made), \
            _Stop() as stop, contextlib.ExitStack() as held:
        clean = False
        try:
            with distributed.peer_loss_is_one_line(lambda: stop.received, stop.peer_lost, lambda: stop.starting and not stop.finishing,
                                                   cfg.checkpoint.output_dir), \
                    loader.worker_death_is_one_line(cfg.checkpoint.output_dir), \
                    out_of_memory_is_one_line(cfg):
                rc = run(cfg, stop, held)
            clean = True
            return rc
        finally:
            # failing (its line is out), or ended: a signal now changes neither line nor status (raised
            # in the teardown, it landed in a finalizer: "Exception ignored in ..." and its traceback)
            stop.requested = True
            distributed.teardown(clean)


# the CPU allocator's RuntimeError (CUDA's is torch.OutOfMemoryError)
_CPU_OUT_OF_MEMORY = re.compile(r"DefaultCPUAllocator: can't allocate memory.*")


@contextlib.contextmanager
def out_of_memory_is_one_line(cfg):
    """A batch that does not fit the device (torch.OutOfMemoryError from CUDA's allocator, the CPU
    allocator's RuntimeError, a MemoryError) ends the run with one line naming what shrinks it, not a
    traceback; the checkpoints written so far are kept."""
    try:
        yield
    except (RuntimeError, MemoryError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        cpu = _CPU_OUT_OF_MEMORY.search(first)
        if not (isinstance(e, (torch.OutOfMemoryError, MemoryError)) or cpu):
            raise
        raise UserError(
            "out of memory (%s): in an eval, a smaller --eval_micro_batch_size needs less (a resume may change it); "
            "in training, fewer sequences per process per micro-step: a lower --train_batch_size (%d now, split over the "
            "ranks) with --steps_per_update raised to keep the global batch (a new run: both are part of the run's "
            "identity); python -m mlperf_bert.trainer.memory_plan predicts a run's peak"
            % ((cpu.group(0) if cpu else first)[:300], cfg.data.train_batch_size)) from None


# ---------------------------------------------------------------- the trainer

def autocast(device, dtype):
    """The context (a factory) that computes in ``--dtype`` on ``device``: bf16 autocast, or none."""
    if dtype == "fp32":
        return contextlib.nullcontext
    return functools.partial(torch.autocast, device_type=device.type, dtype=torch.bfloat16)


class Trainer:
    """Model, optimizer and accumulator of one rank, and what is done with them."""

    def __init__(self, cfg, config, device, rank, world, seed, init_checkpoint=None):
        """``cfg``: the RunConfig; ``config``: the model's BertConfig. The levers are applied in
        trainer/levers.py's order: refusals, model conversions, then the step's wrappers."""
        from mlperf_bert.trainer import accumulation
        from mlperf_bert.trainer import model as modeling
        from mlperf_bert.trainer import optimizer as optim
        from mlperf_bert.trainer import tf_checkpoint
        self.cfg, self.device, self.rank, self.world = cfg, device, rank, world
        levers.refuse(cfg, device, world)
        self.autocast = autocast(device, cfg.model.dtype)
        torch.manual_seed(seed)  # the same initial weights on every rank
        self.model = modeling.BertForPreTraining(config).to(device)
        if init_checkpoint:
            tf_checkpoint.load_init_checkpoint(self.model, init_checkpoint)
        levers.convert_model(self.model, cfg.levers)  # --fp8, --fused_qkv: the same Parameters
        o = cfg.optim
        self.optimizer = optim.create_optimizer(self.model, o.optimizer, o.learning_rate, o.lamb_beta_1,
                                                o.lamb_beta_2, o.epsilon, o.lamb_weight_decay_rate)
        # Clipping after the reduction lets DDP reduce while backward runs (and only on the last
        # micro-step of an update); per-replica clipping needs each replica's own gradient first,
        # so its clipped sums are reduced once per update in large flat buckets instead, each
        # started as soon as the last micro-batch's absorb has made it (distributed.GradientExchange).
        clip_after = o.clip_by_global_norm_after_gradient_allreduce
        self.ddp = levers.ddp(self.model, device, world, o) if clip_after and world > 1 else None
        self.accumulator = accumulation.GradientAccumulator(
            self.model, self.optimizer, o.steps_per_update, self.learning_rate, clip_norm=1.0,
            exchange=distributed.GradientExchange(
                [p for p in self.model.parameters() if p.requires_grad], o.grad_exchange_dtype)
            if world > 1 and self.ddp is None else None,
            clip_after_reduce=clip_after, keep_grads=self.ddp is not None)
        # forward, eval_forward, after_backward: DDP, compiled, compiled update, CUDA graphs
        self.forward, self.eval_forward, self.after_backward = levers.wrap_step(
            self.model, self.ddp, self.accumulator, cfg.levers)
        self.writer = checkpoint.BackgroundWriter()
        self._copying = None  # the event of a checkpoint's device-to-host copy in flight
        self.host_buffers = None  # pinned buffers of the checkpoints' copies (reserve_checkpoint_buffers)

    def learning_rate(self, step):
        return self.cfg.learning_rate(step)

    def step(self, batch, global_step):
        """One micro-step: forward, backward, accumulate, maybe update. -> (loss, updated)."""
        batch = {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}
        sync = self.ddp is None or self.accumulator.is_update(global_step)
        with contextlib.nullcontext() if sync else self.ddp.no_sync():
            with self.autocast():
                out = self.forward(**batch)
            out.loss.backward()
        if self._copying is not None:  # a checkpoint's copy of the weights and slots, before they change
            torch.cuda.current_stream(self.device).wait_event(self._copying)
            self._copying = None
        return out.loss.detach(), self.after_backward(global_step)

    def row_flops(self, pred=None):
        """Training FLOPs of one row (trainer/throughput.py), ``pred`` MLM slots (default the flag's)."""
        d = self.cfg.data
        return throughput.flops_per_row(self.model.config, d.max_seq_length, pred or d.max_predictions_per_seq)

    def batch_flops(self, pred):
        """Packed rows where the variable-length attention kernel runs: a function of a batch giving
        its FLOPs as the kernels compute them (trainer/throughput.py); else None (``row_flops``)."""
        from mlperf_bert.trainer import attention
        cfg = self.model.config
        heads = cfg.hidden_size // cfg.num_attention_heads
        if attention.varlen_kernel(self.device, self.cfg.model.torch_dtype, heads) is None:
            return None
        return lambda batch: throughput.batch_flops(cfg, batch["input_mask"], pred, varlen=True,
                                                    pooled=batch["nsp_positions"].shape[1])

    def meter(self, packed, start=None):
        """The throughput of the log intervals; FLOPs and MFU on CUDA, where they mean something."""
        cuda = self.device.type == "cuda"
        m = throughput.Meter(packed, self.row_flops() if cuda else None, self.world,
                             throughput.peak_tflops(torch.cuda.get_device_name(self.device), self.cfg.model.dtype)
                             if cuda else None, sync=torch.cuda.synchronize if cuda else None)
        if start is not None:
            m.start = start
        return m

    def eval_micro_batch(self):
        """--eval_micro_batch_size, or the automatic one: on CUDA the largest that fits beside the
        training's state (the LAMB slots and accumulation buffers are not allocated yet)."""
        if self.cfg.eval.eval_micro_batch_size:
            return self.cfg.eval.eval_micro_batch_size
        if self.device.type != "cuda":
            return trainer_flags.CPU_MICRO_BATCH
        params = sum(p.numel() * p.element_size() for p in self.accumulator.params)
        reserve = params * (2 if not self.optimizer.state else 0)
        if self.accumulator.n > 1 and not self.accumulator.clip_after_reduce and self.accumulator.buffers is None:
            reserve += params
        return evaluation.largest_micro_batch(self.model, self.device, self.autocast, self.cfg.data.max_seq_length,
                                              self.cfg.data.max_predictions_per_seq, reserve)

    def warm_up(self, packed_files, eval_set):
        """The untimed warm-up (trainer/warmup.py) at this run's shapes: per-rank rows of the
        training files (packed: their prediction slots and sequences a row), the eval set's batch."""
        from mlperf_bert.trainer import warmup
        d, lv = self.cfg.data, self.cfg.levers
        shape = (d.train_batch_size // self.world, d.max_seq_length, d.max_predictions_per_seq, None)
        if packed_files:
            from mlperf_bert.trainer import packed_loader
            shape = shape[:2] + packed_loader.row_shape(packed_files)
        t = time.perf_counter()  # (time.time: a step of the clock made it negative)
        warmup.warm_up(self, shape, eval_set.shape if eval_set else None)
        if self.rank == 0:
            print("warm-up (untimed init): %d updates and an eval of %d batches on synthetic batches%s in %.1f s" % (
                warmup.ROUNDS, warmup.ROUNDS,
                ", every graph compiled," if lv.compile else ", the update compiled," if lv.fused_update else "",
                time.perf_counter() - t), flush=True)

    def evaluate(self, batches):
        return evaluation.evaluate(self.model, batches, self.device, self.autocast, self.eval_forward)

    def save(self, path, extra, final=False):
        """Checkpoint at ``path``: every rank's RNG and accumulator go to rank 0 on the host, which
        copies the state to host memory and writes it on a thread while training goes on (on CUDA
        the copy runs on a side stream, which the next update's stream waits for; the write
        before it must have ended). ``final``: no
        update follows, so the state is written as it is, without a copy. ``flush`` waits."""
        states = distributed.gather_objects({"rng": checkpoint.rng_state(self.device),
                                             "accumulator": self.accumulator.state_dict()})
        if self.rank == 0:
            self.writer.wait()  # one state held at a time; a failed write is raised here
            state = dict(extra, model=self.model.state_dict(), optimizer=self.optimizer.state_dict(),
                         ranks=states, world_size=self.world)
            if final:
                self.writer.submit(path, state, self.cfg.checkpoint.keep_checkpoint_max)
                return
            # on CUDA: pinned buffers filled on a side stream; the next update waits for them (step)
            state, self._copying = checkpoint.host_copy_async(state, self.device, buffers=self.host_buffers)
            self.writer.submit(path, state, self.cfg.checkpoint.keep_checkpoint_max, ready=self._copying)

    def reserve_checkpoint_buffers(self):
        """The pinned host buffers every checkpoint's copy from the device goes into, allocated
        now (in the untimed init) rather than on the training thread at the first save."""
        self.host_buffers = checkpoint.HostBuffers.for_state(self.model, self.optimizer)

    def flush(self):
        """Wait until the checkpoint being written is complete (every rank: none exits before it)."""
        if self.rank == 0:
            self.writer.wait()
        distributed.barrier()

    def resume(self, ckpt, path):
        try:
            self.model.load_state_dict(ckpt["model"])
        except RuntimeError as e:
            raise UserError("checkpoint %s does not fit %s (%s): use the matching config or another "
                            "--output_dir" % (path, self.cfg.model.bert_config_file, str(e).splitlines()[0]))
        checkpoint.load_optimizer(self.optimizer, ckpt["optimizer"])  # into the warm-up's slots
        try:
            self.accumulator.load_state_dict(ckpt["rank_state"]["accumulator"])
        except ValueError as e:
            raise UserError("checkpoint %s: %s: resume with the same --steps_per_update and "
                            "--clip_by_global_norm_after_gradient_allreduce" % (path, e))

    def seed_ranks(self, seed, ckpt=None):
        """Dropout differs between ranks; a resume restores each rank's RNG exactly."""
        torch.manual_seed((seed + 7919 * self.rank) % 2**64)  # (--seed may be up to 2**64 - 1 on any rank)
        np.random.seed((seed + self.rank) % 2**32)
        random.seed(seed + self.rank)
        if ckpt:
            checkpoint.set_rng_state(ckpt["rank_state"]["rng"], self.device)


# ---------------------------------------------------------------- setup

def run(cfg, stop, held):
    """The run; ``held`` (an ExitStack) releases what it holds (locks, the loader) when main ends."""
    rt = cfg.runtime
    kind = rt.device if rt.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if kind == "cuda" and not torch.cuda.is_available():
        raise UserError("--device=cuda but no CUDA device is available: use --device=cpu")
    stop.eval_only = not rt.do_train
    rank, world, local_rank = distributed.setup(kind, cfg.checkpoint.output_dir)
    if rt.num_gpus > 1 and world == 1:
        raise UserError("--num_gpus=%d in one process: launch with python -m mlperf_bert torchrun "
                        "--nproc_per_node=%d run_pretraining.py ... (or NUM_GPUS=%d train_model.sh)"
                        % (rt.num_gpus, rt.num_gpus, rt.num_gpus))
    preset = os.environ.get("MLPERF_BERT_PRESET")  # (train_model.sh's)
    if rt.device == "auto" and kind == "cpu" and preset not in (None, "demo_cpu") and rank == 0:
        # (a container started without --gpus: a preset for GPUs trained on the CPU without a word)
        print("warning: preset %s is sized for GPUs, but torch sees none (a container: docker run --gpus all): this "
              "run trains on the CPU (--device=cpu says so; PRESET=demo_cpu is sized for one)" % preset,
              file=sys.stderr, flush=True)
    device = torch.device(kind, local_rank) if kind == "cuda" else torch.device("cpu")
    if kind == "cuda":  # TF32 for what stays fp32 (the bf16 presets autocast the rest)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    else:
        cpu_memory.keep_freed_memory()
    # the levers' refusals of this device and rank count (the Trainer's first), before the inputs are read
    levers.refuse(cfg, device, world)

    # ---- inputs, checked before anything is written
    config = BertConfig.from_json_file(cfg.model.bert_config_file, cfg.data.max_seq_length)
    train_files, eval_files, packed, global_batch, init_ckpt, log_path = preflight.check_start(
        cfg, rank, world, held, config.vocab_size)
    preflight.check_same_settings(cfg, rank, world, config, train_files, eval_files, init_ckpt, device.type)
    if not rt.do_train:
        return run_eval_only(cfg, config, train_files, device, rank, world, stop)
    output_dir = cfg.checkpoint.output_dir

    # ---- resume: rank 0 decides from what is in output_dir (other nodes may see other disks)
    finished, stopped, found = distributed.broadcast_object(
        (checkpoint.read_finished(output_dir), checkpoint.read_stopped(output_dir),
         checkpoint.list_checkpoints(output_dir)) if rank == 0 else None)
    stop.resumable = bool(found)
    if finished:
        stop.finished = "eval" if cfg.eval.do_eval else "rerun"
        return finished_rerun(cfg, stop, finished, found, config, device, rank, world, train_files, eval_files,
                              init_ckpt)
    if stopped:
        return finish_stopped(cfg, stop, stopped, found, config, device, rank, world, train_files, eval_files,
                              init_ckpt, log_path)
    ckpt_path = found[-1][1] if found else None  # on rank 0's disk: only rank 0 reads it
    ckpt = checkpoint.load_on_every_rank(
        ckpt_path, rank, device, functools.partial(preflight.check_resume, cfg, config, world, train_files,
                                                   eval_files, init_ckpt, log_path, ckpt_path,
                                                   device_type=device.type)) if ckpt_path else None
    if init_ckpt and init_ckpt[1] is None:  # the --init_checkpoint is gone: a resume keeps what it recorded
        from mlperf_bert.trainer import tf_checkpoint
        if not ckpt:
            tf_checkpoint.fingerprint(cfg.model.init_checkpoint)  # a start reads it: its "not found" line
        init_ckpt = ckpt.get("run", {}).get("init_checkpoint", init_ckpt)
    if not ckpt:
        preflight.check_series(cfg, rank, world, config, train_files, eval_files, init_ckpt)
    if rank == 0 and not ckpt:
        preflight.check_log_owner(output_dir, log_path)
    if rank == 0 and cfg.config_file:  # what the run is, file and flags together (the launch record names
        run_config.write_resolved(cfg)  # it); after the resume checks: a refused rerun writes nothing
    seed = rt.seed if rt.seed is not None else (ckpt["seed"] if ckpt else None)
    if seed is None:
        seed = distributed.broadcast_object(int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF)
    identity = cfg.identity(seed, train_files, eval_files, init_ckpt, config.to_dict())
    if ckpt:
        identity = checkpoint.with_recorded_crcs(identity, ckpt.get("run") or {})
    # without a checkpoint that continues the log (a fresh start) the log is written from its first line
    continues = TrainState.log_continues(ckpt)

    # ---- MLPerf init: lines held in memory until every start check has passed
    log = MLPerfLog(log_path, rank, held=True, output_dir=output_dir)
    if not continues:
        # start_training.sh drops the page cache when it may and says so; run directly, nothing was.
        cache_cleared = os.environ.get("MLPERF_CACHE_CLEARED", "False") in ("True", "true", "1")
        log.event(C.CACHE_CLEAR, cache_cleared)
        log.start(C.INIT_START)
        m, o, sc = cfg.mlperf, cfg.optim, cfg.schedule
        log.submission(m.submission_division, m.submission_org, m.submission_platform, m.submission_status)
        log.hyperparameters(global_batch, o.learning_rate, o.epsilon, cfg.updates(sc.num_train_steps),
                            cfg.updates(sc.num_warmup_steps), cfg.updates(sc.start_warmup_step), o.lamb_beta_1,
                            o.lamb_beta_2, o.lamb_weight_decay_rate, o.steps_per_update, seed,
                            cfg.data.max_seq_length, cfg.eval.target_mlm_accuracy, sc.poly_power, o.optimizer)

    trainer = Trainer(cfg, config, device, rank, world, seed, None if ckpt else cfg.model.init_checkpoint)
    log.writes_done = functools.partial(trainer.writer.wait, raise_error=False)
    eval_set = None
    if eval_files:
        eval_set = evaluation.EvalSet(eval_files, cfg.data.max_seq_length, cfg.data.max_predictions_per_seq,
                                      trainer.eval_micro_batch(), rank, world, device, config.vocab_size)
    if rt.warm_up and cfg.warm_up_acts(device.type):
        trainer.warm_up(train_files if packed else None, eval_set)
    state = TrainState()
    if ckpt:
        trainer.resume(ckpt, ckpt_path)
        state = TrainState.from_checkpoint(ckpt, cfg.data.train_batch_size, device)
    trainer.seed_ranks(seed, ckpt)
    # made before the log is opened: a --tensorboard_dir that cannot be written stops the start first
    trainer.scalars = held.enter_context(contextlib.closing(
        tensorboard.Scalars(cfg.mlperf.tensorboard_dir, rank, state.samples if ckpt else None)))
    resumed, log_record = ckpt is not None, ckpt.get("mlperf_log") if ckpt else None
    # the checkpoint's tensors (host memory) are copied into the model and slots: not held for the whole run
    ckpt = None
    if rank == 0 and checkpoint.pinned_copies(device):  # the one rank that copies checkpoints, before run_start
        # (once a resume's checkpoint is freed: both, 7.5 GiB of BERT-Large's, were held together)
        trainer.reserve_checkpoint_buffers()
    freq = cfg.eval.eval_frequency or eval_frequency(global_batch)
    if rank == 0 and not resumed:
        preflight.warn_schedule(cfg, packed, freq, eval_set is not None, global_batch)
        preflight.warn_closed_model(cfg, trainer.model.config)
    if not continues:
        if cache_cleared:
            # the start checks read every record's header (--check_data), so every page of the training
            # and eval files came back into the page cache just dropped, and the run began with its data in RAM,
            # which the rules exclude (training_rules.adoc, "Data State at Start of Run"; the eval set's records
            # are read on the clock): each rank drops them again
            fileio.evict_from_page_cache(train_files + list(eval_files or ()))
        log.event("eval_frequency", freq)
        log.event(C.EVAL_SAMPLES, eval_set.num_records if eval_set else 0)
        log.end(C.INIT_STOP)
    if rank == 0:
        if continues:
            log.open(*log_record, what="checkpoint %s" % os.path.basename(ckpt_path))
            # where the log is now: the folder copied or moved with it (cp -a, mv), the record named the old place
            checkpoint.write_log_owner(output_dir, log_path)
        elif resumed:  # a checkpoint of an older version, which appended its resumes to the log
            log.open(append=True)
        else:
            checkpoint.write_log_owner(output_dir, log_path)
            log.open()
    # the torch and the arithmetic that wrote a checkpoint: a resume under others says its sums may round otherwise,
    extra = {"seed": seed, "config": config.to_dict(), "run": identity, "torch": checkpoint.torch_version(),
             "arithmetic": checkpoint.ARITHMETIC}
    if device.type == "cpu":  # and on the CPU its thread count, which splits its sums (a GPU's kernels do not read it)
        extra["cpu_threads"] = torch.get_num_threads()
    loop = Loop(cfg, trainer, log, stop, eval_set, freq, extra, global_batch)
    try:
        return loop.train(state, train_files, packed, seed, held)
    finally:  # an error mid-run: the checkpoint being written is completed, not cut off
        trainer.writer.wait(raise_error=False)


# ---------------------------------------------------------------- the loop

@dataclasses.dataclass
class TrainState:
    """Where the loop stands: what a checkpoint holds of it (``checkpoint``, under the keys
    checkpoints have always had) and what a resume takes back (``from_checkpoint``)."""
    step: int = 0  # micro-steps done (global_step)
    samples: int = 0  # training samples seen (packed: real sequences)
    next_eval: int = 0  # the samples count of the next online eval (0: not set yet)
    evals: list = dataclasses.field(default_factory=list)  # [(samples, masked LM accuracy)]
    block_open: bool = False  # a block_start logged without its block_stop
    block_first: int = 0  # that block's first sample
    loss_sum: typing.Any = None  # the train_loss interval's sum of losses (a device scalar: no sync)
    loss_n: int = 0  # and its micro-steps
    continues: bool = False  # the log goes on from a checkpoint's point (not written)
    # an eval's loss not finite: the weights are not (on every rank); the run ends there. Checkpointed:
    # a run stopped at that eval (or killed after its last checkpoint) resumed and trained on in NaN
    diverged: bool = False
    # the steps this run was resumed at (a stop and a rerun): its time from run_start to run_stop holds
    # the pause and a second init; the launch record keeps them, and package says so
    resumes: list = dataclasses.field(default_factory=list)

    @staticmethod
    def log_continues(ckpt):
        """Whether the log goes on from ``ckpt``'s point, as if never stopped: the checkpoint
        recorded the log's length and digest (an older version's did not: it appends)."""
        return bool(ckpt and ckpt.get("mlperf_log"))

    @classmethod
    def from_checkpoint(cls, ckpt, batch_size, device):
        block, loss = ckpt.get("block") or (False, 0), ckpt.get("loss")
        state = cls(step=ckpt["global_step"], samples=ckpt.get("samples", ckpt["global_step"] * batch_size),
                    next_eval=ckpt["next_eval"], evals=ckpt["evals"], block_open=block[0], block_first=block[1],
                    continues=cls.log_continues(ckpt), diverged=bool(ckpt.get("diverged")),
                    resumes=list(ckpt.get("resumes") or []) + [ckpt["global_step"]])
        if loss:
            state.loss_sum = torch.full((), loss[0], device=device)
            state.loss_n = loss[1]
        return state

    def checkpoint(self, mlperf_log):
        """The checkpoint's keys of the loop (``mlperf_log``: the log's mark)."""
        return dict(global_step=self.step, samples=self.samples, next_eval=self.next_eval, evals=list(self.evals),
                    mlperf_log=list(mlperf_log), block=[self.block_open, self.block_first],
                    loss=[self.loss_sum.item(), self.loss_n], diverged=self.diverged, resumes=list(self.resumes))


class Loop:
    """The training loop of a run and its hooks: log, eval, checkpoint, stop, finish."""

    def __init__(self, cfg, trainer, log, stop, eval_set, freq, extra, samples_per_update):
        self.cfg, self.trainer, self.log, self.stop = cfg, trainer, log, stop
        self.eval_set, self.freq, self.extra = eval_set, freq, extra
        self.samples_per_update = samples_per_update
        self.status, self.metrics, self.last, self.bar = C.ABORTED, None, None, None

    def train(self, state, train_files, packed, seed, held):
        """From ``state`` to the target, the step budget or a SIGTERM/SIGINT; ``held``: the run's
        ExitStack."""
        cfg, trainer, log, s = self.cfg, self.trainer, self.log, state
        self.state = s
        batch_size = cfg.data.train_batch_size
        # its group made in the untimed init: made past run_start, a rank whose peer had stopped in
        # its init (and left) waited in new_group for it until torchrun's SIGKILL
        self.vote = self.stop.vote = distributed.StopVote()
        # how the run was started (git, the source's digest: ~30 ms), for its end's record: taken here, in the
        # untimed init, so that at the end only a small write follows run_stop (a kill after run_stop and
        # before that record made the rerun start the finished run over)
        self.launch = checkpoint.launch_record(cfg, trainer.world, s.resumes) if trainer.rank == 0 else None
        self.stop.started()  # from here a signal checkpoints (before: it stopped the init at once)
        if not s.continues:
            log.start(C.RUN_START)
        if self.eval_set:  # the eval set's records, read on the clock (evaluation.EvalSet), before the meter's
            self.eval_set.load()
        # (the run's time on time.time: an NTP step back ended it "trained 300 steps ... in -3590.2 s")
        self.t_run = clock_start = time.perf_counter()
        if s.evals and reaches_target(s.evals[-1][1], cfg.eval.target_mlm_accuracy):  # resumed after reaching it
            self.status = C.SUCCESS
        if s.diverged and trainer.rank == 0:  # resumed after the eval that said so: it ends here, as it did
            print("warning: resumed after the eval at %d samples, whose masked_lm_loss was not finite (the model "
                  "diverged): the run ends here, status aborted" % s.evals[-1][0], file=sys.stderr, flush=True)
        max_steps = cfg.schedule.num_train_steps
        max_samples = cfg.schedule.max_samples_termination or float("inf")
        self.meter = trainer.meter(packed, start=clock_start)
        if self.eval_set and cfg.eval.eval_at_start and s.step == 0 and not s.evals:
            # in the first block: an eval at 0 that reached the target ended a log with none, which
            # the official checker fails (block_start: AT_LEAST_ONE_OR(epoch_start)), status success
            self.open_block()
            self.online_eval()
        if self.eval_set and s.next_eval == 0:
            s.next_eval = self.freq
        self.bar = self.progress_bar(s.step)
        self.batches = iter(loader.make_loader(self.dataset(train_files, packed, seed), cfg.data.num_workers,
                                               pin=trainer.device.type == "cuda"))
        held.callback(self.batches.close)  # its workers end with the run, however it ends
        self.step0, self.samples0 = s.step, s.samples
        self.start_step = s.step  # (the end's line: what this process trained in its time)
        if s.loss_sum is None:
            s.loss_sum = torch.zeros((), device=trainer.device)
        n = cfg.optim.steps_per_update
        # --max_samples_termination ends at an update: micro-steps past it, never applied, were in the
        # log's train_samples (a sweep), as NVIDIA's checks it after an optimizer step
        while self.status != C.SUCCESS and not s.diverged and s.step < max_steps and (
                s.samples < max_samples or s.step % n):
            if not s.block_open:
                self.open_block()
            batch = next(self.batches)
            # packed rows hold several sequences: the loader counts the real ones of the global batch
            s.samples += int(batch.pop("global_sequences", batch_size))
            self.meter.add(batch)
            self.last, updated = trainer.step(batch, s.step)
            s.step += 1
            s.loss_sum += self.last
            s.loss_n += 1
            end = s.step == max_steps or (s.samples >= max_samples and s.step % n == 0)
            if s.step % cfg.mlperf.log_frequency == 0 or end:
                self.log_interval()
            if self.bar is not None:
                self.bar.update(1)
            if updated and self.eval_set and s.samples >= s.next_eval:
                self.close_block()
                self.online_eval()
                while s.next_eval <= s.samples:
                    s.next_eval += self.freq
            # diverged: every later step and eval would be NaN (LAMB's update of a NaN gradient is NaN),
            # and the run would train on to its step budget; it ends here, status aborted, as it would then
            end = end or s.diverged
            # ranks agree on a stop at update boundaries, by a vote of the host that waits for no device
            halt = self.stop.requested
            if trainer.world > 1:
                halt = updated and self.stop.agreed(self.vote(self.stop.asked()))
            every = cfg.checkpoint.save_checkpoints_steps
            if (every and s.step % every == 0) or halt or end or self.status == C.SUCCESS:
                # the last one (a stop, the end): no update follows, nothing to copy
                self.save(final=halt or end or self.status == C.SUCCESS)
            if halt:
                return self.halted()
        return self.finish(train_files)

    # ---- the hooks
    def dataset(self, train_files, packed, seed):
        cfg, s, t = self.cfg, self.state, self.trainer
        d = cfg.data
        if packed:
            from mlperf_bert.trainer.packed_loader import PackedBatches
            ds = PackedBatches(train_files, d.train_batch_size, t.rank, t.world, d.shuffle, seed, start_batch=s.step,
                               vocab_size=t.model.config.vocab_size)
        else:
            ds = loader.PretrainingBatches(train_files, d.max_seq_length, d.max_predictions_per_seq,
                                           d.train_batch_size, t.rank, t.world, d.shuffle, seed, d.shuffle_buffer,
                                           start_batch=s.step, vocab_size=t.model.config.vocab_size)
        if packed and self.meter.row_flops:  # the MLM head computes the loader's prediction slots of a row
            self.meter.row_flops = t.row_flops(ds.slots)
            self.meter.batch_flops = t.batch_flops(ds.slots)  # the attention the varlen kernel computes
        return ds

    def progress_bar(self, step):
        if self.trainer.rank != 0 or not self.cfg.runtime.progress:
            return None
        from mlperf_bert.progress import bar
        # (to --max_samples_termination's update where that ends the run first: the demo's bar ended at 10 %;
        # packed rows hold sequences by the files' mean rate, so it may end a little off its total)
        total = self.cfg.last_step(self.samples_per_update)
        # (named as every other bar is: a batch job's log showed "  5%|5  | 101/2000" among other output)
        return bar(total=max(total, step), initial=step, unit="step", desc="train", leave=False)

    def log_interval(self):
        """train_loss and the interval's rates. Host syncs (.item(), collectives) only at log,
        update, eval and checkpoint boundaries, so the CPU can queue micro-steps ahead of the GPU;
        this read waits for the interval's work, so its rates are those of the work done (mean
        loss since the last line; samples_count places it on the training axis)."""
        s, trainer = self.state, self.trainer
        mean_loss = s.loss_sum.item() / s.loss_n
        rates = self.meter.interval(self.cfg.data.train_batch_size * (s.step - self.step0), s.samples - self.samples0)
        self.step0, self.samples0 = s.step, s.samples
        lr = trainer.learning_rate(s.step - 1)
        if self.bar is not None:
            self.bar.set_postfix(_postfix(self.last.item(), lr, rates), refresh=False)
        self.log.event("train_loss", mean_loss, metadata=dict(
            {C.SAMPLES_COUNT: s.samples, "step": s.step, "learning_rate": lr}, **rates))
        trainer.scalars.train(s.samples, mean_loss, lr, rates)
        s.loss_sum.zero_()
        s.loss_n = 0

    def online_eval(self):
        """The online eval at this many samples; the target reached: SUCCESS."""
        samples, log = self.state.samples, self.log
        with self.meter.excluded():  # the eval's time is its own log lines', not the training's rate
            log.start(C.EVAL_START, metadata={C.EPOCH_NUM: samples})
            m = self.trainer.evaluate(self.eval_set)
            log.end(C.EVAL_STOP, metadata={C.EPOCH_NUM: samples})
        log.event(C.EVAL_ACCURACY, m["masked_lm_accuracy"], metadata={C.EPOCH_NUM: samples})
        log.event("eval_mlm_loss", m["masked_lm_loss"], metadata={C.EPOCH_NUM: samples})
        self.trainer.scalars.eval(samples, m)
        self.state.evals.append((samples, m["masked_lm_accuracy"]))
        self.metrics = m
        if not math.isfinite(m["masked_lm_loss"]):  # all-reduced: every rank sees it
            self.state.diverged = True
            if self.trainer.rank == 0:
                print("warning: the eval at %d samples has masked_lm_loss %s: the model diverged (its weights are no "
                      "longer finite); the run ends here, status aborted, instead of training on in NaN"
                      % (samples, m["masked_lm_loss"]), file=sys.stderr, flush=True)
        if reaches_target(m["masked_lm_accuracy"], self.cfg.eval.target_mlm_accuracy):
            self.status = C.SUCCESS

    def open_block(self):
        s = self.state
        s.block_first = s.samples  # BERT counts "epochs" in samples: a block is the eval interval starting here
        self.log.start(C.BLOCK_START, metadata={C.FIRST_EPOCH_NUM: s.block_first, C.EPOCH_COUNT: self.freq})
        s.block_open = True

    def close_block(self):
        s = self.state
        self.log.end(C.BLOCK_STOP, metadata={C.FIRST_EPOCH_NUM: s.block_first, C.EPOCH_COUNT: self.freq})
        s.block_open = False

    def save(self, final=False):
        """A checkpoint at this step: where the log and its open block and loss mean stand, so a
        resume goes on from there."""
        s = self.state
        with self.meter.excluded():
            self.trainer.save(checkpoint.path_for(self.cfg.checkpoint.output_dir, s.step),
                              dict(self.extra, **s.checkpoint(self.log.mark())), final=final)

    def halted(self):
        """A SIGTERM/SIGINT: the checkpoint is written; say so and exit 128 + the signal."""
        self.vote.close()
        self.trainer.flush()
        if self.bar is not None:
            self.bar.close()
        if self.trainer.rank == 0:  # one line for the run, not one per rank
            print("%s: checkpoint model.ckpt-%d.pt written; rerun the same command to resume"
                  % (self.stop.name, self.state.step), flush=True)
        self.log.close()
        self.batches.close()
        return self.stop.status

    def finish(self, train_files):
        """The end: run_stop, --do_eval's eval, the finished marker."""
        cfg, trainer, s, log = self.cfg, self.trainer, self.state, self.log
        rank, world = trainer.rank, trainer.world
        self.batches.close()  # the loader's workers end here, not after the final eval
        self.vote.close()
        if self.bar is not None:
            self.bar.close()
        if s.block_open:
            log.end(C.BLOCK_STOP, metadata={C.FIRST_EPOCH_NUM: s.block_first, C.EPOCH_COUNT: self.freq})
        log.event(C.TRAIN_SAMPLES, s.samples)
        log.end(C.RUN_STOP, metadata={C.STATUS: self.status, C.SAMPLES_COUNT: s.samples})
        log.close()
        # --do_eval's eval of these final weights, when the last online eval saw them
        known = cfg.eval.do_eval and self.eval_set and self.metrics is not None and s.evals[-1][0] == s.samples
        if rank == 0:  # the result is the log's from here: a kill now leaves a rerun nothing to train again
            record = checkpoint.end_record(self.status, s.step, s.samples, self.extra["run"], self.launch)
            checkpoint.write_stopped(cfg.checkpoint.output_dir, dict(
                record, mlperf_log=list(log.mark()), metrics=self.metrics if known else None, world=world))
        # ended, its record written: a signal now stops at once, and the same command finishes what is left
        self.stop.finishing = self.stop.in_init = True
        if rank == 0:
            # a resume's time is its own steps': "trained 300 steps in 0.8 s" read as 375 steps/s
            here = (" (%d here, resumed at step %d)" % (s.step - self.start_step, self.start_step)
                    if self.start_step else "")
            print("trained %d steps%s (%d samples) in %.1f s; final loss %s; status %s"
                  % (s.step, here, s.samples, time.perf_counter() - self.t_run,
                     "n/a" if self.last is None else "%.4f" % self.last.item(), self.status), flush=True)
        if cfg.eval.do_eval:
            metrics = self.metrics if known else trainer.evaluate(self.stop.checked(
                final_eval_batches(cfg, self.eval_set, train_files, rank, world, trainer.model.config.vocab_size,
                                   trainer.device)))
            if rank == 0:
                print(evaluation.write_eval_results(cfg.checkpoint.output_dir, metrics, s.step))
        try:
            trainer.flush()  # the last checkpoint, written while the above ran, is complete
        except UserError as e:  # (its fix, "rerun", alone read as if the rerun saved the weights)
            raise UserError("%s; the run has ended (run_stop logged, its log is complete): its final weights are "
                            "lost with this checkpoint, and the rerun finishes the run's record without them" % e) from None
        if rank == 0:  # a rerun of this command now says so and changes nothing
            checkpoint.write_finished(cfg.checkpoint.output_dir, record)
        return 0


def final_eval_batches(cfg, eval_set, train_files, rank, world, vocab_size, device):
    """What --do_eval evaluates the final weights on: the online eval set, else the reference's
    eval batches of the training files."""
    if eval_set:
        return eval_set
    return evaluation.reference_eval_batches(cfg.data, cfg.eval, train_files, rank, world, vocab_size, device)


def finished_rerun(cfg, stop, finished, found, config, device, rank, world, train_files, eval_files, init_ckpt):
    """A rerun of a finished run (``finished``: its marker): nothing to do, unless --do_eval was
    given and its eval of the final weights is not written while its final checkpoint is kept: done
    now, and what identifies that eval (its batches, RunConfig.identity) added to the marker, as a
    run started with --do_eval has it, so that a rerun with others is refused (rank 0 decides from
    its disk)."""
    out, step = cfg.checkpoint.output_dir, finished.get("global_step")
    written = distributed.broadcast_object(evaluation.results_step(out) == step if rank == 0 else None)
    kept = any(s == step for s, _ in found)
    left = cfg.eval.do_eval and not written and kept
    lost = ("--do_eval's eval of its final weights cannot be made: its final checkpoint %s is not there"
            % os.path.basename(checkpoint.path_for(out, step)) if cfg.eval.do_eval and not written and not kept
            else None)
    status = preflight.finished_before(cfg, finished, rank, config, train_files, eval_files, init_ckpt, left, lost)
    if left:
        def record_batches():  # before the results: a stop between the two left a rerun of other batches "done"
            saved = finished.get("run") or {}
            ident = cfg.identity(saved.get("seed"), train_files, eval_files, init_ckpt, config.to_dict())
            checkpoint.add_to_finished(out, finished, {k: v for k, v in ident.items() if k not in saved})
        done = final_eval_left(cfg, stop, finished, found, config, device, rank, world, train_files, eval_files,
                               record_batches)
        if rank == 0:
            print("%s: this run finished earlier (status %s after %d samples); done now, nothing trained: %s"
                  % (out, finished.get("status"), finished.get("samples", 0), done), flush=True)
    return status


def finish_stopped(cfg, stop, stopped, found, config, device, rank, world, train_files, eval_files, init_ckpt,
                   log_path):
    """A rerun of a run stopped after its run_stop, before its finished marker (killed while its
    final checkpoint or --do_eval's eval was written): its result is its log's, kept as it is;
    nothing is trained again (its run_stop would move past the pause). What is left is done:
    --do_eval's eval from the final checkpoint, then the finished marker."""
    out, step = cfg.checkpoint.output_dir, stopped["global_step"]
    final = checkpoint.path_for(out, step)
    kept = any(s == step for s, _ in found)
    preflight.check_stopped(cfg, stopped, rank, world, config, train_files, eval_files, init_ckpt, log_path)
    stop.finishing = True  # a signal now: stopped at once, and the same command finishes it
    done = []
    # rank 0 decides from its disk (other nodes may see other disks); an eval_results.txt of
    # another step (--do_eval alone into this folder) is not the final weights' eval
    written = distributed.broadcast_object(evaluation.results_step(out) == step if rank == 0 else None)
    if cfg.eval.do_eval and written:
        done.append("--do_eval's eval of its final weights: %s (written before the stop)" % evaluation.RESULTS)
    elif cfg.eval.do_eval:
        done.append(final_eval_left(cfg, stop, stopped, found, config, device, rank, world, train_files, eval_files))
    if rank == 0:
        checkpoint.write_finished(out, stopped)
        lost = "" if kept else ("; its final checkpoint %s is not there (its write was stopped or failed, a full "
                                "disk, or it was deleted since), so the weights after its last step are lost"
                                % os.path.basename(final))
        print("%s: this run ended earlier (run_stop logged: status %s after %d samples) and was stopped before its "
              "end was written%s; its result is its log %s, kept as it was; done now, nothing trained: %s"
              % (out, stopped.get("status"), stopped.get("samples", 0), lost, log_path,
                 "; ".join(done + [checkpoint.FINISHED])), flush=True)
    return 0


def final_eval_left(cfg, stop, record, found, config, device, rank, world, train_files, eval_files, before=None):
    """--do_eval's eval of the final weights of an ended run (``record``: its marker), not written:
    from the metrics its last online eval recorded, else from its final checkpoint; what was done.
    ``before``: what rank 0 does just before it writes the results."""
    out, step = cfg.checkpoint.output_dir, record["global_step"]
    final = checkpoint.path_for(out, step)
    stop.finishing = True  # a signal now: stopped at once, and the same command finishes it
    metrics = record.get("metrics")

    def same_ranks(ckpt):  # its ranks' own state is scattered to this run's
        if len(ckpt["ranks"]) != world:
            raise UserError("checkpoint %s was written by %d rank%s, this run has %d: rerun with the same number for "
                            "--do_eval's eval of its final weights" % (final, len(ckpt["ranks"]),
                                                                       "" if len(ckpt["ranks"]) == 1 else "s", world))
    if metrics is None and any(s == step for s, _ in found):
        # (the seed: the run's dropout draws, which an eval makes none of; a marker of an older version lacks it)
        trainer = Trainer(cfg, config, device, rank, world, (record.get("run") or {}).get("seed", 0))
        trainer.resume(checkpoint.load_on_every_rank(final, rank, device, same_ranks, ended=True), final)
        eval_set = None
        if eval_files:
            eval_set = evaluation.EvalSet(eval_files, cfg.data.max_seq_length, cfg.data.max_predictions_per_seq,
                                          trainer.eval_micro_batch(), rank, world, device, config.vocab_size)
        metrics = trainer.evaluate(stop.checked(final_eval_batches(cfg, eval_set, train_files, rank, world,
                                                                   config.vocab_size, device)))
    if metrics is None:  # (its caller says the final checkpoint is not there)
        return "not --do_eval's eval: its final weights are lost"
    if rank == 0:
        if before is not None:
            before()
        print(evaluation.write_eval_results(out, metrics, step))
    return "--do_eval's eval of its final weights: %s" % evaluation.RESULTS


def _postfix(loss, lr, rates):
    """The progress bar's numbers: the loss of the last micro-step, the interval's rates."""
    out = {"loss": "%.4f" % loss, "lr": "%.3g" % lr, "seq/s": "%.1f" % rates["seq_per_s"]}
    if "rows_per_s" in rates:
        out["rows/s"] = "%.1f" % rates["rows_per_s"]
    if "tflops_per_gpu" in rates:
        out["TFLOP/s"] = "%.0f" % rates["tflops_per_gpu"]
    if "mfu" in rates:
        out["MFU"] = "%.1f%%" % (100 * rates["mfu"])
    return out


def run_eval_only(cfg, config, files, device, rank, world, stop):
    """--do_eval alone: the reference's eval of --init_checkpoint on --input_file."""
    from mlperf_bert.trainer import model as modeling
    from mlperf_bert.trainer import tf_checkpoint
    out = cfg.checkpoint.output_dir
    # a training run's folder: its eval_results.txt (its final weights' eval) would be replaced
    run_there = distributed.broadcast_object(checkpoint.run_held_in(out) if rank == 0 else None)
    if run_there:
        raise UserError("--output_dir %s holds a training run (%s): --do_eval alone would replace its %s; give another "
                        "--output_dir" % (out, run_there, evaluation.RESULTS))
    model = modeling.BertForPreTraining(config).to(device)
    init = cfg.model.init_checkpoint
    info = tf_checkpoint.load_init_checkpoint(model, init)
    step = info.get("global_step")
    if step is None:
        m = re.search(r"ckpt-(\d+)", os.path.basename(init))
        step = int(m.group(1)) if m else 0
    from mlperf_bert.progress import bar
    stop.starting = False  # its checks passed: a peer lost from here failed in the eval
    # the reference's eval of BERT-Large: minutes to hours
    with bar(evaluation.reference_eval_batches(cfg.data, cfg.eval, files, rank, world, config.vocab_size, device),
             total=cfg.eval.max_eval_steps, desc="eval", unit="batch",
             disable=rank != 0 or not cfg.runtime.progress) as batches:
        metrics = evaluation.evaluate(model, stop.checked(batches), device, autocast(device, cfg.model.dtype))
    if rank == 0:
        path = evaluation.write_eval_results(cfg.checkpoint.output_dir, metrics, int(step))
        note = evaluation.reference_expectation(int(step), metrics["samples"])
        for key in evaluation.EVAL_KEYS:
            print("%s = %.6f%s" % (key, metrics[key], note if key == "masked_lm_accuracy" else ""))
        print(evaluation.samples_line(metrics["samples"], cfg.eval))
        print("wrote %s" % path)
    return 0

