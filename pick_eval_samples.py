"""Pick the eval samples from eval_intermediate (the reference's flags)."""
from mlperf_bert.cli import run_main
from mlperf_bert.dataset.eval_samples import main

if __name__ == "__main__":
    run_main(main)
