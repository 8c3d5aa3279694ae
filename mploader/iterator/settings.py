"""What an iterator reads from its loader, gathered once into one object.

Built from an ``mploader.DataLoader`` or, after ``mploader.install()``, from any
``torch.utils.data.DataLoader`` (subclasses included), which lacks mploader's extra arguments.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import IterableDataset

from mploader.channel.shm.handover import keeper_of
from mploader.compat import torch as torch_compat
from mploader.worker.fetch import FetchSettings


@dataclass
class LoaderSettings:
    """What an iterator reads from its loader, read once when the iterator is made."""

    fetch: FetchSettings  # the dataset, and how its samples become batches
    index_sampler: Any
    num_workers: int
    prefetch_factor: int
    persistent_workers: bool
    in_order: bool
    timeout: float
    worker_init_fn: Callable[[int], None] | None
    multiprocessing_context: Any
    generator: torch.Generator | None
    pin_memory: bool
    pin_memory_device: str
    worker_hooks: Any
    shared_memory: Any  # resolved config or None
    max_worker_restarts: int
    tracer: Any  # the loader's mploader.monitor.trace.Tracer, or None: no trace
    resume: Any = None  # the loader's ResumeTracker; None: no state tracking (or a torch loader)
    worker_threads: int = 1  # fetches each worker runs at once; 1 = the classic worker loop
    latest_stats: Any = None  # the loader's LatestStats (DataLoader.stats()); None: a torch loader
    # The loader's BlockKeeper: shared-memory blocks kept from one iterator to the next (an
    # epoch without persistent workers), for torch's loaders under install() too; None: the
    # loader cannot be weakly referenced, or uses no shared memory.
    block_keeper: Any = None


def settings_of(loader: Any) -> LoaderSettings:
    from mploader.config import resolve_shared_memory

    shared_memory = resolve_shared_memory(getattr(loader, "shared_memory", True))
    return LoaderSettings(
        fetch=FetchSettings(
            dataset=loader.dataset,
            is_iterable=isinstance(loader.dataset, IterableDataset),
            auto_collation=torch_compat.auto_collation(loader),
            collate_fn=loader.collate_fn,
            drop_last=loader.drop_last,
        ),
        index_sampler=torch_compat.index_sampler(loader),
        num_workers=loader.num_workers,
        prefetch_factor=2 if loader.prefetch_factor is None else loader.prefetch_factor,
        persistent_workers=loader.persistent_workers,
        in_order=getattr(loader, "in_order", True),
        timeout=loader.timeout,
        worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context,
        generator=loader.generator,
        pin_memory=loader.pin_memory,
        pin_memory_device=loader.pin_memory_device,
        worker_hooks=getattr(loader, "worker_hooks", None),
        shared_memory=shared_memory,
        max_worker_restarts=getattr(loader, "max_worker_restarts", 0),
        tracer=getattr(loader, "trace_recorder", None),
        resume=getattr(loader, "resume_tracker", None),
        worker_threads=getattr(loader, "worker_threads", 1),
        latest_stats=getattr(loader, "_latest_stats", None),
        block_keeper=keeper_of(loader) if shared_memory is not None else None,
    )
