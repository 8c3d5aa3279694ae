"""Imports run one way through the package's layers (see README, "Layout").

iterator -> process -> worker -> channel; ``config``, ``errors`` and ``finalizers`` are leaves;
``monitor`` is a side service every layer may call and that imports none of them.  A module
outside these folders (the public face: ``loader``, ``_install``, ``__init__``, ``__main__``) may
import anything.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Callable
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "mploader"

LEAVES = {"config", "errors", "finalizers", "polling"}
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
    "polling": set(),
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


# -- Calls go down the layers; data comes back up ---------------------------------------------
#
# The rule: no function of a layer is handed a callable of a layer above it (a bound method or a
# function defined there), as an argument or a keyword.  A lower layer that needs something from
# above returns it or queues it as data, which the upper layer drains.  ``monitor`` is a side
# service: it is handed no callable of any other layer.  The check is dynamic, so it sees what
# static imports cannot (a bound method passed through a constructor): a profile hook watches
# every call into the package while a loader runs a representative life in the main process
# (start, iterate, stats(), state_dict(), a worker crash and restart, shutdown).

RANK = {"iterator": 4, "process": 3, "worker": 2, "channel": 1}


@functools.cache
def _layer_of_code(filename: str) -> str | None:
    path = Path(filename).resolve()
    if PACKAGE not in path.parents:
        return None
    parts = path.relative_to(PACKAGE).parts
    if len(parts) < 2:
        return "face"  # loader.py, _install.py, config.py, errors.py
    return parts[0]


def _layer_of_callable(value: object) -> str | None:
    import types

    if isinstance(value, types.MethodType):
        module = getattr(type(value.__self__), "__module__", "") or ""
    elif isinstance(value, types.FunctionType):
        module = value.__module__ or ""
    else:
        return None
    if not module.startswith("mploader."):
        return None
    return layer_of(module) or "face"


def _layer_of_instance(value: object) -> str | None:
    module = getattr(type(value), "__module__", "") or ""
    if not module.startswith("mploader."):
        return None
    return layer_of(module) or "face"


def _is_upward(callee: str, passed: str) -> bool:
    if callee == passed or callee in ("face", "integrations", "config", "errors"):
        return False
    if callee == "monitor":
        return True  # the side service calls nobody back
    return passed == "face" or RANK.get(passed, -1) > RANK.get(callee, 99)


def find_upward_callables(run: Callable[[], None]) -> list[str]:
    import sys
    import threading

    found: set[str] = set()

    def profile(frame, event, arg):
        if event != "call":
            return
        callee = _layer_of_code(frame.f_code.co_filename)
        if callee is None:
            return
        code = frame.f_code
        count = code.co_argcount + code.co_kwonlyargcount
        for name in code.co_varnames[:count]:
            value = frame.f_locals.get(name)
            passed = _layer_of_callable(value)
            if passed is None and callee == "monitor" and name != "self":
                # nor an object of another layer, whose methods it could call back
                passed = _layer_of_instance(value)
                if passed in ("monitor", "config", "errors", "channel"):
                    passed = None  # its own records, and the channel's statistics
            if passed is not None and _is_upward(callee, passed):
                found.add(f"{code.co_qualname} ({callee}) was handed {name}="
                          f"{type(value).__qualname__} ({passed})")

    sys.setprofile(profile)
    threading.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
    return sorted(found)


def _a_loader_life(marker: Path) -> None:
    import torch

    import mploader
    from tests.lifecycle.test_restarts import KillOnce

    loader = mploader.DataLoader(KillOnce(str(marker), at=9), batch_size=4, num_workers=2,
                                 multiprocessing_context="fork", max_worker_restarts=1,
                                 persistent_workers=True, trace=str(marker) + ".json")
    for _epoch in range(2):
        for step, batch in enumerate(loader):
            assert isinstance(batch, torch.Tensor)
            if step == 1:
                str(loader.stats())
                loader.state_dict()
    del loader


def test_no_layer_is_handed_a_callable_of_a_layer_above(tmp_path: Path) -> None:
    assert find_upward_callables(lambda: _a_loader_life(tmp_path / "killed")) == []


def test_the_call_check_sees_a_callback_handed_down() -> None:
    """The checker itself: a bound method of the iterator layer handed to the monitor."""
    from mploader.iterator.task_table import TaskTable
    from mploader.monitor.stats import count_of

    table = TaskTable(in_order=True)
    found = find_upward_callables(lambda: count_of(table.pending_count, "x"))  # type: ignore[arg-type]
    assert len(found) == 1 and "count_of (monitor)" in found[0] and "(iterator)" in found[0]
