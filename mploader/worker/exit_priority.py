"""A worker that said goodbye leaves the CPU to the loader (``mploader.process.reaper``).

What is left of its exit once it said goodbye is the kernel tearing its address space down: a
page-table entry per 4 KiB page of every block it mapped (about 30 ms per 640 MiB block here),
run by whichever of its threads ends last.  On a machine whose cores the next epoch's workers
and the consumer keep busy, that work competes with them for CPU: a 600 MB-batch epoch without
persistent workers took 1.3-1.4x the time of one with them, and waiting for the teardown
elsewhere did not help (the same CPU, taken at the next epoch's start).  At nice 19 it takes what
the loader leaves idle.  Nice 19 rather than ``SCHED_IDLE``: a nice value keeps a small share of
a saturated CPU (``SCHED_IDLE`` almost none), and an unprivileged process could not undo either.
"""

from __future__ import annotations

import os

# The lowest priority a nice value gives.
EXIT_NICE = 19


def lower_priority_for_exit() -> None:
    """Set every thread of this process to ``EXIT_NICE`` (on Linux a nice value is a thread's
    own).  Best effort: a thread that ended meanwhile, or a platform without ``/proc``, is
    passed over."""
    try:
        threads = [int(tid) for tid in os.listdir("/proc/self/task")]
    except OSError:
        threads = [0]  # this thread
    for tid in threads:
        try:
            os.setpriority(os.PRIO_PROCESS, tid, EXIT_NICE)
        except OSError:
            pass
