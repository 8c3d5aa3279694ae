"""A loader iterating slowly in its own process, for ``python -m mploader top`` to see.

``python -m tests.lifecycle.top_loader DIR``: prints ``pids MAIN WORKER0 WORKER1`` once the
first batch is in, iterates until ``DIR/stop`` exists, then drops the loader, prints ``ended`` and
waits for ``DIR/exit`` before exiting.
"""

from __future__ import annotations

import gc
import os
import sys
import time
from pathlib import Path

import mploader
from tests.lifecycle.faulty import Slow


def main(control: Path) -> None:
    loader = mploader.DataLoader(Slow(length=100_000, sleep=0.02), batch_size=2, num_workers=2,
                                 multiprocessing_context="fork")
    iterator = iter(loader)
    next(iterator)
    workers = " ".join(str(process.pid) for process in iterator._workers)
    print(f"pids {os.getpid()} {workers}", flush=True)
    while not (control / "stop").exists():
        next(iterator)
        time.sleep(0.01)  # a training step
    del iterator, loader
    gc.collect()
    print("ended", flush=True)
    while not (control / "exit").exists():
        time.sleep(0.02)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
