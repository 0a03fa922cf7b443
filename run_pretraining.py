"""run_pretraining.py: the MLPerf BERT trainer (same flags as the reference); see docs/training.md."""
from mlperf_bert.cli import run_main
from mlperf_bert.trainer.training import main

if __name__ == "__main__":
    run_main(main)
