"""Everything that runs inside a worker process.

* ``loop``: the worker process: reads tasks, fetches, collates, encodes, replies; exits cleanly.
* ``messages``: the wire protocol both sides speak, as small dataclasses.
* ``spec``: the one picklable object a worker starts from.
* ``fetch``: fetches a task's samples as torch's fetchers do, collation kept separate.
* ``replies``: writes the worker's replies in order, large copies off the loop's path.
* ``threads``: concurrent fetches inside one worker (``worker_threads=T``, ``T > 1``).
* ``hooks``: runs the user's ``WorkerHooks``, keeps per-process sessions and ``ProcessLocal``.
* ``info``: ``get_worker_info()`` and torch-compatible seeding.
* ``item_random``: ``item_generator()``, a reproducible generator for the item being fetched.
* ``rng``: the three global random generators: capture, restore, and notice a change.
* ``resume``: a worker's resumable state, sent with its batches and restored on resume.
* ``datapipes``: datapipe datasets inside a worker, as torch's worker loop treats them.
* ``start_gate``: forked workers wait until the main process has forked them all.
* ``watchdog``: notices that the main process is gone, so a worker never outlives it.
* ``memory``: keeps a worker's large allocations on the reused heap instead of fresh mmaps,
  and gives the heap back when it says goodbye.
* ``exit_priority``: a worker that said goodbye leaves the CPU to the loader for the rest of
  its exit.
* ``inherited``: closes the pipe ends a forked worker inherits but must not keep.

May import ``channel`` (a worker writes into its end), ``monitor.events`` (the shared names) and
the leaves (``compat``, ``config``, ``errors``, ``polling``); never the iterator or the process
layer.
"""
