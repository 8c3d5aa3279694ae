"""``python -m mploader trace-summary run.json``: what a trace says, in a few lines."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from mploader.monitor.events import WorkerEvent
from mploader.monitor.stats import verdict


def summarize(path: str | Path, slowest: int = 5) -> str:
    events: list[dict[str, Any]] = json.loads(Path(path).read_text())["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M"}
    spans = [e for e in events if e.get("ph") == "X"]
    if not spans:
        return f"{path}: no batch spans (was the loader iterated?)"
    start = min(e["ts"] for e in spans)
    end = max(e["ts"] + e["dur"] for e in spans)
    wall = max(end - start, 1.0)

    busy: dict[int, float] = defaultdict(float)
    per_task: dict[tuple[int, int], dict[str, float]] = defaultdict(dict)
    totals: dict[str, float] = defaultdict(float)
    for event in spans:
        name, args = event["name"], event.get("args", {})
        totals[name] += event["dur"]
        if name in ("fetch", "collate"):
            busy[event["pid"]] += event["dur"]
        if "task" in args:
            key = (args.get("epoch", 0), args["task"])
            per_task[key][name] = per_task[key].get(name, 0.0) + event["dur"]

    lines = [f"{path}: {wall / 1e6:.3f} s traced, {len(per_task)} batches"]
    lines.append("worker busy share (fetch + collate over the traced time):")
    for pid, microseconds in sorted(busy.items(), key=lambda item: names.get(item[0], "")):
        lines.append(f"  {names.get(pid, pid)} (pid {pid}): {microseconds / wall:6.1%}")
    stages = ("fetch", "collate", "transfer", "reorder wait")
    ranked = sorted(per_task.items(), key=lambda item: -sum(item[1].get(s, 0) for s in stages))
    lines.append(f"slowest {min(slowest, len(ranked))} batches (ms: "
                 + ", ".join(stages) + "):")
    for (epoch, task), parts in ranked[:slowest]:
        breakdown = ", ".join(f"{parts.get(stage, 0.0) / 1e3:.2f}" for stage in stages)
        lines.append(f"  epoch {epoch} task {task}: {breakdown}")
    crashes = [e for e in events if e.get("ph") == "i" and e["name"] in
               (WorkerEvent.CRASH, WorkerEvent.RESTART)]
    for event in crashes:
        lines.append(f"  {event['name']}: {names.get(event['pid'], event['pid'])} "
                     f"{event.get('args', {})}")
    lines.append("bottleneck: " + verdict(totals["wait for data"] / 1e6, totals["yield"] / 1e6))
    return "\n".join(lines)
