"""Checkpoints that cross: a state torchdata's ``StatefulDataLoader`` saved, loaded by
``mploader.DataLoader``, continues exactly as torchdata's own loader continues from it; and a
state mploader saved, loaded by torchdata's loader, continues exactly as mploader continues.
Every state goes through ``torch.save`` and ``torch.load(weights_only=True)`` on its way.

What torchdata's state cannot hold is not compared: the workers' generators (its workers start
from their seeds again), so a dataset's random draws in a worker differ; the batches' indices
must not.  After an epoch's end, a shuffle's next epoch is each loader's own draw (torchdata's
``shuffle=True`` builds a sampler of its own that draws another order than torch's), so there
the next epoch is checked to hold each sample once.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch.utils.data import Dataset, IterableDataset

import mploader
from mploader.compat import torchdata_keys

from .scenarios import through_checkpoint
from .torchdata_side import IGNORE_TORCHDATA_WARNINGS, Shards, StatefulDataLoader

pytestmark = [pytest.mark.timeout(120), *IGNORE_TORCHDATA_WARNINGS]
LENGTH, BATCH_SIZE, STOP_AFTER = 22, 3, 3


class Noisy(Dataset[dict[str, Any]]):
    """An index and a draw from the worker's torch generator (which torchdata does not keep)."""

    def __len__(self) -> int:
        return LENGTH

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"index": index, "noise": torch.rand(())}


def indices(batch: Any) -> list[int]:
    return (batch["index"] if isinstance(batch, dict) else batch).tolist()


CASES: dict[str, Callable[[int], dict[str, Any]]] = {
    "map-shuffle-generator": lambda workers: dict(
        dataset=Noisy(), batch_size=BATCH_SIZE, shuffle=True, num_workers=workers,
        generator=torch.Generator().manual_seed(7)),
    "map-sequential": lambda workers: dict(
        dataset=Noisy(), batch_size=BATCH_SIZE, num_workers=workers),
    "iterable-with-state": lambda workers: dict(
        dataset=Shards(LENGTH), batch_size=2, num_workers=workers),
}
LOADERS = {"torchdata": StatefulDataLoader, "mploader": mploader.DataLoader}


def make(side: str, case: str, workers: int) -> Any:
    arguments = CASES[case](workers)
    if workers:
        arguments["multiprocessing_context"] = "fork"
    return LOADERS[side](**arguments)


def saved(side: str, case: str, workers: int, at_end: bool) -> dict[str, Any]:
    """The state of ``side``'s loader after ``STOP_AFTER`` batches, or after its first epoch."""
    loader = make(side, case, workers)
    iterator = iter(loader)
    for _ in (iterator if at_end else itertools.islice(iterator, STOP_AFTER)):
        pass
    state = through_checkpoint(loader.state_dict())
    del iterator, loader
    return state


def continuation(side: str, case: str, workers: int, state: dict[str, Any]) -> list[list[int]]:
    """What ``side``'s fresh loader gives from ``state`` at its next ``iter()``."""
    loader = make(side, case, workers)
    loader.load_state_dict(state)
    batches = [indices(batch) for batch in loader]
    del loader
    return batches


@pytest.mark.parametrize("at_end", [False, True], ids=["mid-epoch", "at-epoch-end"])
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize(("maker", "loader"), [("torchdata", "mploader"),
                                               ("mploader", "torchdata")],
                         ids=["torchdata-to-mploader", "mploader-to-torchdata"])
def test_a_state_continues_in_the_other_loader_as_in_its_own(
        maker: str, loader: str, case: str, workers: int, at_end: bool) -> None:
    state = saved(maker, case, workers, at_end)
    own = continuation(maker, case, workers, state)
    crossed = continuation(loader, case, workers, state)
    if at_end and case == "map-shuffle-generator":
        for batches in (own, crossed):
            assert sorted(itertools.chain.from_iterable(batches)) == list(range(LENGTH))
        return
    assert crossed == own
    assert own, "something remains"


def test_mploader_s_state_has_torchdata_s_keys_and_the_workers_starts() -> None:
    """The layout tools read (and torchdata's own tests read): right after ``iter()``, each
    worker's entry holds where it starts."""
    loader = make("mploader", "iterable-with-state", 2)
    iterator = iter(loader)
    state = loader.state_dict()
    snapshot = state[torchdata_keys.SNAPSHOT]
    assert snapshot[torchdata_keys.SNAPSHOT_STEP] == 0
    assert snapshot[torchdata_keys.MAIN_SNAPSHOT][torchdata_keys.NUM_WORKERS] == 2
    workers = snapshot[torchdata_keys.WORKER_SNAPSHOTS]
    assert sorted(workers) == ["worker_0", "worker_1"]
    assert all(entry[torchdata_keys.DATASET_STATE] == {"position": 0}
               for entry in workers.values())
    assert state[torchdata_keys.ITERATOR_FINISHED] is False
    del iterator, loader


def test_an_iterator_dropped_at_once_leaves_its_workers_starts_in_the_state() -> None:
    """torchdata's loader keeps its iterator; mploader's, as torch's, shuts a dropped one down.
    Its shutdown reads what the workers said at start, and ``state_dict()`` waits for that."""
    loader = make("mploader", "iterable-with-state", 2)
    iter(loader)  # dropped: its workers are being stopped
    workers = loader.state_dict()[torchdata_keys.SNAPSHOT][torchdata_keys.WORKER_SNAPSHOTS]
    assert [entry[torchdata_keys.DATASET_STATE] for entry in workers.values()] == [
        {"position": 0}, {"position": 0}]
    assert continuation("mploader", "iterable-with-state", 2, loader.state_dict()) == [
        indices(batch) for batch in make("mploader", "iterable-with-state", 2)]


class Stateless(IterableDataset[int]):
    """An iterable dataset without a state: a resume replays the batches so far."""

    def __iter__(self) -> Iterator[int]:
        info = torch.utils.data.get_worker_info()
        return iter(range(info.id, LENGTH, info.num_workers) if info else range(LENGTH))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_stateless_iterable_s_torchdata_state_counts_its_batches_on(workers: int) -> None:
    """torchdata's state of a dataset that keeps no state: mploader replays to the same place
    and counts the batches yielded from there on, as the uninterrupted run counts them."""
    context = {"multiprocessing_context": "fork"} if workers else {}
    source = StatefulDataLoader(Stateless(), batch_size=2, num_workers=workers, **context)
    iterator = iter(source)
    expected = [next(iterator).tolist() for _ in range(STOP_AFTER + 1)][-1]
    del iterator
    source = StatefulDataLoader(Stateless(), batch_size=2, num_workers=workers, **context)
    iterator = iter(source)
    for _ in range(STOP_AFTER):
        next(iterator)
    state = through_checkpoint(source.state_dict())
    del iterator, source
    loader = mploader.DataLoader(Stateless(), batch_size=2, num_workers=workers, **context)
    loader.load_state_dict(state)
    iterator = iter(loader)
    assert next(iterator).tolist() == expected
    resumed = loader.state_dict()
    counted = (resumed[torchdata_keys.NUM_YIELDED] if workers == 0
               else resumed[torchdata_keys.SNAPSHOT][torchdata_keys.SNAPSHOT_STEP])
    assert counted == STOP_AFTER + 1
    del iterator, loader


def test_torchdata_s_keys_are_the_installed_torchdata_s() -> None:
    from torchdata.stateful_dataloader import incremental_state
    from torchdata.stateful_dataloader import stateful_dataloader as module

    multi = module._StatefulMultiProcessingDataLoaderIter
    theirs = {
        "INDEX_SAMPLER_STATE": module._INDEX_SAMPLER_STATE,
        "SAMPLER_ITER_STATE": module._SAMPLER_ITER_STATE,
        "SAMPLER_ITER_YIELDED": module._SAMPLER_ITER_YIELDED,
        "LENGTH_SEEN": module._ITERABLEDATASET_LEN_CALLED,
        "SHARED_SEED": module._SHARED_SEED,
        "ITERATOR_FINISHED": module._ITERATOR_FINISHED,
        "NUM_YIELDED": module._StatefulSingleProcessDataLoaderIter._NUM_YIELDED,
        "SNAPSHOT": multi._SNAPSHOT,
        "SNAPSHOT_STEP": multi._SNAPSHOT_STEP,
        "LAST_YIELDED_WORKER_ID": multi._LAST_YIELDED_WORKER_ID,
        "MAIN_SNAPSHOT": multi._MAIN_SNAPSHOT,
        "WORKER_SNAPSHOTS": multi._WORKER_SNAPSHOTS,
        "STEPS_SINCE_SNAPSHOT": multi._STEPS_SINCE_SNAPSHOT,
        "NUM_WORKERS": multi._NUM_WORKERS,
        "BASE_SEED": multi._BASE_SEED,
        "WORKER_ID": incremental_state._WORKER_ID,
        "FETCHER_STATE": incremental_state._FETCHER_STATE,
        "DATASET_STATE": incremental_state._DATASET_STATE,
        "DATASET_ITER_STATE": incremental_state._DATASET_ITER_STATE,
        "FETCHER_ENDED": incremental_state._FETCHER_ENDED,
    }
    assert {name: getattr(torchdata_keys, name) for name in theirs} == theirs
