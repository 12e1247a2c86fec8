"""One reader of addresses for every command, the clients and the configuration (connector/addresses.py):
every spelling the docs allow, for binding the mc0 door, connecting to it, and the TCP doors, and one-line
refusals that show the expected forms."""

from __future__ import annotations

import pytest

from connector.addresses import AddressError, host_port, is_ipv6, zmq_endpoint


@pytest.mark.parametrize(
    ("text", "bind", "connect", "door"),
    [
        ("61616", "tcp://*:61616", "tcp://127.0.0.1:61616", ("127.0.0.1", 61616)),
        ("127.0.0.1:61616", "tcp://127.0.0.1:61616", "tcp://127.0.0.1:61616", ("127.0.0.1", 61616)),
        ("tcp://127.0.0.1:61616", "tcp://127.0.0.1:61616", "tcp://127.0.0.1:61616", ("127.0.0.1", 61616)),
        ("tcp://*:61616", "tcp://*:61616", "tcp://*:61616", ("*", 61616)),
        ("[::1]:9", "tcp://[::1]:9", "tcp://[::1]:9", ("::1", 9)),
        ("  localhost:5044 ", "tcp://localhost:5044", "tcp://localhost:5044", ("localhost", 5044)),
        ("0", "tcp://*:0", "tcp://127.0.0.1:0", ("127.0.0.1", 0)),
    ],
)
def test_every_spelling(text: str, bind: str, connect: str, door: tuple[str, int]) -> None:
    assert zmq_endpoint(text, what="x", bind=True) == bind
    assert zmq_endpoint(text, what="x") == connect
    assert host_port(text, what="x") == door


def test_a_bind_may_ask_for_any_port_and_other_transports_pass_through() -> None:
    assert zmq_endpoint("tcp://127.0.0.1:*", what="x", bind=True) == "tcp://127.0.0.1:*"
    assert zmq_endpoint("ipc:///run/mc0.sock", what="x") == "ipc:///run/mc0.sock"
    assert zmq_endpoint("inproc://broker", what="x", bind=True) == "inproc://broker"


@pytest.mark.parametrize("text", ["", "localhost", "tcp://127.0.0.1", ":61616", "host:port", "a/b:1",
                                  "tcp://host:61616/path", "127.0.0.1:*"])
def test_what_is_not_an_address_is_refused_with_the_forms(text: str) -> None:
    with pytest.raises(AddressError) as refused:
        zmq_endpoint(text, what="--broker")
    assert str(refused.value) == (f"--broker: {text!r} is not an address; use HOST:PORT, tcp://HOST:PORT "
                                  "or a port number (e.g. 127.0.0.1:61617)")


def test_a_port_out_of_range_says_so() -> None:
    with pytest.raises(AddressError, match=r"--sexp: '1:70000' has no port 70000 \(0 to 65535\)"):
        host_port("1:70000", what="--sexp")


@pytest.mark.parametrize(("endpoint", "expected"), [
    ("tcp://[::1]:61616", True),
    ("tcp://[fe80::1%eth0]:61616", True),
    ("tcp://127.0.0.1:61616", False),
    ("tcp://localhost:61616", False),  # a name: left to the resolver, no IPv6 asked for
    ("ipc:///tmp/mc0", False),
])
def test_an_ipv6_endpoint_is_told_by_its_brackets(endpoint: str, expected: bool) -> None:
    assert is_ipv6(endpoint) is expected
