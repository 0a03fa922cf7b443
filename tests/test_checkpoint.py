"""TF checkpoints written by TensorFlow itself: loading, the name mapping, conversion, add-gradacc.

The model run on a loaded checkpoint is compared with an independent NumPy (float64)
transcription of the reference BERT computed straight from the TF-named arrays.

The training checkpoints' copy to host memory (trainer/checkpoint.py host_copy_async): its CUDA
path (pinned buffers, non_blocking copies on a side stream, an event) run on this CPU with
torch.cuda's streams and events faked, and the files it writes against those of the state itself.
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from mlperf_bert import locking
from mlperf_bert.trainer import checkpoint_convert
from mlperf_bert.trainer import gradacc
from mlperf_bert.trainer import tf_checkpoint
from mlperf_bert.trainer.config import BertConfig
from mlperf_bert.errors import UserError
from mlperf_bert.trainer.model import BertForPreTraining
from test_fileio import disk_full  # noqa: F401 (a fixture)
from test_training import files  # noqa: F401 (a fixture)


class _TensorFlow:
    """tensorflow, imported by the first test that uses it: at module level every xdist worker
    would import it while collecting (about 4 s of CPU each)."""
    def __getattr__(self, name):
        if name.startswith("_"):  # pytest's probes of module attributes (e.g. _mock_name)
            raise AttributeError(name)
        return getattr(pytest.importorskip("tensorflow"), name)


tf = _TensorFlow()


CFG = dict(vocab_size=40, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
           intermediate_size=48, max_position_embeddings=16, type_vocab_size=2)


def reference_shapes(cfg):
    """The reference variable set, written out from the reference's modeling.py and run_pretraining.py (not from our mapping)."""
    h, i = cfg["hidden_size"], cfg["intermediate_size"]
    s = {"bert/embeddings/word_embeddings": (cfg["vocab_size"], h),
         "bert/embeddings/token_type_embeddings": (cfg["type_vocab_size"], h),
         "bert/embeddings/position_embeddings": (cfg["max_position_embeddings"], h),
         "bert/embeddings/LayerNorm/gamma": (h,), "bert/embeddings/LayerNorm/beta": (h,),
         "bert/pooler/dense/kernel": (h, h), "bert/pooler/dense/bias": (h,),
         "cls/predictions/transform/dense/kernel": (h, h), "cls/predictions/transform/dense/bias": (h,),
         "cls/predictions/transform/LayerNorm/gamma": (h,), "cls/predictions/transform/LayerNorm/beta": (h,),
         "cls/predictions/output_bias": (cfg["vocab_size"],),
         "cls/seq_relationship/output_weights": (2, h), "cls/seq_relationship/output_bias": (2,)}
    for n in range(cfg["num_hidden_layers"]):
        p = "bert/encoder/layer_%d/" % n
        for d in ("attention/self/query", "attention/self/key", "attention/self/value",
                  "attention/output/dense"):
            s[p + d + "/kernel"], s[p + d + "/bias"] = (h, h), (h,)
        s[p + "intermediate/dense/kernel"], s[p + "intermediate/dense/bias"] = (h, i), (i,)
        s[p + "output/dense/kernel"], s[p + "output/dense/bias"] = (i, h), (h,)
        for ln in ("attention/output/LayerNorm", "output/LayerNorm"):
            s[p + ln + "/gamma"], s[p + ln + "/beta"] = (h,), (h,)
    return s


def random_weights(cfg, seed=0):
    rng = np.random.RandomState(seed)
    out = {}
    for name, shape in reference_shapes(cfg).items():
        a = rng.normal(0, 0.3 if name.endswith("embeddings") else 0.15, shape)
        if name.endswith("gamma"):
            a = 1.0 + 0.1 * a
        out[name] = a.astype(np.float32)
    return out


def write_tf1(prefix, arrays, step, extras=("adam_m", "adam_v", "LAMB")):
    """A TF1 name-based checkpoint as the reference Estimator writes it, with optimizer slots."""
    g = tf.Graph()
    with g.as_default():
        for name, a in arrays.items():
            tf.compat.v1.get_variable(name, initializer=tf.constant(a))
            for e in extras:
                tf.compat.v1.get_variable(name + "/" + e, initializer=tf.constant(a * 0 + 0.5), trainable=False)
        gs = tf.compat.v1.train.get_or_create_global_step()
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(gs.assign(step))
            return saver.save(sess, prefix, global_step=step, write_meta_graph=False, write_state=False)


def write_tf2(prefix, arrays):
    """A TF2 object-based, weights-only checkpoint whose object path is the reference name."""
    root = tf.Module()
    for name, a in arrays.items():
        node = root
        parts = name.split("/")
        for p in parts[:-1]:
            if not hasattr(node, p):
                setattr(node, p, tf.Module())
            node = getattr(node, p)
        setattr(node, parts[-1], tf.Variable(a))
    return tf.train.Checkpoint(model=root).write(prefix)


def numpy_bert(v, cfg, batch):
    """Reference BERT pre-training loss in float64, straight from TF-named arrays."""
    v = {k: a.astype(np.float64) for k, a in v.items()}
    ids, seg, mask, pos, lab, w, nsp = batch
    b, t = ids.shape
    nh = cfg["num_attention_heads"]

    def ln(x, name):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + 1e-12) * v[name + "/gamma"] + v[name + "/beta"]

    def gelu(x):
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))

    def dense(x, name):
        return x @ v[name + "/kernel"] + v[name + "/bias"]

    def log_softmax(z):
        z = z - z.max(-1, keepdims=True)
        return z - np.log(np.exp(z).sum(-1, keepdims=True))

    e = "bert/embeddings/"
    x = v[e + "word_embeddings"][ids] + v[e + "token_type_embeddings"][seg] + v[e + "position_embeddings"][:t]
    x = ln(x, e + "LayerNorm")
    add = (1.0 - mask[:, None, None, :]) * -10000.0
    for n in range(cfg["num_hidden_layers"]):
        p = "bert/encoder/layer_%d/" % n

        def heads(y):
            return y.reshape(b, t, nh, -1).transpose(0, 2, 1, 3)

        q, k, vv = (heads(dense(x, p + "attention/self/" + s)) for s in ("query", "key", "value"))
        sc = q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1]) + add
        pr = np.exp(log_softmax(sc))
        ctx = (pr @ vv).transpose(0, 2, 1, 3).reshape(b, t, -1)
        a = ln(dense(ctx, p + "attention/output/dense") + x, p + "attention/output/LayerNorm")
        x = ln(dense(gelu(dense(a, p + "intermediate/dense")), p + "output/dense") + a, p + "output/LayerNorm")
    pooled = np.tanh(dense(x[:, 0], "bert/pooler/dense"))
    gx = x[np.arange(b)[:, None], pos]
    hx = ln(gelu(dense(gx, "cls/predictions/transform/dense")), "cls/predictions/transform/LayerNorm")
    lp = log_softmax(hx @ v[e + "word_embeddings"].T + v["cls/predictions/output_bias"])
    nll = -np.take_along_axis(lp, lab[..., None], -1)[..., 0]
    mlm = (w * nll).sum() / (w.sum() + 1e-5)
    acc = (w * (lp.argmax(-1) == lab)).sum() / w.sum()
    nlp = log_softmax(pooled @ v["cls/seq_relationship/output_weights"].T + v["cls/seq_relationship/output_bias"])
    nsp_loss = -nlp[np.arange(b), nsp.reshape(-1)].mean()
    return mlm, nsp_loss, acc


def make_batch(cfg, seed=1, b=3, t=12, p=4):
    rng = np.random.RandomState(seed)
    ids = rng.randint(0, cfg["vocab_size"], (b, t))
    seg = (np.arange(t)[None] >= rng.randint(3, 8, (b, 1))).astype(np.int64)
    lens = np.array([t, t - 3, 6])[:b]
    mask = (np.arange(t)[None] < lens[:, None]).astype(np.int64)
    pos = np.stack([rng.choice(np.arange(1, l), p, replace=False) for l in lens])
    lab = rng.randint(0, cfg["vocab_size"], (b, p))
    w = np.ones((b, p), np.float32)
    w[2, 3] = 0.0
    nsp = rng.randint(0, 2, (b, 1))
    return ids, seg, mask, pos, lab, w, nsp


def run_model(model, batch):
    model.eval()
    with torch.no_grad():
        return model(*[torch.from_numpy(np.asarray(a)) for a in batch])


@pytest.fixture(scope="module")
def tf1_ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("tf1")
    arrays = random_weights(CFG)
    prefix = write_tf1(str(d / "model.ckpt"), arrays, step=28)
    return prefix, arrays


def test_tf1_checkpoint_loads_and_matches_numpy_reference(tf1_ckpt, caplog):
    prefix, arrays = tf1_ckpt
    assert prefix.endswith("model.ckpt-28")
    model = BertForPreTraining(BertConfig.from_dict(CFG))
    with caplog.at_level("INFO"):
        info = tf_checkpoint.load_init_checkpoint(model, prefix)
    assert info["global_step"] == 28
    n = len(arrays)
    assert len(info["ignored"]) == 3 * n + 1  # adam_m, adam_v, LAMB slots and global_step
    assert "ignored %d non-model variable(s)" % (3 * n + 1) in caplog.text
    # Every parameter mapped: shapes agree, kernels transposed, a hand-checked element each.
    sd = model.state_dict()
    assert len(sd) == n
    q = arrays["bert/encoder/layer_1/attention/self/query/kernel"]
    assert sd["bert.encoder.layer.1.attention.self.query.weight"][5, 2].item() == q[2, 5]
    assert sd["bert.embeddings.word_embeddings"][7, 3].item() == arrays["bert/embeddings/word_embeddings"][7, 3]
    assert sd["cls.seq_relationship.output_weights"][1, 4].item() == arrays["cls/seq_relationship/output_weights"][1, 4]
    assert tuple(sd["bert.encoder.layer.0.intermediate.dense.weight"].shape) == (48, 32)

    batch = make_batch(CFG)
    out = run_model(model, batch)
    mlm, nsp, acc = numpy_bert(arrays, CFG, batch)
    assert out.mlm_loss.item() == pytest.approx(mlm, rel=2e-5)
    assert out.nsp_loss.item() == pytest.approx(nsp, rel=2e-5)
    assert out.loss.item() == pytest.approx(mlm + nsp, rel=2e-5)
    assert (out.mlm_correct / out.mlm_weight).item() == pytest.approx(acc)
    assert out.mlm_weight.item() == 11.0


def test_edge_rows_match_numpy_reference(tf1_ckpt):
    """Rows the reference computes as it does any other, each alone and all together: one real
    token; input_mask all 0 (every key at -10000, a shift softmax ignores: attention as if
    unmasked, where -1e9 would make it uniform); max_seq_length equal to max_position_embeddings
    with token_type_ids all 1; predictions on padding and repeated; weights all 0 (an MLM loss
    of 0 / (0 + 1e-5))."""
    prefix, arrays = tf1_ckpt
    model = BertForPreTraining(BertConfig.from_dict(CFG))
    tf_checkpoint.load_init_checkpoint(model, prefix)
    t = CFG["max_position_embeddings"]
    ids, seg, _, _, lab, w, nsp = make_batch(CFG, seed=5, b=3, t=t)
    ids, seg, lab, w, nsp = (np.concatenate([a, a[:2]]) for a in (ids, seg, lab, w, nsp))
    mask = np.ones((5, t), np.int64)
    pos = np.tile(np.arange(1, 5), (5, 1))
    mask[0, 1:], pos[0], w[0] = 0, 0, [1, 0, 0, 0]
    mask[1] = 0
    seg[2] = 1
    mask[3, 10:], pos[3] = 0, [12, 15, 4, 4]
    w[4] = 0
    for rows in [slice(None)] + [slice(r, r + 1) for r in range(5)]:
        batch = tuple(a[rows] for a in (ids, seg, mask, pos, lab, w, nsp))
        out = run_model(model, batch)
        with np.errstate(invalid="ignore"):  # the accuracy of a row of weights 0
            mlm, nsp_loss, _ = numpy_bert(arrays, CFG, batch)
        assert out.mlm_loss.item() == pytest.approx(mlm, rel=2e-5, abs=1e-6), rows
        assert out.nsp_loss.item() == pytest.approx(nsp_loss, rel=2e-5), rows


def test_tf2_object_checkpoint_loads(tmp_path):
    arrays = random_weights(CFG, seed=3)
    prefix = write_tf2(str(tmp_path / "tf2" / "ckpt"), arrays)
    model = BertForPreTraining(BertConfig.from_dict(CFG))
    tf_checkpoint.load_init_checkpoint(model, prefix)
    batch = make_batch(CFG)
    mlm, nsp, _ = numpy_bert(arrays, CFG, batch)
    assert run_model(model, batch).loss.item() == pytest.approx(mlm + nsp, rel=2e-5)


def v2_layout(arrays, cfg):
    """The same weights under TF2 Model Garden variable names and shapes (attention kernels
    [hidden, heads, head_dim], NSP kernel [hidden, 2])."""
    nh = cfg["num_attention_heads"]
    out = {}
    for name, a in arrays.items():
        n = name
        for old, new in [("bert/embeddings/word_embeddings", "word_embeddings/embeddings"),
                         ("bert/embeddings/token_type_embeddings", "type_embeddings/embeddings"),
                         ("bert/embeddings/position_embeddings", "position_embedding/embeddings"),
                         ("bert/embeddings/LayerNorm", "embeddings/layer_norm"),
                         ("bert/encoder/", "transformer/"), ("attention/self", "self_attention"),
                         ("attention/output/dense", "self_attention/attention_output"),
                         ("attention/output/LayerNorm", "self_attention_layer_norm"),
                         ("intermediate/dense", "intermediate"), ("output/dense", "output"),
                         ("output/LayerNorm", "output_layer_norm"), ("bert/pooler/dense", "pooler_transform"),
                         ("cls/predictions/output_bias", "cls/predictions/output_bias/bias"),
                         ("cls/seq_relationship/output_bias", "predictions/transform/logits/bias"),
                         ("cls/seq_relationship/output_weights", "predictions/transform/logits/kernel")]:
            n = n.replace(old, new)
        if "self_attention/" in n and "attention_output" not in n:
            a = a.reshape(a.shape[:-1] + (nh, -1))
        elif n.endswith("attention_output/kernel"):
            a = a.reshape(nh, -1, a.shape[-1])
        elif n == "predictions/transform/logits/kernel":
            a = a.T
        out[n] = a
    return out


def test_tf2_model_garden_names_and_shapes_load(tmp_path):
    arrays = random_weights(CFG, seed=4)
    root = tf.Module()
    root.layers = [tf.Variable(a, name=n) for n, a in v2_layout(arrays, CFG).items()]
    prefix = tf.train.Checkpoint(encoder=root).write(str(tmp_path / "v2" / "ckpt"))
    model = BertForPreTraining(BertConfig.from_dict(CFG))
    tf_checkpoint.load_init_checkpoint(model, prefix)
    batch = make_batch(CFG)
    mlm, nsp, _ = numpy_bert(arrays, CFG, batch)
    assert run_model(model, batch).loss.item() == pytest.approx(mlm + nsp, rel=2e-5)


def test_missing_and_misshaped_variables_are_one_line_errors(tmp_path):
    arrays = random_weights(CFG)
    del arrays["bert/encoder/layer_1/output/LayerNorm/beta"]
    prefix = write_tf1(str(tmp_path / "a"), arrays, 1, extras=())
    model = BertForPreTraining(BertConfig.from_dict(CFG))
    with pytest.raises(UserError, match="bert/encoder/layer_1/output/LayerNorm/beta") as e:
        tf_checkpoint.load_init_checkpoint(model, prefix)
    assert "\n" not in str(e.value)
    arrays = random_weights(dict(CFG, intermediate_size=40))
    prefix = write_tf1(str(tmp_path / "b"), arrays, 1, extras=())
    with pytest.raises(UserError, match=r"intermediate/dense/kernel \[32, 40\] \(model expects \[32, 48\]\)"):
        tf_checkpoint.load_init_checkpoint(model, prefix)
    with pytest.raises(UserError, match="not found"):
        tf_checkpoint.load_init_checkpoint(model, str(tmp_path / "nothere"))


def test_a_checkpoint_of_another_model_that_fits_the_shapes_is_refused(tmp_path):
    """A hostile sweep, each loaded with exit 0 into a model that then computed other numbers: a
    4-layer checkpoint into a 2-layer config (its layers 2-3 dropped as "non-model variables"); a
    .pt of 4 heads into a config of 2 (same shapes); a TF2 checkpoint whose optimizer slots are
    named as their weights ("Adam/m/word_embeddings/embeddings": the slot, first in sort order,
    was loaded as the weight)."""
    model = BertForPreTraining(BertConfig.from_dict(CFG))
    prefix = write_tf1(str(tmp_path / "deep"), random_weights(dict(CFG, num_hidden_layers=4)), 1)
    with pytest.raises(UserError, match=r"^checkpoint %s holds encoder layer 3, the model \(--bert_config_file\) has 2 "
                                        r"layers: give the bert_config.json this checkpoint was made with$"
                       % re.escape(prefix)):
        tf_checkpoint.load_init_checkpoint(model, prefix)
    pt = str(tmp_path / "heads4.pt")
    torch.save({"model": model.state_dict(), "config": BertConfig.from_dict(CFG).to_dict()}, pt)
    two = BertForPreTraining(BertConfig.from_dict(dict(CFG, num_attention_heads=2)))
    with pytest.raises(UserError, match=r"^checkpoint %s was saved from a model with num_attention_heads=4 "
                                        r"\(--bert_config_file: 2\): use the bert_config.json it was made with$"
                       % re.escape(pt)):
        tf_checkpoint.load_init_checkpoint(two, pt)
    tf_checkpoint.load_init_checkpoint(BertForPreTraining(BertConfig.from_dict(dict(CFG, hidden_dropout_prob=0.0))),
                                       pt)  # dropout is no part of what the weights mean
    arrays = random_weights(CFG, seed=4)
    v2 = v2_layout(arrays, CFG)
    root, opt = tf.Module(), tf.Module()
    root.layers = [tf.Variable(a, name=n) for n, a in v2.items()]
    opt.slots = [tf.Variable(np.full_like(a, 0.001), name="Adam/m/" + n) for n, a in v2.items()]
    prefix = tf.train.Checkpoint(encoder=root, optimizer=opt).write(str(tmp_path / "v2slot" / "ckpt"))
    with pytest.raises(UserError, match=r"^checkpoint %s: variables \S+ and \S+ both read as the model's \S+, with "
                                        r"other values: give a checkpoint of the weights alone" % re.escape(prefix)):
        tf_checkpoint.load_init_checkpoint(model, prefix)
    # a second sweep: a TF2 layout carries its heads in its shapes ([hidden, heads, head_dim]); reshaped
    # to the reference's, 4 heads loaded into a config of 2 (exit 0, another model)
    root = tf.Module()
    root.layers = [tf.Variable(a, name=n) for n, a in v2.items()]
    prefix = tf.train.Checkpoint(encoder=root).write(str(tmp_path / "v2heads" / "ckpt"))
    with pytest.raises(UserError, match=r"^checkpoint %s: variable transformer/layer_0/self_attention/\w+/\w+ "
                                        r"\[[\d, ]+\] holds 4 attention heads, the model \(--bert_config_file\) has 2: "
                                        r"give the bert_config.json this checkpoint was made with$" % re.escape(prefix)):
        tf_checkpoint.load_init_checkpoint(two, prefix)
    tf_checkpoint.load_init_checkpoint(model, prefix)  # its own 4


def test_convert_round_trip_tf_pt_tf_is_exact(tf1_ckpt, tmp_path):
    prefix, arrays = tf1_ckpt
    cfg = tmp_path / "bert_config.json"
    cfg.write_text(BertConfig.from_dict(CFG).to_json_string())
    pt, back = str(tmp_path / "m.pt"), str(tmp_path / "back" / "model.ckpt-28")
    assert checkpoint_convert.main(["x", "--bert_config_file=%s" % cfg, "--input=" + prefix, "--output=" + pt]) == 0
    assert torch.load(pt, weights_only=True)["global_step"] == 28
    assert checkpoint_convert.main(["x", "--bert_config_file=%s" % cfg, "--input=" + pt, "--output=" + back]) == 0
    reader = tf.train.load_checkpoint(back)
    shapes = reader.get_variable_to_shape_map()
    assert set(shapes) == set(arrays) | {"global_step"}
    for name, a in arrays.items():
        assert np.array_equal(reader.get_tensor(name), a), name
    assert reader.get_tensor("global_step") == 28
    assert not [f for f in os.listdir(tmp_path / "back") if ".tmp-" in f]
    with pytest.raises(UserError, match="both"):
        checkpoint_convert.main(["x", "--bert_config_file=%s" % cfg, "--input=" + pt, "--output=b.pt"])


def test_a_checkpoint_already_at_the_output_is_not_written_over(tf1_ckpt, tmp_path):
    """A hostile sweep: convert_checkpoint.py and checkpoint_add_gradacc.py replaced a checkpoint at
    their output without a word (the README's conversion with --input and --output swapped would
    replace the official model.ckpt-28252 by the .pt's 31 variables, its optimizer slots gone), and
    --format=hf at a TF prefix made a folder there that hid that checkpoint from every reader. Each is
    refused in one line naming what is there, which is left as it was."""
    prefix, _ = tf1_ckpt
    d = tmp_path / "ck"
    d.mkdir()
    for name in os.listdir(os.path.dirname(prefix)):
        shutil.copy(os.path.join(os.path.dirname(prefix), name), d / name)
    tf_prefix = str(d / os.path.basename(prefix))
    cfg = tmp_path / "bert_config.json"
    cfg.write_text(BertConfig.from_dict(CFG).to_json_string())
    pt = str(tmp_path / "m.pt")
    convert = ["x", "--bert_config_file=%s" % cfg]
    assert checkpoint_convert.main(convert + ["--input=" + tf_prefix, "--output=" + pt]) == 0
    before = {n: (d / n).read_bytes() for n in os.listdir(d)}
    pt_bytes = open(pt, "rb").read()
    fix = ": writing over it would lose that checkpoint; give another path, or remove it first$"
    for argv, there in ((convert + ["--input=" + pt, "--output=" + tf_prefix], tf_prefix + ".index"),
                        (convert + ["--input=" + tf_prefix, "--output=" + tf_prefix, "--format=hf"], tf_prefix + ".index"),
                        (convert + ["--input=" + tf_prefix, "--output=" + pt], pt)):
        output = next(a for a in argv if a.startswith("--output="))
        with pytest.raises(UserError, match="^%s: %s is there%s" % (re.escape(output), re.escape(there), fix)):
            checkpoint_convert.main(argv)
    new = str(tmp_path / "ga" / "model.ckpt-28")
    assert gradacc.main(["x", "--old=" + tf_prefix, "--new=" + new]) == 0
    with pytest.raises(UserError, match="^--new=%s: %s is there%s" % (re.escape(new), re.escape(new + ".index"), fix)):
        gradacc.main(["x", "--old=" + tf_prefix, "--new=" + new])
    assert {n: (d / n).read_bytes() for n in os.listdir(d)} == before and open(pt, "rb").read() == pt_bytes
    # (a review) the data shard of a write stopped before its .index is no checkpoint: the rerun goes on
    stopped = tmp_path / "stopped" / "model.ckpt-28"
    stopped.parent.mkdir()
    (tmp_path / "stopped" / "model.ckpt-28.data-00000-of-00001").write_bytes(b"partial")
    assert checkpoint_convert.main(convert + ["--input=" + pt, "--output=%s" % stopped]) == 0
    assert tf_checkpoint.is_tf_prefix(str(stopped))
    # (a sweep) two writers of one prefix at once both passed the look above, and each removed the
    # other's data shards: an .index alone, or a mixture, and "wrote" twice. The output is held from
    # the look to the write's end: the second is one line naming the first, and writes nothing.
    busy = tmp_path / "busy" / "model.ckpt-28"
    with locking.lock_file(str(busy), "a test"):
        for main, argv in ((gradacc.main, ["x", "--old=" + tf_prefix, "--new=%s" % busy]),
                           (checkpoint_convert.main, convert + ["--input=" + pt, "--output=%s" % busy])):
            with pytest.raises(UserError, match=r"^output checkpoint %s is in use by another run \(pid %d on host "
                                                r".*: wait for it to end or stop it" % (re.escape(str(busy)), os.getpid())):
                main(argv)
            assert os.listdir(busy.parent) == [".model.ckpt-28.lock"]
    assert os.listdir(busy.parent) == []
    # (a sweep) a running trainer holds its --output_dir, not each file: a checkpoint written there
    # (OUT/model.ckpt-99.pt) would be taken by its rotation or a resume as the run's own. One line naming
    # the trainer; nothing of the tool's there. Once the trainer is gone, the folder is written as before.
    out = tmp_path / "out"
    with locking.lock_dir(str(out), "--output_dir"):  # the trainer, running
        for main, argv, flag, dst in (
                (gradacc.main, ["x", "--old=" + tf_prefix], "--new", out / "model.ckpt-99"),
                (checkpoint_convert.main, convert + ["--input=" + tf_prefix], "--output", out / "model.ckpt-99.pt"),
                (checkpoint_convert.main, convert + ["--input=" + tf_prefix, "--format=hf"], "--output", out)):
            with pytest.raises(UserError, match=r"^%s=%s: %s is the --output_dir of a running trainer \(pid %d on host "
                                                r".*; write it to another folder, or wait for that run to end$"
                                                % (flag, re.escape(str(dst)), re.escape(str(out)), os.getpid())):
                main(argv + ["%s=%s" % (flag, dst)])
            assert os.listdir(out) == [locking.DIR_LOCK_NAME]
    assert checkpoint_convert.main(convert + ["--input=" + tf_prefix, "--output=%s" % (out / "model.ckpt-99.pt")]) == 0


def test_an_output_whose_dot_dot_the_kernel_reads_otherwise_neither_overwrites_nor_lands_elsewhere(tf1_ckpt, tmp_path,
                                                                                                  monkeypatch):
    """A hostile sweep: the look for a checkpoint at --new read gone/../ck/m as the kernel does (no gone/:
    nothing there) while the write took it as ck/m (os.path.abspath): checkpoint_add_gradacc.py wrote over
    the checkpoint at ck/m and said "wrote". And --new=ck/.. went above the working folder (ck/../..index
    taken as ../NAME.index). Each is one line; nothing written, ck/m kept as it was."""
    prefix, _ = tf1_ckpt
    monkeypatch.chdir(tmp_path)
    os.mkdir("ck")
    for name in os.listdir(os.path.dirname(prefix)):
        if name.startswith(os.path.basename(prefix) + "."):
            shutil.copy(os.path.join(os.path.dirname(prefix), name), "ck/m" + name[len(os.path.basename(prefix)):])
    before = {n: (tmp_path / "ck" / n).read_bytes() for n in os.listdir("ck")}
    index = re.escape(str(tmp_path / "ck" / "m.index"))
    for new, error in (("gone/../ck/m", "^--new=gone/../ck/m: %s is there: writing over it" % index),
                       ("ck/..", "^ck/.. is a directory: a TF checkpoint is written at a prefix"),
                       ("ck/.", "^ck/. is a directory")):
        with pytest.raises(UserError, match=error):
            gradacc.main(["x", "--old=" + prefix, "--new=" + new])
    assert {n: (tmp_path / "ck" / n).read_bytes() for n in os.listdir("ck")} == before
    assert sorted(os.listdir(tmp_path)) == ["ck"]
    assert not [n for n in os.listdir(tmp_path.parent) if n.lstrip(".").startswith(tmp_path.name + ".")]


def test_convert_says_one_count_of_dropped_variables(tmp_path, caplog, capsys):
    """Issue 37 (20): TF -> .pt logged "ignored 1 non-model variable(s): 1 x global_step" and printed
    "0 non-model variable(s) dropped" for the same run: global_step is carried to the output, so
    neither counts it, and a variable that is dropped is counted alike by both."""
    cfg = tmp_path / "bert_config.json"
    cfg.write_text(BertConfig.from_dict(CFG).to_json_string())
    model = BertForPreTraining(BertConfig.from_dict(CFG))
    slot = {"bert/pooler/dense/bias/adam_m": np.zeros(32, np.float32),
            "bert/pooler/dense/bias/adam_v": np.zeros(32, np.float32)}
    for name, extra, dropped in (("plain", None, 0), ("slots", slot, 2)):
        prefix = str(tmp_path / name / "model.ckpt-7")
        tf_checkpoint.save_tf_checkpoint(model, prefix, global_step=7, extra=extra)
        caplog.clear()
        capsys.readouterr()
        with caplog.at_level("INFO"):
            assert checkpoint_convert.main(["x", "--bert_config_file=%s" % cfg, "--input=" + prefix,
                                            "--output=" + str(tmp_path / (name + ".pt"))]) == 0
        printed = capsys.readouterr().out
        assert "(global_step 7, %d non-model variable(s) dropped)" % dropped in printed, printed
        logged = [r.getMessage() for r in caplog.records if "non-model" in r.getMessage()]
        assert logged == ([] if not dropped else
                          ["checkpoint %s: ignored %d non-model variable(s): 1 x adam_m, 1 x adam_v"
                           % (prefix, dropped)]), logged
        assert torch.load(str(tmp_path / (name + ".pt")), weights_only=True)["global_step"] == 7


def test_bfloat16_variables_older_layernorm_names_and_a_training_pts_optimizer_state(tmp_path, capsys):
    """A hostile sweep: a TF checkpoint of bfloat16 variables stopped convert_checkpoint.py and
    --init_checkpoint in a TypeError traceback (torch.from_numpy takes no ml_dtypes.bfloat16); a .pt
    whose LayerNorms are named gamma and beta (older PyTorch BERTs) in a KeyError traceback; a
    training .pt converted to TF said "0 non-model variable(s) dropped" and left out its LAMB state."""
    cfg = tmp_path / "bert_config.json"
    cfg.write_text(BertConfig.from_dict(CFG).to_json_string())
    arrays = random_weights(CFG, seed=5)
    prefix = str(tmp_path / "bf16" / "model.ckpt-3")
    names = sorted(arrays)
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names),
                      tensors=[tf.cast(tf.constant(arrays[n]), tf.bfloat16) for n in names])
    model = BertForPreTraining(BertConfig.from_dict(CFG))
    tf_checkpoint.load_init_checkpoint(model, prefix)
    for pname, t in model.state_dict().items():
        want = tf.cast(tf.cast(tf.constant(arrays[tf_checkpoint.tf_name(pname)]), tf.bfloat16), tf.float32).numpy()
        got = t.numpy().T if tf_checkpoint.is_kernel(pname) else t.numpy()
        assert np.array_equal(got, want), pname
    older = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
             for k, v in model.state_dict().items()}
    assert any("LayerNorm.gamma" in k for k in older)
    pt = str(tmp_path / "older.pt")
    torch.save({"model": older}, pt)
    again = BertForPreTraining(BertConfig.from_dict(CFG))
    tf_checkpoint.load_init_checkpoint(again, pt)
    assert all(torch.equal(a, b) for a, b in zip(again.state_dict().values(), model.state_dict().values()))
    trained = str(tmp_path / "trained.pt")
    sd = model.state_dict()
    torch.save({"model": sd, "global_step": 3, "optimizer": {"state": {i: {"adam_m": torch.zeros(1)} for i in
                                                                        range(len(sd))}, "param_groups": []}}, trained)
    capsys.readouterr()
    assert checkpoint_convert.main(["x", "--bert_config_file=%s" % cfg, "--input=" + trained,
                                    "--output=" + str(tmp_path / "tf" / "model.ckpt-3")]) == 0
    assert "(global_step 3, 0 non-model variable(s) dropped, the optimizer state of %d parameter(s) not converted)" \
        % len(sd) in capsys.readouterr().out


def test_convert_to_a_pt_on_a_full_disk_is_one_line(tmp_path, disk_full):
    """A hostile sweep: torch.save given the temporary path wrote it itself, and a full disk was
    its "RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos" traceback."""
    cfg = tmp_path / "bert_config.json"
    cfg.write_text(BertConfig.from_dict(CFG).to_json_string())
    prefix = str(tmp_path / "tf" / "model.ckpt-7")
    tf_checkpoint.save_tf_checkpoint(BertForPreTraining(BertConfig.from_dict(CFG)), prefix, global_step=7)
    out = tmp_path / "out"
    out.mkdir()
    disk_full(room=4096)
    with pytest.raises(UserError, match=r"^cannot write %s: no space left on device .*free space, then rerun"
                                        % re.escape(str(out / "m.pt"))):
        checkpoint_convert.main(["x", "--bert_config_file=%s" % cfg, "--input=" + prefix, "--output=%s" % (out / "m.pt")])
    assert os.listdir(out) == []


def test_a_stop_inside_torch_save_is_the_stop_not_a_traceback(tf1_ckpt, tmp_path, monkeypatch):
    """A hostile sweep: a SIGTERM (or Ctrl-C) while convert_checkpoint.py wrote its .pt raised in
    the file's write inside torch.save, whose zip writer's end then failed: "RuntimeError: [enforce
    fail at inline_container.cc:672] . unexpected pos 14912 vs 14806", a traceback, exit 1. The stop
    comes out as itself (fileio.atomic_save, which the training checkpoints' writes share; run_main: one
    line, 143 or 130), the temporary and the new folder removed."""
    from mlperf_bert import fileio
    from mlperf_bert.errors import Terminated
    prefix, _ = tf1_ckpt
    cfg = tmp_path / "bert_config.json"
    cfg.write_text(BertConfig.from_dict(CFG).to_json_string())
    real, calls = fileio._Recorder.__init__, []

    class Raising:  # the temporary file, whose write a signal's handler interrupts the third time
        def __init__(self, f, stop):
            self.f, self.stop = f, stop

        def write(self, data):
            calls.append(len(data))
            if len(calls) == 3:  # in the file's write, torch.save below it
                raise self.stop()
            return self.f.write(data)

        def __getattr__(self, name):
            return getattr(self.f, name)
    for stop in (Terminated, KeyboardInterrupt):
        monkeypatch.setattr(fileio._Recorder, "__init__", lambda self, f, stop=stop: real(self, Raising(f, stop)))
        del calls[:]
        with pytest.raises(stop):
            checkpoint_convert.main(["x", "--bert_config_file=%s" % cfg, "--input=" + prefix,
                                     "--output=%s" % (tmp_path / "new" / "m.pt")])
        assert len(calls) == 3 and os.listdir(tmp_path) == ["bert_config.json"]


def test_a_failed_or_stopped_write_leaves_no_new_empty_folder(tf1_ckpt, tmp_path, disk_full):
    """A hostile sweep: --output=new/m.pt (or a TF prefix in a new folder, or --format=hf new_dir) on
    a full disk removed its temporary but left the folder it made, empty, an output that looked
    started; checkpoint_add_gradacc.py --new=new/m of a damaged input alike. A folder made by the run
    goes with it; one that existed is kept."""
    prefix, _ = tf1_ckpt
    cfg = tmp_path / "bert_config.json"
    cfg.write_text(BertConfig.from_dict(CFG).to_json_string())
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    for ext in (".index", ".data-00000-of-00001"):
        data = open(prefix + ext, "rb").read()
        (damaged / ("model.ckpt" + ext)).write_bytes(data if ext == ".index" else data[:1000])
    with pytest.raises(UserError, match=r"^cannot read variable .* its data file is truncated or damaged"):
        gradacc.main(["x", "--old=%s" % (damaged / "model.ckpt"), "--new=%s" % (tmp_path / "new" / "ga" / "m")])
    assert sorted(os.listdir(tmp_path)) == ["bert_config.json", "damaged"]
    disk_full(room=4096)
    out = str(tmp_path / "new" / "sub" / "m.pt")
    with pytest.raises(UserError) as e:
        checkpoint_convert.main(["x", "--bert_config_file=%s" % cfg, "--input=" + prefix, "--output=" + out])
    assert str(e.value).startswith("cannot write %s: no space left on device" % out)
    assert sorted(os.listdir(tmp_path)) == ["bert_config.json", "damaged"]
    (tmp_path / "kept").mkdir()
    with pytest.raises(UserError, match="no space left on device"):
        checkpoint_convert.main(["x", "--bert_config_file=%s" % cfg, "--input=" + prefix,
                                 "--output=%s" % (tmp_path / "kept" / "m.pt")])
    assert sorted(os.listdir(tmp_path)) == ["bert_config.json", "damaged", "kept"]


def test_a_rewrite_of_a_prefix_keeps_files_beside_its_shards(tmp_path):
    """A hostile sweep: writing a TF checkpoint over an existing prefix removed every file named
    PREFIX.data-*, not only its old shards: a user's copy model.ckpt-28.data-00000-of-00001.bak (kept
    before converting again) or model.ckpt-28.data-notes.txt was deleted without a word; and such a
    copy changed the checkpoint's fingerprint (its bytes), so a resume of a run started from it was
    refused as another --init_checkpoint."""
    prefix = str(tmp_path / "model.ckpt-28")
    small = {"global_step": np.array(5, np.int64), "w": np.ones((3, 2), np.float32)}
    tf_checkpoint.write_tf_checkpoint(small, prefix)
    before = tf_checkpoint.fingerprint(prefix)
    backup = tmp_path / "model.ckpt-28.data-00000-of-00001.bak"
    backup.write_bytes((tmp_path / "model.ckpt-28.data-00000-of-00001").read_bytes())
    (tmp_path / "model.ckpt-28.data-notes.txt").write_text("notes")
    (tmp_path / "model.ckpt-28.data-00000-of-00002").write_bytes(b"an old shard of another count")
    tf_checkpoint.write_tf_checkpoint(small, prefix)
    assert sorted(os.listdir(tmp_path)) == ["model.ckpt-28.data-00000-of-00001", "model.ckpt-28.data-00000-of-00001.bak",
                                            "model.ckpt-28.data-notes.txt", "model.ckpt-28.index"]
    assert (tmp_path / "model.ckpt-28.data-notes.txt").read_text() == "notes"
    assert tf_checkpoint.fingerprint(prefix) == before


def test_a_tf_prefix_too_long_for_tensorflows_temporaries_is_refused_before_anything(tmp_path):
    """A hostile sweep: a TF --output prefix of 230 bytes passed every check, then TensorFlow's write failed
    on its NAME.tmp-PID.data-00000-of-00001.tempstateN: "cannot write ...: {{function_node
    __wrapped__SaveV2...}} ...; File name too long [Op:SaveV2]", no fix, after the conversion's work."""
    prefix = str(tmp_path / ("c" * 194))
    with pytest.raises(UserError) as e:
        with tf_checkpoint.output_held(prefix, "--output"):
            pass
    assert str(e.value) == ("--output %s: its name is 194 bytes, too long for NAME.tmp-PID.data-00000-of-00001."
                            "tempstateN, TensorFlow's temporary of its data (a file name may have 255 bytes): give a "
                            "name of at most 193 bytes" % prefix)
    with tf_checkpoint.output_held(prefix[:-1], "--output"):  # a .pt of that length is written
        pass
    with tf_checkpoint.output_held(prefix + ".pt", "--output"):
        pass
    assert os.listdir(tmp_path) == []


def test_add_gradacc_refuses_a_new_prefix_named_pt(tf1_ckpt, tmp_path):
    """A hostile sweep: --new=model.pt wrote the TF checkpoint model.pt.index and .data-*, which
    convert_checkpoint.py and the trainer's --init_checkpoint then read as a .pt ("checkpoint
    model.pt not found")."""
    prefix, _ = tf1_ckpt
    new = str(tmp_path / "model.pt")
    with pytest.raises(UserError) as e:
        gradacc.main(["x", "--old=" + prefix, "--new=" + new])
    assert str(e.value) == ("--new=%s ends in .pt, the name of a .pt checkpoint: this tool writes a TF checkpoint; "
                            "give a TF prefix (e.g. model.ckpt-28252)" % new)
    assert os.listdir(tmp_path) == []


def test_add_gradacc_variable_set(tf1_ckpt, tmp_path):
    prefix, _ = tf1_ckpt
    new = str(tmp_path / "ga" / "model.ckpt-28")
    assert gradacc.main(["x", "--old=" + prefix, "--new=" + new]) == 0
    # Small shards: the streaming path (several data files merged) gives the same checkpoint.
    sharded = str(tmp_path / "ga2" / "model.ckpt-28")
    gradacc.add_gradacc(prefix, sharded, shard_bytes=20000)
    assert len([f for f in os.listdir(tmp_path / "ga2") if ".data-" in f]) > 2
    assert sorted(os.listdir(tmp_path / "ga2"))[-1] == "model.ckpt-28.index"
    assert not [f for f in os.listdir(tmp_path / "ga2") if ".tmp-" in f]
    old_r = tf.train.load_checkpoint(prefix)
    old_s, old_t = old_r.get_variable_to_shape_map(), old_r.get_variable_to_dtype_map()
    for path in (new, sharded):
        new_r = tf.train.load_checkpoint(path)
        new_s, new_t = new_r.get_variable_to_shape_map(), new_r.get_variable_to_dtype_map()
        assert set(new_s) == set(old_s) | {n + "/GradientAccumulator" for n in old_s}
        for n in old_s:
            assert np.array_equal(new_r.get_tensor(n), old_r.get_tensor(n))
            acc = new_r.get_tensor(n + "/GradientAccumulator")
            assert new_s[n + "/GradientAccumulator"] == old_s[n] and new_t[n + "/GradientAccumulator"] == old_t[n]
            assert not np.any(acc)
        assert new_t["global_step/GradientAccumulator"] == tf.int64
    with pytest.raises(UserError, match="already has GradientAccumulator"):
        gradacc.add_gradacc(new, str(tmp_path / "again"))


def test_a_tf_write_killed_leaves_what_the_next_write_of_its_prefix_removes(tf1_ckpt, tmp_path):
    """A hostile sweep: a SIGKILL during a TF checkpoint's write left PREFIX.tmp-PID.data-* and
    .index (and the .parts folder of a sharded write: GBs at BERT-Large), which no rerun removed.
    The next write of that prefix removes a dead writer's; a live one's is kept."""
    prefix, _ = tf1_ckpt
    new = str(tmp_path / "ga" / "model.ckpt-28")
    killed = textwrap.dedent("""\
        import os, signal, sys
        from mlperf_bert.trainer import gradacc, tf_checkpoint
        tf_checkpoint.os.replace = lambda *a: os.kill(os.getpid(), signal.SIGKILL)  # at the first rename
        gradacc.add_gradacc(sys.argv[1], sys.argv[2], shard_bytes=20000)
        """)
    proc = subprocess.Popen([sys.executable, "-c", killed, prefix, new], stderr=subprocess.PIPE)
    err = proc.communicate(timeout=120)[1]
    assert proc.returncode == -signal.SIGKILL, err
    left = sorted(os.listdir(tmp_path / "ga"))
    assert left and all(".tmp-%d." % proc.pid in n for n in left), left
    (tmp_path / "ga" / ("model.ckpt-28.tmp-%d.parts" % proc.pid)).mkdir()  # where the shards were
    (tmp_path / "ga" / ("model.ckpt-28.tmp-%d.parts" % proc.pid) / "part-00000.data-00000-of-00001").write_bytes(b"x")
    live = tmp_path / "ga" / ("model.ckpt-28.tmp-%d.index" % os.getppid())
    live.write_bytes(b"a live writer's")
    gradacc.add_gradacc(prefix, new, shard_bytes=20000)
    assert sorted(n for n in os.listdir(tmp_path / "ga") if ".tmp-" in n) == [live.name]
    assert tf_checkpoint.is_tf_prefix(new)


def test_add_gradacc_refuses_a_tf2_checkpoint_in_one_line(tmp_path):
    """A hostile sweep: a TF2 object-based checkpoint (the reference's tf2_ckpt is one) ended in a
    ValueError traceback: its string variable _CHECKPOINTABLE_OBJECT_GRAPH got an accumulator."""
    prefix = write_tf2(str(tmp_path / "tf2" / "ckpt"), random_weights(CFG, seed=3))
    with pytest.raises(UserError, match=r"^TF checkpoint %s is a TF2 object-based one \(it holds "
                                        r"_CHECKPOINTABLE_OBJECT_GRAPH\): the reference's tool adds accumulators to a "
                                        r"TF1 name-based checkpoint" % re.escape(prefix)):
        gradacc.main(["x", "--old=" + prefix, "--new=%s" % (tmp_path / "ga" / "ckpt")])
    assert not (tmp_path / "ga").exists() or os.listdir(tmp_path / "ga") == []


def test_a_checkpoint_written_over_another_never_mixes_them(tf1_ckpt, tmp_path, monkeypatch):
    """A hostile sweep: convert-checkpoint onto an existing prefix, stopped between its renames (data
    first, index last), left the new .data beside the old .index: a prefix that looked complete and
    failed to read ("Read less bytes than requested"). The old .index goes first: stopped there, the
    prefix is incomplete (no .index); run to its end, the new checkpoint alone, its old shards gone."""
    prefix, arrays = tf1_ckpt
    target = str(tmp_path / "model.ckpt")
    tf_checkpoint.write_tf_checkpoint(tf_checkpoint.LazyCheckpoint(prefix), target, shard_bytes=20000)  # shards
    assert len([f for f in os.listdir(tmp_path) if ".data-" in f]) > 1
    small = {"global_step": np.array(5, np.int64), "w": np.ones((3, 2), np.float32)}
    real, calls = os.replace, []

    def stop_after_the_data(src, dst):
        if dst.endswith(".index"):
            raise KeyboardInterrupt  # a stop between the renames
        calls.append(dst)
        return real(src, dst)
    monkeypatch.setattr(os, "replace", stop_after_the_data)
    with pytest.raises(KeyboardInterrupt):
        tf_checkpoint.write_tf_checkpoint(small, target)
    monkeypatch.setattr(os, "replace", real)
    assert calls and not tf_checkpoint.is_tf_prefix(target)  # incomplete, not old index + new data
    tf_checkpoint.write_tf_checkpoint(small, target)
    assert sorted(os.listdir(tmp_path)) == ["model.ckpt.data-00000-of-00001", "model.ckpt.index"]
    got = tf_checkpoint.LazyCheckpoint(target)
    assert sorted(got) == ["global_step", "w"] and np.array_equal(got["w"], small["w"])


def test_add_gradacc_refuses_to_write_over_its_input_under_another_name(tmp_path):
    """A hostile sweep: ``--old=ck/tf/model.ckpt --new=ck/tf/./model.ckpt`` replaced the source
    checkpoint in place (the check compared the strings). The prefixes are compared as paths: the
    same folder spelt another way, or through a link, is refused before anything is read."""
    d = tmp_path / "ck" / "tf"
    d.mkdir(parents=True)
    for name in ("model.ckpt.index", "model.ckpt.data-00000-of-00001"):
        (d / name).write_bytes(b"the input's bytes")
    (tmp_path / "link").symlink_to(d)
    for new in (str(d / "." / "model.ckpt"), str(tmp_path / "ck" / ".." / "ck" / "tf" / "model.ckpt"),
                str(tmp_path / "link" / "model.ckpt")):
        with pytest.raises(UserError, match=r"^--new=%s is --old=%s: writing it would destroy the input; give another "
                                            r"prefix$" % (re.escape(new), re.escape(str(d / "model.ckpt")))):
            gradacc.main(["x", "--old=%s" % (d / "model.ckpt"), "--new=" + new])
    assert all((d / n).read_bytes() == b"the input's bytes" for n in os.listdir(d))


def test_the_tf_to_tf_tool_loads_without_torch():
    """checkpoint_add_gradacc.py reads and writes TF checkpoints only: torch's import (~1.6 s of CPU)
    is the trainer's and the converters' (tf_checkpoint imports it in the functions that make tensors)."""
    code = ("import runpy, sys; sys.argv = ['checkpoint_add_gradacc.py', '--help']\n"
            "try:\n    runpy.run_path('checkpoint_add_gradacc.py', run_name='__main__')\n"
            "except SystemExit:\n    pass\n"
            "print(sorted(m for m in ('torch', 'tensorflow', 'mlperf_bert.trainer.tf_checkpoint') if m in sys.modules))")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, check=True).stdout
    assert out.splitlines()[-1] == "['mlperf_bert.trainer.tf_checkpoint']", out


def test_add_gradacc_bad_arguments_and_a_full_disk_are_one_line(tf1_ckpt, tmp_path, monkeypatch):
    """A hostile sweep of checkpoint_add_gradacc.py: a full disk was a 20-line TensorFlow traceback
    (docs/running.md promises "cannot write FILE", exit 2); an empty --new= wrote the checkpoint
    beside the working folder (os.path.abspath("") is it); a .pt was told to give "a .pt"; a stray
    argument was ignored. The disk: a real 8 KB tmpfs (an unprivileged mount namespace), the script
    as users run it."""
    prefix, _ = tf1_ckpt
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match=r"^flag --new is required, and was given empty \(--new=\)$"):
        gradacc.main(["x", "--old=" + prefix, "--new="])
    with pytest.raises(UserError, match=r"^an empty path is not a TF checkpoint prefix: give one"):
        tf_checkpoint.write_tf_checkpoint({"w": np.ones(2, np.float32)}, "")
    assert os.listdir(tmp_path) == [] and not os.path.exists(str(tmp_path) + ".index")
    pt = tmp_path / "model.ckpt-4.pt"
    pt.write_bytes(b"a .pt")
    with pytest.raises(UserError, match=r"^--old=%s is a \.pt checkpoint: this tool adds accumulators to a TF "
                                        r"checkpoint; give its prefix" % re.escape(str(pt))):
        gradacc.main(["x", "--old=%s" % pt, "--new=" + str(tmp_path / "g")])
    with pytest.raises(UserError, match=r"^unexpected argument 'extra'"):
        gradacc.main(["x", "--old=" + prefix, "--new=" + str(tmp_path / "g"), "extra"])
    from test_fileio import _real_tmpfs_available
    if not _real_tmpfs_available():
        pytest.skip("cannot mount a tmpfs in a user namespace here (unshare -rm)")
    import subprocess
    import sys
    import textwrap
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = textwrap.dedent("""\
        mount -t tmpfs -o size=8k none {m}
        {py} {root}/checkpoint_add_gradacc.py --old={old} --new={m}/g 2>{t}/err; echo $? >{t}/rc
        ls -A {m} >{t}/left
        """).format(m=mnt, t=tmp_path, py=sys.executable, root=root, old=prefix)
    subprocess.run(["unshare", "-rm", "sh", "-c", script], cwd=root, check=True, timeout=300,
                   env=dict(os.environ, PYTHONPATH=root, TF_CPP_MIN_LOG_LEVEL="3"))
    err = (tmp_path / "err").read_text()
    assert (tmp_path / "rc").read_text().strip() == "2", err
    assert err.strip().splitlines()[-1] == ("error: cannot write %s/g: no space left on device: free space, then "
                                            "rerun the same command" % mnt), err
    assert "Traceback" not in err and (tmp_path / "left").read_text() == ""


def test_bad_pt_inputs_are_one_line_errors(tmp_path):
    model = BertForPreTraining(BertConfig.from_dict(CFG))
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(UserError, match="is not a PyTorch"):
        tf_checkpoint.load_init_checkpoint(model, str(bad))
    torch.save({"weights": {}}, str(bad))
    with pytest.raises(UserError, match="no 'model' key"):
        tf_checkpoint.load_init_checkpoint(model, str(bad))
    with pytest.raises(UserError, match="not found"):
        tf_checkpoint.load_init_checkpoint(model, str(tmp_path / "none.pt"))
    sd = BertForPreTraining(BertConfig.from_dict(dict(CFG, hidden_size=16))).state_dict()
    torch.save({"model": sd}, str(bad))
    with pytest.raises(UserError, match=r"word_embeddings \[40, 16\] \(model expects \[40, 32\]\)"):
        tf_checkpoint.load_init_checkpoint(model, str(bad))


def nvidia_state_dict(arrays, vocab_size):
    """A state dict as NVIDIA's MLPerf BERT convert_tf_checkpoint.py makes it of the reference's TF
    variables (training_results_v2.1 to v5.0, e.g. v5.0's NVIDIA/benchmarks/bert/implementations/
    tyche_ngpu8_ngc25.04_pytorch: convert_tf_checkpoint.py and modeling.py's load_tf_weights_in_bert),
    transcribed from that code: its BertForPretraining (pytorch-pretrained-BERT's names, every fusion
    off) with the vocabulary padded to a multiple of 8; layer_N -> layer.N, kernel and gamma -> weight,
    output_bias and beta -> bias, output_weights -> weight, *_embeddings -> *_embeddings.weight,
    kernels transposed, a smaller array copied into the zeroed corner of a padded one; the MLM
    decoder's weight is the word embeddings' parameter (torch.save stores it under both names)."""
    padded = vocab_size + (-vocab_size % 8)
    sd = {}
    for name, a in arrays.items():
        parts = []
        for m in name.split("/"):
            l = re.split(r"_(\d+)", m) if re.fullmatch(r"[A-Za-z]+_\d+", m) else [m]
            parts.append({"kernel": "weight", "gamma": "weight", "output_weights": "weight", "output_bias": "bias",
                          "beta": "bias"}.get(l[0], l[0]))
            parts += l[1:2]
        if m.endswith("_embeddings"):
            parts.append("weight")
        elif m == "kernel":
            a = a.T
        t = torch.from_numpy(np.ascontiguousarray(a))
        if t.shape[0] == vocab_size < padded and name.startswith(("bert/embeddings/word", "cls/predictions/output")):
            t = torch.cat([t, t.new_zeros((padded - vocab_size,) + t.shape[1:])])
        sd[".".join(parts)] = t
    sd["cls.predictions.decoder.weight"] = sd["bert.embeddings.word_embeddings.weight"]
    return sd


def test_nvidia_converted_pt_loads_bit_for_bit(tmp_path, caplog):
    """The .pt of NVIDIA's convert_tf_checkpoint.py (its MLPerf BERT, from the reference's
    model.ckpt-28252) was "lacks N model variable(s), e.g. bert/embeddings/word_embeddings: use ... the
    matching bert_config.json" (the config was right). Its names are Hugging Face's (HF_NAMES, the
    export's), its tied decoder equal to the word embeddings and its vocabulary padded with zeros to a
    multiple of 8: it loads exactly, with DistributedDataParallel's "module." prefix too."""
    cfg = dict(CFG, vocab_size=37)  # padded to 40 by the converter
    arrays = random_weights(cfg, seed=5)
    sd = nvidia_state_dict(arrays, 37)
    assert sd["bert.embeddings.word_embeddings.weight"].shape == (40, 32)
    for name, weights in (("nv.pt", sd), ("ddp.pt", {"module." + k: v for k, v in sd.items()})):
        pt = str(tmp_path / name)
        torch.save({"model": weights}, pt)
        model = BertForPreTraining(BertConfig.from_dict(cfg))
        with caplog.at_level("INFO", logger=tf_checkpoint.log.name):
            caplog.clear()
            info = tf_checkpoint.load_init_checkpoint(model, pt)
        assert info["ignored"] == [] and info["global_step"] is None
        got = tf_checkpoint.to_tf_arrays(model.state_dict())
        assert got.keys() == arrays.keys()
        for k in arrays:
            assert got[k].tobytes() == arrays[k].tobytes(), k
        assert caplog.messages == ["checkpoint %s: Hugging Face's names (NVIDIA's convert_tf_checkpoint.py .pt); "
                                   "cls.predictions.decoder.weight dropped (tied, equal to bert.embeddings."
                                   "word_embeddings.weight); 3 zero rows of vocabulary padding (40 -> 37) dropped" % pt]


def test_a_pt_in_another_layout_of_nvidias_is_one_line_naming_the_tf_prefix(tmp_path):
    """What does not map exactly onto this model is refused naming the layout and the TF prefix to give:
    NVIDIA's training checkpoints (BertForPreTrainingSegmented, fused QKV), a decoder other than the
    word embeddings, padded rows that are not zero (trained), a name this model has no place for."""
    cfg = dict(CFG, vocab_size=37)
    model = BertForPreTraining(BertConfig.from_dict(cfg))
    fix = ("give the reference's TF checkpoint prefix (--init_checkpoint=DIR/tf1_ckpt/model.ckpt-28252), which NVIDIA's "
           "convert_tf_checkpoint.py itself reads")
    pt = str(tmp_path / "nv.pt")

    def refused(sd):
        torch.save({"model": sd}, pt)
        with pytest.raises(UserError) as e:
            tf_checkpoint.load_init_checkpoint(model, pt)
        return str(e.value)

    sd = nvidia_state_dict(random_weights(cfg, seed=6), 37)
    segmented = {("heads_only_segment." if k.startswith("cls") else "bert_model_segment.") + k: v for k, v in sd.items()}
    assert refused(segmented) == ("checkpoint %s holds NVIDIA's MLPerf BERT weights in its training model's fused or "
                                  "renamed layout (bert_model_segment.bert.embeddings.word_embeddings.weight), not one "
                                  "this model reads exactly: %s" % (pt, fix))
    fused = dict(sd)
    fused["bert.encoder.layer.0.attention.qkv_weight"] = torch.cat([fused.pop("bert.encoder.layer.0.attention.self.%s."
                                                                              "weight" % w) for w in ("query", "key", "value")])
    assert "(bert.encoder.layer.0.attention.qkv_weight)" in refused(fused)
    untied = dict(sd, **{"cls.predictions.decoder.weight": sd["cls.predictions.decoder.weight"] + 1})
    assert refused(untied) == ("checkpoint %s (Hugging Face's names): its cls.predictions.decoder.weight is not its "
                               "bert.embeddings.word_embeddings.weight, which this model ties it to: %s" % (pt, fix))
    trained = dict(sd, **{"cls.predictions.bias": sd["cls.predictions.bias"] + 1})
    assert refused(trained) == ("checkpoint %s (Hugging Face's names): its vocabulary is padded to 40 and the rows past "
                                "--bert_config_file's 37 are not zero, which this model has no place for: %s" % (pt, fix))
    extra = dict(sd, **{"bert.embeddings.position_ids": torch.arange(16)})
    assert refused(extra) == ("checkpoint %s (Hugging Face's names) holds 1 tensor(s) this model has no place for, "
                              "e.g. bert.embeddings.position_ids: %s" % (pt, fix))


def test_training_from_nvidias_converted_pt_is_training_from_the_same_weights(files, tmp_path):
    """A run from NVIDIA's converted .pt (BERT's real vocabulary, 30522, padded to 30528) trains as one
    from a .pt of this project holding the same weights: the same checkpoint, bit for bit."""
    from mlperf_bert.trainer import training
    from test_training import TINY, assert_bit_identical, flags_for
    arrays = random_weights(TINY, seed=7)
    model = BertForPreTraining(BertConfig.from_dict(TINY))
    tf_checkpoint.load_state_from_arrays(model, arrays, "arrays")
    torch.save({"model": model.state_dict()}, str(tmp_path / "ours.pt"))
    torch.save({"model": nvidia_state_dict(arrays, TINY["vocab_size"])}, str(tmp_path / "nv.pt"))
    for name in ("ours", "nv"):
        assert training.main(flags_for(files, str(tmp_path / ("out_" + name)), num_train_steps=2,
                                       save_checkpoints_steps=0,
                                       init_checkpoint=str(tmp_path / (name + ".pt")))) == 0
    assert_bit_identical(str(tmp_path / "out_ours" / "model.ckpt-2.pt"), str(tmp_path / "out_nv" / "model.ckpt-2.pt"))


def test_a_pt_of_another_kind_or_a_folder_is_one_line(tmp_path):
    """A hostile sweep: a .pt whose "model" is no state dict of tensors (another project's
    {"model": {"module": {...}}}, a list) was an AttributeError traceback ("'dict' object has no
    attribute 'detach'"); a folder named x.pt was "checkpoint x.pt not found"."""
    cfg = tmp_path / "bert_config.json"
    cfg.write_text(BertConfig.from_dict(CFG).to_json_string())
    bad = str(tmp_path / "other.pt")
    for weights in ({"module": {"w": torch.ones(2)}}, [torch.ones(2)], {"w": 1}):
        torch.save({"model": weights}, bad)
        with pytest.raises(UserError) as e:
            checkpoint_convert.main(["x", "--bert_config_file=%s" % cfg, "--input=" + bad,
                                     "--output=%s" % (tmp_path / "out" / "model.ckpt")])
        assert str(e.value) == ("checkpoint %s is not a checkpoint of this project (its 'model' is not a dict of "
                                "tensors): give a .pt written by this project or a TF checkpoint prefix" % bad)
    (tmp_path / "dir.pt").mkdir()
    with pytest.raises(UserError) as e:
        checkpoint_convert.main(["x", "--bert_config_file=%s" % cfg, "--input=%s" % (tmp_path / "dir.pt"),
                                 "--output=%s" % (tmp_path / "out" / "model.ckpt")])
    assert str(e.value) == "checkpoint %s is a directory: give a .pt file written by this project" % (tmp_path / "dir.pt")
    assert sorted(os.listdir(tmp_path)) == ["bert_config.json", "dir.pt", "other.pt"]
    with pytest.raises(UserError) as e:  # the trainer's --init_checkpoint, read first for the run's identity
        tf_checkpoint.fingerprint(str(tmp_path / "dir.pt"))
    assert str(e.value) == ("--init_checkpoint %s is a directory: give a .pt file written by this project"
                            % (tmp_path / "dir.pt"))


# ---------------------------------------------------------------- the training checkpoints' host copy

class _FakeCuda:
    """torch.cuda's streams and events, and pinned memory, as calls in ``log`` (a CPU build has
    none of them); the copies run on the CPU."""

    def __init__(self, monkeypatch):
        from mlperf_bert.trainer import checkpoint
        self.log, self.pinned = [], set()
        self.main = self.current = "main"
        fake = self

        class Stream:
            def __init__(self, device=None):
                fake.log.append(("stream", str(device)))

            def wait_stream(self, other):
                fake.log.append(("side waits for", other))

        class Event:
            def record(self, stream):
                fake.log.append(("event recorded on", "side" if isinstance(stream, Stream) else stream))

            def synchronize(self):
                fake.log.append(("event synchronised",))

        class StreamContext:
            def __init__(self, stream):
                self.stream = stream

            def __enter__(self):
                fake.current = "side" if isinstance(self.stream, Stream) else self.stream

            def __exit__(self, *exc):
                fake.current = fake.main

        def pinned(nbytes):
            t = torch.empty(nbytes, dtype=torch.uint8)
            fake.pinned.add(t.data_ptr())
            fake.log.append(("pinned", nbytes))
            return t

        real_copy = torch.Tensor.copy_

        def copy_(dst, src, non_blocking=False):
            if dst.data_ptr() in fake.pinned:
                fake.log.append(("copy", non_blocking, fake.current))
            return real_copy(dst, src, non_blocking)
        monkeypatch.setattr(torch.cuda, "Stream", Stream)
        monkeypatch.setattr(torch.cuda, "Event", Event)
        monkeypatch.setattr(torch.cuda, "stream", StreamContext)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: fake.main)
        monkeypatch.setattr(torch.Tensor, "copy_", copy_)
        monkeypatch.setattr(torch.Tensor, "record_stream", lambda t, s: fake.log.append(("record_stream",)))
        monkeypatch.setattr(checkpoint, "_pinned", pinned)
        # every storage as if in GPU memory (host tensors of a state, e.g. RNG states, are cloned)
        monkeypatch.setattr(checkpoint, "_on_device", lambda storage: True)
        self.Event = Event


def _a_state():
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(6, 4, generator=gen)
    return {"model": {"w": w, "w_t": w.t(), "row": w[2], "b": torch.randn(4, generator=gen)},
            "optimizer": {"state": {0: {"step": 3, "adam_m": torch.randn(6, 4, generator=gen)}}},
            "global_step": 3, "rng": torch.get_rng_state()}


def test_host_copy_from_cuda_pins_copies_on_a_side_stream_and_writes_the_same_file(tmp_path, monkeypatch):
    """The CUDA path: a side stream that waits for the training stream, one pinned buffer per
    storage (views share it), every copy non_blocking on the side stream, an event recorded
    after the last; the writer synchronises on the event before it writes. The file written
    from the copy is byte for byte the one written from the state itself (and from the CPU
    path's copy)."""
    from mlperf_bert.trainer import checkpoint
    fake = _FakeCuda(monkeypatch)
    state = _a_state()
    copy, done = checkpoint.host_copy_async(state, torch.device("cuda", 1))
    storages = 4  # w (and its views), b, adam_m, the RNG state
    log = fake.log
    assert log[:2] == [("stream", "cuda:1"), ("side waits for", "main")]
    assert [e for e in log if e[0] == "pinned"] == [("pinned", n) for n in (96, 16, 96, state["rng"].numel())]
    assert [e for e in log if e[0] == "copy"] == [("copy", True, "side")] * storages
    assert log[-1] == ("event recorded on", "side") and isinstance(done, fake.Event)
    assert copy["model"]["w_t"].untyped_storage().data_ptr() == copy["model"]["w"].untyped_storage().data_ptr()
    del log[:]
    saved = []
    monkeypatch.setattr(checkpoint, "save", lambda path, st, keep: (saved.append(path), log.append(("save",)),
                                                                   torch.save(st, path)))
    writer = checkpoint.BackgroundWriter()
    for d in ("async", "state", "cpu"):  # torch.save names the archive's folder after the file
        (tmp_path / d).mkdir()
    writer.submit(str(tmp_path / "async" / "model.pt"), copy, 0, ready=done)
    writer.wait()
    assert log == [("event synchronised",), ("save",)]
    torch.save(state, str(tmp_path / "state" / "model.pt"))
    monkeypatch.undo()
    torch.save(checkpoint.host_copy(state), str(tmp_path / "cpu" / "model.pt"))
    ref = (tmp_path / "state" / "model.pt").read_bytes()
    assert (tmp_path / "async" / "model.pt").read_bytes() == ref == (tmp_path / "cpu" / "model.pt").read_bytes()


def test_a_checkpoint_whose_writer_thread_the_process_limit_refuses_is_written_at_once(tmp_path, monkeypatch):
    """A writer thread the process limit (a container's --pids-limit) refuses: the checkpoint is written
    in the training thread instead; it was lost, a traceback, and the end's wait a second one ("cannot
    join thread before it is started")."""
    import threading
    from mlperf_bert.trainer import checkpoint

    def refused(self):
        raise RuntimeError("can't start new thread")
    monkeypatch.setattr(threading.Thread, "start", refused)
    writer = checkpoint.BackgroundWriter()
    path = checkpoint.path_for(str(tmp_path), 3)
    writer.submit(path, {"model": {"w": torch.ones(2)}}, keep=2)
    writer.wait()
    assert torch.equal(torch.load(path)["model"]["w"], torch.ones(2))


def test_host_copy_elsewhere_is_a_plain_copy(monkeypatch):
    """On a CPU (or no device given) nothing is pinned, no stream is made, no event returned,
    and the copy owns its memory."""
    from mlperf_bert.trainer import checkpoint
    fake = _FakeCuda(monkeypatch)
    state = _a_state()
    copy, done = checkpoint.host_copy_async(state, torch.device("cpu"))
    assert done is None and fake.log == []
    monkeypatch.undo()
    assert not checkpoint._on_device(state["model"]["w"].untyped_storage())
    assert copy["model"]["w"].data_ptr() != state["model"]["w"].data_ptr()
    assert torch.equal(copy["model"]["w_t"], state["model"]["w_t"])


def test_the_next_update_waits_for_the_checkpoints_copy(tmp_path, monkeypatch):
    """The Trainer: save() keeps the copy's event and hands it to the writer; the next micro-step
    makes the training stream wait on it before the update writes the weights and slots (the
    forward and backward before it overlap the copy), once."""
    from mlperf_bert.trainer import checkpoint
    from test_levers import _batches, _trainer
    fake = _FakeCuda(monkeypatch)
    monkeypatch.setattr(torch, "compile", lambda fn=None, **kw: fn)
    trainer = _trainer(tmp_path, dtype="fp32")
    event = fake.Event()
    real = checkpoint.host_copy_async
    monkeypatch.setattr(checkpoint, "host_copy_async", lambda state, device, buffers=None: (real(state)[0], event))
    submitted = []
    monkeypatch.setattr(trainer.writer, "submit", lambda path, state, keep, ready=None: submitted.append(ready))
    trainer.save(str(tmp_path / "model.ckpt-0.pt"), {})
    assert submitted == [event] and trainer._copying is event
    main = []
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: type(
        "S", (), {"wait_event": lambda self, e: main.append(("wait", e))})())
    after = trainer.after_backward
    trainer.after_backward = lambda step: (main.append(("update",)), after(step))[1]
    batches = _batches()
    trainer.step(batches[0], 0)
    trainer.step(batches[1], 1)
    assert main == [("wait", event), ("update",), ("update",)] and trainer._copying is None


def test_checkpoint_copies_go_into_pinned_buffers_reserved_before_run_start(files, tmp_path, monkeypatch):
    """Issue 46.5: the pinned host buffers of a CUDA run's checkpoint copies were allocated by the
    first save, on the training thread, on the clock. Now rank 0 reserves one a storage of the model
    and the optimizer (the slots the first update makes counted) in the untimed init, before
    ``train`` logs run_start; every copy after an update takes them (no pinned allocation at a
    save, none after the first), and the file written from them is the state's, byte for byte."""
    from mlperf_bert.trainer import checkpoint, training
    from test_levers import _batches, _trainer
    from test_training import flags_for

    # the order in run(): reserved (a CUDA run's gate lifted) before train(), which logs run_start
    order = []
    monkeypatch.setattr(checkpoint, "pinned_copies", lambda device: True)
    monkeypatch.setattr(checkpoint, "_pinned", lambda n: torch.empty(n, dtype=torch.uint8))
    real_reserve = training.Trainer.reserve_checkpoint_buffers
    monkeypatch.setattr(training.Trainer, "reserve_checkpoint_buffers",
                        lambda self: (order.append("reserve"), real_reserve(self)))

    class Stop(Exception):
        pass

    def train(loop, *a, **k):
        order.append(("train", loop.trainer.host_buffers is not None))
        raise Stop
    monkeypatch.setattr(training.Loop, "train", train)
    with pytest.raises(Stop):
        training.main(flags_for(files, str(tmp_path / "out")))
    assert order == ["reserve", ("train", True)]
    monkeypatch.undo()

    # the copies from a (fake) CUDA device take the reserved buffers
    fake = _FakeCuda(monkeypatch)
    monkeypatch.setattr(torch, "compile", lambda fn=None, **kw: fn)
    trainer = _trainer(tmp_path, dtype="fp32")
    assert not trainer.optimizer.state  # before the first update: its slots are counted to come
    trainer.reserve_checkpoint_buffers()
    reserved = [e for e in fake.log if e[0] == "pinned"]
    n = len(trainer.model.state_dict()) + 2 * len(trainer.accumulator.params)  # no views in this model
    assert len(reserved) == n
    batches = _batches()
    for i in range(2):
        trainer.step(batches[i], i)  # an update: the slots exist
    for _ in range(2):  # two saves: the second reuses the buffers of the first
        del fake.log[:]
        state = {"model": trainer.model.state_dict(), "optimizer": trainer.optimizer.state_dict()}
        copy, _ = checkpoint.host_copy_async(state, torch.device("cuda", 0), buffers=trainer.host_buffers)
        assert [e for e in fake.log if e[0] == "pinned"] == []
        assert len([e for e in fake.log if e[0] == "copy"]) == n
    monkeypatch.undo()
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    torch.save(copy, str(tmp_path / "a" / "m.pt"))
    torch.save(state, str(tmp_path / "b" / "m.pt"))
    assert (tmp_path / "a" / "m.pt").read_bytes() == (tmp_path / "b" / "m.pt").read_bytes()


def test_gather_objects_is_on_the_host_gloo_group(monkeypatch):
    """Issue 46.5: on NCCL, torch's gather_object pickles each rank's object into a CUDA tensor and
    reads it back (a device sync at every checkpoint). setup() makes a gloo group where the default
    group is not gloo, on every rank, and gather_objects uses it (a fake process group stands in
    for NCCL's: two ranks, this one rank 0; its collectives do nothing)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from mlperf_bert.trainer import distributed
    made, used = [], []
    monkeypatch.setattr(dist, "new_group", lambda backend=None, **kw: made.append(backend) or "gloo group")
    monkeypatch.setattr(dist, "gather_object", lambda obj, out, dst=0, group=None: used.append(group))
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        assert distributed.setup("cpu") == (0, 2, 0)
        assert distributed.gather_objects({"rng": 1}) == [None, None]
    finally:
        dist.destroy_process_group()
        monkeypatch.setattr(distributed, "_HOST_GROUP", None)
    assert made == ["gloo"] and used == ["gloo group"]


def test_a_checkpoint_path_that_is_no_prefix_says_what_it_is(files, tmp_path):  # noqa: F811
    """A hostile sweep: a TF checkpoint's .index or .data file, its folder, or a file of another
    project (a Hugging Face pytorch_model.bin) given for a prefix was "TF checkpoint ... not found",
    beside a file that exists. Each says what it is and what to give; in the trainer's
    --init_checkpoint (checked at its start) and convert_checkpoint.py --input alike."""
    from mlperf_bert.trainer import training
    from test_training import flags_for
    tf = tmp_path / "tf"
    tf.mkdir()
    # (and a killed write's temporary prefix, which the folder's e.g. once named)
    for name in ("model.ckpt-6.index", "model.ckpt-6.data-00000-of-00001", "model.ckpt-7.tmp-123.index"):
        (tf / name).write_bytes(b"x")
    (tmp_path / "pytorch_model.bin").write_bytes(b"PK\x03\x04x")
    prefix = str(tf / "model.ckpt-6")
    cases = [(prefix + ".index", "%s.index is a file of the TF checkpoint %s: give its prefix, %s" % ((prefix,) * 3)),
             (prefix + ".data-00000-of-00001", "%s.data-00000-of-00001 is a file of the TF checkpoint %s: give its "
                                               "prefix, %s" % ((prefix,) * 3)),
             (str(tf), "%s is a directory: give the prefix of a TF checkpoint in it, e.g. %s" % (tf, prefix)),
             (str(tmp_path), "%s is a directory: give the prefix of a TF checkpoint in it (it holds none: no .index "
                             "file)" % tmp_path),
             (str(tmp_path / "pytorch_model.bin"), "%s is not a TF checkpoint prefix (no pytorch_model.bin.index) nor "
                                                   "a .pt of this project: give a .pt it wrote (convert_checkpoint.py "
                                                   "makes one) or a TF checkpoint prefix such as model.ckpt-28252"
              % (tmp_path / "pytorch_model.bin")),
             (prefix + "7", "TF checkpoint %s7 not found: give the prefix whose .index file exists (e.g. "
                            "model.ckpt-28252)" % prefix)]
    for path, message in cases:
        with pytest.raises(UserError) as e:
            training.main(flags_for(files, str(tmp_path / "out"), init_checkpoint=path))
        assert str(e.value) == message
        with pytest.raises(UserError) as e:
            checkpoint_convert.main(["convert_checkpoint.py", "--bert_config_file=" + files["config"], "--input=" + path,
                                     "--output=" + str(tmp_path / "x.pt")])
        assert str(e.value) == message
    assert not (tmp_path / "out").exists() and not (tmp_path / "x.pt").exists()


def test_a_log_owner_record_that_names_no_path_is_none(tmp_path):
    """A hostile sweep: mlperf_log_path.json edited to hold a number was read as that number, which
    the resume's check then took for a file descriptor (os.path.exists(5)); a record that names no
    path (a number, an empty path, a list, no JSON) is no record."""
    from mlperf_bert.trainer import checkpoint
    for text in ('{"mlperf_log": 5}', '{"mlperf_log": ""}', '{"mlperf_log": ["a"]}', '[1, 2]', '', '{"x": 1}'):
        (tmp_path / checkpoint.LOG_OWNER).write_text(text)
        assert checkpoint.read_log_owner(str(tmp_path)) is None, text
    checkpoint.write_log_owner(str(tmp_path), str(tmp_path / "mlperf.log"))
    assert checkpoint.read_log_owner(str(tmp_path)) == str(tmp_path / "mlperf.log")


# ---------------------------------------------------------------- a training checkpoint a resume cannot take

def _training_ckpt(path, **keys):
    """A .pt with the keys a resume reads (checkpoint.TRAINING_STATE) beside weights of one tensor."""
    state = {"model": {"w": torch.ones(2)}, "optimizer": {}, "ranks": [{}], "seed": 7, "global_step": 6}
    state.update(keys)
    torch.save(state, str(path))


_ONLY = "it is the run's only checkpoint: restore it from a copy (deleted, the run would start over from step 0)"
_BEFORE = "delete it to resume from the one before, model.ckpt-3.pt"


def _refused(path, line):
    """The resume's load of ``path`` is refused with ``line``."""
    from mlperf_bert.trainer import checkpoint
    with pytest.raises(UserError) as e:
        checkpoint.load(str(path))
    assert str(e.value) == line


@pytest.mark.parametrize("step,said", [
    (3.5, "global_step 3.5, a float"), ("12", "global_step '12', a str"), (None, "global_step None, no value"),
    ([6], "global_step [6], a list"), (True, "global_step True, a bool"), (-3, "global_step -3, below 0"),
    (torch.tensor(6), "global_step tensor(6), a Tensor"),
    ("x" * 100, "global_step '%s..., a str" % ("x" * 56))])  # (a long value cut)
def test_a_checkpoint_whose_global_step_is_no_step_count_is_one_line(tmp_path, step, said):
    """A review: a hand-edited or foreign .pt whose global_step is no whole number was resumed from: a
    string or a list ended in a TypeError traceback where the loop compared it, None in one where the
    samples were counted, a float hung the data loader for ever, a bool or a number below 0 trained from
    there. Each is one line naming the file and its value, and what to do, as for a damaged one."""
    from mlperf_bert.trainer import checkpoint
    path = tmp_path / "model.ckpt-6.pt"
    _training_ckpt(path, global_step=step)
    what = ("checkpoint %s holds %s, not a step count (a whole number >= 0, which the trainer writes): it was "
            "edited, or written by another program; " % (path, said))
    _refused(path, what + _ONLY)
    _training_ckpt(tmp_path / "model.ckpt-3.pt", global_step=3)
    _refused(path, what + _BEFORE)
    assert checkpoint.load(str(tmp_path / "model.ckpt-3.pt"))["global_step"] == 3


def test_a_prefix_that_is_also_a_folder_is_read_as_that_prefix_not_the_checkpoint_its_folder_names(tf1_ckpt,
                                                                                                    tmp_path):
    """A hostile sweep: given the prefix run/model.ckpt-28 (its .index beside it) where a folder of that
    name holds a 'checkpoint' file, tf.train.load_checkpoint took the folder for a folder of checkpoints
    and loaded the one that file names, anywhere (here ../elsewhere/), while the run recorded the
    fingerprint of the prefix given."""
    prefix, arrays = tf1_ckpt
    elsewhere = str(tmp_path / "elsewhere" / "other.ckpt-5")
    tf_checkpoint.write_tf_checkpoint({"global_step": np.int64(5), "x": np.zeros(2, np.float32)}, elsewhere)
    run = tmp_path / "run"
    run.mkdir()
    for f in (prefix + ".index", prefix + ".data-00000-of-00001"):
        shutil.copy(f, run)
    given = run / os.path.basename(prefix)
    given.mkdir()
    (given / "checkpoint").write_text('model_checkpoint_path: "../../elsewhere/other.ckpt-5"\n')
    ckpt = tf_checkpoint.LazyCheckpoint(str(given))
    assert int(ckpt["global_step"]) == 28 and "x" not in ckpt.shapes


@pytest.mark.parametrize("name", ["ckpt [v1]", "back\\slash"])
def test_a_tf_checkpoint_in_a_folder_named_with_glob_characters_is_read(tf1_ckpt, tmp_path, name):
    """A hostile sweep of paths: TF finds a checkpoint's .index by a glob, so a prefix in a folder named
    "ckpt [v1]" (or with a backslash) was "cannot read TF checkpoint ... Failed to find any matching files: its
    .index is truncated or damaged; copy the checkpoint's .index and .data-* files again" (convert_checkpoint.py,
    --init_checkpoint): a 4 GB copy for nothing. It is read as any other."""
    prefix, arrays = tf1_ckpt
    folder = tmp_path / name
    folder.mkdir()
    for f in (prefix + ".index", prefix + ".data-00000-of-00001"):
        shutil.copy(f, folder)
    ckpt = tf_checkpoint.LazyCheckpoint(str(folder / os.path.basename(prefix)))
    assert int(ckpt["global_step"]) == 28
    name, value = next(iter(arrays.items()))
    np.testing.assert_array_equal(ckpt[name], value)


def test_a_tf_checkpoint_in_a_folder_named_beyond_ascii_is_written_and_read(tf1_ckpt, tmp_path):
    """An environment sweep: TF encodes a str path as UTF-8, not in the file system's encoding. In an
    ISO-8859-1 locale a folder "é" was "No such file or directory" (convert_checkpoint.py's write) and
    "not found" (its read); the same folder's bytes in a UTF-8 locale (b"\\xe9", a surrogate here) fail
    so too. Written in shards (merged by TF) and read back, through the folder's descriptor."""
    prefix, arrays = tf1_ckpt
    folder = os.path.join(str(tmp_path), os.fsdecode(b"\xe9"))
    os.mkdir(folder)
    target = os.path.join(folder, "model.ckpt-28")
    tf_checkpoint.write_tf_checkpoint(tf_checkpoint.LazyCheckpoint(prefix), target, shard_bytes=200000)
    names = os.listdir(folder)  # the checkpoint's files alone: no temporary left
    assert "model.ckpt-28.index" in names and all(re.match(r"model\.ckpt-28\.(index|data-\d{5}-of-\d{5})$", n)
                                                  for n in names), names
    ckpt = tf_checkpoint.LazyCheckpoint(target)
    assert int(ckpt["global_step"]) == 28
    for name, value in arrays.items():
        np.testing.assert_array_equal(ckpt[name], value)


def test_a_tf_checkpoint_whose_own_name_holds_glob_characters_is_not_called_damaged(tf1_ckpt, tmp_path):
    """A review: the prefix's own name is TF's pattern too, where no folder's descriptor helps: model[1].ckpt-28
    (which matches model1.ckpt-28) was "its .index is truncated or damaged; copy ... again". It says to rename it."""
    prefix, _ = tf1_ckpt
    given = str(tmp_path / "model[1].ckpt-28")
    for suffix in (".index", ".data-00000-of-00001"):
        shutil.copy(prefix + suffix, given + suffix)
    with pytest.raises(UserError) as e:
        tf_checkpoint.LazyCheckpoint(given)
    assert str(e.value) == ("cannot read TF checkpoint %s: TensorFlow reads its name as a file pattern, which %s.index "
                            "does not match; rename the checkpoint's .index and .data-* files to a prefix without "
                            "* ? [ \\" % (given, given))


def test_a_tf_checkpoint_whose_global_step_is_no_step_count_or_whose_index_is_damaged_is_one_line(tf1_ckpt, tmp_path):
    """A hostile sweep: a TF checkpoint's global_step of another shape or type was a TypeError or
    ValueError traceback (int() of it) in convert_checkpoint.py, --init_checkpoint and the eval, 28.5 was
    taken as 28, and -5 was written into a .pt that every reader then refused, as the .pt's own step
    is; a truncated or damaged .index was "not an sstable (bad magic number)", with no fix."""
    prefix, arrays = tf1_ckpt
    cfg = tmp_path / "bert_config.json"
    cfg.write_text(BertConfig.from_dict(CFG).to_json_string())
    bad, pt = str(tmp_path / "bad" / "model.ckpt"), tmp_path / "m.pt"
    for step, said in ((np.array([3, 4]), "[3, 4], a list"), (np.array(b"x"), "b'x', a bytes"),
                       (np.float32(28.5), "28.5, a float"), (np.int64(-5), "-5, below 0")):
        shutil.rmtree(tmp_path / "bad", ignore_errors=True)
        tf_checkpoint.write_tf_checkpoint(dict(arrays, global_step=np.asarray(step)), bad)
        with pytest.raises(UserError) as e:
            checkpoint_convert.main(["x", "--bert_config_file=%s" % cfg, "--input=" + bad, "--output=%s" % pt])
        assert str(e.value) == ("TF checkpoint %s holds global_step %s, not a step count (a whole number >= 0, a "
                                "scalar int64 in the reference's): give the reference's checkpoint or one this "
                                "project wrote" % (bad, said))
        assert not pt.exists()
    shutil.rmtree(tmp_path / "bad")
    tf_checkpoint.write_tf_checkpoint(dict(arrays, global_step=np.int32(7)), bad)  # (an int32 step is one)
    assert tf_checkpoint.load_init_checkpoint(BertForPreTraining(BertConfig.from_dict(CFG)), bad)["global_step"] == 7
    cut = tmp_path / "cut"
    cut.mkdir()
    for f in (prefix + ".index", prefix + ".data-00000-of-00001"):
        shutil.copy(f, cut)
    cut_prefix = str(cut / os.path.basename(prefix))
    with open(cut_prefix + ".index", "r+b") as f:
        f.truncate(100)
    with pytest.raises(UserError) as e:
        gradacc.main(["x", "--old=" + cut_prefix, "--new=%s" % (tmp_path / "ga" / "m")])
    assert str(e.value) == ("cannot read TF checkpoint %s (not an sstable (bad magic number)): its %s.index is "
                            "truncated or damaged; copy the checkpoint's .index and .data-* files again"
                            % (cut_prefix, cut_prefix))


def test_a_truncated_training_checkpoint_is_said_to_be_truncated(tmp_path):
    """A review: a checkpoint cut short (truncate -s 50%, a copy that ended early) was "not a PyTorch
    (.pt) file", which sends the user looking for another kind of file. It is said truncated, with
    the resume's way on (the one before, or a copy where it is the only one); a file that is no .pt
    at all keeps its line."""
    whole = tmp_path / "whole.pt"
    _training_ckpt(whole)
    data = whole.read_bytes()
    out = tmp_path / "out"
    out.mkdir()
    path = out / "model.ckpt-6.pt"
    for size in (len(data) // 2, len(data) - 1, 4):
        path.write_bytes(data[:size])
        what = ("checkpoint %s is truncated (%s bytes): it begins as a PyTorch .pt, but the end of its zip archive "
                "is missing; " % (path, format(size, ",")))
        _refused(path, what + _ONLY)
    _training_ckpt(out / "model.ckpt-3.pt", global_step=3)
    _refused(path, what + _BEFORE)
    path.write_bytes(b"not a checkpoint")
    _refused(path, "checkpoint %s is not a PyTorch (.pt) file; %s" % (path, _BEFORE))


def test_a_resume_refused_for_another_runs_settings_names_the_checkpoint():
    """A review: a checkpoint of another run in --output_dir (a flag of its identity differs) was
    refused naming the folder alone; the checkpoint that holds the other value is named too, as the
    refusals of another model config or data name it."""
    from mlperf_bert.trainer import checkpoint
    with pytest.raises(UserError) as e:
        checkpoint.check_same_run({"seed": 7, "learning_rate": 0.01}, {"seed": 8, "learning_rate": 0.01},
                                  "out/model.ckpt-27.pt")
    assert str(e.value) == ("--seed=8 differs from the run being resumed in out (it has 7), as its checkpoint "
                            "model.ckpt-27.pt records: rerun with the same value, or use another --output_dir for "
                            "a new run")
    with pytest.raises(UserError) as e:
        checkpoint.check_same_run({"config": {"hidden_size": 16}}, {"config": {"hidden_size": 32}},
                                  "out/model.ckpt-27.pt")
    assert str(e.value) == ("the model config of --bert_config_file: hidden_size=32 (was 16) differs from the run "
                            "being resumed in out (checkpoint model.ckpt-27.pt): rerun with the same value, or use "
                            "another --output_dir for a new run")


def test_a_pt_under_a_name_beyond_ascii_loads_in_any_locale(tmp_path):
    """An environment sweep: torch's mmap load encodes a str path as UTF-8, not in the file system's
    encoding. A checkpoint in a folder "é" under an ISO-8859-1 locale was "No such file", and a resume
    said "restore it from a copy"; the same folder's bytes in a UTF-8 locale (b"\\xe9", a surrogate
    here) were "surrogates not allowed"."""
    folder = os.path.join(str(tmp_path), os.fsdecode(b"\xe9"))
    os.mkdir(folder)
    path = os.path.join(folder, "model.ckpt-1.pt")
    torch.save({"model": {"w": torch.ones(2)}}, path)
    assert torch.equal(tf_checkpoint.load_pt(path)["model"]["w"], torch.ones(2))


def test_an_init_checkpoint_or_a_conversion_of_a_pt_with_no_step_count_is_one_line(tmp_path):
    """A review: convert_checkpoint.py (and --init_checkpoint) read a .pt's global_step as it was: a
    string was a ValueError traceback, None, a list or 3.5 were written into the TF checkpoint; a .pt
    cut short was "not a PyTorch (.pt) file" there too (tf_checkpoint.load_pt, every reader's)."""
    model = BertForPreTraining(BertConfig.from_dict(CFG))
    cfg = tmp_path / "bert_config.json"
    cfg.write_text(BertConfig.from_dict(CFG).to_json_string())
    pt = tmp_path / "m.pt"
    for step, said in (("abc", "global_step 'abc', a str"), ([1], "global_step [1], a list"),
                       (3.5, "global_step 3.5, a float")):
        torch.save({"model": model.state_dict(), "global_step": step}, str(pt))
        with pytest.raises(UserError) as e:
            checkpoint_convert.main(["x", "--bert_config_file=%s" % cfg, "--input=%s" % pt,
                                     "--output=%s" % (tmp_path / "tf" / "model.ckpt")])
        assert str(e.value) == ("checkpoint %s holds %s, not a step count (a whole number >= 0, which the trainer "
                                "writes): give a .pt written by this project" % (pt, said))
        assert not (tmp_path / "tf").exists()
    torch.save({"model": model.state_dict()}, str(pt))  # (a .pt of weights alone has no step: taken)
    assert tf_checkpoint.load_init_checkpoint(model, str(pt))["global_step"] is None
    data = pt.read_bytes()
    pt.write_bytes(data[:len(data) // 2])
    with pytest.raises(UserError) as e:
        tf_checkpoint.load_init_checkpoint(model, str(pt))
    assert str(e.value) == ("checkpoint %s is truncated (%s bytes): it begins as a PyTorch .pt, but the end of its "
                            "zip archive is missing: give a whole copy (a copy or transfer cut short leaves one so)"
                            % (pt, format(len(data) // 2, ",")))


def test_checkpoint_save_bench_names_the_config_it_saves(tmp_path, capsys):
    """A sweep of the benches: bench/checkpoint_save.py --config=X (no --train) printed "BERT-Large:
    1036028 parameters (0.00 GB fp32)" for the demo's config; it names the config, as --train does."""
    import argparse
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, os.path.join(root, "bench"))
    import checkpoint_save
    config = os.path.join(root, "configs", "bert_config_demo.json")
    args = argparse.Namespace(dir=str(tmp_path), repeats=1, ranks=1, config=config)
    checkpoint_save.save_only(args, BertConfig.from_json_file(config))
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("bert_config_demo.json: 1036028 parameters (0.00 GB fp32)"), out
    assert out[1].startswith("save 0: ") and os.listdir(tmp_path) == [], out


def test_no_writable_temporary_folder_for_tensorflow_is_one_line(tmp_path, monkeypatch):
    """A hostile sweep (a read-only container without a /tmp of its own, an INIT_CHECKPOINT to read):
    TensorFlow's import asks for the temporary folder (absl's testing module), and tempfile's
    "No usable temporary directory" was its traceback. One line naming the fixes, before the import."""
    import tempfile
    from mlperf_bert.errors import UserError
    (tmp_path / "model.ckpt-1.index").write_bytes(b"")
    monkeypatch.setattr(tempfile, "tempdir", None)
    monkeypatch.setattr(tempfile, "_candidate_tempdir_list", lambda: [str(tmp_path / "missing")])
    with pytest.raises(UserError, match=r"^no writable temporary folder for TensorFlow, which reads and writes TF "
                                        r"checkpoints \(.*\): set TMPDIR to a writable folder, or mount one at /tmp"):
        tf_checkpoint.LazyCheckpoint(str(tmp_path / "model.ckpt-1"))


def test_markers_nested_past_the_json_parser_are_one_line(tmp_path):
    """A hostile sweep: run_stopped.json, run_finished.json or mlperf_log_path.json of JSON nested past
    the parser's depth was a RecursionError traceback at the trainer's start."""
    from mlperf_bert.trainer import checkpoint
    deep = "[" * 100000 + "]" * 100000
    for name in (checkpoint.STOPPED, checkpoint.FINISHED):
        (tmp_path / name).write_text(deep)
        with pytest.raises(UserError, match=r"^cannot read .*%s \(JSON nested too deeply" % re.escape(name)):
            checkpoint.read_stopped(str(tmp_path)) if name == checkpoint.STOPPED else \
                checkpoint.read_finished(str(tmp_path))
    (tmp_path / checkpoint.LOG_OWNER).write_text(deep)
    assert checkpoint.read_log_owner(str(tmp_path)) is None


def test_a_resumes_checkpoint_is_let_go_before_the_checkpoint_buffers_are_reserved(files, tmp_path, monkeypatch):
    """A hostile review of the CUDA paths: rank 0 reserved the pinned checkpoint buffers (weights and
    slots, 3.76 GiB of BERT-Large's) while a resume's checkpoint (as much again, in host memory) was
    still held, both at once. Now the checkpoint's tensors are freed first (a CUDA run's gate lifted)."""
    import gc
    import signal
    import weakref
    from mlperf_bert.trainer import checkpoint, training
    from test_training import flags_for
    argv = flags_for(files, str(tmp_path / "out"), num_train_steps=12, num_workers=0)
    real_save = training.Loop.save

    def save(loop, final=False):  # a SIGTERM after the first checkpoint: the run checkpoints and stops
        real_save(loop, final)
        os.kill(os.getpid(), signal.SIGTERM)
    monkeypatch.setattr(training.Loop, "save", save)
    assert training.main(argv) == 143
    monkeypatch.setattr(training.Loop, "save", real_save)

    loaded, held = [], []
    real_load = checkpoint.load_on_every_rank

    def load_on_every_rank(*a, **k):
        ckpt = real_load(*a, **k)
        if ckpt is not None:
            loaded.extend(weakref.ref(t) for t in ckpt["model"].values())
        return ckpt
    monkeypatch.setattr(checkpoint, "load_on_every_rank", load_on_every_rank)
    monkeypatch.setattr(checkpoint, "pinned_copies", lambda device: not held)  # the run's gate; the copies the CPU's
    monkeypatch.setattr(checkpoint, "_pinned", lambda n: torch.empty(n, dtype=torch.uint8))
    real_reserve = training.Trainer.reserve_checkpoint_buffers
    monkeypatch.setattr(training.Trainer, "reserve_checkpoint_buffers",
                        lambda self: (held.append(sum(r() is not None for r in loaded)), real_reserve(self)))
    gc.collect()
    assert training.main(argv) == 0
    assert loaded and held == [0]
