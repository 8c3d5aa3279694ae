"""What ``load_state_dict`` refuses, and what ``state_dict`` says when it cannot give a state."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch.utils.data import SequentialSampler

import mploader

from .scenarios import (
    LENGTH,
    Augmented,
    NumpyState,
    Split,
    close,
    first_half,
    same_state,
    shuffled,
    streamed,
)


@pytest.fixture(scope="module")
def state() -> dict[str, Any]:
    split = Split(0, 2)
    first_half(shuffled, split)
    return split.state


def test_another_version_is_refused(state: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"state\['_mploader'\] is of format "
                                         r"'mploader\.DataLoader', version 99; this mploader reads "
                                         r"'mploader\.DataLoader' version 3"):
        shuffled().load_state_dict({**state, "_mploader": {**state["_mploader"], "version": 99}})


def test_a_state_of_an_earlier_mploader_is_refused_by_name() -> None:
    earlier = {"format": "mploader.DataLoader", "version": 2, "arguments": {}, "position": {}}
    with pytest.raises(ValueError, match=r"this state was made by an earlier mploader \(its "
                                         r"layout, version 2, is not torchdata's\)"):
        shuffled().load_state_dict(earlier)


def test_a_state_of_no_loader_is_refused() -> None:
    with pytest.raises(ValueError, match=r"not a state made by mploader\.DataLoader\.state_dict"
                                         r"\(\) or torchdata's StatefulDataLoader\.state_dict\(\)"):
        shuffled().load_state_dict({"epoch": 3, "model": {}})


@pytest.mark.parametrize(("overrides", "named"), [
    (dict(batch_size=4), r"batch_size: the state's loader had 3, this one has 4"),
    (dict(num_workers=1), r"this state was made by a loader with num_workers=2, this one has "
                          r"num_workers=1"),
    (dict(dataset=Augmented(LENGTH + 1)), r"dataset_length: the state's loader had 20, this one "
                                          r"has 21"),
    (dict(shuffle=False, sampler=SequentialSampler(range(LENGTH))),
     r"sampler: the state's loader had 'torch\.utils\.data\.sampler\.RandomSampler', this one has "
     r"'torch\.utils\.data\.sampler\.SequentialSampler'"),
    (dict(in_order=False), r"in_order: the state's loader had True, this one has False"),
    (dict(drop_last=True), r"drop_last: the state's loader had False, this one has True"),
])
def test_other_arguments_are_refused_by_name(state: dict[str, Any], overrides: dict[str, Any],
                                             named: str) -> None:
    if "sampler" in overrides:
        overrides = {**overrides, "shuffle": None}
    loader = shuffled(**overrides)
    with pytest.raises(ValueError, match=named):
        loader.load_state_dict(state)


def test_a_dataset_state_that_is_not_plain_is_named() -> None:
    loader = streamed(dataset=NumpyState())
    iterator = iter(loader)
    next(iterator)
    with pytest.raises(TypeError, match=r"state\['_snapshot'\]\['_worker_snapshots'\]"
                                        r"\['worker_0'\]\['dataset_state'\]\['position'\] is a "
                                        r"numpy\.int64"):
        loader.state_dict()
    del iterator
    close(loader)


def test_tracking_off_has_no_state() -> None:
    loader = shuffled(snapshot_every_n_steps=None)
    with pytest.raises(RuntimeError, match=r"snapshot_every_n_steps=None turned off"):
        loader.state_dict()
    with pytest.raises(ValueError, match=r"snapshot_every_n_steps option should be"):
        shuffled(snapshot_every_n_steps=-1)


def test_a_state_before_any_iteration_gives_the_first_epoch_and_an_empty_one_loads_nothing(
) -> None:
    """A state taken before the first ``iter()`` holds the generators the first epoch draws
    from: a loader that loads it gives that epoch, whatever its own generators say."""
    expected = [[batch.tolist() for batch in shuffled()]]
    fresh = shuffled().state_dict()
    assert fresh["_mploader"]["phase"] == "between_epochs" and fresh["_mploader"]["epoch"] == 0
    assert fresh["_iterator_finished"] is False and fresh["_snapshot"]["_snapshot_step"] == 0
    loader = shuffled(generator=torch.Generator().manual_seed(1234))
    loader.load_state_dict(fresh)
    loader.load_state_dict({})  # nothing: the loaded state stays
    assert loader.state_dict() == fresh
    assert [[batch.tolist() for batch in loader]] == expected


def test_the_state_after_loading_is_the_loaded_one(state: dict[str, Any]) -> None:
    loader = shuffled()
    loader.load_state_dict(state)
    again = loader.state_dict()
    assert same_state(again, state)
    assert again["_snapshot"]["_main_snapshot"]["_sampler_iter_yielded"] == 2


def test_the_torch_loader_api_is_unchanged() -> None:
    assert isinstance(shuffled(), mploader.DataLoader)


def test_a_sampler_state_for_a_sampler_without_one_is_refused_where_it_is_given(
        state: dict[str, Any]) -> None:
    """A state whose index sampler had its own state (a batch sampler with ``state_dict``),
    given to a loader whose batch sampler has none: refused by ``load_state_dict``, naming it,
    not at the next ``iter()``."""
    edited = copy.deepcopy(state)
    edited["_snapshot"]["_main_snapshot"]["_index_sampler_state"] = {"position": 2}
    with pytest.raises(ValueError, match=r"the state holds the sampler's own state, but this "
                                         r"loader's BatchSampler has no load_state_dict\(\)"):
        shuffled().load_state_dict(edited)
