"""PyG's ``FeatureStore`` on NebulaGraph: node attributes are tag properties."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch_geometric.data import FeatureStore, TensorAttr

from mploader.integrations.nebula.encoding import decode_feature_batch, encode_features
from mploader.integrations.nebula.hooks import NebulaHooks
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
    PyG node indices of that type (vid = the type's ``vid_offset`` + index).
    :meth:`multi_get_tensor` answers every attribute of a batch with one ``FETCH`` per tag
    (split below graphd's query size limit).  Statements run on the fetch thread's own session
    inside a loader's workers, else on this process's own session (see :class:`SessionSource`).
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
        self.fetch_batch = fetch_batch
        self.max_query_bytes = max_query_bytes
        self._attrs = [
            (node_type.tag, name)
            for node_type in schema.node_types
            for name in node_type.attributes
        ]
        self._num_nodes: dict[str, int] = {}

    # -- reads

    def get_all_tensor_attrs(self) -> list[TensorAttr]:
        """Every attribute of the schema (no statement: the schema is known); new objects each
        call, since PyG's loaders set ``index`` on them."""
        return [TensorAttr(tag, name) for tag, name in self._attrs]

    def _get_tensor(self, attr: TensorAttr) -> torch.Tensor | None:
        return self._multi_get_tensor([attr])[0]

    def _multi_get_tensor(self, attrs: Sequence[TensorAttr]) -> list[torch.Tensor | None]:
        """One ``FETCH`` per tag (chunked) for all ``attrs`` of that tag."""
        answers: list[torch.Tensor | None] = [None] * len(attrs)
        by_tag: dict[str, list[int]] = {}
        for position, attr in enumerate(attrs):
            by_tag.setdefault(self._tag(attr), []).append(position)
        for tag, positions in by_tag.items():
            node_type = self.schema.node_type(tag)
            indices = [self._index(node_type, attrs[position]) for position in positions]
            names = list(dict.fromkeys(attrs[position].attr_name for position in positions))
            wanted = np.unique(np.concatenate(indices)) if indices else np.zeros(0, np.int64)
            columns = self._fetch(node_type, names, wanted)
            for position, index in zip(positions, indices, strict=True):
                name = attrs[position].attr_name
                answers[position] = _gather(
                    columns[name], np.searchsorted(wanted, index), node_type.attributes[name]
                )
        return answers

    def _get_tensor_size(self, attr: TensorAttr) -> tuple[int, ...] | None:
        node_type = self.schema.node_type(self._tag(attr))
        attribute = node_type.attributes.get(attr.attr_name)
        if attribute is None:
            return None
        count = self.num_nodes(node_type.tag)
        if attribute.kind == FEATURES:
            assert attribute.dim is not None
            return (count, attribute.dim)
        return (count,)

    def num_nodes(self, tag: str | None = None) -> int:
        """The node count of a type: the schema's, else a ``LOOKUP`` scan (needs a tag index)."""
        node_type = self.schema.node_type(tag)
        if node_type.num_nodes is not None:
            return node_type.num_nodes
        count = self._num_nodes.get(node_type.tag)
        if count is None:
            found = rows(self.session(), f"LOOKUP ON `{node_type.tag}` YIELD id(vertex) AS vid")
            count = self._num_nodes[node_type.tag] = len(found)
        return count

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
        """Write rows with ``UPSERT VERTEX`` (other properties of the tag are kept)."""
        node_type = self.schema.node_type(self._tag(attr))
        attribute = node_type.attributes[attr.attr_name]
        values = torch.as_tensor(tensor)
        if attr.index is None:
            index = np.arange(values.shape[0], dtype=np.int64)
        else:
            index = self._index(node_type, attr)
        if values.shape[0] != len(index):
            raise ValueError(f"{values.shape[0]} rows for {len(index)} nodes in {attr}")
        if attribute.kind == FEATURES:
            texts = [f'"{encode_features(row)}"' for row in values.to(torch.float32).numpy()]
        elif attribute.kind == INT:
            texts = [str(int(value)) for value in values.reshape(-1).tolist()]
        else:
            texts = [repr(float(value)) for value in values.reshape(-1).tolist()]
        self._upsert(node_type, attribute.prop, index, texts)
        return True

    def _remove_tensor(self, attr: TensorAttr) -> bool:
        """Set the property to NULL for ``index`` (all nodes of the type when it is unset)."""
        node_type = self.schema.node_type(self._tag(attr))
        attribute = node_type.attributes.get(attr.attr_name)
        if attribute is None:
            return False
        if attr.index is None:
            index = np.arange(self.num_nodes(node_type.tag), dtype=np.int64)
        else:
            index = self._index(node_type, attr)
        self._upsert(node_type, attribute.prop, index, ["NULL"] * len(index))
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

    def _tag(self, attr: TensorAttr) -> str:
        group = attr.group_name if attr.is_set("group_name") else None
        return self.schema.node_type(group).tag

    def _index(self, node_type: NodeType, attr: TensorAttr) -> np.ndarray:
        index = attr.index if attr.is_set("index") else None
        if index is None:
            return np.arange(self.num_nodes(node_type.tag), dtype=np.int64)
        if isinstance(index, slice):
            return np.arange(self.num_nodes(node_type.tag), dtype=np.int64)[index]
        if isinstance(index, torch.Tensor):
            if index.dtype == torch.bool:
                index = index.nonzero().view(-1)
            return index.detach().cpu().numpy().astype(np.int64).reshape(-1)
        return np.asarray(index, dtype=np.int64).reshape(-1)

    def close(self) -> None:
        """Sign out this process's own session (worker sessions belong to the loader)."""
        self.session.close()

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_num_nodes": dict(self._num_nodes)}

    def __repr__(self) -> str:
        tags = [node_type.tag for node_type in self.schema.node_types]
        return f"NebulaFeatureStore(tags={tags}, {self.hooks!r})"


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
