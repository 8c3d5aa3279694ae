"""Observability, a side service: counters, ``stats()`` snapshots, the trace and its summary.

* ``events``: worker states, lifecycle events and task timings, named for every layer.
* ``monitor``: told what happens by the iterator; keeps the counts and the memory guard.
* ``stats``: the frozen snapshots ``stats()`` returns (``LoaderStats``, ``WorkerStats``).
* ``trace``: writes the Chrome/Perfetto trace of a loader's life.
* ``trace_summary``: reads a trace back (``python -m mploader trace-summary``).
* ``publish``: where and how snapshots are published for ``top``.
* ``top``: ``python -m mploader top``, the live view of this user's loaders.

Imports nothing from the other layers but the leaves (``errors``, ``finalizers``) and is handed
none of their objects: they call it with data, it never calls them back.
"""
