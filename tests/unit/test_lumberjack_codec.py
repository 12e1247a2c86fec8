"""The Lumberjack codec (protocol/lumberjack.py): exact wire vectors for every frame in both versions (fed
whole, byte by byte and followed by the next frame), the encoders, every malformed input and every limit
(refused with ProtocolError, size limits as soon as the length is read), zip bombs refused without inflating
them, the ack rule for Beats, logstash-forwarder and streaming writers (rollover, W 0, held acks,
keepalives), hypothesis round-trips and fuzzing whose only allowed failure is ProtocolError.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import re
import struct
import tracemalloc
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import ProtocolError, lumberjack
from protocol.lumberjack import (
    MAX_COMPRESSED_DEPTH,
    V1,
    V2,
    Ack,
    AckWindow,
    ClientConnection,
    Event,
    ServerConnection,
    Window,
)

HYPOTHESIS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
U32_MAX = 2**32 - 1


# ------------------------------------------------------------------------------------------------- helpers


def u32(value: int) -> bytes:
    return struct.pack(">I", value)


def window(size: int, version: bytes = b"2") -> bytes:
    return version + b"W" + u32(size)


def data(seq: int, pairs: list[tuple[bytes, bytes]], version: bytes = b"1") -> bytes:
    """A D frame with raw key and value bytes."""
    body = b"".join(u32(len(key)) + key + u32(len(value)) + value for key, value in pairs)
    return version + b"D" + u32(seq) + u32(len(pairs)) + body


def jframe(seq: int, document: bytes, version: bytes = b"2") -> bytes:
    return version + b"J" + u32(seq) + u32(len(document)) + document


def compressed(inner: bytes, version: bytes = b"2", **options: int) -> bytes:
    payload = zlib.compress(inner, **options)
    return version + b"C" + u32(len(payload)) + payload


def raw_compressed(payload: bytes, version: bytes = b"2") -> bytes:
    """A C frame around ``payload`` exactly as given (no compression done here)."""
    return version + b"C" + u32(len(payload)) + payload


def drain(connection: ServerConnection | ClientConnection) -> list[object]:
    """Every event the connection has, going on while it is busy (a compressed frame inflated in steps)."""
    events: list[object] = []
    while (event := connection.next_event()) is not None or getattr(connection, "busy", False):
        if event is not None:
            events.append(event)
    return events


def feed_whole(stream: bytes, **limits: int) -> list[object]:
    server = ServerConnection(**limits)
    server.receive_data(stream)
    return drain(server)


def feed_bytewise(stream: bytes, **limits: int) -> list[object]:
    server = ServerConnection(**limits)
    events: list[object] = []
    for index in range(len(stream)):
        server.receive_data(stream[index : index + 1])
        events += drain(server)
    return events


def chunked(stream: bytes, cuts: list[int]) -> list[bytes]:
    """``stream`` split at ``cuts`` (positions, any order, out-of-range ones clipped)."""
    points = sorted({min(max(cut, 0), len(stream)) for cut in cuts} | {0, len(stream)})
    return [stream[a:b] for a, b in itertools.pairwise(points)]


# ------------------------------------------------------------------------------------------ reader vectors

# The zlib streams below were written by zlib.compress(..., 6) once and are kept as literal bytes: any inflate
# reads them, whatever a given zlib would write today.
Z_1C = bytes.fromhex("78 9c 33 74 61 60 60 60 84 62 96 9c cc bc 54 10 3b d1 10 24 cc 84 2e 9c 04 00 68 f0"
                     "05 0d")
Z_2C = bytes.fromhex("78 9c 33 f2 62 60 60 60 04 62 f6 6a a5 5c 25 2b c3 5a 23 90 00 13 5c c0 a8 16 00 4d"
                     "72 05 33")
# An outer payload holding a 2C (whose own stream is Z_INNERMOST) and then a 2J.
Z_INNERMOST = bytes.fromhex("78 9c 33 f2 62 60 60 60 04 62 f6 6a a5 44 25 2b c3 5a 00 10 6a 02 8d")
Z_NESTED = bytes.fromhex(
    "78 9c 33 72 66 60 60 10 af 98 63 fc 29 29 21 21 81 25 e9 5b d6 52 17 55 ed c3 51 0c 02 59 4c bd 46 5e"
    "40 49 26 20 66 af 56 4a 52 b2 32 aa 05 00 36 9a 0b fc"
)
Z_WINDOW_INSIDE = bytes.fromhex("78 9c 33 0a 67 60 60 60 32 f2 02 92 8c 40 cc 5e ad 94 ab 64 65 58 0b 00 1c"
                                "c8 03 24")

ONE_D_TWO_PAIRS = bytes.fromhex(
    "31 44 00 00 00 07 00 00 00 02 00 00 00 04 6c 69 6e 65 00 00 00 05 68 65 6c 6c 6f 00 00 00 04 68 6f 73"
    "74 00 00 00 02 68 31"
)
TWO_J = bytes.fromhex("32 4a 00 00 00 01 00 00 00 10") + b'{"message":"hi"}'

# (name, wire, the events it decodes to)
READER_VECTORS: list[tuple[str, bytes, list[object]]] = [
    ("1W", bytes.fromhex("31 57 00 00 00 0a"), [Window(V1, 10)]),
    ("2W", bytes.fromhex("32 57 00 00 04 00"), [Window(V2, 1024)]),
    ("2W 0", bytes.fromhex("32 57 00 00 00 00"), [Window(V2, 0)]),
    ("1D two pairs", ONE_D_TWO_PAIRS, [Event(V1, 7, {"line": "hello", "host": "h1"})]),
    ("1D no pairs", bytes.fromhex("31 44 ff ff ff ff 00 00 00 00"), [Event(V1, U32_MAX, {})]),
    ("1D empty key and value", bytes.fromhex("31 44 00 00 00 01 00 00 00 01 00 00 00 00 00 00 00 00"),
     [Event(V1, 1, {"": ""})]),
    ("1D repeated key: the last wins", data(3, [(b"k", b"a"), (b"k", b"b")]), [Event(V1, 3, {"k": "b"})]),
    ("1D UTF-8", data(4, [("clé".encode(), "☃".encode())]), [Event(V1, 4, {"clé": "☃"})]),
    ("1D invalid UTF-8 is replaced", data(5, [(b"k\xff", b"\xc3")]), [Event(V1, 5, {"k\ufffd": "\ufffd"})]),
    ("2J", TWO_J, [Event(V2, 1, {"message": "hi"})]),
    ("2J nested document", jframe(9, '{"a":[1,2.5,null,true],"b":{"c":"é"}}'.encode()),
     [Event(V2, 9, {"a": [1, 2.5, None, True], "b": {"c": "é"}})]),
    ("2J empty object", jframe(0, b" {} "), [Event(V2, 0, {})]),
    ("2J invalid UTF-8 is replaced", jframe(2, b'{"m":"\xff"}'), [Event(V2, 2, {"m": "\ufffd"})]),
    ("2D (read under either version)", data(6, [(b"a", b"b")], b"2"), [Event(V2, 6, {"a": "b"})]),
    ("1J (read under either version)", jframe(6, b'{"a":"b"}', b"1"), [Event(V1, 6, {"a": "b"})]),
    ("1C holding two 1D", b"1C" + u32(len(Z_1C)) + Z_1C,
     [Event(V1, 1, {"line": "a"}), Event(V1, 2, {"line": "b"})]),
    ("2C holding two 2J", b"2C" + u32(len(Z_2C)) + Z_2C, [Event(V2, 1, {"m": 1}), Event(V2, 2, {"m": 2})]),
    ("2C nested in 2C", b"2C" + u32(len(Z_NESTED)) + Z_NESTED,
     [Event(V2, 1, {"a": 1}), Event(V2, 2, {"b": 2})]),
    ("2C holding a window", b"2C" + u32(len(Z_WINDOW_INSIDE)) + Z_WINDOW_INSIDE,
     [Window(V2, 2), Event(V2, 1, {"m": 1})]),
    ("2C empty payload", raw_compressed(bytes.fromhex("78 9c 03 00 00 00 00 01")), []),
]
NEXT_FRAME = window(5, b"1")


def test_compressed_vectors_hold_what_they_claim() -> None:
    assert zlib.decompress(Z_1C) == data(1, [(b"line", b"a")]) + data(2, [(b"line", b"b")])
    assert zlib.decompress(Z_2C) == jframe(1, b'{"m":1}') + jframe(2, b'{"m":2}')
    assert zlib.decompress(Z_INNERMOST) == jframe(1, b'{"a":1}')
    assert zlib.decompress(Z_NESTED) == raw_compressed(Z_INNERMOST) + jframe(2, b'{"b":2}')
    assert zlib.decompress(Z_WINDOW_INSIDE) == window(2) + jframe(1, b'{"m":1}')


@pytest.mark.parametrize(("wire", "expected"), [v[1:] for v in READER_VECTORS],
                         ids=[v[0] for v in READER_VECTORS])
def test_reader_vector_whole_bytewise_and_with_trailing_data(wire: bytes, expected: list[object]) -> None:
    assert feed_whole(wire) == expected
    assert feed_bytewise(wire) == expected
    # Followed by the start of the next frame: the events come out, the rest waits for its bytes.
    server = ServerConnection()
    server.receive_data(wire + NEXT_FRAME[:3])
    assert drain(server) == expected
    assert server.next_event() is None
    server.receive_data(NEXT_FRAME[3:])
    assert drain(server) == [Window(V1, 5)]
    assert feed_bytewise(wire + wire + NEXT_FRAME) == expected + expected + [Window(V1, 5)]


def test_all_vectors_in_one_stream() -> None:
    stream = b"".join(wire for _, wire, _ in READER_VECTORS)
    expected = [event for _, _, events in READER_VECTORS for event in events]
    assert feed_whole(stream) == expected
    assert feed_bytewise(stream) == expected


def test_compressed_events_come_out_one_at_a_time_before_the_next_frame_is_read() -> None:
    server = ServerConnection()
    server.receive_data(b"2C" + u32(len(Z_2C)) + Z_2C + b"2W")
    assert server.next_event() == Event(V2, 1, {"m": 1})
    assert server.next_event() == Event(V2, 2, {"m": 2})
    assert server.next_event() is None
    server.receive_data(u32(7))
    assert server.next_event() == Window(V2, 7)


def test_a_large_data_frame_in_small_pieces() -> None:
    pairs = [(b"key%d" % i, b"value %d" % i) for i in range(3000)]
    wire = data(42, pairs)
    server = ServerConnection()
    events: list[object] = []
    for chunk in chunked(wire, list(range(0, len(wire), 7))):
        server.receive_data(chunk)
        events += drain(server)
    assert events == [Event(V1, 42, {key.decode(): value.decode() for key, value in pairs})]


def test_frames_of_exactly_max_frame_bytes_are_accepted() -> None:
    document = b'{"m":"' + b"x" * 84 + b'"}'
    assert len(jframe(1, document)) == 102
    assert feed_whole(jframe(1, document), max_frame=102) == [Event(V2, 1, {"m": "x" * 84})]
    d_frame = data(1, [(b"k", b"v" * 79)])
    assert len(d_frame) == 98
    assert feed_bytewise(d_frame, max_frame=98) == [Event(V1, 1, {"k": "v" * 79})]
    c_frame = compressed(jframe(1, b"{}"))
    assert feed_whole(c_frame, max_frame=len(c_frame)) == [Event(V2, 1, {})]


def test_max_decompressed_is_inclusive_and_counts_nested_payloads_together() -> None:
    inner = jframe(1, b'{"m":"' + b"y" * 40 + b'"}')  # 58 bytes
    assert feed_whole(compressed(inner), max_decompressed=58) == [Event(V2, 1, {"m": "y" * 40})]
    with pytest.raises(ProtocolError, match="inflates to more than 57 bytes"):
        feed_whole(compressed(inner), max_decompressed=57)
    # An outer payload holding two C frames: each fits alone, together they do not.
    inner_frame = compressed(inner)
    outer = compressed(inner_frame + inner_frame)
    budget = len(inner_frame) * 2 + 58 * 2
    assert feed_whole(outer, max_decompressed=budget) == [Event(V2, 1, {"m": "y" * 40})] * 2
    with pytest.raises(ProtocolError, match="inflates to more than"):
        feed_whole(outer, max_decompressed=budget - 1)
    # The budget is per top-level C frame: the next one starts afresh.
    assert feed_whole(outer + outer, max_decompressed=budget) == [Event(V2, 1, {"m": "y" * 40})] * 4


def nest(frame: bytes, levels: int) -> bytes:
    for _ in range(levels):
        frame = compressed(frame)
    return frame


def test_compressed_frames_nest_up_to_the_limit() -> None:
    assert MAX_COMPRESSED_DEPTH == 4
    assert feed_whole(nest(jframe(1, b"{}"), MAX_COMPRESSED_DEPTH)) == [Event(V2, 1, {})]
    with pytest.raises(ProtocolError, match="nested more than 4 deep"):
        feed_whole(nest(jframe(1, b"{}"), MAX_COMPRESSED_DEPTH + 1))


def test_a_long_run_of_empty_compressed_frames_is_read_in_a_loop() -> None:
    empty = compressed(b"")
    assert feed_whole(empty * 5000 + window(3)) == [Window(V2, 3)]


# ------------------------------------------------------------------------------------------ writer vectors

ACK_VECTORS: list[tuple[str, bytes, Ack]] = [
    ("1A", bytes.fromhex("31 41 00 00 00 05"), Ack(V1, 5)),
    ("2A", bytes.fromhex("32 41 00 00 00 03"), Ack(V2, 3)),
    ("2A keepalive", bytes.fromhex("32 41 00 00 00 00"), Ack(V2, 0)),
    ("2A highest seq", bytes.fromhex("32 41 ff ff ff ff"), Ack(V2, U32_MAX)),
]


@pytest.mark.parametrize(("wire", "ack"), [v[1:] for v in ACK_VECTORS], ids=[v[0] for v in ACK_VECTORS])
def test_ack_vector_both_ways(wire: bytes, ack: Ack) -> None:
    assert ServerConnection().send(ack) == wire
    for version in (V1, V2):  # a writer reads acks under either version byte
        client = ClientConnection(version=version)
        client.receive_data(wire + wire[:4])
        assert client.next_event() == ack
        assert client.next_event() is None
        client.receive_data(wire[4:])
        assert client.next_event() == ack
        assert client.next_event() is None
    client = ClientConnection()
    acks = []
    for byte in wire * 2:
        client.receive_data(bytes((byte,)))
        acks += drain(client)
    assert acks == [ack, ack]


def test_writer_encodes_windows() -> None:
    assert ClientConnection(version=V1).send_window(10) == bytes.fromhex("31 57 00 00 00 0a")
    assert ClientConnection().send_window(1024) == bytes.fromhex("32 57 00 00 04 00")
    assert ClientConnection().send_window(0) == bytes.fromhex("32 57 00 00 00 00")
    assert ClientConnection().version == V2


def test_writer_encodes_data_frames_exactly() -> None:
    v1 = ClientConnection(version=V1)
    assert v1.send_events([(7, {"line": "hello", "host": "h1"})]) == ONE_D_TWO_PAIRS
    # Keys and values go through str().
    assert v1.send_events([(1, {"n": 5, "ok": True, 3: None})]) == data(
        1, [(b"n", b"5"), (b"ok", b"True"), (b"3", b"None")])
    v2 = ClientConnection()
    assert v2.send_events([(1, {"message": "hi"})]) == TWO_J
    # Compact separators, UTF-8 written as is.
    assert v2.send_events([(2, {"a": [1, None], "é": "☃"})]) == jframe(2, '{"a":[1,null],"é":"☃"}'.encode())
    assert v2.send_events([(1, {})]) == jframe(1, b"{}")
    assert v2.send_events([]) == b""
    assert v2.send_events([], compress=True) == b""


@pytest.mark.parametrize("version", [V1, V2])
@pytest.mark.parametrize("level", [0, 1, 6, 9])
def test_writer_compresses_all_events_into_one_frame(version: int, level: int) -> None:
    client = ClientConnection(version=version)
    events = [(1, {"m": "a"}), (2, {"m": "b"}), (3, {"m": "c"})]
    frames = client.send_events(events)
    wire = client.send_events(events, compress=True, level=level)
    payload = zlib.compress(frames, level)
    assert wire == bytes((version,)) + b"C" + u32(len(payload)) + payload
    assert zlib.decompress(wire[6:]) == frames
    assert feed_whole(wire) == [Event(version, seq, fields) for seq, fields in events]
    assert client.send_events(events, compress=True) == client.send_events(events, compress=True, level=6)


# -------------------------------------------------------------------------------------------------- errors

GZIP = zlib.compressobj(wbits=31)
GZIP_PAYLOAD = GZIP.compress(jframe(1, b"{}")) + GZIP.flush()
RAW = zlib.compressobj(wbits=-15)
RAW_PAYLOAD = RAW.compress(jframe(1, b"{}")) + RAW.flush()
GOOD_PAYLOAD = zlib.compress(jframe(1, b"{}"))

# (name, wire, limits, what the error says)
READER_ERRORS: list[tuple[str, bytes, dict[str, int], str]] = [
    ("version byte '3'", window(1, b"3"), {}, r"bad version byte 0x33 \('3'\)"),
    ("version byte 0", b"\x00W" + u32(1), {}, "bad version byte 0x00"),
    ("version byte 1 (not ASCII)", b"\x01D" + u32(1) + u32(0), {}, "bad version byte 0x01"),
    ("unknown type", b"2X" + u32(1), {}, r"unknown frame type 0x58 \('X'\)"),
    ("lower-case type", b"2w" + u32(1), {}, "unknown frame type 0x77"),
    ("an ack from the writer", b"2A" + u32(1), {}, "acks are sent by the reader only"),
    ("window over the limit", window(101), {"max_window": 100}, "window of 101 data frames is over the"),
    ("window over the default limit", window(65537), {}, "over the limit of 65536"),
    ("J holding an array", jframe(1, b"[1]"), {}, "must be an object, not list"),
    ("J holding a string", jframe(1, b'"x"'), {}, "must be an object, not str"),
    ("J holding a number", jframe(1, b"1"), {}, "must be an object, not int"),
    ("J holding null", jframe(1, b"null"), {}, "must be an object, not NoneType"),
    ("J holding true", jframe(1, b"true"), {}, "must be an object, not bool"),
    ("J not JSON", jframe(1, b"{"), {}, "not valid JSON"),
    ("J empty", jframe(1, b""), {}, "not valid JSON"),
    ("J with two documents", jframe(1, b"{}{}"), {}, "not valid JSON"),
    ("J nested too deeply", jframe(1, b"[" * 100_000), {}, "nested too deeply"),
    ("J with a 5000-digit integer", jframe(1, b'{"n":' + b"9" * 5000 + b"}"), {}, "not valid JSON"),
    ("J over max_frame", jframe(1, b"{}" + b" " * 100), {"max_frame": 111}, "JSON frame of 112 bytes"),
    ("D count over max_frame", b"1D" + u32(1) + u32(U32_MAX), {}, "data frame of 34359738370 bytes"),
    ("D key over max_frame", data(1, [(b"k" * 90, b"")]), {"max_frame": 100}, "pair key of 90 bytes"),
    ("D value over max_frame", data(1, [(b"k", b"v" * 90)]), {"max_frame": 100}, "pair value of 90 bytes"),
    ("C over max_frame", raw_compressed(b"\x00" * 100), {"max_frame": 105}, "compressed frame of 106 bytes"),
    ("C holding garbage", raw_compressed(b"not zlib at all"), {}, "bad zlib stream"),
    ("C holding raw deflate", raw_compressed(RAW_PAYLOAD), {}, "bad zlib stream"),
    ("C holding gzip", raw_compressed(GZIP_PAYLOAD), {}, "bad zlib stream"),
    ("C with a bad checksum", raw_compressed(GOOD_PAYLOAD[:-1] + bytes((GOOD_PAYLOAD[-1] ^ 1,))), {},
     "bad zlib stream"),
    ("C empty", raw_compressed(b""), {}, "truncated zlib stream"),
    ("C truncated zlib", raw_compressed(GOOD_PAYLOAD[:-3]), {}, "truncated zlib stream"),
    ("C with bytes after the zlib stream", raw_compressed(GOOD_PAYLOAD + b"xy"), {},
     "2 bytes follow the zlib stream"),
    ("C holding a partial frame", compressed(jframe(1, b"{}") + jframe(2, b"{}")[:-1]), {},
     "partial frame at offset 12"),
    ("C holding one byte", compressed(b"2"), {}, "partial frame at offset 0"),
    ("C holding a partial D frame", compressed(data(1, [(b"k", b"v")])[:-1], b"1"), {}, "partial frame"),
    ("C holding an ack", compressed(jframe(1, b"{}") + b"2A" + u32(1)), {}, "acks are sent by the reader"),
    ("C holding a bad version", compressed(b"9J" + u32(1) + u32(2) + b"{}"), {}, "bad version byte"),
    ("C holding a J that is not an object", compressed(jframe(1, b"[]")), {}, "must be an object"),
    ("C holding a window over the limit", compressed(window(11)), {"max_window": 10}, "over the limit of 10"),
    ("C holding a frame over max_frame", compressed(jframe(1, b"{}" + b" " * 100)), {"max_frame": 100},
     "JSON frame of 112 bytes"),
    ("C inflating past max_decompressed", compressed(b"\x00" * 1000), {"max_decompressed": 999},
     "inflates to more than 999 bytes"),
]


@pytest.mark.parametrize(("wire", "limits", "text"), [e[1:] for e in READER_ERRORS],
                         ids=[e[0] for e in READER_ERRORS])
def test_reader_refuses(wire: bytes, limits: dict[str, int], text: str) -> None:
    with pytest.raises(ProtocolError, match=text):
        feed_whole(wire, **limits)
    # Byte by byte: no event comes out first, and the same error is raised.
    with pytest.raises(ProtocolError, match=text):
        feed_bytewise(wire, **limits)


@pytest.mark.parametrize(("wire", "limits", "text"), [e[1:] for e in READER_ERRORS],
                         ids=[e[0] for e in READER_ERRORS])
def test_reader_errors_are_final(wire: bytes, limits: dict[str, int], text: str) -> None:
    server = ServerConnection(**limits)
    server.receive_data(window(1) + wire)
    assert server.next_event() == Window(V2, 1)
    with pytest.raises(ProtocolError, match=text):
        server.next_event()
    # The framing is lost: later input is dropped and the same error comes back.
    server.receive_data(window(2))
    with pytest.raises(ProtocolError, match=text):
        server.next_event()


# A prefix that must be enough to refuse the frame: only the header or the length field, never the bytes
# it announces.
EARLY_REFUSALS: list[tuple[str, bytes, dict[str, int], str]] = [
    ("J length over max_frame", b"2J" + u32(1) + u32(U32_MAX), {}, "JSON frame of 4294967305 bytes"),
    ("J length over a small max_frame", b"2J" + u32(1) + u32(91), {"max_frame": 100}, "JSON frame"),
    ("C length over max_frame", b"2C" + u32(16 << 20), {}, "compressed frame of 16777222 bytes"),
    ("D pair count over max_frame", b"1D" + u32(1) + u32(2 << 20), {}, "data frame of 16777226 bytes"),
    ("D key length over max_frame", b"1D" + u32(1) + u32(1) + u32(16 << 20), {}, "pair key of 16777216"),
    ("D value length over max_frame", b"1D" + u32(1) + u32(2) + u32(1) + b"k" + u32(16 << 20), {},
     "pair value of 16777216"),
    ("window over the limit", window(11), {"max_window": 10}, "window of 11"),
    ("unknown type", b"2Z", {}, "unknown frame type"),
    ("bad version", b"0W", {}, "bad version byte"),
]


@pytest.mark.parametrize(("prefix", "limits", "text"), [e[1:] for e in EARLY_REFUSALS],
                         ids=[e[0] for e in EARLY_REFUSALS])
def test_sizes_and_bad_headers_are_refused_before_the_frame_arrives(prefix: bytes, limits: dict[str, int],
                                                                    text: str) -> None:
    server = ServerConnection(**limits)
    server.receive_data(prefix[:-1])
    assert server.next_event() is None
    server.receive_data(prefix[-1:])
    with pytest.raises(ProtocolError, match=text):
        server.next_event()


def test_a_compressed_frame_with_a_bad_end_yields_none_of_its_events() -> None:
    server = ServerConnection()
    server.receive_data(compressed(jframe(1, b"{}") + jframe(2, b"{}") + b"2J" + u32(3)))
    with pytest.raises(ProtocolError, match="partial frame at offset 24"):
        server.next_event()


@pytest.mark.parametrize(
    ("wire", "text"),
    [
        (window(1), "window frame from the reader"),
        (jframe(1, b"{}"), "JSON frame from the reader"),
        (data(1, []), "data frame from the reader"),
        (compressed(b""), "compressed frame from the reader"),
        (b"2Q", "unknown frame type 0x51"),
        (b"3A" + u32(1), "bad version byte 0x33"),
    ],
)
def test_writer_refuses_anything_but_acks(wire: bytes, text: str) -> None:
    client = ClientConnection()
    client.receive_data(bytes.fromhex("32 41 00 00 00 01") + wire)
    assert client.next_event() == Ack(V2, 1)
    with pytest.raises(ProtocolError, match=text):
        client.next_event()
    client.receive_data(bytes.fromhex("32 41 00 00 00 02"))
    with pytest.raises(ProtocolError, match=text):
        client.next_event()


def test_reader_send_refuses_what_the_wire_cannot_carry() -> None:
    server = ServerConnection()
    with pytest.raises(ValueError, match=r"0\.\.2"):
        server.send(Ack(V2, -1))
    with pytest.raises(ValueError, match=r"0\.\.2"):
        server.send(Ack(V2, 2**32))
    with pytest.raises(ValueError, match="version"):
        server.send(Ack(0x33, 1))
    with pytest.raises(ValueError, match="version"):
        server.send(Ack(2, 1))
    with pytest.raises(TypeError, match="integer"):
        server.send(Ack(V2, True))
    with pytest.raises(TypeError, match="only Ack"):
        server.send(Window(V2, 1))  # type: ignore[arg-type]


def test_writer_send_refuses_what_the_wire_cannot_carry() -> None:
    client = ClientConnection()
    v1 = ClientConnection(version=V1)
    with pytest.raises(ValueError, match=r"0\.\.2"):
        client.send_window(-1)
    with pytest.raises(ValueError, match=r"0\.\.2"):
        client.send_window(2**32)
    with pytest.raises(ValueError, match=r"0\.\.2"):
        client.send_events([(2**32, {})])
    with pytest.raises(TypeError, match="must be a dict"):
        client.send_events([(1, [("a", "b")])])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="Out of range float"):
        client.send_events([(1, {"x": float("nan")})])
    with pytest.raises(TypeError, match="not JSON serializable"):
        client.send_events([(1, {"x": object()})])
    for connection in (client, v1):
        with pytest.raises(ValueError, match="not encodable as UTF-8"):
            connection.send_events([(1, {"x": "\ud800"})])
    with pytest.raises(ValueError, match="zlib level"):
        client.send_events([(1, {})], compress=True, level=10)
    small = ClientConnection(max_frame=100)
    assert len(small.send_events([(1, {"m": "x" * 82})])) == 100
    with pytest.raises(ValueError, match="JSON frame of 101 bytes is over max_frame"):
        small.send_events([(1, {"m": "x" * 83})])
    v1_small = ClientConnection(version=V1, max_frame=100)
    assert len(v1_small.send_events([(1, {"k": "v" * 81})])) == 100
    with pytest.raises(ValueError, match="data frame of 101 bytes"):
        v1_small.send_events([(1, {"k": "v" * 82})])
    # Each frame fits alone; the three compressed together do not.
    noisy = [(seq, {"m": hashlib.sha256(bytes([seq])).hexdigest()}) for seq in range(3)]
    assert all(len(ClientConnection(max_frame=120).send_events([event])) <= 120 for event in noisy)
    with pytest.raises(ValueError, match=r"compressed frame of 1\d\d bytes is over max_frame"):
        ClientConnection(max_frame=120).send_events(noisy, compress=True)


@pytest.mark.parametrize(
    ("factory", "text"),
    [
        (lambda: ServerConnection(max_window=0), "max_window"),
        (lambda: ServerConnection(max_frame=5), "max_frame"),
        (lambda: ServerConnection(max_decompressed=0), "max_decompressed"),
        (lambda: ClientConnection(version=3), "version"),
        (lambda: ClientConnection(version=ord("3")), "version"),
        (lambda: ClientConnection(max_frame=True), "max_frame"),
        (lambda: AckWindow(keepalive_interval=0), "keepalive_interval"),
    ],
)
def test_constructors_refuse_bad_limits(factory: object, text: str) -> None:
    with pytest.raises(ValueError, match=text):
        factory()  # type: ignore[operator]


# ---------------------------------------------------------------------------------------------- zip bombs

BOMB_SIZE = 200 << 20
_MIB_OF_ZEROS = bytes(1 << 20)


def zeros_stream(mebibytes: int) -> bytes:
    """A genuine zlib stream of ``mebibytes`` MiB of zeros, built without compressing them all: after a full
    flush the compressor starts afresh, so every further MiB compresses to the same segment, which is
    repeated; then an empty final stored block and the Adler-32 of the whole."""
    compressor = zlib.compressobj(9)
    first = compressor.compress(_MIB_OF_ZEROS) + compressor.flush(zlib.Z_FULL_FLUSH)
    segment = compressor.compress(_MIB_OF_ZEROS) + compressor.flush(zlib.Z_FULL_FLUSH)
    assert first[2:] == segment  # the zlib header, then the same segment
    checksum = 1
    for _ in range(mebibytes):
        checksum = zlib.adler32(_MIB_OF_ZEROS, checksum)
    return first[:2] + segment * mebibytes + b"\x01\x00\x00\xff\xff" + u32(checksum)


@functools.cache
def bomb() -> bytes:
    return raw_compressed(zeros_stream(BOMB_SIZE >> 20))


def test_the_bomb_is_a_small_genuine_zlib_stream() -> None:
    assert zlib.decompress(zeros_stream(3)) == bytes(3 << 20)
    assert len(bomb()) < 256 << 10  # 200 MiB of zeros in about 200 KiB


def until_event(server: ServerConnection) -> object:
    """``next_event`` called while the reader is busy (inflating in steps): the first real answer."""
    while (event := server.next_event()) is None and server.busy:
        pass
    return event


def inflate_peak(wire: bytes, **limits: int) -> tuple[ProtocolError, int]:
    """The error feeding ``wire`` raises and the peak memory allocated meanwhile."""
    server = ServerConnection(**limits)
    server.receive_data(wire)
    tracemalloc.start()
    try:
        with pytest.raises(ProtocolError) as info:
            until_event(server)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return info.value, peak


@functools.cache
def framed_bomb(frames: int = 5, size: int = 15 << 20) -> bytes:
    """A compressed frame holding ``frames`` well-formed J frames of ``size`` bytes of JSON whitespace each:
    its framing is right, so only the inflation limit stops it."""
    compressor = zlib.compressobj(9)
    parts = []
    spaces = b" " * (1 << 20)
    for seq in range(1, frames + 1):
        parts.append(compressor.compress(b"2J" + u32(seq) + u32(size) + b"{"))
        whole, rest = divmod(size - 2, len(spaces))
        parts.extend(compressor.compress(spaces) for _ in range(whole))
        parts.append(compressor.compress(spaces[:rest] + b"}"))
    parts.append(compressor.flush())
    return raw_compressed(b"".join(parts))


def test_zip_bomb_is_refused_at_the_default_limit_without_inflating_it() -> None:
    assert len(framed_bomb()) < 256 << 10  # 75 MiB of frames
    error, peak = inflate_peak(framed_bomb())
    assert str(error) == "a compressed frame inflates to more than 67108864 bytes"
    # Bounded by the limit (64 MiB and a little slack), not by the 75 MiB the frame holds.
    assert peak < (64 << 20) * 5 // 4


def test_zip_bomb_is_refused_at_a_small_limit_almost_for_free() -> None:
    error, peak = inflate_peak(framed_bomb(), max_decompressed=1 << 20)
    assert "inflates to more than 1048576 bytes" in str(error)
    assert peak < 4 << 20


def test_zip_bomb_nested_inside_a_compressed_frame_is_refused() -> None:
    error, peak = inflate_peak(compressed(framed_bomb()), max_decompressed=1 << 20)
    assert "inflates to more than 1048576 bytes" in str(error)
    assert peak < 4 << 20


def test_a_bomb_that_is_not_frames_is_refused_at_its_first_byte() -> None:
    # 200 MiB of zeros: the first inflated step already shows a bad version byte.
    error, peak = inflate_peak(bomb())
    assert str(error) == "bad version byte 0x00 (expected '1' or '2')"
    assert peak < 4 << 20
    error, _ = inflate_peak(compressed(bomb()))
    assert "bad version byte 0x00" in str(error)


def test_inflation_comes_in_bounded_steps() -> None:
    events = [(seq, {"m": "x" * 1000}) for seq in range(1, 4001)]  # about 4 MiB inflated
    writer = ClientConnection(version=V2, max_frame=16 << 20)
    server = ServerConnection()
    server.receive_data(writer.send_window(4000) + writer.send_events(events, compress=True))
    assert server.next_event() == Window(V2, 4000)
    steps = 0
    while (event := server.next_event()) is None:
        assert server.busy
        steps += 1
    assert steps >= (4 << 20) // lumberjack.INFLATE_STEP - 1
    assert isinstance(event, Event)
    assert event.seq == 1
    assert not server.busy
    assert len(drain(server)) == 3999


def test_a_compressed_frame_holds_at_most_twice_a_window_of_frames() -> None:
    two_windows = window(1) * 8
    assert feed_whole(compressed(two_windows), max_window=4) == [Window(V2, 1)] * 8
    with pytest.raises(ProtocolError, match="holds more than 8 frames"):
        feed_whole(compressed(two_windows + window(1)), max_window=4)
    # Nested frames count against the same top-level frame.
    with pytest.raises(ProtocolError, match="holds more than 8 frames"):
        feed_whole(compressed(compressed(window(1) * 6) + window(1) * 3), max_window=4)


# ------------------------------------------------------------------------------------------------ ack rule


def events(window_: AckWindow, seqs: list[int], version: int = V2, now: float = 0.0) -> list[Ack]:
    """Every ack due while the data frames ``seqs`` arrive."""
    due: list[Ack] = []
    for seq in seqs:
        due += window_.event(Event(version, seq, {}), now)
    return due


def test_beats_batches_restart_at_one_and_each_gets_its_highest_seq() -> None:
    acks = AckWindow()
    assert acks.window(Window(V2, 3), 0.0) == []
    assert [acks.event(Event(V2, seq, {}), 0.0) for seq in (1, 2, 3)] == [[], [], [Ack(V2, 3)]]
    assert acks.pending == 0
    # The second batch in flight: sequence restarts at 1, which is not an error.
    assert acks.window(Window(V2, 2), 0.0) == []
    assert [acks.event(Event(V2, seq, {}), 0.0) for seq in (1, 2)] == [[], [Ack(V2, 2)]]


def test_beats_round_trip_through_both_connections() -> None:
    # Two batches of a Beats writer, the second one compressed, read by the broker, acked, read back.
    writer = ClientConnection()
    wire = (writer.send_window(3) + writer.send_events([(1, {"n": 1}), (2, {"n": 2}), (3, {"n": 3})])
            + writer.send_window(2) + writer.send_events([(1, {"n": 4}), (2, {"n": 5})], compress=True))
    reader = ServerConnection()
    reader.receive_data(wire)
    accounting = AckWindow()
    due: list[Ack] = []
    received = []
    for frame in drain(reader):
        if isinstance(frame, Window):
            due += accounting.window(frame, 0.0)
        else:
            assert isinstance(frame, Event)
            received.append(frame.fields["n"])
            due += accounting.event(frame, 0.0)
    assert received == [1, 2, 3, 4, 5]
    assert due == [Ack(V2, 3), Ack(V2, 2)]
    writer.receive_data(b"".join(reader.send(ack) for ack in due))
    assert drain(writer) == [Ack(V2, 3), Ack(V2, 2)]  # ack == batch size: each batch is done


def test_a_window_inside_the_compressed_frame_and_sequences_from_zero() -> None:
    # The shape timbersnake sends: one 2C holding 2W 3 and J frames numbered from 0.
    reader = ServerConnection()
    reader.receive_data(compressed(window(3) + b"".join(jframe(seq, b'{"n":%d}' % seq) for seq in range(3))))
    accounting = AckWindow()
    due: list[Ack] = []
    for frame in drain(reader):
        due += accounting.window(frame, 0.0) if isinstance(frame, Window) else accounting.event(frame, 0.0)
    assert due == [Ack(V2, 2)]


def test_logstash_forwarder_gets_one_ack_per_batch_with_the_highest_seq_not_the_count() -> None:
    acks = AckWindow()
    due: list[Ack] = []
    next_seq = 1
    for size in (3, 3, 2, 5):
        due_before = len(due)
        due += acks.window(Window(V1, size), 0.0)
        due += events(acks, list(range(next_seq, next_seq + size)), V1)
        next_seq += size
        assert len(due) == due_before + 1  # it reads exactly one ack per batch
    assert due == [Ack(V1, 3), Ack(V1, 6), Ack(V1, 8), Ack(V1, 13)]


def test_stream_mode_one_window_then_endless_data_frames() -> None:
    acks = AckWindow()
    assert acks.window(Window(V1, 4), 0.0) == []
    assert events(acks, list(range(1, 15)), V1) == [Ack(V1, 4), Ack(V1, 8), Ack(V1, 12)]
    assert acks.pending == 2


def test_stream_mode_starting_at_a_high_sequence() -> None:
    # A writer that reconnects and carries on with its sequence: nothing is acked early.
    acks = AckWindow()
    acks.window(Window(V1, 3), 0.0)
    assert events(acks, [5001, 5002], V1) == []
    assert events(acks, [5003, 5004, 5005, 5006], V1) == [Ack(V1, 5003), Ack(V1, 5006)]


def test_sequence_rollover_keeps_acking_every_window() -> None:
    acks = AckWindow()
    acks.window(Window(V2, 10), 0.0)
    first = U32_MAX - 14
    assert events(acks, list(range(first, first + 10))) == [Ack(V2, U32_MAX - 5)]
    # Five more up to 2**32-1, then the sequence rolls over to 1.
    assert events(acks, list(range(U32_MAX - 4, U32_MAX + 1))) == []
    assert events(acks, [1, 2, 3, 4]) == []
    assert events(acks, [5]) == [Ack(V2, 5)]
    assert events(acks, list(range(6, 16))) == [Ack(V2, 15)]


def test_a_writer_skipping_sequence_numbers_is_acked_by_distance() -> None:
    acks = AckWindow()
    acks.window(Window(V1, 10), 0.0)
    assert events(acks, [1, 2], V1) == []
    assert acks.pending == 2
    assert events(acks, [11], V1) == [Ack(V1, 11)]


def test_window_zero_is_answered_with_ack_zero() -> None:
    for version in (V1, V2):
        acks = AckWindow()
        assert acks.window(Window(version, 0), 0.0) == [Ack(version, 0)]
        # Data frames after W 0 are acked one by one.
        assert events(acks, [1, 2], version) == [Ack(version, 1), Ack(version, 2)]


def test_data_frames_before_any_window_are_acked_one_by_one() -> None:
    acks = AckWindow()
    assert events(acks, [7, 8]) == [Ack(V2, 7), Ack(V2, 8)]


def test_a_new_window_acks_what_the_previous_one_left_unacked() -> None:
    acks = AckWindow()
    acks.window(Window(V2, 5), 0.0)
    assert events(acks, [1, 2, 3]) == []
    assert acks.window(Window(V2, 2), 0.0) == [Ack(V2, 3)]
    assert acks.pending == 0
    assert events(acks, [1, 2]) == [Ack(V2, 2)]
    acks.window(Window(V2, 5), 0.0)
    assert events(acks, [1]) == []
    assert acks.window(Window(V2, 0), 0.0) == [Ack(V2, 1), Ack(V2, 0)]


def test_acks_are_values_the_shell_can_hold() -> None:
    # Two Beats batches in flight; the shell sends neither ack until its commit. The accounting does not
    # wait for it: each ack covers exactly the frames before it, and the next batch is counted afresh.
    acks = AckWindow()
    acks.window(Window(V2, 2), 0.0)
    first = events(acks, [1, 2])
    acks.window(Window(V2, 2), 0.0)
    assert events(acks, [1]) == []
    assert acks.pending == 1
    second = events(acks, [2])
    held = first + second
    assert held == [Ack(V2, 2), Ack(V2, 2)]
    assert acks.pending == 0
    reader = ServerConnection()
    assert b"".join(reader.send(ack) for ack in held) == bytes.fromhex("32 41 00 00 00 02") * 2


def test_keepalives_while_a_v2_batch_is_pending_at_most_every_interval() -> None:
    acks = AckWindow()
    acks.window(Window(V2, 3), 0.0)
    assert acks.keepalive(100.0) is None  # a window alone leaves nothing pending
    events(acks, [1], now=100.0)  # the batch starts: the clock starts here
    assert acks.keepalive(104.9) is None
    assert acks.keepalive(105.0) == Ack(V2, 0)
    assert acks.keepalive(109.9) is None
    assert acks.keepalive(110.0) == Ack(V2, 0)
    assert acks.keepalive(110.5) is None
    events(acks, [2], now=111.0)  # more frames of the same batch do not restart the clock
    assert acks.keepalive(115.0) == Ack(V2, 0)
    assert acks.pending == 2  # keepalives are not acks


def test_keepalives_stop_once_the_ack_is_due() -> None:
    acks = AckWindow()
    acks.window(Window(V2, 2), 0.0)
    events(acks, [1], now=0.0)
    assert acks.keepalive(5.0) == Ack(V2, 0)
    assert events(acks, [2], now=6.0) == [Ack(V2, 2)]
    assert acks.keepalive(20.0) is None
    assert acks.keepalive(1000.0) is None


def test_the_keepalive_clock_restarts_with_each_batch() -> None:
    acks = AckWindow()
    acks.window(Window(V2, 1), 0.0)
    events(acks, [1], now=0.0)  # acked at once
    acks.window(Window(V2, 2), 0.0)
    events(acks, [1], now=30.0)  # the next batch starts here, not at the last keepalive or the window
    assert acks.keepalive(34.9) is None
    assert acks.keepalive(35.0) == Ack(V2, 0)


def test_no_keepalives_for_v1_peers() -> None:
    acks = AckWindow()
    acks.window(Window(V1, 5), 0.0)
    events(acks, [1, 2], V1, now=0.0)
    assert acks.pending == 2
    assert acks.keepalive(5.0) is None
    assert acks.keepalive(1000.0) is None
    assert events(acks, [3, 4, 5], V1, now=0.0) == [Ack(V1, 5)]
    events(acks, [6], V1, now=0.0)
    assert acks.keepalive(1000.0) is None


def test_no_keepalives_when_nothing_is_pending() -> None:
    acks = AckWindow()
    assert acks.keepalive(0.0) is None
    assert acks.keepalive(1e9) is None
    acks.window(Window(V2, 1), 0.0)
    assert events(acks, [1]) == [Ack(V2, 1)]
    assert acks.keepalive(1e9) is None
    acks.window(Window(V2, 3), 0.0)  # a window alone is no batch
    assert acks.keepalive(2e9) is None


def test_the_keepalive_interval_is_configurable() -> None:
    acks = AckWindow(keepalive_interval=0.5)
    acks.window(Window(V2, 10), 0.0)
    events(acks, [1], now=1.0)
    assert acks.keepalive(1.4) is None
    assert acks.keepalive(1.5) == Ack(V2, 0)


# ---------------------------------------------------------------------------------------------- hypothesis

texts = st.text(max_size=8)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False) | texts,
    lambda children: st.lists(children, max_size=2) | st.dictionaries(texts, children, max_size=2),
    max_leaves=3,
)
seqs = st.integers(0, U32_MAX)
v2_fields = st.dictionaries(texts, json_values, max_size=3)
v1_fields = st.dictionaries(texts, texts | st.integers() | st.booleans(), max_size=3)


@HYPOTHESIS
@given(
    version=st.sampled_from([V1, V2]),
    data_=st.data(),
    compress=st.booleans(),
    level=st.integers(0, 9),
    cuts=st.lists(st.integers(0, 3000), max_size=8),
)
def test_round_trip_from_writer_to_reader(version: int, data_: st.DataObject, compress: bool, level: int,
                                          cuts: list[int]) -> None:
    fields = v2_fields if version == V2 else v1_fields
    batch = data_.draw(st.lists(st.tuples(seqs, fields), max_size=4), label="events")
    writer = ClientConnection(version=version, max_frame=1 << 30)
    wire = writer.send_window(len(batch)) + writer.send_events(batch, compress=compress, level=level)
    reader = ServerConnection()
    received: list[object] = []
    for chunk in chunked(wire, cuts):
        reader.receive_data(chunk)
        received += drain(reader)
    if version == V1:
        batch = [(seq, {str(key): str(value) for key, value in sent.items()}) for seq, sent in batch]
    assert received == [Window(version, len(batch))] + [Event(version, seq, sent) for seq, sent in batch]


@HYPOTHESIS
@given(
    frames=st.lists(
        st.one_of(
            st.tuples(st.just("W"), st.integers(0, 12)),
            st.tuples(st.just("E"), seqs | st.integers(0, 40)),
        ),
        max_size=30,
    ),
    version=st.sampled_from([V1, V2]),
)
def test_acks_carry_the_latest_seq_and_never_leave_a_full_window_unacked(frames: list[tuple[str, int]],
                                                                         version: int) -> None:
    acks = AckWindow()
    size = 0
    last_seq = None
    for kind, value in frames:
        if kind == "W":
            left = acks.pending
            due = acks.window(Window(version, value), 0.0)
            # What the window before left unacked is acked first; W 0 is answered with 0.
            expected = [Ack(version, last_seq)] if left else []
            assert due == expected + ([Ack(version, 0)] if value == 0 else [])
            assert acks.pending == 0
            size = value
        else:
            due = acks.event(Event(version, value, {}), 0.0)
            last_seq = value
            assert due in ([], [Ack(version, value)])  # the seq of the latest frame, never a count
            # A writer blocks once ``size`` frames are unacked: that never happens.
            assert acks.pending < max(size, 1)


def fuzz_reader(chunks: list[bytes], **limits: int) -> list[object]:
    """Feed ``chunks``; only ProtocolError may escape, and it is final."""
    server = ServerConnection(**limits)
    seen: list[object] = []
    for chunk in chunks:
        server.receive_data(chunk)
        try:
            seen += drain(server)
        except ProtocolError as error:
            first = str(error)
            with pytest.raises(ProtocolError) as again:
                server.next_event()
            assert str(again.value) == first
            assert first.isprintable()
            return seen
    for event in seen:
        assert isinstance(event, Window | Event)
        if isinstance(event, Event):
            assert isinstance(event.fields, dict)
            assert 0 <= event.seq <= U32_MAX
    return seen


LIMITS = {"max_window": 50, "max_frame": 300, "max_decompressed": 600}


@HYPOTHESIS
@given(stream=st.binary(max_size=300), cuts=st.lists(st.integers(0, 300), max_size=10))
def test_fuzz_reader_on_arbitrary_bytes(stream: bytes, cuts: list[int]) -> None:
    fuzz_reader(chunked(stream, cuts), **LIMITS)
    fuzz_reader([stream])


# Frame-shaped input: the right version and type bytes, arbitrary lengths and contents, so the fuzzing gets
# past the first two bytes and into every decoder, compressed payloads included.
frame_parts = st.one_of(
    st.builds(lambda v, size: v + b"W" + u32(size), st.sampled_from([b"1", b"2"]), st.integers(0, 80)),
    st.builds(lambda v, seq, doc: jframe(seq, doc, v), st.sampled_from([b"1", b"2"]), seqs,
              st.binary(max_size=20) | st.sampled_from([b"{}", b'{"a":1}', b"[]", b'{"a":'])),
    st.builds(lambda v, seq, pairs: data(seq, pairs, v), st.sampled_from([b"1", b"2"]), seqs,
              st.lists(st.tuples(st.binary(max_size=6), st.binary(max_size=6)), max_size=3)),
    st.builds(lambda v, blob: v + b"C" + u32(len(blob)) + blob, st.sampled_from([b"1", b"2"]),
              st.binary(max_size=30)),
    st.binary(max_size=12),
)
framed_streams = st.recursive(
    st.lists(frame_parts, max_size=5).map(b"".join),
    lambda inner: st.builds(compressed, inner) | st.builds(lambda a, b: a + b, inner, inner),
    max_leaves=6,
)


@HYPOTHESIS
@given(stream=framed_streams, cuts=st.lists(st.integers(0, 400), max_size=8))
def test_fuzz_reader_on_frame_shaped_input(stream: bytes, cuts: list[int]) -> None:
    fuzz_reader(chunked(stream, cuts), **LIMITS)
    fuzz_reader([stream])


@HYPOTHESIS
@given(
    batch=st.lists(st.tuples(seqs, st.dictionaries(texts, texts | st.integers(), max_size=3)), min_size=1,
                   max_size=4),
    version=st.sampled_from([V1, V2]),
    compress=st.booleans(),
    data_=st.data(),
)
def test_fuzz_reader_on_mutated_writer_output(batch: list[tuple[int, dict]], version: int, compress: bool,
                                              data_: st.DataObject) -> None:
    writer = ClientConnection(version=version, max_frame=1 << 30)
    stream = bytearray(writer.send_window(len(batch)) + writer.send_events(batch, compress=compress))
    for _ in range(data_.draw(st.integers(1, 3), label="mutations")):
        index = data_.draw(st.integers(0, len(stream) - 1), label="index")
        kind = data_.draw(st.sampled_from(["flip", "drop", "insert", "truncate"]), label="mutation")
        if kind == "flip":
            stream[index] ^= data_.draw(st.integers(1, 255), label="mask")
        elif kind == "drop":
            del stream[index]
        elif kind == "insert":
            stream[index:index] = data_.draw(st.binary(min_size=1, max_size=4), label="inserted")
        else:
            del stream[index:]
        if not stream:
            break
    cuts = data_.draw(st.lists(st.integers(0, len(stream)), max_size=6), label="cuts")
    fuzz_reader(chunked(bytes(stream), cuts), max_frame=1 << 16, max_decompressed=1 << 16)


@HYPOTHESIS
@given(stream=st.binary(max_size=60), cuts=st.lists(st.integers(0, 60), max_size=6))
def test_fuzz_writer_on_arbitrary_bytes(stream: bytes, cuts: list[int]) -> None:
    client = ClientConnection()
    for chunk in chunked(stream, cuts):
        client.receive_data(chunk)
        try:
            acks = drain(client)
        except ProtocolError as error:
            message = str(error)
            break
        assert all(isinstance(ack, Ack) and 0 <= ack.seq <= U32_MAX for ack in acks)
    else:
        return
    assert message.isprintable()
    with pytest.raises(ProtocolError, match=re.escape(message)):  # final, like the reader's errors
        client.next_event()


def test_json_module_is_the_reference_for_written_documents() -> None:
    # The writer's JSON is what json.loads reads back, compact and with non-ASCII text kept as UTF-8.
    fields = {"a": "ü", "b": [1.5, {"c": None}]}
    wire = ClientConnection().send_events([(1, fields)])
    document = wire[10:]
    assert json.loads(document) == fields
    assert b" " not in document
    assert "ü".encode() in document
