"""max_worker_restarts: a killed worker is replaced and delivery stays exactly-once and in order."""

from __future__ import annotations

import os
import re
import signal

import pytest
import torch
from torch.utils.data import Dataset

import mploader
from mploader.errors import PoisonTaskError, WorkerDiedError

from .faulty import FailingIter


class KillOnce(Dataset):
    """Item ``at`` SIGKILLs its worker the first time only (a marker file remembers)."""

    def __init__(self, marker: str, at: int = 5, length: int = 24) -> None:
        self.marker, self.at, self.length = marker, at, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        if index == self.at and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return torch.tensor([index])


class AlwaysKill(Dataset):
    def __len__(self) -> int:
        return 12

    def __getitem__(self, index: int):
        if index == 5:
            os.kill(os.getpid(), signal.SIGKILL)
        return torch.tensor([index])


def test_killed_worker_is_replaced_and_every_index_comes_once_in_order(start_method, tmp_path):
    loader = mploader.DataLoader(KillOnce(str(tmp_path / "killed")), batch_size=2, num_workers=2,
                                 multiprocessing_context=start_method, max_worker_restarts=1)
    iterator = iter(loader)
    got = [int(i) for batch in iterator for i in batch]
    assert got == list(range(24))
    assert (tmp_path / "killed").exists()


def test_restarts_report_in_stats(tmp_path):
    loader = mploader.DataLoader(KillOnce(str(tmp_path / "killed")), batch_size=2, num_workers=2,
                                 multiprocessing_context="fork", max_worker_restarts=3,
                                 persistent_workers=True)
    iterator = iter(loader)
    assert [int(i) for batch in iterator for i in batch] == list(range(24))
    assert iterator.stats().restarts == 1
    assert [int(i) for batch in loader for i in batch] == list(range(24))  # next epoch works
    iterator._shutdown_workers()


def test_poison_task_is_named_by_its_indices():
    loader = mploader.DataLoader(AlwaysKill(), batch_size=2, num_workers=2,
                                 multiprocessing_context="fork", max_worker_restarts=5)
    with pytest.raises(PoisonTaskError) as caught:
        list(loader)
    message = str(caught.value)
    assert re.search(r"task 2 \(indices \[4, 5\]\) killed its worker twice", message)
    assert message.count("SIGKILL") >= 2
    del caught


def test_past_the_limit_fails_as_without_restarts(tmp_path):
    class_ = AlwaysKill
    loader = mploader.DataLoader(class_(), batch_size=2, num_workers=2,
                                 multiprocessing_context="fork", max_worker_restarts=0)
    with pytest.raises(WorkerDiedError, match=r"is killed by signal: Killed") as caught:
        list(loader)
    assert not isinstance(caught.value, PoisonTaskError)
    del caught


def test_restarts_are_refused_for_iterable_datasets():
    with pytest.raises(ValueError, match="max_worker_restarts needs a map-style dataset"):
        mploader.DataLoader(FailingIter(), num_workers=2, max_worker_restarts=1)
