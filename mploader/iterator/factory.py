"""Choosing an iterator for a loader: mploader's own or, after ``install()``, a torch loader's."""

from __future__ import annotations

from typing import Any

from mploader.iterator.settings import settings_of


def make_iterator(loader: Any) -> Any:
    settings = settings_of(loader)
    if settings.num_workers == 0:
        from mploader.iterator.single import SingleProcessIterator

        return SingleProcessIterator(loader, settings)
    from mploader.iterator.multi import MultiProcessIterator

    return MultiProcessIterator(loader, settings)
