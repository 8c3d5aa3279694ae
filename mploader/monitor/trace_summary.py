"""``python -m mploader trace-summary run.json``: what a trace says, in a few lines.

It reads the file a ``DataLoader(trace=...)`` wrote (every epoch of the loader's life, see
``mploader.monitor.trace``) and says: how long the trace is and how much of it was start-up (with
the start method), each epoch's batches and seconds when there are several, each worker's busy
share over the iteration time *after* start-up, the slowest batches with the total they are
ranked by, crashes and restarts, and whether the loader or the consumer was the bottleneck after
start-up.  A file that is missing, empty, not JSON or not a trace is a :class:`TraceError` whose
message is one line.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mploader.errors import MploaderError
from mploader.monitor.events import WorkerEvent
from mploader.monitor.stats import count_of, verdict

STAGES = ("fetch", "collate", "transfer", "reorder wait")


class TraceError(MploaderError, ValueError):
    """The file is no trace this command can read; the message says why, in one line."""


def load_events(path: str | Path) -> list[dict[str, Any]]:
    """The trace's events; a ``TraceError`` if there are none to read."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise TraceError(f"{path}: a folder, not a trace file") from None
    except OSError as error:
        raise TraceError(f"{path}: cannot be read ({error.strerror})") from None
    if not data.strip():
        raise TraceError(f"{path}: the file is empty (was the loader iterated?)")
    try:
        trace = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        trace = _recover(data)
        if trace is None:
            reason = error.msg if isinstance(error, json.JSONDecodeError) else "not UTF-8"
            raise TraceError(f"{path}: not JSON ({reason}); expected a DataLoader(trace=...) "
                             "file") from None
    events = trace.get("traceEvents") if isinstance(trace, dict) else trace
    if not isinstance(events, list) or not all(isinstance(event, dict) for event in events):
        raise TraceError(f"{path}: JSON, but not a Chrome trace (no list of traceEvents)")
    if not events:
        raise TraceError(f"{path}: a trace without events")
    return events


def _recover(data: bytes) -> Any:
    """A trace cut short while being written (the process killed mid-flush): its complete
    lines, closed.  None if that does not make it JSON either."""
    if not data.startswith(b'{"displayTimeUnit"'):
        return None
    lines = data.split(b"\n")[:-1]  # the last line is cut, or empty
    for _ in range(3):
        try:
            return json.loads(b"\n".join(lines).rstrip(b",") + b"\n]}")
        except (json.JSONDecodeError, UnicodeDecodeError):
            lines = lines[:-1]
    return None


@dataclass
class _Epoch:
    """One epoch's span and batches, as read back from a trace."""

    start: float = float("inf")
    end: float = float("-inf")
    startup_end: float | None = None  # the main process's start-up span ended
    startup: float = 0.0  # its length
    spanned: bool = False  # its own "epoch" span gave start and end
    batches: set[int] = field(default_factory=set)

    @property
    def iterating_from(self) -> float:
        """Where the time after start-up begins."""
        return max(self.start, self.startup_end) if self.startup_end is not None else self.start

    @property
    def after_startup(self) -> float:
        return max(0.0, self.end - self.iterating_from)


def summarize(path: str | Path, slowest: int = 5) -> str:
    events = load_events(path)
    names = {e.get("pid"): e.get("args", {}).get("name") for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    main_pid = next((pid for pid, name in names.items() if name == "main process"), None)
    timed = [e for e in events if e.get("ph") in ("X", "i")
             and isinstance(e.get("ts"), int | float) and isinstance(e.get("args", {}), dict)]
    spans = [e for e in timed if e["ph"] == "X" and isinstance(e.get("dur"), int | float)]
    if not spans:
        return f"{path}: no spans (was the loader iterated?)"
    start = min(e["ts"] for e in timed)
    end = max(e["ts"] + e.get("dur", 0) for e in timed)
    wall = max(end - start, 1.0)

    epochs: dict[int, _Epoch] = defaultdict(_Epoch)
    startups: list[dict[str, Any]] = []
    for event in spans:
        args = event.get("args", {})
        epoch = epochs[_int(args.get("epoch"))]
        name = event["name"]
        if name == "epoch" and event.get("pid") == main_pid:
            epoch.start, epoch.end = event["ts"], event["ts"] + event["dur"]
            epoch.spanned = True
        elif name == "start-up" and event.get("pid") == main_pid:
            epoch.startup_end = event["ts"] + event["dur"]
            epoch.startup = event["dur"]
            startups.append(event)
    for event in spans:  # epochs without their own span (an interrupted run): their extent
        epoch = epochs[_int(event.get("args", {}).get("epoch"))]
        if not epoch.spanned:
            epoch.start = min(epoch.start, event["ts"])
            epoch.end = max(epoch.end, event["ts"] + event["dur"])

    per_task: dict[tuple[int, int], dict[str, float]] = defaultdict(dict)
    busy: dict[str, float] = defaultdict(float)
    pids: dict[str, set[Any]] = defaultdict(set)
    totals: dict[str, float] = defaultdict(float)  # after start-up
    for event in spans:
        name, args = event["name"], event.get("args", {})
        epoch_number = _int(args.get("epoch"))
        epoch = epochs[epoch_number]
        after = _clip(event, epoch.iterating_from, epoch.end)
        totals[name] += after
        if name in ("fetch", "collate"):
            process = str(names.get(event.get("pid"), f"pid {event.get('pid')}"))
            busy[process] += after
            pids[process].add(event.get("pid"))
        if isinstance(args.get("task"), int) and name in STAGES:
            key = (epoch_number, args["task"])
            per_task[key][name] = per_task[key].get(name, 0.0) + event["dur"]
            if name == "fetch":
                epoch.batches.add(args["task"])

    batches = sum(len(epoch.batches) for epoch in epochs.values())
    lines = [f"{path}: {wall / 1e6:.3f} s traced, {count_of(len(epochs), 'epoch')}, "
             f"{count_of(batches, 'batch', 'batches')}"]
    lines += _startup_lines(startups, wall)
    if len(epochs) > 1:
        lines.append("epochs:")
        for number, epoch in sorted(epochs.items()):
            startup = f" (start-up {epoch.startup / 1e6:.3f} s)" if epoch.startup else ""
            lines.append(f"  epoch {number}: {count_of(len(epoch.batches), 'batch', 'batches')} "
                         f"in {(epoch.end - epoch.start) / 1e6:.3f} s{startup}")
    iterating = sum(epoch.after_startup for epoch in epochs.values())
    lines.append(f"busy share (fetch + collate) over the {iterating / 1e6:.3f} s of iteration "
                 "after start-up:")
    for process in sorted(busy, key=_process_order):
        who = sorted(pids[process])
        where = f"pid {who[0]}" if len(who) == 1 else f"{len(who)} processes"
        lines.append(f"  {process} ({where}): {busy[process] / max(iterating, 1.0):6.1%}")
    lines += _slowest_lines(per_task, slowest)
    for event in timed:
        if event["ph"] == "i" and event.get("name") in (WorkerEvent.CRASH, WorkerEvent.RESTART):
            lines.append(f"{event['name']}: {names.get(event.get('pid'), event.get('pid'))} "
                         f"{event.get('args', {})}")
    lines.append("bottleneck: " + verdict(totals["wait for data"] / 1e6, totals["yield"] / 1e6)
                 + ", counted after start-up")
    return "\n".join(lines)


def _startup_lines(startups: list[dict[str, Any]], wall: float) -> list[str]:
    if not startups:
        return []
    total = sum(event["dur"] for event in startups)
    methods = sorted({_start_method(event.get("args", {})) for event in startups})
    line = (f"start-up: {total / 1e6:.3f} s of {wall / 1e6:.3f} s traced ({', '.join(methods)})"
            ", from building the iterator until every worker was ready or the first batch came")
    if len(startups) > 1:
        longest = max(event["dur"] for event in startups)
        line += f"; {len(startups)} start-ups, the longest {longest / 1e6:.3f} s"
    return [line]


def _start_method(args: dict[str, Any]) -> str:
    method = str(args.get("start_method", "unknown start method"))
    return f"{method}, workers forked from the zygote" if args.get("zygote") else method


def _slowest_lines(per_task: dict[tuple[int, int], dict[str, float]], slowest: int) -> list[str]:
    ranked = sorted(per_task.items(), key=lambda item: -sum(item[1].values()))[:slowest]
    if not ranked:
        return []
    header = f"  {'epoch':>5} {'task':>6} {'total':>9}" + "".join(
        f" {stage:>12}" for stage in STAGES)
    lines = [f"slowest {len(ranked)} batches by total ms (fetch + collate + transfer + "
             "reorder wait):", header]
    for (epoch, task), parts in ranked:
        lines.append(f"  {epoch:>5} {task:>6} {sum(parts.values()) / 1e3:>9.2f}" + "".join(
            f" {parts.get(stage, 0.0) / 1e3:>12.2f}" for stage in STAGES))
    return lines


def _clip(event: dict[str, Any], low: float, high: float) -> float:
    """The part of ``event`` between ``low`` and ``high``."""
    return max(0.0, min(event["ts"] + event["dur"], high) - max(event["ts"], low))


def _int(value: Any) -> int:
    return value if isinstance(value, int) else 0





def _process_order(name: str) -> tuple[int, str]:
    """The main process first, then workers by number."""
    if name.startswith("worker ") and name[7:].isdigit():
        return int(name[7:]) + 1, ""
    return (0, name) if name == "main process" else (1 << 30, name)
