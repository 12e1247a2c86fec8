"""The broker's heap settings (:func:`broker.server.return_large_frees`): a loop turn's worth of freed
batches stays in the heap for the next turn instead of coming back a page fault at a time. Run in a process
of its own, since the settings are the whole process's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

TURNS = """
import resource, sys
sys.path.insert(0, {root!r})
from broker.server import return_large_frees
settled = return_large_frees() if sys.argv[1] == "set" else None

def turn():  # twelve batches of 300 KB, as a turn storing a pipelining publisher's PUTS frees them
    blocks = [bytearray(300_000) for _ in range(12)]
    del blocks

turn()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    turn()
print(settled, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def faults(mode: str) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", TURNS.format(root=str(ROOT)), mode], capture_output=True,
                         text=True, check=True, timeout=60).stdout.split()
    return out[0], int(out[1])


def test_freed_batches_are_kept_for_the_next_turn() -> None:
    settled, with_settings = faults("set")
    _, without = faults("unset")
    assert settled == "True"
    assert without > 5_000  # 36 MB zeroed afresh: this machine's glibc gives the memory back each turn
    assert with_settings < 500
