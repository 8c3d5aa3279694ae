"""A deterministic synthetic citation graph, the data set of the NebulaGraph tests and demo.

The test server preloads it (``--preload citation``) and tests compute the expected answers from
the same function, without a server.  Shape, in NebulaGraph terms::

    space   citation           (vid_type = INT64), vids 0 .. num_nodes-1
    tag     paper(feat string, label int)
    edge    cites()            node i cites up to ``cites_per_node`` distinct earlier nodes

``feat`` holds the float32 feature vector encoded with
:func:`mploader.integrations.nebula.encode_features` (base64 of little-endian float32 bytes),
because a NebulaGraph property cannot hold a list.  Labels are learnable from the features and,
better, from the neighbourhood, but not perfectly (see :func:`make_citation_graph`).

Only numpy is needed here (no nebula3), so the demo can import it anywhere.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from mploader.integrations.nebula import encode_features

CITATION_SPACE = "citation"
PAPER_TAG = "paper"
FEATURE_PROP = "feat"
LABEL_PROP = "label"
CITES_EDGE = "cites"
# (kind, schema, index name): LOOKUP ON a tag or edge type (a full scan, e.g. a PyG GraphStore's
# edge_index) needs an index on it; created before the data, so no REBUILD INDEX is needed
CITATION_INDEXES = (("TAG", PAPER_TAG, "paper_index"), ("EDGE", CITES_EDGE, "cites_index"))


@dataclass(frozen=True)
class CitationGraph:
    """Features ``[N, D]`` float32, labels ``[N]`` int64, edges ``src -> dst`` (int64, by src)."""

    features: np.ndarray
    labels: np.ndarray
    edge_src: np.ndarray
    edge_dst: np.ndarray

    @property
    def num_nodes(self) -> int:
        return int(self.labels.shape[0])

    @property
    def feature_dim(self) -> int:
        return int(self.features.shape[1])

    def out_neighbors(self, vid: int) -> np.ndarray:
        """The nodes ``vid`` cites, in the order the server returns them for ``GO FROM``."""
        start, stop = np.searchsorted(self.edge_src, [vid, vid + 1])
        return self.edge_dst[start:stop]


def make_citation_graph(
    num_nodes: int,
    feature_dim: int,
    num_classes: int,
    seed: int = 0,
    cites_per_node: int = 5,
    noise: float = 5.0,
    homophily: float = 0.6,
    label_noise: float = 0.1,
) -> CitationGraph:
    """Build the graph; the same arguments always give the same arrays (numpy PCG64 streams).

    The signal is learnable but not trivial: each paper has a hidden topic; its features are
    the topic's centre (unit normal) plus normal noise of deviation ``noise`` (5.0: features
    alone identify the topic about half the time with 7 topics and 64 dimensions); each
    citation goes, with probability ``homophily``, to an earlier paper of the same topic, so the
    neighbourhood carries the topic too; and the stored label is the topic except for a
    ``label_noise`` share of papers whose label is drawn at random (no model is always right).
    """
    if num_nodes < 1 or feature_dim < 1 or num_classes < 1 or cites_per_node < 0:
        raise ValueError(
            "make_citation_graph needs num_nodes, feature_dim, num_classes >= 1 and "
            f"cites_per_node >= 0; got {num_nodes}, {feature_dim}, {num_classes}, {cites_per_node}"
        )
    if not (0.0 <= homophily <= 1.0 and 0.0 <= label_noise <= 1.0 and noise >= 0.0):
        raise ValueError(
            "make_citation_graph needs 0 <= homophily, label_noise <= 1 and noise >= 0; got "
            f"{homophily}, {label_noise}, {noise}"
        )
    rng = np.random.default_rng(seed)
    topics = rng.integers(0, num_classes, size=num_nodes).astype(np.int64)
    centres = rng.normal(0.0, 1.0, size=(num_classes, feature_dim))
    noise_values = rng.normal(0.0, noise, size=(num_nodes, feature_dim))
    features = (centres[topics] + noise_values).astype(np.float32)

    # Node i draws cites_per_node targets from [0, i): uniformly, or with probability homophily
    # uniformly among the earlier papers of its own topic (when there is one); duplicates dropped.
    draws = rng.random((num_nodes, cites_per_node))
    targets = np.floor(draws * np.arange(num_nodes)[:, None]).astype(np.int64)
    same_topic = rng.random((num_nodes, cites_per_node)) < homophily
    picks = rng.random((num_nodes, cites_per_node))
    for topic in range(num_classes):
        members = np.flatnonzero(topics == topic)
        earlier = np.arange(len(members))[:, None]  # members before each member
        chosen = members[np.floor(picks[members] * earlier).astype(np.int64)]
        use = same_topic[members] & (earlier > 0)
        targets[members] = np.where(use, chosen, targets[members])
    targets = np.sort(targets, axis=1)
    keep = np.ones_like(targets, dtype=bool)
    keep[:, 1:] = targets[:, 1:] != targets[:, :-1]
    keep[0, :] = False  # node 0 has no earlier node to cite
    sources = np.repeat(np.arange(num_nodes, dtype=np.int64), cites_per_node).reshape(targets.shape)

    labels = topics.copy()
    relabel = rng.random(num_nodes) < label_noise
    labels[relabel] = rng.integers(0, num_classes, size=int(relabel.sum()))
    return CitationGraph(
        features=features,
        labels=labels,
        edge_src=sources[keep],
        edge_dst=targets[keep],
    )


def citation_schema_statements(space: str = CITATION_SPACE) -> list[str]:
    """nGQL that creates the space, tag and edge (for a real NebulaGraph or an empty server)."""
    return [
        f"CREATE SPACE IF NOT EXISTS {space} (partition_num = 1, replica_factor = 1, "
        "vid_type = INT64)",
        f"USE {space}",
        f"CREATE TAG IF NOT EXISTS {PAPER_TAG}({FEATURE_PROP} string, {LABEL_PROP} int)",
        f"CREATE EDGE IF NOT EXISTS {CITES_EDGE}()",
    ]


def citation_index_statements() -> list[str]:
    """nGQL that creates the indexes ``LOOKUP`` scans need (run before inserting the data)."""
    return [
        f"CREATE {kind} INDEX IF NOT EXISTS {index} ON {schema}()"
        for kind, schema, index in CITATION_INDEXES
    ]


def citation_insert_statements(graph: CitationGraph, batch_size: int = 200) -> Iterator[str]:
    """``INSERT VERTEX`` / ``INSERT EDGE`` statements carrying the whole graph, in batches."""
    for start in range(0, graph.num_nodes, batch_size):
        stop = min(start + batch_size, graph.num_nodes)
        values = ", ".join(
            f'{vid}:("{encode_features(graph.features[vid])}", {int(graph.labels[vid])})'
            for vid in range(start, stop)
        )
        yield f"INSERT VERTEX {PAPER_TAG}({FEATURE_PROP}, {LABEL_PROP}) VALUES {values}"
    for start in range(0, len(graph.edge_src), batch_size):
        pairs = zip(
            graph.edge_src[start : start + batch_size].tolist(),
            graph.edge_dst[start : start + batch_size].tolist(),
            strict=True,
        )
        values = ", ".join(f"{src}->{dst}:()" for src, dst in pairs)
        yield f"INSERT EDGE {CITES_EDGE}() VALUES {values}"
