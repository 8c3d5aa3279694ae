"""PyG's remote backend given bad input: it refuses, names what it was given, what is allowed and
what exists, and sends nothing that changes the space (issue 29, part A).

One space, loaded once with ``put_graph``: authors and papers with every relation called ``'to'``
(as PyG's own heterogeneous tests name them), ``('paper', 'to', 'paper')`` and
``('author', 'to', 'paper')`` stored in the one NebulaGraph edge type ``to``, plus
``('paper', 'rev_to', 'author')`` reading ``to`` backwards.  The same graph as a ``HeteroData``
is the oracle: PyG's own store for reads, and the in-memory edges for the sampler.
"""

from __future__ import annotations

import pickle
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch
from torch_geometric.data import EdgeAttr, HeteroData, TensorAttr
from torch_geometric.sampler import NodeSamplerInput

from mploader.integrations.nebula.pyg import (
    FEATURES,
    INT,
    EdgeMapping,
    GraphSchema,
    NebulaFeatureStore,
    NebulaGraphStore,
    NebulaNeighborSampler,
    NodeAttribute,
    NodeType,
    put_graph,
)
from tests.integrations.nebula_fixtures import NebulaTarget
from tests.integrations.test_pyg_nebula import reference_khop

pytestmark = pytest.mark.timeout(60)

SPACE = "pyg_bad_input"
AUTHORS, PAPERS, AUTHOR_DIM, PAPER_DIM = 12, 20, 3, 4
CITES = ("paper", "to", "paper")
WRITES = ("author", "to", "paper")
WRITTEN_BY = ("paper", "rev_to", "author")
EDGE_TYPES = (CITES, WRITES, WRITTEN_BY)


def shared_edge_schema(author_offset: int = 1000, **paper: Any) -> GraphSchema:
    """Three PyG edge types on one stored edge type ``to``, told apart by their endpoints."""
    return GraphSchema(
        (
            NodeType("author", {"x": NodeAttribute("ax", FEATURES, AUTHOR_DIM)},
                     vid_offset=author_offset),
            NodeType("paper", {"x": NodeAttribute("px", FEATURES, PAPER_DIM),
                               "y": NodeAttribute("py", INT)}, vid_offset=2000, **paper),
        ),
        (EdgeMapping(CITES, "to"), EdgeMapping(WRITES, "to"),
         EdgeMapping(WRITTEN_BY, "to", reverse=True)),
    )


def make_data() -> HeteroData:
    rng = np.random.default_rng(29)
    data = HeteroData()
    data["author"].x = torch.from_numpy(rng.normal(size=(AUTHORS, AUTHOR_DIM)).astype(np.float32))
    data["paper"].x = torch.from_numpy(rng.normal(size=(PAPERS, PAPER_DIM)).astype(np.float32))
    data["paper"].y = torch.from_numpy(rng.integers(0, 5, PAPERS))
    cites = np.unique(np.stack([rng.integers(0, PAPERS, 40), rng.integers(0, PAPERS, 40)]), axis=1)
    writes = np.unique(np.stack([rng.integers(0, AUTHORS, 30), rng.integers(0, PAPERS, 30)]),
                       axis=1)
    data[CITES].edge_index = torch.from_numpy(cites)
    data[WRITES].edge_index = torch.from_numpy(writes)
    data[WRITTEN_BY].edge_index = torch.from_numpy(writes[::-1].copy())
    return data


@dataclass
class Graph:
    schema: GraphSchema
    data: HeteroData
    feature_store: NebulaFeatureStore
    graph_store: NebulaGraphStore
    sampler: NebulaNeighborSampler


@pytest.fixture(scope="module")
def graph(nebula_server: NebulaTarget) -> Iterator[Graph]:
    pool, admin = nebula_server.raw_session()
    result = admin.execute(f"CREATE SPACE IF NOT EXISTS {SPACE} (vid_type = INT64)")
    assert result.is_succeeded(), result.error_msg()
    admin.release()
    pool.close()
    schema, data, hooks = shared_edge_schema(), make_data(), nebula_server.hooks(space=SPACE)
    feature_store, graph_store = NebulaFeatureStore(schema, hooks), NebulaGraphStore(schema, hooks)
    put_graph(data, feature_store, graph_store)
    sampler = NebulaNeighborSampler(schema, hooks, [-1, -1])
    yield Graph(schema, data, feature_store, graph_store, sampler)
    for store in (feature_store, graph_store, sampler):
        store.close()


def edge_set(edge_index: Any) -> set[tuple[int, int]]:
    row, col = edge_index
    return set(zip(row.tolist(), col.tolist(), strict=True))


def assert_holds_the_graph(graph: Graph) -> None:
    """Every attribute reads back whole as the oracle has it, sizes included, and every edge
    type's edges are the oracle's."""
    data = graph.data
    for tag, name in (("author", "x"), ("paper", "x"), ("paper", "y")):
        assert graph.feature_store.get_tensor_size(tag, name) == tuple(data[tag][name].shape)
        assert torch.equal(graph.feature_store.get_tensor(tag, name, None), data[tag][name])
    for edge_type in EDGE_TYPES:
        got = graph.graph_store.get_edge_index(edge_type=edge_type, layout="coo")
        assert edge_set(got) == edge_set(data[edge_type].edge_index), edge_type


# ----------------------------------------------------------------------------- shared edge types


def test_edge_types_sharing_a_stored_edge_type_read_only_their_own_edges(graph: Graph) -> None:
    """``('paper','to','paper')`` and ``('author','to','paper')`` are both ``to`` in the space;
    each reads the edges between its own node types (by vid range), as ``HeteroData`` has them."""
    for edge_type in EDGE_TYPES:
        got = graph.graph_store.get_edge_index(edge_type=edge_type, layout="coo")
        assert edge_set(got) == edge_set(graph.data[edge_type].edge_index), edge_type
        row, colptr = graph.graph_store.get_edge_index(edge_type=edge_type, layout="csc")
        columns = torch.repeat_interleave(torch.arange(len(colptr) - 1), colptr.diff())
        assert edge_set((row, columns)) == edge_set(graph.data[edge_type].edge_index), edge_type
    sizes = {attr.edge_type: attr.size for attr in graph.graph_store.get_all_edge_attrs()}
    assert sizes == {CITES: (PAPERS, PAPERS), WRITES: (AUTHORS, PAPERS),
                     WRITTEN_BY: (PAPERS, AUTHORS)}


def test_the_sampler_keeps_edge_types_sharing_a_stored_edge_type_apart(graph: Graph) -> None:
    edges = {edge_type: graph.data[edge_type].edge_index.numpy() for edge_type in EDGE_TYPES}
    for seeds in ([0, 1, 2, 3], [7, 19], list(range(PAPERS))):
        out = graph.sampler.sample_from_nodes(
            NodeSamplerInput(None, torch.tensor(seeds), input_type="paper")
        )
        nodes, expected = reference_khop(edges, {"paper": seeds}, 2)
        for tag in ("author", "paper"):
            assert set(out.node[tag].tolist()) == nodes.get(tag, set())
            assert torch.all(out.node[tag] < len(graph.data[tag].x))
        got = {
            (edge_type, int(out.node[edge_type[0]][src]), int(out.node[edge_type[2]][dst]))
            for edge_type in EDGE_TYPES
            for src, dst in zip(out.row[edge_type].tolist(), out.col[edge_type].tolist(),
                                strict=True)
        }
        assert got == expected


@pytest.mark.parametrize(
    ("edges", "fragment"),
    [
        ((EdgeMapping(CITES, "to"), EdgeMapping(("paper", "cites", "paper"), "to")),
         r"\('paper', 'to', 'paper'\) and \('paper', 'cites', 'paper'\) would both read"),
        ((EdgeMapping(CITES, "to"), EdgeMapping(CITES, "cites")),
         r"edge type \('paper', 'to', 'paper'\) is mapped twice"),
    ],
    ids=["same-endpoints", "same-edge-type-twice"],
)
def test_the_schema_refuses_edge_types_that_would_read_the_same_edges(
    edges: tuple[EdgeMapping, ...], fragment: str
) -> None:
    node_types = shared_edge_schema().node_types
    with pytest.raises(ValueError, match=fragment):
        GraphSchema(node_types, edges)


def test_the_schema_refuses_shared_edge_types_whose_node_types_share_vids() -> None:
    """With the same ``vid_offset`` a vid is an author and a paper at once: ``to`` edges from it
    could belong to either edge type, so the schema refuses (at once, or at the first read when
    the node counts come from the space)."""
    with pytest.raises(ValueError, match=r"'author' and 'paper' .*vid_offset 2000"):
        shared_edge_schema(author_offset=2000)
    with pytest.raises(ValueError, match=r"vids 1990\.\.2009.*vids 2000\.\.2019"):
        GraphSchema(
            (NodeType("author", {}, vid_offset=1990, num_nodes=20),
             NodeType("paper", {}, vid_offset=2000, num_nodes=20)),
            (EdgeMapping(CITES, "to"), EdgeMapping(WRITES, "to")),
        )


def test_vid_ranges_that_overlap_in_the_space_are_refused_at_the_first_read(
    nebula_server: NebulaTarget, graph: Graph
) -> None:
    """The space has 12 authors from vid 1000: an author offset of 1995 would make authors
    1995..2006 overlap the papers from 2000, which only the node counts show."""
    schema = shared_edge_schema(author_offset=1995)
    graph_store = NebulaGraphStore(schema, nebula_server.hooks(space=SPACE))
    with pytest.raises(ValueError, match=r"'author' \(vids 1995\.\.2006\).*'paper'"):
        graph_store.get_edge_index(edge_type=CITES, layout="coo")
    graph_store.close()


# ----------------------------------------------------------------------------- index types


def index_cases() -> list[Any]:
    return [
        5, -1, torch.tensor(5), slice(2, 9, 3), slice(None), torch.tensor([3, 1, 3]),
        torch.tensor([3, 1], dtype=torch.int32), torch.tensor([-1, 0]),
        torch.arange(PAPERS) % 3 == 0, torch.tensor([[0, 1], [2, 3]]),
        torch.zeros(0, dtype=torch.long), [6, 2], np.array([4]),
    ]


@pytest.mark.parametrize("name", ["x", "y"])
@pytest.mark.parametrize("index", index_cases(), ids=lambda index: repr(index)[:30])
def test_indices_answer_as_pygs_heterodata_store(graph: Graph, name: str, index: Any) -> None:
    """``HeteroData`` is PyG's own ``FeatureStore``: ``store['paper', 'x', 5]`` is ``x[5]``,
    shape ``(4,)``, and every index torch takes answers with torch's shape."""
    expected = graph.data.get_tensor(TensorAttr("paper", name, index))
    got = graph.feature_store.get_tensor(TensorAttr("paper", name, index))
    assert got.shape == expected.shape and got.dtype == expected.dtype
    assert torch.equal(got, expected)
    if isinstance(index, int):
        assert torch.equal(graph.feature_store["paper", name, index], expected)


def torch_index_error(index: Any) -> str:
    """torch's own message for ``index`` into a tensor of ``PAPERS`` rows."""
    with pytest.raises(IndexError) as caught:
        torch.zeros(PAPERS, 2)[index]
    return str(caught.value)


def test_a_float_index_raises_torchs_index_error(graph: Graph) -> None:
    message = torch_index_error(torch.tensor([1.7, 3.2]))
    assert message == "tensors used as indices must be long, int, byte or bool tensors"
    with pytest.raises(IndexError, match=message):
        graph.feature_store.get_tensor("paper", "x", torch.tensor([1.7, 3.2]))
    with pytest.raises(IndexError, match=message):
        graph.data.get_tensor("paper", "x", torch.tensor([1.7, 3.2]))  # PyG's store: the same


# ----------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class BadCall:
    """A bad call, the error it must raise and a fragment of its message (a regex)."""

    name: str
    call: Callable[[Graph], Any]
    error: type[BaseException]
    message: str


def seeds(node: Any, input_type: str | None = "paper") -> Callable[[Graph], Any]:
    return lambda graph: graph.sampler.sample_from_nodes(
        NodeSamplerInput(None, node, input_type=input_type)
    )


OUT_OF_RANGE = "index 20 is out of bounds for dimension 0 with size 20"
FLOAT_INDEX = "tensors used as indices must be long, int, byte or bool tensors"
BAD_CALLS = [
    # writes: width, dtype, rows, node range (nothing may reach graphd)
    BadCall("put, 5 wide into 4 wide",
            lambda g: g.feature_store.put_tensor(torch.ones(2, 5), "paper", "x",
                                                 torch.tensor([0, 1])),
            ValueError, r"shape \(2, 5\).*'paper', 'x'.*expected \(2, 4\).*4 wide"),
    BadCall("put whole, 5 wide into 4 wide",
            lambda g: g.feature_store.put_tensor(torch.ones(PAPERS, 5), "paper", "x", None),
            ValueError, r"shape \(20, 5\).*expected \(20, 4\)"),
    BadCall("put, one row for two nodes",
            lambda g: g.feature_store.put_tensor(torch.ones(1, 4), "paper", "x",
                                                 torch.tensor([0, 1])),
            ValueError, r"shape \(1, 4\).*expected \(2, 4\)"),
    BadCall("put whole, a row more than the nodes",
            lambda g: g.feature_store.put_tensor(torch.ones(PAPERS + 1, 4), "paper", "x", None),
            ValueError, r"21 rows.*'paper' has 20 nodes"),
    BadCall("put, floats into an INT attribute",
            lambda g: g.feature_store.put_tensor(torch.tensor([1.5, 2.5]), "paper", "y",
                                                 torch.tensor([0, 1])),
            TypeError, r"torch.float32.*'paper', 'y'.*integer"),
    BadCall("put, bools into features",
            lambda g: g.feature_store.put_tensor(torch.ones(1, 4, dtype=torch.bool), "paper", "x",
                                                 torch.tensor([0])),
            TypeError, r"torch.bool.*floating"),
    BadCall("put, past the node count",
            lambda g: g.feature_store.put_tensor(torch.ones(1, 4), "paper", "x",
                                                 torch.tensor([PAPERS])),
            IndexError, OUT_OF_RANGE),
    BadCall("put, an int past the node count",
            lambda g: g.feature_store.put_tensor(torch.ones(4), "paper", "x", PAPERS),
            IndexError, OUT_OF_RANGE),
    BadCall("put, a float index",
            lambda g: g.feature_store.put_tensor(torch.ones(1, 4), "paper", "x",
                                                 torch.tensor([1.0])),
            IndexError, FLOAT_INDEX),
    BadCall("put, unknown attribute",
            lambda g: g.feature_store.put_tensor(torch.ones(1), "paper", "z", torch.tensor([0])),
            KeyError, r"'z'.*'paper'.*\['x', 'y'\]"),
    BadCall("put, unknown node type",
            lambda g: g.feature_store.put_tensor(torch.ones(1), "venue", "x", torch.tensor([0])),
            KeyError, r"'venue'.*\['author', 'paper'\]"),
    BadCall("remove, past the node count",
            lambda g: g.feature_store.remove_tensor("paper", "y", torch.tensor([PAPERS])),
            IndexError, OUT_OF_RANGE),
    BadCall("remove, unknown attribute",
            lambda g: g.feature_store.remove_tensor("paper", "z", None),
            KeyError, r"'z'.*\['x', 'y'\]"),
    BadCall("put_edge_index, a node past the count",
            lambda g: g.graph_store.put_edge_index(
                (torch.tensor([0]), torch.tensor([PAPERS])), edge_type=CITES, layout="coo"),
            IndexError, r"destination node 20 of edge type \('paper', 'to', 'paper'\) is out of "
                        r"range.*'paper' has 20 nodes"),
    BadCall("put_edge_index, float ids",
            lambda g: g.graph_store.put_edge_index(
                (torch.tensor([0.0]), torch.tensor([1.0])), edge_type=WRITES, layout="coo"),
            IndexError, FLOAT_INDEX),
    BadCall("put_edge_index, unknown edge type",
            lambda g: g.graph_store.put_edge_index(
                (torch.tensor([0]), torch.tensor([1])), edge_type=("paper", "cites", "paper"),
                layout="coo"),
            KeyError, r"\('paper', 'cites', 'paper'\).*\('paper', 'to', 'paper'\), "
                      r"\('author', 'to', 'paper'\), \('paper', 'rev_to', 'author'\)"),
    # reads
    BadCall("get, a float index",
            lambda g: g.feature_store.get_tensor("paper", "x", torch.tensor([1.7, 3.2])),
            IndexError, FLOAT_INDEX),
    BadCall("get, past the node count",
            lambda g: g.feature_store.get_tensor("paper", "x", torch.tensor([3, PAPERS])),
            IndexError, OUT_OF_RANGE),
    BadCall("get, unknown attribute",
            lambda g: g.feature_store.get_tensor("paper", "z", None),
            KeyError, r"'z'.*'paper'.*\['x', 'y'\]"),
    BadCall("get, unknown node type",
            lambda g: g.feature_store.get_tensor("venue", "x", None),
            KeyError, r"'venue'.*\['author', 'paper'\]"),
    BadCall("multi_get, one unknown attribute",
            lambda g: g.feature_store.multi_get_tensor(
                [TensorAttr("paper", "x", torch.tensor([0])), TensorAttr("author", "y", None)]),
            KeyError, r"'y'.*'author'.*\['x'\]"),
    BadCall("get_tensor_size, unknown attribute",
            lambda g: g.feature_store.get_tensor_size("paper", "z"),
            KeyError, r"'z'.*\['x', 'y'\]"),
    BadCall("get_edge_index, unknown edge type",
            lambda g: g.graph_store.get_edge_index(edge_type=("paper", "cites", "paper"),
                                                   layout="coo"),
            KeyError, r"\('paper', 'cites', 'paper'\).*\('paper', 'rev_to', 'author'\)"),
    BadCall("get_edge_index, no edge type in a heterogeneous schema",
            lambda g: g.graph_store.get_edge_index(EdgeAttr(None, "coo")),
            KeyError, r"needs an edge type.*\('author', 'to', 'paper'\)"),
    # the sampler's seeds
    BadCall("sample, float seeds", seeds(torch.tensor([1.0, 2.0])), IndexError, FLOAT_INDEX),
    BadCall("sample, bool seeds", seeds(torch.tensor([True, False])), IndexError,
            r"seed nodes must be an integer tensor.*torch.bool"),
    BadCall("sample, a seed past the node count", seeds(torch.tensor([0, PAPERS])), IndexError,
            r"seed node 20 is out of range.*'paper' has 20 nodes \(0\.\.19\)"),
    BadCall("sample, a negative seed", seeds(torch.tensor([-1, 3])), IndexError,
            r"seed node -1 is out of range.*0\.\.19"),
    BadCall("sample, unknown node type", seeds(torch.tensor([0]), "venue"), KeyError,
            r"'venue'.*\['author', 'paper'\]"),
    BadCall("sample, no node type in a heterogeneous schema", seeds(torch.tensor([0]), None),
            KeyError, r"needs a node type.*\['author', 'paper'\]"),
    BadCall("sampler, num_neighbors for an edge type not in the schema",
            lambda g: NebulaNeighborSampler(
                g.schema, g.sampler.hooks,
                {**{edge_type: [1] for edge_type in EDGE_TYPES}, ("paper", "cites", "paper"): [1]}),
            KeyError, r"\('paper', 'cites', 'paper'\) is not in the schema; its edge types are"),
]


class Recorder:
    """Records every statement sent on a store's own session while installed."""

    def __init__(self, stores: list[Any]) -> None:
        self.sessions = list({id(s): s for s in (store.session() for store in stores)}.values())
        self.sent: list[str] = []

    def __enter__(self) -> Recorder:
        for session in self.sessions:
            for method in ("execute", "execute_json"):
                original = getattr(session, method)

                def recording(statement: str, original: Any = original) -> Any:
                    self.sent.append(statement)
                    return original(statement)

                setattr(session, method, recording)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        for session in self.sessions:
            del session.execute, session.execute_json


@pytest.mark.parametrize("bad", BAD_CALLS, ids=[bad.name for bad in BAD_CALLS])
def test_bad_input_is_refused_before_anything_reaches_graphd(graph: Graph, bad: BadCall) -> None:
    """Each row: the error type and message, no write (nor, for the sampler, any ``GO``) sent,
    and the space still reads back exactly the graph it held."""
    with (Recorder([graph.feature_store, graph.graph_store, graph.sampler]) as recorder,
          pytest.raises(bad.error, match=bad.message)):
        bad.call(graph)
    reads = ("FETCH ", "LOOKUP ")  # node counts and the like; no write, no GO
    assert [s for s in recorder.sent if not s.startswith(reads)] == []
    assert_holds_the_graph(graph)


def test_errors_are_one_family_and_keep_their_message_when_pickled(graph: Graph) -> None:
    from mploader import MploaderError

    by_name = {bad.name: bad for bad in BAD_CALLS}
    for name in ("put, 5 wide into 4 wide", "put, floats into an INT attribute",
                 "put, past the node count", "put, unknown attribute", "sample, bool seeds"):
        with pytest.raises(MploaderError) as caught:
            by_name[name].call(graph)
        again = pickle.loads(pickle.dumps(caught.value))
        assert type(again) is type(caught.value) and str(again) == str(caught.value)
        assert not str(caught.value).startswith(("'", '"'))  # a KeyError, printed unquoted


def test_a_write_in_range_still_lands(graph: Graph) -> None:
    """The checks let good writes through: an int index writes one row (HeteroData's
    ``x[5] = row``), a tensor index several, then the graph is put back.  (The table's recorder
    sees these writes.)"""
    data = graph.data
    with Recorder([graph.feature_store]) as recorder:
        graph.feature_store.put_tensor(torch.full((PAPER_DIM,), 9.0), "paper", "x", 5)
        graph.feature_store.put_tensor(torch.tensor([7, 8], dtype=torch.int32), "paper", "y",
                                       torch.tensor([-1, 0]))
    upserted = re.findall(r"UPSERT VERTEX ON `paper` (\d+)", "; ".join(recorder.sent))
    assert upserted == ["2005", "2019", "2000"]
    expected_x, expected_y = data["paper"].x.clone(), data["paper"].y.clone()
    expected_x[5] = 9.0
    expected_y[-1], expected_y[0] = 7, 8
    try:
        assert torch.equal(graph.feature_store.get_tensor("paper", "x", None), expected_x)
        assert torch.equal(graph.feature_store.get_tensor("paper", "y", None), expected_y)
    finally:
        graph.feature_store.put_tensor(data["paper"].x, "paper", "x", None)
        graph.feature_store.put_tensor(data["paper"].y, "paper", "y", None)
    assert_holds_the_graph(graph)
