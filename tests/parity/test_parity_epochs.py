"""Epochs: persistent workers (full epochs, epochs broken early), and ``in_order=False``."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from .datasets import (
    DictItems,
    RandomIterable,
    ShardedIterable,
    SlowItems,
    TensorItems,
    UnevenShards,
    WorkerSeeds,
    assert_same_batches,
    dict_collate,
    make_pair,
    sort_key,
)

# Three workers on a two-CPU machine: torch and mploader both warn, as they should.
pytestmark = [
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
    pytest.mark.timeout(60),  # a stuck loader fails its test after a minute, not two
]


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def run_epochs(loader: Any, plan: list[int | None]) -> tuple[list[list[Any]], list[Any]]:
    """One epoch per entry of ``plan``: ``None`` runs it to the end, ``k`` breaks after k batches.

    Returns the batches of each epoch and the iterator of each epoch.
    """
    epochs, iterators = [], []
    for stop_after in plan:
        iterator = iter(loader)
        iterators.append(iterator)
        batches = []
        for batch in iterator:
            batches.append(batch)
            if stop_after is not None and len(batches) >= stop_after:
                break
        epochs.append(batches)
    return epochs, iterators


def assert_same_epochs(
    reference: Any, loader: Any, plan: list[int | None]
) -> tuple[list[list[Any]], list[Any]]:
    """Run ``plan`` on torch's loader and on mploader's; every epoch's batches must be equal.

    Returns mploader's per-epoch batches and iterators, for further checks.
    """
    expected, _ = run_epochs(reference, plan)
    actual, iterators = run_epochs(loader, plan)
    for epoch, (e, a) in enumerate(zip(expected, actual, strict=True)):
        assert_same_batches(e, a, f"epoch {epoch}")
    return actual, iterators


def index_order(epoch: list[Any]) -> list[int]:
    return [int(i) for batch in epoch for i in batch["index"]]


def test_persistent_workers_shuffled_epochs(start_method: str, channel: bool) -> None:
    """Three full epochs, one broken after a batch, then a full one: torch's, epoch by epoch."""

    def options() -> dict[str, Any]:
        return dict(
            dataset=DictItems(10),
            batch_size=3,
            shuffle=True,
            generator=gen(21),
            num_workers=2,
            persistent_workers=True,
        )

    plan = [None, None, None, 1, None]
    reference, loader = make_pair(options, start_method, channel)
    actual, iterators = assert_same_epochs(reference, loader, plan)
    assert torch.equal(loader.generator.get_state(), reference.generator.get_state())
    orders = [index_order(epoch) for epoch in actual[:3]]
    assert len({tuple(order) for order in orders}) == 3, "shuffled epochs should differ"
    assert all(sorted(order) == list(range(10)) for order in orders)
    # one iterator, the same worker processes, for every epoch
    assert all(iterator is iterators[0] for iterator in iterators)
    pids = [process.pid for process in iterators[0]._workers]
    assert all(process.is_alive() for process in iterators[0]._workers)
    del iterators
    assert [process.pid for process in iter(loader)._workers] == pids


@pytest.mark.parametrize("start_method", ["fork"])
@pytest.mark.parametrize(
    "plan", [[None, None, None], [2, None, 1, None], [0, None]], ids=["full", "broken", "empty"]
)
def test_persistent_workers_map_style_plans(start_method: str, channel: bool, plan: list) -> None:
    def options() -> dict[str, Any]:
        return dict(
            dataset=TensorItems(9),
            batch_size=2,
            shuffle=True,
            generator=gen(5),
            num_workers=2,
            prefetch_factor=3,
            persistent_workers=True,
            collate_fn=dict_collate,
        )

    reference, loader = make_pair(options, start_method, channel)
    assert_same_epochs(reference, loader, plan)


@pytest.mark.parametrize("start_method", ["fork"])
@pytest.mark.parametrize(
    "make_dataset",
    [lambda: ShardedIterable(9, "torch"), lambda: UnevenShards([4, 1])],
    ids=["sharded", "uneven"],
)
def test_persistent_workers_iterable(start_method: str, channel: bool, make_dataset: Any) -> None:
    """Each epoch restarts every worker's iterator; exhaustion is forgotten between epochs."""

    def options() -> dict[str, Any]:
        return dict(dataset=make_dataset(), batch_size=2, num_workers=2, persistent_workers=True)

    plan = [None, 1, None, None]
    reference, loader = make_pair(options, start_method, channel)
    assert_same_epochs(reference, loader, plan)


@pytest.mark.parametrize("start_method", ["fork"])
def test_persistent_workers_random_streams_continue(start_method: str, channel: bool) -> None:
    """Workers are seeded once: each full epoch continues the worker's random stream, as torch's."""

    def options() -> dict[str, Any]:
        return dict(dataset=RandomIterable(6), batch_size=2, num_workers=2,
                    persistent_workers=True, generator=gen(17))

    reference, loader = make_pair(options, start_method, channel)
    actual, _ = assert_same_epochs(reference, loader, [None, None, None])
    assert not torch.equal(actual[0][0][2], actual[1][0][2]), "epochs should draw new numbers"


@pytest.mark.parametrize("start_method", ["fork"])
def test_persistent_workers_random_streams_after_a_broken_epoch(
    start_method: str, channel: bool
) -> None:
    """After an epoch broken early, torch's workers still fetch the tasks already sent to them
    (their results are dropped), so those fetches advance the workers' random state before the
    next epoch.  A map-style dataset that draws random numbers then gives torch's numbers only if
    the same fetches happen.  (Slow items keep tasks queued when the epoch is broken off.)"""

    def options() -> dict[str, Any]:
        return dict(dataset=WorkerSeeds(12, delay=0.05), batch_size=2, num_workers=2,
                    persistent_workers=True, generator=gen(23))

    plan = [1, None, 2, None]
    reference, loader = make_pair(options, start_method, channel)
    assert_same_epochs(reference, loader, plan)


# -- in_order=False --------------------------------------------------------------------------------


@pytest.mark.parametrize("start_method", ["fork"])
def test_out_of_order_same_multiset(start_method: str, channel: bool) -> None:
    """A slow first item: batches arrive out of order; the multiset of batches is torch's."""

    def options() -> dict[str, Any]:
        return dict(dataset=SlowItems(12, slow_index=0, seconds=0.5), batch_size=2,
                    num_workers=2, in_order=False)

    reference, loader = make_pair(options, start_method, channel)
    expected = list(reference)
    actual = list(loader)
    assert_same_batches(sorted(expected, key=sort_key), sorted(actual, key=sort_key))
    assert actual[0].tolist() != [0, 1], "batch 0 is slow: in arrival order it does not come first"


@pytest.mark.parametrize("start_method", ["fork"])
@pytest.mark.parametrize(
    "options",
    [
        lambda: dict(dataset=DictItems(11), batch_size=3, shuffle=True, generator=gen(3),
                     num_workers=3, in_order=False),
        lambda: dict(dataset=UnevenShards([5, 1, 3]), batch_size=2, num_workers=3,
                     in_order=False),
        lambda: dict(dataset=TensorItems(9), batch_size=2, num_workers=2, in_order=False,
                     persistent_workers=True, shuffle=True, generator=gen(4)),
    ],
    ids=["map-shuffled", "iterable-uneven", "persistent"],
)
def test_out_of_order_multisets(start_method: str, channel: bool, options: Any) -> None:
    reference, loader = make_pair(options, start_method, channel)
    epochs = 2 if options().get("persistent_workers") else 1
    for epoch in range(epochs):
        expected = sorted(reference, key=sort_key)
        actual = sorted(loader, key=sort_key)
        assert_same_batches(expected, actual, f"epoch {epoch}")


# -- several iterators of one loader -------------------------------------------------------------


@pytest.mark.parametrize("start_method", ["fork"])
def test_new_epoch_after_breaking_out_without_persistent_workers(
    start_method: str, channel: bool
) -> None:
    """Break out of an epoch (the old iterator is still referenced), then run a new one."""

    def options() -> dict[str, Any]:
        return dict(dataset=TensorItems(11), batch_size=2, shuffle=True, generator=gen(31),
                    num_workers=2)

    reference, loader = make_pair(options, start_method, channel)
    plan = [2, None, 1, None]
    assert_same_epochs(reference, loader, plan)
    assert torch.equal(loader.generator.get_state(), reference.generator.get_state())


@pytest.mark.parametrize("start_method", ["fork"])
@pytest.mark.parametrize("persistent", [False, True], ids=["fresh", "persistent"])
def test_two_live_iterators_advanced_in_turns(
    start_method: str, channel: bool, persistent: bool
) -> None:
    """Two iterators of one loader alive at once (each with its own draws from the generator, or,
    with persistent workers, the second resetting the first), advanced alternately."""

    def options() -> dict[str, Any]:
        return dict(dataset=TensorItems(9), batch_size=2, shuffle=True, generator=gen(32),
                    num_workers=2, persistent_workers=persistent)

    def alternate(loader: Any) -> list[Any]:
        first, second = iter(loader), iter(loader)
        out: list[Any] = []
        for _ in range(12):
            for iterator in (first, second):
                out.append(next(iterator, "end"))
        return out

    reference, loader = make_pair(options, start_method, channel)
    assert_same_batches(alternate(reference), alternate(loader))
