"""Run by test_cluster.py in a process of its own: a Spark ``local-cluster`` (a master, two workers and their
executors, each executor a JVM of its own with its own Python workers) reading a topic through the ``mc0``
source and writing it back through the sink, then writing rows into RETRIED_TOPIC through a task whose first
attempt's Python worker is killed mid-write (Spark runs it again, on either executor). Prints one JSON line of
what it saw.

    python cluster_job.py ENDPOINT SOURCE_TOPIC SINK_TOPIC RETRIED_TOPIC MARKS_FOLDER
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: The retried write: rows per task, and after how many the first attempt of task 0 kills its Python worker
#: (many batches confirmed by then: rows reach the sink 500 at a time, the worker's output 64 KiB at a time).
ROWS_PER_TASK = 30_000
KILL_AT = 24_000


def rows_that_kill_their_first_attempt(marks: str) -> object:
    """ROWS_PER_TASK rows per task; the first attempt of partition 0 SIGKILLs its own Python worker after
    KILL_AT rows. Each attempt leaves a file in ``marks`` (the executors run on this machine) naming its
    partition, attempt and executor process, so the test sees which ran. Shipped to executors by value."""

    def rows(tasks: Iterator[int]) -> Iterator[tuple[bytes]]:
        import signal

        from pyspark import TaskContext

        context = TaskContext.get()
        partition, attempt = context.partitionId(), context.attemptNumber()
        Path(marks, f"{partition}-{attempt}-{os.getpid()}").touch()
        for task in tasks:
            for n in range(ROWS_PER_TASK):
                if n == KILL_AT and partition == 0 and attempt == 0:
                    time.sleep(1.0)  # what was handed on reaches the sink and the broker
                    os.kill(os.getpid(), signal.SIGKILL)
                yield (f"t{task}-{n}".encode(),)

    return rows


def main() -> None:
    endpoint, source, sink, retried, marks = sys.argv[1:6]
    # Executors start Python workers with PYSPARK_PYTHON, and those must import this checkout's pipeline and
    # connector: the same interpreter, and the checkout on their PYTHONPATH.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as f

    from pipeline.source import register

    spark = (SparkSession.builder.master("local-cluster[2,1,1024]").appName("mc0 cluster test")
             .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.executorEnv.PYTHONPATH", str(ROOT))
             .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
             .config("spark.task.maxFailures", "4")  # a failed task is run again (the default on a cluster)
             .getOrCreate())
    register(spark)
    options = {"broker": endpoint, "curve": "false"}
    frame = spark.read.format("mc0").options(**options, subscribe=source,
                                             maxRecordsPerPartition="2500").load()
    summary = frame.agg(f.count("*").alias("rows"), f.sum(f.length("value")).alias("bytes"),
                        f.min("id").alias("first"), f.max("id").alias("last")).collect()[0]
    hosts = frame.select(f.spark_partition_id().alias("task")).distinct().count()
    executors = spark.sparkContext.parallelize(range(8), 8).map(lambda _: os.getpid()).distinct().count()
    frame.select("value").write.format("mc0").options(**options, topic=sink).mode("append").save()
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "500")  # rows reach the sink as they come
    rows = spark.sparkContext.parallelize([0, 1], 2).mapPartitions(rows_that_kill_their_first_attempt(marks))
    spark.createDataFrame(rows, "value binary").write.format("mc0").options(**options, topic=retried).mode(
        "append").save()
    print(json.dumps({"rows": summary.rows, "bytes": summary.bytes, "first": summary.first,
                      "last": summary.last, "tasks": hosts, "worker_processes": executors,
                      "retried_rows_per_task": ROWS_PER_TASK}))
    spark.stop()


if __name__ == "__main__":
    main()
