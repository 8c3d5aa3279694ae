"""The messages between the main process and a worker survive the pipe: every field, through
the pickling the pipes use (``ForkingPickler``, as values rather than state dicts)."""

from __future__ import annotations

import pickle
from dataclasses import fields
from multiprocessing.reduction import ForkingPickler

import pytest

from mploader.errors import RemoteError
from mploader.monitor.events import TaskTimings
from mploader.worker import messages
from mploader.worker.resume import WorkerSnapshot

SAMPLES = [
    messages.Task(3, 17, [4, 5, 6], record=False),
    messages.Release([(1, 2)], retired=[(3, 4)]),
    messages.Resume(2, shared_seed=99),
    messages.Stop(),
    messages.WorkerReady(1, 1234, init_failed=True, at=5.5),
    messages.TaskDone(3, 17, 1, payload=b"batch", payload_follows=True,
                      timings=TaskTimings(1.0, 2.0, 3.0), state=WorkerSnapshot(None, {"n": 1})),
    messages.TaskDone(3, 18, 0, error=RemoteError.capture(ValueError("bad"), 0, 1234, [18])),
    messages.IterableExhausted(3, 19, 1, state=WorkerSnapshot(None, None, items=4)),
    messages.Goodbye(),
]


@pytest.mark.parametrize("message", SAMPLES, ids=lambda message: type(message).__name__)
def test_every_field_survives_the_pipe(message: object) -> None:
    copy = pickle.loads(ForkingPickler.dumps(message, pickle.HIGHEST_PROTOCOL))
    assert type(copy) is type(message)
    for item in fields(message):  # type: ignore[arg-type]
        original, copied = getattr(message, item.name), getattr(copy, item.name)
        if isinstance(original, RemoteError):
            assert str(copied.rebuild()) == str(original.rebuild())
        else:
            assert copied == original, item.name


def test_every_message_class_has_a_sample() -> None:
    classes = {value for value in vars(messages).values()
               if isinstance(value, type) and value.__module__ == messages.__name__
               and not value.__name__.startswith("_")}
    assert classes == {type(message) for message in SAMPLES}
