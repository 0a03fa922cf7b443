"""How long a stop takes to write its checkpoint: BERT-Large with its LAMB state, as the trainer
writes it on SIGTERM (checkpoint.save: torch.save to a temporary name, fsync, rename).

    .venv/bin/python bench/checkpoint_save.py [--dir=DIR] [--repeats=3] [--ranks=8]

DIR is where a run's --output_dir would be (the disk is what is measured). The state is the one a
SIGTERM stop writes at an update boundary: model, LAMB moments (after one update), each of
``--ranks`` ranks' RNG state and empty accumulator. Prints the file size, each save's seconds and
MB/s, and the load average. Needs about 6 GB of memory.
"""
import argparse
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

from mlperf_bert.trainer import checkpoint, optimizer  # noqa: E402
from mlperf_bert.trainer.config import BertConfig  # noqa: E402
from mlperf_bert.trainer.model import BertForPreTraining  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=None, help="where to write (default: a temporary folder in /tmp)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--ranks", type=int, default=8)
    args = ap.parse_args()
    config = BertConfig.from_json_file(os.path.join(ROOT, "configs", "bert_config_large.json"))
    model = BertForPreTraining(config)
    opt = optimizer.create_optimizer(model, "lamb")
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()  # creates the moments, as the first update of a run does
    model.zero_grad(set_to_none=True)
    params = sum(p.numel() for p in model.parameters())
    rank = {"rng": checkpoint.rng_state(torch.device("cpu")),
            "accumulator": {"steps_per_update": 1, "pending": 0, "buffers": None, "clip_after_reduce": False}}
    state = {"global_step": 1000, "samples": 1000, "next_eval": 0, "evals": [], "model": model.state_dict(),
             "optimizer": opt.state_dict(), "ranks": [rank] * args.ranks, "world_size": args.ranks}
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="checkpoint_save.") as d:
        print("BERT-Large: %d parameters (%.2f GB fp32) + LAMB moments; writing to %s" % (params, params * 4 / 1e9, d))
        for r in range(args.repeats):
            path = checkpoint.path_for(d, r)
            t = time.time()
            checkpoint.save(path, state, keep=1)
            seconds = time.time() - t
            size = os.path.getsize(path)
            print("save %d: %.2f GB in %.1f s (%.0f MB/s)" % (r, size / 1e9, seconds, size / 1e6 / seconds),
                  flush=True)
    with open("/proc/loadavg") as f:
        print("load average: %s (%d cores)" % (" ".join(f.read().split()[:3]), os.cpu_count()))


if __name__ == "__main__":
    main()
