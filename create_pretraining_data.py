"""Create BERT pre-training TFRecords from text shards (the reference's flags)."""
from mlperf_bert.start_signals import command_start_stop, quiet_start

quiet_start(command_start_stop)  # a stop while the modules load (absl's too): one line, not a traceback
from mlperf_bert.cli import import_main, run_main  # noqa: E402
main = import_main("mlperf_bert.dataset.pretraining_data")  # noqa: E402

if __name__ == "__main__":
    run_main(main)
