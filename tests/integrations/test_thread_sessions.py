"""``worker_threads``: a worker's fetch threads share its NebulaGraph sessions, against the
bundled graphd.

nebula3 sessions are not thread-safe (one socket, replies matched by order), so a session is
borrowed for one statement at a time: at most T sessions per worker, none shared between
processes, every answer its own query's under concurrent queries, and every session signed out
when the workers exit.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest
import torch

import mploader
from nebula_testing.nebula_admin import session_ids
from tests.integrations.nebula_fixtures import NebulaTarget, sessions_left_since

from .loader_datasets import FetchFeatures, YieldPerFetchThread

START_METHODS = ["fork", "spawn", "forkserver"]
THREADS = 4

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("start_method", START_METHODS)
def test_fetch_threads_share_their_workers_sessions_closed_at_exit(
    nebula_server: NebulaTarget, nebula_admin: Any, start_method: str
) -> None:
    before = session_ids(nebula_admin)
    loader = mploader.DataLoader(
        YieldPerFetchThread(160), batch_size=8, num_workers=2, worker_threads=THREADS,
        multiprocessing_context=start_method, worker_hooks=nebula_server.hooks(),
    )
    rows = torch.cat(list(loader))
    assert rows[:, 0].tolist() == list(range(160))
    assert torch.equal(rows[:, 0], rows[:, 1]), "a reply went to another thread's query"
    sessions_of_worker: dict[int, set[int]] = defaultdict(set)
    workers_of_session: dict[int, set[int]] = defaultdict(set)
    for _, _, pid, _, session in rows.tolist():
        sessions_of_worker[pid].add(session)
        workers_of_session[session].add(pid)
    assert len(sessions_of_worker) == 2
    assert all(len(owners) == 1 for owners in workers_of_session.values())  # never shared
    assert all(1 <= len(s) <= THREADS for s in sessions_of_worker.values())  # at most T each
    assert not sessions_left_since(nebula_admin, before)  # all signed out at exit


def test_persistent_workers_keep_their_thread_sessions_across_epochs(
    nebula_server: NebulaTarget, nebula_admin: Any
) -> None:
    before = session_ids(nebula_admin)
    loader = mploader.DataLoader(
        YieldPerFetchThread(48), batch_size=4, num_workers=2, worker_threads=3,
        persistent_workers=True, worker_hooks=nebula_server.hooks(),
        multiprocessing_context="fork",
    )
    epochs = [torch.cat(list(loader)) for _ in range(2)]
    assert all(torch.equal(rows[:, 0], rows[:, 1]) for rows in epochs)
    first, second = ({int(s) for s in rows[:, 4]} for rows in epochs)
    assert 2 <= len(first | second) <= 2 * 3
    assert first | second <= session_ids(nebula_admin)  # kept open between epochs
    loader._iterator._shutdown_workers()
    assert not sessions_left_since(nebula_admin, before)


def test_feature_store_works_unchanged_with_fetch_threads(nebula_server: NebulaTarget) -> None:
    loader = mploader.DataLoader(
        FetchFeatures(nebula_server.feature_store(), 96), batch_size=16, num_workers=2,
        worker_threads=4, worker_hooks=nebula_server.hooks(), multiprocessing_context="fork",
    )
    batches = list(loader)
    graph = nebula_server.graph
    assert torch.equal(torch.cat([b[0] for b in batches]), torch.from_numpy(graph.features[:96]))
    assert torch.equal(torch.cat([b[1] for b in batches]), torch.from_numpy(graph.labels[:96]))
