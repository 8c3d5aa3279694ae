"""The same stop-and-resume with torchdata's ``StatefulDataLoader`` and ``mploader.DataLoader``:
where both can be compared (the same sampler and dataset, no worker-side randomness, which
torchdata does not promise), they agree on which samples remain, and in which batches."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch.utils.data import Dataset, IterableDataset, RandomSampler

import mploader

from .torchdata_side import (
    IGNORE_TORCHDATA_WARNINGS,
    StatefulDataLoader,
    StatefulDistributedSampler,
)

pytestmark = [pytest.mark.timeout(90), *IGNORE_TORCHDATA_WARNINGS]
LENGTH = 22


class Items(Dataset):
    def __len__(self) -> int:
        return LENGTH

    def __getitem__(self, index: int) -> int:
        return index


class Shards(IterableDataset):
    """Each worker yields its shard; ``state_dict`` is the position within it."""

    def __init__(self) -> None:
        self.position = 0
        self.start = 0

    def __iter__(self) -> Iterator[int]:
        info = torch.utils.data.get_worker_info()
        shard = range(info.id, LENGTH, info.num_workers) if info else range(LENGTH)
        start, self.start = self.start, 0
        for position in range(start, len(shard)):
            self.position = position + 1
            yield shard[position]

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.start = state["position"]


def remaining_after(loader_class: type, make_arguments: Callable[[], dict[str, Any]],
                    batches: int) -> list[list[int]]:
    """Stop after ``batches``, save, load into a fresh loader: the batches it gives."""
    first = loader_class(**make_arguments())
    iterator = iter(first)
    for _ in range(batches):
        next(iterator)
    state = first.state_dict()
    del iterator, first
    second = loader_class(**make_arguments())
    second.load_state_dict(state)
    return [batch.tolist() for batch in second]


CASES: dict[str, Callable[[], dict[str, Any]]] = {
    "random-sampler": lambda: dict(
        dataset=Items(), batch_size=3, num_workers=2, multiprocessing_context="fork",
        sampler=RandomSampler(range(LENGTH), generator=torch.Generator().manual_seed(5))),
    "distributed-sampler-with-state": lambda: dict(
        dataset=Items(), batch_size=3, num_workers=2, multiprocessing_context="fork",
        sampler=StatefulDistributedSampler(Items(), num_replicas=2, rank=0, shuffle=True, seed=1)),
    "iterable-with-state": lambda: dict(
        dataset=Shards(), batch_size=2, num_workers=2, multiprocessing_context="fork"),
    "one-process": lambda: dict(
        dataset=Items(), batch_size=4,
        sampler=RandomSampler(range(LENGTH), generator=torch.Generator().manual_seed(2))),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("batches", [1, 3])
def test_both_resume_to_the_same_remaining_samples(case: str, batches: int) -> None:
    theirs = remaining_after(StatefulDataLoader, CASES[case], batches)
    ours = remaining_after(mploader.DataLoader, CASES[case], batches)
    assert ours == theirs
    assert ours  # something remains
