"""The sexp dialect codec (protocol/sexp.py): the version handshake and its refusal, every client message form
(the spec's table, quoted atoms and OCaml escapes, lowercase constructors, sexplib's compact machine form)
and every server frame as exact wire vectors, each fed whole, byte by byte and with trailing data; invalid
lines (each yields Invalid and the connection goes on), the over-long line bound, the state rules and send
misuse; quote_atom/dumps/parse against sexplib's rules; hypothesis round-trips in both directions and of
arbitrary trees, and fuzzing whose only allowed failure is ProtocolError on the client side and nothing at
all on the server side.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import ProtocolError, ocaml_escapes, sexp
from protocol.sexp import (
    REPLAY_BEGINNING,
    REPLAY_CURRENT,
    Ack,
    Connect,
    Error,
    Invalid,
    Message,
    Ping,
    Publish,
    Subscribe,
    Subscribed,
    Unsubscribe,
    Unsubscribed,
    Version,
    VersionReply,
)

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ROUND_TRIP = settings(max_examples=300, deadline=None)

HANDSHAKE = bytes.fromhex("00 00 00 00 00 00 00 01")
REFUSAL = bytes.fromhex("ff ff ff ff ff ff ff ff")

CLIENT_TYPES = (Version, Connect, Subscribe, Unsubscribe, Ack, Publish)
SERVER_TYPES = (VersionReply, Error, Ping, Message, Subscribed, Unsubscribed)


def drain(connection: sexp.ServerConnection | sexp.ClientConnection) -> list[object]:
    events = []
    while (event := connection.next_event()) is not None:
        events.append(event)
    return events


def open_server(max_line: int = 4 << 20) -> sexp.ServerConnection:
    server = sexp.ServerConnection(max_line=max_line)
    server.receive_data(HANDSHAKE)
    assert server.next_event() == Version(1)
    assert server.send(VersionReply(1)) == HANDSHAKE
    assert server.state == "open"
    return server


def open_client(max_frame: int = 64 << 20) -> sexp.ClientConnection:
    client = sexp.ClientConnection(max_frame=max_frame)
    assert client.send(Version(1)) == HANDSHAKE
    client.receive_data(HANDSHAKE)
    assert client.next_event() == VersionReply(1)
    assert client.state == "open"
    return client


def split(data: bytes, sizes: list[int]) -> Iterator[bytes]:
    """``data`` cut into chunks of the given sizes, cycling through them (one chunk when sizes is empty)."""
    if not sizes:
        yield data
        return
    position = 0
    index = 0
    while position < len(data):
        size = sizes[index % len(sizes)]
        yield data[position : position + size]
        position += size
        index += 1


FEEDS = ["whole", "bytewise", "trailing"]


def feed(
    connection: sexp.ServerConnection | sexp.ClientConnection, wire: bytes, how: str, trailing: bytes
) -> list[object]:
    """Feed ``wire`` whole, byte by byte (nothing may come out before its last byte) or with ``trailing``."""
    if how == "whole":
        connection.receive_data(wire)
        return drain(connection)
    if how == "bytewise":
        events: list[object] = []
        for index in range(len(wire)):
            connection.receive_data(wire[index : index + 1])
            got = drain(connection)
            if index < len(wire) - 1:
                assert got == [], f"event before the last byte: {got}"
            events += got
        return events
    connection.receive_data(wire + trailing)
    return drain(connection)


# -------------------------------------------------------------------------------------------- handshake


@pytest.mark.parametrize("how", FEEDS)
def test_server_reads_the_version_handshake(how: str) -> None:
    server = sexp.ServerConnection()
    assert server.state == "version"
    events = feed(server, HANDSHAKE, how, b"(Unsubscribe early)\n")
    # Whatever follows the version waits for our reply.
    assert events == [Version(1)]
    assert server.state == "reply"
    assert server.send(VersionReply(sexp.VERSION_ONE)) == HANDSHAKE
    assert server.state == "open"
    assert drain(server) == ([Unsubscribe(b"early")] if how == "trailing" else [])


@pytest.mark.parametrize(
    ("wire", "number"),
    [(REFUSAL, -1), (bytes.fromhex("80 00 00 00 00 00 00 00"), -(2**63)),
     (bytes.fromhex("7f ff ff ff ff ff ff ff"), 2**63 - 1), (bytes.fromhex("00 00 00 00 00 00 00 02"), 2)],
    ids=["minus-one", "min", "max", "two"],
)
def test_server_reads_any_signed_version(wire: bytes, number: int) -> None:
    server = sexp.ServerConnection()
    server.receive_data(wire)
    assert server.next_event() == Version(number)
    assert server.next_event() is None


def test_server_refusal_closes_and_ignores_everything_after() -> None:
    server = sexp.ServerConnection()
    server.receive_data(bytes.fromhex("00 00 00 00 00 00 00 02") + b"(Connect 2 me)\n")
    assert server.next_event() == Version(2)
    assert server.send(VersionReply(sexp.REFUSED)) == REFUSAL
    assert server.state == "closed"
    server.receive_data(b"(Unsubscribe x)\n")
    assert server.next_event() is None
    assert len(server._buffer) == 0
    assert not server._lines
    with pytest.raises(ValueError, match="state 'closed'"):
        server.send(Ping(1))


def test_server_parses_nothing_before_its_version_reply() -> None:
    server = sexp.ServerConnection()
    server.receive_data(HANDSHAKE + b"(Connect 1 me)\n(Unsubscribe a)\n")
    assert server.next_event() == Version(1)
    assert server.next_event() is None
    assert server.next_event() is None
    assert server.state == "reply"
    server.send(VersionReply(1))
    assert drain(server) == [Connect(1, b"me"), Unsubscribe(b"a")]


@pytest.mark.parametrize("how", FEEDS)
def test_client_accepted_handshake(how: str) -> None:
    client = sexp.ClientConnection()
    assert client.state == "version"
    assert client.send(Version(1)) == HANDSHAKE
    assert client.state == "reply"
    events = feed(client, HANDSHAKE, how, bytes.fromhex("00 00 00 05 01 00 00 00 07"))
    assert events == [VersionReply(1), *([Ping(7)] if how == "trailing" else [])]
    assert client.state == "open"


@pytest.mark.parametrize("how", FEEDS)
def test_client_refused_handshake_closes(how: str) -> None:
    client = sexp.ClientConnection()
    client.send(Version(1))
    events = feed(client, REFUSAL, how, bytes.fromhex("00 00 00 05 01 00 00 00 07"))
    # The refusal ends the connection: the trailing Ping is not read.
    assert events == [VersionReply(-1)]
    assert client.state == "closed"
    client.receive_data(bytes.fromhex("00 00 00 05 01 00 00 00 07"))
    assert client.next_event() is None
    with pytest.raises(ValueError, match="state 'closed'"):
        client.send(Unsubscribe(b"t"))


def test_client_refuses_a_reply_that_is_neither_its_version_nor_minus_one() -> None:
    client = sexp.ClientConnection()
    client.send(Version(1))
    client.receive_data(bytes.fromhex("00 00 00 00 00 00 00 02"))
    with pytest.raises(ProtocolError, match="version 2"):
        client.next_event()
    assert client.state == "closed"


def test_client_reads_nothing_before_it_sends_its_version() -> None:
    client = sexp.ClientConnection()
    client.receive_data(HANDSHAKE)
    assert client.next_event() is None
    client.send(Version(1))
    assert client.next_event() == VersionReply(1)


def test_client_version_is_signed_big_endian() -> None:
    assert sexp.ClientConnection().send(Version(-2)) == bytes.fromhex("ff ff ff ff ff ff ff fe")
    assert sexp.ClientConnection().send(Version(2**63 - 1)) == bytes.fromhex("7f ff ff ff ff ff ff ff")


# --------------------------------------------------------------------------------------- client messages

# (line on the wire, event, whether our writer produces exactly this line)
CLIENT_LINES: list[tuple[bytes, object, bool]] = [
    # The spec's table.
    (b"(Connect 1 my-client)\n", Connect(1, b"my-client"), True),
    (b"(Subscribe orders From_beginning)\n", Subscribe(b"orders", REPLAY_BEGINNING), True),
    (b"(Subscribe orders (From_message 42))\n", Subscribe(b"orders", 42), True),
    (b"(Subscribe orders From_current)\n", Subscribe(b"orders", REPLAY_CURRENT), True),
    (b"(Unsubscribe orders)\n", Unsubscribe(b"orders"), True),
    (b"(Ack 1700000000)\n", Ack(1700000000), True),
    # Ack forms, our extension Publish, edge values.
    (b"(Ack 1700000000.25)\n", Ack(1700000000.25), True),
    (b"(Ack -3)\n", Ack(-3), True),
    (b"(Ack (2024-01-02 03:04:05.123456Z))\n", Ack((b"2024-01-02", b"03:04:05.123456Z")), True),
    (b'(Ack ("" "a b"))\n', Ack((b"", b"a b")), True),
    (b"(Ack 1.)\n", Ack(1.0), False),
    (b"(Ack 1.5e3)\n", Ack(1500.0), False),
    (b"(Ack 2e2)\n", Ack(200.0), False),
    (b"(Publish orders hello)\n", Publish(b"orders", b"hello"), True),
    (b'(Publish t "")\n', Publish(b"t", b""), True),
    (b"(Connect -9223372036854775808 \"\")\n", Connect(-(2**63), b""), True),
    (b"(Connect 9223372036854775807 id)\n", Connect(2**63 - 1, b"id"), True),
    (b"(Subscribe orders (From_message 18446744073709551615))\n", Subscribe(b"orders", 2**64 - 1), True),
    (b"(Subscribe orders (From_message 0))\n", Subscribe(b"orders", 0), True),
    (b"(Subscribe orders (From_message 0042))\n", Subscribe(b"orders", 42), False),
    # Quoted atoms and escapes.
    (b'(Publish "a b" "x\\"y")\n', Publish(b"a b", b'x"y'), True),
    (b'(Subscribe "collective agent" From_current)\n', Subscribe(b"collective agent", REPLAY_CURRENT), True),
    (b'(Publish t "back\\\\slash")\n', Publish(b"t", b"back\\slash"), True),
    (b'(Publish t "line\\nbreak")\n', Publish(b"t", b"line\nbreak"), True),
    (b'(Publish t "caf\\233")\n', Publish(b"t", b"caf\xe9"), True),
    (b'(Publish t "\\000\\127\\255")\n', Publish(b"t", b"\x00\x7f\xff"), True),
    (b'(Publish t "\\xff\\x00\\xAb")\n', Publish(b"t", b"\xff\x00\xab"), False),
    (b'(Publish t "\\t\\b\\r")\n', Publish(b"t", b"\t\b\r"), True),
    (b'(Publish t "\\\'\\ ")\n', Publish(b"t", b"' "), False),
    (b'(Publish t "a\\qb\\1x\\xzz")\n', Publish(b"t", b"a\\qb\\1x\\xzz"), False),  # kept, as sexplib does
    (b'(Publish "(x)" ";")\n', Publish(b"(x)", b";"), True),
    (b'(Publish "a#|b" "|#")\n', Publish(b"a#|b", b"|#"), True),
    (b"(Publish a#b |)\n", Publish(b"a#b", b"|"), True),
    (b"(Publish a'b \\)\n", Publish(b"a'b", b"\\"), False),  # a bare backslash is an unquoted atom
    (b'(Publish "\\"quoted\\"" x)\n', Publish(b'"quoted"', b"x"), True),
    # Lowercase constructors, as ppx_sexp_conv accepts.
    (b"(connect 1 x)\n", Connect(1, b"x"), False),
    (b"(subscribe t from_beginning)\n", Subscribe(b"t", REPLAY_BEGINNING), False),
    (b"(subscribe t from_current)\n", Subscribe(b"t", REPLAY_CURRENT), False),
    (b"(subscribe t (from_message 7))\n", Subscribe(b"t", 7), False),
    (b"(unsubscribe t)\n", Unsubscribe(b"t"), False),
    (b"(ack 5)\n", Ack(5), False),
    (b"(publish t b)\n", Publish(b"t", b"b"), False),
    # sexplib's own machine printer leaves out spaces next to parentheses and quoted atoms.
    (b'(Publish"a b""x")\n', Publish(b"a b", b"x"), False),
    (b"(Subscribe orders(From_message 42))\n", Subscribe(b"orders", 42), False),
    # Layout: whitespace, comments, CRLF.
    (b"  (Unsubscribe\torders)  ; bye\r\n", Unsubscribe(b"orders"), False),
    (b"(Unsubscribe\x0c\rorders)\n", Unsubscribe(b"orders"), False),
    (b"(Unsubscribe orders)\r\n", Unsubscribe(b"orders"), False),
]
CLIENT_LINE_IDS = [f"{n}-{line[:24].decode('latin-1').strip()}"
                   for n, (line, _, _) in enumerate(CLIENT_LINES)]
NEXT_LINE = b"(Unsubscribe next)\n(Conn"


@pytest.mark.parametrize("how", FEEDS)
@pytest.mark.parametrize(("line", "event", "canonical"), CLIENT_LINES, ids=CLIENT_LINE_IDS)
def test_server_decodes_client_line(line: bytes, event: object, canonical: bool, how: str) -> None:
    events = feed(open_server(), line, how, NEXT_LINE)
    expected = [event, Unsubscribe(b"next")] if how == "trailing" else [event]
    assert events == expected
    if isinstance(event, Ack):
        assert type(events[0].time) is type(event.time)


@pytest.mark.parametrize(
    ("line", "event"), [(line, event) for line, event, canonical in CLIENT_LINES if canonical]
)
def test_client_encodes_message(line: bytes, event: object) -> None:
    assert open_client().send(event) == line


def test_client_encodes_floats_as_decimal_fractions() -> None:
    client = open_client()
    assert client.send(Ack(1e16)) == b"(Ack 10000000000000000.0)\n"
    assert client.send(Ack(5e-7)) == b"(Ack 0.0000005)\n"
    assert client.send(Ack(2.0)) == b"(Ack 2.0)\n"
    assert client.send(Ack(-0.5)) == b"(Ack -0.5)\n"


def test_publish_of_every_byte_stays_on_one_line() -> None:
    body = bytes(range(256))
    line = open_client().send(Publish(b"all bytes", body))
    assert line.count(b"\n") == 1
    assert line.endswith(b'\\253\\254\\255")\n')
    server = open_server()
    server.receive_data(line)
    assert drain(server) == [Publish(b"all bytes", body)]


def test_blank_and_comment_only_lines_are_skipped() -> None:
    server = open_server()
    server.receive_data(b"\n   \n\t\r\n; only a comment\n  ; another\r\n\x0c\n(Unsubscribe a)\n\n")
    assert drain(server) == [Unsubscribe(b"a")]
    assert server.next_event() is None


# ----------------------------------------------------------------------------------------- invalid lines

# (line without its newline, a fragment of the reason)
INVALID_LINES: list[tuple[bytes, str]] = [
    (b"(Connect 1 a", "unbalanced '('"),
    (b"(Connect 1 a))", "unbalanced ')'"),
    (b")", "unbalanced ')'"),
    (b'(Publish t "abc)', "unterminated quoted atom"),
    (b'"', "unterminated quoted atom"),
    (b'(Publish t "abc\\")', "unterminated quoted atom"),
    (b"(Foo 1)", "unknown message 'Foo'"),
    (b"(CONNECT 1 a)", "unknown message 'CONNECT'"),
    (b"(\xff 1)", "unknown message '\ufffd'"),
    (b"Connect", "not the atom 'Connect'"),
    (b"()", "not ()"),
    (b"((Connect) 1 a)", "constructor name"),
    (b"(Connect 1)", "Connect takes a version and a client id"),
    (b"(Connect 1 a b)", "Connect takes a version and a client id"),
    (b"(Connect x a)", "version must be a signed 64-bit decimal integer, not 'x'"),
    (b"(Connect 1.0 a)", "version must be"),
    (b"(Connect 9223372036854775808 a)", "version must be"),
    (b"(Connect " + b"1" * 5000 + b" a)", "version must be"),
    (b"(Connect (1) a)", "not a list"),
    (b"(Connect 1 (a))", "client id must be an atom"),
    (b"(Subscribe orders)", "Subscribe takes a topic and a replay mode"),
    (b"(Subscribe orders From_current x)", "Subscribe takes a topic and a replay mode"),
    (b"(Subscribe orders From_somewhere)", "unknown replay mode 'From_somewhere'"),
    (b"(Subscribe orders FROM_CURRENT)", "unknown replay mode"),
    (b"(Subscribe orders From_message)", "From_message takes a message id"),
    (b"(Subscribe orders (From_message))", "From_message takes one message id"),
    (b"(Subscribe orders (From_message 1 2))", "From_message takes one message id"),
    (b"(Subscribe orders (From_message -1))", "From_message id must be"),
    (b"(Subscribe orders (From_message 18446744073709551616))", "From_message id must be"),
    (b"(Subscribe orders (From_message x))", "From_message id must be"),
    (b"(Subscribe orders (From_beginning))", "takes no argument"),
    (b"(Subscribe orders (Later 1))", "unknown replay mode"),
    (b"(Subscribe orders ())", "unknown replay mode"),
    (b'(Subscribe "" From_current)', "topic must not be empty"),
    (b"(Subscribe (a b) From_current)", "topic must be an atom"),
    (b"(Unsubscribe)", "Unsubscribe takes a topic"),
    (b"(Unsubscribe a b)", "Unsubscribe takes a topic"),
    (b'(Unsubscribe "")', "topic must not be empty"),
    (b"(Ack)", "Ack takes one time"),
    (b"(Ack 1 2)", "Ack takes one time"),
    (b"(Ack soon)", "Ack takes an epoch time or a (date time) pair, not 'soon'"),
    (b"(Ack 1_000)", "Ack takes an epoch time"),
    (b"(Ack 0x10)", "Ack takes an epoch time"),
    (b"(Ack (a b c))", "(date time) pair"),
    (b"(Ack ((a) b))", "(date time) pair"),
    (b"(Ack 1e999)", "out of range"),
    (b"(Ack 9223372036854775808)", "out of range"),
    (b"(Publish t)", "Publish takes a topic and a body"),
    (b'(Publish "" body)', "topic must not be empty"),
    (b"(Publish t (b))", "body must be an atom"),
    (b"(Unsubscribe a) (Unsubscribe b)", "extra content"),
    (b"(Unsubscribe a) b", "extra content"),
    (b"#| comment |# (Unsubscribe a)", "block comments"),
    (b"(Unsubscribe a#|b)", "block comments"),
    (b"(Unsubscribe a|#b)", "block comments"),
    (b"#;(x) (Unsubscribe a)", "s-expression comments (#;) are not supported"),
    (b'(Publish t "\\256")', "escape \\256 is above 255"),
    (b"(" * 300 + b")" * 300, "more than 64 atoms and lists"),
    (b"(Unsubscribe " + b"()" * 100 + b")", "more than 64 atoms and lists"),
]


@pytest.mark.parametrize(("line", "fragment"), INVALID_LINES, ids=range(len(INVALID_LINES)))
def test_invalid_line_yields_invalid_and_the_connection_goes_on(line: bytes, fragment: str) -> None:
    server = open_server()
    server.receive_data(line + b"\n(Unsubscribe after)\n")
    events = drain(server)
    assert len(events) == 2
    invalid, after = events
    assert isinstance(invalid, Invalid)
    assert fragment in invalid.reason
    # Fit for an Error frame: one short printable line.
    assert invalid.reason.isprintable()
    assert 0 < len(invalid.reason) <= 200
    assert after == Unsubscribe(b"after")


def test_huge_lines_fail_fast_without_recursion() -> None:
    server = open_server()
    server.receive_data(b"(" * 1_000_000 + b"\n" + b"()" * 500_000 + b"\n")
    assert drain(server) == [Invalid("message has more than 64 atoms and lists")] * 2
    with pytest.raises(ProtocolError, match="nested deeper than 256 levels"):
        sexp.parse(b"(" * 1_000_000)


# ------------------------------------------------------------------------------------------ line length


def test_line_of_exactly_max_line_bytes_is_read_and_one_more_is_not() -> None:
    limit = 32
    line = b"(Publish t " + b"x" * (limit - 12) + b")"
    assert len(line) == limit
    server = open_server(max_line=limit)
    server.receive_data(line + b"\n" + line[:-1] + b"x)\n" + line + b"\r\n" + line + b"\n")
    assert drain(server) == [
        Publish(b"t", b"x" * (limit - 12)),
        Invalid(f"message longer than {limit} bytes"),
        Invalid(f"message longer than {limit} bytes"),  # the "\r" counts
        Publish(b"t", b"x" * (limit - 12)),
    ]


@pytest.mark.parametrize("chunk", [1, 7, 64, 10_000], ids=lambda size: f"chunk-{size}")
def test_over_long_line_is_reported_once(chunk: int) -> None:
    server = open_server(max_line=64)
    wire = b"(Unsubscribe before)\n" + b"(Publish t " + b"y" * 1000 + b")\n" + b"(Unsubscribe after)\n"
    events = []
    for part in split(wire, [chunk]):
        server.receive_data(part)
        assert len(server._buffer) <= 64
        events += drain(server)
    assert events == [Unsubscribe(b"before"), Invalid("message longer than 64 bytes"), Unsubscribe(b"after")]


def test_over_long_line_is_dropped_with_bounded_memory() -> None:
    server = open_server(max_line=1024)
    block = b"z" * 65536
    server.receive_data(block)
    # Reported as soon as the line is known to be too long, without waiting for its end.
    assert drain(server) == [Invalid("message longer than 1024 bytes")]
    for _ in range(160):  # 10 MiB more of the same line
        server.receive_data(block)
        assert len(server._buffer) <= 1024
        assert not server._lines
        assert server.next_event() is None
    server.receive_data(b"tail\n(Unsubscribe after)\n")
    assert drain(server) == [Unsubscribe(b"after")]
    assert len(server._buffer) == 0


def test_line_bound_holds_before_the_version_reply() -> None:
    server = sexp.ServerConnection(max_line=100)
    server.receive_data(HANDSHAKE)
    for _ in range(100):
        server.receive_data(b"q" * 1000)
        assert len(server._buffer) <= 100
    server.receive_data(b"\n(Unsubscribe a)\n")
    assert server.next_event() == Version(1)
    assert server.next_event() is None
    server.send(VersionReply(1))
    assert drain(server) == [Invalid("message longer than 100 bytes"), Unsubscribe(b"a")]


# ---------------------------------------------------------------------------------------- server frames

# (exact frame bytes, event)
SERVER_FRAMES: list[tuple[bytes, object]] = [
    (bytes.fromhex("00 00 00 04 00") + b"bad", Error("bad")),
    (bytes.fromhex("00 00 00 01 00"), Error("")),
    (bytes.fromhex("00 00 00 06 00") + "café".encode(), Error("café")),
    (bytes.fromhex("00 00 00 05 01 65 53 f1 00"), Ping(1700000000)),
    (bytes.fromhex("00 00 00 05 01 00 00 00 00"), Ping(0)),
    (bytes.fromhex("00 00 00 05 01 ff ff ff ff"), Ping(2**32 - 1)),
    (bytes.fromhex("00 00 00 0f 02 00 00 00 00 00 00 00 2a 00 00 00 03") + b"hi", Message(42, 3, b"hi")),
    (bytes.fromhex("00 00 00 0d 02 ff ff ff ff ff ff ff ff ff ff ff ff"), Message(2**64 - 1, 2**32 - 1, b"")),
    (bytes.fromhex("00 00 00 10 02 00 00 00 00 00 00 00 01 00 00 00 00 00 0a ff"),
     Message(1, 0, b"\x00\n\xff")),
    (bytes.fromhex("00 00 00 18 03") + b"((id 3) (topic orders))", Subscribed(3, b"orders")),
    (bytes.fromhex("00 00 00 18 04") + b"((id 3) (topic orders))", Unsubscribed(3, b"orders")),
    (bytes.fromhex("00 00 00 20 03") + b'((id 4294967295) (topic "a b"))', Subscribed(2**32 - 1, b"a b")),
    (bytes.fromhex("00 00 00 18 04") + b'((id 0) (topic "x\\ny"))', Unsubscribed(0, b"x\ny")),
]
SERVER_FRAME_IDS = [f"{n}-{type(event).__name__}" for n, (_, event) in enumerate(SERVER_FRAMES)]
NEXT_FRAME = bytes.fromhex("00 00 00 05 01 00 00 00 09 00 00")


@pytest.mark.parametrize(("wire", "event"), SERVER_FRAMES, ids=SERVER_FRAME_IDS)
def test_server_encodes_frame(wire: bytes, event: object) -> None:
    assert open_server().send(event) == wire


@pytest.mark.parametrize("how", FEEDS)
@pytest.mark.parametrize(("wire", "event"), SERVER_FRAMES, ids=SERVER_FRAME_IDS)
def test_client_decodes_frame(wire: bytes, event: object, how: str) -> None:
    events = feed(open_client(), wire, how, NEXT_FRAME)
    assert events == ([event, Ping(9)] if how == "trailing" else [event])


@pytest.mark.parametrize(
    ("payload", "event"),
    [
        (b"((topic orders) (id 3))", Subscribed(3, b"orders")),  # fields in either order
        (b"((id 3)(topic orders))", Subscribed(3, b"orders")),  # sexplib's compact form
        (b' ( (id 007) (topic "or\\100ers") ) ', Subscribed(7, b"or\x64ers")),
        (b"((id 3) (topic \"\"))", Subscribed(3, b"")),
    ],
)
def test_client_reads_other_spellings_of_the_topic_record(payload: bytes, event: object) -> None:
    client = open_client()
    client.receive_data((len(payload) + 1).to_bytes(4, "big") + b"\x03" + payload)
    assert drain(client) == [event]


def test_client_decodes_error_text_with_replacement() -> None:
    client = open_client()
    client.receive_data(bytes.fromhex("00 00 00 04 00 61 ff 62"))
    assert drain(client) == [Error("a\ufffdb")]


BAD_FRAMES: list[tuple[bytes, str]] = [
    (bytes.fromhex("00 00 00 00"), "frame length 0"),
    (bytes.fromhex("00 00 00 01 05"), "unknown frame type 5"),
    (bytes.fromhex("00 00 00 01 ff"), "unknown frame type 255"),
    (bytes.fromhex("00 00 00 04 01 00 00 01"), "Ping frame payload must be 4 bytes, not 3"),
    (bytes.fromhex("00 00 00 06 01 00 00 00 01 00"), "Ping frame payload must be 4 bytes, not 5"),
    (bytes.fromhex("00 00 00 01 01"), "not 0"),
    (bytes.fromhex("00 00 00 0c 02 00 00 00 00 00 00 00 01 00 00 00"), "11 bytes"),
    (bytes.fromhex("00 00 00 01 03"), "one record"),
]
RECORDS: list[tuple[bytes, str]] = [
    (b"((id 3))", "needs the fields id and topic"),
    (b"((topic t))", "needs the fields id and topic"),
    (b"((id x) (topic t))", "id must be a decimal integer"),
    (b"((id -1) (topic t))", "id must be a decimal integer"),
    (b"((id 4294967296) (topic t))", "id must be a decimal integer"),
    (b"((id (3)) (topic t))", "id must be a decimal integer"),
    (b"((id 3) (topic t) (extra 1))", "unknown field 'extra'"),
    (b"((id 3) (id 4) (topic t))", "field id twice"),
    (b"((id 3) (topic (a)))", "topic must be an atom"),
    (b"((id 3) (topic a b))", "(name value) pairs"),
    (b"((id 3) topic)", "(name value) pairs"),
    (b"(id 3)", "(name value) pairs"),
    (b"orders", "one record"),
    (b"((id 3) (topic t)) ((id 4) (topic u))", "one record"),
    (b"((id 3) (topic t)", "unbalanced"),
    (b'((id 3) (topic "t))', "unterminated"),
]
for _payload, _fragment in RECORDS:
    BAD_FRAMES.append(((len(_payload) + 1).to_bytes(4, "big") + b"\x03" + _payload, _fragment))
    BAD_FRAMES.append(((len(_payload) + 1).to_bytes(4, "big") + b"\x04" + _payload, _fragment))


@pytest.mark.parametrize(("wire", "fragment"), BAD_FRAMES, ids=range(len(BAD_FRAMES)))
def test_bad_frame_raises_protocol_error_and_closes(wire: bytes, fragment: str) -> None:
    client = open_client()
    client.receive_data(wire + NEXT_FRAME)
    with pytest.raises(ProtocolError) as info:
        client.next_event()
    assert fragment in str(info.value)
    assert client.state == "closed"
    # The stream is out of step: nothing after the bad frame is read.
    client.receive_data(NEXT_FRAME)
    assert client.next_event() is None


def test_over_long_frame_is_refused_as_soon_as_its_length_is_read() -> None:
    client = open_client(max_frame=100)
    client.receive_data(bytes.fromhex("00 00 00"))
    assert client.next_event() is None
    client.receive_data(bytes.fromhex("65"))  # 101, and no body yet
    with pytest.raises(ProtocolError, match="101 bytes is longer than the limit of 100"):
        client.next_event()


def test_frame_of_exactly_max_frame_bytes_is_read() -> None:
    client = open_client(max_frame=100)
    client.receive_data(bytes.fromhex("00 00 00 64 00") + b"e" * 99)
    assert drain(client) == [Error("e" * 99)]


# ----------------------------------------------------------------------------------------- send misuse


def test_server_send_before_the_handshake_is_over_is_value_error() -> None:
    server = sexp.ServerConnection()
    with pytest.raises(ValueError, match="state 'version'"):
        server.send(Ping(1))
    with pytest.raises(ValueError, match="once"):
        server.send(VersionReply(1))
    server.receive_data(HANDSHAKE)
    assert server.next_event() == Version(1)
    with pytest.raises(ValueError, match="state 'reply'"):
        server.send(Error("too early"))
    with pytest.raises(ValueError, match="repeat the client's version 1"):
        server.send(VersionReply(2))
    assert server.state == "reply"
    server.send(VersionReply(1))
    with pytest.raises(ValueError, match="once"):
        server.send(VersionReply(1))


SERVER_MISUSE: list[tuple[object, str]] = [
    (Ping(-1), "Ping time must be an integer in 0..4294967295"),
    (Ping(2**32), "Ping time must be an integer in 0..4294967295"),
    (Ping(True), "Ping time must be an integer"),
    (Ping(1.5), "Ping time must be an integer"),
    (Message(-1, 0, b""), "Message id must be an integer in 0..18446744073709551615"),
    (Message(2**64, 0, b""), "Message id must be an integer"),
    (Message(0, 2**32, b""), "Message topic id must be an integer in 0..4294967295"),
    (Message(0, -1, b""), "Message topic id must be an integer"),
    (Message(0, 0, "text"), "Message body must be bytes"),
    (Subscribed(2**32, b"t"), "Subscribed topic id must be an integer"),
    (Subscribed(-1, b"t"), "Subscribed topic id must be an integer"),
    (Unsubscribed(2**32, b"t"), "Unsubscribed topic id must be an integer"),
    (Subscribed(1, "t"), "Subscribed topic must be bytes"),
    (Error(b"bytes"), "Error text must be str"),
    (Connect(1, b"x"), "a server cannot send Connect"),
    (Publish(b"t", b"b"), "a server cannot send Publish"),
    (Version(1), "a server cannot send Version"),
    (Invalid("x"), "a server cannot send Invalid"),
    ("not an event", "a server cannot send str"),
]


@pytest.mark.parametrize(("event", "fragment"), SERVER_MISUSE, ids=[repr(e) for e, _ in SERVER_MISUSE])
def test_server_send_misuse_is_value_error(event: object, fragment: str) -> None:
    server = open_server()
    with pytest.raises(ValueError, match=re.escape(fragment)):
        server.send(event)
    assert server.state == "open"


def test_client_send_before_open_is_value_error() -> None:
    client = sexp.ClientConnection()
    with pytest.raises(ValueError, match="state 'version'"):
        client.send(Connect(1, b"me"))
    client.send(Version(1))
    with pytest.raises(ValueError, match="once"):
        client.send(Version(1))
    with pytest.raises(ValueError, match="state 'reply'"):
        client.send(Connect(1, b"me"))


CLIENT_MISUSE: list[tuple[object, str]] = [
    (Connect(2**63, b"x"), "Connect version must be an integer in -9223372036854775808..9223372036854775807"),
    (Connect(-(2**63) - 1, b"x"), "Connect version must be an integer"),
    (Connect(1.0, b"x"), "Connect version must be an integer"),
    (Connect(1, "x"), "Connect client id must be bytes"),
    (Subscribe(b"", REPLAY_CURRENT), "Subscribe topic must not be empty"),
    (Subscribe("t", REPLAY_CURRENT), "Subscribe topic must be bytes"),
    (Subscribe(b"t", "sometime"), "replay must be 'beginning', 'current' or a message id"),
    (Subscribe(b"t", -1), "replay message id must be an integer in 0..18446744073709551615"),
    (Subscribe(b"t", 2**64), "replay message id must be an integer"),
    (Subscribe(b"t", None), "replay message id must be an integer"),
    (Unsubscribe(b""), "Unsubscribe topic must not be empty"),
    (Unsubscribe(None), "Unsubscribe topic must be bytes"),
    (Ack(float("nan")), "Ack time must be finite"),
    (Ack(float("-inf")), "Ack time must be finite"),
    (Ack(2**63), "Ack time must be an integer"),
    (Ack(None), "Ack time must be an integer"),
    (Ack(b"1"), "Ack time must be an integer"),
    (Ack((b"a",)), "(date, time) pair"),
    (Ack((b"a", b"b", b"c")), "(date, time) pair"),
    (Ack(("a", b"b")), "Ack date must be bytes"),
    (Ack((b"a", 1)), "Ack time of day must be bytes"),
    (Publish(b"", b"x"), "Publish topic must not be empty"),
    (Publish(b"t", None), "Publish body must be bytes"),
    (Publish(b"t", "text"), "Publish body must be bytes"),
    (Ping(1), "a client cannot send Ping"),
    (Message(1, 1, b""), "a client cannot send Message"),
    (VersionReply(1), "a client cannot send VersionReply"),
    ("not an event", "a client cannot send str"),
]


@pytest.mark.parametrize(("event", "fragment"), CLIENT_MISUSE, ids=[repr(e) for e, _ in CLIENT_MISUSE])
def test_client_send_misuse_is_value_error(event: object, fragment: str) -> None:
    client = open_client()
    with pytest.raises(ValueError, match=re.escape(fragment)):
        client.send(event)
    assert client.state == "open"


def test_version_out_of_range_is_value_error() -> None:
    with pytest.raises(ValueError, match="Version number must be an integer"):
        sexp.ClientConnection().send(Version(2**63))
    client = sexp.ClientConnection()
    with pytest.raises(ValueError, match="Version number must be an integer"):
        client.send(Version(-(2**63) - 1))
    assert client.state == "version"


def test_constructor_limits_are_checked() -> None:
    with pytest.raises(ValueError, match="max_line must be at least 1"):
        sexp.ServerConnection(max_line=0)
    with pytest.raises(ValueError, match="max_frame must be at least 1"):
        sexp.ClientConnection(max_frame=0)


# ---------------------------------------------------------------------------- quote_atom, dumps, parse

QUOTING: list[tuple[bytes, bytes]] = [
    (b"abc", b"abc"),
    (b"my-client", b"my-client"),
    (b"From_message", b"From_message"),
    (b"a'b", b"a'b"),
    (b"#", b"#"),
    (b"|", b"|"),
    (b"a#b|c", b"a#b|c"),
    (b"|a#", b"|a#"),
    (b"", b'""'),
    (b"a b", b'"a b"'),
    (b'x"y', b'"x\\"y"'),
    (b"a\\b", b'"a\\\\b"'),
    (b"(", b'"("'),
    (b")", b'")"'),
    (b";", b'";"'),
    (b"#|", b'"#|"'),
    (b"a|#", b'"a|#"'),
    (b"\n\t\r\b", b'"\\n\\t\\r\\b"'),
    (b"\x00\x01\x1f", b'"\\000\\001\\031"'),
    (b"\x0b\x0c", b'"\\011\\012"'),
    (b"\x7f", b'"\\127"'),
    (b"caf\xc3\xa9", b'"caf\\195\\169"'),
    (b"\xff", b'"\\255"'),
]


@pytest.mark.parametrize(("atom", "written"), QUOTING, ids=[repr(atom) for atom, _ in QUOTING])
def test_quote_atom_follows_sexplib(atom: bytes, written: bytes) -> None:
    assert sexp.quote_atom(atom) == written
    assert sexp.parse(written) == atom


def test_dumps_machine_form() -> None:
    assert sexp.dumps([b"a", b"b", [b"c", b"d"]]) == b"(a b (c d))"
    assert sexp.dumps([]) == b"()"
    assert sexp.dumps([[], [[]]]) == b"(() (()))"
    assert sexp.dumps(b"atom") == b"atom"
    assert sexp.dumps(b"") == b'""'
    assert sexp.dumps([[b"id", b"3"], [b"topic", b"orders"]]) == b"((id 3) (topic orders))"
    assert sexp.dumps([b"Publish", b"a b", b'x"y']) == b'(Publish "a b" "x\\"y")'
    with pytest.raises(TypeError):
        sexp.dumps([b"a", 1])


def test_dumps_and_parse_handle_deep_trees_without_recursion() -> None:
    tree: sexp.Sexp = [b"leaf"]
    for _ in range(200):
        tree = [tree]
    text = sexp.dumps(tree)
    assert text == b"(" * 201 + b"leaf" + b")" * 201
    parsed = sexp.parse(text)
    for _ in range(201):
        assert isinstance(parsed, list)
        assert len(parsed) == 1
        parsed = parsed[0]
    assert parsed == b"leaf"


@pytest.mark.parametrize(
    ("text", "value"),
    [
        (b"  (a b) ; comment", [b"a", b"b"]),
        (b"; first\n(a ; inside\n b)\n", [b"a", b"b"]),
        (b'"multi\\\n    line"', b"multiline"),
        (b'"crlf\\\r\n\tcontinued"', b"crlfcontinued"),
        (b'"raw\nnewline"', b"raw\nnewline"),
        (b"a#;b", b"a#"),  # only a token that starts with #; is a sexp comment
        (b"##", b"##"),
        (b"t", b"t"),
        (b"[x]", b"[x]"),
        (b"'x", b"'x"),
        (b"1.5", b"1.5"),
    ],
)
def test_parse(text: bytes, value: sexp.Sexp) -> None:
    assert sexp.parse(text) == value


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (b"", "found none"),
        (b"  ; only a comment", "found none"),
        (b"a b", "found 2"),
        (b"(a) (b)", "found 2"),
        (b"(a", "unbalanced '('"),
        (b"a)", "unbalanced ')'"),
        (b'"abc', "unterminated"),
        (b"#|x|#", "block comments"),
        (b"#;a b", "(#;)"),
        (b'"\\300"', "above 255"),
    ],
)
def test_parse_refuses(text: bytes, fragment: str) -> None:
    with pytest.raises(ProtocolError) as info:
        sexp.parse(text)
    assert fragment in str(info.value)


# ------------------------------------------------------------------------------------------- hypothesis

# Pieces that exercise quoting, escapes, comment delimiters and the newline.
PIECES = [b"", b" ", b'"', b"\\", b"(", b")", b";", b"#|", b"|#", b"#", b"|", b"#;", b"\n", b"\r", b"\t",
          b"\x00", b"\x0c", b"\x7f", b"\xff", b"\xc3\xa9", b"a", b"From_beginning", b"1", b"\\233", b"\\x"]
atoms = st.one_of(st.binary(max_size=16), st.lists(st.sampled_from(PIECES), max_size=6).map(b"".join))
topics = atoms.filter(bool)
u32 = st.integers(0, 2**32 - 1)
u64 = st.integers(0, 2**64 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
replays = st.one_of(st.sampled_from([REPLAY_BEGINNING, REPLAY_CURRENT]), u64)
times = st.one_of(i64, st.floats(allow_nan=False, allow_infinity=False), st.tuples(atoms, atoms))
client_events = st.one_of(
    st.builds(Connect, i64, atoms),
    st.builds(Subscribe, topics, replays),
    st.builds(Unsubscribe, topics),
    st.builds(Ack, times),
    st.builds(Publish, topics, st.binary(max_size=64) | atoms),
)
server_events = st.one_of(
    st.builds(Error, st.text(max_size=24)),
    st.builds(Ping, u32),
    st.builds(Message, u64, u32, st.binary(max_size=64)),
    st.builds(Subscribed, u32, atoms),
    st.builds(Unsubscribed, u32, atoms),
)
chunk_sizes = st.lists(st.integers(1, 40), max_size=4)
trees = st.recursive(atoms, lambda children: st.lists(children, max_size=4), max_leaves=10)


def connected() -> tuple[sexp.ClientConnection, sexp.ServerConnection]:
    client = sexp.ClientConnection()
    server = sexp.ServerConnection()
    server.receive_data(client.send(Version(sexp.VERSION_ONE)))
    assert server.next_event() == Version(1)
    client.receive_data(server.send(VersionReply(1)))
    assert client.next_event() == VersionReply(1)
    return client, server


@ROUND_TRIP
@given(events=st.lists(client_events, max_size=4), sizes=chunk_sizes)
def test_client_events_round_trip(events: list[object], sizes: list[int]) -> None:
    client, server = connected()
    wire = b""
    for event in events:
        line = client.send(event)
        assert line.endswith(b"\n")
        assert line.count(b"\n") == 1
        wire += line
    received: list[object] = []
    for chunk in split(wire, sizes):
        server.receive_data(chunk)
        received += drain(server)
    assert received == events
    for sent, got in zip(events, received, strict=True):
        if isinstance(sent, Ack):
            assert type(got.time) is type(sent.time)


@ROUND_TRIP
@given(events=st.lists(server_events, max_size=4), sizes=chunk_sizes)
def test_server_events_round_trip(events: list[object], sizes: list[int]) -> None:
    client, server = connected()
    wire = b"".join(server.send(event) for event in events)
    received: list[object] = []
    for chunk in split(wire, sizes):
        client.receive_data(chunk)
        received += drain(client)
    assert received == events


def sexplib_compact(tree: sexp.Sexp) -> bytes:
    """sexplib's own to_string_mach: a space only between two bare atoms."""
    parts: list[bytes] = []

    def write(node: sexp.Sexp, may_need_space: bool) -> bool:
        if isinstance(node, bytes):
            written = sexp.quote_atom(node)
            bare = written == node
            if may_need_space and bare:
                parts.append(b" ")
            parts.append(written)
            return bare
        parts.append(b"(")
        need = False
        for child in node:
            need = write(child, need)
        parts.append(b")")
        return False

    write(tree, False)
    return b"".join(parts)


def tree_atoms(tree: sexp.Sexp) -> Iterator[bytes]:
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, bytes):
            yield node
        else:
            stack.extend(node)


@ROUND_TRIP
@given(tree=trees)
def test_trees_round_trip(tree: sexp.Sexp) -> None:
    text = sexp.dumps(tree)
    assert b"\n" not in text
    assert sexp.parse(text) == tree
    assert sexp.parse(b" ; lead\n" + text + b" ; trail") == tree
    assert sexp.parse(sexplib_compact(tree)) == tree
    for atom in tree_atoms(tree):
        written = sexp.quote_atom(atom)
        assert sexp.parse(written) == atom
        if written == atom:  # bare only when sexplib would leave it bare
            assert atom
            assert not any(byte <= 0x20 or byte >= 0x7F or byte in b'"();\\' for byte in atom)
            assert b"#|" not in atom
            assert b"|#" not in atom
        else:
            assert written.startswith(b'"')
            assert written.endswith(b'"')
            assert all(0x20 <= byte <= 0x7E for byte in written)


# ------------------------------------------------------------------------------------------------ fuzz

LINE_VOCABULARY = [b"(", b")", b'"', b"\\", b"\n", b"\r\n", b" ", b";", b"#|", b"|#", b"#;", b"Connect",
                   b"subscribe", b"Unsubscribe", b"Publish", b"Ack", b"From_message", b"From_beginning",
                   b"From_current", b"1", b"-1", b"18446744073709551616", b"1.5", b"1e999", b"\\233",
                   b"\\999", b"\\x", b"\xff", b"\x00", b"(Connect 1 me)\n", b"(Subscribe t (From_message 3))"]


def _check_server_event(event: object) -> None:
    if isinstance(event, Invalid):
        assert event.reason
        assert event.reason.isprintable()
        return
    assert isinstance(event, CLIENT_TYPES)
    # Whatever the server accepts, a client writes back to the same event.
    client, server = connected()
    server.receive_data(client.send(event))
    assert drain(server) == [event]


@FUZZ
@given(
    pieces=st.lists(st.binary(max_size=16) | st.sampled_from(LINE_VOCABULARY), max_size=40),
    sizes=chunk_sizes,
    max_line=st.sampled_from([8, 40, 4 << 20]),
)
def test_fuzz_server_never_raises_after_the_handshake(pieces: list[bytes], sizes: list[int],
                                                      max_line: int) -> None:
    server = open_server(max_line=max_line)
    for chunk in split(b"".join(pieces), sizes):
        server.receive_data(chunk)
        assert len(server._buffer) <= max_line
        for event in drain(server):
            _check_server_event(event)


@FUZZ
@given(wire=st.binary(max_size=200), sizes=chunk_sizes)
def test_fuzz_server_from_the_first_byte(wire: bytes, sizes: list[int]) -> None:
    server = sexp.ServerConnection()
    for chunk in split(wire, sizes):
        server.receive_data(chunk)
        for event in drain(server):
            if isinstance(event, Version):
                assert server.state == "reply"
                server.send(VersionReply(event.number))
            else:
                assert server.state == "open"
                assert isinstance(event, (*CLIENT_TYPES, Invalid))
    assert server.state == ("version" if len(wire) < 8 else "open" if wire[:8] != REFUSAL else "closed")


FRAME_VOCABULARY = [wire for wire, _ in SERVER_FRAMES] + [
    bytes.fromhex("00 00 00 00"), bytes.fromhex("ff ff ff ff"), bytes.fromhex("00 00 00 05"),
    bytes.fromhex("00 00 00 18 03"), b"((id 3) (topic orders))", b"(", b")", b'"', b"\x01", b"\x02",
]


@FUZZ
@given(pieces=st.lists(st.binary(max_size=16) | st.sampled_from(FRAME_VOCABULARY), max_size=20),
       sizes=chunk_sizes)
def test_fuzz_client_raises_only_protocol_error(pieces: list[bytes], sizes: list[int]) -> None:
    client = open_client(max_frame=1 << 16)
    received: list[object] = []
    refused: ProtocolError | None = None
    try:
        for chunk in split(b"".join(pieces), sizes):
            client.receive_data(chunk)
            received += drain(client)
    except ProtocolError as error:
        refused = error
    if refused is not None:
        assert str(refused)
        assert client.state == "closed"
        assert client.next_event() is None
    else:
        assert client.state == "open"
    assert all(isinstance(event, SERVER_TYPES[1:]) for event in received)
    # Every frame read back encodes to an equivalent frame (Error text may have gained U+FFFD).
    server = open_server()
    for event in received:
        again = open_client()
        again.receive_data(server.send(event))
        assert drain(again) == [event]


def test_the_trusted_message_frame_is_what_send_writes() -> None:
    server = sexp.ServerConnection()
    server.receive_data(b"\x00" * 7 + b"\x01")
    assert server.next_event() == sexp.Version(1)
    server.send(sexp.VersionReply(1))
    for message_id, topic_id, body in ((7, 3, b"hi"), (2**64 - 1, 2**32 - 1, b""), (1, 0, b"\x00" * 300)):
        assert sexp.message_frame(message_id, topic_id, body) == server.send(
            sexp.Message(message_id, topic_id, body))
    assert sexp.message_frame(7, 3, b"hi") == bytes.fromhex("0000000f02000000000000000700000003") + b"hi"


# --------------------------------------------------------------------------- quoted atoms read in pieces

#: The escapes as sexplib's lexer reads them, decoded one match at a time: the reference the piecewise reader
#: (split, table lookup, join) must agree with, whatever the pieces it cuts the text into.
REFERENCE_ESCAPE = re.compile(rb"""\\(?:\r?\n[ \t]*|([0-9]{3})|x([0-9a-fA-F]{2})|([\\"'ntbr ]))""")
REFERENCE_SIMPLE = {b"\\": b"\\", b'"': b'"', b"'": b"'", b"n": b"\n", b"t": b"\t", b"b": b"\b", b"r": b"\r",
                    b" ": b" "}
REFERENCE_TOKEN = re.compile(
    rb"""[ \t\n\r\x0c]+|;[^\n\r]*|(\()|(\))|"([^"\\]*(?:\\.[^"\\]*)*)"|([^ \t\n\r\x0c()";]+)""", re.DOTALL
)


def reference_unescape(body: bytes) -> bytes:
    def one(match: re.Match[bytes]) -> bytes:
        decimal, hexadecimal, simple = match.groups()
        if simple is not None:
            return REFERENCE_SIMPLE[simple]
        if decimal is not None:
            if int(decimal) > 255:
                raise ProtocolError("above 255")
            return bytes((int(decimal),))
        if hexadecimal is not None:
            return bytes((int(hexadecimal, 16),))
        return b""

    return REFERENCE_ESCAPE.sub(one, body)


def reference_atoms(text: bytes) -> list[bytes]:
    """The top-level atoms of a text without lists, read one regex token at a time (the reader as it was)."""
    atoms, position = [], 0
    while position < len(text):
        token = REFERENCE_TOKEN.match(text, position)
        if token is None:
            raise ProtocolError("unterminated")
        position = token.end()
        if token.lastindex == 3:
            atoms.append(reference_unescape(token.group(3)))
        elif token.lastindex == 4:
            atoms.append(token.group(4))
    return atoms


#: Bytes that make escapes, cut them, close or fake-close atoms, and continue lines.
ESCAPE_SOUP = st.lists(
    st.sampled_from([b"\\", b"\\\\", b'\\"', b'"', b"1", b"25", b"255", b"256", b"x", b"4f", b"G", b"n",
                     b"\r", b"\n", b"  ", b"\t", b"a", b"\\x", b"\\9", b"\\099", b"\xff"]),
    max_size=400,
)


def read_as_the_reference(text: bytes) -> None:
    try:
        wanted: list[bytes] | None = reference_atoms(text)
    except ProtocolError:
        wanted = None
    try:
        values = sexp._parse_all(text)
    except ProtocolError:
        assert wanted is None, "refused what the lexer reads"
        return
    assert values == wanted, "read otherwise than the lexer" if wanted is not None else "read what it refuses"


@FUZZ
@given(soup=ESCAPE_SOUP, filler=st.integers(0, 3000))
def test_quoted_atoms_read_in_pieces_decode_as_the_escape_rules_say(soup: list[bytes], filler: int) -> None:
    # Filler moves the interesting bytes across the reader's piece boundaries (256 bytes, doubling).
    read_as_the_reference(b'"' + b"f" * filler + b"".join(soup) + b'" tail')


@FUZZ
@given(soup=ESCAPE_SOUP, filler=st.integers(0, 3000), bulk_from=st.sampled_from([1, 4, 256]))
def test_the_bulk_decoder_reads_every_piece_as_the_escape_rules_say(soup: list[bytes], filler: int,
                                                                    bulk_from: int) -> None:
    # protocol.ocaml_escapes takes pieces from bulk_from bytes on instead of 4 KiB, so that every escape,
    # run of backslashes and quote meets it at every distance from a piece's end, however few the escapes.
    with mock.patch.object(ocaml_escapes, "MIN_PIECE", bulk_from), \
            mock.patch.object(ocaml_escapes, "SPARSE", 1 << 40):
        read_as_the_reference(b'"' + b"f" * filler + b"".join(soup) + b'" tail')


@FUZZ
@given(soup=ESCAPE_SOUP, filler=st.integers(0, 9000))
def test_pieces_of_the_bulk_decoders_own_size_decode_as_the_escape_rules_say(soup: list[bytes],
                                                                            filler: int) -> None:
    # The same with the pieces as they come (4 KiB and more go to the bulk decoder), the soup repeated so
    # that a piece holds a lot of it.
    read_as_the_reference(b'"' + b"f" * filler + b"".join(soup) * 20 + b'" tail')


def test_the_bulk_decoder_leaves_short_pieces_and_continuations_to_the_general_reader() -> None:
    assert ocaml_escapes.decode(b"\\065" * 10, complete=True) is None  # shorter than MIN_PIECE
    assert ocaml_escapes.decode(b"\\065" * 10 + b"x" * 5000, complete=True) is None  # few escapes (SPARSE)
    continued = b"\\065" * 2000 + b"\\\n   x"
    assert ocaml_escapes.decode(continued, complete=True) is None
    assert sexp.parse(b'"' + continued + b'"') == b"A" * 2000 + b"x"
    # A raw line end that no backslash begins is text like any other.
    decoded, used, closed = ocaml_escapes.decode(b"\\065" * 2000 + b'\n"rest', complete=False)
    assert (decoded, used, closed) == (b"A" * 2000 + b"\n", 8002, True)


def test_the_bulk_decoder_leaves_an_escape_cut_by_the_pieces_end_to_the_next_piece() -> None:
    text = b"\\065" * 2000
    for tail, kept in ((b"\\", 0), (b"\\0", 0), (b"\\06", 0), (b"\\x4", 0), (b"\\\\", 2), (b"\\n", 2),
                       (b"\\q", 0), (b"\\\\\\", 2)):
        decoded, used, closed = ocaml_escapes.decode(text + tail, complete=False)
        assert not closed
        assert used == len(text) + kept, tail
        assert decoded == b"A" * 2000 + (ocaml_escapes.decode(b"\\065" * 2000 + tail, True) or (b"",))[0][
            2000:2000 + kept // 2], tail


@ROUND_TRIP
@given(body=st.binary(max_size=5000), filler=st.integers(0, 600))
def test_binary_bodies_round_trip_across_piece_boundaries(body: bytes, filler: int) -> None:
    line = b"(Publish " + b"t" * (filler + 1) + b" " + sexp.quote_atom(body) + b")"
    assert sexp.parse(line) == [b"Publish", b"t" * (filler + 1), body]


def test_a_long_line_is_read_in_steps_with_busy_set_between_them() -> None:
    body = bytes(range(256)) * 2048  # 512 KiB, almost every byte an escape: about 2 MiB of line
    line = b"(Publish t " + sexp.quote_atom(body) + b")\n"
    server = open_server(max_line=4 << 20)
    server.receive_data(line + b"(Unsubscribe t)\n")
    steps = 0
    while (event := server.next_event()) is None:
        assert server.busy
        steps += 1
    assert event == Publish(b"t", body)
    assert steps == len(line) // sexp.SLICE_BYTES
    assert not server.busy
    assert server.next_event() == Unsubscribe(b"t")
    assert server.buffered == 0


def test_long_bare_atoms_whitespace_and_comments_are_read_whole() -> None:
    atom = b"a#" * 70_000 + b"b"
    text = b"(" + atom + b" " * 70_000 + b"x) ;" + b"c" * 70_000
    assert sexp.parse(text) == [atom, b"x"]
    with pytest.raises(ProtocolError, match="block comments"):
        sexp.parse(b"(" + b"a" * (64 << 10) + b"|#)")


def test_an_escape_above_255_is_named() -> None:
    with pytest.raises(ProtocolError, match=r"escape \\300 is above 255"):
        sexp.parse(b'"' + b"\\001" * 1000 + b'\\300"')
