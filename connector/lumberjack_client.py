"""A small blocking Lumberjack writer, so log lines can be shipped into the broker without a Beat.

    from connector.lumberjack_client import LumberjackClient
    with LumberjackClient("127.0.0.1", 5044) as client:
        client.send_batch([{"message": "hello", "host": "web1"}])   # returns once the broker acked it

It writes the way Beats do (version 2): per batch a window frame with the batch's size, the events as JSON
frames numbered from 1 (compressed into one frame by default), with up to two batches awaiting the broker's
ack of their last sequence number (``send_batches``); ``ACK 0`` is a keepalive. Version 1 sends the events
as string maps. The broker acks only what it has stored as durably as the topic promises, so a returned
``send_batch`` means stored. TLS: pass an ``ssl.SSLContext``. Not thread-safe.
"""

from __future__ import annotations

import ssl
import time
from collections import deque
from collections.abc import Iterable
from typing import Any

from connector.core import ConnectorError
from connector.stream import StreamClient
from protocol import lumberjack

DEFAULT_PORT = 5044


class LumberjackClient(StreamClient):
    """One connection to a broker's Lumberjack gateway."""

    def __init__(self, host: str = "127.0.0.1", port: int = DEFAULT_PORT, *, version: int = 2,
                 timeout: float = 30.0, tls: ssl.SSLContext | None = None,
                 server_hostname: str | None = None) -> None:
        super().__init__(host, port, timeout, tls=tls, server_hostname=server_hostname)
        # Frames up to the broker's default message size (a batch goes out as one compressed frame).
        self.codec = lumberjack.ClientConnection(version=lumberjack.V2 if version == 2 else lumberjack.V1,
                                                 max_frame=16 << 20)
        self.keepalives = 0  # ACK 0 frames seen while waiting

    def send_batch(self, events: list[dict[str, Any]], *, compress: bool = True) -> None:
        """Send one batch (window = its size, sequence numbers 1..n) and wait for the ack of the last."""
        self.send_batches([events], compress=compress, in_flight=1)

    def send_batches(self, batches: Iterable[list[dict[str, Any]]], *, compress: bool = True,
                     in_flight: int = 2) -> int:
        """Send batch after batch with up to ``in_flight`` unacknowledged at once, as Beats do; returns the
        number of events, every one acknowledged when this returns."""
        waiting: deque[int] = deque()  # the last sequence number of each batch not yet acked, in order
        shipped = 0
        codec = self.codec
        for events in batches:
            if not events:
                continue
            if len(waiting) >= in_flight:
                self._acked(waiting.popleft())
            try:
                frames = codec.send_window(len(events)) + codec.send_events(list(enumerate(events, start=1)),
                                                                            compress=compress)
            except (ValueError, TypeError) as error:
                raise ConnectorError(f"cannot send this batch: {error}") from None
            self.send_bytes(frames)
            waiting.append(len(events))
            shipped += len(events)
        while waiting:
            self._acked(waiting.popleft())
        return shipped

    def _acked(self, last: int) -> None:
        """Wait for the ack of a batch's last sequence number (ACK 0 is a keepalive)."""
        deadline = time.monotonic() + self.timeout
        while True:
            ack = self.next_event(deadline)
            if ack is None:
                raise ConnectorError(f"no ack for the batch within {self.timeout:g} s")
            if ack.seq == last:
                return
            if ack.seq == 0:
                self.keepalives += 1

    def next_event(self, deadline: float | None) -> lumberjack.Ack | None:
        return self.decoded(deadline)
