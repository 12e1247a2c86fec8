"""What a client's ZeroMQ socket events say about its connection to the broker, without I/O.

libzmq reports each step of a connection on a monitor socket: a TCP connect refused and retried, a handshake
that failed and why, a handshake that succeeded, a connection lost. :class:`ConnectionWatch` turns that stream
into what a person needs to hear, within a second where libzmq tells us:

* nothing is listening at the address (connects refused for ``REFUSED_FOR`` seconds);
* the broker refused this client's CURVE key (a ZAP refusal: the key is not on the broker's allow-list);
* CURVE on one side only (a ZMTP mechanism mismatch);
* something accepted the TCP connection but completes no handshake (a frozen or hung broker, whose kernel
  accepts for it): said when the client's timeout runs out, or after ``STALLED_FOR`` for a client with other
  members of a cluster to try;
* the handshake fails without a reason, repeatedly. libzmq then cannot tell us more (the broker closed the
  connection before saying why), so the client asks the broker itself: it opens a plain TCP connection and
  reads the mechanism in the broker's ZMTP greeting (:data:`GREETING_OPENING`, :func:`greeting_mechanism`).
  CURVE on both sides means the broker does not hold the secret key of the ``broker.key`` this client pins
  (a wrong or outdated key file); CURVE on one side only is told as such (libzmq reports that case as a
  mismatch only some of the time, depending on which side closes first);

and, once connected, that the connection came back after being lost (a broker restart): the client must then
CONNECT and subscribe again at once, because the broker on the other end does not know it.

Both clients feed it the events of their socket's monitor (:meth:`ConnectionWatch.event`) and ask it on their
timer (:meth:`ConnectionWatch.check`). Time is an argument.
"""

from __future__ import annotations

from dataclasses import dataclass

import zmq

from connector import keys

#: Refused connects for this long mean nothing is listening (a broker that is starting answers sooner).
REFUSED_FOR = 1.0
#: The same for a client that knows other members of a cluster that have not refused it lately: one refused
#: connect is enough to try the next (a killed leader's port refuses at once; a broker restarting in place
#: is tried again once the others have been).
REFUSED_FOR_MOVING = 0.0
#: A client that knows other members of a cluster passes over one that accepted the TCP connection but has not
#: completed the ZMTP handshake within this many seconds: a frozen or hung broker's kernel accepts connections
#: for it, and nothing else would tell the client (libzmq gives a handshake 30 s). A broker completes one in
#: milliseconds, a loaded one within a few hundred.
STALLED_FOR = 2.0
#: How often a client not connected asks :meth:`ConnectionWatch.check` (seconds).
CHECK_EVERY = 0.25
#: Handshakes failing without a reason this many times in a row before the client asks the broker what it
#: speaks (libzmq retries within 20 to 200 ms).
NO_DETAIL_TIMES = 3
#: What a client sends to read a ZMTP 3 peer's greeting: the signature and the major version. A broker answers
#: with its whole 64-byte greeting, whose bytes 12 to 31 name its security mechanism (ZMTP 3.1, RFC 37).
GREETING_OPENING = b"\xff" + b"\x00" * 8 + b"\x7f" + b"\x03"
GREETING_SIZE = 64

#: What each verdict says.
NOTHING_LISTENING = "nothing is listening at {endpoint}: start the broker (mc0 broker), or check the address"
REFUSED_KEY = ("the broker at {endpoint} refused this client's key {key} (ZAP status {status}): admit it "
               "on the broker with `{admit}`")
BROKER_WITHOUT_CURVE = ("the broker at {endpoint} does not speak CURVE (it runs with --no-curve): connect "
                        "without keys (--no-curve, curve=False), or turn CURVE on at the broker")
BROKER_WITH_CURVE = ("the broker at {endpoint} requires CURVE: give this client the keys folder holding "
                     "broker.key and a client certificate the broker admits (--keys, keys=...)")
WRONG_BROKER_KEY = ("the broker at {endpoint} does not complete the CURVE handshake: the broker.key this "
                    "client pins is most likely not that broker's key (was it given new keys?): copy its "
                    "current broker.key here")
STALLED = ("the broker at {endpoint} accepted the connection but has not completed the handshake within "
           "{seconds:g}s: it may be frozen, hung or overloaded")
NO_HANDSHAKE = ("the broker at {endpoint} does not complete the handshake: is it an mc0 broker, with the "
                "same CURVE setting as this client?")
MISMATCH = zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH

#: The events a client's monitor watches.
EVENTS = (zmq.EVENT_CONNECTED | zmq.EVENT_CONNECT_RETRIED | zmq.EVENT_DISCONNECTED
          | zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
          | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)


@dataclass(slots=True)
class Reconnected:
    """The connection came back after it was lost: CONNECT and subscribe again now."""


@dataclass(slots=True)
class AskMechanism:
    """libzmq cannot say why the handshake fails: read the broker's mechanism, then ask
    :meth:`ConnectionWatch.mechanism` what that means."""


@dataclass(slots=True)
class Unreachable:
    """The broker cannot be reached this way; ``reason`` is one line saying why and what to do."""

    reason: str


#: What an event means for the client: nothing yet (None), or one of these.
Verdict = Reconnected | Unreachable | AskMechanism | None


class ConnectionWatch:
    """The state of one client socket's connection, from its monitor events."""

    def __init__(
        self, endpoint: str, *, curve_public: bytes | None, refused_for: float = REFUSED_FOR,
        stalled_for: float | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.curve_public = curve_public  # this client's public key (Z85), None for a plaintext client
        self.refused_for = refused_for  # refused connects for this long: nothing listens (REFUSED_FOR...)
        # A TCP connection without a handshake for this long: the broker is stalled (None: wait on).
        self.stalled_for = stalled_for
        self.connected = False  # a handshake succeeded and the connection has not been lost since
        self.ever_connected = False
        self.refused_since: float | None = None  # first refused connect since the last connection
        self.accepted_at: float | None = None  # TCP connected, the handshake not over (nor failed) yet
        self.stalled = False  # the verdict was STALLED, and nothing happened on the connection since
        self.no_detail = 0  # handshakes failed without a reason, in a row
        self.asked = False  # the broker's mechanism was asked for since the last connection
        self.failure: Unreachable | None = None  # the last verdict, kept while nothing else happens

    def event(self, kind: int, value: int, now: float) -> Verdict:
        """One monitor event; what it means for the client, if anything yet."""
        if kind != zmq.EVENT_CONNECTED:
            self.accepted_at = None  # the handshake is over, one way or the other, or there is no connection
            self.stalled = False
        if kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            came_back = self.ever_connected and not self.connected
            self.connected = self.ever_connected = True
            self.refused_since = None
            self.no_detail = 0
            self.asked = False
            self.failure = None
            return Reconnected() if came_back else None
        if kind == zmq.EVENT_DISCONNECTED:
            self.connected = False
            return None
        if kind == zmq.EVENT_CONNECT_RETRIED:
            if self.refused_since is None:
                self.refused_since = now
            return self.check(now)
        if kind == zmq.EVENT_CONNECTED:
            self.refused_since = None  # something listens; what it says comes next
            self.accepted_at = now
            return None
        curve = self.curve_public is not None
        if kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            key = (self.curve_public or b"?").decode("ascii", "replace")
            return self._fail(REFUSED_KEY, key=key, status=value, admit=keys.admit_command(key))
        if kind == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL and value == MISMATCH:
            return self._fail(BROKER_WITHOUT_CURVE if curve else BROKER_WITH_CURVE)
        if kind in (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL):
            self.no_detail += 1
            if self.no_detail >= NO_DETAIL_TIMES and not self.asked:
                self.asked = True
                return AskMechanism()
        return None

    def mechanism(self, broker: str | None) -> Unreachable:
        """The verdict once the broker's greeting named its mechanism (None: it could not be read)."""
        curve = self.curve_public is not None
        if broker == "CURVE" and curve:
            return self._fail(WRONG_BROKER_KEY)
        if broker == "CURVE":
            return self._fail(BROKER_WITH_CURVE)
        if broker == "NULL" and curve:
            return self._fail(BROKER_WITHOUT_CURVE)
        return self._fail(NO_HANDSHAKE)

    def check(self, now: float) -> Unreachable | None:
        """On the client's timer: connects refused for ``refused_for`` seconds mean nothing is listening; a
        connection without a handshake for ``stalled_for`` seconds, a stalled broker."""
        if self.refused_since is not None and now - self.refused_since >= self.refused_for:
            return self._fail(NOTHING_LISTENING)
        if (self.stalled_for is not None and self.accepted_at is not None
                and now - self.accepted_at >= self.stalled_for):
            self.stalled = True
            return self._fail(STALLED, seconds=self.stalled_for)
        return self.failure

    def timed_out(self, seconds: float) -> str:
        """Why no CONNECT was answered within ``seconds``: the best that is known."""
        if self.failure is not None:
            return self.failure.reason
        if self.refused_since is not None:
            return NOTHING_LISTENING.format(endpoint=self.endpoint)
        if self.accepted_at is not None:
            return STALLED.format(endpoint=self.endpoint, seconds=seconds)
        if not self.ever_connected:
            return (f"no connection to the broker at {self.endpoint} within {seconds:g}s: is the address "
                    "right, and reachable from here?")
        return (f"no answer to CONNECT from {self.endpoint} within {seconds:g}s: something there completed "
                "the handshake but does not answer as an mc0 broker (or is too busy to)")

    def _fail(self, template: str, **fields: object) -> Unreachable:
        self.failure = Unreachable(template.format(endpoint=self.endpoint, **fields))
        return self.failure


def greeting_mechanism(greeting: bytes) -> str | None:
    """The security mechanism a ZMTP 3 greeting names ("NULL", "PLAIN", "CURVE"), or None if it is not one."""
    if len(greeting) < GREETING_SIZE or greeting[:1] != b"\xff" or greeting[9:10] != b"\x7f":
        return None
    try:
        return greeting[12:32].rstrip(b"\x00").decode("ascii") or None
    except UnicodeDecodeError:
        return None
