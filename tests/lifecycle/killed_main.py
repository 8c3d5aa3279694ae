"""A main process SIGKILLed while its worker is busy (the ``killed_main_busy_worker`` fault row).

Run inside a private /dev/shm by ``fault_rows_channel.py``; imports neither torch nor mploader
itself, so the only interpreter that pays for them is the main process being killed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MAIN = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {repository!r})
    import mploader
    from tests.lifecycle.channel_faulty import Blocks
    loader = mploader.DataLoader(Blocks(8, slow_from=2, sleep=30), batch_size=None, num_workers=1,
                                 prefetch_factor=2, multiprocessing_context={start_method!r})
    iterator = iter(loader)
    first = next(iterator)
    print(" ".join(str(p.pid) for p in iterator._workers), flush=True)
    sys.stdin.readline()
    """
)


def _blocks_mapped_by(pid: int) -> set[str]:
    """The pool blocks ``pid`` maps (their inodes), from ``/proc/<pid>/maps``."""
    try:
        with open(f"/proc/{pid}/maps") as maps:
            return {line.split()[4] for line in maps if "/memfd:mploader" in line}
    except OSError:
        return set()


def scenario(start_method: str) -> None:
    main = subprocess.Popen(
        [sys.executable, "-c", MAIN.format(repository=REPOSITORY, start_method=start_method)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPOSITORY,
    )
    try:
        workers = [int(pid) for pid in main.stdout.readline().split()]
        assert workers, "the loader did not start"
        deadline = time.monotonic() + 10
        while len(_blocks_mapped_by(workers[0])) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)  # batch 1 waits, unmapped, in the pipe while item 2 takes 30 s
        unseen = _blocks_mapped_by(workers[0]) - _blocks_mapped_by(main.pid)
        assert unseen, "no block the main process has not mapped yet, to leave behind"
        main.send_signal(signal.SIGKILL)
        main.wait()
        deadline = time.monotonic() + 15
        while any(psutil.pid_exists(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [pid for pid in workers if psutil.pid_exists(pid)], "a worker outlived main"
        left = sorted(n for n in os.listdir("/dev/shm") if n.startswith("mploader-"))
        assert left == [], f"left in /dev/shm: {left}"
    finally:
        main.kill()
        main.wait()
        for stream in (main.stdin, main.stdout):
            if stream is not None:
                stream.close()
