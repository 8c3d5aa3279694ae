"""Imports run one way through the package's layers (see the manual, docs/internals/layers.md).

iterator -> process -> worker -> channel; ``compat`` (the seam to torch's and CPython's private
API), ``config``, ``errors``, ``finalizers``, ``memory`` and ``polling`` are leaves (``config``
reads ``memory``, for the default budget);
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

LEAVES = {"compat", "config", "errors", "finalizers", "memory", "polling"}
MAY_IMPORT = {
    "iterator": {"process", "worker", "channel", "monitor"} | LEAVES,
    "process": {"worker", "channel", "monitor"} | LEAVES,
    "worker": {"channel", "monitor"} | LEAVES,
    "channel": {"monitor"} | LEAVES,
    "monitor": LEAVES,
    "integrations": {"worker"} | LEAVES,
    "config": {"memory"},
    "errors": set(),
    "finalizers": set(),
    "memory": set(),
    "polling": set(),
    "compat": set(),
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


# -- One seam for torch's and CPython's private API --------------------------------------------
#
# mploader runs on torch 2.6 to 2.14 and CPython 3.11 to 3.13.  What is private to them, or
# changed between those versions, is reached through ``mploader.compat`` only, so that a new
# version is adapted to in one place (see its docstring).

COMPAT = PACKAGE / "compat"
# Modules private to torch or CPython that are not under a ``_``-named package.
PRIVATE_MODULES = {"torch.multiprocessing.reductions", "multiprocessing.context"}
# Private attributes of torch's and CPython's objects that mploader reads or sets.  Read on
# ``self`` they are mploader's own (its iterators keep torch's names for code that reads them),
# and on ``super()`` they reach a base class's method.
PRIVATE_ATTRIBUTES = {
    "_auto_collation", "_index_sampler", "_IterableDataset_len_called", "_get_iterator",
    "_worker_info", "_generate_state", "_popen", "_bootstrap", "_utils", "_C",
    "_exit_function", "_run_exitfuncs", "_showwarnmsg", "_showwarnmsg_impl", "_showwarning_orig",
}


def _is_private_module(module: str) -> bool:
    parts = module.split(".")
    if parts[0] == "torch" and any(part.startswith("_") for part in parts[1:]):
        return True
    return module in PRIVATE_MODULES


def private_uses(path: Path) -> list[str]:
    """Where ``path`` imports or reads torch's or CPython's private API."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [f"line {node.lineno}: import {alias.name}" for alias in node.names
                      if _is_private_module(alias.name)]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            root = node.module.split(".")[0]
            private_names = [alias.name for alias in node.names if alias.name.startswith("_")
                             and root in ("torch", "multiprocessing")]
            if _is_private_module(node.module) or private_names:
                found.append(f"line {node.lineno}: from {node.module} import "
                             f"{', '.join(alias.name for alias in node.names)}")
        elif isinstance(node, ast.Attribute):
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id == "self":
                continue
            if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and (
                owner.func.id == "super"
            ):
                continue
            torch_private = (isinstance(owner, ast.Name) and owner.id == "torch"
                             and node.attr.startswith("_"))
            if torch_private or node.attr in PRIVATE_ATTRIBUTES:
                found.append(f"line {node.lineno}: .{node.attr}")
        elif isinstance(node, ast.ClassDef):
            found += [f"line {item.lineno}: def {item.name}" for item in node.body  # an override
                      if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
                      and item.name in _private_methods_of_torch_and_cpython()]
        elif isinstance(node, ast.Constant) and node.value in PRIVATE_ATTRIBUTES:
            found.append(f"line {node.lineno}: {node.value!r}")  # getattr(x, "_popen")
        elif _reaches_by_name(node):
            found.append(f"line {node.lineno}: {node.args[1].value!r}")  # type: ignore[attr-defined]
    return found


_BY_NAME = {"getattr", "hasattr", "setattr", "delattr"}


@functools.cache
def _private_names_of_torch_and_cpython() -> frozenset[str]:
    """The private names of torch's module, its ``DataLoader`` (class and instance) and
    multiprocessing's process objects: what a string in ``getattr(x, "_...")`` may reach."""
    import multiprocessing.process

    import torch.utils.data

    loader = torch.utils.data.DataLoader(range(1))
    owners = (torch, torch.utils.data.DataLoader, loader, multiprocessing.process.BaseProcess)
    names = {name for owner in owners for name in dir(owner)} | set(vars(loader))
    return frozenset(name for name in names if name.startswith("_")
                     and not name.startswith("__"))


@functools.cache
def _private_methods_of_torch_and_cpython() -> frozenset[str]:
    """The private names of torch's ``DataLoader`` and multiprocessing's process objects: a
    method of that name overrides theirs (``def _get_iterator``)."""
    import multiprocessing.process

    import torch.utils.data

    names = {name for owner in (torch.utils.data.DataLoader, multiprocessing.process.BaseProcess)
             for name in dir(owner)}
    return frozenset(name for name in names if name.startswith("_")
                     and not name.startswith("__"))


def _reaches_by_name(node: ast.AST) -> bool:
    """``getattr(torch, "_tensor_classes")``: a private name of torch's or CPython's written as
    a string, on anything but ``self`` (mploader's own private names are not the seam's)."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in _BY_NAME and len(node.args) >= 2):
        return False
    owner, name = node.args[0], node.args[1]
    if isinstance(owner, ast.Name) and owner.id == "self":
        return False
    return (isinstance(name, ast.Constant) and isinstance(name.value, str)
            and name.value in _private_names_of_torch_and_cpython()
            and name.value not in PRIVATE_ATTRIBUTES)  # those are found as constants


@pytest.mark.parametrize("path", [path for path in MODULES if COMPAT not in path.parents],
                         ids=lambda path: str(path.relative_to(PACKAGE)))
def test_private_api_only_through_compat(path: Path) -> None:
    uses = private_uses(path)
    assert not uses, f"{path.relative_to(PACKAGE)} uses private API outside mploader.compat: {uses}"


def test_the_private_api_check_sees_each_kind(tmp_path: Path) -> None:
    """The checker itself: each kind of private use is found, and a method's own is not."""
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import torch.utils.data._utils.collate\n"
        "from torch.utils.data._utils import worker\n"
        "from torch.multiprocessing.reductions import reduce_tensor\n"
        "from multiprocessing.context import set_spawning_popen\n"
        "from torch.utils.data.dataloader import _InfiniteConstantSampler\n"
        "torch._utils.cpu_count()\n"
        "loader._index_sampler\n"
        "getattr(process, '_popen', None)\n"
        "self._index_sampler\n"
        "super()._get_iterator()\n"
        "getattr(torch, '_tensor_classes', ())\n"
        "hasattr(loader, '_iterator')\n"
        "getattr(loader, '_latest_stats', None)\n"  # mploader's own
        "getattr(self, '_iterator', None)\n"
    )
    assert len(private_uses(bad)) == 10, private_uses(bad)


def test_compat_is_a_leaf() -> None:
    """The seam imports no other part of mploader, so every layer may use it."""
    for path in sorted(COMPAT.rglob("*.py")):
        assert [module for module in imported_modules(path)
                if not module.startswith("mploader.compat")] == [], path
