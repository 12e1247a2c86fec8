"""An example streaming job: count log events per host and level per minute, from a topic into a topic and
Parquet files.

    python -m pipeline.log_counts --demo              # everything in one command: broker, events, job
    python -m pipeline.log_counts --broker tcp://127.0.0.1:61616 --keys keys --once

It reads the events that arrive on ``--source`` (``logs``: what the Lumberjack door writes, one JSON object
per event, e.g. ``{"message": "...", "host": "web1", "level": "error"}``), parses each body, and counts events
per one-minute window (of the time the broker took the event), host and level. Every micro-batch writes the
complete, updated counts to the topic ``--sink`` (one JSON message per count, through the ``mc0`` data
source) and replaces the Parquet files under ``--output``. The checkpoint under ``--checkpoint`` makes a
restart continue exactly where the last run stopped. ``--once`` processes what is available and stops
(``trigger(availableNow=True)``); without it the job runs until interrupted.

``--demo`` runs a broker of its own (plaintext, loopback, a temporary data directory, ``logs`` persistent),
ships a few hundred sample events to it over Lumberjack, runs the job once and prints the counts.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from pipeline.source import register


def counts_query(spark: Any, broker_options: dict[str, str], source: str) -> Any:
    """The streaming DataFrame of counts per (minute, host, level)."""
    from pyspark.sql import functions as f

    events = (spark.readStream.format("mc0").options(**broker_options)
              .option("subscribe", source).option("startingOffsets", "earliest").load())
    fields = f.from_json(f.col("value").cast("string"), "host string, level string")
    return (events.select(f.col("timestamp"), fields.alias("event"))
            .groupBy(f.window("timestamp", "1 minute").alias("minute"), f.col("event.host").alias("host"),
                     f.col("event.level").alias("level"))
            .count())


def run(spark: Any, *, broker_options: dict[str, str], source: str, sink: str, output: Path,
        checkpoint: Path, once: bool) -> Any:
    """Start the job; returns the StreamingQuery (stopped already with ``once`` once it has drained)."""
    from pyspark.sql import functions as f

    register(spark)

    def write(batch: Any, batch_id: int) -> None:
        rows = batch.select(
            f.col("minute.start").alias("minute"), "host", "level", "count",
        )
        rows.write.mode("overwrite").parquet(str(output))
        # writeId: a micro-batch replayed after a crash writes its counts under the same id: they land once.
        (rows.select(f.to_json(f.struct("*")).alias("value"))
         .write.format("mc0").options(**broker_options).option("topic", sink)
         .option("writeId", f"{sink}-{batch_id}").mode("append").save())

    writer = (counts_query(spark, broker_options, source).writeStream.outputMode("complete")
              .foreachBatch(write).option("checkpointLocation", str(checkpoint)))
    query = writer.trigger(availableNow=True).start() if once else writer.start()
    if once:
        query.awaitTermination()
    return query


SAMPLE_HOSTS = ("web1", "web2", "db1")
SAMPLE_LEVELS = ("info", "info", "info", "warning", "error")
#: Events the demo ships.
DEMO_EVENTS = 300


def demo(spark: Any, workdir: Path) -> list[Any]:
    """A broker of our own, sample events shipped over Lumberjack, the job once; returns the count rows."""
    import asyncio
    import threading

    from broker.config import BrokerConfig
    from broker.server import Broker, serve
    from broker.topics import Persistence, TopicRule, TopicSpec
    from connector.lumberjack_client import LumberjackClient

    persistent = TopicSpec(persistence=Persistence.PERSISTENT)
    config = BrokerConfig(bind="tcp://127.0.0.1:*", curve=False, data_dir=workdir / "data",
                          topics=(TopicRule("logs", persistent), TopicRule("log-counts", persistent)),
                          sexp="off", msgq="off", rstreams="off", lumberjack="127.0.0.1:0", http="off")
    started: list[Broker] = []
    ready = threading.Event()
    loop_of: list[asyncio.AbstractEventLoop] = []

    def on_ready(broker: Broker) -> None:
        started.append(broker)
        loop_of.append(asyncio.get_running_loop())
        ready.set()

    thread = threading.Thread(target=lambda: asyncio.run(serve(config, on_ready)), daemon=True)
    thread.start()
    if not ready.wait(30):
        raise RuntimeError("the demo broker did not start")
    broker = started[0]
    try:
        events = [{"message": f"request {n}", "host": SAMPLE_HOSTS[n % 3], "level": SAMPLE_LEVELS[n % 5]}
                  for n in range(DEMO_EVENTS)]
        with LumberjackClient(*broker.gateway_address("lumberjack")) as shipper:
            shipper.send_batch(events)
        output = workdir / "log-counts.parquet"
        run(spark, broker_options={"broker": broker.endpoint, "curve": "false"}, source="logs",
            sink="log-counts", output=output, checkpoint=workdir / "checkpoint", once=True)
        return spark.read.parquet(str(output)).orderBy("host", "level").collect()
    finally:
        loop_of[0].call_soon_threadsafe(broker.stop)
        thread.join(30)


def python_for_workers() -> None:
    """Spark starts its Python workers with ``PYSPARK_PYTHON`` (else whatever ``python3`` is on PATH): make it
    this interpreter, which has PySpark and pyarrow, and let it import ``pipeline`` also when it runs from a
    checkout rather than an installed package. Settings already made by the user are kept."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    root = str(Path(__file__).resolve().parents[1])
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if root not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([root, *filter(None, paths)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.log_counts", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--broker", default="tcp://127.0.0.1:61616",
                        help="the broker's mc0 address [default: tcp://127.0.0.1:61616]")
    parser.add_argument("--no-curve", action="store_true", help="plaintext (a broker run with --no-curve)")
    parser.add_argument("--keys", default="keys", help="CURVE keys folder [default: keys]")
    parser.add_argument("--source", default="logs",
                        help="the persistent topic of events to count [default: logs]")
    parser.add_argument("--sink", default="log-counts",
                        help="the topic the counts go to [default: log-counts]")
    parser.add_argument("--output", type=Path, default=Path("log-counts.parquet"),
                        help="the Parquet folder the counts also go to [default: log-counts.parquet]")
    parser.add_argument("--checkpoint", type=Path, default=Path("log-counts.checkpoint"),
                        help="the streaming query's checkpoint folder [default: log-counts.checkpoint]")
    parser.add_argument("--once", action="store_true", help="process what is available, then stop")
    parser.add_argument("--demo", action="store_true",
                        help="run a broker of our own, ship sample events, run once and print the counts")
    args = parser.parse_args(argv)
    python_for_workers()
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[*]").appName("mc0 log counts")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "4").getOrCreate())
    if args.demo:
        import tempfile

        with tempfile.TemporaryDirectory() as workdir:
            rows = demo(spark, Path(workdir))
            print(f"shipped {DEMO_EVENTS} events over Lumberjack to the topic logs; the job counted them "
                  "into the topic log-counts and Parquet files (in a temporary folder, removed now):")
            print(f"{'minute':<16}  {'host':<6} {'level':<8} {'count':>5}")
            for row in rows:
                print(f"{row.minute:%Y-%m-%d %H:%M}  {row.host:<6} {row.level:<8} {row['count']:>5}")
        spark.stop()
        return 0
    options = {"broker": args.broker}
    options.update({"curve": "false"} if args.no_curve else {"keys": args.keys})
    query = run(spark, broker_options=options, source=args.source, sink=args.sink, output=args.output,
                checkpoint=args.checkpoint, once=args.once)
    if not args.once:
        query.awaitTermination()
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
