"""A leader that lost its majority and is elected again, in a new epoch, before any other member led: its
subscribers must learn the new epoch's log identity, or a later failover replays to them what they read.

Each epoch gives every topic's log a successor identity at its next id (docs/cluster.md, "Log identity"). A
client that resumes names the identity it knows; a log whose lineage says the client's identity parted from
it at id P has the client read again from P. A subscriber that stayed connected to a leader that stepped down
and came back kept reading under the old identity without knowing: on the next failover it resumed from the
epoch's start and got every message since then a second time (found by random faults: a subscriber read
27,000 messages twice). The leader now sends its subscribers back to itself when it leads again, so they
subscribe again and learn the identity. Both clients, each as the subscriber.

How the test makes the same broker win again: with both followers killed, a DECLARE to the leader puts a Raft
entry in its log that no follower has; it steps down (no majority), and once one follower is back, only the
leader's log is up to date enough for Raft's vote. Real broker processes."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Coroutine
from typing import Any

import pytest
from cluster_harness import Cluster, careful_publish, cluster_factory, holds, until  # noqa: F401 - the fixture

from connector import AsyncClient, Client, ConnectorError

TOPIC = "durable.again"


class Reader:
    """The subscriber: a blocking :class:`Client`, or an :class:`AsyncClient` on a loop of its own thread."""

    def __init__(self, cluster: Cluster, kind: str) -> None:
        self.seen: list[int] = []
        self.client: Any
        self.loop: asyncio.AbstractEventLoop | None = None
        options = {**cluster.client_options(), "timeout": 10}
        if kind == "blocking":
            self.client = Client(cluster.endpoints, **options)
            return
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True, name="subscriber's loop").start()
        self.client = self._run(AsyncClient(cluster.endpoints, **options).connect())

    def _run(self, call: Any) -> Any:
        if self.loop is None:
            return call
        assert isinstance(call, Coroutine)
        return asyncio.run_coroutine_threadsafe(call, self.loop).result(40)

    def subscribe(self) -> None:
        self._run(self.client.subscribe(TOPIC, replay="beginning"))

    def up_to(self, last: int) -> None:
        """Receive until message ``last`` arrived (at most 30 s), every id into :attr:`seen`."""
        deadline = time.monotonic() + 30
        while not self.seen or self.seen[-1] < last:
            assert time.monotonic() < deadline, f"the subscriber stopped at {self.seen[-1:]}, not at {last}"
            message = self._run(self.client.receive(timeout=0.2))
            if message is not None:
                assert message.id is not None
                self.seen.append(message.id)

    def close(self) -> None:
        self._run(self.client.close())
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self.loop.stop)


def _publish(cluster: Cluster, first: int, count: int) -> int:
    """Publish ``count`` numbered messages, each confirmed; the last one's id."""
    with Client(cluster.endpoints, **cluster.client_options(), timeout=10) as client:
        for n in range(first, first + count):
            last = int(careful_publish(client, TOPIC, str(n))["MESSAGE-ID"])
    return last


@pytest.mark.timeout(180)
@pytest.mark.parametrize("kind", ["blocking", "asyncio"])
def test_a_leader_elected_again_sends_its_subscribers_back_and_a_later_failover_repeats_nothing(
    cluster_factory, kind: str,  # noqa: F811
) -> None:
    cluster: Cluster = cluster_factory()
    leader = cluster.settled()
    one, two = (member for member in cluster.members if member is not leader)
    last = _publish(cluster, 0, 20)
    subscriber = Reader(cluster, kind)
    try:
        subscriber.subscribe()
        subscriber.up_to(last)
        epoch = cluster.cluster_view(leader)["epoch"]

        cluster.kill(one)
        cluster.kill(two)
        # A Raft entry only the leader holds (the topic's settings), whatever the DECLARE's answer.
        with (Client(leader.endpoint, **cluster.client_options(), timeout=0.5) as declaring,
              contextlib.suppress(ConnectorError)):
            declaring.declare("durable.only.here", persistence="persistent", sync="strong")
        until(lambda: not cluster.cluster_view(leader)["serving"], "the leader steps down without a majority")
        cluster.start(one)
        assert cluster.settled() is leader, "the member with the longest Raft log leads again"
        assert cluster.cluster_view(leader)["epoch"] > epoch

        last = _publish(cluster, 20, 20)
        subscriber.up_to(last)
        cluster.start(two)
        until(lambda: holds(cluster, one, TOPIC, last) and holds(cluster, two, TOPIC, last),
              "both followers copy the topic")
        cluster.kill(leader)
        assert cluster.settled() is not leader
        last = _publish(cluster, 40, 20)
        subscriber.up_to(last)
        assert subscriber.seen == list(range(1, last + 1)), "a message received twice, or missed"
        # Every log identity it met was a successor of the one it had read.
        assert subscriber.client._core.log_changes == []
    finally:
        subscriber.close()
