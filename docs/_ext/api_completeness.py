"""Sphinx extension: the API reference documents every public object, with its own words.

``make docs`` builds with ``-W``, so each warning here fails the build:

* an object autodoc documents (``mploader.*``) whose docstring is empty, or is only the one it
  inherits from a base class (torch's or PyG's text describes their object, not ours);
* a public method or property (no leading ``_``) defined by a documented class without a
  docstring of its own: autodoc would leave it out silently (no ``undoc-members``) or show the
  base class's text;
* a documented constant without an attribute docstring (a string right after it, or ``#:``).

Two repairs of what autodoc shows, for the public surface only:

* A constant re-exported by a package (``mploader.integrations.nebula.FEATURE_ENCODING``)
  gets the attribute docstring of the module that defines it; autodoc reads only the package's
  ``__init__`` and would show ``str``'s or ``int``'s docstring instead.
* "Bases:" lists public classes only: a private base (``PicklesWithoutInit``,
  ``_BatchInFetchThread``) is replaced by its own bases, and ``Generic[T]`` is left out.

``tests/test_docstrings.py`` checks the same for every name in the public ``__all__`` lists
without building the manual; both take their definitions from ``mploader_public_api.py``.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import typing
from typing import Any

from mploader_public_api import PUBLIC_MODULES, defining_module, own_docstring, public_members
from sphinx.application import Sphinx
from sphinx.errors import PycodeError
from sphinx.pycode import ModuleAnalyzer
from sphinx.util import logging

logger = logging.getLogger(__name__)

@functools.cache
def public_classes() -> frozenset[type]:
    """The classes the public ``__all__`` lists name."""
    found: set[type] = set()
    for module_name in PUBLIC_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:  # the pyg package without torch_geometric: nothing of it is shown
            continue
        found |= {obj for name in module.__all__
                  if inspect.isclass(obj := getattr(module, name))}
    return frozenset(found)


def attribute_docstring(module: str, name: str) -> list[str]:
    """The lines of module-level ``name``'s attribute docstring in ``module`` (``[]``: none)."""
    try:
        analyzer = ModuleAnalyzer.for_module(module)
        analyzer.analyze()
    except PycodeError:
        return []
    return list(analyzer.attr_docs.get(("", name), []))


def where(obj: Any) -> str | None:
    """``path:line`` of ``obj``'s source, for the warning; None if unknown."""
    try:
        target = obj.fget if isinstance(obj, property) else inspect.unwrap(obj)
        return f"{inspect.getsourcefile(target)}:{inspect.getsourcelines(target)[1]}"
    except (TypeError, OSError):
        return None


def check_docstring(app: Sphinx, what: str, name: str, obj: Any, options: Any,
                    lines: list[str]) -> None:
    """``autodoc-process-docstring``: warn about (and, for constants, repair) what is missing."""
    if not name.startswith("mploader"):
        return
    if what == "data":
        package, _, attribute = name.rpartition(".")
        inherited = inspect.getdoc(type(obj)) or ""
        if not lines or "\n".join(lines).strip() == inherited.strip():
            lines[:] = attribute_docstring(defining_module(package, attribute), attribute)
        if not any(line.strip() for line in lines):
            logger.warning("%s: a public constant without an attribute docstring (write a "
                           "string right after it, or a #: comment)", name,
                           type="mploader", subtype="undocumented")
        return
    if what in ("method", "property", "attribute"):
        return  # members are checked with their class, below, whether autodoc shows them or not
    if what == "module":
        missing = not any(line.strip() for line in lines)
    else:
        missing = not own_docstring(obj)
    if missing:
        logger.warning("%s: a public %s without a docstring of its own", name, what,
                       type="mploader", subtype="undocumented", location=where(obj))
    if inspect.isclass(obj):
        for member_name, member in public_members(obj).items():
            if not own_docstring(member):
                logger.warning(
                    "%s.%s: a public member without a docstring of its own (autodoc leaves it "
                    "out, or shows the base class's text)", name, member_name,
                    type="mploader", subtype="undocumented", location=where(member),
                )


def public_bases(app: Sphinx, name: str, obj: Any, options: Any, bases: list[Any]) -> None:
    """``autodoc-process-bases``: show public bases only (see the module docstring)."""
    public = public_classes()

    def shown(base: Any) -> list[Any]:
        if typing.get_origin(base) is typing.Generic:
            return []
        module = getattr(base, "__module__", "") or ""
        private = base.__name__.startswith("_") if inspect.isclass(base) else False
        if inspect.isclass(base) and module.startswith("mploader") and base not in public:
            private = True
        if private:
            return [shown_base for parent in base.__bases__ for shown_base in shown(parent)]
        return [base]

    kept = list(dict.fromkeys(shown_base for base in bases for shown_base in shown(base)))
    bases[:] = [base for base in kept if base is not object] or [object]


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("autodoc-process-docstring", check_docstring)
    app.connect("autodoc-process-bases", public_bases)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
