"""CPython internals mploader relies on, each read in the 3.11, 3.12 and 3.13 sources and run on
all three (3.11.7, 3.12.1, 3.13.0).  Each item names the versions it serves.

* multiprocessing's "spawning Popen" slot (``multiprocessing.context.set_spawning_popen``, 3.4
  and later, unchanged in 3.13): while it is set, objects that may only travel to a child being
  started (a ``Lock``, ``Queue``, ``Value``...) pickle for that child, handing their file
  descriptors to it.  What the reductions ask of that ``Popen`` (3.11 to 3.13): a
  ``duplicate_for_child(fd)`` that returns the number the child will know the descriptor by,
  and a ``DupFd`` class built from that number, whose ``detach()`` in the child gives the
  descriptor.  The zygote stands in for it while it pickles a worker's spec
  (:func:`pickling_for_child`, ``mploader.process.zygote``).
* ``BaseProcess._bootstrap()`` (3.8 and later: one optional ``parent_sentinel`` argument): runs a
  ``Process`` object's target in the current process, with multiprocessing's own start-up and
  exit handling, as a forked child does.  The zygote's forked workers run through it
  (:func:`run_process_here`).  Up to 3.12 it ends by running multiprocessing's exit function
  (``util._exit_function``: the process's ``Finalize`` callbacks, its children joined); 3.13
  moved that out to its callers (``popen_fork``, ``forkserver``), which make it the forked
  child's only ``atexit`` handler and run the ``atexit`` handlers before ``os._exit``: one
  branch each.
* ``BaseProcess._popen``: the ``Popen`` of a started process, and its ``poll(flag)`` (a
  ``waitpid`` with ``flag``, then the status recorded) and ``sentinel``; 3.11 to 3.13.
  :func:`serialize_exit_polls` makes the polls of a fork ``Popen`` one thread at a time.
* ``multiprocessing.reduction.DupFd`` (3.4 and later, unchanged in 3.13): a descriptor pickled
  for the child being started, through the spawning ``Popen``; shared-memory blocks handed to a
  new worker travel so (``mploader.channel.shm.handover``).
* ``random.Random``'s C struct (``RandomObject`` in ``Modules/_randommodule.c``, 3.11, 3.12 and
  3.13): after the object header an ``int index`` and ``uint32_t state[624]``, read in place by
  the resume state's fingerprint (``mploader.worker.rng``).  :func:`random_words_reader` returns
  ``None`` where the type is too small to hold them; its caller also verifies it by drawing.
  Checked on 3.11.7, 3.12.1 and 3.13.0 against ``getstate()`` word for word.
* The warning of a fork in a process with more than one thread (3.12 and 3.13, the same words:
  a ``DeprecationWarning`` from ``os.fork``, issued in the parent after the fork, from the
  kernel's count of the process's threads, native ones included).  :func:`forking_workers`
  keeps it to the forks that would have warned without mploader's own threads.
* Pickling errors: mploader raises the pickler's own error for a batch that does not pickle,
  unchanged; its words differ between versions (3.11 and 3.12 "Can't pickle local object ...",
  3.13 "Can't get local object ...") and nothing in mploader reads them.
"""

from __future__ import annotations

import atexit
import ctypes
import multiprocessing.connection
import multiprocessing.context
import multiprocessing.reduction
import multiprocessing.util
import os
import random
import re
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from mploader.compat.mersenne import MT_WORDS


class _SpawningPopen:
    """What multiprocessing's reductions ask of the Popen of a child being started."""

    def __init__(self, duplicate: Callable[[int], int], fd_in_child: type) -> None:
        self._duplicate = duplicate
        self.DupFd = fd_in_child

    def duplicate_for_child(self, fd: int) -> int:
        return self._duplicate(fd)


@contextmanager
def pickling_for_child(duplicate: Callable[[int], int], fd_in_child: type) -> Iterator[None]:
    """Within it, what pickles for a child being started hands its descriptors over through
    ``duplicate(fd)`` (the number the child will know it by), and a descriptor pickled with
    :func:`descriptor_for_child` is ``fd_in_child(number)`` there (its ``detach()`` gives it)."""
    popen: Any = _SpawningPopen(duplicate, fd_in_child)
    multiprocessing.context.set_spawning_popen(popen)  # type: ignore[attr-defined]
    try:
        yield
    finally:
        multiprocessing.context.set_spawning_popen(None)  # type: ignore[attr-defined]


def run_process_here(process: Any) -> int:
    """Run ``process``'s target in this (freshly forked) process, with multiprocessing's exit
    handling as a child forked by multiprocessing gets it; its exit code (for ``os._exit``)."""
    if sys.version_info < (3, 13):  # 3.11, 3.12: _bootstrap runs util._exit_function itself
        return process._bootstrap()  # type: ignore[no-any-return]
    # 3.13: as popen_fork.Popen._launch and forkserver's child do around _bootstrap
    atexit._clear()  # type: ignore[attr-defined]
    atexit.register(multiprocessing.util._exit_function)  # type: ignore[attr-defined]
    code = 1
    try:
        code = process._bootstrap()
    finally:
        atexit._run_exitfuncs()  # type: ignore[attr-defined]
    return code  # type: ignore[no-any-return]


def popen_of(process: Any) -> Any:
    """The ``Popen`` of a started ``multiprocessing`` process, or ``None``."""
    return getattr(process, "_popen", None)


def serialize_exit_polls(process: Any, status_wait_seconds: float) -> None:
    """Make the exit-status polls of ``process`` (started by multiprocessing's fork ``Popen``)
    one thread at a time.

    Its ``Popen.poll`` reaps the child with ``waitpid`` and only then records its status.  Two
    threads polling at once (a shutdown on the finalizer thread, and the user's thread joining
    the ``_workers`` that torch's API hands out) race: the loser's ``waitpid`` finds the child
    reaped (``ECHILD``), which ``poll`` reads as "still running", so ``join()`` returns and
    ``is_alive()`` says True for a process that is gone.  A blocking poll waits for the
    ``sentinel`` outside the lock (a thread joining without a timeout must not hold up the
    shutdown that lets the process end), then for the status, ``status_wait_seconds`` at a
    time."""
    popen = popen_of(process)
    if popen is None:
        return
    unserialized = type(popen).poll
    # Weakly: a closure on the Popen stored on the Popen would be a reference cycle that keeps
    # its sentinel pipe open until the cyclic collector runs.
    popen_ref = weakref.ref(popen)
    poll_lock = threading.Lock()  # never held by a finalizer: pollers are threads, not the GC

    def poll(flag: int = os.WNOHANG) -> int | None:
        while True:
            with poll_lock:
                code = unserialized(popen_ref(), os.WNOHANG)
            if code is not None or flag == os.WNOHANG:
                return code
            current = popen_ref()
            if current is not None:
                multiprocessing.connection.wait([current.sentinel])  # it ends
            time.sleep(status_wait_seconds)  # its status follows (an fd closed early: no spin)

    popen.poll = poll


def random_words_reader(generator: random.Random, watched_words: int) -> Callable[[], Any] | None:
    """A reader of ``generator``'s position and first ``watched_words`` state words, in place,
    with its cached ``gauss_next``; ``None`` where the struct is not the expected one."""
    if type(generator).__basicsize__ < object.__basicsize__ + 4 + MT_WORDS * 4:
        return None
    address = id(generator) + object.__basicsize__  # RandomObject: PyObject_HEAD, index, state
    words = (ctypes.c_char * (4 + watched_words * 4)).from_address(address)
    return lambda: (words.raw, generator.gauss_next)  # type: ignore[attr-defined]


def descriptor_for_child(descriptor: int) -> Any:
    """``descriptor``, pickled for the child being started (spawn or forkserver, or mploader's
    zygote): ``multiprocessing.reduction.DupFd`` duplicates it for that child through the
    spawning ``Popen``; unpickled there, ``.detach()`` gives the child's descriptor."""
    return multiprocessing.reduction.DupFd(descriptor)  # type: ignore[attr-defined]


# CPython 3.12's and 3.13's words (Modules/posixmodule.c, warn_about_fork_with_threads).
_FORK_WITH_THREADS_WARNING = re.compile(r"This process \(pid=\d+\) is multi-threaded, use of "
                                        r"fork\(\) may lead to deadlocks in the child\.")
OWN_THREAD_PREFIX = "mploader-"  # every thread mploader starts is named so
# A thread the kernel counts but ``threading.enumerate()`` does not show is either ending or
# starting (a Python thread whose code has returned, or not yet begun) or a native one (an
# OpenMP pool).  The first kind is waited for, this long at most; what is still there then is
# taken for native, and counted without waiting again.
UNSEEN_THREAD_SECONDS = 0.5

_forking = threading.Lock()  # one fork at a time recorded (process-wide state)
_native_threads: set[int] = set()  # thread ids still unseen after UNSEEN_THREAD_SECONDS
_recordings: list[_Recording] = []  # a fork's recording, while it lasts
_thread = threading.local()  # .forking: inside forking_workers; .recording: its fork's


@contextmanager
def forking_workers() -> Iterator[None]:
    """Around mploader's start of one of its workers: CPython 3.12+ warns of a fork only where
    it would have warned without mploader's threads in this process.

    mploader's threads of the main process (its finalizer thread, the ``top`` publisher, the
    reaper's threads) are made to be forked over (``docs/internals/locks.md``): a warning they
    alone caused would be one that torch's loader, forking from the same program, does not give.
    Other threads, the program's own or native ones (an OpenMP pool), make the fork as risky as
    it is for torch's loader, and the warning stays.

    The warning is judged after the fork, as CPython counts the threads then: a native pool that
    stops itself at a fork (OpenBLAS's, started by importing numpy) is not counted, and must not
    be.  From this thread's fork (the before-fork hook: spawn and forkserver start no fork here)
    until the start returns, the warnings that the program's filters let through are recorded
    instead of shown (process-wide, for those milliseconds), and then shown: everything but the
    fork warning where, mploader's threads aside, this thread was the only one.  A thread of
    mploader's still ending at the fork (gone from ``threading.enumerate()``, still counted by
    the kernel) is waited for.
    """
    if sys.version_info < (3, 12):
        yield
        return
    _thread.forking = True
    try:
        yield
    finally:
        _thread.forking = False
        recording = getattr(_thread, "recording", None)
        if recording is not None:
            try:
                _recordings.remove(recording)
                recording.stop()
                for message in recording.caught:
                    if _is_fork_warning(message) and _threads_but_ours() <= 1:
                        _not_shown(message)
                    else:
                        warnings._showwarnmsg(message)  # type: ignore[attr-defined]
            finally:
                _thread.recording = None
                _forking.release()


class _Recording:
    """Warnings recorded instead of shown, as ``warnings.catch_warnings(record=True)`` records
    them (3.11 to 3.13: ``showwarning`` back to its original, ``_showwarnmsg_impl`` replaced),
    but without replacing the filters: that would invalidate every module's registry of the
    warnings already shown once (the "default" action's), and show them again."""

    def __init__(self) -> None:
        self.caught: list[warnings.WarningMessage] = []
        self._showwarning = warnings.showwarning
        self._show = warnings._showwarnmsg_impl  # type: ignore[attr-defined]
        warnings.showwarning = warnings._showwarning_orig  # type: ignore[attr-defined]
        warnings._showwarnmsg_impl = self.caught.append  # type: ignore[attr-defined]

    def stop(self) -> None:
        warnings.showwarning = self._showwarning
        warnings._showwarnmsg_impl = self._show  # type: ignore[attr-defined]


def _not_shown(message: warnings.WarningMessage) -> None:
    """A recorded warning dropped: the filters' registries must not hold it as shown (the
    "default", "module" and "once" actions show a warning once), or torch's loader would show
    one later that mploader's would not.  CPython's fork warning is issued from
    ``multiprocessing.popen_fork`` (3.12, 3.13), whose registry holds it."""
    text, category = str(message.message), message.category
    warnings.onceregistry.pop((text, category), None)  # type: ignore[attr-defined]
    module = sys.modules.get("multiprocessing.popen_fork")
    registry = getattr(module, "__warningregistry__", None)
    if isinstance(registry, dict):
        registry.pop((text, category, message.lineno), None)
        registry.pop((text, category, 0), None)


def _record_the_fork() -> None:
    """Before a fork: this thread's fork inside ``forking_workers`` is recorded."""
    if getattr(_thread, "forking", False) and getattr(_thread, "recording", None) is None:
        _forking.acquire()
        _thread.recording = _Recording()
        _recordings.append(_thread.recording)


def _forget_forking_state() -> None:
    """In a forked child: warnings are shown again (the child never leaves the parent's
    ``forking_workers``), a lock another thread held at the fork is free, and the parent's
    threads are not the child's."""
    global _forking, _thread
    while _recordings:
        _recordings.pop().stop()
    _forking = threading.Lock()
    _thread = threading.local()
    _native_threads.clear()


if sys.version_info >= (3, 12):
    os.register_at_fork(before=_record_the_fork, after_in_child=_forget_forking_state)


def _is_fork_warning(message: warnings.WarningMessage) -> bool:
    return (issubclass(message.category, DeprecationWarning)
            and _FORK_WITH_THREADS_WARNING.fullmatch(str(message.message)) is not None)


def _threads_but_ours() -> int:
    """This process's threads, as the kernel counts them (as CPython does), but mploader's."""
    try:
        return _kernel_threads_but_ours()
    except OSError:  # no /proc: the threads threading knows of (CPython's fallback too)
        return sum(not thread.name.startswith(OWN_THREAD_PREFIX)
                   for thread in threading.enumerate())


def _kernel_threads_but_ours() -> int:
    """The kernel's threads of this process (``/proc/self/task``), matched to ``threading``'s
    by thread id, less mploader's: threading is asked before and after the kernel, so that a
    thread ending or starting meanwhile is known by one of them.  A thread neither knows is
    waited for (ending or starting) or, still there after ``UNSEEN_THREAD_SECONDS``, counted
    (native)."""
    deadline = time.monotonic() + UNSEEN_THREAD_SECONDS
    while True:
        seen = threading.enumerate()
        tids = {int(tid) for tid in os.listdir("/proc/self/task")}
        seen += threading.enumerate()
        names = {thread.native_id: thread.name for thread in seen
                 if thread.native_id is not None}
        others = sum(not name.startswith(OWN_THREAD_PREFIX)
                     for tid, name in names.items() if tid in tids)
        _native_threads.intersection_update(tids)  # ended since (and its id free again)
        unseen = tids - names.keys() - _native_threads
        counted = others + len(_native_threads)
        if counted > 1 or not unseen:
            return counted + len(unseen)
        if time.monotonic() >= deadline:
            _native_threads.update(unseen)
            return counted + len(unseen)
        time.sleep(0.001)
