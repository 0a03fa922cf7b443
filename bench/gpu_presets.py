"""Every GPU preset through train_model.sh at full BERT-Large size on this CPU: 2 ranks (gloo),
the preset's own flags (bf16 autocast, LAMB, its hyperparameters), both clipping modes, packed
and unpacked input, a few updates with an online eval and checkpoints; each run is stopped by
SIGTERM after its first checkpoint and rerun, and must end bit-identical to the same command run
without a stop.

Usage: flock /tmp/heavy.lock .venv/bin/python bench/gpu_presets.py [--presets=a,b] [--seq=128|512]
         [--modes=4] [--only=packed:clip_after,...] [--keep]

Per preset two runs by default, between them both clipping modes and both inputs (per-replica
clipping on unpacked records, clipping after the all-reduce on packed rows); --modes=4 runs all
four pairs. A run is 4 micro-steps (the presets that accumulate, rcp_<B> and tpu_8192: 6, 3 updates
of 2), checkpoints every 2, SIGTERM
once model.ckpt-2.pt exists, the rerun to the end, and the last checkpoint compared.

What cannot fit on 2 CPU cores is overridden, and every override is printed in the command:
the per-rank batch (1 row a rank: --train_batch_size=2, MAX_PER_GPU_BATCH=1), the step counts (--num_train_steps,
--save_checkpoints_steps; rcp_<B> and tpu_8192 also --steps_per_update=2), the sequence length
(--seq, default 128 with the reference's golden s128 records; --seq=512 generates s512 records
first, 4x slower), the eval batch and frequency (open division, an eval every update; closed
refuses --eval_frequency) and NUM_GPUS=2. TORCH_ELASTIC_SHUTDOWN_TIMEOUT=600 gives the ranks
time to write a BERT-Large checkpoint (4 GB with the LAMB slots) after SIGTERM before torchrun
kills them (the torchrun wrapper's default is 300 s, torchrun's own 30 s). Per run the wall
times of the uninterrupted command, the stopped one and the resume are printed, then a table.
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import _data  # noqa: E402

ROOT = _data.ROOT
PY = os.path.join(ROOT, ".venv", "bin", "python") if os.path.exists(os.path.join(ROOT, ".venv")) else sys.executable


def accumulates(preset):
    """Whether the preset accumulates micro-steps (then its runs here do 2 per update)."""
    return preset.startswith("rcp_") or preset == "tpu_8192"


def rcp_presets():
    from mlperf_bert.harness.rcp import load_rcps
    sizes = sorted(load_rcps())
    return ["rcp_%d" % sizes[0], "rcp_%d" % sizes[-1]]


def make_data(work, seq):
    """Training records (unpacked TFRecord, packed HDF5) and a small eval file at ``seq``."""
    from mlperf_bert.dataset import packing, tfrecord
    pred = {128: 20, 512: 76}[seq]
    if seq == 128:
        src = [p for p in _data.unpacked("golden") if p.endswith("part-00000.s128.tfrecord")][0]
    else:
        src = _data.golden_records(os.path.join(work, "s512.tfrecord"), 512, 76, dupe_factor=1)
    recs = list(tfrecord.read_records(src))
    d = {"unpacked": os.path.join(work, "unpacked"), "packed": os.path.join(work, "packed"),
         "eval": os.path.join(work, "eval.tfrecord")}
    os.makedirs(d["unpacked"])
    os.makedirs(d["packed"])
    tfrecord.write_records(os.path.join(d["unpacked"], "part-00000"), recs[:400])
    tfrecord.write_records(d["eval"], recs[-16:])
    packing.pack_file(os.path.join(d["unpacked"], "part-00000"), os.path.join(d["packed"], "part-00000.hdf5"),
                      seq, pred, 3, 1)
    return d, pred


def command(preset, data, kind, clip_after, out, seq, pred, steps):
    env = {"PRESET": preset, "NUM_GPUS": "2", "INPUT_FILES": os.path.join(data[kind], "part-*"),
           "EVAL_FILE": data["eval"], "OUTPUT_DIR": out, "SEED": "11", "MASTER_PORT": "29511",
           "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "600", "OMP_NUM_THREADS": "1", "PYTHON": PY,
           "MAX_PER_GPU_BATCH": "1"}
    n = 2 if accumulates(preset) else None
    args = ["--train_batch_size=2", "--max_seq_length=%d" % seq, "--max_predictions_per_seq=%d" % pred,
            "--num_train_steps=%d" % steps, "--save_checkpoints_steps=2",
            "--eval_batch_size=4", "--submission_division=open", "--eval_frequency=1",
            "--target_mlm_accuracy=1.0", "--num_workers=0", "--noprogress", "--log_frequency=1",
            "--%sclip_by_global_norm_after_gradient_allreduce" % ("" if clip_after else "no")]
    if n:
        args.insert(1, "--steps_per_update=%d" % n)
    return env, [os.path.join(ROOT, "train_model.sh")] + args


def show(env, argv):
    keys = ("PRESET", "NUM_GPUS", "MAX_PER_GPU_BATCH", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "OMP_NUM_THREADS")
    return " ".join("%s=%s" % (k, env[k]) for k in keys) + " " + " ".join(
        a.replace(ROOT + "/", "") for a in argv)


def run(env, argv, stop_at=None, log=None):
    """-> (exit status, seconds). ``stop_at``: SIGTERM once that checkpoint exists."""
    t = time.time()
    with open(log, "a") as f:
        p = subprocess.Popen(argv, env=dict(os.environ, **env), cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                             start_new_session=True)
        while stop_at and p.poll() is None and not os.path.exists(stop_at):
            time.sleep(0.5)
        if stop_at and p.poll() is None:
            p.send_signal(signal.SIGTERM)
        rc = p.wait()
    return rc, time.time() - t


def same_weights(a, b):
    """Model and optimizer tensors of two checkpoints equal bit for bit (memory-mapped, not loaded)."""
    import torch
    ca, cb = (torch.load(p, map_location="cpu", weights_only=False, mmap=True) for p in (a, b))
    for k, v in ca["model"].items():
        if not torch.equal(v, cb["model"][k]):
            return "model %s differs" % k
    for k, st in ca["optimizer"]["state"].items():
        for slot, v in st.items():
            if torch.is_tensor(v) and not torch.equal(v, cb["optimizer"]["state"][k][slot]):
                return "optimizer %s/%s differs" % (k, slot)
    return None


def main(argv):
    from mlperf_bert import flags
    fv = flags.FlagValues()
    flags.DEFINE_list("presets", None, "Presets to run (default: reference_gpu, tpu_8192 and the smallest and "
                      "largest rcp_<B>).", flag_values=fv)
    flags.DEFINE_enum("seq", "128", ["128", "512"], "Sequence length (512 generates s512 records first, 4x "
                      "slower).", flag_values=fv)
    flags.DEFINE_enum("modes", "2", ["2", "4"], "Runs per preset: 2 (both clipping modes and both inputs "
                      "between them) or 4 (every pair).", flag_values=fv)
    flags.DEFINE_list("only", None, "Only these runs, as input:clipping (packed:clip_after, "
                      "unpacked:clip_each, ...).", flag_values=fv)
    flags.DEFINE_bool("keep", False, "Keep the work directory.", flag_values=fv)
    _data.parse(fv, argv, _data.doc(__file__))
    runs = ["unpacked:clip_each", "packed:clip_after"] + (["unpacked:clip_after", "packed:clip_each"] if fv.modes == "4"
                                                          else [])
    if set(fv.only or ()) - set(runs):  # else nothing ran, "total 0 s" and exit 0
        from mlperf_bert.errors import UserError
        raise UserError("--only: no run %s with --modes=%s; its runs are %s" % (
            ", ".join(sorted(set(fv.only) - set(runs))), fv.modes, ", ".join(runs)))
    presets = fv.presets or ["reference_gpu", "tpu_8192"] + rcp_presets()
    seq = int(fv.seq)
    work = tempfile.mkdtemp(prefix="gpu_presets_")
    data, pred = make_data(work, seq)
    rows, failed = [], 0
    t_all = time.time()
    for preset in presets:
        for kind, clip_after in (("unpacked", False), ("packed", True), ("unpacked", True), ("packed", False)):
            if fv.modes != "4" and (kind == "unpacked") == clip_after:
                continue
            name = "%s %s %s" % (preset, kind, "clip_after" if clip_after else "clip_each")
            if fv.only and name.split(" ", 1)[1].replace(" ", ":") not in fv.only:
                continue
            full, stopped = os.path.join(work, "full"), os.path.join(work, "stopped")
            log = os.path.join(work, "log.txt")
            steps = 3 * 2 if accumulates(preset) else 4  # 3 updates of 2 micro-steps
            env, cmd = command(preset, data, kind, clip_after, full, seq, pred, steps)
            print("%s:\n  %s" % (name, show(env, cmd)), flush=True)
            rc1, t1 = run(env, cmd, log=log)
            env2, cmd2 = command(preset, data, kind, clip_after, stopped, seq, pred, steps)
            rc2, t2 = run(env2, cmd2, stop_at=os.path.join(stopped, "model.ckpt-2.pt"), log=log)
            rc3, t3 = run(env2, cmd2, log=log)
            last = "model.ckpt-%d.pt" % steps
            ok = (rc1, rc2, rc3) == (0, 143, 0) and os.path.exists(os.path.join(full, last))
            diff = same_weights(os.path.join(full, last), os.path.join(stopped, last)) if ok else "exit %s" % (
                (rc1, rc2, rc3),)
            evals = sum(1 for line in open(os.path.join(full, "mlperf.log")) if '"eval_accuracy"' in line) \
                if os.path.exists(os.path.join(full, "mlperf.log")) else 0
            verdict = "bit-identical" if diff is None else "FAILED: " + diff
            failed += diff is not None
            rows.append((name, t1, t2, t3, evals, verdict))
            print("  full %.0f s, stopped %.0f s (exit %d), resumed %.0f s; %d evals; %s"
                  % (t1, t2, rc2, t3, evals, verdict), flush=True)
            if diff is not None:
                with open(log) as f:
                    print("".join(f.readlines()[-30:]))
            with open(log, "w"):
                pass
            for d in (full, stopped):
                shutil.rmtree(d, ignore_errors=True)
    print("\n| run (seq %d) | uninterrupted s | stopped s | resumed s | evals | resume |" % seq)
    print("|---|---:|---:|---:|---:|---|")
    for name, t1, t2, t3, evals, verdict in rows:
        print("| %s | %.0f | %.0f | %.0f | %d | %s |" % (name, t1, t2, t3, evals, verdict))
    print("total %.0f s" % (time.time() - t_all))
    if not fv.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    from mlperf_bert.cli import run_main
    run_main(main)
