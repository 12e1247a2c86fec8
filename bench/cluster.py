"""``python -m bench cluster``: confirmed publishes to a strong topic on a three-broker cluster (one machine)
against a single broker, same run, and how long a failover takes.

1. **Confirmed publishes**, 100-byte bodies into a strong topic (fsynced before each OK: on a single broker by
   itself, in a cluster by the leader and at least one follower), with the connector: ``publish(...,
   confirm=True)`` in a loop (1 in flight) and ``publish_async`` with ``max_confirms=100`` (100 in flight).
   Targets: the cluster at least 0.5 x the single broker, both ways.
2. **Failover**: SIGKILL the leader while a publisher (connected to every member) publishes; the time from the
   kill to the first publish confirmed by the new leader, p50 and p99 over ``--trials`` kills (the killed
   broker is restarted between trials).
3. **Handover**: the same with SIGTERM (a rolling restart): the leader hands the cluster to a follower before
   it stops. The time from the signal to the first publish confirmed by the new leader, p50 and p99 over
   ``--trials`` stops, and how many publishes failed meanwhile (none should).
4. **A frozen leader**: the same with SIGSTOP (a hung machine, a power cut: its connections stay open, so
   nothing tells the clients it is gone). The time from the freeze to the first publish confirmed by the new
   leader, p50 and p99 over ``--freezes`` freezes: the election, then the connector's heartbeat TTL to a
   cluster (``connector.base.CLUSTER_TTL_MS``, 3 s), after which it leaves the silent broker. The frozen
   broker is let go again afterwards (it steps down and follows).
5. **Catching up**: a follower is stopped (SIGSTOP) while ``--catch-up`` messages are confirmed by the
   leader and the other follower (1,000 in flight), then let go; how many messages a second it copies until
   the leader counts it as holding them all (no target: how fast a replica that was away is back in the
   majority).
6. **Making many topics**: one client's confirmed publishes to ``--idle-topics`` new strong topics, all in
   flight at once (one PUTS naming them: they are made a few each turn, their directories built ahead in the
   store's threads), while another client publishes confirmed to a strong topic of its own every 10 ms; on
   the single broker and on the cluster: the seconds until all are confirmed, and the other client's
   publishes meanwhile, p50 / p90 / slowest (no target: how much one client's burst of new topics holds the
   others).
7. **Idle**: those topics made (one message each), then each broker's CPU while nothing happens, as a share
   of one core, leader and followers (no target: what a cluster with many topics costs when nobody
   publishes; Linux only, from ``/proc``). Then the failover again, a few kills, with those topics: a new
   leader gives each persistent topic's log a new identity, so its take-over grows with them. The failovers
   above are timed before the idle topics are made.

The brokers are ``mc0 broker`` processes of this checkout (``ClusterProcesses``, which ``tests/cluster`` uses
too) on loopback ports, each with its own data directory, every door but mc0 off.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import zmq

from bench.bystander import beside_a_publisher, describe, percentile
from bench.throughput import BODY_SIZE, free_ports, process_cpu_seconds
from connector import Client, ConnectorError
from connector import keys as key_files

#: Targets (see the module docstring).
CLUSTER_VS_SINGLE = 0.5
TOPIC = "durable.bench"

#: Seconds a cluster may take to elect a leader and have it serve (Raft timeouts of 0.5 to 1 s, then the
#: take-over's round of questions), generous for a loaded two-core machine.
ELECTION = 20.0
#: Seconds a broker process may take to start or to stop.
LIFECYCLE = 20.0


@dataclass
class Member:
    """One broker of the cluster."""

    index: int
    raft: str  # HOST:PORT
    port: int  # the mc0 door's
    data_dir: Path
    config: Path
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    paused: bool = False
    starts: int = 0
    lumberjack: int | None = None  # the Lumberjack door's port, when it has one
    http: int | None = None  # the monitoring endpoint's port, when it has one

    @property
    def endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""


@dataclass
class Cluster:
    """Brokers in processes of their own: start, SIGKILL, SIGSTOP/SIGCONT, STATS, who leads."""

    members: list[Member]
    curve: bool
    keys_dir: Path | None
    context: zmq.Context = field(default_factory=zmq.Context)

    @property
    def endpoints(self) -> str:
        return ",".join(member.endpoint for member in self.members)

    def client_options(self) -> dict[str, Any]:
        return {"keys": self.keys_dir} if self.curve else {"curve": False}

    def start(self, member: Member) -> None:
        command = [sys.executable, "-c", "from connector.cli import main; main()", "broker", "--config",
                   str(member.config)]
        if not self.curve:
            command.append("--no-curve")
        log = member.log_path.open("ab")
        member.process = subprocess.Popen(command, stdout=log, stderr=log, cwd=member.data_dir.parent,
                                          env=dict(os.environ))
        log.close()
        member.paused = False
        member.starts += 1
        deadline = time.monotonic() + LIFECYCLE
        while self.stats(member, timeout=0.5) is None:
            assert member.alive, f"broker {member.index} exited: {member.log()[-3000:]}"
            assert time.monotonic() < deadline, \
                f"broker {member.index} did not answer: {member.log()[-3000:]}"
            time.sleep(0.1)

    def kill(self, member: Member) -> None:
        assert member.process is not None
        if member.paused:
            member.process.send_signal(signal.SIGCONT)
        member.process.kill()
        member.process.wait(LIFECYCLE)
        member.paused = False

    def pause(self, member: Member) -> None:
        assert member.process is not None
        member.process.send_signal(signal.SIGSTOP)
        member.paused = True

    def resume(self, member: Member) -> None:
        assert member.process is not None
        member.process.send_signal(signal.SIGCONT)
        member.paused = False

    def stop_all(self) -> None:
        for member in self.members:
            if member.alive:
                assert member.process is not None
                if member.paused:
                    self.resume(member)
                member.process.send_signal(signal.SIGTERM)
        for member in self.members:
            if member.process is not None:
                try:
                    member.process.wait(LIFECYCLE)
                except subprocess.TimeoutExpired:
                    member.process.kill()
                    member.process.wait()

    def stats(self, member: Member, timeout: float = 1.0) -> dict[str, Any] | None:
        """The member's STATS (``limits.cluster`` holds its view of the cluster), or None if it does not
        answer within ``timeout``."""
        if not member.alive or member.paused:
            return None
        return stats_at(self.context, member.endpoint, self.keys_dir if self.curve else None, timeout)

    def leader(self, timeout: float = ELECTION, exclude: tuple[Member, ...] = ()) -> Member:
        """The member that serves as leader, once one does (and the others agree on its epoch)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for member in self.members:
                if member in exclude:
                    continue
                stats = self.stats(member, timeout=0.5)
                if stats is not None and stats["limits"]["cluster"]["serving"]:
                    return member
            time.sleep(0.1)
        logs = "\n".join(f"--- broker {m.index}\n{m.log()[-2000:]}" for m in self.members)
        raise AssertionError(f"no leader within {timeout} s\n{logs}")

    def settled(self, timeout: float = ELECTION) -> Member:
        """The leader, once every running member names it as leader of the same epoch."""
        deadline = time.monotonic() + timeout
        while True:
            leader = self.leader(max(0.1, deadline - time.monotonic()))
            epoch = self.cluster_view(leader)["epoch"]
            views = [self.stats(member) for member in self.members if member.alive and not member.paused]
            if all(view is not None and view["limits"]["cluster"]["leader"] == leader.raft
                   and view["limits"]["cluster"]["epoch"] == epoch for view in views):
                return leader
            assert time.monotonic() < deadline, f"the members do not agree on a leader: {views}"
            time.sleep(0.1)

    def cluster_view(self, member: Member) -> dict[str, Any]:
        stats = self.stats(member)
        assert stats is not None, f"broker {member.index} does not answer"
        return stats["limits"]["cluster"]


def stats_at(context: zmq.Context, endpoint: str, keys_dir: Path | None = None,
             timeout: float = 1.0) -> dict[str, Any] | None:
    """The STATS of the broker at ``endpoint`` itself, from a raw DEALER (a client would follow a follower
    to its leader), with CURVE when ``keys_dir`` is given; None if it does not answer within ``timeout``."""
    socket = context.socket(zmq.DEALER)
    socket.linger = 0
    if keys_dir is not None:
        pair = key_files.client_pair(keys_dir)
        socket.curve_serverkey = key_files.broker_public(keys_dir)
        socket.curve_publickey = pair.public
        socket.curve_secretkey = pair.secret
    try:
        socket.connect(endpoint)
        socket.send_multipart([b"", b"STATS", b"ID", b"s", b"LIMIT", b"1"])
        if not socket.poll(int(timeout * 1000)):
            return None
        frames = socket.recv_multipart()
        return json.loads(frames[-1]) if frames[1:2] == [b"OK"] else None
    finally:
        socket.close(linger=0)


def make_cluster(folder: Path, *, size: int = 3, curve: bool = False, settings: str = "",
                 clustered: bool = True, lumberjack: bool = False, monitoring: bool = False) -> Cluster:
    """``size`` brokers under ``folder`` (not started): a cluster, or with ``clustered`` false one plain
    broker (the baseline the benchmark compares with); with ``lumberjack`` each has that door, and with
    ``monitoring`` its HTTP endpoint, on a loopback port of its own (``Member.lumberjack``,
    ``Member.http``)."""
    tmp_path = folder
    keys_dir = None
    if curve:
        keys_dir = tmp_path / "keys"
        key_files.generate(keys_dir)  # one key pair for every member (docs/cluster.md), and a client
    # Every port at once: the brokers and their Raft bind them only when they start, and a port chosen alone
    # could be chosen again meanwhile (a member's Raft port was once another's mc0 port).
    ports = iter(free_ports(size * (2 + lumberjack + monitoring)))
    rafts = [f"127.0.0.1:{next(ports)}" for _ in range(size)]
    members = []
    for index in range(size):
        folder = tmp_path / f"broker{index}"
        folder.mkdir(parents=True)
        port = next(ports)
        shipping = next(ports) if lumberjack else None
        http = next(ports) if monitoring else None
        peers = ", ".join(f'"{raft}"' for other, raft in enumerate(rafts) if other != index)
        config = folder / "mc0.toml"
        config.write_text(
            "[broker]\n"
            f'bind = "tcp://127.0.0.1:{port}"\n'
            f'data_dir = "{folder / "data"}"\n'
            + (f'keys_dir = "{keys_dir}"\n' if keys_dir else "")
            + 'sexp = "off"\nmsgq = "off"\nrstreams = "off"\n'
            + (f'http = "127.0.0.1:{http}"\n' if http else 'http = "off"\n')
            + (f'lumberjack = "127.0.0.1:{shipping}"\n' if shipping else 'lumberjack = "off"\n')
            + (f'cluster_node = "{rafts[index]}"\ncluster_peers = [{peers}]\ncluster_commit_timeout = 3.0\n'
               if clustered else "")
            + settings
        )
        members.append(Member(index, rafts[index], port, folder / "data", config, folder / "broker.log",
                              lumberjack=shipping, http=http))
    return Cluster(members, curve, keys_dir)



# ---------------------------------------------------------------------------------------------- measuring


def confirmed_rate(cluster: Cluster, count: int, in_flight: int) -> tuple[float, bool]:
    """Confirmed publishes per second through the connector (given every member), and whether every OK
    said fsync."""
    body = b"x" * BODY_SIZE
    with Client(cluster.endpoints, **cluster.client_options(), timeout=60, max_confirms=in_flight) as client:
        client.publish(TOPIC, body, confirm=True)  # the topic exists everywhere before the clock starts
        durable = True
        start = time.perf_counter()
        if in_flight == 1:
            for _ in range(count):
                reply = client.publish(TOPIC, body, confirm=True)
                durable = durable and reply is not None and reply["DURABILITY"] == "fsync"
        else:
            futures = [client.publish_async(TOPIC, body) for _ in range(count)]
            durable = all(future.result(60)["DURABILITY"] == "fsync" for future in futures)
        seconds = time.perf_counter() - start
    return count / seconds, durable


def catch_up_rate(cluster: Cluster, count: int) -> float:
    """Messages a second a follower copies after being stopped while ``count`` messages were confirmed by the
    others (see the module docstring)."""
    leader = cluster.settled()
    follower = next(member for member in cluster.members if member is not leader)
    with Client(cluster.endpoints, **cluster.client_options(), timeout=60, max_confirms=1_000) as client:
        reply = client.publish(TOPIC, b"before", confirm=True)
        assert reply is not None  # a confirmed publish has its OK
        _until_holds(cluster, leader, follower, int(reply["MESSAGE-ID"]), within=30)
        cluster.pause(follower)
        try:
            futures = [client.publish_async(TOPIC, b"x" * BODY_SIZE) for _ in range(count)]
            last = max(int(future.result(60)["MESSAGE-ID"]) for future in futures)
        finally:
            cluster.resume(follower)
        started = time.perf_counter()
        _until_holds(cluster, leader, follower, last, within=120)
    return count / (time.perf_counter() - started)


def making_topics(group: Cluster, topics: int) -> tuple[float, list[float]]:
    """One client's confirmed publishes to ``topics`` new strong topics, all in flight at once (one PUTS
    naming them, whose topics the broker makes a few each turn), while another client publishes confirmed
    to :data:`TOPIC` (:func:`bench.bystander.beside_a_publisher`): the seconds until all are confirmed, and
    the other client's confirmation times meanwhile."""

    def make() -> None:
        with Client(group.endpoints, **group.client_options(), timeout=60) as client:
            for future in [client.publish_async(f"durable.idle{n}", b"x") for n in range(topics)]:
                future.result(120)

    return beside_a_publisher(group.endpoints, group.client_options(), TOPIC, make)


def idle_cpu(cluster: Cluster, seconds: float = 5.0) -> dict[str, float]:
    """Each member's CPU, as a share of one core, while nothing is published (after :func:`making_topics`):
    the leader's, and the busier follower's."""
    leader = cluster.settled()
    time.sleep(2.0)  # the followers' copies of the last ones done, every wait parked
    pids = [member.process.pid for member in cluster.members if member.process is not None]
    before = [process_cpu_seconds(pid) or 0.0 for pid in pids]
    time.sleep(seconds)
    used = {index: ((process_cpu_seconds(pid) or 0.0) - before[index]) / seconds
            for index, pid in enumerate(pids)}
    return {"leader": used[leader.index],
            "follower": max(share for index, share in used.items() if index != leader.index)}


def _until_holds(cluster: Cluster, leader: Member, follower: Member, last: int, within: float) -> None:
    """Until the leader counts ``follower`` as holding :data:`TOPIC` up to id ``last``."""
    deadline = time.monotonic() + within
    while cluster.cluster_view(leader)["replicas"].get(TOPIC, {}).get(follower.raft, 0) <= last:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the follower did not copy up to id {last} within {within:g}s")
        time.sleep(0.002)


def failover_seconds(
    cluster: Cluster, client: Client, how: Literal["kill", "term", "freeze"] = "kill"
) -> tuple[float, int]:
    """Stop the leader ``how``: ``kill`` (SIGKILL), ``term`` (SIGTERM: it hands the cluster over) or
    ``freeze`` (SIGSTOP); seconds until a publish is confirmed again, by the new leader, and how many
    publishes failed meanwhile. The stopped broker is started again, or let go (as a follower), before this
    returns."""
    leader = cluster.settled()
    client.publish(TOPIC, b"before", confirm=True)
    stopped = time.monotonic()
    if how == "term":
        assert leader.process is not None
        leader.process.send_signal(signal.SIGTERM)
    elif how == "freeze":
        cluster.pause(leader)
    else:
        cluster.kill(leader)
    failed = 0
    while True:
        try:
            where = client.endpoint
            client.publish(TOPIC, b"after", confirm=True, timeout=2)
            if where != leader.endpoint and client.endpoint == where:  # confirmed by another broker
                break
        except ConnectorError:
            failed += 1
            if time.monotonic() - stopped > 60:
                raise
    seconds = time.monotonic() - stopped
    if how == "freeze":
        cluster.resume(leader)  # it learns it was deposed and follows
    else:
        if leader.process is not None:
            leader.process.wait(LIFECYCLE)
        cluster.start(leader)
    cluster.settled()
    return seconds, failed


#: Kills timed again once the idle figure's topics exist (a take-over then costs seconds, not milliseconds).
CROWDED_TRIALS = 3


@dataclass
class Report:
    rates: dict[str, float] = field(default_factory=dict)
    durable: bool = True
    failovers: list[float] = field(default_factory=list)
    handovers: list[float] = field(default_factory=list)
    handover_failures: int = 0
    freezes: list[float] = field(default_factory=list)
    catch_up: float | None = None  # messages a second (None: not measured)
    # "single", "cluster" -> seconds to make the topics, and the other client's confirmation times meanwhile
    making: dict[str, tuple[float, list[float]]] = field(default_factory=dict)
    idle: dict[str, float] = field(default_factory=dict)  # "leader", "follower" -> share of a core, idle
    crowded_failovers: list[float] = field(default_factory=list)  # with the idle figure's topics

    def ratio(self, in_flight: int) -> float:
        return self.rates[f"cluster {in_flight}"] / self.rates[f"single {in_flight}"]


def run(*, confirms: int, pipelined: int, trials: int, repeat: int, base: Path | None = None,
        engine: str | None = None, catch_up: int = 0, freezes: int = 0, idle_topics: int = 0) -> Report:
    """``engine``: the brokers' ``mc0_engine`` (None: their default); ``catch_up``: messages for the
    catching-up figure (0: not measured); ``freezes``: leader freezes timed; ``idle_topics``: topics for the
    idle figure (0: not measured)."""
    report = Report()
    runs: dict[str, list[float]] = {}
    settings = f'mc0_engine = "{engine}"\n' if engine else ""
    with tempfile.TemporaryDirectory(prefix="mc0-bench-cluster-", dir=base) as scratch:
        single = make_cluster(Path(scratch) / "single", size=1, clustered=False, settings=settings)
        cluster = make_cluster(Path(scratch) / "cluster", settings=settings)
        try:
            for group in (single, cluster):
                for member in group.members:
                    group.start(member)
            cluster.settled()
            for _ in range(repeat):  # interleaved: both see the same machine
                for label, group in (("single", single), ("cluster", cluster)):
                    for in_flight, count in ((1, confirms), (100, pipelined)):
                        rate, durable = confirmed_rate(group, count, in_flight)
                        runs.setdefault(f"{label} {in_flight}", []).append(rate)
                        report.durable = report.durable and durable
            if catch_up:
                report.catch_up = catch_up_rate(cluster, catch_up)
            with Client(cluster.endpoints, **cluster.client_options(), timeout=10) as client:
                for _ in range(trials):
                    report.failovers.append(failover_seconds(cluster, client)[0])
                for _ in range(trials):
                    seconds, failed = failover_seconds(cluster, client, "term")
                    report.handovers.append(seconds)
                    report.handover_failures += failed
                for _ in range(freezes):
                    report.freezes.append(failover_seconds(cluster, client, "freeze")[0])
            if idle_topics:
                for label, group in (("single", single), ("cluster", cluster)):
                    report.making[label] = making_topics(group, idle_topics)
                report.idle = idle_cpu(cluster)
                with Client(cluster.endpoints, **cluster.client_options(), timeout=10) as client:
                    for _ in range(min(trials, CROWDED_TRIALS)):
                        report.crowded_failovers.append(failover_seconds(cluster, client)[0])
        finally:
            for group in (single, cluster):
                group.stop_all()
                group.context.term()
    report.rates = {label: statistics.median(rates) for label, rates in runs.items()}
    return report


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench cluster", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--confirms", type=int, default=1_000, help="messages per 1-in-flight run")
    parser.add_argument("--pipelined", type=int, default=20_000, help="messages per 100-in-flight run")
    parser.add_argument("--trials", type=int, default=20,
                        help="leader kills for the failover figures, and as many stops for the handover ones")
    parser.add_argument("--freezes", type=int, default=5, help="leader freezes (SIGSTOP) timed")
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure; the median is reported")
    parser.add_argument("--catch-up", type=int, default=200_000,
                        help="messages a stopped follower copies for the catching-up figure (0: none)")
    parser.add_argument("--idle-topics", type=int, default=500,
                        help="new strong topics for the making and idle figures (0: not measured)")
    parser.add_argument("--mc0-engine", choices=("auto", "native", "zeromq"),
                        help="what serves every broker's mc0 port (default: the brokers' own default, auto)")
    args = parser.parse_args(argv)
    print(f"python {platform.python_version()}, pyzmq {zmq.pyzmq_version()}, {BODY_SIZE}-byte messages into "
          f"a strong topic, 3 brokers on one machine ({os.cpu_count()} cores), median of {args.repeat}")
    report = run(confirms=args.confirms, pipelined=args.pipelined, trials=args.trials, repeat=args.repeat,
                 engine=args.mc0_engine, catch_up=args.catch_up, freezes=args.freezes,
                 idle_topics=args.idle_topics)
    for label, rate in report.rates.items():
        print(f"{'confirmed, ' + label.replace(' ', ', ', 1) + ' in flight':<40}{rate:>12,.0f} msg/s")
    for label, times, what in (
        ("failover (kill -> first confirmed)", report.failovers, "kills"),
        ("handover (SIGTERM -> first confirmed)", report.handovers,
         f"stops, {report.handover_failures} publishes failed"),
        ("frozen leader (SIGSTOP -> confirmed)", report.freezes, "freezes"),
        (f"failover, {args.idle_topics:,} more topics", report.crowded_failovers, "kills"),
    ):
        if times:
            print(f"{label:<40}p50 {percentile(times, 0.5):.2f} s, p99 {percentile(times, 0.99):.2f} s over "
                  f"{len(times)} {what}")
    if report.catch_up is not None:
        print(f"{'a stopped follower catching up':<40}{report.catch_up:>12,.0f} msg/s "
              f"({args.catch_up:,} messages)")
    for label, (seconds, waits) in report.making.items():
        print(describe(f"{args.idle_topics:,} new topics, {label}", "all confirmed", seconds, waits))
    if report.idle:
        idle, shares = f"idle, {args.idle_topics:,} strong topics", report.idle
        print(f"{idle:<40}leader {shares['leader']:.1%} of a core, a follower {shares['follower']:.1%}")
    if not report.durable:
        print("WRONG: confirmations without DURABILITY fsync")
    print()
    for in_flight in (1, 100):
        ratio = report.ratio(in_flight)
        print(f"target cluster {in_flight} in flight >= {CLUSTER_VS_SINGLE} x single broker ({ratio:.3f}): "
              f"{'met' if ratio >= CLUSTER_VS_SINGLE else 'NOT met'}")
    return 0 if report.durable else 1
