"""The reactive-streams door's central promise as a property: whatever interleaving of publishes, requests,
flushes and full transports, a stream never receives more elements than its total demand, receives them in
order without gaps, and receives everything the demand allows once it is flushed (on a persistent topic,
where nothing may be dropped). Driven in-process: the real engine, hub and gateway connection, a stand-in
transport, and the client codec reading what the broker wrote.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from memory_log import MemoryStore

from broker.engine import Engine
from broker.gateways.rstreams import RStreamsConnection, RStreamsOptions
from broker.gateways.tcp import Gateway
from broker.hub import Hub
from broker.topics import Delivery, Persistence, TopicRule, TopicRules, TopicSpec
from protocol import rstreams


class Transport:
    """Keeps what the broker writes; ``full`` makes it report a full buffer after each write."""

    def __init__(self) -> None:
        self.written = bytearray()
        self.connection: RStreamsConnection | None = None
        self.full = False

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None: ...

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else default

    def write(self, data: bytes) -> None:
        self.written += data
        if self.full and self.connection is not None and self.connection.writable:
            self.connection.pause_writing()

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def close(self) -> None: ...

    def abort(self) -> None: ...


operations = st.lists(
    st.one_of(
        st.tuples(st.just("publish"), st.integers(1, 30)),
        st.tuples(st.just("request"), st.integers(1, 25)),
        st.tuples(st.just("flush"), st.just(0)),
        st.tuples(st.just("fill"), st.just(0)),
        st.tuples(st.just("drain"), st.just(0)),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(operations, st.integers(0, 10), st.sampled_from(["log", "queue"]))
def test_a_stream_never_gets_more_than_its_demand(
    ops: list[tuple[str, int]], initial: int, kind: str
) -> None:
    spec = (TopicSpec(persistence=Persistence.PERSISTENT) if kind == "log"
            else TopicSpec(delivery=Delivery.ROUND_ROBIN, persistence=Persistence.PERSISTENT))
    engine = Engine(TopicRules([TopicRule("t", spec)]), MemoryStore())
    hub = Hub(engine)
    gateway = Gateway("rstreams", hub, RStreamsConnection, host="127.0.0.1", port=0, tick=1.0,
                      pending_limit=7, options=RStreamsOptions())
    hub.add(gateway)
    connection = RStreamsConnection(gateway)
    transport = Transport()
    transport.connection = connection
    connection.connection_made(transport)  # type: ignore[arg-type]
    client = rstreams.Connection(client=True)
    client.receive_data(bytes(transport.written))
    transport.written.clear()
    assert isinstance(client.next_event(), rstreams.ServerHello)
    connection.data_received(client.send(rstreams.ClientHello(0, ())) + client.send(
        rstreams.Subscribe("t", 1, initial)))

    demand = initial
    published = 0
    received: list[bytes] = []

    def read() -> None:
        client.receive_data(bytes(transport.written))
        transport.written.clear()
        while (event := client.next_event()) is not None:
            if isinstance(event, rstreams.OnNext):
                received.append(event.element)
            else:
                assert isinstance(event, rstreams.OnSubscribe), event

    for op, n in ops:
        if op == "publish":
            for _ in range(n):
                engine.publish(b"t", b"%d" % published, {}, 0)
                published += 1
        elif op == "request":
            connection.data_received(client.send(rstreams.Request(1, n)))
            demand += n
        elif op == "flush":
            hub.flush(0.0)
        elif op == "fill":
            transport.full = True
        else:
            transport.full = False
            if not connection.writable:
                connection.resume_writing()
        read()
        assert len(received) <= demand, "more elements than the stream's demand"
        assert received == [b"%d" % i for i in range(len(received))], "in order, without gaps"

    transport.full = False
    if not connection.writable:
        connection.resume_writing()
    for _ in range(published // 7 + 3):  # each turn moves at most the pending limit from the log
        hub.flush(0.0)
    read()
    assert len(received) == min(demand, published), "everything the demand allows arrives, nothing is lost"
