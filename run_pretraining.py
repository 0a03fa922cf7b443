"""run_pretraining.py: the MLPerf BERT trainer (same flags as the reference); see docs/training.md."""
from mlperf_bert.start_signals import outlive_readers, quiet_start, trainer_start_stop

# A stop while absl's modules load, and then (trainer/entry.py: start_signals.starting) while the flags
# are read and torch's load (seconds): no traceback; run alone, one line and exit 79 (nothing of this
# start saved), not a silent 143, or 143 (130) where the command line's --output_dir holds a checkpoint
# (a resumed run); under torchrun the launcher says it, once for every rank.
quiet_start(trainer_start_stop())
outlive_readers()  # `... | tee run.log` and Ctrl-C, which ends tee: the stop goes on to its checkpoint and status
from mlperf_bert.cli import import_main, run_main  # noqa: E402
main = import_main("mlperf_bert.trainer.entry")  # noqa: E402

if __name__ == "__main__":
    run_main(main)
