"""A worker killed in the middle of a login leaves no session on graphd (issue 29).

graphd makes a session when the ``authenticate`` request arrives, and only its answer carries
the id.  The bundled server holds each login before and after it makes the session
(``login_delay_ms``) and notes every session event in a log (``event_log``), so a test can kill
a worker at a known point: the request sent, the session made, the answer sent and never read,
the space being set.  Then the main process sweeps as it does when a worker dies
(``NebulaHooks.on_worker_died``) and no session may be left, nor any session of another client
touched.  ``benchmarks/killed_logins.py`` runs whole jobs with kills at random points of a login
as often as asked, on an idle or a busy machine.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from mploader.integrations.nebula import NebulaHooks, NebulaSession, PooledSession, logins
from mploader.integrations.nebula.budget import (
    HostSessionBudget,
    LoginInFlight,
    NamedSession,
    SlotRecord,
)
from mploader.integrations.nebula.logins import LOGIN_WINDOW_SECONDS, sweep_stale_sessions
from nebula_testing import citation
from nebula_testing.nebula_admin import AdminSession, session_ids
from nebula_testing.nebula_events import Event, EventLog
from nebula_testing.nebula_process import NebulaServerProcess, start_server_process
from tests.integrations.nebula_fixtures import NebulaTarget

pytestmark = pytest.mark.timeout(60)

# Each login waits this long before graphd makes its session and again before it answers, and
# every statement as long: a kill has that much time to land at its point.
HOLD_MS = 50


@pytest.fixture(scope="module")
def slow_logins(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[NebulaServerProcess,
                                                                             EventLog]]:
    log = EventLog(tmp_path_factory.mktemp("events") / "sessions.log")
    with start_server_process(
        preload="citation", nodes=20, feature_dim=4, classes=3, cites_per_node=2,
        latency_ms=HOLD_MS, login_delay_ms=(HOLD_MS, HOLD_MS), event_log=log.path,
    ) as server:
        yield server, log


def _hooks(address: str) -> NebulaHooks:
    return NebulaHooks([address], space=citation.CITATION_SPACE, retry_seconds=10)


def _log_in_and_wait(address: str) -> None:
    """A worker's first statement (its pool's first login), then nothing: the test kills it."""
    PooledSession(_hooks(address).session_pool()).execute("YIELD 1 AS q")
    time.sleep(60)


def _next_event(log: EventLog, name: str, after: float, timeout: float = 10.0) -> Event:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for event in log.read():
            if event.name == name and event.time > after:
                return event
        time.sleep(0.002)
    raise AssertionError(f"no {name!r} event within {timeout} s")


def _kill(log: EventLog, pid: int, signal_number: int = signal.SIGKILL) -> float:
    os.kill(pid, signal_number)
    log.write("kill" if signal_number == signal.SIGKILL else "stop", pid=pid)
    return time.time()


def _kill_when_sent(log: EventLog, pid: int, after: float) -> bool:
    """Killed once graphd has the request and before it made the session (made after the
    death: the sweep must wait for it)."""
    _next_event(log, "login", after)
    killed = _kill(log, pid)
    return _next_event(log, "session", after).time > killed


def _kill_when_made(log: EventLog, pid: int, after: float) -> bool:
    """Killed once graphd made the session and before it sent the answer."""
    _next_event(log, "session", after)
    killed = _kill(log, pid)
    return _next_event(log, "answered", after).time > killed


def _kill_with_the_answer_unread(log: EventLog, pid: int, after: float) -> bool:
    """Stopped before the answer came, killed after it was sent: it lies unread in the dead
    worker's socket."""
    _next_event(log, "session", after)
    stopped = _kill(log, pid, signal.SIGSTOP)
    answered = _next_event(log, "answered", after).time
    _kill(log, pid)
    return answered > stopped


def _kill_while_the_space_is_set(log: EventLog, pid: int, after: float) -> bool:
    """Killed half-way through the new session's ``USE`` (a statement takes ``HOLD_MS``)."""
    _next_event(log, "answered", after)
    time.sleep(HOLD_MS / 2000)
    _kill(log, pid)
    return True


KILL_POINTS = {
    "request-sent": _kill_when_sent,
    "session-made": _kill_when_made,
    "answer-unread": _kill_with_the_answer_unread,
    "space-being-set": _kill_while_the_space_is_set,
}


def _unheld_records(budget: HostSessionBudget) -> list[SlotRecord]:
    """What slots no live process holds still name: sessions or logins of the dead."""
    return [record for slot in budget.all_records() if not slot.held for record in slot.records]


def _story(log: EventLog, since: float) -> str:
    return "\n".join(str(event) for event in log.read() if event.time >= since)


@pytest.mark.parametrize("point", list(KILL_POINTS))
def test_a_worker_killed_mid_login_leaves_no_session(
    slow_logins: tuple[NebulaServerProcess, EventLog], point: str
) -> None:
    server, log = slow_logins
    hooks = _hooks(server.address)
    budget = HostSessionBudget(hooks.user, hooks.addresses, hooks.session_budget)
    admin = AdminSession(server.address)
    bystanders = admin.others()  # other clients' sessions, made before: never touched
    context = multiprocessing.get_context("fork")
    try:
        for _attempt in range(3):  # a kill that missed its point (a very busy machine): again
            started = time.time()
            victim = context.Process(target=_log_in_and_wait, args=(server.address,))
            victim.start()
            assert victim.pid is not None
            hit = KILL_POINTS[point](log, victim.pid, started)
            victim.join(10)
            left_behind = _unheld_records(budget)
            hooks.on_worker_died(0, victim.pid)  # as the main process does
            assert admin.others() == bystanders, _story(log, started)
            assert not _unheld_records(budget)
            if hit:
                break
        assert hit, f"the kill never landed at {point}:\n{_story(log, started)}"
        # what the dead worker's slot said: the login in flight, or (USE) the session by name
        expected = NamedSession if point == "space-being-set" else LoginInFlight
        assert left_behind and all(isinstance(r, expected) for r in left_behind), left_behind
    finally:
        admin.close()


# ----------------------------------------------------------------------------- the sweep's rule


def _raw_session(target: NebulaTarget) -> tuple[Any, Any]:
    from nebula3.Config import Config
    from nebula3.gclient.net import ConnectionPool

    pool = ConnectionPool()
    pool.init(target.addresses, Config())
    return pool, pool.get_session(target.user, target.password)


def _dead_login(budget: HostSessionBudget, address: str, since: float) -> None:
    """A slot left as a process killed mid-login leaves it."""
    slot = budget.try_acquire()
    assert slot is not None
    slot.note(LoginInFlight(address, since))
    slot.release(signed_out=False)


def test_a_live_logins_session_is_never_taken_for_a_dead_ones(
    nebula_server: NebulaTarget, nebula_admin: Any
) -> None:
    """A dead login and a live one in flight together, both sessions made and unnamed: the
    sweep leaves both until the live login names its own, then signs out the dead one's."""
    hooks = nebula_server.hooks()
    budget = HostSessionBudget(hooks.user, hooks.addresses, hooks.session_budget)
    time.sleep(0.05)  # the admin's session is older than the dead login
    _dead_login(budget, nebula_server.address, time.time())
    live = budget.try_acquire()
    assert live is not None
    live.note(LoginInFlight(nebula_server.address, time.time()))
    dead_pool, dead_session = _raw_session(nebula_server)  # the dead login's session
    live_pool, live_session = _raw_session(nebula_server)  # the live login's, not named yet
    lister = NebulaSession(hooks.addresses, hooks.user, hooks.password, None)
    sweep = threading.Thread(target=sweep_stale_sessions, args=(budget, lister))
    try:
        sweep.start()
        time.sleep(0.3)
        assert sweep.is_alive(), "the sweep did not wait for the live login"
        assert {dead_session._session_id, live_session._session_id} <= session_ids(nebula_admin)
        live.note(NamedSession(live_session._session_id, nebula_server.address))
        sweep.join(LOGIN_WINDOW_SECONDS + 5)
        listed = session_ids(nebula_admin)
        assert dead_session._session_id not in listed
        assert live_session._session_id in listed
        assert nebula_admin._session_id in listed
    finally:
        live_session.release()
        live.release(signed_out=True)
        dead_session._connection = None  # signed out by the sweep
        dead_pool.close()
        live_pool.close()


def test_a_dead_login_that_made_no_session_goes_when_its_window_closes(
    nebula_server: NebulaTarget, nebula_admin: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed before its request left: no session on graphd is taken for it, neither one made
    before it started (another client's) nor one made after its window closed."""
    monkeypatch.setattr(logins, "LOGIN_WINDOW_SECONDS", 0.3)  # the test need not wait 2 s
    hooks = nebula_server.hooks()
    budget = HostSessionBudget(hooks.user, hooks.addresses, hooks.session_budget)
    before = session_ids(nebula_admin)
    time.sleep(0.05)
    _dead_login(budget, nebula_server.address, time.time())
    time.sleep(0.4)
    later_pool, later_session = _raw_session(nebula_server)  # made after the window
    try:
        hooks.on_worker_died(0, None)
        assert before | {later_session._session_id} <= session_ids(nebula_admin)
        assert not any(isinstance(record, LoginInFlight) for record in _unheld_records(budget))
    finally:
        later_session.release()
        later_pool.close()
