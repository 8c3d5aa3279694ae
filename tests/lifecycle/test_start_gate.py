"""Forked workers but the first wait at their group's start gate until the main process has
forked them all (``mploader.worker.start_gate``): the gate must open, for every group, whoever
else inherits it, and never leave a descriptor behind in the main process."""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch

import mploader
from mploader.worker import start_gate
from tests.leaks import let_loaders_go

# A gate that did not open would hold the waiting workers this long: far beyond the test's own
# bound below, so a gate left shut fails the test instead of passing a second late.
HELD_SECONDS = 60.0


class WorkerPids(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 32

    def __getitem__(self, index: int) -> int:
        return os.getpid()


@pytest.fixture
def long_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(start_gate, "WAIT_SECONDS", HELD_SECONDS)  # forked workers inherit it


def _open_fds() -> set[int]:
    return {int(name) for name in os.listdir("/proc/self/fd")}


@pytest.mark.parametrize("persistent", [False, True], ids=["fresh", "persistent"])
def test_every_forked_worker_starts_once_all_are_forked(long_wait, persistent):
    loader = mploader.DataLoader(WorkerPids(), batch_size=1, num_workers=8,
                                 multiprocessing_context="fork", persistent_workers=persistent)
    before = _open_fds()
    started = time.monotonic()
    for _ in range(2):
        pids = {int(batch) for batch in loader}
        assert len(pids) == 8  # all 8 workers made batches
    assert time.monotonic() - started < HELD_SECONDS / 4
    del loader
    assert let_loaders_go()
    assert _open_fds() <= before  # the gate's pipe is closed in the main process


def test_two_groups_forked_at_once_from_two_threads_both_start(long_wait):
    """Each group's workers may inherit the other group's gate too: a gate that opened by EOF
    would then stay shut until those workers exit."""
    results: dict[str, set[int]] = {}

    def run(name: str) -> None:
        loader = mploader.DataLoader(WorkerPids(), batch_size=1, num_workers=4,
                                     multiprocessing_context="fork")
        results[name] = {int(batch) for batch in loader}

    threads = [threading.Thread(target=run, args=(name,)) for name in "ab"]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(HELD_SECONDS / 2)
    assert time.monotonic() - started < HELD_SECONDS / 4
    assert {name: len(pids) for name, pids in results.items()} == {"a": 4, "b": 4}
