"""The keys of torchdata's ``StatefulDataLoader`` states, which mploader's states share.

torchdata 0.11 (``stateful_dataloader/stateful_dataloader.py``, ``incremental_state.py``,
``sampler.py``) writes them, and a checkpoint moves between its loader and mploader's because
both use them with the same meaning (``mploader.iterator.resume_format``, docs/guide/resume.md).
Some are also torch's private attribute names (``_IterableDataset_len_called``): here they are
keys of a dict, not attributes.  ``tests/resume/test_torchdata_crossing.py`` checks them against
the installed torchdata.
"""

from __future__ import annotations

# num_workers=0: at the top level; with workers: in _snapshot's _main_snapshot
INDEX_SAMPLER_STATE = "_index_sampler_state"
SAMPLER_ITER_STATE = "_sampler_iter_state"
SAMPLER_ITER_YIELDED = "_sampler_iter_yielded"
LENGTH_SEEN = "_IterableDataset_len_called"
SHARED_SEED = "_shared_seed"
NUM_YIELDED = "_num_yielded"  # num_workers=0 only
ITERATOR_FINISHED = "_iterator_finished"

# with workers
SNAPSHOT = "_snapshot"
SNAPSHOT_STEP = "_snapshot_step"
LAST_YIELDED_WORKER_ID = "_last_yielded_worker_id"
MAIN_SNAPSHOT = "_main_snapshot"
WORKER_SNAPSHOTS = "_worker_snapshots"
STEPS_SINCE_SNAPSHOT = "_steps_since_snapshot"
NUM_WORKERS = "_num_workers"
BASE_SEED = "_base_seed"

# one worker's entry (or the main process's, at the top level with num_workers=0)
WORKER_ID = "worker_id"
FETCHER_STATE = "fetcher_state"
DATASET_STATE = "dataset_state"
DATASET_ITER_STATE = "dataset_iter_state"
FETCHER_ENDED = "fetcher_ended"

# the iterator of torchdata's BatchSampler, and of its RandomSampler
SAMPLES_YIELDED = "samples_yielded"
SAMPLER_STATE = "sampler_state"
INNER_ITER_STATE = "sampler_iter_state"
SHUFFLE_YIELDED = "yielded"
SHUFFLE_GENERATOR = "generator"


def worker_key(worker_id: int) -> str:
    return f"worker_{worker_id}"
