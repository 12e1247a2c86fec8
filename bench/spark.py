"""``python -m bench spark``: read a topic into Spark (a count) next to reading it with the connector in one
process, same topic, same broker, same run.

A broker process holds ``--messages`` 100-byte messages (1,000,000 by default) in a persistent topic. Then,
interleaved, ``--repeat`` times each:

* **spark**: ``spark.read.format("mc0")...load().count()`` on ``local[2]``, ``minPartitions`` 2 — every row
  travels through the broker's range fetch into Arrow batches on two executor processes;
* **connector**: one process fetching the whole topic with ``Client.fetch`` and counting the messages.

Printed: rows/s of each (median) and their ratio spark / connector.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench.process import broker_process
from bench.throughput import free_port

TOPIC = "bench.spark"


def serve(port: int, data_dir: str, ready: Any) -> None:
    import logging

    from broker import server
    from broker.config import BrokerConfig
    from broker.topics import Persistence, Sync, TopicRule, TopicSpec

    logging.basicConfig(level=logging.ERROR)
    rules = (TopicRule("*", TopicSpec(persistence=Persistence.PERSISTENT, sync=Sync.ASYNC)),)
    config = BrokerConfig(bind=f"tcp://127.0.0.1:{port}", curve=False, topics=rules, data_dir=Path(data_dir),
                          sexp="off", msgq="off", rstreams="off", lumberjack="off")
    server.run(config, lambda _broker: ready.set())


def fill(endpoint: str, count: int) -> None:
    from connector import Client

    body = b"x" * 100
    with Client(endpoint, curve=False, timeout=300) as client:
        for _ in range(count - 1):
            client.publish(TOPIC, body)
        client.publish(TOPIC, body, confirm=True)


def connector_count(endpoint: str) -> int:
    from connector import Client

    counted = 0
    with Client(endpoint, curve=False, timeout=300) as client:
        position, end = client.offsets(TOPIC)
        while position < end:
            result = client.fetch(TOPIC, position, max_messages=5000, max_bytes=4 << 20)
            counted += len(result.messages)
            position = result.messages[-1].id + 1
    return counted


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench spark", description=__doc__)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from pipeline.source import register

    port = free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    with broker_process(serve, port):
        fill(endpoint, args.messages)
        spark = (SparkSession.builder.master("local[2]").appName("mc0 bench")
                 .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
                 .getOrCreate())
        register(spark)
        frame = (spark.read.format("mc0").option("broker", endpoint).option("curve", "false")
                 .option("subscribe", TOPIC).option("minPartitions", "2"))
        rates: dict[str, list[float]] = {"spark": [], "connector": []}
        for _ in range(args.repeat):
            start = time.perf_counter()
            rows = frame.load().count()
            rates["spark"].append(rows / (time.perf_counter() - start))
            start = time.perf_counter()
            counted = connector_count(endpoint)
            rates["connector"].append(counted / (time.perf_counter() - start))
            if rows != args.messages or counted != args.messages:
                raise RuntimeError(f"counted {rows} (spark) and {counted} (connector) of {args.messages}")
        spark.stop()
    spark_rate, connector_rate = statistics.median(rates["spark"]), statistics.median(rates["connector"])
    print(f"python {platform.python_version()}, {args.messages:,} messages of 100 bytes, median of "
          f"{args.repeat}")
    print(f"{'spark count rows/s':<24}{spark_rate:>12,.0f}")
    print(f"{'connector rows/s':<24}{connector_rate:>12,.0f}")
    print(f"{'spark / connector':<24}{spark_rate / connector_rate:>12.2f}")
    return 0
