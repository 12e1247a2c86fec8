"""The asyncio client (:class:`connector.AsyncClient`) against a real three-broker cluster, as docs/cluster.md
("Clients") promises and as the blocking client is tested in this directory:

* given every member, a follower first, it is sent to the leader (the OK to its CONNECT names it) and its
  confirmed publish is stored there; given a follower alone, the same;
* a subscriber resumes after its last id across SIGKILLed leaders while a careful publisher's idempotent
  batches are sent again until confirmed: every stored message received once, in order, none stored twice;
* ``await publish(confirm=True)`` in a loop across SIGKILLed leaders confirms, or fails saying the message
  "may or may not have been stored" (only the one in flight at each kill); every confirmed message is stored
  once under the id its OK gave; and the new leader confirms within a fraction of a second of the kill;
* a leader frozen (SIGSTOP) past the clients' heartbeat TTL to a cluster (3 s) is left for the new leader
  before it runs again, by a publisher and a subscriber, with the checks above;
* a client given one member only, that member killed and started again as a follower: the follower's
  refusal naming the leader sends the client there, and the refused publish is stored once.

Each test runs its clients on one asyncio loop (``asyncio.run``); what blocks (killing, starting and asking
the brokers) runs in a worker thread (``asyncio.to_thread``), so that the clients' loop never stops while a
broker dies. What was stored is read back with the blocking client. Real broker processes on loopback."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable
from typing import Any

import pytest
from cluster_harness import Cluster, Member, cluster_factory  # noqa: F401 - the fixture

from connector import AsyncClient, Client, ConnectorError
from connector.base import CLUSTER_TTL_MS

#: What a confirmed publish that may have been stored says when it fails (connector.base.fail_confirms).
MAYBE = "may or may not have been stored"
#: Messages of a careful publisher's idempotent batch.
BATCH = 5
#: Leaders SIGKILLed in a row (each started again before the next kill).
KILLS = 2
#: Leaders SIGKILLed under the plain confirmed publisher.
CONFIRMED_KILLS = 5
#: Confirmed publishes (or batches) between two kills: the publisher is under way when the leader dies.
BETWEEN = 20
#: Kills of the one member a client was given (started again as a follower).
ROUNDS = 3
#: Seconds from a leader's kill to the first publish confirmed by the new leader, the median over the kills.
FAST_FAILOVER = 0.25
#: How long the leader stays frozen: past the election (0.5-1 s) and past the clients' heartbeat TTL to a
#: cluster's members (3 s), so that the clients must leave it on their own before it runs again.
FROZEN_FOR = 6.0
assert CLUSTER_TTL_MS / 1000 < FROZEN_FOR - 2


async def off_loop(call: Callable[..., Any], *args: Any) -> Any:
    """A blocking call (a broker started, killed or asked its STATS) in a worker thread."""
    return await asyncio.to_thread(call, *args)


async def until(check: Callable[[], object], what: str, *tasks: asyncio.Task[None],
                within: float = 30.0) -> None:
    """Wait until ``check()`` is true, letting the loop run; fail saying ``what`` never happened after
    ``within`` seconds, or at once with the error of any of ``tasks`` that ended meanwhile."""
    deadline = time.monotonic() + within
    while not check():
        for task in tasks:
            if task.done():
                task.result()  # its error, if it failed
                raise AssertionError(f"{task.get_name()} stopped before: {what}")
        assert time.monotonic() < deadline, f"never: {what}"
        await asyncio.sleep(0.01)


def stored(cluster: Cluster, topic: str) -> list[tuple[int, bytes]]:
    """Every message of ``topic`` the leader holds, ``(id, body)`` in order, read with the blocking client."""
    leader = cluster.settled()
    log: list[tuple[int, bytes]] = []
    with Client(leader.endpoint, **cluster.client_options(), timeout=10) as client:
        start = 1
        for _ in range(100):
            result = client.fetch(topic, start, max_messages=10_000)
            if not result.messages:
                return log
            log += [(message.id, message.body) for message in result.messages]  # type: ignore[misc]
            start = log[-1][0] + 1
    raise AssertionError(f"more than 100 pages of {topic}")


class Publisher:
    """``await client.publish(topic, str(n), confirm=True)`` for n = 0, 1, 2, ..., each body once (a failed
    publish is not sent again): what each call gave is kept."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.stop = False
        self.sent = 0
        self.confirmed: list[tuple[int, int, float]] = []  # (n, MESSAGE-ID, when)
        self.failed: list[tuple[int, str]] = []  # (n, what the ConnectorError said)

    async def run(self, client: AsyncClient) -> None:
        while not self.stop:
            n = self.sent
            self.sent += 1
            try:
                reply = await client.publish(self.topic, f"{n}", confirm=True, timeout=10)
            except ConnectorError as error:
                self.failed.append((n, str(error)))
                continue
            assert reply is not None
            self.confirmed.append((n, int(reply["MESSAGE-ID"]), time.monotonic()))


class Subscriber:
    """Receives ``topic`` from its beginning, keeping ``(id, body)`` of every delivery."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.stop = False
        self.received: list[tuple[int, bytes]] = []

    async def run(self, client: AsyncClient) -> None:
        await client.subscribe(self.topic, replay="beginning")
        while not self.stop:
            message = await client.receive(timeout=0.1)
            if message is not None:
                assert message.id is not None
                self.received.append((message.id, message.body))

    async def read_up_to(self, last: int, task: asyncio.Task[None]) -> None:
        """Until the subscriber received id ``last``; then it stops."""
        await until(lambda: self.received and self.received[-1][0] >= last,
                    f"the subscriber received id {last}", task)
        self.stop = True
        await asyncio.wait_for(task, 10)


def only_those_in_flight_failed(publisher: Publisher, deaths: int) -> None:
    """Each publish that failed said it may or may not have been stored, and no more failed than the one in
    flight at each of ``deaths`` leaders (docs/cluster.md, "Clients": one made while a new leader is being
    chosen is confirmed once it is)."""
    for n, why in publisher.failed:
        assert MAYBE in why, f"publish {n} failed without saying it may have been stored: {why}"
    assert len(publisher.failed) <= deaths, f"more than those in flight failed: {publisher.failed}"


def every_confirmed_once(log: list[tuple[int, bytes]], publisher: Publisher) -> None:
    """What the leader holds of a :class:`Publisher`'s topic: ids dense from 1 (none skipped), each body once
    and in the order published (no publish stored twice), every confirmed message there under the id its
    OK gave (an id never names another message), and nothing that was not published."""
    ids = [message_id for message_id, _ in log]
    assert ids == list(range(1, len(ids) + 1)), "ids are not dense from 1"
    bodies = [int(body) for _, body in log]
    twice = {n: [message_id for message_id, body in log if int(body) == n]
             for n in {n for n in bodies if bodies.count(n) > 1}}
    assert not twice, f"publishes stored more than once (message: ids): {twice}"
    assert bodies == sorted(bodies), "messages are stored out of the order they were published"
    assert set(bodies) <= set(range(publisher.sent))
    at = {int(body): message_id for message_id, body in log}
    for n, message_id, _ in publisher.confirmed:
        assert n in at, f"confirmed message {n} (id {message_id}) is lost"
        assert at[n] == message_id, f"confirmed message {n} was given id {message_id}, stored as {at[n]}"


def difference(received: list[tuple[int, bytes]], log: list[tuple[int, bytes]]) -> str:
    """Where what a subscriber received first differs from what is stored."""
    at = next((index for index, (got, held) in enumerate(zip(received, log, strict=False)) if got != held),
              min(len(received), len(log)))
    return (f"the subscriber received {len(received)} messages, {len(log)} are stored; from the {at}th: "
            f"received {received[at:at + 3]}, stored {log[at:at + 3]}")


# ------------------------------------------------------------------------------------------------------ tests


@pytest.mark.timeout(60)
def test_a_client_given_every_member_that_lands_on_a_follower_publishes_at_the_leader(
    cluster_factory,  # noqa: F811
) -> None:
    """A follower's OK to CONNECT names the leader (LEADER): the client moves there before ``connect()``
    returns, and its confirmed publish is stored there, on a majority, once. Given every member with a
    follower first, and given a follower alone (the leader is added to its endpoints)."""
    cluster: Cluster = cluster_factory()
    leader = cluster.settled()
    followers = [member for member in cluster.members if member is not leader]
    topic = "durable.async.moves"

    async def main() -> None:
        every_member = ",".join(member.endpoint for member in [*followers, leader])
        for n, endpoints in enumerate((every_member, followers[1].endpoint)):
            async with AsyncClient(endpoints, **cluster.client_options(), timeout=10) as client:
                assert client.endpoint == leader.endpoint, "the client stayed on a follower"
                assert client.moves == 1
                assert leader.endpoint in client.endpoints
                reply = await client.publish(topic, f"m{n}", confirm=True)
                assert reply is not None
                assert reply["DURABILITY"] == "fsync"  # a strong topic: on a majority's disks
                assert int(reply["MESSAGE-ID"]) == n + 1

    asyncio.run(main())
    assert stored(cluster, topic) == [(1, b"m0"), (2, b"m1")]


async def kill_leaders(cluster: Cluster, count: int, *tasks: asyncio.Task[None],
                       progress: Callable[[], int]) -> list[float]:
    """SIGKILL the leader ``count`` times, each once ``progress()`` grew by BETWEEN, and start it again once
    ``progress()`` grew after the kill (confirmed by the new leader: the publisher was not stuck); the
    seconds from each kill to that first confirmation."""
    failovers = []
    for kill in range(count):
        before = progress()
        await until(lambda before=before: progress() >= before + BETWEEN, f"confirmed before kill {kill}",
                    *tasks)
        leader: Member = await off_loop(cluster.settled)
        at_kill = progress()
        killed = time.monotonic()
        await off_loop(cluster.kill, leader)
        await until(lambda at_kill=at_kill: progress() > at_kill + 1, f"confirmed after kill {kill}", *tasks)
        failovers.append(time.monotonic() - killed)
        await off_loop(cluster.start, leader)  # back as a follower, for the next kill
    before = progress()
    await until(lambda: progress() >= before + BETWEEN, "confirmed after the last kill", *tasks)
    return failovers


@pytest.mark.timeout(120)
def test_a_subscriber_resumes_after_its_last_id_across_killed_leaders(cluster_factory) -> None:  # noqa: F811
    """A subscriber reads a strong topic from its beginning while a careful publisher publishes idempotent
    batches to it (each sent again, same producer and sequence, until confirmed), both given every member;
    the leader is SIGKILLed twice. The subscriber resumes after the last id it received on each new leader:
    it ends up with every stored message once, in order, no id skipped, and the log holds every confirmed
    batch once (the batches sent again were not stored twice) under the id its OK gave."""
    cluster: Cluster = cluster_factory()
    topic = "durable.async.resume"
    confirmed: list[tuple[int, int | None]] = []  # (sequence of a batch, MESSAGE-ID of its last message)
    stop = False

    async def publish(client: AsyncClient) -> None:
        sequence = 0
        while not stop:  # stops only between batches: the last one sent is confirmed
            items = [(topic, f"{sequence + n}", None) for n in range(BATCH)]
            try:
                reply = await client.publish_batch(items, producer="careful", sequence=sequence, timeout=10)
            except ConnectorError:
                await asyncio.sleep(0.02)  # the leader died with the batch in flight: the same batch again
                continue
            last = reply.get("MESSAGE-ID")  # none when the new leader already held the whole batch
            confirmed.append((sequence, None if last is None else int(last)))
            sequence += BATCH

    async def main() -> None:
        nonlocal stop
        subscriber = Subscriber(topic)
        options = {**cluster.client_options(), "timeout": 10}
        async with AsyncClient(cluster.endpoints, **options) as reading, \
                AsyncClient(cluster.endpoints, **options) as writing:
            reader = asyncio.create_task(subscriber.run(reading), name="the subscriber")
            writer = asyncio.create_task(publish(writing), name="the publisher")
            await until(lambda: len(subscriber.received) > 0, "the subscriber reads", reader, writer)
            await kill_leaders(cluster, KILLS, reader, writer, progress=lambda: len(confirmed))
            stop = True
            await asyncio.wait_for(writer, 15)
            log = await off_loop(stored, cluster, topic)
            await subscriber.read_up_to(log[-1][0], reader)
            assert reading.moves >= KILLS, "the subscriber never left a killed leader"
        ids = [message_id for message_id, _ in log]
        assert ids == list(range(1, len(ids) + 1)), "ids are not dense from 1"
        assert [body for _, body in log] == [b"%d" % n for n in range(len(log))], \
            "a batch stored twice, out of order or in part"
        for sequence, last_id in confirmed:
            assert sequence + BATCH <= len(log), f"confirmed batch {sequence} is lost"
            if last_id is not None:  # the id the OK gave still names that message
                assert log[last_id - 1][1] == b"%d" % (sequence + BATCH - 1)
        # Resumed on each new leader after the last id received: every stored message once, in order.
        assert subscriber.received == log, difference(subscriber.received, log)

    asyncio.run(main())


@pytest.mark.timeout(120)
def test_confirmed_publishes_across_killed_leaders_are_stored_once_under_their_ids(cluster_factory) -> None:  # noqa: F811
    """``await client.publish(topic, body, confirm=True)`` in a loop (one in flight, each body once) while the
    leader is SIGKILLed three times: each call returns the OK or raises ConnectorError saying the message may
    or may not have been stored; only the publish in flight when a leader died may fail (one made during the
    election is confirmed once it is over); afterwards every confirmed message is stored once, in the order
    published, under the id its OK gave, and no publish is stored twice."""
    cluster: Cluster = cluster_factory()
    publisher = Publisher("durable.async.confirmed")

    async def main() -> None:
        async with AsyncClient(cluster.endpoints, **cluster.client_options(), timeout=10) as client:
            writer = asyncio.create_task(publisher.run(client), name="the publisher")
            failovers = await kill_leaders(cluster, CONFIRMED_KILLS, writer,
                                           progress=lambda: len(publisher.confirmed))
            publisher.stop = True
            await asyncio.wait_for(writer, 15)
            assert client.moves >= CONFIRMED_KILLS
        print(f"\nkill -> first confirmation by the new leader: {', '.join(f'{s:.2f}' for s in failovers)} s")
        # The killed leader's port refuses at once and the client leaves it on that first refusal: the
        # blocking client is confirmed by the new leader 0.03 s after the kill (docs/cluster.md, "What it
        # costs"). The median, so that one slow election on a loaded machine does not fail the test.
        assert statistics.median(failovers) < FAST_FAILOVER, \
            f"the client took {statistics.median(failovers):.2f} s (median) to publish at the new leader"

    asyncio.run(main())
    only_those_in_flight_failed(publisher, CONFIRMED_KILLS)
    every_confirmed_once(stored(cluster, publisher.topic), publisher)


@pytest.mark.timeout(120)
def test_a_frozen_leader_is_left_for_the_new_one_before_it_runs_again(cluster_factory) -> None:  # noqa: F811
    """The leader is frozen (SIGSTOP: its connections stay open, nothing tells the clients it is gone) for
    longer than the clients' heartbeat TTL to a cluster's members (3 s) while a publisher publishes confirmed
    messages and a subscriber reads them: both leave it on their own for the new leader, which confirms a
    publish before the old one runs again; the publish in flight at the freeze is the only one that fails
    (saying it may or may not have been stored). Then the old leader runs again and follows, and the checks
    of the kills above hold: every confirmed message stored once under its id, every stored message received
    once, in order."""
    cluster: Cluster = cluster_factory()
    publisher, subscriber = Publisher("durable.async.frozen"), Subscriber("durable.async.frozen")

    async def main() -> None:
        options = {**cluster.client_options(), "timeout": 10}
        async with AsyncClient(cluster.endpoints, **options) as reading, \
                AsyncClient(cluster.endpoints, **options) as writing:
            reader = asyncio.create_task(subscriber.run(reading), name="the subscriber")
            writer = asyncio.create_task(publisher.run(writing), name="the publisher")
            await until(lambda: len(publisher.confirmed) >= BETWEEN and subscriber.received,
                        "publishing and reading before the freeze", reader, writer)
            leader: Member = await off_loop(cluster.settled)
            frozen = time.monotonic()
            await off_loop(cluster.pause, leader)
            try:
                await asyncio.sleep(0.1)  # an OK already on its way is not the new leader's
                before = len(publisher.confirmed)
                await until(lambda: len(publisher.confirmed) > before, "confirmed by the new leader in time",
                            reader, writer, within=FROZEN_FOR - (time.monotonic() - frozen))
                moved = publisher.confirmed[before][2] - frozen
                await asyncio.sleep(max(0.0, FROZEN_FOR - (time.monotonic() - frozen)))
            finally:
                await off_loop(cluster.resume, leader)
            after = len(publisher.confirmed)
            await until(lambda: len(publisher.confirmed) >= after + BETWEEN, "confirmed after the thaw",
                        reader, writer)
            publisher.stop = True
            await asyncio.wait_for(writer, 15)
            log = await off_loop(stored, cluster, publisher.topic)
            await subscriber.read_up_to(log[-1][0], reader)
            assert reading.moves >= 1, "the subscriber stayed with the frozen leader"
            assert writing.endpoint != leader.endpoint
        print(f"\nconfirmed by the new leader {moved:.2f} s after the leader froze")
        only_those_in_flight_failed(publisher, 1)
        every_confirmed_once(log, publisher)
        assert subscriber.received == log, difference(subscriber.received, log)

    asyncio.run(main())


@pytest.mark.timeout(90)
def test_a_client_of_one_member_that_comes_back_a_follower_is_sent_to_the_leader(cluster_factory) -> None:  # noqa: F811
    """A client given one member only (the leader) while it publishes confirmed messages: that member is
    SIGKILLed and started again, now a follower. The client reconnects to it (it has nowhere else to go),
    and the follower names the leader both in its OK to the CONNECT and in the ERROR refusing the publish sent
    with it (nothing stored): the client moves to the leader, where that publish is sent again and confirmed.
    Only the publish in flight at the kill fails; every confirmed message is stored once under its id.
    ROUNDS times, a new client each time."""
    cluster: Cluster = cluster_factory()
    publisher = Publisher("durable.async.one")

    async def more(what: str, writer: asyncio.Task[None]) -> None:
        at = len(publisher.confirmed)
        await until(lambda: len(publisher.confirmed) >= at + BETWEEN, what, writer)

    async def main() -> None:
        for _ in range(ROUNDS):
            first: Member = await off_loop(cluster.settled)
            async with AsyncClient(first.endpoint, **cluster.client_options(), timeout=10) as client:
                publisher.stop = False
                writer = asyncio.create_task(publisher.run(client), name="the publisher")
                await more("confirmed before the kill", writer)
                await off_loop(cluster.kill, first)
                await off_loop(cluster.start, first)
                leader: Member = await off_loop(cluster.settled)
                assert leader is not first
                await more("confirmed at the leader", writer)
                publisher.stop = True
                await asyncio.wait_for(writer, 15)
                assert client.endpoint == leader.endpoint, "the client stayed on the follower"
                assert leader.endpoint in client.endpoints

    asyncio.run(main())
    only_those_in_flight_failed(publisher, ROUNDS)
    every_confirmed_once(stored(cluster, publisher.topic), publisher)
