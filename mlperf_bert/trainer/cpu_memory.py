"""Host memory of a run on the CPU: freed blocks kept for the next step instead of given back.

glibc's malloc serves each block over 32 MB (the MLM head's logits: rows x prediction slots x
30,522 floats) with its own mmap and unmaps it when freed, and gives the freed top of its heap
back to the kernel; the next step's same-sized tensors then fault in pages the kernel zeroes again.
On a 2-core CPU the demo's 100 steps took 8.6 s with glibc's defaults (3.1 s of it in the kernel)
and 6.1 s (0.6 s) with this (bench/cpu_memory.py, 3 runs each). A GPU run allocates its tensors
on the device, so only a CPU run changes its malloc. The numbers do not change: only where the
memory comes from.
"""
import ctypes

M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc's malloc.h
TRIM_ABOVE = 2 ** 31 - 1  # bytes of free heap top kept (mallopt takes an int); a CPU run's steps reuse them


def keep_freed_memory():
    """Large blocks from the heap (no mmap per block), freed heap kept up to ``TRIM_ABOVE``.
    False where the C library has no ``mallopt`` (not glibc): nothing changes there."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return mallopt(M_MMAP_MAX, 0) == 1 and mallopt(M_TRIM_THRESHOLD, TRIM_ABOVE) == 1
