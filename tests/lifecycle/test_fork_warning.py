"""CPython 3.12+ warns when a process with threads forks: mploader's threads alone must not make
it warn where torch's loader, forking from the same program, does not.

mploader's main process runs threads of its own (the finalizer thread, the ``top`` publisher,
the reaper's threads) before it forks its workers; they are made to be forked over.  The
program's own threads are another matter: with one alive, both loaders warn.  CPython counts the
threads after the fork: a native pool that stops itself at a fork (OpenBLAS's, which importing
numpy starts) is not counted.  Each case runs in a fresh interpreter, so that no thread of
another test is counted; those that are not about OpenBLAS run without its pool
(``OPENBLAS_NUM_THREADS=1``), so that the only threads are the ones the case makes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    sys.version_info < (3, 12), reason="CPython warns of a fork with threads from 3.12 on")

_PROGRAM = """
import json, sys, threading, time, warnings
import psutil
import torch.utils.data
import mploader

# Threads that importing torch may run for a moment have ended (longer than half a second on a
# machine busy with other tests; OpenBLAS's pool, which stays until a fork, is not started).
deadline = time.monotonic() + 10
while psutil.Process().num_threads() > 1 and time.monotonic() < deadline:
    time.sleep(0.05)
stop = threading.Event()
if sys.argv[1] == "with a thread of the program":
    threading.Thread(target=stop.wait, name="the program's").start()
warned = {}
# torch's loader for one epoch: its second would fork while the first epoch's queue feeder
# threads may still be ending (on a busy machine), a warning of torch's own making.  mploader's
# for two: its second forks with its own threads of the first alive.
for name, loader_class, epochs in (("torch", torch.utils.data.DataLoader, 1),
                                   ("mploader", mploader.DataLoader, 2)):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _epoch in range(epochs):
            list(loader_class(list(range(8)), batch_size=2, num_workers=2,
                              multiprocessing_context="fork"))
    warned[name] = any("multi-threaded, use of fork()" in str(warning.message)
                       for warning in caught)
stop.set()
print(json.dumps(warned))
"""


# No pool of OpenBLAS's (its threads are not the case's, and stop at the first fork).
_ONE_BLAS_THREAD = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}


def _run(program: str, case: str, env: dict[str, str] | None = None) -> dict[str, object]:
    result = subprocess.run([sys.executable, "-c", program, case], capture_output=True,
                            text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.parametrize("threads", ["only mploader's", "with a thread of the program"])
def test_mploader_warns_of_forking_with_threads_where_torch_does(threads: str) -> None:
    warned = _run(_PROGRAM, threads, _ONE_BLAS_THREAD)
    assert warned == {"torch": threads != "only mploader's",
                      "mploader": threads != "only mploader's"}, warned



_FIRST_EPOCH = """
import json, os, sys, warnings
import torch.utils.data
import mploader

threads = len(os.listdir("/proc/self/task"))  # with OpenBLAS's pool where numpy started one
loader_class = {"torch": torch.utils.data.DataLoader, "mploader": mploader.DataLoader}[sys.argv[1]]
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    list(loader_class(list(range(8)), batch_size=2, num_workers=2, multiprocessing_context="fork"))
print(json.dumps({"threads": threads, "warned": any("multi-threaded, use of fork()" in
                                                    str(warning.message) for warning in caught)}))
"""


def test_the_first_epoch_after_import_warns_where_torch_s_does() -> None:
    """A program's first epoch, right after ``import torch``: OpenBLAS's pool (numpy's, one
    thread fewer than the cores) is alive until the fork, where it stops itself, so torch's
    loader does not warn; mploader's did, having counted the pool before its fork."""
    torch_s, mploader_s = _run(_FIRST_EPOCH, "torch"), _run(_FIRST_EPOCH, "mploader")
    assert mploader_s == torch_s, {"torch": torch_s, "mploader": mploader_s}


# Beside busy processes (two that burn a core each, as the other test processes and the program's
# own work do), the threads of mploader's main process end late: a thread that has left
# ``threading.enumerate()`` (its Python code has returned) is counted by the kernel until the
# scheduler lets it finish.  The reaper's threads (one per worker that said goodbye, each ending
# when its worker's exit is collected) end so while the next epoch forks.
_BUSY = """
import json, os, subprocess, sys, threading, time, warnings
import psutil
import torch.utils.data
import mploader

burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
try:
    deadline = time.monotonic() + 10  # as in _PROGRAM
    while psutil.Process().num_threads() > 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    result = {}
    if sys.argv[1] == "epochs":
        loader = mploader.DataLoader(list(range(8)), batch_size=2, num_workers=4,
                                     multiprocessing_context="fork")
        warned = 0
        for _epoch in range(60):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                list(loader)
            warned += any("multi-threaded, use of fork()" in str(warning.message)
                          for warning in caught)
        result["epochs that warned"] = warned
    else:
        # A thread of mploader's whose end lasts until mploader's first fork has begun, and a
        # moment more (or for good): a thread-local's finalizer runs once its Python code has
        # returned and it has left threading.enumerate().
        times = {}

        class SlowEnd:
            def __del__(self):
                while "first fork" not in times:
                    time.sleep(0.001)
                time.sleep(0.05 if sys.argv[1] == "ending" else 3600.0)
                times["ended"] = time.monotonic()

        local = threading.local()

        def run():
            local.slow = SlowEnd()

        def note_fork():
            times.setdefault("first fork", time.monotonic())

        # torch's loader first where the thread stays (its own epoch outlasts an end that
        # takes a while; and mploader's threads, once started, are there for torch's forks).
        loaders = [("mploader", mploader.DataLoader)]
        if sys.argv[1] == "stuck":
            loaders.insert(0, ("torch", torch.utils.data.DataLoader))
        thread = threading.Thread(target=run, name="mploader-ending", daemon=True)
        thread.start()
        while thread in threading.enumerate():
            time.sleep(0.001)
        os.register_at_fork(before=note_fork)
        for name, loader_class in loaders:
            times.pop("first fork", None)  # mploader's first fork
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                list(loader_class(list(range(8)), batch_size=2, num_workers=2,
                                  multiprocessing_context="fork"))
            result[name] = any("multi-threaded, use of fork()" in str(warning.message)
                               for warning in caught)
        result["forked while it ended"] = times["first fork"] < times.get("ended", 1e300)
finally:
    for burner in burners:
        burner.kill()
        burner.wait()
print(json.dumps(result))
"""


def _run_busy(case: str) -> dict[str, object]:
    return _run(_BUSY, case, _ONE_BLAS_THREAD)


def test_no_epoch_warns_beside_busy_processes() -> None:
    """Sixty epochs of one loader beside two busy processes: no fork of mploader's warns (one or
    a few did, in most runs, when a thread of mploader's still ending was counted as another's,
    or when one ended between the two counts subtracted)."""
    assert _run_busy("epochs") == {"epochs that warned": 0}


def test_a_thread_of_mploader_s_still_ending_is_forked_over() -> None:
    """mploader's fork waits out a thread of its own that is ending (gone from
    ``threading.enumerate()``, still counted by the kernel): no warning."""
    assert _run_busy("ending") == {"mploader": False, "forked while it ended": True}


def test_a_thread_that_stays_out_of_threading_s_sight_warns_as_for_torch() -> None:
    """A thread the kernel counts and ``threading`` does not (a native one, or one stuck in its
    end) is another's: mploader's fork warns, as torch's does."""
    assert _run_busy("stuck") == {"torch": True, "mploader": True,
                                  "forked while it ended": True}


_WORKER_WARNS = """
import sys, warnings
import torch.utils.data
import mploader

class Warns(torch.utils.data.Dataset):
    def __len__(self):
        return 2

    def __getitem__(self, index):
        warnings.warn(f"item {index}")
        return index

loader_class = {"torch": torch.utils.data.DataLoader, "mploader": mploader.DataLoader}[sys.argv[1]]
list(loader_class(Warns(), num_workers=1, multiprocessing_context="fork"))
"""


def test_a_forked_worker_shows_its_warnings_as_torch_s_does() -> None:
    """The fork happens while mploader records the warnings of its main process; the worker,
    which never leaves that recording, shows its own warnings all the same."""
    shown = {}
    for name in ("torch", "mploader"):
        result = subprocess.run([sys.executable, "-W", "default", "-c", _WORKER_WARNS, name],
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        shown[name] = sorted(line.split("UserWarning: ")[1]
                             for line in result.stderr.splitlines() if "UserWarning: item" in line)
    assert shown == {"torch": ["item 0", "item 1"], "mploader": ["item 0", "item 1"]}, shown


_SHOWN_ONCE = """
import sys, threading
import torch.utils.data
import mploader

loader_class = {"torch": torch.utils.data.DataLoader, "mploader": mploader.DataLoader}[sys.argv[1]]
for threads in ("only the loader's", "with a thread of the program"):
    if threads == "with a thread of the program":
        stop = threading.Event()
        threading.Thread(target=stop.wait, name="the program's").start()
    for _epoch in range(2):
        list(loader_class(list(range(8)), batch_size=2, num_workers=3,
                          multiprocessing_context="fork"))
stop.set()
"""


def test_the_warning_is_shown_as_often_as_torch_s() -> None:
    """Under ``-W default`` (a warning shown once per place it comes from), six forks without a
    thread of the program, then six with one: torch's loader shows the warning once, and so does
    mploader's (its recording kept the filters, and so their registries, as they were; a warning
    it dropped is not taken for shown)."""
    shown = {}
    for name in ("torch", "mploader"):
        result = subprocess.run([sys.executable, "-W", "default", "-c", _SHOWN_ONCE, name],
                                capture_output=True, text=True, timeout=120,
                                env=_ONE_BLAS_THREAD)
        assert result.returncode == 0, result.stderr
        shown[name] = result.stderr.count("is multi-threaded, use of fork()")
    assert shown == {"torch": 1, "mploader": 1}
