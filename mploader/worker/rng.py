"""The three global random generators a dataset draws from: capture, restore, and notice change.

A dataset's random augmentations draw from torch's, numpy's and Python's global generators inside
a worker.  To resume with exactly the draws an uninterrupted run makes, a worker sends its
generators' state with the batch it belongs to (see ``mploader.worker.resume``).  A full capture
costs about 50 us (numpy's ``get_state`` builds a dict, Python's ``getstate`` a 625-int tuple),
too much for every batch of a fast loader, so :class:`RngWatch` first compares cheap fingerprints
(about 1 us in all) and captures only when a generator moved since the last capture:

* torch: the default CPU generator's MT19937 engine and its cached normal samples, read in place
  (about 0.07 us), a layout of torch's found and verified once per process
  (:mod:`mploader.compat.torch_generator`).  Where that fails, the bytes of ``get_state()`` are
  the fingerprint (about 0.8 us: a 5 KB tensor).
* numpy: the raw ``key``/``pos`` words of the global MT19937, read through the bit generator's
  public ctypes ``state_address``.  Legacy ``RandomState`` also caches one Gaussian outside that
  struct; while a capture shows a cached Gaussian, every later check captures in full.
* Python: the ``index``/``state`` words of the global ``random.Random`` object, read at its
  C struct's offset (:mod:`mploader.compat.cpython`), plus its ``gauss_next``.

Each fingerprint is verified once per process (a draw must change it; for numpy and Python,
restoring the state must bring it back); where that fails, the watch falls back to full captures
(torch: to ``get_state()``'s bytes).  A fingerprint may change without a draw (torch's leaves a
spent normal sample's bytes behind after a restore): that costs one capture, never a missed draw.

States travel as :class:`RngState` (bytes, small ints): cheap to pickle.  ``to_plain`` and
``from_plain`` convert to and from the values of a ``state_dict()``: base64 strings and numbers,
so that a state goes through ``json.dumps`` as well as ``torch.save``.
"""

from __future__ import annotations

import array
import base64
import ctypes
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from mploader.compat import cpython, torch_generator

try:
    import numpy as np
except ModuleNotFoundError:  # pragma: no cover - numpy is a dependency, optional for torch
    np = None  # type: ignore[assignment]

# A fingerprint reads a Mersenne Twister's position and its first words, not all 624: each draw
# moves the position, and a draw that brings it back round (624 words) regenerates every word.
# Reading 2.5 KB three times a batch (cold, between two fetches) was most of what state tracking
# cost a small batch in its worker.
_WATCHED_WORDS = 8


@dataclass(slots=True)
class RngState:
    """torch's, numpy's and Python's global generator states, compactly."""

    torch: bytes
    numpy: tuple[bytes, int, int, float] | None  # key words, pos, has_gauss, cached gaussian
    python: tuple[int, bytes, float | None]  # version, 625 words (state + index), gauss_next

    def to_plain(self) -> dict[str, Any]:
        """The state as JSON-safe values: the raw words in base64, the rest as numbers."""
        plain: dict[str, Any] = {
            "torch": _b64(self.torch),
            "python": {"version": self.python[0], "words": _b64(self.python[1]),
                       "gauss_next": self.python[2]},
            "numpy": None,
        }
        if self.numpy is not None:
            key, pos, has_gauss, gauss = self.numpy
            plain["numpy"] = {"key": _b64(key), "pos": pos, "has_gauss": has_gauss,
                              "gauss": gauss}
        return plain

    @staticmethod
    def from_plain(plain: dict[str, Any]) -> RngState:
        numpy_state = None
        if plain["numpy"] is not None:
            entry = plain["numpy"]
            numpy_state = (_unb64(entry["key"]), int(entry["pos"]), int(entry["has_gauss"]),
                           float(entry["gauss"]))
        python = plain["python"]
        gauss_next = python["gauss_next"]
        return RngState(
            torch=_unb64(plain["torch"]),
            numpy=numpy_state,
            python=(int(python["version"]), _unb64(python["words"]),
                    None if gauss_next is None else float(gauss_next)),
        )


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def _unb64(text: str) -> bytes:
    if not isinstance(text, str):
        raise TypeError(f"a generator state in a DataLoader state is a base64 string, not a "
                        f"{type(text).__name__}; the state was not made by this mploader version")
    return base64.b64decode(text.encode("ascii"), validate=True)


def capture() -> RngState:
    """The full state of the three global generators of this process."""
    return RngState(torch=torch_generator.state_bytes(), numpy=_numpy_state(),
                    python=_python_state())


def restore(state: RngState) -> None:
    """Put the three global generators of this process in ``state``."""
    torch.set_rng_state(torch.frombuffer(bytearray(state.torch), dtype=torch.uint8))
    if state.numpy is not None and np is not None:
        key, pos, has_gauss, gauss = state.numpy
        np.random.set_state(("MT19937", np.frombuffer(key, dtype=np.uint32).copy(), pos,
                             has_gauss, gauss))
    version, words, gauss_next = state.python
    random.setstate((version, tuple(array.array("I", words)), gauss_next))


def _numpy_state() -> tuple[bytes, int, int, float] | None:
    if np is None:
        return None
    state: Any = np.random.get_state(legacy=True)
    _name, key, pos, has_gauss, gauss = state
    return (key.astype(np.uint32).tobytes(), int(pos), int(has_gauss), float(gauss))


def _python_state() -> tuple[int, bytes, float | None]:
    version, words, gauss_next = random.getstate()
    return (version, array.array("I", words).tobytes(), gauss_next)


class RngWatch:
    """Says whether the global generators moved since the last capture, cheaply."""

    def __init__(self) -> None:
        # Without a verified fingerprint, one that never matches: every check captures in full.
        self._numpy_print = _verified(_numpy_fingerprint(), _numpy_draw) or object
        self._python_print = _verified(_python_fingerprint(), _python_draw) or object
        self._torch_print = (torch_generator.engine_reader(_WATCHED_WORDS)
                             or torch_generator.state_bytes)
        self._last_torch: bytes | None = None
        self._last_numpy: Any = None
        self._last_python: Any = None
        self._numpy_gauss_cached = False

    def capture_if_changed(self) -> RngState | None:
        """The full state when any generator moved since the previous call, else ``None``.
        The first call always captures.  (The hot path of every batch: kept to four calls.)"""
        torch_now = self._torch_print()
        if (
            torch_now == self._last_torch
            and not self._numpy_gauss_cached
            and (numpy_now := self._numpy_print()) == self._last_numpy
            and (python_now := self._python_print()) == self._last_python
        ):
            return None
        numpy_now, python_now = self._numpy_print(), self._python_print()
        state = capture()
        self._numpy_gauss_cached = state.numpy is not None and state.numpy[2] != 0
        self._last_torch, self._last_numpy, self._last_python = torch_now, numpy_now, python_now
        return state


def _numpy_fingerprint() -> Callable[[], Any] | None:
    if np is None:
        return None
    try:
        address = np.random.get_bit_generator().ctypes.state_address  # type: ignore[attr-defined]
    except (AttributeError, TypeError):
        return None
    if not isinstance(address, int):
        return None
    words = (ctypes.c_char * (_WATCHED_WORDS * 4)).from_address(address)  # read in place
    # pos, after key[624]
    position = ctypes.c_int.from_address(address + torch_generator.MT_WORDS * 4)
    return lambda: (words.raw, position.value)


def _python_fingerprint() -> Callable[[], Any] | None:
    generator: Any = random.random.__self__  # type: ignore[attr-defined]  # the global Random
    return cpython.random_words_reader(generator, _WATCHED_WORDS)


def _numpy_draw() -> None:
    if np is not None:
        np.random.random()


def _python_draw() -> None:
    random.random()


def _verified(fingerprint: Callable[[], Any] | None,
              draw: Callable[[], None]) -> Callable[[], Any] | None:
    """``fingerprint`` if a draw changes it and a restore brings it back, else ``None``."""
    if fingerprint is None:
        return None
    saved = capture()
    try:
        before = fingerprint()
        draw()
        after = fingerprint()
    finally:
        restore(saved)
    if before == after or fingerprint() != before:
        return None
    return fingerprint
