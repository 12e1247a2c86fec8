"""The turn every door shares: group commit, then answers, then deliveries, on the one loop thread.

Each door (the mc0 router, every TCP gateway connection) hands what it read to the engine and then calls
:meth:`Hub.flush` (the router, at the end of its own turn) or :meth:`Hub.schedule` (a gateway connection,
from its ``data_received``). A scheduled flush runs on the loop's next iteration, after every socket that was
readable in this one has been read: that is what makes one commit, and one fsync per strong topic, cover all
the doors' traffic of the iteration.

A flush is:

1. :meth:`Engine.commit`: nothing is answered or delivered before what it depends on is as durable as its
   topic promises;
2. each door's :meth:`Door.answer`: replies that had to wait for the commit (an mc0 OK to a PUT);
3. deliveries: :meth:`Engine.pump` and :meth:`Engine.take_ready`, then each ready subscriber's ``owner`` (an
   :class:`Outlet`) writes what it can; the engine hears what went out.

Outlets that cannot take everything come in two kinds. A ZeroMQ ROUTER has no "writable again" signal for
one peer, so a *polled* outlet is retried on a timer that backs off while nothing goes out. An asyncio
transport says when it drained (``resume_writing``); such an outlet calls :meth:`Hub.wake` then and is left
alone until it does.

The hub also runs the periodic work (fsync of weak topics, retention, reclaiming idle transient topics) and
gathers the broker's stats.

A scheduled flush runs as a plain loop callback, and a gateway's ``data_received`` too: an exception there
would only be logged by asyncio, and the broker would go on with, say, a store that failed to fsync. So such
errors go to :meth:`Hub.fail`, and the hub's task raises them: the broker's TaskGroup stops the broker loudly,
as it does for an error in any of its tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from time import perf_counter
from typing import Any, Protocol

from broker.engine import PUMP_BUDGET, Engine, Message, Subscriber
from broker.histogram import COMMIT_MESSAGES, TURN_SECONDS, Histogram
from broker.topics import Sync

#: While a polled outlet is full, write again after this long, doubling (up to ``max_retry``, MAX_RETRY unless
#: given) while no write succeeds.
RETRY_FIRST = 0.001
MAX_RETRY = 0.1


class Outlet(Protocol):
    """What a subscriber's owner offers the hub: a way to write deliveries out."""

    #: True: retried on the hub's timer when full. False: calls :meth:`Hub.wake` when it has room again.
    polled: bool

    @property
    def attached(self) -> bool:
        """Still connected: deliveries it could not take wait for it; a detached one's are handed back."""
        ...

    def deliver(self, messages: list[Message], now: float) -> int:
        """Write ``messages`` in order; return how many went out (the rest stay pending)."""
        ...


class Door(Protocol):
    """One way into the broker: the mc0 router or a TCP gateway."""

    name: str

    def answer(self, now: float) -> bool:
        """Send what had to wait for the commit; True if some of it still waits for room."""
        ...

    def stats(self) -> dict[str, Any]:
        """At least ``connections``; any counters of the door's own."""
        ...


class Hub:
    """Drives the engine's turn for every door, on the loop that owns the engine."""

    def __init__(
        self,
        engine: Engine,
        *,
        weak_sync_interval: float = 2.0,
        retention_interval: float = 1.0,
        topic_idle: float = 60.0,
        max_retry: float = MAX_RETRY,
        monotonic: Callable[[], float] = time.monotonic,
        wall_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        self.engine = engine
        self.doors: list[Door] = []
        # Called at the end of every flush: the mc0 router re-arms its edge-triggered descriptor after sends.
        self.after_flush: list[Callable[[], None]] = []
        # A cluster leader's: called with the gated topics written ahead of their fsync (Engine.write_ahead),
        # before it, so followers copy while the leader fsyncs. Empty on a single broker: nothing is done.
        self.ahead: list[Callable[[list[bytes], float], None]] = []
        self.monotonic = monotonic
        self.wall_ms = wall_ms
        self.max_retry = max_retry
        self.retry = 0.0  # seconds until the next attempt while some polled outlet is full; 0 = none
        self.weak_sync_interval = weak_sync_interval
        self.retention_interval = retention_interval
        # An idle transient topic goes after two sweeps without use: between topic_idle / 2 and topic_idle.
        self.sweep_interval = topic_idle / 2
        self.started = monotonic()
        # The loop that owns the engine. Without one (tests driving flush() by hand) nothing is scheduled.
        self.loop: asyncio.AbstractEventLoop | None = None
        self.closed = False
        self.failure: BaseException | None = None
        self._failed = asyncio.Event()
        #: Figures of the broker's limits, by name, added to stats (descriptors, sessions, ...).
        self.limits: dict[str, Callable[[], dict[str, Any]]] = {}
        #: Checks that say why clients can get nothing done through this broker now (None: they can), for
        #: the monitoring's readiness (a cluster member that knows no leader).
        self.readiness: list[Callable[[], str | None]] = []
        self._scheduled = False
        self._retry_timer: asyncio.TimerHandle | None = None
        # For the monitoring: how long each turn took (a door's read and this flush, or a scheduled flush
        # alone), and how many messages each group commit wrote.
        self.turn_seconds = Histogram(TURN_SECONDS)
        self.commit_messages = Histogram(COMMIT_MESSAGES)

    def add(self, door: Door) -> None:
        self.doors.append(door)

    # ---------------------------------------------------------------------------------------------- the turn

    def schedule(self) -> None:
        """Flush on the loop's next iteration (once, however many doors ask in this one)."""
        if not self._scheduled and self.loop is not None:
            self._scheduled = True
            self.loop.call_soon(self._scheduled_flush)

    def _scheduled_flush(self) -> None:
        self._scheduled = False
        started = perf_counter()
        try:
            self.flush()
        except Exception as error:
            self.fail(error)
        self.turn_seconds.observe(perf_counter() - started)

    def fail(self, error: BaseException) -> None:
        """Stop the broker with ``error``, raised outside any task (see the module docstring)."""
        if self.failure is None:
            self.failure = error
            self._failed.set()

    def wake(self, subscriber: Subscriber) -> None:
        """An outlet that was full has room again: write its pending deliveries soon."""
        self.engine.requeue_ready(subscriber)
        self.schedule()

    def flush(self, now: float | None = None, committed: Callable[[], None] | None = None) -> None:
        """Commit, answer, then deliver everything that is ready (see the module docstring). ``committed``
        runs right after the commit, before anything else the turn sends: a cluster follower's
        acknowledgement of what it copied, which the leader waits for and the rest of the turn need not
        precede."""
        if self.closed:
            return  # a connection lost during shutdown must not touch closed logs
        if now is None:
            now = self.monotonic()
        engine = self.engine
        if self.ahead:
            written = engine.write_ahead()
            if written:
                for early in self.ahead:
                    early(written, now)
        # Before any answer or delivery leaves: acknowledgements must be honest.
        if engine.commit() and engine.last_commit_messages:
            self.commit_messages.observe(engine.last_commit_messages)
        if committed is not None:
            committed()
        waiting = False
        for door in self.doors:
            waiting = door.answer(now) or waiting
        blocked: list[Subscriber] = []
        wrote = 0
        budget = PUMP_BUDGET
        # Writing out can make more deliveries ready in the same turn (a gone consumer's round-robin messages
        # handed to the next one, a backlog moving into freed room, a log reader with room again): loop until
        # nothing new is ready. Full outlets wait for a later turn and log reads are bounded by the turn's
        # budget, so the loop always ends.
        while True:
            if budget > 0:
                budget -= engine.pump(budget)
            ready = engine.take_ready()
            if not ready:
                break
            for subscriber in ready:
                pending = subscriber.pending
                if not pending:
                    continue
                subscriber.pending = []
                outlet: Outlet = subscriber.owner
                sent = outlet.deliver(pending, now)
                if sent < len(pending):
                    subscriber.pending = pending[sent:] + subscriber.pending
                    if not outlet.attached:
                        engine.detach(subscriber)  # its round-robin messages go to the others
                    elif outlet.polled:
                        blocked.append(subscriber)
                subscriber.delivered += sent
                wrote += sent
                if sent:
                    if subscriber.tracking:
                        engine.written(subscriber, pending[:sent] if sent < len(pending) else pending)
                    engine.room_available(subscriber)
        for subscriber in blocked:
            engine.requeue_ready(subscriber)
        if not blocked and not waiting:
            self.retry = 0.0
        elif wrote:
            self.retry = RETRY_FIRST
        else:
            self.retry = min(self.max_retry, self.retry * 2 or RETRY_FIRST)
        self._arm_retry()
        if engine.has_log_work:
            # The pump spent its whole budget: more waits in the logs for readers with room. Come back after
            # the sockets have had their turn.
            self.schedule()
        for callback in self.after_flush:
            callback()

    def _arm_retry(self) -> None:
        if self._retry_timer is not None:
            self._retry_timer.cancel()
            self._retry_timer = None
        if self.retry and self.loop is not None:
            self._retry_timer = self.loop.call_later(self.retry, self.schedule)

    # -------------------------------------------------------------------------------------- periodic work

    async def run(self) -> None:
        """The store's periodic work, until cancelled: weak topics are fsynced every few seconds, retention
        is enforced every ``retention_interval``."""
        engine = self.engine
        next_weak_sync = self.monotonic() + self.weak_sync_interval
        next_retention = self.monotonic() + self.retention_interval
        next_sweep = self.monotonic() + self.sweep_interval
        try:
            while True:
                delay = max(0.0, min(next_weak_sync, next_retention, next_sweep) - self.monotonic())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._failed.wait(), delay)
                if self.failure is not None:
                    raise self.failure
                now = self.monotonic()
                if now >= next_weak_sync:
                    engine.sync(Sync.WEAK)  # weak: written before delivery, fsynced every few seconds
                    next_weak_sync = now + self.weak_sync_interval
                if now >= next_retention:
                    engine.enforce_retention(self.wall_ms())
                    next_retention = now + self.retention_interval
                    self.schedule()  # retention can move a queue's position: let it deliver
                if now >= next_sweep:
                    engine.sweep()
                    next_sweep = now + self.sweep_interval
        finally:
            self.close()

    def close(self) -> None:
        """No more turns: the broker is stopping and the engine is about to close its logs."""
        self.closed = True
        self.loop = None
        if self._retry_timer is not None:
            self._retry_timer.cancel()
            self._retry_timer = None

    # -------------------------------------------------------------------------------------------------- stats

    def stats(self) -> dict[str, Any]:
        """The broker's stats: uptime, connections and counters per door, and every topic."""
        return self._stats(self.engine.stats())

    def stats_page(self, prefix: bytes = b"", after: bytes | None = None,
                   limit: int = 1000) -> dict[str, Any]:
        """:meth:`stats` with one page of topics (Engine.topic_page): a bounded slice of the loop whatever the
        number of topics. ``topics_next`` names the topic to ask after for the next page (None: no more);
        ``topics_total`` counts every topic."""
        page, following = self.engine.topic_page(prefix, after, limit)
        out = self._stats({topic.name.decode("utf-8", "replace"): topic.stats() for topic in page})
        out["topics_total"] = len(self.engine.topics)
        if self.engine.unavailable:  # found on disk, but their logs cannot be opened: said with why
            out["unavailable"] = {name.decode("utf-8", "replace"): why
                                  for name, why in self.engine.unavailable.items()}
        # surrogateescape: a name that is not UTF-8 still comes back exactly (JSON escapes the surrogates).
        out["topics_next"] = None if following is None else following.decode("utf-8", "surrogateescape")
        return out

    def _stats(self, topics: dict[str, Any]) -> dict[str, Any]:
        doors = {door.name: door.stats() for door in self.doors}
        out = {
            "uptime_seconds": round(self.monotonic() - self.started, 3),
            "connections": {name: door["connections"] for name, door in doors.items()},
            "doors": doors,
            "topics": topics,
        }
        if self.limits:
            out["limits"] = self.limit_figures()
        return out

    def limit_figures(self) -> dict[str, dict[str, Any]]:
        """Every figure of :attr:`limits`, taken now (STATS and the monitoring show the same)."""
        return {name: figures() for name, figures in self.limits.items()}

    def unready(self) -> str | None:
        """The first reason of :attr:`readiness` that applies now, or None."""
        return next((why for check in self.readiness if (why := check()) is not None), None)
