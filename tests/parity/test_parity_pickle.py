"""A loader pickles and deep-copies where torch's does, and the copies iterate alike.

Lightning's spawn strategies, ``torch.save(loader)`` and multiprocessing hand loaders around by
pickling them: before iteration, mid-epoch and after an epoch with workers that are not kept,
torch's loader pickles (it holds no iterator); with a live persistent iterator it refuses
(``NotImplementedError``).  mploader's must do the same, and a copy must give torch's copy's
batches.
"""

from __future__ import annotations

import copy
import pickle
from collections.abc import Callable
from typing import Any

import pytest
import torch

from .datasets import ShardedIterable, TensorItems, assert_same_batches, make_pair

pytestmark = pytest.mark.timeout(120)

COPIES: dict[str, Callable[[Any], Any]] = {
    "pickle": lambda loader: pickle.loads(pickle.dumps(loader)),
    "deepcopy": copy.deepcopy,
}


def _map_options(num_workers: int, persistent: bool) -> Callable[[], dict[str, Any]]:
    return lambda: {"dataset": TensorItems(12), "batch_size": 2, "shuffle": True,
                    "generator": torch.Generator().manual_seed(7), "num_workers": num_workers,
                    "persistent_workers": persistent}


def _iterable_options(num_workers: int, persistent: bool) -> Callable[[], dict[str, Any]]:
    # ShardedIterable's __iter__ is a generator: a live one cannot be pickled
    return lambda: {"dataset": ShardedIterable(12), "batch_size": 2,
                    "num_workers": num_workers, "persistent_workers": persistent}


def _copy_or_error(make_copy: Callable[[Any], Any], loader: Any) -> tuple[Any, Any]:
    try:
        return make_copy(loader), None
    except Exception as error:  # the outcome, compared with torch's
        return None, error


@pytest.mark.parametrize("how", list(COPIES))
@pytest.mark.parametrize("when", ["before", "mid_epoch", "after_epoch"])
@pytest.mark.parametrize(("kind", "num_workers", "persistent"), [
    ("map", 0, False), ("map", 2, False), ("map", 2, True),
    ("iterable", 0, False), ("iterable", 2, True),
])
def test_a_loader_copies_where_torch_s_does(kind: str, num_workers: int, persistent: bool,
                                            when: str, how: str) -> None:
    options = (_map_options if kind == "map" else _iterable_options)(num_workers, persistent)
    pair = make_pair(options, "fork" if num_workers else None, True)
    outcomes = []
    iterators = []
    for loader in pair:
        iterator = None
        if when != "before":
            iterator = iter(loader)
            next(iterator)
            if when == "after_epoch":
                list(iterator)
        iterators.append(iterator)  # alive while copied, as a training loop's would be
        outcomes.append(_copy_or_error(COPIES[how], loader))
    (torch_copy, torch_error), (our_copy, our_error) = outcomes
    assert type(our_error) is type(torch_error), (our_error, torch_error)
    if torch_error is None:
        assert type(our_copy) is type(pair[1])
        assert_same_batches(list(torch_copy), list(our_copy), f"{how} {when}")
    for loader, iterator in zip(pair, iterators, strict=True):
        shut_down = getattr(iterator, "_shutdown_workers", None)
        if shut_down is not None:
            shut_down()
        del loader
