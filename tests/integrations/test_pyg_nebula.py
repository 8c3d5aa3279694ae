"""PyG's remote backend on NebulaGraph, differential: the same graph held in memory is the oracle.

The bundled graphd serves the citation graph; a small heterogeneous graph is loaded into its own
space with ``put_graph``.  A reference k-hop sampler over the in-memory ``edge_index`` (written
here, not PyG's, which needs pyg-lib) gives the expected node sets and edges.
"""

from __future__ import annotations

import os
import threading
import warnings
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch_geometric.data import Data, HeteroData
from torch_geometric.sampler import NodeSamplerInput

import mploader
from mploader.integrations.nebula import NebulaHooks, NebulaQueryError
from mploader.integrations.nebula.pyg import (
    FEATURES,
    FLOAT,
    INT,
    EdgeMapping,
    GraphSchema,
    NebulaFeatureStore,
    NebulaGraphStore,
    NebulaNeighborSampler,
    NebulaNodeLoader,
    NodeAttribute,
    NodeType,
    homogeneous_schema,
    put_graph,
)
from mploader.integrations.nebula.pyg.schema import EdgeType
from mploader.integrations.nebula.statements import split_id_statements
from nebula_testing import citation
from nebula_testing.nebula_admin import session_ids
from nebula_testing.nebula_process import NebulaServerProcess, start_server_process
from tests.integrations.nebula_fixtures import NebulaTarget, sessions_left_since, wait_for

pytestmark = pytest.mark.timeout(90)

HETERO_SPACE = "pyg_hetero"
AUTHORS, PAPERS = 30, 40
WRITES = ("author", "writes", "paper")
REV_WRITES = ("paper", "rev_writes", "author")
CITES = ("paper", "cites", "paper")
# A graphd refusing statements over 2000 bytes; "0, 1, ..., 599" alone is about 2.9 KB.
SPLIT_NODES, SPLIT_DIM, QUERY_LIMIT = 600, 4, 2000


# ----------------------------------------------------------------------------- fixtures


def citation_schema(feature_dim: int) -> GraphSchema:
    attributes = {
        "x": NodeAttribute(citation.FEATURE_PROP, FEATURES, feature_dim),
        "y": NodeAttribute(citation.LABEL_PROP, INT),
    }
    return homogeneous_schema(citation.PAPER_TAG, attributes, citation.CITES_EDGE)


def hetero_schema() -> GraphSchema:
    return GraphSchema(
        (
            NodeType("author", {"x": NodeAttribute("ax", FEATURES, 4)}, vid_offset=10_000),
            NodeType(
                "paper",
                {"x": NodeAttribute("px", FEATURES, 6), "y": NodeAttribute("py", INT),
                 "w": NodeAttribute("pw", FLOAT)},
                vid_offset=20_000,
            ),
        ),
        (EdgeMapping(WRITES, "writes"), EdgeMapping(REV_WRITES, "writes", reverse=True),
         EdgeMapping(CITES, "pcites")),
    )


def make_hetero_data() -> HeteroData:
    rng = np.random.default_rng(3)
    data = HeteroData()
    data["author"].x = torch.from_numpy(rng.normal(size=(AUTHORS, 4)).astype(np.float32))
    data["paper"].x = torch.from_numpy(rng.normal(size=(PAPERS, 6)).astype(np.float32))
    data["paper"].y = torch.from_numpy(rng.integers(0, 5, PAPERS))
    data["paper"].w = torch.arange(PAPERS, dtype=torch.float32) / 4
    writes = np.stack([rng.integers(0, AUTHORS, 90), rng.integers(0, PAPERS, 90)])
    writes = np.unique(writes, axis=1)
    cites = np.unique(np.stack([rng.integers(0, PAPERS, 80), rng.integers(0, PAPERS, 80)]), axis=1)
    data[WRITES].edge_index = torch.from_numpy(writes)
    data[CITES].edge_index = torch.from_numpy(cites)
    return data


@pytest.fixture(scope="module")
def citation_stores(nebula_server: NebulaTarget) -> Any:
    schema = citation_schema(nebula_server.feature_dim)
    hooks = nebula_server.hooks()
    stores = NebulaFeatureStore(schema, hooks), NebulaGraphStore(schema, hooks)
    yield schema, hooks, stores
    for store in stores:
        store.close()


@pytest.fixture(scope="module")
def hetero_stores(nebula_server: NebulaTarget, nebula_admin_module: Any) -> Any:
    result = nebula_admin_module.execute(
        f"CREATE SPACE IF NOT EXISTS {HETERO_SPACE} (vid_type = INT64)"
    )
    assert result.is_succeeded(), result.error_msg()
    schema, data = hetero_schema(), make_hetero_data()
    hooks = nebula_server.hooks(space=HETERO_SPACE)
    feature_store, graph_store = NebulaFeatureStore(schema, hooks), NebulaGraphStore(schema, hooks)
    put_graph(data, feature_store, graph_store)
    yield schema, hooks, (feature_store, graph_store), data
    feature_store.close()
    graph_store.close()


@pytest.fixture(scope="module")
def small_query_server() -> Iterator[NebulaServerProcess]:
    """The bundled graphd with ``max_allowed_query_size=2000`` (graphd's default is 4 MiB)."""
    with start_server_process(
        preload="citation", nodes=SPLIT_NODES, feature_dim=SPLIT_DIM, classes=3, seed=0,
        cites_per_node=2, max_allowed_query_size=QUERY_LIMIT,
    ) as server:
        yield server


@pytest.fixture(scope="module")
def nebula_admin_module(nebula_server: NebulaTarget) -> Any:
    pool, session = nebula_server.raw_session()
    yield session
    session.release()
    pool.close()


# ----------------------------------------------------------------------------- the oracle


def reference_khop(
    edges: dict[tuple[str, str, str], np.ndarray], seeds: dict[str, list[int]], hops: int
) -> tuple[dict[str, set[int]], set[tuple[Any, int, int]]]:
    """Full fan-out: each hop takes every edge into the last hop's new nodes (PyG's direction)."""
    nodes = {tag: set(ids) for tag, ids in seeds.items()}
    frontier = {tag: set(ids) for tag, ids in seeds.items()}
    sampled: set[tuple[Any, int, int]] = set()
    for _ in range(hops):
        new: dict[str, set[int]] = {}
        for edge_type, (source, destination) in edges.items():
            into = frontier.get(edge_type[2], set())
            for src, dst in zip(source.tolist(), destination.tolist(), strict=True):
                if dst in into:
                    sampled.add((edge_type, src, dst))
                    if src not in nodes.setdefault(edge_type[0], set()):
                        new.setdefault(edge_type[0], set()).add(src)
        for tag, added in new.items():
            nodes[tag] |= added
        frontier = new
    return nodes, sampled


def global_edges(batch: Any, edge_type: Any, hetero: bool) -> set[tuple[Any, int, int]]:
    if hetero:
        source_ids, destination_ids = batch[edge_type[0]].n_id, batch[edge_type[2]].n_id
        edge_index = batch[edge_type].edge_index
    else:
        source_ids = destination_ids = batch.n_id
        edge_index = batch.edge_index
    return {
        (edge_type, int(source_ids[src]), int(destination_ids[dst]))
        for src, dst in edge_index.t().tolist()
    }


# ----------------------------------------------------------------------------- both graphs

Fanout = list[int] | dict[EdgeType, list[int]]
Edges = dict[EdgeType, tuple[torch.Tensor, torch.Tensor, list[int]]]  # row, col, per hop

# Per kind of graph, the fan-out the workers test samples with: for the heterogeneous graph a
# num_neighbors dict keyed by edge type (as PyG's NeighborSampler takes it).
WORKER_FANOUT: dict[str, Fanout] = {
    "homogeneous": [3, 2],
    "heterogeneous": {WRITES: [2, 1], REV_WRITES: [1, 2], CITES: [1, 3]},
}


@dataclass
class GraphCase:
    """One of the test graphs: its stores, and the same graph in memory (the oracle)."""

    schema: GraphSchema
    hooks: NebulaHooks
    stores: tuple[NebulaFeatureStore, NebulaGraphStore]
    attributes: dict[str, dict[str, torch.Tensor]]  # node type -> PyG attribute -> every row
    edges: dict[EdgeType, np.ndarray]  # (2, E) per-type indices, in PyG's direction
    input_type: str
    num_inputs: int

    @property
    def hetero(self) -> bool:
        return self.schema.is_hetero

    def input_nodes(self, count: int) -> Any:
        seeds = torch.arange(min(count, self.num_inputs))
        return (self.input_type, seeds) if self.hetero else seeds

    def sampler_input(self, seeds: torch.Tensor) -> NodeSamplerInput:
        return NodeSamplerInput(
            input_id=None, node=seeds, input_type=self.input_type if self.hetero else None
        )

    def fanouts(self, fanout: Fanout) -> dict[EdgeType, list[int]]:
        if isinstance(fanout, dict):
            return {edge_type: fanout[edge_type] for edge_type in self.edges}
        return {edge_type: fanout for edge_type in self.edges}


def graph_case(request: pytest.FixtureRequest, kind: str) -> GraphCase:
    """The citation graph (``Data``) or the author/paper graph (``HeteroData``)."""
    if kind == "homogeneous":
        schema, hooks, stores = request.getfixturevalue("citation_stores")
        graph = request.getfixturevalue("nebula_server").graph
        attributes = {"x": torch.from_numpy(graph.features), "y": torch.from_numpy(graph.labels)}
        edges = {CITES: np.stack([graph.edge_src, graph.edge_dst])}
        return GraphCase(schema, hooks, stores, {"paper": attributes}, edges, "paper",
                         graph.num_nodes)
    schema, hooks, stores, data = request.getfixturevalue("hetero_stores")
    attributes = {tag: {name: data[tag][name] for name in data[tag]}
                  for tag in ("author", "paper")}
    writes = data[WRITES].edge_index.numpy()
    edges = {WRITES: writes, REV_WRITES: writes[::-1], CITES: data[CITES].edge_index.numpy()}
    return GraphCase(schema, hooks, stores, attributes, edges, "paper", PAPERS)


def sample_parts(out: Any, case: GraphCase) -> tuple[dict[str, torch.Tensor], Edges]:
    """A ``SamplerOutput`` / ``HeteroSamplerOutput`` as per-type nodes and edges."""
    if case.hetero:
        edges = {edge_type: (out.row[edge_type], out.col[edge_type],
                             list(out.num_sampled_edges[edge_type])) for edge_type in case.edges}
        return dict(out.node), edges
    return {"paper": out.node}, {CITES: (out.row, out.col, list(out.num_sampled_edges))}


def batch_parts(batch: Any, case: GraphCase) -> tuple[dict[str, Any], Edges]:
    """A loader's batch as per-type node storages (``n_id``, ``x``, ...) and edges."""
    if case.hetero:
        nodes = {tag: batch[tag] for tag in case.attributes}
        views = {edge_type: batch[edge_type] for edge_type in case.edges}
    else:
        nodes, views = {"paper": batch}, {CITES: batch}
    edges = {edge_type: (view.edge_index[0], view.edge_index[1], list(view.num_sampled_edges))
             for edge_type, view in views.items()}
    return nodes, edges


def node_ids(nodes: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {tag: storage.n_id for tag, storage in nodes.items()}


def batch_sample(batch: Any, case: GraphCase) -> tuple[dict[str, torch.Tensor], Edges]:
    nodes, edges = batch_parts(batch, case)
    return node_ids(nodes), edges


def sample_errors(
    case: GraphCase, nodes: dict[str, torch.Tensor], edges: Edges,
    fanouts: dict[EdgeType, list[int]],
) -> int:
    """Wrong answers in one sample: an edge the graph does not have, or, in some hop, a node
    with more than k neighbours over an edge type."""
    wrong = 0
    for edge_type, (row, col, counts) in edges.items():
        existing = set(zip(*case.edges[edge_type].tolist(), strict=True))
        sources, destinations = nodes[edge_type[0]], nodes[edge_type[2]]
        pairs = set(zip(sources[row].tolist(), destinations[col].tolist(), strict=True))
        wrong += not pairs <= existing
        wrong += len(counts) != len(fanouts[edge_type])
        for k, hop in zip(fanouts[edge_type], torch.split(col, counts), strict=True):
            wrong += k >= 0 and len(hop) > 0 and int(torch.bincount(hop).max()) > k
    return wrong


def truncated_neighbourhoods(
    case: GraphCase, nodes: dict[str, torch.Tensor], edges: Edges,
    fanouts: dict[EdgeType, list[int]],
) -> int:
    """How many (hop, edge type, node) had more than k neighbours in the graph."""
    truncated = 0
    for edge_type, (_, col, counts) in edges.items():
        in_degree = Counter(case.edges[edge_type][1].tolist())
        for k, hop in zip(fanouts[edge_type], torch.split(col, counts), strict=True):
            ends = nodes[edge_type[2]][hop.unique()].tolist()
            truncated += sum(k >= 0 and in_degree[end] > k for end in ends)
    return truncated


def attribute_errors(case: GraphCase, nodes: dict[str, Any]) -> int:
    """Attributes of a batch that differ from the in-memory graph's rows of its ``n_id``."""
    return sum(
        not torch.equal(nodes[tag][name], values[nodes[tag].n_id])
        for tag, attributes in case.attributes.items()
        for name, values in attributes.items()
    )


def same_sample(first: tuple[dict[str, Any], Edges], second: tuple[dict[str, Any], Edges]) -> bool:
    (nodes, edges), (other_nodes, other_edges) = first, second
    return all(torch.equal(nodes[tag], other_nodes[tag]) for tag in nodes) and all(
        torch.equal(edges[key][0], other_edges[key][0])
        and torch.equal(edges[key][1], other_edges[key][1])
        for key in edges
    )


# ----------------------------------------------------------------------------- tests


def test_full_fanout_matches_the_in_memory_reference_homogeneous(
    nebula_server: NebulaTarget, citation_stores: Any
) -> None:
    schema, hooks, stores = citation_stores
    graph = nebula_server.graph
    sampler = NebulaNeighborSampler(schema, hooks, [-1, -1])
    loader = NebulaNodeLoader(stores, sampler, input_nodes=torch.arange(0, 300, 7), batch_size=9)
    edges = {CITES: np.stack([graph.edge_src, graph.edge_dst])}
    batches = 0
    for batch in loader:
        seeds = batch.n_id[: batch.batch_size].tolist()
        nodes, expected_edges = reference_khop(edges, {"paper": seeds}, 2)
        assert set(batch.n_id.tolist()) == nodes["paper"]
        assert len(batch.n_id) == len(nodes["paper"])  # no node twice
        assert global_edges(batch, CITES, hetero=False) == expected_edges
        assert batch.edge_index.shape[1] == len(expected_edges)
        assert torch.equal(batch.x, torch.from_numpy(graph.features[batch.n_id.numpy()]))
        assert torch.equal(batch.y, torch.from_numpy(graph.labels[batch.n_id.numpy()]))
        batches += 1
    assert batches == len(loader) == 5
    sampler.close()


def test_full_fanout_matches_the_in_memory_reference_heterogeneous(hetero_stores: Any) -> None:
    schema, hooks, stores, data = hetero_stores
    sampler = NebulaNeighborSampler(schema, hooks, [-1, -1])
    loader = NebulaNodeLoader(
        stores, sampler, input_nodes=("paper", torch.arange(PAPERS)), batch_size=8
    )
    writes = data[WRITES].edge_index.numpy()
    edges = {WRITES: writes, REV_WRITES: writes[::-1], CITES: data[CITES].edge_index.numpy()}
    for batch in loader:
        seeds = batch["paper"].n_id[: batch["paper"].batch_size].tolist()
        nodes, expected_edges = reference_khop(edges, {"paper": seeds}, 2)
        for tag in ("author", "paper"):
            assert set(batch[tag].n_id.tolist()) == nodes.get(tag, set())
            assert torch.equal(batch[tag].x, data[tag].x[batch[tag].n_id])
        assert torch.equal(batch["paper"].y, data["paper"].y[batch["paper"].n_id])
        assert torch.equal(batch["paper"].w, data["paper"].w[batch["paper"].n_id])
        got: set[tuple[Any, int, int]] = set()
        for edge_type in edges:
            if "edge_index" in batch[edge_type]:
                got |= global_edges(batch, edge_type, hetero=True)
        assert got == expected_edges
    sampler.close()


@pytest.mark.parametrize(
    ("kind", "fanout"),
    [
        ("homogeneous", [2, 3]),
        ("homogeneous", [1, 1]),
        ("heterogeneous", [1, 2]),
        ("heterogeneous", {WRITES: [1, 2], REV_WRITES: [2, 1], CITES: [1, 0]}),
    ],
    ids=["homogeneous-2-3", "homogeneous-1-1", "heterogeneous-1-2", "heterogeneous-per-edge-type"],
)
def test_fanout_keeps_real_edges_and_at_most_k_per_node_reproducibly(
    request: pytest.FixtureRequest, kind: str, fanout: Fanout
) -> None:
    case = graph_case(request, kind)
    fanouts = case.fanouts(fanout)
    sampler = NebulaNeighborSampler(case.schema, case.hooks, fanout, seed=5)
    wrong = truncated = 0
    chunk = case.num_inputs // 5
    for start in range(0, case.num_inputs, chunk):
        inputs = case.sampler_input(torch.arange(start, start + chunk))
        out = sample_parts(sampler.sample_from_nodes(inputs), case)
        assert same_sample(out, sample_parts(sampler.sample_from_nodes(inputs), case))
        wrong += sample_errors(case, *out, fanouts)
        truncated += truncated_neighbourhoods(case, *out, fanouts)
    assert wrong == 0
    assert truncated > 0  # the fan-out really cut some neighbourhoods
    other = NebulaNeighborSampler(case.schema, case.hooks, fanout, seed=6)
    inputs = case.sampler_input(torch.arange(case.num_inputs))
    mine = sample_parts(sampler.sample_from_nodes(inputs), case)
    assert not same_sample(mine, sample_parts(other.sample_from_nodes(inputs), case))
    sampler.close()
    other.close()


def test_graph_store_layouts_match_memory(
    nebula_server: NebulaTarget, citation_stores: Any
) -> None:
    _, _, (_, graph_store) = citation_stores
    graph = nebula_server.graph
    expected = sorted(zip(graph.edge_src.tolist(), graph.edge_dst.tolist(), strict=True))
    (attr,) = graph_store.get_all_edge_attrs()
    assert attr.size == (300, 300)
    row, col = graph_store.get_edge_index(edge_type=None, layout="coo")
    assert sorted(zip(row.tolist(), col.tolist(), strict=True)) == expected
    row, colptr, _ = graph_store.csc()
    columns = torch.repeat_interleave(torch.arange(300), colptr.diff())
    assert sorted(zip(row.tolist(), columns.tolist(), strict=True)) == expected
    rowptr, col, _ = graph_store.csr()
    rows = torch.repeat_interleave(torch.arange(300), rowptr.diff())
    assert sorted(zip(rows.tolist(), col.tolist(), strict=True)) == expected


def test_put_then_get_round_trips_data_and_heterodata(
    nebula_server: NebulaTarget, nebula_admin_module: Any, hetero_stores: Any
) -> None:
    _schema, _hooks, (feature_store, graph_store), data = hetero_stores  # put by the fixture
    for tag in ("author", "paper"):
        for name in data[tag]:
            assert torch.equal(feature_store[tag, name, None], data[tag][name])
    got = graph_store.get_edge_index(edge_type=WRITES, layout="coo")
    assert sorted(zip(*(t.tolist() for t in got), strict=True)) == sorted(
        map(tuple, data[WRITES].edge_index.t().tolist())
    )
    result = nebula_admin_module.execute("CREATE SPACE IF NOT EXISTS pyg_homo (vid_type = INT64)")
    assert result.is_succeeded()
    homogeneous = Data(
        x=torch.randn(25, 3), y=torch.arange(25) % 4,
        edge_index=torch.tensor([[0, 1, 2, 24], [1, 2, 0, 3]]),
    )
    attributes = {"x": NodeAttribute("x", FEATURES, 3), "y": NodeAttribute("y", INT)}
    homo_schema = homogeneous_schema("node", attributes, "link")
    homo_hooks = nebula_server.hooks(space="pyg_homo")
    stores = NebulaFeatureStore(homo_schema, homo_hooks), NebulaGraphStore(homo_schema, homo_hooks)
    put_graph(homogeneous, *stores)
    assert torch.equal(stores[0].get_tensor("node", "x", None), homogeneous.x)
    assert torch.equal(stores[0].get_tensor("node", "y", index=torch.tensor([5, 1])),
                       homogeneous.y[[5, 1]])
    assert stores[0].get_tensor_size("node", "x") == (25, 3)
    row, col = stores[1].get_edge_index(edge_type=None, layout="coo")
    assert sorted(zip(row.tolist(), col.tolist(), strict=True)) == [(0, 1), (1, 2), (2, 0), (24, 3)]
    assert stores[0].remove_tensor("node", "y", None)
    assert stores[0].get_tensor("node", "y", None) is None  # NULL in the space now
    assert torch.equal(stores[0].get_tensor("node", "x", None), homogeneous.x)  # the rest is kept
    for store in stores:
        store.close()


def test_multi_get_tensor_sends_one_statement_per_tag(hetero_stores: Any) -> None:
    _schema, _hooks, (feature_store, _), data = hetero_stores
    attrs = feature_store.get_all_tensor_attrs()
    assert {(a.group_name, a.attr_name) for a in attrs} == {
        ("author", "x"), ("paper", "x"), ("paper", "y"), ("paper", "w")
    }
    attrs[0].index = torch.tensor([0])
    assert not feature_store.get_all_tensor_attrs()[0].is_set("index")  # fresh objects each call
    session = feature_store.session()
    sent: list[str] = []
    original = session.execute_json

    def counting(statement: str) -> Any:
        sent.append(statement)
        return original(statement)

    session.execute_json = counting
    try:
        for attr in attrs:
            attr.index = torch.tensor([3, 1, 3])
        tensors = feature_store.multi_get_tensor(attrs)
    finally:
        del session.execute_json
    assert len(sent) == 2  # one FETCH per tag for all its attributes
    for attr, tensor in zip(attrs, tensors, strict=True):
        assert torch.equal(tensor, data[attr.group_name][attr.attr_name][[3, 1, 3]])


def test_writes_are_joined_below_the_size_limit() -> None:
    """``put_tensor``'s UPSERTs travel as ``;``-joined requests, each below the limit."""
    updates = [f"UPSERT VERTEX ON paper {10**6 + n} SET label = {n}" for n in range(200)]
    requests = list(split_id_statements("", updates, "", max_bytes=2000, separator="; "))
    assert len(requests) > 1
    assert all(len(request.encode()) <= 2000 for request in requests)
    assert [part for request in requests for part in request.split("; ")] == updates
    with pytest.raises(ValueError, match="max_allowed_query_size"):
        list(split_id_statements("", ["x" * 3000], "", max_bytes=2000, separator="; "))


def test_fetch_and_go_are_split_below_the_servers_query_size_limit(
    small_query_server: NebulaServerProcess,
) -> None:
    """With ``max_query_bytes`` = graphd's ``max_allowed_query_size`` (2000 bytes here), the
    feature store's FETCH and the sampler's GO are split, and answer as the in-memory graph does;
    the same statements unsplit are refused by that graphd."""
    graph = citation.make_citation_graph(SPLIT_NODES, SPLIT_DIM, 3, 0, 2)
    hooks = NebulaHooks([small_query_server.address], space=citation.CITATION_SPACE)
    schema = citation_schema(SPLIT_DIM)
    everything = NodeSamplerInput(input_id=None, node=torch.arange(SPLIT_NODES))

    unsplit_store = NebulaFeatureStore(schema, hooks)  # graphd's default limit: 4 MiB
    unsplit_sampler = NebulaNeighborSampler(schema, hooks, [-1, -1])
    with pytest.raises(NebulaQueryError, match="Query is too large"):
        unsplit_store.get_tensor("paper", "x", None)
    with pytest.raises(NebulaQueryError, match="Query is too large"):
        unsplit_sampler.sample_from_nodes(everything)
    unsplit_store.close()
    unsplit_sampler.close()

    feature_store = NebulaFeatureStore(schema, hooks, max_query_bytes=QUERY_LIMIT)
    graph_store = NebulaGraphStore(schema, hooks, max_query_bytes=QUERY_LIMIT)
    assert torch.equal(feature_store.get_tensor("paper", "x", None),
                       torch.from_numpy(graph.features))
    assert torch.equal(feature_store.get_tensor("paper", "y", None), torch.from_numpy(graph.labels))

    sampler = NebulaNeighborSampler(schema, hooks, [-1, -1], max_query_bytes=QUERY_LIMIT)
    loader = NebulaNodeLoader((feature_store, graph_store), sampler,
                              input_nodes=torch.arange(SPLIT_NODES), batch_size=450)
    edges = {CITES: np.stack([graph.edge_src, graph.edge_dst])}
    for batch in loader:  # 450 seeds: a GO of ~2.2 KB, a FETCH of all ~600 sampled nodes
        seeds = batch.n_id[: batch.batch_size].tolist()
        nodes, expected_edges = reference_khop(edges, {"paper": seeds}, 2)
        assert set(batch.n_id.tolist()) == nodes["paper"] and len(batch.n_id) == len(nodes["paper"])
        assert global_edges(batch, CITES, hetero=False) == expected_edges
        assert torch.equal(batch.x, torch.from_numpy(graph.features[batch.n_id.numpy()]))
        assert torch.equal(batch.y, torch.from_numpy(graph.labels[batch.n_id.numpy()]))

    # with fan-out, where the statements were cut does not change the sample
    samples = []
    for limit in (QUERY_LIMIT, 600):
        fanned = NebulaNeighborSampler(schema, hooks, [2, 2], seed=4, max_query_bytes=limit)
        samples.append(fanned.sample_from_nodes(everything))
        fanned.close()
    assert all(torch.equal(getattr(samples[0], name), getattr(samples[1], name))
               for name in ("node", "row", "col"))
    for store in (feature_store, graph_store, sampler):
        store.close()


# The heterogeneous graph under fork and spawn only: forkserver hands the loader to its workers
# pickled, as spawn does (the homogeneous runs cover all three), and each costs ~3 s.
@pytest.mark.parametrize(
    ("kind", "start_method"),
    [
        ("homogeneous", "fork"),
        ("homogeneous", "spawn"),
        ("homogeneous", "forkserver"),
        ("heterogeneous", "fork"),
        ("heterogeneous", "spawn"),
    ],
)
def test_loader_on_mploader_workers_and_threads(
    request: pytest.FixtureRequest, nebula_admin: Any, kind: str, start_method: str
) -> None:
    case = graph_case(request, kind)
    fanouts = case.fanouts(WORKER_FANOUT[kind])
    before = session_ids(nebula_admin)
    sampler = NebulaNeighborSampler(case.schema, case.hooks, WORKER_FANOUT[kind])

    def run() -> list[Any]:
        loader = NebulaNodeLoader(
            case.stores, sampler, input_nodes=case.input_nodes(120), batch_size=10,
            shuffle=True, num_workers=2, worker_threads=3, worker_hooks=case.hooks,
            multiprocessing_context=start_method, generator=torch.Generator().manual_seed(1),
        )
        with mploader.install():
            return list(loader)

    batches = run()
    wrong = 0
    seen: list[int] = []
    for batch in batches:
        nodes, edges = batch_parts(batch, case)
        wrong += attribute_errors(case, nodes)
        wrong += sample_errors(case, node_ids(nodes), edges, fanouts)
        seeds = nodes[case.input_type]
        seen += seeds.n_id[: seeds.batch_size].tolist()
    assert wrong == 0
    assert sorted(seen) == list(range(min(120, case.num_inputs)))
    again = run()  # same generator: same batches and the same sampled neighbours
    assert all(same_sample(batch_sample(first, case), batch_sample(second, case))
               for first, second in zip(batches, again, strict=True))
    assert not sessions_left_since(nebula_admin, before)  # every session signed out


class RecordingHooks(NebulaHooks):
    """``NebulaHooks`` that append ``pid thread-name`` to a file for each session made."""

    def __init__(self, hooks: NebulaHooks, record: Path) -> None:
        super().__init__(hooks.addresses, hooks.user, hooks.password, hooks.space)
        self.record = record

    def create_session(self, info: Any) -> Any:
        with self.record.open("a") as record:
            record.write(f"{os.getpid()} {threading.current_thread().name}\n")
        return super().create_session(info)


def _plain_node_loader(citation_stores: Any, batch_size: int) -> tuple[Any, NebulaNeighborSampler]:
    """PyG's own ``NodeLoader`` on the citation stores, 40 seed papers, 2 fork workers, no hooks."""
    from torch_geometric.loader import NodeLoader

    schema, hooks, stores = citation_stores
    sampler = NebulaNeighborSampler(schema, hooks, [2, 2])
    loader = NodeLoader(stores, sampler, input_nodes=torch.arange(40), batch_size=batch_size,
                        num_workers=2, multiprocessing_context="fork")
    return loader, sampler


def test_plain_node_loader_takes_worker_hooks_and_threads_set_as_attributes(
    nebula_server: NebulaTarget, nebula_admin: Any, citation_stores: Any, tmp_path: Path
) -> None:
    """README: a plain ``NodeLoader`` (its constructor passes unknown keywords on to torch's,
    which refuses them) gets ``worker_hooks``/``worker_threads`` as attributes set after
    construction; under ``mploader.install()`` its workers use them."""
    graph = nebula_server.graph
    before = session_ids(nebula_admin)
    loader, sampler = _plain_node_loader(citation_stores, batch_size=8)
    hooks = citation_stores[1]
    loader.worker_hooks = RecordingHooks(hooks, tmp_path / "sessions")  # type: ignore[attr-defined]
    loader.worker_threads = 2  # type: ignore[attr-defined]
    with mploader.install():
        iterator = iter(loader)
        batches = list(iterator)
        assert iterator.stats().worker_threads == 2
    assert len(batches) == 5
    for batch in batches:
        ids = batch.n_id.numpy()
        assert torch.equal(batch.x, torch.from_numpy(graph.features[ids]))
        assert torch.equal(batch.y, torch.from_numpy(graph.labels[ids]))
    made = [line.split() for line in (tmp_path / "sessions").read_text().splitlines()]
    # NodeLoader samples and fetches in its collate_fn, on each worker's main thread: one
    # session per worker process, made by the hooks (not a store's own per-process session)
    assert sorted(thread for _, thread in made) == ["MainThread", "MainThread"]
    assert len({pid for pid, _ in made}) == 2 and str(os.getpid()) not in {p for p, _ in made}
    assert not sessions_left_since(nebula_admin, before)  # the hooks closed them
    sampler.close()


class OwnSessionRecordingHooks(NebulaHooks):
    """``NebulaHooks`` whose ``open_session`` (a store's own, per-process session) appends
    ``label pid session-id`` to a file."""

    def __init__(self, hooks: NebulaHooks, record: Path, label: str) -> None:
        super().__init__(hooks.addresses, hooks.user, hooks.password, hooks.space)
        self.record = record
        self.label = label

    def open_session(self) -> Any:
        session = super().open_session()
        with self.record.open("a") as record:
            record.write(f"{self.label} {os.getpid()} {session.session_id}\n")
        return session


@pytest.mark.parametrize("loader_class", ["NodeLoader", "NebulaNodeLoader"])
def test_a_main_process_session_never_crosses_a_fork(
    nebula_server: NebulaTarget, nebula_admin: Any, tmp_path: Path, loader_class: str
) -> None:
    """The feature store signs in in the parent; forked workers with no ``worker_hooks`` leave
    that session alone, sign in on their own and sign out at exit."""
    from torch_geometric.loader import NodeLoader

    graph = nebula_server.graph
    record = tmp_path / "sessions"
    schema = citation_schema(nebula_server.feature_dim)

    def hooks(label: str) -> NebulaHooks:
        return OwnSessionRecordingHooks(nebula_server.hooks(), record, label)

    feature_store = NebulaFeatureStore(schema, hooks("features"))
    graph_store = NebulaGraphStore(schema, hooks("graph"))
    sampler = NebulaNeighborSampler(schema, hooks("sampler"), [2, 2])
    some = torch.tensor([4, 0, 9])
    assert torch.equal(feature_store.get_tensor("paper", "x", index=some),
                       torch.from_numpy(graph.features[some.numpy()]))
    parent = feature_store.session()
    parent_id = parent.session_id
    before = session_ids(nebula_admin)
    assert parent_id in before

    arguments: dict[str, Any] = {
        "input_nodes": torch.arange(60), "batch_size": 10, "num_workers": 2,
        "multiprocessing_context": "fork",
    }
    if loader_class == "NodeLoader":
        loader: Any = NodeLoader((feature_store, graph_store), sampler, **arguments)
    else:
        loader = NebulaNodeLoader((feature_store, graph_store), sampler, worker_threads=2,
                                  **arguments)
    with mploader.install():
        batches = list(loader)
    wrong = 0
    for batch in batches:
        ids = batch.n_id.numpy()
        wrong += not torch.equal(batch.x, torch.from_numpy(graph.features[ids]))
        wrong += not torch.equal(batch.y, torch.from_numpy(graph.labels[ids]))
    assert wrong == 0 and len(batches) == 6

    made = [line.split() for line in record.read_text().splitlines()]
    assert [(label, int(pid)) for label, pid, _ in made if int(pid) == os.getpid()] == [
        ("features", os.getpid())
    ]  # the parent signed in once, for its own feature store
    workers = {int(pid) for _, pid, _ in made} - {os.getpid()}
    assert len(workers) == 2
    for worker in workers:  # each worker signed in for its own feature store and sampler
        labels = sorted(label for label, pid, _ in made if int(pid) == worker)
        assert labels == ["features", "sampler"], made
    assert str(parent_id) not in {session for _, pid, session in made if int(pid) in workers}

    assert not sessions_left_since(nebula_admin, before)  # the workers signed out
    assert feature_store.session() is parent  # the parent's session is untouched, still works
    assert torch.equal(feature_store.get_tensor("paper", "y", index=some),
                       torch.from_numpy(graph.labels[some.numpy()]))
    assert parent.session_id == parent_id and parent.reconnects == 0
    for store in (feature_store, graph_store, sampler):
        store.close()
    assert wait_for(lambda: parent_id not in session_ids(nebula_admin))


def test_torchs_own_workers_sign_their_store_sessions_out_at_exit(
    nebula_server: NebulaTarget, nebula_admin: Any, citation_stores: Any
) -> None:
    """Without ``mploader.install()`` a ``NodeLoader`` runs on torch's iterator, whose workers
    know nothing of mploader: the sessions the stores open there are still signed out when the
    worker exits (else each worker of each epoch leaves them on graphd until its idle timeout,
    8 h, counted against its cap of 300 per user and host).  Fork only: a spawned worker exits
    through the same multiprocessing code."""
    graph = nebula_server.graph
    before = session_ids(nebula_admin)
    loader, sampler = _plain_node_loader(citation_stores, batch_size=10)
    assert not mploader.is_installed()
    batches = list(loader)
    assert len(batches) == 4 and all(
        torch.equal(batch.x, torch.from_numpy(graph.features[batch.n_id.numpy()]))
        for batch in batches
    )
    assert not sessions_left_since(nebula_admin, before, timeout=5)
    sampler.close()


def test_each_nebula_feature_store_says_which_it_is_and_names_the_other() -> None:
    """Two public classes are called ``NebulaFeatureStore``: their docstrings tell them apart."""
    from mploader.integrations.nebula import NebulaFeatureStore as TorchStore

    assert "mploader.integrations.nebula.pyg.NebulaFeatureStore" in (TorchStore.__doc__ or "")
    assert "mploader.integrations.nebula.NebulaFeatureStore" in (NebulaFeatureStore.__doc__ or "")
    assert "torch_geometric.data.FeatureStore" in (NebulaFeatureStore.__doc__ or "")


def test_worker_threads_need_mploader_installed(citation_stores: Any) -> None:
    schema, hooks, stores = citation_stores
    sampler = NebulaNeighborSampler(schema, hooks, [2])
    loader = NebulaNodeLoader(stores, sampler, input_nodes=torch.arange(10), batch_size=5,
                              num_workers=1, worker_threads=2, worker_hooks=hooks)
    assert not mploader.is_installed()
    with pytest.raises(RuntimeError, match=r"mploader.install\(\)"):
        iter(loader)


def test_install_takes_over_pyg_node_loaders_without_a_warning() -> None:
    """NodeLoader overrides _get_iterator but wraps super()'s: it runs on mploader's iterator,
    so install() must not warn that it keeps its own (a class defined while installed is
    checked when it is made)."""
    from torch_geometric.loader import NodeLoader

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with mploader.install():

            class MyNodeLoader(NodeLoader):
                pass

            class MyStatefulLoader(torch.utils.data.DataLoader):  # type: ignore[type-arg]
                def _get_iterator(self) -> Any:
                    return iter([])

    named = [str(w.message) for w in caught]
    assert not any(".MyNodeLoader:" in message for message in named), named
    assert any(".MyStatefulLoader:" in message for message in named), named
