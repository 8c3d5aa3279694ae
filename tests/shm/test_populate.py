"""Filling a handed block's page tables (``block.populate``) must not stall the rest of the
worker.

``madvise(MADV_POPULATE_READ)`` holds the process's address-space lock (``mmap_lock``) for
reading for as long as one call runs, and every ``mmap``, ``brk`` (malloc growing the heap) and
thread start needs it for writing.  One call over a whole 640 MiB block kept a new worker's
watchdog thread, its heap growth and its first fetch waiting for the populate thread (tens of
milliseconds per block, at every epoch's start without persistent workers).  ``populate`` works
in chunks, so a writer waits for one chunk at most.
"""

from __future__ import annotations

import mmap
import os
import threading
import time

from mploader.channel.shm import block as shm_block

BLOCK_BYTES = 1 << 30  # populating it takes long enough (about 0.1 s here) to be caught mid-way


def test_a_mapping_made_while_a_block_is_populated_does_not_wait_for_all_of_it():
    sent: list[int] = []
    # the pages exist, as in a handed block
    created = shm_block.create_block(BLOCK_BYTES, "mploader-test-populate",
                                     lambda descriptor: sent.append(os.dup(descriptor)))
    try:
        handed = shm_block.map_descriptor(sent[0], BLOCK_BYTES)  # no page tables yet
        started, populate_seconds = threading.Event(), []

        def fill() -> None:
            started.set()
            begun = time.monotonic()
            shm_block.populate(handed)
            populate_seconds.append(time.monotonic() - begun)

        populating = threading.Thread(target=fill)
        populating.start()
        started.wait()
        time.sleep(0.005)  # well inside the populate call
        asked = time.monotonic()
        anonymous = mmap.mmap(-1, 1 << 20)  # needs mmap_lock for writing
        mmap_seconds = time.monotonic() - asked
        populating.join()
        anonymous.close()
        # One call over the block: the mmap waited for nearly all of it (91 of 97 ms here).
        # In chunks: for one chunk at most (under a millisecond).
        assert mmap_seconds < 0.5 * populate_seconds[0], (
            f"an mmap took {1e3 * mmap_seconds:.1f} ms during a populate of "
            f"{1e3 * populate_seconds[0]:.1f} ms: it waited for the whole block")
        assert resident_bytes(handed.address) == BLOCK_BYTES  # and populate did populate it
    finally:
        del created  # the mappings go with the test's frame


def resident_bytes(address: int) -> int:
    """The Rss of the mapping starting at ``address`` in this process (from /proc/self/smaps)."""
    start = f"{address:x}-"
    with open("/proc/self/smaps") as smaps:
        inside = False
        for line in smaps:
            if "-" in line.split()[0] and not line.startswith(("Rss", "Size")):
                inside = line.startswith(start)
            elif inside and line.startswith("Rss:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no mapping at {address:x}")
