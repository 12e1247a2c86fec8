"""A logging filter that lets the first of a run of identical records through and holds back its repeats.

A library that logs the same failure on every tick (PySyncObj logs a traceback each second while its journal
cannot be written, say on a full disk) floods the broker's log, and a log on the same disk fills it faster.
:class:`HoldRepeats` passes a record, then holds back records that repeat it (same logger, level, message
template and arguments, and the same exception type and text) for ``period`` seconds; the first one after that
passes, saying how many were held back meanwhile. The operator sees the failure at once, and then once a
period while it lasts.

Our own code says things once where it knows an episode begins and ends (a log whose writes fail says so at
the first failure and at the first success after it); this filter is for code we do not own.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable

#: How long the repeats of a record are held back.
PERIOD = 60.0
#: Records remembered at most (the oldest are forgotten first): a bound whatever a library logs.
REMEMBERED = 256


class HoldRepeats(logging.Filter):
    """See the module docstring."""

    def __init__(self, period: float = PERIOD, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.period = period
        self.clock = clock
        self._held: dict[Hashable, list[float | int]] = {}  # record's key -> [held until, repeats held]

    def filter(self, record: logging.LogRecord) -> bool:
        key = _key(record)
        now = self.clock()
        entry = self._held.get(key)
        if entry is not None and now < entry[0]:
            entry[1] += 1
            return False
        held = int(entry[1]) if entry is not None else 0
        self._held.pop(key, None)
        self._held[key] = [now + self.period, 0]
        if len(self._held) > REMEMBERED:
            del self._held[next(iter(self._held))]
        if held:
            record.msg = f"{record.msg} ({held} more like it held back in the last {self.period:g} s)"
        return True


def _key(record: logging.LogRecord) -> Hashable:
    """What makes two records the same: where, how loud, what (template and arguments), and which error."""
    error = record.exc_info[1] if record.exc_info else None
    described = (type(error).__name__, str(error)) if error is not None else None
    return record.name, record.levelno, str(record.msg), repr(record.args), described


def hold_repeats(*names: str, period: float = PERIOD) -> None:
    """Give the loggers ``names`` a :class:`HoldRepeats` filter (once each, however often this is called)."""
    for name in names:
        logger = logging.getLogger(name)
        if not any(isinstance(existing, HoldRepeats) for existing in logger.filters):
            logger.addFilter(HoldRepeats(period))
