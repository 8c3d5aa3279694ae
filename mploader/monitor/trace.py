"""A Chrome/Perfetto trace of a loader's whole life (``DataLoader(..., trace="run.json")``).

One ``Tracer`` per loader, shared by every iterator the loader makes: each epoch, persistent
workers or not, ``num_workers=0`` too, lands in the one file.  One track per process (the main
process and each worker, by pid, named ``worker <id>``; non-persistent workers are new processes
each epoch, so new tracks), plus the main process's ``start-up`` track; complete events ("X") for
start-up, each epoch, dispatch, fetch, collate, transfer, reorder wait, yield and wait for data;
instant events ("i") for worker start, ready, exit, crash and restart.  Every event that belongs
to a batch carries its ``task`` and ``epoch`` (the loader's epoch count, from 0) in ``args``.
Timestamps are CLOCK_MONOTONIC, which every process on the machine shares, so worker spans line
up with the main process's.  Open the file in https://ui.perfetto.dev or chrome://tracing;
``python -m mploader trace-summary`` reads it.

The file is written in pieces, so that memory stays bounded however long the loader runs: events
wait in a list until a flush (each epoch's end, each iterator's shutdown, every
``FLUSH_EVENTS`` events, and when the loader is collected or the interpreter exits), which
*appends* them and empties the list.  The file stays a complete JSON object after every flush::

    {"displayTimeUnit": "ms", "traceEvents": [
    {...one event per line...},
    {...}
    ]}

A flush seeks back over the closing ``]}`` and writes ``,`` + the new events + ``]}``.  The first
flush creates the file by ``mkstemp`` in the same folder (an unpredictable name, ``O_EXCL``, mode
0600) and renames it over ``path``: a file of an earlier run is replaced, and a symlink planted at
a predictable temporary name is never written through.  Later flushes reopen ``path`` with
``O_NOFOLLOW`` and append only if it is still the very file this tracer made and left (same device,
inode and size); anything else (a symlink planted at ``path``, the file removed, replaced or
written by someone else) starts a new file the same safe way, with a warning.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
from typing import Any

from mploader import finalizers

_log = logging.getLogger("mploader")

# Events held in memory before they are appended to the file: a few MB of dicts, about 1,400
# batches with two workers (7 events a batch); appending them (1.3 MB of JSON) is one write per
# that many batches, a small cost a batch (measured: the performance page of the manual).
FLUSH_EVENTS = 10_000

# The main process's second track: its start-up span overlaps the first batch's "wait for data"
# without nesting in it, which one track cannot show.
STARTUP_TID = 1

_HEAD = b'{"displayTimeUnit": "ms", "traceEvents": [\n'
_TAIL = b"\n]}\n"


def _microseconds(seconds: float) -> float:
    return seconds * 1e6


class Tracer:
    """Collects a loader's events and appends them to ``path`` (see the module docstring).

    Iterators call it from the thread that iterates and, at shutdown, possibly from the finalizer
    thread (mploader.finalizers): adding an event is one ``list.append``; flushes take a lock."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.main_pid = os.getpid()
        self._file = _TraceFile(path)
        self._named: set[int] = set()
        self._name_process(self.main_pid, "main process", 0)
        self._file.add_metadata([{"ph": "M", "name": "thread_name", "pid": self.main_pid,
                                  "tid": STARTUP_TID, "args": {"name": "start-up"}}])
        # Events not yet written reach the file when the loader is collected or at exit.
        finalizers.finalize(self, self._file.flush)  # in the finalizer thread: it takes a lock

    def _name_process(self, pid: int, name: str, sort_index: int) -> None:
        if pid in self._named:
            return
        self._named.add(pid)
        self._file.add_metadata([
            {"ph": "M", "name": "process_name", "pid": pid, "tid": pid, "args": {"name": name}},
            {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": pid,
             "args": {"sort_index": sort_index}},
        ])

    def name_worker(self, pid: int | None, worker_id: int) -> None:
        if pid is not None:
            self._name_process(pid, f"worker {worker_id}", worker_id + 1)

    def span(self, name: str, pid: int | None, start: float, end: float, *,
             tid: int | None = None, **args: Any) -> None:
        """A complete event on ``pid``'s track (or its thread ``tid``)."""
        if pid is None:
            return
        self._add({
            "ph": "X", "name": name, "cat": "batch", "pid": pid, "tid": tid or pid,
            "ts": _microseconds(start), "dur": _microseconds(max(0.0, end - start)), "args": args,
        })

    def instant(self, name: str, pid: int | None, at: float, **args: Any) -> None:
        self._add({
            "ph": "i", "s": "p", "name": name, "cat": "lifecycle", "pid": pid or self.main_pid,
            "tid": pid or self.main_pid, "ts": _microseconds(at), "args": args,
        })

    def _add(self, event: dict[str, Any]) -> None:
        if self._file.add(event) >= FLUSH_EVENTS:
            self.flush()

    @property
    def pending(self) -> int:
        """Events held in memory, not yet in the file."""
        return self._file.pending

    def flush(self) -> None:
        """Append the events that came since the last flush to the file."""
        self._file.flush()


class _TraceFile:
    """The file and the events waiting for it; what the tracer's finalizer flushes."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.owner_pid = os.getpid()  # a forked child holding a copy never writes
        self._events: list[dict[str, Any]] = []
        self._metadata: list[dict[str, Any]] = []  # process names: repeated in a new file
        self._written: tuple[int, int, int] | None = None  # device, inode, size of our file
        self._lock = threading.Lock()

    @property
    def pending(self) -> int:
        return len(self._events)

    def add(self, event: dict[str, Any]) -> int:
        self._events.append(event)
        return len(self._events)

    def add_metadata(self, events: list[dict[str, Any]]) -> None:
        self._metadata += events
        self._events += events

    def flush(self) -> None:
        if os.getpid() != self.owner_pid:
            return
        with self._lock:
            events, self._events = self._events, []
            if not events:
                return
            # json.dumps: the C encoder (json.dump to a file takes the pure-Python one).
            body = ",\n".join(map(json.dumps, events)).encode()
            if self._written is not None and self._append(body):
                return
            if self._written is not None:
                _log.warning("mploader: the trace file %s was removed, replaced or written by "
                             "another process since the last flush; starting it anew",
                             self.path)
                # The old file named the processes: name them again (a repeated name is harmless).
                body = ",\n".join(map(json.dumps, self._metadata + events)).encode()
            self._written = _create(self.path, _HEAD + body + _TAIL)

    def _append(self, body: bytes) -> bool:
        """Write ``body`` before the closing ``]}`` of our file; False if it is not ours any more
        (nothing written then)."""
        assert self._written is not None
        try:
            descriptor = os.open(self.path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:  # gone, or a symlink planted there (ELOOP)
            return False
        try:
            status = os.fstat(descriptor)
            if (status.st_dev, status.st_ino, status.st_size) != self._written:
                return False
            os.lseek(descriptor, status.st_size - len(_TAIL), os.SEEK_SET)
            _write_all(descriptor, b",\n" + body + _TAIL)
            self._written = (status.st_dev, status.st_ino, os.lseek(descriptor, 0, os.SEEK_CUR))
            return True
        finally:
            os.close(descriptor)


def _create(path: str, data: bytes) -> tuple[int, int, int]:
    """Replace ``path`` by a new file holding ``data``, never half-written; its device, inode
    and size.  The temporary file is made by ``mkstemp`` in the same folder: a predictable
    ``run.json.tmp`` would let anyone who can write to the folder plant a symlink there and have
    the trace written through it."""
    folder, name = os.path.split(os.path.abspath(path))
    descriptor, temporary = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
    try:
        try:
            _write_all(descriptor, data)
            status = os.fstat(descriptor)
        finally:
            os.close(descriptor)
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise
    return status.st_dev, status.st_ino, status.st_size


def _write_all(descriptor: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(descriptor, view):]
