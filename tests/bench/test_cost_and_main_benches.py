"""Smoke tests of ``python -m bench`` (throughput and paced latency against the proxy and the Python
forwarder, the latency with the blocking and the asyncio client on either wire) and ``python -m bench cost``
with tiny counts: they still run against the current broker and clients, print every row with positive
figures, and judge every target.

They measure nothing (the counts are far too small for the ratios to mean anything).
"""

from __future__ import annotations

import re

import pytest

from bench import __main__ as bench_main
from bench import cost

FIGURE = re.compile(r"[\d,.]+")


def figures(line: str) -> list[float]:
    return [float(figure.replace(",", "")) for figure in FIGURE.findall(line) if figure.strip(",.")]


@pytest.mark.timeout(300)
def test_the_main_benchmark_runs(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_main.main(["--messages", "3000", "--repeat", "1", "--latency-seconds", "1"]) == 0
    out = capsys.readouterr().out
    rows = {line.split("  ")[0]: line for line in out.splitlines() if "msg/s" in line or " us" in line}
    for scenario in ("1 -> 1 msg/s", "1 -> 4 fan-out msg/s", "1 -> 2 round-robin msg/s",
                     "latency @1000/s p50 us", "latency @1000/s cpu us/msg"):
        values = figures(rows[scenario].split("  ", 1)[1])
        assert len(values) == 5, rows[scenario]  # proxy, forwarder, mc0, and mc0's two ratios
        assert all(value > 0 for value in values), rows[scenario]
    for scenario in ("latency @1000/s p50 us, async", "latency @1000/s p99 us, async",
                     "latency @1000/s p50 us, native", "latency @1000/s p99 us, native"):
        values = figures(rows[scenario].split("  ", 1)[1])
        assert len(values) == 3, rows[scenario]  # mc0 with AsyncClient (either wire), and its two ratios
        assert all(value > 0 for value in values), rows[scenario]
    assert len(re.findall(r"^target .*: (met|NOT met)$", out, re.MULTILINE)) == 4


@pytest.mark.timeout(300)
def test_the_cost_benchmark_runs(capsys: pytest.CaptureFixture[str]) -> None:
    assert cost.main(["--confirms", "100", "--pipelined", "1000", "--batches", "50", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    rates = {line[:32].strip(): line[32:] for line in out.splitlines()[1:] if line.endswith("/s")}
    assert set(rates) == {"mc0 1 in flight", "py-confirmer 1 in flight", "mc0 100 in flight",
                          "py-confirmer 100 in flight", "mc0 unconfirmed", "lumberjack 1-event batches"}
    assert all(figures(rate)[0] > 0 for rate in rates.values()), rates
    assert "WRONG" not in out, "every confirmation of a strong topic said it was fsynced"
    assert re.search(r"of which one fsync costs +[\d,]+ us", out)
    assert len(re.findall(r"^target .*: (met|NOT met)$", out, re.MULTILINE)) == 4
