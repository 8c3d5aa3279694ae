"""Fast spawn and forkserver start: one warm interpreter that forks workers on request.

A spawned worker is a fresh interpreter that imports torch (about a second of CPU) before it can
do anything; four of them on two cores take about two seconds, every epoch without persistent
workers.  The zygote is started once per main process and start method, by that start method, so
it is exactly as fresh as a spawned worker would be (no inherited sockets, sessions or threads from
the main process); it imports torch and mploader's worker once and then forks a worker per
request.  Each worker still unpickles its own spec (dataset, functions) after the fork, as a
spawned worker would, so the zygote itself stays clean.  ``MPLOADER_ZYGOTE=0`` turns it off.

Protocol on the zygote's Unix socket (main <-> zygote):

    main -> zygote   header (8 bytes: payload length) with three fds attached (task pipe read end,
                     result pipe write end, life pipe write end) and any the spec hands over
                     (multiprocessing objects in the dataset, pickled as for spawn), then the
                     payload: the pickled (name, spec)
    zygote -> main   ("forked", pid) once per request, and ("exited", pid, exitcode) whenever a
                     worker ends (the zygote reaps its children)

A worker's sentinel in the main process is the read end of its *life pipe*: only the worker holds
the write end, so the pipe reads EOF the moment the worker ends, however it ends.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import socket
import struct
import threading
import time
import traceback
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from typing import Any

from mploader.compat import cpython
from mploader.errors import ZygoteError, ZygoteTimeoutError, signal_name
from mploader.polling import Poller, WakePipe, readable

_log = logging.getLogger("mploader")
_HEADER = struct.Struct("!Q")
_instances: dict[tuple[int, str], Zygote] = {}
_instances_lock = threading.Lock()

# The zygote imports torch before it can fork (about a second; much more on a loaded machine): a
# request waits this long for it to be ready.  A zygote that dies meanwhile is seen at once.
START_SECONDS = 120.0
# A ready zygote forks in milliseconds.  Without ``timeout=``, a request still waits at most this
# long for its answer (a stopped or wedged zygote must not hang the loader).
ANSWER_SECONDS = 30.0
# How long an ended worker's exit status may take to come through the zygote.  Once one wait runs
# out, later ones do not block until the zygote is heard from again, so a shutdown is delayed by
# a mute zygote at most once.
EXIT_REPORT_SECONDS = 2.0
# Once a message has begun, the rest of it is already on its way.
MESSAGE_SECONDS = 5.0

_WAY_OUT = ("MPLOADER_ZYGOTE=0 starts each worker by the start method itself, without the "
            "zygote (slower: every worker imports torch)")


def enabled() -> bool:
    return os.environ.get("MPLOADER_ZYGOTE", "1") != "0"


def zygote_for(context: Any) -> Zygote:
    """The live zygote of this process for ``context``'s start method, started if needed (a dead
    or abandoned one is replaced)."""
    key = (os.getpid(), context.get_start_method())
    with _instances_lock:
        zygote = _instances.get(key)
        if zygote is None or not zygote.alive():
            if zygote is not None:
                zygote.discard()
                if not zygote.broken:
                    _log.warning("%s; starting a new one", zygote.ended_how())
            zygote = Zygote(context)
            _instances[key] = zygote
        return zygote


def helper_pids() -> list[int]:
    """pids of this process's zygotes (long-lived helpers, like multiprocessing's fork server)."""
    with _instances_lock:
        return [z.process.pid for (pid, _), z in _instances.items() if pid == os.getpid()]


class _Gone(ZygoteError):
    """The zygote ended while a request was on its way: a fresh one may serve it."""


class Zygote:
    """The main process's side of one zygote: requests, answers, and the zygote's own health.

    Every wait has a deadline.  A zygote that dies is noticed (the socket reads EOF) and replaced
    on the next request; one that does not answer in time is killed, so that a request it might
    serve later can never start a worker nobody waits for.  Workers it already forked live on:
    they watch the main process, not the zygote.
    """

    def __init__(self, context: Any) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.socket = ours
        self.start_method = context.get_start_method()
        self.process = context.Process(
            target=_zygote_main, args=(theirs,), name="mploader-zygote", daemon=True
        )
        self.process.start()
        theirs.close()
        self._lock = threading.Lock()
        self._forked: list[int] = []
        self._exit_codes: dict[int, int] = {}
        self.ready = False
        self.gone = False  # its socket read EOF: it has ended
        self.broken = ""  # why it was abandoned (killed by us), if it was
        self._mute = False  # the last wait for an exit status ran out

    def __repr__(self) -> str:
        return f"<Zygote {self.start_method} pid={self.process.pid}>"

    def alive(self) -> bool:
        return not (self.gone or self.broken) and bool(self.process.is_alive())

    # -- requests ----------------------------------------------------------------------------------

    def fork(self, name: str, spec: Any, fds: list[int], answer_seconds: float) -> int:
        """Ask for a worker; its pid.  Waits for the zygote to be ready (``START_SECONDS``), then
        ``answer_seconds`` for the answer; raises :class:`ZygoteTimeoutError` past either."""
        payload, handed = pickle_for_worker((name, spec), len(fds))
        try:
            return self._request(name, payload, fds + handed, answer_seconds)
        finally:
            for fd in handed:  # the request's own duplicates: the worker has its copies
                os.close(fd)

    def _request(self, name: str, payload: bytes, fds: list[int], answer_seconds: float) -> int:
        start_deadline = time.monotonic() + START_SECONDS
        if not self._lock.acquire(timeout=START_SECONDS + answer_seconds):
            raise ZygoteTimeoutError(self._describe("was busy with other requests for "
                                                    f"{START_SECONDS + answer_seconds:.0f} s"))
        try:
            self._wait_until_ready(start_deadline)
            deadline = time.monotonic() + answer_seconds
            self._send(payload, fds, deadline)
            while not self._forked:
                if not self._read_one(deadline):
                    self._raise_unanswered(deadline, f"to start {name}", answer_seconds)
            return self._forked.pop(0)
        finally:
            self._lock.release()

    def exit_code(self, pid: int) -> int | None:
        """The exit code of worker ``pid`` (negative: killed by that signal), once reaped; None if
        the zygote is gone, or mute for ``EXIT_REPORT_SECONDS`` (then the next asks do not wait)."""
        wait = 0.0 if self._mute or self.gone or self.broken else EXIT_REPORT_SECONDS
        deadline = time.monotonic() + wait
        if not self._lock.acquire(timeout=wait):
            return None
        try:
            while pid not in self._exit_codes:
                if not self._read_one(deadline):
                    self._mute = not (self.gone or self.broken)
                    return None
            return self._exit_codes.pop(pid)
        finally:
            self._lock.release()

    def discard(self) -> None:
        """Forget a zygote that ended or was abandoned: reap it, close the socket."""
        if not self.broken and not self.gone and self.process.is_alive():
            self._abandon("replaced")
        self.process.join(timeout=0)
        self.socket.close()

    # -- the protocol, with deadlines ------------------------------------------------------------

    def _wait_until_ready(self, deadline: float) -> None:
        while not self.ready:
            if self.broken:
                raise ZygoteTimeoutError(self._describe(f"was abandoned: {self.broken}"))
            if not self._read_one(deadline):
                if self.gone:
                    raise ZygoteError(self._failed_to_start())
                self._raise_unanswered(deadline, "to get ready (import torch)", START_SECONDS)

    def _send(self, payload: bytes, fds: list[int], deadline: float) -> None:
        if self.broken:  # another request found it mute just now: so is this one
            raise ZygoteTimeoutError(self._describe(f"was abandoned: {self.broken}"))
        if self.gone:
            raise _Gone(self._describe("has ended"))
        try:
            self.socket.settimeout(max(0.001, deadline - time.monotonic()))
            socket.send_fds(self.socket, [_HEADER.pack(len(payload))], fds)
            self.socket.sendall(payload)
        except TimeoutError:
            self._abandon("a request could not be written to it in time")
            raise ZygoteTimeoutError(self._describe("did not take a request in time")) from None
        except OSError as error:  # EPIPE, ECONNRESET: it has ended
            self.gone = True
            raise _Gone(self._describe("ended while a request was sent to it")) from error
        finally:
            if self.socket.fileno() >= 0:
                self.socket.settimeout(None)

    def _read_one(self, deadline: float) -> bool:
        """Read one message if one comes before ``deadline``.  False when none came, or when the
        zygote is gone (``self.gone``) or had to be abandoned (``self.broken``)."""
        if self.gone or self.broken:
            return False
        if not readable([self.socket.fileno()], max(0.0, deadline - time.monotonic())):
            return False
        try:
            self.socket.settimeout(max(MESSAGE_SECONDS, deadline - time.monotonic()))
            header = _receive_exactly(self.socket, _HEADER.size)
            message = pickle.loads(_receive_exactly(self.socket, _HEADER.unpack(header)[0]))
        except (EOFError, ConnectionError):
            self.gone = True
            return False
        except OSError:  # a timeout half-way through a message: the stream is lost
            self._abandon("a message from it stopped half-way")
            return False
        finally:
            if self.socket.fileno() >= 0:
                self.socket.settimeout(None)
        self._mute = False
        if message[0] == "ready":
            self.ready = True
        elif message[0] == "forked":
            self._forked.append(message[1])
        elif message[0] == "exited":
            self._exit_codes[message[1]] = message[2]
        elif message[0] == "failed":
            self.gone = True
            raise ZygoteError(self._failed_to_start(message[1]))
        elif message[0] == "error":
            raise ZygoteError(self._describe(f"could not fork a worker: {message[1]}"))
        return True

    def _raise_unanswered(self, deadline: float, what: str, seconds: float) -> None:
        if self.gone:
            raise _Gone(self._describe(f"ended while it was asked {what}"))
        reason = (f"no answer to a request {what} within {seconds:g} s (its state was: "
                  f"{_process_state(self.process.pid)})")
        self._abandon(reason)
        raise ZygoteTimeoutError(self._describe(
            f"gave {reason}; it was killed, and the next loader starts a fresh one"
        ))

    def _abandon(self, reason: str) -> None:
        """Kill a zygote we can no longer talk to (SIGKILL works on a stopped process too)."""
        self.broken = reason
        try:
            self.process.kill()
        except (OSError, ValueError, AttributeError):
            pass
        self.process.join(timeout=1.0)

    # -- messages ----------------------------------------------------------------------------------

    def _describe(self, what: str) -> str:
        return (f"mploader's {self.start_method} worker zygote (pid {self.process.pid}) {what}. "
                f"{_WAY_OUT}.")

    def ended_how(self) -> str:
        """``mploader's spawn worker zygote (pid N) was killed by SIGKILL``, and so on."""
        self.process.join(timeout=1.0)
        code = self.process.exitcode
        if code is None:
            status = "closed its connection"
        elif code < 0:
            status = f"was killed by {signal_name(-code)}"
        else:
            status = f"exited with exit code {code}"
        return f"mploader's {self.start_method} worker zygote (pid {self.process.pid}) {status}"

    def _failed_to_start(self, traceback_text: str = "") -> str:
        cause = (f"it failed while preloading:\n{traceback_text}" if traceback_text else
                 "its stderr, above, says why. A common cause under spawn and forkserver: the "
                 "main module builds and iterates a DataLoader when it is imported; put that "
                 "code under `if __name__ == '__main__':`")
        return (f"{self.ended_how()} before it was ready to start workers; {cause}. "
                f"{_WAY_OUT}.")


def _process_state(pid: int | None) -> str:
    """The ``State:`` line of /proc/<pid>/status (``T (stopped)``, ``R (running)``...)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("State:"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


class ZygoteProcess:
    """A worker forked by the zygote, with the parts of ``multiprocessing.Process`` we use."""

    def __init__(self, context: Any, name: str, spec: Any, task_reader: Connection,
                 result_writer: Connection, answer_seconds: float = ANSWER_SECONDS) -> None:
        self.context = context
        self.zygote: Zygote | None = None
        self.name = name
        self.daemon = True
        self._spec = spec
        self._ends = (task_reader, result_writer)
        self._answer_seconds = answer_seconds
        self.pid: int | None = None
        self.sentinel = -1
        self._exitcode: int | None = None

    def start(self) -> None:
        """Fork through this process's zygote; a zygote found dead is replaced once."""
        life_read, life_write = os.pipe()
        try:
            fds = [self._ends[0].fileno(), self._ends[1].fileno(), life_write]
            for attempt in (1, 2):
                zygote = zygote_for(self.context)
                try:
                    self.pid = zygote.fork(self.name, self._spec, fds, self._answer_seconds)
                except _Gone:
                    if attempt == 2:
                        raise
                    _log.warning("%r had ended; starting a new one", zygote)
                    continue
                self.zygote = zygote
                break
        except BaseException:
            os.close(life_read)
            raise
        finally:
            os.close(life_write)
            self._spec = None
        self.sentinel = life_read

    @property
    def exitcode(self) -> int | None:
        if (self._exitcode is None and self.pid is not None and self.zygote is not None
                and self._ended(0)):
            self._exitcode = self.zygote.exit_code(self.pid)
        return self._exitcode

    def _ended(self, timeout: float | None) -> bool:
        if self.sentinel < 0:
            return True
        return bool(readable([self.sentinel], timeout))

    def is_alive(self) -> bool:
        return self.pid is not None and not self._ended(0)

    def join(self, timeout: float | None = None) -> None:
        if self.pid is not None and self._ended(timeout):
            _ = self.exitcode

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def _signal(self, number: int) -> None:
        if self.pid is not None and self.is_alive():
            try:
                os.kill(self.pid, number)
            except ProcessLookupError:
                pass

    def close(self) -> None:
        if self.sentinel >= 0:
            os.close(self.sentinel)
            self.sentinel = -1

    def __del__(self) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<ZygoteProcess name={self.name!r} pid={self.pid} exitcode={self._exitcode}>"


def _receive_exactly(sock: socket.socket, size: int) -> bytes:
    chunks, remaining = [], size
    while remaining:
        chunk = sock.recv(min(remaining, 1 << 20))
        if not chunk:
            raise EOFError("the other end of the zygote socket closed")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def _send(sock: socket.socket, message: Any) -> None:
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    sock.sendall(_HEADER.pack(len(payload)) + payload)


# -- inside the zygote ---------------------------------------------------------------------------


def _zygote_main(sock: socket.socket) -> None:
    """Preload, say ready, then fork workers on request and report their exits, until the main
    process goes.

    The main process closing its end of the socket (or dying) ends the loop; so does a change of
    parent (the main process under spawn, the fork server under forkserver).
    """
    parent = os.getppid()
    try:
        import torch  # noqa: F401  (the point of the zygote: import once, fork many)

        import mploader.worker.loop  # noqa: F401
    except BaseException:
        _send(sock, ("failed", traceback.format_exc()))
        raise
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    wakeup = WakePipe()
    signal.set_wakeup_fd(wakeup.write_fd)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # the wake-up fd is what matters
    _send(sock, ("ready",))
    waiting = Poller(sock.fileno(), wakeup.read_fd)
    try:
        while True:
            ready = waiting.readable(1.0)
            if wakeup.read_fd in ready:
                wakeup.drain()
            _reap_children(sock)
            if sock.fileno() in ready and not _serve_request(
                    sock, (wakeup.read_fd, wakeup.write_fd)):
                return  # the main process closed its end (or died)
            if os.getppid() != parent:
                return
    finally:
        _reap_children(sock)


class _HandedFd:
    """A file descriptor that came with the worker's request: its place among them."""

    def __init__(self, index: int) -> None:
        self.index = index

    def detach(self) -> int:
        return _received_fds[self.index]


_received_fds: list[int] = []  # in a worker forked by the zygote: the fds of its request
MAX_HANDED_FDS = 250  # SCM_RIGHTS carries at most 253 descriptors in one message


def pickle_for_worker(message: Any, own_fds: int) -> tuple[bytes, list[int]]:
    """``message`` pickled as for a spawned child, and the extra fds it hands over.

    Objects that may only travel to a child being started (a ``Lock``, ``Semaphore``,
    ``Event``, ``Value``, ``Array`` or ``Queue`` in a dataset) pickle as they do for spawn, and
    the file descriptors they hand over travel with the request, after the worker's own pipes.
    (torch's workers get them from ``Popen``.)  The request sends duplicates it owns, not the
    numbers it was handed: a storage that a ``__reduce__`` made for the pickle is freed, its fd
    closed, before the request is sent."""
    handed: list[int] = []

    def duplicate(fd: int) -> int:
        handed.append(os.dup(fd))
        return own_fds + len(handed) - 1  # the request's own fds come first

    try:
        with cpython.pickling_for_child(duplicate, _HandedFd):
            payload = bytes(ForkingPickler.dumps(message, pickle.HIGHEST_PROTOCOL))
        _check_handed_fds(own_fds, len(handed))
    except BaseException:
        for fd in handed:
            os.close(fd)
        raise
    return payload, handed


def _check_handed_fds(own_fds: int, handed: int) -> None:
    if own_fds + handed > MAX_HANDED_FDS:
        raise ValueError(
            f"the worker's spec hands over {handed} file descriptors (multiprocessing "
            f"objects in the dataset or its functions); one request to the zygote carries at "
            f"most {MAX_HANDED_FDS - own_fds}. Share fewer multiprocessing objects, or set "
            "MPLOADER_ZYGOTE=0"
        )


def _serve_request(sock: socket.socket, own_fds: tuple[int, int]) -> bool:
    try:
        header, fds, _, _ = socket.recv_fds(sock, _HEADER.size, MAX_HANDED_FDS)
    except OSError:
        return False
    if not header:
        return False
    if len(header) < _HEADER.size:
        header += _receive_exactly(sock, _HEADER.size - len(header))
    try:
        payload = _receive_exactly(sock, _HEADER.unpack(header)[0])
    except EOFError:
        return False
    pid = os.fork()
    if pid == 0:
        _run_worker(sock, own_fds, payload, fds)
    for fd in fds:
        os.close(fd)
    _send(sock, ("forked", pid))
    return True


def _run_worker(sock: socket.socket, own_fds: tuple[int, int], payload: bytes,
                fds: list[int]) -> None:
    """In the forked worker: forget the zygote's plumbing, unpickle the spec, run the loop."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        sock.close()
        for fd in own_fds:
            os.close(fd)
        task_fd, result_fd, _life_fd = fds[:3]  # the life pipe stays open until this ends
        _received_fds[:] = fds  # what the spec's multiprocessing objects detach (_HandedFd)
        import multiprocessing

        name, spec = pickle.loads(payload)
        from mploader.worker.loop import worker_main

        process = multiprocessing.get_context("fork").Process(
            target=worker_main,
            args=(spec, Connection(task_fd, writable=False), Connection(result_fd,
                                                                        readable=False)),
            name=name, daemon=True,
        )
        code = cpython.run_process_here(process)
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(code)


def _reap_children(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        try:
            _send(sock, ("exited", pid, os.waitstatus_to_exitcode(status)))
        except OSError:
            return
