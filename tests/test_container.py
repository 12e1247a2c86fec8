"""The container recipe, checked without a Docker engine.

Parses the Dockerfile, docker-compose.yml and .dockerignore and checks what a broken image would get
wrong: the base image, a non-root user, the project installed with pip, port 61616, the /keys and /data
volumes, and a command and healthcheck (``mc0 health``, the monitoring endpoint's /healthz) that are real
``mc0`` invocations (asked of the CLI itself through
click's test runner when it can be imported). Also checks with ``git check-ignore`` that the keys folder
keeps secrets out of git.

docker-compose.cluster.yml (three brokers as one cluster, docs/cluster.md) is checked the same way, and
more: each member's peers are exactly the other brokers, its advertised endpoint is its own name and port,
published under the same number, the brokers share the keys volume a one-shot ``keys`` service fills and
have a data volume each. Then its commands run as local processes (the service names read as 127.0.0.1,
every port made a free loopback one, the volumes temporary folders): a leader is elected, a strong publish is
confirmed, and each member's healthcheck passes.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import click
import pytest
import yaml
from click.testing import CliRunner

from bench.throughput import free_port
from broker.config import DEFAULTS
from connector import Client, ConnectorError

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"
COMPOSE = ROOT / "docker-compose.yml"
CLUSTER_COMPOSE = ROOT / "docker-compose.cluster.yml"
DOCKERIGNORE = ROOT / ".dockerignore"
PORT = 61616
BROKER_COMMAND = ["mc0", "broker", "--bind", f"tcp://0.0.0.0:{PORT}", "--keys", "/keys", "--data-dir",
                  "/data"]
#: The healthcheck asks the monitoring endpoint on the container's loopback (no keys needed).
HEALTH_COMMAND = ["mc0", "health", "--http", "127.0.0.1:8222"]


# ------------------------------------------------------------------------------------------------- parsing


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs: comments dropped, backslash continuations joined."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        keyword, _, arguments = full.partition(" ")
        instructions.append((keyword.upper(), arguments.strip()))
    assert not pending, "the Dockerfile ends inside a continued line"
    return instructions


def exec_form(arguments: str) -> list[str]:
    """The argv of an exec-form (JSON array) ENTRYPOINT/CMD/HEALTHCHECK CMD; fails on the shell form."""
    assert arguments.startswith("["), f"not in exec form (a JSON array): {arguments}"
    argv = json.loads(arguments)
    assert isinstance(argv, list), arguments
    assert all(isinstance(item, str) for item in argv), arguments
    return argv


def last(instructions: list[tuple[str, str]], keyword: str) -> str | None:
    found = [arguments for name, arguments in instructions if name == keyword]
    return found[-1] if found else None


def container_argv(instructions: list[tuple[str, str]]) -> list[str]:
    """What the container runs by default: ENTRYPOINT followed by CMD, both in exec form."""
    entrypoint = last(instructions, "ENTRYPOINT")
    command = last(instructions, "CMD")
    return (exec_form(entrypoint) if entrypoint else []) + (exec_form(command) if command else [])


def dockerignore_excludes(patterns: list[str], path: str) -> bool:
    """Whether Docker leaves ``path`` (relative to the context) out of the build context.

    Docker's rules: patterns are anchored at the context root, ``*`` and ``?`` stay inside one path element,
    ``**`` spans any number of them, a pattern matching a folder excludes everything in it, ``!`` re-includes,
    and the last matching pattern wins.
    """

    def regex(pattern: str) -> re.Pattern[str]:
        out = ""
        index = 0
        while index < len(pattern):
            if pattern.startswith("**/", index):
                out += "(?:.*/)?"
                index += 3
            elif pattern.startswith("**", index):
                out += ".*"
                index += 2
            elif pattern[index] == "*":
                out += "[^/]*"
                index += 1
            elif pattern[index] == "?":
                out += "[^/]"
                index += 1
            elif pattern[index] == "[":
                end = pattern.index("]", index)
                out += pattern[index : end + 1]
                index = end + 1
            else:
                out += re.escape(pattern[index])
                index += 1
        return re.compile(out + r"\Z")

    parts = path.split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    excluded = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        compiled = regex(pattern.lstrip("!").strip("/"))
        if any(compiled.match(prefix) for prefix in prefixes):
            excluded = not negate
    return excluded


@pytest.fixture(scope="module")
def instructions() -> list[tuple[str, str]]:
    return dockerfile_instructions(DOCKERFILE.read_text())


@pytest.fixture(scope="module")
def compose() -> dict:
    document = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(document, dict), "docker-compose.yml is not a mapping"
    return document


@pytest.fixture(scope="module")
def broker_service(compose: dict) -> dict:
    service = compose.get("services", {}).get("broker")
    assert isinstance(service, dict), "docker-compose.yml has no `broker` service"
    return service


def mc0_group() -> click.Group:
    """The click group behind the ``mc0`` console script; skips the caller when the CLI cannot be imported."""
    target = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["mc0"]
    module_name, _, attribute = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name != module_name:
            raise  # the CLI exists but is broken: that is a failure, not a reason to skip
        pytest.skip(f"{module_name} does not exist yet, so the mc0 CLI cannot be asked about its options")
    entry = getattr(module, attribute, None)
    if isinstance(entry, click.Group):
        return entry
    groups = [value for value in vars(module).values() if isinstance(value, click.Group)]
    assert groups, f"{module_name} defines no click group for the `mc0` console script ({target})"
    return groups[0]


def assert_real_invocation(argv: list[str]) -> None:
    """``argv`` names an mc0 subcommand that exists (``mc0 keys generate``: a command of a group), and every
    option it passes is one that subcommand has."""
    assert argv[0] == "mc0", argv
    group = mc0_group()
    command: click.Command = group
    path: list[str] = []
    rest = argv[1:]
    while isinstance(command, click.Group) and rest and not rest[0].startswith("-"):
        named = " ".join(["mc0", *path, rest[0]])
        assert rest[0] in command.commands, f"`{named}` is not a command of the CLI"
        command = command.commands[rest[0]]
        path.append(rest.pop(0))
    assert path, f"no subcommand in {argv}"
    subcommand = " ".join(path)
    result = CliRunner().invoke(group, [*path, "--help"])
    assert result.exit_code == 0, result.output
    options = [item.split("=", 1)[0] for item in rest if item.startswith("--")]
    for option in options:
        assert re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", result.output), (
            f"`mc0 {subcommand} --help` does not list {option}:\n{result.output}"
        )


# ------------------------------------------------------------------------------------------------ Dockerfile


def test_dockerfile_is_built_on_python_311_slim(instructions: list[tuple[str, str]]) -> None:
    bases = [arguments.split()[0] for name, arguments in instructions if name == "FROM"]
    assert bases, "the Dockerfile has no FROM"
    assert re.fullmatch(r"python:3\.11-slim(@sha256:[0-9a-f]{64})?", bases[-1]), bases[-1]


def test_dockerfile_runs_as_a_non_root_user(instructions: list[tuple[str, str]]) -> None:
    user = last(instructions, "USER")
    assert user is not None, "the image would run as root: no USER instruction"
    assert user.split(":")[0] not in {"root", "0"}, user


def test_dockerfile_installs_the_project_with_pip(instructions: list[tuple[str, str]]) -> None:
    copies = [arguments for name, arguments in instructions if name in {"COPY", "ADD"}]
    assert any(arguments.split()[:1] == ["."] for arguments in copies), f"the project is not copied: {copies}"
    runs = [shlex.split(arguments) for name, arguments in instructions if name == "RUN"]
    installs = [argv for argv in runs if "pip" in argv and "install" in argv]
    assert installs, "no RUN pip install"
    assert any("." in argv and "--no-cache-dir" in argv for argv in installs), installs


def test_dockerfile_exposes_the_mc0_port(instructions: list[tuple[str, str]]) -> None:
    exposed = [port for name, arguments in instructions if name == "EXPOSE" for port in arguments.split()]
    assert str(PORT) in exposed or f"{PORT}/tcp" in exposed, exposed


def test_dockerfile_declares_keys_and_data_volumes_and_workdir(instructions: list[tuple[str, str]]) -> None:
    volumes: list[str] = []
    for name, arguments in instructions:
        if name == "VOLUME":
            volumes += exec_form(arguments) if arguments.startswith("[") else arguments.split()
    assert {"/keys", "/data"} <= set(volumes), volumes
    assert last(instructions, "WORKDIR") == "/var/lib/mc0"


def test_dockerfile_command_is_the_broker_in_exec_form(instructions: list[tuple[str, str]]) -> None:
    assert container_argv(instructions) == BROKER_COMMAND


def test_dockerfile_healthcheck_asks_the_monitoring_endpoint(instructions: list[tuple[str, str]]) -> None:
    healthcheck = last(instructions, "HEALTHCHECK")
    assert healthcheck is not None, "no HEALTHCHECK"
    _, _, command = healthcheck.partition("CMD ")
    assert exec_form(command.strip()) == HEALTH_COMMAND


def test_dockerfile_command_is_a_real_cli_invocation(instructions: list[tuple[str, str]]) -> None:
    argv = container_argv(instructions)
    assert_real_invocation(argv)
    assert argv[1] == "broker"


# -------------------------------------------------------------------------------------------- docker compose


def test_compose_builds_the_broker_from_the_dockerfile(broker_service: dict) -> None:
    build = broker_service.get("build")
    context = build if isinstance(build, str) else (build or {}).get("context")
    assert context == ".", build
    if isinstance(build, dict):
        assert build.get("dockerfile", "Dockerfile") == "Dockerfile"


def test_compose_publishes_port_61616(broker_service: dict) -> None:
    targets = []
    for entry in broker_service.get("ports", []):
        if isinstance(entry, dict):
            targets.append(int(entry["target"]))
        else:
            targets.append(int(str(entry).split("/")[0].rsplit(":", 1)[-1]))
    assert PORT in targets, broker_service.get("ports")


def test_compose_keeps_keys_and_data_in_named_volumes(compose: dict, broker_service: dict) -> None:
    mounts: dict[str, str] = {}
    for entry in broker_service.get("volumes", []):
        if isinstance(entry, dict):
            mounts[entry["target"]] = entry.get("source", "")
        else:
            source, target = str(entry).split(":")[:2]
            mounts[target] = source
    declared = set(compose.get("volumes") or {})
    for target in ("/keys", "/data"):
        assert target in mounts, f"{target} is not mounted: {broker_service.get('volumes')}"
        assert mounts[target] in declared, f"{target} is not on a named volume declared under `volumes:`"


def test_compose_restarts_the_broker(broker_service: dict) -> None:
    assert broker_service.get("restart") in {"always", "unless-stopped", "on-failure"}, broker_service.get(
        "restart"
    )


def health_argv(service: dict) -> list[str]:
    """The healthcheck's command line, from the exec form (CMD) or the shell form (CMD-SHELL)."""
    test = service.get("healthcheck", {}).get("test")
    assert isinstance(test, list), f"healthcheck test should be a list: {test!r}"
    kind, *argv = test
    assert kind in {"CMD", "CMD-SHELL"}, test
    return shlex.split(argv[0]) if kind == "CMD-SHELL" else argv


def test_compose_healthcheck_is_mc0_health(broker_service: dict) -> None:
    assert health_argv(broker_service) == HEALTH_COMMAND


def test_compose_healthcheck_is_a_real_cli_invocation(broker_service: dict) -> None:
    argv = health_argv(broker_service)
    assert_real_invocation(argv)
    assert argv[1] == "health"


def test_compose_command_runs_the_broker(instructions: list[tuple[str, str]], broker_service: dict) -> None:
    command = broker_service.get("command")
    if command is None:
        argv = container_argv(instructions)
    else:
        entrypoint = exec_form(last(instructions, "ENTRYPOINT") or "[]")
        argv = entrypoint + (command if isinstance(command, list) else shlex.split(command))
    assert argv == BROKER_COMMAND


# ---------------------------------------------------------------------------------------------- build context


def test_dockerignore_keeps_secrets_data_and_caches_out() -> None:
    patterns = [line.strip() for line in DOCKERIGNORE.read_text().splitlines()
                if line.strip() and not line.strip().startswith("#")]
    left_out = (".git/config", "keys/broker.key_secret", "keys/allowed/client.key", "data/topic/0.log",
                "broker/__pycache__/engine.cpython-311.pyc", ".pytest_cache/v/cache", "tools/x.key_secret",
                # what following the README leaves in the folder: the broker's logs where the defaults put
                # them, a configuration file, the example job's outputs
                f"{DEFAULTS.data_dir}/orders/00000000000000000001.log", "mc0.toml",
                "log-counts.parquet/part-0.parquet", "log-counts.checkpoint/offsets/0")
    for path in left_out:
        assert dockerignore_excludes(patterns, path), f"{path} would be sent to the Docker build"
    readme = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"].get("readme", "README.md")
    for path in ("pyproject.toml", readme, "broker/engine.py", "connector/keys.py", "protocol/mc0.py",
                 "pipeline/__init__.py"):
        assert not dockerignore_excludes(patterns, path), f"{path} is needed by pip install but ignored"


def test_the_documented_compose_command_keeps_the_images_command(
    instructions: list[tuple[str, str]],
) -> None:
    """docs/configuration.md shows how to add a configuration file to the compose command: every argument of
    the image's own command must still be there (the data directory was once left out)."""
    text = (ROOT / "docs" / "configuration.md").read_text()
    fragment = text.split("```yaml", 1)[1].split("```", 1)[0]
    command = yaml.safe_load(fragment)["command"]
    image = container_argv(instructions)[1:]  # without the entrypoint: broker, then option and value pairs
    assert command[0] == image[0] == "broker"
    for index in range(1, len(image), 2):
        option = image[index : index + 2]
        at = command.index(option[0]) if option[0] in command else -1
        assert command[at : at + 2] == option, f"the documented command drops {option}: {command}"


# ----------------------------------------------------------------------------------------------------- keys/


def git_ignores(path: str) -> bool:
    result = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "-q", "--no-index", path],
                            capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode in (0, 1), result.stderr
    return result.returncode == 0


def test_keys_folder_keeps_secrets_out_of_git() -> None:
    for path in ("keys/broker.key_secret", "keys/x.key", "keys/client.key_secret", "keys/allowed/x.key"):
        assert git_ignores(path), f"git would track {path}"
    for path in ("keys/README.md", "keys/.gitignore"):
        assert not git_ignores(path), f"git ignores {path}, which belongs in the repository"


# ------------------------------------------------------------------------------- docker compose, a cluster


def cluster_document() -> dict:
    document = yaml.safe_load(CLUSTER_COMPOSE.read_text())
    assert isinstance(document, dict), "docker-compose.cluster.yml is not a mapping"
    return document


@pytest.fixture(scope="module")
def cluster_compose() -> dict:
    return cluster_document()


def brokers_of(document: dict) -> dict[str, dict]:
    """The services that run ``mc0 broker``, by name."""
    services = document.get("services", {})
    return {name: service for name, service in services.items()
            if (service.get("command") or [None])[0] == "broker"}


def options_of(command: list[str]) -> dict[str, list[str]]:
    """``--option value`` pairs of a command (after its subcommand), each option with every value it got."""
    options: dict[str, list[str]] = {}
    rest = command[1:]
    assert len(rest) % 2 == 0, f"an option without its value: {command}"
    for option, value in zip(rest[::2], rest[1::2], strict=True):
        assert option.startswith("--"), f"{option!r} is not an option: {command}"
        options.setdefault(option, []).append(value)
    return options


def mounts_of(service: dict) -> dict[str, str]:
    """Container path -> volume name (or host path) of a service's volumes."""
    mounts = {}
    for entry in service.get("volumes", []):
        source, target = str(entry).split(":")[:2]
        mounts[target] = source
    return mounts


def published(service: dict) -> list[tuple[int, int]]:
    """(host port, container port) of each published port."""
    pairs = []
    for entry in service.get("ports", []):
        host, _, container = str(entry).split("/")[0].rpartition(":")
        pairs.append((int(host.rpartition(":")[2]), int(container)))
    return pairs


def test_cluster_compose_runs_three_brokers_of_the_one_image(cluster_compose: dict) -> None:
    brokers = brokers_of(cluster_compose)
    assert len(brokers) == 3, f"a cluster of three: {sorted(brokers)}"
    for name, service in brokers.items():
        assert service.get("image") == "mc0:latest", name
        build = service.get("build") or {}
        assert build.get("context") == ".", name
        assert build.get("dockerfile", "Dockerfile") == "Dockerfile", name
        assert service.get("restart") in {"always", "unless-stopped", "on-failure"}, name
        assert health_argv(service) == HEALTH_COMMAND, name


def test_cluster_compose_commands_are_real_cli_invocations(
    instructions: list[tuple[str, str]], cluster_compose: dict
) -> None:
    image = container_argv(instructions)[1:]
    image_options = options_of(image)
    for name, service in brokers_of(cluster_compose).items():
        command = service["command"]
        assert_real_invocation(["mc0", *command])
        assert_real_invocation(health_argv(service))
        options = options_of(command)
        # The image's own command is all there: keys and data in their volumes, mc0 on every interface.
        assert options["--keys"] == image_options["--keys"], name
        assert options["--data-dir"] == image_options["--data-dir"], name
        assert options["--bind"][0].startswith("tcp://0.0.0.0:"), (name, options["--bind"])


def test_cluster_compose_members_name_each_other(cluster_compose: dict) -> None:
    brokers = brokers_of(cluster_compose)
    nodes = {name: options_of(service["command"])["--cluster-node"] for name, service in brokers.items()}
    for name, node in nodes.items():
        assert len(node) == 1, f"{name} has Raft addresses {node}"
        assert node[0].rpartition(":")[0] == name, f"{name}'s Raft address is {node}"
    for name, service in brokers.items():
        peers = options_of(service["command"]).get("--cluster-peer", [])
        others = sorted(node[0] for other, node in nodes.items() if other != name)
        assert sorted(peers) == others, f"{name}'s peers are {peers}, the other brokers are {others}"


def test_cluster_compose_ports_are_each_brokers_own_and_consistent(cluster_compose: dict) -> None:
    host_ports = []
    for name, service in brokers_of(cluster_compose).items():
        options = options_of(service["command"])
        port = int(options["--bind"][0].rpartition(":")[2])
        # What a follower names (LEADER) must work from the others and, with the names mapped, from the host.
        assert options["--advertise"] == [f"tcp://{name}:{port}"], (name, options["--advertise"])
        assert published(service) == [(port, port)], f"{name} publishes {service.get('ports')}, binds {port}"
        host_ports.append(port)
    assert len(set(host_ports)) == len(host_ports), f"two brokers publish the same port: {host_ports}"


def test_cluster_compose_shares_the_keys_and_gives_each_broker_its_data(cluster_compose: dict) -> None:
    declared = set(cluster_compose.get("volumes") or {})
    brokers = brokers_of(cluster_compose)
    keys_volumes = {mounts_of(service).get("/keys") for service in brokers.values()}
    data_volumes = [mounts_of(service).get("/data") for service in brokers.values()]
    assert len(keys_volumes) == 1, f"one shared keys volume: {keys_volumes}"
    assert keys_volumes <= declared, f"the keys volume is not declared under volumes: {keys_volumes}"
    assert len(set(data_volumes)) == len(data_volumes), f"the brokers share a data volume: {data_volumes}"
    assert set(data_volumes) <= declared, f"data volumes not declared under volumes: {data_volumes}"
    # The keys are made once, before any broker starts: each would otherwise make a pair of its own.
    services = cluster_compose["services"]
    makers = [name for name, service in services.items() if (service.get("command") or [None])[0] == "keys"]
    assert len(makers) == 1, makers
    maker = services[makers[0]]
    assert_real_invocation(["mc0", *maker["command"]])
    assert maker["command"][:2] == ["keys", "generate"]
    assert options_of(maker["command"][1:]).get("--keys") == ["/keys"]
    assert mounts_of(maker).get("/keys") in keys_volumes
    assert maker.get("restart", "no") == "no"
    for name, service in brokers.items():
        condition = (service.get("depends_on") or {}).get(makers[0], {}).get("condition")
        assert condition == "service_completed_successfully", f"{name} may start before the keys exist"


def test_cluster_compose_is_documented() -> None:
    text = (ROOT / "docs" / "cluster.md").read_text()
    assert CLUSTER_COMPOSE.name in text


class ComposeOnLoopback:
    """The compose file's commands as local processes: service names read as 127.0.0.1, each (service, port)
    a free loopback port, /keys and /data temporary folders."""

    def __init__(self, document: dict, folder: Path) -> None:
        self.document = document
        self.folder = folder
        self.services = set(document["services"])
        self.ports: dict[tuple[str, int], int] = {}
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    def port(self, service: str, port: int) -> int:
        if (service, port) not in self.ports:
            chosen = free_port()
            while chosen in self.ports.values():  # handed out already, but not bound yet (Raft binds late)
                chosen = free_port()
            self.ports[(service, port)] = chosen
        return self.ports[(service, port)]

    def argv(self, service: str, command: list[str]) -> list[str]:
        out = []
        for item in command:
            bind = re.fullmatch(r"tcp://0\.0\.0\.0:(\d+)", item)
            named = re.fullmatch(r"(tcp://)?([\w.-]+):(\d+)", item)
            if bind:
                item = f"tcp://127.0.0.1:{self.port(service, int(bind.group(1)))}"
            elif named and named.group(2) in self.services:
                item = f"{named.group(1) or ''}127.0.0.1:{self.port(named.group(2), int(named.group(3)))}"
            elif named and named.group(2) == "127.0.0.1":  # the container's own loopback
                item = f"{named.group(1) or ''}127.0.0.1:{self.port(service, int(named.group(3)))}"
            elif item == "/keys":
                item = str(self.folder / "keys")
            elif item == "/data":
                item = str(self.folder / service / "data")
            out.append(item)
        return out

    def run(self, service: str, command: list[str], *, background: bool = False) -> subprocess.Popen[bytes]:
        argv = [sys.executable, "-c", "from connector.cli import main; main()", *self.argv(service, command)]
        if command[0] == "broker":
            # In a container these doors listen on its own loopback; three on one machine would collide.
            argv += ["--sexp", "off", "--msgq", "off", "--rstreams", "off", "--lumberjack", "off",
                     "--http", f"127.0.0.1:{self.port(service, 8222)}"]
        (self.folder / service).mkdir(parents=True, exist_ok=True)
        log = (self.folder / service / "log").open("ab")
        process = subprocess.Popen(argv, cwd=self.folder / service, stdout=log, stderr=log)
        log.close()
        if background:
            self.processes[service] = process
        return process

    def log(self, service: str) -> str:
        return (self.folder / service / "log").read_text(errors="replace")

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes.values():
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@pytest.mark.timeout(150)
def test_cluster_compose_commands_elect_a_leader_and_confirm_a_strong_publish(tmp_path: Path) -> None:
    document = cluster_document()
    local = ComposeOnLoopback(document, tmp_path)
    services = document["services"]
    brokers = brokers_of(document)
    try:
        for name, service in services.items():
            if name not in brokers:  # the one-shot services first (the keys), as depends_on orders them
                assert local.run(name, service["command"]).wait(60) == 0, local.log(name)
        for name, service in brokers.items():
            local.run(name, service["command"], background=True)
        endpoints = [local.argv(name, options_of(service["command"])["--advertise"])[0]
                     for name, service in brokers.items()]
        deadline = time.monotonic() + 60
        reply = None
        while reply is None:
            for name, process in local.processes.items():
                assert process.poll() is None, f"{name} exited:\n{local.log(name)[-3000:]}"
            try:
                with Client(endpoints, keys=tmp_path / "keys", timeout=5) as client:
                    reply = client.publish("durable.compose", "hello", confirm=True, timeout=5)
                    view = client.stats()["limits"]["cluster"]
            except ConnectorError:
                logs = "\n".join(f"--- {name}\n{local.log(name)[-1500:]}" for name in brokers)
                assert time.monotonic() < deadline, f"no leader confirmed a publish within 60 s\n{logs}"
                time.sleep(0.5)
        assert reply is not None
        assert reply["DURABILITY"] == "fsync", reply
        assert view["serving"], view
        assert view["size"] == 3, view
        assert view["leader_endpoint"] in endpoints, view
        for name, service in brokers.items():
            check = subprocess.run(
                [sys.executable, "-c", "from connector.cli import main; main()",
                 *local.argv(name, health_argv(service))[1:]],
                capture_output=True, text=True, timeout=30, env=dict(os.environ))
            assert check.returncode == 0, f"{name}'s healthcheck failed: {check.stdout}{check.stderr}"
    finally:
        local.stop()
