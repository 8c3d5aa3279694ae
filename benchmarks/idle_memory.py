"""What memory that sat free costs to use again, on this machine (not part of the test suite).

    .venv/bin/python benchmarks/idle_memory.py [--rounds N] [--mb MB]

A dataset item of ``--mb`` MB (``np.full``, as ``benchmarks/versus.py``'s large items) is made
after the process slept for each gap, with the previous item freed just before the sleep; then
once more in each of ``--rounds`` new processes (forked after the same sleep). Medians and
ranges of ``--rounds`` rounds are printed, each row's against the back-to-back one.

Where free memory stays backed, the rows should cost about the same: the kernel zeroes the
pages either way. On a VM with free page reporting (virtio-balloon), memory the guest left free
for a while has been handed back to the host, and touching it again takes the host's faults as
well: the rows grow with the gap. A new worker of a loader with ``persistent_workers=False``
makes its first items after such a gap (the previous epoch's end, the consumer's last batches,
``iter()``), while a persistent worker makes them back to back in memory its heap kept; this is
the cost the non-persistent row of ``benchmarks/versus.py`` carries on such a VM, in the
dataset's own arrays, which the loader does not allocate (``docs/performance.md``).
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time
from multiprocessing.connection import Connection

import numpy as np

GAPS_SECONDS = (0.0, 0.1, 0.3, 1.0, 3.0)


def make_item_ms(count: int) -> float:
    """Milliseconds to make one item of ``count`` float64s, as a dataset would."""
    started = time.perf_counter()
    item = np.full(count, 1.0)
    elapsed = (time.perf_counter() - started) * 1000
    del item
    return elapsed


def _new_process_item(count: int, reply: Connection) -> None:
    reply.send(make_item_ms(count))
    reply.close()


def in_a_new_process(count: int) -> float:
    """Milliseconds for a forked child's first item."""
    fork = multiprocessing.get_context("fork")
    ours, theirs = fork.Pipe(duplex=False)
    child = fork.Process(target=_new_process_item, args=(count, theirs))
    child.start()
    theirs.close()
    elapsed = float(ours.recv())
    child.join()
    return elapsed


def describe(times: list[float], baseline: float) -> str:
    median = statistics.median(times)
    return (f"median {median:8.1f} ms  range {min(times):7.1f}-{max(times):7.1f} ms  "
            f"{median / baseline:5.2f}x back to back")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="items per row (default 5)")
    parser.add_argument("--mb", type=int, default=600, help="item size in MB (default 600)")
    args = parser.parse_args()
    count = args.mb * 1_000_000 // 8
    make_item_ms(count)  # the process's own first item: not counted
    same: dict[float, list[float]] = {gap: [] for gap in GAPS_SECONDS}
    fresh: list[float] = []
    for _ in range(args.rounds):  # rows interleaved, so that drift hits all of them alike
        for gap in GAPS_SECONDS:
            time.sleep(gap)
            same[gap].append(make_item_ms(count))
        make_item_ms(count)
        time.sleep(GAPS_SECONDS[-1])
        fresh.append(in_a_new_process(count))
    baseline = statistics.median(same[0.0])
    print(f"{args.mb} MB items (np.full), {args.rounds} rounds, rows interleaved")
    for gap in GAPS_SECONDS:
        print(f"  same process, after {gap:3.1f} s free:   {describe(same[gap], baseline)}")
    print(f"  new process, after {GAPS_SECONDS[-1]:3.1f} s free:    {describe(fresh, baseline)}")


if __name__ == "__main__":
    main()
