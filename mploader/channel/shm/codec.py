"""The message format: a batch's skeleton pickled, with array leaves replaced by descriptors.

On the wire (one ``bytes`` payload) come two pickles back to back:

1. the envelope, ``(FORMAT_VERSION, worker_pid, block_ref, retired_block_ids, pool_statistics,
   needs_sender)`` where ``block_ref`` is ``None`` or ``(block_id, generation, block_size,
   used_bytes)`` and ``needs_sender`` says that the batch holds objects pickled by sharing
   reductions, which the main process takes from the worker while unpickling (the worker must
   live until the payload is decoded);
2. the batch, pickled with protocol 5 by :class:`LeafEncoder`, whose ``persistent_id`` turns every
   plain CPU tensor and numeric numpy array into a descriptor tuple:

   - ``(INLINE_TENSOR, leaf, dtype_code, shape, bytearray, strides)``  small tensor, bytes inline
   - ``(BLOCK_TENSOR, leaf, dtype_code, shape, offset, strides)``       in the block, at ``offset``
     (``strides`` is None for a contiguous tensor; else the bytes are the storage span it views)
   - ``(INLINE_ARRAY, leaf, dtype_str, shape, bytearray)``     small numpy array
   - ``(BLOCK_ARRAY, leaf, dtype_str, shape, offset)``          numpy array in the block
   - ``(REPEAT, leaf)``                                        the same object again

   Everything else (numbers, strings, containers, dataclasses, any object) is pickled normally, so
   every container type comes back as it was and arrays nested anywhere still travel zero-copy.
   Tensors that are not plain (nested, sparse, quantized, subclasses, ``Parameter``, requiring
   grad, on another device: ``mploader.channel.tensors``) go through ``ForkingPickler`` with
   torch's reductions, exactly as torch's workers send them.

Inline bytes are carried as ``bytearray`` so the tensors rebuilt from them are writable without
another copy; torch's own tensor pickling (slow, and per-tensor shared memory in workers) is never
used for plain leaves.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

import numpy as np
import torch

from mploader.channel.collate import PendingStack
from mploader.channel.shm.copier import SHARED_PARTS, SPLIT_BYTES, Copier, row_ranges
from mploader.channel.tensors import (
    is_plain,
    sharing_reductions_used,
    start_noting_sharing,
    torch_worker_dispatch_table,
)

FORMAT_VERSION = 2

INLINE_TENSOR = 0
BLOCK_TENSOR = 1
INLINE_ARRAY = 2
BLOCK_ARRAY = 3
REPEAT = 4

# Leaves in a block start at multiples of a cache line, which also satisfies every dtype.
_ALIGNMENT = 64

# Stacks at least this large are written row by row (one numpy copy a row) instead of by one
# torch.stack(out=): rows can be split over the copy threads.  One thread alone is no faster
# either way; two threads copying rows are.  Below it one stack call wins.  (Measured with 600 MB
# and with 32 x 3x224x224 stacks: see the performance page of the manual.)
_COPY_LOOP_BYTES = 64 << 20

# numpy kinds that travel as raw bytes: bool, signed, unsigned, float, complex.
_NUMERIC_KINDS = frozenset("biufc")


def _torch_dtype_table() -> list[tuple[torch.dtype, np.dtype, torch.dtype | None]]:
    """(torch dtype, numpy dtype of its bytes, torch dtype to view those bytes as, if different).

    numpy has no bfloat16, complex32 or float8 types; their bytes travel as integers of the same
    width and are viewed back. Sub-byte and quantized types are pickled instead.
    """
    table: list[tuple[torch.dtype, np.dtype, torch.dtype | None]] = []
    native = [
        torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
        torch.uint16, torch.uint32, torch.uint64, torch.float16, torch.float32, torch.float64,
        torch.complex64, torch.complex128,
    ]
    for dtype in native:
        numpy_dtype = np.dtype(str(dtype).removeprefix("torch."))
        table.append((dtype, numpy_dtype, None))
    surrogates = {
        "bfloat16": torch.int16, "complex32": torch.int32, "float8_e4m3fn": torch.uint8,
        "float8_e5m2": torch.uint8, "float8_e4m3fnuz": torch.uint8, "float8_e5m2fnuz": torch.uint8,
        "float8_e8m0fnu": torch.uint8, "float4_e2m1fn_x2": torch.uint8,
    }
    for name, surrogate in surrogates.items():
        exotic = getattr(torch, name, None)  # absent from older torch builds
        if isinstance(exotic, torch.dtype):
            numpy_dtype = np.dtype(str(surrogate).removeprefix("torch."))
            table.append((exotic, numpy_dtype, surrogate))
    return table


_TORCH_DTYPES = _torch_dtype_table()
_TORCH_DTYPE_CODES = {dtype: code for code, (dtype, _, _) in enumerate(_TORCH_DTYPES)}
_NUMPY_DTYPES: dict[str, np.dtype] = {}


def _numpy_dtype(dtype_str: str) -> np.dtype:
    dtype = _NUMPY_DTYPES.get(dtype_str)
    if dtype is None:
        dtype = _NUMPY_DTYPES[dtype_str] = np.dtype(dtype_str)
    return dtype


def _plain_tensor(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` can travel as raw bytes and come back as the same tensor."""
    return is_plain(tensor) and tensor.dtype in _TORCH_DTYPE_CODES


def _tensor_bytes_view(tensor: torch.Tensor) -> np.ndarray:
    """A numpy view of ``tensor``'s values (conj/neg resolved, exotic dtypes as integers)."""
    if tensor.is_conj():
        tensor = tensor.resolve_conj()
    if tensor.is_neg():
        tensor = tensor.resolve_neg()
    surrogate = _TORCH_DTYPES[_TORCH_DTYPE_CODES[tensor.dtype]][2]
    if surrogate is not None:
        tensor = tensor.view(surrogate)
    return tensor.numpy()


def _raw_bytes(array: np.ndarray) -> bytearray:
    """The values of ``array`` in C order, as a writable copy.

    Through its buffer (``array.data``): ``bytearray(array)`` of a 0-d integer array would call
    ``__index__`` and return that many zero bytes.
    """
    return bytearray(array.data)


def _block_tensor(base: np.ndarray, code: int, shape: tuple[int, ...], offset: int) -> torch.Tensor:
    """A tensor viewing ``base`` (the block's bytes) at ``offset``."""
    dtype, numpy_dtype, surrogate = _TORCH_DTYPES[code]
    nbytes = numpy_dtype.itemsize * _product(shape)
    tensor = torch.from_numpy(base[offset:offset + nbytes].view(numpy_dtype).reshape(shape))
    return tensor if surrogate is None else tensor.view(dtype)


def _storage_span(tensor: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...] | None]:
    """``tensor`` as the 1-D run of storage its view covers, plus its strides; or itself and
    ``None`` when it is contiguous.

    torch hands a non-contiguous tensor across processes with its storage and strides (a
    transposed view stays transposed, an expanded one keeps its zero strides); so do we, sending
    only the span of storage the view touches.  The rebuilt view starts at storage offset 0.
    """
    if tensor.is_contiguous() or tensor.numel() == 0:
        return tensor, None
    strides = tuple(tensor.stride())
    return tensor.as_strided((_span_length(tensor.shape, strides),), (1,)), strides


def _span_length(shape: tuple[int, ...], strides: tuple[int, ...]) -> int:
    """How many elements of storage a non-empty view of ``shape`` and ``strides`` spans."""
    return 1 + sum((size - 1) * stride for size, stride in zip(shape, strides, strict=True))


def _restride(value: torch.Tensor, shape: tuple[int, ...],
              strides: tuple[int, ...] | None) -> torch.Tensor:
    return value if strides is None else value.as_strided(shape, strides, 0)


def _product(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


class LeafEncoder(pickle.Pickler):
    """Pickles one batch, placing array leaves inline or at offsets of a (not yet chosen) block.

    Everything that is not a leaf is pickled with ``ForkingPickler``'s table and torch's
    reductions, as torch's worker result queue pickles a batch.

    After :meth:`encode`, ``block_bytes`` says how large a block the batch needs (0: none), and
    ``needs_sender`` whether a sharing reduction ran (see the module doc); the channel acquires a
    block and calls :meth:`fill` to copy (or stack) the leaves into it.
    """

    def __init__(self, inline_threshold: int) -> None:
        self._buffer = io.BytesIO()
        super().__init__(self._buffer, protocol=5)
        self.dispatch_table = torch_worker_dispatch_table()
        self._inline_threshold = inline_threshold
        # id(object) -> (leaf number, object); holding the object keeps its id from being reused
        # by a temporary (a small stack) while this batch is being pickled.
        self._leaf_of_object: dict[int, tuple[int, Any]] = {}
        self._copies: list[tuple[int, Any]] = []  # (offset, tensor | ndarray | PendingStack)
        self.block_bytes = 0
        self.inline_leaves = 0
        self.block_leaves = 0
        self.needs_sender = False

    def encode(self, batch: Any) -> bytes:
        start_noting_sharing()
        self.dump(batch)
        self.needs_sender = sharing_reductions_used()
        return self._buffer.getvalue()

    def fill(self, base: np.ndarray, copier: Copier | None = None, shared: bool = False) -> None:
        """Write every block leaf into ``base`` (the block's ``uint8`` array): one copy each,
        large ones split into row ranges over the ``copier``'s threads (``shared``: into
        ``SHARED_PARTS`` jobs, shared with the threads that help, see :class:`Copier`)."""
        copies, self._copies = self._copies, []
        threads = 1 if copier is None else SHARED_PARTS if shared else copier.threads
        for offset, source in copies:
            parts = threads if _leaf_bytes(source) >= SPLIT_BYTES else 1
            jobs = _copy_jobs(base, offset, source, parts)
            if copier is None:
                for job in jobs:
                    job()
            elif shared:
                copier.run_shared(jobs)
            else:
                copier.run(jobs)

    # -- persistent_id: the hook pickle calls for every object --------------------------------

    def persistent_id(self, obj: Any) -> Any:
        handler = _LEAF_HANDLERS.get(type(obj))
        return None if handler is None else handler(self, obj)

    def _tensor_leaf(self, tensor: torch.Tensor) -> tuple | None:
        if not _plain_tensor(tensor):
            return None  # pickled whole, as torch would
        leaf = self._repeat_or_new(tensor)
        if isinstance(leaf, tuple):
            return leaf
        code = _TORCH_DTYPE_CODES[tensor.dtype]
        shape = tuple(tensor.shape)
        if tensor.is_conj() or tensor.is_neg():
            tensor = tensor.resolve_conj().resolve_neg()
        span, strides = _storage_span(tensor)
        nbytes = span.numel() * span.element_size()
        if nbytes < self._inline_threshold or nbytes == 0:
            self.inline_leaves += 1
            raw = _raw_bytes(_tensor_bytes_view(span))
            return (INLINE_TENSOR, leaf, code, shape, raw, strides)
        return (BLOCK_TENSOR, leaf, code, shape, self._reserve(nbytes, span), strides)

    def _array_leaf(self, array: np.ndarray) -> tuple | None:
        if array.dtype.kind not in _NUMERIC_KINDS:
            return None  # strings, objects, structured, datetimes: pickled whole
        leaf = self._repeat_or_new(array)
        if isinstance(leaf, tuple):
            return leaf
        shape = array.shape
        if array.nbytes < self._inline_threshold or array.nbytes == 0:
            self.inline_leaves += 1
            return (INLINE_ARRAY, leaf, array.dtype.str, shape, _raw_bytes(array))
        return (BLOCK_ARRAY, leaf, array.dtype.str, shape, self._reserve(array.nbytes, array))

    def _pending_stack_leaf(self, pending: PendingStack) -> tuple | None:
        nbytes = pending.nbytes
        if nbytes < self._inline_threshold or nbytes == 0:
            return self._tensor_leaf(pending.stack())  # small: stacking is cheaper than checks
        if not pending.can_stack_into_block() or pending.dtype not in _TORCH_DTYPE_CODES:
            return None  # PendingStack.__reduce__ stacks it the ordinary way
        leaf = len(self._leaf_of_object)
        self._leaf_of_object[id(pending)] = (leaf, pending)
        code = _TORCH_DTYPE_CODES[pending.dtype]
        offset = self._reserve(nbytes, pending)
        return (BLOCK_TENSOR, leaf, code, pending.stacked_shape, offset, None)

    def _repeat_or_new(self, obj: Any) -> int | tuple:
        """The leaf number for ``obj``, or a REPEAT descriptor if it appeared before."""
        known = self._leaf_of_object.get(id(obj))
        if known is not None:
            return (REPEAT, known[0])
        leaf = len(self._leaf_of_object)
        self._leaf_of_object[id(obj)] = (leaf, obj)
        return leaf

    def _reserve(self, nbytes: int, source: Any) -> int:
        offset = -(-self.block_bytes // _ALIGNMENT) * _ALIGNMENT
        self.block_bytes = offset + nbytes
        self._copies.append((offset, source))
        self.block_leaves += 1
        return offset


def _leaf_bytes(source: Any) -> int:
    if isinstance(source, PendingStack | np.ndarray):
        return source.nbytes
    return source.numel() * source.element_size()


def _copy_jobs(base: np.ndarray, offset: int, source: Any, parts: int) -> list[Callable[[], None]]:
    """The copy of one leaf into ``base`` at ``offset``, as jobs over ``parts`` row ranges."""
    if isinstance(source, np.ndarray):
        destination = base[offset:offset + source.nbytes].view(source.dtype).reshape(source.shape)
        if source.ndim == 0:
            return [partial(_copy_array, destination, source, range(0))]
        return [partial(_copy_array, destination, source, rows)
                for rows in row_ranges(source.shape[0], parts)]
    if isinstance(source, PendingStack):
        out = _block_tensor(base, _TORCH_DTYPE_CODES[source.dtype], source.stacked_shape, offset)
        if source.nbytes < _COPY_LOOP_BYTES:
            return [partial(_stack, out, source.tensors)]
        return [partial(_copy_rows, out, source.tensors, rows)
                for rows in row_ranges(len(source.tensors), parts)]
    out = _block_tensor(base, _TORCH_DTYPE_CODES[source.dtype], source.shape, offset)
    if out.dim() == 0:
        return [partial(_copy_tensor, out, source, range(0))]
    return [partial(_copy_tensor, out, source, rows) for rows in row_ranges(out.shape[0], parts)]


def _copy_array(destination: np.ndarray, source: np.ndarray, rows: range) -> None:
    """``rows`` of ``source`` into ``destination`` (an empty range: the whole 0-d array)."""
    if not rows:
        np.copyto(destination, source, casting="no")
    else:
        np.copyto(destination[rows.start:rows.stop], source[rows.start:rows.stop], casting="no")


def _copy_tensor(out: torch.Tensor, source: torch.Tensor, rows: range) -> None:
    """``rows`` of ``source`` into ``out`` (an empty range: all of it), by numpy's copy: one
    600 MB float32 copy took 90 ms with ``Tensor.copy_`` and 48 ms with ``numpy.copyto`` here
    (glibc's memcpy, whose non-temporal stores do not read the destination first)."""
    destination, values = _tensor_bytes_view(out), _tensor_bytes_view(source)
    if not rows:
        np.copyto(destination, values, casting="no")
    else:
        np.copyto(destination[rows.start:rows.stop], values[rows.start:rows.stop],
                  casting="no")


def _stack(out: torch.Tensor, tensors: Any) -> None:
    torch.stack(tensors, 0, out=out)


def _copy_rows(out: torch.Tensor, tensors: Any, rows: range) -> None:
    """Rows of a large stack, each one numpy copy of its tensor's values: ``Tensor.copy_``
    costs microseconds more a call, most of it holding the GIL, which the copy threads share
    (1,000 rows of 250 x 602 float32 on two threads: 64 ms with ``copy_``, 47 ms so)."""
    destination = _tensor_bytes_view(out)
    for row in rows:
        np.copyto(destination[row], _tensor_bytes_view(tensors[row]), casting="no")


# Looked up by exact type (subclasses are pickled whole). Plain functions, not bound methods kept
# on the encoder: those would form a reference cycle that keeps every encoder, and the batch it
# holds, alive until the cyclic garbage collector happens to run (600 MB batches piled up).
_LEAF_HANDLERS: dict[type, Callable[[LeafEncoder, Any], tuple | None]] = {
    torch.Tensor: LeafEncoder._tensor_leaf,
    np.ndarray: LeafEncoder._array_leaf,
    PendingStack: LeafEncoder._pending_stack_leaf,
}


class LeafDecoder(pickle.Unpickler):
    """Reads a payload: :meth:`envelope` first, then :meth:`batch` with views on ``base``."""

    def __init__(self, payload: bytes | bytearray | memoryview) -> None:
        super().__init__(io.BytesIO(payload))
        self._base: np.ndarray | None = None
        self._leaves: dict[int, Any] = {}

    def envelope(self) -> Envelope:
        fields = self.load()
        if not isinstance(fields, tuple) or fields[0] != FORMAT_VERSION:
            raise ValueError(f"not a mploader shared-memory message (envelope {fields!r:.80})")
        _, worker_pid, block, retired, statistics, needs_sender = fields
        return Envelope(worker_pid, None if block is None else BlockRef(*block), retired,
                        statistics, needs_sender)

    def batch(self, base: np.ndarray | None) -> Any:
        """The batch; block leaves become views on ``base`` (the block's bytes for this batch)."""
        self._base = base
        return self.load()

    def persistent_load(self, pid: Any) -> Any:
        """Rebuild one leaf from its descriptor (field names as in the module docstring)."""
        kind, leaf = pid[0], pid[1]
        if kind == REPEAT:
            return self._leaves[leaf]
        if kind == INLINE_TENSOR:
            _, _, dtype_code, shape, raw, strides = pid
            dtype, numpy_dtype, surrogate = _TORCH_DTYPES[dtype_code]
            values = np.frombuffer(raw, numpy_dtype)
            value: Any = torch.from_numpy(values if strides else values.reshape(shape))
            if surrogate is not None:
                value = value.view(dtype)
            value = _restride(value, shape, strides)
        elif kind == BLOCK_TENSOR:
            _, _, dtype_code, shape, offset, strides = pid
            base = self._block_base()
            if strides is None:
                value = _block_tensor(base, dtype_code, shape, offset)
            else:
                span = _span_length(shape, strides)
                flat = _block_tensor(base, dtype_code, (span,), offset)
                value = _restride(flat, shape, strides)
        elif kind == INLINE_ARRAY:
            _, _, dtype_text, shape, raw = pid
            value = np.frombuffer(raw, _numpy_dtype(dtype_text)).reshape(shape)
        elif kind == BLOCK_ARRAY:
            _, _, dtype_text, shape, offset = pid
            array_dtype = _numpy_dtype(dtype_text)
            nbytes = array_dtype.itemsize * _product(shape)
            value = self._block_base()[offset:offset + nbytes].view(array_dtype).reshape(shape)
        else:
            raise pickle.UnpicklingError(f"unknown leaf descriptor {pid!r:.80}")
        self._leaves[leaf] = value
        return value

    def _block_base(self) -> np.ndarray:
        if self._base is None:
            raise pickle.UnpicklingError("a block leaf in a message that names no block")
        return self._base


class BlockRef(NamedTuple):
    """The block a payload's large leaves are in, and which use of it (``generation``)."""

    block_id: int
    generation: int
    size: int  # the block's
    used_bytes: int  # the batch's, from the block's start


class Envelope(NamedTuple):
    """The first pickle of a payload, read by :meth:`LeafDecoder.envelope` (a plain tuple on
    the wire, behind ``FORMAT_VERSION``)."""

    worker_pid: int
    block: BlockRef | None  # None: every leaf is inline
    retired: tuple[int, ...]  # block ids the worker evicted since its last payload
    statistics: tuple  # the worker's PoolStatistics, as a tuple in its field order
    needs_sender: bool  # holds storages shared by the worker: decode while it lives


def encode_envelope(
    worker_pid: int,
    block: BlockRef | None,
    retired: tuple[int, ...],
    statistics: tuple,
    needs_sender: bool,
) -> bytes:
    """The first pickle of a payload (:class:`Envelope`'s fields), written without memo entries.

    The decoder reads the envelope and the batch with one Unpickler, whose memo indices keep
    counting across ``load()`` calls; an envelope that memoized anything would shift the batch's
    memo references. ``fast`` mode writes no memo at all (the envelope has no shared objects).
    """
    buffer = io.BytesIO()
    pickler = pickle.Pickler(buffer, protocol=5)
    pickler.fast = True
    wire_block = None if block is None else tuple(block)  # no class reference on the wire
    pickler.dump((FORMAT_VERSION, worker_pid, wire_block, retired, statistics, needs_sender))
    return buffer.getvalue()
