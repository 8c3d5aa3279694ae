"""Keep a worker's large allocations on the reused heap instead of fresh mmaps.

glibc serves every allocation above 32 MiB with its own ``mmap`` and unmaps it on ``free``, so a
dataset that builds a fresh 600 MB array per item pays for faulting in 150,000 new pages every
time (about 100-150 ms here, more than the rest of the batch's trip).  Turning mmap allocations
off and raising the trim threshold makes freed memory stay in the process and be reused by the
next item: the same ``np.full((250000, 602))`` drops from 70-190 ms to 24-50 ms.  The price is
that a worker's RSS stays at its peak instead of shrinking between items, which a data-loading
worker reaches after its first batch anyway, until it says goodbye (:func:`give_heap_back`).
``MPLOADER_WORKER_MALLOC=default`` keeps glibc's defaults.
"""

from __future__ import annotations

import ctypes
import os

_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
# Freed memory below this much at the top of the heap is kept for reuse: mallopt's largest value
# (an int).  At 1 GiB, a worker that had two 600 MB arrays alive at once (the one its reply thread
# copies, the next one being made: mploader.worker.replies) gave 1.2 GB back at every epoch's end
# and faulted it in again.
_TRIM_THRESHOLD_BYTES = (1 << 31) - 1


def keep_large_allocations_on_heap() -> bool:
    """Apply the policy above; False where it does not apply (not glibc, or turned off)."""
    if os.environ.get("MPLOADER_WORKER_MALLOC", "heap") == "default":
        return False
    try:
        # The running program's own symbols, libc's among them.  (ctypes.util.find_library would
        # run ldconfig in a subprocess: slow, and a child process of the worker.)
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False  # musl and others have no mallopt
    return bool(mallopt(_M_MMAP_MAX, 0) and mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD_BYTES))


def give_heap_back() -> bool:
    """Return the heap's free memory to the system now (``malloc_trim``), as the policy above
    otherwise never does: a worker about to exit, whose teardown runs at the lowest priority,
    must not keep the next epoch's worker from the memory its last batches used.  False where
    it does not apply (not glibc)."""
    try:
        malloc_trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    malloc_trim(0)
    return True
