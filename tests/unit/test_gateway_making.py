"""A TCP door's event that names a new persistent topic waits while the store's threads make the topic's log
(broker.gateways.tcp, ``Connection._park``), on a real loop and a real store: the loop builds no directory,
the parked event and what came after it are handled in order once it is made, and a peer that goes away while
its event waits leaves nothing made ahead behind. Lumberjack, whose windows may be routed to hundreds of
new topics, stands for every dialect; each dialect's ``names_topics`` is checked on its own."""

from __future__ import annotations

import asyncio
import json
import threading
from collections import deque
from pathlib import Path
from typing import Any

import pytest

from broker.engine import Engine
from broker.gateways import tcp
from broker.gateways.lumberjack import LumberjackConnection, LumberjackOptions, field_path
from broker.gateways.msgq import MsgqConnection, MsgqOptions
from broker.gateways.rstreams import Offered, RStreamsConnection, RStreamsOptions
from broker.gateways.sexp import SexpConnection, SexpOptions
from broker.gateways.tcp import Connection, Gateway
from broker.hub import Hub
from broker.store.files import FileStore
from broker.store.making import AHEAD_PREFIX
from broker.topics import Persistence, Sync, TopicRule, TopicRules, TopicSpec
from protocol import lumberjack, msgq, rstreams, sexp

RULES = TopicRules([TopicRule("lj.*", TopicSpec(persistence=Persistence.PERSISTENT, sync=Sync.STRONG))])
NEW = 12


class Transport:
    """Stands in for the connection's transport: records writes and whether the peer is read."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.reading = True

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None: ...

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else default

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def close(self) -> None: ...

    def abort(self) -> None: ...


def shipper(tmp_path: Path) -> tuple[LumberjackConnection, Transport, Engine, list[str]]:
    """A Lumberjack connection routing by ``fields.topic`` into a real store, on the running loop; the names
    of the threads that built each topic directory."""
    store = FileStore(tmp_path / "data")
    engine = Engine(RULES, store)
    hub = Hub(engine)
    hub.loop = asyncio.get_running_loop()
    gateway = Gateway("lumberjack", hub, LumberjackConnection, host="127.0.0.1", port=0, tick=1.0,
                      options=LumberjackOptions(topic_field=field_path("fields.topic")))
    hub.add(gateway)
    builders: list[str] = []
    build = store.maker.build

    def recorded(*args: Any) -> None:
        builders.append(threading.current_thread().name[:8])
        build(*args)

    store.maker.build = recorded
    connection = LumberjackConnection(gateway)
    transport = Transport()
    connection.connection_made(transport)  # type: ignore[arg-type]
    return connection, transport, engine, builders


def window(count: int) -> bytes:
    writer = lumberjack.ClientConnection(version=lumberjack.V2)
    events = [(n, {"message": f"m{n}", "fields": {"topic": f"lj.t{n % NEW}"}}) for n in range(1, count + 1)]
    return writer.send_window(count) + writer.send_events(events, compress=True)


async def until(condition: Any, what: str) -> None:
    for _ in range(2000):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"not within 10 s: {what}")


def test_events_wait_for_their_new_topics_made_in_the_stores_threads(tmp_path: Path) -> None:
    async def run() -> None:
        connection, transport, engine, builders = shipper(tmp_path)
        try:
            connection.data_received(window(2 * NEW))
            assert engine.topics == {}, "nothing made on the loop"
            assert connection.parked is not None
            assert not transport.reading, "the peer is not read while its event waits"
            assert len(connection.upcoming) == 2 * NEW - 1, "the events after it decoded ahead"
            asked = {b"lj.t%d" % k for k in range(NEW)}
            assert set(engine._logs_ahead) == asked, "all their topics asked for at once"
            assert connection.input_held() >= connection.upcoming_bytes > 0, "and counted as held input"
            await until(lambda: transport.writes, "the window's ack")
            assert transport.writes == [b"2A\x00\x00\x00\x18"], "acked once, after all 24 events"
            assert builders == ["mc0-make"] * NEW, "every directory built in the store's threads"
            assert 1 <= connection.gateway.counters["parked"] <= NEW
            assert (connection.upcoming, connection.upcoming_bytes, connection.asked) == (deque(), 0, set())
            for k in range(NEW):
                messages = engine.read_range(b"lj.t%d" % k, 1, 10, 1 << 20).messages
                expected = [f"m{n}" for n in range(1, 2 * NEW + 1) if n % NEW == k]
                assert [json.loads(message.body)["message"] for message in messages] == expected
            assert transport.reading
        finally:
            engine.close()

    asyncio.run(run())


def test_a_peer_gone_while_its_event_waits_leaves_nothing_made_ahead(tmp_path: Path) -> None:
    async def run() -> None:
        connection, _, engine, _ = shipper(tmp_path)
        connection.data_received(window(3))
        assert connection.parked is not None
        connection.connection_lost(None)
        assert connection.parked is None
        await asyncio.sleep(0.2)  # a maker's call after the loss finds nothing to go on with
        assert engine.topics == {}
        engine.close()  # the store's threads have finished: what they made for the peer is gone
        assert not [path for path in (tmp_path / "data").iterdir() if path.name.startswith(AHEAD_PREFIX)]

    asyncio.run(run())


def test_what_is_decoded_ahead_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def run() -> None:
        connection, _, engine, _ = shipper(tmp_path)
        try:
            monkeypatch.setattr(tcp, "LOOK_AHEAD", 3)
            connection.data_received(window(2 * NEW))
            assert len(connection.upcoming) == 3
            assert set(engine._logs_ahead) == {b"lj.t1", b"lj.t2", b"lj.t3", b"lj.t4"}
        finally:
            engine.close()
        monkeypatch.setattr(tcp, "LOOK_AHEAD_BYTES", 1)
        connection, _, engine, _ = shipper(tmp_path / "bytes")
        try:
            connection.data_received(window(2 * NEW))
            assert len(connection.upcoming) == 1, "one event's bytes reach the bound"
        finally:
            engine.close()

    asyncio.run(run())


def test_a_malformed_frame_after_waiting_events_closes_the_connection_after_them(tmp_path: Path) -> None:
    """Decoding ahead meets the peer's error: the events before it are still handled, in order, and then the
    connection closes for the error, as it would have without decoding ahead (no ack: the writer sends the
    window again)."""
    async def run() -> None:
        connection, _, engine, _ = shipper(tmp_path)
        try:
            connection.data_received(window(3) + b"2Z garbage")
            assert connection.parked is not None
            assert not connection.closing, "the error waits for its turn"
            await until(lambda: connection.closing, "the close for the error")
            assert connection.gateway.counters["errors"] == 1
            assert sorted(engine.topics) == [b"lj.t1", b"lj.t2", b"lj.t3"]
            for n in (1, 2, 3):
                assert engine.topics[b"lj.t%d" % n].next_id == 2, "its event published before the close"
        finally:
            engine.close()

    asyncio.run(run())


OPTIONS = {
    SexpConnection: SexpOptions(), MsgqConnection: MsgqOptions(), RStreamsConnection: RStreamsOptions(),
    LumberjackConnection: LumberjackOptions(topic_field=field_path("fields.topic")),
}


@pytest.mark.parametrize(("connection_class", "ready", "event", "names"), [
    (SexpConnection, {"client_id": b"c"}, sexp.Publish(b"t", b"x"), (b"t",)),
    (SexpConnection, {"client_id": b"c"}, sexp.Subscribe(b"t", sexp.REPLAY_BEGINNING), (b"t",)),
    (SexpConnection, {}, sexp.Publish(b"t", b"x"), ()),  # before Connect: refused, nothing to make
    (MsgqConnection, {"lname": b"me"}, msgq.Subscribe(b"g"), (b"g",)),
    (MsgqConnection, {}, msgq.Subscribe(b"g"), ()),  # before getlname: refused
    (MsgqConnection, {"lname": b"me"}, msgq.Send(b"me", b"*", b"g", b"*", b"", b"x"), (b"g",)),
    (RStreamsConnection, {"offered": {3: Offered(b"t", 8)}}, rstreams.OnNext(3, b"x"), (b"t",)),
    (RStreamsConnection, {"offered": {3: Offered(b"t", 8)}}, rstreams.OnNextPacked(3, (b"x",)), (b"t",)),
    (RStreamsConnection, {}, rstreams.Subscribe("t?replay=beginning", 1, 10), (b"t",)),
    (RStreamsConnection, {}, rstreams.Subscribe("t?replay=nonsense", 1, 10), ()),
    (RStreamsConnection, {}, rstreams.OnNext(99, b"x"), ()),  # no such offer: refused, nothing to make
    (LumberjackConnection, {}, lumberjack.Event(2, 1, {"fields": {"topic": "lj.a"}}), (b"lj.a",)),
    (LumberjackConnection, {}, lumberjack.Event(2, 1, {"message": "m"}), (b"logs",)),  # its default topic
    (LumberjackConnection, {}, lumberjack.Window(2, 5), ()),
])
def test_each_dialect_names_the_topics_an_event_would_create(
    connection_class: type[Connection], ready: dict[str, Any], event: object, names: tuple[bytes, ...],
) -> None:
    gateway = Gateway("door", Hub(Engine()), connection_class, host="127.0.0.1", port=0, tick=1.0,
                      options=OPTIONS[connection_class])
    connection = connection_class(gateway)
    for attribute, value in ready.items():
        setattr(connection, attribute, value)
    assert tuple(connection.names_topics(event)) == names
