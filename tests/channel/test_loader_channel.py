"""The shared-memory channel through mploader.DataLoader: held batches, budget, failures, leaks."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

import mploader
from mploader.channel.shm import SharedMemoryFullError
from mploader.config import SharedMemoryConfig
from mploader.errors import WorkerDiedError
from tests.leaks import leaked_entries, let_loaders_go, own_blocks, own_shm_bytes
from tests.leaks import shm_entries as shm_names

from .datasets import NumpyItems, Patterned, kill_while_writing

MiB = 1 << 20


@pytest.fixture(autouse=True)
def no_shm_leftovers():
    before = shm_names()
    yield
    gc.collect()
    deadline = time.monotonic() + 5
    while leaked_entries(before) and time.monotonic() < deadline:
        time.sleep(0.05)
    leaked = leaked_entries(before)
    assert not leaked, f"left in /dev/shm: {leaked}"


@pytest.mark.parametrize("start_method", ["fork", "spawn", "forkserver"])
def test_kept_batches_stay_intact_beyond_the_budget(start_method):
    """A consumer that keeps all 50 batches: the pool spills instead of hanging, and no block is
    rewritten while a view of it lives."""
    config = SharedMemoryConfig(budget_bytes=8 * MiB)
    loader = mploader.DataLoader(Patterned(50, numel=256 * 1024), batch_size=None,
                                 num_workers=2, multiprocessing_context=start_method,
                                 shared_memory=config, persistent_workers=True)
    iterator = iter(loader)
    kept = list(iterator)
    assert len(kept) == 50
    for index, batch in enumerate(kept):
        assert batch.shape == (256 * 1024,)
        assert bool((batch == index).all()), f"batch {index} was overwritten"
    spills = sum(pool.spills for pool in iterator.stats().channel.workers)
    assert spills > 0
    del kept
    gc.collect()
    # The next epoch works within the budget again.
    assert [int(b[0]) for b in loader] == list(range(50))
    iterator._shutdown_workers()


def test_numpy_items_come_back_as_numpy_and_blocks_are_reused():
    loader = mploader.DataLoader(NumpyItems(12, numel=1 * MiB), batch_size=None, num_workers=1,
                                 persistent_workers=True)
    iterator = iter(loader)
    for index, item in enumerate(iterator):
        assert type(item).__name__ == "Tensor"  # default_convert turns arrays into tensors
        assert float(item[0]) == index
    channel = iterator.stats().channel
    (pool,) = channel.workers
    assert pool.reuse_hits >= 8 and pool.blocks <= 4  # a handful of blocks, reused
    iterator._shutdown_workers()


def test_too_little_memory_left_is_a_clear_error(monkeypatch):
    # The test override of mploader.memory.available_memory(), read in the worker at each block.
    monkeypatch.setenv("MPLOADER_MEMORY_AVAILABLE_FOR_TESTING", str(4 * MiB))
    loader = mploader.DataLoader(Patterned(4, numel=4 * MiB), batch_size=None, num_workers=1)
    with pytest.raises(SharedMemoryFullError) as caught:
        list(loader)
    message = str(caught.value)
    for fragment in ("MPLOADER_MEMORY_AVAILABLE_FOR_TESTING", "budget_bytes",
                     "shared_memory=False", "fewer workers", "memory cgroup's limit"):
        assert fragment in message, fragment
    assert "/dev/shm" not in message
    assert f"needs {16 * MiB} bytes" in message and f"only {4 * MiB} bytes" in message
    del caught


def test_a_worker_killed_while_writing_a_block_leaves_nothing():
    loader = mploader.DataLoader(Patterned(4, numel=8), batch_size=2, num_workers=1,
                                 collate_fn=kill_while_writing)
    with pytest.raises(WorkerDiedError, match="is killed by signal: Killed"):
        list(loader)


PARENT = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {tests!r})
    import mploader
    from channel.datasets import Patterned
    loader = mploader.DataLoader(Patterned(1000, numel=4 << 20), batch_size=None, num_workers=2)
    iterator = iter(loader)
    kept = [next(iterator) for _ in range(3)]
    print(" ".join(str(p.pid) for p in iterator._workers), flush=True)
    time.sleep(60)
    """
)


def test_a_sigkilled_main_process_leaves_no_shared_memory():
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parent = subprocess.Popen([sys.executable, "-c", PARENT.format(tests=tests)],
                              stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(pid) for pid in parent.stdout.readline().split()]
        assert len(own_blocks()) >= 3  # the kept batches' blocks, mapped by parent and workers
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 10
        while any(psutil.pid_exists(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [pid for pid in pids if psutil.pid_exists(pid)]
        assert own_blocks() == {}  # nobody maps or holds them: the memory is gone
        assert shm_names() == set()
    finally:
        parent.kill()
        parent.wait()


@pytest.mark.parametrize("persistent", [True, False], ids=["persistent", "fresh-workers"])
def test_soak_100_epochs_of_64_mb_batches(persistent):
    """Open fds, /dev/shm entries and bytes stay flat; RSS grows by less than 64 MB."""
    loader = mploader.DataLoader(Patterned(2, numel=16 * MiB), batch_size=None, num_workers=1,
                                 persistent_workers=persistent)
    me = psutil.Process()

    def measure() -> tuple[int, int, int, int]:
        assert let_loaders_go()
        return me.num_fds(), len(own_blocks()), own_shm_bytes(), me.memory_info().rss

    baseline = None
    for epoch in range(100):
        for index, batch in enumerate(loader):
            assert float(batch[::4096].sum()) == index * len(batch[::4096])  # touches each page
            del batch
        if epoch == 9:
            baseline = measure()
    assert baseline is not None
    fds, names, used, rss = measure()
    assert fds <= baseline[0]
    assert names <= baseline[1]
    assert used <= baseline[2] + 1 * MiB
    assert rss - baseline[3] < 64 * MiB
    if loader._iterator is not None:
        loader._iterator._shutdown_workers()
