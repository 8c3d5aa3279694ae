"""Integrations with external data sources for DataLoader workers.

Each integration lives in its own module and imports its client library lazily, so importing
``mploader.integrations`` costs nothing:

* :mod:`mploader.integrations.nebula`: NebulaGraph (``nebula3-python``, the ``nebula`` extra):
  per-worker sessions via ``NebulaHooks`` and a ``NebulaFeatureStore``.
"""
