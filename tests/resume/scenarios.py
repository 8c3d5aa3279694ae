"""Datasets, samplers and loader factories for the resume tests, and the differential runner.

Everything a worker receives is defined at module level so that spawn and forkserver workers can
unpickle it; ``python -m tests.resume.child`` builds the same loaders by scenario name in a new
process.  Items are ``[index, draws...]`` so a test sees both which sample came and which random
draws its worker made.
"""

from __future__ import annotations

import gc
import io
import os
import random
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, Sampler

import mploader

LENGTH = 20
BATCH = 3


def _log(log_dir: str | None, index: int) -> None:
    """Append ``index`` to this process's log: which items were really fetched."""
    if log_dir is not None:
        with open(os.path.join(log_dir, str(os.getpid())), "a") as log:
            log.write(f"{index}\n")


def fetched(log_dir: str) -> list[int]:
    return sorted(int(line) for name in os.listdir(log_dir)
                  for line in open(os.path.join(log_dir, name)))


def draws() -> list[int]:
    """One draw from each global generator of this process (numpy's Gaussian cache included)."""
    return [int(torch.randint(0, 10**6, ()).item()), int(np.random.randint(10**6)),
            int(np.random.normal() * 1e6), random.randrange(10**6)]


class Augmented(Dataset):
    """Map-style: item ``i`` is ``[i, draws...]``; optionally logs fetches and SIGKILLs its
    worker at item ``kill_at`` once (a marker file remembers)."""

    def __init__(self, length: int = LENGTH, log_dir: str | None = None,
                 kill_at: int | None = None, marker: str | None = None) -> None:
        self.length, self.log_dir, self.kill_at, self.marker = length, log_dir, kill_at, marker

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        if index == self.kill_at and self.marker and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        _log(self.log_dir, index)
        return torch.tensor([index, *draws()])


class PerItem(Dataset):
    """Map-style: item ``i`` is ``[i, a draw from mploader.item_generator()]`` (seeded from the
    worker seed, the iterator's epoch, the task and the position)."""

    def __len__(self) -> int:
        return LENGTH

    def __getitem__(self, index: int) -> torch.Tensor:
        draw = torch.randint(0, 10**6, (), generator=mploader.item_generator())
        return torch.tensor([index, int(draw)])


class Stream(IterableDataset):
    """Iterable without state: each worker yields its shard ``w, w + n, ...`` with draws."""

    def __init__(self, length: int = LENGTH, log_dir: str | None = None) -> None:
        self.length, self.log_dir = length, log_dir

    def shard(self) -> range:
        info = mploader.get_worker_info()
        start, step = (info.id, info.num_workers) if info is not None else (0, 1)
        return range(start, self.length, step)

    def __iter__(self) -> Iterator[torch.Tensor]:
        for index in self.shard():
            _log(self.log_dir, index)
            yield torch.tensor([index, *draws()])


class StatefulStream(Stream):
    """Iterable with ``state_dict``/``load_state_dict``: resumes at a position without drawing
    the items before it."""

    def __init__(self, length: int = LENGTH, log_dir: str | None = None) -> None:
        super().__init__(length, log_dir)
        self.position = 0
        self.start = 0

    def __iter__(self) -> Iterator[torch.Tensor]:
        shard = self.shard()
        start, self.start = self.start, 0
        self.position = start
        for position in range(start, len(shard)):
            self.position = position + 1  # items of the shard yielded so far
            _log(self.log_dir, shard[position])
            yield torch.tensor([shard[position], *draws()])

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.start = state["position"]


class NumpyState(StatefulStream):
    """A dataset whose state_dict() is not plain (a numpy integer)."""

    def state_dict(self) -> dict[str, Any]:
        return {"position": np.int64(self.position)}


class FixedOrder(Sampler[int]):
    """A sampler without state: a fixed permutation of its own."""

    def __init__(self, length: int = LENGTH) -> None:
        self.order = torch.randperm(length, generator=torch.Generator().manual_seed(11)).tolist()

    def __iter__(self) -> Iterator[int]:
        return iter(self.order)

    def __len__(self) -> int:
        return len(self.order)


class ResumableOrder(FixedOrder):
    """A sampler with ``state_dict``: resumes at a position; counts what it yields from where."""

    def __init__(self, length: int = LENGTH) -> None:
        super().__init__(length)
        self.position = 0
        self.start = 0
        self.starts: list[int] = []  # where each iteration began (the test reads it)

    def __iter__(self) -> Iterator[int]:
        start, self.start = self.start, 0
        self.starts.append(start)
        self.position = start
        for position in range(start, len(self.order)):
            self.position = position + 1  # indices yielded so far
            yield self.order[position]

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.start = state["position"]


# -- loaders by name (the child process builds them the same way) ---------------------------------


def _generator() -> torch.Generator:
    return torch.Generator().manual_seed(7)


def shuffled(**overrides: Any) -> mploader.DataLoader:
    arguments: dict[str, Any] = dict(batch_size=BATCH, shuffle=True, num_workers=2,
                                     generator=_generator(), multiprocessing_context="fork")
    arguments.update(overrides)
    dataset = arguments.pop("dataset", None) or Augmented()
    return mploader.DataLoader(dataset, **arguments)


def streamed(**overrides: Any) -> mploader.DataLoader:
    arguments: dict[str, Any] = dict(batch_size=2, num_workers=2, generator=_generator(),
                                     multiprocessing_context="fork")
    arguments.update(overrides)
    dataset = arguments.pop("dataset", None) or Stream()
    return mploader.DataLoader(dataset, **arguments)


SCENARIOS: dict[str, Callable[..., mploader.DataLoader]] = {
    "shuffled": shuffled,
    "shuffled_spawn": lambda: shuffled(multiprocessing_context="spawn"),
    "stateful_stream": lambda: streamed(dataset=StatefulStream()),
}


# -- the differential run --------------------------------------------------------------------------


def plain(batch: Any) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.tolist()
    if isinstance(batch, list | tuple):
        return [plain(item) for item in batch]
    return batch


@dataclass
class Split:
    """Where the first run stops: in epoch ``epoch``, after ``batches`` batches (``None``: after
    the epoch's end, StopIteration included)."""

    epoch: int
    batches: int | None
    state: dict[str, Any] = field(default_factory=dict)


def through_checkpoint(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` saved with ``torch.save`` and read back with ``torch.load(weights_only=True)``."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    loaded: dict[str, Any] = torch.load(buffer, weights_only=True)
    return loaded


def same_state(first: Any, second: Any) -> bool:
    """Whether two states are equal, tensors (a shuffle's generator) compared by value."""
    if isinstance(first, torch.Tensor) or isinstance(second, torch.Tensor):
        return (isinstance(first, torch.Tensor) and isinstance(second, torch.Tensor)
                and torch.equal(first, second))
    if isinstance(first, dict) and isinstance(second, dict):
        return first.keys() == second.keys() and all(
            same_state(first[key], second[key]) for key in first)
    if isinstance(first, list | tuple) and isinstance(second, list | tuple):
        return len(first) == len(second) and all(map(same_state, first, second))
    return bool(first == second)


def uninterrupted(make: Callable[[], mploader.DataLoader], epochs: int) -> list[list[Any]]:
    loader = make()
    result = [[plain(batch) for batch in loader] for _ in range(epochs)]
    close(loader)
    return result


def first_half(make: Callable[[], mploader.DataLoader], split: Split) -> list[list[Any]]:
    """Run up to the split, keep its state in ``split.state``; the batches seen so far."""
    loader = make()
    seen = [[plain(batch) for batch in loader] for _ in range(split.epoch)]
    iterator = iter(loader)
    if split.batches is None:
        seen.append([plain(batch) for batch in iterator])
    else:
        seen.append([plain(next(iterator)) for _ in range(split.batches)])
    # Every state a resume test makes goes through a checkpoint file on its way to the second
    # half, as a trainer saves it (tensors and all: a shuffle's generator is one).
    split.state = through_checkpoint(loader.state_dict())
    del iterator
    close(loader)
    return seen


def second_half(loader: mploader.DataLoader, state: dict[str, Any], split: Split,
                epochs: int) -> list[list[Any]]:
    """Load ``state`` into a fresh ``loader`` and run to the end of epoch ``epochs - 1``."""
    loader.load_state_dict(state)
    rest = [] if split.batches is not None else [[]]  # after StopIteration: the epoch is over
    while len(rest) + split.epoch < epochs:
        rest.append([plain(batch) for batch in loader])
    close(loader)
    return rest


def joined(seen: list[list[Any]], rest: list[list[Any]]) -> list[list[Any]]:
    epochs = [list(epoch) for epoch in seen]
    epochs[-1].extend(rest[0])
    return epochs + rest[1:]


def resumed(make: Callable[[], mploader.DataLoader], split: Split, epochs: int) -> list[list[Any]]:
    seen = first_half(make, split)
    return joined(seen, second_half(make(), split.state, split, epochs))


def close(loader: mploader.DataLoader) -> None:
    """Stop persistent workers now rather than at garbage collection."""
    iterator = getattr(loader, "_iterator", None)
    if iterator is not None:
        iterator._shutdown_workers()
    gc.collect()


def indices(epoch: list[Any]) -> list[int]:
    return [item[0] for batch in epoch for item in batch]

