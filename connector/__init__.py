"""The mc0 client library for agents: :class:`Client` (blocking, thread-safe), :class:`AsyncClient` (asyncio).

    from connector import Client
    with Client("tcp://127.0.0.1:61616", keys="keys") as client:
        client.subscribe("orders")
        client.publish("orders", "hello")
        print(client.receive(timeout=1).text)
"""

from connector.aio import AsyncClient
from connector.client import DEFAULT_ENDPOINT, Client
from connector.core import ConnectorError, Message
from connector.keys import Credentials

__all__ = ["DEFAULT_ENDPOINT", "AsyncClient", "Client", "ConnectorError", "Credentials", "Message"]
