"""TF checkpoints in the reference (google BERT) layout: name mapping, reading, writing.

TensorFlow is imported lazily, only by the functions that read or write TF files, so the
rest of the project (and training from a ``.pt``) does not need it; torch too, only by the
functions that make or read tensors, so a TF-to-TF tool (checkpoint_add_gradacc.py) does not
pay its import (~1.6 s of CPU a process).
"""
import collections
import collections.abc
import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import weakref
import zipfile

import numpy as np

from mlperf_bert.errors import FixableError, UserError
from mlperf_bert.fileio import DERIVED_NAME_BYTES, check_writable_dir, pid_alive, refuse_long_name, usable_tempdir

log = logging.getLogger(__name__)

# A TF2 object-based checkpoint stores each variable under this suffix.
TF2_SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"
OBJECT_GRAPH = "_CHECKPOINTABLE_OBJECT_GRAPH"

# Variable names of the TF2 Model Garden BERT (BertEncoder + pre-training heads) -> reference names.
V2_NAMES = [(re.compile(r"(?:^|/)" + a + "$"), b) for a, b in [
    (r"word_embeddings/embeddings", r"bert/embeddings/word_embeddings"),
    (r"type_embeddings/embeddings", r"bert/embeddings/token_type_embeddings"),
    (r"position_embedding/embeddings", r"bert/embeddings/position_embeddings"),
    (r"embeddings/layer_norm/(gamma|beta)", r"bert/embeddings/LayerNorm/\1"),
    (r"transformer/layer_(\d+)/self_attention/(query|key|value)/(kernel|bias)",
     r"bert/encoder/layer_\1/attention/self/\2/\3"),
    (r"transformer/layer_(\d+)/self_attention/attention_output/(kernel|bias)",
     r"bert/encoder/layer_\1/attention/output/dense/\2"),
    (r"transformer/layer_(\d+)/self_attention_layer_norm/(gamma|beta)",
     r"bert/encoder/layer_\1/attention/output/LayerNorm/\2"),
    (r"transformer/layer_(\d+)/intermediate/(kernel|bias)", r"bert/encoder/layer_\1/intermediate/dense/\2"),
    (r"transformer/layer_(\d+)/output/(kernel|bias)", r"bert/encoder/layer_\1/output/dense/\2"),
    (r"transformer/layer_(\d+)/output_layer_norm/(gamma|beta)", r"bert/encoder/layer_\1/output/LayerNorm/\2"),
    (r"pooler_transform/(kernel|bias)", r"bert/pooler/dense/\1"),
    (r"cls/predictions/output_bias/bias", r"cls/predictions/output_bias"),
    (r"predictions/transform/logits/kernel", r"cls/seq_relationship/output_weights"),
    (r"predictions/transform/logits/bias", r"cls/seq_relationship/output_bias"),
]]


# Hugging Face BertForPreTraining's names of the parameters whose names here differ (model.py keeps
# the TF names; HF's nn.Embedding and nn.Linear add ".weight"); every other name is the same. They
# are pytorch-pretrained-BERT's, whose module tree NVIDIA's MLPerf BERT keeps: the HF export writes
# them (checkpoint_convert), and a .pt of NVIDIA's convert_tf_checkpoint.py is read by them.
HF_NAMES = {
    "bert.embeddings.word_embeddings": "bert.embeddings.word_embeddings.weight",
    "bert.embeddings.token_type_embeddings": "bert.embeddings.token_type_embeddings.weight",
    "bert.embeddings.position_embeddings": "bert.embeddings.position_embeddings.weight",
    "cls.predictions.output_bias": "cls.predictions.bias",
    "cls.seq_relationship.output_weights": "cls.seq_relationship.weight",
    "cls.seq_relationship.output_bias": "cls.seq_relationship.bias",
}
# Their MLM decoder (cls.predictions.decoder) is tied to the word embeddings and its bias to
# cls.predictions.bias, as here: HF's export stores neither (config.json's tie_word_embeddings),
# torch.save of NVIDIA's model stores the weight beside the embeddings (one tensor).
HF_TIED = {"cls.predictions.decoder.weight": "bert.embeddings.word_embeddings",
           "cls.predictions.decoder.bias": "cls.predictions.output_bias"}
# Names of NVIDIA's training-time modules, which hold the weights in another layout: its
# run_pretraining.py's BertForPreTrainingSegmented (every checkpoint it writes), fused QKV
# (TransformerEngine, apex's multi-head attention), fused GEMM-GELU.
NVIDIA_FUSED = re.compile(r"^(?:bert_model_segment|heads_only_segment)\.|qkv|multi_head_attention|self_attention\."
                          r"|layernorm_mlp|_extra_state|\.(?:weight|bias)[12]$")


def tf_name(torch_name):
    """Reference TF variable name of a parameter of ``model.BertForPreTraining``."""
    parts = torch_name.split(".")
    out = []
    i = 0
    while i < len(parts):
        p = parts[i]
        if p == "layer" and i + 1 < len(parts) and parts[i + 1].isdigit():
            out.append("layer_%s" % parts[i + 1])
            i += 2
            continue
        out.append(p)
        i += 1
    last = out[-1]
    if len(out) > 1 and out[-2] == "LayerNorm":  # (another name, an older BERT's gamma or a stray buffer: kept,
        out[-1] = {"weight": "gamma", "bias": "beta"}.get(last, last)  # so that the load names it, not a KeyError)
    elif last == "weight":
        out[-1] = "kernel"
    return "/".join(out)


def is_kernel(torch_name):
    """True for nn.Linear weights, stored transposed ([in, out]) in TF."""
    return tf_name(torch_name).endswith("/kernel")


def to_tf_arrays(state_dict):
    """{TF name: float32 ndarray in TF layout} for a model state dict."""
    out = collections.OrderedDict()
    for name, t in state_dict.items():
        a = t.detach().cpu().float().numpy()
        out[tf_name(name)] = np.ascontiguousarray(a.T if is_kernel(name) else a)
    return out


def _import_tf():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")  # silences a startup banner; TF only does I/O here
    # TF's import of keras imports matplotlib, which warned of its cache folder before the tool's own
    # lines where HOME cannot be written (a container run with --user)
    logging.getLogger("matplotlib").setLevel(logging.ERROR)
    # its import (absl's testing module) asks for the temporary folder: none writable (a read-only
    # container) was tempfile's traceback there
    usable_tempdir("TensorFlow, which reads and writes TF checkpoints")
    try:
        import tensorflow as tf
    except ImportError:
        raise UserError("reading or writing TF checkpoints needs tensorflow-cpu: "
                        "pip install -r requirements.txt")
    return tf


def is_tf_prefix(path):
    return os.path.exists(path + ".index")


# the characters of a pattern to TF's file matching (tensorflow/core/platform/file_system_helper.cc kGlobChars)
_TF_GLOB = "*?[\\"
_TF_FILE = re.compile(r"^(?P<prefix>.+)\.(index|meta|data-\d{5}-of-\d{5})\Z")


def _folder_for_tf(folder):
    """(an open descriptor of ``folder``, or None; the name TensorFlow is given for it). TF cannot be
    given by its name a folder with its pattern's characters (it looks for the .index by a glob:
    "/data/ckpt [v1]" found none, "damaged") or beyond ASCII (it encodes a str path as UTF-8, not in
    the file system's encoding: in an ISO-8859-1 locale "é" was "No such file or directory"): such a
    folder goes by its descriptor, which the caller closes when TF is done with it."""
    if not any(c in folder for c in _TF_GLOB) and folder.isascii():
        return None, folder
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    return fd, "/proc/self/fd/%d" % fd


def not_a_prefix(path):
    """The one-line UserError for ``path``, given as a TF checkpoint prefix that is none: one of a
    checkpoint's files (its prefix named), a folder, a file of another kind, or nothing."""
    m = _TF_FILE.match(path)
    if m and is_tf_prefix(m.group("prefix")):
        return UserError("%s is a file of the TF checkpoint %s: give its prefix, %s" % (
            path, m.group("prefix"), m.group("prefix")))
    if os.path.isdir(path):
        # (not a killed write's temporary prefix, _TF_TMP: no checkpoint to give)
        found = sorted(n[:-len(".index")] for n in os.listdir(path) if n.endswith(".index") and not _TF_TMP.match(n))
        return UserError("%s is a directory: give the prefix of a TF checkpoint in it%s" % (
            path, ", e.g. %s" % os.path.join(path, found[-1]) if found else " (it holds none: no .index file)"))
    if os.path.isfile(path):
        return UserError("%s is not a TF checkpoint prefix (no %s.index) nor a .pt of this project: give a .pt it "
                         "wrote (convert_checkpoint.py makes one) or a TF checkpoint prefix such as model.ckpt-28252"
                         % (path, os.path.basename(path)))
    return UserError("TF checkpoint %s not found: give the prefix whose .index file exists (e.g. model.ckpt-28252)"
                     % path)


def _object_graph_names(serialized):
    """{checkpoint key: variable name} from a TF2 object graph (keys kept where names clash)."""
    from tensorflow.core.protobuf import trackable_object_graph_pb2
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(serialized)
    pairs = [(a.checkpoint_key, a.full_name.split(":")[0])
             for node in graph.nodes for a in node.attributes if a.full_name]
    counts = collections.Counter(full for _, full in pairs)
    return {key: full for key, full in pairs if counts[full] == 1}


class LazyCheckpoint(collections.abc.Mapping):
    """The variables of a TF checkpoint, each read only when asked for (checkpoints of 4+ GB)."""

    def __init__(self, prefix, variable_names=False):
        """With ``variable_names``, a TF2 object-based checkpoint's variables are keyed by the
        variable names its object graph records (e.g. ``transformer/layer_0/...``) instead of
        their object paths, and the object graph itself is left out."""
        if not is_tf_prefix(prefix):
            raise not_a_prefix(prefix)
        tf = _import_tf()
        self.prefix = prefix
        fd, folder = _folder_for_tf(os.path.dirname(os.path.abspath(prefix)))
        if fd is not None:  # held open while the data files are read
            weakref.finalize(self, os.close, fd)
        path = prefix if fd is None else os.path.join(folder, os.path.basename(prefix))
        try:
            # the prefix itself: tf.train.load_checkpoint takes a folder of that name (beside its .index) for
            # a folder of checkpoints and loads the one its 'checkpoint' file names, anywhere (../, /abs)
            self.reader = tf.compat.v1.train.NewCheckpointReader(path)
            shapes = self.reader.get_variable_to_shape_map()
            dtypes = self.reader.get_variable_to_dtype_map()
        except (tf.errors.OpError, ValueError) as e:  # (the .index alone is read here; the data, by _read)
            if any(c in os.path.basename(prefix) for c in _TF_GLOB):
                # the prefix's own name is TF's pattern too ("model[1]" matches "model1"): no descriptor helps
                raise UserError("cannot read TF checkpoint %s: TensorFlow reads its name as a file pattern, which "
                                "%s.index does not match; rename the checkpoint's .index and .data-* files to a prefix "
                                "without %s" % (prefix, prefix, " ".join(_TF_GLOB)))
            raise UserError("cannot read TF checkpoint %s (%s): its %s.index is truncated or damaged; copy the "
                            "checkpoint's .index and .data-* files again" % (prefix, str(e).splitlines()[0], prefix))
        self._read_errors = (tf.errors.OpError, IndexError, ValueError, RuntimeError)
        rename = {}
        if variable_names and OBJECT_GRAPH in shapes:
            rename = _object_graph_names(self._read(OBJECT_GRAPH, OBJECT_GRAPH))
            del shapes[OBJECT_GRAPH]
        self.keys_ = {rename.get(k, k): k for k in shapes}
        self.shapes = {n: shapes[k] for n, k in self.keys_.items()}
        self.dtypes = {n: dtypes[k].as_numpy_dtype for n, k in self.keys_.items()}

    def __getitem__(self, name):
        return np.asarray(self._read(self.keys_[name], name))

    def _read(self, key, name):
        try:
            return self.reader.get_tensor(key)
        except self._read_errors as e:  # TF's reader: IndexError for a short data file
            raise UserError("cannot read variable %s of TF checkpoint %s (%s): its data file is truncated or "
                            "damaged; copy the checkpoint's .index and .data-* files again"
                            % (name, self.prefix, str(e).splitlines()[0] if str(e) else type(e).__name__))

    def __iter__(self):
        return iter(sorted(self.shapes))

    def __len__(self):
        return len(self.shapes)

    def nbytes(self, name):
        return int(np.prod(self.shapes[name], dtype=np.int64)) * np.dtype(self.dtypes[name]).itemsize


def _shards(arrays, shard_bytes):
    sizes = getattr(arrays, "nbytes", None)
    shards, size = [[]], 0
    for n in arrays:
        b = sizes(n) if sizes else arrays[n].nbytes
        if shards[-1] and size + b > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(n)
        size += b
    return shards


_TF_TMP = re.compile(r"^(?P<base>.+)\.tmp-(?P<pid>\d+)\.(?:parts|index|data-.*)\Z")


def _remove_stale_temporaries(d, base):
    """What a killed writer of prefix ``base`` left in ``d`` (its shards' folder, its data files:
    GBs of BERT-Large, which the rerun's own would add to); a live writer's is kept."""
    for n in os.listdir(d):
        m = _TF_TMP.match(n)
        if m and m.group("base") == base and int(m.group("pid")) != os.getpid() and not pid_alive(int(m.group("pid"))):
            path = os.path.join(d, n)
            if os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(path)


def write_tf_checkpoint(arrays, prefix, shard_bytes=1 << 30):
    """Write {name: ndarray} as a TF (V2 format) checkpoint at ``prefix``, atomically.

    ``arrays`` may be lazy (e.g. ``LazyCheckpoint``, with ``nbytes(name)``): values are read
    one data shard of about ``shard_bytes`` at a time, so memory stays bounded; several
    shards are merged into one checkpoint (data-0000i-of-0000N files), as TF's sharded Saver does.
    """
    if not prefix:  # os.path.abspath("") is the working folder: its files went beside it
        raise UserError("an empty path is not a TF checkpoint prefix: give one, e.g. model.ckpt-28252")
    # (a last part . or .. names a folder too: ck/.. went above the working folder, as ck/../../NAME.index)
    if prefix.endswith(os.sep) or os.path.basename(prefix) in (".", "..") or os.path.isdir(prefix):
        raise UserError("%s is a directory: a TF checkpoint is written at a prefix, e.g. %s (its .index and "
                        ".data-* files)" % (prefix, os.path.join(prefix.rstrip(os.sep) or os.sep, "model.ckpt-N")))
    tf = _import_tf()
    check_writable_dir(prefix)
    d, base = os.path.split(os.path.abspath(prefix))
    _remove_stale_temporaries(d, base)
    tmp = "%s.tmp-%d" % (base, os.getpid())
    parts = os.path.join(d, tmp + ".parts")
    fd, tf_d = _folder_for_tf(d)  # the folder as TF's writes are given it
    try:
        shards = _shards(arrays, shard_bytes)
        targets = [os.path.join(tf_d, tmp)] if len(shards) == 1 else [
            os.path.join(tf_d, tmp + ".parts", "part-%05d" % i) for i in range(len(shards))]
        try:
            for target, names in zip(targets, shards):
                tf.raw_ops.SaveV2(prefix=target, tensor_names=names, shape_and_slices=[""] * len(names),
                                  tensors=[tf.convert_to_tensor(arrays[n]) for n in names])
            if len(shards) > 1:
                tf.raw_ops.MergeV2Checkpoints(checkpoint_prefixes=targets, destination_prefix=os.path.join(tf_d, tmp),
                                              delete_old_dirs=True)
        except tf.errors.OpError as e:  # TF's own write error (a full disk: ResourceExhaustedError), a traceback
            why = (e.message or type(e).__name__).strip().splitlines()[0]
            raise UserError("cannot write %s: %s" % (prefix, "no space left on device: free space, then rerun the "
                                                     "same command" if "No space left" in why else why))
        # Data first, index last: a prefix whose .index exists is complete. Over an older checkpoint
        # its .index goes first (a stop between the renames left old index beside new data, a prefix
        # that looked complete), and its data shards of another count after.
        files = [f for f in os.listdir(d) if f.startswith(tmp + ".") and f != tmp + ".parts"]
        if os.path.exists(os.path.join(d, base + ".index")):
            os.remove(os.path.join(d, base + ".index"))
        for f in sorted(files, key=lambda f: f.endswith(".index")):
            os.replace(os.path.join(d, f), os.path.join(d, base + f[len(tmp):]))
        written = {base + f[len(tmp):] for f in files}
        for f in shard_files(os.path.join(d, base)):
            if os.path.basename(f) not in written:
                os.remove(f)
    except BaseException:
        for f in os.listdir(d):
            if f.startswith(tmp + ".") and f != tmp + ".parts":
                os.remove(os.path.join(d, f))
        shutil.rmtree(parts, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(parts, ignore_errors=True)
        if fd is not None:
            os.close(fd)


def save_tf_checkpoint(model_or_state_dict, prefix, global_step=None, extra=None):
    """Save model weights under their reference names, plus ``global_step`` if given and
    ``extra`` {TF name: array} (e.g. ``BertOptimizer.slot_arrays()``)."""
    import torch
    sd = model_or_state_dict
    if isinstance(sd, torch.nn.Module):
        sd = sd.state_dict()
    arrays = to_tf_arrays(sd)
    arrays.update(extra or {})
    if global_step is not None:
        arrays["global_step"] = np.asarray(global_step, dtype=np.int64)
    write_tf_checkpoint(arrays, prefix, shard_bytes=float("inf"))  # in memory already: one data file


def _canonical(name):
    """Reference name of a checkpoint variable (TF1 name, TF2 object path or TF2 variable name)."""
    if name.endswith(TF2_SUFFIX):
        name = name[:-len(TF2_SUFFIX)]
    for pattern, ref in V2_NAMES:
        m = pattern.search(name)
        if m:
            return m.expand(ref)
    m = re.search(r"(?:^|/)((?:bert|cls)/(?:embeddings|encoder|pooler|predictions|seq_relationship)/.*)$", name)
    return m.group(1) if m else name


def _heads(tname, a):
    """The attention heads a TF2 (Model Garden) layout of ``tname`` holds, or None: its query, key and
    value kernels are [hidden, heads, head_dim], their biases [heads, head_dim], the output's kernel
    [heads, head_dim, hidden] (the reference's: [hidden, hidden] and [hidden], no heads)."""
    if "/attention/self/" in tname and a.ndim == (2 if tname.endswith("/bias") else 3):
        return a.shape[1] if a.ndim == 3 else a.shape[0]
    if tname.endswith("/attention/output/dense/kernel") and a.ndim == 3:
        return a.shape[0]
    return None


def _fit(tname, a, shape):
    """TF2 layouts that hold the same numbers in another shape, brought to the reference's."""
    if a.shape == shape:
        return a
    if "/attention/" in tname and a.size == int(np.prod(shape)):
        return a.reshape(shape)  # [hidden, heads, head_dim] and friends: same row-major order
    if tname == "cls/seq_relationship/output_weights" and a.shape == shape[::-1]:
        return a.T
    return a


def _summarize(names):
    """Short description of ignored variables: counts per trailing component."""
    groups = collections.Counter(n.rsplit("/", 1)[-1] if "/" in n else n for n in names)
    return ", ".join("%d x %s" % (c, g) for g, c in sorted(groups.items()))


_LAYER = re.compile(r"^bert/encoder/layer_(\d+)/")


def _layer_count(names):
    return 1 + max((int(m.group(1)) for m in map(_LAYER.match, names) if m), default=-1)


def _layers_beyond(canonical_names, wanted):
    """The highest encoder layer of the checkpoint past the model's (0 when none is)."""
    have, count = _layer_count(canonical_names), _layer_count(wanted)
    return have - 1 if have > count else 0


def load_state_from_arrays(model, arrays, source, carried=()):
    """Copy reference-named arrays into ``model``; return the names that were not used, less
    ``carried`` (names the caller reads itself, e.g. a converter's ``global_step``), so the one
    line logged here and the caller's count are of the same variables."""
    import torch
    sd = model.state_dict()
    wanted = {tf_name(pname) for pname in sd}
    by_name = {}
    for n in arrays:  # values are read only for the model's variables (arrays may be lazy)
        tname = _canonical(n)
        if tname in by_name and tname in wanted and not np.array_equal(arrays[by_name[tname]], arrays[n]):
            # e.g. an optimizer's slot named as its weight ("Adam/m/word_embeddings/embeddings"):
            # which of the two was taken depended on their sort order
            raise UserError("checkpoint %s: variables %s and %s both read as the model's %s, with other values: "
                            "give a checkpoint of the weights alone (the reference's layout)"
                            % (source, by_name[tname], n, tname))
        by_name.setdefault(tname, n)
    deeper = _layers_beyond(by_name, wanted)
    if deeper:  # its other variables load, and the layers past the config's would be dropped unseen
        raise UserError("checkpoint %s holds encoder layer %d, the model (--bert_config_file) has %d layers: give the "
                        "bert_config.json this checkpoint was made with" % (source, deeper, _layer_count(wanted)))
    missing, misshaped, new = [], [], {}
    used = set()
    for pname, p in sd.items():
        tname = tf_name(pname)
        if tname not in by_name:
            missing.append(tname)
            continue
        orig = by_name[tname]
        a = np.asarray(arrays[orig])
        if a.dtype.kind not in "fiub":  # bfloat16 (ml_dtypes'), which torch.from_numpy does not take
            a = a.astype(np.float32)
        used.add(orig)
        want = tuple(p.shape[::-1]) if is_kernel(pname) else tuple(p.shape)
        heads, have = _heads(tname, a), getattr(getattr(model, "config", None), "num_attention_heads", None)
        if heads is not None and have is not None and heads != have and a.size == int(np.prod(want)):
            # the same numbers reshaped would load, split into other heads: another model
            raise UserError("checkpoint %s: variable %s %s holds %d attention heads, the model (--bert_config_file) has "
                            "%d: give the bert_config.json this checkpoint was made with"
                            % (source, orig, list(a.shape), heads, have))
        a = _fit(tname, a, want)
        if tuple(a.shape) != want:
            misshaped.append("%s %s (model expects %s)" % (tname, list(a.shape), list(want)))
            continue
        new[pname] = torch.from_numpy(np.ascontiguousarray(a.T if is_kernel(pname) else a)).to(p.dtype)
    if missing:
        raise UserError("checkpoint %s lacks %d model variable(s), e.g. %s: use a checkpoint of this "
                        "BERT model or the matching bert_config.json" % (source, len(missing), missing[0]))
    if misshaped:
        raise UserError("checkpoint %s: variable %s; use the bert_config.json this checkpoint was made "
                        "with" % (source, misshaped[0]))
    # A model built on the meta device (converters: no pointless random init) takes the
    # loaded tensors as they are; a real model keeps its parameters (device, dtype).
    model.load_state_dict(new, assign=any(p.is_meta for p in sd.values()))
    ignored = [n for n in arrays if n not in used and n not in carried]
    if ignored:
        log.info("checkpoint %s: ignored %d non-model variable(s): %s", source, len(ignored),
                 _summarize(ignored))
    return ignored


def refuse_existing_output(path, flag, hf=False):
    """One line when the checkpoint to write, ``path`` (a TF prefix, a .pt file, with ``hf`` an export
    folder), is a checkpoint there already, or a TF checkpoint's prefix: written over, it was lost
    without a word (the official model.ckpt-28252, given as --output by a swapped command), and an
    export folder at a TF prefix hid that checkpoint from every reader ("Couldn't find 'checkpoint'
    file"). An earlier export, made from a checkpoint kept elsewhere, is replaced (checkpoint_convert),
    and so are the data shards of a write stopped before its .index (no checkpoint: its rerun goes on)."""
    # where the writers put it (os.path.abspath: gone/../ck/m is ck/m, where the kernel finds no gone/),
    # else a checkpoint there was written over unseen
    where = os.path.abspath(path)
    held = [s for s in [".index"] + [""] * (not hf and path.endswith(".pt")) if os.path.lexists(where + s)]
    if held:
        shown = (path if os.path.normpath(path) == path else where) + held[0]
        raise UserError("%s=%s: %s is there: writing over it would lose that checkpoint; give another path, or remove "
                        "it first" % (flag, path, shown))


@contextlib.contextmanager
def output_held(path, flag, hf=False):
    """The checkpoint ``path`` to write, locked (``.NAME.lock`` beside it) from refuse_existing_output's
    look until the write's end: two commands writing one prefix at once both passed the look, their
    renames interleaved, and each removed the other's data shards, leaving a mixture or an .index
    alone that no reader could load, while both said "wrote" (a sweep). The second is one line."""
    from mlperf_bert import locking
    refuse_in_trainer_dir(path, flag, hf)  # before its lock file: nothing of ours goes into a trainer's folder
    if not hf and not path.endswith(".pt"):  # a TF prefix: its longest name is TensorFlow's temporary of a shard's
        refuse_long_name(path, flag, DERIVED_NAME_BYTES + len(".data-00000-of-00001.tempstate18446744073709551615"),
                         "NAME.tmp-PID.data-00000-of-00001.tempstateN, TensorFlow's temporary of its data")
    with locking.lock_file(path, "output checkpoint"):
        refuse_existing_output(path, flag, hf)
        yield


def refuse_in_trainer_dir(path, flag, hf=False):
    """One line when the checkpoint to write lies in a folder a running trainer holds (its --output_dir,
    locked by lock_dir for the run): its own lock is the file's, not the folder's, so it was written there,
    and the trainer's rotation or a resume would take model.ckpt-99.pt as the run's own (a sweep)."""
    from mlperf_bert import locking
    where = os.path.abspath(path)
    for d in [os.path.dirname(where)] + [where] * hf:  # an export folder may be that folder itself
        holder = locking.dir_holder(d)
        if holder:
            raise UserError("%s=%s: %s is the --output_dir of a running trainer (%s): a checkpoint written there "
                            "would be taken by its rotation or a resume as the run's own; write it to another "
                            "folder, or wait for that run to end" % (flag, path, d, holder))


def shard_files(prefix):
    """The data shards of TF prefix ``prefix`` there now (PREFIX.data-NNNNN-of-NNNNN), sorted: not a
    user's copy beside them (PREFIX.data-00000-of-00001.bak), which a rewrite keeps and a fingerprint
    leaves out."""
    d, base = os.path.split(prefix)
    shard = re.compile(re.escape(base) + r"\.data-\d{5}-of-\d{5}\Z")
    try:
        names = os.listdir(d or ".")
    except OSError:
        return []
    return sorted(os.path.join(d, n) for n in names if shard.match(n))


def fingerprint(path):
    """[absolute path, bytes, sha256] of a checkpoint, cheap for files of gigabytes: the sha256 of
    a .pt's zip directory (every entry's name, size and CRC-32) or of a TF prefix's .index (which
    holds every tensor's CRC-32C), and the bytes of all its files. Missing or damaged: one line."""
    files = [path]
    if path.endswith(".pt"):
        load_what = "--init_checkpoint %s" % path
        if os.path.isdir(path):
            raise UserError("%s is a directory: give a .pt file written by this project" % load_what)
        if not os.path.isfile(path):
            raise UserError("%s not found: give an existing .pt or TF checkpoint prefix" % load_what)
        try:
            with zipfile.ZipFile(path) as z:
                entries = [[i.filename, i.file_size, i.CRC] for i in z.infolist()]
        except (zipfile.BadZipFile, OSError) as e:
            raise UserError("%s is truncated or not a PyTorch (.pt) file (%s): copy it again, or give a .pt "
                            "written by this project or a TF checkpoint prefix" % (load_what, e))
        digest = hashlib.sha256(json.dumps(entries).encode()).hexdigest()
    else:
        if not is_tf_prefix(path):
            raise not_a_prefix(path)
        files = [path + ".index"] + shard_files(path)
        with open(files[0], "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
    return [os.path.abspath(path), sum(os.path.getsize(f) for f in files), digest]


def step_problem(step):
    """What is wrong with a checkpoint's ``global_step`` (this trainer writes an int >= 0), or None."""
    if type(step) is int:  # (not a bool, which is an int to isinstance)
        return None if step >= 0 else "global_step %d, below 0" % step
    shown = " ".join(repr(step).split())  # (a tensor's repr has several lines)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return "global_step %s, %s" % (shown, "no value" if step is None else "a %s" % type(step).__name__)


def load_pt(path):
    """The dict of a ``.pt`` checkpoint of this project (``{"model": state_dict, ...}``). A file that is
    not one, or is damaged, is a FixableError (its reason names the file: a resume words the way on)."""
    if os.path.isdir(path):
        raise FixableError("checkpoint %s is a directory" % path, "give a .pt file written by this project")
    if not os.path.isfile(path):
        raise UserError("checkpoint %s not found" % path)
    if not zipfile.is_zipfile(path):
        with open(path, "rb") as f:
            cut = f.read(4) == b"PK\x03\x04"  # torch.save's zip begun, its directory (at the end) missing
        if cut:
            raise FixableError("checkpoint %s is truncated (%s bytes): it begins as a PyTorch .pt, but the end of its "
                               "zip archive is missing" % (path, format(os.path.getsize(path), ",")),
                               "give a whole copy (a copy or transfer cut short leaves one so)")
        raise FixableError("checkpoint %s is not a PyTorch (.pt) file" % path,
                           "give a .pt written by this project or a TF checkpoint prefix")
    try:  # torch.load checks no CRC: damaged bytes of a tensor would load as the values they now read
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
            names = z.namelist()
    except Exception as e:  # a damaged directory or header: zipfile raises several kinds
        raise FixableError("checkpoint %s is damaged (%s)" % (path, str(e)[:200]), "give an undamaged copy")
    if bad is not None:
        raise FixableError("checkpoint %s is damaged: its entry %s fails its CRC-32" % (path, bad),
                           "give an undamaged copy")
    if not any(n.endswith("/data.pkl") or n == "data.pkl" for n in names):  # (torch.save's archive holds one;
        # torch.load said "[enforce fail at inline_container.cc:180] ." of another zip)
        raise FixableError("checkpoint %s is a zip archive, not one torch.save wrote (no data.pkl in it)" % path,
                           "give a .pt written by this project or a TF checkpoint prefix")
    import torch
    try:
        with open(path, "rb") as f:
            # torch's mmap opens a str path encoded as UTF-8, not in the file system's encoding: in an
            # ISO-8859-1 locale a checkpoint under "é" was "No such file" (and called lost). Beyond
            # ASCII the path goes by this open descriptor.
            name = path if os.fspath(path).isascii() else "/proc/self/fd/%d" % f.fileno()
            # mmap: the tensors stay in the page cache until copied where they go (a BERT-Large
            # checkpoint with LAMB state is 4 GB, which rank 0 would otherwise hold twice on resume)
            ckpt = torch.load(name, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # torch raises many kinds for a corrupt file
        raise UserError("cannot read checkpoint %s: %s" % (path, str(e).split(". ")[0][:200]))
    if not isinstance(ckpt, dict) or "model" not in ckpt:
        raise UserError("checkpoint %s is not a checkpoint of this project (no 'model' key)" % path)
    return ckpt


# What a .pt's weights mean beside their shapes: another number of heads or activation computes
# other numbers from the same tensors (dropout and the init's range do not change the weights).
SAME_MEANING = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                "hidden_act", "max_position_embeddings", "type_vocab_size")


def _check_saved_config(path, saved, config):
    """A .pt that records its model's config (this project's do) loads only into that model."""
    if not isinstance(saved, dict) or config is None:
        return
    other = ["%s=%r (--bert_config_file: %r)" % (k, saved[k], getattr(config, k)) for k in SAME_MEANING
             if k in saved and saved[k] != getattr(config, k)]
    if other:
        raise UserError("checkpoint %s was saved from a model with %s: use the bert_config.json it was made with"
                        % (path, ", ".join(other)))


def _from_hf_names(weights, model, path):
    """``weights`` in this model's names: a state dict in Hugging Face's (NVIDIA's MLPerf BERT
    convert_tf_checkpoint.py writes one, from the reference's TF checkpoint) renamed, its tied decoder
    dropped, and the zero rows its converter pads the vocabulary with (to a multiple of 8) cut; one of
    ours as it is. A layout that does not map exactly is one line naming the TF prefix to give."""
    import torch
    if weights and all(n.startswith("module.") for n in weights):  # DistributedDataParallel's wrapper
        weights = {n[len("module."):]: t for n, t in weights.items()}
    if any(n in HF_NAMES for n in weights):  # this model's own names (its checks are load_state_from_arrays')
        return weights
    fix = ("give the reference's TF checkpoint prefix (--init_checkpoint=DIR/tf1_ckpt/model.ckpt-28252), which NVIDIA's "
           "convert_tf_checkpoint.py itself reads")
    fused = [n for n in weights if NVIDIA_FUSED.search(n)]
    if fused:
        raise UserError("checkpoint %s holds NVIDIA's MLPerf BERT weights in its training model's fused or renamed "
                        "layout (%s), not one this model reads exactly: %s" % (path, fused[0], fix))
    ours = {hf: own for own, hf in HF_NAMES.items()}
    if not any(n in ours or n in HF_TIED for n in weights):
        return weights
    new = {ours.get(n, n): t for n, t in weights.items()}
    taken = ["Hugging Face's names (NVIDIA's convert_tf_checkpoint.py .pt)"]
    for hf, own in HF_TIED.items():
        if hf in new:
            if own not in new or not torch.equal(new[hf], new[own]):
                raise UserError("checkpoint %s (Hugging Face's names): its %s is not its %s, which this model ties "
                                "it to: %s" % (path, hf, HF_NAMES[own], fix))
            del new[hf]
            taken.append("%s dropped (tied, equal to %s)" % (hf, HF_NAMES[own]))
    sd = model.state_dict()
    vocab = sd["bert.embeddings.word_embeddings"].shape[0]
    emb, bias = new.get("bert.embeddings.word_embeddings"), new.get("cls.predictions.output_bias")
    if emb is not None and bias is not None and vocab % 8 and emb.shape[0] == bias.shape[0] == vocab + 8 - vocab % 8:
        if emb[vocab:].count_nonzero() or bias[vocab:].count_nonzero():  # (trained: the tied decoder's gradient)
            raise UserError("checkpoint %s (Hugging Face's names): its vocabulary is padded to %d and the rows past "
                            "--bert_config_file's %d are not zero, which this model has no place for: %s"
                            % (path, emb.shape[0], vocab, fix))
        new["bert.embeddings.word_embeddings"], new["cls.predictions.output_bias"] = emb[:vocab], bias[:vocab]
        taken.append("%d zero rows of vocabulary padding (%d -> %d) dropped" % (emb.shape[0] - vocab, emb.shape[0],
                                                                                 vocab))
    known = {tf_name(n) for n in sd}
    unknown = [n for n in new if tf_name(n) not in known]
    if unknown:
        raise UserError("checkpoint %s (Hugging Face's names) holds %d tensor(s) this model has no place for, e.g. %s: "
                        "%s" % (path, len(unknown), unknown[0], fix))
    log.info("checkpoint %s: %s", path, "; ".join(taken))
    return new


def load_init_checkpoint(model, path, carried=()):
    """Load weights from a TF prefix (TF1 or TF2) or a ``.pt``; return {"global_step", "ignored"}
    (``carried``: variables the caller keeps, neither logged nor returned as ignored)."""
    import torch
    if path.endswith(".pt"):
        ckpt = load_pt(path)
        weights = ckpt["model"]
        if not isinstance(weights, dict) or not all(isinstance(v, torch.Tensor) for v in weights.values()):
            # (another project's {"model": ...}: an AttributeError traceback at the first value)
            raise UserError("checkpoint %s is not a checkpoint of this project (its 'model' is not a dict of "
                            "tensors): give a .pt written by this project or a TF checkpoint prefix" % path)
        _check_saved_config(path, ckpt.get("config"), getattr(model, "config", None))
        arrays = to_tf_arrays(_from_hf_names(weights, model, path))
        ignored = load_state_from_arrays(model, arrays, path, carried)
        step = ckpt.get("global_step")
        problem = step is not None and step_problem(step)
        if problem:  # (convert_checkpoint.py wrote it into the TF checkpoint, or a ValueError traceback)
            raise UserError("checkpoint %s holds %s, not a step count (a whole number >= 0, which the trainer "
                            "writes): give a .pt written by this project" % (path, problem))
        # a training checkpoint's optimizer state (LAMB's moments, a parameter each): not the weights, and
        # not read; counted, as a TF checkpoint's adam_m and adam_v are (ignored)
        optimizer = ckpt.get("optimizer")
        state = optimizer.get("state") if isinstance(optimizer, dict) else None
        return {"global_step": step, "ignored": ignored, "optimizer_states": len(state) if isinstance(state, dict) else 0}
    arrays = LazyCheckpoint(path, variable_names=True)
    ignored = load_state_from_arrays(model, arrays, path, carried)
    step = arrays["global_step"] if "global_step" in arrays.shapes else None
    if step is not None:  # TF's is a scalar int64: anything else was a traceback (int()) or taken cut (28.7: 28)
        step = step.item() if step.ndim == 0 else step.tolist()
        problem = step_problem(step)
        if problem:  # (or the converter wrote it into a .pt that every reader then refused)
            raise UserError("TF checkpoint %s holds %s, not a step count (a whole number >= 0, a scalar int64 in "
                            "the reference's): give the reference's checkpoint or one this project wrote"
                            % (path, problem))
    return {"global_step": step, "ignored": ignored}
