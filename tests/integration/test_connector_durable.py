"""The connector on durable topics: confirmed publishes that say their id and durability, replay from the
beginning / an id / now, resuming after a broker restart with nothing lost and nothing repeated, explicit acks
on a queue (what one consumer did not ack goes to the next), credit, DECLARE and the topics table, for the
blocking :class:`connector.Client` and the asyncio :class:`connector.AsyncClient`.

Two kinds of peers: a real in-process broker with persistent topics in ``tmp_path`` (``p.*`` persistent
broadcast, ``q.*`` persistent round-robin, both strong sync), and :class:`FakeBroker`, a few lines of raw
ROUTER that answers CONNECT and commands with an ID and records every frame set, so a test can read the exact
ACK and SUB frames the clients send (merging of acks, RESUME after a reconnect) without trusting a broker.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import msgpack
import pytest
import zmq
from conftest import (
    ARRIVAL,
    FREE_GATEWAY_PORTS,
    QUIET,
    BrokerThread,
    Reply,
    parse,
    receive_all,
    receive_all_async,
)

from broker.config import BrokerConfig
from broker.topics import Delivery, Persistence, Sync, TopicRule, TopicSpec
from connector import AsyncClient, Client, ConnectorError, Message

if TYPE_CHECKING:
    from conftest import BrokerFactory

    from broker.server import Broker

pytestmark = pytest.mark.timeout(30)

T = TypeVar("T")

PERSISTENT = TopicRule("p.*", TopicSpec(persistence=Persistence.PERSISTENT, sync=Sync.STRONG))
QUEUE = TopicRule("q.*", TopicSpec(delivery=Delivery.ROUND_ROBIN, persistence=Persistence.PERSISTENT,
                                   sync=Sync.STRONG))
RULES = (PERSISTENT, QUEUE)
#: A client TTL short enough that a restart is noticed (and resumed from) within a second.
SHORT_TTL_MS = 300


def run(test: Callable[[], Awaitable[T]], limit: float = 20.0) -> T:
    async def bounded() -> T:
        async with asyncio.timeout(limit):
            return await test()

    return asyncio.run(bounded())


def wait_for(condition: Callable[[], object], timeout: float = ARRIVAL, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} not met within {timeout} s"
        time.sleep(0.02)




@pytest.fixture
def durable(start_broker: BrokerFactory, tmp_path: Path) -> Broker:
    """A plaintext broker whose ``p.*`` and ``q.*`` topics are persistent with strong sync."""
    return start_broker(topics=RULES, data_dir=tmp_path / "data")


def durable_broker(bind: str, data_dir: Path, running: list[BrokerThread]) -> BrokerThread:
    """A broker the test stops and starts itself, on ``bind`` with its logs in ``data_dir``."""
    runner = BrokerThread(BrokerConfig(bind=bind, curve=False, heartbeat_tick=0.01, topics=RULES,
                                       data_dir=data_dir, **FREE_GATEWAY_PORTS))
    running.append(runner)
    return runner


# ------------------------------------------------------------------------------------------ the fake broker


class FakeBroker:
    """A raw ROUTER on a loopback port, served by its own thread (ZeroMQ sockets stay on one thread).

    It answers CONNECT with OK (extensions ``batch ids``), any command with an ID with OK, a NOOP with a NOOP
    (so a client with a TTL stays connected), and nothing to identities it was told to :meth:`ignore`.
    Every frame set received is recorded as ``(identity, Reply)``.
    """

    def __init__(self, context: zmq.Context) -> None:
        self.socket = context.socket(zmq.ROUTER)
        self.socket.linger = 0
        self.socket.bind("tcp://127.0.0.1:*")
        self.endpoint = self.socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self.received: list[tuple[bytes, Reply]] = []
        self.changed = threading.Condition()
        self.ignored: set[bytes] = set()
        self.outgoing: deque[list[bytes]] = deque()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._serve, name="fake-mc0-broker", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stopping.is_set():
            while self.outgoing:
                self.socket.send_multipart(self.outgoing.popleft())
            if not self.socket.poll(10, zmq.POLLIN):
                continue
            frames = self.socket.recv_multipart()
            identity, body = frames[0], frames[1:]
            assert body[:1] == [b""], f"the connector frames with the empty delimiter: {frames!r}"
            reply = parse(body[1:])
            with self.changed:
                self.received.append((identity, reply))
                self.changed.notify_all()
                if identity in self.ignored:
                    continue
            command_id = reply.header("ID")
            if reply.verb == b"CONNECT":
                self.socket.send_multipart([identity, b"", b"OK", b"ID", command_id or b"",
                                            b"EXTENSIONS", b"batch ids"])
            elif command_id is not None:
                self.socket.send_multipart([identity, b"", b"OK", b"ID", command_id])
            elif reply.verb == b"NOOP":
                self.socket.send_multipart([identity, b"", b"NOOP"])

    def send(self, identity: bytes, *frames: bytes) -> None:
        """Send one frame set to ``identity`` (from the fake's own thread)."""
        self.outgoing.append([identity, b"", *frames])

    def ignore(self, identity: bytes) -> None:
        """From now on, say nothing to ``identity``: its client will find the broker silent."""
        with self.changed:
            self.ignored.add(identity)

    def wait_for(self, condition: Callable[[list[tuple[bytes, Reply]]], T], timeout: float = ARRIVAL) -> T:
        """The first truthy ``condition(received)``, re-evaluated on every frame set received."""
        with self.changed:
            result = self.changed.wait_for(lambda: condition(self.received), timeout)
            seen = [(identity, reply.frames) for identity, reply in self.received]
        assert result, f"not received within {timeout} s; received so far: {seen}"
        return result

    def commands(self, verb: bytes, identity: bytes | None = None) -> list[Reply]:
        with self.changed:
            return [reply for who, reply in self.received
                    if reply.verb == verb and (identity is None or who == identity)]

    def close(self) -> None:
        self.stopping.set()
        self.thread.join(5)
        self.socket.close(linger=0)


@pytest.fixture
def fake(zmq_context: zmq.Context) -> Iterator[FakeBroker]:
    broker = FakeBroker(zmq_context)
    yield broker
    broker.close()


def connected_identity(fake: FakeBroker, after: int = 0) -> bytes:
    """The identity that sent the CONNECT number ``after`` (0 = the first), once it has arrived."""

    def nth_connect(received: list[tuple[bytes, Reply]]) -> bytes | None:
        identities = [who for who, reply in received if reply.verb == b"CONNECT"]
        return identities[after] if len(identities) > after else None

    return fake.wait_for(nth_connect)


def acks_of(fake: FakeBroker) -> list[tuple[bytes, list[int], bytes | None]]:
    """Every ACK received, as (topic, ids, ID header)."""
    return [(reply.header("TOPIC") or b"", [int(i) for i in reply.positional or []], reply.header("ID"))
            for reply in fake.commands(b"ACK")]


def sub_frames(replies: list[Reply]) -> list[tuple[dict[bytes, bytes], list[bytes]]]:
    """SUB commands as (headers without the ID, topics)."""
    return [({k: v for k, v in reply.headers.items() if k != b"ID"}, reply.positional or [])
            for reply in replies]


def message_frames(topic: bytes, message_id: int, body: bytes) -> list[bytes]:
    return [b"MESSAGE", b"TOPIC", topic, b"MESSAGE-ID", b"%d" % message_id, b"TIMESTAMP", b"1", b"", body]


# ------------------------------------------------------------------------- acks and resume, on a fake broker


def test_async_acks_of_one_turn_leave_as_one_ack_per_topic_without_id(fake: FakeBroker) -> None:
    async def main() -> None:
        async with AsyncClient(fake.endpoint, timeout=3.0) as client:
            await client.subscribe("jobs", "mail", explicit_acks=True, credit=4)
            await client.ack("jobs", 3)
            await client.ack(Message("mail", b"", {}, 9, 1))
            await client.ack("jobs", 4, 5)
            await client.flush()  # a NOOP with ID: everything before it has left

    run(main)
    (sub,) = fake.commands(b"SUB")
    assert sub_frames([sub]) == [({b"ACKS": b"explicit", b"CREDIT": b"4"}, [b"jobs", b"mail"])]
    assert acks_of(fake) == [(b"jobs", [3, 4, 5], None), (b"mail", [9], None)]
    verbs = [reply.verb for _, reply in fake.received]
    assert verbs.index(b"NOOP") > max(n for n, verb in enumerate(verbs) if verb == b"ACK")


def test_sync_acks_reach_the_broker_without_id_every_id_once(fake: FakeBroker) -> None:
    with Client(fake.endpoint, timeout=3.0) as client:
        client.subscribe("jobs", explicit_acks=True)
        client.ack("jobs", 1)
        client.ack(Message("jobs", b"", {}, 2, 1))
        client.ack("mail", 7, 8)
        client.flush()
        acks = acks_of(fake)
    assert all(command_id is None for _, _, command_id in acks)
    assert 2 <= len(acks) <= 3  # merged per topic when the I/O thread found them queued together
    assert [i for topic, ids, _ in acks if topic == b"jobs" for i in ids] == [1, 2]
    assert [i for topic, ids, _ in acks if topic == b"mail" for i in ids] == [7, 8]


def test_ack_of_a_message_without_id_raises_and_sends_nothing(fake: FakeBroker) -> None:
    with Client(fake.endpoint, timeout=3.0) as client:
        with pytest.raises(ConnectorError, match="no id"):
            client.ack(Message("jobs", b"plain 0.3 delivery"))
        with pytest.raises(TypeError):
            client.ack("jobs")
        client.flush()
    assert acks_of(fake) == []


def test_sync_client_resumes_each_topic_after_its_last_id_on_reconnect(fake: FakeBroker) -> None:
    with Client(fake.endpoint, ttl=SHORT_TTL_MS, timeout=3.0) as client:
        client.subscribe("p.t", "other")
        client.subscribe("fresh", replay="beginning", credit=5)
        first = connected_identity(fake)
        fake.send(first, *message_frames(b"p.t", 41, b"a"))
        batch = [[b"p.t", 42, 1, b"b"], [b"other", 7, 1, b"c"], [b"p.t", 43, 1, b"d"]]
        fake.send(first, b"MESSAGES", b"", msgpack.packb(batch, use_bin_type=True))
        received = receive_all(client, 4)
        assert client.last_ids == {"p.t": 43, "other": 7}
        fake.ignore(first)  # the broker "restarts": silence, so the client opens a new connection
        second = connected_identity(fake, after=1)
        fake.wait_for(lambda _: len(fake.commands(b"SUB", second)) >= 3)
        resubscribed = sub_frames(fake.commands(b"SUB", second))
        assert client.reconnects >= 1
        assert client.receive(timeout=QUIET) is None  # nothing delivered twice by the client itself
    assert [m.id for m in received] == [41, 42, 7, 43]
    assert second != first
    assert resubscribed[:3] == [
        ({b"RESUME": b"44"}, [b"p.t"]),
        ({b"RESUME": b"8"}, [b"other"]),
        ({b"REPLAY": b"beginning", b"CREDIT": b"5"}, [b"fresh"]),  # nothing received: asked as at first
    ]


def test_async_client_resumes_each_topic_after_its_last_id_on_reconnect(fake: FakeBroker) -> None:
    async def main() -> list[Message]:
        async with AsyncClient(fake.endpoint, ttl=SHORT_TTL_MS, timeout=3.0) as client:
            await client.subscribe("p.t", credit=2, explicit_acks=True)
            await client.subscribe("later", replay=3)
            first = await asyncio.to_thread(connected_identity, fake)
            fake.send(first, *message_frames(b"p.t", 5, b"a"))
            fake.send(first, *message_frames(b"p.t", 6, b"b"))
            received = await receive_all_async(client, 2)
            assert client.last_ids == {"p.t": 6}
            fake.ignore(first)
            second = await asyncio.to_thread(connected_identity, fake, 1)
            await asyncio.to_thread(fake.wait_for, lambda _: len(fake.commands(b"SUB", second)) >= 2)
            assert client.reconnects >= 1
            assert sub_frames(fake.commands(b"SUB", second))[:2] == [
                ({b"RESUME": b"7", b"CREDIT": b"2", b"ACKS": b"explicit"}, [b"p.t"]),
                ({b"REPLAY": b"3"}, [b"later"]),
            ]
            return received

    assert [m.id for m in run(main)] == [5, 6]


# ------------------------------------------------------------------------------ confirmed publish, replay


def test_confirmed_publish_to_a_persistent_topic_says_message_id_and_fsync(durable: Broker) -> None:
    with Client(durable.endpoint, timeout=3.0) as client:
        first = client.publish("p.orders", "one", confirm=True)
        second = client.publish("p.orders", "two", confirm=True)
        topic = client.topics()["p.orders"]
    assert first is not None
    assert second is not None
    assert first["DURABILITY"] == "fsync"
    assert second["DURABILITY"] == "fsync"
    assert first["MESSAGE-ID"] == "1"  # a fresh log starts at 1
    assert second["MESSAGE-ID"] == "2"
    assert (topic["persistence"], topic["sync"]) == ("persistent", "strong")
    assert (topic["first_id"], topic["last_id"], topic["stored"]) == (1, 2, 2)
    assert topic["bytes"] > 0


def test_async_confirmed_publish_to_a_persistent_topic_says_message_id_and_fsync(durable: Broker) -> None:
    async def main() -> tuple[dict[str, str] | None, dict[str, str] | None]:
        async with AsyncClient(durable.endpoint, timeout=3.0) as client:
            return (await client.publish("p.async", "one", confirm=True),
                    await client.publish("p.async", "two", confirm=True))

    first, second = run(main)
    assert first is not None
    assert second is not None
    assert (first["MESSAGE-ID"], first["DURABILITY"]) == ("1", "fsync")
    assert (second["MESSAGE-ID"], second["DURABILITY"]) == ("2", "fsync")


FIXED = TopicRule("fixed", TopicSpec(element_size=4))


def test_pipelined_confirms_resolve_in_order_with_their_ids_and_travel_together(durable: Broker) -> None:
    with Client(durable.endpoint, timeout=5.0) as client:
        order: list[int] = []
        futures = [client.publish_async("p.pipe", b"m%d" % n) for n in range(1000)]
        for n, future in enumerate(futures):
            future.add_done_callback(lambda _, n=n: order.append(n))
        results = [future.result(5) for future in futures]
        topic = client.topics()["p.pipe"]
    assert [r["MESSAGE-ID"] for r in results] == [str(n) for n in range(1, 1001)]
    assert {r["DURABILITY"] for r in results} == {"fsync"}
    assert order == list(range(1000))
    # 1,000 in flight cost a handful of commits, as publish_batch does, not one fsync each.
    assert topic["fsyncs"] <= 50, topic["fsyncs"]


def test_an_error_in_a_pipelined_run_fails_exactly_that_publish(start_broker: BrokerFactory) -> None:
    broker = start_broker(topics=(FIXED,))
    with Client(broker.endpoint, timeout=5.0) as client:
        futures = [client.publish_async("fixed", body) for body in (b"aaaa", b"bbb", b"cccc", b"dd", b"eeee")]
        outcomes = [future.exception(5) or future.result() for future in futures]
    assert [o["MESSAGE-ID"] for o in outcomes if isinstance(o, dict)] == ["1", "2", "3"]
    refused = [o for o in outcomes if not isinstance(o, dict)]
    assert [type(o) for o in refused] == [ConnectorError, ConnectorError]
    assert isinstance(outcomes[1], ConnectorError)
    assert "exactly 4 bytes, not 3" in str(outcomes[1])
    assert "exactly 4 bytes, not 2" in str(outcomes[3])


def test_confirmed_publishes_from_many_threads_each_get_their_own_id(durable: Broker) -> None:
    with Client(durable.endpoint, timeout=5.0) as client:
        ids: list[str] = []
        lock = threading.Lock()

        def publish() -> None:
            for _ in range(50):
                reply = client.publish("p.threads", "x", confirm=True)
                assert reply is not None
                with lock:
                    ids.append(reply["MESSAGE-ID"])

        threads = [threading.Thread(target=publish) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
    assert sorted(ids, key=int) == [str(n) for n in range(1, 201)]


def test_close_waits_for_the_confirms_in_flight(durable: Broker) -> None:
    client = Client(durable.endpoint, timeout=5.0)
    futures = [client.publish_async("p.closing", b"m%d" % n) for n in range(300)]
    client.close()
    assert all(future.done() for future in futures)
    assert [future.result()["MESSAGE-ID"] for future in futures] == [str(n) for n in range(1, 301)]


def test_confirms_a_silent_broker_never_answers_are_failed_at_close_never_dropped(fake: FakeBroker) -> None:
    client = Client(fake.endpoint, timeout=2.0)
    fake.ignore(connected_identity(fake))
    futures = [client.publish_async("t", b"x") for _ in range(3)]
    fake.wait_for(lambda received: any(reply.verb in (b"PUT", b"PUTS") for _, reply in received))
    with pytest.raises(TimeoutError):
        futures[0].result(0.1)
    assert not futures[0].done()
    late: list[object] = []
    futures[2].add_done_callback(late.append)
    client.close(timeout=0.3)
    assert late == [futures[2]], "a callback added before the failure runs when it fails"
    early: list[object] = []
    futures[2].add_done_callback(early.append)
    assert early == [futures[2]], "a callback added after the failure runs at once"
    for future in futures:
        error = future.exception(1)
        assert isinstance(error, ConnectorError)
        assert "may or may not have been stored" in str(error)


def test_publish_async_waits_for_room_beyond_max_confirms(fake: FakeBroker) -> None:
    with Client(fake.endpoint, timeout=2.0, max_confirms=2) as client:
        fake.ignore(connected_identity(fake))
        first = client.publish_async("t", b"1")
        second = client.publish_async("t", b"2")
        started = time.monotonic()
        with pytest.raises(ConnectorError, match=r"2 confirmed publishes in flight for 0\.3s"):
            client.publish_async("t", b"3", timeout=0.3)
        assert time.monotonic() - started >= 0.3
        assert not first.done()
        assert not second.done()
        client.close(timeout=0.2)


def test_a_broker_without_confirms_gets_one_put_with_an_id_each(fake: FakeBroker) -> None:
    """The fake echoes only ``batch ids``: the client pipelines single PUTs with IDs, each answered alone."""
    with Client(fake.endpoint, timeout=2.0) as client:
        futures = [client.publish_async("t", b"m%d" % n) for n in range(5)]
        assert [future.result(2) for future in futures] == [{}] * 5  # the fake's OKs carry no headers
    puts = fake.commands(b"PUT")
    assert [reply.body for reply in puts] == [b"m%d" % n for n in range(5)]
    assert all(reply.header("ID") for reply in puts)
    assert fake.commands(b"PUTS") == []


def test_async_pipelined_confirms_in_order_with_an_error_in_the_middle(start_broker: BrokerFactory,
                                                                        tmp_path: Path) -> None:
    broker = start_broker(topics=(*RULES, FIXED), data_dir=tmp_path / "data")

    async def main() -> tuple[list[dict[str, str]], list[object], int]:
        async with AsyncClient(broker.endpoint, timeout=5.0) as client:
            futures = [await client.publish_async("p.apipe", b"m%d" % n) for n in range(500)]
            stored = [await future for future in futures]
            mixed = [await client.publish_async("fixed", body) for body in (b"aaaa", b"bbb", b"cccc")]
            outcomes = await asyncio.gather(*mixed, return_exceptions=True)
            fsyncs = (await client.topics())["p.apipe"]["fsyncs"]
            return stored, outcomes, fsyncs

    stored, outcomes, fsyncs = run(main)
    assert [r["MESSAGE-ID"] for r in stored] == [str(n) for n in range(1, 501)]
    assert fsyncs <= 5, fsyncs  # one loop turn's publishes leave as one PUTS CONFIRM each
    assert outcomes[0] == {"MESSAGE-ID": "1", "DURABILITY": "memory"}
    assert isinstance(outcomes[1], ConnectorError)
    assert "exactly 4 bytes, not 3" in str(outcomes[1])
    assert outcomes[2] == {"MESSAGE-ID": "2", "DURABILITY": "memory"}


def test_async_close_waits_for_the_confirms_in_flight(durable: Broker) -> None:
    async def main() -> list[asyncio.Future[dict[str, str]]]:
        client = await AsyncClient(durable.endpoint, timeout=5.0).connect()
        futures = [await client.publish_async("p.aclose", b"x") for _ in range(200)]
        await client.close()
        return futures

    futures = run(main)
    assert [future.result()["MESSAGE-ID"] for future in futures] == [str(n) for n in range(1, 201)]


def test_replay_from_the_beginning_gives_stored_then_live_messages_without_gap_or_duplicate(
    durable: Broker,
) -> None:
    with Client(durable.endpoint, timeout=3.0) as publisher, Client(durable.endpoint, timeout=3.0) as reader:
        for n in range(10):
            publisher.publish("p.log", f"stored {n}", confirm=True)
        reader.subscribe("p.log", replay="beginning")
        for n in range(10):  # published while the replay may still be running
            publisher.publish("p.log", f"live {n}")
        received = receive_all(reader, 20)
        assert reader.receive(timeout=QUIET) is None
        assert reader.last_ids == {"p.log": 20}
    assert [m.text for m in received] == [f"stored {n}" for n in range(10)] + [f"live {n}" for n in range(10)]
    assert [m.id for m in received] == list(range(1, 21))


def test_replay_from_an_id_and_from_now(durable: Broker) -> None:
    with Client(durable.endpoint, timeout=3.0) as publisher, Client(durable.endpoint, timeout=3.0) as reader:
        for n in range(1, 8):
            publisher.publish("p.ids", f"m{n}", confirm=True)
        reader.subscribe("p.ids", replay=5)
        assert [m.id for m in receive_all(reader, 3)] == [5, 6, 7]
        with Client(durable.endpoint, timeout=3.0) as late:
            late.subscribe("p.ids", replay="current")
            publisher.publish("p.ids", "m8", confirm=True)
            (message,) = receive_all(late, 1)
            assert (message.id, message.text) == (8, "m8")
            assert late.receive(timeout=QUIET) is None
        assert [m.id for m in receive_all(reader, 1)] == [8]
        assert reader.receive(timeout=QUIET) is None


def test_replay_on_a_transient_topic_is_refused_and_the_client_keeps_working(durable: Broker) -> None:
    with Client(durable.endpoint, timeout=3.0) as client:
        with pytest.raises(ConnectorError, match="refused SUB"):
            client.subscribe("plain", replay="beginning")
        client.subscribe("plain")  # live is fine on a transient topic
        client.publish("plain", "still fine")
        (message,) = receive_all(client, 1)
        assert message.text == "still fine"


# -------------------------------------------------------------------------------------- broker restarts


def test_a_broker_restart_loses_nothing_and_repeats_nothing(
    restartable: list[BrokerThread], tmp_path: Path
) -> None:
    data = tmp_path / "data"
    first = durable_broker("tcp://127.0.0.1:*", data, restartable)
    endpoint = first.start().endpoint
    expected = ([f"before {n}" for n in range(20)] + [f"while away {n}" for n in range(20)]
                + [f"after {n}" for n in range(20)])
    with Client(endpoint, ttl=SHORT_TTL_MS, timeout=3.0) as subscriber:
        subscriber.subscribe("p.stream")
        with Client(endpoint, timeout=3.0) as publisher:
            for n in range(20):
                publisher.publish("p.stream", f"before {n}", confirm=True)
        wait_for(lambda: subscriber.last_ids.get("p.stream") == 20, what="the first 20 messages arriving")
        received = receive_all(subscriber, 5)  # the other 15 wait in the inbox over the restart
        reconnects = subscriber.reconnects
        first.stop()
        second = durable_broker(endpoint, data, restartable)  # the same port, the same logs
        assert second.start().endpoint == endpoint
        with Client(endpoint, timeout=3.0) as publisher:
            for n in range(20):  # likely before the subscriber noticed the restart: only the log has them
                publisher.publish("p.stream", f"while away {n}", confirm=True)
            wait_for(lambda: subscriber.reconnects > reconnects, what="the subscriber reconnecting")
            for n in range(20):
                publisher.publish("p.stream", f"after {n}", confirm=True)
        received += receive_all(subscriber, 55)
        assert subscriber.receive(timeout=QUIET * 2) is None
        assert subscriber.last_ids == {"p.stream": 60}
    assert [m.text for m in received] == expected
    assert [m.id for m in received] == list(range(1, 61))


def test_async_client_survives_a_broker_restart_without_loss_or_duplicate(
    restartable: list[BrokerThread], tmp_path: Path
) -> None:
    data = tmp_path / "data"
    first = durable_broker("tcp://127.0.0.1:*", data, restartable)
    endpoint = first.start().endpoint

    async def main() -> list[Message]:
        async with AsyncClient(endpoint, ttl=SHORT_TTL_MS, timeout=3.0) as subscriber:
            await subscriber.subscribe("p.async")
            async with AsyncClient(endpoint, timeout=3.0) as publisher:
                for n in range(10):
                    await publisher.publish("p.async", f"m{n}", confirm=True)
            received = await receive_all_async(subscriber, 10)
            await asyncio.to_thread(first.stop)
            second = durable_broker(endpoint, data, restartable)
            await asyncio.to_thread(second.start)
            async with AsyncClient(endpoint, timeout=3.0) as publisher:
                for n in range(10, 20):
                    await publisher.publish("p.async", f"m{n}", confirm=True)
            received += await receive_all_async(subscriber, 10)
            assert await subscriber.receive(timeout=QUIET * 2) is None
            assert subscriber.reconnects >= 1
            return received

    received = run(main, limit=25.0)
    assert [m.text for m in received] == [f"m{n}" for n in range(20)]
    assert [m.id for m in received] == list(range(1, 21))


# -------------------------------------------------------------------------------------- queues and acks


def test_what_a_consumer_did_not_ack_goes_to_the_next_one(durable: Broker) -> None:
    with Client(durable.endpoint, timeout=3.0) as publisher:
        for n in range(6):
            publisher.publish("q.jobs", f"job {n}", confirm=True)
        with Client(durable.endpoint, timeout=3.0) as first:
            first.subscribe("q.jobs", explicit_acks=True)
            taken = receive_all(first, 6)
            first.ack(taken[0])
            first.ack("q.jobs", taken[1].id, taken[2].id)  # type: ignore[arg-type]
            first.flush()  # the acks are fire-and-forget: this round trip proves they arrived
            wait_for(lambda: publisher.topics()["q.jobs"]["consumers"][0]["unacked"] == 3,
                     what="three messages left unacked")
        # Closing with three unacked: the queue takes them back.
        with Client(durable.endpoint, timeout=3.0) as second:
            second.subscribe("q.jobs", explicit_acks=True)
            again = receive_all(second, 3)
            assert second.receive(timeout=QUIET) is None
            for message in again:
                second.ack(message)
    assert [m.text for m in taken] == [f"job {n}" for n in range(6)]
    assert sorted(m.id for m in again) == sorted(m.id for m in taken[3:])  # type: ignore[type-var]
    assert sorted(m.text for m in again) == ["job 3", "job 4", "job 5"]


def test_credit_bounds_the_unacked_messages_in_flight(durable: Broker) -> None:
    with (Client(durable.endpoint, timeout=3.0) as publisher,
          Client(durable.endpoint, timeout=3.0) as consumer):
        for n in range(5):
            publisher.publish("q.credit", f"job {n}", confirm=True)
        consumer.subscribe("q.credit", credit=2, explicit_acks=True)
        first = receive_all(consumer, 2)
        assert consumer.receive(timeout=QUIET * 2) is None  # no third message before an ack
        consumer.ack(first[0])
        (third,) = receive_all(consumer, 1)
        assert consumer.receive(timeout=QUIET * 2) is None
    assert [m.text for m in [*first, third]] == ["job 0", "job 1", "job 2"]


def test_async_explicit_acks_on_a_queue(durable: Broker) -> None:
    async def main() -> tuple[list[Message], list[Message]]:
        async with AsyncClient(durable.endpoint, timeout=3.0) as publisher:
            for n in range(4):
                await publisher.publish("q.async", f"job {n}", confirm=True)
            async with AsyncClient(durable.endpoint, timeout=3.0) as first:
                await first.subscribe("q.async", explicit_acks=True)
                taken = await receive_all_async(first, 4)
                await first.ack(taken[0])
                await first.ack("q.async", taken[1].id)  # type: ignore[arg-type]
            async with AsyncClient(durable.endpoint, timeout=3.0) as second:
                await second.subscribe("q.async", explicit_acks=True)
                again = await receive_all_async(second, 2)
                assert await second.receive(timeout=QUIET) is None
            return taken, again

    taken, again = run(main)
    assert sorted(m.text for m in again) == ["job 2", "job 3"]
    assert sorted(m.id for m in again) == sorted(m.id for m in taken[2:])  # type: ignore[type-var]


# ------------------------------------------------------------------------------------------ declare, topics


def test_declare_creates_a_topic_and_refuses_other_settings(durable: Broker) -> None:
    with Client(durable.endpoint, timeout=3.0) as client:
        client.declare("d.jobs", delivery="round-robin", persistence="persistent", sync="weak")
        client.declare("d.jobs", delivery="round-robin", persistence="persistent", sync="weak")  # same: fine
        with pytest.raises(ConnectorError, match="refused DECLARE"):
            client.declare("d.jobs", delivery="broadcast")
        with pytest.raises(ConnectorError, match="refused DECLARE"):
            client.declare("d.bad", delivery="sideways")
        topic = client.topics()["d.jobs"]
        confirmed = client.publish("d.jobs", "x", confirm=True)
        client.flush()  # the client still works after the refusals
    assert (topic["delivery"], topic["persistence"], topic["sync"]) == ("round-robin", "persistent", "weak")
    assert confirmed is not None
    assert confirmed["DURABILITY"] == "written"  # weak sync: written before the OK, fsynced later


def test_async_declare_and_topics(durable: Broker) -> None:
    async def main() -> dict[str, object]:
        async with AsyncClient(durable.endpoint, timeout=3.0) as client:
            await client.declare("d.async", persistence="persistent", segment_bytes=1 << 20)
            with pytest.raises(ConnectorError, match="refused DECLARE"):
                await client.declare("d.async", persistence="transient")
            await client.publish("d.async", "x", confirm=True)
            await client.subscribe("d.async", replay="beginning")
            (message,) = await receive_all_async(client, 1)
            assert (message.id, message.text) == (1, "x")
            assert client.last_ids == {"d.async": 1}
            return (await client.topics())["d.async"]

    topic = run(main)
    assert (topic["persistence"], topic["last_id"], topic["stored"]) == ("persistent", 1, 1)
    assert topic["subscribers"] == 1


def test_topics_lists_transient_and_persistent_topics(durable: Broker) -> None:
    with Client(durable.endpoint, timeout=3.0) as client:
        client.subscribe("plain", "p.listed")
        client.publish("plain", "x", confirm=True)
        client.publish("p.listed", "y", confirm=True)
        receive_all(client, 2)
        topics = client.topics()
        assert set(topics) == set(client.stats()["topics"])
    assert topics["plain"]["persistence"] == "transient"
    assert topics["plain"]["subscribers"] == 1
    assert topics["p.listed"]["first_id"] == 1
    assert topics["p.listed"]["last_id"] == 1
    assert isinstance(topics["p.listed"]["consumers"], list)


def test_a_subscriber_that_saw_nothing_yet_resumes_from_where_it_subscribed(
    restartable: list[BrokerThread], tmp_path: Path
) -> None:
    """The OK to a SUB says where each topic stood (NEXT-IDS), so even a subscriber that received nothing
    before the broker went away gets what was published while it was away, and nothing from before."""
    data = tmp_path / "data"
    first = durable_broker("tcp://127.0.0.1:*", data, restartable)
    endpoint = first.start().endpoint
    with Client(endpoint, timeout=3.0) as publisher:
        for n in range(5):
            publisher.publish("p.quiet", f"old {n}", confirm=True)
    with Client(endpoint, ttl=SHORT_TTL_MS, timeout=3.0) as subscriber:
        subscriber.subscribe("p.quiet")
        assert subscriber.last_ids == {"p.quiet": 5}, "the position the broker reported at SUB"
        reconnects = subscriber.reconnects
        first.stop()
        second = durable_broker(endpoint, data, restartable)
        second.start()
        with Client(endpoint, timeout=3.0) as publisher:
            for n in range(5):
                publisher.publish("p.quiet", f"while away {n}", confirm=True)
        wait_for(lambda: subscriber.reconnects > reconnects, what="the subscriber reconnecting")
        received = receive_all(subscriber, 5)
        assert subscriber.receive(timeout=QUIET) is None
    assert [m.text for m in received] == [f"while away {n}" for n in range(5)]
    assert [m.id for m in received] == [6, 7, 8, 9, 10]


def test_a_persistent_queue_keeps_its_position_across_a_restart(
    restartable: list[BrokerThread], tmp_path: Path
) -> None:
    """Acked messages never come back; every unacked one does, to the next consumer, after a restart."""
    data = tmp_path / "data"
    first = durable_broker("tcp://127.0.0.1:*", data, restartable)
    endpoint = first.start().endpoint
    with Client(endpoint, timeout=3.0) as producer:
        for n in range(1, 11):
            producer.publish("q.work", f"job {n}", confirm=True)
    consumer = Client(endpoint, timeout=3.0)
    consumer.subscribe("q.work", explicit_acks=True, credit=10)
    taken = receive_all(consumer, 10)
    assert [m.id for m in taken] == list(range(1, 11))
    for message in taken[::2]:  # acks 1, 3, 5, 7, 9
        consumer.ack(message)
    consumer.flush()  # the acks arrived (and were committed with the turn that took them)
    first.stop()  # the consumer's session ends with the broker; nothing was acked for 2, 4, 6, 8, 10
    consumer.close()

    second = durable_broker(endpoint, data, restartable)
    second.start()
    with Client(endpoint, timeout=3.0) as producer, Client(endpoint, timeout=3.0) as other:
        producer.publish("q.work", "job 11", confirm=True)
        other.subscribe("q.work")
        again = receive_all(other, 6)
        assert other.receive(timeout=QUIET) is None
    assert [m.id for m in again] == [2, 4, 6, 8, 10, 11]
    assert [m.text for m in again] == ["job 2", "job 4", "job 6", "job 8", "job 10", "job 11"]


def test_a_slow_subscriber_on_a_persistent_topic_reads_the_log_and_loses_nothing(
    start_broker: BrokerFactory, tmp_path: Path
) -> None:
    """pending_limit 50 and a subscriber that does not read while 3,000 messages are published: it falls back
    to the log and, once it reads, gets every message once, in order; a transient twin drops and counts."""
    broker = start_broker(topics=RULES, data_dir=tmp_path / "data", pending_limit=50, send_hwm=20)
    with Client(broker.endpoint, timeout=5.0, max_inbox=100) as slow, \
            Client(broker.endpoint, timeout=5.0) as publisher:
        slow.subscribe("p.flood", "flood")
        for n in range(3000):
            publisher.publish("p.flood", b"%d" % n + b"." * 200)
            publisher.publish("flood", b"%d" % n + b"." * 200)
        publisher.flush()
        stats = publisher.topics()
        assert stats["p.flood"]["dropped"] == 0
        assert stats["flood"]["dropped"] > 0, "the transient twin overflowed (the test's premise)"
        received = receive_all(slow, 3000 + 3000 - stats["flood"]["dropped"])
        persistent = [m.id for m in received if m.topic == "p.flood"]
        assert persistent == list(range(1, 3001))
        assert slow.receive(timeout=QUIET) is None
        final = publisher.topics()
        assert final["p.flood"]["lag"] == 0
        assert final["flood"]["dropped"] == stats["flood"]["dropped"]
