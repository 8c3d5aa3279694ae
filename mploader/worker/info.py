"""Who am I? The worker's identity, and torch-compatible seeding.

``mploader.get_worker_info()`` answers ``None`` in the main process and a
torch's ``WorkerInfo`` inside a worker.  We install the same object into
torch's own module-level slot, so ``torch.utils.data.get_worker_info()`` answers the same inside a
worker; datasets written for torch shard themselves unchanged.
"""

from __future__ import annotations

import random
from typing import Any

import torch

from mploader.compat import torch as torch_compat
from mploader.compat.torch import WorkerInfo

_current_info: WorkerInfo | None = None


def get_worker_info() -> WorkerInfo | None:
    """The current worker's ``id``, ``num_workers``, ``seed`` and ``dataset``; ``None`` outside.

    Outside mploader's workers it answers what torch's ``get_worker_info()`` answers, so a dataset
    written against ``mploader.get_worker_info()`` behaves the same in a torch DataLoader's
    worker (or wherever torch's ``_worker_info`` is set)."""
    if _current_info is not None:
        return _current_info
    return torch_compat.torch_worker_info()


def set_worker_info(info: WorkerInfo | None) -> None:
    """Publish ``info`` for both ``mploader.get_worker_info`` and torch's ``get_worker_info``."""
    global _current_info
    _current_info = info
    torch_compat.set_torch_worker_info(info)


def seed_worker(base_seed: int, worker_id: int) -> int:
    """Seed ``random``, ``torch`` and numpy exactly as torch's worker loop does (2.6-2.14).

    ``random`` and ``torch`` get ``base_seed + worker_id``; numpy gets the four 32-bit words of
    torch's SeedSequence-style mixing of (worker_id, base_seed), so numpy streams match torch's too.
    """
    seed = base_seed + worker_id
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np
    except ModuleNotFoundError:  # numpy is optional for torch, as here
        return seed
    np.random.seed(torch_compat.numpy_worker_seed(base_seed, worker_id))
    return seed


def draw_base_seed(generator: torch.Generator | None) -> int:
    """Draw the per-iterator base seed from ``generator`` the way torch does (one int64 draw)."""
    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())


def make_worker_info(worker_id: int, num_workers: int, seed: int, dataset: Any) -> WorkerInfo:
    return WorkerInfo(id=worker_id, num_workers=num_workers, seed=seed, dataset=dataset)
