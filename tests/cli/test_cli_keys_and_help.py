"""What a person reads: environment variables shown in --help, a client's own key pair made without a broker
identity (and the command that admits it), and option bounds that say what the broker wants."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import zmq.auth
from click.testing import CliRunner
from zmq.utils import z85

from connector import keys as key_files
from connector.cli import main

if TYPE_CHECKING:
    from broker.server import Broker


@pytest.mark.parametrize(
    ("command", "shown"),
    [
        (["pub"], ["MC0_BROKER", "MC0_KEYS"]),
        (["sub"], ["MC0_BROKER", "MC0_KEYS"]),
        (["stats"], ["MC0_BROKER", "MC0_KEYS"]),
        (["broker"], ["MC0_KEYS"]),
        (["sexp", "pub"], ["MC0_SEXP"]),
        (["msgq", "sub"], ["MC0_MSGQ"]),
        (["rstreams", "sub"], ["MC0_RSTREAMS"]),
        (["lumberjack", "ship"], ["MC0_LUMBERJACK"]),
        (["health"], ["MC0_HTTP"]),
    ],
)
def test_help_shows_the_environment_variables(command: list[str], shown: list[str]) -> None:
    result = CliRunner().invoke(main, [*command, "--help"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())  # the help wraps lines anywhere
    for variable in shown:
        assert f"env var: {variable}" in text


def test_help_texts_speak_of_the_product_only() -> None:
    for command in (["--help"], ["sexp", "--help"], ["msgq", "--help"], ["rstreams", "--help"],
                    ["lumberjack", "--help"], ["broker", "--help"]):
        output = CliRunner().invoke(main, command).output
        assert "seed" not in output
        assert "ROUTER" not in output


def test_keys_client_makes_a_client_pair_only_and_says_how_to_admit_it(tmp_path: Path) -> None:
    folder = tmp_path / "keys"
    result = CliRunner().invoke(main, ["keys", "client", "alice", "--keys", str(folder)])
    assert result.exit_code == 0, result.output
    public = key_files.load(folder / "alice.key").public.decode()
    assert f"admit it on the broker's machine: {key_files.admit_command(public, 'alice')}" in result.output
    assert "copy the broker's broker.key" in result.output
    assert sorted(path.name for path in folder.iterdir()) == ["alice.key", "alice.key_secret"]
    again = CliRunner().invoke(main, ["keys", "client", "alice", "--keys", str(folder)])
    assert again.exit_code == 1
    assert "exists already" in again.output


def test_a_key_that_starts_with_a_dash_is_admitted_and_its_command_says_so(tmp_path: Path) -> None:
    """Z85 has "-" among its 85 characters: one key in 85 starts with it, and was refused as an option."""
    dash = z85.encode((63 * 85**4).to_bytes(4, "big") + bytes(range(28))).decode()
    assert dash.startswith("-")
    assert key_files.admit_command(dash, "bob") == f"mc0 keys admit bob -- {dash}"
    assert key_files.admit_command("abc", "bob") == "mc0 keys admit bob abc"
    folder = tmp_path / "keys"
    for name, arguments in (("bob", [dash]), ("carol", ["--", dash])):  # as typed, and as the hint says
        result = CliRunner().invoke(main, ["keys", "admit", "--keys", str(folder), name, *arguments])
        assert result.exit_code == 0, result.output
        assert zmq.auth.load_certificate(folder / "allowed" / f"{name}.key")[0].decode() == dash


def test_declare_segment_bytes_says_the_broker_s_minimum() -> None:
    help_text = CliRunner().invoke(main, ["declare", "--help"]).output
    assert "(at least 1024)" in help_text
    result = CliRunner().invoke(main, ["declare", "t", "--segment-bytes", "10", "--no-curve"])
    assert result.exit_code == 2
    assert "10 is not in the range x>=1024" in result.output


def test_a_reader_that_goes_away_is_no_error(broker: Broker) -> None:
    """``mc0 stats | head -1``: the pipe closes before mc0 writes; it stops quietly, with status 0."""
    process = subprocess.Popen([sys.executable, "-c", "from connector.cli import main; main()", "stats",
                                "--json", "--no-curve", "--broker", broker.endpoint],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout is not None
    process.stdout.close()  # nobody reads: the first write meets a broken pipe
    _, err = process.communicate(timeout=20)
    assert process.returncode == 0, err
    assert b"Broken pipe" not in err
    assert err == b""
