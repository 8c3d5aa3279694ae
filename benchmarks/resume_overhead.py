"""resume_overhead: mploader with resume state tracking on (the default) versus off, in one run.

    .venv/bin/python benchmarks/resume_overhead.py                 # small_ints and medium
    .venv/bin/python benchmarks/resume_overhead.py --repeats 9

The workloads, their sizes, the checking of every batch and the clock are those of
``benchmarks/versus.py`` (fork, non-persistent workers, warm-up batches untimed); instead of torch
against mploader it runs ``mploader.DataLoader(snapshot_every_n_steps=None)`` (tracking off, A)
``mploader.DataLoader()`` (tracking on, B) and ``snapshot_every_n_steps=16`` (C) alternately,
rotating the order (A B C, B C A, C A B, ...), and reports the medians and how much slower
tracking makes a batch (the plan's target: under 5%).  ``--split`` adds a fourth side, tracking
on with the workers' per-batch generator check patched out (fork workers inherit the patch), to
tell the workers' share of the cost from the main process's.  Not part of the test
suite.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import os
import statistics
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import versus  # the sibling script: its workloads and its clock

WORKLOADS = ("small_ints", "medium")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repeats", type=int, default=7, help="repetitions per side (default 7)")
    parser.add_argument("--quick", action="store_true", help="versus.py's smaller sizes")
    parser.add_argument("--split", action="store_true",
                        help="also run tracking on without the workers' generator check")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", message="This DataLoader will create")

    import mploader

    sides = [("off", functools.partial(mploader.DataLoader, snapshot_every_n_steps=None)),
             ("on", mploader.DataLoader),
             ("on, every 16", functools.partial(mploader.DataLoader, snapshot_every_n_steps=16))]
    if args.split:
        sides.append(("on, no worker check", mploader.DataLoader))
    rows = []
    print(f"load average before: {' '.join(f'{v:.2f}' for v in os.getloadavg())}", flush=True)
    for workload in versus.build_workloads(args.quick):
        if workload.name not in WORKLOADS:
            continue
        dataset = workload.make_dataset(workload.batches)
        expected = [workload.expected(number) for number in range(workload.batches)]
        figures: dict[str, list[float]] = {side: [] for side, _ in sides}
        for repetition in range(args.repeats):
            # Each side takes each place in the order equally often: a side that always ran
            # right after another (the same memory, the same caches) would carry an order effect.
            turn = repetition % len(sides)
            for side, loader_class in sides[turn:] + sides[:turn]:
                gc.collect()
                with _without_worker_check() if "no worker" in side else contextlib.nullcontext():
                    figure, _ = versus.run_throughput(loader_class, workload, dataset, expected)
                figures[side].append(figure)
                print(f"  {workload.name:11s} rep {repetition + 1:2d} tracking {side:19s} "
                      f"{figure:8.3f} ms/batch", flush=True)
        off, on = statistics.median(figures["off"]), statistics.median(figures["on"])
        every = statistics.median(figures["on, every 16"])
        unchecked = statistics.median(figures.get("on, no worker check") or [float("nan")])
        rows.append((workload.name, off, on, (on / off - 1) * 100, every,
                     (every / off - 1) * 100, unchecked))
        del dataset
        workload.cleanup()
    print(f"load average after: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    print()
    extra = " tracking on, no worker check |" if args.split else ""
    print("| workload | tracking off | tracking on | slower by | every 16 | slower by | target |"
          + extra)
    print("| --- | --- | --- | --- | --- | --- | --- |" + (" --- |" if args.split else ""))
    for name, off, on, slower, every, every_slower, unchecked in rows:
        cell = f" {unchecked:.3f} ms |" if args.split else ""
        print(f"| {name} | {off:.3f} ms | {on:.3f} ms | {slower:+.1f}% | {every:.3f} ms | "
              f"{every_slower:+.1f}% | < 5% |" + cell)
    return 0


@contextlib.contextmanager
def _without_worker_check():  # type: ignore[no-untyped-def]
    """Workers forked meanwhile send no generator state: what tracking costs without the check."""
    from mploader.worker.resume import StateRecorder

    original = StateRecorder.snapshot
    StateRecorder.snapshot = lambda self, fetcher: None  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        StateRecorder.snapshot = original  # type: ignore[method-assign]


if __name__ == "__main__":
    sys.exit(main())
