"""A block goes back to its worker only when the last view of its batch is gone."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch
from _shm_helpers import Loopback

from mploader.config import SharedMemoryConfig

BIG = 250_000  # float32 elements: 1 MB, well above the inline threshold


def fresh_batch(value: float) -> dict:
    return {"tensor": torch.full((BIG,), value), "array": np.full((500, 500), value)}


@pytest.fixture
def loop():
    with Loopback() as loopback:
        yield loopback


def released_after(loop: Loopback, action) -> bool:
    action()
    gc.collect()
    return bool(loop.pending)


KEEPERS = {
    "slice": lambda batch: batch["tensor"][10:20],
    "view": lambda batch: batch["tensor"].view(500, 500),
    "reshape": lambda batch: batch["tensor"].reshape(-1, 10),
    "element": lambda batch: batch["tensor"][0],
    "numpy_of_tensor": lambda batch: batch["tensor"].numpy(),
    "from_numpy_round_trip": lambda batch: torch.from_numpy(batch["tensor"].numpy()[5:]),
    "numpy_slice": lambda batch: batch["array"][3, ::2],
    "numpy_view_dtype": lambda batch: batch["array"].view(np.uint8),
    "torch_from_array": lambda batch: torch.from_numpy(batch["array"])[1],
    "as_tensor_of_array": lambda batch: torch.as_tensor(batch["array"]).t(),
    "unbind": lambda batch: batch["tensor"].view(500, 500).unbind(0)[7],
    "storage": lambda batch: batch["tensor"].untyped_storage(),
}


@pytest.mark.parametrize("name", list(KEEPERS))
def test_a_derived_view_keeps_the_block(loop, name):
    batch = loop.roundtrip(fresh_batch(1.0))
    kept = KEEPERS[name](batch)
    snapshot = kept.clone() if isinstance(kept, torch.Tensor) else None
    assert not released_after(loop, lambda: batch.clear())
    # The pool cycles meanwhile; the kept view must not see the new data.
    for value in (2.0, 3.0):
        loop.roundtrip(fresh_batch(value))
        loop.deliver_releases()
    if snapshot is not None:
        assert torch.equal(kept, snapshot)
    del kept, snapshot
    assert len(loop.pending) == 1  # refcounting frees it; no cycle is involved


def test_dropping_the_batch_releases_its_block(loop):
    batch = loop.roundtrip(fresh_batch(1.0))
    assert loop.main.statistics().live_batches == 1
    del batch
    assert len(loop.pending) == 1  # refcounting alone, no gc needed
    assert loop.main.statistics().live_batches == 0


def test_copies_do_not_keep_the_block(loop):
    batch = loop.roundtrip(fresh_batch(1.0))
    copies = [batch["tensor"].clone(), batch["array"].copy(), batch["tensor"] + 1]
    del batch
    assert len(loop.pending) == 1
    assert torch.equal(copies[0], torch.full((BIG,), 1.0))


def test_held_batches_stay_intact_while_the_pool_cycles():
    config = SharedMemoryConfig(budget_bytes=128 << 20)  # 25 held 3.5 MiB blocks + 1
    with Loopback(config) as loop:
        held = []
        for index in range(50):
            batch = loop.roundtrip(fresh_batch(float(index)))
            if index % 2 == 0:
                held.append((index, batch))
            del batch
            loop.deliver_releases()  # odd batches go back and get reused at once
        statistics = loop.worker.statistics()
        assert statistics.blocks_in_use == 25
        assert statistics.reuse_hits >= 20
        for index, batch in held:
            assert torch.equal(batch["tensor"], torch.full((BIG,), float(index)))
            assert np.array_equal(batch["array"], np.full((500, 500), float(index)))
        del batch  # the loop variable still holds the last one
        held.clear()
        loop.deliver_releases()
        assert loop.worker.statistics().blocks_in_use == 0


def test_tensor_pickled_to_another_process_leaves_the_block(loop):
    import multiprocessing.reduction

    batch = loop.roundtrip(fresh_batch(1.0))
    tensor = batch["tensor"]
    del batch
    tensor.share_memory_()  # what torch.multiprocessing does to send it on: copies the storage
    gc.collect()
    assert multiprocessing.reduction.ForkingPickler.dumps(tensor)
    assert len(loop.pending) == 1
    assert torch.equal(tensor, torch.full((BIG,), 1.0))


def test_discard_releases_without_mapping(loop):
    payload = loop.worker.encode(fresh_batch(1.0))
    loop.main.discard(0, payload)
    assert len(loop.pending) == 1
    assert loop.main.statistics().mapped_blocks == 0
    loop.deliver_releases()
    # The block comes back and is used again; its name is still there to be mapped.
    batch = loop.roundtrip(fresh_batch(2.0))
    assert torch.equal(batch["tensor"], torch.full((BIG,), 2.0))
    assert loop.worker.statistics().reuse_hits == 1


def test_no_release_reported_after_close(loop):
    batch = loop.roundtrip(fresh_batch(1.0))
    loop.main.close()
    loop.main.close()  # idempotent
    del batch
    gc.collect()
    assert loop.pending == []


def test_no_release_reported_after_forget_worker(loop):
    batch = loop.roundtrip(fresh_batch(1.0))
    loop.main.forget_worker(0, loop.worker.statistics().worker_pid)
    assert torch.equal(batch["tensor"], torch.full((BIG,), 1.0))  # views stay valid
    del batch
    gc.collect()
    assert loop.pending == []
    assert loop.main.statistics().mapped_blocks == 0


def test_stale_and_duplicate_releases_are_ignored(loop):
    batch = loop.roundtrip(fresh_batch(1.0))
    del batch
    (_, block_id, generation) = loop.pending[0]
    loop.deliver_releases()
    second = loop.roundtrip(fresh_batch(2.0))  # same block, next generation
    loop.worker.release(block_id, generation)  # stale: must not free the block under `second`
    loop.worker.release(12345, 1)  # unknown block
    statistics = loop.worker.statistics()
    assert statistics.blocks_in_use == 1 and statistics.stale_releases == 2
    assert torch.equal(second["tensor"], torch.full((BIG,), 2.0))


def test_the_worker_keeps_no_reference_to_an_encoded_batch(loop):
    """Without cycles, a 600 MB item is freed the moment the worker drops it (not at some later
    garbage collection, which once let every item of a run pile up)."""
    import weakref

    gc.disable()
    try:
        for collate in (False, True):
            item = torch.ones(BIG)
            alive = weakref.ref(item)
            if collate:
                payload = loop.worker.collate_and_encode([item, item])
            else:
                payload = loop.worker.encode({"x": item})
            del item
            assert alive() is None
            batch = loop.main.decode(0, payload)
            decoded = weakref.ref(batch["x"] if not collate else batch)
            del batch
            assert decoded() is None and len(loop.pending) == 1
            loop.deliver_releases()
    finally:
        gc.enable()
