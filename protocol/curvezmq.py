"""CurveZMQ (RFC 26), both sides: the CURVE handshake and the boxes every frame travels in after it, as
libzmq speaks them. Used by the broker's own ZMTP engine (:mod:`protocol.zmtp`, :mod:`broker.zmtp_door`: the
server) and by the native DEALER (:mod:`connector.zmtp_dealer`: the client) when CURVE is on.

The handshake, after the greetings (mechanism ``CURVE``):

* the client's HELLO carries its short-term public key C' and a box of 64 zero bytes from C' to the server's
  long-term key S, which proves it knows S;
* the server's WELCOME is a box to C' of its own short-term key S' and a cookie: C' and s' sealed with a
  key only the server knows, so it keeps no state per half-open connection in the protocol's design (this
  engine keeps the connection's object anyway);
* the client's INITIATE returns the cookie, and in a box from C' to S' its long-term key C, a vouch (a box
  from C to S' of C' and S: the owner of C stands behind C') and its metadata (``Socket-Type``, ``Identity``);
* the server's READY is a box of its metadata. The caller decides whether C is admitted before it is sent.

Then every frame is a MESSAGE: a box from one short-term key to the other of a flags octet (MORE, COMMAND) and
the frame, under a nonce that counts up from 1 on each side and may never go back.

Randomness comes in as an argument (``random(n)``): nothing here touches the operating system.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from nacl import bindings
from nacl.exceptions import CryptoError

from protocol.errors import ProtocolError

KEY_SIZE = 32
HELLO_SIZE = 200
INITIATE_MIN_SIZE = 257
MORE = 0x01
COMMAND = 0x02
_NONCE = struct.Struct(">Q")


class CurveError(ProtocolError):
    """The peer broke CurveZMQ (a malformed command, a box that does not open, a nonce that went back)."""


@dataclass(frozen=True, slots=True)
class Initiated:
    """The client's INITIATE, checked: its long-term key (32 bytes) and its metadata (names lower-cased)."""

    client_key: bytes
    metadata: bytes


def _open(box: bytes, nonce: bytes, public: bytes, secret: bytes, what: str) -> bytes:
    try:
        return bindings.crypto_box_open(box, nonce, public, secret)  # type: ignore[no-any-return]
    except CryptoError:
        raise CurveError(f"the {what} box does not open (a wrong server key?)") from None


class _Boxes:
    """What both sides share after the handshake: the nonces (ours count up from 1, the peer's may never go
    back) and the MESSAGE boxes, each side's under its own nonce prefix."""

    #: The nonce prefixes of the MESSAGEs this side sends and receives.
    SEND_PREFIX = b""
    RECEIVE_PREFIX = b""

    def __init__(self) -> None:
        self._short_public, self._short_secret = bindings.crypto_box_keypair()
        self._shared = b""  # crypto_box_beforenm of the two short-term keys: every box after the handshake
        self._next_nonce = 1  # ours, for the handshake's commands and the MESSAGEs
        self._peer_nonce = 0  # the last the peer used

    def _peer(self, nonce: bytes) -> None:
        (value,) = _NONCE.unpack(nonce)
        if value <= self._peer_nonce:
            raise CurveError("a CURVE nonce went back (a replayed or reordered command)")
        self._peer_nonce = value

    def _nonce(self) -> bytes:
        value = self._next_nonce
        self._next_nonce += 1
        return _NONCE.pack(value)

    def seal(self, frames: Sequence[bytes | memoryview], command: bool = False) -> list[bytes]:
        """Each frame as the body of a MESSAGE (the ZMTP frames to send, one per frame)."""
        sealed = []
        last = len(frames) - 1
        shared = self._shared
        prefix = self.SEND_PREFIX
        for index, frame in enumerate(frames):
            nonce = self._nonce()
            flags = (MORE if index < last else 0) | (COMMAND if command else 0)
            sealed.append(b"\x07MESSAGE" + nonce + bindings.crypto_box_afternm(
                bytes((flags,)) + bytes(frame), prefix + nonce, shared))
        return sealed

    def unseal(self, message: bytes) -> tuple[int, bytes]:
        """A MESSAGE from the peer: its flags (MORE, COMMAND) and its frame."""
        if message[:8] != b"\x07MESSAGE" or len(message) < 8 + 8 + 16 + 1:
            raise CurveError("a malformed CURVE MESSAGE")
        nonce = message[8:16]
        self._peer(nonce)
        try:
            plain = bindings.crypto_box_open_afternm(message[16:], self.RECEIVE_PREFIX + nonce, self._shared)
        except CryptoError:
            raise CurveError("a CURVE MESSAGE box does not open") from None
        return plain[0], plain[1:]


class CurveServer(_Boxes):
    """One connection's CurveZMQ state on the server's side: :meth:`welcome` answers HELLO, :meth:`initiate`
    checks INITIATE, :meth:`ready` builds READY, then :meth:`seal` and :meth:`unseal` carry the frames."""

    SEND_PREFIX = b"CurveZMQMESSAGES"
    RECEIVE_PREFIX = b"CurveZMQMESSAGEC"

    def __init__(self, public: bytes, secret: bytes, random: Callable[[int], bytes]) -> None:
        if len(public) != KEY_SIZE or len(secret) != KEY_SIZE:
            raise ValueError("CURVE keys are 32 bytes")
        super().__init__()
        self.public = public
        self.secret = secret
        self.random = random
        self._client_short = b""
        self._cookie_key = b""

    def welcome(self, hello: bytes) -> bytes:
        """The WELCOME command's body for the client's HELLO (``hello``: the command, name included)."""
        if hello[:6] != b"\x05HELLO":
            raise CurveError("the CURVE handshake did not start with HELLO")
        if len(hello) != HELLO_SIZE or hello[6:8] != b"\x01\x00":
            raise CurveError("a malformed CURVE HELLO")
        self._client_short = hello[80:112]
        nonce = hello[112:120]
        self._peer(nonce)
        _open(hello[120:200], b"CurveZMQHELLO---" + nonce, self._client_short, self.secret, "HELLO")
        self._cookie_key = self.random(32)
        cookie_nonce = self.random(16)
        cookie = bindings.crypto_secretbox(self._client_short + self._short_secret,
                                           b"COOKIE--" + cookie_nonce, self._cookie_key)
        welcome_nonce = self.random(16)
        box = bindings.crypto_box(self._short_public + cookie_nonce + cookie, b"WELCOME-" + welcome_nonce,
                                  self._client_short, self.secret)
        return b"\x07WELCOME" + welcome_nonce + box

    def initiate(self, initiate: bytes) -> Initiated:
        """Check the client's INITIATE: the cookie is ours, the box opens, the vouch binds its long-term key
        to its short-term one. Whether that key is admitted is the caller's to decide."""
        if initiate[:9] != b"\x08INITIATE":
            raise CurveError("a CURVE command other than INITIATE after WELCOME")
        if len(initiate) < INITIATE_MIN_SIZE or not self._cookie_key:
            raise CurveError("a malformed CURVE INITIATE")
        try:
            cookie = bindings.crypto_secretbox_open(initiate[25:105], b"COOKIE--" + initiate[9:25],
                                                    self._cookie_key)
        except CryptoError:
            raise CurveError("the CURVE cookie is not this server's") from None
        if cookie != self._client_short + self._short_secret:
            raise CurveError("the CURVE cookie is not this connection's")
        nonce = initiate[105:113]
        self._peer(nonce)
        plain = _open(initiate[113:], b"CurveZMQINITIATE" + nonce, self._client_short, self._short_secret,
                      "INITIATE")
        client_key = plain[:32]
        vouch = _open(plain[48:128], b"VOUCH---" + plain[32:48], client_key, self._short_secret, "vouch")
        if vouch != self._client_short + self.public:
            raise CurveError("the CURVE vouch does not name this connection's key and this server's")
        self._shared = bindings.crypto_box_beforenm(self._client_short, self._short_secret)
        self._cookie_key = b""  # one INITIATE per cookie
        return Initiated(client_key, plain[128:])

    def ready(self, metadata: bytes) -> bytes:
        """The READY command's body: our metadata, boxed."""
        nonce = self._nonce()
        return b"\x05READY" + nonce + bindings.crypto_box_afternm(metadata, b"CurveZMQREADY---" + nonce,
                                                                   self._shared)


class CurveClient(_Boxes):
    """One connection's CurveZMQ state on the client's side, as libzmq's ``curve_client`` builds it:
    :meth:`hello` starts, :meth:`initiate` answers the server's WELCOME (with this side's metadata),
    :meth:`ready` opens the server's READY (its metadata), then :meth:`seal` and :meth:`unseal` carry the
    frames. ``server_key`` is the server's long-term public key, which the client must know beforehand."""

    SEND_PREFIX = b"CurveZMQMESSAGEC"
    RECEIVE_PREFIX = b"CurveZMQMESSAGES"

    def __init__(self, server_key: bytes, public: bytes, secret: bytes, random: Callable[[int], bytes],
                 metadata: bytes) -> None:
        if len(server_key) != KEY_SIZE or len(public) != KEY_SIZE or len(secret) != KEY_SIZE:
            raise ValueError("CURVE keys are 32 bytes")
        super().__init__()
        self.server_key = server_key
        self.public = public
        self.secret = secret
        self.random = random
        self.metadata = metadata

    def hello(self) -> bytes:
        """The HELLO command's body: our short-term key, and a box of zeros to the server's key (proof that
        we know it)."""
        nonce = self._nonce()
        box = bindings.crypto_box(bytes(64), b"CurveZMQHELLO---" + nonce, self.server_key, self._short_secret)
        return b"\x05HELLO\x01\x00" + bytes(72) + self._short_public + nonce + box

    def initiate(self, welcome: bytes) -> bytes:
        """The INITIATE command's body for the server's WELCOME: its cookie back, our long-term key, the
        vouch binding it to our short-term key, and our metadata."""
        if welcome[:8] != b"\x07WELCOME" or len(welcome) != 8 + 16 + 16 + 128:
            raise CurveError("a malformed CURVE WELCOME (or another command where WELCOME belongs)")
        plain = _open(welcome[24:], b"WELCOME-" + welcome[8:24], self.server_key, self._short_secret,
                      "WELCOME")
        server_short, cookie = plain[:32], plain[32:]
        vouch_nonce = self.random(16)
        vouch = bindings.crypto_box(self._short_public + self.server_key, b"VOUCH---" + vouch_nonce,
                                    server_short, self.secret)
        nonce = self._nonce()
        box = bindings.crypto_box(self.public + vouch_nonce + vouch + self.metadata,
                                  b"CurveZMQINITIATE" + nonce, server_short, self._short_secret)
        self._shared = bindings.crypto_box_beforenm(server_short, self._short_secret)
        return b"\x08INITIATE" + cookie + nonce + box

    def ready(self, ready: bytes) -> bytes:
        """The server's metadata, out of its READY command."""
        if ready[:6] != b"\x05READY" or len(ready) < 6 + 8 + 16 or not self._shared:
            raise CurveError("a malformed CURVE READY (or another command where READY belongs)")
        nonce = ready[6:14]
        self._peer(nonce)
        try:
            return bindings.crypto_box_open_afternm(  # type: ignore[no-any-return]
                ready[14:], b"CurveZMQREADY---" + nonce, self._shared)
        except CryptoError:
            raise CurveError("the CURVE READY box does not open") from None
