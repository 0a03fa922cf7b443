"""convert_checkpoint.py: a .pt checkpoint of this project <-> a TF checkpoint prefix.

A path ending in ``.pt`` is ours; any other path is a TF prefix. Weights are checked
against the BERT config on the way; ``global_step`` travels both ways.
"""
import logging

import torch

from mlperf_bert import flags
from mlperf_bert.trainer import tf_checkpoint
from mlperf_bert.errors import UserError
from mlperf_bert.trainer.config import BertConfig
from mlperf_bert.fileio import atomic_path
from mlperf_bert.trainer.model import BertForPreTraining


def convert(bert_config_file, src, dst):
    cfg = BertConfig.from_json_file(bert_config_file)
    with torch.device("meta"):  # weights come from the checkpoint: skip the random init
        model = BertForPreTraining(cfg)
    info = tf_checkpoint.load_init_checkpoint(model, src, carried=("global_step",))  # written to dst
    step = info["global_step"]
    if dst.endswith(".pt"):
        ckpt = {"model": model.state_dict(), "config": cfg.to_dict()}
        if step is not None:
            ckpt["global_step"] = int(step)
        with atomic_path(dst) as tmp:
            torch.save(ckpt, tmp)
    else:
        tf_checkpoint.save_tf_checkpoint(model, dst, global_step=step)
    return info


def main(argv):
    fv = flags.FlagValues()
    flags.DEFINE_string("bert_config_file", None, "bert_config.json of the model", flag_values=fv)
    flags.DEFINE_string("input", None, "checkpoint to read: a .pt file or a TF prefix", flag_values=fv)
    flags.DEFINE_string("output", None, "checkpoint to write: a .pt file or a TF prefix", flag_values=fv)
    flags.parse(fv, argv, required=["bert_config_file", "input", "output"])
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    src, dst = fv.input, fv.output
    if src.endswith(".pt") == dst.endswith(".pt"):
        kind = ".pt" if src.endswith(".pt") else "TF"
        raise UserError("--input and --output are both %s checkpoints: one of them must end in .pt "
                              "and the other be a TF prefix" % kind)
    info = convert(fv.bert_config_file, src, dst)
    print("wrote %s (global_step %s, %d non-model variable(s) dropped)"
          % (dst, info["global_step"], len(info["ignored"])))
    return 0
