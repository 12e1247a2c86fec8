"""The msgq door (seed 003): local names, group/instance subscriptions and routed sends, over the "Skan" TLV
format of :mod:`protocol.msgq`.

A msgq group is an engine topic. A connection's subscriptions to one group, whatever their instances and
subtypes, are one engine subscription, so a message reaches a connection at most once; the routing rules
(instance, ``to``, ``meonly``, ``promisc``, never back to the sender) are applied as the message is written
to the connection. The routing fields travel with the message as reserved headers, so a message keeps them on
its way through the log and to every other door:

=============  ==================  ==================================================================
msgq field     engine header       on a message that did not come from msgq (an mc0 PUT, a sexp Publish)
=============  ==================  ==================================================================
``from``       ``MSGQ-FROM``       ``mc0``
``to``         ``MSGQ-TO``         ``*``
``instance``   ``MSGQ-INSTANCE``   ``*``
``seq``        ``MSGQ-SEQ``        the message id
``repl``       ``MSGQ-REPL``       absent
``msg``        the body            the body, as DATA
=============  ==================  ==================================================================

A ``msg`` that is DATA is the body as it is, so every door sees the bytes; a HASH, LIST or NULL ``msg`` is
the body encoded as one TLV item, marked by ``MSGQ-ITEM: tlv``. Fields of a send beyond the modelled ones
travel TLV-encoded in ``MSGQ-EXTRA``. A delivered send carries the engine's message id in the extension field
``msgid``, and the ``X-`` headers of an mc0 PUT as fields of the same names.

``docs/msgq.md`` states the rules and where we differ from the 2009 daemon.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass

from broker.engine import EngineError, Message
from broker.gateways.tcp import Connection, Gateway
from protocol import ProtocolError, msgq

DEFAULT_PORT = 9912

FROM = b"MSGQ-FROM"
TO = b"MSGQ-TO"
INSTANCE = b"MSGQ-INSTANCE"
SEQ = b"MSGQ-SEQ"
REPL = b"MSGQ-REPL"
ITEM = b"MSGQ-ITEM"  # "tlv": the body is an encoded item, not DATA
EXTRA = b"MSGQ-EXTRA"  # the send's unmodelled fields, one encoded HASH
TLV = b"tlv"

#: Our subscribe extension: where a subscription to a persistent group starts (beginning, current or an id).
REPLAY_FIELD = b"replay"
#: Our send extension on deliveries: the engine's message id, decimal.
ID_FIELD = b"msgid"
#: The sender of messages that entered through another door.
OTHER_DOOR = b"mc0"

NORMAL, MEONLY, PROMISC = "normal", "meonly", "promisc"


@dataclass(frozen=True, slots=True)
class MsgqOptions:
    max_message: int = msgq.DEFAULT_MAX_MESSAGE


#: Local names are never repeated: a random per-process prefix with the pid, and a counter.
_NAME_PREFIX = b"%x.%x" % (int.from_bytes(os.urandom(4), "big"), os.getpid())
_NAME_COUNTER = itertools.count(1)


def _replay(extra: dict[bytes, msgq.Item]) -> str | int | None:
    value = extra.get(REPLAY_FIELD)
    if value is None:
        return None
    if value in (b"beginning", b"current"):
        return value.decode()
    if isinstance(value, bytes) and value.isdigit():
        return int(value)
    raise ProtocolError("subscribe field 'replay' must be DATA: beginning, current or a message id")


class MsgqConnection(Connection):
    """One msgq client."""

    #: The door's own STATS counters: sends accepted, sends delivered, messages a connection's routing rules
    #: kept from it, and messages larger than the door's size cap (a client would have to refuse them).
    counters = ("sent", "delivered", "filtered", "oversize")

    def __init__(self, gateway: Gateway) -> None:
        super().__init__(gateway)
        self.codec = msgq.Connection(max_message=gateway.options.max_message)
        self.lname: bytes | None = None
        self.groups: dict[bytes, set[tuple[bytes, str]]] = {}  # group -> {(instance, subtype)}

    def handle(self, event: msgq.Event) -> None:
        if isinstance(event, msgq.GetLname):
            if self.lname is None:
                self.lname = b"%s_%d@mc0" % (_NAME_PREFIX, next(_NAME_COUNTER))
            self.write(self.codec.send(msgq.LnameReply(self.lname)))
            return
        if self.lname is None:
            raise ProtocolError("getlname must be the first message")
        match event:
            case msgq.Subscribe(group, instance, subtype, extra):
                replay = _replay(extra)
                if group not in self.groups or replay is not None:
                    try:
                        self.engine.subscribe(self.subscriber, group, replay=replay)
                    except EngineError as error:
                        raise ProtocolError(f"subscribe refused: {error}") from None
                self.groups.setdefault(group, set()).add((instance, subtype))
            case msgq.Unsubscribe(group, instance):
                entries = self.groups.get(group)
                if entries is None:
                    return  # nothing to undo; the message has no reply to carry an error
                entries -= {entry for entry in entries if entry[0] == instance}
                if not entries:
                    del self.groups[group]
                    self.engine.unsubscribe(self.subscriber, group)
            case msgq.Send(sender, to, group, instance, seq, msg, repl, extra):
                if sender != self.lname:
                    raise ProtocolError(f"send 'from' {sender!r} is not this connection's name "
                                        f"{self.lname!r}")
                self.publish(group, msg, {FROM: sender, TO: to, INSTANCE: instance, SEQ: seq}, repl, extra)
            case msgq.Stats():
                self.write(self.codec.send(msgq.StatsReply(self.stats())))
            case msgq.Unknown(fields):
                kind = fields.get(msgq.TYPE)
                raise ProtocolError(f"unknown message type {kind!r}")
            case _:  # a reply (getlname's, stats') is the router's to send
                raise ProtocolError(f"a client does not send {type(event).__name__} messages")

    def names_topics(self, event: msgq.Event) -> tuple[bytes, ...]:
        if self.lname is not None and isinstance(event, msgq.Send | msgq.Subscribe):
            return (event.group,)
        return ()

    def event_size(self, event: msgq.Event) -> int | None:
        if isinstance(event, msgq.Send):
            return len(event.msg) if isinstance(event.msg, bytes) else None  # a decoded item: size unknown
        return None if isinstance(event, msgq.Unknown) else 0

    def publish(self, group: bytes, msg: msgq.Item, headers: dict[bytes, bytes], repl: bytes | None,
                extra: dict[bytes, msgq.Item]) -> None:
        if repl is not None:
            headers[REPL] = repl
        if isinstance(msg, bytes):
            body = msg
        else:
            body = msgq.encode_item(msg)
            headers[ITEM] = TLV
        # X- fields carrying DATA are the sender's headers, as mc0 X- headers become fields on delivery; the
        # other unmodelled fields travel encoded, together.
        carried = [name for name, value in extra.items() if name.startswith(b"X-") and type(value) is bytes]
        for name in carried:
            headers[name] = extra.pop(name)  # type: ignore[assignment] - checked: DATA
        if extra:
            headers[EXTRA] = msgq.encode_item(extra)
        try:
            self.publish_message(group, body, headers)
        except EngineError as error:
            raise ProtocolError(f"send refused: {error}") from None
        self.gateway.counters["sent"] += 1

    def stats(self) -> dict[bytes, msgq.Item]:
        counters = self.gateway.counters
        subscriptions = sum(len(connection.groups) for connection in self.gateway.connections
                            if isinstance(connection, MsgqConnection))
        figures = {"connections": len(self.gateway.connections), "group_subscriptions": subscriptions,
                   **{name: counters[name] for name in self.counters}, "topics": len(self.engine.topics)}
        return {name.encode(): b"%d" % value for name, value in figures.items()}

    # ---------------------------------------------------------------------------------------------- routing

    def wants(self, message: Message) -> bool:
        """The routing rules of ``docs/msgq.md``, for one message of a group this connection subscribes to."""
        entries = self.groups.get(message.topic)
        if not entries:
            return False
        if self.engine.topics[message.topic].round_robin:
            return True  # a queue's message was handed to this consumer alone: filtering it would lose it
        headers = message.headers
        if headers.get(FROM) == self.lname:
            return False
        subtypes = {subtype for _, subtype in entries}
        if PROMISC in subtypes:
            return True
        instance = headers.get(INSTANCE, msgq.WILDCARD)
        matching = {subtype for wanted, subtype in entries
                    if wanted == msgq.WILDCARD or instance == msgq.WILDCARD or wanted == instance}
        to = headers.get(TO, msgq.WILDCARD)
        if to == msgq.WILDCARD:
            return NORMAL in matching
        return to == self.lname and bool(matching)

    def encode_delivery(self, message: Message) -> bytes:
        counters = self.gateway.counters
        if not self.wants(message):
            counters["filtered"] += 1
            return b""
        counters["delivered"] += 1  # taken back below if the frame is too large
        headers = message.headers
        msg: msgq.Item = message.body
        extra: dict[bytes, msgq.Item] = {}
        # Another door may have set these headers to anything: what does not decode travels as it is.
        if headers.get(ITEM) == TLV:
            msg = _decoded(message.body, message.body)
        packed = headers.get(EXTRA)
        if packed is not None:
            unpacked = _decoded(packed, None)
            if isinstance(unpacked, dict):
                extra.update(unpacked)
        for name, value in headers.items():
            if name.startswith(b"X-") and len(name) <= 255:
                extra[name] = value
        extra[ID_FIELD] = b"%d" % message.id
        frame = msgq.send_frame(
            headers.get(FROM, OTHER_DOOR), headers.get(TO, msgq.WILDCARD), message.topic,
            headers.get(INSTANCE, msgq.WILDCARD), headers.get(SEQ, b"%d" % message.id), msg,
            headers.get(REPL), extra,
        )
        if len(frame) - 4 > self.gateway.options.max_message:
            counters["delivered"] -= 1
            counters["oversize"] += 1
            return b""
        return frame


def _decoded(data: bytes, fallback: msgq.Item) -> msgq.Item:
    try:
        return msgq.decode_item(data)
    except ProtocolError:
        return fallback
