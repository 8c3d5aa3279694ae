"""The README's list of locks and direct finalizers stays true (issue 22).

Every module that makes a lock is named in the "Locks, finalizers and signal handlers" table, and
every module named there still makes one.  A module that registers a finalizer run where the
collector runs (``weakref.finalize``, ``__del__``, a weakref callback) is one of those the README
lists as doing atomic steps only; any other goes through ``mploader.finalizers``.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "mploader"
MAKES_A_LOCK = re.compile(r"threading\.(Lock|RLock|Condition|Semaphore|BoundedSemaphore)\(")
DIRECT_FINALIZER = re.compile(r"weakref\.finalize\(|def __del__\(|weakref\.ref\([^,()]+,")


def _section() -> str:
    readme = (ROOT / "README.md").read_text()
    start = readme.index("### Locks, finalizers and signal handlers")
    return readme[start:readme.index("\n## ", start)]


def _modules_matching(pattern: re.Pattern[str]) -> set[str]:
    return {str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py")
            if pattern.search(path.read_text())}


def test_every_lock_is_listed() -> None:
    listed = set(re.findall(r"^\| `([\w/]+\.py)` ", _section(), re.M))
    assert _modules_matching(MAKES_A_LOCK) == listed


def test_direct_finalizers_are_the_listed_ones() -> None:
    paragraph = _section().split("Finalizers that run where the collector runs", 1)[1]
    paragraph = paragraph.split("Signal handlers:", 1)[0]
    listed = set(re.findall(r"`([\w/]+\.py)`", paragraph))
    assert _modules_matching(DIRECT_FINALIZER) == listed
