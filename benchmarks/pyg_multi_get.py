"""Per-batch cost of ``NebulaFeatureStore.multi_get_tensor`` against one FETCH per attribute.

    PYTHONPATH=. .venv/bin/python benchmarks/pyg_multi_get.py [--latency-ms 5] [--repeats 15]

1,024 nodes x 128 float32 features plus an integer label, from the bundled graphd: one FETCH
for both attributes (``multi_get_tensor``) against PyG's loop over ``_get_tensor`` as nebula-pyg
does (one FETCH per attribute), alternating A B A B; medians.  Not part of the test suite.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
from torch_geometric.data import TensorAttr

from mploader.integrations.nebula import NebulaHooks
from mploader.integrations.nebula.pyg import (
    FEATURES,
    INT,
    NebulaFeatureStore,
    NodeAttribute,
    homogeneous_schema,
)
from nebula_testing import citation
from nebula_testing.nebula_process import start_server_process

NODES, DIM, BATCH = 4096, 128, 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency-ms", type=float, default=5.0)
    parser.add_argument("--repeats", type=int, default=15)
    arguments = parser.parse_args()
    graph = citation.make_citation_graph(NODES, DIM, 7, seed=0)
    with start_server_process(preload="citation", nodes=NODES, feature_dim=DIM, classes=7,
                              latency_ms=arguments.latency_ms) as server:
        hooks = NebulaHooks(server.address, space=citation.CITATION_SPACE)
        schema = homogeneous_schema(
            "paper", {"x": NodeAttribute("feat", FEATURES, DIM), "y": NodeAttribute("label", INT)},
            "cites", num_nodes=NODES,
        )
        store = NebulaFeatureStore(schema, hooks)
        rng = np.random.default_rng(0)
        batched, per_attribute = [], []
        for _ in range(arguments.repeats):
            index = torch.from_numpy(rng.choice(NODES, BATCH, replace=False))
            attrs = [TensorAttr("paper", "x", index), TensorAttr("paper", "y", index)]
            start = time.perf_counter()
            x, y = store.multi_get_tensor(attrs)
            batched.append(time.perf_counter() - start)
            start = time.perf_counter()
            x2, y2 = (store.get_tensor(attr) for attr in attrs)  # one FETCH each
            per_attribute.append(time.perf_counter() - start)
            assert torch.equal(x, torch.from_numpy(graph.features[index.numpy()]))
            assert torch.equal(x, x2) and torch.equal(y, y2)
        one, each = statistics.median(batched), statistics.median(per_attribute)
        print(f"{BATCH} nodes x {DIM} float32 + label, {arguments.latency_ms:g} ms per query, "
              f"median of {arguments.repeats}:")
        print(f"  multi_get_tensor (one FETCH):      {one * 1000:7.1f} ms")
        print(f"  one FETCH per attribute (2):       {each * 1000:7.1f} ms  ({each / one:.2f}x)")
        store.close()


if __name__ == "__main__":
    main()
