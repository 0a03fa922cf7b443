"""``python -m mlperf_bert``: its --version, and each command's --help opening with what it does."""
import os
import subprocess
import sys
import tomllib

import pytest

import mlperf_bert
from mlperf_bert import __main__ as entry, cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_version_is_the_packages():
    """Issue 47 (14): ``--version`` was an unknown command. It prints the version pyproject.toml
    gives the installed package, which is the package's ``__version__``."""
    r = subprocess.run([sys.executable, "-m", "mlperf_bert", "--version"], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        declared = tomllib.load(f)["project"]["version"]
    assert (r.returncode, r.stdout, r.stderr) == (0, "mlperf_bert %s\n" % declared, "")
    assert mlperf_bert.__version__ == declared
    assert "--version" in entry.usage().splitlines()[0]


def test_each_commands_help_starts_with_what_it_does(capsys, monkeypatch):
    """Issue 47 (14): ``python -m mlperf_bert X --help`` began with the usage line and absl's
    module name: its first line now says what X does (the command list's line), the command's
    own help follows. torchrun's options come before its script: a --help after the script is the
    script's, not torchrun's."""
    monkeypatch.setattr(cli, "_leave_lightly", lambda: None)  # (no gc.freeze in the test process)
    for name, (_, what) in entry.COMMANDS.items():
        with pytest.raises(SystemExit) as e:
            entry.main(["mlperf_bert", name, "--help"])
        out = capsys.readouterr().out.splitlines()
        assert e.value.code in (0, None), name
        assert out[0] == "%s: %s" % (name, what), name
        assert out[1].startswith("usage: ") and name in out[1], (name, out[:3])
    assert entry.asks_help("torchrun", []) and entry.asks_help("torchrun", ["-h"])
    assert not entry.asks_help("torchrun", ["--nproc_per_node=2", "run_pretraining.py", "--help"])
    assert entry.asks_help("train", ["--do_train", "--help"]) and not entry.asks_help("train", ["--do_train"])
