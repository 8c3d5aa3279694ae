"""``mploader.DataLoader``: torch 2.13's constructor, checks and length rules; mploader's iterator.

It subclasses ``torch.utils.data.DataLoader`` only so that ``isinstance`` checks in other libraries
(Lightning, PyG) keep working; it does not call torch's ``__init__`` or use torch's iterators.
"""

from __future__ import annotations

import math
import multiprocessing as python_multiprocessing
import os
import warnings
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

import torch
import torch.utils.data
from torch.utils.data import (
    BatchSampler,
    Dataset,
    IterableDataset,
    IterDataPipe,
    RandomSampler,
    Sampler,
    SequentialSampler,
)
from torch.utils.data._utils import collate as torch_collate

from mploader.iterator.datapipes import apply_shuffle, wrap_for_serialization
from mploader.iterator.latest import LatestStats
from mploader.monitor.stats import LoaderStats
from mploader.worker.hooks import WorkerHooks

T_co = TypeVar("T_co", covariant=True)

_FROZEN_AFTER_INIT = (
    "batch_size",
    "batch_sampler",
    "sampler",
    "drop_last",
    "dataset",
    "persistent_workers",
)


class _InfiniteConstantSampler(Sampler[None]):
    """The sampler of an iterable dataset: ``None`` forever (torch's, re-stated)."""

    def __iter__(self):  # type: ignore[no-untyped-def]
        while True:
            yield None


class DataLoader(torch.utils.data.DataLoader, Generic[T_co]):  # type: ignore[type-arg]
    """A drop-in ``torch.utils.data.DataLoader`` whose multi-process iterator is mploader's.

    The first seventeen arguments are torch 2.13's, with torch's defaults, checks and error
    messages.  The keyword-only additions:

    * ``worker_hooks``: a :class:`mploader.WorkerHooks` whose ``setup``/``create_session``/
      ``close_session``/``teardown`` run in each worker (in the main process when
      ``num_workers=0``); ``mploader.worker_session()`` returns the worker's session.
    * ``shared_memory``: ``True`` (default) moves batches through pooled shared-memory blocks;
      ``False`` pickles them; a ``mploader.SharedMemoryConfig`` sets the budget and threshold.
    * ``max_worker_restarts``: replace a crashed worker up to this many times.
    * ``trace``: a path; write a Chrome/Perfetto JSON trace of every batch's lifecycle, every
      epoch of the loader's life in the one file (``python -m mploader trace-summary`` reads it).
    * ``snapshot_every_n_steps``: torchdata's name and meaning.  ``1`` (default): the workers
      send their resume state with every batch (only what changed).  ``n > 1``: only with the
      batches before every n-th, and ``state_dict()`` describes the last such snapshot plus the
      batches since, which a resumed loader makes again and drops (exact either way).  ``0``: no
      snapshot after the epoch's start.  ``None`` turns tracking off, and ``state_dict()``.

    ``state_dict()`` / ``load_state_dict(state)``: mid-epoch resume (see :meth:`state_dict`).
    * ``worker_threads``: each worker process runs up to this many fetches at once on its own
      threads (network-bound datasets), each fetch thread with its own session; the batches and
      their order are unchanged.  Map-style datasets only.
    """

    dataset: Dataset[T_co]  # type: ignore[assignment]
    _DataLoader__initialized = False

    def __init__(
        self,
        dataset: Dataset[T_co],
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Sampler[Any] | Iterable[Any] | None = None,
        batch_sampler: Sampler[list[Any]] | Iterable[list[Any]] | None = None,
        num_workers: int = 0,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: Any = None,
        generator: torch.Generator | None = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
        worker_hooks: WorkerHooks | None = None,
        shared_memory: Any = True,
        max_worker_restarts: int = 0,
        trace: str | os.PathLike[str] | None = None,
        snapshot_every_n_steps: int | None = 1,
        worker_threads: int = 1,
    ) -> None:
        if num_workers < 0:
            raise ValueError(
                "num_workers option should be non-negative; "
                "use num_workers=0 to disable multiprocessing."
            )
        if timeout < 0:
            raise ValueError("timeout option should be non-negative")
        if num_workers == 0 and prefetch_factor is not None:
            raise ValueError(
                "prefetch_factor option could only be specified in multiprocessing."
                "let num_workers > 0 to enable multiprocessing, otherwise set prefetch_factor "
                "to None."
            )
        if num_workers > 0 and prefetch_factor is None:
            prefetch_factor = 2
        elif prefetch_factor is not None and prefetch_factor < 0:
            raise ValueError("prefetch_factor option should be non-negative")
        if persistent_workers and num_workers == 0:
            raise ValueError("persistent_workers option needs num_workers > 0")
        _check_additions(dataset, worker_hooks, shared_memory, max_worker_restarts)
        _check_snapshot_every_n_steps(snapshot_every_n_steps)
        _check_worker_threads(dataset, worker_threads)

        self.dataset = wrap_for_serialization(dataset)  # a datapipe travels in torch's wrapper
        self._dataset_kind = 1 if isinstance(dataset, IterableDataset) else 0  # torch's values
        self.num_workers = num_workers
        self.prefetch_factor = prefetch_factor
        self.pin_memory = pin_memory
        self.pin_memory_device = pin_memory_device
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.multiprocessing_context = multiprocessing_context
        self.in_order = in_order
        self.worker_hooks = worker_hooks
        self.shared_memory = shared_memory
        self.max_worker_restarts = max_worker_restarts
        self.trace = os.fspath(trace) if trace is not None else None
        # The trace's writer, made at the first iter(): one for the loader's life, shared by
        # each epoch's iterator, so every epoch lands in the one file.
        self.trace_recorder: Any = None
        self.snapshot_every_n_steps = snapshot_every_n_steps
        self.worker_threads = worker_threads
        if self.trace is not None:
            _check_trace_folder(self.trace)

        if isinstance(dataset, IterableDataset):
            if isinstance(dataset, IterDataPipe):
                if shuffle is not None:
                    apply_shuffle(dataset, shuffle)
            elif shuffle not in {False, None}:
                raise ValueError(
                    "DataLoader with IterableDataset: expected unspecified shuffle option, "
                    f"but got shuffle={shuffle}"
                )
            if sampler is not None:
                raise ValueError(
                    "DataLoader with IterableDataset: expected unspecified sampler option, "
                    f"but got sampler={sampler}"
                )
            if batch_sampler is not None:
                raise ValueError(
                    "DataLoader with IterableDataset: expected unspecified "
                    f"batch_sampler option, but got batch_sampler={batch_sampler}"
                )
        else:
            shuffle = bool(shuffle)

        if sampler is not None and shuffle:
            raise ValueError("sampler option is mutually exclusive with shuffle")

        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ValueError(
                    "batch_sampler option is mutually exclusive "
                    "with batch_size, shuffle, sampler, and "
                    "drop_last"
                )
            batch_size = None
            drop_last = False
        elif batch_size is None and drop_last:
            raise ValueError(
                "batch_size=None option disables auto-batching "
                "and is mutually exclusive with drop_last"
            )

        if sampler is None:
            if isinstance(dataset, IterableDataset):
                sampler = _InfiniteConstantSampler()
            elif shuffle:
                sampler = RandomSampler(dataset, generator=generator)  # type: ignore[arg-type]
            else:
                sampler = SequentialSampler(dataset)  # type: ignore[arg-type]

        if batch_size is not None and batch_sampler is None:
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)  # type: ignore[arg-type]

        self.batch_size = batch_size
        self.drop_last = drop_last
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        self.generator = generator

        if collate_fn is None:
            if self._auto_collation:
                collate_fn = torch_collate.default_collate
            else:
                collate_fn = torch_collate.default_convert
        self.collate_fn = collate_fn
        self.persistent_workers = persistent_workers

        self._DataLoader__initialized = True
        self._IterableDataset_len_called = None  # set by __len__ (torch's NOTE on it)
        self._iterator: Any = None
        self._latest_stats = LatestStats()  # what stats() answers from
        self.resume_tracker = (_make_resume_tracker(self, self._latest_stats)
                               if snapshot_every_n_steps is not None else None)
        self.check_worker_number_rationality()
        _warm_up_zygote(num_workers, self.multiprocessing_context)

    # -- the parts torch exposes -----------------------------------------------------------------

    @property
    def multiprocessing_context(self) -> Any:
        return self._mploader_multiprocessing_context

    @multiprocessing_context.setter
    def multiprocessing_context(self, context: Any) -> None:
        if context is not None:
            if self.num_workers > 0:
                if isinstance(context, str):
                    valid_start_methods = torch.multiprocessing.get_all_start_methods()
                    if context not in valid_start_methods:
                        raise ValueError(
                            "multiprocessing_context option "
                            f"should specify a valid start method in {valid_start_methods!r}, "
                            f"but got multiprocessing_context={context!r}"
                        )
                    context = torch.multiprocessing.get_context(context)
                if not isinstance(context, python_multiprocessing.context.BaseContext):
                    raise TypeError(
                        "multiprocessing_context option should be a valid context "
                        "object or a string specifying the start method, but got "
                        f"multiprocessing_context={context}"
                    )
            else:
                raise ValueError(
                    "multiprocessing_context can only be used with "
                    "multi-process loading (num_workers > 0), but got "
                    f"num_workers={self.num_workers}"
                )
        self._mploader_multiprocessing_context = context

    def __setattr__(self, attr: str, value: Any) -> None:
        if self._DataLoader__initialized and attr in _FROZEN_AFTER_INIT:
            raise ValueError(
                f"{attr} attribute should not be set after {self.__class__.__name__} is "
                "initialized"
            )
        object.__setattr__(self, attr, value)

    @property
    def _auto_collation(self) -> bool:
        return self.batch_sampler is not None

    @property
    def _index_sampler(self) -> Any:
        return self.batch_sampler if self._auto_collation else self.sampler

    def __len__(self) -> int:
        if isinstance(self.dataset, IterableDataset):
            length = self._IterableDataset_len_called = len(self.dataset)  # type: ignore[arg-type,assignment]
            if self.batch_size is not None:
                if self.drop_last:
                    length = length // self.batch_size
                else:
                    length = math.ceil(length / self.batch_size)
            return length
        return len(self._index_sampler)

    def __iter__(self) -> Any:
        if self.resume_tracker is None:
            return self._iter_epoch()
        with self.resume_tracker.epoch_window(self):
            return self._iter_epoch()

    def _iter_epoch(self) -> Any:
        if self.persistent_workers and self.num_workers > 0:
            iterator = self._iterator
            if iterator is None or getattr(iterator, "_shutdown", False):
                self._iterator = self._get_iterator()
            else:
                iterator._reset(self)
            return self._iterator
        return self._get_iterator()

    def stats(self) -> LoaderStats:
        """A frozen snapshot of the live iterator (or of the last one, once its epoch ended):
        its workers, what each is doing and for how long, memory, where the time goes.
        ``print()`` it for a table; its fields are ``mploader.LoaderStats``.  Safe to call
        from any thread, any ``num_workers``; a ``RuntimeError`` before the first ``iter()``."""
        return self._latest_stats.current()

    def state_dict(self) -> dict[str, Any]:
        """Where this loader stands: after the last batch the consumer received.

        A plain dict (Python scalars, lists, dicts and tensors, with a ``version``) that pickles
        and ``torch.save``\\ s.  A new loader built with the same arguments that loads it with
        :meth:`load_state_dict` yields, from its next ``iter()``, exactly the batches this one
        would have yielded next, and then the same later epochs (generator, base seed, worker
        seeds and the workers' random draws included).
        """
        tracker = self._tracker_or_raise("state_dict")
        tracker.configure(self)
        return tracker.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume from a :meth:`state_dict` at the next ``iter()``.  A state made by another
        version, or by a loader built with other arguments, is a ``ValueError`` naming the
        difference.  ``{}`` loads nothing."""
        tracker = self._tracker_or_raise("load_state_dict")
        if state_dict == {}:
            return
        tracker.configure(self)
        tracker.load_state_dict(state_dict)
        iterator, self._iterator = self._iterator, None
        if iterator is not None:  # persistent workers of the old position: not reusable
            iterator._shutdown_workers()

    def _tracker_or_raise(self, method: str) -> Any:
        if self.resume_tracker is None:
            raise RuntimeError(
                f"DataLoader.{method}() needs state tracking, which snapshot_every_n_steps=None "
                "turned off; build the loader with snapshot_every_n_steps=1 (the default)"
            )
        return self.resume_tracker

    def _get_iterator(self) -> Any:
        from mploader.iterator.factory import make_iterator

        if self.num_workers > 0:
            self.check_worker_number_rationality()
        if self.trace is not None and self.trace_recorder is None:
            from mploader.monitor.trace import Tracer

            self.trace_recorder = Tracer(self.trace)
        return make_iterator(self)

    def check_worker_number_rationality(self) -> None:
        """torch's warning when more workers are asked for than there are CPUs to run them."""
        if not self.num_workers:
            return
        suggested = torch._utils.cpu_count()  # type: ignore[attr-defined]
        if suggested is not None and self.num_workers <= suggested:
            return
        cpuset_checked = hasattr(os, "sched_getaffinity")
        if suggested is not None:
            suggestion = (
                f"Our suggested max number of worker in current system is {suggested}"
                f"{'' if cpuset_checked else ' (`cpuset` is not taken into account)'}, which is "
                "smaller than what this DataLoader is going to create."
            )
        else:
            suggestion = (
                "DataLoader is not able to compute a suggested max number of worker in current "
                "system."
            )
        warnings.warn(
            f"This DataLoader will create {self.num_workers} worker processes in total. "
            f"{suggestion} Please be aware that excessive worker creation might get DataLoader "
            "running slow or even freeze, lower the worker number to avoid potential "
            "slowness/freeze if necessary.",
            stacklevel=2,
        )


def _warm_up_zygote(num_workers: int, context: Any) -> None:
    """Start the spawn/forkserver zygote now, so its torch import overlaps the user's own set-up
    instead of delaying the first batch (see ``mploader.process.zygote``)."""
    from mploader.process import zygote

    if num_workers == 0 or not zygote.enabled():
        return
    resolved = context or python_multiprocessing.get_context()
    if resolved.get_start_method() in ("spawn", "forkserver"):
        zygote.zygote_for(resolved)


def _make_resume_tracker(loader: DataLoader[Any], latest: LatestStats) -> Any:
    from mploader.iterator.resume import ResumeTracker

    return ResumeTracker(loader, latest)


def _check_snapshot_every_n_steps(value: Any) -> None:
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
        return
    raise ValueError(
        "snapshot_every_n_steps option should be a non-negative integer or None, but got "
        f"snapshot_every_n_steps={value!r}"
    )


def _check_trace_folder(path: str) -> None:
    """The trace is written at the end of an epoch; a folder that does not exist must fail now,
    not after the epoch's work."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        problem = "is not a folder" if os.path.exists(folder) else "does not exist"
        raise FileNotFoundError(
            f"trace={path!r}: the folder {folder!r} {problem}; create it, or pass a trace path "
            "in an existing folder"
        )


def _check_additions(
    dataset: Any, worker_hooks: Any, shared_memory: Any, max_worker_restarts: Any
) -> None:
    if worker_hooks is not None and not isinstance(worker_hooks, WorkerHooks):
        raise TypeError(
            "worker_hooks option should be a mploader.WorkerHooks instance, but got "
            f"worker_hooks={worker_hooks!r}"
        )
    if not isinstance(max_worker_restarts, int) or max_worker_restarts < 0:
        raise ValueError(
            "max_worker_restarts option should be a non-negative integer, but got "
            f"max_worker_restarts={max_worker_restarts!r}"
        )
    if max_worker_restarts and isinstance(dataset, IterableDataset):
        raise ValueError(
            "max_worker_restarts needs a map-style dataset: a replacement worker cannot resume "
            "an IterableDataset's iterator where the dead worker left it, so its samples would "
            "be lost or repeated; use max_worker_restarts=0 with an IterableDataset"
        )
    from mploader.config import resolve_shared_memory

    resolve_shared_memory(shared_memory)  # raises TypeError for anything else


def _check_worker_threads(dataset: Any, worker_threads: Any) -> None:
    if isinstance(worker_threads, bool) or not isinstance(worker_threads, int) or (
        worker_threads < 1
    ):
        raise ValueError(
            "worker_threads option should be a positive integer (the number of fetches each "
            f"worker runs at once; 1 = one at a time), but got worker_threads={worker_threads!r}"
        )
    if worker_threads > 1 and isinstance(dataset, IterableDataset):
        raise ValueError(
            f"worker_threads={worker_threads} needs a map-style dataset: an IterableDataset is "
            "read through one iterator per worker, whose next() calls cannot run concurrently "
            "and whose order decides the batches; use worker_threads=1 with an IterableDataset "
            "(or more num_workers), or make the dataset map-style (__getitem__ and __len__)"
        )
