"""The benches' demo training: ``train_model.sh --preset=demo_cpu`` on the demo's data, as the product runs it."""
import os
import resource
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from mlperf_bert import demo  # noqa: E402


def train(data_dir, out, steps, edit_env=None):
    """``steps`` micro-steps of the demo's training (one online eval included) into ``out``, its
    environment (demo.training_env) changed by ``edit_env(env)``; its (wall, user, system) seconds."""
    env = demo.training_env(data_dir, out)
    if edit_env:
        edit_env(env)
    samples = steps * 16  # the demo's micro-batch
    cmd = [os.path.join(ROOT, "train_model.sh"), "--seed=1", "--noprogress"] + demo.run_flags(
        eval_frequency=samples, max_samples=samples, target=0.99)
    before, t = resource.getrusage(resource.RUSAGE_CHILDREN), time.time()
    subprocess.run(cmd, env=env, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.time() - t, after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
