"""A leader asked to stop (SIGTERM: a rolling restart, ``docker stop``) hands the cluster over to a follower
before it goes: a publisher that publishes confirmed messages the whole time never sees an error, every
message is stored once, in order, and the new leader serves within a fraction of what a killed leader's
failover takes. Twice in a row, each stopped broker started again; and a rolling restart of every member in
turn, followers first. And with the asyncio client's pipelined confirms: what the stopping leader refused
while many were in flight goes to the next leader in the order it was published. Real broker processes."""

from __future__ import annotations

import asyncio
import collections
import itertools
import signal
import threading
import time

import pytest
from cluster_harness import Cluster, Member, cluster_factory, holds, until  # noqa: F401 - the fixture

from connector import AsyncClient, Client, ConnectorError

TOPIC = "durable.handover"
#: Confirmed publishes before and after each stop.
AROUND = 20


class Publishing(threading.Thread):
    """A publisher in a thread of its own until ``stop`` is set: what it had confirmed, and every error it
    met."""

    def __init__(self, cluster: Cluster, name: str) -> None:
        super().__init__(daemon=True, name=name)
        self.cluster = cluster
        self.stop = threading.Event()
        self.confirmed: list = []
        self.errors: list[BaseException] = []

    def count(self) -> int:
        return len(self.confirmed)


class Publisher(Publishing):
    """Publishes numbered messages one at a time, each confirmed."""

    def __init__(self, cluster: Cluster) -> None:
        super().__init__(cluster, "publisher")
        self.confirmed: list[tuple[float, int]] = []  # (when, MESSAGE-ID)
        self.sent = 0

    def run(self) -> None:
        with Client(self.cluster.endpoints, **self.cluster.client_options(), timeout=10) as client:
            while not self.stop.is_set():
                try:
                    reply = client.publish(TOPIC, f"{self.sent}", confirm=True, timeout=10)
                except ConnectorError as error:
                    self.errors.append(error)
                    return
                assert reply is not None
                self.confirmed.append((time.monotonic(), int(reply["MESSAGE-ID"])))
                self.sent += 1


@pytest.mark.timeout(180)
def test_a_leader_asked_to_stop_hands_over_and_no_publish_fails(cluster_factory) -> None:  # noqa: F811
    cluster: Cluster = cluster_factory()
    publisher = Publisher(cluster)
    publisher.start()
    gaps = []
    try:
        for _ in range(2):
            leader: Member = cluster.settled()
            epoch = cluster.cluster_view(leader)["epoch"]
            before = publisher.count()
            until(lambda before=before: publisher.count() >= before + AROUND or publisher.errors,
                   "publishes confirmed before the stop")
            assert leader.process is not None
            stopped = time.monotonic()
            leader.process.send_signal(signal.SIGTERM)
            assert leader.process.wait(15) == 0, leader.log()[-3000:]
            at_stop = publisher.count()
            until(lambda at_stop=at_stop: publisher.count() >= at_stop + AROUND or publisher.errors,
                   "publishes confirmed after the stop")
            assert publisher.errors == [], publisher.errors
            log = leader.log()
            assert "handed the cluster over to" in log, log[-3000:]
            new = cluster.settled()
            assert new is not leader
            assert cluster.cluster_view(new)["epoch"] == epoch + 1
            # The longest wait for a confirmation around the stop.
            times = [when for when, _ in publisher.confirmed if when >= stopped - 1]
            gaps.append(max(later - earlier for earlier, later in itertools.pairwise(times)))
            cluster.start(leader)
    finally:
        publisher.stop.set()
        publisher.join(30)
    assert publisher.errors == [], publisher.errors
    print(f"longest wait for a confirmation around each stop: {', '.join(f'{gap:.2f} s' for gap in gaps)}")
    ids = [message_id for _, message_id in publisher.confirmed]
    assert ids == list(range(ids[0], ids[0] + len(ids))), "ids in order, none skipped or repeated"
    with Client(cluster.endpoints, **cluster.client_options(), timeout=10) as client:
        stored = client.fetch(TOPIC, ids[0], max_messages=len(ids) + 10).messages
    assert [message.body.decode() for message in stored] == [str(n) for n in range(len(ids))]


@pytest.mark.timeout(240)
def test_a_rolling_restart_of_every_member_fails_no_publish(cluster_factory) -> None:  # noqa: F811
    """An upgrade: each member stopped (SIGTERM) and started again in turn, the followers first and the
    leader last, each back in the majority (the leader counts it holding what was confirmed) before the next
    goes. The publisher never sees an error, every message is stored once, in order, and every member ends
    up holding all of them."""
    cluster: Cluster = cluster_factory()
    publisher = Publisher(cluster)
    publisher.start()
    first = cluster.settled()
    try:
        for member in [*(other for other in cluster.members if other is not first), first]:
            before = publisher.count()
            until(lambda before=before: publisher.count() >= before + AROUND or publisher.errors,
                   "publishes confirmed before the stop")
            assert member.process is not None
            member.process.send_signal(signal.SIGTERM)
            assert member.process.wait(15) == 0, member.log()[-3000:]
            at_stop = publisher.count()
            until(lambda at_stop=at_stop: publisher.count() >= at_stop + AROUND or publisher.errors,
                   "publishes confirmed while a member is down")
            cluster.start(member)
            last = publisher.confirmed[-1][1]
            until(lambda member=member, last=last: holds(cluster, member, TOPIC, last),
                   f"broker {member.index} back in the majority")
    finally:
        publisher.stop.set()
        publisher.join(30)
    assert publisher.errors == [], publisher.errors
    ids = [message_id for _, message_id in publisher.confirmed]
    assert ids == list(range(ids[0], ids[0] + len(ids))), "ids in order, none skipped or repeated"
    with Client(cluster.endpoints, **cluster.client_options(), timeout=10) as client:
        stored = client.fetch(TOPIC, ids[0], max_messages=len(ids) + 10).messages
    assert [message.body.decode() for message in stored] == [str(n) for n in range(len(ids))]
    last = ids[-1]
    until(lambda: all(holds(cluster, member, TOPIC, last) for member in cluster.members),
          "every member holds all")


class PipelinedPublisher(Publishing):
    """Publishes numbered messages with :meth:`AsyncClient.publish_async`, up to IN_FLIGHT unconfirmed at a
    time (several PUTS CONFIRM each in flight)."""

    IN_FLIGHT = 200

    def __init__(self, cluster: Cluster) -> None:
        super().__init__(cluster, "pipelined publisher")
        self.confirmed: list[int] = []  # MESSAGE-IDs, in the order the messages were published

    def run(self) -> None:
        asyncio.run(self._publish())

    async def _publish(self) -> None:
        in_flight: collections.deque[asyncio.Future[dict[str, str]]] = collections.deque()
        async with AsyncClient(self.cluster.endpoints, **self.cluster.client_options(), timeout=10,
                               max_confirms=self.IN_FLIGHT) as client:
            sent = 0
            try:
                while not self.stop.is_set() or in_flight:
                    if not self.stop.is_set():
                        for _ in range(20):  # a batch each loop turn: each turn's leave as one command
                            in_flight.append(await client.publish_async(TOPIC, f"{sent}"))
                            sent += 1
                        await asyncio.sleep(0.002)
                    while in_flight and (in_flight[0].done() or len(in_flight) > self.IN_FLIGHT - 20
                                         or self.stop.is_set()):
                        self.confirmed.append(int((await in_flight.popleft())["MESSAGE-ID"]))
            except ConnectorError as error:
                self.errors.append(error)


@pytest.mark.timeout(180)
def test_pipelined_confirms_in_flight_at_a_hand_over_are_stored_once_in_order(cluster_factory) -> None:  # noqa: F811
    cluster: Cluster = cluster_factory()
    publisher = PipelinedPublisher(cluster)
    publisher.start()
    try:
        leader: Member = cluster.settled()
        until(lambda: publisher.count() >= 500 or publisher.errors, "pipelined publishes confirmed before")
        assert leader.process is not None
        leader.process.send_signal(signal.SIGTERM)
        assert leader.process.wait(15) == 0, leader.log()[-3000:]
        at_stop = publisher.count()
        until(lambda: publisher.count() >= at_stop + 500 or publisher.errors, "pipelined publishes after")
        assert "handed the cluster over to" in leader.log(), leader.log()[-3000:]
    finally:
        publisher.stop.set()
        publisher.join(30)
    assert publisher.errors == [], publisher.errors
    ids = publisher.confirmed
    assert ids == list(range(ids[0], ids[0] + len(ids))), "ids in publishing order, none skipped or repeated"
    with Client(cluster.endpoints, **cluster.client_options(), timeout=10) as client:
        stored = []
        while len(stored) < len(ids):
            fetched = client.fetch(TOPIC, ids[0] + len(stored), max_messages=10_000).messages
            assert fetched, f"{len(stored)} of {len(ids)} confirmed messages found"
            stored += fetched
    assert [message.body.decode() for message in stored[:len(ids)]] == [str(n) for n in range(len(ids))]
