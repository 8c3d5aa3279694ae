"""torch.utils.data.DataLoader versus mploader.DataLoader, side by side in one run.

    .venv/bin/python benchmarks/versus.py                          # every workload (~4 min)
    .venv/bin/python benchmarks/versus.py --only large,medium      # some of them
    .venv/bin/python benchmarks/versus.py --repeats 9              # more repetitions
    .venv/bin/python benchmarks/versus.py --quick                  # ~1 min smoke run
    .venv/bin/python benchmarks/versus.py --json out.json          # also save the figures
    .venv/bin/python benchmarks/versus.py --only container         # in a 64 MiB /dev/shm (root)

The workloads, torch's figures on the project's 2-core machines and the target ratios are those of
the benchmark plan (``/work/shared/BENCHMARKS.md``). Every workload runs torch (A) and mploader (B)
alternately, A B A B, and the table reports the median of the repetitions and the ratio of the
medians, torch / mploader (> 1 means mploader is faster).

How it measures, the same for both loaders:

* Throughput workloads (ms/batch): each repetition builds a fresh loader (non-persistent workers,
  torch's default) with the ``fork`` start method. The first ``warm`` batches of the epoch are
  received and checked but not timed: they pay for worker start, torch's first segments and
  mploader's pool growth. The clock starts once the ``warm``-th batch has been checked and stops
  once the last batch has been checked; the figure is that time over the number of timed batches.
  The end of the epoch (worker shutdown) is outside the clock, and so is collecting statistics.
* Epoch workloads (ms/batch): one loader for the whole repetition, one untimed epoch, then
  ``TIMED_EPOCHS`` epochs timed whole (``iter()``, every batch, the end of the epoch: with
  non-persistent workers, torch's default, a new generation of workers each epoch).  Page faults
  count every process of the timed epochs, the workers of each epoch included.
* Window workloads (ms per epoch): the consumer keeps the last ``keep`` batches (a sliding
  window, as a model comparing recent batches would), with a shared-memory budget smaller than
  the window for mploader; the clock covers ``iter()`` up to the last batch. Each batch is checked
  on arrival and again as it leaves the window (it must have stayed intact while kept).
* Startup workloads (ms): the loader is built outside the clock; the clock covers ``iter()`` up to
  the first batch (worker start included) and stops when that batch has been checked; the iterator
  is shut down between repetitions, outside the clock. The constructor is timed separately and the
  first (cold) repetition is reported too: helpers kept for the whole process (mploader's spawn
  zygote) make later repetitions warm.
* The container workload (ms/batch): large_collate as above (1 worker, ``fork``, 600 MB batches
  collated from 1,000 views), but each repetition runs in a subprocess in a mount namespace of
  its own (``unshare --mount``) with a 64 MiB tmpfs on ``/dev/shm``, Docker's and Kubernetes'
  default, both loaders with their default settings.  A loader that fails there (torch: no space
  left on device; mploader before its blocks were anonymous memory files: ``BatchTooLargeError``)
  has its exception's first line (and, for an exception re-raised from a worker, the original
  one) as its result instead of a figure, and is not run again.  The subprocess also samples
  ``/dev/shm``'s used bytes every 10 ms, reported as each loader's peak.  Skipped, with the
  reason, where the namespace cannot be made (it needs root and ``unshare(1)``).
* Every batch is checked against values derived from the indices (items are deterministic) and
  every 4 KiB page of every received array is read once in the main process (one element per page
  through a strided view, summed in float64: this is also the checksum), so lazy mapping is paid
  for. No batch is held past its step: the loop drops it before asking for the next one, so
  mploader's pool can recycle its block.

Also reported: what mploader's channel did (shared-memory blocks or plain pickling), mploader
blocks this process still maps or holds once a workload's loaders are gone (and any ``mploader``
entry in ``/dev/shm``), the main process's open fds and RSS. A repetition
that takes longer than ``--hang-timeout`` seconds is declared hung: every thread's traceback goes
to stderr, the partial table is printed and the process exits with status 2 (1 after an error,
a failed check or a leftover; 0 otherwise).

Absolute times on shared machines drift by 10-20% between runs; the ratios are the figures.
Not part of the test suite.
"""

from __future__ import annotations

import argparse
import faulthandler
import gc
import json
import os
import platform
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.utils.data

# mploader is imported in main(), not here: spawned workers re-import this module, and torch's
# spawned workers should not pay for importing mploader.

PAGE = 4096
LARGE_ROWS, LARGE_COLS = 250_000, 602  # 250000 x 602 float32 = 602 MB
ROWS_PER_ITEM = 250  # large_collate: 1000 items of 250 x 602 make one batch
ITEMS_PER_LARGE_BATCH = LARGE_ROWS // ROWS_PER_ITEM
IMAGE_SHAPE = (3, 224, 224)
IMAGE_BYTES = 3 * 224 * 224
MEDIUM_BATCH = 32
SMALL_TENSOR_BATCH = 64
DEFAULT_REPEATS = 5
QUICK_REPEATS = 3
IO_SLEEP_SECONDS = 0.020
TIMED_EPOCHS = 2  # epoch workloads: timed epochs after the untimed first
LEFTOVER_SETTLE_SECONDS = 5.0  # mploader's shutdown deadline for its workers


# -- datasets (module level so that they pickle for spawn) ----------------------------------------


class FreshLargeArrays(torch.utils.data.Dataset):
    """large: item ``i`` is a freshly allocated 250000 x 602 float32 array.

    Column 0 holds the row number, every other element ``i + 1``.
    """

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> np.ndarray:
        array = np.full((LARGE_ROWS, LARGE_COLS), index + 1, dtype=np.float32)
        array[:, 0] = np.arange(LARGE_ROWS, dtype=np.float32)
        return array


def make_collate_base(batches: int) -> np.ndarray:
    """The preallocated array large_collate's items are views of.

    Row ``r`` holds ``r`` in column 0 and ``r % 7 + 1`` elsewhere. Batch ``b`` is rows
    ``b .. b + 249999`` (items are shifted by the batch number so that batches differ).
    """
    rows = LARGE_ROWS + batches
    base = np.empty((rows, LARGE_COLS), dtype=np.float32)
    row_numbers = np.arange(rows, dtype=np.float32)
    base[:, 1:] = (np.arange(rows) % 7 + 1).astype(np.float32)[:, None]
    base[:, 0] = row_numbers
    return base


class SlicesOfOneArray(torch.utils.data.Dataset):
    """large_collate: item ``i`` is a 250 x 602 view (a slice) of one preallocated array."""

    def __init__(self, base: np.ndarray, batches: int) -> None:
        self.base = base
        self.length = batches * ITEMS_PER_LARGE_BATCH

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> np.ndarray:
        batch, position = divmod(index, ITEMS_PER_LARGE_BATCH)
        start = position * ROWS_PER_ITEM + batch
        return self.base[start : start + ROWS_PER_ITEM]


def image_value(index: Any) -> Any:
    return (index * 37 + 11) % 251


class Images(torch.utils.data.Dataset):
    """medium: item ``i`` is a fresh uint8 3x224x224 tensor filled with ``image_value(i)``."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.full(IMAGE_SHAPE, image_value(index), dtype=torch.uint8)


class Ints(torch.utils.data.Dataset):
    """small_ints and the startup workloads: item ``i`` is the int ``i``."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> int:
        return index


class SmallTensors(torch.utils.data.Dataset):
    """small_tensors: item ``i`` is a fresh float32 tensor of 10 elements, all ``i``."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.full((10,), float(index), dtype=torch.float32)


class FilledFloats(torch.utils.data.Dataset):
    """sliding_window: item ``i`` is a fresh float32 tensor of 1 MiB, all ``i``."""

    NUMEL = (1 << 20) // 4

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.full((self.NUMEL,), float(index))


class SlowInts(torch.utils.data.Dataset):
    """io_bound: item ``i`` is ``i`` after 20 ms of sleep (a remote query)."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> int:
        time.sleep(IO_SLEEP_SECONDS)
        return index


# -- checks -------------------------------------------------------------------------------------


def page_positions(numel: int, itemsize: int) -> np.ndarray:
    """Flat positions of one element per 4 KiB page of a contiguous array."""
    return np.arange(0, numel, PAGE // itemsize, dtype=np.int64)


def touch_pages(tensor: torch.Tensor) -> float:
    """Read one element of every 4 KiB page; their float64 sum is the batch's checksum."""
    flat = tensor.numpy().reshape(-1)  # a view: the caller checked contiguity
    return float(flat[:: PAGE // flat.itemsize].sum(dtype=np.float64))


def sum_all(tensor: torch.Tensor) -> float:
    """Small batches: the float64 sum of every element (touches their only page or two)."""
    return float(tensor.numpy().sum(dtype=np.float64))


@dataclass(frozen=True)
class Expected:
    shape: tuple[int, ...]
    dtype: torch.dtype
    checksum: float


class BatchMismatch(AssertionError):
    pass


def verify(batch: Any, expected: Expected, checksum: Callable[[torch.Tensor], float],
           where: str) -> None:
    if type(batch) is not torch.Tensor:
        raise BatchMismatch(f"{where}: expected a torch.Tensor, got {type(batch).__name__}")
    if tuple(batch.shape) != expected.shape or batch.dtype != expected.dtype:
        raise BatchMismatch(
            f"{where}: expected {expected.shape} {expected.dtype}, "
            f"got {tuple(batch.shape)} {batch.dtype}"
        )
    if not batch.is_contiguous():
        raise BatchMismatch(f"{where}: batch is not contiguous (strides {batch.stride()})")
    got = checksum(batch)
    if got != expected.checksum:
        raise BatchMismatch(f"{where}: checksum {got!r}, expected {expected.checksum!r}")


# -- workloads ----------------------------------------------------------------------------------


@dataclass
class Workload:
    name: str
    kind: str  # "throughput", "epochs", "container" (ms/batch), "window" (ms/epoch), "startup" (ms)
    what: str
    torch_reference: str  # torch's figure in the plan
    target: float
    stretch: float
    make_dataset: Callable[[int], torch.utils.data.Dataset]  # batches -> dataset
    loader_kwargs: dict[str, Any]
    expected: Callable[[int], Expected]  # batch number -> what it must be
    checksum: Callable[[torch.Tensor], float]
    batches: int  # per repetition (startup: dataset length in batches)
    warm: int  # batches received but not timed (throughput)
    repeat_factor: int = 1  # cheap workloads run more repetitions
    cleanup: Callable[[], None] = field(default=lambda: None)
    mploader_kwargs: dict[str, Any] = field(default_factory=dict)  # mploader's own arguments
    keep: int = 0  # window: how many recent batches the consumer keeps
    # the target also asks mploader to take at most this many 602 MB memcpys a batch
    memcpy_bound: float | None = None
    child_args: tuple[str, ...] = ()  # container: the arguments of its subprocess
    # mploader's side is torch's own DataLoader, iterated under mploader.install() (Lightning,
    # PyG), instead of mploader.DataLoader
    via_install: bool = False

    @property
    def unit(self) -> str:
        return {"throughput": "ms/batch", "epochs": "ms/batch", "container": "ms/batch",
                "window": "ms/epoch"}.get(self.kind, "ms")


def _large_expected() -> Callable[[int], Expected]:
    positions = page_positions(LARGE_ROWS * LARGE_COLS, 4)
    rows, cols = np.divmod(positions, LARGE_COLS)
    column0 = cols == 0
    sum_rows0 = float(rows[column0].sum())
    others = int((~column0).sum())

    def expected(batch: int) -> Expected:
        return Expected((LARGE_ROWS, LARGE_COLS), torch.float32,
                        sum_rows0 + float(batch + 1) * others)

    return expected


def _large_collate_expected() -> Callable[[int], Expected]:
    positions = page_positions(LARGE_ROWS * LARGE_COLS, 4)
    rows, cols = np.divmod(positions, LARGE_COLS)
    column0 = cols == 0

    def expected(batch: int) -> Expected:
        base_rows = rows + batch
        values = np.where(column0, base_rows, base_rows % 7 + 1)
        return Expected((ITEMS_PER_LARGE_BATCH, ROWS_PER_ITEM, LARGE_COLS), torch.float32,
                        float(values.sum(dtype=np.float64)))

    return expected


def _medium_expected() -> Callable[[int], Expected]:
    positions = page_positions(MEDIUM_BATCH * IMAGE_BYTES, 1)
    image_of_position = positions // IMAGE_BYTES

    def expected(batch: int) -> Expected:
        values = image_value(batch * MEDIUM_BATCH + image_of_position)
        return Expected((MEDIUM_BATCH, *IMAGE_SHAPE), torch.uint8,
                        float(values.sum(dtype=np.float64)))

    return expected


def _filled_floats_expected(batch: int) -> Expected:
    numel = FilledFloats.NUMEL
    return Expected((numel,), torch.float32, float(batch) * len(page_positions(numel, 4)))


def _ints_expected(batch: int) -> Expected:
    return Expected((1,), torch.int64, float(batch))


def _small_tensors_expected(batch: int) -> Expected:
    first = batch * SMALL_TENSOR_BATCH
    total = sum(range(first, first + SMALL_TENSOR_BATCH)) * 10
    return Expected((SMALL_TENSOR_BATCH, 10), torch.float32, float(total))


class _CollateBase:
    """large_collate's preallocated array: made on first use, dropped after the workload."""

    def __init__(self) -> None:
        self.array: np.ndarray | None = None

    def dataset(self, batches: int) -> torch.utils.data.Dataset:
        if self.array is None or self.array.shape[0] != LARGE_ROWS + batches:
            self.array = None
            self.array = make_collate_base(batches)
        return SlicesOfOneArray(self.array, batches)

    def drop(self) -> None:
        self.array = None


def build_workloads(quick: bool) -> list[Workload]:
    def sizes(normal: tuple[int, int], smoke: tuple[int, int]) -> tuple[int, int]:
        return smoke if quick else normal

    collate_base = _CollateBase()
    fork = {"multiprocessing_context": "fork"}
    workloads = []

    # Warm-up for the 600 MB workloads covers mploader's pool warm-up: with 1 worker and
    # prefetch_factor 2 the pool makes one or two 640 MiB blocks (a third with persistent collate
    # rows), each about 164k fresh pages in the worker once.  torch pays that kind of cost on every
    # batch, so it is warm from the first.  Six batches are timed either way.
    batches, warm = sizes((10, 4), (6, 4))
    workloads.append(Workload(
        "large", "throughput",
        "batch_size=None, 1 worker, fresh 250000x602 float32 numpy array (602 MB)",
        "285 ms/batch", 3.0, 6.0,
        FreshLargeArrays, {"batch_size": None, "num_workers": 1, **fork},
        _large_expected(), touch_pages, batches, warm,
    ))
    workloads.append(Workload(
        "large_collate", "throughput",
        "1 worker, batch_size=1000 of 250x602 float32 views, default collate (602 MB)",
        "320 ms/batch", 5.0, 8.0,
        collate_base.dataset,
        {"batch_size": ITEMS_PER_LARGE_BATCH, "num_workers": 1, **fork},
        _large_collate_expected(), touch_pages, batches, warm, cleanup=collate_base.drop,
        memcpy_bound=1.2,
    ))
    # The same two with persistent workers: one untimed epoch (the pool grows to what the loop
    # holds), then a whole epoch timed, epoch boundary included: the steady state of training.
    persistent = {"persistent_workers": True}
    workloads.append(Workload(
        "large_persistent", "throughput", "large with persistent_workers=True, second epoch",
        "285 ms/batch", 3.0, 6.0,
        FreshLargeArrays, {"batch_size": None, "num_workers": 1, **fork, **persistent},
        _large_expected(), touch_pages, batches, 0,
    ))
    workloads.append(Workload(
        "large_collate_persistent", "throughput",
        "large_collate with persistent_workers=True, second epoch",
        "320 ms/batch", 5.0, 8.0,
        collate_base.dataset,
        {"batch_size": ITEMS_PER_LARGE_BATCH, "num_workers": 1, **fork, **persistent},
        _large_collate_expected(), touch_pages, batches, 0, cleanup=collate_base.drop,
        memcpy_bound=1.2,
    ))
    # Short epochs of big batches with torch's default non-persistent workers: every epoch a new
    # generation of workers (mploader hands them the blocks the previous one filled), and the
    # same with persistent workers, the figure the first should come within 1.15x of.
    batches = 8 if not quick else 4
    for persistence in (False, True):
        workloads.append(Workload(
            "large_epochs" + ("_persistent" if persistence else ""), "epochs",
            f"large in epochs of {batches} batches, persistent_workers={persistence}, "
            f"epochs 2-{TIMED_EPOCHS + 1} timed whole",
            "-", 1.0, 2.0,
            FreshLargeArrays, {"batch_size": None, "num_workers": 1, **fork,
                               "persistent_workers": persistence},
            _large_expected(), touch_pages, batches, 0,
        ))
    # large_epochs through mploader.install(): torch's own DataLoader gets the same handover of
    # blocks from one generation of workers to the next.
    workloads.append(Workload(
        "large_epochs_install", "epochs",
        "large_epochs with torch's DataLoader under mploader.install() on mploader's side",
        "-", 1.0, 2.0,
        FreshLargeArrays, {"batch_size": None, "num_workers": 1, **fork},
        _large_expected(), touch_pages, batches, 0, via_install=True,
    ))
    batches, warm = sizes((330, 30), (100, 20))
    workloads.append(Workload(
        "medium", "throughput", "2 workers, 32 uint8 images 3x224x224 (4.8 MB)",
        "2.5 ms/batch", 8.0, 13.0,
        lambda n: Images(n * MEDIUM_BATCH),
        {"batch_size": MEDIUM_BATCH, "num_workers": 2, **fork},
        _medium_expected(), touch_pages, batches, warm,
    ))
    batches, warm = sizes((2200, 200), (600, 100))
    workloads.append(Workload(
        "small_ints", "throughput", "2 workers, batch_size=1, int items",
        "0.735 ms/batch", 10.0, 15.0,
        Ints, {"batch_size": 1, "num_workers": 2, **fork},
        _ints_expected, sum_all, batches, warm,
    ))
    batches, warm = sizes((2200, 200), (600, 100))
    workloads.append(Workload(
        "small_tensors", "throughput", "2 workers, batch_size=64, 10-float tensors",
        "0.487 ms/batch", 4.0, 6.0,
        lambda n: SmallTensors(n * SMALL_TENSOR_BATCH),
        {"batch_size": SMALL_TENSOR_BATCH, "num_workers": 2, **fork},
        _small_tensors_expected, sum_all, batches, warm,
    ))
    batches, warm = sizes((440, 40), (160, 40))
    workloads.append(Workload(
        "io_bound", "throughput", "8 workers, batch_size=1, each item sleeps 20 ms",
        "2.5 ms/batch", 0.97, 1.0,
        SlowInts, {"batch_size": 1, "num_workers": 8, **fork},
        _ints_expected, sum_all, batches, warm,
    ))
    from mploader import SharedMemoryConfig  # see the note at the imports

    workloads.append(Workload(
        "sliding_window", "window",
        "2 workers, 60 batches of 1 MiB, the consumer keeps the last 8; mploader budget 4 MiB",
        "0.18 s/epoch", 0.5, 1.0,
        FilledFloats, {"batch_size": None, "num_workers": 2, **fork},
        _filled_floats_expected, touch_pages, 60, 0, repeat_factor=2,
        mploader_kwargs={"shared_memory": SharedMemoryConfig(budget_bytes=4 << 20)}, keep=8,
    ))
    workloads.append(Workload(
        "startup_fork8", "startup", "iter() to first batch, fork, 8 workers",
        "~70 ms", 1.3, 2.0,
        Ints, {"batch_size": 1, "num_workers": 8, **fork},
        _ints_expected, sum_all, 64, 0, repeat_factor=2,
    ))
    workloads.append(Workload(
        "startup_spawn4", "startup", "iter() to first batch, spawn, 4 workers",
        "~1.7 s", 2.0, 3.0,
        Ints, {"batch_size": 1, "num_workers": 4, "multiprocessing_context": "spawn"},
        _ints_expected, sum_all, 64, 0,
    ))
    # large_collate in a container's /dev/shm: each repetition runs in a subprocess with a private
    # 64 MiB tmpfs there (run_container), which runs large_collate's own row (container_child).
    batches, warm = sizes((10, 4), (6, 4))
    workloads.append(Workload(
        "container", "container",
        "large_collate in a 64 MiB /dev/shm (Docker's default; a mount namespace, needs root)",
        "fails (no space)", 5.0, 8.0,
        lambda n: Ints(0),  # a placeholder: the subprocess makes large_collate's dataset
        {"batch_size": ITEMS_PER_LARGE_BATCH, "num_workers": 1, **fork},
        _large_collate_expected(), touch_pages, batches, warm,
        child_args=("--quick",) if quick else (),
    ))
    return workloads


# -- one repetition -----------------------------------------------------------------------------


def shut_down(iterator: Any) -> None:
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()


def channel_summary(iterator: Any) -> dict[str, Any] | None:
    """mploader only: what its result channel did (None for torch's iterator)."""
    stats = getattr(iterator, "stats", None)
    if stats is None:
        return None
    try:
        channel = stats().channel
    except Exception as error:  # report, do not fail the benchmark on it
        return {"kind": "unknown", "error": repr(error)}
    if channel is None:
        return {"kind": "pickle"}
    pools = channel.workers
    return {
        "kind": "shm",
        "shm_leaves": sum(pool.shm_leaves for pool in pools),
        "inline_leaves": sum(pool.inline_leaves for pool in pools),
        "reuse_hits": sum(pool.reuse_hits for pool in pools),
        "reuse_misses": sum(pool.reuse_misses for pool in pools),
        "pool_bytes": sum(pool.bytes for pool in pools),
        "blocks": sum(pool.blocks for pool in pools),
        "evictions": sum(pool.evictions for pool in pools),
        "beyond_budget": sum(pool.spills for pool in pools),
        "held": channel.live_batches,
    }


def page_faults(pid: int) -> tuple[int, int]:
    """(minor, major) page faults of ``pid`` so far, from ``/proc/<pid>/stat``; (0, 0) if gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0, 0
    return int(fields[7]), int(fields[9])


def worker_pids(iterator: Any) -> list[int]:
    """The worker processes of either loader's iterator."""
    stats = getattr(iterator, "stats", None)
    if stats is not None:  # mploader: its public snapshot
        return [worker.pid for worker in stats().workers if worker.pid]
    return [process.pid for process in getattr(iterator, "_workers", [])]


class FaultClock:
    """Page faults of the main process and of the workers between :meth:`start` and :meth:`stop`
    (per batch: summed over the workers)."""

    def __init__(self) -> None:
        self.pids: list[int] = []
        self.before: dict[int, tuple[int, int]] = {}
        self.faults: dict[str, tuple[int, int]] = {}

    def start(self, iterator: Any) -> None:
        self.pids = [os.getpid(), *worker_pids(iterator)]
        self.before = {pid: page_faults(pid) for pid in self.pids}

    def stop(self) -> None:
        after = {pid: page_faults(pid) for pid in self.pids}
        deltas = [
            (after[pid][0] - self.before[pid][0], after[pid][1] - self.before[pid][1])
            for pid in self.pids
        ]
        workers = deltas[1:]
        self.faults = {
            "main": deltas[0],
            "workers": (sum(minor for minor, _ in workers), sum(major for _, major in workers)),
        }

    def per_batch(self, batches: int) -> dict[str, list[float]]:
        return {side: [count / batches for count in counts]
                for side, counts in self.faults.items()}


def run_throughput(loader_class: type, workload: Workload, dataset: Any,
                   expected: list[Expected]) -> tuple[float, dict[str, Any]]:
    loader = loader_class(dataset, **workload.loader_kwargs)
    total = len(loader)
    assert total == workload.batches, (total, workload.batches)
    persistent = workload.loader_kwargs.get("persistent_workers", False)
    where = f"{workload.name} ({loader_class.__module__})"
    faults = FaultClock()
    iterator = iter(loader)
    try:
        if persistent:  # a whole untimed epoch first; the clock covers the next one, iter() on
            for number, batch in enumerate(iterator):
                verify(batch, expected[number], workload.checksum,
                       f"{where} epoch 0 batch {number}")
                del batch
            faults.start(iterator)
            started = time.perf_counter()
            iterator = iter(loader)
        else:
            faults.start(iterator)
            started = time.perf_counter()
        for number in range(total):
            batch = next(iterator)
            verify(batch, expected[number], workload.checksum, f"{where} batch {number}")
            del batch  # hold no batch while asking for the next one
            if number == workload.warm - 1:
                faults.start(iterator)
                started = time.perf_counter()
        elapsed = time.perf_counter() - started
        faults.stop()
        summary = {"channel": channel_summary(iterator),
                   "faults": faults.per_batch(total - workload.warm)}
    finally:
        shut_down(iterator)
    del iterator, loader
    return elapsed / (total - workload.warm) * 1e3, summary


def run_epochs(loader_class: type, workload: Workload, dataset: Any,
               expected: list[Expected]) -> tuple[float, dict[str, Any]]:
    loader = loader_class(dataset, **workload.loader_kwargs)
    where = f"{workload.name} ({loader_class.__module__})"
    main_pid = os.getpid()
    seen: dict[int, tuple[int, int]] = {}  # worker pid -> its faults when last read
    worker_faults = [0, 0]
    main_before = page_faults(main_pid)
    started = time.perf_counter()
    channel = None
    for epoch in range(1 + TIMED_EPOCHS):
        if epoch == 1:  # the clock covers every later epoch, boundaries included
            main_before = page_faults(main_pid)
            started = time.perf_counter()
        iterator = iter(loader)
        try:
            for number in range(workload.batches):
                batch = next(iterator)
                verify(batch, expected[number], workload.checksum,
                       f"{where} epoch {epoch} batch {number}")
                del batch
            if epoch >= 1:  # this epoch's workers, still alive: what they faulted since read
                for pid in worker_pids(iterator):
                    now = page_faults(pid)
                    before = seen.get(pid, (0, 0))
                    worker_faults[0] += now[0] - before[0]
                    worker_faults[1] += now[1] - before[1]
                    seen[pid] = now
            elif workload.loader_kwargs.get("persistent_workers"):
                seen = {pid: page_faults(pid) for pid in worker_pids(iterator)}
            channel = channel_summary(iterator)
            for _ in iterator:  # the end of the epoch: non-persistent workers stop here
                raise AssertionError(f"{where}: more than {workload.batches} batches")
        finally:
            if not workload.loader_kwargs.get("persistent_workers"):
                shut_down(iterator)
        del iterator
    elapsed = time.perf_counter() - started
    main_after = page_faults(main_pid)
    timed = TIMED_EPOCHS * workload.batches
    summary = {
        "channel": channel,
        "faults": {
            "main": [(main_after[0] - main_before[0]) / timed,
                     (main_after[1] - main_before[1]) / timed],
            "workers": [worker_faults[0] / timed, worker_faults[1] / timed],
        },
    }
    del loader
    return elapsed / timed * 1e3, summary


def run_window(loader_class: type, workload: Workload, dataset: Any,
               expected: list[Expected]) -> tuple[float, dict[str, Any]]:
    kwargs = dict(workload.loader_kwargs)
    if loader_class.__module__.startswith("mploader"):
        kwargs.update(workload.mploader_kwargs)
    loader = loader_class(dataset, **kwargs)
    where = f"{workload.name} ({loader_class.__module__})"
    iterator = None
    window: list[tuple[int, Any]] = []
    try:
        started = time.perf_counter()
        iterator = iter(loader)
        for number, batch in enumerate(iterator):
            verify(batch, expected[number], workload.checksum, f"{where} batch {number}")
            window.append((number, batch))
            if len(window) > workload.keep:  # leaves the window: intact all the while?
                kept_number, kept = window.pop(0)
                verify(kept, expected[kept_number], workload.checksum,
                       f"{where} batch {kept_number}, kept {workload.keep} batches")
            del batch
        elapsed = time.perf_counter() - started
        summary = {"channel": channel_summary(iterator)}
    finally:
        window.clear()
        if iterator is not None:
            shut_down(iterator)
    del iterator, loader
    return elapsed * 1e3, summary


def run_startup(loader_class: type, workload: Workload, dataset: Any,
                expected: list[Expected]) -> tuple[float, dict[str, Any]]:
    # The constructor is outside the clock (the plan times iter() to the first batch) but timed
    # on its own and reported, so that work moved from iter() into the constructor shows.
    constructing = time.perf_counter()
    loader = loader_class(dataset, **workload.loader_kwargs)
    construct_ms = (time.perf_counter() - constructing) * 1e3
    iterator = None
    try:
        started = time.perf_counter()
        iterator = iter(loader)
        batch = next(iterator)
        verify(batch, expected[0], workload.checksum,
               f"{workload.name} ({loader_class.__module__}) first batch")
        elapsed = time.perf_counter() - started
        del batch
        summary = {"channel": channel_summary(iterator), "construct_ms": construct_ms}
    finally:
        if iterator is not None:
            shut_down(iterator)
    del iterator, loader
    return elapsed * 1e3, summary


# -- the container workload: large_collate in a 64 MiB /dev/shm ---------------------------------

CONTAINER_SHM_SIZE = "64m"  # Docker's and Kubernetes' default /dev/shm
CONTAINER_SHM_WORDS = "64 MiB"
CONTAINER_RESULT = "CONTAINER-RESULT "
CONTAINER_SAMPLE_SECONDS = 0.010
container_timeout = 55.0  # seconds one repetition's subprocess may take (main(): --hang-timeout)
_container_probe: list[str | None] = []  # unshare's path, or None and why not (probed once)


class LoaderFailed(Exception):
    """The container workload: a loader failed in the small /dev/shm (its result, not an error)."""

    def __init__(self, text: str, dev_shm_peak: int | None) -> None:
        super().__init__(text)
        self.text = text
        self.dev_shm_peak = dev_shm_peak


class ContainerUnavailable(Exception):
    """The container workload cannot run here: why."""


def container_unshare() -> str:
    """``unshare(1)``, once a private tmpfs is known to mount on /dev/shm in a mount namespace."""
    if not _container_probe:
        reason = None
        unshare = shutil.which("unshare")
        if os.geteuid() != 0:
            reason = "needs root, to mount a private tmpfs on /dev/shm"
        elif unshare is None:
            reason = "unshare(1) is not installed"
        else:
            probe = subprocess.run(
                [unshare, "--mount", "--propagation", "private", "sh", "-c",
                 f"mount -t tmpfs -o size={CONTAINER_SHM_SIZE} tmpfs /dev/shm"],
                capture_output=True, text=True, timeout=30,
            )
            if probe.returncode != 0:
                reason = (f"cannot mount a private /dev/shm (unshare --mount, mount -t tmpfs): "
                          f"{probe.stderr.strip() or f'exit status {probe.returncode}'}")
        _container_probe.extend([unshare if reason is None else None, reason])
    unshare, reason = _container_probe
    if unshare is None:
        raise ContainerUnavailable(reason)
    return unshare


def failure_text(error: BaseException) -> str:
    """An exception's first line; for one re-raised from a worker (torch's "Caught ... in
    DataLoader worker process 0."), the original exception's line too."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    first = f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
    if len(lines) > 1 and lines[-1] != lines[0]:
        return f"{first} ... {lines[-1]}"
    return first


def run_container(loader_class: type, workload: Workload, dataset: Any,
                  expected: list[Expected]) -> tuple[float, dict[str, Any]]:
    """One repetition in a subprocess with a private 64 MiB /dev/shm (``container_child``)."""
    unshare = container_unshare()
    side = "torch" if loader_class.__module__.startswith("torch") else "mploader"
    script = os.path.abspath(__file__)
    repository = os.path.dirname(os.path.dirname(script))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        part for part in (repository, env.get("PYTHONPATH")) if part
    )
    command = shlex.join([sys.executable, script, "--container-child", side,
                          *workload.child_args])
    process = subprocess.Popen(
        [unshare, "--mount", "--propagation", "private", "sh", "-c",
         f"mount -t tmpfs -o size={CONTAINER_SHM_SIZE},mode=1777 tmpfs /dev/shm && "
         f"exec {command}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        start_new_session=True,  # its workers are in its process group: killed below
    )
    try:
        stdout, stderr = process.communicate(timeout=container_timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        raise RuntimeError(f"{side} in the container did not finish within "
                           f"{container_timeout:g} s; its stderr:\n{stderr[-3000:]}")
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)  # a worker left behind
        except (ProcessLookupError, PermissionError):
            pass
    lines = [line for line in stdout.splitlines() if line.startswith(CONTAINER_RESULT)]
    if not lines:
        raise RuntimeError(f"{side} in the container exited with status {process.returncode} "
                           f"and no result; its stderr:\n{stderr[-3000:]}")
    report = json.loads(lines[-1][len(CONTAINER_RESULT):])
    if "error" in report:  # a failed check: an error of the benchmark's, as in the other rows
        raise BatchMismatch(f"{side} in the container: {report['error']}")
    if "failure" in report:
        raise LoaderFailed(report["failure"], report["dev_shm_peak"])
    summary = dict(report["summary"])
    summary["dev_shm_peak"] = report["dev_shm_peak"]
    return report["ms"], summary


def container_child(side: str, quick: bool) -> int:
    """``--container-child SIDE``: one repetition of large_collate with one loader, run by
    ``run_container`` in its 64 MiB /dev/shm; prints the figure or the failure as a JSON line."""
    import mploader  # see the note at the imports

    warnings.filterwarnings("ignore", message="This DataLoader will create")
    loader_class = torch.utils.data.DataLoader if side == "torch" else mploader.DataLoader
    workload = next(work for work in build_workloads(quick) if work.name == "large_collate")
    peak = [0]
    stop = threading.Event()

    def sample() -> None:
        while True:
            stats = os.statvfs("/dev/shm")
            peak[0] = max(peak[0], (stats.f_blocks - stats.f_bfree) * stats.f_frsize)
            if stop.wait(CONTAINER_SAMPLE_SECONDS):
                return

    sampler = threading.Thread(target=sample, name="dev-shm-sampler", daemon=True)
    sampler.start()
    report: dict[str, Any] = {}
    try:
        dataset = workload.make_dataset(workload.batches)
        expected = [workload.expected(number) for number in range(workload.batches)]
        figure, summary = run_throughput(loader_class, workload, dataset, expected)
        report.update(ms=figure, summary=summary)
    except BatchMismatch:
        report["error"] = traceback.format_exc()
    except Exception as error:
        report["failure"] = failure_text(error)
    finally:
        stop.set()
        sampler.join()
    report["dev_shm_peak"] = peak[0]
    print(CONTAINER_RESULT + json.dumps(report), flush=True)
    return 0


# -- machine, /dev/shm and process bookkeeping --------------------------------------------------


def own_shm_names() -> list[str]:
    """mploader's shared memory this process still holds: pool blocks (anonymous memory files,
    ``/memfd:mploader-w<id>``) mapped or open here, and any ``mploader`` entry in ``/dev/shm``
    (there should never be one)."""
    held: set[str] = set()
    try:
        with open("/proc/self/maps") as maps:
            held.update(f"block inode {line.split()[4]}" for line in maps
                        if "/memfd:mploader" in line)
        for fd in os.listdir("/proc/self/fd"):
            try:
                if os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:mploader"):
                    held.add(f"block inode {os.stat(f'/proc/self/fd/{fd}').st_ino}")
            except OSError:
                continue  # the listing's own descriptor, closed meanwhile
        held.update(f"/dev/shm/{name}" for name in os.listdir("/dev/shm") if "mploader" in name)
    except FileNotFoundError:
        pass
    return sorted(held)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "cpu_count": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "default_start_method": torch.multiprocessing.get_start_method(allow_none=True),
        "sharing_strategy": torch.multiprocessing.get_sharing_strategy(),
    }
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    info["cpu_model"] = line.split(":", 1)[1].strip()
                    break
        with open("/proc/meminfo") as meminfo:
            info["mem_total_gb"] = round(int(meminfo.readline().split()[1]) / 2**20, 1)
    except OSError:
        pass
    usage = shutil.disk_usage("/dev/shm")
    info["dev_shm_total_gb"] = round(usage.total / 2**30, 1)
    info["dev_shm_used_gb"] = round(usage.used / 2**30, 2)
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,
            cwd=os.path.dirname(os.path.abspath(__file__)),
        ).stdout.strip()
        info["git_commit"] = commit or None
    except (OSError, subprocess.SubprocessError):
        info["git_commit"] = None
    return info


def memcpy_floor_ms() -> float:
    """One ``numpy.copyto`` of 602 MB into already-touched memory (the physical floor)."""
    source = np.ones((LARGE_ROWS, LARGE_COLS), dtype=np.float32)
    target = np.zeros_like(source)
    timings = []
    for _ in range(4):
        started = time.perf_counter()
        np.copyto(target, source)
        timings.append(time.perf_counter() - started)
    return statistics.median(timings[1:]) * 1e3


# -- the run ------------------------------------------------------------------------------------


@dataclass
class Result:
    workload: Workload
    torch_ms: list[float] = field(default_factory=list)
    mploader_ms: list[float] = field(default_factory=list)
    channel: dict[str, Any] | None = None
    error: str | None = None
    error_side: str | None = None
    leaked_shm: list[str] = field(default_factory=list)
    fds_before: int = 0
    fds_after: int = 0
    rss_before_mb: float = 0.0
    rss_after_mb: float = 0.0
    done: bool = False
    hung: bool = False
    seconds: float = 0.0
    construct_ms: dict[str, list[float]] = field(default_factory=dict)
    # loader -> "main"/"workers" -> [(minor, major) per timed batch, one per repetition]
    faults: dict[str, dict[str, list[list[float]]]] = field(default_factory=dict)
    # the container workload: loader -> how it failed (its result); why it was skipped; loader ->
    # the most of /dev/shm it used (bytes, over its repetitions)
    failures: dict[str, str] = field(default_factory=dict)
    skipped: str | None = None
    dev_shm_peak: dict[str, int] = field(default_factory=dict)

    def median_faults(self, side: str, process: str) -> tuple[float, float] | None:
        runs = self.faults.get(side, {}).get(process)
        if not runs:
            return None
        return (statistics.median(run[0] for run in runs),
                statistics.median(run[1] for run in runs))

    def median(self, side: str) -> float | None:
        values = self.torch_ms if side == "torch" else self.mploader_ms
        return statistics.median(values) if values else None

    @property
    def ratio(self) -> float | None:
        torch_median, mploader_median = self.median("torch"), self.median("mploader")
        if torch_median is None or not mploader_median:
            return None
        return torch_median / mploader_median


class Watchdog:
    """Declares a repetition hung after ``seconds``: dumps every thread and reports what it has.

    A deadlocked main thread cannot be recovered in-process, so ``on_hang`` prints the partial
    table (the hung workload marked as such), and the process exits with status 2.
    """

    def __init__(self, seconds: float, on_hang: Callable[[str, str], None]) -> None:
        self.seconds = seconds
        self.on_hang = on_hang
        self.timer: threading.Timer | None = None

    def start(self, label: str) -> None:
        self.timer = threading.Timer(self.seconds, self._fire, args=(label,))
        self.timer.daemon = True
        self.timer.start()

    def cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _fire(self, label: str) -> None:
        try:
            print(f"\nHUNG: {label} did not finish within {self.seconds:g} s; "
                  f"tracebacks of every thread of the main process:", file=sys.stderr, flush=True)
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
            sys.stderr.flush()
            self.on_hang(label, main_thread_whereabouts())
        finally:
            os._exit(2)


def main_thread_whereabouts() -> str:
    """Where the main thread is stuck: its innermost frame, and the innermost in each package."""
    frame = sys._current_frames().get(threading.main_thread().ident)
    if frame is None:
        return "main thread not found"
    stack = traceback.extract_stack(frame)  # outermost first

    def describe(entry: traceback.FrameSummary) -> str:
        path = entry.filename
        for marker in ("/site-packages/", "/lib/python"):
            if marker in path:
                path = path.split(marker, 1)[1]
                break
        else:
            path = os.path.relpath(path)
        return f"{path}:{entry.lineno} in {entry.name}"

    parts = [f"main thread at {describe(stack[-1])}"]
    for package, needle in (("mploader", f"{os.sep}mploader{os.sep}"),
                            ("torch", f"{os.sep}torch{os.sep}")):
        inner = [entry for entry in stack if needle in entry.filename]
        if inner:
            parts.append(f"innermost {package} frame {describe(inner[-1])}")
    return ", ".join(parts)


def run_workload(result: Result, repeats: int, watchdog: Watchdog,
                 loaders: list[tuple[str, type]]) -> None:
    workload = result.workload
    gc.collect()
    result.fds_before, result.rss_before_mb = open_fds(), rss_mb()
    shm_before = set(own_shm_names())
    workload_started = time.perf_counter()
    run = {"throughput": run_throughput, "window": run_window, "epochs": run_epochs,
           "container": run_container}.get(workload.kind, run_startup)
    side = "setup"
    dataset = None
    try:
        dataset = workload.make_dataset(workload.batches)
        count = workload.batches if workload.kind in ("throughput", "window", "epochs") else 1
        expected = [workload.expected(number) for number in range(count)]
        for repetition in range(repeats * workload.repeat_factor):
            for side, loader_class in loaders:  # A B A B
                if side in result.failures:
                    continue  # the container workload: it failed once, it fails again
                gc.collect()
                result.error_side = side  # what a hang would be blamed on
                watchdog.start(f"{workload.name} repetition {repetition + 1} ({side})")
                try:
                    if workload.via_install and side == "mploader":
                        from mploader import install  # see the note at the imports

                        with install():
                            figure, summary = run(torch.utils.data.DataLoader, workload,
                                                  dataset, expected)
                    else:
                        figure, summary = run(loader_class, workload, dataset, expected)
                except LoaderFailed as failure:  # the container workload: its result
                    result.error_side = None
                    result.failures[side] = failure.text
                    if failure.dev_shm_peak is not None:
                        result.dev_shm_peak[side] = max(result.dev_shm_peak.get(side, 0),
                                                        failure.dev_shm_peak)
                    print(f"  {workload.name:15s} rep {repetition + 1:2d} {side:8s} "
                          f"FAILED: {failure.text}", flush=True)
                    continue
                finally:
                    watchdog.cancel()
                result.error_side = None
                if "dev_shm_peak" in summary:
                    result.dev_shm_peak[side] = max(result.dev_shm_peak.get(side, 0),
                                                    summary["dev_shm_peak"])
                (result.torch_ms if side == "torch" else result.mploader_ms).append(figure)
                if side == "mploader":
                    result.channel = summary["channel"]
                if "faults" in summary:
                    for process, counts in summary["faults"].items():
                        result.faults.setdefault(side, {}).setdefault(process, []).append(counts)
                if "construct_ms" in summary:
                    result.construct_ms.setdefault(side, []).append(summary["construct_ms"])
                print(f"  {workload.name:15s} rep {repetition + 1:2d} {side:8s} "
                      f"{figure:10.3f} {workload.unit}", flush=True)
    except ContainerUnavailable as reason:
        result.error_side = None
        result.skipped = str(reason)
        print(f"  {workload.name}: skipped: {reason}", flush=True)
    except Exception:
        result.error_side = side
        result.error = traceback.format_exc()
        print(f"  {workload.name}: ERROR on the {side} side\n{result.error}", flush=True)
    finally:
        del dataset
        workload.cleanup()
        gc.collect()
    # A collected loader is shut down by mploader's finalizer thread, which waits for its
    # workers' exits (a worker tearing down three 640 MiB blocks takes 100 ms or more): wait
    # for that, up to the shutdown's own deadline, before counting leftovers.
    settle_deadline = time.monotonic() + LEFTOVER_SETTLE_SECONDS
    time.sleep(0.2)
    while set(own_shm_names()) - shm_before and time.monotonic() < settle_deadline:
        time.sleep(0.05)
    result.leaked_shm = sorted(set(own_shm_names()) - shm_before)
    result.fds_after, result.rss_after_mb = open_fds(), rss_mb()
    result.seconds = time.perf_counter() - workload_started
    print(f"  {workload.name}: {result.seconds:.1f} s", flush=True)
    result.done = True


def format_ms(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    if value >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def verdict(result: Result, memcpy_ms: float | None) -> str:
    if result.hung:
        return f"HUNG ({result.error_side})"
    if result.error is not None:
        return f"ERROR ({result.error_side})"
    if not result.done:
        return "not run"
    if result.skipped is not None:
        return "skipped"
    if "mploader" in result.failures:
        return "NOT met (mploader failed)"
    if "torch" in result.failures:
        return "mploader only (torch failed)" if result.mploader_ms else "-"
    ratio = result.ratio
    if ratio is None:
        return "-"
    bound = result.workload.memcpy_bound
    if bound is not None:  # the target also asks for at most `bound` memcpys a batch
        median = result.median("mploader")
        if memcpy_ms is None or median is None or median > bound * memcpy_ms:
            return "NOT met (memcpy)" if ratio >= result.workload.target else "NOT met"
    if ratio >= result.workload.stretch:
        return "met + stretch"
    return "met" if ratio >= result.workload.target else "NOT met"


def figure_cell(result: Result, side: str) -> str:
    if side in result.failures:
        return "failed"
    if result.skipped is not None:
        return "skipped"
    return format_ms(result.median(side))


def print_table(results: list[Result], memcpy_ms: float | None) -> None:
    header = ("workload", "unit", "torch", "mploader", "ratio", "target", "stretch", "verdict")
    rows = [header]
    for result in results:
        ratio = result.ratio
        workload = result.workload
        rows.append((
            workload.name, workload.unit,
            figure_cell(result, "torch"), figure_cell(result, "mploader"),
            f"{ratio:.2f}x" if ratio is not None else "-",
            f">= {workload.target:g}x", f"{workload.stretch:g}x", verdict(result, memcpy_ms),
        ))
    widths = [max(len(row[column]) for row in rows) for column in range(len(header))]
    for index, row in enumerate(rows):
        cells = [
            cell.ljust(width) if column < 2 or column == 7 else cell.rjust(width)
            for column, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        print("  ".join(cells).rstrip())
        if index == 0:
            print("  ".join("-" * width for width in widths))


def format_faults(counts: tuple[float, float] | None) -> str:
    """Minor/major page faults per batch, e.g. ``147k/0``."""
    if counts is None:
        return "-"

    def short(value: float) -> str:
        if value >= 10_000:
            return f"{value / 1000:.0f}k"
        return f"{value:.1f}" if value < 10 else f"{value:.0f}"

    return f"{short(counts[0])}/{short(counts[1])}"


def print_fault_table(results: list[Result]) -> None:
    """Page faults per timed batch (minor/major, medians over repetitions), per loader, in the
    workers (summed) and in the main process; and the batch's own 4 KiB pages for scale."""
    measured = [result for result in results if result.faults]
    if not measured:
        return
    header = ("workload", "pages/batch", "torch workers", "torch main", "mploader workers",
              "mploader main")
    rows = [header]
    for result in measured:
        expected = result.workload.expected(0)
        itemsize = torch.empty((), dtype=expected.dtype).element_size()
        pages = -(-int(np.prod(expected.shape)) * itemsize // PAGE)
        rows.append((
            result.workload.name, str(pages),
            format_faults(result.median_faults("torch", "workers")),
            format_faults(result.median_faults("torch", "main")),
            format_faults(result.median_faults("mploader", "workers")),
            format_faults(result.median_faults("mploader", "main")),
        ))
    widths = [max(len(row[column]) for row in rows) for column in range(len(header))]
    print("page faults per batch, minor/major (/proc/<pid>/stat; workers summed):")
    for index, row in enumerate(rows):
        print("  ".join(cell.ljust(width) if column == 0 else cell.rjust(width)
                        for column, (cell, width) in enumerate(zip(row, widths, strict=True))))
        if index == 0:
            print("  ".join("-" * width for width in widths))


def describe_channel(channel: dict[str, Any] | None) -> str:
    if channel is None:
        return "no statistics"
    if channel["kind"] != "shm":
        return channel["kind"] + (f" ({channel['error']})" if "error" in channel else "")
    return (
        f"shm: {channel['shm_leaves']} block leaves, {channel['inline_leaves']} inline, "
        f"pool reuse {channel['reuse_hits']} hits / {channel['reuse_misses']} misses, "
        f"{channel.get('blocks', '?')} blocks ({channel['pool_bytes'] / 2**20:.0f} MiB) pooled, "
        f"{channel.get('evictions', '?')} evicted, "
        f"{channel['beyond_budget']} beyond the budget, {channel.get('held', '?')} batches "
        f"held (last repetition)"
    )


@dataclass
class Run:
    command: str
    info: dict[str, Any]
    repeats: int
    quick: bool
    json_path: str | None
    load_before: tuple[float, float, float]
    started: float = field(default_factory=time.perf_counter)
    memcpy_ms: float | None = None
    results: list[Result] = field(default_factory=list)

    def report(self) -> int:
        """Print the table and the notes, save the JSON; the exit status (1 on any problem)."""
        runtime = time.perf_counter() - self.started
        load_after = os.getloadavg()
        info = self.info
        print()
        print(f"command: {self.command}")
        print(f"machine: {info['cpu_count']} cores ({info['usable_cores']} usable), "
              f"/dev/shm {info['dev_shm_total_gb']} GB, torch {info['torch']}, "
              f"mploader {info['mploader']} (git {info['git_commit']}), "
              f"load average {self.load_before[0]:.2f} before, {load_after[0]:.2f} after")
        print(f"medians of {self.repeats} repetitions per loader (startup_fork8: "
              f"{2 * self.repeats}); ratio = torch / mploader; runtime {runtime:.0f} s")
        print()
        print_table(self.results, self.memcpy_ms)
        print()
        print_fault_table(self.results)
        print()
        problems = False
        for result in self.results:
            bound, median = result.workload.memcpy_bound, result.median("mploader")
            if self.memcpy_ms is not None and bound is not None and median is not None:
                print(f"{result.workload.name}: mploader {median:.1f} ms/batch = "
                      f"{median / self.memcpy_ms:.2f}x one 602 MB memcpy "
                      f"({self.memcpy_ms:.1f} ms; target <= {bound:g}x)")
        for result in self.results:
            if not result.done and not result.hung:
                continue
            notes = [f"mploader channel: {describe_channel(result.channel)}"]
            if result.skipped is not None or "mploader" in result.failures:
                notes = []
            if result.skipped is not None:
                notes.append(f"skipped: {result.skipped}")
            for side in ("torch", "mploader"):
                if side in result.failures:
                    notes.append(f"{side} FAILED in a {CONTAINER_SHM_WORDS} /dev/shm: "
                                 f"{result.failures[side]}")
            if result.dev_shm_peak:
                notes.append(f"most of the {CONTAINER_SHM_WORDS} /dev/shm in use at once: "
                             + ", ".join(f"{side} {result.dev_shm_peak[side] / 2**20:.1f} MiB"
                                         for side in ("torch", "mploader")
                                         if side in result.dev_shm_peak))
            problems = problems or "mploader" in result.failures
            if result.leaked_shm:
                problems = True
                notes.append(f"SHARED MEMORY LEFT: {', '.join(result.leaked_shm)}")
            if result.fds_after != result.fds_before and result.done:
                notes.append(f"open fds {result.fds_before} -> {result.fds_after}")
            if result.done:
                notes.append(f"main RSS {result.rss_before_mb:.0f} -> "
                             f"{result.rss_after_mb:.0f} MB")
            if result.workload.kind == "startup" and result.torch_ms and result.mploader_ms:
                # The first repetition is the only cold one: helpers a loader keeps for the
                # process (mploader's spawn zygote) are warm in later repetitions.
                first_torch, first_mploader = result.torch_ms[0], result.mploader_ms[0]
                notes.append(f"first (cold) repetition torch {first_torch:.0f} ms, mploader "
                             f"{first_mploader:.0f} ms ({first_torch / first_mploader:.2f}x)")
            for side, values in result.construct_ms.items():
                notes.append(f"{side} DataLoader() {values[0]:.1f} ms first, "
                             f"{statistics.median(values):.1f} ms median (not timed)")
            print(f"{result.workload.name}:" + "".join(f"\n  {note}" for note in notes))
            problems = problems or result.error is not None
        leftovers = own_shm_names()
        if leftovers:
            problems = True
            print(f"shared memory of mploader's this process holds now: {', '.join(leftovers)}")
        for result in self.results:
            if result.error is not None:
                print(f"\n{result.workload.name}: {'hung' if result.hung else 'error'} ("
                      f"{result.error_side}):\n{result.error}")
        if self.json_path:
            self.save(runtime, load_after)
        sys.stdout.flush()
        return 1 if problems else 0

    def save(self, runtime: float, load_after: tuple[float, float, float]) -> None:
        payload = {
            "command": self.command,
            "machine": self.info,
            "load_average_before": self.load_before,
            "load_average_after": load_after,
            "repeats": self.repeats,
            "quick": self.quick,
            "runtime_seconds": runtime,
            "memcpy_602mb_ms": self.memcpy_ms,
            "workloads": [
                {
                    "name": result.workload.name,
                    "what": result.workload.what,
                    "unit": result.workload.unit,
                    "batches": result.workload.batches,
                    "untimed_warmup_batches": result.workload.warm,
                    "wall_seconds": result.seconds,
                    "constructor_ms": result.construct_ms,
                    "torch_ms": result.torch_ms,
                    "mploader_ms": result.mploader_ms,
                    "torch_median": result.median("torch"),
                    "mploader_median": result.median("mploader"),
                    "ratio": result.ratio,
                    "target": result.workload.target,
                    "stretch": result.workload.stretch,
                    "torch_reference": result.workload.torch_reference,
                    "verdict": verdict(result, self.memcpy_ms),
                    "mploader_channel": result.channel,
                    "page_faults_per_batch": result.faults,
                    "error": result.error,
                    "error_side": result.error_side,
                    "hung": result.hung,
                    "failures": result.failures,
                    "skipped": result.skipped,
                    "dev_shm_peak_bytes": result.dev_shm_peak,
                    "leaked_shm": result.leaked_shm,
                    "open_fds": [result.fds_before, result.fds_after],
                    "main_rss_mb": [result.rss_before_mb, result.rss_after_mb],
                }
                for result in self.results
            ],
        }
        with open(self.json_path, "w") as output:
            json.dump(payload, output, indent=2)
        print(f"figures saved to {self.json_path}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--only", default="",
                        help="comma-separated workloads (default: all; container needs root)")
    parser.add_argument("--repeats", type=int, default=None,
                        help=f"repetitions per workload and loader (default {DEFAULT_REPEATS}, "
                             f"--quick {QUICK_REPEATS}; startup_fork8 runs twice as many)")
    parser.add_argument("--quick", action="store_true",
                        help="fewer batches and repetitions: a ~1 minute smoke run")
    parser.add_argument("--json", metavar="PATH", help="also save the figures as JSON")
    parser.add_argument("--hang-timeout", type=float, default=60.0,
                        help="seconds one repetition may take before the run is declared hung "
                             "(tracebacks and the partial table are printed, exit status 2)")
    parser.add_argument("--container-child", choices=("torch", "mploader"),
                        help=argparse.SUPPRESS)  # the container workload's subprocess
    args = parser.parse_args(argv)
    if args.container_child:
        return container_child(args.container_child, args.quick)
    global container_timeout
    container_timeout = max(10.0, args.hang_timeout - 5.0)

    import mploader  # see the note at the imports

    repeats = args.repeats if args.repeats is not None else (
        QUICK_REPEATS if args.quick else DEFAULT_REPEATS)
    if repeats < 1:
        parser.error("--repeats must be at least 1")
    workloads = build_workloads(args.quick)
    known = [workload.name for workload in workloads]
    if args.only:
        wanted = [name.strip() for name in args.only.split(",") if name.strip()]
        unknown = sorted(set(wanted) - set(known))
        if unknown:
            parser.error(f"unknown workload(s) {', '.join(unknown)}; known: {', '.join(known)}")
        workloads = [workload for workload in workloads if workload.name in wanted]
    # Both loaders warn that 8 workers exceed this machine's 2 cores; the workloads ask for them.
    warnings.filterwarnings("ignore", message="This DataLoader will create")

    info = machine_info()
    info["mploader"] = getattr(mploader, "__version__", "?")
    run = Run(shlex.join([sys.executable, *sys.argv]), info, repeats, args.quick, args.json,
              os.getloadavg())
    print(f"command: {run.command}")
    print(f"machine: {info['cpu_count']} cores ({info['usable_cores']} usable), "
          f"{info.get('cpu_model', '?')}, {info.get('mem_total_gb', '?')} GB RAM, "
          f"/dev/shm {info['dev_shm_total_gb']} GB ({info['dev_shm_used_gb']} GB used), "
          f"load average {' '.join(f'{load:.2f}' for load in run.load_before)}")
    print(f"versions: python {info['python']}, torch {info['torch']}, numpy {info['numpy']}, "
          f"mploader {info['mploader']} (git {info['git_commit']}); torch sharing strategy "
          f"{info['sharing_strategy']}")
    print(f"repeats: {repeats} per loader, A B A B (torch, mploader); "
          f"{'quick' if args.quick else 'default'} sizes", flush=True)

    if any(workload.name == "large_collate" for workload in workloads):
        run.memcpy_ms = memcpy_floor_ms()
        print(f"one 602 MB numpy.copyto into touched memory: {run.memcpy_ms:.1f} ms", flush=True)

    def on_hang(label: str, whereabouts: str) -> None:
        current = next((result for result in run.results if not result.done), None)
        if current is not None:
            current.hung = True
            if "innermost mploader frame" in whereabouts and current.error_side == "torch":
                current.error_side = "torch run, stuck in mploader code"
            current.error = (f"HUNG: {label} did not finish within {args.hang_timeout:g} s; "
                             f"{whereabouts}")
        run.report()

    watchdog = Watchdog(args.hang_timeout, on_hang)
    loaders = [("torch", torch.utils.data.DataLoader), ("mploader", mploader.DataLoader)]
    run.results = [Result(workload) for workload in workloads]
    for result in run.results:
        print(f"{result.workload.name}: {result.workload.what}", flush=True)
        run_workload(result, repeats, watchdog, loaders)
    return run.report()


if __name__ == "__main__":
    sys.exit(main())
