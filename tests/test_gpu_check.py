"""bench/gpu_check.py, the one GPU check, run end to end on this CPU with a tiny BERT, so it cannot rot."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = {"vocab_size": 30522, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
        "intermediate_size": 64, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1, "max_position_embeddings": 512, "type_vocab_size": 2,
        "initializer_range": 0.02}


@pytest.mark.slow
def test_gpu_check_runs_end_to_end_and_writes_its_table_and_json(golden_s512, tmp_path):
    config = tmp_path / "tiny.json"
    config.write_text(json.dumps(TINY))
    out = tmp_path / "check.json"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "gpu_check.py"), "--bert_config_file=%s" % config,
                           "--input_file=" + golden_s512, "--records=200", "--batches=2,4", "--compile_batches=2",
                           "--compile_backend=aot_eager", "--hf_batch=2", "--eval_batches=1,2", "--eval_samples=4",
                           "--steps=2", "--json=%s" % out], capture_output=True, text=True, cwd=str(tmp_path),
                          env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    for what in ("| packed vs unpacked, fp32", "| packed vs unpacked, bf16", "| Trainer.step eager, packed, batch 2 |",
                 "| Trainer.step eager, packed, batch 4 |", "| Trainer.step --compile, packed, batch 2 |",
                 "| Hugging Face BertForPreTraining", "| eval, s per 10,000 samples", "| host syncs per micro-step",
                 "| projected time to train, 8 GPUs |", "| projected time to train, 64 GPUs |"):
        assert what in proc.stdout and what in res["table"], what
    assert res["records"] == 200 and 1.2 < res["packing_rate"] < 1.5  # golden s512 rows hold ~1.3 sequences
    # packed rows compute what unpacked ones do (the dense mask on a CPU)
    assert max(res["packed_vs_unpacked"]["fp32"].values()) < 1e-5
    assert max(res["packed_vs_unpacked"]["bf16"].values()) < 3e-2
    for r in res["eager_steps"]:
        assert r["rows_per_s"] > 0 and r["real_seq_per_s"] > r["rows_per_s"] and r["plan_gib"] > 0
        assert r["peak_gib"] is None and r["mfu"] is None  # a CPU has neither
    assert [r["batch"] for r in res["eager_steps"]] == [2, 4]
    assert res["eager_steps"][1]["plan_gib"] > res["eager_steps"][0]["plan_gib"]
    cold, warm = res["compiled"]
    assert cold[0]["compile_s"] > 0 and warm[0]["compile_s"] > 0 and warm[0]["rows_per_s"] > 0
    # the trainer's micro-step reads nothing back to the host
    assert res["host_syncs"] == {"count": 0, "steps": 2, "per_step": 0.0, "how": "Tensor read-backs (CPU)"}
    assert set(res["eval_s_per_10k"]) == {"1", "2"} and all(v > 0 for v in res["eval_s_per_10k"].values())
    hf = res["huggingface"]
    assert hf.get("note") == "skipped: transformers is not installed" or hf["seq_per_s"] > 0
    from mlperf_bert.harness import rcp
    samples = rcp.samples_to_converge()
    for gpus in ("8", "64"):
        p = res["projection"][gpus]
        assert p["global_batch"] in samples and p["samples"] == samples[p["global_batch"]]
        assert p["global_batch"] == int(gpus) * p["per_gpu_batch"] * p["accumulation"]
        assert p["train_s"] == pytest.approx(p["samples"] / (int(gpus) * p["real_seq_per_s_per_gpu"]))
        assert p["total_s"] == pytest.approx(p["train_s"] + p["eval_s"]) and p["startup_s"] == warm[0]["compile_s"]


def test_without_mlperf_logging_it_says_what_to_install(tmp_path):
    """The GPU machine has no mlperf-logging unless its wheel is carried: one line, exit 2."""
    blocker = tmp_path / "mlperf_logging"
    blocker.mkdir()
    (blocker / "__init__.py").write_text("raise ImportError(\"No module named 'mlperf_logging'\", name='mlperf_logging')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), ROOT]))
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "gpu_check.py"), "--records=10"],
                          capture_output=True, text=True, cwd=str(tmp_path), env=env, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "error: gpu_check: the trainer needs mlperf_logging: pip install mlperf-logging (on the GPU machine: carry "
        "the wheel, shared/tools/device_wheels.sh)"]
    assert not (tmp_path / "gpu_check.json").exists()
