"""DELETE in a three-broker cluster: the leader deletes the topic, Raft's log carries that to every member,
each deletes its copy, and the topic does not come back with a failover; made again, it is a new log that a
restarted member keeps (its Raft replays the deletion of the old one only). Real broker processes."""

from __future__ import annotations

import pytest
from cluster_harness import Cluster, Member, careful_publish, cluster_factory, holds, until  # noqa: F401 - the fixture

from connector import Client


def _topics(cluster: Cluster, member: Member) -> set[str]:
    stats = cluster.stats(member, timeout=5)
    assert stats is not None, f"broker {member.index} does not answer"
    return set(stats["topics"])


@pytest.mark.timeout(150)
def test_a_deleted_topic_goes_from_every_member_and_stays_gone_after_a_failover(
        cluster_factory) -> None:  # noqa: F811
    cluster: Cluster = cluster_factory()
    leader = cluster.leader()
    followers = [member for member in cluster.members if member is not leader]
    with Client(cluster.endpoints, **cluster.client_options(), timeout=10) as client:
        for n in range(5):
            client.publish("durable.gone", f"old{n}", confirm=True)
        client.publish("durable.kept", "stays", confirm=True)
        until(lambda: all(holds(cluster, follower, "durable.gone", 5) for follower in followers),
               "the followers did not copy the topic")
        client.delete("durable.gone")  # answered once Raft's log holds the deletion
        until(lambda: all("durable.gone" not in _topics(cluster, member) for member in cluster.members),
               "a member kept its copy of the deleted topic")
        assert all("durable.kept" in _topics(cluster, member) for member in cluster.members)

    cluster.kill(leader)  # every follower copied the deleted log once: a new leader must not bring it back
    successor = cluster.leader(exclude=(leader,))
    with Client(cluster.endpoints, **cluster.client_options(), timeout=10) as client:
        assert client.fetch("durable.gone", 1).messages == []
        reply = careful_publish(client, "durable.gone", "new")  # made again: a new log, ids from 1
        assert reply["MESSAGE-ID"] == "1"
    assert cluster.leader() is successor

    # The follower restarts: its Raft applies the deletion of the old log again, which must leave the new one.
    follower = next(member for member in cluster.members if member not in (leader, successor))
    until(lambda: holds(cluster, follower, "durable.gone", 1), "the follower did not copy the new log")
    cluster.kill(follower)
    cluster.start(follower)
    cluster.settled()
    until(lambda: "durable.gone" in _topics(cluster, follower), "the restarted follower lost the new log")
    with Client(cluster.endpoints, **cluster.client_options(), timeout=10) as client:
        careful_publish(client, "durable.gone", "newer")
    until(lambda: holds(cluster, follower, "durable.gone", 2), "the restarted follower does not copy on")
    # Deleted once, when Raft first carried the deletion; replayed at the restart, it left the new log alone
    # (deleting that, the follower would copy it again from the leader, and hold less meanwhile).
    assert follower.log().count("'durable.gone' deleted, as on the leader") == 1
