"""score: the official package checker and result summarizer on a real v5.0 submission package
(NVIDIA nyx, tests/data), and on the same package broken in the ways the rules reject."""
import json
import os
import subprocess
import sys
import tarfile

import pytest

from mlperf_bert.harness import score

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
BERT = os.path.join("NVIDIA", "results", "nyx_n1_ngc25.04_pytorch", "bert")


@pytest.fixture
def package(tmp_path):
    with tarfile.open(os.path.join(DATA, "submission_v5.0_NVIDIA_nyx_n1.tar.gz")) as t:
        t.extractall(tmp_path, filter="data")
    return tmp_path / "submission_v5.0_NVIDIA_nyx_n1"


def test_real_package_gets_its_official_score(package):
    proc = subprocess.run([sys.executable, "-m", "mlperf_bert", "score", "--json", str(package)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = json.loads(proc.stdout.splitlines()[-1])
    # what mlperf-logging 4.1.68 says of this package (tests/data/README.md)
    assert got == {"time_to_train_min": pytest.approx(3.5022071145, abs=1e-9),
                   "rcp_scaling_factor": pytest.approx(1.0028470154, abs=1e-9),
                   "samples_to_converge": 2436995.375, "package_check": "pass"}
    assert "result_0.txt        27912      2550982    3.6711  success" in proc.stdout
    assert not (package / "summary.json").exists()  # the official tools ran on a copy


def test_a_missing_log_fails_with_the_checkers_reason(package):
    os.remove(package / BERT / "result_3.txt")
    s = score.score(str(package))
    assert s["package_check"] == "fail"
    assert any("found 9, expected 10" in e for e in s["errors"]), s["errors"]


def test_two_aborted_runs_fail(package):
    for n in (1, 2):
        log = package / BERT / ("result_%d.txt" % n)
        log.write_text(log.read_text().replace('"status": "success"', '"status": "aborted"'))
    proc = subprocess.run([sys.executable, "-m", "mlperf_bert", "score", str(package)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout
    assert "package checker (mlperf_logging, training 5.0.0): FAIL" in proc.stdout
    assert "RCP Test Failed: Insufficient convergence" in proc.stdout  # the checker's reason
