"""CPython 3.12+ warns when a process with threads forks: mploader's threads alone must not make
it warn where torch's loader, forking from the same program, does not.

mploader's main process runs threads of its own (the finalizer thread, the ``top`` publisher)
before it forks its workers; they are made to be forked over.  The program's own threads are
another matter: with one alive, both loaders warn.  Each case runs in a fresh interpreter, so
that no thread of another test (or a native one still starting up) is counted.
"""

from __future__ import annotations

import json
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
# machine busy with other tests).
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


@pytest.mark.parametrize("threads", ["only mploader's", "with a thread of the program"])
def test_mploader_warns_of_forking_with_threads_where_torch_does(threads: str) -> None:
    result = subprocess.run([sys.executable, "-c", _PROGRAM, threads],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    warned = json.loads(result.stdout.splitlines()[-1])
    assert warned == {"torch": threads != "only mploader's",
                      "mploader": threads != "only mploader's"}, warned
