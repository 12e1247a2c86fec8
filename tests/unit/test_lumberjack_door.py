"""The Lumberjack door's promise, checked in-process where the order of events can be seen: an ack leaves
only after the commit that stores what it covers, and keepalives go to v2 writers only. The real engine, hub
and gateway connection, a stand-in transport, and a log that records what was committed when.
"""

from __future__ import annotations

import json
from typing import Any

from memory_log import MemoryStore

from broker.engine import Engine
from broker.gateways.lumberjack import LumberjackConnection, LumberjackOptions
from broker.gateways.tcp import Gateway
from broker.hub import Hub
from broker.topics import Persistence, TopicRule, TopicRules, TopicSpec
from protocol import lumberjack


class Transport:
    def __init__(self, log: Any) -> None:
        self.log = log
        self.writes: list[tuple[bytes, int]] = []  # each write, and how many messages were committed by then

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None: ...

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else default

    def write(self, data: bytes) -> None:
        self.writes.append((data, self.log().committed if self.log() is not None else 0))

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def close(self) -> None: ...

    def abort(self) -> None: ...


def door() -> tuple[LumberjackConnection, Transport, Hub, MemoryStore]:
    store = MemoryStore()
    engine = Engine(TopicRules([TopicRule("logs", TopicSpec(persistence=Persistence.PERSISTENT))]), store)
    clock = [0.0]
    hub = Hub(engine, monotonic=lambda: clock[0])
    gateway = Gateway("lumberjack", hub, LumberjackConnection, host="127.0.0.1", port=0, tick=1.0,
                      options=LumberjackOptions())
    hub.add(gateway)
    connection = LumberjackConnection(gateway)
    transport = Transport(lambda: store.logs.get(b"logs"))
    connection.connection_made(transport)  # type: ignore[arg-type]
    return connection, transport, hub, store


def test_an_ack_leaves_only_after_the_commit_of_what_it_covers() -> None:
    connection, transport, hub, store = door()
    writer = lumberjack.ClientConnection(version=lumberjack.V2)
    batch = [(n, {"message": f"m{n}"}) for n in (1, 2, 3)]
    connection.data_received(writer.send_window(3) + writer.send_events(batch, compress=True))
    assert transport.writes == [], "the ack is due, but nothing is stored yet: it waits"
    assert store.logs[b"logs"].committed == 0
    hub.flush(0.0)
    [(ack, committed_then)] = transport.writes
    assert ack == b"2A\x00\x00\x00\x03"
    assert committed_then == 3, "written after the commit of all three events"
    assert [json.loads(m.body) for m in store.logs[b"logs"].messages] == [e for _, e in batch]


def test_keepalives_for_a_waiting_v2_batch_and_never_for_v1() -> None:
    for version, expected in ((lumberjack.V2, [b"2A\x00\x00\x00\x00"]), (lumberjack.V1, [])):
        connection, transport, hub, _ = door()
        writer = lumberjack.ClientConnection(version=version)
        connection.data_received(writer.send_window(5) + writer.send_events([(1, {"m": "1"})]))
        hub.flush(0.0)
        assert transport.writes == [], "one event of five: no ack due"
        connection.tick(4.0)
        assert transport.writes == [], "not before five seconds"
        connection.tick(5.5)
        assert [data for data, _ in transport.writes] == expected, version
