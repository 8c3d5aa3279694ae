"""A memory cgroup made fresh for a test, and removed after it.

``memory_cgroup(prefix)`` makes ``<prefix>-<pid>-<n>`` in the memory controller's hierarchy:
cgroup v1's memory hierarchy where one is mounted, else a cgroup v2 hierarchy with the memory
controller (enabled below its root if need be).  With a ``limit``, the cgroup's memory is
capped at it, and so is swap where the kernel accounts it.  On leaving, whatever still runs in
the cgroup is killed and the directory removed (rmdir fails while a task remains: a child just
exited, not yet reaped; it is retried for a while).

Where no cgroup can be made, the test is skipped, saying why: not root, no memory controller
mounted, none that can be enabled or written.
"""

from __future__ import annotations

import itertools
import os
import signal
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

NEEDS_ROOT = "needs root to make a memory cgroup"
_counter = itertools.count()


@dataclass(frozen=True)
class MemoryCgroup:
    directory: Path
    version: int  # 1 or 2

    @property
    def procs(self) -> Path:
        """``cgroup.procs``: a pid written there joins the cgroup."""
        return self.directory / "cgroup.procs"

    @property
    def usage(self) -> Path:
        return self.directory / ("memory.usage_in_bytes" if self.version == 1 else "memory.current")

    @property
    def limit(self) -> Path:
        return self.directory / ("memory.limit_in_bytes" if self.version == 1 else "memory.max")

    @property
    def stat(self) -> Path:
        return self.directory / "memory.stat"

    @property
    def peak(self) -> Path | None:
        """The peak usage's file, where the kernel has one."""
        peak = self.directory / ("memory.max_usage_in_bytes" if self.version == 1
                                 else "memory.peak")
        return peak if peak.exists() else None

    def pids(self) -> list[int]:
        """The processes in the cgroup now (none once it is gone)."""
        try:
            with self.procs.open() as procs:
                return [int(line) for line in procs if line.strip()]
        except FileNotFoundError:
            return []

    def remove(self, seconds: float = 10) -> None:
        """Kill what still runs in the cgroup and rmdir it, retrying for ``seconds``."""
        deadline = time.monotonic() + seconds
        while True:
            kill(self.pids())
            try:
                self.directory.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


def read(path: Path) -> str:
    """The file's text, or "" where it cannot be read."""
    try:
        return path.read_text()
    except OSError:
        return ""


def kill(pids: Iterable[int]) -> None:
    """SIGKILL each of ``pids`` that is still there."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _memory_mount() -> tuple[int, Path] | None:
    """(version, mount point) of the memory controller's hierarchy, from /proc/self/mountinfo:
    v1's where it is mounted, else a v2 hierarchy that offers it."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    v2 = None
    for line in lines:
        fields, _, after = line.partition(" - ")
        kinds = after.split()
        if len(kinds) < 3:
            continue
        point = Path(fields.split()[4].replace("\\040", " "))
        if kinds[0] == "cgroup" and "memory" in kinds[2].split(","):
            return 1, point
        if kinds[0] == "cgroup2" and "memory" in read(point / "cgroup.controllers").split():
            v2 = (2, point)
    return v2


def _make(prefix: str, limit: int | None = None, *,
          needs_root: str = NEEDS_ROOT) -> MemoryCgroup:
    if os.geteuid() != 0:
        pytest.skip(needs_root)
    mount = _memory_mount()
    if mount is None:
        pytest.skip("no memory cgroup controller is mounted (v1 memory or v2 with memory)")
    version, parent = mount
    if version == 2 and "memory" not in read(parent / "cgroup.subtree_control").split():
        try:
            (parent / "cgroup.subtree_control").write_text("+memory")
        except OSError as error:
            pytest.skip(f"cannot enable the v2 memory controller below {parent}: {error}")
    cgroup = MemoryCgroup(parent / f"{prefix}-{os.getpid()}-{next(_counter)}", version)
    try:
        cgroup.directory.mkdir()
    except OSError as error:
        pytest.skip(f"cannot make a memory cgroup in {parent}: {error}")
    if limit is not None:
        try:
            cgroup.limit.write_text(str(limit))
        except BaseException:
            cgroup.remove()
            raise
        # no swap to spill into either, where the kernel accounts it
        swap, no_swap = (("memory.memsw.limit_in_bytes", str(limit)) if version == 1
                         else ("memory.swap.max", "0"))
        try:
            (cgroup.directory / swap).write_text(no_swap)
        except OSError:
            pass
    return cgroup


@contextmanager
def memory_cgroup(prefix: str, limit: int | None = None, *,
                  needs_root: str = NEEDS_ROOT) -> Iterator[MemoryCgroup]:
    """A new memory cgroup ``<prefix>-<pid>-<n>`` for the ``with`` block, capped at ``limit``
    bytes (and no swap) where one is given, removed at its end with whatever still runs in it
    killed; or pytest.skip saying why there can be none (``needs_root`` where the test is not
    root)."""
    cgroup = _make(prefix, limit, needs_root=needs_root)
    try:
        yield cgroup
    finally:
        cgroup.remove()
