""":mod:`pipeline.worker`: the objects alive at a reused Spark worker's first mc0 task are frozen out of the
garbage collector's way once, and nothing happens anywhere else. Each case runs in a process of its own (a
freeze lasts for the life of the process)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pipeline.worker import REUSED_WORKER

PROBE = """
import gc
from pipeline import worker
print(gc.get_freeze_count() == 0, worker.settle(), gc.get_freeze_count() > 0, worker.settle())
"""


@pytest.mark.parametrize(("reused", "expected"), [
    ("1", "True True True False"),  # frozen at the first call, not again
    ("", "True False False False"),  # not a reused worker: nothing frozen
])
def test_a_reused_worker_freezes_once_and_nothing_else_does(reused: str, expected: str) -> None:
    environment = {key: value for key, value in os.environ.items() if key != REUSED_WORKER}
    if reused:
        environment[REUSED_WORKER] = reused
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [root, environment.get("PYTHONPATH")]))
    result = subprocess.run([sys.executable, "-c", PROBE], env=environment, capture_output=True, text=True,
                            timeout=60, check=True)
    assert result.stdout.split() == expected.split()
