"""torchdata's ``StatefulDataLoader`` and ``mploader.DataLoader`` side by side, one test per gap
that torchdata 0.11's own test file found in mploader's resume (groups B to G).

Each test stops a loader at the same point, saves ``state_dict()``, loads it into a fresh loader
and reads on; it checks, for each loader, that the resumed run gives what the uninterrupted one
gave (batches and what the dataset saw), and that both loaders agree wherever their samplers are
the same (torchdata's ``shuffle=True`` uses a sampler of its own, torch's does not).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch.utils.data import Dataset, IterableDataset, Sampler

import mploader

from .torchdata_side import IGNORE_TORCHDATA_WARNINGS, StatefulDataLoader

pytestmark = [pytest.mark.timeout(120), *IGNORE_TORCHDATA_WARNINGS]
LENGTH = 24
LOADERS = {"torchdata": StatefulDataLoader, "mploader": mploader.DataLoader}
Make = Callable[[type], Any]


def as_list(batch: Any) -> Any:
    """The collate function: the samples as they are (plain lists compare and print well)."""
    return batch


def worker_shard(length: int) -> range:
    info = torch.utils.data.get_worker_info()
    if info is None:
        return range(length)
    return range(info.id, length, info.num_workers)


class CountingMap(Dataset):
    """C2: map-style; item ``i`` is ``[i, items this copy fetched, a draw from torch's global
    generator]``; its own state is that count and torch's generator state."""

    def __init__(self, length: int = LENGTH) -> None:
        self.length = length
        self.count = 0

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> list[int]:
        self.count += 1
        return [index, self.count, int(torch.randint(10**6, ()).item())]

    def state_dict(self) -> dict[str, Any]:
        return {"count": self.count, "rng": torch.get_rng_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.count = state["count"]
        torch.set_rng_state(state["rng"])


class ShuffledIterator:
    """C1: an iterator that draws its samples from torch's global generator and keeps that
    generator's state in its own ``state_dict`` (torchdata's DummyIterator, shuffle on)."""

    def __init__(self, samples: list[int]) -> None:
        self.samples = samples
        self.i = 0

    def __iter__(self) -> ShuffledIterator:
        return self

    def __next__(self) -> list[int]:
        if self.i >= len(self.samples):
            raise StopIteration
        self.i += 1
        return [self.samples[int(torch.randint(len(self.samples), ()).item())], self.i]

    def state_dict(self) -> dict[str, Any]:
        return {"i": self.i, "rng": torch.get_rng_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.i = state["i"]
        torch.set_rng_state(state["rng"])


class ShuffledStream(IterableDataset):
    def __iter__(self) -> ShuffledIterator:
        return ShuffledIterator(list(worker_shard(LENGTH)))


class EpochCounting(IterableDataset):
    """D1: yields ``(item, epoch)``; at the end of each pass it counts the epoch, so a state
    taken at an epoch boundary must carry that count."""

    def __init__(self, length: int = LENGTH) -> None:
        self.length = length
        self.i = 0
        self.resume_at: int | None = None
        self.epoch = 0

    def __iter__(self) -> Iterator[list[int]]:
        shard = worker_shard(self.length)
        self.i, self.resume_at = self.resume_at or 0, None
        for position in range(self.i, len(shard)):
            self.i = position + 1
            yield [shard[position], self.epoch]
        self.i = 0
        self.epoch += 1

    def state_dict(self) -> dict[str, int]:
        return {"i": self.i, "epoch": self.epoch}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.resume_at = state["i"]
        self.epoch = state["epoch"]


class SelfIterating(IterableDataset):
    """E: its own iterator, which sets up its position in ``__iter__``: its state can only be
    loaded after ``iter()`` (torchdata's CountIterCallsIter)."""

    def __init__(self, length: int = LENGTH) -> None:
        self.length = length
        self.iter_calls = 0

    def __iter__(self) -> SelfIterating:
        self.iter_calls += 1
        shard = worker_shard(self.length)
        self.current, self.end = shard.start, shard.stop
        self.step = shard.step
        return self

    def __next__(self) -> list[int]:
        if self.current >= self.end:
            raise StopIteration
        value = self.current
        self.current += self.step
        return [value, self.iter_calls]

    def state_dict(self) -> dict[str, int]:
        return {"current": self.current, "iter_calls": self.iter_calls}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.current = state["current"]


class CountingSampler(Sampler[int]):
    """B: a sampler whose iterator has its own (plain) state, as torchdata's DummySampler."""

    def __init__(self, length: int = LENGTH) -> None:
        self.length = length

    def __iter__(self) -> CountingSamplerIterator:
        return CountingSamplerIterator(self.length)

    def __len__(self) -> int:
        return self.length


class CountingSamplerIterator:
    def __init__(self, length: int) -> None:
        self.length = length
        self.i = 0

    def __iter__(self) -> CountingSamplerIterator:
        return self

    def __next__(self) -> int:
        if self.i >= self.length:
            raise StopIteration
        self.i += 1
        return self.i - 1

    def state_dict(self) -> dict[str, int]:
        return {"i": self.i}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.i = state["i"]


class PlainMap(Dataset):
    def __len__(self) -> int:
        return LENGTH

    def __getitem__(self, index: int) -> int:
        return index


# -- the run ---------------------------------------------------------------------------------------


def shut(loader: Any) -> None:
    iterator = getattr(loader, "_iterator", None)
    if iterator is not None and hasattr(iterator, "_shutdown_workers"):
        iterator._shutdown_workers()


def uninterrupted(make: Make, loader_class: type, epochs: int) -> list[list[Any]]:
    torch.manual_seed(0)
    loader = make(loader_class)
    result = [list(loader) for _ in range(epochs)]
    shut(loader)
    return result


def stop_and_resume(make: Make, loader_class: type, epoch: int, batches: int | None,
                    epochs: int, through_json: bool = False) -> list[list[Any]]:
    """Run ``epoch`` whole epochs and ``batches`` of the next (``None``: all of it, then its
    StopIteration); save; load into a fresh loader; read on to the end of epoch ``epochs - 1``.
    The global generators start where the uninterrupted run's did; the second loader starts
    with them elsewhere, as in a new process."""
    torch.manual_seed(0)
    first = make(loader_class)
    seen = [list(first) for _ in range(epoch)]
    iterator = iter(first)
    if batches is None:
        seen.append(list(iterator))
    else:
        seen.append([next(iterator) for _ in range(batches)])
    state = first.state_dict()
    if through_json:
        state = json.loads(json.dumps(state))
    del iterator
    shut(first)
    torch.manual_seed(12345)  # a new process: the global generators are elsewhere
    second = make(loader_class)
    second.load_state_dict(state)
    if batches is not None:
        seen[-1].extend(list(second))
    while len(seen) < epochs:
        seen.append(list(second))
    shut(second)
    return seen


def both_resume_exactly(make: Make, epoch: int, batches: int | None, epochs: int,
                        compare: bool = True, through_json: bool = False,
                        torchdata_epochs: int | None = None) -> None:
    """mploader resumes exactly through epoch ``epochs - 1``; torchdata through epoch
    ``torchdata_epochs - 1`` (default: the same; 0: not asked, where it is not exact); and
    they agree where both are asked (unless their samplers differ: ``compare=False``)."""
    results = {}
    for name, loader_class in LOADERS.items():
        count = epochs if name == "mploader" or torchdata_epochs is None else torchdata_epochs
        if count <= epoch:
            continue
        expected = uninterrupted(make, loader_class, count)
        resumed = stop_and_resume(make, loader_class, epoch, batches, count, through_json)
        assert resumed == expected, name
        results[name] = resumed
    if compare and "torchdata" in results:
        common = len(results["torchdata"])
        assert results["mploader"][:common] == results["torchdata"]


def loader(loader_class: type, dataset: Any, num_workers: int, persistent: bool = False,
           **extra: Any) -> Any:
    workers: dict[str, Any] = {}
    if num_workers:
        workers = dict(multiprocessing_context="fork", persistent_workers=persistent)
    return loader_class(dataset, num_workers=num_workers, collate_fn=as_list, **workers, **extra)


WORKERS = [pytest.param(0, False, id="inline"), pytest.param(2, False, id="2-workers"),
           pytest.param(2, True, id="2-persistent")]


# -- B: the state goes through JSON ----------------------------------------------------------------


@pytest.mark.parametrize(("num_workers", "persistent"), WORKERS)
@pytest.mark.parametrize("kind", ["iterable", "map-stateful-sampler", "map-shuffled"])
def test_b_state_goes_through_json(kind: str, num_workers: int, persistent: bool) -> None:
    def make(loader_class: type) -> Any:
        if kind == "iterable":
            return loader(loader_class, EpochCounting(), num_workers, persistent, batch_size=2)
        if kind == "map-stateful-sampler":
            return loader(loader_class, PlainMap(), num_workers, persistent, batch_size=3,
                          sampler=CountingSampler())
        return loader(loader_class, PlainMap(), num_workers, persistent, batch_size=3,
                      sampler=torch.utils.data.RandomSampler(
                          range(LENGTH), generator=torch.Generator().manual_seed(3)))

    if kind == "map-shuffled":  # torchdata fast-forwards torch's RandomSampler from its
        # generator as it is now, which is where the epoch began only in the first epoch
        both_resume_exactly(make, 0, 3, 3, through_json=True, torchdata_epochs=1)
    else:
        both_resume_exactly(make, 1, 3, 3, through_json=True)


# -- C1: inline, the dataset's load_state_dict restores torch's generator -------------------------


@pytest.mark.parametrize(("num_workers", "persistent"), WORKERS)
@pytest.mark.parametrize("batches", [0, 1, 5])
def test_c1_dataset_restores_the_global_generator(num_workers: int, persistent: bool,
                                                  batches: int) -> None:
    def make(loader_class: type) -> Any:
        return loader(loader_class, ShuffledStream(), num_workers, persistent, batch_size=3)

    both_resume_exactly(make, 0, batches, 1)


# -- C2: a map-style dataset's own state -----------------------------------------------------------


@pytest.mark.parametrize(("num_workers", "persistent"), WORKERS)
@pytest.mark.parametrize(("epoch", "batches"), [(0, 4), (1, 2)])
def test_c2_map_style_dataset_state(num_workers: int, persistent: bool, epoch: int,
                                    batches: int) -> None:
    def make(loader_class: type) -> Any:
        return loader(loader_class, CountingMap(), num_workers, persistent, batch_size=3,
                      sampler=torch.utils.data.RandomSampler(
                          range(LENGTH), generator=torch.Generator().manual_seed(5)))

    # With workers that are not persistent, each epoch's workers copy the main process's
    # dataset: the count starts over, in both loaders and in both runs.  torchdata is exact to
    # the end of the first epoch (later, it fast-forwards torch's RandomSampler from where its
    # generator is now, and its next base seed comes from the new process's generators).
    both_resume_exactly(make, epoch, batches, 3, torchdata_epochs=1)


# -- D1: a state taken at an epoch boundary keeps the dataset's state ------------------------------


@pytest.mark.parametrize(("num_workers", "persistent"),
                         [pytest.param(0, False, id="inline"),
                          pytest.param(2, True, id="2-persistent")])
@pytest.mark.parametrize("epoch", [0, 1])
def test_d1_epoch_boundary_keeps_the_dataset_state(num_workers: int, persistent: bool,
                                                   epoch: int) -> None:
    def make(loader_class: type) -> Any:
        return loader(loader_class, EpochCounting(), num_workers, persistent)

    both_resume_exactly(make, epoch, None, epoch + 3)


# -- D2: an epoch boundary with shuffle=True and no generator --------------------------------------


@pytest.mark.parametrize(("num_workers", "persistent"), WORKERS)
def test_d2_epoch_boundary_with_the_default_shuffle(num_workers: int, persistent: bool) -> None:
    def make(loader_class: type) -> Any:
        return loader(loader_class, PlainMap(), num_workers, persistent, batch_size=5,
                      shuffle=True)

    # torchdata shuffles with a sampler of its own: each loader is checked against itself.
    both_resume_exactly(make, 0, None, 3, compare=False)


# -- E: a dataset that is its own iterator: load_state_dict after iter() ---------------------------


@pytest.mark.parametrize(("num_workers", "persistent"), WORKERS)
@pytest.mark.parametrize("batches", [1, 7])
def test_e_state_of_a_self_iterating_dataset_loads_after_iter(num_workers: int, persistent: bool,
                                                              batches: int) -> None:
    def make(loader_class: type) -> Any:
        return loader(loader_class, SelfIterating(), num_workers, persistent, batch_size=2)

    expected_calls = {"mploader": None, "torchdata": None}
    for name, loader_class in LOADERS.items():
        rest = stop_and_resume(make, loader_class, 0, batches, 1)
        expected = uninterrupted(make, loader_class, 1)
        assert [item[0] for batch in rest[0] for item in batch] == [
            item[0] for batch in expected[0] for item in batch], name
        # iter() once per dataset copy in the resumed loader: a new worker's copy counts 1;
        # in the main process the same object counts on
        expected_calls[name] = sorted({item[1] for batch in rest[0][batches:] for item in batch})
    assert expected_calls["mploader"] == expected_calls["torchdata"]


# -- F: a state from before iter() loaded into a loader with a live iterator -----------------------


@pytest.mark.parametrize(("num_workers", "persistent"), WORKERS)
def test_f_a_fresh_state_loaded_onto_a_live_iterator(num_workers: int, persistent: bool) -> None:
    for name, loader_class in LOADERS.items():
        torch.manual_seed(0)
        first = loader(loader_class, CountingMap(), num_workers, persistent, batch_size=3,
                       shuffle=False)
        fresh = first.state_dict()
        expected = list(first)
        shut(first)
        second = loader(loader_class, CountingMap(), num_workers, persistent, batch_size=3,
                        shuffle=False)
        iterator = iter(second)
        for _ in range(3):
            next(iterator)
        second.load_state_dict(copy.deepcopy(fresh))
        assert_same_state(second.state_dict(), fresh, name)
        assert list(second) == expected, name
        shut(second)


def assert_same_state(found: Any, expected: Any, name: str) -> None:
    assert json.dumps(found, default=tensor_as_list, sort_keys=True) == json.dumps(
        expected, default=tensor_as_list, sort_keys=True), name


def tensor_as_list(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.tolist()
    raise TypeError(type(value))


# -- G: snapshot_every_n_steps=0, and n > 1 --------------------------------------------------------


@pytest.mark.parametrize("every", [0, 1, 3, 5])
@pytest.mark.parametrize(("num_workers", "persistent"), WORKERS)
@pytest.mark.parametrize("kind", ["iterable", "map"])
def test_g_snapshot_every_n_steps(every: int, num_workers: int, persistent: bool,
                                  kind: str) -> None:
    def make(loader_class: type) -> Any:
        if kind == "iterable":
            return loader(loader_class, EpochCounting(), num_workers, persistent, batch_size=2,
                          snapshot_every_n_steps=every)
        return loader(loader_class, CountingMap(), num_workers, persistent, batch_size=2,
                      snapshot_every_n_steps=every, sampler=torch.utils.data.RandomSampler(
                          range(LENGTH), generator=torch.Generator().manual_seed(5)))

    for batches in (4, 7):
        if kind == "iterable":
            both_resume_exactly(make, 1, batches, 2)
        else:  # torchdata: exact in the first epoch with torch's RandomSampler (see C2)
            both_resume_exactly(make, 0, batches, 2, torchdata_epochs=1)
            both_resume_exactly(make, 1, batches, 2, torchdata_epochs=0)


def test_g_snapshot_every_n_steps_is_checked() -> None:
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="snapshot_every_n_steps option should be"):
            mploader.DataLoader(PlainMap(), snapshot_every_n_steps=bad)


class LoggedState(Dataset):
    """Map-style; each call of its ``state_dict()`` adds a line to ``log``."""

    def __init__(self, log: str) -> None:
        self.log = log

    def __len__(self) -> int:
        return LENGTH

    def __getitem__(self, index: int) -> int:
        return index

    def state_dict(self) -> dict[str, int]:
        with open(self.log, "a") as log:
            log.write("state\n")
        return {}

    def load_state_dict(self, state: dict[str, int]) -> None:
        pass


@pytest.mark.parametrize(("every", "calls"), [(1, 2 + 12), (6, 2 + 4), (0, 2 + 0)])
def test_g_a_larger_interval_asks_workers_for_fewer_states(tmp_path: Any, every: int,
                                                           calls: int) -> None:
    """12 batches over 2 workers: each worker says where it starts (2 states, as torchdata's
    workers do at start); then every batch carries its worker's state at n=1; at n=6 only the
    two before each sixth (tasks 4, 5, 10, 11); at n=0 none."""
    log = str(tmp_path / "calls")
    open(log, "w").close()
    data = mploader.DataLoader(LoggedState(log), batch_size=2, num_workers=2,
                               multiprocessing_context="fork", snapshot_every_n_steps=every)
    assert [int(i) for batch in data for i in batch] == list(range(LENGTH))
    with open(log) as lines:
        assert len(lines.readlines()) == calls
