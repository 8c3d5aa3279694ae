"""Sessions left on graphd by jobs whose worker is SIGKILLed mid-epoch, N runs (issue 29).

The job of the issue: 2 workers x 8 fetch threads (``worker_threads=8``), one restart allowed
(``max_worker_restarts=1``), every item one 2 ms statement, against the bundled graphd.  One
worker is killed per run:

* ``--kill login`` (default): at a random moment of one of its first four logins, 0 to 7 ms
  after its ``authenticate`` request goes out: the request on its way, the session not made
  yet, made, the answer in flight or unread, the slot written, the space being set (the server
  holds each login 2 ms before and 2 ms after it makes the session, ``--login-delay-ms``: a
  real graphd asks metad in between; then the 2 ms ``USE``).
* ``--kill item``: the issue's own run, the worker kills itself after an item (its other fetch
  threads' logins in flight or not), logins not held.

A second after every process of the job has exited, the sessions graphd still lists (the
lister's own left out) are counted, then ended so that the next run starts from none.  The
server's event log says where each kill landed.  ``--busy`` keeps every core busy meanwhile
(one spinning process per core).  Exits 1 if any run left a session.

    python benchmarks/killed_logins.py --runs 50
    python benchmarks/killed_logins.py --runs 20 --busy
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil
import torch
from torch.utils.data import Dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mploader
from mploader.integrations.nebula import NebulaHooks
from nebula_testing import citation
from nebula_testing.nebula_admin import AdminSession
from nebula_testing.nebula_events import EventLog
from nebula_testing.nebula_process import start_server_process

ITEMS = 96
LOGIN_KILL_SECONDS = 0.007  # a login held 2 + 2 ms, its 2 ms USE, and a little after


class Items(Dataset):
    """Item i waits 10 ms, then asks ``YIELD i`` through the worker's session (the issue's)."""

    def __init__(self, victim: int | None, marker: str) -> None:
        self.victim = victim
        self.marker = marker

    def __len__(self) -> int:
        return ITEMS

    def __getitem__(self, index: int) -> int:
        time.sleep(0.01)
        answer = mploader.worker_session().execute(f"YIELD {index} AS q")
        assert answer.rows()[0].values[0].get_iVal() == index
        if index == self.victim and _first(self.marker):
            os.kill(os.getpid(), signal.SIGKILL)
        return index


def _first(marker: str) -> bool:
    """Whether this process is the first to claim ``marker`` (one kill per job)."""
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


class LoginKiller:
    """Armed in the main process before the workers fork: the first worker to send its
    ``login``-th ``authenticate`` is SIGKILLed ``delay`` s later.  Wraps nebula3's own
    ``Connection.authenticate``, below mploader."""

    def __init__(self, log: EventLog) -> None:
        from nebula3.gclient.net.Connection import Connection

        self.log = log
        self.main = os.getpid()
        self.armed: tuple[str, int, float] | None = None
        self.logins: Counter[int] = Counter()
        original = Connection.authenticate
        killer = self

        def authenticate(connection: Any, user: str, password: str) -> Any:
            killer.before_login()
            return original(connection, user, password)

        Connection.authenticate = authenticate  # type: ignore[method-assign]

    def arm(self, marker: str, login: int, delay: float) -> None:
        self.armed = (marker, login, delay)

    def before_login(self) -> None:
        pid = os.getpid()
        if self.armed is None or pid == self.main:
            return
        self.logins[pid] += 1
        marker, login, delay = self.armed
        if self.logins[pid] == login and _first(marker):
            self.log.write("armed", pid=pid, delay=f"{delay * 1000:.2f}ms")
            threading.Timer(delay, self._kill, (pid,)).start()

    def _kill(self, pid: int) -> None:
        self.log.write("kill", pid=pid)
        os.kill(pid, signal.SIGKILL)


class Lister(AdminSession):
    """What graphd lists (this session left out), sampled meanwhile."""

    def __init__(self, address: str) -> None:
        super().__init__(address)
        self.high_water = 0

    @contextlib.contextmanager
    def watch(self) -> Any:
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(0.01):
                with contextlib.suppress(Exception):
                    self.high_water = max(self.high_water, len(self.others()))

        thread = threading.Thread(target=sample, daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def end(self, sessions: set[int]) -> None:
        for session_id in sessions:
            self.session.execute(f"KILL SESSION {session_id}")


def where_it_landed(log: EventLog, since: float) -> str:
    """The point of the victim's login the kill hit, from the server's events after it was
    armed (the next login to arrive is the victim's)."""
    events = [event for event in log.read() if event.time >= since]
    kill = next((event for event in events if event.name == "kill"), None)
    armed = next((event for event in events if event.name == "armed"), None)
    if kill is None or armed is None:
        return "no kill"
    login = next((e for e in events if e.name == "login" and e.time >= armed.time), None)
    if login is None or login.time > kill.time:
        return "request not at graphd yet"
    client = login.fields["client"]
    later = {e.name: e.time for e in events if e.fields.get("client") == client}
    if later.get("session", float("inf")) > kill.time:
        return "session not made yet"
    if later.get("answered", float("inf")) > kill.time:
        return "answer not sent yet"
    return "answer sent (unread, or the slot written, or USE)"


def one_run(address: str, kill: str, killer: LoginKiller, log: EventLog,
            folder: str) -> tuple[int, int, str]:
    """One job: sessions left, the high-water mark, where the kill landed."""
    marker = os.path.join(folder, f"killed-{time.time_ns()}")
    started = time.time()
    if kill == "login":
        killer.arm(marker, random.randint(1, 4), random.uniform(0, LOGIN_KILL_SECONDS))
        dataset = Items(None, marker)
    else:
        dataset = Items(40, marker)
    lister = Lister(address)
    servers = {child.pid for child in psutil.Process().children()}
    try:
        loader = mploader.DataLoader(
            dataset, batch_size=4, num_workers=2, worker_threads=8, max_worker_restarts=1,
            worker_hooks=NebulaHooks([address], space=citation.CITATION_SPACE),
            multiprocessing_context="fork",
        )
        with lister.watch():
            items = sorted(torch.cat([torch.as_tensor(batch) for batch in loader]).tolist())
        assert items == list(range(ITEMS)), "an item was lost or repeated"
        del loader
        deadline = time.monotonic() + 30
        while {c.pid for c in psutil.Process().children()} - servers:
            assert time.monotonic() < deadline, "the job's processes did not exit"
            time.sleep(0.01)
        time.sleep(1.0)  # "a second after every process of the job had exited"
        left = lister.others()
        lister.end(left)
        landed = where_it_landed(log, started) if kill == "login" else "after an item"
        return len(left), lister.high_water, landed
    finally:
        killer.armed = None
        lister.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--kill", choices=["login", "item"], default="login")
    parser.add_argument("--busy", action="store_true",
                        help="one spinning process per core meanwhile")
    parser.add_argument("--login-delay-ms", default=None, metavar="BEFORE,AFTER",
                        help="the server holds each login this long before and after it makes "
                        "the session (default 2,2 with --kill login, 0,0 with --kill item)")
    parser.add_argument("--seed", type=int, default=None)
    arguments = parser.parse_args()
    random.seed(arguments.seed)
    delays = arguments.login_delay_ms or ("2,2" if arguments.kill == "login" else "0,0")
    before, _, after = delays.partition(",")
    login_delay = (float(before), float(after or 0))
    burners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(os.cpu_count() or 1 if arguments.busy else 0)
    ]
    folder = tempfile.mkdtemp(prefix="killed-logins-")
    log = EventLog(os.path.join(folder, "events.log"))
    killer = LoginKiller(log)
    results: list[tuple[int, int, str]] = []
    try:
        with start_server_process(preload="citation", nodes=ITEMS, feature_dim=4, classes=3,
                                  cites_per_node=2, latency_ms=2, event_log=log.path,
                                  login_delay_ms=login_delay) as server:
            for run in range(arguments.runs):
                left, high_water, landed = one_run(server.address, arguments.kill, killer,
                                                   log, folder)
                results.append((left, high_water, landed))
                print(f"run {run + 1}: {left} sessions left, high water {high_water}, "
                      f"kill: {landed}", flush=True)
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    machine = f"busy ({len(burners)} spinning processes)" if arguments.busy else "idle"
    runs_with_leaks = sum(1 for left, _, _ in results if left)
    print(f"\n--kill {arguments.kill}, {machine}, {len(results)} runs: "
          f"{runs_with_leaks} runs left sessions, {sum(r[0] for r in results)} sessions left; "
          f"high water {Counter(r[1] for r in results)}")
    for landed, count in Counter(r[2] for r in results).most_common():
        print(f"  kill landed: {landed}: {count}")
    return 1 if runs_with_leaks else 0


if __name__ == "__main__":
    sys.exit(main())
