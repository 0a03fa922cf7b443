import gzip
import os
import shutil
import signal
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data")
sys.path.insert(0, ROOT)

if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs two workers on a machine of a few cores: one thread each (torch reads
    # this at import, here and in the subprocesses tests start) instead of two contending ones
    os.environ.setdefault("OMP_NUM_THREADS", "1")
# torch.compile (inductor) compiles its kernels in this process instead of starting a pool of
# compile workers, each importing torch again
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
# glibc's malloc, as the workers and every process they start inherit it: blocks up to 32 MiB from
# the heap, which keeps what is freed (not each tensor its own mmap, returned at free and faulted in
# again, zeroed, at the next): a whole run's page faults 24 -> 16 million, its CPU 362-382 -> 333-344 s.
# Read at a process's start: set here, in the controller, before it starts the workers.
if not os.environ.get("PYTEST_XDIST_WORKER"):
    for _name, _value in (("MALLOC_MMAP_THRESHOLD_", "33554432"), ("MALLOC_TRIM_THRESHOLD_", "1073741824"),
                          ("MALLOC_TOP_PAD_", "67108864")):
        os.environ.setdefault(_name, _value)
# A shell without job control starts a background job (`make test &`) with SIGINT ignored, and an
# ignored signal stays ignored across fork and exec: the trainers the signal tests start would
# never see their SIGINT. A handler of our own is reset to the default in every child.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
# With PYTHONDONTWRITEBYTECODE set (as on CI's machines) no process writes bytecode, so each of the
# ~100 Python processes the tests start compiled our modules from source again (0.2 s of CPU per
# trainer). Compiled once here, before the workers start, as Python does by default on a first run.
if not os.environ.get("PYTEST_XDIST_WORKER") and sys.dont_write_bytecode:
    import compileall
    for _part in ("mlperf_bert", "bench", "tests"):
        compileall.compile_dir(os.path.join(ROOT, _part), quiet=2)
# pytest keeps the test modules it rewrote for its assertion messages only where this process may
# write bytecode: without, each worker rewrote all of them at every run (~5 s of CPU each). The
# variable stays set for the processes the tests start.
sys.dont_write_bytecode = False


@pytest.fixture(autouse=True)
def _signal_handlers_kept():
    """A test that runs a command's run_main in this process leaves SIGTERM and SIGINT ignored (run_main
    ignores them once the command has ended, the process then only exits): the tests after it would
    start children that inherit the ignore. Each test ends with the handlers it started with."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def _unpack(src_dir, dst_dir):
    """Copy ``src_dir`` to ``dst_dir``, decompressing ``*.gz`` files (tests/data keeps them small)."""
    os.makedirs(dst_dir, exist_ok=True)
    for name in sorted(os.listdir(src_dir)):
        src = os.path.join(src_dir, name)
        if os.path.isdir(src):
            _unpack(src, os.path.join(dst_dir, name))
        elif name.endswith(".gz"):
            with gzip.open(src, "rb") as f, open(os.path.join(dst_dir, name[:-3]), "wb") as out:
                shutil.copyfileobj(f, out)
        else:
            shutil.copy(src, os.path.join(dst_dir, name))


@pytest.fixture(scope="session")
def ref_data(tmp_path_factory):
    """The real reference inputs and outputs of tests/data, unpacked once per test run:
    ``data/`` (vocab.txt, eval.md5, wiki_sample/), ``golden/`` (generator inputs, the reference's
    part-00000.s128.tfrecord, digests.jsonl, text/) and ``tools/tfrecord_digest.py``."""
    root = str(tmp_path_factory.mktemp("ref_data"))
    data = os.path.join(root, "data")
    os.makedirs(data)
    shutil.copy(os.path.join(DATA, "vocab.txt"), data)
    with gzip.open(os.path.join(DATA, "eval.md5.gz"), "rb") as f, open(os.path.join(data, "eval.md5"), "wb") as out:
        shutil.copyfileobj(f, out)
    _unpack(os.path.join(DATA, "wiki_sample"), os.path.join(data, "wiki_sample"))
    _unpack(os.path.join(DATA, "golden"), os.path.join(root, "golden"))
    os.makedirs(os.path.join(root, "tools"))
    shutil.copy(os.path.join(ROOT, "tests", "tfrecord_digest.py"), os.path.join(root, "tools"))
    return root


@pytest.fixture(scope="session")
def vocab_file():
    return os.path.join(DATA, "vocab.txt")


@pytest.fixture(scope="session")
def golden_dir(ref_data):
    return os.path.join(ref_data, "golden")


@pytest.fixture(scope="session")
def tiny_record():
    """make(**features) -> a serialized seq-8, 2-prediction pre-training record whose features are
    valid but for those given: ``name=values``, or ``name=(kind, values)`` for another kind."""
    from mlperf_bert.dataset.example import PRETRAINING_FEATURES, encode_example

    def make(**given):
        feats = {"input_ids": [2, 5, 6, 3, 0, 0, 0, 0], "input_mask": [1] * 4 + [0] * 4, "segment_ids": [0] * 8,
                 "masked_lm_positions": [1, 2], "masked_lm_ids": [7, 8], "masked_lm_weights": [1.0, 1.0],
                 "next_sentence_labels": [0]}
        feats = {name: (kind, feats[name]) for name, kind, _ in PRETRAINING_FEATURES}
        feats.update({name: v if isinstance(v, tuple) else (feats[name][0], v) for name, v in given.items()})
        return encode_example([(name, kind, values) for name, (kind, values) in feats.items()])
    return make


@pytest.fixture(scope="session")
def corrupt_deep(tiny_record):
    """write(path): six tiny records of which the fifth's data (not its header) is damaged: a file
    whose header and first record pass, refused only by a full read."""
    from mlperf_bert.dataset.tfrecord import write_records

    def write(path):
        write_records(path, [tiny_record()] * 6)
        with open(path, "r+b") as f:
            f.seek(4 * (len(tiny_record()) + 16) + 12 + 3)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0xFF]))
        return path
    return write


S512_FLAGS = ["--max_seq_length=512", "--max_predictions_per_seq=76", "--dupe_factor=10"]


@pytest.fixture(scope="session")
def golden_s512(golden_dir, vocab_file, tmp_path_factory):
    """Our generator's output for the reference's golden s512 command (the MLPerf command on
    golden/input/part-00000-of-00004), made once per run by the script as users run it;
    test_pretraining_data proves it equal to the reference's by content digest. Its stderr is
    beside it (PATH.stderr)."""
    import subprocess
    out = str(tmp_path_factory.mktemp("golden_s512") / "part-00000.s512.tfrecord")
    # its stderr to a file, as a scheduler's output file takes it (progress bars on, the default)
    with open(out + ".stderr", "w") as err:
        subprocess.run([sys.executable, os.path.join(ROOT, "create_pretraining_data.py"),
                        "--input_file=%s/input/part-00000-of-00004" % golden_dir, "--output_file=" + out,
                        "--vocab_file=" + vocab_file, "--do_lower_case=True", "--masked_lm_prob=0.15",
                        "--random_seed=12345"] + S512_FLAGS, check=True, stdout=subprocess.DEVNULL, stderr=err)
    return out


@pytest.fixture(scope="session")
def text_dir(golden_dir, tmp_path_factory):
    """Two reference-format text shards (the golden generator inputs) and an eval.txt cut from
    the second at an article boundary: make-dataset's input."""
    d = tmp_path_factory.mktemp("text")
    for k in (0, 1):
        shutil.copy(os.path.join(golden_dir, "input", "part-0000%d-of-00004" % k), d / ("part-0000%d-of-00002" % k))
    text = open(os.path.join(golden_dir, "input", "part-00001-of-00004"), encoding="utf-8").read()
    (d / "eval.txt").write_text(text[:text.index("\n\n", 150000) + 2], encoding="utf-8")
    return str(d)


@pytest.fixture(scope="session")
def full_run(text_dir, vocab_file, tmp_path_factory):
    """A complete tiny make-dataset run (test_dataset.cmd's flags); tests copy it before changing it."""
    from mlperf_bert.dataset import make_dataset
    from test_dataset import cmd
    out = str(tmp_path_factory.mktemp("full"))
    assert make_dataset.main(cmd(text_dir, out, vocab_file)) == 0
    return out


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: end-to-end tests over ~3 s (pytest -m 'not slow' skips them)")


# ---- scheduling for `make test` (pytest -n 2 --dist loadgroup --no-loadscope-reorder)
# Tests that use a module-scoped fixture of their file (a trained run, a packed file) share one
# worker, as --dist loadfile would; every other test is a unit of its own. Units start longest
# first, so the two workers finish together instead of one waiting on a heavy file at the end.

# module-scoped fixtures cheap enough to make on each worker (keep their tests free to move);
# test_training.py makes its runs once per worker (_once) for every module that imports them
CHEAP_SHARED = {"one_thread", "test_training.py::files", "test_training.py::uninterrupted",
                "test_training.py::uninterrupted_clip_after", "test_stops.py::uninterrupted"}

# module fixtures whose tests join a unit across files: the 2-rank launches of test_host_syncs.py,
# test_levers.py and test_grad_exchange.py (its DDP launch too) fork their ranks from one fork
# server per worker (test_host_syncs.run_ranks), which imports torch and the test modules once for
# all (3.7 s of CPU a server: on one worker, not on both); the TF checkpoints' users join the
# tensorflow unit below
ACROSS_FILES = {"two_ranks": "two ranks", "two_ranks_ddp": "two ranks", "tf1_ckpt": "tensorflow",
                "phase1": "tensorflow"}

# tests that import tensorflow in the worker (5-6 s of CPU, once per worker that does): one unit,
# with the users of the module fixtures that write TF checkpoints (ACROSS_FILES). A test that
# imports it outside this unit is named at the end of the run (TF_STRAYS).
TENSORFLOW = {
    "test_add_gradacc_variable_set", "test_convert_round_trip_tf_pt_tf_is_exact",
    "test_convert_says_one_count_of_dropped_variables", "test_missing_and_misshaped_variables_are_one_line_errors",
    "test_tf1_checkpoint_loads_and_matches_numpy_reference", "test_tf2_model_garden_names_and_shapes_load",
    "test_tf2_object_checkpoint_loads", "test_fused_qkv_models_save_and_load_reference_tf_checkpoints",
    "test_clip_after_allreduce_from_a_tf_checkpoint_matches_the_reference_run_by_tensorflow",
    "test_clip_matches_tensorflow", "test_lamb_matches_the_reference_update_run_by_tensorflow",
    "test_schedule_matches_tensorflow_polynomial_decay_with_reference_warmup",
    "test_closed_division_refuses_at_start_what_the_rules_decide",
    "test_reference_eval_command_runs_as_written_on_a_tf_checkpoint",
    "test_truncated_tf_checkpoint_is_one_line_in_convert_eval_and_init",
    "test_a_checkpoint_written_over_another_never_mixes_them", "test_lines_are_read_as_tfs_gfile_reads_them",
    "test_a_checkpoint_of_another_model_that_fits_the_shapes_is_refused", "test_convert_to_a_pt_on_a_full_disk_is_one_line",
    "test_add_gradacc_refuses_a_tf2_checkpoint_in_one_line",
    "test_a_tf_write_killed_leaves_what_the_next_write_of_its_prefix_removes",
    "test_an_eval_set_that_is_also_a_training_file_is_refused_in_closed_and_warned_of_in_open",
    "test_bfloat16_variables_older_layernorm_names_and_a_training_pts_optimizer_state",
    "test_a_checkpoint_already_at_the_output_is_not_written_over",
    "test_a_rewrite_of_a_prefix_keeps_files_beside_its_shards",
    "test_a_tf_checkpoint_whose_global_step_is_no_step_count_or_whose_index_is_damaged_is_one_line",
}

# seconds per test, for a run without .pytest_cache (a fresh clone): the larger of CPU seconds
# (user + system, with children; the hook below) and wall seconds of each test of 1 s or more, the
# mean of two `make test` runs from fresh clones with an empty compile cache (2026-12-02 07:05 and
# 07:11, 735 tests, 252-262 s of CPU in all; a parametrized test: its costliest case). A missing
# name counts as SLOW_DEFAULT if marked slow, else DEFAULT. Only the order depends on it; once a
# run has measured a test, its own figure is used.
COST = {
    "test_series_of_compiled_runs_shares_the_cache_and_trains_at_full_speed_from_run_start": 20.7,
    "test_every_stage_runs_on_the_tiny_config_inside_its_budget": 16.6,
    "test_torchrun_two_ranks_equal_one_process_with_accumulation": 13.5,
    "test_ten_runs_from_an_initial_checkpoint_packaged_without_git_score_pass_and_fail": 19.5,  # (its 8 checks: 2026-12-05)
    "test_a_finished_run_rerun_with_another_setting_is_refused_and_nothing_is_written": 3.4,
    "test_a_signal_during_do_evals_eval_stops_at_once_and_the_rerun_finishes": 7.3,  # (2026-12-05)
    "test_a_stop_signal_whose_handler_runs_inside_a_fork_hook_is_raised_after_the_fork": 2.1,  # (2026-12-07: both phases in one process)
    "test_deciding_on_flash_on_cuda_breaks_no_compiled_graph": 1.9,  # (2026-12-06: imports torch._dynamo itself)
    "test_a_sigterm_to_the_official_tool_as_it_starts_ends_it": 0.8,  # (2026-12-07: repo_checker, no scipy import)
    "test_a_signal_while_a_finished_runs_settings_are_compared_leaves_it_finished": 2.1,
    "test_a_tf_write_killed_leaves_what_the_next_write_of_its_prefix_removes": 9.0,  # (not in the mean above)
    "test_ddp_under_dynamo_splits_at_its_buckets_and_trains_as_eager_ddp": 9.6,
    "test_sigterm_to_every_process_of_two_ranks_with_workers_checkpoints_once_and_resumes_bit_identical": 8.7,
    "test_a_stop_while_the_ranks_straddle_run_start_or_the_runs_end_is_one_line_and_its_status": 4.6,  # (2026-12-05)
    "test_sigterm_checkpoints_and_the_rerun_resumes": 7.5,
    "test_a_run_killed_after_its_run_stop_keeps_its_result_and_its_rerun_trains_nothing": 6.0,
    "test_compiled_run_compiles_everything_before_run_start_and_equals_a_run_without_warm_up": 7.1,
    "test_inductors_kernels_update_as_the_eager_lamb": 7.0,
    "test_sigterm_or_ctrl_c_through_tee_to_start_training_checkpoints_and_resumes_bit_identical": 8.4,  # (2026-12-06: three starts)
    "test_packed_run_killed_and_rerun_ends_bit_identical": 5.4,
    "test_a_ranks_loader_worker_killed_under_two_ranks_is_one_line": 4.7,
    "test_demo_runs_packed": 4.5,
    "test_a_signal_under_two_ranks_is_one_line_once_naming_it": 4.5,
    "test_torchrun_errors_are_the_trainers_one_line_and_status": 4.2,
    "test_real_package_gets_its_official_score": 3.6,
    "test_golden_s512_digest": 3.6,
    "test_killed_and_rerun_ends_bit_identical": 3.2,
    "test_a_closed_run_on_an_rcp_preset_logs_the_rcps_hyperparameters": 3.2,
    "test_cuda_graphs_functions_mutate_only_static_inputs_by_inductors_rule": 3.2,
    "test_sigkilled_trainer_rerun_at_once_resumes_and_ends_bit_identical": 3.1,
    "test_cuda_graphs_on_two_ranks_trains_as_the_compiled_step": 3.0,
    "test_fp32_exchange_overlapped_is_the_exchange_of_before_bit_for_bit": 2.8,
    "test_a_full_disk_at_a_log_line_stops_the_run_and_the_rerun_ends_with_the_whole_log": 2.7,
    "test_compiled_step_has_no_graph_breaks_and_no_recompiles": 2.6,
    "test_tf1_checkpoint_loads_and_matches_numpy_reference": 2.5,
    "test_two_ranks_wait_for_no_device_between_boundaries": 2.2,
    "test_a_trainer_ended_by_an_error_leaves_nothing_in_tmpdir": 2.1,
    "test_packed_run_counts_real_sequences_and_its_log_is_compliant": 2.0,
    "test_second_run_on_one_output_dir_is_refused_and_the_first_ends_clean": 2.0,
    "test_help_everywhere_and_numeric_settings_are_checked": 1.9,
    "test_a_failing_or_overrunning_stage_is_recorded_and_the_next_runs": 1.8,
    "test_a_stage_killed_mid_compile_leaves_nothing_to_the_next": 1.8,
    "test_pack_is_deterministic_and_parallel_equals_serial": 1.8,
    "test_the_plan_predicts_the_h100s_measured_peaks_within_10_percent": 1.8,
    "test_online_eval_stops_at_first_eval_reaching_target": 1.8,
    "test_checkpoints_written_while_training_goes_on_hold_their_step_and_resume_bit_identical": 1.7,
    "test_fp8_compiles_with_operands_cudas_scaled_mm_takes_and_eval_compiles_without": 1.6,
    "test_disk_full_at_a_checkpoint_keeps_the_last_one_and_the_rerun_resumes": 1.5,
    "test_a_launch_through_the_wrapper_leaves_nothing_in_tmpdir": 1.4,
    "test_sigterm_to_torchrun_alone_is_the_ranks_stop": 1.4,
    "test_a_signal_while_a_failed_rank_exits_changes_neither_line_nor_status": 1.4,
    "test_the_launcher_commands_of_the_docs_run_as_written": 1.3,
    "test_a_killed_loader_worker_comes_out_of_the_loader_not_at_any_bytecode": 1.3,
    "test_an_error_ends_the_pool_even_if_a_worker_outlives_its_sigterm": 1.1,
    "test_score_says_why_it_fails_one_line_per_reason": 1.1,
    "test_resume_with_other_defining_flags_is_refused": 1.1,
    "test_a_kill_during_a_background_write_leaves_no_file_that_looks_finished": 1.1,
    "test_rcp_presets_are_the_installed_rcps": 1.1,
    "test_clipping_modes_train_differently": 1.1,
    "test_save_checkpoints_steps_0_checkpoints_at_the_end_and_on_sigterm_only": 1.0,
    "test_launch_figures_are_the_trainers_resolution": 1.2,
    "test_the_batch_line_is_the_trainers_reading_of_the_flags_and_the_config_file": 1.0,
}
DEFAULT, SLOW_DEFAULT = 0.1, 3.0  # the other 681 tests: 0.11 s on average


def _unit(item):
    """The scheduling unit of ``item``: its file if it uses a module-scoped fixture of that file."""
    path = item.nodeid.split("::", 1)[0]
    name = os.path.basename(path)
    if getattr(item, "originalname", item.name) in TENSORFLOW:
        return "tensorflow"
    info = getattr(item, "_fixtureinfo", None)  # pytest's; without it, loadfile's grouping
    if info is None:
        return name
    for fixture in item.fixturenames:
        defs = info.name2fixturedefs.get(fixture)
        if not defs or defs[-1].scope not in ("module", "class", "package"):
            continue
        if defs[-1].baseid.split("::", 1)[0] == path and fixture not in CHEAP_SHARED \
                and "%s::%s" % (name, fixture) not in CHEAP_SHARED:
            return ACROSS_FILES.get(fixture, name)
    return None


def _cost(item, learned):
    """Seconds of ``item`` (CPU or wall, the larger) in the last run that had it, else the COST
    table's figure."""
    cost = learned.get(item.nodeid)
    if cost is None:
        cost = COST.get(item.originalname if hasattr(item, "originalname") else item.name)
    if cost is None:
        cost = SLOW_DEFAULT if item.get_closest_marker("slow") else DEFAULT
    return cost


# ---- each test's cost: CPU seconds (user + system) of the test process and of the children it
# waited for, over setup, call and teardown. Load on a shared machine stretches wall time, not
# this; but the work of processes it did not wait for (the ranks run_ranks forks from its fork
# server) and sleeps show only in wall time: the scheduler takes the larger. Workers send both to
# the controller in the report; the controller keeps the figures of the last run of each test in
# .pytest_cache (COST_KEY), which the next run's scheduler reads.
COST_KEY = "mlperf/test_cost_s"


def _cpu_now(children=True):
    """CPU seconds of this process and (``children``) of the children it has waited for."""
    import resource
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + (kids.ru_utime + kids.ru_stime if children else 0)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    import time
    item._cpu_start, item._own_start, item._wall_start = _cpu_now(), _cpu_now(False), time.time()
    item._tf_before = "tensorflow" in sys.modules
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if call.when == "teardown" and hasattr(item, "_cpu_start"):
        import time
        cpu, wall = round(_cpu_now() - item._cpu_start, 3), time.time() - item._wall_start
        report.user_properties += [("cpu_s", cpu), ("cost_s", round(max(cpu, wall), 3))]
        if not item._tf_before and "tensorflow" in sys.modules and _unit(item) != "tensorflow":
            report.user_properties.append(("tf_stray", True))
        if os.environ.get("MB_TEST_CPU_LOG"):  # a line per test as it ends (for a run cut short):
            # CPU s, nodeid, wall s, start (epoch s), worker, the worker's own CPU s (the rest is
            # the processes the test started and waited for): where a run waits, and on what
            with open(os.environ["MB_TEST_CPU_LOG"], "a") as f:
                f.write("%.3f %s %.3f %.3f %s %.3f\n" % (cpu, item.nodeid, wall, item._wall_start,
                                                          os.environ.get("PYTEST_XDIST_WORKER", "-"),
                                                          _cpu_now(False) - item._own_start))


def pytest_runtest_logreport(report):
    if report.when != "teardown" or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    for key, value in report.user_properties:
        if key == "cpu_s":
            _CPU_SEEN[report.nodeid] = value
        elif key == "cost_s":
            _COST_SEEN[report.nodeid] = value
        elif key == "tf_stray":
            TF_STRAYS.append(report.nodeid)


_CPU_SEEN, _COST_SEEN, TF_STRAYS = {}, {}, []


def pytest_sessionfinish(session):
    cache = getattr(session.config, "cache", None)
    if cache is None or not _COST_SEEN or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    learned = dict(cache.get(COST_KEY, {}))
    learned.update(_COST_SEEN)
    cache.set(COST_KEY, learned)


def pytest_terminal_summary(terminalreporter):
    for nodeid in TF_STRAYS:
        terminalreporter.write_line("warning: %s imported tensorflow outside conftest's TENSORFLOW unit (add "
                                    "it there: each worker that imports it pays 5-6 s of CPU)" % nodeid)
    if not _CPU_SEEN:
        return
    slowest = sorted(_CPU_SEEN.items(), key=lambda kv: -kv[1])[:10]
    tr = terminalreporter
    tr.write_sep("=", "CPU seconds (user+sys, with children): %.0f s in %d tests; most:"
                 % (sum(_CPU_SEEN.values()), len(_CPU_SEEN)))
    for nodeid, cpu in slowest:
        tr.write_line("%7.2fs %s" % (cpu, nodeid))


# xdist 3.8's loadgroup keeps a group on one worker by a suffix on the nodeid ("...@group"), which
# it sets as item._nodeid; pytest 9 builds nodeid from item._id, so the suffix was lost and every
# test was sent alone: a module fixture was made on both workers (two_nodes' 8 processes twice).
# So the workers write each test's group to GROUPS_DIR, and the controller's scheduler (xdist's
# pytest_xdist_make_scheduler hook) reads it there.
if not os.environ.get("PYTEST_XDIST_WORKER"):  # the controller (workers inherit its folder)
    import tempfile
    os.environ["MB_TEST_GROUPS_DIR"] = tempfile.mkdtemp(prefix="mb-test-groups-")


@pytest.hookimpl(optionalhook=True)  # an xdist hook: `pytest -p no:xdist` runs without it
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist_scopes import CrashSafeScopes

    class ByUnit(CrashSafeScopes):
        """xdist's scope scheduling (its crash path fixed) with our units (_unit) as the scopes."""
        _groups = None

        def _split_scope(self, nodeid):
            if self._groups is None:
                import json
                d = os.environ["MB_TEST_GROUPS_DIR"]
                names = sorted(n for n in os.listdir(d) if n.endswith(".json"))
                self._groups = json.load(open(os.path.join(d, names[0]))) if names else {}
            return self._groups.get(nodeid) or nodeid
    return ByUnit(config, log)


def pytest_unconfigure(config):
    if not os.environ.get("PYTEST_XDIST_WORKER") and os.environ.get("MB_TEST_GROUPS_DIR"):
        shutil.rmtree(os.environ["MB_TEST_GROUPS_DIR"], ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    if not getattr(config.option, "loadgroup", False):  # set on xdist workers under --dist loadgroup
        return
    cache = getattr(config, "cache", None)
    learned = cache.get(COST_KEY, {}) if cache is not None else {}
    units, cost, groups = [], {}, {}
    for item in items:
        group = _unit(item)
        if group:
            groups[item.nodeid] = "group:" + group
        key = group or item.nodeid
        if key not in cost:
            units.append(key)
            cost[key] = 0.0
        cost[key] += _cost(item, learned)
    order = {key: (-cost[key], i) for i, key in enumerate(units)}
    # stable: a group's tests keep their order; equal units keep the order of collection
    items.sort(key=lambda item: order[_unit(item) or item.nodeid])
    import json
    path = os.path.join(os.environ["MB_TEST_GROUPS_DIR"], os.environ.get("PYTEST_XDIST_WORKER", "main"))
    with open(path + ".tmp", "w") as f:
        json.dump(groups, f)
    os.replace(path + ".tmp", path + ".json")


@pytest.fixture
def short_tmpdir():
    """An empty folder for $TMPDIR whose path is short: under pytest's deep tmp_path (with xdist's
    popen-gwN) the DataLoader workers' socket path passes the 107 bytes a Unix socket may have."""
    import tempfile
    d = tempfile.mkdtemp(prefix="mb-", dir="/tmp")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def few_open_files():
    """``with few_open_files() as room:`` lowers this process's open-file limit (RLIMIT_NOFILE's soft
    value) to twice the files open now and 32 more, until the block ends; ``room``: how many more
    files it may then hold open."""
    import contextlib
    import resource

    @contextlib.contextmanager
    def lowered():
        old = resource.getrlimit(resource.RLIMIT_NOFILE)
        held = len(os.listdir("/proc/self/fd"))
        soft = 2 * held + 32
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, old[1]))
        try:
            yield soft - held
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, old)
    return lowered


def pytest_collection_finish(session):
    # What the test modules imported (torch, its compiler, mlperf_logging: ~750,000 objects) lives
    # as long as the worker: out of the collector's full passes, which walked all of it (~0.25 s
    # each), and fewer passes over what the tests make (dynamo's traces: millions of short-lived
    # objects). The compiling tests' garbage collection: 5.4 -> 2.9 s in ~65 s of CPU.
    import gc
    gc.freeze()
    gc.set_threshold(10000, 20, 20)
    # The malloc of the trainer's CPU runs (trainer/cpu_memory.py), from the first test on rather
    # than from the first Trainer this worker makes: the models tests run here without one
    # (levers, the compiled step, the model's) reuse their large blocks instead of faulting them in
    from mlperf_bert.trainer import cpu_memory
    cpu_memory.keep_freed_memory()
