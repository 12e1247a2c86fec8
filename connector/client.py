"""The blocking mc0 client: a DEALER socket owned by one I/O thread, and thread-safe methods in front of it.

ZeroMQ sockets must stay on one thread, so every socket call happens on the client's I/O thread. Callers hand
it work through two bounded deques: ``publish`` appends to the outbox (no lock, no syscall on the fast path;
the I/O thread is woken through a pipe only when it is idle) and deliveries come back through the inbox.
Whatever piles up while the I/O thread is busy leaves as one PUTS batch: batching costs no latency when the
client is idle and takes over when it is not. Acks travel the same way, merged into one ACK per topic.

Thread-safety: every public method of :class:`Client` may be called from any thread. Messages are returned to
whichever thread calls :meth:`Client.receive` first.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Unpack

import zmq

from connector.base import (
    DEFAULT_ENDPOINT,
    ClientBase,
    ClientOptions,
    TopicPage,
    TopicSettings,
    make_socket,
    reply_or_raise,
    stats_event,
    topics_of,
)
from connector.core import (
    NO_HEADERS,
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
from protocol import mc0


class _Request:
    """A command waiting for the broker's OK or ERROR, resolved on the I/O thread."""

    __slots__ = ("event", "future")

    def __init__(self, event: Any) -> None:
        self.event = event
        self.future: Future[mc0.Ok] = Future()


class _Close:
    """DISCONNECT with an ID: the broker's OK proves that everything sent before it arrived."""

    __slots__ = ("event", "future")

    def __init__(self) -> None:
        self.event = mc0.Disconnect()
        self.future: Future[Any] = Future()


class Client(ClientBase):
    """A blocking mc0 client.

    >>> with Client("tcp://127.0.0.1:61616", keys="keys") as client:   # doctest: +SKIP
    ...     client.subscribe("orders")
    ...     client.publish("orders", "hello")
    ...     print(client.receive(timeout=1).text)
    """

    def __init__(self, endpoint: str = DEFAULT_ENDPOINT, **options: Unpack[ClientOptions]) -> None:
        """Connect and wait for the broker's OK. Options: see :class:`connector.base.ClientBase`."""
        super().__init__(endpoint, **options)
        self._outbox: deque[Publish | mc0.Ack | _Request | _Close] = deque()
        self._arrived = threading.Event()
        self._room = threading.Condition()
        self._signaled = False
        self._read_paused = False  # the I/O thread stopped reading because the inbox is full
        self._topics: dict[str | bytes, bytes] = {}
        self._room_wanted = False  # a publisher waits for outbox room: the I/O thread notifies after draining
        self._stopping = False  # the I/O thread must return now, clean close or not
        self._closing: _Close | None = None  # the DISCONNECT the I/O thread sent, once it has
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._context = zmq.Context()
        self._socket: zmq.Socket | None = None
        self._waiting: dict[bytes, _Request | _Close] = {}
        self._connected: Future[None] = Future()
        self._thread = threading.Thread(target=self._run, name=f"mc0-client {endpoint}", daemon=True)
        self._thread.start()
        try:
            self._connected.result(self.timeout)
        except FutureTimeout:
            self._shutdown()
            raise ConnectorError(
                f"no answer to CONNECT from {endpoint} within {self.timeout:g}s "
                "(broker down, wrong server key, or this client's key is not admitted)"
            ) from None
        except BaseException:
            self._shutdown()
            raise

    # ----------------------------------------------------------------------------------------- public methods

    def publish(
        self,
        topic: str | bytes,
        body: str | bytes,
        headers: dict[str, str] | None = None,
        *,
        confirm: bool = False,
        timeout: float | None = None,
    ) -> dict[str, str] | None:
        """Publish one message. Fire-and-forget by default; ``confirm=True`` waits for the broker's OK and
        returns its headers (``MESSAGE-ID`` among them).

        On a persistent topic the broker sends that OK only once the topic's sync level is met, and it carries
        ``MESSAGE-ID`` and ``DURABILITY``: ``fsync`` (strong: on disk), ``written`` (weak: handed to the OS)
        or ``memory`` (no flush promise)."""
        # The fast path is a few dictionary and type checks: one call per message is a publisher's whole cost.
        raw_topic = self._topics.get(topic)
        if raw_topic is None:
            raw_topic = self._topics[topic] = to_bytes(topic)
        if type(body) is not bytes:
            body = to_bytes(body)
        item = (raw_topic, body, encode_headers(headers) if headers else NO_HEADERS)
        if confirm:
            return ok_headers(self._call(mc0.Put(raw_topic, body, None, item[2]), timeout, "PUT"))
        if self._closed or self._failure is not None:
            self._check()
        if len(self._outbox) >= self._max_outbox:
            self._wait_for_room(timeout)
        self._outbox.append(item)
        if not self._signaled:
            self._wake()
        return None

    def publish_batch(
        self,
        items: Iterable[tuple[str | bytes, str | bytes, dict[str, str] | None]],
        *,
        timeout: float | None = None,
    ) -> dict[str, str]:
        """Publish ``(topic, body, headers)`` entries as one PUTS and wait for the broker's OK, which confirms
        them all — as durably as their topics promise — or an ERROR that refuses them all (ConnectorError).
        Returns the OK's headers (``COUNT``, and with ``ids`` the last ``MESSAGE-ID`` and ``DURABILITY``)."""
        event = puts_event(items)
        if not event.items:
            return {}
        return ok_headers(self._call(event, timeout, "PUTS"))

    def subscribe(
        self,
        *topics: str | bytes,
        replay: mc0.Replay | None = None,
        credit: int | None = None,
        explicit_acks: bool = False,
        timeout: float | None = None,
    ) -> None:
        """Subscribe and wait for the broker's OK; raises ConnectorError on ERROR or timeout.

        ``replay`` ("beginning", "current" or a message id) starts a persistent broadcast topic in its log
        (the broker refuses it on a transient topic); ``credit`` bounds the messages in flight to this client;
        ``explicit_acks`` keeps each message in flight until :meth:`ack` (on a round-robin topic, what this
        client has not acked goes to another consumer when it disconnects). After a reconnect every topic
        resumes right after the last message received (see :attr:`last_ids`), with the same options.
        """
        self._call(sub_event(topics, replay, credit, explicit_acks), timeout, "SUB")

    def unsubscribe(self, *topics: str | bytes, timeout: float | None = None) -> None:
        self._call(mc0.Unsub([to_bytes(t) for t in topics]), timeout, "UNSUB")

    def ack(self, message_or_topic: Message | str | bytes, *ids: int) -> None:
        """Confirm a received message (``ack(message)``) or ids of a topic (``ack(topic, 7, 8)``) on a
        subscription made with ``explicit_acks``. Fire-and-forget: the broker answers nothing; acks queued
        together leave as one ACK per topic, after the publishes queued before them."""
        topic, message_ids = ack_target(message_or_topic, ids)
        self._check()
        self._outbox.append(mc0.Ack(topic, message_ids))
        if not self._signaled:
            self._wake()

    def declare(
        self, topic: str | bytes, *, timeout: float | None = None, **settings: Unpack[TopicSettings]
    ) -> None:
        """Create ``topic`` with these settings (see :class:`connector.base.TopicSettings`) and wait for the
        OK. Declaring the settings a topic already has is fine; other settings raise ConnectorError."""
        self._call(declare_event(topic, settings), timeout, "DECLARE")

    def delete(self, topic: str | bytes, *, timeout: float | None = None) -> None:
        """Remove ``topic``, its stored messages and their files. Refused (ConnectorError) while anybody
        subscribes to it, or if there is no such topic."""
        self._call(mc0.Delete(to_bytes(topic)), timeout, "DELETE")

    def flush(self, timeout: float | None = None) -> None:
        """Return once the broker has taken every message published before this call (a NOOP round trip)."""
        self._call(mc0.Noop(), timeout, "NOOP")

    def stats(self, timeout: float | None = None, **page: Unpack[TopicPage]) -> dict[str, Any]:
        """The broker's counters, with one page of topics (see :class:`connector.base.TopicPage`)."""
        reply = self._call(stats_event(page), timeout, "STATS")
        return json.loads(reply.body or b"{}")

    def topics(self, timeout: float | None = None, **page: Unpack[TopicPage]) -> dict[str, Any]:
        """Topic name -> settings and counters (the ``topics`` part of :meth:`stats`): ids, backlog, lag...
        One page of them (1,000 by default): ``prefix``, ``after`` and ``limit`` choose which."""
        return topics_of(self.stats(timeout, **page))

    def fetch(
        self,
        topic: str | bytes,
        start: int | None = None,
        *,
        max_messages: int = mc0.FETCH_DEFAULT_MAX_MESSAGES,
        max_bytes: int = mc0.FETCH_DEFAULT_MAX_BYTES,
        timeout: float | None = None,
    ) -> FetchResult:
        """Read stored messages of a persistent topic, from id ``start`` on (None: the oldest stored), without
        subscribing: at most ``max_messages`` (the broker caps it at 10,000) whose bodies add up to at most
        ``max_bytes`` (capped at 16 MiB), but always at least one if there is one, however large.

        The broker reads after it has written what it received, so everything confirmed before this call is
        there, and ``next_id`` is exactly what can be read. ``max_messages=0`` asks for the ids only (see
        :meth:`offsets`). A transient topic has no log: ConnectorError, with the broker's reason."""
        reply = self._call(fetch_event(topic, start, max_messages, max_bytes), timeout, "FETCH")
        return fetch_result(topic, reply)

    def offsets(self, topic: str | bytes, timeout: float | None = None) -> tuple[int, int]:
        """``(first_id, next_id)`` of a persistent topic: the oldest stored id and one past the newest (a
        topic nobody has written to yet is ``(1, 1)``)."""
        result = self.fetch(topic, max_messages=0, timeout=timeout)
        return result.first_id, result.next_id

    def receive(self, timeout: float | None = None) -> Message | None:
        """The next delivered message, or None after ``timeout`` seconds (None = wait forever)."""
        inbox = self._inbox
        if inbox:
            message = inbox.popleft()  # fast path: no lock, no clock
            if self._read_paused and len(inbox) <= self._max_inbox // 2:
                self._read_paused = False
                self._wake()  # room again: the I/O thread resumes reading the socket
            return message
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._arrived.clear()
            try:
                return inbox.popleft()
            except IndexError:
                pass
            self._check()
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return None
            if self._read_paused:
                self._read_paused = False
                self._wake()  # the inbox is empty: let the I/O thread read again
            self._arrived.wait(remaining if remaining is None else min(remaining, 1.0))

    def __iter__(self) -> Iterator[Message]:
        while True:
            message = self.receive()
            if message is not None:
                yield message

    def close(self, timeout: float = 5.0) -> None:
        """Send what is queued, say DISCONNECT and stop the I/O thread. Idempotent.

        The DISCONNECT carries an ID and close() waits (up to ``timeout``) for its OK: the OK proves that
        everything sent before it reached the broker, which closing the socket at once would not.
        """
        if self._closed:
            return
        self._closed = True
        closing = _Close()
        self._outbox.append(closing)
        self._wake()
        if self._thread.is_alive():
            with contextlib.suppress(FutureTimeout, ConnectorError):
                closing.future.result(timeout)
        self._shutdown()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------------ caller-side helpers

    @property
    def _paused_reading(self) -> bool:
        # Never once DISCONNECT is out: its OK may queue behind deliveries that nobody is going to take.
        return len(self._inbox) >= self._max_inbox and self._closing is None

    def _wake(self) -> None:
        self._signaled = True
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"!")

    def _call(self, event: Any, timeout: float | None, what: str) -> mc0.Ok:
        self._check()
        request = _Request(event)
        self._outbox.append(request)
        self._wake()
        wait = self.timeout if timeout is None else timeout
        try:
            reply = request.future.result(wait)
        except FutureTimeout:
            raise ConnectorError(f"no answer to {what} within {wait:g}s") from None
        return reply_or_raise(reply, what)

    def _wait_for_room(self, timeout: float | None) -> None:
        wait = self.timeout if timeout is None else timeout
        with self._room:
            self._room_wanted = True
            if not self._room.wait_for(
                lambda: len(self._outbox) < self._max_outbox or self._failure or self._closed, wait
            ):
                raise ConnectorError(f"outbox full for {wait:g}s: the broker is not taking messages")
        self._check()

    def _shutdown(self) -> None:
        self._closed = True
        self._stopping = True
        self._wake()
        self._thread.join(timeout=5)
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._context.term()

    # ----------------------------------------------------------------------------------------- the I/O thread

    def _run(self) -> None:
        try:
            self._open()
            self._loop()
        except BaseException as error:  # surfaced to callers through _check() and their futures
            self._failure = error
            if not self._connected.done():
                self._connected.set_exception(ConnectorError(str(error)))
        finally:
            for request in self._waiting.values():
                if not request.future.done():
                    request.future.set_exception(ConnectorError("client stopped before the broker answered"))
            while self._outbox:  # popleft, not iteration: other threads may still be appending
                item = self._outbox.popleft()
                if isinstance(item, _Request | _Close) and not item.future.done():
                    item.future.set_exception(ConnectorError("client stopped"))
            if self._socket is not None:
                self._socket.close(linger=0)
            with self._room:
                self._room.notify_all()
            self._arrived.set()

    def _open(self) -> None:
        """A new DEALER (new identity), CONNECT, and SUB for everything subscribed before."""
        if self._socket is not None:
            self._socket.close(linger=0)
        self._socket = make_socket(self._context, self.endpoint, self._credentials)
        self._unsent.clear()
        for request in self._waiting.values():
            request.future.set_exception(ConnectorError("connection to the broker was lost"))
        self._waiting.clear()
        now = time.monotonic()
        command_id, frames = self._core.connect(now)
        connect = _Request(None)
        connect.future.add_done_callback(self._on_connected)
        self._waiting[command_id] = connect
        self._send(frames, now)
        for command_id, frames in self._core.resubscribe():
            self._waiting[command_id] = _Request(None)
            self._send(frames, now)

    def _on_connected(self, future: Future[mc0.Ok]) -> None:
        with contextlib.suppress(BaseException):
            reply = future.result()
            if isinstance(reply, mc0.Ok):
                self._core.connected(reply)
                if not self._connected.done():
                    self._connected.set_result(None)
            elif not self._connected.done():
                self._connected.set_exception(ConnectorError(reply.message.decode("utf-8", "replace")))

    def _loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self._wake_r, zmq.POLLIN)
        core = self._core
        while True:
            socket = self._socket
            assert socket is not None
            self._read_paused = self._paused_reading
            flags = 0 if self._read_paused else zmq.POLLIN
            if self._unsent:
                flags |= zmq.POLLOUT
            poller.register(socket, flags)  # register() on a registered socket modifies its flags
            timer = core.next_timer(time.monotonic())
            events = dict(poller.poll(None if timer is None else int(timer * 1000) + 1))
            poller.register(socket, 0)  # unregisters; a no-op when paused reading left it unregistered
            if self._wake_r in events:
                with contextlib.suppress(BlockingIOError):
                    os.read(self._wake_r, 4096)
            self._signaled = False  # cleared before the outbox is drained, so no publish is left unseen
            now = time.monotonic()
            if self._stopping:
                return  # close() stopped waiting, or the constructor gave up
            if not self._paused_reading:
                self._read(socket, now)
            if self._closing is not None and self._closing.future.done():
                return  # DISCONNECT answered (or failed): everything sent before it reached the broker
            self._write(now)
            if core.noop_due(now):
                self._send(mc0.encode(mc0.Noop()), now)
            if core.broker_silent(now) and not self._data_waiting(socket):
                self.reconnects += 1
                self._open()

    def _data_waiting(self, socket: zmq.Socket) -> bool:
        # While reading is paused for a full inbox, unread data proves the broker is alive.
        return self._paused_reading and bool(socket.get(zmq.EVENTS) & zmq.POLLIN)

    def _resolve(self, reply: mc0.Ok | mc0.Error) -> None:
        request = self._waiting.pop(reply.id, None)  # type: ignore[arg-type] - the caller checked the id
        if request is not None:
            self._settle(request, reply)

    def _settle(self, request: _Request | _Close, reply: mc0.Ok | mc0.Error) -> None:
        # A refused SUB was already undone in the core's subscriptions when its ERROR was read.
        if not request.future.done():
            request.future.set_result(reply)

    def _write(self, now: float) -> None:
        """Send what callers queued, in order, up to and including the DISCONNECT of a close()."""
        while self._unsent:
            if not self._send(self._unsent[0], now, retry=True):
                return
            self._unsent.popleft()
        if self._closing is not None:
            return  # nothing queued after close() goes out
        outbox = self._outbox
        core = self._core
        batch: list[Publish] = []
        acks: dict[bytes, list[int]] = {}  # merged per topic until the next command or the end of the outbox
        while outbox:
            item = outbox.popleft()
            if type(item) is tuple:
                batch.append(item)
                continue
            if type(item) is mc0.Ack:
                acks.setdefault(item.topic, []).extend(item.message_ids)
                continue
            self._send_publishes(batch, now)
            batch = []
            self._send_acks(acks, now)
            acks = {}
            if isinstance(item, _Close):
                command_id, frames = core.request(item.event)
                self._waiting[command_id] = item
                self._closing = item
                self._send(frames, now)
                return
            command_id, frames = core.command(item.event)
            self._waiting[command_id] = item
            self._send(frames, now)
        self._send_publishes(batch, now)
        self._send_acks(acks, now)
        if self._room_wanted:
            with self._room:
                self._room.notify_all()

    def _send_publishes(self, batch: list[Publish], now: float) -> None:
        if batch:
            for frames in self._core.pack(batch):
                self._send(frames, now)

    def _send_acks(self, acks: dict[bytes, list[int]], now: float) -> None:
        if acks:
            for frames in self._core.pack_acks(acks):
                self._send(frames, now)

    def _send(self, frames: mc0.Frames, now: float, retry: bool = False) -> bool:
        """Send or keep in order for later; never blocks the I/O thread."""
        if self._unsent and not retry:
            self._unsent.append(frames)
            return False
        socket = self._socket
        assert socket is not None
        try:
            socket.send_multipart(frames, zmq.NOBLOCK)
        except zmq.Again:
            if not retry:
                self._unsent.append(frames)
            return False
        self._core.sent(now)
        return True
