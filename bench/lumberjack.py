"""``python -m bench lumberjack``: events per second shipped over Lumberjack into a strong topic, next to the
same events published over mc0 into the same kind of topic, in the same run.

Both sides send the same JSON events (about 100 bytes each) to a persistent topic with ``sync = "strong"``,
each from its own process, against one broker process:

* **lumberjack**: the connector's ``LumberjackClient`` (v2, compressed), batches of 2,048 events with two
  batches in flight as Beats keep them, each acknowledged by the broker only once it is fsynced.
* **mc0**: ``connector.Client`` publishing the same events without waiting, then one confirmed publish: its
  OK means everything before it is fsynced too.

The figure is events per second from the first send to the last acknowledgement, median of ``--repeat``
runs, interleaved, with the ratio lumberjack / mc0.

Then, with ``--new-topics N`` (500 by default, 0 to skip): one window of N events, each routed by its
``fields.topic`` to a new strong topic, while another client publishes confirmed to a strong topic of its own
every 10 ms (:mod:`bench.bystander`): the seconds until the window is acked, and that client's confirmation
times meanwhile (p50, p90, slowest). No target: how long making hundreds of topics holds everyone else up
(their directories are built in the store's threads while the event that names one waits).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import platform
import statistics
import time
from typing import Any

from bench.bystander import beside_a_publisher, describe
from bench.process import broker_process
from bench.throughput import _free_pair

BATCH = 2048


def serve(port: int, data_dir: str, ready: Any, **settings: Any) -> None:
    """mc0 with its Lumberjack door on ``port + 1``; topics persistent and strong; events to "shipped"."""
    from bench.process import serve_broker
    from broker.topics import Persistence, Sync, TopicRule, TopicSpec

    rules = (TopicRule("*", TopicSpec(persistence=Persistence.PERSISTENT, sync=Sync.STRONG)),)
    serve_broker(port, ready, topics=rules, data_dir=data_dir, lumberjack=f"127.0.0.1:{port + 1}",
                 lumberjack_topic="shipped", **settings)


def serve_routed(port: int, data_dir: str, ready: Any) -> None:
    """The same, each event to the topic its ``fields.topic`` names."""
    serve(port, data_dir, ready, lumberjack_topic_field="fields.topic")


def event(n: int) -> dict[str, Any]:
    return {"message": f"GET /index.html 200 {n:08d}", "host": "web1", "level": "info"}


def ship(port: int, count: int, results: Any) -> None:
    from connector.lumberjack_client import LumberjackClient

    events = [event(n) for n in range(count)]
    with LumberjackClient("127.0.0.1", port + 1) as client:
        start = time.perf_counter()
        client.send_batches(events[first : first + BATCH] for first in range(0, count, BATCH))
        results.put(time.perf_counter() - start)


def publish(port: int, count: int, results: Any) -> None:
    from connector import Client

    bodies = [json.dumps(event(n), separators=(",", ":")).encode() for n in range(count)]
    with Client(f"tcp://127.0.0.1:{port}", curve=False, timeout=120) as client:
        start = time.perf_counter()
        for body in bodies[:-1]:
            client.publish("published", body)
        client.publish("published", bodies[-1], confirm=True)
        results.put(time.perf_counter() - start)


def run_once(kind: str, count: int) -> float:
    spawn = mp.get_context("spawn")
    port = _free_pair()
    with broker_process(serve, port):
        results = spawn.Queue()
        sender = spawn.Process(target=ship if kind == "lumberjack" else publish, args=(port, count, results),
                               daemon=True)
        sender.start()
        seconds = results.get(timeout=600)
        sender.join(30)
    return count / seconds


def new_topics(count: int) -> tuple[float, list[float]]:
    """One window of ``count`` events, each to a new strong topic, beside another client's publishes (see the
    module docstring)."""
    from connector.lumberjack_client import LumberjackClient

    events = [{**event(n), "fields": {"topic": f"shipped.{n}"}} for n in range(count)]
    port = _free_pair()
    with broker_process(serve_routed, port):

        def ship_window() -> None:
            with LumberjackClient("127.0.0.1", port + 1, timeout=120) as client:
                client.send_batch(events)

        return beside_a_publisher(f"tcp://127.0.0.1:{port}", {"curve": False}, "other", ship_window)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench lumberjack", description=__doc__)
    parser.add_argument("--events", type=int, default=200_000, help="events per run")
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure; the median is reported")
    parser.add_argument("--new-topics", type=int, default=500,
                        help="events of the window routed to new topics (0: not measured)")
    args = parser.parse_args(argv)
    print(f"python {platform.python_version()}, {args.events:,} events of about 100 bytes into a strong "
          f"topic, batches of {BATCH}, median of {args.repeat}")
    rates: dict[str, list[float]] = {"lumberjack": [], "mc0": []}
    for _ in range(args.repeat):
        for kind in rates:
            rates[kind].append(run_once(kind, args.events))
    shipped, published = statistics.median(rates["lumberjack"]), statistics.median(rates["mc0"])
    print(f"{'lumberjack events/s':<24}{shipped:>12,.0f}")
    print(f"{'mc0 events/s':<24}{published:>12,.0f}")
    print(f"{'lumberjack / mc0':<24}{shipped / published:>12.2f}")
    if args.new_topics:
        print(describe(f"a window to {args.new_topics:,} new topics", "acked", *new_topics(args.new_topics)))
    return 0
