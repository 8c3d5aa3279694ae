"""How a PyG graph maps onto a NebulaGraph space: node types are tags, edge types edge types.

One :class:`GraphSchema` is shared by the feature store, the graph store and the sampler, so the
three agree on which tag holds which attribute and how PyG's per-type node indices become vids.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

FEATURES = "features"  # a float vector in a string property (FEATURE_ENCODING)
INT = "int"  # an INT64 property, one value per node (labels)
FLOAT = "float"  # a DOUBLE property, one value per node
_KINDS = (FEATURES, INT, FLOAT)

EdgeType = tuple[str, str, str]


@dataclass(frozen=True)
class NodeAttribute:
    """One PyG attribute of a node type: the property holding it, its kind and, for features,
    its width."""

    prop: str
    kind: str
    dim: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(f"NodeAttribute kind must be one of {_KINDS}, got {self.kind!r}")
        if (self.kind == FEATURES) != (self.dim is not None and self.dim >= 1):
            raise ValueError(
                f"NodeAttribute({self.prop!r}): a {FEATURES!r} attribute needs dim >= 1, "
                f"other kinds none; got kind={self.kind!r}, dim={self.dim!r}"
            )

    @property
    def nebula_type(self) -> str:
        return {FEATURES: "string", INT: "int", FLOAT: "double"}[self.kind]


@dataclass(frozen=True)
class NodeType:
    """A tag: its PyG attributes and where its nodes' vids start (vid = vid_offset + index).

    NebulaGraph vids are unique across tags, PyG indices are per node type: ``vid_offset`` keeps
    the node types of one space apart.  ``num_nodes`` (optional) saves a ``LOOKUP`` scan.
    """

    tag: str
    attributes: Mapping[str, NodeAttribute]
    vid_offset: int = 0
    num_nodes: int | None = None


@dataclass(frozen=True)
class EdgeMapping:
    """A PyG edge type answered by a NebulaGraph edge type, in its stored direction or reversed.

    ``reverse=True`` gives PyG's ``rev_`` edge types (``ToUndirected``) without storing them:
    ``(paper, rev_writes, author)`` is ``writes`` read backwards.
    """

    edge_type: EdgeType
    edge: str
    reverse: bool = False


@dataclass(frozen=True)
class GraphSchema:
    """Node types (tags) and edge types of a graph kept in one NebulaGraph space."""

    node_types: Sequence[NodeType]
    edges: Sequence[EdgeMapping] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        tags = [node_type.tag for node_type in self.node_types]
        if not tags or len(set(tags)) != len(tags):
            raise ValueError(f"GraphSchema needs distinct node types (tags), got {tags}")
        for mapping in self.edges:
            source, _, destination = mapping.edge_type
            if source not in tags or destination not in tags:
                raise ValueError(
                    f"edge type {mapping.edge_type} joins node types not in the schema {tags}"
                )

    @property
    def is_hetero(self) -> bool:
        return len(self.node_types) > 1 or len(self.edges) > 1

    def node_type(self, tag: str | None) -> NodeType:
        if tag is None:
            if len(self.node_types) != 1:
                raise KeyError("a heterogeneous schema needs a node type (group_name)")
            return self.node_types[0]
        for node_type in self.node_types:
            if node_type.tag == tag:
                return node_type
        known = [node_type.tag for node_type in self.node_types]
        raise KeyError(f"node type {tag!r} is not in the schema ({known})")

    def edge_mapping(self, edge_type: EdgeType | None) -> EdgeMapping:
        if edge_type is None:
            if len(self.edges) != 1:
                raise KeyError("a schema with several edge types needs an edge type")
            return self.edges[0]
        for mapping in self.edges:
            if tuple(mapping.edge_type) == tuple(edge_type):
                return mapping
        raise KeyError(f"edge type {edge_type} is not in the schema")


def homogeneous_schema(
    tag: str,
    attributes: Mapping[str, NodeAttribute],
    edge: str,
    num_nodes: int | None = None,
) -> GraphSchema:
    """One tag and one edge type: PyG's ``Data`` (edge type ``(tag, edge, tag)``)."""
    return GraphSchema(
        (NodeType(tag, dict(attributes), 0, num_nodes),), (EdgeMapping((tag, edge, tag), edge),)
    )
