"""The Lumberjack windowed dialect (seed 004: Beats / logstash-forwarder) as a sans-IO codec for both ends,
and the reader's ack accounting.

:class:`ServerConnection` is the reader (the broker): bytes in through ``receive_data``, :class:`Window` and
:class:`Event` out of ``next_event``, :class:`Ack` to bytes through ``send``. :class:`ClientConnection` is the
writer (our connector client and the tests): it writes windows and data frames and reads acks.
:class:`AckWindow` decides when the reader acks; it holds no clock and writes nothing, so the shell can hold
an ack back until every event it covers is durable.

From the seed and the original projects (spec):

* A frame is a version byte, ASCII ``'1'`` (0x31) or ``'2'`` (0x32), a type byte and a payload; integers are
  big-endian u32.
* ``W`` (writer): the window size, in data frames. ``D`` (writer, v1): seq, pair count, then per pair a
  u32-length key and a u32-length value (UTF-8 strings). ``J`` (writer, v2): seq, u32 length, a JSON
  document, which must be an object. ``C`` (writer): u32 length and a zlib stream (zlib header, not raw
  deflate nor gzip) that inflates to whole frames only. ``A`` (reader): the sequence number acked; an ack
  covers every data frame up to and including it.
* A sequence number smaller than the previous one is a rollover (or, from Beats, a new batch that restarts at
  1), never an error.
* There is no error frame: a reader that cannot read the stream closes the connection.

Our choice (PROTOCOLS.md section 4 records the facts these rest on):

* Limits, all constructor arguments: ``max_window`` (a larger W is refused), ``max_frame`` (no frame,
  top-level or inside a compressed payload, may be longer, header included; refused as soon as a length
  field says so, before the bytes arrive, so reading a frame never buffers more than ``max_frame`` bytes),
  ``max_decompressed`` (the bytes inflated for one top-level C frame, nested ones included; inflation stops
  as soon as the output passes it, so a zip bomb costs at most that much memory).
* Compressed frames may nest, at most :data:`MAX_COMPRESSED_DEPTH` deep (the outer one counts). A payload is
  inflated and its framing checked as a whole before any of its events comes out: a partial frame, a bad
  version or type byte, an oversized frame or window, or bytes after the end of the zlib stream refuse the
  whole C frame. Its frames are decoded one at a time, as they are returned, so a JSON document that is
  refused stops the connection after the events before it came out.
* Inflating is done in steps of at most :data:`INFLATE_STEP` bytes out and :data:`CHECK_STEP` frames checked,
  the framing checked as the output grows: ``next_event`` returns None with ``busy`` set between two steps, so
  a caller can let other work run (a small frame can inflate to many megabytes), and a payload whose framing
  is wrong is refused at the first bad frame rather than after the whole inflation. One top-level compressed
  frame may hold at most ``2 * max_window`` frames, nested ones included: a writer sends a window's worth of
  data frames per batch, and more is only work for the reader.
* ``D`` and ``J`` are read under either version byte (as logstash-input-beats, the reference reader, does);
  the event carries the frame's version. Windows may also appear inside a compressed payload.
* Keys and values of ``D`` and the text of ``J`` are decoded as UTF-8 with invalid bytes replaced by U+FFFD:
  a writer resends a refused batch forever, so an event is never lost over its encoding. For the same reason
  ``J`` accepts what Python's json module accepts (NaN and Infinity included). A key repeated in one ``D``
  frame or JSON object keeps its last value. A ``J`` that is not JSON, not an object, nested past Python's
  recursion limit or holds an integer too long to convert is refused.
* A reader receiving an ``A`` frame, or a writer receiving anything but ``A``, refuses it. The writer accepts
  acks under either version byte.
* Every error a connection raises is final: ``next_event`` raises it again and later input is dropped (the
  framing is lost); the shell closes the connection.
* :meth:`ClientConnection.send_events` refuses (ValueError) to write a frame longer than its ``max_frame``,
  the compressed frame counting as one, since a reader would close the connection and the writer would
  resend the same batch forever. JSON is written compact, UTF-8, without NaN or Infinity (readers other than
  Python refuse them). An empty list of events writes nothing.
* The ack rule is :class:`AckWindow`'s docstring.

Received protocol violations raise :class:`ProtocolError`; misuse of the send methods raises ``ValueError``
(a value the wire cannot carry) or ``TypeError`` (an object of the wrong kind).
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from protocol.errors import ProtocolError

V1: Final = 0x31  # ASCII '1': logstash-forwarder and other v1 writers
V2: Final = 0x32  # ASCII '2': Beats
#: C frames nested deeper than this (the outer one counts) are refused; real writers never nest.
MAX_COMPRESSED_DEPTH: Final = 4
DEFAULT_KEEPALIVE_INTERVAL: Final = 5.0  # seconds; Beats times out after 30 s without hearing from the reader

_WINDOW = 0x57  # 'W'
_DATA = 0x44  # 'D'
_JSON = 0x4A  # 'J'
_COMPRESSED = 0x43  # 'C'
_ACK = 0x41  # 'A'
_VERSIONS = (V1, V2)
_U32_MAX = 0xFFFFFFFF
_U32 = struct.Struct(">I")
_TWO_U32 = struct.Struct(">II")
_SHORT_FRAME = 6  # version, type, one u32: W, A and the C header
_LONG_HEADER = 10  # version, type, two u32s: the D and J headers
_PAIR_MINIMUM = 8  # a D pair with an empty key and an empty value
_INFLATE_IN = 64 << 10  # compressed bytes fed to zlib per call
_INFLATE_OUT = 1 << 20  # inflated bytes taken from zlib per call
#: Inflated bytes, and frames whose framing is checked, per step of ``next_event`` (a few milliseconds each).
INFLATE_STEP: Final = 1 << 20
CHECK_STEP: Final = 2048
_FRAME_NAMES = {_WINDOW: "window", _DATA: "data", _JSON: "JSON", _COMPRESSED: "compressed", _ACK: "ack"}


# ---------------------------------------------------------------------------------------------------- events


@dataclass(frozen=True, slots=True)
class Window:
    """W: the writer sends at most ``size`` data frames before it waits for an ack."""

    version: int  # V1 or V2
    size: int


@dataclass(frozen=True, slots=True)
class Event:
    """One data frame: ``D`` (fields are str -> str) or ``J`` (fields are the decoded JSON object)."""

    version: int  # V1 or V2: the frame's version byte
    seq: int
    fields: dict[str, Any]
    # J frames: the JSON document as it came (decoded as UTF-8), so a reader can keep it without encoding the
    # fields again. Not part of equality: the same fields may be written in more than one way.
    text: str = field(default="", compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class Ack:
    """A: every data frame up to and including ``seq`` was received. ``Ack(V2, 0)`` is also a keepalive."""

    version: int
    seq: int


# --------------------------------------------------------------------------------------------------- helpers


def _u32(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an integer, not {type(value).__name__}")
    if not 0 <= value <= _U32_MAX:
        raise ValueError(f"{what} must be in 0..2**32-1, not {value}")
    return value


def _version(value: object) -> int:
    if type(value) is not int or value not in _VERSIONS:
        raise ValueError(f"the version must be V1 (0x31) or V2 (0x32), not {value!r}")
    return value  # type: ignore[return-value]


def _limit(value: object, what: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{what} must be an integer of at least {minimum}, not {value!r}")
    return value


def _show(byte: int) -> str:
    """A version or type byte inside an error message."""
    return f"0x{byte:02x} ({chr(byte)!r})" if 0x20 < byte < 0x7F else f"0x{byte:02x}"


def _encode_text(value: str, what: str) -> bytes:
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError as error:  # lone surrogates
        raise ValueError(f"{what} is not encodable as UTF-8: {error.reason}") from None


class _Incomplete(Exception):
    """The frame at ``pos`` needs the data to reach offset ``need``; ``resume`` is where a D frame's pair
    walk got to (length fields walked, offset), so that it does not start over when more bytes arrive."""

    def __init__(self, need: int, resume: tuple[int, int] | None = None) -> None:
        super().__init__(need)
        self.need = need
        self.resume = resume


class _Payload:
    """An inflated compressed payload whose frames are being returned; ``pos`` is the next frame."""

    __slots__ = ("data", "pos")

    def __init__(self, data: bytearray) -> None:
        self.data = data
        self.pos = 0


class _Inflation:
    """A compressed frame's payload being inflated and its framing checked, a step at a time."""

    __slots__ = ("at", "checked", "compressed", "inflater", "need", "pending", "resume")

    def __init__(self, compressed: bytes) -> None:
        self.compressed = memoryview(compressed)
        self.at = 0  # compressed bytes fed to zlib so far
        self.pending: bytes | memoryview = b""  # fed and not yet consumed (zlib's unconsumed tail)
        self.inflater = zlib.decompressobj()  # wbits 15: the zlib header is required; raw deflate, gzip fail
        self.checked = 0  # the payload's framing is checked up to here (a frame boundary)
        self.need = 0  # the frame at ``checked`` needs the payload to reach this size
        self.resume: tuple[int, int] | None = None  # its pair walk, for a D frame


# ---------------------------------------------------------------------------------------------------- reader


class ServerConnection:
    """The reader's side of one connection (the broker): decodes what a writer sends, encodes acks."""

    __slots__ = ("_budget", "_buffer", "_error", "_frames_left", "_inflating", "_max_decompressed",
                 "_max_frame", "_max_window", "_need", "_payload", "_payloads", "_resume", "busy")

    def __init__(self, *, max_window: int = 65536, max_frame: int = 16 << 20,
                 max_decompressed: int = 64 << 20) -> None:
        self._max_window = _limit(max_window, "max_window", 1)
        self._max_frame = _limit(max_frame, "max_frame", _SHORT_FRAME)
        self._max_decompressed = _limit(max_decompressed, "max_decompressed", 1)
        self._buffer = bytearray()
        # The head frame is known to need this many buffered bytes: until then next_event does not look at
        # it again, so a large frame arriving in small pieces costs linear time.
        self._need = 0
        self._resume: tuple[int, int] | None = None  # the head D frame's pair walk, when it had to stop
        self._payloads: list[_Payload] = []  # inflated C payloads being returned, innermost last
        self._budget = 0  # bytes the current top-level C frame may still inflate to
        self._frames_left = 0  # frames the current top-level C frame may still hold
        self._inflating: _Inflation | None = None  # a C payload being inflated (see busy)
        self._payload = bytearray()  # its output so far
        self._error: ProtocolError | None = None
        #: True when ``next_event`` returned None halfway through inflating a compressed frame: call it again.
        self.busy = False

    def receive_data(self, data: bytes) -> None:
        if self._error is None:
            self._buffer += data

    def next_event(self) -> Window | Event | None:
        """The next window or data frame, or None until more data arrives. Raises ProtocolError (for good)."""
        if self._error is not None:
            raise self._error
        try:
            return self._next()
        except ProtocolError as error:
            # Kept without the traceback, whose frames would keep the failed frame's bytes alive.
            self._error = ProtocolError(str(error))
            self._buffer.clear()
            self._payloads.clear()
            self._inflating = None
            self._payload = bytearray()
            self.busy = False
            raise

    @property
    def buffered(self) -> int:
        """Bytes of input held: what was received and not yet decoded, and inflated payloads."""
        held = len(self._buffer) + sum(len(payload.data) - payload.pos for payload in self._payloads)
        if self._inflating is not None:
            held += len(self._payload) + len(self._inflating.compressed)
        return held

    def send(self, event: Ack) -> bytes:
        """``<version> 'A'`` + u32 seq."""
        if not isinstance(event, Ack):
            raise TypeError(f"a reader sends only Ack, not {type(event).__name__}")
        return bytes((_version(event.version), _ACK)) + _U32.pack(_u32(event.seq, "the ack seq"))

    # ------------------------------------------------------------------------------------------- reading

    def _next(self) -> Window | Event | None:
        while True:
            if self._inflating is not None:
                if not self._inflate_step():
                    self.busy = True
                    return None
                self.busy = False
                continue  # the payload is on the stack now
            if self._payloads:
                payload = self._payloads[-1]
                data = payload.data
                if payload.pos >= len(data):
                    self._payloads.pop()
                    continue
                # The payload's framing was checked when it was inflated: every frame is whole.
                pos = payload.pos
                stop = self._extent(data, pos, len(data), None)
                payload.pos = stop
            else:
                data = self._buffer
                if not data or len(data) < self._need:
                    return None
                try:
                    stop = self._extent(data, 0, len(data), self._resume)
                except _Incomplete as short:
                    self._need = short.need
                    self._resume = short.resume
                    return None
                pos = 0
            # Decoding slices copy what they keep, so the buffer can drop the frame right after.
            frame = self._decode(data, pos, stop)
            if data is self._buffer:
                del data[:stop]
                self._need = 0
                self._resume = None
            if frame is not None:
                return frame
            # A C frame: its payload is on the stack now.

    def _extent(self, data: bytes | bytearray, pos: int, end: int, resume: tuple[int, int] | None) -> int:
        """The end offset of the frame at ``pos``; _Incomplete if it runs past ``end``. Every check that
        needs only the frame's header and lengths is made here, as soon as those bytes are in."""
        if end - pos < 2:
            raise _Incomplete(pos + 2)
        version, kind = data[pos], data[pos + 1]
        if version not in _VERSIONS:
            raise ProtocolError(f"bad version byte {_show(version)} (expected '1' or '2')")
        if kind == _WINDOW:
            stop = pos + _SHORT_FRAME
            if stop > end:
                raise _Incomplete(stop)
            (size,) = _U32.unpack_from(data, pos + 2)
            if size > self._max_window:
                raise ProtocolError(f"a window of {size} data frames is over the limit of {self._max_window}")
            return stop
        if kind in (_JSON, _COMPRESSED):
            header = _LONG_HEADER if kind == _JSON else _SHORT_FRAME
            if end - pos < header:
                raise _Incomplete(pos + header)
            (length,) = _U32.unpack_from(data, pos + header - 4)
            self._fits(header + length, kind)
            stop = pos + header + length
            if stop > end:
                raise _Incomplete(stop)
            return stop
        if kind == _DATA:
            return self._data_extent(data, pos, end, resume)
        if kind == _ACK:
            raise ProtocolError("an ack frame from the writer: acks are sent by the reader only")
        raise ProtocolError(f"unknown frame type {_show(kind)}")

    def _fits(self, size: int, kind: int) -> None:
        if size > self._max_frame:
            raise ProtocolError(f"a {_FRAME_NAMES[kind]} frame of {size} bytes or more is over the limit of "
                                f"{self._max_frame}")

    def _data_extent(self, data: bytes | bytearray, pos: int, end: int,
                     resume: tuple[int, int] | None) -> int:
        if end - pos < _LONG_HEADER:
            raise _Incomplete(pos + _LONG_HEADER)
        (count,) = _U32.unpack_from(data, pos + 6)
        self._fits(_LONG_HEADER + _PAIR_MINIMUM * count, _DATA)
        done, at = resume if resume is not None else (0, pos + _LONG_HEADER)
        limit = pos + self._max_frame
        # Two length fields per pair; ``done`` counts length fields walked, so a walk can stop between them.
        while done < 2 * count:
            if at + 4 > end:
                raise _Incomplete(at + 4, (done, at))
            (length,) = _U32.unpack_from(data, at)
            if at + 4 + length > limit:
                raise ProtocolError(f"a data frame pair {'value' if done % 2 else 'key'} of {length} bytes "
                                    f"makes the frame longer than the limit of {self._max_frame}")
            at += 4 + length
            done += 1
            if at > end:
                raise _Incomplete(at, (done, at))
        return at

    def _decode(self, data: bytes | bytearray, pos: int, stop: int) -> Window | Event | None:
        """The frame at ``data[pos:stop]`` (its extent already checked); None for a C frame, whose payload
        is pushed for :meth:`_next` to return."""
        version, kind = data[pos], data[pos + 1]
        if kind == _JSON:
            seq, _ = _TWO_U32.unpack_from(data, pos + 2)
            text = data[pos + _LONG_HEADER : stop].decode("utf-8", "replace")
            try:
                fields = json.loads(text)
            except RecursionError:
                raise ProtocolError(f"the JSON document of frame seq {seq} is nested too deeply") from None
            except ValueError as error:  # JSONDecodeError, and integers over Python's digit limit
                raise ProtocolError(f"the JSON document of frame seq {seq} is not valid JSON: "
                                    f"{error}") from None
            if not isinstance(fields, dict):
                raise ProtocolError(f"the JSON document of frame seq {seq} must be an object, not "
                                    f"{type(fields).__name__}")
            return Event(version, seq, fields, text)
        if kind == _DATA:
            seq, count = _TWO_U32.unpack_from(data, pos + 2)
            at = pos + _LONG_HEADER
            pairs: dict[str, Any] = {}
            for _ in range(count):
                (length,) = _U32.unpack_from(data, at)
                key = data[at + 4 : at + 4 + length].decode("utf-8", "replace")
                at += 4 + length
                (length,) = _U32.unpack_from(data, at)
                pairs[key] = data[at + 4 : at + 4 + length].decode("utf-8", "replace")
                at += 4 + length
            return Event(version, seq, pairs)
        if kind == _WINDOW:
            (size,) = _U32.unpack_from(data, pos + 2)
            return Window(version, size)
        # A compressed frame: inflated (and its framing checked) by the steps of _inflate_step.
        depth = len(self._payloads) + 1
        if depth > MAX_COMPRESSED_DEPTH:
            raise ProtocolError(f"compressed frames nested more than {MAX_COMPRESSED_DEPTH} deep")
        if depth == 1:
            self._budget = self._max_decompressed
            self._frames_left = 2 * self._max_window
        self._inflating = _Inflation(bytes(data[pos + _SHORT_FRAME : stop]))
        self._payload = bytearray()
        return None

    def _inflate_step(self) -> bool:
        """Inflate some more of the compressed frame in hand and check the framing of what came out; True
        once it is whole and checked (its payload is then on the stack), False if there is more to do.

        The output never grows more than :data:`_INFLATE_OUT` past the budget, whatever the input says, and
        input is fed in small pieces so that the unconsumed rest is never copied whole."""
        state = self._inflating
        assert state is not None
        inflater, payload, room = state.inflater, self._payload, self._budget
        compressed, end = state.compressed, len(state.compressed)
        target = len(payload) + INFLATE_STEP
        try:
            while not inflater.eof and len(payload) < target:
                data = state.pending
                if not data and state.at < end:
                    data = compressed[state.at : state.at + _INFLATE_IN]
                    state.at += len(data)
                piece = inflater.decompress(data, min(_INFLATE_OUT, room + 1 - len(payload)))
                payload += piece
                if len(payload) > room:
                    raise ProtocolError(f"a compressed frame inflates to more than {self._max_decompressed} "
                                        "bytes")
                state.pending = inflater.unconsumed_tail
                if not piece and not state.pending and state.at >= end and not inflater.eof:
                    raise ProtocolError("a compressed frame holds a truncated zlib stream")
        except zlib.error as error:
            raise ProtocolError(f"a compressed frame holds a bad zlib stream: {error}") from None
        # The framing of what came out, a frame at a time as each is whole: a payload that is not frames is
        # refused at its first bad byte, not after megabytes of it.
        size = len(payload)
        checks = CHECK_STEP
        while checks and state.checked < size and size >= state.need:
            try:
                following = self._extent(payload, state.checked, size, state.resume)
            except _Incomplete as short:
                state.need, state.resume = short.need, short.resume
                break
            state.checked, state.need, state.resume = following, 0, None
            checks -= 1
            self._frames_left -= 1
            if self._frames_left < 0:
                raise ProtocolError(f"a compressed frame holds more than {2 * self._max_window} frames "
                                    "(twice the largest window)")
        if not inflater.eof or state.checked < size:
            if inflater.eof and checks and size < state.need:
                raise ProtocolError(f"a partial frame at offset {state.checked} of a compressed payload of "
                                    f"{size} bytes (compressed frames hold whole frames only)")
            return False
        trailing = len(inflater.unused_data) + len(state.pending) + end - state.at
        if trailing:
            raise ProtocolError(f"{trailing} bytes follow the zlib stream in a compressed frame")
        self._budget = room - size
        self._inflating = None
        self._payload = bytearray()
        self._payloads.append(_Payload(payload))
        return True


# ---------------------------------------------------------------------------------------------------- writer


class ClientConnection:
    """The writer's side of one connection: encodes windows and data frames, decodes acks."""

    __slots__ = ("_buffer", "_error", "_max_frame", "_version")

    def __init__(self, *, version: int = V2, max_frame: int = 1 << 20) -> None:
        self._version = _version(version)
        self._max_frame = _limit(max_frame, "max_frame", _SHORT_FRAME)
        self._buffer = bytearray()
        self._error: ProtocolError | None = None

    @property
    def version(self) -> int:
        return self._version

    def receive_data(self, data: bytes) -> None:
        if self._error is None:
            self._buffer += data

    def next_event(self) -> Ack | None:
        """The next ack, or None until more data arrives. Anything else raises ProtocolError (for good)."""
        if self._error is not None:
            raise self._error
        buffer = self._buffer
        if len(buffer) < 2:
            return None
        version, kind = buffer[0], buffer[1]
        if version not in _VERSIONS:
            error = ProtocolError(f"bad version byte {_show(version)} (expected '1' or '2')")
        elif kind != _ACK:
            name = _FRAME_NAMES.get(kind)
            error = ProtocolError(f"a {name} frame from the reader: a writer receives only acks" if name
                                  else f"unknown frame type {_show(kind)}")
        else:
            if len(buffer) < _SHORT_FRAME:
                return None
            (seq,) = _U32.unpack_from(buffer, 2)
            del buffer[:_SHORT_FRAME]
            return Ack(version, seq)
        self._error = error
        buffer.clear()
        raise error

    def send_window(self, size: int) -> bytes:
        return bytes((self._version, _WINDOW)) + _U32.pack(_u32(size, "the window size"))

    def send_events(self, events: list[tuple[int, dict]], *, compress: bool = False, level: int = 6) -> bytes:
        """Data frames for ``(seq, fields)`` pairs: J under V2, D under V1 (keys and values through ``str``).
        ``compress`` wraps them all in one C frame at zlib ``level``."""
        if not isinstance(level, int) or isinstance(level, bool) or not -1 <= level <= 9:
            raise ValueError(f"the zlib level must be -1..9, not {level!r}")
        frames = b"".join(self._data_frame(seq, fields) for seq, fields in events)
        if not frames or not compress:
            return frames
        payload = zlib.compress(frames, level)
        self._check_size(_SHORT_FRAME + len(payload), "compressed")
        return b"".join((bytes((self._version, _COMPRESSED)), _U32.pack(len(payload)), payload))

    def _data_frame(self, seq: int, fields: dict) -> bytes:
        seq = _u32(seq, "an event seq")
        if not isinstance(fields, Mapping):
            raise TypeError(f"event fields must be a dict, not {type(fields).__name__}")
        if self._version == V2:
            text = json.dumps(fields, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
            document = _encode_text(text, f"the JSON of event seq {seq}")
            self._check_size(_LONG_HEADER + len(document), "JSON")
            return b"".join((b"2J", _TWO_U32.pack(seq, len(document)), document))
        texts = [_encode_text(str(text), f"a field of event seq {seq}")
                 for pair in fields.items() for text in pair]
        self._check_size(_LONG_HEADER + sum(4 + len(raw) for raw in texts), "data")
        parts = [b"1D", _TWO_U32.pack(seq, len(fields))]
        for raw in texts:
            parts += (_U32.pack(len(raw)), raw)
        return b"".join(parts)

    def _check_size(self, size: int, what: str) -> None:
        """Checked before a length is packed, so nothing over 32 bits gets that far."""
        if size > self._max_frame or size > _U32_MAX:
            raise ValueError(f"a {what} frame of {size} bytes is over max_frame ({self._max_frame})")


# ------------------------------------------------------------------------------------------------ ack rule


class AckWindow:
    """The reader's ack accounting for one connection, as a plain object that returns the acks to send.

    The rule (PROTOCOLS.md section 4), written for all the writers seen in the wild: Beats (``2W n`` then n
    data frames, sequence restarting at 1 per batch, two batches in flight), logstash-forwarder (``1W n`` per
    batch, one continuous sequence, exactly one ack read per batch) and streaming writers (one W, then data
    frames forever):

    * An ack carries the sequence number of the latest data frame and its version byte, never a count. A
      sequence smaller than the one before is a rollover or a new batch, so the latest is the highest in
      sequence order.
    * :meth:`event` returns an ack as soon as the data frames received since the last ack reach the window,
      or the sequence has moved on by the window since the last ack (a writer that skips sequence numbers
      counts its window in them). After a rollover or a restart the distance is counted from the frames
      received since the last ack. Before any W, and after ``W 0``, every data frame is acked at once.
    * :meth:`window`: a W while data frames are unacked acks them first (the writer has finished that
      window; logstash-input-beats does the same), so each window starts with nothing pending. ``W 0`` is
      answered with an ack of 0.

    Holding acks: every ack returned covers the data frames passed to :meth:`event` before it returned, and
    only those, so the shell may hold it until they are durable; acks go out in the order they were
    returned. The accounting counts an ack as given when it is returned.

    Keepalives (v2 only; never when the latest frame from the writer was v1): Beats hears ``2A 0`` as "still
    working". :meth:`keepalive` returns ``Ack(V2, 0)`` while data frames are pending, once
    ``keepalive_interval`` seconds have passed since the later of the first data frame after the last ack
    (the batch start) and the last keepalive returned. Nothing is pending once an ack is returned, so a shell
    holding an ack decides itself whether the writer needs a keepalive meanwhile.

    Time is the ``now`` argument, in seconds from any fixed origin.
    """

    __slots__ = ("_base", "_interval", "_last_seq", "_pending", "_quiet_since", "_version", "_window")

    def __init__(self, *, keepalive_interval: float = DEFAULT_KEEPALIVE_INTERVAL) -> None:
        if isinstance(keepalive_interval, bool) or not isinstance(keepalive_interval, int | float) \
                or not keepalive_interval > 0:
            raise ValueError(f"keepalive_interval must be a positive number of seconds, not "
                             f"{keepalive_interval!r}")
        self._interval = keepalive_interval
        self._window = 0  # the latest W; 0 (none yet, or W 0) acks every data frame
        self._version: int | None = None  # the latest frame's version byte: v1 peers get no keepalives
        self._pending = 0
        self._last_seq: int | None = None
        # The sequence distance is ``seq - _base``: the last seq acked, or, after a rollover or a restart,
        # a point as far back as the frames pending.
        self._base = 0
        self._quiet_since = 0.0  # the keepalive clock: the batch start or the last keepalive

    @property
    def pending(self) -> int:
        """Data frames received and not yet covered by an ack returned."""
        return self._pending

    def window(self, frame: Window, now: float) -> list[Ack]:
        """A W frame: the acks now due (the unacked frames of the window before, then 0 for ``W 0``)."""
        acks: list[Ack] = []
        if self._pending:
            acks.append(self._due(self._version or frame.version))
        self._window = frame.size
        self._version = frame.version
        if frame.size == 0:
            acks.append(Ack(frame.version, 0))
        return acks

    def event(self, frame: Event, now: float) -> list[Ack]:
        """A data frame received: the acks now due by the rule ([] or one)."""
        if not self._pending:
            self._quiet_since = now  # a batch starts: the writer waits for us from here
        seq = frame.seq
        self._pending += 1
        self._version = frame.version
        if self._last_seq is None or seq < self._last_seq:
            self._base = seq - self._pending
        self._last_seq = seq
        window = self._window or 1
        if self._pending >= window or seq - self._base >= window:
            return [self._due(frame.version)]
        return []

    def keepalive(self, now: float) -> Ack | None:
        """``Ack(V2, 0)`` when one is due (see the class docstring), else None."""
        if self._version != V2 or not self._pending:
            return None
        if now - self._quiet_since < self._interval:
            return None
        self._quiet_since = now
        return Ack(V2, 0)

    def _due(self, version: int) -> Ack:
        """The ack of every pending frame: the latest seq."""
        assert self._last_seq is not None
        ack = Ack(version, self._last_seq)
        self._pending = 0
        self._base = self._last_seq
        return ack
