"""``broker.repeats``: the first of a run of identical records passes, its repeats are held back for the
period, and the first after it says how many were; records that differ (message, arguments, error, level)
are not repeats of each other; the filter remembers a bounded number of records."""

from __future__ import annotations

import logging
import sys

import pytest

from broker import repeats
from broker.repeats import HoldRepeats, hold_repeats


def failed(message: str = "failed _onTick", error: str = "[Errno 28] No space left on device",
           level: int = logging.ERROR, args: tuple[object, ...] = ()) -> logging.LogRecord:
    try:
        raise OSError(error)
    except OSError:
        info = sys.exc_info()
    return logging.LogRecord("pysyncobj.syncobj", level, __file__, 1, message, args, info)


def test_repeats_are_held_back_for_the_period_and_then_counted() -> None:
    now = [100.0]
    held = HoldRepeats(period=60, clock=lambda: now[0])
    assert held.filter(failed())
    for _ in range(59):
        now[0] += 1
        assert not held.filter(failed())
    now[0] += 1
    record = failed()
    assert held.filter(record)
    assert record.getMessage() == "failed _onTick (59 more like it held back in the last 60 s)"
    now[0] += 1
    assert not held.filter(failed())


def test_records_that_differ_are_not_repeats() -> None:
    held = HoldRepeats(period=60, clock=lambda: 0.0)
    assert held.filter(failed())
    assert held.filter(failed(error="[Errno 5] Input/output error"))
    assert held.filter(failed(level=logging.WARNING))
    assert held.filter(failed(message="failed %s", args=("a",)))
    assert held.filter(failed(message="failed %s", args=("b",)))
    assert not held.filter(failed(message="failed %s", args=("b",)))


def test_the_records_remembered_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(repeats, "REMEMBERED", 3)
    held = HoldRepeats(period=60, clock=lambda: 0.0)
    for n in range(10):
        assert held.filter(failed(error=str(n)))
    assert len(held._held) == 3
    assert held.filter(failed(error="0"))  # forgotten: passes again
    assert not held.filter(failed(error="9"))


def test_a_logger_gets_one_filter_however_often_asked() -> None:
    name = "mc0.test.repeats"
    hold_repeats(name)
    hold_repeats(name)
    assert sum(isinstance(f, HoldRepeats) for f in logging.getLogger(name).filters) == 1
