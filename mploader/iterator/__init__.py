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
* ``resume_plan``: ``ResumePlan``, the one record of a position, saved or loaded.
* ``resume_format``: the state's layout (torchdata's keys, and mploader's under ``_mploader``).
* ``resume_shape``: checking a loaded state's shape whole, before any of it is used.
* ``batch_draw``: torch's ``BatchSampler`` drawn as torch draws it, its position in torchdata's
  words.

May import ``process``, ``channel``, ``worker`` (for the spec and the messages), ``monitor`` and
the leaves (``compat``, ``config``, ``errors``, ``finalizers``); nothing imports the iterator but
the public face.
"""
