"""Per-worker NebulaGraph sessions through mploader.DataLoader, for fork, spawn and forkserver."""

from __future__ import annotations

import multiprocessing
import socket
from typing import Any

import pytest
import torch

import mploader
from mploader.integrations.nebula import NebulaAuthError, NebulaConnectionError
from nebula_testing.nebula_admin import session_ids
from tests.integrations.nebula_fixtures import NebulaTarget, sessions_left_since

from .loader_datasets import FetchFeatures, YieldThroughInheritedSession, YieldThroughWorkerSession

START_METHODS = ["fork", "spawn", "forkserver"]
QUERIES = 400


def _rows(loader: Any) -> torch.Tensor:
    return torch.cat(list(loader))


def test_the_fork_hazard_is_real_with_an_inherited_session(nebula_server: NebulaTarget) -> None:
    """torch's DataLoader, fork, 4 workers, one session made in the parent: wrong answers.

    A worker whose reply another process consumed would wait forever; a 2 s socket timeout turns
    that into an error, counted as a wrong answer.
    """
    from nebula3.Config import Config
    from nebula3.gclient.net import ConnectionPool

    config = Config()
    config.timeout = 2000  # milliseconds
    pool = ConnectionPool()
    pool.init(nebula_server.addresses, config)
    session = pool.get_session(nebula_server.user, nebula_server.password)
    assert session.execute(f"USE `{nebula_server.space}`").is_succeeded()
    try:
        wrong = 0
        for _ in range(5):  # the race shows on every run seen so far; retries make it certain
            loader = torch.utils.data.DataLoader(
                YieldThroughInheritedSession(session, QUERIES), batch_size=8, num_workers=4,
                multiprocessing_context="fork", timeout=60,
            )
            rows = _rows(loader)
            wrong += int((rows[:, 0] != rows[:, 1]).sum())
            if wrong:
                break
        assert wrong > 0, "four processes sharing one inherited session never got a wrong answer"
    finally:
        pool.close()


@pytest.mark.parametrize("start_method", START_METHODS)
def test_worker_sessions_give_no_wrong_answers(nebula_server: NebulaTarget, nebula_admin: Any,
                                               start_method: str) -> None:
    before = session_ids(nebula_admin)
    loader = mploader.DataLoader(
        YieldThroughWorkerSession(QUERIES), batch_size=8, num_workers=4,
        multiprocessing_context=start_method, worker_hooks=nebula_server.hooks(),
    )
    rows = _rows(loader)
    assert rows[:, 0].tolist() == list(range(QUERIES))
    assert torch.equal(rows[:, 0], rows[:, 1])  # every answer is its own query's
    pids, sessions = set(rows[:, 2].tolist()), set(rows[:, 3].tolist())
    assert len(pids) == 4 and len(sessions) == 4  # one session per worker, made once
    assert not sessions_left_since(nebula_admin, before)  # signed out at worker exit


def test_sessions_are_recreated_for_new_workers_and_kept_by_persistent_ones(
    nebula_server: NebulaTarget, nebula_admin: Any
) -> None:
    before = session_ids(nebula_admin)
    fresh = mploader.DataLoader(YieldThroughWorkerSession(40), batch_size=4, num_workers=2,
                                worker_hooks=nebula_server.hooks())
    epochs = [_rows(fresh) for _ in range(2)]
    first, second = ({int(s) for s in rows[:, 3]} for rows in epochs)
    assert len(first) == len(second) == 2 and not first & second  # new pids, new sessions

    persistent = mploader.DataLoader(YieldThroughWorkerSession(40), batch_size=4, num_workers=2,
                                     worker_hooks=nebula_server.hooks(), persistent_workers=True)
    epochs = [_rows(persistent) for _ in range(3)]
    assert all(torch.equal(rows[:, 0], rows[:, 1]) for rows in epochs)
    kept = [{int(s) for s in rows[:, 3]} for rows in epochs]
    assert kept[0] == kept[1] == kept[2] and len(kept[0]) == 2
    assert kept[0] <= session_ids(nebula_admin)  # still open between epochs
    persistent._iterator._shutdown_workers()
    assert not sessions_left_since(nebula_admin, before)


def test_hooks_run_in_the_main_process_without_workers(nebula_server: NebulaTarget,
                                                       nebula_admin: Any) -> None:
    before = session_ids(nebula_admin)
    loader = mploader.DataLoader(YieldThroughWorkerSession(12), batch_size=4,
                                 worker_hooks=nebula_server.hooks())
    rows = _rows(loader)
    assert torch.equal(rows[:, 0], rows[:, 1])
    assert set(rows[:, 2].tolist()) == {multiprocessing.current_process().pid}
    assert len(set(rows[:, 3].tolist())) == 1
    assert not sessions_left_since(nebula_admin, before)


@pytest.mark.parametrize("start_method", START_METHODS)
def test_feature_store_through_workers(nebula_server: NebulaTarget, start_method: str) -> None:
    loader = mploader.DataLoader(
        FetchFeatures(nebula_server.feature_store(), 64), batch_size=16, num_workers=2,
        multiprocessing_context=start_method, worker_hooks=nebula_server.hooks(),
    )
    features = torch.cat([batch[0] for batch in loader])
    labels = torch.cat([batch[1] for batch in mploader.DataLoader(
        FetchFeatures(nebula_server.feature_store(), 64), batch_size=16, num_workers=2,
        multiprocessing_context=start_method, worker_hooks=nebula_server.hooks())])
    graph = nebula_server.graph
    assert torch.equal(features, torch.from_numpy(graph.features[:64]))
    assert torch.equal(labels, torch.from_numpy(graph.labels[:64]))


def test_a_parent_holding_its_own_session_keeps_it(nebula_server: NebulaTarget,
                                                   nebula_admin: Any) -> None:
    hooks = nebula_server.hooks()
    parent = hooks.open_session()
    try:
        loader = mploader.DataLoader(YieldThroughWorkerSession(40), batch_size=4, num_workers=2,
                                     multiprocessing_context="fork", worker_hooks=hooks)
        rows = _rows(loader)
        assert torch.equal(rows[:, 0], rows[:, 1])
        assert parent.session_id in session_ids(nebula_admin)  # not signed out by any child
        assert parent.execute("YIELD 12345 AS q").rows()[0].values[0].get_iVal() == 12345
        assert parent.reconnects == 0
    finally:
        parent.close()


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_server_down_is_a_clear_error_naming_it(nebula_server: NebulaTarget) -> None:
    port = _closed_port()
    # a short wait for graphd (the default rides out a restart: 60 s of this suite's time)
    hooks = nebula_server.hooks(addresses=[("127.0.0.1", port)], retry_seconds=2)
    loader = mploader.DataLoader(YieldThroughWorkerSession(8), batch_size=4, num_workers=2,
                                 worker_hooks=hooks)
    with pytest.raises(NebulaConnectionError, match=rf"127\.0\.0\.1:{port}") as caught:
        list(loader)
    assert any("worker" in note for note in caught.value.__notes__)
    del caught


def test_wrong_credentials_name_the_user(nebula_server: NebulaTarget) -> None:
    if nebula_server.real:
        pytest.skip("a real graphd with default settings accepts any password")
    hooks = nebula_server.hooks(password="not-the-password")
    loader = mploader.DataLoader(YieldThroughWorkerSession(8), batch_size=4, num_workers=2,
                                 worker_hooks=hooks)
    with pytest.raises(NebulaAuthError, match=nebula_server.user) as caught:
        list(loader)
    del caught


def test_connection_dropped_mid_epoch_reconnects_once(nebula_server: NebulaTarget,
                                                      nebula_admin: Any) -> None:
    if nebula_server.real:
        pytest.skip("dropping connections needs the test server's DEBUG statement")
    loader = mploader.DataLoader(YieldThroughWorkerSession(80), batch_size=4, num_workers=2,
                                 worker_hooks=nebula_server.hooks())
    rows = []
    for index, batch in enumerate(loader):
        rows.append(batch)
        if index == 3:  # every worker connection is cut under the loader's feet
            assert nebula_admin.execute("DEBUG DROP CONNECTIONS").is_succeeded()
    result = torch.cat(rows)
    assert result[:, 0].tolist() == list(range(80))
    assert torch.equal(result[:, 0], result[:, 1])
    assert len(set(result[:, 3].tolist())) > 2  # the workers' sessions were replaced
