"""CURVE on the broker's ROUTER: the server key pair on the socket, a ZAP handler admitting clients, and a
count of the handshakes it refused.

The ZAP handler runs on the broker's own asyncio loop (pyzmq's ``AsyncioAuthenticator``). It admits the
client public keys found in the allow-list folder, or any client key when the operator asked for encryption
without an allow-list (:class:`AllowList`: re-read when the folder changes, refusals logged at WARNING). The
allow-list is also re-read by :func:`reload` (the server calls it on SIGHUP).

:class:`HandshakeWatch` reads the ROUTER's socket events (libzmq's monitor): connections accepted and closed,
handshakes completed, and handshakes refused, by the allow-list (``auth``) or because the peer broke the
handshake (``protocol``: a wrong server key, a plaintext client on a CURVE port, garbage).
"""

from __future__ import annotations

import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import zmq
import zmq.asyncio
from zmq.auth.asyncio import AsyncioAuthenticator
from zmq.utils.monitor import parse_monitor_message

from connector import keys

log = logging.getLogger("mc0.auth")

ZAP_DOMAIN = "mc0"


#: A refused key is logged at WARNING at most once per this many seconds (a client retrying every 100 ms would
#: fill the log), and refusals of at most this many distinct keys are remembered for that.
REFUSAL_LOG_INTERVAL = 60.0
REFUSALS_REMEMBERED = 1024


class AllowList:
    """The CURVE client keys the broker admits: the public certificates in the allow-list folder.

    It is pyzmq's credentials provider for the ZAP handler (``callback`` per handshake). The folder is read
    again whenever its modification time changes, checked on every handshake (one stat): a certificate added
    by ``mc0 keys generate --client`` or ``mc0 keys admit`` on the broker's machine is admitted at once.
    SIGHUP still re-reads it whole (a certificate rewritten in place does not change the folder's time). Every
    refusal is logged at WARNING with the key and the command that admits it, at most once a minute per key.
    """

    def __init__(self, folder: Path, clock: Callable[[], float] = time.monotonic,
                 members: frozenset[bytes] = frozenset()) -> None:
        self.folder = Path(folder)
        self.members = members  # admitted whatever the folder says: a cluster's brokers (their shared key)
        self.clock = clock
        self.keys: frozenset[bytes] = frozenset()
        self._seen_mtime: int | None = None
        self._refusals: OrderedDict[bytes, float] = OrderedDict()  # key -> when it was last logged
        self.reload()

    def reload(self) -> int:
        """Read the folder's certificates again; returns how many keys are admitted."""
        self.folder.mkdir(parents=True, exist_ok=True)
        self._seen_mtime = self._mtime()
        try:
            self.keys = frozenset(zmq.auth.load_certificates(str(self.folder)))
        except (OSError, ValueError) as error:  # keep those read before: one bad file must not lock out all
            log.error("CURVE allow-list %s: cannot read it (%s); keeping the %d key(s) read before",
                      self.folder, error, len(self.keys))
        log.info("CURVE allow-list %s: %d client key(s)", self.folder, len(self.keys))
        return len(self.keys)

    def callback(self, domain: str, key: bytes) -> bool:
        """pyzmq's ZAP hook: admit ``key`` (Z85) or not."""
        if self._mtime() != self._seen_mtime:
            self.reload()
        if key in self.keys or key in self.members:
            return True
        self._refused(key)
        return False

    def _refused(self, key: bytes) -> None:
        now = self.clock()
        last = self._refusals.get(key)
        if last is not None and now - last < REFUSAL_LOG_INTERVAL:
            log.debug("refused CURVE client key %s again", key.decode("ascii", "replace"))
            return
        self._refusals[key] = now
        self._refusals.move_to_end(key)
        while len(self._refusals) > REFUSALS_REMEMBERED:
            self._refusals.popitem(last=False)
        shown = key.decode("ascii", "replace")
        log.warning("refused a CURVE client: its key %s is not in %s; to admit it, run `%s` beside the "
                    "broker's keys folder", shown, self.folder, keys.admit_command(shown))

    def _mtime(self) -> int | None:
        try:
            return os.stat(self.folder).st_mtime_ns
        except OSError:
            return None


def secure(
    context: zmq.asyncio.Context, socket: zmq.Socket, keys_dir: Path, allow_any_client: bool,
    cluster: bool = False,
) -> AsyncioAuthenticator:
    """Make ``socket`` a CURVE server and start the ZAP handler that decides who may connect. In a cluster
    the broker's own public key is admitted too: the other members present it (they share the key pair)."""
    pair = keys.broker_pair(keys_dir)
    authenticator = AsyncioAuthenticator(context, log=logging.getLogger("mc0.zap"))
    authenticator.start()
    _configure(authenticator, keys_dir, allow_any_client, _members(keys_dir, cluster))
    socket.curve_server = True
    socket.curve_publickey = pair.public
    socket.curve_secretkey = pair.secret
    socket.zap_domain = ZAP_DOMAIN.encode()
    return authenticator


def _members(keys_dir: Path, cluster: bool) -> frozenset[bytes]:
    """The keys admitted whatever the allow-list says: in a cluster, the brokers' own (the other members
    present it: they share the key pair)."""
    return frozenset({keys.broker_pair(keys_dir).public}) if cluster else frozenset()


def allow_list(keys_dir: Path, cluster: bool = False) -> AllowList:
    """The allow-list of ``keys_dir``, admitting a cluster's members too (the native engine asks it without
    ZAP)."""
    return _allowed(keys_dir, _members(keys_dir, cluster))


def _allowed(keys_dir: Path, members: frozenset[bytes]) -> AllowList:
    return AllowList(Path(keys_dir) / keys.ALLOWED, members=members)


def _configure(authenticator: AsyncioAuthenticator, keys_dir: Path, allow_any_client: bool,
               members: frozenset[bytes] = frozenset()) -> None:
    if allow_any_client:
        authenticator.configure_curve(domain=ZAP_DOMAIN, location=zmq.auth.CURVE_ALLOW_ANY)
        return
    provider = authenticator.credentials_providers.get(ZAP_DOMAIN)
    if isinstance(provider, AllowList):
        provider.reload()
        return
    authenticator.configure_curve_callback(domain=ZAP_DOMAIN,
                                           credentials_provider=_allowed(keys_dir, members))


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


def refused_by_reason(counters: dict[str, int]) -> dict[str, int]:
    """The ``refused_*`` counts of the mc0 port's handshake counters, by reason (auth, protocol, other)."""
    return {name.removeprefix("refused_"): count for name, count in counters.items()
            if name.startswith("refused_")}


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
        return refused_by_reason(self.counters)

    def close(self) -> None:
        self.socket.disable_monitor()
        self.monitor.close(linger=0)
