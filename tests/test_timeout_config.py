"""A deadlocked test fails fast and shows every thread's stack (pyproject's pytest-timeout
settings): here, a test whose finalizer waits for a lock its own thread holds (issue 22's hang)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"

HANGS = '''
import gc
import threading
import weakref


def test_blocked_in_a_finalizer():
    lock = threading.Lock()

    class Garbage:
        pass

    garbage = Garbage()
    garbage.cycle = garbage
    weakref.finalize(garbage, lock.acquire)  # run by the collector with the lock held: forever
    del garbage
    with lock:
        gc.collect()
'''


def test_a_test_blocked_on_a_lock_in_a_finalizer_is_ended_with_stacks(tmp_path: Path) -> None:
    (tmp_path / "test_hangs.py").write_text(HANGS)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(PYPROJECT), "--rootdir", str(tmp_path),
         "-p", "no:cacheprovider", "-o", "timeout=1", "test_hangs.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "Timeout" in output, output
    assert "Stack of MainThread" in output, output  # every thread's stack is shown
    assert "in test_blocked_in_a_finalizer" in output, output
    assert "weakref.py" in output, output  # ...down to the finalizer that waits
