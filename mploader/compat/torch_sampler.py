"""How torch's own samplers draw, where a resume state must name their position.

torchdata's ``StatefulDataLoader`` builds its own ``RandomSampler`` for ``shuffle=True``; its
state names a shuffle's position as ``{"yielded": n, "generator": <the generator's state the
permutation was drawn from>}``.  torch's ``RandomSampler`` keeps no state, so mploader reads and
writes that position for it from the outside: the permutation is ``torch.randperm(n,
generator=g)``, drawn at the iterator's first ``next()`` from the sampler's ``generator`` or,
without one, from a ``torch.Generator`` seeded with one int64 drawn then from torch's global
generator.  The same in every supported version (2.6 to 2.14);
``tests/parity/test_parity_sampler_position.py`` checks it against the installed torch.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import BatchSampler, RandomSampler


def is_torch_batch_sampler(batch_sampler: Any) -> bool:
    """Whether ``batch_sampler`` draws its batches as torch's ``BatchSampler`` does (its own
    ``__iter__``, not a subclass's)."""
    return (isinstance(batch_sampler, BatchSampler)
            and type(batch_sampler).__iter__ is BatchSampler.__iter__)


def shuffle_sampler(loader: Any) -> RandomSampler | None:
    """The loader's sampler when it is the one ``shuffle=True`` builds (torch's
    ``RandomSampler`` over the dataset, drawing a whole permutation from the loader's
    ``generator``), where torchdata's loader would have built its own; else ``None``.  A
    ``RandomSampler`` given as ``sampler=`` with the same dataset and generator is the same
    sampler and is taken for it."""
    sampler = loader.sampler
    if type(sampler) is not RandomSampler or sampler.replacement:
        return None
    if sampler.data_source is not loader.dataset or sampler.generator is not loader.generator:
        return None
    try:
        whole = sampler.num_samples == len(sampler.data_source)
    except TypeError:
        return None
    return sampler if whole else None


def permutation_source(sampler: RandomSampler) -> torch.Tensor:
    """The state of the generator ``sampler``'s permutation is drawn from if its iterator's
    first ``next()`` came now."""
    if sampler.generator is not None:
        return sampler.generator.get_state()
    global_copy = torch.Generator()
    global_copy.set_state(torch.get_rng_state())
    seed = int(torch.empty((), dtype=torch.int64).random_(generator=global_copy).item())
    return torch.Generator().manual_seed(seed).get_state()


def resumed_permutation(sampler: RandomSampler, source: torch.Tensor, yielded: int
                        ) -> Iterator[int]:
    """``sampler``'s iterator with its permutation drawn from a generator in state ``source``,
    past its first ``yielded`` indices.  With a ``generator`` of its own, that generator is put
    in ``source`` and torch's sampler draws (so the generator ends where the uninterrupted run's
    did); without, the permutation is drawn as torch's sampler draws it, from a generator of its
    own, and torch's global generator is not touched (it drew the seed before the state)."""
    n = len(sampler.data_source)
    if not 0 <= yielded <= n:
        raise ValueError(f"load_state_dict: the state's shuffle has yielded {yielded} of "
                         f"{n} indices; the dataset differs from the one that made the state")
    if sampler.generator is not None:
        sampler.generator.set_state(source)
        iterator = iter(sampler)
        for _ in range(yielded):
            next(iterator)
        return iterator
    generator = torch.Generator()
    generator.set_state(source)
    return _permutation_from(generator, n, yielded)


def _permutation_from(generator: torch.Generator, n: int, yielded: int) -> Iterator[int]:
    yield from torch.randperm(n, generator=generator).tolist()[yielded:]
