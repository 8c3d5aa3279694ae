"""mploader's main demonstration: a GNN minibatch pipeline fed from NebulaGraph.

A deterministic synthetic citation graph lives in NebulaGraph (by default the repository's
graphd-compatible server, started here in the background with a modelled network latency per
query, as a remote cluster would answer; set ``NEBULA_ADDR=host:port`` and
``NEBULA_USER``/``NEBULA_PASSWORD``/``NEBULA_SPACE`` for a real one, already loaded with
``nebula_testing.citation``'s schema and data).  Each DataLoader item is one minibatch: a block
of seed papers, their two-hop neighbourhood sampled with numpy (one ``GO FROM ... OVER cites``
per hop for the whole frontier) and the features and labels of every sampled paper (one
``FETCH PROP ON paper ...``), all through the fetching thread's own session.  A small
GraphSAGE-style model trains on the training papers and is scored on held-out papers.

Then the same pipeline runs with ``torch.utils.data.DataLoader`` (each worker process opening its
own session lazily, as a careful user would write it, with ``mploader.ProcessLocal``) with 1, 2,
4 and 8 workers, and with ``mploader.DataLoader`` (``NebulaHooks``: one session per fetch
thread, closed at exit) with 2 workers x T fetch threads (``worker_threads=T``).  The table
gives loader throughput, the worker processes' total memory (USS) and the sessions each run
left open on the server.

Run it with ``make demo`` (or ``python examples/demo.py [--quick] [--latency-ms 5]``).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import statistics
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import psutil
import torch
from torch import nn
from torch.utils.data import Dataset

import mploader
from mploader.integrations.nebula import NebulaFeatureStore, NebulaHooks, parse_addresses
from nebula_testing import citation

GRAPH = {"num_nodes": 4000, "feature_dim": 64, "num_classes": 7, "seed": 0, "cites_per_node": 10}
BATCH_SEEDS = 32
FAN_OUT = (5, 5)
TRAIN_SHARE = 0.6
LATENCY_MS = 5.0  # the bundled server's modelled round trip per query (--latency-ms 0: off)
STORE_BATCH = 1 << 16  # vertices per GO/FETCH statement: one statement per hop and per fetch


class NeighbourhoodBatches(Dataset):
    """Item ``i``: the sampled two-hop neighbourhood of the ``i``-th block of seed papers.

    Returns ``x`` (features of every sampled paper), ``y`` (their labels), ``edge_index``
    (local ids, messages flow from the cited paper to the citing one), and ``num_seeds`` (the
    first papers are the seeds).  Three statements per item: ``GO`` for each hop's frontier,
    then one ``FETCH`` of every sampled paper.
    """

    def __init__(self, store: NebulaFeatureStore, seeds: np.ndarray, block: int) -> None:
        self.store = store
        self.blocks = [seeds[i : i + block] for i in range(0, len(seeds), block)]

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, index: int) -> dict[str, Any]:
        rng = np.random.default_rng(index)  # the same neighbourhood whichever worker samples it
        seeds = self.blocks[index]
        nodes = seeds
        frontier = seeds
        sources, targets = [], []
        for fan_out in FAN_OUT:
            citing, cited = (part.numpy() for part in self.store.neighbors(frontier))
            citing, cited = sample_per_node(citing, cited, fan_out, rng)
            sources.append(cited)  # the message goes from the cited paper to the citing one
            targets.append(citing)
            frontier = np.setdiff1d(cited, nodes)  # unique, sorted: the next hop's new papers
            nodes = np.concatenate([nodes, frontier])
        x, y = self.store.fetch(nodes)
        edge_index = local_ids(nodes, np.stack([np.concatenate(sources), np.concatenate(targets)]))
        return {"x": x, "y": y, "edge_index": torch.from_numpy(edge_index),
                "num_seeds": len(seeds)}


def sample_per_node(
    src: np.ndarray, dst: np.ndarray, fan_out: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Up to ``fan_out`` of each source's edges, uniformly at random, with no Python loop.

    Edges are put in a canonical order first (by source, then destination), so the sample does
    not depend on the order the server listed them in.
    """
    canonical = np.lexsort((dst, src))
    src, dst = src[canonical], dst[canonical]
    order = np.lexsort((rng.random(len(src)), src))  # shuffled within each source
    src, dst = src[order], dst[order]
    first = np.searchsorted(src, src, side="left")  # where each source's edges start
    keep = np.arange(len(src)) - first < fan_out
    return src[keep], dst[keep]


def local_ids(nodes: np.ndarray, global_ids: np.ndarray) -> np.ndarray:
    """Positions in ``nodes`` (unique ids) of each id in ``global_ids``."""
    sorter = np.argsort(nodes)
    return sorter[np.searchsorted(nodes, global_ids, sorter=sorter)].astype(np.int64)


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
        self.dropout = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        hidden = self.dropout(torch.relu(self.first(x, edge_index)))
        return self.second(hidden, edge_index)


# -- the two ways to give each process (or fetch thread) a session -------------------------------


def _open_session(hooks: NebulaHooks) -> Any:
    return hooks.open_session()


def _close_session(session: Any) -> None:
    session.close()


def make_store(session: Callable[[], Any] | None = None) -> NebulaFeatureStore:
    return NebulaFeatureStore("paper", "feat", "label", GRAPH["feature_dim"], edge="cites",
                              batch_size=STORE_BATCH, session=session)


def torch_store(hooks: NebulaHooks) -> NebulaFeatureStore:
    """For torch's DataLoader: a per-process session, built lazily and keyed on the pid."""
    local = mploader.ProcessLocal(functools.partial(_open_session, hooks), close=_close_session)
    return make_store(session=local.get)


def open_sessions(hooks: NebulaHooks) -> int:
    with contextlib.closing(hooks.open_session()) as admin:
        return len(admin.execute("SHOW SESSIONS").rows()) - 1  # not counting this one


# -- measuring -----------------------------------------------------------------------------------


@dataclass
class Run:
    rate: float  # batches per second
    uss: int  # bytes, summed over the worker processes
    workers: int  # processes
    cpu_ms: float  # CPU per batch: worker processes + main process + server


def new_children(before: set[int], exclude: set[int]) -> list[psutil.Process]:
    """This process's children (recursively) that are not in ``before`` or ``exclude``."""
    children = psutil.Process().children(recursive=True)
    return [child for child in children if child.pid not in before | exclude]


def cpu_seconds(processes: list[psutil.Process]) -> float:
    total = 0.0
    for process in processes:
        with contextlib.suppress(psutil.Error):
            total += sum(process.cpu_times()[:2])
    return total


def measure(make_loader: Callable[[], Any], seconds: float, server_pids: set[int]) -> Run:
    """Throughput over ``seconds`` (after one warm-up batch), workers' USS and CPU per batch."""
    before = {child.pid for child in psutil.Process().children(recursive=True)}
    iterator = iter(make_loader())
    next(iterator)
    workers = new_children(before, server_pids)
    watched = workers + [psutil.Process(pid) for pid in server_pids]
    cpu_before = cpu_seconds(watched) + time.process_time()
    started = time.perf_counter()
    count = 0
    for _batch in iterator:
        count += 1
        if count % 8 == 0 and time.perf_counter() - started >= seconds:
            break
    elapsed = time.perf_counter() - started
    cpu = cpu_seconds(watched) + time.process_time() - cpu_before
    uss = 0
    for worker in workers:
        with contextlib.suppress(psutil.Error):
            uss += worker.memory_full_info().uss
    del iterator
    return Run(count / elapsed, uss, len(workers), 1000 * cpu / count)


@contextlib.contextmanager
def nebula_target(latency_ms: float) -> Iterator[tuple[str, str, str, str, set[int]]]:
    address = os.environ.get("NEBULA_ADDR")
    if address:
        print(f"NebulaGraph at {address} (NEBULA_ADDR); no latency is added")
        yield (address, os.environ.get("NEBULA_USER", "root"),
               os.environ.get("NEBULA_PASSWORD", "nebula"),
               os.environ.get("NEBULA_SPACE", citation.CITATION_SPACE), set())
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
        yield server.address, "root", "nebula", citation.CITATION_SPACE, {server.process.pid}


def split_seeds() -> tuple[np.ndarray, np.ndarray]:
    order = np.random.default_rng(GRAPH["seed"]).permutation(GRAPH["num_nodes"])
    cut = int(TRAIN_SHARE * len(order))
    return order[:cut], order[cut:]


def train(hooks: NebulaHooks, epochs: int, threads: int) -> None:
    train_seeds, test_seeds = split_seeds()
    torch.manual_seed(0)
    model = Sage(GRAPH["feature_dim"], 64, GRAPH["num_classes"])
    optimiser = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)

    def loader(seeds: np.ndarray, shuffle: bool) -> mploader.DataLoader:
        return mploader.DataLoader(NeighbourhoodBatches(make_store(), seeds, BATCH_SEEDS),
                                   batch_size=None, shuffle=shuffle, num_workers=2,
                                   worker_hooks=hooks, worker_threads=threads,
                                   generator=torch.Generator().manual_seed(0))

    def seed_part(batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        logits = model(batch["x"], batch["edge_index"])[: batch["num_seeds"]]
        return logits, batch["y"][: batch["num_seeds"]]

    started = time.perf_counter()
    first_loss = last_loss = 0.0
    for _ in range(epochs):
        model.train()
        losses = []
        for batch in loader(train_seeds, shuffle=True):
            logits, labels = seed_part(batch)
            loss = nn.functional.cross_entropy(logits, labels)
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            losses.append(loss.item())
        first_loss = first_loss or losses[0]
        last_loss = statistics.mean(losses)
    model.eval()
    correct = seen = 0
    with torch.no_grad():
        for batch in loader(test_seeds, shuffle=False):
            logits, labels = seed_part(batch)
            correct += int((logits.argmax(1) == labels).sum())
            seen += len(labels)
    print(f"trained {epochs} epochs on {len(train_seeds)} papers in "
          f"{time.perf_counter() - started:.1f} s: loss {first_loss:.2f} -> {last_loss:.2f}; "
          f"accuracy on {seen} held-out papers {correct / seen:.1%} "
          f"(chance {1 / GRAPH['num_classes']:.1%}; 10% of labels are noise)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer batches (a smoke run)")
    parser.add_argument("--latency-ms", type=float, default=LATENCY_MS,
                        help=f"the bundled server's latency per query (default {LATENCY_MS:g})")
    arguments = parser.parse_args()
    torch.set_num_threads(1)  # the model is small; the cores are for the loaders and the server
    # More workers than cores is deliberate here (the work is waiting on queries).
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    started = time.perf_counter()
    seconds = 0.5 if arguments.quick else 2.0
    repeats = 1 if arguments.quick else 3
    torch_workers = (1, 2) if arguments.quick else (1, 2, 4, 8)
    thread_counts = (4,) if arguments.quick else (4, 8, 16)
    with nebula_target(arguments.latency_ms) as (address, user, password, space, server_pids):
        hooks = NebulaHooks(parse_addresses(address), user, password, space)
        train(hooks, epochs=1 if arguments.quick else 4, threads=8)

        rng = np.random.default_rng(1)  # more seed blocks than any run reads
        seeds = np.concatenate([rng.permutation(GRAPH["num_nodes"]) for _ in range(8)])
        configs: list[tuple[str, Callable[[], Any]]] = []
        for workers in torch_workers:
            configs.append((f"torch, {workers} workers", functools.partial(
                torch.utils.data.DataLoader,
                NeighbourhoodBatches(torch_store(hooks), seeds, BATCH_SEEDS),
                batch_size=None, num_workers=workers)))
        for threads in thread_counts:
            configs.append((f"mploader, 2 workers x {threads} threads", functools.partial(
                mploader.DataLoader, NeighbourhoodBatches(make_store(), seeds, BATCH_SEEDS),
                batch_size=None, num_workers=2, worker_hooks=hooks, worker_threads=threads)))
        runs: dict[str, list[Run]] = {name: [] for name, _ in configs}
        left: dict[str, int] = {}
        for _ in range(repeats):  # alternate the configurations, then take medians
            for name, make_loader in configs:
                before = open_sessions(hooks)
                runs[name].append(measure(make_loader, seconds, server_pids))
                time.sleep(0.1)
                left[name] = open_sessions(hooks) - before

        print(f"\nloader throughput: batches of {BATCH_SEEDS} seed papers, fan-out "
              f"{list(FAN_OUT)}, 3 queries per batch at {arguments.latency_ms:g} ms each; "
              f"median of {repeats} runs of {seconds:g} s.\nworker MB: USS summed over the "
              "worker processes; CPU ms/batch: worker processes + main process + server")
        print(f"{'loader':<34} {'batches/s':>9} {'vs torch 2':>10} {'vs torch 8':>10} "
              f"{'processes':>9} {'worker MB':>9} {'CPU ms/batch':>12} {'sessions left':>13}")
        rates = {name: statistics.median(run.rate for run in runs[name]) for name in runs}
        two = rates[configs[1][0]]
        eight = rates[configs[len(torch_workers) - 1][0]]
        cpu_per_batch = []
        for name, _ in configs:
            done = runs[name]
            uss = statistics.median(run.uss for run in done) / 2**20
            cpu = statistics.median(run.cpu_ms for run in done)
            cpu_per_batch.append(cpu)
            processes = statistics.median(run.workers for run in done)
            print(f"{name:<34} {rates[name]:>9.1f} {rates[name] / two:>9.2f}x "
                  f"{rates[name] / eight:>9.2f}x {processes:>9.0f} {uss:>9.0f} {cpu:>12.1f} "
                  f"{left[name]:>13}")
        cores = os.cpu_count() or 1
        typical = statistics.median(cpu_per_batch)
        print(f"\nAt about {typical:.0f} ms of CPU per batch (sampling, JSON decoding, the "
              f"loader, the server), {cores} cores cap any loader near "
              f"{1000 * cores / typical:.0f} batches/s, less what other processes on the "
              "machine take;\nthe modelled latency is what more concurrent fetches hide.")
        print("\ntorch's workers end without closing their sessions (the server keeps them until "
              "they time out);\nmploader closes every fetch thread's session at exit through "
              "NebulaHooks.close_session.")
    print(f"demo finished in {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
