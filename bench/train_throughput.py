"""Sequences/s of the trainer's full step (forward, backward, clip by global norm, LAMB update).

Usage: .venv/bin/python bench/train_throughput.py --bert_config_file=CONFIG --max_seq_length=128
         --max_predictions_per_seq=20 --train_batch_size=8 --steps=10 [--dtype=bf16] [--device=cuda]
         [--input_file=TFRECORDS [--packed | --compare_packed]] [--compile | --compare_compile]
--levers=LIST (comma-separated: fused_update, fused_qkv, fp8, cuda_graphs; or all) times the
trainer's own step (training.Trainer, at this --dtype and --compile) plain and with each lever
(trainer/levers.py), then with all those this device and dtype take, in alternation, and prints
each one's ratio to the plain step; a lever refused is skipped with its one-line reason.
Without --input_file the batches are synthetic (random ids, masked positions and labels).
--packed packs the input itself (the ``pack`` command's code, to a temporary directory) and
times steps of --train_batch_size packed rows; --compare_packed times unpacked and packed in
alternation. --compile times the torch.compile'd model; --compare_compile eager and compiled
in alternation. When ``transformers`` is installed, Hugging Face ``BertForPreTraining`` with the
same config and batch (labels at the same masked positions; clip, then torch AdamW) is timed
in alternation with ours (unpacked, eager), and the ratio printed.
The last line is JSON: ``seq_per_s`` (rows or records per second of the first timed variant)
and ``real_seq_per_s`` (real sequences per second, packed or not) per variant; on CUDA also
model FLOP utilisation (mlperf_bert/trainer/throughput.py's count of the rows computed) and
peak memory.
"""
import itertools
import json
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from mlperf_bert.trainer import flag_checks, loader, trainer_flags, training  # noqa: E402
from mlperf_bert import flags
from mlperf_bert.trainer.accumulation import GradientAccumulator  # noqa: E402
from mlperf_bert.trainer.config import BertConfig  # noqa: E402
from mlperf_bert.cli import run_main  # noqa: E402
from mlperf_bert.errors import UserError  # noqa: E402
from mlperf_bert.trainer.model import BertForPreTraining  # noqa: E402
from mlperf_bert.trainer.optimizer import create_optimizer  # noqa: E402
from mlperf_bert.trainer import attention  # noqa: E402
from mlperf_bert.trainer.throughput import batch_flops, peak_tflops  # noqa: E402
from mlperf_bert.trainer.warmup import synthetic_batch  # noqa: E402


def ours(cfg, device, autocast, compile=False):
    torch.manual_seed(0)
    model = BertForPreTraining(cfg).to(device)
    opt = create_optimizer(model, "lamb", 1e-4, 0.9, 0.999, 1e-6, 0.01)
    acc = GradientAccumulator(model, opt, 1, lambda s: 1e-4)
    if compile:
        attention.trace_as_constants()
    forward = torch.compile(model) if compile else model

    def step(batch, i):
        with autocast():
            out = forward(**batch)
        out.loss.backward()
        acc.after_backward(i)
    return model, step


from mlperf_bert.trainer.trainer_flags import LEVERS  # noqa: E402  (the flag names of the speed levers)
from mlperf_bert.trainer.run_config import RunConfig  # noqa: E402


def trainer_step(config_file, cfg, device, dtype, compile, levers):
    """The trainer's step (training.Trainer) with the flags --``levers``; UserError if refused."""
    fv = trainer_flags.define_flags()
    flags.parse(fv, ["train_throughput", "--bert_config_file=" + config_file, "--input_file=unused",
                     "--output_dir=unused", "--do_train", "--optimizer=lamb", "--learning_rate=1e-4",
                     "--dtype=" + dtype, "--%scompile" % ("" if compile else "no")] + ["--" + x for x in levers],
                required=[])
    run_cfg = RunConfig.from_flags(fv)
    flag_checks.check_flags(run_cfg)
    trainer = training.Trainer(run_cfg, cfg, device, 0, 1, seed=0)
    return trainer.model, lambda batch, i: trainer.step(batch, i)


def packed_batches(files, seq, pred, rows, n):
    """The first ``n`` batches of ``rows`` packed rows made from ``files`` by the pack command's code."""
    from mlperf_bert.dataset.packing import pack_file
    from mlperf_bert.trainer.packed_loader import PackedBatches
    tmp = tempfile.mkdtemp(prefix="packed-bench-")
    outs = []
    for f in files:
        outs.append(os.path.join(tmp, os.path.basename(f) + ".packed.hdf5"))
        pack_file(f, outs[-1], seq, pred, 3, 12345)
    batches = list(itertools.islice(PackedBatches(outs, rows, shuffle=False, repeat=False), n))
    for out in outs:
        os.remove(out)
    os.rmdir(tmp)
    return batches


def huggingface(cfg, device, autocast):
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
        with autocast():
            out = model(input_ids=batch["input_ids"], token_type_ids=batch["segment_ids"],
                        attention_mask=batch["input_mask"], labels=labels,
                        next_sentence_label=batch["next_sentence_labels"])
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return model, step


class Cuda:
    """What the bench asks of CUDA, in one place (the tests stand in for it on a CPU); ``on``
    False on other devices, where none of it is asked."""

    def __init__(self, device):
        self.device, self.on = device, device.type == "cuda"

    def name(self):
        return torch.cuda.get_device_name(self.device)

    def reset_peak(self):
        torch.cuda.reset_peak_memory_stats(self.device)

    def peak_bytes(self):
        return torch.cuda.max_memory_allocated(self.device)

    def sync(self):
        torch.cuda.synchronize(self.device)


def timed(step, batches, device, steps, warmup=1):
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for i in range(warmup):  # the compiled model compiles here
        step(batches[i % len(batches)], i)
    sync()
    t = time.perf_counter()
    for i in range(warmup, warmup + steps):  # step i on batch i, as the report counts them
        step(batches[i % len(batches)], i)
    sync()
    return time.perf_counter() - t


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
    flags.DEFINE_bool("packed", False, "pack --input_file and time packed rows", flag_values=fv)
    flags.DEFINE_bool("compare_packed", False, "time unpacked and packed (--input_file) side by side",
                      flag_values=fv)
    flags.DEFINE_bool("compile", False, "time the torch.compile'd model", flag_values=fv)
    flags.DEFINE_bool("compare_compile", False, "time eager and compiled side by side", flag_values=fv)
    flags.DEFINE_list("levers", [], "time the trainer's step plain and with each of these levers (%s, or all)"
                      % ", ".join(LEVERS), flag_values=fv)
    flags.parse(fv, argv, required=["bert_config_file"])
    for name in ("max_seq_length", "max_predictions_per_seq", "train_batch_size", "steps", "rounds"):
        if fv[name].value < 1:  # (--steps=0 printed 0.00 seq/s as a result; a batch of 0 was a traceback)
            raise UserError("--%s=%d: give 1 or more" % (name, fv[name].value))
    levers = list(LEVERS) if fv.levers == ["all"] else fv.levers
    if set(levers) - set(LEVERS):
        raise UserError("--levers: unknown %s; choose from %s, or all"
                        % (", ".join(sorted(set(levers) - set(LEVERS))), ", ".join(LEVERS)))
    if levers and (fv.compare_compile or fv.compare_packed):  # it timed one mode on one input, silently
        raise UserError("--levers times the trainer's step at --compile on one input: drop --compare_compile and "
                        "--compare_packed (use --compile or --packed)")
    if (fv.packed or fv.compare_packed) and not fv.input_file:
        raise UserError("--packed and --compare_packed need --input_file=TFRECORDS (real sequences to pack)")
    cfg = BertConfig.from_json_file(fv.bert_config_file, fv.max_seq_length)
    kind = fv.device if fv.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if kind == "cuda" and not torch.cuda.is_available():  # torch's AssertionError traceback, else
        raise UserError("--device=cuda, but this host has no CUDA GPU: run it on a GPU machine, or drop --device")
    device = torch.device(kind)
    gpu = Cuda(device)
    autocast = training.autocast(device, fv.dtype)
    b, seq, pred = fv.train_batch_size, fv.max_seq_length, fv.max_predictions_per_seq
    inputs = {}  # name -> (batches on the device, real sequences per batch, FLOPs per batch)
    if fv.input_file:
        files = loader.input_files(fv.input_file, "--input_file")
        if not fv.packed or fv.compare_packed:
            inputs["unpacked"] = list(loader.PretrainingBatches(files, seq, pred, b, shuffle=False, max_batches=4))
        if fv.packed or fv.compare_packed:
            inputs["packed"] = packed_batches(files, seq, pred, b, 4)
    else:
        gen = torch.Generator().manual_seed(0)
        inputs["unpacked"] = [synthetic_batch(cfg, b, seq, pred, gen) for _ in range(4)]
    # packed rows on the variable-length kernel compute each sequence's attention alone
    varlen = attention.varlen_kernel(device, torch.bfloat16 if fv.dtype == "bf16" else torch.float32,
                                     cfg.hidden_size // cfg.num_attention_heads) is not None
    for name, cpu_batches in inputs.items():
        counts = [int(x.pop("global_sequences", b)) for x in cpu_batches]
        flops = [batch_flops(cfg, x["input_mask"], x["masked_lm_positions"].shape[1], varlen and name == "packed",
                             x["nsp_positions"].shape[1] if "nsp_positions" in x else 1) for x in cpu_batches]
        inputs[name] = ([{k: v.to(device) for k, v in x.items()} for x in cpu_batches], counts, flops)
    modes = [False, True] if fv.compare_compile else [fv.compile]
    contenders = []  # (name, step, input)
    if levers:  # the trainer's step, plain and with each lever, on the first input
        first = next(iter(inputs))
        accepted = []
        for on in [[]] + [[x] for x in levers] + [None]:
            if on is None:  # all the levers this device and dtype took, together
                if len(accepted) < 2:
                    break
                on = accepted
            name = "trainer" + "".join("+" + x for x in on) if len(on) < 2 else "trainer+all"
            try:
                model, step = trainer_step(fv.bert_config_file, cfg, device, fv.dtype, fv.compile, on)
            except UserError as e:
                print("%-22s skipped: %s" % (name, e))
                continue
            accepted += on if len(on) == 1 else []
            contenders.append((name, step, first))
    else:
        for compiled in modes:
            model, step = ours(cfg, device, autocast, compiled)
            for name in inputs:
                contenders.append(("ours" + ("_compiled" if compiled else "") + ("_packed" if name == "packed" else ""),
                                   step, name))
    n_params = sum(p.numel() for p in model.parameters())
    try:
        if fv.compare and "unpacked" in inputs and not levers:
            contenders.append(("huggingface", huggingface(cfg, device, autocast)[1], "unpacked"))
    except ImportError:
        pass
    times = {name: [] for name, _, _ in contenders}
    warmups = {}
    peak_bytes = {}  # peak memory per variant
    for _ in range(fv.rounds if len(contenders) > 1 else 1):
        for name, fn, inp in contenders:
            if gpu.on:
                gpu.reset_peak()
            compiling = "compiled" in name or (levers and (fv.compile or "fused_update" in name or name.endswith("all")))
            warmups[name] = 2 if compiling else 1
            times[name].append(timed(fn, inputs[inp][0], device, fv.steps, warmup=warmups[name]))
            if gpu.on:
                peak_bytes[name] = max(peak_bytes.get(name, 0), gpu.peak_bytes())
    result = {"device": gpu.name() if gpu.on else "cpu (%d threads)" % torch.get_num_threads(), "dtype": fv.dtype,
              "batch": b, "seq": seq, "params": n_params, "steps": fv.steps,
              "rounds": len(times[contenders[0][0]])}
    peak = peak_tflops(gpu.name() if gpu.on else "", fv.dtype)  # the GPU's peak TFLOP/s
    for name, _, inp in contenders:
        best = min(times[name])
        _, counts, flops = inputs[inp]
        timed_steps = range(warmups[name], warmups[name] + fv.steps)  # the batches of the timed steps
        real = sum(counts[i % len(counts)] for i in timed_steps) / best
        rows = b * fv.steps / best
        key = "" if name == contenders[0][0] else name + "_"
        result[key + "seq_per_s"] = rows
        result[key + "real_seq_per_s"] = real
        print("%-22s %8.2f %s/s, %8.2f real sequences/s  (best of %d rounds of %d steps)"
              % (name, rows, "row" if inp == "packed" else "seq", real, len(times[name]), fv.steps))
        if gpu.on:
            # the work of the rows computed, padding included, the attention as its kernel does it
            tflops = sum(flops[i % len(flops)] for i in timed_steps) / best / 1e12
            result[key + "model_tflops"] = tflops
            if peak:
                result[key + "mfu"] = tflops / peak
            result[key + "peak_memory_gib"] = peak_bytes[name] / 2 ** 30
    first = contenders[0][0]
    for name, _, _ in contenders[1:]:
        ratio = result[name + "_real_seq_per_s"] / result["real_seq_per_s"]
        result["ratio_%s_vs_%s" % (name, first)] = ratio
        print("%s / %s: %.3fx real sequences per second" % (name, first, ratio))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    run_main(main)
