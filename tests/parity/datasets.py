"""Picklable datasets, samplers and collate functions for the torch-vs-mploader parity tests.

Everything a worker receives (datasets, collate functions, ``worker_init_fn``) is defined at the top
level of this module so that spawn and forkserver workers can unpickle it.  The comparison helpers
(:func:`assert_same`, :func:`collect`, :func:`make_pair`) live here too so that every parity test
module compares batches the same way.
"""

from __future__ import annotations

import math
import random
import re
import threading
import time
import warnings
from collections import namedtuple
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
import torch.utils.data
from torch.utils.data import Dataset, IterableDataset, Sampler

import mploader

# -- comparing batches -----------------------------------------------------------------------------


def assert_same(expected: Any, actual: Any, path: str = "batch") -> None:
    """Deep equality with exact Python types: torch's batch ``expected``, mploader's ``actual``."""
    assert type(actual) is type(expected), (
        f"{path}: type {type(actual).__qualname__} != torch's {type(expected).__qualname__}"
    )
    if isinstance(expected, torch.Tensor):
        assert actual.dtype == expected.dtype, f"{path}: dtype {actual.dtype} != {expected.dtype}"
        assert actual.shape == expected.shape, f"{path}: shape {actual.shape} != {expected.shape}"
        assert actual.layout == expected.layout, f"{path}: layout {actual.layout}"
        assert torch.equal(actual, expected), f"{path}: values {actual} != torch's {expected}"
    elif isinstance(expected, np.ndarray):
        assert actual.dtype == expected.dtype, f"{path}: dtype {actual.dtype} != {expected.dtype}"
        assert actual.shape == expected.shape, f"{path}: shape {actual.shape} != {expected.shape}"
        assert np.array_equal(actual, expected), f"{path}: {actual} != torch's {expected}"
    elif isinstance(expected, dict):
        assert list(actual) == list(expected), f"{path}: keys {list(actual)} != {list(expected)}"
        for key in expected:
            assert_same(expected[key], actual[key], f"{path}[{key!r}]")
    elif isinstance(expected, (list, tuple)):  # namedtuples included: the type check above
        assert len(actual) == len(expected), f"{path}: length {len(actual)} != {len(expected)}"
        for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
            assert_same(e, a, f"{path}[{i}]")
    elif isinstance(expected, float) and math.isnan(expected):
        assert math.isnan(actual), f"{path}: {actual} != nan"
    else:
        assert actual == expected, f"{path}: {actual!r} != torch's {expected!r}"


def assert_same_batches(expected: list[Any], actual: list[Any], what: str = "epoch") -> None:
    assert len(actual) == len(expected), (
        f"{what}: mploader gave {len(actual)} batches, torch {len(expected)}"
    )
    for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
        assert_same(e, a, f"{what} batch {i}")


def assert_same_failure(expected: BaseException, actual: BaseException) -> None:
    """mploader failed as torch did: the same type, and the same message, which torch wraps as
    "Caught E in DataLoader worker process N. Original Traceback ... E: message" where the
    failure happened in a worker or its pin thread (mploader raises the original exception)."""
    assert type(actual) is type(expected), f"{actual!r} != torch's {expected!r}"
    if str(expected).startswith("Caught "):
        assert str(expected).rstrip().endswith(f"{type(actual).__name__}: {actual}"), (
            actual, expected)
    else:
        assert str(actual) == str(expected)


def collect(loader: Any, epochs: int = 1) -> list[list[Any]]:
    """Every batch of ``epochs`` full epochs, one list per epoch."""
    return [list(loader) for _ in range(epochs)]


def sort_key(batch: Any) -> str:
    """A total order on batches for comparing ``in_order=False`` results as multisets."""
    return repr(_plain(batch))


def _plain(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return ("tensor", str(value.dtype), value.tolist())
    if isinstance(value, dict):
        return {key: _plain(v) for key, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def without_object_address(text: str, *objects: Any) -> str:
    """``text`` with each object's ``str`` (which holds its address) replaced by a placeholder."""
    for obj in objects:
        text = text.replace(str(obj), "<dataset>")
    return re.sub(r" at 0x[0-9a-f]+", " at 0x?", text)


def messages(caught: list[warnings.WarningMessage], *objects: Any) -> list[tuple[type, str]]:
    return [(w.category, without_object_address(str(w.message), *objects)) for w in caught]


# -- map-style datasets ----------------------------------------------------------------------------

Point = namedtuple("Point", ["index", "coords", "label"])


class Sized(Dataset):
    """A map-style dataset of ``n`` items; subclasses say what item ``index`` is."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n


class TensorItems(Sized):
    """Item i: ``tensor([i, 2i], float32)``."""

    def __getitem__(self, index: int) -> torch.Tensor:
        if not 0 <= index < self.n:
            raise IndexError(index)
        return torch.tensor([index, 2 * index], dtype=torch.float32)


class DictItems(Sized):
    """Dict samples mixing tensors, ints, floats, bools, strings and a nested dict."""

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {
            "index": index,
            "x": torch.full((2, 3), index, dtype=torch.int16),
            "weight": index / 4,
            "even": index % 2 == 0,
            "name": f"item-{index}",
            "meta": {"square": index * index, "tags": [index, -index]},
        }


class TupleItems(Sized):
    """Tuple samples: ``(int, float, str, tensor, bytes)``."""

    def __getitem__(self, index: int) -> tuple[Any, ...]:
        return (index, index * 0.5, f"s{index}", torch.arange(3) + index, b"b%d" % index)


class NamedTupleItems(Sized):
    """``Point`` namedtuples holding a numpy array and a string."""

    def __getitem__(self, index: int) -> Point:
        return Point(index, np.array([index, index + 1], dtype=np.float64), f"p{index}")


class NumpyItems(Sized):
    """Numpy arrays of several dtypes and numpy scalars (default_collate makes tensors)."""

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {
            "i32": np.arange(4, dtype=np.int32) + index,
            "f64": np.full((2, 2), index / 3, dtype=np.float64),
            "u8": np.array([index % 256], dtype=np.uint8),
            "scalar": np.float32(index) / 2,
            "bool": np.bool_(index % 3 == 0),
        }


class GetItemsDataset(Sized):
    """Has ``__getitems__``: samples say which path fetched them."""

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"index": index, "via": "getitem"}

    def __getitems__(self, indices: list[int]) -> list[dict[str, Any]]:
        return [{"index": i, "via": f"getitems/{len(indices)}"} for i in indices]


class KeyedDataset(Dataset):
    """A map-style dataset keyed by strings (a custom sampler yields the keys)."""

    def __init__(self, n: int) -> None:
        self.items = {f"key{i:02d}": torch.tensor(float(i)) for i in range(n)}

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, key: str) -> tuple[str, torch.Tensor]:
        return key, self.items[key]


class SparseItems(Dataset):
    """Sparse COO tensors: torch's default_collate refuses to batch them."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.eye(2).to_sparse() * index


class RaggedItems(Dataset):
    """Tensors of growing length: default_collate's ``torch.stack`` fails on a batch of two."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.zeros(index + 1)


class NoneItems(Dataset):
    """``None`` samples: default_collate raises its TypeError."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> None:
        return None


class LargeItems(Dataset):
    """Samples large enough to leave the message: shared-memory blocks or a separate pipe frame."""

    def __init__(self, n: int, floats: int = 20_000) -> None:
        self.n = n
        self.floats = floats

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {
            "big": torch.arange(self.floats, dtype=torch.float32) + index,
            "array": np.arange(self.floats // 2, dtype=np.float64) * index,
            "small": torch.tensor([index]),
            "label": index,
            "name": f"large-{index}",
        }


class ExoticTensors(Dataset):
    """Tensors a codec can get wrong: views, zero strides, odd dtypes, empty and 0-d tensors."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> dict[str, Any]:
        base = torch.arange(2 * 6000, dtype=torch.float32).view(2, 6000) + index
        return {
            "transposed": base.t(),
            "expanded": torch.tensor([float(index)]).expand(5000, 3),
            "offset_view": base[1, 100:5100],
            "bfloat16": torch.full((9000,), index, dtype=torch.bfloat16),
            "complex64": torch.full((3000,), complex(index, 1), dtype=torch.complex64),
            "bool": torch.arange(20000) % (index + 2) == 0,
            "float16": torch.full((9000,), index, dtype=torch.float16),
            "int8": torch.full((17000,), index - 2, dtype=torch.int8),
            "empty": torch.zeros(0, 3),
            "zero_d": torch.tensor(float(index)),
            "small": torch.tensor([index, -index], dtype=torch.int64),
            "fortran_array": np.asfortranarray(np.arange(8000, dtype=np.float64).reshape(2, 4000)),
            "array_view": np.arange(10000, dtype=np.int32)[::2],
            "string_array": np.array(["a", "bc"]),
        }


class RequiresGradItems(Dataset):
    """Leaf tensors that require grad: torch's in-worker collate (``out=``) refuses them."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.full((3,), float(index), requires_grad=True)


class Money:
    """A type default_collate knows nothing about until a collate function is registered."""

    def __init__(self, cents: int) -> None:
        self.cents = cents


def collate_money(batch: list[Money], *, collate_fn_map: Any = None) -> torch.Tensor:
    return torch.tensor([money.cents for money in batch])


class MoneyItems(Dataset):
    def __len__(self) -> int:
        return 5

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"price": Money(100 * index + 99), "index": index}


# -- samplers and collate functions ----------------------------------------------------------------


class EveryOtherSampler(Sampler[int]):
    """Odd indices descending, then even ones ascending."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[int]:
        yield from range(self.n - 1 if self.n % 2 == 0 else self.n - 2, -1, -2)
        yield from range(0, self.n, 2)

    def __len__(self) -> int:
        return self.n


class GrowingBatchSampler(Sampler[list[int]]):
    """Batches of 1, 2, 3, ... indices, in a seeded random order."""

    def __init__(self, n: int, seed: int) -> None:
        self.n = n
        self.generator = torch.Generator().manual_seed(seed)

    def __iter__(self) -> Iterator[list[int]]:
        order = torch.randperm(self.n, generator=self.generator).tolist()
        size, start = 1, 0
        while start < self.n:
            yield order[start : start + size]
            start += size
            size += 1

    def __len__(self) -> int:
        size, start, count = 1, 0, 0
        while start < self.n:
            start, size, count = start + size, size + 1, count + 1
        return count


class KeysSampler(Sampler[str]):
    def __init__(self, keys: list[str]) -> None:
        self.keys = keys

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys)

    def __len__(self) -> int:
        return len(self.keys)


def dict_collate(samples: list[Any]) -> dict[str, Any]:
    """A custom collate returning a dict that mixes a stacked tensor and plain Python values."""
    stacked = torch.stack([torch.as_tensor(s) for s in samples])
    return {"stacked": stacked, "count": len(samples), "sum": float(stacked.sum())}


def count_collate(samples: list[Any]) -> int:
    """A batch that is a plain int."""
    return len(samples)


def none_collate(samples: list[Any]) -> None:
    """A batch that is ``None``."""
    return None


def list_collate(samples: list[Any]) -> list[Any]:
    """The samples as they are (no tensors made)."""
    return list(samples)


# -- iterable-style datasets -----------------------------------------------------------------------


def _worker_info(via: str) -> Any:
    torch_info = torch.utils.data.get_worker_info()
    mploader_info = mploader.get_worker_info()
    return torch_info if via == "torch" else mploader_info


class ShardedIterable(IterableDataset):
    """Items ``0..n-1`` split between workers through ``get_worker_info()`` of torch or mploader.

    ``via="mploader"`` only shards under mploader's workers: its torch reference is ``via="torch"``.
    Each item is ``(value, worker id)``, so a sample from the wrong worker shows.
    """

    def __init__(self, n: int, via: str = "torch") -> None:
        self.n = n
        self.via = via

    def __iter__(self) -> Iterator[tuple[int, int]]:
        info = _worker_info(self.via)
        if info is None:
            yield from ((i, -1) for i in range(self.n))
            return
        for i in range(info.id, self.n, info.num_workers):
            yield i, info.id


class UnevenShards(IterableDataset):
    """Worker k yields ``sizes[k]`` items (a worker beyond the list yields none)."""

    def __init__(self, sizes: list[int]) -> None:
        self.sizes = sizes

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = torch.utils.data.get_worker_info()
        worker = 0 if info is None else info.id
        count = sum(self.sizes) if info is None else (
            self.sizes[worker] if worker < len(self.sizes) else 0
        )
        for i in range(count):
            yield {"worker": worker, "i": i, "x": torch.tensor([worker * 100 + i])}


class CountingIterable(IterableDataset):
    """``range(n)`` in every worker (no sharding), with a ``__len__`` that may under-report."""

    def __init__(self, n: int, reported_length: int | None = None) -> None:
        self.n = n
        self.reported_length = n if reported_length is None else reported_length

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.n))

    def __len__(self) -> int:
        return self.reported_length


class NoLenIterable(IterableDataset):
    def __iter__(self) -> Iterator[int]:
        return iter(range(3))


class FailingIterable(IterableDataset):
    """Worker-sharded items; the item ``fail_at`` raises ``ValueError`` (ending that generator)."""

    def __init__(self, n: int, fail_at: int) -> None:
        self.n = n
        self.fail_at = fail_at

    def __iter__(self) -> Iterator[int]:
        info = torch.utils.data.get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(start, self.n, step):
            if i == self.fail_at:
                raise ValueError(f"iterable item {i} is broken")
            yield i


# -- what a worker sees ----------------------------------------------------------------------------

_init_record: dict[str, Any] = {}


def record_worker_init(worker_id: int) -> None:
    """A ``worker_init_fn`` whose observations show up in every sample (``InitRecording``)."""
    info = torch.utils.data.get_worker_info()
    _init_record.update(
        worker_id=worker_id,
        info_id=None if info is None else info.id,
        initial_seed=torch.initial_seed(),
        random=random.random(),
        numpy=float(np.random.rand()),
    )


def failing_worker_init(worker_id: int) -> None:
    if worker_id == 1:
        raise RuntimeError(f"worker_init_fn failed in worker {worker_id}")


class InitRecording(Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"index": index, **_init_record}


class WorkerSeeds(Dataset):
    """Each sample holds what the worker's random state and worker info say while fetching it.

    ``delay`` seconds of sleep per item keep tasks queued at the workers for a while.
    """

    def __init__(self, n: int, delay: float = 0.0) -> None:
        self.n = n
        self.delay = delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> dict[str, Any]:
        if self.delay:
            time.sleep(self.delay)
        torch_info = torch.utils.data.get_worker_info()
        mploader_info = mploader.get_worker_info()
        info = torch_info if torch_info is not None else mploader_info
        return {
            "index": index,
            "initial_seed": torch.initial_seed(),
            "random": random.random(),
            "numpy": float(np.random.rand()),
            "numpy_int": int(np.random.randint(0, 2**31 - 1)),
            "torch_rand": torch.rand(1),
            "torch_randint": torch.randint(0, 1000, (2,)),
            "info_seed": -1 if info is None else info.seed,
            "info_id": -1 if info is None else info.id,
            "info_num_workers": -1 if info is None else info.num_workers,
            "info_dataset_is_self": info is not None and info.dataset is self,
            "num_threads": torch.get_num_threads(),
        }


class WorkerInfoAgreement(Dataset):
    """(index, whether torch's and mploader's ``get_worker_info()`` are the same object)."""

    def __len__(self) -> int:
        return 6

    def __getitem__(self, index: int) -> tuple[int, bool, int]:
        torch_info = torch.utils.data.get_worker_info()
        mploader_info = mploader.get_worker_info()
        return index, torch_info is mploader_info, -1 if torch_info is None else torch_info.id


class RandomIterable(IterableDataset):
    """Sharded ``(i, random.random(), torch.rand(1))``: per-epoch streams of persistent workers."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[tuple[int, float, torch.Tensor]]:
        info = torch.utils.data.get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(start, self.n, step):
            yield i, random.random(), torch.rand(1)


# -- errors ----------------------------------------------------------------------------------------


class DetailedError(Exception):
    """A custom exception whose attributes must survive the trip from the worker."""

    def __init__(self, message: str, index: int, detail: dict[str, Any]) -> None:
        super().__init__(message)
        self.index = index
        self.detail = detail

    def __reduce__(self) -> Any:
        return (type(self), (self.args[0], self.index, self.detail))


class UnpicklableError(Exception):
    """Cannot be pickled (holds a lock)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.lock = threading.Lock()


class BadReduceError(Exception):
    """Pickles, but cannot be unpickled: ``__init__`` wants two arguments, ``args`` holds one."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


ERROR_KINDS: dict[str, Callable[[int], BaseException]] = {
    "value": lambda i: ValueError(f"bad sample {i}"),
    "key": lambda i: KeyError(f"missing-{i}"),
    "index": lambda i: IndexError(f"index {i} out of range"),
    "zero": lambda i: ZeroDivisionError(f"division by zero at {i}"),
    "stop": lambda i: StopIteration(f"leaked StopIteration at {i}"),
    "detailed": lambda i: DetailedError(f"detailed failure at {i}", i, {"why": "test", "n": i}),
    "unpicklable": lambda i: UnpicklableError(f"unpicklable failure at {i}"),
    "bad_reduce": lambda i: BadReduceError(f"bad reduce at {i}", 7),
}


class FailingDataset(Dataset):
    """Raises the ``kind`` exception for the indices in ``bad``; otherwise ``tensor([i])``."""

    def __init__(self, n: int, bad: tuple[int, ...], kind: str = "value") -> None:
        self.n = n
        self.bad = bad
        self.kind = kind

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> torch.Tensor:
        if index in self.bad:
            raise ERROR_KINDS[self.kind](index)
        return torch.tensor([index])


def unpicklable_collate(samples: list[Any]) -> Any:
    """Returns a batch that cannot be pickled back to the main process."""
    return {"lock": threading.Lock(), "n": len(samples)}


class SlowItems(Dataset):
    """Item ``slow_index`` sleeps ``seconds`` (for timeouts)."""

    def __init__(self, n: int, slow_index: int, seconds: float) -> None:
        self.n = n
        self.slow_index = slow_index
        self.seconds = seconds

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        if index == self.slow_index:
            time.sleep(self.seconds)
        return index


# -- building pairs of loaders ---------------------------------------------------------------------


def make_pair(
    options: Callable[[], dict[str, Any]],
    start_method: str | None,
    shared_memory: Any,
    *,
    reference_dataset: Callable[[], Any] | None = None,
) -> tuple[torch.utils.data.DataLoader, mploader.DataLoader]:
    """A torch loader and an mploader loader from the same fresh options.

    ``options()`` is called once per loader, so samplers and generators start from the same seed.
    """
    torch_options = options()
    if reference_dataset is not None:
        torch_options["dataset"] = reference_dataset()
    mploader_options = options()
    if start_method is not None and torch_options.get("num_workers", 0) > 0:
        torch_options["multiprocessing_context"] = start_method
        mploader_options["multiprocessing_context"] = start_method
    reference = torch.utils.data.DataLoader(**torch_options)
    loader = mploader.DataLoader(**mploader_options, shared_memory=shared_memory)
    return reference, loader
