"""Observability, a side service: counters, ``stats()`` snapshots, the trace and its summary.

``events`` names worker states, lifecycle events and task timings for every layer; ``monitor``
is told what happens by the iterator and keeps the counts; ``stats`` holds the frozen
snapshots; ``trace`` writes the Chrome/Perfetto file; ``trace_summary`` reads one back;
``publish`` is where snapshots are published, ``top`` the live view of them.  Imports nothing from
the other layers and is handed none of their objects: they call it with data, it never calls them
back.
"""
