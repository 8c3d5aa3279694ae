"""``mploader.install()``: torch's own DataLoader (and subclasses) iterate with mploader's workers.

Torch's reference batches are computed before installing (or after uninstalling): while installed,
torch's class itself uses mploader's iterator.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.utils.data

import mploader
import mploader._install

from .datasets import DictItems, ShardedIterable, TensorItems, assert_same_batches

# A stuck loader fails its test after a minute, not the default two.
pytestmark = pytest.mark.timeout(60)


class SubclassLoader(torch.utils.data.DataLoader):
    """What libraries do (PyG's loaders): subclass torch's DataLoader, never see mploader's."""

    def __init__(self, dataset: Any, **options: Any) -> None:
        super().__init__(dataset, **options)
        self.built_by = "subclass"


@pytest.fixture
def uninstalled() -> Iterator[None]:
    """Every test here starts and ends with torch's own iterator in place."""
    mploader.uninstall()
    yield
    mploader.uninstall()


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def options(start_method: str) -> dict[str, Any]:
    return dict(batch_size=3, shuffle=True, num_workers=2, multiprocessing_context=start_method)


def build(cls: type, start_method: str, channel: bool, **extra: Any) -> Any:
    loader = cls(DictItems(10), generator=gen(13), **options(start_method), **extra)
    if not channel:
        loader.shared_memory = False  # read by mploader's iterator; torch ignores it
    return loader


def iterator_module(loader: Any) -> str:
    iterator = iter(loader)
    module = type(iterator).__module__
    del iterator
    return module


def iterate(loader: Any) -> tuple[str, list[Any]]:
    """The module of the loader's iterator class, and its batches (one iterator, one epoch)."""
    iterator = iter(loader)
    return type(iterator).__module__, list(iterator)


@pytest.mark.usefixtures("uninstalled")
@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_installed_subclass_gives_torch_batches(start_method: str, channel: bool) -> None:
    original = torch.utils.data.DataLoader._get_iterator
    module, expected = iterate(build(SubclassLoader, start_method, channel))
    assert module.startswith("torch")

    installation = mploader.install()
    try:
        assert mploader.is_installed()
        module, actual = iterate(build(SubclassLoader, start_method, channel))
        assert module.startswith("mploader")
        assert_same_batches(expected, actual)
        if start_method == "fork":
            plain = build(torch.utils.data.DataLoader, start_method, channel)
            assert iterator_module(plain).startswith("mploader")
    finally:
        mploader.uninstall()
    assert installation is not None and not mploader.is_installed()
    assert torch.utils.data.DataLoader._get_iterator is original


@pytest.mark.usefixtures("uninstalled")
@pytest.mark.parametrize("start_method", ["fork"])
def test_install_as_context_manager(start_method: str, channel: bool) -> None:
    expected = list(build(torch.utils.data.DataLoader, start_method, channel))
    with mploader.install():
        loader = build(torch.utils.data.DataLoader, start_method, channel)
        assert iterator_module(loader).startswith("mploader")
        assert_same_batches(expected, list(build(torch.utils.data.DataLoader, start_method,
                                                 channel)))
    assert not mploader.is_installed()
    assert iterator_module(build(SubclassLoader, start_method, channel)).startswith("torch")


@pytest.mark.usefixtures("uninstalled")
def test_install_twice_then_uninstall_restores_torch() -> None:
    original = torch.utils.data.DataLoader._get_iterator
    mploader.install()
    mploader.install()
    mploader.uninstall()
    assert torch.utils.data.DataLoader._get_iterator is original
    mploader.uninstall()  # idempotent
    assert torch.utils.data.DataLoader._get_iterator is original


@pytest.mark.usefixtures("uninstalled")
def test_installed_without_workers_keeps_torch_single_process_iterator() -> None:
    expected = list(torch.utils.data.DataLoader(TensorItems(5), batch_size=2))
    with mploader.install():
        loader = SubclassLoader(TensorItems(5), batch_size=2)
        iterator = iter(loader)
        assert type(iterator).__module__.startswith("torch")
        assert_same_batches(expected, list(iterator))


@pytest.mark.usefixtures("uninstalled")
@pytest.mark.parametrize("start_method", ["fork"])
def test_installed_persistent_workers(start_method: str, channel: bool) -> None:
    """torch's ``__iter__`` keeps one iterator and calls its ``_reset`` each epoch: ours."""
    reference = build(SubclassLoader, start_method, channel, persistent_workers=True)
    expected = [list(reference) for _ in range(3)]
    with mploader.install():
        loader = build(SubclassLoader, start_method, channel, persistent_workers=True)
        epochs, iterators = [], []
        for _ in range(3):
            iterator = iter(loader)
            iterators.append(iterator)
            epochs.append(list(iterator))
        assert type(iterators[0]).__module__.startswith("mploader")
        assert all(iterator is iterators[0] for iterator in iterators)
        pids = [worker.pid for worker in iterators[0]._workers]
        assert all(worker.is_alive() for worker in iterators[0]._workers)
        for epoch, (e, a) in enumerate(zip(expected, epochs, strict=True)):
            assert_same_batches(e, a, f"epoch {epoch}")
        assert [w.pid for w in iter(loader)._workers] == pids


@pytest.mark.usefixtures("uninstalled")
@pytest.mark.parametrize("start_method", ["fork"])
def test_installed_iterable_dataset(start_method: str, channel: bool) -> None:
    def make() -> Any:
        loader = torch.utils.data.DataLoader(ShardedIterable(9), batch_size=2, num_workers=2,
                                             multiprocessing_context=start_method)
        if not channel:
            loader.shared_memory = False
        return loader

    expected = list(make())
    with mploader.install():
        loader = make()
        assert iterator_module(loader).startswith("mploader")
        assert_same_batches(expected, list(make()))


# -- subclasses that own their iterator --------------------------------------------------------


def _not_taken_over(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught
            if issubclass(w.category, UserWarning) and "does not take over" in str(w.message)]


@pytest.mark.usefixtures("uninstalled")
def test_subclass_with_its_own_get_iterator_is_named_once() -> None:
    """A subclass overriding ``_get_iterator`` keeps its iterator: one warning per class, naming
    it (and the base that overrides), at ``install()`` or when defined while installed."""

    class OwnIterator(torch.utils.data.DataLoader):
        def _get_iterator(self) -> Any:
            return torch.utils.data.dataloader._MultiProcessingDataLoaderIter(self)

    class Inherits(torch.utils.data.DataLoader):
        pass

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mploader.install()
        class Derived(OwnIterator):  # defined while installed
            pass
        mploader.uninstall()
        mploader.install()  # again: no second warning for the same classes
        loader = Derived(TensorItems(4), batch_size=2, num_workers=1,
                         multiprocessing_context="fork")
        assert iterator_module(loader) == "torch.utils.data.dataloader"
        inherits = Inherits(TensorItems(4), batch_size=2, num_workers=1,
                            multiprocessing_context="fork")
        assert iterator_module(inherits).startswith("mploader")
    texts = _not_taken_over(caught)
    name = f"{__name__}.test_subclass_with_its_own_get_iterator_is_named_once.<locals>"
    assert texts == [
        f"mploader.install() does not take over {name}.OwnIterator: it overrides "
        "DataLoader._get_iterator, the one method install() swaps, so it keeps its own iterator "
        "(torch's worker processes, not mploader's) unless that method calls "
        "DataLoader._get_iterator. Use mploader.DataLoader for mploader's workers.",
        f"mploader.install() does not take over {name}.Derived: its base {name}.OwnIterator "
        "overrides DataLoader._get_iterator, the one method install() swaps, so it keeps its own "
        "iterator (torch's worker processes, not mploader's) unless that method calls "
        "DataLoader._get_iterator. Use mploader.DataLoader for mploader's workers.",
    ]
    assert all(w.filename == __file__ for w in caught if "does not take over" in str(w.message))


@pytest.mark.usefixtures("uninstalled")
def test_torchdata_stateful_dataloader_keeps_its_iterator(monkeypatch: pytest.MonkeyPatch) -> None:
    """torchdata's ``StatefulDataLoader`` (the common subclass with its own iterator) is named in
    the warning and still gives torch's batches, from its own workers."""
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    monkeypatch.setattr(mploader._install, "_warned_classes", weakref.WeakSet())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with mploader.install():
            loader = stateful.StatefulDataLoader(TensorItems(6), batch_size=2, num_workers=1,
                                                 multiprocessing_context="fork")
            module, batches = iterate(loader)
    assert module.startswith("torchdata")
    name = "torchdata.stateful_dataloader.stateful_dataloader.StatefulDataLoader"
    texts = [text for text in _not_taken_over(caught) if name in text]
    assert len(texts) == 1
    assert f"does not take over {name}: it overrides DataLoader._get_iterator" in texts[0]
    reference = torch.utils.data.DataLoader(TensorItems(6), batch_size=2)
    assert_same_batches(list(reference), batches)
