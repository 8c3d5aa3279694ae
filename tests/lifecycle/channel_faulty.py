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
