"""Whether a loader is alive, decided by a lock rather than by a pid number.

Every loader has a lock file ``/dev/shm/mploader-<tag>-lock``. Its main process creates it (before
any block of the loader exists) and holds a shared ``flock`` on it for the channel's lifetime;
each worker opens it and holds a shared lock too. The kernel drops a process's locks when it dies,
however it dies, so a sweeper that can take the lock *exclusively* knows that no process of that
loader is left, in whatever pid namespace it ran (a pid number means nothing across containers
sharing ``/dev/shm``; a lock on a shared file means the same thing everywhere).

The last process of a loader to let go (a worker that outlived a SIGKILLed main process) takes the
exclusive lock itself and removes the loader's leftovers, so nothing stays in ``/dev/shm`` once
every process of a loader is gone. Forked children do not keep their parent's locks: a child is
not part of the loader (a forked worker opens the lock again itself).
"""

from __future__ import annotations

import errno
import fcntl
import os
import threading

from mploader.config import SHM_DIRECTORY

LOCK_SUFFIX = "-lock"
_NAME_PREFIX = "mploader-"

# Descriptors of the locks this process holds, closed in a forked child (whose copies would keep
# a dead loader "alive" for as long as the child runs).
_held: set[int] = set()
_held_lock = threading.Lock()


def lock_name(loader_tag: str) -> str:
    """The lock file's name (without directory) of ``loader_tag``."""
    return f"{_NAME_PREFIX}{loader_tag}{LOCK_SUFFIX}"


def _lock_path(loader_tag: str) -> str:
    return os.path.join(SHM_DIRECTORY, lock_name(loader_tag))


class LoaderLock:
    """A shared lock on a loader's lock file, held by one process of the loader until released.

    ``create=True`` (the main process) makes the file; ``create=False`` (a worker) opens the
    existing one, and holds nothing if it is gone (its main process is dead and was swept).
    """

    def __init__(self, loader_tag: str, create: bool) -> None:
        self.loader_tag = loader_tag
        self.path = _lock_path(loader_tag)
        self.owner_pid = os.getpid()
        self._fd: int | None = self._create() if create else self._open_existing()
        if self._fd is not None:
            with _held_lock:
                _held.add(self._fd)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self, remove: bool = False) -> None:
        """Let go of the lock; with ``remove``, unlink the lock file first (its owner is done).
        Idempotent; does nothing in a forked child (the child's copy was closed at fork)."""
        fd, self._fd = self._fd, None
        if fd is None or os.getpid() != self.owner_pid:
            return
        if remove:
            unlink_path_quietly(self.path)
        with _held_lock:
            _held.discard(fd)
        os.close(fd)

    def _create(self) -> int:
        """Create the file and lock it; if a sweeper removed it between the two steps (it found
        it unlocked), make it again."""
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            fcntl.flock(fd, fcntl.LOCK_SH)
            if _is_linked(fd, self.path):
                return fd
            os.close(fd)

    def _open_existing(self) -> int | None:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        fcntl.flock(fd, fcntl.LOCK_SH)
        return fd


class Claim:
    """The exclusive lock of a loader nobody holds any more: its leftovers are the claimer's to
    remove. ``finish()`` unlinks the lock file and lets go."""

    def __init__(self, fd: int, path: str) -> None:
        self._fd = fd
        self._path = path

    def finish(self) -> None:
        unlink_path_quietly(self._path)
        os.close(self._fd)


def claim_if_abandoned(loader_tag: str) -> Claim | bool | None:
    """Try the loader's lock exclusively, without waiting.

    Returns a :class:`Claim` when no process holds it (the loader is gone), ``None`` when some
    process does (alive), and ``False`` when there is no lock file to decide by.
    """
    path = _lock_path(loader_tag)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    except PermissionError:  # not ours (another user's): never ours to judge
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        os.close(fd)
        if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return None
        raise
    return Claim(fd, path)


def _is_linked(fd: int, path: str) -> bool:
    """Whether ``path`` still names the file open as ``fd``."""
    try:
        named = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (mine.st_dev, mine.st_ino)


def unlink_path_quietly(path: str) -> bool:
    """Remove ``path``; ``False`` if it was already gone (someone else removed it)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def _close_inherited_locks() -> None:
    """In a forked child: the parent's locks are the parent's; drop our copies of them."""
    global _held_lock
    _held_lock = threading.Lock()  # the parent may have held it while forking
    for fd in _held:
        try:
            os.close(fd)
        except OSError:
            pass
    _held.clear()


os.register_at_fork(after_in_child=_close_inherited_locks)
