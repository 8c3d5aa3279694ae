"""A worker's exit status read from two threads at once (issue found by PyTorch's own
``test_iterable_style_dataset`` with persistent workers under ``mploader.install()``).

An iterator collected with persistent workers is shut down on mploader's finalizer thread, which
reaps the workers while the user's thread may ``join()`` the ``_workers`` that torch's API hands
out and ask ``is_alive()``.  multiprocessing's fork ``Popen.poll`` reaps with ``waitpid`` and only
then records the status: the thread that loses the race gets ``ECHILD`` and reads it as "still
running".  mploader's workers poll their exit status one thread at a time.
"""

from __future__ import annotations

import multiprocessing
import sys
import threading
import time
from collections.abc import Iterator

import pytest
import torch

import mploader
from mploader.process.group import serialize_exit_polls


@pytest.fixture
def tiny_switch_interval() -> Iterator[None]:
    """Threads switch at nearly every bytecode: the race's window is hit in a few percent of
    tries instead of rarely."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(interval)


def _exits_soon() -> None:
    time.sleep(0.01)


def _reap(process: multiprocessing.process.BaseProcess) -> None:
    """As a shutdown on the finalizer thread does."""
    while process.is_alive():
        time.sleep(0.0001)


def _join(process: multiprocessing.process.BaseProcess, wrong: list[tuple[bool, int | None]]
          ) -> None:
    """As the user's thread does with ``iterator._workers``."""
    process.join(5)
    if process.is_alive() or process.exitcode != 0:
        wrong.append((process.is_alive(), process.exitcode))


@pytest.mark.usefixtures("tiny_switch_interval")
def test_a_worker_reaped_by_another_thread_is_not_alive_after_join() -> None:
    wrong: list[tuple[bool, int | None]] = []
    for _ in range(100):
        process = multiprocessing.get_context("fork").Process(target=_exits_soon)
        process.start()
        serialize_exit_polls(process)
        threads = [threading.Thread(target=_reap, args=(process,)),
                   threading.Thread(target=_join, args=(process, wrong))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        process.join()
        process.close()  # its sentinel pipe with it
    assert wrong == []


class _Counting(torch.utils.data.IterableDataset):
    def __iter__(self) -> Iterator[int]:
        info = torch.utils.data.get_worker_info()
        assert info is not None
        return iter(range(info.id, 12, info.num_workers))


def test_persistent_workers_joined_after_the_iterator_is_dropped() -> None:
    """PyTorch's test, in short: drop a persistent iterator and its loader, join the workers."""
    loader = mploader.DataLoader(_Counting(), batch_size=2, num_workers=3,
                                 persistent_workers=True, multiprocessing_context="fork")
    iterator = iter(loader)
    assert sorted(int(x) for batch in iterator for x in batch) == list(range(12))
    workers = iterator._workers
    del iterator, loader
    for worker in workers:
        worker.join(30)
        assert not worker.is_alive()
        assert worker.exitcode == 0


def _exits_later() -> None:
    time.sleep(2.0)


def test_a_join_without_timeout_does_not_hold_up_other_polls() -> None:
    """A thread blocked in ``join()`` must not make ``is_alive()`` wait in another thread (a
    shutdown that polls would wait for the worker it is about to stop)."""
    process = multiprocessing.get_context("fork").Process(target=_exits_later)
    process.start()
    serialize_exit_polls(process)
    joiner = threading.Thread(target=process.join)
    joiner.start()
    time.sleep(0.05)  # the joiner is blocked now
    started = time.monotonic()
    assert process.is_alive()
    assert time.monotonic() - started < 1.0, "is_alive() waited for the blocked join()"
    joiner.join()
    assert not process.is_alive() and process.exitcode == 0
    process.close()
