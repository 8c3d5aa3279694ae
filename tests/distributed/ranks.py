"""Run under torchrun: every rank loads its DistributedSampler shard with mploader workers.

Rank 0 gathers every rank's indices and writes them as JSON to the path given as argv[1].
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
from torch.utils.data import Dataset
from torch.utils.data.distributed import DistributedSampler

import mploader


class Indices(Dataset):
    def __len__(self) -> int:
        return 103  # not divisible by the world size: DistributedSampler pads

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor(index)


def main(output: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    dataset = Indices()
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=7,
                                 drop_last=True)
    loader = mploader.DataLoader(dataset, batch_size=5, sampler=sampler, num_workers=2,
                                 multiprocessing_context="fork", persistent_workers=True)
    epochs = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        seen = [int(i) for batch in loader for i in batch]
        gathered: list[list[int] | None] = [None] * world
        dist.all_gather_object(gathered, seen)
        epochs.append(gathered)
    if rank == 0:
        with open(output, "w") as file:
            json.dump({"world": world, "epochs": epochs, "length": len(dataset)}, file)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
