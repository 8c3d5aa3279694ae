"""Helpers shared by the shared-memory tests, importable by spawned processes too."""

from __future__ import annotations

from typing import Any

from mploader.channel.shm import MainChannel, WorkerChannel, new_loader_tag
from mploader.channel.shm.liveness import lock_name
from mploader.channel.shm.names import list_names
from mploader.config import SharedMemoryConfig


def names_of(loader_tag: str) -> list[str]:
    """The loader's block names (its lock file, ``mploader-<tag>-lock``, is not a block)."""
    return [name for name in list_names()
            if name.startswith(f"mploader-{loader_tag}-") and name != lock_name(loader_tag)]


class Loopback:
    """A WorkerChannel and a MainChannel in one process, releases routed back by hand.

    ``pending`` collects what ``on_release`` reported; ``wait_for_release`` hands them to the
    worker the way the worker loop would, and ``deliver_releases`` applies them directly.
    """

    def __init__(
        self,
        config: SharedMemoryConfig | None = None,
        num_workers: int = 1,
        worker_id: int = 0,
    ) -> None:
        self.config = SharedMemoryConfig() if config is None else config
        self.tag = new_loader_tag()
        self.pending: list[tuple[int, int, int]] = []
        self.worker = WorkerChannel(self.config, worker_id, num_workers, self.tag)
        self.main = MainChannel(self.config, self.tag, self._on_release)
        self.wait_calls: list[float] = []

    def _on_release(self, worker_id: int, block_id: int, generation: int,
                    retire: bool = False) -> None:
        if retire:  # a fork child may read it: the worker drops it at once
            self.worker.retire(block_id, generation)
            return
        self.pending.append((worker_id, block_id, generation))

    def wait_for_release(self, timeout: float) -> list[tuple[int, int]]:
        self.wait_calls.append(timeout)
        if not self.pending:  # one process: nothing else could release a block
            raise RuntimeError("the worker would wait forever for a block release")
        released = [(block_id, generation) for _, block_id, generation in self.pending]
        self.pending.clear()
        return released

    def deliver_releases(self) -> None:
        for _, block_id, generation in self.pending:
            self.worker.release(block_id, generation)
        self.pending.clear()

    def roundtrip(self, batch: Any) -> Any:
        return self.main.decode(0, self.worker.encode(batch, self.wait_for_release))

    def collate(self, samples: list[Any]) -> Any:
        return self.main.decode(0, self.worker.collate_and_encode(samples, self.wait_for_release))

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


def serve(connection: Any, config: SharedMemoryConfig, worker_id: int, tag: str) -> None:
    """The worker side of the cross-process tests."""
    import torch

    torch.set_num_threads(1)  # as torch's worker loop does; forked OpenMP pools would hang

    def wait_for_release(timeout: float) -> list[tuple[int, int]]:
        if not connection.poll(timeout):
            return []
        message = connection.recv()
        assert message[0] == "release", message
        return message[1]

    channel = WorkerChannel(config, worker_id, 1, tag)
    try:
        while True:
            message = connection.recv()
            if message[0] == "stop":
                return
            for block_id, generation in message[-1]:
                channel.release(block_id, generation)
            if message[0] == "batch":
                payload = channel.encode(make_batch(message[1], message[2]), wait_for_release)
            else:
                payload = channel.collate_and_encode(make_samples(message[1]), wait_for_release)
            connection.send_bytes(payload)
    finally:
        channel.close()


def own_block_then_wait(connection: Any, config: SharedMemoryConfig) -> None:
    """Play a main process (and its worker) that creates one unseen block, then waits to be
    SIGKILLed: its tag carries its own pid."""
    import torch

    torch.set_num_threads(1)
    tag = new_loader_tag()
    main = MainChannel(config, tag, lambda *release: None)  # holds the loader's lock  # noqa: F841
    channel = WorkerChannel(config, 0, 1, tag)
    channel.encode(make_batch("big", 1), lambda timeout: [])
    connection.send(tag)
    connection.recv()  # never answered: the test kills us here
