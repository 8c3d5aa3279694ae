"""How much memory the job may use, and how much it may still allocate now.

A leaf module (the standard library only), read by ``config`` for the pool's default budget and by
the channel before it creates a block.  Two numbers, each a :class:`MemoryLimit` that says where it
came from, because they end up in error messages:

* :func:`job_memory`: the memory the job may use at all: the smaller of its memory cgroup's limit
  (cgroup v2 ``memory.max``, v1 ``memory.limit_in_bytes``; the smallest over the cgroup and its
  ancestors) and ``MemAvailable`` in ``/proc/meminfo``.
* :func:`available_memory`: what may still be allocated now: the smaller of ``MemAvailable`` and
  what the memory cgroup's limit leaves (the limit less the cgroup's usage, its file cache counted
  as free since the kernel reclaims it first, as ``MemAvailable`` counts the machine's).

The process's own memory cgroup is found from ``/proc/self/cgroup`` and ``/proc/self/mountinfo``.
Anything missing or unreadable (no cgroup mounted, a container that hides them, an old kernel
without ``MemAvailable``) falls back to what can be read: ``MemAvailable``, else ``MemTotal``,
else ``sysconf``.  Where the cgroup's files are is worked out once per cgroup membership; the
numbers are read at each call (tens of microseconds).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

AVAILABLE_BYTES_ENV = "MPLOADER_MEMORY_AVAILABLE_FOR_TESTING"
"""Environment variable: a number of bytes that :func:`available_memory` returns instead of what it
measures (tests simulate a machine without memory to spare).  Read at each call, so it reaches
spawned workers too."""

# Limits at or above this mean "no limit": cgroup v1 writes 2**63 - 1 rounded down to a page
# (9223372036854771712), v2 writes "max".
_NO_LIMIT = 1 << 62

# Where the files are looked up: "/" but for tests, which point it at a fake tree.
_ROOT = "/"

_MEMINFO = "/proc/meminfo"


@dataclass(frozen=True)
class MemoryLimit:
    """A number of bytes and where it came from.

    ``source`` is written for an error message, as "what (where)", for example ``"the memory
    cgroup's limit (/sys/fs/cgroup/memory/foo/memory.limit_in_bytes)"`` or ``"the machine's
    available memory (MemAvailable in /proc/meminfo)"``.
    """

    bytes: int
    source: str


@dataclass(frozen=True)
class _Level:
    """One memory cgroup (the process's own or an ancestor): its limit, usage and stat files."""

    limit: str  # memory.max (v2) or memory.limit_in_bytes (v1)
    usage: str  # memory.current (v2) or memory.usage_in_bytes (v1)
    stat: str  # memory.stat
    version: int


def job_memory() -> MemoryLimit:
    """The memory the job may use: the smaller of its memory cgroup's limit (the smallest over the
    cgroup and its ancestors; none if unlimited or not found) and ``MemAvailable``."""
    best = _machine_available()
    for level in _cgroup_levels():
        limit = _read_limit(level.limit)
        if limit is not None and limit < best.bytes:
            best = MemoryLimit(limit, f"the memory cgroup's limit ({level.limit})")
    return best


def available_memory() -> MemoryLimit:
    """What may still be allocated now: the smaller of ``MemAvailable`` and, for the memory cgroup
    and each ancestor with a limit, the limit less the usage (file cache counted as free).

    The environment variable :data:`AVAILABLE_BYTES_ENV`, when set, replaces the measure.
    """
    override = os.environ.get(AVAILABLE_BYTES_ENV)
    if override is not None:
        try:
            count = int(override)
        except ValueError:
            raise ValueError(
                f"{AVAILABLE_BYTES_ENV} must be a number of bytes, got {override!r}"
            ) from None
        return MemoryLimit(count, f"the test override ({AVAILABLE_BYTES_ENV}={override})")
    best = _machine_available()
    for level in _cgroup_levels():
        limit = _read_limit(level.limit)
        usage = None if limit is None else _read_int_or(level.usage, None)
        if limit is None or usage is None:
            continue
        left = max(limit - usage + _file_cache(level), 0)
        if left < best.bytes:
            usage_name = os.path.basename(level.usage)
            best = MemoryLimit(left, f"the memory cgroup's limit less its usage ({level.limit} "
                                     f"less {usage_name}, its file cache counted as free)")
    return best


# -- /proc/meminfo ------------------------------------------------------------------------------


def _machine_available() -> MemoryLimit:
    """``MemAvailable``, else ``MemTotal`` (kernels before 3.14), else ``sysconf``."""
    try:
        text = _read(_join(_ROOT, _MEMINFO))
    except OSError:
        text = b""
    for field, what in ((b"MemAvailable:", "the machine's available memory"),
                        (b"MemTotal:", "the machine's memory")):
        value = _meminfo_field(text, field)
        if value is not None:
            return MemoryLimit(value, f"{what} ({field[:-1].decode()} in {_MEMINFO})")
    try:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        pages = -1
    if pages > 0:
        return MemoryLimit(pages, "the machine's memory (sysconf SC_PHYS_PAGES)")
    return MemoryLimit(_NO_LIMIT, "no measure of the machine's memory (no /proc/meminfo)")


def _meminfo_field(text: bytes, field: bytes) -> int | None:
    """``field``'s value in bytes (``/proc/meminfo`` writes kB), or None if absent."""
    start = text.find(field)
    if start < 0:
        return None
    end = text.find(b"\n", start)
    words = text[start + len(field): end if end >= 0 else None].split()
    try:
        value = int(words[0])
    except (IndexError, ValueError):
        return None
    unit = words[1].lower() if len(words) > 1 else b""
    return value * 1024 if unit == b"kb" else value


# -- the cgroup's files --------------------------------------------------------------------------


# (root, text of /proc/self/cgroup) -> levels, innermost first. Worked out again only when the
# process moves to another cgroup (or a test changes the root).
_cache: tuple[tuple[str, bytes], tuple[_Level, ...]] | None = None


def _cgroup_levels() -> tuple[_Level, ...]:
    """The memory cgroups whose limits bind this process: its own and its ancestors visible under
    the cgroup mount, innermost first; ``()`` where none is found."""
    global _cache
    root = _ROOT
    try:
        membership = _read(_join(root, "/proc/self/cgroup"))
    except OSError:
        return ()
    cached = _cache
    if cached is not None and cached[0] == (root, membership):
        return cached[1]
    levels = _find_levels(root, membership.decode("utf-8", "replace"))
    _cache = ((root, membership), levels)
    return levels


def _find_levels(root: str, membership: str) -> tuple[_Level, ...]:
    v1_path = v2_path = None
    for line in membership.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            v2_path = path
        elif "memory" in controllers.split(","):
            v1_path = path
    mounts = _cgroup_mounts(root)
    # The memory controller lives in one hierarchy only: v1's when /proc/self/cgroup names it
    # (a v2 hierarchy beside it, "hybrid" mode, then holds no memory controller).
    if v1_path is not None:
        return _levels_under(root, v1_path, mounts.get(1, []), 1)
    if v2_path is not None:
        return _levels_under(root, v2_path, mounts.get(2, []), 2)
    return ()


def _cgroup_mounts(root: str) -> dict[int, list[tuple[str, str]]]:
    """``{1: [(mount root, mount point)] of v1 memory hierarchies, 2: [...] of cgroup2}``, from
    ``/proc/self/mountinfo``; the usual places when it cannot be read."""
    mounts: dict[int, list[tuple[str, str]]] = {1: [], 2: []}
    try:
        with open(_join(root, "/proc/self/mountinfo"), encoding="utf-8",
                  errors="replace") as file:
            lines = file.read().splitlines()
    except OSError:
        return {1: [("/", "/sys/fs/cgroup/memory")], 2: [("/", "/sys/fs/cgroup")]}
    for line in lines:
        fields, separator, after = line.partition(" - ")
        parts = fields.split()
        kinds = after.split()
        if not separator or len(parts) < 5 or len(kinds) < 1:
            continue
        mount = (_unescape(parts[3]), _unescape(parts[4]))
        if kinds[0] == "cgroup2":
            mounts[2].append(mount)
        elif kinds[0] == "cgroup" and len(kinds) >= 3 and "memory" in kinds[2].split(","):
            mounts[1].append(mount)
    return mounts


def _levels_under(root: str, path: str, mounts: list[tuple[str, str]],
                  version: int) -> tuple[_Level, ...]:
    """The cgroup ``path`` and its ancestors up to the mount's top, innermost first, under the mount
    that shows ``path`` itself (else under the first mount: its top)."""
    names = ("memory.max", "memory.current") if version == 2 else (
        "memory.limit_in_bytes", "memory.usage_in_bytes")
    found = [place for mount_root, mount_point in mounts
             if (place := _directory_of(root, path, mount_root, mount_point)) is not None]
    if not found:
        return ()
    top, shown = next((place for place in found if place[1] is not None), found[0])
    directory = shown or top
    levels = []
    while True:
        limit = os.path.join(directory, names[0])
        if os.path.exists(limit):
            levels.append(_Level(limit, os.path.join(directory, names[1]),
                                 os.path.join(directory, "memory.stat"), version))
        if len(directory) <= len(top):
            return tuple(levels)
        directory = os.path.dirname(directory)


def _directory_of(root: str, path: str, mount_root: str,
                  mount_point: str) -> tuple[str, str | None] | None:
    """``(the mount's top, cgroup path's directory or None if the mount does not show it)`` for a
    mount of ``mount_root`` at ``mount_point``; None if the mount point is not there."""
    top = os.path.normpath(_join(root, mount_point))
    if not os.path.isdir(top):
        return None
    if mount_root == "/":
        relative = path
    elif path == mount_root or path.startswith(mount_root.rstrip("/") + "/"):
        relative = path[len(mount_root):]
    else:
        # A bind mount of another cgroup (a container without its own cgroup namespace shows its
        # own cgroup as the mount's root): the path may still be found as is below it.
        relative = path
    directory = os.path.normpath(_join(top, relative))
    if directory != top and not directory.startswith(top + "/"):
        return top, None  # outside the mount ("/.." in a cgroup namespace)
    return top, directory if os.path.isdir(directory) else None


# -- reading the numbers ------------------------------------------------------------------------


def _read_limit(path: str) -> int | None:
    """A limit file's bytes; None for "max", a value >= 2**62, or a file that cannot be read."""
    value = _read_int_or(path, None)
    if value is None or value >= _NO_LIMIT:
        return None
    return value


def _read_int_or(path: str, default: int | None) -> int | None:
    try:
        return int(_read(path).strip())
    except (OSError, ValueError):  # missing, unreadable, or "max"
        return default


_FILE_FIELDS = {
    1: (b"total_active_file", b"total_inactive_file"),  # hierarchical, like usage_in_bytes
    2: (b"active_file", b"inactive_file"),
}
_STAT_LINE = re.compile(rb"^(\w+) (\d+)$", re.MULTILINE)


def _file_cache(level: _Level) -> int:
    """The cgroup's page cache (active and inactive file pages): what the kernel reclaims before
    it fails an allocation. 0 when memory.stat cannot be read."""
    try:
        text = _read(level.stat)
    except OSError:
        return 0
    wanted = _FILE_FIELDS[level.version]
    fields = {name: int(value) for name, value in _STAT_LINE.findall(text) if name in wanted}
    if level.version == 1 and not fields:  # use_hierarchy=0 kernels write no totals
        fields = {name: int(value) for name, value in _STAT_LINE.findall(text)
                  if name in (b"active_file", b"inactive_file")}
    return sum(fields.values())


def _read(path: str) -> bytes:
    """The whole file, with the fewest system calls (``open()`` costs a few microseconds more)."""
    descriptor = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(descriptor, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(descriptor)


def _join(root: str, path: str) -> str:
    return os.path.join(root, path.lstrip("/")) if root != "/" else path


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes (``\\040``)."""
    if "\\" not in field:
        return field
    return re.sub(r"\\([0-7]{3})", lambda match: chr(int(match.group(1), 8)), field)
