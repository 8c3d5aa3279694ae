"""Imports run one way through the package's layers (see README, "Layout").

iterator -> process -> worker -> channel; ``config``, ``errors`` and ``finalizers`` are leaves;
``monitor`` is a side service every layer may call and that imports none of them.  A module
outside these folders (the public face: ``loader``, ``_install``, ``__init__``, ``__main__``) may
import anything.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "mploader"

LEAVES = {"config", "errors", "finalizers"}
MAY_IMPORT = {
    "iterator": {"process", "worker", "channel", "monitor"} | LEAVES,
    "process": {"worker", "channel", "monitor"} | LEAVES,
    "worker": {"channel", "monitor"} | LEAVES,
    "channel": {"monitor"} | LEAVES,
    "monitor": LEAVES,
    "integrations": {"worker"} | LEAVES,
    "config": set(),
    "errors": set(),
    "finalizers": set(),
}


def layer_of(module: str) -> str | None:
    """The layer a dotted ``mploader.*`` name belongs to; None for the public face."""
    parts = module.split(".")
    if len(parts) < 2 or parts[1] not in MAY_IMPORT:
        return None
    return parts[1]


def imported_modules(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "mploader":
                found += [f"mploader.{alias.name}" for alias in node.names]
            elif node.module.startswith("mploader."):
                found.append(node.module)
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if alias.name.startswith("mploader.")]
    return found


MODULES = sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda path: str(path.relative_to(PACKAGE)))
def test_imports_run_one_way(path: Path) -> None:
    module = ".".join(("mploader", *path.relative_to(PACKAGE).with_suffix("").parts))
    layer = layer_of(module)
    if layer is None:
        return  # the public face may import every layer
    upward = [
        target for target in imported_modules(path)
        if (target_layer := layer_of(target)) != layer
        and target_layer not in MAY_IMPORT[layer]
    ]
    assert not upward, f"{module} ({layer}) imports against the layer order: {upward}"


def test_the_check_sees_a_violation(tmp_path: Path) -> None:
    """The checker itself: an upward import is found."""
    bad = tmp_path / "bad.py"
    bad.write_text("from mploader.iterator.multi import MultiProcessIterator\n")
    assert imported_modules(bad) == ["mploader.iterator.multi"]
    assert layer_of("mploader.iterator.multi") not in MAY_IMPORT["worker"]
