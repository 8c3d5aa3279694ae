"""A large batch's copy into its block runs on the worker's reply thread, beside the next fetch.

What must hold: replies keep their order (a small reply behind a large one waits for it), a copy
that fails becomes the task's error, a closed pipe ends the worker quietly, and the shared copy's
jobs each run once whichever thread takes them.  Through a real loader, and through the
``ReplySender`` on a real pipe.
"""

from __future__ import annotations

import multiprocessing
import pickle
import threading

import pytest
import torch

import mploader
from mploader.channel.shm.copier import Copier
from mploader.errors import RemoteError
from mploader.worker.messages import TaskDone
from mploader.worker.replies import BACKGROUND_COPY_BYTES, ReplySender

BIG_FLOATS = BACKGROUND_COPY_BYTES // 4 + 1024  # just over the background threshold


class BigAndSmall(torch.utils.data.Dataset):
    """Even items: a tensor just above the background-copy threshold; odd ones: a tiny one."""

    def __len__(self) -> int:
        return 6

    def __getitem__(self, index: int) -> torch.Tensor:
        if index % 2:
            return torch.tensor([float(index)])
        return torch.full((BIG_FLOATS,), float(index))


@pytest.mark.parametrize("persistent", [False, True], ids=["fresh", "persistent"])
def test_large_and_small_batches_arrive_in_order(persistent):
    loader = mploader.DataLoader(BigAndSmall(), batch_size=None, num_workers=1,
                                 multiprocessing_context="fork", persistent_workers=persistent)
    for _ in range(2):
        values = []
        for batch in loader:
            assert batch.numel() == (1 if len(values) % 2 else BIG_FLOATS)
            assert bool((batch == float(len(values))).all())
            values.append(len(values))
            del batch
        assert values == list(range(6))


class _Payload:
    """A ``PendingPayload`` that records where and how it was finished, or fails."""

    def __init__(self, copy_bytes: int, data: bytes = b"payload", error: Exception | None = None):
        self.copy_bytes = copy_bytes
        self.data = data
        self.error = error
        self.finished_on: str | None = None
        self.alone: bool | None = None
        self.release = threading.Event()
        self.release.set()

    def finish(self, alone: bool = True) -> bytes:
        self.release.wait(10)
        self.finished_on = threading.current_thread().name
        self.alone = alone
        if self.error is not None:
            raise self.error
        return self.data


def _received(reader) -> list[TaskDone]:
    messages = []
    while reader.poll(0.5):
        message = pickle.loads(reader.recv_bytes())
        if message.payload_follows:
            message.payload = reader.recv_bytes()
        messages.append(message)
    return messages


def test_a_large_copy_is_made_on_the_reply_thread_and_later_replies_wait_for_it():
    reader, writer = multiprocessing.Pipe(duplex=False)
    sender = ReplySender(writer)
    large = _Payload(BACKGROUND_COPY_BYTES, b"large")
    large.release.clear()  # the copy is still running while the next reply is sent
    small = _Payload(0, b"small")
    sender.send(TaskDone(0, 0, 0), large, [0])
    sender.send(TaskDone(0, 1, 0), small, [1])
    assert not reader.poll(0.2), "a reply was written before the large one it follows"
    large.release.set()
    sender.close()
    messages = _received(reader)
    assert [(message.task_id, message.payload) for message in messages] == [
        (0, b"large"), (1, b"small")]
    assert large.finished_on == small.finished_on == "mploader-replies"
    assert large.alone is False  # beside the loop's next fetch: no extra copy threads


def test_a_small_reply_with_nothing_queued_is_written_on_the_callers_thread():
    reader, writer = multiprocessing.Pipe(duplex=False)
    sender = ReplySender(writer)
    small = _Payload(BACKGROUND_COPY_BYTES - 1)
    sender.send(TaskDone(0, 0, 0), small, [0])
    assert small.finished_on == threading.current_thread().name and small.alone is True
    assert [message.task_id for message in _received(reader)] == [0]
    sender.close()


def test_a_failed_copy_becomes_the_tasks_error_and_the_next_reply_still_comes():
    reader, writer = multiprocessing.Pipe(duplex=False)
    sender = ReplySender(writer)
    failing = _Payload(BACKGROUND_COPY_BYTES, error=ValueError("the copy failed"))
    sender.send(TaskDone(0, 0, 3), failing, [4, 5])
    sender.send(TaskDone(0, 1, 3), _Payload(0, b"next"), [6])
    sender.close()
    first, second = _received(reader)
    assert first.payload is None and isinstance(first.error, RemoteError)
    rebuilt = first.error.rebuild()
    assert isinstance(rebuilt, ValueError) and str(rebuilt) == "the copy failed"
    assert first.error.worker_id == 3 and "[4, 5]" in str(first.error.indices)
    assert (second.task_id, second.payload, second.error) == (1, b"next", None)


def test_a_closed_pipe_met_by_the_reply_thread_stops_the_next_send():
    reader, writer = multiprocessing.Pipe(duplex=False)
    sender = ReplySender(writer)
    reader.close()
    sender.send(TaskDone(0, 0, 0), _Payload(BACKGROUND_COPY_BYTES), [0])
    with pytest.raises(BrokenPipeError):
        sender.flush()
    with pytest.raises(BrokenPipeError):
        sender.send(TaskDone(0, 1, 0), _Payload(0), [1])
    sender.close()


def _run_shared_while_helped(jobs: list) -> BaseException | None:
    """Run ``jobs`` with ``Copier.run_shared`` on a thread of its own, whose first job waits until
    this thread has helped: the helper takes the others.  The error run_shared raised, if any."""
    copier = Copier(1)
    first_started = threading.Event()
    helped = threading.Event()
    raised: list[BaseException] = []

    def first() -> None:
        first_started.set()
        helped.wait(10)

    def run() -> None:
        try:
            copier.run_shared([first, *jobs])
        except BaseException as error:
            raised.append(error)

    runner = threading.Thread(target=run, name="copy")
    runner.start()
    assert first_started.wait(10)
    copier.help()
    helped.set()
    runner.join(10)
    assert not runner.is_alive()
    return raised[0] if raised else None


def test_a_shared_copy_runs_each_job_once_on_whichever_thread_takes_it():
    ran: list[tuple[int, str]] = []
    jobs = [lambda number=number: ran.append((number, threading.current_thread().name))
            for number in range(1, 8)]
    assert _run_shared_while_helped(jobs) is None
    assert sorted(number for number, _ in ran) == list(range(1, 8))
    assert {name for _, name in ran} == {threading.current_thread().name}


def test_a_shared_copy_raises_the_error_of_a_job_another_thread_ran():
    def failing() -> None:
        raise OSError("no space")

    error = _run_shared_while_helped([failing])
    assert isinstance(error, OSError) and str(error) == "no space"
