"""Filling a handed block's page tables (``block.populate``) must not stall the rest of the
worker.

``madvise(MADV_POPULATE_READ)`` holds the process's address-space lock (``mmap_lock``) for
reading for as long as one call runs, and every ``mmap``, ``brk`` (malloc growing the heap) and
thread start needs it for writing.  One call over a whole 640 MiB block kept a new worker's
watchdog thread, its heap growth and its first fetch waiting for the populate thread (tens of
milliseconds per block, at every epoch's start without persistent workers; an ``mmap`` waited
91 of a 1 GiB populate's 97 ms).  ``populate`` works in chunks, so a writer waits for one chunk
at most: checked here by the calls it makes (timings on a 2-core machine under load are not a
test), and by the block ending up resident.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from mploader.channel.shm import block as shm_block

BLOCK_BYTES = (1 << 30) + (3 << 20)  # not a whole number of chunks: the last one is short
MOST_A_WRITER_WAITS_FOR = 8 << 20  # one call's range: a few ms of page-table filling at most


class RecordingLibc:
    """The C library, its ``madvise`` calls recorded."""

    def __init__(self, libc: Any) -> None:
        self.libc = libc
        self.calls: list[tuple[int, int, int]] = []

    def madvise(self, address: int, length: int, advice: int) -> int:
        self.calls.append((address, length, advice))
        return int(self.libc.madvise(address, length, advice))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.libc, name)


def test_a_block_is_populated_in_chunks_that_cover_it(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[int] = []
    # the pages exist, as in a handed block
    created = shm_block.create_block(BLOCK_BYTES, "mploader-test-populate",
                                     lambda descriptor: sent.append(os.dup(descriptor)))
    try:
        handed = shm_block.map_descriptor(sent[0], BLOCK_BYTES)  # no page tables yet
        libc = RecordingLibc(shm_block._libc)
        monkeypatch.setattr(shm_block, "_libc", libc)
        shm_block.populate(handed)
        ranges = [(address, length) for address, length, _ in libc.calls]
        assert len(ranges) > 1, "one call over the whole block holds mmap_lock throughout"
        assert all(length <= MOST_A_WRITER_WAITS_FOR for _, length in ranges)
        position = handed.address
        for address, length in ranges:  # in order, end to end, nothing twice
            assert address == position
            position += length
        assert position == handed.address + BLOCK_BYTES
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
