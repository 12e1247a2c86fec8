"""The pieces that keep clients from taking more than their share, each on its own: the descriptor shares and
the watch that pauses and resumes the doors (with counts and doors of our own), the sorted names STATS pages
through (against a sorted list, hypothesis), the gateways' shared input budget and their handshake timeout,
and the sessions' probe and eviction choices (time as an argument).
"""

from __future__ import annotations

import asyncio
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker import descriptors
from broker import names as names_module
from broker.engine import Engine
from broker.gateways.tcp import Connection, Gateway, InputBudget
from broker.hub import Hub
from broker.names import SortedNames
from broker.sessions import Sessions

# --------------------------------------------------------------------------------------------- descriptors


def test_the_limit_is_shared_between_the_store_a_reserve_and_the_doors() -> None:
    shares = descriptors.shares(1024, 0, 64)
    assert (shares.store, shares.reserve) == (256, 64)  # a quarter for the store when nothing is said
    assert shares.pause_at == 1024 - 256 - 64
    assert shares.resume_at == shares.pause_at - 32
    small = descriptors.shares(256, 0, 64)
    assert (small.store, small.reserve) == (64, 32)  # the reserve shrinks on a small limit
    assert descriptors.shares(256, 1000, 64).store == 128  # never more than half the limit


class Door:
    def __init__(self, name: str, failing: bool = False) -> None:
        self.name = name
        self.failing = failing
        self.calls: list[str] = []

    def pause(self) -> None:
        self.calls.append("pause")

    def shed(self) -> None:
        self.calls.append("shed")

    async def resume(self) -> None:
        self.calls.append("resume")
        if self.failing:
            raise OSError(98, "Address already in use")


def watch_with(counts: list[int], doors: list[Door], store: int = 0) -> descriptors.DescriptorWatch:
    shares = descriptors.shares(256, 64, 32)  # doors pause at 160, resume under 144
    return descriptors.DescriptorWatch(shares, doors, lambda: store, count=lambda: counts.pop(0))  # type: ignore[arg-type]


def test_the_watch_pauses_the_doors_before_the_limit_and_resumes_them_later(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [100.0]
    monkeypatch.setattr(descriptors.time, "monotonic", lambda: clock[0])
    doors = [Door("mc0"), Door("sexp")]
    watch = watch_with([100, 170, 150, 120, 120], doors)
    try:
        assert asyncio.run(watch.check()) >= descriptors.FASTEST
        assert not watch.paused
        asyncio.run(watch.check())  # 170: past the doors' share
        assert watch.paused
        assert [door.calls for door in doors] == [["pause"], ["pause"]]
        asyncio.run(watch.check())  # 150: not yet below 144
        clock[0] += 0.5
        asyncio.run(watch.check())  # 120, but paused for less than MIN_PAUSE
        assert watch.paused
        clock[0] += descriptors.MIN_PAUSE
        asyncio.run(watch.check())
        assert not watch.paused
        assert [door.calls for door in doors] == [["pause", "resume"], ["pause", "resume"]]
        assert watch.stats() == {"descriptors": 120, "descriptor_limit": 256, "paused": False, "pauses": 1}
    finally:
        watch.close()


def test_the_watch_counts_rarely_while_descriptors_cannot_run_short_soon_and_often_near_the_limit() -> None:
    roomy = descriptors.shares(1 << 20, 0, 64)  # a million: a few dozen in use leave seconds of flood
    watch = descriptors.DescriptorWatch(roomy, [], lambda: 0, count=lambda: 40)
    try:
        assert asyncio.run(watch.check()) == descriptors.SLOWEST
    finally:
        watch.close()
    tight = descriptors.shares(1024, 0, 64)  # its room below the threshold fills in 14 ms at FLOOD_RATE
    watch = descriptors.DescriptorWatch(tight, [], lambda: 0, count=lambda: 40)
    try:
        assert asyncio.run(watch.check()) < 0.2  # FASTEST, or COST_FACTOR times a slow count
    finally:
        watch.close()
    counts = [tight.pause_at // 2 + 1]  # past half the threshold: every FASTEST, whatever the cost
    watch = descriptors.DescriptorWatch(tight, [], lambda: 0, count=lambda: counts[0])
    try:
        assert asyncio.run(watch.check()) == descriptors.FASTEST
    finally:
        watch.close()


def test_counting_without_a_descriptor_left_counts_as_the_limit_and_a_failed_resume_is_tried_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [100.0]
    monkeypatch.setattr(descriptors.time, "monotonic", lambda: clock[0])
    broken = Door("mc0", failing=True)
    watch = watch_with([descriptors.NONE_LEFT, 10, 10], [broken])
    try:
        asyncio.run(watch.check())
        assert watch.paused
        assert watch.in_use == 256
        clock[0] += descriptors.MIN_PAUSE
        asyncio.run(watch.check())
        assert watch.paused, "the door did not come back: still paused, tried again"
        broken.failing = False
        clock[0] += descriptors.MIN_PAUSE
        asyncio.run(watch.check())
        assert not watch.paused
    finally:
        watch.close()


def test_out_of_descriptors_pauses_and_sheds_at_once_and_only_once_per_pause(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [100.0]
    monkeypatch.setattr(descriptors.time, "monotonic", lambda: clock[0])
    door = Door("sexp")
    watch = watch_with([170, 120, 170, 120], [door])
    try:
        watch.out_of_descriptors()
        watch.out_of_descriptors()
        assert door.calls == ["pause", "shed"]
        assert watch.pauses == 1
        asyncio.run(watch.check())  # 170: still short, still paused
        clock[0] += descriptors.MIN_PAUSE
        asyncio.run(watch.check())  # 120: back
        assert door.calls == ["pause", "shed", "resume"]
        asyncio.run(watch.check())  # 170: a pause of the count's, no shedding
        watch.out_of_descriptors()  # then a failed open during it: shed, once
        watch.out_of_descriptors()
        assert door.calls == ["pause", "shed", "resume", "pause", "shed"]
        assert watch.pauses == 2
    finally:
        watch.close()


# ------------------------------------------------------------------------------------------------ names


names = st.lists(st.sampled_from([b"a", b"b", b"c", b"\xff"]), min_size=1, max_size=3).map(b"".join)


@settings(max_examples=200, deadline=None)
@given(operations=st.lists(st.tuples(st.booleans(), names), max_size=300),
       cursor=st.none() | names, prefix=st.binary(max_size=2))
def test_sorted_names_page_like_a_sorted_list(operations: list[tuple[bool, bytes]], cursor: bytes | None,
                                              prefix: bytes) -> None:
    with mock.patch.object(names_module, "CHUNK", 4):  # small chunks: splits and empty chunks come up
        check_sorted_names(operations, cursor, prefix)


def check_sorted_names(operations: list[tuple[bool, bytes]], cursor: bytes | None, prefix: bytes) -> None:
    kept = SortedNames()
    reference: set[bytes] = set()
    for add, name in operations:
        if add:
            kept.add(name)
            reference.add(name)
        else:
            kept.discard(name)
            reference.discard(name)
    assert len(kept) == len(reference)
    expected = [name for name in sorted(reference)
                if (cursor is None or name > cursor) and name.startswith(prefix)]
    assert list(kept.after(cursor, prefix)) == expected
    assert all(name in kept for name in reference)


# -------------------------------------------------------------------------------------- gateways' budget


class Holder(Connection):
    """A connection whose held input is set by hand."""

    def __init__(self, gateway: Gateway, held: int) -> None:
        super().__init__(gateway)
        self.held = held
        self.refused: str | None = None

    def input_held(self) -> int:
        return self.held

    def refuse(self, why: str) -> None:
        self.refused = why


def test_past_the_input_budget_the_connection_holding_most_is_refused() -> None:
    budget = InputBudget(100)
    gateway = Gateway("sexp", Hub(Engine()), lambda gateway: Connection(gateway), host="127.0.0.1", port=0,
                      tick=1.0, input_budget=budget)
    small, large, third = Holder(gateway, 30), Holder(gateway, 60), Holder(gateway, 20)
    for holder in (small, large):
        budget.update(holder, holder.input_held())
    assert budget.total == 90
    budget.update(third, third.input_held())
    assert large.refused is not None
    assert "60 bytes of unfinished input: all connections together may hold 100" in large.refused
    assert small.refused is None
    assert budget.total == 50
    assert gateway.counters["over_budget"] == 1
    budget.forget(small)
    assert budget.total == 20


def test_a_peer_that_says_nothing_is_closed_after_the_handshake_timeout() -> None:
    clock = [0.0]
    hub = Hub(Engine(), monotonic=lambda: clock[0])
    gateway = Gateway("msgq", hub, lambda gateway: Connection(gateway), host="127.0.0.1", port=0, tick=0.01,
                      handshake_timeout=5.0)
    silent, talking = Connection(gateway), Connection(gateway)
    closed: list[Any] = []
    for connection in (silent, talking):
        gateway.connections.add(connection)
    silent.close = lambda why: (closed.append(why), setattr(silent, "closing", True))  # type: ignore[method-assign]
    talking.heard = True
    clock[0] = 6.0

    async def one_tick() -> None:
        task = asyncio.ensure_future(gateway.run())
        await asyncio.sleep(0.05)
        task.cancel()

    asyncio.run(one_tick())
    assert closed == ["nothing received within 5 s of connecting"]
    assert gateway.counters["silent"] == 1


# ------------------------------------------------------------------------------------------------ sessions


def test_sessions_without_ttl_are_probed_after_their_silence_and_the_oldest_are_found() -> None:
    sessions = Sessions()
    quiet = sessions.get_or_create(b"quiet", 0.0, 10)
    talking = sessions.get_or_create(b"talking", 0.0, 10)
    timed = sessions.get_or_create(b"timed", 0.0, 10)
    timed.ttl = 30.0
    talking.last_heard = 50.0
    assert sessions.silent(60.0, after=60.0) == [quiet]
    quiet.last_probe = 60.0
    assert sessions.silent(90.0, after=60.0) == []  # probed not long ago
    assert sessions.silent(120.0, after=60.0) == [quiet, talking]
    assert sessions.oldest(2) == [quiet, timed]
