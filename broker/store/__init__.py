"""The interface between the engine and durable storage.

The engine calls a :class:`Store` to open one :class:`TopicLog` per persistent topic; the log owns the bytes
on disk. This module only states the contract (the segmented log implementing it lives beside it); transient
topics never touch a store. A store failure raises :class:`StoreError`, which stops the broker loudly:
acknowledged data must never be lost in silence.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from broker.engine import Message
    from broker.topics import TopicSpec


class StoreError(Exception):
    """The store could not keep its promise (I/O error, corrupt sealed segment, ...)."""


class TopicLog(Protocol):
    """The append-only log of one persistent topic."""

    @property
    def first_id(self) -> int:
        """The oldest id still stored (equal to ``next_id`` when the log is empty)."""
        ...

    @property
    def next_id(self) -> int:
        """The id the next appended message gets; stable across restarts."""
        ...

    def append(self, message: Message) -> None:
        """Append (buffered); durability comes from :meth:`commit`."""
        ...

    def commit(self) -> None:
        """Make every appended message as durable as the topic's sync level promises (group commit)."""
        ...

    def read(self, start_id: int, max_messages: int, max_bytes: int) -> list[Message]:
        """Stored messages from ``start_id`` on, bounded by count and bytes (at least one if any exists)."""
        ...

    def close(self) -> None: ...


class Store(Protocol):
    """Opens the logs of persistent topics under one data directory."""

    def open(self, topic: bytes, spec: TopicSpec) -> TopicLog: ...

    def close(self) -> None: ...
