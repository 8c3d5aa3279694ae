"""What a running ``python -m mploader top`` costs a loader: small_ints (2 workers, fork,
``batch_size=1``, int items) for one 20000-batch epoch, long enough to be published twice,
alternating runs with nobody watching and with a live ``top`` (in a private XDG_RUNTIME_DIR).

    python benchmarks/top_cost.py [--pairs 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

BATCHES, WARM = 20_000, 500

EPOCH = f"""
import time
import mploader
items = list(range({BATCHES + WARM}))
loader = mploader.DataLoader(items, batch_size=1, num_workers=2, multiprocessing_context="fork")
iterator = iter(loader)
for _ in range({WARM}):
    next(iterator)
start = time.perf_counter()
count = sum(1 for _ in iterator)
print((time.perf_counter() - start) / count * 1e6)
"""


def one_epoch(environment: dict[str, str]) -> float:
    """us/batch of one epoch in a fresh process."""
    result = subprocess.run([sys.executable, "-c", EPOCH], env=environment, check=True,
                            capture_output=True, text=True)
    return float(result.stdout.split()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--pairs", type=int, default=5)
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory() as runtime:
        environment = {**os.environ, "XDG_RUNTIME_DIR": runtime}
        alone, watched = [], []
        for _ in range(arguments.pairs):
            alone.append(one_epoch(environment))
            top = subprocess.Popen([sys.executable, "-m", "mploader", "top"], env=environment,
                                   stdout=subprocess.DEVNULL)
            try:
                time.sleep(2.0)  # started and watching
                watched.append(one_epoch(environment))
            finally:
                top.terminate()
                top.wait()
            time.sleep(3.5)  # the watching file goes stale: the next run is not watched
    differences = [b - a for a, b in zip(alone, watched, strict=True)]
    print(f"nobody watching: median {statistics.median(alone):.1f} us/batch "
          f"({', '.join(f'{value:.1f}' for value in alone)})")
    print(f"top running:     median {statistics.median(watched):.1f} us/batch "
          f"({', '.join(f'{value:.1f}' for value in watched)})")
    print(f"paired difference: median {statistics.median(differences):+.1f} us/batch")
    return 0


if __name__ == "__main__":
    sys.exit(main())
