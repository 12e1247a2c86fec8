"""The ``mc0`` data source for Spark: topics read as batch and streaming DataFrames, and DataFrames written
into topics, through PySpark's Python Data Source API (``pyspark.sql.datasource``).

Everything goes through the broker, never its disk, so the same code runs in ``local[*]`` and on a cluster
whose executors reach the broker over the network:

* the driver asks the broker for each topic's offsets (first id, next id, log identity), waiting in a long
  poll while a stream is idle, and plans id ranges; each executor task reads its range as stored records
  (``FETCH ... FORMAT records``) and turns them into Arrow columns in bulk (:mod:`pipeline.arrow`);
* offsets are ``{"topic": {"next": <next message id>, "incarnation": <log identity>}}``: a query whose
  checkpoint belongs to another log (recreated, or cut back after a machine restart) notices;
* writing is :mod:`pipeline.sink`: idempotent batches, so a retried task's rows land once.

Options are named as in Spark's Kafka source (:mod:`pipeline.options` checks them). Readers and writers hold
only their settings and plans (picklable); sockets are opened inside ``read()`` / ``write()`` on executors,
and kept for the life of a stream on the driver.

Register once per session: :func:`register`, then ``spark.read.format("mc0")``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future
from concurrent.futures import wait as wait_for
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from pipeline import options as opts
from pipeline import worker
from pipeline.options import Connection, Mode, OptionError

FORMAT = "mc0"
#: Records per range fetch on an executor (the broker's cap) and their bytes: bounded replies keep many
#: executors from holding the broker's loop, and 16 MiB is the broker's cap for one reply.
FETCH_RECORDS = 10_000
FETCH_BYTES = 16 << 20
#: Message ids start at 1: 0 in an offset means "from the beginning", never a message that was lost.
FIRST_ID = 1
#: In offsets JSON, as in Kafka's: the oldest stored message, and the next one to come.
EARLIEST = -2
LATEST = -1
#: What a FETCH reply says for a topic that has no log yet.
NO_LOG = "-"

HEADERS_TYPE = ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())]))
SCHEMA = StructType([
    StructField("key", BinaryType()),
    StructField("value", BinaryType()),
    StructField("topic", StringType()),
    StructField("id", LongType()),
    StructField("timestamp", TimestampType()),
])
SCHEMA_WITH_HEADERS = StructType([*SCHEMA.fields, StructField("headers", HEADERS_TYPE)])


def chosen_columns(schema: StructType, full: StructType) -> StructType | None:
    """The columns a read was given with ``.schema(...)``: None when ``schema`` is the source's own ``full``
    one, else ``schema`` once every field in it is one of ``full``'s, with the same type (in any order, each
    once). Spark's Python data sources cannot prune columns, so naming only the columns a query needs is how
    a reader spares the executors and Spark's JVM the others (docs/pipeline.md, "Reading only some
    columns")."""
    if schema == full:
        return None
    types = {column.name: column.dataType for column in full.fields}
    names = [column.name for column in schema.fields]
    if not names:
        raise OptionError("a schema given to an mc0 read must name at least one column")
    if len(set(names)) != len(names):
        raise OptionError(f"a schema given to an mc0 read names a column twice: {', '.join(names)}")
    for column in schema.fields:
        expected = types.get(column.name)
        if expected is None:
            offered = ", ".join(f"{name} {kind.simpleString()}" for name, kind in types.items())
            hint = " (headers needs includeHeaders=true)" if column.name == "headers" else ""
            raise OptionError(f"column {column.name!r} of the given schema is not one an mc0 read has{hint}: "
                              f"choose among {offered}")
        if column.dataType != expected:
            raise OptionError(f"column {column.name!r} of an mc0 read is {expected.simpleString()}, not "
                              f"{column.dataType.simpleString()}: give it that type in the schema")
    return schema


log = logging.getLogger("mc0.pipeline")
if not log.handlers and not logging.getLogger().handlers:
    # Python workers have no logging set up: the warnings (data loss skipped, a log that changed) must reach
    # the driver's or executor's stderr, which Spark keeps with its own logs.
    _handler = logging.StreamHandler()
    _handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    log.addHandler(_handler)
    log.setLevel(logging.INFO)


class DataLossError(Exception):
    """Messages a query was going to read are gone (retention, or the topic's log is another one now) and
    ``failOnDataLoss`` is true."""


class Bounds(NamedTuple):
    """What the broker says of a topic: oldest stored id, next id, and which log it is ("-": none yet)."""

    first: int
    next: int
    incarnation: str


class Position(NamedTuple):
    """Where a stream stands in a topic: the next id to read, in the log named by ``incarnation`` ("" when
    unknown: an offset written by hand, or by an older version of this source)."""

    next: int
    incarnation: str


def encode_offset(positions: Mapping[str, Position]) -> dict:
    return {topic: {"next": p.next, "incarnation": p.incarnation} for topic, p in sorted(positions.items())}


def decode_offset(offset: Mapping[str, Any]) -> dict[str, Position]:
    """A stream offset back from Spark's checkpoint; a bare id per topic (older checkpoints) is accepted."""
    out = {}
    for topic, value in offset.items():
        if isinstance(value, int):
            out[topic] = Position(value, "")
        else:
            out[topic] = Position(int(value["next"]), str(value.get("incarnation", "")))
    return out


# --------------------------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class Starting:
    """Where reads start (or, for ``endingOffsets``, stop): ``earliest``/``latest``, ids, or times."""

    kind: str  # "earliest" | "latest" | "ids" | "times"
    ids: Mapping[str, int] = field(default_factory=dict)  # "ids": -2 earliest, -1 latest; "times": ms
    every_topic_time: int | None = None  # startingTimestamp / endingTimestamp: one time for all topics


def _starting(options: Mapping[str, str], prefix: str, default: str, batch: bool) -> Starting:
    """``startingOffsets`` & co. (``prefix`` "starting") or ``endingOffsets`` & co. ("ending"), with Kafka's
    precedence: a single timestamp, then timestamps per topic, then offsets."""
    single = opts.count(options, f"{prefix}Timestamp", minimum=0)
    if single is not None:
        return Starting("times", every_topic_time=single)
    by_time = options.get(f"{prefix}OffsetsByTimestamp")
    if by_time is not None:
        return Starting("times", opts.topics_json(by_time, f"{prefix}OffsetsByTimestamp"))
    value = options.get(f"{prefix}Offsets", default).strip()
    if value.lower() in ("earliest", "latest"):
        kind = value.lower()
        if batch and prefix == "starting" and kind == "latest":
            raise OptionError("startingOffsets can't be latest for batch reads: they would read nothing "
                              "(use earliest, ids or a timestamp)")
        if prefix == "ending" and kind == "earliest":
            raise OptionError("endingOffsets can't be earliest: a batch read would read nothing (use latest)")
        return Starting(kind)
    ids = opts.topics_json(value, f"{prefix}Offsets")
    for topic, message_id in ids.items():
        if message_id < EARLIEST:
            raise OptionError(f"{prefix}Offsets: {message_id} for topic {topic!r} is neither an id nor -2/-1")
        if batch and prefix == "starting" and message_id == LATEST:
            raise OptionError(f"startingOffsets for topic {topic!r} can't be latest (-1) for batch reads")
        if prefix == "ending" and message_id == EARLIEST:
            raise OptionError(f"endingOffsets for topic {topic!r} can't be earliest (-2)")
    return Starting("ids", ids)


@dataclass(frozen=True)
class ReadSettings:
    """The options of a read, checked once on the driver; shipped to executors inside readers."""

    connection: Connection
    topics: tuple[str, ...]
    pattern: str | None
    starting: Starting
    ending: Starting
    latest_if_none_at_time: bool  # startingOffsetsByTimestampStrategy latest
    fail_on_data_loss: bool
    min_partitions: int | None
    max_records_per_partition: int
    include_headers: bool
    check_crcs: bool
    max_per_trigger: int | None
    min_per_trigger: int | None
    max_trigger_delay_ms: int
    fetch_max_wait_ms: int
    discovery_ms: int
    parallelism: int | None = None  # Spark's default parallelism when registered (None: the machine's cores)
    columns: StructType | None = None  # the columns a schema given to the read chose (None: all of them)

    @classmethod
    def parse(cls, options: Mapping[str, str], mode: Mode, parallelism: int | None = None) -> ReadSettings:
        opts.check(options, mode)
        batch = mode is Mode.READ
        topics = tuple(t.strip() for t in options.get("subscribe", "").split(",") if t.strip())
        pattern = options.get("subscribePattern")
        if bool(topics) == (pattern is not None):
            raise OptionError("name the topics to read with exactly one of subscribe (comma-separated "
                              "names) and subscribePattern (a regular expression)")
        if pattern is not None:
            try:
                re.compile(pattern)
            except re.error as error:
                raise OptionError(f"subscribePattern {pattern!r} is not a regular expression: {error}"
                                  ) from None
        strategy = options.get("startingOffsetsByTimestampStrategy", "error").strip().lower()
        if strategy not in ("error", "latest"):
            raise OptionError(f"startingOffsetsByTimestampStrategy must be error or latest, not {strategy!r}")
        settings = cls(
            connection=Connection.parse(options),
            topics=topics,
            pattern=pattern,
            starting=_starting(options, "starting", "earliest" if batch else "latest", batch),
            ending=_starting(options, "ending", "latest", batch),
            latest_if_none_at_time=strategy == "latest",
            fail_on_data_loss=opts.flag(options, "failOnDataLoss", True),
            min_partitions=opts.count(options, "minPartitions"),
            max_records_per_partition=opts.count(options, "maxRecordsPerPartition",
                                                 opts.DEFAULT_MAX_RECORDS_PER_PARTITION) or 1,
            include_headers=opts.flag(options, "includeHeaders", False),
            check_crcs=opts.flag(options, "checkCrcs", True),
            max_per_trigger=opts.count(options, "maxOffsetsPerTrigger"),
            min_per_trigger=opts.count(options, "minOffsetsPerTrigger"),
            max_trigger_delay_ms=opts.duration_ms(options, "maxTriggerDelay", opts.DEFAULT_MAX_TRIGGER_DELAY),
            fetch_max_wait_ms=opts.count(options, "fetchMaxWaitMs", opts.DEFAULT_FETCH_MAX_WAIT_MS,
                                         minimum=0) or 0,
            discovery_ms=opts.count(options, "topicDiscoveryIntervalMs",
                                    opts.DEFAULT_TOPIC_DISCOVERY_MS) or 1,
            parallelism=parallelism or os.cpu_count(),
        )
        if settings.min_per_trigger and settings.max_per_trigger and (
                settings.min_per_trigger > settings.max_per_trigger):
            raise OptionError("minOffsetsPerTrigger must not be larger than maxOffsetsPerTrigger")
        return settings

    def matches(self, topic: str) -> bool:
        return topic in self.topics if self.pattern is None else re.fullmatch(self.pattern, topic) is not None

    def full_schema(self) -> StructType:
        return SCHEMA_WITH_HEADERS if self.include_headers else SCHEMA

    def schema(self) -> StructType:
        """What each row carries: the columns a given schema chose, or all of them."""
        return self.columns if self.columns is not None else self.full_schema()

    def reading(self, schema: StructType) -> ReadSettings:
        """These settings for a read Spark plans with ``schema`` (this source's own, or one given with
        ``.schema(...)``: see :func:`chosen_columns`)."""
        return dataclasses.replace(self, columns=chosen_columns(schema, self.full_schema()))

    def loss(self, message: str) -> None:
        """Data a query was to read is gone: fail (failOnDataLoss) or say so and go on."""
        if self.fail_on_data_loss:
            raise DataLossError(f"{message} (failOnDataLoss=false reads on from what is there)")
        log.warning("%s: reading on from what is there (failOnDataLoss=false)", message)


# ----------------------------------------------------------------------------------------- the broker


class Broker:
    """The driver's questions to the broker, on one connection (opened on first use, kept by streams)."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self._client: Any = None

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = self.connection.client()
        return self._client

    def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            client.close(timeout=1.0)

    def _gather(self, futures: Mapping[str, Future[Any]]) -> dict[str, Any]:
        timeout = self.connection.request_timeout
        try:
            return {topic: future.result(timeout) for topic, future in futures.items()}
        except TimeoutError:
            self.close()  # a connection that failed a request is not trusted with the next one
            raise TimeoutError(f"no answer from the broker at {self.connection.broker} within {timeout:g} s "
                               "(requestTimeoutMs)") from None
        except BaseException:
            self.close()
            raise

    def bounds(self, topics: Sequence[str]) -> dict[str, Bounds]:
        """Every topic's bounds, asked at once (one round trip however many topics)."""
        client = self.client
        replies = self._gather({t: client.fetch_later(t, max_messages=0) for t in topics})
        return {t: Bounds(r.first_id, r.next_id, r.incarnation) for t, r in replies.items()}

    def ids_at(self, times: Mapping[str, int]) -> dict[str, int]:
        """Per topic: the first id stored at or after its time (the next id when there is none)."""
        client = self.client
        replies = self._gather({t: client.fetch_later(t, max_messages=0, at_time=ms)
                                for t, ms in times.items()})
        return {t: r.start_id for t, r in replies.items()}

    def resume_point(self, topic: str, position: Position) -> int:
        """Where a reader at ``position`` in an earlier log of ``topic`` goes on in its log now (the broker
        knows the lineage): the same id, the first id the logs do not share, or the log's beginning."""
        result = self.client.fetch(topic, max(position.next, FIRST_ID), max_messages=0,
                                    incarnation=position.incarnation)
        return result.start_id if result.start_id is not None else result.first_id

    def persistent_topics(self) -> list[str]:
        return sorted(name for name, about in self.client.topics().items()
                      if about.get("persistence") == "persistent")


def topics_of(settings: ReadSettings, broker: Broker) -> list[str]:
    if settings.pattern is None:
        return list(settings.topics)
    return [topic for topic in broker.persistent_topics() if settings.matches(topic)]


def resolve(settings: ReadSettings, which: Starting, broker: Broker, bounds: Mapping[str, Bounds],
            default: int) -> dict[str, int]:
    """``earliest`` / ``latest`` / ids / times as a next-id per topic. A topic the JSON leaves out gets
    ``default`` (EARLIEST or LATEST)."""
    for topic in which.ids:
        if not settings.matches(topic):
            raise OptionError(f"offsets name topic {topic!r}, which this read does not subscribe to")
    if which.kind == "earliest":
        return {topic: b.first for topic, b in bounds.items()}
    if which.kind == "latest":
        return {topic: b.next for topic, b in bounds.items()}
    if which.kind == "ids":
        out = {}
        for topic, b in bounds.items():
            value = which.ids.get(topic, default)
            out[topic] = b.first if value == EARLIEST else b.next if value == LATEST else value
        return out
    times = {topic: which.every_topic_time if which.every_topic_time is not None else which.ids.get(topic)
             for topic in bounds}
    found = broker.ids_at({topic: ms for topic, ms in times.items() if ms is not None})
    out = {}
    for topic, b in bounds.items():
        if times[topic] is None:
            out[topic] = b.first if default == EARLIEST else b.next
        elif found[topic] >= b.next and which is settings.starting and not settings.latest_if_none_at_time:
            raise DataLossError(f"topic {topic!r} has no message stored at or after {times[topic]} ms "
                                "(startingOffsetsByTimestampStrategy=latest starts at its end instead)")
        else:
            out[topic] = found[topic]
    return out


def begin(settings: ReadSettings, broker: Broker, topic: str, position: Position | None, now: Bounds) -> int:
    """The first id to read of ``topic`` for a reader at ``position`` (None: a topic new to this stream, read
    from its beginning), checked against what the topic holds now: retention, and another log."""
    if position is None:
        return now.first
    start = max(position.next, FIRST_ID)  # 0 is "before the first message", never a lost one
    if position.incarnation and now.incarnation != NO_LOG and position.incarnation != now.incarnation:
        point = broker.resume_point(topic, position)
        if point < start:
            settings.loss(f"topic {topic!r} is another log than the one this query read (incarnation "
                          f"{now.incarnation}, was {position.incarnation}): messages from {point} on are not "
                          f"the ones it read up to {start - 1}")
            return point
        log.info("topic %r: another incarnation of its log (%s), sharing every id this query read",
                 topic, now.incarnation)
    if start < now.first:
        settings.loss(f"messages {start}..{now.first - 1} of topic {topic!r} were removed by retention "
                      "before they were read")
        return now.first
    return start


class Range(InputPartition):
    """Messages ``start <= id < end`` of one topic, in the log named ``incarnation``: one Spark task."""

    def __init__(self, topic: str, start: int, end: int, incarnation: str) -> None:
        super().__init__((topic, start, end, incarnation))
        self.topic = topic
        self.start = start
        self.end = end
        self.incarnation = incarnation


def split(ranges: Mapping[str, tuple[int, int, str]], settings: ReadSettings) -> list[Range]:
    """One partition per topic range, split so that none holds more than ``maxRecordsPerPartition`` messages
    and there are at least ``minPartitions`` — by default as many as Spark's default parallelism (every core
    busy), but none under MIN_DEFAULT_SPLIT messages."""
    total = sum(end - start for start, end, _ in ranges.values())
    if total <= 0:
        return []
    size = settings.max_records_per_partition
    if settings.min_partitions:
        size = min(size, max(1, math.ceil(total / settings.min_partitions)))
    elif settings.parallelism:
        size = min(size, max(opts.MIN_DEFAULT_SPLIT, math.ceil(total / settings.parallelism)))
    return [Range(topic, first, min(end, first + size), incarnation)
            for topic, (start, end, incarnation) in sorted(ranges.items())
            for first in range(start, end, size)]


def read_range(settings: ReadSettings, part: Range) -> Iterator[Any]:
    """The rows of one partition as Arrow record batches, one per range fetch, the next fetch in flight while
    the last reply is turned into columns."""
    from pyspark.sql.pandas.types import to_arrow_schema

    from pipeline.arrow import to_batch

    if part.start >= part.end:
        return
    schema = to_arrow_schema(settings.schema(), timezone="UTC")
    client = settings.connection.client()
    worker.settle()  # once per Python worker, all imported: Spark's collection after each task skips them
    try:
        def ask(position: int) -> Future[Any]:
            return client.fetch_later(part.topic, position,
                                      max_messages=min(FETCH_RECORDS, part.end - position),
                                      max_bytes=FETCH_BYTES, records=True,
                                      incarnation=part.incarnation if part.incarnation != NO_LOG else None)

        position = part.start
        pending = ask(position)
        while position < part.end:
            reply = pending.result(settings.connection.request_timeout)
            if part.incarnation != NO_LOG and reply.incarnation != part.incarnation:
                raise DataLossError(f"topic {part.topic!r}'s log changed while it was read (incarnation "
                                    f"{reply.incarnation}, planned {part.incarnation}): the query will see "
                                    "it when it restarts")
            if reply.start_id > position:
                gone = min(reply.start_id, part.end) - 1
                settings.loss(f"messages {position}..{gone} of topic {part.topic!r} were removed by "
                              "retention before they were read")
                position = min(reply.start_id, part.end)
            if reply.count == 0:
                if position >= part.end:
                    break
                raise DataLossError(f"topic {part.topic!r} holds no message {position} (it ends before "
                                    f"{reply.next_id}): the range planned was {part.start}..{part.end - 1}")
            stored_end = reply.start_id + reply.count
            if stored_end < part.end:
                pending = ask(stored_end)  # fetched while this reply becomes columns
            yield to_batch(reply.payload, reply.start_id, reply.count, part.topic, schema, stop_id=part.end,
                           check_crc=settings.check_crcs)
            position = stored_end
    finally:
        client.close(timeout=1.0)


# ------------------------------------------------------------------------------------------------ reading


class Mc0BatchReader(DataSourceReader):
    def __init__(self, settings: ReadSettings) -> None:
        self.settings = settings

    def partitions(self) -> Sequence[InputPartition]:
        settings = self.settings
        broker = Broker(settings.connection)
        worker.settle()  # planned in a Python worker of its own, which Spark collects after each use
        try:
            topics = topics_of(settings, broker)
            bounds = broker.bounds(topics)
            starts = resolve(settings, settings.starting, broker, bounds, EARLIEST)
            ends = resolve(settings, settings.ending, broker, bounds, LATEST)
            ranges = {}
            for topic, now in bounds.items():
                start = begin(settings, broker, topic, Position(starts[topic], now.incarnation), now)
                ranges[topic] = (start, max(start, min(ends[topic], now.next)), now.incarnation)
        finally:
            broker.close()
        return split(ranges, settings) or [Range("", 0, 0, NO_LOG)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, Range)
        yield from read_range(self.settings, partition)


def cap(start: Mapping[str, int], latest: Mapping[str, int], max_rows: int) -> dict[str, int]:
    """End offsets holding at most ``max_rows`` messages in all, shared out in proportion to what each topic
    has waiting (each topic with something waiting moves by at least one)."""
    waiting = {topic: max(0, latest[topic] - start[topic]) for topic in latest}
    total = sum(waiting.values())
    if total <= max_rows:
        return dict(latest)
    out = {}
    left = max_rows
    for topic, count in sorted(waiting.items()):
        share = min(count, left, max(1 if count else 0, count * max_rows // total))
        out[topic] = start[topic] + share
        left -= share
    return out


class Mc0StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are :func:`encode_offset` of each topic's :class:`Position`. On the driver the reader keeps one
    connection, the latest bounds it knows per topic, and a long poll per topic while the stream is idle: an
    idle query costs the broker about two commands a second per topic, and a new message ends the poll at
    once."""

    def __init__(self, settings: ReadSettings) -> None:
        self.settings = settings
        self._init_driver_state()

    def _init_driver_state(self) -> None:
        self._broker: Broker | None = None
        self._known: dict[str, Bounds] = {}
        self._polls: dict[str, Future[Any]] = {}
        self._poll_deadlines: dict[str, float] = {}  # past it, a poll's answer is not coming (a restart)
        self._topics: list[str] | None = None
        self._discovered_at = 0.0
        self._target: dict[str, int] | None = None  # Trigger.AvailableNow: never read past these
        self._last_trigger: float | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"settings": self.settings}  # executors get the settings; the driver's connection stays here

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.settings = state["settings"]
        self._init_driver_state()

    @property
    def broker(self) -> Broker:
        if self._broker is None:
            self._broker = Broker(self.settings.connection)
        return self._broker

    def _current_topics(self) -> list[str]:
        now = time.monotonic()
        if self._topics is None or (self.settings.pattern is not None
                                    and now - self._discovered_at >= self.settings.discovery_ms / 1000):
            topics = topics_of(self.settings, self.broker)
            if self._topics is not None:
                for gone in set(self._topics) - set(topics):
                    log.warning("topic %r no longer exists: no longer read", gone)
                    self._known.pop(gone, None)
                    self._polls.pop(gone, None)
                    self._poll_deadlines.pop(gone, None)
            self._topics, self._discovered_at = topics, now
        return self._topics

    def _harvest(self) -> None:
        """Take the answers of long polls that ended: each says where its topic stands now. A poll whose
        answer is overdue (the broker restarted and forgot it) is given up: its topic is asked again."""
        now = time.monotonic()
        for topic, future in list(self._polls.items()):
            overdue = now > self._poll_deadlines[topic]
            if future.done() or overdue:
                del self._polls[topic], self._poll_deadlines[topic]
                try:
                    result = future.result(timeout=0)
                except Exception:  # lost with a connection, or overdue: the next refresh asks again
                    self._known.pop(topic, None)
                    continue
                self._known[topic] = Bounds(result.first_id, result.next_id, result.incarnation)

    def _refresh(self, topics: Sequence[str]) -> dict[str, Bounds]:
        """The latest bounds of every topic. With long polls, what a poll last said is trusted: a topic with
        a poll still waiting has nothing new (the broker would have answered), and a topic whose bounds are
        older than what it now holds is found out by the next poll, which starts from them and so returns at
        once. Without long polls, or for a topic never asked, the broker is asked (all topics at once)."""
        self._harvest()
        if self.settings.fetch_max_wait_ms > 0:
            stale = [topic for topic in topics if topic not in self._known]
        else:
            stale = list(topics)
        if stale:
            self._known.update(self.broker.bounds(stale))
        return {topic: self._known[topic] for topic in topics}

    def _poll(self, topics: Sequence[str], seconds: float) -> None:
        """Wait up to ``seconds`` for any topic to get a message past the latest known (a long poll each)."""
        client = self.broker.client
        wait = self.settings.fetch_max_wait_ms / 1000
        for topic in topics:
            if topic not in self._polls:
                known = self._known[topic]
                self._polls[topic] = client.fetch_later(
                    topic, known.next, max_messages=0, wait=wait,
                    incarnation=known.incarnation if known.incarnation != NO_LOG else None)
                deadline = time.monotonic() + wait + self.settings.connection.request_timeout
                self._poll_deadlines[topic] = deadline
        wait_for(list(self._polls.values()), timeout=seconds, return_when=FIRST_COMPLETED)
        self._harvest()

    def initialOffset(self) -> dict:
        settings = self.settings
        topics = self._current_topics()
        bounds = self._refresh(topics)
        starts = resolve(settings, settings.starting, self.broker, bounds, LATEST)
        return encode_offset({t: Position(starts[t], bounds[t].incarnation) for t in topics})

    def getDefaultReadLimit(self) -> ReadLimit:
        settings = self.settings
        if settings.max_per_trigger:
            return ReadMaxRows(settings.max_per_trigger)
        if settings.min_per_trigger:
            return ReadMinRows(settings.min_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        topics = self._current_topics()
        bounds = self.broker.bounds(topics)
        self._known.update(bounds)  # what the micro-batches up to the target are planned from
        self._target = {topic: b.next for topic, b in bounds.items()}

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        end = self._latest(start, limit)
        idle = end == start and self._target is None and self.settings.fetch_max_wait_ms > 0
        if idle:
            topics = self._current_topics()
            self._poll(topics, self._poll_seconds())
            end = self._latest(start, limit)
        return end

    def _poll_seconds(self) -> float:
        wait = self.settings.fetch_max_wait_ms / 1000
        if self.settings.min_per_trigger and self._last_trigger is not None:
            due = self._last_trigger + self.settings.max_trigger_delay_ms / 1000 - time.monotonic()
            wait = max(0.0, min(wait, due))
        return wait

    def _latest(self, start: dict, limit: ReadLimit) -> dict:
        settings = self.settings
        positions = decode_offset(start)
        topics = self._current_topics()
        bounds = self._refresh(topics)
        begins = {t: begin(settings, self.broker, t, positions.get(t), bounds[t]) for t in topics}
        latest = {t: max(begins[t], bounds[t].next) for t in topics}
        if self._target is not None:
            latest = {t: max(begins[t], min(latest[t], self._target.get(t, begins[t]))) for t in topics}
        now = time.monotonic()
        if self._last_trigger is None:
            self._last_trigger = now
        if not isinstance(limit, ReadAllAvailable):
            waiting = sum(latest[t] - begins[t] for t in topics)
            delay = settings.max_trigger_delay_ms / 1000
            too_few = settings.min_per_trigger and waiting < settings.min_per_trigger
            if too_few and now - self._last_trigger < delay:
                latest = dict(begins)  # not enough yet: Kafka's minOffsetsPerTrigger
            elif settings.max_per_trigger:
                latest = cap(begins, latest, settings.max_per_trigger)
        end = encode_offset({t: Position(latest[t], bounds[t].incarnation) for t in topics})
        if end != start:
            self._last_trigger = now
        return end

    def reportLatestOffset(self) -> dict | None:
        """The latest offsets known (from the last latestOffset): the progress's ``latestOffset``, against
        which a query's lag shows (:func:`offsets_behind`)."""
        if not self._known or self._topics is None:
            return None
        return encode_offset({t: Position(self._known[t].next, self._known[t].incarnation)
                              for t in self._topics if t in self._known})

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        settings = self.settings
        first = decode_offset(start)
        last = decode_offset(end)
        bounds = self.broker.bounds(list(last))
        ranges = {}
        for topic, stop in last.items():
            begins = begin(settings, self.broker, topic, first.get(topic), bounds[topic])
            ranges[topic] = (begins, max(begins, stop.next), stop.incarnation)
        return split(ranges, settings)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, Range)
        yield from read_range(self.settings, partition)

    def commit(self, end: dict) -> None:
        """Nothing to release: the broker keeps no state for readers (retention alone removes messages)."""

    def stop(self) -> None:
        if self._broker is not None:
            self._broker.close()


def offsets_behind(progress: Mapping[str, Any]) -> dict[str, float]:
    """What Kafka's source reports as metrics, computed from a streaming progress (``query.lastProgress``):
    ``avgOffsetsBehindLatest``, ``maxOffsetsBehindLatest`` and ``minOffsetsBehindLatest`` of each mc0
    source, over its topics. PySpark's Python sources cannot put metrics into the progress themselves (see
    docs/pipeline.md), but they do report ``latestOffset``, and the lag is its distance to ``endOffset``."""
    import json

    out: dict[str, float] = {}
    for source in progress.get("sources", []):
        latest, end = source.get("latestOffset"), source.get("endOffset")
        if not latest or not end:
            continue
        latest_positions = decode_offset(json.loads(latest) if isinstance(latest, str) else latest)
        end_positions = decode_offset(json.loads(end) if isinstance(end, str) else end)
        behind = [max(0, p.next - end_positions[t].next)
                  for t, p in latest_positions.items() if t in end_positions]
        if behind:
            out = {"avgOffsetsBehindLatest": sum(behind) / len(behind), "maxOffsetsBehindLatest": max(behind),
                   "minOffsetsBehindLatest": min(behind)}
    return out


# ------------------------------------------------------------------------------------------------ the source


class Mc0DataSource(DataSource):
    """``format("mc0")``: read topics, write DataFrames into topics."""

    #: Spark's default parallelism, set by :func:`register` (a subclass made there carries it to the Python
    #: workers that plan reads, which have no SparkContext to ask).
    default_parallelism: int | None = None

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        # Asked by load(), for batch and streaming reads alike: the names are checked here, so that a typo
        # fails at load(); what depends on the mode is checked when Spark asks for the reader.
        worker.settle()  # asked in a Python worker of its own, which Spark collects after each use
        opts.check(self.options, None)
        return SCHEMA_WITH_HEADERS if opts.flag(self.options, "includeHeaders", False) else SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        settings = ReadSettings.parse(self.options, Mode.READ, self.default_parallelism)
        return Mc0BatchReader(settings.reading(schema))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        settings = ReadSettings.parse(self.options, Mode.STREAM, self.default_parallelism)
        return Mc0StreamReader(settings.reading(schema))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from pipeline.sink import batch_writer

        return batch_writer(self.options, schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from pipeline.sink import stream_writer

        return stream_writer(self.options, schema)


def register(spark: Any) -> None:
    """Make ``format("mc0")`` available in ``spark``, splitting reads for its default parallelism."""
    try:
        parallelism = spark.sparkContext.defaultParallelism
    except Exception:  # Spark Connect has no SparkContext: the planning machine's cores then
        parallelism = None
    source = type(Mc0DataSource.__name__, (Mc0DataSource,), {"default_parallelism": parallelism,
                                                             "__module__": __name__})
    spark.dataSource.register(source)
