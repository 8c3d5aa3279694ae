"""Run under torchrun, twice: each rank checkpoints its own loader mid-epoch, and resumes it.

    resume_ranks.py first DIR    every rank: an uninterrupted run of two epochs, then a run that
                                 stops after 3 batches of epoch 0 and saves its state_dict() to
                                 DIR/state_<rank>.pt (torch.save)
    resume_ranks.py second DIR   every rank, in new processes: load DIR/state_<rank>.pt into a
                                 fresh loader and run the rest of epoch 0 and epoch 1

Each rank writes what it saw as JSON in DIR; the test compares.  Items carry a draw from torch's
global generator in the worker, so equal runs also mean the same worker-side randomness.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
from torch.utils.data import Dataset
from torch.utils.data.distributed import DistributedSampler

import mploader

STOP_AFTER = 3


class Drawing(Dataset):
    def __len__(self) -> int:
        return 46

    def __getitem__(self, index: int) -> list[int]:
        return [index, int(torch.randint(0, 10**6, ()).item())]


def make(rank: int, world: int) -> tuple[mploader.DataLoader, DistributedSampler]:
    sampler = DistributedSampler(Drawing(), num_replicas=world, rank=rank, shuffle=True, seed=3)
    loader = mploader.DataLoader(Drawing(), batch_size=4, sampler=sampler, num_workers=2,
                                 multiprocessing_context="fork",
                                 generator=torch.Generator().manual_seed(rank))
    return loader, sampler


def epoch(loader: mploader.DataLoader, sampler: DistributedSampler, number: int) -> list[list]:
    sampler.set_epoch(number)
    return [[[int(i), int(d)] for i, d in zip(*batch, strict=True)] for batch in loader]


def main(phase: str, directory: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    state_path = os.path.join(directory, f"state_{rank}.pt")
    if phase == "first":
        loader, sampler = make(rank, world)
        expected = [epoch(loader, sampler, number) for number in range(2)]
        loader, sampler = make(rank, world)
        sampler.set_epoch(0)
        iterator = iter(loader)
        seen = [[[int(i), int(d)] for i, d in zip(*next(iterator), strict=True)]
                for _ in range(STOP_AFTER)]
        torch.save(loader.state_dict(), state_path)  # each rank saves its own
        del iterator
        report = {"expected": expected, "seen": seen}
    else:
        loader, sampler = make(rank, world)
        loader.load_state_dict(torch.load(state_path, weights_only=True))
        report = {"rest": [epoch(loader, sampler, number) for number in range(2)]}
    with open(os.path.join(directory, f"{phase}_{rank}.json"), "w") as file:
        json.dump(report, file)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
