"""A host-wide budget of graphd sessions, and the record of every session this host holds.

graphd caps live sessions per user and client IP (``max_sessions_per_ip_per_user``, 300 by
default), and every rank, worker and loader of a job on one host shares that cap.  This module
keeps them under it without a coordinator: the budget is ``budget`` *slot files* in a directory
of this OS user's (one directory per graphd user and graphd cluster: its addresses resolved to
IPs and sorted, so that ``localhost:9669`` and ``127.0.0.1:9669`` share one), and a session may
exist only while its process holds a slot's ``flock``.

* **Acquire.**  Try ``flock(LOCK_EX | LOCK_NB)`` on the slots, from a random one; the first free
  slot is ours.  None free: the host is at its budget (the caller waits for a session of its own).
* **Record.**  The holder writes the session's id and graphd address into the slot file, so the
  file says which session may still be live on graphd.
* **Release.**  After signing the session out, truncate the file, then unlock.  A slot released
  with its content intact (graphd unreachable at sign-out) still names a session to sign out.
* **Leaks are found by anyone.**  The kernel drops a process's ``flock`` however it dies,
  SIGKILL included, so an unlocked slot that still names a session is a leaked session: whoever
  takes that slot signs it out first, and :meth:`HostSessionBudget.stale_sessions` lists them all
  for a sweep (the main process runs one when a worker dies).

``hungry`` is a file whose mtime a process with no session at all touches when it is refused one
(the budget is full, or graphd refused the login for its cap): processes holding more than one
session give one back while it is fresh, so a late rank is never starved by early ones.

Slot files are opened ``O_CLOEXEC``; a forked child closes its copies of its parent's slots
without unlocking them (:meth:`SessionSlot.forget`): the lock stays the parent's.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import random
import socket
import stat
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

# A hungry mark this recent makes holders of several sessions give one back.  Long enough for a
# starving process's next login attempts (its backoff tops out below it), short enough that a
# process which got its session stops the shedding soon.
HUNGRY_FRESH_SECONDS = 2.0


def budget_root() -> Path:
    """``$XDG_RUNTIME_DIR/mploader-nebula`` when that is this user's, else
    ``/tmp/mploader-nebula-<uid>`` (made 0700)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        with contextlib.suppress(OSError):
            info = os.stat(runtime)
            if stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid():
                return Path(runtime) / "mploader-nebula"
    return Path("/tmp") / f"mploader-nebula-{os.getuid()}"


def _private_dir(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise PermissionError(
            f"{path} is not a directory of this user's; the NebulaGraph session budget cannot "
            "use it (remove it, or set XDG_RUNTIME_DIR to a private directory)"
        )
    return path


@dataclass(frozen=True)
class StaleSession:
    """A session a dead process left on graphd, as its slot file names it."""

    slot: int
    session_id: int
    address: str  # "host:port" of the graphd that made it


class SessionSlot:
    """One held slot of the budget: its process may keep one graphd session while holding it."""

    def __init__(self, path: Path, index: int, fd: int, stale: StaleSession | None) -> None:
        self.path = path
        self.index = index
        self.fd = fd
        self.pid = os.getpid()
        self.stale = stale  # what the slot named when it was taken: sign it out first

    def record(self, session_id: int, address: str) -> None:
        """Name the session this slot now stands for."""
        text = f"{session_id} {address}\n".encode()
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, text, 0)

    def release(self, signed_out: bool) -> None:
        """Give the slot back; ``signed_out``: the session it names is gone from graphd."""
        if self.fd < 0:
            return
        fd, self.fd = self.fd, -1
        if self.pid != os.getpid():
            os.close(fd)  # a forked copy: the lock is the parent's
            return
        try:
            if signed_out:
                os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def forget(self) -> None:
        """In a forked child: close this process's copy without unlocking (the parent's lock)."""
        fd, self.fd = self.fd, -1
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)


def cluster_key(addresses: Sequence[tuple[str, int]]) -> str:
    """One graphd cluster however its addresses are spelled: each host resolved to the IPv4
    address nebula3 connects to (``localhost`` and ``127.0.0.1`` are one graphd, whose cap
    counts both), duplicates dropped, sorted.  A host that does not resolve keeps its name."""
    resolved = {(_resolve(host), port) for host, port in addresses}
    return ", ".join(f"{host}:{port}" for host, port in sorted(resolved))


def _resolve(host: str) -> str:
    try:
        return socket.gethostbyname(host)  # as nebula3's ConnectionPool does
    except OSError:
        return host


class HostSessionBudget:
    """``budget`` slots shared by every process of this OS user for one graphd user and
    graphd cluster (its addresses, however spelled: :func:`cluster_key`; see the module doc)."""

    def __init__(self, user: str, addresses: Sequence[tuple[str, int]], budget: int) -> None:
        if budget < 1:
            raise ValueError(f"the session budget must be >= 1, got {budget}")
        self.budget = budget
        self.addresses = cluster_key(addresses)
        key = hashlib.sha1(f"{user}@{self.addresses}".encode()).hexdigest()[:16]
        self.directory = budget_root() / key
        self.user = user

    def _ensure_directory(self) -> None:
        _private_dir(self.directory.parent)
        _private_dir(self.directory)

    def _slot_path(self, index: int) -> Path:
        return self.directory / f"slot-{index:05d}"

    def try_acquire(self) -> SessionSlot | None:
        """A free slot, locked for this process, or ``None`` when every slot is held."""
        self._ensure_directory()
        start = random.randrange(self.budget)
        for offset in range(self.budget):
            index = (start + offset) % self.budget
            locked = self._lock(index, fcntl.LOCK_EX)
            if locked is not None:
                fd, stale = locked
                return SessionSlot(self._slot_path(index), index, fd, stale)
        return None

    def held(self) -> int:
        """How many slots live processes hold now (sessions this host has)."""
        if not self.directory.is_dir():
            return 0
        count = 0
        for index in range(self.budget):
            locked = self._lock(index, fcntl.LOCK_SH)
            if locked is None:
                count += 1
            else:
                fcntl.flock(locked[0], fcntl.LOCK_UN)
                os.close(locked[0])
        return count

    @contextlib.contextmanager
    def stale_sessions(self) -> Iterator[list[tuple[SessionSlot, StaleSession]]]:
        """Lock every free slot that names a session (left by a process that died); yields
        them, the caller signs them out and :meth:`SessionSlot.release` s each with the
        outcome.  Slots not released by the caller are released unchanged on exit."""
        found: list[tuple[SessionSlot, StaleSession]] = []
        try:
            if self.directory.is_dir():
                for path in sorted(self.directory.glob("slot-*")):
                    index = int(path.name.split("-")[1])
                    locked = self._lock(index, fcntl.LOCK_EX)
                    if locked is None:
                        continue
                    fd, stale = locked
                    slot = SessionSlot(path, index, fd, stale)
                    if stale is None:
                        slot.release(signed_out=True)
                    else:
                        found.append((slot, stale))
            yield found
        finally:
            for slot, _ in found:
                slot.release(signed_out=False)

    def mark_hungry(self) -> None:
        """This process has no session and was refused one: ask holders to give one back."""
        self._ensure_directory()
        path = self.directory / "hungry"
        with contextlib.suppress(OSError):
            path.touch()
            os.utime(path)

    def someone_hungry(self) -> bool:
        try:
            return time.time() - os.stat(self.directory / "hungry").st_mtime < HUNGRY_FRESH_SECONDS
        except OSError:
            return False

    def _lock(self, index: int, mode: int) -> tuple[int, StaleSession | None] | None:
        path = self._slot_path(index)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
        except OSError as error:
            os.close(fd)
            if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return None
            raise
        return fd, _read_stale(fd, index)


def _read_stale(fd: int, index: int) -> StaleSession | None:
    text = os.pread(fd, 256, 0).decode(errors="replace").split()
    if len(text) != 2 or not text[0].isdigit():
        return None
    return StaleSession(index, int(text[0]), text[1])
