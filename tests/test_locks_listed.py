"""The manual's list of locks and direct finalizers stays true (issue 22).

Every lock the code makes (a ``threading`` lock or condition, a file lock, a thread pool and the
locks inside it) has a row in the table of ``docs/internals/locks.md``, by module and
name, and every row names a lock the code still makes.  A module that registers a finalizer run
where the collector runs (``weakref.finalize``, ``__del__``, a weakref callback) is one of those
that page lists as doing atomic steps only; any other goes through ``mploader.finalizers``.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "mploader"
MAKES_A_LOCK = re.compile(r"threading\.(Lock|RLock|Condition|Semaphore|BoundedSemaphore)\(")
# ``self._lock = threading.Lock()`` names the lock ``_lock``; a file lock is ``flock`` and a thread
# pool ``ThreadPoolExecutor``, as their rows name them
NAMED_LOCK = re.compile(
    r"^ *(?:self\.)?(\w+)(?:: [^=\n]+)? = threading\."
    r"(?:Lock|RLock|Condition|Semaphore|BoundedSemaphore)\("
    r"|\b(fcntl)\.flock\(|\b(ThreadPoolExecutor)\(",
    re.M,
)
ROW = re.compile(r"^\| `([\w/]+\.py)` `(?:\w+\.)?(\w+)`", re.M)
# multiprocessing's Finalize(obj, ...) runs when obj is collected; Finalize(None, ...) at exit only
DIRECT_FINALIZER = re.compile(
    r"weakref\.finalize\(|def __del__\(|weakref\.ref\([^,()]+,|\bFinalize\((?!None)"
)


def _section() -> str:
    return (ROOT / "docs" / "internals" / "locks.md").read_text()


def _modules_matching(pattern: re.Pattern[str]) -> set[str]:
    return {str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py")
            if pattern.search(path.read_text())}


def _locks_in_code() -> set[tuple[str, str]]:
    locks = set()
    for path in PACKAGE.rglob("*.py"):
        module = str(path.relative_to(PACKAGE))
        for match in NAMED_LOCK.finditer(path.read_text()):
            name = match.group(1) or match.group(3) or "flock"
            locks.add((module, name))
    return locks


def test_every_lock_is_listed() -> None:
    listed = set(ROW.findall(_section()))
    in_code = _locks_in_code()
    assert {module for module, _ in in_code} >= _modules_matching(MAKES_A_LOCK)
    assert in_code - listed == set(), "locks the table does not list"
    assert listed - in_code == set(), "rows for locks the code no longer makes"


def test_direct_finalizers_are_the_listed_ones() -> None:
    paragraph = _section().split("Finalizers that run where the collector runs", 1)[1]
    paragraph = paragraph.split("Signal handlers:", 1)[0]
    listed = set(re.findall(r"`([\w/]+\.py)`", paragraph))
    assert _modules_matching(DIRECT_FINALIZER) == listed
