"""Where a client of a cluster goes next (connector/base.py), without sockets: a member whose port refused a
connect is left at once and skipped for a while; a member that still names such a broker as its leader is
not followed there; once every member refused lately, moves are paced as for a single broker, and only while
they have."""

from __future__ import annotations

import pytest
import zmq

from connector import base
from connector.base import LEADER_GONE_FIRST, LEADER_GONE_FOR, LEADER_GONE_WAIT, ClientBase
from connector.connection import REFUSED_FOR, REFUSED_FOR_MOVING, Unreachable

A, B, C = (f"tcp://127.0.0.1:{port}" for port in (1, 2, 3))


def client() -> ClientBase:
    target = ClientBase(f"{A},{B},{C}", curve=False)
    target._watch = target._new_watch()
    return target


def refused(target: ClientBase, now: float) -> None:
    """The current member's port refuses a connect, as libzmq reports it."""
    target._on_event(zmq.EVENT_CONNECT_RETRIED, 20, now)


def frozen(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The connector's clock, held at 100 s: a test moves it by hand."""
    clock = [100.0]
    monkeypatch.setattr(base.time, "monotonic", lambda: clock[0])
    return clock


def refused_by_a_then_b(target: ClientBase, now: float) -> None:
    """A refuses, then B: the client ends at C, the one member left that has not refused."""
    for expected in (B, C):
        refused(target, now)
        assert target.endpoint == expected
        arrive(target)


def arrive(target: ClientBase, at: str | None = None) -> None:
    """The I/O side makes the move that is due (a new socket, a new watch); ``at``: to that member."""
    if at is not None:
        target.endpoint = at
    target._moving = False
    target._watch = target._new_watch()


def test_a_refused_member_is_left_at_once_and_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = frozen(monkeypatch)
    target = client()
    assert target._patient_watch(clock[0]).refused_for == REFUSED_FOR_MOVING
    refused(target, clock[0])
    assert target._moving
    assert target.endpoint == B
    assert target._move_due(clock[0]) == 0
    arrive(target)
    # B answers that A still leads (it has not noticed A is gone): the client waits a moment and asks C.
    assert target._move(A)
    assert target.endpoint == C
    assert target._move_due(clock[0]) == pytest.approx(LEADER_GONE_FIRST)
    arrive(target)
    assert target._move(None)
    assert target.endpoint == B, "A refused a moment ago: the next member is B, not A"
    clock[0] += REFUSED_FOR
    arrive(target)
    assert target._move(None)
    assert target.endpoint == C
    arrive(target)
    assert target._move(None)
    assert target.endpoint == A, "A's refusal is old now: it is tried again"


def test_once_every_member_refused_the_moves_are_paced(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = frozen(monkeypatch)
    target = client()
    refused_by_a_then_b(target, clock[0])
    assert target._patient_watch(clock[0]).refused_for == REFUSED_FOR, "no member left that has not refused"
    assert target._watch.event(zmq.EVENT_CONNECT_RETRIED, 20, clock[0]) is None
    verdict = target._watch.check(clock[0] + REFUSED_FOR)
    assert isinstance(verdict, Unreachable)


def test_the_patience_is_decided_at_the_refusal_not_at_the_connect(monkeypatch: pytest.MonkeyPatch) -> None:
    """A client that came to C while A and B had both just refused, and stayed connected: when C goes (a
    killed leader), A's and B's refusals are old, and C is left at its first refusal, not after a second."""
    clock = frozen(monkeypatch)
    target = client()
    refused_by_a_then_b(target, clock[0])
    target._on_event(zmq.EVENT_CONNECTED, 5, clock[0])
    target._on_event(zmq.EVENT_HANDSHAKE_SUCCEEDED, 0, clock[0])
    clock[0] += 2 * REFUSED_FOR  # connected to C meanwhile; A and B came back
    target._on_event(zmq.EVENT_DISCONNECTED, 5, clock[0])
    refused(target, clock[0])
    assert target._moving, "C refused once, and A has not refused for a while: the client goes on at once"
    assert target.endpoint == A


def test_a_connection_clears_the_members_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = frozen(monkeypatch)
    target = client()
    refused(target, clock[0])
    arrive(target)
    assert A in target._refused
    target.endpoint = A  # A came back, and the client connected there again
    target._watch = target._new_watch()
    target._on_event(zmq.EVENT_CONNECTED, 5, clock[0])
    assert A in target._refused, "something listens, but the handshake is not done"
    target._on_event(zmq.EVENT_HANDSHAKE_SUCCEEDED, 0, clock[0])
    assert A not in target._refused


def test_a_single_broker_keeps_its_patience() -> None:
    target = ClientBase(A, curve=False)
    target._watch = target._new_watch()
    assert target._patient_watch(100.0).refused_for == REFUSED_FOR


def test_what_the_socket_being_left_says_is_about_its_own_member(monkeypatch: pytest.MonkeyPatch) -> None:
    """A's socket reports more refused connects after the client chose B, before the I/O side moves: they
    are A's, so B is not taken for a member that refused (the next failover would skip it)."""
    clock = frozen(monkeypatch)
    target = client()
    refused(target, clock[0])
    assert target.endpoint == B
    assert target._moving
    clock[0] += 0.02
    refused(target, clock[0])  # libzmq retried A's connect once more: the same socket, the same watch
    target._verdict(target._watch.check(clock[0] + REFUSED_FOR), clock[0] + REFUSED_FOR)
    assert B not in target._refused
    assert A in target._refused
    assert target.endpoint == B
    assert target.moves == 1


def test_the_wait_for_members_that_still_name_a_gone_leader_doubles(monkeypatch: pytest.MonkeyPatch) -> None:
    """An election after a killed leader takes about ten milliseconds: the first wait is short, and each
    member that still names the gone leader doubles it, up to LEADER_GONE_WAIT; a leader's answer to CONNECT
    starts it short again."""
    clock = frozen(monkeypatch)
    target = client()
    refused(target, clock[0])
    waits = []
    for _ in range(5):
        arrive(target)
        assert target._move(A)  # still named as the leader: it refused a moment ago
        waits.append(target._move_due(clock[0]))
    assert waits == pytest.approx([LEADER_GONE_FIRST, 2 * LEADER_GONE_FIRST, 4 * LEADER_GONE_FIRST,
                                   LEADER_GONE_WAIT, LEADER_GONE_WAIT])
    target._moves_done()
    arrive(target)
    assert target._move(A)
    assert target._move_due(clock[0]) == pytest.approx(LEADER_GONE_FIRST)


def test_a_leader_that_refused_a_while_ago_is_followed_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A refused within the last second, was restarted, and is the leader now: a member that names it is
    followed there at once, not taken for one that still names the dead leader."""
    clock = frozen(monkeypatch)
    target = client()
    refused(target, clock[0])
    arrive(target)
    clock[0] += 2 * LEADER_GONE_FOR  # A's refusal is older than that, though within REFUSED_FOR
    assert target._move(A)
    assert target.endpoint == A
    assert target._move_due(clock[0]) == 0


def test_answers_with_the_same_news_move_the_client_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The old connection answers several commands naming the dead leader at once: one move, one wait."""
    clock = frozen(monkeypatch)
    target = client()
    refused(target, clock[0])
    arrive(target)
    assert target._move(A)
    assert target.endpoint == C
    assert target._move(A)
    assert target._move(A)
    assert target.endpoint == C
    assert target.moves == 2
    assert target._move_due(clock[0]) == pytest.approx(LEADER_GONE_FIRST)


def test_with_every_other_member_refused_lately_the_oldest_refusal_goes_first(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """B refused 0.9 s ago (it was killed and started again since) and A just now; C, where the client is,
    names A: the client asks C again after the wait (it answered: it is alive), not A, whose port refused
    a moment ago."""
    clock = frozen(monkeypatch)
    target = client()
    arrive(target, at=B)
    refused(target, clock[0])
    clock[0] += 0.9
    arrive(target, at=A)
    refused(target, clock[0])
    assert target.endpoint == C, "the only member that has not refused lately"
    arrive(target)
    assert target._move(A)
    assert target.endpoint == C
    assert target._move_due(clock[0]) == pytest.approx(LEADER_GONE_FIRST)


def test_a_client_of_a_cluster_leaves_a_silent_member_within_seconds() -> None:
    """The heartbeat TTL a client is not given: 30 s to one broker, 3 s to a cluster's members, so that a
    leader that falls silent with its connections open (its machine froze or died) is left soon after the
    election; a TTL given (or none) is kept either way."""
    assert ClientBase(A, curve=False)._core.ttl == base.TTL_MS / 1000 == 30.0
    cluster = client()
    assert cluster._core.ttl == base.CLUSTER_TTL_MS / 1000 == 3.0
    cluster._core.last_heard = 100.0
    assert not cluster._core.broker_silent(103.1)
    assert cluster._core.broker_silent(103.2)
    assert ClientBase(f"{A},{B}", curve=False, ttl=30_000)._core.ttl == 30.0
    assert ClientBase(f"{A},{B}", curve=False, ttl=None)._core.ttl is None
    assert ClientBase(A, curve=False, ttl=2_000)._core.ttl == 2.0
