"""A shared, timestamped log of session events, for tests that look for races.

The test server writes what graphd does with sessions (``--event-log PATH``); a test writes
what its clients do (a slot written, a worker killed) into the same file, and reads the order
back.  One line per event, appended with ``O_APPEND`` by whichever process saw it (one
``write`` each, so lines never interleave)::

    <wall-clock seconds> <event> <key=value> ...

Server events: ``login`` (an ``authenticate`` arrived), ``session`` (graphd made the session),
``answered`` (the answer to the ``authenticate`` was written to the socket; a dead client's
reply still counts: it left the server), ``signout``, ``kill-session``.  Each names the
``client`` (``ip:port`` of the connection) and, once there is one, the ``session`` id.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Event:
    """One line of the log."""

    time: float
    name: str
    fields: dict[str, str]

    def __str__(self) -> str:
        details = " ".join(f"{key}={value}" for key, value in self.fields.items())
        return f"{self.time:.6f} {self.name} {details}".rstrip()


class EventLog:
    """Appends events to ``path`` (made if missing); usable from any process and thread."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def write(self, name: str, **fields: object) -> None:
        line = str(Event(time.time(), name, {key: str(value) for key, value in fields.items()}))
        descriptor = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(descriptor, (line + "\n").encode())
        finally:
            os.close(descriptor)

    def read(self) -> list[Event]:
        """Every event so far, in time order."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return []
        events = []
        for line in text.splitlines():
            stamp, name, *pairs = line.split()
            fields = dict(pair.split("=", 1) for pair in pairs)
            events.append(Event(float(stamp), name, fields))
        return sorted(events, key=lambda event: event.time)
