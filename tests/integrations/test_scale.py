"""NebulaGraph at the scale of a real job, against the bundled graphd with graphd's rules on.

graphd caps sessions per user and client IP (300 by default), keeps a dead client's sessions
until they idle out, expires idle ones, refuses statements over 4 MiB, and restarts.  Each test
switches the rule it needs on (the shared ``nebula_server`` runs graphd's defaults).
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import re
import signal
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import psutil
import pytest
import torch
from torch.utils.data import DistributedSampler

import mploader
from mploader.integrations.nebula import (
    NebulaConnectionError,
    NebulaFeatureStore,
    NebulaHooks,
    NebulaQueryError,
    NebulaSessionLimitError,
    PooledSession,
    split_id_statements,
)
from mploader.integrations.nebula.budget import HostSessionBudget
from nebula_testing import citation
from nebula_testing.nebula_admin import AdminSession, session_ids
from nebula_testing.nebula_process import NebulaServerProcess, start_server_process
from tests.integrations.nebula_fixtures import NebulaTarget, sessions_left_since, wait_for

from .loader_datasets import FetchAll, KillOnceAt, QueryThenSleep, YieldPerFetchThread

pytestmark = pytest.mark.timeout(120)

NODES = 60


def _server(**rules: Any) -> NebulaServerProcess:
    return start_server_process(
        preload="citation", nodes=NODES, feature_dim=4, classes=3, cites_per_node=2, **rules
    )


def _hooks(server: NebulaServerProcess, **overrides: Any) -> NebulaHooks:
    return _hooks_at(server.address, **overrides)


def _hooks_at(address: str, **overrides: Any) -> NebulaHooks:
    return NebulaHooks([address], space=citation.CITATION_SPACE, **overrides)


class _Admin(AdminSession):
    """The admin session; :meth:`watch` samples the count meanwhile."""

    def __init__(self, address: str) -> None:
        super().__init__(address)
        self.high_water = 0

    @contextlib.contextmanager
    def watch(self) -> Iterator[None]:
        """Sample the sessions (the admin's own included, as graphd counts it) every 20 ms."""
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(0.02):
                with contextlib.suppress(Exception):
                    self.high_water = max(self.high_water, len(self.others()) + 1)

        thread = threading.Thread(target=sample, daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()


@pytest.fixture(scope="module")
def capped() -> Iterator[NebulaServerProcess]:
    """graphd with an administrator's tighter cap of 24 and 2 ms per statement."""
    with _server(max_sessions_per_ip_per_user=24, latency_ms=2) as server:
        yield server


@pytest.fixture(scope="module")
def strict() -> Iterator[NebulaServerProcess]:
    """graphd with a cap of 3, a 1 s idle timeout and 2000-byte statements."""
    with _server(
        max_sessions_per_ip_per_user=3, session_idle_timeout_secs=1, max_allowed_query_size=2000
    ) as server:
        yield server


def _check_every_item_once(rows: torch.Tensor, length: int) -> None:
    assert sorted(rows[:, 0].tolist()) == list(range(length))
    assert torch.equal(rows[:, 0], rows[:, 1]), "a reply went to another statement"


# ----------------------------------------------------------------------------- the server


def test_the_bundled_server_enforces_graphds_session_rules(strict: NebulaServerProcess) -> None:
    from nebula3.Config import Config
    from nebula3.Exception import AuthFailedException
    from nebula3.gclient.net import ConnectionPool

    pool = ConnectionPool()
    host, port = strict.address.rsplit(":", 1)
    pool.init([(host, int(port))], Config())
    try:
        first, second, third = (pool.get_session("root", "nebula") for _ in range(3))
        with pytest.raises(AuthFailedException) as refused:
            pool.get_session("root", "nebula")
        assert (  # nebula3 wraps graphd's text as 'Auth failed: b"..."'
            "Create Session failed: Too many sessions created from 127.0.0.1 by user root. the "
            "threshold is 3. You can change it by modifying 'max_sessions_per_ip_per_user' in "
            "nebula-graphd.conf"
        ) in str(refused.value.message)
        listed = session_ids(first)
        assert {second._session_id, third._session_id} <= listed
        assert first.execute("YIELD 1 AS q" + " " * 2000).error_msg().startswith(
            "Query is too large")
        third._connection.close()  # a client dying without signing out: its session stays
        assert third._session_id in session_ids(first)
        assert first.execute(f"KILL SESSION {third._session_id}").is_succeeded()
        assert third._session_id not in session_ids(first)
        time.sleep(1.3)  # over session_idle_timeout_secs
        expired = second.execute("YIELD 1 AS q")
        assert expired.error_code() == -1002 and expired.error_msg() == "Session not existed!"
        first.release()
    finally:
        pool.close()


# ----------------------------------------------------------------------------- the cap


def test_512_fetch_threads_stay_under_graphds_default_cap_of_300() -> None:
    with _server(latency_ms=2) as server:
        admin = _Admin(server.address)
        try:
            loader = mploader.DataLoader(
                YieldPerFetchThread(2048, delay=0.05), batch_size=2, num_workers=4,
                worker_threads=128, worker_hooks=_hooks(server), multiprocessing_context="fork",
            )
            with admin.watch():
                rows = torch.cat(list(loader))
            _check_every_item_once(rows, 2048)
            sessions = {int(s) for s in rows[:, 4]}
            assert 4 <= len(sessions) <= 240  # the host's budget, under graphd's 300
            assert admin.high_water <= 241
            assert wait_for(lambda: not admin.others())
        finally:
            admin.close()


def test_a_cap_of_24_with_128_threads_slows_down_instead_of_failing(
    capped: NebulaServerProcess,
) -> None:
    admin = _Admin(capped.address)
    try:
        loader = mploader.DataLoader(
            YieldPerFetchThread(512, delay=0.02), batch_size=2, num_workers=4, worker_threads=32,
            worker_hooks=_hooks(capped), multiprocessing_context="fork",
        )
        with admin.watch():
            rows = torch.cat(list(loader))
        _check_every_item_once(rows, 512)
        assert len(set(rows[:, 2].tolist())) == 4  # every worker got sessions
        assert admin.high_water <= 24
        assert wait_for(lambda: not admin.others())
    finally:
        admin.close()


def test_no_session_at_all_within_retry_seconds_is_a_session_limit_error() -> None:
    """graphd's cap of 1 is held by another client (the admin): a worker cannot get even one
    session, so after ``retry_seconds`` the loader fails, naming the cap, what this host holds
    and the ways out; nothing is left running."""
    with _server(max_sessions_per_ip_per_user=1) as server:
        admin = _Admin(server.address)  # the only session graphd allows this user and IP
        try:
            servers = {child.pid for child in psutil.Process().children()}
            loader = mploader.DataLoader(
                YieldPerFetchThread(16, delay=0.0), batch_size=4, num_workers=2,
                worker_threads=2, worker_hooks=_hooks(server, retry_seconds=1),
                multiprocessing_context="fork",
            )
            started = time.monotonic()
            with pytest.raises(NebulaSessionLimitError) as caught:
                list(loader)
            assert time.monotonic() - started < 1 + 10
            message = str(caught.value)
            assert f"no session on NebulaGraph at {server.address}" in message
            assert "within 1 s" in message
            assert "max_sessions_per_ip_per_user" in message  # the cap...
            assert "the threshold is 1" in message  # ...as graphd refused it
            # this host's sessions: none, but each of the 2 workers may hold a slot for a login
            held = re.search(r"hold (\d+) of its budget of 240 sessions", message)
            assert held is not None and int(held.group(1)) <= 2, message
            assert "Ways out" in message and "KILL SESSION" in message
            del loader, caught
            gc.collect()
            assert wait_for(
                lambda: {child.pid for child in psutil.Process().children()} <= servers,
                timeout=10)
            assert not admin.others()
        finally:
            admin.close()


def test_one_graphd_spelled_two_ways_has_one_budget(capped: NebulaServerProcess) -> None:
    """"localhost:P" and "127.0.0.1:P" are one graphd, whose cap counts both: they share one
    budget (here of 1 session), as does an address list in another order."""
    port = capped.port
    by_name = _hooks_at(f"localhost:{port}", session_budget=1, retry_seconds=0.5)
    by_ip = _hooks_at(f"127.0.0.1:{port}", session_budget=1, retry_seconds=0.5)
    holder = PooledSession(by_name.session_pool())
    try:
        assert holder.session_id is not None  # takes the budget's only slot
        with pytest.raises(NebulaSessionLimitError, match="hold 1 of its budget of 1 sessions"):
            PooledSession(by_ip.session_pool()).session_id  # noqa: B018
    finally:
        holder.close()
    assert PooledSession(by_ip.session_pool()).session_id is not None  # the slot is free again
    by_ip.session_pool().close()
    listed = HostSessionBudget("root", [("localhost", port), ("127.0.0.2", 9669)], 1)
    reordered = HostSessionBudget("root", [("127.0.0.2", 9669), ("127.0.0.1", port)], 1)
    assert listed.directory == reordered.directory
    assert HostSessionBudget("root", [("127.0.0.1", port + 1)], 1).directory != listed.directory


def test_a_session_freed_after_many_refusals_is_had_within_a_short_deadline(
    capped: NebulaServerProcess,
) -> None:
    """A pool refused by a full budget until its backoff between logins (1-2 s) outlasts its
    statements' deadline (0.1 s): once the budget's session is given back, a new statement
    still gets it, as the deadline's error would be a lie (no login was even tried)."""
    holder = PooledSession(_hooks(capped, session_budget=1).session_pool())
    waiter = _hooks(capped, session_budget=1, retry_seconds=0.1).session_pool()
    handles = [PooledSession(waiter)]
    try:
        assert holder.session_id is not None  # the budget's only session
        while waiter.refusals < 5:  # the 5th refusal makes it wait 0.8 s or more to log in
            with pytest.raises(NebulaSessionLimitError):
                handles[-1].session_id  # noqa: B018
            handles.append(PooledSession(waiter))
        holder.close()
        assert handles[-1].session_id is not None
    finally:
        holder.close()
        for handle in handles:
            handle.close()


def test_past_its_deadline_a_thread_hears_how_the_login_under_way_ended() -> None:
    """A graphd that takes connections and never answers (hung): one fetch thread's login is
    under way (1.5 s socket timeout) when another's deadline (0.5 s) passes.  Both hear that
    graphd did not answer (NebulaConnectionError), not that sessions ran out."""
    from nebula3.Config import Config

    config = Config()
    config.timeout = 1500
    with socket.create_server(("127.0.0.1", 0)) as hung:
        address = f"127.0.0.1:{hung.getsockname()[1]}"
        pool = NebulaHooks([address], config=config, retry_seconds=0.5).session_pool()
        errors: dict[str, BaseException] = {}

        def borrow(name: str) -> None:
            handle = PooledSession(pool)
            try:
                handle.execute("YIELD 1 AS q")
            except BaseException as error:
                errors[name] = error
            finally:
                handle.close()

        first = threading.Thread(target=borrow, args=("first",))
        first.start()
        accepted, _ = hung.accept()  # the first thread's login is under way
        second = threading.Thread(target=borrow, args=("second",))
        second.start()
        first.join(30)
        second.join(30)
        accepted.close()
    assert set(errors) == {"first", "second"}
    for error in errors.values():
        assert isinstance(error, NebulaConnectionError), repr(error)
        assert address in str(error) and "retry_seconds=0.5" in str(error)


# ----------------------------------------------------------------------------- releasing


def test_a_sigkilled_workers_sessions_are_gone_after_the_epoch(
    nebula_server: NebulaTarget, nebula_admin: Any, tmp_path: Any
) -> None:
    before = session_ids(nebula_admin)
    dataset = KillOnceAt(96, victim=40, marker=str(tmp_path / "killed"), delay=0.01)
    loader = mploader.DataLoader(
        dataset, batch_size=4, num_workers=2, worker_threads=8, max_worker_restarts=1,
        worker_hooks=nebula_server.hooks(), multiprocessing_context="fork",
    )
    rows = torch.cat(list(loader))
    _check_every_item_once(rows, 96)
    assert os.path.exists(tmp_path / "killed")
    # none of this loader's sessions is left (another test's may still be signing out: <=)
    assert wait_for(lambda: session_ids(nebula_admin) <= before)


def _ignore_sigterm(worker_id: int) -> None:
    """``worker_init_fn`` of a worker that only SIGKILL ends."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


@pytest.mark.parametrize("worker_init_fn", [None, _ignore_sigterm],
                         ids=["sigterm-ends-it", "sigterm-ignored-sigkill-ends-it"])
def test_sessions_of_workers_the_shutdown_had_to_kill_are_signed_out(
    nebula_server: NebulaTarget, nebula_admin: Any, worker_init_fn: Any
) -> None:
    """Workers stuck in an item (60 s) with their sessions open when the loader stops (here
    its ``timeout``): the shutdown terminates or kills them, and their sessions go with them."""
    before = session_ids(nebula_admin)
    loader = mploader.DataLoader(
        QueryThenSleep(64, delay=60.0), batch_size=2, num_workers=2, worker_threads=2,
        timeout=1, worker_init_fn=worker_init_fn, worker_hooks=nebula_server.hooks(),
        multiprocessing_context="fork",
    )
    iterator = iter(loader)
    workers = [process.pid for process in iterator._workers]
    assert wait_for(lambda: len(session_ids(nebula_admin) - before) >= 2, timeout=20)
    with pytest.raises(RuntimeError, match="timed out"):
        next(iterator)
    assert not any(psutil.pid_exists(pid) for pid in workers)
    assert wait_for(lambda: not session_ids(nebula_admin) - before, timeout=3)


def _run_and_get_killed(address: str, ready: Any) -> None:
    """A main process whose workers are mid-statement when it is SIGKILLed."""
    hooks = NebulaHooks([address], space=citation.CITATION_SPACE)
    loader = mploader.DataLoader(
        QueryThenSleep(64, delay=30.0), batch_size=2, num_workers=2, worker_threads=2,
        worker_hooks=hooks, multiprocessing_context="fork",
    )
    iterator = iter(loader)
    ready.put([child.pid for child in psutil.Process().children()])
    next(iterator)


def test_workers_of_a_killed_main_process_sign_their_sessions_out(
    nebula_server: NebulaTarget, nebula_admin: Any
) -> None:
    before = session_ids(nebula_admin)
    context = multiprocessing.get_context("fork")
    ready = context.Queue()
    main = context.Process(target=_run_and_get_killed, args=(nebula_server.address, ready))
    main.start()
    workers = ready.get(timeout=30)
    assert wait_for(lambda: len(session_ids(nebula_admin) - before) >= 2, timeout=20)
    main.kill()
    main.join()
    assert not sessions_left_since(nebula_admin, before, timeout=15)  # the watchdog path
    assert wait_for(lambda: not any(psutil.pid_exists(pid) for pid in workers), timeout=10)


def test_expired_sessions_are_renewed_between_epochs(strict: NebulaServerProcess) -> None:
    loader = mploader.DataLoader(
        YieldPerFetchThread(24, delay=0.0), batch_size=4, num_workers=1, worker_threads=2,
        persistent_workers=True, worker_hooks=_hooks(strict), multiprocessing_context="fork",
    )
    first = torch.cat(list(loader))
    time.sleep(1.5)  # the idle timeout is 1 s: graphd forgets every session of the worker
    second = torch.cat(list(loader))
    _check_every_item_once(first, 24)
    _check_every_item_once(second, 24)
    assert not {int(s) for s in first[:, 4]} & {int(s) for s in second[:, 4]}  # new sessions
    del loader


# ----------------------------------------------------------------------------- restarts


def test_graphd_stopped_for_2_s_mid_epoch_every_item_comes_once() -> None:
    with _server(latency_ms=1) as server:
        loader = mploader.DataLoader(
            YieldPerFetchThread(240, delay=0.02), batch_size=4, num_workers=2, worker_threads=4,
            worker_hooks=_hooks(server), multiprocessing_context="fork",
        )
        port, rows = server.port, []
        for step, batch in enumerate(loader):
            rows.append(batch)
            if step == 5:
                server.stop()
                threading.Timer(2.0, server.start, kwargs={"port": port}).start()
        _check_every_item_once(torch.cat(rows), 240)


def test_graphd_gone_for_good_is_a_connection_error_within_retry_seconds() -> None:
    server = _server()
    address = server.address
    loader = mploader.DataLoader(
        YieldPerFetchThread(64, delay=0.0), batch_size=4, num_workers=2, worker_threads=2,
        worker_hooks=_hooks(server, retry_seconds=3), multiprocessing_context="fork",
    )
    servers = {child.pid for child in psutil.Process().children()}  # module fixtures' graphds
    iterator = iter(loader)
    next(iterator)
    server.stop()
    started = time.monotonic()
    with pytest.raises(NebulaConnectionError) as caught:
        for _ in iterator:
            pass
    assert time.monotonic() - started < 3 + 10
    assert address in str(caught.value) and "retry_seconds=3" in str(caught.value)
    del iterator, loader, caught
    gc.collect()  # the error's traceback frames hold the iterator in a cycle
    assert wait_for(  # nothing left running
        lambda: {child.pid for child in psutil.Process().children()} <= servers, timeout=10)


def test_graphd_gone_while_a_login_sets_its_space_is_a_connection_error() -> None:
    """graphd goes away after it signed a session in and before it answered the session's
    ``USE space`` (each statement takes 3 s here; graphd dies 1 s into the login): the login
    fails as graphd out of reach, so the statement backs off and ends, after
    ``retry_seconds``, in :class:`NebulaConnectionError`."""
    server = _server(latency_ms=3000)
    address = server.address
    handle = PooledSession(_hooks(server, retry_seconds=0.5).session_pool())
    errors: list[BaseException] = []

    def run() -> None:
        try:
            handle.execute("YIELD 1 AS q")
        except BaseException as error:
            errors.append(error)

    borrower = threading.Thread(target=run)
    borrower.start()
    time.sleep(1.0)  # signed in at once; its USE takes 3 s
    server.kill()  # a crash: the USE gets no answer
    borrower.join(30)
    handle.close()
    assert len(errors) == 1 and isinstance(errors[0], NebulaConnectionError), errors
    assert address in str(errors[0]) and "retry_seconds=0.5" in str(errors[0])


# ----------------------------------------------------------------------------- statement size


def test_a_fetch_over_4_mib_is_split(nebula_server: NebulaTarget) -> None:
    if nebula_server.real:
        pytest.skip("needs graphd's default max_allowed_query_size")
    head = f"FETCH PROP ON `{citation.PAPER_TAG}` "
    tail = f" YIELD id(vertex) AS vid, `{citation.PAPER_TAG}`.`{citation.LABEL_PROP}` AS label"
    # Over 4 MiB of ids (long ones: fewer to parse); the graph has the first 300.
    vids = [*range(nebula_server.graph.num_nodes), *range(10**17, 10**17 + 220_000)]
    with nebula_server.hooks().open_session() as session:
        whole = head + ", ".join(map(str, vids)) + tail
        with pytest.raises(NebulaQueryError, match="Query is too large"):
            session.execute_json(whole)
        pieces = list(split_id_statements(head, vids, tail))
        assert len(pieces) == 2 and all(len(p) <= 4 * 1024 * 1024 for p in pieces)
        found = Counter(
            entry["row"][0]
            for piece in pieces
            for entry in session.execute_json(piece)["results"][0]["data"]
        )
    assert found == Counter(range(nebula_server.graph.num_nodes))


def test_the_feature_store_splits_a_fetch_over_graphds_4_mib(nebula_server: NebulaTarget) -> None:
    """The store fetches the graph's 300 vertices and 210,000 long ids no vertex has (over
    4 MiB of ids, graphd's default max_allowed_query_size) in one call with a large
    ``batch_size``: one statement is "Query is too large"; the store's split statements all
    run, and it finds every vertex there is (its error names exactly the absent ids)."""
    if nebula_server.real:
        pytest.skip("needs graphd's default max_allowed_query_size")
    absent = 210_000  # 21 bytes each with ", "
    vids = [*range(nebula_server.graph.num_nodes), *range(10**18, 10**18 + absent)]
    with nebula_server.hooks().open_session() as session:
        store = nebula_server.feature_store(batch_size=1_000_000, session=lambda: session)
        unsplit = nebula_server.feature_store(batch_size=1_000_000, session=lambda: session,
                                              max_query_bytes=2**40)
        with pytest.raises(NebulaQueryError, match="Query is too large"):
            unsplit.fetch(vids)
        with pytest.raises(KeyError) as missing:
            store.fetch(vids)
    assert missing.value.args[0].startswith(f"{absent} vertices have no `{citation.PAPER_TAG}'")
    assert f"(first: [{10**18}, " in missing.value.args[0]


def test_the_feature_store_splits_below_the_servers_limit(strict: NebulaServerProcess) -> None:
    graph = citation.make_citation_graph(NODES, 4, 3, 0, 2)
    store = NebulaFeatureStore(
        citation.PAPER_TAG, citation.FEATURE_PROP, citation.LABEL_PROP, feature_dim=4,
        batch_size=1_000_000, max_query_bytes=2000,  # one statement would be ~2.5 KB
    )
    loader = mploader.DataLoader(
        FetchAll(store, NODES), batch_size=None, num_workers=1,
        worker_hooks=_hooks(strict), multiprocessing_context="fork",
    )
    (features, labels), = list(loader)
    assert torch.equal(features, torch.from_numpy(graph.features))
    assert torch.equal(labels, torch.from_numpy(graph.labels))


# ----------------------------------------------------------------------------- ranks


def _rank(address: str, rank: int, ranks: int, threads: int, items: int, delay: float,
          results: Any) -> None:
    dataset = YieldPerFetchThread(items, delay=delay)
    sampler = DistributedSampler(dataset, num_replicas=ranks, rank=rank, shuffle=True, seed=3)
    loader = mploader.DataLoader(
        dataset, batch_size=4, sampler=sampler, num_workers=2, worker_threads=threads,
        worker_hooks=NebulaHooks([address], space=citation.CITATION_SPACE),
        multiprocessing_context="fork",
    )
    try:
        rows = torch.cat(list(loader))
        results.put((rank, rows[:, 0].tolist(), bool(torch.equal(rows[:, 0], rows[:, 1])), ""))
    except BaseException as error:
        results.put((rank, [], False, repr(error)))



@contextlib.contextmanager
def _server_for_ranks(cap: int | None, capped: Any) -> Iterator[NebulaServerProcess]:
    if cap is None:  # graphd's defaults, and statements of 200 ms (the job): every
        # fetch thread wants a session at once, more than the cap
        with _server(latency_ms=200) as server:
            yield server
    else:
        yield capped


@pytest.mark.parametrize(("cap", "threads", "items", "delay", "high_water_limit"), [
    # graphd's default cap of 300, 320 fetch threads: the host's budget of 240 (+ the admin)
    (None, 40, 1280, 0.0, 241),
    # an administrator's cap of 24, 64 fetch threads
    (24, 8, 384, 0.01, 24),
], ids=["graphds-defaults-320-threads", "cap-24-64-threads"])
def test_ranks_x_workers_x_threads_over_the_cap_see_every_sample_once(
    cap: int | None, threads: int, items: int, delay: float, high_water_limit: int,
    request: pytest.FixtureRequest,
) -> None:
    """4 ranks x 2 workers x T threads, more fetch threads than graphd's cap, with
    DistributedSampler: each sample once per epoch across ranks, no failure, 0 sessions left.
    The sessions on graphd (the admin's own included) never pass the budget, or the cap."""
    ranks = 4
    capped = request.getfixturevalue("capped") if cap is not None else None
    with _server_for_ranks(cap, capped) as server:
        admin = _Admin(server.address)
        context = multiprocessing.get_context("fork")
        results = context.Queue()
        try:
            with admin.watch():
                processes = [
                    context.Process(target=_rank, args=(server.address, rank, ranks, threads,
                                                        items, delay, results))
                    for rank in range(ranks)
                ]
                for process in processes:
                    process.start()
                outcomes = [results.get(timeout=90) for _ in range(ranks)]
                for process in processes:
                    process.join(30)
            errors = [error for _, _, _, error in outcomes if error]
            assert not errors
            assert all(right for _, _, right, _ in outcomes)
            seen = Counter(index for _, indices, _, _ in outcomes for index in indices)
            assert seen == Counter(range(items))
            print(f"session high-water mark: {admin.high_water} (cap {cap or 300}, "
                  f"{ranks * 2 * threads} fetch threads)")
            assert admin.high_water <= high_water_limit
            assert wait_for(lambda: not admin.others())
        finally:
            admin.close()
