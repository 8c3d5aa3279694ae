"""PyG's ``NodeLoader`` on mploader's workers, with ``worker_threads`` and ``worker_hooks``.

A ``NodeLoader`` does its network work (sampling, feature fetching) in its ``collate_fn``, which
mploader runs on a worker's main thread, one batch after another: fetch threads would get
nothing to do.  :class:`NebulaNodeLoader` moves that work into the dataset's ``__getitems__``
(one call per batch, on a fetch thread) and collates by taking the one result, so with
``worker_threads=T`` each worker process samples and fetches ``T`` batches at once, each thread
on its own session.  It is still a ``NodeLoader`` (and a torch ``DataLoader``) for PyG and
Lightning.

mploader's iterator is reached the way every torch ``DataLoader`` reaches it: call
``mploader.install()`` first.  Without it the loader runs on torch's iterator, and a
``worker_threads`` or ``worker_hooks`` it was given is an error at ``iter()``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch.utils.data
from torch_geometric.loader import NodeLoader

from mploader.compat import torch as torch_compat
from mploader.worker.hooks import WorkerHooks


class _SampledBatches(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """``__getitems__(indices)``: ``[the NodeLoader's collate_fn(indices)]`` (one batch)."""

    def __init__(self, loader: NebulaNodeLoader, length: int) -> None:
        self.loader = loader
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> Any:
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        return [NodeLoader.collate_fn(self.loader, list(indices))]


def _the_batch(items: list[Any]) -> Any:
    (batch,) = items
    return batch


class _BatchInFetchThread(torch.utils.data.DataLoader):  # type: ignore[type-arg]
    """Between ``NodeLoader`` and torch's ``DataLoader`` in the MRO: swaps the range dataset
    ``NodeLoader`` passes for :class:`_SampledBatches`, and checks that mploader runs it."""

    worker_hooks: WorkerHooks | None = None
    worker_threads: int = 1

    def __init__(self, dataset: Any, *args: Any, **kwargs: Any) -> None:
        assert isinstance(self, NebulaNodeLoader)
        kwargs["collate_fn"] = _the_batch  # instead of NodeLoader's, which __getitems__ runs
        super().__init__(_SampledBatches(self, len(dataset)), *args, **kwargs)

    def _checked_iterator(self) -> Any:
        """The iterator torch's ``__iter__`` asks for (through torch's factory method, whose
        name is ``mploader.compat``'s): torch's ``DataLoader``'s, which ``install()`` makes
        mploader's, refused when this loader needs mploader's and does not get it."""
        get_iterator = torch_compat.iterator_factory(torch.utils.data.DataLoader)
        if self.num_workers > 0 and not getattr(get_iterator, "__module__", "").startswith(
            "mploader"
        ) and (self.worker_threads > 1 or self.worker_hooks is not None):
            raise RuntimeError(
                "NebulaNodeLoader(worker_threads=..., worker_hooks=...) needs mploader's "
                "iterator: call mploader.install() before iterating"
            )
        return get_iterator(self)


torch_compat.set_iterator_factory(_BatchInFetchThread, _BatchInFetchThread._checked_iterator)


class NebulaNodeLoader(NodeLoader, _BatchInFetchThread):
    """``torch_geometric.loader.NodeLoader`` whose batches are sampled on mploader's fetch
    threads.

    Takes ``NodeLoader``'s arguments (``data=(feature_store, graph_store)``, ``node_sampler``,
    ``input_nodes``, ``batch_size``, ``num_workers``, ...) plus mploader's ``worker_hooks``
    (a :class:`~mploader.WorkerHooks`, e.g. ``NebulaHooks``: each fetch thread's session) and
    ``worker_threads`` (batches each worker process samples at once).  Call
    ``mploader.install()`` first (see the module doc).
    """

    def __init__(
        self,
        data: Any,
        node_sampler: Any,
        *args: Any,
        worker_hooks: WorkerHooks | None = None,
        worker_threads: int = 1,
        **kwargs: Any,
    ) -> None:
        if worker_hooks is not None and not isinstance(worker_hooks, WorkerHooks):
            raise TypeError(f"worker_hooks must be a mploader.WorkerHooks, got {worker_hooks!r}")
        if isinstance(worker_threads, bool) or not isinstance(worker_threads, int) or (
            worker_threads < 1
        ):
            raise ValueError(f"worker_threads must be a positive int, got {worker_threads!r}")
        self.worker_hooks = worker_hooks  # read by mploader's iterator (as on its DataLoader)
        self.worker_threads = worker_threads
        super().__init__(data, node_sampler, *args, **kwargs)

    def __call__(self, index: Any) -> Any:
        out = NodeLoader.collate_fn(self, index)
        return out if self.filter_per_worker else self.filter_fn(out)
