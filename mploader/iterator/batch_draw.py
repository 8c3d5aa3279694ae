"""The batches of torch's ``BatchSampler``, drawn as torch draws them, with a position in
torchdata's words.

A loader built with ``batch_size`` wraps its sampler in torch's ``BatchSampler``, whose iterator
is a Python generator: it keeps no state, and the sampler's own iterator is out of reach inside
it.  torchdata's loader wraps the sampler in a batch sampler of its own whose iterator keeps
``samples_yielded`` and the sampler's and its iterator's states; its checkpoints name a
map-style epoch's position that way.  :class:`BatchDraw` is ``iter(batch_sampler)`` for torch's
``BatchSampler`` with that state: the same batches, the same draws at the same moments (the
sampler's iterator is made at the first ``next()``, as torch's generator makes it), and
``state_dict``/``load_state_dict`` with the keys and meaning of torchdata's.

A shuffle that torch's ``RandomSampler`` makes for ``shuffle=True`` has its position written as
torchdata's ``RandomSampler`` writes it (``mploader.compat.torch_sampler``), so a checkpoint moves
between the two loaders in both directions.
"""

from __future__ import annotations

from itertools import islice
from typing import Any

import torch
from torch.utils.data import BatchSampler, RandomSampler

from mploader.compat import torch_sampler
from mploader.compat.torchdata_keys import (
    INNER_ITER_STATE,
    SAMPLER_STATE,
    SAMPLES_YIELDED,
    SHUFFLE_GENERATOR,
    SHUFFLE_YIELDED,
)
from mploader.worker.resume import draw_past, has_state_methods, load_own_state


class BatchDraw:
    """``iter(batch_sampler)`` of torch's own ``BatchSampler`` (see the module docstring)."""

    def __init__(self, batch_sampler: BatchSampler, shuffle: RandomSampler | None) -> None:
        self.sampler: Any = batch_sampler.sampler
        self.batch_size = batch_sampler.batch_size
        self.drop_last = batch_sampler.drop_last
        # The loader's shuffle=True sampler, when it is this batch sampler's: its position is
        # written as torchdata's RandomSampler writes its own.
        self.shuffle = shuffle if shuffle is self.sampler else None
        self.samples_yielded = 0
        self.permutation_source: torch.Tensor | None = None
        self._items: Any = None  # iter(sampler), made at the first next() as torch makes it
        self._done = False

    @property
    def keeps_own_state(self) -> bool:
        """Whether the position needs the sampler's (or its iterator's) own state, taken after
        each draw; else it follows from the batches drawn (:meth:`state_after`)."""
        if has_state_methods(self.sampler):
            return True
        if self.shuffle is not None:
            return False
        try:
            len(self.sampler)
        except TypeError:
            return True
        return self._items is None or has_state_methods(self._items)

    def __iter__(self) -> BatchDraw:
        return self

    def __next__(self) -> list[Any]:
        if self._done:
            raise StopIteration
        items = self._items
        if items is None:
            if self.shuffle is not None:
                self.permutation_source = torch_sampler.permutation_source(self.shuffle)
            items = self._items = iter(self.sampler)
        batch = [*islice(items, self.batch_size)]  # as torch's: in C, not a Python loop
        if len(batch) < self.batch_size:  # the sampler ran out
            self._done = True
            if not batch or self.drop_last:
                raise StopIteration
        self.samples_yielded += len(batch)
        return batch

    def state_dict(self) -> dict[str, Any]:
        """The position now, as torchdata's batch-sampler iterator states it."""
        state: dict[str, Any] = {SAMPLES_YIELDED: self.samples_yielded}
        if has_state_methods(self.sampler):
            state[SAMPLER_STATE] = self.sampler.state_dict()
        if self._items is not None and has_state_methods(self._items):
            state[INNER_ITER_STATE] = self._items.state_dict()
        elif self.permutation_source is not None:
            state[INNER_ITER_STATE] = self._shuffle_state(self.samples_yielded)
        return state

    def state_after(self, batches: int) -> dict[str, Any]:
        """The position after the epoch's first ``batches`` batches, for a sampler that keeps
        no state of its own (``keeps_own_state`` is False)."""
        samples = batches * self.batch_size
        if not self.drop_last:
            samples = min(samples, len(self.sampler))
        state: dict[str, Any] = {SAMPLES_YIELDED: samples}
        if self.permutation_source is not None:
            state[INNER_ITER_STATE] = self._shuffle_state(samples)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (this class's or torchdata's), in torchdata's order: the
        sampler's state, a new iterator of it, the iterator's state; a sampler with neither is
        drawn past the indices already yielded."""
        samples = state[SAMPLES_YIELDED]
        if SAMPLER_STATE in state:
            load_own_state(self.sampler, state[SAMPLER_STATE], "sampler")
        inner = state.get(INNER_ITER_STATE)
        if inner is not None and self.shuffle is not None and _is_shuffle_state(inner):
            self.permutation_source = inner[SHUFFLE_GENERATOR]
            self._items = torch_sampler.resumed_permutation(
                self.shuffle, inner[SHUFFLE_GENERATOR], int(inner[SHUFFLE_YIELDED]))
        else:
            self._items = iter(self.sampler)
            if inner is not None:
                load_own_state(self._items, inner, "sampler iterator")
            elif SAMPLER_STATE not in state:
                draw_past(self._items, samples, lambda drawn: (
                    f"load_state_dict: the state resumes after {samples} indices, but this "
                    f"loader's sampler gives {drawn}; the sampler differs"))
        self.samples_yielded = samples

    def _shuffle_state(self, samples: int) -> dict[str, Any]:
        assert self.permutation_source is not None
        return {SHUFFLE_YIELDED: samples, SHUFFLE_GENERATOR: self.permutation_source.clone()}


def _is_shuffle_state(state: Any) -> bool:
    return (isinstance(state, dict) and set(state) == {SHUFFLE_YIELDED, SHUFFLE_GENERATOR}
            and isinstance(state[SHUFFLE_GENERATOR], torch.Tensor))


def sampler_iterator(index_sampler: Any, shuffle: RandomSampler | None) -> Any:
    """``iter(index_sampler)``, or a :class:`BatchDraw` of it where it is torch's own
    ``BatchSampler`` (``shuffle``: the loader's ``shuffle=True`` sampler, if it has one)."""
    if torch_sampler.is_torch_batch_sampler(index_sampler):
        return BatchDraw(index_sampler, shuffle)
    return iter(index_sampler)
