"""Consensus through PySyncObj: membership, leader election and the cluster's replicated state.

Not ours to write: PySyncObj's Raft runs in a thread of its own (``autoTick``) and replicates a log of
commands; :class:`RaftNode` embeds it in the broker. The one thing that crosses from that thread to the
broker's loop is a call through ``loop.call_soon_threadsafe``: each applied command, which the loop applies
to a state of its own, or a copy of the whole state once a full dump was loaded (``on_state``), and a change
in who leads or how many brokers this one reaches (``on_role``). The loop submits commands with
:meth:`RaftNode.submit`, which only queues them (PySyncObj's queue is thread-safe) and reports the outcome the
same way, and asks for a leadership transfer with :meth:`RaftNode.transfer`, which PySyncObj's thread makes
on its next tick.

What PySyncObj's Raft lacks, this module adds around it: pre-vote (:mod:`broker.cluster.prevote`), a leader
that appends nothing others forward while its leadership transfer is under way (:meth:`RaftNode._receive`),
and a follower that cuts no entries it holds for an appendEntries that repeats them
(:mod:`broker.cluster.appends`).

Raft's own log lives in the data directory (``.cluster/raft.journal`` and ``.cluster/raft.dump``), so a
restarted broker keeps its term, its vote and the state. With CURVE on, PySyncObj's ``password`` option
encrypts and authenticates the Raft traffic (Fernet: AES-128-CBC with HMAC-SHA256, key derived from the
password with PBKDF2); see docs/cluster.md for what that protects and what not.

This module must not know about the engine, the store or mc0.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import logging
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, SyncObjConsumer, journal, replicated
from pysyncobj import pickle as pysyncobj_pickle

from broker.cluster.appends import without_held_entries
from broker.cluster.prevote import PreVote, raft_now
from broker.cluster.state import ClusterState
from broker.repeats import hold_repeats

log = logging.getLogger("mc0.cluster")
#: The loggers PySyncObj writes to.
PYSYNCOBJ_LOGGERS = ("pysyncobj.syncobj", "pysyncobj.serializer", "pysyncobj.dns_resolver")


@dataclass(frozen=True, slots=True)
class Role:
    """What this broker's Raft says now: whether it leads, which node it believes leads, and how many brokers
    of the cluster (itself included) it is connected to."""

    leading: bool
    leader: str | None
    reachable: int
    size: int
    #: On a leader: the followers whose Raft answered its appendEntries within the shortest election timeout
    #: (a broker restarted a moment ago has not, whatever Raft remembers of its log).
    answering: frozenset[str] = frozenset()


class _ReplicatedState(SyncObjConsumer):
    """The replicated object: one command method, applied in log order on every broker."""

    def __init__(self, applied: Callable[[tuple[Any, ...], ClusterState | None], None]) -> None:
        self._applied = applied
        self._unknown: set[tuple[Any, ...]] = set()  # kinds of command passed over, each said once
        super().__init__()  # what exists now is not serialized with the state (PySyncObj's rule)
        self.state = ClusterState()

    @replicated
    def command(self, command: tuple[Any, ...]) -> bool:
        try:
            changed = self.state.apply(command)
        except ValueError as error:
            # A command of a newer broker (a rolling upgrade): raised here, it would stop this member's Raft.
            # Passed over; applied when this member, upgraded, applies its journal again at its start.
            if command[:1] not in self._unknown:
                self._unknown.add(command[:1])
                log.warning("passing over a cluster command this broker does not know (%s): the member that "
                            "sent it runs a newer mc0; upgrade this one too", error)
            return False
        # The command alone: the loop applies it to its own state. A copy of the whole state for each would
        # cost each command time in proportion to the topics, under the GIL (4 ms at 500 topics, 45 at 5,000).
        self._applied(command, None)
        return changed

    def _deserialize(self, data: dict[str, Any]) -> None:
        super()._deserialize(data)  # a full dump loaded: the state as a whole
        self._applied(("snapshot",), self.state.copy())


class RaftStateError(Exception):
    """The Raft state on disk cannot be read back (:func:`check_state`)."""


def check_state(directory: Path) -> None:
    """RaftStateError if the Raft state PySyncObj keeps in ``directory`` exists but cannot be read back
    whole: its journal, the journal's term and vote, its full dump. PySyncObj does not check them itself,
    and what it does with a damaged one (below, for each) is worse than not starting. A missing file is a
    new member's: nothing to check."""
    _check_journal(directory / "raft.journal")
    _check_meta(directory / "raft.journal.meta")
    _check_dump(directory / "raft.dump")


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as error:
        raise RaftStateError(f"{path} cannot be read: {error.strerror}") from None


def _check_journal(path: Path) -> None:
    """The journal: a header that is not PySyncObj's, records that end past the file, a record whose two
    length fields disagree. PySyncObj stops at such a journal with a bare ``struct.error``, or reads zeros
    as records: a journal cut short by a crash or a power loss while it was written (it writes through a
    memory map, and pads a shorter file with zeros)."""
    data = _read(path)
    if data is None:
        return
    if len(data) < journal.FIRST_RECORD_OFFSET or not data.startswith(journal.APP_NAME):
        raise RaftStateError(f"{path} is not a PySyncObj journal ({len(data)} bytes)")
    (end,) = struct.unpack_from("<I", data, journal.LAST_RECORD_OFFSET_OFFSET)
    if end > len(data):
        raise RaftStateError(f"{path}: its records end at byte {end}, past its {len(data)} bytes (cut short)")
    at = journal.FIRST_RECORD_OFFSET
    while at < end:
        (size,) = struct.unpack_from("<I", data, at) if at + 4 <= end else (0,)
        if size < 16 or at + 8 + size > end or struct.unpack_from("<I", data, at + 4 + size)[0] != size:
            raise RaftStateError(f"{path}: the record at byte {at} is damaged")
        at += 8 + size


def _check_meta(path: Path) -> None:
    """The journal's term and vote (renamed into place without an fsync: a power loss can leave it empty),
    which PySyncObj reads as empty when it does not decode, forgetting this member's vote without a word."""
    data = _read(path)
    if data is None:
        return
    try:
        meta = journal.loads(data)
    except Exception as error:  # pickle raises many kinds for bytes that are not a pickle
        raise RaftStateError(f"{path} does not decode ({type(error).__name__})") from None
    if not isinstance(meta, dict):
        raise RaftStateError(f"{path} does not hold PySyncObj's term and vote")


def _check_dump(path: Path) -> None:
    """The full dump (Raft's snapshot: the state the journal's compacted entries made), which PySyncObj logs
    as failed to load and then goes on without: a state missing what was compacted (epochs among it)."""
    data = _read(path)
    if data is None:
        return
    try:
        # Whole, so that gzip checks its length and CRC too (a pickle read ends before them).
        pysyncobj_pickle.loads(gzip.decompress(data))  # as PySyncObj loads it
    except Exception as error:  # gzip, zlib, EOF and pickle errors alike mean a damaged dump
        raise RaftStateError(f"{path} does not decode ({type(error).__name__})") from None


def password_conf(password: str | None, timeout: float, directory: Path,
                  on_state_changed: Callable[[int, int], None]) -> SyncObjConf:
    """PySyncObj's settings: Raft timeouts scaled from ``timeout`` (the shortest election timeout, seconds),
    the journal and dump files in ``directory``, and the password when one is given."""
    directory.mkdir(parents=True, exist_ok=True)
    return SyncObjConf(
        password=password,
        raftMinTimeout=timeout,
        raftMaxTimeout=2 * timeout,
        appendEntriesPeriod=timeout / 5,
        # Each command and each commit goes to the followers at once, not at the next period (batching is
        # for thousands of commands a second; ours are a few, and a take-over waits on two of them: its
        # command reaching a majority, and the commit reaching the old leader, which then sends its clients
        # on). Measured (docs/cluster.md, "What it costs"): a hand-over's p50 went from 0.45 to 0.11 s.
        appendEntriesUseBatch=False,
        # A connection silent this long is dead; PySyncObj needs it at least raftMaxTimeout.
        connectionTimeout=max(2 * timeout, 1.0),
        # A member reconnects to one that was away at most an append period after it is back: pre-vote's
        # shortcut for a killed leader needs the two others connected to each other.
        connectionRetryTime=timeout / 5,
        # A leader that hears from no majority for this long steps down (PySyncObj's default is 30 s: a
        # partitioned leader would believe it leads for that long).
        leaderFallbackTimeout=2 * timeout,
        journalFile=str(directory / "raft.journal"),
        fullDumpFile=str(directory / "raft.dump"),
        useFork=False,  # a forked copy of a broker (ZeroMQ threads, open logs) is not something to make
        onStateChanged=on_state_changed,
        commandsWaitLeader=True,
        logCompactionMinEntries=10_000,
        dynamicMembershipChange=False,
    )


class RaftNode:
    """PySyncObj embedded in the broker: what the loop needs of it, and nothing that blocks the loop."""

    def __init__(
        self,
        node: str,
        peers: list[str],
        *,
        loop: asyncio.AbstractEventLoop,
        on_state: Callable[[tuple[Any, ...], ClusterState | None], None],
        on_role: Callable[[Role], None],
        directory: Path,
        timeout: float,
        password: str | None,
    ) -> None:
        self.node = node
        self.peers = [peer for peer in peers if peer != node]
        self.loop = loop
        self._on_state = on_state
        self._on_role = on_role
        self._last_role: Role | None = None
        # A leadership transfer the loop asked for, made by PySyncObj's thread on its next tick (its transport
        # belongs to that thread): the target node and the callback for the outcome.
        self._transfer: tuple[str, Callable[[bool], None]] | None = None
        self._consumer = _ReplicatedState(self._applied)
        conf = password_conf(password, timeout, directory, lambda _old, _new: self._tick())
        # PySyncObj logs a failure on every tick while it lasts (a traceback a second while its journal cannot
        # be written on a full disk): once a minute is enough.
        hold_repeats(*PYSYNCOBJ_LOGGERS)
        self._sync = SyncObj(node, self.peers, conf=conf, consumers=[self._consumer])
        # Before PySyncObj's first tick (its thread waits 0.1 s) and its first election deadline (timeout).
        self.prevote = PreVote(self._sync)
        # Until when (monotonic) a leadership transfer it asked for may be under way: see _receive.
        self._transferring_until = 0.0
        self._transport = self._sync._SyncObj__transport  # type: ignore[attr-defined]
        self._transport.setOnMessageReceivedCallback(self._receive)  # in front of pre-vote's
        self._sync.addOnTickCallback(self._tick)

    # ------------------------------------------------------------------------------ in PySyncObj's thread

    def _applied(self, command: tuple[Any, ...], state: ClusterState | None) -> None:
        self._post(self._on_state, command, state)

    def _tick(self) -> None:
        """Each Raft tick (every 50 ms): pre-vote's turn (broker.cluster.prevote), and tell the loop when the
        role or the reachable count changed."""
        prevote = getattr(self, "prevote", None)
        if prevote is None:
            return  # a state change while PySyncObj is being constructed
        prevote.tick()
        sync = self._sync
        transfer, self._transfer = self._transfer, None
        if transfer is not None:
            node, done = transfer

            def sent(_: Any, error: int) -> None:
                if error == FAIL_REASON.SUCCESS:
                    self._transferring_until = time.monotonic() + sync.conf.raftMaxTimeout
                self._post(done, error == FAIL_REASON.SUCCESS)

            sync.transferLeadership(node, sent)
        leader = sync._getLeader()
        reachable = 1 + sum(1 for peer in sync.otherNodes if sync.isNodeConnected(peer))
        leading = sync._isLeader()
        answering: frozenset[str] = frozenset()
        if leading:
            since = raft_now() - sync.conf.raftMinTimeout  # on PySyncObj's clock, as its response times
            answered = sync._SyncObj__lastResponseTime  # type: ignore[attr-defined] - no public accessor
            answering = frozenset(peer.id for peer in sync.otherNodes if answered.get(peer, 0) > since)
        role = Role(leading, None if leader is None else leader.id, reachable, 1 + len(self.peers), answering)
        if role != self._last_role:
            self._last_role = role
            self._post(self._on_role, role)

    def _receive(self, node: Any, message: Any) -> None:
        """Raft messages from the other brokers. An appendEntries overlapping entries this broker holds loses
        those entries, so PySyncObj cuts none it need not (:mod:`broker.cluster.appends`). While a transfer
        this leader asked for may be under way, a command another broker forwards is refused at once (Raft's
        rule for a leader handing over: the thesis, section 3.10): appended after the TimeoutNow left, it
        would make the target's log shorter than the others', they would refuse it their votes, and the
        hand-over would wait an election timeout. The sender's callback gets the refusal and the broker sends
        it again later (a join, a position report)."""
        if (isinstance(message, dict) and message.get("type") == "apply_command" and "request_id" in message
                and time.monotonic() < self._transferring_until and self._sync._isLeader()):
            self._transport.send(node, {"type": "apply_command_response", "request_id": message["request_id"],
                                        "error": FAIL_REASON.REQUEST_DENIED})
            return
        if isinstance(message, dict) and message.get("type") == "append_entries":
            entries = self._sync._SyncObj__raftLog  # type: ignore[attr-defined] - PySyncObj's own log
            first, last = entries[0][1], entries[-1][1]
            message = without_held_entries(
                message, last, lambda index: entries[index - first][2] if first <= index <= last else None)
        self.prevote.receive(node, message)

    def _post(self, callback: Callable[..., None], *arguments: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: the broker is stopping
            self.loop.call_soon_threadsafe(callback, *arguments)

    # ------------------------------------------------------------------------------------ from the loop

    def submit(self, command: tuple[Any, ...],
               done: Callable[[bool | None, str | None], None] | None = None) -> None:
        """Queue ``command`` for the Raft log; ``done(result, error)`` on the loop once it was applied
        (result: whether it changed the state) or failed (error says why)."""

        def callback(result: Any, error: int) -> None:
            if done is not None:
                why = None if error == FAIL_REASON.SUCCESS else _FAILURES.get(error, f"failure {error}")
                self._post(done, result, why)

        self._consumer.command(command, callback=callback)

    def transfer(self, node: str, done: Callable[[bool], None]) -> None:
        """Ask PySyncObj to hand Raft's leadership to ``node`` (Raft's TimeoutNow: ``node`` stands for
        election at once); ``done(sent)`` on the loop: False when it was refused (this node does not lead, or
        ``node``'s Raft log is not yet complete), True once the request went to ``node``."""
        self._transfer = (node, done)
        self._wake()

    def _wake(self) -> None:
        """Have PySyncObj's thread tick now, not at its next tick (every 50 ms: a hand-over waited 25 ms on
        average, and up to 50, before its TimeoutNow left). PySyncObj wakes itself so for each command
        submitted (its pipe notifier, there when entries are not batched, as here)."""
        notifier = getattr(self._sync, "_SyncObj__pipeNotifier", None)
        if notifier is not None:
            notifier.notify()

    def catching_up(self) -> bool:
        """Whether this broker's Raft has heard no leader since it started, or has yet to apply entries the
        leader said are committed: a broker back from a restart, whose state is its journal's (PySyncObj
        applies that at once) until the leader has told it what happened while it was away. Read from the
        loop while PySyncObj's thread writes them: two ints, each read whole."""
        told = self._sync._SyncObj__leaderCommitIndex  # type: ignore[attr-defined]
        return told is None or self._sync.raftLastApplied < told

    def close(self) -> None:
        self._sync.destroy()


_FAILURES = {
    FAIL_REASON.QUEUE_FULL: "the Raft command queue is full",
    FAIL_REASON.MISSING_LEADER: "no Raft leader",
    FAIL_REASON.DISCARDED: "discarded by a new Raft leader",
    FAIL_REASON.NOT_LEADER: "the Raft leader changed",
    FAIL_REASON.LEADER_CHANGED: "the Raft leader changed",
    FAIL_REASON.REQUEST_DENIED: "denied",
    FAIL_REASON.UNKNOWN_OUTCOME: "unknown outcome",
}
