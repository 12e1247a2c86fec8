"""A leader asked to stop (SIGTERM: a rolling restart, ``docker stop``) hands the cluster over to a follower
before it goes: a publisher that publishes confirmed messages the whole time never sees an error, every
message is stored once, in order, and the new leader serves within a fraction of what a killed leader's
failover takes. Twice in a row, each stopped broker started again; and a rolling restart of every member in
turn, followers first. Real broker processes."""

from __future__ import annotations

import itertools
import signal
import threading
import time

import pytest
from cluster_harness import Cluster, Member, cluster_factory, holds, until  # noqa: F401 - the fixture

from connector import Client, ConnectorError

TOPIC = "durable.handover"
#: Confirmed publishes before and after each stop.
AROUND = 20


class Publisher(threading.Thread):
    """Publishes numbered messages one at a time, each confirmed, and keeps every error it meets."""

    def __init__(self, cluster: Cluster) -> None:
        super().__init__(daemon=True, name="publisher")
        self.cluster = cluster
        self.stop = threading.Event()
        self.confirmed: list[tuple[float, int]] = []  # (when, MESSAGE-ID)
        self.errors: list[BaseException] = []
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

    def count(self) -> int:
        return len(self.confirmed)


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


