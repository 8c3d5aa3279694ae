"""A Chrome/Perfetto trace of every batch's lifecycle (``DataLoader(..., trace="run.json")``).

One track per process (the main process and each worker, by pid); complete events ("X") for
dispatch, fetch, collate, transfer, reorder wait and yield; instant events ("i") for worker start,
ready, exit, crash and restart.  Timestamps are CLOCK_MONOTONIC, which every process on the machine
shares, so worker spans line up with the main process's.  The file is rewritten at the end of each
epoch and at shutdown; open it in https://ui.perfetto.dev or chrome://tracing.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from typing import Any


def _microseconds(seconds: float) -> float:
    return seconds * 1e6


class Tracer:
    def __init__(self, path: str) -> None:
        self.path = path
        self.main_pid = os.getpid()
        self._events: list[dict[str, Any]] = []
        self._named: set[int] = set()
        self._lock = threading.Lock()
        self._flushed_events = -1  # how many events the file holds
        self._name_process(self.main_pid, "main process")

    def _name_process(self, pid: int, name: str) -> None:
        if pid in self._named:
            return
        self._named.add(pid)
        self._events.append(
            {"ph": "M", "name": "process_name", "pid": pid, "tid": pid, "args": {"name": name}}
        )

    def name_worker(self, pid: int | None, worker_id: int) -> None:
        if pid is not None:
            self._name_process(pid, f"worker {worker_id}")

    def span(self, name: str, pid: int | None, start: float, end: float, **args: Any) -> None:
        if pid is None:
            return
        self._events.append({
            "ph": "X", "name": name, "cat": "batch", "pid": pid, "tid": pid,
            "ts": _microseconds(start), "dur": _microseconds(max(0.0, end - start)), "args": args,
        })

    def instant(self, name: str, pid: int | None, at: float, **args: Any) -> None:
        self._events.append({
            "ph": "i", "s": "p", "name": name, "cat": "lifecycle", "pid": pid or self.main_pid,
            "tid": pid or self.main_pid, "ts": _microseconds(at), "args": args,
        })

    def flush(self) -> None:
        """Rewrite the file if events came since the last write (json.dumps: the C encoder;
        json.dump to a file would take the pure-Python one, 10x slower)."""
        with self._lock:
            if len(self._events) == self._flushed_events:
                return
            text = json.dumps({"traceEvents": self._events, "displayTimeUnit": "ms"})
            _write_atomically(self.path, text)
            self._flushed_events = len(self._events)


def _write_atomically(path: str, text: str) -> None:
    """Replace ``path`` by a file holding ``text``, never half-written.  The temporary file is
    made by ``mkstemp`` in the same folder (an unpredictable name, created ``O_EXCL``, mode
    0600): a predictable ``run.json.tmp`` would let anyone who can write to the folder plant a
    symlink there and have the trace written through it."""
    folder, name = os.path.split(os.path.abspath(path))
    descriptor, temporary = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(descriptor, "w") as file:
            file.write(text)
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise
