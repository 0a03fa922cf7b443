#!/usr/bin/env python3
"""Add zero GradientAccumulator variables to a TF checkpoint (reference tool)."""
from mlperf_bert.trainer.gradacc import main
from mlperf_bert.cli import run_main

if __name__ == "__main__":
    run_main(main)
