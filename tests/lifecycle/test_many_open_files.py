"""A process with more than 1023 open files still starts and watches spawn/forkserver workers.

Training processes hold many descriptors (and torch's default ``file_descriptor`` sharing keeps
one open per received shared tensor); ``select()`` refuses descriptors above 1023, so the zygote's
waits must not use it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

import mploader

FILLER = 1100  # descriptors opened first, so every new one is numbered above 1023


@pytest.fixture
def many_open_files() -> Iterator[None]:
    fds = [os.open(os.devnull, os.O_RDONLY) for _ in range(FILLER)]
    try:
        yield
    finally:
        for fd in fds:
            os.close(fd)


@pytest.mark.usefixtures("many_open_files")
@pytest.mark.parametrize("start_method", ["spawn", "forkserver"])
def test_workers_with_descriptors_above_1023(start_method: str) -> None:
    loader = mploader.DataLoader(list(range(6)), batch_size=2, num_workers=2,
                                 multiprocessing_context=start_method)
    assert [batch.tolist() for batch in loader] == [[0, 1], [2, 3], [4, 5]]
