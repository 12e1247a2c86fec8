"""Smoke tests of ``python -m bench`` (throughput and paced latency against the proxy and the Python
forwarder, the latency with the blocking and the asyncio client on either wire) and ``python -m bench cost``
with tiny counts: they still run against the current broker and clients, print every row with positive
figures, and judge every target.

They measure nothing (the counts are far too small for the ratios to mean anything). And the CPU time they
divide by the messages is the server process's, every thread's, finer than clock ticks.
"""

from __future__ import annotations

import os
import re
import threading
import time

import pytest

from bench import __main__ as bench_main
from bench import cost, throughput

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


def test_a_process_cpu_time_counts_every_thread_finely() -> None:
    """What a thread of this process spends (here 0.05 s of busy loop in a thread of its own, read while it
    lives, as a server's threads do through a run) shows in the process's figure, to a millisecond or so,
    not in 10 ms clock ticks."""
    spun, done = threading.Event(), threading.Event()
    spent: list[float] = []

    def spin() -> None:
        started = time.thread_time()
        while time.thread_time() - started < 0.05:
            pass
        spent.append(time.thread_time() - started)
        spun.set()
        done.wait(10)

    before_process, before = time.process_time(), throughput.process_cpu_seconds(os.getpid())
    worker = threading.Thread(target=spin)
    worker.start()
    try:
        assert spun.wait(10)
        after, after_process = throughput.process_cpu_seconds(os.getpid()), time.process_time()
    finally:
        done.set()
        worker.join()
    assert before is not None
    assert after is not None
    assert spent[0] <= after - before <= after_process - before_process + 0.005
    if throughput.SCHEDSTAT:
        assert after - before != pytest.approx(round(after - before, 2), abs=1e-6), "whole clock ticks"
