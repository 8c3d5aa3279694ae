"""torchdata's ``StatefulDataLoader`` for the side-by-side resume tests (a test module that
imports this is skipped where torchdata is missing), and the warnings its iterator gives."""

from __future__ import annotations

import pytest

stateful_dataloader = pytest.importorskip("torchdata.stateful_dataloader")
StatefulDataLoader = stateful_dataloader.StatefulDataLoader
StatefulDistributedSampler = pytest.importorskip(
    "torchdata.stateful_dataloader.sampler").StatefulDistributedSampler

# torchdata's own iterator warns about torch APIs it uses; not ours to fix
IGNORE_TORCHDATA_WARNINGS = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore:'set_vital' is deprecated"),
]
