"""``python -m bench faults``: what clients can do to a broker, and whether it is still there afterwards.

Each scenario starts a broker in a process of its own (``mc0 broker``, ephemeral loopback ports, a data
directory of its own, and for some a low descriptor limit), does one kind of harm and reports figures; after
each, a normal client publishes and receives through that broker, and the scenario fails if it cannot:

* ``churn``: connect/leave cycles on every door (mc0 clients leave without DISCONNECT and without a TTL); the
  broker's RSS and descriptors after a warm-up and at the end;
* ``fuzz``: random bytes and mutated valid messages on every door;
* ``flood``: bare TCP connections to every door, held open, under a descriptor limit of 256; meanwhile a
  Lumberjack client already connected creates a persistent topic, and the mc0 client connected before
  (dropped when the mc0 port is unbound) is confirmed again once the flood is gone;
* ``creeping``: connections to one TCP door that say almost nothing, slower than the descriptor watch counts,
  until the doors pause: an mc0 client connected before is served all through the pause (it makes a
  persistent topic: the store's reserve), a new mc0 connection is not let in;
* ``topics``: persistent topics well beyond what the descriptor limit would allow open at once;
* ``sexp-body``: a 2 MiB binary body through sexp: the codec's decode time, longest step and peak memory, and
  the longest stall of the broker's loop seen by a client sending NOOPs meanwhile;
* ``stats``: 100,000 topics, then STATS pages: their latency and the loop's longest stall;
* ``budget``: unterminated sexp lines past the input budget (the largest is refused, the memory comes back),
  then nested zip bombs on the Lumberjack door, with the loop's longest stall.

``tests/faults/`` runs the same scenarios in CI with the counts below; ``--soak`` multiplies them.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import re
import resource
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq

from connector import Client
from connector.lumberjack_client import LumberjackClient
from protocol import lumberjack, msgq, rstreams, sexp

DOORS = ("mc0", "sexp", "msgq", "rstreams", "lumberjack")
#: How long a broker may take to start or to answer (a loaded CI machine with two cores is slow).
PATIENCE = 20.0

#: The CI's counts (tests/faults); --soak multiplies them.
CHURN_CYCLES = 10_000
FUZZ_INPUTS = 2_000
STATS_TOPICS = 100_000


# ------------------------------------------------------------------------------------------------ the broker


@dataclass
class BrokerProcess:
    """``mc0 broker`` in a process of its own, with the addresses it printed and what it logged."""

    process: subprocess.Popen[str]
    data_dir: Path
    keys: Path | None = None  # CURVE on: the keys folder the broker made
    endpoint: str = ""
    gateways: dict[str, tuple[str, int]] = field(default_factory=dict)
    log: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def rss(self) -> int:
        """Resident memory, bytes."""
        with open(f"/proc/{self.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def descriptors(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def client(self, **options: Any) -> Client:
        if self.keys is not None:
            return Client(self.endpoint, keys=self.keys, timeout=PATIENCE, **options)
        return Client(self.endpoint, curve=False, timeout=PATIENCE, **options)

    def stop(self) -> int:
        """SIGTERM, and the exit code (SIGKILL after PATIENCE)."""
        if self.alive():
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(PATIENCE)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


def _limit(descriptors: int | None) -> Callable[[], None] | None:
    if descriptors is None:
        return None

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (descriptors, descriptors))

    return apply


@contextlib.contextmanager
def broker(settings: str = "", *, descriptors: int | None = None, data_dir: Path | None = None,
           topics: str = "", curve: bool = False) -> Iterator[BrokerProcess]:
    """A broker on loopback, every door on an ephemeral port, plaintext unless ``curve``; ``settings`` are
    more ``[broker]`` lines, ``topics`` more TOML after them; ``descriptors`` its RLIMIT_NOFILE."""
    with tempfile.TemporaryDirectory(prefix="mc0-faults-") as scratch:
        root = Path(scratch)
        data = data_dir if data_dir is not None else root / "data"
        config = root / "mc0.toml"
        config.write_text(
            "[broker]\n"
            'bind = "tcp://127.0.0.1:*"\n'
            + "".join(f'{door} = "127.0.0.1:0"\n' for door in DOORS[1:])
            + f'data_dir = "{data}"\n'
            + 'http = "off"\n'
            + 'log_level = "INFO"\n'  # the lines saying where each door listens are INFO
            + settings
            + "\n"
            + topics
        )
        # The broker of this checkout, whatever mc0 is installed: the same interpreter and import path.
        command = [sys.executable, "-c", "from connector.cli import main; main()", "broker", "--config",
                   str(config), *(("--keys", str(root / "keys")) if curve else ("--no-curve",))]
        process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, cwd=scratch,
                                   preexec_fn=_limit(descriptors), env=dict(os.environ))
        running = BrokerProcess(process, data, root / "keys" if curve else None)
        try:
            _read_addresses(running)
            yield running
        finally:
            running.stop()


def _read_addresses(running: BrokerProcess) -> None:
    stream = running.process.stderr
    assert stream is not None
    deadline = time.monotonic() + PATIENCE
    while len(running.gateways) < len(DOORS) - 1 or not running.endpoint:
        line = stream.readline()
        if not line or time.monotonic() > deadline:
            raise RuntimeError("the broker did not start: " + "".join(running.log[-20:]))
        running.log.append(line)
        if match := re.search(r"mc0 broker listening on (tcp://\S+)", line):
            running.endpoint = match.group(1)
        elif match := re.search(r"(\w+) gateway listening on (\S+):(\d+)", line):
            running.gateways[match.group(1)] = (match.group(2), int(match.group(3)))

    def keep() -> None:
        for line in stream:
            running.log.append(line)
            del running.log[:-2000]  # the last lines are the ones worth reading

    threading.Thread(target=keep, daemon=True, name="broker-log").start()


def stopped_cleanly(running: BrokerProcess) -> None:
    """SIGTERM, then exit code 0 and no traceback in the log: whatever was done to the broker, its shutdown
    writes its logs and asserts nothing."""
    code = running.stop()
    tail = "".join(running.log[-30:])
    assert code == 0, f"the broker exited {code}: {tail}"
    assert not any("Traceback" in line for line in running.log), tail


def answers(running: BrokerProcess) -> float:
    """A normal client publishes and receives through the broker; seconds it took. Raises if it cannot."""
    started = time.perf_counter()
    assert running.alive(), "the broker is not running: " + "".join(running.log[-20:])
    with running.client() as client:
        client.subscribe("faults.check")
        client.publish("faults.check", "still here")
        message = client.receive(timeout=PATIENCE)
        assert message is not None, "the broker did not deliver"
        assert message.body == b"still here"
    return time.perf_counter() - started


class LoopProbe:
    """A client sending NOOPs one after the other: the longest round trip is the broker's longest stall."""

    def __init__(self, running: BrokerProcess) -> None:
        self.client = running.client()
        self.longest = 0.0
        self.trips = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="loop-probe")

    def __enter__(self) -> LoopProbe:
        self.client.flush()
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.perf_counter()
            self.client.flush()
            self.longest = max(self.longest, time.perf_counter() - started)
            self.trips += 1
            time.sleep(0.005)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(PATIENCE)
        self.client.close()


def _connect(address: tuple[str, int]) -> socket.socket:
    return socket.create_connection(address, timeout=PATIENCE)


def _read_some(sock: socket.socket, wait: float = 0.05) -> bytes:
    sock.settimeout(wait)
    try:
        return sock.recv(65536)
    except (TimeoutError, OSError):
        return b""


# ----------------------------------------------------------------------------------------------- the doors


def _sexp_hello() -> bytes:
    return struct.pack(">q", sexp.VERSION_ONE)


def _msgq_hello() -> bytes:
    return msgq.Connection().send(msgq.GetLname())


def _rstreams_hello() -> bytes:
    hello = rstreams.ClientHello(rstreams.VERSION, (rstreams.EXT_PUBLISH,))
    return rstreams.Connection(client=True).send(hello)


def _lumberjack_batch(seq: int = 1) -> bytes:
    writer = lumberjack.ClientConnection(version=lumberjack.V2)
    return writer.send_window(1) + writer.send_events([(seq, {"message": "churn"})])


def _leave_one(door: str, running: BrokerProcess, context: zmq.Context, number: int) -> None:
    """One client of ``door`` comes, says hello the dialect's way, hears the answer and goes."""
    if door == "mc0":
        dealer = context.socket(zmq.DEALER)
        dealer.linger = 0
        dealer.connect(running.endpoint)
        dealer.send_multipart([b"", b"CONNECT", b"VERSION", b"0.3", b"ID", b"%d" % number])
        if not dealer.poll(int(PATIENCE * 1000)):
            raise AssertionError("no answer to CONNECT")
        dealer.recv_multipart()
        dealer.close()  # no DISCONNECT, no TTL: the session is the broker's to forget
        return
    with _connect(running.gateways[door]) as sock:
        if door == "sexp":
            sock.sendall(_sexp_hello() + b"(Connect 1 churn)\n")
            sock.recv(8)
        elif door == "msgq":
            sock.sendall(_msgq_hello())
            sock.recv(64)
        elif door == "rstreams":
            sock.sendall(_rstreams_hello())
            sock.recv(64)
        else:
            sock.sendall(_lumberjack_batch())
            sock.recv(6)  # the ack, after the commit


def churn(running: BrokerProcess, door: str, cycles: int) -> dict[str, float]:
    """``cycles`` clients of ``door`` come and go, one after another. The broker's RSS and descriptors after
    a tenth of them (the warm-up) and after all, once the broker has forgotten them."""
    context = zmq.Context()
    try:
        warm = max(1, cycles // 10)
        started = time.perf_counter()
        for number in range(warm):
            _leave_one(door, running, context, number)
        _settled(running, door)
        rss, fds = running.rss(), running.descriptors()
        for number in range(warm, cycles):
            _leave_one(door, running, context, number)
        seconds = time.perf_counter() - started
        _settled(running, door)
        return {"cycles": cycles, "seconds": seconds, "rss_warm": rss, "rss_end": running.rss(),
                "fds_warm": fds, "fds_end": running.descriptors()}
    finally:
        context.destroy(linger=0)


def _settled(running: BrokerProcess, door: str) -> None:
    """Until the broker holds no client of ``door`` but our probe (sessions are forgotten after the probe)."""
    deadline = time.monotonic() + PATIENCE
    with running.client(ttl=None) as client:
        while True:
            connections = client.stats(limit=1)["connections"]
            held = connections.get(door, 0) - (1 if door == "mc0" else 0)
            if held <= 0:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"{held} {door} clients still held after {PATIENCE} s")
            time.sleep(0.1)


def _mutate(valid: bytes, rng: random.Random) -> bytes:
    data = bytearray(valid)
    for _ in range(rng.randint(1, 4)):
        choice = rng.random()
        if choice < 0.4 and data:
            data[rng.randrange(len(data))] = rng.randrange(256)
        elif choice < 0.7:
            where = rng.randrange(len(data) + 1)
            data[where:where] = rng.randbytes(rng.randint(1, 16))
        elif data:
            start = rng.randrange(len(data))
            del data[start : start + rng.randint(1, 8)]
    return bytes(data)


def _valid_input(door: str, rng: random.Random) -> bytes:
    """One well-formed message of the door's dialect (after its hello), to be mutated."""
    topic = b"fuzz.%d" % rng.randrange(50)
    if door == "sexp":
        return rng.choice([b"(Connect 1 fuzzer)", b"(Subscribe " + topic + b" From_current)",
                           b"(Publish " + topic + b" " + sexp.quote_atom(rng.randbytes(20)) + b")",
                           b"(Unsubscribe " + topic + b")", b"(Ack 12345)"]) + b"\n"
    if door == "msgq":
        codec = msgq.Connection()
        return rng.choice([codec.send(msgq.GetLname()), codec.send(msgq.Subscribe(topic)),
                           codec.send(msgq.Stats()),
                           codec.send(msgq.Send(b"x", b"*", topic, b"*", b"1", rng.randbytes(10)))])
    if door == "rstreams":
        codec = rstreams.Connection(client=True)
        hello = codec.send(rstreams.ClientHello(rstreams.VERSION, (rstreams.EXT_PUBLISH,)))
        return hello + rng.choice([codec.send(rstreams.Subscribe(topic.decode(), 1, 10)),
                                   codec.send(rstreams.Request(1, 5)), codec.send(rstreams.Cancel(1)),
                                   codec.send(rstreams.Goodbye("fuzzed"))])
    writer = lumberjack.ClientConnection(version=rng.choice([lumberjack.V1, lumberjack.V2]))
    events = [(n, {"message": rng.randbytes(8).hex()}) for n in range(1, rng.randint(2, 5))]
    return writer.send_window(len(events)) + writer.send_events(events, compress=rng.random() < 0.5)


def _mc0_input(rng: random.Random) -> list[bytes]:
    verbs = [b"CONNECT", b"SUB", b"UNSUB", b"PUT", b"PUTS", b"NOOP", b"STATS", b"ACK", b"DECLARE", b"FETCH",
             b"DELETE", b"MESSAGE", b"OK", b"ERROR", b"DISCONNECT", rng.randbytes(4)]
    keys = [b"ID", b"TOPIC", b"TTL", b"VERSION", b"REPLAY", b"CREDIT", b"FROM", b"LIMIT", b"PREFIX",
            b"MAX-MESSAGES", b"PERSISTENCE", rng.randbytes(3)]
    frames = [b"", rng.choice(verbs)]
    for _ in range(rng.randrange(4)):
        frames += [rng.choice(keys), rng.choice([b"1", b"0", b"-1", b"x" * 30, rng.randbytes(6)])]
    if rng.random() < 0.8:
        frames += [b"", *(rng.choice([b"fuzz.%d" % rng.randrange(50), rng.randbytes(rng.randrange(40))])
                          for _ in range(rng.randrange(3)))]
    return frames


def fuzz(running: BrokerProcess, door: str, inputs: int, seed: int = 14) -> dict[str, float]:
    """``inputs`` bad inputs to ``door``: random bytes, or a valid message with bytes changed, added or cut.
    Returns what came back (error answers, closed connections)."""
    rng = random.Random(seed)
    answered = closed = 0
    if door == "mc0":
        context = zmq.Context()
        dealer = context.socket(zmq.DEALER)
        dealer.linger = 0
        dealer.connect(running.endpoint)
        try:
            for _ in range(inputs):
                dealer.send_multipart(_mc0_input(rng))
                while dealer.poll(0):
                    dealer.recv_multipart()
                    answered += 1
            while dealer.poll(500):
                dealer.recv_multipart()
                answered += 1
        finally:
            dealer.close()
            context.destroy(linger=0)
        return {"inputs": inputs, "answered": answered, "closed": 0}
    hello = _sexp_hello if door == "sexp" else bytes
    for _ in range(inputs):
        payload = rng.randbytes(rng.randint(1, 200)) if rng.random() < 0.2 else _mutate(
            _valid_input(door, rng), rng)
        with _connect(running.gateways[door]) as sock:
            try:
                sock.sendall(hello() + payload)
                sock.shutdown(socket.SHUT_WR)
            except OSError:
                closed += 1
                continue
            reply = _read_some(sock, 0.02)
            answered += bool(reply)
    return {"inputs": inputs, "answered": answered, "closed": closed}


# ---------------------------------------------------------------------------------------------- descriptors


def curve_handshakes(running: BrokerProcess, clients: int) -> dict[str, float]:
    """``clients`` CURVE clients connecting at once: how long from connect to the OK of their CONNECT (what
    handshake_timeout must leave room for)."""
    times: list[float] = []

    def one() -> None:
        started = time.perf_counter()
        with running.client(ttl=None) as client:
            client.flush()
        times.append(time.perf_counter() - started)

    threads = [threading.Thread(target=one) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(PATIENCE)
    times.sort()
    return {"clients": clients, "p50": times[len(times) // 2], "p99": times[int(len(times) * 0.99) - 1],
            "max": times[-1]}


#: The broker of the descriptor scenarios (``flood``, ``creeping``, ``topics``): a limit of 256, persistent
#: topics ``p.*``, CURVE on, and Lumberjack events routed by their ``fields.topic``.
DESCRIPTOR_LIMIT = 256
DESCRIPTOR_TOPICS = '[[topics]]\npattern = "p.*"\npersistence = "persistent"\nsync = "async"\n'
DESCRIPTOR_SETTINGS = 'lumberjack_topic_field = "fields.topic"\n'


def descriptor_broker(data_dir: Path | None = None) -> contextlib.AbstractContextManager[BrokerProcess]:
    """That broker; ``data_dir`` to start it again on the same data."""
    return broker(DESCRIPTOR_SETTINGS, descriptors=DESCRIPTOR_LIMIT, data_dir=data_dir,
                  topics=DESCRIPTOR_TOPICS, curve=True)


def flood(running: BrokerProcess, per_door: int) -> dict[str, float]:
    """Bare TCP connections to every door, held; meanwhile a Lumberjack client connected before creates a
    persistent topic (its ACK means stored). Then they close; the mc0 client connected before (dropped when
    the store found no descriptor and the mc0 port was unbound, see broker.server._RouterDoor) publishes and
    is confirmed on its own reconnection, and a new client must get in (:func:`answers`).

    The topic is made through Lumberjack because a TCP door keeps the connections it has whatever happens; an
    unbound mc0 port drops its clients, so a confirmed publish in flight at that moment fails with "may or
    may not have been stored", as it should. Whether the doors are still paused when the topic is made
    depends on how fast the bare connections go (shed, or timed out): ``made_during`` says, and
    :func:`creeping` holds a pause for sure while a topic is made."""
    held: list[socket.socket] = []
    refused = 0
    with running.client() as before, LumberjackClient(*running.gateways["lumberjack"],
                                                      timeout=PATIENCE) as shipper:
        before.flush()
        shipper.send_batch([{"message": "before the flood", "fields": {"topic": "p.lumberjack-before"}}])
        addresses = [tuple(running.endpoint[len("tcp://"):].rsplit(":", 1))]
        addresses += list(running.gateways.values())
        for host, port in addresses:
            for _ in range(per_door):
                try:
                    held.append(socket.create_connection((host, int(port)), timeout=0.5))
                except OSError:
                    refused += 1  # the door stopped accepting and its backlog is full: on to the next
                    break
        time.sleep(0.3)
        shipper.send_batch([{"message": "made while descriptors ran short",
                             "fields": {"topic": "p.during-the-flood"}}])  # returns once stored
        made_during = _doors_paused(running)
        for sock in held:
            sock.close()
        confirmed = before.publish("p.after-the-flood", "the mc0 client is back", confirm=True)
        stored = before.fetch("p.during-the-flood", 1).messages
        in_use = before.stats(limit=1)["limits"]["descriptors"]
    return {"held": len(held), "refused": refused, "made_during": bool(made_during),
            "stored_during": len(stored), "confirmed_after": bool(confirmed is not None),
            "mc0_reconnects": before.reconnects, "pauses": in_use["pauses"],
            "limit": in_use["descriptor_limit"]}


def creeping(running: BrokerProcess, step: int = 4, every: float = 0.05) -> dict[str, float]:
    """Connections to the sexp door that begin a command and say no more (held past the handshake timeout),
    ``step`` at a time, slower than the descriptor watch counts, until the doors pause. While they are
    held, the doors stay paused, and an mc0 client connected before must stay connected and be served:
    STATS, and a confirmed publish that makes a new persistent topic (the store's reserve); a new
    connection to the mc0 port must not be let in. Once the connections close and the doors take
    connections again, a new client gets in (:func:`answers`)."""
    held: list[socket.socket] = []
    with running.client() as before:
        before.flush()
        deadline = time.monotonic() + PATIENCE
        while not before.stats(limit=1)["limits"]["descriptors"]["paused"] and not before.reconnects:
            assert time.monotonic() < deadline, "the doors never stopped accepting"
            for _ in range(step):
                held.append(_connect(running.gateways["sexp"]))
                held[-1].sendall(b"(")  # heard: the handshake timeout does not close it
            time.sleep(every)
        dropped = before.reconnects  # the pause dropped this client (it reconnected on its own since)
        confirmed = before.publish("p.during-the-pause", "an mc0 client is served meanwhile", confirm=True)
        in_use = before.stats(limit=1)["limits"]["descriptors"]  # still paused: the topic was made meanwhile
        stored = before.fetch("p.during-the-pause", 1).messages
        host, port = running.endpoint[len("tcp://"):].rsplit(":", 1)
        try:
            socket.create_connection((host, int(port)), timeout=0.5).close()
            let_in = True
        except OSError:
            let_in = False  # the attempt went unanswered
        for sock in held:
            sock.close()
    return {"held": len(held), "paused": bool(in_use["paused"]), "confirmed": bool(confirmed is not None),
            "stored": len(stored), "mc0_reconnects": dropped, "new_mc0_connection_let_in": let_in}


def _doors_paused(running: BrokerProcess) -> bool:
    """Whether the broker's last word on its doors (in its log) is that they stopped accepting."""
    for line in reversed(running.log):
        if "new connections wait until some are free" in line:
            return True
        if "taking new connections again" in line:
            return False
    return False


def persistent_topics(running: BrokerProcess, count: int) -> dict[str, float]:
    """``count`` persistent topics, each with a confirmed message, under a low descriptor limit."""
    with running.client() as client:
        for number in range(count):
            client.publish(f"p.topic-{number}", f"message {number}", confirm=True)
        stored = sum(1 for number in range(0, count, max(1, count // 20))
                     if client.fetch(f"p.topic-{number}", 1).messages)
        limits = client.stats(limit=1)["limits"]["descriptors"]
    return {"topics": count, "checked": len(range(0, count, max(1, count // 20))), "stored": stored,
            "descriptors": limits["descriptors"], "limit": limits["descriptor_limit"]}


# ----------------------------------------------------------------------------------------- bodies and STATS


#: Targets for the 2 MiB body of ``sexp_decode``: the whole decode, and its peak memory over the body's size.
SEXP_DECODE_MS = 50
SEXP_PEAK_PER_BODY = 3.0


def sexp_decode(size: int = 2 << 20) -> dict[str, float]:
    """The codec alone: a line publishing ``size`` random bytes read step by step. Decode time, the longest
    step, and the peak memory allocated while reading it (tracemalloc), beside the body's size."""
    body = random.Random(7).randbytes(size)
    line = b"(Publish t " + sexp.quote_atom(body) + b")\n"
    codec = sexp.ServerConnection(max_line=4 * size + 1024)
    codec.receive_data(_sexp_hello())
    codec.next_event()
    codec.send(sexp.VersionReply(1))
    for start in range(0, len(line), 256 << 10):
        codec.receive_data(line[start : start + (256 << 10)])
    steps, longest = 0, 0.0
    started = time.perf_counter()
    while True:
        step = time.perf_counter()
        event = codec.next_event()
        longest = max(longest, time.perf_counter() - step)
        steps += 1
        if event is not None:
            break
    seconds = time.perf_counter() - started
    assert event == sexp.Publish(b"t", body)
    codec = sexp.ServerConnection(max_line=4 * size + 1024)
    codec.receive_data(_sexp_hello())
    codec.next_event()
    codec.send(sexp.VersionReply(1))
    codec.receive_data(line)
    tracemalloc.start()
    try:
        while codec.next_event() is None:
            pass
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # The baseline of the same run: one pass of C code over the line (what no decoder can beat).
    started = time.perf_counter()
    line.split(b"\\")
    baseline = time.perf_counter() - started
    return {"body": size, "line": len(line), "seconds": seconds, "steps": steps, "longest_step": longest,
            "peak": peak, "peak_per_body": peak / size, "split_baseline": baseline}


def sexp_body(running: BrokerProcess, size: int = 2 << 20) -> dict[str, float]:
    """A ``size``-byte random body published over sexp reaches an mc0 subscriber intact; the loop's longest
    stall meanwhile (a client's NOOP round trips)."""
    body = random.Random(9).randbytes(size)
    with running.client() as reader, LoopProbe(running) as probe:
        reader.subscribe("faults.body")
        started = time.perf_counter()
        with _connect(running.gateways["sexp"]) as sock:
            sock.sendall(_sexp_hello())
            sock.recv(8)
            sock.sendall(b"(Connect 1 big)\n(Publish faults.body " + sexp.quote_atom(body) + b")\n")
            message = reader.receive(timeout=PATIENCE)
        seconds = time.perf_counter() - started
    assert message is not None, "the body did not arrive"
    assert message.body == body, "the body arrived changed"
    return {"body": size, "seconds": seconds, "longest_stall": probe.longest, "probes": probe.trips}


def stats_pages(running: BrokerProcess, topics: int, pages: int = 20) -> dict[str, float]:
    """``topics`` topics (nobody subscribed), then STATS pages of 1,000: their latency, and the loop's longest
    stall meanwhile."""
    with running.client() as client:
        started = time.perf_counter()
        for first in range(0, topics, 1000):
            client.publish_batch([(f"s.{number:07d}", b"x", None) for number in range(first, first + 1000)])
        client.flush()
        created = time.perf_counter() - started
        latencies = []
        with LoopProbe(running) as probe:
            after = None
            for _ in range(pages):
                started = time.perf_counter()
                answer = client.stats(after=after, limit=1000)
                latencies.append(time.perf_counter() - started)
                after = answer["topics_next"]
            started = time.perf_counter()
            filtered = client.stats(prefix="s.00500", limit=1000)
            prefix_seconds = time.perf_counter() - started
        latencies.sort()
        rss = running.rss()
    assert answer["topics_total"] >= topics
    assert len(filtered["topics"]) == 100
    return {"topics": answer["topics_total"], "create_seconds": created,
            "page_p50": latencies[len(latencies) // 2], "page_max": latencies[-1],
            "prefix_seconds": prefix_seconds, "longest_stall": probe.longest, "rss": rss}


# ------------------------------------------------------------------------------------------------ budgets


def input_budget(running: BrokerProcess, connections: int, line: int) -> dict[str, float]:
    """``connections`` sexp clients each send ``line`` bytes of a line that never ends: together past the
    input budget, so the largest holders are refused; the memory comes back once they are gone."""
    rss_before = running.rss()
    socks = []
    refused = 0
    chunk = b"x" * (1 << 20)
    for _ in range(connections):
        sock = _connect(running.gateways["sexp"])
        sock.sendall(_sexp_hello())
        sock.recv(8)
        socks.append(sock)
    for sock in socks:
        try:
            for _ in range(line >> 20):
                sock.sendall(b"(Publish t " + chunk if _ == 0 else chunk)
        except OSError:
            refused += 1
    time.sleep(0.5)
    peak = running.rss()
    for sock in socks:
        reply = _read_some(sock, 0.2)
        refused += b"closing" in reply
        sock.close()
    time.sleep(1.0)
    return {"connections": connections, "line": line, "refused": refused, "rss_before": rss_before,
            "rss_peak": peak, "rss_after": running.rss()}


def _nested_bomb(inner: bytes, levels: int = 3) -> bytes:
    """A compressed frame holding a compressed frame ... holding ``inner``: a few kilobytes on the wire."""
    payload = zlib.compress(inner, 9)
    frame = b"2C" + struct.pack(">I", len(payload)) + payload
    for _ in range(levels - 1):
        payload = zlib.compress(frame, 9)
        frame = b"2C" + struct.pack(">I", len(payload)) + payload
    return frame


#: Two kinds: 60 MiB of zeros (no frame at all), and windows, well-formed frames up to the frame cap and past.
BOMBS = {"zeros": bytes(60 << 20), "windows": b"2W\x00\x00\x00\x01" * 200_000}


def zip_bombs(running: BrokerProcess, count: int) -> dict[str, float]:
    """``count`` nested zip bombs of each kind on the Lumberjack door, one connection each; the loop's
    longest stall meanwhile."""
    closed = sent = 0
    size = 0
    with LoopProbe(running) as probe:
        for inner in BOMBS.values():
            bomb = _nested_bomb(inner)
            size = max(size, len(bomb))
            for _ in range(count):
                with _connect(running.gateways["lumberjack"]) as sock:
                    sock.sendall(b"2W" + struct.pack(">I", 1) + bomb)
                    sent += 1
                    sock.settimeout(PATIENCE)
                    with contextlib.suppress(OSError):
                        closed += sock.recv(16) == b""
    return {"bombs": sent, "largest_bomb": size, "closed": closed, "longest_stall": probe.longest}


# ------------------------------------------------------------------------------------------------ the run


def _show(name: str, figures: dict[str, float]) -> None:
    shown = ", ".join(f"{key} {value:,.4g}" if isinstance(value, float) else f"{key} {value:,}"
                      for key, value in figures.items())
    print(f"{name:<22} {shown}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench faults", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--soak", type=int, default=1, metavar="N",
                        help="multiply every count by N (the CI's counts with 1)")
    args = parser.parse_args(argv)
    soak = args.soak
    print(f"python {sys.version.split()[0]}, libzmq {zmq.zmq_version()}, counts x {soak}")
    codec = sexp_decode()
    _show("sexp codec", codec)
    for name, value, target in (("  decode, ms", codec["seconds"] * 1000, SEXP_DECODE_MS),
                                ("  peak memory / body", codec["peak_per_body"], SEXP_PEAK_PER_BODY)):
        print(f"{name:<22} {value:,.3g}   target <= {target}: {'met' if value <= target else 'NOT met'}")
    with broker("session_idle = 1.0\n") as running:
        for door in DOORS:
            _show(f"churn {door}", churn(running, door, CHURN_CYCLES * soak))
        for door in DOORS:
            _show(f"fuzz {door}", fuzz(running, door, FUZZ_INPUTS * soak, seed=soak))
        _show("sexp body", sexp_body(running))
        _show("zip bombs", zip_bombs(running, 5 * soak))
        _show("still answering", {"seconds": answers(running)})
    with broker("input_budget = 33554432\n") as running:
        _show("input budget", input_budget(running, 3, 24 << 20))
        _show("still answering", {"seconds": answers(running)})
    with broker(curve=True) as running:
        _show("curve handshakes", curve_handshakes(running, 200))
    with descriptor_broker() as running:
        _show("persistent topics", persistent_topics(running, 400 * soak))
        _show("flood", flood(running, 300))
        _show("still answering", {"seconds": answers(running)})
    with descriptor_broker() as running:
        _show("creeping", creeping(running))
        _show("still answering", {"seconds": answers(running)})
    with broker("topic_idle = 3600.0\n") as running:
        _show("stats", stats_pages(running, STATS_TOPICS * soak))
        _show("still answering", {"seconds": answers(running)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
