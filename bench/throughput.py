"""mc0 against two baselines measured in the same run, with the same Python client processes.

Systems (each in its own process, on loopback):

* ``zmq-proxy``: libzmq's own C proxy (``zmq.proxy``) between raw pyzmq clients: XSUB/XPUB for broadcast,
  PULL/PUSH for round-robin. The C speed reference.
* ``py-forwarder``: a minimal pure-Python ROUTER forwarder, one message per wake-up
  (what a naive broker does).
* ``mc0``: the broker with the connector's default settings (``connector.Client``, on its native wire:
  ``connector.native_blocking``).
* ``mc0-async``: the same broker with the asyncio client (``connector.AsyncClient``) on both ends, through
  libzmq (``wire="zeromq"``), in the latency scenario: no thread between the caller and the socket, where
  ``Client`` hands each message to and from its I/O thread.
* ``mc0-native``: the same on the asyncio client's default wire, which speaks ZMTP on its own loop
  (``connector.native``): no libzmq I/O thread on either end either.

The asyncio clients run on uvloop where it is installed, as the broker does (``broker.server.loop_factory``).

Scenarios: 1 publisher → 1 subscriber, 1 → 4 fan-out (broadcast), 1 → 2 round-robin, and one-way latency at a
paced 1,000 msg/s. Throughput counts deliveries per second at the subscribers, from the first delivery to
the last; every figure is printed with its ratio against the baselines, because these machines are
shared and noisy.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import os
import random
import socket
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import zmq

BODY_SIZE = 100
TOPIC = b"bench"
QUIET = 2.0  # seconds without a delivery before a subscriber gives up (a baseline that loses messages)


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """``count`` distinct free loopback ports: all held open until all are chosen, so that the system cannot
    hand out one port twice to a caller that binds them only later (a cluster's brokers and their Raft)."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            s = stack.enter_context(socket.socket())
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
        return ports


def stamped_body(seq: int) -> bytes:
    """A 100-byte body carrying its send time (monotonic ns: one clock for every process) and a sequence."""
    return struct.pack("!qq", time.monotonic_ns(), seq).ljust(BODY_SIZE, b".")


def sent_at(body: bytes) -> int:
    return struct.unpack_from("!q", body)[0]


# ---------------------------------------------------------------------------------------------------- servers


def serve_zmq_proxy(port: int, mode: str, ready: Any) -> None:
    context = zmq.Context()
    front = context.socket(zmq.XSUB if mode == "broadcast" else zmq.PULL)
    back = context.socket(zmq.XPUB if mode == "broadcast" else zmq.PUSH)
    for sock in (front, back):
        sock.sndhwm = sock.rcvhwm = 0  # unbounded: the baseline must not drop what it is measured on
    front.bind(f"tcp://127.0.0.1:{port}")
    back.bind(f"tcp://127.0.0.1:{port + 1}")
    ready.set()
    zmq.proxy(front, back)


def serve_py_forwarder(port: int, mode: str, ready: Any) -> None:
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.sndhwm = router.rcvhwm = 0
    router.bind(f"tcp://127.0.0.1:{port}")
    ready.set()
    subscribers: list[bytes] = []
    turn = 0
    while True:
        identity, verb, *rest = router.recv_multipart()
        if verb == b"SUB":
            subscribers.append(identity)
            router.send_multipart([identity, b"OK"])
        elif verb == b"PUT":
            if mode == "broadcast":
                for subscriber in subscribers:
                    router.send_multipart([subscriber, rest[0]])
            elif subscribers:
                turn = (turn + 1) % len(subscribers)
                router.send_multipart([subscribers[turn], rest[0]])


def serve_mc0(port: int, mode: str, ready: Any, sexp: str = "off", msgq: str = "off",
              rstreams: str = "off") -> None:
    from bench.process import serve_broker
    from broker.topics import Delivery, TopicRule, TopicSpec

    delivery = Delivery.BROADCAST if mode == "broadcast" else Delivery.ROUND_ROBIN
    serve_broker(port, ready, topics=(TopicRule("*", TopicSpec(delivery=delivery)),), sexp=sexp, msgq=msgq,
                 rstreams=rstreams)


def serve_mc0_sexp(port: int, mode: str, ready: Any) -> None:
    """mc0 with its sexp gateway on ``port + 1``."""
    serve_mc0(port, mode, ready, sexp=f"127.0.0.1:{port + 1}")


def serve_mc0_msgq(port: int, mode: str, ready: Any) -> None:
    """mc0 with its msgq gateway on ``port + 1``."""
    serve_mc0(port, mode, ready, msgq=f"127.0.0.1:{port + 1}")


def serve_mc0_rstreams(port: int, mode: str, ready: Any) -> None:
    """mc0 with its reactive-streams gateway on ``port + 1``."""
    serve_mc0(port, mode, ready, rstreams=f"127.0.0.1:{port + 1}")


#: Systems that bind a gateway on port + 1 next to mc0.
GATEWAY_SYSTEMS = ("mc0-sexp", "mc0-msgq", "mc0-rstreams")

SERVERS: dict[str, Callable[[int, str, Any], None]] = {
    "zmq-proxy": serve_zmq_proxy,
    "py-forwarder": serve_py_forwarder,
    "mc0": serve_mc0,
    "mc0-async": serve_mc0,  # the same broker; AsyncClient on both ends (the latency scenario)
    "mc0-native": serve_mc0,  # the same, AsyncClient on its default (native) wire on both ends
    "mc0-sexp": serve_mc0_sexp,  # an mc0 publisher, subscribers on the sexp door
    "mc0-msgq": serve_mc0_msgq,  # an mc0 publisher, subscribers on the msgq door
    "mc0-rstreams": serve_mc0_rstreams,  # an mc0 publisher, subscribers on the reactive-streams door
}


# ---------------------------------------------------------------------------------------------------- clients


class RawSubscriber:
    """The baseline clients' receiving side: one pyzmq recv per message."""

    def __init__(self, system: str, port: int) -> None:
        self.context = zmq.Context()
        if system == "zmq-proxy":
            self.socket = self.context.socket(zmq.SUB)
            self.socket.rcvhwm = 0
            self.socket.subscribe(b"")
            self.socket.connect(f"tcp://127.0.0.1:{port + 1}")
        else:
            self.socket = self.context.socket(zmq.DEALER)
            self.socket.rcvhwm = 0
            self.socket.connect(f"tcp://127.0.0.1:{port}")
            self.socket.send(b"SUB")
            self.socket.recv()

    def receive(self, timeout: float) -> bytes | None:
        if self.socket.poll(int(timeout * 1000)):
            return self.socket.recv()
        return None


class RawPullSubscriber(RawSubscriber):
    def __init__(self, system: str, port: int) -> None:
        if system != "zmq-proxy":
            super().__init__(system, port)
            return
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.PULL)
        self.socket.rcvhwm = 0
        self.socket.connect(f"tcp://127.0.0.1:{port + 1}")


class Mc0Subscriber:
    def __init__(self, port: int) -> None:
        from connector import Client

        self.client = Client(f"tcp://127.0.0.1:{port}", curve=False)
        self.client.subscribe(TOPIC)

    def receive(self, timeout: float) -> bytes | None:
        message = self.client.receive(timeout)
        return None if message is None else message.body


class SexpSubscriber:
    def __init__(self, port: int) -> None:
        from connector.sexp_client import SexpClient

        self.client = SexpClient("127.0.0.1", port + 1, client_id="bench")
        self.client.subscribe(TOPIC)

    def receive(self, timeout: float) -> bytes | None:
        message = self.client.receive(timeout)
        return None if message is None else message.body


class MsgqSubscriber:
    def __init__(self, port: int) -> None:
        from connector.msgq_client import MsgqClient

        self.client = MsgqClient("127.0.0.1", port + 1)
        self.client.subscribe(TOPIC)

    def receive(self, timeout: float) -> bytes | None:
        send = self.client.receive(timeout)
        return None if send is None else send.msg  # type: ignore[return-value]


class RStreamsSubscriber:
    """Requests 10,000 elements at a time, and 10,000 more each time 10,000 have arrived."""

    WINDOW = 10_000

    def __init__(self, port: int) -> None:
        from connector.rstreams_client import RStreamsClient

        self.client = RStreamsClient("127.0.0.1", port + 1)
        self.stream = self.client.subscribe(TOPIC.decode(), demand=self.WINDOW)
        self.arrived = 0

    def receive(self, timeout: float) -> bytes | None:
        element = self.client.receive(timeout)
        if element is None:
            return None
        self.arrived += 1
        if self.arrived % self.WINDOW == 0:
            self.client.request(self.stream, self.WINDOW)
        return element.data


#: The asyncio systems and the wire their clients use.
ASYNC_WIRES = {"mc0-async": "zeromq", "mc0-native": "auto"}


def _run_client(main: Any) -> None:
    """Run an asyncio client process's ``main`` on the loop the broker runs on by default (uvloop where it is
    installed: ``broker.server.loop_factory``), as a user who cares about latency would."""
    from broker.server import loop_factory

    with asyncio.Runner(loop_factory=loop_factory("auto")) as runner:
        runner.run(main)


async def _async_subscriber(port: int, expected: int, ready: Any, results: Any, wire: str) -> None:
    from connector import AsyncClient

    delays: list[int] = []
    first = last = 0.0
    async with AsyncClient(f"tcp://127.0.0.1:{port}", curve=False, wire=wire) as client:
        await client.subscribe(TOPIC)
        ready.set()
        timeout = 30.0
        while len(delays) < expected:
            message = await client.receive(timeout)
            if message is None:
                break
            last = time.perf_counter()
            delays.append(time.monotonic_ns() - sent_at(message.body))
            if len(delays) == 1:
                first, timeout = last, QUIET
    results.put({"count": len(delays), "seconds": last - first, "delays": delays})


async def _async_publisher(port: int, count: int, rate: float, go: Any, wire: str) -> None:
    from connector import AsyncClient

    async with AsyncClient(f"tcp://127.0.0.1:{port}", curve=False, wire=wire) as client:
        await asyncio.to_thread(go.wait)
        start = time.monotonic()
        interval = 1.0 / rate
        for seq in range(count):
            delay = start + seq * interval - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            await client.publish(TOPIC, stamped_body(seq))
        await client.flush(timeout=120)


def subscriber_process(system: str, mode: str, port: int, expected: int, latency: bool, ready: Any,
                       results: Any) -> None:
    if system in ASYNC_WIRES:
        _run_client(_async_subscriber(port, expected, ready, results, ASYNC_WIRES[system]))
        return
    if system == "mc0":
        sub: Any = Mc0Subscriber(port)
    elif system == "mc0-sexp":
        sub = SexpSubscriber(port)
    elif system == "mc0-msgq":
        sub = MsgqSubscriber(port)
    elif system == "mc0-rstreams":
        sub = RStreamsSubscriber(port)
    elif mode == "round-robin":
        sub = RawPullSubscriber(system, port)
    else:
        sub = RawSubscriber(system, port)
    ready.set()
    first = last = 0.0
    count = 0
    delays: list[int] = []
    timeout = 30.0
    while count < expected:
        body = sub.receive(timeout)
        if body is None:
            break
        now = time.perf_counter()
        if latency:
            delays.append(time.monotonic_ns() - sent_at(body))
        if count == 0:
            first = now
            timeout = QUIET
        last = now
        count += 1
    results.put({"count": count, "seconds": last - first, "delays": delays})


def publisher_process(system: str, mode: str, port: int, count: int, rate: float, go: Any) -> None:
    if system in ASYNC_WIRES:
        _run_client(_async_publisher(port, count, rate, go, ASYNC_WIRES[system]))
        return
    go.wait()
    interval = 1.0 / rate if rate else 0.0
    start = time.monotonic()
    if system.startswith("mc0"):
        from connector import Client

        with Client(f"tcp://127.0.0.1:{port}", curve=False) as client:
            publish = client.publish
            for seq in range(count):
                if interval:
                    _pace(start, seq, interval)
                    publish(TOPIC, stamped_body(seq))
                else:
                    publish(TOPIC, b"%-100d" % seq)
            client.flush(timeout=120)
        return
    context = zmq.Context()
    if system == "zmq-proxy":
        sock = context.socket(zmq.PUB if mode == "broadcast" else zmq.PUSH)
        sock.sndhwm = 0
        sock.connect(f"tcp://127.0.0.1:{port}")
        time.sleep(0.3)  # PUB/XSUB subscription propagation
        send = sock.send
        for seq in range(count):
            if interval:
                _pace(start, seq, interval)
            send(stamped_body(seq) if interval else b"%-100d" % seq)
    else:
        sock = context.socket(zmq.DEALER)
        sock.sndhwm = 0
        sock.connect(f"tcp://127.0.0.1:{port}")
        send_multipart = sock.send_multipart
        for seq in range(count):
            if interval:
                _pace(start, seq, interval)
            send_multipart([b"PUT", stamped_body(seq) if interval else b"%-100d" % seq])
    sock.close(linger=10_000)
    context.term()


def _pace(start: float, seq: int, interval: float) -> None:
    delay = start + seq * interval - time.monotonic()
    if delay > 0:
        time.sleep(delay)


# ---------------------------------------------------------------------------------------------------- running


@dataclass
class Result:
    delivered: int
    expected: int
    rate: float  # deliveries per second, all subscribers together
    p50_us: float = 0.0
    p99_us: float = 0.0
    cpu_us: float | None = None  # the server process's CPU time (every thread) per message published


#: Whether the kernel keeps each thread's CPU time in nanoseconds (``/proc/<pid>/task/<tid>/schedstat``).
SCHEDSTAT = os.path.exists("/proc/self/schedstat")


def process_cpu_seconds(pid: int) -> float | None:
    """CPU time of process ``pid`` (user and system), every thread included (Linux /proc; None elsewhere).

    The scheduler's own count, in nanoseconds, summed over the threads, where the kernel keeps it: the clock
    ticks of ``/proc/<pid>/stat`` (10 ms each here) made the CPU per message of a 3-second paced run move in
    steps of 3.3 µs, about the distance to its target. The figures are differences over a run whose threads
    live through it (a thread gone before the second reading takes its time with it; the servers measured
    here keep theirs); the ticks, which count gone threads too, where there is no such count."""
    if SCHEDSTAT:
        try:
            threads = os.listdir(f"/proc/{pid}/task")
        except OSError:
            return None
        nanoseconds = 0
        for thread in threads:
            try:
                with open(f"/proc/{pid}/task/{thread}/schedstat") as schedstat:
                    nanoseconds += int(schedstat.read().split()[0])
            except (OSError, ValueError, IndexError):
                continue  # the thread ended meanwhile
        return nanoseconds / 1e9
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_case(system: str, mode: str, subscribers: int, messages: int, rate: float = 0.0) -> Result:
    spawn = mp.get_context("spawn")
    port = _free_pair() if system in ("zmq-proxy", *GATEWAY_SYSTEMS) else free_port()
    server_ready = spawn.Event()
    server = spawn.Process(target=SERVERS[system], args=(port, mode, server_ready), daemon=True)
    server.start()
    try:
        if not server_ready.wait(30):
            raise RuntimeError(f"{system} did not start")
        results = spawn.Queue()
        per_subscriber = messages if mode == "broadcast" else messages // subscribers
        readies = []
        subs = []
        for _ in range(subscribers):
            ready = spawn.Event()
            arguments = (system, mode, port, per_subscriber, rate > 0, ready, results)
            proc = spawn.Process(target=subscriber_process, args=arguments, daemon=True)
            proc.start()
            readies.append(ready)
            subs.append(proc)
        for ready in readies:
            if not ready.wait(30):
                raise RuntimeError("subscriber did not start")
        time.sleep(0.2)
        go = spawn.Event()
        publisher = spawn.Process(target=publisher_process, args=(system, mode, port, messages, rate, go),
                                  daemon=True)
        publisher.start()
        cpu_before = process_cpu_seconds(server.pid)  # type: ignore[arg-type] - started above
        go.set()
        outcomes = [results.get(timeout=300) for _ in subs]
        cpu_after = process_cpu_seconds(server.pid)  # type: ignore[arg-type]
        publisher.join(30)
        for proc in subs:
            proc.join(10)
    finally:
        server.kill()
        server.join(5)
    delivered = sum(o["count"] for o in outcomes)
    seconds = max(o["seconds"] for o in outcomes) or 1e-9
    result = Result(delivered, per_subscriber * subscribers, delivered / seconds)
    if cpu_before is not None and cpu_after is not None:
        result.cpu_us = (cpu_after - cpu_before) / messages * 1e6
    delays = sorted(d for o in outcomes for d in o["delays"])
    if delays:
        result.p50_us = delays[len(delays) // 2] / 1000
        result.p99_us = delays[min(len(delays) - 1, int(len(delays) * 0.99))] / 1000
    return result


#: Where the system takes its ephemeral ports from (Linux), and the ports below it that the fallback of
#: :func:`_free_pair` tries.
PORT_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
BELOW_EPHEMERAL = 10_000


def _free_pair() -> int:
    """A port p with p+1 free too (the proxy, and mc0 with a gateway, bind two).

    First as the system hands out free ports, checking the next one. After tens of thousands of short
    connections within a minute (``bench faults`` churns 50,000), their client ends wait out TIME_WAIT on
    nearly every ephemeral port, and nothing can bind those, a listener with SO_REUSEADDR included: then the
    pair is drawn from below the ephemeral range, which outgoing connections never use."""
    for _ in range(50):
        port = free_port()
        if _bindable(port + 1):
            return port
    first = _ephemeral_start()
    chooser = random.Random()
    for _ in range(200):
        port = chooser.randrange(BELOW_EPHEMERAL, max(BELOW_EPHEMERAL + 1, first - 1))
        if _bindable(port) and _bindable(port + 1):
            return port
    raise RuntimeError("no pair of free loopback ports: free some (or wait a minute for TIME_WAIT to pass)")


def _bindable(port: int) -> bool:
    """Whether a server could listen on loopback ``port`` now (with SO_REUSEADDR, as libzmq and asyncio
    listen)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _ephemeral_start() -> int:
    """The first port the system hands out for outgoing connections."""
    try:
        with open(PORT_RANGE_FILE) as ports:
            return int(ports.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def median_cases(
    systems: Sequence[str], mode: str, subscribers: int, messages: int, repeat: int, rate: float = 0.0
) -> dict[str, Result]:
    """Each system's median run of ``repeat`` (by rate, or by p50 when paced), the systems' runs interleaved:
    a shared machine's load drifts over a minute, and runs taken one system after another would put that drift
    into the ratios between them."""
    runs: dict[str, list[Result]] = {system: [] for system in systems}
    for _ in range(repeat):
        for system in systems:
            runs[system].append(run_case(system, mode, subscribers, messages, rate))
    for results in runs.values():
        results.sort(key=lambda r: r.rate if not rate else r.p50_us)
    return {system: results[len(results) // 2] for system, results in runs.items()}
