"""The fault table: every failure scenario, run for fork, spawn and forkserver (after loky's
crash-case tests).

Each row (a :class:`FaultRow`) runs one scenario and asserts what the user sees: the error type and
message, or the complete epoch.  The autouse fixture in ``conftest.py`` then checks that no worker
process and no /dev/shm entry is left.
"""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
import torch

import mploader
from mploader.errors import RemoteTraceback, WorkerDiedError, WorkerError

from .fault_row import FaultRow
from .fault_rows_channel import CHANNEL_FAULTS
from .fault_rows_process import PROCESS_FAULTS
from .faulty import CustomError, FailingIter, FailingSetupHooks, Faulty, failing_init


def loader_fault(row_id: str, dataset_kwargs: dict[str, Any], loader_kwargs: dict[str, Any],
                 error_type: type[BaseException], patterns: list[str], seconds: float) -> FaultRow:
    """A row: a ``Faulty`` dataset misbehaves; the epoch must end in ``error_type`` whose message
    matches every pattern, within ``seconds``."""

    def run(start_method: str) -> None:
        loader = mploader.DataLoader(
            Faulty(**dataset_kwargs), batch_size=1, num_workers=2,
            multiprocessing_context=start_method, **loader_kwargs,
        )
        started = time.monotonic()
        with pytest.raises(error_type) as caught:
            for _ in loader:
                pass
        elapsed = time.monotonic() - started
        message = str(caught.value)
        for pattern in patterns:
            assert re.search(pattern, message, re.MULTILINE), f"{pattern!r} not in {message!r}"
        assert elapsed < seconds, f"took {elapsed:.1f} s"
        del caught  # its traceback holds the iterator; like torch's, it lives while referenced

    return FaultRow(row_id, run)


LOADER_FAULTS = [
    loader_fault("getitem_raises", {"how": "raise"}, {}, CustomError, [r"^bad item 3$"], 15),
    loader_fault("unpicklable_error", {"how": "unpicklable_error"}, {}, WorkerError,
                 [r"Unpicklable", r"bad item 3", r"does not pickle"], 15),
    loader_fault("sigkill", {"how": "sigkill"}, {}, WorkerDiedError,
                 [r"^DataLoader worker \(pid \d+\) is killed by signal: Killed\.", r"SIGKILL",
                  r"worker 1", r"task 3 \(indices \[3\]\)", r"killed from outside"], 15),
    loader_fault("sigsegv", {"how": "sigsegv"}, {}, WorkerDiedError,
                 [r"^DataLoader worker \(pid \d+\) is killed by signal: Segmentation fault\.",
                  r"SIGSEGV", r"crash in native code"], 15),
    loader_fault("os_exit", {"how": "exit"}, {}, WorkerDiedError,
                 [r"^DataLoader worker \(pid \d+\) exited unexpectedly with exit code 3\.",
                  r"exit code 3"], 15),
    loader_fault("timeout", {"how": "hang"}, {"timeout": 1.5}, RuntimeError,
                 [r"^DataLoader timed out after 1\.5 seconds$"], 15),
    loader_fault("init_fn_raises", {"how": "none"}, {"worker_init_fn": failing_init},
                 CustomError, [r"init failed in worker 0"], 15),
    loader_fault("hook_raises", {"how": "none"}, {"worker_hooks": FailingSetupHooks()},
                 CustomError, [r"setup failed in worker 0"], 15),
]

# Every row of the fault table.  Other groups of rows live in their own modules (one list each)
# and are added here.
FAULT_TABLE: list[FaultRow] = [*LOADER_FAULTS, *CHANNEL_FAULTS, *PROCESS_FAULTS]


@pytest.mark.parametrize("row", FAULT_TABLE, ids=lambda row: row.id)
def test_fault_table(start_method: str, row: FaultRow) -> None:
    """What the user sees for each failure, on each start method; the autouse fixture then checks
    that no worker process and no /dev/shm entry is left."""
    if start_method not in row.start_methods:
        pytest.skip(f"{row.id} does not apply to {start_method}: {row.why_not_all}")
    row.run(start_method)


def test_exception_keeps_type_attributes_and_worker_traceback(start_method):
    loader = mploader.DataLoader(Faulty("raise"), batch_size=2, num_workers=2,
                                 multiprocessing_context=start_method)
    with pytest.raises(CustomError) as caught:
        list(loader)
    error = caught.value
    assert error.code == 3
    assert isinstance(error.__cause__, RemoteTraceback)
    assert "__getitem__" in str(error.__cause__)
    assert any(re.search(r"worker 1 \(pid \d+\).*indices \[2, 3\]", n) for n in error.__notes__)
    del caught, error


def test_iterable_dataset_iter_raises(start_method):
    loader = mploader.DataLoader(FailingIter(), batch_size=2, num_workers=2,
                                 multiprocessing_context=start_method)
    with pytest.raises(CustomError, match="cannot iterate") as caught:
        list(loader)
    del caught


def test_iterator_survives_a_dataset_error():
    """Like torch: an exception in one batch does not end the epoch."""
    loader = mploader.DataLoader(Faulty("raise", at=1, length=6), batch_size=1, num_workers=2,
                                 multiprocessing_context="fork")
    iterator = iter(loader)
    assert next(iterator).item() == 0
    with pytest.raises(CustomError):
        next(iterator)
    assert [batch.item() for batch in iterator] == [2, 3, 4, 5]


def test_dead_worker_is_noticed_at_once():
    """Sentinels, not a polling interval: a SIGKILL is reported well under a second later."""
    loader = mploader.DataLoader(Faulty("sigkill", at=0), batch_size=1, num_workers=1,
                                 multiprocessing_context="fork")
    iterator = iter(loader)
    time.sleep(0.3)  # the worker is dead by now
    started = time.monotonic()
    with pytest.raises(WorkerDiedError):
        next(iterator)
    assert time.monotonic() - started < 0.5


def test_error_after_death_shuts_down_every_worker():
    loader = mploader.DataLoader(Faulty("sigkill", at=0, length=40, sleep=0.01), batch_size=1,
                                 num_workers=3, multiprocessing_context="fork")
    iterator = iter(loader)
    pids = [process.pid for process in iterator._workers]
    with pytest.raises(WorkerDiedError):
        list(iterator)
    from .conftest import wait_until_gone

    assert wait_until_gone(pids, seconds=0.5) == []


def test_torch_agrees_on_the_death_message():
    """The first sentence is torch's own (from its SIGCHLD handler): same text, same pattern."""
    torch_loader = torch.utils.data.DataLoader(Faulty("sigkill", at=0), batch_size=1,
                                               num_workers=1, multiprocessing_context="fork")
    with pytest.raises(RuntimeError) as torch_caught:
        list(torch_loader)
    pattern = r"DataLoader worker \(pid(\(s\))? \d+\) (is killed by signal: Killed|exited)"
    assert re.search(pattern, str(torch_caught.value))
