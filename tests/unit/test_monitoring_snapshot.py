"""The monitoring snapshot, taken on a loop: it yields between slices, copies what STATS shows, names
subscribers by their owners, counts lag once per subscriber, and the group commit sizes the engine reports;
a cluster member's view built from it."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from memory_log import MemoryStore

from broker.engine import Engine, Subscriber
from broker.hub import Hub
from broker.monitoring import snapshot
from broker.monitoring.views import cluster, topic_stats
from broker.topics import Persistence, TopicRule, TopicRules, TopicSpec


class Owner:
    def __init__(self, door: str, who: str) -> None:
        self.who = (door, who)


def broker_of(engine: Engine) -> Any:
    return SimpleNamespace(engine=engine, hub=Hub(engine), router=SimpleNamespace(sessions={}),
                           handshakes=None)


def take(engine: Engine) -> snapshot.Snapshot:
    return asyncio.run(snapshot.take(broker_of(engine)))


def test_a_snapshot_yields_to_the_loop_between_slices(monkeypatch) -> None:
    engine = Engine()
    for n in range(50):
        engine.publish(b"t%d" % n, b"x", {}, 0)
    monkeypatch.setattr(snapshot, "SLICE_SECONDS", 0.0)  # every topic is a slice of its own
    ticks = 0

    async def other_work() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    async def main() -> snapshot.Snapshot:
        worker = asyncio.create_task(other_work())
        await asyncio.sleep(0)
        taken = await snapshot.take(broker_of(engine))
        worker.cancel()
        return taken

    taken = asyncio.run(main())
    assert taken.slices == 51  # one per topic, and the last for the doors and histograms
    assert ticks >= 49  # the loop ran other work between every two slices
    assert len(taken.topics) == 50


def test_topic_records_give_what_stats_gives() -> None:
    rules = TopicRules([TopicRule("p.*", TopicSpec(persistence=Persistence.PERSISTENT))])
    engine = Engine(rules, MemoryStore())
    reader = Subscriber(Owner("sexp", "127.0.0.1:5000"))
    engine.subscribe(reader, b"p.a", credit=2, explicit_acks=True)
    for n in range(5):
        engine.publish(b"p.a", b"m%d" % n, {}, n)
        engine.publish(b"plain", b"m%d" % n, {}, n)
    engine.commit()
    assert engine.last_commit_messages == 5
    taken = take(engine)
    assert {record.name: topic_stats(record) for record in taken.topics} == engine.stats()
    (subscription,) = next(record for record in taken.topics if record.name == "p.a").subscriptions
    assert (subscription.door, subscription.who) == ("sexp", "127.0.0.1:5000")
    assert subscription.lag == 5  # two held for it (credit 2), three behind in the log
    assert taken.slowest(10)[0][1] is subscription


def test_lag_of_a_subscriber_on_several_topics_counts_only_its_topic() -> None:
    engine = Engine()
    reader = Subscriber(Owner("mc0", "ab"))
    engine.subscribe(reader, b"a")
    engine.subscribe(reader, b"b")
    for _ in range(3):
        engine.publish(b"a", b"x", {}, 0)
    engine.publish(b"b", b"y", {}, 0)
    lags = {record.name: record.lag for record in take(engine).topics}
    assert lags == {"a": 3, "b": 1}


def test_names_that_are_not_utf8_stay_distinct() -> None:
    engine = Engine()
    engine.publish(b"caf\xe9", b"x", {}, 0)
    engine.publish(b"caf\xc3\xa9", b"x", {}, 0)
    assert sorted(record.name for record in take(engine).topics) == ["caf\\xe9", "café"]


def cluster_figures(serving: bool, **changes: Any) -> dict[str, Any]:
    """What broker.cluster.node.Cluster.stats() gives, for a member "n1" of three."""
    return {"node": "n1", "endpoint": "tcp://n1:1", "size": 3, "epoch": 4, "peers": ["n2", "n3"],
            "leader": "n1" if serving else "n2", "leader_endpoint": None if serving else "tcp://n2:1",
            "serving": serving, "raft_leader": serving, "reachable": 3, "unready": None, "takeovers": 1,
            "high_watermarks": {}, "copied": 7, "replicas": {}, "heard": {}, **changes}


def test_a_cluster_leaders_view_counts_each_followers_lag_over_its_persistent_topics() -> None:
    rules = TopicRules([TopicRule("p.*", TopicSpec(persistence=Persistence.PERSISTENT))])
    engine = Engine(rules, MemoryStore())
    for n in range(10):
        engine.publish(b"p.a", b"x", {}, n)  # ids 1..10
    for n in range(4):
        engine.publish(b"p.b", b"x", {}, n)  # ids 1..4
        engine.publish(b"plain", b"x", {}, n)  # transient: not copied, never lag
    engine.commit()
    broker = broker_of(engine)
    # n2 acknowledged all of p.a and none of p.b yet; n3 nothing at all, and was never heard from.
    figures = cluster_figures(True, replicas={"p.a": {"n2": 11}}, heard={"n2": 0.25})
    broker.hub.limits["cluster"] = lambda: figures
    view = cluster(asyncio.run(snapshot.take(broker)))
    assert view is not None
    assert view["role"] == "leader"
    assert view["replicas"] == {"n2": {"lag": 4, "heard_seconds_ago": 0.25},
                                "n3": {"lag": 14, "heard_seconds_ago": None}}


def test_a_followers_view_and_a_single_brokers() -> None:
    engine = Engine()
    broker = broker_of(engine)
    assert cluster(asyncio.run(snapshot.take(broker))) is None
    broker.hub.limits["cluster"] = lambda: cluster_figures(False)
    view = cluster(asyncio.run(snapshot.take(broker)))
    assert view is not None
    assert (view["role"], view["leader"], view["replicas"]) == ("follower", "n2", {})
    broker.hub.limits["cluster"] = lambda: cluster_figures(False, leader=None, leader_endpoint=None,
                                                           unready="no leader is known")
    assert cluster(asyncio.run(snapshot.take(broker)))["role"] == "no leader"
