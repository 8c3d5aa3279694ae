"""Datapipe datasets inside a worker, as torch's worker loop treats them (2.6-2.14).

torch's DataLoader still runs ``IterDataPipe``/``MapDataPipe`` datasets specially (datapipes are
deprecated, but a drop-in replacement runs what torch runs).  In a worker that means:

* the random datapipes of an ``IterDataPipe`` graph (shufflers, anything with ``set_seed``) are
  seeded from the loader's *shared seed* (the same in every worker, new every epoch), after the
  worker's own seeding and before ``worker_init_fn``; :func:`seed_datapipe`;
* before the user's ``worker_init_fn``, the graph's sharding filters are told which share is this
  worker's: ``num_workers * world_size`` shares, this one ``worker_id * world_size + rank``;
  :func:`shard_then_init` (the main process passes it as the worker's ``worker_init_fn``).

Both use torch's own ``graph_settings`` functions, so graphs behave exactly as under torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import IterDataPipe, MapDataPipe, get_worker_info, graph_settings


def is_datapipe(dataset: Any) -> bool:
    return isinstance(dataset, (IterDataPipe, MapDataPipe))


def seed_datapipe(dataset: Any, shared_seed: int | None) -> None:
    """Seed every random datapipe of an ``IterDataPipe`` graph from ``shared_seed``.

    A no-op for any other dataset (torch seeds only ``IterDataPipe`` graphs) or without a seed.
    """
    if shared_seed is None or not isinstance(dataset, IterDataPipe):
        return
    shared_generator = torch.Generator()
    shared_generator.manual_seed(shared_seed)
    graph_settings.apply_random_seed(dataset, shared_generator)


def shard_then_init(
    worker_init_fn: Callable[[int], None] | None, world_size: int, rank: int, worker_id: int
) -> None:
    """The ``worker_init_fn`` of a loader over a datapipe: shard the graph, then the user's."""
    info = get_worker_info()
    if info is None:
        raise AssertionError("datapipe sharding runs only inside a DataLoader worker")
    datapipe = info.dataset
    if not isinstance(datapipe, (IterDataPipe, MapDataPipe)):
        raise AssertionError(
            f"datapipe sharding needs an IterDataPipe or MapDataPipe, not {datapipe!r}"
        )
    # Shard over processes of the distributed group first, then over this process's workers,
    # so that every (rank, worker) pair reads a distinct share.
    graph_settings.apply_sharding(
        datapipe, info.num_workers * world_size, worker_id * world_size + rank
    )
    if worker_init_fn is not None:
        worker_init_fn(worker_id)
