"""Names of shared-memory blocks under ``/dev/shm``, and the sweeps that remove leftovers.

Every block is a file ``/dev/shm/mploader-<main_pid>-<counter>-<worker_id>-<worker_pid>-<seq>``:

- ``<main_pid>-<counter>`` is the loader tag, unique per iterator of one main process. Its main pid
  lets :func:`sweep_orphans` recognise blocks of a main process that was SIGKILLed.
- ``<worker_id>-<worker_pid>`` lets ``MainChannel.forget_worker`` remove the names of a dead
  worker without touching those of its replacement.
- ``<seq>`` counts blocks within one worker process.

A name lives only from the worker's ``O_EXCL`` create until the main process maps the block (it
unlinks the name at once); afterwards only the two mappings keep the memory. So leftovers can only
come from blocks that the main process never saw, and the sweeps below cover each way that happens.
"""

from __future__ import annotations

import itertools
import os
import re

import psutil

from mploader.config import SHM_DIRECTORY

NAME_PREFIX = "mploader-"

# A tag is "<main_pid>-<counter>" with no further dashes, so names split into fixed fields and the
# prefix "mploader-<tag>-" of one tag is never a prefix of another tag's names.
_TAG_PATTERN = re.compile(r"^(\d+)-([A-Za-z0-9_.]+)$")
_NAME_PATTERN = re.compile(r"^mploader-(\d+)-([A-Za-z0-9_.]+)-(\d+)-(\d+)-(\d+)$")

_tag_counter = itertools.count()


def new_loader_tag() -> str:
    """A fresh tag for one iterator of this process: ``"<pid>-<counter>"``."""
    return f"{os.getpid()}-{next(_tag_counter)}"


def check_loader_tag(loader_tag: str) -> int:
    """Validate ``loader_tag`` and return the main pid it carries."""
    match = _TAG_PATTERN.match(loader_tag)
    if match is None:
        raise ValueError(
            f"loader_tag must look like '<main_pid>-<counter>' (letters, digits, '_' and '.' after "
            f"the dash), got {loader_tag!r}; mploader.channel.shm.new_loader_tag() makes one"
        )
    return int(match.group(1))


def block_name(loader_tag: str, worker_id: int, worker_pid: int, sequence: int) -> str:
    """The file name (without directory) of a worker's ``sequence``-th block."""
    return f"{NAME_PREFIX}{loader_tag}-{worker_id}-{worker_pid}-{sequence}"


def block_path(name: str) -> str:
    return os.path.join(SHM_DIRECTORY, name)


def list_names() -> list[str]:
    """All ``mploader-*`` entries currently in ``/dev/shm``."""
    try:
        return [entry for entry in os.listdir(SHM_DIRECTORY) if entry.startswith(NAME_PREFIX)]
    except FileNotFoundError:
        return []


def unlink_quietly(name: str) -> bool:
    """Remove ``/dev/shm/<name>``; ``False`` if it was already gone (someone else unlinked it)."""
    try:
        os.unlink(block_path(name))
    except FileNotFoundError:
        return False
    return True


def unlink_loader_names(
    loader_tag: str, worker_id: int | None = None, worker_pid: int | None = None
) -> int:
    """Remove the names of one loader, optionally only one worker's (and one pid's) names."""
    prefix = f"{NAME_PREFIX}{loader_tag}-"
    if worker_id is not None:
        prefix += f"{worker_id}-"
        if worker_pid is not None:
            prefix += f"{worker_pid}-"
    return sum(unlink_quietly(name) for name in list_names() if name.startswith(prefix))


def sweep_orphans() -> int:
    """Remove ``/dev/shm/mploader-*`` entries whose main process no longer exists.

    Covers a main process killed with SIGKILL (nothing of it ran to clean up). Entries whose main
    process is alive are left alone even if their worker is dead: that main process's own
    ``forget_worker``/``close`` removes them, and it may still be about to map them. Returns how
    many entries were removed.
    """
    removed = 0
    for name in list_names():
        match = _NAME_PATTERN.match(name)
        if match is None:
            continue
        main_pid = int(match.group(1))
        if _process_alive_since(main_pid, block_path(name)):
            continue
        removed += unlink_quietly(name)
    return removed


def _process_alive_since(pid: int, path: str) -> bool:
    """Whether ``pid`` runs and is the process that could have created ``path``.

    A zombie counts as dead, and so does a process that started after the file was created (the
    pid was reused by an unrelated process).
    """
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        started = process.create_time()
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:  # AccessDenied and friends: it exists, assume it is the owner
        return True
    try:
        created = os.stat(path).st_mtime
    except FileNotFoundError:
        return True  # gone already; nothing to do
    # create_time has a resolution of a clock tick (10 ms); allow a second of slack.
    return started <= created + 1.0
