"""mc0 sessions cannot pile up: clients that leave without DISCONNECT and gave no TTL are found gone (a NOOP
to a peer that has no connection any more fails at once) and forgotten with their subscriptions; a client
without TTL that is still connected is kept however long it stays silent; and past max_sessions the sessions
heard from longest ago make room. Each test ends with a normal client answered.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import zmq
from conftest import RECV_TIMEOUT, BrokerFactory, DealerFactory, Peer

from broker.server import Broker

IDLE = 0.3  # session_idle: seconds of silence before a session without TTL is probed


def wait_until(condition: Callable[[], bool], seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.05)


def still_answers(broker: Broker, dealer: DealerFactory) -> None:
    peer = dealer(broker.endpoint)
    peer.connect(ttl=5000)
    peer.sub("sessions.check")
    peer.put("sessions.check", "hello")
    reply = peer.recv_skipping_noop()
    assert reply.verb == b"MESSAGE"
    assert reply.body == b"hello"
    peer.send("DISCONNECT")


@pytest.mark.timeout(60)
def test_clients_that_vanish_without_ttl_are_forgotten_with_their_subscriptions(
    start_broker: BrokerFactory, zmq_context: zmq.Context, dealer: DealerFactory
) -> None:
    broker = start_broker(session_idle=IDLE)
    sockets = []
    for number in range(200):
        socket = zmq_context.socket(zmq.DEALER)
        socket.linger = 0
        socket.connect(broker.endpoint)
        peer = Peer(socket)
        peer.connect()  # no TTL: the reference brokers would keep it forever
        peer.sub(f"left.{number % 10}")
        sockets.append(socket)
    sessions = broker.router.sessions
    assert len(sessions) == 200
    for socket in sockets:
        socket.close()  # gone, without a word
    wait_until(lambda: len(sessions) == 0)
    assert all(not broker.engine.topics[b"left.%d" % n].subscriptions for n in range(10))
    assert broker.router.counters["unreachable"] >= 200
    still_answers(broker, dealer)


@pytest.mark.timeout(60)
def test_a_silent_client_without_ttl_that_is_still_connected_is_kept(
    start_broker: BrokerFactory, dealer: DealerFactory
) -> None:
    broker = start_broker(session_idle=IDLE)
    quiet = dealer(broker.endpoint)
    quiet.connect()
    quiet.sub("news")
    wait_until(lambda: broker.router.counters["probed"] >= 3)  # probed again and again, silent all along
    assert len(broker.router.sessions) == 1
    publisher = dealer(broker.endpoint)
    publisher.put("news", "still subscribed")
    reply = quiet.recv_skipping_noop(RECV_TIMEOUT)
    assert reply.body == b"still subscribed"
    still_answers(broker, dealer)


@pytest.mark.timeout(60)
def test_past_max_sessions_those_heard_from_longest_ago_make_room(
    start_broker: BrokerFactory, dealer: DealerFactory
) -> None:
    broker = start_broker(max_sessions=64)
    peers = []
    for _ in range(200):
        peer = dealer(broker.endpoint)
        peer.connect()
        peers.append(peer)
    assert len(broker.router.sessions) <= 64
    assert broker.router.counters["evicted"] >= 200 - 64
    newest = peers[-1]
    newest.ok("NOOP")  # the newest clients are the ones kept
    still_answers(broker, dealer)
