"""The reactive-streams dialect (seed 001: Reactive Streams over a byte stream) as a sans-IO codec, with the
stream bookkeeping both ends need: :class:`Demand` counts a stream's outstanding demand, :class:`Reassembler`
joins elements sent in parts and :func:`split` cuts them.

:class:`Connection` is either end of one connection: bytes in through ``receive_data``, events out of
``next_event``, events to bytes through ``send``. It owns the handshake rules, the wire format and the one
piece of stream state that decoding depends on (each stream's element size); which streams exist, demand and
the order of signals on a stream are the shell's (with :class:`Demand` and :class:`Reassembler`).

From the seed (spec): a message is one type byte followed by its fields, each of fixed size, a varint or
length-prefixed, so messages are self-delimiting and there is no outer length; the loose hello handshake
(version 0; an unsupported version is answered with goodbye and close); a new message type defined by an
extension is not sent before the peer's hello lists that extension; the protocol is fully bidirectional and
the subscriber chooses the stream's id; ``onSubscribe.elementSize > 0`` fixes the size of every element of
the stream, drops the onNext length prefix and allows onNextPacked; split elements are onNextPart... then
onNextLastPart with one element id; demand adds up, 2**63-1 or more is unbounded and request(0) is an error.

Our choice (the seed fixes no byte values; PROTOCOLS.md section 5 records these):

* Varint, Id and Long are unsigned LEB128 (the protobuf varint) of at most 10 bytes with a value below
  2**64: an 11th byte, or a 10th byte above 0x01, is refused as over-long. Padded forms within 10 bytes
  (``80 00`` for 0) are read, as protobuf reads them; the encoder writes the shortest form.
* String is a varint length + UTF-8 (invalid UTF-8 is refused), bytes a varint length + raw bytes,
  Array[Id] a varint count + varints, byte one octet.
* Type codes 0x00 clientHello, 0x01 serverHello, 0x02 goodbye, 0x03 subscribe, 0x04 request, 0x05 cancel,
  0x06 onSubscribe, 0x07 onNext, 0x08 onComplete, 0x09 onError, 0x0A onNextPacked, 0x0B onNextPart,
  0x0C onNextLastPart. 0x0D offer(publisher: String) is OUR EXTENSION, extension id 1 ("publish"): a side
  offers a publisher named by a topic, and the other side subscribes to it and requests demand; that is how
  a client publishes. It is sent only once the peer's hello lists extension 1, and received only once this
  side's hello did.
* A hello lists at most :data:`MAX_EXTENSIONS` extensions.
* The peer's hello must be the first message and comes once; a hello of the other side's kind is refused. A
  hello with a version other than 0 is returned as an event and everything after it is ignored, since its
  format is unknown; the shell answers goodbye and closes. A side sends its own hello before anything but
  goodbye.
* Element sizes. Streams are named by (direction, subscriber id): the ids a side picks for the subscriptions
  it makes are its own namespace, so one id can name two unrelated streams, one each way. The codec keeps
  each stream's size exactly as the other end will see it, which for each direction changes only with
  messages travelling in that direction: a received onSubscribe sets the size of our subscription (for
  received onNext/onNextPacked), a sent one the size of the peer's (for sent ones); onComplete and onError
  travelling the same way forget it. A cancel does not: elements the publisher sent before it saw the cancel
  are still on their way and still have no length prefix. A re-used id gets its new size from the new
  onSubscribe, which comes after everything the old stream sent. An id that never had a size is variable.
* A received onSubscribe for an id this side never subscribed is refused: it would change how later
  messages are read, and sizes of streams that do not exist would be memory a peer can fill. Every other
  signal naming an unknown stream is returned as an event; the shell decides.
* ``max_message`` bounds a whole message (type byte included). A message that would be longer is refused as
  soon as a length or count says so, before its bytes arrive, so one message never holds more than
  ``max_message`` bytes of buffer; it is at least :data:`MIN_MAX_MESSAGE`. ``max_ids`` bounds the subscriber
  and element ids received (not extension ids). Both limits apply to what is received, not to what ``send``
  writes: the peer's may differ.
* A received error is final: with no outer length the stream cannot be resynchronised, so ``next_event``
  raises the same error again and later input is dropped. The shell answers goodbye("protocol error: ...")
  and closes; ``send`` still works for that.
* After a received goodbye, input is ignored. After this side's goodbye only the peer's answering goodbye is
  still returned (everything else is read and dropped), and only goodbye may be sent.
* onNextPacked with a count of 0 is accepted both ways (it carries nothing and uses no demand).
* The codec does not count demand or check signal order; request(0) travels like any request and the shell's
  :class:`Demand` refuses it.

Received protocol violations raise :class:`ProtocolError`; misuse of ``send`` (a value the wire cannot carry,
a message the state does not allow) raises ``ValueError``, and an object that is not an event ``TypeError``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, TypeAlias

from protocol.errors import ProtocolError

#: The only protocol version we speak.
VERSION: Final = 0
#: Our extension id for offer (0x0D).
EXT_PUBLISH: Final = 1
#: Demand at or above this is unbounded.
UNBOUNDED: Final = 2**63 - 1
MAX_VARINT: Final = 2**64 - 1
#: A hello listing more extensions is refused (both ways). Real hellos list a handful; the cap keeps a hostile
#: hello from being re-read id by id as its bytes trickle in.
MAX_EXTENSIONS: Final = 256
#: The smallest ``max_message`` accepted: every message without a string or bytes field fits (a subscribe
#: with an empty publisher and two 10-byte varints is 22 bytes).
MIN_MAX_MESSAGE: Final = 22

_CLIENT_HELLO = 0x00
_SERVER_HELLO = 0x01
_GOODBYE = 0x02
_SUBSCRIBE = 0x03
_REQUEST = 0x04
_CANCEL = 0x05
_ON_SUBSCRIBE = 0x06
_ON_NEXT = 0x07
_ON_COMPLETE = 0x08
_ON_ERROR = 0x09
_ON_NEXT_PACKED = 0x0A
_ON_NEXT_PART = 0x0B
_ON_NEXT_LAST_PART = 0x0C
_OFFER = 0x0D
_NAMES = ("clientHello", "serverHello", "goodbye", "subscribe", "request", "cancel", "onSubscribe", "onNext",
          "onComplete", "onError", "onNextPacked", "onNextPart", "onNextLastPart", "offer")

_TYPE_BYTES = [bytes((code,)) for code in range(len(_NAMES))]
_SMALL_VARINTS = [bytes((value,)) for value in range(0x80)]


# ---------------------------------------------------------------------------------------------------- events


@dataclass(frozen=True, slots=True)
class ClientHello:
    version: int  # one byte
    extensions: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ServerHello:
    version: int  # one byte
    extensions: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Goodbye:
    reason: str


@dataclass(frozen=True, slots=True)
class Subscribe:
    publisher: str  # a topic name
    subscriber: int  # the id the subscribing side picked
    initial_demand: int = 0


@dataclass(frozen=True, slots=True)
class Request:
    subscriber: int
    demand: int


@dataclass(frozen=True, slots=True)
class Cancel:
    subscriber: int


@dataclass(frozen=True, slots=True)
class OnSubscribe:
    subscriber: int
    element_size: int = 0  # 0 = variable; otherwise every element is exactly this many bytes


@dataclass(frozen=True, slots=True)
class OnNext:
    subscriber: int
    element: bytes


@dataclass(frozen=True, slots=True)
class OnComplete:
    subscriber: int


@dataclass(frozen=True, slots=True)
class OnError:
    subscriber: int
    error: str


@dataclass(frozen=True, slots=True)
class OnNextPacked:
    """Several elements of a fixed-size stream in one message: ``len(elements)`` units of demand."""

    subscriber: int
    elements: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class OnNextPart:
    subscriber: int
    element: int  # the publisher's id for the element being split
    data: bytes


@dataclass(frozen=True, slots=True)
class OnNextLastPart:
    subscriber: int
    element: int
    data: bytes


@dataclass(frozen=True, slots=True)
class Offer:
    """OUR EXTENSION (extension :data:`EXT_PUBLISH`): the sender publishes the topic ``publisher``."""

    publisher: str


Event: TypeAlias = (ClientHello | ServerHello | Goodbye | Subscribe | Request | Cancel | OnSubscribe | OnNext
                    | OnComplete | OnError | OnNextPacked | OnNextPart | OnNextLastPart | Offer)


# --------------------------------------------------------------------------------------------------- varints


def _uint(value: object, what: str) -> int:
    """``value`` if it is an int the wire can carry as a varint, else ValueError."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{what} must be an integer, not {type(value).__name__}")
    if not 0 <= value <= MAX_VARINT:
        raise ValueError(f"{what} must be in 0..2**64-1, not {value}")
    return value


def _varint(value: int) -> bytes:
    """The shortest LEB128 form of a value already known to be in range."""
    if value < 0x80:
        return _SMALL_VARINTS[value]
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_varint(value: int) -> bytes:
    """``value`` (0..2**64-1) as an unsigned LEB128 varint in its shortest form."""
    return _varint(_uint(value, "a varint"))


class _Incomplete(Exception):
    """The message at the head of the buffer needs at least ``need`` bytes before it can be read."""

    def __init__(self, need: int) -> None:
        super().__init__(need)
        self.need = need


def _read_varint(data: bytes | bytearray | memoryview, pos: int, end: int) -> tuple[int, int]:
    """The varint at ``data[pos]`` and the offset after it; _Incomplete when ``end`` comes first."""
    if pos < end:
        byte = data[pos]
        if byte < 0x80:
            return byte, pos + 1
    value = 0
    shift = 0
    while True:
        if pos >= end:
            raise _Incomplete(pos + 1)
        byte = data[pos]
        pos += 1
        if shift == 63 and byte > 0x01:
            # The 10th byte holds the value's top bit; anything more is a value of 2**64 or an 11th byte.
            raise ProtocolError("over-long varint (more than 10 bytes, or a value of 2**64 or more)")
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def decode_varint(data: bytes, pos: int = 0) -> tuple[int, int]:
    """The varint at ``data[pos]``: (value, offset after it). ProtocolError if over-long or truncated."""
    if pos < 0:
        raise ValueError(f"pos must not be negative, not {pos}")
    try:
        return _read_varint(data, pos, len(data))
    except _Incomplete:
        raise ProtocolError("truncated varint") from None


# ---------------------------------------------------------------------------------------------- send helpers


def _bytes(value: object, what: str) -> bytes:
    if not isinstance(value, bytes | bytearray | memoryview):
        raise ValueError(f"{what} must be bytes, not {type(value).__name__}")
    return bytes(value)


def _string(value: object, what: str) -> bytes:
    """A str field as its length-prefixed UTF-8."""
    if not isinstance(value, str):
        raise ValueError(f"{what} must be str, not {type(value).__name__}")
    try:
        raw = value.encode("utf-8")
    except UnicodeEncodeError as error:  # lone surrogates
        raise ValueError(f"{what} is not encodable as UTF-8: {error.reason}") from None
    return _varint(len(raw)) + raw


def _extensions(value: object, what: str) -> tuple[int, ...]:
    if isinstance(value, set | frozenset):
        value = sorted(value)
    if not isinstance(value, tuple | list):
        raise ValueError(f"{what} extensions must be a tuple of ids, not {type(value).__name__}")
    if len(value) > MAX_EXTENSIONS:
        raise ValueError(f"{what} may list at most {MAX_EXTENSIONS} extensions, not {len(value)}")
    return tuple(_uint(extension, f"{what} extension id") for extension in value)


def _show(raw: bytes) -> str:
    """Bytes from the wire inside an error message: printable and short."""
    shown = raw[:64].decode("utf-8", "replace")
    return repr(shown + ("..." if len(raw) > 64 else ""))


# ---------------------------------------------------------------------------------------------- connection


class Connection:
    """One end of a connection. ``client=True`` is the side that opened it: it sends clientHello and
    expects serverHello; ``client=False`` the other way round. Otherwise the two ends are the same."""

    __slots__ = ("_buffer", "_client", "_error", "_ignoring", "_incoming_sizes", "_max_ids", "_max_message",
                 "_need", "_our_extensions", "_outgoing_sizes", "_peer_extensions", "_peer_hello",
                 "_received_goodbye", "_sent_goodbye", "_sent_hello", "_subscribed")

    def __init__(self, *, client: bool, max_message: int = 16 << 20, max_ids: int = 1 << 32) -> None:
        if isinstance(max_message, bool) or not isinstance(max_message, int) or max_message < MIN_MAX_MESSAGE:
            raise ValueError(f"max_message must be an integer of at least {MIN_MAX_MESSAGE}, "
                             f"not {max_message!r}")
        if isinstance(max_ids, bool) or not isinstance(max_ids, int) or not 1 <= max_ids <= 2**64:
            raise ValueError(f"max_ids must be an integer in 1..2**64, not {max_ids!r}")
        self._client = bool(client)
        self._max_message = max_message
        self._max_ids = max_ids
        self._buffer = bytearray()
        # The head message is known to need this many buffered bytes; until then next_event does not re-read
        # it, so a large element fed byte by byte costs linear time. Only received messages change the state
        # the head message is read with, so the figure stays right until that message is consumed.
        self._need = 0
        self._error: ProtocolError | None = None
        self._ignoring = False  # the peer's hello had a version we do not speak
        self._peer_hello = False
        self._sent_hello = False
        self._peer_extensions: frozenset[int] = frozenset()
        self._our_extensions: frozenset[int] = frozenset()
        self._sent_goodbye = False
        self._received_goodbye = False
        # Subscriptions this side made: id -> subscribes sent and not yet ended by a received
        # onComplete/onError (a count, so that an old stream's end does not close a re-subscription).
        self._subscribed: dict[int, int] = {}
        self._incoming_sizes: dict[int, int] = {}  # our subscriptions with a fixed element size
        self._outgoing_sizes: dict[int, int] = {}  # the peer's subscriptions we publish in fixed size

    @property
    def peer_extensions(self) -> frozenset[int]:
        """The extensions the peer's hello listed (empty before it, or if its version is not ours)."""
        return self._peer_extensions

    @property
    def closed(self) -> bool:
        """A goodbye was sent or received."""
        return self._sent_goodbye or self._received_goodbye

    # ------------------------------------------------------------------------------------------- receiving

    def receive_data(self, data: bytes) -> None:
        if self._received_goodbye or self._ignoring or self._error is not None:
            return
        self._buffer += data

    @property
    def buffered(self) -> int:
        """Bytes received and not yet decoded."""
        return len(self._buffer)

    def next_event(self) -> Event | None:
        """The next message as an event, or None until more data arrives. Raises ProtocolError (for good)."""
        while True:
            event = self._next_event()
            # After our goodbye, only the peer's answering goodbye matters.
            if event is None or not self._sent_goodbye or isinstance(event, Goodbye):
                return event

    def _next_event(self) -> Event | None:
        if self._received_goodbye or self._ignoring:
            return None
        if self._error is not None:
            raise self._error
        buffer = self._buffer
        if not buffer or len(buffer) < self._need:
            return None
        try:
            try:
                with memoryview(buffer) as view:
                    event, stop = self._read(view, len(view))
            except _Incomplete as short:
                if short.need > self._max_message:
                    raise self._over_limit(short.need) from None
                self._need = short.need
                return None
            if stop > self._max_message:
                raise self._over_limit(stop)
        except ProtocolError as error:
            self._error = error
            buffer.clear()
            raise
        del buffer[:stop]
        self._need = 0
        self._received(event)
        return event

    def _over_limit(self, size: int) -> ProtocolError:
        return ProtocolError(f"a message of {size} bytes or more is over the limit of {self._max_message}")

    def _span(self, pos: int, length: int, end: int, what: str) -> int:
        """The end of a ``length``-byte field at ``pos``: refused at once if the message would be too long."""
        stop = pos + length
        if stop > self._max_message:
            raise ProtocolError(f"{what} of {length} bytes makes a message of {stop} bytes, over the limit "
                                f"of {self._max_message}")
        if stop > end:
            raise _Incomplete(stop)
        return stop

    def _id(self, data: memoryview, pos: int, end: int, what: str) -> tuple[int, int]:
        value, pos = _read_varint(data, pos, end)
        if value >= self._max_ids:
            raise ProtocolError(f"{what} id {value} is not below the limit of {self._max_ids}")
        return value, pos

    def _text(self, data: memoryview, pos: int, end: int, what: str) -> tuple[str, int]:
        length, pos = _read_varint(data, pos, end)
        stop = self._span(pos, length, end, what)
        raw = bytes(data[pos:stop])
        try:
            return raw.decode("utf-8"), stop
        except UnicodeDecodeError:
            raise ProtocolError(f"{what} is not valid UTF-8: {_show(raw)}") from None

    def _blob(self, data: memoryview, pos: int, end: int, what: str) -> tuple[bytes, int]:
        length, pos = _read_varint(data, pos, end)
        stop = self._span(pos, length, end, what)
        return bytes(data[pos:stop]), stop

    def _check_kind(self, kind: int) -> None:
        """Refuse a message by its type byte alone, before any more of it is buffered."""
        if kind >= len(_NAMES):
            raise ProtocolError(f"unknown message type 0x{kind:02x}")
        if not self._peer_hello:
            expected = _SERVER_HELLO if self._client else _CLIENT_HELLO
            if kind != expected:
                raise ProtocolError(f"expected {_NAMES[expected]} first, not {_NAMES[kind]}")
        elif kind <= _SERVER_HELLO:
            raise ProtocolError(f"a second hello ({_NAMES[kind]})")
        if kind == _OFFER and EXT_PUBLISH not in self._our_extensions:
            raise ProtocolError(f"offer before our hello listed extension {EXT_PUBLISH} (publish)")

    def _read(self, data: memoryview, end: int) -> tuple[Event, int]:
        """Decode the message at the head of ``data``; the event and the offset after it."""
        kind = data[0]
        self._check_kind(kind)
        # The most frequent messages first.
        if kind == _ON_NEXT:
            subscriber, pos = self._id(data, 1, end, "onNext subscriber")
            size = self._incoming_sizes.get(subscriber)
            if size is None:
                size, pos = _read_varint(data, pos, end)
            stop = self._span(pos, size, end, "an onNext element")
            return OnNext(subscriber, bytes(data[pos:stop])), stop
        if kind == _REQUEST:
            subscriber, pos = self._id(data, 1, end, "request subscriber")
            demand, pos = _read_varint(data, pos, end)
            return Request(subscriber, demand), pos
        if kind == _ON_NEXT_PACKED:
            subscriber, pos = self._id(data, 1, end, "onNextPacked subscriber")
            size = self._incoming_sizes.get(subscriber)
            if not size:
                raise ProtocolError(f"onNextPacked for subscriber {subscriber}, whose stream has no fixed "
                                    "element size")
            count, pos = _read_varint(data, pos, end)
            stop = self._span(pos, count * size, end, f"onNextPacked of {count} elements")
            elements = tuple(bytes(data[at : at + size]) for at in range(pos, stop, size))
            return OnNextPacked(subscriber, elements), stop
        if kind in (_ON_NEXT_PART, _ON_NEXT_LAST_PART):
            name = _NAMES[kind]
            subscriber, pos = self._id(data, 1, end, f"{name} subscriber")
            element, pos = self._id(data, pos, end, f"{name} element")
            chunk, pos = self._blob(data, pos, end, f"{name} data")
            if kind == _ON_NEXT_PART:
                return OnNextPart(subscriber, element, chunk), pos
            return OnNextLastPart(subscriber, element, chunk), pos
        if kind == _ON_SUBSCRIBE:
            subscriber, pos = self._id(data, 1, end, "onSubscribe subscriber")
            size, pos = _read_varint(data, pos, end)
            if subscriber not in self._subscribed:
                raise ProtocolError(f"onSubscribe for subscriber {subscriber}, which this side never "
                                    "subscribed")
            return OnSubscribe(subscriber, size), pos
        if kind in (_ON_COMPLETE, _CANCEL):
            subscriber, pos = self._id(data, 1, end, f"{_NAMES[kind]} subscriber")
            return (OnComplete(subscriber) if kind == _ON_COMPLETE else Cancel(subscriber)), pos
        if kind == _ON_ERROR:
            subscriber, pos = self._id(data, 1, end, "onError subscriber")
            text, pos = self._text(data, pos, end, "the onError error")
            return OnError(subscriber, text), pos
        if kind == _SUBSCRIBE:
            publisher, pos = self._text(data, 1, end, "the subscribe publisher")
            subscriber, pos = self._id(data, pos, end, "subscribe subscriber")
            demand, pos = _read_varint(data, pos, end)
            return Subscribe(publisher, subscriber, demand), pos
        if kind == _OFFER:
            publisher, pos = self._text(data, 1, end, "the offer publisher")
            return Offer(publisher), pos
        if kind == _GOODBYE:
            reason, pos = self._text(data, 1, end, "the goodbye reason")
            return Goodbye(reason), pos
        # A hello: the only kind left.
        if end < 2:
            raise _Incomplete(2)
        version = data[1]
        count, pos = _read_varint(data, 2, end)
        if count > MAX_EXTENSIONS:
            raise ProtocolError(f"a hello listing {count} extensions (at most {MAX_EXTENSIONS})")
        # Each id is at least one byte: wait for that many before reading them.
        self._span(pos, count, end, f"a hello's {count} extension ids")
        extensions = []
        for _ in range(count):
            extension, pos = _read_varint(data, pos, end)
            extensions.append(extension)
        hello = ClientHello if kind == _CLIENT_HELLO else ServerHello
        return hello(version, tuple(extensions)), pos

    def _received(self, event: Event) -> None:
        """The state a received message changes."""
        if isinstance(event, OnSubscribe):
            if event.element_size:
                self._incoming_sizes[event.subscriber] = event.element_size
            else:
                self._incoming_sizes.pop(event.subscriber, None)
        elif isinstance(event, OnComplete | OnError):
            subscriber = event.subscriber
            self._incoming_sizes.pop(subscriber, None)
            count = self._subscribed.get(subscriber)
            if count is not None:
                if count > 1:
                    self._subscribed[subscriber] = count - 1
                else:
                    del self._subscribed[subscriber]
        elif isinstance(event, ClientHello | ServerHello):
            self._peer_hello = True
            if event.version == VERSION:
                self._peer_extensions = frozenset(event.extensions)
            else:
                self._ignoring = True
                self._buffer.clear()
        elif isinstance(event, Goodbye):
            self._received_goodbye = True
            self._buffer.clear()
            # Goodbye ends every stream.
            self._subscribed.clear()
            self._incoming_sizes.clear()
            self._outgoing_sizes.clear()

    # --------------------------------------------------------------------------------------------- sending

    def send(self, event: Event) -> bytes:
        """The bytes of ``event``. ValueError when the state does not allow it or a field cannot be sent."""
        if self._sent_goodbye and not isinstance(event, Goodbye):
            raise ValueError(f"cannot send {type(event).__name__} after our goodbye")
        if not self._sent_hello and not isinstance(event, ClientHello | ServerHello | Goodbye):
            raise ValueError(f"cannot send {type(event).__name__} before our hello")
        if isinstance(event, OnNext):
            subscriber = _uint(event.subscriber, "onNext subscriber")
            element = _bytes(event.element, "onNext element")
            size = self._outgoing_sizes.get(subscriber)
            if size is None:
                return b"".join((b"\x07", _varint(subscriber), _varint(len(element)), element))
            if len(element) != size:
                raise ValueError(f"onNext element of {len(element)} bytes on subscriber {subscriber}, whose "
                                 f"elements are {size} bytes")
            return b"".join((b"\x07", _varint(subscriber), element))
        if isinstance(event, Request):
            subscriber = _uint(event.subscriber, "request subscriber")
            return b"".join((b"\x04", _varint(subscriber), _varint(_uint(event.demand, "request demand"))))
        if isinstance(event, OnNextPacked):
            return self._packed(event)
        if isinstance(event, OnNextPart | OnNextLastPart):
            name = "onNextPart" if isinstance(event, OnNextPart) else "onNextLastPart"
            subscriber = _uint(event.subscriber, f"{name} subscriber")
            element = _uint(event.element, f"{name} element")
            chunk = _bytes(event.data, f"{name} data")
            kind = _TYPE_BYTES[_ON_NEXT_PART if name == "onNextPart" else _ON_NEXT_LAST_PART]
            return b"".join((kind, _varint(subscriber), _varint(element), _varint(len(chunk)), chunk))
        if isinstance(event, OnSubscribe):
            subscriber = _uint(event.subscriber, "onSubscribe subscriber")
            size = _uint(event.element_size, "onSubscribe element_size")
            if size:
                self._outgoing_sizes[subscriber] = size
            else:
                self._outgoing_sizes.pop(subscriber, None)
            return b"\x06" + _varint(subscriber) + _varint(size)
        if isinstance(event, OnComplete):
            subscriber = _uint(event.subscriber, "onComplete subscriber")
            self._outgoing_sizes.pop(subscriber, None)
            return b"\x08" + _varint(subscriber)
        if isinstance(event, OnError):
            subscriber = _uint(event.subscriber, "onError subscriber")
            wire = b"\x09" + _varint(subscriber) + _string(event.error, "onError error")
            self._outgoing_sizes.pop(subscriber, None)
            return wire
        if isinstance(event, Cancel):
            return b"\x05" + _varint(_uint(event.subscriber, "cancel subscriber"))
        if isinstance(event, Subscribe):
            publisher = _string(event.publisher, "subscribe publisher")
            subscriber = _uint(event.subscriber, "subscribe subscriber")
            demand = _uint(event.initial_demand, "subscribe initial_demand")
            self._subscribed[subscriber] = self._subscribed.get(subscriber, 0) + 1
            return b"".join((b"\x03", publisher, _varint(subscriber), _varint(demand)))
        if isinstance(event, Offer):
            if EXT_PUBLISH not in self._peer_extensions:
                raise ValueError(f"cannot send offer: the peer's hello did not list extension {EXT_PUBLISH} "
                                 "(publish)")
            return b"\x0d" + _string(event.publisher, "offer publisher")
        if isinstance(event, Goodbye):
            wire = b"\x02" + _string(event.reason, "goodbye reason")
            # What the peer sent before it reads our goodbye is still read (for its goodbye), with the
            # element sizes it was sent with; only our own streams end here.
            self._sent_goodbye = True
            self._outgoing_sizes.clear()
            return wire
        if isinstance(event, ClientHello | ServerHello):
            return self._hello(event)
        raise TypeError(f"not a reactive-streams event: {event!r}")

    def _packed(self, event: OnNextPacked) -> bytes:
        subscriber = _uint(event.subscriber, "onNextPacked subscriber")
        size = self._outgoing_sizes.get(subscriber)
        if not size:
            raise ValueError(f"onNextPacked on subscriber {subscriber}, whose stream has no fixed element "
                             "size")
        if not isinstance(event.elements, tuple | list):
            raise ValueError(f"onNextPacked elements must be a tuple, not {type(event.elements).__name__}")
        parts = [b"\x0a", _varint(subscriber), _varint(len(event.elements))]
        for element in event.elements:
            raw = _bytes(element, "onNextPacked element")
            if len(raw) != size:
                raise ValueError(f"onNextPacked element of {len(raw)} bytes on subscriber {subscriber}, "
                                 f"whose elements are {size} bytes")
            parts.append(raw)
        return b"".join(parts)

    def _hello(self, event: ClientHello | ServerHello) -> bytes:
        name = type(event).__name__
        if isinstance(event, ClientHello) != self._client:
            side = "client" if self._client else "server"
            raise ValueError(f"a {side} does not send {name}")
        if self._sent_hello:
            raise ValueError(f"{name} was already sent")
        version = event.version
        if isinstance(version, bool) or not isinstance(version, int) or not 0 <= version <= 0xFF:
            raise ValueError(f"{name} version must be a byte (0..255), not {version!r}")
        extensions = _extensions(event.extensions, name)
        self._sent_hello = True
        self._our_extensions = frozenset(extensions)
        kind = _TYPE_BYTES[_CLIENT_HELLO if self._client else _SERVER_HELLO]
        return b"".join((kind, bytes((version,)), _varint(len(extensions)), *map(_varint, extensions)))


# ---------------------------------------------------------------------------------------------------- demand


class Demand:
    """Outstanding demand of one stream, as the Reactive Streams rules count it: requests add up, a total of
    :data:`UNBOUNDED` (2**63-1) or more is unbounded for good, and every element delivered takes one."""

    __slots__ = ("_outstanding",)

    def __init__(self, initial: int = 0) -> None:
        if isinstance(initial, bool) or not isinstance(initial, int) or initial < 0:
            raise ValueError(f"initial demand must be a non-negative integer, not {initial!r}")
        self._outstanding = min(initial, UNBOUNDED)

    def add(self, n: int) -> None:
        """A request(n). n < 1 breaks rule 3.9: ValueError, which the shell answers with onError."""
        if isinstance(n, bool) or not isinstance(n, int):
            raise ValueError(f"request demand must be an integer, not {type(n).__name__}")
        if n < 1:
            raise ValueError(f"request({n}) is not allowed: demand must be at least 1 "
                             "(Reactive Streams rule 3.9)")
        self._outstanding = min(self._outstanding + n, UNBOUNDED)

    @property
    def unbounded(self) -> bool:
        return self._outstanding >= UNBOUNDED

    @property
    def outstanding(self) -> int:
        """How many elements may still be sent; UNBOUNDED when unbounded."""
        return self._outstanding

    def take(self, n: int = 1) -> int:
        """Use up to ``n`` units; how many were allowed (0 if none). Unbounded demand never runs down."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"take needs a non-negative integer, not {n!r}")
        if self._outstanding >= UNBOUNDED:
            return n
        allowed = min(n, self._outstanding)
        self._outstanding -= allowed
        return allowed

    def __repr__(self) -> str:
        return f"Demand({'unbounded' if self.unbounded else self._outstanding})"


# ------------------------------------------------------------------------------------------- split elements


class Reassembler:
    """Joins onNextPart... onNextLastPart per (subscriber, element id), in the order the parts arrive.

    One per connection: ``max_pending`` counts the elements open at once across all its streams, and
    ``max_element`` bounds one joined element. An element id may be used again once its last part is in.
    """

    __slots__ = ("_max_element", "_max_pending", "_open")

    def __init__(self, *, max_element: int = 16 << 20, max_pending: int = 64) -> None:
        if isinstance(max_element, bool) or not isinstance(max_element, int) or max_element < 1:
            raise ValueError(f"max_element must be a positive integer, not {max_element!r}")
        if isinstance(max_pending, bool) or not isinstance(max_pending, int) or max_pending < 1:
            raise ValueError(f"max_pending must be a positive integer, not {max_pending!r}")
        self._max_element = max_element
        self._max_pending = max_pending
        self._open: dict[tuple[int, int], bytearray] = {}

    def _too_big(self, subscriber: int, element: int, size: int) -> ProtocolError:
        return ProtocolError(f"element {element} of subscriber {subscriber} grows to {size} bytes, over the "
                             f"limit of {self._max_element}")

    def part(self, subscriber: int, element: int, data: bytes) -> None:
        """An onNextPart: keep ``data`` until the element's last part."""
        key = (subscriber, element)
        joined = self._open.get(key)
        if joined is None:
            if len(self._open) >= self._max_pending:
                raise ProtocolError(f"more than {self._max_pending} split elements open at once")
            joined = self._open[key] = bytearray()
        size = len(joined) + len(data)
        if size > self._max_element:
            del self._open[key]  # the shell closes the connection; the parts so far are no use
            raise self._too_big(subscriber, element, size)
        joined += data

    def last(self, subscriber: int, element: int, data: bytes) -> bytes:
        """An onNextLastPart: the whole element (just ``data`` when no part came before it)."""
        joined = self._open.pop((subscriber, element), None)
        size = len(data) if joined is None else len(joined) + len(data)
        if size > self._max_element:
            raise self._too_big(subscriber, element, size)
        if joined is None:
            return bytes(data)
        joined += data
        return bytes(joined)

    def drop(self, subscriber: int) -> None:
        """Forget a stream's open elements (it was cancelled, completed or failed)."""
        for key in [key for key in self._open if key[0] == subscriber]:
            del self._open[key]

    @property
    def pending(self) -> int:
        """How many elements are open."""
        return len(self._open)

    @property
    def held(self) -> int:
        """Bytes of the elements open (at most ``max_pending`` of them: a short sum)."""
        return sum(map(len, self._open.values()))


def split(element: bytes, part_size: int) -> list[bytes]:
    """The chunks of ``element`` a publisher sends: all but the last as onNextPart, the last as
    onNextLastPart. Each is at most ``part_size`` bytes; an empty element is one empty chunk."""
    if isinstance(part_size, bool) or not isinstance(part_size, int) or part_size < 1:
        raise ValueError(f"part_size must be a positive integer, not {part_size!r}")
    element = bytes(element)
    if not element:
        return [b""]
    return [element[at : at + part_size] for at in range(0, len(element), part_size)]
