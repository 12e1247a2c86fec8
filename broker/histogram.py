"""Cheap histograms the broker's hot spots fill on the loop thread and the monitoring room reads.

A :class:`Histogram` has fixed bucket bounds and counts what falls at or below each (Prometheus's ``le``
buckets, kept non-cumulative here so that one observation is one bisect and one increment). It knows nothing
of HTTP or of Prometheus: :mod:`broker.monitoring` copies :meth:`Histogram.copy` on the loop and renders it
elsewhere. Single-threaded, like everything the loop owns: no locks.

The bounds below are where the broker's own figures fall (``docs/monitoring.md`` lists them).
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

#: fsync of a segment file: ~50 µs on a tmpfs or a drive with a write cache, 1-10 ms on SSDs that honour
#: flushes, tens of ms on spinning disks and network volumes; beyond a second something is wrong.
FSYNC_SECONDS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
#: One turn of the loop (read, commit, answer, deliver): tens of µs when idle, a few ms under load with a
#: full 8,192-message turn, longer only when an fsync or a big fetch is in it.
TURN_SECONDS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                1.0)
#: Messages written by one group commit: powers of two up to twice a full turn's budget (8,192).
COMMIT_MESSAGES = tuple(float(1 << n) for n in range(15))


@dataclass(frozen=True, slots=True)
class HistogramCopy:
    """A histogram's state at one moment: ``counts[i]`` observations fell in bucket ``i`` (the last one is
    +Inf), ``total`` is the sum of every observed value."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    total: float

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, observations at or below it) per bucket, +Inf last: the Prometheus form."""
        out = []
        running = 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += count
            out.append((bound, running))
        return out

    def quantile(self, q: float) -> float | None:
        """The upper bound of the bucket that holds quantile ``q`` (None when empty): coarse, but honest
        about the resolution the buckets have."""
        total = self.count
        if not total:
            return None
        rank = q * total
        for bound, running in self.cumulative():
            if running >= rank:
                return bound
        return float("inf")  # unreachable: the last cumulative count is the total


class Histogram:
    """Counts of observed values per bucket, and their sum."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        if list(bounds) != sorted(set(bounds)):
            raise ValueError("histogram bounds must be strictly increasing")
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last bucket is +Inf
        self.total = 0.0

    def observe(self, value: float) -> None:
        # bisect_left: a value equal to a bound belongs to that bound's bucket (Prometheus's "le").
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    def copy(self) -> HistogramCopy:
        return HistogramCopy(self.bounds, tuple(self.counts), self.total)
