"""Names of shared-memory blocks under ``/dev/shm``, and the sweeps that remove leftovers.

Every block is a file ``/dev/shm/mploader-<main_pid>-<counter>-<worker_id>-<worker_pid>-<seq>``:

- ``<main_pid>-<counter>`` is the loader tag, unique per iterator (the counter carries a random
  part, so loaders in different pid namespaces sharing ``/dev/shm`` never collide). The loader's
  lock file ``mploader-<tag>-lock`` (``liveness.py``) says whether any process of it is alive.
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
import secrets

import psutil

from mploader.channel.shm.liveness import (
    LOCK_SUFFIX,
    Claim,
    claim_if_abandoned,
    unlink_path_quietly,
)
from mploader.config import SHM_DIRECTORY

NAME_PREFIX = "mploader-"

# A tag is "<main_pid>-<counter>" with no further dashes, so names split into fixed fields and the
# prefix "mploader-<tag>-" of one tag is never a prefix of another tag's names.
_TAG_PATTERN = re.compile(r"^(\d+)-([A-Za-z0-9_.]+)$")
_NAME_PATTERN = re.compile(r"^mploader-(\d+)-([A-Za-z0-9_.]+)-(\d+)-(\d+)-(\d+)$")
_LOCK_PATTERN = re.compile(r"^mploader-(\d+)-([A-Za-z0-9_.]+)" + re.escape(LOCK_SUFFIX) + "$")

_tag_counter = itertools.count()


def new_loader_tag() -> str:
    """A fresh tag for one iterator of this process: ``"<pid>-<counter>_<random>"``.

    The random part keeps tags apart across pid namespaces, where two main processes may have the
    same pid (often 1) and share ``/dev/shm``.
    """
    return f"{os.getpid()}-{next(_tag_counter)}_{secrets.token_hex(4)}"


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
    return unlink_path_quietly(block_path(name))


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


def remove_loader_leftovers(loader_tag: str, claim: Claim) -> int:
    """Unlink every name of a loader whose lock we claimed (its lock file included)."""
    try:
        return unlink_loader_names(loader_tag)
    finally:
        claim.finish()


def sweep_orphans() -> int:
    """Remove this user's ``/dev/shm/mploader-*`` entries of loaders with no process left.

    Only entries owned by this process's user are looked at: ``/dev/shm`` is sticky, so another
    user's entries are not ours to remove (nor, as root, ours to judge). A loader is alive while
    some process holds its lock file (see ``liveness.py``), in whatever pid namespace it runs.
    Entries of a loader with no lock file come from an mploader made before the lock (or from a
    sweep interrupted half way) and are judged by their main process's pid and start time.
    Returns how many entries were removed.
    """
    uid = os.geteuid()
    tags: dict[str, list[str]] = {}
    for name in list_names():
        match = _NAME_PATTERN.match(name) or _LOCK_PATTERN.match(name)
        if match is None or not _owned_by(name, uid):
            continue
        tags.setdefault(f"{match.group(1)}-{match.group(2)}", []).append(name)
    removed = 0
    for loader_tag, names in tags.items():
        claim = claim_if_abandoned(loader_tag)
        if isinstance(claim, Claim):
            removed += remove_loader_leftovers(loader_tag, claim)
            continue
        if claim is None:
            continue  # some process of the loader holds its lock: alive
        main_pid = int(loader_tag.split("-", 1)[0])
        for name in names:
            if not _process_alive_since(main_pid, block_path(name)):
                removed += unlink_quietly(name)
    return removed


def _owned_by(name: str, uid: int) -> bool:
    try:
        return os.lstat(block_path(name)).st_uid == uid
    except FileNotFoundError:
        return False


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
