"""collate_and_encode gives exactly what torch's default_collate gives, or fails the same way."""

from __future__ import annotations

import collections
import dataclasses

import numpy as np
import pytest
import torch
from _shm_helpers import Loopback
from torch.utils.data import default_collate

from mploader.channel.plain import PlainMainEnd, PlainWorkerEnd
from mploader.channel.shm import codec
from mploader.config import SharedMemoryConfig
from mploader.worker.info import make_worker_info, set_worker_info

Pair = collections.namedtuple("Pair", ["image", "label"])


class TypedList(list):
    """A list subclass: collate clones it (copy.copy) and keeps the type."""


@dataclasses.dataclass
class Opaque:
    value: int


def image(index: int, dtype: torch.dtype = torch.uint8) -> torch.Tensor:
    return (torch.arange(3 * 32 * 32).reshape(3, 32, 32) + index).to(dtype)


SAMPLE_TABLE = {
    "ints": [1, 2, 3],
    "bools": [True, False],
    "floats": [0.5, 1.5],
    "strings": ["a", "b"],
    "bytes": [b"a", b"b"],
    "small_tensors": [torch.randn(10) for _ in range(64)],
    "big_tensors": [image(index) for index in range(16)],
    "big_bfloat16": [image(index, torch.bfloat16) for index in range(16)],
    "zero_d_tensors": [torch.tensor(index) for index in range(5)],
    "empty_tensors": [torch.zeros(0, 3) for _ in range(4)],
    "numpy_arrays": [np.full((40, 40), index, dtype=np.float32) for index in range(8)],
    "numpy_views": list(np.arange(250 * 60 * 8, dtype=np.float32).reshape(8, 250, 60)),
    "numpy_scalars": [np.float32(1.5), np.float32(2.5)],
    "numpy_ints": [np.int64(4), np.int64(5)],
    "numpy_bools": [np.bool_(True), np.bool_(False)],
    "tuples": [(image(index), index) for index in range(4)],
    "lists": [[image(index), float(index)] for index in range(4)],
    "typed_lists": [TypedList([image(index), index]) for index in range(4)],
    "dicts": [{"image": image(index), "label": index, "name": str(index)} for index in range(4)],
    "ordered_dicts": [collections.OrderedDict(a=torch.ones(5000) * index) for index in range(3)],
    "namedtuples": [Pair(image(index), index) for index in range(4)],
    "nested": [
        {"pair": Pair(image(index), [index, {"deep": torch.full((2,), float(index))}])}
        for index in range(3)
    ],
    "mixed_small_and_big": [(torch.tensor([index]), image(index)) for index in range(8)],
    "repeated_tensor": [image(0)] * 8,
    "non_contiguous": [image(index).transpose(1, 2) for index in range(4)],
    "promoted_dtypes": [torch.ones(20000, dtype=torch.int32), torch.ones(20000)],
    "conjugated": [torch.full((3000,), complex(index, 1), dtype=torch.complex64).conj()
                   for index in range(4)],
    "negative_views": [torch.full((3000,), complex(1, index), dtype=torch.complex64).conj().imag
                       for index in range(4)],  # the neg bit set, and strided
}


def assert_same(received, expected, path="batch"):
    assert type(received) is type(expected), f"{path}: {type(received)} != {type(expected)}"
    if isinstance(expected, torch.Tensor):
        assert received.dtype == expected.dtype, path
        assert received.shape == expected.shape, path
        assert received.requires_grad == expected.requires_grad, path
        assert torch.equal(received.detach(), expected.detach()), path
    elif isinstance(expected, dict):
        assert list(received) == list(expected), path
        for key in expected:
            assert_same(received[key], expected[key], f"{path}[{key!r}]")
    elif isinstance(expected, (list, tuple)):
        assert len(received) == len(expected), path
        for index, (left, right) in enumerate(zip(received, expected, strict=True)):
            assert_same(left, right, f"{path}[{index}]")
    else:
        assert received == expected, path


@pytest.fixture(scope="module")
def loop():
    with Loopback(SharedMemoryConfig(inline_threshold=4096)) as loopback:
        yield loopback


@pytest.mark.parametrize("name", list(SAMPLE_TABLE))
def test_matches_default_collate(loop, name):
    _same_as_default_collate(loop, SAMPLE_TABLE[name])


def _same_as_default_collate(loop, samples):
    """The same batch as torch's ``default_collate``, or the same error where torch fails
    (torch 2.6 cannot collate numpy 2's bool scalars)."""
    try:
        expected = default_collate(samples)
    except Exception as error:
        with pytest.raises(type(error)) as caught:
            loop.collate(samples)
        assert str(caught.value) == str(error)
        return
    received = loop.collate(samples)
    assert_same(received, expected)
    del received
    loop.deliver_releases()


@pytest.mark.parametrize("name", list(SAMPLE_TABLE))
def test_matches_default_collate_when_stacked_row_by_row(loop, name, monkeypatch):
    """Stacks from 64 MiB up are copied a row at a time, over the copy threads; here every
    stack is, so that each dtype and kind of tensor goes that way too."""
    monkeypatch.setattr(codec, "_COPY_LOOP_BYTES", 0)
    _same_as_default_collate(loop, SAMPLE_TABLE[name])


def test_requires_grad_fails_as_torchs_in_worker_collate(loop):
    """torch's default_collate stacks with out= inside a worker, which autograd refuses; so does
    ours (in the main process torch's stacks them: that is num_workers=0's behaviour)."""
    samples = [torch.ones(3, requires_grad=True) for _ in range(2)]
    set_worker_info(make_worker_info(0, 1, 0, None))  # mploader collates only inside workers
    try:
        with pytest.raises(RuntimeError, match=r"functions with out=\.\.\. arguments don't"):
            loop.collate(samples)
    finally:
        set_worker_info(None)


@pytest.mark.parametrize("name", ["ints", "big_tensors", "dicts", "nested"])
def test_matches_default_collate_with_plain_pickling(name):
    worker = PlainWorkerEnd()
    main = PlainMainEnd()
    samples = SAMPLE_TABLE[name]
    received = main.decode(0, worker.collate_and_encode(samples))
    assert_same(received, default_collate(samples))


BAD_SAMPLES = {
    "unequal_sizes": [torch.zeros(3000), torch.zeros(4000)],
    "unequal_small_sizes": [torch.zeros(2), torch.zeros(3)],
    "unequal_lengths": [[1, 2], [1]],
    "objects": [Opaque(1), Opaque(2)],
    "string_arrays": [np.array(["a"]), np.array(["b"])],
    "object_arrays": [np.array([None], dtype=object)] * 2,
    "sparse": [torch.eye(2).to_sparse()] * 2,
    "nested_tensor": [torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)])] * 2,
    "mixed_types": [torch.zeros(2), 1],
}


def capture(call):
    try:
        call()
    except Exception as error:  # the point is comparing whatever each raises
        return type(error), str(error)
    return None


@pytest.mark.parametrize("name", list(BAD_SAMPLES))
def test_bad_input_fails_like_default_collate(loop, name):
    samples = BAD_SAMPLES[name]
    expected = capture(lambda: default_collate(samples))
    received = capture(lambda: loop.collate(samples))
    assert received == expected
    assert loop.worker.statistics().blocks_in_use == 0  # a failed batch gives its block back


def test_collate_writes_the_batch_into_one_block(loop):
    loop.deliver_releases()
    before = loop.worker.statistics()
    batch = loop.collate([{"a": image(index), "b": image(index) * 2} for index in range(16)])
    after = loop.worker.statistics()
    assert after.shm_leaves - before.shm_leaves == 2
    assert after.blocks_in_use == 1
    del batch
    loop.deliver_releases()
    assert loop.worker.statistics().blocks_in_use == 0


def test_user_replaced_tensor_collate_is_honoured(loop, monkeypatch):
    from torch.utils.data._utils import collate as torch_collate

    def doubled(batch, *, collate_fn_map=None):
        return torch.stack(batch, 0) * 2

    monkeypatch.setitem(torch_collate.default_collate_fn_map, torch.Tensor, doubled)
    received = loop.collate([torch.ones(3), torch.ones(3)])
    assert torch.equal(received, torch.full((2, 3), 2.0))
