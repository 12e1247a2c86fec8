"""This broker as a member of a cluster: its role, the leader's majority gate, followers' copies, failover.

One leader serves the whole cluster: the Raft leader (:mod:`broker.cluster.raft`), once it has taken a new
epoch. What it does, and what it must not do, on the broker's loop:

* **Leading.** Every persistent topic is *gated* (:meth:`Engine.gate`): its readers get ids below the
  high watermark only (the first id not yet on a majority). Followers acknowledge by fetching; each FETCH
  from a replica moves that replica's position, the watermark follows (:func:`state.high_watermark`), and
  the gate with it (:meth:`Engine.release`). The mc0 door holds the OK of a confirmed publish to a strong
  topic until the gate covers its messages (:meth:`confirm`), and turns it into an ERROR when no majority
  takes them within ``cluster_commit_timeout``.
* **Following.** It refuses what only the leader may do (publishes, subscriptions, client FETCHes,
  declares) with an ERROR naming the leader (``LEADER``), and copies every persistent topic from the leader
  (:mod:`broker.cluster.replicator`).
* **Taking over.** When Raft makes it leader, it asks the other brokers what each topic holds, announcing the
  epoch it is about to take (they copy nothing from an older leader from then on), and needs a majority of
  answers (itself included). From the most up-to-date replica of each topic (:func:`state.most_advanced`)
  it copies what it lacks, after cutting any suffix of its own that replica does not share. Then every
  topic's log gets a successor identity at its next id, and the ``take_over`` command bumps the epoch with
  them. It serves once that command is applied. docs/cluster.md says why no majority-acknowledged message is
  lost and no id reused.
* **Handing over.** A leader asked to stop, or one that cannot write a replicated topic (a full disk), hands
  Raft's leadership to the follower that acknowledged the most (:meth:`hand_over`, :meth:`after_flush`).

This module holds the cluster's policy; it must not reach into the engine's or the store's internals beyond
the hooks they offer (gate, release, append_replicated, truncate, set_identity) nor speak PySyncObj itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import itertools
import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import zmq.asyncio

from broker.cluster.link import Link, LinkError, open_link
from broker.cluster.raft import RaftNode, RaftStateError, Role, check_state
from broker.cluster.replicator import PULSE_MS, Replicator, record_producers, restart_behind
from broker.cluster.state import (
    ClusterState,
    ReplicaEnd,
    high_watermark,
    majority,
    most_advanced,
    shared_until,
)
from broker.config import BrokerConfig
from broker.engine import Engine, EngineError, Topic
from broker.store import LogIdentity, StoreError, SyncFailed
from broker.store.files import FileStore, spec_from_json, spec_to_json
from broker.store.making import MAKE_AHEAD
from broker.topics import Sync
from broker.zmtp_door import PeerMetadata
from connector import keys
from protocol import ProtocolError, mc0

log = logging.getLogger("mc0.cluster")

#: Seconds after which a follower whose Raft was still applying the leader's log looks at the state again.
SETTLE_AGAIN = 0.02
#: Seconds between reports of this broker's durable positions to the replicated state (coarse on purpose:
#: a Raft command per message would cost a round trip per message; the positions are for STATS and people).
REPORT_EVERY = 2.0
#: Seconds a join command may take before the broker sends another (one that got no answer at all).
JOIN_WAIT = 5.0
#: Seconds after it starts, or after it lost its majority, during which a member that reaches no majority
#: tells clients to try again rather than refusing for good: its Raft connects to the others meanwhile
#: (PySyncObj tries every append period).
STARTING_FOR = 3.0
#: Seconds a reachable majority may have no leader before the log says so: long enough for an election
#: after a restart, short enough to be seen.
SILENT_AFTER = 10.0
#: Seconds a new leader waits for each other broker's answer while it takes over.
ASK_TIMEOUT = 1.0
#: Topics a new leader asks each other broker about at once (one request each, all in flight together).
ASK_AT_ONCE = 256
#: Milliseconds a client is told to wait before it sends a command again while a leader is being chosen.
RETRY_MS = 100
#: The same while this broker hands the cluster over, which takes tens of milliseconds.
HAND_OVER_RETRY_MS = 25
#: Seconds a leader asked to stop may spend handing the cluster over (:meth:`Cluster.hand_over`) before it
#: stops anyway: then the others elect a leader once it is gone, as after a crash.
HAND_OVER_SECONDS = 5.0
#: Seconds a broker that handed the cluster over still answers its clients (naming the new leader) before it
#: stops: the others learn of the new leader within a Raft commit, a few milliseconds.
HAND_OVER_LINGER = 0.2
#: Seconds between a leader's requests to hand Raft's leadership over (refused while the target's Raft log
#: is not complete yet).
HAND_OVER_RETRY = 0.05
#: Seconds after a member handed the cluster (or Raft's leadership) over because it could not write (a full
#: disk) before it does so again: elected again meanwhile, it leads (or tries to take over again), refusing
#: what it cannot store, rather than have the members pass the leadership round while every disk is full.
UNWRITABLE_AGAIN = 30.0
#: Verbs a follower refuses (the leader serves them): what reads or writes topics.
LEADER_ONLY = (mc0.Put, mc0.Puts, mc0.Sub, mc0.Declare, mc0.Delete, mc0.Ack)


def raft_password(config: BrokerConfig) -> str | None:
    """The password of the Raft traffic: with CURVE on, derived from the cluster's shared broker secret key
    and the cluster's name; with CURVE off, ``cluster_secret`` (or none: Raft in the clear)."""
    if config.curve:
        secret = (Path(config.keys_dir) / "broker.key_secret").read_bytes()
        material = b"mc0 cluster raft\0" + config.cluster_name.encode() + b"\0" + secret
        return hashlib.sha256(material).hexdigest()
    return config.cluster_secret or None


class Cluster:
    """The cluster as this broker's door, engine and hub see it (:class:`broker.router.ClusterGate`)."""

    def __init__(self, config: BrokerConfig, engine: Engine, store: FileStore, schedule: Callable[[], None],
                 flush: Callable[..., None], fail: Callable[[BaseException], None],
                 context: zmq.asyncio.Context, endpoint: str) -> None:
        self.config = config
        self.engine = engine
        self.store = store
        self.schedule = schedule  # the hub's flush soon: released OKs and reads go out
        self.flush = flush  # the hub's flush now (a follower commits what it copied before acknowledging)
        self.fail = fail  # the hub's: stop the broker (a follower's fsync failed)
        self.context = context
        self.node = config.cluster_node
        self.endpoint = config.advertised(endpoint)
        self.size = 1 + len(config.cluster_peers)
        self.commit_timeout = config.cluster_commit_timeout
        # The CURVE key the other members connect with (the brokers' shared pair); None with CURVE off.
        self.member_key = keys.broker_pair(Path(config.keys_dir)).public if config.curve else None
        self.state = ClusterState()
        self.role = Role(False, None, 1, self.size)
        self.started = time.monotonic()  # a member that reaches no majority yet may only be starting
        # ... or, when it lost its majority a moment ago, reconnecting (it was paused, and the others gave up
        # on its connections; or they restarted).
        self.majority_lost_at: float | None = None
        self.serving = False  # leading an epoch this broker took
        self.handing_over = False  # asked to stop, or unable to write: it takes no more publishes (hand_over)
        self.stopping = False  # asked to stop (hand_over("stopping"))
        self._unwritable_until = -math.inf  # no hand-over for failed writes before then (UNWRITABLE_AGAIN)
        self._serving_since = -math.inf  # when this broker last began to serve (_serve)
        self._handing: asyncio.Task[None] | None = None  # the hand-over a failed write started
        self._changed = asyncio.Event()  # set, while handing over, when the state or a position moves
        self.fence = 0  # the highest epoch a new leader announced: nothing copied from an older one
        self.taking_over: asyncio.Task[None] | None = None
        self._taking: tuple[int, dict[str, str]] | None = None  # its last take-over's _take_over_key
        self.replicator: Replicator | None = None
        self.positions: dict[bytes, dict[str, int]] = {}  # topic -> replica -> next id it acknowledged
        self.heard: dict[str, float] = {}  # member -> when (monotonic) its last REPLICA fetch arrived
        self.copied_before = 0  # records copied by the replicators closed so far (stats: a running total)
        self.raft: RaftNode | None = None
        # A join command on its way (the loop's clock until which it is awaited): one at a time, so that a
        # broker just started adds no stream of them to Raft's log (each can fail a hand-over: _report).
        self._join_until = -math.inf
        self.reported: dict[str, int] = {}
        self.reported_acked: dict[str, tuple[str, int]] = {}  # the queues' positions this leader reported
        self.takeovers = 0
        # Called once a leader is known after this broker stopped leading, with that leader's endpoint: the
        # doors send their clients there (broker.server sets it).
        self.on_demoted: Callable[[str | None], None] | None = None
        # Called when this broker leads again, in a new epoch, and no other leader was known since it
        # stopped (so on_demoted never sent its clients on), with its own endpoint: its subscribers subscribe
        # again, under the new epoch's log identities (broker.server sets it).
        self.on_leading_again: Callable[[str], None] | None = None
        self._demoted = False
        self.closed = False
        self.raft_directory = directory = Path(config.data_dir) / ".cluster"  # PySyncObj's files
        try:  # before anything starts: damaged Raft state is a one-line error, not what PySyncObj makes of it
            check_state(directory)
        except RaftStateError as error:
            raise StoreError(f"Raft's state: {error}. Move {directory} away and start this broker again: "
                             "it then starts as a new member and copies every topic from the leader "
                             "(docs/cluster.md, \"A member's disk is replaced\")") from None
        # Since when a reachable majority has had no leader, and whether the log said so (see _watch).
        self._leaderless_since: float | None = None
        self._said_leaderless = False
        self.members = tuple(sorted((self.node, *config.cluster_peers)))  # as this broker was started with
        self._said_members: set[str] = set()  # members whose list differs, said (see on_state)
        self._settle_due = False  # _settle is scheduled (after the state commands waiting on the loop)
        self._topics_changed = False  # a command since the last _settle may have named new topics
        # The topics the state names that this member has no copy of yet, in the state's order, with their
        # settings (None: to be counted again from the state, see _count_lacking).
        self._lacking: dict[bytes, Any] | None = None
        # The identity the leader gave each topic it made lately (from Raft's "topic" command), until this
        # member makes its copy with it.
        self._leader_identities: dict[bytes, LogIdentity] = {}
        engine.on_persistent = self.on_persistent
        engine.retention_floor = self.retention_floor
        # A reader may name an epoch's identity that no log kept: its leader died before it wrote anything.
        engine.lineage_of = lambda name, incarnation: self.state.lineage_of(name.hex(), incarnation)

    # ------------------------------------------------------------------------------------------ running

    async def run(self) -> None:
        """Start Raft, join, and report positions until cancelled."""
        loop = asyncio.get_running_loop()
        directory = self.raft_directory
        password = raft_password(self.config)
        new = not (directory / "raft.journal").exists()
        self.raft = await asyncio.to_thread(
            RaftNode, self.node, list(self.config.cluster_peers), loop=loop, on_state=self.on_state,
            on_role=self.on_role, directory=directory, timeout=self.config.cluster_timeout, password=password)
        log.info("cluster member %s (mc0 at %s) with %s; Raft traffic %s", self.node, self.endpoint,
                 ", ".join(self.config.cluster_peers), "encrypted" if password else "in the clear")
        if new:
            log.info("no Raft state in %s: this member starts new (a first start, or a replaced disk) and "
                     "copies every persistent topic from the leader", directory)
        if not password:
            log.warning("Raft traffic is unauthenticated (CURVE off, no cluster_secret): anything that "
                        "reaches %s can run code in this broker; allowed on loopback only, for trying a "
                        "cluster out", self.node)
        try:
            while True:
                if not self.joined and loop.time() >= self._join_until:
                    self._join_until = loop.time() + JOIN_WAIT
                    self.raft.submit(("join", self.node, self.endpoint, self.members), self._joined)
                self._report()
                self._watch(time.monotonic())
                await asyncio.sleep(REPORT_EVERY if self.joined else 0.2)
        finally:
            self.close()

    @property
    def joined(self) -> bool:
        """Whether the cluster's state names this broker's mc0 endpoint (after a restart, usually at once:
        the state comes back from Raft's journal)."""
        return self.state.endpoints.get(self.node) == self.endpoint

    def _joined(self, result: bool | None, error: str | None) -> None:
        self._join_until = -math.inf  # applied or failed: the loop asks again if the state lacks it

    def _report(self) -> None:
        if self.handing_over:
            # No Raft entry of its own while it hands over: one appended after Raft's TimeoutNow left makes
            # the target's log shorter than this one's, the target's election fails, and the hand-over waits
            # an election timeout (the other members' commands it refuses meanwhile: RaftNode._receive).
            return
        logs = [topic for topic in self.engine.topics.values() if topic.log is not None]
        self._submit_changed(self.reported, {topic.name.hex(): topic.committed_id for topic in logs},
                             lambda changed: ("positions", self.node, changed))
        if self.serving:
            # The queues' positions, which the followers take, and a new leader (_serve): what consumers acked
            # in the last report's interval is all a failover hands out again.
            queues = {topic.name.hex(): (topic.log.identity.incarnation, topic.log.acked_watermark)
                      for topic in logs if topic.round_robin and topic.log is not None}
            self._submit_changed(self.reported_acked, queues, lambda changed: ("acked", changed))

    def _submit_changed(self, reported: dict[str, Any], values: dict[str, Any],
                        command: Callable[[dict[str, Any]], tuple[Any, ...]]) -> None:
        """Submit to Raft's log the ``values`` that changed since they were last ``reported``."""
        changed = {name: value for name, value in values.items() if reported.get(name) != value}
        if not changed or self.raft is None or not self.joined:
            return
        reported.update(changed)

        def applied(_: bool | None, error: str | None) -> None:
            if error is not None:  # not applied (the leader changed, or handed over): again next time
                for name, value in changed.items():
                    if reported.get(name) == value:
                        del reported[name]

        self.raft.submit(command(changed), applied)

    def _watch(self, now: float) -> None:
        """Say once (and once when it is over) that a reachable majority has had no leader for SILENT_AFTER:
        the members' lists disagree, typically (a broker started with a list that does not name the leader
        never hears it)."""
        if self.role.leader is not None or not self._majority_in_reach():
            if self._said_leaderless and self.role.leader is not None:
                log.info("a Raft leader again: %s", self.role.leader)
            self._leaderless_since, self._said_leaderless = None, False
            return
        if self._leaderless_since is None:
            self._leaderless_since = now
        elif now - self._leaderless_since >= SILENT_AFTER and not self._said_leaderless:
            self._said_leaderless = True
            log.warning("no Raft leader for %.0f s though %d of %d members are reachable: every member must "
                        "name the same brokers (this one is %s, with %s)", now - self._leaderless_since,
                        self.role.reachable, self.size, self.node, ", ".join(self.config.cluster_peers))

    def close(self) -> None:
        self.closed = True
        for task in (self.taking_over, self._handing):
            if task is not None:
                task.cancel()
        self._stop_copying()
        if self.raft is not None:
            self.raft.close()
            self.raft = None

    # ------------------------------------------------------------------------------- what Raft tells us

    def on_role(self, role: Role) -> None:
        had_majority = self._majority_in_reach()
        self.role = role
        if had_majority and not self._majority_in_reach():
            self.majority_lost_at = time.monotonic()
        self._changed.set()
        # A leader handing the cluster over that Raft elects again (its target lost the election) does not
        # take over: it hands leadership on again (hand_over).
        if role.leading and not self.serving and self.taking_over is None and not self.handing_over:
            self.taking_over = asyncio.get_running_loop().create_task(self._take_over(), name="take over")
        if not role.leading and self.serving:
            # PySyncObj may still name this broker for a tick after it stopped leading.
            self._step_down(f"Raft elected {role.leader if role.leader != self.node else 'nobody yet'}")

    def on_state(self, command: tuple[Any, ...], snapshot: ClusterState | None = None) -> None:
        """Raft applied ``command``: this broker's copy of the state takes it too (in the same order, so it
        stays what Raft's thread holds), or, with a full dump loaded, becomes ``snapshot``."""
        before = self.state.epoch
        if snapshot is not None:
            self.state = snapshot
        else:
            self.state.apply(command)
        state = self.state
        self._changed.set()
        kind = command[0]
        if kind == "take_over" and state.leader != self.node and self.serving:
            self._step_down(f"{state.leader} took epoch {state.epoch}")
        # Only the take-over this broker submitted as Raft's leader now: a restarted broker replays its
        # journal, whose last take-over may be its own, of an epoch long over (it served a moment on that
        # once, and could confirm a weak publish as leader of nothing), and one elected again applies that
        # old command once its leadership's first entry is committed. Serving that epoch again, it would
        # write new messages under ids its old log identity had given messages its followers may hold (what
        # it wrote ahead of its fsync when its machine went down): a new take-over compares the replicas.
        if (kind == "take_over" and state.leader == self.node and state.epoch != before and not self.serving
                and self.role.leading and self._taking == _take_over_key(command)):
            self._serve()
        if kind in ("topic", "snapshot", "take_over"):
            self._topics_changed = True
        if kind in ("snapshot", "take_over"):
            self._lacking = None
        elif kind == "topic" and self._lacking is not None and command[1] in state.topics:
            self._lacking[bytes.fromhex(command[1])] = state.topics[command[1]]
        elif kind == "forget_topic":
            if self._lacking is not None:
                self._lacking.pop(bytes.fromhex(command[1]), None)
            self.engine.forget_ahead([bytes.fromhex(command[1])])
        if kind == "topic" and len(command) > 4 and not self.serving:
            self._leader_identities[bytes.fromhex(command[1])] = LogIdentity(
                command[3], tuple((old, until) for old, until in command[4]))
        if kind == "forget_topic":
            self._leader_identities.pop(bytes.fromhex(command[1]), None)
        if kind == "forget_topic" and len(command) > 2 and not self.serving:
            self._delete_copy(bytes.fromhex(command[1]), command[2])
        if kind in ("acked", "snapshot") and not self.serving:
            # A report, or a dump loaded (a member back after Raft compacted what it missed: the leader
            # reports only what changes, so an idle queue's position comes in the dump alone).
            positions = command[1] if kind == "acked" else state.acked
            if any([self._take_queue_position(bytes.fromhex(name_hex), incarnation, last)
                    for name_hex, (incarnation, last) in positions.items()]):
                self.schedule()  # written with the next commit
        if kind == "join" and len(command) > 3:
            self._compare_members(command[1], tuple(command[3]))
        if state.leader not in (self.node, None):
            # Once the commands Raft applied meanwhile have all reached the loop (they come in bursts: a
            # restarted broker's Raft applies its whole journal at once, and following each take-over in it
            # in turn started a copy from every leader the cluster ever had, each fetching with its epoch).
            self._settle_soon()

    def _settle_soon(self) -> None:
        if not self._settle_due:
            self._settle_due = True
            asyncio.get_running_loop().call_soon(self._settle)

    def _compare_members(self, node: str, members: tuple[str, ...]) -> None:
        """A member joined naming the cluster's members: if not as this one was started with, the two count
        majorities of different clusters. Said once for each member whose list differs (every member that
        applies the join says it, the leader among them)."""
        if tuple(sorted(members)) == self.members or node in self._said_members:
            return
        self._said_members.add(node)
        log.error("member %s was started with the members %s, this one with %s: every member must name the "
                  "same brokers (cluster_node and cluster_peers), or they count majorities of different "
                  "clusters", node, ", ".join(sorted(members)), ", ".join(self.members))

    def _settle(self) -> None:
        """What the latest state asks of a follower: copy from its leader, every topic it names."""
        state = self.state
        if state.leader in (self.node, None) or self.closed:
            self._settle_due = False
            return
        if self.raft is not None and self.raft.catching_up():
            # More of Raft's log is on its way (the leader sends it a batch at a time): the leader its end
            # names is the one to follow, not each one before it. Looked at again shortly even if no
            # command of ours comes (Raft's own entries reach no on_state).
            asyncio.get_running_loop().call_later(SETTLE_AGAIN, self._settle)
            return
        self._settle_due = False
        self._follow()
        if self._topics_changed and self.replicator is not None:
            if self._lacking is None:
                self._lacking = self._count_lacking(self.replicator)
            if not self._copy_lacking(self._lacking, self.replicator):
                return
        self._topics_changed = False

    def _count_lacking(self, replicator: Replicator) -> dict[bytes, Any]:
        """The topics the state names that this member has no copy of, with their settings, in the state's
        order; those it has are copied from the leader (``replicator``)."""
        lacking = {}
        for name_hex, spec in self.state.topics.items():
            name = bytes.fromhex(name_hex)
            if name in self.engine.topics:
                replicator.follow(name)
            else:
                lacking[name] = spec
        return lacking

    def _copy_lacking(self, lacking: dict[bytes, Any], replicator: Replicator) -> bool:
        """Make the copies this member lacks, as many as a turn may, and copy each from the leader. False if
        some are left for later: the next turn, or a maker thread's call once the next one's log is made."""
        engine = self.engine
        mark = engine.creation_mark()
        self._make_ahead(lacking)
        made = []
        try:
            for name, spec in lacking.items():
                if name not in engine.topics:
                    if not engine.ready(name):
                        return False  # its log is still being made: the maker's call settles again
                    if engine.made_enough(mark):
                        # Each new copy costs fsyncs: a few at a time, the loop free in between (Raft's
                        # callbacks, the copies' fetches, a burst of hundreds of topics the leader made).
                        self._settle_soon()
                        return False
                    self._ensure_topic(name, spec)
                replicator.follow(name)
                if name in engine.topics:
                    made.append(name)  # (one that could not be made is tried again when the state changes)
        finally:
            for name in made:
                del lacking[name]
        return True

    def _make_ahead(self, lacking: dict[bytes, Any]) -> None:
        """Have the store make the logs of the next copies this member lacks in its threads
        (:meth:`Engine.make_ahead`), with the settings and identity their creation will give them."""
        engine = self.engine
        done = functools.partial(self._made_ahead, asyncio.get_running_loop())
        for name, spec in itertools.islice(lacking.items(), MAKE_AHEAD):
            if name not in engine.topics:
                with contextlib.suppress(ValueError, TypeError):  # unreadable settings: _ensure_topic says so
                    engine.make_ahead(name, done, spec_from_json(spec), self._leader_identities.get(name))

    def _made_ahead(self, loop: asyncio.AbstractEventLoop) -> None:
        """From a maker thread: a copy's log is made; settle again on the loop."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: the broker is stopping
            loop.call_soon_threadsafe(self._settle_soon)

    # --------------------------------------------------------------------------------------- following

    def _follow(self) -> None:
        endpoint = self._leader_endpoint()
        if endpoint is None:
            return  # no other leader yet (this broker led the epoch the state still names)
        if self.taking_over is not None and not self.taking_over.done():
            return
        if self._demoted and self.on_demoted is not None:
            self._demoted = False
            self.on_demoted(endpoint)
        current = self.replicator
        if current is not None and current.epoch == self.state.epoch and current.link.endpoint == endpoint:
            return
        self._stop_copying()
        self.replicator = Replicator(self.engine, self._link(endpoint), node=self.node,
                                     epoch=self.state.epoch, flush=self.flush, fail=self.fail,
                                     set_identity=self.store.set_identity,
                                     fenced=lambda: self.fence)
        for topic in list(self.engine.topics.values()):
            if topic.log is not None:
                self.replicator.follow(topic.name)
        self._topics_changed = True  # the copies this member lacks: made by _settle, a few at a time
        self._settle_soon()
        log.info("following %s (%s), epoch %d", self.state.leader, endpoint, self.state.epoch)

    def _link(self, endpoint: str) -> Link:
        """An mc0 link to another member (its advertised ``endpoint``), with the broker's keys when CURVE is
        on, on the wire ``mc0_engine`` chooses."""
        keys_dir = Path(self.config.keys_dir) if self.config.curve else None
        return open_link(self.context, endpoint, keys_dir, self.config.mc0_engine)

    def _stop_copying(self) -> None:
        if self.replicator is not None:
            self.copied_before += self.replicator.copied
            self.replicator.close()
            self.replicator = None

    def _ensure_topic(self, name: bytes, spec: dict[str, Any]) -> None:
        identity = self._leader_identities.pop(name, None)
        if name in self.engine.topics:
            return
        try:
            # With the leader's identity, if Raft's log said it: a new copy that does not first take a fresh
            # one, then the leader's (two fsyncs more, a quarter of what making a copy costs).
            self.engine.declare(name, spec_from_json(spec), identity)
        except (EngineError, ValueError, TypeError):
            with contextlib.suppress(EngineError):
                self.engine.topic(name)

    def _leader_endpoint(self) -> str | None:
        """The mc0 endpoint of the cluster's leader when that is another broker, None when unknown."""
        if self.state.leader == self.node:
            return None
        return self.state.endpoints.get(self.state.leader or "")

    def leader(self) -> bytes | None:
        if self.serving:
            return None
        endpoint = self._leader_endpoint()
        return endpoint.encode() if endpoint else None

    def tcp_refusal(self) -> str | None:
        """Why a TCP door of this broker takes no connection now (a follower's doors: one line in its log)."""
        if self.serving and not self.handing_over:
            return None
        if self.serving:
            return "this broker is stopping and hands the cluster over to another member"
        endpoint = self._leader_endpoint()
        return ("this broker does not lead the cluster: the TCP doors are the leader's"
                + (f" (mc0 at {endpoint})" if endpoint else ""))

    def _starting(self) -> bool:
        return time.monotonic() - self.started < STARTING_FOR

    def _reconnecting(self) -> bool:
        lost = self.majority_lost_at
        return lost is not None and time.monotonic() - lost < STARTING_FOR

    def _no_leader(self) -> str:
        """Why this broker, which does not lead, cannot name a leader to go to."""
        if self.role.leader == self.node:
            return "it was just elected and is catching up from the replicas: try again in a moment"
        if not self._majority_in_reach():
            if self._starting():
                return "it started a moment ago and is connecting to the other members: try again in a moment"
            if self._reconnecting():
                return ("it lost the other members a moment ago and is connecting to them again: try "
                        "again in a moment")
        return (f"no leader is known ({self.role.reachable} of {self.size} brokers reachable): try again "
                "once a majority is")

    def refusal(self, event: mc0.Event, redirected: bool) -> mc0.Error | None:
        """A follower's answer to what only the leader serves: ERROR with the leader's endpoint. A leader
        handing the cluster over gives the same answer, without an endpoint yet; and so does a leader to a
        client it named another leader to lately (``redirected``: what that client had in flight here is
        not stored, it goes to the leader it was named)."""
        if self.serving and not self.handing_over and not redirected:
            return None
        if isinstance(event, LEADER_ONLY) or (type(event) is mc0.Fetch and event.replica is None):
            endpoint = self._leader_endpoint()
            if self.serving and self.handing_over:
                text = ("this broker does not lead the cluster (it is stopping and hands the cluster over to "
                        "another member: try again in a moment)")
            elif self.serving:
                endpoint = self.endpoint
                text = (f"this connection was sent to another leader before this broker ({endpoint}) led the "
                        "cluster: commands go on a new connection")
            else:
                where = f"the leader is {endpoint}" if endpoint else self._no_leader()
                text = f"this broker does not lead the cluster ({where})"
            # Without a leader to name but with a majority in reach, a leader is being chosen or is taking
            # over, which is short: the client is told when to ask again. A minority's refusal is final,
            # unless this broker has only just started or lost its majority a moment ago (its Raft
            # connections are being made): a client that knows other members tries them meanwhile.
            electing = self._majority_in_reach() or self._starting() or self._reconnecting()
            retry_ms = HAND_OVER_RETRY_MS if self.serving and self.handing_over else RETRY_MS
            return mc0.leader_error(text, endpoint.encode() if endpoint else None, getattr(event, "id", None),
                                    retry_ms=retry_ms if electing else None)
        return None

    def unready(self) -> str | None:
        """Why clients can get nothing done through this broker now (the monitoring's /readyz), or None: it
        leads, or it follows a leader it can send them to."""
        if self.serving or self._leader_endpoint() is not None:
            return None
        return f"this broker does not lead the cluster and cannot name a leader ({self._no_leader()})"

    # ----------------------------------------------------------------------------------------- leading

    def _serve(self) -> None:
        self.serving = True
        self._serving_since = time.monotonic()
        self.positions.clear()
        self.heard.clear()
        self.reported_acked.clear()
        self._stop_copying()
        for topic in list(self.engine.topics.values()):
            if topic.log is not None:
                self.engine.gate(topic, 1)
                self._register(topic)
                # Where the last leader's consumers were: a follower took the reports as they came, but
                # maybe not all (it had not copied every message acked yet).
                position = self.state.acked.get(topic.name.hex())
                if position is not None and self._take_queue_position(topic.name, *position):
                    log.info("queue %r goes on after id %d, where the last leader's consumers were",
                             topic.name.decode("utf-8", "replace"), position[1])
        log.info("leading the cluster: epoch %d, mc0 at %s", self.state.epoch, self.endpoint)
        if self._demoted:
            self._demoted = False
            if self.on_leading_again is not None:
                self.on_leading_again(self.endpoint)
        self.schedule()

    def _take_queue_position(self, name: bytes, incarnation: str, last: int) -> int:
        """A persistent round-robin topic goes on where the leader's consumers were, as the leader reported
        it (``acked``): every id up to ``last`` of the log ``incarnation`` is acked here too. Only in that
        log: a restarted member's Raft applies its whole journal again, and a topic of that name made again
        since is another log. Returns how many ids it acked."""
        local = self.engine.topics.get(name)
        if local is None or local.log is None or not _same_log(local.log.identity, incarnation):
            return 0
        return self.engine.ack_through(name, last)

    def after_flush(self) -> None:
        """After each turn of the hub: a leader whose commit of a replicated topic failed (its disk is full,
        say) hands the cluster to a follower that can store what it cannot, as Kafka moves the leadership
        of partitions off a failed log directory and a JetStream server steps down on a storage error."""
        failed = self.engine.failed
        if not failed:
            return
        unwritable = [name for name in failed if self._hands_over_for(name)]
        if not unwritable:
            return
        self._unwritable_until = time.monotonic() + UNWRITABLE_AGAIN
        # Recorded before the hand-over (a member's Raft log must be complete to be handed Raft's leadership):
        # the member elected then knows why, and does not hand the cluster on if it cannot write either.
        assert self.raft is not None  # _hands_over_for: only a broker in a Raft cluster hands over
        self.raft.submit(("unwritable", self.state.epoch))
        log.warning("this leader cannot store topic %r (%s): handing the cluster to a follower",
                    unwritable[0].decode("utf-8", "replace"), failed[unwritable[0]])
        self._handing = asyncio.get_running_loop().create_task(self._hand_over_and_go_on(),
                                                               name="hand over: cannot write")

    def _hands_over_for(self, name: bytes) -> bool:
        """Whether a commit that failed to store ``name`` makes this broker hand the cluster over (after
        :meth:`after_flush`): it leads and is not handing over yet, the topic is replicated, it has not
        handed over for a failed write within UNWRITABLE_AGAIN, and it was not handed the cluster within
        UNWRITABLE_AGAIN by a leader that could not write (the members would pass the leadership round while
        every disk is full)."""
        if not self.serving or self.handing_over or self.raft is None:
            return False
        now = time.monotonic()
        if now < self._unwritable_until:
            return False
        state = self.state
        if 0 < state.unwritable_epoch == state.epoch - 1 and now < self._serving_since + UNWRITABLE_AGAIN:
            return False  # handed the cluster just now by a leader that could not write: all disks full?
        topic = self.engine.topics.get(name)
        return topic is not None and topic.visible_until is not None

    def unstored_retry_ms(self, name: bytes) -> int | None:
        """RETRY-AFTER for a publish this turn's commit could not store in ``name``, when that failure hands
        the cluster over: the client sends it again, to the next leader (nothing of it was stored here), as
        it does a publish refused while a leader hands over. None when the refusal is final."""
        return HAND_OVER_RETRY_MS if self._hands_over_for(name) else None

    async def _hand_over_and_go_on(self) -> None:
        """:meth:`hand_over`, by a broker that goes on running: a follower of the new leader, or the leader
        still if nobody could take it."""
        try:
            await self.hand_over("cannot write")
        finally:
            self._handing = None
            if not self.stopping:  # a stop that came meanwhile hands over on its own, taking nothing more
                self.handing_over = False

    async def hand_over(self, why: str = "stopping") -> None:
        """A leader asked to stop hands the cluster to a follower first, so that its clients carry on at once
        instead of after an election timeout. It takes no more publishes (refusing them with RETRY-AFTER:
        nothing stored, the clients send them again), waits until what it wrote is on a majority (so every
        held OK goes out as an OK), asks Raft to hand leadership to the follower that acknowledged the most
        (PySyncObj's transferLeadership: Raft's TimeoutNow, an election at once), and waits for that
        follower's take-over, whose questions it still answers. By then it has stepped down and sent its
        clients to the new leader. At most HAND_OVER_SECONDS; a follower, or a leader with no follower to
        hand to, stops at once. ``why`` is for the log: a leader that cannot write hands over the same way
        and goes on running (:meth:`after_flush`)."""
        stopping = why == "stopping"
        self.stopping = self.stopping or stopping
        if not self.serving or self.raft is None:
            return
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + HAND_OVER_SECONDS
        epoch = self.state.epoch
        self.handing_over = True
        await self._until(lambda: not self._majority_in_reach() or self._all_on_majority(), deadline)
        target = None

        def handed() -> bool:
            return self._handed_over(epoch)

        while not handed():
            # Chosen again each time: a target that lost its election (Raft may elect this broker again,
            # which then does not take over) or stopped fetching is replaced.
            chosen = self._successor()
            if chosen is None or not self._majority_in_reach() or loop.time() >= deadline:
                if chosen is None:
                    reason = "no follower fetched lately"
                elif not self._majority_in_reach():
                    reason = f"{self.role.reachable} of {self.size} brokers reachable"
                else:
                    reason = f"not done within {HAND_OVER_SECONDS:g} s"
                if stopping:
                    log.warning("stopping without handing the cluster over (%s): the others elect a leader "
                                "once this broker is gone", reason)
                else:
                    log.warning("%s, but not handing the cluster over (%s): leading on", why, reason)
                return
            if chosen != target:
                target = chosen
                log.info("%s: handing the cluster over to %s", why, target)
            sent = self.role.leading and await self._transfer(target)
            log.debug("Raft's leadership to %s: %s", target,
                      "TimeoutNow sent" if sent else "refused (its Raft log is not complete yet)")
            # After a request that went out: the target's election and take-over. After a refused one (its
            # Raft log was not complete yet), or once Raft moved on: a moment.
            wait = self.config.cluster_timeout if sent else HAND_OVER_RETRY
            await self._until(handed, min(deadline, loop.time() + wait))
        log.info("handed the cluster over to %s (epoch %d) in %.2f s", self.state.leader,
                 self.state.epoch, loop.time() - started)
        # A client may have been sent back here meanwhile (a member that still named this broker, or the next
        # of its list after a RETRY-AFTER): what it sends now is refused naming the new leader, so it goes
        # there and sends it again. Gone at once, this broker would leave it a publish nobody answered, which
        # the client must fail as "may or may not have been stored".
        await asyncio.sleep(HAND_OVER_LINGER)

    async def _until(self, condition: Callable[[], bool], deadline: float) -> bool:
        """Wait until ``condition()`` holds (checked whenever the cluster's state or a replica's position
        moves, and every HAND_OVER_RETRY) or the loop's clock reaches ``deadline``; whether it holds."""
        loop = asyncio.get_running_loop()
        while not condition():
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(remaining, HAND_OVER_RETRY))
        return True

    async def _transfer(self, target: str) -> bool:
        """Ask Raft to hand leadership to ``target``; whether the request went out (refused while its Raft
        log is not complete)."""
        outcome: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        assert self.raft is not None
        self.raft.transfer(target, lambda sent: outcome.done() or outcome.set_result(sent))
        try:
            return await asyncio.wait_for(outcome, self.config.cluster_timeout)
        except TimeoutError:
            return False

    def _all_on_majority(self) -> bool:
        """Whether every message this leader wrote is on a majority (no gate holds anything back)."""
        return all(topic.visible_until >= topic.next_id for topic in self.engine.topics.values()
                   if topic.visible_until is not None)

    def _majority_in_reach(self) -> bool:
        return self.role.reachable * 2 > self.size

    def _fetched_lately(self, node: str) -> bool:
        """Whether ``node`` fetched lately: twice the longest an idle follower goes without a FETCH (its
        pulse), or two election timeouts if longer (a member taking over asks with FETCHes too)."""
        lately = max(2 * PULSE_MS / 1000, 2 * self.config.cluster_timeout)
        return self.heard.get(node, -math.inf) >= time.monotonic() - lately

    def _successor(self) -> str | None:
        """The follower to hand the cluster to: of those that fetched lately, one whose Raft answers this
        leader's (Raft's TimeoutNow is lost on a broker restarted a moment ago that has not heard from it yet:
        the hand-over then waited an election timeout), and of those the one that acknowledged the most
        messages."""
        answering = self.role.answering
        # Followers copying fetch; with no persistent topic nobody does, and any member Raft hears will do.
        candidates = ([node for node in self.heard if self._fetched_lately(node)] if self.state.topics
                      else list(answering))
        if not candidates:
            return None
        return max(candidates, key=lambda node: (node in answering, sum(replicas.get(node, 0) for replicas in
                                                                        self.positions.values()), node))

    def _handed_over(self, epoch: int) -> bool:
        return self.state.epoch > epoch and self.state.leader not in (None, self.node)

    def _step_down(self, why: str) -> None:
        """Stop serving. The gates stay where they are (readers never see what a majority may not hold);
        the doors stop taking anything at once (refusal), and send their clients to the leader once it is
        known (on_demoted)."""
        self.serving = False
        self._demoted = True
        log.warning("no longer leading the cluster: %s", why)
        if self.on_demoted is not None:
            self.on_demoted(None)  # the TCP doors close now: they must not publish into a follower's logs
        self.schedule()  # held OKs become ERRORs now
        self._follow()

    def retention_floor(self, topic: Topic) -> int | None:
        """While leading, retention keeps the messages not yet on a majority (Kafka's log start never passes
        the high watermark either): a follower that has not copied them must still find them. A follower's
        copy has no such bound (the gate a former leader keeps says nothing about it)."""
        return topic.visible_until if self.serving else None

    def on_persistent(self, topic: Topic) -> None:
        if self.serving:
            self.engine.gate(topic, 1)
            self._register(topic)
        elif self.replicator is not None:
            self.replicator.follow(topic.name)

    def deleted(self, topic: bytes, incarnation: bytes | None, done: Callable[[str | None], None]) -> bool:
        """This leader deleted ``topic`` (whose log was ``incarnation``): the cluster forgets it, and every
        member deletes its copy as Raft's log carries that. True when ``done`` will be called: with None once
        Raft's log holds it, or with why not."""
        self.positions.pop(topic, None)  # a topic of that name made again starts with no acknowledgements
        name_hex = topic.hex()
        if not self.serving or self.raft is None or name_hex not in self.state.topics:
            return False
        forget = ("forget_topic", name_hex, (incarnation or mc0.NO_INCARNATION).decode("ascii"))
        self.raft.submit(forget, lambda _, why: done(why))
        return True

    def _delete_copy(self, topic: bytes, incarnation: str) -> None:
        """The cluster forgot ``topic``, whose leader's log was ``incarnation``: delete this member's copy of
        that log. Only of that one: a restarted member's Raft applies its whole journal again, and the topic
        may have been made again since (a new log, another incarnation), which must stay."""
        local = self.engine.topics.get(topic)
        if local is None or local.log is None or not _same_log(local.log.identity, incarnation):
            return
        try:
            self.engine.delete(topic)
        except EngineError as error:
            log.warning("topic %r was deleted on the leader, but this copy cannot be: %s",
                        topic.decode("utf-8", "replace"), error)
            return
        log.info("topic %r deleted, as on the leader", topic.decode("utf-8", "replace"))

    def _register(self, topic: Topic) -> None:
        name_hex = topic.name.hex()
        if name_hex not in self.state.topics and self.raft is not None:
            assert topic.log is not None  # only persistent topics are registered
            identity = topic.log.identity
            self.raft.submit(("topic", name_hex, spec_to_json(topic.spec), identity.incarnation,
                              identity.lineage))

    def replica_fetch(self, event: mc0.Fetch, peer: zmq.Frame | PeerMetadata | None) -> bool:
        epoch = event.epoch or 0
        node = (event.replica or b"").decode("utf-8", "replace")
        # What a replica says moves the majority and fences epochs: only the other members may say it, and
        # with CURVE only a connection that presented the members' key (they share the broker key pair).
        if node not in self.config.cluster_peers:
            raise EngineError(f"REPLICA {node} is not another member of this cluster "
                              f"({', '.join(self.config.cluster_peers)}): only they copy its logs")
        if self.member_key is not None and (peer is None or peer.get("User-Id").encode() != self.member_key):
            raise EngineError("REPLICA fetches come from the cluster's members, which present the brokers' "
                              "key: this connection presented another")
        self.heard[node] = time.monotonic()
        if epoch > self.fence:
            self.fence = epoch  # a new leader is collecting what we hold: copy nothing older from now on
            if self.serving and epoch > self.state.epoch:
                self._step_down(f"{node} is taking epoch {epoch}")
        if not self.serving:
            return False  # a new leader reading our log: served as it is
        if epoch != self.state.epoch:
            raise EngineError(f"this leader serves epoch {self.state.epoch}, not {epoch}")
        if event.start is None:
            return False
        topic = self.engine.topics.get(event.topic)
        if topic is None or topic.log is None or topic.visible_until is None:
            return False
        if event.incarnation != topic.log.identity.incarnation.encode():
            return False  # its log is not (yet) a copy of this one: the answer says where to cut
        replicas = self.positions.setdefault(event.topic, {})
        if replicas.get(node, 0) >= event.start:
            return False
        replicas[node] = event.start
        watermark = high_watermark([topic.committed_id, *replicas.values()], self.size)
        # No flush to schedule: this runs inside the router's turn, whose flush sends what the release allows
        # (held OKs, gated deliveries) in the same loop iteration; the router ends the turn there if it did.
        released = self.engine.release(event.topic, watermark)
        if self.handing_over:
            self._changed.set()
        return released

    def replica_waits(self) -> int:
        # Every topic, not only the persistent ones: counted at once, on the path of every copied message.
        # Twice that: a member that connected again while its old connection's waits are not yet forgotten.
        return 2 * (self.size - 1) * max(1, len(self.engine.topics))

    def replica_extra(self, topic: bytes, start: int, count: int, known: bytes | None) -> dict[bytes, bytes]:
        local = self.engine.topics.get(topic)
        if local is None or local.log is None:
            return {}
        extra = {}
        identity = local.log.identity
        if known is None or known != identity.incarnation.encode():
            # Only a reader of another log (or one that did not say) needs it: a copy in step has it already.
            extra[mc0.LINEAGE] = mc0.encode_lineage(identity.lineage)
        if count:
            entries = local.log.producers.entries(start, start + count)
            if entries:
                extra[mc0.PRODUCERS] = msgpack.packb(entries, use_bin_type=True)
        return extra

    def confirm(self, needs: dict[bytes, int], now: float, deadline: float) -> bool | str:
        if not self.serving:
            return ("not replicated to a majority of the cluster "
                    f"({self.role.reachable} of {self.size} brokers "
                    "reachable): this broker stopped leading before a majority held the message, which may "
                    "or may not survive; publish it again with PRODUCER/SEQUENCE (idempotent) once a leader "
                    "serves")
        topics = self.engine.topics
        for name, last in needs.items():
            topic = topics.get(name)
            if topic is None or topic.visible_until is None or topic.spec.sync is not Sync.STRONG:
                continue
            if topic.visible_until <= last:
                if now < deadline:
                    return False
                return (f"not replicated to a majority of the cluster ({self.role.reachable} of {self.size} "
                        f"brokers reachable) within {self.commit_timeout:g}s: it may or may not survive a "
                        "failover; publish it again with PRODUCER/SEQUENCE (idempotent) once a majority is "
                        "back")
        return True

    # ------------------------------------------------------------------------------------- taking over

    async def _take_over(self) -> None:
        try:
            while self.role.leading and not self.serving:
                try:
                    if await self._try_take_over():
                        return
                except SyncFailed as error:
                    self.fail(error)
                    return
                except (StoreError, LinkError, EngineError, ProtocolError) as error:
                    if isinstance(error, StoreError) or isinstance(error.__cause__, StoreError):
                        # It cannot write what it must hold to lead (a full disk: a copy not stored, or a
                        # log that cannot be opened again): staying Raft's leader without serving, it would
                        # keep every other member from leading. Unless it gave way a moment ago (every disk
                        # full, say): then it tries again, rather than pass Raft's leadership round.
                        now = time.monotonic()
                        if now >= self._unwritable_until and await self._give_way(str(error)):
                            self._unwritable_until = now + UNWRITABLE_AGAIN
                        else:
                            log.debug("taking over the cluster failed (%s): trying again", error)
                    else:
                        log.warning("taking over the cluster failed (%s): trying again", error)
                await asyncio.sleep(self.config.cluster_timeout)
        finally:
            self.taking_over = None

    async def _give_way(self, why: str) -> bool:
        """Hand Raft's leadership to another member whose Raft answers this one's, without having served;
        whether the request went out (none answers yet a moment after an election: try again later)."""
        others = sorted(self.role.answering - {self.node})
        if not others or not self.role.leading:
            return False
        sent = await self._transfer(others[0])
        log.log(logging.WARNING if sent else logging.DEBUG,
                "cannot take the cluster over (%s): handing Raft's leadership to %s%s", why, others[0],
                "" if sent else " was refused (its Raft log is not complete yet)")
        return sent

    async def _try_take_over(self) -> bool:
        if not await self._applied_so_far():
            return False
        epoch = self.state.epoch + 1
        self.fence = max(self.fence, epoch)
        self._stop_copying()
        names = {bytes.fromhex(name_hex) for name_hex in self.state.topics}
        names |= {topic.name for topic in self.engine.topics.values() if topic.log is not None}
        for name in names:
            self._ensure_topic(name, self.state.topics.get(name.hex(), {}))
        names = {name for name in names if (topic := self.engine.topics.get(name)) and topic.log is not None}
        peers = {node: endpoint for node, endpoint in self.state.endpoints.items() if node != self.node}
        links = {node: self._link(endpoint) for node, endpoint in peers.items()}
        try:
            ends = await self._ask(links, names, epoch)
            answered = 1 + sum(1 for node in links if ends.get(node) is not None)
            if answered < majority(self.size):
                log.warning("taking over epoch %d: %d of %d brokers answered, a majority is %d", epoch,
                            answered, self.size, majority(self.size))
                return False
            identities: dict[str, tuple[str, tuple[tuple[str, int], ...]]] = {}
            for name in sorted(names):
                await self._catch_up(name, ends, links, epoch)
                topic = self.engine.topics[name]
                assert topic.log is not None
                identity = topic.log.identity.successor(topic.next_id)
                self.store.set_identity(name, identity)
                identities[name.hex()] = (identity.incarnation, identity.lineage)
        finally:
            for link in links.values():
                link.close()
        if not self.role.leading:
            return False
        command = ("take_over", self.node, epoch, identities)
        self._taking = _take_over_key(command)
        if not await self._raft_applies(command):
            return False
        self.takeovers += 1
        return True

    async def _applied_so_far(self) -> bool:
        """Wait until this broker's state holds every command Raft committed before its leadership (False if
        it cannot say: no majority, or it no longer leads).

        A new Raft leader holds every committed entry in its log, but it applies those of earlier terms only
        once an entry of its own term is committed (Raft's rule; PySyncObj's no-op). Until then its state can
        be behind: a broker back from a crash that is elected again may not know the epoch it took itself
        before it died, nor the log identity it gave each topic then; comparing replicas on that state, it
        took its own log for one of an unknown epoch, chose a shorter replica as the most up to date, and cut
        messages a majority had confirmed (found by random faults: 1,740 confirmed messages lost). A command
        of its own, applied, is that entry: everything before it is applied too. It changes nothing (a
        position report naming no topic)."""
        return await self._raft_applies(("positions", self.node, {}))

    async def _raft_applies(self, command: tuple[Any, ...]) -> bool:
        """Submit ``command`` and wait until Raft applied it (True if it changed the state)."""
        outcome: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        assert self.raft is not None
        self.raft.submit(command, lambda result, error: outcome.done()
                         or outcome.set_result(bool(result) and not error))
        return await asyncio.wait_for(outcome, 10 * self.config.cluster_timeout + 5)

    async def _ask(self, links: dict[str, Link], names: set[bytes],
                   epoch: int) -> dict[str, dict[bytes, ReplicaEnd] | None]:
        """What the other brokers hold of each topic (None for one that did not answer everything), asked of
        all at once and returned as soon as a majority, this broker included, has answered: every message a
        majority took is on at least one broker of any majority, so waiting for the rest (a dead leader
        answers only with the timeout) would add time and no message."""

        async def one(node: str, link: Link) -> dict[bytes, ReplicaEnd] | None:
            out = {}
            ordered = sorted(names)
            try:
                for first in range(0, len(ordered), ASK_AT_ONCE):
                    chunk = ordered[first:first + ASK_AT_ONCE]
                    # All in flight together, not a round trip per topic (a take-over grows with the topics).
                    replies = await asyncio.gather(*(
                        link.request(mc0.Fetch(name, max_messages=0, replica=self.node.encode(), epoch=epoch),
                                     ASK_TIMEOUT) for name in chunk), return_exceptions=True)
                    for name, reply in zip(chunk, replies, strict=True):
                        if isinstance(reply, BaseException):
                            raise reply
                        if isinstance(reply, mc0.Error):
                            return None
                        out[name] = _replica_end(node, reply)
            except (LinkError, ProtocolError):
                return None
            return out

        asking = {asyncio.ensure_future(one(node, link)): node for node, link in links.items()}
        out: dict[str, dict[bytes, ReplicaEnd] | None] = dict.fromkeys(links)
        needed = majority(self.size) - 1  # answers besides this broker's own
        pending = set(asking)
        try:
            while pending and sum(answer is not None for answer in out.values()) < needed:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    out[asking[task]] = task.result()
        finally:
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        return out

    async def _catch_up(self, name: bytes, ends: dict[str, dict[bytes, ReplicaEnd] | None],
                        links: dict[str, Link], epoch: int) -> None:
        """Make this broker's log of ``name`` hold what the most up-to-date replica holds."""
        topic = self.engine.topics[name]
        assert topic.log is not None
        identity = topic.log.identity
        mine = ReplicaEnd(self.node, topic.next_id, identity.incarnation, identity.lineage)
        candidates = [mine] + [answer[name] for answer in ends.values()
                               if answer is not None and name in answer]
        best = most_advanced(candidates, lambda incarnation: self.state.epoch_of(name.hex(), incarnation))
        if best.node == self.node:
            return
        cut = shared_until(mine, best)
        if cut < topic.next_id:
            self.engine.truncate(name, cut)
            log.warning("taking over: cut topic %r from id %d (the most up-to-date replica, %s, does not "
                        "hold that suffix)", name.decode("utf-8", "replace"), cut, best.node)
        # Before the copy: the store records an identity before anything written under it, and what is copied
        # next is that replica's.
        self.store.set_identity(name, LogIdentity(best.incarnation, best.lineage) if best.incarnation
                                else topic.log.identity)
        link = links[best.node]
        while topic.next_id < best.next_id:
            reply = await link.request(
                mc0.Fetch(name, topic.next_id, 10_000, 4 << 20, records=True, replica=self.node.encode(),
                          epoch=epoch), ASK_TIMEOUT * 5)
            if isinstance(reply, mc0.Error):
                raise EngineError(reply.message.decode("utf-8", "replace"))
            records = mc0.decode_records_reply(reply)
            if not records.count:
                break
            if records.start_id > topic.next_id:
                restart_behind(self.engine, name, records.start_id)
            record_producers(topic.log, reply.headers.get(mc0.PRODUCERS), records.start_id,
                             records.start_id + records.count)
            self.engine.append_replicated(name, records.payload, records.start_id, records.count)
            self.flush()
            if name in self.engine.failed:  # not stored (a full disk): asking again would fail the same way
                raise StoreError(self.engine.failed[name])
        log.info("taking over: topic %r copied from %s up to id %d", name.decode("utf-8", "replace"),
                 best.node, topic.next_id - 1)

    # -------------------------------------------------------------------------------------------- stats

    def stats(self) -> dict[str, Any]:
        """This member's view, for STATS and the monitoring (docs/cluster.md, "Watching a cluster")."""
        watermarks = {}
        for topic in self.engine.topics.values() if self.serving else ():  # a former leader's gates are old
            if topic.visible_until is not None:
                watermarks[topic.name.decode("utf-8", "backslashreplace")] = topic.visible_until
        now = time.monotonic()
        return {
            "node": self.node, "endpoint": self.endpoint, "size": self.size, "epoch": self.state.epoch,
            "peers": list(self.config.cluster_peers),
            "leader": self.state.leader, "leader_endpoint": self.state.endpoints.get(self.state.leader or ""),
            "serving": self.serving, "raft_leader": self.role.leading, "reachable": self.role.reachable,
            "unready": self.unready(),
            "takeovers": self.takeovers, "high_watermarks": watermarks,
            "copied": self.copied_before + (self.replicator.copied if self.replicator is not None else 0),
            # The leader's view: each follower's acknowledged next id per topic, and how long ago each
            # member's last REPLICA fetch arrived (seconds).
            # Names as STATS and the monitoring show topics (undecodable bytes escaped, never merged).
            "replicas": {name.decode("utf-8", "backslashreplace"): dict(replicas)
                         for name, replicas in self.positions.items()},
            "heard": {node: round(now - when, 3) for node, when in self.heard.items()},
        }


def _take_over_key(command: tuple[Any, ...]) -> tuple[int, dict[str, str]]:
    """What tells one ``take_over`` command from another of the same epoch: the epoch, and the log identity
    (unique) it gives each topic."""
    return command[2], {name_hex: entry[0] for name_hex, entry in command[3].items()}


def _replica_end(node: str, reply: mc0.Ok) -> ReplicaEnd:
    """What ``node`` holds of a topic, from its answer to a replica FETCH of nothing (ProtocolError if that
    answer is not one)."""
    result = mc0.decode_fetch_reply(reply)
    incarnation = result.incarnation.decode("ascii", "replace")
    if incarnation == mc0.NO_INCARNATION.decode():
        incarnation = ""
    lineage = mc0.decode_lineage(reply.headers.get(mc0.LINEAGE, b""))
    return ReplicaEnd(node, result.next_id, incarnation, lineage)


def _same_log(identity: LogIdentity, incarnation: str) -> bool:
    """Whether ``incarnation`` names the log of ``identity``: its own, or one it succeeded (a new epoch)."""
    return incarnation == identity.incarnation or incarnation in (old for old, _ in identity.lineage)
