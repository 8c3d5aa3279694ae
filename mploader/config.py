"""The user-facing knobs of the shared-memory channel, and the one resolver of ``shared_memory=``.

A leaf module: it imports nothing from the package but the leaf ``memory`` (for the default
budget), so the public face, the iterator and the channel can all read it without importing the
channel itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from mploader.memory import MemoryLimit, job_memory

# Default budget: half of the memory the job may use (mploader.memory.job_memory(): the memory
# cgroup's limit, or MemAvailable), at most 8 GiB. Blocks are anonymous memory files, charged to
# the memory cgroup like any other memory and not to /dev/shm, so the budget follows the job's
# memory. Why half: a batch is refused (BatchTooLargeError) only when it is larger than its
# worker's share, budget / num_workers (the pool makes an exact block when the batch's size
# class, up to 1.25x the batch, does not fit the share). torch's own loader, in the same cgroup,
# holds up to prefetch_factor * num_workers + 1 batches in shared memory at once, so with the
# default prefetch_factor of 2 any loader torch's runs within a limit L has
# (2 * num_workers + 1) * batch <= L, hence batch <= L / (2 * num_workers): the share of half of
# L. The other half stays for the dataset, the model and the process itself. 8 GiB holds 12
# blocks of the 600 MB batches that motivated the pool, far more than prefetching needs.
_DEFAULT_BUDGET_FRACTION = 2
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
    """How the pooled shared-memory channel may use shared memory.

    Pass it as ``DataLoader(shared_memory=SharedMemoryConfig(...))``; a field that is out of
    range is a ``ValueError`` here, when the config is made.

    Attributes:
        budget_bytes: total bytes of blocks across all workers of one loader (each worker gets an
            even share). ``None`` means half of the memory the job may use (its memory cgroup's
            limit, or the machine's available memory, whichever is smaller), at most 8 GiB: any
            loader torch's own would run in that memory, with the default ``prefetch_factor``
            of 2, fits (see :meth:`effective_budget`). When every block is held by a batch (in
            flight, or kept by the consumer), a worker goes over budget at once, with one
            ``RuntimeWarning``, rather than wait, and gives the memory back as batches are
            dropped.
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

    def effective_budget(self) -> BudgetChoice:
        """The budget and where it came from: ``budget_bytes``, or the default computed now.

        The default is half of :func:`mploader.memory.job_memory` (the memory cgroup's limit, or
        ``MemAvailable``), at most 8 GiB. Half, because a batch is refused only when it exceeds
        its worker's share (``budget / num_workers``; the pool makes an exact block when the size
        class, up to 1.25x the batch, does not fit), while torch's own loader holds up to
        ``prefetch_factor * num_workers + 1`` batches of shared memory at once: with the default
        ``prefetch_factor`` of 2, any loader torch's runs within a limit fits half of it. The
        other half stays for the dataset, the model and the process.
        """
        if self.budget_bytes is not None:
            return BudgetChoice(self.budget_bytes,
                                f"SharedMemoryConfig(budget_bytes={self.budget_bytes})")
        memory = job_memory()
        return BudgetChoice(
            min(memory.bytes // _DEFAULT_BUDGET_FRACTION, _DEFAULT_BUDGET_CAP),
            f"half of {_with_size(memory)}, at most {_DEFAULT_BUDGET_CAP >> 30} GiB",
        )

    def effective_budget_bytes(self) -> int:
        """``effective_budget().bytes``: ``budget_bytes``, or the default computed now."""
        return self.effective_budget().bytes


@dataclass(frozen=True)
class BudgetChoice:
    """A loader's shared-memory budget in ``bytes``, and the ``reason`` for it, written for an error
    message: ``"SharedMemoryConfig(budget_bytes=...)"``, or for the default, for example ``"half of
    the memory cgroup's limit of 2.0 GiB (/sys/fs/cgroup/memory/x/memory.limit_in_bytes), at most
    8 GiB"``."""

    bytes: int
    reason: str


def _with_size(memory: MemoryLimit) -> str:
    """``"the memory cgroup's limit (/path)"`` of 2 GiB -> ``"the memory cgroup's limit of 2.0 GiB
    (/path)"``: the size goes before the place a source names in parentheses."""
    size = f"{memory.bytes / (1 << 30):.1f} GiB"
    what, parenthesis, where = memory.source.partition(" (")
    if not parenthesis:
        return f"{memory.source}, {size}"
    return f"{what} of {size} ({where}"


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
