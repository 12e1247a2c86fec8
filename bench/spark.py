"""``python -m bench spark``: the ``mc0`` Spark source and sink next to their baselines, same rows, same run.

A broker process holds ``--messages`` 100-byte messages (1,000,000 by default) in a persistent topic, and a
local Parquet file holds the same rows (key, value, topic, id, timestamp). Then, interleaved, ``--repeat``
times each, on ``local[2]``:

* **read: mc0** — ``spark.read.format("mc0")...load().agg(sum(length(value)))``: the driver plans id ranges,
  executor tasks fetch stored records and turn them into Arrow columns;
* **read: mc0, checkCrcs=false** — the same, without the executors checking each record's CRC (shown for
  what the check costs; the targets are for the default);
* **read: mc0, value only** — the same query, the read given ``.schema("value binary")``: Spark's Python data
  sources cannot prune columns, so this is how a query names the one it needs, as Parquet's reader finds by
  itself (shown with its ratio to Parquet; the targets are for the default);
* **read: Parquet** — the same query over the Parquet file (target: mc0 >= 0.3 x);
* **read: connector** — one Python process reading the topic with ``Client.fetch`` and summing the body
  lengths (target: mc0 >= 1.5 x);
* **write: mc0** — ``--messages`` rows of 100 bytes written to a fresh topic through the sink (idempotent
  batches, exactly once);
* **write: connector** — one Python process publishing the same rows with ``Client.publish_batch``, batches
  of the sink's size, each waiting for its OK (target: mc0 >= 1.0 x).

Printed: rows/s of each (median) and the ratios, with whether each target is met. One whole run of each Spark
read and write (and one of ``publish_batch``) first warms the JVM's compiled code and the Python workers up,
unmeasured. ``--profile DIR`` also
runs what one executor task does for the whole topic, outside Spark (``pipeline.source.read_range`` and
``pipeline.sink.publish`` in this process), under cProfile, with the broker under cProfile too, and writes the
top functions of each into DIR: where a row's time goes on each side, apart from Spark's own.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.process import ENGINE_VARIABLE, broker_process, choose_engine
from bench.throughput import free_port

TOPIC = "bench.spark"
BODY = b"x" * 100
#: Rows per confirmed batch: the sink's own size (pipeline.sink.WRITE_BATCH), so the baseline does the same.
BATCH = 2000


def serve(port: int, data_dir: str, ready: Any) -> None:
    import logging

    from broker import server
    from broker.config import BrokerConfig
    from broker.topics import Persistence, Sync, TopicRule, TopicSpec

    logging.basicConfig(level=logging.ERROR)
    rules = (TopicRule("*", TopicSpec(persistence=Persistence.PERSISTENT, sync=Sync.ASYNC)),)
    config = BrokerConfig(bind=f"tcp://127.0.0.1:{port}", curve=False, topics=rules, data_dir=Path(data_dir),
                          sexp="off", msgq="off", rstreams="off", lumberjack="off", http="off",
                          mc0_engine=os.environ.get(ENGINE_VARIABLE, "auto"))
    profile = os.environ.get("MC0_BENCH_BROKER_PROFILE")
    if not profile:
        server.run(config, lambda _broker: ready.set())
        return
    import cProfile

    profiler = cProfile.Profile()
    profiler.enable()
    try:
        server.run(config, lambda _broker: ready.set())
    finally:
        profiler.disable()
        profiler.dump_stats(profile)


def fill(endpoint: str, count: int) -> None:
    from connector import Client

    with Client(endpoint, curve=False, timeout=300) as client:
        for first in range(0, count, BATCH):
            client.publish_batch([(TOPIC, BODY, None)] * min(BATCH, count - first))


def write_parquet(endpoint: str, path: Path) -> None:
    """The topic's rows as the source gives them, in one Parquet file (read with the connector, once)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from connector import Client

    ids: list[int] = []
    stamps: list[int] = []
    with Client(endpoint, curve=False, timeout=300) as client:
        position, end = client.offsets(TOPIC)
        while position < end:
            messages = client.fetch(TOPIC, position, max_messages=10_000, max_bytes=16 << 20).messages
            ids += [m.id for m in messages]
            stamps += [(m.timestamp or 0) * 1000 for m in messages]
            position = messages[-1].id + 1
    count = len(ids)
    table = pa.table({
        "key": pa.nulls(count, pa.binary()),
        "value": pa.array([BODY] * count, pa.binary()),
        "topic": pa.array([TOPIC] * count, pa.string()),
        "id": pa.array(ids, pa.int64()),
        "timestamp": pa.array(stamps, pa.timestamp("us", tz="UTC")),
    })
    pq.write_table(table, path)


def connector_read(endpoint: str) -> int:
    """One process, the connector's ordinary fetch: the sum of the body lengths."""
    from connector import Client

    total = 0
    with Client(endpoint, curve=False, timeout=300) as client:
        position, end = client.offsets(TOPIC)
        while position < end:
            result = client.fetch(TOPIC, position, max_messages=10_000, max_bytes=16 << 20)
            total += sum(len(m.body) for m in result.messages)
            position = result.messages[-1].id + 1
    return total


def connector_write(endpoint: str, topic: str, count: int) -> None:
    from connector import Client

    with Client(endpoint, curve=False, timeout=300) as client:
        for first in range(0, count, BATCH):
            client.publish_batch([(topic, BODY, None)] * min(BATCH, count - first))


def stored(endpoint: str, topic: str) -> int:
    from connector import Client

    with Client(endpoint, curve=False) as client:
        first, next_id = client.offsets(topic)
        return next_id - first


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench spark", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--profile", type=Path, help="also profile one read and one write into this folder")
    parser.add_argument("--mc0-engine", choices=("auto", "native", "zeromq"),
                        help="what serves the broker's mc0 port (default: the broker's own default, auto)")
    args = parser.parse_args(argv)
    choose_engine(args.mc0_engine)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    root = str(Path(__file__).resolve().parents[1])
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
        os.environ["MC0_BENCH_BROKER_PROFILE"] = str(args.profile / "broker.prof")
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as f

    from pipeline.source import register

    port = free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    expected = args.messages * len(BODY)
    rates: dict[str, list[float]] = {name: [] for name in
                                     ("read: mc0", "read: mc0, no CRCs", "read: mc0, value only",
                                      "read: Parquet", "read: connector",
                                      "write: mc0", "write: connector")}
    with broker_process(serve, port), tempfile.TemporaryDirectory() as scratch:
        fill(endpoint, args.messages)
        parquet = Path(scratch) / "rows.parquet"
        write_parquet(endpoint, parquet)
        if args.profile:
            profile_tasks(endpoint, args.messages, args.profile)
        spark = (SparkSession.builder.master("local[2]").appName("mc0 bench")
                 .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1").getOrCreate())
        register(spark)
        options = {"broker": endpoint, "curve": "false"}
        def source_reader() -> Any:  # a new reader each time: option() changes the one it is called on
            return spark.read.format("mc0").options(**options, subscribe=TOPIC)

        writes = spark.range(args.messages, numPartitions=2).select(
            f.unhex(f.lit(BODY.hex())).alias("value"))

        def timed(name: str, action: Any) -> None:
            started = time.perf_counter()
            action()
            rates[name].append(args.messages / (time.perf_counter() - started))

        def check(total: int, what: str) -> None:
            if total != expected:
                raise RuntimeError(f"{what} summed {total} bytes of {expected}")

        total_of = f.sum(f.length("value")).alias("bytes")
        # Warm up what every measured run reuses (the JVM's compiled code, Python workers, connections) with
        # one run of each Spark query and write, whole, as Parquet's always was; nothing of it is measured.
        # A small warm-up left the JVM compiling through the first measured write (a sink write of 20,000
        # rows first: the first measured write took 1.3-1.9 s and 1.2-1.6 CPU-s of the JVM, the next ones
        # 0.8-1.1 s and 0.5-0.7), and the median of three then took the slower of the two warm rounds. The
        # read takes two tasks, as the measured ones do: with one, the second Python worker started inside
        # the first measured read (a second or more of imports: that read took 1.6-2.3 s, the next 0.6-1.0).
        source_reader().load().agg(total_of).collect()
        spark.read.parquet(str(parquet)).agg(total_of).collect()
        writes.write.format("mc0").options(**options, topic="bench.warm").mode("append").save()
        connector_write(endpoint, "bench.warm.plain", args.messages)
        for round_ in range(args.repeat):
            timed("read: mc0", lambda: check(source_reader().load().agg(total_of).collect()[0].bytes, "mc0"))
            timed("read: mc0, no CRCs", lambda: check(source_reader().option("checkCrcs", "false").load().agg(
                total_of).collect()[0].bytes, "mc0"))
            timed("read: mc0, value only", lambda: check(source_reader().schema("value binary").load().agg(
                total_of).collect()[0].bytes, "mc0"))
            timed("read: Parquet", lambda: check(spark.read.parquet(str(parquet)).agg(total_of)
                                                 .collect()[0].bytes, "Parquet"))
            timed("read: connector", lambda: check(connector_read(endpoint), "the connector"))
            sink_topic, plain_topic = f"bench.sink.{round_}", f"bench.plain.{round_}"
            timed("write: mc0", lambda topic=sink_topic: writes.write.format("mc0").options(
                **options, topic=topic).mode("append").save())
            timed("write: connector",
                  lambda topic=plain_topic: connector_write(endpoint, topic, args.messages))
            for topic in (sink_topic, plain_topic):
                if stored(endpoint, topic) != args.messages:
                    raise RuntimeError(f"{topic} holds {stored(endpoint, topic)} of {args.messages}")
        spark.stop()
    median = {name: statistics.median(values) for name, values in rates.items()}
    print(f"python {platform.python_version()}, {args.messages:,} messages of {len(BODY)} bytes, local[2], "
          f"median of {args.repeat}")
    width = 33  # the longest name below, "read: mc0, value only / Parquet", and room
    for name, rate in median.items():
        print(f"{name:<{width}}{rate:>14,.0f} rows/s")
    targets = [
        ("read: mc0 / Parquet", median["read: mc0"] / median["read: Parquet"], 0.3),
        ("read: mc0 / connector", median["read: mc0"] / median["read: connector"], 1.5),
        ("write: mc0 / connector", median["write: mc0"] / median["write: connector"], 1.0),
    ]
    for name, ratio, target in targets:
        verdict = "met" if ratio >= target else "NOT met"
        print(f"{name:<{width}}{ratio:>14.2f}   target >= {target}: {verdict}")
    pruned = median["read: mc0, value only"] / median["read: Parquet"]
    name = "read: mc0, value only / Parquet"
    print(f"{name:<{width}}{pruned:>14.2f}   (no target: the query names its column)")
    if args.profile:
        report(args.profile)
    return 0


def profile_tasks(endpoint: str, count: int, folder: Path) -> None:
    """What the executor tasks do for the whole topic (one read, one write of ``count`` rows), here, under
    cProfile: the source's and the sink's own cost per row, without Spark's."""
    import cProfile

    import pyarrow as pa

    from pipeline.options import Mode
    from pipeline.sink import WriteSettings, publish
    from pipeline.source import Range, ReadSettings, read_range

    options = {"broker": endpoint, "curve": "false", "subscribe": TOPIC}
    settings = ReadSettings.parse(options, Mode.READ)
    from connector import Client

    with Client(endpoint, curve=False) as client:
        incarnation = client.fetch(TOPIC, max_messages=0).incarnation
    part = Range(TOPIC, 1, count + 1, incarnation)
    profiler = cProfile.Profile()
    started = time.perf_counter()
    profiler.runcall(lambda: sum(batch.num_rows for batch in read_range(settings, part)))
    print(f"profiled read: {count / (time.perf_counter() - started):,.0f} rows/s in one process")
    profiler.dump_stats(folder / "read.prof")

    from pyspark.sql.types import BinaryType, StructField, StructType

    schema = StructType([StructField("value", BinaryType())])
    write = WriteSettings.parse({"broker": endpoint, "curve": "false", "topic": "bench.profiled"}, schema,
                                Mode.WRITE)
    rows = pa.record_batch([pa.array([BODY] * 10_000, pa.binary())], names=["value"])
    profiler = cProfile.Profile()
    started = time.perf_counter()
    profiler.runcall(publish, write, iter([rows] * (count // 10_000)), b"bench-profile")
    print(f"profiled write: {count / (time.perf_counter() - started):,.0f} rows/s in one process")
    profiler.dump_stats(folder / "write.prof")


def report(folder: Path) -> None:
    """The top of each profile, as text beside it."""
    import pstats

    for path in sorted(folder.glob("*.prof")):
        with path.with_suffix(".txt").open("w") as out:
            pstats.Stats(str(path), stream=out).sort_stats("tottime").print_stats(25)
        print(f"profile: {path.with_suffix('.txt')}")
