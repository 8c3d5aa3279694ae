"""Fixtures for the shared-memory channel tests.

Every test here runs under ``no_leaked_names``: afterwards ``/dev/shm`` must hold no new
``mploader-*`` entry created by this process or by a process that is gone (entries of other live
processes, say a concurrent test run, are not ours to judge).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.leaks import leaked_entries, let_loaders_go


@pytest.fixture(autouse=True)
def no_leaked_names() -> Iterator[None]:
    from mploader.channel.shm.names import list_names

    before = set(list_names())
    yield
    let_loaders_go()
    leaked = leaked_entries(before)
    assert not leaked, f"test left shared-memory entries behind: {sorted(leaked)}"
