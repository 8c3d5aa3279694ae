"""Every way an epoch can end early, and the main process's own death."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
import torch

import mploader

from .conftest import wait_until_gone
from .faulty import Slow


def test_early_break_stops_workers(start_method):
    loader = mploader.DataLoader(Slow(), batch_size=1, num_workers=2,
                                 multiprocessing_context=start_method)
    iterator = iter(loader)
    next(iterator)
    pids = [process.pid for process in iterator._workers]
    del iterator
    gc.collect()
    assert wait_until_gone(pids, seconds=3) == []


def test_break_in_for_loop_leaves_nothing():
    """``break`` drops the loop's iterator: its workers stop, with no collection asked for."""
    loader = mploader.DataLoader(Slow(), batch_size=1, num_workers=2,
                                 multiprocessing_context="fork")
    before = {child.pid for child in psutil.Process().children()}  # helpers of earlier tests
    pids: list[int] = []
    for index, _ in enumerate(loader):
        if index == 2:
            pids = [child.pid for child in psutil.Process().children() if child.pid not in before]
            break
    assert len(pids) >= 2
    assert wait_until_gone(pids, seconds=3) == []


def test_garbage_collected_mid_epoch_in_a_cycle():
    """An iterator kept alive only by a reference cycle is still shut down by the collector."""
    loader = mploader.DataLoader(Slow(), batch_size=1, num_workers=2,
                                 multiprocessing_context="fork")
    iterator = iter(loader)
    next(iterator)
    pids = [process.pid for process in iterator._workers]
    holder = {"iterator": iterator}
    holder["self"] = holder
    del iterator, holder
    gc.collect()
    assert wait_until_gone(pids, seconds=3) == []


def test_lightning_style_shutdown_is_idempotent():
    loader = mploader.DataLoader(Slow(), batch_size=1, num_workers=2,
                                 multiprocessing_context="fork", persistent_workers=True)
    iterator = iter(loader)
    next(iterator)
    pids = [process.pid for process in iterator._workers]
    loader._iterator._shutdown_workers()
    loader._iterator._shutdown_workers()
    assert wait_until_gone(pids, seconds=0.5) == []
    with pytest.raises(StopIteration):
        next(iterator)
    # A new epoch after shutdown starts fresh workers.
    assert [b.item() for b in loader][:3] == [0, 1, 2]


def test_keyboard_interrupt_while_waiting(start_method):
    loader = mploader.DataLoader(Slow(sleep=5.0), batch_size=1, num_workers=2,
                                 multiprocessing_context=start_method)
    iterator = iter(loader)
    pids = [process.pid for process in iterator._workers]

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.5 if start_method == "fork" else 3.0)
    try:
        with pytest.raises(KeyboardInterrupt):
            next(iterator)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert wait_until_gone(pids, seconds=8) == []


def test_two_loaders_at_once(start_method):
    first = mploader.DataLoader(Slow(length=12, sleep=0.01), batch_size=2, num_workers=2,
                                multiprocessing_context=start_method)
    second = mploader.DataLoader(Slow(length=12, sleep=0.01), batch_size=3, num_workers=2,
                                 multiprocessing_context=start_method)
    a, b = iter(first), iter(second)
    got_a, got_b = [], []
    for _ in range(6):
        got_a.append(next(a).tolist())
        got_b.append(next(b, None))
    assert [row for batch in got_a for row in batch] == [[i] for i in range(12)]
    assert [row for batch in got_b if batch is not None for row in batch.tolist()] == [
        [i] for i in range(12)
    ]


def test_a_forked_child_never_shuts_down_the_parents_loader():
    """Regression: a forked child's garbage collector found its inherited copy of an abandoned
    iterator and ran that iterator's shutdown in the child: it stopped the parent's workers and
    could block reading their result pipes.  Shutdown now belongs to the process that started
    the workers; a child (a worker of another loader, or user code calling fork) leaves it."""
    loader = mploader.DataLoader(Slow(length=24, sleep=0.01), batch_size=2, num_workers=2,
                                 multiprocessing_context="fork")
    gc.disable()  # the abandoned iterator stays uncollected in the parent while the child runs
    try:
        iterator = iter(loader)
        next(iterator)
        pids = [process.pid for process in iterator._workers]
        cycle = {"iterator": iterator}
        cycle["self"] = cycle
        del cycle, iterator  # garbage now, reachable by no frame
        child = os.fork()
        if child == 0:
            gc.collect()
            os._exit(0)
        os.waitpid(child, 0)
        assert wait_until_gone(pids, seconds=0.3) == pids  # the child stopped nobody
    finally:
        gc.enable()
    gc.collect()  # the parent's own collection does shut them down
    assert wait_until_gone(pids, seconds=3) == []


def test_the_sigchld_handler_takes_no_lock():
    """Regression: the handler took the module's lock; a SIGCHLD arriving while it was held (by
    register(), or by the handler itself when several workers end together) deadlocked."""
    import threading

    from mploader.process import sigchld

    done = threading.Event()

    def handle_while_locked() -> None:
        with sigchld._lock:
            sigchld._on_sigchld(signal.SIGCHLD, None)
        done.set()

    thread = threading.Thread(target=handle_while_locked, daemon=True)
    thread.start()
    assert done.wait(2.0), "the SIGCHLD handler blocked on a lock its own process holds"


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_many_workers_ending_together():
    """Eight workers stopping at once deliver nested SIGCHLDs; thirty rounds must not hang,
    and each round's workers are gone before the next starts (none is left a zombie)."""
    for _ in range(30):
        loader = mploader.DataLoader(Slow(length=64, sleep=0.0), batch_size=1, num_workers=8,
                                     multiprocessing_context="fork")
        iterator = iter(loader)
        next(iterator)
        pids = [process.pid for process in iterator._workers]
        iterator._shutdown_workers()
        assert wait_until_gone(pids, seconds=5) == []


ABANDONED_THEN_FORKED = """
import gc, sys
sys.path.insert(0, {tests!r})
import mploader
from lifecycle.faulty import CollectsGarbage, CustomError, Faulty

gc.disable()  # the abandoned iterator stays uncollected garbage while the next workers fork
abandoned = mploader.DataLoader(Faulty("raise", at=0, length=4), batch_size=None, num_workers=2,
                                multiprocessing_context="fork", shared_memory=False)
try:
    list(abandoned)
except CustomError:
    pass  # the iterator is garbage now: a cycle through the error's traceback
loader = mploader.DataLoader(CollectsGarbage(), batch_size=None, num_workers=2,
                             multiprocessing_context="fork")  # each item runs gc.collect()
print([int(item) for item in loader])
"""


def test_fork_workers_collecting_an_inherited_iterator_close_nothing_of_theirs():
    """Regression: a fork worker closed the fds it inherited from an abandoned iterator (still
    uncollected garbage in the parent); when the worker's own collector then freed that
    iterator's Connection objects, each closed its fd number again: `Bad file descriptor`
    tracebacks, or, had the worker reused the number, one of its own files closed under it.
    Inherited pipes are now replaced by /dev/null, which keeps each number taken."""
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    result = subprocess.run([sys.executable, "-c", ABANDONED_THEN_FORKED.format(tests=tests)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(list(range(6)))
    assert "Bad file descriptor" not in result.stderr, result.stderr


def test_a_worker_with_nothing_left_to_do_is_let_go_before_the_epoch_ends(start_method):
    """Without persistent workers, a worker whose part of the epoch is done (every task drawn
    from the sampler and all its results received) is asked to stop at once, while the consumer
    still works on the last batches: its exit (tearing down a process that mapped hundreds of MB
    takes tens of milliseconds) no longer delays the epoch's end.  Its batches are all still
    delivered, and the epoch ends as usual."""
    loader = mploader.DataLoader(list(range(6)), batch_size=None, num_workers=1,
                                 multiprocessing_context=start_method)
    iterator = iter(loader)
    pids = [process.pid for process in iterator._workers]
    received = [next(iterator) for _ in range(6)]  # not the seventh call, which ends the epoch
    try:
        assert wait_until_gone(pids, seconds=5) == [], "the worker waits for the epoch's end"
    finally:
        iterator._shutdown_workers()  # a failure leaves no worker to the next test
    assert [int(value) for value in received] == list(range(6))
    with pytest.raises(StopIteration):
        next(iterator)
    assert [int(value) for value in loader] == list(range(6))  # the next epoch, new workers


def test_a_worker_whose_iterable_ran_out_is_let_go_before_the_epoch_ends():
    """As torch does: a worker whose iterable dataset ran out is told to stop while the others
    go on (worker 0 has no items here, worker 1 has six)."""
    loader = mploader.DataLoader(SecondWorkerOnly(6), batch_size=None, num_workers=2,
                                 multiprocessing_context="fork")
    iterator = iter(loader)
    first_pid = iterator._workers[0].pid
    received = [next(iterator) for _ in range(6)]
    try:
        assert wait_until_gone([first_pid], seconds=5) == [], "worker 0 waits for the end"
    finally:
        iterator._shutdown_workers()
    assert [int(value) for value in received] == list(range(6))


class SecondWorkerOnly(torch.utils.data.IterableDataset):
    def __init__(self, length: int) -> None:
        self.length = length

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        return iter(range(self.length) if info is not None and info.id == 1 else ())


def test_a_worker_whose_undelivered_batches_it_shares_is_let_go_only_once_they_are_decoded():
    """A batch holding tensors that are not plain (a sparse one here) travels as torch's workers
    send it: its storages are shared, and unpickling it takes their file descriptors from the
    worker (its ``resource_sharer`` thread).  A worker let go early would take them with it
    (``ConnectionResetError`` at the batch's delivery), so it is let go only once every batch of
    it that shares is decoded.  Each worker's last batch waits here for a second while the
    other's is delivered: time enough for a worker asked to stop to be gone."""
    loader = mploader.DataLoader(SparseItems(4), batch_size=None, num_workers=2,
                                 multiprocessing_context="fork", shared_memory=True)
    iterator = iter(loader)
    received = [next(iterator)]
    try:
        for _ in range(3):  # the loader has every result before the second call
            time.sleep(1.0)
            received.append(next(iterator))
    finally:
        iterator._shutdown_workers()
    assert [int(value.to_dense()[0, 0]) for value in received] == list(range(4))


class SparseItems(torch.utils.data.Dataset):
    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        return (torch.eye(3) * index).to_sparse()
