"""Issue 48.5: the linter runs in `make test`, so the next unused import or variable fails a check."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _ruff(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def test_the_tree_passes_ruff_with_the_projects_settings():
    proc = _ruff(".")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_settings_catch_an_unused_import_and_an_unused_variable(tmp_path):
    """The rules pyproject.toml selects, applied to a module with both faults: a check of the tree
    that selected nothing would pass the test above."""
    bad = tmp_path / "mlperf_bert" / "bad.py"
    bad.parent.mkdir()
    bad.write_text("import os\n\n\ndef f():\n    unused = 1\n")
    proc = _ruff("--config", os.path.join(ROOT, "pyproject.toml"), str(bad), cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "F401" in proc.stdout and "F841" in proc.stdout, proc.stdout
