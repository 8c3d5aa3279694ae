"""Datapipe graphs for the datapipe parity tests (module level: spawn workers unpickle them)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import IterDataPipe
from torch.utils.data.datapipes.iter import IterableWrapper
from torch.utils.data.datapipes.map import SequenceWrapper


def square(value: int) -> int:
    return value * value


class Noisy(IterDataPipe):
    """A random datapipe: each item with a draw from its own generator, seeded by ``set_seed``
    (the loader's shared seed), and one from the worker's torch generator (its worker seed)."""

    def __init__(self, source: IterDataPipe) -> None:
        self.source = source
        self.seed: int | None = None

    def set_seed(self, seed: int) -> Noisy:
        self.seed = seed
        return self

    def __iter__(self) -> Iterator[tuple[Any, float, int]]:
        shared = random.Random(self.seed)
        for item in self.source:
            yield item, shared.random(), int(torch.randint(0, 1000, ()).item())


def shuffled_sharded(n: int = 16) -> IterDataPipe:
    """Shuffle (buffer seeded by the shared seed: the same order in every worker), then shard:
    each worker gets a disjoint share of one permutation."""
    return Noisy(IterableWrapper(range(n)).shuffle().sharding_filter().map(square))


def sharded_without_shuffler(n: int = 10) -> IterDataPipe:
    return IterableWrapper(range(n)).sharding_filter()


def map_datapipe(n: int = 10) -> Any:
    return SequenceWrapper(range(n)).map(square)
