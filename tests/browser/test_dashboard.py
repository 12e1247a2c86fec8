"""The dashboard as a person sees it: headless Chromium (Debian's package) opens the page a real broker
serves while messages are published through two doors, and the test reads what the page shows: the topic in
the table, a publish rate that is above zero and moves as the pace changes, its line in the chart, a lagging
subscriber among the slowest, fsync latency, and the topic's own page; and in a three-broker cluster, what
each member's header says of its role.

Screenshots of both pages are saved as artifacts: under pytest's temporary directory, or in the folder named
by ``MC0_SCREENSHOTS`` when it is set (that is how the picture in docs/monitoring.md is made).
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from chromium import EXECUTABLE, Chromium
from conftest import BrokerFactory, DealerFactory

from bench.cluster import make_cluster
from broker.server import Broker
from broker.topics import Delivery, Persistence, Sync, TopicRule, TopicSpec
from connector import Client
from connector.sexp_client import SexpClient

pytestmark = pytest.mark.skipif(
    not os.access(EXECUTABLE, os.X_OK),
    reason="needs Debian's chromium (apt-get install chromium; .ci/run installs it)",
)

RULES = (
    TopicRule("orders.*", TopicSpec(persistence=Persistence.PERSISTENT, sync=Sync.STRONG,
                                    retention_seconds=7 * 86400)),
    TopicRule("jobs.*", TopicSpec(delivery=Delivery.ROUND_ROBIN, persistence=Persistence.PERSISTENT,
                                  sync=Sync.WEAK)),
)
#: Messages per second in the first phase and the second: the rate on the page must follow.
SLOW, FAST = 20, 120
PHASE_SECONDS = 4.0


class Traffic:
    """Publishes in a thread until stopped: orders.eu at SLOW msg/s, then FAST, over mc0; news over sexp."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.stop = threading.Event()
        self.failure: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="traffic", daemon=True)

    def _run(self) -> None:
        try:
            sexp = SexpClient(*self.broker.gateway_address("sexp"))
            with Client(self.broker.endpoint, curve=False) as client:
                started = time.monotonic()
                sent = 0
                while not self.stop.is_set():
                    elapsed = time.monotonic() - started
                    pace = SLOW if elapsed < PHASE_SECONDS else FAST
                    client.publish("orders.eu", f"order {sent}")
                    client.publish("jobs.render", f"job {sent}")
                    if sent % 4 == 0:
                        sexp.publish("news", f"headline {sent}")
                        client.publish("orders.us", f"order {sent}")
                    sent += 1
                    time.sleep(1 / pace)
            sexp.close()
        except BaseException as error:  # reported by the test
            self.failure = error

    def __enter__(self) -> Traffic:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(10)
        assert self.failure is None, f"publishing failed: {self.failure!r}"


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Chromium]:
    chromium = Chromium(tmp_path / "profile", tmp_path / "chromium.log")
    yield chromium
    chromium.close()


def screenshots(tmp_path: Path) -> Path:
    folder = os.environ.get("MC0_SCREENSHOTS")
    return Path(folder) if folder else tmp_path / "screenshots"


def shown_rate(text: str) -> float:
    """A rate as the page prints it: "12.5", "3.4k", or a dash before there are two samples."""
    match = re.fullmatch(r"([\d.]+)([kMG]?)", text.strip())
    if match is None:
        return 0.0
    return float(match.group(1)) * {"": 1, "k": 1e3, "M": 1e6, "G": 1e9}[match.group(2)]


ROW = "document.querySelector('#topics tr[data-topic=\"orders.eu\"]')"
RATE_CELL = f"{ROW}?.querySelector('td[data-key=\"in\"]')?.textContent"


@pytest.mark.timeout(120)
def test_the_dashboard_shows_the_topic_and_a_rate_that_moves(
    start_broker: BrokerFactory, dealer: DealerFactory, browser: Chromium, tmp_path: Path
) -> None:
    broker = start_broker(topics=RULES)
    assert broker.http_address is not None
    host, port = broker.http_address
    # A subscriber that takes three messages and never acks them: the slowest subscriber on the page.
    laggard = dealer(broker.endpoint)
    laggard.connect()
    laggard.ok("SUB", "CREDIT", "3", "ACKS", "explicit", "", "orders.eu")
    with Client(broker.endpoint, curve=False) as worker:
        worker.subscribe("jobs.render")  # a consumer for the queue, keeping up
        with Traffic(broker):
            browser.open(f"http://{host}:{port}/")
            browser.wait_for(f"{ROW} !== null")
            # The rate of orders.eu, read from the page once a second: above zero, and following the pace.
            readings = []
            deadline = time.monotonic() + 2 * PHASE_SECONDS + 3
            while time.monotonic() < deadline:
                readings.append(shown_rate(browser.evaluate(RATE_CELL) or ""))
                time.sleep(1.0)
            assert max(readings) > 0, readings
            assert len(set(readings)) > 2, f"the rate on the page does not move: {readings}"
            assert max(readings[-3:]) > 2 * min(value for value in readings if value > 0), readings
            # Its line in the per-topic chart, the lagging subscriber, the fsyncs of the strong topic.
            assert browser.evaluate(
                "document.querySelector('#chart-topics polyline[data-name=\"orders.eu\"]')"
                ".getAttribute('points').split(' ').length") > 3
            slowest = browser.wait_for("document.querySelector('#slowest tbody tr td')?.textContent")
            assert slowest == "orders.eu"
            fsync = browser.evaluate("document.querySelector('[data-card=\"fsync-p99\"] .value').textContent")
            assert fsync.endswith(("µs", "ms", " s")), fsync
            assert browser.evaluate("document.querySelector('#cluster').hidden") is True  # no cluster
            connections = browser.evaluate("document.querySelector('#connections').textContent")
            assert "mc0" in connections
            assert "sexp" in connections
            overview = browser.screenshot(screenshots(tmp_path) / "dashboard.png")

            browser.evaluate("location.hash = '#/topic/' + encodeURIComponent('orders.eu')")
            browser.wait_for("document.querySelector('#topic-name').textContent === 'orders.eu'")
            browser.wait_for("document.querySelectorAll('#topic-subscribers tbody tr').length === 1")
            settings = browser.evaluate("document.querySelector('#topic-settings').textContent")
            assert "persistent / strong" in settings
            assert "7d 0h" in settings  # the retention
            ids = browser.evaluate("document.querySelector('#topic-ids').textContent")
            assert "first id1" in ids
            # The topic's chart goes on from what the overview saw of it.
            assert browser.wait_for("document.querySelector('#chart-topic polyline')"
                                    "?.getAttribute('points').split(' ').length") > 3
            topic = browser.screenshot(screenshots(tmp_path) / "topic.png")
    for picture in (overview, topic):
        data = picture.read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n")
        assert len(data) > 20_000, f"{picture} is suspiciously small"


CLUSTER_PILL = "document.querySelector('#cluster')"


@pytest.mark.timeout(120)
def test_a_cluster_members_header_says_its_role(browser: Chromium, tmp_path: Path) -> None:
    cluster = make_cluster(tmp_path / "cluster", monitoring=True)
    try:
        for member in cluster.members:
            cluster.start(member)
        leader = cluster.settled()
        epoch = cluster.cluster_view(leader)["epoch"]
        follower = next(member for member in cluster.members if member is not leader)
        browser.open(f"http://127.0.0.1:{leader.http}/")
        text = browser.wait_for(f"{CLUSTER_PILL}?.textContent.endsWith('3/3 connected') && "
                                f"{CLUSTER_PILL}.textContent")
        assert text == f"leader · epoch {epoch} · 3/3 connected"
        assert browser.evaluate(f"{CLUSTER_PILL}.className") == "pill ok"
        title = browser.wait_for(f"{CLUSTER_PILL}?.title.includes('last fetch') && {CLUSTER_PILL}.title")
        for other in cluster.members:
            if other is not leader:
                assert f"{other.raft}: 0 behind" in title, title
        browser.open(f"http://127.0.0.1:{follower.http}/")
        text = browser.wait_for(f"{CLUSTER_PILL}?.textContent.startsWith('follower') && "
                                f"{CLUSTER_PILL}.textContent")
        assert text == f"follower of {leader.raft} · epoch {epoch} · 3/3 connected"
    finally:
        cluster.stop_all()
        cluster.context.term()
