"""bert_config.json holds exactly the reference's keys: a missing or misspelt key is an error
naming it (issue 16.6: a 2-layer config with `num_hidden_layer` trained 24 layers)."""
import json
import os

import pytest

from mlperf_bert.errors import UserError
from mlperf_bert.trainer.config import BertConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = os.path.join(ROOT, "configs", "bert_config_demo.json")


def write(tmp_path, d):
    path = str(tmp_path / "bert_config.json")
    with open(path, "w") as f:
        json.dump(d, f)
    return path


def demo():
    with open(DEMO) as f:
        return json.load(f)


def test_shipped_configs_load_as_written():
    for name in ("bert_config_demo.json", "bert_config_large.json"):
        path = os.path.join(ROOT, "configs", name)
        with open(path) as f:
            assert BertConfig.from_json_file(path).to_dict() == json.load(f)


def test_misspelt_key_is_an_error_with_the_closest_name(tmp_path):
    d = demo()
    d["num_hidden_layer"] = d.pop("num_hidden_layers")
    with pytest.raises(UserError) as e:
        BertConfig.from_json_file(write(tmp_path, d))
    assert str(e.value) == ("BERT config %s: unknown key 'num_hidden_layer' (did you mean 'num_hidden_layers'?); "
                            "the keys are those of the reference bert_config.json" % (tmp_path / "bert_config.json"))


def test_unknown_key_without_a_close_name(tmp_path):
    with pytest.raises(UserError, match="unknown key 'use_fp16'; the keys"):
        BertConfig.from_json_file(write(tmp_path, dict(demo(), use_fp16=True)))


def test_missing_keys_are_named_not_defaulted_to_bert_large(tmp_path):
    d = demo()
    del d["hidden_size"], d["intermediate_size"]
    with pytest.raises(UserError, match=r"bert_config.json lacks hidden_size, intermediate_size: give every key"):
        BertConfig.from_json_file(write(tmp_path, d))


@pytest.mark.parametrize("key, value, allowed", [
    ("hidden_dropout_prob", 1.5, "in [0, 1)"),
    ("hidden_dropout_prob", 1, "in [0, 1)"),
    ("attention_probs_dropout_prob", -0.1, "in [0, 1)"),
    ("attention_probs_dropout_prob", float("nan"), "in [0, 1)"),
    ("initializer_range", 0, "finite and > 0"),
    ("initializer_range", -0.02, "finite and > 0"),
    ("initializer_range", float("nan"), "finite and > 0"),
    ("initializer_range", float("inf"), "finite and > 0"),
    ("type_vocab_size", 1, ">= 2"),
])
def test_out_of_range_values_are_one_line_errors(tmp_path, key, value, allowed):
    """Were torch tracebacks (dropout), ZeroDivisionError (initializer_range) or a later IndexError (segment id 1)."""
    path = write(tmp_path, dict(demo(), **{key: value}))
    with pytest.raises(UserError) as e:
        BertConfig.from_json_file(path)
    assert str(e.value) == "BERT config %s: %s must be %s, got %r" % (path, key, allowed, value)


def test_a_config_nested_past_the_json_parser_is_one_line(tmp_path):
    """A hostile sweep: a bert_config.json of 100,000 '[' was a RecursionError traceback at the start."""
    path = tmp_path / "bert_config.json"
    path.write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(UserError) as e:
        BertConfig.from_json_file(str(path))
    assert str(e.value) == "BERT config %s is not valid JSON: JSON nested too deeply" % path


def test_zero_dropout_is_accepted(tmp_path):
    assert BertConfig.from_json_file(write(tmp_path, dict(demo(), hidden_dropout_prob=0.0))).hidden_dropout_prob == 0


@pytest.mark.parametrize("key", ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                                 "intermediate_size", "max_position_embeddings"])
def test_sizes_must_be_positive(tmp_path, key):
    path = write(tmp_path, dict(demo(), **{key: 0}))
    with pytest.raises(UserError) as e:
        BertConfig.from_json_file(path)
    assert str(e.value) == "BERT config %s: %s must be a positive int, got 0" % (path, key)


def test_hidden_act_takes_the_reference_names_in_any_case_and_linear(tmp_path):
    """The reference's modeling.get_activation lowercases hidden_act and takes "linear" (and "")
    for no activation: a config it runs with "GELU", "Relu" or "linear" was refused here. They load
    as the reference reads them (its TF model, run beside ours on one checkpoint, gives the same
    loss for each); another name is one line naming it."""
    import torch
    from mlperf_bert.trainer.checkpoint_convert import hf_config
    from mlperf_bert.trainer.model import BertForPreTraining
    for given, read in (("GELU", "gelu"), ("Relu", "relu"), ("TANH", "tanh"), ("linear", "linear"), ("", "linear")):
        cfg = BertConfig.from_json_file(write(tmp_path, dict(demo(), hidden_act=given)))
        assert cfg.hidden_act == read and cfg.to_dict()["hidden_act"] == read
    assert hf_config(cfg)["hidden_act"] == "linear"
    layer = BertForPreTraining(cfg).bert.encoder.layer[0]
    x = torch.randn(2, 3)
    assert torch.equal(layer.act(x), x)
    with pytest.raises(UserError, match=r"hidden_act 'Swish' is not one of gelu, relu, tanh, linear"):
        BertConfig.from_json_file(write(tmp_path, dict(demo(), hidden_act="Swish")))
