"""SIGKILL of the main process and of every worker at once, mid-epoch: the shared memory is back
within seconds and nothing is left anywhere, with no sweeper.

Pool blocks are anonymous memory files: the kernel frees one when the last process that maps it
or holds it open is gone, however it went, so a loader killed whole leaves nothing, and nobody
has to sweep.  (Blocks that were named files in ``/dev/shm``, whose names the main process removed
once it mapped them, stayed there after such a kill, and their memory with them: cleaning up was
the last live process's job, and SIGKILL leaves none.)

Isolation, so that the test holds on a busy machine (pytest-xdist, other loaders):

* The loader's processes run in a memory cgroup of their own (v1 or v2): its ``memory.stat``
  counts the shared memory they allocated, and nobody else's.
* They run in a mount namespace with a private tmpfs on ``/dev/shm``, kept alive by a holder
  process after they are killed: whatever they leave there stays to be seen (nothing else can
  sweep it), and goes with the holder at the end.

Needs root, a memory cgroup controller it can make a cgroup in (``tests/cgroups.py``),
``unshare(1)`` and ``nsenter(1)``; skipped otherwise.
"""

from __future__ import annotations

import os
import selectors
import shlex
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import psutil
import pytest
import torch.utils.data

from tests.cgroups import MemoryCgroup, kill, memory_cgroup

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MiB = 1 << 20
BATCH_FLOATS = 32 * MiB  # 128 MiB of float32 a batch
BATCHES = 24  # a few seconds of work: the kill lands early in the epoch (at most 3 GiB kept)
CONSUME_SECONDS = 0.1  # the consumer's time per batch: the workers keep making blocks
KILL_AFTER_SECONDS = 0.3  # after the first batch, at the latest (see _kill_moment)
SETTLE_SECONDS = 5.0  # everything must be back within this after the kill
CGROUP_SHMEM_LEFT = 1 * MiB  # multiprocessing's odd page, at most
MEMINFO_SLACK = 64 * MiB  # other processes on the machine move /proc/meminfo's Shmem meanwhile
FIRST_BATCH_TIMEOUT = 90.0
NEEDS_ROOT = "needs root, to make a memory cgroup and mount a private /dev/shm"


class Filled(torch.utils.data.Dataset):
    """Item ``i`` is a fresh 128 MiB float32 array of ``i`` (``batch_size=None``)."""

    def __len__(self) -> int:
        return BATCHES

    def __getitem__(self, index: int) -> np.ndarray:
        return np.full(BATCH_FLOATS, index, dtype=np.float32)


CHILD = textwrap.dedent(
    f"""
    import sys, time
    import mploader
    from tests.shm.test_killed_all import Filled
    loader = mploader.DataLoader(Filled(), batch_size=None, num_workers=2,
                                 multiprocessing_context="fork")
    kept = []
    for number, batch in enumerate(loader):
        kept.append(batch)  # held: the workers fill new blocks for the next batches
        if number == 0:
            print("first", flush=True)
        time.sleep({CONSUME_SECONDS})
    print("done", flush=True)
    """
)


# -- cgroup, namespace, processes ---------------------------------------------------------------


def _cgroup_shmem(cgroup: MemoryCgroup) -> int:
    """Shared memory charged to ``cgroup``: v1's ``total_shmem`` (``shmem`` without its
    descendants), v2's ``shmem`` (with them)."""
    values = {}
    with open(cgroup.stat) as stat:
        for line in stat:
            key, _, value = line.partition(" ")
            values[key] = int(value)
    return values.get("total_shmem", values.get("shmem", 0))


def _meminfo_shmem() -> int:
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("Shmem:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no Shmem line in /proc/meminfo")


def _entries(directory: str) -> list[str]:
    try:
        return sorted(name for name in os.listdir(directory) if "mploader" in name)
    except FileNotFoundError:
        return []


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture
def cgroup() -> Iterator[MemoryCgroup]:
    """A fresh memory cgroup, removed afterwards with whatever still runs in it killed."""
    with memory_cgroup("mploader-kill", needs_root=NEEDS_ROOT) as made:
        yield made


@pytest.fixture
def private_dev_shm() -> Iterator[tuple[int, str]]:
    """A mount namespace with a 4 GiB tmpfs on /dev/shm, held by a sleeping process: (the
    holder's pid, the tmpfs as this process sees it)."""
    unshare, nsenter = shutil.which("unshare"), shutil.which("nsenter")
    if unshare is None or nsenter is None:
        pytest.skip("unshare(1) and nsenter(1) are needed")
    holder = subprocess.Popen(
        [unshare, "--mount", "--propagation", "private", "sh", "-c",
         "mount -t tmpfs -o size=4g,mode=1777 tmpfs /dev/shm && echo ready && exec sleep 600"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout is not None
        if holder.stdout.readline().strip() != "ready":
            holder.wait(10)
            assert holder.stderr is not None
            pytest.skip(f"cannot mount a private /dev/shm: {holder.stderr.read().strip()}")
        seen_from_here = f"/proc/{holder.pid}/root/dev/shm"
        assert os.stat(seen_from_here).st_dev != os.stat("/dev/shm").st_dev
        yield holder.pid, seen_from_here
    finally:
        holder.kill()  # the namespace goes with it, and the tmpfs with whatever is left in it
        holder.wait()
        for stream in (holder.stdout, holder.stderr):
            if stream is not None:
                stream.close()


# -- the test -----------------------------------------------------------------------------------


@dataclass
class State:
    cgroup_shmem: int
    meminfo_shmem: int
    entries: list[str]
    processes: list[int]
    elapsed: float

    def clean(self, meminfo_before: int) -> bool:
        return (self.cgroup_shmem <= CGROUP_SHMEM_LEFT and not self.entries
                and not self.processes and self.meminfo_shmem <= meminfo_before + MEMINFO_SLACK)


def _read_line(process: subprocess.Popen, timeout: float) -> str:
    """The child's next line of output, or '' at its end or after ``timeout`` seconds."""
    assert process.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        if not selector.select(timeout):
            return ""
    return process.stdout.readline()


def _kill_moment(shm_dir: str, before: set[str]) -> str:
    """Wait for a worker to be writing a new block: a ``mploader-*`` file new in the private
    /dev/shm, its memory allocated (blocks that are named files), or ``KILL_AFTER_SECONDS``
    (anonymous blocks: no name ever shows; the workers are busy making blocks all the while, the
    consumer keeping every batch).  What the kill landed on, for the report."""
    started = time.monotonic()
    while time.monotonic() < started + KILL_AFTER_SECONDS:
        for name in _entries(shm_dir):
            if name in before or name.endswith("-lock"):
                continue
            try:
                stat = os.stat(os.path.join(shm_dir, name))
            except FileNotFoundError:
                continue  # mapped by the main process meanwhile, and unlinked
            if stat.st_size and stat.st_blocks * 512 >= stat.st_size:
                return (f"while {name} ({stat.st_size / MiB:.0f} MiB, allocated) was in the "
                        f"making, {time.monotonic() - started:.2f} s after the first batch")
        time.sleep(0.002)
    return f"{KILL_AFTER_SECONDS:g} s after the first batch"


@pytest.mark.timeout(FIRST_BATCH_TIMEOUT + 60)
def test_killing_the_main_process_and_every_worker_at_once_leaves_nothing(
    cgroup: MemoryCgroup, private_dev_shm: tuple[int, str],
) -> None:
    holder_pid, shm_dir = private_dev_shm
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        part for part in (REPOSITORY, env.get("PYTHONPATH")) if part
    )
    meminfo_before = _meminfo_shmem()
    assert _cgroup_shmem(cgroup) == 0
    # sh joins the cgroup, then becomes nsenter, which enters the namespace and becomes python:
    # one pid throughout, the child's.
    command = (f"echo $$ > {shlex.quote(str(cgroup.procs))} && "
               f"exec {shlex.quote(shutil.which('nsenter') or 'nsenter')} "
               f"--mount=/proc/{holder_pid}/ns/mnt "
               f"{shlex.quote(sys.executable)} -c {shlex.quote(CHILD)}")
    with tempfile.TemporaryFile(mode="w+") as stderr:
        child = subprocess.Popen(["sh", "-c", command], stdout=subprocess.PIPE, stderr=stderr,
                                 text=True, env=env, cwd=REPOSITORY)
        try:
            line = _read_line(child, FIRST_BATCH_TIMEOUT)
            if line.strip() != "first":
                child.kill()
                child.wait()
                stderr.seek(0)
                pytest.fail(f"the loader did not deliver its first batch (exit status "
                            f"{child.returncode}, printed {line!r}); its stderr:\n"
                            f"{stderr.read()[-4000:]}")
            landed = _kill_moment(shm_dir, set(_entries(shm_dir)))
            shmem_at_kill = _cgroup_shmem(cgroup)
            entries_at_kill = _entries(shm_dir)
            victims = [child.pid]
            try:
                victims += [process.pid for process in
                            psutil.Process(child.pid).children(recursive=True)]
            except psutil.NoSuchProcess:
                pass
            victims += [pid for pid in cgroup.pids() if pid not in victims]
            killed_at = time.monotonic()
            kill(victims)  # back to back: nobody is left to clean up
            child.wait(SETTLE_SECONDS)

            while True:
                state = State(
                    _cgroup_shmem(cgroup), _meminfo_shmem(), _entries(shm_dir),
                    sorted({*(pid for pid in victims if _alive(pid)), *cgroup.pids()}),
                    time.monotonic() - killed_at,
                )
                if state.clean(meminfo_before) or state.elapsed > SETTLE_SECONDS:
                    break
                time.sleep(0.05)
        finally:
            kill([child.pid, *cgroup.pids()])
            child.wait()
            if child.stdout is not None:
                child.stdout.close()

    summary = (f"{state.elapsed:.1f} s after SIGKILL of all {len(victims)} processes {victims} "
               f"({landed}; the cgroup held {shmem_at_kill / MiB:.0f} MiB of shared memory then, "
               f"/dev/shm {entries_at_kill})")
    print(f"{summary}: cgroup shmem {state.cgroup_shmem / MiB:.1f} MiB, /proc/meminfo Shmem "
          f"{state.meminfo_shmem / MiB:.0f} MiB ({meminfo_before / MiB:.0f} MiB before)")
    problems = []
    if state.processes:
        problems.append(f"processes of the loader still alive: {state.processes}")
    if state.entries:
        problems.append(f"left in /dev/shm: {state.entries}")
    if state.cgroup_shmem > CGROUP_SHMEM_LEFT:
        problems.append(f"shared memory not given back: the loader's cgroup still holds "
                        f"{state.cgroup_shmem / MiB:.1f} MiB")
    if state.meminfo_shmem > meminfo_before + MEMINFO_SLACK:
        problems.append(f"/proc/meminfo Shmem {state.meminfo_shmem / MiB:.0f} MiB, "
                        f"{meminfo_before / MiB:.0f} MiB before the loader")
    assert not problems, f"{summary}: " + "; ".join(problems)
