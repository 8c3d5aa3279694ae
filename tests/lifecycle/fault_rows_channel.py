"""Fault rows of the shared-memory channel: restarts, other users, pid namespaces, the budget,
fork children, a killed main process.  Joined into ``FAULT_TABLE`` by ``test_faults.py``."""

from __future__ import annotations

import tempfile

import mploader
from mploader.config import SharedMemoryConfig

from .channel_faulty import MiB, SlowAndKilled
from .fault_row import FaultRow


def _restart_keeps_the_epoch(start_method: str) -> None:
    """Worker 1 is SIGKILLed twice while its finished batches wait in the task table behind a slow
    item of worker 0 (once before any of its blocks was mapped, once when they are all mapped and
    reused): every batch comes, once, in order, intact."""
    with tempfile.TemporaryDirectory() as markers:
        dataset = SlowAndKilled(markers, length=16, slow=(0, 8), kill=(3, 11), sleep=0.6)
        loader = mploader.DataLoader(
            dataset, batch_size=None, num_workers=2, multiprocessing_context=start_method,
            max_worker_restarts=3, shared_memory=SharedMemoryConfig(budget_bytes=64 * MiB),
        )
        iterator = iter(loader)
        got = []
        for batch in iterator:
            value = int(batch[0])
            assert bool((batch == value).all()), f"batch {value} is not intact"
            got.append(value)
        assert got == list(range(16))
        assert iterator.stats().restarts == 2


CHANNEL_FAULTS: list[FaultRow] = [
    FaultRow("restart_keeps_finished_batches", _restart_keeps_the_epoch),
]
