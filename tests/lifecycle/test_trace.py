"""The ``trace=`` file over a loader's whole life, and ``python -m mploader trace-summary``."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import mploader
from mploader.__main__ import main
from mploader.monitor import trace as trace_module
from mploader.monitor.trace import STARTUP_TID

from .faulty import Slow

# The spans and events that belong to one batch: each says which (task and epoch).
TASK_EVENTS = ("dispatch", "fetch", "collate", "transfer", "reorder wait", "yield",
               "wait for data")


def events_of(path: Path) -> list[dict[str, Any]]:
    return json.loads(path.read_text())["traceEvents"]


def summary_of(path: Path) -> str:
    return subprocess.run([sys.executable, "-m", "mploader", "trace-summary", str(path)],
                          capture_output=True, text=True, check=True).stdout


@pytest.mark.parametrize(("num_workers", "persistent"), [(2, False), (2, True), (0, False)],
                         ids=["non-persistent", "persistent", "num_workers=0"])
def test_every_epoch_lands_in_one_trace(tmp_path, num_workers, persistent):
    path = tmp_path / "run.json"
    extra = dict(multiprocessing_context="fork", persistent_workers=persistent) \
        if num_workers else {}
    loader = mploader.DataLoader(Slow(length=8, sleep=0.0), batch_size=2,
                                 num_workers=num_workers, trace=path, **extra)
    for _ in range(3):
        assert len(list(loader)) == 4
        assert loader.trace_recorder.pending == 0  # each epoch's end wrote its events out
    events = events_of(path)
    main_pid = os.getpid()
    epochs = [e for e in events if e["name"] == "epoch"]
    assert [(e["pid"], e["args"]["epoch"], e["args"]["ended_by"]) for e in epochs] == [
        (main_pid, number, "exhausted") for number in range(3)]
    for number in range(3):
        fetched = [e["args"]["task"] for e in events
                   if e["name"] == "fetch" and e["args"]["epoch"] == number]
        assert sorted(fetched) == [0, 1, 2, 3], number
    task_events = [e for e in events if e["name"] in TASK_EVENTS]
    assert {e["name"] for e in task_events} >= {"fetch", "collate", "yield", "wait for data"}
    for event in task_events:
        assert isinstance(event["args"]["task"], int), event
        assert event["args"]["epoch"] in (0, 1, 2), event
    # The consumer's time with each batch, never across an epoch's end.
    yields = [(e["args"]["epoch"], e["args"]["task"]) for e in events if e["name"] == "yield"]
    assert sorted(yields) == [(epoch, task) for epoch in range(3) for task in range(4)]
    summary = summary_of(path)
    assert ", 3 epochs, 12 batches" in summary.splitlines()[0]
    for number in range(3):
        assert f"epoch {number}: 4 batches in " in summary


def test_startup_is_its_own_span_named_in_the_summary(tmp_path):
    path = tmp_path / "run.json"
    loader = mploader.DataLoader(Slow(length=8, sleep=0.0), batch_size=2, num_workers=2,
                                 multiprocessing_context="spawn", trace=path)
    assert len(list(loader)) == 4
    events = events_of(path)
    main_pid = os.getpid()
    [main_startup] = [e for e in events if e["name"] == "start-up" and e["pid"] == main_pid]
    assert main_startup["tid"] == STARTUP_TID  # beside the main track, not across its spans
    assert main_startup["args"]["start_method"] == "spawn"
    assert main_startup["args"]["epoch"] == 0
    ready = {e["pid"]: e["ts"] for e in events if e["name"] == "worker ready"}
    worker_startups = [e for e in events if e["name"] == "start-up" and e["pid"] != main_pid]
    assert {e["pid"] for e in worker_startups} == set(ready)
    for span in worker_startups:  # from the worker's launch to its ready
        assert span["ts"] >= main_startup["ts"]
        assert span["ts"] + span["dur"] == pytest.approx(ready[span["pid"]], abs=1)
        first_fetch = min(e["ts"] for e in events if e["name"] == "fetch" and
                          e["pid"] == span["pid"])
        assert first_fetch >= span["ts"] + span["dur"] - 1
    end = main_startup["ts"] + main_startup["dur"]
    if main_startup["args"]["ended_by"] == "every worker ready":
        assert end == pytest.approx(max(ready.values()), abs=1)
    else:
        assert main_startup["args"]["ended_by"] == "first batch"
    summary = summary_of(path)
    startup_line = next(line for line in summary.splitlines() if line.startswith("start-up:"))
    assert " s traced (spawn" in startup_line, summary
    assert "busy share (fetch + collate) over the " in summary
    assert "after start-up" in summary


def test_long_runs_keep_few_events_in_memory(tmp_path, monkeypatch):
    """Events go to the file every FLUSH_EVENTS; the file is whole JSON between flushes."""
    monkeypatch.setattr(trace_module, "FLUSH_EVENTS", 40)
    path = tmp_path / "run.json"
    loader = mploader.DataLoader(Slow(length=120, sleep=0.0), batch_size=1, num_workers=2,
                                 multiprocessing_context="fork", trace=path)
    iterator = iter(loader)
    for _ in range(100):
        next(iterator)
        assert loader.trace_recorder.pending < 40
    mid_epoch = {e["args"]["task"] for e in events_of(path) if e["name"] == "fetch"}
    assert len(mid_epoch) >= 80  # written while the epoch goes on
    list(iterator)
    assert len({e["args"]["task"] for e in events_of(path) if e["name"] == "fetch"}) == 120


def test_a_symlink_planted_at_the_trace_between_epochs_is_not_followed(tmp_path, caplog):
    path, victim = tmp_path / "run.json", tmp_path / "victim"
    victim.write_text("precious")
    loader = mploader.DataLoader(Slow(length=4, sleep=0.0), batch_size=2, trace=path)
    list(loader)
    path.unlink()
    path.symlink_to(victim)
    with caplog.at_level(logging.WARNING, logger="mploader"):
        list(loader)
    assert victim.read_text() == "precious"
    assert not path.is_symlink()
    assert {e["args"]["epoch"] for e in events_of(path) if e["name"] == "fetch"} == {1}
    assert "starting it anew" in caplog.text
    assert sorted(os.listdir(tmp_path)) == ["run.json", "victim"]


def test_summary_reads_a_trace_cut_short_mid_write(tmp_path):
    path = tmp_path / "run.json"
    list(mploader.DataLoader(Slow(length=4, sleep=0.0), batch_size=2, trace=path))
    text = path.read_text()
    path.write_text(text[: len(text) - 30])  # the closing bracket and part of an event gone
    assert "1 epoch" in summary_of(path)


BAD_FILES = {
    "missing": (None, "no such file"),
    "empty": ("", "the file is empty"),
    "not JSON": ("{'traceEvents': [", "not JSON"),
    "JSON, not a trace": ('{"rows": [1, 2]}', "JSON, but not a Chrome trace"),
    "no events": ('{"traceEvents": []}', "a trace without events"),
    "a folder": ("folder", "a folder"),
}


@pytest.mark.parametrize("case", BAD_FILES)
def test_summary_errors_are_one_line(tmp_path, capsys, case):
    content, reason = BAD_FILES[case]
    path = tmp_path / "run.json"
    if content == "folder":
        path.mkdir()
    elif content is not None:
        path.write_text(content)
    assert main(["trace-summary", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"python -m mploader trace-summary: error: {path}: {reason}")
    assert captured.err.count("\n") == 1 and captured.err.endswith("\n"), captured.err


def test_summary_error_from_the_command_line(tmp_path):
    path = tmp_path / "nothing.json"
    result = subprocess.run([sys.executable, "-m", "mploader", "trace-summary", str(path)],
                            capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr == f"python -m mploader trace-summary: error: {path}: no such file\n"
