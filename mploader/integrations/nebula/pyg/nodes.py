"""Which nodes exist, and which nodes an index names: checked before any statement is sent.

:class:`NodeCounts` knows each node type's count (the schema's ``num_nodes``, else a ``LOOKUP``
scan) and so its vid range; :func:`node_positions` turns a PyG index into node indices by
torch's rules (an ``int`` picks one row, a bool mask its true positions, a float tensor is an
``IndexError``), with torch's own message; :func:`check_node_ids` checks seed nodes and edge
endpoints, which are node ids rather than indices (no mask, nothing counted from the end).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from mploader.integrations.nebula.pyg.errors import NodeIndexError
from mploader.integrations.nebula.pyg.queries import SessionSource, rows
from mploader.integrations.nebula.pyg.schema import GraphSchema

# The dtypes torch takes as integer indices ("long, int"); byte and bool tensors are masks.
INDEX_DTYPES = (torch.int64, torch.int32)


class NodeCounts:
    """Node counts per type: the schema's ``num_nodes``, else a ``LOOKUP`` scan of the tag (it
    needs a tag index), kept once it is found.  A count of 0 is not kept: the type's nodes may be
    written next (a whole write creates them, :meth:`created`).  Picklable with what it knows."""

    def __init__(self, schema: GraphSchema, session: SessionSource) -> None:
        self.schema = schema
        self.session = session
        self._counts: dict[str, int] = {}

    def __call__(self, tag: str) -> int:
        node_type = self.schema.node_type(tag)
        if node_type.num_nodes is not None:
            return node_type.num_nodes
        count = self._counts.get(node_type.tag)
        if count is None:
            found = rows(self.session(), f"LOOKUP ON `{node_type.tag}` YIELD id(vertex) AS vid")
            count = len(found)
            if count:
                self._counts[node_type.tag] = count
        return count

    def created(self, tag: str, count: int) -> None:
        """A whole write made the ``count`` nodes of a type that had none."""
        self._counts[tag] = count

    def contains(self, tag: str, vids: np.ndarray) -> np.ndarray:
        """Which ``vids`` are nodes of ``tag`` (``vid_offset <= vid < vid_offset + count``)."""
        start = self.schema.node_type(tag).vid_offset
        return (vids >= start) & (vids < start + self(tag))

    def check_apart(self) -> None:
        """Refuse edge types on one NebulaGraph edge type whose node types' vid ranges, as the
        space's counts make them, overlap (the schema refused what it could see alone)."""
        for rule in self.schema.kept_apart():
            rule.check(self.schema, self)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_counts": dict(self._counts)}


def node_positions(index: Any, count: int, where: str) -> torch.Tensor:
    """The node indices ``index`` picks among ``count`` nodes, shaped as ``rows[index]`` of a
    tensor with ``count`` rows would be: ``None`` all of them, an ``int`` one (a 0-dim result),
    a slice or a bool mask as torch reads them, a negative index counted from the end.  Lists and
    numpy arrays are read as tensors (so a float array is refused as a float tensor is).  What
    torch refuses raises :class:`NodeIndexError` with torch's message, then ``where``."""
    if index is None:
        return torch.arange(count)
    if isinstance(index, list | np.ndarray):
        index = torch.as_tensor(index) if np.size(index) else torch.zeros(0, dtype=torch.long)
    if isinstance(index, int | np.integer) and not isinstance(index, bool):
        index = torch.tensor(int(index))
    if isinstance(index, torch.Tensor) and index.dtype in INDEX_DTYPES:
        index = index.detach().cpu().long()
        if index.numel() == 0 or (int(index.min()) >= -count and int(index.max()) < count):
            return torch.where(index < 0, index + count, index)
    try:
        return torch.arange(count)[index]  # torch's rules: slices, masks, and its refusals
    except IndexError as error:
        allowed = f"indices 0..{count - 1} or -{count}..-1" if count else "no index"
        raise NodeIndexError(f"{error} ({where}: {count} nodes, {allowed})") from None


def check_node_ids(ids: Any, count: int, tag: str, what: str, context: str = "") -> np.ndarray:
    """``ids`` (seed nodes, edge endpoints) as int64, each a node of ``tag``: ``0 <= id <
    count``.  ``what`` names one of them in messages (``seed node``), ``context`` follows it
    (``of edge type ...``)."""
    ids = torch.as_tensor(ids)
    if ids.dtype not in INDEX_DTYPES:
        mask = ids.dtype in (torch.bool, torch.uint8)
        refused = "" if mask else f"{_torch_refusal(ids)}: "
        dtypes = ", ".join(map(str, INDEX_DTYPES))
        raise NodeIndexError(
            f"{refused}{what}s{context} must be an integer tensor ({dtypes}) "
            f"of {tag!r} node indices, got {ids.dtype}"
            f"{' (a mask? pass mask.nonzero().view(-1))' if mask else ''}"
        )
    ids = ids.detach().cpu().reshape(-1).numpy().astype(np.int64)
    outside = ids[(ids < 0) | (ids >= count)]
    if len(outside):
        raise NodeIndexError(
            f"{what} {outside[0]}{context} is out of range: node type {tag!r} has {count} nodes "
            f"(0..{count - 1}); {len(outside)} of {len(ids)} are outside it "
            f"(first: {outside[:10].tolist()})"
        )
    return ids


def _torch_refusal(index: torch.Tensor) -> str:
    """torch's own message for an index of ``index``'s dtype (which torch refuses)."""
    try:
        torch.empty((0, 0))[index]
    except IndexError as error:
        return str(error)
    return f"{index.dtype} is not an index dtype here"
