"""Sessions per host and throughput at a real job's scale, against the bundled graphd with
graphd's defaults (300 sessions per user and IP).

mploader: R ranks x W workers x T fetch threads (NebulaHooks: pooled sessions under the host's
budget).  torch: R ranks x W' workers, one session per worker (a ProcessLocal NebulaSession: the
usual per-worker pattern), at W' = the most workers the cap lets torch run (``--torch-workers``,
default 4: the cap would let torch run 37 per rank with 8 ranks, 296 processes, more than a
2-core machine can fork and hold).  Every item runs one
statement that waits ``--latency-ms`` on the server (a remote graphd).  Prints one row per loader:
items/s (median of ``--repeat`` runs, alternating), the session high-water mark on the server,
failed ranks and sessions left on graphd after the ranks exited (torch workers never sign out
a per-worker session: each leaks until graphd's 8 h idle timeout; the benchmark kills them
between runs so that every run starts from an empty server).

    python benchmarks/nebula_scale.py --ranks 8 --workers 4 --threads 16 --latency-ms 200
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset, DistributedSampler

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mploader
from mploader.integrations.nebula import NebulaHooks, NebulaSession
from nebula_testing.nebula_process import start_server_process


class OneQuery(Dataset):
    """Item i: one ``YIELD i`` through ``session()`` (worker_session, or a per-process one)."""

    def __init__(self, length: int, local: Any = None) -> None:
        self.length = length
        self.local = local

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> int:
        session = self.local.get() if self.local is not None else mploader.worker_session()
        answer = session.execute(f"YIELD {index} AS q").rows()[0].values[0].get_iVal()
        assert answer == index
        return index


def _rank(kind: str, address: str, rank: int, ranks: int, workers: int, threads: int,
          items: int, results: Any) -> None:
    hooks = NebulaHooks([address])
    try:
        if kind == "mploader":
            dataset = OneQuery(items)
            sampler = DistributedSampler(dataset, ranks, rank, shuffle=False)
            loader: Any = mploader.DataLoader(
                dataset, batch_size=None, sampler=sampler, num_workers=workers,
                worker_threads=threads, worker_hooks=hooks, multiprocessing_context="fork")
        else:
            local = mploader.ProcessLocal(hooks.open_session, close=NebulaSession.close)
            dataset = OneQuery(items, local)
            sampler = DistributedSampler(dataset, ranks, rank, shuffle=False)
            loader = torch.utils.data.DataLoader(
                dataset, batch_size=None, sampler=sampler, num_workers=workers,
                multiprocessing_context="fork")
        seen = list(loader)
        results.put((rank, len(seen), ""))
    except BaseException as error:
        results.put((rank, 0, f"{type(error).__name__}: {str(error)[:200]}"))


def _count_sessions(admin: Any) -> int:
    result = admin.execute("SHOW SESSIONS")
    return len(result.column_values("SessionId")) - 1  # not the admin's own


def run(kind: str, address: str, admin: Any, ranks: int, workers: int, threads: int,
        items: int) -> dict[str, Any]:
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    high_water = [0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.05):
            with contextlib.suppress(Exception):
                high_water[0] = max(high_water[0], _count_sessions(admin))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.perf_counter()
    processes = [
        context.Process(target=_rank, args=(kind, address, rank, ranks, workers, threads, items,
                                             results))
        for rank in range(ranks)
    ]
    for process in processes:
        process.start()
    outcomes = [results.get(timeout=600) for _ in processes]
    elapsed = time.perf_counter() - started
    for process in processes:
        process.join(60)
    stop.set()
    sampler.join()
    time.sleep(0.5)
    left = _count_sessions(admin)
    _kill_leftovers(admin)  # so the next run starts from an empty server
    return {
        "items_per_s": sum(count for _, count, _ in outcomes) / elapsed,
        "high_water": high_water[0],
        "failed": [error for _, _, error in outcomes if error],
        "left": left,
    }


def _kill_leftovers(admin: Any) -> None:
    for value in admin.execute("SHOW SESSIONS").column_values("SessionId"):
        if value.as_int() != admin._session_id:
            admin.execute(f"KILL SESSION {value.as_int()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--torch-workers", type=int, default=4)
    parser.add_argument("--latency-ms", type=float, default=200.0)
    parser.add_argument("--items", type=int, default=4096, help="per epoch, over all ranks")
    parser.add_argument("--repeat", type=int, default=3)
    arguments = parser.parse_args()
    from nebula3.Config import Config
    from nebula3.gclient.net import ConnectionPool

    with start_server_process(latency_ms=arguments.latency_ms) as server:
        pool = ConnectionPool()
        pool.init([(server.host, server.port)], Config())
        admin = pool.get_session("root", "nebula")
        rows: dict[str, list[dict[str, Any]]] = {"mploader": [], "torch": []}
        shapes = {
            "mploader": (arguments.workers, arguments.threads),
            "torch": (arguments.torch_workers, 1),
        }
        for _ in range(arguments.repeat):
            for kind in ("torch", "mploader"):
                workers, threads = shapes[kind]
                rows[kind].append(run(kind, server.address, admin, arguments.ranks, workers,
                                      threads, arguments.items))
        admin.release()
        pool.close()
    print(f"graphd: bundled server, graphd's defaults (cap 300 per user and IP), "
          f"{arguments.latency_ms:g} ms per statement; {arguments.items} items per epoch over "
          f"{arguments.ranks} ranks; median of {arguments.repeat}")
    print("| loader | ranks x workers x threads | sessions on graphd (high-water) | items/s | "
          "failed ranks | sessions left |")
    print("| --- | --- | --- | --- | --- | --- |")
    for kind, runs in rows.items():
        workers, threads = shapes[kind]
        rate = statistics.median(r["items_per_s"] for r in runs)
        high = max(r["high_water"] for r in runs)
        failed = sum(len(r["failed"]) for r in runs)
        left = max(r["left"] for r in runs)
        print(f"| {kind} | {arguments.ranks} x {workers} x {threads} | {high} | {rate:.1f} | "
              f"{failed} | {left} |")
        for r in runs:
            for error in r["failed"]:
                print(f"    {kind}: {error}")


if __name__ == "__main__":
    main()
