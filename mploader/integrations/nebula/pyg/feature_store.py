"""PyG's ``FeatureStore`` on NebulaGraph: node attributes are tag properties."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch_geometric.data import FeatureStore, TensorAttr

from mploader.integrations.nebula.encoding import decode_feature_batch, encode_features
from mploader.integrations.nebula.hooks import NebulaHooks
from mploader.integrations.nebula.pyg.errors import WriteDtypeError, WriteShapeError
from mploader.integrations.nebula.pyg.nodes import NodeCounts, node_positions
from mploader.integrations.nebula.pyg.queries import SessionSource, execute, rows
from mploader.integrations.nebula.pyg.schema import (
    FEATURES,
    INT,
    GraphSchema,
    NodeAttribute,
    NodeType,
)
from mploader.integrations.nebula.statements import GRAPHD_MAX_QUERY_BYTES, split_id_statements

FETCH_BATCH = 2048  # vertices per FETCH: a 2048 x 128-float answer is about 1.4 MB of JSON


class NebulaFeatureStore(FeatureStore):
    """Node attributes of a :class:`GraphSchema` read from (and written to) NebulaGraph.

    This is PyG's ``torch_geometric.data.FeatureStore`` (``mploader.integrations.nebula.pyg``),
    for ``NodeLoader((feature_store, graph_store), ...)``.  The other class of the same name,
    :class:`mploader.integrations.nebula.NebulaFeatureStore`, is mploader's own store for plain
    torch datasets (no PyG): ``fetch`` (features and labels) and ``neighbors`` by vid.

    ``group_name`` is the tag (node type), ``attr_name`` a PyG attribute (``x``, ``y``), ``index``
    PyG node indices of that type (vid = the type's ``vid_offset`` + index), read as torch reads
    ``x[index]``: ``store['paper', 'x', 5]`` is one row, shape ``(dim,)``, as in PyG's
    ``HeteroData`` store; a float index is torch's ``IndexError``.  Every name, index, dtype and
    shape is checked against the schema and the node counts before a statement is sent (a
    :class:`~mploader.StoreInputError` names what is wrong): a write never lands half-checked.
    PyG's ``multi_get_tensor()`` answers every attribute of a batch with one ``FETCH`` per tag
    (split below graphd's query size limit).  Statements run on the fetch thread's own session
    inside a loader's workers, else on this process's own session.
    Picklable: the hooks travel, never a session.
    """

    def __init__(
        self,
        schema: GraphSchema,
        hooks: NebulaHooks,
        fetch_batch: int = FETCH_BATCH,
        max_query_bytes: int = GRAPHD_MAX_QUERY_BYTES,
    ) -> None:
        super().__init__()
        self.schema = schema
        self.hooks = hooks
        self.session = SessionSource(hooks)
        self.counts = NodeCounts(schema, self.session)
        self.fetch_batch = fetch_batch
        self.max_query_bytes = max_query_bytes
        self._attrs = [
            (node_type.tag, name)
            for node_type in schema.node_types
            for name in node_type.attributes
        ]

    # -- reads

    def get_all_tensor_attrs(self) -> list[TensorAttr]:
        """Every attribute of the schema (no statement: the schema is known); new objects each
        call, since PyG's loaders set ``index`` on them."""
        return [TensorAttr(tag, name) for tag, name in self._attrs]

    def _get_tensor(self, attr: TensorAttr) -> torch.Tensor | None:
        return self._multi_get_tensor([attr])[0]

    def _multi_get_tensor(self, attrs: Sequence[TensorAttr]) -> list[torch.Tensor | None]:
        """One ``FETCH`` per tag (chunked) for all ``attrs`` of that tag; every attribute and
        index is checked first."""
        reads = [self._resolve(attr) for attr in attrs]
        answers: list[torch.Tensor | None] = [None] * len(attrs)
        by_tag: dict[str, list[int]] = {}
        for number, read in enumerate(reads):
            by_tag.setdefault(read.node_type.tag, []).append(number)
        for numbers in by_tag.values():
            node_type = reads[numbers[0]].node_type
            flat = [reads[number].positions.reshape(-1).numpy() for number in numbers]
            names = list(dict.fromkeys(reads[number].name for number in numbers))
            wanted = np.unique(np.concatenate(flat))
            columns = self._fetch(node_type, names, wanted)
            for number, positions in zip(numbers, flat, strict=True):
                read = reads[number]
                values = _gather(
                    columns[read.name], np.searchsorted(wanted, positions), read.attribute
                )
                if values is not None:
                    values = values.reshape((*read.positions.shape, *read.attribute.row_shape))
                answers[number] = values
        return answers

    def _get_tensor_size(self, attr: TensorAttr) -> tuple[int, ...] | None:
        node_type, attribute = self.schema.attribute(self._group(attr), attr.attr_name)
        return (self.counts(node_type.tag), *attribute.row_shape)

    def num_nodes(self, tag: str | None = None) -> int:
        """The node count of a type: the schema's, else a ``LOOKUP`` scan (needs a tag index)."""
        return self.counts(self.schema.node_type(tag).tag)

    def _fetch(
        self, node_type: NodeType, names: list[str], wanted: np.ndarray
    ) -> dict[str, list[Any]]:
        """``{attr_name: values in wanted's order}`` (``None`` where a value is NULL)."""
        tag = node_type.tag
        yields = ", ".join(
            f"`{tag}`.`{node_type.attributes[name].prop}` AS a{number}"
            for number, name in enumerate(names)
        )
        head = f"FETCH PROP ON `{tag}` "
        tail = f" YIELD id(vertex) AS vid, {yields}"
        vids = (wanted + node_type.vid_offset).tolist()
        found: dict[int, list[Any]] = {}
        session = self.session()
        for start in range(0, len(vids), self.fetch_batch):
            part = [str(vid) for vid in vids[start : start + self.fetch_batch]]
            for statement in split_id_statements(head, part, tail, max_bytes=self.max_query_bytes):
                for row in rows(session, statement):
                    found[row[0]] = row[1:]
        missing = [vid for vid in vids if vid not in found]
        if missing:
            raise KeyError(
                f"{len(missing)} vertices have no `{tag}' tag in the NebulaGraph space "
                f"(first vids: {missing[:10]})"
            )
        ordered = [found[vid] for vid in vids]
        return {name: [row[number] for row in ordered] for number, name in enumerate(names)}

    # -- writes

    def _put_tensor(self, tensor: Any, attr: TensorAttr) -> bool:
        """Write rows with ``UPSERT VERTEX`` (other properties of the tag are kept).

        Checked first, against the schema: the attribute, the dtype (floats for features and
        FLOAT, integers for INT), the index (torch's rules, within the node count) and the shape
        (the index's shape times the attribute's row).  A whole write (``index=None``) gives
        every node a row; into a type with no nodes yet it creates them (``put_graph``)."""
        node_type, attribute = self.schema.attribute(self._group(attr), attr.attr_name)
        where = f"({node_type.tag!r}, {attr.attr_name!r})"
        values = torch.as_tensor(tensor)
        _check_dtype(values, attribute, where)
        count = self.counts(node_type.tag)
        index = attr.index if attr.is_set("index") else None
        creating = index is None and count == 0 and values.dim() > 0
        if creating:
            positions = torch.arange(values.shape[0])
        elif index is None:
            if values.dim() == 0 or values.shape[0] != count:
                rows_given = values.shape[0] if values.dim() else "no"
                raise WriteShapeError(
                    f"put_tensor of the whole of {where} got {rows_given} rows, but node type "
                    f"{node_type.tag!r} has {count} nodes: a whole write gives each node a row "
                    f"(it creates the nodes only of a type that has none); write fewer with an "
                    f"index"
                )
            positions = torch.arange(count)
        else:
            positions = node_positions(index, count, f"put_tensor into {where}")
        expected = (*positions.shape, *attribute.row_shape)
        if tuple(values.shape) != expected:
            raise WriteShapeError(
                f"put_tensor got a tensor of shape {tuple(values.shape)} for {where}: expected "
                f"{expected} ({positions.numel()} nodes, each {attribute.describe()})"
            )
        flat = positions.reshape(-1).numpy()
        rows_of_values = values.reshape((len(flat), *attribute.row_shape))
        if attribute.kind == FEATURES:
            texts = [f'"{encode_features(row)}"'
                     for row in rows_of_values.to(torch.float32).numpy()]
        elif attribute.kind == INT:
            texts = [str(int(value)) for value in rows_of_values.tolist()]
        else:
            texts = [repr(float(value)) for value in rows_of_values.tolist()]
        self._upsert(node_type, attribute.prop, flat, texts)
        if creating:
            self.counts.created(node_type.tag, len(flat))
        return True

    def _remove_tensor(self, attr: TensorAttr) -> bool:
        """Set the property to NULL for ``index`` (all nodes of the type when it is unset)."""
        node_type, attribute = self.schema.attribute(self._group(attr), attr.attr_name)
        index = attr.index if attr.is_set("index") else None
        where = f"remove_tensor of ({node_type.tag!r}, {attr.attr_name!r})"
        positions = node_positions(index, self.counts(node_type.tag), where)
        flat = np.unique(positions.reshape(-1).numpy())
        self._upsert(node_type, attribute.prop, flat, ["NULL"] * len(flat))
        return True

    def _upsert(self, node_type: NodeType, prop: str, index: np.ndarray, texts: list[str]) -> None:
        updates = [
            f"UPSERT VERTEX ON `{node_type.tag}` {vid} SET `{prop}` = {text}"
            for vid, text in zip((index + node_type.vid_offset).tolist(), texts, strict=True)
        ]
        session = self.session()
        for statement in split_id_statements("", updates, "", max_bytes=self.max_query_bytes,
                                             separator="; "):
            execute(session, statement)

    # -- helpers

    def _group(self, attr: TensorAttr) -> str | None:
        return attr.group_name if attr.is_set("group_name") else None

    def _resolve(self, attr: TensorAttr) -> _Read:
        node_type, attribute = self.schema.attribute(self._group(attr), attr.attr_name)
        index = attr.index if attr.is_set("index") else None
        where = f"({node_type.tag!r}, {attr.attr_name!r})"
        positions = node_positions(index, self.counts(node_type.tag), where)
        return _Read(node_type, attr.attr_name, attribute, positions)

    def close(self) -> None:
        """Sign out this process's own session (worker sessions belong to the loader)."""
        self.session.close()

    def __repr__(self) -> str:
        tags = [node_type.tag for node_type in self.schema.node_types]
        return f"NebulaFeatureStore(tags={tags}, {self.hooks!r})"


@dataclass(frozen=True)
class _Read:
    """One attribute of a read, checked: the node indices it asks for, in the result's shape."""

    node_type: NodeType
    name: str
    attribute: NodeAttribute
    positions: torch.Tensor


def _check_dtype(values: torch.Tensor, attribute: NodeAttribute, where: str) -> None:
    """Floats for features and FLOAT, integers for INT: nothing a write would change."""
    if attribute.kind == INT:
        allowed = not (values.dtype.is_floating_point or values.dtype.is_complex
                       or values.dtype == torch.bool)
        wanted = "integer dtypes (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)"
    else:
        allowed = values.dtype.is_floating_point
        wanted = "floating dtypes (torch.float32, torch.float64, torch.float16, torch.bfloat16)"
    if not allowed:
        raise WriteDtypeError(
            f"put_tensor got {values.dtype} values for {where}, {attribute.describe()}: "
            f"it takes {wanted}"
        )


def _gather(
    values: list[Any], positions: np.ndarray, attribute: NodeAttribute
) -> torch.Tensor | None:
    """The rows at ``positions`` of one attribute's values, as a tensor; None if any is NULL."""
    picked = [values[position] for position in positions.tolist()]
    if any(value is None for value in picked):
        return None
    if attribute.kind == FEATURES:
        assert attribute.dim is not None
        if not picked:
            return torch.zeros((0, attribute.dim), dtype=torch.float32)
        return torch.from_numpy(decode_feature_batch(picked, attribute.dim))
    if attribute.kind == INT:
        return torch.tensor(picked, dtype=torch.int64)
    return torch.tensor(picked, dtype=torch.float32)
