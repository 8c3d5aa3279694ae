"""The last process of a loader to go removes what is left, even when its two threads let go at
once (the worker loop closing its channel while its watchdog abandons it: the main process was
SIGKILLed).  When ``close()`` returns, the cleanup is done: the process may exit right after, and
a cleanup left to a daemon thread dies with it (the loader's lock file stayed in ``/dev/shm``, in
about one run in ten of ``test_fault_table[*-sigkill_main]`` on a busy machine)."""

from __future__ import annotations

import os
import threading
import time

import pytest

from mploader.channel.shm import MainChannel, WorkerChannel, new_loader_tag
from mploader.channel.shm import channel as shm_channel
from mploader.channel.shm.names import list_names
from mploader.config import SharedMemoryConfig


def test_close_returns_once_a_concurrent_abandon_has_cleaned_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = SharedMemoryConfig()
    tag = new_loader_tag()
    main = MainChannel(config, tag)
    worker = WorkerChannel(config, 0, 1, tag)
    main._lock.release()  # the main process is SIGKILLed: its lock goes, its names stay
    real_removal = shm_channel.remove_loader_leftovers
    cleaning = threading.Event()

    def slow_removal(loader_tag: str, claim: object) -> int:
        cleaning.set()
        time.sleep(0.3)  # the watchdog thread, descheduled in the middle of its cleanup
        return real_removal(loader_tag, claim)  # type: ignore[arg-type]

    monkeypatch.setattr(shm_channel, "remove_loader_leftovers", slow_removal)
    watchdog = threading.Thread(target=worker.abandon)
    watchdog.start()
    assert cleaning.wait(5)
    worker.close()  # the loop thread; the process would exit right after this
    left = [name for name in list_names() if name.startswith(f"mploader-{tag}")]
    watchdog.join()
    main.close()
    assert left == [], f"close() returned before the cleanup was done: {left}"
    assert not os.path.exists(f"/dev/shm/mploader-{tag}-lock")


def test_the_last_worker_cleans_up_after_a_main_process_that_lets_go_late() -> None:
    """A SIGKILLed main process's lock may go a moment after its pipes (whose hang-up wakes the
    workers): the last worker out, abandoning, waits for it and removes what is left."""
    config = SharedMemoryConfig()
    tag = new_loader_tag()
    main = MainChannel(config, tag)
    worker = WorkerChannel(config, 0, 1, tag)
    exiting = threading.Timer(0.05, main._lock.release)  # the dying main process's last close
    exiting.start()
    worker.abandon()  # woken by the hang-up, while the main process still holds its lock
    exiting.join()
    left = [name for name in list_names() if name.startswith(f"mploader-{tag}")]
    main.close()
    assert left == [], f"the last worker out left the loader's entries: {left}"
