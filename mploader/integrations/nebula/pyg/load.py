"""Load a PyG ``Data`` / ``HeteroData`` into a NebulaGraph space in one call."""

from __future__ import annotations

from typing import Any

from torch_geometric.data import EdgeAttr, HeteroData, TensorAttr
from torch_geometric.data.graph_store import EdgeLayout

from mploader.integrations.nebula.pyg.feature_store import NebulaFeatureStore
from mploader.integrations.nebula.pyg.graph_store import NebulaGraphStore
from mploader.integrations.nebula.pyg.queries import execute
from mploader.integrations.nebula.pyg.schema import GraphSchema


def schema_statements(schema: GraphSchema) -> list[str]:
    """``CREATE TAG`` / ``CREATE EDGE`` for the schema, and an index on each (``LOOKUP``
    scans need one).  Made before the data, so no ``REBUILD INDEX`` is needed."""
    statements = []
    for node_type in schema.node_types:
        columns = ", ".join(
            f"`{attribute.prop}` {attribute.nebula_type}"
            for attribute in node_type.attributes.values()
        )
        statements.append(f"CREATE TAG IF NOT EXISTS `{node_type.tag}`({columns})")
        statements.append(
            f"CREATE TAG INDEX IF NOT EXISTS `{node_type.tag}_index` ON `{node_type.tag}`()"
        )
    for edge in dict.fromkeys(mapping.edge for mapping in schema.edges):
        statements.append(f"CREATE EDGE IF NOT EXISTS `{edge}`()")
        statements.append(f"CREATE EDGE INDEX IF NOT EXISTS `{edge}_index` ON `{edge}`()")
    return statements


def put_graph(
    data: Any, feature_store: NebulaFeatureStore, graph_store: NebulaGraphStore
) -> None:
    """Write ``data`` (a ``Data`` or ``HeteroData``) into the stores' space.

    Creates the schema's tags, edge types and indexes (``IF NOT EXISTS``), then writes every
    schema attribute through ``feature_store.put_tensor`` and every stored (not ``reverse``)
    edge type through ``graph_store.put_edge_index``.  The space must exist and be the hooks'.
    Against a real graphd, new schema reaches the storage after a heartbeat (about 10 s): run
    :func:`schema_statements` yourself first and wait if the writes are refused.
    """
    schema = feature_store.schema
    session = feature_store.session()
    for statement in schema_statements(schema):
        execute(session, statement)
    hetero = isinstance(data, HeteroData)
    for node_type in schema.node_types:
        store = data[node_type.tag] if hetero else data
        for name in node_type.attributes:
            feature_store.put_tensor(store[name], TensorAttr(node_type.tag, name, None))
    for mapping in schema.edges:
        if mapping.reverse:
            continue
        edge_index = data[mapping.edge_type].edge_index if hetero else data.edge_index
        attr = EdgeAttr(mapping.edge_type if schema.is_hetero else None, EdgeLayout.COO)
        graph_store.put_edge_index((edge_index[0], edge_index[1]), attr)
