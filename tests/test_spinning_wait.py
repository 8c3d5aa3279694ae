"""``SpinningWait``: a wait that polls without sleeping first, while that pays off, on a real pipe.

What must hold whatever the spinning: it returns what is ready, it never waits past its
timeout (a timeout of 0 never spins), it stops spinning once spins stop paying off and tries
again now and then, and ``MPLOADER_SPIN_US`` sets (or turns off) the spin.
"""

from __future__ import annotations

import os
import threading
import time

import pytest

from mploader.polling import Poller, SpinningWait, spin_seconds


@pytest.fixture
def pipe():
    read_fd, write_fd = os.pipe()
    yield read_fd, write_fd
    os.close(read_fd)
    os.close(write_fd)


def test_what_arrives_while_spinning_is_returned(pipe):
    read_fd, write_fd = pipe
    wait = SpinningWait(Poller(read_fd), spin_seconds=5.0)
    writer = threading.Timer(0.01, os.write, (write_fd, b"x"))
    writer.start()
    assert [fd for fd, _ in wait.ready(None)] == [read_fd]
    writer.join()
    assert wait.score == 1.0  # the spin paid off


def test_a_wait_never_outlasts_its_timeout(pipe):
    read_fd, _ = pipe
    wait = SpinningWait(Poller(read_fd), spin_seconds=30.0)
    started = time.monotonic()
    assert wait.ready(0) == []
    assert wait.ready(0.05) == []
    assert time.monotonic() - started < 5.0  # a spin of 30 s would have run on
    assert wait._waits == 1  # the timeout of 0 did not count as a wait, nor spin


def test_spinning_stops_when_it_does_not_pay_off_and_is_tried_again(pipe):
    read_fd, _ = pipe
    wait = SpinningWait(Poller(read_fd), spin_seconds=0.001)
    spun = []
    original = wait._spin

    def counting_spin(deadline: float) -> list:
        spun.append(wait._waits)
        return original(deadline)

    wait._spin = counting_spin  # type: ignore[method-assign]
    for _ in range(48):
        assert wait.ready(0.002) == []
    assert wait.score < 0.5
    # spins until the score fell below one half (6 failures), then one wait in 16
    assert spun[:6] == [1, 2, 3, 4, 5, 6] and spun[6:] == [16, 32, 48]


@pytest.mark.parametrize(("value", "seconds"), [(None, 200e-6), ("0", 0.0), ("50", 50e-6),
                                                ("-3", 0.0), ("fast", 200e-6)])
def test_the_spin_comes_from_the_environment(monkeypatch, value, seconds):
    if value is None:
        monkeypatch.delenv("MPLOADER_SPIN_US", raising=False)
    else:
        monkeypatch.setenv("MPLOADER_SPIN_US", value)
    assert spin_seconds() == pytest.approx(seconds)
