"""The msgq codec (protocol/msgq.py): the 103-byte worked example from PROTOCOLS.md, wire vectors for every
item type and length form, smallest-form encoding at the length boundaries, every routing message in both
directions, stream framing fed whole, byte by byte and followed by the next message, every malformed input
(refused with ProtocolError), hypothesis round-trips of nested items and routing events, and fuzzing whose
only allowed failure is ProtocolError.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Callable
from typing import TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import ProtocolError, msgq
from protocol.msgq import (
    Connection,
    GetLname,
    Item,
    LnameReply,
    Send,
    Stats,
    StatsReply,
    Subscribe,
    Unknown,
    Unsubscribe,
)

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ROUND_TRIP = settings(max_examples=300, deadline=None)

MAGIC = b"Skan"
T = TypeVar("T")

# PROTOCOLS.md section 3: the seed's worked example, correctly encoded (keys from, to, seq, data).
WORKED_EXAMPLE = bytes.fromhex(
    "53 6b 61 6e 04 66 72 6f 6d 21 0b 73 65 6e 64 65 72 40 68 6f 73 74 02 74 6f 21 0e 72 65 63 69 70"
    "69 65 6e 74 40 68 6f 73 74 03 73 65 71 21 04 31 32 33 34 04 64 61 74 61 22 2d 04 6c 69 73 74 23"
    "0d 21 01 31 21 01 32 04 21 04 74 68 69 73 0b 64 65 73 63 72 69 70 74 69 6f 6e 21 0b 46 75 6e 20"
    "66 6f 72 20 61 6c 6c"
)
# Read off the bytes: "data" is a HASH (0x22, 45 bytes) holding "list", a LIST (0x23, 13 bytes) of
# "1", "2", NULL (the lone 0x04) and "this", then "description".
WORKED_FIELDS: dict[bytes, Item] = {
    b"from": b"sender@host",
    b"to": b"recipient@host",
    b"seq": b"1234",
    b"data": {b"list": [b"1", b"2", None, b"this"], b"description": b"Fun for all"},
}


def frame(message: bytes) -> bytes:
    """A message with its u32 stream length in front."""
    return struct.pack(">I", len(message)) + message


def ordered(item: Item) -> object:
    """``item`` with every HASH turned into its list of pairs, so comparisons see the wire order."""
    if isinstance(item, dict):
        return [(tag, ordered(value)) for tag, value in item.items()]
    if isinstance(item, list):
        return [ordered(element) for element in item]
    return item


def feed_whole(stream: bytes, **kwargs: int) -> list[msgq.Event]:
    connection = Connection(**kwargs)
    connection.receive_data(stream)
    return drain(connection)


def feed_bytewise(stream: bytes) -> list[msgq.Event]:
    connection = Connection()
    events: list[msgq.Event] = []
    for index in range(len(stream)):
        connection.receive_data(stream[index : index + 1])
        events += drain(connection)
    return events


def drain(connection: Connection) -> list[msgq.Event]:
    events = []
    while (event := connection.next_event()) is not None:
        events.append(event)
    return events


# ------------------------------------------------------------------------------------ worked example


def test_worked_example_encodes_to_the_103_bytes() -> None:
    encoded = msgq.encode_message(WORKED_FIELDS)
    assert encoded == WORKED_EXAMPLE
    assert len(encoded) == 103
    assert frame(encoded)[:4] == bytes.fromhex("00 00 00 67")


def test_worked_example_decodes_to_the_nested_structure_in_wire_order() -> None:
    fields = msgq.decode_message(WORKED_EXAMPLE)
    assert fields == WORKED_FIELDS
    assert ordered(fields) == ordered(WORKED_FIELDS)
    data = fields[b"data"]
    assert isinstance(data, dict)
    assert data[b"list"] == [b"1", b"2", None, b"this"]


@pytest.mark.parametrize("bytewise", [False, True], ids=["whole", "bytewise"])
def test_worked_example_has_no_type_so_the_stream_refuses_it_and_carries_on(bytewise: bool) -> None:
    # It is a bare message, not a routing one: framing and decoding succeed, to_event names the missing
    # field, and the message after it is unaffected.
    stream = frame(WORKED_EXAMPLE) + frame(MAGIC + b"\x04type\x21\x08getlname")
    assert stream[:4] == bytes.fromhex("00 00 00 67")
    connection = Connection()
    events: list[msgq.Event] = []
    errors: list[str] = []
    chunks = [stream[i : i + 1] for i in range(len(stream))] if bytewise else [stream]
    for chunk in chunks:
        connection.receive_data(chunk)
        while True:
            try:
                event = connection.next_event()
            except ProtocolError as error:
                errors.append(str(error))
                continue
            if event is None:
                break
            events.append(event)
    assert errors == ["a message needs the field 'type'"]
    assert events == [GetLname()]


def test_worked_example_as_a_send_forwards_intact() -> None:
    fields = {b"type": b"send", **WORKED_FIELDS, b"group": b"Boss", b"instance": b"*", b"msg": None}
    event = msgq.to_event(fields)
    assert event == Send(b"sender@host", b"recipient@host", b"Boss", b"*", b"1234", None,
                         extra={b"data": WORKED_FIELDS[b"data"]})
    assert msgq.from_event(event) == fields


# ------------------------------------------------------------------------------------------- item vectors

# (wire bytes, item, whether this is the encoder's smallest form)
ITEM_VECTORS: list[tuple[bytes, Item, bool]] = [
    (b"\x04", None, True),
    (b"\x21\x00", b"", True),
    (b"\x21\x03abc", b"abc", True),
    (b"\x11\x00\x03abc", b"abc", False),  # 2-byte length
    (b"\x01\x00\x00\x00\x03abc", b"abc", False),  # 4-byte length
    (b"\x11\x00\x00", b"", False),
    (b"\x01\x00\x00\x00\x00", b"", False),
    (b"\x21\x02\x00\xff", b"\x00\xff", True),
    (b"\x22\x00", {}, True),
    (b"\x12\x00\x00", {}, False),
    (b"\x02\x00\x00\x00\x00", {}, False),
    (b"\x23\x00", [], True),
    (b"\x13\x00\x00", [], False),
    (b"\x03\x00\x00\x00\x00", [], False),
    (b"\x22\x05\x01a\x21\x01b", {b"a": b"b"}, True),
    (b"\x22\x08\x01a\x21\x01b\x01n\x04", {b"a": b"b", b"n": None}, True),
    (b"\x22\x08\x01n\x04\x01a\x21\x01b", {b"n": None, b"a": b"b"}, True),  # order kept
    (b"\x23\x08\x21\x01x\x04\x23\x00\x22\x00", [b"x", None, [], {}], True),
    (b"\x23\x03\x04\x04\x04", [None, None, None], True),
    (b"\x22\x05\x01l\x23\x01\x04", {b"l": [None]}, True),
    (b"\x23\x04\x22\x00\x23\x00", [{}, []], True),
    (b"\x12\x00\x0b\x01a\x01\x00\x00\x00\x01x\x01b\x04", {b"a": b"x", b"b": None}, False),  # mixed forms
    (b"\x12\x01\x01\xff" + b"t" * 255 + b"\x04", {b"t" * 255: None}, True),  # longest tag
    (b"\x22\x04\x01\xff\x21\x00", {b"\xff": b""}, True),  # tags are bytes, not text
]


@pytest.mark.parametrize(("wire", "item", "smallest"), ITEM_VECTORS)
def test_item_vector_decodes(wire: bytes, item: Item, smallest: bool) -> None:
    decoded = msgq.decode_item(wire)
    assert decoded == item
    assert ordered(decoded) == ordered(item)
    assert type(decoded) is type(item)


@pytest.mark.parametrize(("wire", "item", "smallest"), ITEM_VECTORS)
def test_item_vector_encodes_in_the_smallest_form(wire: bytes, item: Item, smallest: bool) -> None:
    encoded = msgq.encode_item(item)
    assert (encoded == wire) is smallest
    assert len(encoded) <= len(wire)


def vector_stream(wire: bytes) -> bytes:
    """The item vector carried as field "v" of a message of unknown type "vector"."""
    return frame(MAGIC + b"\x04type\x21\x06vector\x01v" + wire)


@pytest.mark.parametrize(("wire", "item", "smallest"), ITEM_VECTORS)
def test_item_vector_through_the_stream(wire: bytes, item: Item, smallest: bool) -> None:
    expected = Unknown({b"type": b"vector", b"v": item})
    stream = vector_stream(wire)
    assert feed_whole(stream) == [expected]
    assert feed_bytewise(stream) == [expected]
    # Followed by the next message and the start of a third: two events, the rest waits.
    following = frame(MAGIC + b"\x04type\x21\x05stats")
    assert feed_whole(stream + following + following[:7]) == [expected, Stats()]
    assert feed_bytewise(stream + following) == [expected, Stats()]


def _sized(kind: str, size: int) -> Item:
    """A DATA, LIST or HASH whose content (after its header) is exactly ``size`` bytes."""
    if kind == "DATA":
        return b"x" * size
    if kind == "LIST":
        return [None] * size
    # One entry, tag b"k" (2 bytes) + a DATA whose header grows with its length.
    for value_size in range(size - 7, size - 3):
        header = 2 if value_size <= 0xFF else 3 if value_size <= 0xFFFF else 5
        if 2 + header + value_size == size:
            return {b"k": b"v" * value_size}
    raise AssertionError(size)


TYPE_BITS = {"DATA": 0x01, "HASH": 0x02, "LIST": 0x03}


@pytest.mark.parametrize("kind", ["DATA", "HASH", "LIST"])
@pytest.mark.parametrize(
    ("size", "header_tail"),
    [
        (0, b"\x20\x00"),
        (255, b"\x20\xff"),
        (256, b"\x10\x01\x00"),
        (65535, b"\x10\xff\xff"),
        (65536, b"\x00\x00\x01\x00\x00"),
    ],
)
def test_smallest_length_form_at_the_boundaries(kind: str, size: int, header_tail: bytes) -> None:
    item = _sized(kind, size) if size else {"DATA": b"", "HASH": {}, "LIST": []}[kind]
    encoded = msgq.encode_item(item)
    header = bytes((header_tail[0] | TYPE_BITS[kind],)) + header_tail[1:]
    assert encoded[: len(header)] == header
    assert len(encoded) == len(header) + size
    assert msgq.decode_item(encoded) == item


@pytest.mark.parametrize(
    ("size", "width"),
    [(size, width) for width in (1, 2, 4) for size in (0, 1, 255, 256, 65535, 65536, 70000)
     if size < 1 << (8 * width)],
)
def test_every_length_form_decodes(size: int, width: int) -> None:
    code = {1: 0x20, 2: 0x10, 4: 0x00}[width]
    wire = bytes((0x01 | code,)) + size.to_bytes(width, "big") + b"d" * size
    assert msgq.decode_item(wire) == b"d" * size
    assert msgq.decode_item(b"\x03" + struct.pack(">I", len(wire)) + wire) == [b"d" * size]  # in a LIST


# ---------------------------------------------------------------------------------------- routing vectors

# (message bytes after the magic, in the encoder's field order; the event they mean)
ROUTING_VECTORS: list[tuple[bytes, msgq.Event]] = [
    (b"\x04type\x21\x08getlname", GetLname()),
    (b"\x04type\x21\x08getlname\x05lname\x21\x07a1@host", LnameReply(b"a1@host")),
    (
        b"\x04type\x21\x09subscribe\x05group\x21\x04Boss\x08instance\x21\x01*\x07subtype\x21\x06normal",
        Subscribe(b"Boss"),
    ),
    (
        b"\x04type\x21\x09subscribe\x05group\x21\x04Boss\x08instance\x21\x02i1\x07subtype\x21\x06meonly",
        Subscribe(b"Boss", b"i1", "meonly"),
    ),
    (
        b"\x04type\x21\x09subscribe\x05group\x21\x01g\x08instance\x21\x01*\x07subtype\x21\x07promisc"
        b"\x06replay\x21\x011",
        Subscribe(b"g", subtype="promisc", extra={b"replay": b"1"}),
    ),
    (b"\x04type\x21\x0bunsubscribe\x05group\x21\x04Boss\x08instance\x21\x01*", Unsubscribe(b"Boss")),
    (b"\x04type\x21\x0bunsubscribe\x05group\x21\x01g\x08instance\x21\x02i1", Unsubscribe(b"g", b"i1")),
    (
        b"\x04type\x21\x04send\x04from\x21\x04me@h\x02to\x21\x01*\x05group\x21\x04Boss\x08instance\x21\x01*"
        b"\x03seq\x21\x017\x03msg\x22\x0e\x07command\x23\x04\x21\x02go\x04repl\x21\x013",
        Send(b"me@h", b"*", b"Boss", b"*", b"7", {b"command": [b"go"]}, b"3"),
    ),
    (
        b"\x04type\x21\x04send\x04from\x21\x01a\x02to\x21\x01b\x05group\x21\x01g\x08instance\x21\x01i"
        b"\x03seq\x21\x00\x03msg\x04\x04want\x21\x03ack",
        Send(b"a", b"b", b"g", b"i", b"", None, extra={b"want": b"ack"}),
    ),
    (b"\x04type\x21\x05stats", Stats()),
    (
        b"\x04type\x21\x05stats\x05stats\x22\x0d\x08received\x21\x0212",
        StatsReply({b"received": b"12"}),
    ),
    (b"\x04type\x21\x04ping\x01x\x04", Unknown({b"type": b"ping", b"x": None})),
]


@pytest.mark.parametrize(("body", "event"), ROUTING_VECTORS)
def test_routing_vector_both_ways(body: bytes, event: msgq.Event) -> None:
    assert Connection().send(event) == frame(MAGIC + body)
    assert msgq.encode_message(msgq.from_event(event)) == MAGIC + body
    assert msgq.to_event(msgq.decode_message(MAGIC + body)) == event


@pytest.mark.parametrize(("body", "event"), ROUTING_VECTORS)
def test_routing_vector_fed_whole_bytewise_and_with_the_next_message(body: bytes, event: msgq.Event) -> None:
    stream = frame(MAGIC + body)
    following = frame(MAGIC + b"\x04type\x21\x08getlname")
    assert feed_whole(stream) == [event]
    assert feed_bytewise(stream) == [event]
    assert feed_whole(stream + following) == [event, GetLname()]
    assert feed_bytewise(stream + stream + following) == [event, event, GetLname()]


# Shapes the encoder never writes but a peer may: decoded leniently.
LENIENT_VECTORS: list[tuple[bytes, msgq.Event]] = [
    (b"\x04type\x21\x09subscribe\x05group\x21\x01g", Subscribe(b"g", b"*", "normal")),
    (b"\x05group\x21\x01g\x04type\x21\x0bunsubscribe", Unsubscribe(b"g", b"*")),  # any field order
    (
        b"\x04type\x21\x04send\x04from\x21\x01a\x02to\x21\x01*\x05group\x21\x01g\x08instance\x21\x01*"
        b"\x03msg\x21\x02hi",
        Send(b"a", b"*", b"g", b"*", b"", b"hi"),  # no seq
    ),
    (b"\x05stats\x22\x05\x01n\x21\x010", StatsReply({b"n": b"0"})),  # the spec's shape: no type
    (b"\x04type\x21\x08getlname\x05extra\x04", GetLname()),  # fields beyond the model are ignored here
    (b"\x04type\x21\x05stats\x01x\x21\x00", Stats()),
    (b"\x04type\x21\x00", Unknown({b"type": b""})),
]


@pytest.mark.parametrize(("body", "event"), LENIENT_VECTORS)
def test_lenient_shapes_decode(body: bytes, event: msgq.Event) -> None:
    assert feed_whole(frame(MAGIC + body)) == [event]
    # The encoder's own shape of the same event decodes to it again.
    assert msgq.to_event(msgq.decode_message(msgq.encode_message(msgq.from_event(event)))) == event


def test_extra_does_not_share_a_default_between_events() -> None:
    first, second = Subscribe(b"g"), Subscribe(b"g")
    assert first.extra == {}
    assert first.extra is not second.extra
    assert Send(b"a", b"b", b"g", b"i", b"", None).extra is not Send(b"a", b"b", b"g", b"i", b"", None).extra


def test_events_are_frozen() -> None:
    with pytest.raises(AttributeError):
        Subscribe(b"g").group = b"h"  # type: ignore[misc]


# ------------------------------------------------------------------------------------------------ errors


def nested_lists(depth: int) -> bytes:
    """``depth`` LISTs inside each other, each with a 4-byte length (so any depth fits), built in one go."""
    headers = [b"\x03" + struct.pack(">I", 5 * (depth - 2 - level) + 2) for level in range(depth - 1)]
    return b"".join(headers) + b"\x23\x00"


ITEM_ERRORS: list[tuple[bytes, str]] = [
    (b"", "input is empty"),
    (b"\x21", "ends inside the 1-byte length"),
    (b"\x11\x00", "ends inside the 2-byte length"),
    (b"\x01\x00\x00", "ends inside the 4-byte length"),
    (b"\x21\x05ab", "DATA item of 5 bytes runs past the end of its input"),
    (b"\x01\x00\x01\x00\x00abc", "65536 bytes runs past"),
    (b"\x04\x00", "1 trailing bytes"),
    (b"\x21\x01ab", "1 trailing bytes"),
    (b"\x23\x00\x04", "1 trailing bytes"),
    (b"\x31\x00", "invalid length code 0x30"),
    (b"\x32\x00", "invalid length code 0x30"),
    (b"\x61\x00", "unused high bits"),
    (b"\x81\x00", "unused high bits"),
    (b"\xc4", "unused high bits"),
    (b"\x00", "unknown item type 0x00"),
    (b"\x25\x00", "unknown item type 0x05"),
    (b"\x0f", "unknown item type 0x0f"),
    (b"\x14", "NULL must be the single byte 0x04"),
    (b"\x24\x00", "NULL must be the single byte 0x04"),
    (b"\x34", "NULL must be the single byte 0x04"),
    (b"\x22\x02\x00\x04", "zero-length tag in a HASH"),
    (b"\x22\x02\x05a", "tag of 5 bytes runs past the end of its HASH"),
    (b"\x22\x02\x01a", "tag 'a' has no item"),
    (b"\x22\x04\x01a\x21\x05", "DATA item of 5 bytes runs past the end of its HASH"),
    (b"\x22\x04\x01a\x21\x05abcde", "runs past the end of its HASH"),  # the bytes exist, outside the HASH
    (b"\x23\x02\x21\x05", "runs past the end of its LIST"),
    (b"\x23\x01\x21", "ends inside the 1-byte length"),
    (b"\x22\x06\x01a\x04\x01a\x04", "tag 'a' appears twice in one HASH"),
    (b"\x23\x02\x31\x00", "invalid length code"),  # faults are found inside containers too
    (b"\x22\x03\x01k\x05", "unknown item type"),
    (nested_lists(msgq.MAX_DEPTH + 1), f"nested deeper than {msgq.MAX_DEPTH}"),
    (nested_lists(5000), f"nested deeper than {msgq.MAX_DEPTH}"),  # far past Python's recursion limit
]


@pytest.mark.parametrize(("wire", "text"), ITEM_ERRORS)
def test_item_errors(wire: bytes, text: str) -> None:
    with pytest.raises(ProtocolError) as info:
        msgq.decode_item(wire)
    assert text in str(info.value)


def test_nesting_up_to_the_limit_decodes() -> None:
    item = msgq.decode_item(nested_lists(msgq.MAX_DEPTH))
    depth = 0
    while item is not None:
        assert isinstance(item, list)
        depth += 1
        item = item[0] if item else None
    assert depth == msgq.MAX_DEPTH


MESSAGE_ERRORS: list[tuple[bytes, str]] = [
    (b"", "0 bytes is too short for the 4-byte magic"),
    (b"Ska", "3 bytes is too short"),
    (b"SKAN", "bad magic 0x534b414e"),
    (b"\x00\x00\x00\x00\x04type\x04", "bad magic"),
    (MAGIC + b"\x00\x04", "zero-length tag in a message"),
    (MAGIC + b"\x04type", "tag 'type' has no item"),
    (MAGIC + b"\x04ty", "runs past the end of its message"),
    (MAGIC + b"\x01a\x04\x01a\x21\x00", "tag 'a' appears twice in one message"),
    (MAGIC + b"\x01a\x21\x02x", "runs past the end of its message"),
    (MAGIC + b"\x01a" + nested_lists(msgq.MAX_DEPTH), "nested deeper than"),  # the body counts as one
]


@pytest.mark.parametrize(("wire", "text"), MESSAGE_ERRORS)
def test_message_errors(wire: bytes, text: str) -> None:
    with pytest.raises(ProtocolError) as info:
        msgq.decode_message(wire)
    assert text in str(info.value)


def test_empty_message_is_just_the_magic() -> None:
    assert msgq.encode_message({}) == MAGIC
    assert msgq.decode_message(MAGIC) == {}


def test_message_nesting_up_to_the_limit_decodes() -> None:
    assert msgq.decode_message(MAGIC + b"\x01a" + nested_lists(msgq.MAX_DEPTH - 1))[b"a"] is not None


@pytest.mark.parametrize(("wire", "text"), MESSAGE_ERRORS[2:])
def test_message_errors_through_the_stream_drop_only_that_message(wire: bytes, text: str) -> None:
    connection = Connection()
    connection.receive_data(frame(wire) + frame(MAGIC + b"\x04type\x21\x05stats"))
    with pytest.raises(ProtocolError) as info:
        connection.next_event()
    assert text in str(info.value)
    assert connection.next_event() == Stats()
    assert connection.next_event() is None


@pytest.mark.parametrize("length", [0, 1, 3])
def test_stream_length_too_short_for_the_magic(length: int) -> None:
    connection = Connection()
    connection.receive_data(struct.pack(">I", length))
    with pytest.raises(ProtocolError, match=f"{length} bytes is too short for the 4-byte magic"):
        connection.next_event()


def test_over_size_message_is_refused_as_soon_as_its_length_is_read() -> None:
    connection = Connection(max_message=100)
    connection.receive_data(struct.pack(">I", 101))  # no body at all yet
    with pytest.raises(ProtocolError, match="101 bytes is over the limit of 100"):
        connection.next_event()
    # The framing is lost for good: more input changes nothing, even a valid message.
    connection.receive_data(b"x" * 50 + frame(MAGIC + b"\x04type\x21\x05stats"))
    with pytest.raises(ProtocolError, match="over the limit"):
        connection.next_event()


def test_default_cap_is_64_kib_of_message() -> None:
    assert msgq.DEFAULT_MAX_MESSAGE == 65536
    connection = Connection()
    connection.receive_data(struct.pack(">I", 65537))
    with pytest.raises(ProtocolError, match="65537 bytes is over the limit of 65536"):
        connection.next_event()


def test_message_of_exactly_the_cap_is_accepted() -> None:
    fields: dict[bytes, Item] = {b"type": b"big", b"d": b""}
    overhead = len(msgq.encode_message(fields)) - 2 + 3  # the DATA header grows to 3 bytes (2-byte length)
    fields[b"d"] = b"z" * (msgq.DEFAULT_MAX_MESSAGE - overhead)
    stream = Connection().send(Unknown(fields))
    assert stream[:4] == struct.pack(">I", msgq.DEFAULT_MAX_MESSAGE)
    assert feed_whole(stream) == [Unknown(fields)]
    with pytest.raises(ProtocolError, match="over the limit"):
        feed_whole(stream, max_message=msgq.DEFAULT_MAX_MESSAGE - 1)


def test_incomplete_input_waits() -> None:
    stream = frame(MAGIC + b"\x04type\x21\x05stats")
    for cut in range(len(stream)):
        connection = Connection()
        connection.receive_data(stream[:cut])
        assert connection.next_event() is None
        connection.receive_data(stream[cut:])
        assert connection.next_event() == Stats()


def test_max_message_must_hold_the_magic() -> None:
    with pytest.raises(ValueError, match="at least 4"):
        Connection(max_message=3)


EVENT_ERRORS: list[tuple[dict[bytes, Item], str]] = [
    ({}, "a message needs the field 'type'"),
    ({b"group": b"g"}, "a message needs the field 'type'"),
    ({b"type": None}, "a message field 'type' must be DATA, not NULL"),
    ({b"type": [b"send"]}, "field 'type' must be DATA, not LIST"),
    ({b"type": b"subscribe"}, "subscribe needs the field 'group'"),
    ({b"type": b"subscribe", b"group": {}}, "subscribe field 'group' must be DATA, not HASH"),
    ({b"type": b"subscribe", b"group": b"g", b"instance": None}, "field 'instance' must be DATA"),
    ({b"type": b"subscribe", b"group": b"g", b"subtype": b"loud"}, "not 'loud'"),
    ({b"type": b"subscribe", b"group": b"g", b"subtype": b"Normal"}, "normal, meonly or promisc"),
    ({b"type": b"subscribe", b"group": b"g", b"subtype": [b"normal"]}, "field 'subtype' must be DATA"),
    ({b"type": b"unsubscribe"}, "unsubscribe needs the field 'group'"),
    ({b"type": b"unsubscribe", b"group": b"g", b"instance": []}, "field 'instance' must be DATA"),
    ({b"type": b"getlname", b"lname": None}, "getlname field 'lname' must be DATA, not NULL"),
    ({b"type": b"stats", b"stats": b"12"}, "field 'stats' must be a HASH, not DATA"),
    ({b"stats": None}, "field 'stats' must be a HASH, not NULL"),
]
SEND: dict[bytes, Item] = {b"type": b"send", b"from": b"a", b"to": b"*", b"group": b"g", b"instance": b"*",
                           b"seq": b"1", b"msg": {}}
for _tag in (b"from", b"to", b"group", b"instance", b"msg"):
    EVENT_ERRORS.append(
        ({k: v for k, v in SEND.items() if k != _tag}, f"send needs the field '{_tag.decode()}'")
    )
for _tag in (b"from", b"to", b"group", b"instance", b"seq", b"repl"):
    EVENT_ERRORS.append(({**SEND, _tag: [b"x"]}, f"send field '{_tag.decode()}' must be DATA, not LIST"))


@pytest.mark.parametrize(("fields", "text"), EVENT_ERRORS)
def test_to_event_names_the_missing_or_mistyped_field(fields: dict[bytes, Item], text: str) -> None:
    with pytest.raises(ProtocolError) as info:
        msgq.to_event(fields)
    assert text in str(info.value)
    # Through the stream the same message is refused the same way.
    with pytest.raises(ProtocolError) as info:
        feed_whole(frame(msgq.encode_message(fields)))
    assert text in str(info.value)


def test_msg_may_be_any_item_even_null() -> None:
    for msg in (None, b"", {}, [], {b"a": [None, {b"b": b"c"}]}):
        assert msgq.to_event({**SEND, b"msg": msg}) == Send(b"a", b"*", b"g", b"*", b"1", msg)


@pytest.mark.parametrize(
    ("item", "error", "text"),
    [
        (5, TypeError, "decimal strings"),
        ("text", TypeError, "not str"),
        ((b"a",), TypeError, "not tuple"),
        ({"a": b"b"}, TypeError, "tags must be bytes"),
        ({b"": b"b"}, ProtocolError, "1 to 255 bytes long, not 0"),
        ({b"t" * 256: None}, ProtocolError, "not 256"),
        ([[[{b"x": [None, 7]}]]], TypeError, "decimal strings"),
    ],
)
def test_encode_item_refuses_what_the_wire_cannot_carry(item: object, error: type, text: str) -> None:
    with pytest.raises(error, match=text):
        msgq.encode_item(item)  # type: ignore[arg-type]


def test_encoder_applies_the_nesting_limit_and_survives_cycles() -> None:
    deep: Item = []
    for _ in range(msgq.MAX_DEPTH - 1):
        deep = [deep]
    assert msgq.decode_item(msgq.encode_item(deep)) == deep
    with pytest.raises(ProtocolError, match="nested deeper"):
        msgq.encode_item([deep])
    with pytest.raises(ProtocolError, match="nested deeper"):
        msgq.encode_message({b"a": deep})  # the message body counts as one level
    looped: list[Item] = []
    looped.append(looped)
    with pytest.raises(ProtocolError, match="nested deeper"):
        msgq.encode_item(looped)


def test_encoder_accepts_bytearray_as_data() -> None:
    assert msgq.encode_item(bytearray(b"ab")) == b"\x21\x02ab"


@pytest.mark.parametrize(
    ("event", "error", "text"),
    [
        (Subscribe(b"g", subtype="loud"), ProtocolError, "not 'loud'"),
        (Subscribe(b"g", extra={b"group": b"h"}), ProtocolError, "extra repeats modelled fields: group"),
        (Send(b"a", b"b", b"g", b"i", b"", None, extra={b"from": b"x", b"type": b"y"}), ProtocolError,
         "from, type"),
        ("GetLname", TypeError, "not a msgq event"),
    ],
)
def test_from_event_refuses_bad_events(event: object, error: type, text: str) -> None:
    with pytest.raises(error, match=text):
        msgq.from_event(event)  # type: ignore[arg-type]
    with pytest.raises(error, match=text):
        Connection().send(event)  # type: ignore[arg-type]


def test_long_garbage_is_shortened_in_the_error() -> None:
    tag = b"\xfe" * 200
    wire = b"\x12\x01\x94" + b"\xc8" + tag + b"\x04" + b"\xc8" + tag + b"\x04"
    with pytest.raises(ProtocolError) as info:
        msgq.decode_item(wire)
    assert "appears twice" in str(info.value)
    assert len(str(info.value)) < 120
    assert str(info.value).isprintable()


# ------------------------------------------------------------------------------------------------ hypothesis

tags = st.binary(min_size=1, max_size=10)
leaves = st.none() | st.binary(max_size=24)
items: st.SearchStrategy[Item] = st.recursive(
    leaves,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(tags, children, max_size=4),
    max_leaves=10,
)
# For the fields around the item under test: still nested, but cheap to draw (keeps the file fast).
small_items: st.SearchStrategy[Item] = st.recursive(
    leaves, lambda children: st.lists(children, max_size=2) | st.dictionaries(tags, children, max_size=2),
    max_leaves=3,
)
data_fields = st.binary(max_size=16)
KNOWN_TYPES = {b"getlname", b"subscribe", b"unsubscribe", b"send", b"stats"}
SEND_TAGS = {b"type", b"from", b"to", b"group", b"instance", b"seq", b"msg", b"repl"}
SUBSCRIBE_TAGS = {b"type", b"group", b"instance", b"subtype"}


def _extras(modelled: set[bytes]) -> st.SearchStrategy[dict[bytes, Item]]:
    return st.dictionaries(tags.filter(lambda tag: tag not in modelled), small_items, max_size=3)


unknown_fields = st.builds(
    lambda kind, rest: {b"type": kind, **rest},
    st.binary(max_size=12).filter(lambda kind: kind not in KNOWN_TYPES),
    _extras({b"type"}),
)

events: st.SearchStrategy[msgq.Event] = st.one_of(
    st.just(GetLname()),
    st.builds(LnameReply, data_fields),
    st.builds(Subscribe, data_fields, data_fields, st.sampled_from(msgq.SUBTYPES), _extras(SUBSCRIBE_TAGS)),
    st.builds(Unsubscribe, data_fields, data_fields),
    st.builds(Send, data_fields, data_fields, data_fields, data_fields, data_fields, items,
              st.none() | data_fields, _extras(SEND_TAGS)),
    st.just(Stats()),
    st.builds(StatsReply, st.dictionaries(tags, small_items, max_size=4)),
    st.builds(Unknown, unknown_fields),
)


def chunked(stream: bytes, cuts: list[int]) -> list[bytes]:
    """``stream`` split at ``cuts`` (positions, any order, out-of-range ones clipped)."""
    points = sorted({min(max(cut, 0), len(stream)) for cut in cuts} | {0, len(stream)})
    return [stream[a:b] for a, b in itertools.pairwise(points)]


@ROUND_TRIP
@given(
    item=items,
    extra=st.dictionaries(tags.filter(lambda tag: tag != b"type"), leaves, max_size=3),
    cuts=st.lists(st.integers(0, 4000), max_size=8),
)
def test_items_round_trip_alone_in_a_message_and_through_the_stream(
    item: Item, extra: dict[bytes, Item], cuts: list[int]
) -> None:
    encoded = msgq.encode_item(item)
    decoded = msgq.decode_item(encoded)
    assert ordered(decoded) == ordered(item)
    assert msgq.encode_item(decoded) == encoded

    fields: dict[bytes, Item] = {b"type": b"x-test", **extra, b"item": item}
    message = msgq.encode_message(fields)
    assert message[:4] == MAGIC
    assert ordered(msgq.decode_message(message)) == ordered(fields)

    stream = Connection().send(Unknown(fields))
    assert stream == frame(message)
    receiver = Connection()
    received: list[msgq.Event] = []
    for chunk in chunked(stream, cuts):
        receiver.receive_data(chunk)
        received += drain(receiver)
    assert len(received) == 1
    assert isinstance(received[0], Unknown)
    assert ordered(received[0].fields) == ordered(fields)


@ROUND_TRIP
@given(sent=st.lists(events, min_size=1, max_size=3), cuts=st.lists(st.integers(0, 2000), max_size=10))
def test_events_round_trip_through_send_and_next_event(sent: list[msgq.Event], cuts: list[int]) -> None:
    for event in sent:
        fields = msgq.from_event(event)
        assert msgq.to_event(fields) == event
        assert msgq.from_event(msgq.to_event(fields)) == fields
    sender = Connection()
    stream = b"".join(sender.send(event) for event in sent)
    receiver = Connection()
    received: list[msgq.Event] = []
    for chunk in chunked(stream, cuts):
        receiver.receive_data(chunk)
        received += drain(receiver)
    assert received == sent
    assert receiver.next_event() is None


def attempt(function: Callable[..., T], *args: object) -> tuple[T | None, ProtocolError | None]:
    """``function(*args)`` and None, or None and the ProtocolError it raised (nothing else is caught)."""
    try:
        return function(*args), None
    except ProtocolError as error:
        return None, error


def _decoded_or_refused(wire: bytes) -> None:
    """decode_item returns an item or raises ProtocolError; a decoded item re-encodes no larger."""
    item, error = attempt(msgq.decode_item, wire)
    if error is not None:
        assert str(error)
        assert str(error).isprintable()
        return
    encoded = msgq.encode_item(item)
    assert msgq.decode_item(encoded) == item
    assert len(encoded) <= len(wire)  # the encoder's forms are the smallest


def _stream_yields_events_or_protocol_errors(chunks: list[bytes], max_message: int) -> list[msgq.Event]:
    connection = Connection(max_message=max_message)
    events_seen: list[msgq.Event] = []
    for chunk in chunks:
        connection.receive_data(chunk)
        while True:
            event, error = attempt(connection.next_event)
            if error is not None:
                assert str(error).isprintable()
                if "over the limit" in str(error) or "too short" in str(error):
                    return events_seen  # the framing is lost; the shell closes here
                continue
            if event is None:
                break
            # Whatever decodes survives a trip back through the encoder.
            again = msgq.to_event(msgq.decode_message(msgq.encode_message(msgq.from_event(event))))
            assert again == event
            events_seen.append(event)
    return events_seen


@FUZZ
@given(wire=st.binary(max_size=80))
def test_fuzz_decoders_on_arbitrary_bytes(wire: bytes) -> None:
    _decoded_or_refused(wire)
    # The same bytes as a message body behind a valid magic.
    fields, error = attempt(msgq.decode_message, MAGIC + wire)
    if error is None:
        assert msgq.decode_message(msgq.encode_message(fields)) == fields
    else:
        assert str(error).isprintable()


@FUZZ
@given(
    stream=st.binary(max_size=200),
    bodies=st.lists(st.binary(max_size=60), max_size=4),
    cuts=st.lists(st.integers(0, 400), max_size=10),
    max_message=st.integers(4, 100),
)
def test_fuzz_stream_in_arbitrary_chunks(stream: bytes, bodies: list[bytes], cuts: list[int],
                                         max_message: int) -> None:
    # Arbitrary bytes, mostly refused by the framing under a small cap.
    _stream_yields_events_or_protocol_errors(chunked(stream, cuts), max_message)
    # Valid framing and magic around arbitrary bodies, so the fuzzing reaches the item decoder and to_event.
    framed = b"".join(frame(MAGIC + body) for body in bodies)
    _stream_yields_events_or_protocol_errors(chunked(framed, cuts), msgq.DEFAULT_MAX_MESSAGE)


MUTATIONS = ["flip", "cut", "drop", "insert", "truncate"]


# Every routing vector (each event type, nested msg, extra fields) is a seed for the mutations below.
VECTOR_EVENTS = [event for _, event in ROUTING_VECTORS]


@FUZZ
@given(event=st.sampled_from(VECTOR_EVENTS), data=st.data())
def test_fuzz_mutated_encodings(event: msgq.Event, data: st.DataObject) -> None:
    stream = bytearray(Connection().send(event))
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        kind = data.draw(st.sampled_from(MUTATIONS), label="mutation")
        if not stream:
            break
        index = data.draw(st.integers(0, len(stream) - 1), label="index")
        if kind == "flip":
            stream[index] ^= data.draw(st.integers(1, 255), label="mask")
        elif kind == "cut":
            end = data.draw(st.integers(index, len(stream)), label="end")
            del stream[index:end]
        elif kind == "drop":
            del stream[index]
        elif kind == "insert":
            stream[index:index] = data.draw(st.binary(min_size=1, max_size=4), label="inserted")
        else:
            del stream[index:]
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=6), label="cuts")
    _stream_yields_events_or_protocol_errors(chunked(bytes(stream), cuts), msgq.DEFAULT_MAX_MESSAGE)
    # The mutated message read straight by the message decoder, whatever its framing says.
    fields, error = attempt(msgq.decode_message, bytes(stream[4:]))
    if error is None:
        assert msgq.decode_message(msgq.encode_message(fields)) == fields
    else:
        assert str(error).isprintable()


@settings(max_examples=200, deadline=None)
@given(
    st.builds(msgq.Send, data_fields, data_fields, data_fields, data_fields, data_fields,
              small_items | st.binary(min_size=250, max_size=300), st.none() | data_fields,
              _extras(SEND_TAGS)),
)
def test_the_trusted_send_frame_is_what_send_writes(send: msgq.Send) -> None:
    assert msgq.send_frame(send.sender, send.to, send.group, send.instance, send.seq, send.msg, send.repl,
                           send.extra) == Connection().send(send)
