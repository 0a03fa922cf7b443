"""``convert_checkpoint.py --format=hf``: a Hugging Face ``BertForPreTraining`` directory
(config.json + model.safetensors) from a checkpoint of ours. Its file is read back by the
safetensors format's rules here; Hugging Face's own loader and forward are compared with ours
where transformers is installed (``make hf``)."""
import json
import os

import numpy as np
import pytest
import torch

from mlperf_bert.errors import UserError
from mlperf_bert.trainer import checkpoint_convert, model as modeling, tf_checkpoint
from mlperf_bert.trainer.config import BertConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "bert_config_demo.json")  # the demo's model: 2 layers, hidden 32


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A .pt of the demo's model with every parameter made distinct (a zero bias or a unit LayerNorm
    would hide a misplaced tensor), and its export. -> (model, .pt path, export directory)."""
    d = tmp_path_factory.mktemp("hf")
    cfg = BertConfig.from_json_file(CONFIG)
    torch.manual_seed(0)
    model = modeling.BertForPreTraining(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    pt = str(d / "model.ckpt-7.pt")
    torch.save({"model": model.state_dict(), "config": cfg.to_dict(), "global_step": 7}, pt)
    out = str(d / "hf")
    assert checkpoint_convert.main(["convert_checkpoint.py", "--bert_config_file=" + CONFIG, "--input=" + pt,
                                    "--output=" + out, "--format=hf"]) == 0
    return model, pt, out


def read_safetensors(path):
    """{name: array} and the metadata of a safetensors file, read by the format's rules: 8-byte
    little-endian header length, JSON header, then every tensor's byte range, with no gap."""
    with open(path, "rb") as f:
        data = f.read()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    meta = header.pop("__metadata__")
    ranges = sorted(h["data_offsets"] for h in header.values())
    assert ranges[0][0] == 0 and ranges[-1][1] == len(body)
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))  # end to end
    assert (8 + n) % 8 == 0
    out = {}
    for name, h in header.items():
        assert h["dtype"] == "F32"
        begin, end = h["data_offsets"]
        out[name] = np.frombuffer(body[begin:end], dtype="<f4").reshape(h["shape"])
    return out, meta


def test_the_export_holds_every_weight_under_hugging_faces_name(exported):
    """Issue 47 (13): no export to Hugging Face. The directory holds config.json (the decoder tied
    to the word embeddings, tanh GELU, LayerNorm eps 1e-12) and model.safetensors with each of our
    parameters, bit for bit, under BertForPreTraining's name."""
    model, _, out = exported
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors"]
    tensors, meta = read_safetensors(os.path.join(out, "model.safetensors"))
    assert meta == {"format": "pt"}
    ours = model.state_dict()
    assert len(tensors) == len(ours)
    for name, value in ours.items():
        hf_name = tf_checkpoint.HF_NAMES.get(name, name)
        assert np.array_equal(tensors[hf_name], value.numpy()), name
    assert "cls.seq_relationship.weight" in tensors and "cls.predictions.bias" in tensors
    assert "cls.predictions.decoder.weight" not in tensors  # tied: loaded from the word embeddings
    cfg = json.load(open(os.path.join(out, "config.json")))
    assert cfg["architectures"] == ["BertForPreTraining"] and cfg["model_type"] == "bert"
    assert (cfg["hidden_act"], cfg["layer_norm_eps"], cfg["tie_word_embeddings"]) == ("gelu_pytorch_tanh", 1e-12, True)
    for key, value in json.load(open(CONFIG)).items():
        if key != "hidden_act":
            assert cfg[key] == value, key


def test_bad_hf_outputs_are_one_line_errors(exported, tmp_path):
    _, pt, _ = exported
    base = ["convert_checkpoint.py", "--bert_config_file=" + CONFIG, "--input=" + pt, "--format=hf"]
    with pytest.raises(UserError, match="--format=hf writes a directory, not .*x.pt"):
        checkpoint_convert.main(base + ["--output=%s" % (tmp_path / "x.pt")])
    (tmp_path / "file").write_text("keep")
    with pytest.raises(UserError, match="is a file: --format=hf writes a directory"):
        checkpoint_convert.main(base + ["--output=%s" % (tmp_path / "file")])
    assert (tmp_path / "file").read_text() == "keep"


@pytest.mark.slow
def test_hugging_face_loads_the_export_and_computes_our_logits(exported):
    """Issue 47 (13): transformers' BertForPreTraining.from_pretrained(DIR) loads every weight
    (nothing missing, unexpected or mismatched; the decoder tied) and gives our MLM logits at the
    masked positions and our NSP logits, on rows with padding and both segments. Both sides compute
    in fp32: assert_close's fp32 tolerance (rtol 1.3e-6, atol 1e-5), a few roundings of a different
    kernel order; erf GELU for tanh GELU, a dropped bias or swapped weights are far outside it."""
    transformers = pytest.importorskip("transformers", reason="transformers is not installed (make hf)")
    model, _, out = exported
    hf, info = transformers.BertForPreTraining.from_pretrained(out, output_loading_info=True)
    assert {k: v for k, v in info.items() if v} == {}
    hf.eval()
    assert hf.cls.predictions.decoder.weight.data_ptr() == hf.bert.embeddings.word_embeddings.weight.data_ptr()
    cfg, g = model.config, torch.Generator().manual_seed(1)
    b, t, p = 4, 32, 5
    ids = torch.randint(0, cfg.vocab_size, (b, t), generator=g)
    segments = (torch.arange(t) >= 12).long().expand(b, t).clone()
    mask = torch.ones(b, t, dtype=torch.long)
    mask[1, 20:] = 0
    mask[3, 9:] = 0
    positions = torch.randint(1, 9, (b, p), generator=g)  # inside every row's real tokens
    with torch.no_grad():
        _, (mlm, nsp) = model(ids, segments, mask, positions, torch.zeros_like(positions), torch.ones(b, p),
                              torch.tensor([0, 1, 0, 1]), return_logits=True)
        theirs = hf(input_ids=ids, token_type_ids=segments, attention_mask=mask)
    at_masked = theirs.prediction_logits[torch.arange(b)[:, None], positions].reshape(-1, cfg.vocab_size)
    torch.testing.assert_close(at_masked, mlm)
    torch.testing.assert_close(theirs.seq_relationship_logits, nsp)


def test_an_export_stopped_over_an_earlier_one_leaves_no_config(exported, tmp_path, monkeypatch):
    """A hostile sweep: over an earlier export, the new model.safetensors was renamed in before the old
    config.json was replaced; a stop in between left the new weights beside the old config, a
    directory that looks complete (its config.json is written last for that). The old config goes
    first now."""
    model, pt, out = exported
    again = str(tmp_path / "hf")
    argv = ["convert_checkpoint.py", "--bert_config_file=" + CONFIG, "--input=" + pt, "--output=" + again,
            "--format=hf"]
    assert checkpoint_convert.main(argv) == 0
    assert sorted(os.listdir(again)) == ["config.json", "model.safetensors"]

    def stopped(*a, **k):
        raise KeyboardInterrupt  # as a Ctrl-C between the weights and the config
    monkeypatch.setattr(checkpoint_convert, "write_json", stopped)
    with pytest.raises(KeyboardInterrupt):
        checkpoint_convert.main(argv)
    assert os.listdir(again) == ["model.safetensors"]


def test_a_tf_output_that_is_a_folder_is_refused(exported, tmp_path):
    """A hostile sweep: convert_checkpoint.py --output=DIR/ (TF format, the default for a name
    without .pt) wrote DIR.index and DIR.data-00000-of-00001 beside the folder, exit 0 (and
    checkpoint_add_gradacc.py --new=DIR/ the same: one writer of TF checkpoints)."""
    model, pt, out = exported
    folder = tmp_path / "tfdir"
    for output in (str(folder) + "/", str(folder)):
        folder.mkdir(exist_ok=True)
        with pytest.raises(UserError) as e:
            checkpoint_convert.main(["convert_checkpoint.py", "--bert_config_file=" + CONFIG, "--input=" + pt,
                                     "--output=" + output])
        assert str(e.value) == ("%s is a directory: a TF checkpoint is written at a prefix, e.g. %s (its .index "
                                "and .data-* files)" % (output, folder / "model.ckpt-N"))
    assert os.listdir(tmp_path) == ["tfdir"] and os.listdir(folder) == []


def test_an_export_over_its_own_bert_config_is_refused(exported, tmp_path):
    """A hostile sweep: --bert_config_file=DIR/config.json --format=hf --output=DIR removed that
    config.json and wrote Hugging Face's in its place, exit 0: the input was gone, and the file left
    is no bert_config.json ("unknown key 'architectures'"). An output that is an input is refused."""
    _, pt, _ = exported
    d = tmp_path / "run"
    d.mkdir()
    config = d / "config.json"
    config.write_bytes(open(CONFIG, "rb").read())
    with pytest.raises(UserError) as e:
        checkpoint_convert.main(["convert_checkpoint.py", "--bert_config_file=%s" % config, "--input=" + pt,
                                 "--output=%s" % d, "--format=hf"])
    assert str(e.value) == ("--output %s is the input %s: writing it would destroy the input; give another output "
                            "path" % (config, config))
    assert os.listdir(d) == ["config.json"] and config.read_bytes() == open(CONFIG, "rb").read()
