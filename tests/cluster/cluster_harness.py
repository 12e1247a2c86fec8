"""The three-broker cluster the tests of this directory run: ``bench.cluster``'s broker processes (real
``mc0 broker`` processes of this checkout on loopback ports, each with its own data directory), as a
fixture that starts them, waits for a leader every member agrees on, and stops them all at teardown.

Also what the tests share otherwise: a cluster member in this process (:func:`member_here`, for tests that
make one member's writes fail by path), a publish sent again until confirmed (:func:`careful_publish`), a
publisher of idempotent batches doing the same in a thread (:class:`Publisher`), and random faults
(:func:`random_fault`)."""

from __future__ import annotations

import random
import threading
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

__all__ = ["Cluster", "Member", "Publisher", "careful_publish", "cluster_factory", "holds", "member_here",
           "random_fault", "until"]

#: What a random fault does: to whom, and how: SIGKILL ("kill") or SIGSTOP ("pause") until it is undone.
FAULT_KINDS = ("kill-leader", "kill-follower", "pause-leader", "pause-follower", "kill-two",
               "pause-leader-kill-follower", "kill-all")

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


class Publisher(threading.Thread):
    """Publishes numbered idempotent batches of ``batch`` messages to ``topic`` (bodies "0", "1", ...), each
    sent again (same producer, same sequence) until confirmed: what a careful user does when a failover loses
    an answer."""

    def __init__(self, cluster: Cluster, topic: str, batch: int) -> None:
        super().__init__(daemon=True, name="careful publisher")
        self.cluster = cluster
        self.topic = topic
        self.batch = batch
        self.stop = threading.Event()
        self.confirmed: list[tuple[int, int | None]] = []  # (sequence of a batch, MESSAGE-ID of its last)
        self.retries = 0
        self.first_after: list[float] = []  # confirmation times, to measure failovers
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with Client(self.cluster.endpoints, **self.cluster.client_options(), timeout=5) as client:
                sequence = 0
                while not self.stop.is_set():
                    items = [(self.topic, f"{sequence + n}", None) for n in range(self.batch)]
                    try:
                        reply = client.publish_batch(items, producer="careful", sequence=sequence, timeout=5)
                    except ConnectorError:
                        self.retries += 1
                        time.sleep(0.02)
                        continue
                    last = reply.get("MESSAGE-ID")
                    self.confirmed.append((sequence, None if last is None else int(last)))
                    self.first_after.append(time.monotonic())
                    sequence += self.batch
        except BaseException as error:  # reported by the test
            self.error = error

    def messages(self) -> set[int]:
        """The numbers of the messages confirmed so far."""
        return {sequence + n for sequence, _ in self.confirmed for n in range(self.batch)}


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


def random_fault(cluster: Cluster, rng: random.Random) -> str:
    """Make one random fault of :data:`FAULT_KINDS`, hold it 0.2-5 s, and undo it (a killed broker started
    again, a frozen one resumed) in random order; what it was, to report."""
    kind = rng.choice(FAULT_KINDS)
    leader = cluster.settled()
    followers = [member for member in cluster.members if member is not leader]
    if kind == "kill-two":
        done = [("kill", member) for member in rng.sample(cluster.members, 2)]
    elif kind == "kill-all":
        done = [("kill", member) for member in [leader, *rng.sample(followers, 2)]]
    elif kind == "pause-leader-kill-follower":
        done = [("pause", leader), ("kill", rng.choice(followers))]
    else:
        how, whom = kind.split("-")
        done = [(how, leader if whom == "leader" else rng.choice(followers))]
    for how, member in done:
        (cluster.kill if how == "kill" else cluster.pause)(member)
        time.sleep(rng.uniform(0.0, 0.5))
    held = rng.uniform(0.2, 5.0)
    time.sleep(held)
    for how, member in rng.sample(done, len(done)):
        (cluster.start if how == "kill" else cluster.resume)(member)
        time.sleep(rng.uniform(0.0, 1.0))
    return f"{kind} {held:.1f} s"
