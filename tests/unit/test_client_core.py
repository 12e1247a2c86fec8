"""The sans-IO client core (connector/core.py) with time as a plain number: the CONNECT it sends, extension
negotiation from the broker's OK, request IDs, the SUB that restores subscriptions, how fire-and-forget
publishes are packed (PUTS batches or plain PUTs), what every kind of frame set from the broker means (garbage
included, which must never raise), and the heartbeat clock (NOOP at 0.95 x TTL since the last send, broker
silent after 1.05 x TTL since the last frame heard, and the time until the next decision).
"""

from __future__ import annotations

import uuid

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from connector.core import BATCH_MAX_MESSAGES, ClientCore, Message, encode_headers, to_bytes
from protocol import mc0

pytestmark = pytest.mark.timeout(30)

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
#: Nested msgpack values are slow to generate: fewer examples keep the test near a second.
FUZZ_NESTED = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def parse(frames: list[bytes]) -> tuple[bytes, dict[bytes, bytes], list[bytes] | None]:
    """Independent reading of a client frame set: delimiter, verb, key/value pairs, then positional frames."""
    assert frames[0] == b"", f"a DEALER command starts with the empty delimiter: {frames!r}"
    verb = frames[1]
    headers: dict[bytes, bytes] = {}
    index = 2
    while index < len(frames):
        if frames[index] == b"":
            return verb, headers, frames[index + 1 :]
        assert frames[index] not in headers, frames
        headers[frames[index]] = frames[index + 1]
        index += 2
    return verb, headers, None


def negotiated(*extensions: str, ttl_ms: int | None = 30_000) -> ClientCore:
    core = ClientCore(ttl_ms)
    command_id, _ = core.connect(0.0)
    headers = {mc0.EXTENSIONS: " ".join(extensions).encode()} if extensions else {}
    core.connected(mc0.Ok(command_id, headers))
    return core


def publishes(count: int, headers: dict[bytes, bytes] | None = None) -> list[tuple[bytes, bytes, dict]]:
    return [(b"t", b"m%d" % n, dict(headers or {})) for n in range(count)]


# ---------------------------------------------------------------------------------------------------- CONNECT


def test_connect_frames_carry_a_uuid_id_version_ttl_and_both_extensions() -> None:
    core = ClientCore(30_000)
    command_id, frames = core.connect(10.0)
    verb, headers, positional = parse(frames)
    assert verb == b"CONNECT"
    assert positional is None
    assert headers[b"ID"] == command_id
    assert str(uuid.UUID(command_id.decode())) == command_id.decode()
    assert headers[b"VERSION"] in mc0.SUPPORTED_VERSIONS
    assert headers[b"TTL"] == b"30000"
    assert set(headers[b"EXTENSIONS"].decode().split()) == {"batch", "ids"}
    assert set(headers) == {b"ID", b"VERSION", b"TTL", b"EXTENSIONS"}


def test_connect_without_ttl_sends_no_ttl_header() -> None:
    _, frames = ClientCore(None).connect(0.0)
    _, headers, _ = parse(frames)
    assert b"TTL" not in headers
    assert b"VERSION" in headers


def test_every_connect_has_a_fresh_id() -> None:
    core = ClientCore()
    ids = {core.connect(float(n))[0] for n in range(20)}
    assert len(ids) == 20


def test_connect_frames_decode_with_the_codec() -> None:
    command_id, frames = ClientCore(400).connect(0.0)
    event = mc0.decode(frames)
    assert isinstance(event, mc0.Connect)
    assert event.id == command_id
    assert event.ttl == 400
    assert event.extensions == frozenset({"batch", "ids"})


@pytest.mark.parametrize("ttl", [0, -1])
def test_a_non_positive_ttl_is_refused(ttl: int) -> None:
    with pytest.raises(ValueError, match="ttl"):
        ClientCore(ttl)


# -------------------------------------------------------------------------------------- extension negotiation


def test_no_extensions_before_the_ok() -> None:
    core = ClientCore()
    core.connect(0.0)
    assert core.extensions == frozenset()


@pytest.mark.parametrize(
    ("echoed", "expected"),
    [
        (b"batch ids", {"batch", "ids"}),
        (b"ids", {"ids"}),
        (b"batch", {"batch"}),
        (b"", set()),
        (b"ids compression  batch", {"batch", "ids"}),  # unknown tokens are not ours to use
    ],
)
def test_extensions_come_from_the_ok(echoed: bytes, expected: set[str]) -> None:
    core = ClientCore()
    command_id, _ = core.connect(0.0)
    core.connected(mc0.Ok(command_id, {mc0.EXTENSIONS: echoed}))
    assert core.extensions == expected


def test_an_ok_without_extensions_header_means_a_plain_03_broker() -> None:
    core = ClientCore()
    command_id, _ = core.connect(0.0)
    core.connected(mc0.Ok(command_id))
    assert core.extensions == frozenset()


def test_a_new_connect_forgets_the_previous_negotiation() -> None:
    core = negotiated("batch", "ids")
    core.connect(5.0)
    assert core.extensions == frozenset()


# ------------------------------------------------------------------------------------------------ request IDs


def test_requests_get_increasing_unique_ids() -> None:
    core = ClientCore()
    events = [
        mc0.Sub([b"a"]), mc0.Unsub([b"a"]), mc0.Noop(), mc0.Stats(), mc0.Put(b"t", b"b"), mc0.Disconnect(),
    ]
    ids = []
    for event in events:
        command_id, frames = core.request(event)
        _, headers, _ = parse(frames)
        assert headers[b"ID"] == command_id
        assert event.id == command_id
        ids.append(command_id)
    assert len(set(ids)) == len(ids)
    assert [int(i) for i in ids] == sorted(int(i) for i in ids)


def test_request_frames_are_the_commands() -> None:
    core = ClientCore()
    _, frames = core.request(mc0.Sub([b"a", b"b c"]))
    assert parse(frames)[0] == b"SUB"
    assert parse(frames)[2] == [b"a", b"b c"]
    _, frames = core.request(mc0.Put(b"t", b"body", None, {b"X-k": b"v"}))
    verb, headers, positional = parse(frames)
    assert (verb, headers[b"TOPIC"], headers[b"X-k"], positional) == (b"PUT", b"t", b"v", [b"body"])


# ------------------------------------------------------------------------------------------------ resubscribe


def test_resubscribe_with_nothing_subscribed_sends_nothing() -> None:
    assert ClientCore().resubscribe() == []


def test_resubscribe_sends_one_sub_with_every_topic_in_order() -> None:
    core = ClientCore()
    for topic in (b"b", b"a", b"collective agent"):
        core.subscriptions[topic] = None
    commands = core.resubscribe()
    assert len(commands) == 1
    command_id, frames = commands[0]
    verb, headers, positional = parse(frames)
    assert verb == b"SUB"
    assert headers == {b"ID": command_id}
    assert positional == [b"b", b"a", b"collective agent"]


def test_resubscribe_ids_do_not_repeat() -> None:
    core = ClientCore()
    core.subscriptions[b"a"] = None
    first = core.resubscribe()[0][0]
    second = core.resubscribe()[0][0]
    assert first != second


# ------------------------------------------------------------------------------------------------------- pack


def test_pack_without_batch_gives_plain_puts_in_order() -> None:
    core = negotiated("ids")
    items = [*publishes(3), (b"u", b"x", {b"X-k": b"v"})]
    frame_sets = list(core.pack(items))
    assert len(frame_sets) == 4
    for frames, (topic, body, headers) in zip(frame_sets, items, strict=True):
        verb, got_headers, positional = parse(frames)
        assert verb == b"PUT"
        assert got_headers.pop(b"TOPIC") == topic
        assert b"ID" not in got_headers  # fire-and-forget
        assert got_headers == headers
        assert positional == [body]


def test_pack_before_negotiation_gives_plain_puts() -> None:
    core = ClientCore()
    core.connect(0.0)
    assert [parse(frames)[0] for frames in core.pack(publishes(2))] == [b"PUT", b"PUT"]


def test_pack_with_batch_gives_one_puts_for_a_small_batch() -> None:
    core = negotiated("batch", "ids")
    items = [*publishes(5), (b"u", b"x", {b"X-k": b"v"})]
    frame_sets = list(core.pack(items))
    assert len(frame_sets) == 1
    verb, headers, positional = parse(frame_sets[0])
    assert (verb, headers) == (b"PUTS", {})
    assert positional is not None
    assert len(positional) == 1
    entries = msgpack.unpackb(positional[0], raw=False)
    assert entries == [[b"t", b"m%d" % n] for n in range(5)] + [[b"u", b"x", {b"X-k": b"v"}]]
    event = mc0.decode(frame_sets[0])
    assert isinstance(event, mc0.Puts)
    assert event.id is None
    assert [tuple(item) for item in event.items] == items


@pytest.mark.parametrize(
    "count", [1, BATCH_MAX_MESSAGES - 1, BATCH_MAX_MESSAGES, BATCH_MAX_MESSAGES + 1, 2500]
)
def test_pack_with_batch_chunks_at_most_1024_messages(count: int) -> None:
    core = negotiated("batch", "ids")
    items = publishes(count)
    frame_sets = list(core.pack(items))
    bodies: list[bytes] = []
    for frames in frame_sets:
        event = mc0.decode(frames)
        assert isinstance(event, mc0.Puts)
        assert 1 <= len(event.items) <= BATCH_MAX_MESSAGES
        bodies += [body for _, body, _ in event.items]
    assert len(frame_sets) == -(-count // BATCH_MAX_MESSAGES)
    assert bodies == [body for _, body, _ in items]


def test_pack_with_batch_bounds_the_frame_size() -> None:
    core = negotiated("batch", "ids")
    big = b"x" * (300 * 1024)
    items = [(b"t", big, {}) for _ in range(10)]
    frame_sets = list(core.pack(items))
    assert len(frame_sets) > 1
    assert all(len(frames[-1]) <= 2 * (1 << 20) for frames in frame_sets)
    assert sum(len(mc0.decode(frames).items) for frames in frame_sets) == 10  # type: ignore[union-attr]


def test_pack_of_nothing_is_nothing() -> None:
    assert list(negotiated("batch").pack([])) == []
    assert list(negotiated().pack([])) == []


# ---------------------------------------------------------------------------------------------------- receive


def test_receive_message_with_ids() -> None:
    core = negotiated("ids")
    frames = mc0.encode(mc0.Message(b"orders", b"hello", {b"X-k": b"v"}, 7, 1_700_000_000_000))
    messages, reply = core.receive(frames, 1.0)
    assert reply is None
    assert messages == [Message("orders", b"hello", {"X-k": "v"}, 7, 1_700_000_000_000)]
    assert messages[0].text == "hello"


def test_receive_plain_03_message() -> None:
    core = negotiated()
    messages, reply = core.receive([b"", b"MESSAGE", b"TOPIC", b"collective agent", b"", b"body"], 1.0)
    assert reply is None
    assert messages == [Message("collective agent", b"body", {}, None, None)]


def test_receive_messages_batch() -> None:
    core = negotiated("batch", "ids")
    items = [
        mc0.MessageItem(b"t", 1, 100, b"a"),
        mc0.MessageItem(b"t", 2, 101, b"b", {b"X-k": b"v"}),
        mc0.MessageItem(b"u", 9, 102, b"\xff\x00"),
    ]
    messages, reply = core.receive(mc0.encode(mc0.Messages(items)), 1.0)
    assert reply is None
    assert messages == [
        Message("t", b"a", {}, 1, 100),
        Message("t", b"b", {"X-k": "v"}, 2, 101),
        Message("u", b"\xff\x00", {}, 9, 102),
    ]


def test_receive_messages_batch_without_delimiter() -> None:
    core = negotiated("batch", "ids")
    frames = mc0.encode(mc0.Messages([mc0.MessageItem(b"t", 1, 100, b"a")]), delimiter=False)
    messages, _ = core.receive(frames, 1.0)
    assert messages == [Message("t", b"a", {}, 1, 100)]


def test_receive_ok_and_error_are_replies() -> None:
    core = negotiated()
    messages, reply = core.receive([b"", b"OK", b"ID", b"3", b"MESSAGE-ID", b"12"], 1.0)
    assert messages == []
    assert isinstance(reply, mc0.Ok)
    assert reply.id == b"3"
    assert reply.headers == {b"MESSAGE-ID": b"12"}
    messages, reply = core.receive([b"", b"ERROR", b"MESSAGE", b"refused", b"ID", b"4"], 1.0)
    assert messages == []
    assert isinstance(reply, mc0.Error)
    assert (reply.id, reply.message) == (b"4", b"refused")


def test_receive_ok_with_body() -> None:
    core = negotiated()
    _, reply = core.receive([b"", b"OK", b"ID", b"5", b"", b'{"a": 1}'], 1.0)
    assert isinstance(reply, mc0.Ok)
    assert reply.body == b'{"a": 1}'


def test_receive_noop_is_liveness_only() -> None:
    core = negotiated(ttl_ms=1000)
    assert core.receive([b"", b"NOOP"], 3.0) == ([], None)
    assert core.last_heard == 3.0


GARBAGE: list[list[bytes]] = [
    [],
    [b""],
    [b"", b"BOGUS"],
    [b"", b"MESSAGE"],
    [b"", b"MESSAGE", b"TOPIC"],
    [b"", b"MESSAGE", b"TOPIC", b"t", b"MESSAGE-ID", b"x", b"", b"b"],
    [b"", b"ERROR"],
    [b"", b"OK", b"ID"],
    [b"", b"MESSAGES", b""],
    [b"", b"MESSAGES", b"", b"\xc1"],
    [b"", b"MESSAGES", b"", msgpack.packb({"a": 1})],
    [b"", b"MESSAGES", b"", msgpack.packb([1, 2, 3])],
    [b"", b"MESSAGES", b"", msgpack.packb([{"a": 1, "b": 2, "c": 3, "d": 4}])],
    [b"", b"MESSAGES", b"", msgpack.packb([{"a": 1, "b": 2, "c": 3, "d": 4, "e": 5}])],
    [b"", b"MESSAGES", b"", msgpack.packb([[b"t", 1, 2, b"b", [1]]])],
    [b"", b"MESSAGES", b"", msgpack.packb([[b"t", 1, 2, b"b", {"k": 1}]])],
    [b"", b"MESSAGES", b"", msgpack.packb([[1, 2, 3, 4]])],
    [b"", b"MESSAGES", b"", msgpack.packb(["abcd"])],
    [b"", b"MESSAGES", b"", msgpack.packb([b"abcd"])],
    [b"", b"MESSAGES", b"", b"\x91\x94", b"extra"],
    [b"\xff" * 100],
]


@pytest.mark.parametrize("frames", GARBAGE)
def test_receive_garbage_never_raises(frames: list[bytes]) -> None:
    core = negotiated("batch", "ids", ttl_ms=1000)
    messages, reply = core.receive(frames, 2.0)
    assert isinstance(messages, list)
    assert reply is None or isinstance(reply, mc0.Ok | mc0.Error)
    for message in messages:
        assert isinstance(message, Message)
    assert core.last_heard == 2.0  # anything at all from the broker proves it is alive


def test_receive_keeps_the_good_entries_before_a_broken_one() -> None:
    core = negotiated("batch", "ids")
    payload = msgpack.packb([[b"t", 1, 2, b"ok"], [b"t"]], use_bin_type=True)
    messages, _ = core.receive([b"", b"MESSAGES", b"", payload], 1.0)
    assert [m.body for m in messages] == [b"ok"]


@FUZZ
@given(st.lists(st.binary(max_size=40), max_size=8))
def test_receive_random_frames_never_raises(frames: list[bytes]) -> None:
    core = negotiated("batch", "ids")
    messages, reply = core.receive(frames, 1.0)
    assert isinstance(messages, list)
    assert reply is None or isinstance(reply, mc0.Ok | mc0.Error)


PAYLOADS = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.binary(max_size=8)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.binary(max_size=4) | st.text(max_size=4),
                                                                  inner, max_size=4),
    max_leaves=20,
)


@FUZZ_NESTED
@given(st.lists(PAYLOADS, max_size=6))
def test_receive_random_batches_never_raises(entries: list[object]) -> None:
    core = negotiated("batch", "ids")
    payload = msgpack.packb(entries, use_bin_type=True)
    messages, reply = core.receive([b"", b"MESSAGES", b"", payload], 1.0)
    assert reply is None
    assert all(isinstance(m, Message) for m in messages)


# ------------------------------------------------------------------------------------------------- heartbeats


def test_noop_due_at_095_ttl_since_the_last_send() -> None:
    core = ClientCore(1000)
    core.connect(100.0)
    assert not core.noop_due(100.0)
    assert not core.noop_due(100.0 + 0.949)
    assert core.noop_due(100.0 + 0.95)
    core.sent(100.5)
    assert not core.noop_due(100.5 + 0.949)
    assert core.noop_due(100.5 + 0.951)


def test_hearing_from_the_broker_does_not_postpone_our_noop() -> None:
    core = ClientCore(1000)
    core.connect(0.0)
    core.receive([b"", b"NOOP"], 0.9)
    assert core.noop_due(0.96)


def test_broker_silent_after_105_ttl_since_last_heard() -> None:
    core = ClientCore(1000)
    core.connect(0.0)
    assert not core.broker_silent(1.05)
    assert core.broker_silent(1.051)
    core.receive([b"", b"NOOP"], 1.0)
    assert not core.broker_silent(2.04)
    assert core.broker_silent(2.06)


def test_sending_does_not_prove_the_broker_alive() -> None:
    core = ClientCore(1000)
    core.connect(0.0)
    core.sent(1.0)
    assert core.broker_silent(1.06)


def test_any_frame_set_counts_as_hearing_from_the_broker() -> None:
    core = ClientCore(1000)
    core.connect(0.0)
    core.receive(mc0.encode(mc0.Message(b"t", b"b")), 1.0)
    assert not core.broker_silent(2.0)
    core.receive([b"", b"garbage"], 2.0)
    assert not core.broker_silent(3.0)


def test_next_timer_is_the_earlier_of_noop_and_silence() -> None:
    core = ClientCore(1000)
    core.connect(10.0)
    assert core.next_timer(10.0) == pytest.approx(0.95)
    core.sent(10.5)
    assert core.next_timer(10.5) == pytest.approx(1.05 - 0.5)  # silence deadline at 11.05 comes first
    core.receive([b"", b"NOOP"], 10.6)
    assert core.next_timer(10.6) == pytest.approx(0.95 - 0.1)  # noop deadline at 11.45 now comes first
    assert core.next_timer(20.0) == 0.0  # overdue: never negative


def test_no_ttl_no_heartbeats() -> None:
    core = ClientCore(None)
    core.connect(0.0)
    assert core.ttl is None
    assert core.next_timer(0.0) is None
    assert not core.noop_due(1e9)
    assert not core.broker_silent(1e9)


def test_connect_restarts_the_heartbeat_clock() -> None:
    core = ClientCore(1000)
    core.connect(0.0)
    assert core.broker_silent(5.0)
    core.connect(5.0)
    assert not core.broker_silent(5.0)
    assert not core.noop_due(5.0)


# --------------------------------------------------------------------------------------------------- helpers


def test_to_bytes_and_headers() -> None:
    assert to_bytes("é") == "é".encode()
    assert to_bytes(b"\xff") == b"\xff"
    assert encode_headers(None) == {}
    assert encode_headers({"X-a": "1", b"X-b": b"2"}) == {b"X-a": b"1", b"X-b": b"2"}  # type: ignore[dict-item]
