"""``python -m mploader top``: what loaders publish, what top shows, what is left behind.

Each test has its own XDG_RUNTIME_DIR, so it sees neither other tests' loaders nor the user's.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import mploader
from mploader.__main__ import main as cli
from mploader.iterator import publisher
from mploader.monitor import publish, top

from .conftest import wait_until_gone
from .faulty import Slow

REPOSITORY = Path(__file__).resolve().parents[2]


@pytest.fixture
def runtime_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    runtime = tmp_path / "xdg"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    return runtime


def _top_once(capsys: pytest.CaptureFixture[str], *arguments: str) -> str:
    assert cli(["top", "--once", *arguments]) == 0
    return capsys.readouterr().out


def _check_listing(pid: int, workers: list[int], capsys: pytest.CaptureFixture[str]) -> None:
    """``top --once`` run as a command lists the loader of ``pid``, its workers; ``--pid``."""
    frame = subprocess.run(
        [sys.executable, "-m", "mploader", "top", "--once"], cwd=REPOSITORY,
        capture_output=True, text=True, check=True,
    ).stdout
    header = next(line for line in frame.splitlines() if line.startswith("pid "))
    assert header.startswith(f"pid {pid}  loader 1  epoch 0  "), frame
    assert "batches/s" in header and "waiting for data" in header, frame
    assert "tests.lifecycle.top_loader" in header, frame
    for worker_id, worker_pid in enumerate(workers):
        line = rf"  {worker_id}\s+{worker_pid}\s+(busy|idle|result waiting)\s"
        assert re.search(line, frame), frame
    assert len(re.findall(r"^  \d", frame, re.M)) == 2, frame
    assert f"pid {pid} " in _top_once(capsys, "--pid", str(pid))
    assert f"pid {pid} " in _top_once(capsys, "--pid", str(workers[1]))
    assert "no mploader loaders running" in _top_once(capsys, "--pid", str(os.getpid()))


@pytest.mark.parametrize("ending", ["graceful", "sigkill"])
def test_top_lists_a_loader_in_another_process_and_nothing_once_it_ended(
    runtime_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], ending: str
) -> None:
    loader = subprocess.Popen(
        [sys.executable, "-m", "tests.lifecycle.top_loader", str(tmp_path)],
        stdout=subprocess.PIPE, text=True, cwd=REPOSITORY,
    )
    workers: list[int] = []
    try:
        assert loader.stdout is not None
        words = loader.stdout.readline().split()
        assert words[0] == "pids", words
        main_pid, *workers = map(int, words[1:])
        assert main_pid == loader.pid and len(workers) == 2
        file = runtime_dir / "mploader" / f"{loader.pid}.json"
        if ending == "graceful":  # the listing, once
            _check_listing(loader.pid, workers, capsys)
            assert stat.S_IMODE(os.lstat(file.parent).st_mode) == 0o700
            assert stat.S_IMODE(os.lstat(file).st_mode) == 0o600
            (tmp_path / "stop").touch()
            assert loader.stdout.readline() == "ended\n"
            # removed by the loader itself (its publishing thread, woken when the iterator was
            # collected), its process still running
            assert _gone_within(file, seconds=5)
        else:
            assert f"pid {loader.pid} " in _top_once(capsys)
            loader.send_signal(signal.SIGKILL)
            loader.wait()
            assert file.exists()
        assert "no mploader loaders running" in _top_once(capsys)
        assert not file.exists()
    finally:
        (tmp_path / "exit").touch()
        try:
            loader.wait(timeout=30)
        except subprocess.TimeoutExpired:
            loader.kill()
            loader.wait()
        if loader.stdout is not None:
            loader.stdout.close()
        assert not wait_until_gone(workers)


def test_top_drops_the_file_of_a_reused_pid(runtime_dir: Path) -> None:
    directory = runtime_dir / "mploader"
    assert publish.make_private_dir(directory) is None
    # This very process, but started at another time: the pid was reused since.
    publish.write_private_json(directory, f"{os.getpid()}.json", {
        "version": 1, "pid": os.getpid(), "command": "python old.py", "started": 1.0,
        "published": time.time(), "loaders": [],
    })
    assert top.read_published(directory) == []
    assert list(directory.iterdir()) == []


def _iterate(seconds: float, each_batch: Callable[[], None], num_workers: int) -> None:
    """Run a loader in this process for ``seconds``."""
    context = {"multiprocessing_context": "fork"} if num_workers else {}
    loader = mploader.DataLoader(Slow(length=10_000, sleep=0.01), batch_size=2,
                                 num_workers=num_workers, **context)  # type: ignore[arg-type]
    deadline = time.monotonic() + seconds
    for _ in loader:
        each_batch()
        if time.monotonic() > deadline:
            break


@pytest.mark.parametrize("case", ["watched", "watched, num_workers=0", "watched, slow writes",
                                  "nobody watching", "watching is stale", "MPLOADER_PUBLISH=0",
                                  "dir is a symlink"])
def test_what_a_loader_publishes(runtime_dir: Path, tmp_path: Path, case: str,
                                 monkeypatch: pytest.MonkeyPatch,
                                 caplog: pytest.LogCaptureFixture) -> None:
    directory = runtime_dir / "mploader"
    if case == "dir is a symlink":
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir(mode=0o700)
        directory.symlink_to(elsewhere)
    else:
        directory.mkdir(mode=0o700)
    if case != "nobody watching":
        top.touch_watching(directory)
    if case == "watching is stale":
        old = time.time() - 2 * publish.WATCHING_FRESH_SECONDS
        os.utime(directory / publish.WATCHING_FILE, (old, old))
    if case == "MPLOADER_PUBLISH=0":
        monkeypatch.setenv("MPLOADER_PUBLISH", "0")
    if case == "watched, slow writes":
        # Each write's temporary file lingers beside the published ones before its rename: what
        # top reads (and what this test counts as published) must not include it.
        dump = publish.json.dump

        def slow_dump(document: object, file: Any) -> None:
            dump(document, file)
            time.sleep(0.2)

        monkeypatch.setattr(publish.json, "dump", slow_dump)
    monkeypatch.setattr(publisher, "_publisher", publisher.Publisher())  # reads MPLOADER_PUBLISH
    seen: set[str] = set()
    frames: list[str] = []

    def look() -> None:
        if case.startswith("watched"):
            top.touch_watching(directory)  # as a live top does at each refresh
        seen.update(path.name for path in publish.published_files(directory))
        if seen and not frames:
            frames.append(top.format_frame(top.read_published(directory), "me"))

    with caplog.at_level(logging.WARNING, logger="mploader"):
        _iterate(2.5, look, num_workers=0 if "num_workers=0" in case else 2)
    if case.startswith("watched"):
        assert f"{os.getpid()}.json" in seen
        assert f"pid {os.getpid()}  loader 1  epoch 0  " in frames[0], frames
        assert ("no workers" in frames[0]) == ("num_workers=0" in case), frames
        # gone with the loader (the iterator collected at the break: removed by the thread)
        assert _gone_within(directory / f"{os.getpid()}.json", seconds=5)
    else:
        assert seen == set()
        assert set(os.listdir(directory)) <= {publish.WATCHING_FILE}  # no file, finished or not
    warnings = [record.getMessage() for record in caplog.records
                if "publish" in record.getMessage()]
    if case == "dir is a symlink":
        assert len(warnings) == 1 and "symlink" in warnings[0], warnings
    else:
        assert warnings == []


def _gone_within(path: Path, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True
