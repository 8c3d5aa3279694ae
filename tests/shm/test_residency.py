"""Through a real loader: the held-batches count is exact, and a reused block is not re-faulted.

The count (``ChannelStatistics.live_batches``) must equal the batches whose views the consumer
still holds, at every step, across epochs, with persistent workers or not, when the consumer keeps
batches and when an epoch is abandoned with results already received (those are discarded, never
delivered, and so were never held).

Residency is checked with the kernel's own counters (``/proc/<pid>/stat`` minor and major page
faults) and with mapping identity (the address the main process maps each block at), not timings.
"""

from __future__ import annotations

import os
import time

import pytest
import torch

import mploader

PAGE = 4096
ITEM_FLOATS = 4 << 20  # 16 MiB per batch: 4096 pages, far above the inline threshold


class Filled(torch.utils.data.Dataset):
    """Item ``i``: a 16 MiB float32 tensor of ``i``, copied from one array the dataset keeps, so
    that the worker allocates nothing per item and its page faults are the channel's."""

    def __init__(self, length: int) -> None:
        self.length = length
        self.source = torch.zeros(ITEM_FLOATS)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.source.fill_(float(index))


def page_faults(pid: int) -> int:
    """Minor plus major page faults of ``pid`` so far (fields 10 and 12 of its stat line)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return int(fields[7]) + int(fields[9])


def held(iterator) -> int:
    return iterator.stats().channel.live_batches


@pytest.mark.parametrize("persistent", [False, True], ids=["fresh", "persistent"])
def test_held_batches_count_is_exact(persistent):
    loader = mploader.DataLoader(Filled(12), batch_size=None, num_workers=2,
                                 multiprocessing_context="fork", persistent_workers=persistent)
    kept: list[tuple[int, torch.Tensor]] = []  # (epoch, batch) the consumer keeps

    def expected(epoch: int) -> int:
        """Kept batches this epoch's iterator handed out (persistent: one iterator for all)."""
        return sum(1 for kept_epoch, _ in kept if persistent or kept_epoch == epoch)

    for epoch in range(3):
        iterator = iter(loader)
        number = 0
        # No enumerate(): its reused result tuple would keep the previous batch alive.
        for batch in iterator:
            assert held(iterator) == 1 + expected(epoch), (epoch, number)  # in hand, and kept
            if number % 4 == 0:
                kept.append((epoch, batch))
            del batch
            assert held(iterator) == expected(epoch), (epoch, number)
            number += 1  # noqa: SIM113
            if epoch == 1 and number == 5:
                break  # abandon the epoch with results already received (discarded unseen)
        assert loader.stats().channel.live_batches == expected(epoch)
        del kept[: len(kept) // 2]
        assert held(iterator) == expected(epoch), epoch
    kept.clear()
    final = loader.stats().channel
    assert final.live_batches == 0
    assert final.releases == final.decodes


def test_discards_do_not_count_as_releases():
    """A payload dropped without decoding was never held: the count does not go below zero."""
    loader = mploader.DataLoader(Filled(16), batch_size=None, num_workers=2,
                                 multiprocessing_context="fork", persistent_workers=True)
    for _ in range(3):
        iterator = iter(loader)
        next(iterator)  # the others are in flight or received: discarded by the next iter()
        assert held(iterator) == 0  # the batch just received was dropped at once
    channel = iterator.stats().channel
    assert channel.discards > 0
    assert channel.live_batches == 0


def test_a_reused_block_is_not_faulted_again():
    """Persistent workers in steady state: the worker writes into blocks it keeps mapped and
    populated, the main process reads them through mappings it keeps; neither takes page faults
    for them (under 1% of the batch's pages), and each block keeps its address in the main
    process for the loader's life."""
    loader = mploader.DataLoader(Filled(8), batch_size=None, num_workers=1,
                                 multiprocessing_context="fork", persistent_workers=True)
    pages = ITEM_FLOATS * 4 // PAGE
    iterator = iter(loader)
    for _batch in iterator:
        # Warm-up epoch, with a slow consumer so that the worker always runs ahead: the pool
        # grows to the most a for loop holds (the batch in hand, the one being delivered, the
        # prefetched ones).
        time.sleep(0.05)
    time.sleep(0.2)  # the last prefetch of the next epoch finds all blocks made
    worker_pid = iterator.stats().workers[0].pid
    addresses = block_mappings()
    worker_before, main_before = page_faults(worker_pid), page_faults_self()
    batches = 0
    for _ in range(2):
        for batch in loader:
            expected = float(batches % 8) * (ITEM_FLOATS // 1024)
            assert float(batch[::1024].sum()) == expected  # one read per page, every page
            batches += 1
    worker_faults = page_faults(worker_pid) - worker_before
    main_faults = page_faults_self() - main_before
    assert block_mappings() == addresses
    assert worker_faults < 0.01 * pages * batches, worker_faults
    assert main_faults < 0.01 * pages * batches, main_faults


def page_faults_self() -> int:
    return page_faults(os.getpid())


def block_mappings() -> set[tuple[str, str]]:
    """(address range, block name) of every mploader block this process maps."""
    with open("/proc/self/maps") as maps:
        return {
            (fields[0], os.path.basename(fields[5]))
            for fields in (line.split() for line in maps)
            if len(fields) >= 6 and os.path.basename(fields[5]).startswith("mploader-")
        }


class SlowFilled(Filled):
    """``Filled`` whose items take a while: the consumer's releases reach the worker's pipe while
    it fetches."""

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(0.03)
        return super().__getitem__(index)


def test_a_release_that_arrived_during_the_fetch_is_used():
    """The consumer drops each batch before asking for the next, so when the worker is the slow
    side, the block of batch n is free again (its release reached the worker's pipe while the
    worker fetched batch n + 1) by the time batch n + 1 is encoded: one block carries the whole
    epoch, none is made for nothing."""
    loader = mploader.DataLoader(SlowFilled(10), batch_size=None, num_workers=1,
                                 multiprocessing_context="fork", persistent_workers=True)
    iterator = iter(loader)
    for number in range(10):
        batch = next(iterator)
        assert float(batch[0]) == number
        del batch
    pool = iterator.stats().channel.workers[0]
    assert pool.blocks == 1, pool
    assert pool.reuse_misses == 1, pool
    del iterator, loader
