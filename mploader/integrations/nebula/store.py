"""Node features, labels and neighbours from NebulaGraph, batched per DataLoader batch."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from mploader.integrations.nebula.encoding import decode_feature_batch
from mploader.integrations.nebula.pool import PooledSession
from mploader.integrations.nebula.session import NebulaSession
from mploader.integrations.nebula.statements import GRAPHD_MAX_QUERY_BYTES, split_id_statements
from mploader.worker import hooks as worker_hooks

if TYPE_CHECKING:
    import torch


def _current_worker_session() -> Any:
    return worker_hooks.worker_session()


class NebulaFeatureStore:
    """Node features, labels and neighbours from NebulaGraph, in the spirit of nebula-pyg.

    This is mploader's own store for plain torch datasets (``mploader.integrations.nebula``),
    not a PyG class.  PyG's remote backend (a ``torch_geometric.data.FeatureStore`` for
    ``NodeLoader``) is the other class of the same name,
    :class:`mploader.integrations.nebula.pyg.NebulaFeatureStore`.

    Vertices have INT64 ids and a tag with a feature string (:data:`FEATURE_ENCODING`) and an
    integer label.  Statements go through ``session()`` (default: ``mploader.worker_session()``,
    so each DataLoader worker uses its own session, and ``num_workers=0`` uses the main
    process's), in chunks of ``batch_size`` vertices, each statement at most
    ``max_query_bytes`` long (graphd's ``max_allowed_query_size``, 4 MiB by default: a larger
    chunk is split, see :func:`split_id_statements`).  Picklable when ``session`` is (the
    default is).
    """

    def __init__(
        self,
        tag: str,
        feature_prop: str,
        label_prop: str,
        feature_dim: int,
        edge: str | None = None,
        batch_size: int = 256,
        session: Callable[[], Any] | None = None,
        max_query_bytes: int = GRAPHD_MAX_QUERY_BYTES,
    ) -> None:
        if feature_dim < 1 or batch_size < 1:
            raise ValueError(
                f"feature_dim and batch_size must be >= 1, got {feature_dim}, {batch_size}"
            )
        self.tag = tag
        self.feature_prop = feature_prop
        self.label_prop = label_prop
        self.feature_dim = feature_dim
        self.edge = edge
        self.batch_size = batch_size
        self.session = session or _current_worker_session
        self.max_query_bytes = max_query_bytes

    def fetch(
        self, vids: Sequence[int] | np.ndarray | torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(features [n, D] float32, labels [n] int64)`` for ``vids``, in the order given."""
        import torch

        ids = _as_vid_array(vids)
        unique, inverse = np.unique(ids, return_inverse=True)
        features = np.zeros((len(unique), self.feature_dim), dtype=np.float32)
        labels = np.zeros(len(unique), dtype=np.int64)
        found = np.zeros(len(unique), dtype=bool)
        session = self.session()
        statements = split_id_statements(
            f"FETCH PROP ON `{self.tag}` ",
            unique.tolist(),
            f" YIELD id(vertex) AS vid, `{self.tag}`.`{self.feature_prop}` AS feature, "
            f"`{self.tag}`.`{self.label_prop}` AS label",
            self.batch_size,
            self.max_query_bytes,
        )
        for statement in statements:
            rows = _query(session, statement)
            if not rows:
                continue
            row_vids = np.array(_column(rows, 0, int, "id(vertex)"), dtype=np.int64)
            positions = np.searchsorted(unique, row_vids)
            texts = _column(rows, 1, str, f"{self.tag}.{self.feature_prop}")
            try:
                features[positions] = decode_feature_batch(texts, self.feature_dim)
            except ValueError as error:
                raise ValueError(
                    f"bad `{self.feature_prop}' values on tag `{self.tag}': {error}"
                ) from error
            labels[positions] = _column(rows, 2, int, f"{self.tag}.{self.label_prop}")
            found[positions] = True
        if not found.all():
            missing = unique[~found]
            raise KeyError(
                f"{len(missing)} vertices have no `{self.tag}' tag in the NebulaGraph space "
                f"(first: {missing[:10].tolist()})"
            )
        return torch.from_numpy(features[inverse]), torch.from_numpy(labels[inverse])

    def neighbors(
        self, vids: Sequence[int] | np.ndarray | torch.Tensor, edge: str | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Outgoing ``edge`` (default: the store's) edges of ``vids`` as ``(src, dst)`` int64."""
        import torch

        edge = edge or self.edge
        if edge is None:
            raise ValueError("NebulaFeatureStore.neighbors needs an edge type (edge=...)")
        ids = _as_vid_array(vids)
        session = self.session()
        pairs: list[np.ndarray] = [np.zeros((0, 2), dtype=np.int64)]
        statements = split_id_statements(
            "GO FROM ",
            ids.tolist(),
            f" OVER `{edge}` YIELD src(edge) AS src, dst(edge) AS dst",
            self.batch_size,
            self.max_query_bytes,
        )
        for statement in statements:
            rows = _query(session, statement)
            if rows:
                _column(rows, 0, int, "src(edge)")
                _column(rows, 1, int, "dst(edge)")
                pairs.append(np.array(rows, dtype=np.int64).reshape(-1, 2))
        edges = torch.from_numpy(np.concatenate(pairs))
        return edges[:, 0].contiguous(), edges[:, 1].contiguous()

    def __repr__(self) -> str:
        return (
            f"NebulaFeatureStore(tag={self.tag!r}, feature_prop={self.feature_prop!r}, "
            f"label_prop={self.label_prop!r}, feature_dim={self.feature_dim}, edge={self.edge!r})"
        )


def _query(session: Any, statement: str) -> list[list[Any]]:
    """The rows of ``statement`` as plain Python values (ints, strings, ``None`` for NULL).

    Through a :class:`NebulaSession` the answer comes as graphd's JSON (decoded in C); any other
    session (a raw nebula3 ``Session``, a user's wrapper) answers through ``execute().rows()``.
    """
    if isinstance(session, NebulaSession | PooledSession):
        results = session.execute_json(statement).get("results") or [{}]
        return [entry["row"] for entry in results[0].get("data") or []]
    return [[_plain(value) for value in row.values] for row in session.execute(statement).rows()]


def _plain(value: Any) -> Any:
    """A nebula3 ``Value`` of a scalar type as a Python value (strings decoded)."""
    from nebula3.common.ttypes import Value

    kind = value.getType()
    if kind in (Value.__EMPTY__, Value.NVAL):
        return None
    if kind == Value.SVAL:
        raw = value.value
        return raw.decode("utf-8") if isinstance(raw, bytes) else raw
    if kind in (Value.BVAL, Value.IVAL, Value.FVAL):
        return value.value
    return value  # another type: _column reports it


def _column(rows: Sequence[list[Any]], index: int, kind: type, what: str) -> list[Any]:
    """Column ``index`` of ``rows``, checked to hold ``kind`` values (no NULLs)."""
    values = [row[index] for row in rows]
    for value in values:
        if type(value) is not kind:
            got = "NULL" if value is None else type(value).__name__
            raise TypeError(
                f"NebulaGraph returned {got} for {what}, expected {kind.__name__} "
                "(is the property NULL or of another type?)"
            )
    return values


def _as_vid_array(vids: Any) -> np.ndarray:
    if hasattr(vids, "detach"):  # a torch tensor
        vids = vids.detach().cpu().numpy()
    array = np.asarray(vids)
    if array.ndim != 1:
        raise ValueError(f"vertex ids must be 1-D, got shape {array.shape}")
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise TypeError(f"vertex ids must be integers (INT64 vids), got dtype {array.dtype}")
    return array.astype(np.int64, copy=False)
