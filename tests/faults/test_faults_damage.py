"""A damaged sealed segment in a broker process's data directory: the broker starts, FETCH over the bad
record fails with an error naming topic, segment and ids, a subscriber replaying the topic gets every other
message, STATS shows the topic as damaged, other topics serve as usual. Stopped, ``mc0 verify`` names the
damage and ``mc0 repair`` mends it; restarted, every good record reads and the lost ids are skipped.

A data directory that cannot work is refused at start in one line; a folder in it that is not a topic is
skipped with a warning.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import faults
from broker.engine import Message
from broker.store.files import FileStore, directory_name
from broker.topics import Persistence, Sync, TopicSpec
from connector import ConnectorError

SPEC = TopicSpec(persistence=Persistence.PERSISTENT, sync=Sync.STRONG, segment_bytes=4096)
RULES = '[[topics]]\npattern = "d.*"\npersistence = "persistent"\nsegment_bytes = 4096\n'
COUNT = 200


@pytest.fixture
def data_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="mc0-damage-") as scratch:
        yield Path(scratch) / "data"


def written(data_dir: Path) -> int:
    """Two topics of COUNT messages; a byte of the third segment of d.bad flipped. Returns that segment's
    first id."""
    store = FileStore(data_dir)
    for name in (b"d.bad", b"d.good"):
        log = store.open(name, SPEC)
        for n in range(1, COUNT + 1):
            log.append(Message(name, n, b"%s %03d " % (name, n) * 4, {}, 1_700_000_000_000))
            log.commit()
    store.close()
    third = sorted((data_dir / directory_name(b"d.bad")).glob("*.log"))[2]
    data = bytearray(third.read_bytes())
    data[16 + 16 + 3] ^= 0xFF  # the payload of its first record
    third.write_bytes(data)
    return int(third.stem)


def mc0(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", "from connector.cli import main; main()", *arguments],
                          capture_output=True, text=True, timeout=faults.PATIENCE, check=False)


@pytest.mark.timeout(120)
def test_a_damaged_sealed_segment_fails_its_range_only_and_repair_mends_it(data_dir: Path) -> None:
    first_bad = written(data_dir)
    with faults.broker(data_dir=data_dir, topics=RULES) as running, running.client() as client:
        with pytest.raises(ConnectorError, match=rf"topic 'd\.bad': ids {first_bad}\.\.\d+ are unreadable: "
                                                 rf"segment {first_bad:020d}\.log is damaged"):
            client.fetch("d.bad", first_bad)
        good = client.fetch("d.bad", 1, max_messages=1000)
        assert [item.id for item in good.messages] == list(range(1, first_bad))  # up to the damage
        damaged = client.topics(prefix="d.bad")["d.bad"]["damaged"]
        assert damaged[0]["first_id"] == first_bad
        last_bad = damaged[0]["last_id"]
        client.subscribe("d.bad", replay="beginning")
        ids = []
        while len(ids) < COUNT - (last_bad - first_bad + 1):
            message = client.receive(timeout=faults.PATIENCE)
            assert message is not None
            ids.append(message.id)
        assert ids == [n for n in range(1, COUNT + 1) if not first_bad <= n <= last_bad]
        assert len(client.fetch("d.good", 1, max_messages=1000).messages) == COUNT
        faults.answers(running)
        refused = mc0("verify", "--data-dir", str(data_dir))
        assert refused.returncode == 1
        assert "a broker is using this data directory" in refused.stderr
        faults.stopped_cleanly(running)
    checked = mc0("verify", "--data-dir", str(data_dir))
    assert checked.returncode == 1
    assert f"{first_bad:020d}.log: ids {first_bad}..{first_bad} unreadable" in checked.stdout
    repaired = mc0("repair", "--data-dir", str(data_dir))
    assert repaired.returncode == 0, repaired.stderr
    assert mc0("verify", "--data-dir", str(data_dir)).returncode == 0
    with faults.broker(data_dir=data_dir, topics=RULES) as running, running.client() as client:
        assert "damaged" not in client.topics(prefix="d.bad")["d.bad"]
        ids, start = [], 1
        while batch := client.fetch("d.bad", start, max_messages=1000).messages:
            ids += [item.id for item in batch]
            start = batch[-1].id + 1
        assert ids == [n for n in range(1, COUNT + 1) if n != first_bad]
        faults.answers(running)


@pytest.mark.timeout(60)
def test_a_data_directory_that_cannot_work_is_refused_in_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    # The monitoring endpoint on: nothing listens, not even it, before the data directory is found wanting.
    started = mc0("broker", "--no-curve", "--bind", "tcp://127.0.0.1:*", "--http", "127.0.0.1:0",
                  "--sexp", "off", "--msgq", "off", "--rstreams", "off", "--lumberjack", "off",
                  "--data-dir", str(blocker / "data"))
    assert started.returncode == 1
    lines = [line for line in started.stderr.splitlines() if "CURVE" not in line]
    assert lines == [f"Error: store: data directory {blocker / 'data'} cannot be created: {blocker} is a "
                     "file, not a directory"]


@pytest.mark.timeout(60)
def test_a_folder_that_is_no_topic_is_skipped_with_a_warning(data_dir: Path) -> None:
    written(data_dir)
    (data_dir / "keys").mkdir()
    (data_dir / "keys" / "client.key_secret").write_text("someone put the keys here")
    with faults.broker(data_dir=data_dir, topics=RULES) as running:
        faults.answers(running)
        assert any("keys: skipped, not a topic directory" in line for line in running.log)
        with running.client() as client:
            assert len(client.fetch("d.good", 1, max_messages=1000).messages) == COUNT
    assert os.path.isdir(data_dir / "keys")
