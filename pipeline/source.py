"""The ``mc0`` data source for Spark: topics read as batch and streaming DataFrames, and DataFrames written
into topics, through PySpark's Python Data Source API (``pyspark.sql.datasource``).

Everything goes through the broker, never its disk, so the same code runs in ``local[*]`` and on a cluster
whose executors reach the broker over the network:

* reading uses the broker's range fetch (``FETCH``: stored messages of a persistent topic from an id, bounded
  per reply) and its offsets query; offsets are **the next message id per topic**;
* writing publishes with confirmed ``PUTS`` batches: a task succeeds only once the broker confirmed every
  row it was given (at-least-once: a task Spark retries publishes its rows again).

Options mirror Spark's Kafka source: ``broker``, ``subscribe``, ``startingOffsets``, ``endingOffsets``,
``maxOffsetsPerTrigger``, ``failOnDataLoss``, ``minPartitions``, ``includeHeaders``, and for writing
``topic``; CURVE: ``curve`` (``false`` for plaintext), ``keys`` (a keys folder) or ``serverKey`` /
``publicKey`` / ``secretKey`` (Z85). ``docs/pipeline.md`` describes them. Readers and writers hold only
their options and plans (picklable); sockets are opened inside ``read()`` / ``write()``.

Register once per session: ``spark.dataSource.register(Mc0DataSource)``, then ``spark.read.format("mc0")``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

FORMAT = "mc0"
DEFAULT_BROKER = "tcp://127.0.0.1:61616"
#: Messages per fetch: bounded replies keep many executors from hurting live traffic.
FETCH_MESSAGES = 5000
FETCH_BYTES = 4 << 20
#: Rows per confirmed PUTS batch when writing.
WRITE_BATCH = 1000
#: A partition is split when it holds more messages than this, even without ``minPartitions``.
MAX_PARTITION = 1_000_000

#: In offsets JSON, as in Kafka's: the oldest stored message, and the next one to come.
EARLIEST = -2
LATEST = -1

SCHEMA = "topic string, id long, timestamp timestamp, value binary"
SCHEMA_WITH_HEADERS = "topic string, id long, timestamp timestamp, headers map<string,string>, value binary"


class DataLossError(Exception):
    """Messages a query was going to read were removed by retention (and ``failOnDataLoss`` is true)."""


def _flag(options: Mapping[str, str], name: str, default: bool) -> bool:
    value = options.get(name)
    if value is None:
        return default
    if value.lower() not in ("true", "false"):
        raise ValueError(f"option {name} must be true or false, not {value!r}")
    return value.lower() == "true"


def _positive(options: Mapping[str, str], name: str) -> int | None:
    value = options.get(name)
    if value is None:
        return None
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"option {name} must be a positive integer, not {value!r}")
    return int(value)


@dataclass(frozen=True)
class Settings:
    """The options, checked once on the driver; shipped to executors inside readers and writers."""

    broker: str
    topics: tuple[str, ...]
    starting: str  # "earliest" | "latest" | JSON of topic -> id
    ending: str  # "latest" | JSON of topic -> id (batch only)
    max_per_trigger: int | None
    fail_on_data_loss: bool
    min_partitions: int | None
    include_headers: bool
    topic: str | None  # writes: the topic when rows have no topic column
    curve: bool
    keys: str | None
    server_key: str | None
    public_key: str | None
    secret_key: str | None

    @classmethod
    def parse(cls, options: Mapping[str, str], *, streaming: bool) -> Settings:
        """From Spark's options, whose names are case-insensitive (Spark's own mapping: never copied into a
        plain dict, which would lose that)."""
        topics = tuple(t.strip() for t in options.get("subscribe", "").split(",") if t.strip())
        return cls(
            broker=options.get("broker", DEFAULT_BROKER),
            topics=topics,
            starting=options.get("startingOffsets", "latest" if streaming else "earliest"),
            ending=options.get("endingOffsets", "latest"),
            max_per_trigger=_positive(options, "maxOffsetsPerTrigger"),
            fail_on_data_loss=_flag(options, "failOnDataLoss", True),
            min_partitions=_positive(options, "minPartitions"),
            include_headers=_flag(options, "includeHeaders", False),
            topic=options.get("topic"),
            curve=_flag(options, "curve", True),
            keys=options.get("keys"),
            server_key=options.get("serverKey"),
            public_key=options.get("publicKey"),
            secret_key=options.get("secretKey"),
        )

    def client(self) -> Any:
        """A connected :class:`connector.Client` (imported here: executors import it when they run)."""
        from connector import Client, Credentials

        if not self.curve:
            return Client(self.broker, curve=False, timeout=60.0)
        if self.server_key and self.public_key and self.secret_key:
            credentials = Credentials(self.server_key.encode(), self.public_key.encode(),
                                      self.secret_key.encode())
            return Client(self.broker, credentials=credentials, timeout=60.0)
        return Client(self.broker, keys=self.keys or "keys", timeout=60.0)

    def require_topics(self) -> None:
        if not self.topics:
            raise ValueError("option subscribe must name at least one topic (comma-separated)")

    def offsets(self, which: str, bounds: dict[str, tuple[int, int]], default: int) -> dict[str, int]:
        """``earliest`` / ``latest`` / JSON resolved to a next-id per topic, given (first, next) bounds. In
        JSON, as in Kafka's options, -2 means earliest and -1 latest; a topic the JSON leaves out gets
        ``default`` (one of those two)."""
        if which == "earliest":
            return {topic: first for topic, (first, _) in bounds.items()}
        if which == "latest":
            return {topic: next_id for topic, (_, next_id) in bounds.items()}
        try:
            given = json.loads(which)
        except ValueError:
            raise ValueError(f"offsets must be earliest, latest or a JSON object, not {which!r}") from None
        if not isinstance(given, dict) or not all(isinstance(v, int) for v in given.values()):
            raise ValueError(f"offsets JSON must map topics to message ids: {which!r}")
        out = {}
        for topic, (first, next_id) in bounds.items():
            value = given.get(topic, default)
            out[topic] = first if value == -2 else next_id if value == -1 else value
        return out


def bounds_of(settings: Settings) -> dict[str, tuple[int, int]]:
    """(first stored id, next id) of every subscribed topic, asked of the broker."""
    with settings.client() as client:
        return {topic: client.offsets(topic) for topic in settings.topics}


class Range(InputPartition):
    """Messages ``start <= id < end`` of one topic: one Spark task."""

    def __init__(self, topic: str, start: int, end: int) -> None:
        super().__init__((topic, start, end))
        self.topic = topic
        self.start = start
        self.end = end


def split(ranges: dict[str, tuple[int, int]], min_partitions: int | None) -> list[Range]:
    """One partition per topic range, split further so there are at least ``min_partitions`` and none holds
    more than :data:`MAX_PARTITION` messages."""
    total = sum(end - start for start, end in ranges.values())
    if total == 0:
        return []
    size = MAX_PARTITION
    if min_partitions:
        size = min(size, max(1, math.ceil(total / min_partitions)))
    out = []
    for topic, (start, end) in ranges.items():
        for first in range(start, end, size):
            out.append(Range(topic, first, min(end, first + size)))
    return out


def read_range(settings: Settings, part: Range) -> Iterator[Any]:
    """The rows of one partition as Arrow record batches, one per fetch."""
    import pyarrow as pa

    fields = [pa.field("topic", pa.string()), pa.field("id", pa.int64()),
              pa.field("timestamp", pa.timestamp("us", tz="UTC"))]
    if settings.include_headers:
        fields.append(pa.field("headers", pa.map_(pa.string(), pa.string())))
    fields.append(pa.field("value", pa.binary()))
    schema = pa.schema(fields)
    position = part.start
    with settings.client() as client:
        while position < part.end:
            result = client.fetch(part.topic, position, max_messages=min(FETCH_MESSAGES, part.end - position),
                                  max_bytes=FETCH_BYTES)
            messages = [m for m in result.messages if m.id is not None and m.id < part.end]
            first = messages[0].id if messages else result.first_id
            if first > position:  # retention removed what this range was to read
                if settings.fail_on_data_loss:
                    raise DataLossError(
                        f"messages {position}..{min(first, part.end) - 1} of topic {part.topic!r} were "
                        "removed by retention before they were read (failOnDataLoss=false skips them)")
                position = min(first, part.end)
            if not messages:
                if result.next_id <= position or position >= part.end:
                    break
                continue
            columns: list[Any] = [
                pa.array([part.topic] * len(messages), pa.string()),
                pa.array([m.id for m in messages], pa.int64()),
                pa.array([(m.timestamp or 0) * 1000 for m in messages], pa.timestamp("us", tz="UTC")),
            ]
            if settings.include_headers:
                columns.append(pa.array([list(m.headers.items()) for m in messages],
                                        pa.map_(pa.string(), pa.string())))
            columns.append(pa.array([m.body for m in messages], pa.binary()))
            yield pa.RecordBatch.from_arrays(columns, schema=schema)
            position = messages[-1].id + 1


def check_loss(
    settings: Settings, start: dict[str, int], bounds: dict[str, tuple[int, int]]
) -> dict[str, int]:
    """Start offsets below what a topic still stores: an error, or (failOnDataLoss=false) skipped."""
    out = dict(start)
    for topic, (first, _) in bounds.items():
        if out.get(topic, first) < first:
            if settings.fail_on_data_loss:
                raise DataLossError(f"topic {topic!r} starts at message {first} now; messages "
                                    f"{out[topic]}..{first - 1} were removed by retention before they were "
                                    "read (failOnDataLoss=false skips them)")
            out[topic] = first
    return out


# ------------------------------------------------------------------------------------------------ reading


class Mc0BatchReader(DataSourceReader):
    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def partitions(self) -> Sequence[InputPartition]:
        settings = self.settings
        bounds = bounds_of(settings)
        start = check_loss(settings, settings.offsets(settings.starting, bounds, EARLIEST), bounds)
        end = settings.offsets(settings.ending, bounds, LATEST)
        ranges = {topic: (start[topic], max(start[topic], min(end[topic], bounds[topic][1])))
                  for topic in settings.topics}
        return split(ranges, settings.min_partitions) or [Range(settings.topics[0], 0, 0)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, Range)
        if partition.start < partition.end:
            yield from read_range(self.settings, partition)


class Mc0StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are ``{topic: next message id}``; a micro-batch reads ``start <= id < end`` of each topic."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.target: dict[str, int] | None = None  # Trigger.AvailableNow: never read past these

    def initialOffset(self) -> dict:
        bounds = bounds_of(self.settings)
        return self.settings.offsets(self.settings.starting, bounds, LATEST)

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.settings.max_per_trigger
        return ReadMaxRows(limit) if limit else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = {topic: next_id for topic, (_, next_id) in bounds_of(self.settings).items()}

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        bounds = bounds_of(self.settings)
        latest = {topic: next_id for topic, (_, next_id) in bounds.items()}
        if self.target is not None:
            latest = {topic: min(latest[topic], self.target.get(topic, latest[topic])) for topic in latest}
        begin = {topic: max(start.get(topic, bounds[topic][0]), 0) for topic in latest}
        if isinstance(limit, ReadMaxRows):
            latest = cap(begin, latest, limit.max_rows)
        return {topic: max(begin[topic], latest[topic]) for topic in latest}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        bounds = bounds_of(self.settings)
        topics = self.settings.topics
        begin = check_loss(self.settings, {t: start.get(t, bounds[t][0]) for t in topics}, bounds)
        ranges = {topic: (begin[topic], max(begin[topic], end.get(topic, begin[topic])))
                  for topic in self.settings.topics}
        return split(ranges, self.settings.min_partitions)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, Range)
        yield from read_range(self.settings, partition)

    def commit(self, end: dict) -> None:
        """Nothing to release: the broker keeps no state for readers (retention alone removes messages)."""


def cap(start: dict[str, int], latest: dict[str, int], max_rows: int) -> dict[str, int]:
    """End offsets holding at most ``max_rows`` messages in all, shared out in proportion to what each topic
    has waiting (each topic with something waiting moves by at least one)."""
    waiting = {topic: max(0, latest[topic] - start[topic]) for topic in latest}
    total = sum(waiting.values())
    if total <= max_rows:
        return latest
    out = {}
    left = max_rows
    for topic, count in sorted(waiting.items()):
        share = min(count, left, max(1 if count else 0, count * max_rows // total))
        out[topic] = start[topic] + share
        left -= share
    return out


# ------------------------------------------------------------------------------------------------ writing


@dataclass
class Written(WriterCommitMessage):
    rows: int


def write_rows(settings: Settings, rows: Iterator[Any]) -> Written:
    """Publish every row with confirmed PUTS batches; returns once the broker confirmed all of them."""
    written = 0
    batch: list[tuple[str, bytes, dict[str, str]]] = []
    with settings.client() as client:
        for row in rows:
            values = row.asDict()
            topic = values.get("topic") or settings.topic
            if not topic:
                raise ValueError("a row has no topic: give the DataFrame a topic column or the topic option")
            value = values.get("value")
            if value is None:
                raise ValueError("a row has no value")
            body = bytes(value) if not isinstance(value, str) else value.encode()
            headers = values.get("headers") or {}
            batch.append((topic, body, {str(k): str(v) for k, v in headers.items()}))
            if len(batch) == WRITE_BATCH:
                client.publish_batch(batch)
                written += len(batch)
                batch = []
        if batch:
            client.publish_batch(batch)
            written += len(batch)
    return Written(written)


class Mc0BatchWriter(DataSourceWriter):
    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        return write_rows(self.settings, iterator)


class Mc0StreamWriter(DataSourceStreamWriter):
    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        return write_rows(self.settings, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Every task already had its rows confirmed by the broker; nothing is left to make visible."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Published rows cannot be taken back: the delivery guarantee is at-least-once."""


# ------------------------------------------------------------------------------------------------ the source


class Mc0DataSource(DataSource):
    """``format("mc0")``: read topics, write DataFrames into topics."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        return SCHEMA_WITH_HEADERS if _flag(self.options, "includeHeaders", False) else SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        settings = Settings.parse(self.options, streaming=False)
        settings.require_topics()
        return Mc0BatchReader(settings)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        settings = Settings.parse(self.options, streaming=True)
        settings.require_topics()
        return Mc0StreamReader(settings)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return Mc0BatchWriter(Settings.parse(self.options, streaming=False))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return Mc0StreamWriter(Settings.parse(self.options, streaming=True))


def register(spark: Any) -> None:
    """Make ``format("mc0")`` available in ``spark``."""
    spark.dataSource.register(Mc0DataSource)
