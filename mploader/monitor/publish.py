"""Where and how loaders publish their snapshots for ``python -m mploader top``: the
directory, the watching file, atomic private JSON files.  Both sides use these: the publisher
(``mploader.iterator.publisher``, in each loader's process) and ``top``.

``<dir>`` is ``$XDG_RUNTIME_DIR/mploader`` when that variable names a directory of this user's,
else ``/tmp/mploader-<uid>``: made 0700, and used only while it is a real directory (not a
symlink) owned by this user and closed to others; files are 0600.  ``top`` touches
``<dir>/watching`` at each refresh, and a mtime less than ``WATCHING_FRESH_SECONDS`` old means
someone is watching.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
import tempfile
import time
from pathlib import Path
from typing import Any

_log = logging.getLogger("mploader")

# A live view refreshes once a second; so does what it shows.
PUBLISH_INTERVAL_SECONDS = 1.0
# ``top`` touches the watching file every second: three missed refreshes mean nobody watches.
WATCHING_FRESH_SECONDS = 3.0
WATCHING_FILE = "watching"
FORMAT_VERSION = 1


def publish_dir() -> Path:
    """Where this user's loaders publish (the directory need not exist)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        try:
            info = os.stat(runtime)
        except OSError:
            info = None
        if info is not None and stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid():
            return Path(runtime) / "mploader"
    return Path("/tmp") / f"mploader-{os.getuid()}"


def check_private_dir(path: Path) -> str | None:
    """Why ``path`` must not be used (a symlink, someone else's, open to others), or None."""
    try:
        info = os.lstat(path)
    except OSError as error:
        return f"cannot stat {path}: {error.strerror}"
    if stat.S_ISLNK(info.st_mode):
        return f"{path} is a symlink"
    if not stat.S_ISDIR(info.st_mode):
        return f"{path} is not a directory"
    if info.st_uid != os.getuid():
        return f"{path} belongs to uid {info.st_uid}, not {os.getuid()}"
    if info.st_mode & 0o077:
        return f"{path} is open to other users (mode {stat.S_IMODE(info.st_mode):o})"
    return None


def make_private_dir(path: Path) -> str | None:
    """Create ``path`` (0700) if missing; why it must not be used, or None."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    return check_private_dir(path)


def is_watched(directory: Path) -> bool:
    try:
        mtime = os.stat(directory / WATCHING_FILE).st_mtime
    except OSError:
        return False
    return time.time() - mtime < WATCHING_FRESH_SECONDS


def published_files(directory: Path) -> list[Path]:
    """The processes' files in ``directory``: ``<pid>.json``.  Not the watching file, and not a
    write in progress (``write_private_json``'s temporary ``.*.tmp``, renamed when complete)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return [directory / name for name in names
            if name.endswith(".json") and name[: -len(".json")].isdigit()]


def write_private_json(directory: Path, name: str, document: Any) -> None:
    """Write ``directory/name`` atomically, mode 0600."""
    handle, temporary = tempfile.mkstemp(dir=directory, prefix=".", suffix=".tmp")
    try:
        with os.fdopen(handle, "w") as file:
            json.dump(document, file)
        os.replace(temporary, directory / name)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


