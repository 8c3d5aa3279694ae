"""The user-facing knobs of the shared-memory channel, and the one resolver of ``shared_memory=``.

A leaf module: it imports nothing from the package, so the public face, the iterator and the
channel can all read it without importing the channel itself.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

SHM_DIRECTORY = "/dev/shm"

# Default budget: a quarter of the tmpfs, at most 8 GiB. A quarter leaves room for other loaders,
# torch's own shared tensors and other programs; 8 GiB holds 12 blocks of the 600 MB batches that
# motivated the pool, far more than prefetching needs. On a 64 MiB Docker /dev/shm this gives
# 16 MiB; pass a budget explicitly (and --shm-size) for big batches there.
_DEFAULT_BUDGET_FRACTION = 4
_DEFAULT_BUDGET_CAP = 8 << 30

# Leaves smaller than this travel inside the message. Measured with `benchmarks/shm_micro.py
# crossover` (a worker process, a Pipe, one float32 tensor per batch, round trip per batch, 2-core
# machine): inline costs grow with the bytes (they are copied into the pickle, through the pipe
# and out again), a block costs the same whatever its size (pool bookkeeping, a lease and its
# finalizer, the release); they crossed near 9 KiB (the figures: the performance page of the
# manual). We take 16 KiB because a real release costs one more write on the task pipe
# than the benchmark's piggy-backed one, which moves the crossover up. The small workloads'
# batches (one int64, one 64x10 float32 = 2.5 KiB) stay inline.
DEFAULT_INLINE_THRESHOLD = 16 << 10

# Smallest block. Every batch above the inline threshold but below 1 MiB shares this one size
# class, so batches of slightly varying size reuse the same blocks; reserving 1 MiB per block costs
# little, and once (the performance page of the manual).
DEFAULT_MIN_BLOCK_BYTES = 1 << 20

_PAGE = 4096


@dataclass(frozen=True)
class SharedMemoryConfig:
    """How the pooled shared-memory channel may use ``/dev/shm``.

    Pass it as ``DataLoader(shared_memory=SharedMemoryConfig(...))``; a field that is out of
    range is a ``ValueError`` here, when the config is made.

    Attributes:
        budget_bytes: total bytes of blocks across all workers of one loader (each worker gets an
            even share). ``None`` means a quarter of the ``/dev/shm`` tmpfs, at most 8 GiB. When
            every block is held by a batch (in flight, or kept by the consumer), a worker goes
            over budget at once, with one ``RuntimeWarning``, rather than wait, and gives the
            memory back as batches are dropped.
        inline_threshold: array leaves with fewer bytes travel inside the message instead of a
            block (default 16 KiB).
        min_block_bytes: the smallest block size class (a power of two, at least 4096; default
            1 MiB).
    """

    budget_bytes: int | None = None
    inline_threshold: int = DEFAULT_INLINE_THRESHOLD
    min_block_bytes: int = DEFAULT_MIN_BLOCK_BYTES

    def __post_init__(self) -> None:
        if self.budget_bytes is not None and (
            not isinstance(self.budget_bytes, int) or self.budget_bytes <= 0
        ):
            raise ValueError(
                f"budget_bytes must be a positive int or None, got {self.budget_bytes!r}"
            )
        if not isinstance(self.inline_threshold, int) or self.inline_threshold < 0:
            raise ValueError(
                f"inline_threshold must be a non-negative int, got {self.inline_threshold!r}"
            )
        size = self.min_block_bytes
        if not isinstance(size, int) or size < _PAGE or size & (size - 1):
            raise ValueError(f"min_block_bytes must be a power of two >= {_PAGE}, got {size!r}")

    def effective_budget_bytes(self) -> int:
        """``budget_bytes``, or the default computed from the size of ``/dev/shm`` now."""
        if self.budget_bytes is not None:
            return self.budget_bytes
        return min(tmpfs_total_bytes() // _DEFAULT_BUDGET_FRACTION, _DEFAULT_BUDGET_CAP)


def tmpfs_total_bytes() -> int:
    """Size of the ``/dev/shm`` tmpfs."""
    stats = os.statvfs(SHM_DIRECTORY)
    return stats.f_blocks * stats.f_frsize


def resolve_shared_memory(option: bool | SharedMemoryConfig) -> SharedMemoryConfig | None:
    """Turn ``DataLoader(shared_memory=...)`` into a config (``None`` = plain pickling)."""
    if isinstance(option, SharedMemoryConfig):
        return option
    if option is True:
        return SharedMemoryConfig()
    if option is False:
        return None
    raise TypeError(
        f"shared_memory must be True, False or a mploader.SharedMemoryConfig, "
        f"got {type(option).__name__}: {option!r}"
    )
