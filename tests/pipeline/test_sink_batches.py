"""How a write task keeps its idempotent batches in flight (``pipeline.sink.publish``): a topic's first batch
is confirmed before the next one goes (the broker takes a stranger's first batch wherever it begins, so a
refused first batch followed by a stored second would make the retry skip the first); after it, several
travel together; and a refused batch fails the task."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field

import pyarrow as pa
import pytest

from connector import ConnectorError
from pipeline import sink, worker


class Confirm(Future[dict[str, str]]):
    """A batch's answer that says when the task waits for it."""

    def __init__(self, events: list[str], sequence: int, refused: bool) -> None:
        super().__init__()
        self.events, self.sequence = events, sequence
        if refused:
            self.set_exception(ConnectorError("not stored: No space left on device"))
        else:
            self.set_result({"COUNT": "0", "DUPLICATES": "0"})

    def result(self, timeout: float | None = None) -> dict[str, str]:
        self.events.append(f"wait {self.sequence}")
        return super().result(timeout)


@dataclass
class Publisher:
    """Stands in for the connector's client: records each batch sent and each answer waited for."""

    refuse: set[int] = field(default_factory=set)
    events: list[str] = field(default_factory=list)
    closed: bool = False

    def publish_batch_later(self, items: object, producer: bytes, sequence: int) -> Confirm:
        self.events.append(f"send {sequence}")
        return Confirm(self.events, sequence, sequence in self.refuse)

    def close(self, timeout: float) -> None:
        self.closed = True


@dataclass
class Connection:
    publisher: Publisher
    request_timeout: float = 5.0

    def client(self) -> Publisher:
        return self.publisher


def rows(count: int) -> Iterator[pa.RecordBatch]:
    yield pa.RecordBatch.from_pydict({"value": pa.array([b"r%d" % n for n in range(count)], pa.binary())})


def settings(publisher: Publisher) -> sink.WriteSettings:
    return sink.WriteSettings(Connection(publisher), "t", topic_column=False, key_column=False,  # type: ignore[arg-type]
                              headers_column=None)


@pytest.fixture(autouse=True)
def no_freezing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker, "settle", lambda: None)  # a Spark worker's gc.freeze: not this process's


def test_a_topics_first_batch_is_confirmed_before_the_next_goes_then_several_travel_together() -> None:
    publisher = Publisher()
    written = sink.publish(settings(publisher), rows(8 * sink.WRITE_BATCH), b"w:1:0")
    assert written.rows == 8 * sink.WRITE_BATCH
    size = sink.WRITE_BATCH
    assert publisher.events[:3] == ["send 0", "wait 0", f"send {size}"]
    sent_before_first_wait = publisher.events.index(f"wait {size}") - 2
    assert sent_before_first_wait == sink.IN_FLIGHT + 1, publisher.events
    assert sorted(e for e in publisher.events if e.startswith("wait")) == sorted(
        f"wait {n * size}" for n in range(8)), "every batch's answer is waited for"
    assert publisher.closed


def test_a_refused_first_batch_fails_the_task_before_anything_else_is_sent() -> None:
    publisher = Publisher(refuse={0})
    with pytest.raises(ConnectorError, match="not stored"):
        sink.publish(settings(publisher), rows(3 * sink.WRITE_BATCH), b"w:1:0")
    assert publisher.events == ["send 0", "wait 0"]
    assert publisher.closed
