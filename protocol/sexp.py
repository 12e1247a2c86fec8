"""The sexp dialect (the "omq" design notes, protocol one) as a sans-IO codec for both ends of a connection.

Wire format. The client opens with its version as a raw signed big-endian int64; the server answers the same
number (accepted) or -1 (refused; both sides close). After that the client sends one s-expression per message
in OCaml sexplib's syntax, each followed by ``\\n``; the server sends binary frames
``u32 length (type byte + payload) | u8 type | payload``. :class:`ServerConnection` is the broker's side and
:class:`ClientConnection` the client's; bytes go in with ``receive_data``, events come out of ``next_event``,
and ``send`` turns an event into the bytes to write.

The reader and writer here are our own, over bytes. The ``sexpdata`` package is a Lisp reader: it turns atoms
into booleans, numbers, brackets and quotes and does not decode OCaml escapes (``\\DDD``, ``\\xHH``), so it
cannot read or write sexplib's grammar faithfully, and it works on str rather than bytes.

What is spec and what is ours:

* Client messages are the ppx_sexp_conv forms of the OCaml ``Client.t`` variant: ``(Connect 1 my-client)``,
  ``(Subscribe orders From_beginning)``, ``(Subscribe orders (From_message 42))``,
  ``(Subscribe orders From_current)``, ``(Unsubscribe orders)``, ``(Ack <time>)``. As with ppx_sexp_conv,
  a constructor's first letter may be lowercase. ``(Publish <topic> <body>)`` is OUR EXTENSION: the spec has
  no publish message.
* ``Ack`` echoes a Ping's time: a decimal integer, a decimal fraction, or an OCaml ``(date time)`` pair.
* Subscribed and Unsubscribed carry the machine-form sexp of the topic record, ``((id 3) (topic orders))``.
* We write single spaces between list elements (the form of the spec's examples); sexplib's own machine
  printer omits the space next to a parenthesis or a quoted atom (``((id 3)(topic orders))``). Both read
  the same, and we read both.
* Not supported (our choice; such a line is Invalid): block comments ``#| ... |#``, s-expression comments
  ``#;``, lists nested deeper than 256 levels, and more than 64 atoms and lists in one client message.
  Line comments (``;`` to the end of the line) are allowed; a line holding only whitespace and comments is
  skipped like a blank line.
* A client line is the bytes before ``\\n`` (one trailing ``\\r`` is tolerated) and may be at most
  ``max_line`` bytes long, ``\\r`` included; a longer one is dropped unread and reported once as Invalid.

Receive-side protocol violations raise :class:`ProtocolError`, except that a bad client line never does: the
server yields :class:`Invalid` for it and the connection stays usable. A caller misusing ``send`` (an event
the state does not allow, a value out of range) gets ``ValueError``. The order of messages (Connect first, an
Ack per Ping) is not checked here: the gateway using this codec owns those rules.
"""

from __future__ import annotations

import math
import re
import struct
from collections import deque
from dataclasses import dataclass
from decimal import Decimal
from itertools import repeat
from typing import TypeAlias

from protocol import ocaml_escapes
from protocol.errors import ProtocolError

#: The only protocol version we speak.
VERSION_ONE = 1
#: The server's answer to a version it does not speak.
REFUSED = -1

#: Replay modes, the same strings the engine uses (a message id, an int, is the third form).
REPLAY_BEGINNING = "beginning"
REPLAY_CURRENT = "current"

#: An s-expression: an atom is bytes, a list is a Python list.
Sexp: TypeAlias = bytes | list["Sexp"]

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1
_U32_MAX = 2**32 - 1
_U64_MAX = 2**64 - 1

_INT64 = struct.Struct(">q")
_FRAME_HEADER = struct.Struct(">IB")
_MESSAGE_HEADER = struct.Struct(">IBQI")
_MESSAGE_FIXED = struct.Struct(">QI")
_U32 = struct.Struct(">I")

# Frame types, server -> client.
_ERROR, _PING, _MESSAGE, _SUBSCRIBED, _UNSUBSCRIBED = range(5)

#: Bytes of one client line read per step of ``ServerConnection.next_event``: a few milliseconds of decoding
#: even when every byte is an escape, so a long line is read over several turns of the caller's loop.
SLICE_BYTES = 64 << 10

# Deep nesting is refused so that no caller (nor Python's own recursive list comparison and repr) ever
# recurses that far; the messages of this protocol nest three levels at most.
_MAX_DEPTH = 256
# A client message has at most six atoms and lists; the cap keeps a line of a million "()" from becoming a
# million Python lists before it is refused.
_MAX_MESSAGE_NODES = 64


# ---------------------------------------------------------------------------------------------------- events


@dataclass(frozen=True, slots=True)
class Version:
    """The client's handshake: a signed int64."""

    number: int


@dataclass(frozen=True, slots=True)
class Connect:
    version: int
    client_id: bytes


@dataclass(frozen=True, slots=True)
class Subscribe:
    topic: bytes
    replay: str | int  # REPLAY_BEGINNING, REPLAY_CURRENT or the first message id wanted (0..2**64-1)


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    topic: bytes


@dataclass(frozen=True, slots=True)
class Ack:
    """The answer to a Ping: its time as epoch seconds, or an OCaml ``(date time)`` pair of atoms."""

    time: int | float | tuple[bytes, bytes]


@dataclass(frozen=True, slots=True)
class Publish:
    """OUR EXTENSION (the spec has no publish message): ``(Publish <topic> <body>)``."""

    topic: bytes
    body: bytes


@dataclass(frozen=True, slots=True)
class Invalid:
    """A client line that is not a valid message; ``reason`` is fit to send back in an Error frame."""

    reason: str


@dataclass(frozen=True, slots=True)
class VersionReply:
    """The server's 8-byte handshake answer: the client's number (accepted) or REFUSED."""

    number: int


@dataclass(frozen=True, slots=True)
class Error:
    text: str


@dataclass(frozen=True, slots=True)
class Ping:
    time: int  # epoch seconds, u32


@dataclass(frozen=True, slots=True)
class Message:
    id: int  # u64, increasing per topic
    topic_id: int  # u32, announced in Subscribed
    body: bytes


@dataclass(frozen=True, slots=True)
class Subscribed:
    topic_id: int
    topic: bytes


@dataclass(frozen=True, slots=True)
class Unsubscribed:
    topic_id: int
    topic: bytes


ClientEvent: TypeAlias = Version | Connect | Subscribe | Unsubscribe | Ack | Publish
ServerEvent: TypeAlias = VersionReply | Error | Ping | Message | Subscribed | Unsubscribed


# ------------------------------------------------------------------------------------------ reading sexps

# One token at a time. Whitespace is space, tab, LF, CR and form feed; a comment runs from ";" to the end of
# the line. Runs of whitespace, comments and bare atoms are taken at most _PIECE bytes at a time (a longer one
# goes on in the next piece), so that no single step of the reader grows with the input; a quoted atom's body
# is read by _Reader._quoted, also piece by piece.
_PIECE = 64 << 10
_TOKEN = re.compile(
    rb"""
      [ \t\n\r\x0c]{1,%d}
    | (;)
    | (\()
    | (\))
    | (")
    | ([^ \t\n\r\x0c()";]{1,%d})
    """ % (_PIECE, _PIECE),
    re.VERBOSE,
)
_COMMENT, _OPEN, _CLOSE, _QUOTE, _UNQUOTED = 1, 2, 3, 4, 5
_COMMENT_REST = re.compile(rb"[^\n\r]{0,%d}" % _PIECE)
_UNQUOTED_REST = re.compile(rb"[^ \t\n\r\x0c()\";]{0,%d}" % _PIECE)
# The body of a quoted atom up to its closing quote when it holds no escape at all (the common case).
_PLAIN = re.compile(rb'[^"\\]{0,%d}' % _PIECE)

# OCaml string escapes as sexplib's lexer reads them: \DDD (decimal, at most 255), \xHH, the named ones, and
# backslash-newline with the next line's indentation (nothing). A backslash followed by anything else stays as
# it is, backslash included. Splitting on this pattern (one group) alternates the text between escapes with
# the escapes themselves; every escape it can match is a key of _UNESCAPED (continuations excepted: they map
# to nothing through the lookup's default), so a whole piece is decoded by C code, with no Python call per
# escape: split, a dict lookup mapped over the escapes, join. Decimal escapes above 255 map to None, which the
# join refuses.
_ESCAPE_SPLIT = re.compile(rb"""(\\(?:[0-9]{3}|x[0-9a-fA-F]{2}|[\\"'ntbr ]|\r?\n[ \t]*))""")
_UNESCAPED: dict[bytes, bytes | None] = {b"\\%03d" % value: bytes((value,)) if value < 256 else None
                                        for value in range(1000)}
_UNESCAPED.update({b"\\x" + bytes((high, low)): bytes((int(bytes((high, low)), 16),))
                   for high in b"0123456789abcdefABCDEF" for low in b"0123456789abcdefABCDEF"})
_UNESCAPED.update({b"\\\\": b"\\", b'\\"': b'"', b"\\'": b"'", b"\\n": b"\n", b"\\t": b"\t", b"\\b": b"\b",
                   b"\\r": b"\r", b"\\ ": b" "})
#: The longest escape in a quoted atom's body, continuations apart (\DDD and \xHH).
_LONGEST_ESCAPE = 4
#: A quoted atom is decoded this many bytes of its text at a time at first, doubling up to _PIECE: a short
#: atom costs little, and reading past its closing quote stays in proportion to its length.
_FIRST_PIECE = 256


def _decode_escapes(parts: list[bytes]) -> bytes:
    """The text of ``parts`` (from :data:`_ESCAPE_SPLIT`) with every escape decoded."""
    escapes = parts[1::2]
    parts[1::2] = map(_UNESCAPED.get, escapes, repeat(b""))
    try:
        return b"".join(parts)
    except TypeError:  # a None: a decimal escape above 255
        bad = next(escape for escape in escapes if _UNESCAPED.get(escape, b"") is None)
        raise ProtocolError(f"bad s-expression: escape {bad.decode()} is above 255") from None


class _Reader:
    """Reads every top-level s-expression in ``text[:end]`` without recursion, a bounded amount of text per
    :meth:`run`, so a caller can spread a long line over several turns of its loop."""

    __slots__ = ("atom", "current", "end", "max_nodes", "nodes", "piece", "position", "quoted", "stack",
                 "text", "top")

    def __init__(self, text: bytes | bytearray, max_nodes: int | None = None, end: int | None = None) -> None:
        self.text = text
        self.end = len(text) if end is None else end
        self.max_nodes = max_nodes
        self.top: list[Sexp] = []
        self.current = self.top
        self.stack: list[list[Sexp]] = []
        self.nodes = 0
        self.position = 0
        self.atom: list[bytes] = []  # decoded pieces of the quoted atom being read
        self.quoted = False  # inside a quoted atom (its opening quote read)
        self.piece = _FIRST_PIECE

    def run(self, budget: int | None = None) -> list[Sexp] | None:
        """The values, or None if ``budget`` bytes of text were read and more remain (call again)."""
        text, end = self.text, self.end
        limit = end if budget is None else min(end, self.position + budget)
        match = _TOKEN.match
        while True:
            if self.quoted:
                if not self._quoted(limit):
                    return None
                continue
            position = self.position
            if position >= end:
                break
            if position >= limit:
                return None
            token = match(text, position, end)
            if token is None:  # cannot happen: every byte starts some token
                raise ProtocolError("bad s-expression")
            position = self.position = token.end()
            kind = token.lastindex
            if kind is None:  # whitespace
                continue
            if kind == _COMMENT:
                while True:  # to the end of the line, a piece at a time
                    rest = _COMMENT_REST.match(text, self.position, end).end()
                    done = rest - self.position < _PIECE
                    self.position = rest
                    if done:
                        break
                continue
            if kind == _CLOSE:
                if not self.stack:
                    raise ProtocolError("bad s-expression: unbalanced ')'")
                self.current = self.stack.pop()
                continue
            self.nodes += 1
            if self.max_nodes is not None and self.nodes > self.max_nodes:
                raise ProtocolError(f"message has more than {self.max_nodes} atoms and lists")
            if kind == _OPEN:
                if len(self.stack) >= _MAX_DEPTH:
                    raise ProtocolError(f"bad s-expression: lists nested deeper than {_MAX_DEPTH} levels")
                child: list[Sexp] = []
                self.current.append(child)
                self.stack.append(self.current)
                self.current = child
            elif kind == _QUOTE:
                self.quoted = True
                self.piece = _FIRST_PIECE
            else:
                self.current.append(self._unquoted(token.group(_UNQUOTED)))
        if self.stack:
            raise ProtocolError("bad s-expression: unbalanced '(' (a list is not closed)")
        return self.top

    def _unquoted(self, first: bytes) -> bytes:
        text, end = self.text, self.end
        atom = first
        if len(first) == _PIECE:
            pieces = [first]
            while True:
                rest = _UNQUOTED_REST.match(text, self.position, end)
                pieces.append(rest.group())
                self.position = rest.end()
                if len(pieces[-1]) < _PIECE:
                    break
            atom = b"".join(pieces)
        # sexplib reads these as comment delimiters (or refuses them) rather than as atom text.
        if b"#|" in atom or b"|#" in atom:
            raise ProtocolError("block comments (#| |#) are not supported; quote an atom containing "
                                "'#|' or '|#'")
        if atom == b"#" and text[self.position : self.position + 1] == b";":
            raise ProtocolError("s-expression comments (#;) are not supported")
        return atom

    def _quoted(self, limit: int) -> bool:
        """Read on in the quoted atom being read: True once it is complete, False if ``limit`` came first."""
        text, end = self.text, self.end
        while True:
            position = self.position
            if not self.atom:
                plain = _PLAIN.match(text, position, end).end()
                if plain < end and text[plain] == 0x22:  # '"': no escape in the whole atom
                    self._close(bytes(text[position:plain]), plain + 1)
                    return True
            if position >= end:
                raise ProtocolError("bad s-expression: unterminated quoted atom")
            if position >= limit:
                return False
            # Up to the budget's limit (at least a short piece: an escape must fit).
            size = min(self.piece, max(limit - position, _FIRST_PIECE))
            self.piece = min(_PIECE, self.piece * 2)
            stop = min(end, position + size)
            piece = bytes(text[position:stop])
            bulk = ocaml_escapes.decode(piece, stop == end)
            if bulk is not None:  # a long piece with many escapes (a binary body: mostly \DDD)
                decoded, used, closed = bulk
                self.atom.append(decoded)
                if closed:
                    self._close(b"".join(self.atom), position + used)
                    return True
                self.position = position + used
                continue
            while True:
                parts = _ESCAPE_SPLIT.split(piece)
                if piece.count(b'"') != parts[1::2].count(b'\\"'):
                    # A quote that no backslash escapes: the atom ends at the first one.
                    for index in range(0, len(parts), 2):
                        found = parts[index].find(b'"')
                        if found >= 0:
                            break
                    used = sum(map(len, parts[:index])) + found
                    del parts[index + 1 :]
                    parts[index] = parts[index][:found]
                    self.atom.append(_decode_escapes(parts))
                    self._close(b"".join(self.atom), position + used + 1)
                    return True
                if stop < end:
                    # The piece may end inside an escape (its backslash among the last bytes, or a
                    # continuation's indentation cut short): leave that escape to the next piece.
                    last = parts[-1]
                    cut = last.rfind(b"\\")
                    if cut >= 0 and len(last) - cut < _LONGEST_ESCAPE:
                        parts[-1] = last[:cut]
                        stop -= len(last) - cut
                    elif not last and len(parts) > 1 and parts[-2][1:2] in (b"\r", b"\n"):
                        stop -= len(parts.pop(-2))
                        parts[-2:] = [parts[-2]]
                if stop > position:
                    break
                size *= 2  # a continuation longer than the piece: read a larger one
                stop = min(end, position + size)
                piece = bytes(text[position:stop])
            self.atom.append(_decode_escapes(parts))
            self.position = stop

    def _close(self, atom: bytes, after: int) -> None:
        self.current.append(atom)
        self.atom = []
        self.quoted = False
        self.position = after


def _parse_all(text: bytes | bytearray, max_nodes: int | None = None) -> list[Sexp]:
    """Every top-level s-expression in ``text``, read without recursion."""
    values = _Reader(text, max_nodes).run()
    assert values is not None  # no budget: read to the end
    return values


def parse(line: bytes) -> Sexp:
    """Exactly one s-expression; whitespace and ``;`` comments around it are allowed."""
    values = _parse_all(bytes(line))
    if len(values) != 1:
        found = "none" if not values else f"{len(values)}"
        raise ProtocolError(f"expected one s-expression, found {found}")
    return values[0]


# ------------------------------------------------------------------------------------------ writing sexps

# sexplib's must_escape: empty, a delimiter, whitespace or a control byte, a byte from 0x7f up, or a
# comment delimiter anywhere in the atom.
_MUST_QUOTE = re.compile(rb'[\x00-\x20"();\\\x7f-\xff]|#\||\|#')
# OCaml's String.escaped keeps printable ASCII except '"' and '\', and writes every other byte as an escape:
# what each byte value becomes, looked up for every byte of the atom by C code (a binary body of megabytes is
# written in milliseconds, with no Python call per byte).
_ESCAPED = [bytes((code,)) if 0x20 <= code <= 0x7E else b"\\%03d" % code for code in range(256)]
_NAMED_ESCAPES = {0x22: b'\\"', 0x5C: b"\\\\", 0x0A: b"\\n", 0x09: b"\\t", 0x0D: b"\\r", 0x08: b"\\b"}
for _code, _escaped in _NAMED_ESCAPES.items():
    _ESCAPED[_code] = _escaped


def quote_atom(atom: bytes) -> bytes:
    """The atom as sexplib writes it: bare when it can be, else double-quoted with OCaml escapes."""
    atom = bytes(atom)
    if atom and _MUST_QUOTE.search(atom) is None:
        return atom
    return b"".join((b'"', *map(_ESCAPED.__getitem__, atom), b'"'))


_END = object()


def dumps(value: Sexp) -> bytes:
    """Machine form with single spaces: ``(a b (c d))``. Written without recursion, like the reader."""
    parts: list[bytes] = []
    stack = [iter((value,))]
    need_space = False
    while stack:
        item = next(stack[-1], _END)
        if item is _END:
            stack.pop()
            if stack:
                parts.append(b")")
                need_space = True
            continue
        if need_space:
            parts.append(b" ")
        if isinstance(item, bytes | bytearray | memoryview):
            parts.append(quote_atom(item))
            need_space = True
        elif isinstance(item, list | tuple):
            parts.append(b"(")
            stack.append(iter(item))
            need_space = False
        else:
            raise TypeError(f"an s-expression is bytes or a list, not {type(item).__name__}")
    return b"".join(parts)


# ------------------------------------------------------------------------------- client messages <-> sexps

_SIGNED = re.compile(rb"-?[0-9]+")
_UNSIGNED = re.compile(rb"[0-9]+")
_FLOAT = re.compile(rb"-?[0-9]+(?:\.[0-9]*(?:[eE][-+]?[0-9]+)?|[eE][-+]?[0-9]+)")


def _show(raw: bytes) -> str:
    """An atom from the wire inside a reason: quoted, short, printable."""
    shown = raw[:64].decode("utf-8", "replace") + ("..." if len(raw) > 64 else "")
    return repr(shown)


def _describe(value: Sexp) -> str:
    return _show(value) if isinstance(value, bytes) else "a list"


def _integer(value: Sexp, low: int, high: int) -> int | None:
    """A decimal atom within [low, high], or None."""
    if not isinstance(value, bytes) or (_SIGNED if low < 0 else _UNSIGNED).fullmatch(value) is None:
        return None
    negative = value.startswith(b"-")
    digits = value.lstrip(b"-").lstrip(b"0")
    # Counting digits first keeps int() away from its 4300-digit limit.
    if len(digits) > 20:
        return None
    number = int(digits or b"0")
    number = -number if negative else number
    return number if low <= number <= high else None


def _topic(value: Sexp, name: str) -> bytes:
    if not isinstance(value, bytes):
        raise ProtocolError(f"{name} topic must be an atom, not a list")
    if not value:
        raise ProtocolError(f"{name} topic must not be empty")
    return value


def _decode_connect(arguments: list[Sexp]) -> Connect:
    if len(arguments) != 2:
        raise ProtocolError("Connect takes a version and a client id")
    version, client_id = arguments
    number = _integer(version, _INT64_MIN, _INT64_MAX)
    if number is None:
        raise ProtocolError(f"Connect version must be a signed 64-bit decimal integer, not "
                            f"{_describe(version)}")
    if not isinstance(client_id, bytes):
        raise ProtocolError("Connect client id must be an atom, not a list")
    return Connect(number, client_id)


_REPLAY_ATOMS = {b"From_beginning": REPLAY_BEGINNING, b"from_beginning": REPLAY_BEGINNING,
                 b"From_current": REPLAY_CURRENT, b"from_current": REPLAY_CURRENT}
_FROM_MESSAGE = (b"From_message", b"from_message")
_REPLAY_FORMS = "From_beginning, From_current or (From_message <id>)"


def _replay(value: Sexp) -> str | int:
    if isinstance(value, bytes):
        mode = _REPLAY_ATOMS.get(value)
        if mode is not None:
            return mode
        if value in _FROM_MESSAGE:
            raise ProtocolError("From_message takes a message id: (From_message <id>)")
        raise ProtocolError(f"unknown replay mode {_show(value)} (expected {_REPLAY_FORMS})")
    if value and isinstance(value[0], bytes) and value[0] in _FROM_MESSAGE:
        if len(value) != 2:
            raise ProtocolError("From_message takes one message id")
        message_id = _integer(value[1], 0, _U64_MAX)
        if message_id is None:
            raise ProtocolError(f"From_message id must be a decimal integer in 0..2**64-1, not "
                                f"{_describe(value[1])}")
        return message_id
    if value and isinstance(value[0], bytes) and value[0] in _REPLAY_ATOMS:
        raise ProtocolError(f"{value[0].decode()} takes no argument: write it as a bare atom")
    raise ProtocolError(f"unknown replay mode (expected {_REPLAY_FORMS})")


def _decode_subscribe(arguments: list[Sexp]) -> Subscribe:
    if len(arguments) != 2:
        raise ProtocolError("Subscribe takes a topic and a replay mode")
    return Subscribe(_topic(arguments[0], "Subscribe"), _replay(arguments[1]))


def _decode_unsubscribe(arguments: list[Sexp]) -> Unsubscribe:
    if len(arguments) != 1:
        raise ProtocolError("Unsubscribe takes a topic")
    return Unsubscribe(_topic(arguments[0], "Unsubscribe"))


def _time(value: Sexp) -> int | float | tuple[bytes, bytes]:
    if isinstance(value, list):
        if len(value) == 2 and isinstance(value[0], bytes) and isinstance(value[1], bytes):
            return (value[0], value[1])
        raise ProtocolError("Ack time as a list must be a (date time) pair of two atoms")
    if _SIGNED.fullmatch(value):
        seconds = _integer(value, _INT64_MIN, _INT64_MAX)
        if seconds is None:
            raise ProtocolError("Ack time is out of range (a signed 64-bit integer)")
        return seconds
    if _FLOAT.fullmatch(value):
        fraction = float(value)
        if not math.isfinite(fraction):
            raise ProtocolError("Ack time is out of range")
        return fraction
    raise ProtocolError(f"Ack takes an epoch time or a (date time) pair, not {_show(value)}")


def _decode_ack(arguments: list[Sexp]) -> Ack:
    if len(arguments) != 1:
        raise ProtocolError("Ack takes one time")
    return Ack(_time(arguments[0]))


def _decode_publish(arguments: list[Sexp]) -> Publish:
    if len(arguments) != 2:
        raise ProtocolError("Publish takes a topic and a body")
    topic = _topic(arguments[0], "Publish")
    body = arguments[1]
    if not isinstance(body, bytes):
        raise ProtocolError("Publish body must be an atom, not a list")
    return Publish(topic, body)


# ppx_sexp_conv's converters accept a constructor with its first letter in either case.
_DECODERS = {
    b"Connect": _decode_connect, b"connect": _decode_connect,
    b"Subscribe": _decode_subscribe, b"subscribe": _decode_subscribe,
    b"Unsubscribe": _decode_unsubscribe, b"unsubscribe": _decode_unsubscribe,
    b"Ack": _decode_ack, b"ack": _decode_ack,
    b"Publish": _decode_publish, b"publish": _decode_publish,
}


def _decode_message(value: Sexp) -> Connect | Subscribe | Unsubscribe | Ack | Publish:
    if isinstance(value, bytes):
        raise ProtocolError(f"a message is a list such as (Connect 1 my-client), not the atom {_show(value)}")
    if not value:
        raise ProtocolError("a message is a list such as (Connect 1 my-client), not ()")
    head = value[0]
    if not isinstance(head, bytes):
        raise ProtocolError("a message must start with its constructor name, not a list")
    decoder = _DECODERS.get(head)
    if decoder is None:
        raise ProtocolError(f"unknown message {_show(head)}")
    return decoder(value[1:])


def _require_int(value: object, low: int, high: int, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ValueError(f"{what} must be an integer in {low}..{high}, not {value!r}")
    return value


def _require_bytes(value: object, what: str, *, empty: bool = True) -> bytes:
    if not isinstance(value, bytes | bytearray):
        raise ValueError(f"{what} must be bytes, not {type(value).__name__}")
    if not empty and not value:
        raise ValueError(f"{what} must not be empty")
    return bytes(value)


def _float_atom(number: float) -> bytes:
    """A decimal fraction that reads back as the same float (repr's digits, never an exponent)."""
    text = repr(number)
    if "e" in text:
        text = format(Decimal(text), "f")
    if "." not in text:
        text += ".0"
    return text.encode()


def _time_sexp(time: object) -> Sexp:
    if isinstance(time, float):
        if not math.isfinite(time):
            raise ValueError(f"Ack time must be finite, not {time!r}")
        return _float_atom(time)
    if isinstance(time, tuple):
        if len(time) != 2:
            raise ValueError("Ack time as a tuple must be a (date, time) pair")
        return [_require_bytes(time[0], "Ack date"), _require_bytes(time[1], "Ack time of day")]
    return str(_require_int(time, _INT64_MIN, _INT64_MAX, "Ack time")).encode()


_REPLAY_WRITTEN = {REPLAY_BEGINNING: b"From_beginning", REPLAY_CURRENT: b"From_current"}


def _replay_sexp(replay: object) -> Sexp:
    if isinstance(replay, str):
        written = _REPLAY_WRITTEN.get(replay)
        if written is None:
            raise ValueError(f"replay must be {REPLAY_BEGINNING!r}, {REPLAY_CURRENT!r} or a message id")
        return written
    return [b"From_message", str(_require_int(replay, 0, _U64_MAX, "replay message id")).encode()]


def _client_sexp(event: object) -> Sexp:
    if isinstance(event, Connect):
        version = _require_int(event.version, _INT64_MIN, _INT64_MAX, "Connect version")
        return [b"Connect", str(version).encode(), _require_bytes(event.client_id, "Connect client id")]
    if isinstance(event, Subscribe):
        topic = _require_bytes(event.topic, "Subscribe topic", empty=False)
        return [b"Subscribe", topic, _replay_sexp(event.replay)]
    if isinstance(event, Unsubscribe):
        return [b"Unsubscribe", _require_bytes(event.topic, "Unsubscribe topic", empty=False)]
    if isinstance(event, Ack):
        return [b"Ack", _time_sexp(event.time)]
    if isinstance(event, Publish):
        topic = _require_bytes(event.topic, "Publish topic", empty=False)
        return [b"Publish", topic, _require_bytes(event.body, "Publish body")]
    raise ValueError(f"a client cannot send {type(event).__name__}")


# ----------------------------------------------------------------------------------------- server frames


def _frame(kind: int, payload: bytes) -> bytes:
    if 1 + len(payload) > _U32_MAX:
        raise ValueError("frame is too large for its u32 length")
    return _FRAME_HEADER.pack(1 + len(payload), kind) + payload


def _topic_record(topic_id: object, topic: object, name: str) -> bytes:
    number = _require_int(topic_id, 0, _U32_MAX, f"{name} topic id")
    return dumps([[b"id", str(number).encode()], [b"topic", _require_bytes(topic, f"{name} topic")]])


def message_frame(message_id: int, topic_id: int, body: bytes) -> bytes:
    """The Message frame, without building an event or checking the values: the broker's delivery path,
    once per message per subscriber. The caller guarantees a u64 id, a u32 topic id and a body that fits a
    u32 frame (``ServerConnection.send(Message(...))`` checks all three, then comes here)."""
    return _MESSAGE_HEADER.pack(13 + len(body), _MESSAGE, message_id, topic_id) + body


def _server_frame(event: object) -> bytes:
    if isinstance(event, Message):
        body = _require_bytes(event.body, "Message body")
        _require_int(event.id, 0, _U64_MAX, "Message id")
        _require_int(event.topic_id, 0, _U32_MAX, "Message topic id")
        if 13 + len(body) > _U32_MAX:
            raise ValueError("Message body is too large for a u32 frame length")
        return message_frame(event.id, event.topic_id, body)
    if isinstance(event, Ping):
        return _frame(_PING, _U32.pack(_require_int(event.time, 0, _U32_MAX, "Ping time")))
    if isinstance(event, Error):
        if not isinstance(event.text, str):
            raise ValueError(f"Error text must be str, not {type(event.text).__name__}")
        return _frame(_ERROR, event.text.encode("utf-8", "replace"))
    if isinstance(event, Subscribed):
        return _frame(_SUBSCRIBED, _topic_record(event.topic_id, event.topic, "Subscribed"))
    if isinstance(event, Unsubscribed):
        return _frame(_UNSUBSCRIBED, _topic_record(event.topic_id, event.topic, "Unsubscribed"))
    raise ValueError(f"a server cannot send {type(event).__name__}")


def _decode_topic_record(payload: bytes, name: str) -> tuple[int, bytes]:
    values = _parse_all(payload, _MAX_MESSAGE_NODES)
    if len(values) != 1 or not isinstance(values[0], list):
        raise ProtocolError(f"{name} payload must be one record ((id <n>) (topic <name>))")
    fields: dict[bytes, Sexp] = {}
    for field in values[0]:
        if not (isinstance(field, list) and len(field) == 2 and isinstance(field[0], bytes)):
            raise ProtocolError(f"{name} record fields must be (name value) pairs")
        key, value = field
        if key not in (b"id", b"topic"):
            raise ProtocolError(f"{name} record has an unknown field {_show(key)}")
        if key in fields:
            raise ProtocolError(f"{name} record has the field {key.decode()} twice")
        fields[key] = value
    if len(fields) != 2:
        raise ProtocolError(f"{name} record needs the fields id and topic")
    topic_id = _integer(fields[b"id"], 0, _U32_MAX)
    if topic_id is None:
        raise ProtocolError(f"{name} id must be a decimal integer in 0..2**32-1")
    topic = fields[b"topic"]
    if not isinstance(topic, bytes):
        raise ProtocolError(f"{name} topic must be an atom")
    return topic_id, topic


def _decode_frame(kind: int, payload: bytes) -> ServerEvent:
    if kind == _MESSAGE:
        if len(payload) < 12:
            raise ProtocolError(f"Message frame payload is {len(payload)} bytes, shorter than its 12-byte "
                                "header")
        message_id, topic_id = _MESSAGE_FIXED.unpack_from(payload)
        return Message(message_id, topic_id, payload[12:])
    if kind == _PING:
        if len(payload) != 4:
            raise ProtocolError(f"Ping frame payload must be 4 bytes, not {len(payload)}")
        return Ping(_U32.unpack(payload)[0])
    if kind == _ERROR:
        return Error(payload.decode("utf-8", "replace"))
    if kind == _SUBSCRIBED:
        return Subscribed(*_decode_topic_record(payload, "Subscribed"))
    if kind == _UNSUBSCRIBED:
        return Unsubscribed(*_decode_topic_record(payload, "Unsubscribed"))
    raise ProtocolError(f"unknown frame type {kind}")


# ------------------------------------------------------------------------------------------- connections


class ServerConnection:
    """The broker's side: reads the handshake and client lines, writes the version reply and frames.

    ``state``: "version" (awaiting the client's 8 bytes), "reply" (Version read, our VersionReply not yet
    sent), "open", "closed" (refused: input is ignored and nothing more is read).
    """

    def __init__(self, *, max_line: int = 4 << 20) -> None:
        if max_line < 1:
            raise ValueError("max_line must be at least 1")
        self.state = "version"
        self._max_line = max_line
        self._head = bytearray()  # the client's version bytes
        self._version: int | None = None
        # The line being received, never longer than max_line: the tail of an over-long line is dropped.
        self._buffer = bytearray()
        self._discarding = False
        # Complete lines not yet read (None stands for an over-long one). Lines are cut here as they arrive,
        # before the handshake is over, so the length bound holds in every state.
        self._lines: deque[bytes | bytearray | None] = deque()
        self._queued = 0  # bytes in _lines
        # The line being read when a step ran out of its budget (see ``busy``).
        self._reader: _Reader | None = None
        #: True when ``next_event`` returned None with a line half read: call it again (a long line is read
        #: SLICE_BYTES at a time, so that one client's line never holds its caller for long).
        self.busy = False

    def receive_data(self, data: bytes) -> None:
        if self.state == "closed" or not data:
            return
        if not isinstance(data, bytes | bytearray):
            data = bytes(data)
        missing = 8 - len(self._head)
        if missing > 0:
            self._head += data[:missing]
            data = data[missing:]
        if data:
            self._cut_lines(data)

    def _cut_lines(self, data: bytes | bytearray) -> None:
        start = 0
        limit = self._max_line
        while True:
            newline = data.find(b"\n", start)
            if newline < 0:
                if not self._discarding:
                    if len(self._buffer) + len(data) - start > limit:
                        # Reported now, in stream order; the rest of the line is dropped as it arrives.
                        self._lines.append(None)
                        self._buffer.clear()
                        self._discarding = True
                    else:
                        self._buffer += data[start:]
                return
            if self._discarding:
                self._discarding = False
            elif len(self._buffer) + newline - start > limit:
                self._lines.append(None)
                self._buffer.clear()
            else:
                if self._buffer:  # the line came in pieces: it is the buffer itself, not a copy of it
                    self._buffer += data[start:newline]
                    line: bytes | bytearray = self._buffer
                    self._buffer = bytearray()
                else:
                    line = data[start:newline]
                self._lines.append(line)
                self._queued += len(line)
            start = newline + 1

    @property
    def buffered(self) -> int:
        """Bytes of client input held: lines not yet read and the line being received."""
        return len(self._buffer) + self._queued

    def next_event(self) -> ClientEvent | Invalid | None:
        """The next client event, or None until more data (or, before "open", our VersionReply) comes."""
        if self.state == "version":
            if len(self._head) < 8:
                return None
            (number,) = _INT64.unpack(self._head)
            self._version = number
            self.state = "reply"
            return Version(number)
        if self.state != "open":
            return None
        lines = self._lines
        while self._reader is not None or lines:
            reader = self._reader
            if reader is None:
                line = lines.popleft()
                if line is None:
                    return Invalid(f"message longer than {self._max_line} bytes")
                self._queued -= len(line)
                reader = _Reader(line, _MAX_MESSAGE_NODES, len(line) - line.endswith(b"\r"))
            try:
                values = reader.run(SLICE_BYTES)
                if values is None:
                    self._reader = reader
                    self.busy = True
                    return None
                self._reader = None
                self.busy = False
                if not values:
                    continue  # blank, or only a comment
                if len(values) > 1:
                    return Invalid("extra content after the message (one s-expression per line)")
                return _decode_message(values[0])
            except ProtocolError as error:
                self._reader = None
                self.busy = False
                return Invalid(str(error))
        return None

    def send(self, event: ServerEvent) -> bytes:
        if isinstance(event, VersionReply):
            if self.state != "reply":
                raise ValueError(f"VersionReply answers the client's Version once (state is {self.state!r})")
            number = _require_int(event.number, _INT64_MIN, _INT64_MAX, "VersionReply number")
            if number == REFUSED:
                self._close()
            elif number == self._version:
                self.state = "open"
            else:
                raise ValueError(f"VersionReply must repeat the client's version {self._version} or be "
                                 f"{REFUSED}, not {number}")
            return _INT64.pack(number)
        if self.state != "open":
            raise ValueError(f"cannot send {type(event).__name__} in state {self.state!r}")
        return _server_frame(event)

    def _close(self) -> None:
        self.state = "closed"
        self._buffer.clear()
        self._lines.clear()
        self._queued = 0
        self._reader = None
        self.busy = False
        self._discarding = False


class ClientConnection:
    """The client's side: writes the handshake and messages, reads the version reply and server frames.

    ``state``: "version" (nothing sent yet), "reply" (Version sent, awaiting the reply), "open", "closed"
    (refused, or the server broke the protocol: the stream can no longer be read).
    """

    def __init__(self, *, max_frame: int = 64 << 20) -> None:
        if max_frame < 1:
            raise ValueError("max_frame must be at least 1")
        self.state = "version"
        self._max_frame = max_frame
        self._version: int | None = None
        self._buffer = bytearray()

    def receive_data(self, data: bytes) -> None:
        if self.state != "closed":
            self._buffer += data

    def next_event(self) -> ServerEvent | None:
        """The next server event, or None until more data comes. Raises ProtocolError (and closes)."""
        try:
            return self._next_event()
        except ProtocolError:
            # Once a frame is misread the stream cannot be resynchronised.
            self.state = "closed"
            self._buffer.clear()
            raise

    def _next_event(self) -> ServerEvent | None:
        buffer = self._buffer
        if self.state == "open":
            if len(buffer) < 4:
                return None
            (length,) = _U32.unpack_from(buffer)
            if length == 0:
                raise ProtocolError("frame length 0: a frame holds at least its type byte")
            if length > self._max_frame:
                raise ProtocolError(f"frame of {length} bytes is longer than the limit of {self._max_frame}")
            if len(buffer) < 4 + length:
                return None
            kind = buffer[4]
            if kind == _MESSAGE and length >= 13:
                # The common frame, read in place: one copy of the body and no intermediate payload.
                message_id, topic_id = _MESSAGE_FIXED.unpack_from(buffer, 5)
                body = bytes(buffer[17 : 4 + length])
                del buffer[: 4 + length]
                return Message(message_id, topic_id, body)
            payload = bytes(buffer[5 : 4 + length])
            del buffer[: 4 + length]
            return _decode_frame(kind, payload)
        if self.state != "reply" or len(buffer) < 8:
            return None
        (number,) = _INT64.unpack_from(buffer)
        del buffer[:8]
        if number == REFUSED:
            self.state = "closed"
            buffer.clear()
        elif number == self._version:
            self.state = "open"
        else:
            raise ProtocolError(f"server answered version {number} to our version {self._version}")
        return VersionReply(number)

    def send(self, event: ClientEvent) -> bytes:
        if isinstance(event, Version):
            if self.state != "version":
                raise ValueError(f"Version is sent once, first (state is {self.state!r})")
            number = _require_int(event.number, _INT64_MIN, _INT64_MAX, "Version number")
            self._version = number
            self.state = "reply"
            return _INT64.pack(number)
        if self.state != "open":
            raise ValueError(f"cannot send {type(event).__name__} in state {self.state!r}")
        return dumps(_client_sexp(event)) + b"\n"
