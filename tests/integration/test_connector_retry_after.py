"""A cluster member that knows no leader yet (an election, a take-over) refuses a command with an ERROR
carrying RETRY-AFTER: the connector sends it again after that wait, on a new connection, and the caller sees
only the OK. An ERROR without it (a minority's refusal) reaches the caller at once. Both clients, against a
scripted ROUTER on loopback that stands in for the member."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import zmq
from scripted_router import LoopbackRouter

from connector import AsyncClient, Client, ConnectorError
from protocol import mc0

REFUSAL = "this broker does not lead the cluster (it was just elected and is catching up from the replicas)"


class ScriptedMember(LoopbackRouter):
    """Answers CONNECT with OK and each PUT (and SUB) in turn from ``answers`` (``sub_answers``): "retry",
    "final" or "ok" (SUBs are answered OK once their script is used up), recording (verb, connection
    identity, monotonic time) for every command."""

    def __init__(self, answers: list[str], sub_answers: list[str] | None = None) -> None:
        self.answers = answers
        self.sub_answers = sub_answers or []
        self.seen: list[tuple[bytes, bytes, float]] = []
        super().__init__()

    def restart(self) -> None:
        """What a broker restart looks like to its clients: the listening socket goes, and a new one comes on
        the same port (the clients' connections drop, ZeroMQ reconnects them)."""
        self.stop.set()
        self.thread.join(5)
        self.router.close(linger=0)
        self.router = self.context.socket(zmq.ROUTER)
        self.router.linger = 0
        deadline = time.monotonic() + 5
        while True:  # libzmq lets go of the port in its own thread, a moment after close()
            try:
                self.router.bind(f"tcp://127.0.0.1:{self.port}")
                break
            except zmq.ZMQError:
                assert time.monotonic() < deadline, f"port {self.port} was not free again within 5 s"
                time.sleep(0.02)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        router = self.router
        while not self.stop.is_set():
            if not router.poll(50):
                continue
            frames = router.recv_multipart()
            identity, verb = frames[0], frames[2]
            self.seen.append((verb, identity, time.monotonic()))
            command_id = frames[frames.index(b"ID") + 1] if b"ID" in frames else None
            if verb == b"CONNECT" or (verb == b"SUB" and not self.sub_answers):
                reply: mc0.Ok | mc0.Error = mc0.Ok(command_id)
            elif verb in (b"PUT", b"SUB"):
                answer = (self.answers if verb == b"PUT" else self.sub_answers).pop(0)
                if answer == "ok":
                    reply = mc0.Ok(command_id, {b"MESSAGE-ID": b"1", b"DURABILITY": b"fsync"})
                else:
                    reply = mc0.leader_error(REFUSAL, None, command_id, 100 if answer == "retry" else None)
            elif command_id is not None:
                reply = mc0.Ok(command_id)
            else:
                continue
            router.send_multipart([identity, *mc0.encode(reply)])

    def puts(self) -> list[tuple[bytes, float]]:
        return [(identity, at) for verb, identity, at in self.seen if verb == b"PUT"]


@pytest.fixture
def member_factory() -> Iterator[Callable[..., ScriptedMember]]:
    made: list[ScriptedMember] = []

    def make(answers: list[str], sub_answers: list[str] | None = None) -> ScriptedMember:
        member = ScriptedMember(answers, sub_answers)
        made.append(member)
        return member

    yield make
    for member in made:
        member.close()


def _retried_after_the_wait(member: ScriptedMember) -> None:
    (first, refused_at), (second, retried_at) = member.puts()
    assert second != first, "the command was sent again on a new connection"
    assert retried_at - refused_at >= 0.09, "sent again before the 100 ms the broker asked for"


@pytest.mark.timeout(20)
def test_a_refusal_with_retry_after_is_sent_again_after_the_wait(member_factory) -> None:
    member = member_factory(["retry", "ok"])
    with Client(f"tcp://127.0.0.1:{member.port}", curve=False, timeout=5) as client:
        reply = client.publish("durable.t", b"one", confirm=True)
    assert reply is not None
    assert reply["MESSAGE-ID"] == "1"
    _retried_after_the_wait(member)


@pytest.mark.timeout(20)
def test_a_refusal_without_retry_after_is_the_callers_at_once(member_factory) -> None:
    member = member_factory(["final"])
    with Client(f"tcp://127.0.0.1:{member.port}", curve=False, timeout=5) as client:
        started = time.monotonic()
        with pytest.raises(ConnectorError, match="does not lead the cluster"):
            client.publish("durable.t", b"one", confirm=True)
        assert time.monotonic() - started < 2
    assert len(member.puts()) == 1


@pytest.mark.timeout(20)
def test_the_asyncio_client_sends_a_refused_command_again_after_the_wait(member_factory) -> None:
    member = member_factory(["retry", "retry", "ok"])

    async def publish() -> dict[str, str] | None:
        async with AsyncClient(f"tcp://127.0.0.1:{member.port}", curve=False, timeout=5) as client:
            return await client.publish("durable.t", b"one", confirm=True)

    reply = asyncio.run(publish())
    assert reply is not None
    assert reply["MESSAGE-ID"] == "1"
    puts = member.puts()
    assert len(puts) == 3
    assert len({identity for identity, _ in puts}) == 3
    assert puts[2][1] - puts[0][1] >= 0.18


@pytest.mark.timeout(20)
@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_resubscription_refused_with_retry_after_is_made_again(member_factory, asynchronous: bool) -> None:
    """After a failover the client subscribes again on its new connection; a member still choosing its leader
    refuses that SUB with RETRY-AFTER, and the client must go on trying (else it would sit on a connection
    with no subscription, receiving nothing)."""
    member = member_factory([], ["ok", "retry"])

    def subs() -> list[tuple[bytes, float]]:
        return [(identity, at) for verb, identity, at in member.seen if verb == b"SUB"]

    def wait_for_three_subs() -> None:
        deadline = time.monotonic() + 10
        while len(subs()) < 3:
            assert time.monotonic() < deadline, f"the client subscribed {len(subs())} times, not 3"
            time.sleep(0.02)

    if asynchronous:
        async def run() -> None:
            async with AsyncClient(f"tcp://127.0.0.1:{member.port}", curve=False, timeout=5) as client:
                await client.subscribe("durable.t")
                member.restart()
                await asyncio.to_thread(wait_for_three_subs)

        asyncio.run(run())
    else:
        with Client(f"tcp://127.0.0.1:{member.port}", curve=False, timeout=5) as client:
            client.subscribe("durable.t")
            member.restart()
            wait_for_three_subs()
    (_, _), (refused_on, refused_at), (again_on, again_at) = subs()[:3]
    assert again_on != refused_on, "subscribed again on a new connection"
    assert again_at - refused_at >= 0.09, "subscribed again before the 100 ms the member asked for"
