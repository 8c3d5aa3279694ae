"""Datasets for the shared-memory channel's fault rows (top level, so spawn can pickle them)."""

from __future__ import annotations

import os
import signal
import time

import torch
from torch.utils.data import Dataset

MiB = 1 << 20


class SlowAndKilled(Dataset):
    """Item i: ``numel`` float32 elements equal to i (through a block, not inline).

    Items in ``slow`` sleep ``sleep`` seconds, so later results wait in the task table; each item in
    ``kill`` SIGKILLs its worker the first time only (a marker file per item remembers).
    """

    def __init__(self, marker_dir: str, length: int, slow: tuple[int, ...],
                 kill: tuple[int, ...], sleep: float, numel: int = MiB // 4) -> None:
        self.marker_dir, self.length = marker_dir, length
        self.slow, self.kill, self.sleep, self.numel = slow, kill, sleep, numel

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        if index in self.slow:
            time.sleep(self.sleep)
        marker = os.path.join(self.marker_dir, f"killed-{index}")
        if index in self.kill and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return torch.full((self.numel,), float(index))


class Blocks(Dataset):
    """Item i: ``numel`` float32 elements equal to i (1 MiB by default: through a block); items
    from ``slow_from`` on sleep ``sleep`` seconds first (a worker busy in a long item)."""

    def __init__(self, length: int, numel: int = MiB // 4, slow_from: int | None = None,
                 sleep: float = 0.0) -> None:
        self.length, self.numel, self.slow_from, self.sleep = length, numel, slow_from, sleep

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.slow_from is not None and index >= self.slow_from:
            time.sleep(self.sleep)
        return torch.full((self.numel,), float(index))
