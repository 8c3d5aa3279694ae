"""The worker's generator watch: it notices every draw from the three global generators (numpy's
cached Gaussian included) and its captures restore exactly."""

from __future__ import annotations

import random

import numpy as np
import torch

from mploader.worker import rng


def test_each_generator_moving_is_noticed() -> None:
    watch = rng.RngWatch()
    assert watch.capture_if_changed() is not None  # the first call always captures
    assert watch.capture_if_changed() is None
    # numpy's second normal() takes the cached Gaussian without moving the MT19937 words
    for draw in (lambda: torch.rand(1), np.random.random, random.random,
                 np.random.normal, np.random.normal, random.gauss, random.gauss):
        draw() if draw is not random.gauss else random.gauss(0, 1)
        assert watch.capture_if_changed() is not None, draw
    assert watch.capture_if_changed() is None


def test_a_capture_restores_every_generator() -> None:
    np.random.normal()  # leave a Gaussian in numpy's cache: it is part of the state
    random.gauss(0, 1)
    state = rng.capture()
    first = (torch.rand(3).tolist(), np.random.normal(size=3).tolist(), random.gauss(0, 1))
    rng.restore(rng.RngState.from_plain(state.to_plain()))
    assert (torch.rand(3).tolist(), np.random.normal(size=3).tolist(), random.gauss(0, 1)) == first
