"""Test and demo tooling, not in the wheel: a NebulaGraph-compatible graphd server and its data.

* :mod:`nebula_testing.citation`: the deterministic citation graph (numpy only).
* :mod:`nebula_testing.nebula_process`: ``start_server_process`` / ``NebulaServerProcess``
  (runs the server as a subprocess; no nebula3 import).
* :mod:`nebula_testing.nebula_server`: the server itself (needs ``nebula3-python``).
* :mod:`nebula_testing.nebula_admin`: ``AdminSession`` / ``session_ids``, the sessions graphd
  lists (for tests and benchmarks; needs ``nebula3-python``).

Only the light modules are imported here; the server is imported when run.
"""

from nebula_testing.citation import CitationGraph, make_citation_graph
from nebula_testing.nebula_process import NebulaServerProcess, start_server_process

__all__ = ["CitationGraph", "NebulaServerProcess", "make_citation_graph", "start_server_process"]
