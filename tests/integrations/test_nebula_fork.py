"""The fork hazards of nebula3 sessions are real, and per-process sessions avoid them.

1. Two forked children using the parent's session read each other's replies: ``YIELD <n>``
   comes back with another query's number.  With one session per process: never.
2. Releasing an inherited session in a child signs the parent out; dropping it through
   ``NebulaHooks.drop_inherited_session`` leaves the parent's session working.
"""

from __future__ import annotations

import gc
import multiprocessing
import time
from collections.abc import Callable
from typing import Any

from nebula3.common.ttypes import ErrorCode
from nebula3.Config import Config
from nebula3.gclient.net import ConnectionPool

from mploader.integrations.nebula import NebulaError, NebulaSession
from mploader.worker.hooks import (
    ProcessLocal,
    activate_hooks,
    close_worker_session,
    deactivate_hooks,
    worker_session,
)
from mploader.worker.info import make_worker_info
from nebula_testing.nebula_admin import session_ids
from tests.integrations.nebula_fixtures import NebulaTarget, wait_for

FORK = multiprocessing.get_context("fork")
HAMMER_SECONDS = 0.5  # long enough that both children surely run at the same time


def _yield_value(result: Any) -> Any:
    rows = result.rows() if result.is_succeeded() else []
    return rows[0].values[0].value if rows else None


def _hammer(
    get_session: Callable[[], Any],
    finish: Callable[[], None] | None,
    barrier: Any,
    base: int,
    results: Any,
) -> None:
    """Run ``YIELD <base+i>`` for a while; report (queries, wrong, errors, session id)."""
    session = get_session()
    session_id = getattr(session, "session_id", None)
    barrier.wait(timeout=30)
    deadline = time.monotonic() + HAMMER_SECONDS
    queries = wrong = errors = 0
    while time.monotonic() < deadline:
        expected = base + queries
        queries += 1
        try:
            got = _yield_value(session.execute(f"YIELD {expected} AS q"))
        except Exception:  # a reply torn between two readers, or a timeout: also the hazard
            errors += 1
            break
        wrong += got != expected
    if finish is not None:
        finish()
    results.put((queries, wrong, errors, session_id))


def _run_children(
    get_session: Callable[[], Any], finish: Callable[[], None] | None = None, children: int = 2
) -> tuple[int, int, list[Any]]:
    """Fork hammering children at once: total wrong answers, errors, their session ids."""
    barrier, results = FORK.Barrier(children), FORK.Queue()
    processes = [
        FORK.Process(
            target=_hammer, args=(get_session, finish, barrier, (index + 1) * 10**9, results)
        )
        for index in range(children)
    ]
    for process in processes:
        process.start()
    outcomes = [results.get(timeout=60) for _ in processes]
    for process in processes:
        process.join(timeout=30)
        assert process.exitcode == 0, f"a child exited with {process.exitcode}"
    assert all(outcome[0] > 1 for outcome in outcomes), outcomes
    wrong = sum(outcome[1] for outcome in outcomes)
    errors = sum(outcome[2] for outcome in outcomes)
    return wrong, errors, [outcome[3] for outcome in outcomes]


def _raw_pool_and_session(target: NebulaTarget, timeout_ms: int = 2000) -> tuple[Any, Any]:
    config = Config()
    config.timeout = timeout_ms  # a child left waiting for a stolen reply gives up
    pool = ConnectionPool()
    pool.init(target.addresses, config)
    return pool, pool.get_session(target.user, target.password)


def test_shared_inherited_session_mixes_up_replies(nebula_server: NebulaTarget) -> None:
    pool, shared = _raw_pool_and_session(nebula_server)
    try:
        assert _yield_value(shared.execute("YIELD 1 AS q")) == 1
        wrong = errors = 0
        for _ in range(5):  # one round nearly always shows it; retry so the test is not flaky
            round_wrong, round_errors, _ = _run_children(lambda: shared)
            wrong, errors = wrong + round_wrong, errors + round_errors
            if wrong:
                break
        assert wrong > 0, f"no mixed-up replies in 5 rounds (errors: {errors})"
    finally:
        connection, shared._connection = shared._connection, None
        connection.is_used = False  # its socket carries stray replies now: never reuse it
        pool.close()


def test_per_process_sessions_never_mix_up_replies(
    nebula_server: NebulaTarget, nebula_admin: Any
) -> None:
    hooks = nebula_server.hooks()
    local: ProcessLocal[NebulaSession] = ProcessLocal(hooks.open_session, close=NebulaSession.close)
    parent = local.get()  # the children inherit this one and must build their own

    def own_session() -> NebulaSession:
        session = local.get()
        assert session is not parent and session.session_id != parent.session_id
        return session

    wrong, errors, child_ids = _run_children(own_session, finish=local.close)
    assert (wrong, errors) == (0, 0)
    assert len(set(child_ids) | {parent.session_id}) == 3  # three processes, three sessions
    assert _yield_value(parent.execute("YIELD 77 AS q")) == 77  # the parent was not disturbed
    assert not set(child_ids) & session_ids(nebula_admin)  # the children signed out
    local.close()
    assert parent.session_id is None and parent.closed


def test_inherited_nebula_session_is_detached_in_the_child(nebula_server: NebulaTarget) -> None:
    hooks = nebula_server.hooks()
    parent = hooks.open_session()
    outcome = FORK.Queue()

    def child() -> None:
        hooks.drop_inherited_session(parent)
        try:
            parent.execute("YIELD 1 AS q")
        except NebulaError as error:
            outcome.put(str(error))
        else:
            outcome.put("executed on the parent's socket")

    process = FORK.Process(target=child)
    process.start()
    message = outcome.get(timeout=30)
    process.join(timeout=30)
    assert "inherited" in message and "worker_session" in message
    assert _yield_value(parent.execute("YIELD 5 AS q")) == 5
    parent.close()


def test_releasing_an_inherited_session_signs_the_parent_out(nebula_server: NebulaTarget) -> None:
    """The hazard drop_inherited_session prevents: nebula3's release() in a child."""
    pool, parent = _raw_pool_and_session(nebula_server)
    process = FORK.Process(target=parent.release)
    process.start()
    process.join(timeout=30)
    try:
        assert wait_for(
            lambda: parent.execute("YIELD 1 AS q").error_code() == ErrorCode.E_SESSION_INVALID
        )
    finally:
        pool.close()


def test_dropping_an_inherited_raw_session_keeps_the_parent_signed_in(
    nebula_server: NebulaTarget, nebula_admin: Any
) -> None:
    hooks = nebula_server.hooks()
    pool, parent = _raw_pool_and_session(nebula_server)
    holder = {"session": parent}

    def child() -> None:
        hooks.drop_inherited_session(holder.pop("session"))
        gc.collect()  # Session.__del__ would release (sign out) if it still had a connection

    process = FORK.Process(target=child)
    process.start()
    process.join(timeout=30)
    assert process.exitcode == 0
    assert _yield_value(parent.execute("YIELD 9 AS q")) == 9
    assert parent._session_id in session_ids(nebula_admin)
    parent.release()
    pool.close()


def test_worker_session_is_rebuilt_in_a_forked_child(
    nebula_server: NebulaTarget, nebula_admin: Any
) -> None:
    activate_hooks(nebula_server.hooks(), make_worker_info(0, 1, 0, None))
    try:
        parent = worker_session()
        outcome = FORK.Queue()

        def child() -> None:
            mine = worker_session()
            outcome.put((mine.session_id, _yield_value(mine.execute("YIELD 11 AS q"))))
            close_worker_session()

        process = FORK.Process(target=child)
        process.start()
        child_id, answer = outcome.get(timeout=30)
        process.join(timeout=30)
        assert answer == 11 and child_id != parent.session_id
        assert wait_for(lambda: child_id not in session_ids(nebula_admin))
        assert worker_session() is parent
        assert _yield_value(parent.execute("YIELD 12 AS q")) == 12
        parent_id = parent.session_id
    finally:
        close_worker_session()
        deactivate_hooks()
    assert parent_id not in session_ids(nebula_admin)
