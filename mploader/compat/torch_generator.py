"""Reading torch's default CPU generator in place: a layout of torch's C++ objects.

``mploader.worker.rng`` notices whether a dataset drew from torch's global generator by comparing a
fingerprint before and after.  ``torch.get_rng_state()`` gives a correct one for every torch (a
5 KB copy, about 0.8 us).  The fast one (about 0.07 us) reads the generator's MT19937 engine and
its cached normal samples where they live in memory, which is torch's private layout
(``CPUGeneratorImpl``: the engine's ``uint32`` words after 20 bytes of seed, ``left``,
``seeded`` and ``next``, then the float and double normal caches), the same in every version
2.6-2.14.  It is found, not assumed: the engine's words, as ``get_state()`` gives them, are
looked for near the implementation a ``torch.Generator`` points to, read through
``/proc/self/mem`` (an unmapped address reads as an error there, never a crash), and the reader
is kept only if draws of each kind change it.

:func:`engine_reader` returns ``None`` wherever any of this fails (another layout in a future
torch, no ``/proc``): the caller then uses :func:`state_bytes`, the documented ``get_state()``.
The fallback is explicit and tested (``tests/resume/test_rng_watch.py``).
"""

from __future__ import annotations

import array
import ctypes
from collections.abc import Callable
from typing import Any

import torch

from mploader.compat.mersenne import MT_WORDS  # read here by mploader.worker.rng

_default_generator = torch.default_generator

STATE_BYTES = _default_generator.get_state().numel()
_StateArray = ctypes.c_char * STATE_BYTES  # the array type made once, not per call (measured)


def state_bytes() -> bytes:
    """torch's global generator state as bytes: what ``torch.get_rng_state()`` returns, read
    through a ctypes array (``ctypes.string_at`` costs a microsecond more per call)."""
    state = _default_generator.get_state()  # kept alive while its bytes are read
    return _StateArray.from_address(state.data_ptr()).raw


# get_state()'s layout for the CPU generator (CPUGeneratorImplState, 2.6-2.14): uint64 seed,
# int32 left, int32 seeded, uint64 next, then the 624 engine words widened to uint64.
_STATE_WORDS_AT = 24
# In memory the engine keeps them as uint32, after its seed, left, seeded and next fields
# (20 bytes); the generator's cached float and double normal samples (optionals) follow them.
_ENGINE_HEAD_BYTES = 20
_NORMAL_CACHE_BYTES = 40
_SEARCHED_BYTES = 8192  # how far from the implementation's address the engine is looked for


def engine_reader(watched_words: int) -> Callable[[], Any] | None:
    """A reader of the default generator's engine position, first ``watched_words`` words and
    normal-sample cache, in place; ``None`` where it cannot be found and verified."""
    try:
        address = _engine_words_address()
    except (OSError, ValueError):
        return None
    if address is None:
        return None
    head = (ctypes.c_char * (_ENGINE_HEAD_BYTES + watched_words * 4)).from_address(
        address - _ENGINE_HEAD_BYTES)  # read in place, made once
    normal_cache = (ctypes.c_char * _NORMAL_CACHE_BYTES).from_address(address + MT_WORDS * 4)
    reader = lambda: (head.raw, normal_cache.raw)  # noqa: E731
    return reader if _draws_change(reader) else None


def _draws_change(reader: Callable[[], Any]) -> bool:
    """Whether a uniform draw, a normal draw and a cached normal sample each change ``reader``."""
    saved = _default_generator.get_state()
    try:
        changes = []
        for draw in (torch.rand, torch.randn, torch.randn):  # the last takes a cached sample
            before = reader()
            draw(1)
            changes.append(reader() != before)
    finally:
        _default_generator.set_state(saved)
    return all(changes)


def _engine_words_address() -> int | None:
    """Where the default generator's 624 engine words are, found by their value next to the
    implementation a ``torch.Generator`` points to (its first field after the object header)."""
    implementation = ctypes.c_void_p.from_address(
        id(_default_generator) + object.__basicsize__).value
    if not implementation:
        return None
    state = bytes(_default_generator.get_state().numpy())
    widened = array.array("Q", state[_STATE_WORDS_AT:_STATE_WORDS_AT + MT_WORDS * 8])
    needle = array.array("I", widened[:16]).tobytes()
    with open("/proc/self/mem", "rb", buffering=0) as memory:  # EIO, not SIGSEGV, if unmapped
        memory.seek(implementation)
        nearby = memory.read(_SEARCHED_BYTES)
    offset = nearby.find(needle)
    if offset < _ENGINE_HEAD_BYTES or offset + MT_WORDS * 4 + _NORMAL_CACHE_BYTES > len(nearby):
        return None  # not found, or the window read in place would reach past what was read
    return implementation + offset
