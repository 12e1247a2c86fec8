"""Addresses as people type them, read one way by every command, the clients and the configuration file.

There are two kinds: the mc0 door's ZeroMQ endpoint (``tcp://HOST:PORT``), and ``HOST:PORT`` for the TCP
doors and the monitoring endpoint. Each accepts the other's spelling where it means the same thing, and a bare
port where the host is clear from the context:

==========================  =========================  ==========================  ====================
typed                       mc0, to bind               mc0, to connect             a TCP door
==========================  =========================  ==========================  ====================
``61616``                   ``tcp://*:61616``          ``tcp://127.0.0.1:61616``   ``127.0.0.1:61616``
``127.0.0.1:61616``         ``tcp://127.0.0.1:61616``  ``tcp://127.0.0.1:61616``   ``127.0.0.1:61616``
``tcp://127.0.0.1:61616``   ``tcp://127.0.0.1:61616``  ``tcp://127.0.0.1:61616``   ``127.0.0.1:61616``
``[::1]:61616``             ``tcp://[::1]:61616``      ``tcp://[::1]:61616``       ``::1``, 61616
==========================  =========================  ==========================  ====================

The mc0 door also takes ZeroMQ's other transports as they are (``ipc://...``, ``inproc://...``), and a bind
may ask for any free port (``tcp://127.0.0.1:*``; port ``0`` does the same for a TCP door). Anything else
is refused with one line that shows the expected forms.
"""

from __future__ import annotations

import ipaddress

#: The host a bare port means, by use: loopback for whatever connects (and for the TCP doors, which listen
#: on loopback unless told otherwise); every interface for the mc0 door's bind, as its default does.
LOOPBACK = "127.0.0.1"
EVERY_INTERFACE = "*"
#: ZeroMQ transports taken as they are.
OTHER_TRANSPORTS = ("ipc://", "inproc://", "pgm://", "epgm://", "vmci://")
FORMS = "HOST:PORT, tcp://HOST:PORT or a port number"


class AddressError(ValueError):
    """An address that cannot be read; the message names where it came from and the expected forms."""


def host_port(text: str, *, what: str, host: str = LOOPBACK) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT``, ``tcp://HOST:PORT``, or a bare port on ``host``) as a host and a port."""
    raw = text.strip()
    if raw.isdigit():
        return host, _port(raw, text, what)
    rest = raw.removeprefix("tcp://")
    name, colon, port = rest.rpartition(":")
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    if not colon or not name or "/" in rest or not port.isdigit():
        raise AddressError(f"{what}: {text!r} is not an address; use {FORMS} (e.g. {LOOPBACK}:61617)")
    return name, _port(port, text, what)


def is_ipv6(endpoint: str) -> bool:
    """Whether a ZeroMQ endpoint names an IPv6 address (``tcp://[v6]:PORT``): its socket needs ``ZMQ_IPV6``,
    without which libzmq neither binds nor connects to one (a connect just never succeeds)."""
    return endpoint.startswith("tcp://[")


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address, without brackets or port) is this machine's loopback only: a
    name other than ``localhost`` may resolve anywhere, so it is not."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def zmq_endpoint(text: str, *, what: str, bind: bool = False) -> str:
    """The ZeroMQ endpoint ``text`` means for the mc0 door: to bind (a bare port on every interface, ``*``
    as a port allowed) or to connect to (a bare port on loopback)."""
    raw = text.strip()
    if raw.startswith(OTHER_TRANSPORTS):
        return raw
    if bind and raw.endswith(":*"):
        name = raw.removeprefix("tcp://")[:-2]
        if name and "/" not in name:
            return f"tcp://{name}:*"
    name, port = host_port(raw, what=what, host=EVERY_INTERFACE if bind else LOOPBACK)
    if ":" in name:  # IPv6 goes back in brackets
        name = f"[{name}]"
    return f"tcp://{name}:{port}"


def _port(digits: str, text: str, what: str) -> int:
    port = int(digits)
    if port > 65535:
        raise AddressError(f"{what}: {text!r} has no port {port} (0 to 65535); use {FORMS}")
    return port
