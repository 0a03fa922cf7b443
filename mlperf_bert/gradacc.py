"""checkpoint_add_gradacc.py: copy a TF checkpoint adding a zero ``<name>/GradientAccumulator``
of the same shape and dtype for every variable, as the reference tool does."""
import numpy as np

from . import flags, tf_checkpoint
from .errors import UserError


def add_gradacc(old, new):
    arrays = tf_checkpoint.read_tf_checkpoint(old)
    out = dict(arrays)
    for name, a in arrays.items():
        out[name + "/GradientAccumulator"] = np.zeros(a.shape, a.dtype)
    tf_checkpoint.write_tf_checkpoint(out, new)
    return len(arrays)


def main(argv):
    fv = flags.FlagValues()
    flags.DEFINE_string("old", None, "TF checkpoint prefix to read", flag_values=fv)
    flags.DEFINE_string("new", None, "TF checkpoint prefix to write", flag_values=fv)
    flags.parse(fv, argv, required=["old", "new"])
    if fv.old == fv.new:
        raise UserError("--new must differ from --old (%s)" % fv.old)
    n = add_gradacc(fv.old, fv.new)
    print("wrote %s: %d variables + %d GradientAccumulator" % (fv.new, n, n))
    return 0
