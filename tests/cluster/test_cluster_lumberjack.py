"""The Lumberjack door of a cluster's leader acknowledges a batch for a strong topic only once a majority of
the cluster holds it, as mc0's OK does: with both followers paused no ACK comes (the connection closes once
the commit timeout is over, or when the leader stops leading), and with them back the next batch is acked.
Real broker processes."""

from __future__ import annotations

import time

import pytest
from cluster_harness import Cluster, cluster_factory  # noqa: F401 - the fixture

from connector import Client, ConnectorError
from connector.lumberjack_client import LumberjackClient


@pytest.mark.timeout(120)
def test_an_ack_waits_for_a_majority_of_the_cluster(cluster_factory) -> None:  # noqa: F811
    cluster: Cluster = cluster_factory(lumberjack=True)
    leader = cluster.leader()
    assert leader.lumberjack is not None
    followers = [member for member in cluster.members if member is not leader]
    with LumberjackClient("127.0.0.1", leader.lumberjack, timeout=10) as shipper:
        shipper.send_batch([{"message": "with a majority"}])  # acked: the followers copy it
    for follower in followers:
        cluster.pause(follower)
    try:
        started = time.monotonic()
        with LumberjackClient("127.0.0.1", leader.lumberjack, timeout=10) as shipper, \
                pytest.raises(ConnectorError):
            shipper.send_batch([{"message": "alone on the leader"}])
        assert time.monotonic() - started >= 0.5, "the connection ended before the leader waited at all"
    finally:
        for follower in followers:
            cluster.resume(follower)
    leader = cluster.settled()
    with LumberjackClient("127.0.0.1", leader.lumberjack, timeout=10) as shipper:  # type: ignore[arg-type]
        shipper.send_batch([{"message": "a majority again"}])
    with Client(leader.endpoint, **cluster.client_options(), timeout=10) as client:
        stored = [message.body for message in client.fetch("logs", 1).messages]
    assert b'{"message":"with a majority"}' in stored
    assert b'{"message":"a majority again"}' in stored
