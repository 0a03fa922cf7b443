"""Time one LAMB update, per-tensor path vs multi-tensor (torch._foreach_*) path, side by side,
and the MLM head gathered at the masked positions vs logits over every token.

Usage: .venv/bin/python bench/bench_optimizer.py [--device=cuda] [--large]
Default model: 6 layers, hidden 512 (BERT-Large with --large). Prints ms per call and ratios.
"""
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from mlperf_bert.trainer.config import BertConfig  # noqa: E402
from mlperf_bert.trainer.model import BertForPreTraining  # noqa: E402
from mlperf_bert.trainer.optimizer import create_optimizer  # noqa: E402


def timed(fn, device, reps=3):
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t) / reps * 1e3


def main(argv):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import _data
    from mlperf_bert import flags
    from mlperf_bert.errors import UserError
    fv = flags.FlagValues()
    flags.DEFINE_enum("device", "cpu", ["cpu", "cuda"], "Where to time.", flag_values=fv)
    flags.DEFINE_bool("large", False, "BERT-Large (default: 6 layers, hidden 512).", flag_values=fv)
    _data.parse(fv, argv, _data.doc(__file__))
    device = fv.device
    if device == "cuda" and not torch.cuda.is_available():  # torch's AssertionError traceback, else
        raise UserError("--device=cuda, but this host has no CUDA GPU: run it on a GPU machine, or drop --device")
    cfg = BertConfig() if fv.large else BertConfig(hidden_size=512, num_hidden_layers=6,
                                                                num_attention_heads=8, intermediate_size=2048)
    model = BertForPreTraining(cfg).to(device)
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    ms = {}
    for foreach in (False, True):
        opt = create_optimizer(model, "lamb", foreach=foreach)
        ms[foreach] = timed(opt.step, device)
    print("LAMB step (%s, %d tensors): per-tensor %.1f ms, multi-tensor %.1f ms, ratio %.2fx"
          % (device, len(list(model.parameters())), ms[False], ms[True], ms[False] / ms[True]))

    b, t, p = 8, 128, 20
    x = torch.randn(b, t, cfg.hidden_size, device=device)
    pos = torch.randint(0, t, (b, p), device=device)
    head = model.cls.predictions
    emb = model.bert.embeddings.word_embeddings

    def logits(h):
        return head.transform.LayerNorm(head.act(head.transform.dense(h))) @ emb.t() + head.output_bias

    with torch.no_grad():
        gathered = timed(lambda: logits(x.reshape(-1, cfg.hidden_size).index_select(
            0, (pos + torch.arange(b, device=device)[:, None] * t).reshape(-1))), device)
        full = timed(lambda: logits(x), device)
    print("MLM head (batch %d, seq %d, %d masked): every token %.1f ms, gathered %.1f ms, ratio %.1fx"
          % (b, t, p, full, gathered, full / gathered))


if __name__ == "__main__":
    from mlperf_bert.cli import run_main
    run_main(main)
