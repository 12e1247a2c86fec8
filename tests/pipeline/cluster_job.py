"""Run by test_cluster.py in a process of its own: a Spark ``local-cluster`` (a master, two workers and their
executors, each executor a JVM of its own with its own Python workers) reading a topic through the ``mc0``
source and writing it back through the sink. Prints one JSON line of what it saw.

    python cluster_job.py ENDPOINT SOURCE_TOPIC SINK_TOPIC
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    endpoint, source, sink = sys.argv[1:4]
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
    print(json.dumps({"rows": summary.rows, "bytes": summary.bytes, "first": summary.first,
                      "last": summary.last, "tasks": hosts, "worker_processes": executors}))
    spark.stop()


if __name__ == "__main__":
    main()
