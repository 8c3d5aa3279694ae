"""The installed torch's rules, whichever torch 2.6 to 2.14 that is.

mploader takes its constructor, checks, warnings and length rules from the installed torch, and
what differs between versions (the pin-memory rules changed in 2.7 and 2.9) from
``mploader.compat``, which these tests hold to torch's own objects.  ``make compat TORCH=2.x.y``
runs them, with the parity, lifecycle, resume and shared-memory suites, on another torch.
"""

from __future__ import annotations

import importlib.metadata
import itertools
import re
import warnings
from typing import Any

import pytest
import torch
import torch.utils.data
import torch.utils.data.dataloader

import mploader
from mploader.compat import torch as torch_compat

from .datasets import TensorItems, assert_same_batches

pytestmark = pytest.mark.timeout(60)


def test_a_torch_without_cpu_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before 2.13 ``torch._utils`` has no ``cpu_count`` and torch's DataLoader counts CPUs
    itself: mploader must not call it (every multi-worker loader raised at construction)."""
    counted = []

    def check_as_2_6(loader: Any) -> None:
        counted.append(loader.num_workers)  # torch 2.6's own check, reduced to its call

    monkeypatch.delattr(torch._utils, "cpu_count", raising=False)
    monkeypatch.setattr(torch.utils.data.DataLoader, "check_worker_number_rationality",
                        check_as_2_6)
    kwargs = dict(batch_size=2, num_workers=2, multiprocessing_context="fork")
    loader = mploader.DataLoader(TensorItems(6), **kwargs)  # type: ignore[arg-type]
    reference = torch.utils.data.DataLoader(TensorItems(6), **kwargs)  # type: ignore[arg-type]
    assert_same_batches(list(loader), list(reference))
    assert counted and set(counted) == {2}


def test_the_constructor_is_the_installed_torch_s(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rule a new torch adds to its ``__init__`` applies to mploader's loader unchanged."""
    original = torch.utils.data.DataLoader.__init__

    def with_a_new_rule(self: Any, dataset: Any, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("in_order") is False and kwargs.get("persistent_workers"):
            raise ValueError("a rule of a future torch")
        original(self, dataset, *args, **kwargs)

    monkeypatch.setattr(torch.utils.data.DataLoader, "__init__", with_a_new_rule)
    with pytest.raises(ValueError, match="a rule of a future torch"):
        mploader.DataLoader(TensorItems(4), num_workers=1, in_order=False,
                            persistent_workers=True)
    loader = mploader.DataLoader(TensorItems(4), num_workers=1)
    assert loader.worker_threads == 1 and loader.resume_tracker is not None


class _Empty:
    pass


def test_only_the_iterator_is_mploader_s() -> None:
    """What mploader's loader defines over torch's: its additions, and where iterators come
    from; every check, property and length rule is inherited.  Not counted: what the running
    Python puts in every class body (3.13 adds ``__firstlineno__`` and ``__static_attributes__``),
    what a generic, annotated class gets, and copyreg's cache once either class was pickled."""
    not_counted = set(vars(_Empty)) | {"__parameters__", "__orig_bases__", "__annotations__",
                                       "__slotnames__"}
    torch_names = set(vars(torch.utils.data.DataLoader))
    overridden = {name for name in vars(mploader.DataLoader)
                  if name in torch_names and name not in not_counted}
    assert overridden == {"__init__", "__iter__", torch_compat.ITERATOR_FACTORY}


def _torch_pin_rule(pin: bool, device: str) -> tuple[tuple[bool, str | None], list[str]]:
    """What the installed torch's own iterator decides, and warns, for these arguments."""
    loader = torch.utils.data.DataLoader(range(4), pin_memory=pin, pin_memory_device=device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        iterator = torch.utils.data.dataloader._BaseDataLoaderIter(loader)
    return ((iterator._pin_memory, iterator._pin_memory_device),
            [str(warning.message) for warning in caught])


@pytest.mark.parametrize(("pin", "device"), list(itertools.product([False, True],
                                                                   ["", "cuda", "cpu"])))
def test_pin_memory_rules_are_the_installed_torch_s(pin: bool, device: str) -> None:
    expected = _torch_pin_rule(pin, device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        decided = torch_compat.resolve_pin_memory(pin, device, stacklevel=1)
    assert (decided, [str(warning.message) for warning in caught]) == expected


def test_the_version_is_the_installed_torch_s_and_the_oldest_is_the_package_s() -> None:
    """``TORCH_VERSION`` is what the installed distribution says (not just any version past
    the oldest), and ``OLDEST_SUPPORTED`` is the torch requirement pip enforces."""
    release = importlib.metadata.version("torch").split("+")[0]
    assert tuple(int(part) for part in release.split(".")[:2]) == torch_compat.TORCH_VERSION
    requirements = importlib.metadata.requires("mploader") or []
    (torch_requirement,) = [r for r in requirements if re.match(r"torch\s*[<>=!~]", r)]
    oldest = re.fullmatch(r"torch\s*>=\s*(\d+)\.(\d+)", torch_requirement.split(";")[0].strip())
    assert oldest is not None, torch_requirement
    assert (int(oldest[1]), int(oldest[2])) == torch_compat.OLDEST_SUPPORTED
    assert torch_compat._minor_version("2.15.0a0+git1234") == (2, 15)
    assert torch_compat._minor_version("2.6.0+cu124") == (2, 6)
