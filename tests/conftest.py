import gzip
import os
import shutil
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data")
sys.path.insert(0, ROOT)


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


S512_FLAGS = ["--max_seq_length=512", "--max_predictions_per_seq=76", "--dupe_factor=10"]


@pytest.fixture(scope="session")
def golden_s512(golden_dir, vocab_file, tmp_path_factory):
    """Our generator's output for the reference's golden s512 command (the MLPerf command on
    golden/input/part-00000-of-00004), made once per run by the script as users run it;
    test_pretraining_data proves it equal to the reference's by content digest."""
    import subprocess
    out = str(tmp_path_factory.mktemp("golden_s512") / "part-00000.s512.tfrecord")
    subprocess.run([sys.executable, os.path.join(ROOT, "create_pretraining_data.py"),
                    "--input_file=%s/input/part-00000-of-00004" % golden_dir, "--output_file=" + out,
                    "--vocab_file=" + vocab_file, "--do_lower_case=True", "--masked_lm_prob=0.15",
                    "--random_seed=12345"] + S512_FLAGS, check=True, capture_output=True)
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
