"""Errors that cross the process boundary, and how a worker's death is described.

A worker exception comes back as the *original* exception object (same type, same attributes),
with the worker's formatted traceback as its ``__cause__`` and a note naming the worker, its pid and
the indices it was fetching, after CPython's ``concurrent.futures.process._ExceptionWithTraceback``.
Only an exception that cannot be pickled (or unpickled) falls back to :class:`WorkerError`.
"""

from __future__ import annotations

import pickle
import signal
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


class MploaderError(Exception):
    """Base of every exception mploader raises of its own: ``except mploader.MploaderError``
    catches them all.  Each is mixed in with the builtin type torch would raise in its place
    (``RuntimeError``, ``OSError``, ``ValueError``, ``TimeoutError``), so code written against
    torch's errors keeps working."""


class PicklesWithoutInit:
    """Mixin for exceptions whose ``__init__`` takes other arguments than the message.

    ``BaseException`` pickles as ``type(*args)`` plus ``__dict__``: an ``__init__`` with more (or
    keyword-only) parameters then fails to unpickle (``missing 6 required keyword-only
    arguments``), in a test harness or a ``multiprocessing`` pool that ships it back to its parent.
    These exceptions pickle as their type, ``args`` and ``__dict__`` (attributes and notes) and are
    rebuilt without calling ``__init__`` again.
    """

    def __reduce__(self) -> tuple[Any, ...]:
        assert isinstance(self, BaseException)
        return (rebuild_exception, (type(self), self.args), self.__dict__)


def rebuild_exception(error_type: type[BaseException], args: tuple[Any, ...]) -> BaseException:
    """An ``error_type`` with ``args`` whose ``__init__`` is not run (pickle restores the rest)."""
    error = error_type.__new__(error_type, *args)
    error.args = args
    return error


class RemoteTraceback(MploaderError):
    """The traceback of an exception raised in a worker; set as the re-raised error's cause."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return self.text


class WorkerError(PicklesWithoutInit, MploaderError, RuntimeError):
    """A worker raised an exception that could not travel to the main process as itself."""

    def __init__(self, message: str, original_type: str = "") -> None:
        super().__init__(message)
        self.original_type = original_type


class WorkerDiedError(PicklesWithoutInit, MploaderError, RuntimeError):
    """A worker process ended without being asked to (killed by a signal, or exited).

    The message starts with torch's own wording (``DataLoader worker (pid N) is killed by signal:
    Killed.``) so code that matches torch's errors keeps working, and goes on with what torch does
    not say: the worker id, the signal name or exit code, the tasks it held, and the likely cause.
    Built from the message alone (torch's ``ExceptionWrapper`` rebuilds errors as
    ``exc_type(message)``), the other attributes are unknown: None or empty.
    """

    def __init__(
        self,
        message: str,
        *,
        worker_id: int | None = None,
        pid: int | None = None,
        exitcode: int | None = None,
        task_ids: tuple[int, ...] = (),
        indices: tuple[Any, ...] = (),
        likely_cause: str = "",
    ) -> None:
        super().__init__(message)
        self.worker_id = worker_id
        self.pid = pid
        self.exitcode = exitcode
        self.task_ids = task_ids
        self.indices = indices
        self.likely_cause = likely_cause

    @property
    def signal_name(self) -> str | None:
        """The name of the signal that killed the worker (``"SIGKILL"``, or ``"signal N"`` for a
        number Python does not name); ``None`` when it exited (``exitcode >= 0``) or the exit
        code is unknown."""
        if self.exitcode is None or self.exitcode >= 0:
            return None
        return signal_name(-self.exitcode)


class PoisonTaskError(WorkerDiedError):
    """The same task killed its worker twice: restarting again would loop forever.

    ``task_id`` is the task; :meth:`after_deaths` builds the full report."""

    def __init__(self, message: str, *, task_id: int | None = None, **died: Any) -> None:
        super().__init__(message, **died)
        self.task_id = task_id

    @classmethod
    def after_deaths(cls, task_id: int, indices: Any, deaths: list[str], last: WorkerDiedError,
                     others: Sequence[tuple[int, Any]] = ()) -> PoisonTaskError:
        """The report for ``task_id``, whose worker died (``deaths``, ``last`` the latest) while
        running it; ``others`` ran beside it both times (``worker_threads``)."""
        beside = "".join(
            f"; with worker_threads, task {other_id} (indices {other_indices}) was running "
            "beside it at both deaths and may be the cause instead"
            for other_id, other_indices in others
        )
        return cls(
            f"mploader: task {task_id} (indices {indices}) killed its worker twice "
            f"({'; '.join(deaths)}){beside}; it is a poison task, so it is not retried again. "
            f"Fetch these indices with num_workers=0 to see what happens.\n"
            f"Last death: {last}",
            task_id=task_id, worker_id=last.worker_id, pid=last.pid, exitcode=last.exitcode,
            task_ids=(task_id,), indices=(indices,), likely_cause=last.likely_cause,
        )


class ZygoteError(MploaderError, RuntimeError):
    """mploader's worker zygote (the warm process that forks spawn/forkserver workers) failed to
    start, died, or stopped answering; the message says how and the way out (``MPLOADER_ZYGOTE=0``
    starts each worker by the start method itself)."""


class ZygoteTimeoutError(ZygoteError, TimeoutError):
    """The zygote did not answer within the deadline (``timeout=``, or mploader's own).  The
    iterator reports it as torch's ``DataLoader timed out after N seconds`` when ``timeout=`` is
    set."""


@dataclass(slots=True)
class RemoteError:
    """An exception captured in a worker, ready to be pickled onto the result pipe."""

    exception_bytes: bytes | None
    # Exceptions whose __init__ takes other arguments than ``args`` (``MyError(msg, code)``)
    # pickle but do not unpickle; these parts rebuild them without calling __init__.
    parts_bytes: bytes | None
    type_name: str
    message: str
    traceback_text: str
    worker_id: int
    pid: int
    indices: Any

    @classmethod
    def capture(cls, error: BaseException, worker_id: int, pid: int, indices: Any) -> RemoteError:
        text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
        try:
            exception_bytes: bytes | None = pickle.dumps(error, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:
            exception_bytes = None
        try:
            parts_bytes: bytes | None = pickle.dumps(
                (type(error), error.args, getattr(error, "__dict__", {})),
                protocol=pickle.HIGHEST_PROTOCOL,
            )
        except Exception:
            parts_bytes = None
        return cls(
            exception_bytes=exception_bytes,
            parts_bytes=parts_bytes,
            type_name=f"{type(error).__module__}.{type(error).__qualname__}",
            message=str(error),
            traceback_text=text,
            worker_id=worker_id,
            pid=pid,
            indices=_short_indices(indices),
        )

    def where(self) -> str:
        return f"in DataLoader worker {self.worker_id} (pid {self.pid})"

    def rebuild(self) -> BaseException:
        """The original exception, its worker traceback as cause, and a note saying where."""
        note = f"Raised {self.where()} while fetching indices {self.indices}."
        error = self._unpickle()
        if error is None:
            error = WorkerError(
                f"Caught {self.type_name} {self.where()}; it could not be sent to the main "
                f"process as itself (it does not pickle), so here is its text: {self.message}",
                self.type_name,
            )
        error.__cause__ = RemoteTraceback(
            f"\n\"\"\"\nOriginal traceback {self.where()}:\n{self.traceback_text}\"\"\""
        )
        error.add_note(note)
        return error

    def _unpickle(self) -> BaseException | None:
        if self.exception_bytes is not None:
            try:
                error = pickle.loads(self.exception_bytes)
                if isinstance(error, BaseException):
                    return error
            except Exception:
                pass
        if self.parts_bytes is not None:
            try:
                error_type, args, attributes = pickle.loads(self.parts_bytes)
                error = error_type.__new__(error_type, *args)
                error.args = args
                error.__dict__.update(attributes)
                return error
            except Exception:
                pass
        return None


def _short_indices(indices: Any, limit: int = 32) -> Any:
    """Indices as sent, shortened for messages: a 10000-index batch must not make a 100 kB note."""
    if isinstance(indices, list) and len(indices) > limit:
        return [*indices[:limit], f"... {len(indices) - limit} more"]
    return indices


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def signal_description(number: int) -> str:
    """The C library's description (``Killed``, ``Segmentation fault``), as torch prints it."""
    return signal.strsignal(number) or f"Unknown signal {number}"
