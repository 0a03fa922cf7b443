"""Create BERT pre-training TFRecords from text shards (the reference's flags)."""
from mlperf_bert.cli import run_main
from mlperf_bert.dataset.pretraining_data import main

if __name__ == "__main__":
    run_main(main)
