"""The asyncio :class:`connector.AsyncClient` against a real in-process broker on a loopback port: the usage
from its docstring, SUB/UNSUB waiting for OK (and raising on ERROR), confirmed and fire-and-forget publishing,
flush, stats, receive timeouts, headers, close (DISCONNECT, idempotent, no use afterwards), a missing broker,
CURVE, TTL heartbeats during idleness, and reconnecting to a broker restarted on the same port.

Each test runs its own event loop with ``asyncio.run`` under an overall ``asyncio.timeout``, once on the
client's native wire (its default) and once through libzmq (``each_wire``).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pytest
from conftest import FREE_GATEWAY_PORTS, BrokerThread, free_endpoint, receive_all_async

from broker.config import BrokerConfig
from connector import AsyncClient, Client, ConnectorError
from connector import keys as key_files

if TYPE_CHECKING:
    from conftest import BrokerFactory

    from broker.server import Broker

pytestmark = [pytest.mark.timeout(20), pytest.mark.usefixtures("each_wire")]

ARRIVAL = 5.0
T = TypeVar("T")


def run(test: Callable[[], Awaitable[T]], limit: float = 15.0) -> T:
    async def bounded() -> T:
        async with asyncio.timeout(limit):
            return await test()

    return asyncio.run(bounded())




# ------------------------------------------------------------------------------------------------- the basics


def test_the_usage_from_the_docstring(start_broker: BrokerFactory, tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    key_files.generate(keys)
    broker = start_broker(curve=True, keys_dir=keys)

    async def main() -> None:
        async with AsyncClient(broker.endpoint, keys=str(keys)) as client:
            await client.subscribe("orders")
            await client.publish("orders", "hello")
            message = await client.receive(timeout=ARRIVAL)
            assert message is not None
            assert (message.topic, message.text) == ("orders", "hello")
            assert isinstance(message.id, int)

    run(main)


def test_subscribe_refused_raises_and_the_client_keeps_working(start_broker: BrokerFactory) -> None:
    broker = start_broker()

    async def main() -> None:
        async with AsyncClient(broker.endpoint, timeout=3.0) as client:
            with pytest.raises(ConnectorError, match=r"refused SUB.*transient"):
                await client.subscribe("p.orders", replay="beginning")  # transient: nothing to replay
            await client.subscribe("plain")
            await client.publish("plain", "fine")
            message = await client.receive(timeout=ARRIVAL)
            assert message is not None
            assert message.text == "fine"
            with pytest.raises(ConnectorError, match="refused UNSUB"):
                await client.unsubscribe("")

    run(main)


def test_unsubscribe_stops_delivery(broker: Broker) -> None:
    async def main() -> None:
        async with AsyncClient(broker.endpoint) as client, AsyncClient(broker.endpoint) as other:
            await client.subscribe("gone", "kept")
            await client.unsubscribe("gone")
            await other.publish("gone", "not for you")
            await other.publish("kept", "marker")
            message = await client.receive(timeout=ARRIVAL)
            assert message is not None
            assert message.text == "marker"
            assert await client.receive(timeout=0.2) is None

    run(main)


def test_confirmed_publish_returns_the_message_id(broker: Broker) -> None:
    async def main() -> None:
        async with AsyncClient(broker.endpoint) as client:
            await client.subscribe("confirmed")
            first = await client.publish("confirmed", "one", confirm=True)
            second = await client.publish("confirmed", "two", confirm=True)
            assert first is not None
            assert second is not None
            assert int(second["MESSAGE-ID"]) > int(first["MESSAGE-ID"])
            received = await receive_all_async(client, 2)
            assert [m.id for m in received] == [int(first["MESSAGE-ID"]), int(second["MESSAGE-ID"])]

    run(main)


def test_publish_batch_confirms_the_batch_and_skips_what_a_producer_stored(broker: Broker) -> None:
    async def main() -> None:
        async with AsyncClient(broker.endpoint) as client:
            await client.subscribe("batched")
            entries = [("batched", f"m{n}", None) for n in range(300)]  # as columns: one topic, no headers
            first = await client.publish_batch(entries, producer="p", sequence=0)
            again = await client.publish_batch([*entries, ("batched", "last", {"X-k": "v"})], producer="p",
                                               sequence=0)
            assert (first["COUNT"], first["DUPLICATES"]) == ("300", "0")
            assert (again["COUNT"], again["DUPLICATES"]) == ("1", "300")
            assert await client.publish_batch([]) == {}
            received = await receive_all_async(client, 301)
            assert [m.text for m in received] == [f"m{n}" for n in range(300)] + ["last"]
            assert received[-1].headers == {"X-k": "v"}
            with pytest.raises(ValueError, match="one topic"):
                await client.publish_batch([("a", "1", None), ("b", "2", None)], producer="p", sequence=9)

    run(main)


def test_fire_and_forget_publishes_arrive_complete_and_in_order(broker: Broker) -> None:
    count = 5000

    async def main() -> None:
        async with AsyncClient(broker.endpoint) as client, AsyncClient(broker.endpoint) as publisher:
            await client.subscribe("bulk")
            for n in range(count):
                assert await publisher.publish("bulk", b"%d" % n) is None
            received = await receive_all_async(client, count)
            assert [m.body for m in received] == [b"%d" % n for n in range(count)]
            ids = [m.id for m in received]
            assert all(a < b for a, b in itertools.pairwise(ids))  # type: ignore[operator]

    run(main)


def test_publishes_from_concurrent_tasks_all_arrive(broker: Broker) -> None:
    async def main() -> None:
        async with AsyncClient(broker.endpoint) as client:
            await client.subscribe("tasks")

            async def publish(worker: int) -> None:
                for n in range(200):
                    await client.publish("tasks", f"{worker}:{n}")
                    if n % 50 == 0:
                        await asyncio.sleep(0)

            async with asyncio.TaskGroup() as group:
                for worker in range(4):
                    group.create_task(publish(worker))
            received = await receive_all_async(client, 800)
            by_worker: dict[int, list[int]] = {}
            for message in received:
                worker, n = message.text.split(":")
                by_worker.setdefault(int(worker), []).append(int(n))
            assert by_worker == {w: list(range(200)) for w in range(4)}

    run(main)


def test_the_first_publish_of_a_loop_turn_leaves_at_once_and_the_rest_together(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A paced publisher's message must not wait for the loop's next iteration; a turn's others still travel
    as one PUTS, and ``publish_async`` futures always wait for the turn's flush (one PUTS CONFIRM each)."""
    import connector.aio as aio
    from connector.native import NativeSocket

    sent: list[list[bytes]] = []

    def spying(real: Any) -> Any:
        def spy(socket: object, frames: list[bytes]) -> None:
            if frames[1] in (b"PUT", b"PUTS"):
                sent.append(list(frames))
            real(socket, frames)

        return spy

    # Whichever wire the client has: libzmq's send, or the native wire's.
    monkeypatch.setattr(aio, "send_frames", spying(aio.send_frames))
    monkeypatch.setattr(NativeSocket, "send_frames", spying(NativeSocket.send_frames))

    async def main() -> None:
        async with AsyncClient(broker.endpoint) as client:
            await client.subscribe("turns")
            await asyncio.sleep(0)  # a fresh loop turn
            await client.publish("turns", "a")
            assert len(sent) == 1, "the turn's first publish did not leave at once"
            await client.publish("turns", "b")
            await client.publish("turns", "c")
            assert len(sent) == 1, "the turn's later publishes left one by one"
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            assert len(sent) == 2, "the turn's later publishes did not leave at its flush"
            assert sent[1][1] == b"PUTS"
            assert sent[1][-1].count(b"turns") == 2

            await asyncio.sleep(0)
            futures = [await client.publish_async("turns", f"{n}") for n in range(3)]
            assert len(sent) == 2, "publish_async left before the turn's flush"
            await asyncio.gather(*futures)
            assert len(sent) == 3
            assert sent[2][:5] == [b"", b"PUTS", b"CONFIRM", b"each", b"ID"], "not one PUTS CONFIRM each"
            assert sent[2][-1].count(b"turns") == 3

            await asyncio.sleep(0)
            headers = await client.publish("turns", "confirmed", confirm=True)
            assert headers is not None
            assert "MESSAGE-ID" in headers
            assert len(sent) == 4

            received = await receive_all_async(client, 7)
            assert [m.text for m in received] == ["a", "b", "c", "0", "1", "2", "confirmed"]

    run(main)


def test_flush_and_stats(broker: Broker) -> None:
    async def main() -> None:
        async with AsyncClient(broker.endpoint) as client:
            for n in range(300):
                await client.publish("flushed", b"%d" % n)
            await client.flush()
            data = await client.stats()
            assert data["topics"]["flushed"]["messages_in"] == 300
            assert data["connections"]["mc0"] == 1
            assert data["uptime_seconds"] >= 0

    run(main)


def test_receive_returns_none_on_timeout(broker: Broker) -> None:
    async def main() -> None:
        async with AsyncClient(broker.endpoint) as client:
            await client.subscribe("quiet")
            start = time.monotonic()
            assert await client.receive(timeout=0.3) is None
            assert 0.25 <= time.monotonic() - start < 2.0
            assert await client.receive(timeout=0) is None

    run(main)


def test_receives_with_a_timeout_share_one_timer(broker: Broker) -> None:
    """A loop of receive(timeout) arms one timer, not one per message; a shorter timeout after a longer one
    still ends on time, and two receives waiting at once each end at their own deadline."""
    async def main() -> None:
        async with AsyncClient(broker.endpoint) as client, AsyncClient(broker.endpoint) as publisher:
            await client.subscribe("timed")
            loop = asyncio.get_running_loop()
            armed = 0
            call_later = loop.call_later

            def counting(delay: float, callback: Any, *args: Any) -> asyncio.TimerHandle:
                nonlocal armed
                if getattr(callback, "__name__", "") == "_alarm_rang":
                    armed += 1
                return call_later(delay, callback, *args)

            loop.call_later = counting  # type: ignore[method-assign]
            try:
                for index in range(20):
                    receiving = asyncio.ensure_future(client.receive(timeout=30))
                    await asyncio.sleep(0.01)  # so that the receive waits before the message comes
                    await publisher.publish("timed", f"m{index}")
                    message = await receiving
                    assert message is not None
                    assert message.text == f"m{index}"
                assert armed == 1
                start = time.monotonic()
                # Due before the 30 s timer: it arms one of its own.
                assert await client.receive(timeout=0.2) is None
                assert 0.15 <= time.monotonic() - start < 2.0
                assert armed == 2
                start = time.monotonic()
                short, long = await asyncio.gather(client.receive(timeout=0.2), client.receive(timeout=0.5))
                assert short is None
                assert long is None
                assert 0.45 <= time.monotonic() - start < 2.5
            finally:
                loop.call_later = call_later  # type: ignore[method-assign]

    run(main)


def test_headers_round_trip(broker: Broker) -> None:
    headers = {"X-Reply-To": "me", "X-Empty": "", "X-Unicode": "é ✓"}

    async def main() -> None:
        async with AsyncClient(broker.endpoint) as client:
            await client.subscribe("headed")
            await client.publish("headed", b"\x00\xff", headers)
            message = await client.receive(timeout=ARRIVAL)
            assert message is not None
            assert message.headers == headers
            assert message.body == b"\x00\xff"

    run(main)


def test_async_iteration(broker: Broker) -> None:
    async def main() -> None:
        async with AsyncClient(broker.endpoint) as client:
            await client.subscribe("iter")
            for n in range(3):
                await client.publish("iter", b"%d" % n)
            bodies = []
            async for message in client:
                bodies.append(message.body)
                if len(bodies) == 3:
                    break
            assert bodies == [b"0", b"1", b"2"]

    run(main)


def test_blocking_and_async_clients_talk_to_each_other(broker: Broker) -> None:
    async def main() -> None:
        async with AsyncClient(broker.endpoint) as client:
            await client.subscribe("mixed")
            with Client(broker.endpoint) as blocking:
                blocking.publish("mixed", "from the blocking client", {"X-From": "sync"})
                blocking.flush()
            message = await client.receive(timeout=ARRIVAL)
            assert message is not None
            assert (message.text, message.headers) == ("from the blocking client", {"X-From": "sync"})

    run(main)


# ---------------------------------------------------------------------------------------------------- closing


def test_close_sends_disconnect_and_is_idempotent(broker: Broker) -> None:
    async def main() -> None:
        async with AsyncClient(broker.endpoint) as observer:
            client = await AsyncClient(broker.endpoint).connect()
            await client.subscribe("leaving")
            assert (await observer.stats())["connections"]["mc0"] == 2
            await client.close()
            await client.close()
            deadline = time.monotonic() + 2.0
            while (await observer.stats())["connections"]["mc0"] != 1:
                assert time.monotonic() < deadline, "the broker still counts the closed client"
                await asyncio.sleep(0.02)
            assert (await observer.stats())["topics"]["leaving"]["subscribers"] == 0

    run(main)


def test_use_after_close_raises(broker: Broker) -> None:
    async def main() -> None:
        client = await AsyncClient(broker.endpoint).connect()
        await client.close()
        with pytest.raises(ConnectorError):
            await client.publish("t", "x")
        with pytest.raises(ConnectorError):
            await client.publish("t", "x", confirm=True)
        with pytest.raises(ConnectorError):
            await client.subscribe("t")
        with pytest.raises(ConnectorError):
            await client.unsubscribe("t")
        with pytest.raises(ConnectorError):
            await client.flush()
        with pytest.raises(ConnectorError):
            await client.stats()
        with pytest.raises(ConnectorError):
            await client.receive(timeout=0.1)

    run(main)


def test_close_right_after_publishing_loses_nothing(broker: Broker) -> None:
    count = 2000

    async def main() -> None:
        async with AsyncClient(broker.endpoint) as client:
            await client.subscribe("last words")
            publisher = await AsyncClient(broker.endpoint).connect()
            for n in range(count):
                await publisher.publish("last words", b"%d" % n)
            await publisher.close()
            received = await receive_all_async(client, count)
            assert [m.body for m in received] == [b"%d" % n for n in range(count)]

    run(main)


def test_close_is_prompt_with_a_full_inbox(broker: Broker) -> None:
    async def main() -> None:
        async with AsyncClient(broker.endpoint) as other:
            client = await AsyncClient(broker.endpoint, max_inbox=5).connect()
            await client.subscribe("unread")
            for n in range(2000):
                await other.publish("unread", b"%d" % n)
            await other.flush()
            deadline = time.monotonic() + ARRIVAL
            while client.pending < 5:
                assert time.monotonic() < deadline, "deliveries did not arrive"
                await asyncio.sleep(0.01)
            start = time.monotonic()
            await client.close()
            assert time.monotonic() - start < 1.0

    run(main)


def test_no_broker_listening_raises_within_the_timeout() -> None:
    async def main() -> None:
        start = time.monotonic()
        endpoint = free_endpoint()
        with pytest.raises(ConnectorError, match=f"nothing is listening at {endpoint}: start the broker"):
            await AsyncClient(endpoint, timeout=0.5).connect()
        assert time.monotonic() - start < 2.0

    run(main)


def test_no_broker_with_a_short_ttl_still_raises_within_the_timeout() -> None:
    async def main() -> None:
        start = time.monotonic()
        with pytest.raises(ConnectorError, match="nothing is listening at"):
            await AsyncClient(free_endpoint(), ttl=100, timeout=0.6).connect()
        assert time.monotonic() - start < 2.0

    run(main)


def test_a_bad_endpoint_raises_connector_error() -> None:
    async def main() -> None:
        with pytest.raises(ConnectorError):
            await AsyncClient("tcp://127.0.0.1:not-a-port", timeout=1.0).connect()

    run(main)


def test_curve_with_the_wrong_server_key_fails_to_connect(
    start_broker: BrokerFactory, tmp_path: Path
) -> None:
    key_files.generate(tmp_path / "keys")
    broker = start_broker(curve=True, keys_dir=tmp_path / "keys")
    key_files.generate(tmp_path / "elsewhere")

    async def main() -> None:
        with pytest.raises(ConnectorError):
            await AsyncClient(broker.endpoint, keys=tmp_path / "elsewhere", timeout=0.5).connect()

    run(main)


# ----------------------------------------------------------------------------------- heartbeats and reconnect


def test_heartbeats_keep_an_idle_client_connected(start_broker: BrokerFactory) -> None:
    broker = start_broker(heartbeat_tick=0.01)

    async def main() -> None:
        # TTL 1 s, idle for 2.5 TTLs. The client gives up 0.1 x TTL after the broker's NOOP is due (1.05 vs
        # 0.95 x TTL); a shorter TTL leaves a window that scheduling jitter on a busy machine can close.
        client = AsyncClient(broker.endpoint, ttl=1000)
        async with client, AsyncClient(broker.endpoint) as publisher:
            await client.subscribe("idle")
            assert await client.receive(timeout=2.5) is None
            assert (await publisher.stats())["topics"]["idle"]["subscribers"] == 1
            await publisher.publish("idle", "still there")
            message = await client.receive(timeout=ARRIVAL)
            assert message is not None
            assert message.text == "still there"
            assert client.reconnects == 0

    run(main)


def test_heartbeats_run_while_the_loop_is_busy_elsewhere(start_broker: BrokerFactory) -> None:
    """Idle in the client's sense but with other tasks running: the reader task still sends NOOPs."""
    broker = start_broker(heartbeat_tick=0.01)

    async def main() -> None:
        async with AsyncClient(broker.endpoint, ttl=400) as client, AsyncClient(broker.endpoint) as publisher:
            await client.subscribe("busy loop")
            for _ in range(40):
                await asyncio.sleep(0.05)
            await publisher.publish("busy loop", "hello")
            message = await client.receive(timeout=ARRIVAL)
            assert message is not None
            assert message.text == "hello"
            assert client.reconnects == 0

    run(main)


def restartable_broker(bind: str, restartable: list[BrokerThread]) -> BrokerThread:
    runner = BrokerThread(BrokerConfig(bind=bind, curve=False, heartbeat_tick=0.01, **FREE_GATEWAY_PORTS))
    restartable.append(runner)
    return runner


def test_reconnect_after_a_broker_restart(restartable: list[BrokerThread]) -> None:
    def plain_broker(bind: str) -> BrokerThread:
        return restartable_broker(bind, restartable)

    first = plain_broker("tcp://127.0.0.1:*")
    endpoint = first.start().endpoint

    async def main() -> None:
        async with AsyncClient(endpoint, ttl=400, timeout=3.0) as client:
            await client.subscribe("survivor")
            await client.flush()
            await asyncio.to_thread(first.stop)
            second = plain_broker(endpoint)  # the port the first broker resolved
            assert (await asyncio.to_thread(second.start)).endpoint == endpoint
            async with AsyncClient(endpoint) as publisher:
                deadline = time.monotonic() + 6.0
                message = None
                while message is None:
                    assert time.monotonic() < deadline, "no message after the restart"
                    await publisher.publish("survivor", "after restart")
                    message = await client.receive(timeout=0.1)
                assert message.text == "after restart"
                assert client.reconnects >= 1
                await client.flush()

    run(main)


def test_a_confirmed_publish_made_while_the_broker_is_down_is_confirmed_once_it_is_back(
    restartable: list[BrokerThread],
) -> None:
    """Queued on the socket while the connection is down, it goes out ahead of the new CONNECT and is answered
    before it: confirmed, not failed as lost."""
    first = restartable_broker("tcp://127.0.0.1:*", restartable)
    endpoint = first.start().endpoint

    async def main() -> None:
        async with AsyncClient(endpoint, ttl=400, timeout=3.0) as client:
            await client.publish("down", "before", confirm=True)
            await asyncio.to_thread(first.stop)
            await asyncio.sleep(0.3)  # the connection is gone
            pending = await client.publish_async("down", "while down")
            second = restartable_broker(endpoint, restartable)
            assert (await asyncio.to_thread(second.start)).endpoint == endpoint
            confirmed = await asyncio.wait_for(pending, 10)
            assert confirmed["MESSAGE-ID"] == "1", "stored by the new broker, the first message of its topic"
            assert client.reconnects >= 1

    run(main)


def test_a_reader_that_dies_fails_callers_instead_of_leaving_them_waiting(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def main() -> None:
        unhandled: list[dict[str, object]] = []
        asyncio.get_running_loop().set_exception_handler(lambda _loop, context: unhandled.append(context))
        async with AsyncClient(broker.endpoint, curve=False) as client:
            await client.subscribe("doomed")

            def broken_read(*_: object) -> int:
                raise RuntimeError("reader bug")

            monkeypatch.setattr(client, "_read", broken_read)
            waiting = asyncio.ensure_future(client.receive())  # no timeout: would wait forever
            other = AsyncClient(broker.endpoint, curve=False)
            await other.connect()
            await other.publish("doomed", "wakes the reader", confirm=True)
            await other.close()
            with pytest.raises(ConnectorError, match="reader bug"):
                await asyncio.wait_for(waiting, ARRIVAL)
            with pytest.raises(ConnectorError, match="reader bug"):
                await client.flush()
        assert unhandled == [], "the descriptor's callback handed the error to the client, not to the loop"

    run(main)


# --------------------------------------------------------------------------------------------- the wire


def test_the_wire_is_checked_and_native_takes_tcp_only(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="wire must be one of auto, native, zeromq, not 'libzmq'"):
        AsyncClient(free_endpoint(), wire="libzmq")

    async def main() -> None:
        client = AsyncClient(f"ipc://{tmp_path}/mc0.sock", wire="native", curve=False, timeout=1.0)
        with pytest.raises(ConnectorError, match=r"wire 'native' cannot connect to ipc://.* tcp://HOST:PORT"):
            await client.connect()

    run(main)


def test_a_native_reader_stops_reading_past_its_queue_and_loses_nothing(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Deliveries that the client does not take pile up in the native wire's queue only to RECV_HWM: past it
    the connection stops being read (the kernel's buffers and the broker hold the rest), and it is read
    again as they are taken, in order and complete."""
    import connector.native

    monkeypatch.setattr(connector.native, "RECV_HWM", 20)
    paused: list[bool] = []

    async def main() -> None:
        async with AsyncClient(broker.endpoint, curve=False, wire="native", max_inbox=10) as subscriber, \
                AsyncClient(broker.endpoint, curve=False) as publisher:
            await subscriber.subscribe("queue")
            for index in range(200):  # confirmed one by one: each is delivered in a message of its own
                await publisher.publish("queue", b"%d" % index, confirm=True)
            await asyncio.sleep(0.3)  # everything has reached the subscriber, or waits because it stopped
            native = subscriber._socket
            assert isinstance(native, connector.native.NativeSocket)
            paused.append(native.dealer.paused)
            got = [int((await subscriber.receive(timeout=ARRIVAL)).body) for _ in range(200)]  # type: ignore[union-attr]
            assert got == list(range(200))
            paused.append(native.dealer.paused)

    run(main)
    assert paused == [True, False]
