"""Fixtures for the shared-memory channel tests.

Every test here runs under ``no_leaked_names``: afterwards ``/dev/shm`` must hold no new
``mploader-*`` entry created by this process or by a process that is gone (entries of other live
processes, say a concurrent test run, are not ours to judge).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from mploader import finalizers
from mploader.process import reaper
from tests.leaks import leaked_entries


@pytest.fixture(autouse=True)
def no_leaked_names() -> Iterator[None]:
    from mploader.channel.shm.names import list_names

    before = set(list_names())
    yield
    gc.collect()  # a loader in a reference cycle is freed here
    finalizers.settle(10)  # and its iterator shut down by the finalizer thread
    reaper.wait_for_all(30)  # workers that said goodbye reaped (their sentinels closed)
    gc.collect()
    leaked = leaked_entries(before)
    assert not leaked, f"test left shared-memory entries behind: {sorted(leaked)}"
