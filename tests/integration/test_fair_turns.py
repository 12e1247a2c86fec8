"""One client's burst does not hold the others' commands behind it (the native mc0 port): messages are taken
from each connection in turn, a short run at a time, and a turn ends after a few new persistent topics (each
costs fsyncs). Before, a raw client's 500 PUTs to new strong topics held another client's confirmed publish
for about 2 s, the time the broker took to make all 500 topics.

One command naming hundreds of new persistent topics does not hold the broker either: the topics are made a
few each turn while the command waits, the other clients are served meanwhile, and the client's own later
commands are answered after it, in the order it sent them. Before, one PUTS naming 500 new strong topics
held every other client for 1.7 s on one broker, and in a cluster outlasted the clients' 3 s heartbeat. Their
directories are built ahead in the store's threads; a client that goes away meanwhile leaves none behind.
The TCP doors make a new topic the same way for each event that names one (a Lumberjack window routed to
hundreds of topics)."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

import pytest

from broker.engine import CREATES_PER_TURN
from broker.topics import Persistence, Sync, TopicRule, TopicSpec
from broker.zmtp_door import RUN
from connector.lumberjack_client import LumberjackClient
from protocol import mc0

if TYPE_CHECKING:
    from conftest import BrokerFactory, DealerFactory, Peer

pytestmark = pytest.mark.timeout(60)

RULES = (TopicRule("*", TopicSpec(persistence=Persistence.PERSISTENT, sync=Sync.STRONG)),)
BURST = 300
NEW_TOPICS = 300


def burst_and_other(start_broker: BrokerFactory, dealer: DealerFactory,
                    other_topic: str) -> tuple[Peer, Peer]:
    """A broker making every topic strong, and two clients: the one that bursts, and another already
    connected whose topic ``other_topic`` is made."""
    broker = start_broker(topics=RULES)
    burst, other = dealer(broker.endpoint), dealer(broker.endpoint)
    other.send("PUT", "TOPIC", other_topic, "ID", "warm", "", "x")
    assert other.recv().verb == b"OK"
    return burst, other


def test_a_burst_of_new_topics_does_not_hold_another_client_behind_it(start_broker: BrokerFactory,
                                                                      dealer: DealerFactory) -> None:
    burst, other = burst_and_other(start_broker, dealer, "fair.other")
    for n in range(BURST):
        burst.send("PUT", "TOPIC", f"fair.new{n}", "ID", f"b{n}", "", "x")
    time.sleep(0.05)  # the burst is in the broker's hands
    before = len(burst.drain(0.0))  # the burst's OKs out before the other client asks
    other.send("PUT", "TOPIC", "fair.other", "ID", "mine", "", "x")
    reply = other.recv(10)
    assert reply.verb == b"OK"
    assert reply.headers[b"ID"] == b"mine"
    answered = len(burst.drain(0.0))  # the burst's OKs out while the other client waited
    # Answered within a few turns, not after the burst: at most a run of the burst's commands ahead of it in
    # each turn, each turn ended after CREATES_PER_TURN new topics (and the loop builds one directory a turn).
    assert answered <= 4 * max(RUN, CREATES_PER_TURN), answered
    assert before + answered + len(burst.drain(2.0)) == BURST  # and the burst is served whole


def test_a_puts_naming_hundreds_of_new_topics_lets_the_others_go_first(start_broker: BrokerFactory,
                                                                        dealer: DealerFactory) -> None:
    burst, other = burst_and_other(start_broker, dealer, "making.other")
    items = [(f"making.new{n}".encode(), b"x", {}) for n in range(NEW_TOPICS)]
    burst.send_raw(*mc0.encode(mc0.Puts(items, id=b"many")))
    burst.send("NOOP", "ID", "after")  # the same client's next command: answered after the PUTS, not before
    time.sleep(0.05)  # the PUTS is in the broker's hands
    other.send("PUT", "TOPIC", "making.other", "ID", "mine", "", "x")
    reply = other.recv(10)
    assert (reply.verb, reply.headers[b"ID"]) == (b"OK", b"mine")
    assert burst.poll(0.0) is None  # the other client's publish was answered while the topics were made
    answers = [burst.recv(30), burst.recv(10)]
    assert [(answer.verb, answer.headers[b"ID"]) for answer in answers] == [(b"OK", b"many"),
                                                                            (b"OK", b"after")]
    assert answers[0].headers[b"COUNT"] == b"%d" % NEW_TOPICS
    for n in (0, NEW_TOPICS // 2, NEW_TOPICS - 1):  # every topic made, holding its message
        fetched = burst.ok("FETCH", "TOPIC", f"making.new{n}", "FROM", "1")
        assert fetched.header("COUNT") == b"1", (n, fetched.frames)


def test_a_client_gone_while_its_new_topics_are_made_leaves_no_half_made_topic(
    start_broker: BrokerFactory, dealer: DealerFactory
) -> None:
    """The store builds the directories of the topics a waiting command names ahead, in its threads: when the
    client goes away first, what was built for it and not yet made a topic is removed, and every directory
    left is a whole topic the broker serves."""
    broker = start_broker(topics=RULES)
    data = broker.config.data_dir
    burst = dealer(broker.endpoint)
    burst.send("CONNECT", "VERSION", "0.3", "TTL", "500", "ID", "hello")  # silent for 0.525 s: dropped
    assert burst.recv_skipping_noop().verb == b"OK"
    count = 5_000  # seconds of making: the client is dropped long before the last
    burst.send_raw(*mc0.encode(mc0.Puts([(b"gone.t%d" % n, b"x", {}) for n in range(count)], id=b"many")))
    other = dealer(broker.endpoint)

    def entries() -> tuple[set[str], list[str]]:
        """The topic directories made, and the hidden ones (being made or made ahead)."""
        names = [entry.name for entry in data.iterdir()] if data.exists() else []
        hidden = [name for name in names if name.startswith(".new-")]
        return {name for name in names if name.startswith("gone.")}, hidden

    deadline = time.monotonic() + 20
    while not entries()[0]:
        assert time.monotonic() < deadline, "no topic made in 20 s"
        time.sleep(0.01)
    before: tuple[set[str], list[str]] = (set(), [])
    while (now := entries()) != before or now[1]:  # until the making has stopped, and cleaned up
        assert time.monotonic() < deadline, f"still making or cleaning up after 20 s: {len(now[0])}, {now[1]}"
        other.ok("NOOP")  # served all the while
        before = now
        time.sleep(0.3)
    made = now[0]
    assert len(made) < count, "the client was dropped while its topics were being made"
    served: set[str] = set()
    page = other.stats()
    while True:  # every page of STATS (1,000 topics a page): a fast machine makes more before the drop
        served |= {name for name in page["topics"] if name.startswith("gone.")}
        if page["topics_next"] is None:
            break
        reply = other.ok("STATS", "AFTER", page["topics_next"])
        assert reply.body is not None, reply.frames
        page = json.loads(reply.body)
    assert served == made
    for name in (min(made), max(made)):
        assert other.ok("FETCH", "TOPIC", name, "FROM", "1").header("COUNT") == b"0"  # whole, and empty


def test_a_lumberjack_window_routed_to_hundreds_of_new_topics_waits_for_them_made_in_the_stores_threads(
    start_broker: BrokerFactory, dealer: DealerFactory
) -> None:
    """The TCP doors make new topics the same way: an event naming a new persistent topic waits while the
    store's threads make its log (and those of the events after it), and the loop serves everyone else.
    Before, the Lumberjack door made a few of them on the loop at each of its slices, and another client's
    confirmed publishes waited 17-50 ms (median) while a window made 500 topics; now about a millisecond."""
    broker = start_broker(topics=RULES, lumberjack_topic_field="fields.topic")
    other = dealer(broker.endpoint)
    other.send("PUT", "TOPIC", "shipped.other", "ID", "warm", "", "x")
    assert other.recv().verb == b"OK"
    events = [{"message": f"m{n}", "fields": {"topic": f"shipped.t{n}"}} for n in range(NEW_TOPICS)]
    with LumberjackClient(*broker.gateway_address("lumberjack"), timeout=30) as shipper:
        shipper.send_batch(events)  # returns once every event is stored and acked
    stats = other.stats()
    # The first event waited; the ones after it were decoded meanwhile and their topics made ahead too.
    assert 1 <= stats["doors"]["lumberjack"]["parked"] <= NEW_TOPICS
    for n in (0, NEW_TOPICS // 2, NEW_TOPICS - 1):
        fetched = other.ok("FETCH", "TOPIC", f"shipped.t{n}", "FROM", "1")
        assert fetched.header("COUNT") == b"1", (n, fetched.frames)
    assert not [entry.name for entry in broker.config.data_dir.iterdir() if entry.name.startswith(".new-")]
