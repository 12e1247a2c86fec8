"""The mc0 frame codec (protocol/mc0.py): wire vectors in both directions for every verb, the frames a real
MCollective connector sends, header order, X- headers, topic names, VERSION and TTL rules, every malformed
shape (refused with a ProtocolError fit for an ERROR reply, carrying the command's ID when it was readable),
error_reply(), hypothesis round-trips of every event type, and fuzzing whose only allowed failure is
ProtocolError.
"""

from __future__ import annotations

import dataclasses
import itertools
import re

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import ProtocolError, mc0

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ROUND_TRIP = settings(max_examples=300, deadline=None)

# Literal msgpack payloads (bin8 = 0xc4, fixarray = 0x9N, fixmap = 0x8N, uint64 = 0xcf).
PUTS_ONE = b"\x91\x92\xc4\x01t\xc4\x01b"  # [[b"t", b"b"]]
# [[b"t", b"b", {b"X-k": b"v"}]]
PUTS_ONE_WITH_HEADERS = b"\x91\x93\xc4\x01t\xc4\x01b\x81\xc4\x03X-k\xc4\x01v"
MESSAGES_ONE = b"\x91\x94\xc4\x01t\x07\xcf\x00\x00\x01\x8b\xcf\xe5h\x00\xc4\x01b"  # [[b"t", 7, 1.7e12, b"b"]]
MESSAGES_ONE_WITH_HEADERS = (  # [[b"t", 7, 1700000000000, b"b", {b"X-k": b"v"}]]
    b"\x91\x95\xc4\x01t\x07\xcf\x00\x00\x01\x8b\xcf\xe5h\x00\xc4\x01b\x81\xc4\x03X-k\xc4\x01v"
)

# (frames without the leading delimiter, in the encoder's header order; the event they mean)
VECTORS: list[tuple[list[bytes], mc0.Event]] = [
    ([b"CONNECT", b"VERSION", b"0.3"], mc0.Connect(b"0.3")),
    ([b"CONNECT", b"VERSION", b"0.1", b"TTL", b"1000"], mc0.Connect(b"0.1", 1000)),
    (
        [b"CONNECT", b"VERSION", b"0.3", b"TTL", b"30000", b"EXTENSIONS", b"batch ids", b"ID", b"c1"],
        mc0.Connect(b"0.3", 30000, b"c1", frozenset({"batch", "ids"})),
    ),
    ([b"DISCONNECT"], mc0.Disconnect()),
    ([b"DISCONNECT", b"ID", b"d1"], mc0.Disconnect(b"d1")),
    ([b"SUB", b"", b"topic1", b"topic2"], mc0.Sub([b"topic1", b"topic2"])),
    ([b"SUB", b"ID", b"s1", b"", b"orders"], mc0.Sub([b"orders"], b"s1")),
    (
        [b"SUB", b"REPLAY", b"beginning", b"CREDIT", b"10", b"ACKS", b"explicit", b"ID", b"s2", b"", b"q"],
        mc0.Sub([b"q"], b"s2", replay="beginning", credit=10, explicit_acks=True),
    ),
    ([b"SUB", b"REPLAY", b"42", b"", b"log"], mc0.Sub([b"log"], replay=42)),
    ([b"SUB", b"REPLAY", b"current", b"", b"log"], mc0.Sub([b"log"], replay="current")),
    ([b"SUB", b"RESUME", b"7", b"ID", b"r", b"", b"log"], mc0.Sub([b"log"], b"r", resume=7)),
    ([b"ACK", b"TOPIC", b"jobs", b"ID", b"a1", b"", b"3", b"4"], mc0.Ack(b"jobs", [3, 4], b"a1")),
    ([b"ACK", b"TOPIC", b"jobs", b"", b"9"], mc0.Ack(b"jobs", [9])),
    (
        [b"DECLARE", b"DELIVERY", b"round-robin", b"PERSISTENCE", b"persistent", b"SYNC", b"weak",
         b"RETENTION-BYTES", b"1000000", b"ID", b"d", b"", b"jobs"],
        mc0.Declare(b"jobs", {"delivery": "round-robin", "persistence": "persistent", "sync": "weak",
                              "retention_bytes": "1000000"}, b"d"),
    ),
    ([b"DECLARE", b"", b"plain"], mc0.Declare(b"plain", {})),
    ([b"UNSUB", b"", b"topic1"], mc0.Unsub([b"topic1"])),
    ([b"UNSUB", b"ID", b"u1", b"", b"a", b"b"], mc0.Unsub([b"a", b"b"], b"u1")),
    ([b"PUT", b"TOPIC", b"topic1", b"", b"body"], mc0.Put(b"topic1", b"body")),
    (
        [b"PUT", b"TOPIC", b"t", b"X-Reply-To", b"me", b"ID", b"p1", b"", b"\x00\xffbin"],
        mc0.Put(b"t", b"\x00\xffbin", b"p1", {b"X-Reply-To": b"me"}),
    ),
    ([b"PUT", b"TOPIC", b"t", b"", b""], mc0.Put(b"t", b"")),
    ([b"PUTS", b"", PUTS_ONE], mc0.Puts([mc0.PutItem(b"t", b"b")])),
    (
        [b"PUTS", b"ID", b"b1", b"", PUTS_ONE_WITH_HEADERS],
        mc0.Puts([mc0.PutItem(b"t", b"b", {b"X-k": b"v"})], b"b1"),
    ),
    (
        [b"PUTS", b"CONFIRM", b"each", b"ID", b"b2", b"", PUTS_ONE],
        mc0.Puts([mc0.PutItem(b"t", b"b")], b"b2", confirm_each=True),
    ),
    ([b"NOOP"], mc0.Noop()),
    ([b"NOOP", b"ID", b"n1"], mc0.Noop(b"n1")),
    ([b"MESSAGE", b"TOPIC", b"topic1", b"", b"body"], mc0.Message(b"topic1", b"body")),
    (
        [b"MESSAGE", b"TOPIC", b"t", b"X-a", b"1", b"MESSAGE-ID", b"42", b"TIMESTAMP", b"1700000000000", b"",
         b"body"],
        mc0.Message(b"t", b"body", {b"X-a": b"1"}, 42, 1700000000000),
    ),
    ([b"MESSAGES", b"", MESSAGES_ONE], mc0.Messages([mc0.MessageItem(b"t", 7, 1700000000000, b"b")])),
    (
        [b"MESSAGES", b"", MESSAGES_ONE_WITH_HEADERS],
        mc0.Messages([mc0.MessageItem(b"t", 7, 1700000000000, b"b", {b"X-k": b"v"})]),
    ),
    ([b"OK", b"ID", b"1234"], mc0.Ok(b"1234")),
    (
        [b"OK", b"ID", b"st", b"CONTENT-TYPE", b"application/json", b"", b"{}"],
        mc0.Ok(b"st", {b"CONTENT-TYPE": b"application/json"}, b"{}"),
    ),
    ([b"ERROR", b"MESSAGE", b"unknown verb"], mc0.Error(b"unknown verb")),
    ([b"ERROR", b"MESSAGE", b"no", b"ID", b"e1"], mc0.Error(b"no", b"e1")),
    ([b"STATS", b"ID", b"x1"], mc0.Stats(b"x1")),
    ([b"STATS"], mc0.Stats()),
    (
        [b"STATS", b"PREFIX", b"orders.", b"AFTER", b"orders.b", b"LIMIT", b"50", b"ID", b"s2"],
        mc0.Stats(b"s2", prefix=b"orders.", after=b"orders.b", limit=50),
    ),
    ([b"DELETE", b"ID", b"d1", b"", b"orders eu"], mc0.Delete(b"orders eu", b"d1")),
    ([b"DELETE", b"", b"t"], mc0.Delete(b"t")),
]

VECTOR_IDS = [f"{n}-{frames[0].decode()}" for n, (frames, _) in enumerate(VECTORS)]


def test_vectors_cover_every_verb() -> None:
    assert {frames[0] for frames, _ in VECTORS} == mc0.VERBS


@pytest.mark.parametrize(("frames", "event"), VECTORS, ids=VECTOR_IDS)
@pytest.mark.parametrize("delimiter", [True, False], ids=["delimited", "bare"])
def test_decode_vector(frames: list[bytes], event: mc0.Event, delimiter: bool) -> None:
    wire = [b"", *frames] if delimiter else list(frames)
    assert mc0.decode(wire) == event


@pytest.mark.parametrize(("frames", "event"), VECTORS, ids=VECTOR_IDS)
@pytest.mark.parametrize("delimiter", [True, False], ids=["delimited", "bare"])
def test_encode_vector(frames: list[bytes], event: mc0.Event, delimiter: bool) -> None:
    expected = [b"", *frames] if delimiter else frames
    assert mc0.encode(event, delimiter=delimiter) == expected


def test_encode_defaults_to_the_delimiter() -> None:
    assert mc0.encode(mc0.Noop()) == [b"", b"NOOP"]


def test_decode_does_not_modify_its_input() -> None:
    frames = [b"", b"PUT", b"TOPIC", b"t", b"ID", b"1", b"X-a", b"b", b"", b"body"]
    copy = list(frames)
    mc0.decode(frames)
    assert frames == copy


def test_encode_refuses_a_non_event() -> None:
    with pytest.raises(TypeError, match="not an mc0 event"):
        mc0.encode("PUT")  # type: ignore[arg-type]


def test_several_body_frames_are_joined() -> None:
    event = mc0.decode([b"", b"PUT", b"TOPIC", b"t", b"", b"part1-", b"part2"])
    assert event == mc0.Put(b"t", b"part1-part2")


def test_message_frames_appends_to_the_given_list() -> None:
    head = [b"identity", b""]
    out = mc0.message_frames(head, b"t", b"body", {b"X-a": b"1"}, 5, 6)
    assert out is head
    assert out == [b"identity", b"", b"MESSAGE", b"TOPIC", b"t", b"X-a", b"1", b"MESSAGE-ID", b"5",
                   b"TIMESTAMP", b"6", b"", b"body"]


def test_pack_helpers_produce_the_documented_payloads() -> None:
    assert mc0.pack_put_items([mc0.PutItem(b"t", b"b")]) == PUTS_ONE
    assert mc0.pack_put_items([mc0.PutItem(b"t", b"b", {b"X-k": b"v"})]) == PUTS_ONE_WITH_HEADERS
    assert mc0.pack_message_items([mc0.MessageItem(b"t", 7, 1700000000000, b"b")]) == MESSAGES_ONE


# ------------------------------------------------------------------------------------- a real connector


UUID = b"6f1c2a84-9d1e-4d3a-9a59-1a4c0e5b7c21"


def test_real_connector_connect() -> None:
    event = mc0.decode([b"", b"CONNECT", b"ID", UUID, b"TTL", b"30000", b"VERSION", b"0.2"])
    assert event == mc0.Connect(version=b"0.2", ttl=30000, id=UUID)
    assert event.headers == {}
    assert event.extensions == frozenset()


def test_real_connector_sub_and_unsub_carry_an_id() -> None:
    topics = [b"mcollective.discovery.agent", b"collective agent"]
    assert mc0.decode([b"", b"SUB", b"ID", UUID, b"", *topics]) == mc0.Sub(topics, UUID)
    assert mc0.decode([b"", b"UNSUB", b"ID", UUID, b"", *topics]) == mc0.Unsub(topics, UUID)


def test_real_connector_put_without_id() -> None:
    event = mc0.decode([b"", b"PUT", b"TOPIC", b"collective agent", b"", b"\x04\x08{serialised request}"])
    assert event == mc0.Put(b"collective agent", b"\x04\x08{serialised request}", None, {})


# ----------------------------------------------------------------------------------------- headers


def test_connect_headers_in_any_order() -> None:
    pairs = [(b"VERSION", b"0.2"), (b"TTL", b"5000"), (b"ID", b"x"), (b"EXTENSIONS", b"ids")]
    expected = mc0.Connect(b"0.2", 5000, b"x", frozenset({"ids"}))
    for order in itertools.permutations(pairs):
        frames = [b"", b"CONNECT", *itertools.chain.from_iterable(order)]
        assert mc0.decode(frames) == expected, order


def test_put_headers_in_any_order() -> None:
    pairs = [(b"TOPIC", b"t"), (b"ID", b"7"), (b"X-a", b"1"), (b"X-b", b"2")]
    expected = mc0.Put(b"t", b"body", b"7", {b"X-a": b"1", b"X-b": b"2"})
    for order in itertools.permutations(pairs):
        frames = [b"PUT", *itertools.chain.from_iterable(order), b"", b"body"]
        assert mc0.decode(frames) == expected, order


def test_x_headers_preserved_on_put_and_copied_on_message() -> None:
    x_headers = {b"X-Reply-To": b"reply queue", b"X-Binary": b"\x00\xff", b"X-Empty": b""}
    frames = [b"", b"PUT", b"TOPIC", b"t", b"ID", b"9"]
    for key, value in x_headers.items():
        frames += [key, value]
    put = mc0.decode([*frames, b"", b"body"])
    assert isinstance(put, mc0.Put)
    assert put.headers == x_headers  # neither TOPIC nor ID among them
    delivered = mc0.encode(mc0.Message(put.topic, put.body, put.headers))
    for key, value in x_headers.items():
        index = delivered.index(key)
        assert delivered[index + 1] == value
    assert b"ID" not in delivered
    message = mc0.decode(delivered)
    assert message == mc0.Message(b"t", b"body", x_headers)


def test_unknown_reserved_headers_are_kept_for_the_caller() -> None:
    event = mc0.decode([b"SUB", b"PRIORITY", b"high", b"", b"t"])
    assert event == mc0.Sub([b"t"], None, {b"PRIORITY": b"high"})


@pytest.mark.parametrize(
    "topic",
    [b"collective agent", b"with  two spaces ", b"\x00\x01\xff\xfe", b"caf\xc3\xa9", b"a" * 1000, b" "],
    ids=["space", "spaces", "binary", "utf8", "long", "only-space"],
)
def test_topic_names_are_arbitrary_bytes(topic: bytes) -> None:
    assert mc0.decode([b"SUB", b"", topic]) == mc0.Sub([topic])
    assert mc0.decode([b"PUT", b"TOPIC", topic, b"", b"x"]) == mc0.Put(topic, b"x")
    assert mc0.decode(mc0.encode(mc0.Message(topic, b"x"))) == mc0.Message(topic, b"x")


# ----------------------------------------------------------------------------------- CONNECT rules


@pytest.mark.parametrize("version", [b"0.1", b"0.2", b"0.3"])
def test_supported_versions_are_accepted(version: bytes) -> None:
    event = mc0.decode([b"", b"CONNECT", b"VERSION", version, b"TTL", b"1000"])
    assert isinstance(event, mc0.Connect)
    assert event.version == version


@pytest.mark.parametrize("version", [b"0.0", b"0.4", b"1.0", b"0.2 ", b"", b"0.30", b"\xff"])
def test_other_versions_are_refused(version: bytes) -> None:
    with pytest.raises(ProtocolError, match="unsupported VERSION") as info:
        mc0.decode([b"", b"CONNECT", b"ID", b"c", b"VERSION", version])
    assert info.value.command_id == b"c"


def test_connect_without_version_is_refused() -> None:
    with pytest.raises(ProtocolError, match="VERSION") as info:
        mc0.decode([b"", b"CONNECT", b"TTL", b"1000", b"ID", b"c"])
    assert info.value.command_id == b"c"


@pytest.mark.parametrize(
    "ttl",
    [b"30.5", b"-1", b"abc", b"", b"1e3", b" 30", b"30 ", b"0x10", b"\xd9\xa3", b"+5", b"1" * 5000,
     b"2147483648"],
    ids=["float", "negative", "word", "empty", "exponent", "lead-space", "trail-space", "hex", "arabic-digit",
         "plus", "5000-digits", "over-max"],
)
def test_bad_ttl_is_refused(ttl: bytes) -> None:
    with pytest.raises(ProtocolError, match="TTL") as info:
        mc0.decode([b"", b"CONNECT", b"VERSION", b"0.3", b"TTL", ttl, b"ID", b"c"])
    assert info.value.command_id == b"c"


def test_largest_ttl_and_leading_zeros_are_accepted() -> None:
    largest = mc0.decode([b"CONNECT", b"VERSION", b"0.3", b"TTL", b"%d" % mc0.MAX_TTL_MS])
    assert isinstance(largest, mc0.Connect)
    assert largest.ttl == mc0.MAX_TTL_MS
    padded = mc0.decode([b"CONNECT", b"VERSION", b"0.3", b"TTL", b"0" * 5000 + b"1000"])
    assert isinstance(padded, mc0.Connect)
    assert padded.ttl == 1000


def test_zero_ttl_and_missing_ttl_mean_never_expire() -> None:
    assert mc0.decode([b"CONNECT", b"VERSION", b"0.3", b"TTL", b"0"]) == mc0.Connect(b"0.3", None)
    assert mc0.decode([b"CONNECT", b"VERSION", b"0.3"]) == mc0.Connect(b"0.3", None)


def test_unknown_extensions_are_ignored() -> None:
    event = mc0.decode([b"CONNECT", b"VERSION", b"0.3", b"EXTENSIONS", b"ids future-thing  batch"])
    assert isinstance(event, mc0.Connect)
    assert event.extensions == frozenset({mc0.EXT_IDS, mc0.EXT_BATCH})


def test_too_large_message_id_is_refused() -> None:
    with pytest.raises(ProtocolError, match="MESSAGE-ID"):
        mc0.decode([b"MESSAGE", b"TOPIC", b"t", b"MESSAGE-ID", b"%d" % 2**64, b"", b"b"])
    event = mc0.decode([b"MESSAGE", b"TOPIC", b"t", b"MESSAGE-ID", b"%d" % (2**64 - 1), b"", b"b"])
    assert isinstance(event, mc0.Message)
    assert event.message_id == 2**64 - 1


# ----------------------------------------------------------------------------------- malformed input


def _pack(value: object) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


# (frames, the command_id the error must carry, a fragment of the error text)
MALFORMED: list[tuple[list[bytes], bytes | None, str]] = [
    ([b"put", b"TOPIC", b"t", b"", b"b"], None, "unknown verb"),
    ([b"BOGUS", b"ID", b"7"], b"7", "unknown verb"),
    ([b"\xff\x00" * 100, b"ID", b"7"], b"7", "unknown verb"),
    ([b"SUB", b"ID"], None, "no value"),
    ([b"SUB", b"ID", b"7", b"X-a"], b"7", "no value"),
    ([b"SUB", b"ID", b"1", b"ID", b"2", b"", b"t"], b"1", "twice"),
    ([b"SUB", b"X-a", b"1", b"X-a", b"2", b"ID", b"7", b"", b"t"], b"7", "twice"),
    ([b"SUB", b"ID", b"7"], b"7", "at least one topic"),
    ([b"SUB", b"ID", b"7", b""], b"7", "at least one topic"),
    ([b"SUB", b"ID", b"7", b"", b"t", b""], b"7", "empty"),
    ([b"UNSUB", b"ID", b"7", b""], b"7", "at least one topic"),
    ([b"UNSUB", b"ID", b"7", b"", b""], b"7", "empty"),
    ([b"PUT", b"ID", b"7", b"", b"body"], b"7", "TOPIC"),
    ([b"PUT", b"TOPIC", b"", b"ID", b"7", b"", b"body"], b"7", "TOPIC"),
    ([b"PUT", b"TOPIC", b"t", b"ID", b"7"], b"7", "body"),
    ([b"PUT", b"TOPIC", b"t", b"ID", b"7", b""], b"7", "body"),
    ([b"PUTS", b"ID", b"7"], b"7", "payload"),
    ([b"PUTS", b"ID", b"7", b"", PUTS_ONE, PUTS_ONE], b"7", "payload"),
    ([b"PUTS", b"ID", b"7", b"", b"\xc1"], b"7", "msgpack"),
    ([b"PUTS", b"ID", b"7", b"", b"\x92\xc4"], b"7", "msgpack"),
    ([b"PUTS", b"ID", b"7", b"", PUTS_ONE + b"\x00"], b"7", "msgpack"),
    ([b"PUTS", b"ID", b"7", b"", _pack({b"t": b"b"})], b"7", "array"),
    ([b"PUTS", b"ID", b"7", b"", _pack([b"t"])], b"7", "entry"),
    ([b"PUTS", b"ID", b"7", b"", _pack([[b"t"]])], b"7", "entry"),
    ([b"PUTS", b"ID", b"7", b"", _pack([[b"t", b"b", {}, b"x"]])], b"7", "entry"),
    ([b"PUTS", b"ID", b"7", b"", _pack([["t", b"b"]])], b"7", "topic"),
    ([b"PUTS", b"ID", b"7", b"", _pack([[b"", b"b"]])], b"7", "topic"),
    ([b"PUTS", b"ID", b"7", b"", _pack([[b"t", 5]])], b"7", "body"),
    ([b"PUTS", b"ID", b"7", b"", _pack([[b"t", b"b", [b"X-a"]]])], b"7", "headers"),
    ([b"PUTS", b"ID", b"7", b"", _pack([[b"t", b"b", {"X-a": b"1"}]])], b"7", "headers"),
    ([b"PUTS", b"ID", b"7", b"", _pack([[b"t", b"b", {b"": b"1"}]])], b"7", "headers"),
    ([b"PUTS", b"ID", b"7", b"", _pack([[b"t", b"b", {1: b"1"}]])], b"7", "headers"),
    ([b"MESSAGES", b"ID", b"7"], b"7", "payload"),
    ([b"MESSAGES", b"", b"\xc1"], None, "msgpack"),
    ([b"MESSAGES", b"", _pack(5)], None, "array"),
    ([b"MESSAGES", b"", _pack([[b"t", 1, 2]])], None, "entry"),
    ([b"MESSAGES", b"", _pack([[b"t", -1, 2, b"b"]])], None, "wrong type"),
    ([b"MESSAGES", b"", _pack([[b"t", True, 2, b"b"]])], None, "wrong type"),
    ([b"MESSAGES", b"", _pack([[b"t", 1, 2.5, b"b"]])], None, "wrong type"),
    ([b"MESSAGES", b"", _pack([[b"t", 1, 2, "b"]])], None, "wrong type"),
    ([b"MESSAGES", b"", _pack([[b"", 1, 2, b"b"]])], None, "empty topic"),
    ([b"MESSAGES", b"", _pack([[b"t", 1, 2, b"b", {b"k": 1}]])], None, "headers"),
    ([b"MESSAGE", b"ID", b"7", b"", b"body"], b"7", "TOPIC"),
    ([b"MESSAGE", b"TOPIC", b"t"], None, "body"),
    ([b"MESSAGE", b"TOPIC", b"t", b"MESSAGE-ID", b"x", b"", b"b"], None, "MESSAGE-ID"),
    ([b"MESSAGE", b"TOPIC", b"t", b"TIMESTAMP", b"-5", b"", b"b"], None, "TIMESTAMP"),
    ([b"CONNECT", b"ID", b"7", b"VERSION", b"0.3", b"", b"extra"], b"7", "positional"),
    ([b"CONNECT", b"ID", b"7", b"VERSION", b"0.3", b"EXTENSIONS", b"\xffids"], b"7", "EXTENSIONS"),
    ([b"NOOP", b"ID", b"7", b"", b"x"], b"7", "positional"),
    ([b"DISCONNECT", b"", b"x"], None, "positional"),
    ([b"STATS", b"ID", b"7", b"", b"x"], b"7", "positional"),
    ([b"STATS", b"ID", b"7", b"LIMIT", b"ten"], b"7", "LIMIT"),
    ([b"DELETE", b"ID", b"7"], b"7", "one non-empty topic"),
    ([b"DELETE", b"ID", b"7", b"", b""], b"7", "one non-empty topic"),
    ([b"DELETE", b"ID", b"7", b"", b"a", b"b"], b"7", "one non-empty topic"),
    ([b"OK", b"ID", b"7", b"", b"a", b"b"], b"7", "at most one"),
    ([b"ERROR", b"ID", b"7"], b"7", "MESSAGE"),
    ([b"SUB", b"ID", b"7", b"REPLAY", b"start", b"", b"t"], b"7", "REPLAY"),
    ([b"SUB", b"ID", b"7", b"REPLAY", b"-1", b"", b"t"], b"7", "REPLAY"),
    ([b"SUB", b"ID", b"7", b"REPLAY", b"1", b"RESUME", b"2", b"", b"t"], b"7", "not both"),
    ([b"SUB", b"ID", b"7", b"RESUME", b"x", b"", b"t"], b"7", "RESUME"),
    ([b"SUB", b"ID", b"7", b"CREDIT", b"0", b"", b"t"], b"7", "at least 1"),
    ([b"SUB", b"ID", b"7", b"CREDIT", b"99999999999", b"", b"t"], b"7", "too large"),
    ([b"SUB", b"ID", b"7", b"ACKS", b"sometimes", b"", b"t"], b"7", "ACKS"),
    ([b"ACK", b"ID", b"7", b"", b"1"], b"7", "TOPIC"),
    ([b"ACK", b"ID", b"7", b"TOPIC", b"t"], b"7", "message id"),
    ([b"ACK", b"ID", b"7", b"TOPIC", b"t", b"", b"one"], b"7", "MESSAGE-ID"),
    ([b"DECLARE", b"ID", b"7"], b"7", "one non-empty topic"),
    ([b"DECLARE", b"ID", b"7", b"", b"a", b"b"], b"7", "one non-empty topic"),
    ([b"DECLARE", b"ID", b"7", b"", b""], b"7", "one non-empty topic"),
    ([b"DECLARE", b"ID", b"7", b"COLOUR", b"red", b"", b"t"], b"7", "no setting"),
    ([b"DECLARE", b"ID", b"7", b"SYNC", b"\xff", b"", b"t"], b"7", "ASCII"),
    ([b"ERROR", b"MESSAGE", b"m", b"", b"x"], None, "positional"),
]


@pytest.mark.parametrize(
    ("frames", "fragment"),
    [([], "empty"), ([b""], "no verb"), ([b"", b""], "unknown verb ''"), ([b"", b"BOGUS"], "unknown verb")],
    ids=["nothing", "only-delimiter", "empty-verb", "unknown-verb"],
)
def test_malformed_envelope(frames: list[bytes], fragment: str) -> None:
    with pytest.raises(ProtocolError) as info:
        mc0.decode(frames)
    assert fragment in str(info.value)
    assert info.value.command_id is None


@pytest.mark.parametrize(("frames", "command_id", "fragment"), MALFORMED, ids=range(len(MALFORMED)))
@pytest.mark.parametrize("delimiter", [True, False], ids=["delimited", "bare"])
def test_malformed_input_raises_protocol_error(
    frames: list[bytes], command_id: bytes | None, fragment: str, delimiter: bool
) -> None:
    wire = [b"", *frames] if delimiter else frames
    with pytest.raises(ProtocolError) as info:
        mc0.decode(wire)
    error = info.value
    text = str(error)
    assert fragment in text
    assert error.command_id == command_id
    # Fit for an ERROR reply: one short, printable line.
    assert text.isprintable()
    assert 0 < len(text) <= 200


def test_error_reply_answers_the_refused_command() -> None:
    with pytest.raises(ProtocolError) as info:
        mc0.decode([b"", b"SUB", b"ID", b"42", b""])
    reply = mc0.error_reply(info.value)
    assert reply == mc0.Error(b"SUB needs at least one topic", b"42")
    assert mc0.encode(reply) == [b"", b"ERROR", b"MESSAGE", b"SUB needs at least one topic", b"ID", b"42"]


def test_error_reply_without_an_id_has_no_id_frame() -> None:
    with pytest.raises(ProtocolError) as info:
        mc0.decode([b"", b"WHAT"])
    frames = mc0.encode(mc0.error_reply(info.value), delimiter=False)
    assert frames == [b"ERROR", b"MESSAGE", b"unknown verb 'WHAT'"]


def test_error_reply_keeps_non_ascii_text_as_utf8() -> None:
    reply = mc0.error_reply(ProtocolError("topic caf\u00e9 refused", command_id=b"1"))
    assert reply.message == "topic caf\u00e9 refused".encode()
    assert reply.id == b"1"
    assert mc0.decode(mc0.encode(reply)) == reply


def test_long_garbage_is_shortened_in_the_error() -> None:
    with pytest.raises(ProtocolError) as info:
        mc0.decode([b"X" * 10_000])
    assert "..." in str(info.value)
    assert len(str(info.value)) < 120


# ------------------------------------------------------------------------------------ hypothesis

# Header names a command's decoder reads itself: generated headers leave them out (hypothesis draws names from
# the constants of the code it tests, so it finds every one of them sooner or later).
RESERVED = {mc0.ID, mc0.TOPIC, mc0.VERSION, mc0.TTL, mc0.MESSAGE_KEY, mc0.EXTENSIONS, mc0.MESSAGE_ID,
            mc0.TIMESTAMP, mc0.REPLAY, mc0.RESUME, mc0.CREDIT, mc0.ACKS, mc0.CONFIRM, *mc0.DECLARE_SETTINGS,
            mc0.WAIT, mc0.AT_TIME, mc0.FORMAT, mc0.INCARNATION, mc0.PRODUCER, mc0.SEQUENCE, mc0.PACKED,
            mc0.REPLICA, mc0.EPOCH, mc0.PREFIX, mc0.AFTER, mc0.LIMIT}

small_bytes = st.binary(max_size=24)
topics = st.binary(min_size=1, max_size=24)
command_ids = st.none() | st.binary(max_size=16)
header_keys = st.one_of(
    st.binary(min_size=1, max_size=12),
    st.builds(lambda tail: b"X-" + tail, st.binary(max_size=10)),
).filter(lambda key: key not in RESERVED)
headers = st.dictionaries(header_keys, small_bytes, max_size=4)
u64 = st.integers(0, 2**64 - 1)
item_headers = st.dictionaries(st.binary(min_size=1, max_size=8), small_bytes, max_size=3)
# A publisher may not set the headers the broker writes on delivery; the codec refuses them in PUTS entries.
publish_item_headers = st.dictionaries(
    st.binary(min_size=1, max_size=8).filter(lambda key: key not in mc0.DELIVERY_HEADERS),
    small_bytes,
    max_size=3,
)

events: st.SearchStrategy[mc0.Event] = st.one_of(
    st.builds(
        mc0.Connect,
        version=st.sampled_from(mc0.SUPPORTED_VERSIONS),
        ttl=st.none() | st.integers(1, mc0.MAX_TTL_MS),
        id=command_ids,
        extensions=st.frozensets(st.sampled_from(sorted(mc0.KNOWN_EXTENSIONS))),
        headers=headers,
    ),
    st.builds(mc0.Disconnect, id=command_ids, headers=headers),
    st.builds(mc0.Sub, topics=st.lists(topics, min_size=1, max_size=4), id=command_ids, headers=headers),
    st.builds(
        mc0.Sub,
        topics=st.lists(topics, min_size=1, max_size=4),
        id=command_ids,
        headers=headers,
        replay=st.none() | st.sampled_from(["beginning", "current"]) | u64,
        credit=st.none() | st.integers(1, 2**31 - 1),
        explicit_acks=st.booleans(),
    ),
    st.builds(mc0.Sub, topics=st.lists(topics, min_size=1, max_size=2), id=command_ids, resume=u64),
    st.builds(mc0.Ack, topic=topics, message_ids=st.lists(u64, min_size=1, max_size=5), id=command_ids,
              headers=headers),
    st.builds(
        mc0.Declare,
        topic=topics,
        settings=st.dictionaries(st.sampled_from(sorted(mc0.DECLARE_SETTINGS.values())),
                                 st.text("abcdefghijklmnopqrstuvwxyz0123456789-.", max_size=12)),
        id=command_ids,
        headers=st.dictionaries(st.builds(lambda tail: b"X-" + tail, st.binary(max_size=10)), small_bytes,
                                max_size=3),
    ),
    st.builds(mc0.Unsub, topics=st.lists(topics, min_size=1, max_size=4), id=command_ids, headers=headers),
    st.builds(mc0.Put, topic=topics, body=st.binary(max_size=64), id=command_ids, headers=headers),
    st.builds(
        mc0.Puts,
        items=st.lists(
            st.builds(mc0.PutItem, topic=topics, body=small_bytes, headers=publish_item_headers), max_size=4
        ),
        id=command_ids,
        headers=headers,
    ),
    st.builds(  # CONFIRM each needs an ID
        mc0.Puts,
        items=st.lists(
            st.builds(mc0.PutItem, topic=topics, body=small_bytes, headers=publish_item_headers), max_size=4
        ),
        id=st.binary(max_size=16),
        headers=headers,
        confirm_each=st.just(True),
    ),
    st.builds(mc0.Noop, id=command_ids, headers=headers),
    st.builds(
        mc0.Message,
        topic=topics,
        body=st.binary(max_size=64),
        headers=headers,
        message_id=st.none() | u64,
        timestamp=st.none() | u64,
    ),
    st.builds(
        mc0.Messages,
        items=st.lists(
            st.builds(
                mc0.MessageItem,
                topic=topics,
                message_id=u64,
                timestamp=st.integers(-(2**63), 2**64 - 1),
                body=small_bytes,
                headers=item_headers,
            ),
            max_size=4,
        ),
    ),
    st.builds(mc0.Ok, id=command_ids, headers=headers, body=st.none() | small_bytes),
    st.builds(mc0.Error, message=small_bytes, id=command_ids, headers=headers),
    st.builds(mc0.Stats, id=command_ids, headers=headers),
)


@ROUND_TRIP
@given(event=events, delimiter=st.booleans())
def test_round_trip(event: mc0.Event, delimiter: bool) -> None:
    frames = mc0.encode(event, delimiter=delimiter)
    assert all(type(frame) is bytes for frame in frames)
    assert (frames[0] == b"") is delimiter
    assert mc0.decode(frames) == event


def _decode_or_protocol_error(frames: list[bytes]) -> None:
    """Decode must return an event or raise ProtocolError with a usable message; nothing else may escape."""
    refused: ProtocolError | None = None
    try:
        event = mc0.decode(frames)
    except ProtocolError as error:
        refused = error
    if refused is None:
        assert isinstance(event, mc0.Event)
        # Whatever decodes encodes again to frames meaning the same event.
        assert mc0.decode(mc0.encode(event)) == event
        return
    text = str(refused)
    assert text
    assert text.isprintable()
    assert refused.command_id is None or refused.command_id in frames
    assert isinstance(mc0.error_reply(refused), mc0.Error)


VOCABULARY = sorted(mc0.VERBS | RESERVED | {b"", b"X-a", b"0.2", b"30000", b"\xc1", PUTS_ONE, MESSAGES_ONE})
frame = st.one_of(st.binary(max_size=32), st.sampled_from(VOCABULARY))


@FUZZ
@given(frames=st.lists(frame, max_size=14))
def test_fuzz_arbitrary_frames(frames: list[bytes]) -> None:
    _decode_or_protocol_error(frames)


@FUZZ
@given(frames=st.lists(st.binary(max_size=64), max_size=8))
def test_fuzz_raw_bytes(frames: list[bytes]) -> None:
    _decode_or_protocol_error(frames)


MUTATIONS = ["drop", "insert", "replace", "duplicate", "truncate", "swap", "flip"]


@FUZZ
@given(event=events, delimiter=st.booleans(), data=st.data())
def test_fuzz_mutated_encodings(event: mc0.Event, delimiter: bool, data: st.DataObject) -> None:
    frames = mc0.encode(event, delimiter=delimiter)
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        kind = data.draw(st.sampled_from(MUTATIONS), label="mutation")
        index = data.draw(st.integers(0, max(0, len(frames) - 1)), label="index")
        if kind == "drop" and frames:
            del frames[index]
        elif kind == "insert":
            frames.insert(index, data.draw(frame, label="inserted"))
        elif kind == "replace" and frames:
            frames[index] = data.draw(frame, label="replacement")
        elif kind == "duplicate" and frames:
            frames.insert(index, frames[index])
        elif kind == "truncate":
            frames = frames[:index]
        elif kind == "swap" and len(frames) > 1:
            other = data.draw(st.integers(0, len(frames) - 1), label="other")
            frames[index], frames[other] = frames[other], frames[index]
        elif kind == "flip" and frames and frames[index]:
            raw = bytearray(frames[index])
            position = data.draw(st.integers(0, len(raw) - 1), label="byte")
            raw[position] ^= data.draw(st.integers(1, 255), label="mask")
            frames[index] = bytes(raw)
    _decode_or_protocol_error(frames)


@pytest.mark.parametrize("reserved", sorted(mc0.DELIVERY_HEADERS))
def test_puts_entry_may_not_carry_a_header_the_broker_writes(reserved: bytes) -> None:
    payload = mc0.pack_put_items([mc0.PutItem(b"t", b"ok"), mc0.PutItem(b"t", b"b", {reserved: b"1"})])
    with pytest.raises(ProtocolError, match="set by the broker on delivery") as info:
        mc0.decode([b"", b"PUTS", b"ID", b"batch-7", b"", payload])
    assert info.value.command_id == b"batch-7"


@pytest.mark.parametrize("reserved", [mc0.MESSAGE_ID, mc0.TIMESTAMP])
def test_put_may_not_carry_a_header_the_broker_writes(reserved: bytes) -> None:
    with pytest.raises(ProtocolError, match="set by the broker on delivery") as info:
        mc0.decode([b"", b"PUT", b"TOPIC", b"t", reserved, b"9", b"ID", b"p1", b"", b"body"])
    assert info.value.command_id == b"p1"


# ------------------------------------------------------------------------------------------------ FETCH

# (frames without the leading delimiter, in the encoder's header order; the event they mean)
FETCH_VECTORS: list[tuple[list[bytes], mc0.Event]] = [
    ([b"FETCH", b"TOPIC", b"log", b"ID", b"f1"], mc0.Fetch(b"log", id=b"f1")),
    (
        [b"FETCH", b"TOPIC", b"log", b"FROM", b"42", b"MAX-MESSAGES", b"0", b"MAX-BYTES", b"1048576", b"ID",
         b"f2"],
        mc0.Fetch(b"log", 42, 0, 1 << 20, b"f2"),
    ),
    (
        [b"FETCH", b"TOPIC", b"collective agent", b"MAX-BYTES", b"0", b"X-trace", b"t", b"ID", b""],
        mc0.Fetch(b"collective agent", max_bytes=0, id=b"", headers={b"X-trace": b"t"}),
    ),
    (
        [b"OK", b"ID", b"f2", b"FIRST-ID", b"1", b"NEXT-ID", b"3", b"COUNT", b"0", b"CONTENT-TYPE",
         b"application/msgpack", b"", b"\x90"],
        mc0.Ok(b"f2", {b"FIRST-ID": b"1", b"NEXT-ID": b"3", b"COUNT": b"0",
                       b"CONTENT-TYPE": b"application/msgpack"}, b"\x90"),
    ),
]
# The vector tests at the top are parametrized with these very lists, which pytest expands when it collects
# them, after this module has run: extended here, they put FETCH through the same decode and encode tests
# (both framings), and test_vectors_cover_every_verb sees FETCH among the verbs.
VECTOR_IDS.extend(f"{n}-{frames[0].decode()}" for n, (frames, _) in enumerate(FETCH_VECTORS, len(VECTORS)))
VECTORS.extend(FETCH_VECTORS)


def test_fetch_vectors_are_among_the_vectors() -> None:
    assert all(vector in VECTORS for vector in FETCH_VECTORS)
    assert len(VECTOR_IDS) == len(VECTORS)


def test_fetch_headers_in_any_order() -> None:
    event = mc0.decode([b"", b"FETCH", b"ID", b"f", b"MAX-MESSAGES", b"7", b"FROM", b"3", b"TOPIC", b"t"])
    assert event == mc0.Fetch(b"t", 3, 7, None, b"f")


def test_fetch_numbers_take_leading_zeros_and_the_largest_u64() -> None:
    event = mc0.decode([b"", b"FETCH", b"TOPIC", b"t", b"FROM", b"0018446744073709551615", b"ID", b"f"])
    assert isinstance(event, mc0.Fetch)
    assert event.start == 2**64 - 1


@pytest.mark.parametrize(("raw", "value"), [
    (b"0", 0),
    (b"7", 7),
    (b"9" * 19, 10**19 - 1),  # the longest taken at once
    (b"0" * 18 + b"7", 7),
    (b"0" * 30 + b"7", 7),  # past 19 digits: the closer look, which strips the zeros
    (b"18446744073709551615", 2**64 - 1),  # 20 digits
])
def test_header_numbers_short_and_long_read_the_same(raw: bytes, value: int) -> None:
    event = mc0.decode([b"", b"FETCH", b"TOPIC", b"t", b"FROM", raw, b"MAX-MESSAGES", raw, b"ID", b"f"])
    assert isinstance(event, mc0.Fetch)
    assert (event.start, event.max_messages) == (value, value)


FETCH_MALFORMED: list[tuple[list[bytes], bytes | None, str]] = [
    ([b"FETCH", b"TOPIC", b"t"], None, "needs an ID"),
    ([b"FETCH", b"TOPIC", b"t", b"FROM", b"5"], None, "needs an ID"),
    ([b"FETCH", b"ID", b"7"], b"7", "TOPIC"),
    ([b"FETCH", b"TOPIC", b"", b"ID", b"7"], b"7", "TOPIC"),
    ([b"FETCH", b"TOPIC", b"t", b"FROM", b"-1", b"ID", b"7"], b"7", "FROM"),
    ([b"FETCH", b"TOPIC", b"t", b"FROM", b"", b"ID", b"7"], b"7", "FROM"),
    ([b"FETCH", b"TOPIC", b"t", b"FROM", b"18446744073709551616", b"ID", b"7"], b"7", "too large"),
    ([b"FETCH", b"TOPIC", b"t", b"MAX-MESSAGES", b"ten", b"ID", b"7"], b"7", "MAX-MESSAGES"),
    ([b"FETCH", b"TOPIC", b"t", b"MAX-MESSAGES", b"1.5", b"ID", b"7"], b"7", "MAX-MESSAGES"),
    ([b"FETCH", b"TOPIC", b"t", b"MAX-BYTES", b"+3", b"ID", b"7"], b"7", "MAX-BYTES"),
    ([b"FETCH", b"TOPIC", b"t", b"MAX-BYTES", b"\xd9\xa3", b"ID", b"7"], b"7", "MAX-BYTES"),
    ([b"FETCH", b"TOPIC", b"t", b"MAX-BYTES", b"9" * 5000, b"ID", b"7"], b"7", "too large"),
    ([b"FETCH", b"TOPIC", b"t", b"ID", b"7", b"", b"x"], b"7", "positional"),
    ([b"FETCH", b"TOPIC", b"t", b"FROM", b"1", b"FROM", b"2", b"ID", b"7"], b"7", "twice"),
    ([b"FETCH", b"PACKED", b"\xc1", b"ID", b"7"], b"7", "PACKED is not valid msgpack"),
    ([b"FETCH", b"PACKED", b"\x91\x01", b"ID", b"7"], b"7", "PACKED headers must be a map"),
    ([b"FETCH", b"PACKED", b"\x81\xc4\x04FROM\x01", b"ID", b"7"], b"7", "PACKED headers must be a map"),
    ([b"FETCH", b"PACKED", b"\x81\x01\xc4\x01x", b"ID", b"7"], b"7", "PACKED is not valid msgpack"),
    ([b"FETCH", b"PACKED", b"\x81\xc4\x00\xc4\x01x", b"ID", b"7"], b"7", "PACKED headers must be a map"),
    ([b"FETCH", b"PACKED", b"\x82\xc4\x05TOPIC\xc4\x01t\xc4\x04FROM\x80", b"ID", b"7"], b"7",
     "PACKED headers must be a map"),
    ([b"FETCH", b"PACKED", b"\x80", b"ID", b"7"], b"7", "TOPIC"),
    ([b"FETCH", b"TOPIC", b"t", b"FROM", b"1" * 20 + b"0", b"ID", b"7"], b"7", "too large"),
    ([b"FETCH", b"TOPIC", b"t", b"FROM", b"12 ", b"ID", b"7"], b"7", "FROM"),
    ([b"FETCH", b"TOPIC", b"t", b"FROM", b"1_000", b"ID", b"7"], b"7", "FROM"),
    ([b"FETCH", b"TOPIC", b"t", b"PACKED", b"\x81\xc4\x05TOPIC\xc4\x01u", b"ID", b"7"], b"7", "twice"),
    ([b"FETCH", b"PACKED", b"\x81\xc4\x04FROM\xc4\x011", b"ID", b"7"], b"7", "TOPIC"),
]


@pytest.mark.parametrize(
    ("frames", "command_id", "fragment"), FETCH_MALFORMED, ids=range(len(FETCH_MALFORMED))
)
@pytest.mark.parametrize("delimiter", [True, False], ids=["delimited", "bare"])
def test_malformed_fetch_raises_protocol_error(
    frames: list[bytes], command_id: bytes | None, fragment: str, delimiter: bool
) -> None:
    test_malformed_input_raises_protocol_error(frames, command_id, fragment, delimiter)


def test_a_fetch_without_an_id_cannot_be_encoded_into_something_the_decoder_takes() -> None:
    frames = mc0.encode(mc0.Fetch(b"t", 1))
    assert frames == [b"", b"FETCH", b"TOPIC", b"t", b"FROM", b"1"]
    with pytest.raises(ProtocolError, match="needs an ID"):
        mc0.decode(frames)


# The OK to a FETCH: [[1, 1700000000000, b"a", {}], [2, 1700000000001, b"b", {b"X-k": b"v"}]]
FETCH_PAYLOAD = (
    b"\x92\x94\x01\xcf\x00\x00\x01\x8b\xcf\xe5h\x00\xc4\x01a\x80"
    b"\x94\x02\xcf\x00\x00\x01\x8b\xcf\xe5h\x01\xc4\x01b\x81\xc4\x03X-k\xc4\x01v"
)
FETCH_ITEMS = [
    mc0.FetchItem(1, 1700000000000, b"a", {}),
    mc0.FetchItem(2, 1700000000001, b"b", {b"X-k": b"v"}),
]


def test_fetch_ok_produces_the_documented_reply() -> None:
    ok = mc0.fetch_ok(b"f9", 1, 3, FETCH_ITEMS)
    assert mc0.encode(ok) == [
        b"", b"OK", b"ID", b"f9", b"FIRST-ID", b"1", b"NEXT-ID", b"3", b"COUNT", b"2", b"CONTENT-TYPE",
        b"application/msgpack", b"", FETCH_PAYLOAD,
    ]
    # Plain tuples of the same shape (what the broker passes) pack the same.
    assert mc0.fetch_ok(b"f9", 1, 3, [tuple(item) for item in FETCH_ITEMS]) == ok


def test_the_ok_to_a_fetch_decodes() -> None:
    frames = [b"", b"OK", b"ID", b"f9", b"FIRST-ID", b"1", b"NEXT-ID", b"3", b"COUNT", b"2", b"CONTENT-TYPE",
              b"application/msgpack", b"", FETCH_PAYLOAD]
    reply = mc0.decode(frames)
    assert isinstance(reply, mc0.Ok)
    assert mc0.decode_fetch_reply(reply) == mc0.FetchReply(1, 3, FETCH_ITEMS)
    empty = mc0.decode_fetch_reply(mc0.decode(mc0.encode(mc0.fetch_ok(b"e", 5, 5, []))))  # type: ignore[arg-type]
    assert empty == mc0.FetchReply(5, 5, [])


def _fetch_reply(headers: dict[bytes, bytes] | None = None, body: bytes | None = FETCH_PAYLOAD) -> mc0.Ok:
    base = {b"FIRST-ID": b"1", b"NEXT-ID": b"3", b"COUNT": b"2"}
    return mc0.Ok(b"f", {**base, **(headers or {})}, body)


@pytest.mark.parametrize(
    ("reply", "fragment"),
    [
        (mc0.Ok(b"f", {b"NEXT-ID": b"3", b"COUNT": b"0"}, b"\x90"), "FIRST-ID"),
        (_fetch_reply({b"NEXT-ID": b"x"}), "NEXT-ID"),
        (_fetch_reply({b"COUNT": b"3"}), "COUNT 3"),
        (_fetch_reply(body=None), "payload"),
        (_fetch_reply(body=b"\xc1"), "msgpack"),
        (_fetch_reply({b"COUNT": b"0"}, _pack({})), "array"),
        (_fetch_reply({b"COUNT": b"1"}, _pack([[1, 2, b"b"]])), "entry"),
        (_fetch_reply({b"COUNT": b"1"}, _pack([[-1, 2, b"b", {}]])), "wrong type"),
        (_fetch_reply({b"COUNT": b"1"}, _pack([[1, 2.5, b"b", {}]])), "wrong type"),
        (_fetch_reply({b"COUNT": b"1"}, _pack([[1, 2, "b", {}]])), "wrong type"),
        (_fetch_reply({b"COUNT": b"1"}, _pack([[1, 2, b"b", {"k": b"v"}]])), "headers"),
    ],
    ids=["no-first-id", "bad-next-id", "count-mismatch", "no-payload", "not-msgpack", "not-array",
         "short-entry", "negative-id", "float-timestamp", "str-body", "str-header"],
)
def test_a_malformed_ok_to_a_fetch_raises_protocol_error(reply: mc0.Ok, fragment: str) -> None:
    with pytest.raises(ProtocolError, match=fragment) as info:
        mc0.decode_fetch_reply(reply)
    assert info.value.command_id == b"f"


fetch_events = st.builds(
    mc0.Fetch,
    topic=topics,
    start=st.none() | u64,
    max_messages=st.none() | u64,
    max_bytes=st.none() | u64,
    id=st.binary(max_size=16),
    headers=st.dictionaries(header_keys.filter(lambda key: key not in (mc0.FROM, mc0.MAX_MESSAGES,
                                                                       mc0.MAX_BYTES)),
                            small_bytes, max_size=4),
    wait=st.none() | u64,
    records=st.booleans(),
    incarnation=st.none() | st.binary(max_size=32),
    packed=st.booleans(),
).flatmap(lambda fetch: st.builds(
    lambda at_time: dataclasses.replace(fetch, at_time=at_time),
    st.none() | u64 if fetch.start is None else st.none(),  # AT-TIME and FROM exclude each other
))


@ROUND_TRIP
@given(event=fetch_events, delimiter=st.booleans())
def test_fetch_round_trip(event: mc0.Fetch, delimiter: bool) -> None:
    assert mc0.decode(mc0.encode(event, delimiter=delimiter)) == event


def test_a_packed_fetch_is_the_same_fetch_in_four_frames_and_its_ok_goes_packed_too() -> None:
    plain = mc0.Fetch(b"t", 5, 10, 4096, b"7", wait=1000, records=True, incarnation=b"i", replica=b"node-2",
                      epoch=3)
    packed = dataclasses.replace(plain, packed=True)
    frames = mc0.encode(packed)
    assert frames[:3] == [b"", b"FETCH", b"PACKED"]
    assert frames[4:] == [b"ID", b"7"]
    assert mc0.decode(frames) == packed
    assert dataclasses.replace(mc0.decode(frames), packed=False) == mc0.decode(mc0.encode(plain))
    ok = mc0.records_ok(b"7", 1, 9, 5, 4, b"i", b"records")
    ok_frames = mc0.encode_packed_ok(ok)
    assert ok_frames[:5] == [b"", b"OK", b"ID", b"7", b"PACKED"]
    assert ok_frames[-2:] == [b"", b"records"]
    assert mc0.decode(ok_frames) == ok
    assert mc0.decode_records_reply(mc0.decode(ok_frames)) == mc0.decode_records_reply(ok)


@ROUND_TRIP
@given(
    first_id=u64,
    next_id=u64,
    items=st.lists(st.builds(mc0.FetchItem, u64, st.integers(-(2**63), 2**64 - 1), small_bytes, item_headers),
                   max_size=5),
)
def test_fetch_reply_round_trip(first_id: int, next_id: int, items: list[mc0.FetchItem]) -> None:
    reply = mc0.decode(mc0.encode(mc0.fetch_ok(b"r", first_id, next_id, items)))
    assert isinstance(reply, mc0.Ok)
    assert mc0.decode_fetch_reply(reply) == mc0.FetchReply(first_id, next_id, items)


@FUZZ
@given(event=fetch_events, delimiter=st.booleans(), data=st.data())
def test_fuzz_mutated_fetch_encodings(event: mc0.Fetch, delimiter: bool, data: st.DataObject) -> None:
    test_fuzz_mutated_encodings.hypothesis.inner_test(event, delimiter, data)  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------------------- CONFIRM each


def test_confirm_each_needs_an_id_and_the_word_each() -> None:
    with pytest.raises(ProtocolError, match="needs an ID"):
        mc0.decode([b"PUTS", b"CONFIRM", b"each", b"", PUTS_ONE])
    with pytest.raises(ProtocolError, match="CONFIRM must be 'each'") as refused:
        mc0.decode([b"PUTS", b"CONFIRM", b"every", b"ID", b"c1", b"", PUTS_ONE])
    assert refused.value.command_id == b"c1"


def test_confirms_ok_produces_the_documented_reply() -> None:
    ok = mc0.confirms_ok(b"c1", [(1, "fsync"), (None, "refused"), (2, "memory")])
    assert ok.id == b"c1"
    assert ok.headers == {}
    assert mc0.encode(ok)[:4] == [b"", b"OK", b"ID", b"c1"]
    assert ok.body is not None
    assert msgpack.unpackb(ok.body) == [[1, "fsync"], [None, "refused"], [2, "memory"]]
    assert mc0.decode_confirms(ok, 3) == [(1, "fsync"), (None, "refused"), (2, "memory")]


@pytest.mark.parametrize(
    ("body", "count", "fragment"),
    [
        (None, 1, "no payload"),
        (msgpack.packb([[1, "fsync"]]), 2, "carries 1 results"),
        (msgpack.packb([[1]]), 1, "must be [id, durability]"),
        (msgpack.packb([["1", "fsync"]]), 1, "must be [id, durability]"),
        (msgpack.packb([[-1, "fsync"]]), 1, "must be [id, durability]"),
        (msgpack.packb([[1, b"fsync"]], use_bin_type=True), 1, "must be [id, durability]"),
        (msgpack.packb({"a": 1}), 1, "must be a msgpack array"),
        (b"\xc1", 1, "not valid msgpack"),
    ],
)
def test_a_malformed_confirms_reply_raises_protocol_error(
    body: bytes | None, count: int, fragment: str
) -> None:
    with pytest.raises(ProtocolError, match=re.escape(fragment)):
        mc0.decode_confirms(mc0.Ok(b"c1", {}, body), count)


@ROUND_TRIP
@given(results=st.lists(st.tuples(st.none(), st.text(max_size=20)) | st.tuples(u64, st.sampled_from(
    ["fsync", "written", "memory"])), max_size=20))
def test_confirms_reply_round_trip(results: list[tuple[int | None, str]]) -> None:
    ok = mc0.decode(mc0.encode(mc0.confirms_ok(b"c", results)))
    assert isinstance(ok, mc0.Ok)
    assert mc0.decode_confirms(ok, len(results)) == results


# ----------------------------------------------------------------------- idempotent PUTS, records replies


def test_an_idempotent_puts_round_trips_and_names_one_topic() -> None:
    items = [(b"t", b"a", {}), (b"t", b"b", {b"X-K": b"v"})]
    event = mc0.Puts(items, b"p1", producer=b"spark:7", sequence=40)
    decoded = mc0.decode(mc0.encode(event))
    assert decoded == event
    frames = mc0.encode(mc0.Puts([(b"t", b"a", {}), (b"u", b"b", {})], b"p2", producer=b"p", sequence=0))
    with pytest.raises(ProtocolError, match="one topic") as info:
        mc0.decode(frames)
    assert info.value.command_id == b"p2"
    with pytest.raises(ProtocolError, match="together"):
        mc0.decode([b"", b"PUTS", mc0.SEQUENCE, b"1", b"", mc0.pack_put_items([(b"t", b"a", {})])])
    with pytest.raises(ProtocolError, match="SEQUENCE"):
        mc0.decode([b"", b"PUTS", mc0.PRODUCER, b"p", mc0.SEQUENCE, b"-1", b"", mc0.pack_put_items([])])
    with pytest.raises(ProtocolError, match="past 2"):
        mc0.decode(mc0.encode(mc0.Puts([(b"t", b"a", {}), (b"t", b"b", {})], producer=b"p",
                                        sequence=2**64 - 1)))


def test_a_records_reply_says_what_it_holds() -> None:
    ok = mc0.records_ok(b"r", 3, 90, 10, 2, b"f" * 32, b"\x00" * 40)
    reply = mc0.decode(mc0.encode(ok))
    assert isinstance(reply, mc0.Ok)
    assert mc0.decode_records_reply(reply) == mc0.RecordsReply(3, 90, 10, 2, b"f" * 32, b"\x00" * 40)
    plain = mc0.decode(mc0.encode(mc0.fetch_ok(b"r", 1, 1, [])))
    assert isinstance(plain, mc0.Ok)
    with pytest.raises(ProtocolError, match="does not carry records"):
        mc0.decode_records_reply(plain)
    with_identity = mc0.decode(mc0.encode(mc0.fetch_ok(b"r", 1, 5, [], b"a" * 32, 4)))
    assert isinstance(with_identity, mc0.Ok)
    assert mc0.decode_fetch_reply(with_identity) == mc0.FetchReply(1, 5, [], b"a" * 32, 4)


def test_sub_takes_incarnation_only_with_resume() -> None:
    sub = mc0.Sub([b"t"], b"s", resume=7, incarnation=b"b" * 32)
    assert mc0.decode(mc0.encode(sub)) == sub
    with pytest.raises(ProtocolError, match="only with RESUME"):
        mc0.decode([b"", b"SUB", mc0.INCARNATION, b"x", mc0.ID, b"s", b"", b"t"])


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "plain"])
@pytest.mark.parametrize("extra", [{}, {b"X-" + b"%02d" % n: b"v" * n for n in range(20)}],
                         ids=["replica", "many-headers"])
def test_a_fetch_template_gives_what_encode_gives(packed: bool, extra: dict[bytes, bytes]) -> None:
    """A follower's FETCH prepared once (:class:`mc0.FetchTemplate`), then filled with each FROM and ID: the
    same frames as encoding the FETCH whole, for FROMs of every msgpack length, more than 16 headers
    included (a map16 header), and they decode back to the FETCH."""
    fetch = mc0.Fetch(b"copy.strong", 1, 10_000, 4 << 20, wait=1000, records=True, incarnation=b"a" * 32,
                      replica=b"node-2", epoch=7, packed=packed, headers=dict(extra))
    template = mc0.FetchTemplate(fetch)
    for start in (0, 1, 9, 10, 127, 128, 65_535, 10**12, 2**64 - 1):
        frames = template.frames(start, b"%d" % start)
        assert frames == mc0.encode(dataclasses.replace(fetch, start=start, id=b"%d" % start))
        decoded = mc0.decode(frames)
        assert isinstance(decoded, mc0.Fetch)
        assert (decoded.start, decoded.id, decoded.incarnation, decoded.epoch) == (start, b"%d" % start,
                                                                                   b"a" * 32, 7)


def test_a_fetch_template_needs_a_from_and_no_id() -> None:
    with pytest.raises(ValueError, match="FROM"):
        mc0.FetchTemplate(mc0.Fetch(b"t", None))
    with pytest.raises(ValueError, match="ID"):
        mc0.FetchTemplate(mc0.Fetch(b"t", 1, id=b"3"))
