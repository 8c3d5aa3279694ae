"""A worker told to stop says goodbye once it has closed what it held (its hooks' sessions, its
shared-memory names, its results) and given its heap back; the rest of its exit, the kernel
tearing down its page tables, runs at the lowest priority and is waited for off the loader's path
(``mploader.process.reaper``), so that an epoch's end or the next epoch's workers never wait
for it.  A worker that never finishes exiting is still terminated."""

from __future__ import annotations

import gc
import logging
import multiprocessing.util
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import mploader
from mploader import finalizers
from mploader.process import reaper

from .conftest import wait_until_gone

# How long a lingering worker's exit takes after it said goodbye (a multiprocessing finalizer
# that sleeps, as a library's exit handler might): far beyond what the checks below need.
LINGER_SECONDS = 4.0
# Each item a fresh array this big, so that a worker that kept its heap shows it in its RSS.
ITEM_BYTES = 96 << 20


class BigItems(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> np.ndarray:
        return np.full(ITEM_BYTES // 8, index, dtype=np.float64)


class Lingering:
    """worker_init_fn: note the worker's anonymous memory now, and make its exit take
    ``seconds`` after its last Python code."""

    def __init__(self, folder: Path, seconds: float) -> None:
        self.folder = folder
        self.seconds = seconds

    def __call__(self, worker_id: int) -> None:
        (self.folder / f"rss-{os.getpid()}").write_text(str(_anonymous_bytes(os.getpid())))
        multiprocessing.util.Finalize(None, time.sleep, args=(self.seconds,), exitpriority=0)


class NotingTeardown(mploader.WorkerHooks):
    def __init__(self, folder: Path) -> None:
        super().__init__()
        self.folder = folder

    def teardown(self, info: object) -> None:
        (self.folder / f"teardown-{os.getpid()}").touch()


def _anonymous_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        lines = status.read().splitlines()
    for line in lines:
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    # A process that has exited and is not yet reaped (State: Z) has no memory left to count.
    state = next((line for line in lines if line.startswith("State:")), "no State")
    raise AssertionError(f"no RssAnon in /proc/{pid}/status ({state})")


def _nice_values(pid: int) -> set[int]:
    values = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # that thread ended meanwhile
        values.add(int(fields[16]))  # field 19 of stat(5), counted after the name
    return values


def _lingering_loader(folder: Path, start_method: str, seconds: float) -> mploader.DataLoader:
    return mploader.DataLoader(
        BigItems(), batch_size=None, num_workers=2, multiprocessing_context=start_method,
        worker_init_fn=Lingering(folder, seconds), worker_hooks=NotingTeardown(folder),
    )


def test_an_epoch_ends_without_waiting_for_its_workers_exits(start_method, tmp_path):
    iterator = iter(_lingering_loader(tmp_path, start_method, LINGER_SECONDS))
    workers = list(iterator._workers)
    assert len(list(iterator)) == 4
    alive = [worker.is_alive() for worker in workers]
    pids = sorted(worker.pid for worker in workers)
    torn_down = sorted(int(path.name.split("-")[1]) for path in tmp_path.glob("teardown-*"))
    try:
        assert torn_down == pids, "the hooks' teardown ran before the epoch ended"
        assert alive == [True, True], "the epoch's end waited for its workers' exits"
        for worker in workers:
            # what is left of its exit runs at the lowest priority, with its heap given back
            assert _nice_values(worker.pid) == {19}
            at_start = int((tmp_path / f"rss-{worker.pid}").read_text())
            assert _anonymous_bytes(worker.pid) < at_start + ITEM_BYTES // 2
    finally:
        for worker in workers:
            worker.join(LINGER_SECONDS + 10)
    assert [worker.exitcode for worker in workers] == [0, 0]


def test_a_worker_that_never_finishes_exiting_is_terminated(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(reaper, "EXIT_DEADLINE_SECONDS", 0.5)
    iterator = iter(_lingering_loader(tmp_path, "fork", 3600.0))
    workers = list(iterator._workers)
    with caplog.at_level(logging.WARNING, logger="mploader"):
        assert len(list(iterator)) == 4
        assert wait_until_gone([worker.pid for worker in workers], seconds=10) == []
        for worker in workers:
            worker.join(5)
    assert [worker.exitcode for worker in workers] == [-signal.SIGTERM] * 2
    warnings = [record.getMessage() for record in caplog.records]
    for worker in workers:
        assert any(f"pid {worker.pid}" in text and "said goodbye" in text for text in warnings)


@pytest.mark.parametrize("persistent", [False, True], ids=["fresh", "persistent"])
def test_workers_that_said_goodbye_are_gone_once_the_reaper_is_done(persistent):
    loader = mploader.DataLoader(BigItems(), batch_size=None, num_workers=2,
                                 multiprocessing_context="fork", persistent_workers=persistent)
    pids = []
    for _ in range(2):
        iterator = iter(loader)
        pids += [worker.pid for worker in iterator._workers]
        assert len(list(iterator)) == 4
    del loader, iterator
    gc.collect()
    assert finalizers.settle(10), "the loader's shutdown did not run"
    assert reaper.wait_for_all(10), "the reaper still waits for some exit"
    assert wait_until_gone(pids, seconds=1) == []
