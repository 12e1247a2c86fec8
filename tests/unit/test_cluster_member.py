"""What a cluster member decides on its own, without Raft or sockets.

``Cluster.refusal``, its answer to a command only a leader serves: a follower names the leader; without one
to name, RETRY-AFTER while a majority is in reach (a leader is being chosen) and nothing with a minority (the
refusal is final); a leader handing the cluster over asks the client back sooner, since a hand-over takes tens
of milliseconds. ``Cluster.retention_floor``: a leader's retention keeps what is not yet on a majority, a
follower's has no bound (even where the gate it kept from leading stands), and only a leader's STATS show
high watermarks."""

from __future__ import annotations

import time
from typing import Any

import zmq.asyncio
from memory_log import MemoryStore

from broker.cluster.node import HAND_OVER_RETRY_MS, RETRY_MS, STARTING_FOR, Cluster
from broker.cluster.raft import Role
from broker.config import BrokerConfig
from broker.engine import Engine
from broker.topics import Persistence, TopicSpec
from protocol import mc0

PEERS = ("127.0.0.1:7002", "127.0.0.1:7003")


def member() -> Cluster:
    config = BrokerConfig(bind="tcp://127.0.0.1:7101", curve=False, cluster_node="127.0.0.1:7001",
                          cluster_peers=PEERS)
    engine = Engine(config.topic_rules(), MemoryStore())
    return Cluster(config, engine, MemoryStore(), lambda: None, lambda: None, lambda error: None,  # type: ignore[arg-type]
                   zmq.asyncio.Context.instance(), "tcp://127.0.0.1:7101")


def refused(cluster: Cluster) -> mc0.Error:
    answer = cluster.refusal(mc0.Put(b"t", b"body", id=b"7"), redirected=False)
    assert isinstance(answer, mc0.Error)
    return answer


def test_the_answer_to_a_publish_says_where_to_go_or_when_to_ask_again() -> None:
    cluster = member()
    cluster.state.endpoints = {"127.0.0.1:7002": "tcp://127.0.0.1:7102"}
    cluster.state.leader = "127.0.0.1:7002"
    answer = refused(cluster)  # a follower that knows the leader: go there
    assert answer.headers[mc0.LEADER] == b"tcp://127.0.0.1:7102"
    assert mc0.RETRY_AFTER not in answer.headers

    cluster.state.leader = None
    cluster.role = Role(False, None, 2, 3)  # an election with a majority in reach: ask again soon
    answer = refused(cluster)
    assert mc0.LEADER not in answer.headers
    assert answer.headers[mc0.RETRY_AFTER] == b"%d" % RETRY_MS

    cluster.role = Role(False, None, 1, 3)  # a minority: final ...
    cluster.started -= STARTING_FOR
    assert mc0.RETRY_AFTER not in refused(cluster).headers
    cluster.started = time.monotonic()  # ... unless it has only just started: its Raft is still connecting
    answer = refused(cluster)
    assert answer.headers[mc0.RETRY_AFTER] == b"%d" % RETRY_MS
    assert b"started a moment ago" in answer.message


def test_a_leader_handing_the_cluster_over_asks_clients_back_sooner() -> None:
    cluster = member()
    cluster.state.leader = cluster.node
    cluster.role = Role(True, cluster.node, 3, 3)
    cluster.serving = True
    assert cluster.refusal(mc0.Put(b"t", b"body", id=b"7"), redirected=False) is None  # it serves
    cluster.handing_over = True
    answer = refused(cluster)
    assert b"hands the cluster over" in answer.message
    assert answer.headers[mc0.RETRY_AFTER] == b"%d" % HAND_OVER_RETRY_MS
    assert HAND_OVER_RETRY_MS < RETRY_MS


def test_only_a_leader_bounds_its_retention_and_shows_watermarks() -> None:
    cluster = member()
    topic = cluster.engine.topic(b"t")
    cluster.engine.gate(topic, 7)
    assert cluster.engine.retention_floor is not None
    cluster.serving = True
    assert cluster.engine.retention_floor(topic) == 7
    assert cluster.stats()["high_watermarks"] == {"t": 7}
    cluster.serving = False  # stepped down: the gate stays, the copy's retention is its own
    assert cluster.engine.retention_floor(topic) is None
    assert cluster.stats()["high_watermarks"] == {}  # and its STATS show no watermark of its old epoch


def test_a_hand_over_goes_to_a_follower_whose_raft_answers() -> None:
    """A broker restarted a moment ago fetches at once but has not heard from the leader's Raft yet: Raft's
    TimeoutNow is lost on it. With acknowledgements equal, the node name used to decide, and a restarted
    ``127.0.0.1:7003`` won over ``127.0.0.1:7002``."""
    cluster = member()
    now = time.monotonic()
    cluster.heard = {"127.0.0.1:7002": now, "127.0.0.1:7003": now}
    cluster.positions = {b"t": {"127.0.0.1:7002": 10, "127.0.0.1:7003": 10}}
    cluster.role = Role(True, cluster.node, 3, 3, frozenset({"127.0.0.1:7002", "127.0.0.1:7003"}))
    assert cluster._successor() == "127.0.0.1:7003"  # both answer: the name breaks the tie
    cluster.role = Role(True, cluster.node, 3, 3, frozenset({"127.0.0.1:7002"}))
    assert cluster._successor() == "127.0.0.1:7002"
    cluster.positions = {b"t": {"127.0.0.1:7002": 9, "127.0.0.1:7003": 10}}
    assert cluster._successor() == "127.0.0.1:7002"  # even one behind: it catches up before Raft hands over
    cluster.role = Role(True, cluster.node, 3, 3)
    assert cluster._successor() == "127.0.0.1:7003"  # none answers: the most acknowledged, as before


class Submits:
    """A RaftNode stand-in that records the commands submitted."""

    def __init__(self) -> None:
        self.commands: list[tuple[Any, ...]] = []

    def submit(self, command: tuple[Any, ...], done: Any = None) -> None:
        self.commands.append(command)


def test_a_leader_handing_over_reports_no_positions() -> None:
    """Each Raft entry appended after TimeoutNow left can make the target's election fail."""
    cluster = member()
    raft = cluster.raft = Submits()  # type: ignore[assignment]
    cluster.state.endpoints = {cluster.node: cluster.endpoint}
    cluster.engine.declare(b"t", TopicSpec(persistence=Persistence.PERSISTENT))
    cluster.engine.publish(b"t", b"m", {}, 0)
    cluster.engine.commit()
    cluster.handing_over = True
    cluster._report()
    assert raft.commands == []
    cluster.handing_over = False
    cluster._report()
    assert raft.commands == [("positions", cluster.node, {b"t".hex(): 2})]
