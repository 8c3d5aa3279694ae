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
    """In a forked worker: close the listed fds that are still the pipes they were."""
    for fd, identity in fds:
        if fd_identity(fd) == identity:
            try:
                os.close(fd)
            except OSError:
                pass
