"""bench/gpu_check.py, the one GPU check: every stage run on this CPU with --tiny inside its budget,
a failing or overrunning stage recorded while the next one runs, the refusals of a host without
CUDA and of a missing dependency."""
import json
import os
import subprocess
import sys
import tempfile
import time
import types

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO_CONFIG = os.path.join(ROOT, "configs", "bert_config_demo.json")
sys.path.insert(0, os.path.join(ROOT, "bench"))
import gpu_check  # noqa: E402

gpu_check.preload()  # what the check imports before it forks its stages


@pytest.mark.slow
def test_every_stage_runs_on_the_tiny_config_inside_its_budget(golden_s512, tmp_path, monkeypatch, capfd):
    """Issue 36: ``--budget_s=420`` on the tiny CPU config ends inside its budget with every
    stage's result; the summary table comes first, in the output and in gpu_check.md. Issue 46.1:
    the full-depth stage runs (at tiny size), second; every stage's cap is printed before the first
    starts. Issue 47.9: ``--tiny`` alone is the quick settings this test ran with flags before. Its
    main in this process, which has imported what it imports (the script's own start: the refusal
    tests below), its stages forked from here as from the script."""
    import torch
    out = tmp_path / "check.json"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # what main sets for its process
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the stages' (OMP_NUM_THREADS=1)
    t = time.time()
    try:
        status = gpu_check.main(["gpu_check.py", "--tiny", "--budget_s=420", "--input_file=" + golden_s512,
                                 "--json=%s" % out])
    finally:
        torch.set_num_threads(threads)
    wall = time.time() - t
    captured = capfd.readouterr()
    assert status == 0, captured.err[-3000:]
    res = json.loads(out.read_text())
    assert res["seconds"] <= 420 and wall < 420 + 30  # the check's own clock, and its start-up
    st = res["stages"]
    assert list(st) == list(gpu_check.STAGES) and not res["not_run"]
    assert gpu_check.STAGES[:2] == ("packed", "full_depth")
    # every cap, printed before the first stage starts (and in the markdown)
    caps = [line for line in captured.err.splitlines() if line.startswith("gpu_check: stage caps (s): ")]
    assert len(caps) == 1 and captured.err.index(caps[0]) < captured.err.index("gpu_check: packed: ")
    assert [x.split()[0] for x in caps[0].split(": ", 2)[2].split(" (")[0].split(", ")] == list(gpu_check.STAGES)
    assert list(res["planned_caps"]) == list(gpu_check.STAGES) and sum(res["planned_caps"].values()) <= 420
    # every stage's result, or its recorded failure: on this shared 2-core machine a stage may
    # overrun its cap (then it is stopped and the next runs); an error in a stage is a failure here
    failed = {n: r["failed"] for n, r in st.items() if "failed" in r}
    assert all(f.startswith("out of time: killed at its cap") for f in failed.values()), failed
    md = (tmp_path / "check.md").read_text()
    assert md == res["markdown"] + "\n" and captured.out.startswith(md.splitlines()[0])
    summary = md.split("## Details")[0]
    assert "Stage caps, planned before the first stage: packed " in summary
    for name in gpu_check.STAGES:
        assert "\n| %s | " % name in summary
        assert ("FAILED: out of time" in summary.split("\n| %s | " % name)[1].splitlines()[0]) == (name in failed)
    if "packed" not in failed:  # packed rows compute what unpacked ones do (the dense mask on a CPU)
        assert max(st["packed"]["errors"]["fp32"].values()) < 1e-5
        assert max(st["packed"]["errors"]["bf16"].values()) < 3e-2
    if "full_depth" not in failed:
        fd = st["full_depth"]
        assert fd["model"] == {"hidden_size": 32, "num_hidden_layers": 2} and fd["batch"] == 2
        assert fd["windows"] == 3 and fd["steps"] == 1
        assert [(r["mode"], r["levers"]) for r in fd["runs"]] == [
            ("eager", "plain"), ("compiled", "plain"), ("compiled", "fused_qkv"), ("eager", "fused_qkv")]
        for r in fd["runs"]:
            assert "failed" not in r, r
            assert len(r["windows"]) == 3 and r["rows_per_s"] == sorted(r["windows"])[1] and r["spread"] >= 0
            assert r["real_seq_per_s"] > 0 and r["first_steps_s"] > 0
            assert r["peak_gib"] is r["reserved_gib"] is r["warmup_peak_gib"] is r["mfu"] is None  # a CPU has none
            assert (r["compile_s"] is None) == (r["mode"] == "eager")
        assert fd["runs"][2]["speed_vs_plain"] > 0 and "speed_vs_plain" not in fd["runs"][1]
    if "eager" not in failed:
        (row,) = st["eager"]["steps"]
        assert row["batch"] == 2 and row["real_seq_per_s"] > row["rows_per_s"] > 0 and row["plan_gib"] > 0
        assert row["peak_gib"] is None and row["mfu"] is None  # a CPU has neither
    if "levers" not in failed:
        order = [(r["mode"], r["levers"]) for r in st["levers"]["runs"]]
        assert order[:4] == [("eager", "plain"), ("compiled", "plain"), ("eager", "all: fused_update,fused_qkv"),
                             ("compiled", "all: fused_update,fused_qkv")]  # --lever_all's order, less the refused
        runs = dict(zip(order, st["levers"]["runs"]))
        assert set(runs) == {(mode, x) for mode in ("eager", "compiled") for x in (
            "plain", "fused_qkv", "cuda_graphs", "all: fused_update,fused_qkv")}
        assert "CUDA device" in runs["compiled", "cuda_graphs"]["refused"]  # eager: "add --compile"
        assert "--compile" in runs["eager", "cuda_graphs"]["refused"]
        for key, r in runs.items():  # each lever computes what the plain step of its mode does
            if key[1] != "cuda_graphs":
                assert len(r["windows"]) == 3 and r["spread"] >= 0, key
            if key[1] not in ("plain", "cuda_graphs"):
                assert r["loss_vs_plain"] == pytest.approx(0, abs=1e-2) and r["speed_vs_plain"] > 0, key
        assert "eager plain step's spread" in summary.split("\n| levers | ")[1].splitlines()[0]
        # CUDA-graph recordings counted per phase (0 on a CPU: the counting path ran)
        assert "compiled all: fused_update,fused_qkv: timed steps" in st["levers"]["graph_recordings"]
        assert set(st["levers"]["graph_recordings"].values()) == {0}
        # inductor's CUDA-graph skips too: the same phases, none (a CPU records no graph)
        assert st["levers"]["cudagraph_skips"].keys() == st["levers"]["graph_recordings"].keys()
        assert not any(st["levers"]["cudagraph_skips"].values())
    if "trainer" not in failed:
        tr = st["trainer"]
        rec = tr["graph_recordings"]
        assert {"trainer: warm-up", "trainer: first steps", "trainer: later steps", "trainer: first eval",
                "trainer: second eval"} <= set(rec) and set(rec.values()) == {0}
        assert tr["status"] == 0 and tr["micro_steps"] == 4 and tr["evals"] >= 2 and tr["checkpoints"]
        assert tr["levers"] == ["fused_qkv"] and "cuda_graphs" in tr["refused"]
        # the rates the trainer logged (--log_frequency=1 at 4 steps), not only its exit status
        assert [r["step"] for r in tr["rates"]] == [1, 2, 3, 4]
        assert all(r["rows_per_s"] > 0 and r["seq_per_s"] > 0 for r in tr["rates"])
        assert "logged at the end: %.1f rows/s" % tr["rates"][-1]["rows_per_s"] in summary
    if "eval" not in failed:
        assert set(st["eval"]["s_per_10k"]) == {"2"} and st["eval"]["s_per_10k"]["2"] > 0
    if "syncs" not in failed:
        assert st["syncs"]["count"] == 0 and st["syncs"]["how"] == "Tensor read-backs (CPU)"
        assert st["syncs"]["syncs"] == []
    if "hf" not in failed:
        hf = st["hf"]
        assert hf.get("note") == "skipped: transformers is not installed (make hf)" or hf["seq_per_s"] > 0
    # no time to train on GPUs at a CPU's rate (the GPU case: test_the_projection_is_a_gpus_alone)
    assert res["projection"] == {"note": "not measured on a GPU (this run: cpu): none projected"}
    assert "(H100 " not in md  # the records' figures are BERT-Large's: none is this tiny model's


def _ctx(tmp_path):
    fv = types.SimpleNamespace(compile_backend="eager", bert_config_file=str(tmp_path / "tiny.json"),
                               max_seq_length=128)
    (tmp_path / "tiny.json").write_text(json.dumps(gpu_check.TINY))
    return {"fv": fv, "kind": "cpu", "work": str(tmp_path)}


def test_a_failing_or_overrunning_stage_is_recorded_and_the_next_runs(tmp_path, monkeypatch):
    """Each stage in its own process under its cap: an error is recorded with what the stage had
    saved, an overrun is stopped at its cap, and neither stops the next stage."""
    def fails(ctx, save):
        save({"steps": [{"batch": 2}]})
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    def overruns(ctx, save):
        save({"runs": ["first"]})
        time.sleep(600)

    def works(ctx, save):
        return {"count": 0, "device": "x", "pid": os.getpid()}
    monkeypatch.setattr(gpu_check, "STAGE_FUNCTIONS", {"eager": fails, "levers": overruns, "syncs": works})
    ctx = _ctx(tmp_path)
    bad = gpu_check.run_stage("eager", ctx, cap=60)
    assert bad["failed"] == "RuntimeError: CUDA error: an illegal memory access was encountered"
    assert bad["steps"] == [{"batch": 2}] and "Traceback" in bad["traceback"]
    t = time.time()
    slow = gpu_check.run_stage("levers", ctx, cap=1.5)  # a forked stage saves in milliseconds
    assert time.time() - t < 120 and slow["failed"].startswith("out of time") and slow["runs"] == ["first"]
    good = gpu_check.run_stage("syncs", ctx, cap=60)
    assert "failed" not in good and good["count"] == 0 and good["pid"] != os.getpid()  # its own process
    assert good["graph_recordings"] == {} and good["cpu_s"] >= 0


def test_a_stage_killed_mid_compile_leaves_nothing_to_the_next(tmp_path, monkeypatch):
    """Issue 45.6: a stage killed at its cap in the middle of an inductor compile left a 0-byte
    main.so in the compile cache all stages shared (and gcc's temporaries in TMPDIR): the next stage
    failed "file too short", reported as its own failure. Each stage compiles into a cache and a
    TMPDIR of its own, starting from the cache of the last stage that ended by itself; a killed
    stage's are removed, and its verdict says it was killed at its cap, and during what."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir, triton_cache_dir

    def compiles(ctx, save):  # a compile that ends: its kernel is cached
        with open(os.path.join(cache_dir(), "kept.so"), "wb") as f:
            f.write(b"\x7fELF kernel")
        return {"count": 0}

    def killed(ctx, save):  # killed while gcc writes main.so and its temporaries
        save({"runs": []}, running="compiled plain")
        open(os.path.join(cache_dir(), "main.so"), "wb").close()
        tempfile.NamedTemporaryFile(prefix="cc", suffix=".s", delete=False).close()
        time.sleep(60)

    def reads(ctx, save):
        return {"count": 0, "cache": sorted(os.listdir(cache_dir())), "triton": triton_cache_dir(0),
                "tmp": os.listdir(tempfile.gettempdir()), "tmpdir": os.environ["TMPDIR"], "cache_dir": cache_dir()}
    monkeypatch.setattr(gpu_check, "STAGE_FUNCTIONS", {"packed": compiles, "full_depth": killed, "eager": reads})
    ctx = _ctx(tmp_path)
    assert "failed" not in gpu_check.run_stage("packed", ctx, cap=60)
    bad = gpu_check.run_stage("full_depth", ctx, cap=1.5)
    assert bad["failed"] == ("out of time: killed at its cap of 2 s during compiled plain; its compile cache and "
                             "temporary files removed") and "running" not in bad
    nxt = gpu_check.run_stage("eager", ctx, cap=60)
    assert "failed" not in nxt, nxt
    assert nxt["cache"] == ["kept.so"]  # the cache of the stage that ended, without the killed one's main.so
    assert nxt["tmp"] == [] and nxt["tmpdir"].startswith(str(tmp_path))  # gcc's temporaries: not there
    assert nxt["cache_dir"].startswith(str(tmp_path)) and nxt["triton"].startswith(nxt["cache_dir"])
    # nothing of the killed stage is left in the work folder: only the last good cache, and the results
    left = [os.path.join(d, f) for d, _, fs in os.walk(str(tmp_path)) for f in fs if not f.endswith(".json")]
    assert [os.path.basename(f) for f in left] == ["kept.so"], left


def test_each_figure_is_printed_beside_the_records_of_docs_gpu(tmp_path):
    """Issue 47.8: beside each figure, the value docs/gpu/'s records have for the same stage, model,
    sequence length, batch and levers, labelled with the GPU and the date ("319.0 real seq/s (H100
    2026-11-27: 319.0)"); runs of one day listed in the order they ran; none for another model."""
    refs = gpu_check.references(os.path.join(ROOT, "docs", "gpu"))
    assert [label for label, _ in refs] == ["H100 2026-11-27"] * 3
    res = json.load(open(os.path.join(ROOT, "docs", "gpu", "2026-11-27-h100.json")))
    md = gpu_check.tables(res, refs)
    eager = [line for line in md.splitlines() if line.startswith("| Trainer.step eager, packed, batch 24 |")]
    assert eager == ["| Trainer.step eager, packed, batch 24 | 226.5 rows/s (H100 2026-11-27: 226.5) = 319.0 real "
                     "seq/s (H100 2026-11-27: 319.0), 229 TFLOP/s, MFU 23.1% (H100 2026-11-27: 23.1%), peak 17.0 GiB "
                     "(H100 2026-11-27: 17.0) (plan 17.6 GiB) |"]
    # the compiled plain step at 2 layers, in runs 1, 2 and 3 (the order they ran)
    assert "| 2505.6 rows/s (H100 2026-11-27: 2505.6, 1864.7, 2358.6), " in md
    assert "1.11x plain (H100 2026-11-27: 1.11x, 1.50x)" in md  # --cuda_graphs, runs 1 and 2
    # a new run on another card: its figures, the H100's beside them; another model or batch: none
    res["device"] = "NVIDIA H200"
    res["stages"]["eager"]["steps"][0]["real_seq_per_s"] = 401.25
    res["stages"]["eager"]["steps"][1]["batch"] = 50
    md = gpu_check.tables(res, refs)
    assert "= 401.2 real seq/s (H100 2026-11-27: 319.0)," in md
    assert "| Trainer.step eager, packed, batch 50 | 264.6 rows/s = 364.3 real seq/s, " in md
    res["model"] = {"hidden_size": 1024, "num_hidden_layers": 12}
    assert "(H100 2026-11-27: 319.0)" not in gpu_check.tables(res, refs)
    # a record of the new full-depth stage is found by its batch, mode and levers
    rec = {"started": 1796774400, "device": "NVIDIA H200", "seq": 512, "stages": {"full_depth": {
        "model": gpu_check.BERT_LARGE, "batch": 117, "steps": 3, "windows": 3, "runs": [
            {"mode": "compiled", "levers": "plain", "rows_per_s": 362.0, "real_seq_per_s": 466.0, "mfu": 0.376,
             "windows": [361.0, 362.0, 363.0], "spread": 0.0055, "warmup_peak_gib": 60.0, "warmup_reserved_gib": 62.0,
             "peak_gib": 55.0, "reserved_gib": 62.0, "first_steps_s": 90.0, "compile_s": 89.4}]}}}
    (tmp_path / "2026-12-09-h200.json").write_text(json.dumps(rec))
    (tmp_path / "notes.json").write_text("{}")  # not a record: passed over
    now = json.loads(json.dumps(rec))
    now["stages"]["full_depth"]["runs"][0].update(rows_per_s=380.0, compile_s=70.2)
    md = gpu_check.tables(dict(now, budget_s=420, seconds=1, records=3000, packing_rate=1.29, torch="x",
                               order=["full_depth"], not_run={}, kind="cuda",
                               stages={"full_depth": dict(now["stages"]["full_depth"], seconds=1, cap_s=2,
                                                          cpu_s=1)}),
                          gpu_check.references(str(tmp_path)))
    assert "380.0 rows/s (H200 2026-12-09: 362.0)" in md and "compile 70 s (H200 2026-12-09: 89)" in md


def test_graph_recordings_are_counted_by_phase():
    """The counter wraps the CUDA-graph tree manager's recording: each call is counted in the
    phase open at the time (on a CUDA run, a recording after the warm-up is on the clock)."""
    from torch._inductor import cudagraph_trees
    real = cudagraph_trees.CUDAGraphTreeManager.record_function
    try:
        cudagraph_trees.CUDAGraphTreeManager.record_function = lambda self, *a, **k: "graph"
        g = gpu_check.GraphRecordings()
        with g.counting("first steps"):
            assert cudagraph_trees.CUDAGraphTreeManager.record_function(None, [], 0) == "graph"
        with g.counting("first eval"):
            pass
        with g.counting("second eval"):
            cudagraph_trees.CUDAGraphTreeManager.record_function(None, [], 1)
            cudagraph_trees.CUDAGraphTreeManager.record_function(None, [], 2)
        assert g.counts() == {"first steps": 1, "first eval": 0, "second eval": 2}
    finally:
        cudagraph_trees.CUDAGraphTreeManager.record_function = real


def test_cudagraph_skips_are_recorded_by_phase_with_reason_and_place():
    """Inductor's "skipping cudagraphs" warnings (the first H100 run had one, in the update, which
    the summary did not show) are recorded in the phase open when inductor logs them, by its own
    logging call, with the reason and this repository's frames of the stack it quotes."""
    from torch._inductor import cudagraph_utils
    g = gpu_check.GraphRecordings()
    step = os.path.join(ROOT, "mlperf_bert", "trainer", "step.py")
    msg = ("skipping cudagraphs due to mutated inputs (1 instances). Found from : \n"
           '   File "/usr/lib/torch/utils/_contextlib.py", line 124, in decorate_context\n'
           '    return func(*args, **kwargs)\n'
           '  File "%s", line 45, in absorb_and_update\n    norm = _absorb(grads)\n' % step)
    with g.counting("compiled cuda_graphs: first steps"):
        cudagraph_utils.log_cudagraph_skip_and_bump_counter(msg)
    with g.counting("compiled cuda_graphs: timed steps"):
        pass
    cudagraph_utils.cudagraphs_log.warning("an inductor warning that is no skip")
    assert g.skipped() == {"compiled cuda_graphs: first steps": [
        {"reason": "mutated inputs (1 instances)", "at": ["mlperf_bert/trainer/step.py:45 absorb_and_update"]}],
        "compiled cuda_graphs: timed steps": []}
    assert gpu_check.graphs_text({k: len(v) for k, v in g.skipped().items()}) == (
        "compiled cuda_graphs: first steps 1, 0 in 1 other phases")


def test_host_syncs_are_recorded_with_where_they_happened():
    """The syncs stage's recorder on CUDA (torch.cuda.set_sync_debug_mode("warn") warns at each
    synchronizing operation): each such warning in the micro-steps, with this repository's frames
    of its stack (the first H100 run counted 1 sync in 10 micro-steps and could not say where)."""
    import warnings
    import torch

    class Trainer:
        def step(self, batch, i):
            if i % 2:
                warnings.warn("called a synchronizing CUDA operation")
            warnings.warn("an unrelated warning")
            return torch.zeros(()), False
    found = []
    with gpu_check.sync_warnings(found):
        gpu_check.run_steps(Trainer(), [{"global_sequences": torch.tensor(1)}], 4, torch.device("cpu"))
    assert [x["what"] for x in found] == ["called a synchronizing CUDA operation"] * 2
    assert all(x["stack"][-1].startswith("bench/gpu_check.py:") and x["stack"][-1].endswith(" run_steps")
               and x["at"].endswith(":%d" % (Trainer.step.__code__.co_firstlineno + 2)) for x in found), found


def test_the_sync_debug_modes_own_notice_is_not_counted_as_a_sync():
    """Setting torch.cuda.set_sync_debug_mode("warn") warns once that the mode is a prototype; the
    first two H100 runs counted that notice as the one host sync they found. The texts are the
    H100 run's notice and c10's warning for a synchronizing operation, as torch hands them to Python."""
    import warnings
    notice = ("Synchronization debug mode is a prototype feature and does not yet detect all synchronizing "
              "operations (Triggered internally at /pytorch/torch/csrc/cuda/Module.cpp:1003.)")
    sync = "called a synchronizing CUDA operation (Triggered internally at /pytorch/c10/cuda/CUDAFunctions.cpp:172.)"
    for text, count in ((notice, 0), (sync, 1)):
        found = []
        with gpu_check.sync_warnings(found):
            warnings.warn(text, UserWarning)
        assert len(found) == count, (text, found)
    assert found[0]["what"] == sync


def test_whether_there_is_a_gpu_is_asked_in_a_child_not_in_the_process_that_forks_the_stages(monkeypatch):
    """The CUDA runtime that torch.cuda.is_available() may start does not survive a fork: the
    process the stages are forked from must never ask it itself."""
    import torch
    asked = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: asked.append(os.getpid()) or True)
    assert gpu_check.cuda_available() is True and asked == []  # the child's answer; nothing asked here
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_check.cuda_available() is False


def test_on_a_host_without_cuda_it_refuses_unless_told_to_scale_down(tmp_path, monkeypatch):
    """Issue 37.16: it started BERT-Large at seq 512 on the CPU (12 GB after 100 s, no output)."""
    import torch
    from mlperf_bert.errors import UserError
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    fv = gpu_check.define()
    fv(["gpu_check.py"])
    with pytest.raises(UserError, match="no CUDA GPU and the check would run BERT-Large at seq 512 on the CPU: "
                                        "run it on a GPU machine, or add --tiny"):
        gpu_check.resolve(fv, str(tmp_path))
    fv = gpu_check.define()
    fv(["gpu_check.py", "--device=cuda"])
    with pytest.raises(UserError, match="--device=cuda, but this host has no CUDA GPU"):
        gpu_check.resolve(fv, str(tmp_path))
    fv = gpu_check.define()
    fv(["gpu_check.py", "--tiny", "--batches=3"])
    assert gpu_check.resolve(fv, str(tmp_path)) == "cpu"
    assert fv.records == gpu_check.TINY_FLAGS["records"] and fv.batches == "3"  # a flag given wins
    assert json.load(open(fv.bert_config_file))["hidden_size"] == 32


def test_the_levers_and_trainer_model_is_tinys_at_their_depth_or_the_users_as_given(tmp_path, monkeypatch):
    """lever_config: under --tiny, its own model at the stage's layers, a --bert_config_file the user
    gave as it is; without --tiny, the model at BERT-Large's width and the stage's layers."""
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for i, (argv, layers, want) in enumerate(((["--tiny"], 1, dict(gpu_check.TINY, num_hidden_layers=1)),
                               (["--tiny", "--bert_config_file=" + DEMO_CONFIG], 1, json.load(open(DEMO_CONFIG))),
                               (["--bert_config_file=" + DEMO_CONFIG], 3,
                                dict(json.load(open(DEMO_CONFIG)), hidden_size=1024, num_attention_heads=16,
                                     intermediate_size=4096, num_hidden_layers=3)))):
        work = tmp_path / str(i)
        work.mkdir()
        fv = gpu_check.define()
        fv(["gpu_check.py"] + argv)
        gpu_check.resolve(fv, str(work))
        path = gpu_check.lever_config(fv, str(work), layers)
        assert json.load(open(path)) == want, argv
        assert (path == DEMO_CONFIG) == (argv[0] == "--tiny" and len(argv) == 2)


def test_without_cuda_the_command_refuses_in_one_line_before_any_work(tmp_path, monkeypatch):
    import torch
    from mlperf_bert.errors import UserError
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError) as e:
        gpu_check.main(["gpu_check.py"])
    assert str(e.value).startswith("gpu_check: this host has no CUDA GPU") and "\n" not in str(e.value)
    assert not list(tmp_path.iterdir())  # no JSON, no markdown


def test_without_mlperf_logging_it_says_what_to_pip_install(tmp_path):
    """Issue 37.18: the error named shared/tools/device_wheels.sh, which is not in the repository:
    it names the packages to install, at requirements.txt's versions."""
    blocker = tmp_path / "mlperf_logging"
    blocker.mkdir()
    (blocker / "__init__.py").write_text("raise ImportError(\"No module named 'mlperf_logging'\", name='mlperf_logging')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), ROOT]))
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "gpu_check.py"), "--tiny"],
                          capture_output=True, text=True, cwd=str(tmp_path), env=env, timeout=300)
    import re
    pins = dict(re.match(r"([\w.-]+)==([^\s;]+)", line).groups() for line in open(os.path.join(ROOT, "requirements.txt"))
                if "==" in line and not line.startswith("#"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "error: gpu_check: the trainer needs mlperf_logging: pip install mlperf-logging==%s crc32c==%s"
        % (pins["mlperf-logging"], pins["crc32c"])]
    assert "shared/" not in proc.stderr and not (tmp_path / "gpu_check.json").exists()


# ---------------------------------------------------------------- every bench's command line

BENCHES = sorted(f for f in os.listdir(os.path.join(ROOT, "bench")) if f.endswith(".py") and not f.startswith("_"))


def _run_bench(name, argv, monkeypatch, capsys):
    """bench/<name> run as a script in this process -> (exit status, stdout, stderr)."""
    import runpy
    import signal
    monkeypatch.setattr(sys, "argv", [os.path.join(ROOT, "bench", name)] + argv)
    handler = signal.getsignal(signal.SIGTERM)
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
        status = 0
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        signal.signal(signal.SIGTERM, handler)
    out = capsys.readouterr()
    return status, out.out, out.err


def _flags_without_help(text):
    """The flags of a --help text (absl's or argparse's listing) that have no help text."""
    import re
    bare, lines = [], text.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^\s+--(?:\[no\])?(\w+): ?(.*)$", line)  # absl: "  --name: help"
        if m:
            if not m.group(2).strip():
                bare.append(m.group(1))
            continue
        m = re.match(r"^  (?:-\w, )?--(\w+)(?: [A-Z_]+)?(\s{2,}\S.*)?$", line)  # argparse
        if m and not m.group(2):
            follow = lines[i + 1] if i + 1 < len(lines) else ""
            if not re.match(r"^\s{6,}\S", follow):
                bare.append(m.group(1))
    return bare


@pytest.mark.parametrize("name", BENCHES)
def test_every_bench_lists_its_flags_with_help_and_refuses_an_unknown_one(name, monkeypatch, capsys):
    """Issue 37.19: gpu_check's --help printed its docstring and a usage omitting four flags, and
    the benches that read sys.argv by hand ignored a misspelled flag (bench_text_pipeline ran on
    --help). Every bench parses its flags: --help lists each with its help, an unknown flag is
    refused in one line with exit 2."""
    status, out, err = _run_bench(name, ["--help"], monkeypatch, capsys)
    assert status == 0 and "Traceback" not in err, err
    assert any(line.startswith("usage: ") for line in out.splitlines()), out[:500]
    listed = set(__import__("re").findall(r"^\s+(?:-\w, )?--(?:\[no\])?(\w+)", out, __import__("re").M))
    assert listed - {"help", "helpfull", "helpshort", "helpxml", "flagfile", "undefok"}, out[:500]
    assert not _flags_without_help(out), _flags_without_help(out)
    if name == "gpu_check.py":
        assert {"gpus", "eval_samples", "max_seq_length", "max_predictions_per_seq", "budget_s", "tiny"} <= listed
    # one line (a sweep: the argparse benches printed their usage line before it, bench/_data.OneLineParser)
    status, out, err = _run_bench(name, ["--no_such_flag=1"], monkeypatch, capsys)
    assert status == 2 and "no_such_flag" in err and len(err.strip().splitlines()) == 1, (status, err[-500:])


@pytest.mark.parametrize("name", ["gpu_plan.py", "gpu_presets.py", "gpu_check.py"])
def test_help_into_a_closed_pipe_exits_quietly(name):
    """Issue 37.15: ``bench/gpu_plan.py --help | head`` ended in a BrokenPipeError traceback. The
    reader here is gone before the bench writes a byte, so the broken pipe is certain."""
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "bench", name), "--help"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0 and not err, err


def test_the_projection_is_a_gpus_alone():
    """A sweep of the benches: ``--tiny`` on a CPU printed "projected time to train, 8 GPUs: ... at 75
    real seq/s a GPU: train 4000 s", a CPU's rate read as a GPU's. On a CPU it says none is projected."""
    fv = types.SimpleNamespace(gpus="8")
    eager = [{"batch": 2, "real_seq_per_s": 75.0}]
    assert gpu_check.projection(fv, eager, {}, "cpu") == {"note": "not measured on a GPU (this run: cpu): none projected"}
    assert gpu_check.projection(fv, eager, {}, "cuda")["8"]["total_s"] > 0


BAD_INPUTS = [  # (bench, argv): each was a traceback, a hang or a run of nothing ending in exit 0
    ("gpu_check.py", ["--tiny", "--budget_s=0"]),  # ran no stage, exit 0
    ("gpu_check.py", ["--tiny", "--stages=eval", "--gpus=0"]),  # ZeroDivisionError in the projection
    ("gpu_check.py", ["--tiny", "--stages=eager", "--budget_s=20", "--batches=0"]),  # looped until its cap
    ("gpu_check.py", ["--tiny", "--stages=packed", "--json=/proc/no_such_dir/g.json"]),  # after the stage
    ("train_throughput.py", ["--bert_config_file=" + DEMO_CONFIG, "--max_seq_length=32", "--device=cuda"]),
    ("train_throughput.py", ["--bert_config_file=" + DEMO_CONFIG, "--max_seq_length=32", "--max_predictions_per_seq=5",
                             "--steps=1", "--rounds=1", "--levers=fused_qkv", "--compare_compile"]),  # ignored
    ("bench_optimizer.py", ["--device=cuda"]),
    ("checkpoint_save.py", ["--config=" + os.path.join(ROOT, "no_such_config.json")]),
    ("checkpoint_save.py", ["--config=" + DEMO_CONFIG, "--dir=/proc/no_such_dir"]),
    ("checkpoint_save.py", ["--config=" + DEMO_CONFIG, "--repeats=0"]),  # printed nothing, exit 0
    ("cpu_memory.py", ["--repeats=0"]),
    ("demo_threads.py", ["--repeats=0"]),
    ("demo_threads.py", ["--load=-1"]),  # "-1 busy processes added"
    ("ddp_graphs.py", ["--caps_mb=0"]),
    ("gpu_presets.py", ["--only=packed:clip_before"]),  # ran nothing: "total 0 s", exit 0
    ("loader_throughput.py", ["--rounds=0"]),
    ("bench_make_dataset.py", ["--cores=0"]),
    ("pool_error_exit.py", ["--errors=0"]),
    ("official_parse.py", ["--size=-1"]),  # read every real log, then a ValueError: negative count
]


@pytest.mark.parametrize("name,argv", BAD_INPUTS, ids=["%s %s" % (n, a[-1]) for n, a in BAD_INPUTS])
def test_every_bench_refuses_a_bad_count_or_path_in_one_line_before_it_runs(name, argv, tmp_path, monkeypatch,
                                                                             capsys):
    """A sweep of the benches: a count of 0, --device=cuda on a host without CUDA, a --config or
    --dir or --json it cannot use, a flag it would ignore: one line naming the flag, exit 2."""
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.chdir(tmp_path)
    status, out, err = _run_bench(name, argv, monkeypatch, capsys)
    assert status == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, (status, err[-2000:])
    assert err.startswith("error: ") and not out and not list(tmp_path.iterdir()), (err, out[-500:])


def test_a_budget_that_leaves_no_stage_time_is_an_error_not_an_empty_record(tmp_path, monkeypatch, capsys):
    """A sweep of the benches: --budget_s=1 to 4 (past the count check) ran no stage, wrote a record of
    nothing and exited 0, as a check that passed."""
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.chdir(tmp_path)
    status, out, err = _run_bench("gpu_check.py", ["--tiny", "--budget_s=1"], monkeypatch, capsys)
    assert status == 2 and err.splitlines()[-1].startswith("error: --budget_s=1 left no time for any stage ("), err
    assert not out and not list(tmp_path.iterdir())


def test_gpu_plan_reads_the_presets_flags_with_its_own_interpreter(monkeypatch):
    """A sweep of the benches: gpu_plan ran ``train_model.sh --dry_run`` with the caller's PYTHON (else
    the checkout's .venv, else python3): from a checkout without .venv (a worktree) or with another
    PYTHON set, the plan ended in a CalledProcessError traceback before its first line. It passes its
    own interpreter; a failed dry run is one line naming the preset."""
    import gpu_plan
    from mlperf_bert.errors import UserError
    monkeypatch.setenv("PYTHON", os.path.join(ROOT, "no-such-python"))
    flags = gpu_plan.preset_flags("reference_gpu", 8)
    assert flags["max_seq_length"] == "512" and int(flags["train_batch_size"]) % 8 == 0, flags
    with pytest.raises(UserError, match=r"^train_model.sh --preset=no_such_preset --dry_run failed: "):
        gpu_plan.preset_flags("no_such_preset", 8)
