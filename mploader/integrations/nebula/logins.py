"""Logins that a slot always accounts for, and how what dead processes left on graphd goes.

A SIGKILL can land anywhere in a login.  graphd makes the session when the ``authenticate``
request arrives, and the session's id travels only in the answer: from the moment the request
leaves until the id is written down, nothing on this host can name that session.  A worker
killed there (a fetch thread's login in flight while another thread's item killed it) left a
session that no sweep could find, for graphd's 8 h idle timeout.  So the slot a login holds says
at every moment what its holder may have on graphd (:func:`sign_in`):

1. ``login <address> <since>`` before the request is sent (:class:`LoginInFlight`);
2. ``<session id> <address>`` as soon as graphd answers, before the session is first used
   (``USE``) (:class:`NamedSession`);
3. nothing, once the session is signed out.

What a dead holder left is settled by whoever takes its slot (:class:`~.pool.SessionPool`) or
sweeps (:func:`sweep_stale_sessions`, the main process when a worker dies).  A named session is
signed out by id.  A login in flight is looked for on graphd (:func:`settle_dead_logins`):
``SHOW SESSIONS`` lists every session with its user, client IP and creation time, and the dead
login's session is the first one made within ``LOGIN_WINDOW_SECONDS`` of the login's start, by
this graphd user, from this host as graphd sees it (the lister's own session says which IP that
is, and where graphd's clock stands against this host's), that no slot names.  Live logins
elsewhere on the host are in flight in their slots too: a session one of them may have made is
left until they name theirs (one round trip), so a live process's new session is never taken for
a dead one.  A session graphd has not listed yet (the request was still on its way) is waited
for until the window closes; one never listed in it was never made.
"""

from __future__ import annotations

import calendar
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from mploader.integrations.nebula.budget import (
    HostSessionBudget,
    LoginInFlight,
    NamedSession,
    SessionSlot,
)
from mploader.integrations.nebula.errors import (
    NebulaAuthError,
    NebulaError,
    NebulaSessionLimitError,
)
from mploader.integrations.nebula.session import NebulaSession, sign_out

_log = logging.getLogger("mploader.nebula")

# graphd makes a login's session within this long after the request left, or not at all (it
# takes one round trip to graphd and one to metad): a dead login's session is looked for among
# the sessions made in that window, and a sweep waits until the window has closed for one that
# is not listed yet.  Only a death in mid-login ever waits, and at most this long.
LOGIN_WINDOW_SECONDS = 2.0
# How often the sweep lists the sessions again while it waits (for a dead login's session to be
# listed, or for a live login to name its own).
LIST_AGAIN_SECONDS = 0.02
# graphd lists creation times to the microsecond; this covers rounding on both clocks.
CLOCK_SLACK_SECONDS = 0.001


@dataclass(frozen=True)
class SignedIn:
    """A session :func:`sign_in` made, and when (this host's ``time.time()``) its login was
    sent and answered: graphd made it in between, which places graphd's clock on this host's."""

    session: NebulaSession
    session_id: int
    address: str
    sent: float
    answered: float


def sign_in(slot: SessionSlot, session: NebulaSession) -> SignedIn:
    """Connect, sign in and ``USE`` the space with ``slot`` naming the login at every step.

    A login graphd refused leaves no record; one that broke before its answer leaves its
    ``login`` record (graphd may have made the session) for the next sweep or taker."""
    address = session.connect()
    sent = time.time()
    slot.note(LoginInFlight(address, sent))
    try:
        session_id = session.sign_in()
    except (NebulaSessionLimitError, NebulaAuthError):
        slot.note(None)  # graphd answered: no session was made
        raise
    answered = time.time()
    slot.note(NamedSession(session_id, address))
    try:
        session.use_space()
    except BaseException:
        with contextlib.suppress(Exception):
            sign_out(address, [session_id])  # confirmed over a connection of its own
            slot.note(None)
        raise
    return SignedIn(session, session_id, address, sent, answered)


def sign_out_named(slots: list[SessionSlot]) -> int:
    """Sign out the sessions ``slots`` inherited by name, one connection per graphd; what
    could not be signed out stays on record.  Returns how many were signed out."""
    by_address: dict[str, list[tuple[SessionSlot, NamedSession]]] = {}
    for slot in slots:
        for record in slot.inherited:
            if isinstance(record, NamedSession):
                by_address.setdefault(record.address, []).append((slot, record))
    signed_out = 0
    for address, group in by_address.items():
        try:
            sign_out(address, [record.session_id for _, record in group])
        except Exception as error:
            _log.warning("could not sign out %d sessions at %s: %s", len(group), address, error)
            continue
        for slot, record in group:
            slot.settled([kept for kept in slot.inherited if kept != record])
        signed_out += len(group)
    return signed_out


@dataclass
class Settlement:
    """What :func:`settle_dead_logins` did: the sessions it signed out, and the logins it could
    not settle (graphd could not be asked, or a session that may be theirs is still to come)."""

    signed_out: list[int] = field(default_factory=list)
    unsettled: list[LoginInFlight] = field(default_factory=list)


@dataclass(frozen=True)
class _Listed:
    """One row of ``SHOW SESSIONS``; ``created`` in seconds of graphd's clock."""

    session_id: int
    user: str
    client_ip: str
    created: float


def settle_dead_logins(
    budget: HostSessionBudget, user: str, lister: SignedIn, logins: list[LoginInFlight]
) -> Settlement:
    """Sign out the sessions that ``logins`` (of processes that died) made on graphd, found
    through ``lister``'s session as the module doc says; waits at most until the last login's
    window closes."""
    taken: dict[LoginInFlight, int] = {}
    closes = max(login.since for login in logins) + LOGIN_WINDOW_SECONDS
    while True:
        try:
            listing = _list_sessions(lister.session)
        except NebulaError as error:
            _log.warning("could not list the sessions on NebulaGraph: %s", error)
            return Settlement(unsettled=list(logins))
        me = listing.get(lister.session_id)
        if me is None:
            _log.warning("SHOW SESSIONS does not list the session %d that ran it",
                         lister.session_id)
            return Settlement(unsettled=list(logins))
        _match(budget, user, lister, me, listing, logins, taken)
        if len(taken) == len(logins) or time.time() > closes + _slack(lister):
            break
        time.sleep(LIST_AGAIN_SECONDS)
    settlement = Settlement()
    by_address: dict[str, list[LoginInFlight]] = {}
    for login in taken:
        by_address.setdefault(login.address, []).append(login)
    for address, group in by_address.items():
        try:
            sign_out(address, [taken[login] for login in group])
        except Exception as error:
            _log.warning("could not sign out %d sessions at %s: %s", len(group), address, error)
            settlement.unsettled += group
            continue
        settlement.signed_out += [taken[login] for login in group]
    now = time.time()
    settlement.unsettled += [  # not listed, and graphd may still make it
        login for login in logins
        if login not in taken and now <= login.since + LOGIN_WINDOW_SECONDS + _slack(lister)
    ]
    return settlement


def _match(
    budget: HostSessionBudget,
    user: str,
    lister: SignedIn,
    me: _Listed,
    listing: dict[int, _Listed],
    logins: list[LoginInFlight],
    taken: dict[LoginInFlight, int],
) -> None:
    """Add to ``taken`` each dead login's session that ``listing`` shows (see the module doc)."""
    offset = me.created - (lister.sent + lister.answered) / 2  # graphd's clock minus ours
    slack = _slack(lister)
    named: set[int] = set()
    live: list[LoginInFlight] = []
    for slot in budget.all_records():  # read after the listing: see the module doc
        named.update(r.session_id for r in slot.records if isinstance(r, NamedSession))
        own = slot.own
        if slot.held and isinstance(own, LoginInFlight) and own not in logins:
            live.append(own)  # a live process's login (one taken over is a dead one's)
    unnamed = sorted(
        (row.created - offset, row.session_id) for row in listing.values()
        if row.user == user and row.client_ip == me.client_ip and row.session_id != me.session_id
        and row.session_id not in named and row.session_id not in taken.values()
    )
    for login in sorted(logins, key=lambda login: login.since):
        if login in taken:
            continue
        made = next(
            ((when, session_id) for when, session_id in unnamed
             if login.since - slack <= when <= login.since + LOGIN_WINDOW_SECONDS + slack
             and session_id not in taken.values()),
            None,
        )
        if made is None:
            continue
        if any(other.since - slack <= made[0] for other in live):
            continue  # may be a live login's: it names its own within a round trip
        taken[login] = made[1]


def _slack(lister: SignedIn) -> float:
    """How far off graphd's clock may be placed: half the lister's login round trip."""
    return (lister.answered - lister.sent) / 2 + CLOCK_SLACK_SECONDS


def _list_sessions(session: NebulaSession) -> dict[int, _Listed]:
    result = session.execute("SHOW SESSIONS")
    columns = ("SessionId", "UserName", "ClientIp", "CreateTime")
    rows = zip(*(result.column_values(column) for column in columns), strict=True)
    return {
        int(session_id.as_int()): _Listed(
            int(session_id.as_int()), name.as_string(), client_ip.as_string(),
            _seconds(created.as_datetime()),
        )
        for session_id, name, client_ip, created in rows
    }


def _seconds(value: Any) -> float:
    """A nebula3 ``DateTimeWrapper`` as seconds since the epoch, read as UTC (graphd's clock,
    whatever its zone: only differences between its own times are used)."""
    whole = calendar.timegm((
        value.get_year(), value.get_month(), value.get_day(),
        value.get_hour(), value.get_minute(), value.get_sec(), 0, 0, 0,
    ))
    return whole + value.get_microsec() / 1e6


def sweep_stale_sessions(budget: HostSessionBudget, lister: NebulaSession) -> int:
    """Sign out what processes that died left on graphd (the records of their slots); returns
    how many sessions were signed out.  ``lister``, not yet connected, lists graphd's sessions
    when a dead login must be looked for; it signs in in one of the dead login's slots, so that
    a kill during the sweep leaves nothing either.  Run in the main process when a worker died."""
    with budget.stale_sessions() as found:
        swept = sign_out_named(found)
        logins = [r for slot in found for r in slot.inherited if isinstance(r, LoginInFlight)]
        if not logins:
            return swept
        home = next(slot for slot in found if any(r in logins for r in slot.inherited))
        try:
            signed_in = sign_in(home, lister)
        except NebulaError as error:
            _log.warning("could not sign in to look for sessions of dead logins: %s", error)
            return swept
        try:
            settlement = settle_dead_logins(budget, lister.user, signed_in, logins)
            for slot in found:
                slot.settled([
                    record for record in slot.inherited
                    if not isinstance(record, LoginInFlight) or record in settlement.unsettled
                ])
        finally:
            lister.detach()
            with contextlib.suppress(Exception):
                sign_out(signed_in.address, [signed_in.session_id])
                home.note(None)
        return swept + len(settlement.signed_out)
