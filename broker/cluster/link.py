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
import zmq.asyncio

from connector import keys
from connector.zsock import readable, recv_frames
from protocol import ProtocolError, mc0


class LinkError(Exception):
    """The other broker did not answer in time, or the link was closed."""


class Link:
    """Requests to one other broker, answered by ID (several may be in flight)."""

    def __init__(self, context: zmq.asyncio.Context, endpoint: str, keys_dir: Path | None) -> None:
        self.endpoint = endpoint
        self.socket = context.socket(zmq.DEALER)
        self.socket.linger = 0
        self.socket.reconnect_ivl = 20
        self.socket.reconnect_ivl_max = 200
        if keys_dir is not None:
            pair = keys.broker_pair(keys_dir)
            self.socket.curve_serverkey = pair.public  # every member has the cluster's one broker key pair
            self.socket.curve_publickey = pair.public
            self.socket.curve_secretkey = pair.secret
        self.socket.connect(endpoint)
        self._raw = zmq.Socket.shadow(self.socket.underlying)
        self._ids = itertools.count(1)
        self._waiting: dict[bytes, asyncio.Future[mc0.Ok | mc0.Error]] = {}
        self._reader: asyncio.Task[None] | None = None
        self.closed = False

    async def request(self, event: mc0.Fetch | mc0.Noop, timeout: float) -> mc0.Ok | mc0.Error:  # noqa: ASYNC109
        """Send ``event`` with a fresh ID and wait for its answer; LinkError after ``timeout`` seconds."""
        if self.closed:
            raise LinkError(f"the link to {self.endpoint} is closed")
        if self._reader is None:
            self._reader = asyncio.get_running_loop().create_task(self._read(), name=f"link {self.endpoint}")
        event.id = b"%d" % next(self._ids)
        future: asyncio.Future[mc0.Ok | mc0.Error] = asyncio.get_running_loop().create_future()
        self._waiting[event.id] = future
        try:
            frames = mc0.encode(event)
            try:
                self._raw.send_multipart(frames, zmq.NOBLOCK)  # no future per send while the pipe has room
            except zmq.Again:
                await self.socket.send_multipart(frames)
            return await asyncio.wait_for(future, timeout)
        except TimeoutError:
            raise LinkError(f"no answer from {self.endpoint} within {timeout:g}s") from None
        finally:
            self._waiting.pop(event.id, None)

    async def _read(self) -> None:
        while not self.closed:
            await self.socket.poll(1000, zmq.POLLIN)
            while readable(self._raw):
                frames = recv_frames(self._raw)
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
        if self._reader is not None:
            self._reader.cancel()
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(LinkError(f"the link to {self.endpoint} was closed"))
        with contextlib.suppress(zmq.ZMQError):
            self.socket.close(linger=0)
