"""The default budget in a real memory cgroup: half of its limit (not a share of ``/dev/shm``).

As root, the test makes a memory cgroup with a 1 GiB limit (cgroup v1's memory controller, or
v2's) and runs a child Python process in it, which reports one JSON line per check:

(a) ``SharedMemoryConfig().effective_budget()`` is half of the limit, and its reason names the
    cgroup's limit file;
(b) a loader that torch's own DataLoader runs in that cgroup (2 forked workers, 64 MiB float32
    batches, default settings) runs with ``mploader.DataLoader`` too, every value checked;
(c) a batch that cannot fit (540 MB, over the one worker's share of 512 MiB) is a
    ``mploader.BatchTooLargeError`` whose message names the cgroup's limit: the child ends
    normally, nothing is killed for want of memory;
(d) a 256 MiB batch, within the budget, while the main process holds the cgroup's memory but for
    1.75 batches (the worker's copy of the batch takes one): a
    ``mploader.SharedMemoryFullError`` naming the cgroup's limit and usage, not an OOM kill.

Skipped where the test is not root or finds no memory controller it can make a cgroup in.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import mploader
from tests.cgroups import MemoryCgroup, memory_cgroup, read

LIMIT = 1 << 30
HUGE_FLOATS = 135_000_000  # 540 MB: over half of LIMIT, within LIMIT beside the process
BLOCK_BYTES = 256 << 20  # (d)'s batch


@pytest.fixture
def cgroup() -> Iterator[MemoryCgroup]:
    with memory_cgroup("mploader-test", LIMIT) as made:
        yield made


CHILD = """
import gc, json, os, sys
sys.path.insert(0, {repository!r})
import numpy as np
import torch
import mploader
from mploader.config import SharedMemoryConfig

LIMIT = {limit}
USAGE_FILE = {usage_file!r}
BLOCK_BYTES = {block_bytes}
FLOATS = 4 << 20  # 16 MiB items, 4 a batch: 64 MiB batches


def report(**fields):
    print(json.dumps(fields), flush=True)


class Items(torch.utils.data.Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, index):
        return np.full((FLOATS,), index, np.float32)


class Huge(torch.utils.data.Dataset):
    def __len__(self):
        return 1

    def __getitem__(self, index):
        return np.full(({huge_floats},), index, np.float32)


class Block(torch.utils.data.Dataset):
    def __len__(self):
        return 2

    def __getitem__(self, index):
        return np.full((BLOCK_BYTES // 4,), index, np.float32)


def epoch(make):
    loader = make(Items(), batch_size=4, num_workers=2, multiprocessing_context="fork")
    seen = []
    for number, batch in enumerate(loader):
        assert batch.dtype == torch.float32 and tuple(batch.shape) == (4, FLOATS), batch.shape
        for row in range(4):
            assert bool((batch[row] == 4 * number + row).all()), (number, row)
            seen.append(4 * number + row)
        del batch
    del loader
    return seen


def load_alone(part, dataset):
    # every item of dataset through a loader with one worker: reports, as part, the error it
    # ends in (None, or its type, its message and which of mploader's errors it is)
    loader = mploader.DataLoader(dataset, batch_size=None, num_workers=1,
                                 multiprocessing_context="fork")
    try:
        list(loader)
    except Exception as error:
        report(part=part, error=type(error).__name__, message=str(error),
               batch_too_large=isinstance(error, mploader.BatchTooLargeError),
               full=isinstance(error, mploader.SharedMemoryFullError),
               needed=getattr(error, "needed_bytes", None),
               available=getattr(error, "available_bytes", None))
    else:
        report(part=part, error=None)


if __name__ == "__main__":
    report(part="cgroup", membership=open("/proc/self/cgroup").read())
    config = SharedMemoryConfig()
    reason = config.effective_budget().reason if hasattr(config, "effective_budget") else None
    report(part="a", bytes=config.effective_budget_bytes(), reason=reason)
    for name, make in (("torch", torch.utils.data.DataLoader), ("mploader", mploader.DataLoader)):
        try:
            report(part="b", loader=name, seen=epoch(make))
        except Exception as error:
            report(part="b", loader=name, error=f"{{type(error).__name__}}: {{error}}")
    load_alone("c", Huge())
    # (d): the main process takes all but 1.75 batches of what the cgroup's own usage file says
    # is left; the worker's batch takes one, so a block of one more cannot be had (and what the
    # fork copies later has 0.75 of a batch before the limit).
    gc.collect()
    mploader.finalizers.settle(10)  # the loaders above are gone, their memory given back
    with open(USAGE_FILE) as file:
        left = LIMIT - int(file.read())
    ballast = np.ones(max(left - BLOCK_BYTES * 7 // 4, 0), np.uint8)
    load_alone("d", Block())
    del ballast
    report(part="end")
"""


def _run_in(
    cgroup: MemoryCgroup,
) -> tuple[subprocess.CompletedProcess[str], dict[str, list[dict]]]:
    """Run CHILD in ``cgroup``: a shell joins it, then becomes Python (exec), so the child's
    whole life, imports included, is charged to the cgroup."""
    repository = str(Path(mploader.__file__).resolve().parents[1])
    script = CHILD.format(repository=repository, limit=LIMIT, usage_file=str(cgroup.usage),
                          block_bytes=BLOCK_BYTES, huge_floats=HUGE_FLOATS)
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as file:
        file.write(textwrap.dedent(script))
    try:
        result = subprocess.run(
            ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(cgroup.procs),
             sys.executable, file.name],
            capture_output=True, text=True, timeout=180,
        )
    finally:
        os.unlink(file.name)
    parts: dict[str, list[dict]] = {}
    for line in result.stdout.splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            parts.setdefault(record["part"], []).append(record)
    return result, parts


def test_the_default_budget_is_half_the_memory_cgroups_limit(cgroup: MemoryCgroup) -> None:
    result, parts = _run_in(cgroup)
    peak = read(cgroup.peak).strip() if cgroup.peak else "?"
    context = (f"cgroup {cgroup.directory} (limit {LIMIT}, peak usage {peak}); "
               f"child exit {result.returncode}; "
               f"memory.oom_control: {read(cgroup.directory / 'memory.oom_control')!r}\n"
               f"stdout:\n{result.stdout[-4000:]}\nstderr:\n{result.stderr[-4000:]}")
    failures = []

    [where] = parts.get("cgroup", [{"membership": ""}])
    relative = "/" + cgroup.directory.name
    if not any(line.endswith(relative) for line in where["membership"].splitlines()):
        failures.append(f"the child is not in the cgroup: {where['membership']!r}")

    # (a) half of the limit, and the reason names the cgroup's limit file
    [budget] = parts.get("a", [{"bytes": None, "reason": None}])
    if budget["bytes"] != LIMIT // 2:
        failures.append(f"(a) default budget {budget['bytes']} != half the cgroup's limit "
                        f"{LIMIT // 2} (reason: {budget['reason']!r})")
    if not budget["reason"] or str(cgroup.limit) not in budget["reason"]:
        failures.append(f"(a) the budget's reason does not name {cgroup.limit}: "
                        f"{budget['reason']!r}")

    # (b) what torch's loader runs there, mploader's runs too, every value right
    epochs = {record["loader"]: record for record in parts.get("b", [])}
    for name in ("torch", "mploader"):
        record = epochs.get(name, {"error": "no report"})
        if record.get("seen") != list(range(16)):
            failures.append(f"(b) {name}'s loader: {record.get('error') or record.get('seen')}")

    # (c) a batch over the worker's share: BatchTooLargeError naming the cgroup's limit
    [huge] = parts.get("c", [{"error": "no report", "message": ""}])
    if not huge.get("batch_too_large"):
        failures.append(f"(c) a {HUGE_FLOATS * 4}-byte batch gave {huge['error']}, not "
                        f"BatchTooLargeError: {huge.get('message', '')[:500]!r}")
    else:
        for part in (f"{HUGE_FLOATS * 4} bytes", f"at most {LIMIT // 2} bytes",
                     "the memory cgroup's limit of 1.0 GiB", str(cgroup.limit)):
            if part not in huge["message"]:
                failures.append(f"(c) the message lacks {part!r}: {huge['message']!r}")

    # (d) a block the cgroup has no memory left for: SharedMemoryFullError naming the cgroup
    [full] = parts.get("d", [{"error": "no report", "message": ""}])
    if not full.get("full"):
        failures.append(f"(d) a {BLOCK_BYTES}-byte block without the memory for it gave "
                        f"{full['error']}, not SharedMemoryFullError: "
                        f"{full.get('message', '')[:500]!r}")
    else:
        if not (full["needed"] >= BLOCK_BYTES > full["available"]):
            failures.append(f"(d) needed {full['needed']}, available {full['available']}")
        for part in ("the memory cgroup's limit less its usage", str(cgroup.limit),
                     cgroup.usage.name, "budget_bytes", "shared_memory=False"):
            if part not in full["message"]:
                failures.append(f"(d) the message lacks {part!r}: {full['message']!r}")

    if result.returncode != 0 or "end" not in parts:
        failures.append(f"the child did not end normally (exit {result.returncode})")
    assert not failures, "\n".join(failures) + "\n\n" + context
