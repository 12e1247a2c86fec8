"""The Lumberjack door on real sockets: Beats-style batches (v2, compressed, sequence restarting per batch),
a v1 writer streaming D frames after one window, the ack rule (highest sequence, never the count), acks only
after the commit, keepalives (v2 only), malformed input closing the connection, the topic chosen by a field,
TLS with and without client certificates, a real third-party client (timbersnake, from PyPI), and the events
readable over every other door and replayable from the log.

The raw writer here builds frames with a few lines of its own (:func:`frame`), not the codec under test.
"""

from __future__ import annotations

import asyncio
import json
import signal
import ssl
import struct
import subprocess
import sys
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import trustme
from click.testing import CliRunner
from conftest import RawStream
from timbersnake.client import Client as TimbersnakeClient

from broker.server import Broker
from broker.topics import Persistence, Sync, TopicRule, TopicSpec
from connector import Client, ConnectorError
from connector.cli import main
from connector.lumberjack_client import LumberjackClient
from connector.msgq_client import MsgqClient
from connector.rstreams_client import RStreamsClient
from connector.sexp_client import SexpClient

WAIT = 5.0
QUIET = 0.3
RULES = (TopicRule("logs*", TopicSpec(persistence=Persistence.PERSISTENT, sync=Sync.STRONG)),)


def window(version: bytes, size: int) -> bytes:
    return version + b"W" + struct.pack(">I", size)


def json_frame(seq: int, event: dict) -> bytes:
    data = json.dumps(event).encode()
    return b"2J" + struct.pack(">II", seq, len(data)) + data


def data_frame(seq: int, event: dict[str, str]) -> bytes:
    out = b"1D" + struct.pack(">II", seq, len(event))
    for key, value in event.items():
        out += struct.pack(">I", len(key)) + key.encode() + struct.pack(">I", len(value)) + value.encode()
    return out


def compressed(version: bytes, frames: bytes) -> bytes:
    data = zlib.compress(frames)
    return version + b"C" + struct.pack(">I", len(data)) + data


class Raw(RawStream):
    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def ack(self, timeout: float = WAIT) -> tuple[bytes, int] | None:
        """The next ack frame as (version byte, sequence), or None if nothing came."""
        if not self._fill(6, time.monotonic() + timeout):
            return None
        frame_bytes, self.buffer = self.buffer[:6], self.buffer[6:]
        assert frame_bytes[1:2] == b"A", frame_bytes
        return frame_bytes[:1], struct.unpack(">I", frame_bytes[2:])[0]


@pytest.fixture
def broker(start_broker: Callable[..., Broker]) -> Broker:
    return start_broker(topics=RULES)


@pytest.fixture
def raw(broker: Broker) -> Iterator[Callable[[], Raw]]:
    opened: list[Raw] = []

    def open_raw() -> Raw:
        peer = Raw(broker.gateway_address("lumberjack"), WAIT)
        opened.append(peer)
        return peer

    yield open_raw
    for peer in opened:
        peer.close()


def stored(broker: Broker, topic: str = "logs", count: int | None = None) -> list[dict]:
    """Every event in the topic's log, read back over mc0 from the beginning."""
    with Client(broker.endpoint, curve=False, timeout=WAIT) as client:
        client.subscribe(topic, replay="beginning")
        events = []
        while (count is None or len(events) < count) and (message := client.receive(timeout=QUIET)):
            events.append(json.loads(message.body))
    return events


# ------------------------------------------------------------------------------------------------ the rule


def test_a_beats_batch_is_acked_with_its_highest_sequence_once_stored(broker: Broker, raw: Callable) -> None:
    peer = raw()
    events = [{"message": f"line {n}", "host": "web1"} for n in range(1, 4)]
    peer.send(window(b"2", 3) + compressed(b"2", b"".join(json_frame(n, e) for n, e in enumerate(events, 1))))
    assert peer.ack() == (b"2", 3)
    assert stored(broker) == events, "every acked event is in the log, as its JSON object"
    # The next batch restarts at 1, uncompressed this time.
    peer.send(window(b"2", 2) + json_frame(1, {"message": "a"}) + json_frame(2, {"message": "b"}))
    assert peer.ack() == (b"2", 2)
    assert [e["message"] for e in stored(broker)] == ["line 1", "line 2", "line 3", "a", "b"]


def test_continuous_sequences_are_acked_by_sequence_not_by_count(broker: Broker, raw: Callable) -> None:
    peer = raw()  # logstash-forwarder: v1, one window per batch, sequence numbers continue across batches
    peer.send(window(b"1", 2) + data_frame(1, {"line": "a"}) + data_frame(2, {"line": "b"}))
    assert peer.ack() == (b"1", 2)
    peer.send(window(b"1", 2) + data_frame(3, {"line": "c"}) + data_frame(4, {"line": "d"}))
    assert peer.ack() == (b"1", 4), "the highest sequence (4), not the count of the batch (2)"


def test_a_v1_writer_streaming_d_frames_after_one_window(broker: Broker, raw: Callable) -> None:
    peer = raw()
    peer.send(window(b"1", 5))
    acks = []
    for n in range(1, 21):
        peer.send(data_frame(n, {"line": str(n)}))
        if n % 5 == 0:
            acks.append(peer.ack())
    assert acks == [(b"1", 5), (b"1", 10), (b"1", 15), (b"1", 20)]
    assert len(stored(broker)) == 20


def test_window_zero_is_acked_zero(raw: Callable) -> None:
    peer = raw()
    peer.send(window(b"2", 0))
    assert peer.ack() == (b"2", 0)


def test_no_ack_before_the_window_is_full_but_v2_gets_keepalives(start_broker: Callable[..., Broker]) -> None:
    broker = start_broker(topics=RULES)
    peer = Raw(broker.gateway_address("lumberjack"), WAIT)
    peer.send(window(b"2", 3) + json_frame(1, {"m": 1}))
    started = time.monotonic()
    keepalive = peer.ack(timeout=8.0)
    assert keepalive == (b"2", 0), "a v2 writer waiting on its batch hears ACK 0"
    assert time.monotonic() - started <= 7.0
    peer.send(json_frame(2, {"m": 2}) + json_frame(3, {"m": 3}))
    while (ack := peer.ack()) == (b"2", 0):
        pass
    assert ack == (b"2", 3)
    peer.close()


def test_v1_writers_never_get_keepalives(broker: Broker, raw: Callable) -> None:
    peer = raw()
    peer.send(window(b"1", 3) + data_frame(1, {"m": "1"}))
    assert peer.ack(timeout=6.5) is None, "no ACK 0 for a v1 writer, however long the batch waits"


@pytest.mark.parametrize(
    "garbage",
    [b"3W\x00\x00\x00\x01", b"2X\x00\x00\x00\x01", b"2C\x00\x00\x00\x04abcd",
     b"2J\x00\x00\x00\x01\x00\x00\x00\x02[]", window(b"2", 1 << 30)],
    ids=["bad version", "unknown type", "bad zlib", "json not an object", "window over the limit"],
)
def test_malformed_input_closes_the_connection(broker: Broker, raw: Callable, garbage: bytes) -> None:
    peer = raw()
    peer.send(window(b"2", 1) + json_frame(1, {"m": "kept"}))
    assert peer.ack() == (b"2", 1)
    peer.send(garbage)
    assert peer.closed_within(WAIT)
    assert [e["m"] for e in stored(broker)] == ["kept"], "what was acked stays; nothing else was stored"


def test_a_zip_bomb_closes_the_connection_without_exhausting_memory(broker: Broker, raw: Callable) -> None:
    squeezer = zlib.compressobj(9)
    chunk = bytes(1 << 20)
    bomb = b"".join(squeezer.compress(chunk) for _ in range(256)) + squeezer.flush()  # 256 MiB of zeros
    assert len(bomb) < 1 << 20
    peer = raw()
    peer.send(window(b"2", 1) + b"2C" + struct.pack(">I", len(bomb)) + bomb)
    assert peer.closed_within(WAIT)
    assert broker.hub.stats()["doors"]["lumberjack"]["errors"] == 1


# ---------------------------------------------------------------------------------------- topics and doors


def test_the_topic_can_come_from_a_field(start_broker: Callable[..., Broker]) -> None:
    broker = start_broker(topics=RULES, lumberjack_topic_field="fields.topic")
    peer = Raw(broker.gateway_address("lumberjack"), WAIT)
    peer.send(window(b"2", 2) + json_frame(1, {"message": "x", "fields": {"topic": "logs.app"}})
              + json_frame(2, {"message": "y"}))
    assert peer.ack() == (b"2", 2)
    assert [e["message"] for e in stored(broker, "logs.app")] == ["x"]
    assert [e["message"] for e in stored(broker, "logs")] == ["y"]
    peer.close()


def test_shipped_events_are_read_over_the_other_doors_and_replayed(broker: Broker) -> None:
    with SexpClient(*broker.gateway_address("sexp")) as sexp, \
            MsgqClient(*broker.gateway_address("msgq")) as msgq, \
            RStreamsClient(*broker.gateway_address("rstreams")) as rstreams:
        sexp.subscribe("logs")
        msgq.subscribe("logs")
        rstreams.subscribe("logs", demand=10, ids=True)
        with LumberjackClient(*broker.gateway_address("lumberjack")) as shipper:
            shipper.send_batch([{"message": "hello"}, {"message": "world"}])
        expected = [(1, "hello"), (2, "world")]
        got = [sexp.receive(timeout=WAIT) for _ in range(2)]
        assert [(m.id, json.loads(m.body)["message"]) for m in got if m] == expected
        sends = [msgq.receive(timeout=WAIT) for _ in range(2)]
        assert [(int(s.extra[b"msgid"]), json.loads(s.msg)["message"]) for s in sends if s] == expected
        elements = [rstreams.receive(timeout=WAIT) for _ in range(2)]
        assert [(e.id, json.loads(e.data)["message"]) for e in elements if e] == expected
    assert [e["message"] for e in stored(broker)] == ["hello", "world"], "and replayed from the log over mc0"


# -------------------------------------------------------------------------------------------------- TLS


@pytest.fixture(scope="module")
def authority() -> trustme.CA:
    return trustme.CA()


def tls_broker(start_broker: Callable[..., Broker], authority: trustme.CA, tmp_path: Path,
               client_certificates: bool) -> Broker:
    server = authority.issue_cert("127.0.0.1", "localhost")
    cert, key, ca = tmp_path / "server.pem", tmp_path / "server.key", tmp_path / "ca.pem"
    server.cert_chain_pems[0].write_to_path(cert)
    server.private_key_pem.write_to_path(key)
    authority.cert_pem.write_to_path(ca)
    return start_broker(topics=RULES, lumberjack_tls_cert=str(cert), lumberjack_tls_key=str(key),
                        lumberjack_tls_client_ca=str(ca) if client_certificates else "")


def test_tls(start_broker: Callable[..., Broker], authority: trustme.CA, tmp_path: Path) -> None:
    broker = tls_broker(start_broker, authority, tmp_path, client_certificates=False)
    context = ssl.create_default_context()
    authority.configure_trust(context)
    address = broker.gateway_address("lumberjack")
    with LumberjackClient(*address, tls=context, server_hostname="localhost") as client:
        client.send_batch([{"message": "secret"}])
    assert [e["message"] for e in stored(broker)] == ["secret"]
    with pytest.raises(ConnectorError, match="TLS"):
        # (the default context does not trust our test CA)
        LumberjackClient(*address, tls=ssl.create_default_context(), server_hostname="localhost")


def test_tls_with_client_certificates(start_broker: Callable[..., Broker], authority: trustme.CA,
                                      tmp_path: Path) -> None:
    broker = tls_broker(start_broker, authority, tmp_path, client_certificates=True)
    address = broker.gateway_address("lumberjack")
    anonymous = ssl.create_default_context()
    authority.configure_trust(anonymous)
    with pytest.raises(ConnectorError), LumberjackClient(*address, tls=anonymous, server_hostname="localhost",
                                                         timeout=2.0) as client:
        client.send_batch([{"message": "nobody"}])
    known = ssl.create_default_context()
    authority.configure_trust(known)
    authority.issue_cert("shipper@example.org").configure_cert(known)
    with LumberjackClient(*address, tls=known, server_hostname="localhost") as client:
        client.send_batch([{"message": "somebody"}])
    assert [e["message"] for e in stored(broker)] == ["somebody"]


# ------------------------------------------------------------------------------------------------ interop


def test_a_third_party_client_timbersnake_v2_compressed(broker: Broker) -> None:
    host, port = broker.gateway_address("lumberjack")
    events = [{"message": "from timbersnake", "n": n} for n in range(3)]  # its window is always 3
    client = TimbersnakeClient(host, port, version=b"2", compression_level=6)
    asyncio.run(asyncio.wait_for(client.send(events), WAIT))
    assert stored(broker) == events


def test_the_cli_ships_lines(broker: Broker) -> None:
    host, port = broker.gateway_address("lumberjack")
    result = CliRunner().invoke(main, ["lumberjack", "ship", "--broker", f"{host}:{port}", "--batch", "2",
                                       "-f", "host=web1"], input="a\nb\nc\n")
    assert result.exit_code == 0, result.output
    assert "shipped 3 event(s)" in result.output
    assert stored(broker) == [{"message": m, "host": "web1"} for m in "abc"]


def ship_process(broker: Broker, *arguments: str) -> subprocess.Popen[bytes]:
    """``mc0 lumberjack ship`` in a process of its own, reading lines from a pipe the test writes to."""
    host, port = broker.gateway_address("lumberjack")
    return subprocess.Popen([sys.executable, "-c", "from connector.cli import main; main()", "lumberjack",
                             "ship", "--broker", f"{host}:{port}", *arguments],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def wait_stored(broker: Broker, count: int) -> list[dict]:
    deadline = time.monotonic() + WAIT
    while len(events := stored(broker)) < count:
        assert time.monotonic() < deadline, f"{len(events)} of {count} events stored"
        time.sleep(0.02)
    return events


def test_ship_streams_lines_as_they_come_like_tail_f(broker: Broker) -> None:
    shipper = ship_process(broker, "--idle", "0.1")
    assert shipper.stdin is not None
    try:
        for n in range(3):
            shipper.stdin.write(b"line %d\n" % n)
            shipper.stdin.flush()
            # Each line is stored while the input is still open: it left after --idle, not at the end.
            assert [e["message"] for e in wait_stored(broker, n + 1)] == [f"line {i}" for i in range(n + 1)]
    finally:
        shipper.stdin.close()
        assert shipper.wait(WAIT) == 0


def test_ship_on_ctrl_c_ships_what_it_read_waits_for_the_ack_and_exits(broker: Broker) -> None:
    shipper = ship_process(broker, "--idle", "1.0", "--batch", "1000")
    assert shipper.stdin is not None
    shipper.stdin.write(b"".join(b"event %d\n" % n for n in range(50)))
    shipper.stdin.flush()
    deadline = time.monotonic() + WAIT
    while not broker.gateways["lumberjack"].connections:  # connected: its Ctrl-C handler is in place
        assert time.monotonic() < deadline, "the shipper never connected"
        time.sleep(0.02)
    time.sleep(0.3)  # read, not yet shipped: the batch is neither full nor idle for a second
    shipper.send_signal(signal.SIGINT)
    _, err = shipper.communicate(timeout=WAIT)
    assert shipper.returncode == 0, err
    assert b"shipped 50 event(s), every one acknowledged (interrupted: what was read is shipped)" in err
    assert [e["message"] for e in stored(broker)] == [f"event {n}" for n in range(50)]


def test_two_batches_in_flight_like_beats_and_the_json_kept_as_sent(broker: Broker, raw: Callable) -> None:
    with LumberjackClient(*broker.gateway_address("lumberjack")) as client:
        shipped = client.send_batches(([{"n": b * 10 + i} for i in range(10)] for b in range(5)), in_flight=2)
    assert shipped == 50
    assert [e["n"] for e in stored(broker)] == list(range(50)), "every batch acked, stored once, in order"
    peer = raw()
    text = '{ "message" : "spaced",  "n": 1 }'
    peer.send(window(b"2", 1) + b"2J" + struct.pack(">II", 1, len(text)) + text.encode())
    assert peer.ack() == (b"2", 1)
    with Client(broker.endpoint, curve=False, timeout=WAIT) as client:
        client.subscribe("logs", replay=51)
        message = client.receive(timeout=WAIT)
    assert message is not None
    assert message.body == text.encode(), "a J frame's JSON is the body as it came, not re-encoded"
