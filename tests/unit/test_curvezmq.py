"""protocol/curvezmq.py against a CurveZMQ client written here from RFC 26 (the integration tests run
libzmq's)."""

from __future__ import annotations

import os
import struct

import pytest
from nacl import bindings

from protocol import curvezmq, zmtp


class Client:
    """The client's side of RFC 26, as libzmq builds it."""

    def __init__(self, server_public: bytes) -> None:
        self.server_public = server_public
        self.public, self.secret = bindings.crypto_box_keypair()
        self.short_public, self.short_secret = bindings.crypto_box_keypair()
        self.nonce = 0
        self.shared = b""

    def next_nonce(self) -> bytes:
        self.nonce += 1
        return struct.pack(">Q", self.nonce)

    def hello(self) -> bytes:
        nonce = self.next_nonce()
        box = bindings.crypto_box(bytes(64), b"CurveZMQHELLO---" + nonce, self.server_public,
                                  self.short_secret)
        return b"\x05HELLO\x01\x00" + bytes(72) + self.short_public + nonce + box

    def initiate(self, welcome: bytes, metadata: bytes, server_short: bytes | None = None) -> bytes:
        plain = bindings.crypto_box_open(welcome[24:], b"WELCOME-" + welcome[8:24], self.server_public,
                                         self.short_secret)
        server_short = server_short or plain[:32]
        cookie = plain[32:128]
        vouch_nonce = os.urandom(16)
        vouch = bindings.crypto_box(self.short_public + self.server_public, b"VOUCH---" + vouch_nonce,
                                    server_short, self.secret)
        nonce = self.next_nonce()
        box = bindings.crypto_box(self.public + vouch_nonce + vouch + metadata, b"CurveZMQINITIATE" + nonce,
                                  server_short, self.short_secret)
        self.shared = bindings.crypto_box_beforenm(server_short, self.short_secret)
        return b"\x08INITIATE" + cookie + nonce + box

    def message(self, flags: int, frame: bytes, nonce: bytes | None = None) -> bytes:
        nonce = nonce or self.next_nonce()
        return b"\x07MESSAGE" + nonce + bindings.crypto_box_afternm(
            bytes((flags,)) + frame, b"CurveZMQMESSAGEC" + nonce, self.shared)

    def open(self, message: bytes, prefix: bytes) -> bytes:
        return bindings.crypto_box_open_afternm(message[16:], prefix + message[8:16], self.shared)


METADATA = zmtp.properties({b"Socket-Type": b"DEALER", b"Identity": b""})


@pytest.fixture
def pair() -> tuple[curvezmq.CurveServer, Client]:
    public, secret = bindings.crypto_box_keypair()
    return curvezmq.CurveServer(public, secret, random=os.urandom), Client(public)


def handshake(server: curvezmq.CurveServer, client: Client) -> curvezmq.Initiated:
    welcome = server.welcome(client.hello())
    assert welcome[:8] == b"\x07WELCOME"
    assert len(welcome) == 168
    return server.initiate(client.initiate(welcome, METADATA))


def test_a_handshake_gives_the_client_key_and_metadata(pair) -> None:  # type: ignore[no-untyped-def]
    server, client = pair
    initiated = handshake(server, client)
    assert initiated.client_key == client.public
    assert zmtp.parse_properties(initiated.metadata)[b"socket-type"] == b"DEALER"
    ready = server.ready(zmtp.ROUTER_METADATA)
    assert ready[:6] == b"\x05READY"
    assert client.open(b"\x07MESSAGE" + ready[6:], b"CurveZMQREADY---") == zmtp.ROUTER_METADATA


def test_frames_cross_both_ways_with_their_flags(pair) -> None:  # type: ignore[no-untyped-def]
    server, client = pair
    handshake(server, client)
    server.ready(zmtp.ROUTER_METADATA)
    assert server.unseal(client.message(curvezmq.MORE, b"first")) == (curvezmq.MORE, b"first")
    assert server.unseal(client.message(0, b"x" * 100_000)) == (0, b"x" * 100_000)
    sealed = server.seal([b"a", b"b"])
    assert [client.open(box, b"CurveZMQMESSAGES") for box in sealed] == [b"\x01a", b"\x00b"]
    assert client.open(server.seal([b"\x04PONG"], command=True)[0], b"CurveZMQMESSAGES") == b"\x02\x04PONG"


def test_a_replayed_message_is_refused(pair) -> None:  # type: ignore[no-untyped-def]
    server, client = pair
    handshake(server, client)
    message = client.message(0, b"once")
    server.unseal(message)
    with pytest.raises(curvezmq.CurveError, match="nonce went back"):
        server.unseal(message)


def test_a_tampered_message_is_refused(pair) -> None:  # type: ignore[no-untyped-def]
    server, client = pair
    handshake(server, client)
    message = bytearray(client.message(0, b"body"))
    message[-1] ^= 1
    with pytest.raises(curvezmq.CurveError, match="does not open"):
        server.unseal(bytes(message))


def test_a_client_pinned_to_another_server_key_is_refused_at_hello() -> None:
    public, secret = bindings.crypto_box_keypair()
    other, _ = bindings.crypto_box_keypair()
    server = curvezmq.CurveServer(public, secret, random=os.urandom)
    with pytest.raises(curvezmq.CurveError, match="HELLO box does not open"):
        server.welcome(Client(other).hello())


def test_a_cookie_from_another_connection_is_refused(pair) -> None:  # type: ignore[no-untyped-def]
    server, client = pair
    welcome = server.welcome(client.hello())
    other = curvezmq.CurveServer(server.public, server.secret, random=os.urandom)
    other.welcome(Client(server.public).hello())
    with pytest.raises(curvezmq.CurveError, match="cookie"):
        other.initiate(client.initiate(welcome, METADATA))


def test_a_vouch_for_another_short_term_key_is_refused(pair) -> None:  # type: ignore[no-untyped-def]
    server, client = pair
    welcome = server.welcome(client.hello())
    real_short = client.short_public
    client.short_public = bindings.crypto_box_keypair()[0]  # the vouch names a key this connection is not
    initiate = client.initiate(welcome, METADATA)
    client.short_public = real_short
    with pytest.raises(curvezmq.CurveError, match="vouch"):
        server.initiate(initiate)


def test_malformed_commands_are_refused(pair) -> None:  # type: ignore[no-untyped-def]
    server, client = pair
    with pytest.raises(curvezmq.CurveError, match="did not start with HELLO"):
        server.welcome(b"\x05READY" + bytes(194))
    with pytest.raises(curvezmq.CurveError, match="malformed CURVE HELLO"):
        server.welcome(client.hello()[:-1])
    with pytest.raises(curvezmq.CurveError, match="malformed CURVE INITIATE"):
        server.initiate(b"\x08INITIATE" + bytes(300))  # no WELCOME was sent: no cookie key


def test_the_reader_runs_the_curve_handshake_and_unboxes_frames(pair) -> None:  # type: ignore[no-untyped-def]
    server, client = pair
    reader = zmtp.Reader(max_frame=1 << 20, curve=server)
    greeting = zmtp.greeting(b"CURVE")[:32] + b"\x00" + bytes(31)
    events = reader.feed(greeting + zmtp.command_frame(client.hello()))
    assert events[0] == b"greeting"
    reply = events[1]
    assert isinstance(reply, zmtp.Reply)
    welcome = reply.data[2:]  # the command frame's head: flags and a one-octet size
    initiate = client.initiate(welcome, METADATA)
    assert reader.feed(zmtp.command_frame(initiate)) == [zmtp.Ready(b"DEALER", b"", client.public)]
    boxes = [client.message(curvezmq.MORE, b""), client.message(0, b"PUT"),
             client.message(curvezmq.COMMAND, b"\x04PING\x00\x0actx")]
    data = b"".join(zmtp.frame_head(len(box), False) + box for box in boxes)
    assert reader.feed(data) == [[b"", b"PUT"], zmtp.Ping(b"ctx")]


def test_a_null_client_on_a_curve_port_is_told_why() -> None:
    public, secret = bindings.crypto_box_keypair()
    reader = zmtp.Reader(max_frame=100, curve=curvezmq.CurveServer(public, secret, random=os.urandom))
    with pytest.raises(zmtp.ZmtpError, match="'NULL' where this port has CURVE"):
        reader.feed(zmtp.greeting(b"NULL"))
