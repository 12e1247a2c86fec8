"""A small blocking client for the msgq door, so the dialect can be tried without writing one.

    from connector.msgq_client import MsgqClient
    with MsgqClient("127.0.0.1", 9912) as client:
        client.subscribe("weather", instance="*")
        client.send("weather", b"sunny")            # other subscribers of the group get it, not us
        print(client.receive(timeout=1))

It speaks :mod:`protocol.msgq`: ``getlname`` on open (the dialect requires it first), ``subscribe`` and
``unsubscribe`` (which have no reply, so the client follows each with a ``stats`` round trip: when it returns,
the broker has acted on them), ``send`` with this connection's name as ``from`` and a sequence number of its
own, and ``stats``. Not thread-safe: one thread uses one client.
"""

from __future__ import annotations

import itertools

from connector.stream import StreamClient
from protocol import msgq

DEFAULT_PORT = 9912


def _encode(text: str | bytes) -> bytes:
    return text.encode() if isinstance(text, str) else text


class MsgqClient(StreamClient):
    """One connection to a broker's msgq gateway; ``lname`` is the local name the broker gave it."""

    closed_why = (" (msgq has no error message, so the broker closes a connection whose request it refuses: "
                  "a replay of a group that is not persistent, a send it cannot store, a message over its "
                  "size limit; its log says which)")

    def __init__(self, host: str = "127.0.0.1", port: int = DEFAULT_PORT, *, timeout: float = 5.0,
                 max_message: int = msgq.DEFAULT_MAX_MESSAGE) -> None:
        super().__init__(host, port, timeout)
        self.codec = msgq.Connection(max_message=max_message)
        self.sequence = itertools.count(1)
        try:
            self.send_event(msgq.GetLname())
            reply = self.wait_for(msgq.LnameReply, "local name")
            self.lname: bytes = reply.lname  # type: ignore[attr-defined]
        except BaseException:
            self.sock.close()
            raise

    def subscribe(self, group: str | bytes, instance: str | bytes = "*", subtype: str = "normal",
                  replay: str | int | None = None) -> None:
        """Subscribe to ``group`` (``replay``: beginning, current or a message id, on a persistent group)."""
        extra = {} if replay is None else {b"replay": str(replay).encode()}
        self.send_event(msgq.Subscribe(_encode(group), _encode(instance), subtype, extra))
        self.stats()

    def unsubscribe(self, group: str | bytes, instance: str | bytes = "*") -> None:
        self.send_event(msgq.Unsubscribe(_encode(group), _encode(instance)))
        self.stats()

    def send(self, group: str | bytes, msg: msgq.Item | str, *, instance: str | bytes = "*",
             to: str | bytes = "*", repl: str | bytes | None = None,
             fields: dict[bytes, msgq.Item] | None = None) -> bytes:
        """Send ``msg`` (any item; a str is sent as UTF-8 DATA) to a group; returns the ``seq`` used.
        ``fields`` are extra top-level fields: ``X-`` ones holding DATA reach mc0 subscribers as headers."""
        seq = b"%d" % next(self.sequence)
        item = msg.encode() if isinstance(msg, str) else msg
        self.send_event(msgq.Send(self.lname, _encode(to), _encode(group), _encode(instance), seq, item,
                             None if repl is None else _encode(repl), dict(fields or {})))
        return seq

    def stats(self) -> dict[bytes, msgq.Item]:
        self.send_event(msgq.Stats())
        return self.wait_for(msgq.StatsReply, "stats reply").counters  # type: ignore[attr-defined]

    def receive(self, timeout: float | None = None) -> msgq.Send | None:
        """The next send routed to this connection, or None after ``timeout`` seconds (None waits until one
        comes). Its ``extra`` holds ``msgid``, the broker's message id."""
        return super().receive(timeout)

    def next_event(self, deadline: float | None) -> msgq.Event | None:
        """The next event (a send is also filed in the inbox); None at the deadline."""
        event = self.decoded(deadline)
        if isinstance(event, msgq.Send):
            self.inbox.append(event)
        return event
