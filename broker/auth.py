"""CURVE on the broker's ROUTER: the server key pair on the socket, a ZAP handler admitting clients, and a
count of the handshakes it refused.

The ZAP handler runs on the broker's own asyncio loop (pyzmq's ``AsyncioAuthenticator``). It admits the
client public keys found in the allow-list folder, or any client key when the operator asked for encryption
without an allow-list. The allow-list is re-read by :func:`reload` (the server calls it on SIGHUP).

:class:`HandshakeWatch` reads the ROUTER's socket events (libzmq's monitor): connections accepted and closed,
handshakes completed, and handshakes refused, by the allow-list (``auth``) or because the peer broke the
handshake (``protocol``: a wrong server key, a plaintext client on a CURVE port, garbage).
"""

from __future__ import annotations

import logging
from pathlib import Path

import zmq
import zmq.asyncio
from zmq.auth.asyncio import AsyncioAuthenticator
from zmq.utils.monitor import parse_monitor_message

from connector import keys

log = logging.getLogger("mc0.auth")

ZAP_DOMAIN = "mc0"


def secure(
    context: zmq.asyncio.Context, socket: zmq.Socket, keys_dir: Path, allow_any_client: bool
) -> AsyncioAuthenticator:
    """Make ``socket`` a CURVE server and start the ZAP handler that decides who may connect."""
    pair = keys.broker_pair(keys_dir)
    authenticator = AsyncioAuthenticator(context, log=logging.getLogger("mc0.zap"))
    authenticator.start()
    _configure(authenticator, keys_dir, allow_any_client)
    socket.curve_server = True
    socket.curve_publickey = pair.public
    socket.curve_secretkey = pair.secret
    socket.zap_domain = ZAP_DOMAIN.encode()
    return authenticator


def _configure(authenticator: AsyncioAuthenticator, keys_dir: Path, allow_any_client: bool) -> None:
    if allow_any_client:
        authenticator.configure_curve(domain=ZAP_DOMAIN, location=zmq.auth.CURVE_ALLOW_ANY)
        return
    allowed = Path(keys_dir) / keys.ALLOWED
    allowed.mkdir(parents=True, exist_ok=True)
    authenticator.configure_curve(domain=ZAP_DOMAIN, location=str(allowed))
    count = len(list(allowed.glob("*.key")))
    log.info("CURVE allow-list %s: %d client key(s)", allowed, count)


def reload(authenticator: AsyncioAuthenticator, keys_dir: Path, allow_any_client: bool) -> None:
    """Re-read the allow-list folder (new client certificates take effect for new connections)."""
    _configure(authenticator, keys_dir, allow_any_client)


#: The socket events counted, by the name of their counter.
WATCHED_EVENTS = {
    zmq.EVENT_ACCEPTED: "accepted",
    zmq.EVENT_DISCONNECTED: "closed",
    zmq.EVENT_HANDSHAKE_SUCCEEDED: "handshakes",
    zmq.EVENT_HANDSHAKE_FAILED_AUTH: "refused_auth",
    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "refused_protocol",
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "refused_other",
}


class HandshakeWatch:
    """Counts the ROUTER socket's connection and handshake events (``counters``), on the broker's loop.

    One monitor message per connection event, never per message: it costs nothing on the hot path."""

    def __init__(self, socket: zmq.asyncio.Socket) -> None:
        self.socket = socket
        self.counters = dict.fromkeys(WATCHED_EVENTS.values(), 0)
        mask = 0
        for event in WATCHED_EVENTS:
            mask |= event
        self.monitor = socket.get_monitor_socket(mask)

    async def run(self) -> None:
        """Count events until cancelled."""
        counters = self.counters
        while True:
            frames = await self.monitor.recv_multipart()
            name = WATCHED_EVENTS.get(parse_monitor_message(frames)["event"])
            if name is not None:
                counters[name] += 1

    @property
    def refused(self) -> dict[str, int]:
        """Refused handshakes by reason (``auth``, ``protocol``, ``other``)."""
        return {name.removeprefix("refused_"): count for name, count in self.counters.items()
                if name.startswith("refused_")}

    def close(self) -> None:
        self.socket.disable_monitor()
        self.monitor.close(linger=0)
