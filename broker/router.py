"""The mc0 door: a ZeroMQ ROUTER socket glued to the engine. A thin shell: the codec decides what frames
mean, the engine decides where messages go, this module moves frames and keeps per-client session state.

One turn of the loop: wait until the socket is readable (or a heartbeat tick is due), take up to
``recv_budget`` commands without blocking, handle them all, then run the hub's flush (:mod:`broker.hub`): the
engine's group commit first (one write, and one fsync per strong topic, for everything the turn published),
then this door's replies (in arrival order, :meth:`RouterShell.answer`), then every delivery the turn
produced, batched per client. So an OK for a persistent PUT is only sent once its topic's sync level is met,
and nothing is delivered before it is as durable as its topic promises. Batching per turn is what lets one
Python process keep up with C brokers, and what makes one fsync cover many messages.

A FETCH reads a persistent topic's log, so it is answered in the same step as the other replies, after the
commit: its reply is built when its turn in its client's reply order comes (:class:`_FetchReply` holds the
place), never from data the turn has not yet written. Building is bounded per turn (``FETCH_TURN_BYTES`` and
``FETCH_TURN_MESSAGES``): the rest wait, in order with every later reply to their clients, for the next turn,
which comes after the socket has been read again, so a crowd of readers cannot hold the loop, or gigabytes,
for long.

A persistent topic costs fsyncs to make (its directory, its meta file: milliseconds), so a turn makes a few
(``CREATES_PER_TURN``, or ``CREATE_SECONDS_PER_TURN`` of them) and then lets the others have the loop. A PUTS
naming more new persistent topics than that waits while they are made, a few each turn (:class:`_Making`); its
client's later commands wait behind it, in order, and every other client goes on meanwhile. One command naming
hundreds of new topics used to hold the loop for seconds: heartbeats unanswered, a cluster leader's Raft
unattended.

A FETCH with ``WAIT`` that finds nothing past its FROM leaves its client's reply order and waits
(:mod:`broker.waiting`) until a commit writes its topic or its wait ends; it is answered then, in the step
after the commit like any FETCH, and may overtake replies to its client's later commands.

Sends use ``ROUTER_MANDATORY`` so that a message to a vanished peer raises instead of vanishing: the peer's
session and subscriptions are then dropped. A peer whose pipe is full (``EAGAIN``) keeps its deliveries
pending (bounded by the engine): sessions are *polled* outlets, retried on the hub's backing-off timer.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import itertools
import json
import logging
import math
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import repeat
from time import perf_counter
from typing import Any, Protocol

import msgpack
import zmq

from broker.config import ConfigError, declared_spec
from broker.engine import EngineError, Message, RangeRead
from broker.hub import Hub
from broker.sessions import Session, Sessions, heartbeat_tick
from broker.store.making import MAKE_AHEAD
from broker.waiting import DEFAULT_LIMIT, Wait, Waits
from broker.zmtp_door import PeerMetadata, ZmtpDoor
from connector.zsock import Again, readable, recv_routed, send_to
from protocol import ProtocolError, mc0
from protocol.bodies import TopicBodies, entry_topics

log = logging.getLogger("mc0.router")

#: Why a client that said DISCONNECT was dropped (the one reason that is not worth an INFO line).
DISCONNECTED = "disconnected"

#: Replies held for a client whose pipe is full before the client counts as not reading at all.
MAX_STALLED_REPLIES = 10_000

#: Deliveries packed into one MESSAGES frame at most (bounds the frame and the subscriber's decode step).
BATCH_MAX_MESSAGES = 1024
BATCH_MAX_BYTES = 1 << 20

#: What FETCH replies may read per turn: body bytes (two replies at the 16 MiB cap) and messages (the order of
#: the engine's log-reading budget per turn, so fetches and replay get similar shares of the loop). The reply
#: that crosses a bound is still built; the ones after it wait for the next turn, which comes once the socket
#: has been read again. So each turn answers at least one FETCH, and none holds the loop for long.
FETCH_TURN_BYTES = 32 << 20
FETCH_TURN_MESSAGES = 16_384

#: The frames in front of a MESSAGES payload, for clients framing with the empty delimiter and without.
_BATCH_HEAD = [b"", b"MESSAGES", b""]
_BATCH_HEAD_BARE = [b"MESSAGES", b""]
_pack_batch = msgpack.Packer(use_bin_type=True).pack

#: Commands of one client held behind its command that waits for its new topics; past it, each is refused.
MAX_HELD_COMMANDS = 1_000

#: Weakest first: a batch over several topics promises what its weakest topic achieved.
DURABILITY_RANK = {b"memory": 0, b"written": 1, b"fsync": 2}


#: Seconds a cluster member refuses what only a leader serves from a client it named the leader to (the OK to
#: its CONNECT, a refusal, or being sent away), even if it leads meanwhile. The connector relies on it: a
#: command it had in flight there was not stored, and goes to the leader (docs/cluster.md, "On the wire").
#: What is in flight arrives within milliseconds; the connector's next connection has another identity.
REDIRECTED_FOR = 10.0

class ClusterGate(Protocol):
    """What a cluster (:mod:`broker.cluster`) decides for this door; absent on a single broker."""

    commit_timeout: float

    def refusal(self, event: mc0.Event, redirected: bool) -> mc0.Error | None:
        """An ERROR (with LEADER) for a command this broker must not serve now, or None; ``redirected``: this
        client was named the leader lately (REDIRECTED_FOR)."""
        ...

    def leader(self) -> bytes | None:
        """The leader's mc0 endpoint when this broker does not lead (the OK to CONNECT names it), or None."""
        ...

    def replica_fetch(self, event: mc0.Fetch, peer: zmq.Frame | PeerMetadata | None) -> bool:
        """A cluster member's FETCH (``peer``: its message's identity frame, whose metadata says who sent it):
        record what it acknowledges; whether that brought more messages onto a majority. EngineError to refuse
        it."""
        ...

    def deleted(self, topic: bytes, incarnation: bytes | None, done: Callable[[str | None], None]) -> bool:
        """This broker deleted ``topic`` (its log's ``incarnation``, if it had one): True when the cluster
        records that and calls ``done`` (None, or why it could not) once it did; False when it has nothing
        to record (not leading, or a topic it never replicated)."""
        ...

    def replica_waits(self) -> int:
        """How many replica FETCHes may wait at once: a few per topic for each other member."""
        ...

    def replica_extra(self, topic: bytes, start: int, count: int, known: bytes | None) -> dict[bytes, bytes]:
        """Headers a replica's FETCH reply carries besides the records (LINEAGE, PRODUCERS); ``known`` is the
        incarnation the FETCH named."""
        ...

    def confirm(self, needs: dict[bytes, int], now: float, deadline: float) -> bool | str:
        """Whether an OK for messages up to ``needs`` (topic -> last id) may go: True, False (wait), or the
        text of the ERROR it becomes."""
        ...

    def unstored_retry_ms(self, name: bytes) -> int | None:
        """RETRY-AFTER for a publish this turn's commit could not store in ``name`` when that failure makes
        this leader hand the cluster over (the publish goes to the next leader); None when it is final."""
        ...


@dataclass(slots=True)
class _Held:
    """A confirmed publish's OK held until a majority of the cluster holds its messages (or it times out)."""

    frames: mc0.Frames
    needs: dict[bytes, int]  # topic -> the last id the OK covers
    deadline: float
    command_id: bytes | None
    delimiter: bool


class _TopicsToMake(Exception):
    """Raised by dispatch before a command does anything: it names more new persistent topics than the turn
    may still make, or than the loop should build itself (``unmade``, in the order the command names them)."""

    def __init__(self, unmade: list[bytes]) -> None:
        super().__init__()
        self.unmade = unmade


@dataclass(slots=True)
class _Making:
    """A client's command waiting while the persistent topics it names are made, a few each turn, and the
    commands the client sent after it, held in order: each ``(event, frames)``, the waiting one first."""

    unmade: deque[bytes]
    commands: deque[tuple[mc0.Event, list[bytes]]]


@dataclass(slots=True)
class _FetchReply:
    """The place of a FETCH's reply in its client's reply order, until the reply is built (after a commit)."""

    event: mc0.Fetch
    delimiter: bool  # the client's framing when it asked


#: What waits to be sent to a client: encoded frames, a FETCH reply still to be read from the log, or an OK
#: held for a cluster's majority.
Reply = mc0.Frames | _FetchReply | _Held
#: What building a FETCH reply may give instead of frames: it waits for a commit (see broker.waiting).
PARKED: mc0.Frames = []


def _names(event: mc0.Event) -> Iterable[bytes]:
    """The topics a command publishes or subscribes to."""
    match event:
        case mc0.Put(topic=topic):
            return (topic,)
        case mc0.Puts(items=items):
            return entry_topics(items)
        case mc0.Sub(topics=topics):
            return topics
    return ()


class RouterShell:
    """Speaks mc0 on one ROUTER socket on behalf of the engine: the door called ``mc0``."""

    name = "mc0"

    def __init__(
        self,
        hub: Hub,
        socket: zmq.Socket,
        *,
        recv_budget: int = 8192,
        pending_limit: int = 100_000,
        tick: float = 0.1,
        max_waiting_fetches: int = DEFAULT_LIMIT,
        session_idle: float = 60.0,
        max_sessions: int = 100_000,
        wire: ZmtpDoor | None = None,
    ) -> None:
        self.hub = hub
        self.engine = hub.engine
        self.socket = socket
        # The same libzmq socket without the asyncio layer: non-blocking drains and sends cost no futures.
        self.raw = zmq.Socket.shadow(socket.underlying)
        # Where commands come from and replies go: libzmq's ROUTER, or the broker's own ZMTP engine
        # (mc0_engine = "native", broker/zmtp_door.py), which answers the same three calls.
        self.wire = wire
        self._readable: Callable[[], bool]
        self._receive: Callable[[], tuple[list[bytes], zmq.Frame | PeerMetadata | None]]
        self._transmit: Callable[[bytes, list[bytes]], None]
        if wire is None:
            self._readable = functools.partial(readable, self.raw)
            self._receive = functools.partial(recv_routed, self.raw)
            self._transmit = functools.partial(send_to, self.raw)
        else:
            self._readable, self._receive, self._transmit = wire.readable, wire.receive, wire.send
        self.sessions = Sessions(self)
        self.recv_budget = recv_budget
        self.pending_limit = pending_limit
        self.session_idle = session_idle  # sessions without TTL silent this long are probed (sessions.py)
        self.max_sessions = max_sessions
        self.next_probe = hub.monotonic() + session_idle / 8
        self.base_tick = tick
        self.tick = tick
        self.monotonic = hub.monotonic
        self.wall_ms = hub.wall_ms
        self.replies: list[tuple[Session, Reply]] = []
        # Clients with replies waiting for room in their pipe (or, for FETCH replies, for a later turn; in a
        # cluster, behind an OK held for a majority). Their ``stalled`` queues hold Reply items: frames,
        # _FetchReply places not yet built, or _Held OKs.
        self.stalled: set[Session] = set()
        self.loop: asyncio.AbstractEventLoop | None = None
        self._turn_scheduled = False
        self._sent = False  # sent on the socket since the descriptor was last re-armed (see _recheck)
        # Who sent the command being handled: libzmq's identity frame, or the native engine's metadata.
        self.peer: zmq.Frame | PeerMetadata | None = None
        self.receive_exhausted = False  # the last receive() stopped at its budget, not at an empty socket
        self.end_turn = False  # a command asks for the flush before anything more is read
        # Clients whose command waits for its new persistent topics (in the order they began to wait), and
        # where this turn's making of new logs began (Engine.made_enough).
        self.making: dict[Session, _Making] = {}
        self._creation_mark = (0, 0.0)
        self._may_wait = True  # False while a command whose topics were made runs: it waits no more
        self._heartbeat_timer: asyncio.TimerHandle | None = None
        self._heartbeat_due = math.inf  # when the heartbeat timer should fire next (monotonic)
        # What FETCH replies may still read this turn (see FETCH_TURN_BYTES), and whether some had to wait.
        self.fetch_bytes = FETCH_TURN_BYTES
        self.fetch_messages = FETCH_TURN_MESSAGES
        self.fetch_deferred = False
        # FETCHes waiting for a commit or their time; those woken but not yet answered (the turn's budget).
        self.waits = Waits(max_waiting_fetches)
        self.woken: deque[Wait] = deque()
        # One timer for the next time-driven answer: a wait's end or a held OK's deadline (see _arm_timer).
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        # During answer(): whether a reply met a full pipe (retried on the hub's backing-off timer), and the
        # earliest deadline of an OK held for a majority (answered by the turn that takes the majority's
        # acknowledgement, or as an ERROR by the timer).
        self._pipe_full = False
        self._held_until: float | None = None
        # Confirmed publishes of this turn (the place of their OK in ``replies``, the command, and for a PUTS
        # CONFIRM each its results): their OK becomes an ERROR (an entry's result an error) if the commit
        # could not store a topic they went to (Engine.failed).
        self.confirming: list[tuple[int, mc0.Put | mc0.Puts, list[mc0.Confirmation] | None]] = []
        # A cluster's decisions (None: a single broker), and per confirmed publish of this turn the last id it
        # wrote in each topic (what its OK waits for in a cluster).
        self.cluster: ClusterGate | None = None
        self.needs: list[dict[bytes, int]] = []
        # messages_*: published through this door, and deliveries written to its clients; bytes_*: the last
        # frame of each frame set read from and sent to them, the payload (a body, a batch), which is nearly
        # all of the bytes; the verb and header frames are not counted (what the monitoring shows per door).
        self.counters = {"commands": 0, "errors": 0, "expired": 0, "unreachable": 0, "blocked": 0,
                         "fetches": 0, "probed": 0, "evicted": 0, "messages_in": 0, "messages_out": 0,
                         "bytes_in": 0, "bytes_out": 0}

    # ----------------------------------------------------------------------------------------------- the loop

    async def run(self) -> None:
        """Serve until cancelled: a turn each time the socket's descriptor says commands wait, and the
        heartbeat on a timer. A failure inside a turn stops the broker through :meth:`Hub.fail`."""
        loop = asyncio.get_running_loop()
        self.loop = loop
        fd = None
        if self.wire is None:
            fd = self.raw.getsockopt(zmq.FD)
            loop.add_reader(fd, self._turn)
        else:
            self.wire.wake = self._schedule_turn  # the connections call it when messages arrive
            # A connection that was full has room again: write what waits for it now. (libzmq signals no
            # such thing for a pipe: under it the hub's retry timer, 1 ms doubling to 100 ms, comes back.)
            self.wire.writable = self.hub.schedule
            await self.wire.start()
        self._heartbeat_due = self.monotonic() + self.tick
        self._heartbeat_timer = loop.call_later(self.tick, self._heartbeat_turn)
        self.hub.after_flush.append(self._recheck)
        self._schedule_turn()  # commands may be waiting already: the descriptor only signals changes
        try:
            await loop.create_future()  # never set: the turns run as the loop's reader callbacks
        finally:
            if fd is not None:
                loop.remove_reader(fd)
            self._heartbeat_timer.cancel()
            with contextlib.suppress(ValueError):
                self.hub.after_flush.remove(self._recheck)

    def _turn(self) -> None:
        """One turn: take what is readable (up to the budget), then the hub's flush: commit, answers,
        deliveries. Runs as the reader callback of the socket's descriptor, one loop wake-up per turn."""
        self._turn_scheduled = False
        try:
            now = self.monotonic()
            started = perf_counter()
            if self.receive(now):
                # At once, not scheduled: a turn's answers and deliveries leave in the same loop iteration.
                self.hub.flush(now)
                self.hub.turn_seconds.observe(perf_counter() - started)
            else:
                self._sent = False  # receive() just asked: the descriptor is armed again
            if self.making and self._may_make():
                self._schedule_turn()  # the next few topics are made on the next loop iteration
        except Exception as error:  # a store failure: the broker stops loudly, not the loop quietly
            self.hub.fail(error)

    def _recheck(self) -> None:
        """After sends: ``zmq.FD`` is edge-triggered, and a send may have taken in commands that arrived
        meanwhile, consuming the edge the reader waits for. Ask once; if commands wait, come back for them on
        the next loop iteration (which also leaves room for the other doors when one client floods us)."""
        if self._sent or self.receive_exhausted:
            self._sent = False
            self.receive_exhausted = False
            if not self._turn_scheduled and self._readable():
                self._schedule_turn()

    def _schedule_turn(self) -> None:
        if not self._turn_scheduled and self.loop is not None:
            self._turn_scheduled = True
            self.loop.call_soon(self._turn)

    def _heartbeat_turn(self) -> None:
        now = self.monotonic()
        # Held up longer than a tick (a long turn, a slow disk), the loop has not read what clients sent
        # meanwhile: this turn drops nobody, the next judges them by what they did send.
        held_up = now - self._heartbeat_due > self.tick
        try:
            self.heartbeat(now, expire=not held_up)
            # An expired round-robin consumer's messages went to others: send them now, not a tick later.
            self.hub.flush(now)
        except Exception as error:
            self.hub.fail(error)
        self._heartbeat_due = now + self.tick
        if self.loop is not None:
            self._heartbeat_timer = self.loop.call_later(self.tick, self._heartbeat_turn)

    def receive(self, now: float) -> int:
        """Take commands without blocking until the socket is dry or the turn's budget is spent.

        The budget counts messages, not frame sets: one PUTS frame may carry a thousand messages, and a turn
        that took too many would overflow the subscribers' pending bounds before the flush that empties them.
        """
        ready, take = self._readable, self._receive
        wall = self.wall_ms()
        budget = self.recv_budget
        taken = 0
        # Asking before each read costs a getsockopt; reading until zmq.Again would cost an exception object
        # (and pyzmq's errno enum) at the end of every turn, several times more.
        size = 0
        engine = self.engine
        mark = self._creation_mark = engine.creation_mark()
        if self.making:
            taken = self._make_topics(wall)
        while taken < budget:
            if not ready():
                break
            frames, self.peer = take()
            size += len(frames[-1])  # the payload: a summing of every frame cost 8x as much per message
            made = engine.logs_created
            taken += self.handle(frames, now, wall)
            if engine.logs_created != made and engine.made_enough(mark):
                self.end_turn = True  # new topics cost fsyncs: the other clients get their turn first
            if self.end_turn:
                self.end_turn = False
                self.receive_exhausted = True  # more may wait: the flush's recheck comes back for it
                break
        else:
            self.receive_exhausted = True
        self.counters["bytes_in"] += size
        return taken

    # ---------------------------------------------------------------------------------------------- commands

    def handle(self, frames: list[bytes], now: float, wall: int) -> int:
        """One command from one peer (``frames[0]`` is the ROUTER identity); returns its message count."""
        identity = frames[0]
        session = self.sessions.get_or_create(identity, now, self.pending_limit)
        if len(self.sessions) > self.max_sessions:
            self._make_room(session)
        session.last_heard = now
        session.commands += 1
        self.counters["commands"] += 1
        body = frames[1:]
        if body:
            session.delimiter = body[0] == b""
        try:
            event = mc0.decode(body)
        except ProtocolError as error:
            self.refuse(session, error, body)
            return 1
        if self.making and session in self.making:
            self._wait_behind(session, event, body)
            return 1
        return self._run(session, event, body, wall)

    def _run(self, session: Session, event: mc0.Event, body: list[bytes], wall: int) -> int:
        """Dispatch one decoded command, its errors answered; returns its message count."""
        try:
            self.dispatch(session, event, wall)
        except ProtocolError as error:
            self.refuse(session, error, body)
        except EngineError as error:
            self.counters["errors"] += 1
            self.reply(session, mc0.Error(str(error).encode(), getattr(event, "id", None)))
        except _TopicsToMake as making:
            waiting = self.making[session] = _Making(deque(making.unmade), deque([(event, body)]))
            self._make_ahead(waiting)
            return 1
        # An empty PUTS still counts: the budget must run out even for a peer flooding empty batches.
        return max(1, len(event.items)) if type(event) is mc0.Puts else 1

    def _wait_behind(self, session: Session, event: mc0.Event, body: list[bytes]) -> None:
        """``session`` has a command waiting for its topics: this one waits behind it (bounded)."""
        held = self.making[session].commands
        if len(held) <= MAX_HELD_COMMANDS:
            held.append((event, body))
            # Its new topics are built ahead too, meanwhile (as many as the store takes): a client pipelining
            # publishes to new topics has them built two at a time, not one a turn once its turn comes.
            self.engine.make_ahead_of(_names(event), self._made_ahead)
            return
        self.counters["errors"] += 1
        self.reply(session, mc0.Error(
            f"refused: {MAX_HELD_COMMANDS} commands of this client already wait behind one whose new topics "
            "are being made; send it again once that one is answered".encode(), getattr(event, "id", None)))

    def _make_topics(self, wall: int) -> int:
        """Make what this turn may of the topics waiting commands name, each once the store has made its log
        ahead in its threads (:meth:`Engine.make_ahead`: the next ``MAKE_AHEAD`` a command names are being
        made while the loop goes on); run each command whose topics all exist now, then what its client sent
        after it. Returns the messages run."""
        engine = self.engine
        here = self.sessions.by_identity
        taken = 0
        for session, making in list(self.making.items()):
            unmade = making.unmade
            self._make_ahead(making)
            while unmade and not engine.made_enough(self._creation_mark) and engine.ready(unmade[0]):
                with contextlib.suppress(EngineError):  # the command, run, refuses what cannot be made
                    engine.topic(unmade.popleft())
            if unmade:
                if engine.made_enough(self._creation_mark):
                    break  # the turn made what it may: the next one goes on
                continue  # its next topic is still being made: the maker's call brings the next turn
            del self.making[session]
            commands = making.commands
            self._may_wait = False  # a topic still missing could not be made: the command says so
            try:
                while commands and here.get(session.identity) is session:
                    event, body = commands.popleft()
                    taken += self._run(session, event, body, wall)
                    self._may_wait = True
                    if session in self.making:  # a later command waits for topics of its own
                        self.making[session].commands.extend(commands)
                        break
            finally:
                self._may_wait = True
        return taken

    def _make_ahead(self, making: _Making) -> None:
        """Have the store make the next topics ``making`` waits for in its threads, as many as it takes."""
        make_ahead = self.engine.make_ahead
        for name in itertools.islice(making.unmade, MAKE_AHEAD):
            make_ahead(name, self._made_ahead)

    def _may_make(self) -> bool:
        """Whether a command waiting for topics can go on now (the next topic it needs is made ahead, or
        not being made ahead at all), rather than when a maker thread calls :meth:`_made_ahead`."""
        ready = self.engine.ready
        return any(not making.unmade or ready(making.unmade[0]) for making in self.making.values())

    def _made_ahead(self) -> None:
        """From a maker thread: a topic's log is made; the loop's next turn goes on with what waits for it."""
        if self.loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: the broker is stopping
                self.loop.call_soon_threadsafe(self._schedule_turn)

    def _check_entries(self, items: list[tuple[bytes, bytes, mc0.Headers]]) -> None:
        """_TopicsToMake if a PUTS's entries name new persistent topics this turn should not make (see
        :meth:`_check_topics`)."""
        if type(items) is TopicBodies:
            self._check_topic(items.topic)
            return
        topics = self.engine.topics
        for item in items:
            if item[0] not in topics:  # a new one: the whole batch is looked at
                self._check_topics(item[0] for item in items)
                return

    def _check_topic(self, name: bytes) -> None:
        """The same for a command naming one topic (the common case: a topic that exists costs a lookup)."""
        if name not in self.engine.topics:
            self._check_topics((name,))

    def _check_topics(self, names: Iterable[bytes]) -> None:
        """_TopicsToMake if the command names more new persistent topics than this turn may still make, or
        more than one whose directory the loop would build itself (one not made ahead), or one such after
        the turn has made a topic already: those wait while the store's threads build them, so that the loop
        builds at most one directory a turn (a client's first publish to a new topic stays as quick as
        before, and a burst of publishes to new topics no longer holds every other client for several fsyncs
        a turn)."""
        if self._may_wait:
            engine = self.engine
            unmade = engine.unmade_logs(names)
            if unmade and (not engine.room_to_make(self._creation_mark, len(unmade))
                           or self._would_build(unmade)):
                raise _TopicsToMake(unmade)

    def _would_build(self, unmade: list[bytes]) -> bool:
        """Whether creating ``unmade`` now would build more directories on the loop than one a turn, when the
        store could build them ahead (it is asked to here); a store that makes nothing ahead builds them here,
        as before."""
        engine = self.engine
        built = [name for name in unmade if not engine.made_ahead(name)]
        if not built or (len(built) == 1 and engine.logs_created == self._creation_mark[0]):
            return False
        for name in built:
            engine.make_ahead(name, self._made_ahead)
        return not all(engine.ready(name) for name in built)  # some are being built, in the store's threads

    def dispatch(self, session: Session, event: mc0.Event, wall: int) -> None:
        engine = self.engine
        if self.cluster is not None:
            refusal = self.cluster.refusal(event, session.redirected_until > session.last_heard)
            if refusal is not None:
                self.counters["errors"] += 1
                if mc0.LEADER in refusal.headers:
                    session.redirected_until = session.last_heard + REDIRECTED_FOR
                self.reply(session, refusal)
                return
        match event:
            case mc0.Put(topic, body, command_id, headers):
                self._check_topic(topic)
                message = engine.publish(topic, body, headers, wall)
                self.counters["messages_in"] += 1
                if command_id is not None:
                    self.ok(session, command_id, self._published(session, message, (topic,)))
                    self.confirming.append((len(self.replies) - 1, event, None))
                    self._need(event)
            case mc0.Puts(items=items, id=command_id, confirm_each=True):
                assert command_id is not None  # the codec refuses CONFIRM each without an ID
                self._check_entries(items)
                results = self._publish_each(items, wall)
                self.reply(session, mc0.confirms_ok(command_id, results))
                self.confirming.append((len(self.replies) - 1, event, results))
                self._need(event)
            case mc0.Puts(items, command_id, _, producer, sequence) if producer is not None and items:
                # Idempotent: entries this producer already stored in the topic are skipped (a prefix).
                topic = items[0][0]
                last, duplicates = engine.publish_idempotent(topic, items, producer, sequence or 0, wall)
                self.counters["messages_in"] += len(items) - duplicates
                if command_id is not None:
                    extra = {b"COUNT": b"%d" % (len(items) - duplicates), mc0.DUPLICATES: b"%d" % duplicates}
                    if last is not None:
                        extra.update(self._published(session, last, (topic,)))
                    self.ok(session, command_id, extra)
                    self.confirming.append((len(self.replies) - 1, event, None))
                    self._need(event)
            case mc0.Puts(items, command_id):
                # The codec checked every entry before this line: a batch is refused whole or published whole.
                self._check_entries(items)
                last = engine.publish_batch(items, wall)
                self.counters["messages_in"] += len(items)
                if command_id is not None:
                    extra = {b"COUNT": b"%d" % len(items)}
                    if last is not None:
                        extra.update(self._published(session, last, entry_topics(items)))
                    self.ok(session, command_id, extra)
                    self.confirming.append((len(self.replies) - 1, event, None))
                    self._need(event)
            case mc0.Noop(command_id):
                if command_id is not None:
                    self.ok(session, command_id)
            case mc0.Sub(topics, command_id, _, replay, resume, credit, explicit_acks, incarnation):
                for topic in topics:  # refused whole: check every topic before subscribing to any
                    engine.check_subscribe(topic, replay)
                self._check_topics(topics)
                next_ids = []
                starts = []
                for topic in topics:
                    start = resume
                    if resume is not None and incarnation is not None:
                        # The client read another log than this topic's now: resume where the two still agree.
                        start = engine.resume_point(topic, resume, incarnation)
                    next_ids.append(engine.subscribe(session.subscriber, topic, replay=replay, resume=start,
                                                     credit=credit, explicit_acks=explicit_acks).next_id)
                    starts.append(start)
                if command_id is not None:
                    # With "ids": where each topic stood, so a client that sees nothing before it reconnects
                    # can still resume from the moment it subscribed; and which log each topic is.
                    extra = None
                    if session.ids:
                        extra = {mc0.NEXT_IDS: b" ".join(b"%d" % n for n in next_ids),
                                 mc0.INCARNATIONS: b" ".join(engine.incarnation(topic) or mc0.NO_INCARNATION
                                                             for topic in topics)}
                        if resume is not None:
                            extra[mc0.START_IDS] = b" ".join(b"%d" % start for start in starts)
                    self.ok(session, command_id, extra)
            case mc0.Ack(topic, message_ids, command_id):
                unknown = engine.ack(session.subscriber, topic, message_ids)
                if command_id is not None:
                    if unknown:
                        shown = " ".join(str(message_id) for message_id in unknown[:20])
                        raise EngineError(f"not in flight to this subscriber (acked already, or redelivered "
                                          f"elsewhere): {shown}")
                    self.ok(session, command_id)
            case mc0.Declare(topic, settings, command_id):
                try:
                    spec = declared_spec(settings)
                except ConfigError as error:
                    raise EngineError(str(error)) from None
                engine.declare(topic, spec)
                if command_id is not None:
                    self.ok(session, command_id)
            case mc0.Unsub(topics, command_id):
                for topic in topics:
                    engine.unsubscribe(session.subscriber, topic)
                if command_id is not None:
                    self.ok(session, command_id)
            case mc0.Connect(version, ttl, command_id, extensions):
                session.version = version
                session.ttl = None if ttl is None else ttl / 1000
                session.batch = mc0.EXT_BATCH in extensions
                session.ids = mc0.EXT_IDS in extensions
                if session.ttl is not None:
                    self.tick = heartbeat_tick(self.tick, [session.ttl])
                if command_id is not None:
                    extra = {mc0.EXTENSIONS: " ".join(sorted(extensions)).encode()} if extensions else {}
                    leader = self.cluster.leader() if self.cluster is not None else None
                    if leader is not None:
                        extra[mc0.LEADER] = leader  # a cluster's follower: the client may go there at once
                        session.redirected_until = session.last_heard + REDIRECTED_FOR
                    self.ok(session, command_id, extra)
            case mc0.Disconnect(command_id):
                if command_id is not None:
                    self.ok(session, command_id)
                self.drop(session, DISCONNECTED)
            case mc0.Fetch(id=command_id):
                if command_id is None:  # the codec refuses it too; a door handing us events might not
                    raise ProtocolError("FETCH needs an ID to answer to")
                if event.replica is not None:
                    if self.cluster is None:
                        raise EngineError("this broker is not in a cluster: REPLICA fetches go to cluster "
                                          "members")
                    if self.cluster.replica_fetch(event, self.peer) and self.stalled:
                        # A majority for OKs that may be held: they leave with a flush now, not after
                        # whatever else is readable (the other followers' FETCHes, more publishes).
                        self.end_turn = True
                # Answered after the commit (answer()), in this reply's place: see _FetchReply.
                self.replies.append((session, _FetchReply(event, session.delimiter)))
            case mc0.Stats(command_id, _, prefix, after, limit):
                if command_id is None:
                    raise ProtocolError("STATS needs an ID to answer to")
                limit = mc0.STATS_DEFAULT_TOPICS if limit is None else min(limit, mc0.STATS_MAX_TOPICS)
                stats = self.hub.stats_page(prefix, after, limit)
                body = json.dumps(stats, sort_keys=True).encode()
                self.reply(session, mc0.Ok(command_id, {b"CONTENT-TYPE": b"application/json"}, body))
            case mc0.Delete(topic, command_id):
                incarnation = engine.incarnation(topic)
                found = engine.delete(topic)
                if found:
                    self.woken.extend(self.waits.woken((topic,)))  # readers of that log: answered now
                # A cluster's OK waits until Raft's log says every member deletes its copy.
                recorded = self.cluster is not None and self.cluster.deleted(
                    topic, incarnation, lambda why: self._deleted(session, command_id, why))
                if not (found or recorded):
                    raise EngineError(f"no topic {topic.decode('utf-8', 'replace')!r} to delete")
                if command_id is not None and not recorded:
                    self.ok(session, command_id)
            case mc0.Message() | mc0.Messages() | mc0.Ok() | mc0.Error():
                verb = type(event).__name__.upper()
                raise ProtocolError(f"{verb} is sent by the broker, not by clients",
                                    command_id=getattr(event, "id", None))

    def _need(self, event: mc0.Put | mc0.Puts) -> None:
        """In a cluster: the last id a confirmed publish wrote in each of its topics (taken right after it, so
        the topic's newest id is this command's)."""
        if self.cluster is None:
            return
        topics = self.engine.topics
        self.needs.append({name: topics[name].next_id - 1 for name in _names(event) if name in topics})

    def refuse(self, session: Session, error: ProtocolError, body: list[bytes]) -> None:
        """ERROR for a command, carrying its ID whenever it had one (mc0 requires it)."""
        self.counters["errors"] += 1
        if error.command_id is None:
            # Some refusals come before (or without) the codec reading the ID: a broker-only verb's event
            # (MESSAGE, MESSAGES) has no ID field, and a malformed one may fail before its ID is parsed.
            error.command_id = _command_id(body)
        self.reply(session, mc0.error_reply(error))

    def _publish_each(
        self, items: list[tuple[bytes, bytes, mc0.Headers]], wall: int
    ) -> list[mc0.Confirmation]:
        """A ``PUTS CONFIRM each``: every entry stored or refused on its own; one result per entry. The OK
        leaves after the turn's commit, so each message id it reports is already as durable as it says."""
        engine = self.engine
        publish = engine.publish
        durable: dict[bytes, str] = {}  # per topic of the batch: what its messages' OK promises
        results: list[mc0.Confirmation] = []
        append = results.append
        done = stored = 0
        name = items[0][0] if items else b""
        known = engine.topics.get(name)
        if known is not None and not known.element_size and entry_topics(items) == {name}:
            # One topic, messages of any size: what the log alone needs is stored in one go; whatever that
            # did not store is tried one by one below, as before, so each entry still gets its own result.
            first, done = engine.append_quietly(known, items, wall)
            if done:
                durability = durable[name] = known.durability.decode()
                results = list(zip(range(first, first + done), repeat(durability)))
                append = results.append
                stored = done
        for topic, body, headers in items[done:] if done else items:
            try:
                message = publish(topic, body, headers, wall)
            except EngineError as error:
                self.counters["errors"] += 1
                append((None, str(error)))
                continue
            durability = durable.get(topic)
            if durability is None:
                durability = durable[topic] = engine.topics[topic].durability.decode()
            append((message.id, durability))
            stored += 1
        self.counters["messages_in"] += stored
        return results

    def _published(self, session: Session, message: Message, names: Iterable[bytes]) -> dict[bytes, bytes]:
        """What an OK to a publish says was achieved: the (last) message id, and the weakest durability among
        the topics it went to. Sent only after the turn's commit, so the promise already holds."""
        if not session.ids:
            return {}
        topics = self.engine.topics
        durability = min((topics[name].durability for name in names), key=DURABILITY_RANK.__getitem__)
        return {mc0.MESSAGE_ID: b"%d" % message.id, mc0.DURABILITY: durability}

    def _deleted(self, session: Session, command_id: bytes | None, why: str | None) -> None:
        """A cluster's Raft log recorded a DELETE (``why`` None), or could not: its answer."""
        if command_id is None:
            return
        if why is None:
            self.ok(session, command_id)
        else:
            self.counters["errors"] += 1
            why = (f"deleted on the leader, but the cluster did not record it ({why}): the other members "
                   "keep their copies; DELETE it again")
            self.reply(session, mc0.Error(why.encode(), command_id))
        self.hub.schedule()

    def ok(self, session: Session, command_id: bytes, headers: dict[bytes, bytes] | None = None) -> None:
        self.reply(session, mc0.Ok(command_id, headers or {}))

    def reply(self, session: Session, event: mc0.Event) -> None:
        self.replies.append((session, mc0.encode(event, delimiter=session.delimiter)))

    # ------------------------------------------------------------------------------------------------- output

    def answer(self, now: float) -> bool:
        """The hub's second step, after the commit: this turn's replies. True if some wait for a full pipe."""
        self.fetch_bytes = FETCH_TURN_BYTES
        self.fetch_messages = FETCH_TURN_MESSAGES
        self.fetch_deferred = False
        self._pipe_full = False
        self._held_until = None
        if self.confirming:
            if self.engine.failed:
                self._unconfirm()
            if self.cluster is not None:
                self._hold(now)
            self.confirming.clear()
            self.needs.clear()
        if self.waits.count or self.woken:
            self._answer_waits(now)  # before this turn's FETCHes park: those have seen the commit already
        self._send_replies(now)
        if self.waits.count or self._held_until is not None:
            self._arm_timer(now)
        if self.fetch_deferred:
            # FETCH replies were left for the next turn: come back once the socket has had its turn, not on
            # the backing-off retry timer meant for full pipes.
            self.hub.schedule()
        return self._pipe_full

    def _send_replies(self, now: float) -> None:
        """Replies go out in order per client.

        One that meets a full pipe waits, with every later reply to that client behind it, and is retried
        each turn: a command with an ID always gets its answer. A client that lets ``MAX_STALLED_REPLIES``
        pile up is not reading at all and is dropped. A FETCH reply is built when its turn comes; once this
        turn's fetch budget is spent it waits the same way, for the next turn."""
        for session in list(self.stalled):
            queue = session.stalled
            current = self.sessions.by_identity.get(session.identity) is session
            while queue:
                frames = queue[0]
                if type(frames) is _Held:
                    frames = self._held(frames, now)
                    if frames is None:
                        break
                    queue[0] = frames
                if type(frames) is _FetchReply:
                    if not current:
                        break  # nobody to read the log for
                    frames = self._build(frames, session, now)
                    if frames is None:
                        break
                    if frames is PARKED:
                        queue.popleft()
                        continue
                    queue[0] = frames  # built once, however long the pipe stays full
                if not self.send(session, frames, now):
                    break
                queue.popleft()
            if not queue or not current or self.sessions.by_identity.get(session.identity) is not session:
                self.stalled.discard(session)
        replies = self.replies
        if not replies:
            return
        self.replies = []
        for session, reply in replies:
            if reply is PARKED:
                continue  # answered ahead of the commit (_replica_replies_ahead)
            if not session.stalled:
                if type(reply) is _Held:
                    frames = self._held(reply, now)
                else:
                    frames = self._build(reply, session, now) if type(reply) is _FetchReply else reply
                if frames is PARKED:
                    continue
                if frames is not None:
                    if self.send(session, frames, now):
                        continue
                    reply = frames
            if self.sessions.by_identity.get(session.identity) is not session:
                continue  # gone (or disconnected): nobody to answer
            session.stalled.append(reply)  # type: ignore[arg-type] - a queue of Reply items, see __init__
            self.stalled.add(session)
            if len(session.stalled) > MAX_STALLED_REPLIES:
                self.drop(session, f"{MAX_STALLED_REPLIES} replies unread")

    def _hold(self, now: float) -> None:
        """In a cluster: each confirmed publish's OK waits until a majority holds its messages."""
        assert self.cluster is not None
        failed = self.engine.failed
        deadline = now + self.cluster.commit_timeout
        for (index, event, _), needs in zip(self.confirming, self.needs, strict=True):
            if not needs or any(name in failed for name in needs):
                continue
            session, frames = self.replies[index]
            if type(frames) is list:
                self.replies[index] = (session, _Held(frames, needs, deadline, event.id, session.delimiter))

    def _held(self, held: _Held, now: float) -> mc0.Frames | None:
        """A held OK's frames once a majority holds its messages, an ERROR's if that cannot be had in time,
        or None while it waits."""
        assert self.cluster is not None
        verdict = self.cluster.confirm(held.needs, now, held.deadline)
        if verdict is True:
            return held.frames
        if verdict is False:
            if self._held_until is None or held.deadline < self._held_until:
                self._held_until = held.deadline
            return None
        self.counters["errors"] += 1
        return mc0.encode(mc0.Error(str(verdict).encode(), held.command_id), delimiter=held.delimiter)

    def _unconfirm(self) -> None:
        """The commit could not store some topics: the OKs of this turn's publishes to them become ERRORs
        (their messages are not stored; a client that retries publishes them again)."""
        failed = self.engine.failed
        cluster = self.cluster
        for index, event, results in self.confirming:
            name = next((topic for topic in _names(event) if topic in failed), None)
            if name is None:
                continue
            why = failed[name]
            session = self.replies[index][0]
            reply: mc0.Ok | mc0.Error
            retry_ms = None if cluster is None else cluster.unstored_retry_ms(name)
            if retry_ms is not None and (results is None or all(item[0] in failed for item in event.items)):
                # A cluster leader that cannot write hands the cluster over (after this turn): the publish
                # goes to the next leader, as one refused while a leader hands over does. A PUTS CONFIRM
                # each whose entries were partly stored is answered entry by entry, below, and only its
                # refused entries go to the next leader.
                self.counters["errors"] += 1
                reply = mc0.leader_error(f"not stored: {why}; this leader cannot write and hands the cluster "
                                         "over: send it again in a moment", None, event.id, retry_ms=retry_ms)
            elif type(event) is mc0.Puts and results is not None:
                # A PUTS CONFIRM each: only the entries of the topics not stored become errors. When this
                # leader hands the cluster over for them, the OK says when to send those entries again.
                assert event.id is not None  # the codec refuses CONFIRM each without an ID
                reply = mc0.confirms_ok(event.id, [
                    (None, f"not stored: {failed[item[0]]}") if item[0] in failed else result
                    for item, result in zip(event.items, results, strict=True)
                ], retry_ms=retry_ms)
            else:
                self.counters["errors"] += 1
                reply = mc0.Error(f"not stored: {why}".encode(), event.id)
            self.replies[index] = (session, mc0.encode(reply, delimiter=session.delimiter))

    def _build(
        self, reply: _FetchReply, session: Session, now: float, deadline: float | None = None
    ) -> mc0.Frames | None:
        """A FETCH's reply, read from the log now; None (for a later turn) once the turn's budget is spent;
        PARKED if it found nothing new and waits (until ``deadline`` when it waited before). A FETCH that
        parks costs a read and nothing more: its OK is built only when it is answered (a follower's FETCH
        parks once per replicated message)."""
        if self.fetch_bytes <= 0 or self.fetch_messages <= 0:
            self.fetch_deferred = True
            return None
        event = reply.event
        answer: mc0.Ok | mc0.Error
        try:
            read = self._read(event)
        except EngineError as error:
            self.counters["errors"] += 1
            answer = mc0.Error(str(error).encode(), event.id)
        else:
            incarnation = read.incarnation.encode() if read.incarnation is not None else mc0.NO_INCARNATION
            # Nothing past its start in the log it expected: it may wait for a commit.
            if event.wait and read.start_id >= read.next_id and event.incarnation in (None, incarnation):
                if deadline is None:
                    deadline = now + min(event.wait, mc0.FETCH_MAX_WAIT_MS) / 1000
                cluster = self.cluster
                replicas = None if event.replica is None or cluster is None else cluster.replica_waits()
                if deadline > now and self.waits.park(session, event.topic, reply, deadline, replicas):
                    return PARKED
            answer = self._fetch_ok(event, read, incarnation)
            self.counters["fetches"] += 1  # answered (a wait read again is counted once, when it is)
            if event.packed:
                return mc0.encode_packed_ok(answer, delimiter=reply.delimiter)
        return mc0.encode(answer, delimiter=reply.delimiter)

    def _read(self, event: mc0.Fetch) -> RangeRead:
        """Read a FETCH's messages from the log (after the commit); EngineError if it cannot be read."""
        max_messages = mc0.FETCH_DEFAULT_MAX_MESSAGES if event.max_messages is None else event.max_messages
        max_bytes = mc0.FETCH_DEFAULT_MAX_BYTES if event.max_bytes is None else event.max_bytes
        known = None if event.incarnation is None else event.incarnation.decode("ascii", "replace")
        return self.engine.read_range(
            event.topic, event.start, min(max_messages, mc0.FETCH_MAX_MESSAGES),
            min(max_bytes, mc0.FETCH_MAX_BYTES), at_time=event.at_time, records=event.records,
            known_incarnation=known, replica=event.replica is not None,
        )

    def _fetch_ok(self, event: mc0.Fetch, read: RangeRead, incarnation: bytes) -> mc0.Ok:
        """The OK answering a FETCH with what :meth:`_read` found (``incarnation``: its log's, as sent)."""
        command_id = event.id
        assert command_id is not None  # dispatch() refused a FETCH without one
        if event.records:
            self.fetch_bytes -= len(read.records)
            self.fetch_messages -= read.count
            ok = mc0.records_ok(command_id, read.first_id, read.next_id, read.start_id, read.count,
                                incarnation, read.records)
        else:
            size = 0
            items = []
            for message in read.messages:
                size += len(message.body)
                items.append((message.id, message.timestamp, message.body, message.headers))
            self.fetch_bytes -= size
            self.fetch_messages -= len(items)
            ok = mc0.fetch_ok(command_id, read.first_id, read.next_id, items, incarnation, read.start_id)
        if event.replica is not None and self.cluster is not None:
            count = read.count if event.records else 0  # producers travel with records only
            extra = self.cluster.replica_extra(event.topic, read.start_id, count, event.incarnation)
            ok.headers.update(extra)
        return ok

    def answer_ahead(self, written: list[bytes], now: float) -> None:
        """A cluster leader's turn wrote ``written`` and is about to fsync them: the FETCHes waiting on them
        (followers' long polls) are answered now, so the followers' fsyncs run while the leader's does."""
        self.fetch_bytes = FETCH_TURN_BYTES
        self.fetch_messages = FETCH_TURN_MESSAGES
        if self.waits.count:
            self._answer_waits(now, written)
        if self.replies:
            self._replica_replies_ahead(written, now)

    def _replica_replies_ahead(self, written: list[bytes], now: float) -> None:
        """This turn's own replica FETCHes of a topic it wrote, answered ahead like the waiting ones. Such a
        FETCH came in the same turn as the messages it now finds: the follower that acknowledged last (its
        FETCH arriving with the client's next publish) would otherwise get them only after the leader's
        fsync, a whole fsync behind the other follower, every message. A follower matches answers by ID, so
        this reply may leave before the session's other replies of the turn."""
        topics = set(written)
        replies = self.replies
        for index, (session, reply) in enumerate(replies):
            if (type(reply) is _FetchReply and reply.event.replica is not None and reply.event.topic in topics
                    and not session.stalled):
                frames = self._build(reply, session, now)
                if frames is None:
                    return  # the turn's fetch budget is spent: the rest in their places, after the commit
                if frames is not PARKED and not self.send(session, frames, now):
                    replies[index] = (session, frames)  # for a full pipe: in its place, as any reply
                    continue
                # Answered (or parked again): its place stays, empty, since held OKs are found by index.
                replies[index] = (session, PARKED)

    def _answer_waits(self, now: float, written: list[bytes] | None = None) -> None:
        """Waiting FETCHes whose topic this turn's commit wrote (or ``written`` names), or whose wait is
        over: read again, and answer what found something (or ran out of time); the rest wait on. Bounded by
        the turn's fetch budget like any FETCH: what is left is answered next turn."""
        waits, woken = self.waits, self.woken
        if waits.count:
            committed = self.engine.committed if written is None else written
            if committed:
                woken.extend(waits.woken(committed))
            if written is None:
                woken.extend(waits.expired(now))
        while woken:
            wait = woken[0]
            session = wait.owner
            if self.sessions.by_identity.get(session.identity) is not session:
                woken.popleft()  # gone: nobody to answer
                continue
            frames = self._build(wait.request, session, now, wait.deadline)
            if frames is None:
                break
            woken.popleft()
            if frames is PARKED:
                continue
            if session.stalled or (not self.send(session, frames, now)
                                   and self.sessions.by_identity.get(session.identity) is session):
                session.stalled.append(frames)  # behind what already waits, or for room in the pipe
                self.stalled.add(session)

    def _arm_timer(self, now: float) -> None:
        """Come back (a hub flush) when the next wait or held OK's deadline comes: nothing else would wake an
        idle broker then. A timer already due earlier stays (its flush arms the next one), so a follower's
        FETCH parked and answered once per message does not cancel and re-arm a timer each time."""
        loop = self.hub.loop
        deadline = self.waits.next_deadline()
        if self._held_until is not None and (deadline is None or self._held_until < deadline):
            deadline = self._held_until
        if loop is None or deadline is None:
            return
        if self._timer is not None:
            assert self._timer_at is not None
            if self._timer_at <= deadline:
                return
            self._timer.cancel()
        self._timer_at = deadline
        self._timer = loop.call_later(max(0.0, deadline - now), self._timer_fired)

    def _timer_fired(self) -> None:
        self._timer = self._timer_at = None
        self.hub.schedule()

    def deliver(self, session: Session, pending: list[Message], now: float) -> int:
        """Write ``pending`` to one client; returns how many went out (the rest stay pending)."""
        if session.batch:
            sent = 0
            total = len(pending)
            pack = _pack_batch
            while sent < total:
                chunk: list[tuple] = []
                size = 0
                for message in pending[sent : sent + BATCH_MAX_MESSAGES]:
                    if message.headers:
                        chunk.append((message.topic, message.id, message.timestamp, message.body,
                                      message.headers))
                    else:
                        chunk.append((message.topic, message.id, message.timestamp, message.body))
                    size += len(message.body)
                    if size >= BATCH_MAX_BYTES:
                        break
                frames = (_BATCH_HEAD if session.delimiter else _BATCH_HEAD_BARE) + [pack(chunk)]
                if not self.send(session, frames, now):
                    return sent
                sent += len(chunk)
            return sent
        ids = session.ids
        head = [b""] if session.delimiter else []
        for index, message in enumerate(pending):
            frames = mc0.message_frames(
                list(head), message.topic, message.body, message.headers,
                message.id if ids else None, message.timestamp if ids else None,
            )
            if not self.send(session, frames, now):
                return index
        return len(pending)

    def send(self, session: Session, frames: list[bytes], now: float) -> bool:
        """One frame set (without the identity frame) to one client; False if it could not go out now (full
        pipe or gone peer)."""
        self._sent = True
        try:
            self.transmit(session.identity, frames)
        except Again:
            self.counters["blocked"] += 1
            self._pipe_full = True
            return False
        except zmq.ZMQError as error:
            if error.errno != errno.EHOSTUNREACH:
                raise
            if self.sessions.by_identity.get(session.identity) is session:  # count each gone peer once
                self.counters["unreachable"] += 1
                self.drop(session, "unreachable")
            return False
        session.last_sent = now
        self.counters["bytes_out"] += len(frames[-1])
        return True

    def transmit(self, identity: bytes, frames: list[bytes]) -> None:
        """Hand one frame set to the wire: the only place the router writes to its clients."""
        self._transmit(identity, frames)

    # ----------------------------------------------------------------------------------------------- liveness

    def heartbeat(self, now: float, *, expire: bool = True) -> None:
        noop, expired = self.sessions.due(now)
        for session in expired if expire else ():
            self.counters["expired"] += 1
            self.drop(session, "expired (no traffic for 1.05 x TTL)")
        for session in noop:
            self.send(session, mc0.encode(mc0.Noop(), delimiter=session.delimiter), now)
        if now >= self.next_probe:
            # Sessions without TTL: a NOOP to each that has been silent for session_idle. A peer that has gone
            # makes the send fail at once (ROUTER_MANDATORY), and send() drops its session.
            self.next_probe = now + self.session_idle / 8
            for session in self.sessions.silent(now, self.session_idle):
                session.last_probe = now
                self.counters["probed"] += 1
                self.send(session, mc0.encode(mc0.Noop(), delimiter=session.delimiter), now)
        # Re-derive the tick from the clients still here: one short-TTL client must not keep it fast forever.
        ttls = [s.ttl for s in self.sessions.by_identity.values() if s.ttl is not None]
        self.tick = heartbeat_tick(self.base_tick, ttls)

    def _make_room(self, newcomer: Session) -> None:
        """Over max_sessions: the sessions heard from longest ago go (a sixteenth of the cap at once, so that
        a crowd of new clients does not pay for a search each)."""
        evicted = [session for session in self.sessions.oldest(max(1, self.max_sessions // 16))
                   if session is not newcomer]
        for session in evicted:
            self.drop(session, "evicted", quiet=True)
        self.counters["evicted"] += len(evicted)
        log.warning("%d clients dropped, those heard from longest ago: more than %d sessions (max_sessions)",
                    len(evicted), self.max_sessions)

    def drop(self, session: Session, why: str, *, quiet: bool = False) -> None:
        if self.sessions.by_identity.get(session.identity) is not session:
            return  # already gone, or the identity came back as a new session that must not be dropped
        self.sessions.remove(session.identity)
        if not quiet:
            # A client that said DISCONNECT left as it should, and so did one this broker sent to a cluster's
            # leader (after a leader change, the old leader would log a line for each of its clients): only an
            # operator debugging wants a line for them.
            level = logging.DEBUG if why == DISCONNECTED or session.sent_away else logging.INFO
            log.log(level, "client %s dropped: %s", session.identity.hex(), why)
        self._unsubscribe(session)

    def _unsubscribe(self, session: Session) -> None:
        """The session's subscriptions, waiting FETCHes and commands waiting for topics end here."""
        making = self.making.pop(session, None)
        if making is not None:
            self.engine.forget_ahead(making.unmade)
        self.engine.detach(session.subscriber)
        self.waits.forget(session)

    def send_away(self, text: str, leader: bytes | None) -> None:
        """This broker no longer serves (a cluster member that stopped leading): every client gets an ERROR
        without ID naming the leader (``LEADER``), which the connector follows, and loses its subscriptions
        here (it subscribes again at the leader, resuming after its last ids)."""
        now = self.monotonic()
        error = mc0.leader_error(text, leader, None)
        for session in list(self.sessions.by_identity.values()):
            session.redirected_until = now + REDIRECTED_FOR
            self._send_off(session, error, now)

    def subscribe_again(self, text: str, endpoint: bytes) -> None:
        """This broker leads again, in a new epoch, and no other member led meanwhile, so its clients were
        never sent away: the subscriptions it kept belong to the old epoch, whose log identities the clients
        would name when they resume, and a log's lineage has a reader of an old identity read again from
        where the epochs part. Each subscribed client gets an ERROR without ID naming this broker as the
        leader (``LEADER``), which the connector takes as "subscribe again here": it does, on a new
        connection, after its last ids, and learns the new identities. Other clients stay as they are."""
        now = self.monotonic()
        error = mc0.leader_error(text, endpoint, None)
        for session in list(self.sessions.by_identity.values()):
            if session.subscriber.topics:
                self._send_off(session, error, now)

    def _send_off(self, session: Session, error: mc0.Error, now: float) -> None:
        """Send ``error`` (a LEADER without ID) and end the session's subscriptions and waits."""
        frames = mc0.encode(error, delimiter=session.delimiter)
        # Behind every reply still owed to the client (a held OK, a FETCH's, one a full pipe stopped): the
        # connector counts on it, sending again what this broker left unanswered when it sent it away.
        if session.stalled:
            session.stalled.append(frames)
            self.stalled.add(session)
        else:
            self.send(session, frames, now)
        self._unsubscribe(session)

    # -------------------------------------------------------------------------------------------------- stats

    def stats(self) -> dict[str, Any]:
        return {"connections": len(self.sessions), **self.counters, "waiting_fetches": self.waits.count}


def _command_id(body: list[bytes]) -> bytes | None:
    """The ID header of a command, read from its raw frames (the same key/value walk as the codec's)."""
    index = 2 if body[:1] == [b""] else 1
    while index + 1 < len(body) and body[index] != b"":
        if body[index] == mc0.ID:
            return body[index + 1]
        index += 2
    return None
