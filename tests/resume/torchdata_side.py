"""torchdata's ``StatefulDataLoader`` for the side-by-side resume tests (a test module that
imports this is skipped where torchdata is missing), and the warnings its iterator gives."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch.utils.data import IterableDataset

stateful_dataloader = pytest.importorskip("torchdata.stateful_dataloader")
StatefulDataLoader = stateful_dataloader.StatefulDataLoader
StatefulDistributedSampler = pytest.importorskip(
    "torchdata.stateful_dataloader.sampler").StatefulDistributedSampler

# torchdata's own iterator warns about torch APIs it uses; not ours to fix
IGNORE_TORCHDATA_WARNINGS = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore:'set_vital' is deprecated"),
]


class Shards(IterableDataset[int]):
    """Each worker yields its shard of ``range(length)``; ``state_dict`` is the position within
    it (a shard read to its end starts over)."""

    def __init__(self, length: int) -> None:
        self.length = length
        self.position = 0
        self.start = 0

    def __iter__(self) -> Iterator[int]:
        info = torch.utils.data.get_worker_info()
        shard = range(info.id, self.length, info.num_workers) if info else range(self.length)
        start, self.start = self.start, 0
        if start >= len(shard):
            start = 0
        for position in range(start, len(shard)):
            self.position = position + 1
            yield shard[position]

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.start = state["position"]
