"""The monitoring endpoint of a real broker: /metrics parsed by prometheus-client's own parser and checked
against what was published through two doors, the health endpoints in every state, the JSON API against
STATS, topic labels capped and off, refused CURVE handshakes, the default port taken, and what the endpoint
refuses (writes, foreign Host names, too many requests at once)."""

from __future__ import annotations

import asyncio
import http.client
import json
import logging
import re
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import zmq
from conftest import (
    ARRIVAL,
    FREE_GATEWAY_PORTS,
    BrokerFactory,
    BrokerThread,
    DealerFactory,
    Samples,
    metric_samples,
    metric_value,
)

from broker import config as broker_config
from broker.config import BrokerConfig
from broker.engine import Engine
from broker.hub import Hub
from broker.monitoring import http as monitoring_http
from broker.server import Broker
from broker.topics import Persistence, Sync, TopicRule, TopicSpec
from connector import Client, keys
from connector.sexp_client import SexpClient

STRONG = TopicRule("orders.*", TopicSpec(persistence=Persistence.PERSISTENT, sync=Sync.STRONG))


# ----------------------------------------------------------------------------------------------- scraping


def get(broker: Broker, path: str, *, method: str = "GET", headers: dict[str, str] | None = None
        ) -> tuple[int, dict[str, str], bytes]:
    assert broker.http_address is not None, "the broker has no monitoring endpoint"
    host, port = broker.http_address
    connection = http.client.HTTPConnection(host, port, timeout=10)
    try:
        connection.request(method, path, headers=headers or {})
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


def get_json(broker: Broker, path: str) -> Any:
    status, _, body = get(broker, path)
    assert status == 200, (path, status, body)
    return json.loads(body)


def scrape(broker: Broker) -> Samples:
    """Every sample of /metrics, by sample name and label set, read by prometheus-client's parser."""
    status, headers, body = get(broker, "/metrics")
    assert status == 200, body
    assert headers["Content-Type"].startswith("text/plain"), headers
    return metric_samples(body.decode())


value = metric_value


def eventually(check: Callable[[], Any], within: float = ARRIVAL) -> Any:
    """``check()``'s first truthy result (snapshots are shared for half a second: counters lag a little)."""
    deadline = time.monotonic() + within
    while True:
        result = check()
        if result or time.monotonic() > deadline:
            return result
        time.sleep(0.1)


def scrape_until(broker: Broker, name: str, expected: float, **labels: str) -> Samples:
    """The first scrape in which the sample ``name`` with ``labels`` is ``expected``."""
    samples = eventually(lambda: (s := scrape(broker)) and value(s, name, **labels) == expected and s)
    assert samples, f"{name} {labels} never showed {expected}"
    return samples


def publish(client: Client, topic: str, count: int) -> None:
    for n in range(count):
        client.publish(topic, f"{topic} {n}", confirm=n == count - 1)


# ------------------------------------------------------------------------------------------------ /metrics


@pytest.mark.timeout(60)
def test_metrics_count_what_was_published_through_two_doors(start_broker: BrokerFactory) -> None:
    broker = start_broker(topics=(STRONG,))
    sexp = SexpClient(*broker.gateway_address("sexp"))
    with Client(broker.endpoint, curve=False) as client:
        client.subscribe("orders.eu")
        publish(client, "orders.eu", 30)
        publish(client, "news", 7)
        for n in range(5):
            sexp.publish("news", f"over sexp {n}")
        received = [client.receive(timeout=ARRIVAL) for _ in range(30)]
        assert all(message is not None for message in received)
        samples = scrape_until(broker, "mc0_topic_published_messages_total", 12, topic="news")
        assert value(samples, "mc0_topic_published_messages_total", topic="orders.eu") == 30
        assert value(samples, "mc0_topic_delivered_messages_total", topic="orders.eu") == 30
        assert value(samples, "mc0_topic_subscribers", topic="orders.eu") == 1
        assert value(samples, "mc0_topic_subscribers", topic="news") == 0
        assert value(samples, "mc0_topic_last_message_id", topic="orders.eu") == 30
        assert value(samples, "mc0_topic_stored_messages", topic="orders.eu") == 30
        assert value(samples, "mc0_topic_disk_bytes", topic="orders.eu") > 30 * len("orders.eu 29")
        assert value(samples, "mc0_topic_disk_bytes", topic="news") is None  # transient: nothing on disk
        assert value(samples, "mc0_published_messages_total") == 42
        assert value(samples, "mc0_topics") == 2
        # Per door: 37 messages in over mc0, 5 over sexp; 30 deliveries out to the mc0 subscriber.
        assert value(samples, "mc0_door_received_messages_total", door="mc0") == 37
        assert value(samples, "mc0_door_received_messages_total", door="sexp") == 5
        assert value(samples, "mc0_door_sent_messages_total", door="mc0") == 30
        assert value(samples, "mc0_door_received_bytes_total", door="sexp") > 5 * len("over sexp 0")
        assert value(samples, "mc0_door_sent_bytes_total", door="mc0") > 30 * len("orders.eu 29")
        assert value(samples, "mc0_door_connections", door="mc0") == 1
        assert value(samples, "mc0_door_connections", door="sexp") == 1
        assert value(samples, "mc0_door_accepted_connections_total", door="mc0") >= 1
        assert value(samples, "mc0_sessions") == 1
        # The strong topic was fsynced: every fsync timed, every commit's size counted.
        fsyncs = value(samples, "mc0_topic_fsyncs_total", topic="orders.eu")
        assert fsyncs >= 1
        assert value(samples, "mc0_topic_write_failures_total", topic="orders.eu") == 0
        assert value(samples, "mc0_write_failures_total") == 0
        assert value(samples, "mc0_fsync_duration_seconds_count") == fsyncs
        assert value(samples, "mc0_fsync_duration_seconds_bucket", le="+Inf") == fsyncs
        assert value(samples, "mc0_fsync_duration_seconds_sum") > 0
        assert value(samples, "mc0_group_commit_messages_sum") == 30  # orders.eu is the only log
        assert value(samples, "mc0_loop_turn_duration_seconds_count") >= 1
        assert value(samples, "mc0_ready") == 1
        assert value(samples, "process_open_fds") > 0
        assert value(samples, "mc0_handshakes_refused_total", reason="auth") == 0
    sexp.close()


def test_a_lagging_subscription_shows_its_lag(start_broker: BrokerFactory, dealer: DealerFactory) -> None:
    broker = start_broker(topics=(STRONG,))
    reader = dealer(broker.endpoint)
    reader.connect()
    reader.ok("SUB", "CREDIT", "3", "ACKS", "explicit", "", "orders.slow")  # 3 in flight, never acked
    with Client(broker.endpoint, curve=False) as client:
        publish(client, "orders.slow", 20)
    samples = scrape_until(broker, "mc0_topic_consumer_lag_messages", 17, topic="orders.slow")
    (labels, lag), = samples["mc0_subscription_lag_messages"].items()
    assert lag == 17
    assert dict(labels)["topic"] == "orders.slow"
    assert dict(labels)["door"] == "mc0"
    slowest = get_json(broker, "/api/overview")["slowest"]
    assert [(item["topic"], item["lag"], item["door"]) for item in slowest] == [("orders.slow", 17, "mc0")]


def test_topic_labels_are_capped_with_the_rest_summed(start_broker: BrokerFactory) -> None:
    broker = start_broker(http_topic_labels=2)
    with Client(broker.endpoint, curve=False) as client:
        for topic, count in (("a", 5), ("b", 40), ("c", 3), ("d", 20)):
            publish(client, topic, count)
    samples = scrape_until(broker, "mc0_published_messages_total", 68)
    published = {dict(labels)["topic"]: count
                 for labels, count in samples["mc0_topic_published_messages_total"].items()}
    assert published == {"b": 40, "d": 20, "_other": 8}


def test_topic_labels_can_be_turned_off(start_broker: BrokerFactory) -> None:
    broker = start_broker(http_topic_labels=0)
    with Client(broker.endpoint, curve=False) as client:
        publish(client, "a", 4)
    samples = scrape_until(broker, "mc0_published_messages_total", 4)
    assert not [name for name in samples if name.startswith("mc0_topic_")]
    assert value(samples, "mc0_topics") == 1


def test_refused_curve_handshakes_are_counted(curve_broker: Broker, dealer: DealerFactory,
                                              keys_dir: Path) -> None:
    public, secret = zmq.curve_keypair()
    dealer(curve_broker.endpoint, server_key=keys.broker_public(keys_dir), public_key=public,
           secret_key=secret).send("CONNECT", "VERSION", "0.2")
    dealer(curve_broker.endpoint).send("CONNECT", "VERSION", "0.2")  # plaintext on a CURVE port

    def refused() -> Samples | None:
        samples = scrape(curve_broker)
        auth = value(samples, "mc0_handshakes_refused_total", reason="auth") or 0
        # A plaintext client on a CURVE port ends as "protocol" or, when it hangs up first, "other".
        broken = sum(value(samples, "mc0_handshakes_refused_total", reason=reason) or 0
                     for reason in ("protocol", "other"))
        return samples if auth >= 1 and broken >= 1 else None

    assert eventually(refused), f"not counted: {scrape(curve_broker).get('mc0_handshakes_refused_total')}"


def test_metrics_in_the_openmetrics_format_when_asked(broker: Broker) -> None:
    status, headers, body = get(broker, "/metrics", headers={"Accept": "application/openmetrics-text"})
    assert status == 200
    assert headers["Content-Type"].startswith("application/openmetrics-text")
    assert body.rstrip().endswith(b"# EOF")


# ------------------------------------------------------------------------------------------------- health


def test_healthz_and_readyz_answer_ok(broker: Broker) -> None:
    assert get_json(broker, "/healthz") == {"status": "ok"}
    assert get_json(broker, "/readyz") == {"status": "ready"}


def test_healthz_reports_a_stalled_loop(broker: Broker, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(monitoring_http, "LOOP_TIMEOUT", 0.3)
    loop = broker.hub.loop
    assert loop is not None
    loop.call_soon_threadsafe(time.sleep, 1.5)  # a loop that does not come back
    status, _, body = get(broker, "/healthz")
    assert status == 503
    assert json.loads(body)["reason"] == "the broker's loop has not answered for 0.3 s"
    time.sleep(1.5)
    assert get(broker, "/healthz")[0] == 200


def test_healthz_reports_a_failed_store(tmp_path: Path) -> None:
    # A broker whose store failed stops at once: its monitor is driven here by hand to see the answer of
    # the moments in between, and before the broker serves.
    monitor = monitoring_http.Monitor("127.0.0.1", 0, topic_labels=0)
    try:
        assert monitor.health(ready=False) == (200, {"status": "starting"})
        code, document = monitor.health(ready=True)
        assert code == 503
        assert document["status"] == "starting"

        async def serve() -> tuple[int, dict]:
            hub = Hub(Engine())
            monitor.attach(_FakeBroker(hub))  # type: ignore[arg-type]
            hub.fail(OSError("fsync failed: Input/output error"))
            return await asyncio.to_thread(monitor.health, False)

        code, document = asyncio.run(serve())
        assert code == 503
        assert document == {"status": "failing", "reason": "OSError: fsync failed: Input/output error"}
    finally:
        monitor.close()
    assert monitor.health(ready=False)[0] == 503  # closed: stopping


class _FakeBroker:
    def __init__(self, hub: Hub) -> None:
        self.hub = hub


# -------------------------------------------------------------------------------------------------- JSON


def test_api_stats_is_what_stats_answers(start_broker: BrokerFactory, dealer: DealerFactory) -> None:
    broker = start_broker(topics=(STRONG,))
    peer = dealer(broker.endpoint)
    peer.connect()
    peer.sub("orders.x", "plain")
    for n in range(4):
        peer.put("orders.x", f"m{n}")
    peer.put("plain", "p")
    assert len([reply for reply in peer.drain(0.3) if reply.verb == b"MESSAGE"]) == 5
    time.sleep(monitoring_http.SNAPSHOT_MAX_AGE)
    over_http = get_json(broker, "/api/stats")
    over_mc0 = peer.stats()
    assert over_http["topics"] == over_mc0["topics"]
    assert over_http["connections"] == over_mc0["connections"]
    assert over_http["limits"].keys() == over_mc0["limits"].keys() == {"descriptors", "topics", "input"}
    assert over_http["limits"]["topics"] == over_mc0["limits"]["topics"]
    # STATS itself is a command, read and answered after the snapshot was taken.
    itself = {"commands", "bytes_in", "bytes_out"}
    for name, door in over_mc0["doors"].items():
        assert {key: over_http["doors"][name][key] for key in door if key not in itself} == {
            key: count for key, count in door.items() if key not in itself}


def test_api_topics_sorts_filters_and_pages(start_broker: BrokerFactory) -> None:
    broker = start_broker()
    with Client(broker.endpoint, curve=False) as client:
        for topic, count in (("jobs.a", 3), ("jobs.b", 9), ("logs", 1)):
            publish(client, topic, count)
    eventually(lambda: len(get_json(broker, "/api/topics")) == 3)
    assert list(get_json(broker, "/api/topics?sort=traffic")) == ["jobs.b", "jobs.a", "logs"]
    assert list(get_json(broker, "/api/topics?match=jobs&limit=1&offset=1")) == ["jobs.b"]
    assert get_json(broker, "/api/topics")["jobs.b"]["messages_in"] == 9
    status, _, body = get(broker, "/api/topics?sort=size")
    assert status == 400
    assert b"sort must be one of" in body


def test_api_topic_page(start_broker: BrokerFactory) -> None:
    rule = TopicRule("audit", TopicSpec(persistence=Persistence.PERSISTENT, sync=Sync.WEAK,
                                        retention_seconds=3600))
    broker = start_broker(topics=(rule,))
    with Client(broker.endpoint, curve=False) as client:
        client.subscribe("audit")
        publish(client, "audit", 6)
        page = get_json(broker, "/api/topics/audit")
        assert page["name"] == "audit"
        assert (page["persistence"], page["sync"], page["delivery"]) == ("persistent", "weak", "broadcast")
        assert page["retention"] == {"bytes": None, "seconds": 3600}
        assert (page["first_id"], page["last_id"], page["stored"]) == (1, 6, 6)
        (subscription,) = page["subscriptions"]
        assert subscription["door"] == "mc0"
    status, _, body = get(broker, "/api/topics/nowhere")
    assert status == 404
    assert json.loads(body) == {"error": "no topic 'nowhere'"}


def test_overview_has_what_the_dashboard_draws(start_broker: BrokerFactory) -> None:
    broker = start_broker()
    with Client(broker.endpoint, curve=False) as client:
        publish(client, "news", 3)
    overview = eventually(lambda: (view := get_json(broker, "/api/overview"))["totals"]["messages_in"]
                          and view)
    assert overview["totals"]["messages_in"] == 3
    assert overview["topics"][0]["name"] == "news"
    assert set(overview["doors"]) == {"mc0", "sexp", "msgq", "rstreams", "lumberjack"}
    assert {"turn_seconds", "commit_messages", "fsync_seconds"} <= set(overview["histograms"])
    assert overview["broker"]["endpoint"] == broker.endpoint
    assert overview["snapshot"]["slices"] >= 1


# ---------------------------------------------------------------------------------------- the dashboard


def test_dashboard_files_are_served_with_a_strict_policy(broker: Broker) -> None:
    status, headers, body = get(broker, "/")
    assert status == 200
    assert headers["Content-Type"] == "text/html; charset=utf-8"
    assert "default-src 'self'" in headers["Content-Security-Policy"]
    assert b"<script src=\"/static/dashboard.js\"" in body
    for name in ("dashboard.js", "dashboard.css"):
        status, _, data = get(broker, f"/static/{name}")
        assert status == 200
        assert data
    assert get(broker, "/static/../http.py")[0] == 404
    assert get(broker, "/nothing-here")[0] == 404


# ---------------------------------------------------------------------------------------------- refusals


def test_the_endpoint_is_read_only(broker: Broker) -> None:
    status, headers, _ = get(broker, "/api/topics", method="POST")
    assert status == 405
    assert headers["Allow"] == "GET, HEAD"
    status, headers, body = get(broker, "/healthz", method="HEAD")
    assert status == 200
    assert body == b""
    assert int(headers["Content-Length"]) > 0


def test_a_foreign_host_name_is_refused_on_loopback(broker: Broker) -> None:
    assert get(broker, "/api/stats", headers={"Host": "attacker.example:8222"})[0] == 403
    assert get(broker, "/healthz", headers={"Host": "localhost:8222"})[0] == 200


def test_requests_beyond_the_bound_are_answered_503(broker: Broker) -> None:
    assert broker.http_address is not None
    idle = [socket.create_connection(broker.http_address) for _ in range(monitoring_http.MAX_REQUESTS)]
    try:
        time.sleep(0.2)  # each is accepted and holds a handler waiting for its request line
        status, headers, _ = get(broker, "/healthz")
        assert status == 503
        assert headers["Retry-After"] == "1"
    finally:
        for connection in idle:
            connection.close()
    assert eventually(lambda: get(broker, "/healthz")[0] == 200)


# ------------------------------------------------------------------------------------------------- ports


def test_the_default_port_taken_means_a_warning_and_no_endpoint(
    start_broker: BrokerFactory, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        monkeypatch.setattr(broker_config, "DEFAULT_HTTP", f"127.0.0.1:{port}")
        with caplog.at_level(logging.WARNING, logger="mc0.monitoring"):
            broker = start_broker(http=None)
        assert broker.http_address is None
        warnings = [record.getMessage() for record in caplog.records if record.name == "mc0.monitoring"]
        assert warnings == [f"monitoring endpoint on 127.0.0.1:{port}: Address already in use; running "
                            "without it (choose another with --http HOST:PORT, or off)"]


def test_an_explicit_port_taken_stops_the_start(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        runner = BrokerThread(BrokerConfig(bind="tcp://127.0.0.1:*", curve=False, data_dir=tmp_path,
                                           **{**FREE_GATEWAY_PORTS, "http": f"127.0.0.1:{port}"}))
        with pytest.raises(RuntimeError, match="stopped before it was ready"):
            runner.start()
    assert str(runner.error) == f"[Errno 98] monitoring endpoint on 127.0.0.1:{port}: Address already in use"


def test_off_means_no_endpoint(start_broker: BrokerFactory) -> None:
    assert start_broker(http="off").http_address is None


# --------------------------------------------------------------------------------------------------- docs

DOCS = Path(__file__).resolve().parents[2] / "docs" / "monitoring.md"


def test_the_docs_toml_block_is_a_configuration(tmp_path: Path) -> None:
    blocks = re.findall(r"```toml\n(.*?)```", DOCS.read_text(), flags=re.S)
    assert blocks
    for number, block in enumerate(blocks):
        path = tmp_path / f"block{number}.toml"
        path.write_text(block, encoding="utf-8")
        loaded = broker_config.load(path)
        assert loaded.http_address == ("0.0.0.0", 8222)
        assert loaded.http_topic_labels == 20


def test_every_metric_is_documented_and_every_documented_metric_exists(
    start_broker: BrokerFactory, dealer: DealerFactory
) -> None:
    broker = start_broker(topics=(STRONG,))
    reader = dealer(broker.endpoint)
    reader.connect()
    reader.ok("SUB", "CREDIT", "1", "ACKS", "explicit", "", "orders.docs")
    with Client(broker.endpoint, curve=False) as client:
        publish(client, "orders.docs", 3)
    samples = scrape_until(broker, "mc0_topic_consumer_lag_messages", 2, topic="orders.docs")
    assert samples["mc0_subscription_lag_messages"], "no lagging subscription showed"
    exposed = {name.removesuffix("_bucket").removesuffix("_count").removesuffix("_sum")
               for name in samples if name.startswith("mc0_")}
    exposed = {name.removesuffix("_created") for name in exposed}
    documented = set(re.findall(r"^\| `(mc0_[a-z0-9_]+)`", DOCS.read_text(), flags=re.M))
    # A cluster member's metrics: only in a cluster (tests/cluster/test_cluster_monitoring.py checks them).
    assert exposed == {name for name in documented if not name.startswith("mc0_cluster_")}
