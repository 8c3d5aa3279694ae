"""Resolving the ``shared_memory=`` argument without importing the channel when it is off."""

from __future__ import annotations

from typing import Any


def resolve_shared_memory_option(option: Any) -> Any:
    """``False`` -> ``None`` (plain pickling); ``True`` or a config -> a ``SharedMemoryConfig``."""
    if option is False or option is None:
        return None
    from mploader.shm import resolve_shared_memory

    return resolve_shared_memory(option)
