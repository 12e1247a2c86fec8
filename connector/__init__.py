"""The mc0 client library for agents: :class:`Client` (blocking, thread-safe), :class:`AsyncClient` (asyncio).

    from connector import Client
    with Client("tcp://127.0.0.1:61616", keys="keys") as client:
        client.subscribe("orders")
        client.publish("orders", "hello")
        print(client.receive(timeout=1).text)

Durable topics: ``subscribe(topic, replay="beginning")`` reads a persistent topic's log first,
``subscribe(topic, explicit_acks=True)`` with ``ack(message)`` consumes a queue without losing what a crashed
consumer held, ``declare(topic, persistence="persistent")`` creates one, ``delete(topic)`` removes one with
its files, ``topics()`` shows them a page at a time (``prefix``, ``after``, ``limit``). A reconnect resumes
every topic right after the last message received (:attr:`Client.last_ids`).
``fetch(topic, start)`` reads a persistent topic's stored messages by id range without subscribing (the
Spark data source's reads), ``offsets(topic)`` gives its oldest and next id; ``fetch(..., wait=0.5)`` waits
for something new (a long poll), ``fetch_records`` reads the stored records undecoded, and
``publish_batch(..., producer=..., sequence=...)`` publishes a batch that lands once however often it is
sent. ``publish_async(topic, body)`` pipelines confirmed publishes: it returns at once a future of the
broker's OK (a :class:`Confirmation` from the blocking client).
"""

from connector.aio import AsyncClient
from connector.base import TopicPage, TopicSettings
from connector.client import DEFAULT_ENDPOINT, Client, Confirmation
from connector.core import ConnectorError, FetchResult, Message, RecordsResult
from connector.keys import Credentials

__all__ = [
    "DEFAULT_ENDPOINT", "AsyncClient", "Client", "Confirmation", "ConnectorError", "Credentials",
    "FetchResult", "Message", "RecordsResult", "TopicPage", "TopicSettings",
]
