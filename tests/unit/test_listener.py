"""The mc0 port's listening socket (broker.listener): which addresses the broker binds itself, and a hold that
leaves new connection attempts unanswered while a connection already made carries on."""

from __future__ import annotations

import socket
import sys

import pytest

from broker import listener

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="socket filters are Linux's")


@pytest.mark.parametrize(("endpoint", "expected"), [
    ("tcp://127.0.0.1:5555", (socket.AF_INET, "127.0.0.1", 5555)),
    ("tcp://127.0.0.1:*", (socket.AF_INET, "127.0.0.1", 0)),
    ("tcp://*:5555", (socket.AF_INET, "0.0.0.0", 5555)),
    ("tcp://[::1]:5555", (socket.AF_INET6, "::1", 5555)),
    ("tcp://localhost:5555", None),  # a name: libzmq resolves it
    ("tcp://eth0:5555", None),  # an interface: libzmq's
    ("tcp://127.0.0.1:5555;10.0.0.1:5556", None),  # a source address: libzmq's
    ("ipc:///tmp/mc0.sock", None),
    ("tcp://127.0.0.1", None),
])
def test_the_broker_binds_literal_tcp_addresses_itself_and_leaves_the_rest_to_libzmq(
    endpoint: str, expected: tuple[socket.AddressFamily, str, int] | None,
) -> None:
    assert listener._address(endpoint) == expected


@linux_only
@pytest.mark.timeout(20)
def test_a_held_listener_lets_no_new_connection_in_and_keeps_the_ones_it_has() -> None:
    port = listener.open_listener("tcp://127.0.0.1:*", 16)
    assert port is not None
    try:
        address = port.socket.getsockname()
        made = socket.create_connection(address, timeout=5)
        port.socket.setblocking(True)
        accepted, _ = port.socket.accept()
        with made, accepted:
            port.hold()
            with pytest.raises(TimeoutError):
                socket.create_connection(address, timeout=0.5)
            made.sendall(b"still here")
            accepted.settimeout(5)
            assert accepted.recv(100) == b"still here"
            port.release()
            with socket.create_connection(address, timeout=5):
                late, _ = port.socket.accept()
                late.close()
    finally:
        port.close()


@linux_only
def test_an_address_in_use_is_refused() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        with pytest.raises(OSError, match="in use"):
            listener.open_listener(f"tcp://127.0.0.1:{busy.getsockname()[1]}", 16)
