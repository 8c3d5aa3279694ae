"""How a PyG graph maps onto a NebulaGraph space: node types are tags, edge types edge types.

One :class:`GraphSchema` is shared by the feature store, the graph store and the sampler, so the
three agree on which tag holds which attribute and how PyG's per-type node indices become vids.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from mploader.integrations.nebula.pyg.errors import SchemaConflictError, UnknownNameError

FEATURES = "features"  #: A :class:`NodeAttribute` kind, a float vector in a string property.
INT = "int"  #: A :class:`NodeAttribute` kind, one INT64 value per node (labels).
FLOAT = "float"  #: A :class:`NodeAttribute` kind, one DOUBLE value per node.
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
        """The NebulaGraph property type that holds this kind (``string`` for features, stored
        as ``FEATURE_ENCODING``; ``int``; ``double``)."""
        return {FEATURES: "string", INT: "int", FLOAT: "double"}[self.kind]

    @property
    def row_shape(self) -> tuple[int, ...]:
        """The shape of one node's value (``(dim,)`` for features, ``()`` for a number)."""
        return (self.dim,) if self.dim is not None else ()

    def describe(self) -> str:
        """For messages: ``a row 4 wide (FEATURES in property `feat`)``."""
        held = f"{self.kind.upper()} in property `{self.prop}`"
        if self.dim is not None:
            return f"a row {self.dim} wide ({held})"
        return f"one value ({held})"


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

    @property
    def stored_ends(self) -> tuple[str, str]:
        """The node types of the stored edges' source and destination."""
        source, _, destination = self.edge_type
        return (destination, source) if self.reverse else (source, destination)


@dataclass(frozen=True)
class GraphSchema:
    """Node types (tags) and edge types of a graph kept in one NebulaGraph space.

    Several PyG edge types may share one NebulaGraph edge type (PyG's own heterogeneous graphs
    call every relation ``'to'``): each reads the stored edges whose endpoints are nodes of its
    own node types, told apart by their vid ranges (``vid_offset`` .. ``vid_offset + count``).
    Refused here: two PyG edge types that would read the same stored edges (same edge type, same
    direction, same endpoint node types), and sharing edge types whose node types start at the
    same ``vid_offset`` or whose declared ``num_nodes`` make their vid ranges overlap (ranges
    known only from the space are checked at the first read, :meth:`overlap`).
    """

    node_types: Sequence[NodeType]
    edges: Sequence[EdgeMapping] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        tags = [node_type.tag for node_type in self.node_types]
        if not tags or len(set(tags)) != len(tags):
            raise ValueError(f"GraphSchema needs distinct node types (tags), got {tags}")
        mapped: dict[tuple[str, ...], str] = {}
        for mapping in self.edges:
            source, _, destination = mapping.edge_type
            if source not in tags or destination not in tags:
                raise ValueError(
                    f"edge type {mapping.edge_type} joins node types not in the schema {tags}"
                )
            edge_type = tuple(mapping.edge_type)
            if edge_type in mapped:
                raise SchemaConflictError(
                    f"edge type {edge_type} is mapped twice (onto `{mapped[edge_type]}` and "
                    f"`{mapping.edge}`): a PyG edge type reads one NebulaGraph edge type"
                )
            mapped[edge_type] = mapping.edge
        self._refuse_edges_read_twice()
        for rule in self.kept_apart():
            rule.check(self, self._declared_count)

    @property
    def is_hetero(self) -> bool:
        """Whether PyG sees a heterogeneous graph (``HeteroData``), i.e. more than one node type
        or more than one edge type."""
        return len(self.node_types) > 1 or len(self.edges) > 1

    @property
    def tags(self) -> list[str]:
        """The node types' tags, in the schema's order."""
        return [node_type.tag for node_type in self.node_types]

    def node_type(self, tag: str | None) -> NodeType:
        """The node type of ``tag`` (``None``: the only one, in a homogeneous schema), or an
        ``UnknownNameError`` listing the schema's node types."""
        if tag is None:
            if len(self.node_types) != 1:
                raise UnknownNameError(
                    f"a heterogeneous schema needs a node type (group_name, input_type); "
                    f"its node types are {self.tags}"
                )
            return self.node_types[0]
        for node_type in self.node_types:
            if node_type.tag == tag:
                return node_type
        raise UnknownNameError(
            f"node type {tag!r} is not in the schema; its node types are {self.tags}"
        )

    def attribute(self, tag: str | None, name: str) -> tuple[NodeType, NodeAttribute]:
        """A node type and one of its attributes, or an error listing the type's attributes."""
        node_type = self.node_type(tag)
        attribute = node_type.attributes.get(name)
        if attribute is None:
            raise UnknownNameError(
                f"attribute {name!r} is not in the schema; node type {node_type.tag!r} has the "
                f"attributes {list(node_type.attributes)}"
            )
        return node_type, attribute

    def edge_mapping(self, edge_type: EdgeType | None) -> EdgeMapping:
        """The mapping of PyG's ``(source, relation, destination)`` edge type (``None``: the only
        one), or an ``UnknownNameError`` listing the schema's edge types."""
        if edge_type is None:
            if len(self.edges) != 1:
                raise UnknownNameError(
                    f"a schema with several edge types needs an edge type; its edge types are "
                    f"{self._edge_types()}"
                )
            return self.edges[0]
        for mapping in self.edges:
            if tuple(mapping.edge_type) == tuple(edge_type):
                return mapping
        given = tuple(edge_type) if isinstance(edge_type, list | tuple) else edge_type
        raise UnknownNameError(
            f"edge type {given!r} is not in the schema; its edge types are {self._edge_types()}"
        )

    def kept_apart(self) -> list[KeptApart]:
        """For each two PyG edge types on one NebulaGraph edge type with different endpoint
        node types: the node type pairs whose vid ranges tell their edges apart (one suffices)."""
        rules = []
        for number, first in enumerate(self.edges):
            for second in self.edges[number + 1 :]:
                if first.edge == second.edge and first.stored_ends != second.stored_ends:
                    pairs = tuple(
                        (a, b) for a, b in zip(first.stored_ends, second.stored_ends, strict=True)
                        if a != b
                    )
                    rules.append(KeptApart(first, second, pairs))
        return rules

    def overlap(self, first: str, second: str, count: Callable[[str], int | None]) -> str | None:
        """How the vid ranges of two node types overlap (None: they do not, or ``count`` does
        not know); ``count`` gives a type's node count."""
        a, b = sorted((first, second))
        start_a, start_b = self.node_type(a).vid_offset, self.node_type(b).vid_offset
        if start_a == start_b:
            return f"{a!r} and {b!r} both start at vid_offset {start_a}"
        count_a, count_b = count(a), count(b)
        if count_a is None or count_b is None or count_a == 0 or count_b == 0:
            return None
        if start_a < start_b + count_b and start_b < start_a + count_a:
            return (
                f"{a!r} (vids {start_a}..{start_a + count_a - 1}) and "
                f"{b!r} (vids {start_b}..{start_b + count_b - 1}) overlap"
            )
        return None

    def _refuse_edges_read_twice(self) -> None:
        reading: dict[tuple[str, bool, str, str], EdgeMapping] = {}
        for mapping in self.edges:
            key = (mapping.edge, mapping.reverse, *mapping.stored_ends)
            other = reading.setdefault(key, mapping)
            if other is not mapping:
                source, destination = mapping.stored_ends
                raise SchemaConflictError(
                    f"edge types {tuple(other.edge_type)} and {tuple(mapping.edge_type)} would "
                    f"both read the stored `{mapping.edge}` edges from {source!r} to "
                    f"{destination!r}"
                    f"{' backwards' if mapping.reverse else ''}: nothing tells their edges "
                    f"apart; map them onto different NebulaGraph edge types"
                )

    def _declared_count(self, tag: str) -> int | None:
        return self.node_type(tag).num_nodes

    def _edge_types(self) -> str:
        return ", ".join(str(tuple(mapping.edge_type)) for mapping in self.edges)


@dataclass(frozen=True)
class KeptApart:
    """Two edge types reading one NebulaGraph edge type, and the node type pairs (sources,
    destinations) whose disjoint vid ranges keep their edges apart."""

    first: EdgeMapping
    second: EdgeMapping
    node_type_pairs: tuple[tuple[str, str], ...]

    def check(self, schema: GraphSchema, count: Callable[[str], int | None]) -> None:
        """Refuse the two edge types if every pair's vid ranges overlap (``count``: a type's
        node count, None where unknown)."""
        overlaps = [
            overlap for a, b in self.node_type_pairs
            if (overlap := schema.overlap(a, b, count)) is not None
        ]
        if len(overlaps) == len(self.node_type_pairs):
            raise SchemaConflictError(
                f"edge types {tuple(self.first.edge_type)} and {tuple(self.second.edge_type)} "
                f"both read `{self.first.edge}` and are told apart by their node types' vid "
                f"ranges, but {'; '.join(overlaps)}: give those node types disjoint vid ranges "
                f"(vid_offset) or map the edge types onto different NebulaGraph edge types"
            )


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
