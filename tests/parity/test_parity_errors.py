"""Errors raised while loading: in ``__getitem__``, in an iterable, in collation, in
``worker_init_fn``, and timeouts.  Torch's iterator goes on after a dataset error; so does
mploader's, and the batches after the error are torch's.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch

import mploader
from mploader.errors import RemoteTraceback, WorkerError

from .datasets import (
    BadReduceError,
    DetailedError,
    FailingDataset,
    FailingIterable,
    NoneItems,
    RaggedItems,
    RequiresGradItems,
    SlowItems,
    SparseItems,
    TensorItems,
    assert_same,
    failing_worker_init,
    make_pair,
    unpicklable_collate,
)

# A stuck loader fails its test after a minute, not the default two.
pytestmark = pytest.mark.timeout(60)

# A bound on every loop below: a loader that stops answering fails the test instead of hanging it.
MAX_STEPS = 50


def outcomes(loader: Any) -> list[tuple[str, Any]]:
    """Every step of one epoch: ``("batch", batch)`` or ``("error", exception)``, to the end."""
    result: list[tuple[str, Any]] = []
    iterator = iter(loader)
    for _ in range(MAX_STEPS):
        try:
            result.append(("batch", next(iterator)))
        except StopIteration:
            return result
        except Exception as error:
            result.append(("error", error))
    raise AssertionError(f"no end after {MAX_STEPS} steps: {result}")


def assert_same_outcomes(expected: list[tuple[str, Any]], actual: list[tuple[str, Any]]) -> None:
    kinds = [kind for kind, _ in actual]
    assert kinds == [kind for kind, _ in expected], f"mploader {actual}\ntorch {expected}"
    for step, ((_, e), (kind, a)) in enumerate(zip(expected, actual, strict=True)):
        if kind == "batch":
            assert_same(e, a, f"step {step}")
        else:
            assert type(a) is type(e), f"step {step}: {type(a)!r} != torch's {type(e)!r}"


def original_message(error: BaseException) -> str:
    """The message the dataset raised with (``str`` of a KeyError adds quotes)."""
    return str(error.args[0]) if error.args else str(error)


CASES = {
    "value": ValueError,
    "key": KeyError,
    "index": IndexError,
    "zero": ZeroDivisionError,
}


@pytest.mark.parametrize(
    ("start_method", "kind"),
    [("fork", kind) for kind in CASES] + [("spawn", "value"), ("forkserver", "key")],
)
def test_getitem_error(start_method: str, kind: str, channel: bool) -> None:
    """Same type as torch; the original text in the message; the worker traceback as cause; a note
    naming the worker and the indices; and the next batches are torch's."""

    def options() -> dict[str, Any]:
        return dict(dataset=FailingDataset(12, bad=(4, 9), kind=kind), batch_size=2,
                    num_workers=2)

    reference, loader = make_pair(options, start_method, channel)
    expected, actual = outcomes(reference), outcomes(loader)
    assert_same_outcomes(expected, actual)
    errors = [(step, error) for step, (what, error) in enumerate(actual) if what == "error"]
    assert [step for step, _ in errors] == [2, 4], "indices 4 and 9 are in batches 2 and 4"
    for step, error in errors:
        assert isinstance(error, CASES[kind])
        bad = 4 if step == 2 else 9
        text = original_message(error)
        assert str(bad) in text
        torch_error = expected[step][1]
        assert text in str(torch_error), "torch's message holds the same original text"
        assert text in str(error)
        cause = error.__cause__
        assert isinstance(cause, RemoteTraceback)
        assert "__getitem__" in str(cause) and text in str(cause)
        notes = getattr(error, "__notes__", [])
        worker = step % 2
        indices = [2 * step, 2 * step + 1]
        assert any(f"worker {worker}" in note and str(indices) in note for note in notes), notes


@pytest.mark.parametrize("start_method", ["fork"])
def test_stop_iteration_leaking_from_getitem(start_method: str, channel: bool) -> None:
    """A map-style ``__getitem__`` that leaks StopIteration (``next()`` on an exhausted inner
    iterator): torch re-raises it from ``__next__`` like any worker exception (which ends a
    ``for`` loop), and the iterator goes on if asked; the worker lives on."""

    def options() -> dict[str, Any]:
        return dict(dataset=FailingDataset(10, bad=(4,), kind="stop"), batch_size=2,
                    num_workers=2)

    def steps(loader: Any) -> list[tuple[str, Any]]:
        result: list[tuple[str, Any]] = []
        iterator = iter(loader)
        for _ in range(MAX_STEPS):
            try:
                result.append(("batch", next(iterator)))
            except StopIteration as stop:
                result.append(("stop", stop))
                if not stop.args:
                    return result
            except Exception as error:
                result.append(("error", error))
        raise AssertionError(f"no end after {MAX_STEPS} steps: {result}")

    reference, loader = make_pair(options, start_method, channel)
    expected, actual = steps(reference), steps(loader)
    assert [kind for kind, _ in expected] == ["batch", "batch", "stop", "batch", "batch", "stop"]
    assert_same_outcomes(expected, actual)
    assert "leaked StopIteration at 4" in str(actual[2][1])


@pytest.mark.parametrize("start_method", ["fork"])
def test_getitem_error_out_of_order(start_method: str, channel: bool) -> None:
    """``in_order=False``: the same errors and the same multiset of batches."""

    def options() -> dict[str, Any]:
        return dict(dataset=FailingDataset(12, bad=(4, 9)), batch_size=2, num_workers=2,
                    in_order=False)

    reference, loader = make_pair(options, start_method, channel)
    expected, actual = outcomes(reference), outcomes(loader)
    assert sorted(kind for kind, _ in actual) == sorted(kind for kind, _ in expected)
    batches = [sorted(b.flatten().tolist()) for kind, b in actual if kind == "batch"]
    assert sorted(batches) == sorted(
        sorted(b.flatten().tolist()) for kind, b in expected if kind == "batch"
    )
    assert all(type(e) is ValueError for kind, e in actual if kind == "error")


@pytest.mark.parametrize("start_method", ["fork"])
def test_custom_exception_keeps_its_attributes(start_method: str, channel: bool) -> None:
    """mploader raises the worker's exception object itself (torch would build a RuntimeError
    from the text because ``DetailedError(msg)`` cannot be constructed)."""
    loader = mploader.DataLoader(FailingDataset(6, bad=(3,), kind="detailed"), batch_size=2,
                                 num_workers=2, multiprocessing_context=start_method,
                                 shared_memory=channel)
    result = outcomes(loader)
    assert [kind for kind, _ in result] == ["batch", "error", "batch"]
    error = result[1][1]
    assert type(error) is DetailedError
    assert error.index == 3 and error.detail == {"why": "test", "n": 3}
    assert str(error) == "detailed failure at 3"
    assert isinstance(error.__cause__, RemoteTraceback)
    assert any("worker 1" in note and "[2, 3]" in note for note in error.__notes__)
    assert result[2][1].tolist() == [[4], [5]]


@pytest.mark.parametrize("start_method", ["fork"])
def test_exception_that_does_not_pickle(start_method: str, channel: bool) -> None:
    """An exception that cannot be pickled arrives as a WorkerError holding its text."""
    loader = mploader.DataLoader(FailingDataset(6, bad=(0,), kind="unpicklable"), batch_size=2,
                                 num_workers=2, multiprocessing_context=start_method,
                                 shared_memory=channel)
    result = outcomes(loader)
    assert [kind for kind, _ in result] == ["error", "batch", "batch"]
    error = result[0][1]
    assert isinstance(error, WorkerError) and isinstance(error, RuntimeError)
    assert "UnpicklableError" in str(error)
    assert "unpicklable failure at 0" in str(error)
    assert isinstance(error.__cause__, RemoteTraceback)


@pytest.mark.parametrize("start_method", ["fork"])
def test_exception_whose_init_takes_other_arguments(start_method: str, channel: bool) -> None:
    """``BadReduceError(msg, code)`` pickles but does not unpickle by calling ``__init__``:
    mploader still raises it as itself, attributes included."""
    loader = mploader.DataLoader(FailingDataset(6, bad=(0,), kind="bad_reduce"), batch_size=2,
                                 num_workers=2, multiprocessing_context=start_method,
                                 shared_memory=channel)
    result = outcomes(loader)
    assert [kind for kind, _ in result] == ["error", "batch", "batch"]
    error = result[0][1]
    assert type(error) is BadReduceError
    assert error.code == 7 and str(error) == "bad reduce at 0"
    assert isinstance(error.__cause__, RemoteTraceback)


@pytest.mark.parametrize("start_method", ["fork"])
def test_iterable_error_then_exhaustion(start_method: str, channel: bool) -> None:
    """An iterable's generator that raises is over: its worker's next task ends its shard."""

    def options() -> dict[str, Any]:
        return dict(dataset=FailingIterable(13, fail_at=6), batch_size=2, num_workers=2)

    reference, loader = make_pair(options, start_method, channel)
    expected, actual = outcomes(reference), outcomes(loader)
    assert_same_outcomes(expected, actual)
    assert any(kind == "error" for kind, _ in actual)
    error = next(error for kind, error in actual if kind == "error")
    assert "iterable item 6 is broken" in str(error)


@pytest.mark.parametrize("start_method", ["fork"])
@pytest.mark.parametrize(
    "dataset",
    [SparseItems, RaggedItems, NoneItems, RequiresGradItems],
    ids=["sparse", "ragged", "none", "requires-grad"],
)
def test_default_collate_errors(start_method: str, channel: bool, dataset: Any) -> None:
    """Samples that torch's ``default_collate`` rejects inside a worker: the same error type and
    text.  (Leaf tensors requiring grad are refused only in workers, where torch stacks with
    ``out=``; in the main process they stack.)"""

    def options() -> dict[str, Any]:
        return dict(dataset=dataset(), batch_size=2, num_workers=2)

    reference, loader = make_pair(options, start_method, channel)
    expected, actual = outcomes(reference), outcomes(loader)
    assert_same_outcomes(expected, actual)
    for (_, e), (kind, a) in zip(expected, actual, strict=True):
        if kind == "error":
            torch_text = str(e).split("Original Traceback")[-1]
            assert str(a).splitlines()[0] in torch_text


def test_default_collate_errors_without_workers() -> None:
    """The reference point of the test above: in the main process both raise torch's error."""
    for dataset in (SparseItems(), RaggedItems(), NoneItems(), RequiresGradItems()):
        reference, loader = make_pair(lambda d=dataset: dict(dataset=d, batch_size=2), None, False)
        expected, actual = outcomes(reference), outcomes(loader)
        assert_same_outcomes(expected, actual)
        for (_, e), (_, a) in zip(expected, actual, strict=True):
            assert str(a) == str(e)


@pytest.mark.parametrize("start_method", ["fork"])
def test_worker_init_fn_error(start_method: str, channel: bool) -> None:
    """``worker_init_fn`` fails in worker 1: every batch of worker 1 raises (torch: the init error,
    then an UnboundLocalError for its later batches); worker 0's batches are torch's.  The
    iterator must not wait forever for worker 1's later batches."""

    def options() -> dict[str, Any]:
        return dict(dataset=TensorItems(8), batch_size=2, num_workers=2,
                    worker_init_fn=failing_worker_init, timeout=3)

    reference, loader = make_pair(options, start_method, channel)
    expected, actual = outcomes(reference), outcomes(loader)
    assert [kind for kind, _ in expected] == ["batch", "error", "batch", "error"]
    assert [kind for kind, _ in actual] == ["batch", "error", "batch", "error"], actual
    assert type(actual[1][1]) is type(expected[1][1]) is RuntimeError
    assert "worker_init_fn failed in worker 1" in str(actual[1][1])
    for step in (0, 2):
        assert_same(expected[step][1], actual[step][1])
    assert "timed out" not in str(actual[3][1])


@pytest.mark.parametrize("start_method", ["fork"])
def test_timeout(start_method: str, channel: bool) -> None:
    """A batch slower than ``timeout``: torch's RuntimeError, word for word."""

    def options() -> dict[str, Any]:
        return dict(dataset=SlowItems(4, slow_index=0, seconds=1.5), batch_size=2,
                    num_workers=1, timeout=0.3)

    reference, loader = make_pair(options, start_method, channel)
    errors = []
    for candidate in (reference, loader):
        with pytest.raises(RuntimeError) as caught:
            next(iter(candidate))
        errors.append(str(caught.value))
    assert errors[1] == errors[0]
    assert re.fullmatch(r"DataLoader timed out after 0\.3 seconds", errors[1])


@pytest.mark.parametrize("start_method", ["fork"])
def test_batch_that_cannot_be_sent_is_an_error_not_a_hang(start_method: str, channel: bool) -> None:
    """A collate_fn returning something unpicklable: mploader reports it (torch's queue feeder
    thread would drop the batch and the main process would wait until its timeout)."""
    loader = mploader.DataLoader(TensorItems(4), batch_size=2, num_workers=1,
                                 collate_fn=unpicklable_collate, timeout=5,
                                 multiprocessing_context=start_method, shared_memory=channel)
    result = outcomes(loader)
    assert [kind for kind, _ in result] == ["error", "error"]
    for _, error in result:
        assert "timed out" not in str(error)
        assert "lock" in str(error).lower()


@pytest.mark.parametrize("start_method", ["fork"])
def test_error_with_persistent_workers_next_epoch(start_method: str, channel: bool) -> None:
    """An error in one epoch does not poison the next epoch of persistent workers."""

    def options() -> dict[str, Any]:
        return dict(dataset=FailingDataset(8, bad=(2,)), batch_size=2, num_workers=2,
                    persistent_workers=True, shuffle=True,
                    generator=torch.Generator().manual_seed(3))

    reference, loader = make_pair(options, start_method, channel)
    for epoch in range(2):
        assert_same_outcomes(outcomes(reference), outcomes(loader))
        assert epoch in (0, 1)
