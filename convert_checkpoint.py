#!/usr/bin/env python3
"""Convert a checkpoint between this project's .pt and a TF checkpoint prefix."""
from mlperf_bert.cli import command_start_stop, quiet_start, run_main

quiet_start(command_start_stop)  # a stop while the modules load: one line, not a traceback
from mlperf_bert.trainer.checkpoint_convert import main  # noqa: E402

if __name__ == "__main__":
    run_main(main)
