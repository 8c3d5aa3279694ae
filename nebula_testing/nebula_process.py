"""Run the test graphd (:mod:`nebula_testing.nebula_server`) as a subprocess.

Kept free of nebula3 imports so fixtures can import it cheaply.  The server runs in its own
process on purpose: tests fork, and a forked child must not inherit a live server.

    with start_server_process(preload="citation", nodes=500) as server:
        pool.init([(server.host, server.port)], Config())
        ...
        server.restart()          # same port, fresh state (sessions are gone)
"""

from __future__ import annotations

import os
import selectors
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

_REPO_ROOT = Path(__file__).resolve().parents[1]  # the directory holding nebula_testing


class NebulaServerProcess:
    """A running test server: ``host``, ``port``, ``address``; ``stop()``/``restart()``."""

    def __init__(self, arguments: Sequence[str], startup_timeout: float = 30.0) -> None:
        self.arguments = list(arguments)
        self.startup_timeout = startup_timeout
        self.host = "127.0.0.1"
        self.port = 0
        self.process: subprocess.Popen[str] | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self, port: int | None = None) -> NebulaServerProcess:
        """Start the subprocess and wait for its ``LISTENING host:port`` line."""
        if self.running:
            raise RuntimeError(f"the test NebulaGraph server at {self.address} is already running")
        arguments = list(self.arguments)
        if port is not None:
            arguments += ["--port", str(port)]
        environment = dict(os.environ)
        environment["PYTHONPATH"] = os.pathsep.join(
            [str(_REPO_ROOT), *filter(None, [environment.get("PYTHONPATH")])]
        )
        self.process = subprocess.Popen(
            [sys.executable, "-m", "nebula_testing.nebula_server", *arguments],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
            env=environment,
        )
        assert self.process.stdout is not None
        with selectors.DefaultSelector() as selector:  # poll/epoll: any fd number (not select)
            selector.register(self.process.stdout, selectors.EVENT_READ)
            ready = selector.select(self.startup_timeout)
        line = self.process.stdout.readline() if ready else ""
        if not line.startswith("LISTENING "):
            self.stop()
            raise RuntimeError(
                "the test NebulaGraph server did not start "
                f"(arguments {arguments}, first output {line!r}); see its stderr above"
            )
        self.host, _, port_text = line.split()[1].rpartition(":")
        self.port = int(port_text)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, wait, SIGKILL if it does not exit; idempotent."""
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout)
        if process.stdout is not None:
            process.stdout.close()

    def kill(self) -> None:
        """SIGKILL without a graceful shutdown (a crashed graphd)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
        self.stop()

    def restart(self) -> NebulaServerProcess:
        """Stop and start again on the same port with the same arguments (all sessions lost)."""
        port = self.port
        self.stop()
        return self.start(port=port)

    def __enter__(self) -> NebulaServerProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"NebulaServerProcess({self.address}, {state})"


def start_server_process(
    port: int = 0,
    preload: str | None = None,
    space: str = "citation",
    nodes: int = 2708,
    feature_dim: int = 32,
    classes: int = 7,
    seed: int = 0,
    cites_per_node: int = 5,
    users: dict[str, str] | None = None,
    startup_timeout: float = 30.0,
    latency_ms: float = 0.0,
    max_sessions_per_ip_per_user: int | None = None,
    session_idle_timeout_secs: float | None = None,
    max_allowed_query_size: int | None = None,
    login_delay_ms: tuple[float, float] = (0.0, 0.0),
    event_log: str | os.PathLike[str] | None = None,
) -> NebulaServerProcess:
    """Start ``python -m nebula_testing.nebula_server`` and return its running handle.

    Use it as a context manager (``with start_server_process(...) as server:``) or call
    ``stop()``.  ``preload="citation"`` loads :func:`make_citation_graph` with these arguments.
    ``latency_ms`` is the modelled network latency added to every statement (0: none).  The
    session rules default to graphd's (300 sessions per IP and user, 8 h idle timeout, 4 MiB
    statements: :mod:`nebula_testing.nebula_sessions`); pass a value to change one.
    ``login_delay_ms``: how long each login waits before and after graphd makes its session;
    ``event_log``: a file the server notes session events in (:mod:`nebula_testing.nebula_events`).
    """
    arguments = ["--host", "127.0.0.1", "--latency-ms", str(latency_ms)]
    arguments += ["--login-delay-ms", f"{login_delay_ms[0]},{login_delay_ms[1]}"]
    if event_log is not None:
        arguments += ["--event-log", os.fspath(event_log)]
    rules = {
        "--max-sessions-per-ip-per-user": max_sessions_per_ip_per_user,
        "--session-idle-timeout-secs": session_idle_timeout_secs,
        "--max-allowed-query-size": max_allowed_query_size,
    }
    for flag, value in rules.items():
        if value is not None:
            arguments += [flag, str(value)]
    for name, password in (users or {"root": "nebula"}).items():
        arguments += ["--user", f"{name}:{password}"]
    if preload is not None:
        arguments += ["--preload", preload, "--space", space, "--nodes", str(nodes)]
        arguments += ["--feature-dim", str(feature_dim), "--classes", str(classes)]
        arguments += ["--seed", str(seed), "--cites-per-node", str(cites_per_node)]
    return NebulaServerProcess(arguments, startup_timeout).start(port=port)
