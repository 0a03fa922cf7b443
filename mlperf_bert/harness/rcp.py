"""Reference convergence points (RCPs) of BERT as presets: ``train_model.sh --preset=rcp_<batch>``.

The one source is mlperf_logging's ``rcp_checker/training_5.0.0/rcps_bert.json`` as installed:
its hyperparameters count optimizer updates at the global batch. The trainer's reference flags
count micro-steps (``--num_train_steps``, ``--num_warmup_steps``, ``--start_warmup_step`` with
``--steps_per_update`` n), so a preset multiplies the RCP's step counts by n; the MLPerf log states
them in updates again (docs/training.md). n is the smallest accumulation that splits the global
batch into whole per-GPU batches of at most ``max_per_gpu``.

``python -m mlperf_bert.harness.rcp --batch_size=3072 --world=8 [--max_per_gpu=129]`` prints the
preset as bash assignments (train_model.sh evaluates them); ``--list --world=8`` each RCP's
per-GPU batch and accumulation on that many GPUs.
"""
import json
import math
import os
import shlex

from mlperf_bert import flags
from mlperf_bert.errors import UserError
from mlperf_bert.trainer.memory_plan import MAX_PER_GPU_BATCH


def rcp_file():
    import mlperf_logging
    return os.path.join(os.path.dirname(mlperf_logging.__file__), "rcp_checker", "training_5.0.0", "rcps_bert.json")


def load_rcps():
    """{global batch size: hyperparameters} of every BERT RCP."""
    with open(rcp_file()) as f:
        return {int(v["BS"]): v["Hyperparams"] for v in json.load(f).values()}


def samples_to_converge():
    """{global batch size: the mean of its RCP runs' samples to converge} ("Epochs to converge",
    which counts samples for BERT)."""
    with open(rcp_file()) as f:
        return {int(v["BS"]): sum(v["Epochs to converge"]) / len(v["Epochs to converge"]) for v in json.load(f).values()}


def rcp_entry(batch_size):
    """(name, hyperparameters) of the RCP of global batch ``batch_size``, or None."""
    with open(rcp_file()) as f:
        found = [(name, v["Hyperparams"]) for name, v in json.load(f).items() if int(v["BS"]) == batch_size]
    return found[0] if found else None


def accumulation(batch_size, world, max_per_gpu):
    """The smallest n with batch_size = world x per-GPU batch x n and per-GPU batch <= max_per_gpu."""
    for n in range(1, batch_size + 1):
        if batch_size % (world * n) == 0 and batch_size // (world * n) <= max_per_gpu:
            return n
    raise UserError("global batch %d cannot be split over %d GPUs: choose a number of GPUs that divides it"
                    % (batch_size, world))


def preset_flags(batch_size, world, max_per_gpu=MAX_PER_GPU_BATCH):
    """The trainer flags of the RCP of ``batch_size`` on ``world`` GPUs."""
    rcps = load_rcps()
    if batch_size not in rcps:
        raise UserError("no reference convergence point for global batch %d: choose one of %s"
                        % (batch_size, ", ".join("rcp_%d" % b for b in sorted(rcps))))
    hp = rcps[batch_size]
    n = accumulation(batch_size, world, max_per_gpu)
    eps = hp["opt_epsilon"]
    return [
        "--max_seq_length=512", "--max_predictions_per_seq=76", "--optimizer=lamb", "--dtype=bf16",
        "--train_batch_size=%d" % (batch_size // n), "--steps_per_update=%d" % n,
        "--learning_rate=%r" % hp["opt_base_learning_rate"],
        "--lamb_beta_1=%r" % hp["opt_lamb_beta_1"], "--lamb_beta_2=%r" % hp["opt_lamb_beta_2"],
        "--lamb_weight_decay_rate=%r" % hp["opt_lamb_weight_decay_rate"],
        "--log_epsilon=%r" % round(math.log10(eps), 6),
        "--num_train_steps=%d" % (hp["opt_learning_rate_training_steps"] * n),
        "--num_warmup_steps=%d" % (hp["num_warmup_steps"] * n),
        "--start_warmup_step=%d" % (hp["start_warmup_step"] * n),
        # a timed run: a checkpoint at the end and on SIGTERM only (bench/checkpoint_save.py --train:
        # periodic ones cost the clock even when written in the background; docs/training.md)
        "--save_checkpoints_steps=0", "--eval_batch_size=%d" % (8 * world),
        "--target_mlm_accuracy=0.720", "--submission_division=closed",
    ]


def main(argv):
    fv = flags.FlagValues()
    flags.DEFINE_integer("batch_size", None, "global batch of the RCP", flag_values=fv)
    flags.DEFINE_integer("world", 1, "GPUs in all (NUM_GPUS x NNODES)", flag_values=fv)
    flags.DEFINE_integer("max_per_gpu", MAX_PER_GPU_BATCH, "largest per-GPU micro-batch (trainer/memory_plan.py)",
                         flag_values=fv)
    flags.DEFINE_bool("list", False, "print 'rcp_<B> <per-GPU batch> <accumulation>' for every RCP on --world "
                      "GPUs instead (train_model.sh --help shows them)", flag_values=fv)
    flags.parse(fv, argv, positional=False)
    if fv.world < 1 or fv.max_per_gpu < 1:
        raise UserError("--world and --max_per_gpu must be positive")
    if fv.list:
        for b in sorted(load_rcps()):
            try:
                n = accumulation(b, fv.world, fv.max_per_gpu)
                print("rcp_%d %d %d" % (b, b // (fv.world * n), n))
            except UserError:
                print("rcp_%d - -" % b)  # cannot be split over this many GPUs
        return 0
    if fv.batch_size is None:
        raise UserError("flag --batch_size is required")
    preset = preset_flags(fv.batch_size, fv.world, fv.max_per_gpu)
    print("PRESET_FLAGS=(%s)" % " ".join(shlex.quote(f) for f in preset))
    return 0


if __name__ == "__main__":
    from mlperf_bert.cli import run_main
    run_main(main)
