"""A garbage collection at every point where mploader holds a lock (run by ``test_finalizers.py``).

``python finalizer_child.py START_METHOD WHERE`` builds a reserve of iterators, each left mid-epoch
in a reference cycle (so that only the cyclic collector frees it), then starts, iterates and shuts
down a second loader under ``START_METHOD`` with a profile hook that, at every call into mploader
made while the calling thread holds one of mploader's locks, drops one reserve iterator and runs a
full ``gc.collect()``: the old iterator is finalized right there, inside the lock.  A finalizer that
took that lock (or waited for work a lock guards) would hang here for good.

``WHERE`` is ``main`` (the second loader runs in the main thread), ``thread`` (in another thread:
the finalizers run there) or ``exit`` (as ``main``, then the process exits with more unreachable
iterators left to finalize at interpreter exit, with the probe on).  Each line of stdout is a JSON
report: the points probed and the garbage iterators' worker pids, for the test to
check that nothing of them is left; under ``exit``, a last line names the points probed at exit.

Which thread holds a lock is known because ``threading.Lock``/``RLock`` made by mploader's modules
are real locks behind a counting wrapper, installed before mploader is imported.
"""

from __future__ import annotations

import atexit
import faulthandler
import gc
import json
import os
import sys
import threading
from typing import Any

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MAIN_PID = os.getpid()
# More iterators than points with a lock held that one loader's life calls into (142 under fork,
# 153 under spawn, since blocks' descriptors travel through the passage): a run that used them all
# would not have probed every point.
RESERVE = 200
# At exit: the points of the remaining shutdowns (62).
RESERVE_AT_EXIT = 90
_held = threading.local()  # .depth: how many mploader locks this thread holds


def held_depth() -> int:
    return getattr(_held, "depth", 0)


class _CountingLock:
    """A real lock that counts, per thread, how many mploader locks are held."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        acquired = self._real.acquire(blocking, timeout)
        if acquired:
            _held.depth = held_depth() + 1
        return bool(acquired)

    def release(self) -> None:
        self._real.release()
        _held.depth = held_depth() - 1

    def locked(self) -> bool:
        return bool(self._real.locked()) if hasattr(self._real, "locked") else False

    __enter__ = acquire

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def _at_fork_reinit(self) -> None:
        self._real._at_fork_reinit()


def _counting(factory: Any) -> Any:
    def make() -> Any:
        caller = sys._getframe(1).f_globals.get("__name__", "")
        real = factory()
        return _CountingLock(real) if caller.startswith("mploader") else real
    return make


threading.Lock = _counting(threading.Lock)  # type: ignore[misc]
threading.RLock = _counting(threading.RLock)  # type: ignore[misc]



def _report_exit() -> None:
    """Registered before mploader's own exit hook, so it runs after it."""
    if _kept is not None:
        print(json.dumps({"exit_probed": _kept.probed, "reserve_left": len(_kept.cycles)}),
              flush=True)


atexit.register(_report_exit)
sys.path.insert(0, REPOSITORY)
import mploader  # noqa: E402

PACKAGE = os.path.dirname(os.path.abspath(mploader.__file__))


class Reserve:
    """Iterators kept reachable until a probe drops one into a reference cycle of its own."""

    def __init__(self, count: int) -> None:
        self.pids: list[int] = []
        self.cycles: list[list[Any]] = []
        for _ in range(count):
            loader = mploader.DataLoader(list(range(6)), batch_size=1, num_workers=1,
                                         multiprocessing_context="fork")
            iterator = iter(loader)
            next(iterator)  # mid-epoch: its worker is busy, a batch is in flight
            self.pids += [process.pid for process in iterator._workers]
            cycle: list[Any] = [iterator, loader]
            cycle.append(cycle)  # only the cyclic collector frees it
            self.cycles.append(cycle)
            del iterator, loader, cycle
        self.probed: list[str] = []

    def drop_one(self) -> bool:
        if not self.cycles:
            return False
        self.cycles.pop()
        return True


def install_probe(reserve: Reserve) -> None:
    seen: set[Any] = set()

    def probe(frame: Any, event: str, arg: Any) -> None:
        if event != "call" or os.getpid() != MAIN_PID or held_depth() <= 0:
            return
        code = frame.f_code
        if not code.co_filename.startswith(PACKAGE) or code in seen:
            return
        seen.add(code)
        if reserve.drop_one():
            reserve.probed.append(f"{code.co_filename[len(PACKAGE) + 1:]}:{code.co_name}")
        gc.collect()  # finalizes the dropped iterator here, inside the lock

    sys.setprofile(probe)
    threading.setprofile(probe)


def second_loader(start_method: str) -> None:
    loader = mploader.DataLoader(list(range(12)), batch_size=2, num_workers=2,
                                 multiprocessing_context=start_method)
    for epoch in range(2):
        for index, _ in enumerate(loader):
            if epoch == 1 and index == 2:
                break  # the second epoch is broken off: shut down mid-epoch


def open_pipes() -> set[str]:
    """This process's open pipe ends, as ``fd:pipe:[inode]``."""
    pipes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # the listing's own fd, closed meanwhile
        if target.startswith("pipe:"):
            pipes.add(f"{fd}:{target}")
    return pipes


def main() -> None:
    start_method, where = sys.argv[1], sys.argv[2]
    faulthandler.dump_traceback_later(float(sys.argv[3]), exit=True)  # a hang shows its stacks
    if start_method != "fork":  # start its zygote outside the probe: not the point here
        mploader.DataLoader([0], num_workers=1, multiprocessing_context=start_method)
    gc.disable()  # collections happen at the probes only
    gc.freeze()  # and skip what was made before: a full collection takes microseconds
    pipes_before = open_pipes()
    reserve = Reserve(RESERVE_AT_EXIT if where == "exit" else RESERVE)
    at_exit = Reserve(3) if where == "exit" else None
    install_probe(reserve)
    if where == "exit":
        pass  # the loaders are finalized at exit, with the probe on
    elif where == "thread":
        thread = threading.Thread(target=second_loader, args=(start_method,))
        thread.start()
        thread.join()
    else:
        second_loader(start_method)
    print(json.dumps({
        "probed": reserve.probed, "reserve_left": len(reserve.cycles),
        "pids": reserve.pids + (at_exit.pids if at_exit else []),
        "pending_at_exit": len(at_exit.cycles) if at_exit else 0,
    }), flush=True)
    if at_exit is None:
        sys.setprofile(None)
        threading.setprofile(None)
        reserve.cycles.clear()
        gc.collect()
        from mploader import finalizers

        finalizers.settle(20)  # every finalized iterator's shutdown has run
        from mploader.process import reaper

        reaper.wait_for_all(20)  # and every worker that said goodbye is reaped
        gc.collect()  # (its process object, which holds its sentinel, with it)
        print(json.dumps({"pipes_left": sorted(open_pipes() - pipes_before)}), flush=True)
        return
    # Exit with the probe on: the three iterators dropped now are finalized by the exit hooks,
    # and every lock those shutdowns take finalizes one more from the reserve, kept reachable
    # from this module until then.
    global _kept
    _kept = reserve
    at_exit.cycles.clear()


_kept: Reserve | None = None


if __name__ == "__main__":
    main()
