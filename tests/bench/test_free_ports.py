"""The benchmarks' pairs of loopback ports (p, p+1), for the servers that bind two: found as the system hands
out free ports, and still found when the ports next to those are all taken, as they are for a minute after
a churn of tens of thousands of short connections (their client ends wait out TIME_WAIT on nearly every
ephemeral port); never a pair somebody listens on."""

from __future__ import annotations

import socket

import pytest

from bench import throughput


def listening(server: socket.socket, port: int) -> None:
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", port))
    server.listen()


def test_a_pair_both_servers_can_listen_on() -> None:
    port = throughput._free_pair()
    with socket.socket() as first, socket.socket() as second:
        listening(first, port)
        listening(second, port + 1)


def test_when_every_neighbour_is_taken_the_pair_comes_from_below_the_ephemeral_range(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with socket.socket() as taken:
        listening(taken, 0)
        # Every port the system offers has a neighbour in use (here: a listener), as after a churn.
        monkeypatch.setattr(throughput, "free_port", lambda: taken.getsockname()[1] - 1)
        port = throughput._free_pair()
    assert throughput.BELOW_EPHEMERAL <= port < throughput._ephemeral_start() - 1
    with socket.socket() as first, socket.socket() as second:
        listening(first, port)
        listening(second, port + 1)


def test_a_port_somebody_listens_on_is_never_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        listening(taken, 0)
        occupied = taken.getsockname()[1]
        # The system offers the port below the listener every time, and below the ephemeral range the only
        # port left to draw is the listener's: no pair may be found.
        monkeypatch.setattr(throughput, "free_port", lambda: occupied - 1)
        monkeypatch.setattr(throughput, "BELOW_EPHEMERAL", occupied)
        monkeypatch.setattr(throughput, "_ephemeral_start", lambda: occupied + 2)
        with pytest.raises(RuntimeError, match="no pair of free loopback ports"):
            throughput._free_pair()
