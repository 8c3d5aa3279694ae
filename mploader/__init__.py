"""mploader: a from-scratch multi-process DataLoader iterator for PyTorch.

``mploader.DataLoader`` takes the installed torch's arguments (2.6 to 2.14) and yields torch's
batches; underneath, its own iterator moves batches through pooled shared memory, gives each
worker its own database session, and reports worker deaths by name and cause.

The public face (importable from ``mploader``; the manual's "Layout and layers" page,
``docs/internals/layers.md``, draws the layers):

* ``loader``: ``mploader.DataLoader``, torch's constructor with mploader's iterator underneath.
* ``_install``: ``install()`` / ``uninstall()``, mploader's iterator in every torch DataLoader.
* ``__main__``: ``python -m mploader trace-summary`` and ``python -m mploader top``.

The layers, each a subpackage (imports run iterator -> process -> worker -> channel):

* ``iterator/``: the iterators a loader hands out, resume (``state_dict()``) and their logic.
* ``process/``: the worker processes as the main process sees them: start, watch, stop, zygote.
* ``worker/``: everything that runs inside a worker process: its loop, hooks, seeds, threads.
* ``channel/``: how a batch travels from a worker to the main process (pooled shared memory).
* ``monitor/``: counters, ``stats()`` snapshots, the trace and ``top``; every layer may call it.
* ``compat/``: the one seam to torch's and CPython's private, version-dependent API.
* ``integrations/``: external data sources for workers (NebulaGraph, PyTorch Geometric).

The leaves, which import nothing else of the package:

* ``config``: ``SharedMemoryConfig`` and the resolver of ``shared_memory=`` (it reads ``memory``).
* ``errors``: ``MploaderError`` and the worker errors that cross the process boundary.
* ``finalizers``: finalizers that queue their work for a thread that holds no lock.
* ``memory``: the memory the job may use and may still allocate (memory cgroup, ``/proc/meminfo``).
* ``polling``: the one way mploader waits on file descriptors and wakes a waiter.
"""

from __future__ import annotations

from mploader._install import install, is_installed, uninstall
from mploader.channel.shm.errors import (
    BatchTooLargeError,
    BlockVanishedError,
    SharedMemoryError,
    SharedMemoryFullError,
)
from mploader.config import SharedMemoryConfig
from mploader.errors import (
    MploaderError,
    PoisonTaskError,
    RemoteTraceback,
    WorkerDiedError,
    WorkerError,
    ZygoteError,
    ZygoteTimeoutError,
)
from mploader.loader import DataLoader
from mploader.monitor.events import WorkerState
from mploader.monitor.stats import LoaderStats, WorkerStats
from mploader.monitor.trace_summary import TraceError
from mploader.worker.hooks import ProcessLocal, WorkerHooks, worker_session
from mploader.worker.info import WorkerInfo, get_worker_info
from mploader.worker.item_random import item_generator

# The NebulaGraph integration's errors are part of the one family too; they are imported on first
# use, so that ``import mploader`` does not load the integration.
_NEBULA_ERRORS = ("NebulaAuthError", "NebulaConnectionError", "NebulaError", "NebulaQueryError",
                  "NebulaSessionLimitError", "NebulaSessionLostError")
# Likewise the PyG stores' refusals (their package needs torch_geometric).
_PYG_ERRORS = ("NodeIndexError", "SchemaConflictError", "StoreInputError", "UnknownNameError",
               "WriteDtypeError", "WriteShapeError")

__all__ = [
    "BatchTooLargeError",
    "BlockVanishedError",
    "DataLoader",
    "LoaderStats",
    "MploaderError",
    *_NEBULA_ERRORS,
    *_PYG_ERRORS,
    "PoisonTaskError",
    "ProcessLocal",
    "RemoteTraceback",
    "SharedMemoryConfig",
    "SharedMemoryError",
    "SharedMemoryFullError",
    "TraceError",
    "WorkerDiedError",
    "WorkerError",
    "WorkerHooks",
    "WorkerInfo",
    "WorkerState",
    "WorkerStats",
    "ZygoteError",
    "ZygoteTimeoutError",
    "get_worker_info",
    "install",
    "is_installed",
    "item_generator",
    "uninstall",
    "worker_session",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    if name in _NEBULA_ERRORS:
        from mploader.integrations.nebula import errors

        return getattr(errors, name)
    if name in _PYG_ERRORS:
        from mploader.integrations.nebula.pyg import errors as pyg_errors

        return getattr(pyg_errors, name)
    raise AttributeError(f"module 'mploader' has no attribute {name!r}")

