"""How many queries per second the bundled graphd server answers for 1, 16 and 64 sessions.

    PYTHONPATH=. .venv/bin/python benchmarks/nebula_server.py               # latency 0 and 5 ms
    PYTHONPATH=. .venv/bin/python benchmarks/nebula_server.py --latency-ms 0,10 --seconds 3

The query mix is the first demo's (before ``examples/demo.py`` trained through PyG):
``GO FROM <64 vids> OVER cites BIDIRECT`` and ``FETCH PROP ON paper <512 vids>`` (features and
labels) through nebula3's JSON interface, on the demo's 4000-node graph, every answer checked
against :mod:`nebula_testing.citation`.
Client sessions run on threads spread over 4 client processes (each session its own
connection), so the server sees ``sessions`` concurrent connections.  Reported per row:
queries/s, the mean time a query took as its client saw it, and the server process's CPU per
query and share of one core.  The server is single-threaded in effect (the GIL), so its ceiling
is ``1 / (CPU per query)``: the server is the bottleneck only when its core share nears 100%.
On the project's 2-core machines the client processes compete with the server for the cores.
Not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # nebula_testing is repo-only

from nebula_testing import citation
from nebula_testing.nebula_process import start_server_process

GRAPH = {"num_nodes": 4000, "feature_dim": 64, "num_classes": 7, "seed": 0}
CLIENT_PROCESSES = 4


def _edges_by_vertex(graph: citation.CitationGraph) -> dict[int, list[tuple[int, int]]]:
    """Each vertex's edges in both directions, as stored ``(src, dst)`` pairs."""
    edges: dict[int, list[tuple[int, int]]] = {vid: [] for vid in range(graph.num_nodes)}
    for src, dst in zip(graph.edge_src.tolist(), graph.edge_dst.tolist(), strict=True):
        edges[src].append((src, dst))
        edges[dst].append((src, dst))
    return edges


def _client(
    address: tuple[str, int], sessions: int, seconds: float, seed: int, queue: Any
) -> None:
    """One client process: ``sessions`` threads, each its own session, for ``seconds``."""
    from nebula3.Config import Config
    from nebula3.gclient.net import ConnectionPool

    graph = citation.make_citation_graph(
        GRAPH["num_nodes"], GRAPH["feature_dim"], GRAPH["num_classes"], GRAPH["seed"]
    )
    edges = _edges_by_vertex(graph)
    barrier = threading.Barrier(sessions)
    counts = [0] * sessions
    wrong = [0] * sessions
    busy = [0.0] * sessions

    def run(index: int) -> None:
        config = Config()
        config.max_connection_pool_size = 1
        pool = ConnectionPool()
        pool.init([address], config)
        session = pool.get_session("root", "nebula")
        session.execute(f"USE {citation.CITATION_SPACE}")
        rng = np.random.default_rng(seed * 1000 + index)
        barrier.wait()
        stop = time.perf_counter() + seconds
        while time.perf_counter() < stop:
            started = time.perf_counter()
            if counts[index] % 2 == 0:
                vids = rng.choice(graph.num_nodes, 64, replace=False)
                answer = json.loads(
                    session.execute_json(
                        f"GO FROM {', '.join(map(str, vids.tolist()))} OVER cites BIDIRECT "
                        "YIELD src(edge) AS src, dst(edge) AS dst"
                    )
                )
                got = {tuple(entry["row"]) for entry in answer["results"][0].get("data", [])}
                ok = got == {edge for vid in vids.tolist() for edge in edges[vid]}
            else:
                vids = rng.choice(graph.num_nodes, 512, replace=False)
                answer = json.loads(
                    session.execute_json(
                        f"FETCH PROP ON paper {', '.join(map(str, vids.tolist()))} "
                        "YIELD id(vertex) AS vid, paper.label AS label"
                    )
                )
                rows = [entry["row"] for entry in answer["results"][0].get("data", [])]
                ok = len(rows) == len(vids) and all(
                    graph.labels[vid] == label for vid, label in rows
                )
            busy[index] += time.perf_counter() - started
            counts[index] += 1
            wrong[index] += 0 if ok else 1
        session.release()
        pool.close()

    threads = [threading.Thread(target=run, args=(index,)) for index in range(sessions)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    queue.put((sum(counts), sum(wrong), sum(busy)))


def measure(address: tuple[str, int], server_pid: int, sessions: int, seconds: float) -> dict:
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    processes = min(CLIENT_PROCESSES, sessions)
    shares = [sessions // processes + (i < sessions % processes) for i in range(processes)]
    server = psutil.Process(server_pid)
    clients = [
        context.Process(target=_client, args=(address, share, seconds, seed, queue))
        for seed, share in enumerate(shares)
    ]
    for client in clients:
        client.start()
    time.sleep(min(1.0, seconds / 4))  # connections and sign-ins happen before the barrier
    cpu_before = sum(server.cpu_times()[:2])
    started = time.perf_counter()
    results = [queue.get() for _ in clients]
    wall = time.perf_counter() - started
    cpu = sum(server.cpu_times()[:2]) - cpu_before
    for client in clients:
        client.join()
    queries = sum(result[0] for result in results)
    return {
        "sessions": sessions,
        "queries_per_s": queries / seconds,
        "mean_query_ms": 1000 * sum(result[2] for result in results) / max(queries, 1),
        "server_cpu_ms_per_query": 1000 * cpu / max(queries, 1),
        "server_core_share": cpu / wall,
        "wrong": sum(result[1] for result in results),
        "queries": queries,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency-ms", default="0,5", help="comma-separated latencies")
    parser.add_argument("--sessions", default="1,16,64")
    parser.add_argument("--seconds", type=float, default=4.0)
    arguments = parser.parse_args()
    print(f"{'latency':>8} {'sessions':>8} {'queries/s':>10} {'ms/query':>9} "
          f"{'server CPU ms/query':>20} {'server core':>12} {'wrong':>6}")
    for latency in [float(text) for text in arguments.latency_ms.split(",")]:
        with start_server_process(
            preload="citation",
            nodes=GRAPH["num_nodes"],
            feature_dim=GRAPH["feature_dim"],
            classes=GRAPH["num_classes"],
            seed=GRAPH["seed"],
            latency_ms=latency,
        ) as server:
            assert server.process is not None
            for sessions in [int(text) for text in arguments.sessions.split(",")]:
                row = measure((server.host, server.port), server.process.pid, sessions,
                              arguments.seconds)
                print(f"{latency:>6.1f}ms {sessions:>8} {row['queries_per_s']:>10.0f} "
                      f"{row['mean_query_ms']:>9.2f} {row['server_cpu_ms_per_query']:>20.2f} "
                      f"{row['server_core_share']:>11.0%} {row['wrong']:>6}", flush=True)


if __name__ == "__main__":
    main()
