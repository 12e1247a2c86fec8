"""The ``mc0`` source and sink against a three-broker cluster (real broker processes), the ``broker`` option
naming every member, a follower first: a batch read and a batch write follow the leader, and a streaming query
copying one strong topic into another goes on across a SIGKILL of the leader, and across a leader frozen for
longer than the connector's heartbeat TTL, every message landing in the copy exactly once."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.cluster import Cluster, make_cluster
from connector import Client

pytestmark = pytest.mark.timeout(300)

SOURCE, COPY, WRITTEN = "durable.spark.in", "durable.spark.copy", "durable.spark.written"
FROZEN = 6.0  # seconds a frozen leader stays so: past the connector's 3 s heartbeat TTL to a cluster


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    made = make_cluster(tmp_path / "brokers")
    for member in made.members:
        made.start(member)
    made.settled()
    yield made
    made.stop_all()
    made.context.term()


def members(cluster: Cluster) -> dict[str, str]:
    """The source's and sink's options: every member, a follower first (the client must find the leader)."""
    leader = cluster.settled()
    order = [member for member in cluster.members if member is not leader] + [leader]
    return {"broker": ",".join(member.endpoint for member in order), "curve": "false"}


def publish(cluster: Cluster, topic: str, start: int, count: int) -> None:
    with Client(cluster.endpoints, curve=False, timeout=10) as client:
        client.publish_batch([(topic, f"m{n}", None) for n in range(start, start + count)])


def stored(cluster: Cluster, topic: str) -> list[bytes]:
    out: list[bytes] = []
    with Client(cluster.endpoints, curve=False, timeout=10) as client:
        position = 1
        while messages := client.fetch(topic, position, max_messages=10_000).messages:
            out += [message.body for message in messages]
            position = messages[-1].id + 1
    return out


def test_a_batch_read_and_write_follow_the_leader(spark: Any, cluster: Cluster) -> None:
    publish(cluster, SOURCE, 0, 500)
    rows = spark.read.format("mc0").options(**members(cluster), subscribe=SOURCE).load()
    assert sorted(row.id for row in rows.select("id").collect()) == list(range(1, 501))
    frame = spark.createDataFrame([(f"w{n}".encode(),) for n in range(300)], "value binary")
    frame.write.format("mc0").options(**members(cluster), topic=WRITTEN).mode("append").save()
    assert sorted(stored(cluster, WRITTEN)) == sorted(f"w{n}".encode() for n in range(300))


@pytest.mark.parametrize("failure", ["kill", "freeze"])
def test_a_streaming_copy_goes_on_across_a_failover_exactly_once(
    spark: Any, cluster: Cluster, tmp_path: Path, failure: str
) -> None:
    """``kill``: SIGKILL (its connections close at once); ``freeze``: SIGSTOP for 6 s (they stay open: the
    clients leave it after their heartbeat TTL), then it runs again and follows."""
    publish(cluster, SOURCE, 0, 300)
    stream = (spark.readStream.format("mc0").options(**members(cluster), subscribe=SOURCE,
                                                       startingOffsets="earliest").load())
    query = (stream.select("value").writeStream.format("mc0").options(**members(cluster), topic=COPY)
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(processingTime="200 milliseconds").start())
    try:
        until_copied(cluster, query, 300)
        leader = cluster.settled()
        stopped = time.monotonic()
        if failure == "kill":
            cluster.kill(leader)
        else:
            cluster.pause(leader)
        publish(cluster, SOURCE, 300, 300)  # through the new leader
        if failure == "kill":
            cluster.start(leader)  # back as a follower
        else:
            time.sleep(max(0.0, FROZEN - (time.monotonic() - stopped)))
            cluster.resume(leader)  # it learns it was deposed and follows
        until_copied(cluster, query, 600)
    finally:
        query.stop()
    copied = stored(cluster, COPY)
    assert sorted(copied) == sorted(f"m{n}".encode() for n in range(600)), "each message once in the copy"


def until_copied(cluster: Cluster, query: Any, count: int) -> None:
    deadline = time.monotonic() + 120
    while len(stored(cluster, COPY)) < count:
        assert query.isActive, f"the query stopped: {query.exception()}"
        assert time.monotonic() < deadline, f"the copy holds {len(stored(cluster, COPY))} of {count}"
        time.sleep(0.5)
