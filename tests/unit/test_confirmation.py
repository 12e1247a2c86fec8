"""The blocking client's confirmation futures, settled a command at a time (connector/client.py)."""

from __future__ import annotations

import threading

import pytest

from connector.client import Confirmation, _BulkConfirms, _settle_all
from connector.core import ConnectorError
from protocol import mc0


def confirmations(count: int) -> tuple[threading.Condition, list[Confirmation]]:
    condition = threading.Condition()
    return condition, [Confirmation(condition) for _ in range(count)]


def test_settled_together_each_resolves_to_its_own_outcome() -> None:
    _, futures = confirmations(3)
    refused = ConnectorError("broker refused PUT: too big")
    _settle_all(futures, [(7, "fsync"), refused, {"MESSAGE-ID": "9", "DURABILITY": "memory"}])
    assert all(future.done() for future in futures)
    assert futures[0].result(0) == {"MESSAGE-ID": "7", "DURABILITY": "fsync"}
    assert futures[0].result(0) is futures[0].result(0), "the headers are made once"
    assert futures[1].exception(0) is refused
    with pytest.raises(ConnectorError, match="too big"):
        futures[1].result(0)
    assert futures[2].result(0) == {"MESSAGE-ID": "9", "DURABILITY": "memory"}


def test_callbacks_added_before_and_after_settling_run_once_each() -> None:
    _, futures = confirmations(2)
    calls: list[tuple[str, Confirmation]] = []
    futures[0].add_done_callback(lambda future: calls.append(("before", future)))
    _settle_all(futures, [(1, "fsync"), (2, "fsync")])
    futures[0].add_done_callback(lambda future: calls.append(("after", future)))
    futures[1].add_done_callback(lambda future: calls.append(("after", future)))
    assert calls == [("before", futures[0]), ("after", futures[0]), ("after", futures[1])]


def add_counting_callbacks(futures: list[Confirmation], counts: list[int], start: threading.Barrier) -> None:
    start.wait()
    for index, future in enumerate(futures):
        future.add_done_callback(lambda _, index=index: counts.__setitem__(index, counts[index] + 1))


def test_a_callback_added_while_another_thread_settles_runs_exactly_once() -> None:
    for _ in range(200):
        _, futures = confirmations(50)
        counts = [0] * len(futures)
        start = threading.Barrier(2)
        adder = threading.Thread(target=add_counting_callbacks, args=(futures, counts, start))
        adder.start()
        start.wait()
        _settle_all(futures, [(n, "fsync") for n in range(len(futures))])
        adder.join(5)
        assert counts == [1] * len(futures)


def test_a_waiter_wakes_when_the_command_is_settled_and_released() -> None:
    condition, futures = confirmations(2)
    released: list[int] = []

    def release(count: int) -> None:  # what Client._release_confirms does: one notify per command
        with condition:
            released.append(count)
            condition.notify_all()

    batch = _BulkConfirms(futures, release, [(b"t", b"a", {}), (b"t", b"b", {})])
    outcome: list[dict[str, str]] = []
    waiter = threading.Thread(target=lambda: outcome.append(futures[1].result(5)))
    waiter.start()
    batch.settle(mc0.confirms_ok(b"c1", [(4, "written"), (5, "written")]))
    waiter.join(5)
    assert outcome == [{"MESSAGE-ID": "5", "DURABILITY": "written"}]
    assert released == [2]


def test_an_error_reply_fails_every_confirmation_of_the_command() -> None:
    _, futures = confirmations(2)
    batch = _BulkConfirms(futures, lambda count: None, [(b"t", b"a", {}), (b"t", b"b", {})])
    batch.settle(mc0.Error(b"topic limit reached", b"c1"))
    errors = [future.exception(0) for future in futures]
    assert all(isinstance(error, ConnectorError) and "topic limit reached" in str(error) for error in errors)
    assert errors[0] is not errors[1], "each is raised on its own"
