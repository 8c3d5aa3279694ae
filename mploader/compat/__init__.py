"""The one seam between mploader and what differs between the torch and Python versions it runs on.

mploader supports torch 2.6 to 2.14 and CPython 3.11, 3.12 and 3.13.  Everything it uses that is
private to torch or CPython, or that changed between those versions, is reached through this
package and nowhere else (``tests/test_layers.py`` checks that no other module imports ``torch._*``,
``torch.utils.data._utils`` or ``torch.multiprocessing.reductions``, or reads torch's and
CPython's private attributes).  Each branch says which versions it serves; where a version lacks
what mploader relies on, mploader falls back to documented behaviour.

* :mod:`mploader.compat.torch`: torch's private data-loading API (worker info and seeds, collate,
  pin memory, the loader's private attributes, the iterator factory that ``install()`` swaps,
  tensor reductions) and the pin-memory rules that changed in 2.7 and 2.9.
* :mod:`mploader.compat.torch_generator`: reading the default CPU generator's engine in place
  (a layout of torch's C++ objects), with an explicit fallback to ``get_state()``.
* :mod:`mploader.compat.mersenne`: the Mersenne Twister's state length, which torch's CPU
  generator and Python's ``random.Random`` share.
* :mod:`mploader.compat.torch_sampler`: how torch's ``RandomSampler`` draws its permutation,
  so a shuffle's position is named as torchdata's own sampler names it.
* :mod:`mploader.compat.torchdata_keys`: the keys of torchdata's ``StatefulDataLoader`` states,
  which mploader's states share.
* :mod:`mploader.compat.cpython`: CPython internals: multiprocessing's "spawning Popen" slot,
  ``Process._bootstrap`` and the exit handling around it (moved out of it in 3.13), a process's
  ``Popen``, the layout of ``random.Random``, and the warning of a fork with threads.

This package is a leaf: it imports no other part of mploader.
"""
