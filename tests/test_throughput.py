"""Throughput in the log and the progress bar: the rates of each log interval (not averages since
the start), evals and checkpoints set apart, rows/s for packed rows, TFLOP/s and MFU where a GPU's
peak is known; the closed-form FLOPs of a row against torch's FLOP counter on the real model."""
import json
import os
import time

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from mlperf_bert.errors import UserError
from mlperf_bert.trainer import throughput, trainer_flags, training
from mlperf_bert.trainer.config import BertConfig
from mlperf_bert.trainer.run_config import RunConfig
from mlperf_bert.trainer.model import BertForPreTraining
from mlperf_bert.trainer.warmup import synthetic_batch
from test_training import files, flags_for, one_thread  # noqa: F401  (module fixtures)


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_meter_rates_are_those_of_the_interval_less_the_time_set_apart():
    clock = Clock()
    m = throughput.Meter(packed=True, row_flops=2e12, world=4, peak=989.0, clock=clock)
    clock.t += 10.0
    with m.excluded():  # an eval of 5 s inside the interval
        clock.t += 5.0
    got = m.interval(rows=80, sequences=100)
    assert got == pytest.approx({"seq_per_s": 10.0, "rows_per_s": 8.0, "tflops_per_gpu": 4.0, "mfu": 4.0 / 989.0})
    clock.t += 2.0  # the next interval starts where the last ended: its own rate, not the run's
    assert m.interval(rows=80, sequences=80)["seq_per_s"] == pytest.approx(40.0)
    cpu = throughput.Meter(clock=clock)
    clock.t += 4.0
    assert cpu.interval(rows=8, sequences=8) == {"seq_per_s": 2.0}  # no rows_per_s unpacked, no FLOPs on CPU


def test_peak_is_known_for_bf16_on_listed_gpus_only():
    assert throughput.peak_tflops("NVIDIA H100 80GB HBM3", "bf16") == 989.0
    assert throughput.peak_tflops("NVIDIA A100-SXM4-80GB", "bf16") == 312.0
    assert throughput.peak_tflops("NVIDIA H100 80GB HBM3", "fp32") is None
    assert throughput.peak_tflops("Some GPU", "bf16") is None


@pytest.mark.parametrize("name, peak", [
    ("NVIDIA H100 80GB HBM3", 989.0), ("NVIDIA H100 PCIe", 756.0), ("NVIDIA H100 NVL", 835.0),
    ("NVIDIA H200", 989.0), ("NVIDIA H200 NVL", 835.0), ("NVIDIA GH200 480GB", 989.0),
    ("NVIDIA A100 80GB PCIe", 312.0), ("NVIDIA B200", 2250.0),
    ("NVIDIA H100", None), ("NVIDIA H1000", None)])  # which H100 is not said: no guess at the SXM's
def test_peak_is_that_of_the_exact_model(name, peak):
    assert throughput.peak_tflops(name, "bf16") == peak


def test_varlen_attention_is_counted_as_the_kernel_computes_it(monkeypatch):
    """Packed rows on the variable-length kernel (run here by the per-segment reference kernel)
    attend each segment to itself: torch's FLOP counter agrees with ``batch_flops`` (Σ len², the
    padding a segment), not with the dense count, which the dense mask still matches."""
    from mlperf_bert.trainer import attention
    cfg = BertConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=256, max_position_embeddings=128)
    batch = synthetic_batch(cfg, 2, 64, 4, torch.Generator().manual_seed(0), max_sequences=3)
    assert batch["input_mask"].max() == 2 and (batch["input_mask"] == 0).any()  # two sequences and padding
    assert throughput.segment_pairs(batch["input_mask"]).tolist() == [28 ** 2 + 28 ** 2 + 8 ** 2] * 2

    def counted():
        counter = FlopCounterMode(display=False)
        with counter:
            BertForPreTraining(cfg)(**batch).loss.backward()
        return counter.get_total_flops()
    dense = throughput.batch_flops(cfg, batch["input_mask"], 4, varlen=False, pooled=3)
    assert dense == pytest.approx(counted(), rel=1e-3)
    monkeypatch.setattr(attention, "varlen_kernel", lambda device, dtype, head_dim: attention.reference_varlen)
    varlen = throughput.batch_flops(cfg, batch["input_mask"], 4, varlen=True, pooled=3)  # 3 NSP slots a row
    assert varlen == pytest.approx(counted(), rel=1e-3) and varlen < 0.95 * dense


def test_meter_counts_the_flops_of_the_batches_added():
    cfg = BertConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=256, max_position_embeddings=128)
    clock = Clock()
    flops = lambda batch: throughput.batch_flops(cfg, batch["input_mask"], 24, varlen=True)  # noqa: E731
    m = throughput.Meter(packed=True, row_flops=1e30, world=4, peak=100.0, clock=clock, batch_flops=flops)
    batch = synthetic_batch(cfg, 3, 128, 8, torch.Generator().manual_seed(0), max_sequences=3)
    m.add(batch)
    m.add(batch)
    clock.t += 2.0
    got = m.interval(rows=24, sequences=48)  # rows of all ranks; the FLOPs are this rank's own
    assert got["tflops_per_gpu"] == pytest.approx(2 * flops(batch) / 2.0 / 1e12)
    assert got["mfu"] == pytest.approx(got["tflops_per_gpu"] / 100.0)
    clock.t += 1.0
    assert m.interval(rows=24, sequences=48)["tflops_per_gpu"] == 0.0  # the next interval starts from zero


def test_trainer_counts_varlen_attention_where_the_kernel_runs(files, tmp_path, monkeypatch):  # noqa: F811
    from mlperf_bert.trainer import attention
    cfg = BertConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=256, max_position_embeddings=128)
    fv = trainer_flags.define_flags()
    fv(["x", "--bert_config_file=unused", "--input_file=unused", "--output_dir=unused", "--max_seq_length=128",
        "--dtype=bf16"])
    trainer = training.Trainer(RunConfig.from_flags(fv), cfg, torch.device("cpu"), 0, 1, seed=0)
    assert trainer.batch_flops(24) is None  # a CPU has no varlen kernel: the dense count is right
    monkeypatch.setattr(attention, "varlen_kernel", lambda device, dtype, head_dim: attention.reference_varlen)
    batch = synthetic_batch(cfg, 3, 128, 8, torch.Generator().manual_seed(0), max_sequences=3)
    assert trainer.batch_flops(24)(batch) == throughput.batch_flops(cfg, batch["input_mask"], 24, varlen=True,
                                                                    pooled=3)


def test_progress_bar_shows_the_rates():
    out = training._postfix(7.5, 1e-4, {"seq_per_s": 297.2, "rows_per_s": 226.0, "tflops_per_gpu": 372.4,
                                        "mfu": 0.3765})
    assert out == {"loss": "7.5000", "lr": "0.0001", "seq/s": "297.2", "rows/s": "226.0", "TFLOP/s": "372",
                   "MFU": "37.6%"}
    assert training._postfix(7.5, 1e-4, {"seq_per_s": 3.0}) == {"loss": "7.5000", "lr": "0.0001", "seq/s": "3.0"}


@pytest.mark.parametrize("seq, pred", [(128, 20), (64, 5)])
def test_flops_of_a_row_are_those_torch_counts(seq, pred):
    cfg = BertConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=256, max_position_embeddings=128)
    model = BertForPreTraining(cfg)
    batch = synthetic_batch(cfg, 3, seq, pred, torch.Generator().manual_seed(0))
    counter = FlopCounterMode(display=False)
    with counter:
        model(**batch).loss.backward()
    # what the count leaves out (the NSP head's 2 x h outputs) is under 0.1%
    assert throughput.flops_per_row(cfg, seq, pred) * 3 == pytest.approx(counter.get_total_flops(), rel=1e-3)


def _train_loss(path):
    recs = [json.loads(line.split(":::MLLOG ", 1)[1]) for line in open(path) if ":::MLLOG " in line]
    return [r for r in recs if r["key"] == "train_loss"]


def test_logged_rate_is_the_last_intervals(files, tmp_path, monkeypatch):  # noqa: F811
    """A slow second interval shows in its own line only: the third is fast again (an average since
    the start would stay low), and each line's rate is its samples over its time in the log."""
    real_step = training.Trainer.step
    started = {}

    def step(self, batch, global_step):
        started.setdefault(global_step, time.perf_counter())
        time.sleep(0.03)  # each interval a floor of 0.24 s: a load's hiccups stay small beside it
        if 8 <= global_step < 16:  # the second interval: 4x as long as the first took (a fixed
            # sleep long enough on a loaded machine would be most of this test's time)
            time.sleep(3 * (started[8] - started[0]) / 8)
        return real_step(self, batch, global_step)
    monkeypatch.setattr(training.Trainer, "step", step)
    out = str(tmp_path / "run")
    assert training.main(flags_for(files, out, num_train_steps=24, log_frequency=8, save_checkpoints_steps=100,
                                   num_workers=0, progress=True)) == 0
    lines = _train_loss(os.path.join(out, "mlperf.log"))
    rates = [r["metadata"]["seq_per_s"] for r in lines]
    assert len(rates) == 3 and rates[1] < rates[0] / 2 and rates[2] > rates[1] * 2, rates
    for a, b in zip(lines, lines[1:]):
        seconds = (b["time_ms"] - a["time_ms"]) / 1000
        samples = b["metadata"]["samples_count"] - a["metadata"]["samples_count"]
        assert b["metadata"]["seq_per_s"] == pytest.approx(samples / seconds, rel=0.1)
    assert all(set(r["metadata"]) >= {"seq_per_s", "step", "learning_rate"} and "rows_per_s" not in r["metadata"]
               for r in lines)


def test_train_throughput_reports_tflops_mfu_and_peak_memory_on_cuda(tmp_path, monkeypatch, capsys):
    """Issue 36.1: on every CUDA run the bench replaced its peak-memory dict by the peak TFLOP/s and
    died in its report. The CUDA report runs here on this CPU with CUDA's answers stood in."""
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
    import train_throughput

    class FakeCuda(train_throughput.Cuda):
        resets, asked = [], []

        def __init__(self, device):
            super().__init__(device)
            self.on = True

        def name(self):
            return "NVIDIA H100 PCIe"

        def reset_peak(self):
            self.resets.append(1)

        def peak_bytes(self):
            self.asked.append(1)
            return len(self.asked) * 2 ** 30  # 1, 2 GiB in the first round, 3, 4 in the second
    monkeypatch.setattr(train_throughput, "Cuda", FakeCuda)
    cfg = {"vocab_size": 1000, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
           "intermediate_size": 64, "max_position_embeddings": 64, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
           "attention_probs_dropout_prob": 0.1, "type_vocab_size": 2, "initializer_range": 0.02}
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    assert train_throughput.main(["x", "--bert_config_file=%s" % (tmp_path / "c.json"), "--max_seq_length=64",
                                  "--max_predictions_per_seq=4", "--train_batch_size=2", "--steps=2", "--rounds=2",
                                  "--dtype=bf16", "--device=cpu", "--levers=fused_qkv", "--nocompare"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    row = throughput.flops_per_row(BertConfig.from_dict(cfg), 64, 4)
    assert res["device"] == "NVIDIA H100 PCIe" and FakeCuda.resets
    for key, most in (("", 3.0), ("trainer+fused_qkv_", 4.0)):
        assert res[key + "model_tflops"] == pytest.approx(row * res[key + "seq_per_s"] / 1e12)
        assert res[key + "mfu"] == pytest.approx(res[key + "model_tflops"] / 756.0)  # the PCIe card's peak
        assert res[key + "peak_memory_gib"] == most  # the most of its rounds


def test_train_throughput_counts_the_real_sequences_of_the_batches_it_timed(tmp_path, monkeypatch, capsys):
    """The bench timed steps on batches 0, 1, ... but counted the real sequences of batches
    warmup, warmup + 1, ...: with packed batches of different sequence counts, real sequences/s
    was that of other batches (steps=1: batch 1's count over batch 0's time)."""
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
    import train_throughput
    cfg_d = {"vocab_size": 1000, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
             "intermediate_size": 64, "max_position_embeddings": 64, "hidden_act": "gelu",
             "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1, "type_vocab_size": 2,
             "initializer_range": 0.02}
    (tmp_path / "c.json").write_text(json.dumps(cfg_d))
    (tmp_path / "in.tfrecord").write_bytes(b"")
    cfg = BertConfig.from_dict(cfg_d)
    gen = torch.Generator().manual_seed(0)
    batches = [dict(synthetic_batch(cfg, 2, 64, 4, gen), global_sequences=torch.tensor(n)) for n in (1, 4, 2, 3)]
    # (the bench pops each batch's global_sequences: a fresh dict each run)
    monkeypatch.setattr(train_throughput, "packed_batches", lambda *a: [dict(b) for b in batches])
    timed_batches = []
    real_ours = train_throughput.ours

    def ours(*a, **k):
        model, step = real_ours(*a, **k)

        def recording(batch, i):
            timed_batches.append(next(j for j, b in enumerate(batches) if torch.equal(b["input_ids"],
                                                                                    batch["input_ids"].cpu())))
            return step(batch, i)
        return model, recording
    monkeypatch.setattr(train_throughput, "ours", ours)
    for steps in (1, 2, 3):
        timed_batches.clear()
        assert train_throughput.main(["x", "--bert_config_file=%s" % (tmp_path / "c.json"), "--max_seq_length=64",
                                      "--max_predictions_per_seq=4", "--train_batch_size=2", "--steps=%d" % steps,
                                      "--rounds=1", "--device=cpu", "--input_file=%s" % (tmp_path / "in.tfrecord"),
                                      "--packed", "--nocompare"]) == 0
        res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        real = sum((1, 4, 2, 3)[j] for j in timed_batches[1:])  # after the one warm-up step
        assert res["real_seq_per_s"] / res["seq_per_s"] == pytest.approx(real / (2 * steps)), (steps, timed_batches)


@pytest.mark.parametrize("flag", ["--steps=0", "--train_batch_size=0", "--rounds=0", "--max_seq_length=0"])
def test_train_throughput_refuses_a_size_below_one_in_one_line(flag):
    """A sweep of the benches: --steps=0 printed 0.00 seq/s and its JSON as a result (exit 0), and
    --train_batch_size=0 ended in torch's traceback."""
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
    import train_throughput
    with pytest.raises(UserError, match="^%s: give 1 or more$" % flag):
        train_throughput.main(["x", "--bert_config_file=unread.json", "--device=cpu", flag])
