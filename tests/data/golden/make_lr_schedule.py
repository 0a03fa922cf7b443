"""Remake lr_schedule.json.gz: the MLCommons BERT reference's own learning rate, read from its graph.

Runs the reference's ``optimization.create_optimizer`` (mlcommons/training
retired_benchmarks/bert/optimization.py with lamb_optimizer_v1.py, on PYTHONPATH; TensorFlow in
graph mode) for each case of the RCPs of mlperf_logging's training 5.0.0 ``rcps_bert.json`` and
three more, sets the global step and reads the learning-rate tensor the reference hands its
optimizer: float32 bit patterns, 8 hex digits a step.

usage: PYTHONPATH=REFERENCE_DIR python make_lr_schedule.py OUT.json   (then gzip -9n OUT.json)
"""
import json
import os
import sys
import types

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

# deferred_grad_optimizer imports xla_sharding, which TF 2.21 no longer has at that path (unused here)
for name in ("tensorflow.compiler.xla", "tensorflow.compiler.xla.experimental",
             "tensorflow.compiler.xla.experimental.xla_sharding"):
    sys.modules.setdefault(name, types.ModuleType(name))
sys.modules["tensorflow.compiler.xla.experimental.xla_sharding"].xla_sharding = types.SimpleNamespace()
import absl.flags  # noqa: E402
import lamb_optimizer_v1  # noqa: E402
import optimization  # noqa: E402


def cases():
    import mlperf_logging
    path = os.path.join(os.path.dirname(mlperf_logging.__file__), "rcp_checker", "training_5.0.0", "rcps_bert.json")
    with open(path) as f:
        rcps = json.load(f)
    found = [dict(name=k, lr=h["opt_base_learning_rate"], T=h["opt_learning_rate_training_steps"],
                  W=h["num_warmup_steps"], start=h["start_warmup_step"], power=1.0)
             for k, h in ((k, v["Hyperparams"]) for k, v in rcps.items())]
    return found + [dict(name="reference GPU run (8 x V100)", lr=1e-4, T=107538, W=1562, start=0, power=1.0),
                    dict(name="power 0.5, warmup", lr=0.0017, T=977, W=123, start=-17, power=0.5),
                    dict(name="power 2.0", lr=0.000425, T=1001, W=0, start=0, power=2.0)]


def steps_for(T, W, start):
    pts = set(range(0, min(T, 300) + 1)) | set(range(0, T, max(1, T // 150))) | set(range(T - 10, T + 3))
    pts |= set(range(max(0, W + start - 3), W + start + 4))
    return sorted(p for p in pts if p >= 0)


def reference_lrs(init_lr, T, W, start, power, steps):
    seen, init = {}, lamb_optimizer_v1.LAMBOptimizer.__init__

    def grab(self, *a, **kw):
        seen["lr"] = kw["learning_rate"]
        init(self, *a, **kw)
    lamb_optimizer_v1.LAMBOptimizer.__init__ = grab
    try:
        with tf.Graph().as_default():
            c = tf.compat.v1
            v = c.get_variable("bert/x", initializer=tf.constant(np.ones(2, np.float32)))
            optimization.create_optimizer(tf.reduce_sum(v), init_lr, T, W, False, "lamb", power, start, 1)
            step = c.placeholder(tf.int64, [])
            set_step = c.assign(c.train.get_or_create_global_step(), step)
            with c.Session() as sess:
                sess.run(c.global_variables_initializer())
                out = []
                for s in steps:
                    sess.run(set_step, {step: s})
                    out.append(sess.run(seen["lr"]).view(np.uint32).item())
                return out
    finally:
        lamb_optimizer_v1.LAMBOptimizer.__init__ = init


def main(out):
    absl.flags.FLAGS(["make_lr_schedule"])
    result = []
    for case in cases():
        steps = steps_for(case["T"], case["W"], case["start"])
        bits = reference_lrs(case["lr"], case["T"], case["W"], case["start"], case["power"], steps)
        result.append(dict(case, steps=steps, lr_f32="".join("%08x" % b for b in bits)))
    with open(out, "w") as f:
        json.dump({"source": "mlcommons/training retired_benchmarks/bert/optimization.py (with "
                   "lamb_optimizer_v1.py) create_optimizer, TF %s graph mode" % tf.__version__,
                   "cases": result}, f)


if __name__ == "__main__":
    main(sys.argv[1])
