"""The ``mc0`` Spark data source against a real broker: batch reads (offsets, partitions, headers), streaming
reads stopped mid-stream and restarted from the checkpoint with every message exactly once,
``trigger(availableNow=True)``, batch and streaming writes confirmed by the broker, failOnDataLoss both ways,
and the example job end to end from Lumberjack to a topic and Parquet.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from broker.server import Broker
from broker.topics import Persistence, TopicRule, TopicSpec
from connector import Client
from connector.lumberjack_client import LumberjackClient
from pipeline import log_counts
from pipeline.source import DataLossError

pytestmark = pytest.mark.timeout(300)

RULES = (
    TopicRule("small.*", TopicSpec(persistence=Persistence.PERSISTENT, segment_bytes=1024,
                                   retention_bytes=2048)),
    TopicRule("*", TopicSpec(persistence=Persistence.PERSISTENT)),
)


@pytest.fixture
def broker(start_broker: Callable[..., Broker]) -> Broker:
    return start_broker(topics=RULES)


def options(broker: Broker) -> dict[str, str]:
    return {"broker": broker.endpoint, "curve": "false"}


def publish(broker: Broker, topic: str, count: int, start: int = 0, headers: dict | None = None) -> None:
    with Client(broker.endpoint, curve=False, timeout=30) as client:
        for n in range(start, start + count):
            client.publish(topic, f"{topic}:{n}", headers)
        client.publish(topic, f"{topic}:{start + count}", headers, confirm=True)


def read(spark: Any, broker: Broker, **extra: str) -> Any:
    return spark.read.format("mc0").options(**options(broker), **extra).load()


# ------------------------------------------------------------------------------------------------- batch


def test_batch_read_of_two_topics_with_ids_timestamps_and_values(spark: Any, broker: Broker) -> None:
    publish(broker, "a", 99)  # 100 messages: ids 1..100
    publish(broker, "b", 49)
    frame = read(spark, broker, subscribe="a,b")
    assert frame.columns == ["key", "value", "topic", "id", "timestamp"], "Kafka's order, id for offset"
    rows = frame.collect()
    assert len(rows) == 150
    for topic, count in (("a", 100), ("b", 50)):
        mine = sorted((r.id, bytes(r.value)) for r in rows if r.topic == topic)
        assert mine == [(n + 1, f"{topic}:{n}".encode()) for n in range(count)]
    assert all(r.timestamp is not None and r.timestamp.year >= 2024 for r in rows)
    assert all(r.key is None for r in rows)


def test_offsets_partitions_and_headers(spark: Any, broker: Broker) -> None:
    publish(broker, "h", 29, headers={"X-Source": "test"})
    frame = read(spark, broker, subscribe="h", minPartitions="4", includeHeaders="true",
                 startingOffsets=json.dumps({"h": 5}), endingOffsets=json.dumps({"h": 21}))
    from pyspark.sql import functions as f

    tasks = frame.select(f.spark_partition_id().alias("task")).distinct().count()
    assert tasks >= 4, "the 16 messages were read by at least 4 tasks"
    rows = sorted(frame.collect(), key=lambda r: r.id)
    assert [r.id for r in rows] == list(range(5, 21)), "from 5 up to, not including, 21"
    assert all([(h.key, bytes(h.value)) for h in r.headers] == [("X-Source", b"test")] for r in rows), \
        "Kafka's shape: array<struct<key: string, value: binary>>"


def test_fail_on_data_loss_both_ways(spark: Any, broker: Broker) -> None:
    publish(broker, "small.t", 299)  # retention keeps about 2 KiB: the oldest segments go
    deadline = time.monotonic() + 10
    with Client(broker.endpoint, curve=False) as client:
        while client.offsets("small.t")[0] == 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        first, next_id = client.offsets("small.t")
    assert first > 1, "retention was meant to remove the oldest messages"
    from_one = {"subscribe": "small.t", "startingOffsets": json.dumps({"small.t": 1})}
    with pytest.raises(Exception, match="removed by retention"):
        read(spark, broker, **from_one).collect()
    rows = read(spark, broker, failOnDataLoss="false", **from_one).collect()
    assert sorted(r.id for r in rows) == list(range(first, next_id)), "what is left, from the oldest stored"
    assert issubclass(DataLossError, Exception)


# --------------------------------------------------------------------------------------------- streaming


def stream_to_parquet(spark: Any, broker: Broker, topic: str, out: Path, checkpoint: Path,
                      **extra: str) -> Any:
    stream = (spark.readStream.format("mc0").options(**options(broker))
              .option("subscribe", topic).option("startingOffsets", "earliest").options(**extra).load())
    return (stream.writeStream.format("parquet").option("path", str(out))
            .option("checkpointLocation", str(checkpoint)))


def test_a_stream_stopped_mid_way_and_restarted_has_every_message_exactly_once(
    spark: Any, broker: Broker, tmp_path: Path
) -> None:
    publish(broker, "s", 299)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    query = stream_to_parquet(spark, broker, "s", out, checkpoint, maxOffsetsPerTrigger="40").trigger(
        processingTime="100 milliseconds").start()
    def reached() -> int:
        progress = query.lastProgress
        end = progress["sources"][0]["endOffset"] if progress else None
        return json.loads(end)["s"]["next"] if end else 0

    deadline = time.monotonic() + 60
    while reached() < 100 and time.monotonic() < deadline:
        time.sleep(0.1)
    query.stop()  # mid-stream: 300 messages, 40 per trigger
    stopped_at = len(spark.read.parquet(str(out)).collect())
    assert 0 < stopped_at < 300, "stopped mid-stream"
    publish(broker, "s", 49, start=300)
    again = stream_to_parquet(spark, broker, "s", out, checkpoint).trigger(availableNow=True).start()
    again.awaitTermination(120)
    ids = [r.id for r in spark.read.parquet(str(out)).collect()]
    assert sorted(ids) == list(range(1, 351)), "every message once, none twice, none lost"


def test_available_now_reads_what_is_there_and_stops(spark: Any, broker: Broker, tmp_path: Path) -> None:
    publish(broker, "now", 9)
    query = stream_to_parquet(spark, broker, "now", tmp_path / "o", tmp_path / "c").trigger(
        availableNow=True).start()
    assert query.awaitTermination(120)
    assert sorted(r.id for r in spark.read.parquet(str(tmp_path / "o")).collect()) == list(range(1, 11))


# ------------------------------------------------------------------------------------------------ writing


def test_batch_write_is_confirmed_and_readable(spark: Any, broker: Broker) -> None:
    rows = [("w1", f"v{n}".encode(), {"X-N": str(n)}) for n in range(100)] + [("w2", b"other", {})]
    frame = spark.createDataFrame(rows, "topic string, value binary, headers map<string,string>")
    frame.write.format("mc0").options(**options(broker)).mode("append").save()
    with Client(broker.endpoint, curve=False) as client:
        result = client.fetch("w1", 1, max_messages=1000)
    stored = [(m.body, m.headers.get("X-N")) for m in result.messages]
    # Each task keeps its rows in order; two tasks publish side by side, so the topic interleaves them.
    assert sorted(stored, key=lambda row: int(row[1])) == [(f"v{n}".encode(), str(n)) for n in range(100)]


def test_a_topic_option_and_a_streaming_write(spark: Any, broker: Broker, tmp_path: Path) -> None:
    publish(broker, "copy.src", 19)
    stream = (spark.readStream.format("mc0").options(**options(broker))
              .option("subscribe", "copy.src").option("startingOffsets", "earliest").load()
              .select("value"))
    query = (stream.writeStream.format("mc0").options(**options(broker)).option("topic", "copy.dst")
             .option("checkpointLocation", str(tmp_path / "c")).trigger(availableNow=True).start())
    assert query.awaitTermination(120)
    with Client(broker.endpoint, curve=False) as client:
        copied = client.fetch("copy.dst", 1, max_messages=100).messages
    assert [m.body for m in copied] == [f"copy.src:{n}".encode() for n in range(20)]


# ------------------------------------------------------------------------------------------- example job


def test_the_example_job_end_to_end(spark: Any, broker: Broker, tmp_path: Path) -> None:
    events = ([{"message": "ok", "host": "web1", "level": "info"}] * 5
              + [{"message": "bad", "host": "web1", "level": "error"}] * 2
              + [{"message": "ok", "host": "web2", "level": "info"}] * 3)
    with LumberjackClient(*broker.gateway_address("lumberjack")) as shipper:
        shipper.send_batch(events)
    output = tmp_path / "counts"
    log_counts.run(spark, broker_options=options(broker), source="logs", sink="log-counts", output=output,
                   checkpoint=tmp_path / "checkpoint", once=True)
    counts = {(r.host, r.level): r["count"] for r in spark.read.parquet(str(output)).collect()}
    assert counts == {("web1", "info"): 5, ("web1", "error"): 2, ("web2", "info"): 3}
    with Client(broker.endpoint, curve=False) as client:
        published = [json.loads(m.body) for m in client.fetch("log-counts", 1, max_messages=100).messages]
    assert {(p["host"], p["level"]): p["count"] for p in published} == counts


def test_the_demo_the_readme_runs(spark: Any, tmp_path: Path) -> None:
    rows = log_counts.demo(spark, tmp_path)
    assert sum(row["count"] for row in rows) == 300
    assert {row.host for row in rows} == set(log_counts.SAMPLE_HOSTS)
    assert {(row.host, row.level) for row in rows if row.level == "error"}, "a fifth of the events are errors"


def test_reading_under_curve_with_a_keys_folder_or_z85_keys(
    spark: Any, start_broker: Callable[..., Broker], tmp_path: Path
) -> None:
    from connector import Credentials

    broker = start_broker(topics=RULES, curve=True)
    keys = tmp_path / "keys"
    with Client(broker.endpoint, keys=keys, timeout=10) as client:
        client.publish("secure", "sealed", confirm=True)
    by_folder = spark.read.format("mc0").options(broker=broker.endpoint, keys=str(keys),
                                                 subscribe="secure").load()
    assert [bytes(r.value) for r in by_folder.collect()] == [b"sealed"]
    credentials = Credentials.from_dir(keys)
    by_text = spark.read.format("mc0").options(
        broker=broker.endpoint, subscribe="secure", serverKey=credentials.server_public.decode(),
        publicKey=credentials.public.decode(), secretKey=credentials.secret.decode()).load()
    assert [bytes(r.value) for r in by_text.collect()] == [b"sealed"]


@pytest.mark.timeout(240)
def test_the_demo_command_sets_the_python_its_workers_run(tmp_path: Path) -> None:
    """``python3 -m pipeline.log_counts --demo`` from a shell where ``python3`` on PATH is another Python
    (here one that cannot even start): Spark's workers must still run this interpreter, which has PySpark and
    the project, because the job sets PYSPARK_PYTHON."""
    import os
    import subprocess
    import sys

    shims = tmp_path / "bin"
    shims.mkdir()
    for name in ("python3", "python"):
        shim = shims / name
        shim.write_text("#!/bin/sh\necho 'not the Python the job runs with' >&2\nexit 3\n")
        shim.chmod(0o755)
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYSPARK_")}
    env["PATH"] = os.pathsep.join([str(shims), env.get("PATH", "")])
    root = Path(__file__).resolve().parents[2]
    env["PYTHONPATH"] = str(root)
    demo = subprocess.run([sys.executable, "-m", "pipeline.log_counts", "--demo"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=220, check=False)
    assert demo.returncode == 0, demo.stderr[-3000:]
    said, header, *table = [line for line in demo.stdout.splitlines() if line.strip()]
    assert said.startswith("shipped 300 events over Lumberjack to the topic logs;"), said
    assert header.split() == ["minute", "host", "level", "count"]
    assert sum(int(line.split()[-1]) for line in table) == 300


# ------------------------------------------------------------------------------------- chosen columns


def test_a_schema_given_to_a_read_chooses_its_columns_batch_and_streaming(
    spark: Any, broker: Broker, tmp_path: Path
) -> None:
    publish(broker, "cols", 9)  # ids 1..10
    frame = spark.read.format("mc0").options(**options(broker), subscribe="cols").schema(
        "id long, value binary").load()
    assert frame.columns == ["id", "value"]
    got = sorted((r.id, bytes(r.value)) for r in frame.collect())
    assert got == [(n + 1, b"cols:%d" % n) for n in range(10)]
    stream = (spark.readStream.format("mc0").options(**options(broker), subscribe="cols",
                                                     startingOffsets="earliest")
              .schema("value binary").load())
    assert stream.columns == ["value"]
    query = (stream.writeStream.format("memory").queryName("chosen_columns")
             .option("checkpointLocation", str(tmp_path / "checkpoint")).trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert sorted(bytes(r.value) for r in spark.table("chosen_columns").collect()) == sorted(
        b"cols:%d" % n for n in range(10))


@pytest.mark.parametrize(("schema", "message"), [
    ("value string", "column 'value' of an mc0 read is binary, not string"),
    ("value binary, offset long", "column 'offset' of the given schema is not one an mc0 read has"),
    ("headers array<struct<key string, value binary>>", "headers needs includeHeaders=true"),
])
def test_a_schema_with_a_column_the_source_does_not_have_is_refused(
    spark: Any, broker: Broker, schema: str, message: str
) -> None:
    publish(broker, "cols", 0)
    with pytest.raises(Exception, match=message):  # Spark wraps ours in its own exception
        spark.read.format("mc0").options(**options(broker), subscribe="cols").schema(schema).load().collect()
