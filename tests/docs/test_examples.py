"""Every example in the README and docs/ works as written.

For each page, in order, in a fresh folder, against a real broker started with the embedded defaults:

* a ```` ```sh ```` block runs in bash (``-e -o pipefail``); a ```` ```python ```` block runs as a script;
* a ```` ```toml ```` block loads as a broker configuration file;
* an ```` ```output ```` block right after a block lists lines its output (stdout and stderr, as one stream)
  must contain, in that order;
* a block that cannot run here says why on the line just above its fence:
  ``<!-- not-runnable: the reason -->``;
* a fenced block without a language holds wire notation or file layouts, never commands (a command there
  would escape the test).

The broker is what ``mc0 broker`` starts in an empty folder: CURVE on with its keys created in ``./keys``, its
logs in ``./mc0-data``, the default topic rules. Only its ports differ, because tests never use the fixed
ones: a default port written in a block (61616, 61617, ...) is read as this broker's, and ``MC0_BROKER``,
``MC0_SEXP``, ``MC0_MSGQ``, ``MC0_RSTREAMS``, ``MC0_LUMBERJACK`` and ``MC0_HTTP`` point the commands at it.

A page whose examples start brokers of their own (docs/cluster.md's three) names the fixed ports they use in a
comment anywhere on the page, ``<!-- example-ports: 61701 61702 7001 -->``: each is read as a free loopback
port, the same one in every block of the page. What a block leaves running in the background (``... &``) may
serve the page's later blocks; it is stopped once the page is done (each block runs in a process group of its
own, and the groups get SIGTERM, then SIGKILL), whether the page passed or not. A background process sends
its output to a file: the block's output, and so the block, ends only once every process holding it is gone.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from conftest import free_port

from broker.config import ConfigError, load

if TYPE_CHECKING:
    from conftest import BrokerFactory

    from broker.server import Broker

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "keys" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUNS = {"sh", "python"}
NOT_RUNNABLE = re.compile(r"^<!-- not-runnable: (.+) -->$")
EXAMPLE_PORTS = re.compile(r"^<!-- example-ports: ([\d ]+) -->$", re.M)
FENCE = re.compile(r"^\s*```([\w-]*)\s*$")  # indented too: a block inside a list item
#: What a command looks like, so that one hidden in a block without a language is caught.
COMMAND = re.compile(r"^\s*(\$ |mc0 |python3? |pip |docker |curl |printf |tail )")
#: How long one block may run.
BLOCK_TIMEOUT = 120
#: Seconds the processes a page left in the background have to stop on SIGTERM before they get SIGKILL.
STOP_GRACE = 10


@dataclass
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    language: str
    text: str
    not_runnable: str | None = None
    expected: list[str] = field(default_factory=list)  # from an ```output block right after it

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of ``page`` in order, each with its marker and expected output, if any."""
    lines = page.read_text().splitlines()
    found: list[Block] = []
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        start = index
        index += 1
        indent = len(lines[start]) - len(lines[start].lstrip())
        body: list[str] = []
        while index < len(lines) and lines[index].strip() != "```":
            body.append(lines[index][indent:] if lines[index][:indent].isspace() else lines[index])
            index += 1
        index += 1  # the closing fence
        marker = NOT_RUNNABLE.match(lines[start - 1].strip()) if start else None
        language = opening.group(1)
        text = "\n".join(body) + "\n"
        if language == "output" and found:
            found[-1].expected = [line.strip() for line in body if line.strip()]
            continue
        found.append(Block(page, start + 1, language, text, marker.group(1) if marker else None))
    return found


def test_every_page_is_looked_at() -> None:
    assert len(PAGES) >= 12
    assert sum(1 for page in PAGES for block in blocks(page) if block.language in RUNS) >= 20


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_blocks_say_what_they_are(page: Path) -> None:
    """Markers carry a reason; output blocks follow a block that runs; no command hides without a language."""
    for block in blocks(page):
        if block.not_runnable is not None:
            assert len(block.not_runnable.split()) >= 3, f"{block.where}: say why it cannot run"
        if block.expected:
            assert block.language in RUNS, f"{block.where}: an output block follows a block that does not run"
            assert block.not_runnable is None, f"{block.where}: an output block follows a block not run"
        if block.language == "":
            hidden = [line for line in block.text.splitlines() if COMMAND.match(line)]
            assert not hidden, f"{block.where}: commands in a block without a language (mark it sh): {hidden}"


# ------------------------------------------------------------------------------------------- running a page


def ports(broker: Broker) -> dict[str, str]:
    """Each default port written in the docs, and this broker's port for it."""
    endpoint_port = broker.endpoint.rsplit(":", 1)[1]
    out = {"61616": endpoint_port}
    for name, default in (("sexp", "61617"), ("msgq", "9912"), ("rstreams", "61618"), ("lumberjack", "5044")):
        out[default] = str(broker.gateway_address(name)[1])
    if broker.http_address is not None:
        out["8222"] = str(broker.http_address[1])
    return out


def environment(broker: Broker) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("MC0_")}
    env["MC0_BROKER"] = broker.endpoint
    for name in ("sexp", "msgq", "rstreams", "lumberjack"):
        host, port = broker.gateway_address(name)
        env[f"MC0_{name.upper()}"] = f"{host}:{port}"
    if broker.http_address is not None:
        env["MC0_HTTP"] = "{}:{}".format(*broker.http_address)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def example_ports(page: Path) -> dict[str, str]:
    """The page's own fixed ports (``<!-- example-ports: ... -->``), each mapped to a free loopback port."""
    declared = [port for found in EXAMPLE_PORTS.findall(page.read_text()) for port in found.split()]
    return {port: str(free_port()) for port in dict.fromkeys(declared)}


def stop_groups(groups: list[int]) -> None:
    """Stop what the page's blocks left running: SIGTERM to each block's process group, SIGKILL to what is
    still there after STOP_GRACE seconds."""
    for group in groups:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE
    for group in groups:
        while time.monotonic() < deadline:
            try:
                os.killpg(group, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)


def localized(text: str, broker_ports: dict[str, str]) -> str:
    for default, actual in broker_ports.items():
        text = re.sub(rf"(?<!\d){default}(?!\d)", actual, text)
    return text


def run(block: Block, folder: Path, env: dict[str, str], broker_ports: dict[str, str],
        groups: list[int] | None = None) -> str:
    """Run one block as written (its ports made this broker's); returns what it printed. The block runs in a
    process group of its own, added to ``groups`` (what it leaves running is stopped with the page)."""
    text = localized(block.text, broker_ports)
    if block.language == "toml":
        path = folder / f"example-{block.line}.toml"
        path.write_text(text)
        try:
            load(path)
        except ConfigError as error:
            pytest.fail(f"{block.where}: this configuration does not load: {error}")
        return ""
    if block.language == "python":
        script = folder / f"example_{block.line}.py"
        script.write_text(text)
        argv = [sys.executable, str(script)]
    else:
        argv = ["bash", "-e", "-o", "pipefail", "-c", text]
    # One stream, as a terminal shows it: the output check follows the order things were said in.
    process = subprocess.Popen(argv, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, stdin=subprocess.DEVNULL, start_new_session=True)
    if groups is not None:
        groups.append(process.pid)  # the block's process group: its id is the block's process id
    try:
        output, _ = process.communicate(timeout=BLOCK_TIMEOUT)
    except subprocess.TimeoutExpired:
        stop_groups([process.pid])
        output, _ = process.communicate()
        pytest.fail(f"{block.where}: still running after {BLOCK_TIMEOUT} s:\n{block.text}\n{output}")
    assert process.returncode == 0, f"{block.where} exited {process.returncode}:\n{block.text}\n---\n{output}"
    assert "Traceback" not in output, f"{block.where}:\n{output}"
    return output


@pytest.mark.timeout(600)
@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_the_examples_of_a_page_run_as_written(
    page: Path, start_broker: BrokerFactory, tmp_path: Path
) -> None:
    examples = [block for block in blocks(page)
                if block.language in (*RUNS, "toml") and block.not_runnable is None]
    if not examples:
        return  # nothing to run on this page (test_blocks_say_what_they_are looked at it)
    folder = tmp_path / "reader"
    folder.mkdir()
    broker = start_broker(curve=True, keys_dir=folder / "keys", data_dir=folder / "mc0-data")
    env = environment(broker)
    broker_ports = {**example_ports(page), **ports(broker)}
    groups: list[int] = []
    try:
        for block in examples:
            output = run(block, folder, env, broker_ports, groups)
            position = 0
            for expected in (localized(line, broker_ports) for line in block.expected):
                found = output.find(expected, position)
                assert found >= 0, f"{block.where}: {expected!r} not in what it printed (in order):\n{output}"
                position = found + len(expected)
    finally:
        stop_groups(groups)


# ---------------------------------------------------------------------------------------- the harness itself


def test_a_page_may_name_its_own_ports(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("<!-- example-ports: 61701 7001 -->\n\n"
                    "```sh\nmc0 stats --broker 61701 # 7001 617011\n```\n")
    mapped = example_ports(page)
    assert set(mapped) == {"61701", "7001"}
    assert len(set(mapped.values())) == 2
    assert not set(mapped.values()) & set(mapped)
    text = localized(blocks(page)[0].text, mapped)
    assert text == f"mc0 stats --broker {mapped['61701']} # {mapped['7001']} 617011\n"


@pytest.mark.timeout(60)
def test_what_a_block_leaves_running_is_stopped_with_the_page(tmp_path: Path) -> None:
    block = Block(tmp_path / "page.md", 1, "sh", "sleep 300 > /dev/null 2>&1 &\necho $! > sleeper.pid\n")
    groups: list[int] = []
    run(block, tmp_path, dict(os.environ), {}, groups)
    sleeper = int((tmp_path / "sleeper.pid").read_text())
    os.kill(sleeper, 0)  # still running once the block is done: later blocks of the page may use it
    stop_groups(groups)
    deadline = time.monotonic() + 10
    while True:
        try:
            os.kill(sleeper, 0)
        except ProcessLookupError:
            break
        assert time.monotonic() < deadline, "the block's background process outlived its page"
        time.sleep(0.05)
