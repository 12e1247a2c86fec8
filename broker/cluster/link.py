"""One broker's mc0 connection to another broker of its cluster: a DEALER on the broker's own loop.

Followers copy the leader's logs through it, and a new leader asks the others what they hold and copies
what it lacks. It speaks plain mc0 (``protocol.mc0``): requests with IDs, answers matched by ID, no
subscriptions. With CURVE on it presents the broker's own key pair, which every member of a cluster shares
(docs/cluster.md) and admits.

This module must not know about the engine or Raft.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable
from pathlib import Path

import zmq

from connector import addresses, keys
from connector.zsock import readable, recv_frames, send_frames
from protocol import ProtocolError, mc0

#: Seconds between attempts to send while the other broker is not connected yet (or its pipe is full).
SEND_RETRY = 0.005


class LinkError(Exception):
    """The other broker did not answer in time, or the link was closed."""


#: What a request's callback gets: the other broker's answer, or why there is none.
Answer = mc0.Ok | mc0.Error | LinkError


class Link:
    """Requests to one other broker, answered by ID (several may be in flight).

    Like the router, it drives its socket from the descriptor (``loop.add_reader`` on ``zmq.FD``, drained to
    empty, and drained again after every send, which is what re-arms that edge-triggered descriptor) and
    sends with plain int flags (:mod:`connector.zsock`): a follower sends a FETCH and reads an answer for
    every message a strong topic takes, and ``zmq.asyncio``'s futures and flag enums cost it more than the
    copying itself."""

    def __init__(self, context: zmq.Context, endpoint: str, keys_dir: Path | None) -> None:
        self.endpoint = endpoint
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
        self._ids = itertools.count(1)
        self._waiting: dict[bytes, tuple[Callable[[Answer], None], asyncio.TimerHandle]] = {}
        self._draining = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._fd: int | None = None
        self.closed = False

    def ask(self, event: mc0.Fetch | mc0.Noop, timeout: float, answered: Callable[[Answer], None]) -> None:
        """Send ``event`` with a fresh ID; ``answered`` gets its answer, on the loop, from the descriptor's
        callback (no task or future in between: a follower asks once for every message a strong topic takes),
        or a LinkError after ``timeout`` seconds or when the link closes. It is called exactly once."""
        if self.closed:
            raise LinkError(f"the link to {self.endpoint} is closed")
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
            self._fd = self._raw.getsockopt(zmq.FD)
            loop.add_reader(self._fd, self._drain)
        command_id = event.id = b"%d" % next(self._ids)
        timer = loop.call_later(timeout, self._expire, command_id, timeout)
        self._waiting[command_id] = (answered, timer)
        self._send(command_id, mc0.encode(event))

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

    def _send(self, command_id: bytes, frames: mc0.Frames) -> None:
        if command_id not in self._waiting:
            return  # timed out (or closed) before it could leave
        try:
            send_frames(self._raw, frames)
        except zmq.Again:  # not connected (yet), or the pipe is full: try again shortly, until its timeout
            assert self._loop is not None
            self._loop.call_later(SEND_RETRY, self._send, command_id, frames)
            return
        self._drain()  # the answer may be in already; and the descriptor must be re-armed after a send

    def _expire(self, command_id: bytes, timeout: float) -> None:
        waiting = self._waiting.pop(command_id, None)
        if waiting is not None:
            waiting[0](LinkError(f"no answer from {self.endpoint} within {timeout:g}s"))

    def _forget(self, command_id: bytes | None) -> None:
        waiting = self._waiting.pop(command_id, None) if command_id is not None else None
        if waiting is not None:
            waiting[1].cancel()

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
                frames = recv_frames(raw)
                try:
                    event = mc0.decode(frames)
                except ProtocolError:
                    continue
                if isinstance(event, mc0.Ok | mc0.Error) and event.id is not None:
                    waiting = self._waiting.pop(event.id, None)
                    if waiting is not None:
                        waiting[1].cancel()
                        waiting[0](event)
        finally:
            self._draining = False

    def close(self) -> None:
        self.closed = True
        if self._fd is not None and self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self._fd)
        self._fd = None
        waiting, self._waiting = self._waiting, {}
        for answered, timer in waiting.values():
            timer.cancel()
            answered(LinkError(f"the link to {self.endpoint} was closed"))
        with contextlib.suppress(zmq.ZMQError):
            self._raw.close(linger=0)
