"""GraphSAGE through PyG's NodeLoader on NebulaGraph: mploader 2 x T against torch's workers.

    PYTHONPATH=. .venv/bin/python benchmarks/pyg_demo.py [--latency-ms 5] [--repeats 3]

The bundled graphd serves the citation graph (:data:`GRAPH`) with a modelled latency per query.
Every row loads batches of :data:`BATCH` seed papers, fan-out :data:`FAN_OUT`, through
``NebulaFeatureStore`` / ``NebulaGraphStore`` / ``NebulaNeighborSampler``, one epoch of
:data:`EPOCH_SEEDS` seeds per measurement, timed from ``iter()`` to the last batch (a window
shorter than the pipeline would time batches made before the clock started: 2 x 2 x 16 are in
flight):

* torch, N workers: ``torch_geometric.loader.NodeLoader`` on torch's iterator, each worker with
  its own session (the stores' per-process session): 2 ``GO`` + 1 ``FETCH`` per batch;
* nebula-pyg style, N workers: the same, with a feature store that, as nebula-pyg's, has only
  ``_get_tensor``: PyG's ``FeatureStore`` then loops over the attributes, one ``FETCH`` each
  (2 ``GO`` + 2 ``FETCH`` per batch).  nebula-pyg samples with PyG's in-memory sampler over a
  full edge scan, which needs pyg-lib; here that row samples on the server like the others;
* mploader, 2 workers x T threads: ``NebulaNodeLoader`` after ``mploader.install()``.

Every batch's features and labels are checked against the graph held in memory.  The rows
alternate and each figure is a median.  ``examples/demo.py`` (``make demo``) trains with the
same pipeline and prints this table with fewer repetitions.  Not part of the test suite.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import psutil
import torch
from torch_geometric.data import FeatureStore
from torch_geometric.loader import NodeLoader

import mploader
from mploader.integrations.nebula import NebulaHooks
from mploader.integrations.nebula.pyg import (
    FEATURES,
    INT,
    NebulaFeatureStore,
    NebulaGraphStore,
    NebulaNeighborSampler,
    NebulaNodeLoader,
    NodeAttribute,
    homogeneous_schema,
)
from nebula_testing import citation

# the synthetic citation graph the bundled server preloads (make_citation_graph's arguments)
GRAPH = {"num_nodes": 4000, "feature_dim": 64, "num_classes": 7, "seed": 0, "cites_per_node": 5}
BATCH = 32  # seed papers per batch, with FAN_OUT: nebula-pyg's own measurement (ogbn-arxiv)
FAN_OUT = [10, 10]
LATENCY_MS = 5.0  # the bundled server's modelled round trip per query
EPOCH_SEEDS = 4000  # seeds per measured epoch: 125 batches, long next to 64 in flight


class PerAttributeFeatureStore(NebulaFeatureStore):
    """nebula-pyg's way: no ``_multi_get_tensor`` of its own, so PyG's ``FeatureStore`` runs
    ``_get_tensor`` attribute after attribute, one ``FETCH`` each."""

    _multi_get_tensor = FeatureStore._multi_get_tensor

    def _get_tensor(self, attr: Any) -> Any:
        return NebulaFeatureStore._multi_get_tensor(self, [attr])[0]  # one attribute, one FETCH


@dataclass
class Pipeline:
    """The stores and sampler every row shares (each loader pickles its own copies)."""

    hooks: NebulaHooks
    graph: citation.CitationGraph
    stores: tuple[NebulaFeatureStore, NebulaGraphStore]
    per_attribute: tuple[NebulaFeatureStore, NebulaGraphStore]
    sampler: NebulaNeighborSampler

    def close(self) -> None:
        for closable in (*self.stores, self.per_attribute[0], self.sampler):
            closable.close()


def make_pipeline(hooks: NebulaHooks) -> Pipeline:
    dim = GRAPH["feature_dim"]
    schema = homogeneous_schema(
        citation.PAPER_TAG,
        {"x": NodeAttribute(citation.FEATURE_PROP, FEATURES, dim),
         "y": NodeAttribute(citation.LABEL_PROP, INT)},
        citation.CITES_EDGE,
        num_nodes=GRAPH["num_nodes"],
    )
    graph = citation.make_citation_graph(
        GRAPH["num_nodes"], dim, GRAPH["num_classes"], seed=GRAPH["seed"],
        cites_per_node=GRAPH["cites_per_node"],
    )
    graph_store = NebulaGraphStore(schema, hooks)
    return Pipeline(
        hooks,
        graph,
        (NebulaFeatureStore(schema, hooks), graph_store),
        (PerAttributeFeatureStore(schema, hooks), graph_store),
        NebulaNeighborSampler(schema, hooks, FAN_OUT),
    )


@dataclass(frozen=True)
class Row:
    """One loader configuration of the table."""

    kind: str  # "torch", "nebula-pyg style" or "mploader"
    workers: int
    threads: int = 1

    @property
    def name(self) -> str:
        threads = f" x {self.threads} threads" if self.kind == "mploader" else ""
        return f"{self.kind}, {self.workers} workers{threads}"


def make_loader(row: Row, pipeline: Pipeline, seeds: torch.Tensor, shuffle: bool = True) -> Any:
    common: dict[str, Any] = dict(
        input_nodes=seeds, batch_size=BATCH, shuffle=shuffle, num_workers=row.workers,
        generator=torch.Generator().manual_seed(0),
    )
    if row.kind == "mploader":
        return NebulaNodeLoader(pipeline.stores, pipeline.sampler, worker_threads=row.threads,
                                worker_hooks=pipeline.hooks, **common)
    stores = pipeline.per_attribute if row.kind == "nebula-pyg style" else pipeline.stores
    return NodeLoader(stores, pipeline.sampler, **common)


@contextlib.contextmanager
def iterator_of(row: Row) -> Iterator[None]:
    """mploader's rows run with ``mploader.install()``; torch's without it."""
    if row.kind == "mploader":
        with mploader.install():
            yield
    else:
        yield


def wrong_rows(batch: Any, graph: citation.CitationGraph) -> int:
    """1 when the batch's features or labels differ from the in-memory graph's."""
    ids = batch.n_id.numpy()
    same = torch.equal(batch.x, torch.from_numpy(graph.features[ids])) and torch.equal(
        batch.y, torch.from_numpy(graph.labels[ids])
    )
    return int(not same)


@dataclass
class Run:
    rate: float  # batches per second, from iter() to the last batch
    processes: int  # worker processes
    uss_mb: float  # summed over the worker processes, at the last batch
    cpu_ms: float  # per batch: worker processes + main process + server
    wrong: int  # batches whose features or labels differ from the graph's
    sessions_left: int  # sessions still open on the server after the loader ended


def open_sessions(hooks: NebulaHooks) -> int:
    """Sessions open on the server, not counting the one asking."""
    with contextlib.closing(hooks.open_session()) as admin:
        return len(admin.execute("SHOW SESSIONS").rows()) - 1


def _cpu_seconds(processes: Sequence[psutil.Process]) -> float:
    total = 0.0
    for process in processes:
        with contextlib.suppress(psutil.Error):
            total += sum(process.cpu_times()[:2])
    return total


def measure(row: Row, pipeline: Pipeline, server_pids: set[int]) -> Run:
    """One epoch of ``row``'s loader; workers' CPU and USS are read at its last batch, while
    they are still alive."""
    before_sessions = open_sessions(pipeline.hooks)
    me = psutil.Process()
    before = {child.pid for child in me.children(recursive=True)}
    server = [psutil.Process(pid) for pid in server_pids]
    loader = make_loader(row, pipeline, torch.arange(EPOCH_SEEDS) % GRAPH["num_nodes"])
    total = len(loader)
    wrong = count = 0
    workers: list[psutil.Process] = []
    with iterator_of(row):
        cpu_before = _cpu_seconds(server) + time.process_time()
        started = time.perf_counter()
        for batch in loader:
            wrong += wrong_rows(batch, pipeline.graph)
            count += 1
            if count == 1:
                workers = [c for c in me.children(recursive=True)
                           if c.pid not in before and c.pid not in server_pids]
            if count == total:  # workers are alive until the iterator sees the end
                elapsed = time.perf_counter() - started
                cpu = _cpu_seconds([*workers, *server]) + time.process_time() - cpu_before
                uss = 0
                for worker in workers:
                    with contextlib.suppress(psutil.Error):
                        uss += worker.memory_full_info().uss
    time.sleep(0.1)  # let exiting workers sign out
    left = open_sessions(pipeline.hooks) - before_sessions
    return Run(count / elapsed, len(workers), uss / 2**20, 1000 * cpu / count, wrong, left)


def default_rows(thread_counts: Sequence[int] = (4, 8, 16)) -> list[Row]:
    rows = [Row("torch", workers) for workers in (1, 2, 4, 8)]
    rows += [Row("nebula-pyg style", workers) for workers in (2, 8)]
    rows += [Row("mploader", 2, threads) for threads in thread_counts]
    return rows


def throughput_table(
    pipeline: Pipeline, rows: Sequence[Row], repeats: int, server_pids: set[int]
) -> list[str]:
    """Measure every row ``repeats`` times, alternating, and return the table's lines."""
    runs: dict[Row, list[Run]] = {row: [] for row in rows}
    for _ in range(repeats):
        for row in rows:
            runs[row].append(measure(row, pipeline, server_pids))
    rates = {row: statistics.median(run.rate for run in runs[row]) for row in rows}
    nebula_pyg = rates.get(Row("nebula-pyg style", 2), float("nan"))
    torch2 = rates.get(Row("torch", 2), float("nan"))
    torch8 = rates.get(Row("torch", 8), float("nan"))
    lines = [
        f"{'loader':<33} {'batches/s':>9} {'vs nebula-pyg 2':>15} {'vs torch 2':>10} "
        f"{'vs torch 8':>10} "
        f"{'processes':>9} {'worker MB':>9} {'CPU ms/batch':>12} {'sessions left':>13} "
        f"{'wrong':>5}"
    ]
    for row in rows:
        done = runs[row]
        uss = statistics.median(run.uss_mb for run in done)
        cpu = statistics.median(run.cpu_ms for run in done)
        wrong = sum(run.wrong for run in done)
        left = max(run.sessions_left for run in done)
        lines.append(
            f"{row.name:<33} {rates[row]:>9.1f} {rates[row] / nebula_pyg:>14.2f}x "
            f"{rates[row] / torch2:>9.2f}x {rates[row] / torch8:>9.2f}x {row.workers:>9} "
            f"{uss:>9.0f} {cpu:>12.1f} {left:>13} {wrong:>5}"
        )
    return lines


def table_heading(latency_ms: float, repeats: int) -> str:
    return (
        f"loader throughput: batches of {BATCH} seed papers, fan-out {FAN_OUT}, "
        f"{latency_ms:g} ms per query (2 GO + 1 FETCH per batch; nebula-pyg style: + 1 FETCH); "
        f"one epoch of {EPOCH_SEEDS // BATCH} batches from iter(), median of {repeats}.\n"
        "worker MB: USS summed over the worker processes; CPU ms/batch: worker processes + main "
        "process + server; wrong: batches whose features or labels differ from the graph's"
    )


def main() -> None:
    from nebula_testing.nebula_process import start_server_process

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency-ms", type=float, default=LATENCY_MS)
    parser.add_argument("--repeats", type=int, default=3)
    arguments = parser.parse_args()
    with start_server_process(
        preload="citation", nodes=GRAPH["num_nodes"], feature_dim=GRAPH["feature_dim"],
        classes=GRAPH["num_classes"], seed=GRAPH["seed"],
        cites_per_node=GRAPH["cites_per_node"], latency_ms=arguments.latency_ms,
    ) as server:
        assert server.process is not None
        pipeline = make_pipeline(NebulaHooks(server.address, space=citation.CITATION_SPACE))
        lines = throughput_table(pipeline, default_rows(), arguments.repeats,
                                 {server.process.pid})
        print(table_heading(arguments.latency_ms, arguments.repeats))
        print("\n".join(lines))
        pipeline.close()


if __name__ == "__main__":
    main()
