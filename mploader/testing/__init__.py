"""Test support: a NebulaGraph-compatible graphd server and its synthetic data set.

* :mod:`mploader.testing.citation`: the deterministic citation graph (numpy only).
* :mod:`mploader.testing.nebula_process`: ``start_server_process`` / ``NebulaServerProcess``
  (runs the server as a subprocess; no nebula3 import).
* :mod:`mploader.testing.nebula_server`: the server itself (needs ``nebula3-python``).

Only the light modules are imported here; the server is imported when run.
"""

from mploader.testing.citation import CitationGraph, make_citation_graph
from mploader.testing.nebula_process import NebulaServerProcess, start_server_process

__all__ = ["CitationGraph", "NebulaServerProcess", "make_citation_graph", "start_server_process"]
