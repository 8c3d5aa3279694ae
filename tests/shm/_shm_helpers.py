"""Helpers shared by the shared-memory tests, importable by spawned processes too."""

from __future__ import annotations

from typing import Any

from mploader.channel.shm import MainChannel, WorkerChannel
from mploader.config import SharedMemoryConfig


class Loopback:
    """A WorkerChannel and a MainChannel in one process, releases routed back by hand.

    ``pending`` holds the releases the main end queued (``take_releases``) and the test has not
    handed back yet; ``deliver_releases`` applies them to the worker end, as the worker loop
    would.  Retirements (a fork child may read the block) go to the worker at once.
    """

    def __init__(
        self,
        config: SharedMemoryConfig | None = None,
        num_workers: int = 1,
        worker_id: int = 0,
    ) -> None:
        self.config = SharedMemoryConfig() if config is None else config
        self._pending: list[tuple[int, int, int]] = []
        self.main = MainChannel(self.config)
        self.worker = WorkerChannel(self.config, worker_id, num_workers, self.main.worker_link())

    @property
    def pending(self) -> list[tuple[int, int, int]]:
        for worker_id, block_id, generation, retire in self.main.take_releases():
            if retire:
                self.worker.retire(block_id, generation)
            else:
                self._pending.append((worker_id, block_id, generation))
        return self._pending

    def deliver_releases(self) -> None:
        for _, block_id, generation in self.pending:
            self.worker.release(block_id, generation)
        self._pending.clear()

    def roundtrip(self, batch: Any) -> Any:
        return self.main.decode(0, self.worker.encode(batch))

    def collate(self, samples: list[Any]) -> Any:
        return self.main.decode(0, self.worker.collate_and_encode(samples))

    def close(self) -> None:
        self.worker.close()
        self.main.close()

    def __enter__(self) -> Loopback:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


# -- a minimal worker process, driven over a Pipe --------------------------------------------
#
# main -> worker: ("batch", kind, value, releases) | ("collate", value, releases) | ("stop",)
# worker -> main: payload bytes (send_bytes), or ("error", repr) for a failed encode


def make_batch(kind: str, value: int) -> Any:
    import numpy as np
    import torch

    if kind == "big":
        return {"x": torch.full((2_000_000,), float(value)), "label": value}
    if kind == "mixed":
        return [
            torch.tensor([value]),
            np.full((300, 300), value, dtype=np.int16),
            {"name": f"item{value}", "grid": torch.full((64, 10), float(value))},
        ]
    if kind == "soak":
        return torch.full((2_000_000,), float(value))  # 8 MB
    raise ValueError(kind)


def make_samples(value: int) -> list[Any]:
    import torch

    return [
        (torch.full((3, 64, 64), value + index, dtype=torch.uint8), value + index)
        for index in range(16)
    ]


def serve(connection: Any, config: SharedMemoryConfig, worker_id: int, link: Any) -> None:
    """The worker side of the cross-process tests."""
    import torch

    torch.set_num_threads(1)  # as torch's worker loop does; forked OpenMP pools would hang

    channel = WorkerChannel(config, worker_id, 1, link)
    try:
        while True:
            message = connection.recv()
            if message[0] == "stop":
                return
            for block_id, generation in message[-1]:
                channel.release(block_id, generation)
            if message[0] == "batch":
                payload = channel.encode(make_batch(message[1], message[2]))
            else:
                payload = channel.collate_and_encode(make_samples(message[1]))
            connection.send_bytes(payload)
    finally:
        channel.close()
