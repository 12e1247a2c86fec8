"""The asyncio mc0 client: the same protocol core as :class:`connector.Client`, driven by the caller's loop.

The first publish of a loop turn is written at once; the rest of the turn's are queued and written together
(``call_soon``), so they leave as one PUTS batch, and everything acked in one turn as one ACK per topic (the
futures of ``publish_async`` always wait for the turn's flush, to travel together). A reader task takes every
readable frame set without blocking, resolves replies and keeps the heartbeat. Not thread-safe: use one
:class:`AsyncClient` from the loop that created it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import deque
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any, Unpack

import zmq
import zmq.asyncio

from connector.base import (
    DEFAULT_ENDPOINT,
    RECONNECT_FIRST_MS,
    RECONNECT_MAX_MS,
    ClientBase,
    ClientOptions,
    Confirms,
    QueuedConfirm,
    TopicPage,
    TopicSettings,
    broker_mechanism,
    close_socket,
    group_outbox,
    leader_of,
    make_socket,
    reply_or_raise,
    stats_event,
    topics_of,
)
from connector.connection import CHECK_EVERY
from connector.core import (
    ConnectorError,
    FetchResult,
    Message,
    Publish,
    ack_target,
    declare_event,
    encode_headers,
    fetch_event,
    fetch_result,
    ok_headers,
    puts_event,
    sub_event,
    to_bytes,
)
from connector.native import NativeSocket, check_wire, wire_address
from connector.zsock import readable, recv_frames, send_frames
from protocol import mc0
from protocol.bodies import TopicBodies

#: Seconds between the reader task's looks at a connected socket when no heartbeat is due sooner: frames are
#: taken by the descriptor's callback; this catches anything no edge announced.
HOUSEKEEPING = 1.0


def _stop_watching(fd: int | None) -> None:
    """No more reader callbacks for ``fd`` (None: nothing watched)."""
    if fd is not None:
        with contextlib.suppress(RuntimeError):  # the loop is already closed
            asyncio.get_event_loop().remove_reader(fd)


def _resendable(waiting: Any, event: Any) -> bool:
    """Whether a waiting command may go to another broker when the one it went to did not store it: what
    callers published (not a CONNECT or a resubscription, which the move makes again)."""
    return type(waiting) is Confirms or (waiting is not None and event is not None)


def _fail(waiting: asyncio.Future[Any] | Confirms, why: str) -> None:
    """Fail a command waiting for its answer: its future, or the publishes it confirms."""
    if type(waiting) is Confirms:
        waiting.fail(why)
    elif not waiting.done():  # type: ignore[union-attr]
        waiting.set_exception(ConnectorError(why))  # type: ignore[union-attr]


class AsyncClient(ClientBase):
    """An asyncio mc0 client.

    >>> async with AsyncClient("tcp://127.0.0.1:61616", keys="keys") as client:   # doctest: +SKIP
    ...     await client.subscribe("orders")
    ...     await client.publish("orders", "hello")
    ...     print((await client.receive(timeout=1)).text)
    """

    def __init__(self, endpoint: str | Sequence[str] = DEFAULT_ENDPOINT, *, wire: str | None = None,
                 **options: Unpack[ClientOptions]) -> None:
        """Nothing happens on the wire until :meth:`connect` (or ``async with``). ``wire``: ``auto`` (the
        default, :data:`connector.native.DEFAULT_WIRE`) speaks ZMTP on this loop itself to a ``tcp://`` broker
        (:mod:`connector.native`) and goes through libzmq for any other endpoint; ``native`` refuses
        other endpoints; ``zeromq`` always goes through libzmq. Other options: see
        :class:`connector.base.ClientBase`."""
        wire = check_wire(wire)
        super().__init__(endpoint, **options)
        self.wire = wire
        self._outbox: deque[Publish | QueuedConfirm] = deque()
        self._acks: dict[bytes, list[int]] = {}  # acked this loop turn, per topic: one ACK each at the flush
        # A command's reply goes to its future, or to the futures of the publishes it confirms.
        self._waiting: dict[bytes, asyncio.Future[mc0.Ok | mc0.Error] | Confirms] = {}
        self._events: dict[bytes, Any] = {}  # what each command waiting for its answer sent (to send again)
        self._in_flight = 0  # confirmed publishes queued or sent and not yet settled
        self._confirm_room = asyncio.Event()  # set whenever confirmations settle
        self._context = zmq.asyncio.Context()
        self._socket: zmq.asyncio.Socket | None = None
        self._raw: zmq.Socket | None = None
        self._monitor: zmq.Socket | None = None  # the socket's connection events (a shadow, read raw)
        self._monitor_owner: zmq.Socket | None = None  # the monitor socket itself, closed with the socket
        self._monitor_fd: int | None = None
        self._socket_fd: int | None = None  # the socket's own descriptor: its reader callback takes frames
        # The socket's calls: connector.zsock's on a libzmq socket, NativeSocket's on the native wire.
        self._readable: Any = readable
        self._recv: Any = recv_frames
        self._send_raw: Any = send_frames
        self._probe: asyncio.Task[None] | None = None  # asking the broker's mechanism, when libzmq cannot say
        self._arrived = asyncio.Event()
        # One timer wakes the receives waiting with a timeout (see _wake_by), and when it is due.
        self._alarm: asyncio.TimerHandle | None = None
        self._alarm_at = 0.0
        self._room = asyncio.Event()
        self._flush_scheduled = False
        self._flushed_early = False  # a publish of this loop turn left at once (_flush_first)
        self._read_scheduled = False
        self._reader: asyncio.Task[None] | None = None
        self._connecting: asyncio.Future[mc0.Ok | mc0.Error] | None = None  # the latest CONNECT's reply
        self._ready = False  # the broker answered CONNECT with OK
        self._closing = False  # close() is waiting for the OK to its DISCONNECT
        self._move_timer: asyncio.TimerHandle | None = None  # a move that waits (see _follow_move)

    # ----------------------------------------------------------------------------------------- public methods
    # Per-call ``timeout`` arguments mirror the blocking Client's methods, hence the ASYNC109 exemptions.

    async def connect(self) -> AsyncClient:
        """Open the socket, CONNECT and wait for the broker's OK."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        try:
            reply = self._open()
            self._reader = loop.create_task(self._read_loop(), name="mc0-client-reader")
            self._reader.add_done_callback(self._reader_ended)
            while True:
                try:
                    answer = await asyncio.wait_for(reply, max(0.0, deadline - loop.time()))
                except ConnectorError:
                    if self._connecting is reply:
                        raise
                    reply = self._connecting  # the reader gave up on a silent broker and sent a new CONNECT
                    continue
                leader = leader_of(answer) if isinstance(answer, mc0.Ok) else None
                if leader is not None and self._move(leader):
                    self._moving = False
                    reply = self._open()  # a cluster member that does not lead: connect to the leader
                    continue
                if self._connecting is not reply:
                    reply = self._connecting  # moved meanwhile (a member that could not be reached)
                    continue
                break
            self._moves_done()
            self._core.connected(reply_or_raise(answer, "CONNECT"))
            self._ready = self._established = True
        except TimeoutError:
            await self.close()
            raise ConnectorError(self._watch.timed_out(self.timeout)) from None
        except zmq.ZMQError as error:  # e.g. a malformed endpoint
            await self.close()
            raise ConnectorError(f"cannot connect to {self.endpoint}: {error}") from None
        except BaseException:
            await self.close()
            raise
        return self

    async def __aenter__(self) -> AsyncClient:
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def publish(
        self,
        topic: str | bytes,
        body: str | bytes,
        headers: dict[str, str] | None = None,
        *,
        confirm: bool = False,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> dict[str, str] | None:
        """Publish one message; waits only when the outbox is full or ``confirm=True`` (then returns OK's
        headers, ``MESSAGE-ID`` among them).

        On a persistent topic the broker sends that OK only once the topic's sync level is met, and it carries
        ``MESSAGE-ID`` and ``DURABILITY``: ``fsync`` (strong: on disk), ``written`` (weak: handed to the OS)
        or ``memory`` (no flush promise)."""
        self._check()
        item = (to_bytes(topic), to_bytes(body), encode_headers(headers))
        if confirm:
            wait = self.timeout if timeout is None else timeout
            confirmation = await self._confirm(item, wait, at_once=True)
            try:
                return await asyncio.wait_for(confirmation, wait)
            except TimeoutError:
                raise ConnectorError(f"no answer to PUT within {wait:g}s") from None
        while len(self._outbox) >= self._max_outbox:
            self._room.clear()
            self._schedule_flush()
            try:
                await asyncio.wait_for(self._room.wait(), self.timeout if timeout is None else timeout)
            except TimeoutError:
                raise ConnectorError("outbox full: the broker is not taking messages") from None
            self._check()
        self._outbox.append(item)
        self._flush_first()
        return None

    async def publish_async(
        self,
        topic: str | bytes,
        body: str | bytes,
        headers: dict[str, str] | None = None,
        *,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> asyncio.Future[dict[str, str]]:
        """Publish one message and return a future of the broker's confirmation without waiting for it (see
        :meth:`connector.Client.publish_async`): it resolves to the OK's headers (``MESSAGE-ID``,
        ``DURABILITY``) or raises ConnectorError. The confirmed publishes of one loop turn leave together as
        one ``PUTS CONFIRM each``. Waits only while ``max_confirms`` are in flight (up to ``timeout``)."""
        self._check()
        item = (to_bytes(topic), to_bytes(body), encode_headers(headers))
        return await self._confirm(item, self.timeout if timeout is None else timeout)

    async def publish_batch(
        self,
        items: Iterable[tuple[str | bytes, str | bytes, dict[str, str] | None]] | TopicBodies,
        *,
        producer: str | bytes | None = None,
        sequence: int | None = None,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> dict[str, str]:
        """Publish the entries as one PUTS and wait for the OK that confirms them all, or the ERROR that
        refuses them all (ConnectorError); idempotent with ``producer`` and ``sequence``. The same as
        :meth:`connector.Client.publish_batch`."""
        event = puts_event(items, producer, sequence)
        if not event.items:
            return {}
        return ok_headers(await self._call(event, timeout, "PUTS"))

    async def _confirm(
        self, item: Publish, wait: float, at_once: bool = False
    ) -> asyncio.Future[dict[str, str]]:
        """Queue a confirmed publish. ``at_once``: its caller waits for this one confirmation before it can
        publish again (``publish(confirm=True)``), so it may leave at once (:meth:`_flush_first`); the
        futures of ``publish_async`` are left to the loop turn's flush, which sends them together as one
        ``PUTS CONFIRM each`` (one fsync for all of them on a strong topic)."""
        if self._in_flight >= self._max_confirms:
            deadline = time.monotonic() + wait
            while self._in_flight >= self._max_confirms:
                self._confirm_room.clear()
                try:
                    await asyncio.wait_for(self._confirm_room.wait(), max(0.0, deadline - time.monotonic()))
                except TimeoutError:
                    raise ConnectorError(f"{self._max_confirms} confirmed publishes in flight for {wait:g}s: "
                                         "the broker is not confirming them") from None
                self._check()
        self._in_flight += 1
        future: asyncio.Future[dict[str, str]] = asyncio.get_running_loop().create_future()
        self._outbox.append(QueuedConfirm(item, future))
        if at_once:
            self._flush_first()
        else:
            self._schedule_flush()
        return future

    def _release_confirms(self, count: int) -> None:
        """``count`` confirmations settled: room for more."""
        self._in_flight -= count
        self._confirm_room.set()

    async def subscribe(
        self,
        *topics: str | bytes,
        replay: mc0.Replay | None = None,
        credit: int | None = None,
        explicit_acks: bool = False,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> None:
        """Subscribe and wait for the broker's OK: the options of :meth:`connector.Client.subscribe`."""
        await self._call(sub_event(topics, replay, credit, explicit_acks), timeout, "SUB")

    async def unsubscribe(self, *topics: str | bytes, timeout: float | None = None) -> None:  # noqa: ASYNC109
        await self._call(mc0.Unsub([to_bytes(t) for t in topics]), timeout, "UNSUB")

    async def ack(self, message_or_topic: Message | str | bytes, *ids: int) -> None:
        """Confirm a received message or ids of a topic (see :meth:`connector.Client.ack`). Never waits: the
        ACK leaves with this loop turn's flush, merged with the other acks of the turn per topic."""
        topic, message_ids = ack_target(message_or_topic, ids)
        self._check()
        self._acks.setdefault(topic, []).extend(message_ids)
        self._schedule_flush()

    async def declare(
        self,
        topic: str | bytes,
        *,
        timeout: float | None = None,  # noqa: ASYNC109
        **settings: Unpack[TopicSettings],
    ) -> None:
        """Create ``topic`` with these settings and wait for the OK (see :meth:`connector.Client.declare`)."""
        await self._call(declare_event(topic, settings), timeout, "DECLARE")

    async def flush(self, timeout: float | None = None) -> None:  # noqa: ASYNC109
        """Return once the broker has taken every message published before this call, and every
        confirmation asked for before it has resolved (the broker answers in order)."""
        await self._call(mc0.Noop(), timeout, "NOOP")

    async def delete(self, topic: str | bytes, *, timeout: float | None = None) -> None:  # noqa: ASYNC109
        """Remove ``topic`` and its stored messages (see :meth:`connector.Client.delete`)."""
        await self._call(mc0.Delete(to_bytes(topic)), timeout, "DELETE")

    async def stats(self, timeout: float | None = None,  # noqa: ASYNC109
                    **page: Unpack[TopicPage]) -> dict[str, Any]:
        """The broker's counters, with one page of topics (see :class:`connector.base.TopicPage`)."""
        reply = await self._call(stats_event(page), timeout, "STATS")
        return json.loads(reply.body or b"{}")

    async def topics(self, timeout: float | None = None,  # noqa: ASYNC109
                     **page: Unpack[TopicPage]) -> dict[str, Any]:
        """Topic name -> settings and counters (the ``topics`` part of :meth:`stats`), one page of them."""
        return topics_of(await self.stats(timeout, **page))

    async def fetch(
        self,
        topic: str | bytes,
        start: int | None = None,
        *,
        max_messages: int = mc0.FETCH_DEFAULT_MAX_MESSAGES,
        max_bytes: int = mc0.FETCH_DEFAULT_MAX_BYTES,
        wait: float | None = None,
        at_time: int | None = None,
        incarnation: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> FetchResult:
        """Stored messages of a persistent topic from id ``start`` on (see :meth:`connector.Client.fetch`,
        with the same long poll ``wait`` and ``at_time``)."""
        event = fetch_event(topic, start, max_messages, max_bytes, wait=wait, at_time=at_time,
                            incarnation=incarnation)
        total = (self.timeout if timeout is None else timeout) + min(wait or 0, mc0.FETCH_MAX_WAIT_MS / 1000)
        reply = await self._call(event, total, "FETCH")
        return fetch_result(topic, reply)

    async def offsets(self, topic: str | bytes, timeout: float | None = None) -> tuple[int, int]:  # noqa: ASYNC109
        """``(first_id, next_id)`` of a persistent topic (see :meth:`connector.Client.offsets`)."""
        result = await self.fetch(topic, max_messages=0, timeout=timeout)
        return result.first_id, result.next_id

    async def receive(self, timeout: float | None = None) -> Message | None:  # noqa: ASYNC109
        """The next delivered message, or None after ``timeout`` seconds (None = wait forever)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._arrived.clear()
            if self._inbox:
                return self._inbox.popleft()
            self._check()
            if deadline is not None:
                if deadline <= time.monotonic():
                    return None
                self._wake_by(deadline)
            await self._arrived.wait()

    async def __aiter__(self) -> AsyncIterator[Message]:
        while True:
            message = await self.receive()
            if message is not None:
                yield message

    async def close(self) -> None:
        """Send what is queued, say DISCONNECT, stop the reader. Idempotent.

        The DISCONNECT carries an ID and close() waits (up to the client's ``timeout``) for its OK: the OK
        proves that everything sent before it reached the broker, which closing the socket at once would not.
        """
        if self._closed:
            return
        self._closing = True
        try:
            if self._ready and self._reader is not None and not self._reader.done():
                with contextlib.suppress(ConnectorError):
                    await self._call(mc0.Disconnect(), None, "DISCONNECT")
        finally:
            self._closed = True
            if self._move_timer is not None:
                self._move_timer.cancel()
            if self._alarm is not None:
                self._alarm.cancel()
                self._alarm = None
            if self._reader is not None:
                self._reader.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self._reader
            self._fail_waiting("client closed")
            self._fail_outbox("client closed")
            self._close_socket()
            self._context.term()
            self._arrived.set()
            self._room.set()
            self._confirm_room.set()

    # ---------------------------------------------------------------------------------------------- internals

    def _wake_by(self, deadline: float) -> None:
        """Make sure the receives that wait are woken by ``deadline`` (a monotonic time). One timer serves
        every receive whose deadline is at or after its own: a loop of ``receive(timeout)`` arms one timer per
        timeout, not one per message (a timer armed and cancelled per receive cost about a tenth of a paced
        subscriber's CPU). A receive woken before its deadline waits again, arming the timer for itself."""
        if self._alarm is not None:
            if self._alarm_at <= deadline:
                return
            self._alarm.cancel()
        self._alarm_at = deadline
        self._alarm = asyncio.get_running_loop().call_later(deadline - time.monotonic(), self._alarm_rang)

    def _alarm_rang(self) -> None:
        self._alarm = None
        self._arrived.set()

    def _reader_ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self._reader_failed(task.exception())  # type: ignore[arg-type] - not None, checked above

    def _reader_failed(self, error: BaseException) -> None:
        """A reader that dies (the task, or the descriptor's callback) must not leave callers waiting
        forever: fail them, and every later call; nothing reads from now on."""
        if self._failure is not None:
            return
        self._failure = error
        _stop_watching(self._socket_fd)
        self._socket_fd = None
        if self._reader is not None and not self._reader.done():
            self._reader.cancel()
        self._fail_waiting(f"client stopped: {self._failure}")
        self._fail_outbox(f"client stopped: {self._failure}")
        self._arrived.set()
        self._room.set()
        self._confirm_room.set()

    async def _call(self, event: Any, timeout: float | None, what: str) -> mc0.Ok:  # noqa: ASYNC109
        self._check()
        self._flush()  # keep order: everything published before this command goes first
        future: asyncio.Future[mc0.Ok | mc0.Error] = asyncio.get_running_loop().create_future()
        self._command(event, future)
        wait = self.timeout if timeout is None else timeout
        try:
            reply = await asyncio.wait_for(future, wait)
        except TimeoutError:
            raise ConnectorError(f"no answer to {what} within {wait:g}s") from None
        return reply_or_raise(reply, what)

    def _command(self, event: Any, future: asyncio.Future[mc0.Ok | mc0.Error]) -> None:
        """Send ``event`` with a fresh ID; its answer goes to ``future`` (sent again to a cluster's leader if
        a follower refuses it)."""
        command_id, frames = self._core.command(event)  # records a SUB or UNSUB (undone if refused)
        self._waiting[command_id] = future
        self._events[command_id] = event
        self._send(frames, time.monotonic())

    def _open(self) -> asyncio.Future[mc0.Ok | mc0.Error]:
        """A new DEALER, CONNECT, and SUB for everything subscribed before; returns the CONNECT's reply."""
        self._close_socket()
        if self._sent_away:  # see BaseClient._sent_away: unanswered commands were not stored
            self._sent_away = False
            for command_id, waiting in list(self._waiting.items()):
                event = self._events.pop(command_id, None)
                if _resendable(waiting, event):
                    self._resend.append(waiting if type(waiting) is Confirms else (waiting, event))
                    del self._waiting[command_id]
        self._fail_waiting("connection to the broker was lost")  # nothing answers on the old socket any more
        address = wire_address(self.wire, self.endpoint)
        if address is not None:
            self._open_native(*address)
        else:
            self._open_zeromq()
        self._watch = self._new_watch()
        self._unsent.clear()
        self._events.clear()
        self._handshake(time.monotonic())
        # What a follower refused goes to the leader now, in the order it was first sent, ahead of what was
        # queued after it (the outbox leaves on the next flush).
        resend, self._resend = self._resend, []
        now = time.monotonic()
        for item in resend:
            if type(item) is Confirms:
                assert item.items is not None
                self._send_confirms(item.items, item.futures, now)
            else:
                future, event = item
                if not future.done():
                    self._command(event, future)
        assert self._connecting is not None
        return self._connecting

    def _open_zeromq(self) -> None:
        """A libzmq DEALER, its monitor, and reader callbacks on both descriptors."""
        socket, monitor = make_socket(self._context, self.endpoint, self._credentials)  # type: ignore[arg-type]
        self._socket = socket  # type: ignore[assignment] - an asyncio socket, made by the asyncio context
        self._raw = zmq.Socket.shadow(socket.underlying)
        self._readable, self._recv, self._send_raw = readable, recv_frames, send_frames
        # Connection events are few: read them in a reader callback on the monitor's descriptor.
        self._monitor = zmq.Socket.shadow(monitor.underlying)
        self._monitor_owner = monitor
        self._monitor_fd = self._monitor.getsockopt(zmq.FD)
        loop = asyncio.get_running_loop()
        loop.add_reader(self._monitor_fd, self._monitor_readable)
        # The descriptor signals changes only once EVENTS has been asked: ask now, or the first events (all of
        # them, for a broker that never answers) would never wake the reader.
        loop.call_soon(self._monitor_readable)
        # Frames are taken in the socket descriptor's callback, in the loop iteration that sees them (as the
        # broker does): no poll future per wake-up. ZMQ_FD is edge-triggered: every read drains the socket or
        # comes back for the rest (_read_pending), and a send that finds frames waiting schedules a read.
        self._socket_fd = self._raw.getsockopt(zmq.FD)
        loop.add_reader(self._socket_fd, self._read_pending)
        self._schedule_read()

    def _open_native(self, host: str, port: int) -> None:
        """The native wire: messages are taken in the read that completes them, events reach the watch as
        they happen."""
        native = NativeSocket(host, port, self._credentials, arrived=self._read_pending,
                              events=self._native_event, writable=self._schedule_flush,
                              reconnect=RECONNECT_FIRST_MS / 1000, reconnect_max=RECONNECT_MAX_MS / 1000)
        self._socket = self._raw = native  # type: ignore[assignment]
        self._readable, self._recv, self._send_raw = (NativeSocket.readable, NativeSocket.recv_frames,
                                                      NativeSocket.send_frames)

    def _native_event(self, kind: int, value: int) -> None:
        if not self._closed:
            self._on_event(kind, value, time.monotonic())

    def _move(self, leader: str | None, after: float = 0.0) -> bool:
        """:meth:`ClientBase._move`, made as soon as the loop runs again (or once its wait is over), whoever
        decided it. The reader makes the moves its reads decide at once, but a refused connect is reported by
        the socket's events (a killed leader's port refuses 20 ms after it died) and a LEADER in the answer
        to a CONNECT by that future's callback: those moves waited for the reader task's next look, up to a
        second (HOUSEKEEPING), where the blocking client moves at once; a failover took 0.2-0.9 s instead
        of its 0.03 s (measured)."""
        moved = super()._move(leader, after)
        if moved and self._moving and not self._closed:
            asyncio.get_running_loop().call_soon(self._follow_move)
        return moved

    def _follow_move(self) -> None:
        """A move to another broker is due (a LEADER answer, or one that cannot be reached): connect there,
        now or once the wait a cluster choosing its leader asked for is over."""
        wait = self._move_due(time.monotonic())
        if wait is None or self._closed or self._closing:
            return
        if wait > 0:
            if self._move_timer is None:
                self._move_timer = asyncio.get_running_loop().call_later(wait, self._moved_later)
            return
        self._moving = False
        self._open()

    def _moved_later(self) -> None:
        self._move_timer = None
        self._follow_move()

    def _handshake(self, now: float) -> None:
        orphans = list(self._waiting)
        loop = asyncio.get_running_loop()
        command_id, frames = self._core.connect(now)
        connected: asyncio.Future[mc0.Ok | mc0.Error] = loop.create_future()
        connected.add_done_callback(lambda _: self._orphaned(orphans, _fail))
        if self._ready:
            connected.add_done_callback(self._reconnected)
        self._connecting = connected
        self._waiting[command_id] = connected
        self._send(frames, now)
        for command_id, frames in self._core.resubscribe():
            self._waiting[command_id] = loop.create_future()
            self._send(frames, now)

    def _unreachable(self, reason: str) -> None:
        if self._connecting is not None and not self._connecting.done():
            self._connecting.set_exception(ConnectorError(reason))

    def _ask_mechanism(self, now: float) -> None:
        """As the blocking client does, but the probe's connect and read run in a worker thread."""

        async def ask() -> None:
            mechanism = await asyncio.to_thread(broker_mechanism, self.endpoint)
            if not self._closed:
                self._verdict(self._watch.mechanism(mechanism), time.monotonic())

        self._probe = asyncio.get_running_loop().create_task(ask(), name="mc0-client-probe")

    def _monitor_readable(self) -> None:
        if self._monitor is not None and not self._closed:
            self._read_events(self._monitor, time.monotonic())

    def _close_socket(self) -> None:
        _stop_watching(self._monitor_fd)
        _stop_watching(self._socket_fd)
        self._monitor_fd = self._socket_fd = None
        if type(self._socket) is NativeSocket:
            self._socket.close()
        elif self._socket is not None:
            close_socket(self._socket, self._monitor_owner)
        self._monitor = self._monitor_owner = None

    def _fail_outbox(self, why: str) -> None:
        """The client stops: fail the confirmed publishes it never sent (none is dropped in silence)."""
        unsent = [item.future for item in self._outbox if type(item) is QueuedConfirm]
        self._outbox.clear()
        Confirms(unsent, self._release_confirms).fail(why)

    def _fail_waiting(self, why: str) -> None:
        for waiting in self._waiting.values():
            _fail(waiting, why)
        self._waiting.clear()

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush_first(self) -> None:
        """The first publish of a loop turn leaves at once; the rest of the turn's leave together, at the
        flush ``call_soon`` schedules. At a paced rate every publish is the first of its turn, and waiting
        for the loop's next iteration added 20-30 us to each one's latency (measured); a flood, which never
        gives the loop a turn between publishes, still goes out in PUTS batches."""
        if self._flush_scheduled or self._flushed_early:
            self._schedule_flush()
            return
        self._flushed_early = True
        asyncio.get_running_loop().call_soon(self._next_turn)
        self._flush()

    def _next_turn(self) -> None:
        self._flushed_early = False

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._raw is None or self._closed:
            return
        now = time.monotonic()
        while self._unsent:
            if not self._send(self._unsent[0], now, retry=True):
                asyncio.get_running_loop().call_later(0.001, self._schedule_flush)
                return
            self._unsent.popleft()
        if self._outbox:
            queued = list(self._outbox)
            self._outbox.clear()
            for kind, run in group_outbox(queued):
                if kind is QueuedConfirm:
                    self._send_confirms([c.item for c in run], [c.future for c in run], now)
                else:
                    for frames in self._core.pack(run):
                        self._send(frames, now)
            self._room.set()
        if self._acks:
            acks, self._acks = self._acks, {}
            for frames in self._core.pack_acks(acks):
                self._send(frames, now)

    def _send_confirms(self, items: list[Publish], futures: list[Any], now: float) -> None:
        """Confirmed publishes as PUTS CONFIRM each (one per broker batch), each waiting for its reply."""
        start = 0
        for command_id, frames, count in self._core.pack_confirms(items):
            self._waiting[command_id] = Confirms(futures[start : start + count], self._release_confirms,
                                                 items[start : start + count])
            start += count
            self._send(frames, now)

    def _send(self, frames: mc0.Frames, now: float, retry: bool = False) -> bool:
        if self._unsent and not retry:
            self._unsent.append(frames)
            return False
        assert self._raw is not None
        try:
            self._send_raw(self._raw, frames)  # zsock.send_frames (int flags, no enum) or the native wire's
        except zmq.Again:
            if not retry:
                self._unsent.append(frames)
                asyncio.get_running_loop().call_later(0.001, self._schedule_flush)
            return False
        self._core.sent(now)
        if self._readable(self._raw):
            # The send processed the socket's pending events, possibly consuming the edge of the notification
            # the reader's poll waits for (ZMQ_FD is edge-triggered): read now, or frames wait for a timer.
            self._schedule_read()
        return True

    @property
    def _paused(self) -> bool:
        # Never while closing: the DISCONNECT's OK may queue behind deliveries that nobody is going to take.
        return len(self._inbox) >= self._max_inbox and not self._closing

    def _schedule_read(self) -> None:
        if not self._read_scheduled:
            self._read_scheduled = True
            asyncio.get_running_loop().call_soon(self._read_pending)

    def _read_pending(self) -> None:
        self._read_scheduled = False
        raw = self._raw
        if raw is None or self._closed or self._paused or self._failure is not None:
            return  # a paused reader polls on its own timer
        try:
            self._read(raw, time.monotonic(), self._readable, self._recv)
        except Exception as error:  # a loop callback's exception would only be logged by the loop
            self._reader_failed(error)
            return
        if self._moving:
            self._follow_move()
            return
        if self._readable(raw):
            self._schedule_read()  # the read budget ran out: the rest on the next turn

    async def _read_loop(self) -> None:
        core = self._core
        while not self._closed:
            socket, raw = self._socket, self._raw
            assert socket is not None
            assert raw is not None
            timer = core.next_timer(time.monotonic())
            if not self._watch.connected:  # refused connects are judged on a timer, not only on events
                timer = CHECK_EVERY if timer is None else min(timer, CHECK_EVERY)
            paused = self._paused
            if paused:
                await asyncio.sleep(0.01 if timer is None else min(0.01, timer))
            else:
                # Frames are read by the descriptor's callback; this task keeps the time-driven work.
                await asyncio.sleep(HOUSEKEEPING if timer is None else min(timer, HOUSEKEEPING))
            now = time.monotonic()
            if self._socket is not socket:
                continue  # reconnected meanwhile (a move): look at the new socket
            if not paused:
                # What a paused reader left, or anything an edge did not announce.
                self._read(raw, now, self._readable, self._recv)
            if self._moving:
                self._follow_move()
                wait = self._move_due(time.monotonic())
                if wait:  # the move waits (a cluster choosing its leader): so does the reader
                    await asyncio.sleep(wait)
                continue
            if core.noop_due(now):
                self._send(mc0.encode(mc0.Noop()), now)
            if not self._watch.connected:
                self._check_watch(now)
            if not self._watch.connected:
                core.last_heard = now  # silence counts on a live connection only: ZeroMQ is reconnecting
            alive = paused and self._readable(raw)
            if core.broker_silent(now) and not alive:
                self.reconnects += 1
                if len(self.endpoints) > 1:
                    self._move(None)
                    # Made here and now: a move left due would be made again by the reader, from the new
                    # connection, failing the publish sent on it meanwhile as "may or may not have been
                    # stored" (a second failure for one frozen leader, seen).
                    self._moving = False
                self._open()

    def _reconnected(self, future: asyncio.Future[mc0.Ok | mc0.Error]) -> None:
        if future.cancelled() or future.exception() is not None:
            return  # (asked first, so that asyncio does not log a stale CONNECT's failure as never retrieved)
        if future is not self._connecting:
            # An asyncio future's callbacks run a loop turn after its answer was read, and by then the reader
            # may have left that connection: a follower answers a CONNECT naming the leader and refuses the
            # publish sent behind it naming the leader too, and the reader follows the refusal at once. The
            # CONNECT's answer is then about a connection that is gone; following its LEADER would move a
            # second time, from the leader's new connection, and take what is in flight there for refused
            # (_sent_away): sent again, so stored twice (seen across a killed leader, before moves were made
            # at once: see _move). The blocking client acts on the answer as it reads it, before the refusal.
            return
        reply = future.result()
        leader = leader_of(reply) if isinstance(reply, mc0.Ok) else None
        if leader is not None and self._move(leader):
            return  # a cluster member that does not lead: the reader connects to the leader
        if isinstance(reply, mc0.Ok):
            self._moves_done()
            self._core.connected(reply)

    def _resolve(self, reply: mc0.Ok | mc0.Error) -> None:
        waiting = self._waiting.pop(reply.id, None)  # type: ignore[arg-type] - the caller checked the id
        event = self._events.pop(reply.id, None)  # type: ignore[arg-type]
        if not self._closing and self._redirected(reply) and _resendable(waiting, event):
            self._resend.append(waiting if type(waiting) is Confirms else (waiting, event))
            return
        if not self._closing and type(waiting) is Confirms and self._partly_refused(reply):
            again = waiting.settle_stored(reply)  # type: ignore[arg-type] - an OK
            if again is not None:
                self._resend.append(again)  # the entries the leader could not store go to the next one
            return
        # (A refused resubscription is settled here: the move subscribes again where it goes.)
        if type(waiting) is Confirms:
            waiting.settle(reply)
        elif waiting is not None and not waiting.done():  # type: ignore[union-attr]
            waiting.set_result(reply)  # type: ignore[union-attr]

