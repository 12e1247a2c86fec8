"""Topic settings: what a topic is (delivery, persistence, sync level) and which names get which settings.

Pure data and matching, shared by the engine, the configuration loader and the CLI. It knows nothing of wires.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from enum import StrEnum


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

    def __post_init__(self) -> None:
        if self.persistence is Persistence.TRANSIENT and self.sync is not None:
            raise ValueError("a transient topic has no sync level")
        if self.persistence is Persistence.PERSISTENT and self.sync is None:
            object.__setattr__(self, "sync", Sync.STRONG)
        if self.max_backlog < 0:
            raise ValueError("max_backlog must not be negative")

    def describe(self) -> dict[str, str | int]:
        out: dict[str, str | int] = {"delivery": self.delivery.value, "persistence": self.persistence.value}
        if self.sync is not None:
            out["sync"] = self.sync.value
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

    def spec_for(self, name: bytes) -> TopicSpec:
        for rule in self.rules:
            if rule.matches(name):
                return rule.spec
        return self.default
