"""What a cluster member decides on its own, without Raft or sockets.

``Cluster.refusal``, its answer to a command only a leader serves: a follower names the leader; without one
to name, RETRY-AFTER while a majority is in reach (a leader is being chosen) and nothing with a minority (the
refusal is final); a leader handing the cluster over asks the client back sooner, since a hand-over takes tens
of milliseconds. ``Cluster.retention_floor``: a leader's retention keeps what is not yet on a majority, a
follower's has no bound (even where the gate it kept from leading stands), and only a leader's STATS show
high watermarks."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import msgpack
import zmq.asyncio
from memory_log import MemoryStore

from bench.throughput import free_ports
from broker.cluster.node import ASK_AT_ONCE, HAND_OVER_RETRY_MS, RETRY_MS, STARTING_FOR, Cluster
from broker.cluster.raft import Role, _ReplicatedState
from broker.cluster.state import ClusterState
from broker.config import BrokerConfig
from broker.engine import CREATES_PER_TURN, Engine, Topic
from broker.store import LogIdentity
from broker.store.files import FileStore, spec_to_json
from broker.topics import Delivery, Persistence, TopicSpec
from protocol import mc0

PEERS = ("127.0.0.1:7002", "127.0.0.1:7003")


def member(folder: Path | None = None) -> Cluster:
    """A member, Raft not started: its logs in memory, or in ``folder`` (a follower's copy needs a store on
    disk)."""
    on_disk: dict[str, Any] = {"data_dir": folder} if folder is not None else {}
    config = BrokerConfig(bind="tcp://127.0.0.1:7101", curve=False, cluster_node="127.0.0.1:7001",
                          cluster_peers=PEERS, **on_disk)
    store = FileStore(folder) if folder is not None else MemoryStore()
    return Cluster(config, Engine(config.topic_rules(), store), store, lambda: None, lambda: None,  # type: ignore[arg-type]
                   lambda error: None, zmq.asyncio.Context.instance(), "tcp://127.0.0.1:7101")


def joined_state() -> ClusterState:
    """The cluster's state once the two other members have joined, at mc0 endpoints on free loopback ports
    (a member that follows one connects there: nothing must answer)."""
    state = ClusterState()
    for peer, port in zip(PEERS, free_ports(2), strict=True):
        state.apply(("join", peer, f"tcp://127.0.0.1:{port}"))
    return state


def refused(cluster: Cluster) -> mc0.Error:
    answer = cluster.refusal(mc0.Put(b"t", b"body", id=b"7"), redirected=False)
    assert isinstance(answer, mc0.Error)
    return answer


def test_the_answer_to_a_publish_says_where_to_go_or_when_to_ask_again() -> None:
    cluster = member()
    cluster.state.endpoints = {"127.0.0.1:7002": "tcp://127.0.0.1:7102"}
    cluster.state.leader = "127.0.0.1:7002"
    answer = refused(cluster)  # a follower that knows the leader: go there
    assert answer.headers[mc0.LEADER] == b"tcp://127.0.0.1:7102"
    assert mc0.RETRY_AFTER not in answer.headers

    cluster.state.leader = None
    cluster.role = Role(False, None, 2, 3)  # an election with a majority in reach: ask again soon
    answer = refused(cluster)
    assert mc0.LEADER not in answer.headers
    assert answer.headers[mc0.RETRY_AFTER] == b"%d" % RETRY_MS

    cluster.role = Role(False, None, 1, 3)  # a minority: final ...
    cluster.started -= STARTING_FOR
    assert mc0.RETRY_AFTER not in refused(cluster).headers
    cluster.started = time.monotonic()  # ... unless it has only just started: its Raft is still connecting
    answer = refused(cluster)
    assert answer.headers[mc0.RETRY_AFTER] == b"%d" % RETRY_MS
    assert b"started a moment ago" in answer.message


def test_a_member_that_lost_its_majority_a_moment_ago_asks_clients_back() -> None:
    """Paused, it finds its Raft connections gone when it runs again (the others gave up on them): for
    STARTING_FOR its refusal asks clients to come back (a client that knows other members tries them), as
    at a start; a member still without a majority after that is a minority, and its refusal is final."""
    cluster = member()
    cluster.started -= STARTING_FOR
    cluster.on_role(Role(False, None, 3, 3))
    cluster.on_role(Role(False, None, 1, 3))
    answer = refused(cluster)
    assert answer.headers[mc0.RETRY_AFTER] == b"%d" % RETRY_MS
    assert b"lost the other members a moment ago" in answer.message
    assert cluster.majority_lost_at is not None
    cluster.majority_lost_at -= STARTING_FOR
    answer = refused(cluster)
    assert mc0.RETRY_AFTER not in answer.headers
    assert b"no leader is known (1 of 3 brokers reachable)" in answer.message


def test_a_leader_handing_the_cluster_over_asks_clients_back_sooner() -> None:
    cluster = member()
    cluster.state.leader = cluster.node
    cluster.role = Role(True, cluster.node, 3, 3)
    cluster.serving = True
    assert cluster.refusal(mc0.Put(b"t", b"body", id=b"7"), redirected=False) is None  # it serves
    cluster.handing_over = True
    answer = refused(cluster)
    assert b"hands the cluster over" in answer.message
    assert answer.headers[mc0.RETRY_AFTER] == b"%d" % HAND_OVER_RETRY_MS
    assert HAND_OVER_RETRY_MS < RETRY_MS


def test_only_a_leader_bounds_its_retention_and_shows_watermarks() -> None:
    cluster = member()
    topic = cluster.engine.topic(b"t")
    cluster.engine.gate(topic, 7)
    assert cluster.engine.retention_floor is not None
    cluster.serving = True
    assert cluster.engine.retention_floor(topic) == 7
    assert cluster.stats()["high_watermarks"] == {"t": 7}
    cluster.serving = False  # stepped down: the gate stays, the copy's retention is its own
    assert cluster.engine.retention_floor(topic) is None
    assert cluster.stats()["high_watermarks"] == {}  # and its STATS show no watermark of its old epoch


def test_a_hand_over_goes_to_a_follower_whose_raft_answers() -> None:
    """A broker restarted a moment ago fetches at once but has not heard from the leader's Raft yet: Raft's
    TimeoutNow is lost on it. With acknowledgements equal, the node name used to decide, and a restarted
    ``127.0.0.1:7003`` won over ``127.0.0.1:7002``."""
    cluster = member()
    now = time.monotonic()
    cluster.state.topics[b"t".hex()] = spec_to_json(TopicSpec(persistence=Persistence.PERSISTENT))
    cluster.heard = {"127.0.0.1:7002": now, "127.0.0.1:7003": now}
    cluster.positions = {b"t": {"127.0.0.1:7002": 10, "127.0.0.1:7003": 10}}
    cluster.role = Role(True, cluster.node, 3, 3, frozenset({"127.0.0.1:7002", "127.0.0.1:7003"}))
    assert cluster._successor() == "127.0.0.1:7003"  # both answer: the name breaks the tie
    cluster.role = Role(True, cluster.node, 3, 3, frozenset({"127.0.0.1:7002"}))
    assert cluster._successor() == "127.0.0.1:7002"
    cluster.positions = {b"t": {"127.0.0.1:7002": 9, "127.0.0.1:7003": 10}}
    assert cluster._successor() == "127.0.0.1:7002"  # even one behind: it catches up before Raft hands over
    cluster.role = Role(True, cluster.node, 3, 3)
    assert cluster._successor() == "127.0.0.1:7003"  # none answers: the most acknowledged, as before


def test_with_no_persistent_topic_a_hand_over_goes_to_a_member_whose_raft_answers() -> None:
    """Followers fetch only to copy persistent topics: with none, nobody fetched, and a stopping leader hands
    over to a member its Raft hears rather than to nobody."""
    cluster = member()
    cluster.role = Role(True, cluster.node, 3, 3, frozenset({"127.0.0.1:7002"}))
    assert cluster._successor() == "127.0.0.1:7002"
    cluster.role = Role(True, cluster.node, 3, 3)
    assert cluster._successor() is None


class Submits:
    """A RaftNode stand-in that records the commands submitted."""

    def __init__(self) -> None:
        self.commands: list[tuple[Any, ...]] = []

    def submit(self, command: tuple[Any, ...], done: Any = None) -> None:
        self.commands.append(command)


def test_a_leader_handing_over_reports_no_positions() -> None:
    """Each Raft entry appended after TimeoutNow left can make the target's election fail."""
    cluster = member()
    raft = cluster.raft = Submits()  # type: ignore[assignment]
    cluster.state.endpoints = {cluster.node: cluster.endpoint}
    cluster.engine.declare(b"t", TopicSpec(persistence=Persistence.PERSISTENT))
    cluster.engine.publish(b"t", b"m", {}, 0)
    cluster.engine.commit()
    cluster.handing_over = True
    cluster._report()
    assert raft.commands == []
    cluster.handing_over = False
    cluster._report()
    assert raft.commands == [("positions", cluster.node, {b"t".hex(): 2})]


class CatchingUp:
    """Stands in for RaftNode: applying the leader's log until ``until`` (the loop's clock)."""

    def __init__(self, until: float) -> None:
        self.until = until

    def catching_up(self) -> bool:
        return asyncio.get_running_loop().time() < self.until

    def close(self) -> None:
        pass


def test_a_follower_whose_raft_is_catching_up_follows_the_leader_its_end_names(tmp_path: Path) -> None:
    """The leader sends its log a batch at a time, so a restarted broker's take-overs come in several bursts;
    while its Raft has entries to apply that the leader said are committed, it follows nobody yet, and once
    it has applied them it follows the leader the state names then (looked at again by itself: the last
    entries may be Raft's own, which reach no on_state)."""

    async def run() -> tuple[Cluster, list[int]]:
        cluster = member(tmp_path)
        loop = asyncio.get_running_loop()
        cluster.raft = CatchingUp(loop.time() + 0.1)  # type: ignore[assignment]
        state = joined_state()
        epochs = []
        for epoch in range(1, 4):  # one burst at a time, each seen by the loop before the next
            command = ("take_over", PEERS[epoch % 2], epoch, {})
            state.apply(command)
            cluster.on_state(command, state.copy())
            await asyncio.sleep(0.02)
            epochs.append(cluster.replicator.epoch if cluster.replicator is not None else 0)
        await asyncio.sleep(0.2)
        epochs.append(cluster.replicator.epoch if cluster.replicator is not None else 0)
        return cluster, epochs

    cluster, epochs = asyncio.run(run())
    try:
        assert epochs == [0, 0, 0, 3]
    finally:
        cluster.close()
        cluster.engine.close()


def test_a_replayed_journal_is_followed_once_at_its_end(caplog: Any, tmp_path: Path) -> None:
    """A restarted broker's Raft applies its whole journal at once: every take-over the cluster ever had
    reaches the loop in one burst. The member follows the leader the last one names, once, instead of
    starting a copy from each leader in turn (each fetching from a broker that no longer serves its epoch)."""
    state = joined_state()

    async def replay() -> Cluster:
        cluster = member(tmp_path)
        state.apply(("topic", b"t".hex(), spec_to_json(TopicSpec(persistence=Persistence.PERSISTENT))))
        loop = asyncio.get_running_loop()
        for epoch in range(1, 9):  # posted from Raft's thread, as RaftNode does, faster than the loop runs
            command = ("take_over", PEERS[epoch % 2], epoch, {})
            state.apply(command)
            loop.call_soon(cluster.on_state, command, state.copy())
        await asyncio.sleep(0.05)
        return cluster

    with caplog.at_level(logging.INFO, logger="mc0.cluster"):
        cluster = asyncio.run(replay())
    try:
        following = [record.getMessage() for record in caplog.records if "following" in record.getMessage()]
        assert following == [f"following 127.0.0.1:7002 ({state.endpoints['127.0.0.1:7002']}), epoch 8"]
        assert cluster.replicator is not None
        assert cluster.replicator.epoch == 8
        assert cluster.replicator.topics == {b"t"}
    finally:
        cluster.close()
        cluster.engine.close()


def test_a_deleted_topic_is_forgotten_through_raft_with_its_acknowledgements() -> None:
    """A topic made again under the same name must start with no follower acknowledging anything of it: a
    position left from the deleted log would let a strong OK go before a majority holds the message."""
    cluster = member()
    raft = cluster.raft = Submits()  # type: ignore[assignment]
    cluster.serving = True
    cluster.state.topics[b"t".hex()] = spec_to_json(TopicSpec(persistence=Persistence.PERSISTENT))
    cluster.positions = {b"t": {"127.0.0.1:7002": 10}, b"u": {"127.0.0.1:7002": 4}}
    incarnation = "ab" * 16
    assert cluster.deleted(b"t", incarnation.encode(), lambda why: None)
    assert raft.commands == [("forget_topic", b"t".hex(), incarnation)]
    assert cluster.positions == {b"u": {"127.0.0.1:7002": 4}}
    assert not cluster.deleted(b"v", None, lambda why: None)  # never replicated: nothing to record
    assert len(raft.commands) == 1


def _queue(engine: Engine, jobs: int) -> Topic:
    """A persistent round-robin topic ``q`` holding ``jobs`` messages, none acked."""
    topic = engine.declare(b"q", TopicSpec(delivery=Delivery.ROUND_ROBIN, persistence=Persistence.PERSISTENT))
    for n in range(jobs):
        engine.publish(b"q", b"job%d" % n, {}, 0)
    engine.commit()
    return topic


def test_a_queue_takes_the_leaders_position_only_in_the_log_it_was_reported_for(tmp_path: Path) -> None:
    """A follower takes each reported position of a queue (what the leader's consumers acked); replayed at a
    restart, a position of a deleted log must leave a queue made again since under the name alone."""
    cluster = member(tmp_path)
    engine = cluster.engine
    topic = _queue(engine, 10)
    assert topic.log is not None
    mine = topic.log.identity.incarnation
    try:
        cluster.on_state(("acked", {b"q".hex(): ("ab" * 16, 8)}), cluster.state)  # another log's
        assert topic.log.acked_watermark == 0
        cluster.on_state(("acked", {b"q".hex(): (mine, 6)}), cluster.state)
        assert topic.log.acked_watermark == 6
        assert topic.next_dispatch == 7
        assert topic.waiting() == 4
        cluster.on_state(("acked", {b"q".hex(): (mine, 60)}), cluster.state)  # past what it holds
        assert topic.log.acked_watermark == 10
    finally:
        cluster.close()
        engine.close()


def test_a_loaded_dump_gives_a_follower_every_queue_position(tmp_path: Path) -> None:
    """The leader reports a queue's position only when it changes: a member that comes back after Raft
    compacted the reports it missed finds an idle queue's position in the dump alone."""
    cluster = member(tmp_path)
    engine = cluster.engine
    topic = _queue(engine, 5)
    assert topic.log is not None
    try:
        state = ClusterState(acked={b"q".hex(): (topic.log.identity.incarnation, 3)})
        cluster.on_state(("snapshot",), state)
        assert topic.log.acked_watermark == 3
    finally:
        cluster.close()
        engine.close()


def test_the_loop_keeps_its_own_copy_of_the_state_from_the_commands_alone(tmp_path: Path) -> None:
    """Raft's thread passes each applied command, not a copy of the whole state (which cost each command time
    in proportion to the topics, under the GIL): the member applies it to its own state, which stays what
    Raft's thread holds. A dump loaded comes whole."""
    cluster = member(tmp_path)
    posted: list[ClusterState | None] = []

    def applied(command: tuple[Any, ...], snapshot: ClusterState | None) -> None:
        posted.append(snapshot)
        cluster.on_state(command, snapshot)

    raft_side = _ReplicatedState(applied)
    spec = spec_to_json(TopicSpec(persistence=Persistence.PERSISTENT))
    commands: list[tuple[Any, ...]] = [
        ("join", PEERS[0], "tcp://127.0.0.1:1"), ("join", PEERS[1], "tcp://127.0.0.1:2"),
        ("topic", b"a".hex(), spec), ("topic", b"b".hex(), spec),
        ("positions", PEERS[0], {b"a".hex(): 4}), ("acked", {b"a".hex(): ("ab" * 16, 3)}),
        ("take_over", "127.0.0.1:7001", 1, {b"a".hex(): ("cd" * 16, ())}),
        ("take_over", PEERS[0], 1, {}),  # stale: changes nothing on either side
        ("forget_topic", b"b".hex(), "ef" * 16),
    ]
    try:
        for command in commands:
            raft_side.command(command, _doApply=True)
        assert posted == [None] * len(commands)
        assert cluster.state == raft_side.state
        assert cluster.state is not raft_side.state
        assert (cluster.state.epoch, set(cluster.state.topics)) == (1, {b"a".hex()})
        loaded = ClusterState(epoch=7)
        cluster.on_state(("snapshot",), loaded)
        assert cluster.state is loaded
    finally:
        cluster.close()
        cluster.engine.close()


def test_a_follower_makes_its_copies_of_many_new_topics_a_few_at_a_time(tmp_path: Path) -> None:
    """Each new copy costs fsyncs: a follower told of hundreds of topics at once (the leader made them in a
    burst) makes CREATES_PER_TURN at a time at most (their directories built ahead in the store's threads),
    the loop free in between, until it copies every one."""
    count = 2 * CREATES_PER_TURN + 3
    spec = spec_to_json(TopicSpec(persistence=Persistence.PERSISTENT))

    async def run() -> tuple[Cluster, list[int]]:
        cluster = member(tmp_path)
        engine = cluster.engine
        made: list[int] = []
        settle = cluster._settle

        def counted() -> None:
            before = engine.logs_created
            settle()
            made.append(engine.logs_created - before)

        cluster._settle = counted  # type: ignore[method-assign]
        state = joined_state()
        cluster.on_state(("snapshot",), state)
        for n in range(count):
            cluster.on_state(("topic", (b"t%d" % n).hex(), spec))
        cluster.on_state(("take_over", PEERS[0], 1, {}))
        deadline = time.monotonic() + 10  # the copies' logs are made ahead in the store's threads
        while sum(made) < count:
            assert time.monotonic() < deadline, f"{sum(made)} of {count} copies made in 10 s"
            await asyncio.sleep(0.005)
        return cluster, made

    cluster, made = asyncio.run(run())
    try:
        assert sum(made) == count
        assert max(made) <= CREATES_PER_TURN
        assert cluster.replicator is not None
        assert cluster.replicator.topics == {b"t%d" % n for n in range(count)}
    finally:
        cluster.close()
        cluster.engine.close()


def test_a_follower_makes_its_copy_of_a_new_topic_with_the_leaders_identity(tmp_path: Path) -> None:
    """Raft's "topic" command carries the identity of the leader's log: a follower's new copy takes it at
    once, instead of a fresh one it would replace at the first answer (a meta file written twice). A
    command from an older leader, without it, still makes a copy (with a fresh identity). The leader names
    its log's identity when it registers a topic it made."""
    spec = spec_to_json(TopicSpec(persistence=Persistence.PERSISTENT))
    leaders = "ab" * 16

    async def run() -> Cluster:
        cluster = member(tmp_path)
        cluster.on_state(("snapshot",), joined_state())
        cluster.on_state(("topic", b"new".hex(), spec, leaders, (("cd" * 16, 5),)))
        cluster.on_state(("topic", b"old".hex(), spec))
        cluster.on_state(("take_over", PEERS[0], 1, {}))
        deadline = time.monotonic() + 10  # the copies' logs are made in the store's threads
        while not {b"new", b"old"} <= cluster.engine.topics.keys():
            assert time.monotonic() < deadline, "the copies were not made in 10 s"
            await asyncio.sleep(0.005)
        return cluster

    leader = member(tmp_path / "leader")
    raft = leader.raft = Submits()  # type: ignore[assignment]
    leader.serving = True
    try:
        made = leader.engine.declare(b"new", TopicSpec(persistence=Persistence.PERSISTENT))
        assert made.log is not None
        assert raft.commands == [("topic", b"new".hex(), spec, made.log.identity.incarnation, ())]
    finally:
        leader.raft = None
        leader.close()
        leader.engine.close()

    cluster = asyncio.run(run())
    try:
        copy, older = cluster.engine.topics[b"new"].log, cluster.engine.topics[b"old"].log
        assert copy is not None
        assert older is not None
        assert copy.identity == LogIdentity(leaders, (("cd" * 16, 5),))
        assert older.identity.incarnation not in (leaders, "cd" * 16)
        assert cluster._leader_identities == {}
    finally:
        cluster.close()
        cluster.engine.close()


class Answering:
    """A link whose member holds every topic up to id 5 of one log: it answers each request after a pause,
    and counts how many were in flight at once."""

    def __init__(self) -> None:
        self.in_flight = self.most = 0

    async def request(self, event: mc0.Fetch, timeout: float) -> mc0.Ok:  # noqa: ASYNC109
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        await asyncio.sleep(0.01)
        self.in_flight -= 1
        headers = {mc0.FIRST_ID: b"1", mc0.COUNT: b"0", mc0.NEXT_ID: b"5", mc0.INCARNATION: b"ab" * 16}
        return mc0.Ok(event.id, headers, msgpack.packb([]))


def test_a_new_leader_asks_about_every_topic_at_once() -> None:
    """One request at a time, a take-over took a round trip per topic and member (500 topics: a quarter of
    a second for each member asked); all in flight together, a few round trips for any number."""
    cluster = member()
    links = {peer: Answering() for peer in PEERS}
    names = {b"t%d" % n for n in range(300)}

    async def ask() -> dict[str, Any]:
        return await cluster._ask(links, names, 1)  # type: ignore[arg-type]

    ends = asyncio.run(ask())
    try:
        answered = [end for end in ends.values() if end is not None]
        assert answered, "no member's answer"
        assert {name: (end.next_id, end.incarnation) for name, end in answered[0].items()} == {
            name: (5, "ab" * 16) for name in names}
        assert max(link.most for link in links.values()) == ASK_AT_ONCE, "not asked all at once"
    finally:
        cluster.close()
        cluster.engine.close()


class Committing(Submits):
    """Raft as a leader elected again sees it: commands committed before its term (``earlier``) are applied
    only once an entry of its own term is committed, then in order, before that entry; each command's
    callback comes after the loop has applied it, as :class:`broker.cluster.raft.RaftNode` posts them."""

    def __init__(self, cluster: Cluster, earlier: list[tuple[Any, ...]]) -> None:
        super().__init__()
        self.cluster = cluster
        self.earlier = earlier

    def submit(self, command: tuple[Any, ...], done: Any = None) -> None:
        super().submit(command)
        loop = asyncio.get_running_loop()

        def commit() -> None:
            for entry in [*self.earlier, command]:
                state = self.cluster.state
                changed = entry[0] != "take_over" or entry[2] == state.epoch + 1
                loop.call_soon(self.cluster.on_state, entry)
                if entry is command and done is not None:
                    loop.call_soon(done, changed, None)
            self.earlier = []

        loop.call_later(0.01, commit)


class AnsweringLink(Answering):
    def close(self) -> None:
        pass


def test_a_leader_elected_again_compares_replicas_on_everything_committed_before_it(tmp_path: Path) -> None:
    """A broker that took epoch 2 and died before PySyncObj saved the commit index (once a second) comes back
    with a state of epoch 1, though its Raft log holds its take-over. Elected again, it must not compare
    the replicas before Raft applied that command: its own log, written in epoch 2, looked like one of an
    unknown epoch and lost to the old leader's shorter one, and it cut every message it had confirmed. Nor
    may it serve epoch 2 again when that old command is applied: a new take-over makes epoch 3."""
    topic = b"durable.t"
    old = "ab" * 16  # epoch 1's log identity: the other members hold it up to id 5
    mine = "cd" * 16  # epoch 2's, this member's

    async def run(cluster: Cluster) -> Committing:
        cluster.on_state(("snapshot",), joined_state())
        cluster.on_state(("take_over", PEERS[0], 1, {topic.hex(): (old, ())}))
        made = cluster.engine.declare(topic, TopicSpec(persistence=Persistence.PERSISTENT))
        for n in range(20):
            cluster.engine.publish(topic, b"%d" % n, {}, 0)
        cluster.engine.commit()
        assert made.log is not None
        cluster.store.set_identity(topic, LogIdentity(mine, ((old, 5),)))
        raft = Committing(cluster, [("take_over", cluster.node, 2, {topic.hex(): (mine, ((old, 5),))})])
        cluster.raft = raft  # type: ignore[assignment]
        cluster._link = lambda endpoint: AnsweringLink()  # type: ignore[assignment,method-assign]
        cluster.role = Role(True, cluster.node, 3, 3)
        assert await cluster._try_take_over()
        return raft

    cluster = member(tmp_path)
    try:
        raft = asyncio.run(run(cluster))
        assert cluster.engine.topics[topic].next_id == 21, "messages of epoch 2 cut"
        assert [command[2] for command in raft.commands if command[0] == "take_over"] == [3]
        assert cluster.serving
        assert cluster.state.epoch == 3
    finally:
        cluster.raft = None
        cluster.close()
        cluster.engine.close()
