"""The log identity on the wire (docs/mc0.md, "INCARNATION"; docs/storage.md, "Log identity"): reported by
FETCH and by the OK to a SUB, stable across restarts, new for a recreated log; and the connector's resume
after a reconnect, which must not silently skip what a changed log holds under ids it has seen already.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from conftest import free_endpoint

from broker.store import files as files_module
from broker.store.files import LOCK_FILE, directory_name
from broker.topics import Persistence, Sync, TopicRule, TopicSpec
from connector import Client

if TYPE_CHECKING:
    from conftest import BrokerFactory

    from broker.server import Broker

pytestmark = pytest.mark.timeout(60)

RULES = (
    TopicRule("weak.*", TopicSpec(persistence=Persistence.PERSISTENT, sync=Sync.WEAK)),
    TopicRule("*", TopicSpec(persistence=Persistence.PERSISTENT)),
)


def restart(broker: Broker, start_broker: BrokerFactory, data_dir: Path, port: str) -> Broker:
    broker.stop()
    deadline = time.monotonic() + 10
    lock = data_dir / LOCK_FILE
    while lock.exists() and lock.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)  # the lock file is emptied by the clean stop
    return start_broker(topics=RULES, data_dir=data_dir, bind=port, heartbeat_tick=0.05)


def receive(client: Client, count: int) -> list[tuple[int | None, bytes]]:
    got = []
    for _ in range(count):
        message = client.receive(timeout=10)
        assert message is not None, f"only {got} arrived"
        got.append((message.id, message.body))
    return got


def test_fetch_and_sub_report_the_log_identity_and_a_restart_keeps_it(
    start_broker: BrokerFactory, tmp_path: Path
) -> None:
    port = free_endpoint()
    broker = start_broker(topics=RULES, data_dir=tmp_path / "data", bind=port)
    with Client(broker.endpoint, curve=False) as client:
        client.publish("li.a", "one", confirm=True)
        before = client.fetch("li.a").incarnation
        client.subscribe("li.a")
        assert client._core.incarnations == {"li.a": before}
    assert len(before) == 32
    again = restart(broker, start_broker, tmp_path / "data", port)
    with Client(again.endpoint, curve=False) as client:
        assert client.fetch("li.a").incarnation == before
        assert client.fetch("li.none", max_messages=0).incarnation == "-", "no log yet: no identity"


def test_a_client_resuming_on_a_recreated_log_reads_it_from_its_beginning_and_says_so(
    start_broker: BrokerFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    port = free_endpoint()
    data_dir = tmp_path / "data"
    broker = start_broker(topics=RULES, data_dir=data_dir, bind=port, heartbeat_tick=0.05)
    with Client(broker.endpoint, curve=False, ttl=500, timeout=10) as reader:
        reader.subscribe("li.b")
        with Client(broker.endpoint, curve=False) as writer:
            for n in range(5):
                writer.publish("li.b", f"old {n}", confirm=True)
        assert [message_id for message_id, _ in receive(reader, 5)] == [1, 2, 3, 4, 5]
        old = reader._core.incarnations["li.b"]
        broker.stop()
        time.sleep(0.3)
        shutil.rmtree(data_dir / directory_name(b"li.b"))  # the log is lost while the broker is down
        again = start_broker(topics=RULES, data_dir=data_dir, bind=port, heartbeat_tick=0.05)
        with Client(again.endpoint, curve=False) as writer:
            for n in range(3):
                writer.publish("li.b", f"new {n}", confirm=True)
        # The reader reconnects on its own (TTL 0.5 s) and resumes: ids 1..3 are below what it saw (5), yet
        # they are new messages of a new log, and it gets them.
        assert receive(reader, 3) == [(1, b"new 0"), (2, b"new 1"), (3, b"new 2")]
        new = reader._core.incarnations["li.b"]
        assert reader._core.log_changes == [("li.b", old, new)]
    assert new != old
    assert any("another one than the one read before" in record.message for record in caplog.records)


def test_a_client_resuming_on_a_weak_log_cut_back_by_a_machine_restart_goes_on_where_they_part(
    start_broker: BrokerFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A weak topic hands messages out before they are fsynced. If the machine goes down, the log comes back
    shorter, and new messages get ids the reader already saw. The broker knows (an unclean stop, another
    boot): a successor incarnation, and the reader resumes at the first id the two logs do not share."""
    port = free_endpoint()
    data_dir = tmp_path / "data"
    boot = tmp_path / "boot_id"
    boot.write_text("first-boot\n")
    monkeypatch.setattr(files_module, "BOOT_ID_FILE", boot)
    broker = start_broker(topics=RULES, data_dir=data_dir, bind=port, heartbeat_tick=0.05)
    with Client(broker.endpoint, curve=False, ttl=500, timeout=10) as reader:
        reader.subscribe("weak.c")
        with Client(broker.endpoint, curve=False) as writer:
            for n in range(10):
                writer.publish("weak.c", f"before {n}", confirm=True)
        assert [message_id for message_id, _ in receive(reader, 10)] == list(range(1, 11))
        broker.stop()
        time.sleep(0.3)
        # What the machine going down would have left: the last 4 records never reached the disk, and the
        # broker never stopped cleanly (the lock file still says "in use since the first boot").
        segment = next((data_dir / "weak.c").glob("*.log"))
        data = segment.read_bytes()
        record = (len(data) - 16) // 10
        segment.write_bytes(data[: len(data) - 4 * record])
        (data_dir / LOCK_FILE).write_text("boot first-boot\n")
        boot.write_text("second-boot\n")
        again = start_broker(topics=RULES, data_dir=data_dir, bind=port, heartbeat_tick=0.05)
        with Client(again.endpoint, curve=False) as writer:
            for n in range(6):
                writer.publish("weak.c", f"after {n}", confirm=True)
        # It had seen up to id 10; the log kept 1..6 and gave ids 7..12 to new messages: it reads those.
        assert receive(reader, 6) == [(7 + n, f"after {n}".encode()) for n in range(6)]
        assert len(reader._core.log_changes) == 1
