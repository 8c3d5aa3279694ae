"""Batches survive encode -> decode unchanged: every dtype, shape, container and fallback."""

from __future__ import annotations

import collections
import dataclasses
import warnings

import numpy as np
import pytest
import torch
from _shm_helpers import Loopback

from mploader.config import SharedMemoryConfig

TORCH_DTYPES = [
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16,
    torch.uint32, torch.uint64, torch.float16, torch.bfloat16, torch.float32, torch.float64,
    torch.complex64, torch.complex128, torch.complex32, torch.float8_e4m3fn, torch.float8_e5m2,
]
NUMPY_DTYPES = [
    np.bool_, np.uint8, np.int8, np.int16, np.int32, np.int64, np.uint16, np.uint32, np.uint64,
    np.float16, np.float32, np.float64, np.complex64, np.complex128, np.dtype(">f4"),
]

Point = collections.namedtuple("Point", ["x", "y"])


@dataclasses.dataclass
class Sample:
    image: torch.Tensor
    label: int
    extra: dict


def make_tensor(dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # complex32 is "experimental"
        values = torch.arange(int(np.prod(shape)), dtype=torch.float64).reshape(shape) % 7 - 3
        if dtype.is_complex:
            return torch.complex(values, -values).to(dtype)
        if dtype == torch.bool:
            return values > 0
        if dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            return values.to(torch.float32).to(dtype)
        if not dtype.is_floating_point and not dtype.is_signed:
            return (values + 3).to(dtype)
        return values.to(dtype)


def same_tensor(left: torch.Tensor, right: torch.Tensor) -> bool:
    if type(left) is not type(right) or left.dtype != right.dtype or left.shape != right.shape:
        return False
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64, 16: torch.int64}
    if left.element_size() == 16:  # complex128: compare as two float64 lanes
        return torch.equal(torch.view_as_real(left), torch.view_as_real(right))
    as_bits = width[left.element_size()]
    return torch.equal(left.contiguous().view(as_bits), right.contiguous().view(as_bits))


@pytest.fixture
def loop():
    with Loopback() as loopback:
        yield loopback


@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(), (0,), (3, 0), (5,), (64, 10), (70, 1024)])
def test_tensor_dtypes_and_shapes(loop, dtype, shape):
    original = make_tensor(dtype, shape)
    received = loop.roundtrip({"t": original})["t"]
    assert same_tensor(received, original)


@pytest.mark.parametrize("dtype", NUMPY_DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(), (0,), (4, 0), (7,), (300, 300)])
def test_numpy_dtypes_and_shapes(loop, dtype, shape):
    original = np.asarray(np.arange(int(np.prod(shape))).reshape(shape) % 5).astype(dtype)
    received = loop.roundtrip([original])[0]
    assert type(received) is np.ndarray
    assert received.dtype == original.dtype and received.shape == original.shape
    assert np.array_equal(received, original)


@pytest.mark.parametrize("nbytes_scale", [1, 5000], ids=["inline", "block"])
def test_non_contiguous_and_resolved_leaves(loop, nbytes_scale):
    base = torch.arange(24 * nbytes_scale, dtype=torch.float32).reshape(4 * nbytes_scale, 6)
    complex_base = torch.complex(base, base + 1)
    leaves = {
        "transposed": base.t(),
        "strided": base[::2, 1::3],
        "offset": base[1:],
        "expanded": torch.tensor([1.0, 2.0]).expand(3 * nbytes_scale, 2),
        "conj": complex_base.conj(),
        "neg": complex_base.conj().imag,
        "fortran": np.asfortranarray(base.numpy()),
        "numpy_strided": base.numpy()[::3, ::2],
    }
    received = loop.roundtrip(leaves)
    for key, original in leaves.items():
        got = received[key]
        if isinstance(original, np.ndarray):
            assert type(got) is np.ndarray and np.array_equal(got, original), key
        else:
            assert type(got) is torch.Tensor and torch.equal(got, original.resolve_conj()), key
            assert not got.is_conj() and not got.is_neg()


def test_nested_containers_keep_their_types(loop):
    big = torch.ones(100_000)
    batch = {
        "tuple": (torch.zeros(2), big),
        "list": [np.ones(3), [big * 2, "text"]],
        "point": Point(x=torch.tensor([1, 2]), y=np.zeros((2, 2))),
        "sample": Sample(image=big * 3, label=7, extra={"id": b"raw", "score": 0.5}),
        "ordered": collections.OrderedDict(a=torch.tensor(1.5), b=None),
        "numbers": (1, 2.5, True, np.float32(3.0), np.int64(4)),
        "none": None,
    }
    received = loop.roundtrip(batch)
    assert type(received["tuple"]) is tuple
    assert torch.equal(received["tuple"][1], big)
    assert type(received["list"][1]) is list and received["list"][1][1] == "text"
    assert type(received["point"]) is Point
    assert torch.equal(received["point"].x, torch.tensor([1, 2]))
    assert type(received["sample"]) is Sample and torch.equal(received["sample"].image, big * 3)
    assert received["sample"].extra == {"id": b"raw", "score": 0.5}
    assert type(received["ordered"]) is collections.OrderedDict
    assert received["numbers"] == batch["numbers"]
    assert type(received["numbers"][3]) is np.float32
    assert received["none"] is None


def test_fallback_leaves_are_pickled_whole(loop):
    parameter = torch.nn.Parameter(torch.ones(3))
    grad = torch.ones(50_000, requires_grad=True)
    sparse = torch.eye(3).to_sparse()
    strings = np.array(["a", "bc"])
    objects = np.array([{"a": 1}, None], dtype=object)
    received = loop.roundtrip([parameter, grad, sparse, strings, objects])
    assert type(received[0]) is torch.nn.Parameter and torch.equal(received[0], parameter)
    assert received[1].requires_grad and torch.equal(received[1], grad)
    assert received[2].is_sparse and torch.equal(received[2].to_dense(), torch.eye(3))
    assert np.array_equal(received[3], strings)
    assert received[4][0] == {"a": 1}


@pytest.mark.parametrize(("batch", "shares"), [
    ([torch.zeros(2), torch.zeros(1_000_000), np.array(["a"]), 3.5j], False),
    ({"labels": torch.arange(3), "adjacency": torch.eye(3).to_sparse()}, True),
    ([torch.nn.Parameter(torch.ones(3))], True),
    ([torch.ones(3, requires_grad=True)], True),
], ids=["plain-leaves-and-by-value", "sparse", "parameter", "requires-grad"])
def test_a_payload_says_whether_its_sender_must_live_to_decode_it(loop, batch, shares):
    """Tensors that are not plain are pickled by torch's sharing reductions (their storages are
    taken from the worker while unpickling); the envelope says so, and only then."""
    payload = loop.worker.encode(batch)
    assert loop.main.needs_sender([payload]) is shares
    assert loop.main.needs_sender([loop.worker.encode([torch.zeros(2)])]) is False  # per message
    loop.main.decode(0, payload)


def test_repeated_leaf_comes_back_as_one_object(loop):
    shared = torch.arange(100_000)
    small = torch.arange(3)
    received = loop.roundtrip({"a": shared, "b": shared, "c": small, "d": [small]})
    assert received["a"] is received["b"]
    assert received["c"] is received["d"][0]


def test_block_leaves_are_views_and_small_leaves_are_inline(loop):
    batch = [torch.zeros(2), torch.zeros(1_000_000)]
    received = loop.roundtrip(batch)
    statistics = loop.worker.statistics()
    assert statistics.inline_leaves == 1 and statistics.shm_leaves == 1
    # writable, and views share memory with the block
    received[1][0] = 5.0
    received[0][0] = 1.0


def test_inline_threshold_is_respected():
    config = SharedMemoryConfig(inline_threshold=4096)
    with Loopback(config) as loop:
        loop.roundtrip([torch.zeros(1023), torch.zeros(1024)])  # 4092 and 4096 bytes
        statistics = loop.worker.statistics()
        assert (statistics.inline_leaves, statistics.shm_leaves) == (1, 1)


def test_plain_pickling_without_config():
    from mploader.channel import open_main_end, open_worker_end

    worker = open_worker_end(None, 0, 1, "1-plain", pipeline_depth=2)
    main = open_main_end(None, "1-plain")
    batch = {"x": torch.arange(5), "y": [np.ones(2), "s"]}
    received = main.decode(0, worker.encode(batch))
    assert torch.equal(received["x"], batch["x"]) and received["y"][1] == "s"
    collated = main.decode(0, worker.collate_and_encode([1, 2]))
    assert torch.equal(collated, torch.tensor([1, 2]))
    worker.close()
    main.close()


def test_payload_carries_worker_statistics(loop):
    for _ in range(3):
        loop.roundtrip([torch.zeros(100_000)])
        loop.deliver_releases()
    (statistics,) = loop.main.statistics().workers
    assert statistics.messages == 3
    assert statistics.reuse_misses == 1 and statistics.reuse_hits == 2
    assert statistics.blocks == 1 and statistics.worker_id == 0
