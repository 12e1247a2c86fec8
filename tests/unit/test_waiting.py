"""The long polls' bookkeeping (broker/waiting.py): clients' waits under the broker-wide limit, a cluster
member's replica FETCHes under a bound of their own, places freed as waits are woken, expire or are
forgotten."""

from __future__ import annotations

from broker.waiting import Waits


def test_replica_waits_neither_take_nor_are_refused_clients_places() -> None:
    waits = Waits(limit=2)
    assert waits.park("client", b"a", "c1", 10.0)
    assert waits.park("client", b"b", "c2", 10.0)
    assert not waits.park("client", b"c", "c3", 10.0)  # the clients' limit
    # Replica FETCHes beyond the clients' limit still wait (refused, a follower would ask again at once) ...
    assert waits.park("member", b"a", "r1", 10.0, replicas=3)
    assert waits.park("member", b"b", "r2", 10.0, replicas=3)
    assert waits.park("member", b"c", "r3", 10.0, replicas=3)
    # ... under their own bound, which a member's claim without CURVE cannot get past.
    assert not waits.park("member", b"d", "r4", 10.0, replicas=3)
    assert (waits.count, waits.replicas, waits.refused) == (5, 3, 2)
    assert [wait.request for wait in waits.woken([b"a"])] == ["c1", "r1"]
    assert waits.park("client", b"c", "c3", 10.0)  # a client's place came free
    assert waits.park("member", b"d", "r4", 10.0, replicas=3)  # and a replica's
    assert waits.forget("member") == 3
    assert (waits.count, waits.replicas) == (2, 0)
    assert [wait.request for wait in waits.expired(11.0)] == ["c2", "c3"]
    assert (waits.count, waits.replicas) == (0, 0)


def test_a_topic_named_twice_in_one_commit_wakes_its_waits_once() -> None:
    """A turn's commit may name a topic twice: written, and its gate moved by a follower's acknowledgement
    (two followers' in one turn: twice more). Each wait on it is woken once; the same wait taken out twice
    stopped a cluster leader with a KeyError (found by random faults, a queue's leader)."""
    waits = Waits()
    assert waits.park("member", b"q", "r1", 10.0, replicas=4)
    assert waits.park("client", b"q", "c1", 10.0)
    assert waits.park("client", b"other", "c2", 10.0)
    assert [wait.request for wait in waits.woken([b"q", b"q", b"q"])] == ["r1", "c1"]
    assert (waits.count, waits.replicas) == (1, 0)
    assert [wait.request for wait in waits.expired(11.0)] == ["c2"]
