"""The graphd sessions of one process, shared by its fetch threads, under the host's budget.

A worker with ``worker_threads=T`` used to open T sessions; 8 ranks x 4 workers x 16 threads is
512 sessions, over graphd's default cap of 300 per user and client IP.  Here a process keeps a
:class:`SessionPool`: each thread's :class:`PooledSession` borrows a session **per statement**
(every statement stands alone: the space is set when a session is made, and nothing else lives
in a session between statements), so a session is never used by two threads at once, and a
process needs only as many sessions as statements it has in flight, or fewer: threads wait for a
session of their own process.

* **Growth.**  A thread that finds no idle session logs one in, one login at a time per process,
  and only after taking a slot of the host-wide budget (:mod:`.budget`), which names the login
  from before its request leaves (:mod:`.logins`).  A refused login
  (budget full, or graphd's cap: "Too many sessions") holds growth back with exponential backoff
  and jitter; the process goes on with the sessions it has.  A process with none marks the budget
  *hungry*, and processes holding several give one back, so every process gets one.
* **The deadline.**  Only a process that cannot get even one session within ``retry_seconds``
  fails, with :class:`NebulaSessionLimitError` naming the cap, the sessions the host holds, and
  the ways out.
* **graphd going away.**  A statement whose connection broke is retried on another session with
  exponential backoff and jitter for up to ``retry_seconds`` in total (a graphd restart, a
  failover), then it is a :class:`NebulaConnectionError` naming the address and the wait.  A
  session graphd forgot (idle expiry, ``KILL SESSION``, a restart) is renewed at once.
  Statements are reads; a retried write may run twice (NebulaGraph inserts overwrite).
* **Release.**  The pool closes (signing every session out) when its last handle closes, at
  the worker's exit.  A session whose sign-out could not be confirmed keeps its slot's record, so
  the next sweep or the next taker of that slot signs it out.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mploader.errors import MploaderError
from mploader.integrations.nebula.backoff import FIRST_WAIT_SECONDS, LONGEST_WAIT_SECONDS, Backoff
from mploader.integrations.nebula.budget import HostSessionBudget, LoginInFlight, SessionSlot
from mploader.integrations.nebula.errors import (
    NebulaConnectionError,
    NebulaError,
    NebulaQueryError,
    NebulaSessionLimitError,
    NebulaSessionLostError,
)
from mploader.integrations.nebula.logins import settle_dead_logins, sign_in, sign_out_named
from mploader.integrations.nebula.session import (
    DroppedInForkedChild,
    NebulaSession,
    describe_addresses,
    sign_out,
)

if TYPE_CHECKING:
    from nebula3.Config import Config
    from nebula3.data.ResultSet import ResultSet

_log = logging.getLogger("mploader.nebula")

# How often a process holding several sessions looks at the budget's hungry mark (one stat()).
HUNGRY_CHECK_SECONDS = 0.25


@dataclass(frozen=True)
class PoolSettings:
    """What a pool needs to make sessions (from :class:`~.hooks.NebulaHooks`)."""

    addresses: tuple[tuple[str, int], ...]
    user: str
    password: str
    space: str | None
    config: Config | None
    session_budget: int
    retry_seconds: float

    @property
    def where(self) -> str:
        return describe_addresses(self.addresses)


@dataclass
class _Member:
    """One session of the pool and the budget slot it holds."""

    session: NebulaSession
    slot: SessionSlot


class _LoginRefused(MploaderError):
    """Internal: no slot was free, or graphd refused the login for its cap."""


_live_pools: DroppedInForkedChild[SessionPool] = DroppedInForkedChild(
    lambda pool: pool.forget()
)


class SessionPool:
    """The sessions of one process for one :class:`NebulaHooks`, shared by its fetch threads.

    Made by :meth:`NebulaHooks.session_pool` from the hooks' settings (a ``PoolSettings``).  Each
    thread uses it through a :class:`PooledSession`, which borrows a session per statement
    (:meth:`take`, then :meth:`give_back` or :meth:`discard`; a borrowed session comes with the
    budget slot it holds).  The pool grows one login at a time under the host-wide session
    budget, backs off while logins are refused, renews sessions graphd forgot, and signs every
    session out when its last handle closes.  A forked child drops an inherited pool without a
    word to graphd (:meth:`forget`).
    """

    def __init__(self, settings: PoolSettings) -> None:
        self.settings = settings
        self.pid = os.getpid()
        self.budget = HostSessionBudget(
            settings.user, settings.addresses, settings.session_budget
        )
        self.closed = False
        self.renewals = 0  # sessions graphd forgot and the pool replaced
        self.refusals = 0  # logins refused (budget full or graphd's cap), over the pool's life
        self.last_refusal = ""  # graphd's text of the last refusal for its cap
        self.high_water = 0  # the most sessions this pool held at once
        self._members: list[_Member] = []
        self._idle: list[_Member] = []
        self._handles = 0
        self._logging_in = False
        self._logins_started = 0
        self._logins_ended = 0
        # How the last login ended: None (a session), a refusal, or the error that stopped it.
        self._last_failure: BaseException | None = None
        self._grow_after = 0.0  # time.monotonic() before which no login is tried
        self._refused_in_a_row = 0
        self._hungry_checked_at = 0.0
        self._cond = threading.Condition()
        _live_pools.add(self)

    @property
    def size(self) -> int:
        """Sessions the pool holds now."""
        return len(self._members)

    # -- handles ---------------------------------------------------------------------------------

    def add_handle(self) -> None:
        """Count one more handle (a :class:`PooledSession`) on the pool; a ``NebulaError`` once
        the pool closed, or in another process than the pool's."""
        with self._cond:
            self._check_usable()
            self._handles += 1

    def drop_handle(self) -> None:
        """One handle closed; the last one closes the pool."""
        with self._cond:
            self._handles -= 1
            last = self._handles <= 0
        if last:
            self.close()

    # -- borrowing -------------------------------------------------------------------------------

    def take(self, deadline: float) -> _Member:
        """An idle session, or a new one; waits while the process may not grow.

        Past ``deadline`` with no session at all, the caller hears how one more login ended
        (the one under way, else its own, made at once: a backoff from earlier refusals is no
        refusal of this caller): refused for the cap or the budget,
        :class:`~mploader.NebulaSessionLimitError`; graphd out of reach,
        :class:`~mploader.NebulaConnectionError`.
        """
        decisive: int | None = None  # past the deadline: the login whose end decides
        while True:
            with self._cond:
                while True:
                    self._check_usable()
                    if self._idle:
                        return self._idle.pop()
                    now = time.monotonic()
                    if decisive is None and not self._members and now >= deadline:
                        decisive = self._logins_started + (0 if self._logging_in else 1)
                    overdue = decisive is not None and not self._members
                    if decisive is not None and overdue and self._logins_ended >= decisive:
                        raise self._no_session_error()
                    if not self._logging_in and (overdue or self._may_grow(now)):
                        self._logging_in = True
                        self._logins_started += 1
                        break
                    self._cond.wait(self._wait_seconds(now, deadline, overdue))
            member, failure = None, None
            try:
                member = self._login()
            except BaseException as error:
                failure = error
                if not isinstance(error, _LoginRefused):
                    raise  # graphd out of reach: the caller backs off
            finally:
                self._login_ended(member, failure)
            if member is not None:
                return member

    def _may_grow(self, now: float) -> bool:
        """Whether a login may start now: no backoff holds growth back, nobody is starving."""
        return now >= self._grow_after and not self._yielding()

    def _wait_seconds(self, now: float, deadline: float, overdue: bool) -> float:
        """How long to wait for a session given back, a login's end, or the next chance to
        grow (past the deadline: only for the login under way, which notifies)."""
        wake = self._grow_after if now < self._grow_after else now + 0.1
        if not overdue:
            wake = min(wake, deadline)
        return max(0.001, wake - now)

    def _login_ended(self, member: _Member | None, failure: BaseException | None) -> None:
        with self._cond:
            self._logging_in = False
            self._logins_ended += 1
            self._last_failure = failure
            if member is not None:
                self._add(member)
            elif isinstance(failure, _LoginRefused):
                self._refused()
            self._cond.notify_all()

    def _no_session_error(self) -> BaseException:
        """What a caller with no session past its deadline hears: the last login's own error
        (a copy: several threads raise it), or, when logins were refused, the session limit."""
        failure = self._last_failure
        if isinstance(failure, Exception) and not isinstance(failure, _LoginRefused):
            return copy.copy(failure)
        return self._limit_error()

    def give_back(self, member: _Member) -> None:
        """``member`` is free again (or given up for a hungry process, or the pool closed)."""
        with self._cond:
            shed = self.closed or (len(self._members) > 1 and self._someone_hungry())
            if shed:
                self._members.remove(member)
            else:
                self._idle.append(member)
            self._cond.notify()
        if shed:
            _close_member(member)

    def discard(self, member: _Member, forgotten: bool) -> None:
        """``member``'s session is unusable: ``forgotten`` (graphd no longer knows it) or its
        connection broke (graphd may still have it: signed out over a connection of its own
        when possible, else its slot keeps the record)."""
        with self._cond:
            with contextlib.suppress(ValueError):
                self._members.remove(member)
            if forgotten:
                self.renewals += 1
            self._cond.notify_all()
        session_id, address = member.session.session_id, member.session.address
        member.session.detach()  # no traffic on its socket: broken, or graphd forgot it
        signed_out = forgotten or session_id is None
        if session_id is not None and not signed_out:
            with contextlib.suppress(Exception):
                sign_out(address, [session_id])
                signed_out = True
        member.slot.release(signed_out)

    # -- the end ---------------------------------------------------------------------------------

    def close(self) -> None:
        """Sign every session out and give their slots back; idempotent."""
        if self.pid != os.getpid():
            self.forget()
            return
        with self._cond:
            self.closed = True
            members, self._members, self._idle = self._members, [], []
            self._cond.notify_all()
        _sign_out_members(members)
        for member in members:
            member.session.detach()  # signed out already: its sockets close without a word
        _live_pools.discard(self)

    def abandon(self) -> None:
        """The main process is gone and this worker is about to end: sign every session out
        over connections of their own (threads may be mid-statement on theirs)."""
        with self._cond:
            self.closed = True
            members, self._members, self._idle = self._members, [], []
        _sign_out_members(members)

    def forget(self) -> None:
        """In a forked child: drop the parent's sessions and slots without touching them."""
        self.closed = True
        self._cond = threading.Condition()  # the parent's may have been held at fork time
        for member in self._members:
            member.slot.forget()  # the sessions detach themselves (session.py's fork hook)
        self._members, self._idle = [], []
        _live_pools.discard(self)

    # -- inside ----------------------------------------------------------------------------------

    def _login(self) -> _Member:
        """A new session in a slot of the budget's; the slot names the login throughout
        (:func:`~.logins.sign_in`), and what a dead holder left in it is signed out."""
        slot = self.budget.try_acquire()
        if slot is None:
            raise _LoginRefused("every slot of the host's session budget is held")
        try:
            sign_out_named([slot])  # a dead process's sessions: signed out first
            settings = self.settings
            session = NebulaSession(
                settings.addresses, settings.user, settings.password, settings.space,
                settings.config, reconnect=False,
            )
            try:
                signed_in = sign_in(slot, session)
            except NebulaSessionLimitError as error:
                self.last_refusal = str(error)
                raise _LoginRefused(str(error)) from error
            dead = [record for record in slot.inherited if isinstance(record, LoginInFlight)]
            if dead:  # a dead process's logins in flight: looked for with the new session
                settlement = settle_dead_logins(self.budget, settings.user, signed_in, dead)
                unsettled = settlement.unsettled
                slot.settled([r for r in slot.inherited if r not in dead or r in unsettled])
        except BaseException:
            slot.release(signed_out=False)  # its records say what may be left on graphd
            raise
        return _Member(session, slot)

    def _add(self, member: _Member) -> None:
        self._members.append(member)
        self.high_water = max(self.high_water, len(self._members))
        self._refused_in_a_row = 0
        self._grow_after = 0.0

    def _refused(self) -> None:
        """A login was refused: hold growth back (backoff with jitter); with no session at all,
        ask the host's other processes for one."""
        self.refusals += 1
        self._refused_in_a_row += 1
        wait = min(LONGEST_WAIT_SECONDS, FIRST_WAIT_SECONDS * 2 ** min(self._refused_in_a_row, 8))
        self._grow_after = time.monotonic() + wait * random.uniform(0.5, 1.0)
        if not self._members:
            self.budget.mark_hungry()

    def _yielding(self) -> bool:
        """A process that has sessions does not grow while another has none."""
        return bool(self._members) and self._someone_hungry()

    def _someone_hungry(self) -> bool:
        now = time.monotonic()
        if now - self._hungry_checked_at < HUNGRY_CHECK_SECONDS:
            return self._hungry
        self._hungry_checked_at = now
        self._hungry = self.budget.someone_hungry()
        return self._hungry

    _hungry = False

    def _limit_error(self) -> NebulaSessionLimitError:
        settings = self.settings
        cap = self.last_refusal or "none refused by graphd itself"
        return NebulaSessionLimitError(
            f"no session on NebulaGraph at {settings.where} as {settings.user!r} within "
            f"{settings.retry_seconds:g} s: this host's processes hold {self.budget.held()} of "
            f"its budget of {settings.session_budget} sessions "
            f"(NebulaHooks(session_budget=...)), and graphd caps sessions per user and client "
            f"IP (max_sessions_per_ip_per_user, 300 by default; last refusal: {cap}). Ways out: "
            "fewer ranks or workers on this host, a lower session_budget shared fairly, raising "
            "max_sessions_per_ip_per_user in nebula-graphd.conf, or ending the clients that "
            "hold sessions (SHOW SESSIONS, KILL SESSION <id>)"
        )

    def _check_usable(self) -> None:
        if self.pid != os.getpid():
            raise NebulaError(
                f"this session pool belongs to process {self.pid}, not {os.getpid()}; "
                "use mploader.worker_session() in each process"
            )
        if self.closed:
            raise NebulaError(f"the sessions to NebulaGraph at {self.settings.where} are closed")


def _close_member(member: _Member) -> None:
    member.session.close()  # signs out and waits one round trip; never raises
    member.slot.release(signed_out=True)


def _sign_out_members(members: list[_Member]) -> None:
    """Sign ``members``' sessions out, one connection and one round trip per graphd (not one
    per session: at 200 ms a statement, a worker's 40 sessions closed one by one outlast its
    exit), and give their slots back.  A graphd out of reach leaves its sessions on record in
    their slots, for the next login or the main process to sign out."""
    by_address: dict[str, list[_Member]] = {}
    for member in members:
        by_address.setdefault(member.session.address, []).append(member)
    for address, group in by_address.items():
        ids = [m.session.session_id for m in group if m.session.session_id is not None]
        signed_out = False
        with contextlib.suppress(Exception):
            sign_out(address, ids)
            signed_out = True
        for member in group:
            member.slot.release(signed_out)


class PooledSession:
    """A thread's view of its process's :class:`SessionPool`: what ``worker_session()`` returns
    with :class:`~.hooks.NebulaHooks`.  Same statements as :class:`NebulaSession`
    (``execute``, ``execute_json``); each borrows a session of the pool for that statement."""

    def __init__(self, pool: SessionPool) -> None:
        pool.add_handle()
        self.pool = pool
        self.closed = False
        self._last_session_id: int | None = None

    @property
    def session_id(self) -> int | None:
        """The id of the graphd session that ran this handle's last statement; before the first
        statement, the id of one of the pool's sessions (logged in if need be); ``None`` once
        the handle is closed."""
        if self.closed:
            return None
        if self._last_session_id is None:
            self._run("", lambda session, _: None)
        return self._last_session_id

    @property
    def reconnects(self) -> int:
        """Sessions of the pool that graphd forgot and were renewed."""
        return self.pool.renewals

    def execute(self, statement: str) -> ResultSet:
        """Run ``statement``: its ``ResultSet``, or :class:`~mploader.NebulaQueryError` if it
        failed."""
        return self._run(statement, NebulaSession.execute)

    def execute_json(self, statement: str) -> dict[str, Any]:
        """Run ``statement`` through graphd's JSON interface (see
        :meth:`NebulaSession.execute_json`)."""
        return self._run(statement, NebulaSession.execute_json)

    def _run(self, statement: str, send: Callable[[NebulaSession, str], Any]) -> Any:
        if self.closed:
            where = self.pool.settings.where
            raise NebulaError(f"this session to NebulaGraph at {where} is closed")
        pool = self.pool
        backoff = Backoff(pool.settings.retry_seconds)
        deadline = backoff.started + pool.settings.retry_seconds
        renewed = False
        while True:
            try:
                member = pool.take(deadline)
            except (NebulaSessionLimitError, NebulaSessionLostError):
                raise
            except NebulaConnectionError as error:
                self._wait_or_raise(backoff, error)
                continue
            try:
                answer = send(member.session, statement)
            except NebulaSessionLostError as error:
                pool.discard(member, forgotten=True)
                if renewed:  # forgotten twice in a row: graphd may be restarting
                    self._wait_or_raise(backoff, error)
                renewed = True
                continue
            except NebulaQueryError:
                pool.give_back(member)
                raise
            except NebulaConnectionError as error:
                pool.discard(member, forgotten=False)
                self._wait_or_raise(backoff, error)
                continue
            except BaseException:
                pool.discard(member, forgotten=False)
                raise
            self._last_session_id = member.session.session_id
            pool.give_back(member)
            return answer

    def _wait_or_raise(self, backoff: Backoff, error: NebulaError) -> None:
        if backoff.sleep():
            return
        settings = self.pool.settings
        raise NebulaConnectionError(
            f"NebulaGraph at {settings.where} did not answer for {backoff.waited:.1f} s "
            f"({backoff.attempts} retries with backoff; NebulaHooks(retry_seconds="
            f"{settings.retry_seconds:g})): {error}"
        ) from error

    def close(self) -> None:
        """Close this handle; the pool's last handle signs its sessions out.  Idempotent."""
        if self.closed:
            return
        self.closed = True
        self.pool.drop_handle()

    def detach(self) -> None:
        """In a forked child: drop this inherited handle without touching the parent's pool."""
        self.closed = True

    def __reduce__(self) -> Any:
        raise TypeError(
            "a NebulaGraph session belongs to the process that opened it and cannot be pickled; "
            "pickle the NebulaHooks (or NebulaFeatureStore) instead"
        )

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return (
            f"PooledSession({self.pool.settings.where}, pool of {self.pool.size} in pid "
            f"{self.pool.pid}, {state})"
        )
