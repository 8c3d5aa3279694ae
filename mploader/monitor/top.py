"""``python -m mploader top``: a live view of this user's running loaders.

Reads what loaders publish (``mploader.monitor.publish``): ``top`` touches the watching file,
loaders see it within a second and write their snapshots, ``top`` shows them.  A file whose process
is gone (killed before it could remove it; or a reused pid, told apart by the process's start
time) is removed.  ``--once`` prints one plain-text frame, for scripts and tests; the live view
uses ``rich``.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import pwd
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from mploader.monitor.publish import (
    PUBLISH_INTERVAL_SECONDS,
    WATCHING_FILE,
    make_private_dir,
    publish_dir,
    published_files,
)
from mploader.monitor.stats import aligned_columns, count_of, format_megabytes, format_seconds

# ``--once`` waits for every loader to answer the touched watching file: at least one publishing
# interval (a loader that had no file yet cannot be waited for by name), at most this long.
ONCE_MIN_WAIT_SECONDS = PUBLISH_INTERVAL_SECONDS + 0.5
ONCE_MAX_WAIT_SECONDS = 2.5
POLL_SECONDS = 0.1
# A process's start time as psutil reads it and as it was published: the same clock reading.
START_TIME_TOLERANCE_SECONDS = 0.5


@dataclass(frozen=True)
class Published:
    """One process's published file."""

    pid: int
    command: str
    published: float  # time.time() when it was written
    loaders: list[dict[str, Any]]


def touch_watching(directory: Path) -> None:
    path = directory / WATCHING_FILE
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        os.utime(descriptor)
    finally:
        os.close(descriptor)


def read_published(directory: Path, pid: int | None = None) -> list[Published]:
    """The live processes' files, oldest process first; dead processes' files are removed."""
    processes = []
    for path in published_files(directory):
        try:
            document = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # removed meanwhile
        if not _alive(document):
            with contextlib.suppress(OSError):
                path.unlink()
            continue
        published = Published(document["pid"], document["command"], document["published"],
                              document["loaders"])
        if pid is None or pid == published.pid or pid in _worker_pids(published):
            processes.append(published)
    return sorted(processes, key=lambda process: process.pid)


def _alive(document: dict[str, Any]) -> bool:
    try:
        process = psutil.Process(document["pid"])
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        return abs(process.create_time() - document["started"]) < START_TIME_TOLERANCE_SECONDS
    except (psutil.Error, KeyError, TypeError):
        return False


def _worker_pids(process: Published) -> set[int]:
    return {worker["pid"] for loader in process.loaders for worker in loader["workers"]}


def wait_for_frame(directory: Path, pid: int | None) -> list[Published]:
    """Touch the watching file and wait until every loader has published since."""
    touch_watching(directory)
    asked = time.time()
    while True:
        time.sleep(POLL_SECONDS)
        processes = read_published(directory, pid)
        waited = time.time() - asked
        fresh = all(process.published >= asked for process in processes)
        if (fresh and waited >= ONCE_MIN_WAIT_SECONDS) or waited >= ONCE_MAX_WAIT_SECONDS:
            return processes


def user_name() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


# -- plain text ---------------------------------------------------------------------------------

_WORKER_COLUMNS = ("worker", "pid", "state", "task", "for", "done", "RSS MB", "USS MB", "CPU")


def format_frame(processes: list[Published], user: str, now: float | None = None) -> str:
    """One frame as plain text: a header line per loader, a line per worker."""
    now = time.time() if now is None else now
    lines = [_title(processes, user, now)]
    for process in processes:
        for loader in process.loaders:
            lines.append("")
            lines.append("  ".join(_loader_fields(process, loader, now)))
            if not loader["workers"]:
                lines.append("  no workers: it loads in its own process (num_workers=0)")
                continue
            rows = [_WORKER_COLUMNS, *(_worker_fields(worker) for worker in loader["workers"])]
            lines.extend("  " + line for line in aligned_columns(rows))
    return "\n".join(lines) + "\n"


def _title(processes: list[Published], user: str, now: float) -> str:
    stamp = datetime.datetime.fromtimestamp(now).strftime("%Y-%m-%d %H:%M:%S")
    loaders = sum(len(process.loaders) for process in processes)
    if not loaders:
        return f"mploader top {stamp}: no mploader loaders running for user {user}"
    return (f"mploader top {stamp}: {count_of(loaders, 'loader')} in "
            f"{count_of(len(processes), 'process', 'processes')} of user {user}")


def _loader_fields(process: Published, loader: dict[str, Any], now: float) -> list[str]:
    fields = [
        f"pid {process.pid}",
        f"loader {loader['id']}",
        f"epoch {_or_dash(loader['epoch'])}",
        f"{_number(loader['batches_per_second'], '.1f')} batches/s",
        f"waiting for data {_percent(loader['wait_share'])}",
        f"in flight {loader['tasks_in_flight']}",
        f"restarts {loader['restarts']}",
    ]
    age = now - loader.get("updated", process.published)
    if age > 3 * PUBLISH_INTERVAL_SECONDS:
        fields.append(f"(as of {age:.0f} s ago)")
    fields.append(process.command)
    return fields


def _worker_fields(worker: dict[str, Any]) -> tuple[str, ...]:
    task = worker["task"]
    return (
        str(worker["id"]),
        _or_dash(worker["pid"]),
        worker["state"],
        _or_dash(task),
        format_seconds(worker["task_seconds"]) if task is not None else "-",
        str(worker["tasks_done"]),
        format_megabytes(worker["rss_bytes"]),
        format_megabytes(worker["uss_bytes"]),
        _percent(worker.get("cpu_share")),
    )


def _or_dash(value: Any) -> str:
    return "-" if value is None else str(value)


def _number(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _percent(share: float | None) -> str:
    return "-" if share is None else f"{share:.0%}"


# -- the live view ------------------------------------------------------------------------------


def render(processes: list[Published], user: str) -> Any:
    """A rich renderable: a table per loader under a title line."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    now = time.time()
    parts: list[Any] = [Text(_title(processes, user, now), style="bold")]
    for process in processes:
        for loader in process.loaders:
            parts.append(Text("  ".join(_loader_fields(process, loader, now)), style="bold"))
            if not loader["workers"]:
                parts.append(Text("  no workers: it loads in its own process (num_workers=0)"))
                continue
            table = Table(expand=False)
            for name in _WORKER_COLUMNS:
                table.add_column(name, justify="left" if name == "state" else "right")
            for worker in loader["workers"]:
                cells = _worker_fields(worker)
                table.add_row(*cells, style=_state_style(worker["state"]))
            parts.append(table)
    return Group(*parts)


def _state_style(state: str) -> str:
    return {"busy": "green", "crashed": "bold red", "stopping": "yellow",
            "exited": "dim"}.get(state, "")


def run(once: bool, pid: int | None, interval: float) -> int:
    directory = publish_dir()
    problem = make_private_dir(directory)
    if problem is not None:
        print(f"mploader top: cannot use {directory}: {problem}")
        return 1
    user = user_name()
    if once:
        print(format_frame(wait_for_frame(directory, pid), user), end="")
        return 0
    from rich.live import Live

    touch_watching(directory)
    try:
        with Live(render([], user), auto_refresh=False, screen=False) as live:
            while True:
                touch_watching(directory)
                live.update(render(read_published(directory, pid), user), refresh=True)
                time.sleep(interval)
    except KeyboardInterrupt:
        return 0
