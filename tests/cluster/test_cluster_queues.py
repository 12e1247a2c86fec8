"""A persistent round-robin queue in a three-broker cluster: the leader reports the queue's position (what its
consumers acked) through Raft's log, the followers take it, and after a failover the new leader hands out
what was not acked, not the whole queue again. Real broker processes."""

from __future__ import annotations

import time

import pytest
from cluster_harness import Cluster, cluster_factory  # noqa: F401 - the fixture

from connector import Client

QUEUES = '[[topics]]\npattern = "jobs.*"\npersistence = "persistent"\ndelivery = "round-robin"\n'
JOBS = 20
ACKED = 12


def _waiting(cluster: Cluster, member: object) -> int | None:
    stats = cluster.stats(member, timeout=5)  # type: ignore[arg-type]
    topic = None if stats is None else stats["topics"].get("jobs.q")
    return None if topic is None else topic["backlog"]


@pytest.mark.timeout(150)
def test_a_failover_hands_out_what_was_not_acked_and_nothing_acked(cluster_factory) -> None:  # noqa: F811
    cluster: Cluster = cluster_factory(settings=QUEUES)
    leader = cluster.leader()
    with Client(cluster.endpoints, **cluster.client_options(), timeout=10) as client:
        for n in range(JOBS):
            client.publish("jobs.q", f"job{n}", confirm=True)
    with Client(cluster.endpoints, **cluster.client_options(), timeout=10) as worker:
        worker.subscribe("jobs.q", explicit_acks=True, credit=1)
        for n in range(ACKED):
            message = worker.receive(timeout=5)
            assert message is not None
            assert message.body == f"job{n}".encode()
            worker.ack(message)
        worker.flush()
        assert worker.receive(timeout=5) is not None  # one more in flight (credit 1), never acked
        # The followers take the leader's position (reported every 2 s): ACKED done, the rest to hand out.
        followers = [member for member in cluster.members if member is not leader]
        deadline = time.monotonic() + 20
        while any(_waiting(cluster, member) != JOBS - ACKED for member in followers):
            assert time.monotonic() < deadline, [_waiting(cluster, member) for member in followers]
            time.sleep(0.2)
        assert _waiting(cluster, leader) == JOBS - ACKED - 1  # the one in flight is not waiting there

    cluster.kill(leader)
    cluster.leader(exclude=(leader,))
    with Client(cluster.endpoints, **cluster.client_options(), timeout=10) as worker:
        worker.subscribe("jobs.q", explicit_acks=True)
        again = []
        while (message := worker.receive(timeout=2)) is not None:
            again.append(message.body)
            worker.ack(message)
    assert again == [f"job{n}".encode() for n in range(ACKED, JOBS)]
