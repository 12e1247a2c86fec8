"""The process's file descriptors: its limit, how many are in use, and when the doors must stop taking new
connections so that the store can always open the files it needs.

Owns: raising the soft ``RLIMIT_NOFILE`` to the hard limit at start; sharing the limit out (the store's bound
on open files, a reserve kept free); counting the descriptors in use (``/proc/self/fd``, or ``/dev/fd``) at an
interval that stays short near the threshold and grows, elsewhere, with what counting costs and with the room
left; telling the doors to stop accepting when the descriptors left would not cover the store's share and the
reserve, and to accept again once enough are free; when a file could not be opened all the same, telling them
to let go of their connections still in their handshake. It must not know dialects, sockets or files: a door
is anything with ``pause``, ``shed`` and ``resume``, and the store's share is a number it is told.

Why a watcher and not a reaction to EMFILE: once the process is out of descriptors, a libzmq listener keeps
failing to accept (its listening socket stays readable) and the store cannot open the next segment. Pausing a
little before the limit keeps both from happening; a store open that fails all the same fails one request
(see :mod:`broker.store`), never the broker.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import resource
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

log = logging.getLogger("mc0.broker")

#: Where the kernel lists this process's open descriptors (Linux; macOS and the BSDs have /dev/fd).
_FD_DIRECTORIES = ("/proc/self/fd", "/dev/fd")
#: Descriptors above what a broker is ever given (a hard limit of "unlimited" is not a number to set).
_MOST = 1 << 20
#: Seconds between counts: at most this often near the threshold, at least this often far from it.
FASTEST = 0.1
SLOWEST = 2.0
#: Counting costs about a microsecond and a half per descriptor: far from the threshold, the watcher waits
#: this many times what its last count cost, so that counting stays a small share of the loop.
COST_FACTOR = 50
#: ... and at least as long as the room left below the threshold would take to fill at this many new
#: descriptors a second (more connections than the loop can accept in a second: each costs a Python
#: callback): with a limit of 20,000 a broker with a few dozen open counts every 0.3 s, with a million every
#: SLOWEST, instead of every FASTEST for nothing.
FLOOD_RATE = 50_000
#: The doors stay paused at least this long: a flood that is still coming would only fill them again.
MIN_PAUSE = 1.0
#: Descriptors held in spare (on /dev/null) and let go just before a door starts accepting again: binding a
#: port needs descriptors, and libzmq aborts the whole process if a bind finds none (an assertion, not an
#: error), so it must never be tried without.
SPARES = 4


def raise_limit() -> tuple[int, int]:
    """Raise the soft descriptor limit to the hard one; returns ``(before, now)``."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = _MOST if hard == resource.RLIM_INFINITY else min(hard, _MOST)
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return soft, soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    except (ValueError, OSError) as error:
        log.warning("cannot raise the descriptor limit from %d to %d: %s", soft, wanted, error)
        return soft, soft
    return soft, wanted


#: What :func:`count_open` says when listing needs a descriptor and none is left: as many as the limit.
NONE_LEFT = -1


def count_open() -> int | None:
    """Descriptors open in this process; NONE_LEFT if not one is left to list them with; None where the system
    does not list them."""
    for directory in _FD_DIRECTORIES:
        try:
            return len(os.listdir(directory)) - 1  # the listing's own descriptor
        except OSError as error:
            if error.errno in (errno.EMFILE, errno.ENFILE):
                return NONE_LEFT
            continue
    return None


@dataclass(frozen=True)
class Shares:
    """How the descriptor limit is shared out."""

    limit: int  # the soft limit in force
    store: int  # the most the store keeps open
    reserve: int  # kept free beyond the store's share (new topics, directory fsyncs, the ZeroMQ machinery)

    @property
    def pause_at(self) -> int:
        """Descriptors held by everything but the store at which the doors stop accepting."""
        return max(1, self.limit - self.store - self.reserve)

    @property
    def resume_at(self) -> int:
        """... and below which they accept again (half the reserve lower: no flapping at the edge)."""
        return max(0, self.pause_at - max(1, self.reserve // 2))


def shares(limit: int, max_open_files: int, reserve: int) -> Shares:
    """The store's share is ``max_open_files``, or a quarter of the limit when 0; the reserve is lowered on a
    very small limit so that the doors keep a share."""
    store = max_open_files or max(16, limit // 4)
    store = min(store, max(4, limit // 2))
    reserve = min(reserve, max(4, limit // 8))
    return Shares(limit, store, reserve)


class Door(Protocol):
    """A door that can stop taking new connections and take them again (connections it has stay), and let go
    at once of what serves nobody yet when a file could not be opened for want of descriptors."""

    name: str

    def pause(self) -> None: ...

    def shed(self) -> None: ...

    def resume(self) -> Awaitable[None] | None: ...


class DescriptorWatch:
    """Counts descriptors and pauses or resumes the doors (see the module docstring)."""

    def __init__(self, shares: Shares, doors: list[Door], store_open: Callable[[], int],
                 count: Callable[[], int | None] = count_open) -> None:
        self.shares = shares
        self.doors = doors
        self.store_open = store_open
        self.count = count
        self.paused = False
        self.doors_shed = False  # the doors let go of their half-open connections during this pause
        self.paused_at = 0.0
        self.in_use = 0  # at the last count
        self.pauses = 0  # times the doors stopped accepting (a figure for STATS)
        self.spares: list[int] = []
        self._take_spares()

    async def run(self) -> None:
        """Until cancelled. Returns at once where descriptors cannot be counted (nothing to watch)."""
        if self.count() is None:
            log.warning("this system does not list open descriptors: the doors are not paused when they run "
                        "short (the store's bound on open files still holds)")
            return
        while True:
            delay = await self.check()
            await asyncio.sleep(delay)

    async def check(self) -> float:
        """One count, and the doors paused or resumed by it; returns the seconds until the next count."""
        started = time.perf_counter()
        used = self.count()
        if used is None:
            return SLOWEST
        if used == NONE_LEFT:  # not one left to count with: as when the store cannot open a file
            self.in_use = self.shares.limit
            self.out_of_descriptors("no descriptor left")
            return FASTEST
        self.in_use = used
        others = used - self.store_open()  # the store's own are within its bound
        # The store's count is part of the cost: a sum over every open log, as long as the listing itself
        # (0.45 ms each with 500 persistent topics open).
        cost = time.perf_counter() - started
        shares = self.shares
        if not self.paused and others >= shares.pause_at:
            self._pause(f"{used} of {shares.limit} descriptors in use")
        elif self.paused and others < shares.resume_at and time.monotonic() - self.paused_at >= MIN_PAUSE:
            log.warning("%d of %d descriptors in use: taking new connections again", used, shares.limit)
            self.paused = not await self._each("resume")
            if not self.paused:
                self.doors_shed = False  # a later pause may shed again
        if self.paused or others > shares.pause_at // 2:
            return FASTEST
        room = shares.pause_at - others
        return min(SLOWEST, max(FASTEST, cost * COST_FACTOR, room / FLOOD_RATE))

    def out_of_descriptors(self, why: str = "no descriptor left for a file") -> None:
        """A file could not be opened for want of descriptors: stop accepting at once, and have each door let
        go of its connections still in their handshake (the mc0 port is unbound for that, which drops its
        other connections too), so that the store's retry finds descriptors free. Once per pause."""
        if not self.paused:
            self._pause(why)
        if not self.doors_shed:
            self.doors_shed = True
            for door in self.doors:
                try:
                    door.shed()
                except OSError as error:
                    log.error("%s door: cannot let its new connections go: %s", door.name, error)

    def _pause(self, why: str) -> None:
        self.paused = True
        self.paused_at = time.monotonic()
        self.pauses += 1
        shares = self.shares
        log.warning("%s: new connections wait until some are free (the store keeps %d and %d stay in "
                    "reserve)", why, shares.store, shares.reserve)
        for door in self.doors:
            try:
                door.pause()
            except OSError as error:
                log.error("%s door: cannot stop accepting: %s", door.name, error)

    async def _each(self, action: str) -> bool:
        """``action`` on every door, with the spare descriptors let go meanwhile; False if one of them failed
        (a resume is then tried again)."""
        done = True
        for door in self.doors:
            self._let_spares_go()
            try:
                result = getattr(door, action)()
                if result is not None:
                    await result
            except OSError as error:  # e.g. the port was taken while we did not listen: tried again later
                log.error("%s door: cannot %s: %s", door.name, action, error)
                done = False
            finally:
                self._take_spares()
        if not done:
            self.paused_at = time.monotonic()  # tried again after MIN_PAUSE
        return done

    def _take_spares(self) -> None:
        while len(self.spares) < SPARES:
            try:
                self.spares.append(os.open(os.devnull, os.O_RDONLY))
            except OSError:
                return  # none free now: taken at the next resume

    def _let_spares_go(self) -> None:
        for spare in self.spares:
            os.close(spare)
        self.spares = []

    def close(self) -> None:
        self._let_spares_go()

    def stats(self) -> dict[str, int | bool]:
        return {"descriptors": self.in_use, "descriptor_limit": self.shares.limit, "paused": self.paused,
                "pauses": self.pauses}
