"""The README's two commands stay true: CI runs exactly its test command, and its broker command is real."""

from __future__ import annotations

import re
from pathlib import Path

from click.testing import CliRunner

from connector.cli import main

ROOT = Path(__file__).resolve().parent.parent


def readme_commands() -> list[str]:
    blocks = re.findall(r"```sh\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    return [line.strip() for block in blocks for line in block.splitlines() if "pip install" in line]


def test_ci_runs_exactly_the_readme_test_command() -> None:
    tests = [command for command in readme_commands() if "pytest" in command]
    assert len(tests) == 1, tests
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert tests[0] in ci_lines


def test_the_readme_broker_command_installs_and_runs_mc0_broker() -> None:
    brokers = [command for command in readme_commands() if "mc0 broker" in command]
    assert len(brokers) == 1, brokers
    assert brokers[0].endswith("&& mc0 broker"), "the broker must start with embedded defaults, no options"
    result = CliRunner().invoke(main, ["broker", "--help"])
    assert result.exit_code == 0
    assert "--config" in result.output
