"""The channel across real processes: fork, spawn and forkserver; killed workers."""

from __future__ import annotations

import multiprocessing
import os
import signal

import numpy as np
import psutil
import torch
from _shm_helpers import serve

from mploader.channel.shm import MainChannel
from mploader.config import SharedMemoryConfig
from tests.leaks import blocks_of, shm_entries


class RemoteWorker:
    """Drives ``serve`` in another process; collects releases and piggybacks them on requests."""

    def __init__(self, start_method: str, config: SharedMemoryConfig | None = None) -> None:
        self.config = config or SharedMemoryConfig()
        self.main = MainChannel(self.config)
        context = multiprocessing.get_context(start_method)
        self.connection, theirs = context.Pipe()
        self.process = context.Process(target=serve,
                                       args=(theirs, self.config, 0, self.main.worker_link()))
        self.process.start()
        theirs.close()

    def _take_releases(self) -> list[tuple[int, int]]:
        releases = self.main.take_releases()
        assert not any(release.retire for release in releases), "no child forked holding a batch"
        return [(release.block_id, release.generation) for release in releases]

    def request(self, kind: str, value: int) -> bytes:
        self.connection.send(("batch", kind, value, self._take_releases()))
        return self.connection.recv_bytes()

    def request_collated(self, value: int) -> bytes:
        self.connection.send(("collate", value, self._take_releases()))
        return self.connection.recv_bytes()

    def stop(self) -> None:
        if self.process.is_alive():
            self.connection.send(("stop",))
        self.process.join(30)
        self.main.close()


def test_roundtrip_across_processes(start_method):
    worker = RemoteWorker(start_method)
    try:
        kept = []
        for value in range(6):
            batch = worker.main.decode(0, worker.request("big", value))
            assert torch.equal(batch["x"], torch.full((2_000_000,), float(value)))
            if value % 3 == 0:
                kept.append((value, batch))
            mixed = worker.main.decode(0, worker.request("mixed", value))
            assert torch.equal(mixed[0], torch.tensor([value]))
            assert np.array_equal(mixed[1], np.full((300, 300), value, dtype=np.int16))
            assert mixed[2]["name"] == f"item{value}"
            collated = worker.main.decode(0, worker.request_collated(value))
            assert collated[0].shape == (16, 3, 64, 64) and collated[0].dtype == torch.uint8
            assert torch.equal(collated[1], torch.arange(value, value + 16))
            del batch, mixed, collated
        for value, batch in kept:
            assert torch.equal(batch["x"], torch.full((2_000_000,), float(value)))
        (statistics,) = worker.main.statistics().workers
        assert statistics.reuse_hits > 0 and statistics.worker_pid == worker.process.pid
        assert statistics.blocks <= 6  # 2 held, others lag one message behind their release
    finally:
        worker.stop()
    assert worker.process.exitcode == 0
    assert shm_entries() == set()  # blocks are memory files: never a name in /dev/shm


def test_killed_worker_is_forgotten_and_its_unmapped_blocks_let_go():
    worker = RemoteWorker("fork")
    try:
        batch = worker.main.decode(0, worker.request("big", 1))
        worker.request("big", 2)  # received, never decoded: its block's descriptor waits
        os.kill(worker.process.pid, signal.SIGKILL)
        worker.process.join(10)
        held_before = blocks_of([os.getpid()])
        worker.main.forget_worker(0, worker.process.pid)
        held_after = blocks_of([os.getpid()])
        assert torch.equal(batch["x"], torch.full((2_000_000,), 1.0))  # still readable
        assert worker.main.statistics().mapped_blocks == 0
        # The block of the batch kept lives on (its lease maps it), the one never decoded is
        # let go: its descriptor, queued in the passage, is closed.
        assert len(held_after) == 1 and set(held_after) <= set(held_before)
        del batch
        assert worker.main.take_releases() == []  # nobody to tell
    finally:
        worker.stop()
    assert blocks_of([os.getpid()]) == {}  # the kept block was spare for a replacement


def test_soak_keeps_descriptors_and_blocks_flat():
    worker = RemoteWorker("fork")
    me = psutil.Process()
    try:
        samples = []
        for cycle in range(200):
            batch = worker.main.decode(0, worker.request("soak", cycle))
            assert float(batch[::1024].sum()) == cycle * len(batch[::1024])  # touch every page
            del batch
            if cycle in (20, 199):
                samples.append((me.num_fds(), len(blocks_of([os.getpid(), worker.process.pid]))))
        assert samples[0] == samples[1]
        (statistics,) = worker.main.statistics().workers
        assert statistics.blocks <= 2 and statistics.reuse_hits >= 198
        assert worker.main.statistics().mapped_blocks <= 2
        assert worker.main.statistics().live_batches == 0
    finally:
        worker.stop()
