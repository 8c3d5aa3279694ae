"""Fault rows of the shared-memory channel: restarts, other users, pid namespaces, the budget,
fork children, a killed main process.  Joined into ``FAULT_TABLE`` by ``test_faults.py``."""

from __future__ import annotations

import multiprocessing
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

import mploader
from mploader.config import SharedMemoryConfig

from .channel_faulty import Blocks, MiB, SlowAndKilled
from .fault_row import FaultRow

SHM = "/dev/shm"
REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOBODY = 65534


def _intact(batch, value: int) -> bool:
    """Whether every 4 KiB page of ``batch`` (float32, all ``value`` when written) still holds
    ``value``: a reused block is rewritten whole, so one element per page tells."""
    return bool((batch[::1024] == value).all())


def _epoch(loader: mploader.DataLoader) -> list[int]:
    """Every batch's value, each batch checked intact."""
    values = []
    for batch in loader:
        value = int(batch[0])
        assert _intact(batch, value), f"batch {value} is not intact"
        values.append(value)
    return values


def _entries(prefix: str) -> set[str]:
    return {name for name in os.listdir(SHM) if name.startswith(prefix)}


def _dead_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


# -- 1. a restart keeps the finished batches --------------------------------------------------

def _restart_keeps_the_epoch(start_method: str) -> None:
    """Worker 1 is SIGKILLed twice while its finished batches wait in the task table behind a slow
    item of worker 0 (once before any of its blocks was mapped, once when they are all mapped and
    reused): every batch comes, once, in order, intact."""
    with tempfile.TemporaryDirectory() as markers:
        dataset = SlowAndKilled(markers, length=16, slow=(0, 8), kill=(3, 11), sleep=0.6)
        loader = mploader.DataLoader(
            dataset, batch_size=None, num_workers=2, multiprocessing_context=start_method,
            max_worker_restarts=3, shared_memory=SharedMemoryConfig(budget_bytes=64 * MiB),
        )
        iterator = iter(loader)
        got = []
        for batch in iterator:
            value = int(batch[0])
            assert _intact(batch, value), f"batch {value} is not intact"
            got.append(value)
        assert got == list(range(16))
        assert iterator.stats().restarts == 2


# -- 2. another user's leftovers and a full /dev/shm -------------------------------------------

def _as_nobody(action: str, argument: str, connection) -> None:  # in a forked child
    try:
        # nobody cannot read this machine's Python (/root is 0700): import now what the loader
        # imports lazily, while we are still root.
        import numpy.random  # noqa: F401  (it imports the standard library's secrets)

        import mploader.channel.shm
        import mploader.worker.loop

        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
        if action == "fill":  # a stale entry that takes all but 1 MiB of /dev/shm
            descriptor = os.open(os.path.join(SHM, argument), os.O_CREAT | os.O_EXCL | os.O_RDWR,
                                 0o600)
            stats = os.statvfs(SHM)
            os.posix_fallocate(descriptor, 0, stats.f_bavail * stats.f_frsize - MiB)
            os.close(descriptor)
            connection.send("ok")
        else:  # a whole epoch of a loader of nobody's
            values = _epoch(mploader.DataLoader(Blocks(4), batch_size=None, num_workers=2,
                                                multiprocessing_context="fork"))
            connection.send("ok" if values == list(range(4)) else f"epoch {values}")
    except BaseException as error:
        connection.send(f"{type(error).__name__}: {error}")
    finally:
        connection.close()


def _run_as_nobody(action: str, argument: str = "") -> str:
    context = multiprocessing.get_context("fork")  # nobody cannot exec this machine's python
    ours, theirs = context.Pipe()
    process = context.Process(target=_as_nobody, args=(action, argument, theirs))
    process.start()
    theirs.close()
    try:
        return str(ours.recv()) if ours.poll(60) else "no answer"
    finally:
        process.join(10)
        ours.close()


def other_users_scenario(start_method: str) -> None:
    """Run by ``_other_users_entries_are_left_alone`` in a private /dev/shm, as root."""
    dead = _dead_pid()
    roots = os.path.join(SHM, f"mploader-{dead}-0_root-0-{dead}-0")  # an old version's name
    nobodys = f"mploader-{dead}-0_nobody-0-{dead}-0"
    os.close(os.open(roots, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600))
    # nobody's loader meets root's stale entry: no PermissionError, and it stays
    answer = _run_as_nobody("loader")
    assert answer == "ok", answer
    assert os.path.exists(roots)
    # root's loader meets nobody's stale entry, which fills /dev/shm: its 1 MiB blocks are
    # memory files, which the full tmpfs does not limit; and it touches nothing there
    assert _run_as_nobody("fill", nobodys) == "ok"
    assert os.stat(os.path.join(SHM, nobodys)).st_uid == NOBODY
    values = _epoch(mploader.DataLoader(Blocks(4), batch_size=None, num_workers=2,
                                        multiprocessing_context=start_method))
    assert values == list(range(4))
    assert sorted(os.listdir(SHM)) == sorted([nobodys, os.path.basename(roots)])


def _other_users_entries_are_left_alone(start_method: str) -> None:
    """/dev/shm is sticky and shared: another user's leftovers, even ones that fill it, must not
    break anyone's loader (no PermissionError, no full tmpfs: blocks do not live there), and no
    loader touches them.  Runs in a private /dev/shm (a mount namespace), which it may fill."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to play a second user (nobody) and mount a private /dev/shm")
    closed = [str(folder) for folder in (Path(REPOSITORY), *Path(REPOSITORY).parents)
              if not os.stat(folder).st_mode & 0o001]
    if closed:  # a checkout under `mktemp -d` (0700): nobody cannot import the code under test
        pytest.skip(f"nobody cannot reach the checkout: {closed[0]} is closed to other users")
    _run_in_private_dev_shm(
        f"from tests.lifecycle.fault_rows_channel import other_users_scenario\n"
        f"other_users_scenario({start_method!r})\n"
    )


def _run_in_private_dev_shm(script: str) -> None:
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("unshare(1) is not installed")
    command = (f"mount -t tmpfs -o size=256m,mode=1777 tmpfs {SHM} && "
               f"exec {shlex.quote(sys.executable)} -c {shlex.quote(PREAMBLE + script)}")
    probe = subprocess.run([unshare, "--mount", "--propagation", "private", "sh", "-c",
                            f"mount -t tmpfs tmpfs {SHM}"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a private /dev/shm here: {probe.stderr.strip()}")
    run = subprocess.run([unshare, "--mount", "--propagation", "private", "sh", "-c", command],
                         capture_output=True, text=True, timeout=120, cwd=REPOSITORY)
    assert run.returncode == 0, run.stderr[-3000:]


PREAMBLE = f"import sys\nsys.path.insert(0, {REPOSITORY!r})\n"


# -- 3. a loader in another pid namespace -------------------------------------------------------

OTHER_NAMESPACE = textwrap.dedent(
    """
    import os, sys
    sys.path.insert(0, {repository!r})
    import mploader
    from tests.lifecycle.channel_faulty import Blocks
    loader = mploader.DataLoader(Blocks(2), batch_size=None, num_workers=1,
                                 multiprocessing_context="fork")
    print(os.getpid(), [int(batch[0]) for batch in loader], flush=True)
    """
)


def _pid_namespaces_share_nothing(start_method: str) -> None:
    """A loader runs here while another runs in a fresh pid namespace (sharing /dev/shm, as
    containers with --ipc=host do), where our pids mean nothing: both get every batch intact,
    and neither leaves anything in the shared /dev/shm (blocks are memory files: nothing of
    either is ever there to confuse the other)."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("unshare(1) is not installed")
    probe = subprocess.run([unshare, "--pid", "--fork", "--mount-proc", "true"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"no new pid namespace here: {probe.stderr.strip()}")
    loader = mploader.DataLoader(Blocks(12), batch_size=None, num_workers=2, prefetch_factor=2,
                                 multiprocessing_context=start_method)
    iterator = iter(loader)
    values = [int(next(iterator)[0])]
    other = subprocess.run(
        [unshare, "--pid", "--fork", "--mount-proc", sys.executable, "-c",
         OTHER_NAMESPACE.format(repository=REPOSITORY)],
        capture_output=True, text=True, timeout=60, cwd=REPOSITORY,
    )
    assert other.returncode == 0, other.stderr[-2000:]
    assert other.stdout.split(" ", 1) == ["1", "[0, 1]\n"]  # pid 1 over there
    for batch in iterator:
        value = int(batch[0])
        assert _intact(batch, value)
        values.append(value)
    assert values == list(range(12))
    assert not _entries("mploader-")


# -- 9. a worker busy when its main process is SIGKILLed ----------------------------------------

def _killed_main_leaves_nothing(start_method: str) -> None:
    """The main process is SIGKILLed while its worker is busy in a 30 s item and the worker's
    previous batch waits unmapped in the pipe (its block's descriptor queued in the passage):
    the worker goes at once, and nothing of the loader is left, in /dev/shm or mapped anywhere,
    with no later sweep.  Runs in a private /dev/shm (``killed_main.py`` has the scenario)."""
    _run_in_private_dev_shm(
        f"from tests.lifecycle.killed_main import scenario\nscenario({start_method!r})\n"
    )


# -- 6. a consumer that keeps batches beyond the budget --

def _keeping_loader(start_method: str, length: int, **kwargs) -> mploader.DataLoader:
    return mploader.DataLoader(
        Blocks(length), batch_size=None, num_workers=2, multiprocessing_context=start_method,
        shared_memory=SharedMemoryConfig(budget_bytes=4 * MiB), **kwargs,
    )


def _blocks_beyond_budget(iterator) -> int:
    return sum(pool.spills for pool in iterator.stats().channel.workers)


def _sliding_window_does_not_stall(start_method: str) -> None:
    """The consumer keeps the last 8 batches of 1 MiB against a 4 MiB budget: every batch comes,
    intact, and no worker stalls waiting for a block (the budget grows with what is kept)."""
    iterator = iter(_keeping_loader(start_method, 40, persistent_workers=True))
    try:
        window: list = []
        values = []
        for batch in iterator:
            if len(window) == 8:  # the oldest leaves the window: it must have stayed intact
                oldest = window.pop(0)
                assert _intact(oldest, values[-8]), f"batch {values[-8]} was overwritten"
            window.append(batch)
            values.append(int(batch[0]))
        assert all(_intact(kept, value) for kept, value in zip(window, values[-8:], strict=True))
        assert values == list(range(40))
        # 8 kept MiB against 4 MiB: the pools went beyond the budget instead of stalling
        assert _blocks_beyond_budget(iterator) > 0
    finally:
        iterator._shutdown_workers()


def _keeping_every_batch_never_times_out(start_method: str) -> None:
    """The consumer keeps every batch, with a timeout: no 'DataLoader timed out' (a worker
    waiting for memory the consumer holds is not a dead worker: it would wait for good), and
    every kept batch stays intact.  5 s, not 1: the timeout also bounds a worker's start through
    the zygote, which took more than 1 s once with five test processes on two cores."""
    kept = list(_keeping_loader(start_method, 24, timeout=5))
    assert [int(batch[0]) for batch in kept] == list(range(24))
    assert all(_intact(batch, index) for index, batch in enumerate(kept))


# -- 7. a batch inherited by a forked child --

def _read_later(batch, expected: int, connection) -> None:  # in a multiprocessing fork child
    time.sleep(0.5)  # meanwhile the main process moves on through the epoch
    connection.send(_intact(batch, expected))
    connection.close()


def _forked_children_intact(loader_class, start_method: str, **kwargs) -> int:
    """The main process hands each of the first 4 batches to a fork child (inherited, not
    pickled), drops it and moves on; how many of the 4 the children, reading 0.5 s later, found
    intact."""
    context = multiprocessing.get_context("fork")
    loader = loader_class(Blocks(16), batch_size=None, num_workers=1, prefetch_factor=2,
                          multiprocessing_context=start_method, **kwargs)
    children = []
    for index, batch in enumerate(loader):
        if index < 4:
            ours, theirs = context.Pipe()
            child = context.Process(target=_read_later, args=(batch, index, theirs))
            child.start()
            theirs.close()
            children.append((child, ours))
        del batch
    intact = 0
    for child, ours in children:
        intact += bool(ours.recv()) if ours.poll(10) else 0
        child.join(10)
        ours.close()
    return intact


def _fork_child_keeps_its_batch(start_method: str) -> None:
    """Blocks with live views at a fork are never reused while the child may hold them (the pool
    is small, so without that its blocks would be rewritten within the child's 0.5 s)."""
    config = SharedMemoryConfig(budget_bytes=3 * MiB)
    assert _forked_children_intact(mploader.DataLoader, start_method, shared_memory=config) == 4
    if start_method == "fork":  # torch, for comparison: its batches are never reused
        import torch.utils.data

        assert _forked_children_intact(torch.utils.data.DataLoader, start_method) == 4


CHANNEL_FAULTS: list[FaultRow] = [
    FaultRow("restart_keeps_finished_batches", _restart_keeps_the_epoch),
    FaultRow("other_users_stale_entry", _other_users_entries_are_left_alone, ("fork",),
             "/dev/shm is read by no start method's code; each run costs a fresh interpreter in "
             "a private /dev/shm"),
    FaultRow("pid_namespaces", _pid_namespaces_share_nothing, ("fork", "spawn"),
             "spawn and forkserver workers are both forked by the zygote and get the passage the "
             "same way; spawn covers both"),
    FaultRow("killed_main_busy_worker", _killed_main_leaves_nothing, ("fork", "spawn"),
             "spawn and forkserver workers are both forked by the zygote and watch the main "
             "process the same way; spawn covers both"),
    FaultRow("fork_child_keeps_its_batch", _fork_child_keeps_its_batch),
    FaultRow("sliding_window_does_not_stall", _sliding_window_does_not_stall),
    FaultRow("keeping_every_batch_no_timeout", _keeping_every_batch_never_times_out),
]
