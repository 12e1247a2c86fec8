"""A command naming more new persistent topics than a turn may make waits while they are made, a few each
turn (broker.router, ``_Making``), driven through a fake socket: the turns it takes, the order of the client's
answers, the bound on what waits behind it, and a topic that cannot be made."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq
import zmq.asyncio

from broker import engine as engine_module
from broker import router as router_module
from broker.engine import CREATES_PER_TURN, Engine
from broker.hub import Hub
from broker.router import RouterShell
from broker.store.files import FileStore
from broker.topics import Persistence, Sync, TopicRule, TopicRules, TopicSpec
from protocol import mc0

RULES = TopicRules([TopicRule("log.*", TopicSpec(persistence=Persistence.PERSISTENT, sync=Sync.STRONG))])
NEW = 2 * CREATES_PER_TURN + 3  # three turns of making


class Wire:
    """Stands in for the ROUTER: commands queued by the test, replies recorded per peer."""

    def __init__(self) -> None:
        self.inbox: deque[list[bytes]] = deque()
        self.sent: list[tuple[bytes, list[bytes]]] = []

    def readable(self) -> bool:
        return bool(self.inbox)

    def receive(self) -> tuple[list[bytes], None]:
        return self.inbox.popleft(), None

    def transmit(self, identity: bytes, frames: list[bytes]) -> None:
        self.sent.append((identity, frames))

    def command(self, identity: bytes, event: mc0.Event) -> None:
        self.inbox.append([identity, *mc0.encode(event)])

    def answers(self, identity: bytes) -> list[tuple[bytes, bytes | None]]:
        """(verb, ID) of every reply ``identity`` got so far, in order."""
        out = []
        for to, frames in self.sent:
            if to == identity:
                reply = mc0.decode(frames[1:])
                out.append((frames[1], getattr(reply, "id", None)))
        return out


@pytest.fixture
def shell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[RouterShell, Wire]]:
    monkeypatch.setattr(engine_module, "CREATE_SECONDS_PER_TURN", 60.0)  # counted here, not timed
    context = zmq.asyncio.Context()
    socket = context.socket(zmq.ROUTER)
    engine = Engine(RULES, FileStore(tmp_path / "data"))
    hub = Hub(engine, monotonic=lambda: 0.0, wall_ms=lambda: 0)
    shell = RouterShell(hub, socket)
    hub.add(shell)
    wire = Wire()
    shell._readable, shell._receive = wire.readable, wire.receive  # type: ignore[method-assign]
    shell.transmit = wire.transmit  # type: ignore[method-assign]
    yield shell, wire
    engine.close()
    socket.close(linger=0)
    context.term()


def turn(router: RouterShell) -> int:
    """One turn as the loop runs it: read, then flush. Returns the logs it made."""
    before = router.engine.logs_created
    router.receive(0.0)
    router.hub.flush(0.0)
    return router.engine.logs_created - before


def made_ahead(router: RouterShell) -> None:
    """Wait until the store's threads have made every log a waiting command needs (Engine.make_ahead): the
    loop's next turn would be called for them, and takes as many as a turn may."""
    deadline = time.monotonic() + 10
    while not all(router.engine.ready(name) for making in router.making.values() for name in making.unmade):
        assert time.monotonic() < deadline, "the store's threads made nothing for 10 s"
        time.sleep(0.001)


def turns_until_made(router: RouterShell) -> list[int]:
    """Turns until no command waits for its topics, each once what the turn needs is made ahead: the logs
    each made."""
    made = []
    while not made or router.making:
        made_ahead(router)
        made.append(turn(router))
    return made


def puts(count: int, command_id: bytes, start: int = 0) -> mc0.Puts:
    return mc0.Puts([(b"log.t%d" % n, b"x", {}) for n in range(start, start + count)], id=command_id)


def recording_builders(router: RouterShell) -> list[str]:
    """The names of the threads that build each topic directory from now on."""
    maker = router.engine.store.maker  # type: ignore[union-attr]
    build, builders = maker.build, []

    def recorded(*args: object) -> None:
        builders.append(threading.current_thread().name[:8])
        build(*args)

    maker.build = recorded
    store = router.engine.store
    build_here = store._build_directory  # type: ignore[union-attr]

    def recorded_here(*args: object) -> None:
        if threading.current_thread() is threading.main_thread():
            builders.append("loop")
        build_here(*args)

    store._build_directory = recorded_here  # type: ignore[union-attr]
    return builders


def test_a_puts_waits_while_its_topics_are_made_and_its_clients_later_commands_wait_behind_it(
    shell: tuple[RouterShell, Wire]
) -> None:
    router, wire = shell
    builders = recording_builders(router)
    wire.command(b"a", puts(NEW, b"many"))
    wire.command(b"a", mc0.Noop(id=b"after"))
    wire.command(b"b", mc0.Noop(id=b"other"))
    assert turn(router) == 0
    assert wire.answers(b"b") == [(b"OK", b"other")], "another client is served at once"
    assert wire.answers(b"a") == []
    assert turns_until_made(router) == [CREATES_PER_TURN, CREATES_PER_TURN, NEW - 2 * CREATES_PER_TURN]
    assert wire.answers(b"a") == [(b"OK", b"many"), (b"OK", b"after")]
    assert all(router.engine.topics[b"log.t%d" % n].next_id == 2 for n in range(NEW))
    assert builders == ["mc0-make"] * NEW, "every directory built in the store's threads, none by the loop"


def test_pipelined_publishes_to_new_topics_build_at_most_one_directory_a_turn_on_the_loop(
    shell: tuple[RouterShell, Wire]
) -> None:
    """A client's first publish to a new topic makes it at once, as before; its next ones, in the same turn,
    wait while the store's threads build theirs (the ones behind them too, meanwhile), and are answered in
    order; another client is answered in the first turn."""
    router, wire = shell
    builders = recording_builders(router)
    for n in range(NEW):
        wire.command(b"a", mc0.Put(b"log.p%d" % n, b"x", id=b"p%d" % n))
    wire.command(b"b", mc0.Noop(id=b"other"))
    assert turn(router) == 1, "the first new topic is made on the loop"
    assert wire.answers(b"b") == [(b"OK", b"other")]
    assert wire.answers(b"a") == [(b"OK", b"p0")]
    assert set(router.engine._logs_ahead) == {b"log.p%d" % n for n in range(1, NEW)}, "all asked for at once"
    turns_until_made(router)
    assert wire.answers(b"a") == [(b"OK", b"p%d" % n) for n in range(NEW)]
    assert builders == ["loop"] + ["mc0-make"] * (NEW - 1)


def test_a_puts_naming_two_new_topics_waits_for_them_built_ahead(shell: tuple[RouterShell, Wire]) -> None:
    router, wire = shell
    builders = recording_builders(router)
    wire.command(b"a", puts(2, b"two"))
    assert turn(router) == 0
    assert wire.answers(b"a") == []
    assert turns_until_made(router) == [2]
    assert wire.answers(b"a") == [(b"OK", b"two")]
    assert builders == ["mc0-make"] * 2


def test_what_waits_behind_a_command_is_bounded(shell: tuple[RouterShell, Wire],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    router, wire = shell
    monkeypatch.setattr(router_module, "MAX_HELD_COMMANDS", 2)
    wire.command(b"a", puts(NEW, b"many"))
    for n in range(4):
        wire.command(b"a", mc0.Noop(id=b"n%d" % n))
    turn(router)
    refused = wire.answers(b"a")
    assert [verb for verb, _ in refused] == [b"ERROR", b"ERROR"]
    assert [command_id for _, command_id in refused] == [b"n2", b"n3"]
    turns_until_made(router)
    assert wire.answers(b"a")[2:] == [(b"OK", b"many"), (b"OK", b"n0"), (b"OK", b"n1")]


def test_a_topic_that_cannot_be_made_is_refused_by_the_command_once_the_others_are(
    shell: tuple[RouterShell, Wire]
) -> None:
    """With room for CREATES_PER_TURN + 2 topics, the command waits while those are made, then runs and is
    refused (a batch is refused whole), instead of waiting for topics nothing will make."""
    router, wire = shell
    router.engine.max_topics = CREATES_PER_TURN + 2
    wire.command(b"a", puts(NEW, b"many"))
    assert turns_until_made(router) == [0, CREATES_PER_TURN, 2], "it waits only while topics can be made"
    [(verb, command_id)] = wire.answers(b"a")
    assert (verb, command_id) == (b"ERROR", b"many")
    assert len(router.engine.topics) == CREATES_PER_TURN + 2


def test_a_client_dropped_while_its_command_waits_leaves_nothing_behind(
    shell: tuple[RouterShell, Wire]
) -> None:
    router, wire = shell
    wire.command(b"a", puts(NEW, b"many"))
    turn(router)
    assert router.making
    router.drop(router.sessions.by_identity[b"a"], "gone")
    assert not router.making
    turn(router)
    assert wire.answers(b"a") == []
    assert len(router.engine.topics) == 0, "nothing made for a client that has gone"
    router.engine.close()  # the store's threads have finished: what they made ahead for it is gone
    left = [entry.name for entry in router.engine.store.root.iterdir()]  # type: ignore[union-attr]
    assert left == [".lock"]


def test_a_sub_naming_many_new_persistent_topics_waits_too(shell: tuple[RouterShell, Wire]) -> None:
    router, wire = shell
    topics = [b"log.s%d" % n for n in range(NEW)]
    wire.command(b"a", mc0.Sub(topics, id=b"sub"))
    assert turns_until_made(router) == [0, CREATES_PER_TURN, CREATES_PER_TURN, NEW - 2 * CREATES_PER_TURN]
    assert wire.answers(b"a") == [(b"OK", b"sub")]
    router.engine.publish(b"log.s0", b"x", {}, 0)
    router.hub.flush(0.0)
    assert wire.answers(b"a")[1][0] == b"MESSAGE", "subscribed once its topics were made"


def test_a_slow_disk_makes_fewer_topics_a_turn(shell: tuple[RouterShell, Wire],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A turn also stops making a waiting command's topics once it has spent CREATE_SECONDS_PER_TURN on them:
    one at least. (A command naming no more than CREATES_PER_TURN runs at once: it makes its own.)"""
    router, wire = shell
    monkeypatch.setattr(engine_module, "CREATE_SECONDS_PER_TURN", 0.0)  # any topic takes longer than that
    wire.command(b"a", puts(NEW, b"many"))
    assert turns_until_made(router) == [0] + [1] * NEW
    assert wire.answers(b"a") == [(b"OK", b"many")]
