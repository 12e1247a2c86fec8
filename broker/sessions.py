"""mc0 client sessions and their heartbeat rules, with time as an argument (no clock, no socket).

A session exists for every ROUTER identity we have heard from (the reference brokers create state lazily, so
the first command may be any verb). The broker forgets a client it has heard nothing from for 1.05 x TTL
(the reference brokers' rule), and sends NOOP to a client it has sent nothing to for half its TTL (our
choice: the reference brokers wait 0.95 x TTL, which leaves a client that gives up at 1.05 x TTL a tenth of
its TTL of slack, less than one turn held up by a slow disk or a busy machine; see ``docs/mc0.md``). A client
that gave no TTL never expires.

A client that gave no TTL is not expired by these rules, but it is not kept forever either (our rule, see
``docs/mc0.md``): once nothing has been heard from it for ``session_idle`` seconds it is probed with a NOOP,
and a peer that is gone makes the send fail at once (``ROUTER_MANDATORY``), which drops its session. And the
number of sessions is capped: past ``max_sessions``, the ones heard from longest ago make room.

A session is also the :class:`~broker.hub.Outlet` of its engine subscriber: the hub asks it to deliver, and it
hands the writing to the router shell that owns it.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from broker.engine import Message, Subscriber

if TYPE_CHECKING:
    from broker.router import RouterShell

#: Fractions of the client's TTL. Expiry is the reference brokers' (mc0d.rb and the C++ broker); they send
#: NOOP at 0.95 x TTL, we at half of it, as RabbitMQ sends its heartbeats: a three-broker cluster's clients
#: (TTL 3 s) left a leader whose NOOP a loaded machine delayed by 0.3 s past 0.95 x TTL, and failed a thousand
#: publishes in flight with them.
NOOP_AFTER = 0.5
EXPIRE_AFTER = 1.05
#: Heartbeat checks run at least every 5% of the shortest TTL, so a NOOP leaves between 0.5 and 0.55 x TTL,
#: long before the client's own patience (1.05 x TTL) runs out; never more often than every 2 ms.
TICK_FRACTION = 0.05
MIN_TICK = 0.002


def heartbeat_tick(base: float, ttls: list[float]) -> float:
    """Seconds between heartbeat checks: ``base``, or shorter when a client's TTL needs it."""
    return max(MIN_TICK, min([base, *(ttl * TICK_FRACTION for ttl in ttls)]))


@dataclass(slots=True, eq=False)
class Session:
    #: A ROUTER has no per-peer "writable again" signal: a full pipe is retried on the hub's timer.
    polled: ClassVar[bool] = True

    identity: bytes
    subscriber: Subscriber
    last_heard: float  # seconds, monotonic
    last_sent: float
    door: RouterShell | None = None
    ttl: float | None = None  # seconds
    delimiter: bool = True  # the client frames with the empty delimiter; replies do the same
    batch: bool = False  # extension "batch": deliveries go out as MESSAGES
    ids: bool = False  # extension "ids": MESSAGE carries MESSAGE-ID and TIMESTAMP
    version: bytes | None = None
    commands: int = 0
    last_probe: float = float("-inf")  # when a session without TTL was last probed (see the module docstring)
    # Until when (monotonic) this broker serves nothing that only a leader serves to this client: it named
    # the cluster's leader to it (broker.router.REDIRECTED_FOR).
    redirected_until: float = float("-inf")
    # Replies waiting for room in the client's pipe.
    stalled: deque[list[bytes]] = field(default_factory=deque)

    @property
    def sent_away(self) -> bool:
        """Whether this broker ever named another leader to this client (or sent it away): its connection
        going later is what was asked of it."""
        return self.redirected_until > float("-inf")

    def __hash__(self) -> int:
        return id(self)

    @property
    def attached(self) -> bool:
        """Still the session of its identity (not dropped, and not replaced by a reconnect)."""
        return self.door is not None and self.door.sessions.by_identity.get(self.identity) is self

    @property
    def who(self) -> tuple[str, str]:
        """The door and the client, as the monitoring names a subscriber."""
        return "mc0", self.identity.hex()

    def deliver(self, messages: list[Message], now: float) -> int:
        assert self.door is not None
        sent = self.door.deliver(self, messages, now)
        self.door.counters["messages_out"] += sent
        return sent


class Sessions:
    """Every known client by identity, and the heartbeat decisions over them."""

    def __init__(self, door: RouterShell | None = None) -> None:
        self.door = door
        self.by_identity: dict[bytes, Session] = {}

    def __len__(self) -> int:
        return len(self.by_identity)

    def get_or_create(self, identity: bytes, now: float, subscriber_limit: int) -> Session:
        session = self.by_identity.get(identity)
        if session is None:
            session = Session(identity, Subscriber(identity, subscriber_limit), now, now, self.door)
            session.subscriber.owner = session
            self.by_identity[identity] = session
        return session

    def remove(self, identity: bytes) -> Session | None:
        return self.by_identity.pop(identity, None)

    def silent(self, now: float, after: float) -> list[Session]:
        """Sessions without TTL heard from, and probed, no sooner than ``after`` seconds ago."""
        return [session for session in self.by_identity.values() if session.ttl is None
                and now - session.last_heard >= after and now - session.last_probe >= after]

    def oldest(self, count: int) -> list[Session]:
        """The ``count`` sessions heard from longest ago."""
        return heapq.nsmallest(count, self.by_identity.values(), key=lambda session: session.last_heard)

    def due(self, now: float) -> tuple[list[Session], list[Session]]:
        """Sessions that need a NOOP now, and sessions silent for too long (to be dropped)."""
        noop: list[Session] = []
        expired: list[Session] = []
        for session in self.by_identity.values():
            ttl = session.ttl
            if ttl is None:
                continue
            if now - session.last_heard > EXPIRE_AFTER * ttl:
                expired.append(session)
            elif now - session.last_sent >= NOOP_AFTER * ttl:
                noop.append(session)
        return noop, expired
