"""NebulaGraph for DataLoader workers: one session per process, and a feature store.

Why this exists: a ``nebula3-python`` session is not process-safe.  After ``fork`` every worker
holds a copy of the parent's socket; two processes sharing one session read each other's replies
(the generated Thrift client ignores the reply's sequence id), so answers are silently wrong.
Releasing an inherited session in the child signs the *parent's* session out (and
``Session.__del__`` releases too).  So:

* :class:`NebulaHooks` (a :class:`mploader.WorkerHooks`) gives each worker process a pool of
  sessions its fetch threads share (:class:`SessionPool`), under a host-wide budget that keeps
  every rank under graphd's session cap (the ``budget`` module), retries while graphd restarts,
  signs them out at worker exit (and after a worker was killed), and *detaches* inherited ones
  without any network traffic.
* Every live :class:`NebulaSession` is also detached automatically in a forked child
  (``os.register_at_fork``), so even a session kept on a dataset attribute cannot talk over the
  parent's socket; using it there raises an error that says what to do instead.
* :class:`NebulaFeatureStore` fetches node features/labels and neighbours through
  ``mploader.worker_session()`` with batched ``FETCH PROP ON`` / ``GO FROM`` statements.

Feature vectors are stored as a string property (a NebulaGraph property cannot hold a list):
**base64 of the little-endian float32 bytes** (:data:`FEATURE_ENCODING`), via
:func:`encode_features` / :func:`decode_features`.  These two need only numpy; nebula3 is imported
when a session is opened.

The modules:

* ``hooks``: :class:`NebulaHooks`, the worker hooks that open each process's sessions.
* ``session``: :class:`NebulaSession`, one process's graphd session, and graphd addresses.
* ``pool``: :class:`SessionPool`, :class:`PooledSession`: sessions a process's threads share.
* ``budget``: the host-wide budget of graphd sessions and the record of every one held.
* ``logins``: logins a budget slot always accounts for; sessions left by dead processes.
* ``backoff``: exponential backoff with jitter, bounded by a total wait.
* ``store``: :class:`NebulaFeatureStore`, features, labels and neighbours per batch.
* ``encoding``: feature vectors as base64 strings (:func:`encode_features` and the decoders).
* ``statements``: statements over many ids, split below graphd's query size limit.
* ``errors``: the integration's errors (:class:`~mploader.NebulaError` and its kinds).
* ``pyg/``: PyTorch Geometric's remote backend on NebulaGraph (``mploader[pyg]``).
"""

from mploader.integrations.nebula.encoding import (
    FEATURE_ENCODING,
    decode_feature_batch,
    decode_features,
    encode_features,
)
from mploader.integrations.nebula.errors import (
    NebulaAuthError,
    NebulaConnectionError,
    NebulaError,
    NebulaQueryError,
    NebulaSessionLimitError,
    NebulaSessionLostError,
)
from mploader.integrations.nebula.hooks import NebulaHooks
from mploader.integrations.nebula.pool import PooledSession, SessionPool
from mploader.integrations.nebula.session import NebulaSession, parse_addresses
from mploader.integrations.nebula.statements import GRAPHD_MAX_QUERY_BYTES, split_id_statements
from mploader.integrations.nebula.store import NebulaFeatureStore

__all__ = [
    "FEATURE_ENCODING",
    "GRAPHD_MAX_QUERY_BYTES",
    "NebulaAuthError",
    "NebulaConnectionError",
    "NebulaError",
    "NebulaFeatureStore",
    "NebulaHooks",
    "NebulaQueryError",
    "NebulaSession",
    "NebulaSessionLimitError",
    "NebulaSessionLostError",
    "PooledSession",
    "SessionPool",
    "decode_feature_batch",
    "decode_features",
    "encode_features",
    "parse_addresses",
    "split_id_statements",
]
