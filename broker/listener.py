"""The mc0 port's listening socket, made by the broker and handed to libzmq, so that the port can stop taking
new connections without closing the ones it has.

libzmq has no way to stop a listener but to unbind it, and unbinding closes every connection accepted through
it: every mc0 client would be dropped each time the descriptor watch pauses the doors, which any client can
bring about with enough bare connections to any door. So where it can, the broker makes the listening socket
itself (bound and listening as libzmq would: ``SO_REUSEADDR``, the ROUTER's ``ZMQ_BACKLOG``) and gives
libzmq a duplicate of it (``ZMQ_USE_FD``); libzmq accepts from that one and closes it when the ROUTER unbinds
or closes. Holding the port then attaches a classic BPF socket filter that drops every packet the listening
socket receives (Linux: ``SO_ATTACH_FILTER``, no privilege needed): connection attempts go unanswered and
are retried by the client's TCP, as against a full backlog, while connections already made are other sockets
and carry on. Releasing it detaches the filter.

Owns: that socket and its filter. Where the broker cannot make it (not Linux, or an address that only libzmq
resolves: an interface name, a host name, ``ipc://``), :func:`open_listener` says so with None and the caller
falls back to unbinding.
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import os
import socket
import struct
import sys

#: Linux's socket options for classic BPF filters (asm-generic/socket.h).
SO_ATTACH_FILTER = 26
SO_DETACH_FILTER = 27
#: One instruction, ``BPF_RET | BPF_K`` with k = 0: keep no byte of any packet, i.e. drop it.
_DROP_ALL = ctypes.create_string_buffer(struct.pack("=HBBI", 0x06, 0, 0, 0))


def _drop_all_program() -> bytes:
    """A ``struct sock_fprog``: the number of instructions and a pointer to them (the kernel copies them)."""
    return struct.pack("HP", 1, ctypes.addressof(_DROP_ALL))


class Listener:
    """A listening TCP socket the broker owns while libzmq accepts from a duplicate of it."""

    def __init__(self, sock: socket.socket) -> None:
        self.socket = sock
        self.holding = False

    def handed_over(self) -> int:
        """A duplicate descriptor for ``ZMQ_USE_FD``: libzmq owns it from the bind on (and closes it)."""
        return os.dup(self.socket.fileno())

    def hold(self) -> None:
        """Let no new connection in; those already made are not touched."""
        if not self.holding:
            self.socket.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, _drop_all_program())
            self.holding = True

    def release(self) -> None:
        """Let new connections in again."""
        if self.holding:
            self.socket.setsockopt(socket.SOL_SOCKET, SO_DETACH_FILTER, 0)
            self.holding = False

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.socket.close()


def _address(endpoint: str) -> tuple[socket.AddressFamily, str, int] | None:
    """``tcp://HOST:PORT`` with a literal IP (IPv6 in brackets) or ``*``, and a number or ``*`` for the port;
    None for anything else (libzmq resolves those itself)."""
    if not endpoint.startswith("tcp://"):
        return None
    host, colon, port = endpoint[len("tcp://"):].rpartition(":")
    if not colon or not (port == "*" or port.isdigit()) or ";" in host:
        return None
    number = 0 if port == "*" else int(port)
    if host == "*":
        return socket.AF_INET, "0.0.0.0", number  # libzmq's "*" without ZMQ_IPV6
    try:
        ip = ipaddress.ip_address(host[1:-1] if host.startswith("[") and host.endswith("]") else host)
    except ValueError:
        return None
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    return family, str(ip), number


def open_listener(endpoint: str, backlog: int) -> Listener | None:
    """A socket bound to ``endpoint`` and listening, or None where the broker leaves listening to libzmq (see
    the module docstring). Raises OSError when the address cannot be bound (in use, not local)."""
    if not sys.platform.startswith("linux"):
        return None
    address = _address(endpoint)
    if address is None:
        return None
    family, host, port = address
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return Listener(sock)
