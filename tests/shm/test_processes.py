"""The channel across real processes: fork, spawn and forkserver; killed workers and mains."""

from __future__ import annotations

import multiprocessing
import os
import signal

import numpy as np
import psutil
import torch
from _shm_helpers import names_of, own_block_then_wait, serve

from mploader.channel.shm import MainChannel, new_loader_tag, sweep_orphans
from mploader.channel.shm.names import list_names
from mploader.config import SharedMemoryConfig


class RemoteWorker:
    """Drives ``serve`` in another process; collects releases and piggybacks them on requests."""

    def __init__(self, start_method: str, config: SharedMemoryConfig | None = None) -> None:
        self.config = config or SharedMemoryConfig()
        self.tag = new_loader_tag()
        self.main = MainChannel(self.config, self.tag)
        context = multiprocessing.get_context(start_method)
        self.connection, theirs = context.Pipe()
        self.process = context.Process(target=serve, args=(theirs, self.config, 0, self.tag))
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
    assert names_of(worker.tag) == []


def test_killed_worker_is_forgotten_and_its_names_removed():
    worker = RemoteWorker("fork")
    try:
        batch = worker.main.decode(0, worker.request("big", 1))
        worker.request("big", 2)  # received, never decoded: its block's name is still linked
        assert len(names_of(worker.tag)) == 1
        os.kill(worker.process.pid, signal.SIGKILL)
        worker.process.join(10)
        worker.main.forget_worker(0, worker.process.pid)
        assert names_of(worker.tag) == []
        assert torch.equal(batch["x"], torch.full((2_000_000,), 1.0))  # still readable
        assert worker.main.statistics().mapped_blocks == 0
        del batch
        assert worker.main.take_releases() == []  # nobody to tell
    finally:
        worker.stop()


def test_killed_main_process_is_swept():
    context = multiprocessing.get_context("fork")
    ours, theirs = context.Pipe()
    process = context.Process(target=own_block_then_wait, args=(theirs, SharedMemoryConfig()))
    process.start()
    tag = ours.recv()
    assert len(names_of(tag)) == 1
    with MainChannel(SharedMemoryConfig(), new_loader_tag()):
        live = RemoteWorker("fork")  # a live loader of ours: the sweep must leave it alone
        try:
            live.request("big", 1)
            assert len(names_of(live.tag)) == 1
            os.kill(process.pid, signal.SIGKILL)
            process.join(10)
            assert sweep_orphans() >= 1
            assert names_of(tag) == []
            assert len(names_of(live.tag)) == 1
        finally:
            live.stop()


def test_soak_keeps_descriptors_and_dev_shm_flat():
    worker = RemoteWorker("fork")
    me = psutil.Process()
    try:
        samples = []
        for cycle in range(200):
            batch = worker.main.decode(0, worker.request("soak", cycle))
            assert float(batch[::1024].sum()) == cycle * len(batch[::1024])  # touch every page
            del batch
            if cycle in (20, 199):
                own = [name for name in list_names() if name.startswith(f"mploader-{worker.tag}-")]
                samples.append((me.num_fds(), len(own)))  # not a concurrent test run's names
        assert samples[0] == samples[1]
        (statistics,) = worker.main.statistics().workers
        assert statistics.blocks <= 2 and statistics.reuse_hits >= 198
        assert worker.main.statistics().mapped_blocks <= 2
        assert worker.main.statistics().live_batches == 0
    finally:
        worker.stop()
