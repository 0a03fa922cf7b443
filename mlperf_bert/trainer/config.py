"""bert_config.json, with exactly the reference's keys (a missing or misspelt key is an error,
never a silent BERT-Large default)."""
import dataclasses
import difflib
import json
import math

from mlperf_bert.errors import UserError
from mlperf_bert.fileio import load_json, open_input

HIDDEN_ACTS = ("gelu", "relu", "tanh", "linear")  # the activations model.py implements


@dataclasses.dataclass
class BertConfig:
    vocab_size: int = 30522
    hidden_size: int = 1024
    num_hidden_layers: int = 24
    num_attention_heads: int = 16
    intermediate_size: int = 4096
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02

    def __post_init__(self):
        if isinstance(self.hidden_act, str):  # the reference's names (modeling.get_activation): any case, "" linear
            self.hidden_act = self.hidden_act.lower() or "linear"

    @classmethod
    def from_dict(cls, d):
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})

    @classmethod
    def from_json_file(cls, path, max_seq_length=None):
        """The config at ``path``, checked (and, given ``max_seq_length``, that it has positions for it)."""
        try:
            with open_input(path, encoding="utf-8", what="BERT config", fix="give the bert_config.json") as f:
                d = load_json(f)
        except OSError as e:
            raise UserError("cannot read BERT config %s: %s" % (path, e.strerror))
        except ValueError as e:
            raise UserError("BERT config %s is not valid JSON: %s" % (path, e))
        if not isinstance(d, dict):
            raise UserError("BERT config %s must be a JSON object of the bert_config.json keys" % path)
        known = [f.name for f in dataclasses.fields(cls)]
        for k in sorted(set(d) - set(known)):
            close = difflib.get_close_matches(k, known, n=1)
            raise UserError("BERT config %s: unknown key %r%s; the keys are those of the reference "
                            "bert_config.json" % (path, k, " (did you mean %r?)" % close[0] if close else ""))
        missing = [k for k in known if k not in d]
        if missing:
            raise UserError("BERT config %s lacks %s: give every key of the reference bert_config.json "
                            "(BERT-Large: configs/bert_config_large.json)" % (path, ", ".join(missing)))
        for f in dataclasses.fields(cls):
            v = d[f.name]
            want = (int, float) if f.type is float else f.type
            if isinstance(v, bool) or not isinstance(v, want) or (f.type is int and v <= 0):
                raise UserError("BERT config %s: %s must be a %s, got %r"
                                % (path, f.name, "positive int" if f.type is int else f.type.__name__, v))
        cfg = cls.from_dict(d)
        for k in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            if not 0 <= getattr(cfg, k) < 1:  # also refuses NaN; torch raises outside [0, 1], and 1 zeroes all
                raise UserError("BERT config %s: %s must be in [0, 1), got %r" % (path, k, getattr(cfg, k)))
        if not (math.isfinite(cfg.initializer_range) and cfg.initializer_range > 0):
            raise UserError("BERT config %s: initializer_range must be finite and > 0, got %r"
                            % (path, cfg.initializer_range))
        if cfg.type_vocab_size < 2:  # the pretraining data has segment ids 0 and 1
            raise UserError("BERT config %s: type_vocab_size must be >= 2, got %r" % (path, cfg.type_vocab_size))
        if cfg.hidden_act not in HIDDEN_ACTS:
            raise UserError("BERT config %s: hidden_act %r is not one of %s (the reference's names, in any case)"
                            % (path, d["hidden_act"], ", ".join(HIDDEN_ACTS)))
        if cfg.hidden_size % cfg.num_attention_heads:
            raise UserError("BERT config %s: hidden_size %d is not a multiple of num_attention_heads %d"
                            % (path, cfg.hidden_size, cfg.num_attention_heads))
        if max_seq_length is not None and max_seq_length > cfg.max_position_embeddings:
            raise UserError("--max_seq_length=%d exceeds max_position_embeddings=%d of %s"
                            % (max_seq_length, cfg.max_position_embeddings, path))
        return cfg

    def to_dict(self):
        return dataclasses.asdict(self)

    def to_json_string(self):
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"
