from __future__ import annotations

import gc
import os
import time

import psutil
import pytest

from tests.leaks import is_block, leaked_entries, let_loaders_go, shm_entries

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


def _helpers() -> tuple[object, ...]:
    """Long-lived helpers of this process that keep fds open for the whole session, started on
    first use: mploader's zygotes, multiprocessing's fork server and resource tracker."""
    import multiprocessing.forkserver
    import multiprocessing.resource_tracker

    from mploader.process.zygote import helper_pids

    return (
        tuple(sorted(helper_pids())),
        getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None),
        getattr(multiprocessing.resource_tracker._resource_tracker, "_pid", None),
    )


def _open_fds() -> dict[int, str]:
    """This process's open fds and what each points at."""
    fds = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            fds[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # closed meanwhile (the listing's own fd, among others)
            continue
    return fds


def _fd_leaks(before: dict[int, str], helpers_before: tuple[object, ...]) -> list[str]:
    """fds opened during the test and still open: any on a pool block of mploader's; and, if
    no session helper started during the test (its fds stay open by design), any at all."""
    deadline = time.monotonic() + 2
    while True:
        gc.collect()
        after = _open_fds()
        new = {fd: target for fd, target in after.items() if before.get(fd) != target}
        leaks = [f"{fd} -> {target}" for fd, target in new.items()
                 if is_block(target)]
        if _helpers() == helpers_before and len(after) > len(before):
            leaks += [f"{fd} -> {target}" for fd, target in new.items()
                      if not is_block(target)]
        if not leaks or time.monotonic() > deadline:
            return sorted(leaks)
        time.sleep(0.05)  # a pinning thread or a finalizer may still be closing one


@pytest.fixture(autouse=True)
def no_leftovers():
    """Every lifecycle test must end with no worker process, no shared-memory entry and no fd
    it opened."""
    shm_before = shm_entries()
    fds_before, helpers_before = _open_fds(), _helpers()
    yield
    let_loaders_go()
    leftover = wait_until_gone([c.pid for c in worker_children()], seconds=10)
    assert not leftover, f"worker processes left behind: {leftover}"
    leaked = leaked_entries(shm_before)
    assert not leaked, f"/dev/shm entries leaked: {leaked}"
    fds = _fd_leaks(fds_before, helpers_before)
    assert not fds, f"fds left open: {fds}"
