"""Frozen snapshots of the channel's counters (worker pools and the main side)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PoolStatistics:
    """One worker's pool, as of its latest message.

    blocks/bytes: blocks currently held and their total size; blocks_in_use: of those, handed out
    and not yet released; reuse_hits/reuse_misses: batches that found a free block / had to create
    one; evictions: free blocks removed to make room for another size class; spills: blocks
    created beyond the budget because every block was held by a batch (in flight, or kept by the
    consumer)
    """

    worker_id: int
    worker_pid: int
    budget_bytes: int
    blocks: int
    bytes: int
    blocks_in_use: int
    reuse_hits: int
    reuse_misses: int
    evictions: int
    inline_leaves: int
    shm_leaves: int
    messages: int
    stale_releases: int
    spills: int

    @classmethod
    def from_tuple(cls, values: tuple) -> PoolStatistics:
        """From the compact form every message carries (the fields in order)."""
        return cls(*values)


@dataclass(frozen=True)
class ChannelStatistics:
    """The main side: per-worker pools as last reported, plus what the main process maps.

    mapped_blocks/mapped_bytes: blocks this process keeps mapped in its cache; live_batches: batches
    decoded into blocks whose views are still referenced (their blocks not yet released; counted
    from the set of live leases, so it can neither drift nor go negative); decodes/discards:
    messages handled; releases: decoded batches whose last view died (a discarded payload was never
    held and is not one).
    """

    workers: tuple[PoolStatistics, ...]
    mapped_blocks: int
    mapped_bytes: int
    live_batches: int
    decodes: int
    discards: int
    releases: int
