"""Everything that runs inside a worker process.

``loop`` reads tasks, fetches, collates, encodes and replies; ``messages`` is the wire protocol
both sides speak; ``spec`` is the one picklable object a worker starts from; ``fetch`` mirrors
torch's fetchers; ``hooks`` runs the user's ``WorkerHooks`` and keeps per-process sessions;
``info`` is ``get_worker_info()`` and seeding; ``watchdog`` exits when the parent dies;
``memory`` tunes the allocator; ``inherited`` closes pipe ends a forked worker must not keep.
May import ``channel`` (a worker writes into its end), ``monitor.events`` (the shared names),
``config`` and ``errors``; never the iterator or the process layer.
"""
