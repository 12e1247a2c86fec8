"""A broker in a process of its own, on a fresh data directory, for the benchmarks that need a store."""

from __future__ import annotations

import multiprocessing as mp
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

#: The event loop of every benchmark broker a run starts (``--event-loop`` of the benchmarks that offer it):
#: passed to the spawned broker processes through their environment.
EVENT_LOOP_VARIABLE = "MC0_BENCH_EVENT_LOOP"
#: The same for what serves their mc0 port (``--mc0-engine``: auto, native or zeromq).
ENGINE_VARIABLE = "MC0_BENCH_ENGINE"


def choose_event_loop(choice: str | None) -> None:
    """Make the broker processes this run starts use ``choice`` (auto, uvloop, asyncio)."""
    if choice:
        os.environ[EVENT_LOOP_VARIABLE] = choice


def choose_engine(choice: str | None) -> None:
    """Make the broker processes this run starts serve mc0 with ``choice`` (auto, native, zeromq)."""
    if choice:
        os.environ[ENGINE_VARIABLE] = choice


def serve_broker(port: int, ready: Any, *, data_dir: str | None = None, **settings: Any) -> None:
    """Run a benchmark's broker until it is killed: plaintext mc0 on loopback ``port``, every TCP door and the
    monitoring endpoint off unless ``settings`` (BrokerConfig fields) turn one on, errors only in the log;
    ``ready`` is set once it listens. Without ``data_dir`` (transient topics only) the broker is pointed at a
    path under the temporary folder that nothing creates, never at the current folder's data directory."""
    import logging
    from pathlib import Path

    from broker import server
    from broker.config import BrokerConfig

    logging.basicConfig(level=logging.ERROR)
    settings["data_dir"] = Path(data_dir or Path(tempfile.gettempdir()) / f"mc0-bench-{os.getpid()}")
    settings.setdefault("event_loop", os.environ.get(EVENT_LOOP_VARIABLE, "auto"))
    settings.setdefault("mc0_engine", os.environ.get(ENGINE_VARIABLE, "auto"))
    config = BrokerConfig(**{"bind": f"tcp://127.0.0.1:{port}", "curve": False, "sexp": "off", "msgq": "off",
                             "rstreams": "off", "lumberjack": "off", "http": "off", **settings})
    server.run(config, lambda _broker: ready.set())


@contextmanager
def broker_process(serve: Callable[[int, str, Any], None], port: int) -> Iterator[int]:
    """Run ``serve(port, data_dir, ready)`` in a spawned process until the block ends (the block gets its
    pid); the data directory is a temporary one, removed afterwards."""
    spawn = mp.get_context("spawn")
    ready = spawn.Event()
    with tempfile.TemporaryDirectory() as data_dir:
        process = spawn.Process(target=serve, args=(port, data_dir, ready), daemon=True)
        process.start()
        try:
            if not ready.wait(30):
                raise RuntimeError("the broker did not start")
            assert process.pid is not None  # started
            yield process.pid
        finally:
            process.terminate()
            process.join(10)
