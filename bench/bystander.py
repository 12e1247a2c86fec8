"""Another client's confirmed publishes, timed while something else happens to the broker: what the benchmarks
use to say how long a burst of work (hundreds of new topics, say) holds up everyone else.

:func:`beside_a_publisher` runs the work while a :class:`connector.Client` publishes confirmed to a topic of
its own every :data:`OTHER_EVERY` seconds, and returns how long the work took and how long each of those
publishes waited for its OK meanwhile; :func:`describe` prints that as one line.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from bench.throughput import BODY_SIZE

#: Seconds between the other client's publishes.
OTHER_EVERY = 0.01


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def beside_a_publisher(endpoints: str, options: dict[str, Any], topic: str,
                       work: Callable[[], None]) -> tuple[float, list[float]]:
    """Run ``work()`` while another client (``Client(endpoints, **options)``) publishes confirmed to
    ``topic`` every :data:`OTHER_EVERY` seconds: the seconds ``work`` took, and the other client's
    confirmation times of the publishes it made meanwhile."""
    from connector import Client

    waits: list[float] = []
    started, stop = threading.Event(), threading.Event()

    def other() -> None:
        with Client(endpoints, **options, timeout=60) as client:
            client.publish(topic, b"warm", confirm=True)
            started.set()
            while not stop.wait(OTHER_EVERY):
                sent = time.perf_counter()
                client.publish(topic, b"x" * BODY_SIZE, confirm=True)
                waits.append(time.perf_counter() - sent)

    publisher = threading.Thread(target=other, name="bench-other-client")
    publisher.start()
    try:
        if not started.wait(60):
            raise RuntimeError("the other client did not publish within 60 s")
        begun = time.perf_counter()
        work()
        seconds = time.perf_counter() - begun
        during = len(waits)
    finally:
        stop.set()
        publisher.join(60)
    return seconds, waits[:during]


def describe(label: str, done: str, seconds: float, waits: list[float]) -> str:
    """One line: ``label``, ``done`` in how many seconds, and the other client's waits (p50, p90, slowest)."""
    if not waits:
        return f"{label:<40}{done} in {seconds:.2f} s (the other client published nothing meanwhile)"
    return (f"{label:<40}{done} in {seconds:.2f} s; another client's meanwhile: p50 "
            f"{percentile(waits, 0.5) * 1000:.0f} ms, p90 {percentile(waits, 0.9) * 1000:.0f} ms, slowest "
            f"{max(waits) * 1000:.0f} ms over {len(waits)}")
