"""convert_checkpoint.py: a .pt checkpoint of this project <-> a TF checkpoint prefix, and either
-> a Hugging Face ``BertForPreTraining`` directory (``--format=hf``).

A path ending in ``.pt`` is ours; any other path is a TF prefix. Weights are checked
against the BERT config on the way; ``global_step`` travels both ways (not to Hugging Face,
whose directory has no place for it).
"""
import contextlib
import json
import logging
import os

import torch

from mlperf_bert import flags
from mlperf_bert.trainer import tf_checkpoint
from mlperf_bert.errors import UserError
from mlperf_bert.trainer.config import BertConfig
from mlperf_bert.fileio import (atomic_open, atomic_save, check_writable_dir, new_dirs_removed_on_error,
                                refuse_overwriting_inputs, write_json)
from mlperf_bert.trainer import model as modeling
from mlperf_bert.trainer.model import BertForPreTraining


# model.py's activations by their Hugging Face names: its gelu is the tanh approximation (the
# reference's), which HF's "gelu" (erf) is not; "gelu_pytorch_tanh" is the same torch op.
HF_ACTS = {"gelu": "gelu_pytorch_tanh", "relu": "relu", "tanh": "tanh", "linear": "linear"}


def hf_config(cfg):
    """config.json of Hugging Face's BertForPreTraining for ``cfg`` (model.py's fixed choices included:
    LayerNorm eps, tied decoder, absolute positions)."""
    d = cfg.to_dict()
    d.update(architectures=["BertForPreTraining"], model_type="bert", hidden_act=HF_ACTS[cfg.hidden_act],
             layer_norm_eps=modeling.LN_EPS, tie_word_embeddings=True, pad_token_id=0,
             position_embedding_type="absolute", dtype="float32")
    return d


def write_safetensors(f, tensors):
    """``tensors`` ({name: float32 tensor}) to the binary file ``f`` in the safetensors format: an
    8-byte little-endian header length, a JSON header (each tensor's dtype, shape and byte range;
    the metadata transformers requires: format pt) padded with spaces to 8 bytes, then the
    tensors' bytes (little-endian, row-major) end to end."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, t in tensors.items():
        n = t.numel() * 4
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    f.write(len(text).to_bytes(8, "little"))
    f.write(text)
    for t in tensors.values():
        f.write(t.detach().cpu().contiguous().numpy().astype("<f4", copy=False).tobytes())


def save_hf(model, directory):
    """``directory``/model.safetensors and config.json (written last: a directory with it is
    complete), what ``transformers.BertForPreTraining.from_pretrained(directory)`` loads."""
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise UserError("--output %s is a file: --format=hf writes a directory (config.json, model.safetensors)"
                        % directory)
    check_writable_dir(os.path.join(directory, "config.json"))  # makes the directory
    # over an earlier export: its config.json goes first, so a kill before the new one is written
    # leaves a directory without one (incomplete), not new weights beside the old config
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(directory, "config.json"))
    tensors = {tf_checkpoint.HF_NAMES.get(k, k): v.float() for k, v in model.state_dict().items()}
    with atomic_open(os.path.join(directory, "model.safetensors")) as f:
        write_safetensors(f, tensors)
    write_json(os.path.join(directory, "config.json"), hf_config(model.config), newline=True, indent=2,
               sort_keys=True)


def _files(path, fmt):
    """The files of checkpoint ``path`` (a .pt, a TF prefix, or with ``fmt`` hf an export directory)."""
    if fmt == "hf":
        return [os.path.join(path, "config.json"), os.path.join(path, "model.safetensors")]
    if path.endswith(".pt"):
        return [path]
    return [path + ".index", path + ".data-00000-of-00001"] + tf_checkpoint.shard_files(path)


def convert(bert_config_file, src, dst, fmt="auto"):
    cfg = BertConfig.from_json_file(bert_config_file)
    with torch.device("meta"):  # weights come from the checkpoint: skip the random init
        model = BertForPreTraining(cfg)
    info = tf_checkpoint.load_init_checkpoint(model, src, carried=("global_step",))  # written to dst
    step = info["global_step"]
    if fmt == "hf":
        save_hf(model, dst)
    elif dst.endswith(".pt"):
        ckpt = {"model": model.state_dict(), "config": cfg.to_dict()}
        if step is not None:
            ckpt["global_step"] = int(step)
        # (through a file of ours: torch.save hides a full disk's errno, "unexpected pos ...")
        atomic_save(dst, lambda f: torch.save(ckpt, f))
    else:
        tf_checkpoint.save_tf_checkpoint(model, dst, global_step=step)
    return info


def main(argv):
    fv = flags.FlagValues()
    flags.DEFINE_string("bert_config_file", None, "bert_config.json of the model", flag_values=fv)
    flags.DEFINE_string("input", None, "checkpoint to read: a .pt file or a TF prefix", flag_values=fv)
    flags.DEFINE_string("output", None, "checkpoint to write: a .pt file or a TF prefix; with --format=hf a "
                        "directory", flag_values=fv)
    flags.DEFINE_enum("format", "auto", ["auto", "hf"], "auto: --output's kind by its name (.pt: ours, else a TF "
                      "prefix); hf: a Hugging Face BertForPreTraining directory (config.json, model.safetensors) "
                      "from either kind of --input", flag_values=fv)
    flags.parse(fv, argv, required=["bert_config_file", "input", "output"], positional=False)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    src, dst = fv.input, fv.output
    if fv.format == "hf":
        if dst.endswith(".pt"):
            raise UserError("--format=hf writes a directory, not %s: give --output a directory name" % dst)
    elif src.endswith(".pt") == dst.endswith(".pt"):
        kind = ".pt" if src.endswith(".pt") else "TF"
        raise UserError("--input and --output are both %s checkpoints: one of them must end in .pt "
                              "and the other be a TF prefix" % kind)
    # (the bert_config.json too: --format=hf into its folder replaced a config.json given as it)
    refuse_overwriting_inputs(_files(dst, fv.format), [fv.bert_config_file] + _files(src, "auto"), "--output")
    # a new folder of the output, left empty by an error or a stop, goes with it
    with new_dirs_removed_on_error(dst if fv.format == "hf" else os.path.dirname(os.path.abspath(dst))), \
            tf_checkpoint.output_held(dst, "--output", fv.format == "hf"):
        info = convert(fv.bert_config_file, src, dst, fv.format)
    slots = info.get("optimizer_states", 0)
    print("wrote %s (%sglobal_step %s, %d non-model variable(s) dropped%s)"
          % (dst, "Hugging Face BertForPreTraining; " if fv.format == "hf" else "", info["global_step"],
             len(info["ignored"]), ", the optimizer state of %d parameter(s) not converted" % slots if slots else ""))
    return 0
