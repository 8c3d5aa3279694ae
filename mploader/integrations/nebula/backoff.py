"""Exponential backoff with jitter, bounded by a total wait."""

from __future__ import annotations

import random
import time

FIRST_WAIT_SECONDS = 0.05  # a dropped connection or a refused login is often over at once
LONGEST_WAIT_SECONDS = 2.0  # polls a restarting graphd often enough to resume within ~2 s


class Backoff:
    """Waits of ``first * 2**n`` seconds (at most ``longest``), each drawn uniformly from
    ``[wait / 2, wait]`` (jitter: many clients retrying at once spread out, yet back off),
    until ``total`` seconds have passed since the first failure."""

    def __init__(
        self,
        total: float,
        first: float = FIRST_WAIT_SECONDS,
        longest: float = LONGEST_WAIT_SECONDS,
    ) -> None:
        self.total = total
        self.first = first
        self.longest = longest
        self.started = time.monotonic()
        self.attempts = 0

    @property
    def waited(self) -> float:
        """Seconds since the backoff began."""
        return time.monotonic() - self.started

    def sleep(self) -> bool:
        """Wait before the next attempt; ``False`` (without waiting) once ``total`` is used up."""
        left = self.total - self.waited
        if left <= 0:
            return False
        ceiling = min(self.longest, self.first * 2**self.attempts)
        self.attempts += 1
        time.sleep(min(left, random.uniform(ceiling / 2, ceiling)))
        return True
