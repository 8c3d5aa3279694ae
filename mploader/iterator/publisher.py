"""Publishing the live iterators' snapshots for ``python -m mploader top``.

Each live iterator registers itself (weakly) when it is made and unregisters when it shuts down.
One daemon thread per process, running only while some iterator is registered, wakes once a
second and looks whether anyone is watching: ``top`` touches ``<dir>/watching`` at each refresh,
and a mtime less than ``WATCHING_FRESH_SECONDS`` old means someone is.  Unwatched, the cost is one
``stat()`` a second and nothing is written.  Watched, the thread writes ``<dir>/<pid>.json``
(atomically: a temporary file in the same directory, then ``os.replace``) with the process and a
snapshot of each registered iterator (``iterator.stats()`` plus rates since the last round).

``<dir>`` is ``$XDG_RUNTIME_DIR/mploader`` when that variable names a directory of this user's,
else ``/tmp/mploader-<uid>``: made 0700, and used only while it is a real directory (not a
symlink) owned by this user and closed to others; files are 0600.  Anything else, and any error,
turns publishing off for the process with one log line: publishing never breaks a loader.  The
file goes when the last iterator unregisters or is collected (then removed by the thread, woken at
once: a weakref callback does no file work), when nobody watches any more, and at interpreter
exit; a killed process's file is removed by the next ``top`` that finds its pid dead.
``MPLOADER_PUBLISH=0`` turns publishing off.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import logging
import os
import queue
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mploader.monitor.publish import (
    FORMAT_VERSION,
    PUBLISH_INTERVAL_SECONDS,
    check_private_dir,
    is_watched,
    publish_dir,
    write_private_json,
)

_log = logging.getLogger("mploader")


@dataclass
class _Registered:
    """One registered iterator and its counters at the previous round (for rates)."""

    loader_id: int
    iterator: weakref.ref[Any]
    kind: str
    last_at: float = field(default_factory=time.monotonic)
    last_batches: int = 0
    last_wait: float = 0.0
    last_consumer: float = 0.0
    view: dict[str, Any] | None = None  # the last snapshot published


class Publisher:
    """This process's registry of live iterators and the thread that publishes them."""

    def __init__(self) -> None:
        # Taken by register/unregister and the thread, never by a finalizer: a collected
        # iterator's weakref callback only appends its key to _collected, which the thread and
        # the next register() take in.
        self._lock = threading.RLock()
        self._registered: dict[int, _Registered] = {}  # id(iterator) -> entry
        self._collected: list[int] = []
        self._loader_ids = itertools.count(1)
        self._thread: threading.Thread | None = None
        # Wakes the thread early; SimpleQueue.put takes no lock, so a weakref callback may call it.
        self._wake: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._pid = os.getpid()
        self._disabled = os.environ.get("MPLOADER_PUBLISH", "1") == "0"
        self._directory: Path | None = None
        self._published = False  # our file exists
        self._process: dict[str, Any] | None = None

    # -- the iterators' side ---------------------------------------------------------------------

    def register(self, iterator: Any) -> None:
        if self._disabled:
            return
        key = id(iterator)
        with self._lock:
            self._take_in_collected()
            reference = weakref.ref(iterator, lambda _, key=key: self._note_collected(key))  # type: ignore[misc]
            self._registered[key] = _Registered(next(self._loader_ids), reference,
                                                type(iterator).__name__)
            self._start_thread()

    def start_thread(self) -> None:
        """Start the publishing thread now, before an iterator starts its workers: once they run,
        ``Thread.start()`` waits for the new thread to be scheduled among them (7-10 ms of a fork
        start-up with 8 workers on 2 cores).  With nothing registered within its first interval,
        it ends by itself."""
        if self._disabled:
            return
        with self._lock:
            self._start_thread()

    def _start_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="mploader-publish",
                                            daemon=True)
            self._thread.start()

    def unregister(self, iterator: Any) -> None:
        self._forget(id(iterator))

    def _forget(self, key: int) -> None:
        if os.getpid() != self._pid:
            return  # a forked child's copy of the registry: nothing of ours
        with self._lock:
            if self._registered.pop(key, None) is None or self._registered:
                return
            self._wake.put(None)  # the thread ends
            self.remove_file()

    def _note_collected(self, key: int) -> None:
        """A registered iterator was collected: the weakref callback, a finalizer, so no lock
        and no file work here; the thread, woken, forgets it and removes the file if it was the
        last (mploader.finalizers)."""
        self._collected.append(key)
        self._wake.put(None)

    def _take_in_collected(self) -> None:
        """Forget the iterators collected since last time (their weakref callbacks only noted
        them).  With the lock held; the caller sees whether any is left."""
        while self._collected:
            key = self._collected.pop()
            entry = self._registered.get(key)
            if entry is not None and entry.iterator() is None:  # not a new one at the same id
                del self._registered[key]

    def after_fork_in_child(self) -> None:
        """A forked child inherits the registry but not the thread: start afresh."""
        self._lock = threading.RLock()
        self._registered = {}
        self._collected = []
        self._thread = None
        self._wake = queue.SimpleQueue()
        self._pid = os.getpid()
        self._published = False
        self._process = None

    # -- the thread ------------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with contextlib.suppress(queue.Empty):
                self._wake.get(timeout=PUBLISH_INTERVAL_SECONDS)
            with self._lock:
                while not self._wake.empty():
                    self._wake.get_nowait()
                self._take_in_collected()
                if not self._registered or self._disabled:
                    self._thread = None
                    self.remove_file()  # the last iterators were collected: no file of ours
                    return
            try:
                self._round()
            except OSError as error:  # the disk full, the directory removed: try next round
                _log.debug("mploader: publishing for `python -m mploader top`: %r", error)
            except Exception as error:  # never the loader's problem: stop publishing
                self._disable(f"publishing for `python -m mploader top` failed ({error!r})")

    def _round(self) -> None:
        directory = publish_dir()
        if not is_watched(directory):
            if self._published:
                with self._lock:
                    self.remove_file()
            return
        problem = check_private_dir(directory)
        if problem is not None:
            self._disable(f"not publishing for `python -m mploader top`: {problem}")
            return
        with self._lock:
            entries = list(self._registered.values())
        for entry in entries:
            self._refresh_view(entry)
        with self._lock:  # publish only what is still registered: a file must not outlive them
            self._take_in_collected()
            if self._disabled or not self._registered:
                return
            loaders = [entry.view for entry in self._registered.values() if entry.view]
            document = {
                "version": FORMAT_VERSION,
                **self._process_info(),
                "published": time.time(),
                "loaders": loaders,
            }
            if self._published and directory != self._directory:
                self.remove_file()  # the environment changed: no file left in the old place
            write_private_json(directory, f"{self._pid}.json", document)
            self._directory = directory
            self._published = True
            if not self._registered:  # the last loader was collected while this was written
                self.remove_file()

    def _refresh_view(self, entry: _Registered) -> None:
        """Take one iterator's snapshot as JSON-ready data; keep the last one if it fails."""
        iterator = entry.iterator()
        if iterator is None:
            return
        try:
            stats = iterator.stats()
        except Exception:  # busy, shutting down, or no stats() at all: skip this round
            return
        finally:
            del iterator  # hold no reference past the call: the loader's end is not ours
        now = time.monotonic()
        elapsed = now - entry.last_at
        batches = stats.batches_delivered - entry.last_batches
        wait = stats.wait_seconds - entry.last_wait
        consumer = stats.consumer_seconds - entry.last_consumer
        entry.last_at, entry.last_batches = now, stats.batches_delivered
        entry.last_wait, entry.last_consumer = stats.wait_seconds, stats.consumer_seconds
        entry.view = {
            "id": entry.loader_id,
            "updated": time.time(),
            "kind": entry.kind,
            "epoch": stats.epoch,
            "batches_delivered": stats.batches_delivered,
            "batches_per_second": batches / elapsed if elapsed > 0 else None,
            "wait_share": wait / (wait + consumer) if wait + consumer > 0 else None,
            "tasks_in_flight": stats.tasks_in_flight,
            "restarts": stats.restarts,
            "workers": [
                {
                    "id": worker.worker_id,
                    "pid": worker.pid,
                    "state": str(worker.state),
                    "task": worker.current_task,
                    "task_seconds": worker.current_task_seconds,
                    "tasks_done": worker.tasks_done,
                    "results_waiting": worker.results_waiting,
                    "rss_bytes": worker.rss_bytes,
                    "uss_bytes": worker.uss_bytes,
                    "cpu_share": worker.cpu_share,
                }
                for worker in stats.workers
            ],
        }

    def _process_info(self) -> dict[str, Any]:
        if self._process is None:
            import psutil

            process = psutil.Process(self._pid)
            self._process = {
                "pid": self._pid,
                "command": " ".join(process.cmdline()),
                "started": process.create_time(),
            }
        return self._process

    def _disable(self, message: str) -> None:
        _log.warning("mploader: %s; set MPLOADER_PUBLISH=0 to silence this", message)
        with self._lock:
            self._disabled = True
            self.remove_file()

    def at_exit(self) -> None:
        with self._lock:
            self._disabled = True
            self.remove_file()

    def remove_file(self) -> None:
        if self._published and self._directory is not None and os.getpid() == self._pid:
            with contextlib.suppress(OSError):
                os.unlink(self._directory / f"{self._pid}.json")
        self._published = False


_publisher = Publisher()
os.register_at_fork(after_in_child=_publisher.after_fork_in_child)
atexit.register(_publisher.at_exit)


def register(iterator: Any) -> None:
    """Publish ``iterator`` (held weakly) until ``unregister`` or its end."""
    _publisher.register(iterator)


def start_thread() -> None:
    """Start the publishing thread ahead of ``register`` (see :meth:`Publisher.start_thread`)."""
    _publisher.start_thread()


def unregister(iterator: Any) -> None:
    _publisher.unregister(iterator)
