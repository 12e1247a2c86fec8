"""CURVE on the mc0 door, on real sockets: the broker admits the client keys in its allow-list folder, the
client pins the broker's public key, and everything else gets no conversation at all.

Keys come from :func:`connector.keys.generate` in a temporary folder. A refused client is recognised by
silence (no reply to a CONNECT within a timeout) and, where libzmq reports it, by the handshake events of a
monitor.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import zmq

from broker.config import BrokerConfig
from broker.server import ensure_keys
from connector import keys

if TYPE_CHECKING:
    from conftest import BrokerFactory, DealerFactory, Peer

    from broker.server import Broker

pytestmark = [pytest.mark.timeout(30), pytest.mark.usefixtures("each_engine")]

#: How long a refused client listens to be sure no reply comes (a handshake takes milliseconds on loopback).
REFUSAL_WAIT = 1.0

HANDSHAKE_EVENTS = (
    zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)

#: The ZAP status code libzmq reports to a client whose key the broker refused.
ZAP_DENIED = 400

CurveOptions = dict[str, bytes]


def client_keys(keys_dir: Path, name: str = keys.CLIENT) -> CurveOptions:
    """The socket options of a client using certificate ``name`` and pinning the broker in ``keys_dir``."""
    pair = keys.client_pair(keys_dir, name)
    assert pair.secret is not None
    return {"server_key": keys.broker_public(keys_dir), "public_key": pair.public, "secret_key": pair.secret}


def stranger_keys(server_key: bytes) -> CurveOptions:
    """A fresh client pair that no allow-list knows."""
    public, secret = zmq.curve_keypair()
    return {"server_key": server_key, "public_key": public, "secret_key": secret}


def assert_conversation_works(peer: Peer) -> None:
    peer.connect(ttl=30000)
    peer.sub("secret topic")
    peer.put("secret topic", b"\x00sealed")
    assert peer.recv().body == b"\x00sealed"


def assert_refused(peer: Peer) -> None:
    """No reply to a CONNECT; after a ZAP refusal libzmq may not even keep a pipe to send on."""
    try:
        peer.send("CONNECT", "VERSION", "0.2", "TTL", "30000", "ID", "knock")
    except zmq.Again:
        return
    peer.expect_silence(REFUSAL_WAIT)


# ------------------------------------------------------------------------------------------------- admitted


def test_allowed_client_with_pinned_server_key_works(
    curve_broker: Broker, dealer: DealerFactory, keys_dir: Path
) -> None:
    peer = dealer(curve_broker.endpoint, monitor=HANDSHAKE_EVENTS, **client_keys(keys_dir))
    event = peer.next_event()
    assert event is not None
    assert event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED
    assert_conversation_works(peer)


def test_several_allowed_clients_talk_to_each_other(
    start_broker: BrokerFactory, dealer: DealerFactory, tmp_path: Path
) -> None:
    folder = tmp_path / "keys"
    keys.generate(folder, clients=("alice", "bob"))
    broker = start_broker(curve=True, keys_dir=folder)
    alice = dealer(broker.endpoint, **client_keys(folder, "alice"))
    bob = dealer(broker.endpoint, **client_keys(folder, "bob"))
    bob.connect()
    bob.sub("collective agent")
    alice.connect()
    alice.put("collective agent", "hello bob", {"X-From": "alice"})
    message = bob.recv()
    assert message.headers == {b"TOPIC": b"collective agent", b"X-From": b"alice"}
    assert message.body == b"hello bob"


def test_allow_any_client_admits_an_unknown_key(
    start_broker: BrokerFactory, dealer: DealerFactory, keys_dir: Path
) -> None:
    broker = start_broker(curve=True, keys_dir=keys_dir, allow_any_client=True)
    stranger = stranger_keys(keys.broker_public(keys_dir))
    assert_conversation_works(dealer(broker.endpoint, **stranger))
    # Still encrypted: plaintext and a wrong server key are refused all the same.
    assert_refused(dealer(broker.endpoint))
    wrong_server_public, _ = zmq.curve_keypair()
    assert_refused(dealer(broker.endpoint, **{**stranger, "server_key": wrong_server_public}))


# ------------------------------------------------------------------------------------------------- refused


def test_unknown_client_key_is_refused(curve_broker: Broker, dealer: DealerFactory, keys_dir: Path) -> None:
    peer = dealer(
        curve_broker.endpoint, monitor=HANDSHAKE_EVENTS, **stranger_keys(keys.broker_public(keys_dir))
    )
    event = peer.next_event()
    assert event is not None
    assert event["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH
    assert event["value"] == ZAP_DENIED
    assert_refused(peer)
    assert zmq.EVENT_HANDSHAKE_SUCCEEDED not in peer.events(0.3)
    # The refusal hurt nobody else.
    assert_conversation_works(dealer(curve_broker.endpoint, **client_keys(keys_dir)))


def test_generated_but_unlisted_client_is_refused(
    start_broker: BrokerFactory, dealer: DealerFactory, tmp_path: Path
) -> None:
    folder = tmp_path / "keys"
    keys.generate(folder, clients=("alice", "mallory"))
    (folder / keys.ALLOWED / "mallory.key").unlink()
    broker = start_broker(curve=True, keys_dir=folder)
    assert_refused(dealer(broker.endpoint, **client_keys(folder, "mallory")))
    assert_conversation_works(dealer(broker.endpoint, **client_keys(folder, "alice")))


def test_plaintext_client_cannot_talk_to_a_curve_broker(
    curve_broker: Broker, dealer: DealerFactory, keys_dir: Path
) -> None:
    plain = dealer(curve_broker.endpoint, monitor=HANDSHAKE_EVENTS)
    assert_refused(plain)
    assert zmq.EVENT_HANDSHAKE_SUCCEEDED not in plain.events(0.2)
    assert_conversation_works(dealer(curve_broker.endpoint, **client_keys(keys_dir)))


def test_client_pinned_to_the_wrong_server_key_cannot_connect(
    curve_broker: Broker, dealer: DealerFactory, keys_dir: Path
) -> None:
    wrong_server_public, _ = zmq.curve_keypair()
    options = {**client_keys(keys_dir), "server_key": wrong_server_public}
    peer = dealer(curve_broker.endpoint, monitor=HANDSHAKE_EVENTS, **options)
    assert_refused(peer)
    assert zmq.EVENT_HANDSHAKE_SUCCEEDED not in peer.events(0.2)
    assert_conversation_works(dealer(curve_broker.endpoint, **client_keys(keys_dir)))


def test_curve_client_cannot_talk_to_a_plaintext_broker(
    broker: Broker, dealer: DealerFactory, keys_dir: Path
) -> None:
    assert_refused(dealer(broker.endpoint, **client_keys(keys_dir)))


# ---------------------------------------------------------------------------------------------------- keys


def test_ensure_keys_creates_keys_on_first_run_only(
    start_broker: BrokerFactory, dealer: DealerFactory, tmp_path: Path
) -> None:
    folder = tmp_path / "first-run" / "keys"
    config = BrokerConfig(keys_dir=folder, curve=True)
    written = ensure_keys(config)
    expected = {
        folder / "broker.key",
        folder / "broker.key_secret",
        folder / "client.key",
        folder / "client.key_secret",
        folder / keys.ALLOWED / "client.key",
    }
    assert set(written) == expected
    assert all(path.is_file() for path in expected)
    for secret_file in (folder / "broker.key_secret", folder / "client.key_secret"):
        assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
    broker_public = keys.broker_public(folder)
    assert len(broker_public) == 40
    assert b"secret-key" not in (folder / "broker.key").read_bytes()

    assert ensure_keys(config) == [], "a second run keeps the keys it has"
    assert keys.broker_public(folder) == broker_public

    broker = start_broker(curve=True, keys_dir=folder)
    assert_conversation_works(dealer(broker.endpoint, **client_keys(folder)))


def test_ensure_keys_does_nothing_without_curve(tmp_path: Path) -> None:
    folder = tmp_path / "unused"
    assert ensure_keys(BrokerConfig(keys_dir=folder, curve=False)) == []
    assert not folder.exists()


def test_missing_client_certificate_names_the_fix(tmp_path: Path) -> None:
    keys.generate(tmp_path / "keys")
    with pytest.raises(keys.KeyFileError, match="mc0 keys client nobody") as missing:
        keys.client_pair(tmp_path / "keys", "nobody")
    assert "copy nobody.key_secret from the broker's keys folder" in str(missing.value)
    assert "keys generate" not in str(missing.value), "never a new broker identity on a client's machine"


def test_generated_secret_keys_are_private_from_the_start(tmp_path: Path) -> None:
    """The secret file is created under a 077 umask, so no other user can read it even for an instant."""
    previous = os.umask(0o022)
    try:
        keys.generate(tmp_path / "keys")
    finally:
        os.umask(previous)
    for secret in (tmp_path / "keys").glob("*.key_secret"):
        assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "keys" / "broker.key").stat().st_mode) == 0o644
