"""``python -m bench cost``: what one message costs when it is not part of a flood, against baselines measured
in the same run.

1. **Confirmed publishes to a strong topic** (fsynced before each OK), 100-byte bodies:

   * ``mc0 1 in flight``: ``Client.publish(confirm=True)`` in a loop, with the broker's CPU time (every
     thread) per message; the target is 100 us, which leaves the fsync as the only thing to wait for. Beside
     it, what one write and fsync of a record costs a plain process on the same filesystem, written inside
     the file's length as mc0's log writes (kernel time that no broker fsyncing before each OK avoids), and
     mc0's CPU beyond that.
   * ``mc0 100 in flight``: ``Client.publish_async`` with ``max_confirms=100`` (pipelined; what is in flight
     travels as ``PUTS CONFIRM each``).
   * ``mc0 unconfirmed``: ``Client.publish`` to the same topic, then ``flush()``.
   * ``py-confirmer 1 / 100 in flight``: a plain Python ROUTER that answers each PUT with an OK and stores
     nothing, driven by a raw pyzmq DEALER that keeps 1 or 100 PUTs with IDs in flight: the floor a Python
     broker pays per confirmed message.

   Targets: mc0 100 in flight at least 2.0 x py-confirmer 100 in flight and at least 0.5 x unconfirmed.

2. **Lumberjack one-event batches**: a writer without TCP_NODELAY sends each batch's window frame and its one
   JSON frame in two sends, as a common Python shipping library does, and waits for the ACK, into a strong
   topic. Without TCP_QUICKACK on the broker's side, Nagle holds the second send until a delayed ACK (about
   40 ms). Target: at least 500 batches/s.

Each case runs against a broker process of its own with a fresh data directory; the median of ``--repeat``
runs, interleaved, is printed with the ratios.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import socket
import statistics
import struct
import tempfile
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import zmq

from bench.durability import serve_durable
from bench.lumberjack import serve as serve_lumberjack
from bench.process import broker_process, choose_engine
from bench.throughput import BODY_SIZE, _free_pair, free_port, process_cpu_seconds

#: Targets (see the module docstring).
PIPELINED_VS_FLOOR = 2.0
PIPELINED_VS_UNCONFIRMED = 0.5
CPU_PER_CONFIRM_US = 100
LUMBERJACK_BATCHES = 500
#: The strong topic of bench.durability's broker.
STRONG = "strong"


# ---------------------------------------------------------------------------------------------------- servers


def serve_py_confirmer(port: int, data_dir: str, ready: Any) -> None:
    """A plain Python ROUTER: OK to CONNECT, and an OK with the same ID to every PUT that has one; stores
    nothing, delivers nothing. One message per wake-up, like bench.throughput's py-forwarder."""
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.sndhwm = router.rcvhwm = 0
    router.bind(f"tcp://127.0.0.1:{port}")
    ready.set()
    recv, send = router.recv_multipart, router.send_multipart
    while True:
        frames = recv()
        identity = frames[0]
        try:
            command_id = frames[frames.index(b"ID", 2) + 1]
        except (ValueError, IndexError):
            continue  # no ID: nothing to answer
        send([identity, b"", b"OK", b"ID", command_id])


# ---------------------------------------------------------------------------------------------------- clients


#: What a client puts on its results queue when its clock starts, after its warm-up: the broker's CPU per
#: message is counted from there, not from the client process's start (which added a few tens of
#: milliseconds of connecting and topic creation to 2,000 messages' worth).
STARTED = "started"


def mc0_confirmed(port: int, count: int, in_flight: int, results: Any) -> None:
    """``count`` confirmed publishes with the connector, ``in_flight`` at a time (0: unconfirmed, then a
    flush). Puts the rate and whether every confirmation said fsync."""
    from connector import Client

    body = b"x" * BODY_SIZE
    with Client(f"tcp://127.0.0.1:{port}", curve=False, timeout=60,
                max_confirms=max(1, in_flight)) as client:
        client.publish(STRONG, body, confirm=True)  # the topic's log exists before the clock starts
        durable = True
        results.put(STARTED)
        start = time.perf_counter()
        if in_flight == 0:
            for _ in range(count):
                client.publish(STRONG, body)
            client.flush()
        elif in_flight == 1:
            for _ in range(count):
                reply = client.publish(STRONG, body, confirm=True)
                durable = durable and reply is not None and reply["DURABILITY"] == "fsync"
        else:
            futures = [client.publish_async(STRONG, body) for _ in range(count)]
            durable = all(future.result(60)["DURABILITY"] == "fsync" for future in futures)
        seconds = time.perf_counter() - start
    results.put({"rate": count / seconds, "durable": durable})


def raw_confirmed(port: int, count: int, in_flight: int, results: Any) -> None:
    """A raw DEALER keeping ``in_flight`` PUTs with IDs unanswered: the cheapest client there is."""
    context = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.sndhwm = dealer.rcvhwm = 0
    dealer.linger = 0
    dealer.connect(f"tcp://127.0.0.1:{port}")
    body = b"x" * BODY_SIZE
    send, recv = dealer.send_multipart, dealer.recv_multipart
    outstanding: deque[bytes] = deque()
    sent = answered = 0
    start = time.perf_counter()
    while answered < count:
        while sent < count and len(outstanding) < in_flight:
            command_id = b"%d" % sent
            send([b"", b"PUT", b"TOPIC", STRONG.encode(), b"ID", command_id, b"", body])
            outstanding.append(command_id)
            sent += 1
        frames = recv()
        if frames[-1] != outstanding.popleft():
            raise RuntimeError(f"reply out of order: {frames!r}")
        answered += 1
    results.put({"rate": count / (time.perf_counter() - start), "durable": False})
    dealer.close()
    context.term()


def lumberjack_split_sends(port: int, count: int, results: Any) -> None:
    """One-event batches, window and data frame in two sends, Nagle on (no TCP_NODELAY): batches/second."""
    event = json.dumps({"message": "GET /index.html 200", "host": "web1"}).encode()
    window = b"2W" + struct.pack("!I", 1)
    data = b"2J" + struct.pack("!II", 1, len(event)) + event
    with socket.create_connection(("127.0.0.1", port + 1)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 0)
        start = time.perf_counter()
        for _ in range(count):
            sock.sendall(window)
            sock.sendall(data)
            while True:  # an ACK is 6 bytes: "2A" and the sequence (0 is a keepalive)
                ack = b""
                while len(ack) < 6:
                    chunk = sock.recv(6 - len(ack))
                    if not chunk:
                        raise RuntimeError("the broker closed the Lumberjack connection")
                    ack += chunk
                if ack[:2] == b"2A" and struct.unpack("!I", ack[2:])[0] == 1:
                    break
        results.put({"rate": count / (time.perf_counter() - start)})


# ---------------------------------------------------------------------------------------------------- running


def fsync_cost(count: int) -> float:
    """CPU seconds (user and kernel) one write of a record and its fsync cost a process, on the filesystem the
    brokers' data directories are on: what any broker that fsyncs before each OK pays, whatever it is written
    in. Written as mc0's log writes (docs/storage.md, "Reserved space"): inside the file's length, so that
    the fsync need not commit a new one; what is left beyond it is mc0's own."""
    record = b"r" * (BODY_SIZE + 30)  # about what one stored message takes (header, CRC, msgpack)
    with tempfile.TemporaryDirectory() as scratch:
        fd = os.open(os.path.join(scratch, "log"), os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.ftruncate(fd, count * len(record))
            os.fsync(fd)
            started = time.process_time()
            for n in range(count):
                os.pwrite(fd, record, n * len(record))
                os.fsync(fd)
            return (time.process_time() - started) / count
        finally:
            os.close(fd)


@dataclass
class Case:
    label: str
    serve: Callable[[int, str, Any], None]
    client: Callable[..., None]
    arguments: tuple[Any, ...]
    gateway: bool = False  # the server binds port + 1 too
    cpu: bool = False  # report the server's CPU per message


def run_case(case: Case, count: int) -> dict[str, Any]:
    spawn = mp.get_context("spawn")
    port = _free_pair() if case.gateway else free_port()
    with broker_process(case.serve, port) as server_pid:
        results = spawn.Queue()
        client = spawn.Process(target=case.client, args=(port, count, *case.arguments, results), daemon=True)
        cpu_before = process_cpu_seconds(server_pid)
        client.start()
        outcome = results.get(timeout=600)
        if outcome == STARTED:
            cpu_before = process_cpu_seconds(server_pid)
            outcome = results.get(timeout=600)
        cpu_after = process_cpu_seconds(server_pid)
        client.join(30)
    if case.cpu and cpu_before is not None and cpu_after is not None:
        outcome["cpu_us"] = (cpu_after - cpu_before) / count * 1e6
    return outcome


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench cost", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--confirms", type=int, default=2_000, help="messages per 1-in-flight run")
    parser.add_argument("--pipelined", type=int, default=50_000, help="messages per 100-in-flight run")
    parser.add_argument("--batches", type=int, default=1_000, help="Lumberjack batches per run")
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure; the median is reported")
    parser.add_argument("--mc0-engine", choices=("auto", "native", "zeromq"),
                        help="what serves mc0's port (default: the broker's own default, auto: native)")
    args = parser.parse_args(argv)
    choose_engine(args.mc0_engine)
    cases = [
        (Case("mc0 1 in flight", serve_durable, mc0_confirmed, (1,), cpu=True), args.confirms),
        (Case("py-confirmer 1 in flight", serve_py_confirmer, raw_confirmed, (1,)), args.confirms),
        (Case("mc0 100 in flight", serve_durable, mc0_confirmed, (100,)), args.pipelined),
        (Case("py-confirmer 100 in flight", serve_py_confirmer, raw_confirmed, (100,)), args.pipelined),
        (Case("mc0 unconfirmed", serve_durable, mc0_confirmed, (0,)), args.pipelined),
        (Case("lumberjack 1-event batches", serve_lumberjack, lumberjack_split_sends, (), gateway=True),
         args.batches),
    ]
    print(f"python {platform.python_version()}, pyzmq {zmq.pyzmq_version()}, {BODY_SIZE}-byte messages into "
          f"a strong topic (fsync before each OK), median of {args.repeat}, interleaved")
    runs: dict[str, list[dict[str, Any]]] = {case.label: [] for case, _ in cases}
    fsyncs: list[float] = []
    for _ in range(args.repeat):
        for case, count in cases:
            runs[case.label].append(run_case(case, count))
        fsyncs.append(fsync_cost(args.confirms))
    figures = {label: statistics.median(run["rate"] for run in outcomes) for label, outcomes in runs.items()}
    cpu = statistics.median(run["cpu_us"] for run in runs["mc0 1 in flight"]) \
        if all("cpu_us" in run for run in runs["mc0 1 in flight"]) else None
    unit = {"lumberjack 1-event batches": "batches/s"}
    for label, rate in figures.items():
        print(f"{label:<32}{rate:>12,.0f} {unit.get(label, 'msg/s')}")
    fsync_us = statistics.median(fsyncs) * 1e6
    if cpu is not None:
        print(f"{'mc0 CPU per confirmed message':<32}{cpu:>12,.0f} us (broker process, every thread)")
        print(f"{'  of which one fsync costs':<32}{fsync_us:>12,.0f} us (a process writing a record inside "
              "its file's length and fsyncing it, same filesystem)")
        print(f"{'  mc0 beyond the fsync':<32}{cpu - fsync_us:>12,.0f} us")
    not_durable = [label for label, outcomes in runs.items()
                   if label.startswith("mc0") and "unconfirmed" not in label
                   and not all(run["durable"] for run in outcomes)]
    if not_durable:
        print(f"WRONG: confirmations without DURABILITY fsync in {not_durable}")
    pipelined = figures["mc0 100 in flight"]
    floor = figures["py-confirmer 100 in flight"]
    unconfirmed = figures["mc0 unconfirmed"]
    print()
    targets = [
        (f"mc0 100 in flight >= {PIPELINED_VS_FLOOR} x py-confirmer ({pipelined / floor:.2f})",
         pipelined >= PIPELINED_VS_FLOOR * floor),
        (f"mc0 100 in flight >= {PIPELINED_VS_UNCONFIRMED} x unconfirmed ({pipelined / unconfirmed:.2f})",
         pipelined >= PIPELINED_VS_UNCONFIRMED * unconfirmed),
        (f"lumberjack 1-event batches >= {LUMBERJACK_BATCHES}/s "
         f"({figures['lumberjack 1-event batches']:,.0f})",
         figures["lumberjack 1-event batches"] >= LUMBERJACK_BATCHES),
    ]
    if cpu is not None:
        targets.append((f"mc0 CPU per confirmed message <= {CPU_PER_CONFIRM_US} us ({cpu:.0f})",
                        cpu <= CPU_PER_CONFIRM_US))
    for what, met in targets:
        print(f"target {what}: {'met' if met else 'NOT met'}")
    return 1 if not_durable else 0
