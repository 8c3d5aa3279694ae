"""What a test may leave in ``/dev/shm``: nothing of its own.

An entry is this test run's own when its main pid (the first field after ``mploader-``) is this
process, one of its descendants, or a process that is gone.  Entries of other live processes (a
concurrent test run in another checkout, another user's loader) are not ours to judge.
"""

from __future__ import annotations

import gc
import os
import re
import time
from collections.abc import Iterable

import psutil

from mploader import finalizers
from mploader.process import reaper

_MAIN_PID = re.compile(r"^mploader-(\d+)-")


def let_loaders_go(seconds: float = 30.0) -> bool:
    """Shut down every iterator nothing references any more and wait until its workers are
    gone: an iterator in a reference cycle (an exception's traceback) is freed, the finalizer
    thread shuts it down, the reaper waits for the workers that said goodbye (their process
    objects, which hold a sentinel each, freed with them).  Whether all of that happened within
    ``seconds`` (each)."""
    gc.collect()
    settled = finalizers.settle(seconds)
    reaped = reaper.wait_for_all(seconds)
    gc.collect()
    return settled and reaped


def shm_entries() -> set[str]:
    return {name for name in os.listdir("/dev/shm") if "mploader" in name}


# A main process killed by another test running at the same time (pytest-xdist) leaves entries
# that its workers remove within a fraction of a second; one still there after this is a leak,
# whoever made it.
DEAD_MAIN_GRACE_SECONDS = 3.0


def leaked_entries(before: Iterable[str]) -> set[str]:
    """Entries new since ``before`` that belong to this process or its descendants, or to a
    process that is gone and were not cleaned up within ``DEAD_MAIN_GRACE_SECONDS``."""
    new = shm_entries() - set(before)
    if not new:
        return set()
    ours = {os.getpid()} | {child.pid for child in psutil.Process().children(recursive=True)}
    leaked = set()
    of_the_dead = set()
    for name in new:
        match = _MAIN_PID.match(name)
        main_pid = int(match.group(1)) if match else -1
        if main_pid in ours:
            leaked.add(name)
        elif not psutil.pid_exists(main_pid):
            of_the_dead.add(name)
    deadline = time.monotonic() + DEAD_MAIN_GRACE_SECONDS
    while of_the_dead and time.monotonic() < deadline:
        time.sleep(0.05)
        of_the_dead &= shm_entries()
    return leaked | of_the_dead


def own_shm_entries() -> set[str]:
    """Entries whose main pid is this process (what one test run's loaders create)."""
    prefix = f"mploader-{os.getpid()}-"
    return {name for name in shm_entries() if name.startswith(prefix)}


def own_shm_bytes() -> int:
    """Bytes of ``mploader`` shared memory mapped by this process or its descendants (each block
    counted once, named or already unlinked): unlike the tmpfs's usage, blind to other programs."""
    sizes: dict[int, int] = {}
    pids = [os.getpid(), *(child.pid for child in psutil.Process().children(recursive=True))]
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as maps:
                lines = [line for line in maps if "/dev/shm/mploader" in line]
        except OSError:
            continue  # it ended meanwhile
        for line in lines:
            address, _, _, _, inode, *_ = line.split()
            start, end = (int(part, 16) for part in address.split("-"))
            sizes[int(inode)] = max(sizes.get(int(inode), 0), end - start)
    return sum(sizes.values())
