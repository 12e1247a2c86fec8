"""Smoke tests of ``python -m bench lumberjack`` and ``python -m bench gateways`` with tiny counts: they
still run against the current broker, gateways and clients, and every figure is a positive rate.

They measure nothing (the counts are far too small for the ratios to mean anything).
"""

from __future__ import annotations

import pytest

from bench import gateways, lumberjack


@pytest.mark.timeout(180)
def test_the_lumberjack_benchmark_runs(capsys: pytest.CaptureFixture[str]) -> None:
    assert lumberjack.main(["--events", "3000", "--repeat", "1", "--new-topics", "20"]) == 0
    out = capsys.readouterr().out.splitlines()
    lines = dict(line.rsplit(None, 1) for line in out[1:4])
    assert float(lines["lumberjack events/s"].replace(",", "")) > 0
    assert float(lines["mc0 events/s"].replace(",", "")) > 0
    assert float(lines["lumberjack / mc0"]) > 0
    assert out[4].startswith("a window to 20 new topics"), out
    assert " acked in " in out[4], out


@pytest.mark.timeout(240)
def test_the_gateways_benchmark_runs(capsys: pytest.CaptureFixture[str]) -> None:
    assert gateways.main(["--messages", "2000", "--repeat", "1"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if "msg/s" in line]
    assert len(rows) == 2
    for row in rows:
        figures = row.split("msg/s", 1)[1].split("lost:")[0].split()
        assert len(figures) == 1 + 2 * len(gateways.DOORS), row
        assert all(float(figure.replace(",", "")) > 0 for figure in figures), row
