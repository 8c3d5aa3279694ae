"""The result channel with ``shared_memory=False``: batches are pickled into the message.

Same interface as ``mploader.shm.WorkerChannel`` / ``MainChannel`` so the iterator and the worker
loop do not care which one they hold.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

from mploader.worker.fetch import plain_default_collate

WaitForRelease = Callable[[float], list[tuple[int, int]]]


class PlainWorkerChannel:
    def encode(self, batch: Any, wait_for_release: WaitForRelease) -> bytes:
        return pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL)

    def collate_and_encode(self, samples: list[Any], wait_for_release: WaitForRelease) -> bytes:
        return self.encode(plain_default_collate(samples), wait_for_release)

    def release(self, block_id: int, generation: int) -> None:
        raise AssertionError("plain pickling holds no shared-memory blocks")

    def statistics(self) -> None:
        return None

    def close(self) -> None:
        pass


class PlainMainChannel:
    def decode(self, worker_id: int, payload: bytes) -> Any:
        return pickle.loads(payload)

    def discard(self, worker_id: int, payload: bytes) -> None:
        pass

    def forget_worker(self, worker_id: int, worker_pid: int | None) -> None:
        pass

    def statistics(self) -> None:
        return None

    def close(self) -> None:
        pass


def make_worker_channel(config: Any, worker_id: int, num_workers: int, loader_tag: str) -> Any:
    if config is None:
        return PlainWorkerChannel()
    from mploader.shm import WorkerChannel

    return WorkerChannel(config, worker_id, num_workers, loader_tag)


def make_main_channel(
    config: Any, loader_tag: str, on_release: Callable[[int, int, int], None]
) -> Any:
    if config is None:
        return PlainMainChannel()
    from mploader.shm import MainChannel

    return MainChannel(config, loader_tag, on_release)
