"""A loader in a container's default 64 MiB ``/dev/shm`` (Docker, Kubernetes): big batches arrive
intact, and the loader never puts more than 1 MiB in ``/dev/shm``.

Pool blocks are anonymous memory files, so a small ``/dev/shm`` limits nothing: 64 MiB batches and
600 MB batches go through with default settings, 2 workers, under every start method.  (Blocks
that were files in ``/dev/shm`` refused every batch over 8 MiB per worker there with
``BatchTooLargeError``; torch's loader fails at 16-32 MiB batches.)

Each case runs a script in a mount namespace of its own (``unshare --mount``) that mounts a 64 MiB
tmpfs on ``/dev/shm``: only that process tree sees it, so everything in it is the loader's (and
multiprocessing's semaphores under spawn and forkserver, a page each).  The script samples the
tmpfs's used bytes after every batch and from a thread every 5 ms.  Needs root (to mount) and
``unshare(1)``; skipped otherwise.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

import numpy as np
import pytest
import torch
import torch.utils.data

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHM = "/dev/shm"
SHM_SIZE = "64m"  # Docker's and Kubernetes' default
MAX_SHM_USE = 1 << 20  # what the loader may put in /dev/shm at any moment
SAMPLE_SECONDS = 0.005
SCRIPT_TIMEOUT = 150.0
RESULT = "RESULT "

# case -> (batches, items per batch (None: batch_size=None), item shape)
CASES: dict[str, tuple[int, int | None, tuple[int, ...]]] = {
    "64MiB": (4, 16, (1 << 20,)),  # 16 float32 items of 4 MiB, collated: 64 MiB a batch
    "600MB": (2, None, (250_000, 602)),  # one 602 MB float32 array a batch, as the benchmark's
}


class Filled(torch.utils.data.Dataset):
    """Item ``i`` is a fresh float32 array of ``shape``, every element ``i // per_batch``: batch
    ``b`` holds ``b`` and nothing else, which ``min == max == b`` checks completely."""

    def __init__(self, batches: int, per_batch: int | None, shape: tuple[int, ...]) -> None:
        self.per_batch = per_batch or 1
        self.length = batches * self.per_batch
        self.shape = shape

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> np.ndarray:
        return np.full(self.shape, index // self.per_batch, dtype=np.float32)


def _shm_used() -> int:
    stats = os.statvfs(SHM)
    return (stats.f_blocks - stats.f_bfree) * stats.f_frsize


def child_main(start_method: str, case: str) -> int:
    """Run in the namespace: load every batch of ``case``, check it, print what was seen."""
    import mploader

    batches, per_batch, shape = CASES[case]
    seen = {"max": _shm_used(), "samples": 1, "baseline": _shm_used()}
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(SAMPLE_SECONDS):
            used = _shm_used()
            seen["samples"] += 1
            if used > seen["max"]:
                seen["max"] = used

    sampler = threading.Thread(target=sample, name="shm-sampler", daemon=True)
    sampler.start()
    loader = mploader.DataLoader(Filled(batches, per_batch, shape), batch_size=per_batch,
                                 num_workers=2, multiprocessing_context=start_method)
    expected_shape = list(shape) if per_batch is None else [per_batch, *shape]
    report: dict[str, Any] = {"values": [], "problems": []}
    started = time.perf_counter()
    try:
        for number, batch in enumerate(loader):
            used = _shm_used()
            seen["max"] = max(seen["max"], used)
            if type(batch) is not torch.Tensor or batch.dtype != torch.float32 \
                    or list(batch.shape) != expected_shape:
                report["problems"].append(
                    f"batch {number}: {type(batch).__name__} "
                    f"{getattr(batch, 'dtype', '?')} {list(getattr(batch, 'shape', []))}, "
                    f"expected float32 {expected_shape}"
                )
                continue
            low, high = (float(value) for value in torch.aminmax(batch))
            report["values"].append([low, high])
            del batch
    finally:
        stop.set()
        sampler.join()
    seen["max"] = max(seen["max"], _shm_used())
    report.update(max_used=seen["max"], baseline=seen["baseline"], samples=seen["samples"],
                  seconds=round(time.perf_counter() - started, 2))
    print(RESULT + json.dumps(report), flush=True)
    return 0


CHILD = textwrap.dedent(
    """
    import sys
    from tests.shm.test_container import child_main
    sys.exit(child_main(sys.argv[1], sys.argv[2]))
    """
)


@pytest.fixture(scope="module")
def unshare() -> str:
    """``unshare(1)``, once a private 64 MiB /dev/shm is known to mount; skips otherwise."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to mount a private 64 MiB tmpfs on /dev/shm")
    path = shutil.which("unshare")
    if path is None:
        pytest.skip("unshare(1) is not installed")
    probe = subprocess.run(
        [path, "--mount", "--propagation", "private", "sh", "-c",
         f"mount -t tmpfs -o size={SHM_SIZE} tmpfs {SHM} && df -k {SHM}"],
        capture_output=True, text=True, timeout=30,
    )
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a private /dev/shm here (unshare --mount, mount -t tmpfs): "
                    f"{probe.stderr.strip() or probe.returncode}")
    return path


def _run_in_small_dev_shm(unshare: str, start_method: str, case: str) -> tuple[int, str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        part for part in (REPOSITORY, env.get("PYTHONPATH")) if part
    )
    command = (f"mount -t tmpfs -o size={SHM_SIZE},mode=1777 tmpfs {SHM} && "
               f"exec {shlex.quote(sys.executable)} -c {shlex.quote(CHILD)} "
               f"{shlex.quote(start_method)} {shlex.quote(case)}")
    process = subprocess.Popen(
        [unshare, "--mount", "--propagation", "private", "sh", "-c", command],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPOSITORY, env=env,
        start_new_session=True,  # its workers too are in its process group: killed in finally
    )
    try:
        try:
            stdout, stderr = process.communicate(timeout=SCRIPT_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()
            pytest.fail(f"the script ({start_method}, {case}) did not finish within "
                        f"{SCRIPT_TIMEOUT:g} s; its stderr:\n{stderr[-4000:]}")
        return process.returncode, stdout, stderr
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)  # a worker left behind
        except (ProcessLookupError, PermissionError):
            pass
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.timeout(SCRIPT_TIMEOUT + 60)
@pytest.mark.parametrize("case", list(CASES))
def test_big_batches_in_a_64_mib_dev_shm(unshare: str, start_method: str, case: str) -> None:
    batches, per_batch, shape = CASES[case]
    returncode, stdout, stderr = _run_in_small_dev_shm(unshare, start_method, case)
    what = (f"mploader.DataLoader(batch_size={per_batch}, num_workers=2, "
            f"multiprocessing_context={start_method!r}), {batches} batches of {case} "
            f"(items {shape} float32) in a {SHM_SIZE} /dev/shm")
    assert returncode == 0, f"{what} failed (exit status {returncode}); its stderr:\n" \
                            f"{stderr[-4000:]}"
    lines = [line for line in stdout.splitlines() if line.startswith(RESULT)]
    assert lines, f"{what}: no result printed; stdout:\n{stdout[-2000:]}\nstderr:\n" \
                  f"{stderr[-4000:]}"
    report = json.loads(lines[-1][len(RESULT):])
    assert not report["problems"], f"{what}: {report['problems']}"
    expected = [[float(number), float(number)] for number in range(batches)]
    assert report["values"] == expected, \
        f"{what}: (min, max) of each batch {report['values']}, expected {expected}"
    assert report["max_used"] <= MAX_SHM_USE, (
        f"{what}: /dev/shm held up to {report['max_used'] / 2**20:.1f} MiB "
        f"(at most {MAX_SHM_USE / 2**20:g} MiB allowed; {report['baseline']} bytes before the "
        f"loader, {report['samples']} samples over {report['seconds']} s)"
    )
