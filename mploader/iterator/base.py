"""What every mploader iterator shares: the sampler, the base seed, torch's length warning."""

from __future__ import annotations

import warnings
from typing import Any

from mploader.compat import torch as torch_compat
from mploader.iterator.datapipes import SharedSeeds, distributed_settings
from mploader.iterator.settings import LoaderSettings
from mploader.iterator.task_table import TaskEntry, TaskTable
from mploader.worker.info import draw_base_seed


class BaseIterator:
    """What both iterators share: the sampler and its draws, the base seed, the task table
    (the one record of tasks and of the position), and torch's length warning."""

    def __init__(self, loader: Any, settings: LoaderSettings) -> None:
        self._loader_settings = settings
        self._dataset = settings.fetch.dataset  # torch's attribute names, for code that reads them
        # A datapipe's shared seed is drawn first, as torch does (mploader.iterator.datapipes).
        self._world_size, self._rank = distributed_settings()
        self._shared_seeds = SharedSeeds(self._dataset)
        self._shared_seed = self._shared_seeds.next_epoch(settings.generator)
        self._is_iterable = settings.fetch.is_iterable
        self._auto_collation = settings.fetch.auto_collation
        self._drop_last = settings.fetch.drop_last
        self._index_sampler = settings.index_sampler
        self._num_workers = settings.num_workers
        self._timeout = settings.timeout
        self._collate_fn = settings.fetch.collate_fn
        self._persistent_workers = settings.persistent_workers
        self._IterableDataset_len_called = torch_compat.iterable_length_seen(loader)
        self._pin_memory, self._pin_memory_device = _resolve_pin_memory(settings)
        # The same two draws in the same order as torch: the sampler iterator is made first (a
        # generator: nothing drawn yet), then one int64 from ``generator`` for the base seed.
        # With state tracking, a resumed epoch replays them (mploader.iterator.resume).
        self._tracker = settings.resume
        plan = self._resume_plan = self._tracker.take_plan() if self._tracker is not None else None
        self._table = TaskTable(
            in_order=settings.in_order or self._num_workers == 0,
            num_workers=max(1, self._num_workers),
            counts_positions=not self._is_iterable,
        )
        self._table.new_epoch(plan.position() if plan is not None else None,
                              iterator_epoch=plan.iterator_epoch if plan is not None else 0)
        if self._tracker is not None:
            self._tracker.begin_epoch(self._table, plan, new_workers=True)
        self._sampler_iter = self._new_sampler_iter()
        if self._tracker is not None:
            self._base_seed = self._tracker.base_seed_for(plan, settings.generator)
        else:
            self._base_seed = draw_base_seed(settings.generator)

    def __iter__(self) -> BaseIterator:
        return self

    @property
    def _num_yielded(self) -> int:
        """torch's name for the batches this epoch has yielded, which code written for torch
        reads (and may set): a view of the task table's count, not a copy."""
        return self._table.batches_yielded

    @_num_yielded.setter
    def _num_yielded(self, count: int) -> None:
        self._table.batches_yielded = count

    def _begin_loader_epoch(self, first_iter: bool) -> int:
        """The number of the loader's epoch that begins now, for the monitor: the loader's one
        count, which a resumed epoch sets to its own (a torch loader keeps no count: the
        iterator's)."""
        latest = self._loader_settings.latest_stats
        if latest is None:
            return self._table.iterator_epoch
        plan = self._resume_plan if first_iter else None
        return latest.next_epoch(plan.epoch if plan is not None else None)

    def _begin_epoch(self, loader: Any, first_iter: bool) -> list[TaskEntry]:
        """Begin the next epoch (``first_iter``: the iterator's first, already begun).  Returns
        what the last epoch left in the task table."""
        leftovers: list[TaskEntry] = []
        if not first_iter:
            leftovers = self._table.new_epoch()
            if self._tracker is not None:
                self._tracker.epoch_reset(self._table, self._base_seed)
        self._sampler_iter = self._new_sampler_iter()
        self._IterableDataset_len_called = torch_compat.iterable_length_seen(loader)
        self._shared_seed = self._shared_seeds.next_epoch(loader.generator)
        return leftovers

    def _new_sampler_iter(self) -> Any:
        """``iter()`` of the index sampler; with state tracking, the tracker's (which keeps the
        position of torch's own ``BatchSampler`` in torchdata's words)."""
        if self._tracker is not None:
            return self._tracker.sampler_iterator()
        return iter(self._index_sampler)

    def _next_index(self) -> Any:
        return next(self._sampler_iter)

    def _next_data(self) -> Any:
        raise NotImplementedError

    def __next__(self) -> Any:
        data = self._next_data()
        table = self._table
        table.batches_yielded += 1
        if (
            self._is_iterable
            and self._IterableDataset_len_called is not None
            and table.batches_yielded > self._IterableDataset_len_called
        ):
            message = (
                f"Length of IterableDataset {self._dataset} was reported to be "
                f"{self._IterableDataset_len_called}(when accessing len(dataloader)), but "
                f"{table.batches_yielded} samples have been fetched. "
            )
            if self._num_workers > 0:
                message += (
                    "For multiprocessing data-loading, this could be caused by not properly "
                    "configuring the IterableDataset replica at each worker. Please see "
                    "https://pytorch.org/docs/stable/data.html#torch.utils.data.IterableDataset "
                    "for examples."
                )
            warnings.warn(message, stacklevel=2)
        return data

    def __len__(self) -> int:
        return len(self._index_sampler)

    def __getstate__(self) -> Any:
        raise NotImplementedError("{} cannot be pickled", self.__class__.__name__)


def _resolve_pin_memory(settings: LoaderSettings) -> tuple[bool, str | None]:
    """The installed torch's rules and warnings (they changed in 2.7 and 2.9)."""
    return torch_compat.resolve_pin_memory(settings.pin_memory, settings.pin_memory_device,
                                           stacklevel=4)


def pin_batch(batch: Any, device: str | None) -> Any:
    return torch_compat.pin_memory(batch, device)
