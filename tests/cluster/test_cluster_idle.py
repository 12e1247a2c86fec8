"""What an idle cluster costs: followers keep one long-polling FETCH waiting per persistent topic, and the
leader hears from each follower about once a second (its pulse) whatever the number of topics. Replica waits
do not count against the clients' bound (``max_waiting_fetches``): answered at once, a follower would ask
again at once, and leader and follower would spin. Real broker processes."""

from __future__ import annotations

import time

import pytest
from cluster_harness import Cluster, cluster_factory  # noqa: F401 - the fixture

from connector import Client

TOPICS = 6
#: Seconds the leader's FETCH counter is watched while nothing is published.
WATCHED = 3.0


def _fetches(cluster: Cluster) -> tuple[int, int, dict[str, float]]:
    """The leader's answered FETCHes and waiting ones, and how long ago it heard from each follower."""
    stats = cluster.stats(cluster.leader())
    assert stats is not None
    door = stats["doors"]["mc0"]
    return door["fetches"], door["waiting_fetches"], stats["limits"]["cluster"]["heard"]


@pytest.mark.timeout(120)
def test_idle_topics_cost_the_leader_a_pulse_per_follower_not_a_fetch_per_topic(
        cluster_factory) -> None:  # noqa: F811
    # Room for two clients' waits, and 2 followers x 6 topics of replica waits beyond it.
    cluster: Cluster = cluster_factory(settings="max_waiting_fetches = 2\n")
    with Client(cluster.endpoints, **cluster.client_options(), timeout=10) as client:
        for n in range(TOPICS):
            client.publish(f"durable.idle{n}", "one", confirm=True)
    deadline = time.monotonic() + 20
    while _fetches(cluster)[1] < 2 * TOPICS:  # every follower copied every topic and waits for more
        assert time.monotonic() < deadline, f"the followers do not wait on every topic: {_fetches(cluster)}"
        time.sleep(0.2)
    before, _, _ = _fetches(cluster)
    time.sleep(WATCHED)
    after, waiting, heard = _fetches(cluster)
    assert waiting == 2 * TOPICS
    # Each follower's pulse: about one a second each; once a second per topic would be 36, a spin thousands.
    assert after - before <= 2 * (WATCHED + 2), (before, after)
    assert len(heard) == 2
    assert all(age < 2.0 for age in heard.values()), heard  # the pulse keeps the last-fetch age short
