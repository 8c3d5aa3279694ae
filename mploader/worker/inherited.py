"""File descriptors a forked worker inherits but must not keep open.

Under fork a worker inherits the main-process ends of every other worker's pipes; while it keeps
them, those pipes never see EOF.  The main process names them with the identity each had when it
was registered, and the worker closes only the ones that still are that pipe: an fd number closed
and reused since must never be closed by mistake (it could be the worker's own sentinel pipe).
"""

from __future__ import annotations

import os

# fd, and the (st_dev, st_ino) it had when registered.
InheritedFds = tuple[tuple[int, tuple[int, int]], ...]


def fd_identity(fd: int) -> tuple[int, int] | None:
    """(st_dev, st_ino) of what ``fd`` refers to now, or None if it is closed."""
    try:
        status = os.fstat(fd)
    except OSError:
        return None
    return status.st_dev, status.st_ino


def close_inherited(fds: InheritedFds) -> None:
    """In a forked worker: let go of the listed fds that are still the pipes they were.

    Each is replaced by ``/dev/null`` (``dup2``, atomic) rather than closed: the pipe loses this
    reference all the same, but the number stays taken.  The parent's ``Connection`` objects
    that hold these numbers live on in this process, and when its collector frees them (an
    abandoned iterator, garbage in the parent when the worker forked) each closes its number: a
    plain close would have made that ``EBADF``, or, after the worker reused the number for a file
    of its own, closed that file under it.
    """
    null = -1
    try:
        for fd, identity in fds:
            if fd_identity(fd) == identity:
                if null < 0:
                    null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
                os.dup2(null, fd, inheritable=False)
    finally:
        if null >= 0:
            os.close(null)
