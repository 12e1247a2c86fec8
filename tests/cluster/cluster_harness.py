"""Three real broker processes on loopback ports, forming a cluster, for the tests of this directory.

Each broker is ``mc0 broker`` of this checkout in a process of its own (as ``bench/faults.py`` starts them),
with its own data directory under the test's temporary folder, its mc0 door and its Raft port on loopback
ports picked up front (the others must know them), and every other door off. :class:`Cluster` starts, kills
(SIGKILL), pauses (SIGSTOP), resumes and restarts them, and asks who leads. Every wait is bounded.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import zmq

from connector import keys as key_files
from conftest import free_port

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
    """A cluster of brokers in processes of their own (see the module docstring)."""

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
            assert time.monotonic() < deadline, f"broker {member.index} did not answer: {member.log()[-3000:]}"
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
        socket = self.context.socket(zmq.DEALER)
        socket.linger = 0
        if self.curve:
            assert self.keys_dir is not None
            pair = key_files.client_pair(self.keys_dir)
            socket.curve_serverkey = key_files.broker_public(self.keys_dir)
            socket.curve_publickey = pair.public
            socket.curve_secretkey = pair.secret
        try:
            socket.connect(member.endpoint)
            socket.send_multipart([b"", b"STATS", b"ID", b"s", b"LIMIT", b"1"])
            if not socket.poll(int(timeout * 1000)):
                return None
            frames = socket.recv_multipart()
            return json.loads(frames[-1]) if frames[1:2] == [b"OK"] else None
        finally:
            socket.close(linger=0)

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


def make_cluster(tmp_path: Path, *, size: int = 3, curve: bool = False, settings: str = "") -> Cluster:
    keys_dir = None
    if curve:
        keys_dir = tmp_path / "keys"
        key_files.generate(keys_dir)  # one key pair for every member (docs/cluster.md), and a client
    rafts = [f"127.0.0.1:{free_port()}" for _ in range(size)]
    members = []
    for index in range(size):
        folder = tmp_path / f"broker{index}"
        folder.mkdir()
        port = free_port()
        peers = ", ".join(f'"{raft}"' for other, raft in enumerate(rafts) if other != index)
        config = folder / "mc0.toml"
        config.write_text(
            "[broker]\n"
            f'bind = "tcp://127.0.0.1:{port}"\n'
            f'data_dir = "{folder / "data"}"\n'
            + (f'keys_dir = "{keys_dir}"\n' if keys_dir else "")
            + 'sexp = "off"\nmsgq = "off"\nrstreams = "off"\nlumberjack = "off"\nhttp = "off"\n'
            f'cluster_node = "{rafts[index]}"\n'
            f"cluster_peers = [{peers}]\n"
            "cluster_commit_timeout = 3.0\n"
            + settings
        )
        members.append(Member(index, rafts[index], port, folder / "data", config, folder / "broker.log"))
    return Cluster(members, curve, keys_dir)


@pytest.fixture
def cluster_factory(tmp_path: Path) -> Iterator[Any]:
    """``cluster_factory(curve=False, settings="")``: three brokers started, a leader serving."""
    made: list[Cluster] = []

    def make(**options: Any) -> Cluster:
        cluster = make_cluster(tmp_path, **options)
        made.append(cluster)
        for member in cluster.members:
            cluster.start(member)
        cluster.settled()
        return cluster

    yield make
    for cluster in made:
        cluster.stop_all()
        cluster.context.term()
