"""The cluster's small replicated state, and the pure rules the cluster decides by.

:class:`ClusterState` is what every broker of a cluster agrees on through Raft (:mod:`broker.cluster.raft`
carries it): the leader epoch and which broker leads, each broker's advertised mc0 endpoint, the persistent
topics' settings, each topic's log identity per epoch, and each replica's durable position per topic as
reported every few seconds. It changes only by :meth:`ClusterState.apply` of a command, in the same order on
every broker; a command is a plain tuple (it travels pickled in PySyncObj's log).

The rest of this module is arithmetic on that state and on what replicas report, with no I/O and no clock:

* :func:`high_watermark`: the first id not yet on a majority of the replicas (the leader's own durable
  position included): what a strong OK waits for and what subscribers may read up to;
* :func:`last_epoch` and :func:`most_advanced`: Raft's "at least as up to date" rule applied to message
  logs, which a new leader uses to find the replica it must catch up from (docs/cluster.md, "Failover").

It must not know about sockets, the engine or PySyncObj.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from broker.store import LogIdentity

#: Identity entries kept per topic: as many as a log's lineage keeps (broker.store.MAX_LINEAGE).
MAX_EPOCHS_PER_TOPIC = 16


@dataclass
class ClusterState:
    """What the cluster agrees on. Topic names are kept as hex (PySyncObj pickles the state; hex keeps it
    readable in a dump)."""

    epoch: int = 0
    leader: str | None = None  # the Raft address of the broker serving epoch ``epoch``
    endpoints: dict[str, str] = field(default_factory=dict)  # Raft address -> advertised mc0 endpoint
    topics: dict[str, dict[str, Any]] = field(default_factory=dict)  # name hex -> spec (storage.md's JSON)
    # name hex -> [(epoch, incarnation, lineage)], oldest first: the log identity each epoch's leader gave it
    identities: dict[str, list[tuple[int, str, tuple[tuple[str, int], ...]]]] = field(default_factory=dict)
    positions: dict[str, dict[str, int]] = field(default_factory=dict)  # node -> name hex -> durable next id
    # name hex -> (the incarnation of its log, the leader's queue position in it) of a persistent round-robin
    # topic: every id up to the position acked
    acked: dict[str, tuple[str, int]] = field(default_factory=dict)
    # The last epoch whose leader handed the cluster over because it could not write (a full disk): the
    # next leader does not hand it on for the same reason at once (every disk may be full).
    unwritable_epoch: int = 0

    def __setstate__(self, fields: dict[str, Any]) -> None:
        """Unpickled (a Raft dump): fields a dump from an older broker lacks get their defaults."""
        self.__dict__.update(ClusterState().__dict__)
        self.__dict__.update(fields)

    def apply(self, command: tuple[Any, ...]) -> bool:
        """Apply one command (the same on every broker, in log order); False if it changed nothing because it
        was stale (a take-over for an epoch already taken)."""
        kind = command[0]
        if kind == "join":
            node, endpoint = command[1], command[2]  # then, from newer brokers, the members it names
            self.endpoints[node] = endpoint
            return True
        if kind == "take_over":
            _, node, epoch, identities = command
            if epoch != self.epoch + 1:
                return False  # another broker took this epoch first: this one must not serve
            self.epoch = epoch
            self.leader = node
            for name_hex, (incarnation, lineage) in identities.items():
                chain = self.identities.setdefault(name_hex, [])
                chain.append((epoch, incarnation, tuple(tuple(entry) for entry in lineage)))
                del chain[:-MAX_EPOCHS_PER_TOPIC]
            return True
        if kind == "topic":  # then, from newer brokers, the identity of the leader's log (for its copies)
            name_hex, spec = command[1], command[2]
            self.topics[name_hex] = spec
            return True
        if kind == "forget_topic":  # then, from newer brokers, the incarnation of the log deleted
            name_hex = command[1]
            self.topics.pop(name_hex, None)
            self.identities.pop(name_hex, None)
            for positions in self.positions.values():
                positions.pop(name_hex, None)
            self.acked.pop(name_hex, None)
            return True
        if kind == "acked":  # reported by the leader: the latest report is the queue's position
            self.acked.update(command[1])
            return True
        if kind == "unwritable":  # from brokers that hand over when they cannot write
            self.unwritable_epoch = max(self.unwritable_epoch, command[1])
            return True
        if kind == "positions":
            _, node, positions = command
            self.positions.setdefault(node, {}).update(positions)
            return True
        raise ValueError(f"unknown cluster command {kind!r}")

    def lineage_of(self, name_hex: str, incarnation: str) -> tuple[tuple[str, int], ...] | None:
        """The lineage an epoch's leader gave topic ``name_hex``'s identity ``incarnation`` (None: no epoch
        gave it, or it is older than the epochs kept)."""
        for _, known, lineage in self.identities.get(name_hex, ()):
            if known == incarnation:
                return lineage
        return None

    def epoch_of(self, name_hex: str, incarnation: str) -> int:
        """The epoch whose leader gave topic ``name_hex`` the log identity ``incarnation`` (0: none did, a log
        made before the cluster served it)."""
        for epoch, known, _ in self.identities.get(name_hex, ()):
            if known == incarnation:
                return epoch
        return 0

    def copy(self) -> ClusterState:
        return copy.deepcopy(self)


def majority(size: int) -> int:
    """How many of ``size`` brokers make a majority."""
    return size // 2 + 1


def high_watermark(positions: Sequence[int], size: int) -> int:
    """The highest next id that a majority of ``size`` replicas hold: the id below which every message is on
    a majority. ``positions`` are the replicas' durable next ids (the leader's own among them); a replica not
    heard from counts as holding nothing (1)."""
    need = majority(size)
    if len(positions) < need:
        return 1
    return sorted(positions, reverse=True)[need - 1]


class ReplicaEnd(NamedTuple):
    """What one replica holds of one topic: its next id and its log identity (with the identity's lineage:
    ``(earlier incarnation, until)`` pairs, oldest first)."""

    node: str
    next_id: int
    incarnation: str
    lineage: tuple[tuple[str, int], ...] = ()


def last_epoch(end: ReplicaEnd, epoch_of: Callable[[str], int]) -> int:
    """The epoch in which the last message of a replica's log was written (0 for an empty log or one made
    before the cluster served).

    A log takes a new identity when it follows a new leader, whose lineage records ``until``, the leader's
    next id when it took over: ids from ``until`` on were written in the new epoch, ids below it in an
    earlier one. So the last message (``next_id - 1``) belongs to the oldest identity of the chain whose
    ``until`` is above it, or to the current identity if it is at or past every ``until``: Raft's "term of the
    last entry"."""
    last = end.next_id - 1
    if last < 1:
        return 0
    for incarnation, until in end.lineage:
        if last < until:
            return epoch_of(incarnation)
    return epoch_of(end.incarnation)


def most_advanced(ends: Sequence[ReplicaEnd], epoch_of: Callable[[str], int]) -> ReplicaEnd:
    """The replica whose log is at least as up to date as every other's: the latest last-message epoch, then
    the longest (Raft's election rule, for message logs). Any majority holds every message a majority
    acknowledged, and this replica of it holds them all (docs/cluster.md, "Failover")."""
    if not ends:
        raise ValueError("no replica to choose from")
    return max(ends, key=lambda end: (last_epoch(end, epoch_of), end.next_id))


def shared_until(mine: ReplicaEnd, theirs: ReplicaEnd) -> int:
    """The first id at which ``mine`` may differ from ``theirs``: ``mine.next_id`` if ``theirs`` extends it
    (the same identity, or one that descends from mine); otherwise where the two part after the latest
    incarnation both descend from (1: nothing shared, the logs are unrelated).

    Within one incarnation an id names one message, so both logs hold the messages of an incarnation they
    share, up to the first ``until`` after it in either lineage. The shared ancestor may be neither log's
    own identity: two brokers that each took a new identity from the same log (one of them for a take-over
    that Raft did not accept) share what they held of it."""
    if mine.incarnation == theirs.incarnation:
        return mine.next_id  # one log: a shorter copy of it differs in nothing
    shared = LogIdentity(mine.incarnation, mine.lineage).shared_until(
        mine.next_id, LogIdentity(theirs.incarnation, theirs.lineage), theirs.next_id)
    return 1 if shared is None else shared


def positions_by_topic(state: ClusterState, nodes: Mapping[str, object]) -> dict[str, dict[str, int]]:
    """name hex -> node -> reported durable next id, for the nodes given (a view for STATS)."""
    out: dict[str, dict[str, int]] = {}
    for node in nodes:
        for name_hex, next_id in state.positions.get(node, {}).items():
            out.setdefault(name_hex, {})[node] = next_id
    return out
