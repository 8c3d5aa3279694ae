"""mploader: a from-scratch multi-process DataLoader iterator for PyTorch.

``mploader.DataLoader`` takes torch 2.13's arguments and yields torch's batches; underneath, its
own iterator moves batches through pooled shared memory, gives each worker its own database
session, and reports worker deaths by name and cause.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mploader._install import install, is_installed, uninstall
from mploader.errors import RemoteTraceback, WorkerDiedError, WorkerError
from mploader.loader import DataLoader
from mploader.worker.hooks import ProcessLocal, WorkerHooks, worker_session
from mploader.worker.info import WorkerInfo, get_worker_info

if TYPE_CHECKING:
    from mploader.shm import SharedMemoryConfig

__all__ = [
    "DataLoader",
    "ProcessLocal",
    "RemoteTraceback",
    "SharedMemoryConfig",
    "WorkerDiedError",
    "WorkerError",
    "WorkerHooks",
    "WorkerInfo",
    "get_worker_info",
    "install",
    "is_installed",
    "uninstall",
    "worker_session",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name == "SharedMemoryConfig":  # imported on demand: the channel is not needed to start
        from mploader.shm import SharedMemoryConfig

        return SharedMemoryConfig
    raise AttributeError(f"module 'mploader' has no attribute {name!r}")
