"""The JSON API's documents, built from a snapshot (in an HTTP thread, never on the loop).

``/api/stats`` and ``/api/topics`` have the shapes of the mc0 ``STATS`` reply and of ``mc0 topics --json``,
key for key, so a script can use either; ``/api/overview`` is what the dashboard polls (the busiest topics,
the doors, the slowest subscribers, the histograms); ``/api/topics/NAME`` is one topic's page.
``docs/monitoring.md`` describes them.
"""

from __future__ import annotations

from typing import Any

from broker.histogram import HistogramCopy
from broker.monitoring.snapshot import Snapshot, SubscriptionRecord, TopicRecord

#: Topics in the overview (the busiest), subscribers in its "slowest" list, and subscriptions listed on one
#: topic's page: enough for a screen, bounded whatever the broker holds.
OVERVIEW_TOPICS = 50
OVERVIEW_SLOWEST = 10
TOPIC_PAGE_SUBSCRIPTIONS = 1000

#: How /api/topics may sort.
SORTS = {
    "name": lambda topic: topic.name,
    "traffic": lambda topic: -topic.traffic,
    "lag": lambda topic: -topic.lag,
    "bytes": lambda topic: -(topic.bytes or 0),
    "subscribers": lambda topic: -len(topic.subscriptions),
}


def topic_stats(topic: TopicRecord) -> dict[str, Any]:
    """One topic as STATS shows it (the keys of the engine's ``Topic.stats()``)."""
    out: dict[str, Any] = {
        "id": topic.topic_id,
        **topic.spec.describe(),
        "subscribers": len(topic.subscriptions),
        "messages_in": topic.messages_in,
        "messages_out": topic.messages_out,
        "dropped": topic.dropped,
        "duplicates": topic.duplicates,
        "backlog": topic.backlog,
        "first_id": topic.first_id,
        "last_id": topic.last_id,
        "lag": topic.lag,
        "consumers": [{"lag": item.lag, "credit": item.credit, "unacked": item.unacked,
                       "catching_up": item.catching_up} for item in topic.subscriptions],
    }
    if topic.bytes is not None:
        out.update(stored=topic.stored, bytes=topic.bytes, segments=topic.segments, fsyncs=topic.fsyncs,
                   write_failures=topic.write_failures)
    return out


def stats(snapshot: Snapshot) -> dict[str, Any]:
    """What the mc0 STATS command answers."""
    out = {
        "uptime_seconds": round(snapshot.uptime_seconds, 3),
        "connections": {name: door["connections"] for name, door in snapshot.doors.items()},
        "doors": snapshot.doors,
        "topics": {topic.name: topic_stats(topic) for topic in snapshot.topics},
    }
    if snapshot.limits:
        out["limits"] = snapshot.limits
    return out


def cluster(snapshot: Snapshot) -> dict[str, Any] | None:
    """A cluster member's view (None on a single broker): its role, the epoch, the leader, how many members
    its Raft is connected to and, on the leader, each other member's ``lag`` (messages of the leader's
    persistent topics it has not acknowledged; all of a topic's it never acknowledged anything of) and how
    many seconds ago its last REPLICA fetch arrived (None: not since this broker began leading)."""
    view = snapshot.limits.get("cluster")
    if view is None:
        return None
    role = "leader" if view["serving"] else "follower" if view["unready"] is None else "no leader"
    replicas: dict[str, dict[str, Any]] = {}
    if view["serving"]:
        acknowledged = view["replicas"]
        logged = [topic for topic in snapshot.topics if topic.first_id is not None]
        for node in view["peers"]:
            lag = 0
            for topic in logged:
                held = acknowledged.get(topic.name, {}).get(node, topic.first_id)
                lag += max(0, topic.last_id + 1 - held)
            replicas[node] = {"lag": lag, "heard_seconds_ago": view["heard"].get(node)}
    return {"node": view["node"], "role": role, "epoch": view["epoch"], "leader": view["leader"],
            "leader_endpoint": view["leader_endpoint"], "size": view["size"], "reachable": view["reachable"],
            "unready": view["unready"], "takeovers": view["takeovers"], "copied": view["copied"],
            "replicas": replicas}


def topics(snapshot: Snapshot, *, sort: str = "name", limit: int | None = None, offset: int = 0,
           match: str = "") -> dict[str, Any]:
    """Topics as ``mc0 topics --json`` prints them, optionally filtered (a substring), sorted and paged."""
    chosen = [topic for topic in snapshot.topics if match in topic.name]
    chosen.sort(key=lambda topic: topic.name)
    chosen.sort(key=SORTS[sort])
    end = None if limit is None else offset + limit
    return {topic.name: topic_stats(topic) for topic in chosen[offset:end]}


def subscription(subscription: SubscriptionRecord, topic: str | None = None) -> dict[str, Any]:
    out = {"door": subscription.door, "client": subscription.who, "lag": subscription.lag,
           "pending": subscription.pending, "credit": subscription.credit, "unacked": subscription.unacked,
           "catching_up": subscription.catching_up, "delivered": subscription.delivered,
           "dropped": subscription.dropped}
    return out if topic is None else {"topic": topic, **out}


def topic_page(topic: TopicRecord) -> dict[str, Any]:
    """One topic: its settings (retention included), ids, counters and subscribers."""
    listed = topic.subscriptions[:TOPIC_PAGE_SUBSCRIPTIONS]
    spec = topic.spec
    return {
        "name": topic.name,
        **topic_stats(topic),
        "retention": {"bytes": spec.retention_bytes, "seconds": spec.retention_seconds}
        if spec.persistent else None,
        "subscriptions": [subscription(item) for item in listed],
        "subscriptions_not_listed": len(topic.subscriptions) - len(listed),
    }


def histogram(copy: HistogramCopy) -> dict[str, Any]:
    return {"bounds": list(copy.bounds), "counts": list(copy.counts), "sum": copy.total, "count": copy.count,
            "p50": copy.quantile(0.5), "p99": copy.quantile(0.99)}


def _row(topic: TopicRecord) -> dict[str, Any]:
    spec = topic.spec
    return {"name": topic.name, "delivery": spec.delivery.value, "persistence": spec.persistence.value,
            "sync": spec.sync.value if spec.sync is not None else None, "messages_in": topic.messages_in,
            "messages_out": topic.messages_out, "dropped": topic.dropped,
            "subscribers": len(topic.subscriptions), "lag": topic.lag, "backlog": topic.backlog,
            "bytes": topic.bytes, "first_id": topic.first_id, "last_id": topic.last_id}


def overview(snapshot: Snapshot, broker: dict[str, Any]) -> dict[str, Any]:
    """What the dashboard polls: the broker, totals, doors, the busiest topics, the slowest subscribers."""
    every = snapshot.topics
    busiest = sorted(every, key=lambda topic: (-topic.traffic, topic.name))[:OVERVIEW_TOPICS]
    return {
        "broker": {**broker, "uptime_seconds": round(snapshot.uptime_seconds, 3), "time": snapshot.wall,
                   "failure": snapshot.failure},
        "totals": {
            "topics": len(every),
            "messages_in": sum(topic.messages_in for topic in every),
            "messages_out": sum(topic.messages_out for topic in every),
            "dropped": sum(topic.dropped for topic in every),
            "bytes": sum(topic.bytes or 0 for topic in every),
            "subscriptions": sum(len(topic.subscriptions) for topic in every),
            "connections": sum(door["connections"] for door in snapshot.doors.values()),
            "sessions": snapshot.sessions,
        },
        "doors": snapshot.doors,
        "topics": [_row(topic) for topic in busiest],
        "slowest": [subscription(item, topic.name) for topic, item in snapshot.slowest(OVERVIEW_SLOWEST)],
        "histograms": {name: histogram(copy) for name, copy in snapshot.histograms.items()},
        "refused_handshakes": snapshot.refused_handshakes,
        "cluster": cluster(snapshot),
        "snapshot": {"loop_ms": round(snapshot.loop_seconds * 1000, 3), "slices": snapshot.slices},
    }
