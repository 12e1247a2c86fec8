"""A follower's copy of a topic (``broker.cluster.replicator``) runs as callbacks, FETCH after FETCH: each
answer is appended and committed before the next FETCH leaves, whose FROM acknowledges it; a refusal or a lost
link asks again after a pause; a failed fsync while copying goes to the hub's ``fail`` (the broker stops), and
the copy stops asking; a closed replicator asks nothing more."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import failing_writes

from broker.cluster import replicator as replicator_module
from broker.cluster.link import Answer, LinkError
from broker.cluster.replicator import Replicator
from broker.engine import Engine
from broker.store import LogIdentity, StoreError, SyncFailed
from broker.store.files import FileStore
from broker.topics import Persistence, Sync, TopicRule, TopicRules, TopicSpec
from protocol import mc0

TOPIC = b"copy.strong"
RULES = TopicRules([TopicRule("copy.*", TopicSpec(persistence=Persistence.PERSISTENT, sync=Sync.STRONG))])
NOW = 1_700_000_000_000


class FakeLink:
    """Records each FETCH and its callback; the test answers them."""

    endpoint = "tcp://leader"

    def __init__(self) -> None:
        self.asked: list[tuple[mc0.Fetch, Callable[[Answer], None]]] = []
        self.closed = False
        self.waiter: asyncio.Future[None] | None = None  # set by the next FETCH

    def ask(self, event: mc0.Fetch, timeout: float, answered: Callable[[Answer], None],
            template: mc0.FetchTemplate | None = None) -> None:
        if self.closed:
            raise LinkError("closed")
        # What would go on the wire: the prepared FETCH, which must be the event's own frames (its log
        # identity and PACKED choice included, as they change).
        assert template is not None
        assert template.frames(event.start, b"7") == mc0.encode(dataclasses.replace(event, id=b"7"))
        self.asked.append((event, answered))
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def leader(tmp_path: Path) -> Iterator[Engine]:
    engine = Engine(RULES, FileStore(tmp_path / "leader"))
    yield engine
    engine.close()


@pytest.fixture
def follower(tmp_path: Path) -> Iterator[Engine]:
    engine = Engine(RULES, FileStore(tmp_path / "follower"))
    engine.topic(TOPIC)
    yield engine
    engine.close()


def answer_from(leader: Engine, fetch: mc0.Fetch) -> mc0.Ok:
    """What a leader answers a replica's FETCH with: its records from the FETCH's FROM, or from where its
    log's lineage says the replica's log parts from it (and then the lineage too)."""
    assert fetch.start is not None
    known = fetch.incarnation.decode() if fetch.incarnation else None
    read = leader.read_range(TOPIC, fetch.start, 10_000, 4 << 20, records=True, known_incarnation=known,
                        replica=True)
    ok = mc0.records_ok(b"1", read.first_id, read.next_id, read.start_id, read.count,
                        (read.incarnation or "").encode(), read.records)
    log = leader.topics[TOPIC].log
    assert log is not None
    if known != log.identity.incarnation:
        ok.headers[mc0.LINEAGE] = mc0.encode_lineage(log.identity.lineage)
    return ok


def committing(follower: Engine) -> Callable[..., None]:
    """The hub's flush as far as a replicator sees it: the commit, then what runs once committed."""
    def flush(committed: Callable[[], None] | None = None) -> None:
        follower.commit()
        if committed is not None:
            committed()
    return flush


def make(follower: Engine, link: FakeLink, flush: Callable[..., None],
         failures: list[BaseException]) -> Replicator:
    return Replicator(follower, link, node="f1", epoch=1, flush=flush, fail=failures.append,  # type: ignore[arg-type]
                      set_identity=follower.store.set_identity, fenced=lambda: 0)  # type: ignore[union-attr]


def following(follower: Engine,
              leader: Engine | None = None) -> tuple[FakeLink, list[BaseException], Replicator]:
    """A replicator copying TOPIC into ``follower`` (committing as its flush), its first FETCH asked; with
    ``leader``, that leader holding one message, m0, by then."""
    link = FakeLink()
    failures: list[BaseException] = []
    replicator = make(follower, link, committing(follower), failures)
    replicator.follow(TOPIC)
    if leader is not None:
        leader.publish(TOPIC, b"m0", {}, NOW)
        leader.commit()
    return link, failures, replicator


def test_each_answer_is_committed_before_the_next_fetch_acknowledges_it(leader: Engine,
                                                                         follower: Engine) -> None:
    async def run() -> None:
        link = FakeLink()
        flushed: list[int] = []
        steps: list[str] = []
        failures: list[BaseException] = []

        def flush(committed: Callable[[], None] | None = None) -> None:
            follower.commit()
            flushed.append(follower.topics[TOPIC].next_id)
            asked = len(link.asked)
            assert committed is not None
            committed()
            steps.append(f"committed, {len(link.asked) - asked} asked")
            steps.append("the rest of the turn")

        replicator = make(follower, link, flush, failures)
        replicator.follow(TOPIC)
        replicator.follow(TOPIC)  # idempotent: still one FETCH in flight
        assert len(link.asked) == 1
        for round_number in range(3):
            for n in range(5):
                leader.publish(TOPIC, b"m%d.%d" % (round_number, n), {}, NOW)
            leader.commit()
            fetch, answered = link.asked[-1]
            assert fetch.replica == b"f1"
            assert fetch.epoch == 1
            assert fetch.records
            assert fetch.start == 1 + 5 * round_number  # FROM: everything below is durable here
            answered(answer_from(leader, fetch))
            assert flushed[-1] == 1 + 5 * (round_number + 1)  # committed in the same callback
            assert len(link.asked) == round_number + 2  # and asked again at once, from the new next id
            assert link.asked[-1][0].start == flushed[-1]
            # The next FETCH left right after the commit, inside the turn, before the rest of it.
            assert steps[-2:] == ["committed, 1 asked", "the rest of the turn"]
        log = follower.topics[TOPIC].log
        assert log is not None
        assert [message.body for message in log.read(1, 100, 1 << 20)] == \
            [b"m%d.%d" % (r, n) for r in range(3) for n in range(5)]
        assert replicator.copied == 15
        assert not failures
        replicator.close()
        assert link.closed

    asyncio.run(run())


def test_a_refusal_or_a_lost_link_asks_again_after_a_pause(leader: Engine, follower: Engine,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(replicator_module, "RETRY", 0.01)

    async def run() -> None:
        link, failures, replicator = following(follower)
        leader.publish(TOPIC, b"one", {}, NOW)
        leader.commit()
        link.asked[-1][1](answer_from(leader, link.asked[-1][0]))  # this leader takes PACKED FETCHes
        link.asked[-1][1](mc0.Error(b"not the leader", b"1"))
        assert len(link.asked) == 2  # not at once: a refusing leader is not flooded
        await asyncio.sleep(0.05)
        assert len(link.asked) == 3
        assert link.asked[-1][0].packed  # a refusal after PACKED was answered says nothing about PACKED
        link.asked[-1][1](LinkError("no answer within 6s"))
        await asyncio.sleep(0.05)
        assert len(link.asked) == 4
        replicator.close()
        link.asked[-1][1](LinkError("the link was closed"))  # what closing the link does to the last one
        await asyncio.sleep(0.05)
        assert len(link.asked) == 4  # closed: nothing more
        assert not failures

    asyncio.run(run())


def test_fetches_go_packed_and_a_leader_that_refuses_the_first_is_asked_with_plain_headers(
        leader: Engine, follower: Engine) -> None:
    async def run() -> None:
        link, failures, replicator = following(follower)
        first = link.asked[-1][0]
        assert first.packed
        assert len(mc0.encode(first)) == 4  # delimiter, FETCH, PACKED, its map (the link adds the ID)
        # A broker from before PACKED reads no TOPIC in it:
        link.asked[-1][1](mc0.Error(b"FETCH needs a non-empty TOPIC", first.id))
        assert len(link.asked) == 2  # at once, not after a pause
        plain = link.asked[-1][0]
        assert not plain.packed
        assert plain.start == first.start
        leader.publish(TOPIC, b"one", {}, NOW)
        leader.commit()
        link.asked[-1][1](answer_from(leader, plain))
        assert not link.asked[-1][0].packed  # plain from then on, for this leader
        assert replicator.copied == 1
        assert not failures
        replicator.close()

    asyncio.run(run())


async def _answered_on_a_full_disk(link: FakeLink, leader: Engine, rounds: int, start: int,
                                   monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
    """Answer the last FETCH ``rounds`` times while writes under ``folder`` fail: each next FETCH asks from
    ``start`` again (nothing was stored), after RETRY the first time and twice as long each time after."""
    with failing_writes(monkeypatch, str(folder)):
        for round_number in range(rounds):
            fetch, answered = link.asked[-1]
            assert fetch.start == start
            link.waiter = asyncio.get_running_loop().create_future()
            answered(answer_from(leader, fetch))
            started = time.monotonic()
            await asyncio.wait_for(link.waiter, 5)
            assert time.monotonic() - started >= replicator_module.RETRY * 2 ** round_number


def test_a_copy_whose_disk_is_full_asks_again_after_growing_pauses_and_says_so_once(
        leader: Engine, follower: Engine, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        tmp_path: Path) -> None:
    """A commit of copied records that fails (a full disk) is not retried as fast as it fails: the next FETCH
    waits RETRY, then twice that while the commits go on failing; the log says so once, and once more when a
    write succeeds again; the copy then goes on at once."""
    monkeypatch.setattr(replicator_module, "RETRY", 0.02)
    caplog.set_level(logging.DEBUG, logger="mc0.store")

    async def run() -> None:
        link, failures, replicator = following(follower, leader)
        link.asked[-1][1](answer_from(leader, link.asked[-1][0]))  # the leader's identity taken, m0 copied
        for n in range(1, 6):
            leader.publish(TOPIC, b"m%d" % n, {}, NOW)
        leader.commit()
        await _answered_on_a_full_disk(link, leader, 3, 2, monkeypatch, tmp_path / "follower")
        fetch, answered = link.asked[-1]
        answered(answer_from(leader, fetch))
        assert link.asked[-1][0].start == 7  # stored, and asked for more at once
        log = follower.topics[TOPIC].log
        assert log is not None
        assert [message.body for message in log.read(1, 100, 1 << 20)] == [b"m%d" % n for n in range(6)]
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) == 1
        assert "No space left on device" in errors[0].getMessage()
        assert "said once" in errors[0].getMessage()
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert sum("torn tail" in warning for warning in warnings) <= 1
        assert [warning for warning in warnings if "succeed again" in warning] == \
            [f"{tmp_path / 'follower'}/copy.strong: writes succeed again, after 3 failed"]
        assert not failures
        replicator.close()

    asyncio.run(run())


def test_a_copy_that_cannot_record_the_leaders_identity_waits_and_the_broker_goes_on(
        leader: Engine, follower: Engine, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        tmp_path: Path) -> None:
    """The first answer from a leader makes the copy take its log identity, written in the topic's meta
    file before the records copied under it: on a full disk that fails, and so does the commit of the
    records. The copy waits and tries again (it used to stop the broker as a failed fsync does), said once;
    with room again it copies."""
    monkeypatch.setattr(replicator_module, "RETRY", 0.02)
    caplog.set_level(logging.DEBUG)

    async def run() -> None:
        link, failures, replicator = following(follower, leader)
        await _answered_on_a_full_disk(link, leader, 2, 1, monkeypatch, tmp_path / "follower")
        assert not failures  # the broker goes on
        said = [r for r in caplog.records if r.name.startswith("mc0.") and r.levelno >= logging.WARNING]
        assert len(said) == 1
        assert "topic.json" in said[0].getMessage()
        assert "No space left on device" in said[0].getMessage()
        link.asked[-1][1](answer_from(leader, link.asked[-1][0]))
        assert link.asked[-1][0].start == 2
        assert replicator.copied == 1
        replicator.close()

    asyncio.run(run())


def test_a_failed_fsync_while_copying_stops_the_broker(leader: Engine, follower: Engine) -> None:
    async def run() -> None:
        link = FakeLink()
        failures: list[BaseException] = []

        def flush(committed: Callable[[], None] | None = None) -> None:
            raise SyncFailed("fsync of copy.strong failed: EIO")

        replicator = make(follower, link, flush, failures)
        replicator.follow(TOPIC)
        leader.publish(TOPIC, b"one", {}, NOW)
        leader.commit()
        fetch, answered = link.asked[-1]
        answered(answer_from(leader, fetch))
        assert len(failures) == 1
        assert isinstance(failures[0], SyncFailed)
        await asyncio.sleep(replicator_module.RETRY + 0.1)
        assert len(link.asked) == 1  # the copy stopped: the broker is stopping
        replicator.close()

    asyncio.run(run())


def test_a_copy_whose_identity_the_leader_does_not_know_cuts_where_their_lineages_part(
        leader: Engine, follower: Engine) -> None:
    """Both logs took a new identity from one log: the leader's when it took over at id 10, this copy's in a
    take-over at id 14 that Raft did not accept. The leader cannot place the copy's identity and answers from
    its first id; the copy keeps the 9 messages both hold, cuts the rest, and copies the leader's from 10."""
    common = LogIdentity.fresh()
    for engine in (leader, follower):
        engine.topic(TOPIC)
        engine.store.set_identity(TOPIC, common)  # type: ignore[union-attr]
        for n in range(1, 10):
            engine.publish(TOPIC, b"shared %d" % n, {}, NOW)
    for n in range(10, 14):
        follower.publish(TOPIC, b"copy only %d" % n, {}, NOW)
    for n in range(10, 16):
        leader.publish(TOPIC, b"leader %d" % n, {}, NOW)
    leader.commit()
    follower.commit()
    leader.store.set_identity(TOPIC, common.successor(10))  # type: ignore[union-attr]
    follower.store.set_identity(TOPIC, common.successor(14))  # type: ignore[union-attr]

    async def run() -> None:
        link, failures, replicator = following(follower)
        first = link.asked[-1][0]
        answer = answer_from(leader, first)
        assert mc0.decode_records_reply(answer).start_id == 1  # the leader could not place the copy
        link.asked[-1][1](answer)
        again = link.asked[-1][0]
        assert again.start == 10  # cut where the two part, not at 1
        assert again.incarnation == leader.incarnation(TOPIC)
        link.asked[-1][1](answer_from(leader, again))
        assert link.asked[-1][0].start == 16
        log = follower.topics[TOPIC].log
        assert log is not None
        assert [message.body for message in log.read(1, 100, 1 << 20)] == \
            [b"shared %d" % n for n in range(1, 10)] + [b"leader %d" % n for n in range(10, 16)]
        assert log.identity == leader.topics[TOPIC].log.identity  # type: ignore[union-attr]
        assert not failures
        replicator.close()

    asyncio.run(run())


def test_a_copy_behind_the_leaders_retention_drops_its_old_messages_and_copies_on(tmp_path: Path) -> None:
    """The leader's retention removed messages this copy never had (it was away): everything the copy holds
    is older than the leader's oldest message, so the copy starts again at that message."""
    rules = TopicRules([TopicRule("copy.*", TopicSpec(persistence=Persistence.PERSISTENT, sync=Sync.STRONG,
                                                      segment_bytes=1024, retention_bytes=2048))])
    leader, follower = Engine(rules, FileStore(tmp_path / "leader")), Engine(rules, FileStore(tmp_path / "f"))
    try:
        leader.topic(TOPIC)
        follower.topic(TOPIC)
        follower.store.set_identity(TOPIC, leader.topics[TOPIC].log.identity)  # type: ignore[union-attr]
        for n in range(1, 6):
            for engine in (leader, follower):
                engine.publish(TOPIC, b"old %d" % n, {}, NOW)
                engine.commit()
        for n in range(6, 80):
            leader.publish(TOPIC, b"new %d" % n + b"." * 100, {}, NOW)
            leader.commit()
        log = leader.topics[TOPIC].log
        assert log is not None
        assert log.enforce_retention(NOW) > 0
        first = log.first_id
        assert first > 6

        async def run() -> None:
            link, failures, replicator = following(follower)
            assert link.asked[-1][0].start == 6
            link.asked[-1][1](answer_from(leader, link.asked[-1][0]))
            copy = follower.topics[TOPIC].log
            assert copy is not None
            assert copy.first_id == first
            while link.asked[-1][0].start < 80:  # a read stops at a segment's end
                link.asked[-1][1](answer_from(leader, link.asked[-1][0]))
            assert copy.next_id == 80
            assert [message.body for message in copy.read(1, 100, 1 << 20)] == \
                [message.body for message in log.read(1, 100, 1 << 20)]
            assert not failures
            replicator.close()

        asyncio.run(run())
    finally:
        leader.close()
        follower.close()


def test_a_leader_without_the_topics_log_changes_nothing_in_the_copy(leader: Engine, follower: Engine,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A leader that deleted the topic answers with no log identity (NO_INCARNATION): the copy must not cut
    its log nor take that as an identity (recorded, it made the topic's meta file unreadable and every member
    unable to take the cluster over); it asks again after a pause, by which time Raft's log may have told it
    to delete its copy."""
    monkeypatch.setattr(replicator_module, "RETRY", 0.01)

    async def run() -> None:
        link, failures, _ = following(follower, leader)
        link.asked[-1][1](answer_from(leader, link.asked[-1][0]))
        identity = follower.topics[TOPIC].log.identity  # type: ignore[union-attr]
        fetch = link.asked[-1][0]
        link.asked[-1][1](mc0.records_ok(b"1", fetch.start, fetch.start, fetch.start, 0, mc0.NO_INCARNATION,
                                         b""))
        assert len(link.asked) == 2  # not at once
        await asyncio.sleep(0.05)
        assert len(link.asked) == 3
        assert follower.topics[TOPIC].next_id == 2  # m0 stays
        assert follower.topics[TOPIC].log.identity == identity  # type: ignore[union-attr]
        follower.delete(TOPIC)  # Raft's log said so: the copy goes, and is asked for no more
        link.asked[-1][1](LinkError("no answer within 6s"))
        await asyncio.sleep(0.05)
        assert len(link.asked) == 3
        assert not failures

    asyncio.run(run())


def test_one_topic_pulses_and_the_others_wait_long(leader: Engine, follower: Engine) -> None:
    """The leader hears from an idle follower every PULSE_MS through its first topic; the others' FETCHes
    wait WAIT_MS, so idle topics cost little however many there are."""
    other = b"copy.other"
    follower.topic(other)

    async def run() -> None:
        link, _, replicator = following(follower)
        replicator.follow(other)
        waits = {event.topic: event.wait for event, _ in link.asked}
        assert waits == {TOPIC: replicator_module.PULSE_MS, other: replicator_module.WAIT_MS}
        assert replicator_module.WAIT_MS >= 10 * replicator_module.PULSE_MS

    asyncio.run(run())


def test_an_identity_that_is_not_one_is_never_recorded(follower: Engine) -> None:
    store = follower.store
    assert isinstance(store, FileStore)
    with pytest.raises(StoreError, match="not a log identity"):
        store.set_identity(TOPIC, LogIdentity("-"))
    with pytest.raises(StoreError, match="not a log identity"):
        store.set_identity(TOPIC, LogIdentity(uuid.uuid4().hex, (("x", 3),)))
    store.set_identity(TOPIC, LogIdentity(uuid.uuid4().hex))
