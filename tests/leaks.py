"""What a test may leave behind: no loader, no worker, no block of shared memory.

Blocks are anonymous memory files (``/memfd:mploader-w<id>`` in ``/proc/<pid>/maps`` and
``/proc/<pid>/fd``), so nothing of mploader's should ever appear in ``/dev/shm``: any
``mploader`` entry there is a leak, whoever made it.
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Iterable

import psutil

from mploader import finalizers
from mploader.process import reaper


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


# A main process killed by another test running at the same time (pytest-xdist) takes a moment
# to be torn down; an entry still there after this is a leak, whoever made it.
DEAD_MAIN_GRACE_SECONDS = 3.0


def leaked_entries(before: Iterable[str]) -> set[str]:
    """``/dev/shm`` entries of mploader's new since ``before`` (there should never be any)."""
    new = shm_entries() - set(before)
    deadline = time.monotonic() + DEAD_MAIN_GRACE_SECONDS
    while new and time.monotonic() < deadline:
        time.sleep(0.05)
        new &= shm_entries()
    return new


BLOCK_LABEL = "/memfd:mploader"


def is_block(target: str) -> bool:
    """Whether an fd's link or a mapping's path is a block of mploader's pool."""
    return target.startswith(BLOCK_LABEL)


def blocks_of(pids: Iterable[int]) -> dict[int, int]:
    """The pool blocks that ``pids`` map or hold open: inode (all memory files live on the
    kernel's one internal tmpfs) -> mapped bytes (0 for a block held by a descriptor only),
    each block counted once."""
    blocks: dict[int, int] = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as maps:
                lines = [line for line in maps if BLOCK_LABEL in line]
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue  # it ended meanwhile
        for line in lines:
            address, _, _, _, inode, *_ = line.split()
            start, end = (int(part, 16) for part in address.split("-"))
            blocks[int(inode)] = max(blocks.get(int(inode), 0), end - start)
        for fd in fds:
            try:
                if not is_block(os.readlink(f"/proc/{pid}/fd/{fd}")):
                    continue
                inode = os.stat(f"/proc/{pid}/fd/{fd}").st_ino
            except OSError:
                continue
            blocks.setdefault(inode, 0)
    return blocks


def own_blocks() -> dict[int, int]:
    """The blocks this process and its descendants map or hold open."""
    pids = [os.getpid(), *(child.pid for child in psutil.Process().children(recursive=True))]
    return blocks_of(pids)


def own_shm_bytes() -> int:
    """Bytes of mploader's blocks mapped by this process or its descendants (each block counted
    once): unlike the machine's ``Shmem``, blind to other programs."""
    return sum(own_blocks().values())
