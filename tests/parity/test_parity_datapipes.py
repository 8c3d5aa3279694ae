"""Datapipe datasets run as torch 2.13 runs them: wrapped for serialization, ``shuffle`` applied
to the graph's shufflers, a shared seed per iterator and per epoch (drawn from the loader's
generator before the base seed) seeding every random datapipe in the main process and in every
worker, and sharding per worker (``num_workers * world_size`` shares) before ``worker_init_fn``,
or per rank without workers.  Batch for batch, seed for seed, against torch's DataLoader.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch

import mploader

from .datapipes import map_datapipe, sharded_without_shuffler, shuffled_sharded
from .datasets import assert_same_batches, messages, record_worker_init

pytestmark = pytest.mark.timeout(90)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _build(cls: type, options: dict[str, Any], **extra: Any) -> tuple[Any, list[Any]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = cls(**options, **extra)
    return loader, messages(caught)


def _epochs(loader: Any, epochs: int, global_seed: int) -> tuple[list[list[Any]], Any]:
    torch.manual_seed(global_seed)  # what a loader without generator= draws from
    batches = [list(loader) for _ in range(epochs)]
    state = torch.get_rng_state() if loader.generator is None else loader.generator.get_state()
    return batches, state


_torch_runs: dict[tuple[Any, ...], tuple[list[Any], type, list[list[Any]], Any]] = {}


def compare(options: Callable[[], dict[str, Any]], start_method: str | None, channel: bool,
            key: tuple[Any, ...], epochs: int = 2, global_seed: int = 0) -> list[list[Any]]:
    """torch's run (once per ``key``, shared by both channels) against mploader's."""
    context = {} if start_method is None else {"multiprocessing_context": start_method}
    if key not in _torch_runs:
        reference, built_with = _build(torch.utils.data.DataLoader, {**options(), **context})
        batches, state = _epochs(reference, epochs, global_seed)
        _torch_runs[key] = (built_with, type(reference.dataset), _owned(batches), state)
    expected_warnings, expected_type, expected, expected_state = _torch_runs[key]
    loader, actual_warnings = _build(mploader.DataLoader, {**options(), **context},
                                     shared_memory=channel)
    assert actual_warnings == expected_warnings
    assert type(loader.dataset) is expected_type  # torch's serialization wrapper
    actual, actual_state = _epochs(loader, epochs, global_seed)
    for epoch, (e, a) in enumerate(zip(expected, actual, strict=True)):
        assert_same_batches(e, a, f"epoch {epoch}")
    assert torch.equal(actual_state, expected_state), "drew from the generator differently"
    return actual


def _owned(value: Any) -> Any:
    """``value`` with every tensor copied out of torch's shared memory: a kept tensor from torch's
    workers holds an open descriptor (``file_descriptor`` sharing), and a session of them would
    exhaust the process's files."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, list):
        return [_owned(item) for item in value]
    if isinstance(value, tuple):
        return type(value)(_owned(item) for item in value)
    return value


def _items(epoch: list[Any]) -> list[int]:
    return sorted(int(value) for batch in epoch for value in batch[0])


CASES: dict[str, Callable[[], dict[str, Any]]] = {
    "shuffle-true-generator": lambda: dict(
        dataset=shuffled_sharded(), batch_size=3, shuffle=True, generator=gen(7), num_workers=2),
    "shuffle-unset-worker-init": lambda: dict(
        dataset=shuffled_sharded(), batch_size=4, num_workers=2, worker_init_fn=record_worker_init),
    "shuffle-false-turns-shuffler-off": lambda: dict(
        dataset=shuffled_sharded(), batch_size=3, shuffle=False, generator=gen(2), num_workers=2),
    "shuffle-true-without-shuffler": lambda: dict(
        dataset=sharded_without_shuffler(), batch_size=2, shuffle=True, num_workers=2),
    "three-workers-batch-size-none": lambda: dict(
        dataset=shuffled_sharded(9), batch_size=None, shuffle=True, generator=gen(5),
        num_workers=3),
    "map-datapipe-shuffle": lambda: dict(
        dataset=map_datapipe(), batch_size=3, shuffle=True, generator=gen(3), num_workers=2),
    "no-workers": lambda: dict(dataset=shuffled_sharded(), batch_size=3, shuffle=True,
                               generator=gen(11)),
}


@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
@pytest.mark.parametrize("persistent", [False, True], ids=["fresh", "persistent"])
@pytest.mark.parametrize("case", CASES)
def test_datapipe_epochs_under_fork(case: str, persistent: bool, channel: bool) -> None:
    def options() -> dict[str, Any]:
        chosen = CASES[case]()
        if persistent and chosen.get("num_workers"):
            chosen["persistent_workers"] = True
        return chosen

    if persistent and not CASES[case]().get("num_workers"):
        pytest.skip("persistent_workers needs workers")
    start_method = "fork" if CASES[case]().get("num_workers") else None
    actual = compare(options, start_method, channel, (case, persistent))
    if case.startswith("shuffle-true-generator"):
        # Shuffled once (the same shared seed in every worker), then sharded: one permutation.
        assert _items(actual[0]) == [v * v for v in range(16)]
        assert [b[0].tolist() for b in actual[0]] != [b[0].tolist() for b in actual[1]]


@pytest.mark.parametrize("start_method", ["spawn", "forkserver"])
@pytest.mark.parametrize("persistent", [False, True], ids=["fresh", "persistent"])
def test_datapipe_epochs_under_spawn_and_forkserver(
    start_method: str, persistent: bool, channel: bool
) -> None:
    """The main case, with one fresh epoch (each costs torch an interpreter per worker) or two
    epochs of persistent workers (the second seeded by the Resume's shared seed)."""
    compare(lambda: dict(dataset=shuffled_sharded(), batch_size=3, shuffle=True,
                         generator=gen(7), num_workers=2, persistent_workers=persistent),
            start_method, channel, (start_method, persistent), epochs=2 if persistent else 1)


@pytest.mark.parametrize("start_method", ["fork"])
def test_datapipe_seeds_from_the_global_generator(start_method: str, channel: bool) -> None:
    """Without ``generator=``: shared and base seeds come from torch's global generator."""
    compare(lambda: dict(dataset=shuffled_sharded(), batch_size=4, shuffle=True, num_workers=2),
            start_method, channel, ("global",), global_seed=1234)


def test_iterable_dataset_shuffle_is_still_refused() -> None:
    """Only datapipes accept ``shuffle=True`` among iterable datasets (torch's message)."""
    from .datasets import ShardedIterable

    for cls in (torch.utils.data.DataLoader, mploader.DataLoader):
        with pytest.raises(ValueError, match="expected unspecified shuffle option"):
            cls(ShardedIterable(4), shuffle=True)


@pytest.mark.parametrize("start_method", ["fork"])
def test_installed_torch_loader_over_a_datapipe(start_method: str, channel: bool) -> None:
    """After ``install()`` torch's own loader (which wrapped and shuffled the datapipe itself)
    iterates with mploader's workers and gives the batches it gave before."""

    def make() -> Any:
        loader = torch.utils.data.DataLoader(
            shuffled_sharded(), batch_size=3, shuffle=True, generator=gen(7), num_workers=2,
            persistent_workers=True, multiprocessing_context=start_method)
        if not channel:
            loader.shared_memory = False  # read by mploader's iterator; torch ignores it
        return loader

    mploader.uninstall()
    expected, expected_state = _epochs(make(), 2, 0)
    with mploader.install():
        loader = make()
        actual, actual_state = _epochs(loader, 2, 0)
        assert type(loader._iterator).__module__.startswith("mploader")
    for epoch, (e, a) in enumerate(zip(expected, actual, strict=True)):
        assert_same_batches(e, a, f"epoch {epoch}")
    assert torch.equal(actual_state, expected_state)
