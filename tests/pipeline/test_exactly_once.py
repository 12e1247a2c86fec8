"""Exactly once, both ways: the sink under a write task whose Python worker is killed mid-write (Spark runs
the task again, the broker skips what the first attempt stored), a streaming micro-batch replayed after its
commit was lost, and a source whose topic's log was recreated under its checkpoint (failOnDataLoss both ways,
the warning seen in the log).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.server import Broker
from broker.store.files import directory_name
from broker.topics import Persistence, TopicRule, TopicSpec
from connector import Client

pytestmark = pytest.mark.timeout(300)

RULES = (TopicRule("*", TopicSpec(persistence=Persistence.PERSISTENT)),)
ROOT = Path(__file__).resolve().parents[2]
ROWS_PER_TASK = 30_000
KILL_AT = 24_000  # rows the first attempt of task 0 hands on before its worker dies (many batches stored:
#: its output is buffered, 64 KiB at a time)


def free_endpoint() -> str:
    """A loopback endpoint nobody listens on now: the broker restarts on it (the query names it)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{probe.getsockname()[1]}"


def options(broker: Broker) -> dict[str, str]:
    return {"broker": broker.endpoint, "curve": "false"}


def all_bodies(broker: Broker, topic: str) -> list[bytes]:
    out: list[bytes] = []
    with Client(broker.endpoint, curve=False) as client:
        position = 1
        while messages := client.fetch(topic, position, max_messages=10_000).messages:
            out += [m.body for m in messages]
            position = messages[-1].id + 1
    return out


def topic_stats(broker: Broker, topic: str) -> dict[str, Any]:
    with Client(broker.endpoint, curve=False) as client:
        return client.topics()[topic]


def test_a_write_task_killed_mid_write_and_run_again_stores_every_row_once(
    spark: Any, start_broker: Callable[..., Broker]
) -> None:
    broker = start_broker(topics=RULES)

    def rows_that_kill_their_first_attempt(tasks: Iterator[int]) -> Iterator[tuple[bytes]]:
        """ROWS_PER_TASK rows per task; the first attempt of partition 0 SIGKILLs its own Python worker
        after KILL_AT rows. (Defined here: Spark ships it to its workers by value.)"""
        import os
        import signal

        from pyspark import TaskContext

        context = TaskContext.get()
        for task in tasks:
            for n in range(ROWS_PER_TASK):
                if n == KILL_AT and context.partitionId() == 0 and context.attemptNumber() == 0:
                    time.sleep(1.0)  # what was handed on reaches the sink and the broker
                    os.kill(os.getpid(), signal.SIGKILL)
                yield (f"t{task}-{n}".encode(),)

    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "500")  # rows reach the sink as they come
    try:
        rows = spark.sparkContext.parallelize([0, 1], 2).mapPartitions(rows_that_kill_their_first_attempt)
        frame = spark.createDataFrame(rows, "value binary")
        frame.write.format("mc0").options(**options(broker), topic="eo.sink").mode("append").save()
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    bodies = all_bodies(broker, "eo.sink")
    expected = [f"t{task}-{n}".encode() for task in (0, 1) for n in range(ROWS_PER_TASK)]
    assert sorted(bodies) == sorted(expected), "every row, once"
    stats = topic_stats(broker, "eo.sink")
    assert stats["duplicates"] >= 4000, "the first attempt stored rows; the second did not store them again"
    assert stats["messages_in"] == 2 * ROWS_PER_TASK


def test_a_micro_batch_replayed_after_its_commit_was_lost_writes_nothing_twice(
    spark: Any, start_broker: Callable[..., Broker], tmp_path: Path
) -> None:
    broker = start_broker(topics=RULES)
    with Client(broker.endpoint, curve=False) as client:
        client.publish_batch([("eo.src", f"m{n}", None) for n in range(300)])

    def copy() -> None:
        stream = spark.readStream.format("mc0").options(**options(broker), subscribe="eo.src",
                                                          startingOffsets="earliest").load()
        query = (stream.select("value").writeStream.format("mc0").options(**options(broker), topic="eo.dst")
                 .option("checkpointLocation", str(tmp_path / "c")).trigger(availableNow=True).start())
        assert query.awaitTermination(120)

    copy()
    commits = sorted((tmp_path / "c" / "commits").iterdir())
    assert commits
    for commit in commits:  # as if the query died after writing, before recording the micro-batches done
        commit.unlink()
    copy()  # Spark runs the same micro-batches again: same offsets, same ids, same producers
    assert sorted(all_bodies(broker, "eo.dst")) == sorted(f"m{n}".encode() for n in range(300))
    assert topic_stats(broker, "eo.dst")["duplicates"] == 300


#: The failOnDataLoss=false run of the recreated-log test, in a Spark of its own (see that test): argv is the
#: broker's endpoint, the output folder and the checkpoint.
READ_ON_JOB = """
import os, sys
os.environ["PYSPARK_PYTHON"] = sys.executable
from pyspark.sql import SparkSession
from pipeline.source import register

endpoint, out, checkpoint = sys.argv[1:4]
spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
         .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
         .getOrCreate())
register(spark)
stream = spark.readStream.format("mc0").options(broker=endpoint, curve="false", subscribe="re.t",
                                                startingOffsets="earliest", failOnDataLoss="false").load()
query = (stream.writeStream.format("parquet").option("path", out).option("checkpointLocation", checkpoint)
         .trigger(availableNow=True).start())
assert query.awaitTermination(120)
spark.stop()
"""


def test_a_recreated_log_under_a_checkpoint_fails_the_query_or_is_read_from_its_beginning(
    spark: Any, start_broker: Callable[..., Broker], tmp_path: Path
) -> None:
    """failOnDataLoss=true fails the query; false reads the new log from its beginning and says so in the log.

    Where that warning goes: a Python stream's driver side (latestOffset, partitions, where the source finds
    the other log) runs in a Python worker the JVM starts, not in the process that started the query, so the
    'mc0.pipeline' logger of this process never sees it; the worker logs to its stderr, which the JVM copies
    to its own. This session's JVM writes to what pytest captures (or the terminal), which a test cannot read
    reliably, so the failOnDataLoss=false run goes on from the same checkpoint in a Spark of its own
    (READ_ON_JOB), whose stderr the test reads."""
    bind, data = free_endpoint(), tmp_path / "data"
    broker = start_broker(topics=RULES, bind=bind, data_dir=data)
    with Client(broker.endpoint, curve=False) as client:
        client.publish_batch([("re.t", f"old {n}", None) for n in range(300)])
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def run(**extra: str) -> Any:
        stream = spark.readStream.format("mc0").options(**options(broker), subscribe="re.t",
                                                          startingOffsets="earliest", **extra).load()
        return (stream.writeStream.format("parquet").option("path", str(out))
                .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())

    assert run().awaitTermination(120)
    assert spark.read.parquet(str(out)).count() == 300
    broker.stop()
    time.sleep(0.5)
    shutil.rmtree(data / directory_name(b"re.t"))  # the log is lost
    broker = start_broker(topics=RULES, bind=bind, data_dir=data)
    with Client(broker.endpoint, curve=False) as client:
        client.publish_batch([("re.t", f"new {n}", None) for n in range(500)])  # ids 1..500, below 301
    failing = run()
    with pytest.raises(Exception, match="another log than the one this query read"):
        failing.awaitTermination(120)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "SPARK_LOCAL_IP": "127.0.0.1"}
    job = subprocess.run([sys.executable, "-c", READ_ON_JOB, broker.endpoint, str(out), str(checkpoint)],
                         env=env, capture_output=True, text=True, timeout=200, check=False)
    assert job.returncode == 0, job.stderr[-3000:]
    warnings = [line for line in job.stderr.splitlines() if " WARNING mc0.pipeline: " in line]
    assert warnings, f"the warning is in the log: {job.stderr[-3000:]}"
    assert all("topic 're.t' is another log than the one this query read" in line
               and "messages from 1 on are not the ones it read up to 300: reading on from what is there "
                   "(failOnDataLoss=false)" in line for line in warnings), warnings
    values = sorted(bytes(r.value) for r in spark.read.parquet(str(out)).collect())
    old, new = [f"old {n}".encode() for n in range(300)], [f"new {n}".encode() for n in range(500)]
    assert values == sorted(old + new)


def test_an_idle_stream_goes_on_after_the_broker_restarts(
    spark: Any, start_broker: Callable[..., Broker], tmp_path: Path
) -> None:
    """The driver's long polls die with the broker; the stream gives them up once overdue, asks the new broker
    process, and reads what is published after the restart, once."""
    bind, data = free_endpoint(), tmp_path / "data"
    broker = start_broker(topics=RULES, bind=bind, data_dir=data)
    with Client(broker.endpoint, curve=False) as client:
        client.publish_batch([("rs.t", f"before {n}", None) for n in range(5)])
    query = (spark.readStream.format("mc0").options(**options(broker), subscribe="rs.t",
                                                      startingOffsets="earliest", requestTimeoutMs="2000")
             .load().writeStream.format("memory").queryName("restarted_rows").start())

    def rows() -> list[bytes]:
        return sorted(bytes(r.value) for r in spark.sql("select value from restarted_rows").collect())

    def wait_for(count: int, seconds: float = 60) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and len(rows()) < count:
            time.sleep(0.2)
        return len(rows()) >= count

    try:
        assert wait_for(5)
        time.sleep(1)  # idle: its long polls wait in the broker
        broker.stop()
        time.sleep(0.5)
        broker = start_broker(topics=RULES, bind=bind, data_dir=data)
        with Client(broker.endpoint, curve=False) as client:
            client.publish_batch([("rs.t", f"after {n}", None) for n in range(3)])
        # Well before the connector's own reconnect (1.05 x its 30 s heartbeat TTL) would rescue the polls.
        assert wait_for(8, seconds=20), "the lost long polls were given up once overdue (requestTimeoutMs)"
        assert rows() == sorted([f"before {n}".encode() for n in range(5)] +
                                [f"after {n}".encode() for n in range(3)])
    finally:
        query.stop()
