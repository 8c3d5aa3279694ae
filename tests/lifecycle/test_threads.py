"""``worker_threads``: faults hit the task they belong to, and nothing else.

A fetch thread's exception fails its batch only (torch's error for that batch, the epoch goes
on); a worker killed with several tasks in flight on its threads is replaced and the epoch is
delivered exactly once, in order; ``timeout=`` and ``stats()`` work per task.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest
import torch
from torch.utils.data import Dataset

import mploader

from .faulty import CustomError, Faulty, Slow

pytestmark = pytest.mark.timeout(60)


class FailsTwiceInABatch(Dataset):
    """Items 5 and 6 raise (one batch of 4); item 5 is slower, so item 6's thread fails first."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(0.03 if index == 5 else 0.005)
        if index in (5, 6):
            raise CustomError(f"bad item {index}", code=index)
        return torch.tensor([index])


class KillWhileOthersFetch(Dataset):
    """Item ``at`` SIGKILLs its worker once (a marker file remembers) while its other threads
    are inside their own fetches."""

    def __init__(self, marker: str, at: int = 9, length: int = 48) -> None:
        self.marker, self.at, self.length = marker, at, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(0.02)
        if index == self.at and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return torch.tensor([index])


def _outcomes(loader: Any) -> list[Any]:
    """Each step of an epoch: the batch's values, or the error's type, message and code."""
    outcomes: list[Any] = []
    iterator = iter(loader)
    while True:
        try:
            outcomes.append(next(iterator).flatten().tolist())
        except StopIteration:
            return outcomes
        except CustomError as error:
            outcomes.append((type(error).__name__, str(error), error.code))


@pytest.mark.parametrize("dataset", [Faulty("raise", at=5, length=16, sleep=0.005),
                                     FailsTwiceInABatch()], ids=["one", "two-in-a-batch"])
def test_a_threads_exception_fails_its_batch_only(dataset: Dataset) -> None:
    """The batch holding the failing item raises the original exception (of the first failing
    index, the one torch's sequential fetch raises); every other batch comes, in order."""
    loader = mploader.DataLoader(dataset, batch_size=4, num_workers=2, worker_threads=4,
                                 multiprocessing_context="fork")
    assert _outcomes(loader) == [
        [0, 1, 2, 3], ("CustomError", "bad item 5", 5), list(range(8, 12)), list(range(12, 16)),
    ]


def test_a_worker_killed_with_threads_in_flight_restarts_and_the_epoch_completes_once(
    start_method: str, tmp_path: Any
) -> None:
    marker = tmp_path / "killed"
    loader = mploader.DataLoader(KillWhileOthersFetch(str(marker)), batch_size=3, num_workers=2,
                                 worker_threads=4, max_worker_restarts=1,
                                 multiprocessing_context=start_method)
    iterator = iter(loader)
    got = [int(index) for batch in iterator for index in batch]
    assert marker.exists()
    assert got == list(range(48))  # every index exactly once, in order
    assert iterator.stats().restarts == 1


def test_timeout_fires_while_threads_hang_and_nothing_is_left_running() -> None:
    loader = mploader.DataLoader(Faulty("hang", at=6, length=16), batch_size=2, num_workers=2,
                                 worker_threads=3, timeout=1.5, multiprocessing_context="fork")
    got = []
    with pytest.raises(RuntimeError, match=r"^DataLoader timed out after 1\.5 seconds$"):
        for batch in loader:
            got.extend(batch.tolist())
    assert got == [[0], [1], [2], [3], [4], [5]]


def test_stats_count_tasks_per_task_with_threads_in_flight() -> None:
    loader = mploader.DataLoader(Slow(length=40, sleep=0.02), batch_size=2, num_workers=2,
                                 worker_threads=3, multiprocessing_context="fork")
    iterator = iter(loader)
    next(iterator)
    stats = iterator.stats()
    assert stats.tasks_in_flight == 2 * 2 * 3  # prefetch_factor x num_workers x worker_threads
    rest = list(iterator)
    assert len(rest) == 19
    stats = iterator.stats()
    assert sum(worker.tasks_done for worker in stats.workers) == 20
    assert stats.batches_delivered == 20


class KillsEachTime(Dataset):
    """Items in ``kill_at`` SIGKILL their worker: every time, or once each with a marker dir."""

    def __init__(self, kill_at: tuple[int, ...], marker_dir: str | None = None) -> None:
        self.kill_at, self.marker_dir = kill_at, marker_dir

    def __len__(self) -> int:
        return 60

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(0.01)
        if index in self.kill_at:
            marker = None if self.marker_dir is None else os.path.join(self.marker_dir, str(index))
            if marker is None or not os.path.exists(marker):
                if marker is not None:
                    open(marker, "w").close()
                os.kill(os.getpid(), signal.SIGKILL)
        return torch.tensor([index])


def test_a_poison_item_among_threads_is_named_after_two_deaths() -> None:
    loader = mploader.DataLoader(KillsEachTime((9,)), batch_size=2, num_workers=2,
                                 worker_threads=3, max_worker_restarts=5,
                                 multiprocessing_context="fork")
    with pytest.raises(mploader.WorkerDiedError, match=r"killed its worker twice") as caught:
        list(loader)
    assert "task 4 (indices [8, 9])" in str(caught.value)  # as the culprit or beside it
    del caught


def test_separate_deaths_with_threads_in_flight_are_not_mistaken_for_a_poison_task(
    tmp_path: Any
) -> None:
    loader = mploader.DataLoader(KillsEachTime((7, 41), str(tmp_path)), batch_size=2,
                                 num_workers=2, worker_threads=3, max_worker_restarts=2,
                                 multiprocessing_context="fork")
    iterator = iter(loader)
    assert [int(index) for batch in iterator for index in batch] == list(range(60))
    assert iterator.stats().restarts == 2
