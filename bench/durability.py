"""``python -m bench durability``: what persistence costs, as ratios against transient in the same run.

Two measurements, each against a baseline measured in the same run, with the broker in its own process
(CURVE off, like ``bench.throughput``) and its data directory in a fresh temporary directory under the current
working directory, so that fsync reaches the real disk and not a tmpfs:

1. **Confirmed publishes.** One publisher, a raw pyzmq DEALER speaking mc0 through ``protocol.mc0``
   (``CONNECT EXTENSIONS ids``), keeps a window of messages unconfirmed and sends the next command each time
   an OK comes back, to a topic that is in turn persistent strong, weak, async and transient. Two modes:
   single PUTs with an ID (each OK confirms one message: group commit has to come from the broker's loop
   turn alone), and PUTS batches with an ID (each OK confirms the batch: what a publisher that batches, like
   the connector, gets). Every OK is checked: its ID is the next one expected, its MESSAGE-ID follows the
   previous one, and its ``DURABILITY`` is what the topic promises (fsync, written, written, memory). For the
   persistent topics the broker's ``fsyncs`` counter (STATS) gives messages per fsync.
   Targets: strong at least 0.3 x transient, weak at least 0.7 x transient.
2. **Replay against live.** A persistent topic is filled (not timed), then one ``connector.Client``
   subscribes from the beginning and receives everything; the baseline is the same subscriber code receiving
   as many messages published live by ``bench.throughput.publisher_process`` to a transient topic. Rates are
   first delivery to last, like ``bench.throughput``. Target: replay at least 1.0 x live. The log was just
   written, so replay reads it from the page cache (a cold cache needs root to drop, which a benchmark
   should not ask for).

Each confirmed case gets a fresh broker, and part 2 one of its own, so that no weak topic's periodic fsync and
no earlier log's write-back lands inside another case's figure.
"""

from __future__ import annotations

import argparse
import inspect
import multiprocessing as mp
import os
import platform
import queue
import shutil
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq

from bench.throughput import BODY_SIZE, QUIET, TOPIC, free_port, publisher_process
from protocol import mc0

#: The confirmed-publish cases, in the order they run and are printed, with the DURABILITY each OK must carry.
EXPECTED_DURABILITY = {"strong": "fsync", "weak": "written", "async": "written", "transient": "memory"}
#: Part 2's persistent topic (weak: the usual choice for a log that is replayed; sync does not change reads).
REPLAY_TOPIC = b"replay"
#: Part 2's live topic: bench.throughput's publisher publishes there, and the broker keeps it transient.
LIVE_TOPIC = TOPIC
#: How long a client may wait for a broker reply before the run counts as stalled.
STALL_SECONDS = 30.0

#: Confirmed-publish rates as a fraction of the transient rate, and replay as a multiple of live delivery.
TARGETS = (("strong", 0.3), ("weak", 0.7))
REPLAY_TARGET = 1.0


# ---------------------------------------------------------------------------------------------------- server


def serve_durable(port: int, data_dir: str, ready: Any) -> None:
    """The broker with one topic per sync level (named after it) and everything else transient broadcast."""
    from bench.process import serve_broker
    from broker.topics import Persistence, Sync, TopicRule, TopicSpec

    persistent = Persistence.PERSISTENT
    rules = (
        TopicRule("strong", TopicSpec(persistence=persistent, sync=Sync.STRONG)),
        TopicRule("weak", TopicSpec(persistence=persistent, sync=Sync.WEAK)),
        TopicRule("async", TopicSpec(persistence=persistent, sync=Sync.ASYNC)),
        TopicRule(REPLAY_TOPIC.decode(), TopicSpec(persistence=persistent, sync=Sync.WEAK)),
    )
    serve_broker(port, ready, topics=rules, data_dir=data_dir)


class BrokerProcess:
    """A broker in its own process on a free loopback port, killed on exit like bench.throughput's servers."""

    def __init__(self, data_dir: Path, port: int | None = None) -> None:
        spawn = mp.get_context("spawn")
        self.port = port or free_port()
        self.endpoint = f"tcp://127.0.0.1:{self.port}"
        ready = spawn.Event()
        self.process = spawn.Process(target=serve_durable, args=(self.port, str(data_dir), ready),
                                     daemon=True)
        self.process.start()
        deadline = time.monotonic() + 30
        while not ready.wait(0.1):
            if not self.process.is_alive():
                raise RuntimeError(f"the mc0 broker exited with code {self.process.exitcode} while starting")
            if time.monotonic() > deadline:
                self.process.kill()
                raise RuntimeError("the mc0 broker did not start within 30s")

    def topic_stats(self, topic: bytes) -> dict[str, Any]:
        from connector import Client

        with Client(self.endpoint, curve=False) as client:
            return client.stats()["topics"].get(topic.decode(), {})

    def died(self) -> int | None:
        """The exit code if the broker stopped on its own (it never should during a run)."""
        return None if self.process.is_alive() else self.process.exitcode

    def __enter__(self) -> BrokerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.kill()
        self.process.join(5)


# ------------------------------------------------------------------------------------ part 1: confirmed PUTs


def confirmed_publisher(endpoint: str, topic: bytes, count: int, window: int, batch: int, go: Any,
                        results: Any) -> None:
    """Keep ``window`` messages unconfirmed, as single PUTs (``batch`` 1) or PUTS of ``batch`` messages, each
    with an ID; a new command goes out each time an OK comes back. Checks every OK's ID, MESSAGE-ID and
    DURABILITY (and COUNT for PUTS). Starts when ``go`` is set (the broker is up)."""
    go.wait()
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.sndhwm = sock.rcvhwm = 0  # the window bounds what is in flight, not the pipe
    sock.linger = 0
    sock.connect(endpoint)
    sock.send_multipart(mc0.encode(mc0.Connect(id=b"connect", extensions=frozenset({mc0.EXT_IDS}))))
    if not sock.poll(int(STALL_SECONDS * 1000)):
        raise RuntimeError("no answer to CONNECT")
    hello = mc0.decode(sock.recv_multipart())
    if not isinstance(hello, mc0.Ok) or mc0.EXT_IDS.encode() not in hello.headers.get(mc0.EXTENSIONS, b""):
        raise RuntimeError(f"CONNECT EXTENSIONS ids was not accepted: {hello!r}")

    body = b"x" * BODY_SIZE
    encode, decode, ok_type = mc0.encode, mc0.decode, mc0.Ok
    send, recv = sock.send_multipart, sock.recv_multipart
    sizes: list[int] = []  # messages per command, in the order sent (replies come back in that order)

    def send_next() -> None:
        size = min(batch, count - sent_messages)
        command_id = b"%d" % len(sizes)
        if batch == 1:
            send(encode(mc0.Put(topic, body, command_id)))
        else:
            send(encode(mc0.Puts([(topic, body, mc0.NO_HEADERS)] * size, command_id)))
        sizes.append(size)

    durabilities: Counter[str] = Counter()
    errors: list[str] = []
    error_count = wrong_ids = message_ids_not_as_expected = 0
    last_message_id: int | None = None
    sent_messages = confirmed = answered = 0
    start = time.perf_counter()
    while sent_messages < min(window, count):
        send_next()
        sent_messages += sizes[-1]
    stalled = False
    while confirmed < count and answered < len(sizes):
        if not sock.poll(int(STALL_SECONDS * 1000)):
            stalled = True
            break
        while True:
            try:
                frames = recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            event = decode(frames)
            if type(event) is not ok_type and not isinstance(event, mc0.Error):
                continue  # a NOOP heartbeat: not an answer to any PUT
            if answered == len(sizes):  # a reply to nothing outstanding (a duplicate OK)
                wrong_ids += 1
                continue
            if event.id != b"%d" % answered:  # replies come back in the order the commands went out
                wrong_ids += 1
            size = sizes[answered]
            answered += 1
            if type(event) is ok_type:
                headers = event.headers
                durabilities[headers.get(mc0.DURABILITY, b"(none)").decode()] += size
                message_id = int(headers.get(mc0.MESSAGE_ID, b"-1"))
                # MESSAGE-ID is the (last) id the command got: exactly ``size`` after the previous one.
                if last_message_id is not None and message_id != last_message_id + size:
                    message_ids_not_as_expected += 1
                if batch > 1 and headers.get(b"COUNT") != b"%d" % size:
                    wrong_ids += 1
                last_message_id = message_id
                confirmed += size
            else:
                error_count += 1
                if len(errors) < 3:
                    errors.append(event.message.decode("utf-8", "replace"))
            if sent_messages < count:
                send_next()
                sent_messages += sizes[-1]
    seconds = time.perf_counter() - start
    sock.close()
    context.term()
    results.put({
        "confirmed": confirmed, "seconds": seconds, "durabilities": dict(durabilities), "stalled": stalled,
        "errors": errors, "error_count": error_count, "wrong_ids": wrong_ids,
        "message_ids_not_as_expected": message_ids_not_as_expected,
    })


def _outcome(results: Any, process: Any, what: str, timeout: float) -> dict[str, Any]:
    """A child's result, or an error as soon as the child died without one (no waiting out the timeout)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return results.get(timeout=1.0)
        except queue.Empty:
            if not process.is_alive():
                raise RuntimeError(f"the {what} process died (exit code {process.exitcode})") from None
    raise RuntimeError(f"the {what} process gave no result within {timeout:g}s")


@dataclass
class ConfirmedResult:
    kind: str  # the topic, named after its sync level (or "transient")
    batch: int  # messages per command: 1 = single PUTs, more = PUTS batches
    expected: int
    window: int  # messages in flight at most
    confirmed: int = 0
    seconds: float = 0.0
    durabilities: dict[str, int] = field(default_factory=dict)  # DURABILITY value -> messages it confirmed
    errors: list[str] = field(default_factory=list)
    error_count: int = 0
    wrong_ids: int = 0  # replies with an unexpected ID (or a PUTS OK with the wrong COUNT)
    message_ids_not_as_expected: int = 0
    stalled: bool = False
    fsyncs: int | None = None  # the topic's fsync counter from STATS (persistent topics)
    stored: int | None = None  # messages the topic's log holds, from STATS
    broker_exit: int | None = None  # set if the broker died during the run

    @property
    def rate(self) -> float:
        return self.confirmed / self.seconds if self.seconds > 0 else 0.0

    @property
    def per_fsync(self) -> float | None:
        return self.confirmed / self.fsyncs if self.fsyncs else None

    @property
    def durability_ok(self) -> bool:
        """Every message confirmed by an OK, in order, promising exactly what its topic's sync level says."""
        return not self.problems()

    def problems(self) -> list[str]:
        out = []
        expected = EXPECTED_DURABILITY[self.kind]
        if self.broker_exit is not None:
            out.append(f"broker exited with code {self.broker_exit}")
        if self.stalled:
            out.append(f"stalled: no reply for {STALL_SECONDS:g}s after {self.confirmed:,} confirmed")
        if self.confirmed != self.expected:
            out.append(f"{self.confirmed:,} of {self.expected:,} confirmed")
        if self.error_count:
            out.append(f"{self.error_count} ERROR replies, e.g. {self.errors}")
        if self.durabilities != {expected: self.confirmed}:
            out.append(f"DURABILITY {self.durabilities}, expected {expected}")
        if self.wrong_ids:
            out.append(f"{self.wrong_ids} replies with an unexpected ID or COUNT")
        if self.message_ids_not_as_expected:
            out.append(f"{self.message_ids_not_as_expected} MESSAGE-IDs not consecutive")
        if self.stored is not None and self.stored != self.confirmed:
            out.append(f"log holds {self.stored:,} messages, {self.confirmed:,} were confirmed")
        # An OK promising fsync follows an fsync covering its message, and no more than ``window`` messages
        # are ever unconfirmed, so one fsync covers at most ``window``: fewer fsyncs means a false promise.
        at_least = -(-self.confirmed // self.window)
        if self.kind == "strong" and self.broker_exit is None and (self.fsyncs or 0) < at_least:
            out.append(f"only {self.fsyncs} fsyncs (STATS) for {self.confirmed:,} messages confirmed as "
                       f"fsync with at most {self.window:,} in flight: at least {at_least:,} expected")
        return out


def run_confirmed(kind: str, batch: int, data_dir: Path, messages: int, window: int) -> ConfirmedResult:
    spawn = mp.get_context("spawn")
    topic = kind.encode()
    result = ConfirmedResult(kind, batch, messages, window)
    port = free_port()
    go, results = spawn.Event(), spawn.Queue()
    # Started before the broker, waiting for ``go``: the two processes start up side by side.
    publisher = spawn.Process(target=confirmed_publisher,
                              args=(f"tcp://127.0.0.1:{port}", topic, messages, window, batch, go, results),
                              daemon=True)
    publisher.start()
    try:
        broker = BrokerProcess(data_dir, port)
    except BaseException:
        publisher.kill()
        raise
    with broker:
        go.set()
        outcome = _outcome(results, publisher, "confirmed publisher", 900)
        publisher.join(10)
        for key, value in outcome.items():
            setattr(result, key, value)
        result.broker_exit = broker.died()
        if result.broker_exit is None:
            stats = broker.topic_stats(topic)
            result.fsyncs = stats.get("fsyncs")
            result.stored = stats.get("stored")
    return result


# ------------------------------------------------------------------------------------ part 2: replay vs live


def subscribe_from_beginning(client: Any, topic: bytes) -> str:
    """SUB with REPLAY beginning; returns how it was sent (the connector may not have the keyword yet)."""
    if "replay" in inspect.signature(client.subscribe).parameters:
        client.subscribe(topic, replay=mc0.REPLAY_BEGINNING)
        return "Client.subscribe(replay='beginning')"
    # The same SUB through the client's own request path, so the deliveries reach the same receive() code.
    client._call(mc0.Sub([topic], replay=mc0.REPLAY_BEGINNING), None, "SUB")
    return "raw SUB REPLAY beginning (Client.subscribe has no replay keyword)"


def subscriber_process(endpoint: str, topic: bytes, replay: bool, expected: int, ready: Any,
                       results: Any) -> None:
    """One connector.Client receiving ``expected`` messages; the same code for replay and live."""
    from connector import Client

    with Client(endpoint, curve=False) as client:
        if replay:
            how = subscribe_from_beginning(client, topic)
        else:
            client.subscribe(topic)
            how = "Client.subscribe()"
        ready.set()
        receive, clock = client.receive, time.perf_counter
        outcome: dict[str, Any] = {"how": how}
        message = receive(STALL_SECONDS)
        if message is not None:
            first = last = clock()
            first_id = previous = message.id
            count = 1
            gaps = 0  # deliveries whose id is not the previous id + 1: a loss, a duplicate or a reordering
            while count < expected:
                message = receive(QUIET)
                if message is None:
                    break
                last = clock()
                if message.id != previous + 1:
                    gaps += 1
                previous = message.id
                count += 1
            outcome.update(received=count, seconds=last - first, gaps=gaps, first_id=first_id,
                           last_id=previous)
        results.put(outcome)


@dataclass
class DeliveryResult:
    name: str  # "replay" or "live"
    expected: int
    received: int = 0
    seconds: float = 0.0  # first delivery to last
    gaps: int = 0
    first_id: int | None = None
    last_id: int | None = None
    how: str = ""  # how the SUB was sent
    broker_exit: int | None = None

    @property
    def rate(self) -> float:
        return self.received / self.seconds if self.seconds > 0 else 0.0

    def problems(self) -> list[str]:
        out = []
        if self.broker_exit is not None:
            out.append(f"broker exited with code {self.broker_exit}")
        if self.received != self.expected:
            out.append(f"received {self.received:,} of {self.expected:,}")
        if self.gaps:
            out.append(f"{self.gaps} breaks in the id sequence")
        return out


def _receive(broker: BrokerProcess, name: str, topic: bytes, replay: bool, expected: int,
             publish: bool = False) -> DeliveryResult:
    spawn = mp.get_context("spawn")
    ready, results = spawn.Event(), spawn.Queue()
    subscriber = spawn.Process(target=subscriber_process,
                               args=(broker.endpoint, topic, replay, expected, ready, results), daemon=True)
    subscriber.start()
    publisher = None
    go = spawn.Event()
    if publish:  # started now, publishing once ``go`` is set: the two processes start up side by side
        publisher = spawn.Process(target=publisher_process,
                                  args=("mc0", "broadcast", broker.port, expected, 0.0, go), daemon=True)
        publisher.start()
    try:
        if not ready.wait(30):
            raise RuntimeError(f"the {name} subscriber did not start")
        time.sleep(0.2)  # as bench.throughput: let the subscription settle before the publisher starts
        go.set()
        outcome = _outcome(results, subscriber, f"{name} subscriber", 900)
    finally:
        for process in (subscriber, publisher):
            if process is not None:
                process.join(30)
                if process.is_alive():
                    process.kill()
    result = DeliveryResult(name, expected, **outcome)
    result.broker_exit = broker.died()
    return result


def run_live(broker: BrokerProcess, messages: int) -> DeliveryResult:
    """The baseline: bench.throughput's mc0 publisher process publishing live to a transient topic."""
    return _receive(broker, "live", LIVE_TOPIC, False, messages, publish=True)


def run_replay(broker: BrokerProcess, messages: int) -> DeliveryResult:
    return _receive(broker, "replay", REPLAY_TOPIC, True, messages)


def fill(broker: BrokerProcess, messages: int) -> float:
    """Store ``messages`` in the replay topic through the connector (PUTS batches); returns seconds taken."""
    from connector import Client

    start = time.perf_counter()
    with Client(broker.endpoint, curve=False) as client:
        publish = client.publish
        for seq in range(messages):
            publish(REPLAY_TOPIC, b"%-100d" % seq)
        client.flush(timeout=600)
    stored = broker.topic_stats(REPLAY_TOPIC).get("stored")
    if stored != messages:
        raise RuntimeError(f"the replay topic holds {stored} messages after the fill, expected {messages}")
    return time.perf_counter() - start


# ---------------------------------------------------------------------------------------------------- report


def filesystem_of(path: Path) -> str:
    """The filesystem type, device and mount point holding ``path`` (longest matching /proc/mounts entry)."""
    real = os.path.realpath(path)
    best: tuple[str, str, str] | None = None
    try:
        with open("/proc/mounts") as mounts:
            for line in mounts:
                device, mount, fstype = line.split()[:3]
                mount = mount.replace("\\040", " ")
                inside = real == mount or real.startswith(mount.rstrip("/") + "/")
                if inside and (best is None or len(mount) >= len(best[1])):
                    best = (device, mount, fstype)
    except OSError:
        pass
    if best is None:
        return "an unknown filesystem"
    device, mount, fstype = best
    return f"{fstype} ({device} mounted on {mount})"


def mode_name(batch: int) -> str:
    return "PUT" if batch == 1 else f"PUTS x{batch}"


@dataclass
class Report:
    filesystem: str
    confirmed: dict[int, dict[str, ConfirmedResult]]  # batch size -> topic kind -> result
    live: DeliveryResult
    replay: DeliveryResult
    fill_seconds: float

    def ratio(self, batch: int, kind: str) -> float:
        base = self.confirmed[batch]["transient"].rate
        return self.confirmed[batch][kind].rate / base if base else 0.0

    @property
    def replay_ratio(self) -> float:
        return self.replay.rate / self.live.rate if self.live.rate else 0.0

    def targets(self) -> list[tuple[str, float, bool]]:
        out = []
        for batch in self.confirmed:
            for kind, at_least in TARGETS:
                ratio = self.ratio(batch, kind)
                label = f"{kind} >= {at_least} x transient ({mode_name(batch)})"
                out.append((label, ratio, ratio >= at_least))
        replay = self.replay_ratio
        out.append((f"replay >= {REPLAY_TARGET} x live", replay, replay >= REPLAY_TARGET))
        return out

    @property
    def durability_ok(self) -> bool:
        return all(r.durability_ok for results in self.confirmed.values() for r in results.values())

    def problems(self) -> list[str]:
        found = [f"{mode_name(r.batch)} {r.kind}: {p}" for results in self.confirmed.values()
                 for r in results.values() for p in r.problems()]
        return found + [f"{r.name}: {p}" for r in (self.live, self.replay) for p in r.problems()]


def _median(runs: list[Any]) -> Any:
    """The run with the median rate (the upper middle for an even count), like bench.throughput; but a run
    whose checks failed is reported instead, so that a failure never hides behind the median."""
    failed = [r for r in runs if r.problems()]
    if failed:
        return failed[0]
    ordered = sorted(runs, key=lambda r: r.rate)
    return ordered[len(ordered) // 2]


def run(messages: int = 100_000, replay_messages: int = 1_000_000, window: int = 1000, batch: int = 100,
        repeat: int = 1, base_dir: str | Path = ".", progress: Any = None) -> Report:
    """Both parts, in a fresh data directory under ``base_dir`` (removed afterwards). ``batch`` 0 or 1 leaves
    out the PUTS rows."""
    batches = [1] + ([batch] if batch > 1 else [])
    data_dir = Path(tempfile.mkdtemp(prefix="mc0-durability-", dir=base_dir))
    try:
        filesystem = filesystem_of(data_dir)
        if progress:
            progress(f"data directory {data_dir.name} on {filesystem}")
        runs: dict[int, dict[str, list[ConfirmedResult]]] = {
            size: {kind: [] for kind in EXPECTED_DURABILITY} for size in batches}
        for attempt in range(repeat):
            for size in batches:
                for kind in EXPECTED_DURABILITY:  # interleaved, so that drift on the machine hits every kind
                    where = data_dir / f"{kind}-{size}-{attempt}"
                    runs[size][kind].append(run_confirmed(kind, size, where, messages, window))
        live_runs, replay_runs = [], []
        with BrokerProcess(data_dir / "replay") as broker:
            fill_seconds = fill(broker, replay_messages)
            for _ in range(repeat):
                live_runs.append(run_live(broker, replay_messages))
                replay_runs.append(run_replay(broker, replay_messages))
        confirmed = {size: {kind: _median(r) for kind, r in by_kind.items()}
                     for size, by_kind in runs.items()}
        return Report(filesystem, confirmed, _median(live_runs), _median(replay_runs), fill_seconds)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def print_report(report: Report) -> None:
    header = f"{'scenario':<32}{'msg/s':>10}{'ratio':>20}{'msgs/fsync':>12}  check"
    print(header)
    print("-" * len(header))
    for batch, results in report.confirmed.items():
        for kind, result in results.items():
            per_fsync = "" if result.per_fsync is None else f"{result.per_fsync:,.1f}"
            problems = result.problems()
            check = (f"{result.confirmed:,} OK'd, DURABILITY {EXPECTED_DURABILITY[kind]}" if not problems
                     else "FAILED: " + "; ".join(problems))
            print(f"{'confirmed ' + mode_name(batch) + ', ' + kind:<32}{result.rate:>10,.0f}"
                  f"{report.ratio(batch, kind):>8.2f} x transient{per_fsync:>12}  {check}")
    for result in (report.replay, report.live):
        name = "replay from beginning" if result.name == "replay" else "live, transient topic"
        problems = result.problems()
        check = (f"ids {result.first_id}..{result.last_id}, none missing" if not problems
                 else "FAILED: " + "; ".join(problems))
        ratio = result.rate / report.live.rate if report.live.rate else 0.0
        print(f"{name:<32}{result.rate:>10,.0f}{ratio:>8.2f} x live     {'':>12}  {check}")
    for batch, results in report.confirmed.items():
        fsyncs = ", ".join(f"{kind} {r.fsyncs:,}" for kind, r in results.items() if r.fsyncs is not None)
        print(f"\nfsyncs on each topic's log during the {mode_name(batch)} runs (STATS): {fsyncs}", end="")
    print(f"\nreplay SUB sent as {report.replay.how}; the fill of {report.replay.expected:,} messages "
          f"took {report.fill_seconds:.1f}s (not timed)\n")
    for label, ratio, met in report.targets():
        print(f"target {label}: {'met' if met else 'NOT met'} ({ratio:.2f})")
    print(f"DURABILITY on every OK as promised (fsync / written / written / memory): "
          f"{'yes' if report.durability_ok else 'NO'}")
    for problem in report.problems():
        print(f"broker problem: {problem}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench durability", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=100_000, help="confirmed messages per topic and mode")
    parser.add_argument("--window", type=int, default=1000, help="messages in flight without an OK")
    parser.add_argument("--batch", type=int, default=100,
                        help="messages per PUTS in the batched rows (0: single PUTs only)")
    parser.add_argument("--replay-messages", type=int, default=1_000_000,
                        help="messages stored and replayed (and published live for the baseline)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per figure; the median is reported")
    parser.add_argument("--dir", default=".", help="where the temporary data directory is made (real disk)")
    args = parser.parse_args(argv)

    print(f"python {platform.python_version()}, pyzmq {zmq.pyzmq_version()}, libzmq {zmq.zmq_version()}, "
          f"{args.messages:,} confirmed messages per topic (window {args.window:,}), "
          f"{args.replay_messages:,} replayed vs live, {BODY_SIZE}-byte bodies, "
          f"{'median of ' + str(args.repeat) if args.repeat > 1 else 'one run each'}, "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    report = run(args.messages, args.replay_messages, args.window, args.batch, args.repeat, args.dir,
                 progress=print)
    print_report(report)
    return 0 if not report.problems() else 1
