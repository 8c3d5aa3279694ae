"""Finalizers take no lock: an old iterator collected anywhere never hangs the loader (issue 22).

Each case runs ``finalizer_child.py`` in a subprocess with a deadline: it finalizes an unreachable
iterator at every call into mploader made while a lock of mploader is held, while a second loader
starts, iterates and shuts down (in the main thread, in another thread, and with more left for
interpreter exit).  It must finish, and every finalized iterator must be complete: its worker
gone, its blocks and lock file removed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from .conftest import wait_until_gone

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "finalizer_child.py")
# The child dumps every thread's stack and exits at DEADLINE; a passing run takes a few seconds.
DEADLINE_SECONDS = 40


def run_child(start_method: str, where: str) -> dict:
    try:
        result = subprocess.run(
            [sys.executable, CHILD, start_method, where, str(DEADLINE_SECONDS)],
            capture_output=True, text=True, timeout=DEADLINE_SECONDS + 20,
        )
    except subprocess.TimeoutExpired as hung:
        pytest.fail(f"the child hung past its deadline:\n{hung.stderr}")
    assert result.returncode == 0, (
        f"the child failed (exit {result.returncode}); a hang dumps its stacks:\n"
        f"{result.stderr[-6000:]}"
    )
    report: dict = {}
    for line in result.stdout.strip().splitlines():
        report.update(json.loads(line))
    return report


def assert_nothing_left(report: dict) -> None:
    assert wait_until_gone(report["pids"], seconds=5) == []
    left = [name for name in os.listdir("/dev/shm") if "mploader" in name]
    assert left == [], f"entries of mploader's in /dev/shm: {left}"


@pytest.mark.parametrize("where", ["main", "thread"])
@pytest.mark.parametrize("start_method", ["fork", "spawn", "forkserver"])
def test_finalized_inside_every_lock(start_method: str, where: str) -> None:
    report = run_child(start_method, where)
    # every point probed had an iterator to finalize, and the points include the lock of the
    # hang reported in issue 22 (a forked worker's inherited fds, taken while starting workers)
    assert report["reserve_left"] > 0, "the reserve ran out: some points were not probed"
    probed = report["probed"]
    assert len(probed) >= 10, probed
    if start_method == "fork":
        assert "worker/inherited.py:fd_identity" in probed, probed
    assert_nothing_left(report)
    assert report["pipes_left"] == [], "pipes of finalized iterators left open"



@pytest.mark.parametrize("start_method", ["fork", "spawn", "forkserver"])
def test_finalized_at_interpreter_exit(start_method: str) -> None:
    report = run_child(start_method, "exit")
    assert report["pending_at_exit"] > 0
    assert report["reserve_left"] > 0, "the reserve ran out: some points were not probed"
    assert "process/inherited_fds.py:remove_main_side_fds" in report["exit_probed"]
    assert_nothing_left(report)


class _Owner:
    pass


def test_a_collection_only_queues_the_call() -> None:
    """The call is made by the finalizer thread, not by the thread that collected; explicitly
    called first, it runs there, once."""
    import gc
    import threading

    from mploader import finalizers

    threads: list[str] = []
    owner = _Owner()
    owner.cycle = owner  # type: ignore[attr-defined]
    finalizers.finalize(owner, lambda: threads.append(threading.current_thread().name))
    del owner
    gc.collect()
    assert finalizers.settle(10)
    assert threads == ["mploader-finalizer"]

    explicit = _Owner()
    handle = finalizers.finalize(explicit, lambda: threads.append("explicit"))
    handle()
    handle()
    del explicit
    gc.collect()
    assert finalizers.settle(10)
    assert threads == ["mploader-finalizer", "explicit"]


class _Payload:
    pass


def test_the_finalizer_thread_keeps_nothing_of_a_call_it_made() -> None:
    """Once made, a call and its arguments are let go at once, not when the next one comes: a
    persistent loader's shutdown holds its channel (and the loader's kept blocks, gigabytes of
    shared memory), which stayed mapped for as long as no other iterator was collected."""
    import gc
    import threading
    import time
    import weakref

    from mploader import finalizers

    made = threading.Event()
    payload = _Payload()
    payload_ref = weakref.ref(payload)
    owner = _Owner()
    owner.cycle = owner  # type: ignore[attr-defined]
    finalizers.finalize(owner, lambda _payload: made.set(), payload)
    del owner, payload
    gc.collect()
    assert made.wait(10), "the finalizer thread made no call"
    deadline = time.monotonic() + 5
    while payload_ref() is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert payload_ref() is None, "the finalizer thread still holds the call it made"
