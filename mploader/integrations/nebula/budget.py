"""A host-wide budget of graphd sessions, and the record of every session this host holds.

graphd caps live sessions per user and client IP (``max_sessions_per_ip_per_user``, 300 by
default), and every rank, worker and loader of a job on one host shares that cap.  This module
keeps them under it without a coordinator: the budget is ``budget`` *slot files* in a directory
of this OS user's (one directory per graphd user and graphd cluster: its addresses resolved to
IPs and sorted, so that ``localhost:9669`` and ``127.0.0.1:9669`` share one), and a session may
exist only while its process holds a slot's ``flock``.

* **Acquire.**  Try ``flock(LOCK_EX | LOCK_NB)`` on the slots, from a random one; the first free
  slot is ours.  None free: the host is at its budget (the caller waits for a session of its own).
* **Record.**  The slot file says, at every moment, which sessions its holder may have on graphd
  (:mod:`.logins` keeps it so): ``login <address> <since>`` before a login's request goes out
  (:class:`LoginInFlight`: graphd may make a session whose id only its answer carries), then
  ``<session id> <address>`` as soon as graphd answers (:class:`NamedSession`), before the
  session is used.  Each write is one ``pwrite`` of one block, so a kill never leaves half a
  record.  What a holder took over from a dead one is marked ``left``, so that another process
  reading the slot (:meth:`HostSessionBudget.all_records`) tells a live login from a dead one.
* **Release.**  After signing the session out, clear the record, then unlock.  A slot released
  with its record intact (graphd unreachable at sign-out, or a login with no answer) still names
  what to sign out.
* **Leaks are found by anyone.**  The kernel drops a process's ``flock`` however it dies,
  SIGKILL included, so an unlocked slot with a record is what a dead process left: whoever
  takes that slot signs it out (the records come with it, :attr:`SessionSlot.inherited`), and
  :meth:`HostSessionBudget.stale_sessions` lists them all for a sweep (the main process runs one
  when a worker dies).

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


# One slot file is one block, written with one pwrite: a SIGKILL lands before or after it.  A
# record is under 60 bytes; a slot holds its holder's one and what dead holders left unsettled.
_BLOCK_BYTES = 4096


@dataclass(frozen=True)
class NamedSession:
    """A session graphd made for a slot's holder: signed out by id if the holder dies."""

    session_id: int
    address: str  # "host:port" of the graphd that made it

    def line(self) -> str:
        return f"{self.session_id} {self.address}"


@dataclass(frozen=True)
class LoginInFlight:
    """A login sent to ``address`` at ``since`` (this host's ``time.time()``) whose answer is not
    on record: graphd may have made a session that only the answer named."""

    address: str
    since: float

    def line(self) -> str:
        return f"login {self.address} {self.since:.6f}"


SlotRecord = NamedSession | LoginInFlight
# Marks a record the slot's holder took over from a dead one (it settles it), as opposed to its
# own: another process's sweep reads a held slot's own login in flight as live, and a taken-over
# one as dead.
_LEFT = "left"


@dataclass(frozen=True)
class SlotView:
    """A slot as another process reads it: held by a live process or not, its holder's own
    record, and what the holder took over from a dead one."""

    held: bool
    own: SlotRecord | None
    left: tuple[SlotRecord, ...]

    @property
    def records(self) -> list[SlotRecord]:
        return [*self.left, *([self.own] if self.own is not None else [])]


class SessionSlot:
    """One held slot of the budget: its process may keep one graphd session while holding it.

    The file holds :attr:`inherited` (what a dead holder left and this one has not settled
    yet) and :attr:`own` (this holder's login or session); :meth:`note` and :meth:`settled`
    rewrite it whole."""

    def __init__(self, path: Path, index: int, fd: int, inherited: list[SlotRecord]) -> None:
        self.path = path
        self.index = index
        self.fd = fd
        self.pid = os.getpid()
        self.inherited = inherited  # left by a dead holder: sign out before or after taking it
        self.own: SlotRecord | None = None

    @property
    def records(self) -> list[SlotRecord]:
        """What the file says now."""
        return [*self.inherited, *([self.own] if self.own is not None else [])]

    def note(self, own: SlotRecord | None) -> None:
        """Record this holder's login in flight, its session, or (``None``) neither."""
        self.own = own
        self._write()

    def settled(self, left: list[SlotRecord]) -> None:
        """What this slot inherited is signed out but ``left``."""
        self.inherited = list(left)
        self._write()

    def release(self, signed_out: bool) -> None:
        """Give the slot back; ``signed_out``: this holder's session is gone from graphd (its
        record goes; an unsettled inherited record or a login with no answer stays)."""
        if self.fd < 0:
            return
        if self.pid != os.getpid():
            fd, self.fd = self.fd, -1
            os.close(fd)  # a forked copy: the lock is the parent's
            return
        try:
            if signed_out and self.own is not None:
                self.note(None)
        finally:
            fd, self.fd = self.fd, -1
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)

    def forget(self) -> None:
        """In a forked child: close this process's copy without unlocking (the parent's lock)."""
        fd, self.fd = self.fd, -1
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)

    def _write(self) -> None:
        records = self.records
        if not records:
            os.ftruncate(self.fd, 0)
            return
        lines = [f"{_LEFT} {record.line()}" for record in self.inherited]
        lines += [self.own.line()] if self.own is not None else []
        text = "".join(line + "\n" for line in lines).encode()
        if len(text) > _BLOCK_BYTES:
            raise ValueError(f"{len(records)} session records do not fit a slot file")
        os.pwrite(self.fd, text.ljust(_BLOCK_BYTES), 0)


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
                fd, inherited = locked
                return _taken(self._slot_path(index), index, fd, inherited)
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
    def stale_sessions(self) -> Iterator[list[SessionSlot]]:
        """Lock every free slot with records (left by a process that died); yields them, the
        caller signs out what they inherited and releases each.  Slots not released by the
        caller are released unchanged on exit."""
        found: list[SessionSlot] = []
        try:
            if self.directory.is_dir():
                for path in sorted(self.directory.glob("slot-*")):
                    index = int(path.name.split("-")[1])
                    locked = self._lock(index, fcntl.LOCK_EX)
                    if locked is None:
                        continue
                    fd, inherited = locked
                    slot = _taken(path, index, fd, inherited)
                    if inherited:
                        found.append(slot)
                    else:
                        slot.release(signed_out=True)
            yield found
        finally:
            for slot in found:
                slot.release(signed_out=False)

    def all_records(self) -> list[SlotView]:
        """Every slot as it stands, read without taking any lock (each file until two reads
        agree: its holder may be writing it); a slot this process holds counts as held."""
        views: list[SlotView] = []
        if not self.directory.is_dir():
            return views
        for path in sorted(self.directory.glob("slot-*")):
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                    held = False
                    fcntl.flock(fd, fcntl.LOCK_UN)
                except OSError as error:
                    if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                        raise
                    held = True
                own, left = _read_stable(fd)
                views.append(SlotView(held, own, tuple(left)))
            finally:
                os.close(fd)
        return views

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

    def _lock(self, index: int, mode: int) -> tuple[int, list[SlotRecord]] | None:
        path = self._slot_path(index)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
        except OSError as error:
            os.close(fd)
            if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return None
            raise
        own, left = _read_records(fd)
        return fd, [*left, *([own] if own is not None else [])]


def _taken(path: Path, index: int, fd: int, inherited: list[SlotRecord]) -> SessionSlot:
    """A slot just locked; what a dead holder left in it is marked as taken over at once."""
    slot = SessionSlot(path, index, fd, inherited)
    if inherited:
        slot.settled(inherited)
    return slot


def _read_records(fd: int) -> tuple[SlotRecord | None, list[SlotRecord]]:
    """A slot file's own record and the records taken over (lines marked ``left``); a line of
    neither form is skipped."""
    own: SlotRecord | None = None
    left: list[SlotRecord] = []
    for line in os.pread(fd, _BLOCK_BYTES, 0).decode(errors="replace").splitlines():
        words = line.split()
        taken_over = bool(words) and words[0] == _LEFT
        record = _parse(words[1:] if taken_over else words)
        if record is None:
            continue
        if taken_over:
            left.append(record)
        else:
            own = record
    return own, left


def _parse(words: list[str]) -> SlotRecord | None:
    if len(words) == 2 and words[0].isdigit():
        return NamedSession(int(words[0]), words[1])
    if len(words) == 3 and words[0] == "login":
        with contextlib.suppress(ValueError):
            return LoginInFlight(words[1], float(words[2]))
    return None


def _read_stable(fd: int) -> tuple[SlotRecord | None, list[SlotRecord]]:
    """:func:`_read_records` of a file another process may be writing: until two reads agree."""
    records = _read_records(fd)
    while True:
        again = _read_records(fd)
        if again == records:
            return records
        records = again
