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

import itertools
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import mploader

LIMIT = 1 << 30
HUGE_FLOATS = 135_000_000  # 540 MB: over half of LIMIT, within LIMIT beside the process
BLOCK_BYTES = 256 << 20  # (d)'s batch
_counter = itertools.count()


@dataclass(frozen=True)
class Cgroup:
    directory: Path
    limit_file: Path  # memory.limit_in_bytes (v1) or memory.max (v2)
    usage_file: Path  # memory.usage_in_bytes (v1) or memory.current (v2)
    procs_file: Path
    peak_file: Path | None  # memory.max_usage_in_bytes (v1) or memory.peak (v2), if any


def _memory_mount() -> tuple[int, Path] | None:
    """(version, mount point) of the memory controller's hierarchy, from /proc/self/mountinfo."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    v2 = None
    for line in lines:
        fields, _, after = line.partition(" - ")
        kinds = after.split()
        if len(kinds) < 3:
            continue
        point = Path(fields.split()[4].replace("\\040", " "))
        if kinds[0] == "cgroup" and "memory" in kinds[2].split(","):
            return 1, point
        if kinds[0] == "cgroup2" and "memory" in _read(point / "cgroup.controllers").split():
            v2 = (2, point)
    return v2


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _make_cgroup() -> Cgroup:
    """A new memory cgroup with a LIMIT, or pytest.skip saying why there can be none."""
    if os.geteuid() != 0:
        pytest.skip("needs root to make a memory cgroup")
    mount = _memory_mount()
    if mount is None:
        pytest.skip("no memory cgroup controller is mounted (v1 memory or v2 with memory)")
    version, parent = mount
    if version == 2 and "memory" not in _read(parent / "cgroup.subtree_control").split():
        try:
            (parent / "cgroup.subtree_control").write_text("+memory")
        except OSError as error:
            pytest.skip(f"cannot enable the v2 memory controller below {parent}: {error}")
    directory = parent / f"mploader-test-{os.getpid()}-{next(_counter)}"
    try:
        directory.mkdir()
    except OSError as error:
        pytest.skip(f"cannot make a memory cgroup in {parent}: {error}")
    if version == 1:
        limit_file = directory / "memory.limit_in_bytes"
        limit_file.write_text(str(LIMIT))
        try:  # no swap to spill into either, where the kernel accounts it
            (directory / "memory.memsw.limit_in_bytes").write_text(str(LIMIT))
        except OSError:
            pass
        peak: Path | None = directory / "memory.max_usage_in_bytes"
    else:
        limit_file = directory / "memory.max"
        limit_file.write_text(str(LIMIT))
        try:
            (directory / "memory.swap.max").write_text("0")
        except OSError:
            pass
        peak = directory / "memory.peak"
    usage_file = directory / ("memory.usage_in_bytes" if version == 1 else "memory.current")
    return Cgroup(directory, limit_file, usage_file, directory / "cgroup.procs",
                  peak if peak is not None and peak.exists() else None)


def _remove(cgroup: Cgroup) -> None:
    """rmdir the cgroup: it fails while a task remains (a child just exited, not yet reaped)."""
    deadline = time.monotonic() + 10
    while True:
        try:
            cgroup.directory.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@pytest.fixture
def cgroup() -> Iterator[Cgroup]:
    made = _make_cgroup()
    try:
        yield made
    finally:
        _remove(made)


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
    loader = mploader.DataLoader(Huge(), batch_size=None, num_workers=1,
                                 multiprocessing_context="fork")
    try:
        list(loader)
        report(part="c", error=None)
    except Exception as error:
        report(part="c", error=type(error).__name__, message=str(error),
               batch_too_large=isinstance(error, mploader.BatchTooLargeError))
    del loader
    # (d): the main process takes all but 1.75 batches of what the cgroup's own usage file says
    # is left; the worker's batch takes one, so a block of one more cannot be had (and what the
    # fork copies later has 0.75 of a batch before the limit).
    gc.collect()
    mploader.finalizers.settle(10)  # the loaders above are gone, their memory given back
    with open(USAGE_FILE) as file:
        left = LIMIT - int(file.read())
    ballast = np.ones(max(left - BLOCK_BYTES * 7 // 4, 0), np.uint8)
    loader = mploader.DataLoader(Block(), batch_size=None, num_workers=1,
                                 multiprocessing_context="fork")
    try:
        list(loader)
        report(part="d", error=None)
    except Exception as error:
        report(part="d", error=type(error).__name__, message=str(error),
               full=isinstance(error, mploader.SharedMemoryFullError),
               needed=getattr(error, "needed_bytes", None),
               available=getattr(error, "available_bytes", None))
    del loader, ballast
    report(part="end")
"""


def _run_in(cgroup: Cgroup) -> tuple[subprocess.CompletedProcess[str], dict[str, list[dict]]]:
    """Run CHILD in ``cgroup``: a shell joins it, then becomes Python (exec), so the child's
    whole life, imports included, is charged to the cgroup."""
    repository = str(Path(mploader.__file__).resolve().parents[1])
    script = CHILD.format(repository=repository, limit=LIMIT, usage_file=str(cgroup.usage_file),
                          block_bytes=BLOCK_BYTES, huge_floats=HUGE_FLOATS)
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as file:
        file.write(textwrap.dedent(script))
    try:
        result = subprocess.run(
            ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(cgroup.procs_file),
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


def test_the_default_budget_is_half_the_memory_cgroups_limit(cgroup: Cgroup) -> None:
    result, parts = _run_in(cgroup)
    peak = _read(cgroup.peak_file).strip() if cgroup.peak_file else "?"
    context = (f"cgroup {cgroup.directory} (limit {LIMIT}, peak usage {peak}); "
               f"child exit {result.returncode}; "
               f"memory.oom_control: {_read(cgroup.directory / 'memory.oom_control')!r}\n"
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
    if not budget["reason"] or str(cgroup.limit_file) not in budget["reason"]:
        failures.append(f"(a) the budget's reason does not name {cgroup.limit_file}: "
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
                     "the memory cgroup's limit of 1.0 GiB", str(cgroup.limit_file)):
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
        for part in ("the memory cgroup's limit less its usage", str(cgroup.limit_file),
                     cgroup.usage_file.name, "budget_bytes", "shared_memory=False"):
            if part not in full["message"]:
                failures.append(f"(d) the message lacks {part!r}: {full['message']!r}")

    if result.returncode != 0 or "end" not in parts:
        failures.append(f"the child did not end normally (exit {result.returncode})")
    assert not failures, "\n".join(failures) + "\n\n" + context
