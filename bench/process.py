"""A broker in a process of its own, on a fresh data directory, for the benchmarks that need a store."""

from __future__ import annotations

import multiprocessing as mp
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


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
