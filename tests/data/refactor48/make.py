"""Made this folder's fixtures with the code of commit 70193fc, whose API it calls (issue 48: made
before the trainer's top layer was rebuilt, so that the new code is checked against the old one's
outputs; to remake them, check that commit out).

    python tests/data/refactor48/make.py [--resume_only]

- ``resume/``: a tiny BERT trained 12 micro-steps (4 rows, 2 a update, checkpoints every 6) on the
  first 48 golden s128 records: its config, records, checkpoint model.ckpt-6.pt (gzip -9n) and
  MLPerf log cut at that checkpoint's point; tests/test_run_config.py resumes it.
- ``presets.json``: for each preset's flags (train_model.sh --dry_run), the run identity and the
  launch record's given flags (the repository root written <ROOT>).
"""
import gzip
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

import numpy as np  # noqa: E402

from mlperf_bert.dataset import example, tfrecord  # noqa: E402
from mlperf_bert.trainer import checkpoint, trainer_flags, training  # noqa: E402

TINY = {"vocab_size": 128, "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
        "intermediate_size": 16, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1, "max_position_embeddings": 128, "type_vocab_size": 2,
        "initializer_range": 0.02}
PRESETS = ("demo_cpu", "reference_gpu", "tpu_8192", "rcp_3072")


def small_vocab(record):
    """A golden record with its word ids folded into TINY's vocabulary (ids below it kept: [PAD],
    [CLS], [SEP], [MASK]), so that the model's embeddings, and the checkpoint, stay small."""
    feats = example.decode_example(bytes(record))
    for name in ("input_ids", "masked_lm_ids"):
        v = feats[name]
        feats[name] = np.where(v < TINY["vocab_size"], v, 104 + v % (TINY["vocab_size"] - 104))
    return example.encode_example([(k, "float" if v.dtype.kind == "f" else "int64", v.tolist())
                                   for k, v in feats.items()])


def resume_args(d, out):
    return ["run_pretraining.py", "--bert_config_file=%s/config.json" % d, "--input_file=%s/train.tfrecord" % d,
            "--output_dir=%s" % out, "--do_train", "--train_batch_size=4", "--num_train_steps=12",
            "--num_warmup_steps=2", "--save_checkpoints_steps=6", "--keep_checkpoint_max=5", "--optimizer=lamb",
            "--learning_rate=1e-2", "--steps_per_update=2", "--seed=7", "--num_workers=0", "--shuffle_buffer=16",
            "--noprogress"]


def make_resume():
    d = os.path.join(HERE, "resume")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(TINY, f, indent=1)
    with tempfile.TemporaryDirectory() as tmp:
        golden = os.path.join(tmp, "g.tfrecord")
        with gzip.open(os.path.join(ROOT, "tests/data/golden/part-00000.s128.tfrecord.gz")) as src, \
                open(golden, "wb") as dst:
            shutil.copyfileobj(src, dst)
        records = [small_vocab(r) for r in list(tfrecord.read_records(golden))[:48]]
        tfrecord.write_records(os.path.join(d, "train.tfrecord"), records)
        out = os.path.join(tmp, "out")
        torch.set_num_threads(1)
        assert training.main(resume_args(d, out)) == 0
        ckpt = torch.load(os.path.join(out, "model.ckpt-6.pt"), weights_only=False)
        length = ckpt["mlperf_log"][0]
        with open(os.path.join(out, "mlperf.log"), "rb") as f, open(os.path.join(d, "mlperf.log"), "wb") as g:
            g.write(f.read(length))
        with open(os.path.join(out, "model.ckpt-6.pt"), "rb") as f, \
                gzip.GzipFile(os.path.join(d, "model.ckpt-6.pt.gz"), "wb", 9, mtime=0) as g:
            shutil.copyfileobj(f, g)


def preset_argv(preset):
    env = dict(os.environ, DATA_DIR="/data", PYTHON=sys.executable, OUTPUT_DIR="/out", SEED="5")
    for k in ("PRESET", "INIT_CHECKPOINT", "NUM_GPUS", "NNODES"):
        env.pop(k, None)
    cmd = subprocess.run([os.path.join(ROOT, "train_model.sh"), "--dry_run", "--preset=" + preset],
                         capture_output=True, text=True, env=env, check=True).stdout.strip().splitlines()[-1]
    cmd = shlex.split(cmd)
    i = next(k for k, a in enumerate(cmd) if a.endswith("run_pretraining.py"))
    return ["run_pretraining.py"] + cmd[i + 1:]


def record(preset):
    """The identity and the given flags of ``preset``'s command, by today's code."""
    fv = trainer_flags.define_flags()
    fv(preset_argv(preset))
    ident = checkpoint.run_identity(fv, 5, [], [], None, {"hidden_size": 8})
    given = checkpoint.launch_record(fv, 8)
    return {"argv": preset_argv(preset), "identity": ident,
            "launch": {k: given[k] for k in ("flags", "processes", "processes_per_node", "nodes")}}


def make_presets():
    out = {p: record(p) for p in PRESETS}
    text = json.dumps(out, indent=1).replace(ROOT, "<ROOT>")
    with open(os.path.join(HERE, "presets.json"), "w") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    if sys.argv[1:] != ["--resume_only"]:
        make_presets()
    make_resume()
