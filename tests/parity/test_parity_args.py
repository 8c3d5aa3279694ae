"""The constructor and the loader's attributes: torch's checks, messages, lengths and warnings.

Loaders here are built with mploader's defaults (no mploader-only argument), as a drop-in
replacement is.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import pickle
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.utils.data
from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler

import mploader
from mploader.compat import torch as torch_compat

from .datasets import (
    CountingIterable,
    DictItems,
    EveryOtherSampler,
    GrowingBatchSampler,
    NoLenIterable,
    ShardedIterable,
    TensorItems,
    assert_same_batches,
    assert_same_failure,
    dict_collate,
    make_pair,
    messages,
)

# A stuck loader fails its test after a minute, not the default two.
pytestmark = pytest.mark.timeout(60)

MAP = TensorItems(6)
ITERABLE = ShardedIterable(6)
A_SAMPLER = SequentialSampler(range(6))
A_BATCH_SAMPLER = BatchSampler(SequentialSampler(range(6)), batch_size=2, drop_last=False)
NOT_A_CONTEXT = object()

# Each entry: the constructor's arguments.  The same objects go to torch and to mploader, so
# messages that show an object's repr (``sampler=<... at 0x...>``) are comparable as they are.
ARGUMENT_ERRORS: dict[str, dict[str, Any]] = {
    "num-workers-negative": dict(dataset=MAP, num_workers=-1),
    "num-workers-before-timeout": dict(dataset=MAP, num_workers=-1, timeout=-1),
    "timeout-negative": dict(dataset=MAP, timeout=-1),
    "prefetch-without-workers": dict(dataset=MAP, prefetch_factor=2),
    "prefetch-negative": dict(dataset=MAP, num_workers=2, prefetch_factor=-1),
    "persistent-without-workers": dict(dataset=MAP, persistent_workers=True),
    "iterable-shuffle": dict(dataset=ITERABLE, shuffle=True),
    "iterable-shuffle-unhashable": dict(dataset=ITERABLE, shuffle=[]),
    "iterable-sampler": dict(dataset=ITERABLE, sampler=A_SAMPLER),
    "iterable-batch-sampler": dict(dataset=ITERABLE, batch_sampler=A_BATCH_SAMPLER),
    "iterable-shuffle-before-sampler": dict(dataset=ITERABLE, shuffle=True, sampler=A_SAMPLER),
    "sampler-and-shuffle": dict(dataset=MAP, sampler=A_SAMPLER, shuffle=True),
    "batch-sampler-and-batch-size": dict(dataset=MAP, batch_sampler=A_BATCH_SAMPLER,
                                         batch_size=2),
    "batch-sampler-and-batch-size-none": dict(dataset=MAP, batch_sampler=A_BATCH_SAMPLER,
                                              batch_size=None),
    "batch-sampler-and-shuffle": dict(dataset=MAP, batch_sampler=A_BATCH_SAMPLER, shuffle=True),
    "batch-sampler-and-sampler": dict(dataset=MAP, batch_sampler=A_BATCH_SAMPLER,
                                      sampler=A_SAMPLER),
    "batch-sampler-and-drop-last": dict(dataset=MAP, batch_sampler=A_BATCH_SAMPLER,
                                        drop_last=True),
    "batch-size-none-and-drop-last": dict(dataset=MAP, batch_size=None, drop_last=True),
    "context-bad-string": dict(dataset=MAP, num_workers=2, multiprocessing_context="fork-ish"),
    "context-not-a-context": dict(dataset=MAP, num_workers=2,
                                  multiprocessing_context=NOT_A_CONTEXT),
    "context-without-workers": dict(dataset=MAP, multiprocessing_context="fork"),
    "context-object-without-workers": dict(
        dataset=MAP, multiprocessing_context=multiprocessing.get_context("spawn")
    ),
}


def raised(factory: Callable[[], Any]) -> BaseException:
    try:
        factory()
    except Exception as error:
        return error
    raise AssertionError("no exception")


@pytest.mark.parametrize("options", ARGUMENT_ERRORS.values(), ids=ARGUMENT_ERRORS.keys())
def test_argument_errors(options: dict[str, Any]) -> None:
    expected = raised(lambda: torch.utils.data.DataLoader(**options))
    assert isinstance(expected, (ValueError, TypeError))
    actual = raised(lambda: mploader.DataLoader(**options))
    assert type(actual) is type(expected)
    assert str(actual) == str(expected)


def test_argument_errors_cover_every_constructor_check() -> None:
    """Every ``raise ValueError``/``raise TypeError`` of torch's ``__init__`` and context setter."""
    messages_seen = set()
    for options in ARGUMENT_ERRORS.values():
        messages_seen.add(str(raised(lambda o=options: torch.utils.data.DataLoader(**o)))[:60])
    assert len(messages_seen) == 15


FROZEN = {
    "batch_size": 3,
    "sampler": SequentialSampler(range(6)),
    "batch_sampler": BatchSampler(SequentialSampler(range(6)), 2, False),
    "drop_last": True,
    "dataset": TensorItems(3),
    "persistent_workers": True,
}


class TorchSubclass(torch.utils.data.DataLoader):
    pass


class MploaderSubclass(mploader.DataLoader):
    pass


@pytest.mark.parametrize("attribute", FROZEN)
@pytest.mark.parametrize(
    "classes",
    [(torch.utils.data.DataLoader, mploader.DataLoader), (TorchSubclass, MploaderSubclass)],
    ids=["DataLoader", "subclass"],
)
def test_frozen_attributes(attribute: str, classes: tuple[type, type]) -> None:
    errors = []
    for cls in classes:
        loader = cls(MAP, batch_size=2)
        with pytest.raises(ValueError) as caught:
            setattr(loader, attribute, FROZEN[attribute])
        errors.append(str(caught.value))
        assert getattr(loader, attribute) != FROZEN[attribute] or attribute == "drop_last"
    expected, actual = errors
    if classes[0] is TorchSubclass:
        expected = expected.replace("TorchSubclass", "MploaderSubclass")
    assert actual == expected
    assert actual.startswith(f"{attribute} attribute should not be set after ")


@pytest.mark.parametrize("start_method", ["fork"])
def test_other_attributes_are_assignable_and_used(start_method: str) -> None:
    """Assigned after construction, ``num_workers``, ``collate_fn``, ``prefetch_factor``,
    ``multiprocessing_context``, ``timeout``, ``worker_init_fn`` take effect as in torch."""
    reference, loader = make_pair(lambda: dict(dataset=TensorItems(7), batch_size=2), None, True)
    for candidate in (reference, loader):
        candidate.num_workers = 2
        candidate.prefetch_factor = 1
        candidate.collate_fn = dict_collate
        candidate.multiprocessing_context = start_method
        candidate.timeout = 30
        candidate.worker_init_fn = None
        candidate.pin_memory = False
        candidate.in_order = True
        candidate.generator = torch.Generator()
    assert type(loader.multiprocessing_context) is type(reference.multiprocessing_context)
    assert loader.multiprocessing_context.get_start_method() == start_method
    assert_same_batches(list(reference), list(loader))


def test_assigned_context_is_checked() -> None:
    errors = []
    for cls in (torch.utils.data.DataLoader, mploader.DataLoader):
        loader = cls(MAP, num_workers=2)
        with pytest.raises(ValueError) as caught:
            loader.multiprocessing_context = "nonsense"
        errors.append(str(caught.value))
    assert errors[0] == errors[1]


@pytest.mark.parametrize("context", ["fork", "spawn", "forkserver"])
def test_context_string_becomes_a_context(context: str) -> None:
    reference = torch.utils.data.DataLoader(MAP, num_workers=2, multiprocessing_context=context)
    loader = mploader.DataLoader(MAP, num_workers=2, multiprocessing_context=context)
    assert type(loader.multiprocessing_context) is type(reference.multiprocessing_context)
    assert loader.multiprocessing_context.get_start_method() == context


# -- lengths ---------------------------------------------------------------------------------------

LENGTHS: dict[str, Callable[[], dict[str, Any]]] = {
    "map": lambda: dict(dataset=TensorItems(10), batch_size=3),
    "map-drop-last": lambda: dict(dataset=TensorItems(10), batch_size=3, drop_last=True),
    "map-batch-size-none": lambda: dict(dataset=TensorItems(10), batch_size=None),
    "map-batch-sampler": lambda: dict(dataset=TensorItems(10),
                                      batch_sampler=GrowingBatchSampler(10, 1)),
    "map-sampler": lambda: dict(dataset=TensorItems(9), sampler=EveryOtherSampler(9),
                                batch_size=4),
    "map-random-sampler": lambda: dict(
        dataset=TensorItems(10), batch_size=4,
        sampler=RandomSampler(range(10), replacement=True, num_samples=13),
    ),
    "iterable": lambda: dict(dataset=CountingIterable(7), batch_size=2),
    "iterable-drop-last": lambda: dict(dataset=CountingIterable(7), batch_size=2, drop_last=True),
    "iterable-batch-size-none": lambda: dict(dataset=CountingIterable(7), batch_size=None),
}


@pytest.mark.parametrize("options", LENGTHS.values(), ids=LENGTHS.keys())
def test_len(options: Callable[[], dict[str, Any]]) -> None:
    reference = torch.utils.data.DataLoader(**options())
    loader = mploader.DataLoader(**options())
    assert len(loader) == len(reference)
    assert loader._IterableDataset_len_called == reference._IterableDataset_len_called


@pytest.mark.parametrize("num_workers", [0, 2])
def test_len_of_the_iterator(num_workers: int) -> None:
    options = dict(dataset=TensorItems(10), batch_size=4, num_workers=num_workers)
    reference = torch.utils.data.DataLoader(**options)
    loader = mploader.DataLoader(**options)
    assert len(iter(loader)) == len(iter(reference)) == 3


@pytest.mark.parametrize("num_workers", [0, 2])
def test_num_yielded_of_the_iterator(num_workers: int) -> None:
    """torch's iterators count the batches they yielded in ``_num_yielded``; code written for
    torch reads it (a DataLoader subclass's ``state_dict()``, a trainer's progress bar)."""
    options = dict(dataset=TensorItems(10), batch_size=2, num_workers=num_workers)
    counts = []
    for cls in (torch.utils.data.DataLoader, mploader.DataLoader):
        iterator = iter(cls(**options))
        seen = [iterator._num_yielded]
        for _ in range(3):
            next(iterator)
            seen.append(iterator._num_yielded)
        seen.append(len(list(iterator)) + seen[-1] == iterator._num_yielded)
        counts.append(seen)
    assert counts[1] == counts[0] == [0, 1, 2, 3, True]


def test_len_without_dataset_len() -> None:
    errors = []
    for cls in (torch.utils.data.DataLoader, mploader.DataLoader):
        with pytest.raises(TypeError) as caught:
            len(cls(NoLenIterable(), batch_size=2))
        errors.append(str(caught.value))
    assert errors[0] == errors[1]


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("batch_size", [None, 2])
def test_iterable_longer_than_its_len_warns(num_workers: int, batch_size: int | None) -> None:
    """torch warns on every batch past ``len(dataset)``; same text (the dataset's repr aside)."""
    dataset = CountingIterable(7, reported_length=3)
    records = []
    for cls in (torch.utils.data.DataLoader, mploader.DataLoader):
        loader = cls(dataset, batch_size=batch_size, num_workers=num_workers)
        assert len(loader) == (3 if batch_size is None else 2)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            batches = list(loader)
        found = [m for m in messages(caught, dataset) if "Length of IterableDataset" in m[1]]
        records.append((found, batches))
    (expected, torch_batches), (actual, mploader_batches) = records
    assert_same_batches(torch_batches, mploader_batches)
    assert expected, "the case must trigger torch's warning"
    assert actual == expected


def test_no_length_warning_without_len_call() -> None:
    dataset = CountingIterable(5, reported_length=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        list(mploader.DataLoader(dataset, batch_size=None))
    assert not [w for w in caught if "Length of IterableDataset" in str(w.message)]


# -- what other code reaches in for ----------------------------------------------------------------

AUTO_COLLATION = {
    "batch-size": lambda: dict(dataset=TensorItems(4), batch_size=2),
    "batch-size-none": lambda: dict(dataset=TensorItems(4), batch_size=None),
    "batch-sampler": lambda: dict(dataset=TensorItems(4), batch_sampler=[[0, 1], [2, 3]]),
    "iterable": lambda: dict(dataset=ShardedIterable(4), batch_size=2),
    "iterable-batch-size-none": lambda: dict(dataset=ShardedIterable(4), batch_size=None),
}


@pytest.mark.parametrize("options", AUTO_COLLATION.values(), ids=AUTO_COLLATION.keys())
def test_auto_collation_and_samplers(options: Callable[[], dict[str, Any]]) -> None:
    reference = torch.utils.data.DataLoader(**options())
    loader = mploader.DataLoader(**options())
    assert loader._auto_collation is reference._auto_collation
    assert loader._dataset_kind == reference._dataset_kind
    assert type(loader._index_sampler).__name__ == type(reference._index_sampler).__name__
    assert type(loader.sampler).__name__ == type(reference.sampler).__name__
    assert loader.batch_size == reference.batch_size
    assert loader.drop_last == reference.drop_last
    assert loader.collate_fn is reference.collate_fn
    assert loader.prefetch_factor == reference.prefetch_factor


@pytest.mark.parametrize("start_method", ["fork", "forkserver"])
def test_workers_are_process_objects(start_method: str, channel: bool) -> None:
    loader = mploader.DataLoader(TensorItems(8), batch_size=2, num_workers=2,
                                 multiprocessing_context=start_method, shared_memory=channel)
    iterator = iter(loader)
    next(iterator)
    workers = iterator._workers
    assert isinstance(workers, list) and len(workers) == 2
    pids = [worker.pid for worker in workers]
    assert all(isinstance(pid, int) and pid > 0 for pid in pids)
    assert len(set(pids)) == 2 and os.getpid() not in pids
    assert all(worker.is_alive() for worker in workers)
    rest = list(iterator)
    assert len(rest) == 3
    # An ended epoch stops its workers; the kernel's teardown of each may still run when the
    # epoch ends (mploader.process.reaper: a difference from torch, which joins them), and
    # join() waits for it, as torch's own tests do.
    for worker in workers:
        worker.join(10)
    assert not any(worker.is_alive() for worker in workers), "an ended epoch stops its workers"
    assert [worker.exitcode for worker in workers] == [0, 0]


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("device", ["", "cpu"])
def test_pin_memory_without_accelerator(num_workers: int, device: str, channel: bool) -> None:
    """torch's warnings (on ``iter``), and torch's batches, unpinned."""
    assert not torch.accelerator.is_available(), "these tests assume a CPU-only torch"

    def options() -> dict[str, Any]:
        return dict(dataset=DictItems(5), batch_size=2, num_workers=num_workers,
                    pin_memory=True, pin_memory_device=device)

    reference, loader = make_pair(options, "fork", channel)
    records = []
    for candidate in (reference, loader):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                batches: Any = list(iter(candidate))
            except RuntimeError as error:  # torch 2.6-2.8 pin for pin_memory_device="cpu"
                error.__traceback__ = None
                batches = error
        records.append(([m for m in messages(caught) if m[0] is UserWarning], batches))
    (expected, torch_batches), (actual, mploader_batches) = records
    assert actual == expected  # which warnings depends on the torch (2.6, 2.7-2.8, 2.9+)
    if isinstance(torch_batches, BaseException):
        if num_workers and torch_compat.TORCH_VERSION < (2, 9):
            # On purpose (README): torch 2.6-2.8 fail at iter() looking for the device's
            # current index (2.6: a CUDA initialisation error whatever the device); mploader
            # fails where it pins, with pin_memory()'s own error for that device.
            assert isinstance(mploader_batches, RuntimeError), mploader_batches
        else:
            assert_same_failure(torch_batches, mploader_batches)
        return
    assert_same_batches(torch_batches, mploader_batches)
    assert ([batch["x"].is_pinned() for batch in mploader_batches]
            == [batch["x"].is_pinned() for batch in torch_batches])


def test_too_many_workers_warning() -> None:
    too_many = (os.cpu_count() or 1) + 1
    records = []
    for cls in (torch.utils.data.DataLoader, mploader.DataLoader):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            cls(MAP, num_workers=too_many)
        records.append(messages(caught))
    assert records[0], "torch warns about more workers than CPUs"
    assert records[1] == records[0]


# -- settings torch accepts in the constructor and rejects when iterating --------------------------


# torch's iterator fails half-built; its __del__ then complains that it has no ``_shutdown``.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_zero_prefetch_factor_is_rejected_when_iterating() -> None:
    """``prefetch_factor=0`` passes torch's constructor check, and ``iter`` then refuses it."""
    reference = torch.utils.data.DataLoader(TensorItems(4), num_workers=2, prefetch_factor=0)
    expected = raised(lambda: iter(reference))
    expected.__traceback__ = None  # frees torch's half-built iterator here, not in a later test
    gc.collect()
    assert type(expected) is AssertionError  # its message: since torch 2.10 (a bare assert before)
    loader = mploader.DataLoader(TensorItems(4), num_workers=2, prefetch_factor=0)
    with pytest.raises(AssertionError) as caught:
        iter(loader)
    assert str(caught.value) == str(expected)


def test_timeout_without_workers_is_rejected_when_iterating() -> None:
    """``timeout>0`` with ``num_workers=0``: torch's single-process iterator refuses it."""
    reference = torch.utils.data.DataLoader(TensorItems(4), timeout=5)
    expected = raised(lambda: iter(reference))
    assert type(expected) is AssertionError
    loader = mploader.DataLoader(TensorItems(4), timeout=5)
    with pytest.raises(AssertionError) as caught:
        iter(loader)
    assert str(caught.value) == str(expected)


# -- multiprocessing contexts and what cannot be pickled ------------------------------------------


@pytest.mark.parametrize("start_method", ["fork", "spawn", "forkserver"])
def test_context_object_gives_torch_batches(start_method: str, channel: bool) -> None:
    """``multiprocessing_context`` as a context object (not a name): kept as given, used."""
    context = multiprocessing.get_context(start_method)
    reference, loader = make_pair(
        lambda: dict(dataset=DictItems(5), batch_size=2, shuffle=True,
                     generator=torch.Generator().manual_seed(4), num_workers=1,
                     multiprocessing_context=context), None, channel)
    assert loader.multiprocessing_context is context is reference.multiprocessing_context
    assert_same_batches(list(reference), list(loader))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_iterator_does_not_pickle(num_workers: int) -> None:
    """Both iterators refuse pickling with NotImplementedError, whose args name the iterator's
    class (differs on purpose: mploader's classes have their own names)."""
    errors = []
    for cls in (torch.utils.data.DataLoader, mploader.DataLoader):
        iterator = iter(cls(TensorItems(4), num_workers=num_workers))
        with pytest.raises(NotImplementedError) as caught:
            pickle.dumps(iterator)
        errors.append(caught.value.args)
        del iterator
    (torch_format, torch_name), (format_, name) = errors
    assert format_ == torch_format == "{} cannot be pickled"
    assert torch_name.startswith("_")
    assert name == ("SingleProcessIterator" if num_workers == 0 else "MultiProcessIterator")


@pytest.mark.parametrize("start_method", ["spawn", "forkserver"])
def test_unpicklable_worker_arguments_warn_then_raise(start_method: str, channel: bool) -> None:
    """A collate function that does not pickle under spawn/forkserver: torch's warning (Python
    3.14 makes forkserver the default), then the pickling error itself."""
    outcomes = []
    for cls, extra in ((torch.utils.data.DataLoader, {}),
                       (mploader.DataLoader, {"shared_memory": channel})):
        loader = cls(TensorItems(4), batch_size=2, num_workers=1,
                     collate_fn=lambda batch: batch, multiprocessing_context=start_method,
                     **extra)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises((pickle.PicklingError, AttributeError)) as error:
                iter(loader)
        outcomes.append((messages(caught), (type(error.value), str(error.value))))
    (torch_warnings, torch_error), (warnings_seen, error_text) = outcomes
    assert error_text == torch_error
    pickle_warnings = [m for m in warnings_seen if "pickle error" in m[1]]
    assert pickle_warnings == [m for m in torch_warnings if "pickle error" in m[1]]
    assert len(pickle_warnings) == (torch_compat.TORCH_VERSION >= (2, 10))  # warned since 2.10
