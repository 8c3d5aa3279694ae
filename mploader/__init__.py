"""mploader: a from-scratch multi-process DataLoader iterator for PyTorch.

``mploader.DataLoader`` takes torch 2.13's arguments and yields torch's batches; underneath, its
own iterator moves batches through pooled shared memory, gives each worker its own database
session, and reports worker deaths by name and cause.
"""

from __future__ import annotations

from mploader._install import install, is_installed, uninstall
from mploader.config import SharedMemoryConfig
from mploader.errors import RemoteTraceback, WorkerDiedError, WorkerError, ZygoteError
from mploader.loader import DataLoader
from mploader.monitor.events import WorkerState
from mploader.monitor.stats import LoaderStats, WorkerStats
from mploader.worker.hooks import ProcessLocal, WorkerHooks, worker_session
from mploader.worker.info import WorkerInfo, get_worker_info
from mploader.worker.item_random import item_generator

__all__ = [
    "DataLoader",
    "LoaderStats",
    "ProcessLocal",
    "RemoteTraceback",
    "SharedMemoryConfig",
    "WorkerDiedError",
    "WorkerError",
    "WorkerHooks",
    "WorkerInfo",
    "WorkerState",
    "WorkerStats",
    "ZygoteError",
    "get_worker_info",
    "install",
    "is_installed",
    "item_generator",
    "uninstall",
    "worker_session",
]
__version__ = "0.1.0"

