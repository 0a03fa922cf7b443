"""What the opt-in checks (`make container-test`, `make slurm-test`, `make stop-stress`) share: their
steps, each named, timed and printed as it starts and ends, with a table at the end; the tiny
model on the reference's s128 records they train; the bit-for-bit comparison of checkpoints."""
import gzip
import json
import os
import shutil
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The tiny model of tests/test_training.py (TINY) on the reference's s128 records.
TINY = {"vocab_size": 30522, "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
        "intermediate_size": 32, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1, "max_position_embeddings": 128, "type_vocab_size": 2,
        "initializer_range": 0.02}

times = []  # (step, seconds), in the order they ran


class Failed(Exception):
    pass


def step(name):
    def wrap(fn):
        def run(*args):
            print("\n== %s" % name, flush=True)
            t = time.time()
            try:
                return fn(*args)
            finally:
                times.append((name, time.time() - t))
                print("== %s: %.0f s" % (name, time.time() - t), flush=True)
        return run
    return wrap


def report(t0, width):
    """Each step's seconds, the total since ``t0`` and the load average."""
    print("\n%-*s %8s" % (width, "step", "seconds"))
    for name, seconds in times:
        print("%-*s %8.0f" % (width, name, seconds))
    print("%-*s %8.0f" % (width, "total", time.time() - t0))
    with open("/proc/loadavg") as f:
        print("load average at the end: %s (%d cores)" % (" ".join(f.read().split()[:3]), os.cpu_count()))


def tiny_data(train, eval_file, config, eval_records=40):
    """The first 96 records of tests/data's golden s128 shard to ``train``, ``eval_records`` from
    record 4000 on to ``eval_file``, TINY to ``config``."""
    from mlperf_bert.dataset import tfrecord
    plain = train + ".golden"
    with gzip.open(os.path.join(ROOT, "tests", "data", "golden", "part-00000.s128.tfrecord.gz"), "rb") as f, \
            open(plain, "wb") as out:
        shutil.copyfileobj(f, out)
    recs = list(tfrecord.read_records(plain))
    os.remove(plain)
    tfrecord.write_records(train, recs[:96])
    tfrecord.write_records(eval_file, recs[4000:4000 + eval_records])
    with open(config, "w") as f:
        json.dump(TINY, f)


def differing_parts(a_path, b_path):
    """The parts of two checkpoints ("model", "optimizer") that are not the same bit for bit."""
    import torch
    a, b = (torch.load(p, map_location="cpu", weights_only=False) for p in (a_path, b_path))
    return [part for part in ("model", "optimizer") if not _equal(a[part], b[part])]


def _equal(a, b):
    import torch
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return a == b
