"""``mc0 broker --http`` and ``mc0 health``: a real broker process with its monitoring endpoint on a chosen
port, asked by the healthcheck command the container uses; a busy explicit port and every failure of
``mc0 health`` as one line."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import free_port
from test_cli import NO_GATEWAY_PORTS, StderrLines, assert_one_line_error, mc0_command

from connector.cli import main

pytestmark = pytest.mark.timeout(30)

#: The gateways' free ports without the monitoring endpoint's (these tests choose that one).
GATEWAYS = NO_GATEWAY_PORTS[:-2]
assert NO_GATEWAY_PORTS[-2:] == ("--http", "127.0.0.1:0")


def test_health_asks_a_real_broker_process(tmp_path: Path) -> None:
    port = free_port()
    broker = subprocess.Popen(
        [*mc0_command(), "broker", "--bind", f"tcp://127.0.0.1:{free_port()}", *GATEWAYS, "--no-curve",
         "--http", f"127.0.0.1:{port}"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"}, cwd=tmp_path,
    )
    stderr = StderrLines(broker)
    health = [*mc0_command(), "health", "--http", f"127.0.0.1:{port}"]
    try:
        assert f"monitoring on http://127.0.0.1:{port}/" in stderr.wait_for("monitoring on", timeout=15)
        alive = subprocess.run(health, capture_output=True, text=True, timeout=15)
        assert (alive.returncode, alive.stdout) == (0, "ok\n"), alive.stderr
        ready = subprocess.run([*health, "--ready"], capture_output=True, text=True, timeout=15)
        assert (ready.returncode, ready.stdout) == (0, "ready\n"), ready.stderr
        broker.send_signal(signal.SIGTERM)
        assert broker.wait(timeout=10) == 0
        gone = subprocess.run(health, capture_output=True, text=True, timeout=15)
        assert gone.returncode == 1
        assert gone.stderr.startswith(f"Error: cannot reach http://127.0.0.1:{port}/healthz: ")
        assert len(gone.stderr.splitlines()) == 1
    finally:
        if broker.poll() is None:
            broker.kill()
            broker.wait(timeout=5)
        stderr.close()


def test_an_explicit_busy_http_port_is_one_line(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = CliRunner().invoke(main, ["broker", "--bind", "tcp://127.0.0.1:0", *GATEWAYS, "--no-curve",
                                           "--data-dir", str(tmp_path / "data"),
                                           "--http", f"127.0.0.1:{port}"])
    # The CURVE warning comes first; the error is the one line after it.
    assert result.exit_code == 1
    assert result.output.splitlines()[-1] == (f"Error: monitoring endpoint on 127.0.0.1:{port}: "
                                              "Address already in use")


@pytest.mark.parametrize(("address", "wrong"), [("off", "--http off"), ("localhost", "HOST:PORT")])
def test_health_with_no_address_to_ask_is_one_line(address: str, wrong: str) -> None:
    assert wrong in assert_one_line_error(CliRunner().invoke(main, ["health", "--http", address]))


def test_broker_with_a_bad_http_address_is_one_line() -> None:
    result = CliRunner().invoke(main, ["broker", "--no-curve", "--http", "eighty"])
    assert result.output.splitlines()[-1] == (
        "Error: http: 'eighty' is not an address; use HOST:PORT, tcp://HOST:PORT or a port number "
        "(e.g. 127.0.0.1:61617) (or 'off')")
