"""The container recipe, checked without a Docker engine.

Parses the Dockerfile, docker-compose.yml and .dockerignore and checks what a broken image would get
wrong: the base image, a non-root user, the project installed with pip, port 61616, the /keys and /data
volumes, and a command and healthcheck (``mc0 health``, the monitoring endpoint's /healthz) that are real
``mc0`` invocations (asked of the CLI itself through
click's test runner when it can be imported). Also checks with ``git check-ignore`` that the keys folder
keeps secrets out of git.
"""

from __future__ import annotations

import importlib
import json
import re
import shlex
import subprocess
import tomllib
from pathlib import Path

import click
import pytest
import yaml
from click.testing import CliRunner

from broker.config import DEFAULTS

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"
COMPOSE = ROOT / "docker-compose.yml"
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
    """``argv`` names an mc0 subcommand that exists, and every option it passes is one that subcommand has."""
    assert argv[0] == "mc0", argv
    group = mc0_group()
    subcommand = argv[1]
    assert subcommand in group.commands, f"`mc0 {subcommand}` is not a command of the CLI"
    result = CliRunner().invoke(group, [subcommand, "--help"])
    assert result.exit_code == 0, result.output
    options = [item.split("=", 1)[0] for item in argv[2:] if item.startswith("--")]
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
