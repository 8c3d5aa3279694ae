"""Describing a dead worker: torch's sentence first, then what torch does not say.

After loky's ``process_executor``: name the signal or exit code and the likely reason, so nobody has
to guess whether it was the OOM killer, a segfault in native code, or ``kill -9`` from outside.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

from mploader.errors import WorkerDiedError, signal_description, signal_name

_MEMORY_EVENTS = Path("/sys/fs/cgroup/memory.events")


def oom_kill_count() -> int | None:
    """The cgroup's ``oom_kill`` counter (cgroup v2), or None where it cannot be read."""
    try:
        for line in _MEMORY_EVENTS.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        return None
    return None


def likely_cause(exitcode: int | None, oom_kills_before: int | None) -> str:
    if exitcode is None:
        return (
            "unknown: its exit status could not be collected (a spawn/forkserver worker's status "
            "comes through mploader's zygote, its parent, which is gone or did not answer)"
        )
    if exitcode < 0:
        number = -exitcode
        if number == signal.SIGKILL:
            now = oom_kill_count()
            if now is not None and oom_kills_before is not None and now > oom_kills_before:
                return (
                    "out of memory: the kernel's OOM killer ended it (the cgroup's oom_kill count "
                    f"rose from {oom_kills_before} to {now}); use fewer workers, smaller batches, "
                    "or a smaller prefetch_factor"
                )
            return (
                "killed from outside (SIGKILL from another process: `kill -9`, a job scheduler, "
                "or the OOM killer of a parent cgroup)"
            )
        if number in (signal.SIGSEGV, signal.SIGILL, signal.SIGFPE, signal.SIGABRT):
            return (
                "a crash in native code (an extension module, a C library, or a bug in a custom "
                "op); the worker's stderr shows the Python stack at the crash"
            )
        if number == signal.SIGBUS:
            return (
                "a bus error: usually a mapped file shrank, or shared memory in /dev/shm ran "
                "out (torch's own sharing of tensors mploader's blocks do not carry: a "
                "container's 64 MB /dev/shm; raise it with --shm-size, or use fewer workers)"
            )
        if number == signal.SIGTERM:
            return "terminated from outside (SIGTERM)"
        return f"ended by {signal_name(number)}"
    return (
        f"the worker exited by itself with code {exitcode} (sys.exit() or os._exit() in dataset "
        "code, or the interpreter failed); rerunning with num_workers=0 may show the trace"
    )


def worker_died_error(
    *,
    worker_id: int,
    pid: int | None,
    exitcode: int | None,
    held: list[tuple[int, Any]],
    oom_kills_before: int | None,
    memory: str = "",
) -> WorkerDiedError:
    """The error for a worker that ended unasked; ``held`` lists (task_id, indices)."""
    if exitcode is not None and exitcode < 0:
        first = (
            f"DataLoader worker (pid {pid}) is killed by signal: "
            f"{signal_description(-exitcode)}. "
        )
        how = f"signal {signal_name(-exitcode)}"
    elif exitcode is None:
        first = (
            f"DataLoader worker (pid {pid}) exited unexpectedly. Its exit status is unknown. "
            "Rerunning with num_workers=0 may give better error trace."
        )
        how = "an unknown exit status"
    else:
        first = (
            f"DataLoader worker (pid {pid}) exited unexpectedly with exit code {exitcode}. "
            "Details are lost due to multiprocessing. Rerunning with num_workers=0 may give "
            "better error trace."
        )
        how = f"exit code {exitcode}"
    cause = likely_cause(exitcode, oom_kills_before)
    task_ids = tuple(task_id for task_id, _ in held)
    tasks = (
        ", ".join(f"task {task_id} (indices {indices})" for task_id, indices in held[:8])
        if held
        else "no task"
    )
    if len(held) > 8:
        tasks += f", and {len(held) - 8} more"
    message = (
        f"{first}\nmploader: worker {worker_id} (pid {pid}) ended with {how} while holding "
        f"{tasks}.{memory}\nLikely cause: {cause}."
    )
    return WorkerDiedError(
        message,
        worker_id=worker_id,
        pid=pid,
        exitcode=exitcode,
        task_ids=task_ids,
        indices=tuple(indices for _, indices in held),
        likely_cause=cause,
    )
