"""Two ranks under torchrun (gloo, CPU), each with mploader workers: together they see every
index exactly once per epoch (DistributedSampler with drop_last=True drops the remainder)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def test_two_ranks_see_every_index_once(tmp_path: Path) -> None:
    output = tmp_path / "ranks.json"
    script = Path(__file__).with_name("ranks.py")
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
         "--master_port=0", "--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0",
         str(script), str(output)],
        capture_output=True, text=True, timeout=180, env=environment,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(output.read_text())
    per_rank = report["length"] // report["world"]
    for gathered in report["epochs"]:
        assert [len(seen) for seen in gathered] == [per_rank, per_rank]
        everything = [index for seen in gathered for index in seen]
        assert len(everything) == len(set(everything)) == per_rank * report["world"]
        assert set(everything) <= set(range(report["length"]))
    assert report["epochs"][0] != report["epochs"][1]  # set_epoch reshuffles
