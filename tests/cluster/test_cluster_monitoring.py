"""A cluster seen through each member's monitoring endpoint: roles, the epoch and the members reachable, the
leader's view of each follower (its lag and its last fetch) through a paused follower, /readyz of a member
that knows no leader, and every ``mc0_cluster_*`` metric documented. Real broker processes."""

from __future__ import annotations

import http.client
import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cluster_harness import Cluster, Member, cluster_factory  # noqa: F401 - the fixture
from conftest import Samples, metric_samples
from conftest import metric_value as value

from connector import Client

DOCS = Path(__file__).resolve().parents[2] / "docs" / "monitoring.md"
TOPIC = "durable.watched"
#: Seconds a figure may take to show: snapshots are shared for half a second, a follower acknowledges by its
#: next FETCH, and Raft's view of who is reachable follows its heartbeats.
SHOWS = 20.0

def get(member: Member, path: str) -> tuple[int, bytes]:
    assert member.http is not None
    connection = http.client.HTTPConnection("127.0.0.1", member.http, timeout=10)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def health(member: Member, path: str) -> tuple[int, dict[str, str]]:
    status, body = get(member, path)
    return status, json.loads(body)


def scrape(member: Member) -> Samples:
    status, body = get(member, "/metrics")
    assert status == 200, body
    return metric_samples(body.decode())


def until(check: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + SHOWS
    while True:
        result = check()
        if result:
            return result
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.2)


@pytest.mark.timeout(150)
def test_each_member_shows_its_part_and_the_leader_each_followers_lag(cluster_factory) -> None:  # noqa: F811
    cluster: Cluster = cluster_factory(monitoring=True)
    leader = cluster.leader()
    paused, other = (member for member in cluster.members if member is not leader)
    with Client(cluster.endpoints, **cluster.client_options(), timeout=10) as client:
        for n in range(20):
            client.publish(TOPIC, f"m{n}", confirm=True)

        # The leader: every member reachable, both followers caught up and fetching.
        def leader_caught_up() -> Samples | None:
            samples = scrape(leader)
            lags = [value(samples, "mc0_cluster_replica_lag_messages", replica=member.raft)
                    for member in (paused, other)]
            whole = value(samples, "mc0_cluster_reachable_brokers") == 3
            return samples if whole and lags == [0, 0] else None

        samples = until(leader_caught_up, "the leader sees both followers caught up")
        epoch = cluster.cluster_view(leader)["epoch"]
        assert value(samples, "mc0_cluster_leading") == 1
        assert value(samples, "mc0_cluster_brokers") == 3
        assert value(samples, "mc0_cluster_epoch") == epoch >= 1
        assert value(samples, "mc0_cluster_member_info", node=leader.raft, leader=leader.raft) == 1
        assert value(samples, "mc0_cluster_takeovers_total") >= 1
        for member in (paused, other):
            age = value(samples, "mc0_cluster_replica_last_fetch_age_seconds", replica=member.raft)
            assert age is not None, member.raft
            assert 0 <= age < 5, (member.raft, age)
        names = {name.removesuffix("_total") for name in samples if name.startswith("mc0_cluster_")}
        documented = {name.removesuffix("_total") for name in
                      re.findall(r"^\| `(mc0_cluster_[a-z0-9_]+)`", DOCS.read_text(), flags=re.M)}
        assert names == documented

        # The followers: not leading, naming the leader, having copied every message.
        for member in (paused, other):
            copied = until(lambda member=member: (s := scrape(member))
                           and (value(s, "mc0_cluster_copied_messages_total") or 0) >= 20 and s,
                           f"{member.raft} shows what it copied")
            assert value(copied, "mc0_cluster_leading") == 0
            assert value(copied, "mc0_cluster_epoch") == epoch
            assert value(copied, "mc0_cluster_member_info", node=member.raft, leader=leader.raft) == 1
            assert not copied.get("mc0_cluster_replica_lag_messages")  # the leader's view only
            assert health(member, "/readyz") == (200, {"status": "ready"})
            overview = json.loads(get(member, "/api/overview")[1])
            assert overview["cluster"]["role"] == "follower"
            assert overview["cluster"]["leader"] == leader.raft
        overview = json.loads(get(leader, "/api/overview")[1])["cluster"]
        assert overview["role"] == "leader"
        assert set(overview["replicas"]) == {paused.raft, other.raft}
        stats = json.loads(get(leader, "/api/stats")[1])
        assert stats["limits"]["cluster"]["serving"] is True
        assert stats["limits"]["cluster"]["replicas"][TOPIC][other.raft] == 21  # its next id

        # A paused follower: its lag grows by what the others confirm, its last fetch ages.
        cluster.pause(paused)
        for n in range(30):
            client.publish(TOPIC, f"p{n}", confirm=True, timeout=5)

        def paused_shows() -> Samples | None:
            samples = scrape(leader)
            lag = value(samples, "mc0_cluster_replica_lag_messages", replica=paused.raft)
            age = value(samples, "mc0_cluster_replica_last_fetch_age_seconds", replica=paused.raft)
            return samples if lag == 30 and age is not None and age >= 2 else None

        samples = until(paused_shows, "the paused follower's lag and silence")
        assert value(samples, "mc0_cluster_replica_lag_messages", replica=other.raft) == 0
        cluster.resume(paused)

        def caught_up() -> bool:
            # A member back from a pause longer than the election timeout may call an election (PySyncObj has
            # no pre-vote; docs/cluster.md, "Failures"), so ask whoever leads now.
            now = cluster.leader()
            return now is paused or value(scrape(now), "mc0_cluster_replica_lag_messages",
                                          replica=paused.raft) == 0

        until(caught_up, "the resumed follower caught up")

    # Two of three paused: the leader steps down and cannot name a leader; alive, but not ready.
    assert health(leader, "/readyz") == (200, {"status": "ready"})
    cluster.pause(paused)
    cluster.pause(other)
    try:
        _, answer = until(lambda: (answer := health(leader, "/readyz"))[0] == 503 and answer,
                          "the member left alone is not ready")
        assert answer["status"] == "unavailable"
        reason = answer["reason"]
        assert "does not lead the cluster and cannot name a leader" in reason, reason
        assert "of 3 brokers reachable" in reason, reason
        assert health(leader, "/healthz") == (200, {"status": "ok"})
        assert value(scrape(leader), "mc0_cluster_leading") == 0
    finally:
        cluster.resume(paused)
        cluster.resume(other)
    until(lambda: all(get(member, "/readyz")[0] == 200 for member in cluster.members),
          "every member ready once a majority is back")
