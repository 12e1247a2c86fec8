"""The three-broker cluster the tests of this directory run: ``bench.cluster``'s broker processes (real
``mc0 broker`` processes of this checkout on loopback ports, each with its own data directory), as a
fixture that starts them, waits for a leader every member agrees on, and stops them all at teardown.

Also what the tests share otherwise: a cluster member in this process (:func:`member_here`, for tests that
make one member's writes fail by path), and a publish sent again until confirmed (:func:`careful_publish`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import BrokerFactory

from bench.cluster import Cluster, Member, make_cluster
from broker.server import Broker
from broker.topics import Persistence, Sync, TopicRule, TopicSpec
from connector import Client, ConnectorError

__all__ = ["Cluster", "Member", "careful_publish", "cluster_factory", "holds", "member_here", "until"]

#: The topics of a member started in this process: ``durable.*`` strong, as the processes' configuration.
STRONG = (TopicRule("durable.*", TopicSpec(persistence=Persistence.PERSISTENT, sync=Sync.STRONG)),)


def member_here(start_broker: BrokerFactory, folder: Path, node: str, peers: tuple[str, ...]) -> Broker:
    """A cluster member in this process, with the mc0 door only, its data in ``folder``."""
    return start_broker(topics=STRONG, data_dir=folder, lumberjack="off", sexp="off", msgq="off",
                        rstreams="off", http="off", cluster_node=node, cluster_peers=peers)


def careful_publish(client: Client, topic: str, body: str, within: float = 30.0) -> dict[str, str]:
    """Publish until confirmed; the OK's headers. A publish in flight when its broker dies may or may not
    have been stored (the caller checks for duplicates); one refused as not stored was not."""
    deadline = time.monotonic() + within
    while True:
        try:
            reply = client.publish(topic, body, confirm=True, timeout=5)
            assert reply is not None
            return reply
        except ConnectorError:
            assert time.monotonic() < deadline, f"{body!r} was never confirmed"
            time.sleep(0.05)


def until(check: Callable[[], object], what: str, within: float = 30.0) -> None:
    """Wait until ``check()`` is true; fail saying ``what`` never happened after ``within`` seconds."""
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.05)


def holds(cluster: Cluster, member: Member, topic: str, last: int) -> bool:
    """Whether ``member`` holds ``topic`` up to id ``last``, as the leader counts (the leader itself does)."""
    leader = cluster.leader()
    if member is leader:
        return True
    return cluster.cluster_view(leader)["replicas"].get(topic, {}).get(member.raft, 0) > last


@pytest.fixture
def cluster_factory(tmp_path: Path) -> Iterator[Any]:
    """``cluster_factory(curve=False, settings="")``: three brokers started, a leader serving."""
    made: list[Cluster] = []

    def make(**options: Any) -> Cluster:
        cluster = make_cluster(tmp_path, **options)
        made.append(cluster)
        for member in cluster.members:
            cluster.start(member)
        cluster.settled()
        return cluster

    yield make
    for cluster in made:
        cluster.stop_all()
        cluster.context.term()
