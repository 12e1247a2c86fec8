"""mc0 client sessions (broker/sessions.py) with fake times: lazy creation per identity, a NOOP due after
0.95 x TTL without sending, expiry after 1.05 x TTL of silence, and no TTL never expiring.
"""

from __future__ import annotations

import pytest

from broker.engine import Subscriber
from broker.sessions import EXPIRE_AFTER, NOOP_AFTER, Session, Sessions

TTL = 30.0  # seconds: the real connector's TTL 30000 ms
START = 1000.0  # a monotonic clock does not start at zero
EPSILON = 0.01


def make(ttl: float | None = TTL, identity: bytes = b"client") -> tuple[Sessions, Session]:
    sessions = Sessions()
    session = sessions.get_or_create(identity, START, subscriber_limit=50)
    session.ttl = ttl
    return sessions, session


def test_expiry_is_the_reference_brokers_and_the_noop_leaves_half_a_ttl_of_slack() -> None:
    assert EXPIRE_AFTER == 1.05
    assert NOOP_AFTER == 0.5


def test_get_or_create_makes_one_session_per_identity() -> None:
    sessions = Sessions()
    first = sessions.get_or_create(b"a", START, subscriber_limit=7)
    assert first.identity == b"a"
    assert first.last_heard == first.last_sent == START
    assert first.ttl is None
    assert isinstance(first.subscriber, Subscriber)
    assert first.subscriber.limit == 7
    assert first.subscriber.owner is first
    assert sessions.get_or_create(b"a", START + 5, subscriber_limit=99) is first
    assert first.last_heard == START  # finding a session does not touch it
    second = sessions.get_or_create(b"b", START, subscriber_limit=7)
    assert second is not first
    assert len(sessions) == 2


def test_remove_forgets_a_session() -> None:
    sessions, session = make()
    assert sessions.remove(b"client") is session
    assert sessions.remove(b"client") is None
    assert len(sessions) == 0
    assert sessions.due(START + 10 * TTL) == ([], [])


def test_sessions_hash_by_identity_of_the_object() -> None:
    _, a = make(identity=b"same")
    _, b = make(identity=b"same")
    assert a != b
    assert len({a, b}) == 2


def test_nothing_is_due_while_traffic_is_recent() -> None:
    sessions, _ = make()
    assert sessions.due(START) == ([], [])
    assert sessions.due(START + NOOP_AFTER * TTL - EPSILON) == ([], [])


def test_noop_due_after_095_ttl_without_sending() -> None:
    sessions, session = make()
    noop, expired = sessions.due(START + NOOP_AFTER * TTL + EPSILON)
    assert noop == [session]
    assert expired == []


def test_sending_postpones_the_noop() -> None:
    sessions, session = make()
    session.last_sent = START + 20
    assert sessions.due(START + NOOP_AFTER * TTL + EPSILON) == ([], [])
    session.last_heard = START + 20  # the client is alive too, so the only question is the NOOP
    assert sessions.due(START + 20 + NOOP_AFTER * TTL - EPSILON) == ([], [])
    assert sessions.due(START + 20 + NOOP_AFTER * TTL + EPSILON) == ([session], [])


def test_hearing_from_the_client_does_not_postpone_the_noop() -> None:
    # The NOOP keeps the client's own 1.05 x TTL patience alive; it depends on what we sent, not received.
    sessions, session = make()
    session.last_heard = START + 20
    noop, expired = sessions.due(START + NOOP_AFTER * TTL + EPSILON)
    assert noop == [session]
    assert expired == []


def test_a_silent_client_is_still_there_just_before_105_ttl() -> None:
    sessions, session = make()
    noop, expired = sessions.due(START + EXPIRE_AFTER * TTL - EPSILON)
    assert expired == []
    assert noop == [session]


def test_expiry_after_105_ttl_of_silence() -> None:
    sessions, session = make()
    noop, expired = sessions.due(START + EXPIRE_AFTER * TTL + EPSILON)
    assert expired == [session]
    assert noop == []  # no NOOP for a client about to be dropped


def test_sending_does_not_keep_a_silent_client_alive() -> None:
    sessions, session = make()
    session.last_sent = START + 31
    _, expired = sessions.due(START + EXPIRE_AFTER * TTL + EPSILON)
    assert expired == [session]


def test_hearing_from_the_client_keeps_it_alive() -> None:
    sessions, session = make()
    session.last_heard = START + 30
    session.last_sent = START + 30
    noop, expired = sessions.due(START + EXPIRE_AFTER * TTL + EPSILON)  # would have expired without it
    assert noop == []
    assert expired == []
    noop, expired = sessions.due(START + 30 + EXPIRE_AFTER * TTL - EPSILON)
    assert noop == [session]
    assert expired == []
    _, expired = sessions.due(START + 30 + EXPIRE_AFTER * TTL + EPSILON)
    assert expired == [session]


@pytest.mark.parametrize("later", [TTL, 100 * TTL, 1e9])
def test_no_ttl_never_expires(later: float) -> None:
    sessions, _ = make(ttl=None)
    assert sessions.due(START + later) == ([], [])


def test_each_session_follows_its_own_ttl() -> None:
    sessions = Sessions()
    short = sessions.get_or_create(b"short", START, subscriber_limit=10)
    short.ttl = 1.0
    long = sessions.get_or_create(b"long", START, subscriber_limit=10)
    long.ttl = 60.0
    forever = sessions.get_or_create(b"forever", START, subscriber_limit=10)
    assert forever.ttl is None
    noop, expired = sessions.due(START + 2.0)
    assert expired == [short]
    assert noop == []
    noop, expired = sessions.due(START + 58.0)
    assert expired == [short]
    assert noop == [long]
