"""A follower's copy of the leader's logs: one long-polling FETCH per persistent topic, records appended with
the leader's ids and timestamps, acknowledged by the next FETCH's FROM.

Like a Kafka follower: the follower asks the leader for each topic's records from its own next id
(``FETCH ... FORMAT records WAIT ... REPLICA <node> EPOCH <epoch> INCARNATION <its log identity>``, its
headers ``PACKED`` in one frame where the leader takes that). The leader answers as soon as it has
committed something past that id, or when the wait ends: 30 s (WAIT_MS), but 1 s for the first topic
copied (PULSE_MS), so that the leader hears from each follower every second however many topics idle. The
follower checks and appends the records (the store checks every CRC), commits them as its topic's sync level
says (a strong topic fsyncs), and only then asks for more: the FROM of that next FETCH tells the leader that
everything below it is as durable here as the topic promises. It leaves right after the commit, inside the
hub's turn, before the rest of that turn (answers and deliveries to this broker's own clients), which the
leader does not wait for. If the leader's log is another one than the follower's (a new epoch), the follower
finds where the two logs part from both lineages (the leader's comes with its answer), cuts its log there,
durably, takes the leader's log identity, and copies on.

Idempotent publishers' batches travel with the records (``PRODUCERS``), so the producer window of a
follower that becomes leader is the one the old leader had for the same messages.

This module must not know about Raft; the cluster (:mod:`broker.cluster.node`) starts and stops it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import msgpack

from broker.cluster.link import Answer, Link, LinkError
from broker.cluster.state import ReplicaEnd, shared_until
from broker.engine import Engine, EngineError
from broker.store import LogIdentity, StoreError, SyncFailed, TopicLog
from protocol import ProtocolError, mc0

log = logging.getLogger("mc0.cluster")

#: How long a FETCH waits in the leader for something new (ms). A new message ends the wait at once, so this
#: is only what an idle topic costs: one FETCH per topic and follower this often (Kafka's followers send one
#: fetch for all their partitions; here each topic has its own, and 500 idle topics polled every second took
#: a fifth of the leader's CPU).
WAIT_MS = 30_000
#: ... except the FETCH of one topic of each follower (the first it copies), which waits this long: the
#: leader hears from every follower this often, whatever the number of topics (the last-fetch age in its
#: STATS and metrics; the followers it may hand the cluster over to).
PULSE_MS = 1000
#: The most records and bytes one FETCH brings.
FETCH_RECORDS = 10_000
FETCH_BYTES = 4 << 20
#: Seconds between attempts after the leader refused or did not answer.
RETRY = 0.2
#: A copy whose commits fail (a full disk) asks again after RETRY, doubling while they go on failing, up to
#: this: each ask has the leader read and send up to FETCH_BYTES again.
MAX_RETRY = 5.0


def record_producers(log: TopicLog, raw: bytes | None, start: int, stop: int) -> None:
    """Record, in a copy's producer journal, the idempotent batches that stored the copied ids ``[start,
    stop)`` (a PRODUCERS header): each cut at ``stop``, since the rest of a batch comes with the next
    records and is recorded again whole then. A batch cut here and never completed (its leader died) leaves
    the producer's window at what this copy holds: a retry stores the rest, and only the rest."""
    if not raw:
        return
    window = log.producers
    for first_id, count, producer, last_sequence in msgpack.unpackb(raw):
        over = first_id + count - stop
        if over > 0:
            count -= over
            last_sequence -= over
        if count > 0 and first_id + count > start:
            window.record(producer, last_sequence, first_id, count)


def restart_behind(engine: Engine, topic: bytes, first_id: int) -> None:
    """The log this copy follows starts at ``first_id``, past this copy's next id: its retention removed
    the messages between (this broker was away, or is new). Everything the copy holds is older than that
    log's oldest message, so it goes, durably, and the copy goes on at ``first_id``."""
    behind = engine.topics[topic].next_id
    dropped = engine.restart_log(topic, first_id)
    log.warning("topic %r: the log copied starts at id %d, past this copy's next id %d (retention removed "
                "the messages between): the %d older messages here dropped, copying on from there",
                topic.decode("utf-8", "replace"), first_id, behind, dropped)


class Replicator:
    """Copies every persistent topic from one leader, for one epoch.

    Each topic's copy is a chain of callbacks on the loop, not a task: the answer to one FETCH is checked,
    appended and committed from the link's descriptor callback, and the next FETCH leaves in the same
    callback. At one message in flight the follower's turn is on the path of every confirmed publish, and a
    task would add a future and two loop iterations to each."""

    def __init__(
        self,
        engine: Engine,
        link: Link,
        *,
        node: str,
        epoch: int,
        flush: Callable[..., None],
        fail: Callable[[BaseException], None],
        set_identity: Callable[[bytes, LogIdentity], None],
        fenced: Callable[[], int],
    ) -> None:
        self.engine = engine
        self.link = link
        self.node = node.encode()
        self.epoch = epoch
        # The hub's turn (Hub.flush): the commit (an fsync for strong topics), then ``committed`` (the next
        # FETCH, which acknowledges what was committed), then the rest of the turn.
        self.flush = flush
        self.fail = fail  # the hub's: a failed fsync stops the broker
        self.set_identity = set_identity
        self.fenced = fenced  # the highest epoch a candidate leader announced: copy nothing from below it
        self.topics: set[bytes] = set()
        self.pulse: bytes | None = None  # the topic whose FETCH waits PULSE_MS, not WAIT_MS
        # Each topic's FETCH, prepared: every ask changes only its FROM (and ID) while the log identity and
        # the PACKED choice stay; encoding the rest again was a tenth of a follower's turn at 1 in flight.
        self.templates: dict[bytes, tuple[tuple[bytes, bool, int], mc0.FetchTemplate]] = {}
        self.retries: dict[bytes, asyncio.TimerHandle] = {}
        self.failing: dict[bytes, int] = {}  # topics whose last writes failed, and how many in a row
        self.copied = 0  # records copied and committed so far
        self._appended: dict[bytes, int] = {}  # records appended per topic, their commit under way
        self.closed = False
        # FETCHes go PACKED (6 frames instead of 22, and 8 instead of 18 back) until the leader refuses one
        # before it answered any: a broker from before PACKED, which refuses it for want of a TOPIC; then
        # as before, for this leader. Known once a PACKED one was answered.
        self.packed = True
        self.packed_known = False

    def follow(self, topic: bytes) -> None:
        """Copy ``topic`` too (idempotent)."""
        if topic not in self.topics:
            self.topics.add(topic)
            if self.pulse is None:
                self.pulse = topic
            self._ask(topic)

    def _forget(self, topic: bytes) -> None:
        """``topic`` is gone here (deleted): copy it no more, until the cluster names it again (follow)."""
        self.topics.discard(topic)
        self.templates.pop(topic, None)
        self.failing.pop(topic, None)
        if self.pulse == topic:
            # The next topic asked pulses (its FETCH waiting now keeps its longer wait).
            self.pulse = next(iter(self.topics), None)

    def _ask(self, topic: bytes) -> None:
        """The next FETCH of ``topic``, from this copy's next id (which acknowledges everything below it)."""
        self.retries.pop(topic, None)
        if self.closed:
            return
        local = self.engine.topics.get(topic)
        if local is None or local.log is None:
            self._forget(topic)
            return
        incarnation = local.log.identity.incarnation.encode()
        wait = PULSE_MS if topic == self.pulse else WAIT_MS
        event = mc0.Fetch(topic, local.next_id, FETCH_RECORDS, FETCH_BYTES, wait=wait, records=True,
                          incarnation=incarnation, replica=self.node, epoch=self.epoch, packed=self.packed)
        template = self.templates.get(topic)
        if template is None or template[0] != (incarnation, self.packed, wait):
            template = self.templates[topic] = ((incarnation, self.packed, wait), mc0.FetchTemplate(event))
        try:
            self.link.ask(event, wait / 1000 + 5, lambda answer: self._answered(topic, event, answer),
                          template[1])
        except LinkError:
            self._later(topic)

    def _later(self, topic: bytes, delay: float | None = None) -> None:
        """Ask again after ``delay`` (RETRY by default)."""
        if not self.closed and topic not in self.retries:
            self.retries[topic] = asyncio.get_running_loop().call_later(RETRY if delay is None else delay,
                                                                        self._ask, topic)

    def _committed(self, topic: bytes) -> None:
        """What was copied is committed: ask for more at once. Unless the commit failed (the log says why,
        once): see :meth:`_after_failure`."""
        appended = self._appended.pop(topic, 0)
        if topic in self.engine.failed:
            self._after_failure(topic)
            return
        self.copied += appended
        self.failing.pop(topic, None)
        self._ask(topic)

    def _after_failure(self, topic: bytes) -> None:
        """A write of the copy failed: ask again after a pause that grows while writes go on failing, rather
        than have the leader send the same records again as fast as they fail."""
        failed = self.failing[topic] = self.failing.get(topic, 0) + 1
        self._later(topic, min(MAX_RETRY, RETRY * 2 ** (failed - 1)))

    def _answered(self, topic: bytes, event: mc0.Fetch, answer: Answer) -> None:
        if self.closed:
            return
        try:
            if isinstance(answer, LinkError):
                raise answer
            if self._take(topic, event, answer):
                # What was appended is committed (fsynced for strong topics) before the next FETCH
                # acknowledges it, and that FETCH leaves at once, not after the rest of the hub's turn.
                self.flush(committed=lambda: self._committed(topic))
                return
        except SyncFailed as error:  # the broker stops, loudly
            self.fail(error)
            return
        except StoreError as error:  # a write here failed (a full disk): as a failed commit of the copy
            log.log(logging.DEBUG if topic in self.failing else logging.WARNING,
                    "copying %r from %s: %s; trying again after pauses that grow to %g s while it fails",
                    topic.decode("utf-8", "replace"), self.link.endpoint, error, MAX_RETRY)
            self._after_failure(topic)
            return
        except (LinkError, EngineError, ProtocolError) as error:
            log.info("copying %r from %s: %s", topic.decode("utf-8", "replace"), self.link.endpoint, error)
        except Exception as error:  # a bug: the broker stops, loudly
            self.fail(error)
            return
        self._later(topic)

    def _take(self, topic: bytes, event: mc0.Fetch, reply: mc0.Ok | mc0.Error) -> bool:
        """What one FETCH's answer asks for, appended (not committed: the caller's flush commits it); False
        when the leader refused it (ask again after a pause)."""
        if isinstance(reply, mc0.Error):
            if event.packed and not self.packed_known:
                self.packed = False  # a leader from before PACKED (or a refusal that says so anyway)
                log.info("%s refused a PACKED FETCH (%s): asking it with plain headers", self.link.endpoint,
                         reply.message.decode("utf-8", "replace"))
                return True
            log.debug("leader refused a fetch of %r: %s", topic, reply.message.decode("utf-8", "replace"))
            return False
        if event.packed:
            self.packed_known = True
        if self.fenced() > self.epoch:
            return False  # a new leader is taking over: nothing more from this one
        local = self.engine.topics.get(topic)
        if local is None or local.log is None:
            return False
        identity = local.log.identity
        records = mc0.decode_records_reply(reply)
        if records.incarnation == mc0.NO_INCARNATION:
            # The leader has no log of this topic (deleted there: this copy goes too once Raft's log says
            # so). Nothing here is cut, and no identity taken from an answer that has none.
            log.debug("the leader has no log of %r", topic)
            return False
        incarnation = records.incarnation.decode("ascii", "replace")
        lineage = mc0.decode_lineage(reply.headers.get(mc0.LINEAGE, b""))
        if local.next_id != event.start:
            return True  # changed under us (a truncation): ask again
        if incarnation != identity.incarnation:
            # The leader's log is another one: cut ours where they part, take its identity, copy on. Where
            # they part is worked out here, from both lineages: the leader knows only this copy's identity,
            # and answers from its first id when its lineage does not name it (two identities taken from one
            # log share what they took).
            part = shared_until(ReplicaEnd(self.node.decode(), local.next_id, identity.incarnation,
                                           identity.lineage),
                                ReplicaEnd("leader", records.next_id, incarnation, lineage))
            cut = self.engine.truncate(topic, part)
            if cut:
                log.warning("topic %r: cut %d messages from id %d to follow the leader's log",
                            topic.decode("utf-8", "replace"), cut, part)
            self.set_identity(topic, LogIdentity(incarnation, lineage))
            if part != records.start_id:
                return True  # the leader answered from elsewhere: ask again from where the logs part
        elif records.start_id > local.next_id:
            # The leader's retention removed what this copy lacks (it was away, or it is new): everything it
            # holds is older than the leader's oldest message, so it goes, and the copy starts there.
            restart_behind(self.engine, topic, records.start_id)
        elif records.start_id != local.next_id:
            return False
        if records.count:
            if records.start_id != local.next_id:
                raise EngineError(f"topic {topic!r}: the leader's log starts at {records.start_id}, this one "
                                  f"goes on at {local.next_id}")
            record_producers(local.log, reply.headers.get(mc0.PRODUCERS), records.start_id,
                             records.start_id + records.count)
            self.engine.append_replicated(topic, records.payload, records.start_id, records.count)
            self._appended[topic] = records.count
        return True

    def close(self) -> None:
        self.closed = True
        for timer in self.retries.values():
            timer.cancel()
        self.retries.clear()
        with contextlib.suppress(Exception):
            self.link.close()
