"""A dataset that holds multiprocessing objects (a ``Value``, a ``Lock``, an ``Event``, a
``Queue``) reaches mploader's workers as it reaches torch's, for every start method.

These objects may only be pickled for a child being started; torch's workers are started by
``Popen``, mploader's spawn and forkserver workers by the zygote (``mploader.process.zygote``),
which must hand them over the same way, file descriptors included (a ``Value`` lives in a shared
arena behind one; a ``Queue`` is a pipe).
"""

from __future__ import annotations

import multiprocessing
from typing import Any

import pytest
import torch
from torch.utils.data import Dataset

import mploader

pytestmark = pytest.mark.timeout(90)
ITEMS = 8


class SharedCounting(Dataset):
    """Counts fetched items in a shared ``Value`` under its lock; items say whether ``started``
    was set and put their index on ``seen``."""

    def __init__(self, context: Any) -> None:
        self.count = context.Value("i", 0)
        self.lock = context.Lock()
        self.started = context.Event()
        self.seen = context.Queue()

    def __len__(self) -> int:
        return ITEMS

    def __getitem__(self, index: int) -> list[int]:
        with self.lock:
            self.count.value += 1
        self.seen.put(index)
        return [index, int(self.started.is_set())]


@pytest.mark.parametrize("start_method", ["fork", "spawn", "forkserver"])
def test_multiprocessing_objects_in_a_dataset(start_method: str) -> None:
    context = multiprocessing.get_context(start_method)
    results = {}
    for name, loader_class in (("torch", torch.utils.data.DataLoader),
                               ("mploader", mploader.DataLoader)):
        dataset = SharedCounting(context)
        dataset.started.set()
        loader = loader_class(dataset, batch_size=2, num_workers=2,
                              multiprocessing_context=start_method, collate_fn=list)
        batches = list(loader)
        seen = sorted(dataset.seen.get(timeout=10) for _ in range(ITEMS))
        results[name] = (batches, dataset.count.value, seen)
    assert results["mploader"] == results["torch"]
    assert results["torch"][1] == ITEMS and results["torch"][2] == list(range(ITEMS))


class MadeWhilePickled(Dataset):
    """Its tensor is made afresh each time the dataset is pickled (as a ``__reduce__`` that
    converts or copies does): the storage, and the file descriptor that shares it, live only
    while the worker's spec is pickled."""

    def __init__(self, values: torch.Tensor) -> None:
        self.values = values

    def __reduce__(self) -> tuple[Any, ...]:
        return (MadeWhilePickled, (self.values.clone(),))

    def __len__(self) -> int:
        return len(self.values)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.values[index]


@pytest.mark.parametrize("start_method", ["spawn", "forkserver"])
def test_a_tensor_made_while_the_spec_is_pickled(start_method: str) -> None:
    """The zygote's request owns a duplicate of every fd the spec hands over, so a storage freed
    right after pickling still reaches the worker.  (torch's ``Popen`` passes the fd number
    itself, by then closed: its worker fails with "unable to resize file".)"""
    dataset = MadeWhilePickled(torch.arange(ITEMS * 1000, dtype=torch.float32))
    loader = mploader.DataLoader(dataset, batch_size=1000, num_workers=2,
                                 multiprocessing_context=start_method)
    batches = list(loader)
    assert len(batches) == ITEMS
    assert torch.equal(torch.cat(batches), dataset.values)
