"""CPython internals mploader relies on, each read in the 3.11 and 3.12 sources (run on 3.11).

* multiprocessing's "spawning Popen" slot (``multiprocessing.context.set_spawning_popen``, 3.4
  and later): while it is set, objects that may only travel to a child being started (a ``Lock``,
  ``Queue``, ``Value``...) pickle for that child, handing their file descriptors to it.  The
  zygote sets it while it pickles a worker's spec (``mploader.process.zygote``).
* ``BaseProcess._bootstrap()`` (3.8 and later: one optional ``parent_sentinel`` argument): runs a
  ``Process`` object's target in the current process, with multiprocessing's own start-up and
  exit handling, as a forked child does.  The zygote's forked workers run through it.
* ``BaseProcess._popen``: the ``Popen`` of a started process, whose ``poll`` mploader serializes
  (``mploader.process.group.serialize_exit_polls``).
* ``multiprocessing.reduction.DupFd`` (3.4 and later): a descriptor pickled for the child being
  started, through the spawning ``Popen``; shared-memory blocks handed to a new worker travel so
  (``mploader.channel.shm.handover``).
* ``random.Random``'s C struct (``RandomObject`` in ``Modules/_randommodule.c``, 3.11 and 3.12):
  after the object header an ``int index`` and ``uint32_t state[624]``, read in place by the
  resume state's fingerprint (``mploader.worker.rng``).  :func:`random_words_reader` returns
  ``None`` where the type is too small to hold them; its caller also verifies it by drawing.
"""

from __future__ import annotations

import ctypes
import multiprocessing.context
import multiprocessing.reduction
import random
from collections.abc import Callable
from typing import Any

_MT_WORDS = 624


def set_spawning_popen(popen: Any) -> None:
    """Pickle for a child being started by ``popen`` (``None``: for no child)."""
    multiprocessing.context.set_spawning_popen(popen)  # type: ignore[attr-defined]


def run_process_here(process: Any) -> int:
    """Run ``process``'s target in this (freshly forked) process; its exit code."""
    return process._bootstrap()  # type: ignore[no-any-return]


def popen_of(process: Any) -> Any:
    """The ``Popen`` of a started ``multiprocessing`` process, or ``None``."""
    return getattr(process, "_popen", None)


def random_words_reader(generator: random.Random, watched_words: int) -> Callable[[], Any] | None:
    """A reader of ``generator``'s position and first ``watched_words`` state words, in place,
    with its cached ``gauss_next``; ``None`` where the struct is not the expected one."""
    if type(generator).__basicsize__ < object.__basicsize__ + 4 + _MT_WORDS * 4:
        return None
    address = id(generator) + object.__basicsize__  # RandomObject: PyObject_HEAD, index, state
    words = (ctypes.c_char * (4 + watched_words * 4)).from_address(address)
    return lambda: (words.raw, generator.gauss_next)  # type: ignore[attr-defined]


def descriptor_for_child(descriptor: int) -> Any:
    """``descriptor``, pickled for the child being started (spawn or forkserver, or mploader's
    zygote): ``multiprocessing.reduction.DupFd`` duplicates it for that child through the
    spawning ``Popen``; unpickled there, ``.detach()`` gives the child's descriptor."""
    return multiprocessing.reduction.DupFd(descriptor)  # type: ignore[attr-defined]
