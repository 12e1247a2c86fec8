"""protocol/zmtp.py: ZMTP 3 greetings, READY, frames and commands, fed in pieces and whole."""

from __future__ import annotations

import struct

import pytest

from protocol import zmtp

PEER_GREETING = (b"\xff" + bytes(8) + b"\x7f" + b"\x03\x01" + b"NULL".ljust(20, b"\0") + b"\x00" + bytes(31))


def ready(socket_type: bytes = b"DEALER", **extra: bytes) -> bytes:
    values = {b"Socket-Type": socket_type, **{name.encode(): value for name, value in extra.items()}}
    return zmtp.command(b"READY", zmtp.properties(values))


def wire(frames: list[bytes]) -> bytes:
    return b"".join(bytes(piece) for piece in zmtp.message(frames))


def handshaken(reader: zmtp.Reader) -> None:
    events = reader.feed(PEER_GREETING + ready())
    assert events == [b"greeting", zmtp.Ready(b"DEALER", b"")]


def test_our_greeting_is_zmtp_3_null_as_server() -> None:
    greeting = zmtp.GREETING
    assert len(greeting) == zmtp.GREETING_SIZE == 64
    assert (greeting[0], greeting[9]) == (0xFF, 0x7F)
    assert greeting[10:12] == b"\x03\x00"
    assert greeting[12:32].rstrip(b"\0") == b"NULL"
    assert greeting[32] == 1


def test_handshake_then_a_message_of_three_frames() -> None:
    reader = zmtp.Reader(max_frame=1 << 20)
    handshaken(reader)
    assert reader.feed(wire([b"", b"PUT", b"x" * 300])) == [[b"", b"PUT", b"x" * 300]]


def test_any_split_of_the_bytes_gives_the_same_events() -> None:
    stream = PEER_GREETING + ready(Identity=b"me") + wire([b"a", b"b" * 1000])
    stream += zmtp.command(b"PING", b"\x00\x0aab") + wire([b"c"])
    whole = zmtp.Reader(max_frame=1 << 20).feed(stream)
    assert whole == [b"greeting", zmtp.Ready(b"DEALER", b"me"), [b"a", b"b" * 1000], zmtp.Ping(b"ab"), [b"c"]]
    for size in (1, 2, 7, 63, 64, 65, 500):
        reader = zmtp.Reader(max_frame=1 << 20)
        events: list[object] = []
        for start in range(0, len(stream), size):
            events += reader.feed(stream[start:start + size])
        assert events == whole, size


def test_long_frames_use_eight_octet_sizes_both_ways() -> None:
    body = bytes(range(256)) * 2
    pieces = zmtp.message([body])
    assert pieces[0] == b"\x02" + struct.pack(">Q", len(body))
    assert zmtp.message([b"x" * 255])[0] == b"\x00\xff"
    assert zmtp.message([b"a", b"b"])[0] == b"\x01\x01"
    reader = zmtp.Reader(max_frame=1 << 20)
    handshaken(reader)
    assert reader.feed(wire([body, b"tail"])) == [[body, b"tail"]]


def test_ping_is_answered_with_its_context_and_pong_is_ignored() -> None:
    reader = zmtp.Reader(max_frame=100)
    handshaken(reader)
    context = b"0123456789abcdef"
    assert reader.feed(zmtp.command(b"PING", b"\x00\x64" + context)) == [zmtp.Ping(context)]
    assert zmtp.pong(context) == zmtp.command(b"PONG", context)
    assert reader.feed(zmtp.command(b"PONG", b"")) == []


def test_properties_round_trip_and_names_are_case_insensitive() -> None:
    data = zmtp.properties({b"Socket-Type": b"DEALER", b"IDENTITY": b"\x01\x02"})
    assert zmtp.parse_properties(data) == {b"socket-type": b"DEALER", b"identity": b"\x01\x02"}
    with pytest.raises(zmtp.ZmtpError, match="cut short"):
        zmtp.parse_properties(data[:-1])


@pytest.mark.parametrize(("data", "reason"), [
    (b"GET / HTTP/1.1\r\n", "no ZMTP signature"),
    (b"\xff" + bytes(8) + b"\x7e" + bytes(54), "no ZMTP signature"),
    (b"\xff" + bytes(8) + b"\x7f" + b"\x02\x00" + bytes(52), "ZMTP 2.x"),
    (b"\xff" + bytes(8) + b"\x7f" + b"\x03\x00" + b"CURVE".ljust(20, b"\0") + bytes(32), "'CURVE'"),
])
def test_bad_greetings_are_refused(data: bytes, reason: str) -> None:
    with pytest.raises(zmtp.ZmtpError, match=reason):
        zmtp.Reader(max_frame=100).feed(data)


def test_a_message_before_ready_is_refused() -> None:
    with pytest.raises(zmtp.ZmtpError, match="before the handshake"):
        zmtp.Reader(max_frame=100).feed(PEER_GREETING + wire([b"PUT"]))


def test_a_socket_type_a_router_cannot_talk_to_is_refused() -> None:
    with pytest.raises(zmtp.ZmtpError, match="SUB cannot talk to a ROUTER"):
        zmtp.Reader(max_frame=100).feed(PEER_GREETING + ready(b"SUB"))


def test_a_peer_error_during_the_handshake_says_why() -> None:
    reason = b"no thanks"
    with pytest.raises(zmtp.ZmtpError, match="refused the handshake: no thanks"):
        zmtp.Reader(max_frame=100).feed(PEER_GREETING + zmtp.command(b"ERROR", bytes((9,)) + reason))


def test_a_frame_over_the_limit_is_refused_from_its_head() -> None:
    reader = zmtp.Reader(max_frame=1000)
    handshaken(reader)
    # Only the head has arrived: the size alone refuses it, before a byte of the body is held.
    with pytest.raises(zmtp.ZmtpError, match="a frame of 1001 bytes"):
        reader.feed(b"\x02" + struct.pack(">Q", 1001))


def test_too_many_frames_in_one_message_are_refused() -> None:
    reader = zmtp.Reader(max_frame=100, max_parts=4)
    handshaken(reader)
    assert reader.feed(wire([b"a"] * 4)) == [[b"a"] * 4]
    with pytest.raises(zmtp.ZmtpError, match="more than 4 frames"):
        reader.feed(wire([b"a"] * 5))


def test_a_message_may_have_many_small_frames_but_not_unbounded_bytes() -> None:
    reader = zmtp.Reader(max_frame=100_000)
    handshaken(reader)
    topics = [b"SUB", b""] + [b"topic.%d" % index for index in range(5_000)]
    assert reader.feed(wire(topics)) == [topics]
    reader = zmtp.Reader(max_frame=1000)
    handshaken(reader)
    with pytest.raises(zmtp.ZmtpError, match="a message of more than 2000 bytes"):
        reader.feed(wire([b"x" * 1000] * 4))


def test_unknown_commands_are_refused() -> None:
    reader = zmtp.Reader(max_frame=100)
    handshaken(reader)
    with pytest.raises(zmtp.ZmtpError, match="unknown command 'HELLO'"):
        reader.feed(zmtp.command(b"HELLO", b""))


def test_our_error_command_carries_the_reason_cut_to_255_bytes() -> None:
    with pytest.raises(zmtp.ZmtpError) as refused:
        zmtp.Reader(max_frame=1000).feed(PEER_GREETING + zmtp.error("x" * 300))
    assert str(refused.value) == "the peer refused the handshake: " + "x" * 255
