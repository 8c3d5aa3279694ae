"""``default_collate`` that stacks tensors straight into a shared-memory block.

torch's ``default_collate`` in a worker stacks each tensor field into a fresh shared-memory
segment; we run torch's own ``collate`` (so every container rule, number rule and error message is
torch's) with one entry replaced: plain tensors become a :class:`PendingStack`. The encoder then
lays out all pending stacks in one pool block and runs ``torch.stack(..., out=view)`` into it, so
the batch is written exactly once.  Batches of any other tensor (nested, sparse, quantized,
subclasses, requiring grad: see ``mploader.channel.tensors``) go to torch's own
``collate_tensor_fn``, which inside a worker gives torch's in-worker result or error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from mploader.channel.tensors import all_plain
from mploader.compat.torch import collate, collate_tensor_fn, default_collate_fn_map

# What torch's collate hands a tensor entry: a list of samples, or a tuple from zip(*batch).
TensorBatch = list[torch.Tensor] | tuple[torch.Tensor, ...]

class PendingStack:
    """``torch.stack(tensors, 0)``, deferred until the encoder knows where to put it.

    If the tensors cannot be stacked into a block (different shapes or dtypes, autograd, other
    devices, subclasses), pickling stacks them the ordinary way, which also raises torch's own
    error for mismatched shapes.
    """

    __slots__ = ("dtype", "nbytes", "stacked_shape", "tensors")

    def __init__(self, tensors: TensorBatch) -> None:
        first = tensors[0]
        self.tensors = tensors
        self.dtype = first.dtype
        self.stacked_shape = (len(tensors), *first.shape)
        self.nbytes = first.numel() * first.element_size() * len(tensors)

    def can_stack_into_block(self) -> bool:
        """Whether ``torch.stack(out=block_view)`` gives exactly ``torch.stack``'s result."""
        shape = self.tensors[0].shape
        dtype = self.dtype
        return all(
            type(tensor) is torch.Tensor
            and not tensor.is_nested  # before .shape, which a nested tensor does not have
            and tensor.shape == shape
            and tensor.dtype == dtype
            and not tensor.requires_grad
            and tensor.is_cpu
            and tensor.layout is torch.strided
            for tensor in self.tensors
        )

    def stack(self) -> torch.Tensor:
        return torch.stack(self.tensors, 0)

    def __reduce__(self) -> tuple[Callable[[Any], Any], tuple[torch.Tensor]]:
        return (_identity, (self.stack(),))


def _identity(value: Any) -> Any:
    return value


def _pending_tensor_fn(batch: TensorBatch, *, collate_fn_map: Any = None) -> Any:
    if not all_plain(batch):
        return collate_tensor_fn(batch, collate_fn_map=collate_fn_map)  # torch's, as in its workers
    return PendingStack(batch)


def _plain_tensor_fn(batch: TensorBatch, *, collate_fn_map: Any = None) -> Any:
    """torch's in-worker ``collate_tensor_fn`` without its per-batch shared-memory segment
    (for plain tensors; other kinds go to torch's own)."""
    if not all_plain(batch):
        return collate_tensor_fn(batch, collate_fn_map=collate_fn_map)
    elem = batch[0]
    out = elem.new_empty((len(batch), *elem.shape))
    return torch.stack(batch, 0, out=out)


def collate_samples(samples: list[Any], into_block: bool) -> Any:
    """``default_collate(samples)``, with tensors as :class:`PendingStack` if ``into_block``.

    Follows torch's ``default_collate_fn_map`` as it is now, so entries a user added keep
    working; if the user replaced the tensor entry itself, theirs is used unchanged.
    """
    function_map = default_collate_fn_map
    if function_map.get(torch.Tensor) is collate_tensor_fn:
        function_map = dict(function_map)
        function_map[torch.Tensor] = _pending_tensor_fn if into_block else _plain_tensor_fn
    return collate(samples, collate_fn_map=function_map)
