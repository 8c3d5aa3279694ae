"""Worker seeding and worker info: what a dataset sees inside a worker is what torch's shows it."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
import torch
import torch.utils.data

import mploader

from .datasets import (
    InitRecording,
    WorkerInfoAgreement,
    WorkerSeeds,
    assert_same_batches,
    make_pair,
    record_worker_init,
)

# Three workers on a two-CPU machine: torch and mploader both warn, as they should.
pytestmark = [
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
    pytest.mark.timeout(60),  # a stuck loader fails its test after a minute, not two
]


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_worker_seeds_and_info(start_method: str, channel: bool) -> None:
    """``torch.initial_seed()``, ``random``, numpy, ``torch.rand``, ``get_worker_info()`` fields and
    ``torch.get_num_threads()`` inside the workers equal torch's, given the same generator."""

    def options() -> dict[str, Any]:
        return dict(dataset=WorkerSeeds(8), batch_size=2, shuffle=True, generator=gen(42),
                    num_workers=2)

    reference, loader = make_pair(options, start_method, channel)
    expected = list(reference)
    actual = list(loader)
    assert_same_batches(expected, actual)
    for position, batch in enumerate(actual):
        assert batch["info_id"].tolist() == [position % 2] * 2
        assert batch["info_num_workers"].tolist() == [2, 2]
        assert batch["info_dataset_is_self"].tolist() == [True, True]
        assert batch["num_threads"].tolist() == [1, 1], "torch.set_num_threads(1) in workers"
        assert batch["info_seed"].tolist() == batch["initial_seed"].tolist()


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_worker_init_fn_runs_seeded_before_fetching(start_method: str, channel: bool) -> None:
    """``worker_init_fn(worker_id)`` runs in the worker, after seeding, with worker info set."""

    def options() -> dict[str, Any]:
        return dict(dataset=InitRecording(6), batch_size=2, num_workers=2, generator=gen(8),
                    worker_init_fn=record_worker_init)

    reference, loader = make_pair(options, start_method, channel)
    expected = list(reference)
    actual = list(loader)
    assert_same_batches(expected, actual)
    assert [batch["worker_id"].tolist() for batch in actual] == [[0, 0], [1, 1], [0, 0]]
    assert [batch["info_id"].tolist() for batch in actual] == [[0, 0], [1, 1], [0, 0]]


@pytest.mark.parametrize("start_method", ["fork"])
@pytest.mark.parametrize("options", [
    lambda: dict(dataset=WorkerSeeds(6), batch_size=3, num_workers=3, generator=gen(1),
                 prefetch_factor=1),
    lambda: dict(dataset=WorkerSeeds(5), batch_size=None, num_workers=2, generator=gen(2)),
    lambda: dict(dataset=WorkerSeeds(6), batch_size=2, num_workers=1, generator=gen(3),
                 persistent_workers=True),
], ids=["three-workers", "batch-size-none", "one-worker"])
def test_worker_seeds_other_settings(start_method: str, channel: bool, options: Any) -> None:
    reference, loader = make_pair(options, start_method, channel)
    assert_same_batches(list(reference), list(loader))


@pytest.mark.parametrize("start_method", ["fork"])
def test_worker_seeds_from_global_rng(start_method: str, channel: bool) -> None:
    """Without a generator, the base seed (and the shuffle) come from torch's global RNG."""

    def options() -> dict[str, Any]:
        return dict(dataset=WorkerSeeds(6), batch_size=2, shuffle=True, num_workers=2)

    reference, loader = make_pair(options, start_method, channel)
    torch.manual_seed(99)
    expected = list(reference)
    after_torch = torch.rand(3)
    torch.manual_seed(99)
    actual = list(loader)
    after_mploader = torch.rand(3)
    assert_same_batches(expected, actual)
    assert torch.equal(after_torch, after_mploader), "the global RNG was drawn from differently"


@pytest.mark.parametrize("start_method", ["fork"])
def test_different_generators_give_different_worker_seeds(start_method: str, channel: bool) -> None:
    loaders = [
        mploader.DataLoader(WorkerSeeds(4), batch_size=2, num_workers=2, generator=gen(seed),
                            multiprocessing_context=start_method, shared_memory=channel)
        for seed in (1, 2)
    ]
    first, second = (next(iter(loader)) for loader in loaders)
    assert first["initial_seed"].tolist() != second["initial_seed"].tolist()
    assert not torch.equal(first["torch_rand"], second["torch_rand"])


def test_single_process_seeds() -> None:
    """``num_workers=0``: the main process's RNGs, drawn in the same order as torch."""

    def options() -> dict[str, Any]:
        return dict(dataset=WorkerSeeds(5), batch_size=2, shuffle=True, generator=gen(6))

    reference, loader = make_pair(options, None, False)
    torch.manual_seed(5)
    expected = list(reference)
    torch.manual_seed(5)
    actual = list(loader)
    # random/numpy module state is not reset between the runs; compare what torch controls
    for e, a in zip(expected, actual, strict=True):
        assert e["index"].tolist() == a["index"].tolist()
        assert torch.equal(e["torch_rand"], a["torch_rand"])
        assert e["info_id"].tolist() == a["info_id"].tolist() == [-1] * len(a["index"])
        assert e["num_threads"].tolist() == a["num_threads"].tolist()


@pytest.mark.parametrize("start_method", ["fork", "forkserver"])
def test_both_get_worker_info_answer_in_workers(start_method: str, channel: bool) -> None:
    loader = mploader.DataLoader(WorkerInfoAgreement(), batch_size=3, num_workers=2,
                                 multiprocessing_context=start_method, shared_memory=channel)
    batches = list(loader)
    assert [batch[1].tolist() for batch in batches] == [[True] * 3, [True] * 3]
    assert [batch[2].tolist() for batch in batches] == [[0] * 3, [1] * 3]
    assert mploader.get_worker_info() is None
    assert torch.utils.data.get_worker_info() is None


def test_mploader_worker_info_answers_in_torch_workers() -> None:
    """A dataset written against ``mploader.get_worker_info()`` shards the same under torch's
    DataLoader: the info falls back to torch's own (torch's ``test_default_collate_shared_tensor``
    sets torch's ``_worker_info`` by hand and expects the same)."""
    loader = torch.utils.data.DataLoader(WorkerInfoAgreement(), batch_size=3, num_workers=2,
                                         multiprocessing_context="fork")
    batches = list(loader)
    assert [batch[1].tolist() for batch in batches] == [[True] * 3, [True] * 3]
    assert [batch[2].tolist() for batch in batches] == [[0] * 3, [1] * 3]
    from torch.utils.data._utils import worker as torch_worker

    saved = torch_worker._worker_info
    try:
        torch_worker._worker_info = "x"  # type: ignore[assignment]
        assert mploader.get_worker_info() == "x"
    finally:
        torch_worker._worker_info = saved
    assert mploader.get_worker_info() is None


@pytest.mark.parametrize("start_method", ["fork", "forkserver"])
def test_main_process_random_modules_untouched(start_method: str, channel: bool) -> None:
    """Like torch's, mploader's iterator draws from no ``random``/numpy state in the main process
    (and from torch's global RNG only without a generator, checked above)."""
    random_state, numpy_state = random.getstate(), np.random.get_state()
    torch_state = torch.get_rng_state()
    loader = mploader.DataLoader(WorkerSeeds(6), batch_size=2, num_workers=2, generator=gen(3),
                                 shuffle=True, multiprocessing_context=start_method,
                                 shared_memory=channel)
    assert len(list(loader)) == 3
    assert random.getstate() == random_state
    after = np.random.get_state()
    assert after[0] == numpy_state[0] and np.array_equal(after[1], numpy_state[1])
    assert after[2:] == numpy_state[2:]
    assert torch.equal(torch.get_rng_state(), torch_state)
