"""``make container-test``: build the image and use it as a user would (not part of ``make test``).

1. build it (the README's ``docker build -t mlperf-bert .``) and print its size and torch build;
2. the demo as a non-root user on the image read-only, as HPC sites run images (``docker run --rm
   --read-only --tmpfs /tmp --user UID:GID -v OUT:/output mlperf-bert``: nothing may be written inside
   it), and the same demo outside the image for comparison;
3. the entrypoint: flags go to start_training.sh, a command runs (start_training.sh by name too), a
   wrong word is explained, a run without /output mounted is refused;
4. a short training (the image read-only too) on read-only mounted data with NUM_RUNS=2, stopped with ``docker stop`` in
   the middle of run 2 and rerun to the end; each run's checkpoints must be bit-identical to
   those of an uninterrupted series (run in the image too);
5. ``package`` and ``score`` on the results, inside the image.
Each step prints its time; the end, a table of them and the image size.

The engine: $CONTAINER_ENGINE (a command, e.g. "podman --runtime runc"), else ``docker`` or
``podman``, whichever answers ``info``. A site's extra flags come from the environment so that
they stay out of the product: $CONTAINER_BUILD_FLAGS (build) and $CONTAINER_RUN_FLAGS (every
run), e.g. a proxy, a mirror (--build-arg PIP_INDEX_URL=...), another base (--build-arg
BASE_IMAGE=...), ulimits. $CONTAINER_IMAGE names the image [mlperf-bert]; the work folder is a new
temporary one, kept when a step fails (and always with $CONTAINER_TEST_KEEP=1).
"""
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))
from stepped import Failed, differing_parts, report, step, times  # noqa: E402

IMAGE = os.environ.get("CONTAINER_IMAGE", "mlperf-bert")
NAME = "mlperf-bert-test-%d" % os.getpid()
# A short series of the demo's tiny model: 48 micro-steps (24 updates of 32) a run, a checkpoint
# every 4 micro-steps, an eval every 256 samples; never reaches the target (aborted at the end).
TRAIN_FLAGS = ["--preset=demo_cpu", "--device=cpu", "--max_samples_termination=768", "--eval_frequency=256",
               "--save_checkpoints_steps=4", "--target_mlm_accuracy=0.99", "--num_workers=1", "--noprogress"]
LAST_STEP = 48
STOP_AFTER = "model.ckpt-16.pt"  # in run_1: docker stop once it exists (a third of the way in)
STOP_TIMEOUT = "300"  # docker stop -t, as the README and docs/running.md advise
# Who the runs are for: every log names them, and package checks them against the package's.
SUBMITTER = ["SUBMISSION_ORG=ContainerTest", "SUBMISSION_PLATFORM=cpu_container", "SUBMISSION_STATUS=research"]


def engine():
    if os.environ.get("CONTAINER_ENGINE"):
        return shlex.split(os.environ["CONTAINER_ENGINE"])
    for cmd in (["docker"], ["podman"]):
        if shutil.which(cmd[0]) and subprocess.run(cmd + ["info"], capture_output=True, timeout=120).returncode == 0:
            return cmd
    raise Failed("no container engine answers: docker info and podman info both fail (or set CONTAINER_ENGINE)")


ENGINE = []
RUN_FLAGS = shlex.split(os.environ.get("CONTAINER_RUN_FLAGS", ""))


def show(cmd):
    print("$ " + " ".join(shlex.quote(c) for c in cmd), flush=True)


def run(cmd, expect=0, tail=40, **kw):
    """Run ``cmd``, print its output's last ``tail`` lines; return (status, output)."""
    show(cmd)
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)
    lines = proc.stdout.splitlines()
    print("\n".join(["  [... %d lines]" % (len(lines) - tail)] * (len(lines) > tail) + ["  " + l for l in lines[-tail:]]))
    print("  -> exit %d" % proc.returncode, flush=True)
    if expect is not None and proc.returncode != expect:
        raise Failed("%s exited %d, expected %d" % (cmd[len(ENGINE)] if cmd[:len(ENGINE)] == ENGINE else cmd[0],
                                                    proc.returncode, expect))
    return proc.returncode, proc.stdout


def docker_run(*args, user=None, mounts=(), env=(), name=None, read_only=False):
    cmd = ENGINE + ["run", "--rm"] + RUN_FLAGS
    if read_only:  # (Apptainer's way, and Kubernetes' readOnlyRootFilesystem; /tmp its own, as Apptainer gives)
        cmd += ["--read-only", "--tmpfs", "/tmp"]
    if name:
        cmd += ["--name", name]
    if user:
        cmd += ["--user", user]
    for host, inside in mounts:
        cmd += ["-v", "%s:%s" % (host, inside)]
    for e in env:
        cmd += ["-e", e]
    return cmd + [IMAGE] + list(args)


def expect_in(text, *needles):
    for n in needles:
        if n not in text:
            raise Failed("output lacks %r" % n)


@step("build")
def build():
    run(ENGINE + ["build"] + shlex.split(os.environ.get("CONTAINER_BUILD_FLAGS", "")) + ["-t", IMAGE, ROOT],
        tail=15)
    _, size = run(ENGINE + ["image", "inspect", "--format", "{{.Size}}", IMAGE])
    _, versions = run(ENGINE + ["run", "--rm"] + RUN_FLAGS + ["--entrypoint", "python", IMAGE, "-c",
                      "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, "
                      "'cuda', torch.version.cuda)"])
    return int(size.split()[-1]), versions.strip().splitlines()[-1]


def user_and_dir(path):
    """A non-root user for the container and a folder it can write (root here: uid 1000)."""
    os.makedirs(path)
    if os.getuid() != 0:
        return "%d:%d" % (os.getuid(), os.getgid())
    os.chown(path, 1000, 1000)
    return "1000:1000"


@step("demo in the image (non-root)")
def demo_in_image(work):
    out = os.path.join(work, "demo")
    user = user_and_dir(out)
    _, text = run(docker_run(user=user, mounts=[(out, "/output")], read_only=True), tail=14)
    expect_in(text, "running the built-in demo", "log checker            PASSED")
    owner = os.stat(os.path.join(out, "demo", "train", "mlperf.log")).st_uid
    if "%d" % owner != user.split(":")[0]:
        raise Failed("the demo's files belong to uid %d, not %s" % (owner, user))
    return os.path.join(out, "demo")


@step("demo outside the image (make demo's command)")
def demo_outside(work):
    run([sys.executable, "-m", "mlperf_bert", "demo", "--output_dir=" + os.path.join(work, "demo_host")],
        tail=3, cwd=ROOT)


@step("entrypoint: flags, commands, a wrong word")
def entrypoint():
    _, text = run(docker_run("--preset=demo_cpu"), expect=2)
    expect_in(text, "error: start_training.sh: arguments (--preset=demo_cpu) but no DATA_DIR")
    _, text = run(docker_run("preset=demo_cpu"), expect=2)
    expect_in(text, "'preset=demo_cpu' is neither a flag nor a command")
    _, text = run(docker_run("python", "-m", "mlperf_bert", "--help"), tail=3)
    expect_in(text, "usage: python -m mlperf_bert <command>")
    # the scripts by name, as the docs name them (the code folder is on PATH)
    _, text = run(docker_run("start_training.sh", "--help"), tail=3)
    expect_in(text, "presets:", "rcp_3072")
    # no /output mounted: one line, before anything runs (the run went with the container, exit 0)
    _, text = run(docker_run(), expect=2, tail=3)
    expect_in(text, "OUTPUT_DIR=/output is not in a mounted folder")


def series(data, out, user, name=None):
    return docker_run(*TRAIN_FLAGS, user=user, name=name, mounts=[(data, "/data:ro"), (out, "/output")],
                      env=["DATA_DIR=/data", "NUM_RUNS=2", "SEED=100", "OMP_NUM_THREADS=1"] + SUBMITTER, read_only=True)


@step("training series, uninterrupted (NUM_RUNS=2, data read-only)")
def series_full(work, data):
    out = os.path.join(work, "full")
    user = user_and_dir(out)
    _, text = run(series(data, out, user), tail=12)
    expect_in(text, "run 1 of 2 finished (aborted)", "the series of 2 runs")
    return out, user


@step("training series, docker stop in run 2, rerun to the end")
def series_cut(work, data):
    out = os.path.join(work, "cut")
    user = user_and_dir(out)
    cmd = series(data, out, user, name=NAME)
    show(cmd)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    target = os.path.join(out, "run_1", STOP_AFTER)
    deadline = time.time() + 1800
    while not os.path.exists(target):
        if proc.poll() is not None or time.time() > deadline:
            print(proc.communicate()[0])
            raise Failed("the series ended or hung before %s" % target)
        time.sleep(0.2)
    t = time.time()
    run(ENGINE + ["stop", "-t", STOP_TIMEOUT, NAME], tail=2)
    stopped = proc.communicate()[0]
    print("  " + "\n  ".join(stopped.splitlines()[-6:]))
    print("  -> exit %d, %.1f s after docker stop" % (proc.returncode, time.time() - t))
    if proc.returncode != 143:
        raise Failed("the stopped series exited %d, not 143" % proc.returncode)
    expect_in(stopped, "start_training.sh: run 1 of 2 stopped by SIGTERM", "holds it; rerun the same command to resume")
    run_1 = stopped[stopped.rindex("STARTING TIMING RUN"):]  # run 0 finished (aborted) and was checked
    if "FAIL" in run_1 or "does not pass" in run_1 or "RESULT," in run_1:
        raise Failed("a stopped run was checked as if it had finished")
    _, text = run(cmd, tail=12)
    expect_in(text, "run 0 of 2 finished earlier", "run 1 of 2 finished (aborted)")
    return out


@step("checkpoints: stopped + resumed series = uninterrupted series")
def compare(full, cut):
    for r in ("run_0", "run_1"):
        names = sorted(n for n in os.listdir(os.path.join(full, r)) if n.endswith(".pt"))
        if "model.ckpt-%d.pt" % LAST_STEP not in names:
            raise Failed("%s/%s has no final checkpoint: %s" % (full, r, names))
        same = 0
        for n in names:
            b_path = os.path.join(cut, r, n)
            if not os.path.exists(b_path):
                continue  # kept only the newest few (keep_checkpoint_max), or not written in the cut run
            for part in differing_parts(os.path.join(full, r, n), b_path):
                raise Failed("%s/%s: %s differs from the uninterrupted run's" % (r, n, part))
            same += 1
        print("  %s: %d checkpoints bit-identical, up to model.ckpt-%d.pt" % (r, same, LAST_STEP))


@step("package and score in the image")
def package_and_score(full, user):
    import json
    from mlperf_bert.harness.package import IMPLEMENTATION, launch_name, source_files
    mounts = [(full, "/output")]
    with open(os.path.join(full, "cpu_container.json"), "w") as f:  # the submitter's description
        json.dump({"system_name": "cpu_container", "number_of_nodes": "1", "host_processors_per_node": "1",
                   "host_processor_model_name": "the test host's CPU", "host_processor_core_count": "1",
                   "accelerators_per_node": "0", "accelerator_model_name": "none (CPU)", "framework": "PyTorch",
                   "operating_system": "Debian 12 (the image)"}, f)
    run(docker_run("python", "-m", "mlperf_bert", "package", "--org=ContainerTest", "--system=cpu_container",
                   "--runs=/output", "--output=/output/package", "--system_json=/output/cpu_container.json",
                   "--status=Research, Development, or Internal (RDI)", user=user, mounts=mounts), tail=6)
    # the image has no .git and no git: the implementation is still every file of MANIFEST.txt
    impl = os.path.join(full, "package", "ContainerTest", "benchmarks", "bert", "implementations", IMPLEMENTATION)
    copied = sorted(os.path.relpath(os.path.join(d, n), impl) for d, _, names in os.walk(impl) for n in names)
    if copied != sorted(source_files() + [launch_name("cpu_container")]):  # and how the runs were launched
        raise Failed("the package made in the image holds %d files, MANIFEST.txt lists %d (%s missing)" % (
            len(copied), len(source_files()), ", ".join(sorted(set(source_files()) - set(copied))[:5])))
    # two runs: the official package checker wants ten for BERT, so the verdict is a fail that says why
    status, text = run(docker_run("python", "-m", "mlperf_bert", "score", "/output/package", user=user,
                                  mounts=mounts), expect=None, tail=20)
    expect_in(text, "result_0.txt", "result_1.txt")
    if status not in (0, 1):
        raise Failed("score exited %d" % status)


def main():
    global ENGINE
    work = tempfile.mkdtemp(prefix="container_test.")
    os.chmod(work, 0o755)
    ok = False
    t0 = time.time()
    size = versions = None
    try:
        ENGINE = engine()
        print("engine: %s; run flags: %s; work folder: %s" % (" ".join(ENGINE), " ".join(RUN_FLAGS) or "none", work))
        size, versions = build()
        demo = demo_in_image(work)
        demo_outside(work)
        entrypoint()
        data = os.path.join(work, "data")
        shutil.copytree(os.path.join(demo, "tfrecords"), data)
        full, user = series_full(work, data)
        cut = series_cut(work, data)
        compare(full, cut)
        package_and_score(full, user)
        ok = True
    except Failed as e:
        print("\ncontainer test FAILED: %s" % e)
    finally:
        if ENGINE:
            subprocess.run(ENGINE + ["rm", "-f", NAME], capture_output=True)
        report(t0, 66)
        if size:
            print("image %s: %.2f GB (%d bytes); %s" % (IMAGE, size / 1e9, size, versions))
        if ok and os.environ.get("CONTAINER_TEST_KEEP") != "1":
            shutil.rmtree(work, ignore_errors=True)
        else:
            print("work folder kept: %s" % work)
    print("container test %s: %d steps" % ("PASSED" if ok else "FAILED", len(times)))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
