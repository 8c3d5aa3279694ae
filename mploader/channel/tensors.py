"""Which tensors the channels carry their own way, and how every other tensor travels.

A channel moves *plain* tensors (type exactly ``torch.Tensor``, dense and strided, not nested,
not quantized, on the CPU, not requiring grad) in its own format: stacked by mploader's collate,
then laid into a shared-memory block or pickled by value.  Every other tensor (nested, sparse
COO/CSR/CSC/BSR/BSC, quantized, ``Tensor`` subclasses, ``Parameter``, tensors that require grad)
is collated by torch's own ``collate_tensor_fn`` and travels as torch's workers send it, so what
arrives, and what is refused with which error, is what torch's DataLoader gives:

* the shared-memory channel pickles them with ``ForkingPickler`` and torch's reductions
  (``torch.multiprocessing.reductions``), as torch's worker result queue does: their storages go
  through torch's shared memory, which the main process fetches *from the worker* while
  unpickling (a file descriptor passed by the worker's ``resource_sharer`` thread, or a name the
  worker's reference keeps alive), so such a message needs its worker alive until it is decoded
  (:func:`sharing_reductions_used` tells the encoder);
* the plain channel pickles them by value (it exists to avoid shared memory), refusing what
  torch's reductions refuse, with torch's error.

One deliberate difference: torch's ``reduce_tensor`` drops a quantized tensor's quantizer (the
tensor arrives unusable: ``cannot call qscheme on UnknownQuantizer``); quantized tensors travel by
``Tensor``'s own pickling here, which keeps scale and zero point (and shares the storage all the
same).
"""

from __future__ import annotations

import copyreg
import io
import pickle
import threading
from collections.abc import Callable
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch

from mploader.compat.torch import reduce_tensor, tensor_types


def is_plain(tensor: torch.Tensor) -> bool:
    """Whether the channels' own format reproduces ``tensor`` exactly (see the module doc)."""
    return (
        type(tensor) is torch.Tensor
        and tensor.layout is torch.strided
        and not tensor.is_nested
        and not tensor.is_quantized
        and tensor.is_cpu
        and not tensor.requires_grad
    )


def all_plain(tensors: list[torch.Tensor] | tuple[torch.Tensor, ...]) -> bool:
    """Whether a batch of samples' tensors is mploader's to stack.

    Like torch's ``collate_tensor_fn``, it looks closely at the first tensor only (five property
    reads on each of 64 small tensors would cost twice the stacking); the others must be plain
    ``Tensor`` objects not requiring grad, and their layout, device, dtype and shape are checked
    where they are stacked (``PendingStack.can_stack_into_block``, ``torch.stack``).
    """
    return is_plain(tensors[0]) and all(
        type(tensor) is torch.Tensor and not tensor.requires_grad for tensor in tensors
    )


def reduce_as_torch_workers_do(tensor: torch.Tensor) -> tuple[Any, ...]:
    """torch's reduction of a tensor on a worker's result queue (quantized ones excepted)."""
    if tensor.is_quantized:
        return tensor.__reduce_ex__(pickle.HIGHEST_PROTOCOL)
    return reduce_tensor(tensor)  # type: ignore[no-any-return]


def reduce_by_value(tensor: torch.Tensor) -> tuple[Any, ...]:
    """``Tensor``'s own pickling (bytes in the message), refusing what torch's workers refuse."""
    if tensor.requires_grad and not tensor.is_leaf:
        reduce_tensor(tensor)  # raises torch's "Cowardly refusing to serialize non-leaf tensor..."
    return tensor.__reduce_ex__(pickle.HIGHEST_PROTOCOL)


def tensor_reducers(reduce: Callable[[torch.Tensor], tuple[Any, ...]]) -> dict[type, Any]:
    """Pickler ``dispatch_table`` entries sending every tensor type through ``reduce``."""
    return dict.fromkeys(tensor_types(), reduce)


# Built once per process (a copy per batch cost microseconds on small batches); torch registers
# its reductions when it is imported, before either is built.
_tables: dict[str, dict[type, Any]] = {}


def by_value_dispatch_table() -> dict[type, Any]:
    """copyreg's table plus :func:`reduce_by_value` for tensors: the plain channel's."""
    table = _tables.get("by_value")
    if table is None:
        table = _tables["by_value"] = {**copyreg.dispatch_table,
                                       **tensor_reducers(reduce_by_value)}
    return table


# Set on the pickling thread when a sharing reduction ran (see _SharingReduction).
_sharing = threading.local()


class _SharingReduction:
    """A reduction that shares instead of copying (multiprocessing's and torch's, registered
    with ``ForkingPickler``: storages, file descriptors, connections): the receiver takes the
    object from the sending process while unpickling.  Calling it notes that on this thread."""

    def __init__(self, reduce: Callable[[Any], Any]) -> None:
        self._reduce = reduce

    def __call__(self, obj: Any) -> Any:
        _sharing.used = True
        return self._reduce(obj)


def start_noting_sharing() -> None:
    """Forget earlier sharing reductions on this thread (before pickling a message)."""
    _sharing.used = False


def sharing_reductions_used() -> bool:
    """Whether a sharing reduction of :func:`torch_worker_dispatch_table` ran on this thread
    since :func:`start_noting_sharing`: the message needs its sender alive to be unpickled."""
    return bool(getattr(_sharing, "used", False))


def torch_worker_dispatch_table() -> dict[type, Any]:
    """``ForkingPickler``'s table (copyreg's, multiprocessing's and torch's reductions), tensors
    through :func:`reduce_as_torch_workers_do`: what torch's worker result queue pickles with.
    Every entry that is not copyreg's (those pickle by value) notes that it shares."""
    table = _tables.get("torch_worker")
    if table is None:
        table = dict(ForkingPickler(io.BytesIO()).dispatch_table)  # the merge it makes per use
        table.update(tensor_reducers(reduce_as_torch_workers_do))
        for cls, reduce in table.items():
            if copyreg.dispatch_table.get(cls) is not reduce:
                table[cls] = _SharingReduction(reduce)
        _tables["torch_worker"] = table
    return table
