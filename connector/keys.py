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
from zmq.utils import z85

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


def admit_command(key: str, name: str = "NAME") -> str:
    """The command that admits the client key ``key`` (Z85 text) as ``name``. Z85 has "-" among its
    characters: a key that starts with it comes after ``--``, so that no shell line reads it as an option."""
    return f"mc0 keys admit {name} {'-- ' if key.startswith('-') else ''}{key}"


def public_key(text: str) -> bytes:
    """A client's public key from what a person pastes: its Z85 text (40 characters) or a ``.key`` file."""
    candidate = Path(text)
    if len(text) != 40 or candidate.exists():
        if not candidate.exists():
            raise KeyFileError(f"{text!r} is neither a public key (40 Z85 characters) nor a certificate file")
        return load(candidate).public
    try:
        if len(z85.decode(text.encode("ascii"))) == 32:
            return text.encode("ascii")
    except (ValueError, KeyError, UnicodeEncodeError):  # pyzmq's z85 raises KeyError for a foreign character
        pass
    raise KeyFileError(f"{text!r} is not a Z85 public key (40 characters of the Z85 alphabet)")


def admit(keys_dir: Path, name: str, public: bytes) -> Path:
    """Put a client's public key on the broker's allow-list (``allowed/NAME.key``); returns the file written.

    A running broker reads the folder again at its next handshake: the client is admitted at once."""
    if not name or "/" in name or name.startswith("."):
        raise KeyFileError(f"{name!r} cannot name a certificate file: use letters, digits, '-' and '_'")
    allowed = Path(keys_dir) / ALLOWED
    allowed.mkdir(parents=True, exist_ok=True)
    path = allowed / f"{name}.key"
    # pyzmq's public certificate format (what zmq.auth.load_certificate reads), written whole then renamed in.
    text = ("#   ZeroMQ CURVE Public Certificate, admitted by mc0 keys admit\n"
            "metadata\n"
            "curve\n"
            f'    public-key = "{public.decode("ascii")}"\n')
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path


def client(keys_dir: Path, name: str) -> KeyPair:
    """A new client key pair ``NAME.key`` / ``NAME.key_secret`` in ``keys_dir``, and no broker pair: for a
    client's machine, whose public key is then admitted on the broker (:func:`admit`)."""
    if (Path(keys_dir) / f"{name}.key_secret").exists():
        raise KeyFileError(f"{keys_dir}/{name}.key_secret exists already: choose another name, or use it")
    return _write_pair(Path(keys_dir), name)


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
        raise KeyFileError(f"no client certificate {path}: copy {name}.key_secret from the broker's keys "
                           f"folder, or make a pair here with `mc0 keys client {name} --keys {keys_dir}` and "
                           "admit it on the broker")
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
                f"no broker public key {server}: copy broker.key (and client.key_secret) from the broker's "
                "keys folder, or point --keys or MC0_KEYS at that folder"
            )
        pair = client_pair(keys_dir, name)
        assert pair.secret is not None  # client_pair checked it
        return cls(broker_public(keys_dir), pair.public, pair.secret)

    def apply(self, socket: zmq.Socket) -> None:
        socket.curve_serverkey = self.server_public
        socket.curve_publickey = self.public
        socket.curve_secretkey = self.secret
