"""The bad-input table of the public API (issue 29): each row a bad argument or call, the error
type and message it must give, and what must hold afterwards.

In the spirit of the fault table (``tests/lifecycle/test_faults.py``), one parametrized test per
area:

* ``DataLoader`` arguments: mploader's keyword additions, each refused when the loader is built
  with mploader's own message; and a few of torch's, whose error must be exactly torch's (type and
  message; ``tests/parity`` covers many more).
* ``load_state_dict``: a state truncated, edited, from a loader built with other arguments, of
  another format, or no dict at all.  A refused state must leave nothing half-loaded: the same
  loader then gives exactly a fresh loader's epoch (the reference state is taken in the second
  epoch, whose generators differ from a fresh loader's, so a half-loaded one would show).
* NebulaGraph hooks pointed at a port where nothing listens: an error naming the address and the
  way out, within a bounded time.

Every row also runs under the lifecycle folder's ``no_leftovers`` check: no worker process, no
``/dev/shm`` entry and no fd of the test's is left.  The PyG stores' and sampler's rows are in
``tests/integrations/test_pyg_bad_input.py``.
"""

from __future__ import annotations

import copy
import gc
import re
import socket
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch
import torch.utils.data
from torch.utils.data import BatchSampler, Dataset, IterableDataset, SequentialSampler

import mploader
from mploader.integrations.nebula import NebulaHooks
from mploader.integrations.nebula.budget import HostSessionBudget
from mploader.integrations.nebula.errors import NebulaConnectionError
from tests.leaks import let_loaders_go
from tests.lifecycle.conftest import no_leftovers  # noqa: F401  (autouse: nothing left behind)
from tests.resume.scenarios import same_state

pytestmark = pytest.mark.timeout(60)

LENGTH, BATCH_SIZE = 12, 2


@pytest.fixture(scope="module", autouse=True)
def frozen_heap() -> Iterator[None]:
    """``no_leftovers`` collects garbage around every row; with the heap torch and the imports
    made frozen first, a collection scans only what the row made (0.1 s less a row)."""
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()


class Items(Dataset[torch.Tensor]):
    """``LENGTH`` items, item ``i`` is ``tensor([i])``."""

    def __init__(self, length: int = LENGTH) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor([index])


class Stream(IterableDataset[torch.Tensor]):
    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter(torch.tensor([index]) for index in range(LENGTH))


class NotHooks:
    """Has the hook methods' names, but is no ``mploader.WorkerHooks``."""

    def setup(self, info: Any) -> None:
        pass


# -- DataLoader arguments --------------------------------------------------------------------------


@dataclass(frozen=True)
class ArgumentRow:
    """``mploader.DataLoader(dataset, **kwargs)`` must raise ``error`` matching ``message``."""

    id: str
    kwargs: dict[str, Any]
    error: type[BaseException]
    message: str
    iterable: bool = False  # the dataset is an IterableDataset


ARGUMENT_ROWS = [
    ArgumentRow("worker_hooks-not-hooks", {"worker_hooks": NotHooks()}, TypeError,
                r"worker_hooks option should be a mploader\.WorkerHooks instance, but got "
                r"worker_hooks=<.*NotHooks object"),
    ArgumentRow("worker_hooks-a-class", {"worker_hooks": mploader.WorkerHooks}, TypeError,
                r"should be a mploader\.WorkerHooks instance, but got worker_hooks=<class "),
    ArgumentRow("shared_memory-a-string", {"shared_memory": "yes"}, TypeError,
                r"shared_memory must be True, False or a mploader\.SharedMemoryConfig, "
                r"got str: 'yes'"),
    ArgumentRow("shared_memory-an-int", {"shared_memory": 1}, TypeError,
                r"shared_memory must be True, False or a mploader\.SharedMemoryConfig, got int: 1"),
    ArgumentRow("shared_memory-a-dict", {"shared_memory": {"budget_bytes": 1 << 20}}, TypeError,
                r"got dict: \{'budget_bytes': 1048576\}"),
    ArgumentRow("max_worker_restarts-negative", {"max_worker_restarts": -1}, ValueError,
                r"max_worker_restarts option should be a non-negative integer, but got "
                r"max_worker_restarts=-1"),
    ArgumentRow("max_worker_restarts-bool", {"max_worker_restarts": True}, ValueError,
                r"max_worker_restarts option should be a non-negative integer, but got "
                r"max_worker_restarts=True"),
    ArgumentRow("max_worker_restarts-float", {"max_worker_restarts": 1.5}, ValueError,
                r"but got max_worker_restarts=1\.5"),
    ArgumentRow("max_worker_restarts-iterable", {"max_worker_restarts": 2}, ValueError,
                r"max_worker_restarts needs a map-style dataset.*use max_worker_restarts=0 "
                r"with an IterableDataset", iterable=True),
    ArgumentRow("snapshot_every_n_steps-negative", {"snapshot_every_n_steps": -1}, ValueError,
                r"snapshot_every_n_steps option should be a non-negative integer or None, but "
                r"got snapshot_every_n_steps=-1"),
    ArgumentRow("snapshot_every_n_steps-a-string", {"snapshot_every_n_steps": "10"}, ValueError,
                r"but got snapshot_every_n_steps='10'"),
    ArgumentRow("snapshot_every_n_steps-bool", {"snapshot_every_n_steps": True}, ValueError,
                r"but got snapshot_every_n_steps=True"),
    ArgumentRow("worker_threads-zero", {"worker_threads": 0}, ValueError,
                r"worker_threads option should be a positive integer .*but got worker_threads=0"),
    ArgumentRow("worker_threads-bool", {"worker_threads": True}, ValueError,
                r"but got worker_threads=True"),
    ArgumentRow("worker_threads-iterable", {"worker_threads": 4}, ValueError,
                r"worker_threads=4 needs a map-style dataset.*use worker_threads=1 with an "
                r"IterableDataset", iterable=True),
    ArgumentRow("trace-missing-folder", {"trace": "/nonexistent-mploader-folder/run.json"},
                FileNotFoundError,
                r"trace='/nonexistent-mploader-folder/run\.json': the folder "
                r"'/nonexistent-mploader-folder' does not exist; create it"),
]


@pytest.mark.parametrize("row", ARGUMENT_ROWS, ids=lambda row: row.id)
def test_a_bad_mploader_argument_is_refused_when_the_loader_is_built(row: ArgumentRow) -> None:
    dataset = Stream() if row.iterable else Items()
    with pytest.raises(row.error, match=row.message):
        mploader.DataLoader(dataset, num_workers=1, multiprocessing_context="fork", **row.kwargs)


A_BATCH_SAMPLER = BatchSampler(SequentialSampler(range(LENGTH)), batch_size=2, drop_last=False)

# torch's own arguments: the same objects go to both, so messages showing a repr compare as is.
TORCH_ARGUMENT_ROWS: dict[str, dict[str, Any]] = {
    "num_workers-negative": dict(num_workers=-1),
    "timeout-negative": dict(timeout=-1),
    "prefetch_factor-without-workers": dict(prefetch_factor=2),
    "persistent_workers-without-workers": dict(persistent_workers=True),
    "batch_sampler-and-batch_size": dict(batch_sampler=A_BATCH_SAMPLER, batch_size=3),
    "context-unknown": dict(num_workers=1, multiprocessing_context="fork-ish"),
    "batch_size-zero": dict(batch_size=0),
}


def _error_of(build: Callable[[], Any]) -> BaseException:
    with pytest.raises(BaseException) as caught:
        build()
    return caught.value


@pytest.mark.parametrize("kwargs", TORCH_ARGUMENT_ROWS.values(), ids=TORCH_ARGUMENT_ROWS.keys())
def test_a_bad_torch_argument_gives_torchs_own_error(kwargs: dict[str, Any]) -> None:
    expected = _error_of(lambda: torch.utils.data.DataLoader(Items(), **kwargs))
    got = _error_of(lambda: mploader.DataLoader(Items(), **kwargs))
    assert (type(got), str(got)) == (type(expected), str(expected))


# -- load_state_dict -------------------------------------------------------------------------------


def loader(**overrides: Any) -> mploader.DataLoader[Any]:
    """The loader of every resume row: shuffled by its own seeded generator, one forked worker."""
    kwargs: dict[str, Any] = dict(
        dataset=Items(), batch_size=BATCH_SIZE, shuffle=True, num_workers=1,
        multiprocessing_context="fork", generator=torch.Generator().manual_seed(29),
    )
    kwargs.update(overrides)
    return mploader.DataLoader(**kwargs)


def epoch(source: mploader.DataLoader[Any]) -> list[list[int]]:
    return [batch.flatten().tolist() for batch in source]


@pytest.fixture(scope="module")
def fresh_epoch() -> list[list[int]]:
    """What a fresh loader's first epoch gives."""
    return epoch(loader())


@pytest.fixture(scope="module")
def saved_state() -> dict[str, Any]:
    """A state taken in the middle of the second epoch: its generators are not a fresh
    loader's."""
    source = loader()
    epoch(source)
    iterator = iter(source)
    for _ in range(LENGTH // BATCH_SIZE // 2):
        next(iterator)
    state = source.state_dict()
    del iterator
    return state


def torchdata_state(batch_size: int = BATCH_SIZE, num_workers: int = 0) -> dict[str, Any]:
    """A state torchdata's own loader made after one batch."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    with warnings.catch_warnings():  # torchdata 0.11 on torch 2.13: "'set_vital' is deprecated"
        warnings.simplefilter("ignore", UserWarning)
        source = StatefulDataLoader(Items(), batch_size=batch_size, num_workers=num_workers,
                                    multiprocessing_context="fork" if num_workers else None)
        iterator = iter(source)
    next(iterator)
    state = source.state_dict()
    del iterator, source
    return state


def without(*path: str | int) -> Callable[[dict[str, Any]], Any]:
    """The state without the key at ``path``."""

    def edit(state: dict[str, Any]) -> Any:
        inner = state
        for key in path[:-1]:
            inner = inner[key]
        del inner[path[-1]]
        return state

    return edit


def setting(value: Any, *path: str | int) -> Callable[[dict[str, Any]], Any]:
    """The state with ``value`` at ``path``."""

    def edit(state: dict[str, Any]) -> Any:
        inner: Any = state
        for key in path[:-1]:
            inner = inner[key]
        inner[path[-1]] = value
        return state

    return edit


@dataclass(frozen=True)
class StateRow:
    """``loader(**loader_kwargs).load_state_dict(make(saved_state))`` must raise ``error``
    matching ``message``; the loader then gives a fresh loader's epoch."""

    id: str
    make: Callable[[dict[str, Any]], Any]
    error: type[BaseException]
    message: str
    loader_kwargs: dict[str, Any] = field(default_factory=dict)


TRUNCATED = r"; the state was truncated, or made by another version$"
EDITED = r"; the state was edited, or made by another version$"
OTHER_ARGUMENTS = (r"^load_state_dict: this state was made by a DataLoader built with other "
                   r"arguments ")
NOT_A_DICT = (r"^load_state_dict: a state is a dict made by "
              r"mploader\.DataLoader\.state_dict\(\) or torchdata's "
              r"StatefulDataLoader\.state_dict\(\), got ")
NO_LOADER_S = (r"^load_state_dict: not a state made by mploader\.DataLoader\.state_dict\(\) or "
               r"torchdata's StatefulDataLoader\.state_dict\(\): it has neither '_snapshot' \(a "
               r"loader with workers\) nor '_num_yielded' \(num_workers=0\)$")
OWN, SNAP, MAIN, WORKERS = "_mploader", "_snapshot", "_main_snapshot", "_worker_snapshots"
OWN_AT = r"^load_state_dict: state\['_mploader'\]"
MAIN_AT = r"^load_state_dict: state\['_snapshot'\]\['_main_snapshot'\]"

STATE_ROWS = [
    # truncated
    StateRow("truncated-no-format", without(OWN, "format"), ValueError,
             OWN_AT + r" has no 'format'" + TRUNCATED),
    StateRow("truncated-no-version", without(OWN, "version"), ValueError,
             OWN_AT + r" has no 'version'" + TRUNCATED),
    StateRow("truncated-no-arguments", without(OWN, "arguments"), ValueError,
             OWN_AT + r" has no 'arguments'" + TRUNCATED),
    StateRow("truncated-no-snapshot", without(SNAP), ValueError, NO_LOADER_S),
    StateRow("truncated-no-sampler_iter_yielded", without(SNAP, MAIN, "_sampler_iter_yielded"),
             ValueError, MAIN_AT + r" has no '_sampler_iter_yielded'" + TRUNCATED),
    StateRow("truncated-no-worker-entry", without(SNAP, WORKERS, "worker_0"), ValueError,
             r"^load_state_dict: state\['_snapshot'\]\['_worker_snapshots'\] has \[\], "
             r"expected \['worker_0'\]; the state was edited$"),
    StateRow("truncated-no-generators", without(OWN, "generators"), ValueError,
             OWN_AT + r" has no 'generators'" + TRUNCATED),
    StateRow("truncated-no-worker-rng", without(OWN, "workers", 0, "rng"), ValueError,
             OWN_AT + r"\['workers'\]\[0\] has no 'rng'" + TRUNCATED),
    StateRow("truncated-no-python-rng", without(OWN, "global_rng", "python", "words"),
             ValueError, OWN_AT + r"\['global_rng'\]\['python'\] has no 'words'" + TRUNCATED),
    # edited
    StateRow("edited-sampler_iter_yielded-a-word",
             setting("three", SNAP, MAIN, "_sampler_iter_yielded"), ValueError,
             MAIN_AT + r"\['_sampler_iter_yielded'\] is 'three' \(str\), expected an int"
             + EDITED),
    StateRow("edited-sampler_iter_yielded-a-bool",
             setting(True, SNAP, MAIN, "_sampler_iter_yielded"), ValueError,
             MAIN_AT + r"\['_sampler_iter_yielded'\] is True \(bool\), expected an int" + EDITED),
    StateRow("edited-num_workers", setting(2, SNAP, MAIN, "_num_workers"), ValueError,
             r"^load_state_dict: this state was made by a loader with num_workers=2, this one "
             r"has num_workers=1"),
    StateRow("edited-delivered_after-a-string", setting(["4"], OWN, "delivered_after"),
             ValueError, r"\['delivered_after'\]\[0\] is '4' \(str\), expected an int" + EDITED),
    StateRow("edited-generators-an-int", setting([42], OWN, "generators"), ValueError,
             OWN_AT + r"\['generators'\]\[0\] is 42 \(int\), expected a base64 string"
             + EDITED),
    StateRow("edited-generators-not-base64", setting(["not base64!"], OWN, "generators"),
             ValueError, r"\['generators'\]\[0\] is 'not base64!' \(str\), expected a base64 "
                         r"string" + EDITED),
    StateRow("edited-generators-too-short", setting(["AAAA"], OWN, "generators"),
             ValueError, r"^load_state_dict: a generator state of the state's is 3 bytes, this "
                         r"loader's generator's 5056; the state was edited$"),
    StateRow("edited-generators-one-more", lambda state: setting(
        state[OWN]["generators"] * 2, OWN, "generators")(state), ValueError,
             r"^load_state_dict: the state's sampler drew from 2 torch\.Generator\(s\), this "
             r"loader's from 1"),
    StateRow("edited-global_rng-a-string", setting("x", OWN, "global_rng"), ValueError,
             OWN_AT + r"\['global_rng'\] is 'x' \(str\), expected a dict" + EDITED),
    StateRow("edited-worker-rng-a-list", setting([1, 2], OWN, "workers", 0, "rng"),
             ValueError, OWN_AT + r"\['workers'\]\[0\]\['rng'\] is \[1, 2\] \(list\), "
                         r"expected a dict" + EDITED),
    StateRow("edited-workers-not-a-list", setting(None, OWN, "workers"), ValueError,
             OWN_AT + r"\['workers'\] is None \(NoneType\), expected a list" + EDITED),
    StateRow("edited-workers-one-more", lambda state: setting(
        state[OWN]["workers"] * 2, OWN, "workers")(state), ValueError,
             r"^load_state_dict: the state has 2 worker entries for 1 workers; the state was "
             r"edited$"),
    StateRow("edited-phase-unknown", setting("mid_epoch", OWN, "phase"), ValueError,
             OWN_AT + r"\['phase'\] is 'mid_epoch', expected one of 'in_epoch', "
                      r"'between_epochs'; the state was edited$"),
    StateRow("edited-arguments-batch_size", setting(3, OWN, "arguments", "batch_size"),
             ValueError,
             OTHER_ARGUMENTS + r"\(batch_size: the state's loader had 3, this one has 2\)"),
    # from a loader built with other arguments
    StateRow("other-batch_size", lambda state: state, ValueError,
             OTHER_ARGUMENTS + r"\(batch_size: the state's loader had 2, this one has 3; "
                               r"sampler_length: the state's loader had 6, this one has 4\)",
             {"batch_size": 3}),
    StateRow("other-num_workers", lambda state: state, ValueError,
             r"^load_state_dict: this state was made by a loader with num_workers=1, this one "
             r"has num_workers=2; build the loader with the num_workers of the one that made "
             r"the state$", {"num_workers": 2}),
    StateRow("other-dataset-length", lambda state: state, ValueError,
             OTHER_ARGUMENTS + r"\(dataset_length: the state's loader had 12, this one has 13; "
                               r"sampler_length: the state's loader had 6, this one has 7\)",
             {"dataset": Items(LENGTH + 1)}),
    # torchdata's loader, built with other arguments
    StateRow("torchdata-other-num_workers", lambda state: torchdata_state(), ValueError,
             r"^load_state_dict: this state was made by a loader with num_workers=0, this one "
             r"has num_workers=1"),
    StateRow("torchdata-other-batch_size",
             lambda state: torchdata_state(batch_size=BATCH_SIZE + 1, num_workers=1), ValueError,
             r"^load_state_dict: the state's batch sampler drew 3 indices in 1 batches, which "
             r"this loader's batch_size=2 cannot; build the loader with the batch_size of the "
             r"one that made the state$"),
    # another format, or no dict
    StateRow("format-earlier-mploader",
             lambda state: {"format": "mploader.DataLoader", "version": 2, "position": {}},
             ValueError, r"^load_state_dict: this state was made by an earlier mploader \(its "
                         r"layout, version 2, is not torchdata's\)"),
    StateRow("format-version-999", lambda state: {"version": 999}, ValueError, NO_LOADER_S),
    StateRow("format-right-version-999", setting(999, OWN, "version"), ValueError,
             OWN_AT + r" is of format 'mploader\.DataLoader', version 999; this mploader reads "
                      r"'mploader\.DataLoader' version 3\. Load it with the mploader version that "
                      r"made it$"),
    StateRow("not-a-dict-a-list", lambda state: list(state.items()), TypeError,
             NOT_A_DICT + "list$"),
    StateRow("not-a-dict-none", lambda state: None, TypeError, NOT_A_DICT + "NoneType$"),
    StateRow("not-a-dict-a-tensor", lambda state: torch.arange(3), TypeError,
             NOT_A_DICT + "Tensor$"),
    StateRow("not-a-dict-an-array", lambda state: np.arange(3), TypeError,
             NOT_A_DICT + "ndarray$"),
    StateRow("not-a-dict-a-string", lambda state: "a checkpoint path", TypeError,
             NOT_A_DICT + "str$"),
]


@pytest.mark.parametrize("row", STATE_ROWS, ids=lambda row: row.id)
def test_a_bad_state_is_refused_and_nothing_is_half_loaded(
    row: StateRow, saved_state: dict[str, Any], fresh_epoch: list[list[int]]
) -> None:
    bad = row.make(copy.deepcopy(saved_state))
    target = loader(**row.loader_kwargs)
    before = target.state_dict()
    with pytest.raises(row.error, match=row.message):
        target.load_state_dict(bad)
    after = target.state_dict()
    for state in (before, after):  # the main process's generators are read now: not compared
        del state[OWN]["global_rng"]
    assert same_state(after, before), "the refused state was partly loaded"
    expected = epoch(loader(**row.loader_kwargs)) if row.loader_kwargs else fresh_epoch
    assert epoch(target) == expected


def test_the_reference_state_itself_loads_and_resumes(saved_state: dict[str, Any],
                                                       fresh_epoch: list[list[int]]) -> None:
    """The rows edit a state that is good: loaded as it is, it resumes the second epoch."""
    source = loader()
    epoch(source)
    expected = epoch(source)[LENGTH // BATCH_SIZE // 2:]
    target = loader()
    target.load_state_dict(copy.deepcopy(saved_state))
    assert epoch(target) == expected != fresh_epoch[LENGTH // BATCH_SIZE // 2:]


# -- NebulaGraph hooks with no graphd ------------------------------------------------------------


def closed_port() -> int:
    """A port on 127.0.0.1 where nothing listens (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Fetched(Dataset[torch.Tensor]):
    """Items that need the worker's NebulaGraph session."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> torch.Tensor:
        mploader.worker_session().execute("YIELD 1")
        return torch.tensor([index])


RETRY_SECONDS = 0.3
# How long the budget is watched once the call ended: longer than a worker's retries.
QUIET_SECONDS = 0.5


def iterate_with_hooks(num_workers: int) -> Callable[[NebulaHooks], None]:
    def run(hooks: NebulaHooks) -> None:
        epoch(mploader.DataLoader(Fetched(), num_workers=num_workers,
                                  multiprocessing_context="fork" if num_workers else None,
                                  worker_hooks=hooks))

    return run


def open_session(hooks: NebulaHooks) -> None:
    hooks.open_session()


def run_statement(hooks: NebulaHooks) -> None:
    handle = hooks.create_session(None)  # type: ignore[arg-type]
    handle.close()


NEBULA_ROWS: dict[str, Callable[[NebulaHooks], None]] = {
    "loader-one-worker": iterate_with_hooks(1),
    "loader-in-the-main-process": iterate_with_hooks(0),
    "open_session": open_session,
    "create_session": run_statement,
}


@pytest.mark.parametrize("call", NEBULA_ROWS.values(), ids=NEBULA_ROWS.keys())
def test_hooks_with_no_graphd_name_the_address_and_the_way_out(
    call: Callable[[NebulaHooks], None]
) -> None:
    address = f"127.0.0.1:{closed_port()}"
    hooks = NebulaHooks([address], space="nowhere", retry_seconds=RETRY_SECONDS)
    started = time.monotonic()
    with pytest.raises(NebulaConnectionError) as caught:
        call(hooks)
    elapsed = time.monotonic() - started
    message = str(caught.value)
    for pattern in (rf"cannot reach NebulaGraph graphd at {re.escape(address)}",
                    r"Check that graphd is running and that the address is right "
                    r"\(NebulaHooks\(addresses=\.\.\.\)\)"):
        assert re.search(pattern, message), f"{pattern!r} not in {message!r}"
    assert elapsed < RETRY_SECONDS + 5, f"took {elapsed:.1f} s"
    del caught
    # The loader's iterator lives on after a dataset's error (as torch's does) and its worker
    # goes on with the next items, logging in again: judged once it is gone.
    assert let_loaders_go()
    budget = HostSessionBudget(hooks.user, hooks.addresses, hooks.session_budget)
    # Nothing held or recorded, and nothing taken later.
    quiet_until = time.monotonic() + QUIET_SECONDS
    while time.monotonic() < quiet_until:
        left = [view for view in budget.all_records() if view.held or view.records]
        assert not left, f"session budget slots left held or with records: {left}"
