"""``worker_threads``: the same batches as torch, in the same order, from the same workers.

Items sleep a little, unevenly, so that a worker's fetch threads finish parts and tasks out of
order; the loader must still give torch's batches (torch with the same ``num_workers``, no
threads).  Each sample names the worker that fetched it, so "the worker each batch comes from is
unchanged" is part of the comparison.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch

import mploader

from .datasets import CountingIterable, GetItemsDataset, Sized, assert_same_batches, sort_key

pytestmark = pytest.mark.timeout(60)


class WhoFetched(Sized):
    """Item ``i``: its index, the fetching worker's id, a tensor; sleeps 0-4 ms unevenly."""

    def __getitem__(self, index: int) -> dict[str, Any]:
        time.sleep((index * 7 % 5) / 1000)
        info = torch.utils.data.get_worker_info()
        return {
            "index": index,
            "worker": -1 if info is None else info.id,
            "x": torch.full((2,), index, dtype=torch.float32),
        }


class SplitGetItems(GetItemsDataset):
    """Opts in to having its ``__getitems__`` batches split across fetch threads."""

    mploader_split_getitems = True


def _both(options: dict[str, Any], threads: int) -> tuple[list[Any], list[Any]]:
    """torch's batches and mploader's with ``threads`` fetch threads; each loader gets a fresh
    generator seeded alike."""
    expected = list(torch.utils.data.DataLoader(**options, generator=_generator()))
    actual = list(mploader.DataLoader(**options, generator=_generator(),
                                      worker_threads=threads))
    return expected, actual


def _generator() -> torch.Generator:
    return torch.Generator().manual_seed(3)


def test_batches_order_and_workers_equal_torchs(start_method: str) -> None:
    """3 threads, batches of 4: parts of 2, 1 and 1 items finish out of order."""
    options = dict(dataset=WhoFetched(37), batch_size=4, shuffle=True, num_workers=2,
                   multiprocessing_context=start_method)
    expected, actual = _both(options, 3)
    assert_same_batches(expected, actual)


@pytest.mark.parametrize("channel", [False, True], ids=["pickle", "shm"])
def test_unbatched_items_and_both_channels_equal_torchs(channel: bool) -> None:
    options = dict(dataset=WhoFetched(30), batch_size=None, num_workers=2,
                   multiprocessing_context="fork")
    expected = list(torch.utils.data.DataLoader(**options))
    actual = list(mploader.DataLoader(**options, worker_threads=4, shared_memory=channel))
    assert_same_batches(expected, actual)


def test_out_of_order_delivery_gives_the_same_batches() -> None:
    options = dict(dataset=WhoFetched(40), batch_size=3, num_workers=2,
                   multiprocessing_context="fork", in_order=False)
    expected, actual = _both(options, 4)
    for batch in expected + actual:  # which worker gets a task depends on timing, in torch too
        del batch["worker"]
    assert sorted(map(sort_key, actual)) == sorted(map(sort_key, expected))


def test_persistent_epochs_with_a_broken_one_equal_torchs_with_the_same_prefetch() -> None:
    """A broken epoch leaves the generator where the sampler's prefetching left it (torch's
    RandomSampler draws one more permutation when it runs out), so the next epochs equal torch's
    with the same number of tasks in flight: ``prefetch_factor * worker_threads``."""

    def options(**extra: Any) -> dict[str, Any]:
        return dict(dataset=WhoFetched(21), batch_size=2, shuffle=True,
                    generator=torch.Generator().manual_seed(8), num_workers=2,
                    persistent_workers=True, multiprocessing_context="fork", **extra)

    reference = torch.utils.data.DataLoader(**options(prefetch_factor=2 * 3))
    loader = mploader.DataLoader(**options(), worker_threads=3)
    for epoch, stop_after in enumerate([None, 2, None]):
        expected, actual = [], []
        for batches, source in ((expected, reference), (actual, loader)):
            for number, batch in enumerate(source):
                batches.append(batch)
                if stop_after is not None and number + 1 == stop_after:
                    break
        assert_same_batches(expected, actual, f"epoch {epoch}")


def test_getitems_batches_stay_whole_unless_the_dataset_opts_in() -> None:
    options = dict(batch_size=6, num_workers=2, multiprocessing_context="fork")
    expected = list(torch.utils.data.DataLoader(GetItemsDataset(18), **options))
    whole = list(mploader.DataLoader(GetItemsDataset(18), **options, worker_threads=3))
    assert_same_batches(expected, whole)  # one __getitems__ call per batch, as in torch
    assert set(whole[0]["via"]) == {"getitems/6"}

    split = list(mploader.DataLoader(SplitGetItems(18), **options, worker_threads=3))
    assert [batch["index"].tolist() for batch in split] == [
        batch["index"].tolist() for batch in expected
    ]
    assert all(via == "getitems/2" for batch in split for via in batch["via"])  # 3 parts


@pytest.mark.parametrize("value", [0, -2, 1.5, True, "4", None])
def test_worker_threads_must_be_a_positive_integer(value: Any) -> None:
    with pytest.raises(ValueError, match=r"worker_threads option should be a positive integer"):
        mploader.DataLoader(WhoFetched(4), num_workers=1, worker_threads=value)


def test_iterable_datasets_cannot_be_fetched_concurrently() -> None:
    with pytest.raises(ValueError, match=r"worker_threads=4 needs a map-style dataset: an "
                                         r"IterableDataset is read through one iterator"):
        mploader.DataLoader(CountingIterable(8), num_workers=2, worker_threads=4)
    mploader.DataLoader(CountingIterable(8), num_workers=2, worker_threads=1)  # the default


class RandomPerItem(Sized):
    """Item ``i``: its index and three draws from ``mploader.item_generator()``."""

    def __getitem__(self, index: int) -> dict[str, Any]:
        time.sleep((index * 7 % 5) / 1000)
        return {"index": index, "draws": torch.rand(3, generator=mploader.item_generator())}


def test_item_generator_draws_do_not_depend_on_threads_or_timing() -> None:
    def epochs(threads: int) -> list[list[Any]]:
        loader = mploader.DataLoader(RandomPerItem(24), batch_size=4, shuffle=True,
                                     generator=_generator(), num_workers=2,
                                     persistent_workers=True, worker_threads=threads,
                                     multiprocessing_context="fork")
        return [list(loader) for _ in range(2)]

    one, four = epochs(1), epochs(4)
    for epoch in range(2):
        assert_same_batches(one[epoch], four[epoch], f"epoch {epoch}")
    draws = torch.cat([batch["draws"] for epoch in one for batch in epoch])
    assert len({tuple(row.tolist()) for row in draws}) == 48  # every item, every epoch differs


def test_item_generator_outside_a_fetch_is_a_clear_error() -> None:
    with pytest.raises(RuntimeError, match=r"only available while a mploader.DataLoader fetches"):
        mploader.item_generator()
    batches = list(mploader.DataLoader(RandomPerItem(4), batch_size=2))  # num_workers=0 too
    assert batches[0]["draws"].shape == (2, 3)


def test_mid_epoch_resume_with_threads_gives_the_rest_of_the_epoch() -> None:
    """state_dict() after 5 batches, loaded into a fresh loader: the batches the uninterrupted
    run gives after its 5th (the worker each comes from included), then the same next epoch."""

    def make() -> Any:
        return mploader.DataLoader(WhoFetched(40), batch_size=3, shuffle=True,
                                   generator=_generator(), num_workers=2, worker_threads=3,
                                   multiprocessing_context="fork")

    uninterrupted = make()
    expected = [list(uninterrupted) for _ in range(2)]
    interrupted = make()
    iterator = iter(interrupted)
    head = [next(iterator) for _ in range(5)]
    state = interrupted.state_dict()
    del iterator
    resumed = make()
    resumed.load_state_dict(state)
    assert_same_batches(expected[0][:5], head, "before the state")
    assert_same_batches(expected[0][5:], list(resumed), "resumed epoch")
    assert_same_batches(expected[1], list(resumed), "next epoch")


def test_without_workers_threads_change_nothing() -> None:
    options = dict(dataset=WhoFetched(10), batch_size=3)
    expected = list(torch.utils.data.DataLoader(**options))
    assert_same_batches(expected, list(mploader.DataLoader(**options, worker_threads=4)))
