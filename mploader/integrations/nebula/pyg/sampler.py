"""PyG's neighbour sampling, asked of the server hop by hop: no topology in memory, no pyg-lib.

Each hop sends one ``GO FROM <frontier> OVER <edge> [REVERSELY]`` per edge type (split below
graphd's query size limit) for the frontier's edges, and keeps at most ``k`` of each frontier
node's edges, drawn with a seeded generator.  The draw is made here rather than with nGQL's
``SAMPLE``/``LIMIT`` lists because those cap a whole step (not each vertex) and cannot be seeded:
PyG's ``num_neighbors`` is per node, and the sample must be reproducible.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch_geometric.sampler import (
    BaseSampler,
    HeteroSamplerOutput,
    NodeSamplerInput,
    SamplerOutput,
)

from mploader.integrations.nebula.hooks import NebulaHooks
from mploader.integrations.nebula.pyg.nodes import NodeCounts, check_node_ids
from mploader.integrations.nebula.pyg.queries import SessionSource, rows
from mploader.integrations.nebula.pyg.schema import EdgeMapping, EdgeType, GraphSchema
from mploader.integrations.nebula.statements import GRAPHD_MAX_QUERY_BYTES, split_id_statements
from mploader.worker.item_random import item_generator

NumNeighbors = Sequence[int] | Mapping[EdgeType, Sequence[int]]


class NebulaNeighborSampler(BaseSampler):
    """``NeighborSampler``'s output (``disjoint=False``, no replacement) from NebulaGraph.

    ``num_neighbors``: per hop, how many edges of each node to follow (``-1``: all), for every
    edge type or as ``{edge_type: [...]}``.  Edges are followed into the frontier (PyG's
    direction: messages flow from the sampled neighbour to the node that sampled it).

    Reproducible: inside an mploader fetch the draws come from ``mploader.item_generator()``
    (the worker seed, epoch and batch: the same batches sample the same neighbours on every
    run, whatever ``worker_threads`` is); anywhere else from ``seed`` and the batch's seed nodes.
    """

    def __init__(
        self,
        schema: GraphSchema,
        hooks: NebulaHooks,
        num_neighbors: NumNeighbors,
        seed: int = 0,
        max_query_bytes: int = GRAPHD_MAX_QUERY_BYTES,
    ) -> None:
        if not schema.edges:
            raise ValueError("NebulaNeighborSampler needs a schema with at least one edge type")
        self.schema = schema
        self.hooks = hooks
        self.session = SessionSource(hooks)
        self.counts = NodeCounts(schema, self.session)
        self.seed = seed
        self.max_query_bytes = max_query_bytes
        self.num_neighbors = _per_edge_type(schema, num_neighbors)
        hops = {len(fanout) for fanout in self.num_neighbors.values()}
        if len(hops) != 1:
            raise ValueError(f"every edge type needs the same number of hops, got {hops}")
        self.num_hops = hops.pop()

    def sample_from_nodes(
        self, inputs: NodeSamplerInput, **kwargs: Any
    ) -> SamplerOutput | HeteroSamplerOutput:
        """Sample the subgraph around ``inputs.node`` (the seed nodes of ``inputs.input_type``),
        as PyG's ``NodeLoader`` asks: a ``SamplerOutput`` for a homogeneous schema, else a
        ``HeteroSamplerOutput``; node ids are PyG indices per node type, and ``edge`` is
        ``None`` (no edge ids are kept).  Seed indices are checked against the node counts
        before the first hop is asked (:class:`~mploader.NodeIndexError`)."""
        input_type = self.schema.node_type(inputs.input_type).tag
        seeds = check_node_ids(inputs.node, self.counts(input_type), input_type, "seed node")
        self.counts.check_apart()
        generator = self._generator(seeds)
        sampled = _Subgraph(self.schema, input_type, seeds)
        session = self.session()
        for _ in range(self.num_hops):
            frontier = sampled.frontier()
            for mapping in self.schema.edges:
                hop = len(sampled.edge_counts[mapping.edge_type])
                fanout = self.num_neighbors[mapping.edge_type][hop]
                targets = frontier.get(mapping.edge_type[2], np.zeros(0, np.int64))
                neighbours, ends = self._edges_into(session, mapping, targets)
                keep = _draw(ends, fanout, generator)
                sampled.add_edges(mapping, neighbours[keep], ends[keep])
            sampled.end_hop()
        return sampled.output(inputs, hetero=self.schema.is_hetero)

    def sample_from_edges(self, inputs: Any, neg_sampling: Any = None) -> Any:
        """Not supported: this sampler serves ``NodeLoader`` (seed nodes), not ``LinkLoader``;
        raises ``NotImplementedError``."""
        raise NotImplementedError(
            "NebulaNeighborSampler samples from nodes (NodeLoader), not from edges (LinkLoader)"
        )

    def _edges_into(
        self, session: Any, mapping: EdgeMapping, targets: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(neighbour, target)`` index pairs of every edge of ``mapping`` into ``targets``,
        sorted by target then neighbour (a server's row order must not change the sample).
        Only neighbours of the edge type's source node type count: other PyG edge types may
        read the same NebulaGraph edge type from other node types."""
        if len(targets) == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        source_type, _, destination_type = mapping.edge_type
        offset = self.schema.node_type(destination_type).vid_offset
        neighbour_offset = self.schema.node_type(source_type).vid_offset
        # stored direction: the neighbour is the edge's source, so walk it backwards;
        # a reverse mapping reads a stored edge target -> neighbour, so walk it forwards
        direction = "" if mapping.reverse else " REVERSELY"
        head = "GO FROM "
        tail = f" OVER `{mapping.edge}`{direction} YIELD src(edge) AS s, dst(edge) AS d"
        vids = [str(vid) for vid in (targets + offset).tolist()]
        found: list[list[Any]] = []
        for statement in split_id_statements(head, vids, tail, max_bytes=self.max_query_bytes):
            found.extend(rows(session, statement))
        pairs = np.array(found, dtype=np.int64).reshape(-1, 2)
        if mapping.reverse:
            ends, neighbours = pairs[:, 0], pairs[:, 1]
        else:
            neighbours, ends = pairs[:, 0], pairs[:, 1]
        ours = self.counts.contains(source_type, neighbours)
        neighbours, ends = neighbours[ours] - neighbour_offset, ends[ours] - offset
        order = np.lexsort((neighbours, ends))
        return neighbours[order], ends[order]

    def _generator(self, seeds: np.ndarray) -> torch.Generator:
        try:
            return item_generator()
        except RuntimeError:  # not inside an mploader fetch: seeded by the batch itself
            digest = hashlib.blake2b(seeds.tobytes(), digest_size=8, key=str(self.seed).encode())
            generator = torch.Generator()
            generator.manual_seed(int.from_bytes(digest.digest(), "little") >> 1)
            return generator

    def close(self) -> None:
        """Sign out this process's own session, if the sampler made one outside a loader's
        workers (sessions in workers belong to the loader's hooks)."""
        self.session.close()

    def __repr__(self) -> str:
        return f"NebulaNeighborSampler(num_neighbors={self.num_neighbors}, {self.hooks!r})"


def _per_edge_type(schema: GraphSchema, num_neighbors: NumNeighbors) -> dict[EdgeType, list[int]]:
    if isinstance(num_neighbors, Mapping):
        fanouts = {tuple(key): list(value) for key, value in num_neighbors.items()}
        for edge_type in fanouts:
            schema.edge_mapping(edge_type)  # type: ignore[arg-type]  # an unknown one: its error
        missing = [m.edge_type for m in schema.edges if tuple(m.edge_type) not in fanouts]
        if missing:
            raise ValueError(f"num_neighbors has no entry for the edge types {missing}")
        return {m.edge_type: fanouts[tuple(m.edge_type)] for m in schema.edges}  # type: ignore[index]
    return {mapping.edge_type: list(num_neighbors) for mapping in schema.edges}


def _draw(ends: np.ndarray, fanout: int, generator: torch.Generator) -> np.ndarray:
    """Positions of at most ``fanout`` edges per target (``ends`` sorted), uniformly drawn."""
    if fanout < 0 or len(ends) == 0:
        return np.arange(len(ends))
    keys = torch.rand(len(ends), generator=generator, dtype=torch.float64).numpy()
    order = np.lexsort((keys, ends))
    starts = np.searchsorted(ends, ends[order], side="left")
    rank = np.arange(len(ends)) - starts
    return np.sort(order[rank < fanout])


class _Subgraph:
    """The nodes (per type, in the order met) and edges sampled so far, hop by hop."""

    def __init__(self, schema: GraphSchema, input_type: str, seeds: np.ndarray) -> None:
        self.tags = [node_type.tag for node_type in schema.node_types]
        self.nodes: dict[str, list[int]] = {tag: [] for tag in self.tags}
        self.local: dict[str, dict[int, int]] = {tag: {} for tag in self.tags}
        self.node_counts: dict[str, list[int]] = {tag: [] for tag in self.tags}
        self.rows: dict[EdgeType, list[np.ndarray]] = {m.edge_type: [] for m in schema.edges}
        self.cols: dict[EdgeType, list[np.ndarray]] = {m.edge_type: [] for m in schema.edges}
        self.edge_counts: dict[EdgeType, list[int]] = {m.edge_type: [] for m in schema.edges}
        self._hop_start = {tag: 0 for tag in self.tags}
        for seed in seeds.tolist():
            self._local_index(input_type, seed)
        self.end_hop()
        self.edge_counts = {key: [] for key in self.edge_counts}

    def frontier(self) -> dict[str, np.ndarray]:
        """The nodes added in the last hop, per type."""
        return {
            tag: np.asarray(self.nodes[tag][self._hop_start[tag] - self.node_counts[tag][-1] :],
                            dtype=np.int64)
            for tag in self.tags
        }

    def add_edges(self, mapping: EdgeMapping, neighbours: np.ndarray, ends: np.ndarray) -> None:
        source_type, _, destination_type = mapping.edge_type
        row = [self._local_index(source_type, node) for node in neighbours.tolist()]
        col = [self.local[destination_type][node] for node in ends.tolist()]
        self.rows[mapping.edge_type].append(np.asarray(row, dtype=np.int64))
        self.cols[mapping.edge_type].append(np.asarray(col, dtype=np.int64))
        self.edge_counts[mapping.edge_type].append(len(row))

    def end_hop(self) -> None:
        for tag in self.tags:
            self.node_counts[tag].append(len(self.nodes[tag]) - self._hop_start[tag])
            self._hop_start[tag] = len(self.nodes[tag])

    def _local_index(self, tag: str, node: int) -> int:
        local = self.local[tag]
        index = local.get(node)
        if index is None:
            index = local[node] = len(self.nodes[tag])
            self.nodes[tag].append(node)
        return index

    def output(self, inputs: NodeSamplerInput, hetero: bool) -> Any:
        node = {tag: torch.tensor(self.nodes[tag], dtype=torch.long) for tag in self.tags}
        row = {key: _cat(parts) for key, parts in self.rows.items()}
        col = {key: _cat(parts) for key, parts in self.cols.items()}
        metadata = (inputs.input_id, inputs.time)
        if hetero:
            return HeteroSamplerOutput(
                node=node,
                row=row,
                col=col,
                edge=None,
                num_sampled_nodes=self.node_counts,
                num_sampled_edges=self.edge_counts,
                metadata=metadata,
            )
        (tag,) = self.tags
        (edge_type,) = row
        return SamplerOutput(
            node=node[tag],
            row=row[edge_type],
            col=col[edge_type],
            edge=None,
            num_sampled_nodes=self.node_counts[tag],
            num_sampled_edges=self.edge_counts[edge_type],
            metadata=metadata,
        )


def _cat(parts: list[np.ndarray]) -> torch.Tensor:
    if not parts:
        return torch.zeros(0, dtype=torch.long)
    return torch.from_numpy(np.concatenate(parts))
