"""A worker that outlives the SIGKILL grace (the kernel slow to tear it down on a loaded
machine) is collected in the background once it ends, so its process object, and the pipes of
its ``Popen``, go with it; before, nobody asked for its status again and both stayed."""

from __future__ import annotations

import os
import time

from mploader.process import reaper

SLOW_DEATH_SECONDS = reaper.TERMINATE_GRACE_SECONDS + 0.5


class SlowToDie:
    """A stand-in process: ends ``SLOW_DEATH_SECONDS`` after ``kill()``."""

    pid = 123456

    def __init__(self) -> None:
        self.dies_at: float | None = None
        self.collected = False
        self.sentinel, self._write_end = os.pipe()  # never readable: the status is polled

    def kill(self) -> None:
        self.dies_at = time.monotonic() + SLOW_DEATH_SECONDS

    def terminate(self) -> None:
        self.kill()

    def is_alive(self) -> bool:
        if self.dies_at is not None and time.monotonic() >= self.dies_at:
            self.collected = True  # what Process.is_alive does: the status recorded
            return False
        return True

    def close(self) -> None:
        os.close(self.sentinel)
        os.close(self._write_end)


def test_a_worker_that_outlives_the_kill_grace_is_collected_once_it_ends() -> None:
    process = SlowToDie()
    try:
        reaper.kill_and_collect(process, worker_id=0)
        assert not process.collected  # still dying when the grace ran out
        assert reaper.wait_for_all(SLOW_DEATH_SECONDS + 5)
        assert process.collected
    finally:
        process.close()


def test_a_reaper_thread_s_own_last_kill_starts_no_other() -> None:
    process = SlowToDie()
    try:
        reaper.kill_and_collect(process, worker_id=0, in_background=False)
        assert reaper.wait_for_all(0.1) and not process.collected
    finally:
        process.close()
