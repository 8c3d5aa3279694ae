"""The worker's generator watch: it notices every draw from the three global generators (numpy's
cached Gaussian included) and its captures restore exactly."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from mploader.compat import cpython, torch_generator
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


TORCH_DRAWS = {
    "rand": lambda: torch.rand(1),
    "randn": lambda: torch.randn(1),  # every other one takes the generator's cached sample
    "randn float64": lambda: torch.randn(1, dtype=torch.float64),
    "randint": lambda: torch.randint(10, (1,)),
    "randperm": lambda: torch.randperm(5),
    "normal_": lambda: torch.empty(5).normal_(),
    "uniform_ 1000": lambda: torch.empty(1000).uniform_(),  # 1000 words: past the engine's refill
    "bernoulli": lambda: torch.bernoulli(torch.tensor([0.5])),
    "manual_seed": lambda: torch.manual_seed(7),
    "nothing": lambda: None,
}


def test_torch_is_watched_in_place_and_misses_no_draw() -> None:
    """The torch fingerprint reads the generator's engine in place (not the 5 KB ``get_state()``
    copy), and whenever ``get_state()`` changes, so does the fingerprint."""
    watch = rng.RngWatch()
    assert watch._torch_print is not torch_generator.state_bytes, (
        "the in-place fingerprint was not verified")
    generator = random.Random(5)
    missed = []
    for _ in range(600):
        name = generator.choice(sorted(TORCH_DRAWS))
        state, print_ = torch.get_rng_state(), watch._torch_print()
        TORCH_DRAWS[name]()
        if not torch.equal(torch.get_rng_state(), state) and watch._torch_print() == print_:
            missed.append(name)
    assert missed == []


def test_a_draw_of_a_whole_cycle_is_noticed() -> None:
    """The fingerprints read a Mersenne Twister's position and first words, not all 624: a draw
    of exactly 624 words brings the position back where it was, but regenerates the words."""
    watch = rng.RngWatch()
    watch.capture_if_changed()
    position = np.random.get_state()[2]
    np.random.randint(0, 2**32, size=624, dtype=np.uint32)  # one 32-bit word each
    assert np.random.get_state()[2] == position
    assert watch.capture_if_changed() is not None
    index = random.getstate()[1][-1]
    for _ in range(624):
        random.getrandbits(32)
    assert random.getstate()[1][-1] == index
    assert watch.capture_if_changed() is not None
    assert watch.capture_if_changed() is None


def test_without_torch_s_in_place_reader_every_draw_is_still_noticed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The documented fallback, for a torch whose generator layout is not the expected one: the
    fingerprint is ``get_state()``'s bytes."""
    monkeypatch.setattr(torch_generator, "_engine_words_address", lambda: None)
    assert torch_generator.engine_reader(8) is None
    watch = rng.RngWatch()
    assert watch._torch_print is torch_generator.state_bytes
    assert watch.capture_if_changed() is not None
    for draw in TORCH_DRAWS.values():
        assert watch.capture_if_changed() is None
        before = torch.get_rng_state()
        draw()
        state = watch.capture_if_changed()
        if torch.equal(before, torch.get_rng_state()):
            assert state is None
        else:
            assert state is not None and state.torch == bytes(torch.get_rng_state().numpy())


def test_without_python_s_in_place_reader_every_check_captures(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fallback for a CPython whose ``random.Random`` layout is not the expected one: no
    fingerprint, so every check captures in full (never a missed draw)."""
    monkeypatch.setattr(cpython, "random_words_reader", lambda generator, words: None)
    watch = rng.RngWatch()
    for _ in range(3):
        random.random()
        state = watch.capture_if_changed()
        assert state is not None and state.python[1] == rng._python_state()[1]
        assert watch.capture_if_changed() is not None


def test_an_engine_reader_that_draws_do_not_change_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found but wrong (an address whose bytes do not move with the generator): refused."""
    still = bytearray(64)
    import ctypes

    buffer = (ctypes.c_char * len(still)).from_buffer(still)
    monkeypatch.setattr(torch_generator, "_engine_words_address",
                        lambda: ctypes.addressof(buffer) + 20)
    monkeypatch.setattr(torch_generator, "MT_WORDS", 0)  # the normal cache inside the buffer
    assert torch_generator.engine_reader(8) is None
