"""The result channel with ``shared_memory=False``: batches are pickled into the message."""

from __future__ import annotations

import io
import pickle
from collections.abc import Sequence
from typing import Any

from mploader.channel.collate import collate_samples
from mploader.channel.protocol import BlockRelease, ReadyPayload
from mploader.channel.tensors import by_value_dispatch_table


class PlainWorkerEnd:
    """A worker's end that pickles each batch into its message."""

    def encode(self, batch: Any) -> bytes:
        """The batch pickled by value; tensors torch's workers refuse to send are refused."""
        buffer = io.BytesIO()
        pickler = pickle.Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL)
        pickler.dispatch_table = by_value_dispatch_table()
        pickler.dump(batch)
        return buffer.getvalue()

    def collate_and_encode(self, samples: list[Any]) -> bytes:
        # torch's in-worker default_collate allocates a shared-memory segment per tensor, which
        # pickling would copy out again: stack into ordinary memory instead.
        return self.encode(collate_samples(samples, into_block=False))

    def start_encode(self, batch: Any) -> ReadyPayload:
        return ReadyPayload(self.encode(batch))

    def start_collate_and_encode(self, samples: list[Any]) -> ReadyPayload:
        return ReadyPayload(self.collate_and_encode(samples))

    def help_copy(self) -> None:
        pass  # nothing is ever copied on another thread

    def release(self, block_id: int, generation: int) -> None:
        raise AssertionError("plain pickling holds no shared-memory blocks")

    def retire(self, block_id: int, generation: int) -> None:
        raise AssertionError("plain pickling holds no shared-memory blocks")

    def statistics(self) -> None:
        return None

    def close(self) -> None:
        pass

    def abandon(self) -> None:
        pass


class PlainMainEnd:
    """The main process's end that unpickles each batch."""

    def decode(self, worker_id: int, payload: bytes) -> Any:
        return pickle.loads(payload)

    def discard(self, worker_id: int, payload: bytes) -> None:
        pass

    def forget_worker(
        self, worker_id: int, worker_pid: int | None, undelivered: Sequence[bytes] = ()
    ) -> None:
        pass

    def needs_sender(self, undelivered: Sequence[bytes]) -> bool:
        return False  # everything is pickled by value

    def worker_link(self) -> None:
        return None

    def handed_blocks(self, worker_id: int) -> tuple[Any, ...]:
        return ()

    def take_releases(self) -> list[BlockRelease]:
        return []

    def statistics(self) -> None:
        return None

    def close(self) -> None:
        pass
