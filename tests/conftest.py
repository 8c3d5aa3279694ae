"""Fixtures shared by every test folder: the start method, and the result channel.

``start_method`` runs a test under fork, spawn and forkserver; a test narrows it with
``@pytest.mark.parametrize("start_method", [...])``, which overrides the fixture.

``channel`` is the value to pass as ``mploader.DataLoader(shared_memory=...)``: ``False``
(pickled batches) and ``True`` (the pooled shared-memory channel), the latter skipped while
``mploader.shm`` is not importable or lacks its channel.
"""

from __future__ import annotations

import importlib

import pytest

START_METHODS = ("fork", "spawn", "forkserver")


def shared_memory_channel_missing() -> str | None:
    """Why the shared-memory channel cannot be used here, or None if it can."""
    try:
        shm = importlib.import_module("mploader.shm")
    except Exception as error:  # the channel is optional while it is being written
        return f"mploader.shm does not import: {type(error).__name__}: {error}"
    missing = [
        name
        for name in ("WorkerChannel", "MainChannel", "resolve_shared_memory")
        if not hasattr(shm, name)
    ]
    if missing:
        return f"mploader.shm lacks {', '.join(missing)} (the channel has not landed yet)"
    return None


@pytest.fixture(params=START_METHODS)
def start_method(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(params=[False, True], ids=["pickle", "shm"])
def channel(request: pytest.FixtureRequest) -> bool:
    if request.param:
        reason = shared_memory_channel_missing()
        if reason is not None:
            pytest.skip(reason)
    return request.param
