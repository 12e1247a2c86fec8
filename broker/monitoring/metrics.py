"""The broker's Prometheus metrics: their names, types, labels and meaning, built from a snapshot.

:class:`BrokerCollector` is a prometheus-client custom collector: at each scrape it takes the latest
:class:`~broker.monitoring.snapshot.Snapshot` and turns it into metric families; prometheus-client writes the
exposition format (text or OpenMetrics, as the scraper asks). ``docs/monitoring.md`` lists every metric.

Conventions: an ``mc0_`` prefix, base units in the name (``_seconds``, ``_bytes``), ``_total`` on counters.
Topic labels are capped: the ``topic_labels`` busiest topics (messages in plus out so far) get their own
``topic`` label and the others are summed under ``topic="_other"`` (0 turns per-topic series off; the
broker-wide totals are always there). Only the ``SLOWEST_SUBSCRIPTIONS`` subscriptions with the largest lag
get a series of their own.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from importlib import metadata

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from broker.histogram import HistogramCopy
from broker.monitoring.snapshot import Snapshot, TopicRecord
from broker.monitoring.views import cluster

#: The label value under which the topics without a label of their own are summed. A topic with this very
#: name never gets a label of its own, so two series can never share it.
OTHER = "_other"
#: Subscriptions with a lag series of their own: the slowest ones (a subscriber label per client would grow
#: without bound).
SLOWEST_SUBSCRIPTIONS = 10


def version() -> str:
    try:
        return metadata.version("mc0")
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"


def labelled(topics: Iterable[TopicRecord], limit: int) -> tuple[list[TopicRecord], list[TopicRecord]]:
    """The ``limit`` busiest topics (their own label) and the rest (summed under ``_other``)."""
    ranked = sorted(topics, key=lambda topic: (-topic.traffic, topic.name))
    named = [topic for topic in ranked if topic.name != OTHER][:limit]
    chosen = {id(topic) for topic in named}
    return named, [topic for topic in ranked if id(topic) not in chosen]


def _histogram(name: str, documentation: str, copy: HistogramCopy) -> HistogramMetricFamily:
    buckets = [("+Inf" if bound == float("inf") else repr(float(bound)), count)
               for bound, count in copy.cumulative()]
    return HistogramMetricFamily(name, documentation, buckets=buckets, sum_value=copy.total)


class BrokerCollector(Collector):
    """Metric families from the snapshot ``latest()`` returns (None: the broker is not serving yet)."""

    def __init__(self, latest: Callable[[], Snapshot | None], topic_labels: int,
                 data_dir: str | os.PathLike[str] | None = None) -> None:
        self.latest = latest
        self.topic_labels = topic_labels
        self.data_dir = data_dir

    def describe(self) -> list[Metric]:
        return []  # registering must not take a snapshot; the names are checked by the tests instead

    def collect(self) -> Iterator[Metric]:
        info = InfoMetricFamily("mc0_build", "The broker's version.")
        info.add_metric([], {"version": version()})
        yield info
        snapshot = self.latest()
        yield GaugeMetricFamily("mc0_ready", "1 once the broker serves its doors, 0 while it starts.",
                                value=0 if snapshot is None else 1)
        if self.data_dir is not None:
            free = _free_bytes(self.data_dir)
            if free is not None:
                yield GaugeMetricFamily("mc0_data_dir_free_bytes",
                                        "Bytes free for the broker on the data directory's file system.",
                                        value=free)
        if snapshot is None:
            return
        yield GaugeMetricFamily("mc0_uptime_seconds", "Seconds since the broker started serving.",
                                value=snapshot.uptime_seconds)
        yield from self._doors(snapshot)
        yield from self._totals(snapshot)
        if self.topic_labels > 0:
            yield from self._topics(snapshot)
        yield from self._slowest(snapshot)
        yield from self._cluster(snapshot)
        histograms = snapshot.histograms
        if "fsync_seconds" in histograms:
            yield _histogram("mc0_fsync_duration_seconds", "How long each fsync of a segment file took.",
                             histograms["fsync_seconds"])
        yield _histogram("mc0_loop_turn_duration_seconds",
                         "How long each turn of the broker's loop took: a door's read, the commit, the "
                         "answers and the deliveries.", histograms["turn_seconds"])
        yield _histogram("mc0_group_commit_messages", "Messages written by each group commit that wrote any.",
                         histograms["commit_messages"])
        yield GaugeMetricFamily("mc0_monitoring_snapshot_seconds",
                                "Loop time the last snapshot of the counters took (the cost of a scrape "
                                "on the loop).", value=snapshot.loop_seconds)

    # ----------------------------------------------------------------------------------------------- doors

    def _doors(self, snapshot: Snapshot) -> Iterator[Metric]:
        families = {
            "connections": GaugeMetricFamily("mc0_door_connections",
                                             "Open connections per door (mc0: client sessions).",
                                             labels=["door"]),
            "accepted": CounterMetricFamily("mc0_door_accepted_connections",
                                            "Connections accepted per door.", labels=["door"]),
            "closed": CounterMetricFamily("mc0_door_closed_connections", "Connections closed per door.",
                                          labels=["door"]),
            "messages_in": CounterMetricFamily("mc0_door_received_messages",
                                               "Messages published through each door.", labels=["door"]),
            "messages_out": CounterMetricFamily("mc0_door_sent_messages",
                                                "Deliveries written to each door's clients.",
                                                labels=["door"]),
            "bytes_in": CounterMetricFamily("mc0_door_received_bytes",
                                            "Bytes read from each door's clients.", labels=["door"]),
            "bytes_out": CounterMetricFamily("mc0_door_sent_bytes",
                                             "Bytes written to each door's clients.", labels=["door"]),
            "errors": CounterMetricFamily("mc0_door_errors",
                                          "Commands refused or connections closed for breaking the dialect.",
                                          labels=["door"]),
        }
        for name, stats in sorted(snapshot.doors.items()):
            for key, family in families.items():
                if key in stats:
                    family.add_metric([name], stats[key])
        yield from families.values()
        mc0 = snapshot.doors.get("mc0", {})
        yield GaugeMetricFamily("mc0_sessions", "mc0 client sessions (one per ZeroMQ identity).",
                                value=snapshot.sessions)
        yield CounterMetricFamily("mc0_sessions_expired", "mc0 sessions dropped for heartbeat silence.",
                                  value=mc0.get("expired", 0))
        yield CounterMetricFamily("mc0_fetch_requests", "FETCH range reads answered.",
                                  value=mc0.get("fetches", 0))
        refused = CounterMetricFamily("mc0_handshakes_refused",
                                      "Handshakes the mc0 port refused: reason auth (key not in the "
                                      "allow-list), protocol (wrong server key, plaintext or garbage), "
                                      "other (ended without a reason).",
                                      labels=["reason"])
        for reason, count in sorted(snapshot.refused_handshakes.items()):
            refused.add_metric([reason], count)
        yield refused

    # ---------------------------------------------------------------------------------------------- topics

    def _totals(self, snapshot: Snapshot) -> Iterator[Metric]:
        topics = snapshot.topics
        yield GaugeMetricFamily("mc0_topics", "Topics the broker knows.", value=len(topics))
        yield CounterMetricFamily("mc0_published_messages", "Messages published, all topics.",
                                  value=sum(topic.messages_in for topic in topics))
        yield CounterMetricFamily("mc0_delivered_messages", "Messages handed to subscribers, all topics.",
                                  value=sum(topic.messages_out for topic in topics))
        yield CounterMetricFamily("mc0_dropped_messages",
                                  "Messages dropped (transient topics past a bound, or removed by retention "
                                  "before delivery), all topics.",
                                  value=sum(topic.dropped for topic in topics))
        yield GaugeMetricFamily("mc0_disk_bytes", "Bytes of topic logs on disk, all topics.",
                                value=sum(topic.bytes or 0 for topic in topics))
        yield CounterMetricFamily("mc0_fsyncs", "fsyncs of segment files, all topics.",
                                  value=sum(topic.fsyncs or 0 for topic in topics))
        yield CounterMetricFamily("mc0_write_failures",
                                  "Commits of topic logs whose write failed (a full disk, an I/O error): "
                                  "their messages were refused, all topics.",
                                  value=sum(topic.write_failures or 0 for topic in topics))

    def _topics(self, snapshot: Snapshot) -> Iterator[Metric]:
        def family(kind: type, name: str, documentation: str) -> Metric:
            return kind(name, documentation, labels=["topic"])

        published = family(CounterMetricFamily, "mc0_topic_published_messages", "Messages published.")
        delivered = family(CounterMetricFamily, "mc0_topic_delivered_messages",
                           "Messages handed to subscribers.")
        dropped = family(CounterMetricFamily, "mc0_topic_dropped_messages", "Messages dropped.")
        subscribers = family(GaugeMetricFamily, "mc0_topic_subscribers", "Subscriptions.")
        backlog = family(GaugeMetricFamily, "mc0_topic_backlog_messages",
                         "Round-robin messages waiting for a consumer.")
        lag = family(GaugeMetricFamily, "mc0_topic_consumer_lag_messages",
                     "The largest lag among the topic's subscriptions: messages published and not yet "
                     "written to the subscriber.")
        disk = family(GaugeMetricFamily, "mc0_topic_disk_bytes", "Bytes of the topic's log on disk.")
        stored = family(GaugeMetricFamily, "mc0_topic_stored_messages", "Messages in the topic's log.")
        segments = family(GaugeMetricFamily, "mc0_topic_segments", "Segment files of the topic's log.")
        fsyncs = family(CounterMetricFamily, "mc0_topic_fsyncs", "fsyncs of the topic's segment files.")
        failures = family(CounterMetricFamily, "mc0_topic_write_failures",
                          "Commits of the topic's log whose write failed (a full disk, an I/O error).")
        last_id = family(GaugeMetricFamily, "mc0_topic_last_message_id", "The newest message id.")
        named, rest = labelled(snapshot.topics, self.topic_labels)
        for topic in named:
            label = [topic.name]
            published.add_metric(label, topic.messages_in)
            delivered.add_metric(label, topic.messages_out)
            dropped.add_metric(label, topic.dropped)
            subscribers.add_metric(label, len(topic.subscriptions))
            backlog.add_metric(label, topic.backlog)
            lag.add_metric(label, topic.lag)
            last_id.add_metric(label, topic.last_id)
            if topic.bytes is not None:
                disk.add_metric(label, topic.bytes)
                stored.add_metric(label, topic.stored or 0)
                segments.add_metric(label, topic.segments or 0)
                fsyncs.add_metric(label, topic.fsyncs or 0)
                failures.add_metric(label, topic.write_failures or 0)
        if rest:
            label = [OTHER]
            published.add_metric(label, sum(topic.messages_in for topic in rest))
            delivered.add_metric(label, sum(topic.messages_out for topic in rest))
            dropped.add_metric(label, sum(topic.dropped for topic in rest))
            subscribers.add_metric(label, sum(len(topic.subscriptions) for topic in rest))
            backlog.add_metric(label, sum(topic.backlog for topic in rest))
            lag.add_metric(label, max(topic.lag for topic in rest))
            logged = [topic for topic in rest if topic.bytes is not None]
            if logged:
                disk.add_metric(label, sum(topic.bytes or 0 for topic in logged))
                stored.add_metric(label, sum(topic.stored or 0 for topic in logged))
                segments.add_metric(label, sum(topic.segments or 0 for topic in logged))
                fsyncs.add_metric(label, sum(topic.fsyncs or 0 for topic in logged))
                failures.add_metric(label, sum(topic.write_failures or 0 for topic in logged))
        yield from (published, delivered, dropped, subscribers, backlog, lag, disk, stored, segments, fsyncs,
                    failures, last_id)

    def _slowest(self, snapshot: Snapshot) -> Iterator[Metric]:
        family = GaugeMetricFamily("mc0_subscription_lag_messages",
                                   f"Lag of the {SLOWEST_SUBSCRIPTIONS} slowest subscriptions (those with a "
                                   "lag at all).", labels=["topic", "door", "subscriber"])
        for topic, subscription in snapshot.slowest(SLOWEST_SUBSCRIPTIONS):
            family.add_metric([topic.name, subscription.door, subscription.who], subscription.lag)
        yield family


    def _cluster(self, snapshot: Snapshot) -> Iterator[Metric]:
        """A cluster member's role and, on the leader, how far behind each other member is (nothing on a
        single broker)."""
        view = cluster(snapshot)
        if view is None:
            return
        member = InfoMetricFamily("mc0_cluster_member", "This broker in its cluster: its Raft address and "
                                  "the leader's (empty while none is known).", labels=[])
        member.add_metric([], {"node": view["node"], "leader": view["leader"] or ""})
        yield member
        yield GaugeMetricFamily("mc0_cluster_brokers", "Brokers in the cluster.", value=view["size"])
        yield GaugeMetricFamily("mc0_cluster_reachable_brokers",
                                "Brokers this one's Raft holds a connection to, itself included.",
                                value=view["reachable"])
        yield GaugeMetricFamily("mc0_cluster_epoch", "The epoch of the cluster's current leader.",
                                value=view["epoch"])
        yield GaugeMetricFamily("mc0_cluster_leading", "1 while this broker leads the cluster and serves, 0 "
                                "otherwise.", value=1 if view["role"] == "leader" else 0)
        yield CounterMetricFamily("mc0_cluster_takeovers", "Epochs this broker took as the new leader.",
                                  value=view["takeovers"])
        yield CounterMetricFamily("mc0_cluster_copied_messages",
                                  "Messages this broker copied from a leader as a follower.",
                                  value=view["copied"])
        lag = GaugeMetricFamily("mc0_cluster_replica_lag_messages",
                                "On the leader: messages of its persistent topics another member has not "
                                "acknowledged.", labels=["replica"])
        heard = GaugeMetricFamily("mc0_cluster_replica_last_fetch_age_seconds",
                                  "On the leader: seconds since another member's last replica fetch.",
                                  labels=["replica"])
        for node, replica in sorted(view["replicas"].items()):
            lag.add_metric([node], replica["lag"])
            if replica["heard_seconds_ago"] is not None:
                heard.add_metric([node], replica["heard_seconds_ago"])
        yield lag
        yield heard


def _free_bytes(path: str | os.PathLike[str]) -> int | None:
    """Bytes available to the broker on ``path``'s file system (its nearest existing parent's)."""
    candidate = os.path.abspath(path)
    while not os.path.exists(candidate):
        parent = os.path.dirname(candidate)
        if parent == candidate:
            return None
        candidate = parent
    try:
        stat = os.statvfs(candidate)
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize
