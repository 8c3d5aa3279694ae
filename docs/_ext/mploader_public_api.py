"""What counts as mploader's public API and its own documentation, without Sphinx.

Shared by the manual's extension (``api_completeness.py``, ``make docs``) and by
``tests/test_docstrings.py`` (which runs without Sphinx installed), so that both hold the code to
the same definition.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path
from typing import Any

PUBLIC_MODULES = ("mploader", "mploader.integrations.nebula", "mploader.integrations.nebula.pyg")

MEMBER_DESCRIPTORS = (staticmethod, classmethod, property)


def own_docstring(obj: Any) -> str:
    """The docstring ``obj`` carries itself (a class's own, not its base's); ``""`` if none."""
    if isinstance(obj, staticmethod | classmethod):
        obj = obj.__func__
    if inspect.isclass(obj):
        doc = vars(obj).get("__doc__")
    elif isinstance(obj, property):
        doc = obj.__doc__ or (obj.fget.__doc__ if obj.fget else None)
    else:
        doc = getattr(inspect.unwrap(obj), "__doc__", None)
    return doc.strip() if isinstance(doc, str) else ""


def public_members(cls: type) -> dict[str, Any]:
    """The methods and properties ``cls`` defines itself whose names do not start with ``_``
    (fields and enum members are values, documented by the class)."""
    return {
        name: member for name, member in vars(cls).items()
        if not name.startswith("_")
        and (inspect.isfunction(member) or isinstance(member, MEMBER_DESCRIPTORS))
    }


def defining_module(package: str, name: str) -> str:
    """The module ``package``'s ``__init__`` imports ``name`` from (``package`` if none)."""
    source = getattr(importlib.import_module(package), "__file__", None)
    if source is None:
        return package
    for node in ast.parse(Path(source).read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and any(
            alias.name == name and alias.asname is None for alias in node.names
        ):
            return node.module
    return package
