"""Feature vectors in a string property: NebulaGraph properties cannot hold lists."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence

import numpy as np

FEATURE_ENCODING = "base64-float32-le"
"""How :func:`encode_features` stores a vector in a string property."""


def encode_features(vector: np.ndarray | Sequence[float]) -> str:
    """A 1-D float vector as base64 of its little-endian float32 bytes (exact round trip)."""
    array = np.ascontiguousarray(np.asarray(vector, dtype="<f4"))
    if array.ndim != 1:
        raise ValueError(f"encode_features expects a 1-D vector, got shape {array.shape}")
    return base64.b64encode(array.tobytes()).decode("ascii")


def decode_features(text: str | bytes, feature_dim: int | None = None) -> np.ndarray:
    """Inverse of :func:`encode_features`: a float32 vector (checked against ``feature_dim``)."""
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as error:
        raise ValueError(f"not a {FEATURE_ENCODING} feature string: {text[:40]!r}") from error
    if len(raw) % 4 or (feature_dim is not None and len(raw) != 4 * feature_dim):
        expected = "a multiple of 4" if feature_dim is None else str(4 * feature_dim)
        raise ValueError(
            f"feature string decodes to {len(raw)} bytes, expected {expected} "
            f"({FEATURE_ENCODING}, feature_dim={feature_dim})"
        )
    return np.frombuffer(raw, dtype="<f4").astype(np.float32)


def decode_feature_batch(texts: Sequence[str | bytes], feature_dim: int) -> np.ndarray:
    """Many feature strings as one ``[len(texts), feature_dim]`` float32 array."""
    raw = [base64.b64decode(text) for text in texts]
    for position, chunk in enumerate(raw):
        if len(chunk) != 4 * feature_dim:
            raise ValueError(
                f"feature string #{position} decodes to {len(chunk)} bytes, expected "
                f"{4 * feature_dim} ({FEATURE_ENCODING}, feature_dim={feature_dim})"
            )
    flat = np.frombuffer(b"".join(raw), dtype="<f4")
    return flat.reshape(len(raw), feature_dim).astype(np.float32)
