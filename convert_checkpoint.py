#!/usr/bin/env python3
"""Convert a checkpoint between this project's .pt and a TF checkpoint prefix."""
from mlperf_bert.start_signals import command_start_stop, quiet_start

quiet_start(command_start_stop)  # a stop while the modules load (absl's too): one line, not a traceback
from mlperf_bert.cli import import_main, run_main  # noqa: E402
main = import_main("mlperf_bert.trainer.checkpoint_convert")  # noqa: E402

if __name__ == "__main__":
    run_main(main)
