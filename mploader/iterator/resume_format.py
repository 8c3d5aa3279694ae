"""The format of ``DataLoader.state_dict()``: its version, the loader arguments it must match, and
the conversion of worker snapshots to and from plain values.

A state is a dict of Python scalars, strings, lists and dicts (no tensors, no numpy objects, no
arbitrary objects) except for what a dataset's or sampler's own ``state_dict()`` puts in it, so
it goes through ``json.dumps`` as well as pickle, ``torch.save`` and
``torch.load(weights_only=True)``; generator states are base64 strings::

    {"format": "mploader.DataLoader", "version": 2,
     "arguments": {...},      # what a loader that loads it must have been built with
     "position": {...}}       # see mploader.iterator.resume: in an epoch, or between two

``load_state_dict`` refuses a state of another format or version, one whose arguments differ
from the loader's, naming every difference, and one truncated or edited
(``mploader.iterator.resume_shape``), naming the key.
"""

from __future__ import annotations

import base64
from typing import Any

import torch
from torch.utils.data import IterableDataset

from mploader.iterator.resume_shape import check_position, check_shape
from mploader.worker.resume import WorkerSnapshot
from mploader.worker.rng import RngState

STATE_FORMAT = "mploader.DataLoader"
STATE_VERSION = 2

_SCALARS = (bool, int, float, str, type(None))


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


def check_loadable(state: Any, arguments: dict[str, Any]) -> None:
    """Raise a ``ValueError`` naming why ``state`` cannot be loaded by a loader with
    ``arguments`` (a ``TypeError`` when it is no dict); return if it can."""
    if not isinstance(state, dict):
        raise TypeError(
            "load_state_dict: a state is a dict made by mploader.DataLoader.state_dict(), got "
            f"{type(state).__name__}"
        )
    if state.get("format") != STATE_FORMAT:
        raise ValueError(
            f"load_state_dict: not a state made by mploader.DataLoader.state_dict() (its "
            f"'format' is {state.get('format')!r}, expected {STATE_FORMAT!r}); a torchdata "
            "StatefulDataLoader state has another layout and cannot be loaded"
        )
    version = state.get("version")
    if version != STATE_VERSION:
        raise ValueError(
            f"load_state_dict: this state has version {version!r}, but this mploader reads "
            f"version {STATE_VERSION}; load it with the mploader version that made it"
        )
    check_shape(state, {"arguments": dict, "position": dict}, "state")
    saved = state["arguments"]
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
    check_position(state["position"])


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


def snapshot_to_plain(snapshot: WorkerSnapshot | None, in_epoch: bool) -> dict[str, Any]:
    """One worker's entry of a state (or the main process's, with ``num_workers=0``): its
    generators, its dataset's own state and, within the epoch, its iterable position.  Between
    epochs only the generators and the dataset's state count (what persistent workers, or the
    main process's dataset, carry into the next epoch)."""
    if snapshot is None:
        return {"rng": None, "dataset_state": None, "in_epoch": False, "iterable": None}
    iterable = None
    if in_epoch and snapshot.items is not None:
        iterable = {
            "items": snapshot.items,
            "ended": snapshot.ended,
            "iterator_state": snapshot.iterator_state,
            "self_iterator": snapshot.self_iterator,
        }
    return {
        "rng": None if snapshot.rng is None else snapshot.rng.to_plain(),
        "dataset_state": snapshot.dataset_state,
        "in_epoch": in_epoch,
        "iterable": iterable,
    }


def snapshot_from_plain(entry: dict[str, Any]) -> tuple[WorkerSnapshot | None, bool]:
    """The snapshot of a state's entry, and whether it holds a position in the epoch."""
    state = None if entry["rng"] is None else RngState.from_plain(entry["rng"])
    iterable = entry["iterable"]
    if state is None and entry["dataset_state"] is None and iterable is None:
        return None, False
    snapshot = WorkerSnapshot(state, entry["dataset_state"])
    if iterable is not None:
        snapshot.items = int(iterable["items"])
        snapshot.ended = bool(iterable["ended"])
        snapshot.iterator_state = iterable["iterator_state"]
        snapshot.self_iterator = bool(iterable["self_iterator"])
    return snapshot, bool(entry["in_epoch"])


def generator_states(generators: list[torch.Generator]) -> list[str]:
    """The states of torch generators, as base64 strings (JSON-safe)."""
    return [base64.b64encode(generator.get_state().numpy().tobytes()).decode("ascii")
            for generator in generators]


def set_generator_states(generators: list[torch.Generator], states: list[str]) -> None:
    for generator, state in zip(generators, states, strict=True):
        if not isinstance(state, str):
            raise TypeError("load_state_dict: a generator state is a base64 string in this "
                            "mploader's states; this state was made by another version")
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
