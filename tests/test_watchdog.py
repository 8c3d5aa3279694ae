"""The parent watchdog is asked from two threads at once: the worker's read loop and the watchdog
thread that covers a worker busy in a long task."""

from __future__ import annotations

import os
import threading

from mploader.worker.watchdog import ParentWatchdog


def test_parent_alive_from_two_threads_at_once() -> None:
    # One shared select.poll object raised "RuntimeError: concurrent poll() invocation" in
    # whichever thread came second, which ended an idle worker with exit code 1 (seen in a fault
    # table run: a worker crash, then BlockVanishedError for its batch).
    reader, writer = os.pipe()
    watchdog = ParentWatchdog(os.getpid(), reader)
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def ask() -> None:
        start.wait()
        try:
            for _ in range(20_000):
                assert watchdog.parent_alive()
        except BaseException as error:  # reported below, with its type
            errors.append(error)

    threads = [threading.Thread(target=ask) for _ in range(4)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        os.close(reader)
        os.close(writer)
    assert errors == []
