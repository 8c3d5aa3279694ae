"""stats(), the trace file and its summary, lifecycle logging, the copy-on-write guard."""

from __future__ import annotations

import dataclasses
import json
import logging
import subprocess
import sys
import time

import pytest
import torch
from torch.utils.data import Dataset

import mploader
from mploader.monitor import monitor as _monitor

from .faulty import Slow


def test_stats_fields_while_iterating():
    # Items slow enough that the workers are still on prefetched tasks when stats() is read.
    loader = mploader.DataLoader(Slow(length=20, sleep=0.15), batch_size=2, num_workers=2,
                                 multiprocessing_context="fork")
    iterator = iter(loader)
    for _ in range(3):
        next(iterator)
        time.sleep(0.05)  # a "training step": the consumer's share
    stats = iterator.stats()
    assert dataclasses.is_dataclass(stats)
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.restarts = 3  # type: ignore[misc]
    assert stats.batches_delivered == 3
    assert stats.tasks_in_flight == 4  # prefetch_factor 2 x 2 workers
    assert stats.restarts == 0
    assert stats.consumer_seconds >= 0.1
    assert stats.wait_seconds > 0
    assert [w.worker_id for w in stats.workers] == [0, 1]
    for worker, process in zip(stats.workers, iterator._workers, strict=True):
        assert worker.pid == process.pid
        assert worker.state in ("idle", "busy", "result waiting")
        assert worker.rss_bytes and worker.rss_bytes > 10 << 20
        assert worker.uss_bytes and 0 < worker.uss_bytes <= worker.rss_bytes
        assert worker.cpu_share is not None and 0 <= worker.cpu_share <= 1.5
        assert worker.busy_seconds > 0
    assert sum(w.tasks_done for w in stats.workers) >= 3
    busy = [w for w in stats.workers if w.current_task is not None]
    assert busy and all(w.current_task_seconds >= 0 for w in busy)
    assert stats.bottleneck.split()[0] in ("loader", "consumer")
    list(iterator)
    assert all(w.state in ("exited",) for w in iterator.stats().workers)


def test_trace_structure_and_summary(tmp_path):
    path = tmp_path / "run.json"
    loader = mploader.DataLoader(Slow(length=12, sleep=0.01), batch_size=2, num_workers=2,
                                 multiprocessing_context="fork", trace=path)
    assert len(list(loader)) == 6
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    pids = {e["pid"] for e in events}
    assert len(pids) == 3  # main + two workers, one track each
    names = {e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names == {"main process", "worker 0", "worker 1"}
    spans = [e for e in events if e["ph"] == "X"]
    by_name: dict[str, list[dict]] = {}
    for span in spans:
        assert span["dur"] >= 0 and span["ts"] > 0
        by_name.setdefault(span["name"], []).append(span)
    for name in ("dispatch", "fetch", "collate", "transfer", "reorder wait", "wait for data"):
        assert name in by_name, name
    assert sorted(s["args"]["task"] for s in by_name["fetch"]) == list(range(6))
    assert len(by_name["yield"]) == 6  # each batch's time with the consumer
    instants = [e["name"] for e in events if e["ph"] == "i"]
    for name in ("worker start", "worker ready", "worker exit"):
        assert instants.count(name) == 2, name
    main_pid = next(e["pid"] for e in events if e["name"] == "process_name" and
                    e["args"]["name"] == "main process")
    assert all(s["pid"] != main_pid for s in by_name["fetch"] + by_name["collate"])
    assert all(s["pid"] == main_pid for s in by_name["transfer"] + by_name["reorder wait"])
    summary = subprocess.run([sys.executable, "-m", "mploader", "trace-summary", str(path)],
                             capture_output=True, text=True, check=True).stdout
    assert "worker 0" in summary and "worker 1" in summary
    assert "slowest" in summary and "bottleneck:" in summary


def test_lifecycle_events_are_logged(caplog):
    caplog.set_level(logging.DEBUG, logger="mploader")
    loader = mploader.DataLoader(Slow(length=4, sleep=0.0), batch_size=2, num_workers=2,
                                 multiprocessing_context="fork")
    list(loader)
    text = caplog.text
    assert text.count("worker start") == 2
    assert text.count("worker ready") == 2
    assert text.count("worker exit") == 2


class TouchesPythonObjects(Dataset):
    """Holds ~150 MB of Python objects; each item walks a fresh stretch of them (refcounts)."""

    def __init__(self) -> None:
        self.rows = [[float(i), str(i)] for i in range(1_200_000)]

    def __len__(self) -> int:
        return 60

    def __getitem__(self, index: int):
        stretch = self.rows[index * 20_000:(index + 1) * 20_000]
        total = sum(row[0] for row in stretch)
        time.sleep(0.02)
        return torch.tensor([total])


def test_copy_on_write_growth_warns_once_per_worker(monkeypatch):
    monkeypatch.setattr(_monitor, "SAMPLE_INTERVAL_SECONDS", 0.05)
    monkeypatch.setattr(_monitor, "GROWTH_BYTES", 8 << 20)
    loader = mploader.DataLoader(TouchesPythonObjects(), batch_size=1, num_workers=1,
                                 multiprocessing_context="fork")
    with pytest.warns(ResourceWarning, match=r"worker 0 \(pid \d+\) keeps growing") as record:
        list(loader)
    growth = [w for w in record if "keeps growing" in str(w.message)]
    assert len(growth) == 1
    assert "copy-on-write" in str(growth[0].message)
