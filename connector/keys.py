"""CURVE certificates on disk in pyzmq's certificate format (``NAME.key`` public, ``NAME.key_secret`` secret).

The layout of a keys folder (see ``keys/README.md``)::

    broker.key, broker.key_secret     the broker's pair; clients pin broker.key
    client.key, client.key_secret     the default client identity the CLI uses
    allowed/NAME.key                  public certificates of the clients the broker admits (the allow-list)

Used by the CLI, the connector and the broker; nothing here talks to a socket.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth

BROKER = "broker"
CLIENT = "client"
ALLOWED = "allowed"


class KeyFileError(Exception):
    """A certificate is missing or unreadable; the message says which file and what to run."""


@dataclass(frozen=True, slots=True)
class KeyPair:
    public: bytes  # Z85, 40 characters
    secret: bytes | None


def load(path: Path) -> KeyPair:
    """Read a certificate (public or secret file); the secret is None for a public-only file."""
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as error:
        raise KeyFileError(f"cannot read certificate {path}: {error}") from None
    return KeyPair(public, secret)


def _write_pair(folder: Path, name: str) -> KeyPair:
    folder.mkdir(parents=True, exist_ok=True)
    # The umask keeps the secret file private from the moment it exists, not only after a chmod.
    previous = os.umask(0o077)
    try:
        _, secret_file = zmq.auth.create_certificates(folder, name)
    finally:
        os.umask(previous)
    os.chmod(secret_file, 0o600)
    os.chmod(folder / f"{name}.key", 0o644)  # the public half is meant to be copied around
    return load(Path(secret_file))


def generate(keys_dir: Path, clients: tuple[str, ...] = (CLIENT,), force: bool = False) -> list[Path]:
    """Create the broker pair (unless present) and one pair per client name, each admitted in ``allowed/``.

    Returns the files written. Existing pairs are kept unless ``force``: replacing the broker pair locks out
    every client that pinned the old public key.
    """
    keys_dir = Path(keys_dir)
    written: list[Path] = []
    allowed = keys_dir / ALLOWED
    allowed.mkdir(parents=True, exist_ok=True)
    for name in (BROKER, *clients):
        secret_file = keys_dir / f"{name}.key_secret"
        if secret_file.exists() and not force:
            continue
        _write_pair(keys_dir, name)
        written += [keys_dir / f"{name}.key", secret_file]
        if name != BROKER:
            shutil.copyfile(keys_dir / f"{name}.key", allowed / f"{name}.key")
            written.append(allowed / f"{name}.key")
    return written


def broker_pair(keys_dir: Path) -> KeyPair:
    pair = load(Path(keys_dir) / f"{BROKER}.key_secret")
    if pair.secret is None:
        raise KeyFileError(f"{keys_dir}/{BROKER}.key_secret holds no secret key")
    return pair


def broker_public(keys_dir: Path) -> bytes:
    """The broker's public key, read from its public certificate (what a client pins)."""
    return load(Path(keys_dir) / f"{BROKER}.key").public


def client_pair(keys_dir: Path, name: str = CLIENT) -> KeyPair:
    path = Path(keys_dir) / f"{name}.key_secret"
    if not path.exists():
        raise KeyFileError(f"no client certificate {path}; run `mc0 keys generate --client {name}`")
    pair = load(path)
    if pair.secret is None:
        raise KeyFileError(f"{path} holds no secret key")
    return pair


@dataclass(frozen=True, slots=True)
class Credentials:
    """What a CURVE client needs: the broker's public key to pin, and its own key pair."""

    server_public: bytes
    public: bytes
    secret: bytes

    @classmethod
    def from_dir(cls, keys_dir: Path, name: str = CLIENT) -> Credentials:
        server = Path(keys_dir) / f"{BROKER}.key"
        if not server.exists():
            raise KeyFileError(
                f"no broker public key {server}; start the broker once or run `mc0 keys generate`"
            )
        pair = client_pair(keys_dir, name)
        assert pair.secret is not None  # client_pair checked it
        return cls(broker_public(keys_dir), pair.public, pair.secret)

    def apply(self, socket: zmq.Socket) -> None:
        socket.curve_serverkey = self.server_public
        socket.curve_publickey = self.public
        socket.curve_secretkey = self.secret
