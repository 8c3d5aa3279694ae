"""Every tensor torch's workers can carry, carried as torch carries it: nested (strided and
jagged), sparse COO/CSR/CSC/BSR/BSC, quantized, ``Tensor`` subclasses, ``Parameter``, tensors that
require grad.  The channels move plain tensors their own way and hand every other kind to torch's
own collate and reductions (``mploader.channel.tensors``); these tests compare the result with
torch's DataLoader under every start method and both channels, unbatched (``batch_size=None``)
and through ``default_collate`` (which refuses most of these kinds: the same error, then).

(Named tensors are gone from torch 2.13: ``Tensor.refine_names`` and ``names=`` no longer exist.)
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.multiprocessing.reductions import reduce_tensor

import mploader
from mploader.compat import torch as torch_compat

from .layouts import KINDS, NONLEAF, EveryKind, PairsSampler, assert_same_tensor, describe, make
from .test_parity_errors import outcomes

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.filterwarnings("ignore::UserWarning"),  # prototype/beta layouts, deprecations
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

_torch_outcomes: dict[tuple[str, str], list[tuple[str, Any]]] = {}


def _described(outcome: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """torch's outcomes with tensors replaced by their descriptions (see ``describe``)."""
    result: list[tuple[str, Any]] = []
    for kind, value in outcome:
        if kind == "batch":
            value = ({name: describe(tensor) for name, tensor in value.items()}
                     if isinstance(value, dict) else describe(value))
        result.append((kind, value))
    return result


def _workers(start_method: str) -> int:
    """Two workers under fork; one under spawn and forkserver, where each costs torch an
    interpreter start (the kinds do not depend on how many workers carry them)."""
    return 2 if start_method == "fork" else 1


def _compare(mode: str, start_method: str, channel: bool, options: dict[str, Any]) -> None:
    """Run torch's loader once per (mode, start method) and mploader's for this channel."""
    key = (mode, start_method)
    if key not in _torch_outcomes:
        _torch_outcomes[key] = _described(outcomes(torch.utils.data.DataLoader(
            **options(), multiprocessing_context=start_method)))
    expected = _torch_outcomes[key]
    actual = outcomes(mploader.DataLoader(**options(), multiprocessing_context=start_method,
                                          shared_memory=channel))
    assert [kind for kind, _ in actual] == [kind for kind, _ in expected], (actual, expected)
    for step, ((_, want), (kind, got)) in enumerate(zip(expected, actual, strict=True)):
        if kind == "error":  # torch's text is "Caught E in DataLoader worker ... E: message"
            assert type(got) is type(want), f"step {step}: {got!r} != torch's {want!r}"
            assert str(want).rstrip().endswith(f"{type(got).__name__}: {got}"), (got, want)
        elif isinstance(got, dict):  # a mixed sample: name -> tensor
            assert list(got) == list(want)
            for name in want:
                assert_same_tensor(want[name], got[name], f"step {step}[{name!r}]")
        else:
            assert_same_tensor(want, got, f"step {step} ({KINDS[step]})")


def test_unbatched_every_kind(start_method: str, channel: bool) -> None:
    """``batch_size=None``: samples holding every kind (and a plain tensor) cross as themselves."""
    _compare("unbatched", start_method, channel, lambda: dict(
        dataset=EveryKind(KINDS, mixed=True), batch_size=None,
        num_workers=_workers(start_method)))


def test_default_collate_every_kind(start_method: str, channel: bool) -> None:
    """One batch of two per kind through ``default_collate``: subclasses and no-grad parameters
    stack as torch stacks them; nested, sparse, quantized and grad-requiring batches fail with
    torch's in-worker error."""
    _compare("collated", start_method, channel, lambda: dict(
        dataset=EveryKind(KINDS), batch_sampler=PairsSampler(len(KINDS)),
        num_workers=_workers(start_method)))


@pytest.mark.parametrize("start_method", ["fork"])
def test_quantized_tensors_keep_their_quantizer(start_method: str, channel: bool) -> None:
    """Differs from torch on purpose: torch's ``reduce_tensor`` drops the quantizer (its tensor
    raises ``cannot call qscheme on UnknownQuantizer``); mploader's keeps scale and zero point."""
    kinds = ["quantized", "quantized-per-channel"]
    options = dict(dataset=EveryKind(kinds), batch_size=None, num_workers=1,
                   multiprocessing_context=start_method)
    with pytest.raises(RuntimeError, match="UnknownQuantizer"):
        next(iter(torch.utils.data.DataLoader(**options))).qscheme()
    for index, tensor in enumerate(mploader.DataLoader(**options, shared_memory=channel)):
        original = make(kinds[index // 2], index % 2)
        assert tensor.qscheme() == original.qscheme()
        assert torch.equal(tensor.dequantize(), original.dequantize())


@pytest.mark.parametrize("start_method", ["fork"])
def test_non_leaf_tensor_requiring_grad_is_refused(start_method: str, channel: bool) -> None:
    """torch's reduction refuses a non-leaf tensor that requires grad; in torch's DataLoader the
    refusal happens in the worker's queue feeder thread, the batch is lost and the loader waits
    until its timeout.  mploader raises torch's refusal for that batch (differs on purpose: an
    error, not a hang)."""
    with pytest.raises(RuntimeError) as torch_refusal:
        reduce_tensor(make(NONLEAF, 0))
    options = dict(dataset=EveryKind([NONLEAF]), batch_size=None, num_workers=1, timeout=1,
                   multiprocessing_context=start_method)
    with pytest.raises(RuntimeError, match="timed out"):
        next(iter(torch.utils.data.DataLoader(**options)))
    result = outcomes(mploader.DataLoader(**options, shared_memory=channel))
    assert [kind for kind, _ in result] == ["error", "error"]
    for _, error in result:
        assert type(error) is RuntimeError
        assert str(error) == str(torch_refusal.value)


@pytest.mark.skipif(torch_compat.TORCH_VERSION < (2, 13),
                    reason="torch before 2.13 still has named tensors")
def test_named_tensors_are_gone_from_torch() -> None:
    """Why no named tensor is tested: torch 2.13 has none to carry."""
    assert not hasattr(torch.Tensor, "refine_names")
    with pytest.raises(TypeError):
        torch.zeros(2, names=("a",))  # type: ignore[call-overload]
