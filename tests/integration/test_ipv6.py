"""An mc0 port on an IPv6 address (``tcp://[::1]:*``, a form connector.addresses reads): the broker binds it,
through its own listening socket or through libzmq's, and both clients reach it. libzmq needs ``ZMQ_IPV6``
on both sides, or the bind fails and the connect never succeeds."""

from __future__ import annotations

import asyncio
import socket
from typing import TYPE_CHECKING

import pytest

from broker import server
from connector import AsyncClient, Client

if TYPE_CHECKING:
    from conftest import BrokerFactory


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


pytestmark = pytest.mark.skipif(not _ipv6_loopback(), reason="this machine has no IPv6 loopback")


@pytest.mark.timeout(30)
@pytest.mark.parametrize("listener", ["the broker's", "libzmq's"])
def test_both_clients_reach_an_mc0_port_on_an_ipv6_address(
    start_broker: BrokerFactory, monkeypatch: pytest.MonkeyPatch, listener: str,
) -> None:
    if listener == "libzmq's":
        monkeypatch.setattr(server, "open_listener", lambda endpoint, backlog: None)
    broker = start_broker(bind="tcp://[::1]:*")
    assert broker.endpoint.startswith("tcp://[::1]:")
    with Client(broker.endpoint, curve=False, timeout=5) as client:
        client.subscribe("v6.topic")
        assert client.publish("v6.topic", "over IPv6", confirm=True) is not None
        message = client.receive(timeout=5)
        assert message is not None
        assert message.body == b"over IPv6"

    async def asynchronous() -> None:
        async with AsyncClient(broker.endpoint, curve=False, timeout=5) as client:
            assert await client.publish("v6.topic", "async too", confirm=True) is not None

    asyncio.run(asynchronous())
