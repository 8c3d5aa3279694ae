"""One row of the fault table (``test_faults.py``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

ALL_START_METHODS = ("fork", "spawn", "forkserver")


@dataclass(frozen=True)
class FaultRow:
    """``run(start_method)`` sets up one failure and asserts what the user sees (the error type
    and message, or the complete epoch); it must leave no process, fd or /dev/shm entry behind."""

    id: str
    run: Callable[[str], None]
    start_methods: tuple[str, ...] = ALL_START_METHODS
    why_not_all: str = ""  # why a row skips some start methods
