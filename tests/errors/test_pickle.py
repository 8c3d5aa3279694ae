"""Every exception class mploader defines survives pickling: type, message, attributes, notes.

Test harnesses and ``multiprocessing`` pools ship exceptions from a child to its parent by pickle;
``BaseException`` pickles as ``type(*args)``, which fails for an ``__init__`` with other
parameters.  The classes are found by walking the package, so a new exception class fails
:func:`test_every_exception_class_has_a_sample` until it gets a sample here.
"""

from __future__ import annotations

import importlib
import multiprocessing
import pickle
import pkgutil
import re
from collections.abc import Callable
from typing import Any

import pytest

import mploader
from mploader.channel.shm.errors import (
    BatchTooLargeError,
    BlockVanishedError,
    SharedMemoryError,
    SharedMemoryFullError,
)
from mploader.errors import (
    PoisonTaskError,
    RemoteTraceback,
    WorkerDiedError,
    WorkerError,
    ZygoteError,
    ZygoteTimeoutError,
)
from mploader.integrations.nebula.errors import (
    NebulaAuthError,
    NebulaConnectionError,
    NebulaError,
    NebulaQueryError,
    NebulaSessionLimitError,
    NebulaSessionLostError,
)
from mploader.memory import MemoryLimit


def exception_classes() -> dict[str, type[BaseException]]:
    """Every exception class defined in a module of the ``mploader`` package, by qualified name."""
    found: dict[str, type[BaseException]] = {}
    for module_info in pkgutil.walk_packages(mploader.__path__, "mploader."):
        module = importlib.import_module(module_info.name)
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, BaseException)
                and value.__module__ == module.__name__
            ):
                found[f"{value.__module__}.{value.__qualname__}"] = value
    return found


def _died() -> WorkerDiedError:
    return WorkerDiedError(
        "DataLoader worker (pid 4242) is killed by signal: Killed. worker 1 ...",
        worker_id=1, pid=4242, exitcode=-9, task_ids=(3, 5), indices=([6, 7], [10, 11]),
        likely_cause="out of memory (the kernel's OOM killer)",
    )


def _private(qualified_name: str) -> Callable[..., BaseException]:
    module_name, _, class_name = qualified_name.rpartition(".")
    cls: Callable[..., BaseException] = getattr(importlib.import_module(module_name), class_name)
    return cls


# One representative instance per class, built as mploader builds it.
SAMPLES: dict[str, Callable[[], BaseException]] = {
    "mploader.errors.MploaderError": lambda: mploader.MploaderError("something failed"),
    "mploader.errors.RemoteTraceback": lambda: RemoteTraceback('\n"""\nTraceback ...\n"""'),
    "mploader.errors.WorkerError": lambda: WorkerError(
        "Caught mod.Odd in DataLoader worker 0 (pid 7); here is its text: odd", "mod.Odd"
    ),
    "mploader.errors.WorkerDiedError": _died,
    "mploader.errors.PoisonTaskError": lambda: PoisonTaskError.after_deaths(
        5, [10, 11], ["pid 1: SIGKILL", "pid 2: SIGKILL"], _died()
    ),
    "mploader.channel.shm.errors.SharedMemoryError": lambda: SharedMemoryError("pool broken"),
    "mploader.channel.shm.errors.SharedMemoryFullError": lambda: SharedMemoryFullError.for_block(
        1 << 30, MemoryLimit(1 << 20, "the memory cgroup's limit less its usage "
                             "(/sys/fs/cgroup/memory/job/memory.limit_in_bytes less "
                             "memory.usage_in_bytes, its file cache counted as free)")
    ),
    "mploader.channel.shm.errors.BatchTooLargeError": lambda: BatchTooLargeError.for_batch(
        1 << 33, 1 << 31, 4, "half of the memory cgroup's limit of 16.0 GiB "
        "(/sys/fs/cgroup/memory/job/memory.limit_in_bytes), at most 8 GiB"
    ),
    "mploader.channel.shm.errors.BlockVanishedError": lambda: BlockVanishedError(
        "block mploader-1-2-3 of worker 0 is gone"
    ),
    "mploader.integrations.nebula.errors.NebulaError": lambda: NebulaError("nebula failed"),
    "mploader.integrations.nebula.errors.NebulaConnectionError": lambda: NebulaConnectionError(
        "graphd at 127.0.0.1:9669 cannot be reached"
    ),
    "mploader.integrations.nebula.errors.NebulaAuthError": lambda: NebulaAuthError(
        "graphd rejected user root"
    ),
    "mploader.integrations.nebula.errors.NebulaSessionLostError": lambda: NebulaSessionLostError(
        "graphd at 127.0.0.1:9669 no longer knows session 42"
    ),
    "mploader.integrations.nebula.errors.NebulaSessionLimitError": lambda: NebulaSessionLimitError(
        "no graphd session within 60 s: the cap of 300 sessions is used up"
    ),
    "mploader.integrations.nebula.errors.NebulaQueryError": lambda: NebulaQueryError(
        "SemanticError: no such tag", -1009, "FETCH PROP ON nope 1 YIELD nope.x"
    ),
    "mploader.iterator.multi._TaskError": lambda: _private("mploader.iterator.multi._TaskError")(
        ValueError("bad item 3")
    ),
    "mploader.worker.loop._StopRequested": lambda: _private(
        "mploader.worker.loop._StopRequested"
    )(),
    "mploader.errors.ZygoteError": lambda: ZygoteError(
        "mploader's spawn zygote (pid 77) died; MPLOADER_ZYGOTE=0 starts workers directly"
    ),
    "mploader.errors.ZygoteTimeoutError": lambda: ZygoteTimeoutError(
        "mploader's spawn zygote (pid 77) did not answer within 30 s"
    ),
    "mploader.monitor.trace_summary.TraceError": lambda: _private(
        "mploader.monitor.trace_summary.TraceError"
    )("run.json: no such file"),
    "mploader.integrations.nebula.pool._LoginRefused": lambda: _private(
        "mploader.integrations.nebula.pool._LoginRefused"
    )("every slot of the host's session budget is held"),
    "mploader.process.zygote._Gone": lambda: _private("mploader.process.zygote._Gone")(
        "the zygote ended"
    ),
    # The PyG stores' and sampler's refusals (mploader.integrations.nebula.pyg.errors).
    "mploader.integrations.nebula.pyg.errors.StoreInputError": lambda: _pyg_error(
        "StoreInputError")("a refused argument; nothing was written"),
    "mploader.integrations.nebula.pyg.errors.UnknownNameError": lambda: _pyg_error(
        "UnknownNameError")("no node type 'pepar'; the schema has 'author', 'paper'"),
    "mploader.integrations.nebula.pyg.errors.NodeIndexError": lambda: _pyg_error(
        "NodeIndexError")("node 2000 of 'paper' is past its 2000 nodes"),
    "mploader.integrations.nebula.pyg.errors.WriteDtypeError": lambda: _pyg_error(
        "WriteDtypeError")("torch.float32 values into the INT attribute 'paper.year'"),
    "mploader.integrations.nebula.pyg.errors.WriteShapeError": lambda: _pyg_error(
        "WriteShapeError")("values of shape (2, 5) for 2 rows of 'paper.x', 4 wide"),
    "mploader.integrations.nebula.pyg.errors.SchemaConflictError": lambda: _pyg_error(
        "SchemaConflictError")("('paper', 'to', 'paper') and ('paper', 'cites', 'paper') read "
                               "the same stored edges"),
}


def _pyg_error(name: str) -> Any:
    """A class of the PyG integration's errors (imported on use: torch_geometric is optional)."""
    return getattr(importlib.import_module("mploader.integrations.nebula.pyg.errors"), name)


def test_every_exception_class_has_a_sample() -> None:
    found = exception_classes()
    assert "mploader.errors.WorkerDiedError" in found  # the walk reaches the package's modules
    missing = sorted(set(found) - set(SAMPLES))
    assert not missing, f"exception classes without a sample in SAMPLES: {missing}"
    stale = sorted(set(SAMPLES) - set(found))
    assert not stale, f"SAMPLES names classes that no longer exist: {stale}"


def sample(name: str) -> BaseException:
    error = SAMPLES[name]()
    assert f"{type(error).__module__}.{type(error).__qualname__}" == name
    error.add_note(f"a note on {name}")
    return error


def assert_same_exception(original: BaseException, copy: BaseException) -> None:
    assert type(copy) is type(original)
    assert str(copy) == str(original)
    assert copy.args == original.args
    assert getattr(copy, "__notes__", None) == original.__notes__
    assert _attributes(copy) == _attributes(original)
    if isinstance(original, OSError):
        assert isinstance(copy, OSError)
        assert (copy.errno, copy.strerror) == (original.errno, original.strerror)


def _attributes(error: BaseException) -> dict[str, Any]:
    """Public attributes and properties, nested exceptions compared by type and text."""
    values = {}
    for name in dir(error):
        if name.startswith("__") or name in ("args", "with_traceback", "add_note"):
            continue
        try:
            value = getattr(error, name)
        except AttributeError:  # OSError.characters_written when unset
            continue
        if callable(value):
            continue
        values[name] = (type(value), str(value)) if isinstance(value, BaseException) else value
    return values


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_round_trip(name: str) -> None:
    error = sample(name)
    for protocol in (2, pickle.DEFAULT_PROTOCOL, pickle.HIGHEST_PROTOCOL):
        assert_same_exception(error, pickle.loads(pickle.dumps(error, protocol=protocol)))


def _raise_sample(name: str) -> None:
    raise sample(name)


def test_raised_in_a_child_process_and_shipped_back() -> None:
    """A multiprocessing pool pickles the child's exception and re-raises it in the parent."""
    names = sorted(SAMPLES)
    with multiprocessing.get_context("fork").Pool(1) as pool:
        pending = [(name, pool.apply_async(_raise_sample, (name,))) for name in names]
        for name, result in pending:
            with pytest.raises(BaseException) as caught:
                result.get(timeout=30)
            assert_same_exception(sample(name), caught.value)


# --- One error family (issue 18) ------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_derives_from_the_one_base(name: str) -> None:
    assert issubclass(exception_classes()[name], mploader.MploaderError)


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_public_classes_are_exported_from_mploader(name: str) -> None:
    cls = exception_classes()[name]
    if cls.__name__.startswith("_"):
        return  # private control flow of one module, never seen by users
    assert cls.__name__ in mploader.__all__
    assert getattr(mploader, cls.__name__) is cls


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_built_from_one_message(name: str) -> None:
    """torch's ``ExceptionWrapper`` (and torch's own test helpers) rebuild an error from a worker
    as ``exc_type(message)``; that must work for every class, and the copy still pickles."""
    cls = exception_classes()[name]
    if cls.__name__.startswith("_"):
        return
    error = cls("Caught it in DataLoader worker process 0.\nOriginal Traceback ...")
    assert "Caught it in DataLoader worker process 0." in str(error)
    error.add_note("a note")
    assert_same_exception(error, pickle.loads(pickle.dumps(error)))


def test_torch_exception_wrapper_rebuilds_a_worker_death() -> None:
    """The path of torch's ``test_segfault``: the child's error is wrapped, shipped, and rebuilt
    as ``exc_type(exc_msg)``; it is a RuntimeError whose text is torch's."""
    from torch._utils import ExceptionWrapper

    try:
        raise _died()
    except WorkerDiedError:
        wrapper = pickle.loads(pickle.dumps(ExceptionWrapper(where="in a test process")))
    rebuilt = wrapper.exc_type(wrapper.exc_msg)
    assert isinstance(rebuilt, RuntimeError)
    assert re.search(r"DataLoader worker \(pid \d+\) is killed by signal: ", str(rebuilt))


def _packages() -> list[str]:
    return ["mploader"] + [
        info.name for info in pkgutil.walk_packages(mploader.__path__, "mploader.")
        if info.ispkg
    ]


@pytest.mark.parametrize("package", _packages())
def test_all_is_honest(package: str) -> None:
    """``from package import *`` works: every name in ``__all__`` exists."""
    module = importlib.import_module(package)
    names = getattr(module, "__all__", [])
    assert len(names) == len(set(names)), f"{package}.__all__ repeats a name"
    exec(f"from {package} import *", {})
