"""Datasets that misbehave on purpose; top level so that spawn and forkserver can pickle them."""

from __future__ import annotations

import os
import signal
import time

import torch
from torch.utils.data import Dataset, IterableDataset

from mploader import WorkerHooks


class CustomError(Exception):
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class Unpicklable(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.lock = __import__("threading").Lock()


class Faulty(Dataset):
    """Item ``at`` misbehaves as ``how`` says; every other item is ``tensor([index])``."""

    def __init__(self, how: str, at: int = 3, length: int = 16, sleep: float = 0.0) -> None:
        self.how, self.at, self.length, self.sleep = how, at, length, sleep

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        if self.sleep:
            time.sleep(self.sleep)
        if index == self.at:
            if self.how == "raise":
                raise CustomError(f"bad item {index}", code=index)
            if self.how == "unpicklable_error":
                raise Unpicklable(f"bad item {index}")
            if self.how == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
            if self.how == "sigsegv":
                os.kill(os.getpid(), signal.SIGSEGV)
            if self.how == "exit":
                os._exit(3)
            if self.how == "hang":
                time.sleep(60)
            if self.how == "unpicklable_batch":
                return lambda: index
        return torch.tensor([index])


def failing_init(worker_id: int) -> None:
    raise CustomError(f"init failed in worker {worker_id}", code=worker_id)


class FailingIter(IterableDataset):
    def __iter__(self):
        raise CustomError("cannot iterate", code=7)


class Slow(Dataset):
    def __init__(self, length: int = 64, sleep: float = 0.05) -> None:
        self.length, self.sleep = length, sleep

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        time.sleep(self.sleep)
        return torch.tensor([index])


class CollectsGarbage(Dataset):
    """Each item runs the cyclic collector and a subprocess (a SIGCHLD) inside the worker."""

    def __len__(self) -> int:
        return 6

    def __getitem__(self, index: int):
        import gc
        import subprocess

        gc.collect()
        subprocess.run(["true"], check=True)
        return torch.tensor([index])


class FailingSetupHooks(WorkerHooks):
    """Worker hooks whose setup fails in every worker."""

    def setup(self, info) -> None:
        raise CustomError(f"setup failed in worker {info.id}", code=info.id)
