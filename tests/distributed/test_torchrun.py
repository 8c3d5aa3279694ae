"""Two ranks under torchrun (gloo, CPU), each with mploader workers: together they see every
index exactly once per epoch (DistributedSampler with drop_last=True drops the remainder)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def torchrun(script: str, *arguments: str) -> None:
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
         "--master_port=0", "--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0",
         str(Path(__file__).with_name(script)), *arguments],
        capture_output=True, text=True, timeout=180, env=environment,
    )
    assert result.returncode == 0, result.stderr[-3000:]


def test_two_ranks_see_every_index_once(tmp_path: Path) -> None:
    output = tmp_path / "ranks.json"
    torchrun("ranks.py", str(output))
    report = json.loads(output.read_text())
    per_rank = report["length"] // report["world"]
    for gathered in report["epochs"]:
        assert [len(seen) for seen in gathered] == [per_rank, per_rank]
        everything = [index for seen in gathered for index in seen]
        assert len(everything) == len(set(everything)) == per_rank * report["world"]
        assert set(everything) <= set(range(report["length"]))
    assert report["epochs"][0] != report["epochs"][1]  # set_epoch reshuffles


def test_each_rank_resumes_its_own_state_in_new_processes(tmp_path: Path) -> None:
    """Every rank saves its loader's state mid-epoch; a second torchrun loads each rank's own
    state: each rank's rest equals its uninterrupted run, worker-side draws included."""
    torchrun("resume_ranks.py", "first", str(tmp_path))
    torchrun("resume_ranks.py", "second", str(tmp_path))
    remaining = []
    for rank in range(2):
        first = json.loads((tmp_path / f"first_{rank}.json").read_text())
        rest = json.loads((tmp_path / f"second_{rank}.json").read_text())["rest"]
        expected = first["expected"]
        assert first["seen"] + rest[0] == expected[0]
        assert rest[1] == expected[1]
        remaining.append({item[0] for batch in rest[0] for item in batch})
    assert not remaining[0] & remaining[1]  # the ranks' shards stay disjoint
