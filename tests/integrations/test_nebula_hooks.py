"""NebulaHooks, NebulaSession and NebulaFeatureStore, called directly (the num_workers=0 path)."""

from __future__ import annotations

import pickle
import socket
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

from mploader.integrations.nebula import (
    FEATURE_ENCODING,
    NebulaAuthError,
    NebulaConnectionError,
    NebulaError,
    NebulaFeatureStore,
    NebulaHooks,
    NebulaQueryError,
    NebulaSession,
    decode_feature_batch,
    decode_features,
    encode_features,
    parse_addresses,
)
from mploader.worker.hooks import (
    activate_hooks,
    close_worker_session,
    deactivate_hooks,
    worker_session,
)
from mploader.worker.info import make_worker_info
from nebula_testing import citation, start_server_process
from nebula_testing.nebula_admin import session_ids
from tests.integrations.nebula_fixtures import NebulaTarget, wait_for

INFO = make_worker_info(0, 1, 0, None)


def _answer(session: NebulaSession, number: int) -> int:
    return session.execute(f"YIELD {number} AS q").rows()[0].values[0].value


@pytest.fixture
def active_hooks(nebula_server: NebulaTarget) -> Iterator[NebulaHooks]:
    hooks = nebula_server.hooks()
    activate_hooks(hooks, INFO)
    yield hooks
    close_worker_session()
    deactivate_hooks()


def test_feature_encoding_round_trips_exactly() -> None:
    vector = np.array([0.1, -2.5, 3e-8, np.float32(1) / 3], dtype=np.float32)
    text = encode_features(vector)
    assert FEATURE_ENCODING == "base64-float32-le"
    np.testing.assert_array_equal(decode_features(text, 4), vector)
    np.testing.assert_array_equal(decode_feature_batch([text, text.encode()], 4), [vector, vector])
    with pytest.raises(ValueError, match="expected 12"):
        decode_features(text, 3)


def test_citation_graph_is_deterministic() -> None:
    first = citation.make_citation_graph(50, 8, 3, seed=1)
    second = citation.make_citation_graph(50, 8, 3, seed=1)
    np.testing.assert_array_equal(first.features, second.features)
    np.testing.assert_array_equal(first.edge_dst, second.edge_dst)
    assert (first.edge_dst < first.edge_src).all()  # papers cite earlier papers
    assert not np.array_equal(citation.make_citation_graph(50, 8, 3, seed=2).labels, first.labels)


def test_parse_addresses() -> None:
    assert parse_addresses("a:1, b:2") == [("a", 1), ("b", 2)]
    assert parse_addresses([("h", "9669"), "x:3"]) == [("h", 9669), ("x", 3)]
    with pytest.raises(ValueError, match="host:port"):
        parse_addresses(["nohost"])


def test_create_and_close_session_signs_in_and_out(
    nebula_server: NebulaTarget, nebula_admin: Any
) -> None:
    hooks = nebula_server.hooks()
    session = hooks.create_session(INFO)
    session_id = session.session_id
    assert session_id in session_ids(nebula_admin)
    result = session.execute("YIELD 3 AS q")
    assert result.space_name() == nebula_server.space and _answer(session, 4) == 4
    hooks.close_session(session, INFO)
    assert session_id not in session_ids(nebula_admin)  # close() waits for the sign-out
    with pytest.raises(NebulaError, match="closed"):
        session.execute("YIELD 1 AS q")


def test_failed_statement_raises_with_code_and_statement(nebula_server: NebulaTarget) -> None:
    with nebula_server.hooks().open_session() as session:
        with pytest.raises(NebulaQueryError) as caught:
            session.execute("YIELD 1 +")
        assert caught.value.code == -1004 and caught.value.statement == "YIELD 1 +"
        assert nebula_server.address in str(caught.value)


def test_hooks_pickle_but_sessions_do_not(nebula_server: NebulaTarget) -> None:
    hooks = pickle.loads(pickle.dumps(nebula_server.hooks()))
    assert hooks.addresses == nebula_server.addresses and "***" in repr(hooks)
    store = pickle.loads(pickle.dumps(nebula_server.feature_store()))
    assert store.feature_dim == nebula_server.feature_dim
    with hooks.open_session() as session, pytest.raises(TypeError, match="NebulaHooks"):
        pickle.dumps(session)


def test_wrong_password_names_user_and_server(nebula_server: NebulaTarget) -> None:
    hooks = nebula_server.hooks(password="wrong-password")
    try:
        session = hooks.open_session()
    except NebulaAuthError as error:
        message = str(error)
        assert repr(nebula_server.user) in message and nebula_server.address in message
        assert "password" in message
    else:
        session.close()
        pytest.skip("this NebulaGraph does not check passwords (enable_authorize=false)")


def test_missing_space_is_a_clear_error(nebula_server: NebulaTarget) -> None:
    with pytest.raises(NebulaQueryError, match="no_such_space"):
        nebula_server.hooks(space="no_such_space").open_session()


def test_unreachable_server_names_the_address() -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(NebulaConnectionError) as caught:
        NebulaHooks([("127.0.0.1", port)], space="citation").open_session()
    assert f"127.0.0.1:{port}" in str(caught.value) and "running" in str(caught.value)


def test_feature_store_fetch_matches_the_generator(
    nebula_server: NebulaTarget, active_hooks: NebulaHooks
) -> None:
    graph = nebula_server.graph
    store = nebula_server.feature_store(batch_size=7)  # several chunks per call
    vids = torch.tensor([42, 3, 299, 3, 0, 150, 42])  # unordered, with duplicates
    features, labels = store.fetch(vids)
    assert features.dtype == torch.float32 and labels.dtype == torch.int64
    assert features.shape == (7, graph.feature_dim)
    np.testing.assert_array_equal(features.numpy(), graph.features[vids.numpy()])
    np.testing.assert_array_equal(labels.numpy(), graph.labels[vids.numpy()])
    empty_features, empty_labels = store.fetch([])
    assert empty_features.shape == (0, graph.feature_dim) and empty_labels.shape == (0,)
    with pytest.raises(KeyError, match="100000"):
        store.fetch([1, 100000])


def test_feature_store_neighbors_match_the_generator(
    nebula_server: NebulaTarget, active_hooks: NebulaHooks
) -> None:
    graph = nebula_server.graph
    store = nebula_server.feature_store(batch_size=4)
    vids = [5, 77, 123, 200, 201, 299]
    src, dst = store.neighbors(vids)
    expected = {(vid, int(other)) for vid in vids for other in graph.out_neighbors(vid)}
    assert set(zip(src.tolist(), dst.tolist(), strict=True)) == expected
    assert len(src) == len(expected)
    none_src, _ = store.neighbors([0])  # node 0 cites nobody
    assert none_src.shape == (0,)


def test_feature_store_needs_active_hooks(nebula_server: NebulaTarget) -> None:
    with pytest.raises(RuntimeError, match="worker_hooks"):
        nebula_server.feature_store().fetch([1])


def test_feature_store_uses_one_session_per_process(
    nebula_server: NebulaTarget, active_hooks: NebulaHooks, nebula_admin: Any
) -> None:
    store = nebula_server.feature_store()
    store.fetch([1, 2])
    session = worker_session()
    store.neighbors([1, 2])
    store.fetch([3])
    assert worker_session() is session and session.reconnects == 0
    assert session.session_id in session_ids(nebula_admin)
    session_id = session.session_id
    close_worker_session()  # what a worker does at exit: NebulaHooks.close_session signs out
    assert session.closed and session_id not in session_ids(nebula_admin)


def test_deactivate_hooks_closes_the_worker_session(
    nebula_server: NebulaTarget, nebula_admin: Any
) -> None:
    activate_hooks(nebula_server.hooks(), INFO)
    session = worker_session()  # held here, so only close_session() can sign it out
    session_id = session.session_id
    try:
        deactivate_hooks()
        assert session.closed and session_id not in session_ids(nebula_admin)
    finally:
        session.close()


# ----------------------------------------------------------------------------- faults


def test_reconnects_once_after_the_server_drops_the_connection(
    nebula_server: NebulaTarget, nebula_admin: Any
) -> None:
    if nebula_server.real:
        pytest.skip("dropping connections needs the test server's DEBUG statements")
    with nebula_server.hooks().open_session() as session:
        first_id = session.session_id
        assert _answer(session, 1) == 1
        dropped = nebula_admin.execute("DEBUG DROP CONNECTIONS")
        assert dropped.is_succeeded() and dropped.rows()[0].values[0].value >= 1
        assert _answer(session, 2) == 2  # broken socket -> fresh session -> retried
        assert session.reconnects == 1 and session.session_id != first_id
        assert session.execute("YIELD 1 AS q").space_name() == nebula_server.space  # USE again
        assert wait_for(lambda: first_id not in session_ids(nebula_admin))  # old one signed out


def test_a_second_drop_right_after_reconnecting_is_an_error(nebula_server: NebulaTarget) -> None:
    if nebula_server.real:
        pytest.skip("dropping connections needs the test server's DEBUG statements")
    with nebula_server.hooks().open_session() as session:
        with pytest.raises(NebulaConnectionError, match="again"):
            session.execute("DEBUG DROP CONNECTION")  # the retry is dropped as well
        assert _answer(session, 3) == 3  # the next statement reconnects again
        assert session.reconnects == 2


def test_reconnects_after_a_server_restart_and_fails_clearly_when_down() -> None:
    with start_server_process(preload="citation", nodes=20, feature_dim=4) as server:
        hooks = NebulaHooks([server.address], space="citation")
        session = hooks.open_session()
        assert _answer(session, 1) == 1
        server.restart()  # same port, all sessions forgotten
        assert _answer(session, 2) == 2
        assert session.reconnects == 1
        server.stop()
        with pytest.raises(NebulaConnectionError) as caught:
            session.execute("YIELD 3 AS q")
        assert server.address in str(caught.value) and "reconnect" in str(caught.value)
        session.close()


def test_store_reads_through_any_session_callable(nebula_server: NebulaTarget) -> None:
    with nebula_server.hooks().open_session() as session:
        store = NebulaFeatureStore(
            citation.PAPER_TAG,
            citation.FEATURE_PROP,
            citation.LABEL_PROP,
            nebula_server.feature_dim,
            session=lambda: session,
        )
        features, _ = store.fetch(np.array([9]))
        np.testing.assert_array_equal(features[0].numpy(), nebula_server.graph.features[9])


def test_store_rejects_null_labels_and_unknown_properties(
    nebula_server: NebulaTarget, nebula_admin: Any
) -> None:
    if nebula_server.real:
        pytest.skip("creating spaces on a real NebulaGraph takes heartbeats")
    for statement in [
        "CREATE SPACE nullish (vid_type = INT64)",
        "USE nullish",
        "CREATE TAG paper(feat string, label int NULL)",
        f'INSERT VERTEX paper(feat) VALUES 1:("{encode_features([1.0, 2.0])}")',
    ]:
        assert nebula_admin.execute(statement).is_succeeded(), statement
    try:
        with nebula_server.hooks(space="nullish").open_session() as session:
            store = NebulaFeatureStore("paper", "feat", "label", 2, session=lambda: session)
            with pytest.raises(TypeError, match="NULL"):
                store.fetch([1])
            typo = NebulaFeatureStore("paper", "feet", "label", 2, session=lambda: session)
            with pytest.raises(NebulaQueryError, match="feet"):
                typo.fetch([1])
    finally:
        nebula_admin.execute("DROP SPACE nullish")
