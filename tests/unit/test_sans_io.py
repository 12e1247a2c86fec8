"""The sans-IO rule for protocol/: no module there imports zmq, asyncio, socket, threading, logging, time or
select (directly, from a submodule, or through __import__/importlib), and none defines ``async def``.
Checked on the syntax tree, so comments and strings that merely mention those names do not count.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import protocol

FORBIDDEN = frozenset({"zmq", "asyncio", "socket", "threading", "logging", "time", "select"})
PROTOCOL_DIR = Path(protocol.__file__).resolve().parent
MODULES = sorted(PROTOCOL_DIR.rglob("*.py"))


def violations(source: str, filename: str = "<test>") -> list[str]:
    """Every forbidden import and every ``async`` construct in ``source``, as readable strings."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            found += [f"line {node.lineno}: import {a.name}" for a in node.names
                      if a.name.split(".")[0] in FORBIDDEN]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module and node.module.split(".")[0] in FORBIDDEN:
                found.append(f"line {node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.AsyncFunctionDef):
            found.append(f"line {node.lineno}: async def {node.name}")
        elif isinstance(node, ast.AsyncFor | ast.AsyncWith | ast.Await):
            found.append(f"line {node.lineno}: {type(node).__name__}")
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            if name in {"__import__", "import_module"} and node.args:
                target = node.args[0]
                if isinstance(target, ast.Constant) and str(target.value).split(".")[0] in FORBIDDEN:
                    found.append(f"line {node.lineno}: {name}({target.value!r})")
    return found


def test_protocol_package_has_modules() -> None:
    names = {path.name for path in MODULES}
    assert {"__init__.py", "mc0.py", "errors.py"} <= names


@pytest.mark.parametrize("path", MODULES, ids=[str(p.relative_to(PROTOCOL_DIR)) for p in MODULES])
def test_module_is_sans_io(path: Path) -> None:
    assert violations(path.read_text(encoding="utf-8"), str(path)) == []


@pytest.mark.parametrize(
    "source",
    [
        "import zmq",
        "import zmq.asyncio",
        "import os, socket",
        "from asyncio import Queue",
        "from threading import Lock",
        "import logging as log",
        "from time import monotonic",
        "import select",
        "async def f():\n    pass",
        "class C:\n    async def f(self):\n        pass",
        "def f():\n    import time",
        "mod = __import__('socket')",
        "import importlib\nmod = importlib.import_module('zmq.asyncio')",
    ],
)
def test_the_checker_catches_each_kind_of_violation(source: str) -> None:
    assert violations(source)


@pytest.mark.parametrize(
    "source",
    [
        "import msgpack",
        "from protocol.errors import ProtocolError",
        "from . import errors",
        "import struct, zlib",
        "import zmqlike",
        "# import zmq\nx = 'import socket'",
    ],
)
def test_the_checker_allows_innocent_code(source: str) -> None:
    assert violations(source) == []
