"""mploader's main demonstration: GraphSAGE with PyTorch Geometric, fed from NebulaGraph.

A deterministic synthetic citation graph lives in NebulaGraph (by default the repository's
graphd-compatible server, started here in the background with a modelled network latency per
query, as a remote cluster would answer; set ``NEBULA_ADDR=host:port`` and
``NEBULA_USER``/``NEBULA_PASSWORD``/``NEBULA_SPACE`` for a real one, already loaded with
``nebula_testing.citation``'s schema and data).  PyG reads it through its remote backend,
``data=(feature_store, graph_store)``: ``NebulaFeatureStore``, ``NebulaGraphStore`` and
``NebulaNeighborSampler`` (two-hop neighbourhoods sampled on the server, one ``GO`` per hop, no
pyg-lib), each batch's features and labels in one ``FETCH``.  A two-layer GraphSAGE model
(``torch_geometric.nn.SAGEConv``) trains on the training papers through ``NebulaNodeLoader``
on mploader's workers (2 processes x 8 fetch threads, one session per thread) and is scored on
held-out papers.

Then the same loaders run side by side (``benchmarks/pyg_demo.py``): PyG's ``NodeLoader`` on
torch's iterator with 1, 2, 4 and 8 workers; the same in nebula-pyg's way (one ``FETCH`` per
attribute); and ``NebulaNodeLoader`` on mploader's iterator with 2 workers x T fetch threads.
The table gives loader throughput, the worker processes' total memory (USS), CPU per batch, the
sessions each run left open on the server and the batches that differed from the graph.

Run it with ``make demo`` (or ``python examples/demo.py [--quick] [--latency-ms 5]``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
import warnings
from collections.abc import Iterator

import numpy as np
import torch
import torch.nn.functional as F
from torch_geometric.nn import SAGEConv

import mploader
from benchmarks.pyg_demo import (
    BATCH,
    FAN_OUT,
    GRAPH,
    LATENCY_MS,
    Pipeline,
    Row,
    default_rows,
    make_loader,
    make_pipeline,
    table_heading,
    throughput_table,
)
from mploader.integrations.nebula import NebulaHooks, parse_addresses
from nebula_testing import citation

TRAIN_SHARE = 0.6
TRAIN_THREADS = 8  # fetch threads per worker process while training


class Sage(torch.nn.Module):
    """Two ``SAGEConv`` layers (mean aggregation): PyG's own, no compiled extension needed."""

    def __init__(self, features: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.first = SAGEConv(features, hidden)
        self.second = SAGEConv(hidden, classes)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        hidden = F.dropout(F.relu(self.first(x, edge_index)), 0.5, self.training)
        return self.second(hidden, edge_index)


def split_seeds() -> tuple[torch.Tensor, torch.Tensor]:
    order = torch.from_numpy(np.random.default_rng(GRAPH["seed"]).permutation(GRAPH["num_nodes"]))
    cut = int(TRAIN_SHARE * len(order))
    return order[:cut], order[cut:]


def train(pipeline: Pipeline, epochs: int) -> None:
    """Train on the training papers, score the held-out ones: every batch from the server."""
    train_seeds, test_seeds = split_seeds()
    torch.manual_seed(0)
    model = Sage(GRAPH["feature_dim"], 64, GRAPH["num_classes"])
    optimiser = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    row = Row("mploader", 2, TRAIN_THREADS)
    started = time.perf_counter()
    first_loss = last_loss = 0.0
    train_loader = make_loader(row, pipeline, train_seeds)  # reshuffled every epoch
    with mploader.install():  # PyG's loaders iterate on mploader's workers
        for _ in range(epochs):
            model.train()
            losses = []
            for batch in train_loader:
                logits = model(batch.x, batch.edge_index)[: batch.batch_size]
                loss = F.cross_entropy(logits, batch.y[: batch.batch_size])
                optimiser.zero_grad()
                loss.backward()
                optimiser.step()
                losses.append(loss.item())
            first_loss = first_loss or losses[0]
            last_loss = statistics.mean(losses)
        model.eval()
        correct = 0
        with torch.no_grad():
            for batch in make_loader(row, pipeline, test_seeds, shuffle=False):
                logits = model(batch.x, batch.edge_index)[: batch.batch_size]
                correct += int((logits.argmax(1) == batch.y[: batch.batch_size]).sum())
    print(f"GraphSAGE (SAGEConv x 2) trained {epochs} epochs on {len(train_seeds)} papers in "
          f"{time.perf_counter() - started:.1f} s: loss {first_loss:.2f} -> {last_loss:.2f}; "
          f"accuracy on {len(test_seeds)} held-out papers {correct / len(test_seeds):.1%} "
          f"(chance {1 / GRAPH['num_classes']:.1%}; 10% of labels are noise)")


@contextlib.contextmanager
def nebula_target(latency_ms: float) -> Iterator[tuple[NebulaHooks, set[int]]]:
    """The hooks of the graph's space and the server's pid (none for a real NebulaGraph)."""
    address = os.environ.get("NEBULA_ADDR")
    if address:
        print(f"NebulaGraph at {address} (NEBULA_ADDR); no latency is added")
        yield NebulaHooks(parse_addresses(address), os.environ.get("NEBULA_USER", "root"),
                          os.environ.get("NEBULA_PASSWORD", "nebula"),
                          os.environ.get("NEBULA_SPACE", citation.CITATION_SPACE)), set()
        return
    from nebula_testing.nebula_process import start_server_process

    with start_server_process(preload="citation", space=citation.CITATION_SPACE,
                              nodes=GRAPH["num_nodes"], feature_dim=GRAPH["feature_dim"],
                              classes=GRAPH["num_classes"], seed=GRAPH["seed"],
                              cites_per_node=GRAPH["cites_per_node"],
                              latency_ms=latency_ms) as server:
        assert server.process is not None
        print(f"started the repository's graphd-compatible server at {server.address}, "
              f"modelling a remote cluster: {latency_ms:g} ms of latency per query "
              "(--latency-ms 0 turns it off)")
        yield NebulaHooks(server.address, space=citation.CITATION_SPACE), {server.process.pid}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rows and runs (a smoke run)")
    parser.add_argument("--latency-ms", type=float, default=LATENCY_MS,
                        help=f"the bundled server's latency per query (default {LATENCY_MS:g})")
    arguments = parser.parse_args()
    torch.set_num_threads(1)  # the model is small; the cores are for the loaders and the server
    # More workers than cores is deliberate here (the work is waiting on queries).
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    started = time.perf_counter()
    with nebula_target(arguments.latency_ms) as (hooks, server_pids):
        pipeline = make_pipeline(hooks)
        train(pipeline, epochs=1 if arguments.quick else 3)
        rows = default_rows((16,) if arguments.quick else (4, 8, 16))
        if arguments.quick:
            rows = [row for row in rows if row.workers == 2 or row.kind == "torch"]
        repeats = 1 if arguments.quick else 3
        lines = throughput_table(pipeline, rows, repeats, server_pids)
        pipeline.close()
    print()
    print(table_heading(arguments.latency_ms, repeats))
    print("\n".join(lines))
    print(f"\nEach batch waits for 3 queries in a row ({3 * arguments.latency_ms:g} ms; nebula-pyg "
          f"style 4): concurrency hides that wait, until the cores are full (at the CPU per batch "
          f"above, {os.cpu_count()} cores, less what else runs on the machine).\nSessions: each "
          "store and the sampler open one per process (torch's workers sign theirs out when they "
          "exit);\nmploader's fetch threads share each worker's sessions through NebulaHooks, "
          "signed out at worker exit.")
    print(f"batches of {BATCH} seed papers, fan-out {FAN_OUT}; "
          f"demo finished in {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
