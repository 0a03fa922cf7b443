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
