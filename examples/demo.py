"""mploader's main demonstration: a GNN minibatch pipeline fed from NebulaGraph.

A deterministic synthetic citation graph lives in NebulaGraph (by default the repository's
graphd-compatible server, started here in the background; set ``NEBULA_ADDR=host:port`` and
``NEBULA_USER``/``NEBULA_PASSWORD``/``NEBULA_SPACE`` for a real one, already loaded with
``nebula_testing.citation``'s schema and data).  Each DataLoader worker samples two-hop
neighbourhoods of its seed nodes (``GO FROM ... OVER cites``) and fetches their features and
labels (``FETCH PROP ON paper ...``) through its own session, then a small GraphSAGE-style model
trains on the batches.

The same pipeline runs with ``torch.utils.data.DataLoader`` (each process opening its own session
lazily, as a careful user would write it, with ``mploader.ProcessLocal``) and with
``mploader.DataLoader`` (``NebulaHooks``: one session per worker, closed at worker exit), for 1,
2 and 4 workers, and prints loader throughput and the sessions each left open on the server.

Run it with ``make demo`` (or ``python examples/demo.py [--quick]``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

import mploader
from mploader.integrations.nebula import NebulaFeatureStore, NebulaHooks, parse_addresses
from nebula_testing import citation

GRAPH = {"num_nodes": 4000, "feature_dim": 64, "num_classes": 7, "seed": 0}
BATCH_SEEDS = 64
FAN_OUT = (10, 5)


class NeighbourhoodBatches(Dataset):
    """Item ``i``: the two-hop sampled neighbourhood of the ``i``-th block of seed nodes.

    Returns ``x`` (features of every sampled node), ``y`` (their labels), ``edge_index`` (local
    ids, messages flow neighbour -> node), and ``num_seeds`` (the first nodes are the seeds).
    """

    def __init__(self, store: NebulaFeatureStore, num_nodes: int, seed: int = 0) -> None:
        self.store = store
        order = np.random.default_rng(seed).permutation(num_nodes)
        self.blocks = [order[i : i + BATCH_SEEDS] for i in range(0, num_nodes, BATCH_SEEDS)]

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, index: int) -> dict[str, Any]:
        rng = np.random.default_rng(index)  # the same neighbourhood whichever worker samples it
        seeds = self.blocks[index]
        nodes = {int(v): i for i, v in enumerate(seeds)}
        edges: list[tuple[int, int]] = []
        frontier = seeds
        for fan_out in FAN_OUT:
            src, dst = self.store.neighbors(frontier)
            next_frontier = []
            for node in np.unique(src.numpy()):
                cited = dst.numpy()[src.numpy() == node]
                if len(cited) > fan_out:
                    cited = rng.choice(cited, fan_out, replace=False)
                for neighbour in cited.tolist():
                    if neighbour not in nodes:
                        nodes[neighbour] = len(nodes)
                        next_frontier.append(neighbour)
                    edges.append((nodes[neighbour], nodes[int(node)]))
            frontier = np.array(next_frontier, dtype=np.int64)
        vids = np.fromiter(nodes.keys(), dtype=np.int64, count=len(nodes))
        x, y = self.store.fetch(vids)
        edge_index = torch.tensor(edges, dtype=torch.int64).reshape(-1, 2).t().contiguous()
        return {"x": x, "y": y, "edge_index": edge_index, "num_seeds": len(seeds)}


class SageLayer(nn.Module):
    def __init__(self, width_in: int, width_out: int) -> None:
        super().__init__()
        self.own = nn.Linear(width_in, width_out)
        self.neighbours = nn.Linear(width_in, width_out)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        source, target = edge_index
        summed = torch.zeros_like(x).index_add_(0, target, x[source])
        count = torch.zeros(len(x)).index_add_(0, target, torch.ones(len(target))).clamp(min=1)
        return self.own(x) + self.neighbours(summed / count[:, None])


class Sage(nn.Module):
    def __init__(self, features: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.first = SageLayer(features, hidden)
        self.second = SageLayer(hidden, classes)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        return self.second(torch.relu(self.first(x, edge_index)), edge_index)


# -- the two ways to give each process a session -------------------------------------------------


def _open_session(hooks: NebulaHooks) -> Any:
    return hooks.open_session()


def _close_session(session: Any) -> None:
    session.close()


def torch_store(hooks: NebulaHooks) -> NebulaFeatureStore:
    """For torch's DataLoader: a per-process session, built lazily and keyed on the pid."""
    import functools

    local = mploader.ProcessLocal(functools.partial(_open_session, hooks), close=_close_session)
    return NebulaFeatureStore("paper", "feat", "label", GRAPH["feature_dim"], edge="cites",
                              session=local.get)


def mploader_store() -> NebulaFeatureStore:
    """For mploader: the worker's session, from the loader's NebulaHooks."""
    return NebulaFeatureStore("paper", "feat", "label", GRAPH["feature_dim"], edge="cites")


def open_sessions(hooks: NebulaHooks) -> int:
    with contextlib.closing(hooks.open_session()) as admin:
        return len(admin.execute("SHOW SESSIONS").rows()) - 1  # not counting this one


def measure(make_loader: Any, batches: int) -> float:
    """Loader throughput in batches per second over ``batches`` (after one warm-up batch)."""
    loader = make_loader()
    iterator = iter(loader)
    next(iterator)
    started = time.perf_counter()
    count = 0
    for _ in iterator:
        count += 1
        if count == batches:
            break
    rate = count / (time.perf_counter() - started)
    del iterator
    return rate


@contextlib.contextmanager
def nebula_target() -> Iterator[tuple[str, str, str, str]]:
    address = os.environ.get("NEBULA_ADDR")
    if address:
        yield (address, os.environ.get("NEBULA_USER", "root"),
               os.environ.get("NEBULA_PASSWORD", "nebula"),
               os.environ.get("NEBULA_SPACE", citation.CITATION_SPACE))
        return
    from nebula_testing.nebula_process import start_server_process

    with start_server_process(preload="citation", space=citation.CITATION_SPACE,
                              nodes=GRAPH["num_nodes"], feature_dim=GRAPH["feature_dim"],
                              classes=GRAPH["num_classes"], seed=GRAPH["seed"]) as server:
        print(f"started the repository's graphd-compatible server at {server.address}")
        yield server.address, "root", "nebula", citation.CITATION_SPACE


def train(hooks: NebulaHooks, steps: int) -> None:
    model = Sage(GRAPH["feature_dim"], 64, GRAPH["num_classes"])
    optimiser = torch.optim.Adam(model.parameters(), lr=0.01)
    loader = mploader.DataLoader(NeighbourhoodBatches(mploader_store(), GRAPH["num_nodes"]),
                                 batch_size=None, shuffle=True, num_workers=2,
                                 worker_hooks=hooks, generator=torch.Generator().manual_seed(0))
    losses, correct, seen = [], 0, 0
    for step, batch in enumerate(loader):
        if step == steps:
            break
        logits = model(batch["x"], batch["edge_index"])[: batch["num_seeds"]]
        labels = batch["y"][: batch["num_seeds"]]
        loss = nn.functional.cross_entropy(logits, labels)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
        if step >= steps // 2:
            correct += int((logits.argmax(1) == labels).sum())
            seen += len(labels)
    print(f"trained {steps} steps: loss {losses[0]:.3f} -> {losses[-1]:.3f}, "
          f"accuracy on the second half's seeds {correct / max(seen, 1):.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer batches (a smoke run)")
    arguments = parser.parse_args()
    # Four workers on a two-core machine is deliberate here (the work is waiting on queries).
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    batches = 8 if arguments.quick else 30
    worker_counts = (1, 2) if arguments.quick else (1, 2, 4)
    with nebula_target() as (address, user, password, space):
        hooks = NebulaHooks(parse_addresses(address), user, password, space)
        train(hooks, steps=10 if arguments.quick else 30)
        print(f"\nloader throughput, {batches} batches of {BATCH_SEEDS} seeds with fan-out "
              f"{list(FAN_OUT)} (batches/s, median of 3):")
        print(f"{'workers':>8} {'torch':>8} {'mploader':>9} {'ratio':>6}   sessions left open "
              "(torch, mploader)")
        for workers in worker_counts:
            rates: dict[str, list[float]] = {"torch": [], "mploader": []}
            left: dict[str, int] = {}
            for _ in range(3):
                before = open_sessions(hooks)
                rates["torch"].append(measure(lambda w=workers: torch.utils.data.DataLoader(
                    NeighbourhoodBatches(torch_store(hooks), GRAPH["num_nodes"]),
                    batch_size=None, num_workers=w), batches))
                time.sleep(0.2)
                left["torch"] = open_sessions(hooks) - before
                before = open_sessions(hooks)
                rates["mploader"].append(measure(lambda w=workers: mploader.DataLoader(
                    NeighbourhoodBatches(mploader_store(), GRAPH["num_nodes"]),
                    batch_size=None, num_workers=w, worker_hooks=hooks), batches))
                left["mploader"] = open_sessions(hooks) - before
            torch_rate = statistics.median(rates["torch"])
            ours = statistics.median(rates["mploader"])
            print(f"{workers:>8} {torch_rate:>8.1f} {ours:>9.1f} {ours / torch_rate:>5.2f}x"
                  f"   {left['torch']}, {left['mploader']}")
        print("\ntorch's workers end without closing their sessions (the server keeps them until "
              "they time out);\nmploader closes each worker's session at exit through "
              "NebulaHooks.close_session.")


if __name__ == "__main__":
    main()
