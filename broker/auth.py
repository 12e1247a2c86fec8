"""CURVE on the broker's ROUTER: the server key pair on the socket and a ZAP handler admitting clients.

The ZAP handler runs on the broker's own asyncio loop (pyzmq's ``AsyncioAuthenticator``). It admits the
client public keys found in the allow-list folder, or any client key when the operator asked for encryption
without an allow-list. The allow-list is re-read by :func:`reload` (the server calls it on SIGHUP).
"""

from __future__ import annotations

import logging
from pathlib import Path

import zmq
import zmq.asyncio
from zmq.auth.asyncio import AsyncioAuthenticator

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
