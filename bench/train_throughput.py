"""Sequences/s of the trainer's full step (forward, backward, clip by global norm, LAMB update).

Usage: .venv/bin/python bench/train_throughput.py --bert_config_file=CONFIG --max_seq_length=128
         --max_predictions_per_seq=20 --train_batch_size=8 --steps=10 [--dtype=bf16] [--device=cuda]
         [--input_file=TFRECORDS]
Without --input_file the batches are synthetic (random ids, masked positions and labels).
When ``transformers`` is installed, Hugging Face ``BertForPreTraining`` with the same config
and batch (labels at the same masked positions; clip, then torch AdamW) is timed in
alternation with ours, and the ratio printed. The last line is JSON.
On CUDA it also reports model FLOP utilisation (6 x params x tokens, plus attention).
"""
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from mlperf_bert.trainer import loader  # noqa: E402
from mlperf_bert import flags
from mlperf_bert.trainer.accumulation import GradientAccumulator  # noqa: E402
from mlperf_bert.trainer.config import BertConfig  # noqa: E402
from mlperf_bert.errors import run_main  # noqa: E402
from mlperf_bert.trainer.model import BertForPreTraining  # noqa: E402
from mlperf_bert.trainer.optimizer import create_optimizer  # noqa: E402

PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}


def synthetic_batch(cfg, b, seq, pred, gen):
    ids = torch.randint(1000, cfg.vocab_size, (b, seq), generator=gen)
    pos = torch.stack([torch.randperm(seq - 1, generator=gen)[:pred] + 1 for _ in range(b)]).sort(1).values
    return {"input_ids": ids, "segment_ids": (torch.arange(seq) >= seq // 2).long().expand(b, seq).clone(),
            "input_mask": torch.ones(b, seq, dtype=torch.long), "masked_lm_positions": pos,
            "masked_lm_ids": torch.randint(1000, cfg.vocab_size, (b, pred), generator=gen),
            "masked_lm_weights": torch.ones(b, pred), "next_sentence_labels": torch.randint(0, 2, (b,),
                                                                                        generator=gen)}


def ours(cfg, device, dtype):
    model = BertForPreTraining(cfg).to(device)
    opt = create_optimizer(model, "lamb", 1e-4, 0.9, 0.999, 1e-6, 0.01)
    acc = GradientAccumulator(model, opt, 1, lambda s: 1e-4)

    def step(batch, i):
        with autocast(device, dtype):
            out = model(**batch)
        out.loss.backward()
        acc.after_backward(i)
    return model, step


def huggingface(cfg, device, dtype):
    import transformers
    hf_cfg = transformers.BertConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads, intermediate_size=cfg.intermediate_size,
        hidden_act="gelu_new", hidden_dropout_prob=cfg.hidden_dropout_prob,
        attention_probs_dropout_prob=cfg.attention_probs_dropout_prob,
        max_position_embeddings=cfg.max_position_embeddings, type_vocab_size=cfg.type_vocab_size,
        initializer_range=cfg.initializer_range, layer_norm_eps=1e-12)
    model = transformers.BertForPreTraining(hf_cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, eps=1e-6, weight_decay=0.01)

    def step(batch, i):
        labels = torch.full_like(batch["input_ids"], -100)
        labels.scatter_(1, batch["masked_lm_positions"], batch["masked_lm_ids"])
        with autocast(device, dtype):
            out = model(input_ids=batch["input_ids"], token_type_ids=batch["segment_ids"],
                        attention_mask=batch["input_mask"], labels=labels,
                        next_sentence_label=batch["next_sentence_labels"])
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return model, step


def autocast(device, dtype):
    import contextlib
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def timed(step, batches, device, steps):
    step(batches[0], 0)  # warm-up
    if device.type == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    for i in range(steps):
        step(batches[i % len(batches)], i + 1)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t


def model_flops_per_seq(cfg, seq, pred, n_params):
    """Training FLOPs per sequence: 6 x (non-embedding params x tokens + attention + MLM head)."""
    h, layers = cfg.hidden_size, cfg.num_hidden_layers
    emb = cfg.vocab_size * h + cfg.max_position_embeddings * h + cfg.type_vocab_size * h
    dense = (n_params - emb) * seq
    attention = 2 * layers * seq * seq * h  # QK^T and AV
    head = pred * cfg.vocab_size * h
    return 6 * (dense + attention + head)


def main(argv):
    fv = flags.FlagValues()
    flags.DEFINE_string("bert_config_file", None, "bert_config.json", flag_values=fv)
    flags.DEFINE_integer("max_seq_length", 128, "sequence length", flag_values=fv)
    flags.DEFINE_integer("max_predictions_per_seq", 20, "masked positions", flag_values=fv)
    flags.DEFINE_integer("train_batch_size", 8, "batch", flag_values=fv)
    flags.DEFINE_integer("steps", 10, "timed steps (after one warm-up step)", flag_values=fv)
    flags.DEFINE_integer("rounds", 3, "alternating rounds (ours, HF) when comparing", flag_values=fv)
    flags.DEFINE_string("input_file", None, "real TFRecords instead of synthetic batches", flag_values=fv)
    flags.DEFINE_enum("dtype", "fp32", ["fp32", "bf16"], "compute dtype", flag_values=fv)
    flags.DEFINE_enum("device", "auto", ["auto", "cpu", "cuda"], "device", flag_values=fv)
    flags.DEFINE_bool("compare", True, "also time Hugging Face when installed", flag_values=fv)
    flags.parse(fv, argv, required=["bert_config_file"])
    cfg = BertConfig.from_json_file(fv.bert_config_file)
    kind = fv.device if fv.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    device, dtype = torch.device(kind), (torch.bfloat16 if fv.dtype == "bf16" else None)
    b, seq, pred = fv.train_batch_size, fv.max_seq_length, fv.max_predictions_per_seq
    if fv.input_file:
        ds = loader.PretrainingBatches(loader.input_files(fv.input_file), seq, pred, b, shuffle=False,
                                     max_batches=4)
        cpu_batches = list(ds)
    else:
        gen = torch.Generator().manual_seed(0)
        cpu_batches = [synthetic_batch(cfg, b, seq, pred, gen) for _ in range(4)]
    batches = [{k: v.to(device) for k, v in x.items()} for x in cpu_batches]
    torch.manual_seed(0)
    model, step = ours(cfg, device, dtype)
    n_params = sum(p.numel() for p in model.parameters())
    contenders = [("ours", step)]
    try:
        if fv.compare:
            contenders.append(("huggingface", huggingface(cfg, device, dtype)[1]))
    except ImportError:
        pass
    times = {name: [] for name, _ in contenders}
    for _ in range(fv.rounds if len(contenders) > 1 else 1):
        for name, fn in contenders:
            times[name].append(timed(fn, batches, device, fv.steps))
    result = {"device": torch.cuda.get_device_name() if kind == "cuda" else "cpu (%d threads)"
              % torch.get_num_threads(), "dtype": fv.dtype, "batch": b, "seq": seq, "params": n_params}
    for name, ts in times.items():
        best = min(ts)
        result["%s_seq_per_s" % name if name != "ours" else "seq_per_s"] = b * fv.steps / best
        print("%-12s %8.2f seq/s  (best of %d rounds of %d steps)" % (name, b * fv.steps / best,
                                                                      len(ts), fv.steps))
    if "huggingface" in times:
        result["ratio_vs_huggingface"] = result["seq_per_s"] / result["huggingface_seq_per_s"]
    if kind == "cuda":
        flops = model_flops_per_seq(cfg, seq, pred, n_params) * result["seq_per_s"]
        result["model_tflops"] = flops / 1e12
        name = torch.cuda.get_device_name()
        peak = next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)
        if peak and fv.dtype == "bf16":
            result["mfu"] = flops / 1e12 / peak
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    run_main(main)
