"""Smoke test of ``python -m bench spark`` with a tiny topic: the benchmark still runs against the current
source, sink, broker and connector, and judges its targets. It measures nothing at this size.

In a process of its own: the benchmark starts and stops its own Spark session.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(400)
def test_the_spark_benchmark_runs() -> None:
    done = subprocess.run([sys.executable, "-m", "bench", "spark", "--messages", "25000", "--repeat", "1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=380, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line for line in done.stdout.splitlines() if line.endswith("rows/s")]
    assert len(rows) == 7, done.stdout
    assert all(float(row.split()[-2].replace(",", "")) > 0 for row in rows), rows
    assert done.stdout.count("target >=") == 3, done.stdout
    assert "value only / Parquet" in done.stdout, done.stdout
