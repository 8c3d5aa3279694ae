"""The same stop-and-resume with torchdata's ``StatefulDataLoader`` and ``mploader.DataLoader``:
where both can be compared (the same sampler and dataset, no worker-side randomness, which
torchdata does not promise), they agree on which samples remain, and in which batches."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.utils.data import Dataset, RandomSampler

import mploader

from .torchdata_side import (
    IGNORE_TORCHDATA_WARNINGS,
    Shards,
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
        dataset=Shards(LENGTH), batch_size=2, num_workers=2, multiprocessing_context="fork"),
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
