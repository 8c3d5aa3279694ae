"""Size classes, budget, backpressure, eviction, and the errors for too little memory."""

from __future__ import annotations

import errno
import os
import pickle

import pytest
import torch
from _shm_helpers import Loopback

from mploader.channel.shm import BatchTooLargeError, SharedMemoryFullError
from mploader.channel.shm.pool import size_class
from mploader.config import BudgetChoice, SharedMemoryConfig, resolve_shared_memory
from mploader.memory import AVAILABLE_BYTES_ENV, MemoryLimit
from tests.leaks import blocks_of

MIB = 1 << 20


@pytest.mark.parametrize(
    ("nbytes", "expected"),
    [
        (1, MIB),
        (MIB, MIB),
        (MIB + 1, MIB + MIB // 4),
        (3 * MIB, 3 * MIB),
        (3 * MIB + 1, 3 * MIB + MIB // 2),
        (602_000_000, 640 * MIB),
        (2 << 30, 2 << 30),
    ],
)
def test_size_classes(nbytes, expected):
    assert size_class(nbytes, MIB) == expected


def test_size_classes_waste_at_most_a_quarter():
    for nbytes in range(MIB + 1, 64 * MIB, 77_777):
        size = size_class(nbytes, MIB)
        assert nbytes <= size < nbytes * 1.25 + 1
        assert size % 4096 == 0


def tensor_of(nbytes: int, value: float = 1.0) -> torch.Tensor:
    return torch.full((nbytes // 4,), value)


def test_blocks_are_reused_by_size_class():
    with Loopback() as loop:
        for nbytes in (3 * MIB, 3 * MIB - 4096, 2 * MIB + 8192):  # one class: 3 MiB
            batch = loop.roundtrip(tensor_of(nbytes))
            del batch
            loop.deliver_releases()
        statistics = loop.worker.statistics()
        assert (statistics.blocks, statistics.reuse_misses, statistics.reuse_hits) == (1, 1, 2)


def test_budget_is_divided_among_workers():
    config = SharedMemoryConfig(budget_bytes=40 * MIB)
    with Loopback(config, num_workers=4) as loop:
        assert loop.worker.statistics().budget_bytes == 10 * MIB


def test_a_given_budget_is_its_own_reason():
    config = SharedMemoryConfig(budget_bytes=40 * MIB)
    assert config.effective_budget() == BudgetChoice(
        40 * MIB, f"SharedMemoryConfig(budget_bytes={40 * MIB})")
    assert config.effective_budget_bytes() == 40 * MIB


@pytest.mark.parametrize(
    ("memory", "expected", "reason"),
    [
        (MemoryLimit(2 << 30, "the memory cgroup's limit (/sys/fs/cgroup/memory/x/memory."
                              "limit_in_bytes)"),
         1 << 30, "half of the memory cgroup's limit of 2.0 GiB (/sys/fs/cgroup/memory/x/memory."
                  "limit_in_bytes), at most 8 GiB"),
        (MemoryLimit(24 << 30, "the machine's available memory (MemAvailable in /proc/meminfo)"),
         8 << 30, "half of the machine's available memory of 24.0 GiB (MemAvailable in "
                  "/proc/meminfo), at most 8 GiB"),
    ],
)
def test_default_budget_is_half_the_job_memory_at_most_8_gib(monkeypatch, memory, expected,
                                                              reason):
    import mploader.config

    monkeypatch.setattr(mploader.config, "job_memory", lambda: memory)
    assert SharedMemoryConfig().effective_budget() == BudgetChoice(expected, reason)
    assert SharedMemoryConfig().effective_budget_bytes() == expected


def test_default_budget_on_this_machine():
    """No more /dev/shm: half of what mploader.memory.job_memory() reads (MemAvailable moves
    between two reads, hence the slack)."""
    from mploader.memory import job_memory

    choice = SharedMemoryConfig().effective_budget()
    expected = min(job_memory().bytes // 2, 8 << 30)
    assert abs(choice.bytes - expected) <= 64 * MIB
    assert choice.reason.startswith("half of ") and choice.reason.endswith(", at most 8 GiB")


def test_over_budget_the_pool_grows_and_gives_the_excess_back():
    """Every block held by a batch: the worker never waits (the loader bounds what is in
    flight), it makes a block beyond the budget, warns once, and evicts the excess on release."""
    config = SharedMemoryConfig(budget_bytes=8 * MIB)
    with Loopback(config) as loop:
        first = loop.roundtrip(tensor_of(4 * MIB, 1.0))
        second = loop.roundtrip(tensor_of(4 * MIB, 2.0))
        with pytest.warns(RuntimeWarning, match="goes over budget"):
            third = loop.roundtrip(tensor_of(4 * MIB, 3.0))
        statistics = loop.worker.statistics()
        assert (statistics.blocks, statistics.bytes, statistics.spills) == (3, 12 * MIB, 1)
        assert torch.equal(third, tensor_of(4 * MIB, 3.0))
        assert torch.equal(second, tensor_of(4 * MIB, 2.0))
        del first, second, third
        loop.deliver_releases()
        assert loop.worker.statistics().bytes <= 12 * MIB
        assert loop.worker.statistics().blocks_in_use == 0


def test_free_blocks_of_another_class_are_evicted_to_make_room():
    config = SharedMemoryConfig(budget_bytes=8 * MIB)
    with Loopback(config) as loop:
        small = [loop.roundtrip(tensor_of(2 * MIB)) for _ in range(3)]  # 3 x 2 MiB
        del small
        loop.deliver_releases()
        big = loop.roundtrip(tensor_of(5 * MIB))  # 5 MiB class: two 2 MiB blocks must go
        statistics = loop.worker.statistics()
        assert statistics.evictions == 2 and statistics.bytes == 7 * MIB
        assert loop.main.statistics().mapped_blocks == 2  # main unmapped the retired ones
        assert torch.equal(big, tensor_of(5 * MIB))


def test_a_free_larger_block_is_used_when_over_budget():
    config = SharedMemoryConfig(budget_bytes=8 * MIB)
    with Loopback(config) as loop:
        big = loop.roundtrip(tensor_of(7 * MIB + MIB // 2))  # an 8 MiB block: all the budget
        del big
        loop.deliver_releases()
        small = loop.roundtrip(tensor_of(MIB // 2))
        statistics = loop.worker.statistics()
        assert (statistics.blocks, statistics.reuse_hits, statistics.evictions) == (1, 1, 0)
        del small


def test_a_batch_larger_than_the_worker_budget_is_a_clear_error():
    config = SharedMemoryConfig(budget_bytes=8 * MIB)
    with Loopback(config, num_workers=2) as loop:
        with pytest.raises(BatchTooLargeError) as caught:
            loop.worker.encode(tensor_of(5 * MIB))
        message = str(caught.value)
        assert "5242880 bytes" in message and "4194304 bytes" in message
        assert "budget_bytes" in message and "2 worker" in message
        assert caught.value.budget_reason == f"SharedMemoryConfig(budget_bytes={8 * MIB})"
        assert f"the budget (SharedMemoryConfig(budget_bytes={8 * MIB}))" in message
        assert isinstance(caught.value, ValueError)
        assert loop.worker.statistics().blocks == 0


def test_a_batch_that_fits_the_budget_but_not_its_size_class_gets_an_exact_block():
    with Loopback(SharedMemoryConfig(budget_bytes=7 * MIB + MIB // 2)) as loop:
        batch = loop.roundtrip(tensor_of(7 * MIB + MIB // 4))  # its class would be 8 MiB
        assert loop.worker.statistics().bytes == 7 * MIB + MIB // 4
        del batch


def test_too_little_memory_left_is_a_clear_error(monkeypatch):
    monkeypatch.setenv(AVAILABLE_BYTES_ENV, str(3 * MIB))
    with Loopback() as loop:
        with pytest.raises(SharedMemoryFullError) as caught:
            loop.worker.encode(tensor_of(4 * MIB))
        error = caught.value
        assert isinstance(error, RuntimeError) and isinstance(error, OSError)
        assert error.errno == errno.ENOMEM
        assert (error.needed_bytes, error.available_bytes) == (4 * MIB, 3 * MIB)
        message = str(error)
        for part in ("a block needs 4194304 bytes", "only 3145728 bytes", AVAILABLE_BYTES_ENV,
                     "budget_bytes", "fewer workers", "shared_memory=False",
                     "memory cgroup's limit"):
            assert part in message, part
        for stale in ("/dev/shm", "shm-size", "tmpfs", "mount -o"):
            assert stale not in message, stale
        assert loop.worker.statistics().blocks == 0  # nothing half-created
        assert blocks_of([os.getpid()]) == {}
        copy = pickle.loads(pickle.dumps(error))  # travels from worker to main intact
        assert str(copy) == message and copy.needed_bytes == 4 * MIB
        # small batches still work: inline leaves need no block
        assert torch.equal(loop.roundtrip(torch.ones(3)), torch.ones(3))


def test_resolve_shared_memory():
    assert resolve_shared_memory(True) == SharedMemoryConfig()
    assert resolve_shared_memory(False) is None
    config = SharedMemoryConfig(budget_bytes=MIB)
    assert resolve_shared_memory(config) is config
    with pytest.raises(TypeError, match="shared_memory must be True, False or"):
        resolve_shared_memory("yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        resolve_shared_memory(1)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kwargs",
    [{"budget_bytes": 0}, {"inline_threshold": -1}, {"min_block_bytes": 5000},
     {"min_block_bytes": 1024}],
)
def test_config_validation(kwargs):
    with pytest.raises(ValueError):
        SharedMemoryConfig(**kwargs)


def test_close_is_idempotent_and_lets_go_of_its_blocks():
    with Loopback() as loop:
        payload = loop.worker.encode(tensor_of(2 * MIB))
        assert len(blocks_of([os.getpid()])) == 1  # the worker's mapping; not yet the main's
        loop.worker.close()
        loop.worker.close()
        assert blocks_of([os.getpid()]) == {}  # its descriptor, queued for the main, is no fd
        with pytest.raises(RuntimeError, match="closed"):
            loop.worker.encode(1)
        del payload
    assert blocks_of([os.getpid()]) == {}


def test_the_main_process_maps_the_very_block_the_worker_sent():
    with Loopback() as loop:
        payload = loop.worker.encode(tensor_of(2 * MIB))
        (worker_block,) = blocks_of([os.getpid()])
        batch = loop.main.decode(0, payload)
        assert set(blocks_of([os.getpid()])) == {worker_block}  # one memory, two mappings
        assert len(_descriptors_of(worker_block)) == 1  # kept, to hand it to a later worker
        del batch


def _descriptors_of(inode: int) -> list[int]:
    """This process's descriptors of the file ``inode``."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.stat(f"/proc/self/fd/{fd}").st_ino == inode:
                found.append(int(fd))
        except OSError:
            continue  # the listing's own descriptor, closed meanwhile
    return found


def test_a_block_evicted_before_the_main_process_mapped_it_is_let_go():
    """A payload discarded unread leaves its block's descriptor queued in the passage; when the
    worker later evicts the block, the main process closes that descriptor (the memory goes),
    rather than holding it until the worker or the channel ends."""
    with Loopback(SharedMemoryConfig(budget_bytes=4 * MIB)) as loop:
        payload = loop.worker.encode(tensor_of(2 * MIB))
        (first,) = blocks_of([os.getpid()])
        loop.main.discard(0, payload)  # never mapped: the block goes back to the worker
        loop.deliver_releases()
        batch = loop.roundtrip(tensor_of(3 * MIB + MIB // 2))  # the 2 MiB block is evicted
        assert loop.worker.statistics().evictions == 1
        assert first not in blocks_of([os.getpid()])
        del batch
