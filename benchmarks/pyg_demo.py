"""GraphSAGE through PyG's NodeLoader on NebulaGraph: mploader 2 x T against torch's workers.

    PYTHONPATH=. .venv/bin/python benchmarks/pyg_demo.py [--latency-ms 5] [--epochs 2]

The bundled graphd serves the 4000-paper citation graph with a modelled latency per query.
Every row loads batches of 64 seed papers, fan-out [10, 10], through
``NebulaFeatureStore`` / ``NebulaGraphStore`` / ``NebulaNeighborSampler`` (2 GO + 1 FETCH per
batch), trains a two-layer ``SAGEConv`` model on them for one short epoch first (accuracy on
held-out papers), then times ``--epochs`` whole epochs per row, from ``iter()``:

* torch, N workers: ``torch_geometric.loader.NodeLoader`` on torch's iterator, each worker with
  its own session (the stores' per-process session);
* nebula-pyg style, N workers: the same, with a feature store that answers each attribute with
  its own FETCH (PyG's loop over ``_get_tensor``, as nebula-pyg does);
* mploader, 2 workers x T threads: ``NebulaNodeLoader`` after ``mploader.install()``.

Every batch's features and labels are checked against the graph held in memory (0 wrong).
Not part of the test suite.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from typing import Any

import torch
import torch.nn.functional as F
from torch_geometric.loader import NodeLoader
from torch_geometric.nn import SAGEConv

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
from nebula_testing.nebula_process import start_server_process

NODES, DIM, CLASSES = 4000, 64, 7
BATCH, FAN_OUT = 64, [10, 10]


class PerAttributeFeatureStore(NebulaFeatureStore):
    """nebula-pyg's way: only ``_get_tensor``, so PyG fetches attribute after attribute."""

    def _multi_get_tensor(self, attrs: Any) -> list[Any]:
        return [super(PerAttributeFeatureStore, self)._multi_get_tensor([attr])[0]
                for attr in attrs]


class Sage(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = SAGEConv(DIM, 64)
        self.second = SAGEConv(64, CLASSES)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        return self.second(F.relu(self.first(x, edge_index)), edge_index)


def make_loader(kind: str, stores: Any, sampler: Any, workers: int, threads: int,
                hooks: NebulaHooks, seeds: torch.Tensor) -> Any:
    common = dict(input_nodes=seeds, batch_size=BATCH, shuffle=True, num_workers=workers,
                  generator=torch.Generator().manual_seed(0))
    if kind == "mploader":
        return NebulaNodeLoader(stores, sampler, worker_threads=threads, worker_hooks=hooks,
                                **common)
    return NodeLoader(stores, sampler, **common)


def check(batch: Any, graph: citation.CitationGraph) -> int:
    ids = batch.n_id.numpy()
    wrong = not torch.equal(batch.x, torch.from_numpy(graph.features[ids]))
    return int(wrong or not torch.equal(batch.y, torch.from_numpy(graph.labels[ids])))


def train(stores: Any, sampler: Any, hooks: NebulaHooks, graph: citation.CitationGraph) -> float:
    model = Sage()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    train_ids, test_ids = torch.arange(0, 3200), torch.arange(3200, NODES)
    with mploader.install():
        for _ in range(2):
            for batch in make_loader("mploader", stores, sampler, 2, 8, hooks, train_ids):
                optimizer.zero_grad()
                out = model(batch.x, batch.edge_index)[: batch.batch_size]
                F.cross_entropy(out, batch.y[: batch.batch_size]).backward()
                optimizer.step()
        correct = 0
        with torch.no_grad():
            for batch in make_loader("mploader", stores, sampler, 2, 8, hooks, test_ids):
                out = model(batch.x, batch.edge_index)[: batch.batch_size]
                correct += int((out.argmax(1) == batch.y[: batch.batch_size]).sum())
    return correct / len(test_ids)


def measure(kind: str, stores: Any, sampler: Any, workers: int, threads: int,
            hooks: NebulaHooks, graph: citation.CitationGraph, epochs: int) -> tuple[float, int]:
    """Batches per second over whole epochs, timed from ``iter()`` (worker start included):
    a window shorter than the pipeline (up to 2 x 2 x 16 batches in flight) would time batches
    made before the clock started."""
    loader = make_loader(kind, stores, sampler, workers, threads, hooks, torch.arange(NODES))
    wrong, count = 0, 0
    with mploader.install() if kind == "mploader" else _nothing():
        start = time.perf_counter()
        for _ in range(epochs):
            for batch in loader:
                wrong += check(batch, graph)
                count += 1
        elapsed = time.perf_counter() - start
    return count / elapsed, wrong


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency-ms", type=float, default=5.0)
    parser.add_argument("--epochs", type=int, default=2, help="epochs (63 batches) per row")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-train", action="store_true")
    arguments = parser.parse_args()
    warnings.filterwarnings("ignore", category=UserWarning)
    graph = citation.make_citation_graph(NODES, DIM, CLASSES, seed=0)
    with start_server_process(preload="citation", nodes=NODES, feature_dim=DIM, classes=CLASSES,
                              seed=0, latency_ms=arguments.latency_ms) as server:
        hooks = NebulaHooks(server.address, space=citation.CITATION_SPACE)
        schema = homogeneous_schema(
            "paper", {"x": NodeAttribute("feat", FEATURES, DIM), "y": NodeAttribute("label", INT)},
            "cites", num_nodes=NODES,
        )
        stores = NebulaFeatureStore(schema, hooks), NebulaGraphStore(schema, hooks)
        per_attribute = PerAttributeFeatureStore(schema, hooks), stores[1]
        sampler = NebulaNeighborSampler(schema, hooks, FAN_OUT)
        if not arguments.no_train:
            start = time.perf_counter()
            accuracy = train(stores, sampler, hooks, graph)
            took = time.perf_counter() - start
            print(f"GraphSAGE (SAGEConv x 2), 2 epochs on 3200 papers: {accuracy:.0%} accuracy "
                  f"on 800 held out (chance {1 / CLASSES:.0%}), {took:.0f} s")
        rows = [("torch", workers, 1, stores) for workers in (1, 2, 4, 8)]
        rows += [("nebula-pyg style", workers, 1, per_attribute) for workers in (2, 8)]
        rows += [("mploader", 2, threads, stores) for threads in (4, 8, 16)]
        rates: dict[tuple[str, int, int], list[float]] = {}
        wrong = 0
        for _ in range(arguments.repeats):  # alternating rows, medians
            for kind, workers, threads, pair in rows:
                rate, bad = measure("mploader" if kind == "mploader" else "torch", pair, sampler,
                                    workers, threads, hooks, graph, arguments.epochs)
                rates.setdefault((kind, workers, threads), []).append(rate)
                wrong += bad
        torch8 = statistics.median(rates[("torch", 8, 1)])
        style2 = statistics.median(rates[("nebula-pyg style", 2, 1)])
        print(f"\n{arguments.latency_ms:g} ms per query, batch {BATCH}, fan-out {FAN_OUT}, "
              f"median of {arguments.repeats}, {arguments.epochs} epochs each; wrong: {wrong}")
        print(f"{'loader':34} {'batches/s':>9} {'vs torch 8':>10} {'vs nebula-pyg 2':>15}")
        for (kind, workers, threads), values in rates.items():
            rate = statistics.median(values)
            name = f"{kind}, {workers} workers" + (f" x {threads} threads" if threads > 1 else "")
            print(f"{name:34} {rate:9.1f} {rate / torch8:9.2f}x {rate / style2:14.2f}x")
        for store in (*stores, per_attribute[0], sampler):
            store.close()


if __name__ == "__main__":
    main()
