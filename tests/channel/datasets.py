"""Datasets for the loader-level channel tests (top level, so spawn can pickle them)."""

from __future__ import annotations

import os
import signal
import threading

import numpy as np
import torch
from torch.utils.data import Dataset


class Patterned(Dataset):
    """Item i: a float32 tensor of ``numel`` elements, all equal to i (cheap to check)."""

    def __init__(self, length: int, numel: int) -> None:
        self.length, self.numel = length, numel

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.full((self.numel,), float(index))


class NumpyItems(Dataset):
    """Item i: a fresh float32 numpy array of ``numel`` elements, all equal to i."""

    def __init__(self, length: int, numel: int) -> None:
        self.length, self.numel = length, numel

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> np.ndarray:
        return np.full(self.numel, float(index), dtype=np.float32)


def kill_while_writing(batch):
    """A collate_fn that SIGKILLs its own worker a few ms later: mid-way through the copy of a
    256 MB batch into its shared-memory block."""
    threading.Timer(0.01, os.kill, (os.getpid(), signal.SIGKILL)).start()
    return torch.ones(64 << 20)
