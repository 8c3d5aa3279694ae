"""Everything a worker needs to start, as one picklable object (not 14 positional arguments)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mploader.config import SharedMemoryConfig
from mploader.worker.fetch import FetchSettings
from mploader.worker.hooks import WorkerHooks
from mploader.worker.inherited import InheritedFds
from mploader.worker.resume import WorkerRestore
from mploader.worker.start_gate import GateEnds


@dataclass
class WorkerSpec:
    """Everything a worker process needs to start, in one picklable record."""

    worker_id: int
    num_workers: int
    fetch: FetchSettings  # the dataset, and how its samples become batches
    base_seed: int
    worker_init_fn: Callable[[int], None] | None
    hooks: WorkerHooks | None
    shared_memory: SharedMemoryConfig | None  # None: plain pickling
    channel_link: Any  # the main end's worker_link(): how blocks reach the main process
    parent_pid: int
    epoch: int
    # At most this many tasks of one worker are in flight (prefetch_factor x worker_threads).
    in_flight_per_worker: int
    # Under fork, the main-process ends of *other* workers' pipes are inherited too; the worker
    # closes them so that a pipe's EOF means what it says.
    inherited_fds_to_close: InheritedFds = ()
    record_state: bool = False  # send a WorkerSnapshot with each result (DataLoader.state_dict())
    restore: WorkerRestore | None = None  # a resumed or restarted worker's state to start from
    worker_threads: int = 1  # > 1: fetch on that many threads (mploader.worker.threads)
    # Forked by mploader's zygote: the parent process is the zygote, whose end is not the main
    # process's (the worker's watchdog then watches the main process only).
    parent_is_zygote: bool = False
    # An IterDataPipe's shared seed for the worker's first epoch (mploader.worker.datapipes).
    shared_seed: int | None = None
    # Forked with the rest of its group: the group's start gate, which the worker closes (and
    # waits on first, but for the first worker) before it starts (mploader.worker.start_gate).
    start_gate: GateEnds | None = None
    # Free shared-memory blocks an earlier worker of the loader filled, kept by the main process
    # for this one (mploader.channel.shm.handover.HandedBlock).
    handed_blocks: tuple[Any, ...] = ()
