"""trainer/cpu_memory.py: a CPU run's freed blocks are reused without the kernel faulting in (and
zeroing) their pages again; the trainer sets it on the CPU."""
import os
import subprocess
import sys

from test_training import files, flags_for, one_thread  # noqa: F401

from mlperf_bert.trainer import cpu_memory, training

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# 64 MB written, freed and written again (a step's logits): the page faults of the second time
REUSE = """
import ctypes, resource, sys
sys.path.insert(0, %r)
from mlperf_bert.trainer import cpu_memory
kept = cpu_memory.keep_freed_memory() if sys.argv[1] == "kept" else None
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)
n = 64 << 20
def once():
    p = libc.malloc(n)
    ctypes.memset(p, 1, n)
    libc.free(p)
once()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
once()
print(kept, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
""" % ROOT


def test_a_freed_block_is_reused_without_faulting_its_pages_in_again():
    """glibc's defaults: the second 64 MB block is a new mmap, each of its 16,384 pages faulted in
    (and zeroed by the kernel) again; kept: the same heap pages, no new fault."""
    seen = {}
    for mode in ("default", "kept"):
        out = subprocess.run([sys.executable, "-c", REUSE, mode], capture_output=True, text=True, check=True).stdout
        kept, faults = out.split()
        seen[mode] = (kept, int(faults))
    assert seen["default"][0] == "None" and seen["default"][1] >= (64 << 20) // 4096 // 2, seen
    assert seen["kept"][0] == "True" and seen["kept"][1] < 100, seen


def test_the_trainer_keeps_freed_memory_on_the_cpu(files, tmp_path, monkeypatch):  # noqa: F811
    calls = []
    monkeypatch.setattr(cpu_memory, "keep_freed_memory", lambda: calls.append(1))
    assert training.main(flags_for(files, str(tmp_path / "out"), num_train_steps=2, num_workers=0,
                                   save_checkpoints_steps=1000)) == 0
    assert calls == [1]
