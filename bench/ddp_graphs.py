"""How many graphs dynamo's DDP optimizer splits BERT-Large into, at each DDP bucket cap.

Usage: .venv/bin/python bench/ddp_graphs.py [--caps_mb=25,64,128,256]

Under --compile with DDP (--clip_by_global_norm_after_gradient_allreduce on several ranks)
dynamo splits the compiled model at DDP's buckets (torch/_dynamo/backends/distributed.py,
DDPOptimizer: the parameters counted in reverse graph order up to the cap, the first bucket
DDP's 1 MiB). This runs that splitter itself on BERT-Large's forward traced by dynamo on the meta
device (no memory, no GPU, no process group; ~10 s of CPU a cap) and prints the graphs and each
one's MiB of parameters, in forward order: the figures of levers.DDP_BUCKET_MB's comment.
"""
import os
import sys
import time
from _data import OneLineParser, doc  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv):
    ap = OneLineParser(description=doc(__file__).splitlines()[0])
    ap.add_argument("--caps_mb", default="25,64,128,256",
                    help="DDP bucket caps to split at, in MB, comma-separated")
    args = ap.parse_args(argv[1:])
    try:
        caps = [float(c) for c in args.caps_mb.split(",")]
    except ValueError:
        caps = [0]
    if min(caps) <= 0:  # a cap of 0 ended in dynamo's AssertionError about bucket sizes
        ap.error("--caps_mb=%s: give numbers of MB above 0, e.g. --caps_mb=64,128" % args.caps_mb)
    import torch
    import torch._dynamo
    from torch._dynamo.backends.distributed import DDPOptimizer

    from mlperf_bert.trainer import memory_plan
    from mlperf_bert.trainer.config import BertConfig
    from mlperf_bert.trainer.model import BertForPreTraining
    seq, pred, rows = 512, 76, 2
    with torch.device("meta"):
        model = BertForPreTraining(BertConfig.from_json_file(memory_plan.CONFIG, seq))
        ids = torch.zeros(rows, seq, dtype=torch.long)
        batch = {"input_ids": ids, "segment_ids": ids, "input_mask": torch.ones_like(ids),
                 "masked_lm_positions": torch.zeros(rows, pred, dtype=torch.long),
                 "masked_lm_ids": torch.zeros(rows, pred, dtype=torch.long),
                 "masked_lm_weights": torch.ones(rows, pred), "next_sentence_labels": torch.zeros(rows, dtype=torch.long)}
    for mb in caps:
        t = time.time()
        torch._dynamo.reset()
        splitter = DDPOptimizer(int(mb * (1 << 20)), lambda gm, inputs: gm.forward)
        torch.compile(model, backend=splitter.compile_fn, dynamic=False)(**batch)
        print("bucket cap %g MB: %d graphs, MiB of parameters each: %s (%.1f s)" % (
            mb, len(splitter.buckets), " ".join(str(round(b.size / (1 << 20))) for b in splitter.buckets),
            time.time() - t), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
