"""run_pretraining.py's entry (``python -m mlperf_bert train``'s too): its flags read and refused
(flag_checks.read_flags) before torch is imported, so that a mistyped flag is one line at once,
not after the second or more torch takes to load; then the run
(trainer/training.py). No torch here."""
from mlperf_bert.start_signals import starting, trainer_start_stop
from mlperf_bert.trainer import flag_checks


def main(argv):
    # A stop while the flags are read and torch loads is the start's (nothing of this start is
    # saved: run alone, one line and exit 79; a rank of torchrun's ends by the signal), as it is
    # before run_main; the run's own handling of it starts with the run.
    # 143 (130) where --output_dir holds a checkpoint: the command line's (argv_output_dir), then the flags'
    where = {}
    with starting(trainer_start_stop(where=where)):
        cfg = flag_checks.read_flags(argv)
        where["output_dir"] = cfg.checkpoint.output_dir
        from mlperf_bert.trainer import training
    return training.train(cfg)


if __name__ == "__main__":
    from mlperf_bert.cli import run_main
    run_main(main)
