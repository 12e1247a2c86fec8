"""Topic settings: what a topic is (delivery, persistence, sync level) and which names get which settings.

Pure data and matching, shared by the engine, the configuration loader and the CLI. It knows nothing of wires.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from enum import StrEnum

#: A sealed segment is the unit of retention: 64 MiB keeps the file count low and deletion coarse but cheap.
DEFAULT_SEGMENT_BYTES = 64 << 20
#: Smaller segments only make sense in tests (rolling and retention over a few records).
MIN_SEGMENT_BYTES = 1024
#: Topic ids are small integers, never reused while the broker runs and recorded with persistent topics, so
#: those keep theirs across restarts; the sexp dialect carries them as u32.
MAX_TOPIC_ID = 2**32 - 1


class Delivery(StrEnum):
    BROADCAST = "broadcast"  # every subscriber gets every message
    ROUND_ROBIN = "round-robin"  # each message goes to exactly one subscriber, in strict rotation


class Persistence(StrEnum):
    TRANSIENT = "transient"  # memory only
    PERSISTENT = "persistent"  # written to the log (needs a store)


class Sync(StrEnum):
    STRONG = "strong"  # appended and fsynced before anyone is told
    WEAK = "weak"  # appended before delivery, fsynced every few seconds
    ASYNC = "async"  # no flush promise


@dataclass(frozen=True, slots=True)
class TopicSpec:
    delivery: Delivery = Delivery.BROADCAST
    persistence: Persistence = Persistence.TRANSIENT
    sync: Sync | None = None  # only for persistent topics
    max_backlog: int = 10_000  # round-robin messages held while no consumer has room (transient)
    # Persistent topics only. Retention deletes whole sealed segments, oldest first; None = keep forever.
    retention_bytes: int | None = None
    retention_seconds: float | None = None
    segment_bytes: int = DEFAULT_SEGMENT_BYTES  # the active segment is sealed once it reaches this size
    # A fixed body size in bytes (0 = any): every message must have it, and reactive-streams subscribers get
    # the topic's elements packed (onNextPacked).
    element_size: int = 0

    def __post_init__(self) -> None:
        if self.persistence is Persistence.TRANSIENT and self.sync is not None:
            raise ValueError("a transient topic has no sync level")
        if self.persistence is Persistence.PERSISTENT and self.sync is None:
            object.__setattr__(self, "sync", Sync.STRONG)
        if self.max_backlog < 0:
            raise ValueError("max_backlog must not be negative")
        if self.persistence is Persistence.TRANSIENT and (
            self.retention_bytes is not None or self.retention_seconds is not None
        ):
            raise ValueError("retention applies to persistent topics only")
        for name in ("retention_bytes", "retention_seconds"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be greater than 0")
        if self.segment_bytes < MIN_SEGMENT_BYTES:
            raise ValueError(f"segment_bytes must be at least {MIN_SEGMENT_BYTES}")
        if self.element_size < 0:
            raise ValueError("element_size must not be negative")

    @property
    def persistent(self) -> bool:
        return self.persistence is Persistence.PERSISTENT

    def describe(self) -> dict[str, str | int]:
        out: dict[str, str | int] = {"delivery": self.delivery.value, "persistence": self.persistence.value}
        if self.sync is not None:
            out["sync"] = self.sync.value
        if self.delivery is Delivery.ROUND_ROBIN and not self.persistent:
            out["max_backlog"] = self.max_backlog
        if self.element_size:
            out["element_size"] = self.element_size
        if self.persistent:
            out["segment_bytes"] = self.segment_bytes
            if self.retention_bytes is not None:
                out["retention_bytes"] = self.retention_bytes
            if self.retention_seconds is not None:
                out["retention_seconds"] = self.retention_seconds
        return out


DEFAULT_SPEC = TopicSpec()


@dataclass(frozen=True, slots=True)
class TopicRule:
    """Topic names matching ``pattern`` (shell-style: ``*``, ``?``, ``[...]``) get ``spec``."""

    pattern: str
    spec: TopicSpec

    def matches(self, name: bytes) -> bool:
        return fnmatch.fnmatchcase(name.decode("utf-8", "surrogateescape"), self.pattern)


class TopicRules:
    """An ordered list of rules; the first match wins; undeclared topics are transient broadcast."""

    def __init__(self, rules: list[TopicRule] | None = None, default: TopicSpec = DEFAULT_SPEC) -> None:
        self.rules = list(rules or [])
        self.default = default

    def rule_for(self, name: bytes) -> TopicRule | None:
        """The first rule matching ``name``; None when the name gets the default settings."""
        for rule in self.rules:
            if rule.matches(name):
                return rule
        return None

    def spec_for(self, name: bytes) -> TopicSpec:
        rule = self.rule_for(name)
        return self.default if rule is None else rule.spec
