"""The sans-IO client core (connector/core.py) with time as a plain number: the CONNECT it sends, extension
negotiation from the broker's OK, request IDs, the SUB that restores subscriptions, how fire-and-forget
publishes are packed (PUTS batches or plain PUTs), what every kind of frame set from the broker means (garbage
included, which must never raise), and the heartbeat clock (NOOP at 0.95 x TTL since the last send, broker
silent after 1.05 x TTL since the last frame heard, and the time until the next decision).

Durable subscriptions: the last message id recorded per topic from MESSAGE and MESSAGES (fast path and
delimiter-less slow path), the subscription options kept per topic (and restored when the broker refuses a
SUB), the exact SUB frames of a resubscribe (RESUME per topic after the last id, the original REPLAY
otherwise, credit and acks kept, equal options sharing one SUB), and the checks and frames of SUB options,
ACK and DECLARE.
"""

from __future__ import annotations

import uuid

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from connector.core import (
    ACK_MAX_IDS,
    BATCH_MAX_MESSAGES,
    COLUMNS_MIN,
    ClientCore,
    ConnectorError,
    Message,
    Subscription,
    ack_target,
    declare_event,
    encode_headers,
    puts_event,
    sub_event,
    to_bytes,
)
from protocol import mc0
from protocol.bodies import TopicBodies

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


def test_connect_frames_carry_a_uuid_id_version_ttl_and_every_extension() -> None:
    core = ClientCore(30_000)
    command_id, frames = core.connect(10.0)
    verb, headers, positional = parse(frames)
    assert verb == b"CONNECT"
    assert positional is None
    assert headers[b"ID"] == command_id
    assert str(uuid.UUID(command_id.decode())) == command_id.decode()
    assert headers[b"VERSION"] in mc0.SUPPORTED_VERSIONS
    assert headers[b"TTL"] == b"30000"
    assert set(headers[b"EXTENSIONS"].decode().split()) == {"batch", "ids", "confirms", "columns"}
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
    assert event.extensions == frozenset({"batch", "ids", "confirms", "columns"})


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


def test_one_topics_bodies_go_as_columns_when_the_broker_speaks_them() -> None:
    bodies = TopicBodies.of(b"t", [b"a", b"bcd", b""])
    _, frames = negotiated("columns").request(mc0.Puts(bodies, producer=b"p", sequence=7))
    verb, headers, positional = parse(frames)
    assert verb == b"PUTS"
    assert (headers[b"TOPIC"], headers[b"PRODUCER"], headers[b"SEQUENCE"]) == (b"t", b"p", b"7")
    assert positional == [b"\x00\x00\x00\x01\x00\x00\x00\x03\x00\x00\x00\x00", b"abcd"]


def test_one_topics_bodies_go_as_msgpack_entries_to_a_broker_without_columns() -> None:
    bodies = TopicBodies.of(b"t", [b"a", b"bcd", b""])
    _, frames = negotiated("batch ids").request(mc0.Puts(bodies, producer=b"p", sequence=7))
    verb, headers, positional = parse(frames)
    assert (verb, b"TOPIC" in headers, headers[b"PRODUCER"]) == (b"PUTS", False, b"p")
    assert positional is not None
    assert msgpack.unpackb(positional[0]) == [[b"t", b"a"], [b"t", b"bcd"], [b"t", b""]]


def test_a_large_batch_of_one_topic_without_headers_becomes_columns() -> None:
    entries = [("t", b"m%d" % n, None) for n in range(COLUMNS_MIN)]
    puts = puts_event(entries, producer="p", sequence=3)
    assert isinstance(puts.items, TopicBodies)
    assert list(puts.items) == [(b"t", body, mc0.NO_HEADERS) for _, body, _ in entries]
    assert (puts.producer, puts.sequence) == (b"p", 3)


def test_a_batch_past_the_brokers_bound_is_refused_before_it_is_sent() -> None:
    with pytest.raises(ValueError, match="at most 10,000 entries, not 10,001: split the batch"):
        puts_event([("t", b"", None)] * (mc0.PUTS_MAX_ENTRIES + 1))
    assert len(puts_event([("t", b"", None)] * mc0.PUTS_MAX_ENTRIES).items) == mc0.PUTS_MAX_ENTRIES


@pytest.mark.parametrize("entries", [
    [("t", b"m", None)] * (COLUMNS_MIN - 1),  # small: nothing for the broker to lay out in bulk
    [("t", b"m", None)] * COLUMNS_MIN + [("t", b"h", {"X-k": "v"})],  # a header
    [("t", b"m", None)] * COLUMNS_MIN + [("u", b"other", None)],  # two topics
])
def test_other_batches_stay_msgpack_entries(entries: list[tuple[str, bytes, dict[str, str] | None]]) -> None:
    puts = puts_event(entries)
    assert isinstance(puts.items, list)
    assert len(puts.items) == len(entries)


# ------------------------------------------------------------------------------------------------ resubscribe


def test_resubscribe_with_nothing_subscribed_sends_nothing() -> None:
    assert ClientCore().resubscribe() == []


def subscribe(core: ClientCore, *topics: str, ok: bool = True, **options: object) -> bytes:
    """Send a SUB through the core the way both clients do, and feed it the broker's OK (unless ``ok`` is
    false); returns the command id."""
    command_id, _ = core.command(sub_event(topics, **options))  # type: ignore[arg-type]
    if ok:
        core.receive([b"", b"OK", b"ID", command_id], 0.0)
    return command_id


def deliver(core: ClientCore, topic: bytes, message_id: int) -> None:
    core.receive(mc0.encode(mc0.Message(topic, b"body", {}, message_id, 1)), 0.0)


def resubscribe_frames(core: ClientCore) -> list[tuple[dict[bytes, bytes], list[bytes]]]:
    """Each resubscribe SUB as (headers without ID, topics), checking the ID matches the returned one."""
    out = []
    for command_id, frames in core.resubscribe():
        verb, headers, positional = parse(frames)
        assert verb == b"SUB"
        assert headers.pop(b"ID") == command_id
        assert positional is not None
        assert isinstance(mc0.decode(frames), mc0.Sub)  # the codec accepts what the core builds
        out.append((headers, positional))
    return out


def test_resubscribe_sends_one_sub_with_every_topic_in_order() -> None:
    core = ClientCore()
    for topic in (b"b", b"a", b"collective agent"):
        core.subscriptions[topic] = Subscription()
    commands = core.resubscribe()
    assert len(commands) == 1
    command_id, frames = commands[0]
    verb, headers, positional = parse(frames)
    assert verb == b"SUB"
    assert headers == {b"ID": command_id}
    assert positional == [b"b", b"a", b"collective agent"]


def test_resubscribe_ids_do_not_repeat() -> None:
    core = ClientCore()
    core.subscriptions[b"a"] = Subscription()
    first = core.resubscribe()[0][0]
    second = core.resubscribe()[0][0]
    assert first != second


def test_resubscribe_resumes_each_topic_after_its_last_id() -> None:
    core = negotiated("batch", "ids")
    subscribe(core, "a", "b", "c")
    deliver(core, b"a", 5)
    batch = [mc0.MessageItem(b"c", 8, 1, b"x"), mc0.MessageItem(b"a", 6, 1, b"y"),
             mc0.MessageItem(b"c", 9, 1, b"z")]
    core.receive(mc0.encode(mc0.Messages(batch)), 0.0)
    assert resubscribe_frames(core) == [
        ({b"RESUME": b"7"}, [b"a"]),
        ({}, [b"b"]),  # nothing received: live again, as first asked
        ({b"RESUME": b"10"}, [b"c"]),
    ]


def test_resubscribe_keeps_replay_credit_and_acks_and_groups_equal_options() -> None:
    core = negotiated("batch", "ids")
    subscribe(core, "p", "q", replay="beginning", credit=10, explicit_acks=True)
    subscribe(core, "r", replay=5)
    subscribe(core, "s", replay="beginning", credit=10, explicit_acks=True)  # the same options as p and q
    subscribe(core, "live", credit=3)
    beginning = {b"REPLAY": b"beginning", b"CREDIT": b"10", b"ACKS": b"explicit"}
    assert resubscribe_frames(core) == [
        (beginning, [b"p", b"q", b"s"]),
        ({b"REPLAY": b"5"}, [b"r"]),
        ({b"CREDIT": b"3"}, [b"live"]),
    ]
    deliver(core, b"p", 3)
    deliver(core, b"r", 7)
    assert resubscribe_frames(core) == [
        ({b"RESUME": b"4", b"CREDIT": b"10", b"ACKS": b"explicit"}, [b"p"]),  # RESUME replaces REPLAY
        (beginning, [b"q", b"s"]),
        ({b"RESUME": b"8"}, [b"r"]),
        ({b"CREDIT": b"3"}, [b"live"]),
    ]


def test_resubscribe_events_carry_the_options() -> None:
    core = negotiated("ids")
    subscribe(core, "p", replay="current", credit=2, explicit_acks=True)
    deliver(core, b"p", 41)
    (_, frames), = core.resubscribe()
    event = mc0.decode(frames)
    assert isinstance(event, mc0.Sub)
    assert (event.topics, event.replay, event.resume, event.credit, event.explicit_acks) == (
        [b"p"], None, 42, 2, True)


def test_a_subscription_waiting_for_its_ok_is_restored_too() -> None:
    core = negotiated("ids")
    subscribe(core, "t", ok=False, replay=3)
    core.connect(1.0)  # the connection was lost before the OK
    assert resubscribe_frames(core) == [({b"REPLAY": b"3"}, [b"t"])]


def test_unsubscribe_forgets_the_topic_and_its_last_id() -> None:
    core = negotiated("ids")
    subscribe(core, "a", "b")
    deliver(core, b"a", 4)
    deliver(core, b"b", 6)
    core.command(mc0.Unsub([b"a"]))
    assert list(core.subscriptions) == [b"b"]
    assert core.last_ids == {"b": 6}
    assert resubscribe_frames(core) == [({b"RESUME": b"7"}, [b"b"])]


def test_subscribing_again_with_replay_starts_afresh() -> None:
    core = negotiated("ids")
    subscribe(core, "t")
    deliver(core, b"t", 9)
    subscribe(core, "t", replay="beginning")
    assert "t" not in core.last_ids
    assert resubscribe_frames(core) == [({b"REPLAY": b"beginning"}, [b"t"])]


def test_subscribing_again_without_replay_keeps_the_position_and_takes_the_new_options() -> None:
    core = negotiated("ids")
    subscribe(core, "t", replay=2)
    subscribe(core, "t", credit=5)  # only options change: the broker keeps the subscription's position
    assert core.subscriptions[b"t"] == Subscription(2, 5, False)
    deliver(core, b"t", 9)
    subscribe(core, "t", explicit_acks=True)
    assert core.last_ids == {"t": 9}
    assert resubscribe_frames(core) == [({b"RESUME": b"10", b"ACKS": b"explicit"}, [b"t"])]


def test_a_refused_sub_restores_what_its_topics_had() -> None:
    core = negotiated("ids")
    subscribe(core, "old", credit=4)
    deliver(core, b"old", 12)
    command_id = subscribe(core, "old", "new", ok=False, replay="beginning")
    assert core.subscriptions == {b"old": Subscription("beginning"), b"new": Subscription("beginning")}
    assert "old" not in core.last_ids
    messages, reply = core.receive([b"", b"ERROR", b"MESSAGE", b"transient", b"ID", command_id], 0.0)
    assert messages == []
    assert isinstance(reply, mc0.Error)  # still handed to the caller that waits for it
    assert core.subscriptions == {b"old": Subscription(None, 4, False)}
    assert core.last_ids == {"old": 12}
    assert resubscribe_frames(core) == [({b"RESUME": b"13", b"CREDIT": b"4"}, [b"old"])]


def test_a_refused_sub_keeps_ids_received_in_the_meantime() -> None:
    core = negotiated("ids")
    subscribe(core, "t")
    deliver(core, b"t", 3)
    command_id = subscribe(core, "t", ok=False, replay=1)
    deliver(core, b"t", 4)  # the old subscription still delivers until the broker answers
    core.receive([b"", b"ERROR", b"MESSAGE", b"no", b"ID", command_id], 0.0)
    assert core.last_ids == {"t": 4}


def test_an_error_to_another_command_leaves_subscriptions_alone() -> None:
    core = negotiated("ids")
    subscribe(core, "t")
    command_id, _ = core.command(mc0.Declare(b"t", {"delivery": "round-robin"}))
    core.receive([b"", b"ERROR", b"MESSAGE", b"conflict", b"ID", command_id], 0.0)
    assert core.subscriptions == {b"t": Subscription()}


def test_a_refused_resubscribe_after_a_reconnect_is_not_undone() -> None:
    core = negotiated("ids")
    command_id = subscribe(core, "t", ok=False)
    core.connect(1.0)
    core.receive([b"", b"ERROR", b"MESSAGE", b"late", b"ID", command_id], 1.0)
    assert list(core.subscriptions) == [b"t"]


def test_resubscribe_ignores_a_last_id_that_is_not_an_integer() -> None:
    core = negotiated("batch", "ids")
    subscribe(core, "t", replay="beginning")
    payload = msgpack.packb([[b"t", b"not an id", 1, b"body"]], use_bin_type=True)
    core.receive([b"", b"MESSAGES", b"", payload], 0.0)  # a broker bug: the message is still handed out
    assert resubscribe_frames(core) == [({b"REPLAY": b"beginning"}, [b"t"])]


# ------------------------------------------------------------------------------------------- last message ids


def test_message_records_the_last_id_per_topic() -> None:
    core = negotiated("ids")
    deliver(core, b"t", 7)
    deliver(core, b"u", 3)
    deliver(core, b"t", 8)
    assert core.last_ids == {"t": 8, "u": 3}


def test_a_message_without_id_records_nothing() -> None:
    core = negotiated()
    core.receive([b"", b"MESSAGE", b"TOPIC", b"t", b"", b"body"], 0.0)
    assert core.last_ids == {}


def test_batch_records_the_last_id_of_each_topic() -> None:
    core = negotiated("batch", "ids")
    items = [
        mc0.MessageItem(b"t", 1, 100, b"a"),
        mc0.MessageItem(b"u", 2, 101, b"b", {b"X-k": b"v"}),
        mc0.MessageItem(b"t", 3, 102, b"c", {b"X-k": b"v"}),
        mc0.MessageItem("ü".encode(), 9, 103, b"d"),
        mc0.MessageItem(b"t", 4, 104, b"e"),
    ]
    messages, _ = core.receive(mc0.encode(mc0.Messages(items)), 0.0)
    assert [m.id for m in messages] == [1, 2, 3, 9, 4]
    assert core.last_ids == {"t": 4, "u": 2, "ü": 9}


def test_batch_without_delimiter_records_the_last_ids() -> None:
    core = negotiated("batch", "ids")
    items = [mc0.MessageItem(b"t", 5, 1, b"a"), mc0.MessageItem(b"u", 6, 1, b"b"),
             mc0.MessageItem(b"t", 7, 1, b"c")]
    messages, _ = core.receive(mc0.encode(mc0.Messages(items), delimiter=False), 0.0)
    assert len(messages) == 3
    assert core.last_ids == {"t": 7, "u": 6}


def test_an_entry_that_fails_to_parse_is_not_seen() -> None:
    core = negotiated("batch", "ids")
    payload = msgpack.packb([[b"t", 1, 2, b"ok"], [b"t", 5, 2, b"bad", {"k": 1}], [b"t", 6, 2, b"x"]],
                           use_bin_type=True)
    messages, _ = core.receive([b"", b"MESSAGES", b"", payload], 0.0)
    assert [m.id for m in messages] == [1]
    assert core.last_ids == {"t": 1}


def test_a_map_entry_with_four_keys_is_not_a_message() -> None:
    core = negotiated("batch", "ids")
    payload = msgpack.packb([{b"t": 1, b"u": 2, b"v": 3, b"w": 4}], use_bin_type=True)
    assert core.receive([b"", b"MESSAGES", b"", payload], 0.0) == ([], None)
    assert core.last_ids == {}


def test_replies_and_noops_record_no_ids() -> None:
    core = negotiated("ids")
    core.receive([b"", b"OK", b"ID", b"1", b"MESSAGE-ID", b"12"], 0.0)
    core.receive([b"", b"NOOP"], 0.0)
    assert core.last_ids == {}


# ---------------------------------------------------------------------------------------- SUB options checks


def test_sub_event_carries_the_options() -> None:
    event = sub_event(["a", b"b"], "beginning", 3, True)
    assert (event.topics, event.replay, event.credit, event.explicit_acks) == (
        [b"a", b"b"], "beginning", 3, True)
    assert sub_event(["a"], 0).replay == 0
    assert sub_event(["a"], "current").replay == "current"
    plain = sub_event(["a"])
    assert (plain.replay, plain.resume, plain.credit, plain.explicit_acks) == (None, None, None, False)


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"replay": "start"}, ValueError),
        ({"replay": -1}, ValueError),
        ({"replay": True}, TypeError),
        ({"replay": 1.5}, TypeError),
        ({"credit": 0}, ValueError),
        ({"credit": "5"}, TypeError),
        ({"credit": False}, TypeError),
    ],
)
def test_sub_event_refuses_bad_options(options: dict[str, object], error: type[Exception]) -> None:
    with pytest.raises(error):
        sub_event(["t"], **options)  # type: ignore[arg-type]


def test_sub_event_needs_a_topic() -> None:
    with pytest.raises(ValueError, match="topic"):
        sub_event([])


# -------------------------------------------------------------------------------------------------------- ACK


def test_ack_target_of_a_message_and_of_a_topic() -> None:
    assert ack_target(Message("jobs", b"x", {}, 7, 1), ()) == (b"jobs", [7])
    assert ack_target("jobs", (3, 4)) == (b"jobs", [3, 4])
    assert ack_target(b"jobs", (0,)) == (b"jobs", [0])


def test_ack_target_refuses_what_cannot_be_acked() -> None:
    with pytest.raises(ConnectorError, match="no id"):
        ack_target(Message("jobs", b"x"), ())
    with pytest.raises(TypeError):
        ack_target(Message("jobs", b"x", {}, 7, 1), (8,))
    with pytest.raises(TypeError):
        ack_target("jobs", ())
    with pytest.raises(ValueError, match="at least 0"):
        ack_target("jobs", (-1,))
    with pytest.raises(TypeError):
        ack_target("jobs", ("3",))  # type: ignore[arg-type]


def test_pack_acks_gives_one_ack_per_topic_without_id() -> None:
    frame_sets = list(ClientCore.pack_acks({b"jobs": [3, 4, 9], b"mail": [1]}))
    assert [parse(frames) for frames in frame_sets] == [
        (b"ACK", {b"TOPIC": b"jobs"}, [b"3", b"4", b"9"]),
        (b"ACK", {b"TOPIC": b"mail"}, [b"1"]),
    ]
    assert mc0.decode(frame_sets[0]) == mc0.Ack(b"jobs", [3, 4, 9])


def test_pack_acks_bounds_the_ids_per_frame_set() -> None:
    ids = list(range(1, 2 * ACK_MAX_IDS + 2))
    frame_sets = list(ClientCore.pack_acks({b"jobs": ids}))
    assert len(frame_sets) == 3
    decoded = [mc0.decode(frames) for frames in frame_sets]
    assert all(isinstance(event, mc0.Ack) and len(event.message_ids) <= ACK_MAX_IDS for event in decoded)
    assert [i for event in decoded for i in event.message_ids] == ids  # type: ignore[union-attr]


# ---------------------------------------------------------------------------------------------------- DECLARE


def test_declare_event_sends_the_given_settings_as_text() -> None:
    event = declare_event("jobs", {
        "delivery": "round-robin", "persistence": "persistent", "sync": "weak", "max_backlog": None,
        "retention_bytes": 1 << 30, "retention_seconds": 3600.0, "segment_bytes": 4096,
    })
    assert event.topic == b"jobs"
    assert event.settings == {"delivery": "round-robin", "persistence": "persistent", "sync": "weak",
                              "retention_bytes": "1073741824", "retention_seconds": "3600",
                              "segment_bytes": "4096"}
    core = ClientCore()
    command_id, frames = core.command(event)
    verb, headers, positional = parse(frames)
    assert (verb, positional) == (b"DECLARE", [b"jobs"])
    assert headers == {b"DELIVERY": b"round-robin", b"PERSISTENCE": b"persistent", b"SYNC": b"weak",
                       b"RETENTION-BYTES": b"1073741824", b"RETENTION-SECONDS": b"3600",
                       b"SEGMENT-BYTES": b"4096", b"ID": command_id}
    assert mc0.decode(frames) == event


def test_declare_event_keeps_fractions_and_accepts_str_enums() -> None:
    from enum import StrEnum

    class Delivery(StrEnum):
        ROUND_ROBIN = "round-robin"

    event = declare_event(b"t", {"retention_seconds": 0.5, "delivery": Delivery.ROUND_ROBIN})
    assert event.settings == {"retention_seconds": "0.5", "delivery": "round-robin"}
    assert declare_event("t", {}).settings == {}


@pytest.mark.parametrize(
    ("settings", "error"),
    [
        ({"colour": "blue"}, TypeError),
        ({"max_backlog": True}, TypeError),
        ({"delivery": ["broadcast"]}, TypeError),
        ({"delivery": "bröadcast"}, ValueError),
        ({"delivery": ""}, ValueError),
    ],
)
def test_declare_event_refuses_bad_settings(settings: dict[str, object], error: type[Exception]) -> None:
    with pytest.raises(error):
        declare_event("t", settings)


def test_declare_event_needs_a_topic() -> None:
    with pytest.raises(ValueError, match="topic"):
        declare_event("", {})


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
    core.subscriptions[b"t"] = Subscription()
    messages, reply = core.receive(frames, 2.0)
    assert isinstance(messages, list)
    assert reply is None or isinstance(reply, mc0.Ok | mc0.Error)
    for message in messages:
        assert isinstance(message, Message)
    assert core.last_heard == 2.0  # anything at all from the broker proves it is alive
    for _, sub_frames in core.resubscribe():  # and garbage never breaks the restore of subscriptions
        assert isinstance(mc0.decode(sub_frames), mc0.Sub)


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
    for topic in core.last_ids:
        if topic:  # a broker bug may deliver an empty topic name, which nobody can have subscribed to
            core.subscriptions[to_bytes(topic)] = Subscription()
    for _, frames in core.resubscribe():
        assert isinstance(mc0.decode(frames), mc0.Sub)


# ------------------------------------------------------------------------------------------------- heartbeats


def test_noop_due_at_half_the_ttl_since_the_last_send() -> None:
    core = ClientCore(1000)
    core.connect(100.0)
    assert not core.noop_due(100.0)
    assert not core.noop_due(100.0 + 0.499)
    assert core.noop_due(100.0 + 0.5)
    core.sent(100.5)
    assert not core.noop_due(100.5 + 0.499)
    assert core.noop_due(100.5 + 0.501)


def test_hearing_from_the_broker_does_not_postpone_our_noop() -> None:
    core = ClientCore(1000)
    core.connect(0.0)
    core.receive([b"", b"NOOP"], 0.4)
    assert core.noop_due(0.51)


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
    assert core.next_timer(10.0) == pytest.approx(0.5)
    core.sent(10.8)
    assert core.next_timer(10.8) == pytest.approx(1.05 - 0.8)  # silence deadline at 11.05 comes first
    core.receive([b"", b"NOOP"], 10.9)
    assert core.next_timer(10.9) == pytest.approx(0.5 - 0.1)  # noop deadline at 11.3 now comes first
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
