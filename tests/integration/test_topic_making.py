"""One command naming hundreds of new persistent topics does not hold the broker: the topics are made a few
each turn while the command waits, the other clients are served meanwhile, and the client's own later
commands are answered after it, in the order it sent them. Before, one PUTS naming 500 new strong topics
held every other client for 1.7 s on one broker, and in a cluster outlasted the clients' 3 s heartbeat."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest

from broker.topics import Persistence, Sync, TopicRule, TopicSpec
from protocol import mc0

if TYPE_CHECKING:
    from conftest import BrokerFactory, DealerFactory

pytestmark = pytest.mark.timeout(60)

RULES = (TopicRule("*", TopicSpec(persistence=Persistence.PERSISTENT, sync=Sync.STRONG)),)
NEW_TOPICS = 300


def test_a_puts_naming_hundreds_of_new_topics_lets_the_others_go_first(start_broker: BrokerFactory,
                                                                        dealer: DealerFactory) -> None:
    broker = start_broker(topics=RULES)
    burst, other = dealer(broker.endpoint), dealer(broker.endpoint)
    other.send("PUT", "TOPIC", "making.other", "ID", "warm", "", "x")  # connected, its topic made
    assert other.recv().verb == b"OK"
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
