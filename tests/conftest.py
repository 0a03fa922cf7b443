import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(ROOT), "shared")
sys.path.insert(0, ROOT)


@pytest.fixture(scope="session")
def shared():
    """Path of ../shared; tests that need it skip with a clear message when it is absent."""
    if not os.path.isdir(SHARED):
        pytest.skip("../shared/ is absent: this test needs the shared reference data beside the repo")
    return SHARED


@pytest.fixture(scope="session")
def vocab_file(shared):
    return os.path.join(shared, "data", "vocab.txt")


@pytest.fixture(scope="session")
def golden_dir(shared):
    return os.path.join(shared, "golden")
