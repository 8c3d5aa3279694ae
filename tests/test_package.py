"""What ships: the wheel holds the loader and its NebulaGraph integration, nothing of the tests.

``import mploader`` and ``import mploader.integrations.nebula`` must work with only the runtime
dependencies: the check runs them in a fresh interpreter in which importing pytest, nebula3,
thrift or the repository's test server fails.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]

_BLOCK_TEST_TOOLING = """
import importlib.abc, sys
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"pytest", "_pytest", "nebula3", "thrift", "nebula_testing"}:
            raise ImportError(f"{name} is not a runtime dependency")
        return None
sys.meta_path.insert(0, Refuse())
import mploader, mploader.integrations.nebula
from mploader.integrations.nebula import NebulaFeatureStore, NebulaHooks
print(mploader.DataLoader.__name__, NebulaHooks.__name__, NebulaFeatureStore.__name__)
"""


def test_the_wheel_holds_the_loader_only(tmp_path: Path) -> None:
    source = tmp_path / "source"  # a copy: building writes build/ and *.egg-info beside the code
    # (not the virtual environments: a developer's .venv-torch-* hold gigabytes)
    shutil.copytree(REPOSITORY, source, ignore=shutil.ignore_patterns(
        ".git", ".venv*", "build", "_build", "*.egg-info", "__pycache__", ".*_cache"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path), str(source)],
        check=True, capture_output=True, timeout=300,
    )
    (wheel,) = tmp_path.glob("mploader-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    packages = {name.split("/")[0] for name in names if not name.startswith("mploader-")}
    assert packages == {"mploader"}, packages
    assert "mploader/integrations/nebula/hooks.py" in names
    assert "mploader/py.typed" in names
    for forbidden in ("nebula_server", "ngql", "pytest", "testing/", "conftest"):
        assert not [name for name in names if forbidden in name], forbidden


def test_imports_need_only_the_runtime_dependencies(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", _BLOCK_TEST_TOOLING], cwd=tmp_path,  # not the repository root
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["DataLoader", "NebulaHooks", "NebulaFeatureStore"]


def test_no_select_select_anywhere() -> None:
    """select(2) takes fd numbers below 1024 only; a training job often holds more fds than
    that (issue 10, item 4): waits use poll(2) or selectors, never ``select.select``."""
    offenders = [
        str(path.relative_to(REPOSITORY))
        for folder in ("mploader", "nebula_testing")
        for path in (REPOSITORY / folder).rglob("*.py")
        if "select.select(" in path.read_text()
    ]
    assert offenders == []
