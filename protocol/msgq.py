"""The msgq binary dialect ("Skan" TLV) as a sans-IO codec: items, messages, stream framing and the routing
messages.

Wire facts (the 2009 routing daemon's format, with the seed's wrong worked example corrected; all integers
big-endian):

* Stream: ``u32 length`` (excluding itself) + message.
* Message: ``u32 0x536b616e`` ("Skan") + the top-level HASH *body*, with no type/length header: tag/item
  pairs run to the end of the message.
* Item: TyLen byte + length + data. Type = ``TyLen & 0x0f``: 0x01 DATA (bytes), 0x02 HASH (ordered tag ->
  item), 0x03 LIST, 0x04 NULL. Length code = ``TyLen & 0x30``: 0x20 a 1-byte length, 0x10 a 2-byte length,
  0x00 a 4-byte length, 0x30 invalid. NULL is exactly the one byte 0x04, with no length bytes.
* HASH entry: ``u8`` tag length (1..255) + tag + item.
* Encoders use the smallest length form; decoders accept any valid form. Integers travel as decimal strings
  in DATA.

In Python an item is ``bytes`` (DATA), ``dict[bytes, Item]`` (HASH, in wire order), ``list[Item]`` (LIST) or
``None`` (NULL). :func:`encode_item`/:func:`decode_item` handle one item, :func:`encode_message`/
:func:`decode_message` one message without the stream length, :func:`to_event`/:func:`from_event` map a
message's fields to the typed routing events, and :class:`Connection` does the stream framing for either
side (it is symmetric).

Readings that are our choice, not the original daemon's:

* A TyLen byte with any of the high bits 0xc0 set is refused: no item type uses them, so they can only be
  corruption or a dialect we do not speak. So is a NULL byte carrying a length code (0x14, 0x24, 0x34).
* A tag that appears twice in one HASH is refused, not "last wins": the router checks ``from`` and forwards
  the message, and two readers picking different copies of a duplicated field is how such checks are fooled.
* Nesting deeper than :data:`MAX_DEPTH` containers is refused (the top-level body counts as one), so hostile
  input cannot reach Python's recursion limit. The encoder applies the same limit, so whatever it writes
  decodes, and a list that contains itself fails cleanly instead of recursing forever.
* ``send`` without ``seq`` decodes with ``seq = b""``, and the encoder always writes ``seq``; ``repl`` is
  optional and written only when set.
* The stats reply is written ``{type: stats, stats: <hash>}``: the spec's ``{stats: <hash>}`` plus the type,
  the same shape as the getlname reply. A message with ``stats`` but no ``type`` also decodes as
  :class:`StatsReply`, so a peer writing the spec's exact shape is understood. Any other message without a
  ``type`` field is refused.
* A ``getlname`` carrying ``lname`` is the reply (:class:`LnameReply`); a ``stats`` carrying ``stats`` is the
  reply (:class:`StatsReply`).
* Fields a subscribe or send carries beyond the modelled ones are kept in ``extra`` and written back, so
  nothing is lost when the router forwards a message (an ``extra`` repeating a modelled tag is refused on
  encoding). On getlname, stats and unsubscribe they are ignored.
* :class:`Connection` refuses a length over ``max_message`` (default 64 KiB, the spec's cap) or under 4 as
  soon as the 4 length bytes are in; that error is final (the stream has lost its framing) and later input
  is discarded rather than buffered. A well-framed message whose content is bad raises once and is dropped;
  the next message decodes normally. The cap applies to what is received, not to what :meth:`Connection.send`
  writes: the peer's cap may differ.

Malformed input raises :class:`ProtocolError`. Encoding raises ``TypeError`` for Python values that are not
items or events, and :class:`ProtocolError` for values the wire cannot carry (an empty or over-long tag, a
bad subtype, a length over 32 bits, nesting over the limit).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Final, TypeAlias

from protocol.errors import ProtocolError

MAGIC: Final = 0x536B616E  # "Skan"
DEFAULT_MAX_MESSAGE: Final = 64 * 1024  # the spec's default cap on one message (magic included)
#: Containers nested deeper than this are refused both ways; real routing messages nest two or three deep.
MAX_DEPTH: Final = 64

Item: TypeAlias = bytes | dict[bytes, "Item"] | list["Item"] | None  # DATA, HASH, LIST, NULL

# TyLen: the low nibble is the item type, bits 0x30 the length code, bits 0xc0 unused.
DATA: Final = 0x01
HASH: Final = 0x02
LIST: Final = 0x03
NULL: Final = 0x04
_TYPE_MASK = 0x0F
_LENGTH_MASK = 0x30
_HIGH_BITS = 0xC0
_LENGTH_1 = 0x20
_LENGTH_2 = 0x10
_LENGTH_4 = 0x00
_LENGTH_INVALID = 0x30
_SHORT_DATA = DATA | _LENGTH_1
_TYPE_NAMES = {DATA: "DATA", HASH: "HASH", LIST: "LIST"}

_MAGIC_BYTES = struct.pack(">I", MAGIC)
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U32_MAX = 0xFFFFFFFF
_TAG_MAX = 0xFF  # the tag length is a u8

# Wire tags of the routing messages.
TYPE = b"type"
GROUP = b"group"
INSTANCE = b"instance"
SUBTYPE = b"subtype"
FROM = b"from"
TO = b"to"
SEQ = b"seq"
MSG = b"msg"
REPL = b"repl"
LNAME = b"lname"
STATS = b"stats"

WILDCARD = b"*"  # instance "any" in subscribe/unsubscribe, and "everyone" in send's ``to``
SUBTYPES: Final = ("normal", "meonly", "promisc")


# ----------------------------------------------------------------------------------------------- items


def _text(raw: bytes) -> str:
    """Bytes from the wire shown inside an error message: printable, short, never raising."""
    shown = raw[:64].decode("utf-8", "replace")
    return shown + ("..." if len(raw) > 64 else "")


def _header(kind: int, size: int) -> bytes:
    """TyLen + length in the smallest form that holds ``size``."""
    if size <= 0xFF:
        return bytes((kind | _LENGTH_1, size))
    if size <= 0xFFFF:
        return bytes((kind | _LENGTH_2,)) + _U16.pack(size)
    if size <= _U32_MAX:
        return bytes((kind | _LENGTH_4,)) + _U32.pack(size)
    raise ProtocolError(f"an item of {size} bytes does not fit a 32-bit length")


def _encode_entries(fields: dict[bytes, Item], out: list[bytes], depth: int) -> None:
    for tag, value in fields.items():
        if type(tag) is not bytes:
            raise TypeError(f"HASH tags must be bytes, not {type(tag).__name__} {tag!r}")
        if not 1 <= len(tag) <= _TAG_MAX:
            raise ProtocolError(f"a HASH tag must be 1 to 255 bytes long, not {len(tag)}")
        out.append(bytes((len(tag),)))
        out.append(tag)
        _encode(value, out, depth)


def _encode(item: Item, out: list[bytes], depth: int) -> None:
    """Append ``item``'s encoding to ``out``; ``depth`` counts the containers around it."""
    if item is None:
        out.append(b"\x04")
    elif isinstance(item, bytes | bytearray):
        out.append(_header(DATA, len(item)))
        out.append(bytes(item))
    elif isinstance(item, dict | list):
        if depth >= MAX_DEPTH:
            raise ProtocolError(f"items nested deeper than {MAX_DEPTH} containers")
        inner: list[bytes] = []
        if isinstance(item, dict):
            kind = HASH
            _encode_entries(item, inner, depth + 1)
        else:
            kind = LIST
            for element in item:
                _encode(element, inner, depth + 1)
        body = b"".join(inner)
        out.append(_header(kind, len(body)))
        out.append(body)
    else:
        hint = " (integers travel as decimal strings: b'%d' % n)" if isinstance(item, int) else ""
        raise TypeError(f"a msgq item is bytes, dict, list or None, not {type(item).__name__}{hint}")


def encode_item(item: Item) -> bytes:
    """One item with its TyLen header, every length in its smallest form."""
    out: list[bytes] = []
    _encode(item, out, 0)
    return b"".join(out)


def _read_item(data: bytes, pos: int, end: int, depth: int, where: str) -> tuple[Item, int]:
    """Decode the item at ``data[pos]`` that must end by ``end``; return it and the offset after it."""
    if pos >= end:
        raise ProtocolError(f"the {where} ends where an item should start")
    tylen = data[pos]
    pos += 1
    if tylen & _HIGH_BITS:
        raise ProtocolError(f"item header 0x{tylen:02x} sets the unused high bits 0xc0")
    kind = tylen & _TYPE_MASK
    if kind == NULL:
        if tylen != NULL:
            raise ProtocolError(f"NULL must be the single byte 0x04, not 0x{tylen:02x}")
        return None, pos
    name = _TYPE_NAMES.get(kind)
    if name is None:
        raise ProtocolError(f"unknown item type 0x{kind:02x} (in header 0x{tylen:02x})")
    code = tylen & _LENGTH_MASK
    if code == _LENGTH_INVALID:
        raise ProtocolError(f"item header 0x{tylen:02x} has the invalid length code 0x30")
    width = 1 if code == _LENGTH_1 else 2 if code == _LENGTH_2 else 4
    if pos + width > end:
        raise ProtocolError(f"the {where} ends inside the {width}-byte length of a {name} item")
    if width == 1:
        size = data[pos]
    elif width == 2:
        (size,) = _U16.unpack_from(data, pos)
    else:
        (size,) = _U32.unpack_from(data, pos)
    pos += width
    stop = pos + size
    if stop > end:
        raise ProtocolError(
            f"a {name} item of {size} bytes runs past the end of its {where} ({end - pos} bytes left)"
        )
    if kind == DATA:
        return data[pos:stop], stop
    if depth >= MAX_DEPTH:
        raise ProtocolError(f"items nested deeper than {MAX_DEPTH} containers")
    if kind == HASH:
        return _read_entries(data, pos, stop, depth + 1, "HASH"), stop
    items: list[Item] = []
    while pos < stop:
        item, pos = _read_item(data, pos, stop, depth + 1, "LIST")
        items.append(item)
    return items, stop


def _read_entries(data: bytes, pos: int, end: int, depth: int, where: str) -> dict[bytes, Item]:
    """Decode tag/item pairs from ``pos`` up to exactly ``end``."""
    fields: dict[bytes, Item] = {}
    while pos < end:
        size = data[pos]
        pos += 1
        if size == 0:
            raise ProtocolError(f"a zero-length tag in a {where}")
        if pos + size > end:
            raise ProtocolError(
                f"a tag of {size} bytes runs past the end of its {where} ({end - pos} bytes left)"
            )
        tag = data[pos : pos + size]
        pos += size
        if tag in fields:
            raise ProtocolError(f"tag {_text(tag)!r} appears twice in one {where}")
        if pos >= end:
            raise ProtocolError(f"tag {_text(tag)!r} has no item: the {where} ends after it")
        if data[pos] == _SHORT_DATA and pos + 1 < end and pos + 2 + data[pos + 1] <= end:
            # The common field, short DATA, read inline: routing messages are mostly that.
            stop = pos + 2 + data[pos + 1]
            fields[tag] = data[pos + 2 : stop]
            pos = stop
            continue
        fields[tag], pos = _read_item(data, pos, end, depth, where)
    return fields


def decode_item(data: bytes) -> Item:
    """Exactly one item: missing bytes or bytes after it raise ProtocolError."""
    data = bytes(data)
    if not data:
        raise ProtocolError("no item: the input is empty")
    item, pos = _read_item(data, 0, len(data), 0, "input")
    if pos != len(data):
        raise ProtocolError(f"{len(data) - pos} trailing bytes after the item")
    return item


# -------------------------------------------------------------------------------------------- messages


def encode_message(fields: dict[bytes, Item]) -> bytes:
    """Magic + the top-level HASH body; the stream's u32 length is :meth:`Connection.send`'s job."""
    if not isinstance(fields, dict):
        raise TypeError(f"a msgq message is a dict of fields, not {type(fields).__name__}")
    out: list[bytes] = [_MAGIC_BYTES]
    _encode_entries(fields, out, 1)
    return b"".join(out)


def decode_message(data: bytes) -> dict[bytes, Item]:
    """The inverse of :func:`encode_message`: a message without its stream length."""
    data = bytes(data)
    if len(data) < len(_MAGIC_BYTES):
        raise ProtocolError(f"a message of {len(data)} bytes is too short for the 4-byte magic")
    if data[:4] != _MAGIC_BYTES:
        (magic,) = _U32.unpack_from(data)
        raise ProtocolError(f"bad magic 0x{magic:08x} (expected 0x{MAGIC:08x}, 'Skan')")
    return _read_entries(data, 4, len(data), 1, "message")


def _data_field(tag: bytes, value: bytes) -> bytes:
    size = len(value)
    if size <= 0xFF:
        return b"%c%s%c%c%s" % (len(tag), tag, _SHORT_DATA, size, value)
    return bytes((len(tag),)) + tag + _header(DATA, size) + value


_SEND_TYPE = _data_field(b"type", b"send")


def send_frame(sender: bytes, to: bytes, group: bytes, instance: bytes, seq: bytes, msg: Item,
               repl: bytes | None, extra: dict[bytes, Item]) -> bytes:
    """The stream bytes of a send (``u32 length`` included) without building an event: the broker's
    delivery path, once per message per subscriber. Equal to ``Connection().send(Send(...))`` for the same
    fields; the caller guarantees DATA routing fields, tags of 1..255 bytes, and no ``extra`` repeating a
    modelled tag."""
    parts = [_MAGIC_BYTES, _SEND_TYPE, _data_field(FROM, sender), _data_field(TO, to),
             _data_field(GROUP, group), _data_field(INSTANCE, instance), _data_field(SEQ, seq)]
    if type(msg) is bytes:
        parts.append(_data_field(MSG, msg))
    else:
        parts.append(b"\x03msg" + encode_item(msg))
    if repl is not None:
        parts.append(_data_field(REPL, repl))
    for tag, value in extra.items():
        parts.append(_data_field(tag, value) if type(value) is bytes
                     else bytes((len(tag),)) + tag + encode_item(value))
    body = b"".join(parts)
    return _U32.pack(len(body)) + body


# ------------------------------------------------------------------------------------------------ events


@dataclass(frozen=True, slots=True)
class GetLname:
    """Ask the router for this connection's local name (a client must do it first)."""


@dataclass(frozen=True, slots=True)
class LnameReply:
    """The router's answer to getlname."""

    lname: bytes


@dataclass(frozen=True, slots=True)
class Subscribe:
    group: bytes
    instance: bytes = WILDCARD
    subtype: str = "normal"  # one of SUBTYPES
    extra: dict[bytes, Item] = field(default_factory=dict)  # fields we do not model, kept for the wire


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    group: bytes
    instance: bytes = WILDCARD


@dataclass(frozen=True, slots=True)
class Send:
    sender: bytes  # wire tag "from"
    to: bytes  # "*" or one connection's lname
    group: bytes
    instance: bytes
    seq: bytes  # b"" when the wire had none
    msg: Item  # opaque to the router
    repl: bytes | None = None
    extra: dict[bytes, Item] = field(default_factory=dict)  # fields we do not model, kept for the wire


@dataclass(frozen=True, slots=True)
class Stats:
    """Ask the router for its counters."""


@dataclass(frozen=True, slots=True)
class StatsReply:
    counters: dict[bytes, Item]


@dataclass(frozen=True, slots=True)
class Unknown:
    """A well-formed message whose type the router does not know; the shell decides what to do with it."""

    fields: dict[bytes, Item]


Event: TypeAlias = GetLname | LnameReply | Subscribe | Unsubscribe | Send | Stats | StatsReply | Unknown

_SUBSCRIBE_FIELDS = frozenset({TYPE, GROUP, INSTANCE, SUBTYPE})
_SEND_FIELDS = frozenset({TYPE, FROM, TO, GROUP, INSTANCE, SEQ, MSG, REPL})
_MISSING = object()


def _data(fields: dict[bytes, Item], tag: bytes, what: str, default: object = _MISSING) -> bytes:
    """Field ``tag`` as DATA; absent means ``default``, or an error when there is none."""
    value = fields.get(tag, _MISSING)
    if value is _MISSING:
        if default is _MISSING:
            raise ProtocolError(f"{what} needs the field {tag.decode()!r}")
        return default  # type: ignore[return-value]
    if type(value) is not bytes:
        raise ProtocolError(f"{what} field {tag.decode()!r} must be DATA, not {_kind(value)}")
    return value


def _kind(value: Item) -> str:
    """The wire type name of a decoded item, for error messages."""
    if value is None:
        return "NULL"
    return "DATA" if isinstance(value, bytes) else "HASH" if isinstance(value, dict) else "LIST"


def _extra(fields: dict[bytes, Item], modelled: frozenset[bytes]) -> dict[bytes, Item]:
    return {tag: value for tag, value in fields.items() if tag not in modelled}


def to_event(fields: dict[bytes, Item]) -> Event:
    """A decoded message's fields as a typed event; a missing or mistyped required field raises."""
    # The spec's stats reply, {stats: <hash>}, has no type.
    kind = b"stats" if TYPE not in fields and STATS in fields else _data(fields, TYPE, "a message")
    if kind == b"send":
        if MSG not in fields:
            raise ProtocolError("send needs the field 'msg'")
        return Send(
            _data(fields, FROM, "send"),
            _data(fields, TO, "send"),
            _data(fields, GROUP, "send"),
            _data(fields, INSTANCE, "send"),
            _data(fields, SEQ, "send", b""),
            fields[MSG],
            _data(fields, REPL, "send", None),
            _extra(fields, _SEND_FIELDS),
        )
    if kind == b"subscribe":
        raw = _data(fields, SUBTYPE, "subscribe", b"normal")
        subtype = raw.decode("ascii", "replace")
        if subtype not in SUBTYPES:
            raise ProtocolError(f"subscribe subtype must be normal, meonly or promisc, not {_text(raw)!r}")
        return Subscribe(
            _data(fields, GROUP, "subscribe"),
            _data(fields, INSTANCE, "subscribe", WILDCARD),
            subtype,
            _extra(fields, _SUBSCRIBE_FIELDS),
        )
    if kind == b"unsubscribe":
        instance = _data(fields, INSTANCE, "unsubscribe", WILDCARD)
        return Unsubscribe(_data(fields, GROUP, "unsubscribe"), instance)
    if kind == b"getlname":
        if LNAME in fields:
            return LnameReply(_data(fields, LNAME, "getlname"))
        return GetLname()
    if kind == b"stats":
        if STATS in fields:
            counters = fields[STATS]
            if not isinstance(counters, dict):
                raise ProtocolError(f"stats field 'stats' must be a HASH, not {_kind(counters)}")
            return StatsReply(counters)
        return Stats()
    return Unknown(fields)


def _with_extra(fields: dict[bytes, Item], extra: dict[bytes, Item], modelled: frozenset[bytes]) -> None:
    clash = modelled.intersection(extra)
    if clash:
        names = ", ".join(sorted(tag.decode("utf-8", "replace") for tag in clash))
        raise ProtocolError(f"extra repeats modelled fields: {names}")
    fields.update(extra)


def from_event(event: Event) -> dict[bytes, Item]:
    """The inverse of :func:`to_event`: the fields of the message that carries ``event``."""
    match event:
        case Send(sender, to, group, instance, seq, msg, repl, extra):
            fields: dict[bytes, Item] = {
                TYPE: b"send", FROM: sender, TO: to, GROUP: group, INSTANCE: instance, SEQ: seq, MSG: msg
            }
            if repl is not None:
                fields[REPL] = repl
            _with_extra(fields, extra, _SEND_FIELDS)
            return fields
        case Subscribe(group, instance, subtype, extra):
            if subtype not in SUBTYPES:
                raise ProtocolError(f"subscribe subtype must be normal, meonly or promisc, not {subtype!r}")
            fields = {TYPE: b"subscribe", GROUP: group, INSTANCE: instance, SUBTYPE: subtype.encode()}
            _with_extra(fields, extra, _SUBSCRIBE_FIELDS)
            return fields
        case Unsubscribe(group, instance):
            return {TYPE: b"unsubscribe", GROUP: group, INSTANCE: instance}
        case GetLname():
            return {TYPE: b"getlname"}
        case LnameReply(lname):
            return {TYPE: b"getlname", LNAME: lname}
        case Stats():
            return {TYPE: b"stats"}
        case StatsReply(counters):
            return {TYPE: b"stats", STATS: counters}
        case Unknown(fields):
            return dict(fields)
        case _:
            raise TypeError(f"not a msgq event: {event!r}")


# --------------------------------------------------------------------------------------------- framing


class Connection:
    """Stream framing for either end: bytes in through :meth:`receive_data`, events out of
    :meth:`next_event`, events back to bytes through :meth:`send`."""

    __slots__ = ("_broken", "_buffer", "_max_message")

    def __init__(self, *, max_message: int = DEFAULT_MAX_MESSAGE) -> None:
        if max_message < len(_MAGIC_BYTES):
            raise ValueError(f"max_message must be at least 4 (the magic), not {max_message}")
        self._max_message = max_message
        self._buffer = bytearray()
        self._broken: ProtocolError | None = None

    def receive_data(self, data: bytes) -> None:
        if self._broken is None:
            self._buffer += data

    @property
    def buffered(self) -> int:
        """Bytes received and not yet decoded."""
        return len(self._buffer)

    def next_event(self) -> Event | None:
        """The next complete message as an event, or None until more data arrives."""
        if self._broken is not None:
            raise self._broken
        buffer = self._buffer
        if len(buffer) < 4:
            return None
        (size,) = _U32.unpack_from(buffer)
        if size > self._max_message or size < len(_MAGIC_BYTES):
            if size < len(_MAGIC_BYTES):
                text = f"a message of {size} bytes is too short for the 4-byte magic"
            else:
                text = f"a message of {size} bytes is over the limit of {self._max_message}"
            self._broken = ProtocolError(text)
            buffer.clear()
            raise self._broken
        if len(buffer) < 4 + size:
            return None
        body = bytes(buffer[4 : 4 + size])
        del buffer[: 4 + size]
        return to_event(decode_message(body))

    def send(self, event: Event) -> bytes:
        """The stream bytes for ``event``: u32 length + message."""
        body = encode_message(from_event(event))
        if len(body) > _U32_MAX:
            raise ProtocolError(f"a message of {len(body)} bytes does not fit the 32-bit stream length")
        return _U32.pack(len(body)) + body
