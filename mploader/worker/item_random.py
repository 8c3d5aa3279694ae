"""``mploader.item_generator()``: a reproducible random generator for the item being fetched.

A worker's global generators (``random``, ``torch``, numpy) are seeded as torch seeds them, and a
dataset that draws from them in ``__getitem__`` gets torch's draws as long as the worker fetches
one item after another.  With ``worker_threads > 1`` several fetches share those generators and
their draws interleave in timing order.  A dataset that wants draws that do not depend on timing
(or on ``worker_threads``) takes them from ``item_generator()`` instead: a ``torch.Generator``
seeded from the worker's seed, the epoch, the task (batch) id and the item's position in its
batch, so the same item of the same batch draws the same numbers on every run.

One generator per item rather than per task because a task's items may be fetched on several
threads at once: a generator shared between them would hand its draws out in timing order again.
A ``__getitems__`` call gets one generator for the call (seeded by the position of its first
item), so when such a dataset opts in to splitting its batches, its draws depend on the split.
The generator is made only when asked for; fetching costs two thread-local assignments per item.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class TaskSeed:
    """What the generators of one task's items are seeded from (with the item's position)."""

    worker_seed: int
    epoch: int
    task_id: int


class _Current(threading.local):
    """The task and item position whose generator ``item_generator()`` gives, per thread."""

    task: TaskSeed | None = None
    position = 0
    generator: torch.Generator | None = None


_current = _Current()


def enter_item(task: TaskSeed | None, position: int) -> None:
    """The calling thread now fetches item ``position`` of ``task``."""
    _current.task = task
    _current.position = position
    _current.generator = None


def leave_item() -> None:
    _current.task = None
    _current.generator = None


def item_seed(task: TaskSeed, position: int) -> int:
    """A 63-bit seed mixing the worker seed, epoch, task id and position (BLAKE2b)."""
    text = f"{task.worker_seed}:{task.epoch}:{task.task_id}:{position}".encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") >> 1


def item_generator() -> torch.Generator:
    """The ``torch.Generator`` of the item this thread is fetching (see the module doc).

    Inside ``__getitem__`` (or ``__getitems__``, or an ``IterableDataset``'s ``__next__``) while a
    ``mploader.DataLoader`` fetches, in workers and with ``num_workers=0``; a ``RuntimeError``
    anywhere else.  Use it as ``torch.rand(3, generator=mploader.item_generator())``.
    """
    task = _current.task
    if task is None:
        raise RuntimeError(
            "mploader.item_generator() is only available while a mploader.DataLoader fetches an "
            "item (call it inside the dataset's __getitem__, __getitems__ or __next__)"
        )
    if _current.generator is None:
        generator = torch.Generator()
        generator.manual_seed(item_seed(task, _current.position))
        _current.generator = generator
    return _current.generator
