"""CPython internals mploader relies on, each read in the 3.11 and 3.12 sources and run on both.

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
* The warning of a fork in a process with more than one thread (3.12 and later: a
  ``DeprecationWarning`` from ``os.fork``, which counts the process's threads, native ones
  included).  :func:`forking_workers` keeps it to the forks that would have warned without
  mploader's own threads (run on 3.12.1).
"""

from __future__ import annotations

import ctypes
import multiprocessing.context
import multiprocessing.reduction
import random
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psutil

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


# CPython 3.12's words (Modules/posixmodule.c, warn_about_fork_with_threads).
_FORK_WITH_THREADS_WARNING = (r"This process \(pid=\d+\) is multi-threaded, use of fork\(\) may "
                              r"lead to deadlocks in the child\.")
OWN_THREAD_PREFIX = "mploader-"  # every thread mploader starts is named so


@contextmanager
def forking_workers() -> Iterator[None]:
    """Around mploader's fork of its own workers: CPython 3.12+ warns of the fork only where it
    would have warned without mploader's threads in this process.

    mploader's threads of the main process (its finalizer thread, the ``top`` publisher) are
    made to be forked over (``docs/internals/locks.md``): a warning they alone caused would be one
    that torch's loader, forking from the same program, does not give.  Other threads, the
    program's own or native ones (an OpenMP pool), make the fork as risky as it is for torch's
    loader, and the warning stays.  ``warnings.catch_warnings`` changes the process's filters
    for the length of the fork: a warning another thread issues in those milliseconds is
    filtered as usual, except this one.
    """
    if sys.version_info < (3, 12) or _threads_but_ours() > 1:
        yield
        return
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_FORK_WITH_THREADS_WARNING,
                                category=DeprecationWarning)
        yield


def _threads_but_ours() -> int:
    """This process's threads (as the kernel counts them, as CPython does) but mploader's."""
    try:
        threads = psutil.Process().num_threads()  # the kernel's count, as CPython reads it
    except psutil.Error:
        threads = threading.active_count()
    ours = sum(thread.name.startswith(OWN_THREAD_PREFIX) for thread in threading.enumerate())
    return threads - ours
