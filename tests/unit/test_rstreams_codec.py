"""The reactive-streams codec (protocol/rstreams.py): varints at their edges, a wire vector for every message
in a realistic conversation (fed whole, byte by byte and with the next message's first bytes behind it), the
handshake, offer, element-size, id and size rules, goodbye, Demand and Reassembler, hypothesis round-trips of
arbitrary event sequences in arbitrary chunkings, and fuzzing whose only allowed failure is ProtocolError.
"""

from __future__ import annotations

import itertools
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import ProtocolError, rstreams
from protocol.rstreams import (
    EXT_PUBLISH,
    MAX_EXTENSIONS,
    MAX_VARINT,
    UNBOUNDED,
    Cancel,
    ClientHello,
    Connection,
    Demand,
    Event,
    Goodbye,
    Offer,
    OnComplete,
    OnError,
    OnNext,
    OnNextLastPart,
    OnNextPacked,
    OnNextPart,
    OnSubscribe,
    Reassembler,
    Request,
    ServerHello,
    Subscribe,
    decode_varint,
    encode_varint,
    split,
)

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ROUND_TRIP = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
PROPERTY = settings(max_examples=200, deadline=None)

EVENT_TYPES = (ClientHello, ServerHello, Goodbye, Subscribe, Request, Cancel, OnSubscribe, OnNext, OnComplete,
               OnError, OnNextPacked, OnNextPart, OnNextLastPart, Offer)


def drain(connection: Connection) -> list[Event]:
    events = []
    while (event := connection.next_event()) is not None:
        events.append(event)
    return events


def chunked(stream: bytes, cuts: list[int]) -> list[bytes]:
    """``stream`` split at ``cuts`` (positions, any order, out-of-range ones clipped)."""
    points = sorted({min(max(cut, 0), len(stream)) for cut in cuts} | {0, len(stream)})
    return [stream[a:b] for a, b in itertools.pairwise(points)]


def pair(client_extensions: tuple[int, ...] = (EXT_PUBLISH,),
         server_extensions: tuple[int, ...] = (EXT_PUBLISH,), **limits: int) -> tuple[Connection, Connection]:
    """A client and a server that have exchanged hellos; ``limits`` apply to both."""
    client = Connection(client=True, **limits)
    server = Connection(client=False, **limits)
    server.receive_data(client.send(ClientHello(0, client_extensions)))
    client.receive_data(server.send(ServerHello(0, server_extensions)))
    assert server.next_event() == ClientHello(0, client_extensions)
    assert client.next_event() == ServerHello(0, server_extensions)
    return client, server


def deliver(sender: Connection, receiver: Connection, event: Event) -> Event | None:
    """``event`` sent by one end and read by the other."""
    receiver.receive_data(sender.send(event))
    return receiver.next_event()


# ---------------------------------------------------------------------------------------------------- varints

VARINTS = [
    (0, "00"),
    (1, "01"),
    (127, "7f"),
    (128, "80 01"),
    (300, "ac 02"),
    (16383, "ff 7f"),
    (16384, "80 80 01"),
    (2**63 - 1, "ff ff ff ff ff ff ff ff 7f"),
    (2**63, "80 80 80 80 80 80 80 80 80 01"),
    (2**64 - 1, "ff ff ff ff ff ff ff ff ff 01"),
]


@pytest.mark.parametrize(("value", "wire"), VARINTS)
def test_varint_vectors_both_ways(value: int, wire: str) -> None:
    raw = bytes.fromhex(wire)
    assert encode_varint(value) == raw
    assert decode_varint(raw) == (value, len(raw))
    # Read from an offset, with bytes after it: the offset after the varint comes back.
    assert decode_varint(b"\xaa" + raw + b"\x05rest", 1) == (value, 1 + len(raw))


@pytest.mark.parametrize(
    ("wire", "value"),
    [("80 00", 0), ("ff 00", 127), ("ac 82 80 00", 300), ("80 80 80 80 80 80 80 80 80 00", 0)],
)
def test_padded_varints_within_ten_bytes_are_read(wire: str, value: int) -> None:
    raw = bytes.fromhex(wire)
    assert decode_varint(raw) == (value, len(raw))
    assert len(encode_varint(value)) < len(raw)  # the encoder writes the shortest form


@pytest.mark.parametrize(
    "wire",
    [
        "ff ff ff ff ff ff ff ff ff 81 01",  # 11 bytes
        "80 80 80 80 80 80 80 80 80 80 00",  # 11 bytes, value 0
        "80 80 80 80 80 80 80 80 80 02",  # 10th byte 0x02: 2**64
        "ff ff ff ff ff ff ff ff ff 7f",  # 10th byte 0x7f
    ],
)
def test_over_long_varints_are_refused(wire: str) -> None:
    with pytest.raises(ProtocolError, match="over-long varint"):
        decode_varint(bytes.fromhex(wire))


@pytest.mark.parametrize("wire", ["", "80", "ff ff", "ff ff ff ff ff ff ff ff ff"])
def test_truncated_varints_are_refused_by_the_public_helper(wire: str) -> None:
    with pytest.raises(ProtocolError, match="truncated varint"):
        decode_varint(bytes.fromhex(wire))


def test_decode_varint_refuses_a_negative_offset() -> None:
    with pytest.raises(ValueError, match="pos must not be negative"):
        decode_varint(b"\x01", -1)


@pytest.mark.parametrize("value", [-1, 2**64, 2**70, True, 1.0, "1", None])
def test_encode_varint_refuses_what_the_wire_cannot_carry(value: object) -> None:
    with pytest.raises(ValueError, match="varint"):
        encode_varint(value)  # type: ignore[arg-type]


@PROPERTY
@given(value=st.integers(0, MAX_VARINT), tail=st.binary(max_size=4))
def test_varints_round_trip(value: int, tail: bytes) -> None:
    raw = encode_varint(value)
    assert 1 <= len(raw) <= 10
    assert len(raw) == max(1, -(-value.bit_length() // 7))
    assert decode_varint(raw + tail) == (value, len(raw))


# -------------------------------------------------------------------------------------------- conversation

PRICE_100 = bytes.fromhex("40 59 00 00 00 00 00 00")  # 100.0 as a big-endian double
PRICE_101 = bytes.fromhex("40 59 40 00 00 00 00 00")

# (sender: C client or S server, event, its exact bytes). Every message type, both directions, variable and
# fixed-size streams, the same id used by both sides for unrelated streams, and an orderly goodbye.
CONVERSATION: list[tuple[str, Event, str]] = [
    ("C", ClientHello(0, (EXT_PUBLISH,)), "00 00 01 01"),
    ("S", ServerHello(0, (EXT_PUBLISH,)), "01 00 01 01"),
    ("C", Subscribe("orders", 1, 10), "03 06 6f 72 64 65 72 73 01 0a"),
    ("S", OnSubscribe(1), "06 01 00"),
    ("S", OnNext(1, b"hello"), "07 01 05 68 65 6c 6c 6f"),
    ("C", Request(1, 300), "04 01 ac 02"),
    ("S", OnNextPart(1, 0, b"big-"), "0b 01 00 04 62 69 67 2d"),
    ("S", OnNextLastPart(1, 0, b"one"), "0c 01 00 03 6f 6e 65"),
    ("C", Subscribe("ticks", 5, UNBOUNDED), "03 05 74 69 63 6b 73 05 ff ff ff ff ff ff ff ff 7f"),
    ("S", OnSubscribe(5, 4), "06 05 04"),
    ("S", OnNext(5, b"\x00\x00\x00\x2a"), "07 05 00 00 00 2a"),  # no length prefix
    ("S", OnNextPacked(5, (b"\x00\x00\x00\x01", b"\x00\x00\x00\x02")), "0a 05 02 00 00 00 01 00 00 00 02"),
    ("C", Cancel(5), "05 05"),
    ("S", OnNext(5, b"\x00\x00\x00\x03"), "07 05 00 00 00 03"),  # sent before the cancel arrived
    ("S", OnComplete(1), "08 01"),
    ("C", Offer("prices"), "0d 06 70 72 69 63 65 73"),
    ("S", Subscribe("prices", 1, 16), "03 06 70 72 69 63 65 73 01 10"),  # the server's own id 1
    ("C", OnSubscribe(1, 8), "06 01 08"),
    ("C", OnNext(1, PRICE_100), "07 01 40 59 00 00 00 00 00 00"),
    ("C", OnNextPacked(1, (PRICE_101,)), "0a 01 01 40 59 40 00 00 00 00 00"),
    ("S", Request(1, 2), "04 01 02"),
    ("C", OnError(1, "feed lost"), "09 01 09 66 65 65 64 20 6c 6f 73 74"),
    ("C", Subscribe("missing", 2), "03 07 6d 69 73 73 69 6e 67 02 00"),
    ("S", OnError(2, "no topic «missing»"),
     "09 02 14 6e 6f 20 74 6f 70 69 63 20 c2 ab 6d 69 73 73 69 6e 67 c2 bb"),
    ("C", Goodbye("bye"), "02 03 62 79 65"),
    ("S", Goodbye("bye"), "02 03 62 79 65"),
]


# Everything each side sends in the conversation, in order.
SIDE_STREAMS = {side: b"".join(bytes.fromhex(wire) for s, _, wire in CONVERSATION if s == side)
                for side in "CS"}


def test_the_conversation_has_every_message_type() -> None:
    assert {type(event) for _, event, _ in CONVERSATION} == set(EVENT_TYPES)
    assert len(EVENT_TYPES) == 14


@pytest.mark.parametrize("mode", ["whole", "bytewise", "trailing"])
def test_conversation_vectors(mode: str) -> None:
    ends = {"C": Connection(client=True), "S": Connection(client=False)}
    streams = SIDE_STREAMS
    sent = {"C": 0, "S": 0}  # bytes each side has sent so far
    fed = {"C": 0, "S": 0}  # bytes of each side's stream its peer has received
    for index, (side, event, wire) in enumerate(CONVERSATION):
        raw = bytes.fromhex(wire)
        assert ends[side].send(event) == raw
        sent[side] += len(raw)
        receiver = ends["S" if side == "C" else "C"]
        stream, stop = streams[side], sent[side]
        if mode == "whole":
            receiver.receive_data(stream[fed[side] : stop])
            fed[side] = stop
        elif mode == "bytewise":
            for position in range(fed[side], stop - 1):
                receiver.receive_data(stream[position : position + 1])
                assert receiver.next_event() is None
            receiver.receive_data(stream[stop - 1 : stop])
            fed[side] = stop
        else:
            # With the first half of the same side's next message behind it (or junk after the last one).
            following = [bytes.fromhex(w) for s, _, w in CONVERSATION[index + 1 :] if s == side]
            extra = len(following[0]) // 2 if following else 0
            receiver.receive_data(stream[fed[side] : stop + extra] + (b"" if following else b"\xff\xff"))
            fed[side] = stop + extra
        assert receiver.next_event() == event
        assert receiver.next_event() is None
    assert ends["C"].closed
    assert ends["S"].closed


def test_the_vectors_decode_from_one_chunk_per_direction() -> None:
    # Up to the client's offer everything the server sends only needs the client's earlier subscribes.
    client = Connection(client=True)
    for side, event, _ in CONVERSATION[:13]:
        if side == "C":
            client.send(event)
    server_part = [(event, wire) for side, event, wire in CONVERSATION[:15] if side == "S"]
    client.receive_data(b"".join(bytes.fromhex(wire) for _, wire in server_part))
    assert drain(client) == [event for event, _ in server_part]


# ------------------------------------------------------------------------------------------------- hellos


def test_peer_extensions_come_from_the_peers_hello() -> None:
    client = Connection(client=True)
    assert client.peer_extensions == frozenset()
    assert not client.closed
    client.send(ClientHello(0, ()))
    assert deliver(Connection(client=False), client, ServerHello(0, (1, 7, 1, 2**40))) == ServerHello(
        0, (1, 7, 1, 2**40))
    assert client.peer_extensions == frozenset({1, 7, 2**40})


@pytest.mark.parametrize(
    ("client", "first", "text"),
    [
        (True, b"\x00\x00\x00", "expected serverHello first, not clientHello"),
        (False, b"\x01\x00\x00", "expected clientHello first, not serverHello"),
        (True, b"\x07", "expected serverHello first, not onNext"),
        (False, b"\x03", "expected clientHello first, not subscribe"),
        (False, b"\x02", "expected clientHello first, not goodbye"),
        (True, b"\x0e", "unknown message type 0x0e"),
    ],
)
def test_the_first_message_must_be_the_peers_hello(client: bool, first: bytes, text: str) -> None:
    connection = Connection(client=client)
    connection.receive_data(first)  # refused from the type byte alone
    with pytest.raises(ProtocolError, match=text):
        connection.next_event()


@pytest.mark.parametrize("hello", [b"\x00\x00\x00", b"\x01\x00\x00"])
def test_a_second_hello_is_refused(hello: bytes) -> None:
    client, server = pair()
    for connection in (client, server):
        connection.receive_data(hello)
        with pytest.raises(ProtocolError, match="a second hello"):
            connection.next_event()


def test_a_hello_of_another_version_is_returned_and_the_rest_ignored() -> None:
    server = Connection(client=False)
    server.receive_data(b"\x00\x01\x01\x01" + b"\x05\x01")  # version 1, then bytes in an unknown format
    assert server.next_event() == ClientHello(1, (1,))
    assert server.peer_extensions == frozenset()  # a version we do not speak lists nothing we know
    server.receive_data(b"\x0e\xff garbage")
    assert server.next_event() is None
    assert server.send(ServerHello(0, ())) == b"\x01\x00\x00"
    assert server.send(Goodbye("unsupported version 1")).startswith(b"\x02\x15")


def test_hello_extension_count_is_capped() -> None:
    server = Connection(client=False)
    server.receive_data(b"\x00\x00" + encode_varint(MAX_EXTENSIONS + 1))
    with pytest.raises(ProtocolError, match=f"listing {MAX_EXTENSIONS + 1} extensions"):
        server.next_event()
    wide = tuple(range(MAX_EXTENSIONS))
    server = Connection(client=False)
    assert deliver(Connection(client=True), server, ClientHello(0, wide)) == ClientHello(0, wide)
    assert server.peer_extensions == frozenset(wide)
    with pytest.raises(ValueError, match="at most 256"):
        Connection(client=True).send(ClientHello(0, (*wide, 999)))


@pytest.mark.parametrize(
    ("client", "event", "text"),
    [
        (True, ServerHello(0, ()), "a client does not send ServerHello"),
        (False, ClientHello(0, ()), "a server does not send ClientHello"),
        (True, ClientHello(256, ()), "version must be a byte"),
        (True, ClientHello(-1, ()), "version must be a byte"),
        (True, ClientHello(0, (-1,)), "extension id must be in"),
        (True, ClientHello(0, "ab"), "must be a tuple"),  # type: ignore[arg-type]
        (True, Subscribe("t", 1), "before our hello"),
        (False, OnNext(1, b""), "before our hello"),
    ],
)
def test_hello_misuse_on_send(client: bool, event: Event, text: str) -> None:
    with pytest.raises(ValueError, match=text):
        Connection(client=client).send(event)


def test_hello_is_sent_once_and_goodbye_may_come_first() -> None:
    client = Connection(client=True)
    assert client.send(ClientHello(0, [EXT_PUBLISH])) == b"\x00\x00\x01\x01"  # type: ignore[arg-type]
    unordered = ServerHello(0, frozenset({9, 1}))  # type: ignore[arg-type]
    assert Connection(client=False).send(unordered) == b"\x01\x00\x02\x01\x09"  # sets go in sorted order
    with pytest.raises(ValueError, match="already sent"):
        client.send(ClientHello(0, ()))
    server = Connection(client=False)
    assert server.send(Goodbye("not now")) == b"\x02\x07not now"
    assert server.closed


# -------------------------------------------------------------------------------------------------- offer


def test_offer_is_received_only_after_our_hello_listed_publish() -> None:
    offer = b"\x0d\x01t"
    # Our hello did not list the extension: refused from the type byte alone.
    client, server = pair(server_extensions=())
    server.receive_data(offer[:1])
    with pytest.raises(ProtocolError, match="offer before our hello listed extension 1"):
        server.next_event()
    # No hello of ours at all.
    server = Connection(client=False)
    server.receive_data(b"\x00\x00\x01\x01" + offer)
    assert server.next_event() == ClientHello(0, (1,))
    with pytest.raises(ProtocolError, match="offer before our hello"):
        server.next_event()
    # Listed: accepted.
    client, server = pair()
    assert deliver(client, server, Offer("t")) == Offer("t")


def test_offer_is_sent_only_after_the_peers_hello_listed_publish() -> None:
    client = Connection(client=True)
    client.send(ClientHello(0, (EXT_PUBLISH,)))
    with pytest.raises(ValueError, match="did not list extension 1"):
        client.send(Offer("t"))  # no server hello yet
    client.receive_data(b"\x01\x00\x01\x02")  # a server hello listing only extension 2
    assert client.next_event() == ServerHello(0, (2,))
    with pytest.raises(ValueError, match="did not list extension 1"):
        client.send(Offer("t"))
    client, _ = pair()
    assert client.send(Offer("t")) == b"\x0d\x01t"


# ------------------------------------------------------------------------------------------- element sizes


def test_an_id_without_announced_size_is_variable() -> None:
    client, _ = pair()
    client.receive_data(b"\x07\x09\x03abc")  # never subscribed, never announced
    assert client.next_event() == OnNext(9, b"abc")


def test_on_subscribe_for_an_id_never_subscribed_is_refused() -> None:
    client, server = pair()
    client.receive_data(b"\x06\x04\x04")
    with pytest.raises(ProtocolError, match="subscriber 4, which this side never subscribed"):
        client.next_event()
    # The server's subscription with the same id does not count: ids are per side.
    deliver(client, server, Subscribe("t", 3))
    server.receive_data(b"\x06\x03\x04")
    with pytest.raises(ProtocolError, match="never subscribed"):
        server.next_event()


@pytest.mark.parametrize("announce", [None, 0])
def test_packed_on_a_variable_stream_is_refused(announce: int | None) -> None:
    client, server = pair()
    deliver(client, server, Subscribe("t", 2))
    if announce is not None:
        assert deliver(server, client, OnSubscribe(2, announce)) == OnSubscribe(2, 0)
    with pytest.raises(ValueError, match="no fixed element size"):
        server.send(OnNextPacked(2, (b"ab",)))
    client.receive_data(b"\x0a\x02")  # refused as soon as the subscriber is read
    with pytest.raises(ProtocolError, match="onNextPacked for subscriber 2, whose stream has no fixed"):
        client.next_event()


def test_fixed_size_is_checked_on_send() -> None:
    client, server = pair()
    deliver(client, server, Subscribe("t", 2))
    deliver(server, client, OnSubscribe(2, 3))
    with pytest.raises(ValueError, match="onNext element of 2 bytes on subscriber 2, whose elements are 3"):
        server.send(OnNext(2, b"ab"))
    with pytest.raises(ValueError, match="onNextPacked element of 4 bytes"):
        server.send(OnNextPacked(2, (b"abc", b"abcd")))
    assert deliver(server, client, OnNextPacked(2, ())) == OnNextPacked(2, ())  # count 0: nothing
    assert deliver(server, client, OnNextPacked(2, [b"abc", b"xyz"])) == OnNextPacked(  # type: ignore[arg-type]
        2, (b"abc", b"xyz"))
    # Parts carry their own lengths on a fixed-size stream too.
    assert deliver(server, client, OnNextLastPart(2, 0, b"a")) == OnNextLastPart(2, 0, b"a")


@pytest.mark.parametrize("end", [OnComplete(2), OnError(2, "gone")])
def test_the_end_of_a_stream_forgets_its_size_and_the_id_can_be_reused(end: Event) -> None:
    client, server = pair()
    deliver(client, server, Subscribe("t", 2))
    deliver(server, client, OnSubscribe(2, 4))
    assert server.send(OnNext(2, b"abcd")) == b"\x07\x02abcd"
    assert deliver(server, client, end) == end
    # Both sides now treat id 2 as variable: a stray onNext is length-prefixed.
    assert server.send(OnNext(2, b"xy")) == b"\x07\x02\x02xy"
    client.receive_data(b"\x07\x02\x02xy")
    assert client.next_event() == OnNext(2, b"xy")
    client.receive_data(b"\x06\x02\x02")
    with pytest.raises(ProtocolError, match="never subscribed"):  # the subscription is over
        client.next_event()
    client, server = pair()
    deliver(client, server, Subscribe("t", 2))
    deliver(server, client, OnSubscribe(2, 4))
    deliver(server, client, end)
    # Re-subscribed with the same id and another size.
    deliver(client, server, Subscribe("u", 2))
    assert deliver(server, client, OnSubscribe(2, 2)) == OnSubscribe(2, 2)
    assert deliver(server, client, OnNext(2, b"hi")) == OnNext(2, b"hi")
    assert server.send(OnNext(2, b"hi")) == b"\x07\x02hi"


def test_the_end_of_an_old_stream_does_not_end_its_ids_new_subscription() -> None:
    client, server = pair()
    deliver(client, server, Subscribe("t", 2))
    deliver(server, client, OnSubscribe(2, 4))
    deliver(client, server, Cancel(2))
    deliver(client, server, Subscribe("u", 2))  # the id again, before the old stream's end arrives
    client.receive_data(b"\x07\x02abcd" + b"\x08\x02" + b"\x06\x02\x00" + b"\x07\x02\x01z")
    assert drain(client) == [OnNext(2, b"abcd"), OnComplete(2), OnSubscribe(2, 0), OnNext(2, b"z")]


def test_a_cancel_keeps_the_size_for_elements_already_in_flight() -> None:
    client, server = pair()
    deliver(client, server, Subscribe("t", 2))
    deliver(server, client, OnSubscribe(2, 4))
    in_flight = server.send(OnNext(2, b"abcd"))
    assert deliver(client, server, Cancel(2)) == Cancel(2)
    # The publisher's sends keep the size too, so whatever it still writes reads back the same.
    with pytest.raises(ValueError, match="whose elements are 4 bytes"):
        server.send(OnNext(2, b"ab"))
    client.receive_data(in_flight + server.send(OnNextPacked(2, (b"wxyz",))) + server.send(OnComplete(2)))
    assert drain(client) == [OnNext(2, b"abcd"), OnNextPacked(2, (b"wxyz",)), OnComplete(2)]


def test_each_side_names_its_own_streams() -> None:
    client, server = pair()
    deliver(client, server, Subscribe("fixed", 1))  # the client's stream 1: fixed, 4 bytes
    deliver(server, client, Subscribe("variable", 1))  # the server's stream 1: variable
    assert deliver(server, client, OnSubscribe(1, 4)) == OnSubscribe(1, 4)
    assert deliver(client, server, OnSubscribe(1, 0)) == OnSubscribe(1, 0)
    assert server.send(OnNext(1, b"abcd")) == b"\x07\x01abcd"
    assert client.send(OnNext(1, b"abcd")) == b"\x07\x01\x04abcd"
    assert deliver(server, client, OnNext(1, b"wxyz")) == OnNext(1, b"wxyz")
    assert deliver(client, server, OnNext(1, b"a longer element")) == OnNext(1, b"a longer element")


# ------------------------------------------------------------------------------------------- limits, errors


def test_ids_must_be_below_max_ids() -> None:
    client, server = pair(max_ids=10)
    server.receive_data(b"\x04\x09\x01")
    assert server.next_event() == Request(9, 1)
    server.receive_data(b"\x04\x0a")  # refused as soon as the id is read
    with pytest.raises(ProtocolError, match="request subscriber id 10 is not below the limit of 10"):
        server.next_event()
    client.receive_data(b"\x0b\x01" + encode_varint(2**40))
    with pytest.raises(ProtocolError, match="onNextPart element id 1099511627776 is not below"):
        client.next_event()
    # Extension ids are not stream ids.
    server = Connection(client=False, max_ids=10)
    server.receive_data(b"\x00\x00\x01" + encode_varint(1000))
    assert server.next_event() == ClientHello(0, (1000,))
    # The limit is on what is received: ids above it can still be sent.
    assert server.send(ServerHello(0, ())) + server.send(Cancel(10**6)) == b"\x01\x00\x00\x05\xc0\x84\x3d"


def test_a_huge_on_next_is_refused_as_soon_as_its_length_is_read() -> None:
    client, _ = pair()
    client.receive_data(b"\x07\x01" + encode_varint(1 << 30))  # type, id, length: no element bytes at all
    with pytest.raises(ProtocolError, match="over the limit of 16777216"):
        client.next_event()
    # Final: the stream has no framing to resynchronise on, so even a valid message changes nothing.
    client.receive_data(b"\x08\x01")
    with pytest.raises(ProtocolError, match="over the limit"):
        client.next_event()


def test_max_message_counts_the_whole_message() -> None:
    client, server = pair(max_message=100)
    client.receive_data(b"\x07\x01\x61" + b"x" * 97)  # 100 bytes exactly
    assert client.next_event() == OnNext(1, b"x" * 97)
    client.receive_data(b"\x07\x01\x62")
    with pytest.raises(ProtocolError, match="an onNext element of 98 bytes makes a message of 101 bytes"):
        client.next_event()
    # A string, then varints that carry the message over the limit: refused once the 100 bytes are in, since
    # the demand varint still to come makes at least 101.
    server.receive_data(b"\x03\x61" + b"p" * 97)
    assert server.next_event() is None
    server.receive_data(b"\x01")
    with pytest.raises(ProtocolError, match="101 bytes or more is over the limit of 100"):
        server.next_event()
    _, server = pair(max_message=100)
    server.receive_data(b"\x03\x61" + b"p" * 97 + b"\x01\x00")  # all of it at once
    with pytest.raises(ProtocolError, match="101 bytes or more is over the limit of 100"):
        server.next_event()


def test_fixed_size_and_packed_messages_are_measured_before_their_bytes_arrive() -> None:
    client, server = pair(max_message=100)
    deliver(client, server, Subscribe("t", 5))
    deliver(server, client, OnSubscribe(5, 50))
    client.receive_data(b"\x0a\x05\x01" + b"e" * 50)
    assert client.next_event() == OnNextPacked(5, (b"e" * 50,))
    client.receive_data(b"\x0a\x05\x02")  # two 50-byte elements do not fit in 100 bytes with the header
    with pytest.raises(ProtocolError, match="onNextPacked of 2 elements of 100 bytes"):
        client.next_event()
    client, server = pair(max_message=100)
    deliver(client, server, Subscribe("t", 5))
    deliver(server, client, OnSubscribe(5, 1000))  # accepted: such elements can still come in parts
    client.receive_data(b"\x07\x05")
    with pytest.raises(ProtocolError, match="an onNext element of 1000 bytes"):
        client.next_event()


@pytest.mark.parametrize(
    ("wire", "text"),
    [
        (b"\x0e", "unknown message type 0x0e"),
        (b"\xff", "unknown message type 0xff"),
        (b"\x02\x02\xc3\x28", "the goodbye reason is not valid UTF-8"),
        (b"\x09\x01\x01\xff", "the onError error is not valid UTF-8"),
        (b"\x03\x01\x80\x01\x00", "the subscribe publisher is not valid UTF-8"),
        (b"\x04" + b"\x80" * 9 + b"\x02", "over-long varint"),
        (b"\x04\x01" + b"\xff" * 10, "over-long varint"),
        (b"\x02" + encode_varint(1 << 40), "over the limit"),
    ],
)
def test_malformed_messages_are_refused_for_good(wire: bytes, text: str) -> None:
    client, _ = pair()
    client.receive_data(wire)
    with pytest.raises(ProtocolError, match=text):
        client.next_event()
    client.receive_data(b"\x08\x01")
    with pytest.raises(ProtocolError, match=text):
        client.next_event()
    # The shell can still say goodbye.
    assert client.send(Goodbye("protocol error")) == b"\x02\x0eprotocol error"


def test_incomplete_input_waits_at_every_cut() -> None:
    stream = bytes.fromhex("03 05 74 69 63 6b 73 05 ff ff ff ff ff ff ff ff 7f")
    for cut in range(len(stream)):
        _, server = pair()
        server.receive_data(stream[:cut])
        assert server.next_event() is None
        server.receive_data(stream[cut:])
        assert server.next_event() == Subscribe("ticks", 5, UNBOUNDED)


def test_a_large_element_fed_byte_by_byte() -> None:
    element = bytes(range(256)) * 1024  # 256 KiB
    client, server = pair()
    wire = server.send(OnNext(3, element))
    assert wire[:5] == b"\x07\x03\x80\x80\x10"
    for position in range(len(wire) - 1):
        client.receive_data(wire[position : position + 1])
        assert client.next_event() is None
    client.receive_data(wire[-1:])
    assert client.next_event() == OnNext(3, element)


@pytest.mark.parametrize(
    ("event", "error", "text"),
    [
        (Request(-1, 1), ValueError, "request subscriber must be in 0..2\\*\\*64-1, not -1"),
        (Request(1, 2**64), ValueError, "request demand must be in"),
        (Request(True, 1), ValueError, "must be an integer, not bool"),  # type: ignore[arg-type]
        (OnNext(1, "text"), ValueError, "onNext element must be bytes, not str"),  # type: ignore[arg-type]
        (Goodbye(b"bye"), ValueError, "goodbye reason must be str"),  # type: ignore[arg-type]
        (OnError(1, "\ud800"), ValueError, "not encodable as UTF-8"),
        (Subscribe("t", 1, -5), ValueError, "initial_demand"),
        (OnNextPart(1, 2**64, b""), ValueError, "onNextPart element must be in"),
        (OnNextPacked(1, b"ab"), ValueError, "no fixed element size"),  # type: ignore[arg-type]
        (OnNextPacked(9, b"abcd"), ValueError, "elements must be a tuple, not bytes"),  # type: ignore[arg-type]
        ("Cancel(1)", TypeError, "not a reactive-streams event"),
    ],
)
def test_send_refuses_values_the_wire_cannot_carry(event: object, error: type, text: str) -> None:
    client, server = pair()
    deliver(server, client, Subscribe("t", 9))
    client.send(OnSubscribe(9, 4))
    with pytest.raises(error, match=text):
        client.send(event)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "text"),
    [({"max_message": 21}, "max_message"), ({"max_ids": 0}, "max_ids"), ({"max_ids": 2**64 + 1}, "max_ids")],
)
def test_connection_limits_are_checked(kwargs: dict[str, int], text: str) -> None:
    with pytest.raises(ValueError, match=text):
        Connection(client=True, **kwargs)


# ------------------------------------------------------------------------------------------------- goodbye


def test_after_a_received_goodbye_input_is_ignored() -> None:
    _, server = pair()
    server.receive_data(b"\x02\x03bye" + b"\x04\x01\x01" + b"\xff garbage")
    assert server.next_event() == Goodbye("bye")
    assert server.closed
    assert server.next_event() is None
    server.receive_data(b"\x0e more garbage")
    assert server.next_event() is None
    assert server.send(Goodbye("bye")) == b"\x02\x03bye"  # the answer


def test_after_our_goodbye_only_goodbye_is_sent_and_only_the_peers_goodbye_read() -> None:
    client, server = pair()
    deliver(client, server, Subscribe("t", 1))
    deliver(server, client, OnSubscribe(1, 2))
    in_flight = server.send(OnNext(1, b"ab")) + server.send(Request(7, 1))
    assert client.send(Goodbye("done")) == b"\x02\x04done"
    assert client.closed
    with pytest.raises(ValueError, match="cannot send Request after our goodbye"):
        client.send(Request(1, 1))
    assert client.send(Goodbye("done")) == b"\x02\x04done"
    # What the server sent before it read our goodbye is still read (with its sizes) and dropped.
    client.receive_data(in_flight + b"\x02\x02ok" + b"\x07\x01\x02ab")
    assert client.next_event() == Goodbye("ok")
    assert client.next_event() is None


# -------------------------------------------------------------------------------------------------- demand


def test_demand_adds_up_and_take_never_exceeds_it() -> None:
    demand = Demand()
    assert demand.outstanding == 0
    assert not demand.unbounded
    assert demand.take() == 0
    demand.add(3)
    demand.add(4)
    assert demand.outstanding == 7
    assert demand.take(5) == 5
    assert demand.take(5) == 2
    assert demand.take() == 0
    assert demand.outstanding == 0
    assert Demand(10).take(3) == 3
    assert Demand(10).outstanding == 10
    assert demand.take(0) == 0


@pytest.mark.parametrize("n", [0, -1, -(2**63)])
def test_request_of_zero_or_less_is_refused(n: int) -> None:
    demand = Demand(5)
    with pytest.raises(ValueError, match=re.escape(f"request({n})")):
        demand.add(n)
    assert demand.outstanding == 5  # unchanged


def test_demand_refuses_non_integers_and_negatives() -> None:
    with pytest.raises(ValueError, match="initial demand must be a non-negative integer"):
        Demand(-1)
    with pytest.raises(ValueError, match="request demand must be an integer, not float"):
        Demand().add(1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="request demand must be an integer, not bool"):
        Demand().add(True)
    demand = Demand(3)
    with pytest.raises(ValueError, match="take needs a non-negative integer"):
        demand.take(-1)
    assert demand.outstanding == 3


def test_demand_saturates_at_unbounded_and_never_runs_down() -> None:
    demand = Demand(UNBOUNDED - 1)
    assert not demand.unbounded
    demand.add(1)
    assert demand.unbounded
    assert demand.outstanding == UNBOUNDED
    demand.add(MAX_VARINT)
    assert demand.outstanding == UNBOUNDED
    assert demand.take(10**30) == 10**30
    assert demand.take() == 1
    assert demand.outstanding == UNBOUNDED
    assert Demand(MAX_VARINT).outstanding == UNBOUNDED
    bounded = Demand(2**62)
    bounded.add(2**62)
    assert bounded.unbounded  # 2**63 > 2**63 - 1
    assert repr(bounded) == "Demand(unbounded)"


operations = st.lists(
    st.tuples(st.sampled_from(["add", "take"]),
              st.one_of(st.integers(0, 50), st.integers(0, 2**64), st.just(UNBOUNDED))),
    max_size=30,
)


@PROPERTY
@given(initial=st.one_of(st.integers(0, 20), st.integers(0, 2**64)), ops=operations)
def test_taken_never_exceeds_requested(initial: int, ops: list[tuple[str, int]]) -> None:
    demand = Demand(initial)
    requested, taken = initial, 0
    # Unlimited for good once the outstanding demand (requested and not yet taken) reached UNBOUNDED.
    unlimited = initial >= UNBOUNDED
    for op, n in ops:
        if op == "add":
            if n < 1:
                with pytest.raises(ValueError, match=re.escape("request(0)")):
                    demand.add(n)
                continue
            demand.add(n)
            requested += n
            unlimited = unlimited or requested - taken >= UNBOUNDED
        else:
            allowed = demand.take(n)
            assert 0 <= allowed <= n
            taken += allowed
        if unlimited:
            assert demand.unbounded
            assert demand.outstanding == UNBOUNDED
        else:
            assert taken <= requested
            assert demand.outstanding == requested - taken
            assert not demand.unbounded


# --------------------------------------------------------------------------------------------- reassembler


def test_reassembler_joins_parts_in_order_per_stream_and_element() -> None:
    parts = Reassembler()
    parts.part(1, 0, b"ab")
    parts.part(2, 0, b"other ")
    parts.part(1, 0, b"cd")
    parts.part(1, 1, b"second ")
    assert parts.pending == 3
    assert parts.last(1, 0, b"e") == b"abcde"
    assert parts.last(2, 0, b"stream") == b"other stream"
    assert parts.last(1, 1, b"element") == b"second element"
    assert parts.pending == 0
    parts.part(1, 0, b"again ")  # an element id is free again once its last part is in
    assert parts.last(1, 0, b"0") == b"again 0"


def test_a_last_part_alone_is_a_one_part_element() -> None:
    parts = Reassembler()
    assert parts.last(4, 9, b"whole") == b"whole"
    assert parts.last(4, 9, b"") == b""
    assert parts.pending == 0


def test_reassembler_size_limit() -> None:
    parts = Reassembler(max_element=5)
    parts.part(1, 0, b"abc")
    text = "element 0 of subscriber 1 grows to 6 bytes, over the limit of 5"
    with pytest.raises(ProtocolError, match=f"^{text}$"):
        parts.last(1, 0, b"def")
    parts.part(1, 0, b"abc")
    with pytest.raises(ProtocolError, match="grows to 7 bytes"):
        parts.part(1, 0, b"defg")
    assert parts.pending == 0
    with pytest.raises(ProtocolError, match="grows to 6 bytes"):
        parts.last(1, 2, b"abcdef")
    parts.part(1, 0, b"abc")
    assert parts.last(1, 0, b"de") == b"abcde"  # exactly the limit


def test_reassembler_pending_limit() -> None:
    parts = Reassembler(max_pending=2)
    parts.part(1, 0, b"a")
    parts.part(2, 0, b"b")
    parts.part(1, 0, b"c")  # the same element again is not a new one
    with pytest.raises(ProtocolError, match="more than 2 split elements open at once"):
        parts.part(1, 1, b"d")
    assert parts.last(1, 0, b"") == b"ac"
    parts.part(1, 1, b"d")  # room again
    assert parts.pending == 2


def test_reassembler_drop_forgets_one_stream() -> None:
    parts = Reassembler()
    parts.part(1, 0, b"stale")
    parts.part(1, 1, b"stale")
    parts.part(2, 0, b"kept ")
    parts.drop(1)
    parts.drop(99)  # nothing open: nothing happens
    assert parts.pending == 1
    assert parts.last(1, 0, b"fresh") == b"fresh"
    assert parts.last(2, 0, b"part") == b"kept part"


@pytest.mark.parametrize(
    ("kwargs", "text"),
    [({"max_element": 0}, "max_element"), ({"max_pending": 0}, "max_pending")],
)
def test_reassembler_limits_are_checked(kwargs: dict[str, int], text: str) -> None:
    with pytest.raises(ValueError, match=text):
        Reassembler(**kwargs)


def test_split_edges() -> None:
    assert split(b"", 3) == [b""]
    assert split(b"abc", 3) == [b"abc"]
    assert split(b"abcdefg", 3) == [b"abc", b"def", b"g"]
    assert split(b"ab", 1) == [b"a", b"b"]
    for bad in (0, -1, True):
        with pytest.raises(ValueError, match="part_size"):
            split(b"abc", bad)


@PROPERTY
@given(element=st.binary(max_size=300), part_size=st.integers(1, 400), subscriber=st.integers(0, 5),
       element_id=st.integers(0, 2**32 - 1))
def test_split_round_trips_through_the_reassembler(element: bytes, part_size: int, subscriber: int,
                                                   element_id: int) -> None:
    chunks = split(element, part_size)
    assert b"".join(chunks) == element
    assert all(1 <= len(chunk) <= part_size for chunk in chunks) or chunks == [b""]
    assert len(chunks) == max(1, -(-len(element) // part_size))
    parts = Reassembler(max_element=max(1, len(element)), max_pending=1)
    for chunk in chunks[:-1]:
        parts.part(subscriber, element_id, chunk)
    assert parts.last(subscriber, element_id, chunks[-1]) == element
    assert parts.pending == 0
    # Through the wire as onNextPart... onNextLastPart.
    client, server = pair()
    wire = b"".join(server.send(OnNextPart(subscriber, element_id, chunk)) for chunk in chunks[:-1])
    client.receive_data(wire + server.send(OnNextLastPart(subscriber, element_id, chunks[-1])))
    joined = Reassembler()
    for event in drain(client):
        if isinstance(event, OnNextPart):
            joined.part(event.subscriber, event.element, event.data)
        else:
            assert isinstance(event, OnNextLastPart)
            assert joined.last(event.subscriber, event.element, event.data) == element


# ------------------------------------------------------------------------------------------------ hypothesis

SUBSCRIBED = range(4)  # the ids the receiving side has subscribed in every round trip
STREAM_IDS = st.sampled_from([0, 1, 2, 3, 4, 2**32 - 1])
ANY_IDS = st.integers(0, 2**32 - 1)
DEMANDS = st.one_of(st.integers(0, 1000), st.integers(0, MAX_VARINT))
TEXTS = st.text(max_size=12)
SIZES = st.sampled_from([0, 1, 4, 9])


VARIABLE = st.binary(max_size=40)
FIXED = {size: st.binary(min_size=size, max_size=size) for size in (1, 4, 9)}
# Events whose fields do not depend on the stream state, built once (drawing is much cheaper than building).
STATELESS: dict[str, st.SearchStrategy[Event]] = {
    "onSubscribe": st.builds(OnSubscribe, st.sampled_from(SUBSCRIBED), SIZES),
    "onComplete": st.builds(OnComplete, STREAM_IDS),
    "onError": st.builds(OnError, STREAM_IDS, TEXTS),
    "onNextPart": st.builds(OnNextPart, STREAM_IDS, ANY_IDS, st.binary(max_size=20)),
    "onNextLastPart": st.builds(OnNextLastPart, STREAM_IDS, ANY_IDS, st.binary(max_size=20)),
    "subscribe": st.builds(Subscribe, TEXTS, ANY_IDS, DEMANDS),
    "request": st.builds(Request, ANY_IDS, DEMANDS),
    "cancel": st.builds(Cancel, STREAM_IDS),
    "offer": st.builds(Offer, TEXTS),
}
KINDS = st.sampled_from([*STATELESS, "onNext", "onNext", "onNextPacked"])


def draw_event(data: st.DataObject, sizes: dict[int, int]) -> Event:
    """Any event the sender may send next, given the element sizes it announced."""
    kind = data.draw(KINDS, label="kind")
    fixed = sorted(subscriber for subscriber, size in sizes.items() if size)
    if kind == "onNextPacked" and fixed:
        subscriber = data.draw(st.sampled_from(fixed), label="subscriber")
        elements = data.draw(st.lists(FIXED[sizes[subscriber]], max_size=4), label="elements")
        return OnNextPacked(subscriber, tuple(elements))
    if kind in STATELESS:
        return data.draw(STATELESS[kind], label=kind)
    subscriber = data.draw(STREAM_IDS, label="subscriber")
    size = sizes.get(subscriber)
    return OnNext(subscriber, data.draw(FIXED[size] if size else VARIABLE, label="element"))


@ROUND_TRIP
@given(data=st.data(), client_sends=st.booleans(), cuts=st.lists(st.integers(0, 600), max_size=12))
def test_event_sequences_round_trip_in_any_chunking(data: st.DataObject, client_sends: bool,
                                                    cuts: list[int]) -> None:
    client, server = pair()
    sender, receiver = (client, server) if client_sends else (server, client)
    for subscriber in SUBSCRIBED:
        deliver(receiver, sender, Subscribe("topic", subscriber))
    sizes: dict[int, int] = {}
    sent: list[Event] = []
    for _ in range(data.draw(st.integers(0, 12), label="length")):
        event = draw_event(data, sizes)
        if isinstance(event, OnSubscribe):
            sizes[event.subscriber] = event.element_size
        elif isinstance(event, OnComplete | OnError):
            sizes.pop(event.subscriber, None)
        sent.append(event)
    if data.draw(st.booleans(), label="goodbye"):
        sent.append(Goodbye(data.draw(TEXTS, label="reason")))
    stream = b"".join(sender.send(event) for event in sent)
    received: list[Event] = []
    for chunk in chunked(stream, cuts):
        receiver.receive_data(chunk)
        while (event := receiver.next_event()) is not None:
            received.append(event)
            # A subscriber that subscribes again as soon as a stream ends, as a shell might.
            if isinstance(event, OnComplete | OnError) and event.subscriber in SUBSCRIBED:
                receiver.send(Subscribe("again", event.subscriber))
    assert received == sent
    assert receiver.closed == sender.closed == (bool(sent) and isinstance(sent[-1], Goodbye))


def read_all_or_refuse(connection: Connection, chunks: list[bytes]) -> list[Event]:
    """Every event from ``chunks``; a ProtocolError (the only exception allowed) ends the reading for good."""
    events: list[Event] = []
    refused: ProtocolError | None = None
    for chunk in chunks:
        if refused is not None:
            break
        connection.receive_data(chunk)
        while True:
            try:
                event = connection.next_event()
            except ProtocolError as error:
                refused = error
                break
            if event is None:
                break
            assert isinstance(event, EVENT_TYPES)
            events.append(event)
    if refused is not None:
        assert str(refused)
        assert str(refused).isprintable()
        with pytest.raises(ProtocolError) as again:
            connection.next_event()
        assert again.value is refused
    return events


def fuzz_receiver(client: bool, max_message: int = 16 << 20) -> Connection:
    """A side that sent its hello (listing publish) and subscribed ids 0..2, so every path is reachable."""
    connection = Connection(client=client, max_message=max_message)
    connection.send(ClientHello(0, (EXT_PUBLISH,)) if client else ServerHello(0, (EXT_PUBLISH,)))
    for subscriber in range(3):
        connection.send(Subscribe("t", subscriber))
    return connection


@FUZZ
@given(client=st.booleans(), garbage=st.binary(max_size=120), cuts=st.lists(st.integers(0, 200), max_size=8),
       max_message=st.sampled_from([22, 40, 16 << 20]))
def test_fuzz_arbitrary_bytes_after_a_valid_hello(client: bool, garbage: bytes, cuts: list[int],
                                                  max_message: int) -> None:
    connection = fuzz_receiver(client, max_message)
    hello = b"\x01\x00\x01\x01" if client else b"\x00\x00\x01\x01"
    # Stream 1 of ours is fixed-size, so the bytes also reach the unprefixed onNext and onNextPacked.
    events = read_all_or_refuse(connection, chunked(hello + b"\x06\x01\x03" + garbage, cuts))
    assert events[:2] == [(ServerHello if client else ClientHello)(0, (1,)), OnSubscribe(1, 3)]


MUTATIONS = ["flip", "cut", "drop", "insert", "truncate"]


@FUZZ
@given(client=st.booleans(), data=st.data())
def test_fuzz_mutated_conversation(client: bool, data: st.DataObject) -> None:
    stream = bytearray(SIDE_STREAMS["S" if client else "C"])
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        index = data.draw(st.integers(0, len(stream) - 1), label="index")
        kind = data.draw(st.sampled_from(MUTATIONS), label="mutation")
        if kind == "flip":
            stream[index] ^= data.draw(st.integers(1, 255), label="mask")
        elif kind == "cut":
            del stream[index : data.draw(st.integers(index, len(stream)), label="end")]
        elif kind == "drop":
            del stream[index]
        elif kind == "insert":
            stream[index:index] = data.draw(st.binary(min_size=1, max_size=4), label="inserted")
        else:
            del stream[index:]
        if not stream:
            break
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=6), label="cuts")
    read_all_or_refuse(fuzz_receiver(client), chunked(bytes(stream), cuts))


def test_module_constants() -> None:
    assert (rstreams.VERSION, rstreams.EXT_PUBLISH) == (0, 1)
    assert UNBOUNDED == 2**63 - 1
    assert MAX_VARINT == 2**64 - 1


def test_events_are_frozen() -> None:
    with pytest.raises(AttributeError):
        OnNext(1, b"x").element = b"y"  # type: ignore[misc]
    assert Subscribe("t", 1) == Subscribe("t", 1, 0)
    assert OnSubscribe(1) == OnSubscribe(1, 0)
