"""What the PyG stores and sampler raise for input the schema refuses.

Every one is raised before a statement that could change the space (or, for the sampler, any
``GO``) is sent, and its message names what was given, what is allowed and what exists.  Each is
an :class:`~mploader.MploaderError` mixed with the builtin type PyG and torch raise in its place
(``KeyError`` for a name PyG looks up, ``IndexError`` for an index torch refuses), so code written
against PyG's own stores keeps catching them.
"""

from __future__ import annotations

from mploader.errors import MploaderError


class StoreInputError(MploaderError):
    """Base: an argument the schema refuses; nothing was written."""


class UnknownNameError(StoreInputError, KeyError):
    """A node type, attribute or edge type the schema does not have (the message lists those it
    has).  A ``KeyError``, as PyG's stores raise, but printed as its message, unquoted."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class NodeIndexError(StoreInputError, IndexError):
    """An index or node id torch would refuse (its message first), or past a node type's count."""


class WriteDtypeError(StoreInputError, TypeError):
    """Values of a dtype the attribute cannot hold without changing them (floats into an INT)."""


class WriteShapeError(StoreInputError, ValueError):
    """Values whose shape is not the index's shape times the attribute's row (its width)."""


class SchemaConflictError(StoreInputError, ValueError):
    """Edge types whose stored edges cannot be told apart (the same edges, or node types whose
    vid ranges overlap)."""
