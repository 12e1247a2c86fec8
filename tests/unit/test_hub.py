"""The hub's turn, driven with stand-in doors and outlets (no sockets): commit before any answer, deliveries
to outlets of both kinds (polled ones retried on a timer, the others only when they say they have room),
detached outlets handing their messages back, a closed hub doing nothing, and an error in a scheduled flush
stopping the hub's task instead of vanishing into asyncio's log.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from broker.engine import Engine, Message, Subscriber
from broker.hub import Hub
from broker.store import StoreError
from broker.topics import Delivery, TopicRule, TopicRules, TopicSpec


class Outlet:
    """Takes at most ``room`` deliveries per call (None = all)."""

    def __init__(self, polled: bool, room: int | None = None) -> None:
        self.polled = polled
        self.room = room
        self.attached = True
        self.got: list[int] = []

    def deliver(self, messages: list[Message], now: float) -> int:
        taken = messages if self.room is None else messages[: self.room]
        self.got += [message.id for message in taken]
        return len(taken)


class Door:
    name = "test"

    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def answer(self, now: float) -> bool:
        self.calls.append("answer")
        return False

    def stats(self) -> dict[str, Any]:
        return {"connections": 0}


def subscribed(engine: Engine, outlet: Outlet, topic: bytes = b"t") -> Subscriber:
    subscriber = Subscriber(outlet, limit=1000)
    engine.subscribe(subscriber, topic)
    return subscriber


def publish(engine: Engine, count: int, topic: bytes = b"t") -> None:
    for n in range(count):
        engine.publish(topic, b"%d" % n, {}, 0)


def recorded(calls: list[str]) -> tuple[Engine, Hub, Outlet]:
    """An engine whose commits, and a hub whose door's answers, are recorded in ``calls``; an outlet of
    topic ``t``."""
    engine = Engine()
    hub = Hub(engine)
    hub.add(Door(calls))
    original = engine.commit

    def commit() -> int:
        calls.append("commit")
        return original()

    engine.commit = commit  # type: ignore[method-assign]
    outlet = Outlet(polled=False)
    subscribed(engine, outlet)
    return engine, hub, outlet


def test_the_commit_comes_before_any_answer_and_deliveries_after() -> None:
    calls: list[str] = []
    engine, hub, outlet = recorded(calls)
    publish(engine, 3)
    hub.flush(0.0)
    assert calls == ["commit", "answer"]
    assert outlet.got == [1, 2, 3]


def test_what_runs_once_committed_comes_after_the_commit_and_before_any_answer_or_delivery() -> None:
    calls: list[str] = []
    engine, hub, outlet = recorded(calls)
    publish(engine, 2)
    hub.flush(0.0, committed=lambda: calls.append(f"committed, {len(outlet.got)} delivered"))
    assert calls == ["commit", "committed, 0 delivered", "answer"]
    assert outlet.got == [1, 2]
    hub.close()
    hub.flush(0.0, committed=lambda: calls.append("committed"))
    assert calls[-1] == "answer"  # a closed hub commits nothing, so it says nothing was


def test_a_full_polled_outlet_is_retried_on_a_timer_and_a_full_unpolled_one_waits_to_be_woken() -> None:
    engine = Engine()
    hub = Hub(engine)
    polled, unpolled = Outlet(polled=True, room=0), Outlet(polled=False, room=0)
    polled_subscriber = subscribed(engine, polled)
    unpolled_subscriber = subscribed(engine, unpolled)
    publish(engine, 2)
    hub.flush(0.0)
    assert hub.retry > 0, "the polled outlet is retried"
    assert polled_subscriber.ready
    assert not unpolled_subscriber.ready
    assert len(unpolled_subscriber.pending) == 2, "kept for the outlet, not dropped"
    polled.room = unpolled.room = None
    hub.flush(0.0)
    assert polled.got == [1, 2]
    assert unpolled.got == [], "an unpolled outlet is not asked again until it says it has room"
    assert hub.retry == 0
    hub.wake(unpolled_subscriber)
    hub.flush(0.0)
    assert unpolled.got == [1, 2]


def test_a_detached_outlet_hands_its_queue_messages_to_the_others() -> None:
    engine = Engine(TopicRules([TopicRule("q", TopicSpec(delivery=Delivery.ROUND_ROBIN))]))
    hub = Hub(engine)
    gone, staying = Outlet(polled=False, room=0), Outlet(polled=False)
    subscribed(engine, gone, b"q")
    subscribed(engine, staying, b"q")
    gone.attached = False
    publish(engine, 4, b"q")
    hub.flush(0.0)
    assert sorted(staying.got) == [1, 2, 3, 4], "what the gone consumer held went to the other"
    assert gone.got == []


def test_a_closed_hub_does_nothing() -> None:
    engine = Engine()
    hub = Hub(engine)
    outlet = Outlet(polled=False)
    subscribed(engine, outlet)
    publish(engine, 1)
    hub.close()
    hub.flush(0.0)
    assert outlet.got == []


def test_an_error_in_a_scheduled_flush_stops_the_hub_task() -> None:
    engine = Engine()

    def broken_commit() -> int:
        raise StoreError("fsync failed")

    engine.commit = broken_commit  # type: ignore[method-assign]

    async def main() -> None:
        hub = Hub(engine, weak_sync_interval=60, retention_interval=60)
        hub.loop = asyncio.get_running_loop()
        task = asyncio.create_task(hub.run())
        hub.schedule()
        await asyncio.wait_for(task, 5)

    with pytest.raises(StoreError, match="fsync failed"):
        asyncio.run(main())
