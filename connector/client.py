"""The blocking mc0 client: a DEALER socket owned by one I/O thread, and thread-safe methods in front of it.

The socket belongs to the client's I/O thread, which holds the client's I/O lock whenever it touches it (all
the time but its wait in ``poll``). Callers hand it work through two bounded deques: ``publish`` appends to
the outbox (no lock, no syscall on the fast path; the I/O thread is woken through a pipe only when it is idle)
and deliveries come back through the inbox. Whatever piles up while the I/O thread is busy leaves as one PUTS
batch: batching takes over when the client is busy. Acks travel the same way, merged into one ACK per topic.

A publish that comes alone (nothing queued, the I/O thread waiting, the caller's previous publish at least
``DIRECT_GAP`` ago; or a ``publish(confirm=True)``, whose caller waits for its OK anyway) is sent by the
caller itself, under that lock: handing it to the I/O thread cost it a thread wake-up, 50-90 us of latency
on the machines we measure. ZeroMQ allows a socket to move between threads through a full memory barrier,
which the lock is; the I/O thread waits on the socket's descriptor with an OS ``poll``, never inside libzmq,
so no ZeroMQ call ever runs on two threads at once.

The socket is the client's own ZMTP on a TCP socket for a ``tcp://`` broker
(:mod:`connector.native_blocking`, ``wire="auto"``, the default): a caller's send is then one ``sendmsg``
and a delivery one read on the I/O thread, with no libzmq I/O thread on either way. ``wire="zeromq"`` (and
any endpoint only libzmq reads) keeps a libzmq DEALER. The same lock guards both.

Thread-safety: every public method of :class:`Client` may be called from any thread. Messages are returned to
whichever thread calls :meth:`Client.receive` first.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Unpack

import zmq

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
    NO_HEADERS,
    ConnectorError,
    FetchResult,
    Message,
    Outcome,
    Publish,
    RecordsResult,
    ack_target,
    confirm_headers,
    declare_event,
    encode_headers,
    fetch_event,
    fetch_result,
    ok_headers,
    puts_event,
    records_result,
    sub_event,
    to_bytes,
)
from connector.native import check_wire, wire_address
from connector.native_blocking import BlockingNativeSocket
from connector.zsock import POLLIN, POLLOUT, pending_events, readable, recv_frames, send_frames
from protocol import mc0
from protocol.bodies import TopicBodies

#: A fire-and-forget publish that follows the caller's previous one by at least this many seconds, with
#: nothing queued, is sent by the caller's thread (see the module docstring); closer ones are a burst, which
#: the I/O thread batches. About what handing a publish to the I/O thread costs in latency.
DIRECT_GAP = 100e-6
#: The longest a caller waiting in receive() reads the native wire's socket itself before it leaves the socket
#: to the I/O thread for a turn (Client._read_directly): what it may delay the I/O thread's timers by.
DIRECT_WAIT = 0.05


class _Request:
    """A command waiting for the broker's OK or ERROR, resolved on the I/O thread."""

    __slots__ = ("event", "future")

    def __init__(self, event: Any) -> None:
        self.event = event
        self.future: Future[Any] = Future()

    def settle(self, reply: mc0.Ok | mc0.Error) -> None:
        # A refused SUB was already undone in the core's subscriptions when its ERROR was read.
        if not self.future.done():
            self.future.set_result(reply)

    def fail(self, why: str) -> None:
        if not self.future.done():
            self.future.set_exception(ConnectorError(why))


def _resendable(request: Any) -> bool:
    """Whether a waiting command may go to another broker when the one it went to did not store it: what
    callers published (not a CONNECT or a resubscription, which the move makes again)."""
    return type(request) is _BulkConfirms or (type(request) is _Request and request.event is not None)


class _Close(_Request):
    """DISCONNECT with an ID: the broker's OK proves that everything sent before it arrived."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(mc0.Disconnect())


#: What a command waits in: its own future, or the futures of the publishes it confirms.
_Waiting = _Request | Confirms


def _fail(waiting: _Waiting, why: str) -> None:
    waiting.fail(why)


class Confirmation:
    """The future of one confirmed publish, as :meth:`Client.publish_async` returns it.

    It offers what a ``concurrent.futures.Future`` offers for one result (``done()``, ``result(timeout)``,
    ``exception(timeout)``, ``add_done_callback(fn)``; a timeout raises TimeoutError), but costs a fraction
    of one: it has no lock of its own, waiting uses its client's condition, which the I/O thread notifies once
    per command the broker answered, not once per message, and the confirmations of one command are settled
    together (:class:`_BulkConfirms`), the headers of each made only when asked for. Callbacks run on the I/O
    thread, or at once if the confirmation is already settled."""

    __slots__ = ("_callbacks", "_condition", "_done", "_error", "_result")

    def __init__(self, condition: threading.Condition) -> None:
        self._condition = condition
        self._done = False
        self._result: tuple[int, str] | dict[str, str] | None = None
        self._error: BaseException | None = None
        self._callbacks: list[Callable[[Confirmation], object]] | None = None

    def done(self) -> bool:
        return self._done

    def result(self, timeout: float | None = None) -> dict[str, str]:
        """The OK's headers (``MESSAGE-ID``, ``DURABILITY``); raises the ConnectorError that refused or lost
        the message, or TimeoutError after ``timeout`` seconds (None: wait as long as it takes)."""
        error = self.exception(timeout)
        if error is not None:
            raise error
        result = self._result
        if type(result) is tuple:  # as the reply decoded it: the headers are made once, when first asked for
            result = self._result = confirm_headers(result)
        return result  # type: ignore[return-value] - set when done without an error

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if not self._done:
            with self._condition:
                if not self._condition.wait_for(lambda: self._done, timeout):
                    raise TimeoutError(f"the broker has not confirmed this publish within {timeout:g}s")
        return self._error

    def add_done_callback(self, callback: Callable[[Confirmation], object]) -> None:
        with self._condition:
            if not self._done:
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append(callback)
                return
        callback(self)

    def set_result(self, result: dict[str, str]) -> None:
        self._settle(result, None)

    def set_exception(self, error: BaseException) -> None:
        self._settle(None, error)

    def _settle(self, result: dict[str, str] | None, error: BaseException | None) -> None:
        # Waiters are woken by the client once per settled command (Client._release_confirms).
        with self._condition:
            self._result = result
            self._error = error
            self._done = True
            callbacks, self._callbacks = self._callbacks, None
        for callback in callbacks or ():
            callback(self)


def _settle_all(confirmations: list[Confirmation], outcomes: list[Outcome]) -> None:
    """Settle the confirmations of one command (of one client: they share its condition) with the broker's
    ``outcomes``: a few attribute stores each, and the condition taken once for all of them, for their
    callbacks. Their waiters are woken afterwards, once (Client._release_confirms)."""
    if not confirmations:
        return
    condition = confirmations[0]._condition
    for confirmation, outcome in zip(confirmations, outcomes, strict=True):
        if isinstance(outcome, ConnectorError):
            confirmation._error = outcome
        else:
            confirmation._result = outcome
        confirmation._done = True  # last: a reader that sees it done sees the outcome (the GIL orders stores)
    # add_done_callback checks _done under the condition, so after this a callback is either in the lists
    # taken here or called by add_done_callback itself, never both or neither.
    with condition:
        called = [(confirmation, callbacks) for confirmation in confirmations
                  if (callbacks := confirmation._callbacks) is not None]
        for confirmation, _ in called:
            confirmation._callbacks = None
    for confirmation, callbacks in called:
        for callback in callbacks:
            callback(confirmation)


class _BulkConfirms(Confirms):
    """The :class:`Confirms` of a :class:`Client`: its :class:`Confirmation` futures, settled together."""

    __slots__ = ()

    def _settle(self, futures: list[Any], outcomes: list[Outcome]) -> None:
        _settle_all(futures, outcomes)  # the client makes them Confirmations


class _Arrivals:
    """Wakes a thread waiting in :meth:`Client.receive` once deliveries reach the inbox (or the client stops):
    a lock held while nothing is signalled, which :meth:`set` releases and :meth:`wait` acquires.

    Why not ``threading.Event``: its ``set`` and ``wait`` run a Condition in Python. A hand-off from one
    thread to another waiting, at a paced 1,000 a second, took p50 30 us and p90 40-50 us through an Event,
    20-22 and 29-34 us through a lock (three runs each). The price: a ``set`` wakes one waiter, not all, so a
    waiter that leaves something behind (more deliveries, or the client's failure) passes it on with
    ``set`` for the next one.
    """

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()  # nothing has arrived yet

    def set(self) -> None:
        if self._lock.locked():
            with contextlib.suppress(RuntimeError):  # released by another set in between
                self._lock.release()

    def wait(self, timeout: float | None) -> bool:
        """Until something is signalled (True, the signal taken) or ``timeout`` seconds pass (False)."""
        return self._lock.acquire(True, -1 if timeout is None else timeout)


class Client(ClientBase):
    """A blocking mc0 client.

    >>> with Client("tcp://127.0.0.1:61616", keys="keys") as client:   # doctest: +SKIP
    ...     client.subscribe("orders")
    ...     client.publish("orders", "hello")
    ...     print(client.receive(timeout=1).text)
    """

    def __init__(self, endpoint: str | Sequence[str] = DEFAULT_ENDPOINT, *, wire: str | None = None,
                 **options: Unpack[ClientOptions]) -> None:
        """Connect and wait for the broker's OK. ``endpoint``: one broker, or a cluster's members (a list, or
        addresses separated by commas): the client connects to the leader and follows it. ``wire``: ``auto``
        (the default, :data:`connector.native.DEFAULT_WIRE`) speaks ZMTP itself to a ``tcp://`` broker
        (:mod:`connector.native_blocking`) and goes through libzmq for any other endpoint; ``native`` refuses
        other endpoints; ``zeromq`` always goes through libzmq. Other options: see
        :class:`connector.base.ClientBase`."""
        wire = check_wire(wire)
        super().__init__(endpoint, **options)
        self.wire = wire
        self._outbox: deque[Publish | mc0.Ack | _Request | QueuedConfirm] = deque()
        self._in_flight = 0  # confirmed publishes queued or sent and not yet settled (guarded by _room)
        self._arrived = _Arrivals()
        # A plain lock under the condition: the publish paths take it as a C-level context manager.
        self._room_lock = threading.Lock()
        self._room = threading.Condition(self._room_lock)
        self._signaled = False
        # Held by the I/O thread whenever it touches the socket, the protocol core or its queues of commands
        # (everything but its wait in poll); taken without waiting by a caller sending at once (_send_now).
        self._io_lock = threading.Lock()
        self._last_publish = 0.0  # when the last fire-and-forget publish was made (time.monotonic)
        self._read_paused = False  # the I/O thread stopped reading because the inbox is full
        self._topics: dict[str | bytes, bytes] = {}
        self._room_wanted = False  # a publisher waits for outbox room: the I/O thread notifies after draining
        self._stopping = False  # the I/O thread must return now, clean close or not
        self._closing: _Close | None = None  # the DISCONNECT the I/O thread sent, once it has
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._context = zmq.Context()
        self._socket: zmq.Socket | BlockingNativeSocket | None = None
        self._monitor: zmq.Socket | None = None  # a libzmq socket's connection events
        self._monitor_fd = self._socket_fd = -1  # their descriptors, which the I/O thread polls
        # The socket's calls: connector.zsock's on a libzmq socket, BlockingNativeSocket's on the native wire;
        # _stirred says, after a caller's send, that the I/O thread must look at the socket (see _send_now).
        self._readable: Callable[[Any], bool] = readable
        self._recv: Callable[[Any], list[bytes]] = recv_frames
        self._send_raw: Callable[[Any, mc0.Frames], None] = send_frames
        self._stirred: Callable[[Any], bool] = readable
        self._waiting: dict[bytes, _Waiting] = {}
        self._connected: Future[None] = Future()
        self._thread = threading.Thread(target=self._run, name=f"mc0-client {endpoint}", daemon=True)
        self._thread.start()
        try:
            self._connected.result(self.timeout)
        except FutureTimeout:
            self._shutdown()
            raise ConnectorError(self._watch.timed_out(self.timeout)) from None
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
            wait = self.timeout if timeout is None else timeout
            try:
                return self._confirm(item, wait, at_once=True).result(wait)
            except FutureTimeout:
                raise ConnectorError(f"no answer to PUT within {wait:g}s") from None
        if self._closed or self._failure is not None:
            self._check()
        if len(self._outbox) >= self._max_outbox:
            self._wait_for_room(timeout)
        now = time.monotonic()
        alone = now - self._last_publish >= DIRECT_GAP
        self._last_publish = now
        if alone and not self._outbox and not self._signaled and self._send_now(item, None, now):
            return None
        self._outbox.append(item)
        if not self._signaled:
            self._wake()
        return None

    def publish_async(
        self,
        topic: str | bytes,
        body: str | bytes,
        headers: dict[str, str] | None = None,
        *,
        timeout: float | None = None,
    ) -> Confirmation:
        """Publish one message and return at once a future of the broker's confirmation (a
        :class:`Confirmation`), as RabbitMQ's publisher confirms and JetStream's ``publish_async`` do: it
        resolves to the OK's headers
        (``MESSAGE-ID``, ``DURABILITY``: sent only once the topic's sync level is met) or raises the
        broker's refusal of this message (ConnectorError), and fails (ConnectorError) if the connection is
        lost before the broker answered. Futures resolve in the order the messages were published.

        Confirmed publishes in flight travel together: whatever is queued when the I/O thread writes leaves
        as one ``PUTS CONFIRM each``, and the broker stores and answers them in one turn (one fsync on a
        strong topic), yet refuses only the entries it cannot store. At most ``max_confirms`` are in flight;
        beyond that this call waits up to ``timeout`` (the client's by default) for room. :meth:`flush` waits
        for every confirmation asked for before it; :meth:`close` too, or fails the ones left."""
        raw_topic = self._topics.get(topic)
        if raw_topic is None:
            raw_topic = self._topics[topic] = to_bytes(topic)
        if type(body) is not bytes:
            body = to_bytes(body)
        item = (raw_topic, body, encode_headers(headers) if headers else NO_HEADERS)
        return self._confirm(item, self.timeout if timeout is None else timeout)

    def _confirm(self, item: Publish, wait: float, at_once: bool = False) -> Confirmation:
        """Queue a confirmed publish; ``at_once``: its caller waits for this confirmation before it publishes
        again (``publish(confirm=True)``), so it is sent from the caller's thread if nothing is queued. The
        futures of ``publish_async`` always go through the I/O thread, which sends what is queued together
        (one ``PUTS CONFIRM each``: one fsync for all of them on a strong topic)."""
        self._check()
        with self._room_lock:
            if self._in_flight >= self._max_confirms:
                self._wait_for_confirms(wait)
            self._in_flight += 1
        confirmation = Confirmation(self._room)
        if at_once and not self._outbox and not self._signaled and self._send_now(item, confirmation,
                                                                                 time.monotonic()):
            return confirmation
        self._outbox.append(QueuedConfirm(item, confirmation))
        if not self._signaled:
            self._wake()
        return confirmation

    def _send_now(self, item: Publish, confirmation: Confirmation | None, now: float) -> bool:
        """Send one publish from the caller's thread, if the I/O thread is waiting in poll and has nothing
        queued or unsent (so nothing published before it can be overtaken); False if it was not sent, and the
        caller queues it as usual. Never waits for the lock: a busy I/O thread will send it soon enough."""
        lock = self._io_lock
        if not lock.acquire(blocking=False):
            return False
        try:
            socket = self._socket
            if (socket is None or self._outbox or self._unsent or self._closing is not None or self._stopping
                    or self._failure is not None):
                return False
            command_id = None
            if confirmation is None:
                frames = next(iter(self._core.pack([item])))
            else:
                command_id, frames, _ = next(self._core.pack_confirms([item]))
                self._waiting[command_id] = _BulkConfirms([confirmation], self._release_confirms, [item])
            try:
                self._send_raw(socket, frames)
            except zmq.Again:  # the pipe is full: the I/O thread sends it once there is room
                if command_id is not None:
                    del self._waiting[command_id]
                return False
            self._core.sent(now)
            if self._stirred(socket):
                # libzmq: the send took in the socket's pending events, and with them the signal on its
                # descriptor that the I/O thread waits for: frames are waiting, so wake it to read them. The
                # native wire: the kernel did not take the whole message, and the I/O thread waits for room.
                self._wake()
            return True
        finally:
            lock.release()

    def _wait_for_confirms(self, wait: float) -> None:
        """Wait (holding the room's lock, as its condition does) until fewer than ``max_confirms`` confirmed
        publishes are in flight."""
        limit = self._max_confirms
        if not self._room.wait_for(
            lambda: self._in_flight < limit or self._failure is not None or self._closed, wait
        ):
            raise ConnectorError(f"{limit} confirmed publishes in flight for {wait:g}s: the broker is not "
                                 "confirming them")
        self._check()

    def _release_confirms(self, count: int) -> None:
        """``count`` confirmations settled (on the I/O thread): room for more, and their waiters wake."""
        with self._room:
            self._in_flight -= count
            self._room.notify_all()

    def publish_batch(
        self,
        items: Iterable[tuple[str | bytes, str | bytes, dict[str, str] | None]] | TopicBodies,
        *,
        producer: str | bytes | None = None,
        sequence: int | None = None,
        timeout: float | None = None,
    ) -> dict[str, str]:
        """Publish ``(topic, body, headers)`` entries as one PUTS and wait for the broker's OK, which confirms
        them all — as durably as their topics promise — or an ERROR that refuses them all (ConnectorError).
        Returns the OK's headers (``COUNT``, and with ``ids`` the last ``MESSAGE-ID`` and ``DURABILITY``).

        Idempotent with ``producer`` (an id of yours, up to 255 bytes) and ``sequence`` (the first entry's
        number; entry ``i`` is ``sequence + i``, and a producer's numbers only grow, per topic): the batch
        names one topic, and the broker stores only the entries that producer has not stored there yet, so the
        same batch sent again after a lost answer, a reconnect or a broker restart lands once. The OK's
        ``DUPLICATES`` says how many leading entries were already stored, ``COUNT`` how many were stored now
        (docs/mc0.md, "Idempotent PUTS"). A batch that would leave a gap after the numbers the topic holds
        from that producer is refused ("out of sequence": send the one it names first)."""
        event = puts_event(items, producer, sequence)
        if not event.items:
            return {}
        return ok_headers(self._call(event, timeout, "PUTS"))

    def publish_batch_later(
        self,
        items: Iterable[tuple[str | bytes, str | bytes, dict[str, str] | None]] | TopicBodies,
        *,
        producer: str | bytes | None = None,
        sequence: int | None = None,
    ) -> Future[dict[str, str]]:
        """:meth:`publish_batch` without waiting: a Future of the OK's headers (ConnectorError if refused).
        Batches sent this way travel in order, so a publisher can keep several in flight; with a producer,
        a batch that fails can be sent again with the same numbers, and what the broker stored is skipped.
        The broker refuses the batches after a refused one as out of sequence, but takes a producer's first
        batch in a topic wherever it begins: wait for that one's answer before sending the next.
        ``items`` may be one topic's bodies as columns (:class:`protocol.bodies.TopicBodies`: the Spark sink
        builds them from Arrow buffers), which the broker stores without a Python object per entry."""
        return self._later(puts_event(items, producer, sequence), "PUTS", ok_headers)

    def _later(self, event: Any, what: str, convert: Any) -> Future[Any]:
        """Queue ``event`` and return a Future of ``convert(OK)`` (ConnectorError for an ERROR or a lost
        connection); the caller waits on it with a timeout of its choice."""
        self._check()
        request = _Request(event)
        out: Future[Any] = Future()

        def settle(done: Future[mc0.Ok]) -> None:
            try:
                out.set_result(convert(reply_or_raise(done.result(), what)))
            except BaseException as error:  # handed to whoever waits on the Future
                out.set_exception(error)

        request.future.add_done_callback(settle)
        self._outbox.append(request)
        self._wake()
        return out

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
        """Return once the broker has taken every message published before this call (a NOOP round trip),
        and every confirmation asked for before it has resolved: the broker answers in order."""
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
        wait: float | None = None,
        at_time: int | None = None,
        incarnation: str | None = None,
        timeout: float | None = None,
    ) -> FetchResult:
        """Read stored messages of a persistent topic, from id ``start`` on (None: the oldest stored), without
        subscribing: at most ``max_messages`` (the broker caps it at 10,000) whose bodies add up to at most
        ``max_bytes`` (capped at 16 MiB), but always at least one if there is one, however large.

        The broker reads after it has written what it received, so everything confirmed before this call is
        there, and ``next_id`` is exactly what can be read. ``max_messages=0`` asks for the ids only (see
        :meth:`offsets`). A transient topic has no log: ConnectorError, with the broker's reason.

        ``wait`` (seconds, at most 60): when nothing is stored from ``start`` on, the broker answers as soon
        as something is, or after ``wait`` (a long poll; ``incarnation``, the log the caller knows, makes it
        answer at once if the topic's log is another one now). ``at_time`` (ms since the epoch) instead of
        ``start``: from the first message stored at or after that time (``result.start_id`` says which)."""
        event = fetch_event(topic, start, max_messages, max_bytes, wait=wait, at_time=at_time,
                            incarnation=incarnation)
        reply = self._call(event, self._waiting_timeout(timeout, wait), "FETCH")
        return fetch_result(topic, reply)

    def fetch_records(
        self,
        topic: str | bytes,
        start: int | None = None,
        *,
        max_messages: int = mc0.FETCH_MAX_MESSAGES,
        max_bytes: int = mc0.FETCH_DEFAULT_MAX_BYTES,
        wait: float | None = None,
        at_time: int | None = None,
        incarnation: str | None = None,
        timeout: float | None = None,
    ) -> RecordsResult:
        """:meth:`fetch`, with the stored records as the log holds them instead of decoded messages: one copy
        on the broker, no per-message work there, and the reader takes the fields it wants in bulk
        (:func:`protocol.records.walk`, :func:`protocol.records.decode`). ``max_bytes`` bounds the records'
        bytes (16 per record more than their bodies'), and a reply stops at the end of a segment."""
        event = fetch_event(topic, start, max_messages, max_bytes, wait=wait, at_time=at_time,
                            incarnation=incarnation, records=True)
        reply = self._call(event, self._waiting_timeout(timeout, wait), "FETCH")
        return records_result(topic, reply)

    def fetch_later(
        self,
        topic: str | bytes,
        start: int | None = None,
        *,
        max_messages: int = mc0.FETCH_DEFAULT_MAX_MESSAGES,
        max_bytes: int = mc0.FETCH_DEFAULT_MAX_BYTES,
        wait: float | None = None,
        at_time: int | None = None,
        incarnation: str | None = None,
        records: bool = False,
    ) -> Future[Any]:
        """:meth:`fetch` (or :meth:`fetch_records` with ``records``) without waiting: a Future of its result.
        Long polls on many topics at once, or the next range read while the last one is being used."""
        event = fetch_event(topic, start, max_messages, max_bytes, wait=wait, at_time=at_time,
                            incarnation=incarnation, records=records)
        convert = records_result if records else fetch_result
        return self._later(event, "FETCH", lambda reply: convert(topic, reply))

    def _waiting_timeout(self, timeout: float | None, wait: float | None) -> float:
        """A long poll's answer may take its wait on top of the usual time."""
        return (self.timeout if timeout is None else timeout) + min(wait or 0, mc0.FETCH_MAX_WAIT_MS / 1000)

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
        arrived = self._arrived
        while True:
            try:
                message = inbox.popleft()
            except IndexError:
                pass
            else:
                if inbox:
                    arrived.set()  # more than this: another waiting thread may take it
                return message
            try:
                self._check()
            except ConnectorError:
                arrived.set()  # the next waiting thread learns it too
                raise
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return None
            if self._read_paused:
                self._read_paused = False
                self._wake()  # the inbox is empty: let the I/O thread read again
            if type(self._socket) is BlockingNativeSocket and self._read_directly(remaining):
                continue
            arrived.wait(remaining if remaining is None else min(remaining, 1.0))

    def _read_directly(self, remaining: float | None) -> bool:
        """Wait for deliveries on the native wire's socket from the caller's own thread, and read them here:
        True if some were read (into the inbox). False at once if the I/O thread is at work (its lock is
        taken), or if it has anything to do (queued sends, events, a reconnect, a close) or any command waits
        for its answer (so futures and their callbacks are settled on the I/O thread, as documented): the
        caller then waits for the I/O thread's hand-off as usual. Also False when a publisher wakes the I/O
        thread meanwhile, or after at most ``DIRECT_WAIT`` seconds (or the I/O thread's next timer), so the
        I/O thread's own work is never held up longer.

        Why: the hand-off from the I/O thread to a caller waiting in receive() was a thread wake-up and a turn
        for the GIL, 20-25 us at the median of the 40 from a read's end to receive() returning (paced
        1,000 msg/s). Here the kernel wakes the caller itself. The I/O thread, waiting on the same descriptor,
        wakes too and finds nothing left to read; it waits for the I/O lock meanwhile, as it does for a
        caller's direct send."""
        lock = self._io_lock
        if not lock.acquire(blocking=False):
            return False
        try:
            socket = self._socket
            if (type(socket) is not BlockingNativeSocket or self._stopping or self._closing is not None
                    or self._signaled or self._outbox or self._unsent or self._waiting or self._moving
                    or not self._watch.connected or self._paused_reading or socket.needs_service()):
                return False
            now = time.monotonic()
            if socket.readable():  # read already, by a turn of the I/O thread that has not taken it yet
                return self._read(socket, now, self._readable, self._recv) > 0
            fd = socket.fileno()
            waits = [DIRECT_WAIT, socket.next_timer(now), self._core.next_timer(now), remaining]
            wait = min(w for w in waits if w is not None)
            if fd is None or not socket.interest() & select.POLLIN or wait <= 0:
                return False
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            poller.register(self._wake_r, select.POLLIN)
            events = poller.poll(int(wait * 1000) + 1)  # the GIL is released; the I/O lock is not
            if not events or any(polled == self._wake_r for polled, _ in events):
                return False  # nothing came, or the I/O thread has work: it takes over
            now = time.monotonic()
            self._serve_native(socket, events, now)
            return self._read(socket, now, self._readable, self._recv) > 0
        finally:
            lock.release()

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
        self._io_lock.acquire()  # released only while _loop waits in poll
        try:
            self._open()
            self._loop()
        except BaseException as error:  # surfaced to callers through _check() and their futures
            self._failure = error
            if not self._connected.done():
                self._connected.set_exception(ConnectorError(str(error)))
        finally:
            for request in self._waiting.values():
                request.fail("client stopped before the broker answered")
            while self._outbox:  # popleft, not iteration: other threads may still be appending
                item = self._outbox.popleft()
                if isinstance(item, _Request):
                    item.fail("client stopped")
                elif type(item) is QueuedConfirm:
                    Confirms([item.future], self._release_confirms).fail("client stopped")
            self._close_socket()  # no caller may send on it now (_send_now)
            self._io_lock.release()
            with self._room:
                self._room.notify_all()
            self._arrived.set()

    def _open(self) -> None:
        """A new DEALER (new identity), CONNECT, and SUB for everything subscribed before."""
        self._close_socket()
        if self._sent_away:  # see BaseClient._sent_away: unanswered commands were not stored
            self._sent_away = False
            for command_id, request in list(self._waiting.items()):
                if _resendable(request):
                    self._resend.append(request)
                    del self._waiting[command_id]
        for request in self._waiting.values():  # nothing answers on the old socket any more
            request.fail("connection to the broker was lost")
        self._waiting.clear()
        address = wire_address(self.wire, self.endpoint)
        if address is not None:
            self._socket = BlockingNativeSocket(*address, self._credentials,
                                                reconnect=RECONNECT_FIRST_MS / 1000,
                                                reconnect_max=RECONNECT_MAX_MS / 1000)
            self._readable, self._recv, self._send_raw, self._stirred = (
                BlockingNativeSocket.readable, BlockingNativeSocket.recv_frames,
                BlockingNativeSocket.send_frames, BlockingNativeSocket.needs_service)
        else:
            self._socket, self._monitor = make_socket(self._context, self.endpoint, self._credentials)
            self._monitor_fd, self._socket_fd = self._monitor.get(zmq.FD), self._socket.get(zmq.FD)
            self._readable, self._recv, self._send_raw, self._stirred = (readable, recv_frames, send_frames,
                                                                         readable)
        self._watch = self._new_watch()
        self._unsent.clear()
        self._handshake(time.monotonic())
        # What a follower refused goes to the leader now, ahead of what was queued after it.
        resend, self._resend = self._resend, []
        for item in reversed(resend):
            if type(item) is _BulkConfirms:
                assert item.items is not None
                for publish, future in zip(reversed(item.items), reversed(item.futures), strict=True):
                    self._outbox.appendleft(QueuedConfirm(publish, future))
            else:
                self._outbox.appendleft(item)

    def _handshake(self, now: float) -> None:
        orphans = list(self._waiting)
        command_id, frames = self._core.connect(now)
        connect = _Request(None)
        connect.future.add_done_callback(self._on_connected)
        connect.future.add_done_callback(lambda _: self._orphaned(orphans, _fail))
        self._waiting[command_id] = connect
        self._send(frames, now)
        for command_id, frames in self._core.resubscribe():
            self._waiting[command_id] = _Request(None)
            self._send(frames, now)

    def _unreachable(self, reason: str) -> None:
        if not self._connected.done():
            self._connected.set_exception(ConnectorError(reason))

    def _on_connected(self, future: Future[mc0.Ok]) -> None:
        with contextlib.suppress(BaseException):
            reply = future.result()
            if isinstance(reply, mc0.Ok) and leader_of(reply) is not None and self._move(leader_of(reply)):
                return  # a cluster member that does not lead: connect to the leader instead
            if isinstance(reply, mc0.Ok):
                self._moves_done()
                self._core.connected(reply)
                self._established = True
                if not self._connected.done():
                    self._connected.set_result(None)
            elif not self._connected.done():
                self._connected.set_exception(ConnectorError(reply.message.decode("utf-8", "replace")))

    def _loop(self) -> None:
        """The I/O thread's work, holding the I/O lock but while it waits in poll."""
        core = self._core
        lock = self._io_lock
        polled: tuple[tuple[int, int], ...] | None = None
        poller = select.poll()
        wake_r = self._wake_r
        while True:
            socket = self._socket
            assert socket is not None
            self._read_paused = self._paused_reading
            timer = core.next_timer(time.monotonic())
            if type(socket) is BlockingNativeSocket:
                fd = socket.fileno()
                interest = socket.interest() if fd is not None else 0
                watched: tuple[tuple[int, int], ...] = ((fd, interest),) if interest else ()
                ready = bool(socket.events) or (not self._read_paused and socket.readable())
                due = socket.next_timer(time.monotonic())
                if due is not None:
                    timer = due if timer is None else min(timer, due)
            else:
                interest = (0 if self._read_paused else POLLIN) | (POLLOUT if self._unsent else 0)
                # A ZeroMQ socket's descriptor only signals that its events may have changed (POLLIN, whatever
                # the interest), and asking for the events is what re-arms it: what is waiting already must be
                # seen here, not waited for.
                watched = ((self._monitor_fd, select.POLLIN),) + (
                    ((self._socket_fd, select.POLLIN),) if interest else ())
                assert self._monitor is not None
                ready = readable(self._monitor) or bool(interest and pending_events(socket) & interest)
            if polled != watched:  # a reconnect replaces the sockets, and the interest changes
                polled = watched
                poller = select.poll()
                poller.register(wake_r, select.POLLIN)
                for fd, mask in watched:
                    poller.register(fd, mask)
            if not self._watch.connected:  # refused connects are judged on a timer, not only on events
                timer = CHECK_EVERY if timer is None else min(timer, CHECK_EVERY)
            move = self._move_due(time.monotonic())
            if move is not None:
                timer = move if timer is None else min(timer, move)
            lock.release()  # callers may send now (_send_now): poll itself never calls into libzmq
            try:
                events = poller.poll(0 if ready else -1 if timer is None else int(timer * 1000) + 1)
            finally:
                lock.acquire()
            if any(fd == wake_r for fd, _ in events):
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 4096)
            self._signaled = False  # cleared before the outbox is drained, so no publish is left unseen
            now = time.monotonic()
            if self._stopping:
                return  # close() stopped waiting, or the constructor gave up
            if type(socket) is BlockingNativeSocket:
                self._serve_native(socket, events, now)
            else:
                assert self._monitor is not None
                self._read_events(self._monitor, now)
            if not self._watch.connected:
                self._check_watch(now)
            if not self._paused_reading:
                self._read(socket, now, self._readable, self._recv)
            if self._move_due(time.monotonic()) == 0 and self._closing is None:
                self._moving = False
                self._open()  # another broker of the cluster (the leader, or the next one to try)
                continue
            if self._closing is not None and self._closing.future.done():
                return  # DISCONNECT answered (or failed): everything sent before it reached the broker
            self._write(now)
            if core.noop_due(now):
                self._send(mc0.encode(mc0.Noop()), now)
            if not self._watch.connected:
                core.last_heard = now  # silence counts on a live connection only: ZeroMQ is reconnecting
            if core.broker_silent(now) and not self._data_waiting(socket):
                self.reconnects += 1
                if len(self.endpoints) > 1:
                    self._move(None)
                    # Made here and now: a move left due would open yet another connection on the next
                    # round, failing a publish the caller's thread sent on this one meanwhile as "may or may
                    # not have been stored" (as the asyncio client did for a frozen leader).
                    self._moving = False
                self._open()

    def _serve_native(self, socket: BlockingNativeSocket, events: list[tuple[int, int]], now: float) -> None:
        """Let the native wire act on what ``poll`` reported (``events``) and on its timers, then act on the
        connection events that came of it."""
        fd = socket.fileno()
        socket.service(fd, sum(mask for polled, mask in events if polled == fd), now)
        taken, socket.events = socket.events, []
        for kind, value in taken:
            self._on_event(kind, value, now)

    def _data_waiting(self, socket: Any) -> bool:
        # While reading is paused for a full inbox, unread data proves the broker is alive.
        return self._paused_reading and self._readable(socket)

    def _close_socket(self) -> None:
        socket, self._socket = self._socket, None
        if type(socket) is BlockingNativeSocket:
            socket.close()
        elif socket is not None:
            close_socket(socket, self._monitor)
        self._monitor = None

    def _resolve(self, reply: mc0.Ok | mc0.Error) -> None:
        request = self._waiting.pop(reply.id, None)  # type: ignore[arg-type] - the caller checked the id
        if request is None:
            return
        if self._closing is None and self._redirected(reply) and _resendable(request):
            self._resend.append(request)  # refused by a follower: nothing was stored, the leader gets it
            return
        if self._closing is None and type(request) is _BulkConfirms and self._partly_refused(reply):
            again = request.settle_stored(reply)  # type: ignore[arg-type] - an OK
            if again is not None:
                self._resend.append(again)  # the entries the leader could not store go to the next one
            return
        request.settle(reply)  # a refused resubscription too: the move subscribes again where it goes

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
        acks: dict[bytes, list[int]] = {}  # merged per topic until the next command or the end of the outbox

        def queued() -> Iterator[Any]:
            # popleft, not iteration: other threads may still be appending. Stops after a close()'s
            # DISCONNECT: nothing queued after it goes out (what is left is failed when the thread ends).
            while outbox:
                item = outbox.popleft()
                if type(item) is mc0.Ack:
                    acks.setdefault(item.topic, []).extend(item.message_ids)
                    continue
                yield item
                if type(item) is _Close:
                    return

        for kind, run in group_outbox(queued()):
            if kind is tuple:
                self._send_publishes(run, now)
                continue
            if kind is QueuedConfirm:
                self._send_confirms(run, now)
                continue
            self._send_acks(acks, now)
            acks = {}
            item = run[0]
            if type(item) is _Close:
                command_id, frames = core.request(item.event)
                self._waiting[command_id] = item
                self._closing = item
                self._send(frames, now)
                return
            command_id, frames = core.command(item.event)
            self._waiting[command_id] = item
            self._send(frames, now)
        self._send_acks(acks, now)
        if self._room_wanted:
            with self._room:
                self._room.notify_all()

    def _send_publishes(self, batch: list[Publish], now: float) -> None:
        if batch:
            for frames in self._core.pack(batch):
                self._send(frames, now)

    def _send_confirms(self, confirms: list[QueuedConfirm], now: float) -> None:
        if confirms:
            start = 0
            items = [c.item for c in confirms]
            futures = [c.future for c in confirms]
            for command_id, frames, count in self._core.pack_confirms(items):
                end = start + count
                self._waiting[command_id] = _BulkConfirms(futures[start:end], self._release_confirms,
                                                          items[start:end])
                start = end
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
            self._send_raw(socket, frames)  # zsock's: int flags, no per-frame enum; or the native wire's
        except zmq.Again:
            if not retry:
                self._unsent.append(frames)
            return False
        self._core.sent(now)
        return True
