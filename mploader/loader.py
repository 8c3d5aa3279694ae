"""``mploader.DataLoader``: torch's own constructor, checks and length rules; mploader's iterator.

A subclass of the installed torch's ``DataLoader``: its ``__init__`` takes mploader's keyword-only
additions, checks them, and hands every torch argument to ``torch.utils.data.DataLoader.__init__``,
so that each torch version (2.6 to 2.14) applies its own defaults, checks, warnings and error
messages.  ``__len__``, ``multiprocessing_context`` and the attributes frozen after construction
are torch's too.  What mploader replaces is where ``__iter__`` gets its iterator (torch's
factory method, set through ``mploader.compat.torch``), and ``__iter__`` itself, which wraps each
epoch for resume tracking.
"""

from __future__ import annotations

import multiprocessing as python_multiprocessing
import os
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

import torch
import torch.utils.data
from torch.utils.data import Dataset, IterableDataset, Sampler

from mploader.compat import torch as torch_compat
from mploader.iterator.latest import LatestStats
from mploader.monitor.stats import LoaderStats
from mploader.worker.hooks import WorkerHooks

T_co = TypeVar("T_co", covariant=True)


class DataLoader(torch.utils.data.DataLoader, Generic[T_co]):  # type: ignore[type-arg]
    """A drop-in ``torch.utils.data.DataLoader`` whose multi-process iterator is mploader's.

    The first seventeen arguments are the installed torch's (2.6 to 2.14): torch's own
    ``__init__`` takes them, with its defaults, checks, warnings and error messages.  The
    keyword-only additions, all optional:

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
    * ``worker_threads``: each worker process runs up to this many fetches at once on its own
      threads (network-bound datasets), each fetch thread with its own session; the batches and
      their order are unchanged.  Map-style datasets only.

    ``state_dict()`` / ``load_state_dict(state)``: mid-epoch resume (see :meth:`state_dict`).
    ``stats()``: a snapshot of the workers and where the time goes.
    """

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
        _check_additions(dataset, worker_hooks, shared_memory, max_worker_restarts)
        _check_snapshot_every_n_steps(snapshot_every_n_steps)
        _check_worker_threads(dataset, worker_threads)
        if trace is not None:
            _check_trace_folder(os.fspath(trace))
        super().__init__(
            dataset, batch_size, shuffle, sampler, batch_sampler, num_workers, collate_fn,
            pin_memory, drop_last, timeout, worker_init_fn, multiprocessing_context, generator,
            prefetch_factor=prefetch_factor, persistent_workers=persistent_workers,
            pin_memory_device=pin_memory_device, in_order=in_order,
        )
        self.worker_hooks = worker_hooks
        self.shared_memory = shared_memory
        self.max_worker_restarts = max_worker_restarts
        self.trace = os.fspath(trace) if trace is not None else None
        # The trace's writer, made at the first iter(): one for the loader's life, shared by
        # each epoch's iterator, so every epoch lands in the one file.
        self.trace_recorder: Any = None
        self.snapshot_every_n_steps = snapshot_every_n_steps
        self.worker_threads = worker_threads
        self._latest_stats = LatestStats()  # what stats() answers from
        self.resume_tracker = (_make_resume_tracker(self, self._latest_stats)
                               if snapshot_every_n_steps is not None else None)
        _warm_up_zygote(num_workers, self.multiprocessing_context)

    def __iter__(self) -> Any:
        if self.resume_tracker is None:
            return self._iter_epoch()
        with self.resume_tracker.epoch_window(self):
            return self._iter_epoch()

    def _iter_epoch(self) -> Any:
        if self.persistent_workers and self.num_workers > 0:
            iterator = torch_compat.persistent_iterator(self)
            if iterator is None or iterator.is_shut_down:
                iterator = torch_compat.new_iterator(self)
                torch_compat.set_persistent_iterator(self, iterator)
            else:
                iterator._reset(self)
            return iterator
        return torch_compat.new_iterator(self)

    def stats(self) -> LoaderStats:
        """A frozen snapshot of the live iterator (or of the last one, once its epoch ended):
        its workers, what each is doing and for how long, memory, where the time goes.
        ``print()`` it for a table; its fields are ``mploader.LoaderStats``.  Safe to call
        from any thread, any ``num_workers``; a ``RuntimeError`` before the first ``iter()``."""
        return self._latest_stats.current()

    def state_dict(self) -> dict[str, Any]:
        r"""Where this loader stands: after the last batch the consumer received.

        A dict in the layout of torchdata's ``StatefulDataLoader`` (its keys, with their
        meaning), with what mploader knows beyond them under ``_mploader`` (docs/guide/resume.md
        has every field), so torchdata's loader loads it too.  Plain Python scalars, strings,
        lists and dicts but for tensors where torchdata has them (a shuffle's generator state)
        and what a dataset's or sampler's own ``state_dict()`` returns: it pickles,
        ``torch.save``\ s and loads with ``torch.load(weights_only=True)``.  Anything else there
        (a numpy scalar, say) is a ``TypeError`` naming where it is.

        A new loader built with the same arguments that loads it with
        :meth:`load_state_dict` yields, from its next ``iter()``, exactly the batches this one
        would have yielded next, and then the same later epochs (generator, base seed, worker
        seeds and the workers' random draws included).
        """
        tracker = self._tracker_or_raise("state_dict")
        tracker.configure(self)
        return tracker.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume from a :meth:`state_dict` at the next ``iter()``, or from a state torchdata's
        ``StatefulDataLoader`` saved (continuing where torchdata's loader would).  A state made
        by another version, or by a loader built with other arguments, is a ``ValueError``
        naming the difference, as is a truncated or edited one; anything but a dict is a
        ``TypeError``.  A refused state loads nothing.  ``{}`` loads nothing."""
        tracker = self._tracker_or_raise("load_state_dict")
        if isinstance(state_dict, dict) and not state_dict:
            return
        tracker.configure(self)
        tracker.load_state_dict(state_dict)
        iterator: Any = torch_compat.persistent_iterator(self)
        torch_compat.set_persistent_iterator(self, None)
        if iterator is not None:  # persistent workers of the old position: not reusable
            iterator._shutdown_workers()

    def _tracker_or_raise(self, method: str) -> Any:
        if self.resume_tracker is None:
            raise RuntimeError(
                f"DataLoader.{method}() needs state tracking, which snapshot_every_n_steps=None "
                "turned off; build the loader with snapshot_every_n_steps=1 (the default)"
            )
        return self.resume_tracker

    def _make_iterator(self) -> Any:
        """mploader's iterator: torch's factory method of this class (set below)."""
        from mploader.iterator.factory import make_iterator

        if self.num_workers > 0:
            self.check_worker_number_rationality()
        if self.trace is not None and self.trace_recorder is None:
            from mploader.monitor.trace import Tracer

            self.trace_recorder = Tracer(self.trace)
        return make_iterator(self)



# torch's __iter__ gets every iterator from this method (its name: mploader.compat.torch).
setattr(DataLoader, torch_compat.ITERATOR_FACTORY, DataLoader._make_iterator)

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
    if isinstance(max_worker_restarts, bool) or not isinstance(max_worker_restarts, int) or (
        max_worker_restarts < 0
    ):
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
