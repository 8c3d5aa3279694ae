"""Swap mploader's multi-process iterator into every ``torch.utils.data.DataLoader``.

Libraries that build their own loaders (PyG's ``NeighborLoader`` subclasses torch's DataLoader)
never see ``mploader.DataLoader``.  What ``install()`` swaps is exactly one method:
``torch.utils.data.DataLoader._get_iterator``, the one place torch's ``__iter__`` gets an iterator
from.  With ``num_workers > 0`` it returns mploader's multi-process iterator; with
``num_workers=0`` it returns torch's own single-process iterator.  Everything else (the
constructor, its checks, ``__iter__``, ``__len__``, samplers, collate functions) stays torch's.

So a subclass iterates with mploader's workers unless it overrides ``_get_iterator`` itself (as
torchdata's ``StatefulDataLoader`` does, to build its own stateful iterator).  An override that
calls ``super()._get_iterator()`` and wraps what it gets (PyG's ``NodeLoader`` and
``LinkLoader``) does get mploader's iterator and is not warned about.  Such a subclass is
not taken over: it gets one ``UserWarning`` naming it (once per class), at ``install()`` for
classes that exist then, at class creation for those defined while installed.
"""

from __future__ import annotations

import threading
import warnings
import weakref
from types import TracebackType
from typing import Any

import torch.utils.data

from mploader.compat import torch as torch_compat

_lock = threading.Lock()
_original_get_iterator: Any = None
_MISSING = object()
_original_init_subclass: Any = _MISSING  # torch's own __init_subclass__, if it defines one
_warned_classes: weakref.WeakSet[type] = weakref.WeakSet()


def _mploader_get_iterator(loader: Any) -> Any:
    if loader.num_workers == 0:
        return _original_get_iterator(loader)
    from mploader.iterator.factory import make_iterator

    loader.check_worker_number_rationality()
    return make_iterator(loader)


class Installation:
    """Returned by :func:`install`; ``with mploader.install(): ...`` uninstalls on exit."""

    def __enter__(self) -> Installation:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        uninstall()


def install() -> Installation:
    """Make every torch DataLoader (and subclass) use mploader's multi-process iterator.

    Subclasses that override ``_get_iterator`` keep their own and get a ``UserWarning``.
    Idempotent.  Returns a context manager: ``with mploader.install(): ...`` calls
    :func:`uninstall` when the block ends.
    """
    global _original_get_iterator, _original_init_subclass
    torch_loader = torch.utils.data.DataLoader
    with _lock:
        if _original_get_iterator is None:
            _original_get_iterator = torch_compat.iterator_factory(torch_loader)
            torch_compat.set_iterator_factory(torch_loader, _mploader_get_iterator)
            _original_init_subclass = vars(torch_loader).get("__init_subclass__", _MISSING)
            torch_loader.__init_subclass__ = classmethod(_warn_on_new_subclass)  # type: ignore[assignment]
    for subclass in _subclasses(torch_loader):
        _warn_if_not_taken_over(subclass)
    return Installation()


def uninstall() -> None:
    """Restore torch's iterator; idempotent."""
    global _original_get_iterator, _original_init_subclass
    torch_loader = torch.utils.data.DataLoader
    with _lock:
        if _original_get_iterator is not None:
            torch_compat.set_iterator_factory(torch_loader, _original_get_iterator)
            _original_get_iterator = None
            if _original_init_subclass is _MISSING:
                del torch_loader.__init_subclass__
            else:
                torch_loader.__init_subclass__ = _original_init_subclass  # type: ignore[method-assign]
            _original_init_subclass = _MISSING


def is_installed() -> bool:
    """Whether :func:`install` is in effect (torch's DataLoaders use mploader's iterator)."""
    return _original_get_iterator is not None


def _warn_on_new_subclass(cls: type, **kwargs: Any) -> None:
    """``DataLoader.__init_subclass__`` while installed: a class defined now is checked too."""
    super(torch.utils.data.DataLoader, cls).__init_subclass__(**kwargs)  # type: ignore[misc]
    _warn_if_not_taken_over(cls)


def _subclasses(root: type) -> list[type]:
    found: list[type] = []
    pending: list[type] = list(root.__subclasses__())
    while pending:
        cls = pending.pop()
        if cls not in found:
            found.append(cls)
            pending.extend(cls.__subclasses__())
    return found


def _warn_if_not_taken_over(cls: type) -> None:
    from mploader.loader import DataLoader as MploaderDataLoader

    factory = torch_compat.ITERATOR_FACTORY
    resolved = getattr(cls, factory, None)
    if resolved in (_mploader_get_iterator, torch_compat.iterator_factory(MploaderDataLoader)):
        return  # torch's method (swapped) or mploader's own loader
    owner = next(klass for klass in cls.__mro__ if factory in vars(klass))
    if _gets_installed_iterator(vars(owner)[factory]):
        return  # PyG's NodeLoader/LinkLoader (and mploader's own PyG loader): ours, wrapped
    if cls in _warned_classes:
        return
    _warned_classes.add(cls)
    overridden_by = "it" if owner is cls else f"its base {_name(owner)}"
    warnings.warn(
        f"mploader.install() does not take over {_name(cls)}: {overridden_by} overrides "
        "DataLoader._get_iterator, the one method install() swaps, so it keeps its own iterator "
        "(torch's worker processes, not mploader's) unless that method calls "
        "DataLoader._get_iterator. Use mploader.DataLoader for mploader's workers.",
        UserWarning,
        stacklevel=3,
    )


def _gets_installed_iterator(method: Any) -> bool:
    """Whether an override gets the iterator ``install()`` swapped in: its body is ``...
    super()._get_iterator() ...``, or it is mploader's own (which asks torch's ``DataLoader``
    for it through ``mploader.compat``)."""
    if getattr(method, "__module__", "").startswith("mploader."):
        return True
    code = getattr(method, "__code__", None)
    return code is not None and {"super", torch_compat.ITERATOR_FACTORY} <= set(code.co_names)


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"
