"""The ``mc0`` source and sink where a Kafka user has expectations: options checked like Spark's (unknown
ones with the nearest name, ones for another mode, Kafka's that mc0 cannot honour), a broker that never
answers failing a read after connectTimeoutMs, Kafka's offsets JSON,
timestamps, subscribePattern picking up a new topic, the sink's topic option over the topic column (the
feedback loop), value/key types, keys round-tripped, no overwrite, an idle stream's cost and lag, its long
poll told from polling, and minOffsetsPerTrigger with maxTriggerDelay.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from broker.server import Broker
from broker.topics import Persistence, TopicRule, TopicSpec
from connector import Client
from pipeline import options as source_options
from pipeline.source import offsets_behind
from protocol import mc0

pytestmark = pytest.mark.timeout(300)

RULES = (TopicRule("*", TopicSpec(persistence=Persistence.PERSISTENT)),)


@pytest.fixture
def broker(start_broker: Callable[..., Broker]) -> Broker:
    return start_broker(topics=RULES)


def options(broker: Broker) -> dict[str, str]:
    return {"broker": broker.endpoint, "curve": "false"}


def publish(broker: Broker, topic: str, count: int, start: int = 0) -> None:
    """``count`` messages ``topic:n``, in batches of the most a PUTS may hold."""
    with Client(broker.endpoint, curve=False, timeout=30) as client:
        for first in range(start, start + count, mc0.PUTS_MAX_ENTRIES):
            last = min(start + count, first + mc0.PUTS_MAX_ENTRIES)
            client.publish_batch([(topic, f"{topic}:{n}", None) for n in range(first, last)])


def stored(broker: Broker, topic: str) -> list[Any]:
    with Client(broker.endpoint, curve=False) as client:
        return client.fetch(topic, 1, max_messages=10_000).messages


def error_of(action: Callable[[], Any]) -> str:
    with pytest.raises(Exception) as info:  # noqa: PT011 - Spark wraps ours in its AnalysisException
        action()
    return str(info.value)


# ------------------------------------------------------------------------------------------------- options


def test_options_are_checked_like_sparks_with_the_kafka_name_suggested(spark: Any, broker: Broker) -> None:
    base = {**options(broker), "subscribe": "o"}
    publish(broker, "o", 3)

    def read(**extra: str) -> Callable[[], Any]:
        return lambda: spark.read.format("mc0").options(**base, **extra).load().collect()

    def stream(**extra: str) -> Callable[[], Any]:
        return lambda: spark.readStream.format("mc0").options(**base, **extra).load().writeStream.format(
            "memory").queryName("never").start().awaitTermination(60)

    from pyspark.errors import AnalysisException

    with pytest.raises(AnalysisException, match="unknown option maxoffsetpertrigger") as info:
        spark.read.format("mc0").options(**base, maxOffsetPerTrigger="5").load()  # at load(), not later
    assert "did you mean maxOffsetsPerTrigger" in str(info.value)
    with pytest.raises(AnalysisException, match="did you mean fetchMaxWaitMs"):
        spark.readStream.format("mc0").options(**base, fetchMaxWait="5").load()
    assert "did you mean startingOffsets" in error_of(read(startingOffset="earliest"))
    assert "applies to batch reads" in error_of(stream(endingOffsets="latest"))
    assert "applies to streaming reads" in error_of(read(maxOffsetsPerTrigger="5"))
    assert "no partitions" in error_of(read(assign='{"o": [0]}'))
    assert "mc0 is not Kafka" in error_of(read(**{"kafka.bootstrap.servers": "x:9092"}))
    assert "consumer group" in error_of(read(groupIdPrefix="g"))
    assert "exactly one of subscribe" in error_of(
        lambda: spark.read.format("mc0").options(**options(broker), subscribePattern="o").option(
            "subscribe", "o").load().collect())
    assert "can't be latest for batch" in error_of(read(startingOffsets="latest"))
    assert "can't be earliest" in error_of(read(endingOffsets="earliest"))
    assert "no partitions" in error_of(read(startingOffsets='{"o": {"0": 1, "1": 5}}'))
    assert "true or false" in error_of(read(failOnDataLoss="maybe"))
    with socket.socket() as probe:  # a port nobody listens on: the broker is down
        probe.bind(("127.0.0.1", 0))
        down = {"broker": f"tcp://127.0.0.1:{probe.getsockname()[1]}", "curve": "false"}
    started = time.monotonic()
    assert "nothing is listening at" in error_of(
        lambda: spark.read.format("mc0").options(**down, subscribe="o",
                                                 connectTimeoutMs="1000").load().collect())
    assert time.monotonic() - started < 15, "a broker that is down is an error within seconds, not a minute"
    # Case does not matter, as for Spark's own options.
    rows = spark.read.format("mc0").options(**options(broker)).option("SUBSCRIBE", "o").option(
        "STARTINGoffsets", "earliest").load().collect()
    assert len(rows) == 3


@pytest.mark.timeout(120)
def test_a_broker_that_accepts_and_never_answers_fails_a_read_after_the_default_connect_timeout(
    spark: Any,
) -> None:
    """A loopback listener that accepts every connection and never says a word (a hung broker whose kernel
    still accepts): nothing tells the client what is wrong, so only connectTimeoutMs, at its default of
    10 s, ends the wait. The read fails then, not a minute later, saying what happened and what to do."""
    from pyspark.errors import AnalysisException

    held: list[socket.socket] = []
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        listener.settimeout(0.2)
        done = threading.Event()

        def accept() -> None:
            while not done.is_set():
                try:
                    held.append(listener.accept()[0])
                except TimeoutError:
                    continue

        acceptor = threading.Thread(target=accept, daemon=True)
        acceptor.start()
        endpoint = f"tcp://127.0.0.1:{listener.getsockname()[1]}"
        started = time.monotonic()
        try:
            read = spark.read.format("mc0").options(broker=endpoint, curve="false", subscribe="o").load()
            with pytest.raises(AnalysisException) as info:
                read.collect()
            waited = time.monotonic() - started
        finally:
            done.set()
            acceptor.join(5)
            for connection in held:
                connection.close()
    assert held, "the client reached the listener"
    assert source_options.DEFAULT_CONNECT_TIMEOUT_MS == 10_000
    assert 9.5 <= waited < 15, f"the default connectTimeoutMs (10 s) ended the wait, after {waited:.1f} s"
    message = str(info.value)
    assert f"the broker at {endpoint} accepted the connection but has not completed the handshake" in message
    assert (f"(waited connectTimeoutMs=10000): check that an mc0 broker runs and answers at {endpoint}, or "
            "give it longer with connectTimeoutMs") in message


def test_kafka_style_offsets_json_and_id_zero_mean_what_a_kafka_user_means(spark: Any,
                                                                           broker: Broker) -> None:
    publish(broker, "k", 10)  # ids 1..10
    def ids(**extra: str) -> list[int]:
        return sorted(r.id for r in spark.read.format("mc0").options(**options(broker), subscribe="k",
                                                                       **extra).load().collect())

    assert ids(startingOffsets='{"k": {"0": 4}}', endingOffsets='{"k": {"0": -1}}') == list(range(4, 11))
    assert ids(startingOffsets=json.dumps({"k": 0})) == list(range(1, 11)), \
        "id 0 is before the first message (ids start at 1), not one removed by retention"


def test_reads_keep_every_core_busy_and_follow_max_records_per_partition(spark: Any, broker: Broker) -> None:
    publish(broker, "parts", 120_000)
    publish(broker, "few", 1000)
    from pyspark.sql import functions as f

    def read(topic: str, **extra: str) -> Any:
        return spark.read.format("mc0").options(**options(broker), subscribe=topic, **extra).load()

    assert spark.sparkContext.defaultParallelism == 2
    assert read("parts").rdd.getNumPartitions() == 2, "by default one task per core (local[2])"
    assert read("few").rdd.getNumPartitions() == 1, f"none under {source_options.MIN_DEFAULT_SPLIT} messages"
    frame = read("few", maxRecordsPerPartition="300")
    assert frame.rdd.getNumPartitions() == 4
    assert frame.select(f.spark_partition_id()).distinct().count() == 4
    assert frame.count() == 1000
    assert read("few", minPartitions="3").rdd.getNumPartitions() == 3


# ---------------------------------------------------------------------------------------------- timestamps


def test_starting_and_ending_timestamps_find_the_first_message_at_or_after_them(spark: Any,
                                                                                 broker: Broker) -> None:
    publish(broker, "ts", 5)
    time.sleep(0.05)
    middle = time.time_ns() // 1_000_000
    time.sleep(0.05)
    publish(broker, "ts", 5, start=5)  # ids 6..10, stored after `middle`
    def ids(**extra: str) -> list[int]:  # a reader of its own each time: option() changes the reader
        return sorted(r.id for r in spark.read.format("mc0").options(**options(broker), subscribe="ts",
                                                                       **extra).load().collect())

    assert ids(startingTimestamp=str(middle)) == [6, 7, 8, 9, 10]
    assert ids(startingOffsetsByTimestamp=json.dumps({"ts": {"0": middle}})) == [6, 7, 8, 9, 10]
    assert ids(endingTimestamp=str(middle)) == [1, 2, 3, 4, 5]
    assert ids(endingOffsetsByTimestamp=json.dumps({"ts": {"0": middle}})) == [1, 2, 3, 4, 5]
    assert ids(endingOffsetsByTimestamp=json.dumps({"ts": middle}), startingTimestamp=str(middle)) == []
    assert ids(endingTimestamp=str(middle), endingOffsetsByTimestamp=json.dumps({"ts": 0})) == [
        1, 2, 3, 4, 5], "endingTimestamp takes precedence, as in Kafka"
    future = str(time.time_ns() // 1_000_000 + 3_600_000)
    assert "no message stored at or after" in error_of(lambda: ids(startingTimestamp=future))
    assert ids(startingTimestamp=future, startingOffsetsByTimestampStrategy="latest") == []
    assert ids(endingTimestamp=future) == list(range(1, 11)), "no message at or after it: up to the end"


def test_a_stream_starts_at_a_timestamp_and_goes_on_from_its_checkpoint(spark: Any, broker: Broker,
                                                                          tmp_path: Path) -> None:
    """startingTimestamp (and startingOffsetsByTimestamp) place a new query, as in Kafka; a query restarted
    from its checkpoint goes on from there, whatever the option says."""
    publish(broker, "sts", 5)
    time.sleep(0.05)
    middle = time.time_ns() // 1_000_000
    time.sleep(0.05)
    publish(broker, "sts", 5, start=5)  # ids 6..10, stored after `middle`
    out = tmp_path / "out"

    def run(checkpoint: str, **extra: str) -> list[int]:
        stream = spark.readStream.format("mc0").options(**options(broker), subscribe="sts", **extra).load()
        query = (stream.writeStream.format("parquet").option("path", str(out / checkpoint))
                 .option("checkpointLocation", str(tmp_path / checkpoint)).trigger(availableNow=True).start())
        assert query.awaitTermination(120)
        return sorted(r.id for r in spark.read.parquet(str(out / checkpoint)).collect())

    assert run("by_time", startingTimestamp=str(middle)) == [6, 7, 8, 9, 10]
    assert run("by_topic_time", startingOffsetsByTimestamp=json.dumps({"sts": {"0": middle}})) == [
        6, 7, 8, 9, 10]
    publish(broker, "sts", 3, start=10)  # ids 11..13
    assert run("by_time", startingTimestamp="0") == list(range(6, 14)), \
        "restarted from its checkpoint: the timestamp places only a new query"


# ------------------------------------------------------------------------------------------------- the sink


def test_the_topic_option_overrides_the_topic_column_so_a_copy_does_not_feed_itself(
    spark: Any, broker: Broker, tmp_path: Path
) -> None:
    """readStream(subscribe=a) gives rows with topic "a"; written with topic=b they must go to b (Kafka's
    rule), not back into a, where the stream would read them again, and again."""
    publish(broker, "loop.a", 100)
    stream = (spark.readStream.format("mc0").options(**options(broker), subscribe="loop.a",
                                                       startingOffsets="earliest").load())
    query = (stream.writeStream.format("mc0").options(**options(broker), topic="loop.b")
             .option("checkpointLocation", str(tmp_path / "c")).trigger(availableNow=True).start())
    assert query.awaitTermination(120)
    assert len(stored(broker, "loop.a")) == 100, "nothing written back into the source"
    copied = sorted(m.body for m in stored(broker, "loop.b"))
    assert copied == sorted(f"loop.a:{n}".encode() for n in range(100))


def test_values_must_be_binary_or_string_and_keys_round_trip(spark: Any, broker: Broker) -> None:
    from pyspark.errors import AnalysisException

    write = spark.range(3).selectExpr("id as value").write.format("mc0").options(**options(broker),
                                                                               topic="typed").mode("append")
    with pytest.raises(AnalysisException) as info:  # Spark wraps what the writer raises on the driver
        write.save()
    message = str(info.value)
    assert "column value must be binary or string" in message
    assert "bigint" in message
    rows = spark.createDataFrame([("k1", "v1"), (None, "v2")], "key string, value string")
    rows.write.format("mc0").options(**options(broker), topic="keyed").mode("append").save()
    read = spark.read.format("mc0").options(**options(broker), subscribe="keyed",
                                            includeHeaders="true").load()
    got = sorted(((r.key, bytes(r.value), r.headers) for r in read.collect()), key=lambda row: row[1])
    assert got == [(b"k1", b"v1", []), (None, b"v2", [])], "the key comes back as the key, not as a header"
    assert "append-only" in error_of(
        rows.write.format("mc0").options(**options(broker), topic="keyed").mode("overwrite").save)
    assert "no partitions" in error_of(
        rows.selectExpr("value", "0 as partition").write.format("mc0").options(**options(broker),
                                                                               topic="x").mode("append").save)


@pytest.mark.parametrize(("columns", "says"), [
    ("cast(id as string) as value, cast(id as int) as key",
     "column key must be binary or string to be written to mc0, not int"),
    ("cast(id as string) as value, id as topic", "column topic must be a string, not bigint"),
    ("cast(id as string) as value, array(id) as headers",
     "column headers must be array<struct<key: string, value: binary>> (as Kafka's), not array<bigint>"),
    ("cast(id as string) as value, 0 as partition", "column partition: mc0 topics have no partitions"),
    ("array(id) as value", "column value must be binary or string to be written to mc0, not array<bigint>"),
])
def test_a_column_of_a_type_mc0_cannot_write_is_an_analysis_exception_naming_it(
    spark: Any, broker: Broker, columns: str, says: str
) -> None:
    """Kafka's sink fails such a write with an AnalysisException naming the column and its type; so does
    mc0's (Spark wraps what a Python data source's writer() raises on the driver in one), before any row."""
    from pyspark.errors import AnalysisException

    frame = spark.range(3).selectExpr(*columns.split(", "))
    with pytest.raises(AnalysisException, match=re.escape(says)):
        frame.write.format("mc0").options(**options(broker), topic="typed").mode("append").save()
    with Client(broker.endpoint, curve=False) as client:
        assert "typed" not in client.topics(), "nothing was written"


def test_a_streaming_write_of_a_column_of_the_wrong_type_fails_its_query_naming_it(
    spark: Any, broker: Broker, tmp_path: Path
) -> None:
    """Spark asks a Python streaming sink for its writer only once the query runs, so the same message ends
    the query (a StreamingQueryException) instead of failing start() as Kafka's does."""
    from pyspark.errors import StreamingQueryException

    publish(broker, "typed.src", 3)
    stream = spark.readStream.format("mc0").options(**options(broker), subscribe="typed.src",
                                                      startingOffsets="earliest").load()
    query = (stream.selectExpr("id as value").writeStream.format("mc0").options(**options(broker),
                                                                                topic="typed.dst")
             .option("checkpointLocation", str(tmp_path / "c")).trigger(availableNow=True).start())
    with pytest.raises(StreamingQueryException, match="column value must be binary or string to be written "
                                                      "to mc0, not bigint"):
        query.awaitTermination(120)


HEADERS = "array<struct<key: string, value: binary>>"


def keyed_rows(frame: Any) -> list[tuple[Any, bytes, list[tuple[str, bytes]]]]:
    """(key, value, headers) of every row, in value order."""
    return sorted(((r.key if r.key is None else bytes(r.key), bytes(r.value),
                    [(h.key, bytes(h.value)) for h in r.headers]) for r in frame.collect()),
                  key=lambda row: row[1])


def test_headers_in_kafkas_shape_are_written_and_a_read_with_headers_writes_back_whole(
    spark: Any, broker: Broker, tmp_path: Path
) -> None:
    """A headers column in Kafka's shape is written (includeHeaders accepted on the write, as Kafka's sink
    accepts it); a DataFrame read with includeHeaders=true and written to another topic, batch and streaming,
    keeps every row's key, value and headers."""
    rows = spark.createDataFrame(
        [("k1", b"v1", [("a", b"1"), ("b", b"\x00\xff")]), (None, b"v2", [("only", b"")]), ("k3", b"v3", []),
         ("k4", b"v4", None)],
        f"key string, value binary, headers {HEADERS}")
    rows.write.format("mc0").options(**options(broker), topic="hdr.a", includeHeaders="true").mode(
        "append").save()
    expected = [(b"k1", b"v1", [("a", b"1"), ("b", b"\x00\xff")]), (None, b"v2", [("only", b"")]),
                (b"k3", b"v3", []), (b"k4", b"v4", [])]

    def read(topic: str) -> Any:
        return spark.read.format("mc0").options(**options(broker), subscribe=topic,
                                                includeHeaders="true").load()

    assert keyed_rows(read("hdr.a")) == expected
    read("hdr.a").write.format("mc0").options(**options(broker), topic="hdr.b", includeHeaders="true").mode(
        "append").save()  # with its topic, id and timestamp columns: the option names the topic
    assert keyed_rows(read("hdr.b")) == expected, "the batch round trip keeps key, value and headers"
    stream = (spark.readStream.format("mc0").options(**options(broker), subscribe="hdr.a")
              .options(includeHeaders="true", startingOffsets="earliest").load())
    query = (stream.writeStream.format("mc0").options(**options(broker), topic="hdr.c", includeHeaders="true")
             .option("checkpointLocation", str(tmp_path / "c")).trigger(availableNow=True).start())
    assert query.awaitTermination(120)
    assert keyed_rows(read("hdr.c")) == expected, "the streaming round trip keeps key, value and headers"


# --------------------------------------------------------------------------------------------- streaming


def count_in(spark: Any, table: str) -> int:
    return spark.sql(f"select count(*) from {table}").collect()[0][0]


def wait_for(condition: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def test_subscribe_pattern_picks_up_a_topic_created_while_the_query_runs(spark: Any, broker: Broker) -> None:
    publish(broker, "pat.one", 5)
    publish(broker, "other", 5)
    query = (spark.readStream.format("mc0").options(**options(broker), subscribePattern=r"pat\..*",
                                                      startingOffsets="earliest",
                                                      topicDiscoveryIntervalMs="200")
             .load().writeStream.format("memory").queryName("pattern_rows").start())
    try:
        assert wait_for(lambda: count_in(spark, "pattern_rows") >= 5, 60)
        publish(broker, "pat.two", 7)  # a topic the query has never seen
        assert wait_for(lambda: count_in(spark, "pattern_rows") >= 12, 60)
        rows = spark.sql("select topic, count(*) as n from pattern_rows group by topic").collect()
        assert {r.topic: r.n for r in rows} == {"pat.one": 5, "pat.two": 7}, "from the new topic's beginning"
    finally:
        query.stop()


def test_an_idle_stream_costs_a_few_commands_a_second_and_reports_its_lag(spark: Any, broker: Broker) -> None:
    publish(broker, "idle", 20)
    query = (spark.readStream.format("mc0").options(**options(broker), subscribe="idle",
                                                      startingOffsets="earliest", maxOffsetsPerTrigger="5")
             .load().writeStream.format("memory").queryName("idle_rows").start())
    with Client(broker.endpoint, curve=False) as client:
        try:
            assert wait_for(lambda: count_in(spark, "idle_rows") == 20, 60)
            progress = [p for p in query.recentProgress if p["numInputRows"]]
            lags = [offsets_behind(p)["maxOffsetsBehindLatest"] for p in progress]
            assert lags[0] == 15, "after the first 5 of 20 (maxOffsetsPerTrigger), 15 behind the latest"
            assert lags[-1] == 0
            time.sleep(1)
            before = client.stats()["doors"]["mc0"]["commands"]
            time.sleep(3)
            after = client.stats()["doors"]["mc0"]["commands"]
            assert after - before - 1 <= 12, f"{(after - before - 1) / 3:.1f} commands/s while idle"
            sent = time.monotonic()
            client.publish("idle", "wake up", confirm=True)
            assert wait_for(lambda: count_in(spark, "idle_rows") == 21, 30)
            assert time.monotonic() - sent < 5, "the long poll ends with the message"
        finally:
            query.stop()


def test_an_idle_stream_waits_in_the_broker_and_a_message_ends_the_wait_at_once(spark: Any,
                                                                              broker: Broker) -> None:
    """What tells a long poll from polling: while the query is idle its question is parked in the broker the
    whole time (STATS' waiting_fetches), it sends almost nothing (one question per fetchMaxWaitMs, here 10 s),
    and yet a message published into it reaches the query's output within a small part of those 10 s, each
    time. A loop of plain FETCHes parks nothing; one that waits in the broker but is not woken by a message
    takes until its wait runs out; one that asks often enough to be as quick sends many commands."""
    wait_ms = 10_000
    publish(broker, "lp", 1)
    query = (spark.readStream.format("mc0").options(**options(broker), subscribe="lp")
             .options(startingOffsets="earliest", fetchMaxWaitMs=str(wait_ms)).load()
             .writeStream.format("memory").queryName("lp_rows").start())
    with Client(broker.endpoint, curve=False) as client:
        def door() -> dict[str, int]:
            return client.stats()["doors"]["mc0"]

        try:
            assert wait_for(lambda: count_in(spark, "lp_rows") == 1, 60)
            assert wait_for(lambda: door()["waiting_fetches"] == 1, 10), "the idle query's poll is parked"
            samples, before = 12, door()["commands"]
            parked = []
            for _ in range(samples):
                time.sleep(0.25)
                parked.append(door()["waiting_fetches"])
            sent_by_query = door()["commands"] - before - samples - 1  # less this client's own STATS
            assert parked == [1] * samples, f"a poll parked in the broker all the time: {parked}"
            assert sent_by_query <= 1, f"{sent_by_query} commands in {samples / 4:g} s from the idle query"
            for n in (2, 3):
                time.sleep(1)
                sent = time.monotonic()
                client.publish("lp", f"wake up {n}", confirm=True)
                assert wait_for(lambda n=n: count_in(spark, "lp_rows") == n, 30)
                took = time.monotonic() - sent
                assert took < 0.3 * wait_ms / 1000, f"the message ended the {wait_ms} ms wait: {took:.2f} s"
        finally:
            client.publish("lp", "stop", confirm=True)  # ends the parked poll: stop() need not wait it out
            query.stop()


def test_min_offsets_per_trigger_waits_for_enough_or_for_max_trigger_delay(spark: Any,
                                                                            broker: Broker) -> None:
    publish(broker, "few", 3)
    query = (spark.readStream.format("mc0").options(**options(broker), subscribe="few",
                                                      startingOffsets="earliest", minOffsetsPerTrigger="50",
                                                      maxTriggerDelay="3s")
             .load().writeStream.format("memory").queryName("few_rows").start())
    try:
        started = time.monotonic()
        assert wait_for(lambda: count_in(spark, "few_rows") == 3, 60)
        assert time.monotonic() - started >= 2.5, "3 < 50 waited for maxTriggerDelay"
        publisher = threading.Thread(target=publish, args=(broker, "few", 60, 3))
        sent = time.monotonic()
        publisher.start()
        publisher.join()
        assert wait_for(lambda: count_in(spark, "few_rows") == 63, 60)
        assert time.monotonic() - sent < 2.5, "50 or more: no wait"
    finally:
        query.stop()
