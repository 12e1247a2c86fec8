"""The ``mc0`` sink: DataFrames written into topics, each row exactly once even when Spark runs a task again.

Each write task publishes its rows as idempotent ``PUTS`` batches (docs/mc0.md, "Idempotent PUTS") under a
producer id derived from what identifies the task's work, not the attempt:

* a streaming write: the query id, the micro-batch id and the partition — stable across task retries,
  speculative copies, and a micro-batch replayed after the query restarts from its checkpoint;
* a batch write: the ``writeId`` option (or an id made once per write on the driver) and the partition.

Rows are numbered per topic in the order the task sees them, so an attempt that sends the same rows again
finds the broker skipping every one already stored, wherever the earlier attempt stopped. A task succeeds only
once the broker confirmed every row (as durably as each topic's sync level promises). The guarantee, and what
it assumes, is spelled out in docs/pipeline.md ("Exactly-once writes").

Rows come as Arrow record batches (``DataSourceArrowWriter``): columns are taken in bulk, and the usual write
(one topic, bodies only) sends its PUTS straight from the value column's buffers, as one topic's bodies in
two frames (extension ``columns``, :mod:`pipeline.puts`); the others build an entry per row. Checked before
anything runs: ``value`` binary or string, ``key`` binary or string, ``topic`` a string (the ``topic`` option
overrides it, as in Kafka), ``headers`` Kafka's ``array<struct<key: string, value: binary>>`` (or a string
map), no ``partition``, and no overwrite.
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections import deque
from collections.abc import Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import ArrayType, BinaryType, DataType, MapType, StringType, StructType

from pipeline import options as opts
from pipeline import worker
from pipeline.arrow import KEY_HEADER
from pipeline.options import Connection, Mode, OptionError
from pipeline.puts import topic_bodies

log = logging.getLogger("mc0.pipeline")

#: Rows per idempotent PUTS, and bytes: big enough that the broker's per-batch work is noise, small enough
#: that a retry resends little and a frame stays far below the broker's 16 MiB.
WRITE_BATCH = 2000
WRITE_BYTES = 1 << 20
#: Batches a task keeps in flight: the broker stores one while the next is packed and on its way.
IN_FLIGHT = 4
#: Headers the broker writes itself, or that mean something else here.
RESERVED_HEADERS = frozenset({b"TOPIC", b"ID", b"MESSAGE-ID", b"TIMESTAMP", KEY_HEADER})
#: Spark's local properties that name a streaming write's query and micro-batch.
QUERY_ID = "sql.streaming.queryId"
BATCH_ID = "streaming.sql.batchId"


def _text_or_binary(data_type: DataType) -> bool:
    return isinstance(data_type, BinaryType | StringType)


@dataclass(frozen=True)
class WriteSettings:
    """The options and columns of a write, checked on the driver; shipped to executors in the writer."""

    connection: Connection
    topic: str | None  # the option: every row goes there
    topic_column: bool
    key_column: bool
    headers_column: str | None  # "array" (Kafka's) | "map" | None

    @classmethod
    def parse(cls, options: Mapping[str, str], schema: StructType, mode: Mode) -> WriteSettings:
        opts.check(options, mode)
        # Accepted as Kafka's sink accepts it, and changes nothing, as there: a headers column is written
        # whenever there is one. Its value is still checked, as every option's is.
        opts.flag(options, "includeHeaders", False)
        fields = {f.name: f.dataType for f in schema.fields}
        if "value" not in fields:
            raise OptionError("a DataFrame written to mc0 needs a value column (binary or string)")
        for name in ("value", "key"):
            if name in fields and not _text_or_binary(fields[name]):
                raise OptionError(f"column {name} must be binary or string to be written to mc0, not "
                                  f"{fields[name].simpleString()}: cast it (e.g. to_json, or cast as string)")
        if "topic" in fields and not isinstance(fields["topic"], StringType):
            raise OptionError(f"column topic must be a string, not {fields['topic'].simpleString()}")
        if "partition" in fields:
            raise OptionError("column partition: mc0 topics have no partitions (drop the column)")
        topic = options.get("topic")
        if topic is not None and not topic:
            raise OptionError("option topic must name a topic")
        if topic is None and "topic" not in fields:
            raise OptionError("rows need a topic: give the topic option or a topic column")
        headers = None
        if "headers" in fields:
            headers = _headers_shape(fields["headers"])
        return cls(Connection.parse(options), topic, "topic" in fields, "key" in fields, headers)


def _headers_shape(data_type: DataType) -> str:
    if isinstance(data_type, ArrayType) and isinstance(data_type.elementType, StructType):
        inner = {f.name: f.dataType for f in data_type.elementType.fields}
        if set(inner) == {"key", "value"} and isinstance(inner["key"], StringType) and _text_or_binary(
                inner["value"]):
            return "array"
    if isinstance(data_type, MapType) and isinstance(data_type.keyType, StringType) and _text_or_binary(
            data_type.valueType):
        return "map"
    raise OptionError(f"column headers must be array<struct<key: string, value: binary>> (as Kafka's), not "
                      f"{data_type.simpleString()}")


def _bytes(value: Any) -> bytes:
    return value.encode("utf-8") if isinstance(value, str) else bytes(value)


def _row_headers(key: Any, headers: Any, shape: str | None) -> dict[bytes, bytes] | None:
    out: dict[bytes, bytes] = {}
    if headers:
        pairs = ((h["key"], h["value"]) for h in headers) if shape == "array" else headers
        for name, value in pairs:
            raw = _bytes(name)
            if not raw or raw.upper() in RESERVED_HEADERS or raw in out:
                raise ValueError(f"header {name!r}: empty, given twice in a row (mc0 headers are a map), or "
                                 "reserved (TOPIC, ID, MESSAGE-ID, TIMESTAMP; KEY: that is the key column)")
            if value is None:
                raise ValueError(f"header {name!r} has a null value: mc0 header values are bytes")
            out[raw] = _bytes(value)
    if key is not None:
        out[KEY_HEADER] = _bytes(key)
    return out or None


@dataclass
class Written(WriterCommitMessage):
    rows: int
    duplicates: int  # rows an earlier attempt of this task had stored already (not stored again)


def publish(settings: WriteSettings, batches: Iterator[Any], producer: bytes) -> Written:
    """Publish every row as idempotent batches (per topic, numbered from 0); returns once the broker confirmed
    all of them."""
    client = settings.connection.client()
    worker.settle()  # once per Python worker, all imported: Spark's collection after each task skips them
    timeout = settings.connection.request_timeout
    sequences: dict[str, int] = {}
    pending: dict[str, list[tuple[str, bytes, dict[bytes, bytes] | None]]] = {}  # entries, per topic
    slices: dict[str, list[pa.Array]] = {}  # or slices of the value column (one topic, bodies only)
    counts: dict[str, int] = {}  # entries waiting, per topic, either way
    sizes: dict[str, int] = {}
    in_flight: deque[Future[dict[str, str]]] = deque()
    rows = duplicates = 0

    def settle(future: Future[dict[str, str]]) -> None:
        nonlocal duplicates
        duplicates += int(future.result(timeout).get("DUPLICATES", "0"))

    def send(topic: str) -> None:
        count = counts.pop(topic)
        sizes.pop(topic)
        items = topic_bodies(topic.encode(), slices.pop(topic)) if topic in slices else pending.pop(topic)
        sequence = sequences.get(topic, 0)
        sequences[topic] = sequence + count
        in_flight.append(client.publish_batch_later(items, producer=producer, sequence=sequence))
        # The broker refuses a batch that would leave a gap after what a producer stored, but takes a
        # stranger's first batch wherever it begins: so a topic's first batch is confirmed before the next
        # goes, or a refused first batch followed by a stored second would make the retry skip the first.
        while len(in_flight) > (IN_FLIGHT if sequence else 0):
            settle(in_flight.popleft())

    try:
        for batch in batches:
            count = batch.num_rows
            if not count:
                continue
            value = batch.column("value")
            if value.null_count:
                raise ValueError("a row has a null value: mc0 messages always have a body (Kafka's "
                                 "tombstones have no meaning here)")
            value = value.cast(pa.binary())  # strings as their UTF-8 bytes, in one call
            topic = settings.topic
            if topic is not None and not (settings.key_column or settings.headers_column):
                # The usual write, one topic and bodies only: whole slices, cut by count and bytes, sent
                # straight from the column's buffers (pipeline.puts), with no Python object per row.
                ends = np.cumsum(pc.binary_length(value).to_numpy(zero_copy_only=False))
                position = 0
                while position < count:
                    parts = slices.setdefault(topic, [])
                    waiting = counts.setdefault(topic, 0)
                    size = sizes.setdefault(topic, 0)
                    before = int(ends[position - 1]) if position else 0
                    fits = int(np.searchsorted(ends, before + WRITE_BYTES - size, side="right")) - position
                    end = position + max(1, min(WRITE_BATCH - waiting, fits))
                    parts.append(value.slice(position, end - position))
                    counts[topic] = waiting + end - position
                    sizes[topic] = size + int(ends[end - 1]) - before
                    position = end
                    if counts[topic] >= WRITE_BATCH or sizes[topic] >= WRITE_BYTES:
                        send(topic)
                rows += count
                continue
            values = value.to_pylist()
            topics = batch.column("topic").to_pylist() if settings.topic is None else None
            keys = batch.column("key").to_pylist() if settings.key_column else None
            headers = batch.column("headers").to_pylist() if settings.headers_column else None
            for index in range(count):
                topic = settings.topic if topics is None else topics[index]
                if not topic:
                    raise ValueError("a row has no topic: give the topic option or a topic in every row")
                extra = None
                if keys is not None or headers is not None:
                    extra = _row_headers(None if keys is None else keys[index],
                                         None if headers is None else headers[index], settings.headers_column)
                body = values[index]
                entries = pending.get(topic)
                if entries is None:
                    entries = pending[topic] = []
                    sizes[topic] = counts[topic] = 0
                entries.append((topic, body, extra))
                sizes[topic] += len(body)
                counts[topic] += 1
                if counts[topic] >= WRITE_BATCH or sizes[topic] >= WRITE_BYTES:
                    send(topic)
            rows += count
        for topic in list(counts):
            send(topic)
        while in_flight:
            settle(in_flight.popleft())
    finally:
        client.close(timeout=1.0)
    return Written(rows, duplicates)


def producer_id(*parts: object) -> bytes:
    """An id of at most 255 bytes (the broker's bound), readable when it can be."""
    text = ":".join(str(part) for part in parts).encode()
    return text if len(text) <= 255 else hashlib.sha256(text).hexdigest().encode()


def _task() -> Any:
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        raise RuntimeError("the mc0 sink writes inside Spark tasks only")
    return context


def _report(messages: list[WriterCommitMessage | None], what: str) -> None:
    written = [m for m in messages if isinstance(m, Written)]
    duplicates = sum(m.duplicates for m in written)
    if duplicates:
        log.info("%s: %d rows stored, %d already stored by an earlier attempt and not stored again", what,
                 sum(m.rows for m in written) - duplicates, duplicates)


class Mc0BatchWriter(DataSourceArrowWriter):
    def __init__(self, settings: WriteSettings, write_id: str) -> None:
        self.settings = settings
        self.write_id = write_id  # made once on the driver: every task (and retry) of this write shares it

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        return publish(self.settings, iterator, producer_id("w", self.write_id, _task().partitionId()))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        _report(messages, f"write {self.write_id}")

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Rows a failed write stored stay (topics are append-only); writing again with the same writeId
        stores only what is missing."""


class Mc0StreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, settings: WriteSettings, fallback_id: str) -> None:
        self.settings = settings
        self.fallback_id = fallback_id  # only if Spark did not say which query and micro-batch this is

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        context = _task()
        query, batch = context.getLocalProperty(QUERY_ID), context.getLocalProperty(BATCH_ID)
        if query is None or batch is None:
            producer = producer_id("w", self.fallback_id, context.partitionId())
        else:
            producer = producer_id("q", query, batch, context.partitionId())
        return publish(self.settings, iterator, producer)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _report(messages, f"micro-batch {batchId}")

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Rows stored stay: the micro-batch runs again under the same producer ids and stores the rest."""


def batch_writer(options: Mapping[str, str], schema: StructType, overwrite: bool) -> Mc0BatchWriter:
    if overwrite:
        raise OptionError("mode overwrite: mc0 topics are append-only logs, nothing in them can be replaced; "
                          "use mode('append')")
    settings = WriteSettings.parse(options, schema, Mode.WRITE)
    return Mc0BatchWriter(settings, options.get("writeId") or uuid.uuid4().hex)


def stream_writer(options: Mapping[str, str], schema: StructType) -> Mc0StreamWriter:
    # Every output mode is accepted, as by Kafka's sink: complete and update write the rows they are given.
    return Mc0StreamWriter(WriteSettings.parse(options, schema, Mode.WRITE_STREAM), uuid.uuid4().hex)
