"""``stats()`` as a person debugging a loader reads it: the worker's own state, a readable table,
reachable from the loader alone (any ``num_workers``), and from another thread."""

from __future__ import annotations

import re
import threading
import time

import pytest
import torch
from torch.utils.data import Dataset

import mploader

from .faulty import Slow


class SlowAt(Dataset):
    """``tensor([index])``; the items in ``slow`` sleep their number of seconds."""

    def __init__(self, slow: dict[int, float], length: int = 16) -> None:
        self.slow, self.length = slow, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        time.sleep(self.slow.get(index, 0.0))
        return torch.tensor([index])


def _loader(dataset: Dataset, num_workers: int, **kwargs) -> mploader.DataLoader:
    context = "fork" if num_workers else None
    return mploader.DataLoader(dataset, batch_size=1, num_workers=num_workers,
                               multiprocessing_context=context, **kwargs)


def test_finished_results_read_as_waiting_not_busy():
    # The scenario: one next(), then a 1 s "training step" during which every prefetched
    # batch is finished.  The workers are not busy: their results wait for the consumer.
    iterator = iter(_loader(SlowAt({}), num_workers=2))
    next(iterator)
    time.sleep(1.0)
    stats = iterator.stats()
    for worker in stats.workers:
        assert worker.state == "result waiting", worker
        assert worker.current_task is None and worker.current_task_seconds == 0.0
        assert worker.results_waiting == 2  # tasks 2, 4 from worker 0; 1, 3 from worker 1
    assert stats.tasks_in_flight == 4
    assert [next(iterator).item() for _ in range(4)] == [1, 2, 3, 4]


def test_busy_for_counts_from_when_the_worker_took_the_task():
    # Worker 1 runs task 1 (1 s), then task 3 (long).  1.5 s in, it has been on task 3 for about
    # 0.5 s, although task 3 was dispatched at the start.
    iterator = iter(_loader(SlowAt({1: 1.0, 3: 3.0}), num_workers=2))
    next(iterator)
    time.sleep(1.5)
    worker = iterator.stats().workers[1]
    assert worker.state == "busy"
    assert worker.current_task == 3
    assert 0.3 < worker.current_task_seconds < 1.0, worker.current_task_seconds
    assert worker.results_waiting == 1  # task 1
    iterator._shutdown_workers()


def test_idle_worker():
    loader = _loader(SlowAt({}, length=2), num_workers=2, persistent_workers=True)
    iterator = iter(loader)
    assert [b.item() for b in iterator] == [0, 1]
    assert [w.state for w in iterator.stats().workers] == ["idle", "idle"]
    iterator._shutdown_workers()


def test_loader_stats_live_and_after_the_epoch():
    loader = _loader(Slow(length=6, sleep=0.01), 2)
    with pytest.raises(RuntimeError, match="no iterator yet"):
        loader.stats()
    iterator = iter(loader)
    next(iterator)
    live = loader.stats()
    assert live.batches_delivered == 1 and len(live.workers) == 2
    assert {w.pid for w in live.workers} == {p.pid for p in iterator._workers}
    list(iterator)
    del iterator
    last = loader.stats()  # the last iterator's, after its epoch
    assert last.batches_delivered == 6
    assert [w.state for w in last.workers] == ["exited", "exited"]
    assert sum(w.tasks_done for w in last.workers) == 6


def test_loader_stats_without_workers():
    loader = mploader.DataLoader(Slow(length=4, sleep=0.02), batch_size=2)
    iterator = iter(loader)
    next(iterator)
    time.sleep(0.05)
    next(iterator)
    stats = loader.stats()
    assert stats.workers == ()
    assert stats.batches_delivered == 2 and stats.tasks_in_flight == 0
    assert stats.wait_seconds >= 0.07  # four items of 20 ms, loaded in the main process
    assert stats.consumer_seconds >= 0.04
    text = str(stats)
    assert "no workers" in text and "2 batches delivered" in text


def test_stats_from_another_thread_while_iterating():
    loader = _loader(Slow(length=40, sleep=0.005), num_workers=2)
    snapshots, stop = [], threading.Event()

    def watch() -> None:
        while not stop.is_set():
            try:
                snapshots.append(loader.stats())
            except RuntimeError:  # no iterator yet
                pass
            time.sleep(0.001)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        assert [b.item() for b in loader] == list(range(40))
    finally:
        stop.set()
        watcher.join()
    assert snapshots and all(len(s.workers) == 2 for s in snapshots)


def _columns(line: str) -> list[str]:
    return re.split(r"\s{2,}", line.strip())


@pytest.mark.parametrize("num_workers", [0, 2, 8])
def test_readable_str(num_workers):
    loader = _loader(SlowAt({}, length=64), num_workers=num_workers)
    iterator = iter(loader)
    for _ in range(3):
        next(iterator)
    time.sleep(0.3)
    stats = iterator.stats()
    text = str(stats)
    lines = text.splitlines()
    assert len(lines) < 20
    assert max(len(line) for line in lines) <= 100
    assert "3 batches delivered" in lines[0]
    assert re.search(r"bottleneck: (loader|consumer) \(\d+%", text)
    assert re.search(r"waited for data( \(loaded here\))? \d+% ", text)
    if num_workers == 0:
        assert "no workers" in text
        return
    header = next(i for i, line in enumerate(lines) if line.lstrip().startswith("worker"))
    rows = [_columns(line) for line in lines[header + 1: header + 1 + num_workers]]
    assert [int(row[0]) for row in rows] == list(range(num_workers))
    for row, worker in zip(rows, stats.workers, strict=True):
        assert int(row[1]) == worker.pid
        assert row[2] == worker.state
        assert row[3] == "-" or row[3].startswith("task "), row  # current task, for how long
        assert re.fullmatch(r"\d+", row[4]), row  # tasks done
        assert re.fullmatch(r"\d+%", row[5]), row  # busy share
        assert re.fullmatch(r"\d+ / \d+", row[6]), row  # RSS / USS in MB
        rss_mb = int(row[6].split(" / ")[0])
        assert abs(rss_mb - worker.rss_bytes / 2**20) < 2
    assert "in flight" in text and "MB" in text
    long = repr(stats)
    assert long.startswith("LoaderStats(") and "rss_bytes=" in long
    iterator._shutdown_workers()


def test_str_names_the_current_task_and_how_long():
    iterator = iter(_loader(SlowAt({1: 2.0}), num_workers=2))
    next(iterator)
    time.sleep(0.4)
    text = str(iterator.stats())
    row = next(line for line in text.splitlines() if line.strip().startswith("1 "))
    assert re.search(r"busy\s+task 1 for [3-9]\d\d ms", row), row
    iterator._shutdown_workers()
