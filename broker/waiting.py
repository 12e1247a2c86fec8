"""Long-poll reads: FETCHes that found nothing new and wait for a commit to bring something, or their time.

A reader at the end of a topic (a streaming query between micro-batches, a follower) would otherwise ask again
and again. A FETCH with ``WAIT`` that finds nothing to read from its FROM on is *parked* here instead of
answered: it is woken when a commit writes its topic (the shell then reads again, and answers if something is
there) or when its wait ends (answered as it is then: empty). Like Kafka's fetch.max.wait.ms.

Bounded: at most ``limit`` clients' waits across the broker (a FETCH beyond it is answered at once, as if it
had asked for no wait), and each at most ``FETCH_MAX_WAIT_MS`` long. Forgetting a gone client's waits frees
their places. A cluster member's replica FETCHes have a bound of their own, which the caller gives (a few
per persistent topic for each other member): answered at once, a follower would ask again at once and the two
brokers would spin, so they must not compete with clients for places; and bounded still, since without
CURVE a member's claim cannot be checked.

Pure bookkeeping, no I/O: time is an argument, and what a wait is *for* (a session, a decoded FETCH) is the
shell's business. This module must not know the engine or the wire.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable
from typing import Any

#: Parked FETCHes across the broker, unless configured (docs/configuration.md, ``max_waiting_fetches``).
DEFAULT_LIMIT = 10_000


class Wait:
    """One parked read: whose (``owner``), for which topic, what (``request``), until when (``deadline``)."""

    __slots__ = ("deadline", "done", "owner", "replica", "request", "seq", "topic")

    def __init__(self, owner: Any, topic: bytes, request: Any, deadline: float, seq: int,
                 replica: bool) -> None:
        self.owner = owner
        self.replica = replica
        self.topic = topic
        self.request = request
        self.deadline = deadline
        self.seq = seq
        self.done = False

    def __lt__(self, other: Wait) -> bool:  # heap order: deadline, then arrival
        return (self.deadline, self.seq) < (other.deadline, other.seq)


class Waits:
    """The parked reads, by topic (woken by commits) and by deadline (woken by time)."""

    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        self.limit = limit
        self.by_topic: dict[bytes, dict[int, Wait]] = {}
        self.by_owner: dict[Any, dict[int, Wait]] = {}
        self._deadlines: list[Wait] = []
        self._seq = itertools.count()
        self.count = 0
        self.replicas = 0  # of count, the cluster members' replica FETCHes
        self.refused = 0  # waits asked beyond the limit (answered at once)

    def park(self, owner: Any, topic: bytes, request: Any, deadline: float,
             replicas: int | None = None) -> bool:
        """Hold ``request`` until its topic is written or ``deadline``; False (nothing held) when full.
        ``replicas``: a cluster member's replica FETCH, under this bound instead of ``limit``."""
        full = self.count - self.replicas >= self.limit if replicas is None else self.replicas >= replicas
        if full:
            self.refused += 1
            return False
        replica = replicas is not None
        self.replicas += replica
        wait = Wait(owner, topic, request, deadline, next(self._seq), replica)
        self.by_topic.setdefault(topic, {})[wait.seq] = wait
        self.by_owner.setdefault(owner, {})[wait.seq] = wait
        heapq.heappush(self._deadlines, wait)
        self.count += 1
        return True

    def _remove(self, wait: Wait) -> None:
        wait.done = True
        self.count -= 1
        self.replicas -= wait.replica
        for index, key in ((self.by_topic, wait.topic), (self.by_owner, wait.owner)):
            waits = index[key]
            del waits[wait.seq]
            if not waits:
                del index[key]

    def woken(self, topics: Iterable[bytes]) -> list[Wait]:
        """The waits on ``topics`` (just written; a topic may be named more than once), taken out, oldest
        first."""
        out: list[Wait] = []
        # Once each: a commit names a topic it wrote and whose cluster gate moved (by each follower) again.
        for topic in dict.fromkeys(topics):
            waits = self.by_topic.get(topic)
            if waits:
                out.extend(waits.values())
        for wait in out:
            self._remove(wait)
        out.sort()
        heap = self._deadlines
        if len(heap) > 2 * self.count + 1024:  # woken waits linger in the heap until popped: sweep them
            self._deadlines = [wait for wait in heap if not wait.done]
            heapq.heapify(self._deadlines)
        return out

    def expired(self, now: float) -> list[Wait]:
        """The waits whose deadline has come, taken out, in deadline order."""
        heap = self._deadlines
        out = []
        while heap and (heap[0].done or heap[0].deadline <= now):
            wait = heapq.heappop(heap)
            if not wait.done:
                self._remove(wait)
                out.append(wait)
        return out

    def next_deadline(self) -> float | None:
        heap = self._deadlines
        while heap and heap[0].done:
            heapq.heappop(heap)
        return heap[0].deadline if heap else None

    def forget(self, owner: Any) -> int:
        """Drop every wait of ``owner`` (gone); returns how many."""
        waits = list(self.by_owner.get(owner, {}).values())
        for wait in waits:
            self._remove(wait)
        return len(waits)
