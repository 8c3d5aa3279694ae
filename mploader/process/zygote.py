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
                     result pipe write end, life pipe write end), then the payload: the pickled
                     (name, spec)
    zygote -> main   ("forked", pid) once per request, and ("exited", pid, exitcode) whenever a
                     worker ends (the zygote reaps its children)

A worker's sentinel in the main process is the read end of its *life pipe*: only the worker holds
the write end, so the pipe reads EOF the moment the worker ends, however it ends.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import socket
import struct
import threading
import time
import traceback
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from typing import Any

_HEADER = struct.Struct("!Q")
_instances: dict[tuple[int, str], Zygote] = {}
_instances_lock = threading.Lock()


def enabled() -> bool:
    return os.environ.get("MPLOADER_ZYGOTE", "1") != "0"


def zygote_for(context: Any) -> Zygote:
    """The live zygote of this process for ``context``'s start method, started if needed."""
    key = (os.getpid(), context.get_start_method())
    with _instances_lock:
        zygote = _instances.get(key)
        if zygote is None or not zygote.alive():
            zygote = Zygote(context)
            _instances[key] = zygote
        return zygote


def helper_pids() -> list[int]:
    """pids of this process's zygotes (long-lived helpers, like multiprocessing's fork server)."""
    with _instances_lock:
        return [z.process.pid for (pid, _), z in _instances.items() if pid == os.getpid()]


class Zygote:
    def __init__(self, context: Any) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.socket = ours
        self.process = context.Process(
            target=_zygote_main, args=(theirs,), name="mploader-zygote", daemon=True
        )
        self.process.start()
        theirs.close()
        self._lock = threading.Lock()
        self._forked: list[int] = []
        self._exit_codes: dict[int, int] = {}

    def alive(self) -> bool:
        return bool(self.process.is_alive())

    def fork(self, name: str, spec: Any, fds: list[int]) -> int:
        payload = bytes(ForkingPickler.dumps((name, spec), pickle.HIGHEST_PROTOCOL))
        with self._lock:
            socket.send_fds(self.socket, [_HEADER.pack(len(payload))], fds)
            self.socket.sendall(payload)
            while not self._forked:
                self._read_one(timeout=None)
            return self._forked.pop(0)

    def exit_code(self, pid: int, timeout: float) -> int | None:
        """The exit code of worker ``pid`` (negative: killed by that signal), once reaped."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while pid not in self._exit_codes:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._read_one(timeout=remaining):
                    return None
            return self._exit_codes[pid]

    def _read_one(self, timeout: float | None) -> bool:
        readable, _, _ = select.select([self.socket], [], [], timeout)
        if not readable:
            return False
        header = _receive_exactly(self.socket, _HEADER.size)
        message = pickle.loads(_receive_exactly(self.socket, _HEADER.unpack(header)[0]))
        if message[0] == "forked":
            self._forked.append(message[1])
        elif message[0] == "exited":
            self._exit_codes[message[1]] = message[2]
        elif message[0] == "error":
            raise RuntimeError(f"mploader's worker zygote could not fork a worker: {message[1]}")
        return True


class ZygoteProcess:
    """A worker forked by the zygote, with the parts of ``multiprocessing.Process`` we use."""

    def __init__(self, zygote: Zygote, name: str, spec: Any, task_reader: Connection,
                 result_writer: Connection) -> None:
        self.zygote = zygote
        self.name = name
        self.daemon = True
        self._spec = spec
        self._ends = (task_reader, result_writer)
        self.pid: int | None = None
        self.sentinel = -1
        self._exitcode: int | None = None

    def start(self) -> None:
        life_read, life_write = os.pipe()
        try:
            fds = [self._ends[0].fileno(), self._ends[1].fileno(), life_write]
            self.pid = self.zygote.fork(self.name, self._spec, fds)
        except BaseException:
            os.close(life_read)
            raise
        finally:
            os.close(life_write)
            self._spec = None
        self.sentinel = life_read

    @property
    def exitcode(self) -> int | None:
        if self._exitcode is None and self.pid is not None and self._ended(0):
            self._exitcode = self.zygote.exit_code(self.pid, timeout=2.0)
        return self._exitcode

    def _ended(self, timeout: float | None) -> bool:
        if self.sentinel < 0:
            return True
        readable, _, _ = select.select([self.sentinel], [], [], timeout)
        return bool(readable)

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
    """Preload, then fork workers on request and report their exits, until the main process goes.

    The main process closing its end of the socket (or dying) ends the loop; so does a change of
    parent (the main process under spawn, the fork server under forkserver).
    """
    parent = os.getppid()
    import torch  # noqa: F401  (the point of the zygote: import once, fork many)

    import mploader.worker.loop  # noqa: F401

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # the wake-up fd is what matters
    try:
        while True:
            readable, _, _ = select.select([sock.fileno(), wake_read], [], [], 1.0)
            if wake_read in readable:
                os.read(wake_read, 4096)
            _reap_children(sock)
            if sock.fileno() in readable and not _serve_request(sock, (wake_read, wake_write)):
                return  # the main process closed its end (or died)
            if os.getppid() != parent:
                return
    finally:
        _reap_children(sock)


def _serve_request(sock: socket.socket, own_fds: tuple[int, int]) -> bool:
    try:
        header, fds, _, _ = socket.recv_fds(sock, _HEADER.size, 3)
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
        task_fd, result_fd, _life_fd = fds  # the life pipe stays open until this process ends
        import multiprocessing

        name, spec = pickle.loads(payload)
        from mploader.worker.loop import worker_main

        process = multiprocessing.get_context("fork").Process(
            target=worker_main,
            args=(spec, Connection(task_fd, writable=False), Connection(result_fd,
                                                                        readable=False)),
            name=name, daemon=True,
        )
        code = process._bootstrap()  # type: ignore[attr-defined]
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
