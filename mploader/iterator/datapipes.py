"""Datapipe datasets in the main process, as torch's iterators treat them.

* The loader (torch's own ``__init__``) wraps an ``IterDataPipe``/``MapDataPipe`` in torch's
  serialization wrapper, and ``shuffle=`` with an ``IterDataPipe`` sets its shufflers.
* Each iterator, and each new epoch of a persistent one, draws a *shared seed* (one int64 from
  the loader's ``generator``, before the base seed; broadcast from rank 0 when
  ``torch.distributed`` is initialized) and seeds the graph's random datapipes with it, here and
  in every worker (:class:`SharedSeeds`).
* Sharding: by ``(world_size, rank)`` without workers; in workers by
  :func:`mploader.worker.datapipes.shard_then_init`, passed as their ``worker_init_fn``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import IterDataPipe, graph_settings

from mploader.worker.datapipes import is_datapipe, seed_datapipe, shard_then_init


def distributed_settings() -> tuple[int, int]:
    """``(world_size, rank)`` of the default process group, ``(1, 0)`` without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def sharding_worker_init_fn(
    worker_init_fn: Callable[[int], None] | None, world_size: int, rank: int
) -> Callable[[int], None]:
    """The ``worker_init_fn`` a worker runs for a datapipe: shard, then the user's (picklable)."""
    return functools.partial(shard_then_init, worker_init_fn, world_size, rank)


class SharedSeeds:
    """The shared seeds of one iterator over an ``IterDataPipe`` (``None`` for other datasets)."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset
        self.active = isinstance(dataset, IterDataPipe)
        self.process_group: Any = None
        if self.active and dist.is_available() and dist.is_initialized():
            self.process_group = dist.new_group(backend="gloo")  # as torch: one per iterator

    def next_epoch(self, generator: torch.Generator | None) -> int | None:
        """Draw this epoch's shared seed and seed the main process's graph with it."""
        if not self.active:
            return None
        shared = torch.empty((), dtype=torch.int64).random_(generator=generator)
        if isinstance(self.process_group, dist.ProcessGroup):
            dist.broadcast(shared, src=0, group=self.process_group)
        seed = int(shared.item())
        seed_datapipe(self.dataset, seed)
        return seed


def shard_in_main_process(dataset: Any, world_size: int, rank: int) -> None:
    """``num_workers=0``: the graph's share is this rank's."""
    if is_datapipe(dataset):
        graph_settings.apply_sharding(dataset, world_size, rank)


__all__ = [
    "SharedSeeds",
    "distributed_settings",
    "is_datapipe",
    "shard_in_main_process",
    "sharding_worker_init_fn",
]
