"""PyTorch Geometric on NebulaGraph: PyG's remote backend, sampled on the server, no pyg-lib.

* :class:`NebulaFeatureStore` (a ``torch_geometric.data.FeatureStore``): node attributes are
  tag properties; a batch's attributes come in one ``FETCH`` per tag.
* :class:`NebulaGraphStore` (a ``GraphStore``): ``edge_index`` in COO, CSR or CSC from a scan,
  for PyG's in-memory samplers (which need pyg-lib or torch-sparse).
* :class:`NebulaNeighborSampler` (a ``BaseSampler``): neighbours asked of the server hop by hop,
  reproducible, with no topology in memory and neither pyg-lib nor torch-sparse.
* :class:`NebulaNodeLoader`: PyG's ``NodeLoader`` whose batches are sampled on mploader's fetch
  threads (``worker_threads``, ``worker_hooks``), after ``mploader.install()``.
* :func:`put_graph`: load a PyG ``Data`` / ``HeteroData`` into a space in one call.

Needs ``torch-geometric`` (``pip install mploader[pyg]``); pure Python.

The modules:

* ``schema``: :class:`GraphSchema`, how a PyG graph maps onto a space (tags, edge types).
* ``feature_store``: :class:`NebulaFeatureStore`, node attributes as tag properties.
* ``graph_store``: :class:`NebulaGraphStore`, an edge type's ``edge_index`` from a scan.
* ``sampler``: :class:`NebulaNeighborSampler`, neighbours asked of the server hop by hop.
* ``loader``: :class:`NebulaNodeLoader`, PyG's ``NodeLoader`` on mploader's fetch threads.
* ``load``: :func:`put_graph` and :func:`schema_statements`, a graph into a space in one call.
* ``nodes``: which nodes exist and which an index names, checked before any statement.
* ``queries``: the session a store uses (the fetch thread's, or the process's) and its rows.
* ``errors``: what the stores and the sampler raise for input the schema refuses.
"""

from mploader.integrations.nebula.pyg.feature_store import NebulaFeatureStore
from mploader.integrations.nebula.pyg.graph_store import NebulaGraphStore
from mploader.integrations.nebula.pyg.load import put_graph, schema_statements
from mploader.integrations.nebula.pyg.loader import NebulaNodeLoader
from mploader.integrations.nebula.pyg.sampler import NebulaNeighborSampler
from mploader.integrations.nebula.pyg.schema import (
    FEATURES,
    FLOAT,
    INT,
    EdgeMapping,
    GraphSchema,
    NodeAttribute,
    NodeType,
    homogeneous_schema,
)

__all__ = [
    "FEATURES",
    "FLOAT",
    "INT",
    "EdgeMapping",
    "GraphSchema",
    "NebulaFeatureStore",
    "NebulaGraphStore",
    "NebulaNeighborSampler",
    "NebulaNodeLoader",
    "NodeAttribute",
    "NodeType",
    "homogeneous_schema",
    "put_graph",
    "schema_statements",
]
