"""Swap mploader's multi-process iterator into every ``torch.utils.data.DataLoader``.

Libraries that build their own loaders (PyG's ``NeighborLoader`` subclasses torch's DataLoader)
never see ``mploader.DataLoader``; ``install()`` patches ``DataLoader._get_iterator`` on torch's
class, so those subclasses iterate with mploader's workers too, unless they override
``_get_iterator`` themselves.  ``num_workers=0`` keeps torch's own single-process iterator.
"""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Any

import torch.utils.data

_lock = threading.Lock()
_original_get_iterator: Any = None


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
    """Make every torch DataLoader (and subclass) use mploader's multi-process iterator."""
    global _original_get_iterator
    with _lock:
        if _original_get_iterator is None:
            _original_get_iterator = torch.utils.data.DataLoader._get_iterator
            torch.utils.data.DataLoader._get_iterator = _mploader_get_iterator  # type: ignore[method-assign,assignment]
    return Installation()


def uninstall() -> None:
    """Restore torch's iterator; idempotent."""
    global _original_get_iterator
    with _lock:
        if _original_get_iterator is not None:
            torch.utils.data.DataLoader._get_iterator = _original_get_iterator  # type: ignore[method-assign]
            _original_get_iterator = None


def is_installed() -> bool:
    return _original_get_iterator is not None
