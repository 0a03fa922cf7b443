"""checkpoint_add_gradacc.py: copy a TF checkpoint adding a zero ``<name>/GradientAccumulator``
of the same shape and dtype for every variable, as the reference tool does."""
import collections.abc
import os

import numpy as np

from mlperf_bert import flags
from mlperf_bert.trainer import tf_checkpoint
from mlperf_bert.errors import UserError
from mlperf_bert.fileio import new_dirs_removed_on_error, same_file


class WithAccumulators(collections.abc.Mapping):
    """Every variable of ``ckpt`` plus a zero ``<name>/GradientAccumulator``, read lazily."""
    SUFFIX = "/GradientAccumulator"

    def __init__(self, ckpt):
        self.ckpt = ckpt

    def _source(self, name):
        """The variable an accumulator name belongs to, or None for a copied variable."""
        base = name[:-len(self.SUFFIX)]
        return base if name.endswith(self.SUFFIX) and base in self.ckpt.shapes else None

    def __getitem__(self, name):
        src = self._source(name)
        if src is None:
            return self.ckpt[name]
        return np.zeros(self.ckpt.shapes[src], self.ckpt.dtypes[src])

    def __iter__(self):
        for n in self.ckpt:
            yield n
            yield n + self.SUFFIX

    def __len__(self):
        return 2 * len(self.ckpt)

    def nbytes(self, name):
        src = self._source(name)
        return self.ckpt.nbytes(name if src is None else src)


def add_gradacc(old, new, shard_bytes=1 << 30):
    ckpt = tf_checkpoint.LazyCheckpoint(old)
    if tf_checkpoint.OBJECT_GRAPH in ckpt.shapes:  # its string graph has no accumulator (a traceback)
        raise UserError("TF checkpoint %s is a TF2 object-based one (it holds %s): the reference's tool adds "
                        "accumulators to a TF1 name-based checkpoint: give tf1_ckpt/model.ckpt-28252, or one "
                        "convert_checkpoint.py writes" % (old, tf_checkpoint.OBJECT_GRAPH))
    if any(n + WithAccumulators.SUFFIX in ckpt.shapes for n in ckpt):
        raise UserError("TF checkpoint %s already has GradientAccumulator variables" % old)
    tf_checkpoint.write_tf_checkpoint(WithAccumulators(ckpt), new, shard_bytes)
    return len(ckpt)


def main(argv):
    fv = flags.FlagValues()
    flags.DEFINE_string("old", None, "TF checkpoint prefix to read", flag_values=fv)
    flags.DEFINE_string("new", None, "TF checkpoint prefix to write", flag_values=fv)
    flags.parse(fv, argv, required=["old", "new"], positional=False)
    if fv.old.endswith(".pt") and os.path.isfile(fv.old):
        raise UserError("--old=%s is a .pt checkpoint: this tool adds accumulators to a TF checkpoint; give its "
                        "prefix (e.g. model.ckpt-28252; convert_checkpoint.py makes one from a .pt)" % fv.old)
    if fv.new.endswith(".pt"):  # written as a TF prefix a.pt (a.pt.index): every reader takes a *.pt for a .pt file
        raise UserError("--new=%s ends in .pt, the name of a .pt checkpoint: this tool writes a TF checkpoint; give "
                        "a TF prefix (e.g. model.ckpt-28252)" % fv.new)
    # compared as paths (ck/./model.ckpt, a link to the folder): writing the input over itself destroys it
    if os.path.realpath(fv.old) == os.path.realpath(fv.new) or same_file(fv.old + ".index", fv.new + ".index"):
        raise UserError("--new=%s is --old=%s: writing it would destroy the input; give another prefix"
                        % (fv.new, fv.old))
    with new_dirs_removed_on_error(os.path.dirname(os.path.abspath(fv.new))), \
            tf_checkpoint.output_held(fv.new, "--new"):  # (folders left empty by an error or a stop go)
        n = add_gradacc(fv.old, fv.new)
    print("wrote %s: %d variables + %d GradientAccumulator" % (fv.new, n, n))
    return 0
