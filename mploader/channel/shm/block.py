"""One shared-memory block: create (worker), open (main), map, and unmap when unused.

A block is an anonymous memory file (``memfd_create``): shared memory like a ``/dev/shm`` file,
but not counted against that mount's size (a container's is 64 MB), with no name anyone else can
open or that can be left behind; it is gone once its last descriptor and mapping are.  The worker
that creates it hands the descriptor to the main process (``mploader.channel.shm.passage``) and
closes its own; the main process keeps one per block it maps (:func:`open_block`), which lets it
hand the block to the next generation of workers (a new epoch without persistent workers, a
restarted worker; ``mploader.channel.shm.handover``).  The memory stays mapped, and the
descriptor open, until the :class:`Mapping` object and every numpy array built on it are gone.

We map with libc's ``mmap`` through ctypes rather than Python's ``mmap`` module, which keeps a
duplicate file descriptor open for every mapping (until Python 3.13's ``trackfd=False``).

Blocks are reserved with ``posix_fallocate`` before they are used, so that a machine or memory
cgroup without the memory fails at creation (:class:`SharedMemoryFullError`), not later while
writing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import mmap
import os
import weakref
from collections.abc import Callable

import numpy as np

from mploader.channel.shm.errors import SharedMemoryFullError
from mploader.memory import available_memory

# madvise(MADV_POPULATE_WRITE) (Linux 5.14+) faults in every page of a fresh block in one call,
# measured cheaper than letting the first copy fault each page (the figures: the performance
# page of the manual, "Figures behind the code's choices").
_MADV_POPULATE_WRITE = 23
_MADV_POPULATE_READ = 22  # for blocks whose pages exist: see populate()
# Populated this much at a time (see _populate_in_chunks): about a millisecond per call.
_POPULATE_CHUNK_BYTES = 8 << 20

_PROTECTION = mmap.PROT_READ | mmap.PROT_WRITE

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [
    ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long,
]
_libc.munmap.restype = ctypes.c_int
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.madvise.restype = ctypes.c_int
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_MAP_FAILED = ctypes.c_void_p(-1).value


class Mapping:
    """A mapped block; numpy arrays made with ``np.asarray(mapping)`` keep it mapped.

    The object exposes ``__array_interface__``, so arrays built on it hold it as their base; when
    the last such array and the last Python reference are gone, a finalizer unmaps the memory.
    """

    __slots__ = ("__array_interface__", "__weakref__", "address", "descriptor", "last_used",
                 "size")

    def __init__(self, address: int, size: int, descriptor: int = -1) -> None:
        self.address = address
        self.size = size
        self.descriptor = descriptor  # -1: none kept
        # When it last carried a batch to the consumer (the main process's clock, shared by a
        # loader's channels: mploader.channel.shm.channel); 0: never.
        self.last_used = 0
        self.__array_interface__ = {
            "shape": (size,), "typestr": "|u1", "data": (address, False), "version": 3,
        }
        finalizer = weakref.finalize(self, _unmap, address, size, descriptor)
        finalizer.atexit = False  # the process's exit unmaps everything anyway

    def array(self) -> np.ndarray:
        """A writable ``uint8`` array over the whole block."""
        return np.asarray(self)


def create_block(size: int, label: str, hand_over: Callable[[int], None]) -> Mapping:
    """Create an anonymous memory file of ``size`` bytes, reserve and map it, and fault its
    pages in.  ``hand_over(descriptor)`` sends it to the main process before it is closed here
    (``label`` names it in ``/proc/<pid>/maps`` as ``/memfd:<label>``).

    Raises :class:`SharedMemoryFullError` when the memory the job may use (the memory cgroup's
    limit, ``MemAvailable``) cannot hold ``size`` more bytes: checked first, then enforced by
    ``posix_fallocate``.
    """
    available = available_memory()
    if size > available.bytes:
        raise SharedMemoryFullError.for_block(size, available)
    descriptor = os.memfd_create(label, os.MFD_CLOEXEC)
    try:
        os.ftruncate(descriptor, size)
        try:
            os.posix_fallocate(descriptor, 0, size)
        except OSError as error:
            if error.errno in (errno.ENOSPC, errno.ENOMEM, errno.EFBIG):
                raise SharedMemoryFullError.for_block(size, available_memory()) from error
            raise
        mapping = _map(descriptor, size, populate=False)
        hand_over(descriptor)
    finally:
        os.close(descriptor)
    # Best effort: on kernels without MADV_POPULATE_WRITE the first copy faults the pages instead.
    _populate_in_chunks(mapping.address, size, _MADV_POPULATE_WRITE)
    return mapping


def _unmap(address: int, size: int, descriptor: int) -> None:
    _libc.munmap(address, size)
    if descriptor >= 0:
        os.close(descriptor)


def populate(mapping: Mapping) -> None:
    """Fill the page tables of a block whose pages exist already (a handed block, in the worker
    it was handed to), so that the copies into it take no page faults.  Best effort.

    Read faults, not write faults: the block is a shared mapping of tmpfs pages that exist, so
    a read fault maps the page writable, and the kernel maps the neighbouring pages of a read
    fault with it (fault-around, 16 pages by default); a write fault maps one page.  Measured:
    the performance page of the manual, "Figures behind the code's choices".
    """
    _populate_in_chunks(mapping.address, mapping.size, _MADV_POPULATE_READ)


def _populate_in_chunks(address: int, size: int, advice: int) -> None:
    """``madvise(advice)`` over the range, one chunk per call: a call holds the process's
    ``mmap_lock`` for its whole range, and every ``mmap``, heap growth and thread start of the
    process waits for it (one call over a 1 GiB block stalled an ``mmap`` 91 of its 97 ms)."""
    for offset in range(0, size, _POPULATE_CHUNK_BYTES):
        _libc.madvise(address + offset, min(_POPULATE_CHUNK_BYTES, size - offset), advice)


def map_descriptor(descriptor: int, size: int) -> Mapping:
    """Map the block open on ``descriptor`` (handed over by the main process) and close the
    descriptor.  The page tables are left for :func:`populate`."""
    try:
        return _map(descriptor, size, populate=False)
    finally:
        os.close(descriptor)


def open_block(descriptor: int, size: int) -> Mapping:
    """Map a block a worker created and sent (the main process's side), keeping ``descriptor``
    (closed when unmapped), so that the block can be handed to another worker later."""
    try:
        # MAP_POPULATE: fault the whole block in now, once; it is reused for many batches.
        return _map(descriptor, size, populate=True, keep_descriptor=True)
    except BaseException:
        os.close(descriptor)
        raise


def _map(descriptor: int, size: int, populate: bool, keep_descriptor: bool = False) -> Mapping:
    """Map ``descriptor``; with ``keep_descriptor`` the mapping owns it (closed when unmapped)."""
    flags = mmap.MAP_SHARED | (mmap.MAP_POPULATE if populate else 0)
    address = _libc.mmap(None, size, _PROTECTION, flags, descriptor, 0)
    if address is None or address == _MAP_FAILED:
        code = ctypes.get_errno()
        reason = os.strerror(code)
        raise OSError(code, f"mmap of a {size}-byte shared-memory block failed: {reason}")
    return Mapping(address, size, descriptor if keep_descriptor else -1)
