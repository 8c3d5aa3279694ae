"""The iterators a ``DataLoader`` hands out, and the pure logic they run.

* ``factory``: picks a loader's iterator (mploader's, or a torch loader's after ``install()``).
* ``single``: ``num_workers=0``, everything in the main process; the reference semantics.
* ``multi``: the multi-process loop (its docstring draws the data flow).
* ``base``: what both iterators share (the sampler, the base seed, torch's length warning).
* ``settings``: what an iterator reads from its loader, gathered once.
* ``task_table``: the in-order delivery state machine, free of processes.
* ``datapipes``: datapipe datasets in the main process, as torch's iterators treat them.
* ``latest``: what ``DataLoader.stats()`` answers from, and the loader's count of epochs.
* ``publisher``: publishes the live iterators' snapshots for ``python -m mploader top``.
* ``resume``: mid-epoch resume, main side: follows the consumer, makes and loads the state.
* ``resume_format``: the state's format and version, and worker snapshots as plain values.
* ``resume_shape``: the layout of a state's ``position``, checked whole before loading.

May import ``process``, ``channel``, ``worker`` (for the spec and the messages), ``monitor`` and
the leaves (``compat``, ``config``, ``errors``, ``finalizers``); nothing imports the iterator but
the public face.
"""
