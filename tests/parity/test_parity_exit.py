"""What a worker's exit runs is what torch's worker's exit runs, under every start method.

multiprocessing ends a worker it started by running the process's exit handling:
``multiprocessing.util.Finalize`` callbacks (the ones a library registers in the worker to let go
of what it holds at exit), and, from Python 3.13, the ``atexit`` handlers registered in the
worker.  mploader's spawn and forkserver workers are forked by its zygote, which runs them as
multiprocessing's forked children are run (``mploader.compat.cpython.run_process_here``).
"""

from __future__ import annotations

import atexit
import multiprocessing.util
import sys
from pathlib import Path

import pytest
import torch.utils.data

import mploader

from .datasets import TensorItems


def _touch(path: Path) -> None:
    path.touch()


class NoteExit:
    """worker_init_fn: what the worker's exit runs leaves a file each."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def __call__(self, worker_id: int) -> None:
        multiprocessing.util.Finalize(None, _touch, args=(self.folder / f"finalize-{worker_id}",),
                                      exitpriority=0)
        atexit.register(_touch, self.folder / f"atexit-{worker_id}")


def _exit_ran(loader_class: type, folder: Path, start_method: str) -> list[str]:
    folder.mkdir()
    loader = loader_class(TensorItems(4), batch_size=2, num_workers=2,
                          multiprocessing_context=start_method, worker_init_fn=NoteExit(folder))
    iterator = iter(loader)
    workers = list(iterator._workers)
    assert len(list(iterator)) == 2
    for worker in workers:
        worker.join(30)
    assert [worker.exitcode for worker in workers] == [0, 0]
    ran = sorted(path.name for path in folder.iterdir())
    if sys.version_info < (3, 13):
        # Up to 3.12 a forked child's exit runs no atexit handler; a spawned torch worker is a
        # whole interpreter that runs them, where mploader's zygote forks the worker.
        ran = [name for name in ran if not name.startswith("atexit-")]
    return ran


def test_a_worker_s_exit_runs_what_torch_s_runs(start_method: str, tmp_path: Path) -> None:
    torch_s = _exit_ran(torch.utils.data.DataLoader, tmp_path / "torch", start_method)
    mploader_s = _exit_ran(mploader.DataLoader, tmp_path / "mploader", start_method)
    assert mploader_s == torch_s
    assert {"finalize-0", "finalize-1"} <= set(mploader_s)


@pytest.mark.skipif(sys.version_info < (3, 13), reason="from 3.13, a forked child runs atexit")
def test_a_worker_s_exit_runs_its_atexit_handlers(start_method: str, tmp_path: Path) -> None:
    assert _exit_ran(mploader.DataLoader, tmp_path / "mploader", start_method) == [
        "atexit-0", "atexit-1", "finalize-0", "finalize-1"]
