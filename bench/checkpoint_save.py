"""What a checkpoint costs: the seconds one BERT-Large save takes, or (--train) what checkpoints
cost a timed BERT-Large run per update, each way of writing them side by side in one process.

    .venv/bin/python bench/checkpoint_save.py [--dir=DIR] [--repeats=3] [--ranks=8]
    flock /tmp/heavy.lock .venv/bin/python bench/checkpoint_save.py --train [--dir=DIR] [--updates=6]
        [--every=2] [--rounds=1] [--batch=1] [--seq=128]

DIR is where a run's --output_dir would be (the disk is what is measured). The state is the one the
trainer writes at an update boundary: model, LAMB moments, each of ``--ranks`` ranks' RNG state and
empty accumulator (4.04 GB for BERT-Large).

Without --train: each save as the trainer's writer does it (checkpoint.save: torch.save to a
temporary name, fsync, rename), its seconds and MB/s. Needs about 6 GB of memory.

--train: ``--updates`` LAMB updates of BERT-Large (fp32, batch ``--batch`` at seq ``--seq``, random
tokens, on this CPU) in each of four modes, run one after the other, ``--rounds`` times:
  none   no checkpoint (the baseline);
  sync   a checkpoint every ``--every`` updates and at the end, written on the training path (the
         trainer before issue 31);
  async  the same checkpoints, the state copied to host memory and written by the trainer's
         background writer (checkpoint.host_copy, BackgroundWriter: the trainer now); the last one
         is handed over without a copy and waited for after the last update, as the trainer does
         after run_stop;
  end    only the last checkpoint (--save_checkpoints_steps=0), after the last update.
For each: the seconds of the timed part (first update to the end of the last, what MLPerf's clock
sees) per update, the seconds the training path stood still per periodic checkpoint (sync: the
write; async: the copy and any wait for the write before), what each checkpoint added to the timed
part against none (the stops and, async, the writer's use of the cores), that per update at one
checkpoint per 100 updates (the rcp presets' interval before issue 31), and the seconds after the
clock (waiting for the last write). Needs about 11 GB of
memory (model, gradients, LAMB moments and one host copy).
"""
import os
import sys
import tempfile
import time
from _data import OneLineParser, count, doc  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

from mlperf_bert.trainer import checkpoint, optimizer  # noqa: E402
from mlperf_bert.trainer.config import BertConfig  # noqa: E402
from mlperf_bert.trainer.model import BertForPreTraining  # noqa: E402

RCP_INTERVAL = 100  # updates between checkpoints in the rcp presets (harness/rcp.py)


def ranks_state(n):
    rank = {"rng": checkpoint.rng_state(torch.device("cpu")),
            "accumulator": {"steps_per_update": 1, "pending": 0, "buffers": None, "clip_after_reduce": False}}
    return [rank] * n


def save_only(args, config):
    model = BertForPreTraining(config)
    opt = optimizer.create_optimizer(model, "lamb")
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()  # creates the moments, as the first update of a run does
    model.zero_grad(set_to_none=True)
    params = sum(p.numel() for p in model.parameters())
    state = {"global_step": 1000, "samples": 1000, "next_eval": 0, "evals": [], "model": model.state_dict(),
             "optimizer": opt.state_dict(), "ranks": ranks_state(args.ranks), "world_size": args.ranks}
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="checkpoint_save.") as d:
        print("%s: %d parameters (%.2f GB fp32) + LAMB moments; writing to %s"
              % (os.path.basename(args.config), params, params * 4 / 1e9, d))
        for r in range(args.repeats):
            path = checkpoint.path_for(d, r)
            t = time.time()
            checkpoint.save(path, state, keep=1)
            seconds = time.time() - t
            size = os.path.getsize(path)
            print("save %d: %.2f GB in %.1f s (%.0f MB/s)" % (r, size / 1e9, seconds, size / 1e6 / seconds),
                  flush=True)


def batch_of(config, batch, seq, gen):
    preds = max(1, round(seq * 0.15))
    return {"input_ids": torch.randint(1000, config.vocab_size, (batch, seq), generator=gen),
            "segment_ids": torch.zeros(batch, seq, dtype=torch.long),
            "input_mask": torch.ones(batch, seq, dtype=torch.long),
            "masked_lm_positions": torch.randint(1, seq, (batch, preds), generator=gen),
            "masked_lm_ids": torch.randint(1000, config.vocab_size, (batch, preds), generator=gen),
            "masked_lm_weights": torch.ones(batch, preds),
            "next_sentence_labels": torch.zeros(batch, dtype=torch.long)}


def run_mode(mode, model, opt, batches, args, d):
    """-> (timed seconds, [stall seconds per checkpoint], seconds after the clock)."""
    writer = checkpoint.BackgroundWriter()
    stalls = []

    def save(step, final):
        state = {"global_step": step, "samples": step, "next_eval": 0, "evals": [], "model": model.state_dict(),
                 "optimizer": opt.state_dict(), "ranks": ranks_state(args.ranks), "world_size": args.ranks}
        path = checkpoint.path_for(d, step)
        t = time.perf_counter()
        if mode == "sync":
            checkpoint.save(path, state, keep=1)
        else:
            writer.wait()
            writer.submit(path, state if final else checkpoint.host_copy(state), keep=1)
        stalls.append(time.perf_counter() - t)

    t0 = time.perf_counter()
    for u in range(1, args.updates + 1):
        out = model(**batches[u % len(batches)])
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        last = u == args.updates
        if mode in ("sync", "async") and (u % args.every == 0 or last):
            save(u, final=last)
        elif mode == "end" and last:
            save(u, final=True)
    timed = time.perf_counter() - t0
    t = time.perf_counter()
    writer.wait()
    return timed, stalls, time.perf_counter() - t


def train_compare(args, config):
    torch.manual_seed(0)
    model = BertForPreTraining(config)
    opt = optimizer.create_optimizer(model, "lamb")
    gen = torch.Generator().manual_seed(0)
    batches = [batch_of(config, args.batch, args.seq, gen) for _ in range(2)]
    params = sum(p.numel() for p in model.parameters())
    modes = ["none", "sync", "async", "end"]
    results = {m: [] for m in modes}
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="checkpoint_save.") as d:
        print("%s (%d parameters), fp32 on %d CPU threads, batch %d x seq %d, LAMB; %d updates per mode, a "
              "checkpoint every %d; writing to %s" % (os.path.basename(args.config), params, torch.get_num_threads(),
                                                      args.batch, args.seq, args.updates, args.every, d), flush=True)
        run_mode("none", model, opt, batches, args, d)  # warm-up: the moments exist, as after a run's first update
        for r in range(args.rounds):
            for mode in modes:
                timed, stalls, after = run_mode(mode, model, opt, batches, args, d)
                results[mode].append((timed, stalls, after))
                print("round %d %-5s: timed %.1f s (%.2f s/update), %d checkpoint(s) stalled the training path %s s, "
                      "%.1f s after the clock" % (r, mode, timed, timed / args.updates, len(stalls),
                                                 "/".join("%.1f" % s for s in stalls) or "0", after), flush=True)
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    base = sum(t for t, _, _ in results["none"]) / len(results["none"])
    print("\n| mode | timed s per update | vs none | training path stopped s per periodic checkpoint | clock s per "
          "checkpoint | per update at 1 checkpoint per %d updates | s after the clock |" % RCP_INTERVAL)
    print("|---|---:|---:|---:|---:|---:|---:|")
    for mode in modes:
        timed = sum(t for t, _, _ in results[mode]) / len(results[mode])
        periodic = [s for _, st, _ in results[mode] for s in st[:-1]]  # the last one: see "after"
        made = sum(len(st) for _, st, _ in results[mode]) / len(results[mode])
        # what the checkpoints added to the timed part (stops, and a writer's use of the cores), each
        clock = (timed - base) / made if made else 0.0
        after = sum(a for _, _, a in results[mode]) / len(results[mode])
        print("| %s | %.2f | %+.2f | %s | %s | %s | %.1f |" % (
            mode, timed / args.updates, (timed - base) / args.updates,
            "%.2f" % (sum(periodic) / len(periodic)) if periodic else "-",
            "%.1f" % clock if made else "-", "%.3f" % (clock / RCP_INTERVAL) if made else "-", after))
    print("(clock s per checkpoint: (timed - none's timed) / checkpoints made in the timed part)")
    print("load average: %s (%d cores)" % (load, os.cpu_count()))


def main(argv):
    ap = OneLineParser(description=doc(__file__).splitlines()[0])
    ap.add_argument("--dir", default=None, help="where to write (default: a temporary folder in /tmp)")
    ap.add_argument("--repeats", type=count, default=3, help="saves (without --train)")
    ap.add_argument("--ranks", type=count, default=8, help="ranks whose RNG state the checkpoint holds")
    ap.add_argument("--train", action="store_true", help="the side-by-side run comparison")
    ap.add_argument("--updates", type=count, default=6, help="--train: LAMB updates of each mode")
    ap.add_argument("--every", type=count, default=2, help="--train: updates between periodic checkpoints")
    ap.add_argument("--rounds", type=count, default=1, help="--train: times the four modes are run")
    ap.add_argument("--batch", type=count, default=1, help="--train: sequences a batch")
    ap.add_argument("--seq", type=count, default=128, help="--train: sequence length")
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "bert_config_large.json"),
                    help="bert_config.json (default BERT-Large)")
    args = ap.parse_args(argv[1:])
    if args.dir and not (os.path.isdir(args.dir) and os.access(args.dir, os.W_OK | os.X_OK)):
        ap.error("--dir=%s is not a folder this user can write: make it, or give another" % args.dir)
    config = BertConfig.from_json_file(args.config)
    if args.train:
        train_compare(args, config)
    else:
        save_only(args, config)
        with open("/proc/loadavg") as f:
            print("load average: %s (%d cores)" % (" ".join(f.read().split()[:3]), os.cpu_count()))


if __name__ == "__main__":
    from mlperf_bert.cli import run_main  # a UserError (an unreadable --config) is one line
    run_main(main)
