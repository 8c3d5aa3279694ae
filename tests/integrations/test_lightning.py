"""Inside Lightning, which hides the iterator, the loader's stats() is one attribute away."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import TensorDataset

import mploader

lightning = pytest.importorskip("lightning")


class Model(lightning.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.seen: list[mploader.LoaderStats] = []

    def training_step(self, batch, batch_index):
        features, target = batch
        self.seen.append(self.trainer.train_dataloader.stats())
        return torch.nn.functional.mse_loss(self.layer(features).squeeze(1), target)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.mark.parametrize("persistent_workers", [False, True])
def test_stats_in_a_training_step(persistent_workers):
    dataset = TensorDataset(torch.randn(32, 4), torch.randn(32))
    loader = mploader.DataLoader(dataset, batch_size=8, num_workers=2,
                                 multiprocessing_context="fork",
                                 persistent_workers=persistent_workers)
    model = Model()
    trainer = lightning.Trainer(accelerator="cpu", devices=1, max_epochs=2, logger=False,
                                enable_checkpointing=False, enable_progress_bar=False,
                                enable_model_summary=False)
    trainer.fit(model, loader)
    assert len(model.seen) == 8  # 4 batches x 2 epochs
    first, last = model.seen[0], model.seen[-1]
    assert len(first.workers) == 2 and all(w.pid for w in first.workers)
    assert [s.epoch for s in model.seen] == [0] * 4 + [1] * 4
    # Counts are the iterator's: persistent workers keep theirs over both epochs.
    delivered = 8 if persistent_workers else 4
    assert last.batches_delivered == delivered  # Lightning fetches one ahead of the step
    assert "bottleneck:" in str(last)
    assert trainer.train_dataloader.stats().batches_delivered == delivered  # after fit
