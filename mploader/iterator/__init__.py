"""The iterators a ``DataLoader`` hands out, and the pure logic they run.

``factory`` picks one for a loader; ``single`` is ``num_workers=0``; ``multi`` is the
multi-process loop (its docstring draws the data flow); ``settings`` is what an iterator reads from
its loader; ``task_table`` is the in-order delivery state machine, free of processes; ``base`` is
what both iterators share; ``latest`` is what ``DataLoader.stats()`` answers from; ``publisher``
publishes the live iterators' snapshots for ``python -m mploader top``.

May import ``process``, ``channel``, ``worker`` (for the spec and the messages), ``monitor``,
``config`` and ``errors``; nothing imports the iterator but the public face.
"""
