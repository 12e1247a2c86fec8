"""``mc0 verify`` and ``mc0 repair`` on a data directory written by the store and then damaged: verify names
the topic, segment and ids and exits 1; repair quarantines the damaged segment, writes every good record back
and records the lost ids, after which verify is clean and the broker's log reads everything else, skipping
the lost ids. Both refuse, in one line, a data directory a broker holds.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest
from click.testing import CliRunner

from broker.engine import Message
from broker.store.files import FileStore, directory_name
from broker.topics import Persistence, Sync, TopicSpec
from connector.cli import main

TOPIC = b"orders/eu"
SPEC = TopicSpec(persistence=Persistence.PERSISTENT, sync=Sync.STRONG, segment_bytes=2048)
NOW = 1_700_000_000_000


@pytest.fixture(autouse=True)
def no_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "fsync", lambda fd: None)


def write(root: Path, count: int, topic: bytes = TOPIC) -> None:
    store = FileStore(root, index_interval=256)
    log = store.open(topic, SPEC)
    for n in range(1, count + 1):
        log.append(Message(topic, n, b"body %03d " % n * 8, {}, NOW))
        log.commit()
    store.close()


def segments(root: Path, topic: bytes = TOPIC) -> list[Path]:
    return sorted((root / directory_name(topic)).glob("*.log"))


def record_starts(path: Path) -> list[int]:
    data, starts, position = path.read_bytes(), [], 16
    while position < len(data):
        starts.append(position)
        position += 16 + struct.unpack_from(">I", data, position)[0]
    return starts


def read_all(log: object) -> list[int]:
    """Every id a reader gets, reading on from where each read stopped (a read stops before a hole)."""
    ids: list[int] = []
    start = 1
    while batch := log.read(start, 1000, 1 << 30):  # type: ignore[attr-defined]
        ids += [message.id for message in batch]
        start = batch[-1].id + 1
    return ids


def run(*arguments: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(arguments))
    return result.exit_code, result.output


def test_a_clean_directory_verifies(tmp_path: Path) -> None:
    write(tmp_path, 60)
    code, output = run("verify", "--data-dir", str(tmp_path))
    assert code == 0, output
    assert output.strip().endswith("records read: no damage")
    assert "1 topics," in output
    assert " 60 records" in output


def test_verify_names_the_damage_and_repair_keeps_every_good_record(tmp_path: Path) -> None:
    write(tmp_path, 120)
    victim = segments(tmp_path)[1]
    starts = record_starts(victim)
    base = int(victim.stem)
    bad = base + 3  # the fourth record of the segment: records before and after it are good
    data = bytearray(victim.read_bytes())
    data[starts[3] + 20] ^= 0xFF
    victim.write_bytes(data)

    code, output = run("verify", "--data-dir", str(tmp_path))
    assert code == 1
    assert f"topic 'orders/eu': {victim.name}: ids {bad}..{bad} unreadable" in output
    assert f"byte {starts[3]}: CRC mismatch in record {bad}" in output

    code, output = run("repair", "--data-dir", str(tmp_path))
    assert code == 0, output
    assert f"repaired: {directory_name(TOPIC)}: {victim.name} quarantined in .quarantine/" in output
    quarantined = list((tmp_path / ".quarantine" / directory_name(TOPIC)).glob("*/*.log"))
    assert [path.name for path in quarantined] == [victim.name]
    meta = json.loads((tmp_path / directory_name(TOPIC) / "topic.json").read_text())
    assert meta["lost"] == [[bad, bad]]

    code, output = run("verify", "--data-dir", str(tmp_path))
    assert code == 0, output

    store = FileStore(tmp_path)
    log = store.open(TOPIC, SPEC)
    assert read_all(log) == [n for n in range(1, 121) if n != bad]
    assert log.damaged == []
    log.append(Message(TOPIC, 121, b"after", {}, NOW))  # the log goes on where it was
    log.commit()
    store.close()


def test_a_sealed_segment_with_a_broken_header_loses_only_what_cannot_be_found(tmp_path: Path) -> None:
    write(tmp_path, 120)
    victim = segments(tmp_path)[2]
    data = bytearray(victim.read_bytes())
    data[0:8] = b"garbage!"
    victim.write_bytes(data)
    code, output = run("verify", "--data-dir", str(tmp_path))
    assert code == 1
    assert "not an mc0 segment" in output
    code, output = run("repair", "--data-dir", str(tmp_path))
    assert code == 0, output
    store = FileStore(tmp_path)
    ids = read_all(store.open(TOPIC, SPEC))
    assert ids == list(range(1, 121)), "records are found again by their ids: only the header was bad"
    store.close()


def test_both_refuse_a_directory_a_broker_holds(tmp_path: Path) -> None:
    write(tmp_path, 5)
    holder = FileStore(tmp_path)
    holder.open(TOPIC, SPEC)
    for command in ("verify", "repair"):
        code, output = run(command, "--data-dir", str(tmp_path))
        assert code == 1
        lines = output.strip().splitlines()
        assert lines == [f"Error: store: {tmp_path}: a broker is using this data directory: stop it first "
                         "(mc0 verify and mc0 repair work on a data directory offline)"]
    holder.close()


def test_a_missing_directory_is_one_line(tmp_path: Path) -> None:
    code, output = run("verify", "--data-dir", str(tmp_path / "nowhere"))
    assert code == 1
    assert output.strip() == f"Error: store: {tmp_path / 'nowhere'}: no such data directory"
