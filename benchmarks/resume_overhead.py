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
    parser.add_argument("--only", choices=WORKLOADS, help="one workload (default: both)")
    parser.add_argument("--control", action="store_true",
                        help="also run tracking off a second time (A'): the difference between "
                             "the two 'off' sides is this machine's noise at that moment")
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
    if args.control:
        sides.append(("off, again", functools.partial(mploader.DataLoader,
                                                      snapshot_every_n_steps=None)))
    rows = []
    print(f"load average before: {' '.join(f'{v:.2f}' for v in os.getloadavg())}", flush=True)
    for workload in versus.build_workloads(args.quick):
        if workload.name not in ((args.only,) if args.only else WORKLOADS):
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
        medians = {side: statistics.median(values) for side, values in figures.items()}
        rows.append((workload.name, medians))
        del dataset
        workload.cleanup()
    print(f"load average after: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    print()
    print("| workload | " + " | ".join(f"tracking {side}" for side, _ in sides) + " | target |")
    print("| --- |" + " --- |" * (len(sides) + 1))
    for name, medians in rows:
        off = medians["off"]
        cells = [f"{medians[side]:.4f} ms" + ("" if side == "off" else
                                             f" ({(medians[side] / off - 1) * 100:+.1f}%)")
                 for side, _ in sides]
        print(f"| {name} | " + " | ".join(cells) + " | on < 5% slower than off |")
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
