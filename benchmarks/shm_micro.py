"""Microbenchmarks of the shared-memory channel (not part of the test suite).

    .venv/bin/python benchmarks/shm_micro.py            # both parts
    .venv/bin/python benchmarks/shm_micro.py costs      # per-batch encode+decode, one process
    .venv/bin/python benchmarks/shm_micro.py crossover  # inline vs block, across a real pipe

``costs`` times ``collate_and_encode``/``encode`` in a WorkerChannel plus ``decode`` in a
MainChannel and the release back, for the benchmark workloads' batches, in one process.

``crossover`` runs a worker process and ping-pongs batches of one float32 tensor of each size
through a ``multiprocessing.Pipe``, once with every leaf inline and once with every leaf in a
block (releases ride back on the next request, as they would on the worker's control pipe), and
reports the round trip per batch. ``SharedMemoryConfig.inline_threshold`` is chosen from it.
"""

from __future__ import annotations

import gc
import multiprocessing
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from mploader.channel.shm import MainChannel, WorkerChannel
from mploader.config import SharedMemoryConfig

CROSSOVER_SIZES = [4 << 10, 16 << 10, 32 << 10, 64 << 10, 128 << 10, 256 << 10, 1 << 20]


def measure_costs() -> None:
    torch.set_num_threads(1)  # as in a worker
    workloads: list[tuple[str, Callable[[], Any], bool, int]] = [
        ("small_ints", lambda: [7], True, 20000),
        ("small_tensors", lambda: [torch.randn(10) for _ in range(64)], True, 20000),
        (
            "medium",
            lambda: [torch.randint(0, 255, (3, 224, 224), dtype=torch.uint8) for _ in range(32)],
            True,
            500,
        ),
        ("large (600 MB tensor)", lambda: torch.rand(250000, 602), False, 8),
        (
            "large_collate (1000 x 250x602)",
            lambda: list(torch.from_numpy(np.random.rand(250000, 602).astype(np.float32))
                         .split(250)),
            True,
            8,
        ),
    ]
    for name, make, collate, repeats in workloads:
        main = MainChannel(SharedMemoryConfig())
        worker = WorkerChannel(SharedMemoryConfig(), 0, 1, main.worker_link())
        data = make()
        timings = []
        for _ in range(repeats + 2):
            started = time.perf_counter()
            payload = worker.collate_and_encode(data) if collate else worker.encode(data)
            batch = main.decode(0, payload)
            del batch
            for release in main.take_releases():
                worker.release(release.block_id, release.generation)
            timings.append(time.perf_counter() - started)
        steady = timings[2:]  # the first batches create and map blocks
        print(
            f"{name:32s} median {statistics.median(steady) * 1e6:10.1f} us  "
            f"min {min(steady) * 1e6:10.1f} us  first {timings[0] * 1e3:8.1f} ms"
        )
        worker.close()
        main.close()
        del data
        gc.collect()


def _crossover_worker(connection: Any, link: Any, threshold: int, nbytes: int) -> None:
    torch.set_num_threads(1)
    config = SharedMemoryConfig(inline_threshold=threshold)
    with WorkerChannel(config, 0, 1, link) as worker:
        batch = torch.rand(nbytes // 4)
        while True:
            releases = connection.recv()
            if releases is None:
                return
            for block_id, generation in releases:
                worker.release(block_id, generation)
            connection.send_bytes(worker.encode(batch))


def _crossover_one(threshold: int, nbytes: int, rounds: int) -> float:
    context = multiprocessing.get_context("fork")
    ours, theirs = context.Pipe()
    config = SharedMemoryConfig(inline_threshold=threshold)
    main = MainChannel(config)
    process = context.Process(target=_crossover_worker,
                              args=(theirs, main.worker_link(), threshold, nbytes))
    process.start()
    with main:
        timings = []
        for _ in range(rounds):
            started = time.perf_counter()
            ours.send([(release.block_id, release.generation)
                       for release in main.take_releases()])
            batch = main.decode(0, ours.recv_bytes())
            float(batch[:: 1024].sum())  # touch every 4 KiB page once
            del batch
            timings.append(time.perf_counter() - started)
        ours.send(None)
    process.join()
    return statistics.median(timings[rounds // 10:])


def measure_crossover() -> None:
    print(f"{'leaf bytes':>10s} {'inline us':>10s} {'block us':>10s}")
    for nbytes in CROSSOVER_SIZES:
        inline = _crossover_one(nbytes + 1, nbytes, 2000)
        block = _crossover_one(0, nbytes, 2000)
        print(f"{nbytes:10d} {inline * 1e6:10.1f} {block * 1e6:10.1f}")


if __name__ == "__main__":
    parts = sys.argv[1:] or ["costs", "crossover"]
    if "costs" in parts:
        measure_costs()
    if "crossover" in parts:
        measure_crossover()
