#!/usr/bin/env python3
"""Convert a checkpoint between this project's .pt and a TF checkpoint prefix."""
from mlperf_bert.trainer.checkpoint_convert import main
from mlperf_bert.cli import run_main

if __name__ == "__main__":
    run_main(main)
