"""``python -m bench monitoring``: what watching the broker costs it, with 10,000 topics.

The broker runs in its own process (CURVE off, gateways off, its monitoring endpoint on a free loopback port)
with ``--topics`` topics, each holding one message: ``--persistent`` of them persistent (strong, a log each),
the rest transient, and every tenth one with a subscriber. Then, in the same run:

1. **What a scrape costs.** Each endpoint is fetched ``--repeat`` times, a fresh snapshot each time
   (requests are spaced past the snapshot's sharing window): the wall time of the request as a client sees
   it, the size of the answer, and the broker's own figure for the loop time the snapshot took
   (``mc0_monitoring_snapshot_seconds``) and in how many slices.
2. **What the loop feels.** A client sends mc0 ``NOOP`` commands with an ID at a steady pace and times each
   round trip, first with nobody on the HTTP port (the baseline), then while a scraper fetches ``/metrics``
   back to back (far beyond Prometheus's one scrape per 15 s: the worst case), then while it fetches
   ``/api/overview`` back to back (a dashboard on a fast loop). Percentiles of each, and their ratio against
   the baseline: the round trip of a command is what a client of a busy loop waits for.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any

import zmq
from prometheus_client.parser import text_string_to_metric_families

from bench.throughput import free_port
from protocol import mc0

#: Topics put in one PUTS batch while filling the broker (a frame set well under the frame size cap).
FILL_BATCH = 1000
#: Seconds to wait for anything the broker should answer at once.
STALL_SECONDS = 30.0
#: Round trips per second during part 2: often enough for good percentiles, far below what the loop can do.
PING_RATE = 200
#: Snapshots are shared for 0.5 s (broker.monitoring.http.SNAPSHOT_MAX_AGE): part 1 waits longer than that
#: between requests so that each one pays for a snapshot of its own.
FRESH_AFTER = 0.6


def serve(port: int, http_port: int, data_dir: str, ready: Any) -> None:
    """The broker under test: topics named ``p.*`` are persistent strong, the rest transient broadcast."""
    import logging
    from pathlib import Path

    from broker import server
    from broker.config import BrokerConfig
    from broker.topics import Persistence, Sync, TopicRule, TopicSpec

    logging.basicConfig(level=logging.ERROR)
    rules = (TopicRule("p.*", TopicSpec(persistence=Persistence.PERSISTENT, sync=Sync.STRONG)),)
    config = BrokerConfig(bind=f"tcp://127.0.0.1:{port}", curve=False, topics=rules, data_dir=Path(data_dir),
                          sexp="off", msgq="off", rstreams="off", lumberjack="off",
                          http=f"127.0.0.1:{http_port}")
    server.run(config, lambda _broker: ready.set())


# -------------------------------------------------------------------------------------------------- clients


class Peer:
    """A raw DEALER speaking mc0 through the codec."""

    def __init__(self, context: zmq.Context, endpoint: str) -> None:
        self.socket = context.socket(zmq.DEALER)
        self.socket.linger = 0
        self.socket.connect(endpoint)
        self.ids = 0

    def request(self, event: Any) -> Any:
        """Send one command with a fresh ID and return the reply to it (NOOP heartbeats skipped)."""
        self.ids += 1
        command_id = b"%d" % self.ids
        event.id = command_id
        self.socket.send_multipart(mc0.encode(event))
        while True:
            if not self.socket.poll(int(STALL_SECONDS * 1000)):
                raise RuntimeError(f"no answer to {type(event).__name__} within {STALL_SECONDS} s")
            reply = mc0.decode(self.socket.recv_multipart())
            if getattr(reply, "id", None) == command_id:
                if isinstance(reply, mc0.Error):
                    raise RuntimeError(f"{type(event).__name__} refused: {reply}")
                return reply


def fill(peer: Peer, topics: int, persistent: int, subscriber: Peer) -> None:
    names = [b"p.%d" % n if n < persistent else b"t.%d" % n for n in range(topics)]
    for start in range(0, topics, FILL_BATCH):
        chunk = names[start : start + FILL_BATCH]
        peer.request(mc0.Puts([(name, b"x" * 100, mc0.NO_HEADERS) for name in chunk]))
    subscribed = names[::10]
    for start in range(0, len(subscribed), FILL_BATCH):
        subscriber.request(mc0.Sub(subscribed[start : start + FILL_BATCH]))


def fetch(url: str) -> tuple[float, bytes]:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=STALL_SECONDS) as response:
        body = response.read()
    return time.perf_counter() - started, body


def snapshot_seconds(metrics: bytes) -> float:
    for family in text_string_to_metric_families(metrics.decode()):
        if family.name == "mc0_monitoring_snapshot_seconds":
            return family.samples[0].value
    raise RuntimeError("/metrics has no mc0_monitoring_snapshot_seconds")


# --------------------------------------------------------------------------------------------------- report


@dataclass
class Scrape:
    path: str
    seconds: list[float] = field(default_factory=list)
    size: int = 0

    @property
    def median_ms(self) -> float:
        return statistics.median(self.seconds) * 1000


@dataclass
class RoundTrips:
    name: str
    seconds: list[float] = field(default_factory=list)
    scrapes: int = 0  # scrapes the HTTP client finished meanwhile

    def percentile(self, q: float) -> float:
        ordered = sorted(self.seconds)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

    @property
    def p50(self) -> float:
        return self.percentile(0.5)

    @property
    def p99(self) -> float:
        return self.percentile(0.99)

    @property
    def worst(self) -> float:
        return max(self.seconds) * 1000


@dataclass
class Report:
    topics: int
    persistent: int
    scrapes: list[Scrape]
    snapshot_ms: list[float]
    slices: list[int]
    trips: list[RoundTrips]

    def lines(self) -> list[str]:
        out = [f"{self.topics:,} topics ({self.persistent:,} persistent), one message each, a subscriber on "
               "every tenth", "", "1. one request, a fresh snapshot each (median):"]
        for scrape in self.scrapes:
            out.append(f"   {scrape.path:<16} {scrape.median_ms:8.1f} ms  {scrape.size / 1024:8.0f} KiB")
        out.append(f"   snapshot on the loop: {statistics.median(self.snapshot_ms):.1f} ms in "
                   f"{statistics.median(self.slices):.0f} slices (of at most 2 ms each), median")
        out += ["", f"2. NOOP round trips at {PING_RATE}/s (ms):"]
        base = self.trips[0]
        for trips in self.trips:
            note = "" if trips is base else (f"  ({trips.scrapes} scrapes; p99 x{trips.p99 / base.p99:.2f}, "
                                              f"max x{trips.worst / base.worst:.2f} of the baseline)")
            figures = f"p50 {trips.p50:6.2f}  p99 {trips.p99:6.2f}  max {trips.worst:6.2f}"
            out.append(f"   {trips.name:<26} {figures}{note}")
        return out


def round_trips(peer: Peer, name: str, seconds: float, scraper: str | None) -> RoundTrips:
    result = RoundTrips(name)
    stop = threading.Event()

    def scrape() -> None:
        while not stop.is_set():
            fetch(scraper)  # type: ignore[arg-type]
            result.scrapes += 1

    thread = threading.Thread(target=scrape, daemon=True) if scraper else None
    if thread is not None:
        thread.start()
        time.sleep(0.5)  # the scraper is under way before the first round trip
    interval = 1 / PING_RATE
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        started = time.perf_counter()
        peer.request(mc0.Noop())
        elapsed = time.perf_counter() - started
        result.seconds.append(elapsed)
        time.sleep(max(0.0, interval - elapsed))
    stop.set()
    if thread is not None:
        thread.join(STALL_SECONDS)
    return result


def run(topics: int = 10_000, persistent: int = 100, repeat: int = 5, seconds: float = 5.0) -> Report:
    spawn = mp.get_context("spawn")
    port, http_port = free_port(), free_port()
    ready = spawn.Event()
    base = f"http://127.0.0.1:{http_port}"
    with tempfile.TemporaryDirectory() as data_dir:
        process = spawn.Process(target=serve, args=(port, http_port, data_dir, ready), daemon=True)
        process.start()
        context = zmq.Context()
        try:
            if not ready.wait(STALL_SECONDS):
                raise RuntimeError("the broker did not start")
            endpoint = f"tcp://127.0.0.1:{port}"
            peer, subscriber = Peer(context, endpoint), Peer(context, endpoint)
            fill(peer, topics, persistent, subscriber)
            scrapes = [Scrape(path) for path in ("/metrics", "/api/overview", "/api/stats")]
            snapshot_ms: list[float] = []
            slices: list[int] = []
            for _ in range(repeat):
                for scrape in scrapes:
                    time.sleep(FRESH_AFTER)
                    elapsed, body = fetch(base + scrape.path)
                    scrape.seconds.append(elapsed)
                    scrape.size = len(body)
                    if scrape.path == "/metrics":
                        snapshot_ms.append(snapshot_seconds(body) * 1000)
                    if scrape.path == "/api/overview":
                        slices.append(json.loads(body)["snapshot"]["slices"])
            trips = [
                round_trips(peer, "nobody watching", seconds, None),
                round_trips(peer, "/metrics back to back", seconds, base + "/metrics"),
                round_trips(peer, "/api/overview back to back", seconds, base + "/api/overview"),
            ]
            return Report(topics, persistent, scrapes, snapshot_ms, slices, trips)
        finally:
            context.destroy(linger=0)
            process.terminate()
            process.join(10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench monitoring", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--topics", type=int, default=10_000)
    parser.add_argument("--persistent", type=int, default=100, help="of them persistent (a log each)")
    parser.add_argument("--repeat", type=int, default=5, help="requests per endpoint in part 1")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each part-2 run")
    args = parser.parse_args(argv)
    report = run(args.topics, args.persistent, args.repeat, args.seconds)
    for line in report.lines():
        print(line)
    return 0
