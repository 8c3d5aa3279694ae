"""Fixtures for the shared-memory channel tests.

Every test module here runs under ``no_leaked_blocks``: afterwards, once the loaders it made are
let go, this process and its children hold no pool block they did not hold before (per module: a
module's fixture may keep a channel, and its blocks, from test to test); and every test under
``no_shm_entries``: ``/dev/shm`` gets no ``mploader`` entry (blocks are anonymous memory files:
they never appear there).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.leaks import leaked_entries, let_loaders_go, own_blocks, shm_entries

_SETTLE_SECONDS = 5.0


@pytest.fixture(autouse=True, scope="module")
def no_leaked_blocks() -> Iterator[None]:
    blocks_before = set(own_blocks())
    yield
    let_loaders_go()
    deadline = time.monotonic() + _SETTLE_SECONDS
    while (left := set(own_blocks()) - blocks_before) and time.monotonic() < deadline:
        time.sleep(0.05)
        let_loaders_go()
    assert not left, f"tests left {len(left)} pool block(s) mapped or open (inodes {sorted(left)})"


@pytest.fixture(autouse=True)
def no_shm_entries() -> Iterator[None]:
    entries_before = shm_entries()
    yield
    leaked = leaked_entries(entries_before)
    assert not leaked, f"test left entries in /dev/shm: {sorted(leaked)}"
