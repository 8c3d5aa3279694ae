"""The main parity table: torch's DataLoader and mploader's give the same batches in the same order.

Every case runs under fork; a subset that between them touches every feature (custom collate,
namedtuples and numpy, drop_last with a generator, both ``get_worker_info``s, uneven shards)
also runs under spawn and forkserver, where each loader costs an interpreter start per worker.
Torch's batches are computed once per case and start method and reused for both channels.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import ConcatDataset, RandomSampler, Subset, TensorDataset

from .datasets import (
    CountingIterable,
    DictItems,
    EveryOtherSampler,
    ExoticTensors,
    GetItemsDataset,
    GrowingBatchSampler,
    KeyedDataset,
    KeysSampler,
    LargeItems,
    Money,
    MoneyItems,
    NamedTupleItems,
    NumpyItems,
    ShardedIterable,
    TensorItems,
    TupleItems,
    UnevenShards,
    assert_same_batches,
    assert_same_failure,
    collate_money,
    collect,
    count_collate,
    dict_collate,
    list_collate,
    make_pair,
    none_collate,
)

# Three workers on a two-CPU machine: torch and mploader both warn, as they should.
pytestmark = [
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
    pytest.mark.timeout(60),  # a stuck loader fails its test after a minute, not two
]


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@dataclass(frozen=True)
class Case:
    id: str
    options: Callable[[], dict[str, Any]]  # called once per loader: fresh samplers, generators
    everywhere: bool = False  # also under spawn and forkserver
    global_seed: int | None = None  # torch.manual_seed before iterating (no generator given)
    reference_dataset: Callable[[], Any] | None = field(default=None)


CASES = [
    # -- map-style: samplers, batching, drop_last -------------------------------------------------
    Case("sequential", lambda: dict(dataset=TensorItems(10), batch_size=3, num_workers=2)),
    Case(
        "sequential-drop-last",
        lambda: dict(dataset=TensorItems(10), batch_size=3, drop_last=True, num_workers=2),
    ),
    Case(
        "shuffle-generator",
        lambda: dict(
            dataset=TensorItems(11), batch_size=4, shuffle=True, generator=gen(5), num_workers=2
        ),
    ),
    Case(
        "shuffle-generator-drop-last-dicts",
        lambda: dict(
            dataset=DictItems(11),
            batch_size=3,
            shuffle=True,
            drop_last=True,
            generator=gen(7),
            num_workers=2,
        ),
        everywhere=True,
    ),
    Case(
        "shuffle-global-rng",
        lambda: dict(dataset=TensorItems(9), batch_size=2, shuffle=True, num_workers=2),
        global_seed=1234,
    ),
    Case("batch-size-none", lambda: dict(dataset=TensorItems(5), batch_size=None, num_workers=2)),
    Case(
        "batch-size-none-shuffle-dicts",
        lambda: dict(
            dataset=DictItems(6), batch_size=None, shuffle=True, generator=gen(3), num_workers=2
        ),
    ),
    Case(
        "batch-size-none-custom-collate",
        lambda: dict(
            dataset=TupleItems(4), batch_size=None, collate_fn=list_collate, num_workers=2
        ),
    ),
    Case(
        "custom-batch-sampler",
        lambda: dict(
            dataset=DictItems(12), batch_sampler=GrowingBatchSampler(12, seed=3), num_workers=2
        ),
    ),
    Case(
        "custom-sampler",
        lambda: dict(
            dataset=TupleItems(9), sampler=EveryOtherSampler(9), batch_size=2, num_workers=2
        ),
    ),
    Case(
        "custom-random-sampler",
        lambda: dict(
            dataset=TensorItems(10),
            sampler=RandomSampler(range(10), replacement=True, num_samples=7, generator=gen(11)),
            batch_size=3,
            num_workers=2,
        ),
    ),
    Case(
        "string-keys-sampler",
        lambda: dict(
            dataset=KeyedDataset(7),
            sampler=KeysSampler([f"key{i:02d}" for i in (6, 0, 5, 1, 4, 2, 3)]),
            batch_size=3,
            num_workers=2,
        ),
    ),
    Case(
        "sampler-plain-list",
        lambda: dict(dataset=TensorItems(8), sampler=[5, 3, 3, 7, 0], batch_size=2,
                     num_workers=2),
    ),
    Case(
        "batch-sampler-plain-list",
        lambda: dict(dataset=TupleItems(8), batch_sampler=[[7], [1, 2, 3], [0, 0], [6, 5]],
                     num_workers=2),
    ),
    Case(
        "generator-without-shuffle",
        lambda: dict(dataset=TensorItems(7), batch_size=2, generator=gen(30), num_workers=2),
    ),
    # -- sample types and collate functions -------------------------------------------------------
    Case(
        "custom-collate-dict",
        lambda: dict(dataset=TensorItems(8), batch_size=3, collate_fn=dict_collate, num_workers=2),
        everywhere=True,
    ),
    Case(
        "custom-collate-list",
        lambda: dict(dataset=TupleItems(5), batch_size=2, collate_fn=list_collate, num_workers=2),
    ),
    Case(
        "collate-to-int",
        lambda: dict(dataset=TensorItems(7), batch_size=3, collate_fn=count_collate,
                     num_workers=2),
    ),
    Case(
        "collate-to-none",
        lambda: dict(dataset=TensorItems(5), batch_size=2, collate_fn=none_collate,
                     num_workers=2),
    ),
    Case("dicts", lambda: dict(dataset=DictItems(7), batch_size=3, num_workers=2)),
    Case("tuples", lambda: dict(dataset=TupleItems(7), batch_size=3, num_workers=2)),
    Case(
        "namedtuples-numpy-strings",
        lambda: dict(dataset=NamedTupleItems(7), batch_size=3, num_workers=2),
        everywhere=True,
    ),
    Case("numpy", lambda: dict(dataset=NumpyItems(7), batch_size=3, num_workers=2)),
    Case("getitems", lambda: dict(dataset=GetItemsDataset(10), batch_size=4, num_workers=2)),
    Case(
        "getitems-shuffle",
        lambda: dict(
            dataset=GetItemsDataset(10),
            batch_size=3,
            shuffle=True,
            generator=gen(2),
            num_workers=2,
        ),
    ),
    Case(
        "getitems-batch-size-none",
        lambda: dict(dataset=GetItemsDataset(4), batch_size=None, num_workers=2),
    ),
    Case(
        "torch-subset",
        lambda: dict(
            dataset=Subset(TensorItems(20), [3, 1, 4, 1, 5, 9, 2, 6]), batch_size=3, num_workers=2
        ),
    ),
    Case(
        "torch-tensor-concat",
        lambda: dict(
            dataset=ConcatDataset(
                [TensorDataset(torch.arange(5), torch.arange(5) * 2), TensorDataset(
                    torch.arange(5, 9), torch.arange(5, 9) * 2
                )]
            ),
            batch_size=4,
            shuffle=True,
            generator=gen(9),
            num_workers=2,
        ),
    ),
    Case(
        "large-tensors",
        lambda: dict(dataset=LargeItems(10), batch_size=3, shuffle=True, generator=gen(12),
                     num_workers=2),
        everywhere=True,
    ),
    Case(
        "large-tensors-batch-size-none",
        lambda: dict(dataset=LargeItems(5), batch_size=None, num_workers=2),
    ),
    Case(
        "large-tensors-list-collate",
        lambda: dict(dataset=LargeItems(6), batch_size=2, collate_fn=list_collate, num_workers=2),
    ),
    Case(
        "exotic-tensors-batch-size-none",
        lambda: dict(dataset=ExoticTensors(), batch_size=None, num_workers=2),
    ),
    Case(
        "exotic-tensors-list-collate",
        lambda: dict(dataset=ExoticTensors(), batch_size=2, collate_fn=list_collate,
                     num_workers=2),
    ),
    # -- workers, prefetching, timeout ------------------------------------------------------------
    Case(
        "one-worker",
        lambda: dict(
            dataset=TensorItems(9), batch_size=2, shuffle=True, generator=gen(1), num_workers=1
        ),
    ),
    Case(
        "three-workers",
        lambda: dict(
            dataset=DictItems(13), batch_size=2, shuffle=True, generator=gen(4), num_workers=3
        ),
    ),
    Case(
        "prefetch-1",
        lambda: dict(dataset=TensorItems(9), batch_size=2, num_workers=2, prefetch_factor=1),
    ),
    Case(
        "prefetch-4",
        lambda: dict(
            dataset=TensorItems(25),
            batch_size=2,
            shuffle=True,
            generator=gen(8),
            num_workers=2,
            prefetch_factor=4,
        ),
    ),
    Case(
        "one-worker-prefetch-1",
        lambda: dict(dataset=TupleItems(5), batch_size=2, num_workers=1, prefetch_factor=1),
    ),
    Case(
        "timeout-set",
        lambda: dict(dataset=TensorItems(7), batch_size=2, num_workers=2, timeout=30),
    ),
    # -- iterable-style ---------------------------------------------------------------------------
    Case(
        "iterable-sharded-torch-info",
        lambda: dict(dataset=ShardedIterable(11, "torch"), batch_size=3, num_workers=2),
    ),
    Case(
        "iterable-sharded-mploader-info",
        lambda: dict(dataset=ShardedIterable(11, "mploader"), batch_size=3, num_workers=3),
        everywhere=True,
        reference_dataset=lambda: ShardedIterable(11, "torch"),
    ),
    Case(
        "iterable-sharded-drop-last",
        lambda: dict(
            dataset=ShardedIterable(11, "torch"), batch_size=3, drop_last=True, num_workers=2
        ),
    ),
    Case(
        "iterable-uneven-shards",
        lambda: dict(dataset=UnevenShards([5, 1, 3]), batch_size=2, num_workers=3),
        everywhere=True,
    ),
    Case(
        "iterable-uneven-shards-empty-worker",
        lambda: dict(dataset=UnevenShards([4, 0]), batch_size=2, num_workers=2),
    ),
    Case(
        "iterable-uneven-shards-drop-last-prefetch-1",
        lambda: dict(
            dataset=UnevenShards([3, 6]),
            batch_size=2,
            drop_last=True,
            num_workers=2,
            prefetch_factor=1,
        ),
    ),
    Case(
        "iterable-batch-size-none",
        lambda: dict(dataset=ShardedIterable(7, "torch"), batch_size=None, num_workers=2),
    ),
    Case(
        "iterable-batch-size-none-uneven",
        lambda: dict(dataset=UnevenShards([1, 4, 2]), batch_size=None, num_workers=3),
    ),
    Case(
        "iterable-unsharded-duplicates",
        lambda: dict(dataset=CountingIterable(5), batch_size=2, num_workers=2),
    ),
    Case(
        "iterable-custom-collate",
        lambda: dict(
            dataset=ShardedIterable(8, "torch"), batch_size=3, collate_fn=list_collate,
            num_workers=2,
        ),
    ),
    Case(
        "iterable-one-worker-prefetch-4",
        lambda: dict(
            dataset=ShardedIterable(9, "torch"), batch_size=2, num_workers=1, prefetch_factor=4
        ),
    ),
]

PARAMS = [pytest.param(case, "fork", id=f"{case.id}-fork") for case in CASES] + [
    pytest.param(case, method, id=f"{case.id}-{method}")
    for case in CASES
    if case.everywhere
    for method in ("spawn", "forkserver")
]

_torch_results: dict[tuple[str, str], tuple[list[Any], list[torch.Tensor]]] = {}


def _random_states(loader: Any, case: Case) -> list[torch.Tensor]:
    """The state of every generator the epoch draws from: the loader's, the samplers', and the
    global one when no generator is given.  mploader must draw exactly what torch draws."""
    generators = [
        loader.generator,
        getattr(loader.sampler, "generator", None),
        getattr(loader.batch_sampler, "generator", None),
    ]
    states = [g.get_state() for g in generators if g is not None]
    if case.global_seed is not None:
        states.append(torch.get_rng_state())
    return states


def _run(loader: Any, case: Case) -> tuple[list[Any], list[torch.Tensor]]:
    if case.global_seed is not None:
        torch.manual_seed(case.global_seed)
    batches = collect(loader)[0]
    return batches, _random_states(loader, case)


@pytest.mark.parametrize(("case", "start_method"), PARAMS)
def test_same_batches(case: Case, start_method: str, channel: bool) -> None:
    reference, loader = make_pair(
        case.options, start_method, channel, reference_dataset=case.reference_dataset
    )
    key = (case.id, start_method)
    if key not in _torch_results:
        try:
            _torch_results[key] = _run(reference, case)
        except Exception as error:  # torch 2.6 cannot collate numpy 2's bool scalars
            error.__traceback__ = None
            _torch_results[key] = error
    if isinstance(_torch_results[key], Exception):
        with pytest.raises(Exception) as caught:
            _run(loader, case)
        assert_same_failure(_torch_results[key], caught.value)  # type: ignore[arg-type]
        return
    expected, expected_states = _torch_results[key]  # type: ignore[misc]
    assert expected, "the case yields no batches: it tests nothing"
    actual, actual_states = _run(loader, case)
    assert_same_batches(expected, actual)
    assert len(actual_states) == len(expected_states)
    for e, a in zip(expected_states, actual_states, strict=True):
        assert torch.equal(e, a), "mploader drew from a generator differently than torch"


def test_cases_cover_every_start_method_feature() -> None:
    """The spawn/forkserver subset keeps map-style and iterable cases (guards table edits)."""
    everywhere = [case.id for case in CASES if case.everywhere]
    assert any(i.startswith("iterable") for i in everywhere)
    assert any(not i.startswith("iterable") for i in everywhere)
    assert len({case.id for case in CASES}) == len(CASES)


def _layout(value: Any) -> Any:
    """Strides of every tensor and array leaf (values are compared elsewhere)."""
    if isinstance(value, torch.Tensor):
        return ("tensor", value.stride())
    if isinstance(value, np.ndarray):
        return ("array", value.strides)
    if isinstance(value, dict):
        return {key: _layout(v) for key, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_layout(v) for v in value]
    return None


@pytest.mark.parametrize("start_method", ["fork"])
def test_unbatched_tensors_keep_their_strides(start_method: str, channel: bool) -> None:
    """Without collation a sample's tensors reach the main process as torch sends them: a
    transposed view stays transposed, an expanded tensor keeps its zero strides (and its size in
    memory), a Fortran-ordered array stays Fortran-ordered."""
    reference, loader = make_pair(
        lambda: dict(dataset=ExoticTensors(), batch_size=None, num_workers=2), start_method,
        channel,
    )
    expected = [_layout(batch) for batch in reference]
    actual = [_layout(batch) for batch in loader]
    differing = {
        key: (a[key], e[key])
        for e, a in zip(expected, actual, strict=True)
        for key in e
        if a[key] != e[key]
    }
    assert not differing, f"leaf: (mploader's layout, torch's layout): {differing}"


@pytest.mark.parametrize("start_method", ["fork"])
def test_collate_function_registered_in_torchs_map(start_method: str, channel: bool) -> None:
    """torch documents extending ``default_collate`` by adding a type to
    ``default_collate_fn_map``; under fork, workers see an entry added before iterating."""
    from torch.utils.data._utils.collate import default_collate_fn_map

    import mploader.worker.fetch  # noqa: F401  (imported first, as in any program that iterated)

    default_collate_fn_map[Money] = collate_money
    try:
        reference, loader = make_pair(
            lambda: dict(dataset=MoneyItems(), batch_size=2, num_workers=2), start_method,
            channel,
        )
        expected = list(reference)
        assert expected[0]["price"].tolist() == [99, 199]
        assert_same_batches(expected, list(loader))
    finally:
        del default_collate_fn_map[Money]
