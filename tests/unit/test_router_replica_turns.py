"""What a cluster leader's mc0 door does per replicated message, driven through a fake socket (no network):

- an OK held until a majority holds its message is sent by the turn that brings the acknowledgement (which
  ends there, before anything more is read), or as an ERROR when its deadline comes (one timer), not by the
  hub's backing-off retry meant for full pipes;
- a long-polling FETCH at the end of the log parks without an OK being built for it;
- a replica FETCH read in the same turn as the messages it asks for gets them before the leader's fsync;
- a replica's FETCH reply carries the log's LINEAGE only to a reader that did not name this log;
- only the cluster's other members may fetch as a replica (what a replica says moves the majority), and with
  CURVE only over a connection that presented the brokers' key;
- a client the door named the leader to (a refusal with LEADER) is told so for REDIRECTED_FOR, whoever leads
  meanwhile; another client is not;
- a member serves an epoch the replicated state gives it only while Raft says it leads (a restarted broker
  replaying its own old take-over does not serve);
- a client it sent to another leader and later finds gone is dropped with a DEBUG line, not INFO.
"""

from __future__ import annotations

import errno
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq
import zmq.asyncio

from broker import router as router_module
from broker.cluster.node import Cluster, _take_over_key
from broker.cluster.raft import Role
from broker.cluster.state import ClusterState
from broker.config import BrokerConfig
from broker.engine import Engine, EngineError
from broker.hub import Hub
from broker.router import RouterShell
from broker.store.files import FileStore
from broker.topics import Persistence, Sync, TopicRule, TopicRules, TopicSpec
from connector import keys as key_files
from connector.zsock import send_frames
from protocol import mc0

TOPIC = b"log.strong"
RULES = TopicRules([TopicRule("log.*", TopicSpec(persistence=Persistence.PERSISTENT, sync=Sync.STRONG))])


class Pipe:
    """Stands in for the ROUTER: records what went out."""

    def __init__(self) -> None:
        self.sent: list[list[bytes]] = []

    def transmit(self, identity: bytes, frames: list[bytes]) -> None:
        self.sent.append([identity, *frames])

    def verbs(self) -> list[bytes]:
        return [frames[2] for frames in self.sent]  # identity, delimiter, verb


class Timer:
    def __init__(self, loop: Loop, at: float, callback: Callable[[], Any]) -> None:
        self.loop = loop
        self.at = at
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True

    def fire(self) -> None:
        self.cancelled = True  # done: no longer armed
        self.callback()


class Loop:
    """Records the timers and soon-callbacks the shell and the hub ask for (time is the tests' own)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.timers: list[Timer] = []
        self.soon: list[Callable[[], Any]] = []

    def call_later(self, delay: float, callback: Callable[[], Any]) -> Timer:
        timer = Timer(self, self.now + delay, callback)
        self.timers.append(timer)
        return timer

    def call_soon(self, callback: Callable[[], Any]) -> None:
        self.soon.append(callback)

    def armed(self) -> list[Timer]:
        return [timer for timer in self.timers if not timer.cancelled]


class Gate:
    """A leader's decisions: a held OK is confirmed once ``majority`` is set, refused after its deadline."""

    commit_timeout = 5.0

    def __init__(self) -> None:
        self.majority = False
        self.following: bytes | None = None  # the leader's endpoint while this broker follows
        self.asked: list[bool] = []  # each refusal()'s ``redirected``

    def refusal(self, event: mc0.Event, redirected: bool) -> mc0.Error | None:
        self.asked.append(redirected)
        if self.following is not None or redirected:
            return mc0.leader_error("this broker does not lead the cluster", self.following or b"tcp://me:1",
                                    getattr(event, "id", None))
        return None

    def leader(self) -> bytes | None:
        return None

    def replica_fetch(self, event: mc0.Fetch, peer: object) -> bool:
        return self.majority  # an acknowledgement that brings the majority releases what it holds

    def replica_extra(self, topic: bytes, start: int, count: int, known: bytes | None) -> dict[bytes, bytes]:
        return {}

    def confirm(self, needs: dict[bytes, int], now: float, deadline: float) -> bool | str:
        if self.majority:
            return True
        return "not replicated to a majority" if now >= deadline else False


@pytest.fixture
def leader(tmp_path: Path) -> Iterator[tuple[RouterShell, Pipe, Loop, Gate]]:
    context = zmq.asyncio.Context()
    socket = context.socket(zmq.ROUTER)
    engine = Engine(RULES, FileStore(tmp_path / "data"))
    loop = Loop()
    hub = Hub(engine, monotonic=lambda: loop.now, wall_ms=lambda: 1_700_000_000_000)
    hub.loop = loop  # type: ignore[assignment] - the fake records what the real loop would run
    shell = RouterShell(hub, socket)
    hub.add(shell)
    gate = Gate()
    shell.cluster = gate
    pipe = Pipe()
    shell.transmit = pipe.transmit  # type: ignore[method-assign]
    yield shell, pipe, loop, gate
    engine.close()
    socket.close(linger=0)
    context.term()


def turn(shell: RouterShell, loop: Loop, *commands: list[bytes]) -> None:
    """One turn of the door at the loop's time: the commands, then the hub's flush."""
    for frames in commands:
        shell.handle(frames, loop.now, 1_700_000_000_000)
    shell.hub.flush(loop.now)


def put(identity: bytes, command_id: bytes) -> list[bytes]:
    return [identity, b"", b"PUT", b"TOPIC", TOPIC, b"ID", command_id, b"", b"body"]


def noop(identity: bytes, command_id: bytes) -> list[bytes]:
    return [identity, b"", b"NOOP", b"ID", command_id]


def test_a_held_ok_leaves_with_the_turn_that_brings_the_majority(
    leader: tuple[RouterShell, Pipe, Loop, Gate],
) -> None:
    shell, pipe, loop, gate = leader
    turn(shell, loop, put(b"publisher", b"1"))
    assert pipe.sent == []  # held: only the leader holds the message
    assert shell.hub.retry == 0, "a held OK waits for an acknowledgement, not for the retry timer"
    assert [timer.at for timer in loop.armed()] == [5.0], "one timer, at the held OK's deadline"
    loop.now = 0.5
    turn(shell, loop, noop(b"other", b"n"), put(b"publisher", b"2"))
    assert pipe.verbs() == [b"OK"]  # the other client is not held behind the publisher
    assert [timer.at for timer in loop.armed()] == [5.0], "the earlier deadline's timer stays armed"
    gate.majority = True
    loop.now = 0.6
    turn(shell, loop)  # the turn that took a follower's acknowledgement
    oks = [frames for frames in pipe.sent if frames[0] == b"publisher"]
    assert [frames[frames.index(b"ID") + 1] for frames in oks] == [b"1", b"2"]
    assert shell.stalled == set()


def test_the_acknowledgement_that_brings_the_majority_ends_the_turn_before_more_is_read(
    leader: tuple[RouterShell, Pipe, Loop, Gate],
) -> None:
    """Both followers' FETCHes are readable at once: the first one's majority sends the held OK with a flush
    right away; the second is read by the next turn, not before the OK leaves."""
    shell, pipe, loop, gate = leader
    turn(shell, loop, put(b"publisher", b"1"))
    assert pipe.sent == []
    endpoint = "inproc://router-turns"
    shell.raw.bind(endpoint)
    follower = zmq.Socket(shell.socket.context, zmq.DEALER)  # a plain socket: sent to without a loop
    try:
        follower.connect(endpoint)
        gate.majority = True
        for command_id in (b"f1", b"f2"):
            send_frames(follower, mc0.encode(mc0.Fetch(TOPIC, 2, 100, 1000, id=command_id, records=True,
                                                       replica=b"127.0.0.1:2", epoch=1)))
        deadline = time.monotonic() + 5
        while shell.raw.poll(0) == 0:
            assert time.monotonic() < deadline, "the FETCHes never arrived"
            time.sleep(0.01)
        time.sleep(0.05)  # both of them
        assert shell.receive(loop.now) == 1
        assert shell.receive_exhausted, "the flush's recheck comes back for the rest"
        shell.hub.flush(loop.now)
        assert [frames[2] for frames in pipe.sent if frames[0] == b"publisher"] == [b"OK"]
        assert shell.receive(loop.now) == 1  # the second FETCH, in the next turn
    finally:
        follower.close(linger=0)


def test_a_held_ok_becomes_an_error_when_its_deadline_timer_fires(
    leader: tuple[RouterShell, Pipe, Loop, Gate],
) -> None:
    shell, pipe, loop, _ = leader
    turn(shell, loop, put(b"publisher", b"1"))
    (timer,) = loop.armed()
    loop.now = timer.at
    timer.fire()  # the door's timer asks the hub for a flush
    assert loop.soon, "the timer schedules a flush"
    loop.soon.pop()()
    assert pipe.verbs() == [b"ERROR"]
    assert any(b"not replicated to a majority" in frame for frame in pipe.sent[0])
    assert loop.armed() == [], "nothing is held any more"


def test_a_fetch_at_the_end_of_the_log_parks_without_building_an_ok(
    leader: tuple[RouterShell, Pipe, Loop, Gate], monkeypatch: pytest.MonkeyPatch,
) -> None:
    shell, pipe, loop, gate = leader
    gate.majority = True
    built: list[bytes] = []
    records_ok = mc0.records_ok

    def counting(command_id: bytes, *args: Any) -> mc0.Ok:
        built.append(command_id)
        return records_ok(command_id, *args)

    monkeypatch.setattr(router_module.mc0, "records_ok", counting)
    fetch = [b"reader", b"", b"FETCH", b"TOPIC", TOPIC, b"FROM", b"1", b"WAIT", b"1000",
             b"FORMAT", b"records", b"ID", b"f"]
    turn(shell, loop, fetch)
    assert pipe.sent == []
    assert shell.waits.count == 1
    assert built == [], "a FETCH that parks needs no OK"
    loop.now = 0.1
    turn(shell, loop, put(b"publisher", b"1"))
    answers = {frames[0]: frames for frames in pipe.sent}
    assert built == [b"f"]
    assert answers[b"reader"][answers[b"reader"].index(b"COUNT") + 1] == b"1"
    assert shell.waits.count == 0


def test_a_replica_fetch_read_with_the_messages_it_asks_for_is_answered_before_the_fsync(
    leader: tuple[RouterShell, Pipe, Loop, Gate], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A follower's FETCH for the next id, read in the same turn as the publish that stores it (the follower
    that acknowledged last: its FETCH comes with the client's next publish), gets the message ahead of the
    leader's fsync, as a parked one does, not a whole commit later."""
    shell, pipe, loop, _ = leader
    engine = shell.hub.engine
    shell.hub.ahead.append(shell.answer_ahead)  # as a cluster member's server wires it
    engine.gate(engine.topic(TOPIC), 1)
    sent_at_commit: list[list[bytes]] = []
    commit = engine.commit

    def committing() -> bool:
        sent_at_commit.extend(pipe.sent)
        return commit()

    monkeypatch.setattr(engine, "commit", committing)
    fetch = mc0.encode(mc0.Fetch(TOPIC, 1, 100, 1 << 20, wait=30_000, id=b"f", records=True,
                                 replica=b"127.0.0.1:3", epoch=1))
    turn(shell, loop, put(b"publisher", b"1"), [b"follower", *fetch])
    (answer,) = sent_at_commit
    assert answer[0] == b"follower"
    assert answer[answer.index(b"COUNT") + 1] == b"1"
    assert [frames[0] for frames in pipe.sent] == [b"follower"], "sent once; the OK is held for the majority"
    assert shell.waits.count == 0


def member(engine: Engine, tmp_path: Path, keys_dir: Path | None = None) -> Cluster:
    """A cluster member's decisions (Raft not started): 127.0.0.1:2, with 127.0.0.1:3 and 127.0.0.1:4; CURVE
    on with ``keys_dir``."""
    config = BrokerConfig(bind="tcp://127.0.0.1:1", curve=keys_dir is not None, keys_dir=keys_dir or "keys",
                          data_dir=tmp_path / "data", cluster_node="127.0.0.1:2",
                          cluster_peers=("127.0.0.1:3", "127.0.0.1:4"))
    return Cluster(config, engine, engine.store, lambda: None, lambda: None,  # type: ignore[arg-type]
                   lambda _error: None, None, "tcp://127.0.0.1:1")  # type: ignore[arg-type]


class Peer:
    """Stands in for a command's identity frame: its metadata names the key the connection presented."""

    def __init__(self, key: bytes) -> None:
        self.key = key

    def get(self, name: str) -> str:
        assert name == "User-Id"
        return self.key.decode()


def test_only_the_other_members_fetch_as_replicas(tmp_path: Path) -> None:
    engine = Engine(RULES, FileStore(tmp_path / "data"))
    try:
        node = member(engine, tmp_path)
        for name in (b"127.0.0.1:9", b"127.0.0.1:2"):  # a stranger, and this member's own name
            with pytest.raises(EngineError, match="not another member of this cluster"):
                node.replica_fetch(mc0.Fetch(TOPIC, 1, replica=name, epoch=99), None)
        assert node.fence == 0, "a stranger's EPOCH fences nothing"
        node.replica_fetch(mc0.Fetch(TOPIC, 1, replica=b"127.0.0.1:3", epoch=1), None)
        assert node.fence == 1
    finally:
        engine.close()


def test_with_curve_a_replica_must_present_the_brokers_key(tmp_path: Path) -> None:
    keys_dir = tmp_path / "keys"
    key_files.generate(keys_dir)
    engine = Engine(RULES, FileStore(tmp_path / "data"))
    try:
        node = member(engine, tmp_path, keys_dir)
        fetch = mc0.Fetch(TOPIC, 1, replica=b"127.0.0.1:3", epoch=1)
        for peer in (Peer(key_files.client_pair(keys_dir).public), None):  # an admitted client; no metadata
            with pytest.raises(EngineError, match="present the brokers' key"):
                node.replica_fetch(fetch, peer)  # type: ignore[arg-type]
        assert node.fence == 0
        node.replica_fetch(fetch, Peer(key_files.broker_pair(keys_dir).public))  # type: ignore[arg-type]
        assert node.fence == 1
    finally:
        engine.close()


def test_a_replica_gets_the_lineage_only_when_it_did_not_name_this_log(tmp_path: Path) -> None:
    engine = Engine(RULES, FileStore(tmp_path / "data"))
    try:
        node = member(engine, tmp_path)
        topic = engine.topic(TOPIC)
        assert topic.log is not None
        mine = topic.log.identity.incarnation.encode()
        assert mc0.LINEAGE not in node.replica_extra(TOPIC, 1, 0, mine)
        for known in (None, b"another-log"):
            lineage = node.replica_extra(TOPIC, 1, 0, known)[mc0.LINEAGE]
            assert mc0.decode_lineage(lineage) == topic.log.identity.lineage
    finally:
        engine.close()


def test_a_client_named_the_leader_is_refused_for_a_while_even_once_this_broker_leads(
    leader: tuple[RouterShell, Pipe, Loop, Gate],
) -> None:
    shell, pipe, loop, gate = leader
    gate.majority = True
    gate.following = b"tcp://leader:1"
    turn(shell, loop, put(b"publisher", b"1"))
    assert pipe.verbs() == [b"ERROR"]
    gate.following = None  # this broker leads from now on
    loop.now = 1.0
    turn(shell, loop, put(b"publisher", b"2"), put(b"newcomer", b"3"))
    assert gate.asked == [False, True, False]
    assert [(frames[0], frames[2]) for frames in pipe.sent[1:]] == [(b"publisher", b"ERROR"),
                                                                    (b"newcomer", b"OK")]
    loop.now = 1.0 + router_module.REDIRECTED_FOR
    turn(shell, loop, put(b"publisher", b"4"))
    assert gate.asked[-1] is False
    assert (pipe.sent[-1][0], pipe.sent[-1][2]) == (b"publisher", b"OK")


def test_a_client_sent_to_the_leader_that_is_gone_later_is_no_news_at_info(
    leader: tuple[RouterShell, Pipe, Loop, Gate], caplog: pytest.LogCaptureFixture,
) -> None:
    """After a leader change the old leader still has a session for each client it sent away; when one of
    them is found gone, that is what was asked of it: a DEBUG line, where a client that vanished gets INFO."""
    shell, _, loop, gate = leader
    gate.majority = True
    turn(shell, loop, put(b"moved", b"1"))
    shell.send_away("this broker no longer leads the cluster", b"tcp://leader:1")
    turn(shell, loop, put(b"vanished", b"2"))  # a client that came later, never sent away

    def gone(identity: bytes, frames: list[bytes]) -> None:
        raise zmq.ZMQError(errno.EHOSTUNREACH)

    shell.transmit = gone  # type: ignore[method-assign]
    with caplog.at_level(logging.DEBUG, logger="mc0.router"):
        for identity in (b"vanished", b"moved"):
            assert not shell.send(shell.sessions.by_identity[identity], [b"", b"NOOP"], loop.now)
    levels = {record.getMessage(): record.levelno for record in caplog.records
              if "dropped" in record.getMessage()}
    assert levels == {f"client {b'vanished'.hex()} dropped: unreachable": logging.INFO,
                      f"client {b'moved'.hex()} dropped: unreachable": logging.DEBUG}


def test_a_take_over_of_its_own_serves_only_if_submitted_while_raft_says_it_leads(tmp_path: Path) -> None:
    engine = Engine(RULES, FileStore(tmp_path / "data"))
    try:
        cluster = member(engine, tmp_path)
        state = ClusterState()
        state.apply(("join", "127.0.0.1:2", "tcp://127.0.0.1:1"))
        assert state.apply(("take_over", "127.0.0.1:2", 1, {}))
        cluster.on_state(("take_over", "127.0.0.1:2", 1, {}), state.copy())  # replayed from the journal
        assert not cluster.serving
        cluster.role = Role(True, "127.0.0.1:2", 3, 3)  # Raft elected it (its take-over is not run here)
        # Its own take-over of an earlier leadership, applied once it leads again: it takes a new epoch
        # instead of serving that one again.
        assert state.apply(("take_over", "127.0.0.1:2", 2, {"ab": ("cd" * 16, ())}))
        cluster.on_state(("take_over", "127.0.0.1:2", 2, {"ab": ("cd" * 16, ())}), state.copy())
        assert not cluster.serving
        # The take-over it submitted now serves.
        taking = ("take_over", "127.0.0.1:2", 3, {"ab": ("ef" * 16, (("cd" * 16, 1),))})
        cluster._taking = _take_over_key(taking)
        assert state.apply(taking)
        cluster.on_state(taking, state.copy())
        assert cluster.serving
    finally:
        engine.close()
