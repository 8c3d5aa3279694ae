"""Datasets for the DataLoader-level NebulaGraph tests (top level: spawn pickles them)."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import torch
from torch.utils.data import Dataset

import mploader


class YieldThroughWorkerSession(Dataset):
    """Item i asks the server ``YIELD i`` through the worker's own session."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        session = mploader.worker_session()
        value = session.execute(f"YIELD {index} AS q").rows()[0].values[0].get_iVal()
        return torch.tensor([index, value, os.getpid(), session.session_id])


class YieldThroughInheritedSession(Dataset):
    """The hazard: every worker queries through one raw nebula3 session made in the parent.

    A reply that belongs to another process's query, or a broken stream, counts as wrong (-1).
    """

    def __init__(self, session: Any, length: int) -> None:
        self.session = session
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        try:
            result = self.session.execute(f"YIELD {index} AS q")
            value = result.rows()[0].values[0].get_iVal() if result.is_succeeded() else -1
        except Exception:
            value = -1
        return torch.tensor([index, value])


class FetchFeatures(Dataset):
    """Item i: features and label of vertex i through a NebulaFeatureStore."""

    def __init__(self, store: Any, length: int) -> None:
        self.store = store
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        features, labels = self.store.fetch([index])
        return features[0], labels[0]


class YieldPerFetchThread(Dataset):
    """Item i waits ``delay`` s (so every fetch thread gets work), then asks ``YIELD i`` through
    the calling thread's session; the row says which process, thread and session answered."""

    def __init__(self, length: int, delay: float = 0.01) -> None:
        self.length = length
        self.delay = delay

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(self.delay)
        session = mploader.worker_session()
        value = session.execute(f"YIELD {index} AS q").rows()[0].values[0].get_iVal()
        return torch.tensor([index, value, os.getpid(), threading.get_ident(),
                             session.session_id])


class KillOnceAt(YieldPerFetchThread):
    """As :class:`YieldPerFetchThread`, but the worker that first fetches ``victim`` SIGKILLs
    itself (once: a marker file remembers it), after its sessions are open."""

    def __init__(self, length: int, victim: int, marker: str, delay: float = 0.01) -> None:
        super().__init__(length, delay)
        self.victim = victim
        self.marker = marker

    def __getitem__(self, index: int) -> torch.Tensor:
        row = super().__getitem__(index)
        if index == self.victim and not os.path.exists(self.marker):
            with open(self.marker, "w") as marker:
                marker.write(str(os.getpid()))
            os.kill(os.getpid(), 9)
        return row


class FetchAll(Dataset):
    """One item: features and labels of vertices ``0 .. length - 1``, in one ``fetch``."""

    def __init__(self, store: Any, length: int) -> None:
        self.store = store
        self.length = length

    def __len__(self) -> int:
        return 1

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.store.fetch(list(range(self.length)))


class QueryThenSleep(Dataset):
    """Item i asks ``YIELD i`` through the worker's session, then waits ``delay`` s (a worker
    busy with its sessions open)."""

    def __init__(self, length: int, delay: float) -> None:
        self.length = length
        self.delay = delay

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        mploader.worker_session().execute(f"YIELD {index} AS q")
        time.sleep(self.delay)
        return torch.tensor([index])
