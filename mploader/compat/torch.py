"""torch's private and version-dependent data-loading API, reached from one place.

Every name here is either torch's own object, re-exported from its private module, or a small
function with one branch per torch behaviour, each branch naming the torch versions it serves.
Checked against the sources of ``torch/utils/data`` of every minor version 2.6 to 2.14 (2.6.0,
2.7.1, 2.8.0, 2.9.1, 2.10.0, 2.11.0, 2.12.0, 2.13.0, 2.14.1); the suite runs on 2.6.0, 2.13.0
and 2.14.1 (``make compat``).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.utils.data

# -- Private modules: the same objects in every supported version (2.6 to 2.14) ----------------
from torch.multiprocessing.reductions import reduce_tensor
from torch.utils.data._utils import worker as _torch_worker
from torch.utils.data._utils.collate import (
    collate,
    collate_tensor_fn,
    default_collate_fn_map,
)
from torch.utils.data._utils.pin_memory import pin_memory


def _minor_version(version: str) -> tuple[int, int]:
    """``"2.14.1+cu130"`` -> ``(2, 14)``; a source build's ``"2.15.0a0+git..."`` -> ``(2, 15)``."""
    major, minor = version.split("+")[0].split(".")[:2]
    return int(major), int("".join(character for character in minor if character.isdigit()))


TORCH_VERSION = _minor_version(torch.__version__)
OLDEST_SUPPORTED = (2, 6)

# The worker-info record torch's ``get_worker_info()`` returns: a class taking keyword arguments
# in 2.6-2.8, a frozen dataclass (with ``rng`` and ``worker_method`` fields defaulted) since 2.9.
# ``WorkerInfo(id=, num_workers=, seed=, dataset=)`` builds one in all of them.
WorkerInfo = _torch_worker.WorkerInfo

__all__ = [
    "OLDEST_SUPPORTED",
    "TORCH_VERSION",
    "UNPICKLABLE_WORKER_WARNING",
    "WorkerInfo",
    "auto_collation",
    "collate",
    "collate_tensor_fn",
    "default_collate_fn_map",
    "index_sampler",
    "iterable_length_seen",
    "iterator_refusal",
    "numpy_worker_seed",
    "pin_memory",
    "reduce_tensor",
    "resolve_pin_memory",
    "set_torch_worker_info",
    "torch_worker_info",
]


# -- Worker info and seeds ---------------------------------------------------------------------


def torch_worker_info() -> Any:
    """What ``torch.utils.data.get_worker_info()`` answers: torch's module-level slot."""
    return _torch_worker._worker_info


def set_torch_worker_info(info: Any) -> None:
    """Set torch's slot, so that ``torch.utils.data.get_worker_info()`` answers ``info``."""
    _torch_worker._worker_info = info


def numpy_worker_seed(base_seed: int, worker_id: int) -> list[int]:
    """The four 32-bit words torch's worker loop seeds numpy with (every version 2.6-2.14)."""
    return _torch_worker._generate_state(base_seed, worker_id)  # type: ignore[no-any-return]


# -- The loader's private attributes, which mploader's iterators read as torch's do -------------


def auto_collation(loader: torch.utils.data.DataLoader[Any]) -> bool:
    """Whether the loader batches samples itself (``batch_sampler`` is set)."""
    return bool(loader._auto_collation)


def index_sampler(loader: torch.utils.data.DataLoader[Any]) -> Any:
    """The sampler whose draws are the tasks: the batch sampler, or the sampler without one."""
    return loader._index_sampler


def iterable_length_seen(loader: torch.utils.data.DataLoader[Any]) -> int | None:
    """An IterableDataset's ``len()`` as ``len(loader)`` last read it, or None: torch's
    warning when an epoch yields more batches than that reads it."""
    return loader._IterableDataset_len_called  # type: ignore[no-any-return]


# The method through which torch's ``DataLoader.__iter__`` gets every iterator (every version
# 2.6-2.14): the one method ``mploader.install()`` swaps.
ITERATOR_FACTORY = "_get_iterator"


def iterator_factory(cls: type) -> Callable[..., Any]:
    return getattr(cls, ITERATOR_FACTORY)  # type: ignore[no-any-return]


def set_iterator_factory(cls: type, factory: Callable[..., Any]) -> None:
    setattr(cls, ITERATOR_FACTORY, factory)


def new_iterator(loader: torch.utils.data.DataLoader[Any]) -> Any:
    """An iterator from ``loader``'s factory, as torch's ``__iter__`` gets one (a subclass's
    override included)."""
    return getattr(loader, ITERATOR_FACTORY)()


def persistent_iterator(loader: torch.utils.data.DataLoader[Any]) -> Any:
    """The iterator torch's ``DataLoader`` keeps across epochs for persistent workers (its
    ``_iterator``, 2.6-2.14), or None."""
    return loader._iterator


def set_persistent_iterator(loader: torch.utils.data.DataLoader[Any], iterator: Any) -> None:
    loader._iterator = iterator


def tensor_types() -> tuple[type, ...]:
    """The tensor types torch registers with ``ForkingPickler`` (whose dispatch is by exact
    type): ``Tensor``, ``Parameter`` and the legacy typed tensor classes, listed in the private
    ``torch._tensor_classes`` (2.6-2.14; none if a version drops it)."""
    return (torch.Tensor, torch.nn.Parameter, *getattr(torch, "_tensor_classes", ()))


# -- Messages of torch's that mploader repeats ------------------------------------------------

# Warned when a worker cannot be started because its arguments do not pickle: 2.10 and later
# (torch 2.6-2.9 raise the pickling error without it).
UNPICKLABLE_WORKER_WARNING: str | None = (
    "Got pickle error when attempting to start a worker Process. This might be because the "
    "worker Process arguments are not picklable. Python 3.14+ changed the multiprocessing start "
    "method in non-Mac POSIX platforms to 'forkserver', which requires the worker Process "
    "arguments to be picklable. You can also try multiprocessing.set_start_method('fork')."
) if TORCH_VERSION >= (2, 10) else None


def iterator_refusal(message: str) -> AssertionError:
    """What torch's iterators raise for arguments its constructor lets through (a zero
    ``prefetch_factor``, a ``timeout`` without workers): an ``AssertionError`` saying ``message``
    since 2.10, a bare ``assert`` in 2.6-2.9."""
    return AssertionError(message) if TORCH_VERSION >= (2, 10) else AssertionError()


# -- Pinning -----------------------------------------------------------------------------------


def resolve_pin_memory(pin: bool, pin_device: str, stacklevel: int) -> tuple[bool, str | None]:
    """Whether batches are pinned and for which device, with the installed torch's warnings
    (its ``_BaseDataLoaderIter.__init__``): ``(pin, device)``; device None is the default."""
    stacklevel += 1
    if TORCH_VERSION >= (2, 9):
        return _pin_memory_2_9(pin, pin_device, stacklevel)
    if TORCH_VERSION >= (2, 7):
        return _pin_memory_2_7(pin, pin_device, stacklevel)
    return _pin_memory_2_6(pin, pin_device, stacklevel)


def _pin_memory_2_9(pin: bool, pin_device: str, stacklevel: int) -> tuple[bool, str | None]:
    """2.9 to 2.14: the current accelerator; ``pin_memory_device`` is deprecated and ignored."""
    if pin and pin_device:
        warnings.warn(
            "pin_memory_device is deprecated, the current accelerator will be used as the device,"
            f"ignore pin_memory_device='{pin_device}'.",
            stacklevel=stacklevel,
        )
    device = _current_accelerator(pin, stacklevel + 1)
    if device == "mps":
        _warn_mps("device pinned memory won't be used.", stacklevel)
        return False, None
    return device is not None, device


def _pin_memory_2_7(pin: bool, pin_device: str, stacklevel: int) -> tuple[bool, str | None]:
    """2.7 and 2.8: the current accelerator unless ``pin_memory_device`` names another."""
    if pin_device:
        if not pin:
            warnings.warn(
                "'pin_memory_device' is set but 'pin_memory' argument is not set, "
                "then device pinned memory won't be used."
                "please set 'pin_memory' to true, if you need to use the device pin memory",
                stacklevel=stacklevel,
            )
        return pin, pin_device
    device = _current_accelerator(pin, stacklevel + 1)
    if device == "mps":
        _warn_mps("then device pinned memory won't be used.", stacklevel)
        return False, None
    return device is not None, None


def _current_accelerator(pin: bool, stacklevel: int) -> str | None:
    """2.7 and later: the current accelerator's type when pinning, warning when there is none;
    None when not pinning."""
    if not pin:
        return None
    if not torch.accelerator.is_available():
        warnings.warn(
            "'pin_memory' argument is set as true but no accelerator is found, "
            "then device pinned memory won't be used.",
            stacklevel=stacklevel,
        )
        return None
    accelerator = torch.accelerator.current_accelerator()
    return accelerator.type if accelerator is not None else None


def _warn_mps(consequence: str, stacklevel: int) -> None:
    """pinning is refused on MPS (2.7 and later; 2.9 reworded the consequence)."""
    warnings.warn(f"'pin_memory' argument is set as true but not supported on MPS now, "
                  f"{consequence}", stacklevel=stacklevel + 1)


def _pin_memory_2_6(pin: bool, pin_device: str, stacklevel: int) -> tuple[bool, str | None]:
    """2.6: CUDA unless ``pin_memory_device`` names another; no warning without CUDA."""
    if pin_device:
        if not pin:
            warnings.warn(
                "pin memory device is set and pin_memory flag is not used then device pinned "
                "memory won't be used"
                "please set pin_memory to true, if you need to use the device pin memory",
                stacklevel=stacklevel,
            )
        return pin, pin_device
    return pin and torch.cuda.is_available(), None
