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


# ------------------------------------------------------------------------------------ the client's side


def client_for(server_public: bytes) -> curvezmq.CurveClient:
    public, secret = bindings.crypto_box_keypair()
    return curvezmq.CurveClient(server_public, public, secret, os.urandom, zmtp.DEALER_METADATA)


def wire(server: curvezmq.CurveServer, client: curvezmq.CurveClient) -> tuple[zmtp.Reader, zmtp.Reader]:
    """Both sides' readers after a whole handshake through the readers and writers, as the two engines run
    it: the client's greeting and HELLO, the server's WELCOME, the client's INITIATE, the server's READY."""
    server_reader = zmtp.Reader(max_frame=1 << 20, curve=server)
    client_reader = zmtp.Reader(max_frame=1 << 20, curve=client, socket_type=b"DEALER")
    server_writer = zmtp.Writer(server)
    client_writer = zmtp.Writer(client, socket_type=b"DEALER")
    assert client_reader.feed(server_writer.greeting()) == [b"greeting"]
    events = server_reader.feed(client_writer.greeting() + client_writer.hello())
    assert events[0] == b"greeting"
    (initiate,) = client_reader.feed(events[1].data)  # the WELCOME
    assert isinstance(initiate, zmtp.Reply)
    (ready,) = server_reader.feed(initiate.data)
    assert ready == zmtp.Ready(b"DEALER", b"", client.public)
    assert client_reader.feed(server_writer.ready()) == [zmtp.Ready(b"ROUTER", b"", None)]
    return server_reader, client_reader


def test_our_client_and_our_server_shake_hands_and_carry_frames_both_ways() -> None:
    public, secret = bindings.crypto_box_keypair()
    server = curvezmq.CurveServer(public, secret, random=os.urandom)
    client = client_for(public)
    server_reader, client_reader = wire(server, client)
    to_server = b"".join(zmtp.Writer(client, socket_type=b"DEALER").message([b"FETCH", b"x" * 70_000]))
    assert server_reader.feed(to_server) == [[b"FETCH", b"x" * 70_000]]
    to_client = b"".join(bytes(piece) for piece in zmtp.Writer(server).message([b"OK", b"ID", b"7"]))
    assert client_reader.feed(to_client) == [[b"OK", b"ID", b"7"]]


def test_the_client_refuses_a_welcome_from_another_server_key() -> None:
    public, _ = bindings.crypto_box_keypair()
    impostor_public, impostor_secret = bindings.crypto_box_keypair()
    client = client_for(public)  # pinned to the real server's key
    impostor = curvezmq.CurveServer(impostor_public, impostor_secret, random=os.urandom)
    hello = client.hello()
    with pytest.raises(curvezmq.CurveError, match="HELLO box does not open"):
        impostor.welcome(hello)  # the impostor cannot even read the HELLO
    # Nor can a WELCOME made with the impostor's key pass for the real server's.
    forged = b"\x07WELCOME" + bytes(16) + bindings.crypto_box(bytes(128), b"WELCOME-" + bytes(16),
                                                              client._short_public, impostor_secret)
    with pytest.raises(curvezmq.CurveError, match="WELCOME box does not open"):
        client.initiate(forged)


def test_the_client_refuses_malformed_and_replayed_commands_from_the_server() -> None:
    public, secret = bindings.crypto_box_keypair()
    server = curvezmq.CurveServer(public, secret, random=os.urandom)
    client = client_for(public)
    with pytest.raises(curvezmq.CurveError, match="malformed CURVE WELCOME"):
        client.initiate(b"\x05READY" + bytes(40))
    server.initiate(client.initiate(server.welcome(client.hello())))
    ready = server.ready(zmtp.ROUTER_METADATA)
    tampered = ready[:-1] + bytes((ready[-1] ^ 1,))
    with pytest.raises(curvezmq.CurveError, match="READY box does not open"):
        client.ready(tampered)
    assert client.ready(server.ready(zmtp.ROUTER_METADATA)) == zmtp.ROUTER_METADATA
    (message,) = server.seal([b"once"])
    assert client.unseal(message) == (0, b"once")
    with pytest.raises(curvezmq.CurveError, match="nonce went back"):
        client.unseal(message)


def test_a_dealer_reader_refuses_a_peer_it_cannot_talk_to() -> None:
    reader = zmtp.Reader(max_frame=100, socket_type=b"DEALER")
    reader.feed(zmtp.greeting(b"NULL"))
    with pytest.raises(zmtp.ZmtpError, match="a PUB cannot talk to a DEALER"):
        reader.feed(zmtp.command(b"READY", zmtp.properties({b"Socket-Type": b"PUB"})))
    assert zmtp.Writer(socket_type=b"DEALER").greeting()[32] == 0  # as-server clear: we are the client
