"""Sphinx configuration for mploader's manual (``make docs``; CI builds it with ``-W -n``)."""

from __future__ import annotations

import sys
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPOSITORY))  # nebula_testing/ (the bundled server) is not in the wheel
sys.path.insert(0, str(REPOSITORY / "docs" / "_ext"))  # this manual's own extension

project = "mploader"
author = "the mploader developers"
copyright = "2026, the mploader developers"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "sphinx_copybutton",
    "api_completeness",  # docs/_ext: a public object without a docstring of its own is a warning
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build"]
templates_path = ["_templates"]

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

autosummary_generate = True
autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_format = "short"

# No intersphinx: the build machines reach package registries only, and a fetch that fails is a
# warning (an error under -W).  References into mploader are checked (-n, nitpicky); names from
# Python, torch and the other libraries stay plain text.
nitpick_ignore_regex = [
    (r"py:.*", r"(builtins\.)?(int|float|str|bytes|bool|object|type|dict|list|tuple|set|None"
               r"|BaseException|Exception|RuntimeError|ValueError|TypeError|OSError)"),
    (r"py:.*", r"(torch|numpy|np|nebula3|torch_geometric|multiprocessing|collections|typing"
               r"|types|threading|pathlib|os|io|enum|logging|socket|weakref|datetime"
               r"|dataclasses|concurrent|contextlib|abc|typing_extensions)(\..*)?"),
    (r"py:.*", r"(Any|Callable|Iterator|Iterable|Mapping|Sequence|Self|Literal|Optional|Union"
               r"|Generator|TypeVar|ParamSpec|T|T_co|Path|Tensor|Dataset|Sampler)"),
    # the type variables of mploader's generic classes (DataLoader[T_co], ProcessLocal[T])
    (r"py:.*", r"mploader(\.\w+)*\.(T|T_co)"),
]

# Names that signatures hold as unresolved strings (annotations under ``TYPE_CHECKING``, and
# class signatures, whose string annotations autodoc does not evaluate), each listed on purpose:
nitpick_ignore = [
    # nebula3-python's classes: NebulaHooks(config=), NebulaSession.execute() -> ResultSet.
    ("py:class", "Config"),
    ("py:class", "ResultSet"),
    # mploader's internal types that public signatures name; each docstring says what they are.
    ("py:class", "mploader._install.Installation"),  # install()'s context manager
    ("py:class", "PoolSettings"),  # SessionPool(settings): what NebulaHooks passes
    ("py:class", "mploader.integrations.nebula.pool._Member"),  # SessionPool.take/give_back
    ("py:class", "mploader.integrations.nebula.pyg.schema.KeptApart"),  # GraphSchema.kept_apart
    ("py:class", "NumNeighbors"),  # NebulaNeighborSampler(num_neighbors=): a list or a dict
    # The shared-memory budget's internals that public docstrings name (SharedMemoryConfig.
    # effective_budget(), SharedMemoryFullError.for_block): mploader.memory, a leaf module, and
    # the budget with its reason; the guide's shared-memory page says what they are.
    ("py:class", "mploader.config.BudgetChoice"),
    ("py:class", "mploader.memory.MemoryLimit"),
    ("py:func", "mploader.memory.job_memory"),
    ("py:func", "mploader.memory.available_memory"),
]

html_theme = "furo"
html_title = "mploader"
html_static_path: list[str] = []
