"""The layout of ``DataLoader.state_dict()``: torchdata's, with mploader's own keys beside it.

A state has the keys torchdata 0.11's ``StatefulDataLoader`` writes, with their meaning, so a
checkpoint moves between the two loaders in both directions and tools that read torchdata's keys
read mploader's.  What mploader knows beyond them is under one key of its own, ``_mploader``,
which torchdata ignores.  ``num_workers=0``::

    {"_index_sampler_state", "_sampler_iter_state", "_sampler_iter_yielded", "_num_yielded",
     "_IterableDataset_len_called", "_shared_seed", "fetcher_state", "dataset_state",
     "_iterator_finished", "_mploader"}

with workers::

    {"_snapshot": {"_snapshot_step", "_last_yielded_worker_id",
                   "_main_snapshot": {"_num_workers", "_sampler_iter_state",
                                      "_index_sampler_state", "_sampler_iter_yielded",
                                      "_IterableDataset_len_called", "_shared_seed",
                                      "_base_seed"},
                   "_worker_snapshots": {"worker_<i>": {"worker_id", "fetcher_state",
                                                        "dataset_state"}}},
     "_steps_since_snapshot", "_iterator_finished", "_mploader"}

``fetcher_state`` is ``{"dataset_iter_state", "fetcher_ended"}`` for an iterable dataset and
``None`` for a map-style one.  ``_mploader``::

    {"format": "mploader.DataLoader", "version": 3,
     "arguments": {...},     # what a loader that loads it must have been built with
     "phase": "in_epoch" | "between_epochs", "epoch", "iterator_epoch",
     "generators": [...],    # the torch generators the epoch draws from, as it began (base64)
     "global_rng", "global_rng_at_state",   # the main process's generators then, and now
     "base_seed_drawn",      # whether the epoch's iterator drew its base seed
     "base_seed",            # num_workers=0 only (with workers: _main_snapshot's _base_seed)
     "delivered_after": [...],              # in_order=False: tasks delivered beyond the rest
     "workers": [{"rng", "in_epoch", "items"}]}  # per worker (or the main process)

docs/guide/resume.md has the table of every field.  A state is plain (Python scalars, strings,
lists, dicts) but for tensors: what a dataset's or sampler's own ``state_dict()`` holds, and a
shuffle's generator state, which torchdata's loader needs as a tensor.  A state without
``_mploader`` is torchdata's: it is read with torchdata's meaning (:func:`plan_of`).
"""

from __future__ import annotations

import base64
from typing import Any

import torch
from torch.utils.data import IterableDataset

from mploader.compat.torchdata_keys import (
    BASE_SEED,
    DATASET_ITER_STATE,
    DATASET_STATE,
    FETCHER_ENDED,
    FETCHER_STATE,
    INDEX_SAMPLER_STATE,
    ITERATOR_FINISHED,
    LAST_YIELDED_WORKER_ID,
    LENGTH_SEEN,
    MAIN_SNAPSHOT,
    NUM_WORKERS,
    NUM_YIELDED,
    SAMPLER_ITER_STATE,
    SAMPLER_ITER_YIELDED,
    SAMPLES_YIELDED,
    SHARED_SEED,
    SNAPSHOT,
    SNAPSHOT_STEP,
    STEPS_SINCE_SNAPSHOT,
    WORKER_ID,
    WORKER_SNAPSHOTS,
    worker_key,
)
from mploader.iterator.resume_plan import ResumePlan
from mploader.iterator.resume_shape import (
    ANYTHING,
    Base64,
    ListOf,
    Maybe,
    OneOf,
    check_shape,
)
from mploader.worker.resume import WorkerSnapshot
from mploader.worker.rng import RngState

STATE_FORMAT = "mploader.DataLoader"
STATE_VERSION = 3
OWN = "_mploader"
IN_EPOCH, BETWEEN_EPOCHS = "in_epoch", "between_epochs"

_SCALARS = (bool, int, float, str, type(None))

_RNG = {
    "torch": Base64,
    "python": {"version": int, "words": Base64, "gauss_next": Maybe(float)},
    "numpy": Maybe({"key": Base64, "pos": int, "has_gauss": int, "gauss": float}),
}
_SAMPLER = {INDEX_SAMPLER_STATE: ANYTHING, SAMPLER_ITER_STATE: ANYTHING,
            SAMPLER_ITER_YIELDED: int, LENGTH_SEEN: Maybe(int), SHARED_SEED: Maybe(int)}
_ENTRY = {FETCHER_STATE: Maybe({DATASET_ITER_STATE: ANYTHING, FETCHER_ENDED: bool}),
          DATASET_STATE: ANYTHING}
INLINE_SHAPE = {**_SAMPLER, **_ENTRY, NUM_YIELDED: int, ITERATOR_FINISHED: bool}
WORKERS_SHAPE = {
    SNAPSHOT: {
        SNAPSHOT_STEP: int,
        LAST_YIELDED_WORKER_ID: int,
        MAIN_SNAPSHOT: {**_SAMPLER, NUM_WORKERS: int, BASE_SEED: int},
        WORKER_SNAPSHOTS: dict,
    },
    STEPS_SINCE_SNAPSHOT: int,
    ITERATOR_FINISHED: bool,
}
OWN_SHAPE = {
    "arguments": dict,
    "phase": OneOf((IN_EPOCH, BETWEEN_EPOCHS)),
    "epoch": int,
    "iterator_epoch": int,
    "generators": ListOf(Base64),
    "global_rng": _RNG,
    "global_rng_at_state": Maybe(_RNG),
    "base_seed_drawn": bool,
    "delivered_after": ListOf(int),
    "workers": ListOf({"rng": Maybe(_RNG), "in_epoch": bool, "items": Maybe(int)}),
}


# -- writing -------------------------------------------------------------------------------------


def state_of(plan: ResumePlan, arguments: dict[str, Any], length_seen: int | None,
             shared_seed: int | None, is_iterable: bool) -> dict[str, Any]:
    """The state of position ``plan`` of a loader built with ``arguments``."""
    num_workers = arguments["num_workers"]
    entries = plan.workers if num_workers > 0 else [plan.main]
    own: dict[str, Any] = {
        "format": STATE_FORMAT,
        "version": STATE_VERSION,
        "arguments": dict(arguments),
        "phase": IN_EPOCH if plan.in_epoch else BETWEEN_EPOCHS,
        "epoch": plan.epoch,
        "iterator_epoch": plan.iterator_epoch,
        "generators": list(plan.generators or []),
        "global_rng": _plain_rng(plan.global_rng),
        "global_rng_at_state": _plain_rng(plan.rng_at_state),
        "base_seed_drawn": plan.draws_base_seed,
        "delivered_after": sorted(plan.delivered_after),
        "workers": [{"rng": _plain_rng(snapshot.rng if snapshot else None),
                     "in_epoch": in_epoch,
                     "items": snapshot.items if snapshot is not None else None}
                    for snapshot, in_epoch in entries],
    }
    sampler = {
        INDEX_SAMPLER_STATE: plan.index_sampler_state,
        SAMPLER_ITER_STATE: plan.sampler_iter_state,
        SAMPLER_ITER_YIELDED: plan.batches_yielded if is_iterable else plan.resume_at,
        LENGTH_SEEN: length_seen,
        SHARED_SEED: shared_seed,
    }
    if num_workers == 0:
        own["base_seed"] = plan.base_seed
        snapshot, _ = plan.main
        state = {**sampler, **_entry_of(snapshot, is_iterable), NUM_YIELDED: plan.batches_yielded,
                 ITERATOR_FINISHED: plan.finished}
    else:
        state = {
            SNAPSHOT: {
                SNAPSHOT_STEP: plan.batches_yielded,
                LAST_YIELDED_WORKER_ID: (plan.next_worker - 1) % num_workers,
                MAIN_SNAPSHOT: {**sampler, NUM_WORKERS: num_workers,
                                BASE_SEED: plan.base_seed if plan.base_seed is not None else 0},
                WORKER_SNAPSHOTS: {
                    worker_key(worker_id): {WORKER_ID: worker_id,
                                            **_entry_of(snapshot, is_iterable)}
                    for worker_id, (snapshot, _) in enumerate(plan.workers)
                },
            },
            STEPS_SINCE_SNAPSHOT: plan.replay,
            ITERATOR_FINISHED: plan.finished,
        }
    state[OWN] = own
    check_plain(state)
    return state


def _entry_of(snapshot: WorkerSnapshot | None, is_iterable: bool) -> dict[str, Any]:
    """One worker's (or the main process's) ``fetcher_state`` and ``dataset_state``, as torchdata
    names them: a dataset that is its own iterator has its state as the iterator's."""
    if not is_iterable:
        return {FETCHER_STATE: None,
                DATASET_STATE: snapshot.dataset_state if snapshot is not None else None}
    if snapshot is None:
        return {FETCHER_STATE: {DATASET_ITER_STATE: None, FETCHER_ENDED: False},
                DATASET_STATE: None}
    if snapshot.self_iterator:
        iterator_state, dataset_state = snapshot.dataset_state, None
    else:
        iterator_state, dataset_state = snapshot.iterator_state, snapshot.dataset_state
    return {FETCHER_STATE: {DATASET_ITER_STATE: iterator_state, FETCHER_ENDED: snapshot.ended},
            DATASET_STATE: dataset_state}


def _plain_rng(state: RngState | None) -> dict[str, Any] | None:
    return None if state is None else state.to_plain()


# -- reading -------------------------------------------------------------------------------------


def plan_of(state: Any, arguments: dict[str, Any], is_iterable: bool) -> ResumePlan:
    """The position ``state`` describes, for a loader built with ``arguments``: checked whole
    (a ``ValueError`` naming what is wrong, a ``TypeError`` when it is no dict) before any of it
    is used.  A state of torchdata's has no ``_mploader``; what it does not say is left as the
    loader has it (see :func:`_torchdata_plan`)."""
    if not isinstance(state, dict):
        raise TypeError(
            "load_state_dict: a state is a dict made by mploader.DataLoader.state_dict() or "
            f"torchdata's StatefulDataLoader.state_dict(), got {type(state).__name__}"
        )
    num_workers = arguments["num_workers"]
    own = state.get(OWN)
    if own is None and "format" in state:
        raise ValueError(
            f"load_state_dict: this state was made by an earlier mploader (its layout, version "
            f"{state.get('version')!r}, is not torchdata's); this mploader reads states of "
            f"version {STATE_VERSION} and torchdata's. Load it with the mploader version that "
            "made it, or start the epoch over"
        )
    _check_layout(state, num_workers)
    if own is None:
        return _torchdata_plan(state, num_workers, is_iterable, arguments)
    check_shape(own, {"format": str, "version": ANYTHING}, f"state[{OWN!r}]")
    if own["format"] != STATE_FORMAT or own["version"] != STATE_VERSION:
        raise ValueError(
            f"load_state_dict: state[{OWN!r}] is of format {own['format']!r}, version "
            f"{own['version']!r}; this mploader reads {STATE_FORMAT!r} version {STATE_VERSION}. "
            "Load it with the mploader version that made it"
        )
    check_shape(own, OWN_SHAPE, f"state[{OWN!r}]")
    _check_arguments(own["arguments"], arguments)
    slots = max(1, num_workers)
    if len(own["workers"]) != slots:
        raise ValueError(
            f"load_state_dict: the state has {len(own['workers'])} worker entries for {slots} "
            "workers; the state was edited"
        )
    return _own_plan(state, own, num_workers, is_iterable)


def _check_layout(state: dict[str, Any], num_workers: int) -> None:
    made_with = "workers" if SNAPSHOT in state else "num_workers=0" if NUM_YIELDED in state \
        else None
    if made_with is None:
        raise ValueError(
            "load_state_dict: not a state made by mploader.DataLoader.state_dict() or torchdata's "
            f"StatefulDataLoader.state_dict(): it has neither {SNAPSHOT!r} (a loader with "
            f"workers) nor {NUM_YIELDED!r} (num_workers=0)"
        )
    if (made_with == "workers") != (num_workers > 0):
        raise ValueError(
            f"load_state_dict: this state was made by a loader with {made_with}, this one has "
            f"num_workers={num_workers}; build the loader with the num_workers of the one that "
            "made the state"
        )
    if num_workers == 0:
        check_shape(state, INLINE_SHAPE, "state")
        return
    check_shape(state, WORKERS_SHAPE, "state")
    snapshot = state[SNAPSHOT]
    saved = snapshot[MAIN_SNAPSHOT][NUM_WORKERS]
    if saved != num_workers:
        raise ValueError(
            f"load_state_dict: this state was made by a loader with num_workers={saved}, this "
            f"one has num_workers={num_workers}; build the loader with the num_workers of the "
            "one that made the state"
        )
    workers = snapshot[WORKER_SNAPSHOTS]
    expected = {worker_key(worker_id) for worker_id in range(num_workers)}
    if set(workers) != expected:
        raise ValueError(
            f"load_state_dict: state[{SNAPSHOT!r}][{WORKER_SNAPSHOTS!r}] has "
            f"{sorted(workers)}, expected {sorted(expected)}; the state was edited"
        )
    for key in sorted(expected):
        check_shape(workers[key], {WORKER_ID: int, **_ENTRY},
                    f"state[{SNAPSHOT!r}][{WORKER_SNAPSHOTS!r}][{key!r}]")


def _check_arguments(saved: dict[str, Any], arguments: dict[str, Any]) -> None:
    differences = [
        f"{name}: the state's loader had {saved.get(name)!r}, this one has {value!r}"
        for name, value in arguments.items()
        if saved.get(name) != value
    ]
    if differences:
        raise ValueError(
            "load_state_dict: this state was made by a DataLoader built with other arguments ("
            + "; ".join(differences)
            + "). Build the loader with the same dataset, sampler, batch_size, drop_last, "
            "num_workers, persistent_workers and in_order as the one that made the state."
        )


def _sampler_keys(state: dict[str, Any], num_workers: int) -> dict[str, Any]:
    return state[SNAPSHOT][MAIN_SNAPSHOT] if num_workers > 0 else state


def _entries(state: dict[str, Any], num_workers: int) -> list[dict[str, Any]]:
    if num_workers == 0:
        return [state]
    workers = state[SNAPSHOT][WORKER_SNAPSHOTS]
    return [workers[worker_key(worker_id)] for worker_id in range(num_workers)]


def _snapshot_from(entry: dict[str, Any], rng: RngState | None, items: int | None
                   ) -> WorkerSnapshot | None:
    fetcher = entry[FETCHER_STATE]
    dataset_state = entry[DATASET_STATE]
    if fetcher is None:
        if rng is None and dataset_state is None:
            return None
        return WorkerSnapshot(rng, dataset_state)
    iterator_state = fetcher[DATASET_ITER_STATE]
    if rng is None and dataset_state is None and iterator_state is None and items is None:
        return None
    return WorkerSnapshot(rng, dataset_state, items, fetcher[FETCHER_ENDED], iterator_state)


def _common(state: dict[str, Any], num_workers: int, is_iterable: bool) -> dict[str, Any]:
    """What both kinds of state say the same way."""
    sampler = _sampler_keys(state, num_workers)
    if num_workers == 0:
        batches, replay, next_worker = state[NUM_YIELDED], 0, 0
    else:
        snapshot = state[SNAPSHOT]
        batches, replay = snapshot[SNAPSHOT_STEP], state[STEPS_SINCE_SNAPSHOT]
        next_worker = (snapshot[LAST_YIELDED_WORKER_ID] + 1) % num_workers
    return dict(
        finished=state[ITERATOR_FINISHED],
        batches_yielded=batches,
        replay=replay,
        next_worker=next_worker,
        resume_at=0 if is_iterable else sampler[SAMPLER_ITER_YIELDED],
        index_sampler_state=sampler[INDEX_SAMPLER_STATE],
        sampler_iter_state=sampler[SAMPLER_ITER_STATE],
    )


def _own_plan(state: dict[str, Any], own: dict[str, Any], num_workers: int,
              is_iterable: bool) -> ResumePlan:
    in_epoch = own["phase"] == IN_EPOCH
    common = _common(state, num_workers, is_iterable)
    entries = [
        (_snapshot_from(entry, _rng_from(extra["rng"]), extra["items"]), extra["in_epoch"])
        for entry, extra in zip(_entries(state, num_workers), own["workers"], strict=True)
    ]
    drawn = own["base_seed_drawn"]
    if num_workers == 0:
        base_seed = own.get("base_seed")
    else:
        base_seed = None if not in_epoch and drawn else state[SNAPSHOT][MAIN_SNAPSHOT][BASE_SEED]
    plan = ResumePlan(
        in_epoch=in_epoch,
        epoch=own["epoch"],
        iterator_epoch=own["iterator_epoch"],
        generators=list(own["generators"]),
        global_rng=_rng_from(own["global_rng"]),
        rng_at_state=_rng_from(own["global_rng_at_state"]),
        draws_base_seed=drawn,
        base_seed=base_seed,
        delivered_after=list(own["delivered_after"]),
        workers=entries if num_workers > 0 else [],
        main=entries[0] if num_workers == 0 else (None, False),
        **common,
    )
    if not in_epoch:
        plan.at_epoch_start()
    return plan


def _torchdata_plan(state: dict[str, Any], num_workers: int, is_iterable: bool,
                    arguments: dict[str, Any]) -> ResumePlan:
    """A state torchdata's ``StatefulDataLoader`` made, with torchdata's meaning.  What it does
    not hold is left as this loader has it, as torchdata leaves it: the generators (a sampler
    without a state of its own is drawn past the batches from where its generator stands), the
    main process's global generators, and the workers' (seeded from the base seed, as new
    workers are).  An iterable dataset whose copies keep no state is replayed: its batches so
    far made again and dropped."""
    common = _common(state, num_workers, is_iterable)
    batch_size = arguments["batch_size"]
    finished = common["finished"]
    in_epoch = not finished
    entries = [(_snapshot_from(entry, None, None), in_epoch)
               for entry in _entries(state, num_workers)]
    if not is_iterable:  # an iterable dataset's "sampler" draws nothing
        _check_batch_size(common, batch_size, arguments["drop_last"])
    plan = ResumePlan(
        in_epoch=in_epoch,
        epoch=None,
        iterator_epoch=0,
        generators=None,
        global_rng=None,
        rng_at_state=None,
        draws_base_seed=True,
        base_seed=None,
        workers=entries if num_workers > 0 else [],
        main=entries[0] if num_workers == 0 else (None, False),
        **common,
    )
    if num_workers > 0 and (in_epoch or arguments["persistent_workers"]):
        plan.base_seed = state[SNAPSHOT][MAIN_SNAPSHOT][BASE_SEED]
    if not in_epoch:
        plan.at_epoch_start()
    elif is_iterable and _keeps_no_state(entries):  # torchdata's naive fast-forward
        if num_workers == 0:  # the one copy, drawn past the items its batches took
            plan.main = (WorkerSnapshot(None, items=plan.batches_yielded * (batch_size or 1)),
                         True)
        else:  # the batches so far, made again by fresh workers and dropped (each counted)
            plan.replay += plan.batches_yielded
            plan.batches_yielded = 0
            plan.next_worker = 0
            plan.workers = [(None, False)] * num_workers
    return plan


def _keeps_no_state(entries: list[tuple[WorkerSnapshot | None, bool]]) -> bool:
    """torchdata's test: the first worker's copy has neither a dataset nor an iterator state."""
    snapshot = entries[0][0]
    return snapshot is None or (snapshot.dataset_state is None
                                and snapshot.iterator_state is None)


def _check_batch_size(common: dict[str, Any], batch_size: int | None, drop_last: bool) -> None:
    """A torchdata state names the indices its batch sampler drew: with another batch size the
    batches would not be the state's."""
    inner = common["sampler_iter_state"]
    if batch_size is None or not isinstance(inner, dict) or SAMPLES_YIELDED not in inner:
        return
    batches, samples = common["resume_at"], inner[SAMPLES_YIELDED]
    if batches == 0:
        fits = samples == 0
    elif drop_last:
        fits = samples == batches * batch_size
    else:  # the last batch may be short
        fits = batch_size * (batches - 1) < samples <= batch_size * batches
    if not fits:
        raise ValueError(
            f"load_state_dict: the state's batch sampler drew {samples} indices in {batches} "
            f"batches, which this loader's batch_size={batch_size} cannot; build the loader "
            "with the batch_size of the one that made the state"
        )


def _rng_from(plain: dict[str, Any] | None) -> RngState | None:
    return None if plain is None else RngState.from_plain(plain)


# -- plain values --------------------------------------------------------------------------------


def check_plain(value: Any, where: str = "state") -> None:
    """Raise a ``TypeError`` naming the first value that is not a plain scalar, string, list,
    tuple, dict with ``str`` or ``int`` keys, or tensor."""
    if isinstance(value, (*_SCALARS, torch.Tensor)):
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str | int):
                raise TypeError(f"DataLoader.state_dict(): {where} has a key {key!r} of type "
                                f"{type(key).__name__}; only str and int keys are plain")
            check_plain(item, f"{where}[{key!r}]")
        return
    if isinstance(value, list | tuple):
        for position, item in enumerate(value):
            check_plain(item, f"{where}[{position}]")
        return
    kind = f"{type(value).__module__}.{type(value).__qualname__}"
    raise TypeError(
        f"DataLoader.state_dict(): {where} is a {kind}; a DataLoader state holds only Python "
        "scalars, strings, lists, dicts and tensors. Make the state_dict() of your dataset or "
        "sampler return those (int(x), x.tolist(), torch.from_numpy(x))."
    )


# -- the loader's arguments and generators -------------------------------------------------------


def loader_arguments(loader: Any) -> dict[str, Any]:
    """What must be equal between the loader that made a state and the one that loads it."""
    dataset = loader.dataset
    is_iterable = isinstance(dataset, IterableDataset)
    index_sampler = loader.batch_sampler if loader.batch_sampler is not None else loader.sampler
    return {
        "dataset": _type_name(dataset),
        "dataset_length": None if is_iterable else _length(dataset),
        "batch_size": loader.batch_size,
        "drop_last": loader.drop_last,
        "num_workers": loader.num_workers,
        "persistent_workers": loader.persistent_workers,
        "in_order": loader.in_order,
        "sampler": _type_name(loader.sampler),
        "batch_sampler": None if loader.batch_sampler is None else _type_name(loader.batch_sampler),
        "sampler_length": None if is_iterable else _length(index_sampler),
        "generator": loader.generator is not None,
        "worker_threads": getattr(loader, "worker_threads", 1),
    }


def generator_states(generators: list[torch.Generator]) -> list[str]:
    """The states of torch generators, as base64 strings (JSON-safe)."""
    return [base64.b64encode(generator.get_state().numpy().tobytes()).decode("ascii")
            for generator in generators]


def set_generator_states(generators: list[torch.Generator], states: list[str]) -> None:
    for generator, state in zip(generators, states, strict=True):
        raw = bytearray(base64.b64decode(state.encode("ascii"), validate=True))
        generator.set_state(torch.frombuffer(raw, dtype=torch.uint8))


def _type_name(obj: Any) -> str:
    kind = type(obj)
    return f"{kind.__module__}.{kind.__qualname__}"


def _length(obj: Any) -> int | None:
    try:
        return len(obj)
    except TypeError:
        return None
