"""``mploader.compat.torch_sampler`` names a shuffle's position from outside torch's
``RandomSampler``: the generator state its permutation is drawn from, and the permutation drawn
again from that state.  Checked here against the installed torch's sampler, with a generator of
its own and without (then it seeds one from torch's global generator)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import RandomSampler

from mploader.compat import torch_sampler

LENGTH = 23


@pytest.mark.parametrize("own_generator", [True, False], ids=["generator", "global"])
@pytest.mark.parametrize("yielded", [0, 5, LENGTH])
def test_a_shuffle_resumes_from_the_state_its_permutation_was_drawn_from(
        own_generator: bool, yielded: int) -> None:
    torch.manual_seed(3)
    generator = torch.Generator().manual_seed(11) if own_generator else None
    sampler = RandomSampler(range(LENGTH), generator=generator)
    torch.rand(7, generator=generator)  # the generator somewhere past its seed
    source = torch_sampler.permutation_source(sampler)
    drawn = list(sampler)  # torch's own draw, from where the generators stand
    assert sorted(drawn) == list(range(LENGTH))
    torch.manual_seed(99)  # elsewhere: the resumed draw must not depend on it
    if generator is not None:
        generator.manual_seed(12345)
    assert list(torch_sampler.resumed_permutation(sampler, source, yielded)) == drawn[yielded:]


def test_a_position_past_the_permutation_is_refused() -> None:
    sampler = RandomSampler(range(LENGTH), generator=torch.Generator().manual_seed(1))
    source = torch_sampler.permutation_source(sampler)
    with pytest.raises(ValueError, match=r"the state's shuffle has yielded 24 of 23 indices"):
        torch_sampler.resumed_permutation(sampler, source, LENGTH + 1)


def test_only_what_shuffle_true_builds_is_taken_for_a_shuffle() -> None:
    dataset = range(LENGTH)
    generator = torch.Generator()
    shuffled = torch.utils.data.DataLoader(dataset, shuffle=True, generator=generator)
    assert torch_sampler.shuffle_sampler(shuffled) is shuffled.sampler
    with_replacement = torch.utils.data.DataLoader(
        dataset, sampler=RandomSampler(dataset, replacement=True))
    other_generator = torch.utils.data.DataLoader(
        dataset, sampler=RandomSampler(dataset, generator=torch.Generator()))
    sequential = torch.utils.data.DataLoader(dataset)
    for loader in (with_replacement, other_generator, sequential):
        assert torch_sampler.shuffle_sampler(loader) is None
