"""Raft's pre-vote for PySyncObj: a broker that stops hearing its leader asks the others whether they would
vote for it before it stands for election (the Raft thesis, section 9.6; etcd's PreVote, Kafka's KIP-996).

Why: PySyncObj has none. A follower paused for longer than the election timeout (SIGSTOP, a stalled virtual
machine, swapping) comes back with its election deadline passed, and the leader has meanwhile given up its
connection to it (silent for ``connectionTimeout``). It stands for election at a higher term before it hears
from the leader again, the leader steps down on seeing that term, and the cluster elects again: a failover,
with every confirmation held for its length, for a leader that never failed. Measured: 8 of 8 follower
pauses of 2-5 s under load ended in an election. With pre-vote the resumed follower asks first, the others
still hear their leader and refuse, and nothing changes until the leader's messages reach it again.

What it owns: when this broker's Raft may start an election. It keeps the election deadline PySyncObj sets
(on hearing a leader, on granting a vote, on starting an election) and puts PySyncObj's own far in the future,
so PySyncObj never starts one by itself. When the deadline passes it sends ``pre_vote`` (the term it would
stand at, its last log index and term) to the others; each answers ``pre_vote_response`` granted if it is not
the leader, has not heard from a leader for the shortest election timeout, and the asker's log is at least as
up to date as its own (Raft's vote rule). No term changes and nothing is recorded. With a majority (itself
included) it hands the election back to PySyncObj, which stands at once; without one it asks again after
one or two append periods (a fifth of the shortest timeout each, at random), so a leader's death still costs
one election timeout, not two. And it makes a shortcut safe: when the leader's Raft connection closes (its
process is gone), the followers ask at once, one after the other in the order of their names, and grant each
other, being connected to that leader no more; a killed leader is replaced in about a tenth of a second
instead of 0.5-1 s. While that connection is closed a refused member asks again after a quarter of an append
period (the other often sees the same close a moment later). A member that grants a pre-vote waits a whole
election timeout before it asks itself, so that two rarely stand at once and split the votes; two that asked
at the same moment grant each other, and the one whose name sorts later withdraws. A leadership transfer
(Raft's TimeoutNow, which PySyncObj answers by zeroing the deadline) is left alone: the outgoing leader asked
for it, and the real votes are PySyncObj's as before.

Everything here runs in PySyncObj's thread: :meth:`PreVote.tick` from its tick callback, the message filter
from its transport. It reaches into PySyncObj's private attributes (name-mangled ``_SyncObj__*``); the
pyproject bounds PySyncObj to the versions this was tested with, and tests/cluster/test_cluster_prevote.py
fails if those names move. Every member of a cluster must run it: a member without it never answers
``pre_vote`` and so never helps another to a pre-vote majority (docs/cluster.md).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from typing import Any

from pysyncobj import SyncObj
from pysyncobj import monotonic as raft_clock

log = logging.getLogger("mc0.cluster")

#: PySyncObj's state code for a leader (pysyncobj.syncobj._RAFT_STATE.LEADER).
_LEADER = 2


def raft_now() -> float:
    """PySyncObj's clock, which its deadlines and response times are read on: ``CLOCK_MONOTONIC_RAW`` where
    there is one, not ``time.monotonic``. The two drift apart with the system's clock corrections (0.25 s in
    the first two hours of one machine here); a deadline taken from PySyncObj and compared with the other
    clock passed that much early or late."""
    return raft_clock.monotonic()  # type: ignore[no-any-return]


#: Where PySyncObj's own election deadline is kept: it never passes.
NEVER = float("inf")


class PreVote:
    """Pre-vote for one :class:`pysyncobj.SyncObj`; install it right after constructing the SyncObj."""

    def __init__(self, sync: SyncObj) -> None:
        self._sync = sync
        self.min_timeout: float = sync.conf.raftMinTimeout
        self.retry: float = sync.conf.appendEntriesPeriod
        self._deadline = raft_now() + self._timeout()
        self._heard = raft_now()  # the last time a leader's append_entries reached this broker
        self._asking: int | None = None  # the term a pre-vote in progress asks for
        self._granted: set[Any] = set()  # the other nodes that granted it
        self._quiet = False  # this broker's Raft has stopped hearing a leader (logged once)
        self._ever_heard = False  # a leader's append_entries reached it since it started
        self._gone = False  # the leader's Raft connection closed (seen once per closing)
        transport = sync._SyncObj__transport  # type: ignore[attr-defined]
        self._deliver: Callable[[Any, Any], None] = sync._SyncObj__onMessageReceived  # type: ignore[attr-defined]
        self._send: Callable[[Any, dict[str, Any]], bool] = transport.send
        transport.setOnMessageReceivedCallback(self.receive)
        self.asked = 0  # pre-votes this broker started (for tests and logs)
        self.elections = 0  # of those, how many won a majority and let PySyncObj stand
        self.leaders_gone = 0  # times the leader's Raft connection closed while this broker followed it
        # From now on: PySyncObj's first deadline may pass before its thread first ticks, and on a passed
        # deadline PySyncObj stands, without pre-vote, as soon as it connects to anyone (a restarted member
        # would unseat a leader the others still hear).
        self._set_deadline(NEVER)

    # --------------------------------------------------------------------------------- PySyncObj's state

    def _get(self, name: str) -> Any:
        return getattr(self._sync, f"_SyncObj__{name}")

    def _set_deadline(self, value: float) -> None:
        self._sync._SyncObj__raftElectionDeadline = value  # type: ignore[attr-defined]

    def _timeout(self) -> float:
        return self._get("generateRaftTimeout")()  # PySyncObj's own draw between its two timeouts

    def _log_position(self) -> tuple[int, int]:
        """(last log term, last log index): what Raft's vote rule compares."""
        return self._get("getCurrentLogTerm")(), self._get("getCurrentLogIndex")()

    # ------------------------------------------------------------------------------------------ the tick

    def tick(self) -> None:
        """Each Raft tick: take over a deadline PySyncObj set, and ask for pre-votes once it has passed."""
        now = raft_now()
        if self._get("raftState") == _LEADER:
            # It hears itself; stepping down, it waits a whole election timeout like any follower that just
            # heard a leader (not the deadline it last had as a follower, long passed).
            self._asking = None
            self._heard = now
            self._ever_heard = True
            self._deadline = now + self._timeout()
            # PySyncObj's deadline from before it led has long passed: once it steps down, this one counts.
            self._set_deadline(NEVER)
            return
        if self._hold():
            return
        if self.leader_gone():
            if not self._gone:
                # Ask soon, not after the election timeout. The followers saw the same connection close at
                # the same moment and tick in step from then on (PySyncObj ticks on each event, else every
                # 50 ms), so a random delay made two of them ask in the same tick in 6 of 30 kills, and
                # their votes split: an election timeout more. So they go in the order of their names, one
                # append period apart: the first asks at once, the next only if no election has reached it
                # by then (granting a vote gives PySyncObj a new deadline, which replaces this one).
                self._gone = True
                self.leaders_gone += 1
                self._deadline = min(self._deadline, now + self._rank() * self.retry)
        else:
            self._gone = False
        if now < self._deadline:
            return
        # Asked again after one or two append periods; soon while the leader's connection is closed: a member
        # that refused had not seen that close yet (it often comes a millisecond later), and a member
        # restarted a moment before may not be connected yet.
        self._deadline = now + (self.retry / 4 if self._gone else self.retry * (1 + random.random()))
        if not self._get("connectedToAnyone")():
            return
        if not self._quiet:  # once per silence: the others' answers decide, and it asks every append period
            self._quiet = True
            if self._gone:
                why = "the Raft leader's connection closed"
            elif not self._ever_heard:
                why = "no Raft leader heard since this broker started"
            else:
                why = f"no word from the Raft leader for {now - self._heard:.1f} s"
            log.info("%s: asking the other members whether they would elect this one (pre-vote)", why)
        self._asking = self._get("raftCurrentTerm") + 1
        self._granted = set()
        self.asked += 1
        last_term, last_index = self._log_position()
        message = {"type": "pre_vote", "term": self._asking, "last_log_term": last_term,
                   "last_log_index": last_index}
        for node in self._get("otherNodes"):
            self._send(node, message)
        self._count()

    def _hold(self) -> bool:
        """Keep a deadline PySyncObj set (it heard a leader, granted a vote or stood) as this one's, and put
        PySyncObj's where it never passes; whether it had set one. Any deadline, passed or not: one passed
        while this broker was connected to nobody (PySyncObj stands only when connected) is asked about first,
        like any other. But 0 is PySyncObj's to act on: a transfer's TimeoutNow, or an election pre-vote let
        through."""
        deadline = self._get("raftElectionDeadline")
        if deadline == NEVER:
            return False
        if deadline != 0:
            self._deadline = deadline
            self._set_deadline(NEVER)
            self._asking = None
        return True

    def _count(self) -> None:
        if self._asking is not None and 1 + len(self._granted) > (len(self._get("otherNodes")) + 1) / 2:
            log.debug("pre-vote granted by %s: standing for election at term %d",
                      ", ".join(sorted(node.id for node in self._granted)), self._asking)
            self._asking = None
            self.elections += 1
            self._set_deadline(0)  # PySyncObj's next tick stands for election

    # ---------------------------------------------------------------------------------------- messages

    def receive(self, node: Any, message: Any) -> None:
        """What PySyncObj's transport received from ``node``: pre-vote's own messages are answered or counted
        here, the rest go on to PySyncObj."""
        kind = message.get("type") if isinstance(message, dict) else None
        if kind == "pre_vote":
            granted = self.would_vote(message)
            log.debug("pre-vote for %s at term %d: %s", node.id, message["term"],
                      "granted" if granted else "refused")
            if granted and self._asking is not None and node.id < self._get("selfNode").id:
                # Both asked at once, and each grants the other: were both to stand, the votes would split
                # (an election timeout more). The name that sorts first goes on; this one withdraws, and
                # the answer to its own question, if it comes now, counts for nothing.
                self._asking = None
            self._send(node, {"type": "pre_vote_response", "term": message["term"], "granted": granted})
            return
        if kind == "pre_vote_response":
            if message["term"] == self._asking and message["granted"]:
                self._granted.add(node)
                self._count()
            return
        if kind == "append_entries" and message["term"] >= self._get("raftCurrentTerm"):
            self._heard = raft_now()
            self._ever_heard = True
            self._quiet = False
        self._deliver(node, message)
        # A deadline PySyncObj set on this message is taken now, not at the end of the next tick: PySyncObj
        # checks its deadline at the start of each tick, so one that passed meanwhile (the process stopped
        # right then) would be stood on without asking.
        if self._get("raftState") != _LEADER:
            self._hold()

    def _rank(self) -> int:
        """This broker's place, by name, among the members other than the leader it followed."""
        leader = self._get("raftLeader")
        me = self._get("selfNode").id
        names = sorted([me, *(node.id for node in self._get("otherNodes") if node != leader)])
        return names.index(me)

    def leader_gone(self) -> bool:
        """Whether the leader this follower last heard has closed its Raft connection: its process is gone
        (a killed process's sockets close at once; a paused or cut-off one's do not, and are left to the
        election timeout)."""
        leader = self._get("raftLeader")
        if leader is None or leader == self._get("selfNode"):
            return False
        return not self._sync.isNodeConnected(leader)

    def would_vote(self, message: dict[str, Any]) -> bool:
        """Raft's vote rule without its side effects, refused while this broker has a live leader: one it
        heard within the shortest election timeout and is still connected to."""
        if self._get("raftState") == _LEADER:
            return False
        if raft_now() - self._heard < self.min_timeout and not self.leader_gone():
            return False
        if (message["last_log_term"], message["last_log_index"]) < self._log_position():
            return False
        # It will stand: this broker waits a whole election timeout before it asks itself, so that the two
        # do not stand at once and split the votes.
        self._deadline = max(self._deadline, raft_now() + self._timeout())
        return True
