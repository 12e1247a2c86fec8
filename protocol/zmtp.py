"""ZMTP 3, the wire under ZeroMQ's TCP sockets (RFC 23 and 37), with the NULL and CURVE mechanisms: what the
broker's own ROUTER engine (:mod:`broker.zmtp_door`) speaks to the clients' libzmq DEALERs, and what the
native DEALER (:mod:`connector.zmtp_dealer`: ``AsyncClient``'s wire, a cluster's links) speaks to a broker.

A connection starts with a 64-byte greeting each way (signature, version, mechanism, as-server), then each
side sends a READY command carrying its properties (``Socket-Type``, and a DEALER's optional ``Identity``).
After that the wire is frames: a flags octet (MORE, LONG, COMMAND), a size (one octet, or eight big-endian
with LONG) and the bytes. A message is the frames up to one without MORE. Commands between messages are PING
(answered with PONG carrying the PING's context), PONG and ERROR. With CURVE (:mod:`protocol.curvezmq`) the
handshake is HELLO, WELCOME, INITIATE and READY instead, and every frame after it travels boxed in a MESSAGE
whose plaintext carries the frame's flags.

:class:`Reader` takes bytes as they arrive and gives back what they complete; :func:`message` turns frames
into bytes to write. Nothing here touches a socket or a clock.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

from protocol import curvezmq
from protocol.errors import ProtocolError

SIGNATURE_HEAD = b"\xff"
SIGNATURE_TAIL = b"\x7f"
GREETING_SIZE = 64


def greeting(mechanism: bytes, as_server: bool = True) -> bytes:
    """Our greeting: ZMTP 3.0 (a 3.1 peer speaks 3.0 to a 3.0 peer), ``mechanism``, as-server."""
    return (SIGNATURE_HEAD + bytes(8) + SIGNATURE_TAIL + b"\x03\x00" + mechanism.ljust(20, b"\0")
            + (b"\x01" if as_server else b"\x00") + bytes(31))


GREETING = greeting(b"NULL")

MORE = 0x01
LONG = 0x02
COMMAND = 0x04

#: The socket types each of ours talks to (RFC 28: a ROUTER accepts DEALER, REQ and ROUTER peers; a DEALER
#: ROUTER, DEALER and REP ones).
PEERS = {
    b"ROUTER": frozenset({b"DEALER", b"REQ", b"ROUTER"}),
    b"DEALER": frozenset({b"ROUTER", b"DEALER", b"REP"}),
}

_SIZE = struct.Struct(">Q")
_PROPERTY_SIZE = struct.Struct(">I")
#: A PING's longest context (RFC 37).
_PING_CONTEXT = 16
#: Frames in one message at most: a SUB names one topic a frame, so this is far above what a client sends.
MAX_PARTS = 65_536


class ZmtpError(ProtocolError):
    """The peer broke ZMTP: the connection is closed (with an ERROR command first where the RFC has one)."""


class MechanismMismatch(ZmtpError):
    """The peer's greeting names another security mechanism than ours (CURVE on one side only)."""


class HandshakeRefused(ZmtpError):
    """The peer sent ERROR during the handshake; ``reason`` is its text (a ZAP status such as ``400`` when a
    server refused our CURVE key)."""

    def __init__(self, reason: str) -> None:
        super().__init__("the peer refused the handshake" + (f": {reason}" if reason else ""))
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Ready:
    """The peer finished its handshake: its socket type, the routing identity it asked for (empty: none) and,
    with CURVE, its long-term public key (to admit or refuse before :meth:`Reader` is told to answer)."""

    socket_type: bytes
    identity: bytes
    client_key: bytes | None = None


@dataclass(frozen=True, slots=True)
class Reply:
    """Bytes to send the peer now (a CURVE WELCOME)."""

    data: bytes


@dataclass(frozen=True, slots=True)
class Ping:
    """A heartbeat: answer with :func:`pong` of ``context``."""

    context: bytes


def command(name: bytes, body: bytes = b"") -> bytes:
    """One command frame: its name (length-prefixed) and ``body``."""
    return command_frame(bytes((len(name),)) + name + body)


def command_frame(data: bytes) -> bytes:
    """A command frame around ``data`` (the command's name already in front)."""
    if len(data) <= 255:
        return bytes((COMMAND, len(data))) + data
    return bytes((COMMAND | LONG,)) + _SIZE.pack(len(data)) + data


def properties(values: dict[bytes, bytes]) -> bytes:
    """A READY command's metadata: each name length-prefixed in one octet, each value in four."""
    return b"".join(bytes((len(name),)) + name + _PROPERTY_SIZE.pack(len(value)) + value
                    for name, value in values.items())


def parse_properties(data: bytes) -> dict[bytes, bytes]:
    """The metadata of a READY command, names lower-cased (RFC 23: they are case-insensitive)."""
    found: dict[bytes, bytes] = {}
    position = 0
    while position < len(data):
        name_size = data[position]
        name_end = position + 1 + name_size
        if name_size == 0 or name_end + 4 > len(data):
            raise ZmtpError("a READY property is cut short")
        (value_size,) = _PROPERTY_SIZE.unpack_from(data, name_end)
        value_end = name_end + 4 + value_size
        if value_end > len(data):
            raise ZmtpError("a READY property's value is cut short")
        found[data[position + 1:name_end].lower()] = data[name_end + 4:value_end]
        position = value_end
    return found


ROUTER_METADATA = properties({b"Socket-Type": b"ROUTER"})
READY_ROUTER = command(b"READY", ROUTER_METADATA)
DEALER_METADATA = properties({b"Socket-Type": b"DEALER"})


def error(reason: str) -> bytes:
    """An ERROR command (sent during the handshake before closing): the reason, at most 255 bytes."""
    text = reason.encode()[:255]
    return command(b"ERROR", bytes((len(text),)) + text)


def pong(context: bytes) -> bytes:
    return command(b"PONG", context)


def check_greeting(data: bytes, expected: bytes = b"NULL") -> None:
    """Refuse a greeting we cannot speak to: not ZMTP, a version before 3, or a mechanism other than ours."""
    if data[:1] != SIGNATURE_HEAD or data[9:10] != SIGNATURE_TAIL:
        raise ZmtpError("not a ZeroMQ peer (no ZMTP signature)")
    if data[10] < 3:
        raise ZmtpError(f"ZMTP {data[10]}.x is not supported (3.0 or later)")
    mechanism = data[12:32].rstrip(b"\0")
    if mechanism != expected:
        state = "on" if expected == b"CURVE" else "off"
        shown = mechanism.decode(errors="replace")
        raise MechanismMismatch(f"security mechanism {shown!r} where this port has {expected.decode()} "
                                f"(CURVE is {state})")


def frame_head(size: int, more: bool) -> bytes:
    if size <= 255:
        return bytes((MORE if more else 0, size))
    return bytes((LONG | MORE if more else LONG,)) + _SIZE.pack(size)


#: The heads of short frames (up to 255 bytes), by size: followed by more frames, and last.
_SHORT_MORE = tuple(frame_head(size, True) for size in range(256))
_SHORT_LAST = tuple(frame_head(size, False) for size in range(256))


def message(frames: Sequence[bytes | memoryview]) -> list[bytes | memoryview]:
    """The pieces to write for one message (a head before each frame), for a gathered write: no frame is
    copied. Short frames' heads come from a table: every message any side sends passes here, most of its
    frames short (verbs, header names and values)."""
    pieces: list[bytes | memoryview] = []
    append = pieces.append
    last = len(frames) - 1
    for index, frame in enumerate(frames):
        size = len(frame)
        if size <= 255:
            append((_SHORT_MORE if index < last else _SHORT_LAST)[size])
        else:
            append(frame_head(size, index < last))
        append(frame)
    return pieces


class Reader:
    """One connection's incoming bytes: the peer's greeting, its handshake, then messages, PINGs and the rest.

    :meth:`feed` returns what the bytes completed: ``b"greeting"`` once, with CURVE a :class:`Reply` (the
    server's WELCOME, or the client's INITIATE, to send), a :class:`Ready` once, then lists of frames
    (messages) and :class:`Ping`. ``socket_type`` is ours (``ROUTER``, or ``DEALER`` with a
    :class:`~protocol.curvezmq.CurveClient`); the peer's must be one it talks to. It raises
    :class:`ZmtpError` (or :class:`protocol.curvezmq.CurveError`) on anything else: a bad greeting, a message
    before the handshake's end, a frame longer than ``max_frame`` (checked from its head, before its bytes
    arrive), an unknown command, a box that does not open, or a message of more than ``max_parts`` frames
    or more than twice ``max_frame`` bytes in all (libzmq bounds each frame only; a SUB names a topic a
    frame)."""

    def __init__(
        self, max_frame: int, max_parts: int = MAX_PARTS,
        curve: curvezmq.CurveServer | curvezmq.CurveClient | None = None, socket_type: bytes = b"ROUTER",
    ) -> None:
        self.max_frame = max_frame
        self.max_parts = max_parts
        self.curve = curve
        self.socket_type = socket_type
        self.peers = PEERS[socket_type]
        self._mechanism = b"CURVE" if curve is not None else b"NULL"
        self._buffer = bytearray()
        self._greeted = False
        self._welcomed = False  # CURVE: WELCOME sent (INITIATE expected), or INITIATE sent (READY expected)
        self._ready = False
        self._parts: list[bytes] = []
        self._held = 0  # bytes in ``_parts``

    @property
    def buffered(self) -> int:
        """Bytes held for what is not complete yet: a frame cut short and the frames of an unfinished
        message."""
        return len(self._buffer) + self._held

    def feed(self, data: bytes | memoryview) -> list[object]:
        buffer = self._buffer
        buffer += data
        out: list[object] = []
        position = 0
        if not self._greeted:
            if len(buffer) < GREETING_SIZE:
                if buffer[:1] not in (b"", SIGNATURE_HEAD):
                    raise ZmtpError("not a ZeroMQ peer (no ZMTP signature)")
                return out
            check_greeting(bytes(buffer[:GREETING_SIZE]), self._mechanism)
            self._greeted = True
            out.append(b"greeting")
            position = GREETING_SIZE
        # A frame's bytes are copied once, out of a view (a bytearray slice would copy them twice); the view
        # is released before the buffer shrinks.
        with memoryview(buffer) as view:
            position = self._frames(view, position, out)
        del buffer[:position]
        return out

    def _frames(self, buffer: memoryview, position: int, out: list[object]) -> int:
        """The complete frames of ``buffer`` from ``position``, into ``out``; where the first incomplete one
        starts."""
        size_of = _SIZE.unpack_from
        end_of_data = len(buffer)
        while position + 2 <= end_of_data:
            flags = buffer[position]
            if flags & LONG:
                if position + 9 > end_of_data:
                    break
                (size,) = size_of(buffer, position + 1)
                start = position + 9
            else:
                size = buffer[position + 1]
                start = position + 2
            if size > self.max_frame:
                raise ZmtpError(f"a frame of {size} bytes (the limit is {self.max_frame})")
            end = start + size
            if end > end_of_data:
                break
            body = bytes(buffer[start:end])
            position = end
            if flags & COMMAND:
                event = self._command(body)
            elif not self._ready:
                raise ZmtpError("a message before the handshake's end")
            elif self.curve is not None:
                inner, body = self.curve.unseal(body)
                event = self._command(body) if inner & curvezmq.COMMAND else self._frame(body, inner & MORE)
            else:
                event = self._frame(body, flags & MORE)
            if event is not None:
                out.append(event)
        return position

    def _frame(self, body: bytes, more: int) -> list[bytes] | None:
        parts = self._parts
        parts.append(body)
        if not more:
            self._parts = []
            self._held = 0
            return parts
        self._held += len(body)
        if len(parts) >= self.max_parts:
            raise ZmtpError(f"a message of more than {self.max_parts} frames")
        if self._held > 2 * self.max_frame:
            raise ZmtpError(f"a message of more than {2 * self.max_frame} bytes")
        return None

    def _command(self, body: bytes) -> object | None:
        if not body or len(body) < 1 + body[0]:
            raise ZmtpError("a command without a name")
        name = body[1:1 + body[0]]
        rest = body[1 + body[0]:]
        if not self._ready:
            if name == b"ERROR":
                raise HandshakeRefused(rest[1:1 + rest[0]].decode(errors="replace") if rest else "")
            if self.curve is not None:
                return self._curve_handshake(body)
            if name != b"READY":
                raise ZmtpError(f"{name.decode(errors='replace')} before READY")
            return self._peer_ready(rest, None)
        if name == b"PING":
            # Two octets of TTL, then the context to echo (at most 16 octets).
            return Ping(rest[2:2 + _PING_CONTEXT])
        if name in (b"PONG", b"SUBSCRIBE", b"CANCEL"):
            return None
        if name == b"ERROR":
            raise ZmtpError("the peer sent ERROR")
        raise ZmtpError(f"unknown command {name.decode(errors='replace')!r}")

    def _curve_handshake(self, body: bytes) -> object:
        curve = self.curve
        if type(curve) is curvezmq.CurveClient:
            if not self._welcomed:
                self._welcomed = True
                return Reply(command_frame(curve.initiate(body)))
            return self._peer_ready(curve.ready(body), None)
        assert type(curve) is curvezmq.CurveServer
        if not self._welcomed:
            self._welcomed = True
            return Reply(command_frame(curve.welcome(body)))
        initiated = curve.initiate(body)
        return self._peer_ready(initiated.metadata, initiated.client_key)

    def _peer_ready(self, metadata: bytes, client_key: bytes | None) -> Ready:
        found = parse_properties(metadata)
        socket_type = found.get(b"socket-type", b"")
        if socket_type not in self.peers:
            raise ZmtpError(f"a {socket_type.decode(errors='replace') or 'peer without a socket type'} "
                            f"cannot talk to a {self.socket_type.decode()}")
        self._ready = True
        return Ready(socket_type, found.get(b"identity", b""), client_key)


class Writer:
    """What we send one connection, framed (and boxed, with CURVE): as a ROUTER (the broker's port, with a
    :class:`~protocol.curvezmq.CurveServer`) or as a DEALER (a link to another broker, with a
    :class:`~protocol.curvezmq.CurveClient`)."""

    def __init__(self, curve: curvezmq.CurveServer | curvezmq.CurveClient | None = None,
                 socket_type: bytes = b"ROUTER") -> None:
        self.curve = curve
        self.metadata = properties({b"Socket-Type": socket_type})
        self.server = socket_type == b"ROUTER"

    def greeting(self) -> bytes:
        return greeting(b"CURVE" if self.curve is not None else b"NULL", self.server)

    def ready(self) -> bytes:
        """Our READY: with NULL, sent once the greetings crossed; a CURVE server's, once the client's key is
        admitted. (A CURVE client's metadata travels in its INITIATE.)"""
        if self.curve is None:
            return command(b"READY", self.metadata)
        assert type(self.curve) is curvezmq.CurveServer
        return command_frame(self.curve.ready(self.metadata))

    def hello(self) -> bytes:
        """A CURVE client's first command, once the greetings crossed."""
        assert type(self.curve) is curvezmq.CurveClient
        return command_frame(self.curve.hello())

    def message(self, frames: Sequence[bytes | memoryview]) -> list[bytes | memoryview]:
        if self.curve is None:
            return message(frames)
        return _framed(self.curve.seal(frames))

    def pong(self, context: bytes) -> list[bytes | memoryview]:
        if self.curve is None:
            return [pong(context)]
        return _framed(self.curve.seal([b"\x04PONG" + context], command=True))


def _framed(boxes: list[bytes]) -> list[bytes | memoryview]:
    pieces: list[bytes | memoryview] = []
    for box in boxes:
        pieces.append(frame_head(len(box), False))
        pieces.append(box)
    return pieces
