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
from pathlib import Path

import zmq

from connector import keys
from connector.zsock import readable, recv_frames, send_frames
from protocol import ProtocolError, mc0

#: Seconds between attempts to send while the other broker is not connected yet (or its pipe is full).
SEND_RETRY = 0.005


class LinkError(Exception):
    """The other broker did not answer in time, or the link was closed."""


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
        if keys_dir is not None:
            pair = keys.broker_pair(keys_dir)
            socket.curve_serverkey = pair.public  # every member has the cluster's one broker key pair
            socket.curve_publickey = pair.public
            socket.curve_secretkey = pair.secret
        socket.connect(endpoint)
        self._raw = socket
        self._ids = itertools.count(1)
        self._waiting: dict[bytes, asyncio.Future[mc0.Ok | mc0.Error]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._fd: int | None = None
        self.closed = False

    async def request(self, event: mc0.Fetch | mc0.Noop, timeout: float) -> mc0.Ok | mc0.Error:  # noqa: ASYNC109
        """Send ``event`` with a fresh ID and wait for its answer; LinkError after ``timeout`` seconds."""
        if self.closed:
            raise LinkError(f"the link to {self.endpoint} is closed")
        loop = asyncio.get_running_loop()
        if self._fd is None:
            self._loop = loop
            self._fd = self._raw.getsockopt(zmq.FD)
            loop.add_reader(self._fd, self._drain)
        event.id = b"%d" % next(self._ids)
        future: asyncio.Future[mc0.Ok | mc0.Error] = loop.create_future()
        self._waiting[event.id] = future
        deadline = loop.time() + timeout
        try:
            frames = mc0.encode(event)
            while True:
                try:
                    send_frames(self._raw, frames)
                    break
                except zmq.Again:  # not connected (yet), or the pipe is full: try again shortly
                    if loop.time() >= deadline:
                        raise TimeoutError from None
                    await asyncio.sleep(SEND_RETRY)
            self._drain()  # the answer may be in already; and the descriptor must be re-armed after a send
            return await asyncio.wait_for(future, max(0.0, deadline - loop.time()))
        except TimeoutError:
            raise LinkError(f"no answer from {self.endpoint} within {timeout:g}s") from None
        finally:
            self._waiting.pop(event.id, None)

    def _drain(self) -> None:
        """Take every answer waiting on the socket (the descriptor's callback, and after each send)."""
        raw = self._raw
        while not self.closed and readable(raw):
            frames = recv_frames(raw)
            try:
                event = mc0.decode(frames)
            except ProtocolError:
                continue
            if isinstance(event, mc0.Ok | mc0.Error) and event.id is not None:
                future = self._waiting.get(event.id)
                if future is not None and not future.done():
                    future.set_result(event)

    def close(self) -> None:
        self.closed = True
        if self._fd is not None and self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self._fd)
        self._fd = None
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(LinkError(f"the link to {self.endpoint} was closed"))
        with contextlib.suppress(zmq.ZMQError):
            self._raw.close(linger=0)
