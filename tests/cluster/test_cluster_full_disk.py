"""A member whose disk is full: three brokers in this process, so that one of them can be given a full disk
(its writes fail with ENOSPC). A leader's: the publish it cannot store is refused ("not stored", with
RETRY-AFTER), the leader hands the cluster to a follower, and the connector's retry is confirmed there. A
follower's that Raft elects: it cannot take the cluster over and hands Raft's leadership on. Every member's:
the leadership is not passed round. Nothing confirmed is lost, nothing is stored twice."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import pytest
import zmq
from cluster_harness import careful_publish, member_here, until
from conftest import BrokerFactory, failing_writes

from bench.cluster import stats_at
from bench.throughput import free_ports
from broker.server import Broker
from broker.store.files import directory_name
from connector import AsyncClient, Client, ConnectorError
from protocol import mc0

TOPIC = "durable.disk"
OTHER = "durable.other"


def _view(broker: Broker) -> dict:
    """The broker's own view of the cluster."""
    stats = stats_at(zmq.Context.instance(), broker.endpoint, timeout=5)
    assert stats is not None, f"{broker.endpoint} did not answer"
    return stats["limits"]["cluster"]


def _leader(brokers: list[Broker], within: float = 20.0, other_than: Broker | None = None,
            after_epoch: int = 0) -> Broker:
    """The broker every member names as leader, once it serves (an epoch past ``after_epoch``)."""
    deadline = time.monotonic() + within
    while True:
        views = [_view(broker) for broker in brokers]
        serving = [broker for broker, view in zip(brokers, views, strict=True) if view["serving"]]
        if len(serving) == 1 and serving[0] is not other_than and \
                all(view["leader_endpoint"] == serving[0].endpoint and view["epoch"] > after_epoch
                    for view in views):
            return serving[0]
        assert time.monotonic() < deadline, f"no leader every member names: {views}"
        time.sleep(0.1)


def _topic_folder(tmp_path: Path, brokers: list[Broker], broker: Broker, topic: str) -> str:
    """Where ``broker`` (one of :func:`_three`'s) keeps ``topic``'s files, as :func:`failing_writes` matches
    it (with its trailing slash)."""
    return f"{tmp_path / f'broker{brokers.index(broker)}'}/{directory_name(topic.encode())}/"


def _three(start_broker: BrokerFactory, folder: Path) -> list[Broker]:
    """Three brokers of one cluster, in this process, each with its data in ``folder / broker<i>``."""
    rafts = [f"127.0.0.1:{port}" for port in free_ports(3)]
    return [member_here(start_broker, folder / f"broker{index}", raft, tuple(other for other in rafts
                                                                             if other != raft))
            for index, raft in enumerate(rafts)]


@pytest.mark.timeout(120)
def test_a_leader_that_cannot_write_hands_the_cluster_to_a_follower(
        start_broker: BrokerFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="mc0.cluster")
    brokers = _three(start_broker, tmp_path)
    leader = _leader(brokers)
    endpoints = ",".join(broker.endpoint for broker in brokers)
    with Client(endpoints, curve=False, timeout=10) as client:
        client.publish(TOPIC, "before", confirm=True)
        with failing_writes(monkeypatch, f"{tmp_path / f'broker{brokers.index(leader)}'}/"):
            started = time.monotonic()
            # The leader cannot store it and refuses it with RETRY-AFTER: the connector sends it again, and
            # the follower the cluster was handed to confirms it.
            first = client.publish(TOPIC, "not stored by the first leader", confirm=True)
            moved = time.monotonic() - started
            assert first is not None
            reply = client.publish(TOPIC, "after", confirm=True)
            assert reply is not None
            successor = _leader(brokers, other_than=leader)
            assert not _view(leader)["serving"]
        assert (first["MESSAGE-ID"], reply["MESSAGE-ID"]) == ("2", "3")
        messages = client.fetch(TOPIC, 1).messages
    assert [message.body for message in messages] == [b"before", b"not stored by the first leader", b"after"]
    assert moved < 10, f"the publisher waited {moved:.1f} s"
    assert client.moves >= 1
    said = [record.getMessage() for record in caplog.records]
    assert any(f"this leader cannot store topic '{TOPIC}'" in line and "No space left on device" in line
               for line in said), said
    assert any(line.startswith(f"cannot write: handing the cluster over to {successor.config.cluster_node}")
               for line in said), said


@pytest.mark.timeout(120)
def test_pipelined_confirms_a_leader_cannot_store_are_confirmed_by_the_next_leader(
        start_broker: BrokerFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Confirms in flight together (one PUTS CONFIRM each) that the leader cannot store, none of them: the
    whole PUTS is refused with RETRY-AFTER, the connector sends it again, and the next leader confirms every
    one, in order, each stored once."""
    brokers = _three(start_broker, tmp_path)
    leader = _leader(brokers)
    endpoints = ",".join(broker.endpoint for broker in brokers)
    bodies = [f"pipelined {n}" for n in range(20)]
    with Client(endpoints, curve=False, timeout=10) as client:
        client.publish(TOPIC, "before", confirm=True)
        with failing_writes(monkeypatch, f"{tmp_path / f'broker{brokers.index(leader)}'}/"):
            handles = [client.publish_async(TOPIC, body) for body in bodies]
            ids = [handle.result(10)["MESSAGE-ID"] for handle in handles]
            _leader(brokers, other_than=leader)
        messages = client.fetch(TOPIC, 1).messages
    assert ids == [str(n) for n in range(2, 22)]
    assert [message.body.decode() for message in messages] == ["before", *bodies]


@pytest.mark.timeout(120)
def test_a_puts_confirm_each_partly_stored_by_a_leader_that_cannot_write_says_when_to_send_the_rest(
        start_broker: BrokerFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the wire: a PUTS CONFIRM each naming two topics, one of which the leader cannot store. The OK
    confirms the stored entries, refuses the others entry by entry, and carries RETRY-AFTER: those were not
    stored, and go to the next leader (an older client fails them, as before)."""
    brokers = _three(start_broker, tmp_path)
    leader = _leader(brokers)
    endpoints = ",".join(broker.endpoint for broker in brokers)
    with Client(endpoints, curve=False, timeout=10) as client:
        for topic in (TOPIC, OTHER):  # both made everywhere before the disk fills
            client.publish(topic, "before", confirm=True)
    dealer = zmq.Context.instance().socket(zmq.DEALER)
    dealer.linger = 0
    dealer.connect(leader.endpoint)
    try:
        dealer.send_multipart(mc0.encode(mc0.Connect(id=b"1", extensions=frozenset({mc0.EXT_CONFIRMS}))))
        assert dealer.poll(10_000), "no answer to CONNECT"
        assert isinstance(mc0.decode(dealer.recv_multipart()), mc0.Ok)
        with failing_writes(monkeypatch, _topic_folder(tmp_path, brokers, leader, OTHER)):
            items = [(TOPIC.encode(), b"a1", {}), (OTHER.encode(), b"b1", {}), (TOPIC.encode(), b"a2", {})]
            dealer.send_multipart(mc0.encode(mc0.Puts(items, b"2", confirm_each=True)))
            assert dealer.poll(10_000), "no answer to the PUTS"
            reply = mc0.decode(dealer.recv_multipart())
    finally:
        dealer.close()
    assert isinstance(reply, mc0.Ok), reply
    assert reply.headers.get(mc0.RETRY_AFTER) == b"25", reply.headers
    (a1, _), (b1, why), (a2, _) = mc0.decode_confirms(reply, 3)
    assert (a1, a2) == (2, 3)
    assert b1 is None
    assert why.startswith("not stored: "), why
    _leader(brokers, other_than=leader)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("asynchronous", [False, True])
def test_pipelined_confirms_to_two_topics_a_leader_stores_one_of_are_all_confirmed_once_in_order(
        start_broker: BrokerFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        asynchronous: bool) -> None:
    """Confirms in flight together to two topics, and the leader cannot store one of them: it confirms the
    other's, refuses these entry by entry with RETRY-AFTER, and hands the cluster over; the connector sends
    the refused ones again, to the next leader. Every publish is confirmed, each message stored once, in
    each topic's order. Both clients."""
    brokers = _three(start_broker, tmp_path)
    leader = _leader(brokers)
    endpoints = ",".join(broker.endpoint for broker in brokers)
    publishes = [(TOPIC if n % 2 else OTHER, f"pipelined {n}") for n in range(40)]
    full = _topic_folder(tmp_path, brokers, leader, OTHER)

    async def publish_asynchronously() -> list[str]:
        async with AsyncClient(endpoints, curve=False, timeout=10) as client:
            for topic in (TOPIC, OTHER):
                await client.publish(topic, "before", confirm=True)
            with failing_writes(monkeypatch, full):
                handles = [await client.publish_async(topic, body) for topic, body in publishes]
                return [(await handle)["MESSAGE-ID"] for handle in handles]

    if asynchronous:
        ids = asyncio.run(publish_asynchronously())
    else:
        with Client(endpoints, curve=False, timeout=10) as client:
            for topic in (TOPIC, OTHER):
                client.publish(topic, "before", confirm=True)
            with failing_writes(monkeypatch, full):
                handles = [client.publish_async(topic, body) for topic, body in publishes]
                ids = [handle.result(10)["MESSAGE-ID"] for handle in handles]
    _leader(brokers, other_than=leader)
    with Client(endpoints, curve=False, timeout=10) as client:
        for topic in (TOPIC, OTHER):
            bodies = [body for named, body in publishes if named == topic]
            stored = [message.body.decode() for message in client.fetch(topic, 1).messages]
            assert stored == ["before", *bodies]
            assert [int(i) for (named, _), i in zip(publishes, ids, strict=True) if named == topic] == \
                list(range(2, 2 + len(bodies))), f"{topic}: ids in publishing order, from 2"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("index", ["kept", "gone"])
def test_a_member_elected_that_cannot_write_gives_the_leadership_away(
        start_broker: BrokerFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture, index: str) -> None:
    """Raft elects a member whose disk is full (here: the leader hands it Raft's leadership): it cannot copy
    what it lacks, so it cannot take the cluster over. It hands Raft's
    leadership to another member at once, instead of staying Raft's leader without serving while nobody else
    can lead, and says so once. Also when its log cannot even be opened again after the failed write (here
    its index is gone, so opening the log rebuilds it, which the full disk refuses): each copy then fails as
    the log is opened, not when it is committed."""
    caplog.set_level(logging.INFO, logger="mc0.cluster")
    brokers = _three(start_broker, tmp_path)
    leader = _leader(brokers)
    epoch = _view(leader)["epoch"]
    unwritable = next(broker for broker in brokers if broker is not leader)
    folder = tmp_path / f"broker{brokers.index(unwritable)}"
    with Client(",".join(broker.endpoint for broker in brokers), curve=False, timeout=10) as client:
        client.publish(TOPIC, "before", confirm=True)
        until(lambda: (folder / TOPIC / "00000000000000000001.index").exists(), "the copy's index is made")
        if index == "gone":
            (folder / TOPIC / "00000000000000000001.index").unlink()
        with failing_writes(monkeypatch, f"{folder}/"):
            client.publish(TOPIC, "not copied there", confirm=True)  # the leader and the other follower
            cluster = leader.router.cluster
            assert cluster is not None
            assert leader.hub.loop is not None
            sent = asyncio.run_coroutine_threadsafe(cluster._transfer(unwritable.config.cluster_node),
                                                    leader.hub.loop).result(10)
            assert sent, "Raft did not hand its leadership over"
            successor = _leader(brokers, other_than=unwritable, after_epoch=epoch)
            careful_publish(client, TOPIC, "after", within=15.0)
            assert not _view(unwritable)["serving"]
        messages = client.fetch(TOPIC, 1).messages
    assert [message.body for message in messages] == [b"before", b"not copied there", b"after"]
    said = [record.getMessage() for record in caplog.records if "cannot take the cluster over" in
            record.getMessage() and record.levelno == logging.WARNING]
    assert len(said) == 1, said
    assert "No space left on device" in said[0]
    assert successor is not unwritable


@pytest.mark.timeout(120)
def test_with_every_disk_full_the_leadership_is_not_passed_round_and_comes_back_with_room(
        start_broker: BrokerFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """Every member's writes fail: the leader hands over once; the member elected takes over (it lacks
    nothing: its logs' new identities are recorded at their next write, which fails as any write does) or
    gives Raft's leadership away once, and a member elected again tries to take over again instead of
    passing it on (a few lines in the logs, not a line per election); with room again, the cluster serves
    and nothing is lost."""
    caplog.set_level(logging.INFO, logger="mc0.cluster")
    brokers = _three(start_broker, tmp_path)
    _leader(brokers)
    with Client(",".join(broker.endpoint for broker in brokers), curve=False, timeout=10) as client:
        client.publish(TOPIC, "before", confirm=True)
        with failing_writes(monkeypatch, f"{tmp_path}/"):
            with pytest.raises(ConnectorError, match="not stored"):
                client.publish(TOPIC, "refused", confirm=True)
            time.sleep(4)
        careful_publish(client, TOPIC, "after", within=15.0)
        messages = client.fetch(TOPIC, 1).messages
    assert [message.body for message in messages] == [b"before", b"after"]
    said = [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]
    handed = [line for line in said if "handing the cluster to a follower" in line]
    gave_way = [line for line in said if "cannot take the cluster over" in line]
    assert len(handed) == 1, handed
    assert len(gave_way) <= 2, gave_way  # at most once for each of the other two in 30 s
