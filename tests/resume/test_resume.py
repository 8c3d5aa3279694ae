"""Mid-epoch resume, differentially: an uninterrupted run against one that stops, saves
``state_dict()``, and goes on in a fresh loader (or a fresh process) after ``load_state_dict()``.

Items carry one draw from each of torch's, numpy's (uniform and Gaussian) and Python's global
generators, made in the worker: equal runs mean the same samples, in the same batches, in the same
order, with the same random augmentations, in this epoch and the next ones.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import BatchSampler, DistributedSampler, RandomSampler, SequentialSampler

import mploader

from .scenarios import (
    BATCH,
    LENGTH,
    Augmented,
    FixedOrder,
    PerItem,
    ResumableOrder,
    Split,
    StatefulStream,
    Stream,
    close,
    fetched,
    first_half,
    indices,
    joined,
    plain,
    resumed,
    second_half,
    shuffled,
    streamed,
    uninterrupted,
)

pytestmark = pytest.mark.timeout(90)
EPOCHS = 2
BATCHES = -(-LENGTH // BATCH)  # 7


@pytest.mark.parametrize("batches", [0, 3, BATCHES, None],
                         ids=["at-start", "middle", "after-last-batch", "after-stop-iteration"])
def test_shuffled_augmented_map_dataset(batches: int | None) -> None:
    split = Split(0, batches)
    assert resumed(shuffled, split, EPOCHS) == uninterrupted(shuffled, EPOCHS)


@pytest.mark.parametrize("start_method", ["spawn", "forkserver"])
def test_other_start_methods(start_method: str) -> None:
    def make() -> mploader.DataLoader:
        return shuffled(multiprocessing_context=start_method)

    assert resumed(make, Split(0, 4), EPOCHS) == uninterrupted(make, EPOCHS)


def test_in_a_new_process(tmp_path: Path) -> None:
    """The state goes through ``torch.save`` and ``torch.load(weights_only=True)`` into a loader
    built in a new interpreter (spawn workers there)."""
    expected = uninterrupted(lambda: shuffled(multiprocessing_context="spawn"), EPOCHS)
    split = Split(0, 4)
    seen = first_half(lambda: shuffled(multiprocessing_context="spawn"), split)
    torch.save(split.state, tmp_path / "state.pt")
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, "-m", "tests.resume.child", "shuffled_spawn", str(tmp_path / "state.pt"),
         str(tmp_path / "rest.json"), "0", str(EPOCHS)],
        cwd=root, capture_output=True, text=True, timeout=80,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rest = json.loads((tmp_path / "rest.json").read_text())
    assert joined(seen, rest) == expected


def test_default_generator_draws_from_the_global_one() -> None:
    """``generator=None``: the base seed and the shuffle come from torch's global generator; the
    resumed epoch replays them from the state, and later epochs draw from the caller's."""
    def make() -> mploader.DataLoader:
        return shuffled(generator=None)

    torch.manual_seed(3)
    expected = uninterrupted(make, EPOCHS)
    torch.manual_seed(3)
    assert resumed(make, Split(0, 2), EPOCHS) == expected


@pytest.mark.parametrize("dataset", [Augmented, Stream, StatefulStream])
def test_num_workers_zero(dataset: type) -> None:
    """In the main process the dataset draws from the caller's global generators, which a
    training checkpoint saves and restores itself; the position is mploader's."""
    def make() -> mploader.DataLoader:
        if dataset is Augmented:
            return shuffled(num_workers=0, multiprocessing_context=None)
        return streamed(dataset=dataset(), num_workers=0, multiprocessing_context=None)

    seed_everything(5)
    expected = uninterrupted(make, EPOCHS)
    seed_everything(5)
    split = Split(0, 3)
    seen = first_half(make, split)
    saved = (torch.get_rng_state(), np.random.get_state(), random.getstate())
    seed_everything(99)  # a new process would start elsewhere
    loader = make()
    torch.set_rng_state(saved[0])
    np.random.set_state(saved[1])
    random.setstate(saved[2])
    assert joined(seen, second_half(loader, split.state, split, EPOCHS)) == expected


@pytest.mark.parametrize("dataset", [Stream, StatefulStream])
def test_iterable_dataset(dataset: type, tmp_path: Path) -> None:
    """Each worker's copy resumes where it was: by its own state_dict (drawing only the items
    still to come) or else by a fast-forward of its iterator (drawing the delivered ones again,
    in the worker, without sending them)."""
    def make(log: str | None = None) -> mploader.DataLoader:
        return streamed(dataset=dataset(log_dir=log))

    expected = uninterrupted(make, 1)
    split = Split(0, 3)
    seen = first_half(make, split)
    (tmp_path / "second").mkdir()
    rest = second_half(make(str(tmp_path / "second")), split.state, split, 1)
    assert joined(seen, rest) == expected
    remaining = sorted(indices(rest[0]))
    if dataset is StatefulStream:
        assert fetched(str(tmp_path / "second")) == remaining
    else:
        assert fetched(str(tmp_path / "second")) == list(range(LENGTH))


@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes")
@pytest.mark.parametrize("batches", [4, 8])
def test_iterable_shards_that_end_at_different_times(batches: int) -> None:
    """19 items over 3 workers in batches of 2: shards of 7, 6, 6 end with partial batches and
    at different tasks; the resumed run skips the ended workers as the uninterrupted one does."""
    def make() -> mploader.DataLoader:
        return streamed(dataset=StatefulStream(19), num_workers=3)

    assert resumed(make, Split(0, batches), EPOCHS) == uninterrupted(make, EPOCHS)


@pytest.mark.parametrize("split", [Split(1, 3), Split(0, None)],
                         ids=["epoch-1-middle", "after-epoch-0"])
def test_persistent_workers(split: Split) -> None:
    """Persistent workers keep their generators over epochs and draw no new base seed; a
    resumed loader starts new workers that go on exactly where the old ones were."""
    def make() -> mploader.DataLoader:
        return shuffled(persistent_workers=True)

    assert resumed(make, split, 3) == uninterrupted(make, 3)


def test_persistent_workers_item_generator_draws_in_a_later_epoch() -> None:
    """``item_generator()`` is seeded with the iterator's epoch number: a resumed persistent
    loader goes on counting where the old iterator was, so its draws in epoch 1 are exact."""
    def make() -> mploader.DataLoader:
        return shuffled(persistent_workers=True, dataset=PerItem())

    assert resumed(make, Split(1, 3), 3) == uninterrupted(make, 3)


def test_persistent_iterable_workers_over_two_epochs() -> None:
    def make() -> mploader.DataLoader:
        return streamed(dataset=StatefulStream(), persistent_workers=True)

    assert resumed(make, Split(1, 2), EPOCHS) == uninterrupted(make, EPOCHS)


def test_out_of_order_delivery_gives_each_remaining_sample_once() -> None:
    """``in_order=False``: batches come as they arrive, so the state lists which ones beyond the
    first undelivered one were delivered; together the two halves see every sample once."""
    def make() -> mploader.DataLoader:
        return shuffled(in_order=False, dataset=Augmented(40))

    result = resumed(make, Split(0, 5), EPOCHS)
    for epoch in result:
        assert sorted(indices(epoch)) == list(range(40))


def test_worker_killed_with_restarts_between_the_halves(tmp_path: Path) -> None:
    """The resumed run loses a worker to SIGKILL; its replacement starts from the dead worker's
    generators as of its last result and re-runs its tasks: the rest is still exact."""
    expected = uninterrupted(lambda: shuffled(max_worker_restarts=1), EPOCHS)
    victim = indices(expected[0])[12]
    marker = str(tmp_path / "killed")

    def make_second() -> mploader.DataLoader:
        return shuffled(max_worker_restarts=1, dataset=Augmented(kill_at=victim, marker=marker))

    split = Split(0, 3)
    seen = first_half(lambda: shuffled(max_worker_restarts=1), split)
    rest = second_half(make_second(), split.state, split, EPOCHS)
    assert os.path.exists(marker)
    assert joined(seen, rest) == expected


SAMPLERS = {
    "sequential": lambda: dict(sampler=SequentialSampler(range(LENGTH))),
    "distributed": lambda: dict(sampler=DistributedSampler(range(LENGTH), num_replicas=2, rank=1,
                                                           shuffle=True, seed=3)),
    "stateless-custom": lambda: dict(sampler=FixedOrder()),
    "stateful-custom": lambda: dict(sampler=ResumableOrder()),
    "batch-sampler": lambda: dict(batch_sampler=BatchSampler(
        RandomSampler(range(LENGTH), generator=torch.Generator().manual_seed(4)), 4, False),
        batch_size=1),
}


@pytest.mark.parametrize("name", list(SAMPLERS))
def test_samplers(name: str) -> None:
    def make() -> mploader.DataLoader:
        arguments = SAMPLERS[name]()
        return shuffled(shuffle=None, **arguments)

    split = Split(0, 2)
    assert resumed(make, split, EPOCHS) == uninterrupted(make, EPOCHS)


def test_a_stateful_sampler_resumes_from_its_state_not_by_drawing() -> None:
    first = shuffled(shuffle=None, sampler=ResumableOrder(), num_workers=0,
                     multiprocessing_context=None)
    iterator = iter(first)
    [next(iterator) for _ in range(2)]
    state = first.state_dict()
    sampler = ResumableOrder()
    second = shuffled(shuffle=None, sampler=sampler, num_workers=0, multiprocessing_context=None)
    second.load_state_dict(state)
    rest = [plain(batch) for batch in second]
    assert sampler.starts == [2 * BATCH]  # loaded, never re-drawn from the start
    assert len(indices(rest)) == LENGTH - 2 * BATCH


def test_map_style_resume_fetches_only_the_remaining_items(tmp_path: Path) -> None:
    def make(log: str | None = None) -> mploader.DataLoader:
        return shuffled(dataset=Augmented(log_dir=log))

    split = Split(0, 3)
    first_half(make, split)
    rest = second_half(make(str(tmp_path)), split.state, split, 1)
    assert fetched(str(tmp_path)) == sorted(indices(rest[0]))
    assert len(indices(rest[0])) == LENGTH - 3 * BATCH


def test_pin_memory_changes_nothing() -> None:
    def make() -> mploader.DataLoader:
        return shuffled(pin_memory=True)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no accelerator here: torch's warning
        assert resumed(make, Split(0, 3), EPOCHS) == uninterrupted(make, EPOCHS)


def test_state_is_plain_and_round_trips_through_torch_save(tmp_path: Path) -> None:
    split = Split(0, 3)
    first_half(lambda: streamed(dataset=StatefulStream()), split)
    state = split.state
    own = state["_mploader"]
    assert own["version"] == 3 and own["format"] == "mploader.DataLoader"
    assert_plain(state)
    assert json.loads(json.dumps(state)) == state  # no tensors: no shuffle here
    torch.save(state, tmp_path / "state.pt")
    loaded = torch.load(tmp_path / "state.pt", weights_only=True)
    loader = streamed(dataset=StatefulStream())
    loader.load_state_dict(loaded)
    assert len(list(loader)) == 10 - 3
    close(loader)


def assert_plain(value: object) -> None:
    if isinstance(value, dict):
        for item in value.values():
            assert_plain(item)
    elif isinstance(value, list | tuple):
        for item in value:
            assert_plain(item)
    else:
        assert value is None or isinstance(value, bool | int | float | str | torch.Tensor), value


def seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)
