"""Workers that said goodbye (and killed ones the kernel is slow to tear down), waited for off
the loader's path.

A worker asked to stop says goodbye (``mploader.worker.messages.Goodbye``) once everything the
main process waits for is done: its fetch threads and reply thread joined, its hooks' sessions
closed, its shared-memory names removed, its results written, its heap given back.  What is left
of its exit is the kernel tearing its address space down: for a worker that mapped shared-memory
blocks, a page-table entry per 4 KiB page (about 30 ms per 640 MiB block on a 2-core VM).  The
worker does that at the lowest priority (``mploader.worker.exit_priority``), and the main
process waits for it here, on a thread of its own, instead of at the epoch's end: the consumer's
``StopIteration`` and the next epoch's workers no longer wait for it, and the CPU it takes is
what the loader leaves idle.

A worker still not gone ``EXIT_DEADLINE_SECONDS`` after its goodbye is stuck in an exit handler
of its own (a ``multiprocessing`` finalizer, an ``atexit`` function): it is terminated, then
killed, as a worker that does not stop at a shutdown is.  The deadline is long because a worker
at the lowest priority on a saturated machine gets a small share of a CPU for its teardown.

A worker killed at a shutdown that has not ended ``TERMINATE_GRACE_SECONDS`` after its SIGKILL
(a loaded machine, a large address space) is waited for here too: its status is collected once
it ends, so that its process object, and the pipes of its ``Popen``, go.

One short-lived daemon thread per worker; :func:`wait_for_all` waits for them (tests, and anyone
who must know every worker is gone).  At interpreter exit, ``multiprocessing`` joins its own
children as it always does, and so it does for a goodbye read while the interpreter shuts down
(an iterator shut down by mploader's exit hook), when CPython 3.12+ starts no thread.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from mploader.polling import readable

_log = logging.getLogger("mploader")

# How long a worker may take to exit once it said goodbye before it is terminated.
EXIT_DEADLINE_SECONDS = 30.0
# After SIGTERM, this long before SIGKILL; after SIGKILL, this long before giving up on it.  The
# worker group's shutdown uses the same grace (``mploader.process.group``).
TERMINATE_GRACE_SECONDS = 1.0
# The longest single wait on a worker's sentinel, and how often its status is asked for once the
# sentinel fired: the status follows the sentinel within microseconds, and a sentinel closed
# early (a zygote's worker) must not make a waiter spin.
POLL_SECONDS = 0.05
EXIT_POLL_SECONDS = 0.001

_lock = threading.Lock()
_threads: set[threading.Thread] = set()


def adopt(process: Any, worker_id: int) -> None:
    """Wait for ``process`` (a worker that said goodbye, or was killed and has not ended yet)
    to end, in the background."""
    thread = threading.Thread(
        target=_wait_for_exit, args=(process, worker_id), daemon=True,
        name=f"mploader-reaper-{process.pid}",
    )
    with _lock:
        _threads.add(thread)
    try:
        thread.start()
    except RuntimeError:  # "can't create new thread at interpreter shutdown" (CPython 3.12+)
        with _lock:
            _threads.discard(thread)
        # As for a reaper thread the exit abandons: multiprocessing's own exit hook joins the
        # worker (its zygote, for a worker it forked).
        _log.debug("worker %d (pid %s) said goodbye at interpreter exit; not waited for here",
                   worker_id, process.pid)


def wait_for_all(timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for every adopted worker to be gone; whether they are."""
    deadline = time.monotonic() + timeout
    while True:
        with _lock:
            waiting = list(_threads)
        if not waiting:
            return True
        for thread in waiting:
            thread.join(max(0.0, deadline - time.monotonic()))
        if time.monotonic() >= deadline:
            with _lock:
                return not _threads


def _wait_for_exit(process: Any, worker_id: int) -> None:
    try:
        if ended_within(process, EXIT_DEADLINE_SECONDS):
            return
        _log.warning("worker %d (pid %s) said goodbye but did not exit within %.1f s; "
                     "terminating it", worker_id, process.pid, EXIT_DEADLINE_SECONDS)
        process.terminate()
        if ended_within(process, TERMINATE_GRACE_SECONDS):
            return
        kill_and_collect(process, worker_id, in_background=False)
    except Exception:  # a daemon thread: say what went wrong, never raise into nowhere
        _log.exception("waiting for worker %d (pid %s) to exit failed", worker_id, process.pid)
    finally:
        with _lock:
            _threads.discard(threading.current_thread())


def _forget_parent_state() -> None:
    """In a forked child: the parent's reaper threads are not its own, and one of them may
    have held the lock while the parent forked."""
    global _lock, _threads
    _lock = threading.Lock()
    _threads = set()


os.register_at_fork(after_in_child=_forget_parent_state)


def kill_and_collect(process: Any, worker_id: int, *, in_background: bool = True) -> None:
    """SIGKILL ``process`` and collect its exit status, waiting ``TERMINATE_GRACE_SECONDS`` at
    most (:func:`ended_within`, never ``join``'s blocking ``waitpid``); past them, in the
    background (``in_background``: a reaper thread's own last step does not start another)."""
    process.kill()
    if ended_within(process, TERMINATE_GRACE_SECONDS):
        return
    if not in_background:
        _log.warning("worker %d (pid %s) outlived SIGKILL by %.1f s; no longer waiting for it",
                     worker_id, process.pid, TERMINATE_GRACE_SECONDS)
        return
    # The kernel has yet to tear it down (a loaded machine, a large address space): its status
    # is collected in the background, so that the process object, and with it the pipes of its
    # Popen, go once it has ended.
    _log.warning("worker %d (pid %s) outlived SIGKILL by %.1f s; waiting for it in the "
                 "background", worker_id, process.pid, TERMINATE_GRACE_SECONDS)
    adopt(process, worker_id)


def ended_within(process: Any, seconds: float) -> bool:
    """Whether ``process`` ended within ``seconds`` (its exit status collected), never blocking
    past them: ``Process.join(timeout)`` waits on the sentinel and then calls a *blocking*
    waitpid, which hangs for good if the sentinel fired while the process still lives."""
    deadline = time.monotonic() + seconds
    while process.is_alive():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        if readable([process.sentinel], min(remaining, POLL_SECONDS)):
            time.sleep(EXIT_POLL_SECONDS)  # the status follows the sentinel
    return True
