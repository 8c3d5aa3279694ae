from __future__ import annotations

import gc
import time

import psutil
import pytest

from tests.leaks import leaked_entries, shm_entries

START_METHODS = ["fork", "spawn", "forkserver"]


@pytest.fixture(params=START_METHODS)
def start_method(request: pytest.FixtureRequest) -> str:
    return request.param


def _helper_process(process: psutil.Process) -> bool:
    """multiprocessing's own long-lived helpers (the fork server, the resource tracker), and
    test servers other fixtures keep for the session (nebula_testing's NebulaGraph server)."""
    try:
        command = " ".join(process.cmdline())
    except psutil.Error:
        return True
    return any(name in command for name in ("forkserver", "resource_tracker", "nebula_testing"))


def worker_children() -> list[psutil.Process]:
    from mploader.process.zygote import helper_pids

    helpers = set(helper_pids())
    children = psutil.Process().children(recursive=True)
    return [
        c for c in children
        if c.pid not in helpers and not _helper_process(c) and c.status() != psutil.STATUS_ZOMBIE
    ]


def wait_until_gone(pids: list[int], seconds: float = 10.0) -> list[int]:
    deadline = time.monotonic() + seconds
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        alive = [pid for pid in alive if psutil.pid_exists(pid) and not _is_zombie(pid)]
        time.sleep(0.05)
    return alive


def _is_zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


@pytest.fixture(autouse=True)
def no_leftovers():
    """Every lifecycle test must end with no worker process and no shared-memory entry."""
    shm_before = shm_entries()
    yield
    gc.collect()  # an iterator in a reference cycle (an exception's traceback) is freed here
    leftover = wait_until_gone([c.pid for c in worker_children()], seconds=10)
    assert not leftover, f"worker processes left behind: {leftover}"
    leaked = leaked_entries(shm_before)
    assert not leaked, f"/dev/shm entries leaked: {leaked}"
