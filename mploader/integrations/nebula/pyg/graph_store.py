"""PyG's ``GraphStore`` on NebulaGraph: an edge type's ``edge_index`` from a ``LOOKUP`` scan.

For users who have pyg-lib or torch-sparse and want PyG's in-memory samplers (they call
``csc()`` once and keep the topology).  :class:`NebulaNeighborSampler` needs none of this: it
asks the server hop by hop.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch_geometric.data import EdgeAttr, GraphStore
from torch_geometric.data.graph_store import EdgeLayout
from torch_geometric.utils import index_sort
from torch_geometric.utils.sparse import index2ptr

from mploader.integrations.nebula.hooks import NebulaHooks
from mploader.integrations.nebula.pyg.errors import WriteShapeError
from mploader.integrations.nebula.pyg.nodes import NodeCounts, check_node_ids
from mploader.integrations.nebula.pyg.queries import SessionSource, execute, rows
from mploader.integrations.nebula.pyg.schema import EdgeMapping, GraphSchema
from mploader.integrations.nebula.statements import GRAPHD_MAX_QUERY_BYTES, split_id_statements


class NebulaGraphStore(GraphStore):
    """``edge_index`` of each edge type of a :class:`GraphSchema`, in COO, CSR or CSC.

    Every call scans the edge type (``LOOKUP ON edge``, which needs an index on it, as in
    graphd); nothing is cached.  Homogeneous schemas answer with ``edge_type=None``, so PyG's
    ``csc()`` gives one ``(row, colptr, perm)`` rather than a dict.
    """

    def __init__(
        self, schema: GraphSchema, hooks: NebulaHooks, max_query_bytes: int = GRAPHD_MAX_QUERY_BYTES
    ) -> None:
        super().__init__()
        self.schema = schema
        self.hooks = hooks
        self.session = SessionSource(hooks)
        self.max_query_bytes = max_query_bytes
        self.counts = NodeCounts(schema, self.session)

    def get_all_edge_attrs(self) -> list[EdgeAttr]:
        """Each edge type, COO, with its size ``(source nodes, destination nodes)``."""
        return [
            EdgeAttr(
                mapping.edge_type if self.schema.is_hetero else None,
                EdgeLayout.COO,
                size=self._size(mapping),
            )
            for mapping in self.schema.edges
        ]

    def _get_edge_index(self, edge_attr: EdgeAttr) -> tuple[torch.Tensor, torch.Tensor]:
        mapping = self.schema.edge_mapping(edge_attr.edge_type)
        row, col = self._scan(mapping)
        layout = EdgeLayout(edge_attr.layout)
        size = edge_attr.size or self._size(mapping)
        if layout == EdgeLayout.COO:
            return row, col
        if layout == EdgeLayout.CSR:
            row, perm = index_sort(row, max_value=size[0])
            return index2ptr(row, size[0]), col[perm]
        col, perm = index_sort(col, max_value=size[1])
        return row[perm], index2ptr(col, size[1])

    def _put_edge_index(self, edge_index: Any, edge_attr: EdgeAttr) -> bool:
        """``INSERT EDGE`` the COO ``edge_index`` (in the stored direction), once every endpoint
        is checked to be a node of its type."""
        mapping = self.schema.edge_mapping(edge_attr.edge_type)
        if EdgeLayout(edge_attr.layout) != EdgeLayout.COO:
            raise ValueError("NebulaGraphStore.put_edge_index takes COO edge indices")
        source, destination = self._vids(mapping, *edge_index)
        values = [f"{src}->{dst}:()" for src, dst in zip(source, destination, strict=True)]
        session = self.session()
        head = f"INSERT EDGE `{mapping.edge}`() VALUES "
        for statement in split_id_statements(head, values, "", max_bytes=self.max_query_bytes):
            execute(session, statement)
        return True

    def _remove_edge_index(self, edge_attr: EdgeAttr) -> bool:
        raise NotImplementedError("NebulaGraphStore does not delete edges")

    def _scan(self, mapping: EdgeMapping) -> tuple[torch.Tensor, torch.Tensor]:
        """The stored edges between nodes of the edge type's node types (other PyG edge types
        may read the same NebulaGraph edge type between other node types)."""
        self.counts.check_apart()
        found = rows(
            self.session(), f"LOOKUP ON `{mapping.edge}` YIELD src(edge) AS s, dst(edge) AS d"
        )
        pairs = np.array(found, dtype=np.int64).reshape(-1, 2)
        source_type, _, destination_type = mapping.edge_type
        source, destination = pairs[:, 0], pairs[:, 1]
        if mapping.reverse:
            source, destination = destination, source
        ours = self.counts.contains(source_type, source)
        ours &= self.counts.contains(destination_type, destination)
        row = source[ours] - self.schema.node_type(source_type).vid_offset
        col = destination[ours] - self.schema.node_type(destination_type).vid_offset
        return torch.from_numpy(row), torch.from_numpy(col)

    def _vids(self, mapping: EdgeMapping, row: Any, col: Any) -> tuple[list[int], list[int]]:
        source_type, _, destination_type = mapping.edge_type
        where = f" of edge type {tuple(mapping.edge_type)}"
        source = check_node_ids(row, self.counts(source_type), source_type, "source node", where)
        destination = check_node_ids(
            col, self.counts(destination_type), destination_type, "destination node", where
        )
        if len(source) != len(destination):
            raise WriteShapeError(
                f"put_edge_index of {tuple(mapping.edge_type)} got {len(source)} source and "
                f"{len(destination)} destination nodes: a COO edge index has one of each per edge"
            )
        source = source + self.schema.node_type(source_type).vid_offset
        destination = destination + self.schema.node_type(destination_type).vid_offset
        if mapping.reverse:
            source, destination = destination, source
        return source.tolist(), destination.tolist()

    def _size(self, mapping: EdgeMapping) -> tuple[int, int]:
        source_type, _, destination_type = mapping.edge_type
        return self.counts(source_type), self.counts(destination_type)

    def close(self) -> None:
        """Sign out this process's own sessions (worker sessions belong to the loader)."""
        self.session.close()

    def __repr__(self) -> str:
        return f"NebulaGraphStore(edges={[m.edge_type for m in self.schema.edges]}, {self.hooks!r})"
