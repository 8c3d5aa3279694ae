"""Network-bound data: torch's worker processes versus mploader's processes x fetch threads.

    .venv/bin/python benchmarks/threads.py                        # every workload (~2 min)
    .venv/bin/python benchmarks/threads.py --only io_bound_threads16 --repeats 9
    .venv/bin/python benchmarks/threads.py --json out.json

The rows of the benchmark plan (``/work/shared/BENCHMARKS.md``) for ``worker_threads``: each item
sleeps (a remote query's wait); torch gets 8 worker processes, mploader 2 worker processes with
``worker_threads=T``.  Every workload runs torch (A) and mploader (B) alternately, A B A B, with
the ``fork`` start method and a fresh loader per repetition; the table gives the medians, the
throughput ratio (torch ms/batch over mploader ms/batch: > 1 means mploader is faster) and the
total worker memory of each.

How it measures, the same for both loaders: the first ``warm`` batches of the epoch are received
and checked but not timed (worker start, and for mploader the first T x prefetch tasks in
flight); the clock runs from there to the last batch.  Every batch is checked against the indices
it must hold.  With the last batch received and the workers still alive, the USS (private memory,
``psutil``'s ``memory_full_info().uss``) of every worker process is summed: that is the memory
the workers cost, since everything a forked worker shares with the main process is excluded.
Not part of the test suite.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shlex
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psutil
import torch
import torch.utils.data

DEFAULT_REPEATS = 5
TORCH_WORKERS = 8
MPLOADER_WORKERS = 2


class SleepyInts(torch.utils.data.Dataset):
    """Item ``i`` is ``i`` after ``sleep`` seconds (the wait of a remote query)."""

    def __init__(self, length: int, sleep: float) -> None:
        self.length = length
        self.sleep = sleep

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> int:
        time.sleep(self.sleep)
        return index


@dataclass
class Workload:
    name: str
    what: str
    threads: int  # mploader's worker_threads (2 processes); torch has 8 processes
    sleep: float
    batch_size: int | None
    batches: int
    warm: int
    target: float  # throughput ratio torch / mploader ms per batch
    uss_target: float | None = None  # mploader's worker USS at most this fraction of torch's

    def dataset(self) -> SleepyInts:
        return SleepyInts(self.batches * (self.batch_size or 1), self.sleep)

    def expected(self, number: int) -> list[int]:
        size = self.batch_size or 1
        return list(range(number * size, (number + 1) * size))


WORKLOADS = [
    Workload("io_bound_threads4", "batch_size=None, items sleep 20 ms; torch 8 x 1, mploader 2 x 4",
             4, 0.020, None, 480, 80, 0.95, uss_target=1 / 3),
    Workload("io_bound_threads16", "the same; mploader 2 x 16", 16, 0.020, None, 960, 160, 3.0),
    Workload("io_bound_threads32", "the same; mploader 2 x 32", 32, 0.020, None, 1600, 320, 5.0),
    Workload("batched_threads16", "batch_size=64, items sleep 5 ms; torch 8 x 1, mploader 2 x 16",
             16, 0.005, 64, 72, 16, 3.0),
]


@dataclass
class Sample:
    ms_per_batch: float
    worker_uss_mb: float
    workers: int


@dataclass
class Result:
    workload: Workload
    samples: dict[str, list[Sample]] = field(default_factory=lambda: {"torch": [], "mploader": []})

    def median(self, side: str, what: Callable[[Sample], float]) -> float | None:
        values = [what(sample) for sample in self.samples[side]]
        return statistics.median(values) if values else None

    @property
    def ratio(self) -> float | None:
        torch_ms = self.median("torch", lambda s: s.ms_per_batch)
        mploader_ms = self.median("mploader", lambda s: s.ms_per_batch)
        return None if not torch_ms or not mploader_ms else torch_ms / mploader_ms

    @property
    def uss_fraction(self) -> float | None:
        torch_uss = self.median("torch", lambda s: s.worker_uss_mb)
        mploader_uss = self.median("mploader", lambda s: s.worker_uss_mb)
        return None if not torch_uss or mploader_uss is None else mploader_uss / torch_uss


def worker_uss_mb() -> tuple[float, int]:
    """The summed USS of this process's live children (the loader's workers), and their count."""
    total, count = 0, 0
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                continue
            total += child.memory_full_info().uss
            count += 1
        except psutil.Error:
            continue
    return total / 2**20, count


def check(batch: Any, expected: list[int], where: str) -> None:
    values = batch.tolist() if isinstance(batch, torch.Tensor) else batch
    if not isinstance(values, list):
        values = [values]
    if values != expected:
        raise AssertionError(f"{where}: got {values[:8]}..., expected {expected[:8]}...")


def run_once(side: str, loader_class: type, workload: Workload) -> Sample:
    if side == "torch":
        options: dict[str, Any] = {"num_workers": TORCH_WORKERS}
    else:
        options = {"num_workers": MPLOADER_WORKERS, "worker_threads": workload.threads}
    gc.collect()  # what the main process frees after the fork would count as the workers' USS
    loader = loader_class(workload.dataset(), batch_size=workload.batch_size,
                          multiprocessing_context="fork", **options)
    iterator = iter(loader)
    started = 0.0
    for number in range(workload.batches):
        batch = next(iterator)
        check(batch, workload.expected(number), f"{workload.name} {side} batch {number}")
        del batch
        if number + 1 == workload.warm:
            started = time.perf_counter()
    elapsed = time.perf_counter() - started
    uss, workers = worker_uss_mb()  # the workers are alive until the epoch's end is asked for
    for _ in iterator:
        raise AssertionError(f"{workload.name} {side}: more batches than expected")
    del iterator, loader
    return Sample(1000 * elapsed / (workload.batches - workload.warm), uss, workers)


def fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def verdict(result: Result) -> str:
    ratio, fraction = result.ratio, result.uss_fraction
    if ratio is None:
        return "not run"
    met = ratio >= result.workload.target
    if result.workload.uss_target is not None:
        met = met and fraction is not None and fraction <= result.workload.uss_target
    return "met" if met else "NOT met"


def print_table(results: list[Result]) -> None:
    header = ("workload", "torch ms/batch", "mploader ms/batch", "ratio", "target",
              "torch worker USS", "mploader worker USS", "USS mploader/torch", "verdict")
    rows = [header]
    for result in results:
        workload = result.workload
        torch_ms = result.median("torch", lambda s: s.ms_per_batch)
        mploader_ms = result.median("mploader", lambda s: s.ms_per_batch)
        torch_uss = result.median("torch", lambda s: s.worker_uss_mb)
        mploader_uss = result.median("mploader", lambda s: s.worker_uss_mb)
        target = f">= {workload.target:g}x"
        if workload.uss_target is not None:
            target += f", USS <= {workload.uss_target:.2f}"
        rows.append((
            workload.name, fmt(torch_ms, 3), fmt(mploader_ms, 3),
            f"{fmt(result.ratio)}x", target,
            f"{fmt(torch_uss, 0)} MB ({TORCH_WORKERS})",
            f"{fmt(mploader_uss, 0)} MB ({MPLOADER_WORKERS} x {workload.threads})",
            fmt(result.uss_fraction), verdict(result),
        ))
    widths = [max(len(row[column]) for row in rows) for column in range(len(header))]
    for index, row in enumerate(rows):
        print(" | ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))
        if index == 0:
            print("-|-".join("-" * width for width in widths))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--only", default="", help="comma-separated workloads (default: all)")
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS,
                        help=f"repetitions per workload and loader (default {DEFAULT_REPEATS})")
    parser.add_argument("--json", metavar="PATH", help="also save the figures as JSON")
    args = parser.parse_args(argv)

    import mploader

    workloads = WORKLOADS
    if args.only:
        wanted = {name.strip() for name in args.only.split(",") if name.strip()}
        unknown = wanted - {workload.name for workload in WORKLOADS}
        if unknown:
            parser.error(f"unknown workload(s) {', '.join(sorted(unknown))}")
        workloads = [workload for workload in WORKLOADS if workload.name in wanted]
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    command = shlex.join([sys.executable, *sys.argv])
    load_before = os.getloadavg()
    began = time.perf_counter()
    print(f"command: {command}")
    print(f"machine: {os.cpu_count()} cores, load average {load_before[0]:.2f}; torch "
          f"{torch.__version__}; {args.repeats} repetitions per loader, A B A B", flush=True)
    loaders = [("torch", torch.utils.data.DataLoader), ("mploader", mploader.DataLoader)]
    results = []
    for workload in workloads:
        result = Result(workload)
        results.append(result)
        print(f"{workload.name}: {workload.what}", flush=True)
        for repetition in range(args.repeats):
            for side, loader_class in loaders:
                sample = run_once(side, loader_class, workload)
                result.samples[side].append(sample)
                print(f"  rep {repetition + 1} {side:8s} {sample.ms_per_batch:8.3f} ms/batch  "
                      f"workers' USS {sample.worker_uss_mb:6.0f} MB ({sample.workers} processes)",
                      flush=True)
    print()
    print(f"command: {command}")
    print(f"medians of {args.repeats} repetitions; ratio = torch ms/batch / mploader ms/batch; "
          f"load average {load_before[0]:.2f} before, {os.getloadavg()[0]:.2f} after; runtime "
          f"{time.perf_counter() - began:.0f} s")
    print()
    print_table(results)
    if args.json:
        with open(args.json, "w") as output:
            json.dump([{
                "name": result.workload.name, "what": result.workload.what,
                "ratio": result.ratio, "uss_fraction": result.uss_fraction,
                "target": result.workload.target, "uss_target": result.workload.uss_target,
                "samples": {side: [sample.__dict__ for sample in samples]
                            for side, samples in result.samples.items()},
            } for result in results], output, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
