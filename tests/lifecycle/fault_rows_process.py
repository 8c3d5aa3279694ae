"""Fault-table rows of the process side: the zygote, fds, the main process's own end, the trace
file, memory exhausted (issue 10, items 4, 5, 8, 10, and the classic ones).

Rows that need a main process of their own (one that is interrupted, killed, or exits with a
thread still iterating) run a short script in a subprocess, which prints what the row checks.
"""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import pickle
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
import torch

import mploader
from mploader.process import zygote

from .conftest import wait_until_gone
from .fault_row import FaultRow
from .faulty import Faulty, Slow

TESTS = str(Path(__file__).resolve().parents[1])
NO_ZYGOTE = "fork workers are forked by the main process itself: there is no zygote"
SPAWNING = ("spawn", "forkserver")


def write_script(body: str, start_method: str) -> str:
    """A script file (spawn re-imports the main module by its path) running ``body`` with
    ``METHOD`` bound and the tests importable."""
    script = f"import sys\nsys.path.insert(0, {TESTS!r})\nMETHOD = {start_method!r}\n"
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as file:
        file.write(script + textwrap.dedent(body))
    return file.name


def run_script(body: str, start_method: str, timeout: float = 60.0,
               wrapper: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``body`` in a fresh interpreter (see :func:`write_script`)."""
    script = write_script(body, start_method)
    try:
        return subprocess.run([*(wrapper or []), sys.executable, script], capture_output=True,
                              text=True, timeout=timeout)
    finally:
        os.unlink(script)


def torch_epoch(dataset: object, **kwargs: object) -> list[list[int]]:
    loader = torch.utils.data.DataLoader(dataset, **kwargs)  # type: ignore[arg-type]
    return [batch.flatten().tolist() for batch in loader]


def epoch(loader: object) -> list[list[int]]:
    return [batch.flatten().tolist() for batch in loader]  # type: ignore[attr-defined]


def zygote_pid(start_method: str) -> int:
    pids = zygote.helper_pids()
    loader_zygote = zygote.zygote_for(multiprocessing.get_context(start_method))
    assert loader_zygote.process.pid in pids
    return int(loader_zygote.process.pid)


# -- item 4: past 1024 file descriptors ----------------------------------------------------------

MANY_FDS = """
    import os, resource, torch, mploader
    from torch.utils.data import TensorDataset
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 5200:
        print("SKIP hard limit", hard)
        raise SystemExit(0)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 5200), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(5000)]
    print("highest fd", max(held))
    if __name__ == "__main__":
        dataset = TensorDataset(torch.arange(40))
        kwargs = dict(batch_size=4, num_workers=2, multiprocessing_context=METHOD)
        ours = [b[0].tolist() for b in mploader.DataLoader(dataset, **kwargs)]
        # torch's batches (its spawn loader also works past 1024 fds; it is left out for time)
        theirs = [b[0].tolist() for b in torch.utils.data.DataLoader(dataset, batch_size=4)]
        print("same", ours == theirs, len(ours))
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
"""


def five_thousand_fds(start_method: str) -> None:
    """5,000 fds open in the main process (fd numbers past 5,000, the zygote's socket among
    them): the epoch is torch's, on every start method (``select`` failed past 1024)."""
    result = run_script(MANY_FDS, start_method)
    if result.stdout.startswith("SKIP"):
        pytest.skip(f"RLIMIT_NOFILE's hard limit is too low: {result.stdout}")
    assert result.returncode == 0, result.stderr
    assert "same True 10" in result.stdout, result.stdout + result.stderr
    assert int(re.search(r"highest fd (\d+)", result.stdout).group(1)) > 5000  # type: ignore


# -- item 5: the zygote killed or stopped ----------------------------------------------------------


def zygote_sigkill_mid_epoch(start_method: str) -> None:
    """The zygote SIGKILLed after the first batch: its workers live on (they watch the main
    process, not the zygote), the epoch completes as torch's; the next epoch forks through a new
    zygote and is torch's again."""
    dataset = Slow(length=16, sleep=0.02)
    expected = torch_epoch(dataset, batch_size=2)
    loader = mploader.DataLoader(dataset, batch_size=2, num_workers=2,
                                 multiprocessing_context=start_method)
    iterator = iter(loader)
    got = [next(iterator).flatten().tolist()]
    os.kill(zygote_pid(start_method), signal.SIGKILL)
    got += epoch(iterator)
    assert got == expected
    assert epoch(loader) == expected


class KillAt(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Item ``at`` SIGKILLs its worker the first time (a marker file remembers)."""

    def __init__(self, marker: str, at: int, length: int = 16) -> None:
        self.marker, self.at, self.length = marker, at, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(0.02)
        if index == self.at and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return torch.tensor([index])


def zygote_sigkill_then_restart(start_method: str) -> None:
    """The zygote SIGKILLed, then a worker dies: with max_worker_restarts=1 the replacement is
    forked by a fresh zygote, transparently; the epoch is torch's and counts one restart."""
    with tempfile.TemporaryDirectory() as folder:
        marker = os.path.join(folder, "killed")
        open(marker, "w").close()  # no kill until the zygote is gone
        dataset = KillAt(marker, at=13)  # task 6, sent after batch 2: after the unlink
        expected = torch_epoch(dataset, batch_size=2)
        loader = mploader.DataLoader(dataset, batch_size=2, num_workers=2,
                                     multiprocessing_context=start_method,
                                     max_worker_restarts=1)
        iterator = iter(loader)
        got = [next(iterator).flatten().tolist()]
        os.kill(zygote_pid(start_method), signal.SIGKILL)
        os.unlink(marker)  # now item 13 kills its worker, once
        got += epoch(iterator)
        assert got == expected
        assert iterator.stats().restarts == 1
        assert os.path.exists(marker)


def zygote_sigstop_timeout(start_method: str) -> None:
    """The zygote stopped (SIGSTOP) mid-epoch: the epoch completes (its workers do not need the
    zygote) and its shutdown waits for the mute zygote's exit reports at most once,
    ``EXIT_REPORT_SECONDS``; the next epoch, with timeout=2, raises torch's timeout within about
    2 s, the stopped zygote named as the cause (forking used to wait until SIGCONT)."""
    dataset = Slow(length=8, sleep=0.01)
    loader = mploader.DataLoader(dataset, batch_size=2, num_workers=2,
                                 multiprocessing_context=start_method, timeout=2)
    iterator = iter(loader)
    got = [next(iterator).flatten().tolist()]
    pid = zygote_pid(start_method)
    os.kill(pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        got += epoch(iterator)  # ends with the shutdown of its workers
        ending = time.monotonic() - started
        assert got == torch_epoch(dataset, batch_size=2)
        started = time.monotonic()
        with pytest.raises(RuntimeError) as caught:
            epoch(loader)
        elapsed = time.monotonic() - started
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass  # abandoned: killed by the loader
    assert ending < zygote.EXIT_REPORT_SECONDS + 1.0, f"the epoch's end took {ending:.1f} s"
    assert str(caught.value) == "DataLoader timed out after 2 seconds"
    cause = str(caught.value.__cause__)
    assert "zygote" in cause and "stopped" in cause and "MPLOADER_ZYGOTE=0" in cause, cause
    assert elapsed < 3.5, f"took {elapsed:.1f} s"
    del caught


# -- item 8: the trace file ------------------------------------------------------------------------


def trace_does_not_follow_symlinks(start_method: str) -> None:
    """Symlinks planted at the trace's predictable temporary names are not written through; a
    trace folder that does not exist fails when the loader is built, naming the folder."""
    with tempfile.TemporaryDirectory() as folder:
        victim = Path(folder, "victim")
        victim.write_text("precious")
        trace = Path(folder, "run.json")
        for planted in ("run.json.tmp", ".run.json.tmp"):
            Path(folder, planted).symlink_to(victim)
        loader = mploader.DataLoader(Slow(length=4, sleep=0.0), batch_size=2, num_workers=2,
                                     multiprocessing_context=start_method, trace=trace)
        assert len(epoch(loader)) == 2
        assert victim.read_text() == "precious"
        assert json.loads(trace.read_text())["traceEvents"]
        assert sorted(os.listdir(folder)) == [".run.json.tmp", "run.json", "run.json.tmp",
                                              "victim"]  # no temporary file left
        missing = os.path.join(folder, "no such folder", "run.json")
        with pytest.raises(FileNotFoundError, match=re.escape(os.path.dirname(missing))):
            mploader.DataLoader(Slow(length=4), num_workers=2, trace=missing)


# -- item 10: a zygote that cannot start; pid None; a daemon thread at interpreter exit ------------

UNGUARDED = """
    import logging, torch, mploader
    from torch.utils.data import TensorDataset
    logging.basicConfig(level=logging.DEBUG)
    # No `if __name__ == "__main__":` guard: the zygote, started by spawn (or the fork server),
    # imports this module again and fails starting a process of its own.
    loader = mploader.DataLoader(TensorDataset(torch.arange(8)), batch_size=2, num_workers=2,
                                 multiprocessing_context=METHOD)
    print([b[0].tolist() for b in loader])
"""


def zygote_fails_to_start(start_method: str) -> None:
    """A zygote that dies before it is ready: ZygoteError with its exit status, where to look
    (its stderr), the usual cause and the way out; no ConnectionResetError, no `pid None`."""
    result = run_script(UNGUARDED, start_method)
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("mploader.errors.ZygoteError: mploader's "), last
    for part in ("exited with exit code 1 before it was ready", "stderr, above",
                 "if __name__ == '__main__':", "MPLOADER_ZYGOTE=0"):
        assert part in last, part
    assert "ConnectionResetError" not in result.stderr
    assert "pid None" not in result.stderr


DAEMON_THREAD = """
    import threading, time, mploader
    from lifecycle.faulty import Slow

    started = threading.Event()

    def consume():
        loader = mploader.DataLoader(Slow(length=400, sleep=0.05), batch_size=1, num_workers=2,
                                     multiprocessing_context=METHOD)
        iterator = iter(loader)
        print(" ".join(str(process.pid) for process in iterator._workers), flush=True)
        started.set()
        for _ in iterator:
            pass

    if __name__ == "__main__":
        threading.Thread(target=consume, daemon=True).start()
        started.wait(30)
        time.sleep(0.5)  # the main thread ends while the daemon thread iterates
"""


def daemon_thread_at_exit(start_method: str) -> None:
    """Interpreter exit while a daemon thread iterates: no traceback (no WorkerDiedError, no
    BrokenPipeError from workers), exit status 0, and the workers end."""
    result = run_script(DAEMON_THREAD, start_method)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr and "Error" not in result.stderr, result.stderr
    pids = [int(pid) for pid in result.stdout.split()]
    assert len(pids) == 2 and wait_until_gone(pids, seconds=5) == []


# -- the classic ones ----------------------------------------------------------------------------


def _pickling_error(value: object) -> str:
    """What this Python's pickler says of ``value`` (its words differ between versions: 3.11
    and 3.12 "Can't pickle local object ...", 3.13 "Can't get local object ...")."""
    try:
        pickle.dumps(value)
    except (AttributeError, TypeError, pickle.PicklingError) as error:
        return str(error)
    raise AssertionError(f"{value!r} pickles")


def unpicklable_batch(shared_memory: bool) -> FaultRow:
    def run(start_method: str) -> None:
        """A batch that cannot be pickled is the pickling error, for that batch, within seconds
        (torch's worker raises it in its queue's feeder thread and the loader hangs for good)."""
        faulty = Faulty("unpicklable_batch")
        expected = _pickling_error(faulty[faulty.at])  # the batch the worker makes
        loader = mploader.DataLoader(faulty, batch_size=None, num_workers=2,
                                     multiprocessing_context=start_method,
                                     shared_memory=shared_memory)
        started = time.monotonic()
        with pytest.raises((AttributeError, TypeError, pickle.PicklingError)) as caught:
            list(loader)
        message = str(caught.value)
        del caught  # its traceback holds the loader's iterator, and so its workers
        assert time.monotonic() - started < 15
        assert expected in message, (expected, message)

    return FaultRow(f"unpicklable_batch_{'shm' if shared_memory else 'pickle'}", run)


MAIN_PROCESS = """
    import os, signal, time, torch, mploader
    from torch.utils.data import Dataset

    # Ctrl-C as an interactive Python takes it, however the suite was started: a shell without
    # job control starts a background command with SIGINT ignored, and Python then leaves it so.
    signal.signal(signal.SIGINT, signal.default_int_handler)

    class Items(Dataset):
        def __len__(self):
            return 64
        def __getitem__(self, index):
            if index >= 8:
                time.sleep(60)  # busy for good: only the watchdog can end it
            return torch.full((FLOATS,), index, dtype=torch.float32)

    if __name__ == "__main__":
        loader = mploader.DataLoader(Items(), batch_size=1, num_workers=2,
                                     multiprocessing_context=METHOD)
        iterator = iter(loader)
        next(iterator)
        time.sleep(0.5)  # the workers finish the prefetched items 1-4 and wait for tasks
        print(os.getpid(), " ".join(str(p.pid) for p in iterator._workers), flush=True)
        if WAIT_IN_NEXT:  # main blocks in __next__, workers busy in item 8 and 9
            for _ in iterator:
                pass
        time.sleep(60)  # main idle, workers idle
"""


def main_process_ends(row_id: str, how: signal.Signals, wait_in_next: bool, floats: int,
                      seconds: float) -> FaultRow:
    """A subprocess runs a loader and gets ``how``: its workers end by themselves within
    ``seconds`` (idle ones see their task pipe close; busy ones are ended by the watchdog), and
    nothing of it is left in /dev/shm."""

    def run(start_method: str) -> None:
        script = write_script(f"FLOATS = {floats}\nWAIT_IN_NEXT = {wait_in_next}\n"
                              + textwrap.dedent(MAIN_PROCESS), start_method)
        parent = subprocess.Popen([sys.executable, script], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        try:
            assert parent.stdout is not None
            main_pid, *pids = (int(pid) for pid in parent.stdout.readline().split())
            assert len(pids) == 2
            if wait_in_next:
                time.sleep(0.5)  # past the fast items 1-7: blocked in __next__ on item 8
            parent.send_signal(how)
            _, stderr = parent.communicate(timeout=30)
            started = time.monotonic()
            assert wait_until_gone(pids, seconds=10) == []
            took = time.monotonic() - started
        finally:
            parent.kill()
            parent.wait()
            os.unlink(script)
        if how == signal.SIGINT:
            assert stderr.rstrip().endswith("KeyboardInterrupt"), stderr
            assert "mploader" in stderr, stderr  # raised inside the loader's __next__
            assert parent.returncode != 0
        else:
            assert parent.returncode == -signal.SIGKILL
        assert took < seconds, f"workers took {took:.1f} s to end"
        left = [name for name in os.listdir("/dev/shm") if f"-{main_pid}-" in name]
        assert not left, f"/dev/shm entries of the dead main process: {left}"

    return FaultRow(row_id, run)


MEMORY_EXHAUSTED = """
    import gc, os
    # mploader.memory.available_memory()'s test override, set before anything starts, so that
    # every worker (forked, spawned, or forked by a zygote or fork server) sees 4 MiB left.
    os.environ["MPLOADER_MEMORY_AVAILABLE_FOR_TESTING"] = str(4 << 20)
    import torch, mploader
    from torch.utils.data import Dataset
    from mploader.channel.shm import SharedMemoryFullError
    from leaks import own_blocks

    class Big(Dataset):
        def __len__(self):
            return 4
        def __getitem__(self, index):
            return torch.full((2 << 20,), index, dtype=torch.float32)  # 8 MiB

    if __name__ == "__main__":
        loader = mploader.DataLoader(Big(), batch_size=1, num_workers=2,
                                     multiprocessing_context=METHOD,
                                     shared_memory=mploader.SharedMemoryConfig(256 << 20))
        try:
            list(loader)
        except SharedMemoryFullError as error:
            print("needed", error.needed_bytes, "available", error.available_bytes,
                  "errno", error.errno)
            print("message", error)
        del loader
        gc.collect()  # the iterator, in a cycle with the error's traceback, is gone
        mploader.finalizers.settle(10)  # and shut down by the finalizer thread
        print("left", sorted(own_blocks()))
"""


def memory_exhausted(start_method: str) -> None:
    """The machine (or the memory cgroup) has 4 MiB left, as the workers measure it (the test
    override of ``mploader.memory.available_memory``): an 8 MiB batch is a
    SharedMemoryFullError (ENOMEM) naming what was needed, what is available and where that was
    measured; no block is left. A real memory cgroup's limit:
    ``tests/shm/test_memory_budget.py``."""
    result = run_script(MEMORY_EXHAUSTED, start_method)
    assert result.returncode == 0, result.stderr
    assert f"needed 8388608 available 4194304 errno {errno.ENOMEM}" in result.stdout, (
        result.stdout + result.stderr)
    assert ("a block needs 8388608 bytes (8.0 MiB) but only 4194304 bytes (4.0 MiB) are "
            "available, according to the test override "
            "(MPLOADER_MEMORY_AVAILABLE_FOR_TESTING=4194304)"
            in result.stdout), result.stdout
    assert "/dev/shm" not in result.stdout
    assert "left []" in result.stdout


PROCESS_FAULTS: list[FaultRow] = [
    FaultRow("5000_fds", five_thousand_fds),
    FaultRow("zygote_sigkill_mid_epoch", zygote_sigkill_mid_epoch, SPAWNING, NO_ZYGOTE),
    FaultRow("zygote_sigkill_then_restart", zygote_sigkill_then_restart, SPAWNING, NO_ZYGOTE),
    FaultRow("zygote_sigstop_timeout", zygote_sigstop_timeout, SPAWNING, NO_ZYGOTE),
    FaultRow("trace_no_symlink_follow", trace_does_not_follow_symlinks),
    FaultRow("zygote_fails_to_start", zygote_fails_to_start, SPAWNING, NO_ZYGOTE),
    FaultRow("daemon_thread_at_exit", daemon_thread_at_exit),
    unpicklable_batch(shared_memory=False),
    unpicklable_batch(shared_memory=True),
    # Ctrl-C while waiting for a batch: KeyboardInterrupt, busy workers stopped (urgent).
    main_process_ends("sigint_main", signal.SIGINT, wait_in_next=True, floats=1, seconds=3.0),
    # kill -9 of an idle main process holding 1 MiB batches in blocks: workers see EOF.
    main_process_ends("sigkill_main", signal.SIGKILL, wait_in_next=False, floats=1 << 18,
                      seconds=3.0),
    # kill -9 while workers are busy for good: the watchdog ends them after its grace period.
    main_process_ends("watchdog_parent_death", signal.SIGKILL, wait_in_next=True, floats=1,
                      seconds=3.0 + 3.0),
    FaultRow("memory_exhausted", memory_exhausted),
]
