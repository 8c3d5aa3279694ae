"""The documentation the code carries: every public name says what it is, every package its parts.

* Every name in the ``__all__`` of ``mploader``, ``mploader.integrations.nebula`` and
  ``mploader.integrations.nebula.pyg``, and every public method and property of those classes,
  has a docstring of its own: not an empty one, and not one inherited from torch or PyG (autodoc
  would show the base class's text, which describes another object).  A constant has an attribute
  docstring (a string right after it, or a ``#:`` comment) in the module that defines it.
* Every package's docstring names each module and subpackage it holds, as code (````name````,
  ````name/````, ````name.py```` or a ``:mod:`` reference): a prose word ("replies", "errors")
  does not count.

``make docs`` checks the first again (``docs/_ext/api_completeness.py``), for what the API page
documents.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPOSITORY = Path(__file__).resolve().parents[1]
PACKAGE = REPOSITORY / "mploader"
API_PAGE = REPOSITORY / "docs" / "reference" / "api.md"

# The definitions of the public API and of a docstring of its own, shared with the manual's
# extension (docs/_ext/api_completeness.py): one module, importable without Sphinx.
sys.path.insert(0, str(REPOSITORY / "docs" / "_ext"))
from mploader_public_api import (  # noqa: E402
    PUBLIC_MODULES,
    defining_module,
    own_docstring,
    public_members,
)

# Names in an __all__ that are another library's object, exported as is on purpose; the API page
# documents each by hand (a ``py:class`` directive), since its docstring is that library's.
REEXPORTED = {
    # torch's own class, so that isinstance() and torch.utils.data.get_worker_info() agree
    ("mploader", "WorkerInfo"): "torch.utils.data._utils.worker",
}


# -- every package names its modules ----------------------------------------------------------


def packages(folder: Path = PACKAGE, name: str = "mploader") -> list[tuple[str, Path]]:
    """``(dotted name, folder)`` of the package at ``folder`` and of every package below it."""
    found = [(name, folder)]
    for module in pkgutil.iter_modules([str(folder)]):
        if module.ispkg:
            found += packages(folder / module.name, f"{name}.{module.name}")
    return found


def held_modules(folder: Path) -> list[str]:
    """The bare names of the modules and subpackages directly in the package at ``folder``."""
    return sorted(module.name for module in pkgutil.iter_modules([str(folder)]))


_CODE = re.compile(r"``([^`]+)``|:mod:`~?([^`]+)`")


def named_modules(docstring: str) -> set[str]:
    """The module names a docstring writes as code: ``name``, ``name/``, ``name.py``,
    ``a.b.name``, :mod:`.name` (the last dotted part counts)."""
    named = set()
    for match in _CODE.finditer(docstring):
        text = (match.group(1) or match.group(2)).strip().removesuffix("/").removesuffix(".py")
        named.add(text.rsplit(".", 1)[-1])
    return named


def package_docstring(folder: Path) -> str:
    return ast.get_docstring(ast.parse((folder / "__init__.py").read_text())) or ""


@pytest.mark.parametrize("name, folder", packages(), ids=lambda value: str(value))
def test_package_docstring_names_every_module(name: str, folder: Path) -> None:
    missing = sorted(set(held_modules(folder)) - named_modules(package_docstring(folder)))
    assert not missing, (
        f"{name}'s docstring ({folder.relative_to(REPOSITORY)}/__init__.py) does not name "
        f"{missing}: add a line for each (``name``: what it holds)"
    )


def test_the_module_check_sees_a_violation() -> None:
    """The checker itself: a module named only in prose, or not at all, is missing."""
    docstring = "``loop`` reads tasks and replies; :mod:`.pool` and ``shm/``, ``channel.py``."
    assert named_modules(docstring) == {"loop", "pool", "shm", "channel"}
    assert "replies" not in named_modules(docstring)
    assert "worker" in held_modules(PACKAGE) and len(packages()) > 5


# -- every public name has a docstring of its own ---------------------------------------------


def public_module(name: str) -> ModuleType:
    if name.endswith(".pyg"):
        pytest.importorskip("torch_geometric")
    return importlib.import_module(name)


def attribute_docstring(module: str, name: str) -> str:
    """The documentation Sphinx reads for ``module``'s module-level ``name``."""
    source = importlib.import_module(module).__file__
    assert source is not None
    return attribute_docstring_in(Path(source).read_text(), name)


def attribute_docstring_in(text: str, name: str) -> str:
    """A string statement right after ``name``'s assignment in ``text``, or the ``#:`` comment at
    the end of its line or on the lines just before it; ``""`` if none."""
    lines = text.splitlines()
    body = ast.parse(text).body
    for index, node in enumerate(body):
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, ast.AnnAssign) else [])
        if not any(isinstance(target, ast.Name) and target.id == name for target in targets):
            continue
        after = body[index + 1] if index + 1 < len(body) else None
        if (isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)):
            return after.value.value.strip()
        _, _, trailing = lines[(node.end_lineno or node.lineno) - 1].partition("#:")
        comments = [trailing.strip()]
        line = node.lineno - 2
        while line >= 0 and lines[line].lstrip().startswith("#:"):
            comments.insert(0, lines[line].lstrip().removeprefix("#:").strip())
            line -= 1
        return " ".join(comment for comment in comments if comment)
    return ""


def undocumented(package: str) -> list[str]:
    module = public_module(package)
    missing = []
    for name in module.__all__:
        obj = getattr(module, name)
        where = f"{package}.{name}"
        if (package, name) in REEXPORTED:
            assert getattr(obj, "__module__", None) == REEXPORTED[package, name], where
            if f"py:class:: {name}" not in API_PAGE.read_text():
                missing.append(f"{where} (re-exported; the API page must describe it)")
            continue
        if not (inspect.isclass(obj) or callable(obj)):
            if not attribute_docstring(defining_module(package, name), name):
                missing.append(f"{where} (a constant: add a docstring after it)")
            continue
        assert obj.__module__.startswith("mploader"), f"{where} is {obj.__module__}'s"
        if not own_docstring(obj):
            missing.append(where)
        if inspect.isclass(obj):
            missing += [f"{where}.{member_name}"
                        for member_name, member in public_members(obj).items()
                        if not own_docstring(member)]
    return missing


@pytest.mark.parametrize("package", PUBLIC_MODULES)
def test_public_names_have_docstrings(package: str) -> None:
    missing = undocumented(package)
    assert not missing, f"no docstring of its own: {missing}"


def test_api_page_lists_every_public_name() -> None:
    """Each public name is an autosummary entry of docs/reference/api.md or described there by
    hand (the NebulaGraph errors once, under ``mploader``, which exports them too)."""
    page = API_PAGE.read_text()
    listed = set(re.findall(r"^ {3}(\w+)$", page, re.MULTILINE))
    listed |= set(re.findall(r"^\.\. py:\w+:: (\w+)", page, re.MULTILINE))
    missing = [f"{package}.{name}" for package in PUBLIC_MODULES
               for name in public_module(package).__all__ if name not in listed]
    assert not missing, f"not in {API_PAGE.relative_to(REPOSITORY)}: {missing}"


def test_the_docstring_check_sees_a_violation() -> None:
    """The checker itself: an override without a docstring has none of its own."""

    class Base:
        """Documented."""

        def run(self) -> None:
            """Documented."""

    class Child(Base):
        def run(self) -> None:
            pass

    assert own_docstring(Base) and own_docstring(Base.run)
    assert not own_docstring(Child) and not own_docstring(Child.run)
    assert list(public_members(Child)) == ["run"]
    source = ('A = 1\n"""What A is."""\nB = 2  #: What B is.\n'
              '#: What C is.\nC = 3\n# Not D.\nD = 4\n')
    assert [attribute_docstring_in(source, name) for name in "ABCDE"] == [
        "What A is.", "What B is.", "What C is.", "", ""]


def test_dataloader_docstring_lists_every_addition() -> None:
    """``mploader.DataLoader``'s docstring has one bullet per keyword it adds to torch's."""
    import torch.utils.data

    import mploader

    torch_parameters = inspect.signature(torch.utils.data.DataLoader.__init__).parameters
    additions = [name for name in inspect.signature(mploader.DataLoader.__init__).parameters
                 if name not in torch_parameters]
    assert "worker_threads" in additions
    bullets = re.findall(r"^\s*\* ``(\w+)``", mploader.DataLoader.__doc__ or "", re.MULTILINE)
    assert bullets == additions
