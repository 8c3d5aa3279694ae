"""Tensors of every kind torch can carry between processes, for the layout parity tests.

Defined at module level so that spawn and forkserver workers can unpickle the datasets.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch.utils.data import Dataset, Sampler


class TaggedTensor(torch.Tensor):
    """A ``Tensor`` subclass with an attribute, which must survive the trip."""

    tag = "class default"


def _quiet(build: Any) -> Any:
    with warnings.catch_warnings():  # prototype/beta/deprecation warnings of these layouts
        warnings.simplefilter("ignore")
        return build()


def _subclass(index: int) -> torch.Tensor:
    tensor = (torch.arange(4.0) + index).as_subclass(TaggedTensor)
    tensor.tag = f"item {index}"
    return tensor


def _nonleaf(index: int) -> torch.Tensor:
    return torch.full((3,), float(index), requires_grad=True) * 2


# kind -> item ``index`` of that kind
MAKERS: dict[str, Any] = {
    "nested": lambda i: torch.nested.nested_tensor([torch.arange(i + 1.0), torch.arange(2.0)]),
    "nested-jagged": lambda i: torch.nested.nested_tensor(
        [torch.arange(i + 1.0), torch.arange(2.0)], layout=torch.jagged
    ),
    "sparse-coo": lambda i: (torch.eye(3) * (i + 1)).to_sparse(),
    "sparse-csr": lambda i: (torch.eye(3) * (i + 1)).to_sparse_csr(),
    "sparse-csc": lambda i: (torch.eye(3) * (i + 1)).to_sparse_csc(),
    "sparse-bsr": lambda i: (torch.eye(4) * (i + 1)).to_sparse_bsr((2, 2)),
    "sparse-bsc": lambda i: (torch.eye(4) * (i + 1)).to_sparse_bsc((2, 2)),
    "quantized": lambda i: torch.quantize_per_tensor(
        torch.arange(4.0) * (i + 1), 0.5, 2, torch.quint8
    ),
    "quantized-per-channel": lambda i: torch.quantize_per_channel(
        torch.arange(4.0).view(2, 2) * (i + 1), torch.tensor([0.5, 1.0]), torch.tensor([0, 1]),
        0, torch.qint8,
    ),
    "subclass": _subclass,
    "subclass-large": lambda i: (torch.arange(40_000.0) + i).as_subclass(TaggedTensor),
    "parameter": lambda i: torch.nn.Parameter(torch.arange(3.0) + i),
    "requires-grad": lambda i: torch.full((3,), float(i), requires_grad=True),
    "no-grad-parameter": lambda i: torch.nn.Parameter(torch.arange(3.0) + i, requires_grad=False),
}
KINDS = list(MAKERS)
NONLEAF = "requires-grad-non-leaf"


def make(kind: str, index: int) -> torch.Tensor:
    if kind == NONLEAF:
        return _nonleaf(index)
    return _quiet(lambda: MAKERS[kind](index))  # type: ignore[no-any-return]


class EveryKind(Dataset):
    """Item ``2 * k + j`` is item ``j`` of kind ``k`` (two of each, one batch of two per kind);
    ``mixed=True``: every item is a dict of all kinds plus a plain tensor."""

    def __init__(self, kinds: list[str], mixed: bool = False) -> None:
        self.kinds = kinds
        self.mixed = mixed

    def __len__(self) -> int:
        return 2 if self.mixed else 2 * len(self.kinds)

    def __getitem__(self, index: int) -> Any:
        if self.mixed:
            item = {kind: make(kind, index) for kind in self.kinds}
            item["plain"] = torch.arange(3) + index
            return item
        return make(self.kinds[index // 2], index % 2)


class PairsSampler(Sampler[list[int]]):
    """Batches ``[0, 1], [2, 3], ...``: one batch per kind of :class:`EveryKind`."""

    def __init__(self, count: int) -> None:
        self.count = count

    def __iter__(self) -> Any:
        return iter([[2 * k, 2 * k + 1] for k in range(self.count)])

    def __len__(self) -> int:
        return self.count


def describe(tensor: torch.Tensor) -> dict[str, Any]:
    """What the comparison looks at: type, layout, dtype, autograd flags, state and values.

    Kept instead of torch's tensors between tests: those hold one open descriptor each (torch's
    ``file_descriptor`` sharing), and a session of them would exhaust the process's files.
    """
    return {
        "type": type(tensor),
        "layout": tensor.layout,
        "dtype": tensor.dtype,
        "is_nested": tensor.is_nested,
        "requires_grad": tensor.requires_grad,
        "is_leaf": tensor.is_leaf,
        "tag": getattr(tensor, "tag", None),
        "values": _values(tensor),
    }


def assert_same_tensor(expected: dict[str, Any], actual: torch.Tensor, path: str) -> None:
    """torch's tensor (as :func:`describe` saw it) and mploader's ``actual``, field by field."""
    seen = describe(actual)
    for field, value in expected.items():
        assert seen[field] == value, f"{path}: {field} {seen[field]!r} != torch's {value!r}"


def _values(tensor: torch.Tensor) -> Any:
    plain = torch.Tensor._make_subclass(torch.Tensor, tensor) if (
        type(tensor) is not torch.Tensor and not tensor.is_nested
        and not isinstance(tensor, torch.nn.Parameter)
    ) else tensor
    with torch.no_grad():
        if plain.is_nested:
            return [_values(part) for part in plain.unbind()]
        if plain.is_quantized:
            return plain.int_repr().tolist()  # torch's own transfer loses the quantizer
        if plain.layout is not torch.strided:
            return plain.to_dense().tolist()
        return plain.detach().tolist()
