"""Fixtures shared by every test folder: the start method, and the result channel.

``start_method`` runs a test under fork, spawn and forkserver; a test narrows it with
``@pytest.mark.parametrize("start_method", [...])``, which overrides the fixture.

``channel`` is the value to pass as ``mploader.DataLoader(shared_memory=...)``: ``False``
(pickled batches) and ``True`` (the pooled shared-memory channel).
"""

from __future__ import annotations

import pytest

START_METHODS = ("fork", "spawn", "forkserver")


@pytest.fixture(params=START_METHODS)
def start_method(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(params=[False, True], ids=["pickle", "shm"])
def channel(request: pytest.FixtureRequest) -> bool:
    return request.param
