"""Checking a loaded state's shape whole, before any of it is used.

A state goes through files, JSON and hands: one that was truncated or edited must be refused by
``load_state_dict`` with a ``ValueError`` naming the key and what it holds, not fail later with a
bare ``KeyError`` (or, worse, at the next ``iter()``, half-applied).  The shapes themselves are
the layout's (``mploader.iterator.resume_format``); what a dataset's or sampler's own
``state_dict()`` put in a state is theirs and is not checked (:data:`ANYTHING`).
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Maybe:
    """``None`` or ``shape``."""

    shape: Any


@dataclass(frozen=True)
class ListOf:
    item: Any


@dataclass(frozen=True)
class OneOf:
    values: tuple[Any, ...]


class Base64:
    """A string of base64 (a generator's raw state)."""


ANYTHING = object()  # a dataset's or sampler's own state

_NAMES = {int: "an int", float: "a number", bool: "a bool", str: "a string", dict: "a dict",
          list: "a list", Base64: "a base64 string"}


def check_shape(value: Any, shape: Any, where: str) -> None:
    """Raise a ``ValueError`` naming the first key under ``where`` that is missing or holds a
    value of the wrong kind; return if ``value`` has ``shape``."""
    if shape is ANYTHING:
        return
    if isinstance(shape, Maybe):
        if value is None:
            return
        shape = shape.shape
    if isinstance(shape, dict):
        _check_kind(value, dict, where)
        for key, inner in shape.items():
            if key not in value:
                raise ValueError(
                    f"load_state_dict: {where} has no {key!r}; the state was truncated, or made "
                    "by another version"
                )
            check_shape(value[key], inner, f"{where}[{key!r}]")
    elif isinstance(shape, ListOf):
        _check_kind(value, list, where)
        for position, item in enumerate(value):
            check_shape(item, shape.item, f"{where}[{position}]")
    elif isinstance(shape, OneOf):
        if value not in shape.values:
            raise ValueError(f"load_state_dict: {where} is {value!r}, expected one of "
                             f"{', '.join(map(repr, shape.values))}; the state was edited")
    elif shape is Base64:
        _check_kind(value, str, where, Base64)
        try:
            base64.b64decode(value.encode("ascii"), validate=True)
        except (UnicodeEncodeError, binascii.Error):
            _refuse(value, where, Base64)
    else:
        _check_kind(value, shape, where)


def _check_kind(value: Any, kind: type, where: str, named: type | None = None) -> None:
    if isinstance(value, bool) and kind is not bool:  # True is an int to Python, not here
        _refuse(value, where, named or kind)
    if not isinstance(value, (int, float) if kind is float else kind):
        _refuse(value, where, named or kind)


def _refuse(value: Any, where: str, kind: type) -> None:
    raise ValueError(
        f"load_state_dict: {where} is {value!r:.80} ({type(value).__name__}), expected "
        f"{_NAMES[kind]}; the state was edited, or made by another version"
    )
