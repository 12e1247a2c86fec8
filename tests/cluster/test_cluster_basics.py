"""A three-broker cluster: strong publishes confirmed on a majority, followers that name the leader, a
follower paused (SIGSTOP) while publishes go on, two of three gone (strong publishes refused, nothing
confirmed that is not on a majority), a restarted replica that catches up, one whose disk was replaced, and
a batch sent as columns. Real broker processes."""

from __future__ import annotations

import shutil
import time

import pytest
import zmq
from cluster_harness import Cluster, Member, careful_publish, cluster_factory, holds, until  # noqa: F401 - the fixture

from broker.store.files import FileStore
from broker.topics import Persistence, Sync, TopicSpec
from connector import Client, ConnectorError
from connector import keys as key_files
from protocol.bodies import TopicBodies


def _followers(cluster: Cluster, leader: object) -> list:
    return [member for member in cluster.members if member is not leader]


def _ask_by_hand(cluster: Cluster, endpoint: str, command: list[bytes]) -> list[bytes]:
    """One command from a raw DEALER with the client's CURVE key, and its answer."""
    socket = cluster.context.socket(zmq.DEALER)
    socket.linger = 0
    pair = key_files.client_pair(cluster.keys_dir)
    socket.curve_serverkey = key_files.broker_public(cluster.keys_dir)
    socket.curve_publickey, socket.curve_secretkey = pair.public, pair.secret
    socket.connect(endpoint)
    try:
        socket.send_multipart(command)
        assert socket.poll(5000), f"{endpoint} did not answer"
        return socket.recv_multipart()
    finally:
        socket.close(linger=0)


@pytest.mark.timeout(90)
def test_followers_name_the_leader_and_the_client_follows(cluster_factory) -> None:  # noqa: F811
    cluster: Cluster = cluster_factory(curve=True)  # inter-broker links and Raft under CURVE's keys
    leader = cluster.leader()
    follower = _followers(cluster, leader)[0]
    with Client(follower.endpoint, **cluster.client_options(), timeout=10) as client:
        assert client.endpoint == leader.endpoint  # the follower's OK to CONNECT named the leader
        reply = client.publish("durable.basics", "one", confirm=True)
        assert reply is not None
        assert reply["DURABILITY"] == "fsync"
    # A publish sent to the follower itself, by hand: ERROR with LEADER, one line saying what happened.
    frames = _ask_by_hand(cluster, follower.endpoint,
                          [b"", b"PUT", b"TOPIC", b"durable.basics", b"ID", b"p1", b"", b"two"])
    assert frames[1] == b"ERROR", frames
    headers = dict(zip(frames[2::2], frames[3::2], strict=False))
    assert headers[b"LEADER"] == leader.endpoint.encode()
    assert b"does not lead the cluster" in headers[b"MESSAGE"]
    assert headers[b"ID"] == b"p1"
    # An admitted client claiming to be a member, to the leader: refused (its FROM would count toward the
    # majority of a strong OK).
    epoch = str(cluster.cluster_view(leader)["epoch"]).encode()
    frames = _ask_by_hand(cluster, leader.endpoint,
                          [b"", b"FETCH", b"TOPIC", b"durable.basics", b"FROM", b"1000", b"REPLICA",
                           follower.raft.encode(), b"EPOCH", epoch, b"ID", b"r1"])
    assert frames[1] == b"ERROR", frames
    assert b"present the brokers' key" in dict(zip(frames[2::2], frames[3::2], strict=False))[b"MESSAGE"]
    view = cluster.cluster_view(follower)
    assert view["leader_endpoint"] == leader.endpoint
    assert not view["serving"]


@pytest.mark.timeout(120)
def test_a_paused_follower_does_not_stop_strong_publishes_and_catches_up(cluster_factory) -> None:  # noqa: F811
    cluster: Cluster = cluster_factory()
    leader = cluster.leader()
    paused, other = _followers(cluster, leader)
    with Client(cluster.endpoints, **cluster.client_options(), timeout=10) as client:
        client.publish("durable.pause", "before", confirm=True)
        cluster.pause(paused)
        started = time.monotonic()
        for n in range(50):
            reply = client.publish("durable.pause", f"m{n}", confirm=True, timeout=5)
            assert reply is not None
            assert reply["DURABILITY"] == "fsync"
        assert time.monotonic() - started < 20  # a majority (leader and one follower) confirms them
        cluster.resume(paused)
        last = int(reply["MESSAGE-ID"])
    deadline = time.monotonic() + 20
    while True:  # the paused follower acknowledges everything once it runs again
        replicas = cluster.cluster_view(leader)["replicas"].get("durable.pause", {})
        if replicas.get(paused.raft, 0) > last:
            break
        assert time.monotonic() < deadline, f"the resumed follower did not catch up: {replicas}"
        time.sleep(0.2)
    assert replicas.get(other.raft, 0) > last


@pytest.mark.timeout(120)
def test_a_follower_back_from_a_long_pause_does_not_unseat_the_leader(cluster_factory) -> None:  # noqa: F811
    """Pre-vote (broker.cluster.prevote): paused past the election timeout (0.5-1 s here) and past the
    leader's connection timeout, the follower comes back with its election deadline gone; it must ask before
    it stands, and the others, who still hear the leader, refuse. Without pre-vote each of these pauses made
    an election (a new epoch), measured."""
    cluster: Cluster = cluster_factory()
    leader = cluster.leader()
    epoch = cluster.cluster_view(leader)["epoch"]
    paused, _ = _followers(cluster, leader)
    with Client(cluster.endpoints, **cluster.client_options(), timeout=10) as client:
        for pause in (2.0, 3.0):
            cluster.pause(paused)
            for n in range(10):
                client.publish("durable.prevote", f"p{n}", confirm=True, timeout=5)
            time.sleep(pause)
            cluster.resume(paused)
            last = int(client.publish("durable.prevote", "after", confirm=True, timeout=5)["MESSAGE-ID"])
            deadline = time.monotonic() + 20
            while cluster.cluster_view(leader)["replicas"]["durable.prevote"].get(paused.raft, 0) <= last:
                assert time.monotonic() < deadline, "the resumed follower did not catch up"
                time.sleep(0.1)
            time.sleep(2.0)  # twice the longest election timeout: an election it started would be over
            views = [cluster.cluster_view(member) for member in cluster.members]
            assert [view["leader"] for view in views] == [leader.raft] * 3, views
            assert [view["epoch"] for view in views] == [epoch] * 3, f"an election after a {pause} s pause"


@pytest.mark.timeout(120)
def test_two_of_three_gone_refuses_strong_publishes(cluster_factory) -> None:  # noqa: F811
    cluster: Cluster = cluster_factory()
    leader = cluster.leader()
    with Client(leader.endpoint, **cluster.client_options(), timeout=10) as client:
        client.publish("durable.minority", "on a majority", confirm=True)
        for member in _followers(cluster, leader):
            cluster.pause(member)
        with pytest.raises(ConnectorError) as refused:
            client.publish("durable.minority", "alone", confirm=True, timeout=15)
    text = str(refused.value)
    assert "majority of the cluster" in text, text
    assert "of 3 brokers reachable" in text, text
    assert "\n" not in text
    # The refused message was not confirmed; once the others are back, the cluster serves again.
    for member in _followers(cluster, leader):
        cluster.resume(member)
    with Client(cluster.endpoints, **cluster.client_options(), timeout=20) as client:
        careful_publish(client, "durable.minority", "back")
        messages = client.fetch("durable.minority", 1).messages
    bodies = [message.body for message in messages]
    assert bodies[0] == b"on a majority"
    assert bodies[-1] == b"back"
    assert len(bodies) == len(set(bodies))


@pytest.mark.timeout(120)
def test_a_restarted_replica_catches_up(cluster_factory) -> None:  # noqa: F811
    cluster: Cluster = cluster_factory()
    leader = cluster.leader()
    victim = _followers(cluster, leader)[0]
    with Client(cluster.endpoints, **cluster.client_options(), timeout=10) as client:
        client.publish("durable.restart", "first", confirm=True)
        cluster.kill(victim)
        futures = [client.publish_async("durable.restart", f"m{n}") for n in range(500)]
        last = max(int(future.result(20)["MESSAGE-ID"]) for future in futures)
        cluster.start(victim)
    until(lambda: holds(cluster, victim, "durable.restart", last), "the replica catches up")


@pytest.mark.timeout(150)
def test_a_member_whose_disk_was_replaced_copies_everything_and_carries_the_majority(
        cluster_factory) -> None:  # noqa: F811
    """A follower comes back with an empty data directory (its disk replaced): it copies every message, then
    its copies are what the majority stands on (the other follower down) and what survives the leader's
    death: every confirmed message once, in order."""
    cluster: Cluster = cluster_factory()
    leader = cluster.leader()
    replaced, other = _followers(cluster, leader)
    topic = "durable.replaced"
    sent: list[str] = []
    with Client(cluster.endpoints, **cluster.client_options(), timeout=10) as client:
        def publish(count: int) -> int:
            bodies = [f"m{len(sent) + n}" for n in range(count)]
            sent.extend(bodies)
            futures = [client.publish_async(topic, body) for body in bodies]
            return max(int(future.result(20)["MESSAGE-ID"]) for future in futures)

        publish(200)
        cluster.kill(replaced)
        shutil.rmtree(replaced.data_dir)
        replaced.data_dir.mkdir()
        last = publish(100)
        cluster.start(replaced)
        until(lambda: holds(cluster, replaced, topic, last), "the replica catches up")
        cluster.kill(other)  # from here the leader's majority is the replaced member
        publish(50)
        cluster.start(other)
        cluster.kill(leader)
        sent.append("after the leader")
        careful_publish(client, topic, sent[-1])
        messages = client.fetch(topic, 1, max_messages=1000).messages
    assert [message.body.decode() for message in messages] == sent
    assert [message.id for message in messages] == list(range(1, len(sent) + 1))
    # Said once per start without Raft state: the first start of each, and the replaced one's second.
    assert replaced.log().count("no Raft state in") == 2
    assert other.log().count("no Raft state in") == 1


KEPT = ('retention_interval = 0.2\n[[topics]]\npattern = "kept.*"\npersistence = "persistent"\n'
        'sync = "strong"\nsegment_bytes = 1024\nretention_bytes = 4096\n')


@pytest.mark.timeout(120)
def test_a_replica_back_after_the_leaders_retention_moved_past_it_copies_on(cluster_factory) -> None:  # noqa: F811
    """While a follower was down the leader's retention deleted messages it never copied: it drops what it
    held (all older than the leader's oldest message) and copies on from the leader's first id."""
    cluster: Cluster = cluster_factory(settings=KEPT)
    leader = cluster.leader()
    victim = _followers(cluster, leader)[0]
    with Client(cluster.endpoints, **cluster.client_options(), timeout=10) as client:
        for n in range(5):
            client.publish("kept.r", f"early {n}", confirm=True)
        cluster.kill(victim)
        futures = [client.publish_async("kept.r", f"later {n:04d} " + "." * 100) for n in range(300)]
        last = max(int(future.result(20)["MESSAGE-ID"]) for future in futures)
        deadline = time.monotonic() + 20
        while (first := client.fetch("kept.r", max_messages=1).first_id) <= 6:
            assert time.monotonic() < deadline, "the leader's retention deleted nothing"
            time.sleep(0.2)
        cluster.start(victim)
        until(lambda: holds(cluster, victim, "kept.r", last), "the replica catches up")
        kept = client.fetch("kept.r", first, max_messages=1000)
    assert "older messages here dropped, copying on from there" in victim.log()
    cluster.kill(victim)
    copy = FileStore(victim.data_dir).open(b"kept.r", TopicSpec(persistence=Persistence.PERSISTENT,
                                                                 sync=Sync.STRONG, segment_bytes=1024))
    held = [(message.id, message.body) for message in copy.read(1, 1000, 1 << 24)]
    leaders = [(message.id, message.body) for message in kept.messages]
    assert held
    assert held == leaders[len(leaders) - len(held):]  # its own retention may have cut more since
    assert held[-1][0] == last
    assert not any(body.startswith(b"early") for _, body in held)


@pytest.mark.timeout(90)
def test_a_batch_as_columns_is_confirmed_on_a_majority_copied_everywhere_and_stored_once(
    cluster_factory,  # noqa: F811
) -> None:
    """A batch of one topic's bodies in two frames (PUTS TOPIC), idempotent: the leader stores it in bulk
    behind its gate, the OK waits for a majority's fsync, both followers copy it, and sent again it is
    skipped whole."""
    cluster: Cluster = cluster_factory()
    leader = cluster.leader()
    bodies = [b"c%d" % n for n in range(1000)]
    batch = TopicBodies.of(b"durable.columns", bodies)
    with Client(_followers(cluster, leader)[0].endpoint, **cluster.client_options(), timeout=10) as client:
        first = client.publish_batch(batch, producer="loader", sequence=0)
        again = client.publish_batch(batch, producer="loader", sequence=0)
        stored = client.fetch("durable.columns", 1, max_messages=2000).messages
    assert (first["COUNT"], first["DUPLICATES"], first["DURABILITY"]) == ("1000", "0", "fsync")
    assert (again["COUNT"], again["DUPLICATES"]) == ("0", "1000")
    assert [m.body for m in stored] == bodies
    deadline = time.monotonic() + 30
    while True:
        replicas = cluster.cluster_view(cluster.leader())["replicas"].get("durable.columns", {})
        if len(replicas) == 2 and all(position > 1000 for position in replicas.values()):
            break
        assert time.monotonic() < deadline, f"the followers did not copy the batch: {replicas}"
        time.sleep(0.2)
