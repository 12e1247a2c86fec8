"""TTL heartbeats on real sockets: the broker's NOOP after half a TTL of silence towards a client, and the
drop of a client (with all its subscriptions) after 1.05 x TTL of silence from it. A client without TTL never
expires.

TTLs are a few hundred milliseconds and the broker's heartbeat tick is 10 ms, so each test takes about a
second. Timing bounds are deliberately loose on the late side (a loaded machine is slow) and tight on the
early side (the broker must never act before the TTL says so).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from conftest import BrokerFactory, DealerFactory, Peer

    from broker.server import Broker

pytestmark = pytest.mark.timeout(20)

TICK = 0.01


@pytest.fixture
def fast_broker(start_broker: BrokerFactory) -> Broker:
    return start_broker(heartbeat_tick=TICK)


def subscribers(peer: Peer, topic: str) -> int:
    return peer.stats()["topics"][topic]["subscribers"]


def keep_alive(peer: Peer, seconds: float, every: float) -> list[bytes]:
    """Send NOOP every ``every`` seconds for ``seconds``; returns the verbs of all received meanwhile."""
    verbs: list[bytes] = []
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        peer.send("NOOP")
        wait_until = time.monotonic() + min(every, left)
        while (remaining := wait_until - time.monotonic()) > 0:
            reply = peer.poll(remaining)
            if reply is not None:
                verbs.append(reply.verb)
    return verbs


def test_noop_after_half_a_ttl_of_silence(fast_broker: Broker, dealer: DealerFactory) -> None:
    peer = dealer(fast_broker.endpoint)
    peer.connect(ttl=400)  # the OK is the last thing the broker sent
    sent_ok = time.monotonic()
    frames = peer.recv_raw(1.0)
    waited = time.monotonic() - sent_ok
    assert frames == [b"", b"NOOP"]
    assert 0.5 * 0.4 - 0.03 <= waited <= 0.5 * 0.4 + 0.3, waited


def test_noop_keeps_the_clients_framing(fast_broker: Broker, dealer: DealerFactory) -> None:
    peer = dealer(fast_broker.endpoint, delimiter=False)
    peer.send_raw(b"CONNECT", b"VERSION", b"0.2", b"TTL", b"300", b"ID", b"1")
    assert peer.recv_raw() == [b"OK", b"ID", b"1"]
    assert peer.recv_raw(1.0) == [b"NOOP"]


def test_deliveries_count_as_traffic_so_no_noop_is_needed(fast_broker: Broker, dealer: DealerFactory) -> None:
    subscriber = dealer(fast_broker.endpoint)
    subscriber.connect(ttl=400)
    subscriber.sub("busy")
    publisher = dealer(fast_broker.endpoint)
    publisher.connect()
    verbs: list[bytes] = []
    end = time.monotonic() + 1.2
    while time.monotonic() < end:
        publisher.put("busy", "tick")
        subscriber.send("NOOP")
        while (reply := subscriber.poll(0.1)) is not None:
            verbs.append(reply.verb)
    assert verbs
    assert set(verbs) == {b"MESSAGE"}, "a client the broker keeps talking to needs no NOOP"


def test_silent_client_is_dropped_with_its_subscriptions(fast_broker: Broker, dealer: DealerFactory) -> None:
    silent = dealer(fast_broker.endpoint)
    silent.connect(ttl=600)
    silent.sub("hb", "hb2")
    publisher = dealer(fast_broker.endpoint)
    publisher.connect()
    heard_from_silent = time.monotonic()
    assert subscribers(publisher, "hb") == 1
    assert publisher.stats()["connections"]["mc0"] == 2

    # Not yet: well inside the TTL the client is still subscribed and gets messages.
    time.sleep(0.35)
    publisher.put("hb", "still here")
    assert silent.recv_skipping_noop().body == b"still here"

    # After 1.05 x TTL of silence from it, it is gone, with every subscription.
    time.sleep(max(0.0, heard_from_silent + 1.05 * 0.6 + 0.3 - time.monotonic()))
    stats = publisher.stats()
    assert stats["topics"]["hb"]["subscribers"] == 0
    assert stats["topics"]["hb2"]["subscribers"] == 0
    assert stats["doors"]["mc0"]["expired"] == 1
    assert stats["connections"]["mc0"] == 1
    # At most a heartbeat reached it before the drop; nothing that was published.
    assert all(reply.verb == b"NOOP" for reply in silent.drain(0.05))
    publisher.put("hb", "too late")
    publisher.put("hb2", "too late")
    silent.expect_silence(0.3)


def test_dropped_client_that_returns_must_subscribe_again(fast_broker: Broker, dealer: DealerFactory) -> None:
    peer = dealer(fast_broker.endpoint)
    peer.connect(ttl=300)
    peer.sub("back")
    publisher = dealer(fast_broker.endpoint)
    publisher.connect()
    time.sleep(1.05 * 0.3 + 0.2)
    assert subscribers(publisher, "back") == 0
    # At most the NOOP sent at 0.95 x TTL, just before the drop.
    assert all(reply.verb == b"NOOP" for reply in peer.drain(0.05))
    # Whatever it sends next starts a fresh session: the broker answers, but forgot the old subscriptions.
    peer.ok("NOOP")
    publisher.put("back", "lost")
    peer.expect_silence(0.2)
    peer.connect(ttl=30000)
    peer.sub("back")
    publisher.put("back", "found")
    assert peer.recv().body == b"found"


def test_client_without_ttl_is_never_dropped(fast_broker: Broker, dealer: DealerFactory) -> None:
    forever = dealer(fast_broker.endpoint)
    forever.connect()  # no TTL
    forever.sub("hb")
    short = dealer(fast_broker.endpoint)
    short.connect(ttl=300)
    short.sub("hb")
    publisher = dealer(fast_broker.endpoint)
    publisher.connect()
    assert subscribers(publisher, "hb") == 2
    # Long enough for the short-TTL client to expire three times over.
    forever.expect_silence(1.0)  # and no NOOP either: without TTL there is no heartbeat
    stats = publisher.stats()
    assert stats["topics"]["hb"]["subscribers"] == 1
    assert stats["doors"]["mc0"]["expired"] == 1
    publisher.put("hb", "for the patient one")
    assert forever.recv().body == b"for the patient one"
    forever.expect_silence()


def test_client_that_keeps_sending_noop_stays(fast_broker: Broker, dealer: DealerFactory) -> None:
    lively = dealer(fast_broker.endpoint)
    lively.connect(ttl=500)
    lively.sub("hb")
    publisher = dealer(fast_broker.endpoint)
    publisher.connect()
    verbs = keep_alive(lively, seconds=1.6, every=0.15)
    # It never went quiet, so it stays; the broker had nothing to say, so it sent NOOP about every 0.25 s.
    assert set(verbs) == {b"NOOP"}
    assert 4 <= len(verbs) <= 7, verbs
    stats = publisher.stats()
    assert stats["doors"]["mc0"]["expired"] == 0
    assert stats["topics"]["hb"]["subscribers"] == 1
    publisher.put("hb", "still subscribed")
    assert lively.recv_skipping_noop().body == b"still subscribed"


def test_noop_with_id_is_answered_and_counts_as_traffic(fast_broker: Broker, dealer: DealerFactory) -> None:
    peer = dealer(fast_broker.endpoint)
    peer.connect(ttl=400)
    end = time.monotonic() + 1.0
    while time.monotonic() < end:
        reply = peer.ok("NOOP")  # the OK is traffic towards the client too, so no NOOP from the broker
        assert reply.frames == [b"OK", b"ID", reply.header("ID")]
        time.sleep(0.05)
    peer.expect_silence(0.1)  # the last OK 0.15 s ago at the end of it; a NOOP would be due at 0.2
    assert peer.stats()["doors"]["mc0"]["expired"] == 0
