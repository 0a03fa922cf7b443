"""run_pretraining.py: the MLPerf BERT trainer (same flags as the reference); see docs/training.md."""
from mlperf_bert.cli import quiet_start, run_main

quiet_start()  # a Ctrl-C in torch's import: no traceback
from mlperf_bert.trainer.training import main  # noqa: E402

if __name__ == "__main__":
    run_main(main)
