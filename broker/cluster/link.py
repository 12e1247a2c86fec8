"""One broker's mc0 connection to another broker of its cluster: a DEALER on the broker's own loop.

Followers copy the leader's logs through it, and a new leader asks the others what they hold and copies
what it lacks. It speaks plain mc0 (``protocol.mc0``): requests with IDs, answers matched by ID, no
subscriptions. With CURVE it presents the broker's own key pair, which every member of a cluster shares
(docs/cluster.md) and admits.

Two wires under one bookkeeping (:class:`Link`): :class:`NativeLink` speaks ZMTP itself on the loop's TCP
transports (:mod:`connector.zmtp_dealer`), for a ``tcp://`` endpoint unless ``mc0_engine`` is ``zeromq``;
:class:`ZmqLink` drives a libzmq DEALER (any endpoint libzmq takes). :func:`open_link` chooses.

This module must not know about the engine or Raft.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable
from pathlib import Path

import zmq
from zmq.utils import z85

from connector import addresses, keys
from connector.native import native_address
from connector.zmtp_dealer import ZmtpDealer
from connector.zsock import readable, recv_frames, send_frames
from protocol import ProtocolError, mc0

log = logging.getLogger("mc0.cluster")

#: Seconds between attempts to send while the other broker is not connected yet (or its pipe is full).
SEND_RETRY = 0.005
#: The largest frame a link takes from another broker: its FETCH answers carry at most 4 MiB of records, or
#: one message of up to that broker's ``max_message_size`` (16 MiB by default), so this leaves room for a
#: member configured with four times the default.
MAX_FRAME = 64 << 20


class LinkError(Exception):
    """The other broker did not answer in time, or the link was closed."""


#: What a request's callback gets: the other broker's answer, or why there is none.
Answer = mc0.Ok | mc0.Error | LinkError


def open_link(context: zmq.Context, endpoint: str, keys_dir: Path | None, engine: str = "auto") -> Link:
    """A link to ``endpoint``: native where it is ``tcp://HOST:PORT`` and ``engine`` (the broker's
    ``mc0_engine``) is not ``zeromq``, libzmq's otherwise. ``keys_dir``: the broker's keys (CURVE), or
    None."""
    address = native_address(endpoint) if engine != "zeromq" else None
    if address is not None:
        return NativeLink(endpoint, *address, keys_dir)
    return ZmqLink(context, endpoint, keys_dir)


class Link:
    """Requests to one other broker, answered by ID (several may be in flight): the bookkeeping both wires
    share. A subclass sends (:meth:`_transmit`), hands every message it receives to :meth:`_answer`, and
    shuts its wire in :meth:`_shut`."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self._ids = itertools.count(1)
        self._waiting: dict[bytes, tuple[Callable[[Answer], None], asyncio.TimerHandle]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self.closed = False

    def ask(self, event: mc0.Fetch | mc0.Noop, timeout: float, answered: Callable[[Answer], None],
            template: mc0.FetchTemplate | None = None) -> None:
        """Send ``event`` with a fresh ID; ``answered`` gets its answer, on the loop, from the wire's
        callback (no task or future in between: a follower asks once for every message a strong topic takes),
        or a LinkError after ``timeout`` seconds, when the connection it went out on is lost, or when the
        link closes. It is called exactly once. ``template``: ``event``'s frames prepared (a FETCH asked
        again and again from another FROM), to fill in rather than encode it all."""
        if self.closed:
            raise LinkError(f"the link to {self.endpoint} is closed")
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
            self._start(loop)
        command_id = event.id = b"%d" % next(self._ids)
        timer = loop.call_later(timeout, self._expire, command_id, timeout)
        self._waiting[command_id] = (answered, timer)
        if template is not None and isinstance(event, mc0.Fetch) and event.start is not None:
            self._transmit(command_id, template.frames(event.start, command_id))
        else:
            self._transmit(command_id, mc0.encode(event))

    async def request(self, event: mc0.Fetch | mc0.Noop, timeout: float) -> mc0.Ok | mc0.Error:  # noqa: ASYNC109
        """:meth:`ask` for a coroutine: the answer, or LinkError after ``timeout`` seconds."""
        future: asyncio.Future[mc0.Ok | mc0.Error] = asyncio.get_running_loop().create_future()

        def answered(answer: Answer) -> None:
            if future.done():
                return
            if isinstance(answer, LinkError):
                future.set_exception(answer)
            else:
                future.set_result(answer)

        self.ask(event, timeout, answered)
        try:
            return await future
        finally:
            self._forget(event.id)  # cancelled while waiting: nobody is left to answer

    def close(self) -> None:
        self.closed = True
        self._shut()
        waiting, self._waiting = self._waiting, {}
        for answered, timer in waiting.values():
            timer.cancel()
            answered(LinkError(f"the link to {self.endpoint} was closed"))

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the wire, on the first request."""

    def _transmit(self, command_id: bytes, frames: mc0.Frames) -> None:
        raise NotImplementedError

    def _shut(self) -> None:
        raise NotImplementedError

    def _answer(self, frames: list[bytes]) -> bytes | None:
        """A message from the other broker: the answer to one of our requests (its ID returned), or nothing
        we wait for (None)."""
        try:
            event = mc0.decode(frames)
        except ProtocolError:
            return None
        if not isinstance(event, mc0.Ok | mc0.Error) or event.id is None:
            return None
        waiting = self._waiting.pop(event.id, None)
        if waiting is None:
            return None
        waiting[1].cancel()
        waiting[0](event)
        return event.id

    def _fail(self, command_id: bytes, why: str) -> None:
        waiting = self._waiting.pop(command_id, None)
        if waiting is not None:
            waiting[1].cancel()
            waiting[0](LinkError(why))

    def _expire(self, command_id: bytes, timeout: float) -> None:
        waiting = self._waiting.pop(command_id, None)
        if waiting is not None:
            waiting[0](LinkError(f"no answer from {self.endpoint} within {timeout:g}s"))

    def _forget(self, command_id: bytes | None) -> None:
        waiting = self._waiting.pop(command_id, None) if command_id is not None else None
        if waiting is not None:
            waiting[1].cancel()


class NativeLink(Link):
    """A link on the broker's own ZMTP DEALER (:mod:`connector.zmtp_dealer`): each request is one write on the
    loop's transport and each answer one read, with no thread in between. A request asked while the
    connection is down waits for it (until its timeout); one sent on a connection that is lost fails at
    once, since nothing will answer it."""

    def __init__(self, endpoint: str, host: str, port: int, keys_dir: Path | None) -> None:
        super().__init__(endpoint)
        curve_keys = None
        if keys_dir is not None:
            pair = keys.broker_pair(keys_dir)
            assert pair.secret is not None  # broker_pair refuses a certificate without one
            public = z85.decode(pair.public)
            curve_keys = (public, public, z85.decode(pair.secret))  # every member has the one broker pair
        self._dealer = ZmtpDealer(host, port, received=self._answer, ready=self._flush, lost=self._lost,
                                  writable=self._flush, curve_keys=curve_keys, max_frame=MAX_FRAME, log=log)
        self._unsent: dict[bytes, mc0.Frames] = {}  # asked while no connection was up, or it was full
        self._sent: set[bytes] = set()  # went out on the current connection

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._dealer.start()

    def _transmit(self, command_id: bytes, frames: mc0.Frames) -> None:
        if self._dealer.send(frames):
            self._sent.add(command_id)
        else:
            self._unsent[command_id] = frames

    def _answer(self, frames: list[bytes]) -> bytes | None:
        command_id = super()._answer(frames)
        self._sent.discard(command_id)  # type: ignore[arg-type] - None is never in it
        return command_id

    def _flush(self) -> None:
        """A connection is up, or has room again: send what waited for it."""
        unsent, self._unsent = self._unsent, {}
        for command_id, frames in unsent.items():
            if command_id in self._waiting:  # not expired meanwhile
                self._transmit(command_id, frames)

    def _lost(self) -> None:
        sent, self._sent = self._sent, set()
        for command_id in sent:
            self._fail(command_id, f"the connection to {self.endpoint} was lost before it answered")

    def _shut(self) -> None:
        self._dealer.close()
        self._unsent.clear()
        self._sent.clear()


class ZmqLink(Link):
    """A link on a libzmq DEALER, for endpoints only libzmq connects to (or ``mc0_engine = "zeromq"``).

    Like the router on libzmq, it drives its socket from the descriptor (``loop.add_reader`` on ``zmq.FD``,
    drained to empty, and drained again after every send, which is what re-arms that edge-triggered
    descriptor) and sends with plain int flags (:mod:`connector.zsock`)."""

    def __init__(self, context: zmq.Context, endpoint: str, keys_dir: Path | None) -> None:
        super().__init__(endpoint)
        # A plain socket even from the broker's asyncio context: it is never awaited, only read and written
        # without blocking from the loop's callbacks.
        socket = zmq.Socket(context, zmq.DEALER)
        socket.linger = 0
        socket.reconnect_ivl = 20
        socket.reconnect_ivl_max = 200
        if addresses.is_ipv6(endpoint):
            socket.ipv6 = True
        if keys_dir is not None:
            pair = keys.broker_pair(keys_dir)
            socket.curve_serverkey = pair.public  # every member has the cluster's one broker key pair
            socket.curve_publickey = pair.public
            socket.curve_secretkey = pair.secret
        socket.connect(endpoint)
        self._raw = socket
        self._draining = False
        self._fd: int | None = None

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._fd = self._raw.getsockopt(zmq.FD)
        loop.add_reader(self._fd, self._drain)

    def _transmit(self, command_id: bytes, frames: mc0.Frames) -> None:
        if command_id not in self._waiting:
            return  # timed out (or closed) before it could leave
        try:
            send_frames(self._raw, frames)
        except zmq.Again:  # not connected (yet), or the pipe is full: try again shortly, until its timeout
            assert self._loop is not None
            self._loop.call_later(SEND_RETRY, self._transmit, command_id, frames)
            return
        self._drain()  # the answer may be in already; and the descriptor must be re-armed after a send

    def _drain(self) -> None:
        """Take every answer waiting on the socket (the descriptor's callback, and after each send).

        An answer's callback may ask again, which sends and comes back here: that inner call returns at
        once, since this loop asks the socket again after every answer (re-arming the descriptor)."""
        if self._draining:
            return
        self._draining = True
        raw = self._raw
        try:
            while not self.closed and readable(raw):
                self._answer(recv_frames(raw))
        finally:
            self._draining = False

    def _shut(self) -> None:
        if self._fd is not None and self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self._fd)
        self._fd = None
        with contextlib.suppress(zmq.ZMQError):
            self._raw.close(linger=0)
